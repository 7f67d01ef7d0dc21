"""Namespace ops of the journal: FORMAT, MKDIR, ADD, SYMLINK, DELETE, RECLAIM, RENAME,
RENAMES, SET_PERMISSIONS, SET_OWNER, TIMES, CONCAT, SET_QUOTA.

Why it exists: the tree-shaping ops (entries, inodes, quota folders) with their wire form,
store apply, memory apply and replay check in one place each (see ``meta.journal.ops``; the
planners that build them are ``meta.namespace.plan`` and its siblings). Reach them through
``meta.journal.ops.OPS`` / ``decode``.

Concurrency contract: immutable values; ``apply``/``apply_memory`` run on the trio thread
inside one batch's apply, no awaits; ``check`` only reads its view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fs.errors import InternalError

from ..schema import keys
from . import ops_store as st
from ..schema.inode import DIR, FILE, SYMLINK, Inode, Quota, UnderConstruction
from .charge import file_charge
from .opbase import ABSENT, Effect, Op, given, register

log = logging.getLogger(__name__)


@register
class Format(Op):
    """A new namespace: the root directory and the counters (the first record of all)."""
    NAME = "FORMAT"
    needs_format = False
    namespace_id: int
    time: int
    mode: int
    owner: str
    group: str

    def apply(self, txn, counters):
        if keys.NAMESPACE_ID in counters:
            raise InternalError("FORMAT of an already formatted namespace")
        t = self.time
        root = Inode(DIR, self.mode, self.owner, self.group, t, t, t, 0, "", children=0,
                     subdirs=0)
        txn.put(keys.inode_key(keys.ROOT_INO), root)
        counters.update({keys.NAMESPACE_ID: self.namespace_id,
                         keys.LAYOUT: keys.LAYOUT_VERSION,
                         keys.NEXT_INO: keys.ROOT_INO + 1, keys.NEXT_BLOCK_ID: 1,
                         keys.GENSTAMP: 1000, keys.FILES: 0, keys.DIRS: 1})

    def check(self, view):
        if view.formatted:
            view.problem("the namespace is already formatted")


@register
class Mkdir(Op):
    """New directories (``dirs``: dicts parent, name, ino, mode, owner, group; parents first)."""
    NAME = "MKDIR"
    lazy = True
    dirs: list
    time: int

    def apply(self, txn, counters):
        st.mkdirs(txn, counters, self.dirs, self.time)

    def check(self, view):
        view.new_dirs(self.dirs)


@register
class Add(Op):
    """Create a file under construction for ``holder`` (missing parents in ``dirs``;
    ``overwrite``: the file it replaces, removed or, with ``detach``, detached)."""
    NAME = "ADD"
    lazy = True
    dirs: list
    parent: int
    name: str
    ino: int
    mode: int
    owner: str
    group: str
    time: int
    replication: int
    block_size: int
    holder: str
    client_machine: str = ABSENT
    overwrite: int | None
    detach: bool = ABSENT
    usage: list | None = ABSENT

    def apply(self, txn, counters):
        effects = None
        t = self.time
        st.mkdirs(txn, counters, self.dirs, t)
        if self.overwrite is not None:
            effects = st.EffectBuilder()
            st.unlink(txn, counters, self.parent, self.name, self.overwrite, t, effects,
                      detach=given(self.detach, False), usage=given(self.usage))
        inode = Inode(FILE, self.mode, self.owner, self.group, t, t, t, self.parent, self.name,
                      replication=self.replication, block_size=self.block_size, length=0,
                      nblocks=0,
                      uc=UnderConstruction(self.holder, given(self.client_machine, "")))
        st.link(txn, counters, self.parent, self.name, self.ino, inode, t)
        txn.put(keys.uc_key(self.ino), self.holder)
        return effects.effect() if effects is not None else None

    def apply_memory(self, state, effect, now):
        state.leases.add(self.holder, self.ino, now)

    def check(self, view):
        made = view.new_dirs(self.dirs)
        view.new_entry(self.parent, self.name, self.ino, made, self.overwrite)


@register
class Symlink(Op):
    NAME = "SYMLINK"
    lazy = True
    dirs: list
    parent: int
    name: str
    ino: int
    target: str
    mode: int
    owner: str
    group: str
    time: int

    def apply(self, txn, counters):
        t = self.time
        st.mkdirs(txn, counters, self.dirs, t)
        inode = Inode(SYMLINK, self.mode, self.owner, self.group, t, t, t, self.parent,
                      self.name, target=self.target)
        st.link(txn, counters, self.parent, self.name, self.ino, inode, t)

    def check(self, view):
        made = view.new_dirs(self.dirs)
        view.new_entry(self.parent, self.name, self.ino, made)


@register
class Delete(Op):
    """Remove an entry and its subtree, or (``detach``) leave the subtree to the reclaimer."""
    NAME = "DELETE"
    lazy = True
    parent: int
    name: str
    ino: int
    time: int
    detach: bool = ABSENT
    usage: list | None = ABSENT

    def apply(self, txn, counters):
        effects = st.EffectBuilder()
        st.unlink(txn, counters, self.parent, self.name, self.ino, self.time, effects,
                  detach=given(self.detach, False), usage=given(self.usage))
        return effects.effect()

    def check(self, view):
        current = view.entry(self.parent, self.name)
        if current != self.ino or view.inode(self.ino) is None:
            view.problem(f"entry {self.name!r} in inode {self.parent} is {current}, the "
                         f"planner deleted inode {self.ino}")
        elif self.ino == keys.ROOT_INO:
            view.problem("deletes the root")


@register
class Reclaim(Op):
    """Remove exactly the listed keys of an orphan subtree (see ``plan_reclaim``):
    ``blocks`` [ino, index, id], ``inodes`` [ino, kind], ``entries`` [parent, name]."""
    NAME = "RECLAIM"
    root: int
    blocks: list
    inodes: list
    entries: list
    uc: list
    done: bool

    def apply(self, txn, counters):
        removed_blocks = [block_id for _, _, block_id in self.blocks]
        for ino, index, _ in self.blocks:
            txn.delete(keys.block_key(ino, index))
        removed_inos = {ino for ino, _ in self.inodes}
        left: dict[int, int] = {}
        for parent, name in self.entries:
            txn.delete(keys.dentry_key(parent, name))
            left[parent] = left.get(parent, 0) + 1
        for parent, count in left.items():
            # what is left of a directory being reclaimed stays counted: the next record
            # scans exactly that many entries (never past its range, into tombstones)
            inode = txn.get(keys.inode_key(parent)) if parent not in removed_inos else None
            if inode is not None and inode.type == DIR:
                inode = inode.replace(children=max(0, (inode.children or 0) - count))
                txn.put(keys.inode_key(parent), inode)
        for ino in self.uc:
            txn.delete(keys.uc_key(ino))
        for ino, kind in self.inodes:
            txn.delete(keys.inode_key(ino))
            if kind == DIR:
                st.add_counter(counters, keys.DIRS, -1)
            elif kind == FILE:
                txn.delete(keys.inline_key(ino))   # a no-op for a file with blocks
                st.add_counter(counters, keys.FILES, -1)
        if self.done:
            txn.delete(keys.orphan_key(self.root))
        # the reclaim cursors follow the record itself (``ReclaimPlanner.note_reclaimed``)
        return Effect(removed_blocks=tuple(removed_blocks), removed_uc=tuple(self.uc))

    def check(self, view):
        if not isinstance(self.root, int) or view.get(keys.orphan_key(self.root)) is None:
            view.problem(f"inode {self.root} is not a detached subtree root")


@register
class Rename(Op):
    """Move an entry (rename2; ``overwrite``: the inode the destination named, removed or
    detached). ``usage``/``overwritten_usage``: [names, space] when quota folders are near."""
    NAME = "RENAME"
    lazy = True
    src_parent: int
    src_name: str
    dst_parent: int
    dst_name: str
    ino: int
    overwrite: int | None
    detach: bool = ABSENT
    time: int
    usage: list | None = ABSENT
    overwritten_usage: list | None = ABSENT

    def apply(self, txn, counters):
        effects = st.EffectBuilder()
        t = self.time
        ino = self.ino
        if self.overwrite is not None:
            st.unlink(txn, counters, self.dst_parent, self.dst_name, self.overwrite, t,
                      effects, detach=given(self.detach, False),
                      usage=given(self.overwritten_usage))
        moved = given(self.usage)
        if moved:
            st.charge_usage(txn, counters, self.src_parent, -moved[0], -moved[1])
        inode = txn.get(keys.inode_key(ino))
        txn.delete(keys.dentry_key(self.src_parent, self.src_name))
        st.touch_dir(txn, self.src_parent, t, -1, inode)
        txn.put(keys.dentry_key(self.dst_parent, self.dst_name), ino)
        st.touch_dir(txn, self.dst_parent, t, +1, inode)
        if inode is not None:
            inode = inode.replace(parent=self.dst_parent, name=self.dst_name, ctime=t)
            txn.put(keys.inode_key(ino), inode)
        if moved:
            st.charge_usage(txn, counters, self.dst_parent, moved[0], moved[1])
        return effects.effect()

    def check(self, view):
        view.rename(self)


@register
class Renames(Op):
    """Several renames visible at once (a job commit), applied and checked in order."""
    NAME = "RENAMES"
    lazy = True
    renames: tuple      # of Rename
    time: int

    @classmethod
    def from_args(cls, args):
        if "renames" in args:
            args = {**args, "renames": tuple(Rename.from_args(one) for one in args["renames"])}
        return super().from_args(args)

    def to_args(self):
        args = super().to_args()
        args["renames"] = [one.to_args() for one in self.renames]
        return args

    def apply(self, txn, counters):
        effects = st.EffectBuilder()
        for one in self.renames:
            effects.add(one.apply(txn, counters))
        return effects.effect()

    def check(self, view):
        for one in self.renames:
            view.rename(one)


class _InodeOp(Op):
    """Replay check of the set* ops: the inode exists."""

    def check(self, view):
        if view.inode(self.ino) is None:
            view.problem(f"inode {self.ino} does not exist")


@register
class SetPermissions(_InodeOp):
    NAME = "SET_PERMISSIONS"
    lazy = True
    ino: int
    mode: int
    time: int

    def apply(self, txn, counters):
        st.update_inode(txn, self.ino, mode=self.mode, ctime=self.time)


@register
class SetOwner(_InodeOp):
    NAME = "SET_OWNER"
    lazy = True
    ino: int
    owner: str | None = ABSENT
    group: str | None = ABSENT
    time: int

    def apply(self, txn, counters):
        changes = {"ctime": self.time}
        if given(self.owner) is not None:
            changes["owner"] = self.owner
        if given(self.group) is not None:
            changes["group"] = self.group
        st.update_inode(txn, self.ino, **changes)


@register
class Times(_InodeOp):
    NAME = "TIMES"
    lazy = True
    ino: int
    mtime: int | None = ABSENT
    atime: int | None = ABSENT
    time: int

    def apply(self, txn, counters):
        changes = {"ctime": self.time}
        if given(self.mtime) is not None:
            changes["mtime"] = self.mtime
        if given(self.atime) is not None:
            changes["atime"] = self.atime
        st.update_inode(txn, self.ino, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConcatEffect(Effect):
    """CONCAT's: the sources' blocks now the target's (``moved``: (block id, new index))
    and the target's replication, which they take."""
    moved: tuple[tuple[int, int], ...] = ()
    replication: int = 1


