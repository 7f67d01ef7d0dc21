"""The metadata server (the HDFS NameNode role): its core — state, startup/recovery, the
journal's apply and the memory state the journal's ops update. It builds the services and
the protocol front ends and owns them; how a process runs it (sockets, restarts) is
``serverrun.py``.

Why it exists: it is the shell around the pure parts and the one place that says what the
server is made of. ``namespace/`` validates and applies journal records (what each op does,
in the store and in memory, is its class in ``journal/ops*.py``); the leases, the blocks
map, the block servers and safe mode are I/O-free state machines. ``MetaServer.__init__``
builds them and, in dependency order, the services that wire them to the journal, the locks
and the clocks, each constructed with exactly what it needs:

* ``edits`` (``journal/edits.py``: journaling a plan, durable or lazy), ``access``
  (``namespace/access.py``: who the caller is, permission checks), ``locking``
  (``namespace/locks.py``: the global lock, path locks, safe-mode check of a mutation),
  ``locator`` (``services/locate.py``: located blocks, replica order, tokens), ``role_view``
  (``ha/role.py``: the HA role), ``security`` (``services/security.py``: keys, block and delegation
  tokens), ``recovery`` (``services/lease_recovery.py``: lease release and block recovery),
  ``redundancy`` (``services/redundancy.py``: re-replication and its commands), ``monitors``
  (``services/monitors.py``: the background loops, checkpoints, the reclaimer),
  ``dir_lease_service`` (``services/dir_leases.py``: directory leases granted, released
  and recalled: ``dispatch`` awaits its ``before_access`` for calls naming paths while
  any lease is held), ``lock_service`` (``services/locks.py``: the mounts' flock and
  fcntl locks, volatile, ended with their holder's client lease);
* the protocol front ends, thin translators from each RPC to those services' public calls
  (every method of docs/PROTOCOL.md §2, by role as HDFS separates them): ``client_protocol``,
  ``namespace_protocol``, ``admin_protocol``, ``datanode_protocol``, ``auth_protocol``,
  ``ha_protocol`` (``protocols/``); for Hadoop's client on the HDFS port, the
  ``hdfs_translators`` (``protocols/hdfs/``: ClientProtocol's calls translated into the
  same calls, through ``dispatch``; an append of an inline file also writes its first
  block, ``inline_append.py``; short-circuit readers on this host get inline files
  written out as replica files, ``inline_local.py``), ``hdfs_identity`` and
  ``hdfs_inline`` (the inline files' READ_BLOCK on the same port). ``MetaServer`` is their ``Dispatcher``: it serves their
  ``rpc_<method>`` methods (``front_ends``), declares which go through the retry cache or run
  inline, refuses what its HA role does not take (``dispatch``), and hands the session hooks
  to ``auth_protocol``.

What stays here: startup and replay, the journal's apply (the ``MemoryState`` it hands the
ops' ``apply_memory`` names the services they change: blocks map, leases, lease recovery,
security), and the HA role's entry points (``activate``, ``became_active``).

Mutation order (every mutating RPC): safe-mode check → global lock (read) → path locks →
validate and decide in memory (``ns.planner.plan_*``; a ``LeaseFSError`` leaves everything
unchanged) → ``await edits.log_plan(op)``, which returns after the record is fsynced AND
applied (or, for a namespace-only record of a client without ``sync_metadata``, written
and applied; ``LAZY_OPS``): ``_apply`` writes the batch to LevelDB (one write) and, in the same synchronous
step, updates the blocks map, leases and invalidate sets → release locks → reply. Reads
take no path lock (see ``locks.py``): they never wait for a mutation's fsync.

Startup (``serverrun.run_meta_server``): open LevelDB, ``journal.open()``, replay every record after
the applied txid through the same ``apply``, start the group-commit syncer, format the
namespace if it is new (the FORMAT record makes a replay from an empty store exact), rebuild
the blocks map from the ``B`` keys and the leases from the ``U`` keys, start monitors (dead
nodes, safe mode, leases, checkpoints, the reclaimer), serve RPC, report the bound
address.

Monitors: dead block servers (their replicas leave the blocks map), safe mode (leaves when
enough blocks are reported), leases (hard-expired leases, oldest first and a bounded number
of files per pass, go to the internal holder ``leasefs-meta``: closed at once or through
block recovery; stalled block recoveries get a new recovery id after
``block_recovery_retry``), checkpoints (``checkpoint.py``: due by txids or time since the
last one, persisted; under the global write lock: roll the journal, one synced store write
recording the checkpoint in a worker thread, purge old segments), the reclaimer (subtrees
a big delete detached are removed one bounded RECLAIM record at a time, paused in safe mode
like invalidations; it also finishes what a crash left behind).

Retry cache across failovers and restarts (HDFS): a record written for a retry-cached
call carries the call's key (``meta.journal``), and what the namespace will not hold of
its answer when it has such a part; applying it, live, from the replicated log or at
replay, notes both in the retry cache, and a retry of that call gets the answer
``meta.services.retry_answers`` rebuilds from the current state instead of a second run.

Block reports (full ones in chunks of one ``report_id``, incremental ones) are applied by
``reports.py`` (``BlockReports``), with a checkpoint every ``REPORT_STEP`` entries; the
handlers (``protocols/datanode.py``) only check the caller and the arguments.

Permissions (``permissions.py``, HDFS FSPermissionChecker): every namespace handler checks
the caller's identity (from the RPC hello) against the inode chain of its path(s) inside its
path locks and before planning, so a denied call changes nothing and journals nothing. The
superuser and, with ``permissions_enabled`` off, everyone skip the checks without a walk.

Concurrency contract: everything runs on one trio thread; only the journal's fsync and the
checkpoint's synced store write run in worker threads. Handlers are independent tasks. No step may
hold the thread for long: big deletes and big block reports are cut into bounded pieces.
"""

