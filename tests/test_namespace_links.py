"""Directory link counts: every directory inode counts its subdirectories (``subdirs``), so
its link count is 2 + subdirs as on ext4. Kept by the appliers of every record that adds,
removes or moves a directory entry, so a replay of the journal rebuilds the same counts;
``check_namespace`` verifies them. Real LevelDB stores.
"""

from __future__ import annotations

from meta.schema import keys
from meta.namespace.invariants import check_namespace
from meta.journal.files import Record
from meta.journal.kv import PlyvelStore
from meta.namespace.namespace import Namespace
from meta.journal.ops import to_wire


def _subdirs(ns: Namespace) -> dict[str, int]:
    out = {}
    for path in ("/", "/a", "/a/b", "/x", "/y"):
        try:
            out[path] = ns.view.get_file_info(path)["subdirs"]
        except Exception:   # noqa: BLE001 - gone by now
            continue
    return out


def test_subdirectory_counts_follow_mkdir_rmdir_rename_delete_and_replay(tmp_path):
    live = PlyvelStore(str(tmp_path / "live"))
    ns = Namespace(live)
    records = []
    t = iter(range(10, 10_000))

    def apply(plan):
        record = Record(len(records) + 1, *to_wire(plan))
        records.append(record)
        ns.apply([record])

    try:
        apply(ns.planner.plan_format(1, next(t)))
        apply(ns.planner.plan_mkdirs("/a/b/c", now_ns=next(t)))
        apply(ns.planner.plan_mkdirs("/a/d", now_ns=next(t)))
        apply(ns.planner.plan_mkdirs("/x", now_ns=next(t)))
        apply(ns.planner.plan_create("/a/file", holder="w", now_ns=next(t)))
        apply(ns.planner.plan_symlink("file", "/a/link", now_ns=next(t)))
        assert _subdirs(ns) == {"/": 2, "/a": 2, "/a/b": 1, "/x": 0}
        apply(ns.renames.plan_rename("/a/d", "/x/d", now_ns=next(t)))          # across directories
        apply(ns.renames.plan_rename("/a/file", "/x/file", now_ns=next(t)))    # a file: no change
        assert _subdirs(ns) == {"/": 2, "/a": 1, "/a/b": 1, "/x": 1}
        apply(ns.planner.plan_mkdirs("/y/e", now_ns=next(t)))
        apply(ns.renames.plan_rename("/y/e", "/x/d", overwrite=True, now_ns=next(t)))  # dir over dir
        assert _subdirs(ns) == {"/": 3, "/a": 1, "/a/b": 1, "/x": 1, "/y": 0}
        apply(ns.planner.plan_delete("/a/b/c", now_ns=next(t)))                # rmdir
        apply(ns.renames.plan_rename_many([("/x/d", "/a/d2"), ("/y", "/a/y")], now_ns=next(t)))
        assert _subdirs(ns) == {"/": 2, "/a": 3, "/a/b": 0, "/x": 0}
        apply(ns.planner.plan_delete("/a", recursive=True, now_ns=next(t)))
        assert _subdirs(ns) == {"/": 1, "/x": 0}
        assert check_namespace(live) == []

        replay = PlyvelStore(str(tmp_path / "replay"))
        try:
            Namespace(replay).apply(records)
            assert dict(replay.scan(b"")) == dict(live.scan(b""))
        finally:
            replay.close()

        # a directory stored before subdirectories were counted gets its count at its
        # next change (and reports 2 links until then)
        x = ns.view.get_file_info("/x")["ino"]
        x_inode = keys.unpack(live.get(keys.inode_key(x)))
        del x_inode["subdirs"]
        live.write(puts=[(keys.inode_key(x), keys.pack(x_inode))])
        ns = Namespace(live)
        apply(ns.planner.plan_mkdirs("/x/p", now_ns=next(t)))
        apply(ns.planner.plan_mkdirs("/x/q", now_ns=next(t)))
        assert _subdirs(ns) == {"/": 1, "/x": 2}
        assert check_namespace(live) == []

        # the checker notices a wrong count
        root = keys.unpack(live.get(keys.inode_key(keys.ROOT_INO)))
        live.write(puts=[(keys.inode_key(keys.ROOT_INO), keys.pack({**root, "subdirs": 5}))])
        assert any("says 5 subdirectories, has 1" in p for p in check_namespace(live))
    finally:
        live.close()
