"""Lease release and block recovery on the metadata server (HDFS ``FSNamesystem
.internalReleaseLease`` and the LeaseManager monitor's work): closing a file whose writer is
gone when its last blocks allow it, else starting block recovery of its last block, retrying
stalled recoveries, releasing leases past their hard limit, and ``recover_lease``; and
settling the patches a gone writer left pending (``settle_patches``).

Why it exists: one role per module. The decisions are pure (``meta/leases/leases.py``:
``release_decision``, ``choose_primary``, ``recovery_due``); this is the part that acts on
them with locks, journal records and RECOVER commands for block servers.

``LeaseRecovery`` is the service ``MetaServer`` builds as ``recovery``. It owns the running
recoveries (block id → ``Recovery``), the RECOVER_BLOCK commands waiting for a primary's next
heartbeat, and the files whose failed release was already logged. Its constructor takes what
it acts on: the namespace (``ns``), ``edits`` (journaling), the path ``locking``, the blocks
map, the leases, the block servers (``datanodes``; liveness picks the primary), the
``locator`` (the targets of a RECOVER command), ``min_replication`` and ``retry_after``
(``block_recovery_retry``) from the config, and the ``clock``/``wall_ns`` callables (tests
inject them). The block-server protocol reads and takes its state through ``running`` and
``take_recover_commands``; the journal's memory apply ends it through ``forget_recovery`` and
``lease_ended``.

Concurrency contract: the server's one trio thread; its state changes only synchronously
between awaits, and a release or a recovery start runs under the file's path locks (taken by
the caller, or here by the lease monitor's passes).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from typing import Callable

from fs import paths
from fs.errors import AlreadyBeingCreated, InternalError, LeaseFSError

from ..blocks import blocks as bm
from ..blocks.blocks import BlocksMap
from ..blocks.datanodes import DatanodeManager
from .locate import Locator
from ..journal.edits import Edits
from ..leases import leases as lm
from ..leases.leases import INTERNAL_HOLDER, LeaseManager
from ..namespace.locks import LOCK_WRITE, NamespaceLocking, lock_set
from ..namespace.namespace import Namespace
from ..schema import keys
from ..schema.inode import Inode

log = logging.getLogger(__name__)

# files one lease monitor pass may release (HDFS bounds the work of one checkLeases pass)
LEASE_MONITOR_MAX_FILES = 1000


@dataclass(frozen=True)
class Recovery:
    """One running block recovery (the last block of an open file); a retry replaces it."""
    ino: int
    block_id: int
    recovery_id: int
    new_length: int | None      # truncate: the length the block must get
    attempt: int                # 0 for the first, one more at each retry
    started: float              # clock() when this recovery id was handed out
    primary: str | None
    # the primaries this recovery's attempts chose since every holder last had a turn:
    # a retry picks another one (``choose_primary``)
    tried: frozenset[str] = frozenset()


class LeaseRecovery:
    """Lease release, block recovery starts and retries, ``recover_lease``."""

    def __init__(self, *, ns: Namespace, edits: Edits, locking: NamespaceLocking,
                 blocks: BlocksMap, leases: LeaseManager, datanodes: DatanodeManager,
                 locator: Locator, min_replication: int, retry_after: float,
                 clock: Callable[[], float], wall_ns: Callable[[], int]):
        self.ns = ns
        self.edits = edits
        self.locking = locking
        self.blocks = blocks
        self.leases = leases
        self.datanodes = datanodes
        self.locator = locator
        self.min_replication = min_replication
        self.retry_after = retry_after
        self.clock = clock
        self.wall_ns = wall_ns
        self._recoveries: dict[int, Recovery] = {}            # block id → running recovery
        self._recover_commands: dict[str, dict[int, dict]] = {}   # node → block id → command
        self._release_logged: set[int] = set()   # files whose failed release was logged

    def running(self, block_id: int) -> Recovery | None:
        """The running recovery of block ``block_id``, if any."""
        return self._recoveries.get(block_id)

    def take_recover_commands(self, node_id: str) -> list[dict]:
        """The RECOVER_BLOCK commands for ``node_id``'s heartbeat reply (handed out once)."""
        return list(self._recover_commands.pop(node_id, {}).values())

    def forget_recovery(self, block_id: int) -> None:
        """Block ``block_id``'s recovery ended (committed, superseded, or the block left)."""
        rec = self._recoveries.pop(block_id, None)
        if rec is not None and rec.primary is not None:
            self._recover_commands.get(rec.primary, {}).pop(block_id, None)

    def lease_ended(self, ino: int) -> None:
        """File ``ino`` is no longer under construction (closed, or its lease went)."""
        self.leases.remove_file(ino)
        self._release_logged.discard(ino)

    def _replica_count(self, block: dict) -> int:
        info = self.blocks.get(block["id"])
        if info is None:
            return 0
        if info.state in (bm.COMMITTED, bm.COMPLETE):
            return info.good_count
        # being written: the pipeline's nodes count before they report (HDFS counts the
        # expected locations), or hflushed bytes whose reports are still on the way would
        # be dropped with the "empty" last block
        return len(info.location_nodes())

    def block_state(self, block: dict) -> str:
        info = self.blocks.get(block["id"])
        return info.state if info is not None else block["state"]

    async def _internal_release_lease(self, path: str, ino: int, inode: Inode,
                                      new_holder: str | None = None) -> bool:
        """HDFS ``internalReleaseLease`` (caller holds the file's path locks): close the
        file when its last blocks allow it (True), else start block recovery and reassign
        the lease to ``new_holder`` (False; the file closes when recovery commits)."""
        if self.blocks.pending_patches(ino):
            if not await self.settle_patches(path, ino):
                raise AlreadyBeingCreated(
                    f"{path}: cannot release the lease: no block server holding a block "
                    f"with a patch under way is live to say which version it holds")
            inode = self.ns.view.get_inode(ino)
        wall = self.wall_ns()
        blocks = self.ns.view.tail_blocks(ino, inode)
        decision = lm.release_decision(
            [(self.block_state(b), b["num_bytes"], self._replica_count(b)) for b in blocks],
            self.min_replication)
        if decision == lm.CLOSE:
            await self.edits.log_plan(self.ns.planner.plan_close(ino, None, None, wall))
            log.info("lease of %s released: file closed", path)
            return True
        if decision == lm.DROP_LAST_AND_CLOSE:
            await self.edits.log_plan(self.ns.planner.plan_abandon(path, ino, blocks, blocks[-1]))
            await self.edits.log_plan(self.ns.planner.plan_close(ino, None, None, wall))
            log.info("lease of %s released: dropped an empty last block, file closed", path)
            return True
        if decision == lm.WAIT:
            raise AlreadyBeingCreated(f"{path}: cannot release the lease: committed blocks "
                                      f"are waiting to be minimally replicated")
        last = blocks[-1]
        if last["id"] not in self._recoveries:
            await self.start_block_recovery(path, ino, last)
        holder = inode.uc.holder
        if new_holder is not None and new_holder != holder:
            await self.edits.log_plan(self.ns.planner.plan_reassign_lease(ino, new_holder))
            log.info("lease of %s reassigned from %s to %s", path, holder, new_holder)
        return False

    async def settle_patches(self, path: str, ino: int, *, drops: list | None = None) -> bool:
        """End every patch pending on file ``ino`` at one version of its block (the caller
        holds the file's path locks; its writer is gone, or closes without patch_done): the
        replicas reported at the pending stamp hold the whole new version (a block server
        applies a patch atomically), so if there is one the patch commits with exactly
        those replicas and their length (PATCH_BLOCK); with none the block keeps its
        stamp and the pending one is dropped (PATCH_DROP), so a replica that reports it
        later is stale.

        Dropping needs a live replica of the old version: a block whose every holder is
        gone (declared dead before its report of the patch came) may come back holding
        only the new version, and a drop would make the block's one content stale. Such a
        patch is left pending, to be decided once a holder reports. Returns False when one
        was (the caller tries again later), True when every patch was settled.

        ``drops``: the PATCH_DROP plans are appended there instead of journaled, for the
        caller to journal in the batch of the close they precede (a drop changes no
        length, so nothing the caller checks before that depends on it)."""
        settled_all = True
        inode = self.ns.view.get_inode(ino)
        for info in self.blocks.pending_patches(ino):
            stored = self.ns.view.read(keys.block_key(ino, info.index))
            if stored is None or stored.get("id") != info.id:
                continue
            block = {**stored, "index": info.index}
            nodes = info.patched_nodes()
            if not nodes and not info.good_nodes():
                # debug: the lease monitor asks again every pass (its warning is once)
                log.debug("patch of %s block %d at stamp %d not settled: no replica of the "
                          "block is live", path, info.id, info.patch_gs)
                settled_all = False
                continue
            plan = None
            if nodes:
                # one version, one length: the replicas agreeing on the most common one
                lengths = collections.Counter(info.replicas[n].num_bytes for n in nodes)
                num_bytes = max(lengths, key=lambda n: (lengths[n], n))
                nodes = [n for n in nodes if info.replicas[n].num_bytes == num_bytes]
                try:
                    plan = self.ns.planner.plan_patch_block(
                        path, ino, inode, block, info.patch_gs, num_bytes, nodes,
                        last=info.index == (inode.nblocks or 0) - 1, now_ns=self.wall_ns(),
                        check_quota=False)
                except LeaseFSError as exc:
                    # a length no patch may give the block: not a version of it
                    log.warning("patch of %s block %d at stamp %d not committed: %s", path,
                                info.id, info.patch_gs, exc)
            if plan is None:
                log.debug("patch of %s block %d dropped: no replica reported stamp %d", path,
                          info.id, info.patch_gs)
                drop = self.ns.planner.plan_patch_drop(ino, block, info.patch_gs)
                if drops is None:
                    await self.edits.log_plan(drop)
                else:
                    drops.append(drop)
                continue
            await self.edits.log_plan(plan)
            inode = self.ns.view.get_inode(ino)
            log.info("patch of %s block %d committed by recovery: stamp %d, length %d, on %s",
                     path, info.id, plan.gs, plan.num_bytes, ", ".join(plan.nodes))
        return settled_all

    async def start_block_recovery(self, path: str, ino: int, block: dict,
                                   new_length: int | None = None) -> Recovery:
        """New recovery id (the next generation stamp, journaled), block → UNDER_RECOVERY,
        a RECOVER_BLOCK command for the primary's next heartbeat. Caller holds the path
        locks. Without a live replica holder the recovery waits for its retry."""
        previous = self._recoveries.get(block["id"])
        stamp = self.ns.planner.plan_set_genstamp()
        await self.edits.log_plan(stamp)
        recovery_id = stamp.gs
        info = self.blocks.get(block["id"])
        if info is None:
            raise InternalError(f"{path}: block {block['id']} is not in the blocks map")
        if info.state != bm.UNDER_RECOVERY:
            self.blocks.start_recovery(block["id"])
        if new_length is None and previous is not None:
            new_length = previous.new_length
        if new_length is None:
            new_length = block.get("truncate_to")   # a mid-block truncate not yet committed
        attempt = previous.attempt + 1 if previous is not None else 0
        holders = list(info.location_nodes())
        holders += [n for n, r in info.replicas.items() if not r.corrupt and n not in holders]
        live = [(n, node.last_heartbeat) for n in holders
                if (node := self.datanodes.live(n)) is not None]
        tried = previous.tried if previous is not None else frozenset()
        if {n for n, _ in live} <= tried:
            # every holder had its turn: a new round, which starts with another one than
            # the primary that just did not answer (when there is another)
            tried = frozenset({previous.primary}) if previous.primary else frozenset()
        primary = lm.choose_primary(live, tried, now=self.clock(),
                                    stale_after=self._stale_after())
        self.forget_recovery(block["id"])
        rec = Recovery(ino, block["id"], recovery_id, new_length, attempt, self.clock(), primary,
                       tried | {primary} if primary is not None else tried)
        self._recoveries[block["id"]] = rec
        if primary is not None:
            self._recover_commands.setdefault(primary, {})[block["id"]] = {
                "type": "RECOVER_BLOCK",
                "block": {"id": info.id, "gs": info.recovery_gs(), "num_bytes": info.num_bytes},
                "recovery_id": recovery_id, "new_length": new_length,
                "targets": [loc for loc in map(self.locator.location, [n for n, _ in live])
                            if loc is not None]}
        log.info("block recovery of %s block %d: recovery id %d, primary %s (attempt %d)",
                 path, block["id"], recovery_id, primary or "none alive", attempt)
        return rec

    def _stale_after(self) -> float:
        return self.datanodes.stale_interval

    async def retry_stalled_recoveries(self) -> int:
        """Recoveries without a commit after ``block_recovery_retry``, or whose primary
        stopped heartbeating, get a new id (and the next primary)."""
        retried = 0
        now = self.clock()
        for rec in list(self._recoveries.values()):
            primary = self.datanodes.find(rec.primary) if rec.primary is not None else None
            if not lm.recovery_due(started=rec.started, now=now,
                                   retry_after=self.retry_after,
                                   primary_heartbeat=primary.last_heartbeat if primary else None,
                                   stale_after=self._stale_after()):
                continue
            path = self.ns.view.path_of(rec.ino)
            if path is None:
                self.forget_recovery(rec.block_id)
                continue
            async with self.locking.mutation(f"retry block recovery of {path}",
                                     lock_set(paths.split(path), LOCK_WRITE),
                                     check_safemode=False):
                if self._recoveries.get(rec.block_id) is not rec:
                    continue
                inode = self.ns.view.get_inode(rec.ino)
                tail = self.ns.view.tail_blocks(rec.ino, inode, 1) if inode and inode.uc else []
                if not tail or tail[-1]["id"] != rec.block_id:
                    self.forget_recovery(rec.block_id)
                    continue
                await self.start_block_recovery(path, rec.ino, tail[-1])
                retried += 1
        return retried

    async def release_expired_leases(self) -> int:
        """The lease monitor's pass: hard-expired leases, oldest first and at most
        ``LEASE_MONITOR_MAX_FILES`` files, go to the internal holder ``leasefs-meta``
        (closed at once, or through block recovery). Returns the files closed."""
        released = 0
        now = self.clock()
        for holder, ino in self.leases.hard_expired_files(now, LEASE_MONITOR_MAX_FILES):
            path = self.ns.view.path_of(ino)
            if path is None:
                self.leases.remove_file(ino)
                continue
            try:
                async with self.locking.mutation(f"release lease of {path}",
                                         lock_set(paths.split(path), LOCK_WRITE),
                                         check_safemode=False):
                    inode = self.ns.view.get_inode(ino)
                    if inode is None or not inode.uc or self.ns.view.path_of(ino) != path:
                        continue
                    if await self._internal_release_lease(path, ino, inode, INTERNAL_HOLDER):
                        released += 1
            except LeaseFSError as exc:
                if ino not in self._release_logged:
                    self._release_logged.add(ino)
                    log.warning("lease of %s (holder %s) expired: %s", path, holder, exc)
        return released

    def _last_under_recovery(self, ino: int, inode: Inode) -> bool:
        tail = self.ns.view.tail_blocks(ino, inode, 1)
        return bool(tail) and self.block_state(tail[-1]) == bm.UNDER_RECOVERY

    async def recover_lease_internal(self, op: str, path: str, ino: int, inode: Inode,
                                     caller: str, now: float, *, force: bool = False) -> bool:
        """HDFS ``recoverLeaseInternal`` on an open file (caller holds its locks): True
        when the file is closed now, False while block recovery runs."""
        self.leases.recover_lease_internal(op, path, inode.uc.holder, caller, now,
                                           force=force,
                                           last_under_recovery=self._last_under_recovery(ino, inode))
        tail = self.ns.view.tail_blocks(ino, inode, 1)
        if tail and tail[-1]["id"] in self._recoveries:
            if inode.uc.holder != caller and force:
                await self.edits.log_plan(self.ns.planner.plan_reassign_lease(ino, caller))
            return False
        return await self._internal_release_lease(path, ino, inode, caller)
