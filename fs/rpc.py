"""RPC over framed msgpack: many calls in flight per connection, errors as exceptions.

Wire (see docs/PROTOCOL.md): the client's first frame is a hello
``{"hello": "leasefs", "version": 1, "client_id": str, "user": str, "groups": [str],
"sync_metadata": bool}`` (``user``/``groups``: the caller's identity, HDFS simple
authentication; a hello without ``user`` is user ``nobody`` without groups;
``sync_metadata`` false: the connection's namespace changes are answered once journaled
without waiting for the fsync, see PROTOCOL.md; absent = true); then requests
``[call_id, method, args]`` and replies ``[call_id, ok, result_or_error]`` in any order.
A request may add ``acting_for`` (a map, or null) and then the client's ``state_id`` (the
newest server state it has seen: an observer metadata server serves the call only once it
has applied that much); a hello with ``"state_id": true`` gets replies with the server's
state id as a 4th element (HDFS-12943's RPC header state id).
``call_id`` is unique per ``client_id`` for the client's lifetime (not per connection), so a
call retried on a new connection after a lost reply carries the same ``(client_id, call_id)``
and the server's ``RetryCache`` answers it instead of applying it twice.

Server side: ``serve_rpc`` reads requests and runs each mutation in a worker task of the
connection (one per call in flight, reused for the next call rather than started anew), so
one slow call (a journal fsync) never blocks the others on the connection; reads that never await
(``Dispatcher.inline_methods``) run in the reader itself. A malformed request gets an
error reply and the connection keeps serving; only an unreadable frame (too large, not
msgpack) ends the connection, after a best-effort error reply. Handler bugs are logged and
answered with ``InternalError``; the server never dies on a client's mistake.

Transport: ``fs.framing.FrameChannel`` on both sides — every complete frame a read
brings is handled at once, frames sent in one scheduler round leave in one write, no task
switch per frame; a frame sent while other calls of the connection are in flight waits
for the flusher even when it is the round's first (``defer``), a lone call's leaves at once. So one connection shared by many callers (``fs.client.meta_connection``,
Hadoop IPC's model) carries batches, and a server answers a batch of reads with one write.

Concurrency contract: ``RpcClient.call`` may be called from any number of tasks of the
client's trio thread at once; sends are queued whole on the connection's channel (no lock),
one reader task per connection resolves the waiters.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import grp
import inspect
import ipaddress
import itertools
import os
import pwd
import secrets
import socket
import struct
import uuid
import logging
import math
import time
from dataclasses import dataclass, field

import outcome
import trio

from . import delegation, errors, nodeauth
from . import tls as tlsmod
from .config import DEFAULT_LOCAL_SOCKET
from .errors import (InternalError, InvalidArgument, LeaseFSError, ProtocolError,
                     RpcTimeout, ServerUnavailable, UnknownMethod)
from .framing import DEFAULT_MAX_FRAME, FrameChannel, brief, encode_frame
from .limits import ConnectionLimits, RefusalLog
from .retry_cache import RetryCache

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
# the first frame of a connection, read before we know the peer: room for a client id and
# an identity of at most MAX_IDENTITY_BYTES
MAX_HELLO_FRAME = 8192
MAX_USER_NAME = 256        # characters of the user name in the hello
MAX_GROUP_NAME = 64        # characters of one group name (Linux allows 32)
MAX_GROUPS = 64            # group names in the hello
MAX_IDENTITY_BYTES = 6144  # UTF-8 bytes of user + group names together
ANONYMOUS_USER = "nobody"  # the user of a hello without one (an older client)
# the identity of a connection that has not authenticated yet (security = secure, over TCP):
# not printable, so no hello or act-as can name it; the dispatcher admits only the calls
# that authenticate (``Dispatcher.admits_unauthenticated``)
UNAUTHENTICATED = "\0unauthenticated"
# a call's effective identity when the connection's user acts for another (a FUSE mount for
# the kernel's caller): set around the calls, the request carries it (``RpcClient.call``)
ACTING_FOR: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "leasefs_acting_for", default=None)


def _name_ok(value, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def check_identity(user, groups, where: str = "hello") -> tuple[str, tuple[str, ...]]:
    """A user name and group names as the hello carries them: printable, non-empty, at most
    ``MAX_USER_NAME`` / ``MAX_GROUP_NAME`` characters, at most ``MAX_GROUPS`` groups and
    ``MAX_IDENTITY_BYTES`` in all; else InvalidArgument."""
    if not _name_ok(user, MAX_USER_NAME):
        raise InvalidArgument(f"{where}: user must be a printable name of 1..{MAX_USER_NAME} "
                              f"characters, got {brief(user, 80)}")
    if not isinstance(groups, (list, tuple)) or len(groups) > MAX_GROUPS:
        raise InvalidArgument(f"{where}: groups must be a list of at most {MAX_GROUPS} names, "
                              f"got {brief(groups, 80)}")
    for group in groups:
        if not _name_ok(group, MAX_GROUP_NAME):
            raise InvalidArgument(f"{where}: group names must be printable, 1..{MAX_GROUP_NAME} "
                                  f"characters, got {brief(group, 80)}")
    size = sum(len(name.encode("utf-8", "surrogatepass")) for name in (user, *groups))
    if size > MAX_IDENTITY_BYTES:
        raise InvalidArgument(f"{where}: user and group names take {size} bytes, more than "
                              f"{MAX_IDENTITY_BYTES}")
    return user, tuple(dict.fromkeys(groups))


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The name of ``uid`` (the number as text when it has none); memoized, so a name the
    system gives a uid later is seen only once the entry is evicted."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@functools.lru_cache(maxsize=256)
def group_name(gid: int) -> str:
    """The name of ``gid`` (the number as text when it has none); memoized like
    ``user_name``."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def current_user() -> str:
    """The calling process's (effective) user name; the uid as text if it has no name."""
    return user_name(os.geteuid())


def current_groups() -> list[str]:
    """The calling process's group names: its effective gid first, then its supplementary
    groups (a gid without a name as text); names the hello cannot carry are left out, and
    at most ``MAX_GROUPS`` / ``MAX_IDENTITY_BYTES`` are kept."""
    out: list[str] = []
    budget = MAX_IDENTITY_BYTES - MAX_USER_NAME * 4
    for name in dict.fromkeys(group_name(gid) for gid in [os.getegid(), *os.getgroups()]):
        size = len(name.encode("utf-8", "surrogatepass"))
        if not _name_ok(name, MAX_GROUP_NAME) or size > budget:
            log.debug("group %r left out of the RPC identity (too long or unprintable)", name)
            continue
        if len(out) == MAX_GROUPS:
            break
        out.append(name)
        budget -= size
    return out


