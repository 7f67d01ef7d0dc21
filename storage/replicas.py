"""The replica store of one block server: block replica files in a data folder, the in-memory
replica map rebuilt from them at start; its state table is ``storage/replica_states.py``.

Why it exists: everything the block server knows about its blocks is on disk in a layout that
survives a crash (HDFS's FsDatasetImpl); the map is only a cache of that folder, rebuilt by
``ReplicaStore.open`` (temporaries removed, RBW replicas turned into RWR and cut back to the
length their checksums cover, broken finalized replicas moved aside).

On-disk layout of ``data_dir``::

    node_id                       this server's identity (uuid hex), created once
    in_use.lock                   flock'ed while a server runs on the folder
    tmp/                          TEMPORARY replicas (incoming copies); wiped at start
    rbw/blk_<id>                  replicas being written: RBW, or RWR after a restart
    rbw/blk_<id>_<gs>.meta
    finalized/subdirA/subdirB/blk_<id> (+ .meta)    A = (id >> 16) & 31, B = (id >> 8) & 31,
                                  so no folder ever holds more than a small share of the blocks
    corrupt/                      finalized replicas whose data length disagrees with their
                                  meta file at start: moved here, logged, NOT reported (the
                                  metadata server sees one replica fewer and re-replicates);
                                  also what is left of a replica dropped later because its
                                  files were found gone or cut (``drop_if_lost``: reported
                                  deleted by the caller)

Meta file = header ``>HBI`` (version 1, checksum type 2 = CRC32C in HDFS's DataChecksum
numbering, bytes_per_checksum), then one big-endian CRC32C per ``bytes_per_checksum`` chunk of
the data (the last chunk may be short).

Concurrency contract: the map and ``Replica`` objects are only touched from the trio thread;
every file operation runs in a worker thread under one ``CapacityLimiter(disk_io_threads)``.
Structural changes of one replica (finalize's renames, delete, opening its files for a read)
hold ``replica.lock``, so a reader never opens a path that is being renamed. An RBW replica has
exactly one writer (the pipeline that created it), which alone calls ``write_packet``/``sync``/
``finalize``. fsync happens only for SYNC packets and at finalize. A ``ReplicaWriter``'s file
descriptors are guarded by its own thread lock: ``close`` (INVALIDATE, delete, release) waits
for a write or fsync in flight in another worker thread, and a write that starts after the
close fails (``ReplicaNotFound``) instead of touching a descriptor number the kernel may have
handed to another file meanwhile. ``used_bytes`` is a running counter (no walk per heartbeat),
kept by every operation that adds, grows or removes a replica in the map. Files of a replica
being deleted or dropped stay on disk for a moment after it left the map: ``_removing`` and
the ``_removals`` count keep the directory scan (``adopt_finalized``) from taking them back.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import logging
import os
import re
import shutil
import struct
import threading
import uuid
from dataclasses import dataclass, field

import trio

from fs.datatransfer import CHECKSUM_SIZE, crc32c, num_chunks
from fs.errors import (InvalidArgument, LeaseFSError, ProtocolError, ReplicaAlreadyExists,
                       ReplicaNotFound, StaleGenerationStamp)

from .replica_states import TRANSITIONS, ReplicaEvent, ReplicaState, next_state

log = logging.getLogger(__name__)

META_HEADER = struct.Struct(">HBI")
META_VERSION = 1
CHECKSUM_TYPE_CRC32C = 2
#: accepted ``bytes_per_checksum`` of a new replica: smaller chunks make verifying a packet
#: on the trio thread far too slow (16-byte chunks: 0.6 s per 16 MiB packet), larger ones
#: make every partial-chunk rewrite and read re-checksum huge runs
MIN_BYTES_PER_CHECKSUM = 512
MAX_BYTES_PER_CHECKSUM = 1 << 20
#: what a meta header found on disk may say (looser: files written by older versions stay
#: readable)
_META_MIN_BPC = 16
_META_MAX_BPC = 16 << 20

_DATA_NAME = re.compile(r"^blk_(-?\d+)$")
_META_NAME = re.compile(r"^blk_(-?\d+)_(\d+)\.meta$")


# --------------------------------------------------------------------------- pure helpers


def finalized_subdir(block_id: int) -> str:
    """Bucket folder of a finalized replica, relative to ``finalized/`` (HDFS idToBlockDir)."""
    return os.path.join(f"subdir{(block_id >> 16) & 0x1F}", f"subdir{(block_id >> 8) & 0x1F}")


def data_name(block_id: int) -> str:
    return f"blk_{block_id}"


def meta_name(block_id: int, gs: int) -> str:
    return f"blk_{block_id}_{gs}.meta"


def meta_offset(chunk_index: int) -> int:
    return META_HEADER.size + CHECKSUM_SIZE * chunk_index


def meta_length(data_length: int, bytes_per_checksum: int) -> int:
    return meta_offset(num_chunks(data_length, bytes_per_checksum))


def check_bytes_per_checksum(bytes_per_checksum: int) -> None:
    """``InvalidArgument`` unless a new replica may use this chunk size."""
    if not MIN_BYTES_PER_CHECKSUM <= bytes_per_checksum <= MAX_BYTES_PER_CHECKSUM:
        raise InvalidArgument(f"bytes_per_checksum {bytes_per_checksum} is outside the "
                              f"accepted range [{MIN_BYTES_PER_CHECKSUM}, "
                              f"{MAX_BYTES_PER_CHECKSUM}]")


def check_packet_range(received: int, offset: int, data_len: int, bytes_per_checksum: int) -> None:
    """Where a data packet may land in a replica that holds ``received`` bytes.

    It must start on a chunk boundary, not before the start of the last (possibly partial)
    chunk already received (the writer repeats that chunk's bytes after a flush), must leave
    no gap, and must not end before ``received`` (that would shrink the replica). Packets
    without data (LAST, SYNC-only, HEARTBEAT) carry no bytes, so their offset does not matter.
    """
    if not data_len:
        return
    last_boundary = received - received % bytes_per_checksum
    if offset % bytes_per_checksum:
        raise ProtocolError(f"packet offset {offset} is not a multiple of the "
                            f"{bytes_per_checksum}-byte checksum chunk")
    if offset > received:
        raise ProtocolError(f"packet at offset {offset} leaves a gap: only {received} bytes "
                            f"received")
    if offset < last_boundary:
        raise ProtocolError(f"packet at offset {offset} starts before the last chunk boundary "
                            f"{last_boundary} already received")
    if offset + data_len < received:
        raise ProtocolError(f"packet [{offset}, {offset + data_len}) ends before the {received} "
                            f"bytes already received")


def encode_meta_header(bytes_per_checksum: int) -> bytes:
    return META_HEADER.pack(META_VERSION, CHECKSUM_TYPE_CRC32C, bytes_per_checksum)


def decode_meta_header(raw: bytes) -> int:
    """bytes_per_checksum from a meta header; ``ValueError`` if it is not one of ours."""
    if len(raw) < META_HEADER.size:
        raise ValueError(f"meta header of {len(raw)} bytes is too short")
    version, kind, bpc = META_HEADER.unpack_from(raw)
    if version != META_VERSION or kind != CHECKSUM_TYPE_CRC32C:
        raise ValueError(f"meta header version {version} / checksum type {kind} unsupported")
    if not _META_MIN_BPC <= bpc <= _META_MAX_BPC:
        raise ValueError(f"meta header has bytes_per_checksum {bpc}")
    return bpc


# --------------------------------------------------------------------------- replica


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

    @property
    def name(self) -> str:
        return f"blk_{self.block_id}_{self.gs}"

    def report_entry(self) -> list:
        """``[id, gs, num_bytes, state]`` as block reports carry it."""
        length = self.visible_length if self.state is ReplicaState.RBW else self.num_bytes
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
        self.data_fd = os.open(data_path, flags, 0o644)
        try:
            self.meta_fd = os.open(meta_path, flags, 0o644)
        except BaseException:
            os.close(self.data_fd)
            if create:
                _unlink_quietly(data_path)
            raise
        if create:
            os.pwrite(self.meta_fd, encode_meta_header(bytes_per_checksum), 0)

    def write(self, offset: int, data, sums: bytes) -> None:
        with self._io_lock:
            self._require_open()
            if len(data):
                os.pwrite(self.data_fd, data, offset)
                os.pwrite(self.meta_fd, sums, meta_offset(offset // self.bytes_per_checksum))

    def fsync(self) -> None:
        with self._io_lock:
            self._require_open()
            os.fsync(self.data_fd)
            os.fsync(self.meta_fd)

    def fsync_and_close(self) -> None:
        """finalize: flush and close in one step, so no write can slip in between."""
        with self._io_lock:
            self._require_open()
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


class ReplicaReader:
    """A snapshot of a readable replica (taken on the trio thread) with its files open;
    ``open_files``/``read``/``close`` block (use a thread)."""

    def __init__(self, replica: Replica):
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

    def read(self, start: int, length: int) -> tuple[bytes, bytes]:
        """Data ``[start, start+length)`` (chunk-aligned start, within the visible length)
        and its stored checksums."""
        bpc = self.bytes_per_checksum
        data = os.pread(self.data_fd, length, start)
        if len(data) != length:
            raise OSError(_errno.EIO, f"blk_{self.block_id}: data file holds fewer bytes than "
                                      f"{start + length}")
        n = num_chunks(length, bpc)
        sums = os.pread(self.meta_fd, CHECKSUM_SIZE * n, meta_offset(start // bpc))
        if len(sums) != CHECKSUM_SIZE * n:
            raise OSError(_errno.EIO, f"blk_{self.block_id}: meta file holds fewer checksums "
                                      f"than chunk {start // bpc + n}")
        end = start + length
        if self.last_sum is not None and end == self.visible_length and end % bpc:
            sums = sums[:-CHECKSUM_SIZE] + self.last_sum
        return data, sums

    def close(self) -> None:
        for fd in (self.data_fd, self.meta_fd):
            if fd >= 0:
                os.close(fd)
        self.data_fd = self.meta_fd = -1


# --------------------------------------------------------------------------- scanning


@dataclass
class ScannedReplica:
    """A replica as found on disk; ``state`` is its folder's (RBW for rbw/, FINALIZED)."""

    block_id: int
    gs: int
    state: ReplicaState
    bytes_per_checksum: int
    data_path: str
    meta_path: str
    num_bytes: int


@dataclass
class ScanResult:
    """What the start-up scan found and did (also logged)."""

    replicas: list[ScannedReplica] = field(default_factory=list)
    temporaries_removed: int = 0
    rbw_trimmed: list[tuple[int, int, int]] = field(default_factory=list)  # id, before, after
    quarantined: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def group_block_files(folder: str) -> dict[int, dict]:
    """``id -> {"data": path|None, "metas": [(gs, path)]}`` for the blk_ files in one folder;
    anything else is left alone."""
    groups: dict[int, dict] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return groups
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        m = _DATA_NAME.match(entry.name)
        if m:
            groups.setdefault(int(m.group(1)), {"data": None, "metas": []})["data"] = entry.path
            continue
        m = _META_NAME.match(entry.name)
        if m:
            groups.setdefault(int(m.group(1)), {"data": None, "metas": []})["metas"].append(
                (int(m.group(2)), entry.path))
    return groups


def _newest_meta(block_id: int, group: dict, result: ScanResult) -> tuple[int, str] | None:
    """Keep the meta file with the highest GS, remove older ones (left by a GS bump)."""
    metas = sorted(group["metas"])
    for _gs, path in metas[:-1]:
        _unlink_quietly(path)
        result.orphans_removed.append(path)
    return metas[-1] if metas else None


def _longest_prefix_matching(chunk: bytes, stored: bytes) -> int:
    """Length of the longest prefix of ``chunk`` whose CRC32C equals ``stored`` (0: none)."""
    want = int.from_bytes(stored, "big") if len(stored) == CHECKSUM_SIZE else None
    best, value, view = 0, 0, memoryview(chunk)
    for i in range(len(view)):
        value = crc32c(view[i:i + 1], value)
        if value == want:
            best = i + 1
    return best


def _trim_rbw(block_id: int, data_path: str, meta_path: str) -> tuple[int, int, int]:
    """Cut an RBW replica found at restart to the length its checksums validly cover.

    Returns ``(bytes_per_checksum, length_before, length_after)``. The data may run ahead of
    the checksums or vice versa after a crash, and the last chunk may be torn; walk back from
    the longest length both files cover until the last chunk (or a prefix of it) matches its
    checksum, so bytes acknowledged after an hflush/hsync of a partial chunk survive.
    """
    with open(meta_path, "r+b") as meta, open(data_path, "r+b") as data:
        bpc = decode_meta_header(meta.read(META_HEADER.size))
        meta_size = os.fstat(meta.fileno()).st_size
        data_size = os.fstat(data.fileno()).st_size
        n_sums = (meta_size - META_HEADER.size) // CHECKSUM_SIZE
        length = min(data_size, n_sums * bpc)
        while length > 0:
            chunk_start = (length - 1) // bpc * bpc
            chunk = os.pread(data.fileno(), length - chunk_start, chunk_start)
            stored = os.pread(meta.fileno(), CHECKSUM_SIZE, meta_offset(chunk_start // bpc))
            if crc32c(chunk).to_bytes(4, "big") == stored:
                break
            # the data may run ahead of a partial chunk's checksum (the crash hit a rewrite
            # of that chunk between the data and the meta write): keep the prefix it covers
            prefix = _longest_prefix_matching(chunk, stored)
            if prefix:
                length = chunk_start + prefix
                break
            length = chunk_start
        if length != data_size:
            data.truncate(length)
        if meta_size != meta_length(length, bpc):
            meta.truncate(meta_length(length, bpc))
    return bpc, data_size, length


def truncate_replica_files(data_path: str, meta_path: str, new_length: int,
                           bytes_per_checksum: int) -> None:
    """Cut a replica's data to ``new_length`` and its meta file to the matching number of
    checksums; the last chunk, if now partial, gets its checksum recomputed from the data.
    fsyncs both. Blocking: run it in a worker thread."""
    bpc = bytes_per_checksum
    with open(data_path, "r+b") as data, open(meta_path, "r+b") as meta:
        if os.fstat(data.fileno()).st_size != new_length:
            data.truncate(new_length)
        meta.truncate(meta_length(new_length, bpc))
        if new_length % bpc:
            start = new_length - new_length % bpc
            chunk = os.pread(data.fileno(), new_length - start, start)
            if len(chunk) != new_length - start:
                raise OSError(_errno.EIO, f"{data_path}: shorter than {new_length} bytes")
            os.pwrite(meta.fileno(), crc32c(chunk).to_bytes(CHECKSUM_SIZE, "big"),
                      meta_offset(start // bpc))
        os.fsync(data.fileno())
        os.fsync(meta.fileno())


def finalized_consistent(data_path: str, meta_path: str) -> tuple[int, int]:
    """``(bytes_per_checksum, length)`` of a finalized replica, ``ValueError`` if the data
    length disagrees with the number of checksums."""
    with open(meta_path, "rb") as meta:
        bpc = decode_meta_header(meta.read(META_HEADER.size))
        meta_size = os.fstat(meta.fileno()).st_size
    length = os.stat(data_path).st_size
    if meta_size != meta_length(length, bpc):
        raise ValueError(f"data of {length} bytes needs a meta file of "
                         f"{meta_length(length, bpc)} bytes, found {meta_size}")
    return bpc, length


def quarantine_files(data_dir: str, paths: list[str], why: str) -> list[str]:
    """Move the replica files ``paths`` that still exist to ``corrupt/`` (kept for a look,
    never served); returns where they went. Blocking: run it in a worker thread."""
    corrupt = os.path.join(data_dir, "corrupt")
    os.makedirs(corrupt, exist_ok=True)
    moved = []
    for path in paths:
        target = os.path.join(corrupt, os.path.basename(path))
        try:
            os.replace(path, target)
        except FileNotFoundError:
            continue
        moved.append(target)
    log.warning("moved %s to %s: %s", ", ".join(os.path.basename(p) for p in moved) or
                "nothing (no file left)", corrupt, why)
    return moved


def lost_reason(data_path: str, meta_path: str, num_bytes: int,
                bytes_per_checksum: int) -> str | None:
    """Why the files of a replica the map holds with ``num_bytes`` bytes cannot serve it (a
    file gone, cut or grown), or None when both have the sizes the map implies. Blocking."""
    sizes = []
    for kind, path in (("data", data_path), ("meta", meta_path)):
        try:
            sizes.append(os.stat(path).st_size)
        except OSError as exc:
            return f"its {kind} file {path} is gone ({exc.strerror or exc})"
    want_meta = meta_length(num_bytes, bytes_per_checksum)
    if sizes[0] != num_bytes:
        return f"its data file holds {sizes[0]} bytes, the replica {num_bytes}"
    if sizes[1] != want_meta:
        return f"its meta file holds {sizes[1]} bytes, {want_meta} expected for {num_bytes} bytes"
    return None


def scan_data_dir(data_dir: str) -> ScanResult:
    """Rebuild the replica list from the folder, repairing what a crash can leave behind.
    Blocking: run it in a worker thread."""
    result = ScanResult()
    tmp, rbw, fin = (os.path.join(data_dir, d) for d in ("tmp", "rbw", "finalized"))
    # TEMPORARY replicas are half-copied transfers: the sender will retry elsewhere.
    for entry in list(os.scandir(tmp)):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            _unlink_quietly(entry.path)
        result.temporaries_removed += 1

    def quarantine(paths: list[str], why: str) -> None:
        result.quarantined += quarantine_files(data_dir, paths, why)

    found: dict[int, ScannedReplica] = {}

    # --- rbw/ first: it may hold the data half of a finalize that crashed between renames
    for block_id, group in sorted(group_block_files(rbw).items()):
        newest = _newest_meta(block_id, group, result)
        data_path = group["data"]
        if data_path is None:
            if newest:
                _unlink_quietly(newest[1])
                result.orphans_removed.append(newest[1])
            continue
        if newest is None:
            bucket = os.path.join(fin, finalized_subdir(block_id))
            fin_metas = [m for m in group_block_files(bucket).get(block_id, {}).get("metas", [])]
            fin_data = os.path.join(bucket, data_name(block_id))
            if fin_metas and not os.path.exists(fin_data):
                os.replace(data_path, fin_data)   # finish the interrupted finalize
                log.info("finished the interrupted finalize of blk_%d", block_id)
            else:
                _unlink_quietly(data_path)
                result.orphans_removed.append(data_path)
            continue
        gs, meta_path = newest
        try:
            bpc, before, after = _trim_rbw(block_id, data_path, meta_path)
        except (OSError, ValueError) as exc:
            log.warning("removing unreadable RBW replica blk_%d: %s", block_id, exc)
            for p in (data_path, meta_path):
                _unlink_quietly(p)
                result.orphans_removed.append(p)
            continue
        if after != before:
            result.rbw_trimmed.append((block_id, before, after))
            log.info("RBW replica blk_%d_%d cut from %d to %d bytes (torn last chunk)",
                     block_id, gs, before, after)
        found[block_id] = ScannedReplica(block_id, gs, ReplicaState.RBW, bpc, data_path,
                                         meta_path, after)

    # --- finalized/
    for dirpath, _dirnames, _files in os.walk(fin):
        for block_id, group in sorted(group_block_files(dirpath).items()):
            newest = _newest_meta(block_id, group, result)
            data_path = group["data"]
            if data_path is None or newest is None:
                quarantine([p for p in (data_path, newest and newest[1]) if p],
                           "finalized replica without its " +
                           ("data file" if data_path is None else "meta file"))
                continue
            gs, meta_path = newest
            try:
                bpc, length = finalized_consistent(data_path, meta_path)
            except (OSError, ValueError) as exc:
                quarantine([data_path, meta_path], str(exc))
                continue
            other = found.get(block_id)
            if other is not None:
                # the same block in rbw/ and finalized/: keep the newer, finalized on a tie
                loser = other if other.gs <= gs else None
                if loser is None:
                    for p in (data_path, meta_path):
                        _unlink_quietly(p)
                        result.orphans_removed.append(p)
                    continue
                for p in (loser.data_path, loser.meta_path):
                    _unlink_quietly(p)
                    result.orphans_removed.append(p)
            found[block_id] = ScannedReplica(block_id, gs, ReplicaState.FINALIZED, bpc,
                                             data_path, meta_path, length)
    result.replicas = list(found.values())
    return result


def _ensure_layout(data_dir: str) -> str:
    """Create the folders, take the folder lock, load or create the node id."""
    for sub in ("tmp", "rbw", "finalized"):
        os.makedirs(os.path.join(data_dir, sub), exist_ok=True)
    path = os.path.join(data_dir, "node_id")
    try:
        with open(path) as fh:
            node_id = fh.read().strip()
        if node_id:
            return node_id
    except FileNotFoundError:
        pass
    node_id = uuid.uuid4().hex
    tmp = path + ".new"
    with open(tmp, "w") as fh:
        fh.write(node_id + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(data_dir)
    return node_id


# --------------------------------------------------------------------------- the store


def _reopen_writer(data_path: str, meta_path: str, bpc: int, length: int):
    """A ``ReplicaWriter`` continuing an existing replica of ``length`` bytes, and the stored
    checksum of its last partial chunk (None at a chunk boundary): what append and pipeline
    recovery need to go on writing it."""
    writer = ReplicaWriter(data_path, meta_path, bpc, create=False)
    last_sum = None
    if length % bpc:
        last_sum = os.pread(writer.meta_fd, CHECKSUM_SIZE, meta_offset(length // bpc))
    return writer, last_sum


class ReplicaStore:
    """The replica map of one data folder plus every file operation on it."""

    def __init__(self, data_dir: str, *, disk_io_threads: int = 8):
        self.data_dir = os.path.abspath(data_dir)
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

    # -- lifecycle
    async def run_io(self, fn, *args):
        """Run blocking file work in a worker thread under the disk limiter."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def open(self) -> ScanResult:
        """Create the layout, lock the folder, scan it into the map."""
        self._lock_fd = await self.run_io(self._take_folder_lock)
        try:
            self.node_id = await self.run_io(_ensure_layout, self.data_dir)
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
        os.makedirs(self.data_dir, exist_ok=True)
        fd = os.open(os.path.join(self.data_dir, "in_use.lock"), os.O_RDWR | os.O_CREAT, 0o644)
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

    # -- writing
    async def create_rbw(self, block_id: int, gs: int, bytes_per_checksum: int) -> Replica:
        """A new RBW replica with its files open for writing. An existing replica with an
        equal or newer GS is refused; an older one is replaced."""
        check_bytes_per_checksum(bytes_per_checksum)
        existing = self.replicas.get(block_id)
        if existing is not None:
            if existing.gs >= gs:
                raise ReplicaAlreadyExists(
                    f"replica blk_{block_id} already exists with generation stamp {existing.gs} "
                    f"({existing.state.value}), not older than {gs}")
            log.info("replacing %s replica %s by a new generation stamp %d",
                     existing.state.value, existing.name, gs)
            await self.delete(existing)
            if self.replicas.get(block_id) is not None:   # raced with another writer
                raise ReplicaAlreadyExists(f"replica blk_{block_id} is being created already")
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
        writer = self._require_writable(replica)
        check_packet_range(replica.num_bytes, offset, len(data), replica.bytes_per_checksum)
        if not len(data):
            return
        await self._writer_io(replica, writer.write, offset, data, sums)
        self._set_num_bytes(replica, max(replica.num_bytes, offset + len(data)))

    async def sync(self, replica: Replica) -> None:
        writer = self._require_writable(replica)
        await self._writer_io(replica, writer.fsync)

    async def finalize(self, replica: Replica) -> None:
        """fsync data + meta, move both into finalized/<bucket>/, fsync both folders."""
        writer = self._require_writable(replica)
        new_state = next_state(replica.state, ReplicaEvent.FINALIZE)
        bucket = os.path.join(self.data_dir, "finalized", finalized_subdir(replica.block_id))
        new_data = os.path.join(bucket, data_name(replica.block_id))
        new_meta = os.path.join(bucket, meta_name(replica.block_id, replica.gs))

        def move() -> None:
            writer.fsync_and_close()
            os.makedirs(bucket, exist_ok=True)
            os.replace(replica.meta_path, new_meta)   # meta first: the scan completes a
            os.replace(replica.data_path, new_data)   # finalize cut between the two renames
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
            return _reopen_writer(new_data, new_meta, bpc, min_bytes)

        async with replica.lock:
            if replica.removed or self.replicas.get(block_id) is not replica \
                    or replica.num_bytes != held or replica.gs >= new_gs \
                    or replica.writer is not None:
                raise ReplicaNotFound(f"append: replica {replica.name} changed while being "
                                      f"reopened")
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
            return _reopen_writer(data_path, new_meta, bpc, acked_length)

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

    # -- reading
    async def open_reader(self, block_id: int, gs: int) -> ReplicaReader:
        replica = self.readable(block_id, gs)
        async with replica.lock:
            if replica.removed:
                raise ReplicaNotFound(f"replica {replica.name} was deleted")
            reader = ReplicaReader(replica)
            return await self.run_io(reader.open_files)

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

        def remove() -> None:
            if writer is not None:
                writer.close()
            for path in (replica.data_path, replica.meta_path):
                _unlink_quietly(path)

        self._removing.add(replica.block_id)
        try:
            async with replica.lock:
                await self.run_io(remove)
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
                await self.run_io(quarantine_files, self.data_dir, paths,
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
