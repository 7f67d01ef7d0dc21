"""The inode-based namespace over the KV store: path resolution, validation, and the
``apply`` of every journal op.

Why it exists: it is the filesystem's meaning, kept apart from the RPC shell, so the
conformance suite drives it directly over both KV stores. Every mutation is split in two:

1. ``plan_<op>(...)`` (under the caller's path locks): validate against the current state,
   raising a clear ``LeaseFSError`` that names the path (nothing changes on error); decide
   everything (new inode/block ids, generation stamps, timestamps) and return the journal
   record ``(op, args)`` — or ``None`` when there is nothing to do.
2. ``apply(records)`` (called by the journal's syncer after the fsync, and by replay at
   start): apply ALL records of the batch to the store in ONE ``kv.write`` together with
   the applied txid. It is deterministic from the records and the state before them, and
   composes records of one batch through an overlay, so concurrent disjoint mutations that
   share a batch (and a parent directory's entry count) are applied correctly.

``apply`` returns one effects dict per record (blocks that left the namespace, files that
stopped being under construction, ...) so the server can update its in-memory blocks map,
leases and invalidate sets in the same synchronous step.

Ops (HDFS edit-log names): FORMAT, MKDIR, ADD (create, incl. overwrite and missing parents),
ADD_BLOCK (commits the previous block), UPDATE_BLOCKS (commit / length / gs changes),
ABANDON_BLOCK, FSYNC, CLOSE, DELETE, RENAME (rename2 with overwrite), RENAMES (several renames
visible at once: a job commit), SET_PERMISSIONS,
SET_OWNER, SET_REPLICATION, SET_QUOTA, CONCAT, TIMES, SYMLINK, SET_GENSTAMP, RECLAIM, and for leases
REASSIGN_LEASE, COMMIT_BLOCK_SYNC (block recovery done), TRUNCATE, APPEND.
Cost of a long file: only the last block and a COMMITTED penultimate may be incomplete
(ADD_BLOCK always names ``previous`` and completes the block before it), so writer calls
and CLOSE read the inode plus its last one or two block keys (``tail_blocks``), and a
ranged read of locations starts at the block holding the offset (``blocks_in_range``):
add_block at block 50 000 costs what it costs at block 5. Limits as in HDFS:
``min_block_size`` at create, ``max_blocks_per_file`` at add_block.

Layout: ``Namespace`` owns the state (store, cache, counters, allocators) and is composed
of one mixin per role, each in its own module:

* ``namespace_args``: inode kinds, limits, ``Defaults`` and the argument checks;
* ``namespace_view`` (``NamespaceView``): the decoded cache, path walking, status, listing,
  subtree and block-list reads — the read view every planner and handler decides from;
* ``namespace_plan`` (``NamespacePlanner``): ``plan_<op>`` of every op but the two below,
  and the writer checks;
* ``namespace_rename`` (``RenamePlanner``): ``plan_rename`` and ``plan_rename_many``;
* ``namespace_reclaim`` (``ReclaimPlanner``): detach decisions, the orphan set and reclaim
  cursors, ``plan_reclaim`` (deleting a big subtree in bounded records: see there);
* ``namespace_quota`` (``QuotaPlanner``): folder quotas: checks, usage, ``plan_set_quota``;
* ``namespace_concat`` (``ConcatPlanner``): ``plan_concat`` (HDFS concat);
* ``namespace_apply`` (``RecordApplier``): ``apply``, a batch of records in one store write;
  what each op does is its class in ``meta.journal.ops`` (the registry of journal ops).

Concurrency contract: trio thread only; no awaits, no I/O except the store's small sync
calls. Allocation counters (next inode id, next block id, generation stamp) advance in memory
when a plan is made and are persisted by ``apply`` (``max`` of stored and used), so an
abandoned plan only leaves a gap.
"""

from __future__ import annotations

from ..journal import keys
from .apply import RecordApplier, Txn, inside
from .args import (MAX_LIST_LIMIT, MAX_OWNER_LEN, MAX_RENAMES, MAX_TARGET_BYTES, Defaults,
                   check_block_ref, check_bool, check_int, check_mode, check_name)
from .concat import ConcatPlanner
from .plan import NamespacePlanner
from .quota import QuotaPlanner
from .reclaim import ReclaimPlanner
from .rename import RenamePlanner
from .view import CACHED_KINDS, ContentSummary, DecodedCache, NamespaceView

# what other modules import from here
__all__ = ["CACHED_KINDS", "MAX_LIST_LIMIT", "MAX_OWNER_LEN", "MAX_RENAMES",
           "MAX_TARGET_BYTES", "ContentSummary", "Defaults", "Namespace", "Txn",
           "check_block_ref", "check_bool", "check_int", "check_mode", "check_name",
           "inside"]


class Namespace(NamespaceView, NamespacePlanner, RenamePlanner, ReclaimPlanner, QuotaPlanner,
                ConcatPlanner, RecordApplier):
    """The namespace over a KV store: the state the role mixins share."""

    def __init__(self, kv, defaults: Defaults | None = None, *, cache_entries: int = 1_000_000):
        self.kv = kv
        self.cache = DecodedCache(cache_entries)
        self.defaults = defaults or Defaults()
        self.counters: dict[str, int | bytes] = {}
        self._next_ino = 0
        self._next_block_id = 0
        self._genstamp = 0
        self.init_reclaim_state()
        self.load()

    # ------------------------------------------------------------------ counters
    def load(self) -> None:
        """(Re)read the counters from the store (after open or a replay)."""
        counters = {}
        for name in keys.COUNTERS:
            raw = self.kv.get(keys.meta_key(name))
            if raw is not None:
                counters[name] = keys.unpack(raw)
        self.adopt_counters(counters)
        self.load_orphans()

    def adopt_counters(self, counters: dict) -> None:
        """``counters`` are the stored ones now (read, or just written by ``apply``). The
        allocators never go back: a plan not applied yet may have used ids past them."""
        self.counters = counters
        self._next_ino = max(self._next_ino, int(counters.get(keys.NEXT_INO, 0)))
        self._next_block_id = max(self._next_block_id, int(counters.get(keys.NEXT_BLOCK_ID, 0)))
        self._genstamp = max(self._genstamp, int(counters.get(keys.GENSTAMP, 0)))

    @property
    def genstamp(self) -> int:
        return self._genstamp

    def allocate_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def allocate_block_id(self) -> int:
        block_id = self._next_block_id
        self._next_block_id += 1
        return block_id

    def next_genstamp(self) -> int:
        self._genstamp += 1
        return self._genstamp
