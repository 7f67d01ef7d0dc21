"""Offline consistency checks: ``check_namespace(kv) -> [problems]`` for a namespace store,
``check_record(kv, record) -> [problems]`` for one journal record against the state before it.

Why it exists: crash tests (kill -9 of the metadata server under load) end by opening the
LevelDB folder and asserting ``check_namespace(store) == []``; ``leasefs fsck`` can use it
too. It reads the whole store once and checks the schema of ``keys.py``:

* the root exists and is a directory; every inode but the root has exactly one entry
  ``D<parent><name>`` that points to it and agrees with its ``parent``/``name`` fields;
  every entry points to a live inode inside a directory; every inode is reachable from the
  root (no orphans, no cycles); directory ``children`` counts match their entries and
  ``subdirs`` their directory entries (a directory's link count is 2 + subdirs);
* block keys belong to files, indexes are 0..nblocks-1, block ids are unique, the file's
  ``length`` is the sum of its blocks; a closed file has only COMPLETE blocks, an open
  one at most its last two (the writer checks and CLOSE read only those);
* counters: ``next_ino``/``next_block_id`` above every used id, the generation stamp at
  least every block's, ``files``/``dirs`` equal the counted inodes, an applied txid exists;
* folder quotas: every quota folder's stored usage equals a recount of the names and the
  space (``charge.file_charge``) at and below it; ``quota_dirs`` counts them;
* files under construction ↔ ``U`` keys (same holder), and, when a ``LeaseManager`` is
  given, ↔ its ``lease_by_ino``.
* detached subtrees (a big delete being reclaimed): everything reachable from an ``O`` key
  is legal although no entry leads to its root, and is half-removed (directory counts,
  file lengths and block lists are not checked there); the orphan root must exist, have
  ``parent`` 0 and no entry, and no ``U`` key may remain inside (their leases ended at the
  detach). Counters and block id uniqueness still include them.

``check_record`` re-checks the planner's preconditions of a record at serial replay (a
fresh store filled one record at a time): with fine-grained locking, records planned
concurrently must each still be valid in journal order (see its docstring).

Concurrency contract: reads only; call it on a store nobody writes (a stopped server's
folder, or a test's own store).
"""

from __future__ import annotations

from ..schema import keys
from ..blocks.blocks import BlockState
from ..journal.charge import file_charge
from ..journal.ops import OPS, MalformedRecord
from ..journal.ops_store import Txn, inside   # the batch view apply uses: reads see earlier writes
from ..schema.inode import DIR, FILE, Inode

_MAX_REPORTED = 200


