"""The mount's cluster-wide locks (``MountLocks``, a part of the mount that
``mount.operations`` composes): the kernel's ``flock(2)`` and ``fcntl`` lock requests
become the metadata server's ``lock_*`` calls (``meta/services/locks.py``), so every mount
sees them (docs/MOUNT.md, "Locks").

Why a part of its own: besides the calls, a lock is where mounts hand a file's content to
each other, as NFS's close-to-open does at open and close:

* before this mount's last lock on a file goes (unlock, close, ``flock(LOCK_UN)``), what
  it wrote is published and the file's lease given back (``Writer.publish(finish=True)``),
  so the next holder on another mount reads it and can write the file itself; an unlock
  that leaves other locks here publishes without giving the lease back;
* once a lock is granted, a file this mount has no unpublished writes of is looked at
  again: when the cluster's length or times changed, the kernel's pages and attributes
  and the mount's read windows of it are dropped.

The locks this mount holds are mirrored in a local ``LockTable`` (the server's pure
table): it says when the last one on a file goes, and keeps the client lease renewed
(``keep_alive``) while there is any: a killed mount's locks end with its lease
(``lease_hard_limit``). The mirror is also what the mount gives back to a metadata server
that lost the table (a restart, a failover): ``keep_alive`` asks every ``LOCK_CHECK``
seconds while it holds a lock, and for ``lock_grace`` (and ``CHECK_MARGIN``) seconds after
its last one went, whether the server wants it reclaimed (``lock_hold``), and then sends
them all in one ``lock_reclaim``; the server grants nobody a new lock meanwhile (its
grace). A lock the server answers with ``grace`` (the table is not whole yet) is asked for
again, a non-blocking one too.

A blocking request (F_SETLKW, flock without LOCK_NB) asks the server in bounded waits
(``LOCK_POLL``) and asks again until granted, or until the kernel says the caller was
interrupted (a signal): then ``EINTR``.

Concurrency contract: methods of the mount's one trio run. The local table changes only
between awaits; an open file's publishing takes its ``lock``. Kernel cache invalidation
runs in a worker thread (it may wait for pages a read in flight holds).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math

import pyfuse3
import trio

from fs.errors import LeaseFSError
from fs.locktable import TO_EOF, LockKind, LockOwner, LockTable, RangeLock

from .errors import fuse_error
from .kernelview import KernelView
from .openfiles import FileMode, OpenFile, OpenFiles
from .writes import Writer

log = logging.getLogger(__name__)

#: seconds one server call of a blocking lock request waits before the mount asks again
#: (and looks whether its caller was interrupted)
LOCK_POLL = 1.0
#: seconds between two checks whether the server lost the locks (a restart, a failover):
#: a reclaim comes within about this long after the server is back
LOCK_CHECK = 1.0
#: the checks go on for ``lock_grace`` and this many seconds more after the mount's last
#: lock went: the server keeps a holder on record until it held none for its
#: ``lock_grace``, and after a restart waits for every holder on record (this one then
#: answers, with nothing to reclaim)
CHECK_MARGIN = 5.0
POSIX, FLOCK = "posix", "flock"
KINDS = {fcntl.F_RDLCK: LockKind.READ, fcntl.F_WRLCK: LockKind.WRITE,
         fcntl.F_UNLCK: LockKind.UNLOCK}
FLOCK_KINDS = {fcntl.LOCK_SH: LockKind.READ, fcntl.LOCK_EX: LockKind.WRITE,
               fcntl.LOCK_UN: LockKind.UNLOCK}
L_TYPES = {"read": fcntl.F_RDLCK, "write": fcntl.F_WRLCK}


def _range(start: int, length: int) -> tuple[int, int]:
    """libfuse's ``(l_start, l_len)`` (``l_len`` 0: to the end) as ``[start, end)``."""
    if start < 0 or length < 0:
        raise fuse_error(errno.EINVAL)
    return start, (TO_EOF if length == 0 else min(TO_EOF, start + length))


