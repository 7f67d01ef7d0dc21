"""The mount's directory lease holder on its own (``mount/dirleases.py``): what it decides
locally under a grant, with the grant's answer as the server gives it (the mount tests in
tests/test_dirlease_mount.py run it against real servers)."""

from __future__ import annotations

import types

import pytest
import trio
import trio.testing

from fs import dirops
from fs.errors import InvalidArgument, ServerUnavailable
from mount import dirleases
from mount.dirleases import DirLeaseHolder

FOLDER, FILE, SUB = 10, 11, 12


def status(ino: int, name: str, kind: str, mode: int) -> dict:
    """A status in its wire form (``FileStatus.from_wire`` reads it)."""
    return {"name": name, "path": f"/d/{name}" if name else "/d", "ino": ino, "type": kind,
            "mode": mode, "owner": "root", "group": "root", "mtime_ns": 1, "atime_ns": 1,
            "ctime_ns": 1, "length": 0, "replication": 1, "block_size": 1 << 20}


def grant(epoch: int, **extra) -> dict:
    return {"epoch": epoch, "attrs": status(FOLDER, "", "dir", 0o755),
            "entries": [status(FILE, "f", "file", 0o644), status(SUB, "sub", "dir", 0o755)],
            "inos": [0, 0], **extra}


class Refusing:
    """A server that refuses the unlink of "bad" (as a permission it denies would)."""

    def __init__(self):
        self.applied: list = []
        self.rpc = types.SimpleNamespace(user="root", unreachable_since=None)

    async def dir_batch(self, batch):
        failed = [{"index": i, "error": {"type": "PermissionDenied", "message": "denied"}}
                  for i, change in enumerate(batch)
                  if isinstance(change, dirops.Unlink) and change.name == "bad"]
        self.applied += [change for i, change in enumerate(batch)
                         if i not in {f["index"] for f in failed}]
        return {"done": len(batch), "skipped": 0, "failed": failed, "ended": None}

    async def dir_lease_events(self, wait, ack=None):
        # fixed-sleep: the long poll of a server with no recall to send answers after its wait
        await trio.sleep(wait)
        return []


def holder(server=None) -> DirLeaseHolder:
    paths = {FOLDER: "/d", FILE: "/d/f", SUB: "/d/sub"}
    return DirLeaseHolder(server or Refusing(), paths.get, lambda ino: False)


def test_attributes_are_set_locally_only_when_the_grant_says_its_server_applies_them():
    """A grant listing ``setattr`` among its ``changes``: chmod and utimens of a closed
    file are answered from the lease and queued as one change, a chown to the same owner
    changes nothing, a chown to another owner is left to a call. A grant from a server
    that does not list it (an older one, which would refuse the whole batch): nothing is
    decided locally."""
    async def main():
        old = holder()
        old.adopt(FOLDER, grant(5), trio.current_time())
        assert old.set_attrs(FILE, mode=0o600) is None
        assert old.pending == 0

        server = Refusing()
        new = holder(server)
        new.adopt(FOLDER, grant(6, changes=list(dirops.KINDS)), trio.current_time())
        after = new.set_attrs(FILE, mode=0o600, mtime_ns=7)
        assert (after.mode, after.mtime_ns, after.atime_ns) == (0o600, 7, 1)
        assert after.ctime_ns > 1
        assert new.pending == 1
        assert new.set_attrs(FILE, owner="root", group="root").mode == 0o600
        assert new.pending == 1
        assert new.set_attrs(FILE, owner="alice") is None
        assert new.set_attrs(SUB, mode=0o700) is None   # a folder not held here
        # the server known unreachable: nothing is decided here until it answers again
        server.rpc.unreachable_since = 5.0
        assert new.set_attrs(FILE, mode=0o640) is None and new.held(FOLDER) is None
        server.rpc.unreachable_since = None
        assert new.held(FOLDER) is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(new.run)
            await new.flush()
            nursery.cancel_scope.cancel()
        [queued] = server.applied
        assert isinstance(queued, dirops.SetAttr)
        assert (queued.dir, queued.epoch, queued.name, queued.ino, queued.permission,
                queued.owner, queued.mtime_ns) == (FOLDER, 6, "f", FILE, 0o600, None, 7)
        assert dirops.from_wire(queued.to_wire()) == queued

    trio.run(main)


