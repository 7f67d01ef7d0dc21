"""Namespace conformance: every namespace op, its errors, and restart by journal replay,
over both KV stores (MemoryStore and real LevelDB) with the real journal in tmp_path.

The namespace is driven exactly as the server drives it: ``plan_*`` validates and decides,
``journal.log`` makes the record durable and calls ``Namespace.apply``.
"""

from __future__ import annotations

import pytest
import trio

from fs import errors
from meta.namespace.invariants import check_namespace
from meta.journal.journal import Journal
from meta.journal.kv import MemoryStore, PlyvelStore
from meta.namespace.namespace import Defaults, Namespace
from meta.journal.ops import Effect, to_wire

BPC = 512
STORES = ["memory", "leveldb"]


def make_store(kind, path):
    return MemoryStore() if kind == "memory" else PlyvelStore(str(path))


def dump(store) -> dict:
    return {k: v for k, v in store.scan(b"") if not k.startswith(b"\x00")}


class Harness:
    """A namespace on a store with its journal running; ``do`` = log a plan."""

    def __init__(self, store, journal_dir, delete_chunk=2000):
        self.store = store
        self.ns = Namespace(store, Defaults(block_size=8 * BPC, replication=3,
                                           max_replication=8, bytes_per_checksum=BPC,
                                           min_block_size=BPC, delete_chunk=delete_chunk))
        self.effects: list[Effect] = []
        self.journal = Journal(str(journal_dir), self._apply)
        self.t = 1_000_000

    def _apply(self, records):
        self.effects.extend(self.ns.apply(records))

    def now(self) -> int:
        self.t += 1000
        return self.t

    async def do(self, plan):
        if plan is None:
            return None
        return await self.journal.log(plan)

    # shorthands for the common plans
    async def mkdirs(self, path, **kw):
        return await self.do(self.ns.planner.plan_mkdirs(path, now_ns=self.now(), **kw))

    async def create(self, path, holder="w1", **kw):
        await self.do(self.ns.planner.plan_create(path, holder=holder, now_ns=self.now(), **kw))
        return self.ns.view.get_file_info(path)

    async def add_block(self, path, holder="w1", previous=None, replication_targets=("n1",)):
        _, ino, inode = self.ns.planner.writer_file(path, None, holder)
        blocks = self.ns.view.tail_blocks(ino, inode)
        kind, last = self.ns.planner.check_previous(path, blocks, previous, inode.block_size)
        assert kind in ("first", "commit", "committed"), kind
        commit = {"num_bytes": previous["num_bytes"]} if kind == "commit" else None
        block_id, gs = self.ns.ids.allocate_block_id(), self.ns.ids.next_genstamp()
        await self.do(self.ns.planner.plan_add_block(ino, blocks, block_id, gs, commit,
                                             list(replication_targets), self.now()))
        return {"id": block_id, "gs": gs, "num_bytes": 0}

    async def close(self, path, holder="w1", last=None):
        _, ino, inode = self.ns.planner.writer_file(path, None, holder)
        blocks = self.ns.view.tail_blocks(ino, inode)
        kind, block = self.ns.planner.check_last(path, blocks, last)
        await self.do(self.ns.planner.plan_close(ino, block, last["num_bytes"] if last else None,
                                         self.now()))

    async def write_file(self, path, sizes, holder="w1"):
        """create + blocks of the given sizes + close; returns the block ids."""
        await self.create(path, holder=holder)
        previous = None
        ids = []
        for size in sizes:
            block = await self.add_block(path, holder, previous)
            ids.append(block["id"])
            previous = {**block, "num_bytes": size}
        await self.close(path, holder, previous)
        return ids


async def run_ns(kind, tmp_path, body, *, store=None, journal_dir=None, format_=True,
                 delete_chunk=2000):
    """Open a store + journal (replaying what the store lacks), run ``body(h)``."""
    store = store if store is not None else make_store(kind, tmp_path / "db")
    h = Harness(store, journal_dir or tmp_path / "journal", delete_chunk=delete_chunk)

    h.journal.open()
    records = list(h.journal.replay(h.ns.view.applied_txid))
    if records:
        h.ns.apply(records)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.journal.run)
        if format_ and not h.ns.view.formatted:
            await h.journal.log(h.ns.planner.plan_format(4242, 1_000_000))
        await body(h)
        nursery.cancel_scope.cancel()
    await h.journal.aclose()
    return h


def assert_consistent(h):
    assert check_namespace(h.store) == []


@pytest.fixture(params=STORES)
def kind(request):
    return request.param


# --------------------------------------------------------------------------- mkdirs / create


