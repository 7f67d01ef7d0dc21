"""The in-memory blocks map and the per-block state machine of the metadata server.

Why it exists: which block servers hold which replica is never persisted (HDFS does the
same); it is rebuilt at start from the ``B`` keys (block id, gs, length, state) plus the
block servers' reports, and kept current by incremental reports. Readers get locations from
here; ``complete``/``add_block`` ask it whether blocks are COMPLETE; safe mode asks it how
many blocks are reported.

Block states (HDFS ``BlockUCState``), one transition table, pure:

    UNDER_CONSTRUCTION --commit--> COMMITTED --min_replicated--> COMPLETE
    UNDER_CONSTRUCTION --start_recovery--> UNDER_RECOVERY --recovered--> COMMITTED
    COMPLETE --reopen--> UNDER_CONSTRUCTION                            (append)
    COMPLETE --truncate--> UNDER_CONSTRUCTION --start_recovery--> ...  (mid-block truncate)
    UNDER_CONSTRUCTION/COMMITTED --close--> COMPLETE                   (the file is closed)
    UNDER_CONSTRUCTION --update_pipeline--> UNDER_CONSTRUCTION         (pipeline recovery)
    COMPLETE --patch_begin/patch_done/patch_drop--> COMPLETE           (a patch: new stamp)

Every change of a state goes through ``next_state`` (an illegal move raises); the one place
a state is set directly is a ``BlockInfo`` being made (a new block, or one loaded from the
store), which checks that the stored string names a ``BlockState``.

A block reopened by append carries ``min_gs`` (its stamp before the reopen) until its
replicas report the new stamp: replicas with a stamp in [min_gs, gs) are the ones the
append pipeline is reopening, so they are pending, not stale/corrupt.

A patch (the lease holder rewrites bytes of a COMPLETE block in place, PROTOCOL.md
"Patches") leaves the block COMPLETE under its stamp for readers and carries the stamp the
patch will commit as ``patch_gs`` (journaled by PATCH_BEGIN, kept in the block's ``B`` key
too, so a restart or an HA follower rebuilds it) until PATCH_BLOCK commits it (``patched``:
the stamp, the length, and the nodes that hold the new version, the other replicas turn
stale) or PATCH_DROP forgets it (lease recovery found no replica of the new version). A
replica reported at ``patch_gs`` meanwhile is pending, counted as a copy of the block (it
holds the whole new version: a block server's patch is atomic) and handed to readers after
the good ones; any other stamp newer than the block's (a patch superseded by a later one,
or dropped) is stale. ``patches`` indexes the blocks with a pending patch by file, for
lease recovery.

Replica classification (``classify_replica``): for a COMMITTED/COMPLETE block a FINALIZED
replica is *good* only with the block's exact generation stamp and length, otherwise
*corrupt*; a replica of any block with an older generation stamp than the block is *corrupt*
(stale); other replicas (still being written or finalized early) are *pending*: kept, not
counted, not corrupt. Corrupt replicas are never handed to readers while good ones exist.

Locations of a block being written (UNDER_CONSTRUCTION/UNDER_RECOVERY): ``expected`` starts
as the pipeline ADD_BLOCK chose, and every replica reported with the block's current
generation stamp in a non-corrupt state (RBW, RWR or FINALIZED) joins it. After a restart
the journal no longer knows the pipeline, so the block servers' reports alone rebuild the
locations, and hflushed bytes of open files stay readable (HDFS
``BlockUnderConstructionFeature.addReplicaIfNotPresent``).

Counters: the safe-mode numbers (``total_countable``, ``safe``) and the report's
``under_replicated``/``missing``/``corrupt`` are running counters, kept by ``_account``
around every change of a block (``_change``, ``add``, ``remove``), so ``counts()`` costs
nothing however many blocks there are (the status page is unauthenticated).

Replication monitor hook: every block that changes (``_change``, ``add``, ``remove``) joins
``dirty``; the monitor takes them with ``take_dirty`` and decides copies/deletions
(``meta/replication.py``).

Concurrency contract: plain data, no I/O, no clock, no awaits; the server calls it from the
trio thread only (inside journal ``apply`` or RPC handlers), so every method is atomic.
Methods that decide a replica must go return ``(node_id, block_ref)`` pairs; the caller
puts them into the datanode manager's invalidate sets.
"""