from __future__ import annotations

import logging
import secrets
import time

import trio

from fs import weblog
from fs.config import Config
from fs.errors import StandbyError
from fs.hastatus import Role
from fs.hdfs import convert, tokenfile
from fs.metrics import new_registry
from fs.retry_cache import CallKey
from fs.rpc import Dispatcher, RetryCache, current_user

from .services import retry_answers
from .blocks.blocks import BlockInfo, BlocksMap
from .services.locate import Locator
from .journal.edits import Edits
from .namespace.access import Access
from .metrics import MetaMetrics
from .blocks.datanodes import DatanodeManager
from .services.gcpolicy import GcGovernor
from .ha.bootstrap import ImageSource
from .journal.journal import Journal
from .journal.kv import KVStore
from .leases.dirleases import DirLeaseTable
from fs.locktable import LockTable
from .leases.leases import STALE_HEARTBEATS, LeaseManager
from .namespace.locks import NamespaceLocking
from .namespace.namespace import Defaults, Namespace
from .journal.ops import RPC_CALL, RPC_KEPT, Effect, MemoryState, decode
from .blocks.reports import REPORT_STEP, BlockReports
from .namespace.permissions import PermissionChecker
from .ha.role import RoleView
from .blocks.safemode import SafeModeState
from .services.startup import Phase, StartupProgress
from .namespace.timeslice import TimeSlice
from .protocols.admin import AdminProtocol
from .protocols.client import ClientProtocol
from .protocols.namespace import NamespaceProtocol
from .protocols.datanode import DatanodeProtocol
from .protocols.ha import HAProtocol
from .protocols.hdfs.identity import HdfsIdentity
from .protocols.hdfs.inline import InlineBlocks
from .protocols.hdfs.inline_local import InlineLocalFiles
from .protocols.hdfs.reads import NamenodeReads
from .protocols.hdfs.inline_append import InlineToBlock
from .protocols.hdfs.writes import NamenodeWrites
from .services.redundancy import Redundancy
from .services.lease_recovery import LeaseRecovery
from .services.dir_leases import (ACCESS_ARGS, DRAINED, IN_FLIGHT, BatchPlans, DirLeases,
                                  caller_name)
from .services.locks import Locks
from .services.monitors import Monitors
from .protocols.user_auth import AuthProtocol
from .services.security import Security

log = logging.getLogger(__name__)