async def test_mkdirs_creates_every_missing_parent_and_counts_entries(kind, tmp_path):
    async def body(h):
        root_mtime = h.ns.view.get_file_info("/")["mtime_ns"]
        await h.mkdirs("/a/b/c", permission=0o750)
        a, b, c = (h.ns.view.get_file_info(p) for p in ("/a", "/a/b", "/a/b/c"))
        assert [a["type"], b["type"], c["type"]] == ["dir"] * 3
        assert c["mode"] == 0o750 and b["mode"] == 0o750 | 0o300
        assert c["parent"] == b["ino"] and b["parent"] == a["ino"]
        assert a["children"] == 1 and c["children"] == 0
        assert h.ns.view.get_file_info("/")["mtime_ns"] > root_mtime
        assert h.ns.view.get_file_info("/a/b/c/")["ino"] == c["ino"]   # trailing slash tolerated
        # existing directory: nothing to do; a file in the way: FileExists / NotDirectory
        assert h.ns.planner.plan_mkdirs("/a/b", now_ns=h.now()) is None
        await h.create("/a/f")
        with pytest.raises(errors.FileExists):
            h.ns.planner.plan_mkdirs("/a/f", now_ns=h.now())
        with pytest.raises(errors.NotDirectory):
            h.ns.planner.plan_mkdirs("/a/f/x", now_ns=h.now())
        assert h.ns.view.dir_count() == 4 and h.ns.view.file_count() == 1
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_create_rules_and_lease_conflicts(kind, tmp_path):
    async def body(h):
        st = await h.create("/d/new.txt", holder="w1", replication=2, permission=0o600)
        assert st["type"] == "file" and st["under_construction"] and st["replication"] == 2
        assert st["mode"] == 0o600 and st["length"] == 0
        assert h.ns.view.get_file_info("/d")["type"] == "dir"      # create_parent default
        assert h.ns.view.under_construction() == {st["ino"]: "w1"}
        with pytest.raises(errors.AlreadyBeingCreated, match="already the current lease holder"):
            h.ns.planner.plan_create("/d/new.txt", holder="w1", now_ns=h.now())
        with pytest.raises(errors.AlreadyBeingCreated, match="currently owned by w1"):
            h.ns.planner.plan_create("/d/new.txt", holder="w2", now_ns=h.now())
        with pytest.raises(errors.FileNotFound, match="/x/y"):
            h.ns.planner.plan_create("/x/y/z", holder="w1", create_parent=False, now_ns=h.now())
        with pytest.raises(errors.IsDirectory):
            h.ns.planner.plan_create("/d", holder="w1", overwrite=True, now_ns=h.now())
        with pytest.raises(errors.IsDirectory):
            h.ns.planner.plan_create("/", holder="w1", now_ns=h.now())
        with pytest.raises(errors.NotDirectory):
            h.ns.planner.plan_create("/d/new.txt/sub", holder="w1", now_ns=h.now())
        for bad in ({"replication": 0}, {"replication": 99}, {"replication": "3"},
                    {"block_size": BPC + 1}, {"block_size": 0}, {"permission": 0o17777},
                    {"permission": True}, {"overwrite": "yes"}):
            with pytest.raises(errors.InvalidArgument):
                h.ns.planner.plan_create("/d/other", holder="w1", now_ns=h.now(), **bad)
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_create("/d/other", holder="", now_ns=h.now())
        # a closed file: FileExists without overwrite; overwrite replaces it in one record
        ids = await h.write_file("/d/closed", [BPC * 8, 100])
        with pytest.raises(errors.FileExists):
            h.ns.planner.plan_create("/d/closed", holder="w2", now_ns=h.now())
        old = h.ns.view.get_file_info("/d/closed")
        h.effects.clear()
        new = await h.create("/d/closed", holder="w2", overwrite=True)
        assert new["ino"] != old["ino"] and new["length"] == 0 and new["under_construction"]
        assert list(h.effects[-1].removed_blocks) == ids
        assert h.ns.view.get_inode(old["ino"]) is None and h.ns.view.blocks_of(old["ino"]) == []
        # overwrite of a file under construction takes it from its writer
        h.effects.clear()
        await h.create("/d/new.txt", holder="w3", overwrite=True)
        assert h.effects[-1].removed_uc == (st["ino"],)
        with pytest.raises(errors.FileNotFound):
            h.ns.planner.writer_file("/d/new.txt", st["ino"], "w1")
        assert h.ns.view.get_file_info("/d")["children"] == 2
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


BAD_PATHS = [("", errors.InvalidPath), ("relative", errors.InvalidPath),
             ("/a//b", errors.InvalidPath), ("/a/../b", errors.InvalidPath),
             ("/a/./b", errors.InvalidPath), ("/a\0b", errors.InvalidPath),
             (12345, errors.InvalidPath), ("/" + "n" * 256, errors.NameTooLong),
             ("/a/" + "é" * 200, errors.NameTooLong), ("/x" * 4001, errors.NameTooLong)]


@pytest.mark.parametrize("bad,error", BAD_PATHS)
async def test_bad_paths_are_refused_and_change_nothing(kind, tmp_path, bad, error):
    async def body(h):
        await h.write_file("/keep/file", [10])
        before = dump(h.store)
        t = h.now()
        planners = [
            lambda: h.ns.planner.plan_mkdirs(bad, now_ns=t),
            lambda: h.ns.planner.plan_create(bad, holder="w1", now_ns=t),
            lambda: h.ns.planner.plan_delete(bad, True, now_ns=t),
            lambda: h.ns.renames.plan_rename("/keep/file", bad, now_ns=t),
            lambda: h.ns.renames.plan_rename(bad, "/keep/x", now_ns=t),
            lambda: h.ns.planner.plan_set_permission(bad, 0o700, now_ns=t),
            lambda: h.ns.planner.plan_symlink("/keep", bad, now_ns=t),
            lambda: h.ns.view.get_file_info(bad),
            lambda: h.ns.view.list_status(bad),
            lambda: h.ns.planner.writer_file(bad, None, "w1"),
        ]
        for planner in planners:
            with pytest.raises(error):
                planner()
        assert dump(h.store) == before

    await run_ns(kind, tmp_path, body)


# --------------------------------------------------------------------------- blocks