@functools.lru_cache(maxsize=256)
def os_groups(user: str) -> tuple[str, ...]:
    """The group names the system gives ``user`` (primary first); empty for a user it does
    not know. Memoized like ``user_name``."""
    try:
        entry = pwd.getpwnam(user)
        gids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, OSError):
        return ()
    names = dict.fromkeys(group_name(gid) for gid in [entry.pw_gid, *gids])
    return tuple(n for n in names if _name_ok(n, MAX_GROUP_NAME))[:MAX_GROUPS]


@dataclass(frozen=True)
class PeerCredentials:
    """Who is at the other end of a local (Unix domain) connection, as the kernel says
    (``SO_PEERCRED``: the process's ids when it connected)."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock) -> "PeerCredentials":
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        return cls(*_CRED.unpack(raw))


_CRED = struct.Struct("3i")


def local_socket_address(name: str) -> str | bytes:
    """A ``meta_socket`` name as ``bind``/``connect`` take it: ``@name`` is Linux's abstract
    namespace (no file, nothing stale after a crash), anything else a filesystem path."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def local_socket_name(template: str, address, *, server: bool = False) -> str | None:
    """The ``meta_socket`` setting for the metadata server at ``address``: ``{port}`` filled
    in. A client uses the default one only for a server on a loopback address (another
    machine's server has no socket here, and a same-named one would be another cluster's);
    one set explicitly, whatever the address names (a server of this machine named by its
    host name)."""
    if not template:
        return None
    host, port = parse_address(address)
    if not server and template == DEFAULT_LOCAL_SOCKET and not _loopback(host):
        return None
    return template.replace("{port}", str(port))


def _local_sockets(setting: str | None, addresses) -> list[str | None]:
    """The local socket of each of ``addresses`` (``local_socket_name``). A name that
    several addresses share (a setting without ``{port}``) cannot tell their servers apart:
    those go over TCP."""
    names = [local_socket_name(setting, a) if setting else None for a in addresses]
    if len(addresses) > 1:
        shared = {n for n in names if n is not None and names.count(n) > 1}
        if shared:
            log.debug("local socket %s is named for several servers of the list: TCP for "
                      "them", ", ".join(sorted(shared)))
        names = [None if n in shared else n for n in names]
    return names


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``; clear error on junk."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        return str(text[0]), int(text[1])
    host, sep, port = str(text).rpartition(":")
    if not sep:
        if default_port is None:
            raise InvalidArgument(f"address {text!r} is not HOST:PORT")
        return str(text), default_port
    try:
        port_no = int(port)
    except ValueError:
        raise InvalidArgument(f"address {text!r}: port {port!r} is not a number") from None
    if not 0 <= port_no < 65536:
        raise InvalidArgument(f"address {text!r}: port out of range")
    return host.strip("[]") or "127.0.0.1", port_no


def parse_address_list(text, default_port: int | None = None) -> list[tuple[str, int]]:
    """A server list as ``meta_address`` may give it: ``"h1:p1,h2:p2"``, a list of such
    entries (or of ``(host, port)``), or one address → ``[(host, port), ...]`` in order,
    duplicates dropped (HDFS's ConfiguredFailoverProxyProvider). InvalidArgument names
    the bad entry; an empty list is one too."""
    if isinstance(text, tuple) and len(text) == 2 and not isinstance(text[0], (tuple, list)):
        entries = [text]
    elif isinstance(text, (list, tuple)):
        entries = list(text)
    else:
        entries = str(text).split(",")
    out: list[tuple[str, int]] = []
    for entry in entries:
        if isinstance(entry, str):
            entry = entry.strip()
            if not entry:
                raise InvalidArgument(f"server list {text!r} has an empty entry")
        try:
            address = parse_address(entry, default_port)
        except (InvalidArgument, TypeError, ValueError) as exc:
            why = exc.message if isinstance(exc, InvalidArgument) else f"{entry!r} is not HOST:PORT"
            raise InvalidArgument(f"server list {text!r}: bad entry: {why}") from None
        if address not in out:
            out.append(address)
    if not out:
        raise InvalidArgument(f"server list {text!r} names no server")
    return out


def format_address_list(addresses) -> str:
    """``[(host, port), ...]`` → ``"h1:p1,h2:p2"``, the form ``parse_address_list`` reads."""
    return ",".join(format_address(a) for a in addresses)


def normalize_address_list(text) -> str:
    """``text`` checked and written canonically (one ``host:port`` or a comma list), so two
    spellings of one server list compare equal; InvalidArgument names a bad entry."""
    return format_address_list(parse_address_list(text))


async def connect_tcp(host: str, port: int, tls=None) -> trio.abc.Stream:
    """A TCP stream to ``host:port``; with ``tls`` (an ``fs.tls.ClientTls``, None when the
    setting is off) a ``trio.SSLStream`` over it whose handshake verified the server's
    certificate for ``host`` (``TlsError`` if not; see ``fs.tls.connect``). A literal IP
    address is connected directly: trio's ``open_tcp_stream`` (resolution, happy eyeballs in
    a nursery of its own) costs about three times the CPU, and data connections are opened
    per block."""
    stream = await _connect_plain(host, port)
    if tls is None:
        return stream
    return await tlsmod.connect(stream, tls, host, format_address((host, port)))


async def _connect_plain(host: str, port: int) -> trio.SocketStream:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)
    return await trio.open_tcp_stream(host, port)


