"""Cluster-wide file locks, served: ``lock_get``, ``lock_set`` (waiting in bounded long
polls), ``lock_release`` and ``lock_release_all`` (docs/PROTOCOL.md §2, docs/MOUNT.md).

Why it exists: ``fs.locktable.LockTable`` decides who conflicts (pure); this service
checks the calls' arguments, makes a waiting ``lock_set`` wait for the file's locks to
change, and ends the locks of a holder that went silent.

* A holder is a client name (the mount's client, the one its file leases use). It is
  alive while it calls: any lock call, a waiting ``lock_set`` while it waits, and
  ``renew_lease`` (the mount renews while it holds locks). Silent for ``lease_hard_limit``
  (``expire_silent``, from the lease monitor), its locks go and their waiters look again:
  a killed mount's locks end with its lease, as its files' leases do.
* A waiting ``lock_set`` (F_SETLKW, blocking flock) waits at most ``MAX_LOCK_WAIT``
  seconds (and at most its ``wait``) for the file's locks to change, then answers
  ``granted: false``; the mount asks again (so a caller interrupted meanwhile stops
  waiting, and no call outlives the client's RPC timeout). No queue: whoever asks first
  after a release gets the lock. Deadlocks are not detected (no EDEADLK).
* The table is volatile (not journaled: a lock changes far more often than anything
  journaled); its holders are (``LOCK_HOLDER``, durably before a client's first lock is
  granted; ``LOCK_HOLDER_GONE`` once it held none for ``grace`` seconds, or unmounted).
  After a restart or on an HA successor (``rebuild``) the service is in its **grace**:
  no new lock is granted until every holder on record has reclaimed its locks
  (``reclaim``, which a holder makes when ``hold`` says so; it checks every second while
  it holds a lock, and for a while after its last one went) or ``grace`` seconds passed.
  A lock request meanwhile waits (an unlock does not); a ``lock_get`` answers ``grace``
  and is asked again. So a process that held a lock through the restart still holds it,
  and nobody else got it meanwhile (NFSv4's grace period).

Concurrency contract: trio thread only. ``set`` awaits only in its wait; every table
change is synchronous and wakes the waiters of that file (``_changed``). Every other
method is atomic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from fs.errors import InvalidArgument

from fs.locktable import TO_EOF, FlockLock, LockKind, LockOwner, LockTable, RangeLock
from ..journal.ops_locks import LockHolder, LockHolderGone
from ..namespace.args import check_int, check_name

log = logging.getLogger(__name__)

#: the longest one ``lock_set`` waits before it answers ``granted: false`` (the mount
#: asks again): well under a client's rpc_timeout
MAX_LOCK_WAIT = 10.0
#: the lock owner ids the kernel gives are 64-bit
MAX_OWNER = (1 << 64) - 1
STYLES = ("posix", "flock")


def _kind(kind) -> LockKind:
    try:
        return LockKind(kind)
    except ValueError:
        raise InvalidArgument(f"lock: kind must be one of {[k.value for k in LockKind]}, got "
                              f"{kind!r:.60}") from None


def _style(style) -> str:
    if style not in STYLES:
        raise InvalidArgument(f"lock: style must be one of {list(STYLES)}, got {style!r:.60}")
    return style


def _owner(client, owner) -> LockOwner:
    check_name(client, "lock: client_name")
    check_int(owner, "lock: owner", low=0, high=MAX_OWNER)
    return LockOwner(client, owner)


def _wire(lock: RangeLock | FlockLock | None) -> dict | None:
    """A conflicting lock as the answer names it."""
    if lock is None:
        return None
    out = {"client_name": lock.owner.client, "owner": lock.owner.owner,
           "kind": lock.kind.value, "pid": lock.pid}
    if isinstance(lock, RangeLock):
        out.update(start=lock.start, end=lock.end)
    return out


class Locks:
    def __init__(self, *, table: LockTable, hard_limit: float, grace: float, edits,
                 clock: Callable[[], float], wall_ns: Callable[[], int],
                 inode_exists: Callable[[int], bool]):
        self.table = table
        self.hard_limit = hard_limit
        self.grace = grace
        self.edits = edits
        self.clock = clock
        self.wall_ns = wall_ns
        self.inode_exists = inode_exists
        self._seen: dict[str, float] = {}            # holder -> its last call (clock)
        self._changed: dict[int, trio.Event] = {}    # ino -> set when its locks change
        self._holders: set[str] = set()              # clients with a LOCK_HOLDER record
        self._recording: dict[str, trio.Event] = {}  # client -> set once its record is in
        self._idle_since: dict[str, float] = {}      # holder -> since it holds no lock
        # the holders on record at the last rebuild that have not reclaimed since, and
        # when the grace ends at the latest (clock)
        self._reclaiming: set[str] = set()
        self._grace_end = -math.inf
        self._grace_over = trio.Event()
        self._grace_over.set()

    # ------------------------------------------------------------------ RPC bodies
    def get(self, client, ino, owner, kind, start=0, end=TO_EOF) -> dict:
        """``{conflict}``: the POSIX lock of another owner a ``kind`` lock of
        ``[start, end)`` would conflict with (None: it would be granted); in the grace
        also ``grace`` (seconds left at most: the table is not whole yet, ask again)."""
        who = _owner(client, owner)
        check_int(ino, "lock_get: ino", low=1)
        self._called(client)
        answer = {"conflict": _wire(self.table.test(ino, who, _kind(kind), start, end))}
        left = self.grace_left()
        if left > 0:
            answer["grace"] = left
        return answer

    async def set(self, client, ino, owner, kind, style="posix", start=0, end=TO_EOF,
                  pid=0, wait=0) -> dict:
        """Take, convert or drop a lock: ``{granted, conflict, held}`` (``held``: the
        owner still holds some lock of this style on the file). With ``wait`` > 0 a
        conflicting lock is waited for, up to ``min(wait, MAX_LOCK_WAIT)`` seconds."""
        who, kind, style = self._checked("lock_set", client, ino, owner, kind, style, start,
                                         end, pid)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise InvalidArgument(f"lock_set: wait must be seconds >= 0, got {wait!r:.60}")
        if kind is not LockKind.UNLOCK and not self.inode_exists(ino):
            raise InvalidArgument(f"lock_set: no file has inode {ino}")
        self._called(client)
        deadline = trio.current_time() + min(wait, MAX_LOCK_WAIT)
        if kind is not LockKind.UNLOCK:
            left = await self._through_grace()
            if left > 0:
                return {"granted": False, "conflict": None,
                        "held": self._holds(ino, who, style), "grace": left}
            await self._recorded(client)
        while True:
            conflict = self._take(ino, who, kind, style, start, end, pid)
            if conflict is None:
                return {"granted": True, "conflict": None, "held": self._holds(ino, who, style)}
            if trio.current_time() >= deadline:
                return {"granted": False, "conflict": _wire(conflict),
                        "held": self._holds(ino, who, style)}
            changed = self._changed.setdefault(ino, trio.Event())
            with trio.move_on_at(deadline):
                await changed.wait()
            self._called(client)   # a waiter is alive

    def release(self, client, ino, owner, style="posix") -> bool:
        """Drop every lock of this style ``owner`` holds on ``ino`` (a close); whether
        there was any."""
        who = _owner(client, owner)
        check_int(ino, "lock_release: ino", low=1)
        style = _style(style)
        self._called(client)
        found = self.table.release_owner(ino, who, flock=style == "flock")
        if found:
            self._wake(ino)
        return found

    async def release_all(self, client) -> int:
        """Drop every lock of ``client`` (it unmounts); how many files had some. Its
        holder record goes too."""
        check_name(client, "lock_release_all: client_name")
        dropped = self._drop_client(client)
        await self._forget(client)
        return dropped

    def hold(self, client, held=0) -> dict:
        """A holder's check (every second while it holds locks, and for a while after;
        ``held``: how many it holds): ``{reclaim}``, true when it must reclaim its locks:
        the server restarted or failed over since it took them (its record says it may
        hold some), or this table has none of the ones it says it holds."""
        check_name(client, "lock_hold: client_name")
        check_int(held, "lock_hold: held", low=0)
        self._called(client)
        return {"reclaim": client in self._reclaiming
                or bool(held) and not self.table.inodes_of(client)}

    async def reclaim(self, client, locks) -> dict:
        """``client`` takes back every lock it held before a restart or failover (all of
        them, in one call; none: it holds none now): ``{lost: [index]}``, the ones another
        owner holds now (only after the grace: a reclaim in time finds them free). Its
        part of the grace is over."""
        check_name(client, "lock_reclaim: client_name")
        if not isinstance(locks, list):
            raise InvalidArgument("lock_reclaim: locks must be a list")
        wanted = [self._reclaimed(client, index, lock) for index, lock in enumerate(locks)]
        self._called(client)
        if wanted:
            await self._recorded(client)
        lost = []
        for index, lock in enumerate(wanted):
            if self._take(*lock) is not None:
                lost.append(index)
        if lost:
            log.warning("%s reclaimed %d lock(s) after the grace: %d were taken meanwhile",
                        client, len(locks), len(lost))
        self._reclaiming.discard(client)
        if not self._reclaiming:
            self._end_grace()
        return {"lost": lost}

    def grace_left(self) -> float:
        """Seconds the grace may still last (0: over)."""
        if not self._reclaiming:
            return 0.0
        return max(0.0, self._grace_end - self.clock())

    def rebuild(self, holders: list[str]) -> None:
        """After a start or on taking over as active: the holders on record may hold locks
        this table does not have: the grace starts (if there are any)."""
        self._holders = set(holders)
        self._reclaiming = set(holders)
        now = self.clock()
        self._idle_since = {client: now for client in holders}
        self._grace_end = now + self.grace
        if holders:
            self._grace_over = trio.Event()
            log.info("locks: waiting up to %g s for %d client(s) to reclaim their locks "
                     "before granting new ones", self.grace, len(holders))
        else:
            self._end_grace()

    async def forget_idle(self) -> None:
        """The lease monitor's pass: the grace ends once it has lasted ``grace`` seconds;
        the record of a holder that held no lock for ``grace`` seconds goes."""
        if self._reclaiming and self.grace_left() <= 0:
            log.warning("locks: the grace is over; %d client(s) did not reclaim: %s",
                        len(self._reclaiming), ", ".join(sorted(self._reclaiming)))
            self._end_grace()
        now = self.clock()
        for client in list(self._holders):
            if self.table.inodes_of(client) or client in self._recording:
                self._idle_since.pop(client, None)
            elif now - self._idle_since.setdefault(client, now) > self.grace:
                await self._forget(client)

    # ------------------------------------------------------------------ liveness
    def renewed(self, client: str) -> None:
        """``client`` is alive (``renew_lease``): noted for holders of locks only."""
        if client in self._seen:
            self._seen[client] = self.clock()

    def _called(self, client: str) -> None:
        """``client`` made a lock call: alive."""
        self._seen[client] = self.clock()

    def expire_silent(self) -> int:
        """End the locks of every holder silent for the lease hard limit (the lease
        monitor); how many holders."""
        now = self.clock()
        ended = 0
        for client, seen in list(self._seen.items()):
            if not self.table.inodes_of(client):
                del self._seen[client]   # holds nothing: nothing to end
                continue
            if now - seen > self.hard_limit:
                del self._seen[client]
                log.warning("locks of %s end: silent for %g s (lease hard limit)", client,
                            self.hard_limit)
                self._drop_client(client)
                ended += 1
        return ended

    # ------------------------------------------------------------------ internals
    async def _through_grace(self) -> float:
        """Wait while the grace lasts, at most ``MAX_LOCK_WAIT``: the seconds it may still
        last (0: over)."""
        left = self.grace_left()
        if left > 0:
            with trio.move_on_after(min(left, MAX_LOCK_WAIT)):
                await self._grace_over.wait()
        return self.grace_left()

    def _end_grace(self) -> None:
        self._reclaiming.clear()
        self._grace_over.set()

    async def _recorded(self, client: str) -> None:
        """Journal ``client`` as a lock holder (durably) unless it is on record."""
        while client not in self._holders:
            writing = self._recording.get(client)
            if writing is not None:
                await writing.wait()
                continue
            writing = self._recording[client] = trio.Event()
            try:
                await self.edits.log_plan(LockHolder(client=client, time=self.wall_ns()))
                self._holders.add(client)
            finally:
                del self._recording[client]
                writing.set()

    async def _forget(self, client: str) -> None:
        """``client`` holds no lock: its record goes (lazily: a stale one only makes a
        restarted server wait for a reclaim)."""
        self._idle_since.pop(client, None)
        self._reclaiming.discard(client)
        if not self._reclaiming:
            self._end_grace()
        if client in self._holders:
            self._holders.discard(client)
            await self.edits.log_plan(LockHolderGone(client=client), durable=False)

    def _checked(self, what: str, client, ino, owner, kind, style, start, end,
                 pid) -> tuple[LockOwner, LockKind, str]:
        """One lock's arguments checked (``what``: the call, for the errors): its owner,
        kind and style."""
        who = _owner(client, owner)
        check_int(ino, f"{what}: ino", low=1)
        kind, style = _kind(kind), _style(style)
        check_int(pid, f"{what}: pid", low=0, high=(1 << 31) - 1)
        if style == "posix":
            self.table.test(ino, who, LockKind.UNLOCK, start, end)   # checks the range
        return who, kind, style

    def _take(self, ino: int, who: LockOwner, kind: LockKind, style: str, start: int,
              end: int, pid: int) -> RangeLock | FlockLock | None:
        """Set the lock in the table (waking the file's waiters), or the lock of another
        owner it conflicts with (nothing changed)."""
        if style == "posix":
            conflict = self.table.set_range(ino, who, kind, start, end, pid)
        else:
            conflict = self.table.set_flock(ino, who, kind, pid)
        if conflict is None:
            self._wake(ino)
        return conflict

    def _reclaimed(self, client: str, index: int, lock) -> tuple:
        what = f"lock_reclaim: lock {index}"
        if not isinstance(lock, dict):
            raise InvalidArgument(f"{what} must be a map")
        ino, start, end = lock.get("ino"), lock.get("start", 0), lock.get("end", TO_EOF)
        pid = lock.get("pid", 0)
        who, kind, style = self._checked(what, client, ino, lock.get("owner"), lock.get("kind"),
                                         lock.get("style", "posix"), start, end, pid)
        if kind is LockKind.UNLOCK:
            raise InvalidArgument(f"{what}: kind must be read or write")
        return ino, who, kind, style, start, end, pid

    def _holds(self, ino: int, who: LockOwner, style: str) -> bool:
        if style == "flock":
            return any(lock.owner == who for lock in self.table.flocks(ino))
        return any(lock.owner == who for lock in self.table.ranges(ino))

    def _drop_client(self, client: str) -> int:
        inos = self.table.release_client(client)
        for ino in inos:
            self._wake(ino)
        return len(inos)

    def _wake(self, ino: int) -> None:
        changed = self._changed.pop(ino, None)
        if changed is not None:
            changed.set()
