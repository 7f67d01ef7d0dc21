"""What one server lets its peers hold: connections per peer and in all, and request bytes
buffered across all connections.

Why it exists: a peer that opens connections and never uses them, or starts large frames
and never finishes them, must not make the server keep unbounded sockets or memory. The
limits are one server's (shared by its connections); the timeouts that free what a slow
peer holds live with the protocol code (``fs.rpc.serve_rpc``, ``storage.transfer``).

- ``ConnectionLimits``: admits a new connection or names why not (pure counting, no I/O);
- ``Admission``: a TCP connection counted as unauthenticated until it authenticates, then
  as authenticated (two ``ConnectionLimits``);
- ``ByteBudget``: bytes that connections reserve before buffering a large frame; a
  reservation that does not fit waits (first come, first served) until others release;
- ``RefusalLog``: one WARNING per refused peer and reason, then a count at most every
  ``interval`` seconds (a flood of refusals does not become a flood of log lines).

Concurrency contract: all of them live in the server's trio thread; ``ByteBudget.acquire`` is
the only call that waits, every other call is synchronous.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import trio

from .errors import FrameTooLarge

class ConnectionLimits:
    """Open connections per peer host and in total; ``0`` means no limit."""

    @classmethod
    def from_config(cls, config) -> "ConnectionLimits":
        return cls(config.max_connections, config.max_connections_per_peer)

    def __init__(self, max_total: int, max_per_peer: int):
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self.total = 0
        self._per_peer: dict[str, int] = {}

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host``, or return why it is refused (uncounted)."""
        held = self._per_peer.get(host, 0)
        if self.max_per_peer and held >= self.max_per_peer:
            return f"{held} connections from {host} already open (limit {self.max_per_peer})"
        if self.max_total and self.total >= self.max_total:
            return f"{self.total} connections already open (limit {self.max_total})"
        self._per_peer[host] = held + 1
        self.total += 1
        return None

    def release(self, host: str) -> None:
        """An admitted connection from ``host`` closed."""
        held = self._per_peer.get(host, 0) - 1
        if held > 0:
            self._per_peer[host] = held
        else:
            self._per_peer.pop(host, None)
        self.total -= 1


class Admission:
    """One TCP connection's place in its server's counts: admitted into ``pending`` (the
    connections that have not authenticated) and, once it authenticates, moved into
    ``limits`` (``authenticated()``). So peers that never authenticate fill only their own
    budget, never the one of those that did."""

    def __init__(self, host: str, limits: ConnectionLimits, pending: ConnectionLimits):
        self.host = host
        self._limits = limits
        self._pending = pending
        self._held: ConnectionLimits | None = None

    def admit(self) -> str | None:
        """Count the new connection as unauthenticated, or why it is refused."""
        why = self._pending.admit(self.host)
        if why is None:
            self._held = self._pending
            return None
        return f"unauthenticated: {why}"

    def authenticated(self) -> str | None:
        """Move the connection into the authenticated count, or why that is full (it
        stays counted where it was until ``release``)."""
        if self._held is not self._pending:
            return None
        why = self._limits.admit(self.host)
        if why is not None:
            return why
        self._pending.release(self.host)
        self._held = self._limits
        return None

    def release(self) -> None:
        if self._held is not None:
            self._held.release(self.host)
            self._held = None


class RefusalLog:
    """Logs refusals at WARNING (the peer's doing, not the server's): the first of each
    ``(peer, kind)`` at once, repeats as one line with their count at most every
    ``interval`` seconds."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0, clock=time.monotonic):
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._seen: dict[tuple[str, str], list] = {}   # (peer, kind) -> [last logged, unlogged]

    def refused(self, peer: str, kind: str, message: str) -> None:
        now = self.clock()
        key = (peer, kind)
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return
        repeats = f" ({entry[1]} more like it since the last report)" if entry and entry[1] else ""
        self.logger.warning("%s%s", message, repeats)
        self._seen[key] = [now, 0]
        if len(self._seen) > 10_000:   # many distinct peers: forget the oldest reports
            for old in list(self._seen)[:5_000]:
                del self._seen[old]


class ByteBudget:
    """A server-wide allowance of buffered request bytes.

    ``acquire(n)`` reserves ``n`` bytes, waiting while they do not fit; waiters are served in
    arrival order, so a large reservation is not starved by smaller ones. A request larger
    than the whole budget can never fit and raises ``FrameTooLarge`` at once."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiters: deque[list] = deque()   # [bytes wanted, event]

    async def acquire(self, n: int) -> None:
        if n > self.limit:
            raise FrameTooLarge(f"a frame of {n} bytes is larger than this server's request "
                                f"buffer of {self.limit} bytes")
        if self.fits(n):
            self.used += n
            return
        entry = [n, trio.Event()]
        self._waiters.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry[1].is_set():        # granted just as we were cancelled: hand it back
                self.release(n)
            else:
                self._waiters.remove(entry)
                self._grant()            # we may have been the head blocking smaller ones
            raise

    def fits(self, n: int) -> bool:
        """Whether ``acquire(n)`` would take its bytes at once, without waiting."""
        return not self._waiters and self.used + n <= self.limit

    def release(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, event = self._waiters.popleft()
            self.used += n
            event.set()
