"""The connecting end of a data-transfer connection to a block server (a client's, or a
block server's to its downstream): open one within ``data_connect_timeout``, close it
without raising, turn an error response into the exception of ``fs.errors`` it stands for,
name a node and a failure's cause in messages, remember the block servers that could not
be reached (``AvoidedNodes``).

Why a module of its own: the write pipeline (``fs/pipeline.py``), the output stream
(``fs/writer.py``), the input stream (``fs/reader.py``) and the block servers' downstream,
copy and recovery connections (``storage/``) all open data connections the same way and
count the same transport failures (``IO_ERRORS``) as a replica's or node's failure; this is
the one copy they share.

Concurrency contract: stateless async helpers that run in the caller's task on its trio
thread; ``close_quietly`` is shielded from cancellation, so a cancelled caller still closes
its connection. ``AvoidedNodes`` belongs to one client and is used on its trio thread.
"""

from __future__ import annotations

import errno as _errno
import math
import time
from contextlib import contextmanager

import trio

from . import errors, tcpliveness
from .backoff import Backoff
from .errors import LeaseFSError, ServerUnavailable
from .framing import FramedStream
from .rpc import parse_address
from .tls import connect_tcp

#: the waits of the add_block / complete retry loops and of an input stream's location
#: refreshes: 0.05 s doubling every retry, with no cap (their bound is a count of attempts),
#: of which a random half (equal jitter: the loops keep at least half of their patience,
#: and writers that hit the same busy block servers do not retry in step)
DATA_BACKOFF = Backoff(first=0.05, factor=2, cap=math.inf, jitter=0.5)
# transport-level failures of a data connection
IO_ERRORS = (LeaseFSError, EOFError, OSError, trio.TooSlowError, trio.BrokenResourceError,
             trio.ClosedResourceError)


def node_name(node: dict) -> str:
    return f"{node.get('address', '?')} ({node.get('node_id', '?')})"


def failure_cause(exc: BaseException, timeout: float | None = None) -> str:
    """What went wrong, for a message or log line; never empty (a timeout, whose exception
    says nothing, says how long was waited; an OS error its errno name; a peer whose host
    stopped acknowledging, "peer unreachable", ``fs.tcpliveness``)."""
    if isinstance(exc, trio.TooSlowError) or (isinstance(exc, TimeoutError) and not exc.errno):
        return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
    unreachable = tcpliveness.lost(None, exc)
    if unreachable:
        return unreachable
    if isinstance(exc, OSError) and exc.errno:
        name = _errno.errorcode.get(exc.errno, f"errno {exc.errno}")
        return f"{name} ({exc.strerror or exc})"
    return str(exc) or repr(exc)


@contextmanager
def time_limit(seconds: float, what: str):
    """``trio.fail_after`` whose expiry is a ``ServerUnavailable`` saying what did not happen
    and how long was waited (``TooSlowError`` says nothing)."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise ServerUnavailable(f"{what}: timed out after {seconds:g} s") from None


async def open_data_connection(address: str, timeout: float, max_frame: int,
                               tls=None) -> FramedStream:
    """A framed data connection to the block server at ``address`` within ``timeout`` (the
    ``data_connect_timeout`` setting: TCP connect and TLS handshake); with ``tls``
    (``fs.tls.ClientTls``) over TLS, its certificate verified (``TlsError`` if not)."""
    host, port = parse_address(address)
    try:
        with trio.fail_after(timeout):
            stream = await connect_tcp(host, port, tls)
    except (OSError, trio.TooSlowError) as exc:
        raise ServerUnavailable(f"cannot connect to block server {address}: "
                                f"{failure_cause(exc, timeout)}") from None
    return FramedStream(stream, max_frame)


def node_unreachable(exc: BaseException) -> bool:
    """True for a failure of the block server or the network (no connection, a timeout, a
    broken connection), False for one of a replica (a checksum error, an error answer)."""
    return isinstance(exc, (ServerUnavailable, OSError, EOFError, trio.TooSlowError,
                            trio.BrokenResourceError))


class AvoidedNodes:
    """Block servers a client could not reach lately (``node_unreachable``), by address, so
    that the next block does not wait on the same one again (HDFS's dead nodes): readers try
    them after every other replica until ``interval`` seconds passed or one answers again.
    Never a reason to skip a replica that is the last one left."""

    def __init__(self, interval: float, clock=time.monotonic):
        self.interval = interval
        self._clock = clock
        self._since: dict[str, float] = {}

    def add(self, address: str) -> None:
        self._since[address] = self._clock()

    def discard(self, address: str) -> None:
        self._since.pop(address, None)

    def __contains__(self, address: str) -> bool:
        since = self._since.get(address)
        if since is None:
            return False
        if self._clock() - since >= self.interval:
            del self._since[address]
            return False
        return True

    def first(self, nodes: list[dict]) -> dict | None:
        """The first of ``nodes`` not avoided; else the first (its problem may be over)."""
        return next((n for n in nodes if n.get("address") not in self), nodes[0] if nodes else None)


async def close_quietly(framed: FramedStream | None) -> None:
    if framed is None:
        return
    with trio.CancelScope(shield=True):
        try:
            await framed.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def response_error(resp, what: str) -> LeaseFSError:
    """The exception a data-transfer error response stands for."""
    if isinstance(resp, dict) and isinstance(resp.get("error"), dict):
        exc = errors.from_wire(resp["error"])
        exc.message = f"{what}: {exc.message}"
        return exc
    message = resp.get("message") if isinstance(resp, dict) else None
    return LeaseFSError(f"{what}: {message or f'unexpected response {resp!r:.200}'}")


async def close_gracefully(framed: FramedStream, linger: float = 1.0) -> None:
    """Half-close, drain what the peer still sends for a moment, then close: closing a socket
    with unread input makes the kernel send RST, which can destroy our last reply in flight."""
    stream = framed.stream
    try:
        with trio.move_on_after(linger):   # a server shutting down cancels the linger
            if hasattr(stream, "send_eof"):
                await stream.send_eof()
            while await stream.receive_some(1 << 16):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError,
            OSError):
        pass
    finally:
        with trio.CancelScope(shield=True):
            await framed.aclose()
