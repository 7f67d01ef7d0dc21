"""HDFS's RetryCache for the RPC server: the replies of mutating calls by
``(client_id, call_id, method)``, so a call retried after a lost reply is answered, not
applied twice.

Concurrency contract: used from the tasks of one trio thread (``fs.rpc.Dispatcher``); no
locks, a duplicate that arrives while its first call runs waits on a ``trio.Event``.
"""

from __future__ import annotations

import collections
import math
import time

import trio


class RetryCache:
    """HDFS RetryCache: remembers replies of mutating calls by ``(client_id, call_id)``.

    A duplicate that arrives while the first is still running waits for its outcome. Entries
    expire after ``expiry`` seconds (clock injected, so the cache is testable without sleeps).

    The entries live in an ``OrderedDict`` (a linked list): purging takes them from the
    oldest end, one or a few per call. A plain dict looked the same but is not: its oldest
    key is found by walking past every slot deleted before it until the dict is resized,
    so once the cache was full (``max_entries``, ~80 s of creates at 16 clients) every
    mutating call paid a walk over tens of thousands of holes (a fifth of the server's
    thread at 200 000 files). An entry gets a ``trio.Event`` only when a duplicate waits
    for it and drops it when finished, so a full cache holds only outcomes.
    """

    def __init__(self, expiry: float = 600.0, max_entries: int = 200_000, clock=time.monotonic):
        self.expiry = expiry
        self.max_entries = max_entries
        self.clock = clock
        # key -> [expires_at (inf while running), event (made by the first duplicate that
        # waits, None once finished), ok, value]
        self._entries: collections.OrderedDict[tuple, list] = collections.OrderedDict()

    def __len__(self):
        return len(self._entries)

    async def run(self, key: tuple, thunk):
        """Run ``thunk`` once per key. A duplicate that arrives while the first runs waits
        for it: a success is answered from the cache; a failure is not cached (as in HDFS,
        a failed call changed nothing), so the retry runs the call again."""
        while True:
            entry = self._entries.get(key)
            if entry is None:
                break
            if entry[0] == math.inf:   # still running: wait for its outcome
                if entry[1] is None:
                    entry[1] = trio.Event()
                await entry[1].wait()
            if entry[2]:
                return entry[3]
            if self._entries.get(key) is entry:   # a failure left in place: run again
                del self._entries[key]
        self._purge()
        entry = [math.inf, None, False, None]
        self._entries[key] = entry
        try:
            value = await thunk()
            entry[2], entry[3] = True, value
            entry[0] = self.clock() + self.expiry
            return value
        except BaseException:
            # failed, cancelled or a bug: forget it, so that a retry runs the call again
            entry[0] = -math.inf
            if self._entries.get(key) is entry:
                del self._entries[key]
            raise
        finally:
            event, entry[1] = entry[1], None
            if event is not None:
                event.set()

    def _purge(self) -> None:
        """Drop expired entries from the oldest end (insertion order, which is near enough
        to expiry order), plus the oldest beyond ``max_entries``. Stops at the first live
        entry, so a call costs O(entries removed), never a scan of the cache: this runs on
        every mutating RPC."""
        now = self.clock()
        entries = self._entries
        while entries:
            key = next(iter(entries))
            if entries[key][0] <= now or len(entries) >= self.max_entries:
                del entries[key]
            else:
                break
