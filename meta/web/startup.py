"""The metadata server's web pages while it starts: an ASGI layer in front of the app of
``meta/web/app.py`` that answers every request with the start-up progress (``meta/services/startup.py``)
until the server runs, and ``/api/v1/startup`` always.

Why it exists: the pages come up before the journal replay (which can take minutes on a big
journal) so an operator sees how far it is, as HDFS's NameNode UI shows its StartupProgress;
the app's own pages read state (blocks map, leases) that is only built at the end.

Concurrency contract: runs on the metadata server's trio thread, reads ``server.startup``.
"""

from __future__ import annotations

import html
import json

from .app import SCHEMA_VERSION

STARTUP_PATH = "/api/v1/startup"


class StartupGate:
    def __init__(self, app, server):
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "/")
        running = self.server.startup.running
        if running and path != STARTUP_PATH:
            return await self.app(scope, receive, send)
        progress = self.server.startup.as_dict(self.server.wall_ns() / 1e9)
        body = {"schema_version": SCHEMA_VERSION, **progress}
        if path == STARTUP_PATH or path.startswith("/api/") or path in ("/report", "/metrics"):
            await _send(send, 200 if path == STARTUP_PATH else 503, "application/json",
                        json.dumps(body).encode())
            return
        await _send(send, 503, "text/html; charset=utf-8", _page(progress).encode())


def _page(p: dict) -> str:
    done = (f"{p['replayed']} of {p['to_replay']} journal records replayed"
            if p["phase"] == "REPLAYING_JOURNAL" else "")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='1'><title>leasefs: starting</title></head>"
            f"<body><h1>leasefs metadata server is starting</h1>"
            f"<p>Phase <b>{html.escape(p['phase'])}</b> for {p['phase_seconds']:.1f} s "
            f"(started {p['seconds']:.1f} s ago). {html.escape(done)}</p>"
            f"<p>Journal: store applied txid {p['applied_txid']}, journal ends at txid "
            f"{p['last_txid']}.</p></body></html>")


async def _send(send, status: int, content_type: str, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["StartupGate", "STARTUP_PATH"]
