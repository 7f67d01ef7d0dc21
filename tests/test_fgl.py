"""Fine-grained namespace locking (HDFS-17366): what it must allow and what it must
never allow, proven on an in-process ``MetaServer`` (real LevelDB, real journal).

Why it exists: path locks are only worth having if disjoint mutations really share an
fsync, and they are only correct if no two conflicting mutations ever do. Both are shown
without timing anything:

* overlap tests gate the journal's write+fsync worker on a ``threading.Event`` the test
  holds closed, and read ``journal.observer`` events (queued / fsync_start / fsync_end):
  a mutation's record is "queued" while another's fsync is held only if the locks let it
  through; ``trio.testing.wait_all_tasks_blocked`` gives the quiescent point at which a
  record that is not queued will never be queued until the gate opens;
* a randomized run (many clients, overlapping trees, directory renames across each other)
  must leave a consistent store whose leases agree, and a serial replay of its journal
  into a fresh store must find every record's planner preconditions still true in journal
  order (``check_record``) and end byte-for-byte equal to the server's store.

Both lock modes run (``namespace_lock`` fine and global): global is the baseline where
nothing overlaps.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from fs import errors
from fs.config import Config
from fs.rpc import CallContext
from meta.namespace.invariants import check_namespace, check_record
from meta.journal.journal import Journal
from meta.journal.files import Record
from meta.journal.kv import MemoryStore, PlyvelStore
from meta.namespace.namespace import Namespace
from meta.journal.ops import to_wire
from meta.server import MetaServer

KiB = 1024
# fake block servers speak the block-server protocol without the cluster key
BASE = dict(security="simple", heartbeat_interval=0.2, dead_node_interval=120.0, safemode_extension=0.0,
            safemode_min_storage=0,
            block_size=64 * KiB, min_block_size=4 * KiB, replication=1,
            lease_soft_limit=3600.0, lease_hard_limit=7200.0)
GATE_SECONDS = 60      # a held fsync gives up after this (a failing test never hangs)


def ctx(client: str) -> CallContext:
    return CallContext(client_id=client, peer="127.0.0.1:5000", call_id=None)


class Probe:
    """The journal's fsync worker waits at ``gate`` (open unless a test clears it); every
    observer event is kept as ``(kind, first, last, op, args)``, op/args naming the record
    for "queued" (``log_many`` reaches the observer before its first checkpoint, so the
    records being logged are the ones just queued; the first names them)."""

    def __init__(self, journal: Journal):
        self.gate = threading.Event()
        self.gate.set()
        self.events: list[tuple] = []
        self._changed = trio.Event()
        self._logging: tuple = (None, None)
        write, log_many = journal._write_and_fsync, journal.log_many

        def gated(data: bytes) -> None:   # worker thread
            if not self.gate.wait(GATE_SECONDS):
                raise OSError("test gate never opened")
            write(data)

        async def logged(records: list, **kwargs) -> list:   # log() comes here too
            self._logging = to_wire(records[0])
            return await log_many(records, **kwargs)

        journal._write_and_fsync = gated
        journal.log_many = logged
        journal.observer = self._observe

    def _observe(self, kind: str, first: int, last: int) -> None:
        op, args = self._logging if kind == "queued" else (None, None)
        self.events.append((kind, first, last, op, args))
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate):
        """Wait until ``predicate()`` is true (checked after every observer event)."""
        while not (result := predicate()):
            await self._changed.wait()
        return result

    def index(self, kind: str, txid: int) -> int | None:
        """Position of the ``kind`` event covering ``txid`` (None: not seen)."""
        for i, (k, first, last, _, _) in enumerate(self.events):
            if k == kind and first <= txid <= last:
                return i
        return None

    def queued(self, op: str, name: str) -> int | None:
        """Txid of the queued record ``op`` creating/moving/deleting ``name``."""
        for k, first, _, rop, args in self.events:
            if k == "queued" and rop == op and name in (args.get("name"),
                                                         args.get("src_name")):
                return first
        return None

    async def create_held_in_fsync(self, nursery, server, path: str, client: str) -> int:
        """Start ``create path`` in ``nursery`` and wait until its record is queued and its
        fsync has started (held there while the gate is closed); returns its txid."""
        name = path.rsplit("/", 1)[1]
        nursery.start_soon(server.client_protocol.rpc_create, ctx(client), path, client)
        txid = await self.wait_for(lambda: self.queued("ADD", name))
        await self.wait_for(lambda: self.index("fsync_start", txid))
        return txid

    def batches(self) -> list[tuple[int, int]]:
        return [(first, last) for k, first, last, _, _ in self.events if k == "fsync_end"]


@asynccontextmanager
async def running_server(folder, **overrides):
    """A MetaServer on ``folder`` with its journal syncer running and a ``Probe``; yields
    ``(server, probe)``. The gate is opened before anything waits for the syncer."""
    config = Config.load(env={}, **{**BASE, **overrides})
    kv = PlyvelStore(str(folder / "db"))
    server = MetaServer(config, kv, str(folder / "journal"))
    server.recover()
    probe = Probe(server.journal)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.journal.run)
            await server.start()
            try:
                yield server, probe
            finally:
                probe.gate.set()
                nursery.cancel_scope.cancel()
    finally:
        probe.gate.set()
        await server.journal.aclose()
        kv.close()


# --------------------------------------------------------------------------- overlap


@pytest.mark.parametrize("mode", ["fine", "global"])
async def test_creates_in_different_folders_overlap_an_fsync_only_with_fine_locks(tmp_path, mode):
    """create /a/x is held in its fsync; create /b/y is queued meanwhile (fine) or waits
    for the first to finish (global). Either way both complete, in two batches."""

    async def main():
        async with running_server(tmp_path, namespace_lock=mode) as (server, probe):
            with trio.fail_after(30):
                await server.client_protocol.rpc_mkdirs(ctx("setup"), "/a")
                await server.client_protocol.rpc_mkdirs(ctx("setup"), "/b")
                mark = len(probe.events)
                probe.gate.clear()
                async with trio.open_nursery() as clients:
                    first = await probe.create_held_in_fsync(clients, server, "/a/x", "c1")
                    clients.start_soon(server.client_protocol.rpc_create, ctx("c2"), "/b/y", "c2")
                    await trio.testing.wait_all_tasks_blocked()
                    assert probe.index("fsync_end", first) is None
                    second = probe.queued("ADD", "y")
                    if mode == "fine":
                        assert second is not None and second > first, probe.events[mark:]
                    else:
                        assert second is None, probe.events[mark:]
                    probe.gate.set()
                second = probe.queued("ADD", "y")
                assert probe.index("fsync_end", first) < probe.index("fsync_end", second)
                assert probe.batches()[-2:] == [(first, first), (second, second)]
                overlapped = probe.index("queued", second) < probe.index("fsync_end", first)
                assert overlapped == (mode == "fine"), probe.events[mark:]
                for path in ("/a/x", "/b/y"):
                    status = await server.namespace_protocol.rpc_get_file_info(ctx("r"), path)
                    assert status["under_construction"]

    await main()


async def test_same_folder_mutations_never_overlap_but_other_folders_do(tmp_path):
    """create /s/x is held in its fsync: a rename /s/y -> /s/z and a create /s/w in the same
    folder are NOT queued at a quiescent point, while a create in /c is (the syncer is not
    what holds them back). After the gate opens all complete, the same-folder records one
    at a time: each is queued only after the previous one's fsync ended."""

    async def main():
        async with running_server(tmp_path) as (server, probe):
            with trio.fail_after(30):
                st = await server.client_protocol.rpc_create(ctx("setup"), "/s/y", "setup")
                assert await server.client_protocol.rpc_complete(ctx("setup"), "/s/y", "setup",
                                                                 ino=st["ino"])
                await server.client_protocol.rpc_mkdirs(ctx("setup"), "/c")
                mark = len(probe.events)
                probe.gate.clear()
                async with trio.open_nursery() as clients:
                    held = await probe.create_held_in_fsync(clients, server, "/s/x", "c1")
                    clients.start_soon(server.namespace_protocol.rpc_rename, ctx("c2"),
                                       "/s/y", "/s/z")
                    clients.start_soon(server.client_protocol.rpc_create, ctx("c3"), "/s/w", "c3")
                    clients.start_soon(server.client_protocol.rpc_create, ctx("c4"), "/c/v", "c4")
                    await trio.testing.wait_all_tasks_blocked()
                    assert probe.index("fsync_end", held) is None
                    assert probe.queued("RENAME", "y") is None, probe.events[mark:]
                    assert probe.queued("ADD", "w") is None, probe.events[mark:]
                    assert probe.queued("ADD", "v") is not None, probe.events[mark:]
                    probe.gate.set()
                same = sorted([held, probe.queued("RENAME", "y"), probe.queued("ADD", "w")])
                for earlier, later in zip(same, same[1:]):
                    assert probe.index("fsync_end", earlier) < probe.index("queued", later), \
                        probe.events[mark:]
                listing = await server.namespace_protocol.rpc_list_status(ctx("r"), "/s")
                names = {e["name"] for e in listing["entries"]}
                assert names == {"x", "w", "z"}

    await main()


