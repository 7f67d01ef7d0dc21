"""A block server's own web page (HDFS DataNode UI, port 9864), its state as JSON for
scripts and its Prometheus metrics, as one small ASGI app served by ``fs.web.serve_app``.

Routes: ``GET /`` (HTML), ``GET /api/v1/status`` (JSON, ``schema_version``), ``GET /metrics``
(Prometheus text format). Read-only; replica ids and counts only, never block data.

Concurrency contract: handlers run on the block server's trio thread and only read its
state.
"""

from __future__ import annotations

import collections
import html

from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fs.metrics import exposition

SCHEMA_VERSION = 1


def status(server) -> dict:
    """What the page shows: the node, its replicas by state, its transfers."""
    store = server.store
    states = collections.Counter(r.state.name for r in store.replicas.values())
    return {"schema_version": SCHEMA_VERSION, "node_id": store.node_id,
            "address": server.advertised, "data_dir": store.data_dir,
            "replicas": len(store.replicas), "replicas_by_state": dict(sorted(states.items())),
            "used_bytes": store.used_bytes(), "active_transfers": server.transfer.active_ops,
            "registered": server.heartbeat.registered}


def make_app(server) -> Starlette:
    async def status_json(request):
        return JSONResponse(status(server))

    async def metrics(request):
        body, content_type = exposition(server.metrics_registry)
        return Response(body, media_type=content_type)

    async def page(request):
        rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in status(server).items())
        return HTMLResponse(f"<!doctype html><html><head><title>leasefs block server</title>"
                            f"</head><body><h1>leasefs block server</h1><table>{rows}</table>"
                            f"</body></html>")

    return Starlette(routes=[Route("/", page), Route("/api/v1/status", status_json),
                             Route("/metrics", metrics)])


__all__ = ["make_app", "status", "SCHEMA_VERSION"]