from __future__ import annotations

import collections
import enum
import logging
from operator import attrgetter
from dataclasses import dataclass, field

from fs.errors import InvalidArgument

log = logging.getLogger(__name__)

class BlockState(enum.StrEnum):
    """HDFS ``BlockUCState`` names; the value is the string the journal and the ``B`` keys
    store, so a member equals (and packs as) that string."""

    UNDER_CONSTRUCTION = "UNDER_CONSTRUCTION"
    COMMITTED = "COMMITTED"
    COMPLETE = "COMPLETE"
    UNDER_RECOVERY = "UNDER_RECOVERY"


class BlockEvent(enum.StrEnum):
    """What moves a block."""

    COMMIT = "commit"                  # the client reported the block's final length
    MIN_REPLICATED = "min_replicated"  # min_replication good finalized replicas are reported
    START_RECOVERY = "start_recovery"  # lease recovery picked this block to recover
    RECOVERED = "recovered"            # commit_block_synchronization closed the recovery
    REOPEN = "reopen"                  # append reopens the last block
    UPDATE_PIPELINE = "update_pipeline"  # pipeline recovery: new stamp, same writer
    CLOSE = "close"                    # the file is closed: its last block is complete
    TRUNCATE = "truncate"              # truncate inside the last block reopens it
    PATCH_BEGIN = "patch_begin"        # patch_block: a pending stamp for a patch
    PATCH_DONE = "patch_done"          # the patch's stamp, length and replicas committed
    PATCH_DROP = "patch_drop"          # lease recovery found no replica of the patch


UNDER_CONSTRUCTION = BlockState.UNDER_CONSTRUCTION
COMMITTED = BlockState.COMMITTED
COMPLETE = BlockState.COMPLETE
UNDER_RECOVERY = BlockState.UNDER_RECOVERY
BLOCK_STATES = tuple(BlockState)

COMMIT = BlockEvent.COMMIT
MIN_REPLICATED = BlockEvent.MIN_REPLICATED
START_RECOVERY = BlockEvent.START_RECOVERY
RECOVERED = BlockEvent.RECOVERED
REOPEN = BlockEvent.REOPEN
UPDATE_PIPELINE = BlockEvent.UPDATE_PIPELINE
CLOSE = BlockEvent.CLOSE
TRUNCATE = BlockEvent.TRUNCATE
PATCH_BEGIN = BlockEvent.PATCH_BEGIN
PATCH_DONE = BlockEvent.PATCH_DONE
PATCH_DROP = BlockEvent.PATCH_DROP