REPLAY_CHUNK = 512
# calls a metadata server takes whatever its HA role: block servers report to every metadata
# server, connections authenticate first, and the HA calls themselves
ANY_ROLE_METHODS = frozenset({
    "node_challenge", "node_authenticate", "register_storage", "heartbeat", "block_report",
    "block_received_and_deleted", "token_challenge", "token_authenticate", "ha_status",
    "ha_failover", "image_read"})
# the reads an observer serves (HDFS-12943: getFileInfo, getListing, getBlockLocations, ...)
OBSERVER_METHODS = frozenset({
    "get_server_defaults", "get_file_info", "exists", "list_status", "get_block_locations",
    "content_summary"})
# a handed-out INVALIDATE not reported done after this many heartbeat intervals is resent
# (its heartbeat reply may have been lost)
INVALIDATE_RESEND_HEARTBEATS = 10
# calls a restart's look back notes in the retry cache at once (``note_all``): a handful of
# dict inserts, well under a time slice
LOOK_BACK_BATCH = 256
# ``LAZY_OPS`` (``meta.journal.ops``, the ops with ``lazy``): journal ops that only change the
# namespace: a client without ``sync_metadata`` is answered once they are written, before
# their fsync (they hand out no block id or generation stamp, and block deletions they cause
# wait for the fsync: ``DatanodeManager.take_invalidate``); FSYNC and INLINE only for a
# flush (``fsync(sync=false)``), an hsync waits for its fsync


