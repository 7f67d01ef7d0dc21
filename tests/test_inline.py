"""Small files kept in the namespace (``inline_max``): a file closed whole from its writer's
buffer is one ``complete`` carrying its bytes; no block server sees it.

Real metadata server (LevelDB, journal) and real block servers, in-process on loopback. Each
test checks the stored namespace afterwards with ``check_namespace`` (inline keys and inodes
agree) and that the content survives a restart of the metadata server (journal replay).
"""

from __future__ import annotations

import random

import pytest
import trio

from harness import inprocess_cluster, recover_until_closed
from test_oneshot import count_oneshots

from fs.errors import LeaseExpired, LeaseFSError, PipelineError
from fs.datatransfer import chunk_checksums
from fs.pipeline import write_oneshot
from meta.schema import keys
from meta.namespace.invariants import check_namespace
from meta.journal.kv import PlyvelStore

KiB = 1 << 10
INLINE = dict(inline_max=8 * KiB, block_size=64 * KiB, packet_size=16 * KiB,
              bytes_per_checksum=512)

pytestmark = pytest.mark.timeout(120)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def stored(cluster) -> dict[int, bytes]:
    """The inline keys of the stopped metadata server's store, after checking it whole."""
    store = PlyvelStore(str(cluster.meta_dir / "db"), create=False)
    try:
        assert check_namespace(store) == []
        return {keys.parse_inline_key(k): keys.unpack(v) for k, v in store.scan(keys.INLINE)}
    finally:
        store.close()


async def restart_meta(cluster) -> None:
    await cluster.stop_meta()
    await cluster.start_meta()
    await cluster.wait_ready(len(cluster.storage))


async def replicas(cluster) -> list[str]:
    return sorted(p.name for d in cluster.storage_dirs for p in d.rglob("blk_*"))


async def test_a_small_file_closed_whole_is_one_complete_and_no_block(tmp_path, monkeypatch):
    """create + write + close of a file up to inline_max: its bytes ride on ``complete``;
    no block, no block server touched, read back through the client and after a restart.
    Bigger than inline_max, flushed before the close, or empty: blocks as before."""
    served = count_oneshots(monkeypatch)
    small, big = payload(5000, 1), payload(8 * KiB + 1, 2)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as c:
            assert c.config.inline_max == 8 * KiB   # the server's setting reaches it
            calls = []
            real_call = c.rpc.call

            async def spy(method, args=None, **kw):
                calls.append(method)
                return await real_call(method, args, **kw)

            c.rpc.call = spy
            out = await c.create("/small", replication=3)
            await out.write(small)
            await out.close()
            assert calls == ["create", "complete"]
            c.rpc.call = real_call
            located = await c.get_block_locations("/small")
            assert located["blocks"] == [] and bytes(located["inline"]) == small
            assert (await c.get_file_status("/small")).length == len(small)
            assert await c.read_file("/small") == small
            async with await c.open("/small") as f:   # positioned reads of inline data
                assert await f.pread(4000, 5000) == small[4000:]
                f.seek(10)
                assert await f.read(20) == small[10:30]
            assert served == [] and await replicas(cluster) == []

            await c.write_file("/big", big, replication=3)
            out = await c.create("/flushed", replication=3)
            await out.write(small)
            await out.hflush()
            await out.close()
            await c.write_file("/empty", b"")
            for name in ("/big", "/flushed"):
                located = await c.get_block_locations(name)
                assert "inline" not in located and len(located["blocks"]) == 1
            located = await c.get_block_locations("/empty")
            assert "inline" not in located and located["blocks"] == []
        await restart_meta(cluster)
        async with cluster.client() as c:
            assert await c.read_file("/small") == small
            assert await c.read_file("/big") == big
            assert await c.read_file("/flushed") == small
            assert await c.read_file("/empty") == b""
        await cluster.stop_meta()
        assert list(stored(cluster).values()) == [small]