def format_address(addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------- client


class _Waiter:
    """One call's wait for its reply. Resolved exactly once, by whoever pops it from its
    connection's ``waiters`` first: the reader (the reply), ``fail_all`` (the connection
    died) or the timeout watchdog. Why not a ``trio.Event`` plus ``move_on_after`` per call:
    those two cost a quarter of a client's CPU per metadata call."""

    __slots__ = ("task", "result", "deadline")

    def __init__(self, deadline: float):
        self.task = None           # the parked caller, while it waits
        self.result = None         # (ok, value) when resolved before the caller parked
        self.deadline = deadline

    def resolve(self, ok: bool, value) -> None:
        if self.task is not None:
            task, self.task = self.task, None
            trio.lowlevel.reschedule(task, outcome.Value((ok, value)))
        else:
            self.result = (ok, value)

    async def wait(self, abort) -> tuple[bool, object]:
        if self.result is not None:
            return self.result
        self.task = trio.lowlevel.current_task()

        def aborted(_raise_cancel):
            self.task = None
            abort()
            return trio.lowlevel.Abort.SUCCEEDED
        return await trio.lowlevel.wait_task_rescheduled(aborted)


class _Connection:
    """One TCP connection with its reader task; dies as a whole on any error. ``index``:
    which of the client's ``addresses`` it goes to."""

    def __init__(self, channel: FrameChannel, index: int = 0, address=("?", 0)):
        self.channel = channel
        self.index = index
        self.address = address
        self.waiters: dict[int, _Waiter] = {}
        self.broken: LeaseFSError | None = None

    def fail_all(self, exc: LeaseFSError) -> None:
        self.broken = exc
        waiters, self.waiters = self.waiters, {}
        for waiter in waiters.values():
            waiter.resolve(False, exc)


class StateAlignment:
    """The newest server state id (the metadata server's applied journal txid) a client has
    seen in a reply, shared by its connection to the active and the one to observers
    (HDFS-12943 AlignmentContext): sent with each call, it keeps an observer from answering
    with a namespace older than the client's own writes. Only grows."""

    __slots__ = ("last_seen",)

    def __init__(self) -> None:
        self.last_seen = 0

    def note(self, state_id) -> None:
        if type(state_id) is int and state_id > self.last_seen:
            self.last_seen = state_id


class RpcClient:
    """A reconnecting RPC client bound to one server address or to a list of them (HA:
    active, standbys, observers; ``"h1:p1,h2:p2"`` or a list, see ``parse_address_list``).

    ``call`` retries on connection loss (not on server-side errors) with the same call id
    until ``retry_seconds`` passed, so with the server's retry cache every call is applied
    at most once. Use as ``async with RpcClient(...) as rpc``.

    Failover (HDFS ConfiguredFailoverProxyProvider): one address is current (``address``);
    when a call cannot reach it (``ServerUnavailable``) or it answers ``StandbyError`` (it
    did not carry the call out), the client makes the next address of the list current and
    sends the call there, same call id; a full cycle where no address served waits the
    backoff (0.05 s doubling to 1 s) before the next, all within ``retry_seconds``. A
    working address stays current until it fails: calls never probe the others.
    ``RpcTimeout`` is not retried (the call may be running). Calls still in flight on the
    connection left behind get their replies there; new calls go to the new address.

    ``user``/``groups`` are the identity the hello states (default: the calling process's
    user and group names); the metadata server checks permissions against them.
    """

    def __init__(self, address, client_id: str, *, timeout: float = 60.0,
                 retry_seconds: float = 30.0, connect_timeout: float = 5.0,
                 max_frame: int = DEFAULT_MAX_FRAME,
                 retry_errors: tuple[type[LeaseFSError], ...] = (),
                 user: str | None = None, groups=None, sync_metadata: bool = True,
                 authenticate=None, local_socket: str | None = DEFAULT_LOCAL_SOCKET,
                 token=None, tls=None, alignment: "StateAlignment | None" = None):
        self.addresses = parse_address_list(address)
        self._current = 0          # index into addresses: where calls go now (sticky)
        self._told: dict[int, str] = {}   # address index → the state last logged of it
        # each server's local socket (``local_socket_address``), tried before TCP: there the
        # kernel tells the server who we are; by default the default ``meta_socket`` of a
        # server on a loopback address, None: TCP only. ``local_socket`` is the setting
        # (``{port}`` filled per address) or a name already filled in
        self._local_sockets = _local_sockets(local_socket, self.addresses)
        # read-your-writes for observer reads (``StateAlignment``, shared with the client's
        # connection to observers): replies carry the server's state id, requests the newest
        # one seen; None: neither (the hello does not ask)
        self.alignment = alignment
        # a ``fs.delegation.TokenFile`` that authenticates a TCP connection
        self.token = token
        # ``fs.tls.ClientTls`` (tls = on): every TCP connection is TLS, the server's
        # certificate verified for the host of ``address``
        self.tls = tls
        # ``async authenticate(call)`` runs on every new connection before any other call
        # goes on it; ``call(method, args)`` calls on that connection (fs.nodeauth)
        self.authenticate = authenticate
        self.user, groups = check_identity(
            current_user() if user is None else user,
            current_groups() if groups is None else list(groups), "RPC client identity")
        self.groups = list(groups)
        self.sync_metadata = sync_metadata
        # The retry cache keys on (client_id, call_id) and call ids restart at 1 in every
        # RpcClient: the random part keeps two clients that share a name (two processes, a
        # restarted service) from ever answering each other's calls. It stays the same across
        # reconnects of this RpcClient, which is what lets a retry find its first outcome.
        self.client_id = f"{client_id}#{uuid.uuid4().hex[:16]}"
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.connect_timeout = connect_timeout
        self.max_frame = max_frame
        # server errors that mean "not now" (e.g. startup safe mode): retried like a lost
        # connection, within the same retry budget
        self.retry_errors = retry_errors
        self._call_ids = itertools.count(1)
        self._conn: _Connection | None = None
        # connections to addresses left behind whose calls are still in flight: closed once
        # they are answered
        self._leaving: set[_Connection] = set()
        self._connect_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._nursery_cm = None
        self._watchdog_scope = trio.CancelScope()   # replaced by the watchdog's own
        self._closed = False

    async def __aenter__(self):
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._watchdog)
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()
        return await self._nursery_cm.__aexit__(*exc_info)

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        leaving, self._leaving = list(self._leaving), set()
        for each in [conn, *leaving] if conn is not None else leaving:
            each.fail_all(ServerUnavailable("client closed"))
            await each.channel.aclose()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    @property
    def address(self) -> tuple[str, int]:
        """The current server's ``(host, port)``: where the next call goes."""
        return self.addresses[self._current]

    @property
    def local_socket(self) -> str | None:
        """The current server's local socket name, None: TCP only."""
        return self._local_sockets[self._current]

    @property
    def last_seen_txid(self) -> int:
        return self.alignment.last_seen if self.alignment is not None else 0

    def note_txid(self, txid) -> None:
        """Remember a journal txid a server reported: the client's reads must not see a
        namespace older than its own writes (observer reads); only grows."""
        if self.alignment is None:
            self.alignment = StateAlignment()
        self.alignment.note(txid)

    def _move_from(self, index: int, exc: LeaseFSError) -> None:
        """Make the address after ``addresses[index]`` current, unless another call moved
        on already (concurrent calls that failed together move once, and log once). The
        connection left behind keeps serving the calls in flight on it."""
        if index != self._current or len(self.addresses) < 2:
            return
        self._current = (index + 1) % len(self.addresses)
        conn = self._conn
        if conn is not None and conn.index == index:
            self._conn = None
            if conn.broken is None:
                self._leave(conn)
        # a standby at the head of the list is routine under HA; a dead server is not. Each
        # server's state is told once until it serves again (a failover cycles the list)
        standby = isinstance(exc, errors.StandbyError)
        state = "is standby" if standby else "is unreachable"
        told = self._told.get(index) == state
        self._told[index] = state
        log.log(logging.DEBUG if told else logging.INFO if standby else logging.WARNING,
                "metadata server %s %s (%s); trying %s", format_address(self.addresses[index]),
                state, exc, format_address(self.address))

    def _leave(self, conn: _Connection) -> None:
        if conn.waiters:
            self._leaving.add(conn)
        else:
            conn.fail_all(ServerUnavailable(f"left {format_address(conn.address)} for "
                                            f"another server"))
            self._nursery.start_soon(conn.channel.aclose)

    @property
    def connected(self) -> bool:
        """A connection is open (a call now needs no connect); False after the server closed
        it, e.g. for being idle: the next call reconnects."""
        return self._conn is not None and self._conn.broken is None

    async def _connect(self) -> _Connection:
        async with self._connect_lock:
            if self._conn is not None and self._conn.broken is None:
                return self._conn
            if self._closed:
                raise ServerUnavailable("RPC client is closed")
            index = self._current
            address = self.addresses[index]
            stream, local = await self._open_stream(address, self._local_sockets[index])
            channel = FrameChannel(stream, self._nursery, self.max_frame)
            hello = {"hello": "leasefs", "version": PROTOCOL_VERSION,
                     "client_id": self.client_id, "user": self.user,
                     "groups": self.groups, "sync_metadata": self.sync_metadata}
            if self.alignment is not None:
                hello["state_id"] = True
            channel.send_nowait(hello)
            conn = _Connection(channel, index, address)
            self._nursery.start_soon(self._reader, conn)
            authenticate = self.authenticate
            if authenticate is None and self.token is not None and not local:
                authenticate = functools.partial(self._token_authenticate, address=address)
            if authenticate is not None:
                try:
                    with trio.fail_after(self.timeout):
                        await authenticate(functools.partial(self._call_on, conn))
                except trio.TooSlowError:
                    conn.fail_all(ServerUnavailable("authentication timed out"))
                    with trio.CancelScope(shield=True):
                        await conn.channel.aclose()
                    raise RpcTimeout(f"authenticating to {format_address(address)}: "
                                     f"no answer within {self.timeout:g} s") from None
                except BaseException as exc:
                    conn.fail_all(exc if isinstance(exc, LeaseFSError)
                                  else ServerUnavailable("authentication interrupted"))
                    with trio.CancelScope(shield=True):
                        await conn.channel.aclose()
                    raise
            self._conn = conn
            return conn

    async def _open_stream(self, address, local_socket) -> tuple[trio.abc.Stream, bool]:
        """``(stream, local)`` to ``address``: its local socket when there is one and it
        answers, else TCP (TLS over it when ``self.tls``, the certificate checked for the
        host of ``address``)."""
        if local_socket:
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with trio.fail_after(self.connect_timeout):
                    await sock.connect(local_socket_address(local_socket))
                return trio.SocketStream(sock), True
            except (OSError, trio.TooSlowError):
                sock.close()   # no local server (another machine's, or an older one): TCP
        host, port = address
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise ServerUnavailable(
                f"cannot reach {format_address(address)}: {exc or 'connect timed out'}"
            ) from None
        if self.tls is not None:
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await tlsmod.connect(stream, self.tls, host,
                                                  format_address(address))
            except trio.TooSlowError:
                raise ServerUnavailable(f"TLS handshake with {format_address(address)}"
                                        f": no answer within {self.connect_timeout:g} s "
                                        f"(does it serve TLS?)") from None
        return stream, False

    async def _token_authenticate(self, call, address=None) -> None:
        """``fs.delegation`` steps 2-3 with ``self.token``; ``AuthenticationFailed`` when the
        server refuses it or cannot prove it knows the token's password."""
        token = self.token
        server_nonce = await call("token_challenge", {})
        client_nonce = secrets.token_bytes(32)
        answer = await call("token_authenticate", {
            "token": token.token.to_wire(), "client_nonce": client_nonce,
            "proof": delegation.client_proof(token.secret, server_nonce, client_nonce)})
        if not nodeauth.same(answer, delegation.server_proof(token.secret, server_nonce, client_nonce)):
            raise errors.AuthenticationFailed(
                f"{format_address(address or self.address)} did not prove it knows the password of "
                f"{token.token.describe()}: not the metadata server that issued it")

    async def _call_on(self, conn: _Connection, method: str, args: dict):
        """One call on ``conn`` itself (the authentication of a new connection)."""
        call_id = next(self._call_ids)
        waiter = _Waiter(math.inf)
        conn.waiters[call_id] = waiter
        conn.channel.send_nowait([call_id, method, args])
        ok, value = await waiter.wait(lambda: conn.waiters.pop(call_id, None))
        if ok:
            return value
        raise value if isinstance(value, LeaseFSError) else errors.from_wire(value)

    async def _reader(self, conn: _Connection) -> None:
        try:
            while True:
                for reply in await conn.channel.receive_batch():
                    if not (isinstance(reply, list) and 3 <= len(reply) <= 4):
                        raise ProtocolError(f"malformed reply from server: {brief(reply)}")
                    call_id, ok, value = reply[:3]
                    if len(reply) == 4 and self.alignment is not None:
                        self.alignment.note(reply[3])
                    waiter = conn.waiters.pop(call_id, None)
                    if waiter is None:
                        if call_id is None and not ok:  # server-side fatal error on this connection
                            raise errors.from_wire(value)
                        continue
                    waiter.resolve(bool(ok), value)
        except EOFError:
            conn.fail_all(ServerUnavailable(f"{format_address(conn.address)} closed the connection"))
        except errors.TlsError as exc:   # trying again meets the same setting: final
            conn.fail_all(errors.TlsError(f"{format_address(conn.address)}: {exc}"))
        except LeaseFSError as exc:
            conn.fail_all(exc if isinstance(exc, ServerUnavailable)
                          else ServerUnavailable(f"{format_address(conn.address)}: {exc}"))
        finally:
            if conn.broken is None:
                conn.fail_all(ServerUnavailable(f"connection to {format_address(conn.address)} "
                                                f"closed"))
            if self._conn is conn:
                self._conn = None
            self._leaving.discard(conn)
            await conn.channel.aclose()

    async def call_once(self, method: str, args: dict, call_id: int, timeout: float):
        conn = self._conn
        if conn is None or conn.broken is not None:
            conn = await self._connect()
        waiter = _Waiter(trio.current_time() + timeout)
        # other calls waiting on this connection: this request most likely has company in
        # this scheduler round (the callers one batch of replies woke), so it waits for the
        # flusher and they leave in one write; a lone call is written at once
        defer = bool(conn.waiters)
        conn.waiters[call_id] = waiter
        acting = ACTING_FOR.get()
        if acting is not None and acting["user"] == self.user:
            acting = None
        seen = self.alignment.last_seen if self.alignment is not None else 0
        request = [call_id, method, args, acting, seen] if seen else \
            [call_id, method, args] if acting is None else [call_id, method, args, acting]
        try:
            # written straight to the socket or queued whole, no task switch (FrameChannel)
            conn.channel.send_nowait(request, defer=defer)
            if conn.channel.backlogged:
                await conn.channel.drained()
        except BaseException as exc:
            conn.waiters.pop(call_id, None)
            if isinstance(exc, ServerUnavailable) and conn.broken is None:
                conn.fail_all(exc)
            raise
        if waiter.deadline < self._watchdog_scope.deadline:
            self._watchdog_scope.deadline = waiter.deadline
        ok, value = await waiter.wait(lambda: conn.waiters.pop(call_id, None))
        if conn in self._leaving and not conn.waiters:   # its last call is answered
            self._leaving.discard(conn)
            self._leave(conn)
        if ok:
            return value
        if isinstance(value, RpcTimeout):
            # only this call gave up: the connection and the other calls on it go on
            raise RpcTimeout(f"{method}: no reply from {format_address(conn.address)} "
                             f"within {timeout:g} s")
        raise value if isinstance(value, LeaseFSError) else errors.from_wire(value)

    async def _watchdog(self) -> None:
        """Times out calls: sleeps until the earliest deadline of any waiting call (a call
        with an earlier one moves the wake-up forward), then fails the expired ones."""
        while True:
            with trio.CancelScope() as scope:
                self._watchdog_scope = scope
                scope.deadline = min((w.deadline for conn in self._live()
                                      for w in conn.waiters.values()), default=math.inf)
                await trio.sleep_forever()
            now = trio.current_time()
            for conn in self._live():
                expired = [call_id for call_id, w in conn.waiters.items() if w.deadline <= now]
                for call_id in expired:
                    conn.waiters.pop(call_id).resolve(False, RpcTimeout("timed out"))

    def _live(self) -> list[_Connection]:
        return [self._conn, *self._leaving] if self._conn is not None else list(self._leaving)

    async def call(self, method: str, args: dict | None = None, *, timeout: float | None = None,
                   retry_seconds: float | None = None):
        """Call ``method(**args)``; retries transport failures and ``StandbyError`` with the
        same call id, moving through the server list (see the class docstring)."""
        call_id = next(self._call_ids)
        timeout = self.timeout if timeout is None else timeout
        budget = self.retry_seconds if retry_seconds is None else retry_seconds
        deadline = time.monotonic() + budget
        delay = 0.05
        several = len(self.addresses) > 1
        failed: dict[int, LeaseFSError] = {}   # this cycle: address index → why it did not serve
        while True:
            index = self._current
            try:
                answer = await self.call_once(method, args or {}, call_id, timeout)
                if self._told:
                    self._told.pop(index, None)
                return answer
            except (ServerUnavailable, errors.StandbyError, *self.retry_errors) as exc:
                if isinstance(exc, RpcTimeout) or self._closed:
                    raise
                if several and isinstance(exc, (ServerUnavailable, errors.StandbyError)):
                    failed[index] = exc
                    self._move_from(index, exc)
                    if len(failed) < len(self.addresses) and time.monotonic() < deadline:
                        continue              # the next server at once
                if time.monotonic() + delay > deadline:
                    if several and failed:
                        raise self._none_served(failed, budget) from None
                    raise
                log.debug("%s: %s; retrying in %.2fs", method, exc, delay)
                failed.clear()
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _none_served(self, failed: dict[int, LeaseFSError], budget: float) -> LeaseFSError:
        """The error of a call no server of the list carried out: ``StandbyError`` when
        each answered so, else ``ServerUnavailable``; it names every server and its cause."""
        causes = "; ".join(f"{format_address(self.addresses[i])}: {exc}"
                           for i, exc in sorted(failed.items()))
        every = all(isinstance(exc, errors.StandbyError) for exc in failed.values())
        kind = errors.StandbyError if every else ServerUnavailable
        return kind(f"no metadata server of {format_address_list(self.addresses)} served the "
                    f"call within {budget:g} s ({causes})")


