"""Patching a FINALIZED replica in place under a new generation stamp: the range checks, the
chunk runs a patch rewrites, the redo file that makes it crash-atomic, the worker-thread hop
that carries it out (``patch_files``), the deferred flush (``flush_patches``, run by the
store's patch flusher) and the start-up recovery of redo files (``recover_all``).

Why it exists: the file's lease holder may write byte ranges into a block that is already
finalized (PATCH_BLOCK, ``storage/patch.py``). Readers and the metadata server must see each
replica either at its old stamp with its old bytes or at the new stamp with the new bytes,
never a mix, across any crash; and a patch that was acknowledged must survive a crash. This
file system has no reflink, so the new version is made with a redo log and an in-place apply.
A database on the mount patches once per transaction per replica, so the acknowledged path
does as few fsyncs as the crash rules allow: two.

The synchronous part (one worker-thread hop under ``replica.lock``, before the answer):

1. the redo file ``blk_<id>_<new gs>.patch`` next to the replica's files: a header (magic,
   version, block id, old and new stamp, bytes_per_checksum, new length), every touched
   chunk run (chunk-aligned offset, its whole new chunks' bytes and their CRC32Cs) and a
   trailer CRC32C over all of it; fsynced, the folder fsynced: the commit point, from here
   a restart always ends at the new version (or a later one);
2. the runs written into the data file and their CRCs into the meta file (both grown when
   the patch grows a partial last block), not fsynced;
3. the meta file renamed from the old stamp's name to the new one's (meta names carry the
   stamp), the folder not fsynced; the redo file stays, pending.

A replica whose files were named to a short-circuit reader (Hadoop's client reading them
itself, ``ReplicaStore.finalized_files``) is not written in place: that reader opened the
files without this server and cannot be stopped, so steps 2-3 make the new version in
copies instead (``apply_copied``): the data file copied to ``blk_<id>.cow`` and the meta
file to ``blk_<id>_<new gs>.meta.cow``, the runs written into the copies, the meta copy
renamed to the new stamp's meta name, the old meta name unlinked, the data copy renamed over
the data file. A reader that opened the files before keeps the old inodes, the old version
whole; one that opens the data file after the swap finds no meta file at the old stamp and
reads over data transfer (Hadoop falls back by itself). The price is a copy of the block per
patch, paid only for replicas named since the server started.

The deferred part (``flush_patches``): the store's patch flusher, every
``PATCH_FLUSH_PERIOD`` seconds, and the store before any structural change of a replica
with pending redo files (append reopen, block recovery), under ``replica.lock`` in one hop:
data file, meta file and folder fsynced, then the replica's redo files unlinked (last; the
unlinks are not fsynced, a redo file that comes back is applied again, harmlessly). A delete
or drop removes the redo files with the replica's files, after them.

So one replica may have several pending redo files (patches G0->G1->G2 ... not flushed yet),
and after a crash any part of their in-place writes and renames may be on disk. At start
(``recover_all``, called by the start-up scan before it reads ``finalized/``), per block: a
redo file whose trailer does not verify was torn in step 1 (its patch was never
acknowledged and wrote nothing in place) and is deleted; the valid ones, in increasing new
stamp, form a chain (each one's old stamp is the new stamp of the one before) ending at the
newest. If the meta file's stamp is one of the chain's, every redo of the chain is applied
again in order (also those at or below the meta file's stamp: a rename may reach the disk
without the in-place writes before it; each apply is idempotent and a later one overwrites
an earlier one where they overlap), the meta file renamed to the chain's last stamp, data,
meta and folder fsynced, the redo files unlinked: the replica comes back at the last
acknowledged version (or the one in flight, if its redo file was whole), at the last redo's
length. Redo files that do not link to the chain, or with no replica in their folder, or
whose stamps are all below the replica's, are left from patches flushed before a later
change and deleted. Newer redo files that do not link to the replica's stamp (only disk
corruption can do that) mean its files may mix versions: quarantined. Redo files match
neither replica file name pattern of ``storage/layout.py``, so no scan ever adopts or
quarantines them as replicas; nor do the ``.cow`` copies of a patch made in copies, which
the recovery deletes (a crash before the swap), and meta files left at an older stamp of the
chain (a crash between the new meta name and the unlink of the old one) are deleted after
the roll forward.

Every touched chunk is rewritten whole with its new CRC: a range that starts or ends inside
a chunk is merged with the chunk's existing bytes, which are verified against their stored
CRC first (``ChecksumError``, nothing changed: a patch never launders a corrupt chunk into a
fresh checksum).

Concurrency contract: ``check_ranges`` and the redo encoding are pure. ``patch_files``,
``flush_patches`` and the recovery block: ``patch_files`` and ``flush_patches`` run in one
worker thread while the store holds the replica's ``replica.lock``
(``ReplicaStore.patch_finalized``, ``ReplicaStore.flush_patches``), the recovery in the
start-up scan before the map exists. Readers of the replica that are already open are kept
off the files by its ``PatchGate`` during steps 2-3 and see ``patch_seq`` change (``storage/
replica_records.py``).
"""

