"""The mount's file handlers (``FileHandlers``, a mixin of ``mount.operations.LeaseFS``):
create, open, read, write, flush, fsync, release, and the completion of files whose close
could not reach the metadata server.

Why a module of its own: ``mount.operations`` answers the namespace requests (names,
attributes, folders); what an open file goes through from its open to its release is the
other half of the FUSE protocol, kept apart so each module has one job. The per-file state
and its mode table are in ``mount.openfiles``, how writes reach the cluster in
``mount.writes``.

Concurrency contract: that of ``mount.operations``: handlers are tasks of the mount's one
trio run; an ``OpenFile`` changes only under its ``lock``, taken before the first await.
"""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3
import trio

from fs.backoff import Backoff
from fs.client import FileStatus
from fs.errors import (AlreadyBeingCreated, FileExists, LeaseExpired, LeaseFSError,
                       ServerUnavailable, StreamStalled)

from .errors import fuse_error, fuse_op
from .openfiles import FileEvent, FileMode, Handle, OpenFile

log = logging.getLogger(__name__)

ROOT_INO = pyfuse3.ROOT_INODE
READ_WINDOW = 4 << 20
READ_PIECE = 1 << 20   # a window is fetched in pieces of this; each one is progress
#: the housekeeping round, which completes files whose close could not reach the metadata
#: server (0.5 to 1 s: mounts that lost the same server do not all come back in step)
HOUSEKEEPING = Backoff(first=1.0, factor=1, cap=1.0, jitter=0.5)


