"""A Hadoop IPC server (protocol version 9, protobuf calls): one connection at a time
served to a list of *translators*, objects that answer one Hadoop protocol each::

    class SomeTranslator:
        PROTOCOL = "org.apache.hadoop.hdfs.protocol.ClientProtocol"
        CALLS: dict[str, tuple[type, type]]   # method name -> (request class, response class)
        async def <methodName>(self, ctx: CallContext, request) -> response message

A translator raises leasefs's errors (``fs.errors``); the client is told the Java class of
``fs.hdfs.exceptions``. Several translators may serve one protocol (their ``CALLS`` must
not overlap).

A connection: the preamble (bad magic: closed without a word; another version: a FATAL
VERSION_MISMATCH answer, then closed; SASL: its NEGOTIATE is answered SUCCESS, which turns
the client to simple authentication, only where ``identity.simple_refusal`` allows it,
else FATAL UNAUTHORIZED), the connection context (callId -3: who the client says it is,
``identity.open_session`` decides who it is; the session also holds the client's
``peer_address``), then calls. Each call runs as its own task
and its answer is written when it is ready (under a lock), so answers leave out of order;
at most ``max_calls`` run at once per connection (the reader waits for one to end), and
a frame's bytes count in the server's ``budget`` from before they are read until its call
is answered (a reader waits for room), so memory stays bounded. A ping
(-4) is read and ignored. A request that does not parse is answered with an error and the
connection serves on; a call header that does not parse ends the connection (FATAL), as
does a frame longer than ``max_frame``, a frame unfinished ``frame_timeout`` seconds after
its first bytes, or nothing to do for ``idle_timeout`` seconds (quietly: Hadoop's client
reconnects at its next call).

Concurrency contract: one trio task group per connection, on the server's trio thread;
the translators' methods run there too and must not block.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import trio
from google.protobuf.message import EncodeError

from ..errors import AuthenticationFailed, LeaseFSError, ProtocolError
from ..frames import brief
from ..framing import plain_socket
from ..rpcbase import CallContext, is_loopback_host
from . import exceptions
from .sasl import FAILED_CALL_ID, Authenticated, SaslNegotiation, SaslRefused
from .ipc import (AUTH_NONE, AUTH_SASL, CONTEXT_CALL_ID, DEFAULT_MAX_FRAME, MAGIC,
                  PING_CALL_ID, PREAMBLE_LENGTH, SASL_CALL_ID, VERSION, FrameReader, Preamble,
                  frame, next_delimited, parse)
from .pb import ipc_pb2 as ipc

log = logging.getLogger(__name__)

_HEADER = ipc.RpcResponseHeaderProto
_SUCCESS, _ERROR, _FATAL = _HEADER.SUCCESS, _HEADER.ERROR, _HEADER.FATAL


@dataclass(frozen=True)
class Claim:
    """What a connection's context says about its client, and where it comes from."""

    user: str                     # effectiveUser ("" when the context names none)
    real_user: str | None         # realUser: the user acting for ``user`` (a proxy user)
    protocol: str
    peer: str                     # "host:port" of the client
    peer_address: tuple           # (host, port) of the client
    local_address: tuple          # (host, port) of this end
    # who SASL proved the connection to be (a delegation token's owner); None: not proven
    authenticated: Authenticated | None = None


class Identity:
    """Who a connection is (the server's policy; this base believes the client, as HDFS's
    simple authentication does)."""

    def simple_refusal(self, peer_address: tuple) -> str | None:
        """Why a client at ``peer_address`` may not use simple authentication (None: it
        may); asked when the client opens with SASL."""
        return None

    def token_negotiation(self, peer_address: tuple) -> SaslNegotiation | None:
        """The SASL negotiation (TOKEN, DIGEST-MD5) that may prove who a client is that
        may not use simple authentication; None: it has no way in."""
        return None

    def open_session(self, session: dict, claim: Claim) -> None:
        """Fill ``session["user"]`` and ``["groups"]`` for the connection of ``claim``;
        ``AuthenticationFailed`` (its message for the client) refuses it."""
        session["user"], session["groups"] = claim.user or "nobody", ()


def on_this_host(session: dict | None) -> bool:
    """Whether a connection's client is on the server's own host (a loopback peer)."""
    address = (session or {}).get("peer_address")
    return address is not None and is_loopback_host(str(address[0]))


class _Fatal(Exception):
    """End the connection after a FATAL answer ``(call id, code, class, message)``."""

    def __init__(self, call_id: int, code: int, class_name: str, message: str):
        super().__init__(message)
        self.call_id, self.code, self.class_name, self.message = \
            call_id, code, class_name, message


