"""The metadata server's administrative calls (HDFS ``dfsadmin``/``fsck``, the calls HDFS keeps
apart from ClientProtocol's namespace and write path): report, safemode, decommission, fsck,
save_namespace, content_summary and set_quota (PROTOCOL.md §2).

Why it exists: one role per module. These calls read the whole server's state (cluster
report, fsck over a subtree) or change its mode (safe mode, decommissioning, a checkpoint);
the ones that change something are for the superuser only.

``AdminProtocol`` is a front end: a translator from each RPC to the services that do the
work; it keeps no state of its own. Its constructor takes exactly what it calls or reports
on: the namespace (``ns``), ``access``/``permissions`` (the caller, the superuser checks),
``locking`` (reads that await between store reads, the set_quota mutation, the global lock
a safe-mode change takes), ``edits`` (set_quota's record), ``locator`` (fsck's locations),
the block and block-server state (``blocks``, ``datanodes``, ``leases``, ``safemode``),
``redundancy`` (replica groups, what a decommissioning node still has to copy, the
replication queues' counts), ``monitors`` (checkpoints), the report's sources (``journal``, ``role_view``,
``startup``, ``gc_governor``, ``namespace_lock``: the configured lock mode) and the clocks
(``clock`` monotonic seconds, ``wall_ns``). ``fsck_report`` is public: the web UI's fsck
page answers the same report with the viewer's access checked instead of the superuser's.

Concurrency contract: every handler runs on the metadata server's one trio thread, each call
its own task; fsck and content_summary walk a subtree under ``locking.reading`` with a
checkpoint every few hundred inodes (``TimeSlice``); a safe-mode change holds the global lock
exclusively, so no mutation is half way through; ``report`` never awaits (served inline).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fs import paths
from fs.errors import InvalidArgument

from ..blocks import blocks as bm
from ..blocks.blocks import BlockInfo
from ..blocks import datanodes as dm
from ..namespace.locks import LOCK_WRITE, lock_set
from ..namespace.namespace import ContentSummary, check_bool, check_int
from ..journal.charge import file_charge
from ..namespace.quota import NO_QUOTA
from ..namespace.permissions import READ_EXECUTE
from ..schema.inode import DIR, SYMLINK
from ..namespace.timeslice import TimeSlice

if TYPE_CHECKING:
    from ..blocks.blocks import BlocksMap
    from ..blocks.datanodes import DatanodeManager
    from ..services.locate import Locator
    from ..services.redundancy import Redundancy
    from ..blocks.safemode import SafeModeState
    from ..services.gcpolicy import GcGovernor
    from ..ha.role import RoleView
    from ..journal.edits import Edits
    from ..journal.journal import Journal
    from ..leases.leases import LeaseManager
    from ..services.monitors import Monitors
    from ..namespace.access import Access
    from ..namespace.locks import NamespaceLocking
    from ..namespace.namespace import Namespace
    from ..namespace.permissions import PermissionChecker
    from ..services.startup import StartupProgress

log = logging.getLogger(__name__)

# fsck: the totals counter of each block status, and statuses from best to worst
FSCK_TOTAL_OF = {"HEALTHY": "healthy_blocks", "UNDER_REPLICATED": "under_replicated_blocks",
                 "CORRUPT": "corrupt_blocks", "MISSING": "missing_blocks",
                 "UNDER_CONSTRUCTION": "under_construction_blocks"}
FSCK_RANK = ("HEALTHY", "UNDER_CONSTRUCTION", "UNDER_REPLICATED", "MISSING", "CORRUPT")


class AdminProtocol:
    """Handlers of the administrative calls, as ``rpc_<method>(ctx, **args)``."""

    def __init__(self, *, ns: Namespace, access: Access, permissions: PermissionChecker,
                 locking: NamespaceLocking, edits: Edits, locator: Locator, blocks: BlocksMap,
                 datanodes: DatanodeManager, leases: LeaseManager, safemode: SafeModeState,
                 redundancy: Redundancy, monitors: Monitors, journal: Journal,
                 role_view: RoleView, startup: StartupProgress, gc_governor: GcGovernor,
                 namespace_lock: str, clock: Callable[[], float], wall_ns: Callable[[], int]):
        self.ns = ns
        self.access = access
        self.permissions = permissions
        self.locking = locking
        self.edits = edits
        self.locator = locator
        self.blocks = blocks
        self.datanodes = datanodes
        self.leases = leases
        self.safemode = safemode
        self.redundancy = redundancy
        self.monitors = monitors
        self.journal = journal
        self.role_view = role_view
        self.startup = startup
        self.gc_governor = gc_governor
        self.namespace_lock = namespace_lock
        self.clock = clock
        self.wall_ns = wall_ns

    async def rpc_content_summary(self, ctx, path):
        parts = paths.split(path)
        async with self.locking.reading(parts):
            caller = self.access.checked_caller(ctx)
            if caller is not None:
                self.permissions.check_path(caller, parts, self.access.inode_chain(parts))
            _, ino, inode, _ = self.ns.view.resolve(path)
            summary = ContentSummary()
            walk = TimeSlice()   # a big tree must not stall every other client
            for node_ino, node in self.ns.view.iter_subtree(ino, inode):
                if caller is not None:   # HDFS subAccess=READ_EXECUTE on every directory
                    self.permissions.check_sub_access(
                        caller, node, READ_EXECUTE,
                        lambda: self.ns.view.path_of(node_ino) or f"<inode {node_ino}>")
                summary.add(node, file_charge(self.ns.view.read, node_ino, node))
                await walk.tick()
            answer = summary.as_dict()
            # HDFS's count -q columns: a quota folder answers its quotas and stored usage
            quota = inode.quota
            if quota is None:
                answer.update(ns_quota=NO_QUOTA, ds_quota=NO_QUOTA,
                              ns_used=answer["file_count"] + answer["directory_count"],
                              ds_used=answer["space_consumed"])
            else:
                answer.update(ns_quota=quota.ns, ds_quota=quota.ds,
                              ns_used=quota.ns_used, ds_used=quota.ds_used)
            return answer

    async def rpc_set_quota(self, ctx, path, ns_quota=None, ds_quota=None):
        """HDFS setQuota: a folder's name and/or space quota (-1 clears one, None leaves
        it); superuser only."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        self.permissions.check_superuser(self.access.caller_of(ctx), f"set quota of {canonical}")
        async with self.locking.mutation(f"set quota of {canonical}", lock_set(parts, LOCK_WRITE)):
            # the usage count of a new quota folder walks its subtree in the planner: the
            # write lock keeps the subtree still until the record is applied
            await self.edits.log_plan(self.ns.quota.plan_set_quota(canonical, ns_quota, ds_quota,
                                                       now_ns=self.wall_ns()))
            return True

    async def rpc_report(self, ctx):
        now = self.clock()

        def node_dict(node):
            return {"node_id": node.node_id, "address": node.address,
                    "capacity": node.capacity, "used": node.used, "remaining": node.remaining,
                    "last_heartbeat_age": round(now - node.last_heartbeat, 3),
                    "blocks": self.blocks.node_block_count(node.node_id),
                    "admin": node.admin, "alive": node.alive, "xceivers": node.xceivers,
                    "http_port": node.http_port,
                    # its wall clock minus ours; "clock_warning": past clock_skew_warn
                    "clock_skew": round(node.clock_skew, 3), "clock_warning": node.clock_warned,
                    # one data folder per block server: a failed one stops the server,
                    # which then shows as dead, so a live node has none failed
                    "volumes": 1, "failed_volumes": 0}
        live = sorted(self.datanodes.live_nodes(), key=lambda n: n.address)
        dead = sorted(self.datanodes.dead_nodes(), key=lambda n: n.address)
        return {"capacity": sum(n.capacity for n in live), "used": sum(n.used for n in live),
                "remaining": sum(n.remaining for n in live),
                "live_nodes": [node_dict(n) for n in live],
                "dead_nodes": [node_dict(n) for n in dead],
                "blocks": len(self.blocks), "files": self.ns.view.file_count(),
                "directories": self.ns.view.dir_count(), "open_files": self.leases.open_files(),
                **self.blocks.counts(),
                "pending_deletion": self.datanodes.pending_deletion(),
                "replication": self.redundancy.replication_stats(),
                "decommissioning": sum(1 for n in self.datanodes.nodes.values()
                                       if n.admin == dm.DECOMMISSION_IN_PROGRESS),
                "decommissioned": sum(1 for n in self.datanodes.nodes.values()
                                      if n.admin == dm.DECOMMISSIONED),
                "safemode": self.safemode.status(),
                "ha": self.role_view.status().to_wire(),
                "namespace_id": self.ns.view.namespace_id,
                "namespace_lock": self.namespace_lock,
                "journal": {"last_txid": self.journal.last_txid,
                            "durable_txid": self.journal.durable_txid,
                            "fsyncs": self.journal.stats.fsyncs,
                            "records": self.journal.stats.records},
                "checkpoint": self.monitors.checkpoint_status(),
                # how the last start went: its phases' durations, the records replayed
                "startup": self.startup.as_dict(self.wall_ns() / 1e9),
                "namespace_cache": {"entries": len(self.ns.cache.data),
                                    "hits": self.ns.cache.hits,
                                    "misses": self.ns.cache.misses},
                "gc": self.gc_governor.stats(),
                # CPU seconds of the whole server process (all threads): benchmarks divide
                # its growth by the calls they made (less swayed by other load than a rate)
                "cpu_seconds": time.process_time()}

    async def rpc_safemode(self, ctx, action="get"):
        if action not in ("get", "enter", "leave"):
            raise InvalidArgument(f"safemode: action must be get, enter or leave, got {action!r:.40}")
        if action != "get":
            self.permissions.check_superuser(self.access.caller_of(ctx), f"safemode {action}")
            await self.locking.global_lock.acquire(True)   # no mutation is half way through
            try:
                if action == "enter":
                    self.safemode.enter()
                else:
                    self.safemode.leave()
            finally:
                self.locking.global_lock.release(True)
        return self.safemode.status()

    # ------------------------------------------------------------------ decommission
    def _node_admin_dict(self, node) -> dict:
        return {"node_id": node.node_id, "address": node.address, "admin": node.admin,
                "alive": node.alive, "blocks": self.blocks.node_block_count(node.node_id),
                "blocks_to_copy": (self.redundancy.blocks_to_copy(node.node_id)
                                   if node.admin == dm.DECOMMISSION_IN_PROGRESS else 0)}

    async def rpc_decommission(self, ctx, node=None, action="start"):
        if action not in ("start", "stop", "status"):
            raise InvalidArgument(f"decommission: action must be start, stop or status, "
                                  f"got {action!r:.40}")
        if node is None:
            if action != "status":
                raise InvalidArgument("decommission: which block server (HOST:PORT or node id)?")
            return [self._node_admin_dict(n) for n in sorted(
                self.datanodes.nodes.values(), key=lambda n: n.address) if n.retiring]
        if not isinstance(node, str):
            raise InvalidArgument("decommission: node must be 'HOST:PORT' or a node id")
        info = self.datanodes.find(node)
        if info is None:
            raise InvalidArgument(f"decommission: {node:.100}: no such block server")
        if action != "status":
            self.permissions.check_superuser(self.access.caller_of(ctx), f"decommission {action}")
            if action == "start" and self.datanodes.start_decommission(info):
                log.info("decommissioning block server %s (%s): %d replicas to protect",
                         info.node_id, info.address, self.blocks.node_block_count(info.node_id))
            elif action == "stop" and self.datanodes.stop_decommission(info):
                log.info("block server %s (%s) is back in service", info.node_id, info.address)
            self.blocks.mark_node_dirty(info.node_id)
        return self._node_admin_dict(info)

    # ------------------------------------------------------------------ fsck
    def _fsck_block(self, block: dict, info: BlockInfo | None, locations: bool) -> dict:
        out = {"id": block["id"], "gs": info.gs if info else block["gs"],
               "num_bytes": block["num_bytes"],
               "state": info.state if info else block["state"]}
        if info is not None and info.patch_gs:
            out["patch_gs"] = info.patch_gs   # a patch's new version, not committed yet
        if info is None:
            out.update(status="MISSING", live=0, expected=0, corrupt_replicas=[])
            return out
        normal, retiring, _ = self.redundancy.replica_groups(info)
        corrupt = [{"node_id": n, "address": (self.datanodes.nodes[n].address
                                              if n in self.datanodes.nodes else "?"),
                    "reason": info.replicas[n].reason or "reported bad by a reader or scanner"}
                   for n in info.corrupt_nodes()]
        good = len(normal) + len(retiring)
        if info.state != bm.COMPLETE:
            status = "UNDER_CONSTRUCTION"
        elif good == 0:
            status = "CORRUPT" if corrupt else "MISSING"
        elif len(normal) < info.replication:
            status = "UNDER_REPLICATED"
        else:
            status = "HEALTHY"
        out.update(status=status, live=len(normal), decommissioning=len(retiring),
                   expected=info.replication, corrupt_replicas=corrupt)
        if locations:
            out["locations"] = [loc for loc in map(self.locator.location, normal + retiring)
                                if loc is not None]
        return out

    async def rpc_fsck(self, ctx, path="/", openforwrite=False, locations=False, limit=10000):
        """HDFS ``fsck``: the superuser's (it names every file of the subtree, whatever
        its folders' modes; the web page's fsck checks the viewer's access instead)."""
        self.permissions.check_superuser(self.access.caller_of(ctx), f"fsck {str(path)[:200]}")
        return await self.fsck_report(ctx, path, openforwrite, locations, limit)

    async def fsck_report(self, ctx, path="/", openforwrite=False, locations=False,
                          limit=10000) -> dict:
        """The fsck answer for ``path`` (the caller's access is the caller's to check)."""
        check_bool(openforwrite, "fsck: openforwrite")
        check_bool(locations, "fsck: locations")
        limit = check_int(limit, "fsck: limit", low=0)
        parts = paths.split(path)
        totals = {"files": 0, "directories": 0, "symlinks": 0, "total_size": 0, "blocks": 0,
                  "healthy_blocks": 0, "under_replicated_blocks": 0, "corrupt_blocks": 0,
                  "corrupt_replicas": 0, "missing_blocks": 0, "missing_size": 0,
                  "open_files": 0, "under_construction_blocks": 0}
        files: list[dict] = []
        truncated = False
        async with self.locking.reading(parts):
            caller = self.access.checked_caller(ctx)
            if caller is not None:
                self.permissions.check_path(caller, parts, self.access.inode_chain(parts))
            canonical = paths.join_parts(parts)
            _, ino, inode, _ = self.ns.view.resolve(path)
            walk = TimeSlice()   # a big tree must not stall every other client
            for node_ino, node in self.ns.view.iter_subtree(ino, inode):
                await walk.tick()
                kind = node.type
                if kind == DIR:
                    totals["directories"] += 1
                    continue
                if kind == SYMLINK:
                    totals["symlinks"] += 1
                    continue
                totals["files"] += 1
                is_open = bool(node.uc)
                totals["open_files"] += int(is_open)
                totals["total_size"] += (node.length or 0)
                if is_open and not openforwrite:
                    continue
                blocks = []
                worst = "HEALTHY"
                for block in self.ns.view.blocks_of(node_ino):
                    entry = self._fsck_block(block, self.blocks.get(block["id"]), locations)
                    blocks.append(entry)
                    totals["blocks"] += 1
                    totals["corrupt_replicas"] += len(entry["corrupt_replicas"])
                    status = entry["status"]
                    totals[FSCK_TOTAL_OF[status]] += 1
                    if status == "MISSING":
                        totals["missing_size"] += entry["num_bytes"]
                    if FSCK_RANK.index(status) > FSCK_RANK.index(worst):
                        worst = status
                if worst == "UNDER_CONSTRUCTION":
                    worst = "HEALTHY"
                has_bad_replica = any(b["corrupt_replicas"] for b in blocks)
                if worst != "HEALTHY" or has_bad_replica or is_open or locations:
                    if len(files) >= limit:
                        truncated = True
                        continue
                    files.append({"path": self.ns.view.path_of(node_ino) or f"<inode {node_ino}>",
                                  "length": (node.length or 0),
                                  "replication": (node.replication or 0),
                                  "status": worst, "open": is_open, "blocks": blocks})
        healthy = totals["corrupt_blocks"] == 0 and totals["missing_blocks"] == 0
        return {"path": canonical, "status": "HEALTHY" if healthy else "CORRUPT",
                "totals": totals, "files": files, "truncated": truncated}

    async def rpc_save_namespace(self, ctx):
        """HDFS ``dfsadmin -saveNamespace``: a checkpoint now; superuser, safe mode only."""
        self.permissions.check_superuser(self.access.caller_of(ctx), "save namespace")
        if not self.safemode.on:
            raise InvalidArgument("save namespace: safe mode must be ON to save the "
                                  "namespace (leasefs safemode enter), as HDFS requires")
        return await self.monitors.checkpoint()
