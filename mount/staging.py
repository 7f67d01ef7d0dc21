"""``StagingFile``: the local copy of an open file that is written in place (a write at
another offset than the stream's end, a read of a file being written, a shrinking truncate;
see ``mount.writes``), kept open for as long as the file is staged.

Why a descriptor kept open and small calls on the trio thread: a staged file is what a
database or an editor rewrites page by page (sqlite: a few hundred 4 KiB ``pwrite``s per
transaction), and each FUSE write used to cost a worker-thread round trip plus an
``open``/``close`` of the staging file, ~0.13 ms of a 0.17 ms write. A ``pwrite`` or
``pread`` of at most ``INLINE_IO`` bytes on a file this mount just wrote is a copy to or from
the page cache, as the metadata server's journal append and LevelDB batch on its trio
thread, and S3QL's writes into its cache files: those run on the trio thread. Larger
calls, creating, truncating and removing the file (which may wait on the disk) run in
worker threads under the mount's ``CapacityLimiter``.

Concurrency contract: used only from the mount's trio thread, under the owning
``OpenFile``'s lock (``mount.writes``); after ``remove`` no other call is made.
"""

from __future__ import annotations

import os
import uuid

import trio

# at most this many bytes per call on the trio thread (the kernel's largest FUSE write)
INLINE_IO = 128 << 10


class StagingFile:
    """An open local file under the mount's cache folder holding one open file's content."""

    def __init__(self, path: str, fd: int, limiter: trio.CapacityLimiter):
        self.path = path
        self._fd = fd
        self._limiter = limiter

    @classmethod
    async def create(cls, folder: str, ino: int,
                     limiter: trio.CapacityLimiter) -> "StagingFile":
        path = os.path.join(folder, f"{ino}-{uuid.uuid4().hex}")
        fd = await trio.to_thread.run_sync(
            os.open, path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
            limiter=limiter)
        return cls(path, fd, limiter)

    async def pwrite(self, off: int, data) -> None:
        """Write all of ``data`` at ``off``."""
        if len(data) <= INLINE_IO:
            _pwrite_all(self._fd, data, off)
        else:
            await trio.to_thread.run_sync(_pwrite_all, self._fd, data, off,
                                          limiter=self._limiter)

    async def pread(self, off: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``off`` (fewer only at the end of the file)."""
        if size <= INLINE_IO:
            return _pread_all(self._fd, size, off)
        return await trio.to_thread.run_sync(_pread_all, self._fd, size, off,
                                             limiter=self._limiter)

    async def truncate(self, size: int) -> None:
        await trio.to_thread.run_sync(os.ftruncate, self._fd, size, limiter=self._limiter)

    async def remove(self) -> None:
        """Close and delete the file (already gone is fine)."""
        fd, self._fd = self._fd, -1
        await trio.to_thread.run_sync(_close_and_unlink, fd, self.path, limiter=self._limiter)


def _pwrite_all(fd: int, data, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view = view[n:]
        off += n


def _pread_all(fd: int, size: int, off: int) -> bytes:
    first = os.pread(fd, size, off)
    if len(first) == size or not first:
        return first
    parts = [first]   # a short read before the end of the file: read on
    got = len(first)
    while got < size:
        more = os.pread(fd, size - got, off + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _close_and_unlink(fd: int, path: str) -> None:
    try:
        if fd >= 0:
            os.close(fd)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


__all__ = ["StagingFile", "INLINE_IO"]
