"""``apply(records)``: the only writer of the namespace store, used live (by the journal's
syncer after the fsync) and at replay.

Why it exists: applying is apart from planning so that replay needs nothing but the
records: every decision is in the record, the ops only execute it. What each op changes is
its ``apply`` in ``meta.journal.ops`` (reached through ``decode``, the registry); this
module runs a batch of them against one overlay and writes the result. ``RecordApplier``
is a part of ``meta.namespace.namespace.Namespace``, which forwards its ``apply`` to it.
``Txn`` (a batch's overlay: reads see the batch's earlier writes,
``meta.journal.ops_store``) and ``inside`` are re-exported for the namespace and the
replay checker (``meta.namespace.invariants``).

Purity / concurrency contract: deterministic from the records and the state before them;
ALL records of a batch go to the store in ONE ``kv.write`` with the applied txid, then the
cache, the orphan set/reclaim cursors (``ReclaimPlanner.note_*``) and the counters
(``NamespaceView.adopt_counters``, ``Allocators.adopt``) follow what was written, in the
same synchronous step.
Trio thread only, no awaits.
"""

from __future__ import annotations

from fs.errors import InternalError

from ..schema import keys
from .allocators import Allocators
from ..journal.charge import file_charge
from ..journal.ops import NO_EFFECT, Effect, decode
from ..journal.ops_namespace import Reclaim
from .reclaim import ReclaimPlanner
from .view import DecodedCache, NamespaceView
from ..journal.ops_store import Txn, charge_usage, inside

__all__ = ["RecordApplier", "Txn", "inside"]


class RecordApplier:
    """``apply``: a batch of journal records to the store ``kv``; then ``cache``, ``view``'s
    counters, the allocators ``ids`` and ``reclaim``'s orphans and cursors follow what it
    wrote."""

    def __init__(self, kv, cache: DecodedCache, view: NamespaceView, ids: Allocators,
                 reclaim: ReclaimPlanner):
        self.kv = kv
        self.cache = cache
        self._view = view
        self._ids = ids
        self._reclaim = reclaim

    def apply(self, records, ops=None) -> list[Effect]:
        """Apply a batch of journal records in one store write; returns each record's
        ``Effect`` (``NO_EFFECT`` for an op whose ``apply`` returned None).
        ``ops``: the records already decoded (``meta.journal.ops.decode``), when the caller has them."""
        if ops is None:
            ops = [decode(record) for record in records]
        txn = Txn(self.kv, self.cache)
        counters = dict(self._view.counters)
        effects = []
        for record, op in zip(records, ops):
            if op.needs_format and keys.NAMESPACE_ID not in counters:
                raise InternalError(f"journal txid {record.txid}: {record.op} before FORMAT")
            # before the op: one whose own txid means something reads it here (a
            # directory lease's epoch is the txid of its grant)
            counters[keys.APPLIED_TXID] = record.txid
            charged = None
            if op.charges_file_space and counters.get(keys.QUOTA_DIRS):
                ino = op.ino
                charged = file_charge(txn.get, ino, txn.get(keys.inode_key(ino)))
            effect = op.apply(txn, counters)
            if charged is not None:
                inode = txn.get(keys.inode_key(ino))
                if inode is not None:
                    charge_usage(txn, counters, inode.parent, 0,
                                 file_charge(txn.get, ino, inode) - charged)
            effects.append(NO_EFFECT if effect is None else effect)
        for name, value in counters.items():
            if self._view.counters.get(name) != value:
                txn.put(keys.meta_key(name), value)
        try:
            txn.commit()
        except BaseException:   # a failed write may have landed partly: forget, not guess
            self.cache.clear()
            raise
        self.cache.committed(txn.puts, txn.dels)
        for key in txn.put_keys(keys.ORPHAN):
            self._reclaim.note_orphan(keys.parse_orphan_key(key))
        for op in ops:
            if isinstance(op, Reclaim):
                self._reclaim.note_reclaimed(op)
        self._view.adopt_counters(counters)
        self._ids.adopt(counters)
        return effects
