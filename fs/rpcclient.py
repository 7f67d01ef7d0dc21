"""The client side of leasefs RPC (the wire: ``fs.rpc``, docs/PROTOCOL.md).

Why a module of its own: one job per module. ``RpcClient`` is what every caller of a
metadata server uses (``fs.client``, block servers' heartbeats, the tools): it keeps one
connection to the current server of its list, sends the hello and the calls, matches the
replies to the waiting calls, times them out, retries a call lost with its connection
(same call id, so the server's retry cache applies it at most once) and fails over through
the server list; ``StateAlignment`` carries the newest server state id a client has seen
(read-your-writes for observer reads). The server side is ``fs.rpcserver``; the pieces both
share (addresses, identities, local socket names, ``ACTING_FOR``) are ``fs.rpc``, which
re-exports this module's public names.

Concurrency contract: ``RpcClient.call`` may be called from any number of tasks of the
client's trio thread at once; sends are queued whole on the connection's channel (no lock),
one reader task per connection resolves the waiters.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

import outcome
import trio

from . import delegation, errors, localserver, nodeauth, tcpliveness
from . import tls as tlsmod
from .backoff import Backoff
from .config import DEFAULT_LOCAL_SOCKET
from .errors import (LeaseFSError, NothingListens, ProtocolError, RpcTimeout, ServerUnavailable,
                     sole_exception)
from .framing import DEFAULT_MAX_FRAME, FrameChannel, brief
from .rpcbase import (ACTING_FOR, check_identity, current_groups, current_user, format_address,
                      format_address_list, hello, is_default_local_socket, is_loopback_host,
                      local_socket_address, local_socket_name, parse_address,
                      parse_address_list)

# the logger keeps the name it had before the client moved out of fs.rpc: logging settings
# and log readers that name "fs.rpc" still see the client's messages
log = logging.getLogger("fs.rpc")

#: how long a probe for the active waits for the list's answers, as a share of the client's
#: ``silence``
PROBE_SHARE = 0.5
#: the least time between two probes' starts, as a share of ``silence``: while a silent
#: server's successor takes over, how late its clients may learn of it
PROBE_PAUSE = 0.2


def _local_sockets(setting: str | None, addresses) -> list[str | None]:
    """The local socket of each of ``addresses`` (``local_socket_name``). A name that
    several addresses share (a setting without ``{port}``) cannot tell their servers apart:
    those go over TCP."""
    names = [local_socket_name(setting, a) if setting else None for a in addresses]
    if len(addresses) > 1:
        # the default socket of a server on another host than loopback is used only where
        # its address is this host's (``_open_local``): that tells them apart
        shared = {n for a, n in zip(addresses, names) if n is not None and names.count(n) > 1
                  and not is_default_local_socket(n, a)}
        if shared:
            log.debug("local socket %s is named for several servers of the list: TCP for "
                      "them", ", ".join(sorted(shared)))
        names = [None if n in shared else n for n in names]
    return names


#: the wait after a full cycle of the server list in which none served: jittered, so that
#: after a failover the clients of the old active do not all try the new one at the same
#: instant; equal jitter (at least half of each ceiling), so that a call within a short
#: budget never spins and a server taking over gets no more tries than about 4/3 of what
#: the plain doubling gave it
RETRY_BACKOFF = Backoff(first=0.05, factor=2, cap=1.0, jitter=0.5)
#: the wait before connecting again to a local socket whose backlog is full
ACCEPT_BACKOFF = Backoff(first=0.01, factor=1, cap=0.01, jitter=0.5)


@dataclass(frozen=True)
class RetryPolicy:
    """What a caller with a person waiting for it (the CLI) asks of ``RpcClient.call`` on
    top of its retry budget. ``refused_is_final``: until the client has once reached a
    server, a connection refused on loopback by every address (``NothingListens``) ends the
    call at once; a server that goes away later is retried as usual (a restart).
    ``notice(text)``: told once per cause what is being retried and for how long."""

    refused_is_final: bool = False
    notice: Callable[[str], None] | None = None


def _refused_on_loopback(exc: BaseException, host: str) -> bool:
    """Did every attempt of ``trio.open_tcp_stream`` to the loopback ``host`` get refused?"""
    attempts = getattr(exc.__cause__, "exceptions", None) or [exc]
    return is_loopback_host(host) and all(isinstance(e, ConnectionRefusedError) for e in attempts)


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
        # trio times of the last reply batch and of the moment calls began to wait on a
        # connection that had none waiting: the server is silent when both are older than
        # the client's ``silence``
        self.heard = 0.0
        self.owed_since = 0.0
        # ``heard`` when the server last left a probe for the active unanswered (None: it
        # answered, or was not asked since it last sent something)
        self.probe_unanswered: float | None = None

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
    sends the call there, same call id; a full cycle where no address served waits a
    jittered backoff (``RETRY_BACKOFF``: 0.025 to 0.05 s, doubling to 0.5 to 1 s) before
    the next, until ``retry_seconds`` are spent (the last wait is cut to what is left, and
    one more full cycle follows it); in an HA list where a server answered that it is a
    standby, the waits are capped at ``silence`` × ``PROBE_PAUSE`` (a successor serves the
    moment it is elected). A
    working address stays current until it fails: calls never probe the others.
    ``RpcTimeout`` is not retried (the call may be running). Calls still in flight on the
    connection left behind get their replies there; new calls go to the new address.

    A server that is silent (``silence`` s without a reply while calls wait on it: frozen,
    SIGSTOPped, a stuck disk) still holds its connection open, so nothing above fires until
    it wakes. Then the client asks every server of the list for its role at once
    (``ha_status``, HDFS RequestHedgingProxyProvider's probe) and moves its waiting calls,
    same call ids, to another server only if that one says it is active in a term at least
    as new as any it saw; a live server that is merely slow (a big listing) is never left
    while no other claims the role. The call abandoned there is harmless: a deposed active
    answers nothing once it cannot vouch for its term, and the retry cache answers the
    re-sent call with its first outcome if the old active had logged it. Probes repeat
    while the server stays silent, at most one at a time, begun at least ``silence`` ×
    ``PROBE_PAUSE`` s apart; once the silent server leaves one unanswered, they ask only
    the others. A connect to a server of such a list gives up after ``silence`` too (a cut
    link drops the handshake without a word): the call goes on to the next server.

    ``user``/``groups`` are the identity the hello states (default: the calling process's
    user and group names); the metadata server checks permissions against them.
    """

    def __init__(self, address, client_id: str, *, timeout: float = 60.0,
                 retry_seconds: float = 30.0, connect_timeout: float = 5.0,
                 max_frame: int = DEFAULT_MAX_FRAME,
                 retry_errors: tuple[type[LeaseFSError], ...] = (),
                 user: str | None = None, groups=None, sync_metadata: bool = True,
                 authenticate=None, local_socket: str | None = DEFAULT_LOCAL_SOCKET,
                 token=None, tls=None, alignment: "StateAlignment | None" = None,
                 retry_policy: RetryPolicy | None = None, silence: float | None = None,
                 rng: random.Random | None = None):
        self.addresses = parse_address_list(address)
        self._rng = rng            # the backoff's random source (tests seed it); None: shared
        self.retry_policy = retry_policy or RetryPolicy()
        self._reached = False      # a connection was once made: a refusal now is a restart
        # trio time since when the server is known unreachable (a connection that broke
        # without the server closing it, a connect that failed); None once it answers
        self.unreachable_since: float | None = None
        self._noticed: set[str] = set()   # causes ``retry_policy.notice`` was told of
        # seconds a server that owes replies may say nothing before the list is probed for
        # the active (class docstring); None, or a single address: never
        self.silence = silence if silence and len(self.addresses) > 1 else None
        self._probing = False
        self._probe_began = -math.inf
        self._epoch = 0            # the newest term a probe found an active server in
        self._current = 0          # index into addresses: where calls go now (sticky)
        self._told: dict[int, str] = {}   # address index → the state last logged of it
        # each server's local socket (``local_socket_address``), tried before TCP: there the
        # kernel tells the server who we are; by default the default ``meta_socket`` of a
        # server on a loopback address or one of this host's, None: TCP only. ``local_socket`` is the setting
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
        # a server of an HA list that takes longer to accept a connection than it may stay
        # silent is taken for gone: a cut link drops the handshake, and waiting out the
        # whole connect timeout there would keep a new client from the active that long
        self._accept_timeout = min(connect_timeout, self.silence or connect_timeout)
        self.max_frame = max_frame
        # server errors that mean "not now" (e.g. startup safe mode): retried like a lost
        # connection, within the same retry budget
        self.retry_errors = retry_errors
        self._call_ids = itertools.count(1)
        self._conn: _Connection | None = None
        # a new connection while it authenticates (not yet ``_conn``): watched for silence
        self._connecting: _Connection | None = None
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

    def _unreachable(self) -> None:
        if self.unreachable_since is None:
            self.unreachable_since = trio.current_time()

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
            channel.send_nowait(hello(self.client_id, self.user, self.groups,
                                      sync_metadata=self.sync_metadata,
                                      state_id=self.alignment is not None))
            conn = _Connection(channel, index, address)
            self._nursery.start_soon(self._reader, conn)
            authenticate = self.authenticate
            if authenticate is None and self.token is not None and not local:
                authenticate = functools.partial(self._token_authenticate, address=address)
            if authenticate is not None:
                self._connecting = conn
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
                finally:
                    self._connecting = None
            self._conn = conn
            self._reached = True
            return conn

    async def _open_stream(self, address, local_socket) -> tuple[trio.abc.Stream, bool]:
        """``(stream, local)`` to ``address``: its local socket when there is one and it
        answers, else TCP (TLS over it when ``self.tls``, the certificate checked for the
        host of ``address``)."""
        if local_socket:
            stream = await self._open_local(address, local_socket)
            if stream is not None:
                return stream, True
        host, port = address
        try:
            with trio.fail_after(self._accept_timeout):
                stream = await trio.open_tcp_stream(host, port)
            tcpliveness.watch(stream)
        except (OSError, trio.TooSlowError) as exc:
            self._unreachable()
            if _refused_on_loopback(exc, host):
                raise NothingListens(f"cannot reach {format_address(address)}: nothing listens "
                                     f"there (connection refused)") from None
            raise ServerUnavailable(
                f"cannot reach {format_address(address)}: "
                f"{str(exc) or f'no connection within {self._accept_timeout:g} s'}"
            ) from None
        if local_socket:
            # a server binds its local socket before its TCP port: one that started between
            # the two attempts answers there now, and over TCP we would be nobody
            try:
                local = await self._open_local(address, local_socket)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
                raise
            if local is not None:
                await stream.aclose()
                return local, True
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

    async def _open_local(self, address, name: str) -> trio.SocketStream | None:
        """A connection to the local socket ``name`` of the metadata server at ``address``,
        its holder checked to be that server before anything is sent (``fs.localserver``);
        None when no server listens there (another machine's server, or one without a
        local socket: TCP then). A socket whose backlog is full is busy, not absent: it is
        tried again until ``connect_timeout`` (``silence`` for a server of an HA list)."""
        target = local_socket_address(name)
        deadline = trio.current_time() + self._accept_timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(target)   # a Unix socket connects at once or not at all
                break
            except BlockingIOError:    # its backlog is full: a busy server, wait
                sock.close()
                if trio.current_time() >= deadline:
                    raise ServerUnavailable(
                        f"local socket {name}: its server accepted no connection within "
                        f"{self._accept_timeout:g} s") from None
                await ACCEPT_BACKOFF.sleep(0)
            except OSError:
                sock.close()
                return None
        try:
            wanted = localserver.addresses(address[0])
            if wanted is None:
                wanted = await trio.to_thread.run_sync(localserver.resolve, address[0])
            if not localserver.verify(sock, name, address, wanted):
                sock.close()    # another host's server: this socket is someone else's
                return None
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(trio.socket.from_stdlib_socket(sock))

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
        self._owe(conn, trio.current_time(), bool(conn.waiters))
        conn.waiters[call_id] = waiter
        conn.channel.send_nowait([call_id, method, args])
        ok, value = await waiter.wait(lambda: conn.waiters.pop(call_id, None))
        if ok:
            return value
        raise value if isinstance(value, LeaseFSError) else errors.from_wire(value)

    async def _reader(self, conn: _Connection) -> None:
        try:
            while True:
                batch = await conn.channel.receive_batch()
                conn.heard = trio.current_time()
                self.unreachable_since = None
                for reply in batch:
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
            self._unreachable()
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
        now = trio.current_time()
        waiter = _Waiter(now + timeout)
        # other calls waiting on this connection: this request most likely has company in
        # this scheduler round (the callers one batch of replies woke), so it waits for the
        # flusher and they leave in one write; a lone call is written at once
        defer = bool(conn.waiters)
        self._owe(conn, now, defer)
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

    def _owe(self, conn: _Connection, now: float, waiting: bool) -> None:
        """A call is about to wait on ``conn`` (``waiting``: others already do): a
        connection that had none waiting starts its silence clock now, and the watchdog
        wakes when it runs out."""
        if waiting or self.silence is None:
            return
        conn.owed_since = now
        if now + self.silence < self._watchdog_scope.deadline:
            self._watchdog_scope.deadline = now + self.silence

    def _silent_at(self) -> float:
        """When the current server's connection counts as silent (``silence`` s with calls
        waiting and no reply), not before the last probe's time is up; inf: not watched."""
        conn = self._conn if self._conn is not None else self._connecting
        if (self.silence is None or self._probing or conn is None or not conn.waiters
                or conn.broken is not None):
            return math.inf
        return max(max(conn.owed_since, conn.heard) + self.silence,
                   self._probe_began + self.silence * PROBE_PAUSE)

    async def _watchdog(self) -> None:
        """Times out calls: sleeps until the earliest deadline of any waiting call (a call
        with an earlier one moves the wake-up forward), then fails the expired ones. Starts
        a probe when the current server has been silent too long (``_silent_at``)."""
        while True:
            with trio.CancelScope() as scope:
                self._watchdog_scope = scope
                scope.deadline = min(min((w.deadline for conn in self._live()
                                          for w in conn.waiters.values()), default=math.inf),
                                     self._silent_at())
                await trio.sleep_forever()
            now = trio.current_time()
            for conn in self._live():
                expired = [call_id for call_id, w in conn.waiters.items() if w.deadline <= now]
                for call_id in expired:
                    conn.waiters.pop(call_id).resolve(False, RpcTimeout("timed out"))
            if self._silent_at() <= now:
                conn = self._conn if self._conn is not None else self._connecting
                self._probing, self._probe_began = True, now
                self._nursery.start_soon(self._probe, conn)

    async def _probe(self, conn: _Connection) -> None:
        """Ask the servers of the list for their HA role while ``conn``'s server is silent;
        move the calls waiting on it to another server that says it is active in a term at
        least as new as any seen (the class docstring). The first probe of a silence asks
        the silent server too and waits for it (up to the probe's timeout): a live server's
        own answer shows a claim of an older term stale. Once it has left a probe
        unanswered, the next ones ask only the others, so a successor is found as soon as
        it says so."""
        index, waited = conn.index, trio.current_time() - max(conn.owed_since, conn.heard)
        texts = [format_address(a) for a in self.addresses]
        # the silent server left a probe unanswered and has sent nothing since
        unanswered = conn.probe_unanswered == conn.heard
        asked = [i for i in range(len(texts)) if not (unanswered and i == index)]

        def claims(answers: dict) -> dict[int, int]:
            """address index → epoch, of the servers that say they are active"""
            found = {}
            for i, text in enumerate(texts):
                status = answers.get(text, (None, None))[0]
                if (isinstance(status, dict) and status.get("role") == "active"
                        and type(status.get("epoch")) is int):
                    found[i] = status["epoch"]
            return found
        try:
            answers = await call_each(
                [texts[i] for i in asked], "ha_status", timeout=self.silence * PROBE_SHARE,
                name=f"{self.client_id}-probe", max_frame=self.max_frame, user=self.user,
                groups=self.groups, local_socket=[self._local_sockets[i] for i in asked],
                token=self.token, tls=self.tls, authenticate=self.authenticate)
        finally:
            self._probing = False
            self._watchdog_scope.cancel()   # the watchdog looks again at what is silent
        found = claims(answers)
        if index in found:
            self._epoch = max(self._epoch, found[index])
        best = max(found, key=found.get, default=None)
        if (best is None or best == index or found[best] < self._epoch
                or conn.broken is not None or self._current != index):
            if unanswered:
                return
            if answers[texts[index]][0] is not None:   # it answers: alive, only slow
                conn.heard = trio.current_time()
            else:
                conn.probe_unanswered = conn.heard
            return
        self._epoch = found[best]
        self._current = best
        if self._conn is conn:
            self._conn = None
        self._told[index] = "is silent"
        why = (f"{texts[index]} said nothing for {waited:.1f} s; {texts[best]} says it is "
               f"active (epoch {found[best]})")
        log.warning("metadata server %s: the calls waiting there (%d) move to it", why,
                    len(conn.waiters))
        conn.fail_all(ServerUnavailable(why))
        self._nursery.start_soon(conn.channel.aclose)

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
        attempt = 0      # cycles that failed so far
        last_cycle = False   # the wait before it was cut to the deadline: no wait after it
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
                    if len(failed) < len(self.addresses):
                        # the next server at once: a cycle asks each, also one the deadline
                        # passes in (the error then names every server and its cause)
                        continue
                if self.retry_policy.refused_is_final and not self._reached and \
                        isinstance(exc, NothingListens) and \
                        all(isinstance(e, NothingListens) for e in failed.values()):
                    if several:
                        raise NothingListens(f"cannot reach any of "
                                             f"{format_address_list(self.addresses)}: nothing "
                                             f"listens there (connection refused)") from None
                    raise
                left = deadline - time.monotonic()
                if left <= 0 or last_cycle:
                    if several and failed:
                        raise self._none_served(failed, budget) from None
                    raise
                delay = self._cycle_backoff(failed).delay(attempt, self._rng)
                if delay >= left:    # one more full cycle, at the deadline
                    delay, last_cycle = left, True
                log.debug("%s: %s; retrying in %.2fs", method, exc, delay)
                self._notice(exc, index, deadline)
                failed.clear()
                await trio.sleep(delay)
                attempt += 1

    def _cycle_backoff(self, failed: dict[int, LeaseFSError]) -> Backoff:
        """The wait after a cycle in which no server served: ``RETRY_BACKOFF``, or, in an HA
        list where a server answered that it is a standby (a successor is about to be
        elected and serves the moment it is), one capped at the probes' pace
        (``silence`` × ``PROBE_PAUSE``): the election's end is found as soon as a silent
        server's is, not up to ``RETRY_BACKOFF``'s 1 s cap later."""
        if self.silence is None or not any(isinstance(exc, errors.StandbyError)
                                           for exc in failed.values()):
            return RETRY_BACKOFF
        cap = min(RETRY_BACKOFF.cap, self.silence * PROBE_PAUSE)
        return replace(RETRY_BACKOFF, first=min(RETRY_BACKOFF.first, cap), cap=cap)

    def _notice(self, exc: LeaseFSError, index: int, deadline: float) -> None:
        """Tell ``retry_policy.notice`` what is retried, the first time for each cause."""
        notice = self.retry_policy.notice
        cause, where = str(exc), format_address(self.addresses[index])
        if where not in cause:
            cause = f"{where}: {cause}"
        if notice is None or cause in self._noticed:
            return
        self._noticed.add(cause)
        notice(f"{cause}; retrying for up to {max(0.0, deadline - time.monotonic()):.0f} s")

    def _none_served(self, failed: dict[int, LeaseFSError], budget: float) -> LeaseFSError:
        """The error of a call no server of the list carried out: ``StandbyError`` when
        each answered so, else ``ServerUnavailable``; it names every server and its cause."""
        causes = "; ".join(f"{format_address(self.addresses[i])}: {exc}"
                           for i, exc in sorted(failed.items()))
        every = all(isinstance(exc, errors.StandbyError) for exc in failed.values())
        kind = errors.StandbyError if every else ServerUnavailable
        when = f"within {budget:g} s" if budget > 0 else "asked once each, without retries"
        return kind(f"no metadata server of {format_address_list(self.addresses)} served the "
                    f"call {when} ({causes})")


