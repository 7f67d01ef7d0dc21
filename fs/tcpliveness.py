"""TCP liveness: tell an unreachable host (partitioned, powered off) from a slow process, and
fail a connection to the first within ``tcp_liveness_timeout`` seconds, never the second.

Why at the TCP level: a live peer's kernel acknowledges segments, keepalive probes and
zero-window probes even while its process is stopped or its disk stalls; a host cut off
acknowledges nothing. The application timeouts (``data_timeout``, ``rpc_timeout``) must stay
long enough for a slow disk, so without this a silent host was waited out for a minute.

How, for every TCP connection leasefs opens or accepts (``watch``):

- nothing outstanding (a node waiting for an ack, all its bytes acknowledged): kernel
  keepalive probes after ``T/2`` idle seconds, one a second after that, the connection
  failed with ``ETIMEDOUT`` after about ``T`` seconds without an answer. A stopped process's
  kernel answers them.
- data outstanding: a watcher task of the trio run reads each connection's ``TCP_INFO``
  every ``T/8`` s (at most 1 s): retransmissions (or two window probes in a row) unanswered
  and no acknowledgement at all for ``T`` s, at two checks in a row (``gone``), is a peer
  host that is gone; the watcher shuts the connection down, so that the blocked send or
  receive fails at once, and remembers why (``lost``).

Not ``TCP_USER_TIMEOUT``: measured on Linux 6.18, it fails a connection whose peer window
stays closed that long although the peer answers every probe (a stopped or slow reader) —
exactly the slow-but-alive peer that must not be failed. Keepalive never runs while data is
queued, and the watcher never counts answered probes, so a closed window is waited out to
the application timeout.

Process-wide: ``configure`` (servers and clients call it with their settings) sets the
timeout connections made afterwards get. Concurrency contract: ``watch`` and ``lost`` run on
the trio thread of the run that owns the connection; the watcher is a system task of that
run, started by the first ``watch``, ending when no watched connection is left.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import struct
import weakref

import trio

from .config import Config

log = logging.getLogger(__name__)

#: leading fields of Linux ``struct tcp_info``: state, ca_state, retransmits, probes,
#: backoff, options, wscales, flags; rto, ato, snd_mss, rcv_mss, unacked, sacked, lost,
#: retrans, fackets, last_data_sent, last_ack_sent, last_data_recv, last_ack_recv
_TCP_INFO = struct.Struct("=8B13I")

_timeout: float = Config.tcp_liveness_timeout


def configure(seconds: float) -> None:
    """The ``tcp_liveness_timeout`` connections watched from now on get (0 = off)."""
    global _timeout
    _timeout = max(0.0, float(seconds))


def timeout() -> float:
    return _timeout


def keepalive_plan(seconds: float) -> tuple[int, int, int]:
    """``(TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT)``, whole seconds, that fail an idle
    connection about ``seconds`` after its peer's last answer: idle half of it, then one
    probe a second."""
    idle = max(1, round(seconds / 2))
    interval = 1
    return idle, interval, max(1, math.ceil((seconds - idle) / interval))


def silent(info: bytes, seconds: float) -> bool:
    """Does ``TCP_INFO`` say the peer's kernel stopped acknowledging for ``seconds``? Data
    outstanding and retransmitted (or two window probes in a row unanswered), and no
    acknowledgement of any kind received for that long. A closed window whose probes are
    answered is not silence."""
    return _waiting(info) and _ack_age(info) >= seconds * 1000


def _waiting(info: bytes) -> bool:
    """Retransmitted data or two window probes in a row outstanding (not yet answered)."""
    (_state, _ca, retransmits, probes, *_rest, unacked, _sacked, _lost, _retrans, _fackets,
     _last_data_sent, _last_ack_sent, _last_data_recv, _last_ack_recv) = \
        _TCP_INFO.unpack_from(info)
    return (unacked > 0 and retransmits > 0) or probes >= 2


def _ack_age(info: bytes) -> int:
    """Milliseconds since the last acknowledgement received from the peer."""
    return _TCP_INFO.unpack_from(info)[-1]


def gone(earlier: bytes | None, info: bytes, seconds: float) -> bool:
    """The watcher's verdict from two checks in a row: ``info`` is ``silent`` for
    ``seconds``, and at the check before (``earlier``) a probe or retransmission was
    already outstanding, with no acknowledgement since.

    Why not one sample: ``TCP_INFO`` counts a probe as unanswered from the moment it is
    sent, and a live peer's kernel leaves some window probes unanswered (it rate-limits
    its answers to out-of-window segments, ``tcp_invalid_ratelimit``, 500 ms; Linux's probe
    intervals start at 200 ms). After such a probe, the next one reads as "two unanswered"
    with no ack for over a second until its answer is processed: an instant, but longer
    under CPU load (softirqs run late), and one sample there cut a live, stopped reader.
    A second check a watch interval later sees the answer."""
    return (earlier is not None and silent(info, seconds) and _waiting(earlier)
            and _ack_age(info) >= _ack_age(earlier))


def _socket_of(stream):
    """The trio socket under ``stream`` (a ``SocketStream`` or a TLS stream over one)."""
    while stream is not None and not hasattr(stream, "socket"):
        stream = getattr(stream, "transport_stream", None)
    return getattr(stream, "socket", None)


def describe(seconds: float) -> str:
    return f"peer unreachable (no TCP acknowledgement for {seconds:g} s)"


class _Watcher:
    """The watched connections of one trio run and why the ones it cut were cut."""

    def __init__(self):
        self.watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.cut: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # each watched connection's TCP_INFO at the last check, for ``gone``
        self.earlier: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.running = False

    def add(self, sock, seconds: float) -> None:
        self.watched[sock] = seconds
        if not self.running:
            self.running = True
            trio.lowlevel.spawn_system_task(self.run, name="tcp liveness watcher")

    async def run(self) -> None:
        try:
            while self.watched:
                await trio.sleep(min(1.0, max(0.1, min(self.watched.values()) / 8)))
                for sock, seconds in list(self.watched.items()):
                    self.check(sock, seconds)
        finally:
            self.running = False

    def check(self, sock, seconds: float) -> None:
        try:
            if sock.fileno() < 0:
                raise OSError(errno.EBADF, "closed")
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
        except OSError:
            self.watched.pop(sock, None)
            return
        if len(info) < _TCP_INFO.size:   # not a kernel whose tcp_info we know: keepalive only
            self.watched.pop(sock, None)
            return
        earlier, self.earlier[sock] = self.earlier.get(sock), info
        if not gone(earlier, info, seconds):
            return
        self.watched.pop(sock, None)
        self.earlier.pop(sock, None)
        self.cut[sock] = describe(seconds)
        try:
            peer = "%s:%s" % sock.getpeername()[:2]
        except OSError:
            peer = "?"
        log.warning("connection to %s: %s; closing it", peer, self.cut[sock])
        try:
            # wakes the task blocked on it (its receive sees EOF, its send EPIPE)
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


_WATCHER: trio.lowlevel.RunVar = trio.lowlevel.RunVar("tcp_liveness_watcher")


def watch(stream) -> None:
    """Keepalive on the TCP connection under ``stream`` and the watcher on it, with the
    configured timeout; nothing when it is 0 or the connection is not TCP."""
    seconds = _timeout
    sock = _socket_of(stream)
    if seconds <= 0 or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle, interval, count = keepalive_plan(seconds)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    except OSError:   # the connection is already gone: its first use says so
        return
    try:
        watcher = _WATCHER.get()
    except LookupError:
        watcher = _Watcher()
        _WATCHER.set(watcher)
    watcher.add(sock, seconds)


def lost(stream, exc: BaseException | None = None) -> str | None:
    """Why the connection under ``stream`` failed when it was for want of TCP
    acknowledgements (the watcher cut it, or the kernel's keepalive gave up: ``ETIMEDOUT``
    in ``exc``'s chain); else None."""
    sock = _socket_of(stream)
    if sock is not None:
        try:
            reason = _WATCHER.get().cut.get(sock)
        except (LookupError, RuntimeError):
            reason = None
        if reason is not None:
            return reason
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
            return describe(_timeout)
        exc = exc.__cause__ or exc.__context__
    return None


__all__ = ["configure", "describe", "gone", "keepalive_plan", "lost", "silent", "timeout",
           "watch"]