class MetaServer(Dispatcher):
    """Every RPC of PROTOCOL.md §2 as ``rpc_<method>(ctx, **args)`` of one of its front ends
    (``front_ends``); which calls go through the retry cache or run inline is declared here."""

    retry_cached = frozenset({"mkdirs", "create", "add_block", "complete", "delete", "rename",
                              "rename_many", "create_symlink", "append", "truncate", "rewrite",
                              "recover_lease"})

    # reads that never await (they see the state between two applied journal batches)
    inline_methods = frozenset({"get_file_info", "exists", "list_status",
                                "get_block_locations", "report", "get_server_defaults"})

    def __init__(self, config: Config, kv: KVStore, journal_dir: str, *,
                 clock=time.monotonic, wall_ns=time.time_ns, local_dir: str | None = None):
        super().__init__(RetryCache(expiry=config.retry_cache_expiry,
                                    max_entries=config.retry_cache_entries))
        self.config = config
        self.kv = kv
        self.clock = clock
        self.wall_ns = wall_ns
        # HDFS: the superuser is the user running the NameNode unless configured; it owns
        # the root directory of a new namespace, whose group is the supergroup
        self.superuser = config.superuser or current_user()
        self.metrics_registry = new_registry()      # /metrics (web.py)
        self.permissions = PermissionChecker(superuser=self.superuser,
                                             supergroup=config.supergroup,
                                             enabled=config.permissions_enabled)
        defaults = Defaults.from_config(config)
        defaults.owner, defaults.group = self.superuser, config.supergroup
        self.ns = Namespace(kv, defaults, cache_entries=config.namespace_cache_entries)
        self.role_view = RoleView(lambda: self.ns.view.applied_txid)
        # run by run_meta_server; process-wide, so of several servers in one process (tests)
        # only the first governs
        self.gc_governor = GcGovernor(config.gc_full_collect_interval)
        self.blocks = BlocksMap(config.min_replication)
        self.leases = LeaseManager(config.lease_soft_limit, config.lease_hard_limit)
        self.dir_leases = DirLeaseTable(config.dir_lease_recall_limit)
        self.datanodes = DatanodeManager(
            dead_interval=config.dead_node_interval, invalidate_limit=config.invalidate_limit,
            clock=clock, invalidate_timeout=INVALIDATE_RESEND_HEARTBEATS * config.heartbeat_interval,
            applied_txid=lambda: self.ns.view.applied_txid,
            stale_interval=STALE_HEARTBEATS * config.heartbeat_interval)
        self.safemode = SafeModeState(config.safemode_threshold, config.safemode_extension,
                                      config.safemode_min_storage)
        self.journal = Journal(journal_dir, self._apply,
                               keep_segments=config.journal_keep_segments,
                               sync_delay=config.journal_sync_delay)
        # the keys, proxy rules and delegation tokens (run_meta_server installs the keys)
        self.security = Security(view=self.ns.view, journal=self.journal, config=config,
                                 superuser=self.superuser, wall_ns=wall_ns)
        # the services every front end calls
        self.edits = Edits(self.journal)
        self.access = Access(self.ns.view, self.permissions, self.superuser)
        self.locking = NamespaceLocking(
            existing_depth=self.ns.view.existing_depth, path_of=self.ns.view.path_of,
            safemode_check=self.safemode.check, exclusive=config.namespace_lock == "global")
        self.locator = Locator(self.ns.view, self.blocks, self.datanodes, self.security.block_token)
        self._recovering = False
        self._started_ns = wall_ns()
        self.startup = StartupProgress(self._started_ns / 1e9)
        self.recent_log = weblog.install()   # the web pages' recent log lines
        self.reports = BlockReports(self.blocks, self.datanodes, self.update_safemode,
                                    step=REPORT_STEP, following=lambda: not self.role_view.is_active)
        self.recovery = LeaseRecovery(
            ns=self.ns, edits=self.edits, locking=self.locking, blocks=self.blocks,
            leases=self.leases, datanodes=self.datanodes, locator=self.locator,
            min_replication=config.min_replication, retry_after=config.block_recovery_retry,
            clock=clock, wall_ns=wall_ns)
        self.dir_lease_service = DirLeases(
            table=self.dir_leases, view=self.ns.view, edits=self.edits, locking=self.locking,
            access=self.access, ids=self.ns.ids, quota=self.ns.quota, planner=self.ns.planner,
            max_entries=config.dir_lease_max_entries,
            hard_limit=config.lease_hard_limit, clock=clock,
            dispatch=lambda ctx, method, args: self.dispatch(ctx, method, args, recall=False),
            plans=BatchPlans(
                create_whole=lambda *args: self.client_protocol.plan_whole_create(*args),
                inline_close=lambda *args: self.client_protocol.plan_inline_close(*args),
                mkdir=lambda *args: self.client_protocol.plan_mkdir(*args),
                unlink=lambda *args: self.namespace_protocol.plan_unlink(*args),
                attrs=lambda *args: self.namespace_protocol.plan_attrs(*args),
                move=lambda *args: self.namespace_protocol.plan_move(*args)))
        # flock and fcntl locks of every mount, volatile, under the holders' client leases
        self.lock_service = Locks(table=LockTable(), hard_limit=config.lease_hard_limit,
                                  grace=config.lock_grace, edits=self.edits, clock=clock,
                                  wall_ns=self.wall_ns,
                                  inode_exists=lambda ino: self.ns.view.get_inode(ino) is not None)
        # what the journal ops' ``apply_memory`` change after their store write
        self.memory = MemoryState(blocks=self.blocks, leases=self.leases,
                                  recovery=self.recovery, security=self.security,
                                  dir_leases=self.dir_lease_service)
        self.redundancy = Redundancy(
            blocks=self.blocks, datanodes=self.datanodes, safemode=self.safemode,
            pending_timeout=config.replication_pending_timeout,
            max_streams=config.replication_max_streams, clock=clock)
        # the background loops, checkpoints and the reclaimer
        self.monitors = Monitors(
            journal=self.journal, kv=kv, ns=self.ns, locking=self.locking,
            safemode=self.safemode, datanodes=self.datanodes, role_view=self.role_view,
            recovery=self.recovery, redundancy=self.redundancy, security=self.security,
            config=config, wall_ns=wall_ns, started_ns=self._started_ns,
            node_dead=self.node_dead, update_safemode=self.update_safemode,
            handler=self.handler, dir_leases=self.dir_lease_service, locks=self.lock_service)
        self.auth_protocol = AuthProtocol(security=self.security, superuser=self.superuser,
                                          vouches_users=config.storage_vouches_users)
        self.client_protocol = ClientProtocol(
            ns=self.ns, edits=self.edits, access=self.access, locking=self.locking,
            locator=self.locator, recovery=self.recovery, security=self.security,
            blocks=self.blocks, reports=self.reports, leases=self.leases,
            datanodes=self.datanodes, journal=self.journal, permissions=self.permissions,
            dir_leases=self.dir_lease_service, locks=self.lock_service, config=config,
            clock=clock, wall_ns=wall_ns)
        self.namespace_protocol = NamespaceProtocol(
            ns=self.ns, access=self.access, permissions=self.permissions, locking=self.locking,
            edits=self.edits, locator=self.locator, wall_ns=wall_ns)
        self.admin_protocol = AdminProtocol(
            ns=self.ns, access=self.access, permissions=self.permissions, locking=self.locking,
            edits=self.edits, locator=self.locator, blocks=self.blocks,
            datanodes=self.datanodes, leases=self.leases, safemode=self.safemode,
            redundancy=self.redundancy, monitors=self.monitors,
            journal=self.journal, role_view=self.role_view, startup=self.startup,
            gc_governor=self.gc_governor, namespace_lock=config.namespace_lock, clock=clock,
            wall_ns=wall_ns)
        # images of the store other servers bootstrap from (``meta.ha.bootstrap``)
        self.images = ImageSource(clock)
        self.datanode_protocol = DatanodeProtocol(
            ns=self.ns, blocks=self.blocks, reports=self.reports, datanodes=self.datanodes,
            safemode=self.safemode, journal=self.journal, role_view=self.role_view,
            security=self.security, recovery=self.recovery, redundancy=self.redundancy,
            locking=self.locking, access=self.access, clock_skew_warn=config.clock_skew_warn,
            clock_skew_max=config.clock_skew_max, wall_ns=wall_ns, node_dead=self.node_dead,
            update_safemode=self.update_safemode)
        self.ha_protocol = HAProtocol(
            role_view=self.role_view, view=self.ns.view, images=self.images, kv=kv,
            permissions=self.permissions, access=self.access, max_frame=config.max_frame)
        # the front ends: the objects whose ``rpc_<method>`` methods serve the calls
        self.front_ends: tuple = (self.client_protocol, self.namespace_protocol,
                                  self.admin_protocol, self.datanode_protocol,
                                  self.auth_protocol, self.ha_protocol)
        # Hadoop's client on the HDFS port (``serverrun``): translators of ClientProtocol's
        # calls into this server's own, through ``dispatch`` like every msgpack call, and
        # who its connections are, by the same session hooks
        self.hdfs_inline = InlineBlocks(self.ns.view, self.security,
                                        lambda: self.ns.view.namespace_id,
                                        idle_timeout=config.idle_timeout,
                                        data_timeout=config.data_timeout)
        # ``local_dir``: where inline files are written out for Hadoop's short-circuit
        # readers on this host (None: they read over data transfer)
        self.hdfs_translators: tuple = (
            InlineLocalFiles(self.hdfs_inline, local_dir),
            NamenodeReads(self.dispatch, self.hdfs_inline),
            NamenodeWrites(self.dispatch, lambda: convert.pool_id(self.ns.view.namespace_id),
                           InlineToBlock(self.dispatch, config)))
        self.hdfs_identity = HdfsIdentity(
            secure=lambda: self.security.secure, open_session=self.open_session,
            act_as=self.act_as, token_session=self.auth_protocol.token_session,
            token_lookup=tokenfile.token_lookup(self.security.live_token))
        # /metrics: per call (serve_rpc's hook), per journal sync, the rest at scrape time
        self.metrics = MetaMetrics(self)
        self.call_observer = self.metrics.observe_call
        self.journal.sync_observer = self.metrics.observe_sync

    # ================================================================== startup
    def recover(self) -> None:
        """Sync, at start: open the journal, replay what LevelDB has not applied and note
        the recent calls in the retry cache (all of ``recover_steps`` and
        ``look_back_steps`` at once)."""
        for _ in self.recover_steps():
            pass
        for _ in self.look_back_steps():
            pass

    def recover_steps(self):
        """``recover`` a chunk of records at a time: yields after each, so a caller on the
        trio thread can let the web pages answer (``startup``) in between. The store is made
        durable first: its applied state is then authoritative, so a journal that lost its
        tail (the store is ahead of it) is bridged instead of refused. The retry cache is
        left held: ``look_back_steps`` (``look_back`` in the background) releases it."""
        applied = self.ns.view.applied_txid
        self.kv.sync()
        self.journal.open(store_applied=applied)
        self.monitors.load_last_checkpoint()
        self.retry_cache.hold()
        self.startup.replaying(applied, self.journal.last_txid, self.wall_ns() / 1e9)
        chunk = []
        self._recovering = True
        try:
            for record in self.journal.replay(applied):
                chunk.append(record)
                if len(chunk) >= REPLAY_CHUNK:
                    self._replay_chunk(chunk)
                    chunk = []
                    yield
            if chunk:
                self._replay_chunk(chunk)
        finally:
            self._recovering = False
        log.info("namespace: applied txid %d, replayed %d journal records, now at txid %d",
                 applied, self.startup.replayed, self.ns.view.applied_txid)

    async def look_back(self) -> None:
        """``look_back_steps`` on the trio thread, in slices (``TimeSlice``): the server
        answers while it runs; calls that carry a retry key wait for it (``RetryCache.hold``).
        ``retry_cache_look_back_delay`` (tests) waits before it starts."""
        steps = self.look_back_steps()
        try:
            if self.config.retry_cache_look_back_delay > 0:
                await trio.sleep(self.config.retry_cache_look_back_delay)
            walk = TimeSlice()
            for _ in steps:
                await walk.tick()
        finally:
            steps.close()   # the journal's map, if cancelled
            self.retry_cache.release()

    def look_back_steps(self):
        """HDFS rebuilds its retry cache from the edits it loads at start: here the calls
        named by the records of the journal's segments written within the cache's expiry
        (the store has applied most of them: replay alone would miss them). Yields after
        each record; releases the retry cache when done, or stopped, or failed: the cache
        is best effort, its waiting calls must go on."""
        cache = self.retry_cache
        started = time.perf_counter()
        read = noted = 0
        batch = []
        try:
            for record in self.journal.recent(self.wall_ns() / 1e9 - cache.expiry,
                                              cache.max_entries):
                read += 1
                call = CallKey.from_wire(record.args.get(RPC_CALL))
                if call is not None:
                    batch.append((call, record.args.get(RPC_KEPT)))
                    if len(batch) >= LOOK_BACK_BATCH:
                        noted += cache.note_all(batch)
                        batch = []
                yield
            noted += cache.note_all(batch)
        finally:
            cache.release()
        if read:
            log.info("retry cache: %d calls noted from the journal's %d most recent records "
                     "in %.2f s", noted, read, time.perf_counter() - started)

    def _replay_chunk(self, records) -> None:
        ops = [decode(record) for record in records]
        self.ns.apply(records, ops)
        self._note_calls(ops)
        self.startup.replayed += len(records)

    async def start(self) -> None:
        """After ``journal.run`` started: format a new namespace, rebuild memory state."""
        await self.format_if_new()
        self.startup.move(Phase.LOADING_MEMORY, self.wall_ns() / 1e9)
        self.rebuild_memory()
        self.startup.move(Phase.RUNNING, self.wall_ns() / 1e9)

    def began_serving(self) -> None:
        """The server listens now: every lease counts from here. Loading a large namespace
        (or a slow machine) may take longer than the soft limit between the leases' rebuild
        and the first call a holder can make; its file must not be recoverable by another
        client for a wait that was the server's."""
        renewed = self.leases.renew_all(self.clock())
        if renewed:
            log.info("serving: %d lease(s) renewed from now", renewed)

    async def format_if_new(self) -> None:
        """A new namespace gets its FORMAT record (a random namespace id) as its first."""
        if not self.ns.view.formatted:
            namespace_id = secrets.randbelow(1 << 31) + 1
            await self.journal.log(self.ns.planner.plan_format(namespace_id, self.wall_ns()))
            log.info("formatted a new namespace, id %d", namespace_id)

    def rebuild_memory(self) -> None:
        self.blocks.clear()
        self.reports.clear()
        for ino, index, block, replication in self.ns.view.all_blocks():
            self.blocks.add(BlockInfo(block["id"], ino, index, block["gs"], block["num_bytes"],
                                      block["state"], replication,
                                      patch_gs=block.get("patch_gs", 0)))
        self.leases.rebuild(self.ns.view.under_construction(), self.clock())
        self.dir_lease_service.rebuild(self.ns.view.dir_leases())
        self.lock_service.rebuild(self.ns.view.lock_holders())
        self.security.load_tokens()
        if len(self.blocks) and self.safemode.min_storage < 1:
            # blocks (even only ones being written) are useless until a block server is back:
            # startup safe mode waits for one, so writers retry (SafeMode) instead of failing
            # add_block with NoSpace in the seconds before the block servers re-register (the
            # default waits for one in any case: an empty namespace is about to get blocks)
            self.safemode.min_storage = 1
        self.update_safemode()
        log.info("loaded %d files, %d directories, %d blocks, %d files under construction, "
                 "%d directory leases", self.ns.view.file_count(), self.ns.view.dir_count(),
                 len(self.blocks), self.leases.open_files(), len(self.dir_leases))

    # ================================================================== HA role
    @property
    def ha(self):
        """The HA controller (``meta.ha.HAController``) with ha = etcd, None: always
        active; installed by ``run_meta_server``."""
        return self.role_view.controller

    @ha.setter
    def ha(self, controller) -> None:
        self.role_view.controller = controller

    def handlers(self) -> tuple:
        return self.front_ends

    # who a connection is: the user authentication front end decides
    def open_session(self, session, user, groups, credentials, peer) -> None:
        self.auth_protocol.open_session(session, user, groups, credentials, peer)

    def act_as(self, session, acting):
        return self.auth_protocol.act_as(session, *super().act_as(session, acting))

    def authenticated(self, session) -> bool:
        return self.auth_protocol.authenticated(session)

    def admits_unauthenticated(self, ctx, method) -> bool:
        return self.auth_protocol.admits_unauthenticated(ctx, method)

    async def dispatch(self, ctx, method, args, *, recall: bool = True):
        """A server that is not active refuses every call but the ``ANY_ROLE_METHODS``
        with ``StandbyError`` before anything is looked at: the client moves on. An
        observer serves ``OBSERVER_METHODS`` once it has applied the client's state id. An
        active refuses them too while it cannot vouch for its term (``sure_of_term``).
        A call naming paths first recalls another client's directory lease on them
        (``recall`` False: a holder's batched change, which names its directories by
        inode) and is counted in flight, so a grant can wait for it (a batched change is
        not)."""
        ha = self.ha
        if ha is not None and method not in ANY_ROLE_METHODS:
            if ha.role is Role.ACTIVE:
                # a deposed active that has not noticed yet answers nobody, reads included
                if not ha.sure_of_term():
                    raise StandbyError(ha.unsure())
            elif ha.role is not Role.OBSERVER or method not in OBSERVER_METHODS:
                raise StandbyError(ha.refusal())
            elif ctx.state_id > self.ns.view.applied_txid:
                await ha.wait_applied(ctx.state_id, self.config.ha_observer_wait)
        # another client's directory lease is recalled first, by the active
        leases = self.dir_lease_service
        if method not in ACCESS_ARGS:
            return await super().dispatch(ctx, method, args)
        if recall and leases.active:
            if ha is None or ha.role is Role.ACTIVE:
                await leases.before_access(ctx, method, args)
            elif (held := leases.held_by_other(method, args, caller_name(ctx))) is not None:
                # only the active recalls: a read here would miss what the holder has
                # not sent yet, so it goes to the active, which recalls the lease first
                raise StandbyError(f"{held} is leased to another client: the active "
                                   f"answers after recalling it")
        # a lease request (a grant would wait for itself) and a holder's batched change are
        # not waited for: a batched change changes only folders its holder holds, and a
        # folder being granted is held by nobody (DirLeases.acquire)
        if method not in DRAINED or not recall:
            return await super().dispatch(ctx, method, args)
        generation = leases.enter()
        token = IN_FLIGHT.set(generation)
        try:
            return await super().dispatch(ctx, method, args)
        finally:
            IN_FLIGHT.reset(token)
            leases.leave(generation)

    @property
    def inline_paused(self) -> bool:
        """While directory leases are held, a read may wait for a recall: it gets a task
        of its own then, so the other calls of its connection are not held up."""
        return len(self.dir_leases) > 0

    def state_id(self) -> int:
        return self.ns.view.applied_txid

    async def activate(self) -> None:
        """Become the active server after following the log (ha = etcd): format a new
        namespace, renew every lease from now (HDFS renews all leases when a NameNode
        becomes active: holders had no server to renew with during the failover), and
        leave safe mode as its rules say. The HA controller then starts the active-only
        monitors."""
        await self.format_if_new()
        self.leases.rebuild(self.ns.view.under_construction(), self.clock())
        self.dir_lease_service.rebuild(self.ns.view.dir_leases())   # fresh timers, as files'
        self.lock_service.rebuild(self.ns.view.lock_holders())     # the holders reclaim
        self.became_active()
        self.update_safemode()

    def became_active(self) -> None:
        """Once per takeover, when this server starts serving as active (``activate``;
        trio thread, no await). Block servers reported to it while it followed
        the log, but it cannot know which deletions its predecessor already carried out:
        hand out no INVALIDATE to a block server until its next full report (asked for at
        its next heartbeat) was processed (``DatanodeManager.start_epoch``)."""
        self.datanodes.start_epoch()
        dropped = self.reports.drop_pending()
        if dropped:
            log.info("%d reported replicas the log had not explained yet are left to the "
                     "fresh full reports", dropped)

    # ================================================================== apply (journal)
    def _apply(self, records) -> None:
        """The journal's apply: one LevelDB write, then the in-memory structures (each op's
        ``apply`` and ``apply_memory``, ``meta.journal.ops``)."""
        ops = [decode(record) for record in records]
        effects = self.ns.apply(records, ops)
        self._note_calls(ops)
        if self._recovering:
            return
        for record, op, effect in zip(records, ops, effects):
            try:
                self._forget(effect)
                if effect.orphan is not None:
                    self.monitors.wake_reclaimer()
                op.apply_memory(self.memory, effect, self.clock())
            except Exception:   # memory is rebuilt at restart; never fail a durable batch
                log.exception("updating memory state for txid %d (%s) failed",
                              record.txid, record.op)

    def _note_calls(self, ops) -> None:
        """The retry-cached calls applied records were written for go into the retry cache
        as applied with an unknown answer (``RetryCache.note``): a retry after a failover
        or a restart gets its answer rebuilt (``retry_answer``), not a second run. This
        server's own running calls are already there and stay as they are."""
        for op in ops:
            if op.extra:
                call = op.rpc_call()
                if call is not None:
                    self.retry_cache.note(call, op.rpc_kept())

    async def retry_answer(self, ctx, method, args, rerun, kept=None):
        """The answer of a call applied before a failover or restart
        (``meta.services.retry_answers``)."""
        return await retry_answers.answer(self, ctx, method, args, rerun, kept)

    def _forget(self, effect: Effect) -> None:
        """Blocks that left the namespace go to invalidate sets; their leases end."""
        for block_id in effect.removed_blocks:
            for node_id, ref in self.blocks.remove(block_id):
                self.datanodes.add_invalidate(node_id, ref)
        for ino in effect.removed_uc:
            self.recovery.lease_ended(ino)
        for block_id in effect.removed_blocks:
            self.recovery.forget_recovery(block_id)

    def update_safemode(self) -> None:
        self.safemode.update(self.clock(), self.blocks.safe, self.blocks.total_countable,
                             len(self.datanodes.live_nodes()))

    def node_dead(self, node) -> None:
        self.reports.abandon(node.node_id)   # an unfinished full report is void
        affected = self.blocks.remove_node(node.node_id)
        self.redundancy.forget_node(node.node_id)
        log.info("block server %s removed: %d replicas left the blocks map",
                 node.node_id, len(affected))
