"""Block reports on the metadata server: full reports (in chunks) and incremental ones, applied
to the blocks map and the block servers' invalidate sets (HDFS ``BlockManager.processReport``
and ``processIncrementalBlockReport``).

Why it exists: what a block server holds is only known from its reports; this is the one
place that turns them into replica locations. The RPC handlers of ``meta/protocols/datanode.py``
only check the caller and the arguments, then call ``BlockReports``.

Full reports: a block server sends its replicas in chunks of ``block_report_chunk`` entries
under one ``report_id`` (``chunk`` counts from 0, ``last`` marks the end; ``report_id``
None is the one-call form). Per chunk:

1. The node's chunks are handled one at a time (a lock per node).
2. A chunk that is not the next one of the current report, or that continues an unknown
   report, abandons it and is refused; chunk 0 of a new report id abandons an unfinished
   older one.
3. Every entry is added to the blocks map; a replica of no file goes to the node's
   invalidate set, corrupt ones are counted, corrupt replicas of a block that has enough good
   copies are invalidated. The ids seen are remembered.
4. After the ``last`` chunk, the node's replicas the report did not list leave the blocks
   map, and handed-out INVALIDATEs the report confirms are done; the node is marked as
   having reported in the takeover epoch the report started in (``DatanodeManager
   .start_epoch``: deletions wait for such a report).

An abandoned report (a newer report id, the node's re-registration or death: ``abandon``)
removes nothing. Work is cut into ``step`` entries between two checkpoints of the trio
thread, after each of which the report is checked to be still current.

Stamps: a replica with an older stamp than its block's is stale (corrupt: invalidated once
good copies replace it), for a finished block as for one being written; one at the stamp
of the block's pending patch (``BlockInfo.patch_gs``) is pending, a copy of the patch's
version; one at any other newer stamp (a patch superseded by a later one, or dropped by
lease recovery) is stale (``blocks.classify_replica``).

Incremental reports (``incremental``): received replicas are added (the node's pending
INVALIDATE of the block is decided again), deleted ones removed.

A follower (metadata HA: a standby or observer, ``following()`` true) gets every block
server's reports too, but its namespace trails the active's by the replicated log: a replica
of a block it does not know yet, or with a newer generation stamp than it knows, is what the
log will explain a moment later, never a replica of no file. Such entries wait in
``pending`` (HDFS PendingDataNodeMessages) and are applied by ``retry_pending`` once the
follower has applied more of the log; they are never invalidated. A new active drops what
is still pending (``drop_pending``): every block server sends it a fresh full report.

``on_change`` (the server's safe-mode update) runs after every piece that may have changed
the block counts.

Concurrency contract: runs on the metadata server's trio thread; the blocks map and the
datanode manager are changed only between awaits; ``full_report`` awaits only its per-node
lock and the checkpoints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import trio

from fs.errors import InvalidArgument

from .blocks import BlockInfo, BlocksMap
from .datanodes import DatanodeManager

log = logging.getLogger(__name__)

#: one report entry: (block id, generation stamp, bytes, replica state)
Entry = tuple[int, int, int, str]


def parse_entries(entries, what: str) -> list[Entry]:
    """Report entries ``[id, gs, num_bytes, state]`` checked and as tuples."""
    if not isinstance(entries, list):
        raise InvalidArgument(f"{what} must be a list of [id, gs, num_bytes, state]")
    out = []
    for entry in entries:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 4
                and all(isinstance(x, int) and not isinstance(x, bool) for x in entry[:3])
                and isinstance(entry[3], str)):
            raise InvalidArgument(f"{what}: bad entry {entry!r:.80} "
                                  f"(want [id, gs, num_bytes, state])")
        out.append((entry[0], entry[1], entry[2], entry[3]))
    return out


@dataclass
class FullReport:
    """A full block report of one node being received chunk by chunk."""

    report_id: str | None        # None: the one-call form
    next_chunk: int = 0
    seen: dict[int, int] = field(default_factory=dict)   # block id → reported gs
    doomed: int = 0              # replicas of no file (invalidated)
    pending: int = 0             # replicas a follower does not know yet (``pending``)
    corrupt: int = 0
    removed: int = 0             # replicas the node held but the report did not list
    epoch: int = 0               # ``DatanodeManager.report_epoch`` when it started


# block report entries validated / processed between two checkpoints of the trio thread
# (also the step of the metadata server's other long walks)
REPORT_STEP = 2000
# the most replicas a follower keeps waiting for the log (the oldest go first)
MAX_PENDING = 1_000_000
_PENDING = object()   # ``_add_replica``: the replica waits for the log


def _explained(info: BlockInfo, gs: int) -> bool:
    """Does what a follower applied so far explain stamp ``gs`` of a replica of ``info``:
    the block's stamp or older, or its pending patch's?"""
    return gs <= info.gs or gs == info.patch_gs


class BlockReports:
    """Applies block reports to ``blocks`` and ``datanodes``; see the module docstring."""

    def __init__(self, blocks: BlocksMap, datanodes: DatanodeManager,
                 on_change: Callable[[], None], *, step: int = REPORT_STEP,
                 following: Callable[[], bool] = lambda: False):
        self.blocks = blocks
        self.following = following
        self.datanodes = datanodes
        self.on_change = on_change
        self.step = max(1, step)
        self.clear()

    def clear(self) -> None:
        """Forget every report in progress and every replica waiting for the log (the
        blocks map is rebuilt from the store): in place, as ``BlocksMap.clear``."""
        # (node id, block id) → entry: replicas a follower waits for the log to explain
        self.pending: dict[tuple[str, int], Entry] = {}
        self._reports: dict[str, FullReport] = {}      # node id → unfinished full report
        self._locks: dict[str, trio.Lock] = {}         # node id → one chunk at a time
        # block id → set at the next incremental report of one of its replicas (a
        # ``complete`` waits for the first)
        self._waiters: dict[int, trio.Event] = {}

    def waiter(self, block_id: int) -> trio.Event:
        """An event set at the next incremental report of a replica of ``block_id``; taken
        before the caller lets its lock go, so a report arriving in between is not missed."""
        event = self._waiters.get(block_id)
        if event is None:
            event = self._waiters[block_id] = trio.Event()
        return event

    # ------------------------------------------------------------------ parsing
    async def parse_entries_stepwise(self, entries, what: str) -> list[Entry]:
        """``parse_entries`` for a big list: a checkpoint every ``step`` entries."""
        if not isinstance(entries, list):
            raise InvalidArgument(f"{what} must be a list of [id, gs, num_bytes, state]")
        out: list[Entry] = []
        for start in range(0, len(entries), self.step):
            out += parse_entries(entries[start:start + self.step], what)
            if len(entries) > self.step:
                await trio.sleep(0)
        return out

    # ------------------------------------------------------------------ full reports
    def abandon(self, node_id: str) -> bool:
        """The node re-registered or died: its unfinished full report removes nothing.
        True if there was one."""
        return self._reports.pop(node_id, None) is not None

    async def full_report(self, node_id: str, entries: list[Entry], report_id: str | None = None,
                          chunk: int = 0, last: bool = True) -> FullReport:
        """Apply one chunk (steps 1-4 of the module docstring); returns the report's state
        (complete when ``last``). ``InvalidArgument`` for an out-of-order chunk, a node that
        is not live, or a report abandoned while this chunk was processed."""
        lock = self._locks.setdefault(node_id, trio.Lock())
        async with lock:
            self._require_live(node_id)   # it may have died while we waited
            report = self._reports.get(node_id)
            if report_id is None:
                report, chunk, last = self._start(node_id, None), 0, True
            elif report is not None and report.report_id == report_id:
                if chunk != report.next_chunk:
                    del self._reports[node_id]
                    raise InvalidArgument(
                        f"block_report from {node_id}: chunk {chunk} of report {report_id}, "
                        f"expected chunk {report.next_chunk}; the report is abandoned, send "
                        f"a new one")
            elif chunk != 0:
                raise InvalidArgument(
                    f"block_report from {node_id}: chunk {chunk} of report {report_id}, which "
                    f"is unknown (abandoned, or its chunk 0 never came); send a new report")
            else:
                report = self._start(node_id, report_id)
            await self._add_chunk(node_id, report, entries)
            report.next_chunk += 1
            if last:
                try:
                    await self._finish(node_id, report)
                finally:
                    if self._reports.get(node_id) is report:
                        del self._reports[node_id]
            return report

    def _require_live(self, node_id: str) -> None:
        if self.datanodes.live(node_id) is None:
            raise InvalidArgument(f"block_report: block server {node_id} is not registered "
                                  f"(register_storage first)")

    def _start(self, node_id: str, report_id: str | None) -> FullReport:
        old = self._reports.get(node_id)
        if old is not None:
            log.info("block server %s starts a new full report: report %s abandoned after "
                     "%d chunks", node_id, old.report_id, old.next_chunk)
        report = self._reports[node_id] = FullReport(report_id,
                                                     epoch=self.datanodes.report_epoch)
        return report

    def _check_alive(self, node_id: str, report: FullReport) -> None:
        if self._reports.get(node_id) is not report or self.datanodes.live(node_id) is None:
            raise InvalidArgument(f"block_report from {node_id}: report {report.report_id} "
                                  f"was abandoned while being processed (a newer report, "
                                  f"or the block server re-registered or was declared dead)")

    async def _add_chunk(self, node_id: str, report: FullReport, entries: list[Entry]) -> None:
        for start in range(0, len(entries), self.step):
            for block_id, gs, num_bytes, state in entries[start:start + self.step]:
                report.seen[block_id] = gs
                info = self._add_replica(node_id, block_id, gs, num_bytes, state)
                if info is None:
                    report.doomed += 1
                elif info is _PENDING:
                    report.pending += 1
                elif info.replicas[node_id].corrupt:
                    report.corrupt += 1
            self.on_change()
            if len(entries) > self.step:
                await trio.sleep(0)
                self._check_alive(node_id, report)

    async def _finish(self, node_id: str, report: FullReport) -> None:
        held = list(self.blocks.by_node.get(node_id, ()))
        for start in range(0, len(held), self.step):
            for block_id in held[start:start + self.step]:
                if block_id not in report.seen:
                    self.blocks.remove_replica(node_id, block_id)
                    report.removed += 1
            if len(held) > self.step:
                await trio.sleep(0)
                self._check_alive(node_id, report)
        self.datanodes.confirm_by_report(node_id, report.seen)
        self.datanodes.full_report_done(node_id, report.epoch)
        log.info("block report from %s: %d replicas in %d chunk(s), %d of no file, %d corrupt, "
                 "%d no longer held, %d waiting for the log", node_id, len(report.seen),
                 report.next_chunk, report.doomed, report.corrupt, report.removed,
                 report.pending)
        self.on_change()

    # ------------------------------------------------------------------ incremental reports
    def incremental(self, node_id: str, received: list[Entry], deleted: list[int]) -> None:
        """``block_received_and_deleted`` of a live node (entries already parsed)."""
        for block_id, gs, num_bytes, state in received:
            self.datanodes.cancel_invalidate(node_id, block_id)   # decided again below
            self._add_replica(node_id, block_id, gs, num_bytes, state)
            if self._waiters:
                event = self._waiters.pop(block_id, None)
                if event is not None:
                    event.set()
        for block_id in deleted:
            self.pending.pop((node_id, block_id), None)
            self.blocks.remove_replica(node_id, block_id)
            self.datanodes.cancel_invalidate(node_id, block_id)
        self.on_change()

    # ------------------------------------------------------------------ followers
    def retry_pending(self) -> int:
        """A follower applied more of the log: apply the waiting replicas it now knows
        (their block, at least their stamp). Returns how many."""
        if not self.pending:
            return 0
        ready = []
        for key, entry in self.pending.items():
            info = self.blocks.get(entry[0])
            if info is not None and _explained(info, entry[1]):
                ready.append(key)
        for node_id, block_id in ready:
            _, gs, num_bytes, state = self.pending.pop((node_id, block_id))
            if self.datanodes.live(node_id) is not None:
                self._add_replica(node_id, block_id, gs, num_bytes, state)
        if ready:
            self.on_change()
        return len(ready)

    def drop_pending(self) -> int:
        """Becoming active: forget the waiting replicas (fresh full reports follow)."""
        dropped = len(self.pending)
        self.pending.clear()
        return dropped

    def _add_replica(self, node_id: str, block_id: int, gs: int, num_bytes: int,
                     state: str) -> BlockInfo | object | None:
        """One reported replica; None (and invalidated) when the block belongs to no file,
        ``_PENDING`` when a follower waits for the log to tell. Corrupt replicas of the
        block that may go now are invalidated."""
        if self.following():
            known = self.blocks.get(block_id)
            if known is None or not _explained(known, gs):
                self.pending.pop((node_id, block_id), None)   # the newest report last
                self.pending[(node_id, block_id)] = (block_id, gs, num_bytes, state)
                if len(self.pending) > MAX_PENDING:
                    del self.pending[next(iter(self.pending))]
                return _PENDING
        info = self.blocks.add_replica(node_id, block_id, gs, num_bytes, state)
        if info is None:
            self.datanodes.add_invalidate(node_id, {"id": block_id, "gs": gs,
                                                    "num_bytes": num_bytes})
            return None
        for nid, ref in self.blocks.excess_corrupt(block_id):
            self.datanodes.add_invalidate(nid, ref)
        return info
