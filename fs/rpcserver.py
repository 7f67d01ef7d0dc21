"""The server side of leasefs RPC (the wire: ``fs.rpc``, docs/PROTOCOL.md).

Why a module of its own: one job per module. Every leasefs server (the metadata server,
block servers) serves its protocol through this: ``serve_tcp`` and ``serve_local`` listen
and admit connections (``fs.limits`` refusals, TLS), ``serve_rpc`` runs one RPC connection
(hello and identity checks, requests, replies, timeouts), ``Dispatcher`` maps calls to a
server's ``rpc_<method>`` handlers through the ``RetryCache``. The client side is
``fs.rpcclient``; the pieces both share are ``fs.rpc``, which re-exports this module's
public names.

Server side: ``serve_rpc`` reads requests and runs each mutation in a worker task of the
connection (one per call in flight, reused for the next call rather than started anew), so
one slow call (a journal fsync) never blocks the others on the connection; reads that never await
(``Dispatcher.inline_methods``) run in the reader itself, and their replies to one batch of
requests leave in one write at its end. A malformed request gets an
error reply and the connection keeps serving; only an unreadable frame (too large, not
msgpack) ends the connection, after a best-effort error reply. Handler bugs are logged and
answered with ``InternalError``; the server never dies on a client's mistake.

Concurrency contract: everything here runs in the server's trio thread. ``serve_rpc`` has
one reader task per connection and at most ``max_concurrent_calls`` worker tasks; the
dispatcher's handlers run in those tasks concurrently (all on that one thread, like the
``RetryCache``), so state a handler does not hold across an await needs no lock.
"""

from __future__ import annotations

import collections
import errno
import inspect
import logging
import math
import os
import socket
import time

import trio

from . import errors, localserver, tcpliveness
from . import tls as tlsmod
from .errors import (InternalError, InvalidArgument, LeaseFSError, ProtocolError,
                     ServerUnavailable, UnknownMethod)
from .framing import (DEFAULT_MAX_FRAME, UNBUDGETED_FRAME, FrameChannel, brief,
                      encode_frame)
from .limits import Admission, ConnectionLimits, RefusalLog
from .retry_cache import RetryCache
from .rpcbase import (ANONYMOUS_USER, MAX_HELLO_FRAME, PROTOCOL_VERSION, UNAUTHENTICATED,
                      CallContext, PeerCredentials, check_identity, format_address,
                      local_socket_address, user_name)

