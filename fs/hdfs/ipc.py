"""Hadoop IPC's framing (protocol version 9), as both sides of leasefs's HDFS front ends
speak it, and a small IPC client (tests, tools).

A connection opens with a 7-byte preamble from the client: ``hrpc``, the IPC version (9),
the service class and the auth protocol (0 none = simple, 0xDF SASL). Then both sides send
frames: a big-endian int32 length and that many bytes, holding varint-delimited protobuf
messages. A client's frame is a call header (``RpcRequestHeaderProto``), then for a call
the method header (``RequestHeaderProto``) and the request; the connection context
(callId -3) follows its header with ``IpcConnectionContextProto``, a ping (-4) is the header
alone, SASL (-33) a ``RpcSaslProto``. A server's frame is an answer header
(``RpcResponseHeaderProto``) and, on success, the response. Answers are matched to calls
by callId: they may come in any order.

Every length is bounded before anything is allocated for it: a frame by the reader's
``max_frame``, a delimited message by what is left of its frame.

Concurrency contract: the codec functions are pure; ``FrameReader`` and ``IpcClient``
belong to one trio task group (the client's calls may come from many tasks of it).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import trio
from google.protobuf.message import DecodeError

from ..errors import FrameTooLarge, ProtocolError, ServerUnavailable
from .delimit import delimited
from .pb import ipc_pb2 as ipc

MAGIC = b"hrpc"
VERSION = 9
AUTH_NONE = 0x00
AUTH_SASL = 0xDF
PREAMBLE_LENGTH = 7
CONTEXT_CALL_ID = -3
PING_CALL_ID = -4
SASL_CALL_ID = -33
CLIENT_PROTOCOL = "org.apache.hadoop.hdfs.protocol.ClientProtocol"
CLIENT_DATANODE_PROTOCOL = "org.apache.hadoop.hdfs.protocol.ClientDatanodeProtocol"
LENGTH = struct.Struct(">i")
# Hadoop's own server refuses frames above ipc.maximum.data.length (64 MiB)
DEFAULT_MAX_FRAME = 64 << 20
_MAX_VARINT_BYTES = 10

Status = ipc.RpcResponseHeaderProto
ErrorCode = ipc.RpcResponseHeaderProto


@dataclass(frozen=True)
class Preamble:
    """The first 7 bytes of a connection."""

    magic: bytes
    version: int
    service_class: int
    auth: int

    @classmethod
    def parse(cls, raw: bytes) -> "Preamble":
        if len(raw) != PREAMBLE_LENGTH:
            raise ProtocolError(f"IPC preamble must be {PREAMBLE_LENGTH} bytes, got {len(raw)}")
        return cls(bytes(raw[:4]), raw[4], raw[5], raw[6])


def preamble(version: int = VERSION, service_class: int = 0, auth: int = AUTH_NONE) -> bytes:
    return MAGIC + bytes((version, service_class, auth))


def frame(*messages) -> bytes:
    """One frame: the int32 length, then the delimited messages."""
    body = delimited(*messages)
    return LENGTH.pack(len(body)) + body


def next_delimited(payload, pos: int) -> tuple[memoryview, int]:
    """The delimited message starting at ``pos`` of ``payload`` and the position after it;
    ``ProtocolError`` for a length that runs past the frame or a broken varint."""
    view = memoryview(payload)
    length = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos >= len(view):
            raise ProtocolError("IPC frame ends inside a message length")
        byte = view[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise ProtocolError("IPC message length is not a varint")
    if length > len(view) - pos:
        raise ProtocolError(f"IPC message of {length} bytes runs past its frame "
                            f"({len(view) - pos} bytes left)")
    return view[pos:pos + length], pos + length


def parse(cls, raw, what: str):
    """``raw`` parsed as the message class ``cls``; ``ProtocolError`` naming ``what``."""
    message = cls()
    try:
        message.ParseFromString(raw)
    except (DecodeError, ValueError) as exc:
        raise ProtocolError(f"{what} is not a valid {cls.DESCRIPTOR.name}: {exc}") from None
    if not message.IsInitialized():   # the parser leaves proto2's required fields unchecked
        missing = ", ".join(message.FindInitializationErrors())
        raise ProtocolError(f"{what} is not a valid {cls.DESCRIPTOR.name}: {missing} "
                            f"missing")
    return message


def too_large(length: int, max_frame: int) -> ProtocolError:
    if length < 0:
        return ProtocolError(f"IPC frame length {length} is negative")
    return FrameTooLarge(f"IPC frame of {length} bytes is larger than the maximum "
                         f"{max_frame}")


class FrameReader:
    """Reads exact byte counts and whole frames from a trio stream, a frame's length
    checked against ``max_frame`` before its bytes are read. Bytes of an
    unfinished frame are buffered since ``partial_since`` (the server's slow-peer timeout
    watches it)."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.max_frame = max_frame
        self._buffer = bytearray()
        # trio time the unfinished frame's first bytes came (None: between frames), and
        # the last bytes came
        self.partial_since: float | None = None
        self.last_received = trio.current_time()
        self.awaiting_budget = False

    async def exactly(self, count: int) -> bytes:
        """``count`` bytes; EOFError if the stream ends first (mid-way or not)."""
        while len(self._buffer) < count:
            chunk = await self.stream.receive_some(max(65536, count - len(self._buffer)))
            if not chunk:
                raise EOFError("connection closed" + (" inside a frame" if self._buffer else ""))
            self._buffer += chunk
            self.last_received = trio.current_time()
            if self.partial_since is None:
                self.partial_since = self.last_received
        out = bytes(self._buffer[:count])
        del self._buffer[:count]
        return out

    def frame_done(self) -> None:
        """The frame (or preamble) read is whole: what is buffered starts the next one."""
        self.partial_since = self.last_received if self._buffer else None

    async def frame(self, budget=None) -> bytes:
        """The next frame's bytes; with ``budget`` (``fs.limits.ByteBudget``) its length is
        reserved there before they are read, and the caller releases it."""
        (length,) = LENGTH.unpack(await self.exactly(4))
        if not 0 <= length <= self.max_frame:
            raise too_large(length, self.max_frame)
        if budget is not None:
            self.awaiting_budget = True
            try:
                await budget.acquire(length)
            finally:
                self.awaiting_budget = False
            if self.partial_since is not None:   # the wait was the server's, not the peer's
                self.partial_since = trio.current_time()
        try:
            payload = await self.exactly(length)
        except BaseException:
            if budget is not None:
                budget.release(length)
            raise
        self.frame_done()
        return payload