@register
class Concat(Op):
    """The sources' blocks become the target's next ones, in order; the sources go
    (``srcs``: dicts ino, name, all in folder ``parent``)."""
    NAME = "CONCAT"
    target: int
    parent: int
    srcs: list
    time: int

    def apply(self, txn, counters):
        t_ino, t = self.target, self.time
        target = st.file_inode(txn, t_ino)
        if target is None:
            return ConcatEffect()
        rep = target.replication or 1
        before = file_charge(txn.get, t_ino, target)
        index = target.nblocks or 0
        moved = []
        removed_inos = []
        for src in self.srcs:
            s_ino = src["ino"]
            inode = st.file_inode(txn, s_ino)
            if inode is None:
                continue
            before += file_charge(txn.get, s_ino, inode)
            for key, block in txn.scan(keys.block_prefix(s_ino)):
                txn.delete(key)
                txn.put(keys.block_key(t_ino, index), block)
                moved.append((block["id"], index))
                index += 1
            target = target.replace(length=(target.length or 0) + (inode.length or 0))
            txn.delete(keys.inode_key(s_ino))
            txn.delete(keys.dentry_key(self.parent, src["name"]))
            st.touch_dir(txn, self.parent, t, -1, inode)
            st.add_counter(counters, keys.FILES, -1)
            removed_inos.append(s_ino)
        target = target.replace(nblocks=index, mtime=t, ctime=t)
        txn.put(keys.inode_key(t_ino), target)
        st.charge_usage(txn, counters, self.parent, -len(removed_inos),
                        file_charge(txn.get, t_ino, target) - before)
        return ConcatEffect(moved=tuple(moved), replication=rep)

    def apply_memory(self, state, effect: ConcatEffect, now):
        for block_id, index in effect.moved:
            info = state.blocks.get(block_id)
            if info is not None:   # a block keeps its id, so replicas stay where they are
                info.ino, info.index = self.target, index
                state.blocks.set_replication(block_id, effect.replication)

    def check(self, view):
        for ino in [self.target] + [src.get("ino") for src in self.srcs]:
            inode = view.inode(ino)
            if inode is None or inode.type != FILE or inode.uc \
                    or inode.parent != self.parent:
                view.problem(f"concat: inode {ino} is not a closed file of folder "
                             f"{self.parent}")


