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
* Volatile: the table is not journaled. A restart or an HA failover starts with no locks
  (docs/MOUNT.md says what that means for their holders).

Concurrency contract: trio thread only. ``set`` awaits only in its wait; every table
change is synchronous and wakes the waiters of that file (``_changed``). Every other
method is atomic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from fs.errors import InvalidArgument

from fs.locktable import TO_EOF, FlockLock, LockKind, LockOwner, LockTable, RangeLock
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
    def __init__(self, *, table: LockTable, hard_limit: float,
                 clock: Callable[[], float], inode_exists: Callable[[int], bool]):
        self.table = table
        self.hard_limit = hard_limit
        self.clock = clock
        self.inode_exists = inode_exists
        self._seen: dict[str, float] = {}            # holder -> its last call (clock)
        self._changed: dict[int, trio.Event] = {}    # ino -> set when its locks change

    # ------------------------------------------------------------------ RPC bodies
    def get(self, client, ino, owner, kind, start=0, end=TO_EOF) -> dict:
        """``{conflict}``: the POSIX lock of another owner a ``kind`` lock of
        ``[start, end)`` would conflict with (None: it would be granted)."""
        who = _owner(client, owner)
        check_int(ino, "lock_get: ino", low=1)
        self._called(client)
        return {"conflict": _wire(self.table.test(ino, who, _kind(kind), start, end))}

    async def set(self, client, ino, owner, kind, style="posix", start=0, end=TO_EOF,
                  pid=0, wait=0) -> dict:
        """Take, convert or drop a lock: ``{granted, conflict, held}`` (``held``: the
        owner still holds some lock of this style on the file). With ``wait`` > 0 a
        conflicting lock is waited for, up to ``min(wait, MAX_LOCK_WAIT)`` seconds."""
        who = _owner(client, owner)
        check_int(ino, "lock_set: ino", low=1)
        kind, style = _kind(kind), _style(style)
        check_int(pid, "lock_set: pid", low=0, high=(1 << 31) - 1)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
            raise InvalidArgument(f"lock_set: wait must be seconds >= 0, got {wait!r:.60}")
        if style == "posix":
            self.table.test(ino, who, LockKind.UNLOCK, start, end)   # checks the range
        if kind is not LockKind.UNLOCK and not self.inode_exists(ino):
            raise InvalidArgument(f"lock_set: no file has inode {ino}")
        self._called(client)
        deadline = trio.current_time() + min(wait, MAX_LOCK_WAIT)
        while True:
            if style == "posix":
                conflict = self.table.set_range(ino, who, kind, start, end, pid)
            else:
                conflict = self.table.set_flock(ino, who, kind, pid)
            if conflict is None:
                self._wake(ino)
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

    def release_all(self, client) -> int:
        """Drop every lock of ``client`` (it unmounts); how many files had some."""
        check_name(client, "lock_release_all: client_name")
        return self._drop_client(client)

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