# --------------------------------------------------------------------------- random run

TREES = ["/t0", "/t1", "/t2", "/t3"]
DIRS = ["a", "b", "c"]
FILES = ["x", "y"]
CLIENTS = 24
OPS_PER_CLIENT = 200
EXPECTED = (errors.FileNotFound, errors.FileExists, errors.InvalidArgument,
            errors.DirectoryNotEmpty, errors.NotDirectory, errors.IsDirectory,
            errors.AlreadyBeingCreated, errors.LeaseExpired, errors.NotReplicatedYet,
            errors.RecoveryInProgress)
NODE = "node-a"


class FakeClock:
    """Time that moves on a little at every reading, so leases soft- and hard-expire
    during the run (lease recovery by other clients and by the lease monitor)."""

    def __init__(self, step: float):
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def random_dir(rng: random.Random, own: str) -> str:
    """A directory path in a shared tree (mostly) or a client folder, 0-2 levels below it."""
    root = own if rng.random() < 0.2 else rng.choice(TREES)
    return root + "".join("/" + rng.choice(DIRS) for _ in range(rng.choice([0, 1, 1, 2])))


async def existing(server: MetaServer, c, rng: random.Random, own: str) -> str:
    """A path that existed a moment ago (what a client listed), else a random one."""
    folder = random_dir(rng, own)
    try:
        entries = (await server.namespace_protocol.rpc_list_status(c, folder))["entries"]
    except EXPECTED:
        entries = []
    if entries and entries[0]["path"] != folder:
        return rng.choice(entries)["path"]
    return folder + "/" + rng.choice(DIRS + FILES)


