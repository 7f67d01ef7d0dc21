"""File-content ops of the journal: ADD_BLOCK, UPDATE_BLOCKS, FSYNC, ABANDON_BLOCK, CLOSE,
INLINE, SET_REPLICATION, REASSIGN_LEASE, COMMIT_BLOCK_SYNC, TRUNCATE, APPEND, SET_GENSTAMP,
and the patch ops PATCH_BEGIN, PATCH_BLOCK, PATCH_DROP.

Why it exists: the ops of the write path, lease recovery and block recovery, each with its
wire form, store apply, memory apply (blocks map, leases) and replay check in one place
(see ``meta.journal.ops``). Every op here but SET_GENSTAMP and REASSIGN_LEASE changes the space of
its file ``ino`` (but PATCH_BEGIN and PATCH_DROP, which change no length;
``charges_file_space``: ``Namespace.apply`` charges the difference to
the quota folders above it). Reach them through ``meta.journal.ops.OPS`` / ``decode``.

Concurrency contract: immutable values; ``apply``/``apply_memory`` run on the trio thread
inside one batch's apply, no awaits; ``check`` only reads its view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..blocks import blocks as bm
from ..schema import keys
from . import ops_store as st
from ..blocks.blocks import COMMITTED, COMPLETE, UNDER_CONSTRUCTION, BlockInfo
from .opbase import ABSENT, Op, given, register, Effect
from ..schema.inode import FILE

log = logging.getLogger(__name__)


def commit_in_memory(blocks: bm.BlocksMap, block_id: int, num_bytes: int) -> None:
    """A block the journal committed at ``num_bytes``: committed in the blocks map, or (a
    block already past it, a retried commit) given its length."""
    info = blocks.get(block_id)
    if info is None:
        return
    if info.state == bm.UNDER_CONSTRUCTION:
        blocks.commit(block_id, num_bytes)
    else:
        blocks.set_length(block_id, num_bytes)


class _WriterOp(Op):
    """An op of the file's writer, by inode id: the writer checks ran on a linked file
    under construction (``NamespacePlanner.writer_file``); at replay it must still be one."""
    charges_file_space = True

    def check(self, view):
        inode = view.open_file(self.ino, linked=True)
        if inode is not None:
            self.check_blocks(view, (inode.nblocks or 0))

    def check_blocks(self, view, nblocks: int) -> None:
        pass

    def check_last(self, view, nblocks: int, index, block_id) -> None:
        """Block ``block_id`` at ``index`` is the file's last."""
        block = view.get(keys.block_key(self.ino, index)) if isinstance(index, int) else None
        if index != nblocks - 1 or block is None or block.get("id") != block_id:
            view.problem(f"block {block_id} (#{index}) is not the last of {nblocks} blocks")


@dataclass(frozen=True, slots=True, kw_only=True)
class AddBlockEffect(Effect):
    """ADD_BLOCK's: ``committed`` when its ``previous`` block was committed by it, and the
    file's replication, the new block's."""
    committed: bool = False
    replication: int = 1


@register
class AddBlock(_WriterOp):
    """A new block at ``index`` (``block``: id, gs) on ``targets``; ``previous`` (index, id,
    num_bytes) is committed and the block before it completed."""
    NAME = "ADD_BLOCK"
    ino: int
    index: int
    block: dict
    previous: dict | None = ABSENT
    targets: list = ABSENT
    time: int = ABSENT

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return AddBlockEffect()
        committed = False
        prev = given(self.previous)
        if prev is not None:
            old = txn.get(keys.block_key(ino, prev["index"]))
            if old is not None:
                state = old["state"] if old["state"] != UNDER_CONSTRUCTION else COMMITTED
                inode = st.set_block(txn, counters, ino, inode, prev["index"],
                                     {**old, "num_bytes": prev["num_bytes"], "state": state})
                committed = True
            # the server only adds a block when every block before ``previous`` is COMPLETE
            if prev["index"] >= 1:
                before = txn.get(keys.block_key(ino, prev["index"] - 1))
                if before is not None and before["state"] != COMPLETE:
                    inode = st.set_block(txn, counters, ino, inode, prev["index"] - 1,
                                         {**before, "state": COMPLETE})
        inode = st.set_block(txn, counters, ino, inode, self.index,
                             {"id": self.block["id"], "gs": self.block["gs"], "num_bytes": 0,
                              "state": UNDER_CONSTRUCTION})
        txn.put(keys.inode_key(ino), inode)
        return AddBlockEffect(committed=committed, replication=inode.replication or 1)

    def apply_memory(self, state, effect: AddBlockEffect, now):
        if effect.committed:
            prev = self.previous
            commit_in_memory(state.blocks, prev["id"], prev["num_bytes"])
        block = self.block
        state.blocks.add(BlockInfo(block["id"], self.ino, self.index, block["gs"], 0,
                                   bm.UNDER_CONSTRUCTION, effect.replication,
                                   expected=list(given(self.targets, []))))

    def check_blocks(self, view, nblocks):
        if self.index != nblocks:
            view.problem(f"adds block #{self.index} to a file of {nblocks} blocks")
        prev = given(self.previous)
        if prev is not None and prev.get("index") != nblocks - 1:
            view.problem(f"previous block #{prev.get('index')} is not the last of {nblocks}")


