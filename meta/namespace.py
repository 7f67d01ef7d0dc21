"""The inode-based namespace over the KV store: path resolution, validation, and the
``apply`` of every journal op.

Why it exists: it is the filesystem's meaning, kept apart from the RPC shell, so the
conformance suite drives it directly over both KV stores. Every mutation is split in two:

1. ``plan_<op>(...)`` (under the caller's path locks): validate against the current state,
   raising a clear ``LeaseFSError`` that names the path (nothing changes on error); decide
   everything (new inode/block ids, generation stamps, timestamps) and return the journal
   record ``(op, args)`` — or ``None`` when there is nothing to do.
2. ``apply(records)`` (called by the journal's syncer after the fsync, and by replay at
   start): apply ALL records of the batch to the store in ONE ``kv.write`` together with
   the applied txid. It is deterministic from the records and the state before them, and
   composes records of one batch through an overlay, so concurrent disjoint mutations that
   share a batch (and a parent directory's entry count) are applied correctly.

``apply`` returns one effects dict per record (blocks that left the namespace, files that
stopped being under construction, ...) so the server can update its in-memory blocks map,
leases and invalidate sets in the same synchronous step.

Ops (HDFS edit-log names): FORMAT, MKDIR, ADD (create, incl. overwrite and missing parents),
ADD_BLOCK (commits the previous block), UPDATE_BLOCKS (commit / length / gs changes),
ABANDON_BLOCK, FSYNC, CLOSE, DELETE, RENAME (rename2 with overwrite), RENAMES (several renames
visible at once: a job commit), SET_PERMISSIONS,
SET_OWNER, SET_REPLICATION, TIMES, SYMLINK, SET_GENSTAMP, RECLAIM, and for leases (issue 3)
REASSIGN_LEASE, COMMIT_BLOCK_SYNC (block recovery done), TRUNCATE, APPEND.

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

Cost of a long file: only the last block and a COMMITTED penultimate may be incomplete
(ADD_BLOCK always names ``previous`` and completes the block before it), so writer calls
and CLOSE read the inode plus its last one or two block keys (``tail_blocks``), and a
ranged read of locations starts at the block holding the offset (``blocks_in_range``):
add_block at block 50 000 costs what it costs at block 5. Limits as in HDFS:
``min_block_size`` at create, ``max_blocks_per_file`` at add_block.

Concurrency contract: trio thread only; no awaits, no I/O except the store's small sync
calls. Allocation counters (next inode id, next block id, generation stamp) advance in memory
when a plan is made and are persisted by ``apply`` (``max`` of stored and used), so an
abandoned plan only leaves a gap.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from sortedcontainers import SortedDict, SortedSet

from fs import paths
from fs.errors import (FileExists, FileNotFound, InternalError, InvalidArgument, IsDirectory,
                       DirectoryNotEmpty, NotDirectory, StaleGenerationStamp)

from . import keys
from .blocks import COMMITTED, COMPLETE, UNDER_CONSTRUCTION
from .leases import LeaseManager
from .namespace_args import (DIR, FILE, MAX_LIST_LIMIT, MAX_OWNER_LEN, MAX_RENAMES,
                             MAX_TARGET_BYTES, SYMLINK, Defaults, check_block_ref, check_bool,
                             check_int, check_mode, check_name, is_int)
from .namespace_view import CACHED_KINDS, ContentSummary, DecodedCache, NamespaceView

log = logging.getLogger(__name__)

# what other modules import from here
__all__ = ["CACHED_KINDS", "DIR", "FILE", "MAX_LIST_LIMIT", "MAX_OWNER_LEN", "MAX_RENAMES",
           "MAX_TARGET_BYTES", "SYMLINK", "ContentSummary", "Defaults", "Namespace", "_Txn",
           "check_block_ref", "check_bool", "check_int", "check_mode", "check_name", "inside"]


# ---------------------------------------------------------------------------- overlay
class _Txn:
    """A batch's view of the store: reads see the batch's own earlier writes."""

    def __init__(self, kv):
        self.kv = kv
        self.puts: SortedDict = SortedDict()   # key -> decoded value
        self.dels: set[bytes] = set()

    def get(self, key: bytes):
        if key in self.puts:
            return self.puts[key]
        if key in self.dels:
            return None
        raw = self.kv.get(key)
        return None if raw is None else keys.unpack(raw)

    def put(self, key: bytes, value) -> None:
        self.puts[key] = value
        self.dels.discard(key)

    def delete(self, key: bytes) -> None:
        self.puts.pop(key, None)
        self.dels.add(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, object]]:
        merged = {k: v for k, v in self.kv.scan(prefix) if k not in self.dels}
        merged = {k: keys.unpack(v) for k, v in merged.items() if k not in self.puts}
        for key in self.puts.irange(minimum=prefix):
            if not key.startswith(prefix):
                break
            merged[key] = self.puts[key]
        return sorted(merged.items())

    def commit(self) -> None:
        self.kv.write(puts=[(k, keys.pack(v)) for k, v in self.puts.items()],
                      deletes=list(self.dels))

def inside(view: _Txn, ino: int, root: int) -> bool:
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
        ino = inode["parent"]
    return False


class Namespace(NamespaceView):
    def __init__(self, kv, defaults: Defaults | None = None, *, cache_entries: int = 1_000_000):
        self.kv = kv
        self.cache = DecodedCache(cache_entries)
        self.defaults = defaults or Defaults()
        self.counters: dict[str, int | bytes] = {}
        self._next_ino = 0
        self._next_block_id = 0
        self._genstamp = 0
        # orphan dir ino → its greatest entry key a RECLAIM removed: every entry up to it is
        # gone, so the next scan starts after it instead of skipping LevelDB tombstones
        self._reclaimed_upto: dict[int, bytes] = {}
        # orphan file ino → how many of its first blocks RECLAIM records removed
        self._blocks_reclaimed: dict[int, int] = {}
        self._orphans: SortedSet = SortedSet()   # roots of detached subtrees (``O`` keys)
        self.load()

    # ------------------------------------------------------------------ counters
    def load(self) -> None:
        """(Re)read the counters from the store (after open or a replay)."""
        self.counters = {}
        for name in keys.COUNTERS:
            raw = self.kv.get(keys.meta_key(name))
            if raw is not None:
                self.counters[name] = keys.unpack(raw)
        self._next_ino = max(self._next_ino, int(self.counters.get(keys.NEXT_INO, 0)))
        self._next_block_id = max(self._next_block_id,
                                  int(self.counters.get(keys.NEXT_BLOCK_ID, 0)))
        self._genstamp = max(self._genstamp, int(self.counters.get(keys.GENSTAMP, 0)))
        self._orphans = SortedSet(keys.parse_orphan_key(k) for k, _ in self.kv.scan(keys.ORPHAN))

    @property
    def genstamp(self) -> int:
        return self._genstamp

    def allocate_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def allocate_block_id(self) -> int:
        block_id = self._next_block_id
        self._next_block_id += 1
        return block_id

    def next_genstamp(self) -> int:
        self._genstamp += 1
        return self._genstamp

    # ------------------------------------------------------------------ plan helpers
    def _owner_group(self, owner, group, parent_inode: dict) -> tuple[str, str]:
        owner = check_name(owner, "owner", optional=True) or self.defaults.owner
        group = check_name(group, "group", optional=True) or parent_inode.get(
            "group", self.defaults.group)
        return owner, group

    def _missing_dirs(self, parts, found, upto: int, mode: int, owner: str,
                      group: str) -> list[dict]:
        """New directories for ``parts[len(found)-1 : upto]`` (ids allocated now)."""
        dirs = []
        parent = found[-1][0]
        for name in parts[len(found) - 1:upto]:
            ino = self.allocate_ino()
            dirs.append({"parent": parent, "name": name, "ino": ino, "mode": mode,
                         "owner": owner, "group": group})
            parent = ino
        return dirs

    def needs_detach(self, ino: int, inode: dict) -> bool:
        """More than ``delete_chunk`` entries (inodes + blocks) at and under ``ino``? Reads
        at most that many inodes to find out (a file's blocks are counted by ``nblocks``)."""
        limit = max(1, self.defaults.delete_chunk)
        count = 0
        stack = [(ino, inode)]
        while stack:
            cur, node = stack.pop()
            count += 1 + (node.get("nblocks", 0) if node["type"] == FILE else 0)
            if count > limit:
                return True
            if node["type"] != DIR:
                continue
            for _, child in self.children(cur):
                child_inode = self.get_inode(child)
                if child_inode is not None:
                    stack.append((child, child_inode))
                if count + len(stack) > limit:   # every stacked inode counts at least 1
                    return True
        return False

    def _check_parent_dir(self, path: str, found) -> None:
        ino, inode = found[-1]
        if inode["type"] != DIR:
            raise NotDirectory(f"{path}: parent is not a directory")

    # ------------------------------------------------------------------ planners
    def plan_format(self, namespace_id: int, now_ns: int) -> tuple[str, dict]:
        if self.formatted:
            raise InternalError("the namespace is already formatted")
        return "FORMAT", {"namespace_id": namespace_id, "time": now_ns, "mode": 0o755,
                          "owner": self.defaults.owner, "group": self.defaults.group}

    def plan_mkdirs(self, path, permission=0o755, owner=None, group=None, *,
                    now_ns: int) -> tuple[str, dict] | None:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        permission = check_mode(permission, f"mkdirs {canonical}: permission")
        found = self.walk(parts, canonical)
        if len(found) == len(parts) + 1:
            if found[-1][1]["type"] == DIR:
                return None
            raise FileExists(f"mkdirs {canonical}: exists and is not a directory")
        self._check_parent_dir(canonical, found)
        owner, group = self._owner_group(owner, group, found[-1][1])
        dirs = self._missing_dirs(parts, found, len(parts), permission, owner, group)
        for d in dirs[:-1]:
            d["mode"] = permission | 0o300   # parents stay writable and searchable by the owner
        return "MKDIR", {"dirs": dirs, "time": now_ns}

    def plan_create(self, path, *, holder, client_machine: str = "", overwrite=False,
                    create_parent=True, replication=None, block_size=None, permission=0o644,
                    owner=None, group=None, now_ns: int) -> tuple[str, dict]:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        holder = check_name(holder, f"create {canonical}: client_name")
        check_bool(overwrite, f"create {canonical}: overwrite")
        check_bool(create_parent, f"create {canonical}: create_parent")
        permission = check_mode(permission, f"create {canonical}: permission")
        replication = self.check_replication(canonical, replication)
        block_size = self.check_block_size(canonical, block_size)
        if not parts:
            raise IsDirectory("cannot create /: it is a directory")
        found = self.walk(parts, canonical)
        overwrite_ino = None
        detach = False
        dirs: list[dict] = []
        if len(found) == len(parts) + 1:
            ino, inode = found[-1]
            if inode["type"] == DIR:
                raise IsDirectory(f"cannot create {canonical}: it is a directory")
            if not overwrite:
                uc = inode.get("uc")
                if uc:
                    LeaseManager.check_create_conflict(canonical, uc["holder"], holder)
                raise FileExists(f"cannot create {canonical}: file exists")
            overwrite_ino = ino
            detach = self.needs_detach(ino, inode)
            parent_ino, parent_inode = found[-2]
        else:
            if len(found) < len(parts):
                if not create_parent:
                    raise FileNotFound(f"cannot create {canonical}: parent "
                                       f"{paths.join_parts(parts[:-1])} does not exist")
            self._check_parent_dir(canonical, found)
            parent_ino, parent_inode = found[-1]
        owner, group = self._owner_group(owner, group, parent_inode)
        if len(found) < len(parts):
            dirs = self._missing_dirs(parts, found, len(parts) - 1, 0o755, owner, group)
            parent_ino = dirs[-1]["ino"]
        return "ADD", {
            "dirs": dirs, "parent": parent_ino, "name": parts[-1], "ino": self.allocate_ino(),
            "mode": permission, "owner": owner, "group": group, "time": now_ns,
            "replication": replication, "block_size": block_size, "holder": holder,
            "client_machine": str(client_machine)[:256], "overwrite": overwrite_ino,
            "detach": detach,
        }

    def check_replication(self, path: str, replication) -> int:
        if replication is None:
            return self.defaults.replication
        return check_int(replication, f"{path}: replication", low=1,
                         high=self.defaults.max_replication)

    def check_block_size(self, path: str, block_size) -> int:
        if block_size is None:
            block_size = self.defaults.block_size
        check_int(block_size, f"{path}: block_size", low=self.defaults.bytes_per_checksum)
        if block_size < self.defaults.min_block_size:
            raise InvalidArgument(f"{path}: block_size {block_size} is below the limit "
                                  f"min_block_size {self.defaults.min_block_size}")
        if block_size % self.defaults.bytes_per_checksum:
            raise InvalidArgument(f"{path}: block_size {block_size} is not a multiple of "
                                  f"bytes_per_checksum {self.defaults.bytes_per_checksum}")
        return block_size

    def plan_symlink(self, target, path, *, create_parent=False, owner=None, group=None,
                     now_ns: int) -> tuple[str, dict]:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(create_parent, f"symlink {canonical}: create_parent")
        if not isinstance(target, str) or not target or "\0" in target:
            raise InvalidArgument(f"symlink {canonical}: target must be a non-empty string "
                                  f"without NUL, got {target!r:.80}")
        if len(keys.encode_name(target)) > MAX_TARGET_BYTES:
            raise InvalidArgument(f"symlink {canonical}: target longer than "
                                  f"{MAX_TARGET_BYTES} bytes")
        if not parts:
            raise FileExists("cannot create a symlink at /: it exists")
        found = self.walk(parts, canonical)
        if len(found) == len(parts) + 1:
            raise FileExists(f"cannot create symlink {canonical}: it exists")
        if len(found) < len(parts) and not create_parent:
            raise FileNotFound(f"cannot create symlink {canonical}: parent "
                               f"{paths.join_parts(parts[:-1])} does not exist")
        self._check_parent_dir(canonical, found)
        owner, group = self._owner_group(owner, group, found[-1][1])
        dirs = self._missing_dirs(parts, found, len(parts) - 1, 0o755, owner, group)
        parent_ino = dirs[-1]["ino"] if dirs else found[-1][0]
        return "SYMLINK", {"dirs": dirs, "parent": parent_ino, "name": parts[-1],
                           "ino": self.allocate_ino(), "target": target, "mode": 0o777,
                           "owner": owner, "group": group, "time": now_ns}

    def plan_delete(self, path, recursive=False, *, now_ns: int) -> tuple[str, dict]:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(recursive, f"delete {canonical}: recursive")
        if not parts:
            raise InvalidArgument("cannot delete the root directory /")
        _, ino, inode, found = self.resolve(canonical)
        if inode["type"] == DIR and inode.get("children", 0) and not recursive:
            raise DirectoryNotEmpty(f"cannot delete {canonical}: directory is not empty "
                                    f"({inode['children']} entries); use recursive")
        return "DELETE", {"parent": found[-2][0], "name": parts[-1], "ino": ino,
                          "time": now_ns, "detach": self.needs_detach(ino, inode)}

    def plan_rename(self, src, dst, overwrite=False, *, now_ns: int) -> tuple[str, dict] | None:
        src_parts, dst_parts = paths.split(src), paths.split(dst)
        check_bool(overwrite, f"rename {paths.join_parts(src_parts)} to "
                              f"{paths.join_parts(dst_parts)}: overwrite")
        args = self._plan_one_rename(src_parts, dst_parts, overwrite, now_ns)
        return None if args is None else ("RENAME", args)

    def _plan_one_rename(self, src_parts, dst_parts, overwrite: bool, now_ns: int,
                         vacated=frozenset()) -> dict | None:
        """RENAME args for one move; ``vacated`` holds paths an earlier move of the same
        RENAMES record takes away (a destination there is free by then)."""
        s, d = paths.join_parts(src_parts), paths.join_parts(dst_parts)
        what = f"rename {s} to {d}"
        if not src_parts:
            raise InvalidArgument(f"{what}: cannot rename the root directory")
        _, ino, inode, src_found = self.resolve(s)
        if s == d:
            return None
        if not dst_parts:
            raise InvalidArgument(f"{what}: cannot rename onto the root directory")
        if paths.is_ancestor(s, d):
            raise InvalidArgument(f"{what}: cannot move a directory into itself")
        dst_found = self.walk(dst_parts, d)
        overwrite_ino = None
        detach = False
        if len(dst_found) == len(dst_parts) + 1 and d in vacated:
            dst_parent = dst_found[-2][0]
        elif len(dst_found) == len(dst_parts) + 1:
            dst_ino, dst_inode = dst_found[-1]
            if not overwrite:
                raise FileExists(f"{what}: destination exists")
            if inode["type"] == DIR and dst_inode["type"] != DIR:
                raise NotDirectory(f"{what}: cannot overwrite non-directory {d} with a directory")
            if inode["type"] != DIR and dst_inode["type"] == DIR:
                raise IsDirectory(f"{what}: cannot overwrite directory {d} with a non-directory")
            if dst_inode["type"] == DIR and dst_inode.get("children", 0):
                raise DirectoryNotEmpty(f"{what}: destination directory is not empty")
            overwrite_ino = dst_ino
            detach = self.needs_detach(dst_ino, dst_inode)
            dst_parent = dst_found[-2][0]
        else:
            if len(dst_found) < len(dst_parts):
                raise FileNotFound(f"{what}: destination parent "
                                   f"{paths.join_parts(dst_parts[:-1])} does not exist")
            self._check_parent_dir(d, dst_found)
            dst_parent = dst_found[-1][0]
        return {"src_parent": src_found[-2][0], "src_name": src_parts[-1],
                "dst_parent": dst_parent, "dst_name": dst_parts[-1], "ino": ino,
                "overwrite": overwrite_ino, "detach": detach, "time": now_ns}

    @staticmethod
    def check_moves(moves, overwrite=False) -> list[tuple[list[str], list[str], bool]]:
        """Validate the shape of a ``rename_many`` request: a list of ``[src, dst]`` or
        ``[src, dst, overwrite]``; returns (src parts, dst parts, overwrite) triples."""
        check_bool(overwrite, "rename_many: overwrite")
        if not isinstance(moves, (list, tuple)) or not moves:
            raise InvalidArgument("rename_many: moves must be a non-empty list of [src, dst]")
        if len(moves) > MAX_RENAMES:
            raise InvalidArgument(f"rename_many: {len(moves)} moves, at most {MAX_RENAMES} "
                                  "in one call")
        out = []
        for i, move in enumerate(moves):
            if (not isinstance(move, (list, tuple)) or len(move) not in (2, 3)
                    or not all(isinstance(p, str) for p in move[:2])):
                raise InvalidArgument(f"rename_many: move {i} must be [src, dst] or "
                                      "[src, dst, overwrite]")
            own = overwrite if len(move) == 2 else check_bool(
                move[2], f"rename_many: move {i} overwrite")
            out.append((paths.split(move[0]), paths.split(move[1]), own))
        return out

    def plan_rename_many(self, moves, overwrite=False, *, now_ns: int) -> tuple[str, dict] | None:
        """One RENAMES record applying every move in order, so the set becomes visible at
        once (a job commit). Moves may free a destination for a later move (old output into
        a trash folder, new output in its place); what would make planning against the
        current state wrong is refused: a path given twice as source or as destination, a
        moved path or a destination above another path of the request, a destination that
        a later move takes away."""
        triples = self.check_moves(moves, overwrite)
        sources = [paths.join_parts(s) for s, _, _ in triples]
        targets = [paths.join_parts(d) for _, d, _ in triples]
        for kind, names in (("source", sources), ("destination", targets)):
            seen = set()
            for name in names:
                if name in seen:
                    raise InvalidArgument(f"rename_many: {name} is a {kind} twice")
                seen.add(name)
        source_set, target_set = set(sources), set(targets)
        for name in sources + targets:
            parts = paths.split(name)
            for depth in range(1, len(parts)):
                above = paths.join_parts(parts[:depth])
                if above in source_set:
                    raise InvalidArgument(f"rename_many: {above} is moved and {name} is "
                                          "below it")
                if above in target_set:   # planned against the inode the move replaces
                    raise InvalidArgument(f"rename_many: {above} is a destination and "
                                          f"{name} is below it")
        vacated: set[str] = set()
        planned = []
        for (src_parts, dst_parts, own), s, d in zip(triples, sources, targets):
            if d in source_set and d not in vacated:
                raise InvalidArgument(f"rename_many: {d} is a destination before it is moved")
            args = self._plan_one_rename(src_parts, dst_parts, own, now_ns, frozenset(vacated))
            vacated.add(s)
            if args is not None:
                planned.append(args)
        if not planned:
            return None
        return "RENAMES", {"renames": planned, "time": now_ns}

    def plan_set_permission(self, path, permission, *, now_ns: int) -> tuple[str, dict]:
        parts, ino, inode, _ = self.resolve(path)
        canonical = paths.join_parts(parts)
        permission = check_mode(permission, f"chmod {canonical}: permission")
        return "SET_PERMISSIONS", {"ino": ino, "mode": permission, "time": now_ns}

    def plan_set_owner(self, path, owner=None, group=None, *, now_ns: int) -> tuple[str, dict] | None:
        parts, ino, inode, _ = self.resolve(path)
        canonical = paths.join_parts(parts)
        owner = check_name(owner, f"chown {canonical}: owner", optional=True)
        group = check_name(group, f"chown {canonical}: group", optional=True)
        if owner is None and group is None:
            return None
        return "SET_OWNER", {"ino": ino, "owner": owner, "group": group, "time": now_ns}

    def plan_set_times(self, path, mtime_ns=None, atime_ns=None, *,
                       now_ns: int) -> tuple[str, dict] | None:
        parts, ino, inode, _ = self.resolve(path)
        canonical = paths.join_parts(parts)
        if mtime_ns is not None:
            check_int(mtime_ns, f"set_times {canonical}: mtime_ns")
        if atime_ns is not None:
            check_int(atime_ns, f"set_times {canonical}: atime_ns")
        if mtime_ns is None and atime_ns is None:
            return None
        return "TIMES", {"ino": ino, "mtime": mtime_ns, "atime": atime_ns, "time": now_ns}

    def plan_set_replication(self, path, replication, *, now_ns: int) -> tuple[str, dict] | None:
        parts, ino, inode, _ = self.resolve(path)
        canonical = paths.join_parts(parts)
        if inode["type"] != FILE:
            raise IsDirectory(f"setrep {canonical}: not a file") if inode["type"] == DIR \
                else InvalidArgument(f"setrep {canonical}: not a file")
        replication = check_int(replication, f"setrep {canonical}: replication", low=1,
                                high=self.defaults.max_replication)
        if replication == inode.get("replication"):
            return None
        return "SET_REPLICATION", {"ino": ino, "replication": replication, "time": now_ns}

    # -------------------------------------------------------- writer (lease holder) ops
    def writer_file(self, path, ino, holder) -> tuple[str, int, dict]:
        """The open file a writer addresses (by inode id when given, else path), after the
        HDFS writer checks. Returns ``(canonical path, ino, inode)``."""
        canonical = paths.validate(path)
        holder = check_name(holder, f"{canonical}: client_name")
        if ino is not None and ino != 0:
            check_int(ino, f"{canonical}: ino", low=1)
            inode = self.linked_inode(ino)
        else:
            try:
                _, ino, inode, _ = self.resolve(canonical)
            except FileNotFound:
                inode = None
        exists = inode is not None and inode["type"] == FILE
        uc = inode.get("uc") if exists else None
        LeaseManager.check_writer(canonical, exists, uc["holder"] if uc else None, holder)
        return canonical, ino, inode

    def check_previous(self, path: str, blocks: list[dict], previous) -> tuple[str, dict | None]:
        """Classify add_block's ``previous`` against the file's blocks:

        * ``("retry", last)``   the last call's reply was lost: hand out the same last block
        * ``("first", None)``   the first block of an empty file
        * ``("commit", last)``  ``previous`` is the last block, to be committed now
        * ``("committed", last)`` already committed with that length (a retried add_block)
        """
        last = blocks[-1] if blocks else None
        if previous is not None:
            check_block_ref(previous, f"add_block {path}: previous")
        nblocks = last["index"] + 1 if last is not None else 0
        if last is not None and last["state"] == UNDER_CONSTRUCTION:
            penultimate = blocks[-2] if len(blocks) >= 2 else None
            if (previous is None and nblocks == 1) or (
                    previous is not None and penultimate is not None
                    and previous["id"] == penultimate["id"]):
                return "retry", last
        if previous is None:
            if blocks:
                raise InvalidArgument(f"add_block {path}: previous is missing but the file "
                                      f"already has {nblocks} block(s)")
            return "first", None
        if last is None or previous["id"] != last["id"]:
            raise InvalidArgument(f"add_block {path}: previous block {previous['id']} is not "
                                  f"the file's last block "
                                  f"({last['id'] if last else 'the file has none'})")
        return self._commit_kind(path, last, previous), last

    def _commit_kind(self, path: str, last: dict, reported: dict) -> str:
        if reported.get("gs") is not None and reported["gs"] != last["gs"]:
            raise StaleGenerationStamp(f"{path}: block {last['id']} has generation stamp "
                                       f"{last['gs']}, the client reported {reported['gs']}")
        if last["state"] == UNDER_CONSTRUCTION:
            return "commit"
        if last["num_bytes"] != reported["num_bytes"]:
            raise InvalidArgument(f"{path}: block {last['id']} was committed with "
                                  f"{last['num_bytes']} bytes, now reported as "
                                  f"{reported['num_bytes']}")
        return "committed"

    def check_block_length(self, path: str, inode: dict, num_bytes: int) -> None:
        if num_bytes > inode["block_size"]:
            raise InvalidArgument(f"{path}: block length {num_bytes} exceeds the file's block "
                                  f"size {inode['block_size']}")

    def check_block_count(self, path: str, inode: dict) -> None:
        """HDFS ``dfs.namenode.fs-limits.max-blocks-per-file``: refuse one block more."""
        limit = self.defaults.max_blocks_per_file
        if inode.get("nblocks", 0) >= limit:
            raise InvalidArgument(f"add_block {path}: the file already has "
                                  f"{inode.get('nblocks', 0)} blocks, the limit "
                                  f"max_blocks_per_file is {limit}")

    def plan_add_block(self, ino: int, blocks: list[dict], block_id: int, gs: int,
                       commit: dict | None, targets: list[str], now_ns: int) -> tuple[str, dict]:
        """``blocks``: the file's blocks or at least its last one (``tail_blocks``).
        ``previous`` names the last block even when it was committed by an earlier call,
        so the apply marks the block before it COMPLETE (only the last two blocks may be
        incomplete: writer checks read just those)."""
        previous = None
        if blocks:
            last = blocks[-1]
            previous = {"index": last["index"], "id": last["id"],
                        "num_bytes": commit["num_bytes"] if commit else last["num_bytes"]}
        index = blocks[-1]["index"] + 1 if blocks else 0
        return "ADD_BLOCK", {"ino": ino, "index": index, "block": {"id": block_id, "gs": gs},
                             "previous": previous, "targets": list(targets), "time": now_ns}

    def plan_commit(self, ino: int, block: dict, num_bytes: int) -> tuple[str, dict]:
        return "UPDATE_BLOCKS", {"ino": ino, "blocks": [{
            "index": block["index"], "id": block["id"], "gs": block["gs"],
            "num_bytes": num_bytes, "state": COMMITTED}]}

    def check_last(self, path: str, blocks: list[dict], last) -> tuple[str, dict | None]:
        """complete's ``last`` against the file: ``("none"|"commit"|"committed", block)``."""
        if last is None:
            if blocks:
                raise InvalidArgument(f"complete {path}: last block is missing but the file "
                                      f"has {blocks[-1]['index'] + 1} block(s)")
            return "none", None
        check_block_ref(last, f"complete {path}: last")
        if not blocks or blocks[-1]["id"] != last["id"]:
            raise InvalidArgument(f"complete {path}: block {last['id']} is not the file's "
                                  f"last block ({blocks[-1]['id'] if blocks else 'none'})")
        return self._commit_kind(path, blocks[-1], last), blocks[-1]

    def closed_with(self, path, ino, last) -> bool:
        """A complete() retried after the file was already closed with this last block: the
        same id, length and generation stamp (HDFS-3031). A block recovery after another
        client took the file over gives the last block a new stamp, so a late complete of
        the old writer does not match and gets the lease error instead."""
        canonical = paths.validate(path)
        if ino:
            inode = self.linked_inode(ino) if is_int(ino) else None
        else:
            try:
                _, ino, inode, _ = self.resolve(canonical)
            except FileNotFound:
                return False
        if inode is None or inode["type"] != FILE or inode.get("uc"):
            return False
        blocks = self.tail_blocks(ino, inode, 1)
        if last is None:
            return not blocks
        return (isinstance(last, dict) and bool(blocks) and blocks[-1]["id"] == last.get("id")
                and blocks[-1]["num_bytes"] == last.get("num_bytes")
                and blocks[-1]["gs"] == last.get("gs"))

    def plan_close(self, ino: int, block: dict | None, num_bytes: int | None,
                   now_ns: int) -> tuple[str, dict]:
        last = None
        if block is not None:
            last = {"index": block["index"], "id": block["id"], "num_bytes": num_bytes}
        return "CLOSE", {"ino": ino, "last": last, "time": now_ns}

    def plan_abandon(self, path: str, ino: int, blocks: list[dict], block) -> tuple[str, dict] | None:
        check_block_ref(block, f"abandon_block {path}: block")
        match = [b for b in blocks if b["id"] == block["id"]]
        if not match:
            return None   # already abandoned (a retry)
        if match[0] is not blocks[-1] or match[0]["state"] != UNDER_CONSTRUCTION:
            raise InvalidArgument(f"abandon_block {path}: block {block['id']} is not the "
                                  f"file's last block under construction")
        return "ABANDON_BLOCK", {"ino": ino, "index": match[0]["index"], "id": block["id"]}

    def plan_fsync(self, path: str, ino: int, blocks: list[dict],
                   last_block_length) -> tuple[str, dict] | None:
        check_int(last_block_length, f"fsync {path}: last_block_length", low=0)
        if not blocks or blocks[-1]["state"] != UNDER_CONSTRUCTION:
            return None
        last = blocks[-1]
        if last_block_length <= last["num_bytes"]:
            return None
        return "FSYNC", {"ino": ino, "index": last["index"], "id": last["id"],
                         "num_bytes": last_block_length}

    def plan_set_genstamp(self) -> tuple[str, dict]:
        return "SET_GENSTAMP", {"gs": self.next_genstamp()}

    # ------------------------------------------------------------------ leases (issue 3)
    def plan_reassign_lease(self, ino: int, holder: str) -> tuple[str, dict]:
        """Lease recovery hands an open file to ``holder`` (HDFS REASSIGN_LEASE)."""
        return "REASSIGN_LEASE", {"ino": ino, "holder": holder}

    def plan_commit_block_sync(self, ino: int, block: dict, gs: int, num_bytes: int, *,
                               delete: bool, close: bool, now_ns: int) -> tuple[str, dict]:
        """Block recovery finished: the last block gets the recovery id and the agreed
        length (or goes, when every replica was empty); ``close`` closes the file."""
        return "COMMIT_BLOCK_SYNC", {"ino": ino, "index": block["index"], "id": block["id"],
                                     "gs": gs, "num_bytes": num_bytes, "delete": delete,
                                     "close": close, "time": now_ns}

    def plan_truncate(self, path: str, ino: int, inode: dict, new_length, *, holder: str,
                      client_machine: str = "", now_ns: int) -> tuple[str, dict] | None:
        """Truncate a closed file. Blocks wholly past ``new_length`` go; when the new end
        falls inside a block, that block is kept (for block recovery to cut) and the file
        becomes under construction for ``holder``: ``last`` says which block and its new
        length. None when the length does not change."""
        check_int(new_length, f"truncate {path}: new_length", low=0)
        length = inode.get("length", 0)
        if new_length > length:
            raise InvalidArgument(f"truncate {path}: new length {new_length} is beyond the "
                                  f"end of the file ({length} bytes); truncate cannot grow")
        if new_length == length:
            return None
        keep = 0
        pos = 0
        last = None
        for block in self.blocks_of(ino):
            if pos >= new_length:
                break
            keep = block["index"] + 1
            end = pos + block["num_bytes"]
            if end > new_length:
                last = {"index": block["index"], "id": block["id"], "gs": block["gs"],
                        "num_bytes": new_length - pos, "old_num_bytes": block["num_bytes"]}
            pos = end
        return "TRUNCATE", {"ino": ino, "new_length": new_length, "keep": keep, "last": last,
                            "holder": holder if last else None,
                            "client_machine": str(client_machine)[:256], "time": now_ns}

    def plan_append(self, ino: int, inode: dict, *, holder: str, client_machine: str = "",
                    new_gs: int | None, now_ns: int) -> tuple[str, dict]:
        """Reopen a closed file for ``holder``; a partial last block is reopened under the
        new generation stamp ``new_gs`` (None: the client starts a new block)."""
        last = None
        tail = self.tail_blocks(ino, inode, 1)
        if tail and new_gs is not None and tail[-1]["num_bytes"] < inode["block_size"]:
            b = tail[-1]
            last = {"index": b["index"], "id": b["id"], "gs": new_gs, "old_gs": b["gs"],
                    "num_bytes": b["num_bytes"]}
        return "APPEND", {"ino": ino, "holder": holder, "client_machine": str(client_machine)[:256],
                          "last": last, "time": now_ns}

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
        root_inode = self.get_inode(root)
        if root_inode is None:
            return
        stack = [(root, root_inode, None, None,
                  self._remaining_children(root, root_inode)
                  if root_inode["type"] == DIR else None)]
        while stack:
            ino, inode, parent, name, entries = stack[-1]
            nxt = next(entries, None) if entries is not None else None
            if nxt is not None:
                child_name, child = nxt
                child_inode = self.get_inode(child)
                if child_inode is None:
                    yield ("D", ino, child_name)
                else:
                    stack.append((child, child_inode, ino, child_name,
                                  self._remaining_children(child, child_inode)
                                  if child_inode["type"] == DIR else None))
                continue
            stack.pop()
            if inode["type"] == FILE:
                for index in range(self._blocks_reclaimed.get(ino, 0), inode.get("nblocks", 0)):
                    raw = self.kv.get(keys.block_key(ino, index))
                    if raw is not None:
                        yield ("B", ino, index, keys.unpack(raw)["id"])
            yield ("I", ino, inode["type"], parent, name, bool(inode.get("uc")))

    def _remaining_children(self, ino: int, inode: dict) -> Iterator[tuple[str, int]]:
        left = inode.get("children", 0)
        if left <= 0:    # nothing to find: never seek into the tombstones after the range
            return
        upto = self._reclaimed_upto.get(ino)
        start = upto + b"\x00" if upto is not None else None
        for key, raw in self.kv.scan(keys.dentry_prefix(ino), start=start, limit=left):
            yield keys.parse_dentry_key(key)[1], keys.unpack(raw)

    def plan_reclaim(self, budget: int | None = None, *,
                     stop=None) -> tuple[str, dict] | None:
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
        return "RECLAIM", {"root": root, "blocks": blocks, "inodes": inodes,
                           "entries": entries, "uc": uc, "done": done}

    # ================================================================== apply
    def apply(self, records) -> list[dict]:
        """Apply a batch of journal records in one store write; returns effects per record."""
        txn = _Txn(self.kv)
        counters = dict(self.counters)
        effects = []
        for record in records:
            handler = getattr(self, "_apply_" + record.op, None)
            if handler is None:
                raise InternalError(f"journal txid {record.txid}: unknown op {record.op!r}")
            if record.op != "FORMAT" and keys.NAMESPACE_ID not in counters:
                raise InternalError(f"journal txid {record.txid}: {record.op} before FORMAT")
            effect = handler(txn, counters, record.args) or {}
            effect["op"] = record.op
            effects.append(effect)
            counters[keys.APPLIED_TXID] = record.txid
        for name, value in counters.items():
            if self.counters.get(name) != value:
                txn.put(keys.meta_key(name), value)
        try:
            txn.commit()
        except BaseException:   # a failed write may have landed partly: forget, not guess
            self.cache.data.clear()
            raise
        self.cache.committed(txn.puts, txn.dels)
        for key in txn.puts.irange(minimum=keys.ORPHAN):
            if not key.startswith(keys.ORPHAN):
                break
            self._orphans.add(keys.parse_orphan_key(key))
        for effect in effects:
            if effect["op"] == "RECLAIM":
                self._reclaimed(effect)
        self.counters = counters
        self._next_ino = max(self._next_ino, int(counters.get(keys.NEXT_INO, 0)))
        self._next_block_id = max(self._next_block_id, int(counters.get(keys.NEXT_BLOCK_ID, 0)))
        self._genstamp = max(self._genstamp, int(counters.get(keys.GENSTAMP, 0)))
        return effects

    def _reclaimed(self, effect: dict) -> None:
        """Move the reclaim cursors past what a RECLAIM record removed."""
        for parent, name in effect["entries"]:
            key = keys.dentry_key(parent, name)
            if key > self._reclaimed_upto.get(parent, b""):
                self._reclaimed_upto[parent] = key
        for ino, index in effect["block_indexes"]:
            if index >= self._blocks_reclaimed.get(ino, 0):
                self._blocks_reclaimed[ino] = index + 1
        for ino in effect["removed_inos"]:
            self._reclaimed_upto.pop(ino, None)
            self._blocks_reclaimed.pop(ino, None)
        if effect["done"]:
            self._orphans.discard(effect["reclaimed"])

    # ------------------------------------------------------------------ apply helpers
    @staticmethod
    def _bump(counters, name: str, used: int) -> None:
        """Counters stay above every used id (``next_*``) / at the largest stamp."""
        if name == keys.GENSTAMP:
            counters[name] = max(int(counters.get(name, 0)), used)
        else:
            counters[name] = max(int(counters.get(name, 0)), used + 1)

    @staticmethod
    def _add(counters, name: str, delta: int) -> None:
        counters[name] = int(counters.get(name, 0)) + delta

    @staticmethod
    def _touch_dir(txn: _Txn, ino: int, time: int, children_delta: int, child: dict | None) -> None:
        """A directory gained (+1) or lost (-1) the entry of ``child``: its entry count and,
        for a directory child, its subdirectory count (its link count is 2 + subdirs)."""
        inode = txn.get(keys.inode_key(ino))
        if inode is None:
            log.error("apply: parent directory inode %d is missing", ino)
            return
        inode["children"] = inode.get("children", 0) + children_delta
        if child is not None and child.get("type") == DIR:
            if "subdirs" in inode:
                inode["subdirs"] += children_delta
            else:   # stored before directories counted them: count once (the batch
                # already holds the entry change, so the count is the new one)
                inode["subdirs"] = sum(
                    1 for _, c in txn.scan(keys.dentry_prefix(ino))
                    if (txn.get(keys.inode_key(c)) or {}).get("type") == DIR)
        inode["mtime"] = inode["ctime"] = time
        txn.put(keys.inode_key(ino), inode)

    def _link(self, txn: _Txn, counters, parent: int, name: str, ino: int, inode: dict,
              time: int) -> None:
        txn.put(keys.inode_key(ino), inode)
        txn.put(keys.dentry_key(parent, name), ino)
        self._touch_dir(txn, parent, time, +1, inode)
        self._bump(counters, keys.NEXT_INO, ino)
        if inode["type"] == DIR:
            self._add(counters, keys.DIRS, 1)
        elif inode["type"] == FILE:
            self._add(counters, keys.FILES, 1)

    def _mkdirs(self, txn: _Txn, counters, dirs, time: int) -> None:
        for d in dirs:
            inode = {"type": DIR, "mode": d["mode"], "owner": d["owner"], "group": d["group"],
                     "mtime": time, "atime": time, "ctime": time, "parent": d["parent"],
                     "name": d["name"], "children": 0, "subdirs": 0}
            self._link(txn, counters, d["parent"], d["name"], d["ino"], inode, time)

    def _remove_subtree(self, txn: _Txn, counters, ino: int, effects: dict) -> None:
        """Remove ``ino`` and everything below it (not its own dentry)."""
        removed_blocks = effects.setdefault("removed_blocks", [])
        removed_uc = effects.setdefault("removed_uc", [])
        removed_inos = effects.setdefault("removed_inos", [])
        stack = [ino]
        while stack:
            cur = stack.pop()
            inode = txn.get(keys.inode_key(cur))
            if inode is None:
                log.error("apply: inode %d to remove is missing", cur)
                continue
            if inode["type"] == DIR:
                for key, child in txn.scan(keys.dentry_prefix(cur)):
                    stack.append(child)
                    txn.delete(key)
                self._add(counters, keys.DIRS, -1)
            elif inode["type"] == FILE:
                for key, block in txn.scan(keys.block_prefix(cur)):
                    removed_blocks.append(block["id"])
                    txn.delete(key)
                if inode.get("uc"):
                    txn.delete(keys.uc_key(cur))
                    removed_uc.append(cur)
                self._add(counters, keys.FILES, -1)
            txn.delete(keys.inode_key(cur))
            removed_inos.append(cur)

    def _unlink(self, txn: _Txn, counters, parent: int, name: str, ino: int, time: int,
                effects: dict, detach: bool = False) -> None:
        key = keys.dentry_key(parent, name)
        current = txn.get(key)
        if current != ino:
            log.error("apply: entry %r in %d is %r, expected %d", name, parent, current, ino)
        txn.delete(key)
        self._touch_dir(txn, parent, time, -1, txn.get(keys.inode_key(ino)))
        if detach:
            self._detach(txn, parent, name, ino, time, effects)
        else:
            self._remove_subtree(txn, counters, ino, effects)

    def _detach(self, txn: _Txn, parent: int, name: str, ino: int, time: int,
                effects: dict) -> None:
        """Make ``ino`` (its entry already removed) the root of an orphan subtree for the
        reclaimer; files under construction inside lose their lease now (few ``U`` keys)."""
        inode = txn.get(keys.inode_key(ino))
        if inode is None:
            log.error("apply: inode %d to detach is missing", ino)
            return
        removed_uc = effects.setdefault("removed_uc", [])
        for key, _holder in txn.scan(keys.UNDER_CONSTRUCTION):
            uc_ino = keys.parse_uc_key(key)
            if inside(txn, uc_ino, ino):
                txn.delete(key)
                removed_uc.append(uc_ino)
        inode["parent"] = 0
        txn.put(keys.inode_key(ino), inode)
        txn.put(keys.orphan_key(ino), {"parent": parent, "name": name, "time": time})
        effects["orphan"] = ino

    def _file(self, txn: _Txn, ino: int) -> dict | None:
        inode = txn.get(keys.inode_key(ino))
        if inode is None or inode["type"] != FILE:
            log.error("apply: file inode %d is missing", ino)
            return None
        return inode

    def _set_block(self, txn: _Txn, counters, ino: int, inode: dict, index: int,
                   block: dict) -> None:
        """Write one block key and keep the inode's length and block count in step."""
        key = keys.block_key(ino, index)
        old = txn.get(key)
        inode["length"] = inode.get("length", 0) - (old["num_bytes"] if old else 0) \
            + block["num_bytes"]
        inode["nblocks"] = max(inode.get("nblocks", 0), index + 1)
        txn.put(key, {"id": block["id"], "gs": block["gs"], "num_bytes": block["num_bytes"],
                      "state": block["state"]})
        self._bump(counters, keys.NEXT_BLOCK_ID, block["id"])
        self._bump(counters, keys.GENSTAMP, block["gs"])

    # ------------------------------------------------------------------ appliers
    def _apply_FORMAT(self, txn, counters, a):
        if keys.NAMESPACE_ID in counters:
            raise InternalError("FORMAT of an already formatted namespace")
        t = a["time"]
        root = {"type": DIR, "mode": a["mode"], "owner": a["owner"], "group": a["group"],
                "mtime": t, "atime": t, "ctime": t, "parent": 0, "name": "", "children": 0,
                "subdirs": 0}
        txn.put(keys.inode_key(keys.ROOT_INO), root)
        counters.update({keys.NAMESPACE_ID: a["namespace_id"], keys.LAYOUT: keys.LAYOUT_VERSION,
                         keys.NEXT_INO: keys.ROOT_INO + 1, keys.NEXT_BLOCK_ID: 1,
                         keys.GENSTAMP: 1000, keys.FILES: 0, keys.DIRS: 1})

    def _apply_MKDIR(self, txn, counters, a):
        self._mkdirs(txn, counters, a["dirs"], a["time"])

    def _apply_ADD(self, txn, counters, a):
        effects: dict = {"ino": a["ino"], "holder": a["holder"]}
        t = a["time"]
        self._mkdirs(txn, counters, a["dirs"], t)
        if a["overwrite"] is not None:
            self._unlink(txn, counters, a["parent"], a["name"], a["overwrite"], t, effects,
                         detach=a.get("detach", False))
        inode = {"type": FILE, "mode": a["mode"], "owner": a["owner"], "group": a["group"],
                 "mtime": t, "atime": t, "ctime": t, "parent": a["parent"], "name": a["name"],
                 "replication": a["replication"], "block_size": a["block_size"], "length": 0,
                 "nblocks": 0, "uc": {"holder": a["holder"],
                                      "client_machine": a.get("client_machine", "")}}
        self._link(txn, counters, a["parent"], a["name"], a["ino"], inode, t)
        txn.put(keys.uc_key(a["ino"]), a["holder"])
        return effects

    def _apply_SYMLINK(self, txn, counters, a):
        t = a["time"]
        self._mkdirs(txn, counters, a["dirs"], t)
        inode = {"type": SYMLINK, "mode": a["mode"], "owner": a["owner"], "group": a["group"],
                 "mtime": t, "atime": t, "ctime": t, "parent": a["parent"], "name": a["name"],
                 "target": a["target"]}
        self._link(txn, counters, a["parent"], a["name"], a["ino"], inode, t)

    def _apply_ADD_BLOCK(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        effects = {"ino": ino, "block": a["block"], "index": a["index"],
                   "targets": a.get("targets", []), "replication": inode.get("replication", 1)}
        prev = a.get("previous")
        if prev is not None:
            old = txn.get(keys.block_key(ino, prev["index"]))
            if old is not None:
                state = old["state"] if old["state"] != UNDER_CONSTRUCTION else COMMITTED
                self._set_block(txn, counters, ino, inode, prev["index"],
                                {**old, "num_bytes": prev["num_bytes"], "state": state})
                effects["committed"] = {"id": prev["id"], "num_bytes": prev["num_bytes"]}
            # the server only adds a block when every block before ``previous`` is COMPLETE
            if prev["index"] >= 1:
                before = txn.get(keys.block_key(ino, prev["index"] - 1))
                if before is not None and before["state"] != COMPLETE:
                    self._set_block(txn, counters, ino, inode, prev["index"] - 1,
                                    {**before, "state": COMPLETE})
        self._set_block(txn, counters, ino, inode, a["index"],
                        {"id": a["block"]["id"], "gs": a["block"]["gs"], "num_bytes": 0,
                         "state": UNDER_CONSTRUCTION})
        txn.put(keys.inode_key(ino), inode)
        return effects

    def _apply_UPDATE_BLOCKS(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        for block in a["blocks"]:
            self._set_block(txn, counters, ino, inode, block["index"], block)
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "blocks": a["blocks"]}

    def _apply_FSYNC(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        old = txn.get(keys.block_key(ino, a["index"])) if inode is not None else None
        if old is None:
            return {}
        self._set_block(txn, counters, ino, inode, a["index"], {**old, "num_bytes": a["num_bytes"]})
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "id": old["id"], "num_bytes": a["num_bytes"]}

    def _apply_ABANDON_BLOCK(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        key = keys.block_key(ino, a["index"])
        old = txn.get(key) if inode is not None else None
        if old is None:
            return {}
        txn.delete(key)
        inode["length"] = inode.get("length", 0) - old["num_bytes"]
        inode["nblocks"] = a["index"]
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "removed_blocks": [old["id"]]}

    def _apply_CLOSE(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        last = a.get("last")
        # only the last two blocks may be incomplete (ADD_BLOCK completes the one before
        # ``previous``), so a close costs the same for 2 blocks and for 50 000
        nblocks = inode.get("nblocks", 0)
        tail = [(index, txn.get(keys.block_key(ino, index)))
                for index in range(max(0, nblocks - 2), nblocks)]
        for index, block in tail:
            if block is None:
                log.error("apply CLOSE: block #%d of inode %d is missing", index, ino)
                continue
            if last is not None and index == last["index"]:
                block = {**block, "num_bytes": last["num_bytes"]}
            if block["state"] != COMPLETE or (last is not None and index == last["index"]):
                self._set_block(txn, counters, ino, inode, index, {**block, "state": COMPLETE})
        inode["uc"] = None
        inode["mtime"] = inode["ctime"] = a["time"]
        txn.put(keys.inode_key(ino), inode)
        txn.delete(keys.uc_key(ino))
        return {"ino": ino, "closed": True}

    def _apply_DELETE(self, txn, counters, a):
        effects: dict = {}
        self._unlink(txn, counters, a["parent"], a["name"], a["ino"], a["time"], effects,
                     detach=a.get("detach", False))
        return effects

    def _apply_RECLAIM(self, txn, counters, a):
        """Remove exactly the listed keys of an orphan subtree (see ``plan_reclaim``)."""
        removed_blocks = [block_id for _, _, block_id in a["blocks"]]
        for ino, index, _ in a["blocks"]:
            txn.delete(keys.block_key(ino, index))
        removed_inos = {ino for ino, _ in a["inodes"]}
        left: dict[int, int] = {}
        for parent, name in a["entries"]:
            txn.delete(keys.dentry_key(parent, name))
            left[parent] = left.get(parent, 0) + 1
        for parent, count in left.items():
            # what is left of a directory being reclaimed stays counted: the next record
            # scans exactly that many entries (never past its range, into tombstones)
            inode = txn.get(keys.inode_key(parent)) if parent not in removed_inos else None
            if inode is not None and inode.get("type") == DIR:
                inode["children"] = max(0, inode.get("children", 0) - count)
                txn.put(keys.inode_key(parent), inode)
        for ino in a["uc"]:
            txn.delete(keys.uc_key(ino))
        for ino, kind in a["inodes"]:
            txn.delete(keys.inode_key(ino))
            if kind == DIR:
                self._add(counters, keys.DIRS, -1)
            elif kind == FILE:
                self._add(counters, keys.FILES, -1)
        if a["done"]:
            txn.delete(keys.orphan_key(a["root"]))
        return {"removed_blocks": removed_blocks, "removed_uc": list(a["uc"]),
                "removed_inos": [ino for ino, _ in a["inodes"]], "reclaimed": a["root"],
                "done": a["done"], "entries": a["entries"],
                "block_indexes": [(ino, index) for ino, index, _ in a["blocks"]]}

    def _apply_RENAME(self, txn, counters, a):
        effects: dict = {}
        t = a["time"]
        ino = a["ino"]
        if a["overwrite"] is not None:
            self._unlink(txn, counters, a["dst_parent"], a["dst_name"], a["overwrite"], t, effects,
                         detach=a.get("detach", False))
        inode = txn.get(keys.inode_key(ino))
        txn.delete(keys.dentry_key(a["src_parent"], a["src_name"]))
        self._touch_dir(txn, a["src_parent"], t, -1, inode)
        txn.put(keys.dentry_key(a["dst_parent"], a["dst_name"]), ino)
        self._touch_dir(txn, a["dst_parent"], t, +1, inode)
        if inode is not None:
            inode["parent"], inode["name"], inode["ctime"] = a["dst_parent"], a["dst_name"], t
            txn.put(keys.inode_key(ino), inode)
        return effects

    def _apply_RENAMES(self, txn, counters, a):
        effects: dict = {}
        for one in a["renames"]:
            for key, value in self._apply_RENAME(txn, counters, one).items():
                if isinstance(value, list):
                    effects.setdefault(key, []).extend(value)
                else:
                    effects[key] = value
        return effects

    def _update_inode(self, txn, ino: int, **changes) -> dict | None:
        inode = txn.get(keys.inode_key(ino))
        if inode is None:
            log.error("apply: inode %d is missing", ino)
            return None
        inode.update(changes)
        txn.put(keys.inode_key(ino), inode)
        return inode

    def _apply_SET_PERMISSIONS(self, txn, counters, a):
        self._update_inode(txn, a["ino"], mode=a["mode"], ctime=a["time"])

    def _apply_SET_OWNER(self, txn, counters, a):
        changes = {"ctime": a["time"]}
        if a.get("owner") is not None:
            changes["owner"] = a["owner"]
        if a.get("group") is not None:
            changes["group"] = a["group"]
        self._update_inode(txn, a["ino"], **changes)

    def _apply_TIMES(self, txn, counters, a):
        changes = {"ctime": a["time"]}
        if a.get("mtime") is not None:
            changes["mtime"] = a["mtime"]
        if a.get("atime") is not None:
            changes["atime"] = a["atime"]
        self._update_inode(txn, a["ino"], **changes)

    def _apply_SET_REPLICATION(self, txn, counters, a):
        self._update_inode(txn, a["ino"], replication=a["replication"], ctime=a["time"])
        ids = [block["id"] for _, block in txn.scan(keys.block_prefix(a["ino"]))]
        return {"ino": a["ino"], "replication": a["replication"], "block_ids": ids}

    def _set_uc(self, txn, ino: int, inode: dict, holder: str, client_machine: str) -> None:
        inode["uc"] = {"holder": holder, "client_machine": client_machine}
        txn.put(keys.uc_key(ino), holder)

    def _apply_REASSIGN_LEASE(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None or not inode.get("uc"):
            return {}
        self._set_uc(txn, ino, inode, a["holder"], inode["uc"].get("client_machine", ""))
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "holder": a["holder"]}

    def _apply_COMMIT_BLOCK_SYNC(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        key = keys.block_key(ino, a["index"])
        old = txn.get(key) if inode is not None else None
        if old is None or old["id"] != a["id"]:
            return {}
        effects: dict = {"ino": ino, "id": a["id"]}
        if a["delete"]:
            txn.delete(key)
            inode["length"] = inode.get("length", 0) - old["num_bytes"]
            inode["nblocks"] = a["index"]
            effects["removed_blocks"] = [a["id"]]
        else:
            synced = {**old, "gs": a["gs"], "num_bytes": a["num_bytes"],
                      "state": COMPLETE if a["close"] else COMMITTED}
            synced.pop("truncate_to", None)      # a pending truncate is done with this commit
            self._set_block(txn, counters, ino, inode, a["index"], synced)
        txn.put(keys.inode_key(ino), inode)
        if a["close"]:
            effects.update(self._apply_CLOSE(txn, counters, {"ino": ino, "last": None,
                                                             "time": a["time"]}))
        return effects

    def _apply_TRUNCATE(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        removed = []
        for key, block in txn.scan(keys.block_prefix(ino)):
            if keys.parse_block_key(key)[1] >= a["keep"]:
                removed.append(block["id"])
                txn.delete(key)
        last = a.get("last")
        if last is not None:
            old = txn.get(keys.block_key(ino, last["index"]))
            if old is not None:
                # the target length lives in the block's own key, so a recovery started
                # again after a restart (or a retry) still cuts the replicas to it (HDFS
                # journals the truncate block for the same reason)
                txn.put(keys.block_key(ino, last["index"]),
                        {**old, "num_bytes": last["num_bytes"], "state": UNDER_CONSTRUCTION,
                         "truncate_to": last["num_bytes"]})
            self._set_uc(txn, ino, inode, a["holder"], a.get("client_machine", ""))
        inode["length"] = a["new_length"]
        inode["nblocks"] = a["keep"]
        inode["mtime"] = inode["ctime"] = a["time"]
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "removed_blocks": removed}

    def _apply_APPEND(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        last = a.get("last")
        if last is not None:
            old = txn.get(keys.block_key(ino, last["index"]))
            if old is not None:
                self._set_block(txn, counters, ino, inode, last["index"],
                                {**old, "gs": last["gs"], "state": UNDER_CONSTRUCTION})
        self._set_uc(txn, ino, inode, a["holder"], a.get("client_machine", ""))
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino}

    def _apply_SET_GENSTAMP(self, txn, counters, a):
        self._bump(counters, keys.GENSTAMP, a["gs"])
