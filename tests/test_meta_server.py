"""The metadata server in-process on port 0 (real LevelDB, real journal, real sockets),
spoken to with ``fs.rpc.RpcClient``; block servers are played by RPC clients that register,
report replicas and heartbeat exactly as the protocol says."""

from __future__ import annotations

import os
import json
import socket
from contextlib import asynccontextmanager

import pytest
import trio

from harness import free_port, wait_until

from fs import errors
from fs.config import Config
from fs.rpc import RpcClient, format_address
from meta.namespace.invariants import check_namespace
from meta.journal.kv import PlyvelStore
from meta.serverrun import run_meta_server

KiB = 1024
# fake block servers speak the block-server protocol without the cluster key
BASE = dict(security="simple", heartbeat_interval=0.2, dead_node_interval=2.0, safemode_extension=0.0,
            safemode_min_storage=0,
            block_size=64 * KiB, replication=1, rpc_retry_seconds=2.0, rpc_timeout=10.0,
            lease_monitor_period=0.1, min_block_size=4 * KiB)


class Meta:
    """One metadata server task that a test can stop and start again on the same folder."""

    def __init__(self, nursery, data_dir, config):
        self.nursery = nursery
        self.data_dir = str(data_dir)
        self.config = config
        self.address = None
        self._scope = None
        self._done = None
        self.port = free_port()  # below the ephemeral range: restarts reuse it safely

    async def start(self, http_port: int = 0):
        self._scope, self._done = trio.CancelScope(), trio.Event()

        async def runner(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with self._scope:
                    await run_meta_server(self.config, self.data_dir, host="127.0.0.1",
                                          port=self.port, http_port=http_port,
                                          task_status=task_status)
            finally:
                self._done.set()

        bound = await self.nursery.start(runner)
        self.port = bound[1]
        self.address = format_address(bound)

    async def stop(self):
        self._scope.cancel()
        await self._done.wait()

    async def restart(self):
        await self.stop()
        await self.start()

    def client(self, client_id="test-client"):
        return RpcClient(self.address, client_id, retry_seconds=2.0, timeout=10.0)


@asynccontextmanager
async def meta_server(tmp_path, **overrides):
    config = Config.load(env={}, **{**BASE, **overrides})
    async with trio.open_nursery() as nursery:
        meta = Meta(nursery, tmp_path / "meta", config)
        await meta.start()
        try:
            yield meta
        finally:
            nursery.cancel_scope.cancel()


class Stall:
    """A hang guard for a loop that polls progress: ``check(state)`` fails once ``state``
    has not changed for ``limit`` seconds. Unlike a deadline on the whole loop it holds on
    a machine loaded enough to make the work itself take minutes."""

    def __init__(self, limit: float):
        self.limit = limit
        self.state = object()
        self.since = trio.current_time()

    def check(self, state, what: str) -> None:
        now = trio.current_time()
        if state != self.state:
            self.state, self.since = state, now
        elif now - self.since > self.limit:
            raise AssertionError(f"{what}: no progress for {self.limit:g} s (at {state})")


class FakeNode:
    """A block server as the metadata server sees it: register, reports, heartbeats."""

    def __init__(self, rpc: RpcClient, node_id: str, port: int):
        self.rpc = rpc
        self.node_id = node_id
        self.address = f"127.0.0.1:{port}"
        self.usage = {"capacity": 10 << 30, "used": 0, "remaining": 10 << 30}

    async def register(self):
        return await self.rpc.call("register_storage", {"node_id": self.node_id,
                                                        "address": self.address, **self.usage})

    async def heartbeat(self):
        return await self.rpc.call("heartbeat", {"node_id": self.node_id, **self.usage})

    async def report(self, replicas):
        return await self.rpc.call("block_report", {"node_id": self.node_id, "blocks": replicas})

    async def received(self, block, num_bytes, state="FINALIZED", gs=None):
        entry = [block["id"], block["gs"] if gs is None else gs, num_bytes, state]
        return await self.rpc.call("block_received_and_deleted", {
            "node_id": self.node_id, "received": [entry], "deleted": []})


async def write_file(rpc, nodes, path, sizes, client="writer-1", **create_kw):
    """The client side of a whole write: create, blocks reported by ``nodes``, complete."""
    st = await rpc.call("create", {"path": path, "client_name": client, **create_kw})
    previous = None
    blocks = []
    for size in sizes:
        lb = await rpc.call("add_block", {"path": path, "client_name": client, "ino": st["ino"],
                                          "previous": previous})
        for node in nodes:
            await node.received(lb["block"], size)
        previous = {**lb["block"], "num_bytes": size}
        blocks.append(previous)
    assert await rpc.call("complete", {"path": path, "client_name": client, "ino": st["ino"],
                                       "last": previous})
    return st, blocks


def assert_store_consistent(tmp_path) -> None:
    """The stopped server's LevelDB folder passes the full invariant check."""
    store = PlyvelStore(str(tmp_path / "meta" / "db"), create=False)
    try:
        assert check_namespace(store) == []
    finally:
        store.close()


async def tree(rpc, path="/") -> dict:
    out = {}
    page = await rpc.call("list_status", {"path": path})
    for e in page["entries"]:
        out[e["path"]] = (e["type"], e["length"], e["under_construction"], e["mode"])
        if e["type"] == "dir":
            out.update(await tree(rpc, e["path"]))
    return out


# --------------------------------------------------------------------------- life cycle


async def test_file_life_cycle_create_add_block_complete(tmp_path):
    async def main():
        async with meta_server(tmp_path, replication=2) as meta:
            async with meta.client() as rpc, meta.client("storage-a") as ra, \
                    meta.client("storage-b") as rb:
                a, b = FakeNode(ra, "node-a", 9001), FakeNode(rb, "node-b", 9002)
                assert (await a.register())["namespace_id"] > 0
                await b.register()
                defaults = await rpc.call("get_server_defaults")
                assert defaults["block_size"] == 64 * KiB and defaults["replication"] == 2

                assert await rpc.call("mkdirs", {"path": "/data"}) is True
                st = await rpc.call("create", {"path": "/data/f", "client_name": "w1"})
                assert st["under_construction"] and st["replication"] == 2
                ino = st["ino"]
                lb1 = await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino})
                assert lb1["state"] == "UNDER_CONSTRUCTION" and lb1["offset"] == 0
                assert {loc["address"] for loc in lb1["locations"]} == {a.address, b.address}
                # a retried add_block whose reply was lost returns the same block
                again = await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                     "ino": ino})
                assert again["block"]["id"] == lb1["block"]["id"]
                full = 64 * KiB
                await a.received(lb1["block"], full)
                lb2 = await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "previous": {**lb1["block"],
                                                                            "num_bytes": full}})
                assert lb2["offset"] == full and lb2["block"]["gs"] > lb1["block"]["gs"]
                # block 1 is COMPLETE (min_replication 1), so a third block is allowed only
                # after block 2 is too: here block 2 has no replica yet
                prev2 = {**lb2["block"], "num_bytes": full}
                lb3 = await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "previous": prev2})
                prev3 = {**lb3["block"], "num_bytes": 10}
                with pytest.raises(errors.NotReplicatedYet, match=str(lb2["block"]["id"])):
                    await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                 "ino": ino, "previous": prev3})
                # complete is False until every block is COMPLETE
                assert await rpc.call("complete", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "last": prev3}) is False
                await b.received(lb2["block"], full)
                assert await rpc.call("complete", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "last": prev3}) is False
                # a replica with the wrong length is corrupt and never counts
                await a.received(lb3["block"], 11)
                assert await rpc.call("complete", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "last": prev3}) is False
                await b.received(lb3["block"], 10)
                assert await rpc.call("complete", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "last": prev3}) is True
                # a retry after the close (lost reply) still says True
                assert await rpc.call("complete", {"path": "/data/f", "client_name": "w1",
                                                   "ino": ino, "last": prev3}) is True

                info = await rpc.call("get_file_info", {"path": "/data/f"})
                assert not info["under_construction"] and info["length"] == 2 * full + 10
                located = await rpc.call("get_block_locations", {"path": "/data/f"})
                assert located["length"] == 2 * full + 10 and located["last_block_complete"]
                assert [lb["offset"] for lb in located["blocks"]] == [0, full, 2 * full]
                last = located["blocks"][2]
                assert [loc["node_id"] for loc in last["locations"]] == ["node-b"]
                assert not last["corrupt"] and last["state"] == "COMPLETE"
                ranged = await rpc.call("get_block_locations", {"path": "/data/f",
                                                                "offset": full + 5,
                                                                "length": 10})
                assert [lb["block"]["id"] for lb in ranged["blocks"]] == [lb2["block"]["id"]]
                report = await rpc.call("report")
                assert report["corrupt"] == 1 and report["files"] == 1 and report["blocks"] == 3
                assert report["under_replicated"] == 3   # each block has 1 good of 2 wanted
                # the writer's lease ended: its next call fails
                with pytest.raises(errors.LeaseExpired, match="not open for writing"):
                    await rpc.call("add_block", {"path": "/data/f", "client_name": "w1",
                                                 "ino": ino, "previous": prev3})
                with pytest.raises(errors.IsDirectory):
                    await rpc.call("get_block_locations", {"path": "/data"})

    await main()