async def test_retried_and_late_inline_completes(tmp_path):
    """A retried complete with the same bytes after the close answers True (HDFS-3031's
    rule, by content); a writer whose file another client recovered meanwhile gets the
    lease error and the file keeps what the recovery closed it with."""
    data = payload(3000, 3)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as a, cluster.client() as b:
            out = await a.create("/f")
            await out.write(data)
            await out.close()
            again = {"path": "/f", "client_name": a.client_name, "ino": out.ino,
                     "data": data}
            assert await a.rpc.call("complete", again) is True
            with pytest.raises(LeaseExpired, match="No lease on /f"):
                await a.rpc.call("complete", {**again, "data": data[:-1]})

            late = await a.create("/late")
            await late.write(data)
            assert await b.recover_lease("/late") is True   # nothing sent: closes empty
            with pytest.raises(LeaseExpired, match="No lease on /late"):
                await late.close()
            assert await b.read_file("/late") == b""
            # inline data larger than the server keeps, or beside a written block
            out = await a.create("/g")
            with pytest.raises(LeaseFSError, match="inline_max"):
                await a.rpc.call("complete", {"path": "/g", "client_name": a.client_name,
                                              "data": payload(8 * KiB + 1)})
            await out.write(data)
            await out.close()
            assert await a.read_file("/g") == data
        await cluster.stop_meta()
        assert sorted(stored(cluster).values()) == [data, data]


async def test_append_to_an_inline_file(tmp_path):
    """Append reopens an inline file with its bytes first in the stream: a small append
    stays inline; a larger one writes them into the first block, and the inline copy goes
    once that block holds them (complete, hflush, the next block); readers see the inline
    content until then."""
    first, more = payload(2000, 4), payload(3000, 5)
    big = payload(200 * KiB, 6)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as c:
            await c.write_file("/a", first)
            out = await c.append("/a")
            assert out.pos == len(first)
            await out.write(more)
            await out.close()
            assert bytes((await c.get_block_locations("/a"))["inline"]) == first + more

            out = await c.append("/a")
            await out.write(big)
            await out.close()
            located = await c.get_block_locations("/a")
            assert "inline" not in located and len(located["blocks"]) == 4
            assert await c.read_file("/a") == first + more + big

            await c.write_file("/h", first)
            out = await c.append("/h")
            await out.write(more)
            async with await c.open("/h") as f:   # not flushed: the inline content
                assert await f.read() == first
            await out.hflush()
            async with await c.open("/h") as f:
                assert await f.read() == first + more
            await out.write(more)
            await out.close()
            assert await c.read_file("/h") == first + more + more
        await restart_meta(cluster)
        async with cluster.client() as c:
            assert await c.read_file("/a") == first + more + big
            assert await c.read_file("/h") == first + more + more
        await cluster.stop_meta()
        assert stored(cluster) == {}


async def test_a_dead_appender_leaves_the_inline_content_or_what_it_flushed(tmp_path):
    """Lease recovery of a reopened inline file: an appender that died before any byte was
    flushed leaves the inline content; one whose first block holds fewer bytes than the
    inline content (it died while sending them) leaves the inline content and the block
    goes; one that hflushed leaves the flushed bytes."""
    first, more = payload(6000, 7), payload(1000, 8)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as dead, cluster.client() as other:
            for name in ("/quiet", "/short", "/flushed"):
                await other.write_file(name, first, replication=3)
            out = await dead.append("/quiet")
            await out.write(more)
            out.abort(PipelineError("writer died"))

            out = await dead.append("/short")   # the first block got 1000 of 6000 bytes
            located = await dead.rpc.call("add_block", {
                "path": "/short", "client_name": dead.client_name, "ino": out.ino})
            part = first[:1000]
            await write_oneshot(path="/short", located=located,
                                client_name=dead.client_name, bytes_per_checksum=512,
                                data=part, sums=chunk_checksums(part, 512), timeout=10,
                                connect_timeout=10, max_frame=1 << 20)
            out.abort(PipelineError("writer died"))

            out = await dead.append("/flushed")
            await out.write(more)
            await out.hflush()
            out.abort(PipelineError("writer died"))

            for name in ("/quiet", "/short", "/flushed"):
                await recover_until_closed(other, name, timeout=30)
            assert await other.read_file("/quiet") == first
            assert await other.read_file("/short") == first
            assert await other.read_file("/flushed") == first + more
            assert "inline" in await other.get_block_locations("/short")
        await cluster.stop_meta()
        assert sorted(stored(cluster)) and sorted(stored(cluster).values()) == [first, first]


