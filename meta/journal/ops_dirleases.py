"""Directory lease ops of the journal: DIR_LEASE_GRANT, DIR_LEASE_REFILL, DIR_LEASE_RELEASE.

Why it exists: a directory write lease must come back after a restart and on an HA
successor, and its epoch must never be reused, so grants and releases are journaled (rare
next to the changes they cover, docs/design/dirleases.md). A grant's epoch is the txid of
its own record; the lease is stored under ``keys.dir_lease_key`` (``W``) and followed in
memory by the server's directory lease service (``MemoryState.dir_leases``: its table, and
the accesses waiting for a lease to end). A grant may reserve inode ids for its holder's
creates in the directory (``first_ino``, ``inos``; left out of the record when none, so
records without them decode as grants of none): the lease key keeps them, and the stored
``next_ino`` counter moves past them, so neither a restart nor an HA successor hands them
out again. A refill gives a held lease fresh ids (``first_ino``, ``inos``) and keeps the
range it had as ``earlier_first_ino``, ``earlier_inos`` (the holder's changes sent before
the refill still use it). A release names the epoch it ends: one that arrives after the directory was
leased again (an expiry racing a re-grant) changes nothing. Reach them through
``meta.journal.ops.OPS`` / ``decode``.

Concurrency contract: immutable values; ``apply``/``apply_memory`` run on the trio thread
inside one batch's apply, no awaits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..leases.dirleases import NO_INOS, InoRange
from ..schema import keys
from ..schema.inode import DIR
from . import ops_store as st
from .opbase import ABSENT, Effect, Op, given, register


@dataclass(frozen=True, slots=True, kw_only=True)
class DirLeaseEffect(Effect):
    """A grant's epoch (its record's txid); a release's: whether it ended the stored lease;
    a refill's: whether the lease was still held to take it."""
    epoch: int = 0
    ended: bool = False
    refilled: bool = False


def stored_inos(value: dict, prefix: str = "") -> InoRange:
    """The inode ids a stored lease (its ``W`` key's value) reserved (``prefix``
    ``earlier_``: the range it had before its last refill)."""
    count = value.get(prefix + "inos", 0)
    return InoRange(value[prefix + "first_ino"], count) if count else NO_INOS


def _check_unused(view, ino: int, reserved: InoRange) -> None:
    # the allocator hands out ids in order: the range's ends stand for all of it
    for one in (reserved.first, reserved.first + reserved.count - 1):
        if view.inode(one) is not None:
            view.problem(f"directory inode {ino}: reserved inode id {one} is in use")


@register
class DirLeaseGrant(Op):
    """``holder`` now holds directory ``ino``; the epoch is this record's txid, or
    ``epoch`` when given (a folder the holder made under its lease, ``dir_batch`` mkdir:
    ``fs.dirops.child_epoch``, out of the txids' range). With ``inos`` > 0: inode ids
    ``first_ino`` .. ``first_ino + inos - 1`` are reserved for the files the holder creates
    there (``dir_batch`` create); a made folder's come out of its parent lease's."""
    NAME = "DIR_LEASE_GRANT"
    # as lazy as the changes it covers: a holder's changes are durable at its fsync,
    # which makes the grant before them durable too
    lazy = True
    ino: int
    holder: str
    first_ino: int = ABSENT
    inos: int = ABSENT
    epoch: int = ABSENT

    @property
    def reserved(self) -> InoRange:
        count = given(self.inos, 0)
        return InoRange(given(self.first_ino, 0), count) if count else NO_INOS

    def apply(self, txn, counters):
        epoch = given(self.epoch, counters[keys.APPLIED_TXID])
        value = {"holder": self.holder, "epoch": epoch}
        reserved = self.reserved
        if reserved.count:
            value.update(first_ino=reserved.first, inos=reserved.count)
            # the ids are the holder's from now on: nothing allocates them again
            st.bump(counters, keys.NEXT_INO, reserved.first + reserved.count - 1)
        txn.put(keys.dir_lease_key(self.ino), value)
        return DirLeaseEffect(epoch=epoch)

    def apply_memory(self, state, effect: DirLeaseEffect, now):
        state.dir_leases.lease_granted(self.ino, self.holder, effect.epoch, self.reserved)

    def check(self, view):
        inode = view.inode(self.ino)
        if inode is None or inode.type != DIR:
            view.problem(f"inode {self.ino} is not a directory")
        current = view.get(keys.dir_lease_key(self.ino))
        if current is not None:
            view.problem(f"directory inode {self.ino} is already leased to "
                         f"{current.get('holder')!r} (epoch {current.get('epoch')})")
        if self.reserved.count:
            _check_unused(view, self.ino, self.reserved)


@register
class DirLeaseRefill(Op):
    """``holder``'s lease ``epoch`` on ``ino`` gets inode ids ``first_ino`` .. ``first_ino
    + inos - 1`` for its creates (``dir_batch`` refill: a holder running out asks ahead);
    the range it had stays, the one before it goes."""
    NAME = "DIR_LEASE_REFILL"
    lazy = True   # as the changes it serves
    ino: int
    holder: str
    epoch: int
    first_ino: int
    inos: int

    @property
    def reserved(self) -> InoRange:
        return InoRange(self.first_ino, self.inos)

    def apply(self, txn, counters):
        key = keys.dir_lease_key(self.ino)
        current = txn.get(key)
        # the ids are spent either way: nothing allocates them again
        st.bump(counters, keys.NEXT_INO, self.first_ino + self.inos - 1)
        if current is None or current.get("holder") != self.holder \
                or current.get("epoch") != self.epoch:
            return DirLeaseEffect(epoch=self.epoch)   # ended meanwhile
        value = {"holder": self.holder, "epoch": self.epoch,
                 "first_ino": self.first_ino, "inos": self.inos}
        if current.get("inos"):
            value.update(earlier_first_ino=current["first_ino"],
                         earlier_inos=current["inos"])
        txn.put(key, value)
        return DirLeaseEffect(epoch=self.epoch, refilled=True)

    def apply_memory(self, state, effect: DirLeaseEffect, now):
        if effect.refilled:
            state.dir_leases.lease_refilled(self.ino, self.holder, self.epoch, self.reserved)

    def check(self, view):
        current = view.get(keys.dir_lease_key(self.ino))
        if current is None or current.get("holder") != self.holder \
                or current.get("epoch") != self.epoch:
            view.problem(f"directory inode {self.ino} is not leased to {self.holder!r} "
                         f"under epoch {self.epoch}")
        if self.inos < 1:
            view.problem(f"directory inode {self.ino}: a refill of no ids")
        else:
            _check_unused(view, self.ino, self.reserved)


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
        if current is None or current.get("holder") != self.holder \
                or current.get("epoch") != self.epoch:
            return DirLeaseEffect(epoch=self.epoch)   # already ended, or a newer lease
        txn.delete(key)
        return DirLeaseEffect(epoch=self.epoch, ended=True)

    def apply_memory(self, state, effect: DirLeaseEffect, now):
        if effect.ended:
            state.dir_leases.lease_ended(self.ino, self.epoch)