async def test_block_lifecycle_commit_fsync_abandon_close(kind, tmp_path):
    async def body(h):
        st = await h.create("/f", holder="w1")
        ino = st["ino"]
        bs = h.ns.view.get_inode(ino).block_size
        b1 = await h.add_block("/f")
        assert h.ns.view.blocks_of(ino) == [{"index": 0, "id": b1["id"], "gs": b1["gs"],
                                         "num_bytes": 0, "state": "UNDER_CONSTRUCTION"}]
        # a retried first add_block (reply lost) gets the same block back
        assert h.ns.planner.check_previous("/f", h.ns.view.blocks_of(ino), None, bs)[0] == "retry"
        # hsync records the length of the block being written
        await h.do(h.ns.planner.plan_fsync("/f", ino, h.ns.view.blocks_of(ino), 300))
        assert h.ns.view.get_file_info("/f")["length"] == 300
        assert h.ns.planner.plan_fsync("/f", ino, h.ns.view.blocks_of(ino), 200) is None  # never shrinks
        # add_block commits previous
        b2 = await h.add_block("/f", previous={**b1, "num_bytes": 8 * BPC})
        blocks = h.ns.view.blocks_of(ino)
        assert [b["state"] for b in blocks] == ["COMMITTED", "UNDER_CONSTRUCTION"]
        assert h.ns.view.get_file_info("/f")["length"] == 8 * BPC
        # previous that is not the last block / bigger than a block / stale gs
        with pytest.raises(errors.InvalidArgument, match="not the file's last block"):
            h.ns.planner.check_previous("/f", blocks, {**b1, "num_bytes": 10, "id": 999}, bs)
        with pytest.raises(errors.StaleGenerationStamp):
            h.ns.planner.check_previous("/f", blocks, {**b2, "gs": b2["gs"] - 1, "num_bytes": 5},
                                     bs)
        with pytest.raises(errors.InvalidArgument, match="exceeds"):
            h.ns.planner.check_block_length("/f", h.ns.view.get_inode(ino), 8 * BPC + 1)
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.check_previous("/f", blocks, None, bs)
        # abandon the last UC block, then a retried abandon is a no-op
        await h.do(h.ns.planner.plan_abandon("/f", ino, blocks, b2))
        assert [b["id"] for b in h.ns.view.blocks_of(ino)] == [b1["id"]]
        assert h.ns.planner.plan_abandon("/f", ino, h.ns.view.blocks_of(ino), b2) is None
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_abandon("/f", ino, h.ns.view.blocks_of(ino), b1)   # committed, not UC
        b3 = await h.add_block("/f", previous={**b1, "num_bytes": 8 * BPC})
        # writer checks: other holder, missing file
        with pytest.raises(errors.LeaseExpired, match="not the lease owner"):
            h.ns.planner.writer_file("/f", ino, "intruder")
        with pytest.raises(errors.FileNotFound):
            h.ns.planner.writer_file("/nope", None, "w1")
        # complete with the wrong last block, then right
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.check_last("/f", h.ns.view.blocks_of(ino), {**b1, "num_bytes": 1})
        await h.close("/f", "w1", {**b3, "num_bytes": 77})
        info = h.ns.view.get_file_info("/f")
        assert not info["under_construction"] and info["length"] == 8 * BPC + 77
        assert [b["state"] for b in h.ns.view.blocks_of(ino)] == ["COMPLETE", "COMPLETE"]
        assert h.ns.view.under_construction() == {}
        assert h.ns.planner.closed_with("/f", ino, {**b3, "num_bytes": 77})
        assert not h.ns.planner.closed_with("/f", ino, {**b3, "num_bytes": 78})
        with pytest.raises(errors.LeaseExpired, match="not open for writing"):
            h.ns.planner.writer_file("/f", ino, "w1")
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_add_block_marks_blocks_before_previous_complete(kind, tmp_path):
    async def body(h):
        await h.create("/big")
        prev = None
        for _ in range(4):
            b = await h.add_block("/big", previous=prev)
            prev = {**b, "num_bytes": 8 * BPC}
        states = [b["state"] for b in h.ns.view.blocks_of(h.ns.view.get_file_info("/big")["ino"])]
        assert states == ["COMPLETE", "COMPLETE", "COMMITTED", "UNDER_CONSTRUCTION"]
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_add_block_after_a_separate_commit_still_completes_the_block_before(kind, tmp_path):
    """add_block whose previous was committed by an earlier call (the NotReplicatedYet
    path) still names it, so only the last two blocks are ever incomplete in the store."""
    async def body(h):
        await h.create("/f")
        b0 = await h.add_block("/f")
        b1 = await h.add_block("/f", previous={**b0, "num_bytes": 8 * BPC})
        ino = h.ns.view.get_file_info("/f")["ino"]
        tail = h.ns.view.tail_blocks(ino, h.ns.view.get_inode(ino))
        await h.do(h.ns.planner.plan_commit(ino, tail[-1], 8 * BPC))   # committed on its own
        await h.add_block("/f", previous={**b1, "num_bytes": 8 * BPC})   # kind "committed"
        states = [b["state"] for b in h.ns.view.blocks_of(ino)]
        assert states == ["COMPLETE", "COMMITTED", "UNDER_CONSTRUCTION"]
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_add_block_without_previous_after_an_append_to_a_full_last_block(kind, tmp_path):
    """HDFS: an append to a file whose last block is full answers no block, so Hadoop's
    writer names no ``previous`` for its first new block; no ``previous`` is still refused
    once that block is there (a stale call: its retry is the retry cache's) or the last
    block is partial."""
    async def body(h):
        full = 8 * BPC
        await h.write_file("/full", [full])
        await h.write_file("/part", [full - 1])
        for path in ("/full", "/part"):
            ino = h.ns.view.get_file_info(path)["ino"]
            await h.do(h.ns.planner.plan_append(ino, h.ns.view.get_inode(ino), holder="w2",
                                                new_gs=None, now_ns=h.now()))
        with pytest.raises(errors.InvalidArgument, match="previous is missing"):
            h.ns.planner.check_previous("/part", h.ns.view.blocks_of(
                h.ns.view.get_file_info("/part")["ino"]), None, full)
        ino = h.ns.view.get_file_info("/full")["ino"]
        assert h.ns.planner.check_previous("/full", h.ns.view.blocks_of(ino), None,
                                           full)[0] == "committed"
        new = await h.add_block("/full", "w2")
        with pytest.raises(errors.InvalidArgument, match="previous is missing"):
            h.ns.planner.check_previous("/full", h.ns.view.blocks_of(ino), None, full)
        await h.close("/full", "w2", {**new, "num_bytes": 100})
        assert h.ns.view.get_file_info("/full")["length"] == full + 100
        assert [b["state"] for b in h.ns.view.blocks_of(ino)] == ["COMPLETE", "COMPLETE"]
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


class CountingStore:
    """A store that counts the block keys (``B...``) read by ``get`` or yielded by ``scan``."""

    def __init__(self, inner):
        self.inner = inner
        self.block_reads = 0

    def get(self, key):
        if key[:1] == b"B":
            self.block_reads += 1
        return self.inner.get(key)

    def scan(self, prefix, start=None, limit=None):
        for key, value in self.inner.scan(prefix, start=start, limit=limit):
            if key[:1] == b"B":
                self.block_reads += 1
            yield key, value

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _long_file(store, sizes, block_size=8 * BPC, **limits):
    """A namespace holding /long with blocks of ``sizes`` (the last under construction),
    built by applying journal records directly (no fsync per block)."""
    from meta.journal.files import Record

    ns = Namespace(store, Defaults(block_size=block_size, replication=1,
                                   bytes_per_checksum=BPC, min_block_size=BPC, **limits))
    txid = 0

    def apply(*plans):
        nonlocal txid
        records = []
        for op, args in map(to_wire, plans):
            txid += 1
            records.append(Record(txid, op, args))
        ns.apply(records)

    apply(ns.planner.plan_format(7, 1))
    apply(ns.planner.plan_create("/long", holder="w", now_ns=2))
    ino = ns.view.get_file_info("/long")["ino"]
    tail: list[dict] = []
    plans = []
    for size in sizes:   # the planners see the tail the previous record left behind
        commit = {"num_bytes": tail[-1]["num_bytes"]} if tail else None
        plan = ns.planner.plan_add_block(ino, tail, ns.ids.allocate_block_id(), ns.ids.next_genstamp(),
                                 commit, ["n1"], 3)
        plans.append(plan)
        tail = [{"index": plan.index, "id": plan.block["id"], "gs": plan.block["gs"],
                 "num_bytes": size, "state": "UNDER_CONSTRUCTION"}]
        if len(plans) == 500:
            apply(*plans)
            plans = []
    apply(*plans)
    if sizes:   # hsync recorded the length of the last block
        apply(ns.planner.plan_fsync("/long", ino, ns.view.tail_blocks(ino, ns.view.get_inode(ino), 1), sizes[-1]))
    return ns, ino