# --------------------------------------------------------------------------- server


@dataclass
class CallContext:
    """Who is calling: the hello's client id, the peer address, the call id, and the
    identity the hello stated (``user``, ``groups``). ``user`` None marks an in-process
    caller (the server's own code, tests driving handlers directly): it acts as the
    server's process user. Calls from the wire always carry a user (``nobody`` at least)."""

    client_id: str
    peer: str
    call_id: object = None
    extra: dict = field(default_factory=dict)
    user: str | None = None
    groups: tuple[str, ...] = ()
    sync_metadata: bool = True   # namespace changes answered only once durable
    # what the connection established about its peer, shared by all its calls (a block
    # server's authenticated node id, see fs.nodeauth)
    session: dict = field(default_factory=dict)
    # ``time.perf_counter()`` when the request was read, set only while a ``call_observer``
    # watches (0: not measured, or run at once in the reader)
    received: float = 0.0
    # the newest server state (journal txid) the client has seen: a read served by an
    # observer must reflect at least that (read-your-writes, HDFS-12943); 0 = none
    state_id: int = 0


class Dispatcher:
    """Exposes ``async def rpc_<method>(self, ctx, **args)`` methods over RPC.

    Methods named in ``retry_cached`` go through the ``RetryCache``. Arguments are bound
    against the handler's signature first, so a wrong argument is the client's
    ``InvalidArgument``, not a server ``TypeError``.
    """

    retry_cached: frozenset[str] = frozenset()
    # handlers that complete without awaiting (plain reads): ``serve_rpc`` runs them in the
    # connection's reader task instead of starting a task per call; one that does await
    # would only delay the next request of the same connection
    inline_methods: frozenset[str] = frozenset()
    # metrics hook: None, or ``observe(method, outcome, queued, seconds)`` called once per
    # call after its reply was queued (``outcome`` "ok" or the error's class name; ``method``
    # as the peer sent it, possibly not a method name; ``queued``: seconds it waited for a
    # slot and a worker, 0 for inline reads; ``seconds``: its run). Read once per connection.
    call_observer = None

    def __init__(self, retry_cache: RetryCache | None = None):
        self.retry_cache = retry_cache or RetryCache()
        self._signatures: dict[str, tuple] = {}

    def state_id(self) -> int:
        """The state replies carry to a client whose hello asked for it (``state_id``):
        the metadata server's applied journal txid; 0 for servers without one."""
        return 0

    def methods(self) -> list[str]:
        return sorted(n[4:] for n in dir(self) if n.startswith("rpc_"))

    # Who a connection is. This base believes what the peer states (HDFS simple
    # authentication); a server with authentication overrides the three hooks.
    def open_session(self, session: dict, user: str, groups, credentials, peer: str) -> None:
        """Set ``session["user"]``/``["groups"]`` from the hello (``credentials``: the
        kernel's, on a local connection); ``AuthenticationFailed`` refuses the connection."""
        session["user"], session["groups"] = user, groups

    def act_as(self, session: dict, acting) -> tuple[str, tuple[str, ...]]:
        """The identity one request acts for (its fourth element)."""
        if not isinstance(acting, dict):
            raise InvalidArgument(f"acting_for must be a map, got {brief(acting, 80)}")
        return check_identity(acting.get("user"), acting.get("groups") or [], "acting_for")

    def admits_unauthenticated(self, ctx: CallContext, method) -> bool:
        """Whether a connection that has not authenticated may make this call."""
        return False

    async def dispatch(self, ctx: CallContext, method, args):
        try:
            handler, known, required, cached = self._signatures[method]
        except (KeyError, TypeError):   # first call of a method, or not a method name
            handler, known, required, cached = self._method(method)
        if ctx.user is UNAUTHENTICATED and not self.admits_unauthenticated(ctx, method):
            raise errors.AuthenticationRequired(
                f"{method}: this connection has not authenticated (security = secure): "
                f"connect through the metadata server's local socket, or set token_file to "
                f"a delegation token (leasefs token fetch)")
        if not isinstance(args, dict):
            raise InvalidArgument(f"{method}: arguments must be a map of names to values")
        if not required <= args.keys() or not args.keys() <= known:
            if not all(isinstance(k, str) for k in args):
                raise InvalidArgument(f"{method}: arguments must be a map of names to values")
            try:   # let inspect word the error exactly (the rare, slow path)
                inspect.signature(handler).bind(ctx, **args)
            except TypeError as exc:
                raise InvalidArgument(f"{method}: {exc}") from None
        if cached and ctx.call_id is not None:
            return await self.retry_cache.run(
                (ctx.client_id, ctx.call_id, method), lambda: handler(ctx, **args),
                lambda: self.retry_answer(ctx, method, args, lambda: handler(ctx, **args)))
        return await handler(ctx, **args)

    async def retry_answer(self, ctx: CallContext, method: str, args: dict, rerun):
        """The answer of a retry-cached call that was applied before a failover or restart
        (``RetryCache.note``), rebuilt from the current state, or ``await rerun()`` where
        running it again is safe. A server that notes calls overrides this; the base has
        nothing to rebuild from."""
        raise InternalError(f"{method}: this call was applied before a failover or restart "
                            f"and this server cannot rebuild its answer")

    def _method(self, method) -> tuple:
        """(bound handler, accepted and required keyword names, retry cached?) of a method,
        computed once per method (``inspect.signature`` per call cost more than a whole
        getFileInfo); ``UnknownMethod`` for a name that is none."""
        if not isinstance(method, str) or not method.isidentifier():
            raise UnknownMethod(f"method name must be a string identifier, got {brief(method, 80)}")
        handler = getattr(self, "rpc_" + method, None)
        if handler is None:
            raise UnknownMethod(f"unknown method {method!r}")
        params = list(inspect.signature(handler).parameters.values())[1:]   # ctx
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)
               for p in params):
            raise InternalError(f"rpc_{method} must take only named parameters")
        entry = self._signatures[method] = (
            handler, frozenset(p.name for p in params),
            frozenset(p.name for p in params if p.default is p.empty),
            method in self.retry_cached)
        return entry


