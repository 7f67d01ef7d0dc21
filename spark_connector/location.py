"""Where the data is: ``leasefs://`` URLs, the per-process client, and file listing with
globs, hidden names and ``key=value`` partition folders.

Why: every part of the connector (schema inference and planning on the driver, reads and
writes in Python workers, job commit) has to turn a user path into a cluster address plus a
namespace path, talk to the cluster through ONE ``fs.Client`` per process (a client is a
lease holder with a background thread; creating one per task would cost a connection and a
lease each time), and agree on which files make up a dataset: names starting with ``_`` or
``.`` are not data (``_SUCCESS``, ``_temporary``, ``.part`` files), exactly as Hadoop's
``FileInputFormat`` hides them.

Concurrency contract: plain blocking code. ``client_for`` may be called from any thread; the
cache is guarded by a lock and keyed by process id too, so a forked Python worker never
reuses its parent's client (whose trio thread did not survive the fork).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import posixpath
import re
import threading
from dataclasses import dataclass, field

from fs.client import Client, FileStatus
from fs.config import find_meta_address
from fs.rpc import normalize_address_list
from fs.errors import FileNotFound, InvalidArgument, NotDirectory

from .partitioning import unescape_path_name

log = logging.getLogger(__name__)

SCHEME = "leasefs://"
GLOB_CHARS = re.compile(r"[*?\[]")
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

_clients: dict[tuple[int, str], Client] = {}
_clients_lock = threading.Lock()


@dataclass(frozen=True)
class Location:
    """A resolved user path: the metadata server address and the namespace path."""

    meta: str
    path: str

    def url(self, path: str | None = None) -> str:
        return f"{SCHEME}{self.meta}{path if path is not None else self.path}"


def parse_location(text: str, meta_option: str | None = None) -> Location:
    """``leasefs://host:port/dir``, ``leasefs:///dir`` (default cluster) or ``/dir`` (the
    ``meta`` option, else the default cluster) → ``Location``. The address may be an HA list
    of metadata servers, ``leasefs://h1:p1,h2:p2/dir`` or ``meta=h1:p1,h2:p2``."""
    if not text:
        raise InvalidArgument("leasefs data source: no path given (load(path) / save(path))")
    if text.startswith(SCHEME):
        rest = text[len(SCHEME):]
        slash = rest.find("/")
        host, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
        meta = host or meta_option or find_meta_address()
    elif text.startswith("/"):
        meta, path = meta_option or find_meta_address(), text
    else:
        raise InvalidArgument(f"leasefs data source: {text!r} is neither leasefs://host:port/path"
                              f" nor an absolute path")
    path = posixpath.normpath(path) if path not in ("", "/") else "/"
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    # one spelling per cluster (paths of one job are compared by it); a bad entry of an HA
    # list (leasefs://h1:p1,h2:p2/dir or the meta option) is named here
    return Location(normalize_address_list(meta), path)


def client_for(meta: str) -> Client:
    """The process's one ``Client`` for the cluster at ``meta`` (created on first use)."""
    key = (os.getpid(), meta)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = Client(meta)
            _clients[key] = client
        return client


def is_hidden(name: str) -> bool:
    """Hadoop's hidden-file rule: ``_SUCCESS``, ``_temporary``, ``.crc``... are not data."""
    return name.startswith("_") or name.startswith(".")


@dataclass
class DataFile:
    """One input file: its status and the partition values from ``key=value`` folders."""

    path: str
    length: int
    mtime_ns: int
    block_size: int
    partition: dict[str, str | None] = field(default_factory=dict)


def partition_values(base: str, path: str) -> dict[str, str | None]:
    """``key=value`` folder names between ``base`` and the file ``path``, unescaped as
    Spark does (``partitioning.unescape_path_name``)."""
    rel = posixpath.relpath(posixpath.dirname(path), base) if _under(path, base) else ""
    values: dict[str, str | None] = {}
    for part in rel.split("/"):
        if "=" in part and not part.startswith("="):
            key, value = part.split("=", 1)
            value = unescape_path_name(value)
            values[unescape_path_name(key)] = None if value == DEFAULT_PARTITION else value
    return values


def _walk(client: Client, status: FileStatus, out: list[FileStatus]) -> None:
    """Files below a directory (recursively), hidden names skipped."""
    if status.is_file:
        out.append(status)
        return
    if not status.is_dir:
        return
    for entry in client.iter_status(status.path):
        if is_hidden(entry.name):
            continue
        _walk(client, entry, out)