def _reference_range(ns, ino, offset, end):
    out, pos = [], 0
    blocks = ns.view.blocks_of(ino)
    for block in blocks:
        if pos < end and (pos + block["num_bytes"] > offset or block is blocks[-1]):
            out.append((block["id"], pos))
        pos += block["num_bytes"]
    return out


def test_writer_calls_read_only_the_last_blocks_of_a_long_file(kind, tmp_path):
    """Finding 8: add_block/complete/fsync checks and get_block_locations of a range read a
    bounded number of block keys, not all of a 3000-block file's."""
    full = 8 * BPC
    store = CountingStore(make_store(kind, tmp_path / "db"))
    try:
        ns, ino = _long_file(store, [full] * 2999 + [700])
        inode = ns.view.get_inode(ino)
        assert inode.nblocks == 3000 and inode.length == 2999 * full + 700
        store.block_reads = 0
        tail = ns.view.tail_blocks(ino, inode)
        assert [b["index"] for b in tail] == [2998, 2999] and store.block_reads == 2
        previous = {"id": tail[-1]["id"], "gs": tail[-1]["gs"], "num_bytes": full}
        assert ns.planner.check_previous("/long", tail, previous, inode.block_size)[0] == "commit"
        plan = ns.planner.plan_add_block(ino, tail, 10**6, ns.ids.next_genstamp(),
                                 {"num_bytes": full}, ["n1"], 4)
        assert plan.index == 3000 and plan.previous["index"] == 2999
        assert ns.planner.plan_fsync("/long", ino, tail[-1:], 800).index == 2999
        for offset, length in ((0, 1), (1234 * full + 5, 2 * full), (2999 * full - 1, 10),
                               (2999 * full + 699, 1), (5 * full, 0), (10**9, 5)):
            store.block_reads = 0
            got = [(b["id"], pos) for b, pos in
                   ns.view.blocks_in_range(ino, inode, offset, offset + length)]
            reads = store.block_reads
            assert got == _reference_range(ns, ino, offset, offset + length), (offset, length)
            assert reads <= 5, (offset, length, reads)
        assert check_namespace(store) == []
    finally:
        store.inner.close()


def test_block_ranges_with_a_short_block_in_the_middle_are_exact(kind, tmp_path):
    """Blocks before the last need not be full (a client may commit a short block): the
    locations of every range are still the exact blocks at their exact offsets."""
    full = 8 * BPC
    sizes = [full, full, 1000, full, 0, full, 300]
    store = make_store(kind, tmp_path / "db")
    try:
        ns, ino = _long_file(store, sizes)
        inode = ns.view.get_inode(ino)
        total = sum(sizes)
        for offset in range(0, total + 2 * full, 777):
            for length in (0, 1, 900, full, 3 * full):
                got = [(b["id"], pos) for b, pos in
                       ns.view.blocks_in_range(ino, inode, offset, offset + length)]
                assert got == _reference_range(ns, ino, offset, offset + length), \
                    (offset, length)
        assert [(b["id"], p) for b, p in ns.view.blocks_in_range(ino, inode, 0, float("inf"))] \
            == _reference_range(ns, ino, 0, float("inf"))
        assert check_namespace(store) == []
    finally:
        store.close()


def test_min_block_size_and_max_blocks_per_file_limits(kind, tmp_path):
    store = make_store(kind, tmp_path / "db")
    try:
        ns, ino = _long_file(store, [8 * BPC] * 3 + [10], max_blocks_per_file=4)
        with pytest.raises(errors.InvalidArgument, match=r"/long.*max_blocks_per_file is 4"):
            ns.planner.check_block_count("/long", ns.view.get_inode(ino))
        ns.defaults.max_blocks_per_file = 5
        ns.planner.check_block_count("/long", ns.view.get_inode(ino))   # one more is allowed
        ns.defaults.min_block_size = 4 * BPC
        with pytest.raises(errors.InvalidArgument, match=r"/small.*min_block_size 2048"):
            ns.planner.plan_create("/small", holder="w", block_size=2 * BPC, now_ns=5)
        assert ns.planner.plan_create("/ok", holder="w", block_size=4 * BPC,
                              now_ns=5).block_size == 4 * BPC
        ns.defaults.block_size = 2 * BPC   # a default below the limit is refused too
        with pytest.raises(errors.InvalidArgument, match="min_block_size"):
            ns.planner.plan_create("/default", holder="w", now_ns=5)
    finally:
        store.close()


# --------------------------------------------------------------------------- delete


async def test_recursive_delete_removes_subtree_in_one_record(kind, tmp_path):
    async def body(h):
        ids = []
        for i in range(5):
            ids += await h.write_file(f"/top/d{i % 2}/f{i}", [100, 200][: 1 + i % 2])
        await h.create("/top/open", holder="w9")
        open_ino = h.ns.view.get_file_info("/top/open")["ino"]
        await h.mkdirs("/top/d1/empty/deeper")
        await h.write_file("/keep", [5])
        with pytest.raises(errors.DirectoryNotEmpty):
            h.ns.planner.plan_delete("/top", False, now_ns=h.now())
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_delete("/", True, now_ns=h.now())
        with pytest.raises(errors.FileNotFound):
            h.ns.planner.plan_delete("/nope", True, now_ns=h.now())
        txid_before = h.journal.last_txid
        h.effects.clear()
        await h.do(h.ns.planner.plan_delete("/top", True, now_ns=h.now()))
        assert h.journal.last_txid == txid_before + 1
        assert sorted(h.effects[0].removed_blocks) == sorted(ids)
        assert h.effects[0].removed_uc == (open_ino,)
        with pytest.raises(errors.FileNotFound):
            h.ns.view.get_file_info("/top/d0/f0")
        assert [e["name"] for e in h.ns.view.list_status("/")["entries"]] == ["keep"]
        assert h.ns.view.file_count() == 1 and h.ns.view.dir_count() == 1
        assert h.ns.view.under_construction() == {}
        # an empty directory and a file go without recursive
        await h.mkdirs("/e")
        await h.do(h.ns.planner.plan_delete("/e", False, now_ns=h.now()))
        await h.do(h.ns.planner.plan_delete("/keep", False, now_ns=h.now()))
        assert h.ns.view.list_status("/")["entries"] == []
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