@register
class UpdateBlocks(_WriterOp):
    """New stamps, lengths or states of some of the file's blocks (``blocks``: index, id,
    gs, num_bytes, state): a commit, a pipeline update."""
    NAME = "UPDATE_BLOCKS"
    ino: int
    blocks: list

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return
        for block in self.blocks:
            inode = st.set_block(txn, counters, ino, inode, block["index"], block)
        txn.put(keys.inode_key(ino), inode)

    def apply_memory(self, state, effect, now):
        for block in self.blocks:
            if block["state"] == bm.COMMITTED:
                commit_in_memory(state.blocks, block["id"], block["num_bytes"])
            elif state.blocks.get(block["id"]) is not None:
                # the only other state planned here: a pipeline update of the last block
                state.blocks.pipeline_updated(block["id"], block["gs"], block["num_bytes"])

    def check_blocks(self, view, nblocks):
        for block in self.blocks:
            stored = view.get(keys.block_key(self.ino, block.get("index", -1)))
            if stored is None or stored.get("id") != block.get("id"):
                view.problem(f"block {block.get('id')} (#{block.get('index')}) is not the "
                             f"file's")


@register
class Fsync(_WriterOp):
    """The last block's length as the writer's hflush/hsync saw it. Lazy for a flush
    (``fsync(sync=false)``): an hsync waits for its fsync all the same."""
    NAME = "FSYNC"
    lazy = True
    ino: int
    index: int
    id: int
    num_bytes: int

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        old = txn.get(keys.block_key(ino, self.index)) if inode is not None else None
        if old is None:
            return
        inode = st.set_block(txn, counters, ino, inode, self.index,
                             {**old, "num_bytes": self.num_bytes})
        txn.put(keys.inode_key(ino), inode)

    def apply_memory(self, state, effect, now):
        if state.blocks.get(self.id) is not None:
            state.blocks.set_length(self.id, self.num_bytes)

    def check_blocks(self, view, nblocks):
        self.check_last(view, nblocks, self.index, self.id)


@register
class AbandonBlock(_WriterOp):
    NAME = "ABANDON_BLOCK"
    ino: int
    index: int
    id: int

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        key = keys.block_key(ino, self.index)
        old = txn.get(key) if inode is not None else None
        if old is None:
            return None
        txn.delete(key)
        if inode.inline is None:
            inode = inode.replace(length=(inode.length or 0) - old["num_bytes"])
        inode = inode.replace(nblocks=self.index)
        txn.put(keys.inode_key(ino), inode)
        return Effect(removed_blocks=(old["id"],))

    def check_blocks(self, view, nblocks):
        self.check_last(view, nblocks, self.index, self.id)


