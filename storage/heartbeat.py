"""The block server's conversation with the metadata servers (HDFS BPOfferService with one
BPServiceActor per NameNode): register, full block reports, heartbeats carrying capacity and
usage, the commands that ride on heartbeat replies, and incremental block reports.

Why it exists: the metadata server never calls a block server; everything it wants
done arrives as a command in a heartbeat reply, and everything it knows about replicas comes
from these reports.

Several metadata servers (HA: ``meta_address`` lists every one, comma-separated): one
``MetaActor`` per server does all of the below with that server alone: it registers, sends
full reports, heartbeats and every incremental report to it, whatever its role, so a
standby's blocks map is warm when it takes over. Commands are another matter: every register
and heartbeat reply carries the server's ``"ha"`` status (``fs.hastatus.HAStatus``; absent =
active in epoch 0, ``ha = none``); ``HeartbeatService.active_epoch`` is the newest epoch seen
from a server claiming the active role, and the commands and block keys of a reply are
obeyed only when it says active with an epoch >= that. Others are dropped, counted
(``dropped_commands``) and logged once per server and epoch: a deposed active that has not
noticed yet can delete nothing. Each actor also counts what its replies carried by outcome
and type (``commands``: obeyed or dropped; INVALIDATE, TRANSFER, RECOVER_BLOCK, block_keys
or other), so "no command of a deposed active was run" is a number one can read. A reply
may ask for a full report (``"full_report": true``, a server that just took over and
postpones deletions until it has one). Calls that are not reports
(``commit_block_synchronization``, ``report_bad_blocks``) go to the active server
(``call_active``): the actor whose last reply was obeyable, waiting briefly when none is
known and moving on at a ``StandbyError`` or an unreachable server.

Life cycle (per server): ``register_storage`` → full ``block_report`` → every
``heartbeat_interval`` a ``heartbeat``; its reply may ask to ``reregister`` (the metadata
server forgot us, e.g. after its restart: register again, full report again) and carries
commands: INVALIDATE deletes the replicas in a worker thread and reports them deleted;
RECOVER_BLOCK starts the block recovery worker (``storage.recovery``, this node is the
primary); TRANSFER copies a finalized replica to the listed targets with the command's copy
token (``storage.blockcopy``, at most ``replication_max_streams`` at once; a local replica
found corrupt on the way is reported bad, one whose files are gone or cut is dropped and
reported deleted); other command types are logged once and ignored. ``report_bad_replicas``
sends the block scanner's findings; ``replica_lost`` drops a replica whose files a read, copy
or scan found gone or cut and reports it deleted at once. A full report also goes out every
``block_report_interval``. While the metadata server cannot be reached the loop retries with
doubling backoff and full jitter (``HeartbeatService.backoff``: block servers that lost the
same server come back to it spread out, not in step), logging once per change of state,
never per attempt; after an outage it
registers again (cheap, and a restarted metadata server needs the full report to leave safe
mode).

Incremental reports (``block_received_and_deleted``) are queued per block id (the latest
state of a block wins) and sent at once by their own task, so the write path never waits for
a heartbeat; a "receiving" (RBW) entry waits up to ``RECEIVING_REPORT_DELAY`` for company.

Ordering of reports (per server: each actor has its own queue and lock): a full report is a
snapshot; an incremental report processed before a stale snapshot would be undone by it (a
just-finalized replica removed again, a deleted one re-added). So ``_report_lock`` is held by a
full report from its snapshot until the RPC of its last chunk returned, and by an incremental
report from taking the pending entries until its RPC returned: the metadata server always sees
an incremental report after any full report whose snapshot came before it.

Big full reports: the replica map may hold millions of replicas, so a full report is sent
as chunks of ``block_report_chunk`` entries under one random ``report_id`` (``chunk`` counts
from 0, ``last`` marks the end; the metadata server removes unlisted replicas only at
``last``), and the entries are built ``BUILD_STEP`` at a time from a snapshot of the map's
references, with a checkpoint between pieces. A replica that changes meanwhile is reported
in its newer state or not at all, and its incremental report follows the whole report.

Concurrency contract: all methods run in the block server's trio thread; ``run`` owns the
actors, each its RPC client and tasks; ``block_received``/``blocks_deleted`` never block;
``active_epoch`` and the actors' statuses change only between awaits.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import time

import trio

from fs import blocktoken, nodeauth
from fs import tls as tlsmod
from fs.backoff import Backoff
from fs.config import Config
from fs.errors import (ChecksumError, InvalidArgument, LeaseFSError, RegistrationRefused,
                       ServerUnavailable, StandbyError)
from fs.hastatus import HAStatus, Role
from fs.rpc import RpcClient, format_address, parse_address_list

from .blockcopy import copy_replica
from .recovery import BlockRecoveryWorker
from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)

# report entries built between two checkpoints of the block server's trio thread
BUILD_STEP = 5000
#: the command types ``MetaActor.commands`` counts by name; any other counts as "other" (a
#: peer's made-up type must not grow the metric's series)
COMMAND_TYPES = frozenset({"INVALIDATE", "TRANSFER", "RECOVER_BLOCK"})
#: how a reply's block key set is counted in ``MetaActor.commands``
BLOCK_KEYS = "block_keys"
#: seconds a "receiving" (RBW) report may wait for company: a small block's FINALIZED
#: report usually follows within milliseconds and replaces it, one report instead of two
RECEIVING_REPORT_DELAY = 0.05
#: TEST-ONLY: ``LEASEFS_TEST_CLOCK_OFFSET=SECONDS`` in a block server's environment shifts
#: the wall time it reports to the metadata server (a host whose clock is off), without
#: touching the machine's clock
CLOCK_OFFSET_ENV = "LEASEFS_TEST_CLOCK_OFFSET"


def reported_wall_time() -> float:
    """This host's wall clock as register and heartbeat calls carry it (seconds since the
    epoch): the metadata server compares it with its own."""
    return time.time() + float(os.environ.get(CLOCK_OFFSET_ENV) or 0)


class HeartbeatService:
    """Registration, heartbeats, commands and block reports of one block server, with every
    metadata server of ``meta_address`` (one ``MetaActor`` each)."""

    def __init__(self, config: Config, store: ReplicaStore, meta_address: str,
                 xceiver_count=lambda: 0, key: bytes | None = None):
        self.config = config
        # the cluster key (security = secure): every connection to a metadata server
        # starts with the challenge-response of fs.nodeauth
        self._key = key
        # block keys from the active metadata server (fs.blocktoken): their version, and
        # who takes them (the data-transfer server, which checks readers' tokens with them)
        self.block_keys_version = None
        self.on_block_keys = lambda keys: None
        self.store = store
        self.meta_address = meta_address
        self.actors = [MetaActor(self, format_address(address))
                       for address in parse_address_list(meta_address)]
        # the newest epoch a server claiming the active role sent; only replies saying
        # active in an epoch >= this are obeyed (0: ha = none, every reply of the one server)
        self.active_epoch = 0
        self.xceiver_count = xceiver_count
        self.address: str | None = None
        self.http_port: int | None = None   # our web page's port, told at registration
        self.hdfs_port: int | None = None   # our HDFS data-transfer port, told likewise
        self._ignored_command_types: set[str] = set()
        self.recovery = BlockRecoveryWorker(config, store, self, self._commit_block_sync,
                                            key=key)
        self._nursery: trio.Nursery | None = None
        self._wake_scheduled = False   # a delayed wakeup for RBW entries is on its way
        self._transfer_limiter = trio.CapacityLimiter(max(1, config.replication_max_streams))
        self._transfers: set[int] = set()   # block ids being copied (a resent command waits)
        self.transfers_done = 0
        self.transfers_failed = 0

    # ------------------------------------------------------------------ state, summed up

    @property
    def registered(self) -> bool:
        """Registered with at least one metadata server."""
        return any(actor.registered for actor in self.actors)

    @property
    def heartbeats_sent(self) -> int:
        return sum(actor.heartbeats_sent for actor in self.actors)

    @property
    def full_reports_sent(self) -> int:
        return sum(actor.full_reports_sent for actor in self.actors)

    @property
    def dropped_commands(self) -> int:
        """Commands (and block key sets) dropped: from a server not active, or of an epoch
        older than ``active_epoch``."""
        return sum(actor.dropped_commands for actor in self.actors)

    @property
    def namespace_id(self):
        for actor in sorted(self.actors, key=lambda a: not a.obeyed):
            if actor.namespace_id is not None:
                return actor.namespace_id
        return None

    @property
    def copies_in_progress(self) -> list[int]:
        """Block ids this node is copying to others now (TRANSFER commands)."""
        return sorted(self._transfers)

    # ------------------------------------------------------------------ HA: whom to obey

    def obeys(self, status: HAStatus | None, source: str = "?") -> bool:
        """Whether a reply with this HA status is obeyed; a status claiming active in a
        newer epoch raises ``active_epoch`` first (no await: one step)."""
        if status is None:
            return False
        if status.role is Role.ACTIVE and status.epoch > self.active_epoch:
            log.info("metadata server %s (%s) is active in epoch %d (was %d): commands of "
                     "older epochs are dropped from now on", source, status.node_id or "no id",
                     status.epoch, self.active_epoch)
            self.active_epoch = status.epoch
        return status.role is Role.ACTIVE and status.epoch >= self.active_epoch

    def active_actors(self) -> list["MetaActor"]:
        """Registered actors whose last reply was obeyable (normally one)."""
        return [actor for actor in self.actors if actor.registered and actor.obeyed
                and actor.ha.epoch >= self.active_epoch]

    def _active_wait(self) -> float:
        return min(self.config.rpc_timeout, self.backoff.cap)

    async def call_active(self, method: str, args: dict):
        """Call ``method`` on the active metadata server: an actor whose last reply was
        obeyable. One that answers ``StandbyError`` or cannot be reached is passed over
        until its next reply says active again; when none is known the call waits for one,
        a few heartbeats in all, then fails with ``ServerUnavailable`` naming the servers
        and the last cause."""
        deadline = trio.current_time() + self._active_wait()
        last: Exception | None = None
        while True:
            for actor in self.active_actors():
                try:
                    return await actor.call(method, args)
                except (StandbyError, ServerUnavailable) as exc:
                    last = exc
                    actor.deposed()
                    log.info("%s on metadata server %s failed (%s); trying another",
                             method, actor.address, exc)
            now = trio.current_time()
            if now >= deadline:
                raise ServerUnavailable(
                    f"{method}: no active metadata server of {self.meta_address} took it "
                    f"(last cause: {last or 'none registered and known active yet'})")
            # the next heartbeat replies tell which server is active: look again soon (the
            # first wait each time, the deadline is short), spread like every retry
            await self.backoff.sleep(0, most=deadline - now)

    # ------------------------------------------------------------------ incremental reports

    def block_received(self, block_id: int, gs: int, num_bytes: int, state: str) -> None:
        """Queue ``[id, gs, num_bytes, state]`` for the next incremental report to every
        metadata server: at once, or for an RBW ("receiving") entry within
        ``RECEIVING_REPORT_DELAY`` (nothing waits for those: the metadata server knows a
        block's pipeline from add_block)."""
        rbw = state == ReplicaState.RBW.value and self._nursery is not None
        for actor in self.actors:
            actor.queue_received([block_id, gs, num_bytes, state], wake=not rbw)
        if rbw and not self._wake_scheduled:
            self._wake_scheduled = True
            self._nursery.start_soon(self._wake_after, RECEIVING_REPORT_DELAY)

    async def reports_sent(self, timeout: float) -> bool:
        """Wait until the incremental reports queued so far went out to every metadata
        server (True), or ``timeout`` seconds (False): a writer's last packet is acked
        after its finalized replica is known, so the writer's ``complete`` answers at once.
        Only the active's reports are awaited when it is known (``complete`` goes to it):
        a dead or cut-off standby would otherwise hold every block's last ack ``timeout``."""
        waited = self.active_actors() or self.actors
        marks = [(actor, actor.queued) for actor in waited]
        with trio.move_on_after(timeout):
            for actor, mark in marks:
                await actor.sent_through(mark)
            return True
        return False

    async def _wake_after(self, delay: float) -> None:
        await trio.sleep(delay)
        self._wake_scheduled = False
        for actor in self.actors:
            actor.wake()

    def blocks_deleted(self, block_ids) -> None:
        block_ids = list(block_ids)
        for actor in self.actors:
            actor.queue_deleted(block_ids)

    async def replica_lost(self, block_id: int, gs: int, why) -> bool:
        """A read (or copy, or scan) of our replica ``blk_<id>_<gs>`` failed with ``why``: if
        its files really are gone or cut, the store drops it and it is reported deleted at
        once, so the metadata server stops handing it out and re-replicates (HDFS
        ``invalidateMissingBlock`` + ``notifyNamenodeDeletedBlock``). True if dropped."""
        reason = await self.store.drop_if_lost(block_id, gs)
        if reason is None:
            return False
        log.warning("replica blk_%d_%d is lost (%s; noticed after: %s); reporting it deleted",
                    block_id, gs, reason, why)
        self.blocks_deleted([block_id])
        return True

    # ------------------------------------------------------------------ main loop

    @property
    def backoff(self) -> Backoff:
        """The waits of the retry loops to a metadata server: from a heartbeat interval or
        0.05 s (the shorter), doubling up to five heartbeat intervals (1 s to 30 s), full
        jitter."""
        interval = self.config.heartbeat_interval
        return Backoff(first=min(0.05, interval), factor=2,
                       cap=min(30.0, max(1.0, 5 * interval)), jitter=1.0)

    async def run(self, advertise_address: str) -> None:
        """Run forever (until cancelled); never raises on metadata server trouble, only
        ``RegistrationRefused`` (this block server's settings are wrong for the cluster)."""
        self.address = advertise_address
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for actor in self.actors:
                nursery.start_soon(actor.run)

    @property
    def secure(self) -> bool:
        """A cluster key is installed (security = secure): calls to metadata servers are
        authenticated and carry the block keys' version."""
        return self._key is not None

    async def authenticate(self, call, address: str | None = None) -> None:
        """``fs.nodeauth`` on a new connection to ``address`` (a ``MetaActor``'s): prove we
        hold the cluster key, and check that the metadata server does too (else it could
        command us)."""
        await nodeauth.authenticate(call, self._key, self.store.node_id,
                                    address or self.meta_address)

    def take_block_keys(self, wire, source: str) -> None:
        """Block keys an obeyed metadata server sent (wrapped with the cluster key)."""
        if wire is None or self._key is None:
            return
        try:
            keys = {k.key_id: k.secret for k in
                    (blocktoken.unwrap(self._key, w) for w in wire["keys"])}
            version = wire["version"]
        except (KeyError, TypeError, ValueError, LeaseFSError) as exc:
            # tampered, another cluster's, or malformed: keep the keys held, serve on
            log.warning("block keys from %s refused (keeping the ones held): %s", source, exc)
            return
        self.on_block_keys(keys)
        self.block_keys_version = version

    # ------------------------------------------------------------------ commands

    def handle_command(self, command) -> None:
        """Run one command of an obeyed reply (``MetaActor``); never blocks."""
        kind = command.get("type") if isinstance(command, dict) else None
        if kind == "INVALIDATE" and isinstance(command.get("blocks"), list):
            self._nursery.start_soon(self._invalidate, command["blocks"])
            return
        if kind == "RECOVER_BLOCK":
            self._nursery.start_soon(self.recovery.recover, command)
            return
        if kind == "TRANSFER":
            self._nursery.start_soon(self._transfer, command)
            return
        label = str(kind)[:40]
        if label not in self._ignored_command_types:   # once per type, not per heartbeat
            self._ignored_command_types.add(label)
            log.warning("ignoring metadata server command %s (not supported by this block "
                        "server): %r", label, command)

    async def _commit_block_sync(self, args: dict) -> None:
        """The block recovery worker's last step (PROTOCOL.md §4)."""
        await self.call_active("commit_block_synchronization", args)

    async def _transfer(self, command: dict) -> None:
        """TRANSFER: copy our finalized replica of ``block`` to ``targets``, showing them the
        command's copy token (security = secure)."""
        block, targets = command.get("block"), command.get("targets")
        if not (isinstance(block, dict) and isinstance(block.get("id"), int)
                and isinstance(block.get("gs"), int) and isinstance(targets, list) and targets
                and all(isinstance(t, str) for t in targets)):
            log.warning("TRANSFER: malformed command ignored: %r", command)
            return
        block_id, gs = block["id"], block["gs"]
        if block_id in self._transfers:
            return
        self._transfers.add(block_id)
        try:
            async with self._transfer_limiter:
                started = trio.current_time()
                sent = await copy_replica(self.config, self.store, block_id, gs, targets,
                                          client=f"transfer-{self.store.node_id}",
                                          token=command.get("token"))
            self.transfers_done += 1
            log.info("TRANSFER blk_%d_%d: %d bytes copied to %s in %.2fs", block_id, gs, sent,
                     ", ".join(targets), trio.current_time() - started)
        except ChecksumError as exc:
            self.transfers_failed += 1
            log.warning("TRANSFER blk_%d_%d: local replica is corrupt (%s); reporting it",
                        block_id, gs, exc)
            try:
                await self.report_bad_replicas([(block, str(exc))])
            except LeaseFSError as report_exc:
                log.warning("could not report blk_%d bad: %s", block_id, report_exc)
        except OSError as exc:   # our disk, not the target
            self.transfers_failed += 1
            log.warning("TRANSFER blk_%d_%d to %s: reading the local replica failed: %s",
                        block_id, gs, ", ".join(targets), exc)
            await self.replica_lost(block_id, gs, exc)
        except LeaseFSError as exc:
            self.transfers_failed += 1
            log.warning("TRANSFER blk_%d_%d to %s failed: %s", block_id, gs,
                        ", ".join(targets), exc)
        finally:
            self._transfers.discard(block_id)

    async def report_bad_replicas(self, bad: list) -> None:
        """``report_bad_blocks`` for replicas of this node: ``[(block ref, reason)]``."""
        await self.call_active("report_bad_blocks", {"blocks": [
            {"block": {"id": ref["id"], "gs": ref["gs"],
                       "num_bytes": ref.get("num_bytes", 0)}, "node_id": self.store.node_id}
            for ref, _reason in bad]})

    async def _invalidate(self, blocks: list) -> None:
        deleted = []
        for block in blocks:
            block_id = block.get("id") if isinstance(block, dict) else None
            gs = block.get("gs") if isinstance(block, dict) else None
            if not isinstance(block_id, int) or not isinstance(gs, int):
                log.warning("INVALIDATE: malformed block %r ignored", block)
                continue
            if await self.store.invalidate(block_id, gs):
                deleted.append(block_id)
        if deleted:
            log.info("INVALIDATE: deleted %d replicas", len(deleted))
            self.blocks_deleted(deleted)


class MetaActor:
    """The conversation with ONE metadata server (HDFS BPServiceActor): its RPC client, its
    registration, its full and incremental reports (own queue, own ``_report_lock``), its
    heartbeats, and the HA status of its last reply, which decides whether the commands of
    that reply are obeyed (``HeartbeatService.obeys``)."""

    def __init__(self, service: HeartbeatService, address: str):
        self.service = service
        self.config = service.config
        self.store = service.store
        self.address = address
        self.namespace_id = None
        self.registered = False
        self.heartbeats_sent = 0
        self.full_reports_sent = 0
        self.ha: HAStatus | None = None   # from its last register or heartbeat reply
        self.obeyed = False               # whether that reply's commands were obeyed
        self.dropped_commands = 0
        # (outcome, type) -> commands of its replies: outcome "obeyed" or "dropped"
        self.commands: collections.Counter[tuple[str, str]] = collections.Counter()
        self._dropped_logged: set[tuple] = set()   # (role, epoch) already logged
        self._registered_event = trio.Event()
        self._meta_without_hdfs = False   # it refused register_storage's hdfs_port
        self._rpc: RpcClient | None = None
        self._pending_received: dict[int, list] = {}
        self._pending_deleted: dict[int, None] = {}
        # entries queued so far, and how many of them went out (``sent_through``)
        self.queued = 0
        self._sent = 0
        self._sent_event = trio.Event()
        self._wakeup = trio.Event()
        self._outage: str | None = None          # last logged failure kind, None = all well
        self._report_lock = trio.Lock()   # full vs. incremental reports, see the docstring

    # ------------------------------------------------------------------ incremental reports

    def queue_received(self, entry: list, wake: bool = True) -> None:
        block_id = entry[0]
        self._pending_deleted.pop(block_id, None)
        self._pending_received.pop(block_id, None)   # re-insert: keep the latest at the end
        self._pending_received[block_id] = entry
        self.queued += 1
        if wake:
            self._wakeup.set()

    async def sent_through(self, mark: int) -> None:
        """Return once the first ``mark`` queued received entries went out."""
        while self._sent < mark:
            await self._sent_event.wait()

    def queue_deleted(self, block_ids) -> None:
        for block_id in block_ids:
            self._pending_received.pop(block_id, None)
            self._pending_deleted[block_id] = None
        self._wakeup.set()

    def wake(self) -> None:
        self._wakeup.set()

    async def _incremental_report_loop(self) -> None:
        failures = 0
        while True:
            await self._wakeup.wait()
            while not self.registered:
                await self._registered_event.wait()
            async with self._report_lock:   # never overtake a full report's snapshot
                if not self.registered:      # that full report failed: wait for the next
                    continue
                self._wakeup = trio.Event()
                mark = self.queued
                received = list(self._pending_received.values())
                deleted = list(self._pending_deleted)
                self._pending_received, self._pending_deleted = {}, {}
                try:
                    if received or deleted:
                        await self._rpc.call("block_received_and_deleted",
                                             {"node_id": self.store.node_id,
                                              "received": received, "deleted": deleted},
                                             retry_seconds=0)
                    failure = None
                    self._sent = mark
                    self._sent_event.set()
                    self._sent_event = trio.Event()
                except LeaseFSError as exc:
                    failure = exc
                    for entry in received:   # a newer state queued meanwhile wins
                        if entry[0] not in self._pending_deleted:
                            self._pending_received.setdefault(entry[0], entry)
                    for block_id in deleted:
                        if block_id not in self._pending_received:
                            self._pending_deleted.setdefault(block_id, None)
                    self._wakeup.set()
            if failure is not None:
                delay = self.service.backoff.delay(failures)
                log.debug("incremental block report to %s failed (%s); retrying in %.2fs",
                          self.address, failure, delay)
                await trio.sleep(delay)
                failures += 1
                continue
            failures = 0

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        """Run forever (until cancelled); never raises on metadata server trouble, only
        ``RegistrationRefused`` (a fault of this block server's settings)."""
        service = self.service
        async with RpcClient(self.address, f"storage-{self.store.node_id}",
                             timeout=self.config.rpc_timeout, retry_seconds=0,
                             connect_timeout=min(5.0, self.config.rpc_timeout),
                             max_frame=self.config.max_frame,
                             authenticate=self._authenticate if service.secure else None,
                             # a node proves itself with the cluster key, not as a local user
                             local_socket=None, tls=tlsmod.client(self.config)) as rpc:
            self._rpc = rpc
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._incremental_report_loop)
                await self._heartbeat_loop()

    async def call(self, method: str, args: dict):
        """One call on this server (``HeartbeatService.call_active`` picks the server)."""
        if self._rpc is None or not self.registered:
            raise ServerUnavailable(f"{method}: not registered with metadata server "
                                    f"{self.address} yet")
        return await self._rpc.call(method, args, retry_seconds=0)

    def summary(self) -> dict:
        """This server as the block server's web page shows it."""
        return {"address": self.address, "registered": self.registered,
                "role": self.ha.role.value if self.ha else None,
                "epoch": self.ha.epoch if self.ha else None, "obeyed": self.obeyed,
                "heartbeats_sent": self.heartbeats_sent,
                "full_reports_sent": self.full_reports_sent,
                "dropped_commands": self.dropped_commands,
                "commands": {outcome: {kind: n for (o, kind), n in sorted(self.commands.items())
                                       if o == outcome} for outcome in ("obeyed", "dropped")}}

    def deposed(self) -> None:
        """It answered ``StandbyError`` (or could not be reached): not taken for the active
        one until its next reply says so again."""
        self.obeyed = False

    async def _heartbeat_loop(self) -> None:
        service = self.service
        failures = 0
        next_full_report = 0.0
        while True:
            try:
                if not self.registered:
                    await self._register()
                    next_full_report = trio.current_time() + self.config.block_report_interval
                reply = await self._heartbeat()
                if self._outage is not None:
                    log.info("metadata server %s answers again", self.address)
                    self._outage = None
                failures = 0
                if not isinstance(reply, dict):
                    log.warning("malformed heartbeat reply from %s ignored: %r",
                                self.address, reply)
                    reply = {}
                if reply.get("reregister"):
                    log.info("metadata server %s asks to register again", self.address)
                    self._unregister()
                    continue
                commands = reply.get("commands") or []
                if self._take_reply(reply, "heartbeat",
                                    commands if isinstance(commands, list) else []):
                    for command in commands if isinstance(commands, list) else []:
                        service.handle_command(command)
                if reply.get("full_report") is True:   # a server that just took over
                    log.info("metadata server %s asks for a full block report", self.address)
                    next_full_report = 0.0
                if trio.current_time() >= next_full_report:
                    await self._full_report()
                    next_full_report = trio.current_time() + self.config.block_report_interval
            except RegistrationRefused:
                # our settings are at fault and stay so while we run: stop with the cause
                # (the operator sees a failed service) rather than retry in the background
                raise
            except LeaseFSError as exc:
                kind = ("unreachable" if isinstance(exc, ServerUnavailable)
                        else f"refusing ({type(exc).__name__})")
                if self._outage != kind:
                    log.warning("metadata server %s %s: %s; retrying with backoff up to %.1fs",
                                self.address, kind, exc, service.backoff.cap)
                    self._outage = kind
                if self.registered:
                    self._unregister()   # register afresh once it answers again
                await service.backoff.sleep(failures)
                failures += 1
                continue
            await trio.sleep(self.config.heartbeat_interval)

    def _take_reply(self, reply: dict, kind: str, commands: list) -> bool:
        """Note the HA status of a register or heartbeat reply and take its block keys if
        it is obeyed; True if its commands are to be run. Every command is counted by
        outcome and type (``commands``); dropped ones are also counted in
        ``dropped_commands`` and logged once per (role, epoch) of this server."""
        try:
            status = HAStatus.from_wire(reply.get("ha"))
        except InvalidArgument as exc:
            status = None
            why = f"its HA status is malformed ({exc})"
        self.ha = status
        self.obeyed = self.service.obeys(status, self.address)
        outcome = "obeyed" if self.obeyed else "dropped"
        for command in commands:
            name = command.get("type") if isinstance(command, dict) else None
            known = isinstance(name, str) and name in COMMAND_TYPES
            self.commands[outcome, name if known else "other"] += 1
        if reply.get("block_keys") is not None:
            self.commands[outcome, BLOCK_KEYS] += 1
        if self.obeyed:
            self.service.take_block_keys(reply.get("block_keys"), self.address)
            return True
        dropped = len(commands) + (reply.get("block_keys") is not None)
        if dropped:
            self.dropped_commands += dropped
            if status is not None:
                why = (f"it is {status.role.value} in epoch {status.epoch}"
                       if status.role is not Role.ACTIVE else
                       f"its epoch {status.epoch} is older than epoch "
                       f"{self.service.active_epoch} of the newest active server")
            seen = (status.role.value, status.epoch) if status is not None else None
            if seen not in self._dropped_logged:
                self._dropped_logged.add(seen)
                log.warning("dropping %d command(s) of a %s reply from metadata server %s: "
                            "%s (further drops from it in this state are only counted)",
                            dropped, kind, self.address, why)
        return False

    async def _authenticate(self, call) -> None:
        await self.service.authenticate(call, self.address)

    def _unregister(self) -> None:
        self.registered = False
        self.obeyed = False
        self._registered_event = trio.Event()

    async def _usage(self) -> dict:
        capacity, remaining = await self.store.disk_space()
        return {"capacity": capacity, "used": self.store.used_bytes(), "remaining": remaining}

    async def _register(self) -> None:
        service = self.service
        args = {"node_id": self.store.node_id, "address": service.address,
                **await self._usage(), "wall_time": reported_wall_time()}
        if service.http_port:   # an older metadata server refuses arguments it does not know
            args["http_port"] = service.http_port
        if service.hdfs_port and not self._meta_without_hdfs:
            args["hdfs_port"] = service.hdfs_port
        try:
            result = await self._rpc.call("register_storage", args, retry_seconds=0)
        except InvalidArgument as exc:
            # a metadata server of an earlier release (block servers are upgraded first):
            # registered without the port, this node serves no HDFS client through it
            if "hdfs_port" not in args or "hdfs_port" not in str(exc):
                raise
            log.warning("metadata server %s does not take hdfs_port (an earlier release): "
                        "registering without it; Hadoop's clients are not sent here",
                        self.address)
            self._meta_without_hdfs = True
            del args["hdfs_port"]
            result = await self._rpc.call("register_storage", args, retry_seconds=0)
        self.namespace_id = result.get("namespace_id") if isinstance(result, dict) else None
        obeyed = self._take_reply(result if isinstance(result, dict) else {}, "register", [])
        await self._full_report()
        self.registered = True
        self.obeyed = obeyed
        self._registered_event.set()
        log.info("registered with metadata server %s as %s (%s), %d replicas reported",
                 self.address, self.store.node_id, service.address, len(self.store.replicas))

    async def _full_report(self) -> None:
        """Snapshot and send in chunks under ``_report_lock``: incremental reports queued
        meanwhile go out only after the metadata server has processed the last chunk."""
        async with self._report_lock:
            replicas = self.store.report_snapshot()
            chunk_size = max(1, self.config.block_report_chunk)
            chunks = max(1, -(-len(replicas) // chunk_size))
            report_id = secrets.token_hex(8)
            for index in range(chunks):
                piece = replicas[index * chunk_size:(index + 1) * chunk_size]
                blocks: list[list] = []
                for start in range(0, len(piece), BUILD_STEP):
                    blocks += self.store.report_entries(piece[start:start + BUILD_STEP])
                    if len(replicas) > BUILD_STEP:
                        await trio.sleep(0)
                await self._rpc.call("block_report", {
                    "node_id": self.store.node_id, "blocks": blocks, "report_id": report_id,
                    "chunk": index, "last": index == chunks - 1}, retry_seconds=0)
        self.full_reports_sent += 1

    async def _heartbeat(self):
        service = self.service
        reply = await self._rpc.call("heartbeat", {
            "node_id": self.store.node_id, **await self._usage(),
            "xceivers": service.xceiver_count(), "wall_time": reported_wall_time(),
            **({"block_keys_version": service.block_keys_version} if service.secure else {})},
            retry_seconds=0)
        self.heartbeats_sent += 1
        return reply