@register
class SetQuota(Op):
    """A folder's quotas (``ns``/``ds``, -1: none); ``usage``: [names, space] of its
    subtree, counted by the planner, for a folder that had no quota."""
    NAME = "SET_QUOTA"
    ino: int
    ns: int
    ds: int
    usage: list | None
    time: int

    def apply(self, txn, counters):
        inode = txn.get(keys.inode_key(self.ino))
        if inode is None or inode.type != DIR:
            log.error("apply SET_QUOTA: directory inode %d is missing", self.ino)
            return None
        old = inode.quota
        quota = None
        if self.ns >= 0 or self.ds >= 0:
            # a folder that had a quota kept its usage exact; a new one starts from the
            # planner's count of its subtree
            names, space = (old.ns_used, old.ds_used) if old else self.usage
            quota = Quota(self.ns, self.ds, names, space)
        inode = inode.replace(quota=quota, ctime=self.time)
        txn.put(keys.inode_key(self.ino), inode)
        st.add_counter(counters, keys.QUOTA_DIRS, (inode.quota is not None) - (old is not None))

    def check(self, view):
        inode = view.inode(self.ino)
        if inode is None or inode.type != DIR or not view.linked(self.ino):
            view.problem(f"inode {self.ino} is not a linked directory")
        elif inode.quota is None and (self.ns >= 0 or self.ds >= 0) \
                and self.usage is None:
            view.problem(f"a new quota of inode {self.ino} without its usage")