# the logger keeps the name it had before the server moved out of fs.rpc: logging settings
# and log readers that name "fs.rpc" still see the server's messages
log = logging.getLogger("fs.rpc")


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
    # True while an inline method might await after all: they then get a task as others do
    inline_paused: bool = False
    # metrics hook: None, or ``observe(method, outcome, queued, seconds)`` called once per
    # call after its reply was queued (``outcome`` "ok" or the error's class name; ``method``
    # as the peer sent it, possibly not a method name; ``queued``: seconds it waited for a
    # slot and a worker, 0 for inline reads; ``seconds``: its run). Read once per connection.
    call_observer = None

    def __init__(self, retry_cache: RetryCache | None = None):
        # "is not None": an empty cache is falsy (it has a length)
        self.retry_cache = retry_cache if retry_cache is not None else RetryCache()
        self._signatures: dict[str, tuple] = {}

    def state_id(self) -> int:
        """The state replies carry to a client whose hello asked for it (``state_id``):
        the metadata server's applied journal txid; 0 for servers without one."""
        return 0

    def handlers(self) -> tuple:
        """The objects whose ``rpc_<method>`` methods this dispatcher serves, the first that
        has a method wins: the dispatcher itself, unless a server composed of front ends
        names them."""
        return (self,)

    def handler(self, method: str):
        """The bound ``rpc_<method>`` that serves ``method`` (``UnknownMethod`` if none), for
        a caller inside the server: it skips ``dispatch`` and its identity checks."""
        return (self._signatures.get(method) or self._method(method))[0]

    def methods(self) -> list[str]:
        return sorted({n[4:] for h in self.handlers() for n in dir(h) if n.startswith("rpc_")})

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

    def authenticated(self, session: dict) -> bool:
        """Whether the connection of ``session`` has proven who it is (a user, or a node of
        the cluster): until then it gets ``UNAUTHENTICATED_MAX_FRAME``, ``auth_timeout``
        and the server's budget of unauthenticated connections."""
        return session.get("user") is not UNAUTHENTICATED

    async def dispatch(self, ctx: CallContext, method, args):
        try:
            handler, known, required, cached = self._signatures[method]
        except (KeyError, TypeError):   # first call of a method, or not a method name
            handler, known, required, cached = self._method(method)
        if ctx.user is UNAUTHENTICATED and not self.admits_unauthenticated(ctx, method):
            raise errors.AuthenticationRequired(
                f"{method}: this connection has not authenticated (security = secure): over "
                f"TCP the server knows no user without a delegation token; run `leasefs token "
                f"fetch FILE` on the metadata server's host or a block server's host (their "
                f"local sockets, where the kernel names you), copy FILE here (mode 0600) and "
                f"set token_file or LEASEFS_TOKEN_FILE to it")
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
                lambda kept: self.retry_answer(ctx, method, args, lambda: handler(ctx, **args),
                                               kept))
        return await handler(ctx, **args)

    async def retry_answer(self, ctx: CallContext, method: str, args: dict, rerun, kept=None):
        """The answer of a retry-cached call that was applied before a failover or restart
        (``RetryCache.note``; ``kept``: what its record kept of the answer), rebuilt from
        the current state, or ``await rerun()`` where running it again is safe. A server
        that notes calls overrides this; the base has nothing to rebuild from."""
        raise InternalError(f"{method}: this call was applied before a failover or restart "
                            f"and this server cannot rebuild its answer")

    def _method(self, method) -> tuple:
        """(bound handler, accepted and required keyword names, retry cached?) of a method,
        computed once per method (``inspect.signature`` per call cost more than a whole
        getFileInfo); ``UnknownMethod`` for a name that is none."""
        if not isinstance(method, str) or not method.isidentifier():
            raise UnknownMethod(f"method name must be a string identifier, got {brief(method, 80)}")
        name = "rpc_" + method
        handler = next((getattr(h, name) for h in self.handlers() if hasattr(h, name)), None)
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
                    credentials: PeerCredentials | None = None,
                    auth_timeout: float = math.inf, admission=None) -> None:
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
    reserve before they are read.

    Until it authenticates (``dispatcher.authenticated``) a connection may send frames of
    at most ``UNAUTHENTICATED_MAX_FRAME`` bytes (never the shared ``budget``'s) and is
    closed ``auth_timeout`` seconds after its start, whatever it calls meanwhile. Then
    ``admission`` (``fs.limits.Admission``, the server's count of unauthenticated
    connections) moves it into the count of authenticated ones, or names why it is full."""
    inline = dispatcher.inline_methods
    observe = dispatcher.call_observer
    clock = time.perf_counter
    slots = trio.Semaphore(max_concurrent_calls)
    running = [0, trio.current_time()]     # calls in flight, trio time the last one ended

    def reply(call_id, ok, value, hold: bool = False) -> None:
        # other calls of this connection still running (a journal batch wakes them in one
        # scheduler round): their replies and this one leave in one write by the flusher; a
        # lone call's reply (a mount's calls come one at a time) leaves at once. ``hold``:
        # a read answered in the reader, whose replies leave together at the end of the
        # batch of requests (``flush_nowait``)
        defer = running[0] > 1
        try:
            try:
                channel.send_nowait([call_id, ok, value, dispatcher.state_id()]
                                    if session.get("state_id") else [call_id, ok, value],
                                    defer=defer, hold=hold)
            except (TypeError, ValueError) as exc:  # result not msgpack-serialisable: a bug
                log.exception("cannot encode reply to call %r", call_id)
                channel.send_nowait(
                    [call_id, False, InternalError(f"cannot encode reply: {exc}").to_wire()],
                    defer=defer, hold=hold)
        except ServerUnavailable:
            pass  # the client went away; nothing to tell it

    def too_slow() -> None:
        log.warning("closing connection from %s: it has not read a reply for %g s",
                    peer, send_timeout)

    async def run_call(ctx: CallContext, method, args, holds_slot: bool):
        # a call without a slot is an inline read run by the reader: its reply is held for
        # the reader's one write per batch
        hold = not holds_slot
        running[0] += 1
        # the clock is read only while observed: the hook costs nothing when unset
        start = clock() if observe is not None else 0.0
        result_kind = "ok"
        try:
            try:
                result = await dispatcher.dispatch(ctx, method, args)
            except LeaseFSError as exc:
                result_kind = type(exc).__name__
                reply(ctx.call_id, False, exc.to_wire(), hold)
            except Exception as exc:  # a bug: log it, answer, keep serving
                result_kind = "InternalError"
                log.exception("RPC %s from %s failed", brief(method, 40), ctx.peer)
                reply(ctx.call_id, False, InternalError(
                    f"{brief(method, 40)}: internal error: {type(exc).__name__}: {exc}").to_wire(),
                    hold)
            else:
                if not trusted[0] and dispatcher.authenticated(session):
                    # before the reply: the peer's next frame may be a large one
                    refused = admit_authenticated()
                    if refused is not None:   # the connection's refusal says why
                        result_kind = "ServerBusy"
                        closed_for[0] = refused
                        reading_scope[0].cancel()
                        return
                reply(ctx.call_id, True, result, hold)
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
    trusted = [False]               # authenticated (and admitted as such)
    closed_for: list = [None]       # why the connection was ended from a call
    reading_scope = [trio.CancelScope()]
    opened = trio.current_time()

    def admit_authenticated() -> errors.ServerBusy | None:
        """The connection has authenticated: lift its limits, count it as authenticated;
        the refusal if the server holds as many as it may."""
        trusted[0] = True
        channel.max_frame = max_frame
        why = admission.authenticated() if admission is not None else None
        return None if why is None else errors.ServerBusy(f"connection refused: {why}")

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
                if method in inline and not dispatcher.inline_paused:   # never awaits
                    await run_call(ctx, method, args, False)
                    continue
                if observe is not None:
                    ctx.received = clock()
                try:
                    slots.acquire_nowait()
                except trio.WouldBlock:
                    channel.flush_nowait()   # the held replies go before the wait
                    await slots.acquire()
                if len(idle):
                    pending.append((ctx, method, args))
                    idle.unpark()
                else:
                    nursery.start_soon(worker, ctx, method, args)
            channel.flush_nowait()
            if channel.backlogged:     # a peer that does not read its replies: stop reading
                await channel.drained()

    def timed_out(now: float) -> tuple[float, str | None]:
        """(when to look again, why the connection is over or None)."""
        wake, why = timed_out_of_use(now)
        if trusted[0] or why is not None:
            return wake, why
        if now >= opened + auth_timeout:
            return now, f"it did not authenticate within {auth_timeout:g} s"
        return min(wake, opened + auth_timeout), None

    def timed_out_of_use(now: float) -> tuple[float, str | None]:
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
                    if dispatcher.authenticated(session):
                        refused = admit_authenticated()
                        if refused is not None:
                            raise refused
                    else:
                        channel.max_frame = min(max_frame, UNAUTHENTICATED_MAX_FRAME)
                    verdict: list[str] = []
                    with trio.CancelScope() as reading:
                        reading_scope[0] = reading
                        if frame_timeout < math.inf or idle_timeout < math.inf or \
                                (auth_timeout < math.inf and not trusted[0]):
                            nursery.start_soon(watch, reading, verdict)
                        await read_requests(nursery, client_id, sync_metadata)
                    if closed_for[0] is not None:
                        raise closed_for[0]
                    if verdict and verdict[0]:
                        raise ProtocolError(verdict[0])
                    if verdict:
                        log.debug("closing connection from %s: idle for %g s", peer,
                                  idle_timeout)
                except errors.ServerBusy as exc:   # authenticated, but that count is full
                    log.warning("closing connection from %s: %s", peer, exc)
                    reply(None, False, exc.to_wire())
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
                    refusal=None, tls=None, unauthenticated: ConnectionLimits | None = None):
    """Listen on ``host:port`` (0 = any free port), report the bound address through
    ``task_status.started((host, port))`` and run ``handler(stream, peer)`` per connection.

    With ``limits``, a connection beyond them is refused: ``refusal(reason)`` (the frame
    that tells the peer why, in the server's protocol) is sent best-effort, the connection
    is closed and the refusal logged (``RefusalLog``: once per peer, then counted).

    With ``tls`` (``fs.tls.ServerTls``) every connection must open with a TLS handshake,
    done before ``handler`` gets the ``trio.SSLStream``; a peer without TLS gets
    ``refusal(reason, TlsError)`` in plaintext, one whose handshake fails or stalls a
    logged refusal (``fs.tls.accept``). A refusal for the limits then goes over TLS.

    With ``unauthenticated`` (a server whose peers authenticate), a new connection counts
    there, not in ``limits``, until it authenticates: ``handler`` gets an ``admission``
    (``fs.limits.Admission``) to move it."""
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
        tcpliveness.watch(stream)
        try:
            address = stream.socket.getpeername()[:2]
            peer, peer_host = format_address(address), address[0]
        except OSError:
            peer = peer_host = "?"
        admission = None
        if unauthenticated is not None:
            admission = Admission(peer_host, limits, unauthenticated)
            why = admission.admit()
        else:
            why = limits.admit(peer_host) if limits is not None else None
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
            if admission is not None:
                await handler(stream, peer, admission=admission)
            else:
                await handler(stream, peer)
        except Exception:
            log.exception("%s: connection handler from %s failed", name, peer)
        finally:
            if admission is not None:
                admission.release()
            elif limits is not None:
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
        held = localserver.holder(name) if exc.errno == errno.EADDRINUSE else None
        raise ServerUnavailable(
            f"{server}: cannot listen on local socket {name}: {exc.strerror or exc}"
            + (f" (held by {held}: another process took its name; stop it, or set "
               f"meta_socket to a path in a folder only this server's user may write)"
               if held else "")) from None
    log.info("%s listening on local socket %s", server, name)
    refusals = RefusalLog(log)

    async def per_connection(stream):
        try:
            credentials = PeerCredentials.of(stream.socket)
        except OSError:
            await stream.aclose()
            return
        peer = f"{LOCAL_PEER_PREFIX}{user_name(credentials.uid)}:{credentials.pid}"
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
#: how the peer of a local-socket connection is named (``local:USER:PID``)
LOCAL_PEER_PREFIX = "local:"


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


#: the largest frame a connection may send before it authenticates: the authentication
#: calls are a few hundred bytes, and frames this small never reserve the server's shared
#: request buffer (``fs.framing.UNBUDGETED_FRAME``)
UNAUTHENTICATED_MAX_FRAME = UNBUDGETED_FRAME
