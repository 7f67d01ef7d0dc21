"""Path locks for the metadata server (Hadoop's fine-grained locking, HDFS-17366).

Why it exists: trio runs one thread, but a mutation awaits its journal fsync between
validating and replying; without locks a second mutation could validate against the same
state (two creates of one name both succeeding). Locks are per path, read-write, created on
demand and dropped when unused (``PathLockPool``), taken in these modes (FGL names):

* ``LOCK_READ``   read locks on every component (reads that await, e.g. content_summary)
* ``LOCK_WRITE``  read on the ancestors, write on the last (set* ops, addBlock/complete)
* ``LOCK_PARENT`` read on the ancestors, write on the last two (create, delete, rename)
* ``LOCK_ANCESTOR`` read down to the last EXISTING component, write on it and on every
  component below it (mkdirs, create with missing parents)

A lock set is a map ``components tuple → write?``; sets of several paths (rename) are merged
(write wins) and every set is acquired in ONE global order, sorted by component tuples
(ancestors sort before descendants), so no two operations can deadlock. Keys are paths, not
inode ids, so a name that does not exist yet (create) can be locked too; a rename of an
ancestor takes a write lock on that ancestor, which every operation below it holds in read
mode, so a locked path keeps meaning the same inode until released.

Reads that do all their store reads without awaiting (get_file_info, list_status pages,
get_block_locations) need no path lock: journal ``apply`` writes a whole batch atomically on
the same thread, so they always observe a state between two batches; they therefore never
wait for a disjoint (or any) mutation's fsync.

Lock order (HDFS-17366: global > block servers > paths) and what each operation takes.
A task only ever acquires downward in this list, and path locks in one sorted pass:

1. ``global_lock`` (``RWLock``): every mutation holds it in READ mode (so namespace-wide
   work can exclude them all); checkpoint, safe-mode enter/leave hold it in WRITE mode.
   The reclaimer (RECLAIM records of detached subtrees) holds it in READ mode: nothing it
   removes is reachable by a path. With ``namespace_lock=global`` every mutation takes it
   in WRITE mode and no path lock: the comparison baseline.
2. Block-server domain: the per-node lock of ``reports.BlockReports`` (one full-report
   chunk of a node at a time). Block-server state (blocks map, datanodes, replication
   queues) is otherwise changed only in synchronous steps on the trio thread, which need no
   lock; a report chunk never takes path locks, and nothing holding path locks waits for a
   report lock.
3. Path locks (``PathLockPool``), one merged set per operation, sorted:

=============================================  ================  ==============================
operation                                      mode              notes
=============================================  ================  ==============================
getFileInfo, exists, listStatus,                (none)            synchronous: sees the state
getBlockLocations, report                                         between two applied batches;
                                                                  never waits for an fsync
contentSummary, fsck                           LOCK_READ         await between store reads
setPermission, setOwner, setTimes,             LOCK_WRITE
setReplication
recoverLease, truncate, append                 LOCK_WRITE
addBlock, abandonBlock, complete, fsync,       LOCK_WRITE        addressed by inode id: path
updateBlockForPipeline, updatePipeline,                          from parent pointers, lock,
commitBlockSynchronization, lease expiry                          re-check it did not move
                                                                  (retry; ``TryAgain`` after
                                                                  ``LOCK_RETRIES``)
create, mkdirs, createSymlink                  LOCK_PARENT /     LOCK_ANCESTOR from the last
                                               LOCK_ANCESTOR     existing component when
                                                                  parents are missing; depth
                                                                  re-checked after the wait
delete                                         LOCK_PARENT
rename                                         LOCK_PARENT ×2    src and dst merged
rename_many (job commit)                       LOCK_PARENT ×2n   every src and dst merged
=============================================  ================  ==============================

``RWLock`` is FIFO-fair: a waiting writer blocks later readers, so writers never starve.

``Mutation`` (global lock, then the path locks, safe-mode check before and after the wait)
and ``FileLock`` (LOCK_WRITE on a file by inode id, re-checked that it did not move) are
what the server's handlers hold; like ``PathLockPool.hold`` they are plain async context
managers that take an uncontended lock without awaiting (they run on every mutating RPC).

Concurrency contract: trio tasks of one thread; acquisition is cancellable (a cancelled
waiter leaves the queue; a lock granted to a task that is being cancelled is released).
"""

