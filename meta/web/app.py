"""The metadata server's web UI (HDFS NameNode UI, port 9870), JSON for scripts and
Prometheus metrics, as one small ASGI app served by ``fs.web.serve_app``.

Pages (HTML, Jinja2 templates with autoescape over ``fs/templates/base.html``) and the
JSON each one's data is also served as (``schema_version`` in each; PROTOCOL.md, "Web and
JSON endpoints"):

- ``/`` overview — ``/api/v1/overview``
- ``/datanodes`` block servers, each linking to its own page — ``/api/v1/datanodes``
- ``/openfiles`` open files and leases — ``/api/v1/openfiles``
- ``/explorer?path=`` folder listing or file details — ``/api/v1/explorer?path=``
- ``/download?path=`` the file's bytes, streamed through a read of the viewer's
- ``/fsck?path=`` — ``/api/v1/fsck?path=``
- ``/logs?level=`` recent log lines — ``/api/v1/logs?level=``
- ``/report`` and ``/api/v1/report``: the ``report`` RPC's answer (kept for scripts)
- ``/metrics``: Prometheus text format; ``/static/style.css``

Read-only. Who the viewer is, and so what it sees: ``webpages.viewer`` (``dr.who`` under
``security = "secure"``; ``?user.name=`` under ``"simple"``). Bad input answers a 4xx page
(or JSON under ``/api/``) naming the problem, never a traceback.

Concurrency contract: handlers run on the metadata server's trio thread and only read its
state (through ``webpages``); a download streams block by block in 64 KiB pieces, so its
memory is bounded whatever the file's size, and awaits only the network.
"""

from __future__ import annotations

import logging
import os
import urllib.parse

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fs import tls as tlsmod
from fs import webui
from fs.dataconn import AvoidedNodes
from fs.errors import InvalidArgument, IsDirectory, LeaseFSError
from fs.metrics import exposition
from fs.reader import AsyncInputStream

from . import pages as webpages
from ..schema.inode import FILE
from .pages import SCHEMA_VERSION, WEB_USER

log = logging.getLogger(__name__)

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
DOWNLOAD_CHUNK = 64 * 1024
NAV = [("/", "Overview"), ("/datanodes", "Block servers"), ("/openfiles", "Open files"),
       ("/explorer", "Browse"), ("/fsck", "Fsck"), ("/logs", "Logs")]


class _ViewerClient:
    """What an input stream needs of a client, answered by the server's own handlers as
    the viewer: the viewer's permissions and block tokens, no connection to ourselves."""

    def __init__(self, server, ctx):
        self._server, self._ctx = server, ctx
        self.config = server.config
        self.tls = tlsmod.client(server.config)
        self.rpc = self
        self.avoided = AvoidedNodes(server.config.data_avoid_interval)

    async def call(self, method: str, args: dict, **_options):
        if method not in ("get_block_locations", "report_bad_blocks"):
            raise InvalidArgument(f"download: {method} is not a read")
        return await self._server.handler(method)(self._ctx, **args)

    call_meta = call