#: (state, event) -> state; pairs that are missing are refused by ``next_state``.
TRANSITIONS: dict[tuple[BlockState, BlockEvent], BlockState] = {
    (UNDER_CONSTRUCTION, COMMIT): COMMITTED,
    (COMMITTED, COMMIT): COMMITTED,            # a retried commit with the same length
    (COMPLETE, COMMIT): COMPLETE,              # retried after the replicas arrived
    (COMMITTED, MIN_REPLICATED): COMPLETE,
    (COMPLETE, MIN_REPLICATED): COMPLETE,
    (UNDER_CONSTRUCTION, START_RECOVERY): UNDER_RECOVERY,
    (UNDER_RECOVERY, START_RECOVERY): UNDER_RECOVERY,   # retried with a new recovery id
    (COMPLETE, START_RECOVERY): UNDER_RECOVERY,         # truncate inside the last block
    (COMMITTED, START_RECOVERY): UNDER_RECOVERY,        # a committed last block of a lost writer
    (UNDER_RECOVERY, RECOVERED): COMMITTED,
    # START_RECOVERY is not journaled: a standby (or a restarted server replaying) sees the
    # recovery's end on the block as it was before the recovery began
    (UNDER_CONSTRUCTION, RECOVERED): COMMITTED,
    (COMMITTED, RECOVERED): COMMITTED,
    (COMPLETE, REOPEN): UNDER_CONSTRUCTION,
    (UNDER_CONSTRUCTION, UPDATE_PIPELINE): UNDER_CONSTRUCTION,
    # CLOSE forces the last block COMPLETE (the journal's record of a closed file); a block
    # the replicas completed first stays so
    (UNDER_CONSTRUCTION, CLOSE): COMPLETE,
    (COMMITTED, CLOSE): COMPLETE,
    (COMPLETE, CLOSE): COMPLETE,
    (COMPLETE, TRUNCATE): UNDER_CONSTRUCTION,
    # a patch rewrites a finished block under a new stamp: it stays finished throughout.
    # COMMITTED too: a server that did not see its replicas yet (a follower, a restart
    # before the ``B`` key said COMPLETE) may still hold the block as committed
    (COMPLETE, PATCH_BEGIN): COMPLETE,
    (COMPLETE, PATCH_DONE): COMPLETE,
    (COMPLETE, PATCH_DROP): COMPLETE,
    (COMMITTED, PATCH_BEGIN): COMMITTED,
    (COMMITTED, PATCH_DONE): COMMITTED,
    (COMMITTED, PATCH_DROP): COMMITTED,
}

# replica states as block servers report them
FINALIZED = "FINALIZED"
RBW = "RBW"
RWR = "RWR"
REPLICA_STATES = (FINALIZED, RBW, RWR, "RUR", "TEMPORARY")
# states whose bytes a reader of a block being written may be sent to
WRITTEN_STATES = (FINALIZED, RBW, RWR)

GOOD = "good"
CORRUPT = "corrupt"
PENDING = "pending"


#: how a refusal names the events whose names are not verbs
_VERBS = {BlockEvent.MIN_REPLICATED: "complete (min replicated)",
          BlockEvent.START_RECOVERY: "start the recovery of",
          BlockEvent.RECOVERED: "end the recovery of",
          BlockEvent.UPDATE_PIPELINE: "update the pipeline of",
          BlockEvent.PATCH_BEGIN: "begin a patch of",
          BlockEvent.PATCH_DONE: "commit a patch of",
          BlockEvent.PATCH_DROP: "drop the patch of"}


def next_state(state: BlockState, event: BlockEvent, *, what: str = "block") -> BlockState:
    """Next state of a block, or ``InvalidArgument`` naming the refused transition."""
    nxt = TRANSITIONS.get((state, event))
    if nxt is None:
        raise InvalidArgument(f"{what}: cannot {_VERBS.get(event, event.replace('_', ' '))} "
                              f"a block that is {state}")
    return nxt


def classify_replica(block_state: str, block_gs: int, block_len: int,
                     gs: int, num_bytes: int, replica_state: str,
                     min_gs: int = 0, patch_gs: int = 0) -> tuple[str, str]:
    """``(GOOD|CORRUPT|PENDING, reason)`` for a reported replica of a block; ``min_gs``:
    the oldest stamp still accepted (pending) for a block reopened by append; ``patch_gs``:
    the stamp of a patch not yet committed (its replicas are pending, not newer-stamped
    strangers)."""
    if patch_gs and gs == patch_gs and block_state in (COMMITTED, COMPLETE):
        return PENDING, f"replica patched to the pending stamp {gs}"
    if min_gs and min_gs <= gs < block_gs and block_state in (UNDER_CONSTRUCTION,
                                                              UNDER_RECOVERY):
        return PENDING, f"replica being reopened (generation stamp {gs} < {block_gs})"
    if gs < block_gs:
        return CORRUPT, f"generation stamp {gs} older than the block's {block_gs}"
    if block_state in (COMMITTED, COMPLETE):
        if replica_state == FINALIZED:
            if gs != block_gs:
                return CORRUPT, f"generation stamp {gs} != block's {block_gs}"
            if num_bytes != block_len:
                return CORRUPT, f"length {num_bytes} != block's {block_len}"
            return GOOD, ""
        return PENDING, f"replica is {replica_state}"
    # being written or recovered: a finalized replica with a current stamp is readable
    if replica_state == FINALIZED:
        return GOOD, ""
    return PENDING, f"replica is {replica_state}"