from __future__ import annotations

import enum
import errno as _errno
import logging
import os
import re
import shutil
import struct
from dataclasses import dataclass

from fs.datatransfer import CHECKSUM_SIZE, chunk_checksums, crc32c, num_chunks
from fs.errors import ChecksumError, InvalidArgument

from .layout import (META_HEADER, data_name, decode_meta_header, fsync_dir, meta_length,
                     meta_name, meta_offset, unlink_quietly)

log = logging.getLogger(__name__)

REDO_MAGIC = b"LFSPATCH"
REDO_VERSION = 1
#: magic, version, block id, old gs, new gs, bytes_per_checksum, new length, number of runs
_REDO_HEAD = struct.Struct(">8sHqQQIQI")
#: one run: chunk-aligned offset, length of its bytes (its CRCs follow the bytes)
_RUN_HEAD = struct.Struct(">QI")
_TRAILER = struct.Struct(">I")

_PATCH_NAME = re.compile(r"^blk_(-?\d+)_(\d+)\.patch$")

#: seconds between passes of the block server's patch flusher (``ReplicaStore.
#: run_patch_flusher``): how long an acknowledged patch may live in its redo file and the
#: page cache before its in-place writes are fsynced; short enough that few redo files pile
#: up, long enough that a replica patched once per transaction costs one flush per period
PATCH_FLUSH_PERIOD = 0.5


def patch_name(block_id: int, new_gs: int) -> str:
    """The redo file of the patch that makes ``blk_<id>`` stamp ``new_gs``."""
    return f"blk_{block_id}_{new_gs}.patch"


def is_patch_name(name: str) -> bool:
    return _PATCH_NAME.match(name) is not None


@dataclass(frozen=True)
class ChunkRun:
    """Whole new chunks from the chunk-aligned ``offset``, and their packed CRC32Cs."""

    offset: int
    data: bytes
    sums: bytes


@dataclass(frozen=True)
class Redo:
    """What a redo file holds: everything steps 2-3 need, without the ranges' origin."""

    block_id: int
    old_gs: int
    new_gs: int
    bytes_per_checksum: int
    num_bytes: int            # the replica's length after the patch
    runs: tuple[ChunkRun, ...]


def check_ranges(name: str, ranges, num_bytes: int, max_length: int) -> int:
    """The replica's length after writing ``ranges`` (``(offset, data)``, sorted, not
    overlapping, none empty, each starting at or before ``num_bytes`` (no hole) and ending
    at or before ``max_length``, the block size); ``InvalidArgument`` naming the block and
    the range otherwise."""
    if not ranges:
        raise InvalidArgument(f"patch of {name}: no ranges")
    end = num_bytes
    previous = -1
    for offset, data in ranges:
        length = len(data)
        where = f"patch of {name}: range [{offset}, {offset + length})"
        if offset < 0 or length <= 0:
            raise InvalidArgument(f"{where} is empty or starts before 0")
        if offset < previous:
            raise InvalidArgument(f"{where} overlaps the range before it or is out of order")
        if offset > num_bytes:
            raise InvalidArgument(f"{where} would leave a hole: the replica holds "
                                  f"{num_bytes} bytes")
        if offset + length > max_length:
            raise InvalidArgument(f"{where} ends past the block size {max_length}")
        previous = offset + length
        end = max(end, previous)
    return end


