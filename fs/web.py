"""Serving the status pages and metrics of every leasefs process: one maintained HTTP
stack (Hypercorn, an ASGI server that runs on trio) under small ASGI apps (Starlette).

Why it exists: the metadata server, the block servers and the mount each serve read-only
pages, JSON for scripts and Prometheus metrics beside their own protocols, in their own
trio thread. A hand-written HTTP handler would have to get request parsing, keep-alive,
timeouts and limits right itself; Hypercorn does (h11), and runs as one more task tree in
the server's nursery.

Concurrency contract: ``serve_app`` is a trio task; the app's handlers run on the same
trio thread as the server they describe, so they read its state without locks and must
not block.
"""

from __future__ import annotations

import logging

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from .rpc import format_address

log = logging.getLogger(__name__)

# what one request may hold: pages are small GETs
MAX_REQUEST_HEAD = 16 * 1024
READ_TIMEOUT = 10

# on every answer of every server's pages: never framed by another site (clickjacking),
# nothing loaded or run but the page's own style sheet and empty ``data:`` icon (the pages
# have no script; the bars' widths are inline style attributes), forms only to the server
SECURITY_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy",
     b"default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
)


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` added to every HTTP answer of ``app``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message,
                           "headers": [*message.get("headers", ()), *SECURITY_HEADERS]}
            await send(message)
        await self.app(scope, receive, send_with_headers)


def _config(host: str, port: int) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [format_address((host, port))]
    config.accesslog = None                     # requests are not news; errors are logged
    config.errorlog = logging.getLogger("fs.web.hypercorn")
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD
    config.read_timeout = READ_TIMEOUT
    # also what bounds a request that trickles in (the connection counts as idle until a
    # whole request head arrived), and a closing connection waits for it: keep it short
    config.keep_alive_timeout = READ_TIMEOUT
    config.graceful_timeout = 1
    return config


async def serve_app(app, host: str, port: int, *, name: str = "status page",
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on ``host:port`` (0 = any free port) until cancelled; reports the
    bound ``(host, port)``."""
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(_serve, SecurityHeaders(app), _config(host, port))
        address = urls[0].split("://", 1)[1]
        bound_host, _, bound_port = address.rpartition(":")
        bound = (bound_host.strip("[]"), int(bound_port))
        log.info("%s on http://%s/", name, format_address(bound))
        task_status.started(bound)


async def _serve(app, config, task_status=trio.TASK_STATUS_IGNORED):
    await serve(app, config, task_status=task_status)
