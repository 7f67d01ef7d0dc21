"""The namespace's read view: the decoded inode/dentry cache, the counters as stored, path
walking and resolution, file status and listing, subtree and block-list reads.

Why it exists: the planners (``plan``, ``rename``, ``reclaim``, ``quota``, ``concat``) and
the RPC handlers all decide from the same view of the store; ``NamespaceView`` is that
view, a part of ``meta.namespace.namespace.Namespace`` built over its store and cache. The
applier gives it the counters it wrote (``adopt_counters``) and updates the cache.

Purity / concurrency contract: reads only — never writes the store; the counters change
only by ``adopt_counters`` (the owner's ``load``, the applier after its write); the cache
is filled on reads and updated only by ``apply`` with what it wrote.
Trio thread only (the cache and counters are unlocked), no awaits; the store's small sync
calls are its only I/O. Inodes come as ``meta.schema.inode.Inode`` records, shared with
the cache (they are immutable).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from fs import paths
from fs.errors import FileNotFound, InternalError, InvalidArgument, NotDirectory

from ..journal.ops_dirleases import stored_inos
from ..journal.ops_store import ABSENT
from ..leases.dirleases import StoredLease
from ..schema import keys
from ..schema.inode import DIR, FILE, SYMLINK, Inode
from .args import MAX_LIST_LIMIT, check_int

log = logging.getLogger(__name__)

#: directory entries ``iter_subtree`` reads per store scan
SUBTREE_PAGE = 256


class ContentSummary:
    """Totals of a subtree for ``content_summary``: fed one inode at a time, so a caller
    walking a big tree can yield between inodes."""

    __slots__ = ("length", "files", "dirs", "space")

    def __init__(self):
        self.length = self.files = self.dirs = self.space = 0

    def add(self, node: Inode, space: int | None = None) -> None:
        """``space``: the file's quota charge (``charge.file_charge``), which
        counts a block being written at its full size; default its length × replication."""
        if node.type == DIR:
            self.dirs += 1
        elif node.type == FILE:
            self.files += 1
            length = node.length or 0
            self.length += length
            self.space += length * (node.replication or 1) if space is None else space

    def as_dict(self) -> dict:
        return {"length": self.length, "file_count": self.files,
                "directory_count": self.dirs, "space_consumed": self.space}


class DecodedCache:
    """Decoded inodes and directory entries by store key (HDFS keeps its whole namespace in
    memory; every RPC walks its path, and a LevelDB get + msgpack decode per component was
    most of a getFileInfo). Filled on reads, updated by ``apply`` with exactly the values it
    wrote, dropped for deleted keys. A directory entry found missing is kept too (``ABSENT``):
    a create looks its new name up several times (lock depth before and after the wait,
    the handler, the planner), and a LevelDB miss is the dearest read there is (it visits
    every level that may hold the key); ``apply``'s put replaces it. Inodes are kept as
    ``Inode`` records, immutable, so readers and ``meta.journal.ops_store.Txn`` share them.
    Bounded: past ``limit`` entries the oldest
    ``1/EVICT_FRACTION`` is dropped (a bounded pause: dropping half of a million entries
    at once held the trio thread for ~0.1 s)."""

    __slots__ = ("data", "limit", "hits", "misses", "walks", "paths")
    EVICT_FRACTION = 8
    #: at most this many remembered walks between two applied batches
    WALK_LIMIT = 4096

    def __init__(self, limit: int):
        self.data: dict[bytes, object] = {}
        self.limit = max(0, limit)
        self.hits = self.misses = 0
        #: ``walk`` results since the last applied batch, by (components, strict): a create
        #: walks its path four times (lock depth before and after the wait, handler,
        #: planner) and nothing can change the namespace between two applies
        self.walks: dict[tuple, list] = {}
        #: ``path_of`` results since the last applied batch (addBlock, complete: twice each)
        self.paths: dict[int, str | None] = {}

    def clear(self) -> None:
        self.data.clear()
        self.forget_walks()

    def forget_walks(self) -> None:
        self.walks.clear()
        self.paths.clear()

    def put(self, key: bytes, value) -> None:
        if self.limit == 0:
            return
        data = self.data
        if len(data) >= self.limit and key not in data:
            for old in list(itertools.islice(data, max(1, self.limit // self.EVICT_FRACTION))):
                del data[old]
        data[key] = value

    def committed(self, puts, dels) -> None:
        self.forget_walks()
        data = self.data
        for key in dels:
            data.pop(key, None)
        for key, value in puts.items():
            if key[:1] in CACHED_KINDS:
                self.put(key, value)


CACHED_KINDS = (keys.INODE, keys.DENTRY)


class NamespaceView:
    """Reads of the namespace: the store ``kv`` through the decoded ``cache``, and the
    counters as stored (``adopt_counters``)."""

    def __init__(self, kv, cache: DecodedCache):
        self.kv = kv
        self.cache = cache
        self.counters: dict[str, int | bytes] = {}

    # ------------------------------------------------------------------ counters
    def adopt_counters(self, counters: dict) -> None:
        """``counters`` are the stored ones now (read at load, or just written by
        ``apply``)."""
        self.counters = counters

    @property
    def formatted(self) -> bool:
        return keys.NAMESPACE_ID in self.counters

    @property
    def namespace_id(self) -> int:
        return int(self.counters.get(keys.NAMESPACE_ID, 0))

    @property
    def applied_txid(self) -> int:
        return int(self.counters.get(keys.APPLIED_TXID, 0))

    def file_count(self) -> int:
        return int(self.counters.get(keys.FILES, 0))

    def dir_count(self) -> int:
        return int(self.counters.get(keys.DIRS, 0))

    def _require_formatted(self) -> None:
        if not self.formatted:
            raise InternalError("the namespace is not formatted yet")

    # ------------------------------------------------------------------ reads
    def _cached_get(self, key: bytes):
        cache = self.cache
        value = cache.data.get(key)
        if value is not None:
            cache.hits += 1
            return None if value is ABSENT else value
        cache.misses += 1
        raw = self.kv.get(key)
        if raw is None:
            if key[:1] == keys.DENTRY:
                cache.put(key, ABSENT)
            return None
        value = keys.unpack_value(key, raw)
        # only inodes and entries are shared through the cache: appliers change the other
        # kinds (block keys) in place on the batch's copy, which must not be a cached one
        if key[:1] in CACHED_KINDS:
            cache.put(key, value)
        return value

    def read(self, key: bytes):
        """One decoded key, through the cache for the kinds it keeps (read only: a cached
        value is shared)."""
        return self._cached_get(key)

    def get_inode(self, ino: int) -> Inode | None:
        """The inode record (shared with the cache)."""
        return self._cached_get(keys.inode_key(ino))

    def lookup(self, parent: int, name: str) -> int | None:
        return self._cached_get(keys.dentry_key(parent, name))

    def walk(self, parts, path: str = "", *, strict: bool = True) -> list[tuple[int, Inode]]:
        """``(ino, inode)`` of the root and of every existing leading component; stops at the
        first missing one. A non-directory with components after it → ``NotDirectory``
        (``strict=False``: the chain up to it, for the permission checker, which must see
        the inodes the caller would traverse before the namespace names the problem)."""
        memo_key = (tuple(parts), strict)
        walks = self.cache.walks
        found = walks.get(memo_key)
        if found is not None:
            return list(found)
        found = self._walk(parts, path, strict)
        if len(walks) >= DecodedCache.WALK_LIMIT:
            walks.clear()
        walks[memo_key] = found
        return list(found)

    def _walk(self, parts, path: str, strict: bool) -> list[tuple[int, Inode]]:
        self._require_formatted()
        root = self.get_inode(keys.ROOT_INO)
        found = [(keys.ROOT_INO, root)]
        for depth, name in enumerate(parts):
            ino, inode = found[-1]
            if inode.type != DIR:
                if not strict:
                    break
                prefix = paths.join_parts(parts[:depth])
                kind = "a symlink (the metadata server does not follow links)" \
                    if inode.type == SYMLINK else "not a directory"
                raise NotDirectory(f"{path or paths.join_parts(parts)}: {prefix} is {kind}")
            child = self.lookup(ino, name)
            if child is None:
                break
            child_inode = self.get_inode(child)
            if child_inode is None:   # a dangling entry would be a bug; treat as missing
                log.error("dentry %s in inode %d points to missing inode %d", name, ino, child)
                break
            found.append((child, child_inode))
        return found

    def existing_depth(self, path) -> int:
        """How many leading components of ``path`` exist (for LOCK_ANCESTOR); no errors
        except for an invalid path."""
        parts = paths.split(path)
        try:
            return len(self.walk(parts)) - 1
        except NotDirectory:
            return len(parts)

    def resolve(self, path) -> tuple[list[str], int, Inode, list[tuple[int, Inode]]]:
        """``(parts, ino, inode, found)`` of an existing path, else ``FileNotFound``."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        found = self.walk(parts, canonical)
        if len(found) != len(parts) + 1:
            missing = paths.join_parts(parts[:len(found)])
            raise FileNotFound(f"{canonical}: no such file or directory"
                               + (f" ({missing} does not exist)" if missing != canonical else ""))
        ino, inode = found[-1]
        return parts, ino, inode, found

    def path_of(self, ino: int) -> str | None:
        """The current path of an inode from its parent pointers (None if not linked)."""
        memo = self.cache.paths
        try:
            return memo[ino]
        except KeyError:
            pass
        except TypeError:   # not hashable: not an inode id (the lookup below says so)
            return self._path_of(ino)
        path = self._path_of(ino)
        if len(memo) >= DecodedCache.WALK_LIMIT:
            memo.clear()
        memo[ino] = path
        return path

    def _path_of(self, ino) -> str | None:
        names = []
        seen = 0
        while ino != keys.ROOT_INO:
            inode = self.get_inode(ino)
            if inode is None or seen > 10_000:
                return None
            names.append(inode.name)
            ino = inode.parent
            seen += 1
        return paths.join_parts(reversed(names))

    def linked_inode(self, ino: int) -> Inode | None:
        """The inode if it is reachable from the root, else None: a file inside a detached
        (deleted, not yet reclaimed) subtree is gone for writers addressing it by id.
        Reachable is what ``path_of`` (remembered until the next apply) finds: the same
        climb, and a writer's call asks twice (``closed_with``, ``writer_file``)."""
        if self.path_of(ino) is None:
            return None
        return self.get_inode(ino)

    def status(self, path: str, ino: int, inode: Inode) -> dict:
        kind = inode.type
        is_file = kind == FILE
        return {
            "name": inode.name,
            "path": path,
            "ino": ino,
            "type": kind,
            "mode": inode.mode,
            "owner": inode.owner,
            "group": inode.group,
            "mtime_ns": inode.mtime,
            "atime_ns": inode.atime,
            "ctime_ns": inode.ctime,
            "length": (inode.length or 0) if is_file else
            (len(keys.encode_name(inode.target)) if kind == SYMLINK else 0),
            "replication": (inode.replication or 0) if is_file else 0,
            "block_size": (inode.block_size or 0) if is_file else 0,
            "symlink": inode.target if kind == SYMLINK else None,
            "under_construction": bool(is_file and inode.uc),
            "children": (inode.children or 0) if kind == DIR else 0,
            "subdirs": (inode.subdirs or 0) if kind == DIR else 0,
            "parent": inode.parent,
            # a folder with a quota: {ns, ds, ns_used, ds_used} (-1 = none), for df
            "quota": inode.quota.to_wire() if kind == DIR and inode.quota is not None
            else None,
        }

    def get_file_info(self, path) -> dict:
        parts, ino, inode, _ = self.resolve(path)
        return self.status(paths.join_parts(parts), ino, inode)

    def changed(self, canonical: str, status: dict | None = None) -> dict:
        """The ``want_status`` answer of a namespace change at ``canonical``: the inode's
        status (``status`` when it is gone) and its parent directory's after the change,
        whose attributes a kernel drops after any change in it and asks for again."""
        return {"status": self.get_file_info(canonical) if status is None else status,
                "parent": self.get_file_info(paths.parent(canonical))}

    def list_status(self, path, start_after: str = "", limit: int = 1000) -> dict:
        parts, ino, inode, _ = self.resolve(path)
        canonical = paths.join_parts(parts)
        if not isinstance(start_after, str) or "\0" in start_after:
            raise InvalidArgument(f"list {canonical}: start_after must be a name string")
        check_int(limit, f"list {canonical}: limit", low=1)
        limit = min(limit, MAX_LIST_LIMIT)
        if inode.type != DIR:
            return {"entries": [self.status(canonical, ino, inode)], "has_more": False}
        prefix = keys.dentry_prefix(ino)
        start = keys.after_name(ino, start_after) if start_after else None
        entries = []
        has_more = False
        # an empty folder: no scan (LevelDB would walk tombstones up to the next live key)
        scan = self.kv.scan(prefix, start=start, limit=limit + 1) \
            if inode.children != 0 else ()
        for key, raw in scan:
            if len(entries) == limit:
                has_more = True
                break
            _, name = keys.parse_dentry_key(key)
            child = keys.unpack(raw)
            child_inode = self.get_inode(child)
            if child_inode is None:
                log.error("listing %s: entry %s points to missing inode %d", canonical, name, child)
                continue
            entries.append(self.status(paths.join(canonical, name), child, child_inode))
        return {"entries": entries, "has_more": has_more}

    def children(self, ino: int) -> Iterator[tuple[str, int]]:
        for key, raw in self.kv.scan(keys.dentry_prefix(ino)):
            yield keys.parse_dentry_key(key)[1], keys.unpack(raw)

    def iter_subtree(self, ino: int, inode: Inode) -> Iterator[tuple[int, Inode]]:
        """Every inode of the subtree rooted at ``ino`` (depth first, the root first). Lazy
        inside a folder too: its entries are read ``SUBTREE_PAGE`` at a time, so a caller
        that awaits between inodes (``TimeSlice``) never holds the trio thread for a whole
        folder of 100k entries. An entry is counted when its page is read (each at most
        once: pages follow the key order)."""
        yield ino, inode
        stack = [self._child_inodes(ino, inode)] if inode.type == DIR else []
        while stack:
            found = next(stack[-1], None)
            if found is None:
                stack.pop()
                continue
            yield found
            if found[1].type == DIR:
                stack.append(self._child_inodes(*found))

    def _child_inodes(self, ino: int, inode: Inode) -> Iterator[tuple[int, Inode]]:
        """``(ino, inode)`` of a folder's entries, a page of entries per store scan (a
        fresh iterator each: none stays open while the caller awaits)."""
        if inode.children == 0:   # never seek into the tombstones of an empty folder
            return
        prefix = keys.dentry_prefix(ino)
        start = None
        while True:
            page = list(self.kv.scan(prefix, start=start, limit=SUBTREE_PAGE))
            for _, raw in page:
                child = keys.unpack(raw)
                child_inode = self.get_inode(child)
                if child_inode is not None:
                    yield child, child_inode
            if len(page) < SUBTREE_PAGE:
                return
            start = page[-1][0] + b"\x00"     # the next key after the page's last name

    def inline_data(self, ino: int, inode: Inode) -> bytes | None:
        """The content of a file kept in the namespace (``inline``), else None."""
        if inode.inline is None:
            return None
        raw = self.kv.get(keys.inline_key(ino))
        return b"" if raw is None else keys.unpack(raw)

    def blocks_of(self, ino: int) -> list[dict]:
        """The file's blocks in order, each ``{index, id, gs, num_bytes, state}``.
        Reads every block key: for whole-file work only, never per write call."""
        out = []
        for key, raw in self.kv.scan(keys.block_prefix(ino)):
            block = keys.unpack(raw)
            block["index"] = keys.parse_block_key(key)[1]
            out.append(block)
        return out

    def tail_blocks(self, ino: int, inode: Inode, count: int = 2) -> list[dict]:
        """The file's last ``count`` blocks (fewer if it has fewer), read by key from the
        inode's ``nblocks``, so a writer's call costs the same at block 5 and block 50 000.
        Enough for every writer check: only the last block and a COMMITTED penultimate
        may be incomplete (ADD_BLOCK marks the block before ``previous`` COMPLETE)."""
        nblocks = (inode.nblocks or 0)
        out = []
        for index in range(max(0, nblocks - count), nblocks):
            raw = self.kv.get(keys.block_key(ino, index))
            if raw is None:
                raise InternalError(f"inode {ino}: block #{index} of {nblocks} is missing")
            block = keys.unpack(raw)
            block["index"] = index
            out.append(block)
        return out

    def blocks_in_range(self, ino: int, inode: Inode, offset: int,
                        end: float) -> list[tuple[dict, int]]:
        """``(block, file offset)`` of the blocks overlapping ``[offset, end)``, plus the
        last block of a file under construction if it starts before ``end`` (it grows).

        Blocks are at most ``block_size`` long; when the inode's length shows that every
        block before the last is exactly that long, the scan starts at the block holding
        ``offset`` (index arithmetic); otherwise (a short block in the middle) it starts at
        the first block. Either way it stops at ``end``."""
        nblocks = (inode.nblocks or 0)
        if nblocks == 0 or offset >= end and not inode.uc:
            return []
        last = self.tail_blocks(ino, inode, 1)[-1]
        block_size = inode.block_size
        first = 0
        if (inode.length or 0) - last["num_bytes"] == (nblocks - 1) * block_size:
            first = min(offset // block_size, nblocks - 1)
        growing = bool(inode.uc)
        out = []
        pos = first * block_size
        for key, raw in self.kv.scan(keys.block_prefix(ino), start=keys.block_key(ino, first)):
            if pos >= end:
                break
            block = keys.unpack(raw)
            index = block["index"] = keys.parse_block_key(key)[1]
            size = block["num_bytes"]
            if pos + size > offset or (growing and index == nblocks - 1):
                out.append((block, pos))
            pos += size
        return out

    def under_construction(self) -> dict[int, str]:
        """ino → lease holder of every file under construction (to rebuild leases)."""
        return {keys.parse_uc_key(k): keys.unpack(v)
                for k, v in self.kv.scan(keys.UNDER_CONSTRUCTION)}

    def delegation_tokens(self) -> list[dict]:
        """Every live delegation token's state (``fs.delegation.TokenState`` wire form)."""
        return [keys.unpack(v) for _, v in self.kv.scan(keys.DELEGATION_TOKEN)]

    def dir_leases(self) -> list[StoredLease]:
        """Every live directory lease with the inode ids it reserved (to rebuild the
        table)."""
        out = []
        for k, v in self.kv.scan(keys.DIR_LEASE):
            lease = keys.unpack(v)
            out.append(StoredLease(keys.parse_dir_lease_key(k), lease["holder"],
                                   lease["epoch"], stored_inos(lease),
                                   stored_inos(lease, "earlier_")))
        return out

    def lock_holders(self) -> list[str]:
        """The clients that may hold file locks (``LOCK_HOLDER`` records not gone)."""
        return [keys.parse_lock_holder_key(k) for k, _ in self.kv.scan(keys.LOCK_HOLDER)]

    def all_blocks(self) -> Iterator[tuple[int, int, dict, int]]:
        """``(ino, index, block, replication)`` of every block, to rebuild the blocks map."""
        replication = {}
        for key, raw in self.kv.scan(keys.BLOCK):
            ino, index = keys.parse_block_key(key)
            if ino not in replication:
                inode = self.get_inode(ino)
                replication[ino] = (inode.replication or 1) if inode else 1
            yield ino, index, keys.unpack(raw), replication[ino]

    # ------------------------------------------------------------------ summaries
    def content_summary_of(self, ino: int, inode: Inode) -> dict:
        summary = ContentSummary()
        for _, node in self.iter_subtree(ino, inode):
            summary.add(node)
        return summary.as_dict()