def check_version(version, supported: int, what: str) -> None:
    """``ProtocolError`` unless ``version`` is exactly the integer ``supported`` (not a bool,
    not a string of it)."""
    if type(version) is not int or version != supported:
        raise ProtocolError(f"{what}: unsupported protocol version {brief(version, 40)}; "
                            f"this server speaks version {supported}")


def _check_hello(hello) -> tuple[str, str, tuple[str, ...], bool]:
    """``(client_id, user, groups, sync_metadata)`` of a connection's first frame;
    ``ProtocolError`` if it is not a leasefs hello of ``PROTOCOL_VERSION``. A hello without
    ``user`` (an older client) is ``nobody``."""
    if not (isinstance(hello, dict) and hello.get("hello") == "leasefs"
            and isinstance(hello.get("client_id"), str) and hello["client_id"]):
        raise ProtocolError(f"first frame must be a leasefs hello, got {brief(hello)}")
    check_version(hello.get("version"), PROTOCOL_VERSION, "hello")
    sync_metadata = hello.get("sync_metadata", True)
    if not isinstance(sync_metadata, bool):
        raise ProtocolError(f"hello: sync_metadata must be true or false, got "
                            f"{brief(sync_metadata, 40)}")
    if hello.get("user") is None:
        return hello["client_id"][:256], ANONYMOUS_USER, (), sync_metadata
    try:
        user, groups = check_identity(hello["user"], hello.get("groups") or [])
    except InvalidArgument as exc:
        raise ProtocolError(str(exc)) from None
    return hello["client_id"][:256], user, groups, sync_metadata


