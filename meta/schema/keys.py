"""The LevelDB key schema of the namespace: the ONE module that knows key bytes.

Why it exists: every other module asks this one for keys and value codecs, so the layout can
be read (and changed) in one place and ``invariants.py`` can check it.

Integers are big-endian and fixed width, so byte order = numeric order and a prefix scan of
a directory returns its entries sorted by name (UTF-8 bytes order). Values are msgpack.

====================  ==========================================  ===========================
key                    value (msgpack)                             meaning
====================  ==========================================  ===========================
``I<ino:8>``           map (``meta.schema.inode.Inode``, read     one inode; the root is
                       and written as one by ``unpack_value`` /
                       ``pack``): ``type`` ("file"/"dir"/"symlink"),
                       ``mode``, ``owner``, ``group``,              ``ROOT_INO`` (1, the FUSE
                       ``mtime``/``atime``/``ctime`` (ns),          root inode) with parent 0
                       ``parent``, ``name``; dirs: ``children``, ``subdirs``;
                       files: ``replication``, ``block_size``,
                       ``length``, ``nblocks``, ``uc`` (None or
                       ``{holder, client_machine}``), ``inline``
                       (byte count while the data is an L key);
                       symlinks: ``target``; a dir with a
                       quota: ``quota`` = ``{ns, ds, ns_used,
                       ds_used}`` (limits, -1 = none; its usage:
                       names at/below it, bytes × replication;
                       ``namespace_quota.py``)
``B<ino:8><index:4>``  map: ``id``, ``gs``, ``num_bytes``,          block ``index`` of file ``ino``
                       ``state`` (UNDER_CONSTRUCTION/COMMITTED/     (one small key per block, so
                       COMPLETE/UNDER_RECOVERY); ``truncate_to``    addBlock never rewrites a
                       while a mid-block truncate awaits its        block list)
                       block recovery (``num_bytes`` stays the
                       old length until it commits); ``patch_gs``
                       while a patch's stamp is pending
                       (PATCH_BEGIN; ``gs`` stays the committed
                       one until PATCH_BLOCK, PATCH_DROP ends it)
``L<ino:8>``           bytes: the whole content of a small file     inline data: a file closed
                                                                    whole from its writer's
                                                                    buffer (``inline_max``);
                                                                    goes when a block of the
                                                                    file holds all of it
``D<parent:8><name>``  int: child ino                               directory entry; ``name`` is
                                                                    UTF-8 (surrogatepass)
``U<ino:8>``           str: lease holder                            file under construction
                                                                    (leases are rebuilt from
                                                                    these at restart)
``O<ino:8>``           map: ``parent``, ``name`` (the entry it      root of a detached subtree
                       had), ``time`` (ns of the delete)            (a big delete): no entry
                                                                    points to it, its inode's
                                                                    ``parent`` is 0; RECLAIM
                                                                    records remove it piece
                                                                    by piece, the O key goes
                                                                    with the root's last piece
``T<seq:8>``           map: ``seq``, ``owner``, ``renewer``,        a live delegation token
                       ``issued``, ``max_date``, ``expiry``         (``fs.delegation``); goes
                       (wall seconds)                               when cancelled or expired
``W<ino:8>``           map: ``holder``, ``epoch`` (the txid of      a live directory write
                       its DIR_LEASE_GRANT record); with a          lease (``meta.leases.
                       reservation also ``first_ino``, ``inos``     dirleases``); goes with
                       (inode ids the grant reserved for the        its DIR_LEASE_RELEASE
                       holder's creates; ``next_ino`` is past       (given back or expired);
                       them); after a DIR_LEASE_REFILL those are    may outlive its directory
                       its ids and ``earlier_first_ino``,           until then
                       ``earlier_inos`` the range it had
``K<client>``          map: ``since`` (wall ns of its record)      a client that may hold
                                                                    file locks (``lock_*``:
                                                                    the lock table itself is
                                                                    volatile); after a restart
                                                                    or failover the lock
                                                                    service waits for these to
                                                                    reclaim (``meta.services.
                                                                    locks``); goes once the
                                                                    client held none for a
                                                                    while, or unmounted
``M<name>``            int / bytes                                  counters and identity:
                                                                    ``next_ino``,
                                                                    ``next_block_id``,
                                                                    ``genstamp`` (last used),
                                                                    ``applied_txid``,
                                                                    ``namespace_id``,
                                                                    ``layout_version``,
                                                                    ``files``, ``dirs``,
                                                                    ``next_token``,
                                                                    ``quota_dirs`` (dirs with
                                                                    a quota);
                                                                    ``checkpoint_txid``,
                                                                    ``checkpoint_time`` (ns):
                                                                    the last checkpoint, put
                                                                    by its synced write (not
                                                                    journaled; checkpoint.py)
====================  ==========================================  ===========================

Anything else in the store (e.g. ``kv.py``'s ``\\x00sync`` marker) is not namespace data.
"""