class FileHandlers:
    """The open-file half of ``LeaseFS`` (needs the state ``LeaseFS.__init__`` makes)."""

    def _open_file(self, ino: int, size: int, permission: int, status: FileStatus) -> OpenFile:
        of = self._open.get(ino)
        if of is None:
            of = self._open[ino] = OpenFile(
                ino, size, permission, owner=status.owner, group=status.group,
                replication=status.replication or None, block_size=status.block_size or None,
                copies=self._copies)
            of.ns_ino = status.ino   # the kernel's number may be an alias of a re-upload
        return of

    def _add_handle(self, of: OpenFile, flags: int) -> Handle:
        handle = Handle(self._new_fh(), of, flags)
        of.handles += 1
        if handle.writable:
            of.writers += 1
            of.opened_for_writing = True
        self._handles[handle.fh] = handle
        return handle

    @fuse_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._child(parent_inode, name)
        named = self._named
        owner, group = self._identity(ctx)
        chosen = self.file_settings
        try:
            stream = await self.client.create(path, overwrite=False,
                                              permission=mode & 0o7777, create_parent=False,
                                              owner=owner, group=group,
                                              block_size=chosen.block_size,
                                              replication=chosen.replication,
                                              bytes_per_checksum=chosen.bytes_per_checksum,
                                              want_parent=True,
                                              # a small file's close keeps it inline:
                                              # no block to give back then
                                              first_block=not self.client.config.inline_max)
        except FileExists:
            self._note_made(parent_inode, name)   # another client's, but it is there
            if flags & os.O_EXCL:
                raise
            # the kernel trusted a cached miss, but another client created the name
            # meanwhile: without O_EXCL, open(O_CREAT) opens the existing file
            status = await self.client.get_file_status(path)
            if status.is_dir:
                raise fuse_error(errno.EISDIR) from None
            ino = self._kernel_ino(status.ino)
            self._remember(ino, path, status)
            try:
                info = await self._open_inode(ino, path, flags)
            except BaseException:
                self.forget([(ino, 1)])
                raise
            return info, self._attrs(status)
        self._note_made(parent_inode, name)
        self._keep_fresh(named, stream.created_parent)
        status = FileStatus.from_wire(stream.created_status)
        of = self._open_file(status.ino, 0, mode & 0o7777, status)
        of.status = status
        of.stream, of.size = stream, 0
        of.move(FileEvent.CREATE)
        attrs = self._attrs(status)
        self._remember(attrs.st_ino, path)
        handle = self._add_handle(of, flags)
        return pyfuse3.FileInfo(fh=handle.fh), attrs

    @fuse_op
    async def open(self, inode, flags, ctx):
        return await self._open_inode(inode, self._path(inode), flags)

    async def _open_inode(self, inode: int, path: str, flags: int) -> pyfuse3.FileInfo:
        reading = (flags & os.O_ACCMODE) == os.O_RDONLY and not flags & os.O_TRUNC
        # for reading: the block locations come with the status (one call before the
        # first read instead of two)
        status = await self.client.get_file_status(path, locations=reading)
        if status.is_dir:
            raise fuse_error(errno.EISDIR)
        of = self._open.get(inode)
        if of is None:
            of = self._open_file(inode, status.length, status.mode & 0o7777, status)
        keep_cache = False
        if reading:
            keep_cache = self._unchanged_since_read(inode, of, status)
        else:
            self._read_stamps.pop(inode, None)
        of.status = status
        handle = self._add_handle(of, flags)
        if status.locations is not None:
            handle.located = (of.generation, status.locations)
        try:
            if handle.writable:
                # opening for write takes the lease now, so a second writer learns at open
                # (EBUSY), not at its first write
                async with of.lock:
                    if flags & os.O_TRUNC:
                        await self._truncate_locked(of, path, 0)
                    if of.mode is FileMode.CLEAN and not of.unlinked:
                        await self._start_append(of, path)
        except AlreadyBeingCreated as exc:
            log.warning("open %s for writing: %s", path, exc)
            await self._drop_handle(handle)
            raise
        except BaseException:
            await self._drop_handle(handle)
            raise
        return pyfuse3.FileInfo(fh=handle.fh, keep_cache=keep_cache)

    def _unchanged_since_read(self, ino: int, of: OpenFile, status: FileStatus) -> bool:
        """Whether the kernel's cached pages of ``ino`` still hold its content: the file is
        closed and has the mtime, ctime and length it had at the last open for reading
        here (any write, truncate or append, here or by another client, changes them).
        Records the stamp for the next open."""
        if (status.under_construction or of.mode is not FileMode.CLEAN or of.writers
                or of.unlinked):
            self._read_stamps.pop(ino, None)
            return False
        stamp = (status.mtime_ns, status.ctime_ns, status.length)
        same = self._read_stamps.get(ino) == stamp
        self._read_stamps[ino] = stamp
        return same

    def _handle(self, fh: int) -> Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise fuse_error(errno.EBADF)
        return handle

    @fuse_op
    async def read(self, fh, off, size):
        handle = self._handle(fh)
        of = handle.of
        async with of.lock:
            if of.mode is FileMode.STREAM:
                await self._to_staging(of, self._path(of.ino))
            if of.mode is FileMode.STAGING:
                return await of.staging.pread(off, size)
        async with handle.read_lock:
            data = handle.from_window(off, size) if handle.input_generation == of.generation \
                else None
            if data is not None:
                return data
            window = await self._read_window(handle, of, off, size)
            handle.window_offset, handle.window = off, window
            return window[:size]

    async def _read_window(self, handle: Handle, of: OpenFile, off: int, size: int) -> bytes:
        """The read window at ``off`` from the cluster, under the mount's bound on no
        progress (``data_stall_timeout``): ``StreamStalled`` (EIO) when no replica answered
        for that long. Read lock held."""
        config = self.client.config
        stall = config.data_stall_timeout
        scope = trio.CancelScope()
        budget = stall
        if stall > 0:
            now = trio.current_time()
            if handle.stalled_at is not None and now - handle.stalled_at < stall:
                # the kernel asks again at once for the page a failed readahead left
                # (one read(2) of the caller): a replica's worth of waiting, not a
                # whole bound again
                budget = min(stall, config.data_timeout)
            scope.deadline = now + budget
        try:
            with scope:
                window = await self._fetch_window(handle, of, off, size, scope, stall)
        except BaseException:
            await self._drop_input(handle)   # cut anywhere in a block: open it again
            raise
        if scope.cancelled_caught:
            await self._drop_input(handle)
            handle.stalled_at = trio.current_time()
            again = " (asked again right after a stalled read)" if budget < stall else ""
            exc = StreamStalled(f"{self._path(of.ino)}: read at offset {off} made no "
                                f"progress for {budget:g} s{again}: no replica answered")
            log.warning("%s", exc)
            raise exc
        handle.stalled_at = None
        return window

    async def _fetch_window(self, handle: Handle, of: OpenFile, off: int, size: int,
                            scope: trio.CancelScope, stall: float) -> bytes:
        """The read window at ``off`` (at least ``size`` bytes but at the end) from the
        handle's input stream, opened first if needed. Fetched in pieces, each of which
        moves ``scope``'s deadline on: the mount's data bound is one on no progress, so a
        slow but live replica goes on serving (a silent one is left for another within
        ``data_timeout`` by the input stream itself)."""
        if handle.input is None or handle.input_generation != of.generation:
            await self._drop_input(handle)
            located, handle.located = handle.located, None
            handle.input = await self.client.open(
                self._path(of.ino),
                located=located[1] if located and located[0] == of.generation else None)
            handle.input_generation = of.generation
        if off + size > handle.input.length:
            await handle.input.refresh()
        handle.input.seek(off)   # sequential reads stay on one kept connection
        want = max(size, READ_WINDOW)
        pieces: list[bytes] = []
        got = 0
        while got < want:
            piece = await handle.input.read(min(READ_PIECE, want - got))
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
            if stall > 0:
                scope.deadline = trio.current_time() + stall
        return b"".join(pieces)

    @staticmethod
    async def _drop_input(handle: Handle) -> None:
        handle.window = b""
        if handle.input is not None:
            stream, handle.input = handle.input, None
            await stream.close()

    @fuse_op
    async def write(self, fh, off, buf):
        handle = self._handle(fh)
        of = handle.of
        async with of.lock:
            try:
                return await self._write_locked(handle, of, off, buf)
            except LeaseFSError as exc:
                self._write_failed(of, "write", exc)
                raise

    async def _write_locked(self, handle: Handle, of: OpenFile, off: int, buf) -> int:
        of.pending_times = None   # a write after utimens sets mtime to now again
        if handle.flags & os.O_APPEND:
            off = of.size   # the kernel's idea of the end may be a stale cached size
        path = self._path(of.ino) if not of.unlinked else None
        if of.mode is FileMode.CLEAN and off == of.size and path is not None:
            await self._start_append(of, path)
        if of.mode is FileMode.STREAM and off == of.stream.pos:
            await of.stream.write(buf)
            of.stream_took(buf)
            of.size = of.stream.pos
            return len(buf)
        await self._to_staging(of, path)
        self._reserve(of, off + len(buf))
        await of.staging.pwrite(off, buf)
        of.dirty = True
        of.size = max(of.size, off + len(buf))
        return len(buf)

    def _write_failed(self, of: OpenFile, what: str, exc: LeaseFSError) -> None:
        """A ``what`` (write, fsync) of ``of`` failed with ``exc``: logged once, naming the
        file and the cause, and kept until the close reports it again (``flush``), as HDFS's
        stream and NFS do: what the cluster holds may lack bytes the caller wrote."""
        if of.error is not exc:
            self._log_failure(of, what, exc, "; reported again at fsync and close")
        of.error = exc

    def _log_failure(self, of: OpenFile, what: str, exc: LeaseFSError, then: str = "") -> None:
        path = self._current_path(of.ino, f"inode {of.ino}")
        lost = (" (the mount lost the file's lease: another client recovered it, or "
                "renewals failed past the hard limit)" if isinstance(exc, LeaseExpired) else "")
        log.warning("%s: %s failed%s: %s%s", path, what, lost, exc, then)

    @fuse_op
    async def flush(self, fh):
        handle = self._handle(fh)
        of = handle.of
        async with of.lock:
            self._raise_pending(of, clear=True)
            if handle.writable:
                # flush runs at every close(2) of a descriptor of this handle, including
                # a dup's and the copies a fork inherited, and cannot tell the last one: it
                # publishes what was written (new readers see it, close reports errors) and
                # the stream - and the lease - live until the release, as fuse-dfs
                try:
                    await self._publish(of, finish=False)
                except LeaseFSError as exc:
                    self._log_failure(of, "close", exc)
                    raise

    @fuse_op
    async def fsync(self, fh, datasync):
        handle = self._handle(fh)
        of = handle.of
        async with of.lock:
            self._raise_pending(of, clear=False)   # the close reports it again
            synced = False
            if of.mode is FileMode.STREAM:
                try:
                    await of.stream.hsync()   # durable, with every namespace change before it
                except LeaseFSError as exc:
                    self._write_failed(of, "fsync", exc)
                    raise
                synced = of.pending_mode is None and of.pending_times is None
                await self._send_pending_attrs(of, keep=True)
            elif of.mode is FileMode.STAGING:
                await self._publish(of, finish=False)
            if not synced:
                await self._sync_metadata()

    @fuse_op
    async def fsyncdir(self, fh, datasync):
        if fh not in self._dirs:
            raise fuse_error(errno.EBADF)
        await self._sync_metadata()

    async def _sync_metadata(self) -> None:
        """fsync(2)'s promise for namespace changes (a create, rename, unlink, a close of a
        file kept inline) that were answered before the metadata server's fsync."""
        if not self.client.config.sync_metadata:
            await self.client.sync_metadata()

    @fuse_op
    async def release(self, fh):
        handle = self._handles.get(fh)
        if handle is None:
            return
        await self._drop_handle(handle)

    async def _drop_handle(self, handle: Handle) -> None:
        self._handles.pop(handle.fh, None)
        of = handle.of
        if handle.input is not None:
            await handle.input.close()
        of.handles -= 1
        if handle.writable:
            of.writers -= 1
        if of.handles > 0 and (of.writers > 0 or not handle.writable):
            return
        async with of.lock:
            if self._open.get(of.ino) is not of:
                return   # already finished
            if of.handles > 0:
                # the last writer went while readers stay (tail -f, less): the file is
                # published and its lease given back all the same; a writer that opened
                # it again meanwhile keeps it
                if of.writers == 0 and of.mode is not FileMode.CLEAN:
                    await self._finish_writing(of)
                return
            try:
                await self._finish_writing(of)
            finally:
                # an open() may have joined this file while it was being published: then
                # it stays registered (now clean) for that handle
                if of.handles == 0:
                    try:   # still leased when the publish failed, or deleted while open
                        await self._release_keeper(of, abandon=of.unlinked)
                    except LeaseFSError as exc:
                        log.warning("release of inode %d: %s", of.ino, exc)
                    await self._discard_staging(of)
                if of.handles == 0 and self._open.get(of.ino) is of:
                    of.drop_copy()   # a stream whose completion failed may still hold one
                    del self._open[of.ino]
                    node = self._nodes.get(of.ino)
                    if node is not None and node.lookups <= 0 and of.ino != ROOT_INO:
                        del self._nodes[of.ino]

    async def _finish_writing(self, of: OpenFile) -> None:
        """Complete ``of`` (or upload its staging file), giving its lease back: its last
        writer is gone. Errors are logged (nobody waits for a release). Lock held."""
        try:
            await self._publish(of, finish=True)
        except LeaseFSError as exc:
            log.warning("release of inode %d: %s", of.ino, exc)
        finally:
            if of.opened_for_writing:   # a read-only open changed nothing
                self._invalidate_attrs(of.ino)
                self._touch_node(of.ino)

    @staticmethod
    def _invalidate_attrs(ino: int) -> None:
        """Make the kernel ask getattr again: a released file's length now comes from the
        cluster, and what the kernel cached while it was open may be behind."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except (OSError, RuntimeError) as exc:   # not known to the kernel (any more)
            log.debug("invalidate inode %d: %s", ino, exc)

    def _raise_pending(self, of: OpenFile, *, clear: bool) -> None:
        """Raise the error a write or fsync of ``of`` met, if any (``clear``: the close
        reports it, for the last time)."""
        if of.error is not None:
            exc = of.error
            if clear:
                of.error = None
            raise exc

    async def close_all(self) -> None:
        """Publish and forget every open file (the mount is going away)."""
        for handle in list(self._handles.values()):
            try:
                await self._drop_handle(handle)
            except Exception:  # keep closing the others
                log.exception("closing inode %d at unmount failed", handle.of.ino)
        await self.complete_unfinished()
        for _ino, stream in self._unfinished:
            log.error("%s: left under construction (metadata server unreachable); its data "
                      "is on the block servers and lease recovery will close it", stream.path)

    async def complete_unfinished(self) -> None:
        """Retry ``complete`` for files whose close could not reach the metadata server."""
        for item in list(self._unfinished):
            ino, stream = item
            try:
                await stream.retry_complete()
            except LeaseFSError as exc:
                if isinstance(exc, ServerUnavailable) or exc.retriable:   # e.g. safe mode
                    continue
                log.warning("%s: completing after an outage failed: %s", stream.path, exc)
            else:
                log.info("%s: completed after the metadata server came back", stream.path)
                self._invalidate_attrs(ino)
            self._unfinished.remove(item)

    async def run_background(self) -> None:
        """The mount's housekeeping task (started by the runner next to ``pyfuse3.main``)."""
        while True:
            await HOUSEKEEPING.sleep(0)
            if self._unfinished:
                await self.complete_unfinished()


__all__ = ["FileHandlers", "READ_WINDOW"]
