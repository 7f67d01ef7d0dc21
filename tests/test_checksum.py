"""File checksums independent of block and chunk size (HDFS COMPOSITE-CRC): the combine
math against ``crc32c`` of concatenations, then real in-process clusters (metadata server
and block servers on loopback, ``security = secure``): the same bytes written with other
block sizes, ``bytes_per_checksum`` or inline give the same checksum, equal to crc32c of the
local bytes and to ``leasefs checksum file:``; one changed byte changes it; BLOCK_CHECKSUM
needs the block's read token; block servers answer from the meta file alone (data files
zeroed on disk); a damaged meta file is skipped for another replica, or named when all are;
``get --verify`` reports a copy that does not match.
"""

from __future__ import annotations

import os
import random
import sys

import crc32c
import pytest
import trio

from harness import inprocess_cluster

from fs.crccombine import (CompositeCrc, Shifter, combine_chunks, crc32c_combine, multmodp,
                           x8nmodp)
from fs.checksum import local_file_checksum
from fs.datatransfer import BLOCK_CHECKSUM, op_header
from fs.errors import BlockMissing
from fs.framing import FramedStream, encode_frame
from fs.rpc import parse_address

pytestmark = pytest.mark.timeout(120)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = dict(inline_max=1024, bytes_per_checksum=512, packet_size=64 << 10)
# 5 blocks of 4 KiB and a bit: ends inside a chunk of every layout below
DATA = random.Random(17).randbytes(20 * 1024 + 333)
LAYOUTS = [(4096, 512), (8192, 1024), (6144, 2048), (1 << 20, 4096)]   # (block_size, bpc)


# --------------------------------------------------------------------------- the math

def test_combine_equals_the_crc_of_the_concatenation():
    rng = random.Random(1)
    for _ in range(300):
        a = rng.randbytes(rng.choice([0, 1, 3, 511, 512, rng.randrange(5000)]))
        b = rng.randbytes(rng.choice([0, 1, 4, 512, 4096, rng.randrange(5000)]))
        assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == \
            crc32c.crc32c(a + b)


def test_chunk_crcs_fold_to_the_whole_crc_whatever_the_chunk_size():
    data = random.Random(2).randbytes(70_000)
    for bpc in (16, 512, 1000, 4096, 70_000, 100_000):
        crcs = [crc32c.crc32c(data[i:i + bpc]) for i in range(0, len(data), bpc)]
        tail = len(data) % bpc or None
        assert combine_chunks(crcs, bpc, tail) == crc32c.crc32c(data), bpc
    # pieces of any lengths, known only by CRC and length
    total, pos, rng = CompositeCrc(), 0, random.Random(3)
    while pos < len(data):
        n = rng.randrange(1, 9000)
        total.add(crc32c.crc32c(data[pos:pos + n]), len(data[pos:pos + n]))
        pos += n
    assert (total.crc, total.length) == (crc32c.crc32c(data), len(data))
    assert combine_chunks([], 512) == 0 == crc32c.crc32c(b"")


def test_shift_tables_agree_with_the_polynomial_product():
    rng = random.Random(4)
    for n in (0, 1, 512, 12345):
        shift = Shifter(n)
        for _ in range(50):
            crc = rng.getrandbits(32)
            assert shift(crc) == multmodp(x8nmodp(n), crc)


def test_block_crc_of_a_replica_being_written_uses_the_visible_chunk_crc(tmp_path):
    """An RBW replica's files may hold a packet not yet acknowledged: its last chunk's CRC
    on disk covers more than the visible bytes; the visible CRC kept in memory is used
    (and no data is read for it: the data file holds zeros beyond the first chunk)."""
    from types import SimpleNamespace

    from storage.blockchecksum import block_crc
    from storage.layout import encode_meta_header

    data = DATA[:1300]
    meta = tmp_path / "blk_1_1.meta"
    meta.write_bytes(encode_meta_header(512) + b"".join(
        crc32c.crc32c(data[i:i + 512]).to_bytes(4, "big") for i in range(0, 1300, 512)))
    data_file = tmp_path / "blk_1"
    data_file.write_bytes(data[:512] + bytes(788))
    reader = SimpleNamespace(block_id=1, bytes_per_checksum=512, visible_length=1100,
                             data_path=str(data_file), meta_path=str(meta),
                             last_sum=crc32c.crc32c(data[1024:1100]).to_bytes(4, "big"))
    assert block_crc(reader, 1100) == crc32c.crc32c(data[:1100])
    assert block_crc(reader, 1024) == crc32c.crc32c(data[:1024])
    assert block_crc(reader, 0) == 0
    assert block_crc(reader, 300) == crc32c.crc32c(data[:300])   # reads chunk 0 only


# --------------------------------------------------------------------------- clusters

