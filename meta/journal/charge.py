"""The space a file holds against a space quota, read from the store's keys.

Why a module of its own: the journal's ops charge and release this space when they apply,
and the quota planners check it before a record is made; both sides use this one rule, and
neither has to import the other for it.

Concurrency contract: a pure function of what ``get`` reads.
"""

from __future__ import annotations

from ..blocks.blocks import COMPLETE
from ..schema import keys
from ..schema.inode import FILE, Inode


def file_charge(get, ino: int, inode: Inode | None) -> int:
    """The space file ``ino`` holds against a space quota; ``get(key)`` reads a decoded key
    (a batch's ``Txn.get`` or the view's cached read)."""
    if inode is None or inode.type != FILE:
        return 0
    length = (inode.length or 0)
    nblocks = (inode.nblocks or 0)
    if nblocks:
        last = get(keys.block_key(ino, nblocks - 1))
        if last is not None and last["state"] != COMPLETE:
            length += (inode.block_size or 0) - last["num_bytes"]
    return length * (inode.replication or 1)
