"""The cluster-wide lock table (``fs/locktable.py``) and its service
(``meta/services/locks.py``): POSIX range rules one by one, flock rules, a stateful
property test against a byte-by-byte model of who holds what, and the service's waits,
argument checks and the end of a silent holder's locks."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fs.errors import InvalidArgument
from fs.rpcbase import CallContext
from harness import ProcessCluster, make_test_config
from meta.journal.kv import MemoryStore
from meta.server import MetaServer
from fs.locktable import TO_EOF, LockKind, LockOwner, LockTable
from meta.services.locks import MAX_LOCK_WAIT, Locks

R, W, U = LockKind.READ, LockKind.WRITE, LockKind.UNLOCK
A1, A2, B1 = LockOwner("a", 1), LockOwner("a", 2), LockOwner("b", 1)


def spans(table, ino, owner=None):
    return [(r.owner.client, r.owner.owner, r.kind.value, r.start, r.end)
            for r in table.ranges(ino) if owner is None or r.owner == owner]


def test_an_owners_locks_merge_split_and_convert_as_posix_says():
    t = LockTable()
    assert t.set_range(5, A1, R, 0, 10, pid=7) is None
    assert t.set_range(5, A1, R, 10, 20, pid=7) is None          # adjacent: merged
    assert spans(t, 5) == [("a", 1, "read", 0, 20)]
    assert t.set_range(5, A1, W, 5, 8, pid=7) is None            # converts the middle
    assert spans(t, 5) == [("a", 1, "read", 0, 5), ("a", 1, "write", 5, 8),
                           ("a", 1, "read", 8, 20)]
    assert t.set_range(5, A1, U, 6, 7, pid=7) is None            # a hole in the write lock
    assert spans(t, 5) == [("a", 1, "read", 0, 5), ("a", 1, "write", 5, 6),
                           ("a", 1, "write", 7, 8), ("a", 1, "read", 8, 20)]
    assert t.set_range(5, A1, R, 0, TO_EOF, pid=7) is None       # all one read lock again
    assert spans(t, 5) == [("a", 1, "read", 0, TO_EOF)]
    assert t.set_range(5, A1, U, 0, TO_EOF, pid=7) is None
    assert spans(t, 5) == [] and t.clients() == [] and len(t) == 0


def test_conflicts_only_between_owners_and_only_with_a_writer():
    t = LockTable()
    t.set_range(5, A1, R, 0, 100, pid=1)
    assert t.set_range(5, A2, R, 50, 150, pid=2) is None        # readers share
    refused = t.set_range(5, B1, W, 90, 95, pid=3)
    assert refused is not None and refused.owner == A1 and (refused.start, refused.end) == (0, 100)
    assert t.set_range(5, B1, W, 150, 200, pid=3) is None       # no overlap
    assert t.set_range(5, A1, W, 0, 10, pid=1) is None           # its own lock: converts
    assert t.set_range(5, A1, U, 40, 100, pid=1) is None
    assert t.set_range(5, A2, W, 50, 60, pid=2) is None         # now nobody else's there
    # an upgrade that conflicts is refused and keeps the read lock
    assert t.set_range(5, A1, W, 30, 55, pid=1).owner == A2
    assert ("a", 1, "read", 10, 40) in spans(t, 5)
    assert t.test(5, B1, R, 0, 1).owner == A1                    # F_GETLK names the writer
    assert t.test(5, A1, W, 0, 10) is None
    assert t.test(6, B1, W, 0, TO_EOF) is None                   # another file


def test_flock_locks_shared_exclusive_and_apart_from_posix_locks():
    t = LockTable()
    assert t.set_flock(5, A1, R, pid=1) is None
    assert t.set_flock(5, B1, R, pid=2) is None
    assert t.set_flock(5, B1, W, pid=2).owner == A1              # conversion refused: kept
    assert [f.kind for f in t.flocks(5)] == [R, R]
    assert t.set_range(5, B1, W, 0, TO_EOF, pid=2) is None       # POSIX locks are apart
    assert t.set_flock(5, A1, U, pid=1) is None
    assert t.set_flock(5, B1, W, pid=2) is None
    assert t.release_owner(5, B1, flock=True) and t.flocks(5) == []
    assert t.release_owner(5, B1, flock=False) and t.ranges(5) == []
    assert not t.release_owner(5, B1, flock=False)


def test_a_clients_locks_all_go_at_once():
    t = LockTable()
    t.set_range(5, A1, W, 0, 10, pid=1)
    t.set_range(6, A2, R, 0, 10, pid=1)
    t.set_flock(7, A1, W, pid=1)
    t.set_range(5, B1, W, 20, 30, pid=2)
    assert t.release_client("a") == [5, 6, 7]
    assert spans(t, 5) == [("b", 1, "write", 20, 30)] and t.flocks(7) == []
    assert t.clients() == ["b"]


@pytest.mark.parametrize("start,end", [(-1, 5), (5, 5), (6, 5), (0, TO_EOF + 1), ("0", 5),
                                       (0, 2.5), (True, 4), (None, 3)])
def test_bad_ranges_are_refused_clearly(start, end):
    with pytest.raises(InvalidArgument, match="lock range"):
        LockTable().set_range(5, A1, W, start, end, pid=1)


OWNERS = [A1, A2, B1, LockOwner("b", 2)]
SIZE = 12   # the model's file: bytes 0..11, the last one standing for "to the end"


class LockModel(RuleBasedStateMachine):
    """Random locks, unlocks, closes and clients leaving, checked against a model that
    records every byte's holders."""

    def __init__(self):
        super().__init__()
        self.table = LockTable()
        self.bytes = [dict() for _ in range(SIZE)]   # byte -> {owner: kind}

    def _end(self, end):
        return TO_EOF if end == SIZE else end

    @rule(owner=st.sampled_from(OWNERS), kind=st.sampled_from(list(LockKind)),
          start=st.integers(0, SIZE - 1), length=st.integers(1, SIZE))
    def set_range(self, owner, kind, start, length):
        end = min(SIZE, start + length)
        want_conflict = kind is not U and any(
            o != owner and W in (k, kind)
            for b in range(start, end) for o, k in self.bytes[b].items())
        got = self.table.set_range(3, owner, kind, start, self._end(end), pid=1)
        assert (got is not None) == want_conflict
        if got is None:
            for b in range(start, end):
                if kind is U:
                    self.bytes[b].pop(owner, None)
                else:
                    self.bytes[b][owner] = kind

    @rule(owner=st.sampled_from(OWNERS))
    def close(self, owner):
        self.table.release_owner(3, owner, flock=False)
        for held in self.bytes:
            held.pop(owner, None)

    @rule(client=st.sampled_from(["a", "b"]))
    def client_leaves(self, client):
        self.table.release_client(client)
        for held in self.bytes:
            for owner in [o for o in held if o.client == client]:
                del held[owner]

    @invariant()
    def table_matches_the_model(self):
        locks = self.table.ranges(3)
        got = [dict() for _ in range(SIZE)]
        for lock in locks:
            for b in range(lock.start, min(SIZE, lock.end)):
                assert lock.owner not in got[b], "an owner's locks overlap"
                got[b][lock.owner] = lock.kind
        assert got == self.bytes
        # merged: no two locks of one owner and kind touch
        for x in locks:
            for y in locks:
                if x is not y and x.owner == y.owner and x.kind is y.kind:
                    assert x.end < y.start or y.end < x.start
        assert set(self.table.clients()) == {o.client for held in self.bytes for o in held}


