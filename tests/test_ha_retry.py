"""The retry cache survives a restart and a failover (HDFS: edit-log ops carry the call's
rpcClientId/rpcCallId, and a standby fills its retry cache while tailing them).

A call is sent with a fixed ``(client_id, call_id)``, its answer read; the server restarts
(or the active is killed -9 and the standby takes over); the SAME call sent again gets the
first answer, rebuilt from the namespace, and the namespace shows the call applied once:
a retried create does not fail with FileExists, a retried rename not with FileNotFound,
a retried delete answers true although the file is gone. A delete or rename answering
``want_status`` (a mount's unlink, rmdir, rename) answers the status of the inode it removed
again, from what its record kept.

The first tests need no processes: the cache's note/rebuild contract, the journal tagging
the records of a cached call (and only those), and every cached method's answer rebuilt
after an in-process restart."""

from __future__ import annotations

import time

import pytest
import trio

from fs import errors
from fs.errors import AnswerLost, TryAgain, sole_exception
from fs.framing import packb
from fs.retry_cache import CallKey, RetryCache, current_call
from fs.rpc import RpcClient
from meta.journal.journal import Journal
from meta.journal.files import Record
from meta.journal.ops import RPC_CALL, RPC_KEPT, decode
from meta.services import retry_answers
from meta.services.retry_answers import ANSWERS
from meta.server import MetaServer

from test_meta_server import KiB, FakeNode, meta_server

CLIENT = "retrying-client#0123456789abcdef"


# ----------------------------------------------------------------------- the cache itself
async def test_a_noted_call_is_answered_by_its_rebuild_once():
    async def main():
        now = [0.0]
        cache = RetryCache(expiry=10, clock=lambda: now[0])
        key = CallKey("c", 1, "create")
        ran = []

        async def thunk():
            ran.append("thunk")
            return "second run"

        async def rebuild(kept):
            ran.append("rebuild")
            assert kept == ["what the record kept"]
            assert current_call() == key   # records a rerun logs carry the key too
            return "rebuilt"

        cache.note(key, ["what the record kept"])
        assert await cache.run(key, thunk, rebuild) == "rebuilt"
        assert await cache.run(key, thunk, rebuild) == "rebuilt"   # now an ordinary answer
        assert ran == ["rebuild"]
        assert current_call() is None

    await main()


async def test_noting_a_restarts_look_back_at_once_keeps_the_newest_and_known_calls():
    """``note_all`` (the look back at start): past ``max_entries`` the oldest notes go, a
    key already in the cache stays as it was, expired entries are dropped."""
    async def main():
        full = RetryCache(expiry=10, max_entries=3, clock=lambda: 0.0)
        keys = [CallKey("c", i, "mkdirs") for i in range(5)]
        assert full.note_all((key, [i]) for i, key in enumerate(keys)) == 5
        assert list(full._entries) == keys[2:]

        now = [0.0]
        cache = RetryCache(expiry=10, clock=lambda: now[0])
        expired, own = CallKey("c", 7, "mkdirs"), CallKey("c", 8, "mkdirs")
        assert await cache.run(expired, _answer("old")) == "old"
        now[0] = 5.0
        assert await cache.run(own, _answer("own")) == "own"
        now[0] = 12.0
        assert cache.note_all([(own, ["x"]), (keys[0], None)]) == 1
        assert list(cache._entries) == [own, keys[0]]
        assert await cache.run(own, _answer("again")) == "own"   # not replaced by a note

    await main()


def _answer(value):
    async def thunk():
        return value
    return thunk


