"""Patches end to end (PROTOCOL.md "Patches"): the client's ``open_for_patch`` on a real
cluster of three block server processes, with the harness's security (write tokens for
the new stamps): ranges rewritten in place and the last block grown, read back equal to a
local model; a block server down during a patch misses it, its stale replica is removed
when it comes back and the block is copied to three again; readers that run beside the
patches get one version of each block per read call, never a mix."""

from __future__ import annotations

import random

import pytest
import trio

from fs.client import AsyncClient
from harness import ProcessCluster, poll_until, storage_index

KiB = 1 << 10
BLOCK = 64 * KiB
SIZE = 2 * BLOCK + 20 * KiB     # blocks of 64, 64 and 20 KiB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def write(model: bytearray, offset: int, data: bytes) -> None:
    model[offset:offset + len(data)] = data


async def read_all(client: AsyncClient, path: str) -> bytes:
    async with await client.open(path) as f:
        return await f.read()


async def locations(client: AsyncClient, path: str) -> list[dict]:
    return (await client.rpc.call("get_block_locations", {"path": path}))["blocks"]


def test_ranges_rewritten_in_place_and_the_last_block_grown(tmp_path):
    """Unaligned ranges inside a block, across a block boundary and past the end of the
    partial last block (growing it to the full block size): only the touched blocks get
    new stamps, the file reads back as the model, from every replica, and after a close
    the next open for patches starts from the new stamps."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        async def main():
            async with AsyncClient(cluster.meta_address) as client:
                model = bytearray(payload(SIZE, 1))
                async with await client.create("/f", block_size=BLOCK) as out:
                    await out.write(bytes(model))
                before = [b["block"]["gs"] for b in await locations(client, "/f")]
                pf = await client.open_for_patch("/f")
                assert pf.length == SIZE and pf.capacity == 3 * BLOCK
                ranges = [(5, b"x" * 3), (4000, payload(200, 2)),   # one chunk, unaligned
                          (BLOCK - 100, payload(300, 3))]           # across blocks 0 and 1
                done = await pf.patch(ranges)
                for offset, data in ranges:
                    write(model, offset, data)
                assert [d.block_id for d in done] == [b["block"]["id"] for b in pf.blocks[:2]]
                assert all(len(d.nodes) == 3 and not d.failed for d in done)
                grow = payload(3 * BLOCK - (SIZE - 10), 4)
                await pf.patch([(SIZE - 10, grow)])   # the last block up to its full size
                write(model, SIZE - 10, grow)
                assert pf.length == len(model) == 3 * BLOCK
                with pytest.raises(Exception, match="outside"):
                    await pf.patch([(3 * BLOCK - 1, b"zz")])   # past the last block's room
                await pf.close()
                blocks = await locations(client, "/f")
                after = [b["block"]["gs"] for b in blocks]
                assert all(a > b for a, b in zip(after, before)), (before, after)
                assert (await client.get_file_status("/f")).length == len(model)
                assert await read_all(client, "/f") == bytes(model)
                # three replicas of each, handed out in a new order at every open
                assert [len(b["locations"]) for b in blocks] == [3, 3, 3]
                for _ in range(6):
                    assert await read_all(client, "/f") == bytes(model)
                # again, from the new stamps
                pf = await client.open_for_patch("/f")
                await pf.patch([(BLOCK * 2 + 7, b"again")])
                write(model, BLOCK * 2 + 7, b"again")
                await pf.close()
                assert await read_all(client, "/f") == bytes(model)
        trio.run(main)


def test_a_block_server_down_misses_the_patch_and_is_repaired(tmp_path):
    """With one block server killed, a patch lands on the two others and commits with
    them; the file reads back as the model; the restarted server's replica at the old
    stamp is removed and the block copied back to three replicas at the new stamp."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        async def setup():
            async with AsyncClient(cluster.meta_address) as client:
                async with await client.create("/g", block_size=BLOCK) as out:
                    await out.write(payload(SIZE, 5))
                return (await locations(client, "/g"))[1]

        block = trio.run(setup)
        victim = storage_index(cluster, block["locations"][0]["address"])
        cluster.kill_storage(victim)
        model = bytearray(payload(SIZE, 5))

        async def patch():
            async with AsyncClient(cluster.meta_address) as client:
                pf = await client.open_for_patch("/g")
                done = await pf.patch([(BLOCK + 1000, b"patched while one was down")])
                await pf.close()
                return done

        done = trio.run(patch)
        write(model, BLOCK + 1000, b"patched while one was down")
        assert len(done) == 1 and len(done[0].nodes) == 2 and len(done[0].failed) == 1
        new_gs = done[0].gs

        async def check(replicas: int):
            async with AsyncClient(cluster.meta_address) as client:
                blocks = await locations(client, "/g")
                return (await read_all(client, "/g"), blocks[1]["block"]["gs"],
                        len(blocks[1]["locations"]))

        data, gs, _ = trio.run(check, 2)
        assert data == bytes(model) and gs == new_gs
        cluster.start_storage(victim)
        cluster.wait_ready()

        def stamps_on_victim():
            return sorted(int(p.name.rsplit("_", 1)[1].split(".")[0])
                          for p in cluster.storage_dir(victim).rglob(
                              f"blk_{block['block']['id']}_*.meta"))

        # the stale replica goes, and a copy of the new version comes (three replicas on
        # three servers: the victim is the only place left for the third)
        assert poll_until(lambda: stamps_on_victim() == [new_gs], 90), stamps_on_victim()
        assert poll_until(lambda: trio.run(check, 3)[2] == 3, 60)
        assert trio.run(check, 3)[0] == bytes(model)