async def client(server: MetaServer, index: int, rng: random.Random, stats: Counter,
                 anomalies: list[str]) -> None:
    """One client's random mutations and listings; expected refusals are counted, a
    listing whose entry names are not unique and sorted is an anomaly."""
    name = f"client-{index}"
    c = ctx(name)
    dn = server.datanode_protocol
    own = f"/p{index % 6}"     # a few folders shared by four clients each, disjoint from /t*
    for _ in range(OPS_PER_CLIENT):
        kind = rng.choices(["create", "write", "mkdirs", "rename", "rename_many", "delete",
                            "recover", "append", "list"],
                           weights=[20, 8, 15, 30, 6, 12, 3, 3, 12])[0]
        try:
            if kind == "create":
                path = random_dir(rng, own) + "/" + rng.choice(FILES * 4 + DIRS)
                st = await server.client_protocol.rpc_create(c, path, name,
                                                             overwrite=rng.random() < 0.15)
                if rng.random() < 0.7:     # the rest stay open: leases to check
                    await server.client_protocol.rpc_complete(c, path, name, ino=st["ino"])
            elif kind == "write":
                # writer calls address the file by inode id while its folders move around
                path = random_dir(rng, own) + "/" + rng.choice(FILES)
                st = await server.client_protocol.rpc_create(c, path, name, overwrite=True)
                lb = await server.client_protocol.rpc_add_block(c, path, name, ino=st["ino"])
                block = {**lb["block"], "num_bytes": 100}
                await server.client_protocol.rpc_fsync(c, path, name, ino=st["ino"],
                                                       last_block_length=50)
                if rng.random() < 0.6:     # else complete only commits: the file stays open
                    await dn.rpc_block_received_and_deleted(
                        c, NODE, received=[[block["id"], block["gs"], 100, "FINALIZED"]])
                await server.client_protocol.rpc_complete(c, path, name, ino=st["ino"], last=block)
            elif kind == "mkdirs":
                await server.client_protocol.rpc_mkdirs(
                    c, random_dir(rng, own) + "/" + rng.choice(DIRS))
            elif kind == "rename":
                # a whole shared tree now and then, else something a listing showed; into
                # a random folder (its own subtree, another tree, a client folder)
                src = rng.choice(TREES) if rng.random() < 0.05 else \
                    await existing(server, c, rng, own)
                dst = random_dir(rng, own) + "/" + rng.choice(DIRS + FILES)
                await server.namespace_protocol.rpc_rename(c, src, dst,
                                                           overwrite=rng.random() < 0.3)
            elif kind == "rename_many":
                # no overwrite here: see test_rename_many_into_a_directory_it_overwrites
                moves = [[await existing(server, c, rng, own),
                          random_dir(rng, own) + "/" + rng.choice(DIRS + FILES)]
                         for _ in range(2)]
                await server.namespace_protocol.rpc_rename_many(c, moves)
            elif kind == "recover":
                await server.client_protocol.rpc_recover_lease(
                    c, await existing(server, c, rng, own), name)
            elif kind == "append":
                await server.client_protocol.rpc_append(
                    c, await existing(server, c, rng, own), name)
            elif kind == "delete":
                await server.namespace_protocol.rpc_delete(c, await existing(server, c, rng, own),
                                        recursive=rng.random() < 0.6)
            else:
                listing = await server.namespace_protocol.rpc_list_status(c, random_dir(rng, own))
                names = [e["name"] for e in listing["entries"]]
                if names != sorted(set(names)):
                    anomalies.append(f"listing {listing['entries'][0]['path']}...: {names}")
            stats[kind + " ok"] += 1
        except EXPECTED as exc:
            stats[f"{kind} {type(exc).__name__}"] += 1