from __future__ import annotations

import struct

import msgpack

from fs.frames import packb

from .inode import Inode

ROOT_INO = 1
LAYOUT_VERSION = 1

INODE = b"I"
BLOCK = b"B"
DENTRY = b"D"
# after the inodes, not right after the entries: a scan of an empty directory's entries
# walks LevelDB tombstones up to the next live key, and the root inode is always live
INLINE = b"L"
UNDER_CONSTRUCTION = b"U"
ORPHAN = b"O"
DELEGATION_TOKEN = b"T"
DIR_LEASE = b"W"
LOCK_HOLDER = b"K"
META = b"M"

_INO = struct.Struct(">Q")
_INO_INDEX = struct.Struct(">QI")

# counter names (the M keys)
NEXT_INO = "next_ino"
NEXT_BLOCK_ID = "next_block_id"
GENSTAMP = "genstamp"
APPLIED_TXID = "applied_txid"
NAMESPACE_ID = "namespace_id"
LAYOUT = "layout_version"
FILES = "files"
DIRS = "dirs"
NEXT_TOKEN = "next_token"   # sequence number of the next delegation token
QUOTA_DIRS = "quota_dirs"   # folders with a quota: 0 spares every op the parent-chain walk
COUNTERS = (NEXT_INO, NEXT_BLOCK_ID, GENSTAMP, APPLIED_TXID, NAMESPACE_ID, LAYOUT, FILES, DIRS,
            NEXT_TOKEN, QUOTA_DIRS)
# written by checkpoints, not by journal records
CHECKPOINT_TXID = "checkpoint_txid"
CHECKPOINT_TIME = "checkpoint_time"


def encode_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


# ------------------------------------------------------------------ keys
def inode_key(ino: int) -> bytes:
    return INODE + _INO.pack(ino)


def block_key(ino: int, index: int) -> bytes:
    return BLOCK + _INO_INDEX.pack(ino, index)


def block_prefix(ino: int) -> bytes:
    return BLOCK + _INO.pack(ino)


def inline_key(ino: int) -> bytes:
    return INLINE + _INO.pack(ino)


def dentry_key(parent: int, name: str) -> bytes:
    return DENTRY + _INO.pack(parent) + encode_name(name)


def dentry_prefix(parent: int) -> bytes:
    return DENTRY + _INO.pack(parent)


def uc_key(ino: int) -> bytes:
    return UNDER_CONSTRUCTION + _INO.pack(ino)


def orphan_key(ino: int) -> bytes:
    return ORPHAN + _INO.pack(ino)


def token_key(seq: int) -> bytes:
    return DELEGATION_TOKEN + _INO.pack(seq)


def dir_lease_key(ino: int) -> bytes:
    return DIR_LEASE + _INO.pack(ino)


def lock_holder_key(client: str) -> bytes:
    return LOCK_HOLDER + client.encode("utf-8", "surrogatepass")


def meta_key(name: str) -> bytes:
    return META + name.encode("ascii")


# ------------------------------------------------------------------ key parsing
def parse_inode_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_block_key(key: bytes) -> tuple[int, int]:
    return _INO_INDEX.unpack_from(key, 1)


def parse_dentry_key(key: bytes) -> tuple[int, str]:
    return _INO.unpack_from(key, 1)[0], decode_name(key[1 + _INO.size:])


def parse_inline_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_uc_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_orphan_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_token_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_dir_lease_key(key: bytes) -> int:
    return _INO.unpack_from(key, 1)[0]


def parse_lock_holder_key(key: bytes) -> str:
    return key[len(LOCK_HOLDER):].decode("utf-8", "surrogatepass")


def after_name(parent: int, name: str) -> bytes:
    """The smallest dentry key strictly after ``name`` (names never contain NUL)."""
    return dentry_key(parent, name) + b"\x00"


# ------------------------------------------------------------------ values
def pack(value) -> bytes:
    """A value for the store: an ``Inode`` as its map, anything else as it is."""
    return packb(value.to_wire() if type(value) is Inode else value)


def unpack(raw: bytes):
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def unpack_value(key: bytes, raw: bytes):
    """The stored value of ``key`` decoded: an ``Inode`` for an inode key."""
    value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return Inode.from_wire(value) if key[:1] == INODE else value


def read_counter(kv, name: str, default: int = 0):
    """One ``M`` counter straight from a store (offline tools; the server keeps its own)."""
    raw = kv.get(meta_key(name))
    return default if raw is None else unpack(raw)