def test_readers_beside_patches_see_one_version_of_a_block_per_read(tmp_path):
    """Two readers read the whole file again and again while a writer patches one block
    over and over, each patch filling the block's first 40 KiB with one byte value: every
    read call returns that range uniform (one version), and the last read the final one.
    Packets of 4 KiB, so a read call takes ten of them and a patch lands between two."""
    with ProcessCluster(tmp_path, n_storage=3, settings={"packet_size": 4096}) as cluster:
        async def main():
            config = cluster.config()
            async with AsyncClient(cluster.meta_address, config=config) as writer, \
                    AsyncClient(cluster.meta_address, config=config) as reader:
                async with await writer.create("/h", block_size=BLOCK) as out:
                    await out.write(bytes(BLOCK))
                pf = await writer.open_for_patch("/h")
                mixed: list[str] = []
                reads = [0]
                done = trio.Event()

                async def read_loop():
                    async with await reader.open("/h") as f:
                        while not done.is_set():
                            data = await f.pread(0, 40 * KiB)
                            reads[0] += 1
                            if len(set(data)) != 1:
                                mixed.append(f"values {sorted(set(data))[:5]}")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read_loop)
                    nursery.start_soon(read_loop)
                    for value in range(1, 41):
                        await pf.patch([(0, bytes([value]) * (40 * KiB))])
                    done.set()
                await pf.close()
                assert mixed == [], mixed[:5]
                assert reads[0] > 10
                assert await read_all(reader, "/h") == bytes([40]) * (40 * KiB) + bytes(
                    BLOCK - 40 * KiB)
        trio.run(main)


#: the patches of the writer killed below: patch ``k`` of a file of ``size`` bytes in blocks
#: of ``block``, one to three ranges in every block (a patch spans them all)
PATCHES = r'''
import random

def patch_ranges(k, size, block):
    rng = random.Random(k)
    ranges = []
    for start in range(0, size, block):
        end = min(size, start + block)
        at = start
        for _ in range(rng.randint(1, 3)):
            if at >= end - 1:
                break
            offset = rng.randrange(at, end - 1)
            length = rng.randint(1, min(20000, end - offset))
            ranges.append((offset, rng.randbytes(length)))
            at = offset + length
    return ranges
'''

KILLED_WRITER = PATCHES + r'''
import sys, trio
from fs.client import AsyncClient

async def main(path, size, block):
    async with AsyncClient() as client:
        pf = await client.open_for_patch(path)
        k = 0
        while True:
            await pf.patch(patch_ranges(k, size, block))
            print(k, flush=True)   # acknowledged: every block's patch committed
            k += 1

trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
'''


def replica_bytes(cluster: ProcessCluster, i: int, block_id: int) -> bytes | None:
    """The data file of block ``block_id`` on block server ``i``'s disk (None: none)."""
    found = [p for p in cluster.storage_dir(i).rglob(f"blk_{block_id}")
             if "finalized" in str(p)]
    return found[0].read_bytes() if len(found) == 1 else None