TestLockModel = LockModel.TestCase
TestLockModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------------- the service
class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Journal:
    """The journal as the service sees it (``Edits.log_plan``): the ops, in order."""

    def __init__(self):
        self.ops = []

    async def log_plan(self, op, *, durable=True):
        self.ops.append((op.to_wire()[0], op.client, durable))


def service(clock=None, journal=None, grace=20.0):
    return Locks(table=LockTable(), hard_limit=30.0, grace=grace, edits=journal or Journal(),
                 clock=clock or Clock(), wall_ns=lambda: 7,
                 inode_exists=lambda ino: ino != 404)


async def test_a_waiting_lock_is_granted_when_the_holder_unlocks(autojump_clock):
    locks = service()
    assert (await locks.set("a", 5, 1, "write", "flock"))["granted"]
    got = {}

    async def waiter():
        got["answer"] = await locks.set("b", 5, 9, "write", "flock", wait=60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert "answer" not in got
        await trio.sleep(1)
        assert (await locks.set("a", 5, 1, "unlock", "flock"))["granted"]
    assert got["answer"]["granted"] and got["answer"]["held"]


async def test_a_wait_is_bounded_and_answers_the_conflict(autojump_clock):
    locks = service()
    await locks.set("a", 5, 1, "write", start=0, end=10, pid=77)
    started = trio.current_time()
    answer = await locks.set("b", 5, 1, "read", start=5, end=6, wait=3600)
    assert trio.current_time() - started == pytest.approx(MAX_LOCK_WAIT)
    assert answer == {"granted": False, "held": False,
                      "conflict": {"client_name": "a", "owner": 1, "kind": "write",
                                   "pid": 77, "start": 0, "end": 10}}
    assert locks.get("b", 5, 1, "read", 9, 20)["conflict"]["pid"] == 77
    assert locks.get("b", 5, 1, "read", 10, 20) == {"conflict": None}


async def test_a_silent_holders_locks_end_and_its_waiters_go_on(autojump_clock):
    clock = Clock()
    locks = service(clock)
    await locks.set("a", 5, 1, "write")
    got = {}

    async def waiter():
        got["answer"] = await locks.set("b", 5, 1, "write", wait=MAX_LOCK_WAIT)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        clock.now = 29.0
        locks.renewed("a")                       # renew_lease keeps it alive
        clock.now = 45.0
        assert locks.expire_silent() == 0
        clock.now = 60.0
        assert locks.expire_silent() == 1
    assert got["answer"]["granted"]
    assert locks.table.clients() == ["b"]


async def test_a_restarted_service_grants_nothing_new_until_its_holders_reclaimed(
        autojump_clock):
    """A client's first lock journals it as a holder (once, durably, before the grant).
    After a restart (a new table, the holders from the store) nobody gets a new lock
    until every holder on record reclaimed (an unlock is not held up), and a reclaimed
    lock is what a newcomer then meets."""
    clock, journal = Clock(), Journal()
    locks = service(clock, journal)
    assert (await locks.set("a", 5, 1, "write"))["granted"]
    assert (await locks.set("a", 6, 1, "read"))["granted"]
    assert journal.ops == [("LOCK_HOLDER", "a", True)]

    locks = service(clock, journal)
    locks.rebuild(["a", "b"])
    assert locks.hold("a") == {"reclaim": True} and locks.grace_left() == 20.0
    assert locks.get("c", 5, 1, "write")["grace"] == 20.0
    assert (await locks.set("c", 7, 1, "unlock"))["granted"]
    got = {}

    async def newcomer():
        got["c"] = await locks.set("c", 5, 1, "write", wait=60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(newcomer)
        await trio.testing.wait_all_tasks_blocked()
        assert await locks.reclaim("a", [{"ino": 5, "owner": 1, "kind": "write"}]) == {
            "lost": []}
        await trio.testing.wait_all_tasks_blocked()
        assert "c" not in got   # b has not reclaimed yet
        assert await locks.reclaim("b", []) == {"lost": []}
    assert not got["c"]["granted"] and got["c"]["conflict"]["client_name"] == "a"
    assert locks.grace_left() == 0 and locks.hold("a") == {"reclaim": False}
    # a and b were on record; c is recorded before it may be granted anything
    assert journal.ops == [("LOCK_HOLDER", "a", True), ("LOCK_HOLDER", "c", True)]


async def test_the_grace_ends_after_its_seconds_and_silent_holders_are_forgotten(
        autojump_clock):
    """A holder that never reclaims holds the grace up for ``grace`` seconds at most; its
    record then goes (lazily), and so does that of a holder that held no lock that long.
    A client that says it holds locks the table does not have is asked to reclaim them."""
    clock, journal = Clock(), Journal()
    locks = service(clock, journal, grace=5.0)
    locks.rebuild(["dead"])
    got = {}

    async def newcomer():
        got["b"] = await locks.set("b", 5, 1, "write")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(newcomer)
        await trio.testing.wait_all_tasks_blocked()
        assert "b" not in got
        clock.now = 5.0
    assert got["b"]["granted"]
    clock.now = 6.0
    await locks.forget_idle()
    assert journal.ops == [("LOCK_HOLDER", "b", True), ("LOCK_HOLDER_GONE", "dead", False)]
    assert await locks.set("b", 5, 1, "unlock")
    await locks.forget_idle()                  # b holds none from now on
    clock.now = 12.0
    await locks.forget_idle()
    assert journal.ops[-1] == ("LOCK_HOLDER_GONE", "b", False)
    assert locks.hold("b", held=0) == {"reclaim": False}
    assert locks.hold("b", held=3) == {"reclaim": True}


@pytest.mark.parametrize("locks,match", [
    ("x", "locks must be a list"),
    ([7], "lock 0 must be a map"),
    ([{"ino": 5, "owner": 1, "kind": "unlock"}], "kind must be read or write"),
    ([{"ino": 0, "owner": 1, "kind": "read"}], "ino must be at least 1"),
    ([{"ino": 5, "owner": 1, "kind": "read", "start": 9, "end": 2}], "lock range"),
    ([{"ino": 5, "owner": 1, "kind": "read", "style": "lockf"}], "style must be one of"),
])
async def test_a_bad_reclaim_is_refused_whole(locks, match):
    held = service()
    with pytest.raises(InvalidArgument, match=match):
        await held.reclaim("a", locks)
    assert held.table.clients() == []


@pytest.mark.parametrize("call,match", [
    (dict(kind="exclusive"), "kind must be one of"),
    (dict(style="lockf"), "style must be one of"),
    (dict(start=-3), "lock range"),
    (dict(end=TO_EOF * 2), "lock range"),
    (dict(ino=0), "ino must be at least 1"),
    (dict(ino=404), "no file has inode 404"),
    (dict(owner=-1), "owner must be at least 0"),
    (dict(owner=1 << 64), "owner must be at most"),
    (dict(wait=-1), "wait must be seconds"),
    (dict(wait="long"), "wait must be seconds"),
    (dict(pid="me"), "pid must be an integer"),
    (dict(client="", ), "client_name must be a non-empty string"),
])
async def test_bad_arguments_get_clear_errors(call, match):
    args = dict(client="a", ino=5, owner=1, kind="write", style="posix", start=0, end=10,
                pid=1, wait=0)
    args.update(call)
    with pytest.raises(InvalidArgument, match=match):
        await service().set(**args)


@pytest.mark.slow
def test_the_lock_calls_on_a_running_server_and_their_volatility(tmp_path):
    """Through the wire: conflicts between two clients, a close's release, bad input
    refused with the server still serving, another client's name refused, and a restart:
    the table is not journaled, its holders are, and they reclaim their locks before
    anyone gets a new one."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.write_file("/f", b"x")
            ino = a.get_file_status("/f").ino
            assert a.lock_set(ino, 1, "write", start=0, end=10, pid=4)["granted"]
            answer = b.lock_set(ino, 1, "read", start=5, end=6)
            assert not answer["granted"] and answer["conflict"]["client_name"] == a.client_name
            assert b.lock_get(ino, 1, "write", 9, 20)["conflict"]["pid"] == 4
            assert b.lock_set(ino, 1, "write", style="flock")["granted"]   # flock is apart
            assert not a.lock_set(ino, 2, "read", style="flock")["granted"]
            for bad in (dict(kind="bogus"), dict(start=10, end=5), dict(end=-1),
                        dict(style=3), dict(owner="me")):
                args = dict(ino=ino, owner=1, kind="write", start=0, end=10)
                args.update(bad)
                with pytest.raises(InvalidArgument):
                    b.lock_set(args.pop("ino"), args.pop("owner"), args.pop("kind"), **args)
            assert a.lock_release(ino, 1) is True
            assert b.lock_set(ino, 1, "read", start=5, end=6)["granted"]
            cluster.kill_meta(sig=15)
            cluster.start_meta()
            cluster.wait_ready(0)
            # the table is volatile, its holders are journaled: both must reclaim (what
            # they hold; a holds nothing) before anyone gets a new lock
            assert a.lock_hold(0) == {"reclaim": True} and b.lock_hold(2)["reclaim"]
            assert a.lock_get(ino, 9, "write", 0, 1 << 63)["grace"] > 0
            assert b.lock_reclaim([
                {"ino": ino, "owner": 1, "kind": "read", "style": "posix", "start": 5,
                 "end": 6, "pid": 0},
                {"ino": ino, "owner": 1, "kind": "write", "style": "flock"}]) == {"lost": []}
            assert a.lock_reclaim([]) == {"lost": []}
            assert a.lock_hold(0) == {"reclaim": False} == b.lock_hold(2)
            answer = a.lock_set(ino, 9, "write", start=0, end=1 << 63)
            assert not answer["granted"] and answer["conflict"]["client_name"] == b.client_name
            assert not a.lock_set(ino, 9, "write", style="flock")["granted"]
            assert b.lock_release_all() == 1
            assert a.lock_set(ino, 9, "write", start=0, end=1 << 63)["granted"]
            assert a.lock_set(ino, 9, "write", style="flock")["granted"]
            # a server that lost the locks of a client that says it holds some asks for them
            assert a.lock_hold(2) == {"reclaim": False}
            assert a.lock_release_all() == 1
            assert a.lock_hold(2) == {"reclaim": True}


async def test_a_client_takes_and_drops_only_its_own_locks(tmp_path):
    server = MetaServer(make_test_config(), MemoryStore(), str(tmp_path / "journal"))
    ctx = CallContext(client_id="mount-b#3", peer="test")
    with pytest.raises(InvalidArgument, match="'mount-a' is not this connection's client "
                                              r"\(mount-b\)"):
        await server.client_protocol.rpc_lock_release_all(ctx, "mount-a")
    assert await server.client_protocol.rpc_lock_release_all(ctx, "mount-b") == 0
