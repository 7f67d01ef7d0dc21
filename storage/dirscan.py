"""The directory scanner of a block server (HDFS ``DirectoryScanner``): reconciles the replica
map with the files in the data folder.

Why it exists: the map is a cache of the folder, built from it at start (``ReplicaStore.open``
is the start-up reconciliation). Afterwards files can vanish or be cut behind its back (an
operator's ``rm``, a failing disk, a restore from backup) or appear (replica files moved back
in). A replica the map lists but the disk lost is still reported in every block report, so the
metadata server keeps counting it and nothing re-replicates; files nobody knows of are never
reported. Reads notice lost replicas of the blocks somebody reads (``HeartbeatService.
replica_lost``); this scan finds the rest, every ``directory_scan_interval`` seconds (HDFS
``dfs.datanode.directoryscan.interval``, 6 h; 0 turns it off).

One pass (``scan_once``):

1. Sort the FINALIZED replicas of the map by the bucket folder (``finalized/subdirA``) their
   files are in, ``STEP`` replicas between two checkpoints of the trio thread. Then, bucket
   by bucket:
2. List the bucket in a worker thread (file names and sizes; nothing is changed) and compare
   its replicas with the listing, ``STEP`` at a time (pure: ``lost_candidates``): a replica
   whose files are absent, elsewhere or of other sizes may be lost. Replicas in no listed
   bucket (its folder vanished) are compared with an empty listing.
3. Each candidate is checked again, under its replica's lock, against the disk of now
   (``ReplicaStore.drop_if_lost``): the listing is not a snapshot, so a replica finalized,
   appended or deleted meanwhile is left alone. A lost one is dropped (what is left of its
   files goes to ``corrupt/``) and reported deleted at once.
4. Files in the listing whose block id the map does not know (``unknown_ids``, also in steps)
   are adopted as FINALIZED replicas if they are a consistent pair and not on their way out
   (``ReplicaStore.adopt_finalized``), and reported received.

Replicas being written (RBW, RUR, TEMPORARY) and RWR ones are left to the pipeline and block
recovery: their files are in flux or waiting for recovery.

Concurrency contract: one trio task (``run``) in the block server's trio thread; every file
operation goes to the store's worker threads; map changes happen on the trio thread, each one
re-checked after the await that preceded it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Container, Iterable, Mapping

import trio

from fs.config import Config
from fs.errors import LeaseFSError

from .layout import group_block_files, size_mismatch
from .replica_records import Replica
from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)

#: map entries (or listed block ids) compared between two checkpoints of the trio thread
STEP = 5000


@dataclass(frozen=True)
class FinalizedFiles:
    """The files of one block id found in ``finalized/`` by the directory scan (newest meta
    file; ``None``/-1 where a file is absent or vanished while being listed)."""

    block_id: int
    gs: int | None
    data_path: str | None
    meta_path: str | None
    data_size: int
    meta_size: int


def list_finalized_files(folder: str) -> list[FinalizedFiles]:
    """Every blk_ file group under ``folder`` (a part of ``finalized/``), without changing
    anything. Blocking: run it in a worker thread."""
    def size(path: str | None) -> int:
        try:
            return os.stat(path).st_size if path else -1
        except OSError:
            return -1

    out = []
    for dirpath, _dirnames, _files in os.walk(folder):
        for block_id, group in group_block_files(dirpath).items():
            gs, meta_path = max(group["metas"]) if group["metas"] else (None, None)
            out.append(FinalizedFiles(block_id, gs, group["data"], meta_path,
                                      size(group["data"]), size(meta_path)))
    return out


@dataclass(frozen=True)
class LostCandidate:
    block_id: int
    gs: int
    why: str


@dataclass(frozen=True)
class ScanSummary:
    """What one pass found: replicas dropped as lost, files adopted as replicas."""

    listed: int
    lost: tuple[int, ...]
    adopted: tuple[int, ...]

    def plus(self, other: "ScanSummary") -> "ScanSummary":
        return ScanSummary(self.listed + other.listed, self.lost + other.lost,
                           self.adopted + other.adopted)


def lost_candidates(mapped: Iterable[Replica],
                    on_disk: Mapping[int, FinalizedFiles]) -> list[LostCandidate]:
    """The mapped replicas whose files the listing does not show as the map expects (read
    on the trio thread, in the step that compares them)."""
    out = []
    for r in mapped:
        files = on_disk.get(r.block_id)
        if files is None:
            why = "no files in finalized/"
        elif files.data_path != r.data_path or files.meta_path != r.meta_path:
            why = (f"files listed as {files.data_path} and {files.meta_path}, not "
                   f"{r.data_path} and {r.meta_path}")
        else:
            why = size_mismatch(files.data_size, files.meta_size, r.num_bytes,
                                r.bytes_per_checksum)
            if why is None:
                continue
        out.append(LostCandidate(r.block_id, r.gs, why))
    return out


def unknown_ids(listed: Iterable[int], known: Container[int]) -> list[int]:
    """Listed block ids the map does not hold."""
    return [block_id for block_id in listed if block_id not in known]


class DirectoryScanner:
    """Periodic reconciliation of one store; ``reporter`` is the heartbeat service
    (``replica_lost`` and ``block_received``)."""

    def __init__(self, config: Config, store: ReplicaStore, reporter):
        self.config = config
        self.store = store
        self.reporter = reporter
        self.passes = 0

    async def run(self) -> None:
        interval = self.config.directory_scan_interval
        if interval <= 0:
            return
        while True:
            await trio.sleep(interval)
            try:
                summary = await self.scan_once()
            except (OSError, LeaseFSError) as exc:   # the next pass tries again
                log.warning("directory scan of %s failed: %s", self.store.data_dir, exc)
                continue
            self.passes += 1
            log.log(logging.WARNING if summary.lost or summary.adopted else logging.DEBUG,
                    "directory scan of %s: %d replica files listed, %d lost replicas dropped, "
                    "%d unknown replicas added", self.store.data_dir, summary.listed,
                    len(summary.lost), len(summary.adopted))

    async def scan_once(self) -> ScanSummary:
        root = os.path.join(self.store.data_dir, "finalized")
        buckets = await self.store.run_io(_subfolders, root)
        by_bucket = await self._mapped_by_bucket()
        summary = ScanSummary(0, (), ())
        for bucket in buckets:
            files = await self.store.run_io(list_finalized_files, bucket)
            summary = summary.plus(await self._reconcile(by_bucket.pop(bucket, []),
                                                         {f.block_id: f for f in files}))
        for leftover in by_bucket.values():   # in no bucket folder (e.g. one that vanished)
            summary = summary.plus(await self._reconcile(leftover, {}))
        return summary

    async def _mapped_by_bucket(self) -> dict[str, list[Replica]]:
        """The map's FINALIZED replicas by the bucket folder their files are in, so each
        bucket is compared with its own listing and no listing of the whole folder is ever
        held (fewer long-lived objects: no full garbage collection pauses the trio thread)."""
        snapshot = self.store.report_snapshot()
        by_bucket: dict[str, list[Replica]] = {}
        for start in range(0, len(snapshot), STEP):
            for replica in snapshot[start:start + STEP]:
                if replica.state is ReplicaState.FINALIZED and not replica.removed:
                    bucket = os.path.dirname(os.path.dirname(replica.data_path))
                    by_bucket.setdefault(bucket, []).append(replica)
            await trio.sleep(0)
        return by_bucket

    async def _reconcile(self, mapped: list[Replica],
                         on_disk: dict[int, FinalizedFiles]) -> ScanSummary:
        """Steps 2-4 for one bucket: its mapped replicas against its listing."""
        candidates: list[LostCandidate] = []
        for start in range(0, len(mapped), STEP):
            candidates += lost_candidates(mapped[start:start + STEP], on_disk)
            await trio.sleep(0)
        lost = []
        for candidate in candidates:
            if await self.reporter.replica_lost(candidate.block_id, candidate.gs,
                                                f"directory scan: {candidate.why}"):
                lost.append(candidate.block_id)
        listed = list(on_disk)
        adopted = []
        for start in range(0, len(listed), STEP):
            for block_id in unknown_ids(listed[start:start + STEP], self.store.replicas):
                files = on_disk[block_id]
                if files.gs is None or files.data_path is None or files.meta_path is None:
                    continue   # half a replica: the start-up scan quarantines it
                replica = await self.store.adopt_finalized(block_id, files.gs,
                                                           files.data_path, files.meta_path)
                if replica is not None:
                    adopted.append(block_id)
                    self.reporter.block_received(block_id, replica.gs, replica.num_bytes,
                                                 replica.state.value)
            await trio.sleep(0)
        return ScanSummary(len(on_disk), tuple(lost), tuple(adopted))


def _subfolders(root: str) -> list[str]:
    """The bucket folders of ``finalized/`` (the store never puts replica files directly in
    it; a mapped replica found there at start is checked by its own stat each pass)."""
    try:
        return sorted(e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
