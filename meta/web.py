"""The metadata server's web pages (HDFS NameNode UI, port 9870), JSON for scripts and
Prometheus metrics, as one small ASGI app served by ``fs.web.serve_app``.

Routes:

- ``GET /`` — the overview page (HTML).
- ``GET /report`` — the ``report`` RPC's answer as JSON, with ``schema_version``
  (kept for scripts; ``/api/v1/report`` is the same).
- ``GET /metrics`` — Prometheus text format.

Read-only. Under ``security = "secure"`` a viewer is not authenticated (as HDFS's web UI
without SPNEGO, whose user is ``dr.who``): pages show what the report shows and what any
user may see, never what only some may.

Concurrency contract: handlers run on the metadata server's trio thread and only read its
state.
"""

from __future__ import annotations

import html

from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fs.metrics import exposition
from fs.rpc import CallContext

SCHEMA_VERSION = 1
WEB_USER = "dr.who"   # HDFS's name for an unauthenticated web viewer


def make_app(server) -> Starlette:
    async def report(request):
        answer = await server.rpc_report(CallContext(client_id="http", peer=_peer(request)))
        return JSONResponse({"schema_version": SCHEMA_VERSION, **answer})

    async def metrics(request):
        body, content_type = exposition(server.metrics_registry)
        return Response(body, media_type=content_type)

    async def overview(request):
        answer = await server.rpc_report(CallContext(client_id="http", peer=_peer(request)))
        rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in sorted(answer.items()) if not isinstance(v, (list, dict)))
        return HTMLResponse(f"<!doctype html><html><head><title>leasefs</title></head><body>"
                            f"<h1>leasefs metadata server</h1><table>{rows}</table>"
                            f"</body></html>")

    return Starlette(routes=[
        Route("/", overview),
        Route("/report", report),
        Route("/api/v1/report", report),
        Route("/metrics", metrics),
    ])


def _peer(request) -> str:
    client = request.client
    return f"http:{client.host}:{client.port}" if client else "http:?"


__all__ = ["make_app", "SCHEMA_VERSION", "WEB_USER"]