class IpcServer:
    """Serves connections (``serve``, a ``serve_tcp`` handler) to its translators."""

    def __init__(self, translators, identity: Identity | None = None, *,
                 name: str = "Hadoop IPC server", max_frame: int = DEFAULT_MAX_FRAME,
                 max_calls: int = 256, context_timeout: float = 10.0,
                 frame_timeout: float = 30.0, idle_timeout: float = math.inf,
                 send_timeout: float = 60.0, budget=None, call_observer=None, state_id=None):
        self.identity = identity or Identity()
        # ``state_id()``: the server's newest state (journal txid), sent in every call's
        # answer header so that an observer-reading client's next reads wait for it
        self.state_id = state_id
        self.name = name
        self.max_frame = max_frame
        self.max_calls = max_calls
        self.context_timeout = context_timeout
        self.frame_timeout = frame_timeout
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        # ``fs.limits.ByteBudget``: the request bytes the server holds at once (shared with
        # its other ports); a frame waits for its share before it is read, and holds it
        # until its call is answered
        self.budget = budget
        # metrics hook, as ``fs.rpcserver.Dispatcher.call_observer``: ``observe(method,
        # outcome, queued, seconds)`` once per call a translator ran, the method named
        # ``hdfs.<methodName>`` (outcome "ok" or the leasefs error's class name)
        self.call_observer = call_observer
        # protocol -> method -> (bound method, request class, response class)
        self.calls: dict[str, dict[str, tuple]] = {}
        for translator in translators:
            served = self.calls.setdefault(translator.PROTOCOL, {})
            for method, (request_cls, response_cls) in translator.CALLS.items():
                if method in served:
                    raise ValueError(f"{translator.PROTOCOL}.{method} is served twice")
                served[method] = (getattr(translator, method), request_cls, response_cls)

    async def serve(self, stream, peer: str, **_ignored) -> None:
        """Serve one connection until it ends; never raises for the peer's doing."""
        try:
            peer_address = tuple(stream.socket.getpeername()[:2])
            local_address = tuple(stream.socket.getsockname()[:2])
        except (AttributeError, OSError):
            peer_address = local_address = ("?", 0)
        connection = _Connection(self, stream, peer, peer_address, local_address)
        try:
            await connection.run()
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