async def lease_monitor(server: MetaServer) -> None:
    """The lease monitor's pass, over and over (the real one waits between passes)."""
    while True:
        await server.recovery.release_expired_leases()
        await trio.sleep(0.01)


def store_items(kv) -> dict[bytes, bytes]:
    return {k: v for k, v in kv.scan(b"") if not k.startswith(b"\x00")}


@pytest.mark.parametrize("mode", ["fine", "global"])
async def test_random_concurrent_clients_replay_serially(tmp_path, mode):
    """24 clients × 200 random operations over shared trees (creates, writes by inode id,
    mkdirs, renames of files and directories across trees, rename_many, deletes, lease
    recovery, appends, listings) while the reclaimer (small delete_chunk: big deletes
    detach) and the lease monitor run on a fast clock. Then: the store is consistent and
    its leases agree; a serial replay of the journal into a fresh store finds every record
    valid against the records before it, and ends equal to the server's store. A failure
    prints FGL_SEED (set it to rerun the same client choices)."""
    seed = int(os.environ.get("FGL_SEED", random.randrange(1 << 30)))
    print(f"FGL_SEED={seed} mode={mode}")
    stats: Counter = Counter()
    anomalies: list[str] = []

    async def main():
        config = Config.load(env={}, **{**BASE, "namespace_lock": mode, "delete_chunk": 6,
                                        "lease_soft_limit": 10.0, "lease_hard_limit": 40.0})
        kv = PlyvelStore(str(tmp_path / "db"))
        server = MetaServer(config, kv, str(tmp_path / "journal"), clock=FakeClock(0.02))
        server.recover()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.journal.run)
                await server.start()
                dn = server.datanode_protocol
                await dn.rpc_register_storage(ctx(NODE), NODE, "127.0.0.1:9001", 1 << 40,
                                              0, 1 << 40)
                with trio.fail_after(90):
                    async with trio.open_nursery() as clients:
                        clients.start_soon(server.monitors.run_reclaimer)
                        clients.start_soon(lease_monitor, server)
                        async with trio.open_nursery() as users:
                            for i in range(CLIENTS):
                                users.start_soon(client, server, i, random.Random(
                                    seed * 1000 + i), stats, anomalies)
                        largest_batch = server.journal.stats.largest_batch
                        clients.cancel_scope.cancel()
                    # a record a cancelled monitor left queued is applied before this one,
                    # so the drain below plans against a state that has it
                    await server.client_protocol.rpc_mkdirs(ctx("drain"), "/drained")
                    while await server.monitors.reclaim_once():
                        pass
                nursery.cancel_scope.cancel()
            live_problems = check_namespace(kv, server.leases)
            orphans, open_files = server.ns.reclaim.has_orphans(), server.leases.open_files()
            live = store_items(kv)
        finally:
            await server.journal.aclose()
            kv.close()

        journal = Journal(str(tmp_path / "journal"), lambda records: None)
        journal.open()
        replay = PlyvelStore(str(tmp_path / "replay"))
        try:
            ns = Namespace(replay)
            problems: list[str] = []
            ops: Counter = Counter()
            for record in journal.replay(0):
                problems += check_record(replay, record)
                if record.op == "RENAME":
                    moved = ns.view.get_inode(record.args["ino"])
                    is_dir = moved is not None and moved.type == "dir"
                    ops["dir renames" if is_dir else "file renames"] += 1
                if record.args.get("detach"):
                    ops["detached"] += 1
                ops[record.op] += 1
                ns.apply([record])
            print(dict(sorted(stats.items())), dict(ops), server.journal.stats,
                  f"clock {server.clock.now - 1000:.0f}s")
            # everything that went wrong, at once: the replay says which record it was
            found = {"listings": anomalies[:10], "live store": live_problems[:20],
                     "serial replay": problems[:20]}
            assert found == {"listings": [], "live store": [], "serial replay": []}
            assert store_items(replay) == live
            assert not orphans and open_files > 0
            if mode == "global":    # one mutation at a time: never two records in a batch
                assert largest_batch == 1
            assert ops["dir renames"] and ops["file renames"] and ops["RENAMES"]
            assert ops["DELETE"] and ops["CLOSE"] and ops["ADD"] and ops["MKDIR"]
            assert ops["ADD_BLOCK"] and ops["FSYNC"] and ops["UPDATE_BLOCKS"]
            assert bool(ops["RECLAIM"]) == bool(ops["detached"])
            assert check_namespace(replay) == []
        finally:
            await journal.aclose()
            replay.close()

    await main()


