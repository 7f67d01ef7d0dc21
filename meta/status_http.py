"""A tiny read-only HTTP status page for the metadata server (HDFS's port 9870).

Why it exists: ``curl http://host:9870/`` shows live/dead block servers, block counts and
safe mode without the CLI. ``GET /`` and ``GET /report`` answer the ``report`` RPC's result
as JSON; anything else is 404. One request per connection, bounded header size, a short
read timeout, so a slow or hostile peer cannot hold anything.

Concurrency contract: trio tasks on the server's thread; only reads server state.
"""

from __future__ import annotations

import json
import logging
from functools import partial

import trio

from fs.rpc import CallContext, serve_tcp

log = logging.getLogger(__name__)

MAX_REQUEST = 8192


async def _handle(server, stream: trio.abc.Stream, peer: str) -> None:
    data = b""
    with trio.move_on_after(5):
        while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace").split()
    if len(line) >= 2 and line[0] == "GET" and line[1].split("?")[0] in ("/", "/report"):
        report = await server.rpc_report(CallContext(client_id="http", peer=peer))
        body, status = json.dumps(report, indent=1).encode(), "200 OK"
    else:
        body, status = b'{"error": "not found; try GET /"}', "404 Not Found"
    head = (f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        await stream.send_all(head + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()


async def serve_status(server, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED):
    """Serve the status page; reports the bound ``(host, port)``."""
    await serve_tcp(partial(_handle, server), host, port, task_status=task_status,
                    name="status page")