async def test_a_failed_rebuild_keeps_the_note_and_a_note_never_hides_an_answer():
    async def main():
        now = [0.0]
        cache = RetryCache(expiry=10, clock=lambda: now[0])
        key = ("c", 2, "delete")

        async def thunk():
            return "ran"

        seen = []

        async def failing(kept=None):
            seen.append(kept)
            raise TryAgain("cannot")

        cache.note(key, "kept")
        with pytest.raises(TryAgain):
            await cache.run(key, thunk, failing)
        with pytest.raises(TryAgain):   # still applied, with what it kept: never run blindly
            await cache.run(key, thunk, failing)
        assert seen == ["kept", "kept"]
        with pytest.raises(errors.InternalError):   # no rebuild at all
            await cache.run(key, thunk)
        now[0] = 11   # expired like any entry: the call runs again
        assert await cache.run(key, thunk, failing) == "ran"
        cache.note(key)   # the server's own answered call: the note changes nothing
        assert await cache.run(key, failing, failing) == "ran"

    await main()


async def test_a_note_while_the_call_runs_changes_nothing():
    async def main():
        cache = RetryCache()
        key = ("c", 3, "mkdirs")

        async def thunk():
            cache.note(key)   # the server applies its own call's record while it runs
            return True

        assert await cache.run(key, thunk) is True
        assert await cache.run(key, thunk) is True

    await main()


def test_every_cached_method_has_an_answer_rebuild():
    assert set(ANSWERS) == set(MetaServer.retry_cached)


# ----------------------------------------------------------------------- journal tagging
async def test_the_last_record_of_a_cached_calls_log_names_the_call(tmp_path):
    async def main():
        applied: list[Record] = []
        journal = Journal(str(tmp_path / "j"), applied.extend)
        journal.open()
        key = CallKey(CLIENT, 7, "create")
        kept_key = CallKey(CLIENT, 8, "delete")
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await journal.log("SET_GENSTAMP", {"gs": 1})   # a monitor's: nothing

            async def call():
                await journal.log_many([("SET_GENSTAMP", {"gs": 2}),
                                        ("SET_GENSTAMP", {"gs": 3})])
                return True

            await RetryCache().run(key, call)

            async def keeping():
                await journal.log("SET_GENSTAMP", {"gs": 4}, kept=[7, "file"])
                return True

            await RetryCache().run(kept_key, keeping)
            # outside a retry-cached call nobody can retry: nothing is kept
            await journal.log("SET_GENSTAMP", {"gs": 5}, kept=[8, "file"])
            await journal.aclose()
            nursery.cancel_scope.cancel()
        assert [r.args for r in applied] == [
            {"gs": 1}, {"gs": 2}, {"gs": 3, RPC_CALL: list(key)},
            {"gs": 4, RPC_CALL: list(kept_key), RPC_KEPT: [7, "file"]}, {"gs": 5}]
        ops = [decode(r) for r in applied]
        assert [op.rpc_call() for op in ops] == [None, None, key, kept_key, None]
        assert [op.rpc_kept() for op in ops] == [None, None, None, [7, "file"], None]
        for op, record in zip(ops, applied):   # kept, in place, when re-encoded
            assert op.to_args() == record.args
        reopened = Journal(str(tmp_path / "j"), lambda records: None)
        reopened.open()
        assert [r.args for r in reopened.recent(time.time() - 60, 100)] == [
            r.args for r in applied]
        assert list(reopened.recent(time.time() + 60, 100)) == []   # older than the window

    await main()


# ----------------------------------------------------------------------- calls, in process
async def send(address: str, method: str, args: dict, call_id: int, client_id: str = CLIENT):
    """One call with a fixed identity, as a client retrying it would send it."""
    try:
        async with RpcClient(address, "retry-test", retry_seconds=0, timeout=20) as rpc:
            rpc.client_id = client_id
            return await rpc.call_once(method, args, call_id, 20)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


async def plain(address: str, method: str, **args):
    async with RpcClient(address, "setup", retry_seconds=5, timeout=20) as rpc:
        return await rpc.call(method, args)


