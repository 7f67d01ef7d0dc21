"""How the mount's writes reach the cluster (``Writer``, a part of the mount that
``mount.operations`` composes): publishing an open file (hflush, complete, upload of a
staging file), the local staging files (``mount.staging``), truncates (shrink by the
``truncate`` RPC, grow by appending zeros), and the completion of files whose close could
not reach the metadata server.

Why a part of its own: the handlers (``mount.files``, ``mount.names``) decide which move an
open file makes; this is what the moves do to an ``OpenFile`` (``mount.openfiles``) and to
the cluster. It is given the client, the mount's ``KernelView`` (paths of inodes, the alias
a re-created file gets, attribute invalidation) and ``OpenFiles`` (what is staged, under the
cache limit), and owns the staging settings (folder, limit, worker threads).

Concurrency contract: methods of the mount's one trio run. Every method taking an
``OpenFile`` expects the caller to hold that file's ``lock`` (the FUSE handlers take it
before their first await), but ``detach``, which takes it. Staging-file I/O follows
``mount.staging``'s contract: calls of a few pages on the trio thread (page-cache copies),
everything else in worker threads limited by the part's one ``CapacityLimiter``.
"""

from __future__ import annotations

import dataclasses
import errno
import logging

import trio

from fs.backoff import Backoff
from fs.client import FileSettings
from fs.patchfile import block_versions
from fs.status import FileStatus
from fs.errors import (FileNotFound, FileTooLarge, InvalidArgument, LeaseExpired,
                       LeaseFSError, ServerUnavailable)

from .dirleases import DirLeaseHolder
from .errors import fuse_error
from .kernelview import KernelView
from .openfiles import FileEvent, FileMode, KeptCopy, OpenFile, OpenFiles
from .staging import StagingFile

log = logging.getLogger(__name__)

COPY_CHUNK = 4 << 20
TRUNCATE_WAIT = 60.0
#: the wait between two asks whether a file being recovered is closed yet (25 to 50 ms)
CLOSED_POLL = Backoff(first=0.05, factor=1, cap=0.05, jitter=0.5)


def still_ours(exc: LeaseFSError) -> bool:
    """Whether a write that failed with ``exc`` may have left its file open under the
    mount's lease (not when the file is gone or the lease was lost: the path may name
    another client's file by now)."""
    return not isinstance(exc, (FileNotFound, LeaseExpired))