# --------------------------------------------------------------------------- check_record


def formatted_namespace() -> tuple[Namespace, list]:
    """A MemoryStore namespace with /d (dir) holding /d/e (dir) and /f (open file)."""
    ns = Namespace(MemoryStore())
    records = []

    def apply(op_args):
        record = Record(len(records) + 1, *to_wire(op_args))
        assert check_record(ns.kv, record) == []
        records.append(record)
        ns.apply([record])

    apply(ns.planner.plan_format(7, 1))
    apply(ns.planner.plan_mkdirs("/d/e", now_ns=2))
    apply(ns.planner.plan_create("/f", holder="w", now_ns=3))
    return ns, records


def test_check_record_finds_records_planned_on_another_state():
    """Records a planner would never produce against the current state are reported:
    a create of an existing name, a rename into its own subtree, a delete of an entry
    that points elsewhere, a close of a closed file."""
    ns, _ = formatted_namespace()
    d = ns.view.lookup(1, "d")
    e = ns.view.lookup(d, "e")
    f = ns.view.lookup(1, "f")
    add = ns.planner.plan_create("/g", holder="w", now_ns=4).to_args()
    bad = {
        "ADD": {**add, "name": "f"},
        "RENAME": {"src_parent": 1, "src_name": "d", "dst_parent": e, "dst_name": "x",
                   "ino": d, "overwrite": None, "detach": False, "time": 5},
        "DELETE": {"parent": 1, "name": "d", "ino": f, "time": 5, "detach": False},
        "MKDIR": {"dirs": [{"parent": f, "name": "x", "ino": 99, "mode": 0o755,
                            "owner": "o", "group": "g"}], "time": 5},
    }
    for op, args in bad.items():
        assert check_record(ns.kv, Record(10, op, args)), op
    assert check_record(ns.kv, Record(10, "ADD", add)) == []
    ns.apply([Record(4, "CLOSE", ns.planner.plan_close(f, None, None, 4).to_args())])
    assert check_record(ns.kv, Record(5, "CLOSE", ns.planner.plan_close(f, None, None, 5).to_args()))
    # the moves of one RENAMES record are checked in order: the second sees the first
    two = {"renames": [
        {"src_parent": d, "src_name": "e", "dst_parent": 1, "dst_name": "e2", "ino": e,
         "overwrite": None, "detach": False, "time": 6},
        {"src_parent": d, "src_name": "e", "dst_parent": 1, "dst_name": "e3", "ino": e,
         "overwrite": None, "detach": False, "time": 6}], "time": 6}
    problems = check_record(ns.kv, Record(6, "RENAMES", two))
    assert len(problems) == 1 and "source entry 'e'" in problems[0], problems
    assert check_record(ns.kv, Record(6, "UNKNOWN_OP", {})) == []


