"""Leases on the metadata server: the LeaseManager's pure decisions (fake clock), and the
lease-recovery RPCs in-process (real LevelDB, journal, sockets) with fake block servers that
answer RECOVER_BLOCK by calling commit_block_synchronization."""

from __future__ import annotations

import logging
import re

import pytest
import trio

from fs import errors
from harness import wait_until
from meta.leases import leases as lm
from meta.leases.leases import INTERNAL_HOLDER, LeaseManager
from test_meta_server import FakeNode, KiB, meta_server


# --------------------------------------------------------------------------- pure
def test_recover_lease_internal_decisions():
    m = LeaseManager(soft_limit=10, hard_limit=100)
    m.add("A", 5, now=0)
    with pytest.raises(errors.AlreadyBeingCreated, match="already the current lease holder"):
        m.recover_lease_internal("create", "/f", "A", "A", now=1)
    with pytest.raises(errors.AlreadyBeingCreated, match="currently owned by A"):
        m.recover_lease_internal("append", "/f", "A", "B", now=10)
    with pytest.raises(errors.RecoveryInProgress, match="try again later"):
        m.recover_lease_internal("create", "/f", "A", "B", now=1, last_under_recovery=True)
    assert m.recover_lease_internal("create", "/f", "A", "B", now=10.5) == "release"
    # forced (recover_lease): no soft-limit wait, the holder itself may call it
    assert m.recover_lease_internal("recover", "/f", "A", "B", now=1, force=True) == "release"
    assert m.recover_lease_internal("recover", "/f", "A", "A", now=1, force=True) == "release"
    # a holder without a lease (e.g. after a restart race) is released at once
    assert m.recover_lease_internal("create", "/f", "ghost", "B", now=0) == "release"


def test_release_decision_by_last_block_states():
    d = lm.release_decision
    assert d([], 1) == lm.CLOSE
    assert d([("COMPLETE", 10, 1)], 1) == lm.CLOSE
    assert d([("COMPLETE", 10, 1), ("COMMITTED", 5, 1)], 1) == lm.CLOSE
    assert d([("COMPLETE", 10, 1), ("COMMITTED", 5, 0)], 1) == lm.WAIT
    assert d([("COMMITTED", 10, 0), ("UNDER_CONSTRUCTION", 0, 0)], 1) == lm.WAIT
    assert d([("COMPLETE", 10, 1), ("UNDER_CONSTRUCTION", 0, 0)], 1) == lm.DROP_LAST_AND_CLOSE
    assert d([("UNDER_CONSTRUCTION", 0, 2)], 1) == lm.RECOVER     # replicas may hold data
    assert d([("UNDER_CONSTRUCTION", 7, 0)], 1) == lm.RECOVER     # hsynced length known
    assert d([("UNDER_RECOVERY", 7, 1)], 1) == lm.RECOVER


def test_hard_expired_files_oldest_first_and_bounded():
    m = LeaseManager(soft_limit=1, hard_limit=5)
    m.add("old", 1, now=0)
    m.add("old", 2, now=0)
    m.add("mid", 3, now=2)
    m.add("young", 4, now=9)
    assert m.hard_expired_files(now=10, limit=10) == [("old", 1), ("old", 2), ("mid", 3)]
    assert m.hard_expired_files(now=10, limit=2) == [("old", 1), ("old", 2)]
    m.renew("old", now=10)
    assert m.hard_expired_files(now=10, limit=10) == [("mid", 3)]
    # reassigning to the internal holder gives the file a fresh timer
    m.reassign(3, INTERNAL_HOLDER, now=10)
    assert m.hard_expired_files(now=10, limit=10) == []
    assert m.holder_of(3) == INTERNAL_HOLDER and m.lease_of("mid") is None