class _Connection:
    def __init__(self, server: IpcServer, stream, peer: str, peer_address: tuple,
                 local_address: tuple):
        self.server = server
        self.stream = stream
        self.peer = peer
        self.peer_address = peer_address
        self.local_address = local_address
        self.reader = FrameReader(stream, server.max_frame)
        self.send_lock = trio.Lock()
        # the plain socket under the stream (None behind TLS): answers are written to it
        self.socket = plain_socket(stream)
        # ``local_address``: where the client reached this server (a translator that names
        # this server in an answer, as a block location, names this address)
        self.session: dict = {"local_address": local_address}
        self.slots = trio.Semaphore(server.max_calls)
        self.running = 0
        self.last_done = trio.current_time()
        self.broken = False
        self.authenticated: Authenticated | None = None   # what SASL proved, if it ran
        self.watching = trio.CancelScope()   # the watcher's: ends with the reading

    # ------------------------------------------------------------------ writing
    async def send(self, data: bytes) -> None:
        """One answer, whole, after the answers before it. When nothing else is being sent
        it goes out in one non-blocking write without a trip through trio's scheduler (the
        lock, the cancel scope and the socket's checkpoints cost a call more CPU than its
        translation); what the socket does not take then is sent as any answer is."""
        sock = self.socket
        if sock is not None and not self.broken:
            try:
                self.send_lock.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    try:
                        sent = os.write(sock.fileno(), data)
                    except BlockingIOError:
                        sent = 0
                    except OSError:
                        self.broken = True
                        return
                    if sent < len(data):
                        await self._send_locked(memoryview(data)[sent:])
                finally:
                    self.send_lock.release()
                return
        async with self.send_lock:
            await self._send_locked(data)

    async def _send_locked(self, data) -> None:
        """``data`` on the stream, the send lock held."""
        if self.broken:
            return
        with trio.move_on_after(self.server.send_timeout) as scope:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.broken = True
                return
        if scope.cancelled_caught:
            log.warning("%s: closing the connection from %s: it has not read an answer "
                        "for %g s", self.server.name, self.peer, self.server.send_timeout)
            self.broken = True
            await self.stream.aclose()

    def header(self, call_id: int, status: int, client_id: bytes = b"",
               retry_count: int = -1, **error) -> ipc.RpcResponseHeaderProto:
        out = _HEADER(callId=call_id & 0xFFFFFFFF, status=status, serverIpcVersionNum=VERSION,
                      retryCount=retry_count, **error)
        if self.server.state_id is not None and status != _FATAL:
            out.stateId = self.server.state_id()
        if client_id:
            out.clientId = client_id
        return out

    async def fatal(self, exc: _Fatal, client_id: bytes = b"") -> None:
        log.warning("%s: closing the connection from %s: %s", self.server.name, self.peer,
                    exc.message)
        await self.send(frame(self.header(exc.call_id, _FATAL, client_id,
                                          exceptionClassName=exc.class_name,
                                          errorMsg=exc.message, errorDetail=exc.code)))

    # ------------------------------------------------------------------ the connection
    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                verdict: list[str] = []
                with trio.CancelScope() as reading:
                    nursery.start_soon(self.watch, reading, verdict)
                    try:
                        if await self.handshake():
                            await self.read_calls(nursery)
                    except _Fatal as exc:
                        await self.fatal(exc)
                    except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    except ProtocolError as exc:   # a frame's length
                        await self.fatal(_Fatal(-1, _HEADER.FATAL_INVALID_RPC_HEADER,
                                                exceptions.SERVER_EXCEPTION, str(exc)))
                    finally:
                        self.watching.cancel()
                if verdict and verdict[0]:
                    log.warning("%s: closing the connection from %s: %s", self.server.name,
                                self.peer, verdict[0])
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def watch(self, reading: trio.CancelScope, verdict: list) -> None:
        """Ends the reading when a frame stalls (``frame_timeout``) or the connection is
        idle (``idle_timeout``)."""
        server = self.server
        with self.watching:
            while True:
                now = trio.current_time()
                since = self.reader.partial_since
                if self.reader.awaiting_budget:   # the server is not reading: no fault
                    wake = now + min(server.idle_timeout, server.frame_timeout)
                elif since is not None:
                    wake = since + server.frame_timeout
                    if now >= wake:
                        verdict.append(f"a frame is still incomplete {server.frame_timeout:g} "
                                       f"s after its first bytes")
                        reading.cancel()
                        return
                elif self.running:
                    wake = now + min(server.idle_timeout, server.frame_timeout)
                else:
                    wake = max(self.reader.last_received, self.last_done) + server.idle_timeout
                    if now >= wake:
                        verdict.append("")
                        reading.cancel()
                        return
                await trio.sleep_until(min(wake, now + server.frame_timeout))

    async def handshake(self) -> bool:
        """Preamble, SASL (if asked) and the connection context; False: closed quietly."""
        server = self.server
        with trio.move_on_after(server.context_timeout) as scope:
            raw = await self.reader.exactly(PREAMBLE_LENGTH)
            self.reader.frame_done()
            preamble = Preamble.parse(raw)
            if preamble.magic != MAGIC:
                log.warning("%s: closing the connection from %s: not Hadoop IPC (it began "
                            "with %r)", server.name, self.peer, raw)
                return False
            if preamble.version != VERSION:
                raise _Fatal(-1, _HEADER.FATAL_VERSION_MISMATCH, exceptions.VERSION_MISMATCH,
                             f"Server IPC version {VERSION} cannot communicate with client "
                             f"version {preamble.version}")
            if preamble.auth == AUTH_SASL:
                await self.sasl()
            elif preamble.auth != AUTH_NONE:
                raise _Fatal(-1, _HEADER.FATAL_UNAUTHORIZED, exceptions.ACCESS_CONTROL,
                             f"unknown authentication protocol {preamble.auth:#x} (this "
                             f"server takes 0 simple and 0xdf SASL)")
            header, payload, pos = await self.read_header()
            if header.callId != CONTEXT_CALL_ID:
                raise _Fatal(header.callId, _HEADER.FATAL_INVALID_RPC_HEADER,
                             exceptions.SERVER_EXCEPTION,
                             f"the first frame must be the connection context (call id "
                             f"{CONTEXT_CALL_ID}), got call id {header.callId}")
            try:
                raw, _ = next_delimited(payload, pos)
                context = parse(ipc.IpcConnectionContextProto, raw, "connection context")
            except ProtocolError as exc:
                raise _Fatal(CONTEXT_CALL_ID, _HEADER.FATAL_DESERIALIZING_REQUEST,
                             exceptions.SERVER_EXCEPTION, str(exc)) from None
            info = context.userInfo
            claim = Claim(user=info.effectiveUser,
                          real_user=info.realUser if info.HasField("realUser") else None,
                          protocol=context.protocol, peer=self.peer,
                          peer_address=self.peer_address, local_address=self.local_address,
                          authenticated=self.authenticated)
            self.session["peer_address"] = self.peer_address
            try:
                server.identity.open_session(self.session, claim)
            except AuthenticationFailed as exc:
                raise _Fatal(CONTEXT_CALL_ID, _HEADER.FATAL_UNAUTHORIZED,
                             exceptions.ACCESS_CONTROL, exc.message) from None
            return True
        if scope.cancelled_caught:
            log.warning("%s: closing the connection from %s: no connection context within "
                        "%g s", server.name, self.peer, server.context_timeout)
        return False

    async def sasl(self) -> None:
        """The client opened with SASL: its NEGOTIATE is answered SUCCESS (go on with
        simple authentication) where simple is allowed; elsewhere the identity's token
        negotiation runs (NEGOTIATE, INITIATE, maybe CHALLENGE/RESPONSE, SUCCESS) and
        proves who the connection is, or ends it with a FATAL refusal."""
        message = await self.read_sasl()
        if message.state != ipc.RpcSaslProto.NEGOTIATE:
            raise _Fatal(SASL_CALL_ID, _HEADER.FATAL_UNAUTHORIZED, exceptions.ACCESS_CONTROL,
                         f"SASL: expected NEGOTIATE, got state {message.state}")
        identity = self.server.identity
        why = identity.simple_refusal(self.peer_address)
        if why is None:
            await self.send(frame(self.header(SASL_CALL_ID, _SUCCESS),
                                  ipc.RpcSaslProto(state=ipc.RpcSaslProto.SUCCESS)))
            return
        negotiation = identity.token_negotiation(self.peer_address)
        if negotiation is None:
            raise _Fatal(SASL_CALL_ID, _HEADER.FATAL_UNAUTHORIZED, exceptions.ACCESS_CONTROL,
                         why)
        while True:
            try:
                answer = negotiation.step(message)
            except SaslRefused as exc:
                log.warning("%s: SASL from %s refused: %s", self.server.name, self.peer, exc)
                raise _Fatal(FAILED_CALL_ID, _HEADER.FATAL_UNAUTHORIZED, exc.java_class,
                             str(exc)) from None
            await self.send(frame(self.header(SASL_CALL_ID, _SUCCESS), answer))
            if negotiation.done:
                self.authenticated = negotiation.authenticated
                return
            message = await self.read_sasl()

    async def read_sasl(self) -> ipc.RpcSaslProto:
        header, payload, pos = await self.read_header()
        try:
            if header.callId != SASL_CALL_ID:
                raise ProtocolError(f"expected a SASL message (call id {SASL_CALL_ID}), got "
                                    f"call id {header.callId}")
            raw, _ = next_delimited(payload, pos)
            return parse(ipc.RpcSaslProto, raw, "SASL message")
        except ProtocolError as exc:
            raise _Fatal(SASL_CALL_ID, _HEADER.FATAL_UNAUTHORIZED, exceptions.ACCESS_CONTROL,
                         str(exc)) from None

    async def read_header(self, keep: bool = False
                          ) -> tuple[ipc.RpcRequestHeaderProto, bytes, int]:
        """The next frame's call header, the frame and where the rest starts; FATAL for a
        header that does not parse. ``keep``: the frame's share of the budget stays
        reserved (the caller releases it, ``release``)."""
        payload = await self.reader.frame(self.server.budget)
        try:
            raw, pos = next_delimited(payload, 0)
            header = parse(ipc.RpcRequestHeaderProto, raw, "call header")
        except ProtocolError as exc:
            self.release(len(payload))
            raise _Fatal(-1, _HEADER.FATAL_INVALID_RPC_HEADER, exceptions.SERVER_EXCEPTION,
                         str(exc)) from None
        if not keep or header.callId < 0:
            self.release(len(payload))
        return header, payload, pos

    def release(self, length: int) -> None:
        if self.server.budget is not None:
            self.server.budget.release(length)

    async def read_calls(self, nursery) -> None:
        while True:
            header, payload, pos = await self.read_header(keep=True)
            call_id = header.callId
            if call_id == PING_CALL_ID:
                continue
            if call_id < 0:
                raise _Fatal(call_id, _HEADER.FATAL_INVALID_RPC_HEADER,
                             exceptions.SERVER_EXCEPTION,
                             f"call id {call_id} is no call (the connection context and "
                             f"SASL come first, once)")
            try:
                self.slots.acquire_nowait()   # a free slot costs no scheduler round
            except trio.WouldBlock:
                try:
                    await self.slots.acquire()
                except BaseException:
                    self.release(len(payload))
                    raise
            self.running += 1
            nursery.start_soon(self.run_call, header, payload, pos)

    async def run_call(self, header: ipc.RpcRequestHeaderProto, payload: bytes,
                       pos: int) -> None:
        try:
            answer = await self.answer(header, payload, pos, _Answer(self, header))
        finally:
            self.release(len(payload))
            self.running -= 1
            self.last_done = trio.current_time()
            self.slots.release()
        await self.send(answer)

    async def answer(self, header, payload, pos, reply: "_Answer") -> bytes:
        """The frame answering one call."""
        try:
            raw, pos = next_delimited(payload, pos)
            method_header = parse(ipc.RequestHeaderProto, raw, "method header")
        except ProtocolError as exc:
            return reply.error(_HEADER.ERROR_RPC_SERVER, exceptions.SERVER_EXCEPTION, str(exc))
        method = method_header.methodName
        protocol = method_header.declaringClassProtocolName
        served = self.server.calls.get(protocol)
        if served is None:
            return reply.error(_HEADER.ERROR_NO_SUCH_PROTOCOL, exceptions.NO_SUCH_PROTOCOL,
                               f"unknown protocol: {brief(protocol, 200)}")
        entry = served.get(method)
        if entry is None:
            return reply.error(_HEADER.ERROR_NO_SUCH_METHOD, exceptions.NO_SUCH_METHOD,
                               f"Unknown method {brief(method, 200)} called on {protocol} "
                               f"protocol.")
        handler, request_cls, response_cls = entry
        try:
            raw, _ = next_delimited(payload, pos) if pos < len(payload) else (b"", pos)
            request = parse(request_cls, raw, f"{method} request")
        except ProtocolError as exc:
            return reply.error(_HEADER.ERROR_RPC_SERVER, exceptions.SERVER_EXCEPTION, str(exc))
        ctx = CallContext(client_id=header.clientId.hex(), peer=self.peer,
                          call_id=header.callId, user=self.session["user"],
                          groups=tuple(self.session.get("groups", ())), sync_metadata=True,
                          session=self.session,
                          state_id=header.stateId if header.HasField("stateId") else 0)
        observe = self.server.call_observer
        started = time.perf_counter() if observe is not None else 0.0
        try:
            response = await handler(ctx, request)
        except LeaseFSError as exc:
            if observe is not None:
                observe(f"hdfs.{method}", type(exc).__name__, 0.0,
                        time.perf_counter() - started)
            return reply.error(_HEADER.ERROR_APPLICATION, exceptions.java_class(exc),
                               exc.message or type(exc).__name__)
        except Exception as exc:   # a bug: log it, answer, serve on
            log.exception("%s: %s from %s failed", self.server.name, method, self.peer)
            return reply.error(_HEADER.ERROR_APPLICATION, exceptions.IO_EXCEPTION,
                               f"{method}: internal error: {type(exc).__name__}: {exc}")
        if observe is not None:
            observe(f"hdfs.{method}", "ok", 0.0, time.perf_counter() - started)
        if not isinstance(response, response_cls):
            log.error("%s: %s answered a %s, not a %s", self.server.name, method,
                      type(response).__name__, response_cls.__name__)
            return reply.error(_HEADER.ERROR_SERIALIZING_RESPONSE, exceptions.IO_EXCEPTION,
                               f"{method}: internal error: wrong answer type")
        try:
            return frame(reply.header(_SUCCESS), response)
        except EncodeError as exc:   # a required field left unset: a bug
            log.error("%s: %s answer cannot be encoded: %s", self.server.name, method, exc)
            return reply.error(_HEADER.ERROR_SERIALIZING_RESPONSE, exceptions.IO_EXCEPTION,
                               f"{method}: internal error: {exc}")


class _Answer:
    """The answer header of one call: its id, client id and retry count echoed."""

    def __init__(self, connection: _Connection, header: ipc.RpcRequestHeaderProto):
        self.connection = connection
        self.call_id = header.callId
        self.client_id = header.clientId
        self.retry_count = header.retryCount

    def header(self, status: int, **error) -> ipc.RpcResponseHeaderProto:
        return self.connection.header(self.call_id, status, self.client_id, self.retry_count,
                                      **error)

    def error(self, code: int, class_name: str, message: str) -> bytes:
        return frame(self.header(_ERROR, exceptionClassName=class_name, errorMsg=message,
                                 errorDetail=code))