@pytest.mark.allow_log_errors(r".*", reason="the writer is killed with SIGKILL mid-patch")
def test_a_writer_killed_mid_patch_leaves_every_block_at_one_version(tmp_path):
    """A writer process patches every block of a file again and again and is killed with
    SIGKILL at a random moment (five rounds, one file each). After lease recovery every
    replica of every block holds the same bytes on disk, and each block is whole at one
    version: after the writer's last acknowledged patch, or after the one in flight."""
    import subprocess
    import sys
    import time
    namespace: dict = {}
    exec(PATCHES, namespace)
    patch_ranges = namespace["patch_ranges"]
    rng = random.Random(7)
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        for round_ in range(5):
            path = f"/killed{round_}"
            base = payload(SIZE, 20 + round_)

            async def create():
                async with AsyncClient(cluster.meta_address) as client:
                    async with await client.create(path, block_size=BLOCK) as out:
                        await out.write(base)
            trio.run(create)
            writer = subprocess.Popen(
                [sys.executable, "-c", KILLED_WRITER, path, str(SIZE), str(BLOCK)],
                env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                # a few patches acknowledged, then a kill at a random point of the next ones
                first = [writer.stdout.readline() for _ in range(3)]
                assert all(line.strip() for line in first), writer.stderr.read()
                time.sleep(rng.uniform(0.0, 0.3))   # fixed-sleep: where the kill lands
                writer.kill()
            finally:
                writer.kill()
                writer.wait(30)
            acked = len(first) + sum(1 for line in writer.stdout.read().split("\n")
                                     if line.strip())
            # versions[n]: the file after the writer's first n patches
            versions = [bytearray(base)]
            for k in range(acked + 1):
                model = bytearray(versions[-1])
                for offset, data in patch_ranges(k, SIZE, BLOCK):
                    write(model, offset, data)
                versions.append(model)

            async def recover():
                async with AsyncClient(cluster.meta_address) as client:
                    return await client.rpc.call("recover_lease", {
                        "path": path, "client_name": "rescuer"})
            assert poll_until(lambda: trio.run(recover), 60)

            async def blocks_now():
                async with AsyncClient(cluster.meta_address) as client:
                    return await locations(client, path), await read_all(client, path)

            def settled():
                blocks, content = trio.run(blocks_now)
                if any(len(b["locations"]) != 3 for b in blocks):
                    return None
                on_disk = []
                for b in blocks:
                    copies = {replica_bytes(cluster, i, b["block"]["id"]) for i in range(3)}
                    if len(copies) != 1 or None in copies:
                        return None   # a stale replica not yet replaced, a patch not flushed
                    on_disk.append(copies.pop())
                return blocks, content, on_disk
            done = poll_until(settled, 90)
            assert done, trio.run(blocks_now)[0]
            blocks, content, on_disk = done
            assert content == b"".join(on_disk)
            for index, data in enumerate(on_disk):
                span = slice(index * BLOCK, min(SIZE, (index + 1) * BLOCK))
                assert data in (bytes(versions[acked][span]), bytes(versions[acked + 1][span])), \
                    (round_, index, acked)


def test_a_begun_stamp_whose_replicas_all_fail_is_asked_for_again(tmp_path):
    """Each commit begins the block's next patch (``begin_next``), with the replicas the
    block had then. When every one of those fails (they moved: a server died, the block
    was copied elsewhere), the patch asks ``patch_block`` for the block as it is now and
    lands on all three replicas under a newer stamp; the file reads as the model."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        async def main():
            async with AsyncClient(cluster.meta_address) as client:
                model = bytearray(payload(SIZE, 8))
                async with await client.create("/f", block_size=BLOCK) as out:
                    await out.write(bytes(model))
                pf = await client.open_for_patch("/f")
                await pf.patch([(10, b"one")])
                write(model, 10, b"one")
                block_id = pf.blocks[0]["block"]["id"]
                when, begun = pf._begun[block_id]
                gone = [{**loc, "address": "127.0.0.1:1"} for loc in begun["locations"]]
                pf._begun[block_id] = (when, {**begun, "locations": gone})
                done = await pf.patch([(20, b"two")])
                write(model, 20, b"two")
                assert len(done[0].nodes) == 3 and done[0].gs > begun["block"]["gs"]
                await pf.close()
                assert await read_all(client, "/f") == bytes(model)
        trio.run(main)
