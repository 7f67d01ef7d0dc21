"""``apply(records)``: the only writer of the namespace store, used live (by the journal's
syncer after the fsync) and at replay, and the per-op appliers it dispatches to.

Why it exists: applying is apart from planning so that replay needs nothing but the
records: every decision is in the record, the appliers only execute it. ``RecordApplier``
is a mixin of ``meta.namespace.Namespace``. ``Txn`` (a batch's overlay: reads see the
batch's earlier writes) and ``inside`` are public for the replay checker
(``meta.invariants``), which re-checks records against the same batch view.

Purity / concurrency contract: deterministic from the records and the state before them;
ALL records of a batch go to the store in ONE ``kv.write`` with the applied txid, then the
cache, the orphan set/reclaim cursors (``ReclaimPlanner.note_*``) and the counters
(``Namespace.adopt_counters``) follow what was written, in the same synchronous step.
Trio thread only, no awaits.
"""

from __future__ import annotations

import bisect
import itertools
import logging

from fs.errors import InternalError

from . import keys
from .blocks import COMMITTED, COMPLETE, UNDER_CONSTRUCTION
from .namespace_args import DIR, FILE, SYMLINK
from .namespace_quota import file_charge
from .namespace_view import ABSENT

log = logging.getLogger(__name__)

# ops that change one file's space (``ino``): the applier charges the difference of its
# ``file_charge`` before and after to the quota folders above it
FILE_SPACE_OPS = frozenset({"ADD_BLOCK", "UPDATE_BLOCKS", "FSYNC", "ABANDON_BLOCK", "CLOSE",
                            "INLINE", "COMMIT_BLOCK_SYNC", "TRUNCATE", "APPEND",
                            "SET_REPLICATION"})


# ---------------------------------------------------------------------------- overlay
class Txn:
    """A batch's view of the store: reads see the batch's own earlier writes.

    ``puts`` is a plain dict (a live batch is a few small records; keeping it sorted on
    every put cost more than the rest of the overlay); the sorted key list the rare
    ``scan`` needs is built on demand and kept until a new key is put.

    With ``cache`` (the namespace's ``DecodedCache``, live apply) an inode or entry it holds
    is read from there instead of a LevelDB get + decode (a create read its parent and a
    complete its file that way, dearer as the store grows): an inode comes as a shallow
    copy, which is enough because the appliers replace an inode's nested values (``uc``,
    ...) and never change them in place."""

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
                if value is ABSENT:
                    return None
                return dict(value) if type(value) is dict else value
        raw = self.kv.get(key)
        return None if raw is None else keys.unpack(raw)

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
        merged = {k: keys.unpack(v) for k, v in merged.items() if k not in self.puts}
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
        ino = inode["parent"]
    return False


