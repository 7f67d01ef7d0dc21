"""The namespace's allocation counters: the next inode id, the next block id and the
generation stamp.

Why a part of its own: the planners take ids and stamps when they decide, the applier
persists them, and the block side asks for block ids and stamps of its own; one small
object whose constructor needs nothing is what all of them share.

Concurrency contract: trio thread only. The counters advance in memory when a plan is
made and never go back (``adopt``: ``max`` of stored and used), so an abandoned plan only
leaves a gap.
"""

from __future__ import annotations

from ..schema import keys


class Allocators:
    """Next inode id, next block id and generation stamp, in memory."""

    def __init__(self):
        self._next_ino = 0
        self._next_block_id = 0
        self._genstamp = 0

    def adopt(self, counters: dict) -> None:
        """``counters`` are the stored ones now (read, or just written by ``apply``). The
        allocators never go back: a plan not applied yet may have used ids past them."""
        self._next_ino = max(self._next_ino, int(counters.get(keys.NEXT_INO, 0)))
        self._next_block_id = max(self._next_block_id, int(counters.get(keys.NEXT_BLOCK_ID, 0)))
        self._genstamp = max(self._genstamp, int(counters.get(keys.GENSTAMP, 0)))

    @property
    def genstamp(self) -> int:
        return self._genstamp

    def allocate_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def allocate_inos(self, count: int) -> int:
        """``count`` consecutive inode ids (a directory lease's reservation: its holder
        creates files under them); the first. Its record moves the stored counter past
        them, so they are never handed out again, after a restart or on a successor."""
        first = self._next_ino
        self._next_ino += count
        return first

    def allocate_block_id(self) -> int:
        block_id = self._next_block_id
        self._next_block_id += 1
        return block_id

    def next_genstamp(self) -> int:
        self._genstamp += 1
        return self._genstamp