def test_rename_many_refuses_a_path_below_another_moves_destination():
    """rename_many [[/src, /dst, overwrite], [/other, /dst/x]] with /dst an empty
    directory would plan the second move into the OLD /dst inode, which the first move
    removes (found by the randomized run's serial replay): refused, nothing changes."""
    ns, _ = formatted_namespace()
    for path in ("/src", "/dst", "/other"):
        ns.apply([Record(ns.view.applied_txid + 1, *to_wire(ns.planner.plan_mkdirs(path, now_ns=8)))])
    before = dict(ns.kv.scan(b""))
    with pytest.raises(errors.InvalidArgument, match="/dst is a destination"):
        ns.renames.plan_rename_many([["/src", "/dst", True], ["/other", "/dst/x"]], now_ns=9)
    assert dict(ns.kv.scan(b"")) == before and check_namespace(ns.kv) == []

# --------------------------------------------------------------------------- complete


async def test_reports_during_the_commit_fsync_of_a_complete_end_its_wait(tmp_path):
    """complete of a last block no replica was reported for yet logs the block's commit
    (UPDATE_BLOCKS) and waits for a report. The writer's block servers report while that
    record's fsync runs (they answered the writer already, often no report comes after):
    those reports must end the wait, so the call answers True instead of False after its
    wait (and the writer's backoff)."""

    async def main():
        async with running_server(tmp_path) as (server, probe):
            dn = server.datanode_protocol
            with trio.fail_after(30):
                await dn.rpc_register_storage(ctx("dn"), "n1", "127.0.0.1:9001",
                                              capacity=1 << 40, remaining=1 << 40)
                st = await server.client_protocol.rpc_create(ctx("w"), "/f", "w")
                located = await server.client_protocol.rpc_add_block(ctx("w"), "/f", "w",
                                                                     ino=st["ino"])
                block = located["block"]
                answers = []

                async def complete():
                    answers.append(await server.client_protocol.rpc_complete(
                        ctx("w"), "/f", "w", ino=st["ino"], last={**block, "num_bytes": 10}))

                probe.gate.clear()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(complete)
                    commit = await probe.wait_for(lambda: next(
                        (first for kind, first, _, op, _ in probe.events
                         if kind == "queued" and op == "UPDATE_BLOCKS"), None))
                    await probe.wait_for(lambda: probe.index("fsync_start", commit))
                    await dn.rpc_block_received_and_deleted(
                        ctx("dn"), "n1", received=[[block["id"], block["gs"], 10, "FINALIZED"]])
                    probe.gate.set()
                assert answers == [True]
                status = await server.namespace_protocol.rpc_get_file_info(ctx("r"), "/f")
                assert not status["under_construction"]

    await main()
