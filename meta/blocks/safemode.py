"""Safe mode: read-only until enough of the namespace's blocks are reported.

Why it exists: right after a start the metadata server knows every block but no replica;
letting clients mutate (or the server schedule deletions) before the block servers have
reported would act on a picture that is mostly "missing". HDFS's rule: stay read-only until
the reported fraction of complete blocks reaches ``safemode_threshold``, then wait
``safemode_extension`` seconds more for stragglers (no extension when there are no blocks).
A manual safe mode (``leasefs safemode enter``) never ends by itself; ``leave`` ends either.

Pure state machine: no I/O, no clock (``now`` is passed in). The server feeds it block
counts from the blocks map after each report and from a monitor tick, and calls ``check``
before every mutation.

Concurrency contract: trio thread only; atomic methods.
"""

from __future__ import annotations

import logging
import math

from fs.errors import SafeMode

log = logging.getLogger(__name__)


class SafeModeState:
    def __init__(self, threshold: float = 0.999, extension: float = 30.0, min_storage: int = 0):
        self.threshold = threshold
        self.extension = extension
        self.min_storage = min_storage
        self.on = True
        self.manual = False
        self.reached_at: float | None = None
        self._numbers = (0, 0, 0)   # safe blocks, total blocks, live nodes
        self._now = 0.0

    # ------------------------------------------------------------------ transitions
    def _threshold_met(self, safe: int, total: int, live: int) -> bool:
        if live < self.min_storage:
            return False
        return total == 0 or safe >= self.threshold * total - 1e-9

    def update(self, now: float, safe: int, total: int, live: int) -> bool:
        """Feed current counts; returns True when this call turned safe mode off."""
        self._numbers, self._now = (safe, total, live), now
        if not self.on or self.manual:
            return False
        if not self._threshold_met(safe, total, live):
            self.reached_at = None
            return False
        if total == 0 or self.extension <= 0:
            return self._leave("threshold reached")
        if self.reached_at is None:
            self.reached_at = now
            log.info("safe mode: threshold reached (%d of %d blocks); leaving in %.1f s",
                     safe, total, self.extension)
            return False
        if now - self.reached_at >= self.extension:
            return self._leave("threshold reached and extension passed")
        return False

    def _leave(self, why: str) -> bool:
        self.on = False
        self.manual = False
        self.reached_at = None
        safe, total, live = self._numbers
        log.info("safe mode is OFF (%s): %d of %d blocks reported, %d live block servers",
                 why, safe, total, live)
        return True

    def enter(self) -> None:
        """Manual safe mode (admin): stays on until ``leave``."""
        self.on = True
        self.manual = True
        self.reached_at = None
        log.info("safe mode entered manually")

    def leave(self) -> None:
        """Manual leave: ends manual and start-up safe mode alike."""
        if self.on:
            self._leave("left manually")

    # ------------------------------------------------------------------ reporting
    @property
    def reason(self) -> str:
        if not self.on:
            return "Safe mode is OFF."
        if self.manual:
            return ("Safe mode is ON. It was turned on manually. "
                    "Use 'leasefs safemode leave' to turn it off.")
        safe, total, live = self._numbers
        servers = (f" {live} live block servers, {self.min_storage} needed."
                   if live < self.min_storage else "")
        if live < self.min_storage and (total == 0 or safe >= self.threshold * total - 1e-9):
            return f"Safe mode is ON.{servers} ({safe} of {total} blocks reported)"
        if self._threshold_met(safe, total, live) and self.reached_at is not None:
            left = max(0.0, self.extension - (self._now - self.reached_at))
            return (f"Safe mode is ON. The reported blocks {safe} reached the threshold "
                    f"{self.threshold:.4f} of total blocks {total}. Safe mode will be turned "
                    f"off automatically in {left:.0f} seconds.")
        need = max(0, math.ceil(self.threshold * total - 1e-9) - safe)
        return (f"Safe mode is ON. The reported blocks {safe} needs additional {need} blocks "
                f"to reach the threshold {self.threshold:.4f} of total blocks {total}.{servers}")

    def status(self) -> dict:
        return {"on": self.on, "manual": self.manual, "reason": self.reason}

    def check(self, what: str) -> None:
        """Refuse a mutation while safe mode is on; ``what`` names the operation and path."""
        if self.on:
            raise SafeMode(f"cannot {what}: name node is in safe mode. {self.reason}")
