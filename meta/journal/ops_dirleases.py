"""Directory lease ops of the journal: DIR_LEASE_GRANT, DIR_LEASE_RELEASE.

Why it exists: a directory write lease must come back after a restart and on an HA
successor, and its epoch must never be reused, so grants and releases are journaled (rare
next to the changes they cover, docs/design/dirleases.md). A grant's epoch is the txid of
its own record; the lease is stored under ``keys.dir_lease_key`` (``W``) and followed in
memory by the server's directory lease service (``MemoryState.dir_leases``: its table, and
the accesses waiting for a lease to end). A release names the
epoch it ends: one that arrives after the directory was leased again (an expiry racing a
re-grant) changes nothing. Reach them through ``meta.journal.ops.OPS`` / ``decode``.

Concurrency contract: immutable values; ``apply``/``apply_memory`` run on the trio thread
inside one batch's apply, no awaits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import keys
from ..schema.inode import DIR
from .opbase import Effect, Op, register


@dataclass(frozen=True, slots=True, kw_only=True)
class DirLeaseEffect(Effect):
    """A grant's epoch (its record's txid); a release's: whether it ended the stored lease."""
    epoch: int = 0
    ended: bool = False


@register
class DirLeaseGrant(Op):
    """``holder`` now holds directory ``ino``; the epoch is this record's txid."""
    NAME = "DIR_LEASE_GRANT"
    # as lazy as the changes it covers: a holder's changes are durable at its fsync,
    # which makes the grant before them durable too
    lazy = True
    ino: int
    holder: str

    def apply(self, txn, counters):
        epoch = counters[keys.APPLIED_TXID]
        txn.put(keys.dir_lease_key(self.ino), {"holder": self.holder, "epoch": epoch})
        return DirLeaseEffect(epoch=epoch)

    def apply_memory(self, state, effect: DirLeaseEffect, now):
        state.dir_leases.lease_granted(self.ino, self.holder, effect.epoch)

    def check(self, view):
        inode = view.inode(self.ino)
        if inode is None or inode.type != DIR:
            view.problem(f"inode {self.ino} is not a directory")
        current = view.get(keys.dir_lease_key(self.ino))
        if current is not None:
            view.problem(f"directory inode {self.ino} is already leased to "
                         f"{current.get('holder')!r} (epoch {current.get('epoch')})")


@register
class DirLeaseRelease(Op):
    """The lease of ``holder`` on ``ino`` under ``epoch`` ends (given back, or expired:
    its recall went unanswered, or its holder's client lease ended)."""
    NAME = "DIR_LEASE_RELEASE"
    # a holder's own release may be (it sends nothing more under it); an expiry is
    # journaled durably by its caller, before the clients waiting for it go on
    lazy = True
    ino: int
    holder: str
    epoch: int

    def apply(self, txn, counters):
        key = keys.dir_lease_key(self.ino)
        current = txn.get(key)
        if current != {"holder": self.holder, "epoch": self.epoch}:
            return DirLeaseEffect(epoch=self.epoch)   # already ended, or a newer lease
        txn.delete(key)
        return DirLeaseEffect(epoch=self.epoch, ended=True)

    def apply_memory(self, state, effect: DirLeaseEffect, now):
        if effect.ended:
            state.dir_leases.lease_ended(self.ino, self.epoch)
