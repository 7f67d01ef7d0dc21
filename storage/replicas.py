"""The replica store of one block server: block replica files in a data folder and the
in-memory replica map rebuilt from them at start, with every operation on a replica (create
RBW, write, finalize, append reopen, patch a finalized replica under a new stamp, pipeline
and block recovery, read, delete, drop a lost replica, adopt files the directory scan found).

Why it exists: everything the block server knows about its blocks is on disk in a layout that
survives a crash (HDFS's FsDatasetImpl); the map is only a cache of that folder, rebuilt by
``ReplicaStore.open`` (temporaries removed, RBW replicas turned into RWR and cut back to the
length their checksums cover, broken finalized replicas moved aside). The parts live apart:
the state table in ``storage/replica_states.py`` (every mutation here asks it first), the
replica records and their open files in ``storage/replica_records.py``, the folder layout and
meta file format in ``storage/layout.py``, the start-up scan in ``storage/startup_scan.py``.
The names other modules used to import from here stay importable from here.

Concurrency contract: the map and ``Replica`` objects are only touched from the trio thread;
every file operation runs in a worker thread under one ``CapacityLimiter(disk_io_threads)``.
Structural changes of one replica (finalize's renames, delete, opening its files for a read)
hold ``replica.lock``, so a reader never opens a path that is being renamed. An RBW replica has
exactly one writer (the pipeline that created it), which alone calls ``write_packet``/``sync``/
``finalize``; a one-shot block (``create_finalized``) is RBW without a writer only while its
one worker-thread step runs, under its lock. A patch (``patch_finalized``) holds the lock for
its whole worker-thread hop (``storage/patching.py``); readers opened before it are kept
off the files and fail their next read (``ReplicaChanged``). An acknowledged patch leaves a
redo file pending (its in-place writes not fsynced): the patch flusher (``run_patch_flusher``)
flushes it under the lock, and so does every structural change first (append reopen, block
recovery); a delete or drop removes pending redo files after the replica's own files. fsync
happens only for SYNC packets, at finalize (``sync_on_close``) and for patches. A
``ReplicaWriter``'s file descriptors are guarded by its own thread lock: ``close``
(INVALIDATE, delete, release) waits for a write or fsync in flight in another worker thread,
and a write that starts after the close fails (``ReplicaNotFound``) instead of touching a
descriptor number the kernel may have handed to another file meanwhile. ``used_bytes`` is a
running counter (no walk per heartbeat), kept by every operation that adds, grows or removes a
replica in the map. Files of a replica being deleted or dropped stay on disk for a moment after
it left the map: ``_removing`` and the ``_removals`` count keep the directory scan
(``adopt_finalized``) from taking them back.
"""

from __future__ import annotations

import fcntl
import logging
import os

import trio

from fs.datafolder import FILE_MODE, open_data_folder
from fs.errors import (InvalidArgument, LeaseFSError, ReplicaAlreadyExists, ReplicaNotFound,
                       StaleGenerationStamp)

from .layout import (META_HEADER, check_bytes_per_checksum, check_packet_range, data_name,
                     decode_meta_header, encode_meta_header, ensure_layout, finalized_consistent,
                     finalized_subdir, fsync_dir, group_block_files, lost_reason, meta_length,
                     meta_name, quarantine_files, truncate_replica_files, unlink_quietly)
from .patching import (PATCH_FLUSH_PERIOD, PatchBroken, PatchJob, check_ranges,
                       flush_patches, patch_files, reapply_and_flush)
from .replica_records import Replica, ReplicaReader, ReplicaWriter, WriterClosed, reopen_writer
from .replica_states import TRANSITIONS, ReplicaEvent, ReplicaState, next_state
from .startup_scan import ScanResult, scan_data_dir

#: the store, and the names other modules and tests import from here (they live in the
#: modules above)
__all__ = [
    "ReplicaStore",
    "META_HEADER", "check_bytes_per_checksum", "check_packet_range", "decode_meta_header",
    "encode_meta_header", "finalized_subdir", "group_block_files", "meta_length",
    "Replica", "ReplicaReader", "ReplicaWriter", "WriterClosed",
    "TRANSITIONS", "ReplicaEvent", "ReplicaState", "next_state",
    "ScanResult",
]

log = logging.getLogger(__name__)


