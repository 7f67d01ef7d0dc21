"""The block server's replica records: ``Replica`` (one entry of the replica map) and the
open files of a replica, ``ReplicaWriter`` (an RBW replica being written) and
``ReplicaReader`` (a snapshot of a readable replica).

Why it exists: the records and their file handles are what the store (``storage/replicas.py``)
hands to the data transfer code; they carry no policy (which moves are legal is
``storage/replica_states.py``, where files go is ``storage/layout.py``).

Concurrency contract: a ``Replica`` is only touched from the trio thread; structural changes
of one replica (finalize's renames, delete, opening its files for a read) hold its
``replica.lock``, so a reader never opens a path that is being renamed. ``ReplicaWriter`` and
``ReplicaReader`` methods block (call them in a worker thread). A ``ReplicaWriter``'s file
descriptors are guarded by its own thread lock: ``close`` (INVALIDATE, delete, release) waits
for a write or fsync in flight in another worker thread, and a write that starts after the
close fails (``WriterClosed``, which the store turns into ``ReplicaNotFound``) instead of
touching a descriptor number the kernel may have handed to another file meanwhile.

A FINALIZED replica may be rewritten in place under a new stamp (``storage/patching.py``)
while a ``ReplicaReader`` opened before still streams it: ``Replica.patch_seq`` (odd while the
new bytes are being written) and ``Replica.patch_gate`` (a patch's writes wait for reads of the
replica's files in flight, and new reads wait for them) make every read see one version, and
a reader whose replica changed since its snapshot fails its next read with ``ReplicaChanged``.
"""

from __future__ import annotations

import errno as _errno
import os
import threading
from dataclasses import dataclass, field

import trio

from fs.datafolder import FILE_MODE
from fs.datatransfer import CHECKSUM_SIZE, num_chunks
from fs.errors import ReplicaChanged

from .layout import encode_meta_header, meta_length, meta_offset, unlink_quietly
from .replica_states import ReplicaState

#: most buffers one ``pwritev`` takes (the kernel's UIO_MAXIOV)
_IOV_MAX = 1024


@dataclass(eq=False)
class Replica:
    """One replica in the map. ``num_bytes`` = bytes on disk (for RBW: received so far);
    ``visible_length`` = bytes readers may see (RBW: acknowledged downstream)."""

    block_id: int
    gs: int
    state: ReplicaState
    bytes_per_checksum: int
    data_path: str
    meta_path: str
    num_bytes: int = 0
    visible_length: int = 0
    #: CRC of the partial last chunk at ``visible_length`` (kept in memory because the writer
    #: may already be rewriting that chunk's stored checksum for a longer chunk)
    visible_last_sum: bytes | None = None
    removed: bool = False
    lock: trio.Lock = field(default_factory=trio.Lock)
    writer: "ReplicaWriter | None" = None
    #: cancels the WRITE_BLOCK pipeline feeding this replica (set by the pipeline while it
    #: runs), so block recovery can stop a running writer (HDFS ReplicaInPipeline.stopWriter)
    writer_scope: "trio.CancelScope | None" = None
    writer_stopped: "trio.Event | None" = None
    #: RUR only: the state the replica had before recovery (FINALIZED, RBW or RWR)
    original_state: "ReplicaState | None" = None
    #: the highest recovery id seen by ``init_replica_recovery`` (0 = none); lower or equal
    #: ids are stale recoveries and refused
    recovery_id: int = 0
    #: bumped to odd (from the patch's worker thread) before a patch rewrites the files in
    #: place and to even once the new version is committed: a reader that snapshotted
    #: another value reads a replica that is no longer the one it started on
    patch_seq: int = 0
    #: a patch of this replica is running (set on the trio thread for the patch's whole hop)
    patching: bool = False
    #: what a patch's in-place writes and the reads of this replica's files exclude each
    #: other with (worker threads); made on first use (``gate``), most replicas never need one
    patch_gate: "PatchGate | None" = None
    #: redo files of acknowledged patches whose in-place writes are not fsynced yet, oldest
    #: first (the store's patch flusher, or a structural change, flushes and unlinks them)
    pending_redos: list = field(default_factory=list)
    #: its files were named to a short-circuit reader since the server started
    #: (``ReplicaStore.finalized_files``): a patch makes the new version in copies, since
    #: that reader reads the old files without this server
    named: bool = False

    @property
    def name(self) -> str:
        return f"blk_{self.block_id}_{self.gs}"

    def gate(self) -> "PatchGate":
        """The replica's ``PatchGate``, made now if it has none (trio thread only, so two
        callers never make two)."""
        if self.patch_gate is None:
            self.patch_gate = PatchGate()
        return self.patch_gate

    @property
    def readable_length(self) -> int:
        """Bytes a reader may see: a replica being written shows what the whole pipeline
        acknowledged, any other all it holds."""
        return self.visible_length if self.state is ReplicaState.RBW else self.num_bytes

    def report_entry(self) -> list:
        """``[id, gs, num_bytes, state]`` as block reports carry it."""
        length = self.readable_length
        state = self.state
        if state is ReplicaState.RUR:   # not a wire state: report what it was before recovery
            state = self.original_state or ReplicaState.RWR
        return [self.block_id, self.gs, length, state.value]

    def disk_bytes(self) -> int:
        return self.num_bytes + meta_length(self.num_bytes, self.bytes_per_checksum)

    def set_visible(self, length: int, last_sum: bytes | None) -> None:
        """Bytes acknowledged by the whole downstream pipeline; never moves backwards."""
        if length >= self.visible_length:
            self.visible_length = length
            self.visible_last_sum = last_sum if length % self.bytes_per_checksum else None