class OldServer:
    """A server that refuses, whole, any batch naming a change it does not know."""

    def __init__(self):
        self.applied: list[str] = []
        self.calls = 0
        self.rpc = types.SimpleNamespace(user="root", unreachable_since=None)

    async def dir_batch(self, batch):
        self.calls += 1
        if any(isinstance(change, dirops.SetAttr) for change in batch):
            raise InvalidArgument("dir_batch: unknown change 'setattr' (unlink, rmdir, "
                                  "rename, create, write, release)")
        self.applied += [change.name for change in batch]
        return {"done": len(batch), "skipped": 0, "failed": [], "ended": None}


@pytest.mark.allow_log_errors("refused", reason="the refused batch and change are logged")
def test_a_batch_refused_whole_loses_only_the_change_refused_alone():
    """The server refuses a batch whole when one change is malformed for it: the holder
    sends the batch's changes one by one, so the others are applied in their order and
    only that one is lost (logged, counted)."""
    async def main():
        server = OldServer()
        held = DirLeaseHolder(server, {}.get, lambda ino: False)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            await held.queue(dirops.Unlink(FOLDER, 1, "a", 20, 0))
            await held.queue(dirops.SetAttr(FOLDER, 1, "b", 21, 0o600, None, None, None,
                                            None, 0))
            await held.queue(dirops.Unlink(FOLDER, 1, "c", 22, 0))
            await held.flush()
            nursery.cancel_scope.cancel()
        assert server.applied == ["a", "c"]
        assert held.lost == 1 and held.pending == 0

    trio.run(main)


