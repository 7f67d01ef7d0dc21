"""etcd's native gRPC API for the call on the hot path: the ``KV.Txn`` of an append.

Why it exists: the active metadata server sends one etcd txn per journal batch and waits
for it before it answers the batch's clients, so the append's latency is on every
mutation's path and its CPU is paid once per batch by etcd. Through the JSON gateway
(``meta/ha/etcdhttp.py``) etcd decodes the JSON, calls itself over a second, loopback gRPC
connection and encodes the answer back. Measured on 3 members on loopback with 3 KB
entries, the native call cut the append from 1.13 to 0.82 ms (p50) and etcd's CPU per
append by a third (1350 to 910 µs over the members), for about 50 µs more CPU in the
caller. grpcio was tried for the same and cost the caller far more than it saved; ``h2``
(a complete HTTP/2 state machine) cost 210 µs per call. Everything else (election, reads,
the watch, leases) stays on the gateway: it is not per batch.

What it is: a client for unary gRPC calls over cleartext HTTP/2 with prior knowledge
(RFC 9113; etcd serves gRPC and the gateway on the same client port), one call at a time
per connection, idle connections kept per endpoint (``etcdhttp.Pool``, as for the gateway).
Only what a unary call needs:

* we send the connection preface and SETTINGS (no push, header table 0, the largest
  stream window) and a connection WINDOW_UPDATE to the largest window, so etcd never
  waits for us; a connection that has taken in half of it is retired;
* a request is one HEADERS frame (a fixed header block of literals, so no encoder state)
  and the message in DATA frames within etcd's windows and frame size, waiting for its
  WINDOW_UPDATEs when a large message needs them;
* the answer: HEADERS (+ CONTINUATION) decoded with ``hpack`` (python-hyper's, the
  decoder every Python HTTP/2 stack uses), DATA, trailers with ``grpc-status``;
  SETTINGS and PING are acknowledged, WINDOW_UPDATE counted, GOAWAY and RST_STREAM end
  the call.

Protobuf: the few messages of ``etcdserverpb`` the append uses are written and read by
hand (``txn_request``, ``txn_result``); the result has the JSON gateway's shape (values
base64, numbers as strings), so ``halog.decide`` reads both alike.

Failures raise ``etcdhttp.GatewayError`` with ``sent``: False only when etcd surely never
saw the request (no connection; a GOAWAY that names an older stream), so the log's retry
rules are those of the gateway. A non-zero ``grpc-status`` is an answer, not a failure:
``call`` returns it.

Concurrency contract: one ``Channel`` per trio task tree; ``call`` may run from several
tasks at once (each takes its own connection).
"""

from __future__ import annotations

import base64
import struct
from typing import AsyncIterator

import hpack
import trio

from .etcdhttp import GatewayError, Pool, open_stream

TXN = "/etcdserverpb.KV/Txn"
MAX_MESSAGE = 64 << 20
MAX_HEADER_BLOCK = 64 << 10
#: DATA bytes a stream takes in before it gives etcd that much window back
REPLENISH = 16 << 20
WATCH = "/etcdserverpb.Watch/Watch"

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE = 0x1, 0x2, 0x4, 0x5
MAX_WINDOW = 2 ** 31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_STREAM_ID = 2 ** 31 - 1


# ---- protobuf, the few fields used -------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1          # int64: negative numbers are 10-byte two's complement
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def compare_create(key: bytes, revision: int) -> bytes:
    """Compare: ``create_revision(key) == revision`` (target CREATE, result EQUAL; the
    oneof is written even for 0, which is what "the key does not exist" compares)."""
    return _int_field(1, 0) + _int_field(2, 1) + _bytes_field(3, key) + _int_field(5, revision)


def op_put(key: bytes, value: bytes) -> bytes:
    """RequestOp holding PutRequest{key, value}."""
    return _bytes_field(2, _bytes_field(1, key) + _bytes_field(2, value))


def op_range(key: bytes) -> bytes:
    """RequestOp holding RangeRequest{key}: the one key."""
    return _bytes_field(1, _bytes_field(1, key))


