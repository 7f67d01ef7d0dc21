"""Patches on the metadata server: ``append(patch=true)``, ``patch_block``, ``patch_done``,
the pending patch stamp through restarts, block reports and lease recovery (PROTOCOL.md
"Patches").

The block servers' PATCH_BLOCK is not part of this tree yet, so a replica "patched" to a
new stamp is made the way a block server's atomic patch leaves it on disk: the block
server is stopped, the replica's meta file renamed to the new stamp (the bytes are the
same: a patch that rewrote them unchanged), and the block server started again; its
registration's full report then carries the new stamp. Everything else is the real thing:
ProcessCluster, real block servers, real LevelDB, the calls as a client sends them.
"""

from __future__ import annotations

import random
import time

import pytest
import trio

from fs.errors import (AlreadyBeingCreated, InvalidArgument, IsDirectory, LeaseExpired,
                       StaleGenerationStamp, sole_exception)
from fs.rpc import RpcClient
from harness import ProcessCluster, poll_until, storage_index
from meta.blocks import blocks as bm
from meta.blocks.blocks import BlockInfo, BlocksMap

KiB = 1 << 10
BLOCK = 32 * KiB
SIZE = 80 * KiB          # blocks of 32, 32 and 16 KiB: more than inline_max, so no inline
WRITER = "patcher"

pytestmark = pytest.mark.timeout(180)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def raw(cluster: ProcessCluster, method: str, **args):
    """One call with exactly ``args``, as a client of name ``WRITER`` (or any) sends it."""
    async def once():
        async with RpcClient(cluster.meta_address, "patch-test", retry_seconds=5,
                             timeout=20) as rpc:
            return await rpc.call(method, args)
    try:
        return trio.run(once)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


def restart_meta(cluster: ProcessCluster) -> None:
    cluster.kill_meta()
    cluster.start_meta()
    cluster.wait_ready()


def located(cluster: ProcessCluster, path: str) -> dict:
    return raw(cluster, "get_block_locations", path=path)


def ref(block: dict) -> dict:
    return {"id": block["block"]["id"], "gs": block["block"]["gs"]}


def meta_stamps(cluster: ProcessCluster, i: int, block_id: int) -> list[int]:
    return sorted(int(p.name.rsplit("_", 1)[1].split(".")[0])
                  for p in cluster.storage_dir(i).rglob(f"blk_{block_id}_*.meta")
                  if "finalized" in str(p))


def live_ids(cluster: ProcessCluster) -> dict[int, str]:
    """Block server index → node id, of the live ones."""
    return {storage_index(cluster, n["address"]): n["node_id"]
            for n in raw(cluster, "report")["live_nodes"]}


def patch_on_disk(cluster: ProcessCluster, i: int, block_id: int, old_gs: int,
                  new_gs: int, path: str | None = None, index: int = 0) -> None:
    """Block server ``i`` holds the block at ``new_gs`` (see the module docstring). It is
    declared dead first, so its replica leaves the blocks map and what comes back is the
    report of the restarted server; with ``path``, the call returns once that report made
    the replica a location of block ``index`` again (a pending patch's replica is one)."""
    node_id = live_ids(cluster)[i]
    cluster.kill_storage(i)
    assert poll_until(lambda: i not in live_ids(cluster), 30)
    meta = next(p for p in cluster.storage_dir(i).rglob(f"blk_{block_id}_{old_gs}.meta")
                if "finalized" in str(p))
    meta.rename(meta.with_name(f"blk_{block_id}_{new_gs}.meta"))
    cluster.start_storage(i)
    cluster.wait_ready()
    if path is not None:
        assert poll_until(lambda: node_id in node_ids(located(cluster, path)["blocks"][index]),
                          30), located(cluster, path)


def node_ids(block: dict) -> list[str]:
    return [loc["node_id"] for loc in block["locations"]]


def settled(cluster: ProcessCluster, path: str, index: int, gs: int, replicas: int = 3):
    """Wait until block ``index`` of ``path`` has stamp ``gs`` and ``replicas`` locations,
    each block server holding exactly one finalized replica of it, at ``gs``."""
    def check():
        block = located(cluster, path)["blocks"][index]
        if block["block"]["gs"] != gs or len(block["locations"]) != replicas:
            return None
        for loc in block["locations"]:
            if meta_stamps(cluster, storage_index(cluster, loc["address"]),
                           block["block"]["id"]) != [gs]:
                return None
        return block
    block = poll_until(check, 60)
    assert block, located(cluster, path)
    return block