def check_namespace(kv, leases=None) -> list[str]:
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < _MAX_REPORTED:
            problems.append(text)

    counters = {}
    for name in keys.COUNTERS:
        raw = kv.get(keys.meta_key(name))
        if raw is not None:
            counters[name] = keys.unpack(raw)
    if keys.NAMESPACE_ID not in counters:
        return ["namespace is not formatted (no namespace_id counter)"]
    if keys.APPLIED_TXID not in counters:
        problem("no applied txid counter")

    inodes: dict[int, Inode] = {}
    for key, raw in kv.scan(keys.INODE):
        try:
            inodes[keys.parse_inode_key(key)] = keys.unpack_value(key, raw)
        except ValueError as e:
            problem(f"inode {keys.parse_inode_key(key)}: {e}")
    entries: dict[int, dict[str, int]] = {}
    for key, raw in kv.scan(keys.DENTRY):
        parent, name = keys.parse_dentry_key(key)
        entries.setdefault(parent, {})[name] = keys.unpack(raw)
    blocks: dict[int, dict[int, dict]] = {}
    for key, raw in kv.scan(keys.BLOCK):
        ino, index = keys.parse_block_key(key)
        blocks.setdefault(ino, {})[index] = keys.unpack(raw)
    uc_keys = {keys.parse_uc_key(k): keys.unpack(v) for k, v in kv.scan(keys.UNDER_CONSTRUCTION)}
    orphan_roots = [keys.parse_orphan_key(k) for k, _ in kv.scan(keys.ORPHAN)]

    root = inodes.get(keys.ROOT_INO)
    if root is None or root.type != DIR:
        problem(f"root inode {keys.ROOT_INO} is missing or not a directory")

    def walk(start: int, seen: set, what: str) -> None:
        """Add every inode below ``start`` to ``seen``; one met twice is a problem."""
        stack = [start]
        while stack:
            cur = stack.pop()
            if cur in seen:
                problem(f"inode {cur} is reachable twice {what}")
                continue
            seen.add(cur)
            stack.extend(c for c in entries.get(cur, {}).values() if c in inodes)

    # detached subtrees: reachable from their O key, legal while being reclaimed
    orphaned: set[int] = set()
    for root_ino in orphan_roots:
        orphan_root = inodes.get(root_ino)
        if orphan_root is None:
            problem(f"orphan key for inode {root_ino}, which does not exist")
            continue
        if orphan_root.parent != 0:
            problem(f"orphan root inode {root_ino} has parent {orphan_root.parent}, not 0")
        walk(root_ino, orphaned, "from orphan roots")

    # entries → inodes
    linked_from: dict[int, list[tuple[int, str]]] = {}
    for parent, names in entries.items():
        parent_inode = inodes.get(parent)
        if parent_inode is None:
            problem(f"entries under missing inode {parent}: {sorted(names)[:5]}")
        elif parent_inode.type != DIR:
            problem(f"entries under non-directory inode {parent}: {sorted(names)[:5]}")
        elif parent not in orphaned and (parent_inode.children or 0) != len(names):
            problem(f"directory inode {parent} says {parent_inode.children} children, "
                    f"has {len(names)} entries")
        elif parent not in orphaned and parent_inode.subdirs is not None:   # (older stores: none)
            subdirs = sum(1 for c in names.values()
                          if getattr(inodes.get(c), "type", None) == DIR)
            if parent_inode.subdirs != subdirs:
                problem(f"directory inode {parent} says {parent_inode.subdirs} "
                        f"subdirectories, has {subdirs}")
        for name, child in names.items():
            if child not in inodes:
                problem(f"entry {name!r} in inode {parent} points to missing inode {child}")
                continue
            linked_from.setdefault(child, []).append((parent, name))
    for ino, inode in inodes.items():
        if (inode.type == DIR and ino not in entries and ino not in orphaned
                and ((inode.children or 0) or (inode.subdirs or 0))):
            problem(f"directory inode {ino} says {(inode.children or 0)} children and "
                    f"{(inode.subdirs or 0)} subdirectories, has none")

    # inodes → exactly one entry, matching parent pointers
    for ino, inode in inodes.items():
        links = linked_from.get(ino, [])
        if ino == keys.ROOT_INO:
            if links:
                problem(f"the root is linked from {links}")
            continue
        if ino in orphan_roots:
            if links:
                problem(f"orphan root inode {ino} still has a directory entry: {links[:5]}")
            continue
        if len(links) != 1:
            problem(f"inode {ino} ({inode.name!r}) has {len(links)} entries: {links[:5]}")
            continue
        parent, name = links[0]
        if inode.parent != parent or inode.name != name:
            problem(f"inode {ino}: parent/name ({inode.parent}, {inode.name!r}) "
                    f"disagree with its entry ({parent}, {name!r})")

    # reachability (catches orphans and cycles)
    reached: set = set()
    if root is not None:
        walk(keys.ROOT_INO, reached, "(cycle or hard link)")
    for ino in reached & orphaned:
        problem(f"inode {ino} is reachable from the root and from an orphan root")
    unreachable = set(inodes) - reached - orphaned
    if unreachable:
        problem(f"{len(unreachable)} inodes not reachable from the root: {sorted(unreachable)[:10]}")

    # blocks
    seen_ids: dict[int, int] = {}
    max_gs = 0
    for ino, by_index in blocks.items():
        inode = inodes.get(ino)
        if inode is None or inode.type != FILE:
            problem(f"block keys of inode {ino}, which is not a file")
            continue
        if ino in orphaned:   # being reclaimed: its blocks may be partly gone already
            for block in by_index.values():
                max_gs = max(max_gs, block.get("gs", 0))
                if block["id"] in seen_ids:
                    problem(f"block id {block['id']} used by inodes {seen_ids[block['id']]} "
                            f"and {ino}")
                seen_ids[block["id"]] = ino
            continue
        n = (inode.nblocks or 0)
        if sorted(by_index) != list(range(n)):
            problem(f"file inode {ino}: nblocks {n} but block indexes {sorted(by_index)[:10]}")
        length = 0
        for index, block in sorted(by_index.items()):
            length += block.get("num_bytes", 0)
            max_gs = max(max_gs, block.get("gs", 0))
            if block["id"] in seen_ids:
                problem(f"block id {block['id']} used by inodes {seen_ids[block['id']]} and {ino}")
            seen_ids[block["id"]] = ino
            if not inode.uc and block.get("state") != BlockState.COMPLETE:
                problem(f"closed file inode {ino}: block {block['id']} is {block.get('state')}")
            elif index < n - 2 and block.get("state") != BlockState.COMPLETE:
                problem(f"open file inode {ino}: block {block['id']} (#{index} of {n}) is "
                        f"{block.get('state')}; only the last two may be incomplete")
        if inode.inline is not None:
            if len(by_index) > 1 or not inode.uc:
                problem(f"file inode {ino}: inline data beside {len(by_index)} block(s) "
                        f"{'(closed)' if not inode.uc else ''}")
        elif length != (inode.length or 0):
            problem(f"file inode {ino}: length {inode.length} != sum of blocks {length}")
    inline = {keys.parse_inline_key(k): keys.unpack(v) for k, v in kv.scan(keys.INLINE)}
    for ino, data in inline.items():
        inode = inodes.get(ino)
        if inode is None or inode.type != FILE or inode.inline is None:
            problem(f"inline data of inode {ino}, which is not a file with inline data")
        elif len(data) != inode.inline or inode.length != inode.inline:
            problem(f"file inode {ino}: {len(data)} bytes of inline data, the inode says "
                    f"inline {inode.inline}, length {inode.length}")
    for ino, inode in inodes.items():
        if inode.inline is not None and ino not in inline:
            problem(f"file inode {ino} says inline {inode.inline} but has no inline data")
    for ino, inode in inodes.items():
        if (inode.type == FILE and (inode.nblocks or 0) and ino not in blocks
                and ino not in orphaned):
            problem(f"file inode {ino}: nblocks {inode.nblocks} but no block keys")

    # counters
    if inodes and counters.get(keys.NEXT_INO, 0) <= max(inodes):
        problem(f"next_ino {counters.get(keys.NEXT_INO)} is not above the largest inode {max(inodes)}")
    if seen_ids and counters.get(keys.NEXT_BLOCK_ID, 0) <= max(seen_ids):
        problem(f"next_block_id {counters.get(keys.NEXT_BLOCK_ID)} is not above the largest "
                f"block id {max(seen_ids)}")
    if counters.get(keys.GENSTAMP, 0) < max_gs:
        problem(f"generation stamp {counters.get(keys.GENSTAMP)} is below a block's {max_gs}")
    n_files = sum(1 for i in inodes.values() if i.type == FILE)
    n_dirs = sum(1 for i in inodes.values() if i.type == DIR)
    if counters.get(keys.FILES, 0) != n_files:
        problem(f"files counter {counters.get(keys.FILES)} != {n_files} file inodes")
    if counters.get(keys.DIRS, 0) != n_dirs:
        problem(f"dirs counter {counters.get(keys.DIRS)} != {n_dirs} directory inodes")

    # quotas: recount every linked inode's names and space into the quota folders above it
    quota_dirs = {ino: inode.quota for ino, inode in inodes.items()
                  if inode.quota is not None and ino not in orphaned}
    if counters.get(keys.QUOTA_DIRS, 0) != sum(1 for i in inodes.values() if i.quota):
        problem(f"quota_dirs counter {counters.get(keys.QUOTA_DIRS, 0)} != the quota folders")
    if quota_dirs:
        recount = {ino: [0, 0] for ino in quota_dirs}

        def block_get(key):
            ino, index = keys.parse_block_key(key)
            return blocks.get(ino, {}).get(index)

        for ino, inode in inodes.items():
            if ino in orphaned:
                continue
            space = file_charge(block_get, ino, inode)
            cur = ino
            for _ in range(10_000):
                if cur in recount:
                    recount[cur][0] += 1
                    recount[cur][1] += space
                if not cur or cur not in inodes:
                    break
                cur = inodes[cur].parent
        for ino, quota in quota_dirs.items():
            if [quota.ns_used, quota.ds_used] != recount[ino]:
                problem(f"quota folder inode {ino} stores usage {quota.ns_used} names, "
                        f"{quota.ds_used} bytes; a recount finds {recount[ino][0]}, "
                        f"{recount[ino][1]}")

    # under construction ↔ U keys ↔ leases
    uc_inodes = {ino: inode.uc.holder for ino, inode in inodes.items()
                 if inode.type == FILE and inode.uc and ino not in orphaned}
    for ino in set(uc_keys) & orphaned:
        problem(f"U key for inode {ino} inside a detached subtree (its lease must have ended "
                f"at the delete)")
    for ino, holder in uc_inodes.items():
        if uc_keys.get(ino) != holder:
            problem(f"file inode {ino} is under construction by {holder!r}, U key says "
                    f"{uc_keys.get(ino)!r}")
    for ino in set(uc_keys) - set(uc_inodes) - orphaned:
        problem(f"U key for inode {ino}, which is not a file under construction")
    if leases is not None:
        by_ino = dict(leases.lease_by_ino)
        if by_ino != uc_inodes:
            diff = set(by_ino.items()) ^ set(uc_inodes.items())
            problem(f"leases disagree with files under construction: {sorted(diff)[:10]}")
    return problems


