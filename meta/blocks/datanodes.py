"""Registered block servers: liveness, usage, placement, and the commands they are owed.

Why it exists: the metadata server never calls a block server; everything it wants from one
(delete these replicas, later copy/recover blocks) waits in a per-node queue and rides on the
reply to that node's next heartbeat (HDFS ``DatanodeManager`` + ``InvalidateBlocks``).

* ``register`` / ``heartbeat`` keep ``NodeInfo`` current; the clock is injected, so dead
  detection (``dead_node_interval`` of silence, ``check_dead``) is testable without sleeping.
  A heartbeat from a node the server does not know (or has declared dead) is answered with
  ``reregister`` so the node registers again and sends a full block report.
* Invalidate sets: block refs per node, handed out at most ``invalidate_limit`` per reply.
  A heartbeat reply can be lost after it left, so a handed-out ref is not forgotten: it
  waits in ``awaiting_deletion`` until the node reports the replica deleted (incremental
  report, or a full report without it, or with a newer generation stamp) or reports it
  received anew (the server then decides again), and is handed out again when
  ``invalidate_timeout`` passes without that (at most ``invalidate_max_sends`` times; after
  that the next full report finds the replica again if it is still there).
  A ref remembers the namespace txid of the state that decided it (``applied_txid``, when
  it was added) and is handed out only once the journal has made that txid durable
  (``take_invalidate``'s ``durable_txid``): a namespace change acknowledged before its fsync
  (``sync_metadata`` off) never deletes a replica that a machine crash could bring back
  into the namespace.
* Takeover (HA, ``start_epoch``): a metadata server that just became active does not know
  which deletions its predecessor already had carried out or which replicas appeared since
  its own reports, so it hands a node NO INVALIDATE until that node's first full block report
  that started after the takeover was processed ("nothing is deleted before fresh block
  reports", HDFS's postponed invalidation after failover); every node is asked for such a
  report at its next heartbeat (``full_report_wanted``). A node that registers for the first
  time after the takeover is postponed the same way until its report. With ``ha = none``
  ``start_epoch`` is never called and nothing is postponed.
* Admin state (``NodeInfo.admin``, HDFS ``AdminStates``): NORMAL, DECOMMISSION_IN_PROGRESS,
  DECOMMISSIONED, changed only through ``ADMIN_TRANSITIONS`` (``next_admin_state`` raises on
  a move the table does not have): dfsadmin starts and stops a decommission, the
  replication monitor ends one (``finish_decommission``). A node that is not NORMAL is never
  chosen as a target.
* Placement (``choose_targets``): ``n`` distinct live nodes, never an excluded one (by node id
  or address), the writer's own node first when it runs one (locality), then least used
  (reported use plus bytes scheduled since its last heartbeat, so concurrent writers spread).
* Read order (``sort_for_reader``, HDFS ``sortLocatedBlock`` + ``sortByDistance``): a finished
  block's replicas in service and fresh first, the reader's own host first among those, and
  at random among equals, so that reads spread over every replica and readers come across a
  rotten one long before the block scanner does.

Concurrency contract: plain data, no I/O, called only from the trio thread; atomic methods.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import random
import time
from dataclasses import dataclass, field

from fs.errors import InternalError, InvalidArgument, NoSpace

log = logging.getLogger(__name__)


class AdminState(enum.StrEnum):
    """HDFS ``AdminStates`` (the values are what dfsadmin and the web UI show): a
    decommissioning node keeps serving reads and acts as a replication source, but its
    replicas no longer count and it gets no new blocks."""

    NORMAL = "NORMAL"
    DECOMMISSION_IN_PROGRESS = "DECOMMISSION_IN_PROGRESS"
    DECOMMISSIONED = "DECOMMISSIONED"


class AdminEvent(enum.StrEnum):
    DECOMMISSION = "DECOMMISSION"     # dfsadmin -decommission
    REPLICATED = "REPLICATED"         # every block it holds has enough copies elsewhere
    RECOMMISSION = "RECOMMISSION"     # dfsadmin -recommission: back in service


NORMAL = AdminState.NORMAL
DECOMMISSION_IN_PROGRESS = AdminState.DECOMMISSION_IN_PROGRESS
DECOMMISSIONED = AdminState.DECOMMISSIONED

#: (state, event) -> state; pairs that are missing are refused by ``next_admin_state``
ADMIN_TRANSITIONS: dict[tuple[AdminState, AdminEvent], AdminState] = {
    (NORMAL, AdminEvent.DECOMMISSION): DECOMMISSION_IN_PROGRESS,
    (DECOMMISSION_IN_PROGRESS, AdminEvent.REPLICATED): DECOMMISSIONED,
    (DECOMMISSION_IN_PROGRESS, AdminEvent.RECOMMISSION): NORMAL,
    (DECOMMISSIONED, AdminEvent.RECOMMISSION): NORMAL,
}


def next_admin_state(state: AdminState, event: AdminEvent, *, node_id: str) -> AdminState:
    nxt = ADMIN_TRANSITIONS.get((state, event))
    if nxt is None:
        raise InternalError(f"block server {node_id}: no {event.value} from admin state "
                            f"{state.value}")
    return nxt

#: where a replica on a node in each admin state comes in a reader's order
READ_RANK = {NORMAL: 0, DECOMMISSION_IN_PROGRESS: 1, DECOMMISSIONED: 2}


@dataclass
class SentInvalidation:
    ref: dict
    sent_at: float
    sends: int = 1


@dataclass
class NodeInfo:
    node_id: str
    address: str
    capacity: int = 0
    used: int = 0
    remaining: int = 0
    xceivers: int = 0
    last_heartbeat: float = 0.0
    alive: bool = True
    scheduled_bytes: int = 0
    admin: AdminState = NORMAL       # changed only by ``move_admin``
    http_port: int | None = None     # its own web page's port, when it serves one
    hdfs_port: int | None = None     # its HDFS data-transfer port, when it serves one
    # its wall clock minus ours at its last register or heartbeat (seconds; the call's
    # transit makes it look up to that much behind)
    clock_skew: float = 0.0
    clock_warned: bool = False       # a skew warning is logged until it is back in bounds
    invalidate: dict[int, dict] = field(default_factory=dict)   # block id → block ref
    invalidate_txid: dict[int, int] = field(default_factory=dict)   # block id → decided at
    # handed out, not yet reported deleted; in order of the last send
    awaiting_deletion: dict[int, "SentInvalidation"] = field(default_factory=dict)
    # the ``DatanodeManager.report_epoch`` of its last full report that completed, and of
    # the last heartbeat reply that asked it for one (see ``start_epoch``)
    reported_epoch: int = 0
    report_asked_epoch: int = 0

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0].strip("[]")

    def load(self) -> int:
        return self.used + self.scheduled_bytes

    @property
    def retiring(self) -> bool:
        """Decommissioning or decommissioned: its replicas do not count."""
        return self.admin != NORMAL

    def move_admin(self, event: AdminEvent) -> None:
        self.admin = next_admin_state(self.admin, event, node_id=self.node_id)

    def forget_invalidations(self) -> None:
        """Dead or replaced: it re-reports everything when it returns."""
        self.invalidate.clear()
        self.invalidate_txid.clear()
        self.awaiting_deletion.clear()


class DatanodeManager:
    def __init__(self, *, dead_interval: float, invalidate_limit: int, clock=time.monotonic,
                 rng: random.Random | None = None, invalidate_timeout: float = 30.0,
                 invalidate_max_sends: int = 5, applied_txid=lambda: 0,
                 stale_interval: float = math.inf):
        self.dead_interval = dead_interval
        # silent this long, a node is stale: last in a reader's order, last choice as a
        # block-recovery primary (HDFS stale datanode)
        self.stale_interval = stale_interval
        self.applied_txid = applied_txid   # the namespace txid invalidations are decided at
        self.invalidate_limit = max(1, invalidate_limit)
        self.invalidate_timeout = invalidate_timeout
        self.invalidate_max_sends = max(1, invalidate_max_sends)
        self.clock = clock
        self.nodes: dict[str, NodeInfo] = {}
        self._rng = rng or random.Random()
        # takeovers of this server (``start_epoch``); 0: never took over, nothing postponed
        self.report_epoch = 0

    # ------------------------------------------------------------------ membership
    def register(self, node_id: str, address: str, capacity: int, used: int,
                 remaining: int, http_port: int | None = None,
                 hdfs_port: int | None = None) -> tuple[NodeInfo, bool, list[NodeInfo]]:
        """Add or refresh a node; returns (node, was_dead_or_new, displaced nodes): a node
        registering on the address of another live id replaced it (a wiped data folder)."""
        now = self.clock()
        node = self.nodes.get(node_id)
        fresh = node is None or not node.alive
        displaced = []
        for other in self.nodes.values():   # a restarted node on the address of a stale id
            if other.node_id != node_id and other.address == address and other.alive:
                log.info("block server %s now answers at %s; marking %s dead",
                         node_id, address, other.node_id)
                other.alive = False
                other.forget_invalidations()
                displaced.append(other)
        if node is None:
            node = NodeInfo(node_id, address)
            self.nodes[node_id] = node
        node.address = address
        node.http_port = http_port
        node.hdfs_port = hdfs_port
        node.capacity, node.used, node.remaining = capacity, used, remaining
        node.last_heartbeat = now
        node.alive = True
        node.scheduled_bytes = 0
        return node, fresh, displaced

    def heartbeat(self, node_id: str, capacity: int, used: int, remaining: int,
                  xceivers: int = 0) -> NodeInfo | None:
        """Refresh a live node; None means unknown or dead (it must register again)."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return None
        node.capacity, node.used, node.remaining, node.xceivers = capacity, used, remaining, xceivers
        node.last_heartbeat = self.clock()
        node.scheduled_bytes = 0
        return node

    def note_clock_skew(self, node_id: str, skew: float, warn_limit: float) -> bool | None:
        """Keep a registered node's clock skew (its wall clock minus ours); True when it just
        went past ``warn_limit``, False when it just came back within it, None otherwise
        (a warning is said once, not at every heartbeat)."""
        node = self.nodes[node_id]
        node.clock_skew = skew
        if abs(skew) > warn_limit and not node.clock_warned:
            node.clock_warned = True
            return True
        if abs(skew) <= warn_limit and node.clock_warned:
            node.clock_warned = False
            return False
        return None

    def live(self, node_id: str) -> NodeInfo | None:
        node = self.nodes.get(node_id)
        return node if node is not None and node.alive else None

    def check_dead(self) -> list[NodeInfo]:
        """Nodes silent for longer than the dead interval become dead; returns them."""
        now = self.clock()
        newly = []
        for node in self.nodes.values():
            if node.alive and now - node.last_heartbeat > self.dead_interval:
                node.alive = False
                node.forget_invalidations()   # it re-reports everything after returning
                newly.append(node)
                log.warning("block server %s (%s) is dead: no heartbeat for %.1f s",
                            node.node_id, node.address, now - node.last_heartbeat)
        return newly

    def live_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.alive]

    def dead_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if not n.alive]

    def find(self, key: str) -> NodeInfo | None:
        """A node by id or by ``host:port`` address (live ones first)."""
        if key in self.nodes:
            return self.nodes[key]
        matches = [n for n in self.nodes.values() if n.address == key]
        matches.sort(key=lambda n: not n.alive)
        return matches[0] if matches else None

    def retiring(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.retiring

    def start_decommission(self, node: NodeInfo) -> bool:
        """dfsadmin: an in-service ``node`` starts decommissioning; False when it was not
        NORMAL (already decommissioning or decommissioned: nothing changes)."""
        if node.admin != NORMAL:
            return False
        node.move_admin(AdminEvent.DECOMMISSION)
        return True

    def stop_decommission(self, node: NodeInfo) -> bool:
        """dfsadmin: ``node`` is back in service; False when it already was."""
        if node.admin == NORMAL:
            return False
        node.move_admin(AdminEvent.RECOMMISSION)
        return True

    def finish_decommission(self, node: NodeInfo) -> None:
        """The replication monitor: every block ``node`` holds has enough replicas on nodes
        in service; it is decommissioned (safe to switch off)."""
        node.move_admin(AdminEvent.REPLICATED)

    def sort_for_reader(self, node_ids, reader_host: str | None) -> list[str]:
        """``node_ids`` (holders of a finished block) in the order a reader should try
        them: in service before decommissioning before decommissioned, fresh before stale,
        a node on ``reader_host`` before the others, and shuffled among equals."""
        now = self.clock()

        def rank(node_id: str) -> tuple:
            node = self.nodes.get(node_id)
            if node is None:
                return (len(READ_RANK), True, True)
            return (READ_RANK.get(node.admin, len(READ_RANK)),
                    is_stale(node.last_heartbeat, now, self.stale_interval),
                    node.host != reader_host)

        ordered = list(node_ids)
        self._rng.shuffle(ordered)   # the sort is stable: equals stay in random order
        ordered.sort(key=rank)
        return ordered

    # ------------------------------------------------------------------ takeover
    def start_epoch(self) -> int:
        """This server just became active: postpone every node's INVALIDATE commands until
        its next full report (one that starts from now on) was processed, and ask each for
        one. Deletions handed out before (in an earlier term, possibly dropped by the node)
        go back to the queue, to be handed out again after that report. Returns the new
        report epoch."""
        self.report_epoch += 1
        for node in self.nodes.values():
            if node.awaiting_deletion:
                requeued = {block_id: sent.ref for block_id, sent in node.awaiting_deletion.items()}
                for block_id in requeued:
                    node.invalidate.pop(block_id, None)
                    node.invalidate_txid[block_id] = 0   # decided in an earlier term
                node.invalidate = {**requeued, **node.invalidate}   # oldest first
                node.awaiting_deletion.clear()
        log.info("new term as active (report epoch %d): no replica deletions for %d block "
                 "servers until each sent a fresh full block report", self.report_epoch,
                 len(self.nodes))
        return self.report_epoch

    def invalidation_postponed(self, node_id: str) -> bool:
        """True while the node owes a full report since the last takeover (``start_epoch``)."""
        node = self.nodes.get(node_id)
        return node is not None and node.reported_epoch < self.report_epoch

    def full_report_wanted(self, node_id: str) -> bool:
        """Whether this heartbeat reply asks the node for a full report: once per takeover,
        while it owes one."""
        node = self.nodes.get(node_id)
        if node is None or node.reported_epoch >= self.report_epoch \
                or node.report_asked_epoch >= self.report_epoch:
            return False
        node.report_asked_epoch = self.report_epoch
        return True

    def full_report_done(self, node_id: str, epoch: int) -> None:
        """A full report of the node that started at report epoch ``epoch`` was processed."""
        node = self.nodes.get(node_id)
        if node is not None and epoch > node.reported_epoch:
            node.reported_epoch = epoch
            if epoch == self.report_epoch and node.invalidate:
                log.info("block server %s sent its full report of this term: %d replica "
                         "deletions may go out", node_id, len(node.invalidate))

    # ------------------------------------------------------------------ invalidation
    def add_invalidate(self, node_id: str, block_ref: dict) -> None:
        node = self.nodes.get(node_id)
        if node is not None and node.alive:
            node.awaiting_deletion.pop(block_ref["id"], None)
            node.invalidate.pop(block_ref["id"], None)   # to the end: kept in txid order
            node.invalidate[block_ref["id"]] = block_ref
            node.invalidate_txid[block_ref["id"]] = self.applied_txid()

    def cancel_invalidate(self, node_id: str, block_id: int) -> None:
        """The node reported the replica deleted, or anew (then the caller decides again)."""
        node = self.nodes.get(node_id)
        if node is not None:
            node.invalidate.pop(block_id, None)
            node.invalidate_txid.pop(block_id, None)
            node.awaiting_deletion.pop(block_id, None)

    def confirm_by_report(self, node_id: str, reported: dict[int, int]) -> int:
        """A full report (block id → generation stamp): handed-out refs of replicas it no
        longer lists, or lists with a newer stamp than the ref, are done. Returns how many."""
        node = self.nodes.get(node_id)
        if node is None:
            return 0
        done = [block_id for block_id, sent in node.awaiting_deletion.items()
                if block_id not in reported or reported[block_id] > sent.ref["gs"]]
        for block_id in done:
            del node.awaiting_deletion[block_id]
        return len(done)

    def take_invalidate(self, node_id: str, durable_txid: float = math.inf) -> list[dict]:
        """At most ``invalidate_limit`` refs for this heartbeat's reply: first those handed
        out ``invalidate_timeout`` ago and still not reported deleted, then new ones decided
        at a txid <= ``durable_txid`` (oldest first). Every ref handed out waits for its
        deletion report. Nothing while the node owes a full report since a takeover
        (``start_epoch``)."""
        node = self.nodes.get(node_id)
        if node is None or not (node.invalidate or node.awaiting_deletion) \
                or node.reported_epoch < self.report_epoch:
            return []
        now = self.clock()
        out = []
        due = []
        for block_id, sent in node.awaiting_deletion.items():   # in order of the last send
            if now - sent.sent_at < self.invalidate_timeout:
                break
            due.append(block_id)
        for block_id in due:
            if len(out) >= self.invalidate_limit:
                break
            sent = node.awaiting_deletion.pop(block_id)
            if sent.sends >= self.invalidate_max_sends:
                log.warning("block server %s never reported replica blk_%d_%d deleted after "
                            "%d INVALIDATE commands; giving up until its next full report",
                            node_id, block_id, sent.ref["gs"], sent.sends)
                continue
            sent.sent_at, sent.sends = now, sent.sends + 1
            node.awaiting_deletion[block_id] = sent   # to the end: the newest send
            out.append(sent.ref)
        # the oldest that fit the reply, not a copy of the whole set (a big delete leaves
        # hundreds of thousands)
        room = self.invalidate_limit - len(out)
        for block_id in list(itertools.islice(node.invalidate, max(0, room))):
            if node.invalidate_txid.get(block_id, 0) > durable_txid:
                break   # refs are in the order they were decided: the rest are newer
            ref = node.invalidate.pop(block_id)
            node.invalidate_txid.pop(block_id, None)
            node.awaiting_deletion[block_id] = SentInvalidation(ref, now)
            out.append(ref)
        return out

    def invalidate_queued(self) -> int:
        """Replica deletions decided and not yet sent to their block servers."""
        return sum(len(n.invalidate) for n in self.nodes.values())

    def pending_deletion(self) -> int:
        """Replicas the metadata server wants deleted and not yet reported deleted."""
        return sum(len(n.invalidate) + len(n.awaiting_deletion) for n in self.nodes.values())

    # ------------------------------------------------------------------ placement
    def choose_targets(self, n: int, *, excluded=(), writer_host: str | None = None,
                       block_size: int = 0, min_targets: int = 1, what: str = "") -> list[NodeInfo]:
        """``n`` distinct live nodes for a new block's pipeline (fewer if fewer exist, but
        at least ``min_targets``, else ``NoSpace``)."""
        if n < 1:
            raise InvalidArgument(f"{what}: replication must be at least 1")
        excluded = {str(x) for x in excluded}
        candidates = [node for node in self.nodes.values()
                      if node.alive and not node.retiring and node.node_id not in excluded
                      and node.address not in excluded]
        roomy = [node for node in candidates if node.remaining >= block_size]
        pool = roomy if len(roomy) >= min(n, len(candidates)) else candidates
        self._rng.shuffle(pool)   # ties are broken at random, then sorted by load
        pool.sort(key=lambda node: (node.host != writer_host if writer_host else False,
                                    node.load()))
        chosen = pool[:n]
        if len(chosen) < max(1, min_targets):
            raise NoSpace(f"{what}: could only be placed on {len(chosen)} block server(s), "
                          f"{max(1, min_targets)} needed ({len(self.live_nodes())} live, "
                          f"{len(excluded)} excluded)")
        for node in chosen:
            node.scheduled_bytes += block_size
        return chosen


def is_stale(last_heartbeat: float, now: float, stale_after: float) -> bool:
    """A block server silent for longer than ``stale_after`` (HDFS stale datanode)."""
    return now - last_heartbeat > stale_after
