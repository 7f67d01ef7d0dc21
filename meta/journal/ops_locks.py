"""Lock holder ops of the journal: LOCK_HOLDER (a client may hold file locks), LOCK_HOLDER_GONE.

Why it exists: the lock table is volatile (a lock changes far more often than anything
journaled), so after a restart or on an HA successor the lock service must know whose
locks it no longer has: it waits for those clients to reclaim them before it grants
anyone a new lock (``meta.services.locks``, the grace). Only the holders are journaled,
each once: at its first lock (durably, before that lock is granted), and gone once it
held none for a while or unmounted. Reach them through ``meta.journal.ops.OPS`` /
``decode``.

Concurrency contract: immutable values; ``apply`` runs on the trio thread inside one
batch's apply, no awaits.
"""

from __future__ import annotations

from ..schema import keys
from .opbase import Op, register


@register
class LockHolder(Op):
    """``client`` may hold file locks from now on (its ``K`` key, with the record's time)."""
    NAME = "LOCK_HOLDER"
    client: str
    time: int

    def apply(self, txn, counters):
        txn.put(keys.lock_holder_key(self.client), {"since": self.time})


@register
class LockHolderGone(Op):
    """``client`` holds no file lock (it held none for a while, or unmounted)."""
    NAME = "LOCK_HOLDER_GONE"
    # a stale record only makes a restarted server wait for a reclaim that never comes
    lazy = True
    client: str

    def apply(self, txn, counters):
        txn.delete(keys.lock_holder_key(self.client))