# --------------------------------------------------------------------------- each server
# What ``haadmin``, observer discovery (``fs.observer``), ``RpcClient``'s probe for the
# active while its server is silent, the HA benchmark and the tests use to learn each
# server's role (``ha_status``) or to make one server resign (``ha_failover``): these calls
# must reach THE server named, answer or not, within a bound, where a normal call goes to
# whichever server of the list serves it. Its calls run at once, each on its own connection.
async def call_each(addresses, method: str = "ha_status", args: dict | None = None, *,
                    timeout: float = 2.0, name: str = "leasefs-ha-probe",
                    local_socket: str | list[str | None] | None = DEFAULT_LOCAL_SOCKET,
                    **rpc_args) -> dict[str, tuple[object, BaseException | None]]:
    """``method(**args)`` on every server of ``addresses`` (a list, or a comma-separated
    string) at once, without retries: ``"host:port"`` → ``(answer, None)``, or ``(None,
    why)`` when it did not answer within ``timeout`` s or refused. ``local_socket``: the
    ``meta_socket`` setting, filled in per address as an ``RpcClient`` of the whole list
    does, or a list of each address's socket name already filled in (None: TCP);
    ``rpc_args``: more ``RpcClient`` arguments (TLS, authentication, max frame)."""
    if isinstance(addresses, str):
        addresses = parse_address_list(addresses)
    texts = [a if isinstance(a, str) else format_address(a) for a in addresses]
    if not isinstance(local_socket, list):
        local_socket = _local_sockets(local_socket, [parse_address(a) for a in texts])
    sockets = dict(zip(texts, local_socket))
    out: dict[str, tuple] = {}

    async def one(address: str) -> None:
        try:
            async with RpcClient(address, name, timeout=timeout, retry_seconds=0,
                                 connect_timeout=timeout, local_socket=sockets[address],
                                 **rpc_args) as rpc:
                with trio.fail_after(timeout):
                    out[address] = (await rpc.call(method, args or {}, retry_seconds=0), None)
        except BaseException as raised:   # trio wraps errors crossing the client's nursery
            exc = sole_exception(raised)
            if not isinstance(exc, (LeaseFSError, OSError, trio.TooSlowError)):
                raise
            out[address] = (None, exc)

    async with trio.open_nursery() as nursery:
        for address in texts:
            nursery.start_soon(one, address)
    return {address: out[address] for address in texts}   # in the order given