CHUNK = 7   # a tiny delete_chunk: the trees below need several RECLAIM records


async def _big_tree(h):
    """/top: 3 dirs x 4 files of 1-2 blocks, an open file, empty dirs, a symlink, a file
    with 9 blocks (bigger than CHUNK alone); /keep stays. Returns (block ids, open ino)."""
    ids = []
    for i in range(12):
        ids += await h.write_file(f"/top/d{i % 3}/f{i}", [100, 200][: 1 + i % 2])
    await h.create("/top/d1/open", holder="w9")
    ids.append((await h.add_block("/top/d1/open", holder="w9"))["id"])
    open_ino = h.ns.view.get_file_info("/top/d1/open")["ino"]
    await h.mkdirs("/top/d2/empty/deeper")
    await h.do(h.ns.planner.plan_symlink("/keep", "/top/link", now_ns=h.now()))
    ids += await h.write_file("/top/long", [8 * BPC] * 8 + [5])
    await h.write_file("/keep", [5])
    return ids, open_ino


async def _reclaim_all(h, check_each=True) -> list[dict]:
    """Drive the reclaimer by hand: one RECLAIM record at a time, invariants after each."""
    plans = []
    while (plan := h.ns.reclaim.plan_reclaim()) is not None:
        assert len(plan.blocks) + len(plan.inodes) <= h.ns.defaults.delete_chunk
        await h.do(plan)
        plans.append(plan)
        if check_each:
            assert_consistent(h)
    return plans


async def _delete_big_tree(h, state):
    ids, open_ino = await _big_tree(h)
    closed_ino = h.ns.view.get_file_info("/top/d2/f11")["ino"]
    last = h.ns.view.tail_blocks(closed_ino, h.ns.view.get_inode(closed_ino), 1)[-1]
    assert h.ns.planner.closed_with("/top/d2/f11", closed_ino, last)   # a retried complete: done
    txid = h.journal.last_txid
    h.effects.clear()
    await h.do(h.ns.planner.plan_delete("/top", True, now_ns=h.now()))
    assert h.journal.last_txid == txid + 1
    # gone from the namespace at once, whichever path the delete took
    for path in ("/top", "/top/d0/f0", "/top/d1/open", "/top/long"):
        with pytest.raises(errors.FileNotFound):
            h.ns.view.get_file_info(path)
    assert [e["name"] for e in h.ns.view.list_status("/")["entries"]] == ["keep"]
    assert h.ns.view.under_construction() == {}
    assert h.effects[0].removed_uc == (open_ino,)
    # a writer addressing the open file by inode id (it raced the delete) is refused
    with pytest.raises(errors.FileNotFound):
        h.ns.planner.writer_file("/top/d1/open", open_ino, "w9")
    assert not h.ns.planner.closed_with("/top/d2/f11", closed_ino, last)   # now: the file is gone
    assert_consistent(h)
    state["detached"] = h.ns.reclaim.has_orphans()
    state["delete_effect"] = h.effects[0]
    state["after_delete"] = dump(h.store)
    plans = await _reclaim_all(h)
    state["plans"] = plans
    removed = [block_id for effect in h.effects for block_id in effect.removed_blocks]
    assert sorted(removed) == sorted(ids)
    assert not h.ns.reclaim.has_orphans()
    assert h.ns.view.file_count() == 1 and h.ns.view.dir_count() == 1
    assert_consistent(h)
    state["final"] = dump(h.store)


def _without_txid(snapshot: dict) -> dict:
    from meta.schema import keys
    return {k: v for k, v in snapshot.items() if k != keys.meta_key(keys.APPLIED_TXID)}


async def test_big_delete_detaches_at_once_and_is_reclaimed_in_bounded_records(kind, tmp_path):
    """A tree bigger than delete_chunk: one DELETE record detaches it (gone at once, the
    open file's lease ends), RECLAIM records of at most delete_chunk keys remove it with
    the invariants holding after each, and the store ends exactly as after the
    single-record delete of the same tree."""
    small, big = {}, {}
    await run_ns(kind, tmp_path / "small", lambda h: _delete_big_tree(h, small))
    await run_ns(kind, tmp_path / "big", lambda h: _delete_big_tree(h, big), delete_chunk=CHUNK)
    assert not small["detached"] and small["plans"] == []
    assert big["detached"] and big["delete_effect"].removed_blocks == ()
    from meta.schema import keys
    assert [k for k in big["after_delete"] if k[:1] == keys.ORPHAN] == [
        keys.orphan_key(big["delete_effect"].orphan)]
    assert len(big["plans"]) == 7   # 49 inodes + blocks, 7 per record
    assert [p.done for p in big["plans"]] == [False] * (len(big["plans"]) - 1) + [True]
    assert _without_txid(big["final"]) == _without_txid(small["final"])


async def test_small_subtree_keeps_the_single_record_delete(kind, tmp_path):
    async def body(h):
        ids = await h.write_file("/s/a", [1, 2])           # dir + file + 2 blocks = 4
        ids += await h.write_file("/s/b", [3])             # + file + block = 6 (limit 7)
        await h.do(h.ns.planner.plan_delete("/s", True, now_ns=h.now()))
        assert sorted(h.effects[-1].removed_blocks) == sorted(ids)
        assert not h.ns.reclaim.has_orphans() and h.ns.reclaim.plan_reclaim() is None
        # a single file with more blocks than the chunk is detached too
        ids = await h.write_file("/f", [BPC] * 8)
        await h.do(h.ns.planner.plan_delete("/f", False, now_ns=h.now()))
        assert h.effects[-1].removed_blocks == () and h.ns.reclaim.has_orphans()
        plans = await _reclaim_all(h)
        assert len(plans) == 2 and sorted(b[2] for p in plans for b in p.blocks) == \
            sorted(ids)
        assert h.ns.view.file_count() == 0

    await run_ns(kind, tmp_path, body, delete_chunk=CHUNK)


