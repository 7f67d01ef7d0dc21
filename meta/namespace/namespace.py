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

``apply`` returns one ``Effect`` per record (``meta.journal.opbase``: blocks that left the
namespace, files that stopped being under construction, ...) so the server can update its
in-memory blocks map, leases and invalidate sets in the same synchronous step.

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

Layout: ``Namespace`` is the small owner: it holds the store (``kv``), the decoded
``cache`` and the ``defaults``, and builds one part per role in dependency order, each
given exactly what it uses (no part reaches another's private state):

* ``args``: limits, ``Defaults`` and the argument checks (functions; the inode kinds
  are the schema's, ``meta.schema.inode``);
* ``ids`` (``allocators.Allocators``): next inode id, next block id, generation stamp;
* ``view`` (``view.NamespaceView(kv, cache)``): the counters as stored, path walking,
  status, listing, subtree and block-list reads — what every planner and handler decides
  from;
* ``quota`` (``quota.QuotaPlanner(view)``): folder quotas: checks, usage,
  ``plan_set_quota``;
* ``reclaim`` (``reclaim.ReclaimPlanner(kv, view, defaults)``): detach decisions, the
  orphan set and reclaim cursors, ``plan_reclaim`` (deleting a big subtree in bounded
  records: see there);
* ``planner`` (``plan.NamespacePlanner(view, defaults, ids, quota, reclaim)``):
  ``plan_<op>`` of every op but the ones below, and the writer checks;
* ``renames`` (``rename.RenamePlanner(view, quota, reclaim)``): ``plan_rename`` and
  ``plan_rename_many``;
* ``concat`` (``concat.ConcatPlanner(view, quota)``): ``plan_concat`` (HDFS concat);
* the applier (``apply.RecordApplier(kv, cache, view, ids, reclaim)``): ``apply``, a batch
  of records in one store write; what each op does is its class in ``meta.journal.ops``
  (the registry of journal ops).

Callers ask the part that owns the call — ``ns.view.get_file_info(path)``,
``ns.planner.plan_create(...)``, ``ns.reclaim.has_orphans()`` — so a reader sees from the
call which part decides; the method names are the ones the parts define. ``Namespace``
itself has only ``load`` (re-read counters and orphans) and ``apply``: the two calls that
concern the whole (the journal and replay know the namespace, not its applier), kept
flat because every part follows what they do. A service that only reads is given
``ns.view`` alone (``Access``, ``Locator``, ``Security``, ``HAProtocol``).

Concurrency contract: trio thread only; no awaits, no I/O except the store's small sync
calls. Allocation counters (next inode id, next block id, generation stamp) advance in memory
when a plan is made and are persisted by ``apply`` (``max`` of stored and used), so an
abandoned plan only leaves a gap.
"""

from __future__ import annotations

from ..journal.opbase import Effect
from ..schema import keys
from .allocators import Allocators
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


class Namespace:
    """The namespace over a KV store: builds its parts in dependency order and owns them.
    Callers ask the part that owns the call; only ``load`` and ``apply`` are its own."""

    def __init__(self, kv, defaults: Defaults | None = None, *, cache_entries: int = 1_000_000):
        self.kv = kv
        self.cache = DecodedCache(cache_entries)
        self.defaults = defaults or Defaults()
        self.ids = Allocators()
        self.view = NamespaceView(kv, self.cache)
        self.quota = QuotaPlanner(self.view)
        self.reclaim = ReclaimPlanner(kv, self.view, self.defaults)
        self.planner = NamespacePlanner(self.view, self.defaults, self.ids, self.quota,
                                        self.reclaim)
        self.renames = RenamePlanner(self.view, self.quota, self.reclaim)
        self.concat = ConcatPlanner(self.view, self.quota)
        self._applier = RecordApplier(kv, self.cache, self.view, self.ids, self.reclaim)
        self.load()

    def load(self) -> None:
        """(Re)read the counters and the orphan roots from the store (after open or a
        replay)."""
        counters = {}
        for name in keys.COUNTERS:
            raw = self.kv.get(keys.meta_key(name))
            if raw is not None:
                counters[name] = keys.unpack(raw)
        self.view.adopt_counters(counters)
        self.ids.adopt(counters)
        self.reclaim.load_orphans()

    def apply(self, records, ops=None) -> list[Effect]:
        """``RecordApplier.apply``: a batch of journal records in one store write; the
        ``Effect`` of each record."""
        return self._applier.apply(records, ops)