from __future__ import annotations

import logging
from collections import deque
from contextlib import asynccontextmanager
from functools import partial

import trio

from fs import paths
from fs.errors import TryAgain
from fs.paths import split as _split

log = logging.getLogger(__name__)

LOCK_READ = "LOCK_READ"
LOCK_WRITE = "LOCK_WRITE"
LOCK_PARENT = "LOCK_PARENT"
LOCK_ANCESTOR = "LOCK_ANCESTOR"
MODES = (LOCK_READ, LOCK_WRITE, LOCK_PARENT, LOCK_ANCESTOR)


class _Waiter:
    __slots__ = ("write", "event", "granted")

    def __init__(self, write: bool):
        self.write = write
        self.event = trio.Event()
        self.granted = False


class RWLock:
    """A FIFO-fair readers-writer lock for trio tasks. A path lock lives for one mutation
    and is rarely waited for: its queue is made by the first waiter."""

    __slots__ = ("readers", "writer", "_queue")

    def __init__(self):
        self.readers = 0
        self.writer = False
        self._queue: deque[_Waiter] | None = None

    def _grantable(self, write: bool) -> bool:
        if self.writer:
            return False
        return self.readers == 0 if write else True

    def _grant(self, write: bool) -> None:
        if write:
            self.writer = True
        else:
            self.readers += 1

    def _wake(self) -> None:
        queue = self._queue
        while queue and self._grantable(queue[0].write):
            waiter = queue.popleft()
            self._grant(waiter.write)
            waiter.granted = True
            waiter.event.set()

    @property
    def idle(self) -> bool:
        return not self.writer and self.readers == 0 and not self._queue

    def try_acquire(self, write: bool) -> bool:
        """Take the lock without waiting if nobody holds it against us or waits for it."""
        if self._queue or self.writer or (write and self.readers):
            return False
        if write:
            self.writer = True
        else:
            self.readers += 1
        return True

    async def acquire(self, write: bool) -> None:
        if self.try_acquire(write):
            return
        waiter = _Waiter(write)
        if self._queue is None:
            self._queue = deque()
        self._queue.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self.release(write)
            else:
                self._queue.remove(waiter)
                self._wake()   # a writer leaving the head may unblock readers behind it
            raise

    def release(self, write: bool) -> None:
        if write:
            assert self.writer, "releasing a write lock that is not held"
            self.writer = False
        else:
            assert self.readers > 0, "releasing a read lock that is not held"
            self.readers -= 1
        self._wake()


def lock_set(parts, mode: str, existing: int | None = None) -> dict[tuple, bool]:
    """The locks ``mode`` needs on the path with components ``parts``.

    ``existing`` (LOCK_ANCESTOR only) is how many leading components exist; the write lock
    starts at the last existing one (the root counts as depth 0)."""
    parts = tuple(parts)
    n = len(parts)
    if mode == LOCK_READ:
        first_write = n + 1
    elif mode == LOCK_WRITE:
        first_write = n
    elif mode == LOCK_PARENT:
        first_write = max(0, n - 1)
    elif mode == LOCK_ANCESTOR:
        if existing is None:
            raise ValueError("LOCK_ANCESTOR needs the number of existing components")
        first_write = min(max(0, existing), n)
    else:
        raise ValueError(f"unknown lock mode {mode!r}")
    return {parts[:depth]: depth >= first_write for depth in range(n + 1)}


def merge(*sets: dict[tuple, bool]) -> dict[tuple, bool]:
    out: dict[tuple, bool] = {}
    for one in sets:
        for key, write in one.items():
            out[key] = out.get(key, False) or write
    return out


