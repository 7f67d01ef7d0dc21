"""On-disk layout of a block server's data folder: the folders, the names of replica files,
the meta file format and the blocking file helpers the replica store and its scans share.

Why it exists: the layout must survive a crash (HDFS's FsDatasetImpl); naming, bucketing and
the meta format are one contract between the store (``storage/replicas.py``), the start-up
scan (``storage/startup_scan.py``) and the directory scanner (``storage/dirscan.py``).

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

Concurrency contract: the name, format and range helpers are pure. The file helpers
(``unlink_quietly``, ``fsync_dir``, ``group_block_files``, ``truncate_replica_files``,
``finalized_consistent``, ``quarantine_files``, ``lost_reason``, ``ensure_layout``) block:
run them in a worker thread (``ReplicaStore.run_io``). They take no lock themselves; a caller
changing a mapped replica's files holds that ``replica.lock``.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import re
import uuid

from fs.datafolder import make_private_folder
from fs.datatransfer import (CHECKSUM_SIZE, CHECKSUM_TYPE_CRC32C, META_HEADER, META_VERSION,
                             crc32c, encode_meta_header, num_chunks)
from fs.errors import InvalidArgument, ProtocolError

log = logging.getLogger(__name__)

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


def unlink_quietly(path: str) -> None:
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
    return size_mismatch(sizes[0], sizes[1], num_bytes, bytes_per_checksum)


def size_mismatch(data_size: int, meta_size: int, num_bytes: int,
                  bytes_per_checksum: int) -> str | None:
    """Why files of these sizes cannot hold a replica of ``num_bytes`` bytes, or None."""
    want_meta = meta_length(num_bytes, bytes_per_checksum)
    if data_size != num_bytes:
        return f"its data file holds {data_size} bytes, the replica {num_bytes}"
    if meta_size != want_meta:
        return f"its meta file holds {meta_size} bytes, {want_meta} expected for {num_bytes} bytes"
    return None


def ensure_layout(data_dir: str) -> str:
    """Create the folders, load or create the node id (the store takes the folder lock)."""
    for sub in ("tmp", "rbw", "finalized"):
        make_private_folder(os.path.join(data_dir, sub))
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
