"""The changes a directory lease's holder sends afterwards (``dir_batch``), as typed records
with their wire form in one place (docs/design/dirleases.md, PROTOCOL.md §2).

Why it exists: the mount builds these records when it acknowledges a change ahead of the
server, and the metadata server applies them; both sides read the same definitions.

Every change carries the time the holder made it (``time_ns``): the folders' times the
holder showed its applications are the ones the server keeps (unless the clocks are too
far apart, ``HOLDER_TIME_SKEW``).

Every change names the directories it relies on by inode and the epoch of the lease it was
decided under, never by path: another client may rename an ancestor of a leased directory
meanwhile (that does not recall the lease), and the server finds the directory's path at
apply time. Every change also names the inode it expects at its source name (``ino``): the
holder alone changes names in its leased directories, so a change whose source no longer
holds that inode was applied already (a batch resent after its reply was lost) and is
skipped, which makes a resend harmless.

Records: ``Unlink`` (unlink(2) of a non-directory), ``Rmdir`` (of an empty directory the
holder also held, whose lease ends with it), ``Rename`` (inside and between leased
directories; ``replaced`` is the inode the destination held, 0 for none), ``Create`` (a new
file, under construction and leased to the holder as ``create`` makes it, with an inode
from the range the lease's grant reserved: ``ino`` names the inode it *gets*, so a resend
finds it there and is skipped), ``Mkdir`` (a new folder, as ``mkdirs`` makes it, with an
inode from the same range; the holder holds the new folder's lease from then on, under the
epoch ``child_epoch`` names and with a part of the range for the files made in it),
``Write`` (a small file's whole content, kept inline: with
``close`` the file is completed as ``complete(data=...)`` does, else published as
``fsync(data=..., sync=false)``; empty ``data`` with ``close`` completes an empty file),
``SetAttr`` (mode, owner and group, times of an entry, as ``set_permission``,
``set_owner`` and ``set_times`` set them; the entry's ctime is the holder's time),
``Refill`` (the holder asks fresh inode ids for its creates in a folder before it runs out:
answered with the batch, ``inos``; ``after`` names the range it took last, so a resend is
not a second refill), ``Release`` (the holder gives a lease back after the changes before
it: ordered with them).

Pure: no I/O. Concurrency contract: immutable values, safe anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidArgument

#: the most changes one ``dir_batch`` carries (a bigger queue is sent in several)
MAX_BATCH = 1024
#: a holder's time farther than this from the server's is replaced by the server's
HOLDER_TIME_SKEW = 300 * 10**9
#: where a batched change's time travels from the batch to the namespace calls
#: (``CallContext.extra``)
HOLDER_TIME = "holder_time_ns"
#: where a batched create's inode id travels from the batch to the ``create`` call
#: (``CallContext.extra``): never an argument a client sends, since only the batch checks
#: that the id is one its lease's grant reserved
CHOSEN_INO = "chosen_ino"
#: where a batched create finds the closing ``Write`` that follows it in the batch
#: (``CallContext.extra``): the file is created complete with that content, one journal
#: batch instead of a create and a close
WHOLE = "whole_content"


def change_time(extra: dict, wall: int) -> int:
    """The time a change is stamped with: ``wall`` (the server's), or for a batched change
    the holder's (``extra[HOLDER_TIME]``, what it showed its applications) when the two
    clocks agree within ``HOLDER_TIME_SKEW``."""
    held = extra.get(HOLDER_TIME)
    if held is not None and abs(held - wall) <= HOLDER_TIME_SKEW:
        return held
    return wall


#: the epochs of leases a holder takes with a folder it makes (``Mkdir``): the holder names
#: them before the server sees the folder, so they are made of its inode id, which is never
#: used twice, in a range no grant's epoch (a journal txid) reaches
CHILD_EPOCHS = 1 << 62


def child_epoch(ino: int) -> int:
    """The epoch of the lease on folder ``ino`` taken with its mkdir under a lease."""
    return CHILD_EPOCHS + ino


def _int(value, what: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 1 << 63:
        raise InvalidArgument(f"dir_batch: {what} must be an integer >= {low}, "
                              f"got {value!r:.40}")
    return value


def _name(value, what: str) -> str:
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value \
            or "\0" in value or len(value.encode("utf-8", "surrogatepass")) > 255:
        raise InvalidArgument(f"dir_batch: {what} must be one path component, "
                              f"got {value!r:.60}")
    return value


@dataclass(frozen=True)
class Unlink:
    dir: int        # the leased directory
    epoch: int      # its lease's
    name: str
    ino: int        # the inode the name holds
    time_ns: int    # when the holder made it (the folder's mtime it showed)

    def to_wire(self) -> dict:
        return {"op": "unlink", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "time": self.time_ns}


@dataclass(frozen=True)
class Rmdir:
    dir: int
    epoch: int
    name: str
    ino: int            # the directory removed
    ino_epoch: int      # the holder's lease on it (it knew it empty): ends with it
    time_ns: int

    def to_wire(self) -> dict:
        return {"op": "rmdir", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "ino_epoch": self.ino_epoch, "time": self.time_ns}


@dataclass(frozen=True)
class Rename:
    dir: int
    epoch: int
    name: str
    ino: int
    dst_dir: int
    dst_epoch: int
    dst_name: str
    replaced: int       # the inode the destination held (0: none)
    time_ns: int

    def to_wire(self) -> dict:
        return {"op": "rename", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "dst_dir": self.dst_dir, "dst_epoch": self.dst_epoch,
                "dst_name": self.dst_name, "replaced": self.replaced, "time": self.time_ns}


@dataclass(frozen=True)
class Create:
    dir: int
    epoch: int
    name: str
    ino: int                # the inode the new file gets (the lease's reserved range)
    permission: int
    owner: str | None       # None: the caller's, as ``create`` decides
    group: str | None       # None: the folder's
    replication: int | None   # None: the cluster's default
    block_size: int | None
    time_ns: int

    def to_wire(self) -> dict:
        return {"op": "create", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "perm": self.permission, "owner": self.owner,
                "group": self.group, "replication": self.replication,
                "block_size": self.block_size, "time": self.time_ns}


@dataclass(frozen=True)
class Mkdir:
    dir: int
    epoch: int
    name: str
    ino: int                # the new folder's inode (the lease's reserved range)
    permission: int
    owner: str | None       # None: the caller's, as ``mkdirs`` decides
    group: str | None       # None: the folder's
    first_ino: int          # the new folder's own lease: its reserved ids (a part of the
    inos: int               # parent lease's range; 0: none)
    time_ns: int

    @property
    def lease_epoch(self) -> int:
        """The epoch of the new folder's lease, which the holder holds from the mkdir on."""
        return child_epoch(self.ino)

    def to_wire(self) -> dict:
        return {"op": "mkdir", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "perm": self.permission, "owner": self.owner,
                "group": self.group, "inos": [self.first_ino, self.inos],
                "time": self.time_ns}


@dataclass(frozen=True)
class Write:
    dir: int
    epoch: int
    name: str
    ino: int                # the file (created by this holder, still under construction)
    data: bytes             # its whole content (at most the server's ``inline_max``)
    close: bool             # complete it (else publish the content, the file stays open)
    mtime_ns: int | None    # with ``close``: times and mode set while it was written
    atime_ns: int | None
    permission: int | None
    time_ns: int

    def to_wire(self) -> dict:
        return {"op": "write", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "data": self.data, "close": self.close,
                "mtime": self.mtime_ns, "atime": self.atime_ns, "perm": self.permission,
                "time": self.time_ns}

    def __repr__(self) -> str:   # the content stays out of logs
        return (f"Write(dir={self.dir}, epoch={self.epoch}, name={self.name!r}, "
                f"ino={self.ino}, {len(self.data)} bytes, close={self.close})")


@dataclass(frozen=True)
class SetAttr:
    dir: int
    epoch: int
    name: str
    ino: int                # the entry (a file, folder or symlink) the name holds
    permission: int | None  # None: left as it is (so for each field)
    owner: str | None
    group: str | None
    mtime_ns: int | None
    atime_ns: int | None
    time_ns: int            # its ctime

    def to_wire(self) -> dict:
        return {"op": "setattr", "dir": self.dir, "epoch": self.epoch, "name": self.name,
                "ino": self.ino, "perm": self.permission, "owner": self.owner,
                "group": self.group, "mtime": self.mtime_ns, "atime": self.atime_ns,
                "time": self.time_ns}


@dataclass(frozen=True)
class Refill:
    dir: int
    epoch: int
    after: int      # the first id of the range the holder took last (its grant's or refill's)
    inos: int       # how many it asks for

    def to_wire(self) -> dict:
        return {"op": "refill", "dir": self.dir, "epoch": self.epoch, "after": self.after,
                "inos": self.inos}


@dataclass(frozen=True)
class Release:
    dir: int
    epoch: int

    def to_wire(self) -> dict:
        return {"op": "release", "dir": self.dir, "epoch": self.epoch}


DirOp = Unlink | Rmdir | Rename | Create | Mkdir | Write | SetAttr | Refill | Release


def _opt_int(value, what: str, low: int = 0, high: int = 1 << 63) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise InvalidArgument(f"dir_batch: {what} must be nil or an integer in "
                              f"[{low}, {high}), got {value!r:.40}")
    return value


def _opt_name(value, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256 or "\0" in value:
        raise InvalidArgument(f"dir_batch: {what} must be nil or a user or group name, "
                              f"got {value!r:.60}")
    return value


#: each change's wire name and fields
_FIELDS = {"unlink": ("dir", "epoch", "name", "ino", "time"),
           "rmdir": ("dir", "epoch", "name", "ino", "ino_epoch", "time"),
           "rename": ("dir", "epoch", "name", "ino", "dst_dir", "dst_epoch", "dst_name",
                      "replaced", "time"),
           "create": ("dir", "epoch", "name", "ino", "perm", "owner", "group",
                      "replication", "block_size", "time"),
           "mkdir": ("dir", "epoch", "name", "ino", "perm", "owner", "group", "inos", "time"),
           "write": ("dir", "epoch", "name", "ino", "data", "close", "mtime", "atime",
                     "perm", "time"),
           "setattr": ("dir", "epoch", "name", "ino", "perm", "owner", "group", "mtime",
                       "atime", "time"),
           "refill": ("dir", "epoch", "after", "inos"),
           "release": ("dir", "epoch")}
#: the changes' wire names, as a grant lists the ones its server applies (a holder decides
#: locally only what it may send: an older server refuses a batch naming a change it does
#: not know, whole)
KINDS = tuple(_FIELDS)


def from_wire(item) -> DirOp:
    """One change from its wire form; ``InvalidArgument`` naming what is wrong."""
    if not isinstance(item, dict):
        raise InvalidArgument(f"dir_batch: a change must be a map, got {item!r:.60}")
    kind = item.get("op")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise InvalidArgument(f"dir_batch: unknown change {kind!r:.40} ({', '.join(KINDS)})")
    extra = item.keys() - {"op", *fields}
    if extra:
        raise InvalidArgument(f"dir_batch: {kind}: unknown fields {sorted(map(str, extra))}")
    missing = [f for f in fields if f not in item]
    if missing:
        raise InvalidArgument(f"dir_batch: {kind}: missing {', '.join(missing)}")
    dir_, epoch = _int(item["dir"], f"{kind} dir"), _int(item["epoch"], f"{kind} epoch")
    if kind == "release":
        return Release(dir_, epoch)
    if kind == "refill":
        return Refill(dir_, epoch, _int(item["after"], "refill after"),
                      _int(item["inos"], "refill inos"))
    name, ino = _name(item["name"], f"{kind} name"), _int(item["ino"], f"{kind} ino")
    time_ns = _int(item["time"], f"{kind} time", low=0)
    if kind == "unlink":
        return Unlink(dir_, epoch, name, ino, time_ns)
    if kind == "rmdir":
        return Rmdir(dir_, epoch, name, ino, _int(item["ino_epoch"], "rmdir ino_epoch"),
                     time_ns)
    if kind == "create":
        perm = item["perm"]
        if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm < 0o10000:
            raise InvalidArgument(f"dir_batch: create perm must be a mode (0 to 0o7777), "
                                  f"got {perm!r:.20}")
        return Create(dir_, epoch, name, ino, perm,
                      _opt_name(item["owner"], "create owner"),
                      _opt_name(item["group"], "create group"),
                      _opt_int(item["replication"], "create replication", 1, 1 << 15),
                      _opt_int(item["block_size"], "create block_size", 1), time_ns)
    if kind == "mkdir":
        perm, inos = item["perm"], item["inos"]
        if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm < 0o10000:
            raise InvalidArgument(f"dir_batch: mkdir perm must be a mode (0 to 0o7777), "
                                  f"got {perm!r:.20}")
        if not isinstance(inos, (list, tuple)) or len(inos) != 2:
            raise InvalidArgument(f"dir_batch: mkdir inos must be [first, count], "
                                  f"got {inos!r:.40}")
        return Mkdir(dir_, epoch, name, ino, perm, _opt_name(item["owner"], "mkdir owner"),
                     _opt_name(item["group"], "mkdir group"),
                     _int(inos[0], "mkdir inos first", low=0),
                     _int(inos[1], "mkdir inos count", low=0), time_ns)
    if kind == "write":
        data, close = item["data"], item["close"]
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgument(f"dir_batch: write data must be bytes, got "
                                  f"{type(data).__name__}")
        if not isinstance(close, bool):
            raise InvalidArgument(f"dir_batch: write close must be a boolean, got {close!r:.20}")
        if not data and not close:
            raise InvalidArgument("dir_batch: write of no data must close the file")
        return Write(dir_, epoch, name, ino, bytes(data), close,
                     _opt_int(item["mtime"], "write mtime"), _opt_int(item["atime"], "write atime"),
                     _opt_int(item["perm"], "write perm", 0, 0o10000), time_ns)
    if kind == "setattr":
        change = SetAttr(dir_, epoch, name, ino,
                         _opt_int(item["perm"], "setattr perm", 0, 0o10000),
                         _opt_name(item["owner"], "setattr owner"),
                         _opt_name(item["group"], "setattr group"),
                         _opt_int(item["mtime"], "setattr mtime"),
                         _opt_int(item["atime"], "setattr atime"), time_ns)
        if (change.permission, change.owner, change.group, change.mtime_ns,
                change.atime_ns) == (None,) * 5:
            raise InvalidArgument("dir_batch: setattr must set perm, owner, group, mtime or "
                                  "atime")
        return change
    return Rename(dir_, epoch, name, ino, _int(item["dst_dir"], "rename dst_dir"),
                  _int(item["dst_epoch"], "rename dst_epoch"),
                  _name(item["dst_name"], "rename dst_name"),
                  _int(item["replaced"], "rename replaced", low=0), time_ns)


def batch_from_wire(ops) -> list[DirOp]:
    if not isinstance(ops, list) or len(ops) > MAX_BATCH:
        raise InvalidArgument(f"dir_batch: ops must be a list of at most {MAX_BATCH} changes")
    return [from_wire(item) for item in ops]


__all__ = ["CHILD_EPOCHS", "CHOSEN_INO", "WHOLE", "Create", "Mkdir", "child_epoch", "DirOp", "HOLDER_TIME", "KINDS", "MAX_BATCH",
           "Refill", "Release", "Rename", "Rmdir", "SetAttr", "Unlink", "Write", "batch_from_wire",
           "change_time", "from_wire"]
