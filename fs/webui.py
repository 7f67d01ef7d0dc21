"""What the web pages of the metadata server and of each block server share: one Jinja2
environment (autoescape on, a base layout with a nav bar), the style sheet, number and time
filters, and the error answers (a clear 4xx page or JSON, never a traceback).

Why it exists: ``meta`` and ``storage`` never import each other, yet their pages should look
alike; both build their templates on ``fs/templates/base.html``. No external resource (font,
script, CDN): the pages must work on a machine without internet.

Concurrency contract: rendering is pure CPU on small data, on the server's trio thread; the
environment is built once per app and only read afterwards.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from .errors import (FileNotFound, InvalidArgument, InvalidPath, IsDirectory, LeaseFSError,
                     NameTooLong, NotDirectory, PermissionDenied)

HERE = os.path.dirname(os.path.abspath(__file__))
CSS_PATH = os.path.join(HERE, "templates", "style.css")
MAX_QUERY_VALUE = 8192     # a query value longer than any path leasefs accepts


def version() -> str:
    try:
        return importlib.metadata.version("leasefs")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def human_bytes(n) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def human_seconds(s) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def wall_time(ns) -> str:
    if not isinstance(ns, (int, float)) or ns <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def percent(part, whole) -> float:
    return 0.0 if not whole else max(0.0, min(100.0, 100.0 * part / whole))


def environment(template_dir: str) -> jinja2.Environment:
    """Templates of ``template_dir`` over the shared ones (``base.html``, ``error.html``)."""
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(template_dir),
                                    jinja2.FileSystemLoader(os.path.join(HERE, "templates"))]),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)
    env.filters.update(bytes=human_bytes, seconds=human_seconds, wall=wall_time)
    env.globals.update(percent=percent, version=version())
    # every template (and the style sheet) read now, at app build: no file read later on
    # the trio thread
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)
    _css()
    return env


def render(env: jinja2.Environment, name: str, status_code: int = 200, **context) -> HTMLResponse:
    return HTMLResponse(env.get_template(name).render(**context), status_code=status_code)


async def css(request: Request) -> Response:
    return Response(_css(), media_type="text/css", headers={"Cache-Control": "max-age=300"})


_css_body: bytes | None = None


def _css() -> bytes:
    global _css_body
    if _css_body is None:
        with open(CSS_PATH, "rb") as fh:
            _css_body = fh.read()
    return _css_body


def query(request: Request, name: str, default: str | None = None) -> str | None:
    """A query parameter, refused (400) when absurdly long."""
    value = request.query_params.get(name, default)
    if value is not None and len(value) > MAX_QUERY_VALUE:
        raise InvalidArgument(f"query parameter {name!r} is longer than {MAX_QUERY_VALUE} "
                              f"characters")
    return value


def status_of(exc: BaseException) -> int:
    if isinstance(exc, FileNotFound):
        return 404
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, (InvalidArgument, InvalidPath, NameTooLong, NotDirectory,
                        IsDirectory)):
        return 400
    return 409 if isinstance(exc, LeaseFSError) else 500


def error_response(env: jinja2.Environment, request: Request, exc: BaseException,
                   nav: list) -> Response:
    """The error as JSON under ``/api/``, else as a page: its class and message only."""
    code = status_of(exc)
    kind = type(exc).__name__
    message = str(exc)[:500] if isinstance(exc, LeaseFSError) else "internal error"
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": kind, "message": message}, status_code=code)
    return render(env, "error.html", status_code=code, nav=nav, active="", code=code,
                  kind=kind, message=message, title=f"{code} {kind}")


__all__ = ["environment", "render", "css", "query", "error_response", "status_of",
           "human_bytes", "human_seconds", "wall_time", "percent", "version"]