@dataclass
class Replica:
    gs: int
    num_bytes: int
    state: str
    verdict: str = PENDING
    reason: str = ""
    reported_bad: bool = False   # a reader saw a checksum error (report_bad_blocks)

    @property
    def corrupt(self) -> bool:
        return self.verdict == CORRUPT or self.reported_bad

    @property
    def good(self) -> bool:
        return self.verdict == GOOD and not self.reported_bad


@dataclass
class BlockInfo:
    id: int
    ino: int
    index: int
    gs: int
    num_bytes: int
    state: BlockState
    replication: int
    replicas: dict[str, Replica] = field(default_factory=dict)
    expected: list[str] = field(default_factory=list)   # pipeline node ids of a UC block
    min_gs: int = 0   # append: the stamp before the reopen (see ``classify_replica``)
    patch_gs: int = 0   # a patch's stamp until PATCH_BLOCK commits it (module docstring)

    def __post_init__(self):
        # the one place a state is set without a transition: a new block or one loaded
        # from the store (``B`` key), so the stored string must name a state
        try:
            self.state = BlockState(self.state)
        except ValueError:
            raise InvalidArgument(f"block {self.id}: unknown block state {self.state!r}") \
                from None

    def ref(self) -> dict:
        return {"id": self.id, "gs": self.gs, "num_bytes": self.num_bytes}

    def location_nodes(self) -> list[str]:
        """Where a reader (or the writer) finds this block: for a block being written the
        expected nodes whose replica is not known corrupt, then other good ones; else the
        good replicas, then those of a pending patch's version (a block server serves a
        reader asking for an older stamp from a newer one)."""
        if self.state in (UNDER_CONSTRUCTION, UNDER_RECOVERY):
            nodes = [n for n in self.expected
                     if not (n in self.replicas and self.replicas[n].corrupt)]
            return nodes + [n for n in self.good_nodes() if n not in nodes]
        return self.good_nodes() + self.patched_nodes()

    def patched_nodes(self) -> list[str]:
        """The replicas that hold the pending patch's version (reported at ``patch_gs``):
        a reader asking for the block's committed stamp may read them too (a block server
        serves a newer stamp), and they are copies of the block while the patch runs."""
        if not self.patch_gs:
            return []
        return [n for n, r in self.replicas.items()
                if r.gs == self.patch_gs and r.state == FINALIZED and not r.reported_bad]

    def good_nodes(self) -> list[str]:
        return [n for n, r in self.replicas.items() if r.good]

    def corrupt_nodes(self) -> list[str]:
        return [n for n, r in self.replicas.items() if r.corrupt]

    @property
    def good_count(self) -> int:
        return sum(1 for r in self.replicas.values() if r.good)

    @property
    def copies(self) -> int:
        """Replicas holding the block whole: the good ones, and those of a pending patch's
        version (a patch that reached every replica must not make the block missing until
        patch_done)."""
        return self.good_count + len(self.patched_nodes())

    def recovery_gs(self) -> int:
        """The oldest stamp a replica may carry to take part in block recovery: the block's
        stamp, except for a block reopened by an append whose pipeline never reached any
        replica (none reported the new stamp; e.g. the append's setup failed) — then its
        replicas still carry the stamp before the reopen and are the data of the file."""
        if self.min_gs and not any(r.gs >= self.gs for r in self.replicas.values()):
            return self.min_gs
        return self.gs


