"""The mount's open-file requests (``Files``, a part of the mount that
``mount.operations`` composes): create, open, read, write, flush, fsync, release, and the
mount's housekeeping (completing files whose close could not reach the metadata server,
closing every open file at unmount).

Why a part of its own: ``mount.names`` answers the namespace requests (names, attributes,
folders); what an open file goes through from its open to its release is the other half
of the FUSE protocol. It is given the client (reads, creates), the mount's ``KernelView``
(paths, attributes, the kernel's page cache), ``OpenFiles`` (the table it adds open files
and handles to and drops them from) and ``Writer`` (what writes, flushes and releases do to
the cluster).

Concurrency contract: methods of the mount's one trio run, called by the FUSE handlers; an
``OpenFile`` changes only under its ``lock``, taken before the first await (the
asynchronous release of a closed file may run at any await); a handle's read window under
its ``read_lock``.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time

import pyfuse3
import trio

from fs.backoff import Backoff
from fs.client import FileStatus
from fs.errors import (AlreadyBeingCreated, FileExists, FileNotFound, LeaseExpired,
                       LeaseFSError, StreamStalled)

from fs.client import FileSettings

from .callers import new_owner
from .dirleases import DirLeaseHolder, LeasedDir
from .drafts import Draft
from .errors import fuse_error
from .kernelview import KernelView
from .openfiles import FileEvent, FileMode, Handle, OpenFile, OpenFiles
from .writes import Writer

log = logging.getLogger(__name__)

SETGID = stat.S_ISGID
READ_WINDOW = 4 << 20
READ_PIECE = 1 << 20   # a window is fetched in pieces of this; each one is progress
#: the housekeeping round, which completes files whose close could not reach the metadata
#: server (0.5 to 1 s: mounts that lost the same server do not all come back in step)
HOUSEKEEPING = Backoff(first=1.0, factor=1, cap=1.0, jitter=0.5)


class Files:
    """The open-file half of the mount's requests."""

    def __init__(self, client, view: KernelView, open_files: OpenFiles, writer: Writer,
                 leases: DirLeaseHolder, *, file_settings: FileSettings):
        self._client = client
        self._leases = leases
        self._view = view
        self._open_files = open_files
        self._writer = writer
        self._file_settings = file_settings   # what the mount's user chose for new files

    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._view.child(parent_inode, name)
        named = self._view.named
        owner, group = new_owner(ctx)
        chosen = self._file_settings
        leased = await self._leases.lease_to_make(parent_inode, self._view.path(parent_inode),
                                                  name)
        if leased is not None:
            if name in leased.entries:
                if flags & os.O_EXCL:
                    raise fuse_error(errno.EEXIST)
            else:
                ino = leased.take_ino()
                if ino is not None:
                    return await self._create_here(leased, parent_inode, name, path, ino,
                                                   mode, flags, owner, group)
        try:
            stream = await self._client.create(path, overwrite=False,
                                               permission=mode & 0o7777, create_parent=False,
                                               owner=owner, group=group,
                                               block_size=chosen.block_size,
                                               replication=chosen.replication,
                                               bytes_per_checksum=chosen.bytes_per_checksum,
                                               want_parent=True,
                                              # a small file's close keeps it inline:
                                              # no block to give back then
                                               first_block=not self._client.config.inline_max)
        except FileExists:
            self._view.note_made(parent_inode, name)   # another client's, but it is there
            if flags & os.O_EXCL:
                raise
            # the kernel trusted a cached miss, but another client created the name
            # meanwhile: without O_EXCL, open(O_CREAT) opens the existing file
            status = await self._client.get_file_status(path)
            self._leases.note_made(parent_inode, name, status)
            if status.is_dir:
                raise fuse_error(errno.EISDIR) from None
            ino = self._view.kernel_ino(status.ino)
            self._view.remember(ino, path, status)
            try:
                info = await self._open_inode(ino, path, flags)
            except BaseException:
                self._view.forget([(ino, 1)])
                raise
            return info, self._view.attrs(status)
        self._view.note_made(parent_inode, name)
        self._view.keep_fresh(named, stream.created_parent)
        status = FileStatus.from_wire(stream.created_status)
        self._leases.note_made(parent_inode, name, status, stream.created_parent)
        return self._opened_new(status.ino, path, status, stream, mode, flags)

    def _opened_new(self, ino: int, path: str, status: FileStatus, stream, mode: int,
                    flags: int):
        """A file just created, open here with its output stream: create(2)'s answer."""
        of = self._open_files.open_file(ino, 0, mode & 0o7777, status)
        of.status = status
        of.stream, of.size = stream, 0
        of.move(FileEvent.CREATE)
        attrs = self._view.attrs(status)
        self._view.remember(attrs.st_ino, path)
        handle = self._open_files.add_handle(of, flags)
        return pyfuse3.FileInfo(fh=handle.fh), attrs

    async def _create_here(self, leased: LeasedDir, parent_inode: int, name: bytes, path: str,
                           ino: int, mode: int, flags: int, owner: str | None,
                           group: str | None):
        """create(2) decided under the folder's lease: the file gets an inode the grant
        reserved and the status the server will give it (``create``'s rules: the caller's
        owner, the folder's group unless asked otherwise or the folder is setgid); the
        server gets it in the lease's queue, and a small file's content at its close."""
        chosen = self._file_settings
        config = self._client.config
        now = time.time_ns()
        folder = leased.status
        status = FileStatus(
            name=os.fsdecode(name), path=path, ino=ino, type="file", mode=mode & 0o7777,
            owner=owner or self._client.rpc.user,
            group=folder.group if group is None or folder.mode & SETGID else group,
            mtime_ns=now, atime_ns=now, ctime_ns=now, length=0,
            replication=chosen.replication or config.replication,
            block_size=chosen.block_size or config.block_size, symlink=None,
            under_construction=True, children=0)
        await self._leases.create(leased, self._view.path(parent_inode), name, status,
                                  owner=owner, group=group, replication=chosen.replication,
                                  block_size=chosen.block_size)
        self._view.note_made(parent_inode, name)
        # its bytes held here until it needs a stream (``mount.drafts``); its wire form
        # is a flat copy (asdict's deep copy cost a fifth of the call)
        stream = Draft(self._client, path, dict(vars(status)),
                       bytes_per_checksum=chosen.bytes_per_checksum)
        kernel_ino = self._view.kernel_ino(ino)
        opened = self._opened_new(kernel_ino, path, status, stream, mode, flags)
        of = self._open_files.get(kernel_ino)
        stream.meta_via = self._leases.file_calls(kernel_ino, ino, lambda: of.handles == 0)
        return opened

    async def open(self, inode: int, flags: int) -> pyfuse3.FileInfo:
        return await self._open_inode(inode, self._view.path(inode), flags)

    async def _open_inode(self, inode: int, path: str, flags: int) -> pyfuse3.FileInfo:
        reading = (flags & os.O_ACCMODE) == os.O_RDONLY and not flags & os.O_TRUNC
        if reading:
            kept = self._leases.content_of(inode)
            if kept is not None:
                opened = self._open_kept(inode, flags, *kept)
                if opened is not None:
                    return opened
        # for reading: the block locations come with the status (one call before the
        # first read instead of two)
        try:
            status = await self._client.get_file_status(path, locations=reading)
        except FileNotFound:
            # the kernel's cached name outlived the file (another client removed it): it
            # looks the name up again and retries the open (an O_CREAT open then creates)
            raise fuse_error(errno.ESTALE) from None
        if status.is_dir:
            raise fuse_error(errno.EISDIR)
        of = self._open_files.get(inode)
        if of is None:
            of = self._open_files.open_file(inode, status.length, status.mode & 0o7777, status)
        keep_cache = False
        self._writer.check_cache(of, status)
        if reading:
            keep_cache = self._view.unchanged_since_read(inode, status, of.clean)
            if of.clean:
                self._view.revalidate(inode, status)
        else:
            self._view.drop_read_stamp(inode)
        of.status = status
        handle = self._open_files.add_handle(of, flags)
        if status.locations is not None:
            handle.located = (of.generation, status.locations)
        try:
            # opening for write takes the lease now, so a second writer learns at open
            # (EBUSY), not at its first write; but a plain read-write open (a database's)
            # takes it at its first write: writers on several mounts taking turns under
            # their locks each open it once and hold the lease only while they write
            # (mount.locks gives it back with their last lock)
            if handle.writable:
                self._leases.note_changed(path)
            if handle.writable and not (
                    (flags & os.O_ACCMODE) == os.O_RDWR
                    and not flags & (os.O_TRUNC | os.O_APPEND)):
                async with of.lock:
                    if flags & os.O_TRUNC:
                        await self._writer.truncate_locked(of, path, 0)
                    if of.mode is FileMode.CLEAN and not of.unlinked:
                        await self._writer.start_append(of, path)
        except AlreadyBeingCreated as exc:
            log.warning("open %s for writing: %s", path, exc)
            await self._drop_handle(handle)
            raise
        except BaseException:
            await self._drop_handle(handle)
            raise
        return pyfuse3.FileInfo(fh=handle.fh, keep_cache=keep_cache)

    def _open_kept(self, inode: int, flags: int, status: FileStatus,
                   data: bytes) -> pyfuse3.FileInfo | None:
        """An open for reading of a small file made and closed here, answered from its
        content the lease holder kept (no call: a build or git add reads back what was just
        written); None when it is open here otherwise (being written, staged)."""
        of = self._open_files.get(inode)
        if of is not None and not of.clean:
            return None
        if of is None:
            of = self._open_files.open_file(inode, status.length, status.mode & 0o7777, status)
        self._view.drop_read_stamp(inode)
        of.status = status
        handle = self._open_files.add_handle(of, flags)
        handle.window_offset, handle.window, handle.window_ends_file = 0, data, True
        handle.input_generation = of.generation
        return pyfuse3.FileInfo(fh=handle.fh)

    async def read(self, fh, off, size):
        handle = self._open_files.handle(fh)
        of = handle.of
        async with of.lock:
            if of.mode is FileMode.STREAM:
                await self._writer.to_staging(of, self._view.path(of.ino))
            if of.mode is FileMode.STAGING:
                return await of.staging.pread(off, size)
            cache = self._writer.cached(of)
            if cache is not None:
                return await cache.pread(off, size)
        async with handle.read_lock:
            data = handle.from_window(off, size) if handle.input_generation == of.generation \
                else None
            if data is not None:
                return data
            window = await self._read_window(handle, of, off, size)
            handle.window_offset, handle.window = off, window
            handle.window_ends_file = False
            return window[:size]

    async def _read_window(self, handle: Handle, of: OpenFile, off: int, size: int) -> bytes:
        """The read window at ``off`` from the cluster, under the mount's bound on no
        progress (``data_stall_timeout``): ``StreamStalled`` (EIO) when no replica answered
        for that long. Read lock held."""
        config = self._client.config
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
            exc = StreamStalled(f"{self._view.path(of.ino)}: read at offset {off} made no "
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
            handle.input = await self._client.open(
                self._view.path(of.ino),
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
        handle.window_ends_file = False
        if handle.input is not None:
            stream, handle.input = handle.input, None
            await stream.close()

    async def write(self, fh, off, buf):
        handle = self._open_files.handle(fh)
        of = handle.of
        async with of.lock:
            try:
                return await self._write_locked(handle, of, off, buf)
            except LeaseFSError as exc:
                self._write_failed(of, "write", exc)
                raise

    async def _write_locked(self, handle: Handle, of: OpenFile, off: int, buf) -> int:
        of.pending_times = None   # a write after utimens sets mtime to now again
        path = self._view.path(of.ino) if not of.unlinked else None
        if handle.flags & os.O_APPEND:
            off = of.size   # the kernel's idea of the end may be a stale cached size
        if of.mode is FileMode.CLEAN and path is not None:
            # the first write takes the lease (a plain read-write open, or a file its last
            # lock gave back): at the end, for appending; inside the content, for patches
            # of what changes (a database's pages), else it appends and then stages
            if off >= of.size or not await self._writer.start_patch(of, path):
                await self._writer.start_append(of, path)
        if of.mode is FileMode.STREAM and off == of.stream.pos:
            await of.stream.write(buf)
            of.stream_took(buf)
            of.size = of.stream.pos
            return len(buf)
        await self._writer.to_staging(of, path)
        self._writer.reserve(of, off + len(buf))
        await of.staging.pwrite(off, buf)
        of.dirty = True
        # a hole past the end reads as zeros: the patch must carry them too
        of.dirty_ranges.add(min(off, of.size), off + len(buf))
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
        path = self._view.current_path(of.ino, f"inode {of.ino}")
        lost = (" (the mount lost the file's lease: another client recovered it, or "
                "renewals failed past the hard limit)" if isinstance(exc, LeaseExpired) else "")
        log.warning("%s: %s failed%s: %s%s", path, what, lost, exc, then)

    async def flush(self, fh):
        handle = self._open_files.handle(fh)
        of = handle.of
        async with of.lock:
            self._raise_pending(of, clear=True)
            if handle.writable:
                # flush runs at every close(2) of a descriptor of this handle, including
                # a dup's and the copies a fork inherited, and cannot tell the last one: it
                # publishes what was written (new readers see it, close reports errors) and
                # the stream - and the lease - live until the release, as fuse-dfs
                try:
                    await self._writer.publish(of, finish=False)
                except LeaseFSError as exc:
                    self._log_failure(of, "close", exc)
                    raise

    async def fsync(self, fh, datasync):
        handle = self._open_files.handle(fh)
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
                # an hsync of nothing written makes no call: the create before it is
                # made durable by the metadata sync below
                synced = (of.stream.pos > 0 and of.pending_mode is None
                          and of.pending_times is None)
                await self._writer.send_pending_attrs(of, keep=True)
            elif of.mode is FileMode.STAGING:
                await self._writer.publish(of, finish=False)
            if not synced:
                await self._sync_metadata()

    async def fsyncdir(self, fh, datasync):
        if self._open_files.dir(fh) is None:
            raise fuse_error(errno.EBADF)
        await self._sync_metadata()

    async def _sync_metadata(self) -> None:
        """fsync(2)'s promise for namespace changes (a create, rename, unlink, a close of a
        file kept inline) that were answered before the metadata server's fsync."""
        if not self._client.config.sync_metadata:
            await self._client.sync_metadata()

    async def release(self, fh):
        handle = self._open_files.find_handle(fh)
        if handle is None:
            return
        await self._drop_handle(handle)

    async def _drop_handle(self, handle: Handle) -> None:
        self._open_files.drop_handle(handle)
        of = handle.of
        if handle.input is not None:
            await handle.input.close()
        of.handle_gone(handle)
        if of.handles > 0 and (of.writers > 0 or not handle.writable):
            return
        async with of.lock:
            if not self._open_files.is_current(of):
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
                        await self._writer.release_keeper(of, abandon=of.unlinked)
                    except LeaseFSError as exc:
                        log.warning("release of inode %d: %s", of.ino, exc)
                    await self._writer.discard_staging(of)
                if of.handles == 0 and self._open_files.is_current(of):
                    self._open_files.remove(of)
                    self._view.drop_if_forgotten(of.ino)

    async def _finish_writing(self, of: OpenFile) -> None:
        """Complete ``of`` (or upload its staging file), giving its lease back: its last
        writer is gone. Errors are logged (nobody waits for a release). Lock held."""
        try:
            await self._writer.publish(of, finish=True)
        except LeaseFSError as exc:
            log.warning("release of inode %d: %s", of.ino, exc)
        finally:
            if of.opened_for_writing:   # a read-only open changed nothing
                self._view.invalidate_attrs(of.ino)
                self._view.touch_node(of.ino)

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
        for handle in self._open_files.handles():
            try:
                await self._drop_handle(handle)
            except Exception:  # keep closing the others
                log.exception("closing inode %d at unmount failed", handle.of.ino)
        await self._writer.complete_unfinished()
        self._writer.log_unfinished()

    async def run_background(self) -> None:
        """The mount's housekeeping task (started by the runner next to ``pyfuse3.main``)."""
        while True:
            await HOUSEKEEPING.sleep(0)
            if self._writer.has_unfinished():
                await self._writer.complete_unfinished()


__all__ = ["Files", "READ_WINDOW"]