async def test_overwriting_a_big_file_detaches_it(kind, tmp_path):
    """create(overwrite) and rename(overwrite) of a file with more blocks than the chunk."""
    async def body(h):
        old = await h.write_file("/big", [BPC] * 9)
        await h.create("/big", holder="w2", overwrite=True)
        assert h.ns.reclaim.has_orphans() and h.ns.view.get_file_info("/big")["length"] == 0
        assert h.ns.view.under_construction() == {h.ns.view.get_file_info("/big")["ino"]: "w2"}
        assert_consistent(h)
        await h.close("/big", holder="w2")
        old2 = await h.write_file("/big2", [BPC] * 9)
        await h.write_file("/small", [1])
        await h.do(h.ns.renames.plan_rename("/small", "/big2", True, now_ns=h.now()))
        assert h.ns.view.get_file_info("/big2")["length"] == 1
        assert len(h.ns.reclaim.orphan_roots()) == 2
        assert_consistent(h)
        plans = await _reclaim_all(h)
        assert sorted(b[2] for p in plans for b in p.blocks) == sorted(old + old2)
        assert h.ns.view.file_count() == 2

    await run_ns(kind, tmp_path, body, delete_chunk=CHUNK)


async def test_replay_after_a_crash_in_the_middle_of_reclaiming_finishes_the_job(kind, tmp_path):
    """The store is reopened with the journal while an O key is present: replay is exact
    (a store that lags behind the RECLAIM records catches up) and reclaiming continues."""
    ref = {}
    await run_ns(kind, tmp_path / "ref", lambda h: _delete_big_tree(h, ref))
    state = {}

    async def crash_midway(h):
        await _big_tree(h)
        await h.do(h.ns.planner.plan_delete("/top", True, now_ns=h.now()))
        state["after_delete"] = dump(h.store)
        for _ in range(3):
            await h.do(h.ns.reclaim.plan_reclaim())
        assert h.ns.reclaim.has_orphans()
        state["midway"] = dump(h.store)

    async def finish(h):
        assert dump(h.store) == state["midway"] and h.ns.reclaim.has_orphans()
        assert_consistent(h)
        assert len(await _reclaim_all(h)) >= 3
        state["final"] = dump(h.store)

    base = tmp_path / "crash"
    h = await run_ns(kind, base, crash_midway, delete_chunk=CHUNK)
    if kind == "leveldb":
        h.store.close()
        h = await run_ns(kind, base, finish, store=PlyvelStore(str(base / "db")),
                         delete_chunk=CHUNK)
        h.store.close()
    else:
        h = await run_ns(kind, base, finish, store=h.store, delete_chunk=CHUNK)
    assert _without_txid(state["final"]) == _without_txid(ref["final"])

    # a store that lost everything after the detach: replay re-applies the RECLAIM records
    # (and the rest of the journal) exactly, then nothing is left to reclaim
    lagging = make_store(kind, tmp_path / "lagging")
    lagging.write(puts=list(state["after_delete"].items()))
    h = await run_ns(kind, base, lambda h: trio.sleep(0), store=lagging, format_=False,
               delete_chunk=CHUNK)
    assert dump(h.store) == state["final"]
    assert h.ns.reclaim.plan_reclaim() is None
    assert_consistent(h)


# --------------------------------------------------------------------------- rename


async def test_rename_edge_cases(kind, tmp_path):
    async def body(h):
        await h.write_file("/a/f", [10])
        await h.write_file("/a/g", [20])
        await h.mkdirs("/a/sub/inner")
        await h.mkdirs("/b/emptydir")
        await h.mkdirs("/b/full/x")
        t = h.now()
        f_ino = h.ns.view.get_file_info("/a/f")["ino"]

        await h.do(h.ns.renames.plan_rename("/a/f", "/b/f2", now_ns=t))
        moved = h.ns.view.get_file_info("/b/f2")
        assert moved["ino"] == f_ino and moved["length"] == 10 and moved["parent"] == \
            h.ns.view.get_file_info("/b")["ino"]
        with pytest.raises(errors.FileNotFound):
            h.ns.view.get_file_info("/a/f")
        assert h.ns.renames.plan_rename("/b/f2", "/b/f2", now_ns=t) is None        # src == dst
        with pytest.raises(errors.FileNotFound):
            h.ns.renames.plan_rename("/a/missing", "/a/x", now_ns=t)
        with pytest.raises(errors.InvalidArgument, match="into itself"):
            h.ns.renames.plan_rename("/a", "/a/sub/inner/a", now_ns=t)
        with pytest.raises(errors.InvalidArgument):
            h.ns.renames.plan_rename("/", "/z", now_ns=t)
        with pytest.raises(errors.InvalidArgument):
            h.ns.renames.plan_rename("/a/g", "/", now_ns=t, overwrite=True)
        with pytest.raises(errors.FileExists):
            h.ns.renames.plan_rename("/a/g", "/b/f2", now_ns=t)
        with pytest.raises(errors.FileNotFound, match="destination parent"):
            h.ns.renames.plan_rename("/a/g", "/nope/g", now_ns=t)
        with pytest.raises(errors.NotDirectory):
            h.ns.renames.plan_rename("/a/g", "/b/f2/g", now_ns=t)
        with pytest.raises(errors.NotDirectory):
            h.ns.renames.plan_rename("/a/sub", "/b/f2", overwrite=True, now_ns=t)
        with pytest.raises(errors.IsDirectory):
            h.ns.renames.plan_rename("/a/g", "/b/emptydir", overwrite=True, now_ns=t)
        with pytest.raises(errors.DirectoryNotEmpty):
            h.ns.renames.plan_rename("/a/sub", "/b/full", overwrite=True, now_ns=t)
        # overwrite a file: its blocks leave with it
        g_blocks = [b["id"] for b in h.ns.view.blocks_of(h.ns.view.get_file_info("/a/g")["ino"])]
        f2_blocks = [b["id"] for b in h.ns.view.blocks_of(f_ino)]
        h.effects.clear()
        await h.do(h.ns.renames.plan_rename("/a/g", "/b/f2", overwrite=True, now_ns=h.now()))
        assert list(h.effects[0].removed_blocks) == f2_blocks
        assert [b["id"] for b in h.ns.view.blocks_of(h.ns.view.get_file_info("/b/f2")["ino"])] == g_blocks
        # overwrite an empty directory with a directory (moves a subtree)
        await h.do(h.ns.renames.plan_rename("/a/sub", "/b/emptydir", overwrite=True, now_ns=h.now()))
        assert h.ns.view.get_file_info("/b/emptydir/inner")["type"] == "dir"
        # moving a directory up into an ancestor's sibling, and an open file keeps its lease
        st = await h.create("/b/emptydir/inner/open", holder="w5")
        await h.do(h.ns.renames.plan_rename("/b/emptydir/inner", "/top", now_ns=h.now()))
        assert h.ns.view.under_construction() == {st["ino"]: "w5"}
        assert h.ns.planner.writer_file("/top/open", st["ino"], "w5")[0] == "/top/open"
        assert h.ns.view.path_of(st["ino"]) == "/top/open"
        assert h.ns.view.get_file_info("/a")["children"] == 0
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


