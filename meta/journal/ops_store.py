"""The store side of journal ops: ``Txn``, a batch's view of the namespace store, and the
helpers the ops' ``apply`` (``meta.journal.ops_*``) change it with.

Why it exists: every op applies through the same few steps (link an inode and charge the
quota folders above it, unlink or detach a subtree, write a block key and keep the inode's
length in step, ...); they are here once, apart from the per-op code, and ``Txn`` is also
the replay checker's view (``meta.namespace.invariants``), which re-checks records against the same
batch view.

Concurrency contract: trio thread only, no awaits; deterministic from the records and the
store before them. Nothing here writes the store: ``Txn.commit`` (called once per batch by
``Namespace.apply``) does.
"""

from __future__ import annotations

import bisect
import itertools
import logging

from ..schema import keys
from ..schema.inode import DIR, FILE, Inode, UnderConstruction
from .opbase import Effect
from .charge import file_charge

log = logging.getLogger(__name__)

#: a "no such directory entry" in the namespace cache (``DecodedCache``), which ``Txn.get``
#: reads through (never a stored value: entries hold inode numbers)
ABSENT = object()


class Txn:
    """A batch's view of the store: reads see the batch's own earlier writes.

    ``puts`` is a plain dict (a live batch is a few small records; keeping it sorted on
    every put cost more than the rest of the overlay); the sorted key list the rare
    ``scan`` needs is built on demand and kept until a new key is put.

    With ``cache`` (the namespace's ``DecodedCache``, live apply) an inode or entry it holds
    is read from there instead of a LevelDB get + decode (a create read its parent and a
    complete its file that way, dearer as the store grows), shared as it is: an ``Inode``
    is immutable, the appliers put a changed copy (``replace``)."""

    __slots__ = ("kv", "puts", "dels", "_order", "_cached")

    def __init__(self, kv, cache=None):
        self.kv = kv
        self.puts: dict[bytes, object] = {}   # key -> decoded value
        self.dels: set[bytes] = set()
        self._order: list[bytes] | None = None   # sorted keys of ``puts`` (may hold popped ones)
        self._cached: dict | None = cache.data if cache is not None else None

    def get(self, key: bytes):
        value = self.puts.get(key)
        if value is not None:
            return value
        if key in self.dels:
            return None
        if self._cached is not None:
            value = self._cached.get(key)
            if value is not None:
                return None if value is ABSENT else value
        raw = self.kv.get(key)
        return None if raw is None else keys.unpack_value(key, raw)

    def put(self, key: bytes, value) -> None:
        if key not in self.puts:
            self._order = None
        self.puts[key] = value
        self.dels.discard(key)

    def delete(self, key: bytes) -> None:
        self.puts.pop(key, None)
        self.dels.add(key)

    def put_keys(self, prefix: bytes) -> list[bytes]:
        """The keys put in this batch that start with ``prefix``, in key order."""
        order = self._order
        if order is None:
            order = self._order = sorted(self.puts)
        puts = self.puts
        found = []
        for key in itertools.islice(order, bisect.bisect_left(order, prefix), None):
            if not key.startswith(prefix):
                break
            if key in puts:
                found.append(key)
        return found

    def scan(self, prefix: bytes) -> list[tuple[bytes, object]]:
        merged = {k: v for k, v in self.kv.scan(prefix) if k not in self.dels}
        merged = {k: keys.unpack_value(k, v) for k, v in merged.items() if k not in self.puts}
        for key in self.put_keys(prefix):
            merged[key] = self.puts[key]
        return sorted(merged.items())

    def commit(self) -> None:
        pack = keys.pack
        self.kv.write(puts=[(k, pack(v)) for k, v in self.puts.items()],
                      deletes=list(self.dels))


def inside(view: Txn, ino: int, root: int) -> bool:
    """Is ``ino`` at or below ``root`` by parent pointers in a batch view (``ino`` itself
    included)? Used by apply (open files inside a detached subtree) and by the replay
    checker (a rename into its own subtree)."""
    for _ in range(10_000):
        if ino == root:
            return True
        if ino in (0, keys.ROOT_INO):
            return False
        inode = view.get(keys.inode_key(ino))
        if inode is None:
            return False
        ino = inode.parent
    return False


# ---------------------------------------------------------------------------- helpers
class EffectBuilder:
    """An op's ``Effect`` while it applies: the helpers below add what they removed or
    detached; ``effect`` freezes it."""

    __slots__ = ("removed_blocks", "removed_uc", "orphan")

    def __init__(self) -> None:
        self.removed_blocks: list[int] = []
        self.removed_uc: list[int] = []
        self.orphan: int | None = None

    def add(self, effect: Effect | None) -> None:
        """Take in the effect of a part applied on its own (one of RENAMES, a CLOSE)."""
        if effect is not None:
            self.removed_blocks.extend(effect.removed_blocks)
            self.removed_uc.extend(effect.removed_uc)
            if effect.orphan is not None:
                self.orphan = effect.orphan

    def effect(self, cls: type[Effect] = Effect, **fields) -> Effect:
        """The frozen effect: an ``Effect``, or the op's own subclass with its ``fields``."""
        return cls(removed_blocks=tuple(self.removed_blocks),
                   removed_uc=tuple(self.removed_uc), orphan=self.orphan, **fields)


