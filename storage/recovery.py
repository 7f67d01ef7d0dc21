"""Block recovery on the block server (HDFS BlockRecoveryWorker): the pure length decision
and the worker a primary runs for a RECOVER_BLOCK heartbeat command.

Why it exists: when a writer is gone (lease recovery, docs/PROTOCOL.md §4) the replicas of a
file's last block may disagree in length and state. The metadata server picks one holder, the
**primary**, and sends it ``RECOVER_BLOCK{block, recovery_id, new_length, targets}``. The
primary then

1. runs ``INIT_REPLICA_RECOVERY`` on every target (itself directly on its store): each holder
   stops a running writer, moves its replica to RUR and reports length, stamp and original
   state; holders that fail are left out;
2. decides the length with ``decide`` (pure, below);
3. runs ``UPDATE_REPLICA_UNDER_RECOVERY`` on the participants (cut to the length, stamp =
   recovery id, finalize, incremental report);
4. calls ``commit_block_synchronization`` on the metadata server with the nodes that
   succeeded, which closes the file and releases the lease.

Any failure is logged and the recovery given up: the metadata server retries after
``block_recovery_retry`` (at once when the primary stops heartbeating) with a new recovery
id (which supersedes this one on every holder).

Length rules (HDFS BlockRecoveryWorker.syncBlock): any FINALIZED replica → its length;
participants = the FINALIZED replicas of that length plus RBW replicas of exactly that length.
Else the minimum length among RBW replicas (participants = the RBW replicas), else the minimum
among RWR (participants = the RWR replicas); a truncate's ``new_length`` overrides the length
and every replica at least that long participates; a length of 0 with no FINALIZED replica
(and no truncate) drops the block (``delete_block``), and so does a recovery in which every
holder answered that it has no replica (``none_held``: a writer that died before its first
packet; HDFS's empty sync list). HDFS refuses FINALIZED replicas of
different lengths; we take the longest (the shorter ones are left out, so the metadata server
sees them as stale and replaces them) so recovery of the file still completes.

Concurrency contract: ``decide`` is pure. ``BlockRecoveryWorker.recover`` runs as one task in
the block server's trio thread per command; at most one recovery per block runs on a primary
(a command for a block already being recovered with an equal or newer id is ignored); the
per-target INIT and UPDATE calls run concurrently, each with ``data_timeout``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import trio

from fs import nodeauth
from fs import tls as tlsmod
from fs.config import Config
from fs.datatransfer import op_header
from fs.errors import (InvalidArgument, LeaseFSError, ProtocolError, ReplicaNotFound,
                       ServerUnavailable, from_wire)
from fs.dataconn import failure_cause, open_data_connection

from .replica_records import Replica
from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)

INIT_REPLICA_RECOVERY = "INIT_REPLICA_RECOVERY"
UPDATE_REPLICA_UNDER_RECOVERY = "UPDATE_REPLICA_UNDER_RECOVERY"

#: op headers and responses of the recovery ops are small maps
_MAX_FRAME = 1 << 20
#: original replica states that may take part in recovery
_RECOVERABLE = (ReplicaState.FINALIZED, ReplicaState.RBW, ReplicaState.RWR)


# --------------------------------------------------------------------------- pure decision


@dataclass(frozen=True)
class ReplicaRecoveryInfo:
    """What INIT_REPLICA_RECOVERY reported for one holder (``state`` = original state)."""

    node_id: str
    num_bytes: int
    gs: int
    state: ReplicaState
    address: str = ""


@dataclass(frozen=True)
class Decision:
    """The outcome of ``decide``: the block's length, who gets updated, or drop the block."""

    length: int
    participants: tuple[ReplicaRecoveryInfo, ...] = field(default_factory=tuple)
    delete_block: bool = False