class RecordApplier:
    """``apply`` and one ``_apply_<OP>`` per journal op (a mixin of ``Namespace``)."""

    def apply(self, records) -> list[dict]:
        """Apply a batch of journal records in one store write; returns effects per record."""
        txn = Txn(self.kv, self.cache)
        counters = dict(self.counters)
        effects = []
        for record in records:
            handler = getattr(self, "_apply_" + record.op, None)
            if handler is None:
                raise InternalError(f"journal txid {record.txid}: unknown op {record.op!r}")
            if record.op != "FORMAT" and keys.NAMESPACE_ID not in counters:
                raise InternalError(f"journal txid {record.txid}: {record.op} before FORMAT")
            charged = None
            if record.op in FILE_SPACE_OPS and counters.get(keys.QUOTA_DIRS):
                ino = record.args["ino"]
                charged = file_charge(txn.get, ino, txn.get(keys.inode_key(ino)))
            effect = handler(txn, counters, record.args) or {}
            if charged is not None:
                inode = txn.get(keys.inode_key(ino))
                if inode is not None:
                    self._charge_usage(txn, counters, inode["parent"], 0,
                                       file_charge(txn.get, ino, inode) - charged)
            effect["op"] = record.op
            effects.append(effect)
            counters[keys.APPLIED_TXID] = record.txid
        for name, value in counters.items():
            if self.counters.get(name) != value:
                txn.put(keys.meta_key(name), value)
        try:
            txn.commit()
        except BaseException:   # a failed write may have landed partly: forget, not guess
            self.cache.clear()
            raise
        self.cache.committed(txn.puts, txn.dels)
        for key in txn.put_keys(keys.ORPHAN):
            self.note_orphan(keys.parse_orphan_key(key))
        for effect in effects:
            if effect["op"] == "RECLAIM":
                self.note_reclaimed(effect)
        self.adopt_counters(counters)
        return effects

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
    def _charge_usage(txn: Txn, counters, ino: int, names: int, space: int) -> None:
        """Add ``names``/``space`` to the usage of every quota folder at and above ``ino``."""
        if not (names or space) or not counters.get(keys.QUOTA_DIRS):
            return
        for _ in range(10_000):
            if not ino:
                return
            inode = txn.get(keys.inode_key(ino))
            if inode is None:
                return
            quota = inode.get("quota")
            if quota is not None:   # replaced, never changed in place (the cache shares it)
                inode["quota"] = {**quota, "ns_used": quota["ns_used"] + names,
                                  "ds_used": quota["ds_used"] + space}
                txn.put(keys.inode_key(ino), inode)
            ino = inode["parent"]

    @staticmethod
    def _touch_dir(txn: Txn, ino: int, time: int, children_delta: int, child: dict | None) -> None:
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

    def _link(self, txn: Txn, counters, parent: int, name: str, ino: int, inode: dict,
              time: int) -> None:
        txn.put(keys.inode_key(ino), inode)
        txn.put(keys.dentry_key(parent, name), ino)
        self._touch_dir(txn, parent, time, +1, inode)
        self._charge_usage(txn, counters, parent, 1, file_charge(txn.get, ino, inode))
        self._bump(counters, keys.NEXT_INO, ino)
        if inode["type"] == DIR:
            self._add(counters, keys.DIRS, 1)
        elif inode["type"] == FILE:
            self._add(counters, keys.FILES, 1)

    def _mkdirs(self, txn: Txn, counters, dirs, time: int) -> None:
        for d in dirs:
            inode = {"type": DIR, "mode": d["mode"], "owner": d["owner"], "group": d["group"],
                     "mtime": time, "atime": time, "ctime": time, "parent": d["parent"],
                     "name": d["name"], "children": 0, "subdirs": 0}
            self._link(txn, counters, d["parent"], d["name"], d["ino"], inode, time)

    def _remove_subtree(self, txn: Txn, counters, ino: int, effects: dict) -> tuple[int, int]:
        """Remove ``ino`` and everything below it (not its own dentry); returns the names
        and space it held (for the quota folders above)."""
        removed_blocks = effects.setdefault("removed_blocks", [])
        removed_uc = effects.setdefault("removed_uc", [])
        removed_inos = effects.setdefault("removed_inos", [])
        stack = [ino]
        names = space = 0
        while stack:
            cur = stack.pop()
            inode = txn.get(keys.inode_key(cur))
            if inode is None:
                log.error("apply: inode %d to remove is missing", cur)
                continue
            names += 1
            if inode["type"] == DIR:
                if inode.get("children", 1):   # an empty folder needs no scan
                    for key, child in txn.scan(keys.dentry_prefix(cur)):
                        stack.append(child)
                        txn.delete(key)
                self._add(counters, keys.DIRS, -1)
            elif inode["type"] == FILE:
                space += file_charge(txn.get, cur, inode)
                removed_blocks.extend(self._delete_blocks(txn, cur, inode))
                if inode.get("uc"):
                    txn.delete(keys.uc_key(cur))
                    removed_uc.append(cur)
                if "inline" in inode:
                    txn.delete(keys.inline_key(cur))
                self._add(counters, keys.FILES, -1)
            txn.delete(keys.inode_key(cur))
            removed_inos.append(cur)
        return names, space

    def _unlink(self, txn: Txn, counters, parent: int, name: str, ino: int, time: int,
                effects: dict, detach: bool = False, usage=None) -> None:
        """``usage``: what a detached subtree held, measured by the planner (None when no
        quota folder is above it); a removed one is measured here."""
        key = keys.dentry_key(parent, name)
        current = txn.get(key)
        if current != ino:
            log.error("apply: entry %r in %d is %r, expected %d", name, parent, current, ino)
        txn.delete(key)
        self._touch_dir(txn, parent, time, -1, txn.get(keys.inode_key(ino)))
        if detach:
            self._detach(txn, parent, name, ino, time, effects)
            names, space = usage or (0, 0)
        else:
            names, space = self._remove_subtree(txn, counters, ino, effects)
        self._charge_usage(txn, counters, parent, -names, -space)

    def _detach(self, txn: Txn, parent: int, name: str, ino: int, time: int,
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

    def _file(self, txn: Txn, ino: int) -> dict | None:
        inode = txn.get(keys.inode_key(ino))
        if inode is None or inode["type"] != FILE:
            log.error("apply: file inode %d is missing", ino)
            return None
        return inode

    def _set_block(self, txn: Txn, counters, ino: int, inode: dict, index: int,
                   block: dict) -> None:
        """Write one block key and keep the inode's length and block count in step. A file
        whose data is inline (reopened by append) keeps it, and its length, until its first
        block holds at least as many bytes (the writer sends the inline bytes first)."""
        key = keys.block_key(ino, index)
        old = txn.get(key)
        if "inline" in inode:
            if block["num_bytes"] >= inode["inline"]:
                self._drop_inline(txn, ino, inode)
                inode["length"] = block["num_bytes"]
        else:
            inode["length"] = inode.get("length", 0) - (old["num_bytes"] if old else 0) \
                + block["num_bytes"]
        inode["nblocks"] = max(inode.get("nblocks", 0), index + 1)
        txn.put(key, {"id": block["id"], "gs": block["gs"], "num_bytes": block["num_bytes"],
                      "state": block["state"]})
        self._bump(counters, keys.NEXT_BLOCK_ID, block["id"])
        self._bump(counters, keys.GENSTAMP, block["gs"])

    @staticmethod
    def _delete_blocks(txn: Txn, ino: int, inode: dict) -> list[int]:
        """Delete every block key of file ``ino``; returns the block ids. A file without
        blocks (inline or empty) is not scanned: LevelDB would walk tombstones past its
        empty range up to the next live key."""
        removed = []
        if inode.get("nblocks", 1):
            for key, block in txn.scan(keys.block_prefix(ino)):
                removed.append(block["id"])
                txn.delete(key)
        return removed

    @staticmethod
    def _drop_inline(txn: Txn, ino: int, inode: dict) -> None:
        txn.delete(keys.inline_key(ino))
        del inode["inline"]

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
                         detach=a.get("detach", False), usage=a.get("usage"))
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
        if "inline" not in inode:
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
        effects: dict = {"ino": ino, "closed": True}
        if a.get("data") is not None:
            effects["removed_blocks"] = self._store_inline(txn, ino, inode, a["data"])
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
        if a.get("mtime") is not None:   # the writer's utimens while it wrote
            inode["mtime"] = a["mtime"]
        if a.get("atime") is not None:
            inode["atime"] = a["atime"]
        if a.get("mode") is not None:    # and its chmod
            inode["mode"] = a["mode"]
        txn.put(keys.inode_key(ino), inode)
        txn.delete(keys.uc_key(ino))
        return effects

    def _apply_INLINE(self, txn, counters, a):
        ino = a["ino"]
        inode = self._file(txn, ino)
        if inode is None:
            return {}
        removed = self._store_inline(txn, ino, inode, a["data"])
        txn.put(keys.inode_key(ino), inode)
        return {"ino": ino, "removed_blocks": removed}

    def _store_inline(self, txn: Txn, ino: int, inode: dict, data: bytes) -> list[int]:
        """The file's content becomes ``data``, kept in the namespace; its blocks (at most
        the unused first block ``create`` allocated) go. Returns their ids."""
        removed = self._delete_blocks(txn, ino, inode)
        txn.put(keys.inline_key(ino), bytes(data))
        inode["inline"] = inode["length"] = len(data)
        inode["nblocks"] = 0
        return removed

    def _apply_DELETE(self, txn, counters, a):
        effects: dict = {}
        self._unlink(txn, counters, a["parent"], a["name"], a["ino"], a["time"], effects,
                     detach=a.get("detach", False), usage=a.get("usage"))
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
                txn.delete(keys.inline_key(ino))   # a no-op for a file with blocks
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
                         detach=a.get("detach", False), usage=a.get("overwritten_usage"))
        moved = a.get("usage")   # [names, space] of the moved subtree, when quotas are near
        if moved:
            self._charge_usage(txn, counters, a["src_parent"], -moved[0], -moved[1])
        inode = txn.get(keys.inode_key(ino))
        txn.delete(keys.dentry_key(a["src_parent"], a["src_name"]))
        self._touch_dir(txn, a["src_parent"], t, -1, inode)
        txn.put(keys.dentry_key(a["dst_parent"], a["dst_name"]), ino)
        self._touch_dir(txn, a["dst_parent"], t, +1, inode)
        if inode is not None:
            inode["parent"], inode["name"], inode["ctime"] = a["dst_parent"], a["dst_name"], t
            txn.put(keys.inode_key(ino), inode)
        if moved:
            self._charge_usage(txn, counters, a["dst_parent"], moved[0], moved[1])
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

    def _apply_CONCAT(self, txn, counters, a):
        """The sources' blocks become the target's next ones, in order; the sources go."""
        t_ino, t = a["target"], a["time"]
        target = self._file(txn, t_ino)
        if target is None:
            return {}
        rep = target.get("replication", 1)
        before = file_charge(txn.get, t_ino, target)
        index = target.get("nblocks", 0)
        moved = []
        removed_inos = []
        for src in a["srcs"]:
            s_ino = src["ino"]
            inode = self._file(txn, s_ino)
            if inode is None:
                continue
            before += file_charge(txn.get, s_ino, inode)
            for key, block in txn.scan(keys.block_prefix(s_ino)):
                txn.delete(key)
                txn.put(keys.block_key(t_ino, index), block)
                moved.append((block["id"], index))
                index += 1
            target["length"] = target.get("length", 0) + inode.get("length", 0)
            txn.delete(keys.inode_key(s_ino))
            txn.delete(keys.dentry_key(a["parent"], src["name"]))
            self._touch_dir(txn, a["parent"], t, -1, inode)
            self._add(counters, keys.FILES, -1)
            removed_inos.append(s_ino)
        target["nblocks"] = index
        target["mtime"] = target["ctime"] = t
        txn.put(keys.inode_key(t_ino), target)
        self._charge_usage(txn, counters, a["parent"], -len(removed_inos),
                           file_charge(txn.get, t_ino, target) - before)
        return {"ino": t_ino, "moved": moved, "replication": rep, "removed_inos": removed_inos}

    def _apply_SET_QUOTA(self, txn, counters, a):
        inode = txn.get(keys.inode_key(a["ino"]))
        if inode is None or inode.get("type") != DIR:
            log.error("apply SET_QUOTA: directory inode %d is missing", a["ino"])
            return {}
        old = inode.pop("quota", None)
        if a["ns"] >= 0 or a["ds"] >= 0:
            # a folder that had a quota kept its usage exact; a new one starts from the
            # planner's count of its subtree
            names, space = (old["ns_used"], old["ds_used"]) if old else a["usage"]
            inode["quota"] = {"ns": a["ns"], "ds": a["ds"], "ns_used": names, "ds_used": space}
        inode["ctime"] = a["time"]
        txn.put(keys.inode_key(a["ino"]), inode)
        self._add(counters, keys.QUOTA_DIRS, ("quota" in inode) - (old is not None))
        return {"ino": a["ino"]}

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
        # a reopened inline file whose first block holds less than the inline bytes: the
        # writer died before sending them all, so nothing after them was acknowledged
        # either; the block goes and the inline data stays the content
        if a["delete"] or ("inline" in inode and a["num_bytes"] < inode["inline"]):
            txn.delete(key)
            if "inline" not in inode:
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
        if "inline" in inode:
            if a["new_length"]:
                data = txn.get(keys.inline_key(ino)) or b""
                txn.put(keys.inline_key(ino), bytes(data[:a["new_length"]]))
                inode["inline"] = a["new_length"]
            else:
                self._drop_inline(txn, ino, inode)
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

    # delegation tokens (fs.delegation): the namespace keeps what each live token may still
    # do, so renewals and cancellations survive restarts as HDFS's edit log keeps them
    def _apply_DELEGATION_TOKEN(self, txn, counters, a):
        txn.put(keys.token_key(a["seq"]), a)
        counters[keys.NEXT_TOKEN] = max(counters.get(keys.NEXT_TOKEN, 1), a["seq"] + 1)
        return {"token": a}

    def _apply_RENEW_DELEGATION_TOKEN(self, txn, counters, a):
        state = txn.get(keys.token_key(a["seq"]))
        if state is None:
            return {}
        state = {**state, "expiry": a["expiry"]}
        txn.put(keys.token_key(a["seq"]), state)
        return {"token": state}

    def _apply_CANCEL_DELEGATION_TOKEN(self, txn, counters, a):
        txn.delete(keys.token_key(a["seq"]))
        return {"seq": a["seq"]}