async def test_lease_rules_between_two_writers(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client() as rpc, meta.client("storage-a") as ra:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                st = await rpc.call("create", {"path": "/f", "client_name": "alice"})
                with pytest.raises(errors.AlreadyBeingCreated, match="currently owned by alice"):
                    await rpc.call("create", {"path": "/f", "client_name": "bob"})
                with pytest.raises(errors.AlreadyBeingCreated, match="already the current"):
                    await rpc.call("create", {"path": "/f", "client_name": "alice"})
                with pytest.raises(errors.LeaseExpired, match="not the lease owner"):
                    await rpc.call("add_block", {"path": "/f", "client_name": "bob",
                                                 "ino": st["ino"]})
                assert await rpc.call("renew_lease", {"client_name": "alice"}) is True
                # overwrite takes the file; alice's next call finds nothing
                await rpc.call("create", {"path": "/f", "client_name": "bob", "overwrite": True})
                with pytest.raises(errors.FileNotFound):
                    await rpc.call("add_block", {"path": "/f", "client_name": "alice",
                                                 "ino": st["ino"]})
                report = await rpc.call("report")
                assert report["open_files"] == 1

    await main()


async def test_soft_and_hard_lease_expiry_release_files(tmp_path):
    async def main():
        async with meta_server(tmp_path, lease_soft_limit=0.3, lease_hard_limit=0.8) as meta:
            async with meta.client() as rpc, meta.client("storage-a") as ra:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                # soft limit: another client's create closes the abandoned file first
                await rpc.call("create", {"path": "/soft", "client_name": "ghost"})
                with pytest.raises(errors.AlreadyBeingCreated):
                    await rpc.call("create", {"path": "/soft", "client_name": "bob"})
                async def past_soft_limit():
                    try:
                        await rpc.call("create", {"path": "/soft", "client_name": "bob"})
                    except errors.AlreadyBeingCreated:
                        return False              # the ghost's lease still holds
                    return True

                with pytest.raises(errors.FileExists):
                    await wait_until(past_soft_limit, timeout=10)
                assert not (await rpc.call("get_file_info", {"path": "/soft"}))["under_construction"]
                # hard limit: the monitor recovers an abandoned file whose last block never
                # got data: its pipeline node may hold hflushed bytes not reported yet, so
                # it is asked (block recovery, as HDFS does for expected locations); the node
                # answers as a block server without the replica does (delete_block), and the
                # file closes without that block
                st = await rpc.call("create", {"path": "/hard", "client_name": "ghost2"})
                await rpc.call("add_block", {"path": "/hard", "client_name": "ghost2",
                                             "ino": st["ino"]})
                for _ in range(50):
                    reply = await node.heartbeat()
                    for cmd in reply["commands"]:
                        if cmd["type"] == "RECOVER_BLOCK":
                            await ra.call("commit_block_synchronization", {
                                "block": {"id": cmd["block"]["id"], "gs": cmd["block"]["gs"]},
                                "recovery_id": cmd["recovery_id"], "new_length": 0,
                                "close_file": True, "delete_block": True, "new_targets": []})
                    info = await rpc.call("get_file_info", {"path": "/hard"})
                    if not info["under_construction"]:
                        break
                    await trio.sleep(0.1)
                assert not info["under_construction"] and info["length"] == 0
                located = await rpc.call("get_block_locations", {"path": "/hard"})
                assert located["blocks"] == []
                assert (await rpc.call("report"))["open_files"] == 0

    await main()


# --------------------------------------------------------------------------- bad input


async def test_bad_requests_get_errors_and_server_keeps_serving(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client() as rpc:
                await rpc.call("mkdirs", {"path": "/keep/sub"})
                await rpc.call("create", {"path": "/keep/f", "client_name": "w"})
                before = await tree(rpc)
                bad_calls = [
                    ("no_such_method", {}, errors.UnknownMethod),
                    ("mkdirs", {"path": 12345}, errors.InvalidPath),
                    ("mkdirs", {"bogus": "/x"}, errors.InvalidArgument),
                    ("mkdirs", {"path": "/x", "permission": "rwx"}, errors.InvalidArgument),
                    ("create", {"path": "/x", "client_name": 7}, errors.InvalidArgument),
                    ("create", {"path": "/x", "client_name": "w", "replication": -1},
                     errors.InvalidArgument),
                    ("create", {"path": "/x"}, errors.InvalidArgument),
                    ("add_block", {"path": "/keep/f", "client_name": "w", "ino": "one"},
                     errors.InvalidArgument),
                    ("add_block", {"path": "/keep/f", "client_name": "w", "previous": "junk"},
                     errors.InvalidArgument),
                    ("add_block", {"path": "/keep/f", "client_name": "w", "excluded": 5},
                     errors.InvalidArgument),
                    ("complete", {"path": "/keep/f", "client_name": "w", "last": {"id": "x"}},
                     errors.InvalidArgument),
                    ("delete", {"path": "/keep", "recursive": "yes"}, errors.InvalidArgument),
                    ("delete", {"path": "/"}, errors.InvalidArgument),
                    ("rename", {"src": "/keep", "dst": "/keep/sub/k"}, errors.InvalidArgument),
                    ("list_status", {"path": "/keep", "limit": -3}, errors.InvalidArgument),
                    ("get_block_locations", {"path": "/keep/f", "offset": -1},
                     errors.InvalidArgument),
                    ("safemode", {"action": "explode"}, errors.InvalidArgument),
                    ("register_storage", {"node_id": "n", "address": "nowhere"},
                     errors.InvalidArgument),
                    ("heartbeat", {"node_id": "n", "capacity": "big"}, errors.InvalidArgument),
                    ("block_report", {"node_id": "ghost", "blocks": []}, errors.InvalidArgument),
                    ("report_bad_blocks", {"blocks": "all"}, errors.InvalidArgument),
                ]
                for path in ["/keep//x", "/keep/../etc", "/keep/./x", "/keep/a\0b", "rel",
                             "/" + "n" * 256, ""]:
                    bad_calls += [("mkdirs", {"path": path}, (errors.InvalidPath, errors.NameTooLong)),
                                  ("create", {"path": path, "client_name": "w"},
                                   (errors.InvalidPath, errors.NameTooLong)),
                                  ("rename", {"src": "/keep/f", "dst": path},
                                   (errors.InvalidPath, errors.NameTooLong)),
                                  ("delete", {"path": path, "recursive": True},
                                   (errors.InvalidPath, errors.NameTooLong))]
                for method, args, error in bad_calls:
                    with pytest.raises(error) as info:
                        await rpc.call(method, args)
                    assert info.value.message, (method, args)
                assert await tree(rpc) == before
                # the node that was refused is not registered; a good call still works
                report = await rpc.call("report")
                assert report["live_nodes"] == [] and report["files"] == 1
                assert (await rpc.call("get_file_info", {"path": "/keep"}))["children"] == 2

    await main()


async def test_oversized_and_garbage_frames_do_not_hurt_the_server(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            host, port = meta.address.rsplit(":", 1)

            def abuse():
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(b"\x00\x00\x00\x08" + os.urandom(8))
                    s.recv(1000)
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(b"\xff\xff\xff\xff" + b"x" * 64)
                    s.recv(1000)
            await trio.to_thread.run_sync(abuse)
            async with meta.client() as rpc:
                assert await rpc.call("mkdirs", {"path": "/still/alive"}) is True

    await main()


# --------------------------------------------------------------------------- retry cache


async def test_retried_mutations_with_the_same_call_id_apply_once(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client("retrying-client") as rpc:
                args = {"path": "/once", "client_name": "w1"}
                first = await rpc.call_once("create", args, 4242, 10)
                txid = (await rpc.call("report"))["journal"]["last_txid"]
                second = await rpc.call_once("create", args, 4242, 10)
                assert second == first
                assert (await rpc.call("report"))["journal"]["last_txid"] == txid
                with pytest.raises(errors.AlreadyBeingCreated):
                    await rpc.call_once("create", args, 4243, 10)
                assert await rpc.call_once("delete", {"path": "/once"}, 5000, 10) is True
                assert await rpc.call_once("delete", {"path": "/once"}, 5000, 10) is True
                with pytest.raises(errors.FileNotFound):
                    await rpc.call_once("delete", {"path": "/once"}, 5001, 10)
                await rpc.call("mkdirs", {"path": "/r"})
                assert await rpc.call_once("rename", {"src": "/r", "dst": "/r2"}, 6000, 10)
                assert await rpc.call_once("rename", {"src": "/r", "dst": "/r2"}, 6000, 10)
            # another client with the same call id is a different call
            async with meta.client("other-client") as other:
                with pytest.raises(errors.FileNotFound):
                    await other.call_once("rename", {"src": "/r", "dst": "/r2"}, 6000, 10)

    await main()


# --------------------------------------------------------------------------- safe mode


async def test_safe_mode_at_restart_and_manual(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client("storage-a") as ra:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                async with meta.client() as rpc:
                    _, blocks = await write_file(rpc, [node], "/d/f1", [100, 200])
                    _, more = await write_file(rpc, [node], "/d/f2", [300])
                await meta.restart()
                async with meta.client() as rpc:
                    status = await rpc.call("safemode")
                    assert status["on"] and not status["manual"]
                    assert "needs additional 3 blocks" in status["reason"]
                    with pytest.raises(errors.SafeMode, match="mkdirs /x"):
                        await rpc.call("mkdirs", {"path": "/x"})
                    with pytest.raises(errors.SafeMode):
                        await rpc.call("delete", {"path": "/d", "recursive": True})
                    # reads work in safe mode
                    assert (await rpc.call("get_file_info", {"path": "/d/f1"}))["length"] == 300
                    # the block server comes back (heartbeat says: register again) and reports
                    assert (await node.heartbeat())["reregister"] is True
                    await node.register()
                    await node.report([[b["id"], b["gs"], b["num_bytes"], "FINALIZED"]
                                       for b in blocks + more])
                    assert (await rpc.call("safemode"))["on"] is False
                    assert await rpc.call("mkdirs", {"path": "/x"}) is True
                    # manual safe mode never leaves by itself
                    status = await rpc.call("safemode", {"action": "enter"})
                    assert status["on"] and status["manual"]
                    await node.report([[b["id"], b["gs"], b["num_bytes"], "FINALIZED"]
                                       for b in blocks + more])
                    # fixed-sleep: manual safe mode staying on is a non-event; the safe
                    # mode monitor counts no passes that the test could wait for instead
                    await trio.sleep(0.3)
                    assert (await rpc.call("safemode"))["on"] is True
                    with pytest.raises(errors.SafeMode, match="manually"):
                        await rpc.call("create", {"path": "/y", "client_name": "w"})
                    assert (await rpc.call("safemode", {"action": "leave"}))["on"] is False
                    await rpc.call("create", {"path": "/y", "client_name": "w"})

    await main()


async def test_safe_mode_extension_waits_after_threshold(tmp_path):
    async def main():
        async with meta_server(tmp_path, safemode_extension=0.6) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                _, blocks = await write_file(rpc, [node], "/f", [100])
                await meta.restart()
                await node.register()
                await node.report([[b["id"], b["gs"], b["num_bytes"], "FINALIZED"] for b in blocks])
                status = await rpc.call("safemode")
                assert status["on"] and "turned off automatically" in status["reason"]
                async def safemode_off():
                    return not (await rpc.call("safemode"))["on"]

                assert await wait_until(safemode_off, timeout=10)

    await main()


# --------------------------------------------------------------------------- deletion


async def test_delete_sends_invalidations_at_most_limit_per_heartbeat(tmp_path):
    async def main():
        async with meta_server(tmp_path, invalidate_limit=3, replication=2) as meta:
            async with meta.client("storage-a") as ra, meta.client("storage-b") as rb, \
                    meta.client() as rpc:
                a, b = FakeNode(ra, "node-a", 9001), FakeNode(rb, "node-b", 9002)
                await a.register()
                await b.register()
                ids = set()
                for i in range(7):
                    _, blocks = await write_file(rpc, [a, b], f"/doomed/f{i}", [10 + i])
                    ids |= {blk["id"] for blk in blocks}
                assert (await a.heartbeat())["commands"] == []
                assert await rpc.call("delete", {"path": "/doomed", "recursive": True})
                with pytest.raises(errors.FileNotFound):
                    await rpc.call("get_file_info", {"path": "/doomed/f0"})
                report = await rpc.call("report")
                assert report["pending_deletion"] == 14 and report["blocks"] == 0
                for node in (a, b):
                    seen = []
                    for _ in range(4):
                        reply = await node.heartbeat()
                        assert not reply["reregister"]
                        for command in reply["commands"]:
                            assert command["type"] == "INVALIDATE"
                            assert len(command["blocks"]) <= 3
                            seen += [blk["id"] for blk in command["blocks"]]
                    assert sorted(seen) == sorted(ids), node.node_id
                # handed out but not yet reported deleted: still pending, never sent twice
                # within the resend timeout
                assert (await rpc.call("report"))["pending_deletion"] == 14
                assert (await a.heartbeat())["commands"] == []
                # a reports them deleted one by one, b by a full report without them
                await ra.call("block_received_and_deleted", {
                    "node_id": "node-a", "received": [], "deleted": sorted(ids)})
                assert (await rpc.call("report"))["pending_deletion"] == 7
                await b.report([])
                assert (await rpc.call("report"))["pending_deletion"] == 0
                # a replica of a block that belongs to no file is invalidated when reported
                await a.report([[999_999, 1, 5, "FINALIZED"]])
                reply = await a.heartbeat()
                assert reply["commands"] == [{"type": "INVALIDATE", "blocks": [
                    {"id": 999_999, "gs": 1, "num_bytes": 5}]}]

    await main()


async def test_dead_block_server_is_detected_and_must_reregister(tmp_path):
    async def main():
        async with meta_server(tmp_path, dead_node_interval=0.6) as meta:
            async with meta.client("storage-a") as ra, meta.client("storage-b") as rb, \
                    meta.client() as rpc:
                a, b = FakeNode(ra, "node-a", 9001), FakeNode(rb, "node-b", 9002)
                await a.register()
                await b.register()
                _, blocks = await write_file(rpc, [a], "/f", [10])
                async def keep_beating():      # b keeps beating, a falls silent
                    while True:
                        await b.heartbeat()
                        await trio.sleep(0.1)

                async def a_declared_dead():
                    report = await rpc.call("report")
                    return report if report["dead_nodes"] else None

                async with trio.open_nursery() as beats:
                    beats.start_soon(keep_beating)
                    report = await wait_until(a_declared_dead, timeout=10)
                    beats.cancel_scope.cancel()
                assert [n["node_id"] for n in report["live_nodes"]] == ["node-b"]
                assert [n["node_id"] for n in report["dead_nodes"]] == ["node-a"]
                assert report["missing"] == 1
                located = await rpc.call("get_block_locations", {"path": "/f"})
                assert located["blocks"][0]["locations"] == []
                assert (await a.heartbeat()) == {"reregister": True, "commands": []}
                await a.register()
                await a.report([[blocks[0]["id"], blocks[0]["gs"], 10, "FINALIZED"]])
                located = await rpc.call("get_block_locations", {"path": "/f"})
                assert [loc["node_id"] for loc in located["blocks"][0]["locations"]] == ["node-a"]
                # placement honours excluded nodes (by id or address)
                st = await rpc.call("create", {"path": "/g", "client_name": "w"})
                lb = await rpc.call("add_block", {"path": "/g", "client_name": "w",
                                                  "ino": st["ino"], "excluded": [a.address]})
                assert [loc["node_id"] for loc in lb["locations"]] == ["node-b"]
                assert await rpc.call("abandon_block", {"path": "/g", "client_name": "w",
                                                        "ino": st["ino"], "block": lb["block"]})
                with pytest.raises(errors.NoSpace):
                    await rpc.call("add_block", {"path": "/g", "client_name": "w",
                                                 "ino": st["ino"],
                                                 "excluded": ["node-a", "node-b"]})

    await main()


async def test_report_bad_blocks_hides_the_corrupt_replica(tmp_path):
    async def main():
        async with meta_server(tmp_path, replication=2) as meta:
            async with meta.client("storage-a") as ra, meta.client("storage-b") as rb, \
                    meta.client() as rpc:
                a, b = FakeNode(ra, "node-a", 9001), FakeNode(rb, "node-b", 9002)
                await a.register()
                await b.register()
                _, blocks = await write_file(rpc, [a, b], "/f", [10])
                await rpc.call("report_bad_blocks", {"blocks": [
                    {"block": blocks[0], "node_id": "node-a"}]})
                located = await rpc.call("get_block_locations", {"path": "/f"})
                assert [loc["node_id"] for loc in located["blocks"][0]["locations"]] == ["node-b"]
                assert (await rpc.call("report"))["corrupt"] == 1
                # the only remaining copy is corrupt too: handed out, flagged corrupt
                await rpc.call("report_bad_blocks", {"blocks": [
                    {"block": blocks[0], "node_id": "node-b"}]})
                located = await rpc.call("get_block_locations", {"path": "/f"})
                assert located["blocks"][0]["corrupt"] is True
                assert len(located["blocks"][0]["locations"]) == 2

    await main()


# --------------------------------------------------------------------------- restart


async def test_restart_keeps_namespace_leases_and_blocks(tmp_path):
    async def main():
        async with meta_server(tmp_path, checkpoint_period=0.3, journal_keep_segments=1) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                await rpc.call("mkdirs", {"path": "/a/b/c", "permission": 0o700})
                _, blocks = await write_file(rpc, [node], "/a/file", [64 * KiB, 5])
                await rpc.call("create_symlink", {"target": "/a/file", "path": "/a/link"})
                await rpc.call("set_permission", {"path": "/a/file", "permission": 0o600})
                open_st = await rpc.call("create", {"path": "/a/open", "client_name": "w-open"})
                lb = await rpc.call("add_block", {"path": "/a/open", "client_name": "w-open",
                                                  "ino": open_st["ino"]})
                await rpc.call("fsync", {"path": "/a/open", "client_name": "w-open",
                                         "ino": open_st["ino"], "last_block_length": 1234})
                last = (await rpc.call("report"))["journal"]["last_txid"]

                async def checkpointed():   # a checkpoint after the last change rolled
                    cp = (await rpc.call("report"))["checkpoint"]   # and purged the journal
                    return cp["txid"] >= last

                assert await wait_until(checkpointed, timeout=10)
                for i in range(5):
                    await rpc.call("mkdirs", {"path": f"/after/{i}"})
                before = await tree(rpc)
                summary = await rpc.call("content_summary", {"path": "/a"})
                segments = sorted(os.listdir(tmp_path / "meta" / "journal"))
                assert any(s.startswith("edits_0") for s in segments)

                await meta.restart()
                assert await tree(rpc) == before
                assert await rpc.call("content_summary", {"path": "/a"}) == summary
                assert summary["length"] == 64 * KiB + 5 + 1234 and summary["file_count"] == 2
                info = await rpc.call("get_file_info", {"path": "/a/open"})
                assert info["under_construction"] and info["length"] == 1234
                await node.register()
                await node.report([[b["id"], b["gs"], b["num_bytes"], "FINALIZED"]
                                   for b in blocks] + [[lb["block"]["id"], lb["block"]["gs"],
                                                        1234, "RBW"]])
                assert (await rpc.call("safemode"))["on"] is False
                # the lease was rebuilt: another client may not take the file
                with pytest.raises(errors.AlreadyBeingCreated, match="w-open"):
                    await rpc.call("create", {"path": "/a/open", "client_name": "thief"})
                # the writer continues after the restart
                prev = {**lb["block"], "num_bytes": 2000}
                await node.received(lb["block"], 2000)
                assert await rpc.call("complete", {"path": "/a/open", "client_name": "w-open",
                                                   "ino": open_st["ino"], "last": prev})
                located = await rpc.call("get_block_locations", {"path": "/a/file"})
                assert [lb["block"]["num_bytes"] for lb in located["blocks"]] == [64 * KiB, 5]
                assert all(lb["locations"] for lb in located["blocks"])
        assert_store_consistent(tmp_path)

    await main()


async def test_complete_records_the_writers_times_and_a_restart_keeps_them(tmp_path):
    """A writer that set times and mode while it wrote (utimens, chmod through the mount)
    hands them to ``complete``: the close records them (the times instead of its own) in
    the same journal record, so the replay has them too; bad values are refused and the
    file stays open."""
    stamp = 1_400_000_000 * 10**9

    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                st = await rpc.call("create", {"path": "/t", "client_name": "w"})
                lb = await rpc.call("add_block", {"path": "/t", "client_name": "w",
                                                  "ino": st["ino"]})
                await node.received(lb["block"], 10)
                last = {**lb["block"], "num_bytes": 10}
                with pytest.raises(errors.InvalidArgument, match="mtime_ns"):
                    await rpc.call("complete", {"path": "/t", "client_name": "w",
                                                "ino": st["ino"], "last": last,
                                                "mtime_ns": "soon"})
                assert (await rpc.call("get_file_info", {"path": "/t"}))["under_construction"]
                assert await rpc.call("complete", {"path": "/t", "client_name": "w",
                                                   "ino": st["ino"], "last": last,
                                                   "mtime_ns": stamp, "atime_ns": stamp + 5,
                                                   "permission": 0o640})
                await write_file(rpc, [node], "/own-time", [7])
                want = await rpc.call("get_file_info", {"path": "/t"})
                assert (want["mtime_ns"], want["atime_ns"], want["mode"]) == (stamp, stamp + 5,
                                                                             0o640)
                assert not want["under_construction"] and want["length"] == 10
                own = await rpc.call("get_file_info", {"path": "/own-time"})
                assert own["mtime_ns"] > 1_700_000_000 * 10**9   # its completion's own time
                await meta.restart()
                assert await rpc.call("get_file_info", {"path": "/t"}) == want
        assert_store_consistent(tmp_path)

    await main()


async def test_concurrent_mutations_share_fsyncs_and_stay_consistent(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client() as rpc:
                await rpc.call("mkdirs", {"path": "/shared"})
                start = (await rpc.call("report"))["journal"]

                async def worker(i):
                    await rpc.call("mkdirs", {"path": f"/own{i}/sub"})
                    await rpc.call("create", {"path": f"/shared/f{i}", "client_name": f"c{i}"})
                    await rpc.call("rename", {"src": f"/own{i}/sub", "dst": f"/own{i}/moved"})

                async with trio.open_nursery() as nursery:
                    for i in range(30):
                        nursery.start_soon(worker, i)
                end = (await rpc.call("report"))["journal"]
                records = end["records"] - start["records"]
                assert records == 90
                assert end["fsyncs"] - start["fsyncs"] < records
                page = await rpc.call("list_status", {"path": "/shared"})
                assert len(page["entries"]) == 30
                for i in range(30):
                    info = await rpc.call("get_file_info", {"path": f"/own{i}/moved"})
                    assert info["type"] == "dir"
        assert_store_consistent(tmp_path)

    await main()


async def test_status_page_serves_the_report(tmp_path):
    async def main():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            http_port = probe.getsockname()[1]
        config = Config.load(env={}, **BASE)
        async with trio.open_nursery() as nursery:
            meta = Meta(nursery, tmp_path / "meta", config)
            await meta.start(http_port=http_port)
            stream = await trio.open_tcp_stream("127.0.0.1", http_port)
            # the JSON for scripts (the page at / is HTML)
            await stream.send_all(b"GET /report HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.split(b"\r\n")[0].split()[1] == b"200"
            assert b"application/json" in head.lower()
            report = json.loads(body)
            assert report["schema_version"] == 1 and "safemode" in report \
                and "live_nodes" in report
            nursery.cancel_scope.cancel()

    await main()


async def test_racing_mutations_on_the_same_names_serialise_correctly(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client() as rpc:
                outcomes = []

                async def create(i):
                    try:
                        await rpc.call("create", {"path": "/same", "client_name": f"c{i}"})
                        outcomes.append("ok")
                    except errors.AlreadyBeingCreated:
                        outcomes.append("busy")

                async def mkdirs(i):
                    assert await rpc.call("mkdirs", {"path": f"/p/q/r{i % 3}/s{i}"})

                async with trio.open_nursery() as nursery:
                    for i in range(20):
                        nursery.start_soon(create, i)
                        nursery.start_soon(mkdirs, i)
                assert sorted(outcomes) == ["busy"] * 19 + ["ok"]
                q = await rpc.call("list_status", {"path": "/p/q"})
                assert [e["name"] for e in q["entries"]] == ["r0", "r1", "r2"]
                assert sum(e["children"] for e in q["entries"]) == 20

                # a recursive delete racing creates inside the directory: every create
                # either lands before the delete (and is deleted) or fails cleanly after it
                await rpc.call("mkdirs", {"path": "/victim"})
                results = []

                async def create_inside(i):
                    try:
                        await rpc.call("create", {"path": f"/victim/f{i}", "client_name": "c",
                                                  "create_parent": False})
                        results.append("created")
                    except errors.FileNotFound:
                        results.append("gone")

                async with trio.open_nursery() as nursery:
                    for i in range(10):
                        nursery.start_soon(create_inside, i)
                    nursery.start_soon(rpc.call, "delete", {"path": "/victim", "recursive": True})
                    for i in range(10, 20):
                        nursery.start_soon(create_inside, i)
                assert len(results) == 20
                with pytest.raises(errors.FileNotFound):
                    await rpc.call("get_file_info", {"path": "/victim"})
                assert (await rpc.call("report"))["open_files"] == 1   # only /same
        assert_store_consistent(tmp_path)

    await main()


# --------------------------------------------------------------------------- review fixes


async def test_lost_heartbeat_reply_invalidations_are_sent_again(tmp_path):
    """Finding 15: INVALIDATE refs whose heartbeat reply was lost go out again after
    10 heartbeat intervals, until the block server reports the replicas deleted."""
    async def main():
        async with meta_server(tmp_path, heartbeat_interval=0.05) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                a = FakeNode(ra, "node-a", 9001)
                await a.register()
                _, blocks = await write_file(rpc, [a], "/gone", [10, 20])
                assert await rpc.call("delete", {"path": "/gone"})
                first = (await a.heartbeat())["commands"]   # this reply is "lost"
                assert [c["type"] for c in first] == ["INVALIDATE"]
                refs = sorted(b["id"] for b in first[0]["blocks"])
                assert refs == sorted(b["id"] for b in blocks)
                assert (await a.heartbeat())["commands"] == []   # not before the timeout
                assert (await rpc.call("report"))["pending_deletion"] == 2
                async def resent():
                    return (await a.heartbeat())["commands"]

                again = await wait_until(resent, timeout=10)
                assert [c["type"] for c in again] == ["INVALIDATE"]
                assert sorted(b["id"] for b in again[0]["blocks"]) == refs
                # now the node deletes them and says so: nothing more is sent
                await ra.call("block_received_and_deleted", {
                    "node_id": "node-a", "received": [], "deleted": refs})
                assert (await rpc.call("report"))["pending_deletion"] == 0
                # fixed-sleep: past the resend timeout nothing is sent again; not sending
                # is a non-event (the pending count, already 0, cannot show more)
                await trio.sleep(0.05 * 10 + 0.1)
                assert (await a.heartbeat())["commands"] == []

    await main()


async def test_block_limits_are_enforced_by_create_and_add_block(tmp_path):
    async def main():
        async with meta_server(tmp_path, max_blocks_per_file=2, min_block_size=32 * KiB) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                a = FakeNode(ra, "node-a", 9001)
                await a.register()
                with pytest.raises(errors.InvalidArgument,
                                   match=r"/tiny.*min_block_size 32768"):
                    await rpc.call("create", {"path": "/tiny", "client_name": "w",
                                              "block_size": 16 * KiB})
                assert (await rpc.call("list_status", {"path": "/"}))["entries"] == []
                st = await rpc.call("create", {"path": "/two", "client_name": "w"})
                previous = None
                for _ in range(2):
                    lb = await rpc.call("add_block", {"path": "/two", "client_name": "w",
                                                      "ino": st["ino"], "previous": previous})
                    await a.received(lb["block"], 64 * KiB)
                    previous = {**lb["block"], "num_bytes": 64 * KiB}
                with pytest.raises(errors.InvalidArgument,
                                   match=r"/two.*max_blocks_per_file is 2"):
                    await rpc.call("add_block", {"path": "/two", "client_name": "w",
                                                 "ino": st["ino"], "previous": previous})
                # the refused call changed nothing: the file still closes with two blocks
                assert await rpc.call("complete", {"path": "/two", "client_name": "w",
                                                   "ino": st["ino"], "last": previous})
                info = await rpc.call("get_file_info", {"path": "/two"})
                assert info["length"] == 128 * KiB and not info["under_construction"]

    await main()


async def test_writer_calls_cost_the_same_at_block_5_and_block_60(tmp_path):
    """Finding 8: add_block, fsync, complete and a ranged get_block_locations read a bounded
    number of block keys however many blocks the file has (they used to scan them all)."""
    from meta.server import MetaServer
    from fs.rpc import CallContext

    class CountingStore:
        def __init__(self, inner):
            self.inner, self.block_reads = inner, 0

        def get(self, key):
            self.block_reads += key[:1] == b"B"
            return self.inner.get(key)

        def scan(self, prefix, start=None, limit=None):
            for key, value in self.inner.scan(prefix, start=start, limit=limit):
                self.block_reads += key[:1] == b"B"
                yield key, value

        def __getattr__(self, name):
            return getattr(self.inner, name)

    async def main():
        config = Config.load(env={}, **BASE)
        kv = PlyvelStore(str(tmp_path / "db"))
        server = MetaServer(config, kv, str(tmp_path / "journal"))
        server.recover()
        ctx = CallContext(client_id="w", peer="127.0.0.1:5000", call_id=None)
        full = 64 * KiB
        costs = []
        async with trio.open_nursery() as nursery:
            await nursery.start(server.journal.run)
            await server.start()
            dn = server.datanode_protocol
            counting = server.ns.kv = CountingStore(kv)
            await dn.rpc_register_storage(ctx, "node-a", "127.0.0.1:9001", 1 << 40, 0,
                                          1 << 40)
            st = await server.client_protocol.rpc_create(ctx, "/long", "w")
            previous = None
            for i in range(60):
                counting.block_reads = 0
                lb = await server.client_protocol.rpc_add_block(ctx, "/long", "w", ino=st["ino"],
                                                                previous=previous)
                assert lb["offset"] == i * full
                await server.client_protocol.rpc_fsync(ctx, "/long", "w", ino=st["ino"],
                                                       last_block_length=100)
                ranged = await server.client_protocol.rpc_get_block_locations(
                    ctx, "/long", offset=i * full, length=10)
                assert [b["block"]["id"] for b in ranged["blocks"]] == [lb["block"]["id"]]
                costs.append(counting.block_reads)
                await dn.rpc_block_received_and_deleted(
                    ctx, "node-a", received=[[lb["block"]["id"], lb["block"]["gs"], full,
                                              "FINALIZED"]])
                previous = {**lb["block"], "num_bytes": full}
            counting.block_reads = 0
            assert await server.client_protocol.rpc_complete(ctx, "/long", "w", ino=st["ino"],
                                                             last=previous)
            assert counting.block_reads <= 8
            located = await server.client_protocol.rpc_get_block_locations(ctx, "/long")
            assert [b["offset"] for b in located["blocks"]] == [i * full for i in range(60)]
            nursery.cancel_scope.cancel()
        await server.journal.aclose()
        kv.close()
        assert costs[5] == costs[-1] and max(costs) <= 16, costs

    await main()


# --------------------------------------------------------------------------- big deletes


async def test_big_delete_returns_at_once_and_is_reclaimed_while_other_calls_are_served(tmp_path):
    """2000 open files with a replica each, delete_chunk 50: the path is gone when delete
    returns (leases too); RECLAIM records remove the rest in the background while other
    calls are answered between them (a report sees a half-reclaimed count), and every
    replica comes out as an INVALIDATE command."""
    n = 2000

    async def main():
        async with meta_server(tmp_path, delete_chunk=50, dead_node_interval=120.0) as meta:
            async with meta.client("storage-a") as ra, meta.client() as rpc:
                node = FakeNode(ra, "node-a", 9001)
                await node.register()
                await rpc.call("mkdirs", {"path": "/other"})
                replicas = []

                async def make(i):
                    path = f"/big/d{i % 20}/f{i}"
                    st = await rpc.call("create", {"path": path, "client_name": f"w{i % 7}"})
                    lb = await rpc.call("add_block", {"path": path, "client_name": f"w{i % 7}",
                                                      "ino": st["ino"]})
                    replicas.append([lb["block"]["id"], lb["block"]["gs"], 10, "RBW"])

                for start in range(0, n, 200):
                    async with trio.open_nursery() as nursery:
                        for i in range(start, start + 200):
                            nursery.start_soon(make, i)
                await node.report(replicas)
                before = await rpc.call("report")
                assert before["files"] == n and before["open_files"] == n
                assert before["blocks"] == n

                assert await rpc.call("delete", {"path": "/big", "recursive": True})
                with pytest.raises(errors.FileNotFound):
                    await rpc.call("get_file_info", {"path": "/big/d3/f3"})
                assert (await rpc.call("list_status", {"path": "/"}))["entries"][0]["name"] \
                    == "other"
                after_delete = await rpc.call("report")
                assert after_delete["open_files"] == 0    # leases ended with the detach
                seen_files = [after_delete["files"]]
                served = 0
                # a hang guard, not a speed limit: it fails only when the reclaim stops
                # making progress (on a loaded machine the whole reclaim takes minutes)
                stalled = Stall(30.0)
                while True:
                    await rpc.call("get_file_info", {"path": "/other"})
                    served += 1
                    current = await rpc.call("report")
                    seen_files.append(current["files"])
                    # reclaimed: files and blocks go first, the emptied folders after
                    # (one RECLAIM record may still hold folders when files reach 0)
                    if current["blocks"] == 0 and current["files"] == 0 \
                            and current["directories"] == 2:
                        break
                    stalled.check((current["files"], current["blocks"],
                                   current["directories"]), "reclaim")
                assert served > 0
                # RPCs were answered while the reclaim was half done
                assert any(0 < files < n for files in seen_files), seen_files[:5]
                # counted from before the delete (the reclaimer may already have written a
                # record by the time after_delete was taken); minus the DELETE record itself
                records = current["journal"]["records"] - before["journal"]["records"] - 1
                assert records >= (2 * n + 21) // 50
                assert current["pending_deletion"] == n
                invalidated = []
                stalled = Stall(30.0)
                while len(invalidated) < n:
                    for command in (await node.heartbeat())["commands"]:
                        assert command["type"] == "INVALIDATE"
                        invalidated += [b["id"] for b in command["blocks"]]
                    stalled.check(len(invalidated), "invalidation")
                assert sorted(invalidated) == sorted(r[0] for r in replicas)

    await main()


async def test_reclaimer_pauses_in_safe_mode_and_finishes_after_a_restart(tmp_path):
    from fs.rpc import CallContext
    from meta.server import MetaServer

    async def main():
        config = Config.load(env={}, **{**BASE, "delete_chunk": 5})
        kv = PlyvelStore(str(tmp_path / "meta" / "db"))
        server = MetaServer(config, kv, str(tmp_path / "meta" / "journal"))
        server.recover()
        ctx = CallContext(client_id="w", peer="127.0.0.1:5000", call_id=None)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.journal.run)
                await server.start()
                for i in range(20):
                    st = await server.client_protocol.rpc_create(ctx, f"/t/d{i % 4}/f{i}", "w")
                    assert await server.client_protocol.rpc_complete(ctx, f"/t/d{i % 4}/f{i}", "w",
                                                                     ino=st["ino"])
                await server.client_protocol.rpc_create(ctx, "/keep", "w")
                await server.namespace_protocol.rpc_delete(ctx, "/t", recursive=True)
                assert server.ns.reclaim.has_orphans() and server.ns.view.file_count() == 21
                await server.admin_protocol.rpc_safemode(ctx, "enter")
                nursery.start_soon(server.monitors.run_reclaimer)
                # fixed-sleep: several monitor periods in which nothing may be reclaimed;
                # the reclaim monitor counts no idle passes an event could show
                await trio.sleep(0.5)
                assert server.monitors.reclaim_records == 0 and server.ns.view.file_count() == 21
                assert await server.monitors.reclaim_once() and await server.monitors.reclaim_once()
                assert server.ns.reclaim.has_orphans()
                nursery.cancel_scope.cancel()
        finally:
            await server.journal.aclose()
            kv.close()

        # a crash with the orphan half reclaimed: the restarted server finishes the job
        async with meta_server(tmp_path, delete_chunk=5) as meta:
            async with meta.client() as rpc:
                with trio.fail_after(20):
                    while (report := await rpc.call("report"))["files"] != 1:
                        await trio.sleep(0.05)
                assert report["directories"] == 1 and report["open_files"] == 1
                assert (await rpc.call("get_file_info", {"path": "/keep"}))[
                    "under_construction"]
        reopened = PlyvelStore(str(tmp_path / "meta" / "db"))
        try:
            assert check_namespace(reopened) == []
            assert list(reopened.scan(b"O")) == []
        finally:
            reopened.close()

    await main()


# --------------------------------------------------------------------------- chunked reports


@asynccontextmanager
async def inprocess_meta(folder, **overrides):
    """A MetaServer object on ``folder`` with its journal running (no RPC, no monitors)."""
    from meta.server import MetaServer

    config = Config.load(env={}, **{**BASE, **overrides})
    kv = PlyvelStore(str(folder / "db"))
    server = MetaServer(config, kv, str(folder / "journal"))
    server.recover()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.journal.run)
            await server.start()
            yield server
            nursery.cancel_scope.cancel()
    finally:
        await server.journal.aclose()
        kv.close()


async def _files_with_complete_blocks(server, ctx, n_files) -> list[list]:
    """node-a holds every block; returns report entries of them (as node-b would send)."""
    dn = server.datanode_protocol
    await dn.rpc_register_storage(ctx, "node-a", "127.0.0.1:9001", 1 << 40, 0, 1 << 40)
    entries = []
    for i in range(n_files):
        path = f"/f{i}"
        st = await server.client_protocol.rpc_create(ctx, path, "w")
        previous = None
        for size in (100, 50):
            lb = await server.client_protocol.rpc_add_block(ctx, path, "w", ino=st["ino"],
                                                            previous=previous)
            block = lb["block"]
            await dn.rpc_block_received_and_deleted(
                ctx, "node-a", received=[[block["id"], block["gs"], size, "FINALIZED"]])
            previous = {**block, "num_bytes": size}
            entries.append([block["id"], block["gs"], size, "FINALIZED"])
        assert await server.client_protocol.rpc_complete(ctx, path, "w", ino=st["ino"],
                                                         last=previous)
    return entries


def _blocks_state(server) -> tuple:
    m = server.blocks
    blocks = {bid: (i.state, i.gs, i.num_bytes, sorted(i.expected),
                    {n: (r.gs, r.num_bytes, r.state, r.verdict, r.reported_bad)
                     for n, r in sorted(i.replicas.items())})
              for bid, i in m.blocks.items()}
    return (blocks, {n: sorted(ids) for n, ids in m.by_node.items()},
            (m.total_countable, m.safe, m.counts()),
            {n.node_id: (sorted(n.invalidate), sorted(n.awaiting_deletion))
             for n in server.datanodes.nodes.values()})


async def test_chunked_block_report_equals_one_call_and_removes_only_at_last(tmp_path, monkeypatch):
    from fs.rpc import CallContext
    import meta.server as meta_server_module

    monkeypatch.setattr(meta_server_module, "REPORT_STEP", 2)   # checkpoints inside chunks
    ctx = CallContext(client_id="storage-b", peer="127.0.0.1:5000", call_id=None)

    def node_b_report(entries):
        # one corrupt replica (wrong length), one stale RBW, one of no file
        out = [list(e) for e in entries]
        out[1][2] += 1
        out[2][1] -= 1
        out[2][3] = "RBW"
        return out + [[999_999, 1, 7, "FINALIZED"]]

    async def main():
        states = {}
        for name in ("one_call", "chunked"):
            async with inprocess_meta(tmp_path / name) as server:
                dn = server.datanode_protocol
                entries = await _files_with_complete_blocks(server, ctx, 5)
                await dn.rpc_register_storage(ctx, "node-b", "127.0.0.1:9002", 1, 0, 1)
                report = node_b_report(entries)
                if name == "one_call":
                    assert await dn.rpc_block_report(ctx, "node-b", report)
                else:
                    pieces = [report[i:i + 3] for i in range(0, len(report), 3)]
                    for k, piece in enumerate(pieces):
                        assert await dn.rpc_block_report(
                            ctx, "node-b", piece, report_id="r1", chunk=k,
                            last=k == len(pieces) - 1)
                states[name] = _blocks_state(server)
                if name != "chunked":
                    continue
                held = lambda: set(server.blocks.by_node["node-b"])   # noqa: E731
                assert held() == {e[0] for e in entries}
                gone = entries[4][0]
                rest = [e for e in report if e[0] != gone]
                # a replica missing from a chunked report is removed only at ``last``
                await dn.rpc_block_report(ctx, "node-b", rest[:4], report_id="r2",
                                          chunk=0, last=False)
                await dn.rpc_block_report(ctx, "node-b", rest[4:], report_id="r2",
                                          chunk=1, last=False)
                assert gone in held()
                await dn.rpc_block_report(ctx, "node-b", [], report_id="r2", chunk=2,
                                          last=True)
                assert gone not in held() and len(held()) == len(entries) - 1
                before = held()
                # a report abandoned by a newer one, or by re-registration, removes nothing
                await dn.rpc_block_report(ctx, "node-b", rest[:1], report_id="r3",
                                          chunk=0, last=False)
                await dn.rpc_block_report(ctx, "node-b", rest[:1], report_id="r4",
                                          chunk=0, last=False)
                with pytest.raises(errors.InvalidArgument, match="r3"):
                    await dn.rpc_block_report(ctx, "node-b", [], report_id="r3",
                                              chunk=1, last=True)
                await dn.rpc_register_storage(ctx, "node-b", "127.0.0.1:9002", 1, 0, 1)
                with pytest.raises(errors.InvalidArgument, match="r4"):
                    await dn.rpc_block_report(ctx, "node-b", [], report_id="r4",
                                              chunk=1, last=True)
                # chunks out of order are refused (and void the report)
                await dn.rpc_block_report(ctx, "node-b", rest[:1], report_id="r5",
                                          chunk=0, last=False)
                with pytest.raises(errors.InvalidArgument, match="expected chunk 1"):
                    await dn.rpc_block_report(ctx, "node-b", [], report_id="r5",
                                              chunk=2, last=True)
                assert held() == before
                with pytest.raises(errors.InvalidArgument):
                    await dn.rpc_block_report(ctx, "node-b", [], report_id="r6",
                                              chunk=0, last="yes")
        assert states["chunked"] == states["one_call"]
        blocks, by_node, counters, invalidate = states["one_call"]
        # the corrupt replicas have a good copy elsewhere: they go, with the no-file one
        assert counters[2]["corrupt"] == 2
        assert invalidate["node-b"][0] == sorted([entries[1][0], entries[2][0], 999_999])

    await main()


async def test_safe_mode_counts_report_chunks_as_they_arrive(tmp_path):
    from fs.rpc import CallContext

    ctx = CallContext(client_id="storage-a", peer="127.0.0.1:5000", call_id=None)

    async def main():
        async with inprocess_meta(tmp_path / "m") as server:
            entries = await _files_with_complete_blocks(server, ctx, 3)
        async with inprocess_meta(tmp_path / "m", safemode_extension=30.0) as server:
            dn = server.datanode_protocol
            assert server.safemode.on and server.blocks.total_countable == 6
            await dn.rpc_register_storage(ctx, "node-a", "127.0.0.1:9001", 1, 0, 1)
            await dn.rpc_block_report(ctx, "node-a", entries[:4], report_id="x", chunk=0,
                                      last=False)
            assert server.blocks.safe == 4
            assert "reported blocks 4" in server.safemode.reason
            await dn.rpc_block_report(ctx, "node-a", entries[4:], report_id="x", chunk=1,
                                      last=False)
            assert "reported blocks 6 reached the threshold" in server.safemode.reason

    await main()


# --------------------------------------------------------------------------- rename_many


async def test_rename_many_publishes_a_set_at_once_and_refuses_ambiguous_sets(tmp_path):
    """A job commit: old outputs into a trash folder and new ones in their place, as one
    journal record. A lister polling meanwhile only ever sees the old set or the new set
    (per-file renames would show mixes); bad requests change nothing."""
    async def names(rpc, path):
        return sorted(e["name"] for e in (await rpc.call("list_status", {"path": path}))["entries"])

    async def txid(rpc):
        return (await rpc.call("report"))["journal"]["last_txid"]

    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client() as rpc, meta.client("lister") as lister:
                old = [f"part-{i:03d}" for i in range(40)]
                for name in old:
                    await write_file(rpc, [], f"/out/{name}", [])
                seen = []
                done = trio.Event()

                async def watch():
                    while not done.is_set():
                        seen.append(tuple(await names(lister, "/out")))
                        await trio.sleep(0)

                generations = [old]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch)
                    for job in range(6):
                        new = [f"part-{job}-{i:03d}" for i in range(40 if job % 2 else 20)]
                        for name in new:
                            await write_file(rpc, [], f"/stage/j{job}/{name}", [])
                        await rpc.call("mkdirs", {"path": f"/trash/j{job}"})
                        moves = [[f"/out/{n}", f"/trash/j{job}/{n}"] for n in generations[-1]]
                        moves += [[f"/stage/j{job}/{n}", f"/out/{n}", True] for n in new]
                        before = await txid(rpc)
                        assert await rpc.call("rename_many", {"moves": moves}) is True
                        assert await txid(rpc) == before + 1   # one record for the whole set
                        generations.append(new)
                        # fixed-sleep: paces the jobs so that the watcher lists between them
                        await trio.sleep(0.01)
                    done.set()
                allowed = {tuple(sorted(g)) for g in generations}
                assert len(seen) > 20
                assert all(s in allowed for s in seen), \
                    next(s for s in seen if s not in allowed)
                assert await names(rpc, "/out") == sorted(generations[-1])
                assert await names(rpc, "/trash/j5") == sorted(generations[-2])

                # a destination freed by an earlier move of the same call, with overwrite off
                await write_file(rpc, [], "/swap/a", [])
                await write_file(rpc, [], "/swap/b", [])
                a_ino = (await rpc.call("get_file_info", {"path": "/swap/a"}))["ino"]
                b_ino = (await rpc.call("get_file_info", {"path": "/swap/b"}))["ino"]
                await rpc.call("rename_many", {"moves": [["/swap/a", "/swap/t"],
                                                         ["/swap/b", "/swap/a"]]})
                assert (await rpc.call("get_file_info", {"path": "/swap/a"}))["ino"] == b_ino
                assert (await rpc.call("get_file_info", {"path": "/swap/t"}))["ino"] == a_ino
                assert await names(rpc, "/swap") == ["a", "t"]

                # refused requests change nothing and journal nothing
                await write_file(rpc, [], "/bad/x", [])
                await write_file(rpc, [], "/bad/y", [])
                await rpc.call("mkdirs", {"path": "/bad/d"})
                await write_file(rpc, [], "/bad/d/z", [])
                state, before = await tree(rpc), await txid(rpc)
                refused = [
                    ([["/bad/x", "/bad/p"], ["/bad/x", "/bad/q"]], errors.InvalidArgument),
                    ([["/bad/x", "/bad/p"], ["/bad/y", "/bad/p"]], errors.InvalidArgument),
                    ([["/bad/d", "/bad/e"], ["/bad/d/z", "/bad/zz"]], errors.InvalidArgument),
                    ([["/bad/x", "/bad/y", True], ["/bad/y", "/bad/w"]], errors.InvalidArgument),
                    ([["/bad/x", "/bad/t"], ["/bad/t", "/bad/w"]], errors.InvalidArgument),
                    ([["/bad/x", "/bad/y", True], ["/bad/d/z", "/bad/y/q"]],
                     errors.InvalidArgument),
                    ([["/bad/x", "/bad/p"], ["/bad/missing", "/bad/q"]], errors.FileNotFound),
                    ([["/bad/x", "/bad/p"], ["/bad/y", "/bad/d/z"]], errors.FileExists),
                    ([["/bad/x"]], errors.InvalidArgument),
                    ([], errors.InvalidArgument),
                    ("/bad/x", errors.InvalidArgument),
                    ([["/bad/x", 7]], errors.InvalidArgument),
                    ([["/bad/x", "/bad/p", "yes"]], errors.InvalidArgument),
                    ([["/bad/x", f"/bad/p{i}"] for i in range(10_001)], errors.InvalidArgument),
                ]
                for moves, error in refused:
                    with pytest.raises(error):
                        await rpc.call("rename_many", {"moves": moves})
                assert await tree(rpc) == state and await txid(rpc) == before

                # the retry cache answers a repeated call id without applying it twice
                await rpc.call("mkdirs", {"path": "/rc"})
                args = {"moves": [["/bad/x", "/rc/x"]]}
                assert await rpc.call_once("rename_many", args, 7000, 10) is True
                assert await rpc.call_once("rename_many", args, 7000, 10) is True
                final = await tree(rpc)
            await meta.restart()   # the RENAMES records replay to the same namespace
            async with meta.client() as rpc:
                assert await tree(rpc) == final
        assert_store_consistent(tmp_path)

    await main()