def bump(counters, name: str, used: int) -> None:
    """Counters stay above every used id (``next_*``) / at the largest stamp."""
    if name == keys.GENSTAMP:
        counters[name] = max(int(counters.get(name, 0)), used)
    else:
        counters[name] = max(int(counters.get(name, 0)), used + 1)


def add_counter(counters, name: str, delta: int) -> None:
    counters[name] = int(counters.get(name, 0)) + delta


def charge_usage(txn: Txn, counters, ino: int, names: int, space: int) -> None:
    """Add ``names``/``space`` to the usage of every quota folder at and above ``ino``."""
    if not (names or space) or not counters.get(keys.QUOTA_DIRS):
        return
    for _ in range(10_000):
        if not ino:
            return
        inode = txn.get(keys.inode_key(ino))
        if inode is None:
            return
        if inode.quota is not None:
            inode = inode.replace(quota=inode.quota.charged(names, space))
            txn.put(keys.inode_key(ino), inode)
        ino = inode.parent


def touch_dir(txn: Txn, ino: int, time: int, children_delta: int,
              child: Inode | None) -> None:
    """A directory gained (+1) or lost (-1) the entry of ``child``: its entry count and,
    for a directory child, its subdirectory count (its link count is 2 + subdirs)."""
    inode = txn.get(keys.inode_key(ino))
    if inode is None:
        log.error("apply: parent directory inode %d is missing", ino)
        return
    subdirs = inode.subdirs
    if child is not None and child.type == DIR:
        if subdirs is not None:
            subdirs += children_delta
        else:   # stored before directories counted them: count once (the batch
            # already holds the entry change, so the count is the new one)
            subdirs = sum(1 for _, c in txn.scan(keys.dentry_prefix(ino))
                          if getattr(txn.get(keys.inode_key(c)), "type", None) == DIR)
    inode = inode.replace(children=(inode.children or 0) + children_delta, subdirs=subdirs,
                          mtime=time, ctime=time)
    txn.put(keys.inode_key(ino), inode)


def link(txn: Txn, counters, parent: int, name: str, ino: int, inode: Inode,
         time: int) -> None:
    txn.put(keys.inode_key(ino), inode)
    txn.put(keys.dentry_key(parent, name), ino)
    touch_dir(txn, parent, time, +1, inode)
    charge_usage(txn, counters, parent, 1, file_charge(txn.get, ino, inode))
    bump(counters, keys.NEXT_INO, ino)
    if inode.type == DIR:
        add_counter(counters, keys.DIRS, 1)
    elif inode.type == FILE:
        add_counter(counters, keys.FILES, 1)


def mkdirs(txn: Txn, counters, dirs, time: int) -> None:
    for d in dirs:
        inode = Inode(DIR, d["mode"], d["owner"], d["group"], time, time, time, d["parent"],
                      d["name"], children=0, subdirs=0)
        link(txn, counters, d["parent"], d["name"], d["ino"], inode, time)


def remove_subtree(txn: Txn, counters, ino: int,
                   effects: EffectBuilder) -> tuple[int, int]:
    """Remove ``ino`` and everything below it (not its own dentry); returns the names
    and space it held (for the quota folders above)."""
    removed_blocks = effects.removed_blocks
    removed_uc = effects.removed_uc
    stack = [ino]
    names = space = 0
    while stack:
        cur = stack.pop()
        inode = txn.get(keys.inode_key(cur))
        if inode is None:
            log.error("apply: inode %d to remove is missing", cur)
            continue
        names += 1
        if inode.type == DIR:
            if inode.children != 0:   # an empty folder needs no scan
                for key, child in txn.scan(keys.dentry_prefix(cur)):
                    stack.append(child)
                    txn.delete(key)
            add_counter(counters, keys.DIRS, -1)
        elif inode.type == FILE:
            space += file_charge(txn.get, cur, inode)
            removed_blocks.extend(delete_blocks(txn, cur, inode))
            if inode.uc:
                txn.delete(keys.uc_key(cur))
                removed_uc.append(cur)
            if inode.inline is not None:
                txn.delete(keys.inline_key(cur))
            add_counter(counters, keys.FILES, -1)
        txn.delete(keys.inode_key(cur))
    return names, space