@register
class Close(_WriterOp):
    """Complete the file: ``last`` (index, id, num_bytes) is its final last block; the
    writer's ``mtime``/``atime``/``mode`` (when it set them) and inline ``data`` (the whole
    content, its unused blocks go) are present only when given."""
    NAME = "CLOSE"
    lazy = True
    ino: int
    last: dict | None = ABSENT
    time: int
    mtime: int | None = ABSENT
    atime: int | None = ABSENT
    mode: int | None = ABSENT
    data: bytes | None = ABSENT

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return None
        last = given(self.last)
        effect = None
        if given(self.data) is not None:
            effect = Effect(removed_blocks=tuple(st.store_inline(txn, ino, inode, self.data)))
            inode = txn.get(keys.inode_key(ino))
        # only the last two blocks may be incomplete (ADD_BLOCK completes the one before
        # ``previous``), so a close costs the same for 2 blocks and for 50 000
        nblocks = (inode.nblocks or 0)
        tail = [(index, txn.get(keys.block_key(ino, index)))
                for index in range(max(0, nblocks - 2), nblocks)]
        for index, block in tail:
            if block is None:
                log.error("apply CLOSE: block #%d of inode %d is missing", index, ino)
                continue
            if last is not None and index == last["index"]:
                block = {**block, "num_bytes": last["num_bytes"]}
            if block["state"] != COMPLETE or (last is not None and index == last["index"]):
                inode = st.set_block(txn, counters, ino, inode, index, {**block, "state": COMPLETE})
        inode = inode.replace(uc=None, mtime=self.time, ctime=self.time)
        if given(self.mtime) is not None:   # the writer's utimens while it wrote
            inode = inode.replace(mtime=self.mtime)
        if given(self.atime) is not None:
            inode = inode.replace(atime=self.atime)
        if given(self.mode) is not None:    # and its chmod
            inode = inode.replace(mode=self.mode)
        txn.put(keys.inode_key(ino), inode)
        txn.delete(keys.uc_key(ino))
        return effect

    def apply_memory(self, state, effect, now):
        last = given(self.last)
        if last is not None and state.blocks.get(last["id"]) is not None:
            state.blocks.close(last["id"], last["num_bytes"])
        state.recovery.lease_ended(self.ino)

    def check_blocks(self, view, nblocks):
        last = given(self.last)
        if last:
            self.check_last(view, nblocks, last["index"], last["id"])


@register
class Inline(_WriterOp):
    """The content of a still open file, kept in the namespace (``fsync(data=...)``). Lazy
    for a flush (``fsync(sync=false)``), as a CLOSE with data is."""
    NAME = "INLINE"
    lazy = True
    ino: int
    data: bytes

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return None
        removed = st.store_inline(txn, ino, inode, self.data)
        return Effect(removed_blocks=tuple(removed))


class _FileOp(Op):
    """Replay check: the inode is a file."""
    charges_file_space = True

    def check(self, view):
        inode = view.inode(self.ino)
        if inode is None or inode.type != FILE:
            view.problem(f"inode {self.ino} is not a file")


@dataclass(frozen=True, slots=True, kw_only=True)
class SetReplicationEffect(Effect):
    """SET_REPLICATION's: the file's blocks, which take its new replication."""
    block_ids: tuple[int, ...] = ()


@register
class SetReplication(_FileOp):
    NAME = "SET_REPLICATION"
    ino: int
    replication: int
    time: int

    def apply(self, txn, counters):
        st.update_inode(txn, self.ino, replication=self.replication, ctime=self.time)
        ids = tuple(block["id"] for _, block in txn.scan(keys.block_prefix(self.ino)))
        return SetReplicationEffect(block_ids=ids)

    def apply_memory(self, state, effect: SetReplicationEffect, now):
        for block_id in effect.block_ids:
            state.blocks.set_replication(block_id, self.replication)


@register
class Truncate(_FileOp):
    """Blocks from ``keep`` on go; ``last`` (index, id, gs, num_bytes, old_num_bytes): the
    block the new end falls in, kept for block recovery to cut, the file under construction
    for ``holder`` meanwhile. Also a rewrite (to 0, no ``last``: the lease stays)."""
    NAME = "TRUNCATE"
    ino: int
    new_length: int
    keep: int
    last: dict | None = ABSENT
    holder: str | None
    client_machine: str = ABSENT
    time: int

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return None
        removed = []
        for key, block in txn.scan(keys.block_prefix(ino)):
            if keys.parse_block_key(key)[1] >= self.keep:
                removed.append(block["id"])
                txn.delete(key)
        last = given(self.last)
        pending = 0     # bytes the cut block holds past its new end until recovery commits
        if last is not None:
            old = txn.get(keys.block_key(ino, last["index"]))
            if old is not None:
                # the target length lives in the block's own key, so a recovery started
                # again after a restart (or a retry) still cuts the replicas to it (HDFS
                # journals the truncate block for the same reason). The block keeps its
                # old length, and the file with it, until the commit: as in HDFS, a
                # length equal to the new one says the cut is done (`-truncate -w` waits
                # for it), and the bytes are still on the replicas meanwhile.
                txn.put(keys.block_key(ino, last["index"]),
                        {**old, "state": UNDER_CONSTRUCTION, "truncate_to": last["num_bytes"]})
                if inode.inline is None:
                    pending = old["num_bytes"] - last["num_bytes"]
            inode = st.set_uc(txn, ino, inode, self.holder, given(self.client_machine, ""))
        if inode.inline is not None:
            if self.new_length:
                data = txn.get(keys.inline_key(ino)) or b""
                txn.put(keys.inline_key(ino), bytes(data[:self.new_length]))
                inode = inode.replace(inline=self.new_length)
            else:
                inode = st.drop_inline(txn, ino, inode)
        inode = inode.replace(length=self.new_length + pending, nblocks=self.keep,
                              mtime=self.time, ctime=self.time)
        txn.put(keys.inode_key(ino), inode)
        return Effect(removed_blocks=tuple(removed))

    def apply_memory(self, state, effect, now):
        last = given(self.last)
        if last is not None:
            if state.blocks.get(last["id"]) is not None:
                state.blocks.truncate(last["id"])
            state.leases.add(self.holder, self.ino, now)


