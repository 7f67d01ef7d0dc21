"""A block server's own web page (HDFS DataNode UI, port 9864), its state as JSON for
scripts and its Prometheus metrics, as one small ASGI app served by ``fs.web.serve_app``.

Routes: ``GET /`` (HTML: replicas by state, the volume, transfers, recent errors),
``GET /api/v1/status`` (the same as JSON, ``schema_version``), ``GET /metrics``
(Prometheus text format), ``/static/style.css``. Read-only; replica ids and counts only,
never block data, never a key.

Concurrency contract: handlers run on the block server's trio thread and only read its
state; the volume's free space is asked of the store's disk threads (``statvfs``).
"""

from __future__ import annotations

import collections
import logging
import os

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fs import webui
from fs.metrics import exposition

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
RECENT_ERRORS = 100
NAV = [("/", "Block server"), ("/api/v1/status", "JSON")]


async def status(server) -> dict:
    """What the page shows: the node, its replicas by state, its volume, its transfers
    and the warnings and errors it logged lately."""
    store = server.store
    heartbeat = server.heartbeat
    states = collections.Counter(r.state.name for r in store.replicas.values())
    try:
        capacity, remaining = await store.disk_space()
    except OSError:
        capacity = remaining = None
    used = store.used_bytes()
    recent = server.recent_log.lines(logging.WARNING, RECENT_ERRORS)
    return {"schema_version": SCHEMA_VERSION, "node_id": store.node_id,
            "address": server.advertised, "meta_address": heartbeat.meta_address,
            "registered": heartbeat.registered, "heartbeats_sent": heartbeat.heartbeats_sent,
            "full_reports_sent": heartbeat.full_reports_sent,
            "active_epoch": heartbeat.active_epoch,
            "dropped_commands": heartbeat.dropped_commands,
            # one entry per metadata server of meta_address (several with HA)
            "meta_servers": [actor.summary() for actor in heartbeat.actors],
            "replicas": len(store.replicas), "replicas_by_state": dict(sorted(states.items())),
            "used_bytes": used,
            "volumes": [{"data_dir": store.data_dir, "capacity": capacity, "used": used,
                         "remaining": remaining, "failed": capacity is None}],
            "data_dir": store.data_dir,
            "active_transfers": server.transfer.active_ops,
            "copies_in_progress": heartbeat.copies_in_progress,
            "copies_done": heartbeat.transfers_done,
            "copies_failed": heartbeat.transfers_failed,
            "recent_errors": recent}


def make_app(server) -> Starlette:
    env = webui.environment(TEMPLATES)

    async def status_json(request):
        try:
            return JSONResponse(await status(server))
        except Exception as exc:
            log.exception("status page failed")
            return webui.error_response(env, request, exc, NAV)

    async def metrics(request):
        body, content_type = exposition(server.metrics_registry)
        return Response(body, media_type=content_type)

    async def page(request):
        try:
            data = await status(server)
            return webui.render(env, "datanode.html", nav=NAV, active="/",
                                title=f"Block server {data['address']}",
                                server_kind="block server", d=data)
        except Exception as exc:
            log.exception("status page failed")
            return webui.error_response(env, request, exc, NAV)

    return Starlette(routes=[Route("/", page), Route("/api/v1/status", status_json),
                             Route("/metrics", metrics),
                             Route("/static/style.css", webui.css)])


__all__ = ["make_app", "status", "SCHEMA_VERSION"]
