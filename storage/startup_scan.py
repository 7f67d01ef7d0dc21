"""The start-up scan of a block server's data folder: rebuild the replica list from the files,
repairing what a crash can leave behind (temporaries removed, RBW replicas cut back to the
length their checksums cover, a finalize cut between its two renames completed, patches'
redo files rolled forward or removed, broken finalized replicas moved to ``corrupt/``, meta
files of older generation stamps removed).

Why it exists: the replica map is only a cache of the folder (``ReplicaStore.open`` turns
what this scan finds into map entries, RBW ones as RWR); the repair rules for each folder of
the layout (``storage/layout.py``) are kept together here.

Concurrency contract: ``scan_data_dir`` blocks and runs once, in a worker thread, while the
store holds the folder lock and before its map exists, so nothing else touches the folder
meanwhile.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from fs.datatransfer import CHECKSUM_SIZE, crc32c

from .layout import (META_HEADER, data_name, decode_meta_header, finalized_consistent,
                     finalized_subdir, group_block_files, meta_length, meta_offset,
                     quarantine_files, unlink_quietly)
from .patching import recover_all
from .replica_states import ReplicaState

log = logging.getLogger(__name__)


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
    #: redo files of patches found, and what became of each (``storage.patching.Recovery``)
    patches: list[tuple[str, str]] = field(default_factory=list)


def _newest_meta(block_id: int, group: dict, result: ScanResult) -> tuple[int, str] | None:
    """Keep the meta file with the highest GS, remove older ones (left by a GS bump)."""
    metas = sorted(group["metas"])
    for _gs, path in metas[:-1]:
        unlink_quietly(path)
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
            unlink_quietly(entry.path)
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
                unlink_quietly(newest[1])
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
                unlink_quietly(data_path)
                result.orphans_removed.append(data_path)
            continue
        gs, meta_path = newest
        try:
            bpc, before, after = _trim_rbw(block_id, data_path, meta_path)
        except (OSError, ValueError) as exc:
            log.warning("removing unreadable RBW replica blk_%d: %s", block_id, exc)
            for p in (data_path, meta_path):
                unlink_quietly(p)
                result.orphans_removed.append(p)
            continue
        if after != before:
            result.rbw_trimmed.append((block_id, before, after))
            log.info("RBW replica blk_%d_%d cut from %d to %d bytes (torn last chunk)",
                     block_id, gs, before, after)
        found[block_id] = ScannedReplica(block_id, gs, ReplicaState.RBW, bpc, data_path,
                                         meta_path, after)

    # --- patches cut by the crash, before finalized/ is read: each replica at one version
    result.patches += [(path, outcome.value) for path, outcome in recover_all(fin, quarantine)]

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
                        unlink_quietly(p)
                        result.orphans_removed.append(p)
                    continue
                for p in (loser.data_path, loser.meta_path):
                    unlink_quietly(p)
                    result.orphans_removed.append(p)
            found[block_id] = ScannedReplica(block_id, gs, ReplicaState.FINALIZED, bpc,
                                             data_path, meta_path, length)
    result.replicas = list(found.values())
    return result

