"""HDFS's RetryCache for the RPC server: the replies of mutating calls by
``(client_id, call_id, method)``, so a call retried after a lost reply is answered, not
applied twice.

It survives a failover or a restart as HDFS's does: while a cached call runs, its key is
the task's ``current_call()``, and the metadata server's journal writes it into the records
the call logs; every server that applies such a record (a standby following the log, a
server replaying its journal) ``note``s the key as "applied, answer not known", with what
the record kept of the answer that the state no longer holds (``kept``). A retry that
meets such an entry gets the answer its ``rebuild`` makes from the current state and
``kept`` instead of running the call a second time.

A restart notes what the journal says was applied in the background (the server answers
once its replay is done): from ``hold`` until ``release`` every ``run`` waits, so a call
that carries a retry key (one that could be a retry) is looked up only once the cache knows
every call the look back would find, and a retried call is never run twice. Calls without a
key (reads, heartbeats, block reports) do not come here and are not held.

Concurrency contract: used from the tasks of one trio thread (``fs.rpc.Dispatcher``); no
locks, a duplicate that arrives while its first call runs waits on a ``trio.Event``, and
so does every call while the cache is held.
``current_call`` is a context variable: it is the key only inside the task running the
call (and tasks it would spawn, which cached handlers do not).
"""

from __future__ import annotations

import collections
import contextvars
import math
import time
from functools import partial
from typing import NamedTuple

import trio

from .errors import InternalError


class CallKey(NamedTuple):
    """Who made a retry-cached call: the cache key, and its wire form in journal records
    (``[client_id, call_id, method]``)."""

    client_id: str
    call_id: int
    method: str

    def to_wire(self) -> list:
        return [self.client_id, self.call_id, self.method]

    @classmethod
    def from_wire(cls, value) -> CallKey | None:
        """The key of a record's ``rpc`` value; None for anything else (ignored, not
        refused: a record is applied whatever its tag looks like)."""
        if (isinstance(value, (list, tuple)) and len(value) == 3
                and isinstance(value[0], str) and type(value[1]) is int
                and isinstance(value[2], str)):
            return cls(value[0], value[1], value[2])
        return None


_CURRENT_CALL: contextvars.ContextVar[CallKey | None] = contextvars.ContextVar(
    "leasefs_retry_cached_call", default=None)


def current_call() -> CallKey | None:
    """The key of the retry-cached call the current task runs (None outside one: monitors,
    uncached calls, replay)."""
    return _CURRENT_CALL.get()


# ``entry[2]`` of a key some applied journal record carried, whose answer this server never
# had (it was another server's call, or this one's before a restart)
APPLIED = "applied"


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
        # waits, None once finished), ok (True, or APPLIED: noted, answer unknown), value]
        self._entries: collections.OrderedDict[tuple, list] = collections.OrderedDict()
        # set while a look back is noting calls (``hold``): ``run`` waits for it
        self._held: trio.Event | None = None

    def __len__(self):
        return len(self._entries)

    async def run(self, key: tuple, thunk, rebuild=None):
        """Run ``thunk`` once per key. A duplicate that arrives while the first runs waits
        for it: a success is answered from the cache; a failure is not cached (as in HDFS,
        a failed call changed nothing), so the retry runs the call again.

        A key ``note``d as applied (answer unknown) runs ``rebuild(kept)`` instead, with
        the note's ``kept``: it makes the first call's answer from the current state (or
        decides a second run is safe); its answer is cached as the call's. A failed
        rebuild leaves the note in place, so a later retry never runs the call blindly.
        Without ``rebuild`` such a key is an ``InternalError``. While ``thunk``/``rebuild``
        run, ``current_call()`` is ``key``."""
        if self._held is not None:
            await self._held.wait()
        noted = None   # expiry and kept of the note a rebuild replaces
        while True:
            entry = self._entries.get(key)
            if entry is None:
                break
            if entry[0] == math.inf:   # still running: wait for its outcome
                if entry[1] is None:
                    entry[1] = trio.Event()
                await entry[1].wait()
            if entry[2] is True:
                return entry[3]
            if self._entries.get(key) is not entry:
                continue
            del self._entries[key]
            if entry[2] is APPLIED and entry[0] > self.clock():
                if rebuild is None:
                    raise InternalError(f"{key[-1]}: this call was applied before a failover "
                                        f"or restart and its answer cannot be rebuilt here")
                noted = entry[0], entry[3]
                thunk = partial(rebuild, entry[3])
                break
            # a failure left in place, or an expired note: run again
        self._purge()
        entry = [math.inf, None, False, None]
        self._entries[key] = entry
        # the dispatcher's keys are (client_id, call_id, method): what records carry
        token = _CURRENT_CALL.set(CallKey(*key) if len(key) == 3 else None)
        try:
            value = await thunk()
            entry[2], entry[3] = True, value
            entry[0] = self.clock() + self.expiry
            return value
        except BaseException:
            if noted is not None:
                # the call is still known applied: keep it so
                (entry[0], entry[3]), entry[2] = noted, APPLIED
            else:
                # failed, cancelled or a bug: forget it, so that a retry runs the call again
                entry[0] = -math.inf
                if self._entries.get(key) is entry:
                    del self._entries[key]
            raise
        finally:
            _CURRENT_CALL.reset(token)
            event, entry[1] = entry[1], None
            if event is not None:
                event.set()

    def hold(self) -> None:
        """Until ``release``, ``run`` waits: the calls applied before a restart are being
        ``note``d (``note_all``), and a retry of one must not run before its note is in."""
        if self._held is None:
            self._held = trio.Event()

    def release(self) -> None:
        """The look back is done (or gave up): the calls ``hold`` kept waiting go on."""
        held, self._held = self._held, None
        if held is not None:
            held.set()

    def note(self, key: tuple, kept=None) -> None:
        """A journal record applied here says call ``key`` was carried out, with an answer
        this server does not know: a retry gets ``run``'s ``rebuild(kept)``. ``kept``: what
        the record kept of the answer for it (opaque here; None: nothing). A key already
        known (this server's own call, running or answered) is left as it is. Expires like
        any entry, from now (records carry no time)."""
        if key in self._entries:
            return
        self._purge()
        self._entries[key] = [self.clock() + self.expiry, None, APPLIED, kept]

    def note_all(self, notes) -> int:
        """``note`` each ``(key, kept)`` of ``notes`` (a slice of a restart's look back at the
        journal, up to ``max_entries`` of them in all), expiring from now; the oldest beyond
        ``max_entries`` go at the end, not one purge per note. Returns how many were new."""
        entries = self._entries
        expires = self.clock() + self.expiry
        added = 0
        for key, kept in notes:
            if key not in entries:
                entries[key] = [expires, None, APPLIED, kept]
                added += 1
        self._purge(keep=self.max_entries)
        return added

    def _purge(self, keep: int | None = None) -> None:
        """Drop expired entries from the oldest end (insertion order, which is near enough
        to expiry order), plus the oldest beyond ``keep`` (default: room for one more
        under ``max_entries``). Stops at the first live entry, so a call costs O(entries
        removed), never a scan of the cache: this runs on every mutating RPC."""
        keep = self.max_entries - 1 if keep is None else keep
        now = self.clock()
        entries = self._entries
        while entries:
            key = next(iter(entries))
            if entries[key][0] <= now or len(entries) > keep:
                del entries[key]
            else:
                break
