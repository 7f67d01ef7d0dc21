"""The inode record: what an ``I<ino>`` key of the store holds (``meta/schema/keys.py``
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
written back without it until an op sets it; from then on the key sits in its place in the
order above (the dict writers appended it last: same map, other byte order, only for such
old records).

Concurrency contract: immutable values (frozen, slots); a change is a new record
(``replace``), so the namespace cache and a batch's view can share them freely.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

FILE = "file"
DIR = "dir"
SYMLINK = "symlink"


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


@dataclass(frozen=True, slots=True, init=False)
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

    def __new__(cls, type: str, mode: int, owner: str, group: str, mtime: int, atime: int,
                ctime: int, parent: int, name: str, children: int | None = None,
                subdirs: int | None = None, quota: Quota | None = None,
                replication: int | None = None, block_size: int | None = None,
                length: int | None = None, nblocks: int | None = None,
                uc: UnderConstruction | None = None, inline: int | None = None,
                target: str | None = None) -> "Inode":
        """The dataclass ``__init__`` would set each field through ``object.__setattr__``
        (frozen): 4 times the cost of filling a ``_Draft``, on every inode an op makes."""
        new = _Draft()
        new.type = type
        new.mode = mode
        new.owner = owner
        new.group = group
        new.mtime = mtime
        new.atime = atime
        new.ctime = ctime
        new.parent = parent
        new.name = name
        new.children = children
        new.subdirs = subdirs
        new.quota = quota
        new.replication = replication
        new.block_size = block_size
        new.length = length
        new.nblocks = nblocks
        new.uc = uc
        new.inline = inline
        new.target = target
        new.__class__ = cls
        return new

    @classmethod
    def from_wire(cls, m: dict) -> "Inode":
        """The record of a stored map (``keys.unpack`` of an ``I`` key's value). It runs on
        every namespace cache miss: filled as a ``_Draft`` (see there), not through the
        frozen ``__init__``."""
        if not FIELD_SET.issuperset(m):
            raise ValueError(f"not an inode map: unknown keys {sorted(set(m) - FIELD_SET)}")
        new = _Draft()
        get = m.get
        try:
            new.type = m["type"]
            new.mode = m["mode"]
            new.owner = m["owner"]
            new.group = m["group"]
            new.mtime = m["mtime"]
            new.atime = m["atime"]
            new.ctime = m["ctime"]
            new.parent = m["parent"]
            new.name = m["name"]
        except KeyError as e:
            raise ValueError(f"not an inode map: no {e.args[0]!r}") from None
        new.children = get("children")
        new.subdirs = get("subdirs")
        quota = get("quota")
        new.quota = None if quota is None else Quota.from_wire(quota)
        new.replication = get("replication")
        new.block_size = get("block_size")
        new.length = get("length")
        new.nblocks = get("nblocks")
        uc = get("uc")
        new.uc = None if uc is None else UnderConstruction.from_wire(uc)
        new.inline = get("inline")
        new.target = get("target")
        new.__class__ = cls
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
        """A copy with ``changes`` (field=value; None drops an optional key). Every
        namespace change makes one or more: filled as a ``_Draft`` (see there), not
        through ``dataclasses.replace`` and the frozen ``__init__``."""
        new = _Draft()
        new.type = self.type
        new.mode = self.mode
        new.owner = self.owner
        new.group = self.group
        new.mtime = self.mtime
        new.atime = self.atime
        new.ctime = self.ctime
        new.parent = self.parent
        new.name = self.name
        new.children = self.children
        new.subdirs = self.subdirs
        new.quota = self.quota
        new.replication = self.replication
        new.block_size = self.block_size
        new.length = self.length
        new.nblocks = self.nblocks
        new.uc = self.uc
        new.inline = self.inline
        new.target = self.target
        try:
            for name, value in changes.items():
                setattr(new, name, value)
        except AttributeError:
            raise TypeError(f"Inode has no field {name!r}") from None
        new.__class__ = Inode
        return new


FIELDS = tuple(f.name for f in fields(Inode))
FIELD_SET = frozenset(FIELDS)


class _Draft:
    """An ``Inode`` being filled: the same slots, writable. ``from_wire`` and ``replace``
    store the fields as plain attributes and then make it an ``Inode`` (``__class__``
    assignment, allowed between classes of the same slot layout): a frozen record's
    fields can otherwise only be set through ``object.__setattr__``, one call per field,
    which made a copy cost about 4 times as much, on every cache miss and every change."""

    __slots__ = FIELDS
