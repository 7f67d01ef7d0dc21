"""Unit tests of the metadata server's pure parts: key schema, path locks, LeaseManager,
block state machine and blocks map, datanode manager, safe mode, invariants checker.
No sleeping: clocks are injected, trio tests use its autojump-free deterministic order."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fs import errors
from meta.blocks import blocks as bm
from meta.schema import keys
from meta.blocks.blocks import BlockInfo, BlocksMap, classify_replica, next_state
from meta.blocks.datanodes import DatanodeManager
from meta.namespace.invariants import check_namespace
from meta.journal.kv import MemoryStore
from meta.leases.leases import LeaseManager
from meta.namespace.locks import (LOCK_ANCESTOR, LOCK_PARENT, LOCK_READ, LOCK_WRITE, PathLockPool, RWLock,
                        lock_set, merge)
from meta.journal.ops import to_wire
from meta.blocks.reports import BlockReports, parse_entries
from meta.services.redundancy import Redundancy
from meta.blocks.safemode import SafeModeState


# --------------------------------------------------------------------------- keys


def test_keys_sort_numerically_and_names_in_byte_order():
    assert keys.inode_key(2) < keys.inode_key(256) < keys.inode_key(1 << 40)
    assert keys.block_key(5, 1) < keys.block_key(5, 2) < keys.block_key(5, 300) < keys.block_key(6, 0)
    assert keys.block_key(5, 9).startswith(keys.block_prefix(5))
    names = ["b", "a", "ä", "Z", "a b"]
    ordered = sorted(keys.dentry_key(7, n) for n in names)
    assert [keys.parse_dentry_key(k) for k in ordered] == [(7, n) for n in
                                                           sorted(names, key=str.encode)]
    assert keys.dentry_key(7, "a") < keys.after_name(7, "a") < keys.dentry_key(7, "a\x01")
    assert keys.parse_block_key(keys.block_key(9, 4)) == (9, 4)
    assert keys.unpack(keys.pack({"x": [1, b"y"]})) == {"x": [1, b"y"]}


# --------------------------------------------------------------------------- locks


def test_lock_sets_follow_the_fgl_modes():
    parts = ["a", "b", "c"]
    assert lock_set(parts, LOCK_READ) == {(): False, ("a",): False, ("a", "b"): False,
                                          ("a", "b", "c"): False}
    assert lock_set(parts, LOCK_WRITE) == {(): False, ("a",): False, ("a", "b"): False,
                                           ("a", "b", "c"): True}
    assert lock_set(parts, LOCK_PARENT) == {(): False, ("a",): False, ("a", "b"): True,
                                            ("a", "b", "c"): True}
    assert lock_set(parts, LOCK_ANCESTOR, existing=1) == {(): False, ("a",): True,
                                                          ("a", "b"): True, ("a", "b", "c"): True}
    assert lock_set(["x"], LOCK_PARENT) == {(): True, ("x",): True}
    assert merge(lock_set(["a", "x"], LOCK_PARENT), lock_set(["b"], LOCK_PARENT)) == {
        (): True, ("a",): True, ("a", "x"): True, ("b",): True}
    with pytest.raises(ValueError):
        lock_set(parts, LOCK_ANCESTOR)


async def test_rwlock_readers_share_writer_excludes_and_is_fair(autojump_clock):
    lock = RWLock()
    order = []

    async def reader(name, hold):
        await lock.acquire(False)
        order.append(f"+{name}")
        await trio.sleep(hold)
        order.append(f"-{name}")
        lock.release(False)

    async def writer(name, hold):
        await lock.acquire(True)
        order.append(f"+{name}")
        await trio.sleep(hold)
        order.append(f"-{name}")
        lock.release(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, "r1", 1)
        await trio.sleep(0.1)
        nursery.start_soon(reader, "r2", 1)       # shares with r1
        await trio.sleep(0.1)
        nursery.start_soon(writer, "w", 1)        # waits for both readers
        await trio.sleep(0.1)
        nursery.start_soon(reader, "r3", 1)       # queued behind the writer (fair)
    assert order[:2] == ["+r1", "+r2"]
    assert order.index("+w") > order.index("-r2")
    assert order.index("+r3") > order.index("-w")
    assert lock.idle


async def test_rwlock_cancelled_waiter_leaves_the_queue(autojump_clock):
    lock = RWLock()
    await lock.acquire(False)
    with trio.move_on_after(1):
        await lock.acquire(True)     # waits forever; cancelled
    # the cancelled writer must not block a later reader
    with trio.fail_after(1):
        await lock.acquire(False)
    lock.release(False)
    lock.release(False)
    assert lock.idle


async def test_path_lock_pool_serialises_conflicts_runs_disjoint_and_drops_locks(autojump_clock):
    pool = PathLockPool()
    log = []

    async def op(name, parts, mode, hold):
        async with pool.hold(lock_set(parts, mode)):
            log.append(("start", name, trio.current_time()))
            await trio.sleep(hold)
            log.append(("end", name, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(op, "create /a/x", ["a", "x"], LOCK_PARENT, 1)
        nursery.start_soon(op, "create /b/y", ["b", "y"], LOCK_PARENT, 1)   # disjoint
        await trio.sleep(0.1)
        nursery.start_soon(op, "chmod /a/z", ["a", "z"], LOCK_WRITE, 1)     # needs read /a
        nursery.start_soon(op, "stat /b/y", ["b", "y"], LOCK_READ, 1)       # conflicts
    starts = {name: t for kind, name, t in log if kind == "start"}
    assert starts["create /a/x"] == starts["create /b/y"] == 0
    assert starts["chmod /a/z"] == 1 and starts["stat /b/y"] == 1
    assert len(pool) == 0

    # rename-style multi-path sets in opposite argument order never deadlock
    async def rename(src, dst):
        wanted = merge(lock_set(src, LOCK_PARENT), lock_set(dst, LOCK_PARENT))
        async with pool.hold(wanted):
            await trio.sleep(0.5)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(rename, ["p", "q"], ["r", "s"])
                nursery.start_soon(rename, ["r", "s"], ["p", "q"])
    assert len(pool) == 0


# --------------------------------------------------------------------------- leases


def test_lease_manager_add_renew_remove_and_expiry():
    lm = LeaseManager(soft_limit=10, hard_limit=100)
    lm.add("alice", 5, now=0)
    lm.add("alice", 6, now=1)
    lm.add("bob", 7, now=2)
    assert lm.holder_of(6) == "alice" and lm.lease_of("alice").files == {5, 6}
    assert lm.lease_of("alice").last_update == 1      # adding renews
    assert [lease.holder for lease in lm.expired_soft(now=12)] == ["alice"]
    assert lm.renew("alice", now=12) and not lm.renew("nobody", now=12)
    assert [lease.holder for lease in lm.expired_soft(now=13)] == ["bob"]
    assert lm.expired_hard(now=50) == []
    assert [lease.holder for lease in lm.expired_hard(now=113)] == ["bob", "alice"]
    assert lm.remove_file(5) == "alice" and lm.lease_of("alice").files == {6}
    lm.remove_file(6)
    assert lm.lease_of("alice") is None and len(lm) == 1    # empty leases are dropped
    lm.reassign(7, "meta", now=200)
    assert lm.holder_of(7) == "meta" and lm.lease_of("bob") is None
    lm.rebuild({1: "x", 2: "x", 3: "y"}, now=300)
    assert lm.open_files() == 3 and lm.lease_of("x").files == {1, 2}
    assert lm.expired_soft(now=305) == []
    # a server that was slow to start serving renews them all from then
    assert [lease.holder for lease in lm.expired_soft(now=320)] == ["x", "y"]
    assert lm.renew_all(now=320) == 2
    assert lm.expired_soft(now=325) == [] and lm.lease_of("y").last_update == 320
    assert lm.open_files() == 3 and lm.holder_of(3) == "y"


def test_lease_rule_checks_use_hdfs_errors():
    check = LeaseManager.check_writer
    with pytest.raises(errors.FileNotFound):
        check("/f", False, None, "me")
    with pytest.raises(errors.LeaseExpired, match="not open for writing"):
        check("/f", True, None, "me")
    with pytest.raises(errors.LeaseExpired, match="not the lease owner"):
        check("/f", True, "other", "me")
    check("/f", True, "me", "me")
    lm = LeaseManager(soft_limit=10, hard_limit=100)
    lm.add("owner", 1, now=0)
    with pytest.raises(errors.AlreadyBeingCreated, match="currently owned by owner"):
        lm.create_decision("/f", "owner", "me", now=5)
    with pytest.raises(errors.AlreadyBeingCreated, match="already the current lease holder"):
        lm.create_decision("/f", "owner", "owner", now=50)
    assert lm.create_decision("/f", "owner", "me", now=11) == "release"
    assert lm.create_decision("/f", "vanished-holder", "me", now=0) == "release"


# --------------------------------------------------------------------------- blocks


def test_block_transition_table():
    assert next_state(bm.UNDER_CONSTRUCTION, bm.COMMIT) == bm.COMMITTED
    assert next_state(bm.COMMITTED, bm.MIN_REPLICATED) == bm.COMPLETE
    assert next_state(bm.UNDER_CONSTRUCTION, bm.START_RECOVERY) == bm.UNDER_RECOVERY
    assert next_state(bm.UNDER_RECOVERY, bm.RECOVERED) == bm.COMMITTED
    with pytest.raises(errors.InvalidArgument,
                       match="cannot end the recovery of a block that is COMPLETE"):
        next_state(bm.COMPLETE, bm.RECOVERED)
    with pytest.raises(errors.InvalidArgument, match="cannot commit a block that is UNDER_RECOVERY"):
        next_state(bm.UNDER_RECOVERY, bm.COMMIT)
    with pytest.raises(errors.InvalidArgument):
        next_state(bm.UNDER_CONSTRUCTION, bm.MIN_REPLICATED)


def test_block_state_is_the_stored_string():
    """The enum is the journal's and the store's word: members pack as the same bytes."""
    for state in bm.BlockState:
        assert keys.pack({"state": state}) == keys.pack({"state": state.value})
        assert f"{state}" == state.value
    assert BlockInfo(1, 1, 0, 1, 0, "COMPLETE", 1).state is bm.COMPLETE
    with pytest.raises(errors.InvalidArgument, match="block 9: unknown block state 'DONE'"):
        BlockInfo(9, 1, 0, 1, 0, "DONE", 1)


def test_journaled_block_changes_go_through_the_table():
    """close, truncate, recovery's end and a pipeline update move a block only along the
    table: an illegal move raises and leaves the block as it was."""
    m = BlocksMap(min_replication=1)
    m.add(BlockInfo(1, ino=10, index=0, gs=5, num_bytes=0, state=bm.UNDER_CONSTRUCTION,
                    replication=1))
    m.pipeline_updated(1, 6, 10)
    assert (m.get(1).state, m.get(1).gs, m.get(1).num_bytes) == (bm.UNDER_CONSTRUCTION, 6, 10)
    m.close(1, 12)
    assert (m.get(1).state, m.get(1).num_bytes) == (bm.COMPLETE, 12)
    with pytest.raises(errors.InvalidArgument, match="block 1: cannot update the pipeline of a block "
                                                     "that is COMPLETE"):
        m.pipeline_updated(1, 7, 20)
    with pytest.raises(errors.InvalidArgument, match="block 1: cannot end the recovery of a block"):
        m.recovered(1, gs=8, num_bytes=4, close=False, finalized_on=[])
    assert (m.get(1).state, m.get(1).gs, m.get(1).num_bytes) == (bm.COMPLETE, 6, 12)
    m.truncate(1)   # reopened; it keeps its length until the recovery commits the cut
    assert (m.get(1).state, m.get(1).num_bytes) == (bm.UNDER_CONSTRUCTION, 12)
    with pytest.raises(errors.InvalidArgument, match="cannot truncate a block that is "
                                                     "UNDER_CONSTRUCTION"):
        m.truncate(1)
    m.start_recovery(1)
    m.recovered(1, gs=8, num_bytes=4, close=True, finalized_on=["n1"])
    assert (m.get(1).state, m.get(1).gs) == (bm.COMPLETE, 8)   # FINALIZED on n1: complete
    m.add(BlockInfo(2, ino=11, index=0, gs=5, num_bytes=0, state=bm.UNDER_CONSTRUCTION,
                    replication=1))
    m.start_recovery(2)
    m.recovered(2, gs=9, num_bytes=3, close=False, finalized_on=[])
    assert m.get(2).state == bm.COMMITTED
    m.start_recovery(2)
    with pytest.raises(errors.InvalidArgument, match="cannot close a block that is "
                                                     "UNDER_RECOVERY"):
        m.close(2, 3)


def test_replica_classification():
    assert classify_replica(bm.COMPLETE, 5, 100, 5, 100, bm.FINALIZED)[0] == bm.GOOD
    assert classify_replica(bm.COMPLETE, 5, 100, 5, 99, bm.FINALIZED)[0] == bm.CORRUPT
    assert classify_replica(bm.COMPLETE, 5, 100, 6, 100, bm.FINALIZED)[0] == bm.CORRUPT
    assert classify_replica(bm.COMPLETE, 5, 100, 4, 100, bm.RBW)[0] == bm.CORRUPT
    assert classify_replica(bm.COMMITTED, 5, 100, 5, 50, bm.RBW)[0] == bm.PENDING
    assert classify_replica(bm.UNDER_CONSTRUCTION, 5, 0, 4, 10, bm.RBW)[0] == bm.CORRUPT
    assert classify_replica(bm.UNDER_CONSTRUCTION, 5, 0, 5, 10, bm.RBW)[0] == bm.PENDING
    assert classify_replica(bm.UNDER_CONSTRUCTION, 5, 0, 5, 10, bm.FINALIZED)[0] == bm.GOOD


async def test_blocks_map_commit_complete_reports_and_safe_counters():
    m = BlocksMap(min_replication=2)
    nodes = DatanodeManager(dead_interval=10, invalidate_limit=10, clock=lambda: 0.0)
    nodes.register("n1", "h1:1", 100, 0, 100)
    safe_updates = []
    reports = BlockReports(m, nodes, lambda: safe_updates.append(m.safe), step=2)
    m.add(BlockInfo(1, ino=10, index=0, gs=100, num_bytes=64, state=bm.COMPLETE, replication=3))
    m.add(BlockInfo(2, ino=10, index=1, gs=101, num_bytes=0, state=bm.UNDER_CONSTRUCTION,
                    replication=3))
    assert (m.total_countable, m.safe) == (1, 0)      # UC blocks do not count for safe mode
    # a full report (the path the metadata server runs): one good, one stale, one of no file
    entries = parse_entries([[1, 100, 64, "FINALIZED"], [2, 99, 5, "RBW"],
                             [77, 1, 1, "FINALIZED"]], "report")
    report = await reports.full_report("n1", entries)
    assert (report.doomed, report.corrupt, report.removed) == (1, 1, 0)
    assert report.seen == {1: 100, 2: 99, 77: 1} and safe_updates   # counted step by step
    assert nodes.take_invalidate("n1") == [{"id": 77, "gs": 1, "num_bytes": 1}]
    assert m.get(2).corrupt_nodes() == ["n1"]
    m.add_replica("n2", 1, 100, 64, "FINALIZED")
    assert (m.safe, m.counts()["under_replicated"]) == (1, 1)
    # commit with replicas already finalized: COMPLETE at once when enough are good
    m.add_replica("n2", 2, 101, 30, "FINALIZED")
    m.add_replica("n3", 2, 101, 30, "FINALIZED")
    assert m.would_complete(2, 30) and not m.would_complete(2, 31)
    assert m.commit(2, 30) == bm.COMPLETE
    assert m.total_countable == 2 and m.safe == 2
    # a second full report from n1 without block 1: its replica goes
    assert (await reports.full_report("n1", [])).removed == 2
    assert "n1" not in m.get(1).replicas and m.node_block_count("n1") == 0
    # a reader's checksum error hides the replica; with enough good copies it may be deleted
    m.add_replica("n1", 1, 100, 64, "FINALIZED")
    m.add_replica("n3", 1, 100, 64, "FINALIZED")
    assert m.mark_bad("n1", 1) and m.get(1).good_nodes() == ["n2", "n3"]
    assert m.excess_corrupt(1) == []                  # 2 good < replication 3
    m.set_replication(1, 2)
    assert m.excess_corrupt(1) == [("n1", {"id": 1, "gs": 100, "num_bytes": 64})]
    # a dead node takes its replicas with it
    assert m.remove_node("n2") == [1, 2]
    assert m.get(1).good_nodes() == ["n3"] and m.safe == 0
    assert sorted(n for n, _ in m.remove(2)) == ["n3"]    # n1's stale copy left earlier
    assert m.get(2) is None and m.total_countable == 1
    with pytest.raises(errors.InvalidArgument):
        m.add(BlockInfo(1, 10, 0, 1, 1, bm.COMPLETE, 1))


async def test_block_reports_incremental_and_abandoned_chunked_report():
    m = BlocksMap(min_replication=1)
    nodes = DatanodeManager(dead_interval=10, invalidate_limit=10, clock=lambda: 0.0)
    nodes.register("n1", "h1:1", 100, 0, 100)
    reports = BlockReports(m, nodes, lambda: None)
    m.add(BlockInfo(1, ino=10, index=0, gs=5, num_bytes=8, state=bm.COMPLETE, replication=2))
    m.add(BlockInfo(2, ino=10, index=1, gs=5, num_bytes=8, state=bm.COMPLETE, replication=2))
    # received: a known block joins, one of no file is invalidated; deleted: it leaves
    reports.incremental("n1", [(1, 5, 8, "FINALIZED"), (2, 5, 8, "FINALIZED"),
                               (9, 1, 1, "FINALIZED")], [])
    assert m.get(1).good_nodes() == ["n1"] and m.get(2).good_nodes() == ["n1"]
    assert nodes.take_invalidate("n1") == [{"id": 9, "gs": 1, "num_bytes": 1}]
    reports.incremental("n1", [], [2])
    assert m.get(2).good_nodes() == [] and m.node_block_count("n1") == 1

    # chunk 0 of a report that lists nothing, then the node registers again: the
    # unfinished report is abandoned and removes nothing, its next chunk is refused
    await reports.full_report("n1", [], report_id="r1", chunk=0, last=False)
    assert reports.abandon("n1") and not reports.abandon("n1")
    with pytest.raises(errors.InvalidArgument, match="unknown"):
        await reports.full_report("n1", [], report_id="r1", chunk=1, last=True)
    assert m.get(1).good_nodes() == ["n1"]
    # out of order: refused and abandoned
    await reports.full_report("n1", [(1, 5, 8, "FINALIZED")], report_id="r2", chunk=0,
                              last=False)
    with pytest.raises(errors.InvalidArgument, match="expected chunk 1"):
        await reports.full_report("n1", [], report_id="r2", chunk=2, last=True)
    done = await reports.full_report("n1", [], report_id="r3", chunk=0, last=True)
    assert done.removed == 1 and m.get(1).good_nodes() == []
    nodes.nodes["n1"].alive = False
    with pytest.raises(errors.InvalidArgument, match="not registered"):
        await reports.full_report("n1", [])


def test_redundancy_hands_a_transfer_once_and_a_dead_source_drops_it():
    """``Redundancy`` on its own (blocks map, block servers, safe mode, clock): a block one
    replica short gets one TRANSFER from its holder, handed to one heartbeat only; the
    source's death drops its untaken command and its pending copy, and the block is checked
    again."""
    now = 0.0
    blocks = BlocksMap(min_replication=1)
    nodes = DatanodeManager(dead_interval=10, invalidate_limit=10, clock=lambda: now)
    for name in ("n1", "n2"):
        nodes.register(name, f"{name}:1", 1 << 30, 0, 1 << 30)
    safemode = SafeModeState(extension=0)
    safemode.update(now, 0, 0, 2)
    redundancy = Redundancy(blocks=blocks, datanodes=nodes, safemode=safemode,
                            pending_timeout=60.0, max_streams=2, clock=lambda: now)
    blocks.add(BlockInfo(1, ino=10, index=0, gs=5, num_bytes=8, state=bm.COMPLETE,
                         replication=2))
    blocks.add_replica("n1", 1, 5, 8, "FINALIZED")
    trio.run(redundancy.replication_pass)
    assert redundancy.replication_stats()["pending"] == 1
    redundancy.forget_node("n1")
    assert redundancy.take_transfer_commands("n1") == []
    assert redundancy.replication_stats()["pending"] == 0 and blocks.dirty == {1}
    trio.run(redundancy.replication_pass)
    [command] = redundancy.take_transfer_commands("n1")
    assert (command["type"], command["block"]["id"], command["targets"]) == \
        ("TRANSFER", 1, ["n2:1"])
    assert redundancy.take_transfer_commands("n1") == []
    trio.run(redundancy.replication_pass)   # the copy is pending: not scheduled twice
    assert redundancy.take_transfer_commands("n1") == []


def test_committed_block_completes_when_replicas_arrive():
    m = BlocksMap(min_replication=1)
    m.add(BlockInfo(5, 1, 0, gs=7, num_bytes=0, state=bm.UNDER_CONSTRUCTION, replication=1))
    assert m.commit(5, 100) == bm.COMMITTED
    m.add_replica("n", 5, 7, 99, "FINALIZED")         # wrong length: corrupt, no completion
    assert m.get(5).state == bm.COMMITTED and m.get(5).corrupt_nodes() == ["n"]
    m.add_replica("n", 5, 7, 100, "FINALIZED")        # the right replica replaces it
    assert m.get(5).state == bm.COMPLETE and m.safe == 1


# --------------------------------------------------------------------------- datanodes


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_datanodes_register_heartbeat_dead_and_reregister():
    clock = FakeClock()
    dm = DatanodeManager(dead_interval=10, invalidate_limit=2, clock=clock)
    node, fresh, displaced = dm.register("a", "h1:1", 100, 10, 90)
    assert fresh and displaced == []
    dm.register("b", "h2:1", 100, 10, 90)
    clock.now = 8
    assert dm.heartbeat("a", 100, 20, 80) is not None
    clock.now = 15
    assert [n.node_id for n in dm.check_dead()] == ["b"]
    assert dm.heartbeat("b", 100, 20, 80) is None        # must register again
    assert dm.heartbeat("zzz", 1, 1, 1) is None
    _, fresh, _ = dm.register("b", "h2:1", 100, 20, 80)
    assert fresh and dm.live("b") is not None
    # a new id on a live node's address replaces it
    _, _, displaced = dm.register("c", "h2:1", 100, 0, 100)
    assert [n.node_id for n in displaced] == ["b"] and dm.live("b") is None


def test_decommission_start_and_stop_change_only_what_they_name():
    """dfsadmin's decommission: start moves only an in-service node, stop only one that is
    not; every block with a replica on the node is checked again (``mark_node_dirty``)."""
    dm = DatanodeManager(dead_interval=10, invalidate_limit=2, clock=FakeClock())
    node, _, _ = dm.register("a", "h1:1", 100, 10, 90)
    assert dm.start_decommission(node) and node.admin == "DECOMMISSION_IN_PROGRESS"
    assert not dm.start_decommission(node) and node.admin == "DECOMMISSION_IN_PROGRESS"
    dm.finish_decommission(node)           # the replication monitor's end of decommission
    assert node.admin == "DECOMMISSIONED"
    with pytest.raises(errors.InternalError, match="block server a: no REPLICATED from admin state "
                                            "DECOMMISSIONED"):
        dm.finish_decommission(node)
    assert not dm.start_decommission(node) and node.admin == "DECOMMISSIONED"
    assert dm.stop_decommission(node) and node.admin == "NORMAL"
    assert not dm.stop_decommission(node) and node.admin == "NORMAL"
    blocks = BlocksMap()
    for block_id in (1, 2, 3):
        blocks.add(BlockInfo(block_id, 10, block_id - 1, 1, 5, bm.COMPLETE, 2))
    blocks.add_replica("a", 1, 1, 5, "FINALIZED")
    blocks.add_replica("a", 3, 1, 5, "FINALIZED")
    blocks.add_replica("b", 2, 1, 5, "FINALIZED")
    blocks.take_dirty(100)
    blocks.mark_node_dirty("a")
    assert sorted(blocks.take_dirty(100)) == [1, 3]
    blocks.mark_node_dirty("nobody")
    assert blocks.take_dirty(100) == []


def test_admin_states_move_only_through_their_table():
    """Every (state, event) pair the table lacks is refused and leaves the state; the four
    moves it has are dfsadmin's start and stop and the monitor's end of a decommission."""
    from meta.blocks.datanodes import (ADMIN_TRANSITIONS, AdminEvent, AdminState, NodeInfo,
                                       next_admin_state)
    assert len(ADMIN_TRANSITIONS) == 4
    for state in AdminState:
        for event in AdminEvent:
            node = NodeInfo("n", "h:1", admin=state)
            if (state, event) in ADMIN_TRANSITIONS:
                node.move_admin(event)
                assert node.admin is ADMIN_TRANSITIONS[state, event]
            else:
                with pytest.raises(errors.InternalError, match=f"no {event.value} from"):
                    node.move_admin(event)
                assert node.admin is state
    assert next_admin_state(AdminState.DECOMMISSIONED, AdminEvent.RECOMMISSION,
                            node_id="n") is AdminState.NORMAL


def test_reader_order_puts_the_local_node_first_shuffles_equals_and_retiring_stale_last():
    """HDFS ``sortLocatedBlock``: in service and fresh first, the reader's host first among
    those, equals in a new random order at each call; decommissioning, decommissioned and
    silent nodes last, in that order."""
    clock = FakeClock()
    dm = DatanodeManager(dead_interval=100, invalidate_limit=2, clock=clock, stale_interval=5)
    for name, host in (("local", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"),
                       ("d", "10.0.0.4"), ("quiet", "10.0.0.5"), ("leaving", "10.0.0.6"),
                       ("gone", "10.0.0.7")):
        dm.register(name, f"{host}:9866", 100, 0, 100)
    clock.now = 6
    for name in ("local", "b", "c", "d", "leaving", "gone"):
        dm.heartbeat(name, 100, 0, 100)            # "quiet" stays silent: stale
    for name in ("leaving", "gone"):
        dm.start_decommission(dm.nodes[name])
    dm.finish_decommission(dm.nodes["gone"])
    ids = ["gone", "leaving", "quiet", "d", "c", "b", "local"]
    seen_first = set()
    for _ in range(200):
        order = dm.sort_for_reader(ids, "10.0.0.1")
        assert order[0] == "local" and order[4:] == ["quiet", "leaving", "gone"], order
        assert sorted(order[1:4]) == ["b", "c", "d"]
        seen_first.add(dm.sort_for_reader(["b", "c", "d"], None)[0])
    assert seen_first == {"b", "c", "d"}             # no host of its own: any may come first
    assert dm.sort_for_reader(["nobody", "b"], None) == ["b", "nobody"]   # unknown: last


def test_invalidate_sets_are_handed_out_in_limited_batches():
    dm = DatanodeManager(dead_interval=10, invalidate_limit=2, clock=FakeClock())
    dm.register("a", "h:1", 1, 0, 1)
    for i in range(5):
        dm.add_invalidate("a", {"id": i, "gs": 1, "num_bytes": 0})
    dm.add_invalidate("ghost", {"id": 9, "gs": 1, "num_bytes": 0})   # unknown node: ignored
    assert dm.pending_deletion() == 5
    batches = [dm.take_invalidate("a") for _ in range(4)]
    assert [[r["id"] for r in b] for b in batches] == [[0, 1], [2, 3], [4], []]
    dm.add_invalidate("a", {"id": 7, "gs": 1, "num_bytes": 0})
    dm.cancel_invalidate("a", 7)
    assert dm.take_invalidate("a") == []


def test_invalidations_wait_until_the_namespace_that_decided_them_is_durable():
    """A deletion decided on namespace changes answered before their fsync goes to the block
    server only once the journal says they are durable (a machine crash must not bring back
    a file whose replicas were deleted)."""
    applied = [10]
    dm = DatanodeManager(dead_interval=10, invalidate_limit=10, clock=FakeClock(),
                         applied_txid=lambda: applied[0])
    dm.register("a", "h:1", 1, 0, 1)
    dm.add_invalidate("a", {"id": 1, "gs": 1, "num_bytes": 0})    # decided at txid 10
    applied[0] = 12
    dm.add_invalidate("a", {"id": 2, "gs": 1, "num_bytes": 0})    # decided at txid 12
    dm.add_invalidate("a", {"id": 1, "gs": 1, "num_bytes": 0})    # decided again at 12
    dm.add_invalidate("a", {"id": 3, "gs": 1, "num_bytes": 0})
    assert dm.take_invalidate("a", durable_txid=9) == []
    assert dm.take_invalidate("a", durable_txid=11) == []   # 1 was decided again at 12
    assert [r["id"] for r in dm.take_invalidate("a", durable_txid=12)] == [2, 1, 3]
    assert dm.pending_deletion() == 3   # handed out, waiting for the deletion report


def test_handed_out_invalidations_wait_for_the_deletion_report_and_are_resent():
    """Finding 15: a heartbeat reply carrying INVALIDATE may be lost; the refs stay pending
    and go out again after the timeout until the node reports the replicas deleted."""
    clock = FakeClock()
    dm = DatanodeManager(dead_interval=100, invalidate_limit=2, clock=clock,
                         invalidate_timeout=5, invalidate_max_sends=3)
    dm.register("a", "h:1", 1, 0, 1)
    for i in range(3):
        dm.add_invalidate("a", {"id": i, "gs": 10, "num_bytes": 0})

    def ids():
        return [r["id"] for r in dm.take_invalidate("a")]
    assert ids() == [0, 1] and ids() == [2] and ids() == []   # the replies are "lost"
    assert dm.pending_deletion() == 3
    clock.now = 4.9
    assert ids() == []                       # not due yet
    clock.now = 5
    assert ids() == [0, 1]                   # resent, still at most the limit per reply
    assert ids() == [2]
    dm.cancel_invalidate("a", 0)             # the node reported blk 0 deleted
    assert dm.pending_deletion() == 2
    clock.now = 10
    # a full report: blk 1 is gone, blk 2 still there with the same stamp
    assert dm.confirm_by_report("a", {2: 10, 77: 1}) == 1
    assert ids() == [2]                      # its third send
    clock.now = 15
    assert ids() == [] and dm.pending_deletion() == 0   # given up after 3 sends
    # a new decision about a handed-out block puts it first in line again
    dm.add_invalidate("a", {"id": 5, "gs": 10, "num_bytes": 0})
    assert ids() == [5]
    dm.add_invalidate("a", {"id": 5, "gs": 10, "num_bytes": 0})
    assert ids() == [5]
    # a replica reported with a newer stamp than the ref was not ours to delete
    assert dm.confirm_by_report("a", {5: 11}) == 1 and dm.pending_deletion() == 0
    # a dead node forgets everything; it re-reports when it returns
    dm.add_invalidate("a", {"id": 6, "gs": 10, "num_bytes": 0})
    assert ids() == [6]
    clock.now = 200
    assert [n.node_id for n in dm.check_dead()] == ["a"] and dm.pending_deletion() == 0


def test_placement_distinct_live_least_used_and_excluded():
    clock = FakeClock()
    dm = DatanodeManager(dead_interval=10, invalidate_limit=2, clock=clock)
    dm.register("a", "h1:1", 1000, 500, 500)
    dm.register("b", "h2:1", 1000, 100, 900)
    dm.register("c", "h3:1", 1000, 300, 700)
    dm.register("d", "h4:1", 1000, 0, 1000)
    clock.now = 5
    for node_id in "abc":
        dm.heartbeat(node_id, 1000, dm.nodes[node_id].used, dm.nodes[node_id].remaining)
    clock.now = 12
    dm.check_dead()                                   # d never beat again: dead
    chosen = dm.choose_targets(2, block_size=0)
    assert [n.node_id for n in chosen] == ["b", "c"]
    assert [n.node_id for n in dm.choose_targets(5, block_size=0)] and \
        len(dm.choose_targets(5, block_size=0)) == 3
    assert [n.node_id for n in dm.choose_targets(3, excluded=["b", "h3:1"])] == ["a"]
    assert [n.node_id for n in dm.choose_targets(1, writer_host="h1")] == ["a"]
    with pytest.raises(errors.NoSpace, match="0 block server"):
        dm.choose_targets(1, excluded=["a", "b", "c"], what="add_block /f")
    # scheduled bytes spread concurrent writers before the next heartbeat
    picks = [dm.choose_targets(1, block_size=450)[0].node_id for _ in range(3)]  # b, c, a: no ties
    assert len(set(picks)) == 3


def test_replicas_of_a_block_being_written_are_locations_without_a_pipeline():
    """Finding 5: after a restart ``expected`` is empty; replicas reported with the block's
    current stamp (RBW, RWR, FINALIZED) become its locations, stale or bad ones never."""
    bmap = BlocksMap(min_replication=1)
    bmap.add(BlockInfo(7, ino=2, index=1, gs=100, num_bytes=0,
                       state=bm.UNDER_CONSTRUCTION, replication=3))
    info = bmap.get(7)
    assert info.location_nodes() == []
    bmap.add_replica("a", 7, 100, 4096, bm.RBW)
    bmap.add_replica("b", 7, 99, 8192, bm.RBW)        # an older pipeline's: corrupt
    bmap.add_replica("c", 7, 100, 2048, bm.RWR)
    bmap.add_replica("d", 7, 100, 0, "TEMPORARY")     # an incoming copy: not readable yet
    assert info.location_nodes() == ["a", "c"] and info.expected == ["a", "c"]
    assert info.corrupt_nodes() == ["b"] and info.good_count == 0   # RBW is no good copy
    bmap.mark_bad("c", 7)                             # a reader refused its bytes
    assert info.location_nodes() == ["a"]
    bmap.add_replica("e", 7, 100, 4096, bm.FINALIZED)
    assert info.location_nodes() == ["a", "e"]
    # a pipeline chosen by ADD_BLOCK keeps its order; reported replicas join after it
    bmap.add(BlockInfo(8, ino=2, index=2, gs=101, num_bytes=0, state=bm.UNDER_CONSTRUCTION,
                       replication=2, expected=["x", "y"]))
    bmap.add_replica("z", 8, 101, 10, bm.RBW)
    bmap.add_replica("y", 8, 101, 10, bm.RBW)
    assert bmap.get(8).location_nodes() == ["x", "y", "z"]
    # under recovery too; once committed only good FINALIZED replicas count
    bmap.start_recovery(8)
    assert bmap.get(8).location_nodes() == ["x", "y", "z"]
    bmap.commit(7, 4096)
    assert info.state == bm.COMPLETE and info.location_nodes() == ["e"]


# --------------------------------------------------------------------------- safe mode


def test_safe_mode_threshold_extension_and_manual():
    sm = SafeModeState(threshold=0.999, extension=30, min_storage=1)
    assert sm.on
    with pytest.raises(errors.SafeMode, match="mkdirs /x"):
        sm.check("mkdirs /x")
    assert not sm.update(now=0, safe=997, total=1000, live=1)
    assert "needs additional 2 blocks" in sm.reason
    assert not sm.update(now=1, safe=1000, total=1000, live=0)      # no live storage yet
    assert "live block servers" in sm.reason
    assert not sm.update(now=2, safe=1000, total=1000, live=1)      # extension starts
    assert "in 30 seconds" in sm.reason
    assert not sm.update(now=20, safe=1000, total=1000, live=1)
    assert sm.update(now=32, safe=1000, total=1000, live=1)
    assert not sm.on
    sm.check("mkdirs /x")
    sm.enter()
    assert sm.on and sm.manual and not sm.update(now=100, safe=1, total=1, live=3)
    assert sm.status()["manual"]
    sm.leave()
    assert sm.status() == {"on": False, "manual": False, "reason": "Safe mode is OFF."}
    empty = SafeModeState(threshold=0.999, extension=30)
    assert empty.update(now=0, safe=0, total=0, live=0) and not empty.on   # no blocks: at once


# --------------------------------------------------------------------------- invariants


def test_check_namespace_finds_broken_stores():
    from meta.journal.files import Record
    from meta.namespace.namespace import Namespace

    store = MemoryStore()
    ns = Namespace(store)
    records = [ns.planner.plan_format(1, 10).to_wire()]
    ns.apply([Record(1, *records[0])])
    ns.apply([Record(2, *to_wire(ns.planner.plan_mkdirs("/a/b", now_ns=20)))])
    ns.apply([Record(3, *to_wire(ns.planner.plan_create("/a/f", holder="w", now_ns=30)))])
    assert check_namespace(store) == []
    leases = LeaseManager()
    assert check_namespace(store, leases) != []                # the open file has no lease
    leases.rebuild(ns.view.under_construction(), now=0)
    assert check_namespace(store, leases) == []

    b_ino = ns.view.get_file_info("/a/b")["ino"]
    broken = MemoryStore()
    broken.write(puts=list(store.scan(b"")))
    broken.write(deletes=[keys.dentry_key(ns.view.get_file_info("/a")["ino"], "b")])
    problems = check_namespace(broken)
    assert any("has 0 entries" in p for p in problems)
    assert any("not reachable" in p and str(b_ino) in p for p in problems)
    assert any("children" in p for p in problems)

    broken = MemoryStore()
    broken.write(puts=list(store.scan(b"")))
    broken.write(puts=[(keys.dentry_key(b_ino, "loop"), keys.pack(ns.view.get_file_info("/a")["ino"])),
                       (keys.block_key(b_ino, 0), keys.pack({"id": 1, "gs": 1, "num_bytes": 0,
                                                             "state": "COMPLETE"})),
                       (keys.meta_key(keys.FILES), keys.pack(7))])
    problems = check_namespace(broken)
    assert any("2 entries" in p for p in problems)
    assert any("not a file" in p for p in problems)
    assert any("files counter" in p for p in problems)


def test_check_namespace_accepts_orphan_subtrees_and_flags_linked_orphan_roots():
    from meta.journal.files import Record
    from meta.namespace.namespace import Defaults, Namespace

    store = MemoryStore()
    ns = Namespace(store, Defaults(delete_chunk=2, min_block_size=4096, block_size=4096))
    txid = 0

    def apply(plan):
        nonlocal txid
        txid += 1
        ns.apply([Record(txid, *to_wire(plan))])

    apply(ns.planner.plan_format(1, 10))
    apply(ns.planner.plan_mkdirs("/t/d", now_ns=20))
    apply(ns.planner.plan_create("/t/d/f", holder="w", now_ns=30))
    apply(ns.planner.plan_delete("/t", True, now_ns=40))     # 3 inodes > 2: detached
    (root,) = ns.reclaim.orphan_roots()
    assert check_namespace(store) == []
    apply(ns.reclaim.plan_reclaim())                         # half reclaimed: still fine
    assert ns.reclaim.has_orphans() and check_namespace(store) == []

    linked = MemoryStore()                           # the orphan root linked again
    linked.write(puts=list(store.scan(b"")) + [(keys.dentry_key(keys.ROOT_INO, "t"),
                                                keys.pack(root))])
    assert any("orphan root inode" in p and "directory entry" in p
               for p in check_namespace(linked))
    ghost = MemoryStore()                            # an O key without its inode
    ghost.write(puts=list(store.scan(b"")) + [(keys.orphan_key(999), keys.pack({}))])
    assert any("orphan key for inode 999" in p for p in check_namespace(ghost))
    apply(ns.reclaim.plan_reclaim())
    assert ns.reclaim.plan_reclaim() is None and check_namespace(store) == []
    assert ns.view.file_count() == 0 and ns.view.dir_count() == 1


def test_blocks_map_running_counters_match_a_full_recount():
    """Finding 11: counts() is O(1); its running counters stay equal to a walk over every
    block through every kind of change."""
    import random

    rng = random.Random(7)
    m = BlocksMap(min_replication=1)
    nodes = ["n1", "n2", "n3"]
    next_id = 1
    for step in range(3000):
        ids = list(m.blocks)
        op = rng.randrange(10)
        if op == 0 or not ids:
            state = rng.choice([bm.UNDER_CONSTRUCTION, bm.COMMITTED, bm.COMPLETE])
            length = 0 if state == bm.UNDER_CONSTRUCTION else 10
            m.add(BlockInfo(next_id, 1, next_id, gs=5, num_bytes=length, state=state,
                            replication=rng.randint(1, 3)))
            next_id += 1
        elif op in (1, 2, 3):
            m.add_replica(rng.choice(nodes), rng.choice(ids), rng.choice([4, 5, 5]),
                          rng.choice([10, 10, 9]), rng.choice([bm.FINALIZED, bm.RBW]))
        elif op == 4:
            m.remove_replica(rng.choice(nodes), rng.choice(ids))
        elif op == 5:
            m.mark_bad(rng.choice(nodes), rng.choice(ids))
        elif op == 6:
            m.set_replication(rng.choice(ids), rng.randint(1, 3))
        elif op == 7:
            block_id = rng.choice(ids)
            if m.get(block_id).state == bm.UNDER_CONSTRUCTION:
                m.commit(block_id, 10)
            else:
                m.start_recovery(block_id)   # a new stamp: only through a recovery
                m.recovered(block_id, gs=rng.choice([5, 6]), num_bytes=10, close=True,
                            finalized_on=[])
        elif op == 8:
            m.remove(rng.choice(ids))
        elif step % 50 == 0:
            m.remove_node(rng.choice(nodes))
        assert m.counts() == m.recount(), step
    assert m.recount() != {"under_replicated": 0, "missing": 0, "corrupt": 0}


class _Node:
    other = None


async def test_gc_governor_freezes_survivors_and_collects_frozen_cycles_at_its_interval():
    import gc
    import weakref

    from meta.services.gcpolicy import GcGovernor

    governor = GcGovernor(0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(governor.run)
        with trio.fail_after(10):
            while gc.get_freeze_count() == 0:       # installed: startup freeze
                await trio.sleep(0.01)
        long_lived = [{"ino": i, "blocks": [i]} for i in range(50_000)]
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        dead_cycle = weakref.ref(a)
        gc.collect()          # a full collection: its survivors are frozen
        assert gc.get_freeze_count() >= 2 * len(long_lived)
        assert governor.stats()["full_collections"] >= 1
        del a, b
        gc.collect()          # frozen: the next full pass does not even look at them
        assert dead_cycle() is not None
        # ... until the governor's periodic full collection, which frees the cycle
        with trio.fail_after(10):
            while dead_cycle() is not None:
                await trio.sleep(0.05)
        assert len(long_lived) == 50_000
        # one governor per process: a second one governs nothing
        second = GcGovernor(0.5)
        nursery.start_soon(second.run)
        await trio.testing.wait_all_tasks_blocked()   # the second one is under way
        assert gc.callbacks.count(second._on_gc) == 0
        nursery.cancel_scope.cancel()
    assert gc.get_freeze_count() == 0 and governor._on_gc not in gc.callbacks


# --------------------------------------------------------------------------- read view


def test_walks_and_paths_remembered_between_applies_follow_every_apply():
    """walk/path_of/linked_inode answers are kept until the next applied batch: a create,
    a rename and a delete applied after a remembered answer are seen at once."""
    from meta.journal.files import Record
    from meta.namespace.namespace import Namespace

    ns = Namespace(MemoryStore())
    txid = iter(range(1, 100))
    ns.apply([Record(next(txid), *to_wire(ns.planner.plan_format(1, 10)))])
    ns.apply([Record(next(txid), *to_wire(ns.planner.plan_mkdirs("/a", now_ns=20)))])
    assert len(ns.view.walk(["a", "f"])) == 2                       # /a exists, f does not
    ns.apply([Record(next(txid), *to_wire(ns.planner.plan_create("/a/f", holder="w", now_ns=30)))])
    found = ns.view.walk(["a", "f"])
    assert len(found) == 3
    ino = found[-1][0]
    assert ns.view.path_of(ino) == "/a/f" and ns.view.linked_inode(ino) is not None
    ns.apply([Record(next(txid), *to_wire(ns.renames.plan_rename("/a/f", "/a/g", now_ns=40)))])
    assert len(ns.view.walk(["a", "f"])) == 2
    assert ns.view.path_of(ino) == "/a/g"
    ns.apply([Record(next(txid), *to_wire(ns.planner.plan_delete("/a/g", recursive=False, now_ns=50)))])
    assert ns.view.path_of(ino) is None and ns.view.linked_inode(ino) is None
    found = ns.view.walk(["a", "g"])
    found.append("caller's own list")                          # a copy: the memo is intact
    assert len(ns.view.walk(["a", "g"])) == 2


def test_apply_does_not_change_inodes_readers_hold():
    """apply reads inodes from the decoded cache: it must put a changed copy, never change
    the shared cached record a reader (a walk, a status) already holds."""
    from meta.journal.files import Record
    from meta.namespace.namespace import Namespace

    ns = Namespace(MemoryStore())
    ns.apply([Record(1, *to_wire(ns.planner.plan_format(1, 10)))])
    ns.apply([Record(2, *to_wire(ns.planner.plan_mkdirs("/a", now_ns=20)))])
    held = ns.view.walk(["a"])[-1][1]
    before = held.to_wire()
    ns.apply([Record(3, *to_wire(ns.planner.plan_create("/a/f", holder="w", now_ns=30)))])
    assert held.to_wire() == before
    assert ns.view.get_inode(ns.view.walk(["a"])[-1][0]).children == before["children"] + 1
    assert check_namespace(ns.kv) == []


def test_loopback_address_is_refused_only_from_a_remote_peer():
    """A block server may advertise loopback to a metadata server it reaches on loopback
    (one machine; a dual-stack listener sees ::ffff:127.0.0.1) or on its local socket, but
    not from another host's address; any address of its own is taken as it is."""
    from types import SimpleNamespace
    from meta.protocols.datanode import DatanodeProtocol

    check = DatanodeProtocol._check_reachable
    for peer in ("127.0.0.1:40000", "[::ffff:127.0.0.1]:40000", "[::1]:40000",
                 "local:alice:123", "?"):
        check(SimpleNamespace(peer=peer), "n1", "127.0.0.1", "127.0.0.1:9866")
    check(SimpleNamespace(peer="10.0.0.5:40000"), "n1", "10.0.0.6", "10.0.0.6:9866")
    for loopback in ("127.0.0.1", "localhost", "::1"):
        with pytest.raises(errors.RegistrationRefused,
                           match="connected from 10.0.0.5 .*loopback.*--host"):
            check(SimpleNamespace(peer="10.0.0.5:40000"), "n1", loopback, f"{loopback}:9866")