# (method, args, what the first call answers); each on its own folder so that no later
# call changes what an earlier one's rebuilt answer shows
CALLS = [
    ("mkdirs", {"path": "/m/new", "exclusive": True, "create_parent": False,
                "want_status": True}),
    ("mkdirs", {"path": "/m2/a/b"}),
    ("create", {"path": "/c/f", "client_name": "w1"}),
    ("create", {"path": "/c2/f", "client_name": "w1", "want_status": True,
                "first_block": True}),
    ("create_symlink", {"target": "/c/f", "path": "/s/link", "want_status": True}),
    ("rename", {"src": "/r/x", "dst": "/r/y"}),
    ("rename", {"src": "/r2/x", "dst": "/r2/y", "want_status": True}),
    ("rename_many", {"moves": [["/r3/x", "/r3/y"], ["/r3/z", "/r3/w"]]}),
    ("delete", {"path": "/d/x"}),
    ("delete", {"path": "/d2", "recursive": True}),
    # a mount's unlink (of a file open for a writer, of a symlink), rmdir (of a folder with
    # a quota) and rename over a file, over an empty folder, onto a free name: the status
    # of what they removed is in the answer
    ("delete", {"path": "/u1/open", "expect": "nondir", "want_status": True}),
    ("delete", {"path": "/u2/link", "expect": "nondir", "want_status": True}),
    ("delete", {"path": "/u3/dir", "expect": "dir", "want_status": True}),
    ("rename", {"src": "/v1/x", "dst": "/v1/y", "overwrite": True, "want_status": True}),
    ("rename", {"src": "/v2/x", "dst": "/v2/y", "overwrite": True, "want_status": True}),
    ("rename", {"src": "/v3/x", "dst": "/v3/y", "overwrite": True, "want_status": True}),
    ("complete", {"path": "/w/done", "client_name": "w1", "data": b"hello"}),
    ("append", {"path": "/w/small", "client_name": "w2"}),
    ("rewrite", {"path": "/w/rewritten", "client_name": "w1"}),
    ("recover_lease", {"path": "/w/abandoned", "client_name": "w3"}),
    ("truncate", {"path": "/w/cut", "new_length": 2, "client_name": "w4"}),
]


async def setup_namespace(address: str) -> None:
    for path in ("/m", "/c", "/c2", "/s", "/r/x", "/r2/x", "/r3/x", "/r3/z", "/d2/a/b"):
        await plain(address, "mkdirs", path=path)
    await plain(address, "create", path="/d/x", client_name="w0")
    await plain(address, "create", path="/u1/open", client_name="w0")
    await plain(address, "create_symlink", target="/elsewhere", path="/u2/link",
                create_parent=True)
    await plain(address, "mkdirs", path="/u3/dir")
    await plain(address, "set_quota", path="/u3/dir", ns_quota=10)
    for path in ("/v1/x", "/v1/y"):
        await plain(address, "create", path=path, client_name="w0")
        await plain(address, "complete", path=path, client_name="w0", data=path.encode())
    for path in ("/v2/x", "/v2/y", "/v3/x"):
        await plain(address, "mkdirs", path=path)
    for path, holder in (("/w/done", "w1"), ("/w/rewritten", "w1"),
                         ("/w/abandoned", "w0"), ("/w/small", "w0"), ("/w/cut", "w0")):
        await plain(address, "create", path=path, client_name=holder)
    for path in ("/w/small", "/w/cut"):
        await plain(address, "complete", path=path, client_name="w0", data=b"abcdef")