class Writer:
    """The write side of one mount."""

    def __init__(self, client, view: KernelView, open_files: OpenFiles,
                 leases: DirLeaseHolder, *, cache_dir: str, cache_limit: int,
                 file_settings: FileSettings, io_threads: int = 4):
        self._client = client
        self._leases = leases
        self._view = view
        self._open_files = open_files
        self._cache_dir = cache_dir
        self._cache_limit = cache_limit
        self._file_settings = file_settings   # what the mount's user chose for new files
        self._io_limiter = trio.CapacityLimiter(io_threads)
        # files whose last close reached every block server but not the metadata server
        # (unreachable for longer than the mount's timeout): completed in the background
        self._unfinished: list[tuple[int, object]] = []

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

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
                self._view.invalidate_attrs(ino)
            self._unfinished.remove(item)

    def log_unfinished(self) -> None:
        """At unmount: say which files stay under construction (their data is safe)."""
        for _ino, stream in self._unfinished:
            log.error("%s: left under construction (metadata server unreachable); its data "
                      "is on the block servers and lease recovery will close it", stream.path)

    async def start_append(self, of: OpenFile, path: str) -> None:
        """Take the lease and continue the file at its end (the fast path's stream)."""
        of.stream = await self._client.append(path)
        of.ns_ino = of.stream.ino
        of.move(FileEvent.APPEND)
        of.size = of.stream.pos
        of.generation += 1

    async def start_patch(self, of: OpenFile, path: str) -> bool:
        """Take the lease for writes inside the file's content (``open_for_patch``: no
        block reopened) and stage it: uploads then send what changed as patches. False
        (nothing taken) for a file that takes none, one kept inline: the caller appends."""
        await self._hold_for_patches(of, path)
        patcher = of.patcher
        if patcher is None:
            return False
        try:
            if of.cache is not None and of.cache.version == patcher.version:
                # the copy kept at the last close is this very version: no read back
                of.staging, of.cache = of.cache.file, None
                of.size = patcher.length
                of.move(FileEvent.STAGE)
                of.dirty = False
            else:
                await self.to_staging(of, path)   # (it drops a copy of another version)
        except BaseException:
            of.patcher = None
            await self._give_back_patcher(patcher, path)
            raise
        of.dirty_ranges.clear()
        of.patchable = True
        of.generation += 1
        return True

    async def _give_back_patcher(self, patcher, path: str) -> None:
        """Close a patcher nothing was written through (the lease goes back as it came)."""
        try:
            await patcher.close()
        except LeaseFSError as exc:
            patcher.abort(exc)
            if still_ours(exc):
                await self._client.give_back(path, "open for patches")

    async def publish(self, of: OpenFile, *, finish: bool) -> None:
        """Make the cluster copy match what was written. ``finish``: also close the stream
        (completing the file, releasing the lease) and go back to ``clean``."""
        changed = (of.mode is FileMode.STREAM and finish
                   or of.mode is FileMode.STAGING and of.dirty)
        try:
            await self._publish_content(of, finish=finish)
        finally:
            if changed:
                await self.send_pending_attrs(of, keep=not finish)

    async def send_pending_attrs(self, of: OpenFile, *, keep: bool) -> None:
        """Set the mode and times chmod and utimens gave ``of`` while it was written
        (``keep``: times again after the completion still to come)."""
        if of.unlinked:
            return
        # by inode or current name: after a close (rsync: close, set times, rename) the
        # name may change while this runs
        path = self._view.current_path(of.ino, "/")
        if of.pending_mode is not None:
            mode, of.pending_mode = of.pending_mode, None
            await self._client.set_permission(path, mode)
        if of.pending_times is not None:
            mtime_ns, atime_ns = of.pending_times
            if not keep:
                of.pending_times = None
            await self._client.set_times(path, mtime_ns=mtime_ns, atime_ns=atime_ns,
                                         ino=of.ns_ino)

    async def _publish_content(self, of: OpenFile, *, finish: bool) -> None:
        if of.mode is FileMode.STREAM:
            try:
                if finish:
                    # the mode changes only once the file is complete: until then the
                    # cluster's length lags and getattr must keep answering of.size
                    try:
                        await self._complete(of.ino, of.stream, of)
                    finally:
                        of.stream = None
                        of.move(FileEvent.COMPLETE)
                else:
                    await of.stream.publish()
            except LeaseFSError:
                of.error = None   # reported right here, not again
                raise
        elif of.mode is FileMode.STAGING:
            if of.dirty and not of.unlinked:
                await self._upload(of, finish=finish)
            if finish and not of.unlinked:
                await self.release_keeper(of)
                version, of.closed_version = of.closed_version, None
                path = self._view.current_path(of.ino, "")
                if version is None or not path or not await self._keep_as_cache(
                        of, version, path):
                    await self.discard_staging(of)

    async def _complete(self, ino: int, stream, of: OpenFile | None = None) -> None:
        """Close ``stream`` (complete the file, release the lease); a close that reached
        every block server but not the metadata server is completed later. The times
        utimens gave ``of`` while it was written go with the completion."""
        send = of is not None and not of.unlinked and (of.pending_times is not None
                                                       or of.pending_mode is not None)
        try:
            if not send:
                await stream.close()
            else:
                mtime_ns, atime_ns = of.pending_times or (None, None)
                await stream.close(mtime_ns=mtime_ns, atime_ns=atime_ns,
                                   permission=of.pending_mode)
                of.pending_times = of.pending_mode = None   # set by the completion
        except LeaseFSError as exc:
            if stream.complete_pending:
                log.warning("%s: metadata server unreachable at close; the data is on the "
                            "block servers, completing it when the server is back",
                            stream.path)
                self._unfinished.append((ino, stream))
            elif still_ours(exc):   # refused or broken for good: not left open under our lease
                await self._client.give_back(self._view.current_path(ino, stream.path), "close")
            raise

    async def release_keeper(self, of: OpenFile, *, abandon: bool = False) -> None:
        """End the lease a staged file holds: complete the file, or (``abandon``: the file
        was deleted under it) just drop the stream."""
        patcher, of.patcher = of.patcher, None
        if patcher is not None:
            if abandon:
                patcher.abort(LeaseFSError(f"{patcher.path}: deleted while open"))
            else:
                await self._close_patcher(of, patcher)
        keeper, of.keeper = of.keeper, None
        if keeper is None:
            return
        if abandon:
            keeper.abort(LeaseFSError(f"{keeper.path}: deleted while open"))
        else:
            await self._complete(of.ino, keeper)

    async def _close_patcher(self, of: OpenFile, patcher) -> None:
        """Complete a file held for patches, with the times utimens gave it; its staging
        copy then holds ``closed_version`` of the content (unless written since)."""
        mtime_ns = of.pending_times[0] if of.pending_times is not None else None
        of.closed_version = None
        try:
            await patcher.close(mtime_ns=mtime_ns)
            if not of.dirty:
                of.closed_version = patcher.version
        except LeaseFSError as exc:
            patcher.abort(exc)
            if still_ours(exc):
                await self._client.give_back(self._view.current_path(of.ino, patcher.path),
                                             "close")
            raise

    def _patches_fit(self, of: OpenFile) -> bool:
        """Whether the staged content differs from the cluster's only by the ranges
        written (nothing cut off)."""
        patcher = of.patcher
        return patcher is not None and of.patchable and patcher.length <= of.size

    async def _send_patches(self, of: OpenFile, *, finish: bool) -> None:
        """Send what was written since the last upload as patches of the file's blocks
        (read back from the staging file in pieces of at most ``COPY_CHUNK``); what lies
        past the last block's room goes on as new blocks (``extend``)."""
        room = of.patcher.capacity
        ranges = []
        for start, end in of.dirty_ranges.spans(min(of.size, room)):
            while start < end:
                take = min(COPY_CHUNK, end - start)
                ranges.append((start, await of.staging.pread(start, take)))
                start += take
        if ranges:
            # the blocks' next patches begun with these commits, unless the file closes or
            # grows past its last block next (a begun stamp then only costs a journal record)
            await of.patcher.patch(ranges, more=not finish and of.size <= room)
        if of.size > room:
            staging = of.staging

            async def tail():
                for start in range(room, of.size, COPY_CHUNK):
                    yield await staging.pread(start, min(COPY_CHUNK, of.size - start))

            patcher, of.patcher = of.patcher, None
            of.patcher = await patcher.extend(tail())
            of.ns_ino = of.patcher.ino
        of.dirty_ranges.clear()
        of.dirty = False
        of.generation += 1
        if finish:
            patcher, of.patcher = of.patcher, None
            await self._close_patcher(of, patcher)

    async def _upload(self, of: OpenFile, *, finish: bool) -> None:
        """Replace the cluster's content of ``of`` with its staging file; the inode, with
        its mode, owner, replication and block size, stays the same. With a lease keeper
        (the file was staged from our stream, or uploaded before and kept open) the keeper
        starts the file over (``rewrite``: one call, the lease never let go); else cut to 0
        and append, both under the lease rules — a file another client is writing is
        refused (EBUSY), never replaced under its writer. A file held for patches whose
        staged content differs only by the ranges written sends those as patches instead
        (``_send_patches``). Unless ``finish``, the new stream is hsynced and kept as the
        lease keeper; one that replaced a file held for patches (a shrink) is closed and the
        file held for patches again (``open_for_patch``), unless it is small enough to be
        kept inline."""
        if self._patches_fit(of):
            await self._send_patches(of, finish=finish)
            return
        path = self._view.path(of.ino)
        was_patched = of.patcher is not None
        keeper, of.keeper = of.keeper, None
        if keeper is not None:
            try:
                stream = await keeper.rewrite()
            except BaseException:
                of.keeper = keeper   # still ours, as it was
                raise
        elif of.patcher is not None:
            # a shrink, or growth past the last block's room: the whole file again, under
            # the lease the patcher holds (``rewrite``: no moment without it)
            stream = await of.patcher.rewrite()
            of.patcher = None
        else:
            await self._cut(path, 0)
            stream = await self._client.append(path)
        of.ns_ino = stream.ino
        try:
            offset = 0
            while offset < of.size:
                chunk = await of.staging.pread(offset, min(COPY_CHUNK, of.size - offset))
                if not chunk:
                    break
                await stream.write(chunk)
                offset += len(chunk)
            if finish:
                await stream.close()
            else:
                await stream.hsync()   # an fsync(2): on the block servers' disks
                if was_patched and of.size > stream.inline_max:
                    # closed and held for patches again below: the next upload sends
                    # only what changed
                    await stream.close()
                else:   # kept open: a file kept inline takes no patches, and its lease
                    of.keeper = stream   # must stay (another writer gets EBUSY)
        except BaseException as exc:
            await self._abandon(stream, path, exc, "upload")
            raise
        of.dirty = False
        of.dirty_ranges.clear()
        of.patchable = True
        of.generation += 1
        if not finish and of.keeper is None:
            await self._hold_for_patches(of, path)

    async def _abandon(self, stream, path: str, exc: BaseException, what: str) -> None:
        """Give up a stream a failed ``what`` leaves behind, and its file: lease recovery
        closes it now (an interrupted call leaves that to the lease's expiry)."""
        stream.abort(exc if isinstance(exc, LeaseFSError)
                     else LeaseFSError(f"{path}: {what} interrupted"))
        if isinstance(exc, LeaseFSError) and still_ours(exc):
            await self._client.give_back(path, what)

    async def _recreate(self, path: str, of: OpenFile):
        """Replace ``path``'s content: a new inode under the same name with the same mode,
        owner, group, replication and block size, known to the kernel by the old inode
        number."""
        stream = await self._client.create(path, overwrite=True, permission=of.permission,
                                           replication=of.replication, owner=of.owner,
                                           group=of.group, block_size=of.block_size,
                                           bytes_per_checksum=self._chunk_for(of.block_size))
        self._view.alias(stream.ino, of.ino)
        of.ns_ino = stream.ino
        # a new inode under the same name: a lease on its folder must name the new one
        self._leases.note_replaced(path, FileStatus.from_wire(stream.created_status))
        return stream

    def _chunk_for(self, block_size: int | None) -> int | None:
        """The chosen checksum chunk, when it fits ``block_size`` (else the cluster's)."""
        bpc = self._file_settings.bytes_per_checksum
        return bpc if bpc and not (block_size or 0) % bpc else None

    def _staged_bytes(self) -> int:
        return sum(f.size for f in self._open_files.files()
                   if f.mode is FileMode.STAGING and f.staging is not None)

    def reserve(self, of: OpenFile, new_size: int) -> None:
        """ENOSPC when growing ``of``'s staging file to ``new_size`` would pass the cache
        limit (the mount's local staging space, not the cluster's)."""
        current = of.size if (of.mode is FileMode.STAGING and of.staging is not None) else 0
        if new_size > current and self._staged_bytes() - current + new_size > self._cache_limit:
            log.warning("staging cache %s full (limit %d bytes): write to inode %d refused",
                        self._cache_dir, self._cache_limit, of.ino)
            raise fuse_error(errno.ENOSPC)

    async def to_staging(self, of: OpenFile, path: str | None) -> None:
        """Move ``of`` to a local staging file holding its whole current content."""
        if of.mode is FileMode.STAGING:
            return
        await self.drop_cache(of)
        self.reserve(of, of.size)
        # a stream none of whose bytes left this mount yet (a small file written and
        # fsynced inline, then rewritten in place), or one whose every byte the mount kept
        # (a journal written, hsynced, then its header rewritten): the staging copy comes
        # from here; the stream keeps the lease, and its close or abandon later decides
        unsent = None
        sent = False   # bytes of the stream are on the block servers already
        if of.mode is FileMode.STREAM:
            unsent = of.stream.unsent_content()
            sent = unsent is None
            if unsent is None:
                unsent = of.shadow_content()
        if of.mode is FileMode.STREAM and unsent is None:
            try:   # the copy below reads what the stream wrote; the stream keeps the lease
                await of.stream.hflush()
            except LeaseFSError as exc:
                of.error = exc
                raise
        staging = await StagingFile.create(self._cache_dir, of.ino, self._io_limiter)
        of.staging = staging
        size = 0
        if unsent is not None:
            await staging.pwrite(0, unsent)
            size = len(unsent)
        elif path is not None:
            async with await self._client.open(path) as src:
                while True:
                    chunk = await src.read(COPY_CHUNK)
                    if not chunk:
                        break
                    await staging.pwrite(size, chunk)
                    size += len(chunk)
        of.size = size
        if of.mode is FileMode.STREAM:
            stream, of.stream = of.stream, None
            if sent and path is not None and not of.unlinked:
                # closed, and held for patches instead: an upload then sends what changed
                # (a journal's rewritten header), not every byte the stream sent again
                try:
                    await self._complete(of.ino, stream, of)
                except LeaseFSError as exc:
                    of.error = exc
                    raise
                finally:
                    of.move(FileEvent.COMPLETE)
                await self._hold_for_patches(of, path)
            else:
                of.keeper = stream
        of.move(FileEvent.STAGE)
        of.dirty = False
        of.dirty_ranges.clear()
        of.patchable = True

    async def _hold_for_patches(self, of: OpenFile, path: str) -> None:
        """Take the lease of ``of``'s closed file for patches; a file kept inline takes
        none (nothing held: its next upload cuts and appends, as for any file not held)."""
        try:
            of.patcher = await self._client.open_for_patch(path)
        except InvalidArgument:
            of.patcher = None
            return
        of.ns_ino = of.patcher.ino

    async def drop_cache(self, of: OpenFile) -> None:
        """Remove the staging copy kept as a cache of ``of``'s content, if any."""
        cache, of.cache = of.cache, None
        if cache is not None:
            await cache.file.remove()

    def check_cache(self, of: OpenFile, status: FileStatus) -> None:
        """An open found ``status``: a kept copy of another version (another client wrote
        the file since) is no longer read (close-to-open, as for the kernel's pages)."""
        kept = of.cache
        if kept is None:
            return
        same = (status.length, status.mtime_ns) == kept.status
        if same and status.locations is not None:
            same = block_versions(status.locations.get("blocks") or []) == kept.version
        if not same:
            of.cache = dataclasses.replace(kept, generation=-1)

    def cached(self, of: OpenFile):
        """The kept copy reads may take (nothing told the mount the file changed since
        it was kept), or None."""
        kept = of.cache
        if kept is not None and kept.generation == of.generation \
                and of.mode is FileMode.CLEAN:
            return kept.file
        return None

    async def _keep_as_cache(self, of: OpenFile, version: tuple, path: str) -> bool:
        """After a patched file's close: keep its staging copy as a cache when the
        cluster's copy is that version (asked with the locations: another client may have
        written it since); ``of.status`` is then that of the version kept."""
        try:
            status = await self._client.get_file_status(path, locations=True)
        except LeaseFSError:
            return False
        blocks = status.locations.get("blocks") if status.locations else None
        if blocks is None or block_versions(blocks) != version or status.length != of.size:
            return False
        of.status = status
        of.move(FileEvent.DISCARD)
        of.cache = KeptCopy(of.staging, version, (status.length, status.mtime_ns),
                            of.generation)
        of.staging = None
        return True

    async def discard_staging(self, of: OpenFile) -> None:
        await self.drop_cache(of)
        if of.staging is not None:
            staging, of.staging = of.staging, None
            await staging.remove()
            if of.mode is FileMode.STAGING:
                of.move(FileEvent.DISCARD)

    async def truncate_open(self, of: OpenFile, path: str, size: int, *,
                            by_handle: bool) -> None:
        """``ftruncate`` on a file this mount is writing goes into that file's pending
        state (published with it); ``truncate(2)`` by path takes effect at once. Lock held."""
        await self.truncate_locked(of, path, size)
        if not (by_handle and of.writers > 0):
            await self.publish(of, finish=of.writers == 0)

    async def detach(self, ino: int, path: str) -> None:
        """The file ``path`` open here as ``ino`` is about to go (unlink, or a rename over
        it): keep it readable and writable until its last release from a local staging
        copy, with no lease (its file goes)."""
        of = self._open_files.get(ino)
        if of is None:
            return
        async with of.lock:
            if self._open_files.is_current(of):
                await self.to_staging(of, path)
                await self.release_keeper(of)
                of.unlinked = True
                of.dirty = False

    async def truncate_closed(self, ino: int, path: str, size: int) -> None:
        """``truncate(2)`` of a file not open here: takes effect in the cluster at once."""
        status = await self._client.get_file_status(path)
        if status.is_dir:
            raise fuse_error(errno.EISDIR)
        if size == status.length and not status.under_construction:
            return
        # a file another client writes reports only what it recorded so far: the server
        # decides (EBUSY under the writer's lease), never a no-op here
        if size <= status.length:
            await self._cut(path, size)
        else:  # growing: zeros appended through the pipeline (under the lease), then closed
            of = OpenFile(ino, status.length, status.mode & 0o7777, status.owner,
                          status.group, status.replication or None, status.block_size or None)
            try:
                await self._grow(of, path, size)   # a CLEAN file known to be shorter
                await self.publish(of, finish=True)
            except BaseException as exc:
                if of.stream is not None:
                    await self._abandon(of.stream, path, exc, "truncate")
                raise

    async def _cut(self, path: str, size: int) -> None:
        """Shorten the closed file ``path`` in the cluster (HDFS truncate): it takes the
        lease, so a file another client writes is refused (EBUSY) and keeps its bytes."""
        if not await self._client.truncate(path, size):
            deadline = trio.current_time() + TRUNCATE_WAIT
            while not await self._client.is_file_closed(path):
                if trio.current_time() > deadline:
                    raise fuse_error(errno.EAGAIN)
                await CLOSED_POLL.sleep(0)

    async def truncate_locked(self, of: OpenFile, path: str, size: int) -> None:
        if of.mode is FileMode.STREAM and size == of.stream.pos:
            return
        if size == 0 and of.mode is FileMode.STREAM:
            # our own lease: replace the content with a new, empty file at once
            stream, of.stream = of.stream, None
            try:
                await stream.close()
            finally:
                of.move(FileEvent.COMPLETE)
            stream = await self._recreate(path, of)
            of.stream, of.size = stream, 0
            of.move(FileEvent.CREATE)
            of.generation += 1
            return
        if of.mode is FileMode.CLEAN and not of.unlinked:
            if size:   # another client may have changed it since it was opened here
                of.size = (await self._client.get_file_status(path)).length
            if size == 0 or size < of.size:
                await self._cut(path, size)
                of.size = size
                of.generation += 1
            elif size > of.size:
                await self._grow(of, path, size)
            return
        if of.mode is FileMode.STREAM and size > of.size:
            await self._grow(of, path, size)
            return
        if of.mode is FileMode.CLEAN and size == of.size:
            return
        await self.to_staging(of, path if not of.unlinked else None)
        self.reserve(of, size)
        await of.staging.truncate(size)
        if size < of.size:
            of.patchable = False   # patches cannot cut a file: the next upload is whole
        else:
            of.dirty_ranges.add(of.size, size)
        of.size = size
        of.dirty = True

    async def _grow(self, of: OpenFile, path: str, size: int) -> None:
        """Extend ``of`` to ``size`` with zeros written through the pipeline under its lease
        (the stream stays open, published with the file): nothing is staged locally, so a
        file may grow past the staging cache. ``EFBIG`` past the largest file size."""
        block_size = of.block_size or self._client.config.block_size
        largest = block_size * self._client.config.max_blocks_per_file
        if size > largest:
            raise FileTooLarge(f"{path}: {size} bytes is more than the largest file size "
                               f"{largest} (max_blocks_per_file x block size {block_size})")
        if of.mode is FileMode.CLEAN:
            await self.start_append(of, path)
        zeros = memoryview(bytes(min(COPY_CHUNK, max(0, size - of.stream.pos))))
        try:
            while of.stream.pos < size:
                chunk = zeros[:size - of.stream.pos]
                await of.stream.write(chunk)
                of.stream_took(chunk)
        except LeaseFSError as exc:
            of.error = exc
            raise
        finally:
            of.size = of.stream.pos


__all__ = ["Writer", "COPY_CHUNK", "still_ours"]
