"""Directory write leases: which client may change a directory ahead of the server, as a
pure state machine (docs/design/dirleases.md).

Why it exists: a mount that holds a directory's lease applies creates, unlinks, renames and
attribute changes in it to its own view at once and sends them to the metadata server
afterwards, in order and batched. Every other client's access to that directory first
recalls the lease: the holder sends what it queued and gives the lease back, then the
access proceeds. This module decides; the server performs (recall messages, journal records
of grants and releases, waking the waiters).

States (``DirLeaseState``) and the events that move them (``DirLeaseEvent``) are ONE
transition table; ``next_state`` refuses a move the table does not have, and every change
of the table goes through it.

* A lease is granted on a directory nobody holds; its ``epoch`` is the journal transaction
  of the grant record, unique across restarts, so a holder's changes sent under an old
  epoch are refused for ever (``check``), even after the directory was leased again.
* Another client's access (a lookup through the directory, a listing, a change, a lease
  request) gets a ``Verdict``: PROCEED when nobody else holds it, RECALL when the server
  must send the holder a recall now (the lease becomes RECALLING with a deadline
  ``recall_limit`` ahead), WAIT when a recall is already under way.
* The holder's changes (``flush``) are accepted under its current epoch in both states;
  while recalling, each batch moves the deadline ``recall_limit`` past its arrival: a holder
  that is sending is alive, one that is silent loses the lease (``overdue``), as does one
  whose client lease ran out (``held_by``, for the lease monitor). The server's namespace
  is then a prefix of what the holder sent.
* At start, the leases in the journal come back HELD with fresh timers (``rebuild``): a
  recall in progress at a crash is sent again by the next access.
* A grant may reserve a range of inode ids (``InoRange``) for the files its holder creates
  in the directory ahead of the server; the range is the lease's for its whole life (a
  holder asking again gets it back) and comes back with it at a restart.

Pure: no I/O, no clock (``now`` is passed in), no awaits. Concurrency contract: called only
from the metadata server's trio thread; every method is atomic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from fs.errors import InvalidArgument, LeaseExpired


class DirLeaseState(str, enum.Enum):
    HELD = "HELD"              # the holder changes the directory ahead of the server
    RECALLING = "RECALLING"    # another client waits: the holder flushes, then gives it back


class DirLeaseEvent(str, enum.Enum):
    GRANT = "grant"            # a client asks for a directory nobody holds
    RECALL = "recall"          # another client's access needs the directory
    FLUSH = "flush"            # a batch of the holder's queued changes arrives
    RELEASE = "release"        # the holder gives the lease back
    EXPIRE = "expire"          # a recall unanswered in time, or the holder's client lease ended
    RESTART = "restart"        # rebuilt from the journal at start


S, E = DirLeaseState, DirLeaseEvent

#: (state before or None for "no lease", event) -> state after (None = no lease).
#: Pairs that are missing are refused by ``next_state``.
TRANSITIONS: dict[tuple[DirLeaseState | None, DirLeaseEvent], DirLeaseState | None] = {
    (None, E.GRANT): S.HELD,
    (None, E.RESTART): S.HELD,
    (S.HELD, E.RECALL): S.RECALLING,
    (S.RECALLING, E.RECALL): S.RECALLING,     # one more waiter, the same recall
    (S.HELD, E.FLUSH): S.HELD,
    (S.RECALLING, E.FLUSH): S.RECALLING,
    (S.HELD, E.RELEASE): None,
    (S.RECALLING, E.RELEASE): None,
    (S.HELD, E.EXPIRE): None,
    (S.RECALLING, E.EXPIRE): None,
}
del S, E


def next_state(state: DirLeaseState | None, event: DirLeaseEvent) -> DirLeaseState | None:
    """The state after ``event``; ``InvalidArgument`` if the table has no such transition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        where = "a directory nobody holds" if state is None else f"a {state.value} lease"
        raise InvalidArgument(f"directory lease: {event.value} is not allowed on {where}") \
            from None


class Verdict(str, enum.Enum):
    """What another client's access to a directory must do first."""

    PROCEED = "proceed"    # nobody else holds it
    RECALL = "recall"      # send the holder a recall now, then wait for the directory
    WAIT = "wait"          # a recall is under way: wait for the directory


