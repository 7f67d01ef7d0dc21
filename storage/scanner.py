"""The block scanner of a block server (HDFS ``VolumeScanner``): reads every finalized
replica slowly and reports the ones whose bytes no longer match their checksums.

Why it exists: disks lie silently. A replica nobody reads can rot for months; by the time
a reader finds out, the other copies may be gone too. The scanner finds it first and reports
it with ``report_bad_blocks`` (as a reader would), so the metadata server re-replicates from a
good copy and deletes the bad one. A replica whose data or meta file is missing, shorter or
longer than the replica map says is not corrupt but lost: ``lost`` (the heartbeat service's
``replica_lost``) drops it and reports it deleted.

Pacing: one pass over all finalized replicas every ``scanner_period`` seconds, reading at most
``scanner_bytes_per_second`` (a token bucket: sleep after each piece for as long as its bytes
are worth), so scanning never competes with clients for the disk.

Concurrency contract: one trio task (``run``) in the block server's trio thread; reads go to
the store's worker threads. A replica deleted, appended or recovered during its scan is
skipped: only a replica still FINALIZED with the same stamp after the failure is reported.
A replica patched to a new version while it was being scanned (its reader's ``changed``) is
never reported: whatever mismatch was seen is the next pass's to find again.
"""

from __future__ import annotations

import logging

import trio

from fs.config import Config
from fs.datatransfer import verify_checksums
from fs.errors import (ChecksumError, LeaseFSError, ReplicaChanged, ReplicaNotFound,
                       StaleGenerationStamp)

from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)

PIECE = 256 * 1024   # bytes verified per read


class BlockScanner:
    """Verifies finalized replicas; ``report(list of (block ref, reason))`` is awaited for
    the bad ones (the heartbeat service sends them to the metadata server), ``lost(id, gs,
    reason)`` first for each (True: its files are gone or cut, it was dropped and reported
    deleted instead)."""

    def __init__(self, config: Config, store: ReplicaStore, report, lost):
        self.config = config
        self.store = store
        self.report = report
        self.lost = lost
        self.passes = 0
        self.bytes_scanned = 0
        self.bad_found = 0

    async def run(self) -> None:
        period = max(0.05, self.config.scanner_period)
        while True:
            await trio.sleep(period)
            started = trio.current_time()
            await self.scan_all()
            self.passes += 1
            log.debug("block scanner pass %d done in %.1fs", self.passes,
                      trio.current_time() - started)

    async def scan_all(self) -> int:
        """One pass; returns how many bad replicas it reported."""
        bad = []
        snapshot = [(r.block_id, r.gs, r.num_bytes) for r in self.store.report_snapshot()
                    if r.state is ReplicaState.FINALIZED]
        for block_id, gs, num_bytes in snapshot:
            reason = await self.scan_one(block_id, gs, num_bytes)
            if reason is not None and self._still_same(block_id, gs) \
                    and not await self.lost(block_id, gs, reason):
                log.warning("block scanner: replica blk_%d_%d is bad: %s", block_id, gs, reason)
                bad.append(({"id": block_id, "gs": gs, "num_bytes": num_bytes}, reason))
                if len(bad) >= 100:
                    await self._send(bad)
                    bad = []
        if bad:
            await self._send(bad)
        return self.bad_found

    async def _send(self, bad: list) -> None:
        self.bad_found += len(bad)
        try:
            await self.report(bad)
        except LeaseFSError as exc:   # the next pass finds them again
            log.warning("block scanner: could not report %d bad replicas: %s", len(bad), exc)

    def _still_same(self, block_id: int, gs: int) -> bool:
        replica = self.store.get(block_id)
        return (replica is not None and not replica.removed and replica.gs == gs
                and replica.state is ReplicaState.FINALIZED)

    async def scan_one(self, block_id: int, gs: int, num_bytes: int) -> str | None:
        """None if the replica verifies (or went away meanwhile), else why it is bad."""
        rate = max(1, self.config.scanner_bytes_per_second)
        try:
            reader = await self.store.open_reader(block_id, gs)
        except (ReplicaNotFound, StaleGenerationStamp):
            return None
        except OSError as exc:
            return f"cannot open its files: {exc.strerror or exc}"
        try:
            bpc = reader.bytes_per_checksum
            piece = max(bpc, PIECE // bpc * bpc)
            length = reader.visible_length
            for pos in range(0, length, piece):
                n = min(piece, length - pos)
                try:
                    data, sums = await self.store.run_io(reader.read, pos, n)
                    verify_checksums(data, sums, bpc, f"in blk_{block_id}_{gs}", pos)
                except ReplicaChanged:
                    return None   # patched meanwhile: a new version, scanned next pass
                except ChecksumError as exc:
                    return None if reader.changed else exc.message
                except OSError as exc:
                    if reader.changed:
                        return None
                    return f"short or unreadable file: {exc.strerror or exc}"
                self.bytes_scanned += n
                await trio.sleep(n / rate)
            size = await self.store.run_io(_data_size, reader.data_path)
            if size is not None and size != length and not reader.changed:
                return f"data file holds {size} bytes, the replica {length}"
            return None
        finally:
            await self.store.close_reader(reader)


def _data_size(path: str) -> int | None:
    import os
    try:
        return os.stat(path).st_size
    except OSError:
        return None
