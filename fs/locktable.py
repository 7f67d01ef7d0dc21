"""Cluster-wide file locks: ``flock(2)`` locks and POSIX (``fcntl``) record locks of every
mount, as one pure table (docs/MOUNT.md, "Locks"; docs/PROTOCOL.md, ``lock_*``).

Why it exists: with the kernel's lock requests sent to the mount (pyfuse3 with the lock
handlers), a lock taken through one mount must be seen by every other; the metadata
server keeps them all, under the holders' client leases. This module decides (who
conflicts, what a lock call leaves behind); ``meta.services.locks`` performs (waiting for
a conflicting lock to go, the holders' liveness). On the ground floor (``fs``) because
the mount keeps the same table of the locks it holds (``mount.locks``: when its last lock
on a file goes).

* An owner is ``LockOwner(client, owner)``: the mount's client name and the lock owner id
  the kernel gives (a process's file table for POSIX locks, an open file description for
  flock locks). Locks of one owner never conflict with each other.
* flock locks: one per owner and file, SHARED or EXCLUSIVE; a conversion replaces the
  owner's lock when nobody else's conflicts (else the old one stays).
* POSIX locks: byte ranges ``[start, end)`` (``end`` = ``TO_EOF``: to the end of any
  file), READ or WRITE. A lock or unlock of an owner replaces that owner's locks over its
  range, splitting the ones it cuts, and merges with the owner's adjacent or overlapping
  locks of the same kind, as POSIX requires; it conflicts with another owner's
  overlapping lock when either is WRITE. A refused call changes nothing (an upgrade that
  conflicts keeps the read lock).
* flock and POSIX locks do not see each other (Linux).

Pure: no I/O, no clock, no awaits. Concurrency contract: called only from the metadata
server's trio thread; every method is atomic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fs.errors import InvalidArgument

#: the end of a range that runs to the end of the file, whatever its length (the kernel's
#: OFFSET_MAX + 1: offsets are signed 64-bit)
TO_EOF = 1 << 63


class LockKind(str, enum.Enum):
    READ = "read"        # POSIX F_RDLCK, flock LOCK_SH
    WRITE = "write"      # POSIX F_WRLCK, flock LOCK_EX
    UNLOCK = "unlock"    # POSIX F_UNLCK, flock LOCK_UN


@dataclass(frozen=True, order=True)
class LockOwner:
    client: str     # the holder's client name (its client lease)
    owner: int      # the kernel's lock owner id on that client


@dataclass(frozen=True)
class RangeLock:
    """A POSIX record lock: ``[start, end)`` of a file."""

    owner: LockOwner
    kind: LockKind       # READ or WRITE
    start: int
    end: int             # exclusive; TO_EOF: to the end of the file
    pid: int             # the process that took it, on its client's machine


@dataclass(frozen=True)
class FlockLock:
    owner: LockOwner
    kind: LockKind       # READ (shared) or WRITE (exclusive)
    pid: int


def check_range(start, end) -> None:
    """``InvalidArgument`` unless ``0 <= start < end <= TO_EOF`` (integers)."""
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"lock range: {name} must be an integer, got {value!r:.60}")
    if not 0 <= start < end <= TO_EOF:
        raise InvalidArgument(f"lock range: need 0 <= start < end <= {TO_EOF}, got "
                              f"[{start}, {end})")


def conflicts(a: LockKind, b: LockKind) -> bool:
    return LockKind.WRITE in (a, b)


class LockTable:
    """Every file's locks on one metadata server, by file (inode) and by client."""

    def __init__(self):
        self._ranges: dict[int, list[RangeLock]] = {}       # ino -> its POSIX locks
        self._flocks: dict[int, dict[LockOwner, FlockLock]] = {}
        self._by_client: dict[str, set[int]] = {}           # client -> inodes it locks

    # ------------------------------------------------------------------ queries
    def ranges(self, ino: int) -> list[RangeLock]:
        return sorted(self._ranges.get(ino, ()), key=lambda r: (r.start, r.owner))

    def flocks(self, ino: int) -> list[FlockLock]:
        return sorted(self._flocks.get(ino, {}).values(), key=lambda f: f.owner)

    def clients(self) -> list[str]:
        return sorted(self._by_client)

    def any_held(self) -> bool:
        """Whether any lock is held at all (a close then has one to look for)."""
        return bool(self._by_client)

    def inodes_of(self, client: str) -> list[int]:
        return sorted(self._by_client.get(client, ()))

    def holds(self, ino: int, owner: LockOwner) -> bool:
        """Whether ``owner`` holds any lock (POSIX or flock) on ``ino``."""
        return (owner in self._flocks.get(ino, {})
                or any(r.owner == owner for r in self._ranges.get(ino, ())))

    def __len__(self) -> int:
        return sum(map(len, self._ranges.values())) + sum(map(len, self._flocks.values()))

    def test(self, ino: int, owner: LockOwner, kind: LockKind, start: int,
             end: int) -> RangeLock | None:
        """The first (lowest start) POSIX lock of another owner that a ``kind`` lock of
        ``[start, end)`` by ``owner`` would conflict with (``F_GETLK``), or None."""
        check_range(start, end)
        if kind is LockKind.UNLOCK:
            return None
        for lock in self.ranges(ino):
            if (lock.owner != owner and lock.start < end and start < lock.end
                    and conflicts(kind, lock.kind)):
                return lock
        return None

    def test_flock(self, ino: int, owner: LockOwner, kind: LockKind) -> FlockLock | None:
        if kind is LockKind.UNLOCK:
            return None
        for lock in self.flocks(ino):
            if lock.owner != owner and conflicts(kind, lock.kind):
                return lock
        return None

    # ------------------------------------------------------------------ changes
    def set_range(self, ino: int, owner: LockOwner, kind: LockKind, start: int, end: int,
                  pid: int) -> RangeLock | None:
        """``F_SETLK``: lock (or unlock) ``[start, end)`` for ``owner``. Returns the
        conflicting lock, changing nothing, or None once done."""
        conflict = self.test(ino, owner, kind, start, end)
        if conflict is not None:
            return conflict
        kept: list[RangeLock] = []
        for lock in self._ranges.get(ino, ()):
            if lock.owner != owner or lock.end <= start or end <= lock.start:
                kept.append(lock)
                continue
            # the owner's lock the new range cuts: its parts outside stay
            if lock.start < start:
                kept.append(RangeLock(owner, lock.kind, lock.start, start, lock.pid))
            if end < lock.end:
                kept.append(RangeLock(owner, lock.kind, end, lock.end, lock.pid))
        if kind is not LockKind.UNLOCK:
            new = RangeLock(owner, kind, start, end, pid)
            merged: list[RangeLock] = []
            for lock in kept:   # same owner and kind, touching or overlapping: one lock
                if (lock.owner == owner and lock.kind is kind
                        and lock.start <= new.end and new.start <= lock.end):
                    new = RangeLock(owner, kind, min(lock.start, new.start),
                                    max(lock.end, new.end), pid)
                else:
                    merged.append(lock)
            merged.append(new)
            kept = merged
        self._store_ranges(ino, kept)
        self._reindex(ino, owner.client)
        return None

    def set_flock(self, ino: int, owner: LockOwner, kind: LockKind,
                  pid: int) -> FlockLock | None:
        """``flock``: take, convert or drop ``owner``'s lock; the conflicting lock (nothing
        changed) or None once done."""
        conflict = self.test_flock(ino, owner, kind)
        if conflict is not None:
            return conflict
        held = self._flocks.setdefault(ino, {})
        if kind is LockKind.UNLOCK:
            held.pop(owner, None)
        else:
            held[owner] = FlockLock(owner, kind, pid)
        if not held:
            del self._flocks[ino]
        self._reindex(ino, owner.client)
        return None

    def release_owner(self, ino: int, owner: LockOwner, *, flock: bool) -> bool:
        """Drop every POSIX lock (``flock``: the flock lock) of ``owner`` on ``ino`` (a
        close); whether there was any."""
        if flock:
            held = self._flocks.get(ino, {})
            found = held.pop(owner, None) is not None
            if not held:
                self._flocks.pop(ino, None)
        else:
            locks = self._ranges.get(ino, [])
            kept = [lock for lock in locks if lock.owner != owner]
            found = len(kept) != len(locks)
            self._store_ranges(ino, kept)
        self._reindex(ino, owner.client)
        return found

    def release_client(self, client: str) -> list[int]:
        """Drop every lock ``client`` holds (its lease ended, or it unmounted); the inodes
        that had some."""
        inos = sorted(self._by_client.pop(client, ()))
        for ino in inos:
            self._store_ranges(ino, [lock for lock in self._ranges.get(ino, ())
                                     if lock.owner.client != client])
            held = self._flocks.get(ino)
            if held is not None:
                for owner in [o for o in held if o.client == client]:
                    del held[owner]
                if not held:
                    del self._flocks[ino]
        return inos

    # ------------------------------------------------------------------ internals
    def _store_ranges(self, ino: int, locks: list[RangeLock]) -> None:
        if locks:
            self._ranges[ino] = locks
        else:
            self._ranges.pop(ino, None)

    def _reindex(self, ino: int, client: str) -> None:
        has = (any(o.client == client for o in self._flocks.get(ino, {}))
               or any(r.owner.client == client for r in self._ranges.get(ino, ())))
        inos = self._by_client.setdefault(client, set())
        if has:
            inos.add(ino)
        else:
            inos.discard(ino)
            if not inos:
                del self._by_client[client]
