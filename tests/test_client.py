"""The client library end to end: ``AsyncClient``/``Client`` and their streams against a real
in-process cluster (real metadata server with LevelDB, three real block servers, real sockets
and replica files), plus the lease renewer on trio's mock clock.

Small blocks (64 KiB), 512-byte checksum chunks and 4 KiB packets make multi-block files,
partial chunks and full windows cheap.
"""

from __future__ import annotations

import errno
import io
import os
import random
import threading

import pytest
import trio
import trio.testing

import fs.client as client_mod
from fs import errors
from fs.client import AsyncClient, Client, FileStatus
from fs.dataconn import AvoidedNodes, failure_cause
from fs.renewer import LeaseRenewer
from fs.streams import Offset
from fs.writer import _effective_packet_size
from harness import inprocess_cluster

KiB = 1 << 10
BPC = 512
PACKET = 4 * KiB
BLOCK = 64 * KiB
SMALL = dict(block_size=BLOCK, bytes_per_checksum=BPC, packet_size=PACKET,
             write_window_packets=4)

pytestmark = pytest.mark.timeout(120)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def replica_paths(cluster, i: int, block_id: int) -> list:
    return [p for p in cluster.storage_dirs[i].rglob(f"blk_{block_id}") if p.is_file()]


def storage_index(cluster, address: str) -> int:
    for i in range(len(cluster.storage_dirs)):
        if cluster.storage[i] is not None and cluster.storage_address(i) == address:
            return i
    raise AssertionError(f"no block server at {address}")


async def write_in_pieces(stream, data: bytes, rng: random.Random, max_piece: int) -> None:
    pos = 0
    while pos < len(data):
        n = rng.randint(1, max_piece)
        assert await stream.write(data[pos:pos + n]) == len(data[pos:pos + n])
        pos += n


# --------------------------------------------------------------------------- pure pieces


def test_packet_size_is_whole_chunks_and_bounded():
    assert _effective_packet_size(4096, 512) == 4096
    assert _effective_packet_size(5000, 512) == 4608
    assert _effective_packet_size(100, 512) == 512
    assert _effective_packet_size(64 << 20, 4096) == 16 << 20


def test_avoided_nodes_go_last_until_the_interval_passes_or_one_answers():
    now = [100.0]
    avoided = AvoidedNodes(60.0, clock=lambda: now[0])
    a, b, c = ({"address": f"10.0.0.{i}:9866"} for i in (1, 2, 3))
    assert avoided.first([a, b, c]) is a
    avoided.add(a["address"])
    assert avoided.first([a, b, c]) is b
    avoided.add(b["address"])
    assert avoided.first([a, b, c]) is c
    # the last one left is tried, avoided or not
    assert avoided.first([a, b]) is a and avoided.first([]) is None
    avoided.discard(b["address"])       # it answered again
    assert avoided.first([a, b]) is b
    now[0] += 60.0                      # a's time is up
    assert a["address"] not in avoided and avoided.first([a, b]) is a