def txn_request(compare: list[bytes], success: list[bytes], failure: list[bytes]) -> bytes:
    return (b"".join(_bytes_field(1, c) for c in compare)
            + b"".join(_bytes_field(2, op) for op in success)
            + b"".join(_bytes_field(3, op) for op in failure))


def watch_request(key: bytes, range_end: bytes, start_revision: int) -> bytes:
    """WatchRequest{create_request: keys [key, range_end) from ``start_revision``, puts
    only (filter NODELETE)}."""
    create = (_bytes_field(1, key) + _bytes_field(2, range_end)
              + _int_field(3, start_revision) + _int_field(5, 1))
    return _bytes_field(1, create)


def watch_result(buf: bytes) -> dict:
    """A WatchResponse: created, canceled, compact_revision, cancel_reason, and events
    as ``{"type": "PUT" | "DELETE", "kv": {"key": bytes, "value": bytes,
    "create_revision": int, "mod_revision": int}}`` (raw: a follower takes every entry
    through here). ``ValueError`` on a malformed message."""
    result: dict = {"events": []}
    for n, v in _fields(buf):
        if n == 3 and isinstance(v, int):
            result["created"] = bool(v)
        elif n == 4 and isinstance(v, int):
            result["canceled"] = bool(v)
        elif n == 5 and isinstance(v, int):
            result["compact_revision"] = _signed(v)
        elif n == 6 and isinstance(v, bytes):
            result["cancel_reason"] = v.decode(errors="replace")
        elif n == 11 and isinstance(v, bytes):
            event: dict = {"type": "PUT"}
            for m, w in _fields(v):
                if m == 1 and isinstance(w, int):
                    event["type"] = "DELETE" if w == 1 else "PUT"
                elif m == 2 and isinstance(w, bytes):
                    event["kv"] = _raw_kv(w)
            result["events"].append(event)
    return result


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one message: varints as int, length-delimited as bytes;
    fixed-width fields skipped. ``ValueError`` on a malformed message."""
    out: list[tuple[int, int | bytes]] = []
    i, end = 0, len(buf)

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            if i >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = buf[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    while i < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, varint()))
        elif wire == 2:
            length = varint()
            if i + length > end:
                raise ValueError("truncated field")
            out.append((number, buf[i:i + length]))
            i += length
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    if i != end:
        raise ValueError("truncated field")
    return out


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def _header(buf: bytes) -> dict:
    return {"revision": str(_signed(v)) for n, v in _fields(buf) if n == 3 and isinstance(v, int)}


_KV_BYTES = {1: "key", 5: "value"}
_KV_INTS = {2: "create_revision", 3: "mod_revision", 4: "version", 6: "lease"}


def _raw_kv(buf: bytes) -> dict:
    """An mvccpb.KeyValue: key and value as bytes, revisions, version and lease as ints
    (every field present, empty or 0 when the message left it out)."""
    kv: dict = {name: b"" for name in _KV_BYTES.values()}
    kv.update((name, 0) for name in _KV_INTS.values())
    for n, v in _fields(buf):
        if n in _KV_BYTES and isinstance(v, bytes):
            kv[_KV_BYTES[n]] = v
        elif n in _KV_INTS and isinstance(v, int):
            kv[_KV_INTS[n]] = _signed(v)
    return kv


def _kv(buf: bytes) -> dict:
    """A KeyValue in the gateway's JSON shape: bytes base64, numbers as strings, empty and
    zero fields left out (as proto3 JSON leaves them)."""
    return {name: base64.b64encode(v).decode() if isinstance(v, bytes) else str(v)
            for name, v in _raw_kv(buf).items() if v}


def txn_result(buf: bytes) -> dict:
    """A TxnResponse in the JSON gateway's shape (ranges' kvs; other responses empty).
    ``ValueError`` on a malformed message."""
    result: dict = {"responses": []}
    for n, v in _fields(buf):
        if n == 1 and isinstance(v, bytes):
            result["header"] = _header(v)
        elif n == 2 and isinstance(v, int):
            result["succeeded"] = bool(v)
        elif n == 3 and isinstance(v, bytes):
            response: dict = {}
            for kind, body in _fields(v):
                if kind == 1 and isinstance(body, bytes):
                    response["response_range"] = {"kvs": [
                        _kv(kv) for m, kv in _fields(body) if m == 2 and isinstance(kv, bytes)]}
                elif isinstance(body, bytes):
                    response[{2: "response_put", 3: "response_delete_range"}.get(
                        kind, "response_txn")] = {}
            result["responses"].append(response)
    return result


# ---- HTTP/2 --------------------------------------------------------------------------------

def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) \
        + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2):
    the same bytes on every request and nothing for the server's decoder to remember."""
    def string(text: str) -> bytes:
        data = text.encode()
        if len(data) < 0x7F:
            return bytes((len(data),)) + data
        n, out = len(data) - 0x7F, bytearray((0x7F,))
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes(out) + bytes((n,)) + data
    return b"\x00" + string(name) + string(value)