def plan_runs(data_fd: int, meta_fd: int, ranges, bpc: int, old_length: int,
              new_length: int, name: str) -> list[ChunkRun]:
    """The chunk runs that write ``ranges`` (checked by ``check_ranges``): every touched
    chunk whole, its untouched bytes read from the data file and verified against their
    stored CRC (``ChecksumError`` if they do not match). Blocking."""
    covered: dict[int, int] = {}   # chunk index -> bytes of it the ranges write
    for offset, data in ranges:
        pos, end = offset, offset + len(data)
        while pos < end:
            index = pos // bpc
            stop = min(end, (index + 1) * bpc)
            covered[index] = covered.get(index, 0) + stop - pos
            pos = stop
    runs: list[ChunkRun] = []
    indexes = sorted(covered)
    groups: list[list[int]] = []
    for index in indexes:
        if groups and groups[-1][-1] + 1 == index:
            groups[-1].append(index)
        else:
            groups.append([index])
    ranges = list(ranges)
    first = 0   # ranges and groups are both in order: each group's ranges start here
    for group in groups:
        start = group[0] * bpc
        stop = min((group[-1] + 1) * bpc, new_length)
        buf = bytearray(stop - start)
        for index in group:
            c_start = index * bpc
            c_stop = min(c_start + bpc, new_length)
            if covered[index] == c_stop - c_start:
                continue   # every byte of it is new: nothing to keep
            old_stop = min(c_start + bpc, old_length)
            if old_stop <= c_start:
                continue   # cannot happen for checked ranges (no holes); nothing to keep
            old = os.pread(data_fd, old_stop - c_start, c_start)
            stored = os.pread(meta_fd, CHECKSUM_SIZE, meta_offset(index))
            if len(old) != old_stop - c_start or len(stored) != CHECKSUM_SIZE:
                raise OSError(_errno.EIO, f"{name}: files shorter than its {old_length} bytes")
            got = crc32c(old)
            if got.to_bytes(CHECKSUM_SIZE, "big") != stored:
                raise ChecksumError(f"patch of {name}: the chunk at offset {c_start} it "
                                    f"would keep part of does not match its checksum "
                                    f"(crc32c {got:#010x} != {int.from_bytes(stored, 'big'):#010x})"
                                    f"; the replica is corrupt, not patched")
            buf[c_start - start:old_stop - start] = old
        while first < len(ranges) and ranges[first][0] + len(ranges[first][1]) <= start:
            first += 1
        for offset, data in ranges[first:]:
            if offset >= stop:
                break
            lo, hi = max(offset, start), min(offset + len(data), stop)
            if lo < hi:
                buf[lo - start:hi - start] = memoryview(data)[lo - offset:hi - offset]
        data = bytes(buf)
        runs.append(ChunkRun(start, data, chunk_checksums(data, bpc)))
    return runs


# --------------------------------------------------------------------------- redo files


def encode_redo(redo: Redo) -> bytes:
    parts = [_REDO_HEAD.pack(REDO_MAGIC, REDO_VERSION, redo.block_id, redo.old_gs, redo.new_gs,
                             redo.bytes_per_checksum, redo.num_bytes, len(redo.runs))]
    for run in redo.runs:
        parts += [_RUN_HEAD.pack(run.offset, len(run.data)), run.data, run.sums]
    body = b"".join(parts)
    return body + _TRAILER.pack(crc32c(body))


def decode_redo(raw: bytes) -> Redo:
    """A redo file's content; ``ValueError`` when it is torn or not one of ours."""
    if len(raw) < _REDO_HEAD.size + _TRAILER.size:
        raise ValueError(f"redo file of {len(raw)} bytes is too short")
    body, (trailer,) = raw[:-_TRAILER.size], _TRAILER.unpack(raw[-_TRAILER.size:])
    if crc32c(body) != trailer:
        raise ValueError("redo file trailer does not match its content (torn write)")
    magic, version, block_id, old_gs, new_gs, bpc, num_bytes, n = _REDO_HEAD.unpack_from(body)
    if magic != REDO_MAGIC or version != REDO_VERSION:
        raise ValueError(f"not a version {REDO_VERSION} redo file")
    pos, runs = _REDO_HEAD.size, []
    for _ in range(n):
        offset, length = _RUN_HEAD.unpack_from(body, pos)
        pos += _RUN_HEAD.size
        n_sums = CHECKSUM_SIZE * num_chunks(length, bpc)
        if pos + length + n_sums > len(body) or offset % bpc:
            raise ValueError("redo file run out of bounds or not chunk-aligned")
        runs.append(ChunkRun(offset, body[pos:pos + length], body[pos + length:pos + length + n_sums]))
        pos += length + n_sums
    if pos != len(body):
        raise ValueError("redo file has bytes after its last run")
    return Redo(block_id, old_gs, new_gs, bpc, num_bytes, tuple(runs))


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(_errno.ENOSPC, "short write: the disk is full")
        view, offset = view[n:], offset + n