class RemoteError(Exception):
    """An error answer: the Java exception class the server named, its message, and the
    error code (``RpcErrorCodeProto``); ``fatal``: the server closes the connection."""

    def __init__(self, class_name: str, message: str, detail: int, fatal: bool = False):
        super().__init__(f"{class_name}: {message}")
        self.class_name, self.message, self.detail, self.fatal = \
            class_name, message, detail, fatal


class IpcClient:
    """A Hadoop IPC client over one connection: ``open`` sends the preamble and the
    connection context; ``call`` sends one call and waits for its answer, any number at
    once from different tasks (answers come in any order)."""

    def __init__(self, stream: trio.abc.Stream, *, protocol: str = CLIENT_PROTOCOL,
                 client_id: bytes | None = None, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.protocol = protocol
        self.client_id = client_id or os.urandom(16)
        self.reader = FrameReader(stream, max_frame)
        self._next_id = 0
        self._waiting: dict[int, trio.MemorySendChannel] = {}
        self._send_lock = trio.Lock()
        self.closed: BaseException | None = None

    @classmethod
    async def connect(cls, host: str, port: int, nursery, *, user: str = "nobody",
                      real_user: str | None = None, sasl: bool = False,
                      **kwargs) -> "IpcClient":
        stream = await trio.open_tcp_stream(host, port)
        client = cls(stream, **kwargs)
        try:
            await client.open(nursery, user, real_user, sasl=sasl)
        except BaseException:
            await stream.aclose()
            raise
        return client

    async def open(self, nursery, user: str, real_user: str | None = None, *,
                   sasl: bool = False) -> None:
        """Preamble and connection context; ``sasl``: open with SASL's NEGOTIATE and go on
        with simple authentication when the server answers SUCCESS (Hadoop's client does
        so when its user carries tokens), RemoteError when it refuses."""
        context = ipc.IpcConnectionContextProto(protocol=self.protocol)
        context.userInfo.effectiveUser = user
        if real_user is not None:
            context.userInfo.realUser = real_user
        if sasl:
            await self.stream.send_all(preamble(auth=AUTH_SASL) + frame(
                self.header(SASL_CALL_ID), ipc.RpcSaslProto(state=ipc.RpcSaslProto.NEGOTIATE)))
            payload = await self.reader.frame()
            raw, pos = next_delimited(payload, 0)
            header = parse(ipc.RpcResponseHeaderProto, raw, "SASL answer header")
            if header.status != ipc.RpcResponseHeaderProto.SUCCESS:
                raise RemoteError(header.exceptionClassName, header.errorMsg,
                                  header.errorDetail, True)
            answer = parse(ipc.RpcSaslProto, next_delimited(payload, pos)[0], "SASL answer")
            if answer.state != ipc.RpcSaslProto.SUCCESS:
                raise ProtocolError(f"SASL: the server wants state {answer.state}; this "
                                    f"client speaks simple authentication only")
            await self.stream.send_all(frame(self.header(CONTEXT_CALL_ID), context))
        else:
            await self.stream.send_all(preamble() + frame(self.header(CONTEXT_CALL_ID),
                                                          context))
        nursery.start_soon(self._read_answers)

    async def ping(self) -> None:
        """A ping (Hadoop's client sends one after a minute without an answer)."""
        await self.send(frame(self.header(PING_CALL_ID)))

    def header(self, call_id: int, retry_count: int = 0) -> ipc.RpcRequestHeaderProto:
        return ipc.RpcRequestHeaderProto(
            rpcKind=ipc.RPC_PROTOCOL_BUFFER,
            rpcOp=ipc.RpcRequestHeaderProto.RPC_FINAL_PACKET, callId=call_id,
            clientId=self.client_id, retryCount=retry_count)

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    def call_frame(self, method: str, request, *, call_id: int | None = None,
                   retry_count: int = 0) -> tuple[int, bytes]:
        """``(call id, frame)`` of the call ``method(request)``; the id is the next one
        unless given."""
        if call_id is None:
            call_id, self._next_id = self._next_id, self._next_id + 1
        method_header = ipc.RequestHeaderProto(methodName=method,
                                               declaringClassProtocolName=self.protocol,
                                               clientProtocolVersion=1)
        return call_id, frame(self.header(call_id, retry_count), method_header, request)

    async def call(self, method: str, request, response_cls, *, call_id: int | None = None,
                   retry_count: int = 0):
        """The response to ``method(request)``; RemoteError for an error answer,
        ServerUnavailable when the connection ends first."""
        call_id, data = self.call_frame(method, request, call_id=call_id,
                                        retry_count=retry_count)
        return self.response(method, await self.call_raw(call_id, data), response_cls)

    @staticmethod
    def response(method: str, answer, response_cls):
        """The response message of an answer ``(header, body)``; RemoteError for an error."""
        header, body = answer
        if header.status != ipc.RpcResponseHeaderProto.SUCCESS:
            raise RemoteError(header.exceptionClassName, header.errorMsg, header.errorDetail,
                              header.status == ipc.RpcResponseHeaderProto.FATAL)
        return parse(response_cls, body, f"answer to {method}")

    async def call_raw(self, call_id: int, data: bytes):
        """Send ``data`` (a whole frame) and wait for the answer to ``call_id``:
        ``(RpcResponseHeaderProto, body bytes)``."""
        answer = self.expect(call_id)
        try:
            await self.send(data)
        except BaseException:
            self._waiting.pop(call_id, None)
            raise
        return await self.answer(call_id, answer)

    def expect(self, call_id: int) -> trio.MemoryReceiveChannel:
        """Where the answer to ``call_id`` will come (``answer`` waits for it): registered
        before its frame is sent, so several frames may go in one write."""
        if self.closed is not None:
            raise ServerUnavailable(f"IPC connection closed: {self.closed}")
        send, receive = trio.open_memory_channel(1)
        self._waiting[call_id] = send
        return receive

    async def answer(self, call_id: int, receive: trio.MemoryReceiveChannel):
        try:
            return await receive.receive()
        except trio.EndOfChannel:
            raise ServerUnavailable(f"IPC connection closed before the answer to call "
                                    f"{call_id}: {self.closed}") from None
        finally:
            self._waiting.pop(call_id, None)

    async def _read_answers(self) -> None:
        try:
            while True:
                payload = await self.reader.frame()
                raw, pos = next_delimited(payload, 0)
                header = parse(ipc.RpcResponseHeaderProto, raw, "answer header")
                body = bytes(next_delimited(payload, pos)[0]) if pos < len(payload) else b""
                call_id = header.callId - (1 << 32) if header.callId >= 1 << 31 \
                    else header.callId
                waiter = self._waiting.get(call_id)
                if header.status == ipc.RpcResponseHeaderProto.FATAL:
                    # a fatal answer may name no call of ours: every waiter gets it
                    for other in list(self._waiting.values()):
                        try:
                            other.send_nowait((header, body))
                        except trio.WouldBlock:   # it has its answer already
                            pass
                    self.closed = RemoteError(header.exceptionClassName, header.errorMsg,
                                              header.errorDetail, True)
                    return
                if waiter is not None:
                    waiter.send_nowait((header, body))
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError,
                ProtocolError) as exc:
            self.closed = exc
        finally:
            if self.closed is None:
                self.closed = EOFError("connection closed")
            for waiter in list(self._waiting.values()):
                waiter.close()

    async def aclose(self) -> None:
        await self.stream.aclose()
