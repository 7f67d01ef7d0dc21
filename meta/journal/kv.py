"""The small ordered key-value interface the namespace is written against.

Two stores implement it: ``PlyvelStore`` (LevelDB, the real one) and ``MemoryStore`` (a
SortedDict, for fast unit tests); the namespace conformance suite runs against both.

Semantics: keys and values are ``bytes``; ``scan`` yields ``(key, value)`` with the prefix in
key order starting at ``start`` (inclusive); ``write`` applies all puts and deletes
atomically. ``sync=True`` makes that write durable before returning (LevelDB's sync write);
ordinary writes reach LevelDB's own log but are not fsynced — the edit journal is what makes
mutations durable, LevelDB is caught up from it at restart.

``PlyvelStore.snapshot`` is a read-only view frozen at the moment it is taken, read in
bounded pieces: the image a follower behind the replicated log bootstraps from
(``meta.ha.bootstrap``).

Concurrency contract: not thread-safe by itself; the metadata server only touches it from the
trio thread (LevelDB calls on small keys are microseconds), except ``sync`` during a
checkpoint, which it runs in a worker thread while no writes happen.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from sortedcontainers import SortedDict

from fs.datafolder import make_private_folder


class KVStore:
    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def scan(self, prefix: bytes, start: bytes | None = None,
             limit: int | None = None) -> Iterator[tuple[bytes, bytes]]:
        raise NotImplementedError

    def write(self, puts: Iterable[tuple[bytes, bytes]] = (), deletes: Iterable[bytes] = (),
              sync: bool = False) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        """Make every earlier write durable."""
        self.write(puts=[(b"\x00sync", b"")], sync=True)

    def close(self) -> None:
        pass


class MemoryStore(KVStore):
    """In-memory ordered store; durability is a no-op."""

    def __init__(self):
        self._data = SortedDict()

    def get(self, key):
        return self._data.get(bytes(key))

    def scan(self, prefix, start=None, limit=None):
        lo = max(prefix, start) if start is not None else prefix
        count = 0
        for key in self._data.irange(minimum=lo):
            if not key.startswith(prefix) or (limit is not None and count >= limit):
                return
            count += 1
            yield key, self._data[key]

    def write(self, puts=(), deletes=(), sync=False):
        for key in deletes:
            self._data.pop(bytes(key), None)
        for key, value in puts:
            self._data[bytes(key)] = bytes(value)

    def sync(self):
        pass

    def __len__(self):
        return len(self._data)


class PlyvelStore(KVStore):
    """LevelDB through plyvel. Deletes are applied before puts inside one write batch."""

    def __init__(self, path: str, *, create: bool = True, lru_cache_size: int = 64 << 20):
        import plyvel  # imported here so MemoryStore users need no LevelDB

        make_private_folder(path)
        self.path = path
        # a bloom filter per table (10 bits a key, ~1% false positives): a get of a key
        # that does not exist (every create looks its new name up) otherwise reads a block
        # of every level that may hold it, more of them as the store grows; tables written
        # before it was set are read as before and get one when compacted
        self._db = plyvel.DB(path, create_if_missing=create, lru_cache_size=lru_cache_size,
                             write_buffer_size=16 << 20, bloom_filter_bits=10)

    def get(self, key):
        return self._db.get(bytes(key))

    def scan(self, prefix, start=None, limit=None):
        kwargs = {"prefix": prefix} if start is None else {
            "start": max(prefix, start), "stop": _prefix_end(prefix)}
        with self._db.iterator(**kwargs) as it:
            # islice stops at ``limit`` without asking for one more: LevelDB would walk
            # every tombstone up to the next live key to answer that
            yield from itertools.islice(it, limit)

    def write(self, puts=(), deletes=(), sync=False):
        with self._db.write_batch(sync=sync) as batch:
            for key in deletes:
                batch.delete(bytes(key))
            for key, value in puts:
                batch.put(bytes(key), bytes(value))

    def snapshot(self) -> "StoreSnapshot":
        """The store as it is now, unchanged by later writes (LevelDB keeps what it needs
        until ``close``): taken on the trio thread between two applied batches, it is the
        namespace at exactly one txid."""
        return StoreSnapshot(self._db.snapshot())

    def close(self):
        if not self._db.closed:
            self._db.close()


class StoreSnapshot:
    """A LevelDB snapshot read a bounded piece at a time (``meta.ha.bootstrap``)."""

    def __init__(self, snap):
        self._snap = snap

    def get(self, key: bytes) -> bytes | None:
        return self._snap.get(bytes(key))

    def items_after(self, after: bytes | None, max_bytes: int) -> tuple[list, bool]:
        """``([(key, value), ...], done)``: the pairs after key ``after`` (from the first
        key when None), in key order, until ``max_bytes`` of keys and values (at least one
        pair); ``done`` when none is left after them."""
        out: list[tuple[bytes, bytes]] = []
        size = 0
        kwargs = {} if after is None else {"start": bytes(after), "include_start": False}
        with self._snap.iterator(**kwargs) as it:
            for key, value in it:
                if out and size + len(key) + len(value) > max_bytes:
                    return out, False
                out.append((key, value))
                size += len(key) + len(value)
        return out, True

    def close(self) -> None:
        self._snap.close()


def _prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)