@register
class Append(_FileOp):
    """Reopen a closed file for ``holder``; ``last`` (index, id, gs, old_gs, num_bytes): a
    partial last block reopened under the new stamp ``gs``."""
    NAME = "APPEND"
    ino: int
    holder: str
    client_machine: str = ABSENT
    last: dict | None = ABSENT
    time: int

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None:
            return
        last = given(self.last)
        if last is not None:
            old = txn.get(keys.block_key(ino, last["index"]))
            if old is not None:
                inode = st.set_block(txn, counters, ino, inode, last["index"],
                                     {**old, "gs": last["gs"], "state": UNDER_CONSTRUCTION})
        inode = st.set_uc(txn, ino, inode, self.holder, given(self.client_machine, ""))
        txn.put(keys.inode_key(ino), inode)

    def apply_memory(self, state, effect, now):
        last = given(self.last)
        if last is not None and (info := state.blocks.get(last["id"])) is not None:
            state.blocks.reopen(last["id"], last["gs"], sorted(info.good_nodes()))
        state.leases.add(self.holder, self.ino, now)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryEffect(Effect):
    """A lease or block recovery record's: ``applied`` False when the file (or block) it
    names was no longer there, so memory keeps what it has."""
    applied: bool = False


class _RecoveryOp(Op):
    """Lease recovery: at replay, an existing file under construction."""

    def check(self, view):
        view.open_file(self.ino, linked=False)


@register
class ReassignLease(_RecoveryOp):
    """Lease recovery hands an open file to ``holder`` (HDFS REASSIGN_LEASE)."""
    NAME = "REASSIGN_LEASE"
    ino: int
    holder: str

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        if inode is None or not inode.uc:
            return RecoveryEffect()
        inode = st.set_uc(txn, ino, inode, self.holder, inode.uc.client_machine)
        txn.put(keys.inode_key(ino), inode)
        return RecoveryEffect(applied=True)

    def apply_memory(self, state, effect: RecoveryEffect, now):
        if effect.applied:
            state.leases.reassign(self.ino, self.holder, now)


@register
class CommitBlockSync(_RecoveryOp):
    """Block recovery done: the last block gets the recovery stamp ``gs`` and the agreed
    length, or goes (``delete``); ``close`` closes the file; ``targets``: the block servers
    that finalized it (added by the server after planning)."""
    NAME = "COMMIT_BLOCK_SYNC"
    charges_file_space = True
    ino: int
    index: int
    id: int
    gs: int
    num_bytes: int
    delete: bool
    close: bool
    time: int
    targets: list = ABSENT

    def apply(self, txn, counters):
        ino = self.ino
        inode = st.file_inode(txn, ino)
        key = keys.block_key(ino, self.index)
        old = txn.get(key) if inode is not None else None
        if old is None or old["id"] != self.id:
            return RecoveryEffect()
        effects = st.EffectBuilder()
        # a reopened inline file whose first block holds less than the inline bytes: the
        # writer died before sending them all, so nothing after them was acknowledged
        # either; the block goes and the inline data stays the content
        if self.delete or (inode.inline is not None and self.num_bytes < inode.inline):
            txn.delete(key)
            if inode.inline is None:
                inode = inode.replace(length=(inode.length or 0) - old["num_bytes"])
            inode = inode.replace(nblocks=self.index)
            effects.removed_blocks.append(self.id)
        else:
            synced = {**old, "gs": self.gs, "num_bytes": self.num_bytes,
                      "state": COMPLETE if self.close else COMMITTED}
            inode = st.set_block(txn, counters, ino, inode, self.index, synced)
        txn.put(keys.inode_key(ino), inode)
        if self.close:
            effects.add(Close(ino=ino, last=None, time=self.time).apply(txn, counters))
        return effects.effect(RecoveryEffect, applied=True)

    def apply_memory(self, state, effect: RecoveryEffect, now):
        state.recovery.forget_recovery(self.id)
        if not self.delete and state.blocks.get(self.id) is not None and effect.applied:
            state.blocks.recovered(self.id, gs=self.gs, num_bytes=self.num_bytes,
                                   close=self.close,
                                   finalized_on=[n for n in given(self.targets, [])
                                                 if isinstance(n, str)])
        if self.close and effect.applied:
            state.recovery.lease_ended(self.ino)


