"""Deleting a big subtree in bounded steps: whether a delete must detach (``needs_detach``),
the orphan roots and reclaim cursors, and ``plan_reclaim``'s post-order walk.

Deletion (HDFS incremental block deletion). ``apply`` runs on the server's only thread, so
one record must never remove an unbounded subtree. A subtree of at most ``delete_chunk``
entries (inodes + blocks; the planner walks at most that many to find out) goes in the
DELETE record itself. A bigger one is only *detached* (``detach: true`` in DELETE, and in
ADD/RENAME for an overwritten file): its entry goes, the parent is updated, the root's inode
gets ``parent`` 0 and an ``O<ino>`` key, and the leases of open files inside end (their
``U`` keys, found by walking each ``U`` key's parent chain). The path is gone at once;
nothing can reach the subtree any more (``linked_inode`` refuses writers addressing a file
inside by inode id). ``plan_reclaim`` then walks an orphan subtree in post-order and lists
at most ``delete_chunk`` keys; its RECLAIM record removes exactly those keys (and the ``O``
key with the root's last piece), so every record is bounded and replay is exact.

A RECLAIM record costs what it removes, however big the subtree and however many records
came before it: LevelDB leaves a removed key as a tombstone until compaction, and an
iterator that finds no live key where it starts walks every tombstone after it, so the
walk never scans where it may find nothing. A directory's remaining entries are counted by
its ``children`` (RECLAIM lowers it for the entries it removes) and scanned from the last
removed one with that limit; a file's blocks are read by index up to ``nblocks``, after the
ones removed already; the orphan roots are kept in memory. Without the cursors (after a
restart) the first record of a directory skips its tombstones once.


Why it exists: the detach/reclaim protocol (its cursors, its bound on every record's cost)
is one job, apart from the planners that ask ``needs_detach`` and the applier that
executes RECLAIM. ``ReclaimPlanner`` is a part of ``meta.namespace.namespace.Namespace``; it
owns the orphan set and the cursors (empty when built, ``load_orphans`` reads the ``O``
keys), which ``apply`` advances through ``note_orphan`` and ``note_reclaimed`` after its
store write.

Purity / concurrency contract: ``plan_reclaim`` and ``needs_detach`` only read the store;
the orphan set and cursors change only through the ``note_*`` calls, after the records
are durable and applied. Trio thread only, no awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedSet

from ..schema import keys
from ..schema.inode import DIR, FILE, Inode
from .args import Defaults
from .view import NamespaceView
from ..journal.ops_namespace import Reclaim


class ReclaimPlanner:
    """Detach decisions and RECLAIM planning: reads the store ``kv`` (orphan keys, block
    keys) and the inodes through ``view``; ``defaults.delete_chunk`` bounds every record."""

    def __init__(self, kv, view: NamespaceView, defaults: Defaults):
        """No orphans known and no cursors yet (``load_orphans`` reads the ``O`` keys)."""
        self.kv = kv
        self._view = view
        self.defaults = defaults
        # orphan dir ino → its greatest entry key a RECLAIM removed: every entry up to it is
        # gone, so the next scan starts after it instead of skipping LevelDB tombstones
        self._reclaimed_upto: dict[int, bytes] = {}
        # orphan file ino → how many of its first blocks RECLAIM records removed
        self._blocks_reclaimed: dict[int, int] = {}
        self._orphans: SortedSet = SortedSet()   # roots of detached subtrees (``O`` keys)

    def load_orphans(self) -> None:
        """(Re)read the roots of the detached subtrees from the store."""
        self._orphans = SortedSet(keys.parse_orphan_key(k) for k, _ in self.kv.scan(keys.ORPHAN))

    def note_orphan(self, ino: int) -> None:
        """``apply`` wrote the ``O`` key of a detached subtree rooted at ``ino``."""
        self._orphans.add(ino)

    def needs_detach(self, ino: int, inode: Inode) -> bool:
        """More than ``delete_chunk`` entries (inodes + blocks) at and under ``ino``? Reads
        at most that many inodes to find out (a file's blocks are counted by ``nblocks``)."""
        limit = max(1, self.defaults.delete_chunk)
        count = 0
        stack = [(ino, inode)]
        while stack:
            cur, node = stack.pop()
            count += 1 + ((node.nblocks or 0) if node.type == FILE else 0)
            if count > limit:
                return True
            if node.type != DIR or node.children == 0:
                continue   # an empty folder: no scan (it would walk tombstones past it)
            for _, child in self._view.children(cur):
                child_inode = self._view.get_inode(child)
                if child_inode is not None:
                    stack.append((child, child_inode))
                if count + len(stack) > limit:   # every stacked inode counts at least 1
                    return True
        return False

    # ------------------------------------------------------------------ reclaiming
    def has_orphans(self) -> bool:
        """Is a detached subtree waiting to be reclaimed?"""
        return bool(self._orphans)

    def orphan_roots(self) -> list[int]:
        return list(self._orphans)

    def _post_order(self, root: int) -> Iterator[tuple]:
        """The keys of the detached subtree at ``root``, children before their directory and
        a file's blocks before the file: ``("B", ino, index, block_id)``, ``("D", parent,
        name)`` for an entry pointing to no inode, ``("I", ino, type, parent, name, uc)``
        (``parent`` None for the root, whose entry went with the detach). Lazy: the caller
        stops after its budget, so only what it takes (plus one) is read."""
        root_inode = self._view.get_inode(root)
        if root_inode is None:
            return
        stack = [(root, root_inode, None, None,
                  self._remaining_children(root, root_inode)
                  if root_inode.type == DIR else None)]
        while stack:
            ino, inode, parent, name, entries = stack[-1]
            nxt = next(entries, None) if entries is not None else None
            if nxt is not None:
                child_name, child = nxt
                child_inode = self._view.get_inode(child)
                if child_inode is None:
                    yield ("D", ino, child_name)
                else:
                    stack.append((child, child_inode, ino, child_name,
                                  self._remaining_children(child, child_inode)
                                  if child_inode.type == DIR else None))
                continue
            stack.pop()
            if inode.type == FILE:
                for index in range(self._blocks_reclaimed.get(ino, 0), (inode.nblocks or 0)):
                    raw = self.kv.get(keys.block_key(ino, index))
                    if raw is not None:
                        yield ("B", ino, index, keys.unpack(raw)["id"])
            yield ("I", ino, inode.type, parent, name, bool(inode.uc))

    def _remaining_children(self, ino: int, inode: Inode) -> Iterator[tuple[str, int]]:
        left = (inode.children or 0)
        if left <= 0:    # nothing to find: never seek into the tombstones after the range
            return
        upto = self._reclaimed_upto.get(ino)
        start = upto + b"\x00" if upto is not None else None
        for key, raw in self.kv.scan(keys.dentry_prefix(ino), start=start, limit=left):
            yield keys.parse_dentry_key(key)[1], keys.unpack(raw)

    def plan_reclaim(self, budget: int | None = None, *,
                     stop=None) -> Reclaim | None:
        """The next RECLAIM record: at most ``budget`` (default ``delete_chunk``) keys of the
        first orphan subtree, in post-order, so what is left stays a tree hanging from the
        ``O`` key; ``done`` when the root is among them. None when nothing is detached.
        ``stop()`` (asked every few keys) ends the record early when it returns True: the
        caller's bound on how long planning, and so applying, the record may take."""
        if not self._orphans:
            return None
        root = self._orphans[0]
        budget = max(1, budget if budget is not None else self.defaults.delete_chunk)
        blocks: list[list] = []
        inodes: list[list] = []
        entries: list[list] = []
        uc: list[int] = []
        taken = 0
        done = True
        for item in self._post_order(root):
            if taken >= budget or (stop is not None and taken and not taken % 32 and stop()):
                done = False
                break
            taken += 1
            if item[0] == "B":
                blocks.append([item[1], item[2], item[3]])
            elif item[0] == "D":
                entries.append([item[1], item[2]])
            else:
                _, ino, kind, parent, name, is_uc = item
                inodes.append([ino, kind])
                if parent is not None:
                    entries.append([parent, name])
                if is_uc and self.kv.get(keys.uc_key(ino)) is not None:
                    uc.append(ino)
        return Reclaim(root=root, blocks=blocks, inodes=inodes, entries=entries, uc=uc,
                       done=done)

    def note_reclaimed(self, record: Reclaim) -> None:
        """Move the reclaim cursors past what an applied RECLAIM record removed."""
        for parent, name in record.entries:
            key = keys.dentry_key(parent, name)
            if key > self._reclaimed_upto.get(parent, b""):
                self._reclaimed_upto[parent] = key
        for ino, index, _ in record.blocks:
            if index >= self._blocks_reclaimed.get(ino, 0):
                self._blocks_reclaimed[ino] = index + 1
        for ino, _ in record.inodes:
            self._reclaimed_upto.pop(ino, None)
            self._blocks_reclaimed.pop(ino, None)
        if record.done:
            self._orphans.discard(record.root)