class MountLocks:
    """The lock requests of one mount."""

    def __init__(self, client, view: KernelView, open_files: OpenFiles, writer: Writer):
        self._client = client
        self._view = view
        self._open_files = open_files
        self._writer = writer
        self._mine = LockTable()   # what this mount holds, by kernel inode
        self._holds_some = trio.Event()
        self._checks = True        # the server answers lock_hold (an older one does not)
        self._last_held = -math.inf   # trio time a lock was last held here
        self.reclaims = 0          # times the mount gave its locks back to a server
        self.lost = 0              # locks another owner took while the server had none

    # ------------------------------------------------------------------ requests
    async def getlk(self, ino, fh, owner, l_type, start, length, pid):
        of = self._open_files.handle(fh).of
        kind = KINDS.get(l_type)
        if kind is None:
            raise fuse_error(errno.EINVAL)
        first, end = _range(start, length)
        while True:
            answer = await self._client.lock_get(of.ns_ino, owner, kind.value, first, end)
            if not answer.get("grace"):
                break
            await trio.sleep(min(LOCK_POLL, answer["grace"]))   # the table is not whole yet
        conflict = answer.get("conflict")
        if conflict is None:
            return fcntl.F_UNLCK, start, length, pid
        c_end = conflict["end"]
        return (L_TYPES[conflict["kind"]], conflict["start"],
                0 if c_end >= TO_EOF else c_end - conflict["start"], conflict["pid"])

    async def setlk(self, ino, fh, owner, l_type, start, length, pid, sleep, interrupted):
        kind = KINDS.get(l_type)
        if kind is None:
            raise fuse_error(errno.EINVAL)
        first, end = _range(start, length)
        await self._set(ino, fh, owner, kind, POSIX, first, end, pid, sleep, interrupted)

    async def flock(self, ino, fh, owner, op, interrupted):
        kind = FLOCK_KINDS.get(op & ~fcntl.LOCK_NB)
        if kind is None:
            raise fuse_error(errno.EINVAL)
        await self._set(ino, fh, owner, kind, FLOCK, 0, TO_EOF, 0,
                        not op & fcntl.LOCK_NB, interrupted)

    def any_held(self) -> bool:
        """Whether this mount holds any lock (most closes then have none to end)."""
        return self._mine.any_held()

    async def release_posix_locks(self, ino, fh, owner) -> None:
        """A close(2) by lock owner ``owner``: its POSIX locks on the file go."""
        await self._release(ino, fh, owner, POSIX)

    async def release_flock(self, ino, fh, owner) -> None:
        """The last close of an open file description: its flock lock goes."""
        await self._release(ino, fh, owner, FLOCK)

    async def release_all(self) -> None:
        """The mount goes away: every lock it holds goes (best effort: else its lease's
        end takes them)."""
        if not self._mine.clients():
            return
        try:
            await self._client.lock_release_all()
        except LeaseFSError as exc:
            log.warning("giving back the mount's locks at unmount: %s", exc)
        self._mine = LockTable()

    async def keep_alive(self) -> None:
        """While this mount holds a lock: renew the client lease every renew period (its
        locks end with the lease), and check every ``LOCK_CHECK`` seconds whether the
        server lost the locks (then reclaim them), and so for ``lock_grace`` and
        ``CHECK_MARGIN`` seconds after the last one went."""
        config = self._client.config
        check_after = config.lock_grace + CHECK_MARGIN
        renewed = -math.inf
        failing = False   # said once per outage, not every second
        while True:
            now = trio.current_time()
            if not self._mine.clients() and (now - self._last_held > check_after
                                             or not self._checks):
                self._holds_some = trio.Event()
                await self._holds_some.wait()
            await trio.sleep(LOCK_CHECK if self._checks else config.renew_period)
            now = trio.current_time()
            held = self._held()
            try:
                if self._checks:
                    await self._check(held)
                if held and now - renewed >= config.renew_period - LOCK_CHECK:
                    await self._client.renew_lease()
                    renewed = now
                failing = False
            except LeaseFSError as exc:
                (log.debug if failing else log.warning)(
                    "keeping the mount's locks with the metadata server: %s", exc)
                failing = True
            if held:
                self._last_held = now

    def _held(self) -> int:
        return sum(len(self._mine.ranges(ino)) + len(self._mine.flocks(ino))
                   for ino in self._mine.inodes_of(""))

    async def _check(self, held: int) -> None:
        """Ask whether the server lost this mount's locks (``held`` of them); if so give
        them back to it."""
        try:
            answer = await self._client.lock_hold(held)
        except LeaseFSError as exc:
            if exc.retriable:
                raise
            log.info("the metadata server does not take locks back after a restart (%s); "
                     "the mount renews its lease only", exc)
            self._checks = False
            return
        if not answer.get("reclaim"):
            return
        wanted = []   # (kernel inode, the lock): what each reclaimed lock is here
        for ino in self._mine.inodes_of(""):
            of = self._open_files.get(ino)
            ns_ino = of.ns_ino if of is not None else ino
            for lock in self._mine.ranges(ino):
                wanted.append((ino, lock, {"ino": ns_ino, "owner": lock.owner.owner,
                                           "kind": lock.kind.value, "style": POSIX,
                                           "start": lock.start, "end": lock.end,
                                           "pid": lock.pid}))
            for lock in self._mine.flocks(ino):
                wanted.append((ino, lock, {"ino": ns_ino, "owner": lock.owner.owner,
                                           "kind": lock.kind.value, "style": FLOCK,
                                           "pid": lock.pid}))
        answer = await self._client.lock_reclaim([w for _, _, w in wanted])
        self.reclaims += 1
        log.info("gave %d lock(s) back to the metadata server (it restarted or failed over)",
                 len(wanted))
        for index in answer.get("lost") or ():
            ino, lock, _ = wanted[index]
            self.lost += 1
            log.error("%s: a %s lock was lost: another owner took it while the metadata "
                      "server had no locks (it came back after its grace)",
                      self._view.current_path(ino, f"inode {ino}"), lock.kind.value)
            if isinstance(lock, RangeLock):
                self._mine.set_range(ino, lock.owner, LockKind.UNLOCK, lock.start, lock.end, 0)
            else:
                self._mine.set_flock(ino, lock.owner, LockKind.UNLOCK, 0)

    # ------------------------------------------------------------------ internals
    async def _set(self, ino: int, fh: int, owner: int, kind: LockKind, style: str,
                   start: int, end: int, pid: int, sleep: bool, interrupted) -> None:
        of = self._open_files.handle(fh).of
        me = LockOwner("", owner)
        unpublished = None
        if kind is LockKind.UNLOCK:
            try:
                await self._unlocking(ino, of, me, style, start, end)
            except LeaseFSError as exc:   # the lock goes all the same; the caller hears
                unpublished = exc
        while True:
            answer = await self._client.lock_set(
                of.ns_ino, owner, kind.value, style=style, start=start, end=end, pid=pid,
                wait=LOCK_POLL if sleep else 0)
            if answer.get("granted"):
                break
            if answer.get("grace"):   # the table is not whole yet: asked again, whatever
                await trio.sleep(min(LOCK_POLL, answer["grace"]))
            elif not sleep:
                raise fuse_error(errno.EAGAIN)
            if interrupted():
                raise fuse_error(errno.EINTR)
        if unpublished is not None:
            raise unpublished
        if kind is LockKind.UNLOCK:
            return
        self._mirror(ino, me, kind, style, start, end, pid)
        await self._granted(of)

    def _mirror(self, ino: int, me: LockOwner, kind: LockKind, style: str, start: int,
                end: int, pid: int) -> None:
        for _ in range(2):
            if style == POSIX:
                conflict = self._mine.set_range(ino, me, kind, start, end, pid)
            else:
                conflict = self._mine.set_flock(ino, me, kind, pid)
            if conflict is None:
                break
            # the server granted it, so that lock of ours had ended there (lease lost)
            self._mine.release_owner(ino, conflict.owner, flock=style == FLOCK)
        self._last_held = trio.current_time()
        self._holds_some.set()

    async def _unlocking(self, ino: int, of: OpenFile, me: LockOwner, style: str,
                         start: int, end: int) -> None:
        """Before an unlock reaches the server: publish what was written, and give the
        lease back when it is this mount's last lock on the file."""
        if style == POSIX:
            self._mine.set_range(ino, me, LockKind.UNLOCK, start, end, 0)
        else:
            self._mine.set_flock(ino, me, LockKind.UNLOCK, 0)
        await self._publish(ino, of)

    async def _release(self, ino: int, fh: int, owner: int, style: str) -> None:
        handle = self._open_files.find_handle(fh)
        of = handle.of if handle is not None else self._open_files.get(ino)
        me = LockOwner("", owner)
        if not self._mine.release_owner(ino, me, flock=style == FLOCK):
            return   # most closes: this owner holds no lock here
        try:
            if of is not None:
                await self._publish(ino, of)
        finally:
            await self._client.lock_release(of.ns_ino if of is not None else ino, owner,
                                            style=style)

    async def _publish(self, ino: int, of: OpenFile) -> None:
        last = ino not in self._mine.inodes_of("")
        async with of.lock:
            if of.mode is FileMode.CLEAN:
                return
            try:
                await self._writer.publish(of, finish=last)
            except LeaseFSError as exc:
                log.warning("%s: publishing at unlock: %s",
                            self._view.current_path(of.ino, f"inode {of.ino}"), exc)
                raise

    async def _granted(self, of: OpenFile) -> None:
        """A lock was granted: what other mounts wrote before it is read from now on."""
        async with of.lock:
            if of.mode is not FileMode.CLEAN or of.unlinked:
                return   # our own writes, under our lease: nobody else wrote since
            path = self._view.current_path(of.ino, "")
            if not path:
                return
            status = await self._client.get_file_status(path)
            before = of.status
            if before is not None and (before.mtime_ns, before.ctime_ns, before.length) == (
                    status.mtime_ns, status.ctime_ns, status.length):
                return
            of.status = status
            of.size = status.length
            of.generation += 1   # the handles' read windows and input streams go
            self._view.drop_read_stamp(of.ino)
        await trio.to_thread.run_sync(_invalidate, of.ino)


def _invalidate(ino: int) -> None:
    try:
        pyfuse3.invalidate_inode(ino, attr_only=False)
    except (OSError, RuntimeError) as exc:   # not known to the kernel (any more)
        log.debug("invalidate inode %d: %s", ino, exc)
