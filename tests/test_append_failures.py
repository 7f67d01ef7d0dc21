"""Append when a replica holder of the last block is gone or holds more than the file: on
real processes (``kill -9`` of a block server before the metadata server declares it dead).

Every setup retry of an append takes a new generation stamp, the failed node is dropped
(or replaced as the replace-datanode policy says), and a failed append never leaves the file
open under the appender's lease.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from fs import errors
from fs.client import Client
from harness import ProcessCluster, make_test_config, storage_index

KiB = 1 << 10
#: the killed block server stays "live" on the metadata server for the whole test
# appends to blocks are under test: small files stay in blocks, not inline
SLOW_DEATH = {"dead_node_interval": 60.0, "block_recovery_retry": 5.0, "inline_max": 0}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def write_small_file(client, path: str, data: bytes) -> dict:
    with client.create(path, replication=3, block_size=64 * KiB) as out:
        out.write(data)
    return client.get_block_locations(path)["blocks"][-1]


def wait_closed(client, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get_file_status(path).under_construction:
        assert time.monotonic() < deadline, client.list_open_files()
        time.sleep(0.1)


@pytest.mark.parametrize("victim", [0, 1])
def test_append_goes_on_after_a_replica_holder_was_killed(tmp_path, victim):
    """replication 3 on 3 block servers, best effort: the holder of the first or second
    replica of the last block is killed -9 and the append starts before it is declared
    dead. The append drops it, takes a new stamp on the survivors, writes and closes; the
    file reads back whole and nobody holds a lease."""
    first, more = payload(3000, 1), payload(50 * KiB, 2)
    with ProcessCluster(tmp_path, n_storage=3, settings=SLOW_DEATH) as cluster:
        config = make_test_config(replace_datanode_best_effort=True, data_timeout=5.0)
        with Client(cluster.meta_address, config=config) as c:
            last = write_small_file(c, "/a", first)
            killed = last["locations"][victim]["address"]
            cluster.kill_storage(storage_index(cluster, killed), signal.SIGKILL)
            with c.append("/a") as out:
                out.write(more)
            assert c.read_file("/a") == first + more
            assert c.list_open_files() == []
            block = c.get_block_locations("/a")["blocks"][0]
            assert block["block"]["gs"] > last["block"]["gs"] + 1   # a retry took a stamp
            assert killed not in [loc["address"] for loc in block["locations"]]


def test_append_adds_a_spare_for_a_killed_holder(tmp_path):
    """replication 3 on 4 block servers, DEFAULT policy: the killed holder is replaced by the
    spare (an append needs a replacement), so the appended block has 3 replicas again."""
    first, more = payload(5000, 3), payload(20 * KiB, 4)
    with ProcessCluster(tmp_path, n_storage=4, settings=SLOW_DEATH) as cluster:
        with Client(cluster.meta_address, config=make_test_config(data_timeout=5.0)) as c:
            last = write_small_file(c, "/s", first)
            killed = last["locations"][1]["address"]
            cluster.kill_storage(storage_index(cluster, killed), signal.SIGKILL)
            with c.append("/s") as out:
                out.write(more)
            assert out._stream.replacements == 1
            assert c.read_file("/s") == first + more
            block = c.get_block_locations("/s")["blocks"][0]
            assert len(block["locations"]) == 3
            assert killed not in [loc["address"] for loc in block["locations"]]
            assert c.list_open_files() == []


def test_a_failed_append_does_not_leave_the_file_open(tmp_path):
    """DEFAULT policy without best effort on 3 block servers: after a holder was killed the
    append needs a replacement that does not exist, so it fails, naming the path; the file
    is closed again (not left under the appender's lease), keeps its bytes and can be
    appended to by another client once the dead node is out of the pipeline."""
    first = payload(3000, 5)
    with ProcessCluster(tmp_path, n_storage=3, settings=SLOW_DEATH) as cluster:
        with Client(cluster.meta_address, config=make_test_config(data_timeout=5.0)) as c:
            last = write_small_file(c, "/f", first)
            killed = last["locations"][1]["address"]
            cluster.kill_storage(storage_index(cluster, killed), signal.SIGKILL)
            with pytest.raises(errors.PipelineError) as info:
                c.append("/f")
            assert "/f" in str(info.value) and "replacement" in str(info.value)
            wait_closed(c, "/f")
            assert c.list_open_files() == []
            assert c.read_file("/f") == first
            with Client(cluster.meta_address,
                        config=make_test_config(replace_datanode_best_effort=True)) as b:
                with b.append("/f") as out:
                    out.write(b"more")
                assert b.read_file("/f") == first + b"more"


@pytest.mark.parametrize("stage", ["PIPELINE_SETUP_STREAMING_RECOVERY", "PIPELINE_SETUP_APPEND"])
def test_a_replica_longer_than_the_acknowledged_length_is_cut_not_refused(tmp_path, stage):
    """A block server holds a FINALIZED replica of 8000 bytes while the writer saw only 3000
    acknowledged (its LAST packet's acks, or those of a failed append's packets, never came
    back). The writer's setup (recovery or append) with ``min_bytes`` 3000 must cut the
    replica to 3000 and go on from there; the replica on disk ends as the first 3000 bytes
    plus what the writer sent next, under the new stamp."""
    import trio

    from fs.datatransfer import (FLAG_LAST, SUCCESS, WRITE_BLOCK, chunk_checksums,
                                 receive_ack, send_packet)
    from fs.framing import FramedStream
    from fs.rpc import parse_address

    bpc = 512
    old, new = payload(8000, 6), payload(1500, 7)
    # the test plays a writer whose stamp the metadata server never issued: no token for
    # it in security = secure (tests/test_block_tokens.py), so the replica rules are tested
    # without
    with ProcessCluster(tmp_path, n_storage=1, settings={"bytes_per_checksum": bpc,
                                                             "inline_max": 0,
                                                             "security": "simple"}) as cluster:
        with Client(cluster.meta_address, config=make_test_config(
                bytes_per_checksum=bpc, security="simple")) as c:
            with c.create("/long", replication=1, block_size=64 * KiB) as out:
                out.write(old)
            located = c.get_block_locations("/long")["blocks"][0]
        block, address = located["block"], located["locations"][0]["address"]
        acked = 3000
        start = acked - acked % bpc           # the first packet repeats the partial chunk

        async def write_on_from(acked_length: int) -> dict:
            host, port = parse_address(address)
            framed = FramedStream(await trio.open_tcp_stream(host, port), 1 << 20)
            try:
                with trio.fail_after(30):
                    await framed.send_frame({
                        "op": WRITE_BLOCK, "block": {"id": block["id"], "gs": block["gs"] + 1},
                        "targets": [], "client": "t", "stage": stage,
                        "min_bytes": acked_length, "bytes_per_checksum": bpc})
                    resp = await framed.receive_frame()
                    if resp.get("status") != "SUCCESS":
                        return resp
                    data = old[start:acked_length] + new
                    await send_packet(framed, 0, start, data, chunk_checksums(data, bpc))
                    await send_packet(framed, 1, start + len(data), b"", b"", FLAG_LAST)
                    acks = [await receive_ack(framed), await receive_ack(framed)]
                    assert acks == [(0, [SUCCESS]), (1, [SUCCESS])], acks
                    return resp
            finally:
                await framed.aclose()

        resp = trio.run(write_on_from, acked)
        assert resp["status"] == "SUCCESS", resp
        folder = cluster.storage_dir(0) / "finalized"
        data_files = [p for p in folder.rglob(f"blk_{block['id']}") if p.is_file()]
        metas = [p.name for p in folder.rglob(f"blk_{block['id']}_*.meta")]
        assert len(data_files) == 1 and data_files[0].read_bytes() == old[:acked] + new
        assert metas == [f"blk_{block['id']}_{block['gs'] + 1}.meta"]
