"""A long walk on the metadata server's trio thread that lets other calls in.

Why it exists: summaries (content summary, fsck, a recursive permission check) walk a whole
subtree between two replies; counting inodes between yields made each step cost what the
inodes cost (a folder of 100k entries held every other client for ~0.2 s). ``TimeSlice``
yields by the clock instead: whatever an inode costs, no step runs longer than ``seconds``
plus one inode.

Concurrency contract: one per walk, used by the task that walks; trio thread only.
"""

from __future__ import annotations

import time

import trio

#: trio-thread time a walk may take before it lets the other calls run
WALK_SLICE = 0.002


class TimeSlice:
    def __init__(self, seconds: float = WALK_SLICE):
        self.seconds = seconds
        self._until = time.perf_counter() + seconds

    async def tick(self) -> None:
        """Call between two units of work: yields once the slice is used up."""
        if time.perf_counter() >= self._until:
            await trio.sleep(0)
            self._until = time.perf_counter() + self.seconds