def decide(replicas, new_length: int | None = None, none_held: bool = False) -> Decision:
    """The block length and participants from the replicas that answered INIT (see the
    module docstring). ``none_held``: every holder answered that it has no replica (none
    failed to answer). ``ReplicaNotFound`` when no replica answered otherwise;
    ``InvalidArgument`` when a truncate asks for more bytes than every replica holds."""
    replicas = [r for r in replicas if ReplicaState(r.state) in _RECOVERABLE]
    if not replicas:
        if none_held and new_length is None:
            return Decision(0, (), delete_block=True)
        raise ReplicaNotFound("block recovery: no replica answered INIT_REPLICA_RECOVERY")
    if new_length is not None:
        participants = tuple(r for r in replicas if r.num_bytes >= new_length)
        if not participants:
            longest = max(r.num_bytes for r in replicas)
            raise InvalidArgument(f"block recovery for truncate: no replica holds "
                                  f"{new_length} bytes (longest {longest})")
        return Decision(new_length, participants)
    by_state = {state: [r for r in replicas if ReplicaState(r.state) is state]
                for state in _RECOVERABLE}
    finalized = by_state[ReplicaState.FINALIZED]
    if finalized:
        length = max(r.num_bytes for r in finalized)
        participants = tuple(r for r in replicas
                             if ReplicaState(r.state) in (ReplicaState.FINALIZED,
                                                          ReplicaState.RBW)
                             and r.num_bytes == length)
        return Decision(length, participants)
    best = by_state[ReplicaState.RBW] or by_state[ReplicaState.RWR]
    length = min(r.num_bytes for r in best)
    if length == 0:
        return Decision(0, (), delete_block=True)
    return Decision(length, tuple(best))


# --------------------------------------------------------------------------- remote ops


def replica_wire(replica: Replica, state: ReplicaState | None = None) -> dict:
    """``{id, gs, num_bytes, state}`` as the recovery ops answer it."""
    return {"id": replica.block_id, "gs": replica.gs, "num_bytes": replica.num_bytes,
            "state": (state or replica.state).value}


async def call_recovery_op(address: str, header: dict, timeout: float, tls=None, *,
                           connect_timeout: float | None = None) -> dict:
    """Send one recovery op to a block server and return its ``replica`` map; the remote
    error is raised as its own ``LeaseFSError`` class. ``tls``: ``fs.tls.client(config)``.
    ``connect_timeout`` (default ``timeout``) bounds the connection, ``timeout`` the op."""
    framed = await open_data_connection(address, timeout if connect_timeout is None
                                        else connect_timeout, _MAX_FRAME, tls)
    try:
        with trio.fail_after(timeout):
            try:
                await framed.send_frame(header)
                response = await framed.receive_frame()
            finally:
                with trio.CancelScope(shield=True):
                    await framed.aclose()
    except trio.TooSlowError:
        raise ServerUnavailable(f"{header['op']} to {address}: no answer within "
                                f"{timeout:g}s") from None
    except (OSError, EOFError) as exc:
        raise ServerUnavailable(f"{header['op']} to {address}: {failure_cause(exc)}") from None
    if not isinstance(response, dict):
        raise ProtocolError(f"{header['op']} to {address}: malformed response "
                            f"{response!r:.100}")
    if response.get("status") != "SUCCESS":
        error = response.get("error")
        if isinstance(error, dict):
            raise from_wire(error)
        raise LeaseFSError(f"{header['op']} to {address}: {response.get('message')}")
    replica = response.get("replica")
    if not isinstance(replica, dict) or not all(
            isinstance(replica.get(k), int) for k in ("id", "gs", "num_bytes")):
        raise ProtocolError(f"{header['op']} to {address}: response lacks the replica")
    return replica


# --------------------------------------------------------------------------- the worker


@dataclass
class _Target:
    node_id: str
    address: str