class PatchGate:
    """Reads of a replica's files (shared) against a patch rewriting them in place
    (exclusive), between worker threads.

    Why it exists: ``patch_seq`` tells a read afterwards that a patch overlapped it, which is
    enough for a ``pread`` (its bytes are thrown away), but not for ``sendfile``, whose bytes
    are on the socket before anything can be checked: a reader would get a packet of mixed
    versions and take it for corruption. Readers hold the gate for one ``pread`` or
    ``sendfile`` (short: the socket is non-blocking), a patch for its writes and rename.

    Concurrency contract: thread-safe; never held across a trio checkpoint. A patch waiting
    for readers already holds its worker thread's limiter slot, and so do they: no cycle.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    def __enter__(self) -> None:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def begin_write(self) -> None:
        """Wait until no read is in flight; later reads wait for ``end_write``."""
        with self._cond:
            self._writing = True
            while self._readers:
                self._cond.wait()

    def end_write(self) -> None:
        with self._cond:
            self._writing = False
            self._cond.notify_all()


class WriterClosed(Exception):
    """A write or fsync reached a ``ReplicaWriter`` after its files were closed (the store
    turns it into ``ReplicaNotFound``)."""


class ReplicaWriter:
    """Open file descriptors of an RBW replica; its methods block (call them in a thread).

    ``_io_lock`` makes close wait for a write/fsync running in another worker thread, and
    makes every operation after close fail with ``WriterClosed`` without touching the
    (possibly reused) descriptor numbers.
    """

    def __init__(self, data_path: str, meta_path: str, bytes_per_checksum: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.bytes_per_checksum = bytes_per_checksum
        self._io_lock = threading.Lock()
        self.closed = False
        self.data_fd = os.open(data_path, flags, FILE_MODE)
        try:
            self.meta_fd = os.open(meta_path, flags, FILE_MODE)
        except BaseException:
            os.close(self.data_fd)
            if create:
                unlink_quietly(data_path)
            raise
        if create:
            os.pwrite(self.meta_fd, encode_meta_header(bytes_per_checksum), 0)

    def write(self, offset: int, data, sums: bytes) -> None:
        with self._io_lock:
            self._require_open()
            if len(data):
                os.pwrite(self.data_fd, data, offset)
                os.pwrite(self.meta_fd, sums, meta_offset(offset // self.bytes_per_checksum))

    def write_run(self, packets) -> None:
        """Write consecutive packets (``offset, data, sums`` each, in order): each run of
        them that lies back to back in whole chunks (all of a Hadoop client's 64 KiB
        packets but the last) in one ``pwritev`` per file instead of two writes a packet."""
        bpc = self.bytes_per_checksum
        with self._io_lock:
            self._require_open()
            run: list = []
            for packet in packets:
                if run and (run[-1][0] + len(run[-1][1]) != packet[0] or len(run[-1][1]) % bpc):
                    self._write_vectors(run)
                    run = []
                if len(packet[1]):
                    run.append(packet)
            if run:
                self._write_vectors(run)

    def _write_vectors(self, run) -> None:
        offset = run[0][0]
        for fd, at, parts in ((self.data_fd, offset, [data for _, data, _ in run]),
                              (self.meta_fd, meta_offset(offset // self.bytes_per_checksum),
                               [sums for _, _, sums in run])):
            for start in range(0, len(parts), _IOV_MAX):
                group = parts[start:start + _IOV_MAX]
                want = sum(len(part) for part in group)
                if os.pwritev(fd, group, at) != want:   # only a full disk writes short
                    raise OSError(_errno.ENOSPC, "short write: the disk is full")
                at += want

    def fsync(self) -> None:
        with self._io_lock:
            self._require_open()
            os.fsync(self.data_fd)
            os.fsync(self.meta_fd)

    def close_for_finalize(self, sync: bool) -> None:
        """finalize: (fsync and) close in one step, so no write can slip in between."""
        with self._io_lock:
            self._require_open()
            if sync:
                os.fsync(self.data_fd)
                os.fsync(self.meta_fd)
            self._close_locked()

    def close(self) -> None:
        """Close the files once any write/fsync in flight is done; idempotent."""
        with self._io_lock:
            self._close_locked()

    def _require_open(self) -> None:
        if self.closed:
            raise WriterClosed("the replica's files were closed")

    def _close_locked(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fd in (self.data_fd, self.meta_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.data_fd = self.meta_fd = -1


#: errors of ``sendfile`` that are the socket's (the reader went away), not the disk's
_PEER_GONE = frozenset({_errno.ENOTCONN, _errno.ESHUTDOWN, _errno.ETIMEDOUT,
                        _errno.EHOSTUNREACH, _errno.ENETUNREACH})


class ReplicaReader:
    """A snapshot of a readable replica (taken on the trio thread) with its files open;
    ``open_files``/``read``/``close`` block (use a thread)."""

    def __init__(self, replica: Replica):
        self.replica = replica
        self.patch_seq = replica.patch_seq
        self.gate = replica.gate()
        self.block_id = replica.block_id
        self.gs = replica.gs
        self.state = replica.state
        self.bytes_per_checksum = replica.bytes_per_checksum
        self.data_path, self.meta_path = replica.data_path, replica.meta_path
        being_written = replica.state is ReplicaState.RBW
        self.visible_length = replica.visible_length if being_written else replica.num_bytes
        self.last_sum = replica.visible_last_sum if being_written else None
        self.data_fd = self.meta_fd = -1

    def open_files(self) -> "ReplicaReader":
        self.data_fd = os.open(self.data_path, os.O_RDONLY)
        try:
            self.meta_fd = os.open(self.meta_path, os.O_RDONLY)
        except BaseException:
            os.close(self.data_fd)
            self.data_fd = -1
            raise
        return self

    @property
    def changed(self) -> bool:
        """The replica was patched (or is being patched) since this snapshot."""
        return self.replica.patch_seq != self.patch_seq

    def _require_unchanged(self) -> None:
        if self.changed:
            raise ReplicaChanged(f"blk_{self.block_id} became a new version while being "
                                 f"read; read it again")

    def read(self, start: int, length: int) -> tuple[bytes, bytes]:
        """Data ``[start, start+length)`` (chunk-aligned start, within the visible length)
        and its stored checksums, both of the version this reader snapshotted
        (``ReplicaChanged`` if the replica was patched since)."""
        with self.gate:
            self._require_unchanged()
            data = os.pread(self.data_fd, length, start)
            if len(data) != length:
                raise OSError(_errno.EIO, f"blk_{self.block_id}: data file holds fewer bytes "
                                          f"than {start + length}")
            return data, self._read_sums(start, length)

    def read_sums(self, start: int, length: int) -> bytes:
        """The stored checksums of data ``[start, start+length)`` (chunk-aligned start,
        within the visible length); a replica being written gives its visible last chunk's.
        ``ReplicaChanged`` if the replica was patched since the snapshot."""
        with self.gate:
            self._require_unchanged()
            return self._read_sums(start, length)

    def _read_sums(self, start: int, length: int) -> bytes:
        bpc = self.bytes_per_checksum
        n = num_chunks(length, bpc)
        sums = os.pread(self.meta_fd, CHECKSUM_SIZE * n, meta_offset(start // bpc))
        if len(sums) != CHECKSUM_SIZE * n:
            raise OSError(_errno.EIO, f"blk_{self.block_id}: meta file holds fewer checksums "
                                      f"than chunk {start // bpc + n}")
        end = start + length
        if self.last_sum is not None and end == self.visible_length and end % bpc:
            sums = sums[:-CHECKSUM_SIZE] + self.last_sum
        return sums

    def send_data(self, sock_fd: int, start: int, length: int) -> int | None:
        """Data ``[start, start+length)`` put on the non-blocking socket ``sock_fd`` by the
        kernel (``sendfile``: no copy through this process) until the socket would block:
        the bytes sent, or None when the peer is gone. Blocks only on the disk.
        ``ReplicaChanged`` (before a byte is sent) if the replica was patched since the
        snapshot: the gate keeps a patch from rewriting the file while the kernel sends."""
        with self.gate:
            self._require_unchanged()
            return self._send_data(sock_fd, start, length)

    def _send_data(self, sock_fd: int, start: int, length: int) -> int | None:
        sent = 0
        while sent < length:
            try:
                n = os.sendfile(sock_fd, self.data_fd, start + sent, length - sent)
            except BlockingIOError:
                break
            except OSError as exc:
                if isinstance(exc, ConnectionError) or exc.errno in _PEER_GONE:
                    return None
                raise
            if n == 0:
                raise OSError(_errno.EIO, f"blk_{self.block_id}: data file holds fewer bytes "
                                          f"than {start + length}")
            sent += n
        return sent

    def read_closed(self, start: int, length: int) -> tuple[bytes, bytes]:
        """``open_files`` + ``read`` + ``close`` as one blocking call: a read of one
        packet costs one worker-thread hop."""
        self.open_files()
        try:
            return self.read(start, length)
        finally:
            self.close()

    def close(self) -> None:
        for fd in (self.data_fd, self.meta_fd):
            if fd >= 0:
                os.close(fd)
        self.data_fd = self.meta_fd = -1


def reopen_writer(data_path: str, meta_path: str, bpc: int, length: int):
    """A ``ReplicaWriter`` continuing an existing replica of ``length`` bytes, and the stored
    checksum of its last partial chunk (None at a chunk boundary): what append and pipeline
    recovery need to go on writing it."""
    writer = ReplicaWriter(data_path, meta_path, bpc, create=False)
    last_sum = None
    if length % bpc:
        last_sum = os.pread(writer.meta_fd, CHECKSUM_SIZE, meta_offset(length // bpc))
    return writer, last_sum