def _expand_glob(client: Client, pattern: str) -> list[FileStatus]:
    """Statuses of every path matching ``pattern`` (``*``, ``?``, ``[..]`` per component;
    hidden names never match a wildcard)."""
    parts = [p for p in pattern.split("/") if p]
    current: list[FileStatus] = [client.get_file_status("/")]
    for part in parts:
        nxt: list[FileStatus] = []
        for parent in current:
            if not parent.is_dir:
                continue
            if GLOB_CHARS.search(part):
                for entry in client.iter_status(parent.path):
                    if not is_hidden(entry.name) and fnmatch.fnmatchcase(entry.name, part):
                        nxt.append(entry)
            else:
                try:
                    nxt.append(client.get_file_status(posixpath.join(parent.path, part)))
                except (FileNotFound, NotDirectory):
                    pass
        current = nxt
    return current


def glob_base(path: str) -> str:
    """The folder before the first wildcard component (partition columns are relative to it)."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if GLOB_CHARS.search(part):
            return "/".join(parts[:i]) or "/"
    return path


@dataclass(frozen=True)
class ListingOptions:
    """Spark's generic file-source read options that choose files: ``pathGlobFilter`` (a
    glob on the file NAME), ``recursiveFileLookup`` (no partition values), and
    ``modifiedBefore`` / ``modifiedAfter`` (exclusive bounds, ns since the epoch)."""

    name_glob: str | None = None
    recursive: bool = False
    modified_before_ns: int | None = None
    modified_after_ns: int | None = None

    @classmethod
    def of(cls, options) -> "ListingOptions":
        def get(name):
            return options.get(name.lower()) if options else None

        def instant(name):
            import datetime
            text = get(name)
            if text is None:
                return None
            try:
                value = datetime.datetime.fromisoformat(str(text).strip())
            except ValueError:
                raise InvalidArgument(f"leasefs data source: {name} {text!r} is not a "
                                      f"timestamp YYYY-MM-DDTHH:mm:ss") from None
            if value.tzinfo is None:      # the session time zone; timestamps here are UTC
                value = value.replace(tzinfo=datetime.timezone.utc)
            return int(value.timestamp() * 1_000_000) * 1000

        recursive = str(get("recursiveFileLookup") or "false").strip().lower() == "true"
        return cls(get("pathGlobFilter"), recursive, instant("modifiedBefore"),
                   instant("modifiedAfter"))

    def keeps(self, st: FileStatus) -> bool:
        if self.name_glob and not fnmatch.fnmatchcase(st.name, self.name_glob):
            return False
        if self.modified_before_ns is not None and st.mtime_ns >= self.modified_before_ns:
            return False
        if self.modified_after_ns is not None and st.mtime_ns <= self.modified_after_ns:
            return False
        return True


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def list_data_files(client: Client, path: str, *, filters: ListingOptions | None = None,
                    base_path: str | None = None) -> list[DataFile]:
    """Every data file under ``path`` (a file, a folder walked recursively, or a glob),
    sorted by path, with the partition values found between the base and each file;
    ``filters`` drops files (and partition values) as Spark's listing options do.
    The base is ``base_path`` (Spark's ``basePath`` option: partition discovery starts
    there, so ``basePath=/t`` with path ``/t/k=1`` keeps column ``k``; it must be ``path``
    or a folder above it), else the folder given (before any wildcard), or a file's own
    folder."""
    if base_path is not None and GLOB_CHARS.search(base_path):
        raise InvalidArgument(f"leasefs data source: basePath {base_path!r} must be a folder, "
                              f"not a glob")
    if GLOB_CHARS.search(path):
        roots = _expand_glob(client, path)
        base = glob_base(path)
    else:
        roots = [client.get_file_status(path)]   # FileNotFound names the path
        base = path if roots[0].is_dir else posixpath.dirname(path)
    if base_path is not None:
        for root in roots:
            if not _under(root.path, base_path):
                raise InvalidArgument(f"leasefs data source: basePath {base_path} is not a "
                                      f"folder above {root.path} (read from {path})")
        base = base_path
    statuses: list[FileStatus] = []
    for root in roots:
        _walk(client, root, statuses)
    seen: set[str] = set()
    files = []
    for st in sorted(statuses, key=lambda s: s.path):
        if st.path in seen or st.under_construction:
            continue   # a file still being written is not data yet
        if filters is not None and not filters.keeps(st):
            continue
        seen.add(st.path)
        files.append(DataFile(st.path, st.length, st.mtime_ns, st.block_size or (128 << 20),
                              {} if filters is not None and filters.recursive
                              else partition_values(base, st.path)))
    return files
