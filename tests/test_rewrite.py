"""``rewrite``: a writer starts the file it holds the lease of over, empty, in one journaled
call (what the mount does to upload a staging file), instead of close + truncate + append.

Real metadata server (LevelDB, journal) and real block servers, in-process on loopback. What
must hold: the lease is never let go (another client cannot open the file in between), the
old content's blocks go (their replicas are deleted from the block servers), only the holder
may do it, a writer that dies afterwards leaves what it hsynced since, and the stored
namespace is consistent and survives a restart (journal replay).
"""

from __future__ import annotations

import random

import pytest
import trio

from harness import inprocess_cluster, recover_until_closed
from test_inline import replicas, restart_meta, stored

from fs.errors import AlreadyBeingCreated, InvalidArgument, LeaseExpired, PipelineError

KiB = 1 << 10
SMALL = dict(inline_max=8 * KiB, block_size=64 * KiB, packet_size=16 * KiB,
             bytes_per_checksum=512)

pytestmark = pytest.mark.timeout(120)


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed * 7_919 + n).randbytes(n)


async def replicas_become(cluster, want: set[int]) -> None:
    """Wait until the block servers hold replicas of exactly the blocks ``want``."""
    with trio.fail_after(30):
        while True:
            held = {int(name.split("_")[1].split(".")[0]) for name in await replicas(cluster)}
            if held == want:
                return
            await trio.sleep(0.1)


async def block_ids(client, path: str) -> set[int]:
    located = await client.get_block_locations(path)
    return {b["block"]["id"] for b in located.get("blocks", [])}


async def test_rewrite_starts_the_file_over_under_the_same_lease(tmp_path):
    old, new, more = payload(150 * KiB, 1), payload(20 * KiB, 2), payload(70 * KiB, 3)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            out = await c.create("/f", replication=3)
            await out.write(old)
            await out.hsync()
            old_blocks = await block_ids(other, "/f")
            assert len(old_blocks) == 3
            ino = out.ino

            again = await out.rewrite()
            assert again.ino == ino and again.pos == 0
            with pytest.raises(InvalidArgument):
                await out.write(b"x")             # the old stream is done with
            with pytest.raises(AlreadyBeingCreated):
                await other.append("/f")          # the lease was never let go
            status = await other.get_file_status("/f")
            assert status.length == 0 and status.ino == ino

            await again.write(new)
            await again.hsync()
            assert await other.read_file("/f") == new
            await again.write(more)               # into a second block
            await again.close()
            assert await other.read_file("/f") == new + more
            new_blocks = await block_ids(other, "/f")
            assert new_blocks and not new_blocks & old_blocks
            await replicas_become(cluster, new_blocks)   # the old replicas are deleted

        await restart_meta(cluster)
        async with cluster.client() as c:
            assert await c.read_file("/f") == new + more
            assert (await c.get_file_status("/f")).ino == ino
        await cluster.stop_meta()
        stored(cluster)   # check_namespace of the stopped store finds nothing


async def test_rewrite_of_a_small_file_and_of_an_empty_one(tmp_path):
    """A rewritten file that stays small closes inline, like a new one; rewriting a file
    with no bytes yet is allowed and changes nothing."""
    first, second = payload(30 * KiB, 4), payload(3 * KiB, 5)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/small")
            out = await out.rewrite()
            await out.write(first)
            await out.hsync()
            out = await out.rewrite()
            await out.write(second)
            await out.hsync()                     # inline: nothing sent yet
            await out.close()
            assert await c.read_file("/small") == second
            assert bytes((await c.get_block_locations("/small"))["inline"]) == second
            await replicas_become(cluster, set())
        await cluster.stop_meta()
        assert list(stored(cluster).values()) == [second]


async def test_only_the_lease_holder_may_rewrite(tmp_path):
    data = payload(40 * KiB, 6)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            out = await c.create("/held")
            await out.write(data)
            await out.hsync()
            with pytest.raises(LeaseExpired):
                await other.rpc.call("rewrite", {"path": "/held",
                                                 "client_name": other.client_name})
            await other.write_file("/closed", data)
            with pytest.raises(LeaseExpired):
                await other.rpc.call("rewrite", {"path": "/closed",
                                                 "client_name": other.client_name})
            await out.close()                     # the holder's stream is untouched
            assert await other.read_file("/held") == data
            assert await other.read_file("/closed") == data


async def test_a_writer_that_dies_after_a_rewrite_leaves_what_it_hsynced(tmp_path):
    old, new, unsynced = payload(100 * KiB, 7), payload(90 * KiB, 8), payload(5 * KiB, 9)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as dead, cluster.client() as other:
            out = await dead.create("/d")
            await out.write(old)
            await out.hsync()
            out = await out.rewrite()
            await out.write(new)
            await out.hsync()
            await out.write(unsynced)
            out.abort(PipelineError("writer died"))
            await recover_until_closed(other, "/d", timeout=30)
            assert await other.read_file("/d") == new