class ReplicaStore:
    """The replica map of one data folder plus every file operation on it."""

    def __init__(self, data_dir: str, *, disk_io_threads: int = 8, sync_on_close: bool = False):
        self.data_dir = os.path.abspath(data_dir)
        #: fsync at finalize; off (the block server's default, as HDFS), a finalized
        #: replica is durable once the kernel writes it back or an hsync synced it
        self.sync_on_close = sync_on_close
        self.limiter = trio.CapacityLimiter(max(1, disk_io_threads))
        self.node_id: str = ""
        self.replicas: dict[int, Replica] = {}
        self.last_scan: ScanResult | None = None
        self._lock_fd: int | None = None
        self._used_bytes = 0   # disk_bytes() summed over the replicas in the map
        # ids whose files are being deleted or quarantined right now, and a count of every
        # removal from the map: the directory scan must not adopt files on their way out
        self._removing: set[int] = set()
        self._removals = 0
        #: replicas with pending redo files (acknowledged patches not flushed yet)
        self._pending: set[Replica] = set()
        #: told the ids of replicas dropped because a patch or its flush failed (the block
        #: server reports them deleted); None: nobody to tell (tests)
        self.on_dropped = None

    # -- lifecycle
    async def run_io(self, fn, *args):
        """Run blocking file work in a worker thread under the disk limiter."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def open(self) -> ScanResult:
        """Create the layout, lock the folder, scan it into the map."""
        self._lock_fd = await self.run_io(self._take_folder_lock)
        try:
            self.node_id = await self.run_io(ensure_layout, self.data_dir)
            result = await self.run_io(scan_data_dir, self.data_dir)
        except BaseException:
            self.close()
            raise
        self.replicas = {}
        self._used_bytes = 0
        for r in result.replicas:
            state = next_state(r.state, ReplicaEvent.RESTART)   # rbw/ files come back RWR
            self._track(Replica(
                r.block_id, r.gs, state, r.bytes_per_checksum, r.data_path, r.meta_path,
                num_bytes=r.num_bytes, visible_length=r.num_bytes))
        self.last_scan = result
        log.info("data folder %s: node %s, %d replicas (%d finalized, %d RWR), %d temporaries "
                 "removed, %d RBW trimmed, %d quarantined", self.data_dir, self.node_id,
                 len(self.replicas),
                 sum(r.state is ReplicaState.FINALIZED for r in self.replicas.values()),
                 sum(r.state is ReplicaState.RWR for r in self.replicas.values()),
                 result.temporaries_removed, len(result.rbw_trimmed), len(result.quarantined))
        return result

    def _take_folder_lock(self) -> int:
        open_data_folder(self.data_dir, "block server data folder")
        fd = os.open(os.path.join(self.data_dir, "in_use.lock"), os.O_RDWR | os.O_CREAT,
                     FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InvalidArgument(f"data folder {self.data_dir} is in use by another block "
                                  f"server") from None
        return fd

    def close(self) -> None:
        """Close writers' files and release the folder lock (the files stay as they are)."""
        for replica in self.replicas.values():
            if replica.writer is not None:
                replica.writer.close()
                replica.writer = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- queries
    def get(self, block_id: int) -> Replica | None:
        return self.replicas.get(block_id)

    def block_report(self) -> list[list]:
        """Every reportable replica as ``[id, gs, num_bytes, state]`` (in one go: for small
        maps and tests; the heartbeat service builds big reports piecewise)."""
        return self.report_entries(self.report_snapshot())

    def report_snapshot(self) -> list[Replica]:
        """The replicas in the map now: one C-level copy of the references, cheap even for
        millions, so a full report can then be built in pieces with checkpoints between."""
        return list(self.replicas.values())

    def report_entries(self, replicas) -> list[list]:
        """Report entries of those ``replicas`` (from ``report_snapshot``) that are still in
        the map and reportable, in their state of now: a change after the snapshot is also
        queued as an incremental report, which goes out after the full report."""
        current = self.replicas
        return [r.report_entry() for r in replicas
                if current.get(r.block_id) is r
                and r.state in (ReplicaState.FINALIZED, ReplicaState.RBW, ReplicaState.RWR,
                                ReplicaState.RUR)]

    def used_bytes(self) -> int:
        """Bytes of data and meta files of the replicas in the map (a running counter)."""
        return self._used_bytes

    # -- map bookkeeping (every change of the map or of a mapped replica's size goes here)
    def _track(self, replica: Replica) -> None:
        self.replicas[replica.block_id] = replica
        self._used_bytes += replica.disk_bytes()

    def _untrack(self, replica: Replica) -> None:
        if self.replicas.get(replica.block_id) is replica:
            del self.replicas[replica.block_id]
            self._used_bytes -= replica.disk_bytes()
            self._removals += 1

    def _set_num_bytes(self, replica: Replica, num_bytes: int) -> None:
        before = replica.disk_bytes()
        replica.num_bytes = num_bytes
        if self.replicas.get(replica.block_id) is replica:
            self._used_bytes += replica.disk_bytes() - before

    async def disk_space(self) -> tuple[int, int]:
        """``(capacity, remaining)`` of the file system holding the folder."""
        st = await self.run_io(os.statvfs, self.data_dir)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def readable(self, block_id: int, gs: int) -> Replica:
        """The replica a reader of ``(block_id, gs)`` may use, or the reason it may not."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.state not in (ReplicaState.FINALIZED, ReplicaState.RBW,
                                                    ReplicaState.RWR):
            raise ReplicaNotFound(f"block server has no readable replica of blk_{block_id}")
        if replica.gs < gs:
            raise StaleGenerationStamp(f"replica blk_{block_id} has generation stamp "
                                       f"{replica.gs}, older than the requested {gs}")
        return replica

    def finalized_files(self, block_id: int, gs: int) -> tuple[str, str, int]:
        """The data and meta file of a finalized replica a reader of ``(block_id, gs)`` may
        open itself (HDFS's short-circuit read), and the replica's stamp; a replica in any
        other state is refused, as its last chunk and checksum may still change."""
        replica = self.readable(block_id, gs)
        if replica.state is not ReplicaState.FINALIZED:
            raise ReplicaNotFound(f"the replica of blk_{block_id} here is "
                                  f"{replica.state.value}, not finalized: read it over data "
                                  f"transfer")
        # refused while a patch runs (its files are being replaced); once named, a patch
        # makes its new version in copies (``storage/patching.py``), so the reader that
        # opens these files keeps one version
        if replica.patching:
            raise ReplicaNotFound(f"the replica of blk_{block_id} here is being patched to a "
                                  f"new version: read it over data transfer")
        replica.named = True
        return replica.data_path, replica.meta_path, replica.gs

    # -- writing
    async def _replace_older(self, block_id: int, gs: int) -> None:
        """Make room for a new replica of ``block_id`` at ``gs``: an existing replica with an
        equal or newer GS is refused; an older one is deleted."""
        existing = self.replicas.get(block_id)
        if existing is None:
            return
        if existing.gs >= gs:
            raise ReplicaAlreadyExists(
                f"replica blk_{block_id} already exists with generation stamp {existing.gs} "
                f"({existing.state.value}), not older than {gs}")
        log.info("replacing %s replica %s by a new generation stamp %d",
                 existing.state.value, existing.name, gs)
        await self.delete(existing)
        if self.replicas.get(block_id) is not None:   # raced with another writer
            raise ReplicaAlreadyExists(f"replica blk_{block_id} is being created already")

    async def create_rbw(self, block_id: int, gs: int, bytes_per_checksum: int) -> Replica:
        """A new RBW replica with its files open for writing. An existing replica with an
        equal or newer GS is refused; an older one is replaced."""
        check_bytes_per_checksum(bytes_per_checksum)
        await self._replace_older(block_id, gs)
        state = next_state(None, ReplicaEvent.CREATE_RBW)
        rbw = os.path.join(self.data_dir, "rbw")
        replica = Replica(block_id, gs, state, bytes_per_checksum,
                          os.path.join(rbw, data_name(block_id)),
                          os.path.join(rbw, meta_name(block_id, gs)))
        self._track(replica)   # claim the id before the first await
        try:
            async with replica.lock:
                replica.writer = await self.run_io(
                    ReplicaWriter, replica.data_path, replica.meta_path, bytes_per_checksum, True)
        except BaseException:
            self._untrack(replica)
            raise
        if replica.removed:   # deleted while its files were being created
            writer, replica.writer = replica.writer, None
            await self.run_io(writer.close)
            raise ReplicaNotFound(f"replica {replica.name} was deleted while being created")
        return replica

    def _require_writable(self, replica: Replica) -> ReplicaWriter:
        if replica.removed or replica.writer is None or replica.state is not ReplicaState.RBW:
            raise ReplicaNotFound(f"replica {replica.name} is no longer being written "
                                  f"({'deleted' if replica.removed else replica.state.value})")
        return replica.writer

    async def _writer_io(self, replica: Replica, fn, *args) -> None:
        """Run a writer operation; a close that won the race reads as ReplicaNotFound."""
        try:
            await self.run_io(fn, *args)
        except WriterClosed:
            raise ReplicaNotFound(f"replica {replica.name} was closed or deleted while being "
                                  f"written") from None

    async def write_packet(self, replica: Replica, offset: int, data, sums: bytes) -> None:
        """Write one verified packet at ``offset`` (see ``check_packet_range``)."""
        await self.write_packets(replica, [(offset, data, sums)])

    async def write_packets(self, replica: Replica, packets) -> None:
        """Write consecutive verified packets (``offset, data, sums`` each, in order) in one
        trip to a worker thread: small packets (Hadoop's client sends 64 KiB) would
        otherwise cost a thread hop each."""
        writer = self._require_writable(replica)
        end = replica.num_bytes
        for offset, data, _ in packets:
            check_packet_range(end, offset, len(data), replica.bytes_per_checksum)
            end = max(end, offset + len(data))
        if end == replica.num_bytes and not any(len(data) for _, data, _ in packets):
            return

        await self._writer_io(replica, writer.write_run, packets)
        self._set_num_bytes(replica, end)

    async def sync(self, replica: Replica) -> None:
        writer = self._require_writable(replica)
        await self._writer_io(replica, writer.fsync)

    async def finalize(self, replica: Replica) -> None:
        """Close data + meta, move both into finalized/<bucket>/; with ``sync_on_close``
        fsync both files first and both folders after."""
        writer = self._require_writable(replica)
        new_state = next_state(replica.state, ReplicaEvent.FINALIZE)
        bucket = os.path.join(self.data_dir, "finalized", finalized_subdir(replica.block_id))
        new_data = os.path.join(bucket, data_name(replica.block_id))
        new_meta = os.path.join(bucket, meta_name(replica.block_id, replica.gs))

        sync = self.sync_on_close

        def move() -> None:
            writer.close_for_finalize(sync)
            os.makedirs(bucket, exist_ok=True)
            os.replace(replica.meta_path, new_meta)   # meta first: the scan completes a
            os.replace(replica.data_path, new_data)   # finalize cut between the two renames
            if sync:
                fsync_dir(bucket)
                fsync_dir(os.path.dirname(replica.data_path))

        async with replica.lock:
            if replica.removed:
                raise ReplicaNotFound(f"replica {replica.name} was deleted before it was "
                                      f"finalized")
            if replica.state is not ReplicaState.RBW:   # block recovery took it meanwhile
                raise ReplicaNotFound(f"replica {replica.name} is {replica.state.value}, no "
                                      f"longer being written")
            replica.writer = None
            try:
                await self.run_io(move)
            except WriterClosed:
                raise ReplicaNotFound(f"replica {replica.name} was closed before it was "
                                      f"finalized") from None
            replica.data_path, replica.meta_path = new_data, new_meta
            replica.state = new_state
            replica.visible_length = replica.num_bytes
            replica.visible_last_sum = None

    async def create_finalized(self, block_id: int, gs: int, bytes_per_checksum: int, data,
                               sums: bytes) -> Replica:
        """A whole small block in one worker-thread hop (the one-shot write): create the RBW
        files, write ``data`` and its verified ``sums`` from offset 0, finalize (as
        ``finalize``: files moved into finalized/, fsynced only with ``sync_on_close``). The
        replica is in the map as RBW (no writer) while the files are made, so the id is
        claimed and a delete or recovery meanwhile waits on ``replica.lock``; it leaves as
        FINALIZED, through the same two transitions as a pipeline's replica."""
        check_bytes_per_checksum(bytes_per_checksum)
        check_packet_range(0, 0, len(data), bytes_per_checksum)
        rbw_state = next_state(None, ReplicaEvent.CREATE_RBW)
        final_state = next_state(rbw_state, ReplicaEvent.FINALIZE)
        await self._replace_older(block_id, gs)
        rbw = os.path.join(self.data_dir, "rbw")
        replica = Replica(block_id, gs, rbw_state, bytes_per_checksum,
                          os.path.join(rbw, data_name(block_id)),
                          os.path.join(rbw, meta_name(block_id, gs)))
        bucket = os.path.join(self.data_dir, "finalized", finalized_subdir(block_id))
        new_data = os.path.join(bucket, data_name(block_id))
        new_meta = os.path.join(bucket, meta_name(block_id, gs))
        sync = self.sync_on_close

        def write_and_move() -> None:
            writer = ReplicaWriter(replica.data_path, replica.meta_path, bytes_per_checksum,
                                   True)
            try:
                writer.write(0, data, sums)
                writer.close_for_finalize(sync)
            except BaseException:
                writer.close()
                for path in (replica.data_path, replica.meta_path):
                    unlink_quietly(path)
                raise
            os.makedirs(bucket, exist_ok=True)
            os.replace(replica.meta_path, new_meta)   # meta first, as finalize does
            os.replace(replica.data_path, new_data)
            if sync:
                fsync_dir(bucket)
                fsync_dir(rbw)

        self._track(replica)   # claim the id before the first await
        async with replica.lock:
            try:
                await self.run_io(write_and_move)
            except BaseException:
                self._untrack(replica)
                raise
            # a delete waiting on the lock removes the files where they are now
            replica.data_path, replica.meta_path = new_data, new_meta
            if replica.removed or replica.state is not ReplicaState.RBW:
                raise ReplicaNotFound(f"replica {replica.name} was deleted or recovered while "
                                      f"being written")
            replica.state = final_state
            self._set_num_bytes(replica, len(data))
            replica.visible_length = len(data)
        return replica

    async def release_writer(self, replica: Replica) -> None:
        """A pipeline ended without finalizing: close the files, keep the RBW replica."""
        writer, replica.writer = replica.writer, None
        if writer is not None:
            await self.run_io(writer.close)

    # -- append (WRITE_BLOCK PIPELINE_SETUP_APPEND)
    async def reopen_for_append(self, block_id: int, new_gs: int, min_bytes: int,
                                bytes_per_checksum: int | None = None) -> Replica:
        """Reopen a FINALIZED replica (or an RBW one nobody writes) of at least ``min_bytes``
        bytes as RBW under the newer stamp ``new_gs``: cut to ``min_bytes`` (the file's
        length, or what the writer's pipeline acknowledged: bytes past it were written by a
        pipeline whose acks never reached the writer, e.g. a failed append or a LAST packet
        whose ack was lost, and were never part of the file), files moved to rbw/ (data
        first, then the meta file renamed to the new stamp, so a crash between the two is
        undone by the start-up scan), writer opened on the existing files. HDFS
        FsDatasetImpl.append. A shorter replica cannot serve and is refused."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed:
            raise ReplicaNotFound(f"append: block server has no replica of blk_{block_id}")
        if replica.gs >= new_gs:
            raise StaleGenerationStamp(f"append: replica {replica.name} already has generation "
                                       f"stamp {replica.gs}, not older than the new {new_gs}")
        if replica.state is ReplicaState.FINALIZED:
            event = ReplicaEvent.APPEND
        elif replica.state is ReplicaState.RBW and replica.writer is None:
            event = ReplicaEvent.RECOVER_RBW
        else:
            raise InvalidArgument(f"append: replica {replica.name} is {replica.state.value}"
                                  f"{' and being written' if replica.writer else ''}; only a "
                                  f"FINALIZED replica (or an idle RBW one) can be reopened")
        new_state = next_state(replica.state, event)
        if replica.num_bytes < min_bytes or min_bytes < 0:
            raise InvalidArgument(f"append: replica {replica.name} holds {replica.num_bytes} "
                                  f"bytes, fewer than the {min_bytes} the writer expects")
        bpc = replica.bytes_per_checksum
        if bytes_per_checksum is not None and bytes_per_checksum != bpc:
            raise InvalidArgument(f"append: replica {replica.name} uses bytes_per_checksum "
                                  f"{bpc}, the writer asked for {bytes_per_checksum}")
        rbw = os.path.join(self.data_dir, "rbw")
        new_data = os.path.join(rbw, data_name(block_id))
        new_meta = os.path.join(rbw, meta_name(block_id, new_gs))
        old_data, old_meta = replica.data_path, replica.meta_path
        held = replica.num_bytes

        def reopen() -> tuple[ReplicaWriter, bytes | None]:
            if held != min_bytes:
                truncate_replica_files(old_data, old_meta, min_bytes, bpc)
            if old_data != new_data:
                os.replace(old_data, new_data)
            os.replace(old_meta, new_meta)
            fsync_dir(rbw)
            if old_data != new_data:
                fsync_dir(os.path.dirname(old_data))
            return reopen_writer(new_data, new_meta, bpc, min_bytes)

        async with replica.lock:
            if replica.removed or self.replicas.get(block_id) is not replica \
                    or replica.num_bytes != held or replica.gs >= new_gs \
                    or replica.writer is not None:
                raise ReplicaNotFound(f"append: replica {replica.name} changed while being "
                                      f"reopened")
            # patches durable in place before the files move and their redo files go
            await self._flush_locked(replica)
            writer, last_sum = await self.run_io(reopen)
            replica.data_path, replica.meta_path = new_data, new_meta
            replica.gs = new_gs
            replica.state = new_state
            replica.writer = writer
            self._set_num_bytes(replica, min_bytes)
            replica.visible_length = 0
            replica.set_visible(min_bytes, last_sum)
        if held != min_bytes:
            log.warning("reopened blk_%d: cut from %d to the %d bytes the writer expects "
                        "(the rest was never acknowledged)", block_id, held, min_bytes)
        log.info("reopened blk_%d for append: %d bytes, generation stamp %d", block_id,
                 min_bytes, new_gs)
        return replica

    # -- pipeline recovery (WRITE_BLOCK PIPELINE_SETUP_STREAMING_RECOVERY, TRANSFER_RBW)
    async def stop_writer(self, replica: Replica) -> None:
        """Stop the WRITE_BLOCK pipeline still feeding ``replica`` (an old pipeline the
        client gave up on) and close its files; its last write is counted in num_bytes
        (HDFS ReplicaInPipeline.stopWriter)."""
        scope, stopped = replica.writer_scope, replica.writer_stopped
        if scope is not None and stopped is not None:
            scope.cancel()
            await stopped.wait()
        writer, replica.writer = replica.writer, None
        if writer is not None:
            await self.run_io(writer.close)

    async def recover_rbw(self, block_id: int, new_gs: int, acked_length: int,
                          bytes_per_checksum: int | None = None) -> Replica:
        """Reopen an RBW replica for a recovered pipeline (HDFS FsDatasetImpl.recoverRbw):
        stop its old writer, cut it to ``acked_length`` (what every node acknowledged; the
        last partial chunk's checksum recomputed, so the checksums cover exactly the data),
        rename its meta file to ``new_gs`` and open it for writing. A replica holding fewer
        bytes than ``acked_length`` cannot serve and is refused. A FINALIZED replica (its
        LAST packet's ack was lost) is reopened as by append, cut to ``acked_length`` too."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed:
            raise ReplicaNotFound(f"pipeline recovery: block server has no replica of "
                                  f"blk_{block_id}")
        if replica.gs >= new_gs:
            raise StaleGenerationStamp(f"pipeline recovery: replica {replica.name} already has "
                                       f"generation stamp {replica.gs}, not older than {new_gs}")
        if replica.state is ReplicaState.FINALIZED:
            return await self.reopen_for_append(block_id, new_gs, acked_length,
                                                bytes_per_checksum)
        new_state = next_state(replica.state, ReplicaEvent.RECOVER_RBW)
        bpc = replica.bytes_per_checksum
        if bytes_per_checksum is not None and bytes_per_checksum != bpc:
            raise InvalidArgument(f"pipeline recovery: replica {replica.name} uses "
                                  f"bytes_per_checksum {bpc}, the writer asked for "
                                  f"{bytes_per_checksum}")
        await self.stop_writer(replica)
        if replica.num_bytes < acked_length or acked_length < 0:
            raise InvalidArgument(f"pipeline recovery: replica {replica.name} holds "
                                  f"{replica.num_bytes} bytes, fewer than the {acked_length} "
                                  f"acknowledged")
        rbw = os.path.join(self.data_dir, "rbw")
        old_meta = replica.meta_path
        new_meta = os.path.join(rbw, meta_name(block_id, new_gs))
        data_path = replica.data_path
        cut = replica.num_bytes != acked_length

        def reopen() -> tuple[ReplicaWriter, bytes | None]:
            if cut:
                truncate_replica_files(data_path, old_meta, acked_length, bpc)
            os.replace(old_meta, new_meta)
            fsync_dir(rbw)
            return reopen_writer(data_path, new_meta, bpc, acked_length)

        async with replica.lock:
            if replica.removed or self.replicas.get(block_id) is not replica \
                    or replica.gs >= new_gs or replica.writer is not None \
                    or replica.state is not ReplicaState.RBW:
                raise ReplicaNotFound(f"pipeline recovery: replica {replica.name} changed "
                                      f"while being recovered")
            writer, last_sum = await self.run_io(reopen)
            replica.meta_path = new_meta
            replica.gs = new_gs
            replica.state = new_state
            replica.writer = writer
            self._set_num_bytes(replica, acked_length)
            replica.visible_length = 0
            replica.set_visible(acked_length, last_sum)
        log.info("recovered rbw blk_%d for a new pipeline: %d bytes, generation stamp %d",
                 block_id, acked_length, new_gs)
        return replica

    # -- block recovery (HDFS initReplicaRecovery / updateReplicaUnderRecovery)
    async def init_replica_recovery(self, block_id: int, gs: int, recovery_id: int) -> Replica:
        """Move the replica to RUR for ``recovery_id``: stop a running writer (its pipeline
        is cancelled and its files closed once a write in flight is done), remember the
        original state. Refuses a stale ``recovery_id`` (not above one seen already), a
        replica older than ``gs`` or not older than ``recovery_id``."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed or replica.state is ReplicaState.TEMPORARY:
            raise ReplicaNotFound(f"block recovery: block server has no replica of "
                                  f"blk_{block_id}")
        if recovery_id <= replica.recovery_id:
            raise StaleGenerationStamp(f"block recovery of {replica.name}: recovery id "
                                       f"{recovery_id} is stale, {replica.recovery_id} was "
                                       f"seen already")
        if replica.gs < gs:
            raise StaleGenerationStamp(f"block recovery: replica {replica.name} is older than "
                                       f"the block's generation stamp {gs}")
        if replica.gs >= recovery_id:
            raise StaleGenerationStamp(f"block recovery: replica {replica.name} is not older "
                                       f"than recovery id {recovery_id}")
        new_state = next_state(replica.state, ReplicaEvent.INIT_RECOVERY)
        replica.recovery_id = recovery_id          # claimed before the first await
        async with replica.lock:                   # never in the middle of a finalize
            if replica.removed:
                raise ReplicaNotFound(f"block recovery: replica {replica.name} was deleted")
            # patches durable in place before recovery cuts and renames the files
            await self._flush_locked(replica)
            if replica.state is not ReplicaState.RUR:
                replica.original_state = replica.state
            replica.state = new_state              # a writer's next write/finalize fails
        scope, stopped = replica.writer_scope, replica.writer_stopped
        if scope is not None and stopped is not None:
            scope.cancel()
            await stopped.wait()                   # its last write is counted in num_bytes
        writer, replica.writer = replica.writer, None
        if writer is not None:
            await self.run_io(writer.close)
            log.info("block recovery %d stopped the writer of %s at %d bytes", recovery_id,
                     replica.name, replica.num_bytes)
        if replica.removed:
            raise ReplicaNotFound(f"block recovery: replica {replica.name} was deleted")
        return replica

    async def update_replica_under_recovery(self, block_id: int, recovery_id: int,
                                            new_length: int) -> Replica:
        """Finish recovery of an RUR replica: cut it to ``new_length`` (recomputing the last
        partial chunk's checksum), stamp it ``recovery_id`` (meta file renamed) and finalize
        it into finalized/."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed:
            raise ReplicaNotFound(f"block recovery: block server has no replica of "
                                  f"blk_{block_id}")
        if replica.state is not ReplicaState.RUR or replica.recovery_id != recovery_id:
            raise StaleGenerationStamp(
                f"block recovery: replica {replica.name} is {replica.state.value} with recovery "
                f"id {replica.recovery_id}, not under recovery {recovery_id}")
        if not 0 <= new_length <= replica.num_bytes:
            raise InvalidArgument(f"block recovery: replica {replica.name} holds "
                                  f"{replica.num_bytes} bytes, cannot set length {new_length}")
        new_state = next_state(replica.state, ReplicaEvent.UPDATE_UNDER_RECOVERY)
        bpc = replica.bytes_per_checksum
        bucket = os.path.join(self.data_dir, "finalized", finalized_subdir(block_id))
        new_data = os.path.join(bucket, data_name(block_id))
        new_meta = os.path.join(bucket, meta_name(block_id, recovery_id))
        old_data, old_meta = replica.data_path, replica.meta_path

        def cut_and_finalize() -> None:
            truncate_replica_files(old_data, old_meta, new_length, bpc)
            os.makedirs(bucket, exist_ok=True)
            os.replace(old_meta, new_meta)     # meta first, as finalize does
            if old_data != new_data:
                os.replace(old_data, new_data)
            fsync_dir(bucket)
            if os.path.dirname(old_data) != bucket:
                fsync_dir(os.path.dirname(old_data))

        async with replica.lock:
            if replica.removed or replica.state is not ReplicaState.RUR \
                    or replica.recovery_id != recovery_id:
                raise StaleGenerationStamp(f"block recovery: replica {replica.name} left "
                                           f"recovery {recovery_id} meanwhile")
            await self.run_io(cut_and_finalize)
            replica.data_path, replica.meta_path = new_data, new_meta
            replica.gs = recovery_id
            replica.state = new_state
            replica.original_state = None
            self._set_num_bytes(replica, new_length)
            replica.visible_length = new_length
            replica.visible_last_sum = None
        log.info("block recovery %d finalized blk_%d at %d bytes", recovery_id, block_id,
                 new_length)
        return replica

    # -- patch (PATCH_BLOCK: byte ranges written into a finalized replica, new stamp)
    async def patch_finalized(self, block_id: int, gs: int, new_gs: int,
                              ranges: list[tuple[int, bytes]], max_length: int) -> Replica:
        """Write ``ranges`` (``(offset, data)``: sorted, not overlapping, none empty, none
        starting past the replica's length, none ending past ``max_length``, the block size)
        into the FINALIZED replica ``blk_<id>_<gs>`` and make it ``blk_<id>_<new_gs>``,
        crash-atomically and durably on return (``storage/patching.py``: redo file fsynced,
        in-place apply (in copies swapped in for a replica named to a short-circuit reader)
        and meta renamed to the new stamp without fsync, the redo file left
        pending for the patch flusher). A replica already FINALIZED at ``new_gs`` is returned
        unchanged (the retry of a patch whose answer was lost: only one writer ever gets a given new
        stamp). ``ReplicaNotFound`` without a finalized replica, ``StaleGenerationStamp``
        when it has neither stamp, ``InvalidArgument`` for bad ranges, ``ChecksumError``
        when a chunk it would keep part of is corrupt: in all these nothing changed. An
        ``OSError`` before the files were touched leaves the old version; one while
        rewriting them that a roll forward cannot repair drops the replica (its files go to
        ``corrupt/``; ``on_dropped`` told) and is raised."""
        if new_gs <= gs:
            raise InvalidArgument(f"patch of blk_{block_id}: new generation stamp {new_gs} is "
                                  f"not above {gs}")
        replica = self._patchable(block_id, gs, new_gs)
        if replica.gs == new_gs:
            return replica
        next_state(replica.state, ReplicaEvent.PATCH)
        async with replica.lock:
            # the lock is the patch's for its whole hop: a delete, recovery, append reopen,
            # directory scan drop or a reader's open waits for it, and it for them
            if self._patchable(block_id, gs, new_gs) is not replica:
                raise ReplicaNotFound(f"patch: replica blk_{block_id} was replaced meanwhile")
            if replica.gs == new_gs:
                return replica
            new_state = next_state(replica.state, ReplicaEvent.PATCH)
            new_length = check_ranges(replica.name, ranges, replica.num_bytes, max_length)
            job = PatchJob(block_id, gs, new_gs, replica.bytes_per_checksum, replica.data_path,
                           replica.meta_path, replica.num_bytes, new_length, ranges,
                           copy=replica.named)
            replica.gate()
            replica.patching = True
            try:
                await self.run_io(patch_files, job, replica)
            except PatchBroken as exc:
                await self._drop_broken(replica, job, exc)
                raise exc.cause if isinstance(exc.cause, OSError) \
                    else OSError(str(exc)) from exc
            finally:
                replica.patching = False
            replica.gs = new_gs
            replica.meta_path = job.new_meta
            replica.state = new_state
            self._set_num_bytes(replica, new_length)
            replica.visible_length = new_length
            replica.visible_last_sum = None
            replica.pending_redos.append(job.redo_path)
            self._pending.add(replica)
        log.debug("patched blk_%d: %d ranges, %d bytes, generation stamp %d -> %d", block_id,
                  len(ranges), new_length, gs, new_gs)
        return replica

    def _patchable(self, block_id: int, gs: int, new_gs: int) -> Replica:
        """The replica a patch of ``blk_<id>_<gs>`` to ``new_gs`` works on (or found done)."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed:
            raise ReplicaNotFound(f"patch: block server has no replica of blk_{block_id}")
        if replica.gs not in (gs, new_gs):
            raise StaleGenerationStamp(f"patch: replica {replica.name} has generation stamp "
                                       f"{replica.gs}, neither the patched {gs} nor the new "
                                       f"{new_gs}")
        if replica.state is not ReplicaState.FINALIZED:
            raise ReplicaNotFound(f"patch: replica {replica.name} is {replica.state.value}, "
                                  f"not finalized")
        return replica

    async def _drop_broken(self, replica: Replica, job: PatchJob, exc: PatchBroken) -> None:
        """A patch left the files of ``replica`` in an unknown state: out of the map, files
        to ``corrupt/`` (never serve bytes that may not match their checksums)."""
        await self._quarantine(replica, [job.data_path, job.meta_path, job.new_meta,
                                         *self._take_pending(replica), job.redo_path], exc)

    async def _quarantine(self, replica: Replica, files: list[str], exc: Exception) -> None:
        """``replica`` out of the map (through the state table), its ``files`` to
        ``corrupt/``, logged with the cause ``exc``, ``on_dropped`` told."""
        log.error("%s", exc)
        next_state(replica.state, ReplicaEvent.MISSING)
        self._untrack(replica)
        replica.removed = True
        self._removing.add(replica.block_id)
        try:
            await self.run_io(quarantine_files, self.data_dir, files, str(exc))
        finally:
            self._removing.discard(replica.block_id)
        if self.on_dropped is not None:
            self.on_dropped([replica.block_id])

    # -- the deferred half of patches (storage/patching.py)
    def _take_pending(self, replica: Replica) -> list[str]:
        """The replica's pending redo files, now no longer pending (its files are going)."""
        redos, replica.pending_redos = replica.pending_redos, []
        self._pending.discard(replica)
        return redos

    def pending_patches(self) -> int:
        """Redo files of acknowledged patches not flushed yet."""
        return sum(len(r.pending_redos) for r in self._pending)

    async def _flush_locked(self, replica: Replica) -> None:
        """Make the replica's pending patches durable in place and unlink their redo files
        (``flush_patches``); the caller holds ``replica.lock``. A flush that fails is done
        once more from the redo files; if that fails too the replica is dropped (files and
        redo files to ``corrupt/``, ``on_dropped`` told) and ``ReplicaNotFound`` raised."""
        if not replica.pending_redos or replica.removed:
            return
        redos = list(replica.pending_redos)
        try:
            try:
                await self.run_io(flush_patches, replica.data_path, replica.meta_path, redos)
            except OSError as first:
                log.error("flushing the patches of %s failed (%s); applying them again",
                          replica.name, first)
                try:
                    await self.run_io(reapply_and_flush, replica.data_path, replica.meta_path,
                                      redos)
                except (OSError, ValueError) as again:
                    raise PatchBroken(f"patches of {replica.name} could not be made durable: "
                                      f"{first}; then {again}", first) from again
        except PatchBroken as exc:
            await self._quarantine(replica, [replica.data_path, replica.meta_path,
                                             *self._take_pending(replica)], exc)
            raise ReplicaNotFound(f"replica {replica.name} was dropped: {exc}") from exc
        del replica.pending_redos[:len(redos)]   # none added meanwhile: the lock is ours
        if not replica.pending_redos:
            self._pending.discard(replica)

    async def flush_pending(self) -> int:
        """One pass of the patch flusher: every replica with pending redo files flushed,
        one at a time under its lock. Returns how many replicas it flushed."""
        flushed = 0
        for replica in list(self._pending):
            async with replica.lock:
                if replica.removed or not replica.pending_redos:
                    self._pending.discard(replica)
                    continue
                try:
                    await self._flush_locked(replica)
                except ReplicaNotFound:
                    continue   # dropped and reported
                flushed += 1
        return flushed

    async def run_patch_flusher(self, period: float = PATCH_FLUSH_PERIOD) -> None:
        """Flush acknowledged patches every ``period`` seconds, forever (the block server's
        nursery runs it)."""
        while True:
            await trio.sleep(period)
            await self.flush_pending()

    # -- reading
    async def open_reader(self, block_id: int, gs: int) -> ReplicaReader:
        replica = self.readable(block_id, gs)
        async with replica.lock:
            if replica.removed:
                raise ReplicaNotFound(f"replica {replica.name} was deleted")
            reader = ReplicaReader(replica)
            return await self.run_io(reader.open_files)

    async def read_or_open(self, block_id: int, gs: int, span):
        """One worker-thread hop for a read: ``span(reader)`` sees the replica's snapshot and
        answers ``(start, length)`` to read now (the files are opened, read and closed at
        once: ``(reader, data, sums)``) or None to stream (``(reader, None, None)`` with the
        files open; ``close_reader`` it)."""
        replica = self.readable(block_id, gs)
        async with replica.lock:
            if replica.removed:
                raise ReplicaNotFound(f"replica {replica.name} was deleted")
            reader = ReplicaReader(replica)
            whole = span(reader)
            if whole is None:
                return await self.run_io(reader.open_files), None, None
            data, sums = await self.run_io(reader.read_closed, *whole)
            return reader, data, sums

    async def close_reader(self, reader: ReplicaReader) -> None:
        await self.run_io(reader.close)

    # -- deleting
    async def delete(self, replica: Replica) -> None:
        """Remove a replica from the map and its files from disk. A write in flight on it
        finishes first (the writer's close waits for it); its writer fails every later
        operation with ``ReplicaNotFound``. Deleting a replica twice is a no-op (the second
        call must not unlink files a newer replica of the block may own by now)."""
        next_state(replica.state, ReplicaEvent.INVALIDATE)
        if replica.removed:
            return
        self._untrack(replica)
        replica.removed = True
        writer, replica.writer = replica.writer, None

        def remove(redos: list[str]) -> None:
            if writer is not None:
                writer.close()
            # redo files last: a crash that keeps the replica's files keeps them too
            for path in (replica.data_path, replica.meta_path, *redos):
                unlink_quietly(path)

        self._removing.add(replica.block_id)
        try:
            async with replica.lock:
                await self.run_io(remove, self._take_pending(replica))
        finally:
            self._removing.discard(replica.block_id)

    async def invalidate(self, block_id: int, gs: int) -> bool:
        """INVALIDATE command: delete the replica unless it is newer than ``gs``. Returns
        True when the node no longer holds the block (deleted now, or never had it)."""
        replica = self.replicas.get(block_id)
        if replica is None:
            return True
        if replica.gs > gs:
            log.info("INVALIDATE blk_%d_%d ignored: replica has the newer generation stamp %d",
                     block_id, gs, replica.gs)
            return False
        try:
            await self.delete(replica)
        except (OSError, LeaseFSError) as exc:
            log.warning("could not delete %s: %s", replica.name, exc)
            return False
        return True

    # -- replicas whose files went missing (reads, the block scanner, the directory scan)
    async def drop_if_lost(self, block_id: int, gs: int) -> str | None:
        """HDFS ``invalidateMissingBlock``: if the files of the FINALIZED or RWR replica
        ``blk_<id>_<gs>`` are gone, cut or grown behind the map's back, drop it from the map,
        move what is left of it to ``corrupt/`` and return why. None (nothing changed) when
        the files are fine, or the replica is another one by now or is being written.
        Checked under the replica's lock, so never in the middle of a finalize, append or
        recovery that renames or cuts its files; the caller reports the loss."""
        replica = self.replicas.get(block_id)
        if replica is None or replica.removed or replica.gs != gs:
            return None
        async with replica.lock:
            if replica.removed or self.replicas.get(block_id) is not replica \
                    or replica.gs != gs \
                    or (replica.state, ReplicaEvent.MISSING) not in TRANSITIONS:
                return None
            paths = [replica.data_path, replica.meta_path]
            reason = await self.run_io(lost_reason, *paths, replica.num_bytes,
                                       replica.bytes_per_checksum)
            if reason is None or replica.removed:
                return None
            next_state(replica.state, ReplicaEvent.MISSING)
            self._untrack(replica)
            replica.removed = True
            self._removing.add(block_id)
            try:
                await self.run_io(quarantine_files, self.data_dir,
                                  paths + self._take_pending(replica),
                                  f"replica {replica.name} lost: {reason}")
            finally:
                self._removing.discard(block_id)
        return reason

    async def adopt_finalized(self, block_id: int, gs: int, data_path: str,
                              meta_path: str) -> Replica | None:
        """HDFS DirectoryScanner ``checkAndUpdate`` for files in ``finalized/`` the map does
        not know: a consistent data + meta pair becomes a FINALIZED replica (the caller
        reports it received). None when the id is known by now, its files are on their way
        out (a delete or a drop running or finished meanwhile), or they are not a consistent
        replica (logged, left alone: the start-up scan quarantines such files)."""
        if block_id in self.replicas or block_id in self._removing:
            return None
        state = next_state(None, ReplicaEvent.CHECK_AND_UPDATE)
        removals = self._removals
        try:
            bpc, length = await self.run_io(finalized_consistent, data_path, meta_path)
        except (OSError, ValueError) as exc:
            log.warning("directory scan: files of blk_%d in %s are not a consistent replica "
                        "(%s); left alone", block_id, os.path.dirname(data_path), exc)
            return None
        if block_id in self.replicas or block_id in self._removing \
                or removals != self._removals:
            return None   # something left the map meanwhile: the next scan looks again
        replica = Replica(block_id, gs, state, bpc, data_path, meta_path,
                          num_bytes=length, visible_length=length)
        self._track(replica)
        log.warning("directory scan: replica %s found on disk but not in the replica map; "
                    "added (%d bytes)", replica.name, length)
        return replica
