"""The directory lease table (``meta/leases/dirleases.py``): its transition table, its rules
one by one, and a stateful property test that drives it with random grants, accesses,
batches, releases, recalls running out, client leases ending and restarts from several
clients, against a sequential model of who holds what."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fs.errors import InvalidArgument, LeaseExpired
from meta.leases.dirleases import (NO_INOS, TRANSITIONS, DirLeaseEvent, DirLeaseState,
                                   DirLeaseTable, InoRange, StoredLease, Verdict, next_state)

LIMIT = 5.0


def test_every_move_outside_the_table_is_refused():
    for state in (None, *DirLeaseState):
        for event in DirLeaseEvent:
            if (state, event) in TRANSITIONS:
                assert next_state(state, event) == TRANSITIONS[(state, event)]
            else:
                with pytest.raises(InvalidArgument, match=event.value):
                    next_state(state, event)


def test_an_access_recalls_once_and_the_holder_keeps_flushing_until_it_gives_back():
    table = DirLeaseTable(recall_limit=LIMIT)
    assert table.access(7, "a", now=0) is Verdict.PROCEED
    table.grant(7, "a", epoch=100)
    assert table.access(7, "a", now=1) is Verdict.PROCEED          # the holder itself
    assert table.access(7, "b", now=2) is Verdict.RECALL
    assert table.lease_of(7).state is DirLeaseState.RECALLING
    assert table.access(7, "c", now=3) is Verdict.WAIT             # one recall for all
    assert table.overdue(now=6.9) == []
    table.flush(7, "a", 100, now=6, what="/d")                     # alive: deadline moves
    assert table.overdue(now=10.9) == [] and len(table.overdue(now=11)) == 1
    table.release(7, "a", 100, what="/d")
    assert table.lease_of(7) is None and table.held_by("a") == []
    assert table.access(7, "b", now=12) is Verdict.PROCEED


def test_a_batch_under_an_ended_or_older_lease_is_refused_for_ever():
    table = DirLeaseTable(recall_limit=LIMIT)
    table.grant(7, "a", epoch=100)
    table.access(7, "b", now=0)
    assert table.expire(7).holder == "a"                           # recall unanswered
    with pytest.raises(LeaseExpired, match="/d: the directory lease .epoch 100. of a has "
                                           "ended .nobody holds it now."):
        table.flush(7, "a", 100, now=1, what="/d")
    table.grant(7, "b", epoch=101)
    with pytest.raises(LeaseExpired, match="b holds it now"):
        table.release(7, "a", 100, what="/d")
    table.release(7, "b", 101, what="/d")
    table.grant(7, "a", epoch=102)
    with pytest.raises(LeaseExpired, match="its lease is now epoch 102"):
        table.flush(7, "a", 100, now=2, what="/d")                 # an old epoch of its own


def test_a_grants_reserved_inodes_stay_with_its_lease_and_come_back_at_a_restart():
    table = DirLeaseTable(recall_limit=LIMIT)
    table.grant(1, "a", epoch=10, inos=InoRange(500, 16))
    table.grant(2, "a", epoch=11)
    assert table.lease_of(2).inos == NO_INOS and 500 not in NO_INOS
    lease = table.lease_of(1)
    assert 500 in lease.inos and 515 in lease.inos and 516 not in lease.inos
    assert 499 not in lease.inos and lease.inos.to_wire() == [500, 16]
    table.access(1, "b", now=0)   # recalling keeps it
    assert table.lease_of(1).inos == InoRange(500, 16)
    restarted = DirLeaseTable(recall_limit=LIMIT)
    restarted.rebuild([StoredLease(x.ino, x.holder, x.epoch, x.inos) for x in table.held_by("a")])
    assert [x.inos for x in restarted.held_by("a")] == [InoRange(500, 16), NO_INOS]


def test_a_held_directory_is_not_granted_again_and_a_restart_keeps_the_leases():
    table = DirLeaseTable(recall_limit=LIMIT)
    table.grant(1, "a", epoch=10)
    table.grant(2, "a", epoch=11)
    with pytest.raises(InvalidArgument, match="already leased to a"):
        table.grant(1, "a", epoch=12)
    with pytest.raises(InvalidArgument, match="grant is not allowed on a HELD lease"):
        table.grant(1, "b", epoch=12)
    table.access(1, "b", now=0)
    restarted = DirLeaseTable(recall_limit=LIMIT)
    restarted.rebuild([StoredLease(lease.ino, lease.holder, lease.epoch)
                       for lease in table.held_by("a")])
    assert [(x.ino, x.epoch, x.state) for x in restarted.held_by("a")] == [
        (1, 10, DirLeaseState.HELD), (2, 11, DirLeaseState.HELD)]   # recalled again later
    with pytest.raises(InvalidArgument, match="restart is not allowed"):
        restarted.rebuild([StoredLease(1, "a", 10), StoredLease(1, "b", 12)])
    with pytest.raises(InvalidArgument, match="recall_limit"):
        DirLeaseTable(recall_limit=0)


CLIENTS = ("a", "b", "c")
DIRS = (1, 2, 3)


class Model:
    """Who holds which directory, in the plainest terms: ``held[ino] = [holder, epoch,
    recall_deadline or None]``."""

    def __init__(self):
        self.held: dict[int, list] = {}


class DirLeaseMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.table = DirLeaseTable(recall_limit=LIMIT)
        self.model = Model()
        self.now = 0.0
        self.epochs = [0]          # every epoch handed out (0: never)

    @rule(client=st.sampled_from(CLIENTS), ino=st.sampled_from(DIRS))
    def access(self, client, ino):
        held = self.model.held.get(ino)
        verdict = self.table.access(ino, client, self.now)
        if held is None or held[0] == client:
            assert verdict is Verdict.PROCEED
        elif held[2] is None:
            assert verdict is Verdict.RECALL
            held[2] = self.now + LIMIT
        else:
            assert verdict is Verdict.WAIT

    @rule(client=st.sampled_from(CLIENTS), ino=st.sampled_from(DIRS))
    def grant(self, client, ino):
        held = self.model.held.get(ino)
        epoch = self.epochs[-1] + 1
        if held is not None:
            with pytest.raises(InvalidArgument):
                self.table.grant(ino, client, epoch)
            return
        self.table.grant(ino, client, epoch)
        self.epochs.append(epoch)
        self.model.held[ino] = [client, epoch, None]

    @rule(client=st.sampled_from(CLIENTS), ino=st.sampled_from(DIRS), data=st.data())
    def flush(self, client, ino, data):
        epoch = data.draw(st.sampled_from(self.epochs))
        held = self.model.held.get(ino)
        if held is None or held[:2] != [client, epoch]:
            with pytest.raises(LeaseExpired):
                self.table.flush(ino, client, epoch, self.now, what=f"/d{ino}")
            return
        self.table.flush(ino, client, epoch, self.now, what=f"/d{ino}")
        if held[2] is not None:
            held[2] = self.now + LIMIT

    @rule(client=st.sampled_from(CLIENTS), ino=st.sampled_from(DIRS), data=st.data())
    def release(self, client, ino, data):
        epoch = data.draw(st.sampled_from(self.epochs))
        held = self.model.held.get(ino)
        if held is None or held[:2] != [client, epoch]:
            with pytest.raises(LeaseExpired):
                self.table.release(ino, client, epoch, what=f"/d{ino}")
            return
        self.table.release(ino, client, epoch, what=f"/d{ino}")
        del self.model.held[ino]

    # the holders' own calls under their current epoch (the random ones above are mostly
    # refused: a stale epoch, another client)
    @precondition(lambda self: self.model.held)
    @rule(data=st.data())
    def holder_flushes(self, data):
        ino = data.draw(st.sampled_from(sorted(self.model.held)))
        held = self.model.held[ino]
        lease = self.table.flush(ino, held[0], held[1], self.now, what=f"/d{ino}")
        if held[2] is not None:
            held[2] = self.now + LIMIT
        assert lease.recall_deadline == held[2]

    @precondition(lambda self: self.model.held)
    @rule(data=st.data())
    def holder_releases(self, data):
        ino = data.draw(st.sampled_from(sorted(self.model.held)))
        holder, epoch, _ = self.model.held.pop(ino)
        self.table.release(ino, holder, epoch, what=f"/d{ino}")

    @rule(dt=st.sampled_from((0.5, 1.0, 4.0, 6.0)))
    def tick(self, dt):
        self.now += dt

    @rule()
    def expire_overdue(self):
        due = {lease.ino for lease in self.table.overdue(self.now)}
        assert due == {ino for ino, held in self.model.held.items()
                       if held[2] is not None and held[2] <= self.now}
        for ino in due:
            self.table.expire(ino)
            del self.model.held[ino]

    @rule(client=st.sampled_from(CLIENTS))
    def client_lease_ends(self, client):
        for lease in self.table.held_by(client):
            assert self.table.expire(lease.ino) == lease
        self.model.held = {ino: held for ino, held in self.model.held.items()
                           if held[0] != client}

    @precondition(lambda self: self.model.held)
    @rule()
    def restart(self):
        grants = [StoredLease(ino, held[0], held[1]) for ino, held in self.model.held.items()]
        self.table = DirLeaseTable(recall_limit=LIMIT)
        self.table.rebuild(grants)
        for held in self.model.held.values():
            held[2] = None

    @invariant()
    def the_table_is_the_model(self):
        for ino in DIRS:
            lease, held = self.table.lease_of(ino), self.model.held.get(ino)
            if held is None:
                assert lease is None
                continue
            assert (lease.holder, lease.epoch, lease.recall_deadline) == tuple(held)
            assert lease.state is (DirLeaseState.HELD if held[2] is None
                                   else DirLeaseState.RECALLING)
        for client in CLIENTS:
            assert {lease.ino for lease in self.table.held_by(client)} == {
                ino for ino, held in self.model.held.items() if held[0] == client}
        assert len(self.table) == len(self.model.held)


TestDirLeaseMachine = DirLeaseMachine.TestCase
TestDirLeaseMachine.settings = settings(max_examples=300, stateful_step_count=40,
                                        deadline=None, derandomize=True, database=None)
