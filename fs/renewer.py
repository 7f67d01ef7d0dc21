"""The client's lease renewer: keeps the leases of a client's open output streams alive.

Why: the metadata server holds one lease per client (holder name) covering every file the
client has open for writing. If the client stops renewing, another client may take the file
over after the soft limit and the server recovers it itself after the hard limit (HDFS
LeaseRenewer). One ``renew_lease(client_name)`` call renews all of the client's files at once,
so one renewer per client is enough.

Behaviour: while at least one output stream is registered, call ``renew()`` every
``period`` seconds (``config.renew_period`` = soft limit / 2 by default). A failed renewal is
logged and retried at the next period; once renewals have failed for longer than
``hard_limit`` seconds since the last success, the lease is surely gone, so every registered
stream is aborted with ``LeaseExpired`` (their next write/close raises it). The task ends
at the end of a period in which no stream is left registered (not the moment the last one
goes: files opened and closed one after another, a tree being extracted, keep one task
instead of starting one each); ``add`` starts it again.

Concurrency contract: all methods run on the client's trio thread. ``add``/``remove`` are
synchronous and may be called from any task; the renew loop runs as one task in the
nursery handed to the constructor. The clock is trio's, so tests can use short periods.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Protocol

import trio

from .errors import LeaseExpired, LeaseFSError

log = logging.getLogger(__name__)


class Abortable(Protocol):
    """What the renewer needs of an output stream."""

    path: str

    def abort(self, exc: LeaseFSError) -> None: ...


class LeaseRenewer:
    """Renews one holder's lease while it has files open; aborts them when it cannot."""

    def __init__(self, renew: Callable[[], Awaitable[object]], *, holder: str,
                 period: float, hard_limit: float, nursery: trio.Nursery):
        if period <= 0:
            raise ValueError("renew period must be positive")
        self._renew = renew
        self.holder = holder
        self.period = period
        self.hard_limit = hard_limit
        self._nursery = nursery
        self._streams: dict[int, Abortable] = {}
        self._running = False
        #: trio time of the last successful renewal (or of the first file opened)
        self.last_success: float | None = None
        #: renewals done and failed, for logs and tests
        self.renewals = 0
        self.failures = 0

    @property
    def open_streams(self) -> list[Abortable]:
        return list(self._streams.values())

    def add(self, stream: Abortable) -> None:
        """Register an output stream; starts the renew task if it is not running."""
        if not self._streams:
            # the create/append that opened the file just renewed the lease on the server
            # (a task still running out its period with no stream starts from here too)
            self.last_success = trio.current_time()
        self._streams[id(stream)] = stream
        if not self._running:
            self._running = True
            self._nursery.start_soon(self._run, name=f"lease-renewer {self.holder}")

    def remove(self, stream: Abortable) -> None:
        """Unregister a stream (closed or aborted); the task ends at the end of its period
        when none is left then."""
        self._streams.pop(id(stream), None)

    async def _run(self) -> None:
        try:
            while True:
                await trio.sleep(self.period)
                if not self._streams:
                    break
                await self.renew_once()
        finally:
            self._running = False
        log.debug("lease renewer for %s stopped: no files open", self.holder)

    async def renew_once(self) -> bool:
        """One renewal attempt; aborts the open streams once the hard limit has passed."""
        now = trio.current_time()
        limit = max(self.period, 0.1)
        try:
            with trio.fail_after(limit):
                await self._renew()
        except (LeaseFSError, trio.TooSlowError) as exc:
            self.failures += 1
            failing_for = now - (self.last_success if self.last_success is not None else now)
            # an exception is always true: its text may still be empty (TooSlowError's is)
            cause = f"no answer within {limit:g} s" if isinstance(exc, trio.TooSlowError) \
                else str(exc) or type(exc).__name__
            log.warning("lease renewal for %s failed (%s); failing for %.1f s of %.1f s allowed",
                        self.holder, cause, failing_for, self.hard_limit)
            if failing_for > self.hard_limit:
                self._abort_all(failing_for)
            return False
        self.renewals += 1
        self.last_success = trio.current_time()
        return True

    def _abort_all(self, failing_for: float) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for stream in streams:
            stream.abort(LeaseExpired(
                f"{stream.path}: lease of {self.holder} could not be renewed for "
                f"{failing_for:.1f} s (hard limit {self.hard_limit:g} s); the file was "
                f"abandoned and its data after the last hflush may be lost"))
        log.error("lease of %s lost: aborted %d open file(s)", self.holder, len(streams))