async def ask(address: str, header: dict) -> dict:
    host, port = parse_address(address)
    framed = FramedStream(await trio.open_tcp_stream(host, port), 1 << 20)
    try:
        with trio.fail_after(20):
            await framed.send_all(encode_frame(header))
            return await framed.receive_frame()
    finally:
        await framed.aclose()


def replica_file(cluster, address: str, block_id: int, meta: bool):
    """The data or meta file of ``block_id`` on the block server at ``address``."""
    i = next(i for i in range(len(cluster.storage_dirs)) if cluster.storage_address(i) == address)
    pattern = f"blk_{block_id}_*.meta" if meta else f"blk_{block_id}"
    (found,) = [p for p in cluster.storage_dirs[i].rglob(pattern) if p.is_file()]
    return found


async def write_layouts(client, data: bytes) -> list[str]:
    names = []
    for block_size, bpc in LAYOUTS:
        name = f"/f_{block_size}_{bpc}"
        await client.write_file(name, data, block_size=block_size, bytes_per_checksum=bpc)
        names.append(name)
    return names


async def leasefs(cluster, *args, env=None, cwd=None):
    """``python -m tools ARGS`` against the cluster, in a subprocess (the CLI as users run it)."""
    return await trio.run_process(
        [sys.executable, "-m", "tools", *args, "--meta", cluster.meta_address],
        capture_stdout=True, capture_stderr=True, check=False, cwd=cwd or REPO,
        env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


async def test_equal_content_equal_checksum_whatever_the_layout(tmp_path):
    local = tmp_path / "local.bin"
    local.write_bytes(DATA)
    want = f"{crc32c.crc32c(DATA):08x}"

    async with inprocess_cluster(tmp_path, n_storage=3, **SETTINGS) as cluster:
        async with cluster.client() as client:
            names = await write_layouts(client, DATA)
            blocks = (await client.get_block_locations(names[0]))["blocks"]
            assert len(blocks) == 6   # several blocks, so their combine is tested too
            small = DATA[:700]
            await client.write_file("/small", small)
            assert (await client.get_block_locations("/small")).get("inline") is not None
            await client.write_file("/empty", b"")
            changed = bytearray(DATA)
            changed[9000] ^= 1
            await client.write_file("/changed", bytes(changed), block_size=4096)
            got = {n: await client.get_file_checksum(n) for n in names}
            assert {r["crc"] for r in got.values()} == {want}, got
            assert all(r == {"algorithm": "COMPOSITE-CRC32C", "crc": want,
                             "length": len(DATA)} for r in got.values())
            assert (await client.get_file_checksum("/small"))["crc"] == \
                f"{crc32c.crc32c(small):08x}"
            assert (await client.get_file_checksum("/empty")) == \
                {"algorithm": "COMPOSITE-CRC32C", "crc": "00000000", "length": 0}
            assert (await client.get_file_checksum("/changed"))["crc"] != want
        assert local_file_checksum(str(local))["crc"] == want
        done = await leasefs(cluster, "checksum", names[0], names[1], "file:local.bin",
                             "/changed", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode().splitlines()
        assert lines[:3] == [f"{names[0]}\tCOMPOSITE-CRC32C\t{want}",
                             f"{names[1]}\tCOMPOSITE-CRC32C\t{want}",
                             f"file:local.bin\tCOMPOSITE-CRC32C\t{want}"]
        assert lines[3].split("\t")[2] != want
        missing = await leasefs(cluster, "checksum", "/nope")
        assert missing.returncode == 1
        assert missing.stderr.decode().startswith("leasefs checksum: /nope: ")


@pytest.mark.cluster(n_storage=1, **SETTINGS)
async def test_block_checksum_needs_the_read_token_of_its_block(cluster):
    async with cluster.client() as client:
        await client.write_file("/a", DATA[:3000], block_size=4096)
        await client.write_file("/b", DATA[:3000], block_size=4096)
        (la,) = (await client.get_block_locations("/a"))["blocks"]
        (lb,) = (await client.get_block_locations("/b"))["blocks"]
    address = la["locations"][0]["address"]
    block = {"id": la["block"]["id"], "gs": la["block"]["gs"]}
    forged = dict(la["token"], mode="w")
    for token in (None, lb["token"], forged):
        extra = {} if token is None else {"token": token}
        resp = await ask(address, op_header(BLOCK_CHECKSUM, block=block, length=3000,
                                            **extra))
        assert resp["status"] == "ERROR", (token, resp)
        assert "InvalidToken" in resp["message"] and BLOCK_CHECKSUM in resp["message"]
    resp = await ask(address, op_header(BLOCK_CHECKSUM, block=block, length=3000,
                                        token=la["token"]))
    assert resp["status"] == "SUCCESS", resp
    assert resp["crc"] == crc32c.crc32c(DATA[:3000])
    assert resp["bytes_per_checksum"] == 512 and resp["length"] == 3000


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_block_servers_answer_from_the_meta_file_without_reading_data(cluster):
    """Every data file zeroed on disk (same size): the checksum still comes out right, from
    the stored CRCs. A length that ends inside a chunk needs that chunk's data: it is read
    and checked against its stored CRC (so the zeros are seen there)."""
    async with cluster.client() as client:
        await client.write_file("/f", DATA, block_size=8192, bytes_per_checksum=1024,
                                replication=2)
        located = (await client.get_block_locations("/f"))["blocks"]
        first = located[0]
        address = first["locations"][0]["address"]
        block = {"id": first["block"]["id"], "gs": first["block"]["gs"]}
        mid = await ask(address, op_header(BLOCK_CHECKSUM, block=block, length=1500,
                                           token=first["token"]))
        assert mid["crc"] == crc32c.crc32c(DATA[:1500]), mid
        for lb in located:
            for loc in lb["locations"]:
                path = replica_file(cluster, loc["address"], lb["block"]["id"], False)
                path.write_bytes(bytes(path.stat().st_size))
        # the server sees the zeros where it must read data
        mid = await ask(address, op_header(BLOCK_CHECKSUM, block=block, length=1500,
                                           token=first["token"]))
        assert mid["status"] == "ERROR" and "ChecksumError" in mid["message"], mid
        got = await client.get_file_checksum("/f")
        assert got["crc"] == f"{crc32c.crc32c(DATA):08x}"


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_a_damaged_meta_file_fails_over_then_is_named(cluster):
    async with cluster.client() as client:
        await client.write_file("/f", DATA, block_size=8192, replication=2)
        located = (await client.get_block_locations("/f"))["blocks"]
        lb = located[1]
        metas = [replica_file(cluster, loc["address"], lb["block"]["id"], True)
                 for loc in lb["locations"]]
        assert len(metas) == 2
        for meta in metas:   # the first replica asked is damaged, then both
            raw = bytearray(meta.read_bytes())
            raw[0] ^= 0xFF   # the meta header's version
            meta.write_bytes(bytes(raw))
            if meta is metas[0]:
                got = await client.get_file_checksum("/f")
                assert got["crc"] == f"{crc32c.crc32c(DATA):08x}"
        with pytest.raises(BlockMissing, match=f"block {lb['block']['id']}.*meta file "
                                               "is damaged"):
            await client.get_file_checksum("/f")


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_get_and_cp_verify_catch_a_copy_that_does_not_match(tmp_path, cluster):
    async with cluster.client() as client:
        await client.write_file("/f", DATA, block_size=4096, bytes_per_checksum=512)
    good = await leasefs(cluster, "get", "--verify", "/f", "good.bin", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "good.bin").read_bytes() == DATA
    good = await leasefs(cluster, "cp", "-checksum", "--block-size", "8192", "/f",
                         "/g", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    hook = {"LEASEFS_TEST_CORRUPT_COPY": "1"}
    bad = await leasefs(cluster, "get", "--verify", "/f", "bad.bin", cwd=tmp_path,
                        env=hook)
    assert bad.returncode == 1
    err = bad.stderr.decode()
    assert "leasefs get: bad.bin: checksum mismatch after copying /f" in err, err
    bad = await leasefs(cluster, "cp", "--verify", "file:good.bin", "/h",
                        cwd=tmp_path, env=hook)
    assert bad.returncode == 1
    assert "leasefs cp: /h: checksum mismatch after copying good.bin" in \
        bad.stderr.decode(), bad.stderr
    # without --verify the hook is not even consulted: the copy is taken as it is
    plain = await leasefs(cluster, "get", "/f", "plain.bin", cwd=tmp_path, env=hook)
    assert plain.returncode == 0, plain.stderr


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_a_file_being_written_is_checksummed_up_to_its_visible_length(cluster):
    """An RBW last block: the block server combines its stored CRCs with the in-memory CRC
    of the visible partial chunk (the on-disk one may already cover more)."""
    async with cluster.client() as writer, cluster.client() as reader:
        stream = await writer.create("/open", block_size=8192, replication=2)
        await stream.write(DATA[:10_000])
        await stream.hflush()
        got = await reader.get_file_checksum("/open")
        assert got == {"algorithm": "COMPOSITE-CRC32C", "length": 10_000,
                       "crc": f"{crc32c.crc32c(DATA[:10_000]):08x}"}
        await stream.write(DATA[10_000:10_700])
        await stream.hflush()
        got = await reader.get_file_checksum("/open")
        assert got["crc"] == f"{crc32c.crc32c(DATA[:10_700]):08x}", got
        await stream.close()
        got = await reader.get_file_checksum("/open")
        assert got["crc"] == f"{crc32c.crc32c(DATA[:10_700]):08x}"