def make_app(server) -> Starlette:
    env = webui.environment(TEMPLATES)
    simple = server.config.security != "secure"

    def ctx_of(request):
        name = webui.query(request, "user.name") if simple else None
        return webpages.viewer(server, _peer(request), name)

    def link_maker(request):
        # under simple security the pseudo user follows the viewer from page to page
        name = request.query_params.get("user.name") if simple else None

        def link(route, **params):
            if name:
                params["user.name"] = name
            params = {k: v for k, v in params.items() if v is not None}
            return route + ("?" + urllib.parse.urlencode(params) if params else "")
        return link

    def page(template, gather, title):
        async def endpoint(request):
            try:
                ctx = ctx_of(request)
                data = await gather(request, ctx)
                link = link_maker(request)
                nav = [(link(href), label) for href, label in NAV]
                return webui.render(env, template, nav=nav, active=link(request.url.path),
                                    title=title(data) if callable(title) else title,
                                    server_kind="metadata server", d=data, link=link,
                                    viewer=ctx.user)
            except Exception as exc:
                return _failed(request, exc)
        return endpoint

    def api(gather):
        async def endpoint(request):
            try:
                return JSONResponse(await gather(request, ctx_of(request)))
            except Exception as exc:
                return _failed(request, exc)
        return endpoint

    def _failed(request, exc):
        if not isinstance(exc, LeaseFSError):
            log.exception("web page %s failed", request.url.path)
        return webui.error_response(env, request, exc, NAV)

    # what each page shows: (request, ctx) -> dict
    async def overview(request, ctx):
        return await webpages.overview(server, ctx)

    async def datanodes(request, ctx):
        return await webpages.datanodes(server, ctx)

    async def open_files(request, ctx):
        return webpages.open_files(server, ctx)

    async def explorer(request, ctx):
        return await webpages.explorer(server, ctx, webui.query(request, "path", "/"))

    async def fsck(request, ctx):
        return await webpages.fsck(server, ctx, webui.query(request, "path", "/"))

    async def logs(request, ctx):
        return webpages.logs(server, ctx, webui.query(request, "level", "INFO"))

    async def report_data(request, ctx):
        return {"schema_version": SCHEMA_VERSION, **await server.admin_protocol.rpc_report(ctx)}

    async def metrics(request):
        body, content_type = exposition(server.metrics_registry)
        return Response(body, media_type=content_type)

    async def download(request):
        try:
            ctx = ctx_of(request)
            path = webui.query(request, "path")
            if not path:
                raise InvalidArgument("download: which file? (?path=/a/file)")
            status = await server.namespace_protocol.rpc_get_file_info(ctx, path=path)
            if status["type"] != FILE:
                raise IsDirectory(f"{status['path']}: not a file")
            stream = await AsyncInputStream.open(_ViewerClient(server, ctx), status["path"])
        except Exception as exc:
            return _failed(request, exc)

        async def body():
            try:
                while True:
                    piece = await stream.read(DOWNLOAD_CHUNK)
                    if not piece:
                        break
                    yield piece
            except LeaseFSError as exc:
                # the status line left already: the client sees a short body
                log.warning("download of %s stopped: %s", status["path"], exc)
            finally:
                await stream.close()
        name = status["path"].rsplit("/", 1)[-1] or "download"
        disposition = f"attachment; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"
        return StreamingResponse(body(), media_type="application/octet-stream",
                                 headers={"Content-Length": str(stream.length),
                                          "Content-Disposition": disposition})

    return Starlette(routes=[
        Route("/", page("overview.html", overview, "Overview")),
        Route("/datanodes", page("datanodes.html", datanodes, "Block servers")),
        Route("/openfiles", page("openfiles.html", open_files, "Open files and leases")),
        Route("/explorer", page("explorer.html", explorer, lambda d: f"Browse {d['path']}")),
        Route("/fsck", page("fsck.html", fsck, lambda d: f"Fsck {d['path']}")),
        Route("/logs", page("logs.html", logs, "Recent log lines")),
        Route("/download", download),
        Route("/api/v1/overview", api(overview)),
        Route("/api/v1/datanodes", api(datanodes)),
        Route("/api/v1/openfiles", api(open_files)),
        Route("/api/v1/explorer", api(explorer)),
        Route("/api/v1/fsck", api(fsck)),
        Route("/api/v1/logs", api(logs)),
        Route("/report", api(report_data)),
        Route("/api/v1/report", api(report_data)),
        Route("/metrics", metrics),
        Route("/static/style.css", webui.css),
    ])


def _peer(request) -> str:
    client = request.client
    return f"http:{client.host}:{client.port}" if client else "http:?"


__all__ = ["make_app", "SCHEMA_VERSION", "WEB_USER"]