# --------------------------------------------------------------------------- set*, symlink


async def test_set_permission_owner_times_replication(kind, tmp_path):
    async def body(h):
        await h.write_file("/f", [1])
        await h.mkdirs("/d")
        await h.do(h.ns.planner.plan_set_permission("/f", 0o640, now_ns=h.now()))
        await h.do(h.ns.planner.plan_set_owner("/f", "alice", "staff", now_ns=h.now()))
        await h.do(h.ns.planner.plan_set_owner("/d", None, "ops", now_ns=h.now()))
        await h.do(h.ns.planner.plan_set_times("/f", 111, 222, now_ns=h.now()))
        await h.do(h.ns.planner.plan_set_replication("/f", 5, now_ns=h.now()))
        f, d = h.ns.view.get_file_info("/f"), h.ns.view.get_file_info("/d")
        assert (f["mode"], f["owner"], f["group"], f["mtime_ns"], f["atime_ns"],
                f["replication"]) == (0o640, "alice", "staff", 111, 222, 5)
        assert f["ctime_ns"] > 222
        assert (d["owner"], d["group"]) == ("leasefs", "ops")
        assert h.ns.planner.plan_set_owner("/f", None, None, now_ns=h.now()) is None
        assert h.ns.planner.plan_set_times("/f", None, None, now_ns=h.now()) is None
        assert h.ns.planner.plan_set_replication("/f", 5, now_ns=h.now()) is None
        with pytest.raises(errors.IsDirectory):
            h.ns.planner.plan_set_replication("/d", 2, now_ns=h.now())
        for bad in (-1, 0o10000, "755", None):
            with pytest.raises(errors.InvalidArgument):
                h.ns.planner.plan_set_permission("/f", bad, now_ns=h.now())
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_set_replication("/f", 100, now_ns=h.now())
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_set_times("/f", "yesterday", None, now_ns=h.now())
        with pytest.raises(errors.FileNotFound):
            h.ns.planner.plan_set_permission("/nope", 0o700, now_ns=h.now())
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_symlinks_are_stored_not_followed(kind, tmp_path):
    async def body(h):
        await h.mkdirs("/real")
        await h.do(h.ns.planner.plan_symlink("/real", "/links/l1", create_parent=True, now_ns=h.now()))
        st = h.ns.view.get_file_info("/links/l1")
        assert st["type"] == "symlink" and st["symlink"] == "/real" and st["length"] == 5
        with pytest.raises(errors.FileExists):
            h.ns.planner.plan_symlink("/x", "/links/l1", now_ns=h.now())
        with pytest.raises(errors.FileNotFound):
            h.ns.planner.plan_symlink("/x", "/nodir/l", now_ns=h.now())
        with pytest.raises(errors.InvalidArgument):
            h.ns.planner.plan_symlink("", "/links/l2", now_ns=h.now())
        with pytest.raises(errors.NotDirectory, match="symlink"):
            h.ns.view.get_file_info("/links/l1/inside")
        await h.do(h.ns.planner.plan_delete("/links/l1", False, now_ns=h.now()))
        assert h.ns.view.list_status("/links")["entries"] == []
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


# --------------------------------------------------------------------------- listing


async def test_list_status_pages_in_byte_order(kind, tmp_path):
    names = [f"n{i:02d}" for i in range(23)] + ["Zeta", "ärger", "a b", "~tilde"]

    async def body(h):
        for name in names:
            await h.mkdirs(f"/dir/{name}")
        await h.write_file("/dir/n05/file", [3])
        got, start = [], ""
        pages = 0
        while True:
            page = h.ns.view.list_status("/dir", start_after=start, limit=7)
            pages += 1
            got += [e["name"] for e in page["entries"]]
            assert len(page["entries"]) <= 7
            if not page["has_more"]:
                break
            start = page["entries"][-1]["name"]
        assert got == sorted(names, key=lambda n: n.encode())
        assert pages == 4
        entry = h.ns.view.list_status("/dir", start_after="n04", limit=1)["entries"][0]
        assert entry["name"] == "n05" and entry["path"] == "/dir/n05" and entry["children"] == 1
        # start_after a name that does not exist: continue from the next one
        assert h.ns.view.list_status("/dir", start_after="n10x", limit=1)["entries"][0]["name"] == "n11"
        assert h.ns.view.list_status("/dir", start_after="ärgerz", limit=5) == {"entries": [],
                                                                        "has_more": False}
        # a file lists itself
        only = h.ns.view.list_status("/dir/n05/file")
        assert [e["path"] for e in only["entries"]] == ["/dir/n05/file"]
        with pytest.raises(errors.InvalidArgument):
            h.ns.view.list_status("/dir", limit=0)
        with pytest.raises(errors.FileNotFound):
            h.ns.view.list_status("/nope")

    await run_ns(kind, tmp_path, body)