def open_for_patch(cluster: ProcessCluster, path: str, data: bytes) -> dict:
    with cluster.client() as c:
        c.write_file(path, data, block_size=BLOCK)
    return raw(cluster, "append", path=path, client_name=WRITER, patch=True)


# --------------------------------------------------------------------------- pure


def test_replica_stamps_of_a_block_being_patched():
    blocks = BlocksMap(min_replication=1)
    blocks.add(BlockInfo(7, ino=2, index=0, gs=100, num_bytes=4096, state=bm.COMPLETE,
                         replication=3))
    for node in ("a", "b", "c"):
        blocks.add_replica(node, 7, 100, 4096, bm.FINALIZED)
    info = blocks.get(7)
    blocks.begin_patch(7, 105)
    assert blocks.pending_patches(2) == [info] and info.gs == 100
    # a superseded patch's stamp, and an older one, are stale; the pending one is pending
    blocks.add_replica("a", 7, 103, 4096, bm.FINALIZED)
    assert info.replicas["a"].corrupt
    blocks.add_replica("a", 7, 105, 4096, bm.FINALIZED)
    assert info.replicas["a"].verdict == bm.PENDING and not info.replicas["a"].corrupt
    blocks.add_replica("b", 7, 99, 4096, bm.FINALIZED)
    assert info.replicas["b"].corrupt
    blocks.add_replica("b", 7, 105, 4096, bm.FINALIZED)
    blocks.add_replica("c", 7, 105, 4096, bm.FINALIZED)
    # every replica holds the patch: the block is neither missing nor under-replicated
    assert blocks.counts() == blocks.recount() == {"under_replicated": 0, "missing": 0,
                                                   "corrupt": 0}
    assert sorted(info.location_nodes()) == ["a", "b", "c"]
    blocks.patched(7, 105, 8192, ["a", "b"])
    assert (info.gs, info.num_bytes, info.patch_gs) == (105, 8192, 0)
    assert sorted(info.good_nodes()) == ["a", "b"] and info.replicas["c"].corrupt
    assert blocks.pending_patches(2) == [] and blocks.counts() == blocks.recount()
    blocks.begin_patch(7, 110)
    blocks.drop_patch(7)
    blocks.add_replica("a", 7, 110, 8192, bm.FINALIZED)   # reported after the drop
    assert info.replicas["a"].corrupt and info.gs == 105
    # only a finished block is patched
    blocks.add(BlockInfo(8, ino=2, index=1, gs=120, num_bytes=0,
                         state=bm.UNDER_CONSTRUCTION, replication=3))
    with pytest.raises(InvalidArgument):
        blocks.begin_patch(8, 121)


# --------------------------------------------------------------------------- processes