@dataclass(frozen=True)
class InoRange:
    """Inode ids ``first`` .. ``first + count - 1`` a grant reserved for its holder's
    creates in the directory (count 0: none)."""
    first: int = 0
    count: int = 0

    def __contains__(self, ino: int) -> bool:
        return self.first <= ino < self.first + self.count

    def to_wire(self) -> list[int]:
        return [self.first, self.count]

    def __str__(self) -> str:
        if not self.count:
            return "none"
        return f"{self.first} to {self.first + self.count - 1}"


NO_INOS = InoRange()


@dataclass(frozen=True)
class DirLease:
    ino: int
    holder: str
    epoch: int                      # the journal transaction of its grant
    state: DirLeaseState
    recall_deadline: float | None   # RECALLING: given back or flushing again by then
    inos: InoRange = NO_INOS        # reserved by its grant (or last refill) for its creates
    # the range before the last refill: the holder's changes queued before the refill
    # still use it (it asks for a refill only once it took its last range)
    earlier: InoRange = NO_INOS

    def range_of(self, ino: int) -> InoRange | None:
        """The reserved range that holds ``ino``, or None."""
        if ino in self.inos:
            return self.inos
        if ino in self.earlier:
            return self.earlier
        return None

    def reserved_text(self) -> str:
        """The reserved ids, for an error."""
        return str(self.inos) if not self.earlier.count else f"{self.earlier}, {self.inos}"


@dataclass(frozen=True)
class StoredLease:
    """A live lease as the journal keeps it (what ``rebuild`` takes)."""
    ino: int
    holder: str
    epoch: int
    inos: InoRange = NO_INOS
    earlier: InoRange = NO_INOS