# ------------------------------------------------------------------------------ records
class RecordCheck(Txn):
    """The replay checker's view of one record (``meta.journal.ops.CheckView``): the store as
    decoded values, with an in-memory overlay for the earlier moves of a RENAMES record (the
    namespace's batch view; ``commit`` is never called, so the store itself is never
    written), the problems found, and the checks several ops share."""

    __slots__ = ("formatted", "problems", "_prefix")

    def __init__(self, kv, record):
        super().__init__(kv)
        self.formatted = kv.get(keys.meta_key(keys.NAMESPACE_ID)) is not None
        self.problems: list[str] = []
        self._prefix = f"txid {record.txid} {record.op}: "

    def problem(self, text: str) -> None:
        self.problems.append(self._prefix + text)

    def inode(self, ino):
        return self.get(keys.inode_key(ino)) if isinstance(ino, int) else None

    def entry(self, parent, name):
        if not isinstance(parent, int) or not isinstance(name, str):
            return None
        return self.get(keys.dentry_key(parent, name))

    def linked(self, ino: int) -> bool:
        """Reachable from the root by parent pointers (not inside a detached subtree)."""
        for _ in range(10_000):
            if ino == keys.ROOT_INO:
                return True
            inode = self.inode(ino)
            if inode is None or inode.parent in (None, 0):
                return False
            ino = inode.parent
        return False

    def live_dir(self, parent, label: str) -> bool | None:
        """None (a problem) when ``parent`` is not a directory; else whether it is linked
        to the root (a detached one is a problem too, but names below it can be checked)."""
        parent_inode = self.inode(parent)
        if parent_inode is None or parent_inode.type != DIR:
            self.problem(f"{label} inode {parent} is not a directory")
            return None
        if not self.linked(parent):
            self.problem(f"{label} inode {parent} is detached")
            return False
        return True

    def new_dirs(self, dirs) -> set:
        """MKDIR/ADD/SYMLINK ``dirs``: each parent a directory, each name free, each inode
        id unused; returns the new inode ids."""
        made: set = set()
        for d in dirs or ():
            parent, name, ino = d.get("parent"), d.get("name"), d.get("ino")
            if parent not in made and self.live_dir(parent, f"new directory {name!r}: parent") \
                    and self.entry(parent, name) is not None:
                self.problem(f"new directory {name!r} in inode {parent}: the name exists "
                             f"(inode {self.entry(parent, name)})")
            if self.inode(ino) is not None:
                self.problem(f"new directory {name!r}: inode id {ino} is in use")
            made.add(ino)
        return made

    def new_entry(self, parent, name, ino, made, overwrite=None) -> None:
        """A new entry: its name free (or naming the file ``overwrite`` replaces)."""
        if parent not in made and self.live_dir(parent, f"{name!r}: parent") is None:
            return
        current = None if parent in made else self.entry(parent, name)
        if current != overwrite:
            self.problem(f"entry {name!r} in inode {parent} is {current}, the planner saw "
                         f"{overwrite}")
        elif overwrite is not None:
            replaced = self.inode(overwrite)
            if replaced is None or replaced.type == DIR:
                self.problem(f"overwritten inode {overwrite} is not a file")
        if self.inode(ino) is not None:
            self.problem(f"{name!r}: new inode id {ino} is in use")

    def rename(self, one) -> None:
        """One move (a RENAME op, or one of a RENAMES); the view then shows it done."""
        ino = one.ino
        src = self.entry(one.src_parent, one.src_name)
        moved = self.inode(ino)
        if src != ino or moved is None:
            self.problem(f"source entry {one.src_name!r} in inode {one.src_parent} "
                         f"is {src}, the planner moved inode {ino}")
            return
        dst_parent, dst_name = one.dst_parent, one.dst_name
        if self.live_dir(dst_parent, "destination parent") is None:
            return
        if inside(self, dst_parent, ino):
            self.problem(f"destination parent inode {dst_parent} is inside the moved inode "
                         f"{ino} (a cycle)")
        current = self.entry(dst_parent, dst_name)
        overwrite = one.overwrite
        if current != overwrite:
            self.problem(f"destination entry {dst_name!r} in inode {dst_parent} is {current}, "
                         f"the planner saw {overwrite}")
        elif overwrite is not None:
            replaced = self.inode(overwrite)
            if overwrite == ino or replaced is None:
                self.problem(f"overwritten inode {overwrite} is missing or the moved inode")
            elif (replaced.type == DIR) != (moved.type == DIR):
                self.problem(f"overwrite of inode {overwrite} ({replaced.type}) by "
                             f"inode {ino} ({moved.type})")
            elif replaced.type == DIR and (replaced.children or 0):
                self.problem(f"overwritten directory inode {overwrite} is not empty")
        # what the next move of a RENAMES record sees
        self.delete(keys.dentry_key(one.src_parent, one.src_name))
        if overwrite is not None:
            self.delete(keys.inode_key(overwrite))
        self.put(keys.dentry_key(dst_parent, dst_name), ino)
        self.put(keys.inode_key(ino), moved.replace(parent=dst_parent, name=dst_name))

    def open_file(self, ino, *, linked: bool) -> dict | None:
        """A file under construction (``linked``: and reachable from the root)."""
        inode = self.inode(ino)
        if inode is None or inode.type != FILE:
            self.problem(f"inode {ino} is not a file")
            return None
        if linked and not self.linked(ino):
            self.problem(f"file inode {ino} is detached")
        if not inode.uc:
            self.problem(f"file inode {ino} is not under construction")
        return inode