class PathLockPool:
    """Per-path RW locks created on demand and dropped when no task uses them."""

    def __init__(self):
        self._locks: dict[tuple, list] = {}   # key -> [RWLock, users]

    def __len__(self) -> int:
        return len(self._locks)

    def hold(self, wanted: dict[tuple, bool]) -> "_Hold":
        """``async with pool.hold(wanted)``: acquire every lock of ``wanted`` in the global
        order; release all on exit."""
        return _Hold(self._locks, wanted)

    def locked(self, key: tuple) -> tuple[int, bool]:
        """(readers, writer) on ``key`` — for tests and the status page."""
        entry = self._locks.get(tuple(key))
        if entry is None:
            return 0, False
        return entry[0].readers, entry[0].writer


class _Hold:
    """One ``PathLockPool.hold``: a plain async context manager, not a generator one (it
    runs twice per mutating RPC); an uncontended lock is taken without a coroutine call."""

    __slots__ = ("_locks", "_wanted", "_entries", "_held")

    def __init__(self, locks: dict[tuple, list], wanted: dict[tuple, bool]):
        self._locks = locks
        self._wanted = wanted
        self._entries: list[list] = []   # pool entries [RWLock, users, key] this hold uses
        self._held = 0                   # how many of them it holds (in order)

    async def __aenter__(self) -> None:
        locks, wanted, entries = self._locks, self._wanted, self._entries
        try:
            for key in (sorted(wanted) if len(wanted) > 1 else wanted):
                entry = locks.get(key)
                if entry is None:
                    entry = locks[key] = [RWLock(), 0, key]
                entry[1] += 1
                entries.append(entry)
                write = wanted[key]
                if not entry[0].try_acquire(write):
                    await entry[0].acquire(write)
                self._held += 1
        except BaseException:
            self.release()
            raise

    async def __aexit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        entries, wanted = self._entries, self._wanted
        for i in range(self._held - 1, -1, -1):
            entry = entries[i]
            entry[0].release(wanted[entry[2]])
        locks = self._locks
        for entry in entries:
            entry[1] -= 1
            if entry[1] == 0 and entry[0].idle:
                del locks[entry[2]]
        self._entries = []
        self._held = 0


class Mutation:
    """``async with``: the global lock (read mode, or write mode when ``exclusive``, the
    ``namespace_lock=global`` baseline) and then the path locks of ``wanted`` (none when
    exclusive); ``check()`` (safe mode) runs before waiting and again once everything is
    held, since the state may have changed during the wait. A plain class for the same
    reason as ``_Hold``."""

    __slots__ = ("_global", "_hold", "_exclusive", "_check", "_entered")

    def __init__(self, global_lock: RWLock, pool: PathLockPool, exclusive: bool,
                 wanted: dict[tuple, bool], check=None):
        self._global = global_lock
        self._exclusive = exclusive
        self._hold = pool.hold({} if exclusive else wanted)
        self._check = check
        self._entered = False

    async def __aenter__(self) -> None:
        check = self._check
        if check is not None:
            check()
        exclusive = self._exclusive
        if not self._global.try_acquire(exclusive):
            await self._global.acquire(exclusive)
        try:
            await self._hold.__aenter__()
            try:
                if check is not None:
                    check()
            except BaseException:
                self._hold.release()
                raise
        except BaseException:
            self._global.release(exclusive)
            raise

    async def __aexit__(self, *exc_info) -> None:
        try:
            self._hold.release()
        finally:
            self._global.release(self._exclusive)