def test_choose_primary_freshest_heartbeat_among_those_not_tried():
    cands = [("a", 5.0), ("b", 9.0), ("c", 7.0)]
    assert lm.choose_primary(cands) == "b"
    assert lm.choose_primary(cands, frozenset({"b"})) == "c"
    assert lm.choose_primary(cands, frozenset({"b", "c"})) == "a"
    assert lm.choose_primary(cands, frozenset({"a", "b", "c"})) == "b"   # all tried: all
    assert lm.choose_primary([], frozenset()) is None
    # a tried primary that heartbeats again does not come back before the others
    assert lm.choose_primary([("a", 5.0), ("b", 6.0)], frozenset({"b"})) == "a"
    assert lm.choose_primary([("a", 5.0), ("b", 99.0)], frozenset({"b"})) == "a"


def test_choose_primary_skips_stale_holders_unless_all_are():
    cands = [("a", 5.0), ("b", 9.0), ("c", 7.0)]
    assert lm.choose_primary(cands, now=10.0, stale_after=4.0) == "b"
    assert lm.choose_primary(cands, frozenset({"b"}), now=12.0, stale_after=4.0) == "b"  # c, a stale
    assert lm.choose_primary(cands, frozenset({"b"}), now=30.0, stale_after=4.0) == "c"  # all stale


def test_recovery_is_due_when_its_primary_stops_heartbeating():
    due = dict(started=100.0, retry_after=90.0, stale_after=1.0)
    # a primary heartbeating: only the long retry
    assert not lm.recovery_due(now=150.0, primary_heartbeat=149.9, **due)
    assert lm.recovery_due(now=190.0, primary_heartbeat=189.9, **due)
    # a primary silent since just before the recovery started: retried once it is stale
    assert not lm.recovery_due(now=100.5, primary_heartbeat=99.9, **due)
    assert lm.recovery_due(now=101.2, primary_heartbeat=99.9, **due)
    # no primary at all: only the long retry
    assert not lm.recovery_due(now=150.0, primary_heartbeat=None, **due)


# --------------------------------------------------------------------------- RPC helpers
BASE = dict(replication=2, lease_soft_limit=0.5, lease_hard_limit=1.5, block_recovery_retry=30.0)


async def nodes_for(meta, stack, n=2):
    out = []
    for i in range(n):
        rpc = await stack.enter_async_context(meta.client(f"storage-{i}"))
        node = FakeNode(rpc, f"node-{i}", 9100 + i)
        await node.register()
        out.append(node)
    return out


async def open_file_with_data(rpc, nodes, path, client, nbytes, state="RBW"):
    st = await rpc.call("create", {"path": path, "client_name": client})
    lb = await rpc.call("add_block", {"path": path, "client_name": client, "ino": st["ino"]})
    for node in nodes:
        await node.received(lb["block"], nbytes, state=state)
    return st, lb


async def recover_commands(node):
    reply = await node.heartbeat()
    return [c for c in reply["commands"] if c["type"] == "RECOVER_BLOCK"]


async def wait_command(nodes, tries=60):
    for _ in range(tries):
        for node in nodes:
            cmds = await recover_commands(node)
            if cmds:
                return node, cmds[0]
        await trio.sleep(0.05)
    raise AssertionError("no RECOVER_BLOCK command was handed out")


async def commit_sync(node, cmd, length, *, delete=False, targets=None):
    return await node.rpc.call("commit_block_synchronization", {
        "block": {"id": cmd["block"]["id"], "gs": cmd["block"]["gs"]},
        "recovery_id": cmd["recovery_id"], "new_length": length, "close_file": True,
        "delete_block": delete,
        "new_targets": targets if targets is not None else [t["node_id"] for t in cmd["targets"]]})


async def run(tmp_path, body, **overrides):
    from contextlib import AsyncExitStack
    async with meta_server(tmp_path, **{**BASE, **overrides}) as meta:
        async with AsyncExitStack() as stack:
            rpc = await stack.enter_async_context(meta.client())
            await body(meta, rpc, stack)