def unlink(txn: Txn, counters, parent: int, name: str, ino: int, time: int,
           effects: EffectBuilder, detach: bool = False, usage=None) -> None:
    """``usage``: what a detached subtree held, measured by the planner (None when no
    quota folder is above it); a removed one is measured here."""
    key = keys.dentry_key(parent, name)
    current = txn.get(key)
    if current != ino:
        log.error("apply: entry %r in %d is %r, expected %d", name, parent, current, ino)
    txn.delete(key)
    touch_dir(txn, parent, time, -1, txn.get(keys.inode_key(ino)))
    if detach:
        detach_subtree(txn, parent, name, ino, time, effects)
        names, space = usage or (0, 0)
    else:
        names, space = remove_subtree(txn, counters, ino, effects)
    charge_usage(txn, counters, parent, -names, -space)


def detach_subtree(txn: Txn, parent: int, name: str, ino: int, time: int,
                   effects: EffectBuilder) -> None:
    """Make ``ino`` (its entry already removed) the root of an orphan subtree for the
    reclaimer; files under construction inside lose their lease now (few ``U`` keys)."""
    inode = txn.get(keys.inode_key(ino))
    if inode is None:
        log.error("apply: inode %d to detach is missing", ino)
        return
    removed_uc = effects.removed_uc
    for key, _holder in txn.scan(keys.UNDER_CONSTRUCTION):
        uc_ino = keys.parse_uc_key(key)
        if inside(txn, uc_ino, ino):
            txn.delete(key)
            removed_uc.append(uc_ino)
    inode = inode.replace(parent=0)
    txn.put(keys.inode_key(ino), inode)
    txn.put(keys.orphan_key(ino), {"parent": parent, "name": name, "time": time})
    effects.orphan = ino


def file_inode(txn: Txn, ino: int) -> Inode | None:
    inode = txn.get(keys.inode_key(ino))
    if inode is None or inode.type != FILE:
        log.error("apply: file inode %d is missing", ino)
        return None
    return inode


def set_block(txn: Txn, counters, ino: int, inode: Inode, index: int,
              block: dict) -> Inode:
    """Write one block key; returns the inode with its length and block count in step (for
    the caller to put). A file whose data is inline (reopened by append) keeps it, and its
    length, until its first block holds at least as many bytes (the writer sends the
    inline bytes first)."""
    key = keys.block_key(ino, index)
    old = txn.get(key)
    if inode.inline is not None:
        if block["num_bytes"] >= inode.inline:
            inode = drop_inline(txn, ino, inode).replace(length=block["num_bytes"])
    else:
        inode = inode.replace(length=(inode.length or 0) - (old["num_bytes"] if old else 0)
                              + block["num_bytes"])
    inode = inode.replace(nblocks=max(inode.nblocks or 0, index + 1))
    stored = {"id": block["id"], "gs": block["gs"], "num_bytes": block["num_bytes"],
              "state": block["state"]}
    # a pending patch stamp (PATCH_BEGIN) outlives other changes of its block, as the
    # blocks map keeps it: only a ``patch_gs`` the caller names (0 when PATCH_BLOCK or
    # PATCH_DROP ends the patch) replaces it
    patch_gs = block.get("patch_gs", old.get("patch_gs") if old else None)
    if patch_gs and old is not None and old["id"] == block["id"]:
        stored["patch_gs"] = patch_gs
    txn.put(key, stored)
    bump(counters, keys.NEXT_BLOCK_ID, block["id"])
    bump(counters, keys.GENSTAMP, block["gs"])
    return inode


def delete_blocks(txn: Txn, ino: int, inode: Inode) -> list[int]:
    """Delete every block key of file ``ino``; returns the block ids. A file without
    blocks (inline or empty) is not scanned: LevelDB would walk tombstones past its
    empty range up to the next live key."""
    removed = []
    if inode.nblocks != 0:
        for key, block in txn.scan(keys.block_prefix(ino)):
            removed.append(block["id"])
            txn.delete(key)
    return removed


def drop_inline(txn: Txn, ino: int, inode: Inode) -> Inode:
    """Returns the inode without its inline data (for the caller to put)."""
    txn.delete(keys.inline_key(ino))
    return inode.replace(inline=None)


def store_inline(txn: Txn, ino: int, inode: Inode, data: bytes) -> list[int]:
    """The file's content becomes ``data``, kept in the namespace; its blocks (at most
    the unused first block ``create`` allocated) go. Puts the changed inode; returns the
    removed blocks' ids."""
    removed = delete_blocks(txn, ino, inode)
    txn.put(keys.inline_key(ino), bytes(data))
    txn.put(keys.inode_key(ino), inode.replace(inline=len(data), length=len(data), nblocks=0))
    return removed


def update_inode(txn: Txn, ino: int, **changes) -> Inode | None:
    inode = txn.get(keys.inode_key(ino))
    if inode is None:
        log.error("apply: inode %d is missing", ino)
        return None
    inode = inode.replace(**changes)
    txn.put(keys.inode_key(ino), inode)
    return inode


def set_uc(txn: Txn, ino: int, inode: Inode, holder: str, client_machine: str) -> Inode:
    """Returns the inode under construction for ``holder`` (for the caller to put)."""
    txn.put(keys.uc_key(ino), holder)
    return inode.replace(uc=UnderConstruction(holder, client_machine))