@pytest.mark.slow
def test_patch_calls_their_checks_and_a_restart(tmp_path):
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 1)
        opened = open_for_patch(cluster, "/f", data)
        assert opened["last_block"] is None and opened["status"]["length"] == SIZE
        blocks = opened["blocks"]
        assert [b["block"]["num_bytes"] for b in blocks] == [BLOCK, BLOCK, 16 * KiB]
        assert all(b["state"] == "COMPLETE" and len(b["locations"]) == 3 for b in blocks)
        # no block reopened: the stamps are the ones readers see
        after = located(cluster, "/f")
        assert after["under_construction"] and after["last_block_complete"]
        assert [ref(b) for b in after["blocks"]] == [ref(b) for b in blocks]
        ino = opened["status"]["ino"]

        # --- append(patch) refusals
        with cluster.client() as c:
            c.write_file("/small", b"tiny")
            c.mkdirs("/dir")
        with pytest.raises(InvalidArgument, match="inline: write it whole"):
            raw(cluster, "append", path="/small", client_name=WRITER, patch=True)
        assert not located(cluster, "/small")["under_construction"]
        with pytest.raises(AlreadyBeingCreated, match=WRITER):
            raw(cluster, "append", path="/f", client_name="other", patch=True)
        with pytest.raises(IsDirectory):
            raw(cluster, "append", path="/dir", client_name=WRITER, patch=True)

        # a file of the writer's with a block being written (taken before the stamps
        # below are counted: its block takes one)
        g = raw(cluster, "create", path="/g", client_name=WRITER, block_size=BLOCK)
        uc = raw(cluster, "add_block", path="/g", client_name=WRITER, ino=g["ino"])
        first = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                    block=ref(blocks[0]))
        g1 = first["block"]["gs"]
        assert g1 > blocks[0]["block"]["gs"] and first["block_size"] == BLOCK
        assert first["block"]["num_bytes"] == BLOCK
        assert sorted(n["node_id"] for n in first["locations"]) == sorted(node_ids(blocks[0]))
        # readers still see the committed stamp; fsck shows the patch under way beside it
        assert located(cluster, "/f")["blocks"][0]["block"]["gs"] == blocks[0]["block"]["gs"]
        checked = raw(cluster, "fsck", path="/f", openforwrite=True)["files"][0]["blocks"]
        assert (checked[0]["gs"], checked[0].get("patch_gs")) == (blocks[0]["block"]["gs"], g1)
        assert "patch_gs" not in checked[1]

        # --- patch_block refusals: none hands out a stamp
        with pytest.raises(LeaseExpired, match="No lease on /f"):
            raw(cluster, "patch_block", path="/f", client_name="other", ino=ino,
                block=ref(blocks[0]))
        with pytest.raises(StaleGenerationStamp,
                           match=f"stamp {blocks[0]['block']['gs']}, not {g1}"):
            raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                block={"id": blocks[0]["block"]["id"], "gs": g1})
        with pytest.raises(StaleGenerationStamp, match="not a block of /f"):
            raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                block={"id": 987654321, "gs": 1})
        with pytest.raises(StaleGenerationStamp, match="UNDER_CONSTRUCTION, not COMPLETE"):
            raw(cluster, "patch_block", path="/g", client_name=WRITER, ino=g["ino"],
                block=ref(uc))
        with pytest.raises(StaleGenerationStamp, match="not a block of /f"):
            raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino, block=ref(uc))
        # a second patch of the block supersedes the first: the next stamp, none used above
        second = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                     block=ref(blocks[0]))
        g2 = second["block"]["gs"]
        assert g2 == g1 + 1

        # --- patch_done refusals
        done = dict(path="/f", client_name=WRITER, ino=ino)
        with pytest.raises(StaleGenerationStamp, match=f"stamp {g1} is not the pending"):
            raw(cluster, "patch_done", **done, nodes=node_ids(blocks[0]),
                block={"id": blocks[0]["block"]["id"], "gs": g1, "num_bytes": BLOCK})
        with pytest.raises(LeaseExpired, match="No lease on /f"):
            raw(cluster, "patch_done", **{**done, "client_name": "other"},
                nodes=node_ids(blocks[0]),
                block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK})
        with pytest.raises(InvalidArgument, match="may not shrink"):
            raw(cluster, "patch_done", **done, nodes=node_ids(blocks[0]),
                block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK - 1})
        with pytest.raises(InvalidArgument, match="exceeds the file's block size"):
            raw(cluster, "patch_done", **done, nodes=node_ids(blocks[0]),
                block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK + 1})
        with pytest.raises(InvalidArgument, match="holds no replica"):
            raw(cluster, "patch_done", **done, nodes=["no-such-node"],
                block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK})
        with pytest.raises(InvalidArgument, match="non-empty list"):
            raw(cluster, "patch_done", **done, nodes=[],
                block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK})

        # --- the pending stamp survives a kill -9 of the metadata server
        restart_meta(cluster)
        with pytest.raises(StaleGenerationStamp, match=f"stamp {g1} is not the pending"):
            raw(cluster, "patch_done", **done, nodes=node_ids(blocks[0]),
                block={"id": blocks[0]["block"]["id"], "gs": g1, "num_bytes": BLOCK})
        nodes = poll_until(lambda: node_ids(located(cluster, "/f")["blocks"][0]) or None)
        assert raw(cluster, "patch_done", **done, nodes=nodes,
                   block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK})
        # a retry whose reply was lost: done already
        assert raw(cluster, "patch_done", **done, nodes=nodes,
                   block={"id": blocks[0]["block"]["id"], "gs": g2, "num_bytes": BLOCK})
        now = located(cluster, "/f")
        assert now["blocks"][0]["block"]["gs"] == g2 and now["length"] == SIZE

        # --- the last block grows: only it may; the file's length follows
        last = blocks[2]
        with pytest.raises(InvalidArgument, match="only a full block"):
            raw(cluster, "add_block", **done, previous={**ref(last), "num_bytes": 16 * KiB})
        mid = raw(cluster, "patch_block", **done, block=ref(blocks[1]))
        with pytest.raises(InvalidArgument, match="exceeds"):
            raw(cluster, "patch_done", **done, nodes=node_ids(blocks[1]),
                block={**ref(mid), "num_bytes": BLOCK + 10})
        grow = raw(cluster, "patch_block", **done, block=ref(last))
        mtime = raw(cluster, "get_file_info", path="/f")["mtime_ns"]
        assert raw(cluster, "patch_done", **done, nodes=node_ids(last),
                   block={**ref(grow), "num_bytes": BLOCK})
        info = raw(cluster, "get_file_info", path="/f")
        assert info["length"] == 3 * BLOCK and info["mtime_ns"] > mtime
        now = located(cluster, "/f")["blocks"]
        assert now[2]["block"] == {**ref(grow), "num_bytes": BLOCK}
        # full now: a block may follow it; a patch of it still pending is settled first
        # (no replica reported its stamp: dropped, as the middle block's), and its writer
        # gives the new block up unwritten
        grown, grow = grow, raw(cluster, "patch_block", **done, block=ref(grow))
        new = raw(cluster, "add_block", **done, previous={**ref(grown), "num_bytes": BLOCK})
        assert new["offset"] == 3 * BLOCK
        with pytest.raises(StaleGenerationStamp, match=f"stamp {grow['block']['gs']} is not"):
            raw(cluster, "patch_done", **done, nodes=node_ids(last),
                block={**ref(grow), "num_bytes": BLOCK})
        assert raw(cluster, "abandon_block", **done, block=new["block"])
        assert raw(cluster, "complete", **done,
                   last={**ref(grown), "num_bytes": BLOCK}) is True
        closed = located(cluster, "/f")
        assert not closed["under_construction"] and closed["length"] == 3 * BLOCK
        assert closed["blocks"][1]["block"]["gs"] == blocks[1]["block"]["gs"]
        # (the last block's replicas on disk never grew: the block servers report it at
        # its old stamp, so start-up safe mode stays on; reads are answered all the same)
        cluster.kill_meta()
        cluster.start_meta()
        again = located(cluster, "/f")
        assert [b["block"] for b in again["blocks"]] == [b["block"] for b in closed["blocks"]]