async def test_every_cached_call_retried_after_a_restart_gets_its_first_answer(tmp_path):
    async def main():
        async with meta_server(tmp_path) as meta:
            await setup_namespace(meta.address)
            first = [await send(meta.address, method, args, call_id)
                     for call_id, (method, args) in enumerate(CALLS, 1)]
            await meta.restart()
            again = [await send(meta.address, method, args, call_id)
                     for call_id, (method, args) in enumerate(CALLS, 1)]
            for (method, args), one, two in zip(CALLS, first, again):
                assert two == one, (method, args)
            # ... applied once: a second run would have failed (FileExists, FileNotFound)
            # or changed the namespace again
            names = {}
            for path in ("/r", "/r2", "/r3", "/d", "/", "/m", "/c", "/s"):
                listing = await plain(meta.address, "list_status", path=path)
                names[path] = sorted(e["name"] for e in listing["entries"])
            assert names["/r"] == ["y"] and names["/r2"] == ["y"]
            assert names["/r3"] == ["w", "y"] and names["/d"] == []
            assert "d2" not in names["/"]
            assert names["/m"] == ["new"] and names["/c"] == ["f"] and names["/s"] == ["link"]
            info = await plain(meta.address, "get_file_info", path="/w/cut")
            assert info["length"] == 2

            for folder in ("/u1", "/u2", "/u3", "/v1", "/v2", "/v3"):
                listing = await plain(meta.address, "list_status", path=folder)
                names[folder] = sorted(e["name"] for e in listing["entries"])
            assert names["/u1"] == names["/u2"] == names["/u3"] == []
            assert names["/v1"] == names["/v2"] == names["/v3"] == ["y"]

            # what the answer shows is gone since (another call took it): it cannot be
            # rebuilt, and a second run is not safe: AnswerLost
            await plain(meta.address, "create", path="/u/gone/x", client_name="w0")
            await plain(meta.address, "mkdirs", path="/u/dir")
            lost = [("delete", {"path": "/u/gone/x", "want_status": True}),
                    ("rename", {"src": "/u/dir", "dst": "/u/moved", "overwrite": True,
                                "want_status": True})]
            for call_id, (method, args) in enumerate(lost, 100):
                await send(meta.address, method, args, call_id)
            for path in ("/u/gone", "/u/moved"):
                await plain(meta.address, "delete", path=path, recursive=True)
            await meta.restart()
            for call_id, (method, args) in enumerate(lost, 100):
                with pytest.raises(AnswerLost, match="changed the namespace before a failover or restart"):
                    await send(meta.address, method, args, call_id)
            # a call the server never saw runs as usual; another client's same call id too
            assert await send(meta.address, "mkdirs", {"path": "/fresh"}, 1,
                              client_id="someone-else#0") is True
            with pytest.raises(errors.FileExists):
                await send(meta.address, "mkdirs", CALLS[0][1], 2, client_id="someone-else#0")
            await meta.stop()

        # only the calls whose answer shows what they removed (or that a rename with
        # overwrite removed nothing) kept something in their record
        journal = Journal(str(tmp_path / "meta" / "journal"), lambda records: None)
        journal.open()
        kept = {r.args[RPC_CALL][1]: r.args.get(RPC_KEPT) for r in journal.replay(0)
                if r.args.get(RPC_CALL, [None])[0] == CLIENT}
        for call_id, (method, args) in enumerate(CALLS, 1):
            removes = args.get("want_status", False) and (
                method == "delete" or method == "rename" and args.get("overwrite", False))
            assert (kept.get(call_id) is not None) == removes, (method, args)
            if args.get("src") == "/v3/x":   # a rename with overwrite onto a free name
                assert kept[call_id] == []
        assert max(len(packb(value)) for value in kept.values()) < 100

    await main()


async def test_a_record_that_kept_nothing_answers_a_status_retry_answer_lost():
    """Records journaled before ``RPC_KEPT`` existed: a delete or rename answering
    ``want_status`` cannot answer the status of what it removed (nor can anything that is
    not a ``keep_removed`` value)."""
    async def main():
        for kept in (None, [1, 2], "junk", []):
            with pytest.raises(AnswerLost, match="did not keep the status the deleted"):
                await retry_answers.delete(None, None, None, kept, "/a", expect="dir",
                                           want_status=True)
            if kept == []:   # a rename that replaced nothing
                continue
            with pytest.raises(AnswerLost, match="did not keep the status of the replaced"):
                await retry_answers.rename(None, None, None, kept, "/a", "/b", overwrite=True,
                                           want_status=True)

    await main()


