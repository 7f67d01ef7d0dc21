"""The metadata server (the HDFS NameNode role): its core — state, startup/recovery, the
journal's apply, the lock and permission helpers, lease release and block recovery,
monitors, checkpoints. How a process runs it (sockets, restarts) is ``serverrun.py``.

Why it exists: it is the shell around the pure parts. ``namespace.py`` validates and applies
journal records (what each op does, in the store and here in memory, is its class in
``ops.py``), ``leases.py``/``blocks.py``/``datanodes.py``/``safemode.py`` are I/O-free
state machines; this module wires them to the journal, the path locks, the clock and the
wire (every method of docs/PROTOCOL.md §2). The RPC handlers live by role, as HDFS separates
them, in mixins ``MetaServer`` composes: ``client_protocol.py`` (ClientProtocol: namespace
and write path), ``datanode_protocol.py`` (DatanodeProtocol: block servers),
``admin_protocol.py`` (report, safe mode, decommission, fsck, save_namespace, content
summary); ``redundancy.py`` holds the replication monitor's decisions. Their methods run on
this one object; the helpers without a leading underscore here (``mutation``, ``file_lock``,
``with_ancestor_locks``, ``reading``, ``log_plan``, ``check_access``, ``located``, ...) are the
core's API for them.

Mutation order (every mutating RPC): safe-mode check → global lock (read) → path locks →
validate and decide in memory (``ns.plan_*``; a ``LeaseFSError`` leaves everything
unchanged) → ``await journal.log(op, args)``, which returns after the record is fsynced AND
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
``meta.retry_answers`` rebuilds from the current state instead of a second run.

Block reports (full ones in chunks of one ``report_id``, incremental ones) are applied by
``reports.py`` (``BlockReports``), with a checkpoint every ``REPORT_STEP`` entries; the
handlers (``datanode_protocol.py``) only check the caller and the arguments.

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
from contextlib import asynccontextmanager
from functools import partial

import trio

from fs import blocktoken, paths, weblog
from fs.blocktoken import READ as READ_TOKEN, KeyRing
from fs.config import Config
from fs.errors import InvalidArgument, StandbyError, TryAgain
from fs.hastatus import HAStatus, Role
from fs.metrics import new_registry
from fs.retry_cache import CallKey
from fs.rpc import LOCAL_PEER_PREFIX, Dispatcher, RetryCache, current_user

from .blocks import blocks as bm
from .journal import retry_answers
from .blocks.blocks import BlockInfo, BlocksMap
from .metrics import MetaMetrics
from .blocks.datanodes import DatanodeManager
from .gcpolicy import GcGovernor
from .journal import checkpoint as checkpoints
from .ha.bootstrap import CHUNK_BYTES, ImageSource
from .journal.checkpoint import CheckpointInfo
from .journal.journal import Journal
from .journal.kv import KVStore, PlyvelStore
from .leases.leases import STALE_HEARTBEATS, LeaseManager
from .namespace.locks import (LOCK_ANCESTOR, LOCK_READ, FileLock, Mutation, PathLockPool, RWLock,
                    lock_set, merge)
from .namespace.namespace import DIR, Defaults, Namespace, check_int, check_name
from .journal.ops import LAZY_OPS, RPC_CALL, RPC_KEPT, decode, op_name
from .blocks.replication import ReplicationQueues
from .blocks.reports import REPORT_STEP, BlockReports
from .namespace.permissions import WRITE, Caller, PermissionChecker, clears_only_setid
from .harole import SERVING
from .blocks.safemode import SafeModeState
from .startup import Phase, StartupProgress
from .timeslice import TimeSlice
from .protocols.admin import AdminProtocol
from .protocols.client import ClientProtocol
from .protocols.namespace import NamespaceProtocol
from .protocols.datanode import DatanodeProtocol
from .blocks.redundancy import Redundancy
from .leases.release import LeaseRelease, Recovery
from .monitors import Monitors
from .protocols.user_auth import AuthProtocol, ProxyRules

log = logging.getLogger(__name__)

REPLAY_CHUNK = 512
LOCK_RETRIES = 8
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
#: the host of a caller on the local socket: this machine, as block servers on it name it
LOOPBACK_HOST = "127.0.0.1"
# a handed-out INVALIDATE not reported done after this many heartbeat intervals is resent
# (its heartbeat reply may have been lost)
INVALIDATE_RESEND_HEARTBEATS = 10
# calls a restart's look back notes in the retry cache at once (``note_all``): a handful of
# dict inserts, well under a time slice
LOOK_BACK_BATCH = 256
# ``LAZY_OPS`` (``meta.ops``, the ops with ``lazy``): journal ops that only change the
# namespace: a client without ``sync_metadata`` is answered once they are written, before
# their fsync (they hand out no block id or generation stamp, and block deletions they cause
# wait for the fsync: ``DatanodeManager.take_invalidate``); FSYNC and INLINE only for a
# flush (``fsync(sync=false)``), an hsync waits for its fsync


class MetaServer(ClientProtocol, NamespaceProtocol, DatanodeProtocol, AdminProtocol,
                 AuthProtocol, LeaseRelease, Redundancy, Monitors, Dispatcher):
    """Every RPC of PROTOCOL.md §2 as ``rpc_<method>(ctx, **args)``: the handlers come from
    the role mixins, which calls go through the retry cache or run inline is declared here."""

    retry_cached = frozenset({"mkdirs", "create", "add_block", "complete", "delete", "rename",
                              "rename_many", "create_symlink", "append", "truncate", "rewrite",
                              "recover_lease"})

    # reads that never await (they see the state between two applied journal batches)
    inline_methods = frozenset({"get_file_info", "exists", "list_status",
                                "get_block_locations", "report", "get_server_defaults"})

    def __init__(self, config: Config, kv: KVStore, journal_dir: str, *,
                 clock=time.monotonic, wall_ns=time.time_ns):
        super().__init__(RetryCache(expiry=config.retry_cache_expiry,
                                    max_entries=config.retry_cache_entries))
        self.config = config
        self.kv = kv
        self.clock = clock
        self.wall_ns = wall_ns
        # HDFS: the superuser is the user running the NameNode unless configured; it owns
        # the root directory of a new namespace, whose group is the supergroup
        self.superuser = config.superuser or current_user()
        # the cluster key block servers prove they hold (security = secure; set by
        # run_meta_server), None: simple, every peer is believed
        self.node_key: bytes | None = None
        # block keys tokens are made with (security = secure; set by run_meta_server)
        self.block_keys: KeyRing | None = None
        self.proxy_rules = ProxyRules.parse(config.proxy_users, self.superuser)
        self.metrics_registry = new_registry()      # /metrics (web.py)
        self.tokens: dict = {}        # delegation tokens: seq → TokenState (user_auth.py)
        self._next_token = 1
        self.permissions = PermissionChecker(superuser=self.superuser,
                                             supergroup=config.supergroup,
                                             enabled=config.permissions_enabled)
        defaults = Defaults.from_config(config)
        defaults.owner, defaults.group = self.superuser, config.supergroup
        self.ns = Namespace(kv, defaults, cache_entries=config.namespace_cache_entries)
        # run by run_meta_server; process-wide, so of several servers in one process (tests)
        # only the first governs
        self.gc_governor = GcGovernor(config.gc_full_collect_interval)
        self.blocks = BlocksMap(config.min_replication)
        self.leases = LeaseManager(config.lease_soft_limit, config.lease_hard_limit)
        self.datanodes = DatanodeManager(
            dead_interval=config.dead_node_interval, invalidate_limit=config.invalidate_limit,
            clock=clock, invalidate_timeout=INVALIDATE_RESEND_HEARTBEATS * config.heartbeat_interval,
            applied_txid=lambda: self.ns.applied_txid,
            stale_interval=STALE_HEARTBEATS * config.heartbeat_interval)
        self.safemode = SafeModeState(config.safemode_threshold, config.safemode_extension,
                                      config.safemode_min_storage)
        self.global_namespace_lock = config.namespace_lock == "global"
        self.locks = PathLockPool()
        self.global_lock = RWLock()
        self.journal = Journal(journal_dir, self._apply,
                               keep_segments=config.journal_keep_segments,
                               sync_delay=config.journal_sync_delay)
        self._recovering = False
        self.last_checkpoint = CheckpointInfo()   # read from the store by recover()
        self._started_ns = wall_ns()
        self.startup = StartupProgress(self._started_ns / 1e9)
        self.recent_log = weblog.install()   # the web pages' recent log lines
        self._release_logged: set[int] = set()
        self.checkpoints = 0
        self.reports = self._new_reports()
        self._reclaim_wakeup = trio.Event()
        self.reclaim_records = 0
        self.recoveries: dict[int, Recovery] = {}            # block id → running recovery
        self.recover_commands: dict[str, dict[int, dict]] = {}   # node → block id → command
        self.replication = ReplicationQueues(
            pending_timeout=config.replication_pending_timeout,
            max_streams=config.replication_max_streams)
        self.transfer_commands: dict[str, list[dict]] = {}   # node → TRANSFER commands
        # /metrics: per call (serve_rpc's hook), per journal sync, the rest at scrape time
        self.metrics = MetaMetrics(self)
        self.call_observer = self.metrics.observe_call
        self.journal.sync_observer = self.metrics.observe_sync
        # ``meta.ha.HAController`` with ha = etcd (set by run_meta_server), None: always active
        self.ha = None
        # images of the store other servers bootstrap from (``meta.bootstrap``)
        self.images = ImageSource(clock)

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
        applied = self.ns.applied_txid
        self.kv.sync()
        self.journal.open(store_applied=applied)
        self.last_checkpoint = checkpoints.load(self.kv)
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
                 applied, self.startup.replayed, self.ns.applied_txid)

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
        if not self.ns.formatted:
            namespace_id = secrets.randbelow(1 << 31) + 1
            await self.journal.log(self.ns.plan_format(namespace_id, self.wall_ns()))
            log.info("formatted a new namespace, id %d", namespace_id)

    def _new_reports(self) -> BlockReports:
        return BlockReports(self.blocks, self.datanodes, self.update_safemode, step=REPORT_STEP,
                            following=lambda: not self.is_active)

    def rebuild_memory(self) -> None:
        self.blocks = BlocksMap(self.config.min_replication)
        self.reports = self._new_reports()
        for ino, index, block, replication in self.ns.all_blocks():
            self.blocks.add(BlockInfo(block["id"], ino, index, block["gs"], block["num_bytes"],
                                      block["state"], replication))
        self.leases.rebuild(self.ns.under_construction(), self.clock())
        self.load_tokens()
        if len(self.blocks) and self.safemode.min_storage < 1:
            # blocks (even only ones being written) are useless until a block server is back:
            # startup safe mode waits for one, so writers retry (SafeMode) instead of failing
            # add_block with NoSpace in the seconds before the block servers re-register (the
            # default waits for one in any case: an empty namespace is about to get blocks)
            self.safemode.min_storage = 1
        self.update_safemode()
        log.info("loaded %d files, %d directories, %d blocks, %d files under construction",
                 self.ns.file_count(), self.ns.dir_count(), len(self.blocks),
                 self.leases.open_files())

    # ================================================================== HA role
    def ha_status(self) -> HAStatus:
        """This server's role, epoch, applied txid and lag (``fs.hastatus``)."""
        if self.ha is None:
            return HAStatus(applied_txid=self.ns.applied_txid)
        return self.ha.status()

    @property
    def role(self) -> Role:
        return Role.ACTIVE if self.ha is None else self.ha.role

    @property
    def is_active(self) -> bool:
        """Only the active server mutates, hands out block-server commands, runs monitors."""
        return self.ha is None or self.ha.role is Role.ACTIVE

    @property
    def serving(self) -> bool:
        return self.role in SERVING

    async def dispatch(self, ctx, method, args):
        """A server that is not active refuses every call but the ``ANY_ROLE_METHODS``
        with ``StandbyError`` before anything is looked at: the client moves on. An
        observer serves ``OBSERVER_METHODS`` once it has applied the client's state id. An
        active refuses them too while it cannot vouch for its term (``sure_of_term``)."""
        ha = self.ha
        if ha is not None and method not in ANY_ROLE_METHODS:
            if ha.role is Role.ACTIVE:
                # a deposed active that has not noticed yet answers nobody, reads included
                if not ha.sure_of_term():
                    raise StandbyError(ha.unsure())
            elif ha.role is not Role.OBSERVER or method not in OBSERVER_METHODS:
                raise StandbyError(ha.refusal())
            elif ctx.state_id > self.ns.applied_txid:
                await ha.wait_applied(ctx.state_id, self.config.ha_observer_wait)
        return await super().dispatch(ctx, method, args)

    def state_id(self) -> int:
        return self.ns.applied_txid

    async def rpc_msync(self, ctx):
        """HDFS msync: the active's state id, so that the caller's next reads on an
        observer see everything acknowledged before this call (its reply carries it)."""
        return {"state_id": self.ns.applied_txid}

    async def activate(self) -> None:
        """Become the active server after following the log (ha = etcd): format a new
        namespace, renew every lease from now (HDFS renews all leases when a NameNode
        becomes active: holders had no server to renew with during the failover), and
        leave safe mode as its rules say. The HA controller then starts the active-only
        monitors."""
        await self.format_if_new()
        self.leases.rebuild(self.ns.under_construction(), self.clock())
        self.became_active()
        self.update_safemode()

    async def rpc_ha_status(self, ctx, reset_lag=False):
        """This server's role, epoch, applied txid and lag (``fs.hastatus.HAStatus``), with
        ``lag_stats`` (count, p50, p99, max seconds of the recent lag samples of a
        follower); ``reset_lag``: start a new sample window (a benchmark's measurement)."""
        answer = self.ha_status().to_wire()
        if self.ha is not None:
            answer["lag_stats"] = self.ha.lag_stats()
            if reset_lag:
                self.ha.lag_samples.clear()
        return answer

    async def rpc_ha_failover(self, ctx):
        """``haadmin -failover``: the active gives its term away (superuser only)."""
        self.permissions.check_superuser(self.caller_of(ctx), "haadmin -failover")
        if self.ha is None:
            raise StandbyError("ha = none: there is no other metadata server to fail over to")
        return await self.ha.resign()

    async def rpc_image_read(self, ctx, min_txid=0, session=None, after=None):
        """A page of a consistent image of the namespace store (``meta.bootstrap``): the
        first call (no ``session``) opens one at this server's applied txid, at least
        ``min_txid``; the next ones pass ``session`` and the last key read (``after``).
        Only for the cluster's servers (a connection that proved the cluster key) or the
        superuser: the image is everything, permissions included."""
        if ctx.session.get("node") is None:
            self.permissions.check_superuser(self.caller_of(ctx), "image_read")
        check_int(min_txid, "image_read: min_txid", low=0)
        if session is not None and not isinstance(session, str):
            raise InvalidArgument("image_read: session must be a string")
        if after is not None and not isinstance(after, bytes):
            raise InvalidArgument("image_read: after must be bytes")
        if not isinstance(self.kv, PlyvelStore):
            raise InvalidArgument("image_read: this server's store takes no snapshots")
        return self.images.read(self.kv, self.ns.applied_txid, min_txid=min_txid,
                                session=session, after=after,
                                max_bytes=max(1, min(CHUNK_BYTES, self.config.max_frame // 4)))

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
        ``apply`` and ``apply_memory``, ``meta.ops``)."""
        ops = [decode(record) for record in records]
        effects = self.ns.apply(records, ops)
        self._note_calls(ops)
        if self._recovering:
            return
        for record, op, effect in zip(records, ops, effects):
            try:
                self._forget(effect)
                if effect.get("orphan") is not None:
                    self._reclaim_wakeup.set()
                op.apply_memory(self, effect, self.clock())
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
        (``meta.retry_answers``)."""
        return await retry_answers.answer(self, ctx, method, args, rerun, kept)

    # the state ops update after their store write (``meta.ops.MemoryState``)
    def commit_in_memory(self, block_id: int, num_bytes: int) -> None:
        info = self.blocks.get(block_id)
        if info is None:
            return
        if info.state == bm.UNDER_CONSTRUCTION:
            self.blocks.commit(block_id, num_bytes)
        else:
            self.blocks.set_length(block_id, num_bytes)

    def lease_ended(self, ino: int) -> None:
        """File ``ino`` is no longer under construction (closed, or its lease went)."""
        self.leases.remove_file(ino)
        self._release_logged.discard(ino)

    def _forget(self, effect: dict) -> None:
        """Blocks that left the namespace go to invalidate sets; their leases end."""
        for block_id in effect.get("removed_blocks", ()):
            for node_id, ref in self.blocks.remove(block_id):
                self.datanodes.add_invalidate(node_id, ref)
        for ino in effect.get("removed_uc", ()):
            self.lease_ended(ino)
        for block_id in effect.get("removed_blocks", ()):
            self.forget_recovery(block_id)

    def forget_recovery(self, block_id: int) -> None:
        rec = self.recoveries.pop(block_id, None)
        if rec is not None and rec.primary is not None:
            self.recover_commands.get(rec.primary, {}).pop(block_id, None)

    # ================================================================== helpers
    async def log_plan(self, plan, *, durable: bool = True, kept=None) -> int | None:
        """Journal a plan and wait until it is applied and durable; ``durable=False`` (a
        client without ``sync_metadata``): applied and written, when its op is in
        ``LAZY_OPS``. ``kept``: what a retry of the running retry-cached call needs of its
        answer (``Journal.log_many``)."""
        if plan is None:
            return None
        return await self.journal.log(plan, durable=durable or op_name(plan) not in LAZY_OPS,
                                      kept=kept)

    async def log_plans(self, plans, *, durable: bool = True) -> None:
        """Journal several plans in one batch (one fsync), applied in order."""
        plans = [plan for plan in plans if plan is not None]
        await self.journal.log_many(plans, durable=durable or any(
            op_name(plan) not in LAZY_OPS for plan in plans))

    def mutation(self, what: str, wanted: dict, *, check_safemode: bool = True):
        """``async with``: hold what a mutation needs from validation to its applied journal
        record: the global lock in read mode + its path locks (``namespace_lock=fine``), or
        the global lock in write mode alone (``namespace_lock=global``, the comparison
        baseline)."""
        return Mutation(self.global_lock, self.locks, self.global_namespace_lock, wanted,
                        partial(self.safemode.check, what) if check_safemode else None)

    @asynccontextmanager
    async def reading(self, parts):
        """For reads that await between store reads (content summary, fsck): LOCK_READ on
        the path, or the global lock in read mode under ``namespace_lock=global``."""
        if self.global_namespace_lock:
            await self.global_lock.acquire(False)
            try:
                yield
            finally:
                self.global_lock.release(False)
        else:
            async with self.locks.hold(lock_set(parts, LOCK_READ)):
                yield

    async def with_ancestor_locks(self, what: str, parts, body, *, keep_parent_write=True,
                                  extra: dict | None = None):
        """Run ``body()`` under LOCK_ANCESTOR for ``parts`` (LOCK_PARENT when the parent
        exists), re-checking after the wait that no locked-out ancestor vanished."""
        canonical = paths.join_parts(parts)
        for _ in range(LOCK_RETRIES):
            depth = self.ns.existing_depth(canonical)
            if keep_parent_write:
                depth = min(depth, max(0, len(parts) - 1))
            wanted = lock_set(parts, LOCK_ANCESTOR, depth)
            if extra:
                wanted = merge(wanted, extra)
            async with self.mutation(what, wanted):
                if self.ns.existing_depth(canonical) < depth:
                    continue   # an ancestor was removed while we waited: lock again
                return await body()
        raise TryAgain(f"{what}: the namespace kept changing under the request; try again")

    def file_lock(self, what: str, path: str, ino):
        """``async with ... as current``: LOCK_WRITE on a file addressed by inode id (its
        current path) or by path."""
        return FileLock(partial(self.mutation, what), self.ns.path_of, path, ino,
                        LOCK_RETRIES, lambda: TryAgain(f"{what}: the file kept moving under "
                                                       f"the request; try again"))

    # ------------------------------------------------------------------ permissions
    def caller_of(self, ctx) -> Caller:
        """The caller's identity; an in-process caller (``ctx.user`` None) acts as the
        server's own user."""
        user = getattr(ctx, "user", None)
        if user is None:
            return self.permissions.caller(self.superuser)
        return self.permissions.caller(user, getattr(ctx, "groups", ()))

    def checked_caller(self, ctx) -> Caller | None:
        """The caller when permission checks apply to it; None (no walk needed) for the
        superuser or with permissions disabled."""
        caller = self.caller_of(ctx)
        return caller if self.permissions.applies_to(caller) else None

    def inode_chain(self, parts) -> list[dict]:
        """Inodes of the root and the existing leading components of ``parts``."""
        return [inode for _, inode in self.ns.walk(parts, strict=False)]

    def check_access(self, ctx, parts, **needs) -> None:
        """``PermissionChecker.check_path`` for the caller of ``ctx`` on ``parts``."""
        caller = self.checked_caller(ctx)
        if caller is not None:
            self.permissions.check_path(caller, parts, self.inode_chain(parts), **needs)

    def check_set_mode(self, ctx, parts, mode) -> None:
        """chmod's check: the owner (or the superuser); or, for a change that only clears a
        regular file's setuid/setgid bits, a user who may write it (what POSIX does at a
        non-owner's write: the FUSE kernel sends it as a mode change by the writer)."""
        caller = self.checked_caller(ctx)
        if caller is None:
            return
        chain = self.inode_chain(parts)
        if len(chain) == len(parts) + 1 and clears_only_setid(chain[-1], mode):
            self.permissions.check_path(caller, parts, chain, access=WRITE)
        else:
            self.permissions.check_path(caller, parts, chain, owner=True)

    async def check_subtree(self, caller: Caller, parts, access: int, *,
                            ignore_empty_dir: bool = False) -> None:
        """HDFS subAccess: ``access`` on every directory of the subtree at ``parts`` (yields
        by ``TimeSlice``; the caller's path locks keep it still)."""
        found = self.ns.walk(parts, strict=False)
        if len(found) != len(parts) + 1 or found[-1][1]["type"] != DIR:
            return
        walk = TimeSlice()
        for ino, node in self.ns.iter_subtree(*found[-1]):
            self.permissions.check_sub_access(
                caller, node, access, lambda: self.ns.path_of(ino) or f"<inode {ino}>",
                ignore_empty_dir=ignore_empty_dir)
            await walk.tick()

    def new_owner(self, ctx, what: str, canonical: str, owner, group) -> tuple[str, str | None]:
        """Owner and group of a new inode (``PermissionChecker.new_owner``)."""
        owner = check_name(owner, f"{what}: owner", optional=True)
        group = check_name(group, f"{what}: group", optional=True)
        return self.permissions.new_owner(self.caller_of(ctx), canonical, owner, group)

    @staticmethod
    def check_ino(ino, path: str):
        if ino is None or ino == 0:
            return None
        return check_int(ino, f"{path}: ino", low=1)

    def now(self) -> tuple[float, int]:
        return self.clock(), self.wall_ns()

    def location(self, node_id: str) -> dict | None:
        node = self.datanodes.live(node_id)
        return None if node is None else {"node_id": node.node_id, "address": node.address}

    @staticmethod
    def caller_host(ctx) -> str | None:
        """The host a caller runs on, for locality: its TCP peer's address; a caller on the
        local socket runs on this machine, which block servers on loopback share."""
        peer = getattr(ctx, "peer", None)
        if not peer or peer == "?":
            return None
        if peer.startswith(LOCAL_PEER_PREFIX):
            return LOOPBACK_HOST
        return peer.rsplit(":", 1)[0].strip("[]")

    def located(self, block: dict, info: BlockInfo | None, offset: int,
                user: str | None = None, mode: str = READ_TOKEN,
                reader_host: str | None = None) -> dict:
        """A located block for clients (pipeline nodes while being written); with a
        ``user`` and block keys, the block access token (``mode``: read, or write for the
        block's writer) its caller shows block servers. A finished block's replicas come in
        ``DatanodeManager.sort_for_reader``'s order for a reader on ``reader_host``: a new
        order at every call, so that reads spread over every replica."""
        state = info.state if info is not None else block["state"]
        corrupt = False
        if info is None:
            nodes = []
        elif state in (bm.UNDER_CONSTRUCTION, bm.UNDER_RECOVERY):
            nodes = info.location_nodes()
        else:
            nodes = info.good_nodes()
            if not nodes:
                nodes = info.corrupt_nodes()
                corrupt = bool(nodes)
            nodes = self.datanodes.sort_for_reader(nodes, reader_host)
        locations = [loc for loc in map(self.location, nodes) if loc is not None]
        gs = info.gs if info else block["gs"]
        out = {"block": {"id": block["id"], "gs": gs, "num_bytes": block["num_bytes"]},
               "offset": offset, "locations": locations, "state": state, "corrupt": corrupt}
        token = None if user is None else self.block_token(block["id"], gs, user, mode)
        if token is not None:
            out["token"] = token
        return out

    def block_token(self, block_id: int, gs: int, user: str, mode: str) -> dict | None:
        """A block access token for ``mode`` on block ``block_id`` at stamp ``gs``
        (``fs.blocktoken``), or None in security = simple."""
        if self.block_keys is None:
            return None
        return self.block_keys.token(block_id, gs, user, mode, self.wall_ns() / 1e9)

    def token_user(self, ctx) -> str:
        """Whom a block access token is made out to (the server's user in-process)."""
        return getattr(ctx, "user", None) or self.superuser

    def block_keys_for(self, version) -> dict | None:
        """The block keys a block server should hold (rolled first if due), wrapped with the
        cluster key, or None when it already holds version ``version``."""
        ring = self.block_keys
        if ring is None:
            return None
        ring.roll_if_due(self.wall_ns() / 1e9)
        if version == ring.version:
            return None
        return {"version": ring.version,
                "keys": [blocktoken.wrap(self.node_key, k) for k in ring.keys()]}

    def is_complete(self, block: dict) -> bool:
        info = self.blocks.get(block["id"])
        return info is not None and info.state == bm.COMPLETE

    def update_safemode(self) -> None:
        self.safemode.update(self.clock(), self.blocks.safe, self.blocks.total_countable,
                             len(self.datanodes.live_nodes()))

    def node_dead(self, node) -> None:
        self.reports.abandon(node.node_id)   # an unfinished full report is void
        affected = self.blocks.remove_node(node.node_id)
        self.transfer_commands.pop(node.node_id, None)
        self.blocks.mark_dirty(self.replication.forget_node(node.node_id))
        log.info("block server %s removed: %d replicas left the blocks map",
                 node.node_id, len(affected))