@pytest.mark.slow
def test_patch_done_invalidates_the_dropped_replica_and_replicates_the_new_version(tmp_path):
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 2)
        opened = open_for_patch(cluster, "/f", data)
        ino, block = opened["status"]["ino"], opened["blocks"][0]
        old = block["block"]["gs"]
        gs = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                 block=ref(block))["block"]["gs"]
        a, b, c = (storage_index(cluster, loc["address"]) for loc in block["locations"])
        for i in (a, b):
            patch_on_disk(cluster, i, block["block"]["id"], old, gs, "/f", 0)
        # reported at the pending stamp: still a location, not corrupt, nothing copied
        blk = poll_until(lambda: (lambda x: x if len(x["locations"]) == 3 else None)(
            located(cluster, "/f")["blocks"][0]))
        assert blk["block"]["gs"] == old
        with cluster.client() as cl:
            report = cl.report()
        assert report["corrupt"] == 0 and report["missing"] == 0
        nodes = [loc["node_id"] for loc in block["locations"]
                 if storage_index(cluster, loc["address"]) in (a, b)]
        assert raw(cluster, "patch_done", path="/f", client_name=WRITER, ino=ino,
                   nodes=nodes, block={"id": block["block"]["id"], "gs": gs,
                                       "num_bytes": BLOCK})
        # the third replica (old stamp) is stale: deleted, and a copy of the new version
        # takes its place
        settled(cluster, "/f", 0, gs)
        assert meta_stamps(cluster, c, block["block"]["id"]) == [gs]
        with cluster.client() as cl:
            assert cl.read_file("/f") == data
            assert cl.report()["corrupt"] == 0