def test_failure_cause_is_never_empty():
    assert failure_cause(trio.TooSlowError(), 5.0) == "timed out after 5 s"
    assert failure_cause(TimeoutError()) == "timed out"
    assert failure_cause(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")) \
        == "ECONNREFUSED (Connection refused)"
    assert failure_cause(EOFError()) == "EOFError()"
    assert failure_cause(errors.ServerUnavailable()) == "ServerUnavailable"


async def test_offset_works_with_and_without_await():
    assert await Offset(7) == 7
    assert Offset(7) + 1 == 8


def test_file_status_from_wire_tolerates_missing_and_extra_keys():
    st = FileStatus.from_wire({"name": "a", "path": "/a", "ino": 5, "type": "dir",
                               "mode": 0o755, "parent": 1, "symlink": None})
    assert st.is_dir and not st.is_file and not st.is_symlink
    assert (st.ino, st.length, st.owner, st.symlink) == (5, 0, "", None)


# --------------------------------------------------------------------------- renewer


class _FakeStream:
    def __init__(self, path):
        self.path = path
        self.aborted = None

    def abort(self, exc):
        self.aborted = exc


async def test_renewer_renews_while_streams_are_open_and_stops_after(autojump_clock):
    calls = []

    async def renew():
        calls.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        renewer = LeaseRenewer(renew, holder="h", period=10.0, hard_limit=100.0,
                               nursery=nursery)
        stream = _FakeStream("/a")
        renewer.add(stream)
        await trio.sleep(35)
        assert len(calls) == 3            # at 10, 20, 30
        renewer.remove(stream)
        await trio.sleep(50)
        assert len(calls) == 3            # stopped once nothing is open
        renewer.add(stream)               # starts again
        await trio.sleep(10.5)
        assert len(calls) == 4
        renewer.remove(stream)
        assert stream.aborted is None


async def test_renewer_keeps_one_task_while_files_open_and_close_one_after_another(
        autojump_clock):
    """Files opened and closed one after another (a tree extracted through a mount) share
    one renew task: it renews at each period's end while one is open then, and ends at
    the first period's end with none open."""
    calls = []

    async def renew():
        calls.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        renewer = LeaseRenewer(renew, holder="h", period=10.0, hard_limit=100.0,
                               nursery=nursery)
        tasks = set()
        for n in range(1500):   # 15 s of files open 0.01 s each
            stream = _FakeStream(f"/f{n}")
            renewer.add(stream)
            tasks |= nursery.child_tasks
            assert len(tasks) == 1
            await trio.sleep(0.01)
            renewer.remove(stream)
        assert calls == [10.0]            # a file was open at the first period's end
        await trio.sleep(10)
        assert len(calls) == 1 and not nursery.child_tasks   # none at the second's


@pytest.mark.allow_log_errors(r"lease of h lost: aborted \d+ open file",
                                reason="the test lets the lease pass its hard limit")
async def test_renewer_aborts_streams_with_lease_expired_after_hard_limit(autojump_clock):
    async def renew():
        raise errors.ServerUnavailable("metadata server down")

    async with trio.open_nursery() as nursery:
        renewer = LeaseRenewer(renew, holder="h", period=10.0, hard_limit=45.0,
                               nursery=nursery)
        a, b = _FakeStream("/a"), _FakeStream("/b")
        renewer.add(a)
        renewer.add(b)
        await trio.sleep(41)
        assert a.aborted is None and renewer.failures == 4  # still within the hard limit
        await trio.sleep(10)
        for s in (a, b):
            assert isinstance(s.aborted, errors.LeaseExpired)
            assert s.path in str(s.aborted) and "h" in str(s.aborted)
        assert renewer.open_streams == []


async def test_renewer_recovers_after_transient_failures(autojump_clock):
    outcomes = iter([False, False, True, True, True])

    async def renew():
        if not next(outcomes):
            raise errors.RpcTimeout("slow")

    async with trio.open_nursery() as nursery:
        renewer = LeaseRenewer(renew, holder="h", period=10.0, hard_limit=25.0,
                               nursery=nursery)
        stream = _FakeStream("/a")
        renewer.add(stream)
        await trio.sleep(55)
        assert stream.aborted is None
        assert renewer.renewals == 3 and renewer.failures == 2
        renewer.remove(stream)


@pytest.mark.allow_log_errors(r"lease of h lost: aborted \d+ open file",
                                reason="the test lets the lease pass its hard limit")
async def test_renewer_after_an_abort_renews_new_files_afresh(autojump_clock):
    """Once the lease was given up, a file opened after the server answers again gets a
    fresh start: the earlier failures do not count against it."""
    server_up = False

    async def renew():
        if not server_up:
            raise errors.ServerUnavailable("metadata server down")

    async with trio.open_nursery() as nursery:
        renewer = LeaseRenewer(renew, holder="h", period=10.0, hard_limit=25.0,
                               nursery=nursery)
        old = _FakeStream("/old")
        renewer.add(old)
        await trio.sleep(31)                 # failures at 10, 20, 30 → aborted at 30
        assert isinstance(old.aborted, errors.LeaseExpired)
        assert renewer.open_streams == []
        server_up = True
        new = _FakeStream("/new")
        renewer.add(new)
        await trio.sleep(35)
        assert new.aborted is None
        assert renewer.renewals == 3 and renewer.failures == 3
        renewer.remove(new)


# --------------------------------------------------------------------------- write/read


async def test_round_trip_sizes_byte_exact(tmp_path):
    """Every interesting size around chunk, packet and block boundaries reads back exactly,
    written in one call and in random small pieces, with the right number of blocks (none
    for a file up to ``inline_max``, kept in the namespace)."""
    sizes = [0, 1, BPC - 1, BPC, BPC + 1, PACKET - 1, PACKET, PACKET + 1,
             BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 1234]

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        async with cluster.client() as c:
            assert c.config.block_size == BLOCK and c.config.bytes_per_checksum == BPC
            rng = random.Random(1)
            for size in sizes:
                data = payload(size)
                await c.write_file(f"/sizes/one_{size}", data)
                stream = await c.create(f"/sizes/pieces_{size}")
                await write_in_pieces(stream, data, rng, 3000)
                assert stream.pos == size
                await stream.close()
                for name in (f"/sizes/one_{size}", f"/sizes/pieces_{size}"):
                    assert await c.read_file(name) == data, name
                    st = await c.get_file_status(name)
                    assert st.length == size and not st.under_construction
                    locs = await c.get_block_locations(name)
                    # inline: all of it still in the buffer at the close (under a packet)
                    if 0 < size <= c.config.inline_max and size < PACKET:
                        assert locs["blocks"] == [] and bytes(locs["inline"]) == data
                        continue
                    assert len(locs["blocks"]) == -(-size // BLOCK)
                    assert sum(b["block"]["num_bytes"] for b in locs["blocks"]) == size
                    assert all(len(b["locations"]) == 3 for b in locs["blocks"])


async def test_seek_pread_and_small_sequential_reads(tmp_path):
    size = 3 * BLOCK + 777
    data = payload(size, seed=2)

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        async with cluster.client() as c:
            await c.write_file("/f", data)
            rng = random.Random(3)
            async with await c.open("/f") as s:
                assert s.length == size
                # sequential in odd pieces over block boundaries (one kept connection)
                got = bytearray()
                while chunk := await s.read(rng.randint(1, 7000)):
                    got += chunk
                assert bytes(got) == data
                assert await s.read(10) == b"" and s.tell() == size
                for _ in range(40):
                    off = rng.randrange(0, size)
                    n = rng.randint(0, 2 * BLOCK)
                    assert await s.pread(off, n) == data[off:off + n]
                    assert await s.seek(off) == off
                    assert s.tell() == off
                    assert await s.read(n) == data[off:off + n]
                # short forward seeks inside a block, relative and from the end
                s.seek(100)
                await s.read(10)
                s.seek(1000, os.SEEK_CUR)
                assert await s.read(5) == data[1110:1115]
                assert s.seek(-10, os.SEEK_END) == size - 10
                assert await s.read() == data[-10:]
                s.seek(size + 50)
                assert await s.read(10) == b""
                assert await s.pread(size - 3, 100) == data[-3:]
                with pytest.raises(errors.InvalidArgument):
                    s.seek(-1)


@pytest.mark.cluster(**SMALL)
async def test_hflush_makes_data_visible_to_a_second_client_while_open(cluster):
    async with cluster.client() as writer, cluster.client() as reader:
        data = payload(BLOCK + 3000, seed=4)
        out = await writer.create("/open/file")
        await out.write(data[:1000])         # a partial chunk
        await out.hflush()
        async with await reader.open("/open/file") as s:
            assert s.length == 1000
            assert await s.read() == data[:1000]
        st = await reader.get_file_status("/open/file")
        assert st.under_construction
        await out.write(data[1000:4100])     # rewrites the partial chunk, then more
        await out.hflush()
        await out.hflush()                   # nothing new: harmless
        assert await reader.read_file("/open/file") == data[:4100]
        await out.write(data[4100:])         # into the second block
        await out.hflush()
        async with await reader.open("/open/file") as s:
            assert s.length == len(data)
            assert await s.pread(BLOCK - 10, 20) == data[BLOCK - 10:BLOCK + 10]
            assert await s.read() == data
        await out.close()
        st = await reader.get_file_status("/open/file")
        assert not st.under_construction and st.length == len(data)
        assert await reader.read_file("/open/file") == data


@pytest.mark.cluster(**SMALL)
async def test_hsync_persists_on_every_replica_and_is_readable(cluster):
    async with cluster.client() as c, cluster.client() as other:
        data = payload(5000, seed=5)
        out = await c.create("/synced")
        await out.write(data)
        await out.hsync()
        locs = await other.get_block_locations("/synced")
        block = locs["blocks"][0]
        assert locs["under_construction"]
        for node in block["locations"]:
            i = storage_index(cluster, node["address"])
            [path] = replica_paths(cluster, i, block["block"]["id"])
            assert path.read_bytes() == data
        assert await other.read_file("/synced") == data
        await out.hsync()  # again with nothing new (resends the partial chunk)
        await out.write(b"tail")
        await out.close()
        assert await other.read_file("/synced") == data + b"tail"


@pytest.mark.cluster(**SMALL)
async def test_create_conflicts_and_overwrite(cluster):
    async with cluster.client() as c, cluster.client() as other:
        await c.write_file("/x", b"first")
        with pytest.raises(errors.FileExists) as info:
            await c.create("/x")
        assert "/x" in str(info.value)
        assert await c.read_file("/x") == b"first"
        await c.write_file("/x", b"second!", overwrite=True)
        assert await c.read_file("/x") == b"second!"
        out = await c.create("/busy")
        with pytest.raises(errors.AlreadyBeingCreated):
            await other.create("/busy")
        await out.close()
        with pytest.raises(errors.FileNotFound):
            await c.create("/no/parent", create_parent=False)
        with pytest.raises(errors.InvalidPath):
            await c.create("relative")
        with pytest.raises(errors.IsDirectory):
            await c.open("/")
        with pytest.raises(errors.FileNotFound) as info:
            await c.open("/missing")
        assert "/missing" in str(info.value)
        out = await c.create("/closed-twice")
        await out.close()
        await out.close()
        with pytest.raises(errors.InvalidArgument):
            await out.write(b"late")


@pytest.mark.cluster(**SMALL)
async def test_concurrent_writers_on_different_files(cluster):
    async with cluster.client() as c, cluster.client() as c2:
        files = {f"/conc/{i}": payload(BLOCK * 2 + i * 1111, seed=10 + i) for i in range(6)}

        async def write(client, path, data):
            async with await client.create(path) as out:
                await write_in_pieces(out, data, random.Random(path), 9000)

        async with trio.open_nursery() as nursery:
            for i, (path, data) in enumerate(files.items()):
                nursery.start_soon(write, (c, c2)[i % 2], path, data)
        for path, data in files.items():
            assert await c.read_file(path) == data
        assert [s.name for s in await c.list_status("/conc")] == [str(i) for i in range(6)]
        assert c.open_output_streams == [] and c2.open_output_streams == []


async def test_corrupt_replica_is_skipped_and_reported(tmp_path):
    """A flipped byte in the first replica the reader tries: the reader returns the right
    bytes from another replica and reports the bad one to the metadata server."""
    data = payload(BLOCK + 5000, seed=6)

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        async with cluster.client() as c:
            await c.write_file("/corrupt", data)
            async with await c.open("/corrupt") as s:
                block = s.blocks[0]
                first = block.locations[0]     # the replica this reader tries first
                [path] = replica_paths(cluster, storage_index(cluster, first["address"]),
                                       block.id)
                raw = bytearray(path.read_bytes())
                raw[1234] ^= 0xFF
                path.write_bytes(bytes(raw))
                assert await s.read() == data
                assert s.reported_bad == [(block.id, first["node_id"])]
                assert await s.pread(1000, 500) == data[1000:1500]
            # the metadata server no longer hands out the corrupt replica
            with trio.fail_after(10):
                while True:
                    nodes = [n["node_id"] for n in
                             (await c.get_block_locations("/corrupt"))["blocks"][0]["locations"]]
                    if first["node_id"] not in nodes:
                        break
                    await trio.sleep(0.05)
            assert await c.read_file("/corrupt") == data


async def test_reader_fails_over_from_a_stopped_node_and_reports_missing_blocks(tmp_path):
    data = payload(2 * BLOCK, seed=7)

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        async with cluster.client() as c:
            await c.write_file("/three", data)
            await c.write_file("/single", data, replication=1)
            three = (await c.get_block_locations("/three"))["blocks"][0]["locations"][0]
            await cluster.stop_storage(storage_index(cluster, three["address"]))
            assert await c.read_file("/three") == data
            single = (await c.get_block_locations("/single"))["blocks"]
            alive = {cluster.storage_address(i) for i in range(3) if cluster.storage[i]}
            lost = next(b for b in single if b["locations"][0]["address"] not in alive) \
                if any(b["locations"][0]["address"] not in alive for b in single) else None
            if lost is None:  # both blocks live elsewhere: stop the first one's node
                lost = single[0]
                await cluster.stop_storage(storage_index(cluster, lost["locations"][0]["address"]))
            with pytest.raises(errors.BlockMissing) as info:
                async with await c.open("/single") as s:
                    await s.pread(lost["offset"], 10)
            text = str(info.value)
            assert "/single" in text and str(lost["block"]["id"]) in text
            assert str(lost["offset"]) in text


@pytest.mark.cluster(**SMALL, dead_node_interval=60.0)
async def test_pipeline_setup_excludes_a_dead_node(cluster):
    """A block server that stopped but is not yet declared dead is handed out by add_block:
    the client abandons the block, excludes the node and writes to the others."""
    async with cluster.client() as c:
        await cluster.stop_storage(1)
        gone = cluster.storage_address(1)
        data = payload(BLOCK + 100, seed=8)
        await c.write_file("/survivor", data, replication=3)
        assert await c.read_file("/survivor") == data
        for block in (await c.get_block_locations("/survivor"))["blocks"]:
            addresses = [n["address"] for n in block["locations"]]
            assert gone not in addresses and len(addresses) == 2


async def test_setup_failure_downstream_names_the_first_bad_link(tmp_path):
    """A real block server whose downstream target is unreachable answers the setup with
    ``first_bad_link``; the client blames that node, not the first one."""
    import socket

    from fs.pipeline import Pipeline, SetupFailed

    with socket.socket() as sock:   # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"

    # a block the metadata server never allocated: no write token for it in security =
    # secure, where the first node would refuse it before looking downstream
    async with inprocess_cluster(tmp_path, n_storage=1, security="simple",
                                 **SMALL) as cluster:
        first = {"node_id": "first", "address": cluster.storage_address(0)}
        located = {"block": {"id": 424242, "gs": 1, "num_bytes": 0},
                   "locations": [first, {"node_id": "dead-one", "address": dead}]}
        with pytest.raises(SetupFailed) as info:
            await Pipeline.connect(path="/p", located=located, client_name="t",
                                   bytes_per_checksum=BPC, window=4, timeout=5.0,
                                   connect_timeout=5.0, max_frame=1 << 20)
        assert info.value.node["node_id"] == "dead-one"
        assert dead in info.value.reason


@pytest.mark.cluster(**SMALL)
async def test_unrecoverable_node_failure_fails_the_stream_naming_the_node(cluster):
    """Replication 3 on 3 block servers, block hflushed: HDFS's DEFAULT
    replace-datanode-on-failure policy wants a replacement for the failed node and there is
    no spare (best effort off), so pipeline recovery gives up and the stream fails, naming
    the node and the file; it stays failed."""
    async with cluster.client() as c:
        out = await c.create("/broken")
        await out.write(payload(3000))
        await out.hflush()
        block = (await c.get_block_locations("/broken"))["blocks"][0]
        victim = block["locations"][-1]["address"]
        await cluster.stop_storage(storage_index(cluster, victim))
        with pytest.raises(errors.PipelineError) as info:
            with trio.fail_after(30):
                for _ in range(100):
                    await out.write(payload(PACKET, seed=9))
                    await out.hflush()
        assert victim in str(info.value) and "/broken" in str(info.value)
        with pytest.raises(errors.PipelineError):   # the stream stays failed
            await out.write(b"x")
        with pytest.raises(errors.PipelineError):
            await out.close()
        await out.close()                           # then closing is a no-op
        assert c.open_output_streams == []


@pytest.mark.cluster(**SMALL, lease_renew_period=0.05)
async def test_closing_the_client_completes_open_files_and_renews_leases(cluster):
    async with cluster.client() as c:
        out = await c.create("/left-open")
        await out.write(b"abc" * 1000)
        with trio.fail_after(10):     # renewals every 0.05 s while the file is open
            while c._renewer.renewals < 2:
                await trio.sleep(0.01)
        assert c.open_output_streams == [out]
    async with cluster.client() as other:
        st = await other.get_file_status("/left-open")
        assert not st.under_construction and st.length == 3000
        assert await other.read_file("/left-open") == b"abc" * 1000
        # an exception inside the stream's block abandons the file (no complete)
        with pytest.raises(ZeroDivisionError):
            async with await other.create("/abandoned") as s:
                await s.write(b"partial")
                1 / 0
        assert (await other.get_file_status("/abandoned")).under_construction
        assert other.open_output_streams == []


@pytest.mark.cluster(**SMALL)
async def test_client_exceptions_are_not_wrapped_in_groups(cluster):
    with pytest.raises(errors.FileNotFound):
        async with cluster.client() as c:
            await c.get_file_status("/nope")
    with pytest.raises(errors.ServerUnavailable):
        async with AsyncClient("127.0.0.1:1", config=cluster.config.replace(
                rpc_retry_seconds=0.2)):
            pass


async def test_namespace_calls(tmp_path, monkeypatch):
    monkeypatch.setattr(client_mod, "LIST_PAGE", 3)

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        async with cluster.client() as c:
            assert await c.mkdirs("/a/b/c") is True
            assert await c.mkdirs("/a/b/c") is True
            assert await c.exists("/a/b") and not await c.exists("/a/zz")
            st = await c.get_file_status("/a/b/c")
            assert st.is_dir and st.mode == 0o755 and st.path == "/a/b/c" and st.name == "c"
            for i in range(8):
                await c.write_file(f"/a/list/f{i}", bytes([i]) * i, permission=0o600)
            entries = await c.list_status("/a/list")      # 3 pages of 3
            assert [e.name for e in entries] == [f"f{i}" for i in range(8)]
            assert [e.length for e in entries] == list(range(8))
            assert all(e.is_file and e.mode == 0o600 for e in entries)
            assert [e.name async for e in c.iter_status("/a/list")] == [e.name for e in entries]
            assert [e.path for e in await c.list_status("/a/list/f3")] == ["/a/list/f3"]
            assert (await c.get_file_status("/a")).children == 2

            assert await c.rename("/a/list/f1", "/a/moved") is True
            assert not await c.exists("/a/list/f1")
            assert await c.read_file("/a/moved") == b"\x01"
            with pytest.raises(errors.FileExists):
                await c.rename("/a/list/f2", "/a/moved")
            await c.rename("/a/list/f2", "/a/moved", overwrite=True)
            assert await c.read_file("/a/moved") == b"\x02\x02"

            await c.set_permission("/a/moved", 0o640)
            await c.set_owner("/a/moved", owner="alice", group="staff")
            await c.set_times("/a/moved", mtime_ns=1_000_000_000, atime_ns=2_000_000_000)
            await c.set_replication("/a/moved", 2)
            st = await c.get_file_status("/a/moved")
            assert (st.mode, st.owner, st.group, st.mtime_ns, st.atime_ns, st.replication) \
                == (0o640, "alice", "staff", 1_000_000_000, 2_000_000_000, 2)

            link = await c.create_symlink("/a/moved", "/links/l", create_parent=True)
            assert link.is_symlink and link.symlink == "/a/moved"
            assert (await c.get_file_status("/links/l")).symlink == "/a/moved"

            summary = await c.content_summary("/a")
            assert summary["length"] == sum(range(8)) - 1 - 2 + 2
            assert summary["file_count"] == 7
            report = await c.report()
            assert len(report["live_nodes"]) == 3 and not report["safemode"]["on"]
            assert (await c.safemode())["on"] is False

            with pytest.raises(errors.DirectoryNotEmpty):
                await c.delete("/a")
            assert await c.delete("/a/moved") is True
            assert await c.delete("/a", recursive=True) is True
            assert not await c.exists("/a")
            with pytest.raises(errors.FileNotFound):
                await c.delete("/a")
            with pytest.raises(errors.InvalidPath):
                await c.mkdirs("/bad//path")


# --------------------------------------------------------------------------- blocking facade


async def test_sync_client_from_plain_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(client_mod, "LIST_PAGE", 2)
    data = payload(2 * BLOCK + 999, seed=11)

    def blocking_part(address, config):
        with Client(address, config=config) as c:
            assert c.client_name.startswith("leasefs-client-")
            assert c.mkdirs("/sync") is True
            failures = []

            def worker(i):
                try:
                    with c.create(f"/sync/t{i}") as out:
                        for j in range(0, len(data), 10_000):
                            out.write(data[j:j + 10_000])
                        out.flush()
                        assert out.tell() == len(data)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not failures, failures
            assert [s.name for s in c.iter_status("/sync")] == [f"t{i}" for i in range(4)]
            assert [s.name for s in c.list_status("/sync")] == [f"t{i}" for i in range(4)]

            raw = c.open("/sync/t2")
            assert raw.length == len(data) and raw.seekable() and raw.readable()
            with io.BufferedReader(raw, buffer_size=8192) as buffered:
                assert buffered.read(100) == data[:100]
                buffered.seek(BLOCK - 5)
                assert buffered.read(10) == data[BLOCK - 5:BLOCK + 5]
                assert buffered.tell() == BLOCK + 5
                assert buffered.read() == data[BLOCK + 5:]
            assert raw.closed
            with c.open("/sync/t0") as raw:
                buf = bytearray(1000)
                assert raw.readinto(buf) == 1000 and bytes(buf) == data[:1000]
                assert raw.seek(-10, os.SEEK_END) == len(data) - 10
                assert raw.readall() == data[-10:]
                assert raw.pread(5, 5) == data[5:10]
            assert c.read_file("/sync/t3") == data
            c.write_file("/sync/small", b"hello")
            assert c.get_file_status("/sync/small").length == 5
            with pytest.raises(errors.FileExists):
                c.create("/sync/small")
            out = c.create("/sync/unclosed")
            out.write(b"done by close()")
        # Client.close() completed the file left open
        with Client(address, config=config) as c2:
            assert c2.read_file("/sync/unclosed") == b"done by close()"
            assert not c2.get_file_status("/sync/unclosed").under_construction
        with pytest.raises(errors.InvalidArgument):
            c.exists("/sync")

    async with inprocess_cluster(tmp_path, **SMALL) as cluster:
        await trio.to_thread.run_sync(blocking_part, cluster.meta_address, cluster.config)


def test_sync_client_reports_an_unreachable_server():
    config = client_mod.Config.load(env={}, rpc_retry_seconds=0.2)
    with pytest.raises(errors.ServerUnavailable):
        Client("127.0.0.1:1", config=config)


@pytest.mark.cluster(**SMALL)
async def test_clients_sharing_one_connection_stay_separate_lease_holders(cluster):
    """``AsyncClient(rpc=meta_connection(...))``: Hadoop IPC's one connection per server and
    user. Each client is still its own lease holder; the connection batches their calls and
    outlives a client that closes."""
    async with client_mod.meta_connection(cluster.meta_address,
                                          config=cluster.config) as rpc:
        with pytest.raises(errors.InvalidArgument, match="shared connection"):
            AsyncClient(config=cluster.config, rpc=rpc, user="somebody-else")
        async with cluster.client(rpc=rpc) as one, cluster.client(rpc=rpc) as two:
            assert one.client_name != two.client_name
            out = await one.create("/shared/a")
            await out.write(b"first")
            with pytest.raises(errors.AlreadyBeingCreated):
                await two.append("/shared/a")      # the other holder's lease
            await out.close()
            async with await two.append("/shared/a") as more:
                await more.write(b"+second")

            files = {f"/shared/{i}": payload(3000 + i * 977, seed=i) for i in range(8)}

            async def write(client, path, data):
                async with await client.create(path) as s:
                    await s.write(data)

            async with trio.open_nursery() as nursery:
                for i, (path, data) in enumerate(files.items()):
                    nursery.start_soon(write, (one, two)[i % 2], path, data)

            async def stat_many(client):
                for path in files:
                    assert (await client.get_file_status(path)).length == len(files[path])
            async with trio.open_nursery() as nursery:
                for _ in range(16):
                    nursery.start_soon(stat_many, (one, two)[_ % 2])
            stats = rpc._conn.channel.stats
            # 16 callers at once on one connection: requests and replies travel in
            # batches, not one write or read per frame
            assert stats.frames_out > 1.5 * stats.writes, stats
            assert stats.frames_in > 1.5 * stats.reads, stats
            await one.aclose()
        assert await rpc.call("get_file_info", {"path": "/shared/a"}) is not None
        async with cluster.client(rpc=rpc) as three:   # the connection lives on
            assert await three.read_file("/shared/a") == b"first+second"
            for path, data in files.items():
                assert await three.read_file(path) == data