def parse_recover_command(command: dict):
    """``(block_id, gs, recovery_id, new_length, targets)`` from a RECOVER_BLOCK command;
    ``ProtocolError`` if it is malformed."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    block = command.get("block")
    recovery_id = command.get("recovery_id")
    new_length = command.get("new_length")
    targets = command.get("targets")
    if not (isinstance(block, dict) and is_int(block.get("id")) and is_int(block.get("gs"))
            and is_int(recovery_id) and (new_length is None or is_int(new_length))
            and isinstance(targets, list) and targets
            and all(isinstance(t, dict) and isinstance(t.get("node_id"), str)
                    and isinstance(t.get("address"), str) for t in targets)):
        raise ProtocolError(f"malformed RECOVER_BLOCK command {command!r:.300}")
    return (block["id"], block["gs"], recovery_id, new_length,
            [_Target(t["node_id"], t["address"]) for t in targets])


class BlockRecoveryWorker:
    """Runs RECOVER_BLOCK commands for which this block server is the primary.

    ``reporter`` has ``block_received(id, gs, num_bytes, state)`` (the heartbeat service);
    ``commit`` is ``async (args: dict) -> None`` calling ``commit_block_synchronization``.
    """

    def __init__(self, config: Config, store: ReplicaStore, reporter, commit,
                 key: bytes | None = None):
        self.config = config
        self.store = store
        self.reporter = reporter
        self.commit = commit
        self.key = key   # the cluster key (security = secure): the ops it sends are signed
        self.running: dict[int, int] = {}    # block id -> recovery id in progress here
        self.finished: list[tuple[int, int, str]] = []   # (block, recovery id, outcome)

    async def recover(self, command: dict) -> bool:
        """Run one command; True when the metadata server accepted the commit. Never raises
        for trouble a peer or the metadata server causes (logged instead)."""
        try:
            block_id, gs, recovery_id, new_length, targets = parse_recover_command(command)
        except ProtocolError as exc:
            log.warning("%s", exc)
            return False
        if self.running.get(block_id, -1) >= recovery_id:
            log.info("block recovery of blk_%d with id %d ignored: id %d already running",
                     block_id, recovery_id, self.running[block_id])
            return False
        self.running[block_id] = recovery_id
        outcome = "failed"
        try:
            await self._recover(block_id, gs, recovery_id, new_length, targets)
            outcome = "committed"
            return True
        except LeaseFSError as exc:
            log.warning("block recovery of blk_%d_%d (recovery id %d) given up: %s", block_id,
                        gs, recovery_id, exc)
            return False
        finally:
            if self.running.get(block_id) == recovery_id:
                del self.running[block_id]
            self.finished.append((block_id, recovery_id, outcome))

    def _signed(self, header: dict) -> dict:
        return header if self.key is None else nodeauth.sign_op(self.key, header, time.time())

    async def _recover(self, block_id, gs, recovery_id, new_length, targets) -> None:
        log.info("block recovery of blk_%d_%d: recovery id %d, new length %s, targets %s",
                 block_id, gs, recovery_id, new_length, [t.address for t in targets])
        infos: list[ReplicaRecoveryInfo] = []
        absent: list[str] = []    # holders that answered they have no replica

        async def init_one(target: _Target) -> None:
            try:
                if target.node_id == self.store.node_id:
                    replica = await self.store.init_replica_recovery(block_id, gs, recovery_id)
                    wire = replica_wire(replica, replica.original_state)
                else:
                    wire = await call_recovery_op(target.address, self._signed(op_header(
                        INIT_REPLICA_RECOVERY, block={"id": block_id, "gs": gs},
                        recovery_id=recovery_id)), self.config.data_timeout,
                        tlsmod.client(self.config),
                        connect_timeout=self.config.data_connect_timeout)
                infos.append(ReplicaRecoveryInfo(target.node_id, wire["num_bytes"], wire["gs"],
                                                 ReplicaState(wire["state"]), target.address))
            except (LeaseFSError, ValueError) as exc:
                if isinstance(exc, ReplicaNotFound):
                    absent.append(target.node_id)
                log.info("block recovery %d: INIT on %s failed, left out: %s", recovery_id,
                         target.address, exc)

        async with trio.open_nursery() as nursery:
            for target in targets:
                nursery.start_soon(init_one, target)
        decision = decide(infos, new_length,
                          none_held=bool(targets) and len(absent) == len(targets))
        log.info("block recovery %d of blk_%d: length %d, participants %s%s", recovery_id,
                 block_id, decision.length, [p.address for p in decision.participants],
                 ", block dropped" if decision.delete_block else "")
        done: list[str] = []

        async def update_one(info: ReplicaRecoveryInfo) -> None:
            try:
                if info.node_id == self.store.node_id:
                    replica = await self.store.update_replica_under_recovery(
                        block_id, recovery_id, decision.length)
                    self.reporter.block_received(block_id, replica.gs, replica.num_bytes,
                                                 ReplicaState.FINALIZED.value)
                else:
                    await call_recovery_op(info.address, self._signed(op_header(
                        UPDATE_REPLICA_UNDER_RECOVERY, block={"id": block_id, "gs": gs},
                        recovery_id=recovery_id, new_length=decision.length)),
                        self.config.data_timeout, tlsmod.client(self.config),
                        connect_timeout=self.config.data_connect_timeout)
                done.append(info.node_id)
            except LeaseFSError as exc:
                log.info("block recovery %d: UPDATE on %s failed, left out: %s", recovery_id,
                         info.address, exc)

        if not decision.delete_block:
            async with trio.open_nursery() as nursery:
                for info in decision.participants:
                    nursery.start_soon(update_one, info)
            if not done:
                raise ReplicaNotFound(f"block recovery {recovery_id} of blk_{block_id}: no "
                                      f"participant could be updated")
        await self.commit({"block": {"id": block_id, "gs": gs}, "recovery_id": recovery_id,
                           "new_length": decision.length, "close_file": True,
                           "delete_block": decision.delete_block, "new_targets": done})
        log.info("block recovery %d of blk_%d committed: %d bytes on %d nodes", recovery_id,
                 block_id, decision.length, len(done))