@pytest.mark.slow
def test_lease_recovery_commits_a_patch_a_replica_reported(tmp_path):
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 3)
        opened = open_for_patch(cluster, "/f", data)
        ino, block = opened["status"]["ino"], opened["blocks"][1]
        old = block["block"]["gs"]
        gs = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                 block=ref(block))["block"]["gs"]
        a = storage_index(cluster, block["locations"][0]["address"])
        patch_on_disk(cluster, a, block["block"]["id"], old, gs, "/f", 1)
        # the writer is gone; another client recovers the lease
        assert raw(cluster, "recover_lease", path="/f", client_name="rescuer") is True
        closed = located(cluster, "/f")
        assert not closed["under_construction"] and closed["length"] == SIZE
        assert closed["blocks"][1]["block"]["gs"] == gs
        settled(cluster, "/f", 1, gs)
        with cluster.client() as cl:
            assert cl.read_file("/f") == data
        with pytest.raises(LeaseExpired):
            raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                block={"id": block["block"]["id"], "gs": gs})


@pytest.mark.slow
def test_lease_recovery_drops_a_patch_no_replica_reported(tmp_path):
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 4)
        opened = open_for_patch(cluster, "/f", data)
        ino, block = opened["status"]["ino"], opened["blocks"][2]
        old = block["block"]["gs"]
        gs = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                 block=ref(block))["block"]["gs"]
        assert raw(cluster, "recover_lease", path="/f", client_name="rescuer") is True
        closed = located(cluster, "/f")
        assert not closed["under_construction"]
        assert closed["blocks"][2]["block"]["gs"] == old
        # a block server applies the patch only now: its replica is stale, deleted, and
        # the old version copied back
        a = storage_index(cluster, block["locations"][0]["address"])
        patch_on_disk(cluster, a, block["block"]["id"], old, gs)
        settled(cluster, "/f", 2, old)
        with cluster.client() as cl:
            assert cl.read_file("/f") == data
        restart_meta(cluster)
        assert located(cluster, "/f")["blocks"][2]["block"]["gs"] == old


