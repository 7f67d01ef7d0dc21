"""Path rules shared by the metadata server (which enforces them) and clients.

A valid leasefs path is absolute, uses ``/`` separators, has no empty, ``.`` or ``..``
components, no NUL byte, components of at most ``MAX_NAME_BYTES`` UTF-8 bytes (HDFS
``dfs.namenode.fs-limits.max-component-length``, POSIX ``NAME_MAX``) and at most
``MAX_PATH_CHARS`` characters in total (HDFS ``MAX_PATH_LENGTH``). POSIX ``PATH_MAX`` (4096)
limits one system call's argument, not how deep a tree is: a tree ext4 holds, reached with
relative paths, must fit here too. The root is
``/``; a single trailing slash is tolerated (``/a/`` is ``/a``), as shells produce them.

``split`` returns the components; ``join``/``parent``/``basename`` never produce an invalid
path from valid input. ``normalize_user_path`` is the forgiving client-side form used by the
CLI and fsspec (collapses ``//`` and resolves ``.``/``..`` like a shell would); the server
never does that, so a wire request with ``//`` or ``..`` is refused with ``InvalidPath``.
"""

from __future__ import annotations

import functools

import posixpath

from .errors import InvalidPath, NameTooLong

MAX_NAME_BYTES = 255
MAX_PATH_CHARS = 8000
ROOT = "/"


def split(path) -> list[str]:
    """Validate ``path`` and return its components ([] for the root)."""
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a string, got {type(path).__name__}")
    return list(_split(path))


@functools.lru_cache(maxsize=65536)
def _split(path: str) -> tuple[str, ...]:
    """``split`` of a string, memoized: every metadata RPC splits its path several times
    (locks, permission chain, planner); errors are raised again each time (not cached)."""
    if not path.startswith("/"):
        raise InvalidPath(f"path {path!r:.300} is not absolute")
    if "\0" in path:
        raise InvalidPath(f"path {path!r:.300} contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise NameTooLong(f"path {path[:100]!r}... is longer than {MAX_PATH_CHARS} characters")
    if path == "/":
        return ()
    body = path[1:-1] if path.endswith("/") else path[1:]
    parts = body.split("/")
    for part in parts:
        if part == "":
            raise InvalidPath(f"path {path!r:.300} has an empty component")
        if part in (".", ".."):
            raise InvalidPath(f"path {path!r:.300} has a {part!r} component")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise NameTooLong(f"path {path!r:.300}: component {part[:60]!r}... is longer "
                              f"than {MAX_NAME_BYTES} bytes")
    return tuple(parts)


def validate(path) -> str:
    """The canonical form of a valid path (no trailing slash), or ``InvalidPath``."""
    return join_parts(split(path))


def join_parts(parts) -> str:
    return "/" + "/".join(parts)


def join(parent: str, name: str) -> str:
    return parent.rstrip("/") + "/" + name if parent != "/" else "/" + name


def parent(path: str) -> str:
    parts = split(path)
    return join_parts(parts[:-1])


def basename(path: str) -> str:
    parts = split(path)
    return parts[-1] if parts else ""


def is_ancestor(ancestor: str, path: str) -> bool:
    """True if ``ancestor`` is ``path`` or one of its ancestors (both canonical)."""
    return ancestor == "/" or path == ancestor or path.startswith(ancestor + "/")


def normalize_user_path(path: str, cwd: str = "/") -> str:
    """Shell-like normalisation for paths typed by people; the result is then validated."""
    if not path:
        raise InvalidPath("empty path")
    if not path.startswith("/"):
        path = posixpath.join(cwd, path)
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    return validate(norm)