def _write_redo(path: str, raw: bytes) -> None:
    """Step 1: the redo file, fsynced, its folder fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _pwrite_all(fd, raw, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path))


def apply_runs(data_path: str, meta_path: str, redo: Redo, check_length: bool = True) -> None:
    """Step 2: the runs' bytes and CRCs written in place (files grown as needed), not
    fsynced (the redo file is the durable copy until the flush), then checked to have the
    lengths of ``redo.num_bytes`` (``check_length``: off for all but the last redo of a
    chain re-applied at start, whose files may already be longer). Idempotent."""
    bpc = redo.bytes_per_checksum
    data_fd = os.open(data_path, os.O_RDWR)
    try:
        meta_fd = os.open(meta_path, os.O_RDWR)
        try:
            header = os.pread(meta_fd, META_HEADER.size, 0)
            if decode_meta_header(header) != bpc:
                raise ValueError(f"{meta_path}: bytes_per_checksum is not the redo file's {bpc}")
            for run in redo.runs:
                _pwrite_all(data_fd, run.data, run.offset)
                _pwrite_all(meta_fd, run.sums, meta_offset(run.offset // bpc))
            data_size, meta_size = os.fstat(data_fd).st_size, os.fstat(meta_fd).st_size
        finally:
            os.close(meta_fd)
    finally:
        os.close(data_fd)
    if check_length and (data_size != redo.num_bytes
                         or meta_size != meta_length(redo.num_bytes, bpc)):
        raise OSError(_errno.EIO, f"after the patch the data file holds {data_size} bytes and "
                                  f"the meta file {meta_size}, not {redo.num_bytes} bytes and "
                                  f"their checksums")


#: the suffix of a copy-on-write patch's new files before they take the replica's names
#: (``apply_copied``): never a replica file name pattern
COPY_SUFFIX = ".cow"
_COPY_NAME = re.compile(r"^blk_(-?\d+)(?:_\d+\.meta)?\.cow$")


def copy_names(data_path: str, new_meta: str) -> tuple[str, str]:
    """The copies a patch made in copies writes before the swap."""
    return data_path + COPY_SUFFIX, new_meta + COPY_SUFFIX


def _copy_file(src: str, dst: str) -> None:
    shutil.copyfile(src, dst)   # in the kernel where it can (sendfile)


def apply_copied(data_path: str, meta_path: str, new_meta: str, redo: Redo,
                 stop_after: "Step | None" = None) -> None:
    """Steps 2-3 for a replica named to a short-circuit reader (see the module docstring):
    the new version in copies of the files, then swapped in: the meta copy renamed to
    ``new_meta``, ``meta_path`` unlinked, the data copy renamed over ``data_path``. None of it
    fsynced (the redo file decides the version after a crash, as for a patch in place).
    ``stop_after`` (tests): ``Step.APPLY`` stops with the copies written, ``Step.NEW_META``
    with both meta names present, ``Step.OLD_META_GONE`` before the data swap."""
    data_copy, meta_copy = copy_names(data_path, new_meta)
    try:
        _copy_file(data_path, data_copy)
        _copy_file(meta_path, meta_copy)
        apply_runs(data_copy, meta_copy, redo)
    except BaseException:
        unlink_quietly(data_copy)
        unlink_quietly(meta_copy)
        raise
    if stop_after is Step.APPLY:
        return
    os.replace(meta_copy, new_meta)
    if stop_after is Step.NEW_META:
        return
    os.unlink(meta_path)
    if stop_after is Step.OLD_META_GONE:
        return
    os.replace(data_copy, data_path)


def _roll_forward(job: "PatchJob", redo: Redo) -> None:
    """A patch whose steps 2-3 failed midway, made whole from the redo in memory: the
    copies (if any) removed, the runs written in place into whichever meta file is there
    (the new stamp's, if the swap got that far), and the meta file at the new name only."""
    for path in copy_names(job.data_path, job.new_meta):
        unlink_quietly(path)
    if os.path.exists(job.new_meta):
        apply_runs(job.data_path, job.new_meta, redo)
        unlink_quietly(job.meta_path)
    else:
        apply_runs(job.data_path, job.meta_path, redo)
        _commit(job.meta_path, job.new_meta)


def _commit(old_meta: str, new_meta: str) -> None:
    """Step 3: the meta file renamed to the new stamp's name (not fsynced: the redo file
    already decides the version after a crash)."""
    os.replace(old_meta, new_meta)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_patches(data_path: str, meta_path: str, redo_paths: list[str]) -> None:
    """The deferred half of patches already acknowledged: data and meta file fsynced, their
    folder fsynced (the meta file's new name), then the redo files unlinked, last, so a
    crash never leaves the unlinks without the data they stood for. The unlinks are not
    fsynced: a redo file that comes back after a crash is applied again, which is harmless.
    Blocking; the caller holds the replica's lock."""
    _fsync_path(data_path)
    _fsync_path(meta_path)
    fsync_dir(os.path.dirname(meta_path))
    for path in redo_paths:
        unlink_quietly(path)


def reapply_and_flush(data_path: str, meta_path: str, redo_paths: list[str]) -> None:
    """A flush that failed, once more: the redo files (in order) written in place again,
    then flushed. Blocking; the caller holds the replica's lock."""
    redos = []
    for path in redo_paths:
        with open(path, "rb") as fh:
            redos.append(decode_redo(fh.read()))
    for i, redo in enumerate(redos):
        apply_runs(data_path, meta_path, redo, check_length=i == len(redos) - 1)
    flush_patches(data_path, meta_path, redo_paths)


# --------------------------------------------------------------------------- the live patch


class Step(str, enum.Enum):
    """The steps of a patch's synchronous part, in order (``patch_files``'s ``stop_after``,
    for tests)."""

    REDO = "redo"
    APPLY = "apply"
    COMMIT = "commit"
    # a patch made in copies only (``apply_copied``)
    NEW_META = "new_meta"
    OLD_META_GONE = "old_meta_gone"


class PatchBroken(Exception):
    """A patch failed after it began rewriting the files in place and could not be rolled
    forward either: the replica's bytes may not match its checksums; ``cause`` is the first
    failure. The store drops the replica and quarantines its files."""

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause


@dataclass
class PatchJob:
    """What one patch works on (snapshotted on the trio thread under the replica's lock)."""

    block_id: int
    old_gs: int
    new_gs: int
    bytes_per_checksum: int
    data_path: str
    meta_path: str
    num_bytes: int
    new_length: int
    ranges: list
    #: make the new version in copies (the replica's files were named to a short-circuit
    #: reader), not in place
    copy: bool = False

    @property
    def name(self) -> str:
        return f"blk_{self.block_id}_{self.old_gs}"

    @property
    def folder(self) -> str:
        return os.path.dirname(self.data_path)

    @property
    def new_meta(self) -> str:
        return os.path.join(os.path.dirname(self.meta_path), meta_name(self.block_id, self.new_gs))

    @property
    def redo_path(self) -> str:
        return os.path.join(self.folder, patch_name(self.block_id, self.new_gs))


def patch_files(job: PatchJob, replica, stop_after: Step | None = None) -> None:
    """Steps 1-3 for ``job`` (blocking: one worker thread, under ``replica.lock``); the
    redo file stays, the caller adds it to the replica's pending ones for the flush.
    ``replica`` is the map's ``Replica``: its ``patch_seq`` goes odd before step 2 and even
    after step 3, its ``PatchGate`` is held for steps 2-3. ``stop_after`` stops after that
    step, leaving the files as a crash there would (tests only).

    Failures: in step 1 (or before), nothing changed (the redo file is removed); in steps
    2-3 the patch is rolled forward from the redo in memory once more, and if that fails
    too ``PatchBroken`` (the caller drops the replica)."""
    with open(job.data_path, "rb", buffering=0) as data, \
            open(job.meta_path, "rb", buffering=0) as meta:
        runs = plan_runs(data.fileno(), meta.fileno(), job.ranges, job.bytes_per_checksum,
                         job.num_bytes, job.new_length, job.name)
    redo = Redo(job.block_id, job.old_gs, job.new_gs, job.bytes_per_checksum, job.new_length,
                tuple(runs))
    raw = encode_redo(redo)
    try:
        _write_redo(job.redo_path, raw)
    except BaseException:
        unlink_quietly(job.redo_path)
        raise
    if stop_after is Step.REDO:
        return
    gate = replica.gate()   # made by the store on the trio thread already
    gate.begin_write()
    replica.patch_seq += 1   # odd: the files are in flux (a plain int write under the GIL)
    try:
        try:
            if job.copy:
                apply_copied(job.data_path, job.meta_path, job.new_meta, redo, stop_after)
            else:
                apply_runs(job.data_path, job.meta_path, redo)
                if stop_after is Step.APPLY:
                    return
                _commit(job.meta_path, job.new_meta)
        except (OSError, ValueError) as first:
            log.error("patch of %s to stamp %d failed while rewriting its files (%s); "
                      "applying it again", job.name, job.new_gs, first)
            try:
                _roll_forward(job, redo)
            except (OSError, ValueError) as again:
                raise PatchBroken(f"patch of {job.name} to stamp {job.new_gs} failed and "
                                  f"could not be rolled forward: {first}; then {again}",
                                  first) from again
    finally:
        replica.patch_seq += 1   # a reader of the old version sees it changed in any case
        gate.end_write()


# --------------------------------------------------------------------------- start-up


class Recovery(str, enum.Enum):
    """What the start-up recovery did with a redo file."""

    TORN = "torn"                   # deleted: its patch was never acknowledged
    ROLLED_FORWARD = "rolled_forward"   # applied again; the replica is at its chain's end
    DONE = "done"                   # deleted: the replica's stamp is past every redo of it
    OBSOLETE = "obsolete"           # deleted: no replica it links to in its folder
    BROKEN = "broken"               # roll forward failed: replica files quarantined


def find_redo_files(root: str) -> list[str]:
    """Every redo file under ``root`` (``finalized/``). Blocking."""
    out = []
    for dirpath, _dirnames, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in sorted(files) if is_patch_name(f)]
    return out