@pytest.mark.slow
def test_lease_recovery_waits_while_no_holder_of_a_patched_block_is_live(tmp_path):
    """Every holder of a block being patched went down before its report of the patch
    came, and the writer is gone: nothing says which version they hold, so lease recovery
    neither commits nor drops the patch (the lease is not released) until one is back.
    They come back holding the new version, and the patch commits with them; a drop would
    have made the block's one content stale, never handed to a reader."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 5)
        opened = open_for_patch(cluster, "/f", data)
        ino, block = opened["status"]["ino"], opened["blocks"][1]
        old, block_id = block["block"]["gs"], block["block"]["id"]
        gs = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                 block=ref(block))["block"]["gs"]
        for i in range(3):
            cluster.kill_storage(i)
        assert poll_until(lambda: not live_ids(cluster), 60)
        with pytest.raises(AlreadyBeingCreated, match="no block server"):
            raw(cluster, "recover_lease", path="/f", client_name="rescuer")
        assert located(cluster, "/f")["under_construction"]
        for i in range(3):   # each had applied the patch (see the module docstring)
            meta = next(p for p in cluster.storage_dir(i).rglob(f"blk_{block_id}_{old}.meta")
                        if "finalized" in str(p))
            meta.rename(meta.with_name(f"blk_{block_id}_{gs}.meta"))
            cluster.start_storage(i)
        cluster.wait_ready()

        def recovered():
            try:
                return raw(cluster, "recover_lease", path="/f", client_name="rescuer")
            except AlreadyBeingCreated:
                return False
        assert poll_until(recovered, 60)
        assert located(cluster, "/f")["blocks"][1]["block"]["gs"] == gs
        settled(cluster, "/f", 1, gs)
        with cluster.client() as cl:
            assert cl.read_file("/f") == data


@pytest.mark.slow
def test_patch_done_begins_the_next_patch_in_the_same_batch(tmp_path):
    """``patch_done`` with ``begin_next``: the patch commits and the block's next patch
    begins (a pending stamp above the committed one, journaled with it, as patch_block
    answers it); a retry whose reply was lost gets the same next stamp; the next patch
    commits with it; a stamp begun and never used is dropped by the close."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        data = payload(SIZE, 6)
        opened = open_for_patch(cluster, "/f", data)
        ino, block = opened["status"]["ino"], opened["blocks"][0]
        block_id, nodes = block["block"]["id"], node_ids(block)
        g1 = raw(cluster, "patch_block", path="/f", client_name=WRITER, ino=ino,
                 block=ref(block))["block"]["gs"]
        args = dict(path="/f", client_name=WRITER, ino=ino, nodes=nodes,
                    block={"id": block_id, "gs": g1, "num_bytes": BLOCK})
        with pytest.raises(InvalidArgument, match="begin_next must be true or false"):
            raw(cluster, "patch_done", **args, begin_next="yes")
        done = raw(cluster, "patch_done", **args, begin_next=True)
        nxt = done["next"]
        assert done["done"] is True and nxt["block"]["id"] == block_id
        g2 = nxt["block"]["gs"]
        assert g2 > g1 and nxt["block"]["num_bytes"] == BLOCK and nxt["block_size"] == BLOCK
        assert sorted(n["node_id"] for n in nxt["locations"]) == sorted(nodes)
        # committed for readers; the next patch pending beside it
        assert located(cluster, "/f")["blocks"][0]["block"]["gs"] == g1
        checked = raw(cluster, "fsck", path="/f", openforwrite=True)["files"][0]["blocks"]
        assert (checked[0]["gs"], checked[0].get("patch_gs")) == (g1, g2)
        # the retry of a call whose reply was lost: the same next stamp, nothing begun again
        again = raw(cluster, "patch_done", **args, begin_next=True)
        assert again["done"] is True and again["next"]["block"] == nxt["block"]
        assert raw(cluster, "patch_done", **args) is True
        # the next patch commits under the stamp begun for it
        raw(cluster, "patch_done", path="/f", client_name=WRITER, ino=ino, nodes=nodes,
            block={"id": block_id, "gs": g2, "num_bytes": BLOCK}, begin_next=True)
        assert located(cluster, "/f")["blocks"][0]["block"]["gs"] == g2
        # the stamp begun last is never used: the close drops it
        last = opened["blocks"][-1]["block"]
        assert raw(cluster, "complete", path="/f", client_name=WRITER, ino=ino,
                   last={"id": last["id"], "gs": last["gs"], "num_bytes": last["num_bytes"]})
        closed = located(cluster, "/f")
        assert not closed["under_construction"] and closed["blocks"][0]["block"]["gs"] == g2
        # no patch pending (fsck lists the file only for its replicas, which this test
        # never patched on disk: the whole flow is tests/test_patch_file.py's)
        listed = raw(cluster, "fsck", path="/f", openforwrite=True)["files"]
        assert all("patch_gs" not in b for f in listed for b in f["blocks"])


@pytest.mark.slow
def test_patch_done_takes_a_replacement_whose_stale_replica_it_replaced(tmp_path):
    """A block server that missed a patch still has its stale replica on record when the
    writer picks it as the replacement and has the new version copied there (the copy
    replaces the stale replica before the server reports it): patch_done names it and is
    accepted, as a replacement with no replica on record is; a node that is not live is
    refused."""
    with ProcessCluster(tmp_path, n_storage=3) as cluster:
        opened = open_for_patch(cluster, "/f", payload(SIZE, 7))
        ino, block = opened["status"]["ino"], opened["blocks"][0]
        block_id, nodes = block["block"]["id"], node_ids(block)
        args = dict(path="/f", client_name=WRITER, ino=ino)
        g1 = raw(cluster, "patch_block", **args, block=ref(block))["block"]["gs"]
        # the third node missed it: its replica stays on record at the old stamp
        raw(cluster, "patch_done", **args, nodes=nodes[:2],
            block={"id": block_id, "gs": g1, "num_bytes": BLOCK})
        g2 = raw(cluster, "patch_block", **args,
                 block={"id": block_id, "gs": g1})["block"]["gs"]
        with pytest.raises(InvalidArgument, match="holds no replica"):
            raw(cluster, "patch_done", **args, nodes=nodes[:2] + ["no-such-node"],
                block={"id": block_id, "gs": g2, "num_bytes": BLOCK})
        assert raw(cluster, "patch_done", **args, nodes=nodes,
                   block={"id": block_id, "gs": g2, "num_bytes": BLOCK}) is True
        assert located(cluster, "/f")["blocks"][0]["block"]["gs"] == g2