async def serve_rpc(stream: trio.abc.Stream, dispatcher: Dispatcher, *,
                    max_frame: int = DEFAULT_MAX_FRAME, peer: str = "?",
                    max_concurrent_calls: int = 256, hello_timeout: float = 10.0,
                    send_timeout: float = 60.0, frame_timeout: float = math.inf,
                    idle_timeout: float = math.inf, budget=None,
                    credentials: PeerCredentials | None = None) -> None:
    """Serve one connection until the peer closes it or sends an unreadable frame.

    The hello's identity goes to ``dispatcher.open_session`` with ``credentials`` (the
    kernel's word on a local connection, None over TCP), which decides the connection's
    user; a request's fourth element asks ``dispatcher.act_as`` for another.

    At most ``max_concurrent_calls`` calls of one connection run at once; the reader stops
    reading until one finishes, so a peer that pipelines requests without reading replies
    holds a bounded amount of server memory. A reply that cannot be sent within
    ``send_timeout`` ends the connection. A frame that has not arrived whole
    ``frame_timeout`` seconds after its first bytes (not counting a wait for ``budget``)
    ends the connection with an error reply
    (logged); a connection with no call running, nothing to send and nothing received for
    ``idle_timeout`` seconds is closed quietly (clients reconnect on their next call).
    ``budget`` (``fs.limits.ByteBudget``) is the server-wide allowance large frames
    reserve before they are read."""
    inline = dispatcher.inline_methods
    observe = dispatcher.call_observer
    clock = time.perf_counter
    slots = trio.Semaphore(max_concurrent_calls)
    running = [0, trio.current_time()]     # calls in flight, trio time the last one ended

    def reply(call_id, ok, value) -> None:
        # other calls of this connection still running (a journal batch wakes them in one
        # scheduler round): their replies and this one leave in one write by the flusher; a
        # lone call's reply (a mount's calls come one at a time) leaves at once
        defer = running[0] > 1
        try:
            try:
                channel.send_nowait([call_id, ok, value, dispatcher.state_id()]
                                    if session.get("state_id") else [call_id, ok, value],
                                    defer=defer)
            except (TypeError, ValueError) as exc:  # result not msgpack-serialisable: a bug
                log.exception("cannot encode reply to call %r", call_id)
                channel.send_nowait(
                    [call_id, False, InternalError(f"cannot encode reply: {exc}").to_wire()],
                    defer=defer)
        except ServerUnavailable:
            pass  # the client went away; nothing to tell it

    def too_slow() -> None:
        log.warning("closing connection from %s: it has not read a reply for %g s",
                    peer, send_timeout)

    async def run_call(ctx: CallContext, method, args, holds_slot: bool):
        running[0] += 1
        # the clock is read only while observed: the hook costs nothing when unset
        start = clock() if observe is not None else 0.0
        result_kind = "ok"
        try:
            try:
                result = await dispatcher.dispatch(ctx, method, args)
            except LeaseFSError as exc:
                result_kind = type(exc).__name__
                reply(ctx.call_id, False, exc.to_wire())
            except Exception as exc:  # a bug: log it, answer, keep serving
                result_kind = "InternalError"
                log.exception("RPC %s from %s failed", brief(method, 40), ctx.peer)
                reply(ctx.call_id, False, InternalError(
                    f"{brief(method, 40)}: internal error: {type(exc).__name__}: {exc}").to_wire())
            else:
                reply(ctx.call_id, True, result)
        finally:
            running[0] -= 1
            running[1] = trio.current_time()
            if holds_slot:
                slots.release()
            if observe is not None:
                queued = start - ctx.received if ctx.received else 0.0
                observe(method, result_kind, queued, clock() - start)

    # Calls of one connection run in worker tasks that outlive a call: a worker that
    # finishes one takes the next waiting call or parks in ``idle``; a request is handed to
    # a parked worker (``pending`` + unpark) and only starts a new task when none is idle.
    # A task per call cost a spawn and an exit each (task object, context copy, nursery
    # bookkeeping), more than waking a parked one. ``pending`` holds at most one call per
    # worker woken and not yet running; a woken worker that finds it empty (a busy worker
    # took its call) exits. Once the reader stops, workers finish their calls and exit.
    pending: collections.deque = collections.deque()
    idle = trio.lowlevel.ParkingLot()
    session: dict = {}
    closing = [False]

    async def worker(ctx: CallContext, method, args) -> None:
        while True:
            await run_call(ctx, method, args, True)
            if not pending:
                if closing[0]:
                    return
                await idle.park()
                if not pending:
                    return
            ctx, method, args = pending.popleft()

    def stop_workers() -> None:
        closing[0] = True
        idle.unpark_all()

    async def read_requests(nursery, client_id, sync_metadata):
        while True:
            # the replies to one batch leave in one write: the channel's flusher runs after
            # this loop has answered the batch's reads and started its mutations
            for request in await channel.receive_batch():
                if not (isinstance(request, list) and 3 <= len(request) <= 5):
                    call_id = request[0] if isinstance(request, list) and request else None
                    reply(call_id if isinstance(call_id, int) else None, False, ProtocolError(
                        f"request must be [call_id, method, args] or [call_id, method, args, "
                        f"acting_for] or [call_id, method, args, acting_for or null, "
                        f"state_id], got {brief(request)}").to_wire())
                    continue
                call_id, method, args = request[:3]
                if not isinstance(call_id, int):
                    reply(None, False, ProtocolError(
                        f"call id must be an integer, got {brief(call_id, 40)}").to_wire())
                    continue
                # the connection's identity may change (an authentication call): read it
                # per request
                user, groups = session["user"], session["groups"]
                state_id = 0
                if len(request) == 5:
                    state_id = request[4]
                    if type(state_id) is not int or state_id < 0:
                        reply(call_id, False, ProtocolError(
                            f"state id must be an integer >= 0, got "
                            f"{brief(state_id, 40)}").to_wire())
                        continue
                if len(request) >= 4 and request[3] is not None:
                    try:
                        user, groups = dispatcher.act_as(session, request[3])
                    except LeaseFSError as exc:
                        reply(call_id, False, exc.to_wire())
                        continue
                ctx = CallContext(client_id=client_id, peer=peer, call_id=call_id,
                                  user=user, groups=groups, sync_metadata=sync_metadata,
                                  session=session, state_id=state_id)
                if method in inline:   # never awaits: no task of its own
                    await run_call(ctx, method, args, False)
                    continue
                if observe is not None:
                    ctx.received = clock()
                try:
                    slots.acquire_nowait()
                except trio.WouldBlock:
                    await slots.acquire()
                if len(idle):
                    pending.append((ctx, method, args))
                    idle.unpark()
                else:
                    nursery.start_soon(worker, ctx, method, args)
            if channel.backlogged:     # a peer that does not read its replies: stop reading
                await channel.drained()

    def timed_out(now: float) -> tuple[float, str | None]:
        """(when to look again, why the connection is over or None)."""
        if channel.awaiting_budget:    # the server is not reading it: no fault of the peer's
            return now + min(idle_timeout, frame_timeout), None
        if channel.partial_since is not None:
            deadline = channel.partial_since + frame_timeout
            if now >= deadline:
                return now, (f"a frame is still incomplete {frame_timeout:g} s after its "
                             f"first bytes")
            return deadline, None
        if running[0] or channel.sending:
            return now + min(idle_timeout, frame_timeout), None
        deadline = max(channel.last_received, running[1]) + idle_timeout
        if now >= deadline:
            return now, ""
        # a frame that starts after now ends no earlier than now + frame_timeout
        return min(deadline, now + frame_timeout), None

    async def watch(reading: trio.CancelScope, verdict: list) -> None:
        with watching:
            while True:
                wake, why = timed_out(trio.current_time())
                if why is not None:
                    verdict.append(why)
                    reading.cancel()
                    return
                await trio.sleep_until(wake)

    # In-flight calls run to completion when the peer goes away (a mutation half done is
    # never cancelled by a disconnect); their replies are dropped. The channel's flusher
    # outlives them (outer nursery), so a last reply is written before the stream closes.
    channel = None
    watching = trio.CancelScope()
    try:
        async with trio.open_nursery() as outer:
            # a lone call's reply leaves at once (see FrameChannel.send_nowait and reply()):
            # holding every reply for the flusher saves a write per journal batch under many
            # clients but costs each reply a scheduler round, and a mount's calls come one
            # at a time
            channel = FrameChannel(stream, outer, MAX_HELLO_FRAME, send_timeout=send_timeout,
                                   on_send_timeout=too_slow, budget=budget)
            async with trio.open_nursery() as nursery:
                try:
                    with trio.move_on_after(hello_timeout) as scope:
                        hello = await channel.receive_frame()
                    if scope.cancelled_caught:
                        raise ProtocolError("no hello frame in time")
                    client_id, user, groups, sync_metadata = _check_hello(hello)
                    dispatcher.open_session(session, user, groups, credentials, peer)
                    # replies carry the server's state id (a 4th element) when asked
                    session["state_id"] = hello.get("state_id") is True
                    channel.max_frame = max_frame
                    verdict: list[str] = []
                    with trio.CancelScope() as reading:
                        if frame_timeout < math.inf or idle_timeout < math.inf:
                            nursery.start_soon(watch, reading, verdict)
                        await read_requests(nursery, client_id, sync_metadata)
                    if verdict and verdict[0]:
                        raise ProtocolError(verdict[0])
                    if verdict:
                        log.debug("closing connection from %s: idle for %g s", peer,
                                  idle_timeout)
                except (EOFError, ServerUnavailable):
                    pass
                except (ProtocolError, errors.AuthenticationFailed) as exc:
                    log.warning("closing connection from %s: %s", peer, exc)
                    reply(None, False, exc.to_wire())
                finally:
                    stop_workers()
                watching.cancel()
            await channel.finish()
    finally:
        with trio.CancelScope(shield=True):
            if channel is not None:
                await channel.aclose()
            else:
                await stream.aclose()


