"""The inode record (``meta.schema.inode``): its map form is byte for byte the one the store
has always held, so stores, journals and checkpoints on disk read and write unchanged; a
change is a new record. Pure, in memory, fast."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from fs.framing import packb
from meta.schema import keys
from meta.journal.kv import MemoryStore
from meta.namespace.namespace import Namespace
from meta.schema.inode import DIR, FILE, SYMLINK, Inode, Quota, UnderConstruction
from test_ops import every_op

COMMON = {"mode": 0o755, "owner": "leasefs", "group": "supergroup", "mtime": 1001,
          "atime": 1000, "ctime": 1002}

# maps as the writers before the record wrote them, one per shape the store holds
STORED = {
    "root": {"type": DIR, **COMMON, "parent": 0, "name": "", "children": 0, "subdirs": 0},
    "dir with a quota": {"type": DIR, **COMMON, "parent": 1, "name": "q", "children": 3,
                         "subdirs": 1, "quota": {"ns": 100, "ds": -1, "ns_used": 4,
                                                 "ds_used": 12288}},
    "open file": {"type": FILE, **COMMON, "parent": 2, "name": "f", "replication": 3,
                  "block_size": 1 << 27, "length": 0, "nblocks": 0,
                  "uc": {"holder": "client#1", "client_machine": "host-a"}},
    "closed file": {"type": FILE, **COMMON, "parent": 2, "name": "g", "replication": 2,
                    "block_size": 4096, "length": 8193, "nblocks": 3, "uc": None},
    "inline file": {"type": FILE, **COMMON, "parent": 2, "name": "s", "replication": 3,
                    "block_size": 4096, "length": 4, "nblocks": 0, "uc": None, "inline": 4},
    "empty inline file": {"type": FILE, **COMMON, "parent": 2, "name": "e", "replication": 1,
                          "block_size": 4096, "length": 0, "nblocks": 0, "uc": None,
                          "inline": 0},
    "symlink": {"type": SYMLINK, **COMMON, "parent": 2, "name": "l", "target": "/a/f"},
    # written before directories counted their subdirectories / files their blocks
    "old dir": {"type": DIR, **COMMON, "parent": 1, "name": "old", "children": 2},
    "old file": {"type": FILE, **COMMON, "parent": 1, "name": "old", "replication": 3,
                 "block_size": 4096, "length": 10, "uc": None},
}


@pytest.mark.parametrize("shape", sorted(STORED))
def test_a_stored_map_comes_back_as_the_same_bytes(shape):
    stored = STORED[shape]
    inode = Inode.from_wire(stored)
    assert packb(inode.to_wire()) == packb(stored)
    raw = keys.pack(inode)                       # the store's own write path
    assert raw == packb(stored)
    assert keys.unpack_value(keys.inode_key(7), raw) == inode
    assert keys.unpack_value(keys.dentry_key(1, "x"), packb(7)) == 7   # other kinds: as is


def test_every_op_leaves_the_inode_bytes_recorded_before_the_record():
    """Every inode the journal's ops write (dirs, quota folders, files open, closed,
    inline, truncated, appended, concatenated, renamed; symlinks) is stored as the bytes
    the dict-based writers stored."""
    golden = pathlib.Path(__file__).parent / "golden" / "every_op_inodes.txt"
    expected = [line.split() for line in golden.read_text().splitlines()
                if not line.startswith("#")]
    d = every_op()
    ns = Namespace(MemoryStore(), d.ns.defaults)
    seen: dict[bytes, bytes] = {}
    got = []
    for record, _ in d.wire:
        ns.apply([record])
        for key, raw in ns.kv.scan(keys.INODE):
            if seen.get(key) != raw:
                seen[key] = raw
                got.append([str(record.txid), str(keys.parse_inode_key(key)), bytes(raw).hex()])
    assert got == expected


def test_the_record_has_its_parts_typed():
    inode = Inode.from_wire(STORED["open file"])
    assert inode.uc == UnderConstruction("client#1", "host-a")
    assert Inode.from_wire(STORED["dir with a quota"]).quota == Quota(100, -1, 4, 12288)
    assert Inode.from_wire(STORED["old dir"]).subdirs is None
    assert Inode.from_wire(STORED["closed file"]).inline is None
    assert Inode.from_wire(STORED["empty inline file"]).inline == 0


def test_every_field_survives_the_wire_and_replace():
    """``from_wire`` and ``replace`` are spelt out field by field: none is forgotten."""
    every = Inode(type=FILE, mode=1, owner="o", group="g", mtime=2, atime=3, ctime=4,
                  parent=5, name="n", children=6, subdirs=7, quota=Quota(8, 9, 10, 11),
                  replication=12, block_size=13, length=14, nblocks=15,
                  uc=UnderConstruction("h", "m"), inline=16, target="t")
    assert [f.name for f in dataclasses.fields(Inode)] == list(every.to_wire())
    assert all(value is not None for value in every.to_wire().values())
    assert Inode.from_wire(every.to_wire()) == every
    assert every.replace() == every and every.replace() is not every


def test_a_change_is_a_new_record():
    inode = Inode.from_wire(STORED["open file"])
    closed = inode.replace(uc=None, mtime=5000, ctime=5000)
    assert inode.uc is not None and inode.mtime == 1001          # the old one is untouched
    assert closed.to_wire() == {**STORED["open file"], "uc": None, "mtime": 5000,
                                "ctime": 5000}
    assert closed.replace(inline=4).to_wire()["inline"] == 4
    assert "quota" not in Inode.from_wire(STORED["dir with a quota"]).replace(
        quota=None).to_wire()                                    # None drops an optional key
    with pytest.raises(dataclasses.FrozenInstanceError):
        inode.mtime = 1
    with pytest.raises(TypeError, match="'mtim'"):
        inode.replace(mtim=1)
    assert Quota(10, -1, 2, 0).charged(1, 4096) == Quota(10, -1, 3, 4096)


def test_a_map_that_is_not_an_inode_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="unknown keys.*'colour'"):
        Inode.from_wire({**STORED["symlink"], "colour": "red"})
    missing = dict(STORED["symlink"])
    del missing["owner"]
    with pytest.raises(ValueError, match="no 'owner'"):
        Inode.from_wire(missing)