def check_record(kv, record) -> list[str]:
    """The planner's preconditions of one journal record, re-checked against ``kv`` (the
    state just before the record, e.g. a fresh store a replay fills one record at a time).

    Why it exists: under fine-grained locking a mutation is planned against the applied
    state while other mutations' records wait for their fsync; if the locks let two plans
    conflict, each record is still applied without complaint (``apply`` is tolerant), so
    the damage only shows later. Replaying the journal serially and checking every record
    before applying it shows exactly which record was planned on a state it did not run on.

    Checked here: FORMAT on an unformatted store and every other op on a formatted one, a
    record whose args do not fit its op; the rest is each op's ``check`` (``meta.journal.ops``):
    MKDIR, ADD, SYMLINK: each new directory's parent is a directory, its name is free and
    its inode id unused, the new entry's name is free (ADD ``overwrite``: it names the
    current file); RENAME and each move of RENAMES in order: the source entry points to
    ``ino``, the destination parent is a linked directory not inside the moved inode (no
    cycle), the destination entry is absent or is ``overwrite`` (an empty directory for a
    directory, a non-directory otherwise); DELETE: the entry points to ``ino``; writer ops
    by inode id (ADD_BLOCK, UPDATE_BLOCKS, FSYNC, ABANDON_BLOCK, CLOSE, INLINE): a linked
    file under construction, block indexes at its end; REASSIGN_LEASE, COMMIT_BLOCK_SYNC: a
    file under construction; set* ops: the inode exists; RECLAIM: its orphan root is
    detached. Unknown ops are not checked. Returns problems (empty: fine); reads only."""
    view = RecordCheck(kv, record)
    cls = OPS.get(record.op)
    if cls is not None and not cls.needs_format:
        pass   # FORMAT: its own check
    elif not view.formatted:
        view.problem("before FORMAT")
        return view.problems
    if cls is None:
        return view.problems
    try:
        op = cls.from_args(record.args)
    except (MalformedRecord, TypeError, AttributeError) as exc:
        view.problem(f"malformed record: {exc}")
        return view.problems
    op.check(view)
    return view.problems