async def serve_tcp(handler, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED,
                    name: str = "server", limits: ConnectionLimits | None = None,
                    refusal=None, tls=None):
    """Listen on ``host:port`` (0 = any free port), report the bound address through
    ``task_status.started((host, port))`` and run ``handler(stream, peer)`` per connection.

    With ``limits``, a connection beyond them is refused: ``refusal(reason)`` (the frame
    that tells the peer why, in the server's protocol) is sent best-effort, the connection
    is closed and the refusal logged (``RefusalLog``: once per peer, then counted).

    With ``tls`` (``fs.tls.ServerTls``) every connection must open with a TLS handshake,
    done before ``handler`` gets the ``trio.SSLStream``; a peer without TLS gets
    ``refusal(reason, TlsError)`` in plaintext, one whose handshake fails or stalls a
    logged refusal (``fs.tls.accept``). A refusal for the limits then goes over TLS."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[:2]
    log.info("%s listening on %s", name, format_address(bound))
    refusals = RefusalLog(log)
    if tls is not None:
        # what a peer without TLS is told, in plaintext, in the server's protocol
        not_tls = encode_frame(refusal(
            f"{name} at {format_address(bound)} speaks TLS only (tls = on there); set "
            f"tls = on and tls_ca_file to the cluster's CA certificate",
            errors.TlsError)) if refusal is not None else b""

    async def per_connection(stream):
        try:
            address = stream.socket.getpeername()[:2]
            peer, peer_host = format_address(address), address[0]
        except OSError:
            peer = peer_host = "?"
        if limits is not None:
            why = limits.admit(peer_host)
            if why is not None:
                refusals.refused(peer_host, "connections",
                                 f"{name}: refusing a connection from {peer}: {why}")
                await _refuse(stream, refusal(why) if refusal is not None else None, tls,
                              peer, name, refusals)
                return
        try:
            if tls is not None:
                secured = await tlsmod.accept(stream, tls, peer, name, refusals, not_tls)
                if secured is None:
                    return
                stream = secured
            await handler(stream, peer)
        except Exception:
            log.exception("%s: connection handler from %s failed", name, peer)
        finally:
            if limits is not None:
                limits.release(peer_host)

    async with trio.open_nursery() as nursery:
        task_status.started((bound[0], bound[1]))
        await trio.serve_listeners(per_connection, listeners, handler_nursery=nursery)


async def serve_local(handler, name: str, *, task_status=trio.TASK_STATUS_IGNORED,
                      server: str = "server", limits: ConnectionLimits | None = None,
                      refusal=None):
    """Listen on the local (Unix domain) socket ``name`` (``local_socket_address``) and run
    ``handler(stream, peer, credentials)`` per connection, ``credentials`` being the
    kernel's ``PeerCredentials`` of the connecting process. A filesystem path is replaced
    if a socket file is already there (a crashed server's) and made connectable by every
    local user: the kernel says who each one is. ``limits`` count per uid."""
    address = local_socket_address(name)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if isinstance(address, str):
            try:
                if os.path.exists(address) and not os.path.isdir(address):
                    os.unlink(address)
            except OSError:
                pass
        await sock.bind(address)
        if isinstance(address, str):
            os.chmod(address, 0o666)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServerUnavailable(f"{server}: cannot listen on local socket {name}: "
                                f"{exc.strerror or exc}") from None
    log.info("%s listening on local socket %s", server, name)
    refusals = RefusalLog(log)

    async def per_connection(stream):
        try:
            credentials = PeerCredentials.of(stream.socket)
        except OSError:
            await stream.aclose()
            return
        peer = f"local:{user_name(credentials.uid)}:{credentials.pid}"
        key = f"uid {credentials.uid}"
        if limits is not None:
            why = limits.admit(key)
            if why is not None:
                refusals.refused(key, "connections",
                                 f"{server}: refusing a connection from {peer}: {why}")
                await _refuse(stream, refusal(why) if refusal is not None else None)
                return
        try:
            await handler(stream, peer, credentials)
        except Exception:
            log.exception("%s: connection handler from %s failed", server, peer)
        finally:
            if limits is not None:
                limits.release(key)

    try:
        async with trio.open_nursery() as nursery:
            task_status.started(name)
            await trio.serve_listeners(per_connection, [trio.SocketListener(sock)],
                                       handler_nursery=nursery)
    finally:
        sock.close()
        if isinstance(address, str):
            try:
                os.unlink(address)
            except OSError:
                pass


def rpc_refusal(why: str, kind=errors.ServerBusy) -> list:
    """The frame a refused RPC connection gets: a connection-level ``ServerBusy`` (or
    ``kind``: ``TlsError`` for a peer without TLS at a TLS port)."""
    prefix = "connection refused: " if kind is errors.ServerBusy else ""
    return [None, False, kind(f"{prefix}{why}").to_wire()]


#: seconds a refused peer of a TLS server gets to finish the handshake that carries the
#: refusal (without TLS the refusal is one write that never waits)
TLS_REFUSAL_TIMEOUT = 2.0


async def _refuse(stream: trio.SocketStream, frame, tls=None, peer: str = "?",
                  name: str = "server", refusals=None) -> None:
    """Tell a refused peer why (one frame, without waiting for a slow reader) and close.
    Under TLS the frame must go through a handshake (bounded by ``TLS_REFUSAL_TIMEOUT``);
    the raw socket write is only for plaintext."""
    if tls is not None:
        quick = tlsmod.ServerTls(tls.context, timeout=TLS_REFUSAL_TIMEOUT)
        secured = await tlsmod.accept(stream, quick, peer, name, refusals or RefusalLog(log),
                                      b"" if frame is None else encode_frame(frame))
        if secured is None:
            return
        with trio.move_on_after(TLS_REFUSAL_TIMEOUT):
            try:
                if frame is not None:
                    await secured.send_all(encode_frame(frame))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        with trio.CancelScope(shield=True):
            await secured.aclose()
        return
    try:
        if frame is not None:
            os.write(stream.socket.fileno(), encode_frame(frame))
    except OSError:
        pass
    with trio.CancelScope(shield=True):
        await stream.aclose()