# --------------------------------------------------------------------------- RPC tests
async def test_recover_lease_forced_block_recovery_and_commit(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        st, lb = await open_file_with_data(rpc, nodes, "/f", "A", 3000)
        await rpc.call("renew_lease", {"client_name": "A"})
        # forced: no soft-limit wait; block recovery starts, lease goes to the caller
        assert await rpc.call("recover_lease", {"path": "/f", "client_name": "B"}) is False
        opened = await rpc.call("list_open_files", {})
        assert [(e["path"], e["holder"], e["last_block_state"]) for e in opened] == \
            [("/f", "B", "UNDER_RECOVERY")]
        # polling while it runs: still False, no new recovery id
        assert await rpc.call("recover_lease", {"path": "/f", "client_name": "B"}) is False
        primary, cmd = await wait_command(nodes)
        assert cmd["recovery_id"] > lb["block"]["gs"] and cmd["new_length"] is None
        assert sorted(t["node_id"] for t in cmd["targets"]) == ["node-0", "node-1"]
        # others meanwhile: create is refused with recovery in progress
        with pytest.raises(errors.RecoveryInProgress):
            await rpc.call("create", {"path": "/f", "client_name": "C"})
        # a stale recovery id is refused and changes nothing
        with pytest.raises(errors.StaleGenerationStamp):
            await primary.rpc.call("commit_block_synchronization", {
                "block": {"id": cmd["block"]["id"], "gs": lb["block"]["gs"]},
                "recovery_id": cmd["recovery_id"] - 1, "new_length": 1, "close_file": True,
                "delete_block": False, "new_targets": ["node-0"]})
        assert (await rpc.call("get_file_info", {"path": "/f"}))["under_construction"]
        assert await commit_sync(primary, cmd, 3000) is True
        assert await rpc.call("recover_lease", {"path": "/f", "client_name": "B"}) is True
        info = await rpc.call("get_file_info", {"path": "/f"})
        assert not info["under_construction"] and info["length"] == 3000
        loc = await rpc.call("get_block_locations", {"path": "/f"})
        assert loc["blocks"][0]["block"]["gs"] == cmd["recovery_id"]
        assert loc["blocks"][0]["state"] == "COMPLETE" and len(loc["blocks"][0]["locations"]) == 2
        assert await rpc.call("list_open_files", {}) == []
        # the old writer is out
        with pytest.raises(errors.LeaseExpired, match="not open for writing"):
            await rpc.call("add_block", {"path": "/f", "client_name": "A", "ino": st["ino"],
                                         "previous": {**lb["block"], "num_bytes": 3000}})
        with pytest.raises(errors.FileExists):
            await rpc.call("create", {"path": "/f", "client_name": "C"})
    await run(tmp_path, body)


async def test_writer_checks_after_reassignment_name_the_owner(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        st, lb = await open_file_with_data(rpc, nodes, "/g", "A", 100)
        assert await rpc.call("recover_lease", {"path": "/g", "client_name": "B"}) is False
        with pytest.raises(errors.LeaseExpired, match="not the lease owner"):
            await rpc.call("fsync", {"path": "/g", "client_name": "A", "ino": st["ino"],
                                     "last_block_length": 100})
        with pytest.raises(errors.LeaseExpired, match="not the lease owner"):
            await rpc.call("complete", {"path": "/g", "client_name": "A", "ino": st["ino"],
                                        "last": {**lb["block"], "num_bytes": 100}})
    await run(tmp_path, body)


async def test_soft_expiry_create_recovers_then_file_exists(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/s", "A", 700)
        with pytest.raises(errors.AlreadyBeingCreated, match="currently owned by A"):
            await rpc.call("create", {"path": "/s", "client_name": "B"})
        async def past_soft_limit():   # B asks until A's soft limit passed
            try:
                await rpc.call("create", {"path": "/s", "client_name": "B"})
            except errors.AlreadyBeingCreated:
                return None
            except errors.RecoveryInProgress:
                return "recovering"
            return "created"

        assert await wait_until(past_soft_limit, timeout=10) == "recovering"
        with pytest.raises(errors.RecoveryInProgress):
            await rpc.call("create", {"path": "/s", "client_name": "B"})
        primary, cmd = await wait_command(nodes)
        await commit_sync(primary, cmd, 700)
        with pytest.raises(errors.FileExists):
            await rpc.call("create", {"path": "/s", "client_name": "B"})
        assert (await rpc.call("get_file_info", {"path": "/s"}))["length"] == 700
    await run(tmp_path, body)


async def test_hard_expiry_goes_to_internal_holder_and_survives_restart(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/h", "A", 512)
        for _ in range(60):
            opened = await rpc.call("list_open_files", {})
            if opened and opened[0]["holder"] == INTERNAL_HOLDER:
                break
            await trio.sleep(0.1)
        assert opened[0]["holder"] == INTERNAL_HOLDER
        assert opened[0]["last_block_state"] == "UNDER_RECOVERY"
        await meta.restart()
        async with meta.client() as rpc2:
            opened = await rpc2.call("list_open_files", {})
            assert [(e["path"], e["holder"]) for e in opened] == [("/h", INTERNAL_HOLDER)]
    await run(tmp_path, body, lease_hard_limit=0.8, lease_soft_limit=0.3)


async def test_stalled_recovery_retried_with_new_id_and_next_primary(tmp_path, caplog):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/r", "A", 64)
        assert await rpc.call("recover_lease", {"path": "/r", "client_name": "B"}) is False
        first_node, first = await wait_command(nodes)
        # only the other holder heartbeats from now on, so it is the freshest when the
        # retry chooses: the retry must still not go back to the first primary
        other = next(node for node in nodes if node is not first_node)
        second_node, second = await wait_command([other], tries=100)
        assert second["recovery_id"] > first["recovery_id"]
        with pytest.raises(errors.StaleGenerationStamp, match="superseded"):
            await commit_sync(first_node, first, 64)
        # the newest recovery commits; a slow poll may have let another retry replace the
        # one it saw, whose commit is then refused the same way
        while True:
            try:
                assert await commit_sync(second_node, second, 64)
                break
            except errors.StaleGenerationStamp:
                second_node, second = await wait_command(nodes, tries=100)
        assert await rpc.call("recover_lease", {"path": "/r", "client_name": "B"}) is True

    with caplog.at_level(logging.INFO, logger="meta.services.lease_recovery"):
        await run(tmp_path, body, block_recovery_retry=0.4)
    # every retry went to the other holder, whichever heartbeated last in between (the
    # test's polls make each node in turn the freshest)
    primaries = [m.group(1) for r in caplog.records
                 if (m := re.search(r"block recovery of /r block \d+: .* primary (\S+) "
                                    r"\(attempt", r.getMessage()))]
    assert len(primaries) >= 2, primaries
    assert all(a != b for a, b in zip(primaries, primaries[1:])), primaries


async def test_all_replicas_empty_drops_the_block_and_closes(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/e", "A", 0)
        assert await rpc.call("recover_lease", {"path": "/e", "client_name": "B"}) is False
        primary, cmd = await wait_command(nodes)
        await commit_sync(primary, cmd, 0, delete=True, targets=[])
        info = await rpc.call("get_file_info", {"path": "/e"})
        assert not info["under_construction"] and info["length"] == 0
        assert (await rpc.call("get_block_locations", {"path": "/e"}))["blocks"] == []
    await run(tmp_path, body)


async def test_truncate_boundary_mid_block_and_errors(tmp_path):
    async def body(meta, rpc, stack):
        from test_meta_server import write_file
        nodes = await nodes_for(meta, stack)
        bs = 64 * KiB
        await write_file(rpc, nodes, "/t", [bs, bs, 1000])
        await rpc.call("mkdirs", {"path": "/d"})
        with pytest.raises(errors.InvalidArgument, match="beyond the end"):
            await rpc.call("truncate", {"path": "/t", "new_length": 3 * bs, "client_name": "T"})
        with pytest.raises(errors.IsDirectory):
            await rpc.call("truncate", {"path": "/d", "new_length": 0, "client_name": "T"})
        await rpc.call("create", {"path": "/open", "client_name": "W"})
        with pytest.raises(errors.AlreadyBeingCreated):
            await rpc.call("truncate", {"path": "/open", "new_length": 0, "client_name": "T"})
        # on a block boundary: True, stays closed, dropped block's replicas invalidated
        assert await rpc.call("truncate", {"path": "/t", "new_length": 2 * bs,
                                           "client_name": "T"}) is True
        info = await rpc.call("get_file_info", {"path": "/t"})
        assert info["length"] == 2 * bs and not info["under_construction"]
        doomed = []
        for node in nodes:
            for c in (await node.heartbeat())["commands"]:
                if c["type"] == "INVALIDATE":
                    doomed += [b["num_bytes"] for b in c["blocks"]]
        assert doomed == [1000, 1000]
        # mid-block: False, under construction for the caller, RECOVER_BLOCK with new_length
        assert await rpc.call("truncate", {"path": "/t", "new_length": bs + 100,
                                           "client_name": "T"}) is False
        info = await rpc.call("get_file_info", {"path": "/t"})
        # as HDFS: the old length until the recovery commits (what `-truncate -w` polls)
        assert info["under_construction"] and info["length"] == 2 * bs
        opened = await rpc.call("list_open_files", {"path": "/t"})
        assert opened[0]["holder"] == "T" and opened[0]["last_block_state"] == "UNDER_RECOVERY"
        primary, cmd = await wait_command(nodes)
        assert cmd["new_length"] == 100
        await commit_sync(primary, cmd, 100)
        info = await rpc.call("get_file_info", {"path": "/t"})
        assert info["length"] == bs + 100 and not info["under_construction"]
    await run(tmp_path, body)


async def test_append_reopens_partial_block_with_new_gs(tmp_path):
    async def body(meta, rpc, stack):
        from test_meta_server import write_file
        nodes = await nodes_for(meta, stack)
        st, blocks = await write_file(rpc, nodes, "/a", [5000])
        await rpc.call("create", {"path": "/full", "client_name": "W0"})
        with pytest.raises(errors.AlreadyBeingCreated):
            await rpc.call("append", {"path": "/full", "client_name": "X"})
        reply = await rpc.call("append", {"path": "/a", "client_name": "P"})
        last = reply["last_block"]
        assert reply["status"]["under_construction"]
        assert last["block"]["id"] == blocks[0]["id"] and last["block"]["num_bytes"] == 5000
        assert last["block"]["gs"] > blocks[0]["gs"] and last["offset"] == 0
        assert sorted(loc["node_id"] for loc in last["locations"]) == ["node-0", "node-1"]
        # the replicas (old stamp) are not declared corrupt while the pipeline reopens them
        assert (await rpc.call("report"))["corrupt"] == 0
        for node in nodes:
            await node.received(last["block"], 6000)
        assert await rpc.call("complete", {"path": "/a", "client_name": "P", "ino": st["ino"],
                                           "last": {**last["block"], "num_bytes": 6000}})
        assert (await rpc.call("get_file_info", {"path": "/a"}))["length"] == 6000
        with pytest.raises(errors.IsDirectory):
            await rpc.call("append", {"path": "/", "client_name": "P"})
    await run(tmp_path, body)


async def test_recovery_commit_survives_restart(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/p", "A", 900)
        assert await rpc.call("recover_lease", {"path": "/p", "client_name": "B"}) is False
        primary, cmd = await wait_command(nodes)
        await commit_sync(primary, cmd, 900)
        await meta.restart()
        async with meta.client() as rpc2:
            info = await rpc2.call("get_file_info", {"path": "/p"})
            assert info["length"] == 900 and not info["under_construction"]
            loc = await rpc2.call("get_block_locations", {"path": "/p"})
            assert loc["blocks"][0]["block"]["gs"] == cmd["recovery_id"]
    await run(tmp_path, body)


async def test_rename_open_file_and_two_restarts_keep_one_lease(tmp_path):
    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await rpc.call("mkdirs", {"path": "/d"})
        st, lb = await open_file_with_data(rpc, nodes, "/d/f", "W", 1000)
        await rpc.call("rename", {"src": "/d/f", "dst": "/d/g"})
        await rpc.call("rename", {"src": "/d", "dst": "/e"})
        opened = await rpc.call("list_open_files", {})
        assert [(e["path"], e["holder"]) for e in opened] == [("/e/g", "W")]
        for _ in range(2):
            await meta.restart()
            for node in nodes:
                await node.register()
                await node.report([[lb["block"]["id"], lb["block"]["gs"], 1000, "RBW"]])
            opened = await rpc.call("list_open_files", {"path": "/e"})
            assert [(e["path"], e["holder"]) for e in opened] == [("/e/g", "W")]
        await rpc.call("renew_lease", {"client_name": "W"})
        prev = {**lb["block"], "num_bytes": 1000}
        for node in nodes:
            await node.received(lb["block"], 1000, state="FINALIZED")
        assert await rpc.call("complete", {"path": "/d/f", "client_name": "W", "ino": st["ino"],
                                           "last": prev})
        assert await rpc.call("list_open_files", {}) == []
        assert (await rpc.call("get_file_info", {"path": "/e/g"}))["length"] == 1000
    await run(tmp_path, body, lease_soft_limit=5.0, lease_hard_limit=20.0)


async def test_namespace_invariants_after_recovery_truncate_append(tmp_path):
    from meta.namespace.invariants import check_namespace
    from meta.journal.kv import PlyvelStore
    from test_meta_server import write_file

    async def body(meta, rpc, stack):
        nodes = await nodes_for(meta, stack)
        await open_file_with_data(rpc, nodes, "/x", "A", 10)
        assert await rpc.call("recover_lease", {"path": "/x", "client_name": "B"}) is False
        primary, cmd = await wait_command(nodes)
        await commit_sync(primary, cmd, 10)
        await write_file(rpc, nodes, "/y", [4000])
        assert await rpc.call("truncate", {"path": "/y", "new_length": 10,
                                           "client_name": "T"}) is False
        primary, cmd = await wait_command(nodes)
        await commit_sync(primary, cmd, 10)
        await rpc.call("append", {"path": "/x", "client_name": "P"})
        await meta.stop()
        store = PlyvelStore(str(tmp_path / "meta" / "db"), create=False)
        try:
            assert check_namespace(store) == []
        finally:
            store.close()
        await meta.start()
    await run(tmp_path, body)


async def test_mid_block_truncate_survives_a_restart_before_its_recovery_commits(tmp_path):
    """The truncate target is journaled with the block: a recovery started again after a
    metadata-server restart still cuts the replicas to it (not to the replicas' old length)."""
    async def body(meta, rpc, stack):
        from test_meta_server import write_file
        nodes = await nodes_for(meta, stack)
        bs = 64 * KiB
        st, blocks = await write_file(rpc, nodes, "/t", [bs, 5000])
        assert await rpc.call("truncate", {"path": "/t", "new_length": bs + 1000,
                                           "client_name": "T"}) is False
        await meta.restart()                        # before any block server ran the recovery
        for node in nodes:                          # they come back and report what they hold
            assert (await node.heartbeat())["reregister"] is True
            await node.register()
            await node.report([[b["id"], b["gs"], b["num_bytes"], "FINALIZED"] for b in blocks])
        info = await rpc.call("get_file_info", {"path": "/t"})
        assert info["under_construction"] and info["length"] == bs + 5000
        assert await rpc.call("recover_lease", {"path": "/t", "client_name": "R"}) is False
        primary, cmd = await wait_command(nodes)
        assert cmd["new_length"] == 1000            # the truncate target, not 5000
        await commit_sync(primary, cmd, 1000)
        info = await rpc.call("get_file_info", {"path": "/t"})
        assert info["length"] == bs + 1000 and not info["under_construction"]
        # a later append + recovery of the same block must not cut it back to 1000
        reply = await rpc.call("append", {"path": "/t", "client_name": "P"})
        assert reply["last_block"]["block"]["num_bytes"] == 1000
        assert await rpc.call("recover_lease", {"path": "/t", "client_name": "R2"}) is False
        primary, cmd = await wait_command(nodes)
        assert cmd.get("new_length") is None, cmd   # the replicas' own length decides
    await run(tmp_path, body)