@pytest.mark.allow_log_errors("refused", reason="the refused change is logged")
def test_a_refused_change_ends_the_lease_it_was_decided_under():
    """Once the server refuses a change the mount acknowledged, the lease's view is no
    longer the server's: nothing more is decided under it, the changes queued before go
    on, and it is given back after them (then forgotten: the server answers again)."""
    async def main():
        server = Refusing()
        held = holder(server)
        leased = held.adopt(FOLDER, grant(7, changes=list(dirops.KINDS)), trio.current_time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            await held.queue(dirops.Unlink(FOLDER, 7, "bad", 30, 0))
            await held.queue(dirops.Unlink(FOLDER, 7, "good", 31, 0))
            await held.flush()
            assert held.held(FOLDER) is None
            await held.flush()   # the release queued after the refusal
            nursery.cancel_scope.cancel()
        assert [type(c).__name__ for c in server.applied] == ["Unlink", "Release"]
        assert (server.applied[1].dir, server.applied[1].epoch) == (FOLDER, 7)
        assert held.held_count == 0 and held.lost == 1 and leased.giving_back

    trio.run(main)


class Polled:
    """A server whose events poll answers what the test hands it (``say``), or nothing
    at all while ``silent`` (a reply lost, a server that stopped answering)."""

    def __init__(self):
        self.rpc = types.SimpleNamespace(user="root", unreachable_since=None)
        self.acks: list = []
        self.waits: list[float] = []
        self.silent = False
        self._say: list = []

    def say(self, *events):
        self._say.extend(events)

    async def dir_lease_events(self, wait, ack=None):
        self.acks.append(ack)
        self.waits.append(wait)
        if self.silent:
            # fixed-sleep: the client's call timeout (the mock clock jumps it)
            await trio.sleep(7.5)
            raise ServerUnavailable("dir_lease_events: no reply within 7.5 s")
        # fixed-sleep: the long poll of a server with nothing to send answers after its wait
        with trio.move_on_after(wait):
            while not self._say:
                await trio.sleep(0.01)
        out, self._say = self._say, []
        return out

    async def dir_batch(self, batch):
        return {"done": len(batch), "skipped": 0, "failed": [], "ended": None}


def polled_holder(epoch: int) -> tuple[Polled, DirLeaseHolder]:
    """A holder of a lease ``epoch`` on /d (recall limit 10 s) and its ``Polled`` server."""
    server = Polled()
    held = holder(server)
    held.adopt(FOLDER, grant(epoch, recall_limit=10.0), trio.current_time())
    return server, held


def test_a_lease_the_server_ended_answers_nothing_more_and_the_end_is_acknowledged():
    """The server ended the lease without the mount giving it back (a recall that did not
    reach it): once the poll brings the end, nothing is decided or answered from it, and
    the next poll acknowledges the event, so the server stops sending it."""
    async def main():
        server, held = polled_holder(7)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            assert held.held(FOLDER) is not None
            server.say({"path": "/d", "epoch": 7, "ino": FOLDER, "kind": "ended"})
            while held.held_count:
                await trio.sleep(0.01)
            assert held.held(FOLDER) is None and held.known_file(FILE) is None
            while [7, "ended"] not in (server.acks[-1] or []):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        # every poll waited well within the trust of 6 s (the recall limit's share)
        assert server.waits and max(server.waits) <= 2.0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_lease_not_heard_of_for_its_trust_decides_nothing_until_a_poll_answers(monkeypatch):
    """A poll unanswered (its answer lost: a recall in it may be waiting unseen, and the
    server ends a lease whose recall goes unanswered for the recall limit): past the
    trust (0.6 of the limit) since the mount last heard from the server, the lease
    answers nothing; an answered poll makes it usable again."""
    monkeypatch.setattr(dirleases, "IDLE_FOR", 1000.0)   # held unused throughout

    async def main():
        server, held = polled_holder(8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            # fixed-sleep: the times are the subject (the mock clock jumps them)
            await trio.sleep(3)
            assert held.held(FOLDER) is not None
            server.silent = True
            # fixed-sleep: past the trust of 6 s since the last answered poll was sent
            await trio.sleep(6.5)
            assert held.held(FOLDER) is None and held.known_file(FILE) is None
            assert held.held_count == 1   # still the mount's: its changes may be sent
            server.silent = False
            # fixed-sleep: the silent poll times out, the next one answers
            await trio.sleep(5)
            assert held.held(FOLDER) is not None
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_grant_trusted_less_long_than_the_poll_in_flight_waits_is_asked_for_again(
        monkeypatch):
    """A poll sent while a grant was being asked for waits as long as the default trust
    allows; the grant that comes meanwhile says a shorter recall limit. The poll in
    flight is cut short and asked again with the new lease's wait, so the lease stays
    usable all along (before, it answered nothing from 1.2 s after its grant until that
    long poll came back at 2 s, and a tree made meanwhile was made by calls)."""
    monkeypatch.setattr(dirleases, "IDLE_FOR", 1000.0)

    async def main():
        server = Polled()
        held = holder(server)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            with held.asking():
                # fixed-sleep: the poll of a grant being asked for is on its way
                await trio.sleep(0.1)
                assert server.waits == [2.0]
                held.adopt(FOLDER, grant(9, recall_limit=2.0), trio.current_time())
            for _ in range(100):   # 5 s, in steps, each one must find the lease usable
                assert held.held(FOLDER) is not None
                # fixed-sleep: the times are the subject (the mock clock jumps them)
                await trio.sleep(0.05)
            assert max(server.waits[1:]) <= 0.4 + 1e-9
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("reading", [True, False])
def test_a_lease_that_answers_reads_is_not_idle(monkeypatch, reading):
    """A folder whose names and statuses the lease keeps answering (a tree extracted here
    and then read: git add, a build) is kept past ``IDLE_FOR``; one nobody uses is
    given back once ``IDLE_FOR`` passed."""
    monkeypatch.setattr(dirleases, "IDLE_FOR", 2.0)

    async def main():
        server, held = polled_holder(8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held.run)
            for _ in range(60):   # 6 s, three times the idle limit
                if reading:
                    assert held.held(FOLDER) is not None
                    assert held.known_file(FILE) is not None
                # fixed-sleep: the times are the subject (the mock clock jumps them)
                await trio.sleep(0.1)
            assert held.holds(FOLDER) is reading
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
