"""The replication monitor's state: which blocks need copies, which copies are under way,
which replicas are surplus (HDFS ``LowRedundancyBlocks`` + ``PendingReconstructionBlocks`` +
the excess-replica choice of ``BlockPlacementPolicyDefault``).

Why it exists: a block server that dies, a corrupt replica, ``setrep`` up or down and
decommission all end the same way: some blocks have too few good replicas (copy them) or
too many (delete some). Keeping that decision in one pure place means every cause goes
through the same queue and the same excess logic.

* ``priority(live, decommissioning, expected)``: HDFS's priority levels. ``HIGHEST``: one
  live replica left, or only replicas on decommissioning nodes; ``VERY_UNDER``: fewer than a
  third of the expected copies; ``UNDER``: the rest; ``NO_SOURCE``: no good replica at all
  (missing / only corrupt copies: nothing to copy from, listed for the report only).
  ``None``: enough copies.
* The queue: one FIFO per level (``dict`` keeps insertion order); ``in_order()`` walks the
  most urgent level first. A block is in at most one level.
* Pending replications: a TRANSFER handed to a source node, with its targets and the time it
  was scheduled. A target that reports the replica is done; a replication not finished after
  ``pending_timeout`` is dropped (``timed_out``) so the caller requeues it — the source may
  have died or the command may have been lost. Each pending copy holds one stream of its
  source; ``streams_of`` bounds the work per node (``max_streams``).
* Excess: replicas chosen for deletion are remembered per block until their node no longer
  holds them, so a later check cannot pick a *different* victim and delete every copy.
  ``choose_excess`` prefers replicas on decommissioning nodes, then on the fullest nodes.

Concurrency contract: plain data, no I/O, no clock (``now`` is passed in); called from the
metadata server's trio thread only, so every method is atomic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

HIGHEST = 0
VERY_UNDER = 1
UNDER = 2
NO_SOURCE = 3
LEVELS = (HIGHEST, VERY_UNDER, UNDER, NO_SOURCE)
LEVEL_NAMES = {HIGHEST: "highest", VERY_UNDER: "very under-replicated",
               UNDER: "under-replicated", NO_SOURCE: "no good source"}


def priority(live: int, decommissioning: int, expected: int) -> int | None:
    """The queue level of a block with ``live`` counted good replicas (plus copies under
    way), ``decommissioning`` good replicas on decommissioning nodes; None = enough."""
    if live >= expected:
        return None
    if live == 0:
        return HIGHEST if decommissioning else NO_SOURCE
    if live == 1:
        return HIGHEST
    if live * 3 < expected:
        return VERY_UNDER
    return UNDER


def choose_excess(candidates: list[tuple[str, int, bool]], count: int) -> list[str]:
    """``count`` node ids to delete a surplus replica from, out of ``(node_id, remaining
    bytes, decommissioning)``: decommissioning nodes first, then the least free space."""
    ranked = sorted(candidates, key=lambda c: (not c[2], c[1], c[0]))
    return [node_id for node_id, _, _ in ranked[:max(0, count)]]


@dataclass
class PendingReplication:
    block_id: int
    source: str
    targets: list[str]
    started: float
    done: set[str] = field(default_factory=set)

    @property
    def waiting(self) -> list[str]:
        return [t for t in self.targets if t not in self.done]


class ReplicationQueues:
    """Under-replicated queue, pending replications and chosen excess replicas."""

    def __init__(self, *, pending_timeout: float, max_streams: int):
        self.pending_timeout = pending_timeout
        self.max_streams = max(1, max_streams)
        self.levels: list[dict[int, None]] = [{} for _ in LEVELS]
        self.level_of: dict[int, int] = {}
        self.pending: dict[int, PendingReplication] = {}
        self.streams: dict[str, int] = {}
        self.excess: dict[int, set[str]] = {}
        self.scheduled_total = 0
        self.timed_out_total = 0

    # ------------------------------------------------------------------ queue
    def update(self, block_id: int, level: int | None) -> None:
        """Put the block at ``level`` (None: out of the queue)."""
        old = self.level_of.get(block_id)
        if old == level:
            return
        if old is not None:
            self.levels[old].pop(block_id, None)
            del self.level_of[block_id]
        if level is not None:
            self.levels[level][block_id] = None
            self.level_of[block_id] = level

    def remove(self, block_id: int) -> None:
        """The block is gone (deleted, or no longer COMPLETE): forget it everywhere."""
        self.update(block_id, None)
        pending = self.pending.pop(block_id, None)
        if pending is not None:
            self._release_stream(pending.source)
        self.excess.pop(block_id, None)

    def in_order(self) -> list[int]:
        """Queued blocks that may be copied, most urgent first (NO_SOURCE excluded)."""
        out: list[int] = []
        for level in (HIGHEST, VERY_UNDER, UNDER):
            out.extend(self.levels[level])
        return out

    def queued(self) -> int:
        return len(self.level_of)

    def count_at(self, level: int) -> int:
        return len(self.levels[level])

    # ------------------------------------------------------------------ pending
    def pending_targets(self, block_id: int) -> list[str]:
        pending = self.pending.get(block_id)
        return pending.waiting if pending is not None else []

    def streams_of(self, node_id: str) -> int:
        return self.streams.get(node_id, 0)

    def has_stream(self, node_id: str) -> bool:
        return self.streams_of(node_id) < self.max_streams

    def add_pending(self, block_id: int, source: str, targets: list[str], now: float) -> None:
        old = self.pending.pop(block_id, None)
        if old is not None:
            self._release_stream(old.source)
        self.pending[block_id] = PendingReplication(block_id, source, list(targets), now)
        self.streams[source] = self.streams.get(source, 0) + 1
        self.scheduled_total += 1

    def target_done(self, block_id: int, node_id: str) -> bool:
        """``node_id`` now holds a good replica; True when that finished the replication."""
        pending = self.pending.get(block_id)
        if pending is None or node_id not in pending.targets:
            return False
        pending.done.add(node_id)
        if pending.waiting:
            return False
        del self.pending[block_id]
        self._release_stream(pending.source)
        return True

    def timed_out(self, now: float) -> list[PendingReplication]:
        """Pending replications older than ``pending_timeout``: dropped and returned (the
        caller checks their blocks again, which requeues them)."""
        late = [p for p in self.pending.values() if now - p.started >= self.pending_timeout]
        for pending in late:
            del self.pending[pending.block_id]
            self._release_stream(pending.source)
            self.timed_out_total += 1
        return late

    def forget_node(self, node_id: str) -> list[int]:
        """A dead node: pending copies from it, or still waiting for it as a target, will
        never finish (they would wait ``replication_pending_timeout``): dropped, so the
        next pass schedules them again elsewhere. Returns their blocks."""
        gone = [p.block_id for p in self.pending.values()
                if p.source == node_id or node_id in p.waiting]
        for block_id in gone:
            self._release_stream(self.pending.pop(block_id).source)
        self.streams.pop(node_id, None)
        return gone

    def _release_stream(self, node_id: str) -> None:
        left = self.streams.get(node_id, 0) - 1
        if left > 0:
            self.streams[node_id] = left
        else:
            self.streams.pop(node_id, None)

    # ------------------------------------------------------------------ excess
    def excess_of(self, block_id: int, holders) -> set[str]:
        """Nodes whose replica of the block is being deleted as surplus (still held)."""
        chosen = self.excess.get(block_id)
        if not chosen:
            return set()
        chosen &= set(holders)
        if not chosen:
            del self.excess[block_id]
        return set(chosen)

    def add_excess(self, block_id: int, node_ids) -> None:
        self.excess.setdefault(block_id, set()).update(node_ids)

    def stats(self) -> dict:
        return {"queued": self.queued(),
                "by_level": {LEVEL_NAMES[level]: self.count_at(level) for level in LEVELS},
                "pending": len(self.pending), "scheduled_total": self.scheduled_total,
                "timed_out_total": self.timed_out_total,
                "excess_pending": sum(len(v) for v in self.excess.values())}