class BlocksMap:
    """block id → BlockInfo, node → block ids, and the running block counters."""

    def __init__(self, min_replication: int = 1):
        self.min_replication = max(1, min_replication)
        self.clear()

    def clear(self) -> None:
        """Forget every block (a rebuild from the store follows): in place, since the
        services that read the map hold this object."""
        self.blocks: dict[int, BlockInfo] = {}
        self.by_node: dict[str, set[int]] = {}
        # safe mode: blocks that count (COMMITTED/COMPLETE) and those minimally reported
        self.total_countable = 0
        self.safe = 0
        # the report's health counters (see ``counts``)
        self.missing = 0
        self.under_replicated = 0
        self.corrupt = 0
        # blocks changed since the replication monitor last looked (see ``take_dirty``)
        self.dirty: set[int] = set()
        # file ino → its blocks with a pending patch (``patch_gs``): lease recovery settles them
        self.patches: dict[int, set[int]] = {}

    # ------------------------------------------------------------------ bookkeeping
    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, block_id: int) -> BlockInfo | None:
        return self.blocks.get(block_id)

    _NOTHING = (False, False, False, False, False)

    def _status(self, info: BlockInfo) -> tuple[bool, bool, bool, bool, bool]:
        """(countable, safe, missing, under-replicated, has a corrupt replica)."""
        countable = info.state in (COMMITTED, COMPLETE)
        good = info.copies
        corrupt = any(r.corrupt for r in info.replicas.values())
        return (countable, countable and good >= self.min_replication,
                countable and good == 0, countable and 0 < good < info.replication, corrupt)

    def _account(self, before: tuple, after: tuple) -> None:
        if before == after:
            return
        self.total_countable += int(after[0]) - int(before[0])
        self.safe += int(after[1]) - int(before[1])
        self.missing += int(after[2]) - int(before[2])
        self.under_replicated += int(after[3]) - int(before[3])
        self.corrupt += int(after[4]) - int(before[4])

    def _reevaluate(self, info: BlockInfo) -> None:
        """Reclassify every replica and apply COMMITTED → COMPLETE when replicated enough."""
        for replica in info.replicas.values():
            replica.verdict, replica.reason = classify_replica(
                info.state, info.gs, info.num_bytes, replica.gs, replica.num_bytes, replica.state,
                info.min_gs if info.state in (UNDER_CONSTRUCTION, UNDER_RECOVERY) else 0,
                info.patch_gs)
        if info.state == COMMITTED and info.good_count >= self.min_replication:
            info.state = next_state(info.state, MIN_REPLICATED)
        if info.state in (UNDER_CONSTRUCTION, UNDER_RECOVERY):
            for node_id, replica in info.replicas.items():
                if (replica.gs == info.gs and replica.state in WRITTEN_STATES
                        and not replica.corrupt and node_id not in info.expected):
                    info.expected.append(node_id)

    def _change(self, info: BlockInfo, mutate) -> None:
        self.dirty.add(info.id)
        before = self._status(info)
        mutate()
        self._reevaluate(info)
        self._account(before, self._status(info))

    # ------------------------------------------------------------------ namespace side
    def add(self, info: BlockInfo) -> None:
        """A new block (ADD_BLOCK) or one loaded at startup; replaces nothing."""
        if info.id in self.blocks:
            raise InvalidArgument(f"block {info.id} is already in the blocks map")
        self.blocks[info.id] = info
        self.dirty.add(info.id)
        if info.patch_gs:
            self.patches.setdefault(info.ino, set()).add(info.id)
        self._reevaluate(info)
        self._account(self._NOTHING, self._status(info))

    def remove(self, block_id: int) -> list[tuple[str, dict]]:
        """Forget a block (delete, abandon, overwrite); its replicas must go."""
        info = self.blocks.pop(block_id, None)
        if info is None:
            return []
        self.dirty.add(block_id)
        self._account(self._status(info), self._NOTHING)
        self._unindex_patch(info)
        doomed = []
        for node_id, replica in info.replicas.items():
            self.by_node.get(node_id, set()).discard(block_id)
            doomed.append((node_id, {"id": block_id, "gs": replica.gs,
                                     "num_bytes": replica.num_bytes}))
        return doomed

    def commit(self, block_id: int, num_bytes: int, *, what: str = "block") -> str:
        """The client reports the final length: UC → COMMITTED (→ COMPLETE if replicated)."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, COMMIT, what=what)
            info.num_bytes = num_bytes
        self._change(info, mutate)
        return info.state

    def close(self, block_id: int, num_bytes: int) -> None:
        """The file is closed (CLOSE): its last block is COMPLETE with ``num_bytes``."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, CLOSE, what=f"block {block_id}")
            info.num_bytes = num_bytes
        self._change(info, mutate)

    def truncate(self, block_id: int) -> None:
        """A truncate inside the (COMPLETE) last block reopens it; it keeps its length
        until block recovery cuts the replicas and commits the new one."""
        info = self.blocks[block_id]
        self._change(info, lambda: setattr(info, "state",
                                           next_state(info.state, TRUNCATE,
                                                      what=f"block {block_id}")))

    def start_recovery(self, block_id: int) -> None:
        """Block recovery (lease recovery or truncate) takes the block: UNDER_RECOVERY."""
        info = self.blocks[block_id]
        self._change(info, lambda: setattr(info, "state",
                                           next_state(info.state, START_RECOVERY,
                                                      what=f"block {block_id}")))

    def reopen(self, block_id: int, new_gs: int, holders: list[str]) -> None:
        """append reopens a COMPLETE last block under ``new_gs``; its current holders are
        the pipeline (``expected``) and stay pending until they report the new stamp."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, REOPEN, what=f"block {block_id}")
            info.min_gs, info.gs = info.gs, new_gs
            info.expected = list(holders)
        self._change(info, mutate)

    def recovered(self, block_id: int, *, gs: int, num_bytes: int, close: bool,
                  finalized_on: list[str]) -> None:
        """commit_block_synchronization: the recovery id becomes the stamp, the agreed
        length the length (COMMITTED, or COMPLETE when it also closes the file);
        ``finalized_on`` hold it FINALIZED (their reports follow)."""
        info = self.blocks[block_id]
        what = f"block {block_id}"

        def mutate():
            state = next_state(info.state, RECOVERED, what=what)
            if close:
                state = next_state(state, CLOSE, what=what)
            info.state, info.gs, info.num_bytes, info.min_gs = state, gs, num_bytes, 0
            for node_id in finalized_on:
                info.replicas[node_id] = Replica(gs, num_bytes, FINALIZED)
        self._change(info, mutate)
        for node_id in finalized_on:
            self.by_node.setdefault(node_id, set()).add(block_id)

    def update_pipeline(self, block_id: int, gs: int, num_bytes: int,
                        nodes: list[str]) -> None:
        """Pipeline recovery (HDFS updatePipeline) of a block being written: the new stamp
        and acknowledged length, and ``nodes`` become the expected locations. Their replicas
        take the new stamp (they were recovered to it before the call); every other replica
        keeps its older stamp and so turns stale (corrupt, never a location)."""
        info = self.blocks[block_id]
        state = next_state(info.state, UPDATE_PIPELINE, what=f"block {block_id}")

        def mutate():
            info.state = state
            info.gs, info.num_bytes, info.min_gs = gs, max(info.num_bytes, num_bytes), 0
            info.expected = list(nodes)
            for node_id in nodes:
                replica = info.replicas.get(node_id)
                if replica is not None and replica.gs < gs and replica.state != FINALIZED:
                    replica.gs = gs
        self._change(info, mutate)

    # ------------------------------------------------------------------ patches
    def _unindex_patch(self, info: BlockInfo) -> None:
        pending = self.patches.get(info.ino)
        if pending is not None:
            pending.discard(info.id)
            if not pending:
                del self.patches[info.ino]

    def pending_patches(self, ino: int) -> list[BlockInfo]:
        """The blocks of file ``ino`` with a pending patch, by index."""
        return sorted((self.blocks[b] for b in self.patches.get(ino, ()) if b in self.blocks),
                      key=attrgetter("index"))

    def begin_patch(self, block_id: int, patch_gs: int) -> None:
        """PATCH_BEGIN: ``patch_gs`` is the block's pending patch stamp (a later patch
        supersedes an earlier one: its replicas turn stale); the block keeps its stamp."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, PATCH_BEGIN, what=f"block {block_id}")
            info.patch_gs = patch_gs
        self._change(info, mutate)
        self.patches.setdefault(info.ino, set()).add(block_id)

    def patched(self, block_id: int, gs: int, num_bytes: int, nodes: list[str]) -> None:
        """PATCH_BLOCK: the patch's stamp and length are the block's; ``nodes`` hold the new
        version (FINALIZED: their own reports say the same, maybe later), every other
        replica keeps its older stamp and so turns stale (corrupt, invalidated once good
        copies replace it; the replication monitor makes them)."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, PATCH_DONE, what=f"block {block_id}")
            info.gs, info.num_bytes, info.patch_gs = gs, num_bytes, 0
            for node_id in nodes:
                old = info.replicas.get(node_id)
                if old is None or old.gs <= gs:
                    info.replicas[node_id] = Replica(gs, num_bytes, FINALIZED)
        self._change(info, mutate)
        self._unindex_patch(info)
        for node_id in nodes:
            self.by_node.setdefault(node_id, set()).add(block_id)

    def drop_patch(self, block_id: int) -> None:
        """PATCH_DROP: the block stays at its stamp; a replica at the dropped stamp is
        stale from now on."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, PATCH_DROP, what=f"block {block_id}")
            info.patch_gs = 0
        self._change(info, mutate)
        self._unindex_patch(info)

    def set_length(self, block_id: int, num_bytes: int) -> None:
        """hsync recorded the length of a block still being written."""
        info = self.blocks[block_id]
        self._change(info, lambda: setattr(info, "num_bytes", num_bytes))

    def set_replication(self, block_id: int, replication: int) -> None:
        info = self.blocks.get(block_id)
        if info is not None:
            self._change(info, lambda: setattr(info, "replication", replication))

    # ------------------------------------------------------------------ block server side
    def add_replica(self, node_id: str, block_id: int, gs: int, num_bytes: int,
                    state: str) -> BlockInfo | None:
        """A replica reported by ``node_id``; None when the block belongs to no file."""
        info = self.blocks.get(block_id)
        if info is None:
            return None
        old = info.replicas.get(node_id)

        def mutate():
            replica = Replica(gs, num_bytes, state)
            if old is not None and old.reported_bad and old.gs == gs and old.num_bytes == num_bytes:
                replica.reported_bad = True   # the same bytes a reader already refused
            info.replicas[node_id] = replica
        self._change(info, mutate)
        self.by_node.setdefault(node_id, set()).add(block_id)
        return info

    def remove_replica(self, node_id: str, block_id: int) -> None:
        info = self.blocks.get(block_id)
        node_blocks = self.by_node.get(node_id)
        if node_blocks is not None:
            node_blocks.discard(block_id)
        if info is None or node_id not in info.replicas:
            return
        self._change(info, lambda: info.replicas.pop(node_id, None))

    def remove_node(self, node_id: str) -> list[int]:
        """A dead block server: its replicas leave every block. Returns the affected ids."""
        affected = sorted(self.by_node.pop(node_id, set()))
        for block_id in affected:
            info = self.blocks.get(block_id)
            if info is not None and node_id in info.replicas:
                self._change(info, lambda info=info: info.replicas.pop(node_id, None))
        return affected

    def mark_bad(self, node_id: str, block_id: int) -> bool:
        """A reader found a checksum error in this replica; False if unknown."""
        info = self.blocks.get(block_id)
        if info is None or node_id not in info.replicas:
            return False
        replica = info.replicas[node_id]
        self._change(info, lambda: setattr(replica, "reported_bad", True))
        return True

    def excess_corrupt(self, block_id: int) -> list[tuple[str, dict]]:
        """Corrupt replicas that may be deleted now: the block has enough good copies."""
        info = self.blocks.get(block_id)
        if info is None or info.good_count < max(info.replication, self.min_replication):
            return []
        return [(node_id, {"id": block_id, "gs": r.gs, "num_bytes": r.num_bytes})
                for node_id, r in info.replicas.items() if r.corrupt]

    def take_dirty(self, limit: int) -> list[int]:
        """Up to ``limit`` block ids changed since the last call (the replication monitor
        checks each: every change of a block — a replica reported, lost, marked bad, the
        replication changed — passes through ``_change``, so nothing is missed)."""
        out = []
        while self.dirty and len(out) < limit:
            out.append(self.dirty.pop())
        return out

    def mark_dirty(self, block_ids) -> None:
        self.dirty.update(block_ids)

    def mark_node_dirty(self, node_id: str) -> None:
        """Every block with a replica on ``node_id`` is checked again (its admin state
        changed what its replicas count for)."""
        self.dirty.update(self.by_node.get(node_id, ()))

    # ------------------------------------------------------------------ queries
    def pipeline_updated(self, block_id: int, gs: int, num_bytes: int) -> None:
        """A journaled pipeline update (UPDATE_BLOCKS of a block being written) on a server
        that did not run it: the new stamp and length, the expected nodes unknown here."""
        info = self.blocks[block_id]

        def mutate():
            info.state = next_state(info.state, UPDATE_PIPELINE, what=f"block {block_id}")
            info.gs, info.num_bytes = gs, num_bytes
        self._change(info, mutate)

    def would_complete(self, block_id: int, num_bytes: int) -> bool:
        """Would committing with ``num_bytes`` make the block COMPLETE right away?"""
        info = self.blocks.get(block_id)
        if info is None:
            return False
        good = sum(1 for r in info.replicas.values()
                   if r.state == FINALIZED and r.gs == info.gs and r.num_bytes == num_bytes
                   and not r.reported_bad)
        return good >= self.min_replication

    def node_block_count(self, node_id: str) -> int:
        return len(self.by_node.get(node_id, ()))

    def counts(self) -> dict:
        """under_replicated (some but too few good copies) and missing (none) over the
        COMPLETE/COMMITTED blocks, corrupt (at least one corrupt replica) over all: the
        running counters, O(1)."""
        return {"under_replicated": self.under_replicated, "missing": self.missing,
                "corrupt": self.corrupt}

    def state_counts(self) -> dict[str, int]:
        """Blocks by state (UNDER_CONSTRUCTION, COMMITTED, COMPLETE, UNDER_RECOVERY): one
        walk of the map at C speed (metrics scrapes; ~30 ms per million blocks)."""
        counts = dict.fromkeys(BLOCK_STATES, 0)
        counts.update(collections.Counter(map(_state_of, self.blocks.values())))
        return counts

    def recount(self) -> dict:
        """``counts()`` computed by walking every block (tests check the counters with it)."""
        under = missing = corrupt = 0
        for info in self.blocks.values():
            if info.corrupt_nodes():
                corrupt += 1
            if info.state not in (COMMITTED, COMPLETE):
                continue
            good = info.copies
            if good == 0:
                missing += 1
            elif good < info.replication:
                under += 1
        return {"under_replicated": under, "missing": missing, "corrupt": corrupt}


_state_of = attrgetter("state")
