"""CPython garbage-collector policy for the metadata server process.

Why: the server holds its namespace cache (up to ``namespace_cache_entries`` decoded inodes
and directory entries), the retry cache and the lease tables as millions of small Python
objects, and CPython's full (generation 2) collection walks every tracked object each
time. Measured with a gc callback during ``leasefs bench meta`` (16 000 files): full passes
of 40–165 ms, growing with the namespace, each one stalling every RPC of the server (it
was why the read phases of the benchmark swung by 2x). These objects are long-lived and
acyclic, so the survivors of each full collection move to the permanent generation
(``gc.freeze()``): the next full pass only walks what was allocated since. Frozen objects
are still freed by reference counting; only cyclic garbage among them waits for the
periodic ``gc.unfreeze(); gc.collect()`` every ``gc_full_collect_interval`` seconds: one
long pause per interval instead of one per few thousand mutations.

The youngest generation is collected every ``YOUNG_THRESHOLD`` allocations instead of
CPython's 700: an RPC allocates a few dozen containers that die by reference counting a
moment later, but with a 700 threshold a collection came every dozen calls and walked the
calls in flight and the walks and entries just cached, promoting them for the older
generations to walk again (measured in-process: a third of a getFileInfo's CPU). A young
collection of this size still takes well under a millisecond.

Concurrency contract: process-global (the ``gc`` module). ``install`` from the trio thread of
the process's one metadata server; a second ``install`` while one is active is refused
(tests run several servers in one process: only the first one governs).
"""

from __future__ import annotations

import gc
import logging
import time

import trio

log = logging.getLogger(__name__)

_active: "GcGovernor | None" = None

#: allocations between two collections of the youngest generation (CPython's default: 700)
YOUNG_THRESHOLD = 20_000


class GcGovernor:
    def __init__(self, interval: float):
        self.interval = interval
        self.full_collections = 0     # automatic full collections, each followed by a freeze
        self.longest_full_ms = 0.0
        self._started = 0.0
        self._own_collection = False

    def _on_gc(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2 or self._own_collection:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.full_collections += 1
        self.longest_full_ms = max(self.longest_full_ms,
                                   (time.perf_counter() - self._started) * 1000)
        gc.freeze()

    def stats(self) -> dict:
        return {"frozen_objects": gc.get_freeze_count(), "full_collections": self.full_collections,
                "longest_full_ms": round(self.longest_full_ms, 1),
                "interval": self.interval}

    async def run(self) -> None:
        """Install, then every ``interval`` seconds collect everything once (frozen
        objects included) and freeze the survivors; uninstall when cancelled."""
        global _active
        if _active is not None or self.interval <= 0:
            await trio.sleep_forever()
        _active = self
        gc.callbacks.append(self._on_gc)
        thresholds = gc.get_threshold()
        gc.set_threshold(max(YOUNG_THRESHOLD, thresholds[0]), *thresholds[1:])
        try:
            gc.collect()
            gc.freeze()        # what recovery loaded is long-lived
            while True:
                await trio.sleep(self.interval)
                started = time.perf_counter()
                self._own_collection = True
                try:
                    gc.unfreeze()
                    found = gc.collect()
                    gc.freeze()
                finally:
                    self._own_collection = False
                log.info("full garbage collection: %d unreachable objects, %.0f ms, %d objects "
                         "frozen", found, (time.perf_counter() - started) * 1000,
                         gc.get_freeze_count())
        finally:
            gc.callbacks.remove(self._on_gc)
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            _active = None