def _block_part(located: dict | None):
    """What a located block answer says of the block itself (its locations follow the
    block servers' reports, which a restart starts again)."""
    if located is None:
        return None
    return located["block"], located["offset"]


async def test_the_write_path_calls_retried_after_a_restart_get_their_blocks_back(tmp_path):
    """create with its first block, add_block, complete and append, each retried right
    after a restart, answer the same blocks (id, stamp, offset): none is allocated twice."""
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client("storage-a") as storage:
                node = FakeNode(storage, "node-a", 9001)
                await node.register()
                replicas = []

                async def restart():
                    await meta.restart()
                    await node.register()
                    await node.report(replicas)

                created = await send(meta.address, "create", {
                    "path": "/b/f", "client_name": "w1", "first_block": True}, 1)
                first = created["first_block"]
                assert first is not None and first["locations"]
                await restart()
                again = await send(meta.address, "create", {
                    "path": "/b/f", "client_name": "w1", "first_block": True}, 1)
                assert again["status"] == created["status"]
                assert _block_part(again["first_block"]) == _block_part(first)

                await node.received(first["block"], 64 * KiB)
                replicas.append([first["block"]["id"], first["block"]["gs"], 64 * KiB,
                                 "FINALIZED"])
                add = {"path": "/b/f", "client_name": "w1", "ino": created["status"]["ino"],
                       "previous": {**first["block"], "num_bytes": 64 * KiB}}
                second = await send(meta.address, "add_block", add, 2)
                await restart()
                assert _block_part(await send(meta.address, "add_block", add, 2)) == \
                    _block_part(second)

                await node.received(second["block"], 10)
                replicas.append([second["block"]["id"], second["block"]["gs"], 10, "FINALIZED"])
                done = {"path": "/b/f", "client_name": "w1", "ino": created["status"]["ino"],
                        "last": {**second["block"], "num_bytes": 10}}
                assert await send(meta.address, "complete", done, 3) is True
                await restart()
                assert await send(meta.address, "complete", done, 3) is True

                appended = await send(meta.address, "append",
                                      {"path": "/b/f", "client_name": "w2"}, 4)
                assert appended["last_block"]["block"]["id"] == second["block"]["id"]
                await restart()
                appended_again = await send(meta.address, "append",
                                            {"path": "/b/f", "client_name": "w2"}, 4)
                assert appended_again["status"] == appended["status"]
                assert _block_part(appended_again["last_block"]) == \
                    _block_part(appended["last_block"])
                located = await plain(meta.address, "get_block_locations", path="/b/f")
                assert [b["block"]["id"] for b in located["blocks"]] == [
                    first["block"]["id"], second["block"]["id"]]

    await main()


async def test_the_first_add_block_after_an_append_to_a_full_block_retried_after_a_restart(
        tmp_path):
    """HDFS's writer asks for the first block after an append to a file whose last block
    is full with no ``previous``; retried after a restart it gets the same block back (a
    second run would find the new block last and refuse the call)."""
    async def main():
        async with meta_server(tmp_path) as meta:
            async with meta.client("storage-a") as storage:
                node = FakeNode(storage, "node-a", 9001)
                await node.register()
                created = await send(meta.address, "create", {
                    "path": "/full", "client_name": "w1", "first_block": True}, 1)
                first, size = created["first_block"], created["status"]["block_size"]
                await node.received(first["block"], size)
                ino = created["status"]["ino"]
                assert await send(meta.address, "complete", {
                    "path": "/full", "client_name": "w1", "ino": ino,
                    "last": {**first["block"], "num_bytes": size}}, 2) is True
                appended = await send(meta.address, "append",
                                      {"path": "/full", "client_name": "w2"}, 3)
                assert appended["last_block"] is None
                add = {"path": "/full", "client_name": "w2", "ino": ino}
                second = await send(meta.address, "add_block", add, 4)
                assert second["offset"] == size
                await meta.restart()
                await node.register()
                await node.report([[first["block"]["id"], first["block"]["gs"], size,
                                    "FINALIZED"]])
                assert _block_part(await send(meta.address, "add_block", add, 4)) == \
                    _block_part(second)
                # the same call as a new one is a stale add_block: refused
                with pytest.raises(errors.InvalidArgument, match="previous is missing"):
                    await send(meta.address, "add_block", add, 5)

    await main()


