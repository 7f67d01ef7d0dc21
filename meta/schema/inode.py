"""The inode record: what an ``I<ino>`` key of the store holds (``meta/journal/keys.py``
has the key layout), typed, with its msgpack map form in this one place.

Why it exists: every reader (path walks, status answers, planners, the replay checker) and
every writer (the journal ops' ``apply``) shares one shape, so a misspelt or missing field
fails where it is written, not after the record is on disk.

Wire form: ``to_wire`` gives exactly the map the store has always held — the same keys in
the same order (``type, mode, owner, group, mtime, atime, ctime, parent, name``, then
a dir's ``children, subdirs, quota``, a file's ``replication, block_size, length,
nblocks, uc, inline``, a symlink's ``target``), a key absent when its field is None (a
file always has ``uc``: None when closed). Records written before a key existed (a dir
without ``subdirs``, a file without ``nblocks``) read back with that field None and are
written back without it until an op sets it.

Concurrency contract: immutable values (frozen, slots); a change is a new record
(``replace``), so the namespace cache and a batch's view can share them freely.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

FILE = "file"
DIR = "dir"
SYMLINK = "symlink"

_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Quota:
    """A folder's limits (-1: none) and its usage: names at/below it, bytes × replication."""

    ns: int
    ds: int
    ns_used: int
    ds_used: int

    def to_wire(self) -> dict:
        return {"ns": self.ns, "ds": self.ds, "ns_used": self.ns_used, "ds_used": self.ds_used}

    @classmethod
    def from_wire(cls, m: dict) -> "Quota":
        return cls(m["ns"], m["ds"], m["ns_used"], m["ds_used"])

    def charged(self, names: int, space: int) -> "Quota":
        """The same limits with ``names``/``space`` more in use."""
        return Quota(self.ns, self.ds, self.ns_used + names, self.ds_used + space)


@dataclass(frozen=True, slots=True)
class UnderConstruction:
    """The writer of a file under construction."""

    holder: str
    client_machine: str

    def to_wire(self) -> dict:
        return {"holder": self.holder, "client_machine": self.client_machine}

    @classmethod
    def from_wire(cls, m: dict) -> "UnderConstruction":
        return cls(m["holder"], m.get("client_machine", ""))


@dataclass(frozen=True, slots=True)
class Inode:
    """One inode. Fields of another kind, and keys an old record lacks, are None."""

    type: str
    mode: int
    owner: str
    group: str
    mtime: int
    atime: int
    ctime: int
    parent: int
    name: str
    # dirs
    children: int | None = None
    subdirs: int | None = None
    quota: Quota | None = None
    # files
    replication: int | None = None
    block_size: int | None = None
    length: int | None = None
    nblocks: int | None = None
    uc: UnderConstruction | None = None
    inline: int | None = None         # byte count while the data is an L key
    # symlinks
    target: str | None = None

    @classmethod
    def from_wire(cls, m: dict) -> "Inode":
        """The record of a stored map (``keys.unpack`` of an ``I`` key's value). Spelt out
        field by field: it runs on every namespace cache miss, and the frozen ``__init__``
        (one ``object.__setattr__`` per field through keyword matching) cost twice this."""
        if not FIELD_SET.issuperset(m):
            raise ValueError(f"not an inode map: unknown keys {sorted(set(m) - FIELD_SET)}")
        new = _new(cls)
        get = m.get
        try:
            _set(new, "type", m["type"])
            _set(new, "mode", m["mode"])
            _set(new, "owner", m["owner"])
            _set(new, "group", m["group"])
            _set(new, "mtime", m["mtime"])
            _set(new, "atime", m["atime"])
            _set(new, "ctime", m["ctime"])
            _set(new, "parent", m["parent"])
            _set(new, "name", m["name"])
        except KeyError as e:
            raise ValueError(f"not an inode map: no {e.args[0]!r}") from None
        _set(new, "children", get("children"))
        _set(new, "subdirs", get("subdirs"))
        quota = get("quota")
        _set(new, "quota", None if quota is None else Quota.from_wire(quota))
        _set(new, "replication", get("replication"))
        _set(new, "block_size", get("block_size"))
        _set(new, "length", get("length"))
        _set(new, "nblocks", get("nblocks"))
        uc = get("uc")
        _set(new, "uc", None if uc is None else UnderConstruction.from_wire(uc))
        _set(new, "inline", get("inline"))
        _set(new, "target", get("target"))
        return new

    def to_wire(self) -> dict:
        """The stored map (see the module docstring for its key order)."""
        m = {"type": self.type, "mode": self.mode, "owner": self.owner, "group": self.group,
             "mtime": self.mtime, "atime": self.atime, "ctime": self.ctime,
             "parent": self.parent, "name": self.name}
        if self.children is not None:
            m["children"] = self.children
        if self.subdirs is not None:
            m["subdirs"] = self.subdirs
        if self.quota is not None:
            m["quota"] = self.quota.to_wire()
        if self.replication is not None:
            m["replication"] = self.replication
        if self.block_size is not None:
            m["block_size"] = self.block_size
        if self.length is not None:
            m["length"] = self.length
        if self.nblocks is not None:
            m["nblocks"] = self.nblocks
        if self.uc is not None:
            m["uc"] = self.uc.to_wire()
        elif self.type == FILE:
            m["uc"] = None
        if self.inline is not None:
            m["inline"] = self.inline
        if self.target is not None:
            m["target"] = self.target
        return m

    def replace(self, **changes) -> "Inode":
        """A copy with ``changes`` (field=value; None drops an optional key). Spelt out:
        ``dataclasses.replace`` re-runs the frozen ``__init__`` and cost several times this
        on every namespace change."""
        new = _new(Inode)
        _set(new, "type", self.type)
        _set(new, "mode", self.mode)
        _set(new, "owner", self.owner)
        _set(new, "group", self.group)
        _set(new, "mtime", self.mtime)
        _set(new, "atime", self.atime)
        _set(new, "ctime", self.ctime)
        _set(new, "parent", self.parent)
        _set(new, "name", self.name)
        _set(new, "children", self.children)
        _set(new, "subdirs", self.subdirs)
        _set(new, "quota", self.quota)
        _set(new, "replication", self.replication)
        _set(new, "block_size", self.block_size)
        _set(new, "length", self.length)
        _set(new, "nblocks", self.nblocks)
        _set(new, "uc", self.uc)
        _set(new, "inline", self.inline)
        _set(new, "target", self.target)
        for name, value in changes.items():
            if name not in FIELD_SET:
                raise TypeError(f"Inode has no field {name!r}")
            _set(new, name, value)
        return new


FIELDS = tuple(f.name for f in fields(Inode))
FIELD_SET = frozenset(FIELDS)
