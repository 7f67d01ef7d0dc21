"""The metadata server's background work: checkpoints, reclaiming detached subtrees, dead
block servers, safe mode, expired leases (directory leases too: unanswered recalls, silent
holders), re-replication and expired delegation tokens.

Why it exists: one role per module. These loops run beside the protocols (client, block
server, admin) and act on the same state; HDFS keeps them apart too (its Monitor threads:
HeartbeatManager, LeaseManager.Monitor, RedundancyMonitor, ExpiredTokenRemover).

``Monitors`` is constructed with what the loops act on: the journal, the store and the
namespace (checkpoints, reclaiming), the namespace locks (a checkpoint holds the global write
lock, a reclaim record the global read lock), safe mode, the block servers, the HA role
view, the lease recovery, redundancy and security services whose passes it drives, the
config (periods and checkpoint thresholds), the wall clock and the server's start time,
and three callables of the server: ``node_dead`` (a block server's replicas leave),
``update_safemode`` and ``handler`` (the ``rpc_<method>`` the trash emptier calls, the
server's own handlers as the superuser). It owns the last checkpoint, the counts of
checkpoints and reclaim records, and the reclaimer's wakeup (``wake_reclaimer``, called
when an applied record detached a subtree; ``run_reclaimer`` is the reclaiming loop).

Concurrency contract: every loop is a task on the metadata server's one trio thread; a
checkpoint holds the global write lock, a reclaim record the global read lock.
"""

from __future__ import annotations

import logging
import time
from functools import partial

import trio

from fs import trash
from fs.errors import FileNotFound, LeaseFSError, NotDirectory
from fs.rpc import CallContext

from ..journal import checkpoint as checkpoints
from ..journal.checkpoint import CheckpointInfo

log = logging.getLogger(__name__)

# seconds of trio-thread time one RECLAIM record may take to plan (applying it costs about
# as much): other calls wait at most that long behind the reclaimer
RECLAIM_SLICE = 0.001


