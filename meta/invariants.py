"""Offline consistency check of a namespace store: ``check_namespace(kv) -> [problems]``.

Why it exists: crash tests (kill -9 of the metadata server under load) end by opening the
LevelDB folder and asserting ``check_namespace(store) == []``; ``leasefs fsck`` can use it
too. It reads the whole store once and checks the schema of ``keys.py``:

* the root exists and is a directory; every inode but the root has exactly one entry
  ``D<parent><name>`` that points to it and agrees with its ``parent``/``name`` fields;
  every entry points to a live inode inside a directory; every inode is reachable from the
  root (no orphans, no cycles); directory ``children`` counts match their entries;
* block keys belong to files, indexes are 0..nblocks-1, block ids are unique, the file's
  ``length`` is the sum of its blocks; a closed file has only COMPLETE blocks, an open
  one at most its last two (the writer checks and CLOSE read only those);
* counters: ``next_ino``/``next_block_id`` above every used id, the generation stamp at
  least every block's, ``files``/``dirs`` equal the counted inodes, an applied txid exists;
* files under construction ↔ ``U`` keys (same holder), and, when a ``LeaseManager`` is
  given, ↔ its ``lease_by_ino``.
* detached subtrees (a big delete being reclaimed): everything reachable from an ``O`` key
  is legal although no entry leads to its root, and is half-removed (directory counts,
  file lengths and block lists are not checked there); the orphan root must exist, have
  ``parent`` 0 and no entry, and no ``U`` key may remain inside (their leases ended at the
  detach). Counters and block id uniqueness still include them.

Concurrency contract: reads only; call it on a store nobody writes (a stopped server's
folder, or a test's own store).
"""

from __future__ import annotations

from . import keys

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

    inodes: dict[int, dict] = {}
    for key, raw in kv.scan(keys.INODE):
        inodes[keys.parse_inode_key(key)] = keys.unpack(raw)
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
    if root is None or root.get("type") != "dir":
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
        if orphan_root.get("parent") != 0:
            problem(f"orphan root inode {root_ino} has parent {orphan_root.get('parent')}, not 0")
        walk(root_ino, orphaned, "from orphan roots")

    # entries → inodes
    linked_from: dict[int, list[tuple[int, str]]] = {}
    for parent, names in entries.items():
        parent_inode = inodes.get(parent)
        if parent_inode is None:
            problem(f"entries under missing inode {parent}: {sorted(names)[:5]}")
        elif parent_inode.get("type") != "dir":
            problem(f"entries under non-directory inode {parent}: {sorted(names)[:5]}")
        elif parent not in orphaned and parent_inode.get("children", 0) != len(names):
            problem(f"directory inode {parent} says {parent_inode.get('children')} children, "
                    f"has {len(names)} entries")
        for name, child in names.items():
            if child not in inodes:
                problem(f"entry {name!r} in inode {parent} points to missing inode {child}")
                continue
            linked_from.setdefault(child, []).append((parent, name))
    for ino, inode in inodes.items():
        if (inode.get("type") == "dir" and ino not in entries and inode.get("children", 0)
                and ino not in orphaned):
            problem(f"directory inode {ino} says {inode['children']} children, has none")

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
            problem(f"inode {ino} ({inode.get('name')!r}) has {len(links)} entries: {links[:5]}")
            continue
        parent, name = links[0]
        if inode.get("parent") != parent or inode.get("name") != name:
            problem(f"inode {ino}: parent/name ({inode.get('parent')}, {inode.get('name')!r}) "
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
        if inode is None or inode.get("type") != "file":
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
        n = inode.get("nblocks", 0)
        if sorted(by_index) != list(range(n)):
            problem(f"file inode {ino}: nblocks {n} but block indexes {sorted(by_index)[:10]}")
        length = 0
        for index, block in sorted(by_index.items()):
            length += block.get("num_bytes", 0)
            max_gs = max(max_gs, block.get("gs", 0))
            if block["id"] in seen_ids:
                problem(f"block id {block['id']} used by inodes {seen_ids[block['id']]} and {ino}")
            seen_ids[block["id"]] = ino
            if not inode.get("uc") and block.get("state") != "COMPLETE":
                problem(f"closed file inode {ino}: block {block['id']} is {block.get('state')}")
            elif index < n - 2 and block.get("state") != "COMPLETE":
                problem(f"open file inode {ino}: block {block['id']} (#{index} of {n}) is "
                        f"{block.get('state')}; only the last two may be incomplete")
        if length != inode.get("length", 0):
            problem(f"file inode {ino}: length {inode.get('length')} != sum of blocks {length}")
    for ino, inode in inodes.items():
        if (inode.get("type") == "file" and inode.get("nblocks", 0) and ino not in blocks
                and ino not in orphaned):
            problem(f"file inode {ino}: nblocks {inode['nblocks']} but no block keys")

    # counters
    if inodes and counters.get(keys.NEXT_INO, 0) <= max(inodes):
        problem(f"next_ino {counters.get(keys.NEXT_INO)} is not above the largest inode {max(inodes)}")
    if seen_ids and counters.get(keys.NEXT_BLOCK_ID, 0) <= max(seen_ids):
        problem(f"next_block_id {counters.get(keys.NEXT_BLOCK_ID)} is not above the largest "
                f"block id {max(seen_ids)}")
    if counters.get(keys.GENSTAMP, 0) < max_gs:
        problem(f"generation stamp {counters.get(keys.GENSTAMP)} is below a block's {max_gs}")
    n_files = sum(1 for i in inodes.values() if i.get("type") == "file")
    n_dirs = sum(1 for i in inodes.values() if i.get("type") == "dir")
    if counters.get(keys.FILES, 0) != n_files:
        problem(f"files counter {counters.get(keys.FILES)} != {n_files} file inodes")
    if counters.get(keys.DIRS, 0) != n_dirs:
        problem(f"dirs counter {counters.get(keys.DIRS)} != {n_dirs} directory inodes")

    # under construction ↔ U keys ↔ leases
    uc_inodes = {ino: inode["uc"]["holder"] for ino, inode in inodes.items()
                 if inode.get("type") == "file" and inode.get("uc") and ino not in orphaned}
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