@register
class SetGenstamp(Op):
    """A generation stamp handed out without a block change (a block recovery's id)."""
    NAME = "SET_GENSTAMP"
    gs: int

    def apply(self, txn, counters):
        st.bump(counters, keys.GENSTAMP, self.gs)


# ------------------------------------------------------------------ patches
# A patch rewrites a COMPLETE block of an open file in place under a new stamp
# (PROTOCOL.md "Patches"). The pending stamp is durable before any block server is told
# of it, so that a restarted server (or an HA successor) still knows the replicas that
# carry it are the patch's, and lease recovery can commit them.


class _PatchOp(Op):
    """A patch op on block ``id`` at ``index`` of file ``ino``: at replay the file is open
    (a writer's patch, or lease recovery settling it before the close) and the block is
    there; a block that is no longer (a delete or rewrite in the same batch) changes
    nothing."""

    def check(self, view):
        if view.open_file(self.ino, linked=False) is None:
            return
        block = view.get(keys.block_key(self.ino, self.index))
        if block is None or block.get("id") != self.id:
            view.problem(f"block {self.id} (#{self.index}) is not the file's")

    def _block(self, txn) -> tuple[object, dict | None]:
        inode = st.file_inode(txn, self.ino)
        block = txn.get(keys.block_key(self.ino, self.index)) if inode is not None else None
        if block is None or block["id"] != self.id:
            return inode, None
        return inode, block


@register
class PatchBegin(_PatchOp):
    """``patch_block``: ``gs`` is handed out (the genstamp counter passes it) and becomes
    the block's pending patch stamp; the block keeps its committed stamp for readers."""
    NAME = "PATCH_BEGIN"
    ino: int
    index: int
    id: int
    gs: int

    def apply(self, txn, counters):
        st.bump(counters, keys.GENSTAMP, self.gs)
        _, block = self._block(txn)
        if block is None:
            return RecoveryEffect()
        txn.put(keys.block_key(self.ino, self.index), {**block, "patch_gs": self.gs})
        return RecoveryEffect(applied=True)

    def apply_memory(self, state, effect: RecoveryEffect, now):
        if effect.applied and state.blocks.get(self.id) is not None:
            state.blocks.begin_patch(self.id, self.gs)


@register
class PatchBlock(_PatchOp):
    """A patch committed (``patch_done``, or lease recovery that found replicas of it): the
    block takes the stamp ``gs`` and length ``num_bytes`` (the file's length follows; only
    its last block grows), ``nodes`` hold it, the file's mtime is ``time``."""
    NAME = "PATCH_BLOCK"
    charges_file_space = True
    ino: int
    index: int
    id: int
    gs: int
    num_bytes: int
    nodes: list
    time: int

    def apply(self, txn, counters):
        inode, block = self._block(txn)
        if block is None:
            return RecoveryEffect()
        inode = st.set_block(txn, counters, self.ino, inode, self.index,
                             {**block, "gs": self.gs, "num_bytes": self.num_bytes,
                              "patch_gs": 0})
        txn.put(keys.inode_key(self.ino), inode.replace(mtime=self.time, ctime=self.time))
        return RecoveryEffect(applied=True)

    def apply_memory(self, state, effect: RecoveryEffect, now):
        if effect.applied and state.blocks.get(self.id) is not None:
            state.blocks.patched(self.id, self.gs, self.num_bytes,
                                 [n for n in self.nodes if isinstance(n, str)])


@register
class PatchDrop(_PatchOp):
    """Lease recovery found no replica at the pending patch stamp ``gs``: the block stays
    at its committed stamp, and the pending one goes (a replica reporting it later is
    stale)."""
    NAME = "PATCH_DROP"
    ino: int
    index: int
    id: int
    gs: int

    def apply(self, txn, counters):
        _, block = self._block(txn)
        if block is None or block.get("patch_gs") != self.gs:
            return RecoveryEffect()
        txn.put(keys.block_key(self.ino, self.index),
                {k: v for k, v in block.items() if k != "patch_gs"})
        return RecoveryEffect(applied=True)

    def apply_memory(self, state, effect: RecoveryEffect, now):
        info = state.blocks.get(self.id)
        if effect.applied and info is not None and info.patch_gs == self.gs:
            state.blocks.drop_patch(self.id)