class Monitors:
    """The background loops (``run_monitors``, ``run_active_services``), checkpoints and
    reclaiming."""

    def __init__(self, *, journal, kv, ns, locking, safemode, datanodes, role_view, recovery,
                 redundancy, security, config, wall_ns, started_ns: int, node_dead,
                 update_safemode, handler, dir_leases, locks):
        self.journal = journal
        self.kv = kv
        self.ns = ns
        self.locking = locking
        self.safemode = safemode
        self.datanodes = datanodes
        self.role_view = role_view
        self.recovery = recovery
        self.dir_leases = dir_leases
        self.locks = locks
        self.redundancy = redundancy
        self.security = security
        self.config = config
        self.wall_ns = wall_ns
        self._started_ns = started_ns
        self._node_dead = node_dead
        self._update_safemode = update_safemode
        self._handler = handler
        self.last_checkpoint = CheckpointInfo()   # read from the store by load_last_checkpoint
        self.checkpoints = 0                      # taken by this server since it started
        self.reclaim_records = 0                  # RECLAIM records journaled since it started
        self._reclaim_wakeup = trio.Event()

    def load_last_checkpoint(self) -> None:
        """Read the last checkpoint recorded in the store (at start, before the replay)."""
        self.last_checkpoint = checkpoints.load(self.kv)

    def wake_reclaimer(self) -> None:
        """An applied record detached a subtree: the reclaimer starts on it now."""
        self._reclaim_wakeup.set()

    async def checkpoint(self) -> dict:
        """Roll the journal, make LevelDB durable with the checkpoint recorded in it, purge
        old segments (global write lock; see checkpoint.py)."""
        await self.locking.global_lock.acquire(True)
        try:
            await self.journal.roll()
            info = CheckpointInfo(self.ns.view.applied_txid, self.wall_ns())
            await trio.to_thread.run_sync(partial(self.kv.write, checkpoints.record(info),
                                                  sync=True))
            removed = self.journal.purge(info.txid)
            self.last_checkpoint = info
            self.checkpoints += 1
            log.info("checkpoint at txid %d; purged %d journal segments", info.txid, len(removed))
        finally:
            self.locking.global_lock.release(True)
        if self.role_view.controller is not None:
            await self.role_view.controller.after_checkpoint(info.txid)
        return {**self.checkpoint_status(), "purged": removed}

    def checkpoint_status(self) -> dict:
        """The last checkpoint and what the journal holds after it (``report``)."""
        last = self.last_checkpoint
        return last.as_dict(self.ns.view.applied_txid, self.journal.bytes_after(last.txid))

    async def run_monitors(self) -> None:
        """The loops every metadata server runs whatever its role (they journal nothing:
        a standby keeps its blocks map, safe mode and checkpoints too)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._dead_node_monitor)
            nursery.start_soon(self._safemode_monitor)
            nursery.start_soon(self._checkpoint_monitor)

    async def run_active_services(self) -> None:
        """The loops only the active server runs (HDFS startActiveServices): they journal
        (lease recovery, reclaiming, expired tokens, trash) or command block servers
        (re-replication). Cancelled when the server leaves the active role."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._lease_monitor)
            nursery.start_soon(self.run_reclaimer)
            nursery.start_soon(self._replication_monitor)
            nursery.start_soon(self._token_monitor)
            nursery.start_soon(self._trash_monitor)

    async def reclaim_once(self) -> bool:
        """Journal one RECLAIM record (at most ``delete_chunk`` keys of a detached subtree)
        under the global read lock; False when nothing is left to reclaim."""
        await self.locking.global_lock.acquire(False)
        try:
            until = time.perf_counter() + RECLAIM_SLICE
            plan = self.ns.reclaim.plan_reclaim(stop=lambda: time.perf_counter() >= until)
            if plan is None:
                return False
            await self.journal.log(plan)
            self.reclaim_records += 1
            if plan.done:
                log.info("reclaimed the detached subtree of inode %d", plan.root)
            return True
        finally:
            self.locking.global_lock.release(False)

    async def run_reclaimer(self) -> None:
        """Removes detached subtrees record by record; waits while in safe mode (a server
        started on a stale folder deletes nothing) and while nothing is detached. One of
        ``run_active_services``' loops, and runnable alone (without lease recovery and the
        rest) where only reclaiming is wanted."""
        period = max(0.05, min(0.5, self.config.heartbeat_interval))
        while True:
            if not self.safemode.on and self.ns.reclaim.has_orphans():
                try:
                    await self.reclaim_once()
                    await trio.sleep(0)
                except LeaseFSError as exc:
                    log.warning("reclaiming deleted files: %s", exc)
                    await trio.sleep(period)
                continue
            self._reclaim_wakeup = trio.Event()
            with trio.move_on_after(period):
                await self._reclaim_wakeup.wait()

    async def _token_monitor(self) -> None:
        """Removes expired delegation tokens (they are refused from their expiry on; this
        only keeps the namespace from filling with dead ones), hourly as HDFS does."""
        period = max(1.0, min(3600.0, self.config.delegation_token_renew_interval))
        while True:
            await trio.sleep(period)
            if self.safemode.on:
                continue
            try:
                await self.security.remove_expired_tokens()
            except LeaseFSError as exc:
                log.warning("removing expired delegation tokens: %s", exc)

    async def _trash_monitor(self) -> None:
        """HDFS's trash emptier: every ``trash_checkpoint_interval`` each user's
        ``.Trash/Current`` becomes a checkpoint and checkpoints older than
        ``trash_interval`` are deleted (``fs.trash``)."""
        interval = self.config.trash_interval * 60
        if interval <= 0:
            return
        period = (self.config.trash_checkpoint_interval or self.config.trash_interval) * 60
        period = max(1.0, min(period, interval))
        calls = _ServerCalls(self._handler)
        while True:
            await trio.sleep(period)
            if self.safemode.on:
                continue
            try:
                removed = await trash.empty(calls, interval, self.wall_ns() / 1e9, log)
            except LeaseFSError as exc:
                log.warning("trash emptier: %s", exc)
                continue
            if removed:
                log.info("trash emptier: deleted %d expired trash checkpoint(s)", removed)

    async def _dead_node_monitor(self) -> None:
        period = max(0.05, min(self.config.heartbeat_interval, self.config.dead_node_interval / 4))
        while True:
            await trio.sleep(period)
            for node in self.datanodes.check_dead():
                self._node_dead(node)

    async def _safemode_monitor(self) -> None:
        period = max(0.05, min(0.5, self.config.heartbeat_interval))
        while True:
            if self.safemode.on:
                self._update_safemode()
            await trio.sleep(period)

    async def _lease_monitor(self) -> None:
        while True:
            await trio.sleep(max(0.05, self.config.lease_monitor_period))
            if not self.safemode.on:
                try:
                    await self.recovery.release_expired_leases()
                    await self.recovery.retry_stalled_recoveries()
                    await self.dir_leases.expire_ended()
                    self.locks.expire_silent()
                    await self.locks.forget_idle()
                except LeaseFSError as exc:
                    log.warning("lease monitor: %s", exc)

    async def _checkpoint_monitor(self) -> None:
        period = max(0.05, min(1.0, self.config.checkpoint_period))
        while True:
            await trio.sleep(period)
            last = self.last_checkpoint
            if checkpoints.due(last, self.ns.view.applied_txid, self.wall_ns(),
                               self._started_ns, period=self.config.checkpoint_period,
                               txns=self.config.checkpoint_txns,
                               journal_bytes=self.journal.bytes_after(last.txid),
                               max_bytes=self.config.checkpoint_journal_bytes):
                try:
                    await self.checkpoint()
                except LeaseFSError as exc:
                    log.error("checkpoint failed: %s", exc)

    async def _replication_monitor(self) -> None:
        period = max(0.02, self.config.replication_interval)
        while True:
            await trio.sleep(period)
            try:
                await self.redundancy.replication_pass()
            except LeaseFSError as exc:
                log.warning("replication monitor: %s", exc)


class _ServerCalls:
    """The namespace calls the trash emptier makes: the server's own handlers (``handler``:
    method name → bound ``rpc_<method>``), as the superuser (an in-process caller)."""

    def __init__(self, handler):
        self.handler = handler
        self.ctx = CallContext(client_id="trash-emptier", peer="metadata server")

    async def exists(self, path: str) -> bool:
        try:
            await self.handler("get_file_info")(self.ctx, path=path)
        except (FileNotFound, NotDirectory):
            return False
        return True

    async def list(self, path: str) -> list[str]:
        names, after = [], ""
        while True:
            page = await self.handler("list_status")(self.ctx, path=path, start_after=after)
            names += [entry["name"] for entry in page["entries"]]
            if not page["entries"] or not page["has_more"]:
                return names
            after = names[-1]

    async def rename(self, src: str, dst: str) -> None:
        await self.handler("rename")(self.ctx, src=src, dst=dst)

    async def delete(self, path: str) -> None:
        await self.handler("delete")(self.ctx, path=path, recursive=True)