async def test_content_summary(kind, tmp_path):
    async def body(h):
        await h.write_file("/s/a", [100, 50])
        await h.write_file("/s/d/b", [7])
        await h.do(h.ns.planner.plan_set_replication("/s/d/b", 2, now_ns=h.now()))
        await h.mkdirs("/s/e")
        _, ino, inode, _ = h.ns.view.resolve("/s")
        assert h.ns.view.content_summary_of(ino, inode) == {
            "length": 157, "file_count": 2, "directory_count": 3,
            "space_consumed": 150 * 3 + 7 * 2}

    await run_ns(kind, tmp_path, body)


# --------------------------------------------------------------------------- batching


async def test_concurrent_mutations_in_one_batch_compose(kind, tmp_path):
    """Records that share a batch (and a parent directory) are applied as if in order."""
    async def body(h):
        await h.mkdirs("/shared")
        await h.write_file("/gone/x", [1])
        fsyncs = h.journal.stats.fsyncs

        async def create(i):
            await h.do(h.ns.planner.plan_create(f"/shared/f{i}", holder=f"w{i}", now_ns=h.now()))

        plans = []
        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(create, i)
            plans.append(h.ns.planner.plan_delete("/gone", True, now_ns=h.now()))
            nursery.start_soon(h.do, plans[0])
        assert h.journal.stats.fsyncs - fsyncs < 41
        assert h.ns.view.get_file_info("/shared")["children"] == 40
        assert len(h.ns.view.under_construction()) == 40
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


async def test_names_found_missing_are_cached_until_created_renamed_or_deleted(kind, tmp_path):
    """A directory entry looked up and found missing is remembered (a create looks its new
    name up several times); every record that adds, renames or removes the name replaces
    the remembered answer, also with a cache too small for the namespace."""
    async def body(h):
        h.ns.cache.limit = 16          # evictions happen all along
        await h.mkdirs("/d")
        for i in range(40):
            with pytest.raises(errors.FileNotFound):
                h.ns.view.get_file_info(f"/d/f{i}")
            misses = h.ns.cache.misses
            with pytest.raises(errors.FileNotFound):
                h.ns.view.get_file_info(f"/d/f{i}")
            assert h.ns.cache.misses - misses <= 2      # the name's miss itself is cached
            await h.create(f"/d/f{i}")
            assert h.ns.view.get_file_info(f"/d/f{i}")["type"] == "file"
        assert len(h.ns.cache.data) <= 16
        await h.do(h.ns.renames.plan_rename("/d/f1", "/d/g1", now_ns=h.now()))
        with pytest.raises(errors.FileNotFound):
            h.ns.view.get_file_info("/d/f1")
        assert h.ns.view.get_file_info("/d/g1")["type"] == "file"
        await h.do(h.ns.planner.plan_delete("/d/g1", False, now_ns=h.now()))
        with pytest.raises(errors.FileNotFound):
            h.ns.view.get_file_info("/d/g1")
        await h.create("/d/g1")
        assert h.ns.view.get_file_info("/d/g1")["type"] == "file"
        assert h.ns.view.get_file_info("/d")["children"] == 40
        assert_consistent(h)

    await run_ns(kind, tmp_path, body)


# --------------------------------------------------------------------------- restart


async def _workload(h):
    await h.mkdirs("/w/a/b")
    ids = await h.write_file("/w/a/file", [8 * BPC, 8 * BPC, 3])
    await h.create("/w/open", holder="w2")
    await h.add_block("/w/open", holder="w2")
    await h.do(h.ns.renames.plan_rename("/w/a/file", "/w/moved", now_ns=h.now()))
    await h.do(h.ns.planner.plan_set_permission("/w/moved", 0o600, now_ns=h.now()))
    await h.do(h.ns.planner.plan_symlink("/w/moved", "/w/link", now_ns=h.now()))
    await h.write_file("/w/tmp/t", [5])
    await h.do(h.ns.planner.plan_delete("/w/tmp", True, now_ns=h.now()))
    return ids


async def _more(h):
    await h.write_file("/w/later", [1, ])
    await h.do(h.ns.planner.plan_set_owner("/w", "bob", None, now_ns=h.now()))
    await h.do(h.ns.planner.plan_delete("/w/a", True, now_ns=h.now()))


async def test_restart_replays_the_journal_into_the_same_namespace(kind, tmp_path):
    """Reopening store + journal gives the same namespace; a store that lags the journal
    (LevelDB lost its unsynced tail) or is empty catches up by replay, exactly."""
    state = {}

    async def phase1(h):
        await _workload(h)
        state["snapshot"] = dump(h.store)
        state["txid"] = h.ns.view.applied_txid

    async def phase2(h):
        await _more(h)
        state["final"] = dump(h.store)
        state["final_txid"] = h.ns.view.applied_txid

    if kind == "leveldb":
        h = await run_ns(kind, tmp_path, phase1)
        h.store.close()
        h = await run_ns(kind, tmp_path, phase2, store=PlyvelStore(str(tmp_path / "db")))
        h.store.close()
        reopened = PlyvelStore(str(tmp_path / "db"))
        assert dump(reopened) == state["final"]
        # the same store reopened with the journal: nothing to replay, same namespace
        h = await run_ns(kind, tmp_path, lambda h: trio.sleep(0), store=reopened)
        assert dump(h.store) == state["final"]
        h.store.close()
    else:
        h = await run_ns(kind, tmp_path, phase1)
        h = await run_ns(kind, tmp_path, phase2, store=h.store)
    assert state["final_txid"] > state["txid"]

    # a store that lags (only phase 1 applied): replay brings it to the final state
    lagging = make_store(kind, tmp_path / "lagging")
    lagging.write(puts=list(state["snapshot"].items()))
    h = await run_ns(kind, tmp_path, lambda h: trio.sleep(0), store=lagging, format_=False)
    assert dump(h.store) == state["final"]
    assert h.ns.view.applied_txid == state["final_txid"]
    assert_consistent(h)

    # an empty store: the FORMAT record and everything after it rebuild it exactly
    empty = make_store(kind, tmp_path / "empty")
    h = await run_ns(kind, tmp_path, lambda h: trio.sleep(0), store=empty, format_=False)
    assert dump(h.store) == state["final"]
    assert h.ns.view.get_file_info("/w")["owner"] == "bob"
    assert h.ns.view.get_file_info("/w/link")["symlink"] == "/w/moved"
    assert_consistent(h)
