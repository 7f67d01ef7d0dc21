"""``apply(records)``: the only writer of the namespace store, used live (by the journal's
syncer after the fsync) and at replay.

Why it exists: applying is apart from planning so that replay needs nothing but the
records: every decision is in the record, the ops only execute it. What each op changes is
its ``apply`` in ``meta.journal.ops`` (reached through ``decode``, the registry); this module runs a
batch of them against one overlay and writes the result. ``RecordApplier`` is a mixin of
``meta.namespace.namespace.Namespace``. ``Txn`` (a batch's overlay: reads see the batch's earlier
writes, ``meta.journal.ops_store``) and ``inside`` are re-exported for the namespace and the replay
checker (``meta.namespace.invariants``).

Purity / concurrency contract: deterministic from the records and the state before them;
ALL records of a batch go to the store in ONE ``kv.write`` with the applied txid, then the
cache, the orphan set/reclaim cursors (``ReclaimPlanner.note_*``) and the counters
(``Namespace.adopt_counters``) follow what was written, in the same synchronous step.
Trio thread only, no awaits.
"""

from __future__ import annotations

from fs.errors import InternalError

from ..journal import keys
from .charge import file_charge
from ..journal.ops import decode
from ..journal.ops_store import Txn, charge_usage, inside

__all__ = ["RecordApplier", "Txn", "inside"]


class RecordApplier:
    """``apply``: a batch of journal records to the store (a mixin of ``Namespace``)."""

    def apply(self, records, ops=None) -> list[dict]:
        """Apply a batch of journal records in one store write; returns effects per record.
        ``ops``: the records already decoded (``meta.journal.ops.decode``), when the caller has them."""
        if ops is None:
            ops = [decode(record) for record in records]
        txn = Txn(self.kv, self.cache)
        counters = dict(self.counters)
        effects = []
        for record, op in zip(records, ops):
            if op.needs_format and keys.NAMESPACE_ID not in counters:
                raise InternalError(f"journal txid {record.txid}: {record.op} before FORMAT")
            charged = None
            if op.charges_file_space and counters.get(keys.QUOTA_DIRS):
                ino = op.ino
                charged = file_charge(txn.get, ino, txn.get(keys.inode_key(ino)))
            effect = op.apply(txn, counters) or {}
            if charged is not None:
                inode = txn.get(keys.inode_key(ino))
                if inode is not None:
                    charge_usage(txn, counters, inode.parent, 0,
                                 file_charge(txn.get, ino, inode) - charged)
            effect["op"] = record.op
            effects.append(effect)
            counters[keys.APPLIED_TXID] = record.txid
        for name, value in counters.items():
            if self.counters.get(name) != value:
                txn.put(keys.meta_key(name), value)
        try:
            txn.commit()
        except BaseException:   # a failed write may have landed partly: forget, not guess
            self.cache.clear()
            raise
        self.cache.committed(txn.puts, txn.dels)
        for key in txn.put_keys(keys.ORPHAN):
            self.note_orphan(keys.parse_orphan_key(key))
        for effect in effects:
            if effect["op"] == "RECLAIM":
                self.note_reclaimed(effect)
        self.adopt_counters(counters)
        return effects