class DirLeaseTable:
    """The directory leases of one metadata server, by directory and by holder."""

    def __init__(self, recall_limit: float):
        if recall_limit <= 0:
            raise InvalidArgument(f"recall_limit must be positive, not {recall_limit!r}")
        self.recall_limit = recall_limit
        self._by_ino: dict[int, DirLease] = {}
        self._by_holder: dict[str, set[int]] = {}

    # ------------------------------------------------------------------ queries
    def lease_of(self, ino: int) -> DirLease | None:
        return self._by_ino.get(ino)

    def held_by(self, holder: str) -> list[DirLease]:
        """The leases ``holder`` holds, by directory (what its client lease's end takes)."""
        return [self._by_ino[ino] for ino in sorted(self._by_holder.get(holder, ()))]

    def held_by_others(self, client: str) -> list[int]:
        """The directories leased to anyone but ``client``."""
        return [ino for ino, lease in self._by_ino.items() if lease.holder != client]

    def overdue(self, now: float) -> list[DirLease]:
        """Leases being recalled whose holder neither gave them back nor flushed in time."""
        return [lease for lease in self._by_ino.values()
                if lease.state is DirLeaseState.RECALLING and lease.recall_deadline <= now]

    def __len__(self) -> int:
        return len(self._by_ino)

    def access(self, ino: int, client: str, now: float) -> Verdict:
        """What ``client``'s access to directory ``ino`` must do first (a RECALL verdict
        has already moved the lease to RECALLING: send the recall once)."""
        lease = self._by_ino.get(ino)
        if lease is None or lease.holder == client:
            return Verdict.PROCEED
        state = next_state(lease.state, DirLeaseEvent.RECALL)
        if lease.state is DirLeaseState.RECALLING:
            return Verdict.WAIT
        self._put(replace(lease, state=state, recall_deadline=now + self.recall_limit))
        return Verdict.RECALL

    def held(self, ino: int, holder: str, epoch: int) -> DirLease | None:
        """The lease ``holder`` holds on ``ino`` under ``epoch``, or None."""
        lease = self._by_ino.get(ino)
        if lease is None or lease.holder != holder or lease.epoch != epoch:
            return None
        return lease

    def check(self, ino: int, holder: str, epoch: int, what: str) -> DirLease:
        """The lease ``holder`` holds on ``ino`` under ``epoch``; ``LeaseExpired`` naming
        ``what`` (the directory's path) when it holds none or an older one."""
        lease = self._by_ino.get(ino)
        if lease is None or lease.holder != holder or lease.epoch != epoch:
            now_held = "nobody holds it now" if lease is None else (
                f"{lease.holder} holds it now" if lease.holder != holder
                else f"its lease is now epoch {lease.epoch}")
            raise LeaseExpired(f"{what}: the directory lease (epoch {epoch}) of {holder} "
                               f"has ended ({now_held})")
        return lease

    # ------------------------------------------------------------------ state changes
    def grant(self, ino: int, holder: str, epoch: int,
              inos: InoRange = NO_INOS) -> DirLease:
        """``holder`` now holds ``ino`` under ``epoch``, with the inode ids ``inos``
        reserved (the caller journaled the grant after ``access`` said PROCEED for it)."""
        current = self._by_ino.get(ino)
        if current is not None and current.holder == holder:
            raise InvalidArgument(f"directory {ino} is already leased to {holder} "
                                  f"(epoch {current.epoch})")
        state = next_state(None if current is None else current.state, DirLeaseEvent.GRANT)
        lease = DirLease(ino, holder, epoch, state, None, inos)
        self._put(lease)
        return lease

    def refill(self, ino: int, holder: str, epoch: int, inos: InoRange,
               what: str) -> DirLease:
        """``holder``'s lease ``epoch`` on ``ino`` gets fresh ids ``inos`` (journaled by
        the caller); the range it had stays usable, the one before it goes. No change of
        state: a refill is not an event of the lease's life."""
        lease = self.check(ino, holder, epoch, what)
        lease = replace(lease, inos=inos, earlier=lease.inos)
        self._put(lease)
        return lease

    def flush(self, ino: int, holder: str, epoch: int, now: float, what: str) -> DirLease:
        """A batch of ``holder``'s changes in ``ino`` arrived under ``epoch``: accepted
        (``check``), and a recall's deadline moves ``recall_limit`` past now."""
        lease = self.check(ino, holder, epoch, what)
        state = next_state(lease.state, DirLeaseEvent.FLUSH)
        if state is DirLeaseState.RECALLING:
            lease = replace(lease, recall_deadline=now + self.recall_limit)
            self._put(lease)
        return lease

    def release(self, ino: int, holder: str, epoch: int, what: str) -> DirLease:
        """``holder`` gives ``ino`` back (after its last batch); ``LeaseExpired`` if the
        lease had already ended."""
        lease = self.check(ino, holder, epoch, what)
        next_state(lease.state, DirLeaseEvent.RELEASE)
        self._drop(lease)
        return lease

    def expire(self, ino: int) -> DirLease | None:
        """The lease on ``ino`` ends without its holder (overdue recall, client lease
        ended); its later batches are refused. None if there was none."""
        lease = self._by_ino.get(ino)
        if lease is None:
            return None
        next_state(lease.state, DirLeaseEvent.EXPIRE)
        self._drop(lease)
        return lease

    def rebuild(self, stored: list[StoredLease]) -> None:
        """At start: the leases the journal holds, all HELD (the waiters of a recall died
        with the old process; the next access recalls again), with their reserved
        inodes."""
        self._by_ino.clear()
        self._by_holder.clear()
        for one in stored:
            current = self._by_ino.get(one.ino)   # a second grant of one directory is refused
            state = next_state(None if current is None else current.state,
                               DirLeaseEvent.RESTART)
            self._put(DirLease(one.ino, one.holder, one.epoch, state, None, one.inos,
                               one.earlier))

    # ------------------------------------------------------------------ internals
    def _put(self, lease: DirLease) -> None:
        old = self._by_ino.get(lease.ino)
        if old is not None and old.holder != lease.holder:
            self._unindex(old)
        self._by_ino[lease.ino] = lease
        self._by_holder.setdefault(lease.holder, set()).add(lease.ino)

    def _drop(self, lease: DirLease) -> None:
        del self._by_ino[lease.ino]
        self._unindex(lease)

    def _unindex(self, lease: DirLease) -> None:
        inos = self._by_holder.get(lease.holder)
        if inos is not None:
            inos.discard(lease.ino)
            if not inos:
                del self._by_holder[lease.holder]