async def test_truncate_delete_and_overwrite_of_inline_files(tmp_path):
    """Truncate cuts the inline bytes in place (to 0: none left); delete, a recursive delete
    reclaimed in the background and create(overwrite) remove them with the file."""
    data = payload(7000, 9)

    async with inprocess_cluster(tmp_path, n_storage=3, delete_chunk=8, **INLINE) as cluster:
        async with cluster.client() as c:
            await c.write_file("/t", data)
            assert await c.truncate("/t", 100) is True
            assert await c.read_file("/t") == data[:100]
            assert (await c.get_file_status("/t")).length == 100
            await c.write_file("/z", data)
            assert await c.truncate("/z", 0) is True
            assert await c.read_file("/z") == b""
            for i in range(30):
                await c.write_file(f"/tree/d{i % 3}/f{i}", data[:i + 1])
            await c.write_file("/o", data)
            await c.write_file("/o", data[:50], overwrite=True)
            await c.write_file("/gone", data)
            assert await c.delete("/gone")
            assert await c.delete("/tree", recursive=True)
            with trio.fail_after(30):   # the reclaim runs in the background
                while (await c.report())["files"] != 3:   # /t, /z, /o
                    await trio.sleep(0.1)
            assert await c.read_file("/o") == data[:50]
        await cluster.stop_meta()
        assert sorted(stored(cluster).values()) == sorted([data[:100], data[:50]])


async def test_hsync_of_a_small_file_stores_it_inline_and_survives_its_writer(tmp_path):
    """hsync (fsync(2) through the mount) of a file wholly in the buffer: one journaled call
    stores the bytes as the open file's content — readers see them, a writer that dies then
    leaves them (lease recovery closes the file with them); the close or a later block
    carries them again. After INLINE_SYNCS of them the pipeline takes over."""
    from fs.writer import INLINE_SYNCS

    a, b = payload(3000, 10), payload(2000, 11)
    big = payload(200 * KiB, 12)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            out = await c.create("/synced")
            await out.write(a)
            await out.hsync()
            located = await other.get_block_locations("/synced")
            assert located["under_construction"] and bytes(located["inline"]) == a
            await out.write(b)
            await out.hsync()
            assert await other.read_file("/synced") == a + b
            out.abort(PipelineError("writer died"))
            await recover_until_closed(other, "/synced", timeout=30)
            assert await other.read_file("/synced") == a + b

            out = await c.create("/grows")
            await out.write(a)
            await out.hsync()
            await out.write(big)          # past a packet: the first block starts with a
            await out.close()
            located = await c.get_block_locations("/grows")
            assert "inline" not in located and located["blocks"]
            assert await c.read_file("/grows") == a + big

            out = await c.create("/often")
            for i in range(INLINE_SYNCS + 1):
                await out.write(b)
                await out.hsync()
            located = await other.get_block_locations("/often")
            assert "inline" not in located and len(located["blocks"]) == 1
            assert await other.read_file("/often") == b * (INLINE_SYNCS + 1)
            await out.close()
            assert await c.read_file("/often") == b * (INLINE_SYNCS + 1)
        await restart_meta(cluster)
        async with cluster.client() as c:
            assert await c.read_file("/synced") == a + b
            assert await c.read_file("/grows") == a + big
        await cluster.stop_meta()
        assert list(stored(cluster).values()) == [a + b]


async def test_publish_shows_bytes_and_length_and_keeps_the_file_open(tmp_path):
    """``publish`` (the mount's flush, at every close(2)): a small file wholly in the buffer
    goes inline, a bigger one is hflushed and its length recorded, both by a
    ``fsync(sync=false)``; another client sees the bytes and the length while the file
    stays open under the writer's lease; a publish with nothing new makes no call."""
    a, b = payload(3000, 20), payload(2000, 21)
    big = payload(100 * KiB + 123, 22)

    async with inprocess_cluster(tmp_path, n_storage=3, **INLINE) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            calls = []
            real_call = c.rpc.call

            async def spy(method, args=None, **kw):
                calls.append((method, (args or {}).get("sync", True)))
                return await real_call(method, args, **kw)

            c.rpc.call = spy
            out = await c.create("/published")
            await out.write(a)
            await out.publish()
            await out.publish()   # nothing new
            assert calls[1:] == [("fsync", False)]
            located = await other.get_block_locations("/published")
            assert located["under_construction"] and bytes(located["inline"]) == a
            await out.write(b)
            await out.publish()
            assert await other.read_file("/published") == a + b
            await out.close()
            located = await other.get_block_locations("/published")
            assert not located["under_construction"]
            assert bytes(located["inline"]) == a + b

            out = await c.create("/big")
            await out.write(big)
            del calls[:]
            await out.publish()
            assert ("fsync", False) in calls
            status = await other.get_file_status("/big")
            assert status.under_construction and status.length == len(big)
            assert await other.read_file("/big") == big
            await out.close()
            assert await other.read_file("/big") == big
