"""The web port of a server takes hostile and broken HTTP without harm: a header larger than
the limit, bytes that are not HTTP, a request that never ends, a flood of idle connections;
each is answered or closed, and the page keeps serving others."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from functools import partial

import trio

from fs import web
from fs.web import MAX_REQUEST_HEAD
from harness import free_port, make_test_config
from meta.serverrun import run_meta_server


def _fetch(port: int, path: str = "/report") -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return json.loads(answer.read())


def _raw(port: int, data: bytes, wait: float = 15.0) -> bytes:
    """Send ``data``, read until the server closes or ``wait`` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, OSError):
                break
            if not chunk:
                break
            out += chunk
        return out


def _trickle(port: int, wait: float) -> bool:
    """Send a request head a byte a second; True when the server closes the connection
    before ``wait`` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        deadline = time.monotonic() + wait
        for byte in b"GET /report HTTP/1.1\r\nHost: x\r\n" * 10:
            if time.monotonic() > deadline:
                return False
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return True
            sock.settimeout(1.0)
            try:
                if sock.recv(1024) == b"":
                    return True
            except socket.timeout:
                pass
            except OSError:
                return True
        return False


# the servers' 10 s, shortened: the test waits it out twice, and what it asserts (closed
# within the timeout) is the same for any value
READ_TIMEOUT = 3


async def test_the_web_port_survives_hostile_requests(tmp_path, monkeypatch):
    monkeypatch.setattr(web, "READ_TIMEOUT", READ_TIMEOUT)
    http_port = free_port()
    config = make_test_config()

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_meta_server, config, str(tmp_path / "meta"),
                                    port=0, http_port=http_port))

        async def run(fn, *args):
            return await trio.to_thread.run_sync(partial(fn, *args))

        assert (await run(_fetch, http_port))["schema_version"] == 1
        # a header past the limit: refused (431/400) or closed, never buffered whole
        huge = b"GET /report HTTP/1.1\r\nHost: x\r\nX-Junk: " + \
            b"a" * (4 * MAX_REQUEST_HEAD) + b"\r\n\r\n"
        answer = await run(_raw, http_port, huge)
        assert answer == b"" or answer.split(b" ", 2)[1] in (b"400", b"413", b"431")
        # not HTTP at all
        answer = await run(_raw, http_port, b"\x16\x03\x01\x00\x05hello\r\n\r\n")
        assert answer == b"" or answer.split(b" ", 2)[1] == b"400"
        # a request that never ends, and one that trickles in a byte a second: closed
        # within the timeout either way
        started = time.monotonic()
        await run(_raw, http_port, b"GET /report HTTP/1.1\r\nHost: x\r\n",
                  READ_TIMEOUT + 10)
        assert time.monotonic() - started < READ_TIMEOUT + 5
        started = time.monotonic()
        assert await run(_trickle, http_port, READ_TIMEOUT + 10)
        assert time.monotonic() - started < READ_TIMEOUT + 5
        # idle connections held open do not keep others out
        idle = [socket.create_connection(("127.0.0.1", http_port)) for _ in range(50)]
        try:
            assert (await run(_fetch, http_port))["schema_version"] == 1
            assert (await run(_fetch, http_port, "/api/v1/startup"))["phase"] == "RUNNING"
        finally:
            for sock in idle:
                sock.close()
        nursery.cancel_scope.cancel()