def recover_all(root: str, quarantine) -> list[tuple[str, Recovery]]:
    """Resolve every redo file under ``root`` (``finalized/``), one block at a time
    (``recover_block``). Blocking; runs before the replica map exists."""
    groups: dict[tuple[str, int], list[str]] = {}
    for path in find_redo_files(root):
        m = _PATCH_NAME.match(os.path.basename(path))
        groups.setdefault((os.path.dirname(path), int(m.group(1))), []).append(path)
    out: list[tuple[str, Recovery]] = []
    for (folder, block_id), paths in sorted(groups.items()):
        out += recover_block(folder, block_id, paths, quarantine)
    return out


def _read_redo(path: str) -> Redo:
    m = _PATCH_NAME.match(os.path.basename(path))
    with open(path, "rb") as fh:
        redo = decode_redo(fh.read())
    if m is None or int(m.group(1)) != redo.block_id or int(m.group(2)) != redo.new_gs:
        raise ValueError("redo file content does not match its name")
    return redo


def recover_block(folder: str, block_id: int, paths: list[str],
                  quarantine) -> list[tuple[str, Recovery]]:
    """Resolve the redo files ``paths`` of ``blk_<block_id>`` in ``folder`` (see the module
    docstring); ``quarantine(paths, why)`` moves a replica's files aside when a roll forward
    fails or its files may hold a mix of versions. Blocking; runs before the map exists."""
    out: list[tuple[str, Recovery]] = []
    for name in os.listdir(folder):   # a patch made in copies that the crash cut short
        copy = _COPY_NAME.match(name)
        if copy is not None and int(copy.group(1)) == block_id:
            log.info("copy %s of a patch cut short by a crash: removed", name)
            unlink_quietly(os.path.join(folder, name))
    valid: list[tuple[Redo, str]] = []
    for path in paths:
        try:
            valid.append((_read_redo(path), path))
        except (OSError, ValueError) as exc:
            # only a patch being written at the crash, never acknowledged (its in-place
            # writes start after the redo file is durable)
            log.warning("redo file %s is torn or unreadable (%s): removed, its patch never "
                        "happened", path, exc)
            unlink_quietly(path)
            out.append((path, Recovery.TORN))
    if not valid:
        return out
    valid.sort(key=lambda item: item[0].new_gs)

    def drop(items, outcome: Recovery, why: str) -> None:
        for redo, path in items:
            log.warning("redo file %s (stamp %d -> %d): %s; removed", path, redo.old_gs,
                        redo.new_gs, why)
            unlink_quietly(path)
            out.append((path, outcome))

    data_path = os.path.join(folder, data_name(block_id))
    stamps = []
    prefix = f"blk_{block_id}_"
    for name in os.listdir(folder):
        if name.startswith(prefix) and name.endswith(".meta"):
            try:
                stamps.append(int(name[len(prefix):-len(".meta")]))
            except ValueError:
                pass
    if not stamps or not os.path.exists(data_path):
        drop(valid, Recovery.OBSOLETE, f"no replica of blk_{block_id} in {folder}")
        return out
    current = max(stamps)
    # the chain of patches ending at the newest redo: each one's old stamp is the new stamp
    # of the one before; redo files below a break are left from patches flushed long ago
    chain = [valid[-1]]
    for item in reversed(valid[:-1]):
        if item[0].new_gs == chain[0][0].old_gs:
            chain.insert(0, item)
    unlinked = [item for item in valid if all(item is not c for c in chain)]
    chain_stamps = [chain[0][0].old_gs] + [redo.new_gs for redo, _ in chain]
    if current not in chain_stamps:
        if current > chain_stamps[-1]:
            drop(valid, Recovery.DONE, f"the replica is at stamp {current} already")
            return out
        # newer patches than the replica's stamp that do not link to it: its files may hold
        # their in-place writes under the old name (a redo file lost to disk corruption)
        meta_path = os.path.join(folder, meta_name(block_id, current))
        quarantine([data_path, meta_path] + [path for _, path in valid],
                   f"redo files of blk_{block_id} up to stamp {chain_stamps[-1]} do not "
                   f"link to its stamp {current}: its files may mix versions")
        out += [(path, Recovery.BROKEN) for _, path in valid]
        return out
    drop(unlinked, Recovery.OBSOLETE, f"it does not link to the chain of patches of "
                                      f"blk_{block_id} at stamp {current}")
    # every redo of the chain applied, also those at or below the meta file's stamp: its
    # rename may have reached the disk without the in-place writes that preceded it
    last = chain[-1][0]
    old_meta = os.path.join(folder, meta_name(block_id, current))
    new_meta = os.path.join(folder, meta_name(block_id, last.new_gs))
    redo_paths = [path for _, path in chain]
    try:
        for i, (redo, _path) in enumerate(chain):
            apply_runs(data_path, old_meta, redo, check_length=i == len(chain) - 1)
        if old_meta != new_meta:
            os.replace(old_meta, new_meta)
        for stamp in stamps:   # a patch made in copies: the old name not yet unlinked
            if stamp in chain_stamps and stamp != last.new_gs:
                unlink_quietly(os.path.join(folder, meta_name(block_id, stamp)))
        flush_patches(data_path, new_meta, redo_paths)
    except (OSError, ValueError) as exc:
        quarantine([data_path, old_meta, new_meta] + redo_paths,
                   f"patches of blk_{block_id} from stamp {chain_stamps[0]} to {last.new_gs} "
                   f"could not be rolled forward: {exc}")
        out += [(path, Recovery.BROKEN) for path in redo_paths]
        return out
    out += [(path, Recovery.ROLLED_FORWARD) for path in redo_paths]
    log.info("patches of blk_%d from stamp %d to %d rolled forward from %d redo file(s) "
             "(its meta file was at stamp %d)", block_id, chain_stamps[0], last.new_gs,
             len(chain), current)
    return out
