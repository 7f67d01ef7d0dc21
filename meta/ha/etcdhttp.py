"""A lean HTTP/1.1 client for etcd's JSON gateway's unary calls (txn, range, lease).

Why it exists: the metadata servers call etcd (leases, the election, reads of the log) on
their only thread. Measured with ``leasefs bench meta --ha``, httpx's request machinery
(client, auth and redirect handling, connection pool, httpcore's h11 state machine) took
about 0.5 ms of CPU per call; this client writes the request in one ``send_all`` and reads
a ``Content-Length`` response, which is all etcd's gateway answers unary calls with. The
append and the watch go through etcd's native gRPC instead (``meta/ha/etcdgrpc.py``).

Keep-alive connections, idle ones kept per endpoint; one request at a time per connection.
Failures raise ``GatewayError`` with ``sent`` telling whether the request may have reached
etcd (a failed connect: no; anything after: maybe), which is what the log needs to know to
retry a txn safely.

Concurrency contract: one ``Gateway`` per trio task tree; ``post`` may run in several tasks
at once (each takes its own connection).
"""

from __future__ import annotations

import trio

from fs import tcpliveness

MAX_HEADER = 64 << 10
MAX_BODY = 64 << 20


class GatewayError(Exception):
    def __init__(self, message: str, *, sent: bool):
        super().__init__(message)
        self.sent = sent


class _Connection:
    def __init__(self, stream: trio.SocketStream, host: str):
        self.stream = stream
        self.host = host
        self.buffer = bytearray()
        self.reusable = True

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise GatewayError("etcd closed the connection", sent=True)
        self.buffer += data

    async def request(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        await self.stream.send_all(head.encode("ascii") + body)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > MAX_HEADER:
                raise GatewayError("etcd sent an oversized response header", sent=True)
            await self._fill()
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[:end + 4]
        try:
            _version, code, *_ = lines[0].split(" ", 2)
            status = int(code)
        except ValueError:
            raise GatewayError(f"etcd sent a malformed status line {lines[0][:80]!r}",
                               sent=True) from None
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("connection", "").lower() == "close":
            self.reusable = False
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return status, await self._chunked()
        try:
            length = int(headers.get("content-length", ""))
        except ValueError:
            raise GatewayError("etcd's response has no Content-Length", sent=True) from None
        if length > MAX_BODY:
            raise GatewayError(f"etcd's response of {length} bytes is too large", sent=True)
        while len(self.buffer) < length:
            await self._fill()
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        return status, data

    async def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            while (end := self.buffer.find(b"\r\n")) < 0:
                await self._fill()
            try:
                size = int(bytes(self.buffer[:end]).split(b";")[0], 16)
            except ValueError:
                raise GatewayError("etcd sent a malformed chunk", sent=True) from None
            del self.buffer[:end + 2]
            while len(self.buffer) < size + 2:
                await self._fill()
            out += self.buffer[:size]
            del self.buffer[:size + 2]
            if size == 0:
                return bytes(out)
            if len(out) > MAX_BODY:
                raise GatewayError("etcd's response is too large", sent=True)


async def open_stream(endpoint: str) -> tuple[trio.SocketStream, str]:
    """A TCP connection to an ``http://host:port`` endpoint and its ``host:port``;
    ``GatewayError`` (not sent) when it cannot be made."""
    if not endpoint.startswith("http://"):
        raise GatewayError(f"etcd endpoint {endpoint!r} is not http://host:port", sent=False)
    hostport = endpoint[len("http://"):].rstrip("/")
    host, _, port = hostport.rpartition(":")
    try:
        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    except (OSError, ValueError) as exc:
        raise GatewayError(f"cannot connect to etcd at {endpoint}: {exc}", sent=False) from None
    tcpliveness.watch(stream)
    return stream, hostport


class Pool:
    """Kept-alive connections per endpoint, one request at a time on each; the HTTP/1.1
    gateway client below and the HTTP/2 gRPC one (``meta/ha/etcdgrpc.py``) share it. A
    connection is anything with ``stream`` and ``reusable``; ``connect(endpoint)`` makes
    one."""

    def __init__(self, connect):
        self._connect = connect
        self._idle: dict[str, list] = {}
        self._closed = False

    async def run(self, endpoint: str, what: str, timeout: float, request):
        """``await request(conn)`` on an idle or new connection to ``endpoint``;
        ``GatewayError`` on a transport failure or after ``timeout`` s. A connection that
        failed, timed out or is not ``reusable`` is closed."""
        idle = self._idle.setdefault(endpoint, [])
        conn = idle.pop() if idle else None
        with trio.move_on_after(timeout):
            if conn is None:
                conn = await self._connect(endpoint)
            try:
                answer = await request(conn)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    GatewayError) as exc:
                await trio.aclose_forcefully(conn.stream)
                if isinstance(exc, GatewayError):
                    raise
                raise GatewayError(f"{endpoint}: {str(exc) or type(exc).__name__}", sent=True) from None
            except BaseException:
                await trio.aclose_forcefully(conn.stream)
                raise
            if conn.reusable and not self._closed:
                idle.append(conn)
            else:
                await trio.aclose_forcefully(conn.stream)
            return answer
        if conn is not None:
            await trio.aclose_forcefully(conn.stream)
        raise GatewayError(f"{endpoint}{what}: no answer within {timeout:g} s",
                           sent=conn is not None)

    def idle(self, endpoint: str) -> int:
        """How many kept-alive connections to ``endpoint`` wait for a request."""
        return len(self._idle.get(endpoint, ()))

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                await trio.aclose_forcefully(conn.stream)
        self._idle.clear()


class Gateway(Pool):
    """POST JSON to ``http://host:port`` endpoints over kept-alive connections."""

    def __init__(self):
        super().__init__(self._open)

    async def post(self, endpoint: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """(HTTP status, body) of one POST; ``GatewayError`` on a transport failure or
        after ``timeout`` s."""
        return await self.run(endpoint, path, timeout, lambda conn: conn.request(path, body))

    @staticmethod
    async def _open(endpoint: str) -> _Connection:
        stream, hostport = await open_stream(endpoint)
        return _Connection(stream, hostport)