class FileLock:
    """``async with ... as current``: LOCK_WRITE on a file addressed by inode id (``ino``;
    its current path from ``path_of``) or by ``path``; re-checked after the wait that the
    file did not move (locked again, up to ``retries`` times, then ``on_give_up()`` is
    raised). ``mutation(wanted)`` makes the ``Mutation`` to hold."""

    __slots__ = ("_mutation", "_path_of", "_path", "_ino", "_retries", "_give_up", "_held")

    def __init__(self, mutation, path_of, path: str, ino, retries: int, give_up):
        self._mutation = mutation
        self._path_of = path_of
        self._path = path
        self._ino = ino
        self._retries = retries
        self._give_up = give_up
        self._held: Mutation | None = None

    async def __aenter__(self) -> str:
        ino, path_of = self._ino, self._path_of
        for _ in range(self._retries):
            current = (path_of(ino) if ino else None) or self._path
            held = self._mutation(lock_set(_split(current), LOCK_WRITE))
            await held.__aenter__()
            try:
                moved_to = path_of(ino) if ino else None
            except BaseException:
                await held.__aexit__(None, None, None)
                raise
            if moved_to is not None and moved_to != current:
                await held.__aexit__(None, None, None)
                continue   # renamed while we waited (None: gone, the writer check says so)
            self._held = held
            return current
        raise self._give_up()

    async def __aexit__(self, *exc_info) -> None:
        held, self._held = self._held, None
        await held.__aexit__(*exc_info)


#: times an operation locks again after what it locked moved or vanished during its wait
LOCK_RETRIES = 8


class NamespaceLocking:
    """What every namespace call holds, as one service: the global lock, the path locks and
    the safe-mode check of a mutation (``mutation``), the locks of a read that awaits
    (``reading``), of a create with missing ancestors (``with_ancestor_locks``) and of a
    file addressed by inode id (``file_lock``). ``existing_depth``/``path_of`` come from the
    namespace; ``safemode_check(what)`` raises ``SafeModeError`` while changes are refused.
    ``exclusive`` is ``namespace_lock=global``, the comparison baseline: every mutation
    takes the global lock in write mode and no path lock."""

    def __init__(self, *, existing_depth, path_of, safemode_check, exclusive: bool):
        self.global_lock = RWLock()
        self.paths = PathLockPool()
        self.exclusive = exclusive
        self._existing_depth = existing_depth
        self._path_of = path_of
        self._safemode_check = safemode_check

    def mutation(self, what: str, wanted: dict, *, check_safemode: bool = True) -> Mutation:
        """``async with``: hold what a mutation needs from validation to its applied journal
        record."""
        return Mutation(self.global_lock, self.paths, self.exclusive, wanted,
                        partial(self._safemode_check, what) if check_safemode else None)

    @asynccontextmanager
    async def reading(self, parts):
        """For reads that await between store reads (content summary, fsck): LOCK_READ on
        the path, or the global lock in read mode under ``namespace_lock=global``."""
        if self.exclusive:
            await self.global_lock.acquire(False)
            try:
                yield
            finally:
                self.global_lock.release(False)
        else:
            async with self.paths.hold(lock_set(parts, LOCK_READ)):
                yield

    async def with_ancestor_locks(self, what: str, parts, body, *, keep_parent_write=True,
                                  extra: dict | None = None):
        """Run ``body()`` under LOCK_ANCESTOR for ``parts`` (LOCK_PARENT when the parent
        exists), re-checking after the wait that no locked-out ancestor vanished."""
        canonical = paths.join_parts(parts)
        for _ in range(LOCK_RETRIES):
            depth = self._existing_depth(canonical)
            if keep_parent_write:
                depth = min(depth, max(0, len(parts) - 1))
            wanted = lock_set(parts, LOCK_ANCESTOR, depth)
            if extra:
                wanted = merge(wanted, extra)
            async with self.mutation(what, wanted):
                if self._existing_depth(canonical) < depth:
                    continue   # an ancestor was removed while we waited: lock again
                return await body()
        raise TryAgain(f"{what}: the namespace kept changing under the request; try again")

    def file_lock(self, what: str, path: str, ino) -> FileLock:
        """``async with ... as current``: LOCK_WRITE on a file addressed by inode id (its
        current path) or by path."""
        return FileLock(partial(self.mutation, what), self._path_of, path, ino,
                        LOCK_RETRIES, lambda: TryAgain(f"{what}: the file kept moving under "
                                                       f"the request; try again"))