class _Connection:
    def __init__(self, stream: trio.SocketStream, authority: str):
        self.stream = stream
        self.authority = authority
        self.buffer = bytearray()
        self.decoder = hpack.Decoder()
        self.heads: dict[str, bytes] = {}        # path -> its request header block
        self.next_stream = 1
        self.send_window = DEFAULT_WINDOW        # the connection's, for our DATA
        self.stream_window = DEFAULT_WINDOW      # etcd's initial window of each stream
        self.window = DEFAULT_WINDOW             # of the stream of the call in progress
        self.max_frame = DEFAULT_FRAME
        self.received = 0                        # DATA bytes taken in on our huge window
        self.reusable = True
        self.last_stream: int | None = None      # from a GOAWAY

    async def start(self) -> None:
        settings = struct.pack(">HIHIHI", S_ENABLE_PUSH, 0, S_HEADER_TABLE_SIZE, 0,
                               S_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        await self.stream.send_all(
            PREFACE + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))

    async def _read_frame(self) -> tuple[int, int, int, bytes]:
        while len(self.buffer) < 9:
            await self._fill()
        length = int.from_bytes(self.buffer[:3], "big")
        kind, flags = self.buffer[3], self.buffer[4]
        stream = int.from_bytes(self.buffer[5:9], "big") & 0x7FFFFFFF
        if length > DEFAULT_FRAME:      # we never allowed larger frames
            raise GatewayError(f"etcd sent a {length}-byte HTTP/2 frame", sent=True)
        while len(self.buffer) < 9 + length:
            await self._fill()
        payload = bytes(self.buffer[9:9 + length])
        del self.buffer[:9 + length]
        return kind, flags, stream, payload

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise GatewayError("etcd closed the connection", sent=True)
        self.buffer += data

    async def _control(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        """A frame not of our stream's answer: settings, ping, window, goaway."""
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                ident, value = struct.unpack(">HI", payload[i:i + 6])
                if ident == S_INITIAL_WINDOW_SIZE:
                    # applies to open streams too, as a difference (RFC 9113 6.9.2)
                    self.window += value - self.stream_window
                    self.stream_window = value
                elif ident == S_MAX_FRAME_SIZE:
                    self.max_frame = value
            await self.stream.send_all(_frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            await self.stream.send_all(_frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE and stream == 0 and len(payload) == 4:
            self.send_window += struct.unpack(">I", payload)[0] & 0x7FFFFFFF
        elif kind == GOAWAY and len(payload) >= 8:
            self.reusable = False
            self.last_stream = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
        elif kind == PUSH_PROMISE:
            raise GatewayError("etcd sent a PUSH_PROMISE we refused", sent=True)

    async def call(self, path: str, message: bytes) -> tuple[int, str, bytes]:
        stream, early = await self._send(path, message, end=True)
        data = bytearray()
        status = Status()
        async for kind, value in self._events(stream, early):
            if kind == DATA:
                data += value
                self.received += len(value)
                if len(data) > MAX_MESSAGE + 5:
                    raise GatewayError("etcd's answer is too large", sent=True)
            else:
                status.take(value)
        if self.received > MAX_WINDOW // 2:
            self.reusable = False
        status.check()
        if status.code != 0:
            return status.code, status.message, b""
        if len(data) < 5 or data[0] != 0:
            raise GatewayError("etcd's gRPC answer is malformed", sent=True)
        length = struct.unpack(">I", data[1:5])[0]
        if length != len(data) - 5:
            raise GatewayError("etcd's gRPC answer has a wrong length", sent=True)
        return 0, "", bytes(data[5:])

    async def watch(self, path: str, message: bytes) -> AsyncIterator[bytes]:
        """The messages of a server stream opened with ``message``, until it ends
        (``GatewayError`` with its status). The stream asks etcd to end it when the member
        loses its raft leader (gRPC metadata ``hasleader``, etcd's require-leader)."""
        self.reusable = False                  # the connection is this stream's alone
        stream, early = await self._send(path, message, end=False, require_leader=True)
        data = bytearray()
        status = Status()
        taken = 0
        async for kind, value in self._events(stream, early):
            if kind != DATA:
                status.take(value)
                continue
            data += value
            taken += len(value)
            if taken >= REPLENISH:
                # a stream that lives for days would exhaust even the largest window
                increment = struct.pack(">I", taken)
                await self.stream.send_all(_frame(WINDOW_UPDATE, 0, 0, increment)
                                           + _frame(WINDOW_UPDATE, 0, stream, increment))
                taken = 0
            while len(data) >= 5:
                length = struct.unpack(">I", data[1:5])[0]
                if data[0] != 0 or length > MAX_MESSAGE:
                    raise GatewayError("etcd sent a malformed or oversized stream message",
                                       sent=True)
                if len(data) < 5 + length:
                    break
                piece = bytes(data[5:5 + length])
                del data[:5 + length]
                yield piece
        status.check()
        raise GatewayError(f"etcd ended the stream (grpc-status {status.code} "
                           f"{status.message})", sent=True)

    async def _send(self, path: str, message: bytes, *, end: bool,
                    require_leader: bool = False) -> tuple[int, tuple | None]:
        """Open a stream with ``message`` (closing our side when ``end``): (its id, a frame
        of it etcd sent before taking the whole message, else None)."""
        stream = self.next_stream
        self.next_stream += 2
        if self.next_stream > MAX_STREAM_ID:
            self.reusable = False
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = (
                _literal(":method", "POST") + _literal(":scheme", "http")
                + _literal(":path", path) + _literal(":authority", self.authority)
                + _literal("content-type", "application/grpc") + _literal("te", "trailers"))
        if require_leader:
            head += _literal("hasleader", "true")
        body = b"\x00" + struct.pack(">I", len(message)) + message
        out = [_frame(HEADERS, END_HEADERS, stream, head)]
        self.window, sent = self.stream_window, 0
        early: tuple[int, int, bytes] | None = None
        while sent < len(body):
            size = min(len(body) - sent, self.max_frame, self.window, self.send_window)
            if size > 0:
                last = END_STREAM if end and sent + size == len(body) else 0
                out.append(_frame(DATA, last, stream, body[sent:sent + size]))
                sent += size
                self.window -= size
                self.send_window -= size
                continue
            # out of window: send what is ready and wait for etcd's WINDOW_UPDATE
            await self.stream.send_all(b"".join(out))
            out = []
            kind, flags, sid, payload = await self._read_frame()
            if sid != stream:
                await self._control(kind, flags, sid, payload)
            elif kind == WINDOW_UPDATE and len(payload) == 4:
                self.window += struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            else:
                # etcd answered (an error) before taking the whole request: the stream
                # stays half open on our side, so the connection is not used again
                early = (kind, flags, payload)
                self.reusable = False
                break
        if out:
            await self.stream.send_all(b"".join(out))
        return stream, early

    async def _events(self, stream: int, early: tuple | None) -> AsyncIterator[tuple]:
        """Our stream's ``(DATA, payload)`` and ``(HEADERS, decoded header list)`` until it
        ends; the connection's other frames handled on the way (``_control``)."""
        block = bytearray()
        ending = False
        while True:
            if early is not None:
                (kind, flags, payload), sid, early = early, stream, None
            else:
                kind, flags, sid, payload = await self._read_frame()
            if sid != stream:
                await self._control(kind, flags, sid, payload)
                if self.last_stream is not None and self.last_stream < stream:
                    raise GatewayError("etcd is going away and did not take the request",
                                       sent=False)
                continue
            if kind in (DATA, HEADERS) and flags & PADDED:
                if not payload or payload[0] >= len(payload):
                    raise GatewayError("etcd sent a malformed padded frame", sent=True)
                payload = payload[1:len(payload) - payload[0]]
            if kind == DATA:
                yield DATA, payload
                if flags & END_STREAM:
                    return
            elif kind in (HEADERS, CONTINUATION):
                if kind == HEADERS:
                    ending = bool(flags & END_STREAM)
                    if flags & PRIORITY:
                        payload = payload[5:]
                block += payload
                if len(block) > MAX_HEADER_BLOCK:
                    raise GatewayError("etcd sent an oversized header block", sent=True)
                if not flags & END_HEADERS:
                    continue
                try:
                    headers = self.decoder.decode(bytes(block))
                except (hpack.HPACKError, ValueError) as exc:
                    raise GatewayError(f"etcd sent bad headers: {exc}", sent=True) from None
                block.clear()
                yield HEADERS, headers
                if ending:
                    return
            elif kind == RST_STREAM:
                raise GatewayError("etcd reset the stream", sent=True)


class Status:
    """The HTTP and gRPC status a stream's header blocks carried."""

    def __init__(self):
        self.http: str | None = None
        self.code: int | None = None
        self.message = ""

    def take(self, headers: list) -> None:
        for name, value in headers:
            if name == ":status":
                self.http = value
            elif name == "grpc-status":
                self.code = int(value) if value.isdigit() else 2
            elif name == "grpc-message":
                self.message = value

    def check(self) -> None:
        """``GatewayError`` unless the stream had HTTP 200 and a grpc-status."""
        if self.http != "200":
            raise GatewayError(f"etcd answered HTTP status {self.http} to a gRPC call",
                               sent=True)
        if self.code is None:
            raise GatewayError("etcd's answer ended without a grpc-status", sent=True)


class Channel(Pool):
    """Unary gRPC calls to ``http://host:port`` etcd endpoints over kept-alive connections."""

    def __init__(self):
        super().__init__(self._open)

    async def call(self, endpoint: str, path: str, message: bytes,
                   timeout: float) -> tuple[int, str, bytes]:
        """(grpc-status, grpc-message, answer message) of one call; ``GatewayError`` on a
        transport failure or after ``timeout`` s."""
        return await self.run(endpoint, path, timeout, lambda conn: conn.call(path, message))

    async def watch(self, endpoint: str, path: str, message: bytes,
                    connect_timeout: float) -> AsyncIterator[bytes]:
        """The messages of a server stream on a connection of its own (``_Connection.watch``);
        ``GatewayError`` when it cannot be opened within ``connect_timeout`` s, breaks or
        ends."""
        conn = None
        with trio.move_on_after(connect_timeout):
            conn = await self._open(endpoint)
        if conn is None:
            raise GatewayError(f"{endpoint}{path}: no connection within {connect_timeout:g} s",
                               sent=False)
        try:
            async for piece in conn.watch(path, message):
                yield piece
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise GatewayError(f"{endpoint}: {str(exc) or type(exc).__name__}", sent=True) from None
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(conn.stream)

    @staticmethod
    async def _open(endpoint: str) -> _Connection:
        stream, hostport = await open_stream(endpoint)
        conn = _Connection(stream, hostport)
        try:
            await conn.start()
        except (OSError, trio.BrokenResourceError) as exc:
            await trio.aclose_forcefully(stream)
            raise GatewayError(f"cannot start HTTP/2 with etcd at {endpoint}: {exc}",
                               sent=False) from None
        return conn