# ----------------------------------------------------------------------- real processes
def run(fn, *args):
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


# each in its own folder: a want_status answer shows its parent, which the others leave be
FAILOVER_CALLS = [
    ("mkdirs", {"path": "/ha/m/new", "exclusive": True, "create_parent": False,
                "want_status": True}),
    ("create", {"path": "/ha/c/f", "client_name": "writer", "want_status": True}),
    ("rename", {"src": "/ha/r/x", "dst": "/ha/r/y"}),
    ("delete", {"path": "/ha/d/gone"}),
    # the mount's unlink, rmdir and rename over a file: their answers hold what they removed
    ("delete", {"path": "/ha/u/gone", "expect": "nondir", "want_status": True}),
    ("delete", {"path": "/ha/e/dir", "expect": "dir", "want_status": True}),
    ("rename", {"src": "/ha/o/x", "dst": "/ha/o/y", "overwrite": True, "want_status": True}),
]


async def failover_setup(address: str) -> list:
    for path in ("/ha/m", "/ha/c", "/ha/r/x", "/ha/e/dir"):
        await plain(address, "mkdirs", path=path)
    for path in ("/ha/d/gone", "/ha/u/gone", "/ha/o/x", "/ha/o/y"):
        await plain(address, "create", path=path, client_name="w0")
    await plain(address, "complete", path="/ha/o/y", client_name="w0", data=b"replaced")
    return [await send(address, method, args, call_id)
            for call_id, (method, args) in enumerate(FAILOVER_CALLS, 1)]


async def resend_and_list(address: str):
    answers = [await send(address, method, args, call_id)
               for call_id, (method, args) in enumerate(FAILOVER_CALLS, 1)]
    names = []
    for folder in ("m", "c", "r", "d", "u", "e", "o"):
        listing = await plain(address, "list_status", path=f"/ha/{folder}")
        names.append(sorted(e["name"] for e in listing["entries"]))
    return answers, names


@pytest.mark.slow
def test_calls_retried_after_a_failover_get_their_first_answers(tmp_path):
    from hakit import HACluster
    ha = HACluster(tmp_path, n_meta=2, n_storage=0)
    try:
        ha.start()
        active, standby = ha.active_and_standby()
        first = run(failover_setup, ha.address(active))
        assert first[2] is True and first[3] is True
        assert first[6]["replaced"]["path"] == "/ha/o/y" and first[4]["status"]["type"] == "file"
        ha.kill_meta(active)
        new = ha.wait_active(timeout=20, besides=active)
        answers, names = run(resend_and_list, ha.address(new))
        assert answers == first
        assert answers[1]["status"]["ino"] == first[1]["status"]["ino"]
        assert names == [["new"], ["f"], ["y"], [], [], [], ["y"]]
    finally:
        ha.stop()


@pytest.mark.slow
def test_calls_retried_after_a_kill9_restart_get_their_first_answers(tmp_path):
    from harness import ProcessCluster
    cluster = ProcessCluster(tmp_path, n_storage=0)
    try:
        cluster.start(wait=False)
        first = run(failover_setup, cluster.meta_address)
        cluster.kill_meta()
        cluster.start_meta()
        answers, names = run(resend_and_list, cluster.meta_address)
        assert answers == first
        assert names == [["new"], ["f"], ["y"], [], [], [], ["y"]]
    finally:
        cluster.stop()
