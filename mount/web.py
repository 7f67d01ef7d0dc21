"""The mount's ``/metrics`` page (Prometheus text format), one tiny ASGI app served by
``fs.web.serve_app`` on ``mount_metrics_port`` (-1 = off, 0 = any free port).

Why a page of its own: a mount is no server the cluster knows, yet its FUSE operations and
latencies are what users feel; Prometheus scrapes it like the servers.

Concurrency contract: the handler runs on the mount's trio thread and only reads numbers.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from fs.metrics import exposition


def make_app(metrics) -> Starlette:
    """``metrics``: the mount's ``MountMetrics``."""
    async def page(request):
        body, content_type = exposition(metrics.registry)
        return Response(body, media_type=content_type)

    return Starlette(routes=[Route("/metrics", page)])


__all__ = ["make_app"]
