"""The metadata server's redundancy work (HDFS BlockManager's RedundancyMonitor): what each
changed block needs (corrupt and excess replicas invalidated, too few replicas queued by
priority), TRANSFER commands for the most urgent queued blocks, pending copies that timed out,
and the end of a decommission.

Why it exists: one role per module. This is the decision side of the replication monitor;
``replication.py`` holds its queues (pure), the monitors (``monitors.py``) run the loop that
calls ``replication_pass``, and fsck and decommission (``protocols/admin.py``) read
``replica_groups`` and ``blocks_to_copy``.

``Redundancy`` is the service ``MetaServer`` builds as ``redundancy``. It owns the replication
queues (``ReplicationQueues``) and the TRANSFER commands waiting for a node's next heartbeat
(``take_transfer_commands``). Its constructor takes the blocks map, the block servers
(``datanodes``: liveness, placement, invalidate sets), the safe-mode state (no work in safe
mode), the queues' settings (``pending_timeout``, ``max_streams``) and the ``clock``. A dead
node's queued work goes with ``forget_node``.

Concurrency contract: the server's one trio thread; its state changes only synchronously
between awaits; a pass checks the changed blocks in steps of ``REPORT_STEP`` with a
checkpoint between two steps.
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from fs.errors import LeaseFSError

from ..blocks import blocks as bm
from ..blocks.blocks import BlockInfo, BlocksMap
from ..blocks import datanodes as dm
from ..blocks import replication as rq
from ..blocks.reports import REPORT_STEP
from ..blocks.safemode import SafeModeState

log = logging.getLogger(__name__)


class Redundancy:
    """Decisions of the replication monitor over the blocks map."""

    def __init__(self, *, blocks: BlocksMap, datanodes: dm.DatanodeManager,
                 safemode: SafeModeState, pending_timeout: float, max_streams: int,
                 clock: Callable[[], float]):
        self.blocks = blocks
        self.datanodes = datanodes
        self.safemode = safemode
        self.clock = clock
        self.replication = rq.ReplicationQueues(pending_timeout=pending_timeout,
                                                max_streams=max_streams)
        self._transfer_commands: dict[str, list[dict]] = {}   # node → TRANSFER commands

    def take_transfer_commands(self, node_id: str) -> list[dict]:
        """The TRANSFER commands for ``node_id``'s heartbeat reply (handed out once)."""
        return self._transfer_commands.pop(node_id, [])

    def replication_stats(self) -> dict:
        """The replication queues' counts (``ReplicationQueues.stats``)."""
        return self.replication.stats()

    def forget_node(self, node_id: str) -> None:
        """Block server ``node_id`` is dead: its TRANSFER commands go, and the copies it
        was part of are decided again."""
        self._transfer_commands.pop(node_id, None)
        self.blocks.mark_dirty(self.replication.forget_node(node_id))

    # ================================================================== repair
    # The replication monitor (``meta/blocks/replication.py`` holds its state): every changed block
    # (``BlocksMap.dirty``) is checked — corrupt replicas invalidated once a good copy can
    # replace them, surplus replicas invalidated, too few replicas queued by priority — then
    # queued blocks get TRANSFER commands for a live source (bounded streams per node), which
    # ride on that node's next heartbeat reply; the target's incremental report finishes the
    # copy; a copy not finished within ``replication_pending_timeout`` is scheduled again.

    def _replica_ref(self, info: BlockInfo, node_id: str) -> dict:
        replica = info.replicas.get(node_id)
        gs, num_bytes = (replica.gs, replica.num_bytes) if replica else (info.gs, info.num_bytes)
        return {"id": info.id, "gs": gs, "num_bytes": num_bytes}

    def replica_groups(self, info: BlockInfo) -> tuple[list[str], list[str], set[str]]:
        """(counted good replicas, good replicas on retiring nodes, chosen excess)."""
        excess = self.replication.excess_of(info.id, info.replicas)
        good = [n for n in info.good_nodes() if self.datanodes.live(n) is not None]
        normal = [n for n in good if not self.datanodes.retiring(n) and n not in excess]
        retiring = [n for n in good if self.datanodes.retiring(n)]
        return normal, retiring, excess

    def _free_target_exists(self, info: BlockInfo) -> bool:
        return any(not n.retiring and n.node_id not in info.replicas
                   for n in self.datanodes.live_nodes())

    def check_block(self, block_id: int) -> None:
        """Decide what one block needs: corrupt/excess deletions, its queue level."""
        info = self.blocks.get(block_id)
        if info is None or info.state != bm.COMPLETE:
            # being written or recovered blocks are never missing nor re-replicated
            self.replication.remove(block_id)
            return
        normal, retiring, _ = self.replica_groups(info)
        for node_id in normal + retiring:
            self.replication.target_done(block_id, node_id)
        expected = info.replication
        if info.patch_gs:
            # a block being patched is copied all the same (a database patches its block at
            # every commit: waiting for a quiet moment left it at one replica for good); a
            # copy a patch overtakes fails (the source's stamp moved) or lands at the old
            # stamp and is stale. Nothing of it is deleted until PATCH_BLOCK or PATCH_DROP
            # says which version it keeps
            self.replication.update(block_id, rq.priority(len(normal), len(retiring), expected))
            return
        corrupt = info.corrupt_nodes()
        if corrupt and normal and (len(normal) >= expected or not self._free_target_exists(info)):
            for node_id in corrupt:   # a good copy replaces it (or it blocks the only target)
                log.info("invalidating corrupt replica of block %d on %s (%s)", block_id,
                         node_id, info.replicas[node_id].reason or "reported bad")
                self.datanodes.add_invalidate(node_id, self._replica_ref(info, node_id))
        if len(normal) > expected:
            candidates = []
            for node_id in normal:
                node = self.datanodes.live(node_id)
                candidates.append((node_id, node.remaining if node else 0, False))
            victims = rq.choose_excess(candidates, len(normal) - expected)
            for node_id in victims:
                self.datanodes.add_invalidate(node_id, self._replica_ref(info, node_id))
            self.replication.add_excess(block_id, victims)
            log.info("block %d has %d replicas, %d wanted: deleting the ones on %s", block_id,
                     len(normal), expected, ", ".join(victims))
            normal = [n for n in normal if n not in victims]
        self.replication.update(block_id, rq.priority(len(normal), len(retiring), expected))

    def schedule_replications(self) -> int:
        """Hand TRANSFER commands for the most urgent queued blocks; returns how many."""
        live = self.datanodes.live_nodes()
        budget = max(1, len(live)) * self.replication.max_streams
        now = self.clock()
        scheduled = 0
        for block_id in self.replication.in_order():
            if scheduled >= budget:
                break
            if block_id in self.replication.pending:
                continue
            info = self.blocks.get(block_id)
            if info is None or info.state != bm.COMPLETE:
                self.replication.remove(block_id)
                continue
            normal, retiring, excess = self.replica_groups(info)
            need = info.replication - len(normal)
            if need <= 0:
                self.replication.update(block_id, None)
                continue
            sources = [n for n in normal + retiring if self.replication.has_stream(n)]
            if not sources:
                continue
            # HDFS prefers decommissioning nodes as sources (they take no new writes)
            sources.sort(key=lambda n: (not self.datanodes.retiring(n),
                                        self.replication.streams_of(n)))
            try:
                targets = self.datanodes.choose_targets(
                    need, excluded=set(info.replicas), block_size=info.num_bytes,
                    what=f"re-replicating block {block_id}")
            except LeaseFSError:
                continue   # no room now; the next pass tries again
            source = sources[0]
            self._transfer_commands.setdefault(source, []).append(
                {"type": "TRANSFER", "block": info.ref(),
                 "targets": [t.address for t in targets]})
            self.replication.add_pending(block_id, source, [t.node_id for t in targets], now)
            scheduled += 1
            log.info("block %d (%d/%d good): copy from %s to %s", block_id, len(normal),
                     info.replication, source, ", ".join(t.node_id for t in targets))
        return scheduled

    def _expire_pending(self) -> None:
        for pending in self.replication.timed_out(self.clock()):
            info = self.blocks.get(pending.block_id)
            log.warning("copy of block %d from %s to %s did not finish in %.0f s; "
                        "scheduling it again", pending.block_id, pending.source,
                        ", ".join(pending.waiting), self.replication.pending_timeout)
            if info is not None:
                for node_id in pending.waiting:   # a half-copied replica is garbage
                    replica = info.replicas.get(node_id)
                    if replica is not None and not replica.good:
                        self.datanodes.add_invalidate(node_id,
                                                      self._replica_ref(info, node_id))
            self.blocks.mark_dirty([pending.block_id])

    def blocks_to_copy(self, node_id: str) -> int:
        """Blocks of a decommissioning node that still lack enough replicas elsewhere."""
        left = 0
        for block_id in self.blocks.by_node.get(node_id, ()):
            info = self.blocks.get(block_id)
            if info is None:
                continue
            if info.state != bm.COMPLETE:
                left += 1
                continue
            normal, _, _ = self.replica_groups(info)
            if len(normal) < info.replication:
                left += 1
        return left

    def _check_decommission(self) -> None:
        for node in list(self.datanodes.nodes.values()):
            if node.admin != dm.DECOMMISSION_IN_PROGRESS:
                continue
            if self.blocks_to_copy(node.node_id) == 0:
                self.datanodes.finish_decommission(node)
                log.info("block server %s (%s) is decommissioned: every replica it holds "
                         "has enough copies elsewhere", node.node_id, node.address)

    async def replication_pass(self) -> None:
        """One pass of the monitor: check changed blocks, expire, schedule, decommission."""
        if self.safemode.on:
            return   # HDFS does not populate the queues in safe mode
        self._expire_pending()
        while True:
            batch = self.blocks.take_dirty(REPORT_STEP)
            if not batch:
                break
            for block_id in batch:
                self.check_block(block_id)
            await trio.sleep(0)
        self.schedule_replications()
        self._check_decommission()
