"""fsspec filesystem for leasefs: ``leasefs://host:port/path`` (``leasefs:///path`` = default cluster;
``leasefs://h1:p1,h2:p2/path`` or ``LEASEFS_META=h1:p1,h2:p2``: the HA list of metadata servers).

Why: pandas, pyarrow and dask reach storage through fsspec; this adapter makes a leasefs
cluster one of those stores (DESIGN.md §6), registered through the ``fsspec.specs`` entry
point ``leasefs``. It is a thin layer over the public blocking ``fs.Client``: every
namespace call is one client call, reads are ranged ``pread``s (or one streamed read while
access is sequential), writes go straight into a real output stream that holds the file's
lease, and ``mv`` is a real rename (the inode is kept).

Concurrency contract: one ``fs.Client`` per filesystem instance, created in ``__init__``;
the client is thread-safe, so any number of threads may use one instance (and its open
files, one thread per file at a time). fsspec caches instances per constructor arguments
(the cluster address) and thread, and drops its cache after a fork; a pickled instance
rebuilds itself (and a fresh client) from its arguments, so it travels to other processes.
Nothing here runs inside a trio run: the client's trio loop lives on its own thread.
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import io
import logging
import os
import posixpath
import re
import time
import uuid
from contextlib import contextmanager

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from fs.client import Client, FileStatus
from fs.config import Config, find_meta_address
from fs.errors import (DirectoryNotEmpty, FileExists, FileNotFound, InvalidToken, IsDirectory,
                       LeaseFSError, NotDirectory, PermissionDenied)

log = logging.getLogger(__name__)

__all__ = ["LeaseFSFileSystem", "LeaseFSFile", "to_builtin_error"]

PROTOCOL = "leasefs"
#: bytes moved per client call when streaming whole files (copy, put, get)
COPY_CHUNK = 4 << 20
_TYPES = {"file": "file", "dir": "directory", "symlink": "link"}
_BUILTIN_ERRORS = (
    (FileNotFound, FileNotFoundError),
    (FileExists, FileExistsError),
    (IsDirectory, IsADirectoryError),
    (NotDirectory, NotADirectoryError),
    (PermissionDenied, PermissionError),
    (InvalidToken, PermissionError),
)


def to_builtin_error(exc: LeaseFSError, path: str | None = None) -> OSError:
    """The built-in ``OSError`` subclass fsspec callers expect for ``exc`` (same errno, the
    leasefs message, which names path and cause, and ``filename`` = ``path``)."""
    for ours, builtin in _BUILTIN_ERRORS:
        if isinstance(exc, ours):
            return builtin(ours.errno, exc.message or str(exc), path)
    return OSError(exc.errno, exc.message or str(exc), path)


@contextmanager
def _mapped(path: str | None = None):
    """Turn leasefs errors raised inside the block into built-in ``OSError``s."""
    try:
        yield
    except LeaseFSError as exc:
        raise to_builtin_error(exc, path) from exc


def _utc(ns: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


def _has_magic(path: str) -> bool:
    return any(ch in path for ch in "*?[")


class LeaseFSFileSystem(AbstractFileSystem):
    """``fsspec`` filesystem over one leasefs cluster.

    ``LeaseFSFileSystem()`` uses the default cluster (``fs.config.find_meta_address``:
    ``LEASEFS_META``, the embedded cluster's state file, the config file);
    ``LeaseFSFileSystem("host:port")`` (or an HA list ``"h1:p1,h2:p2"``) or ``host=...,
    port=...`` name one. ``config``,
    ``user`` and ``groups`` go to ``fs.Client``.
    """

    protocol = PROTOCOL
    root_marker = "/"
    cachable = True

    def __init__(self, meta_address: str | None = None, *, host: str | None = None,
                 port: int | None = None, config: Config | None = None,
                 user: str | None = None, groups: list[str] | None = None, **kwargs):
        super().__init__(meta_address, host=host, port=port, config=config, user=user,
                         groups=groups, **kwargs)
        if meta_address is None and host:
            if port is None:
                port = int(Config().meta_address.rsplit(":", 1)[1])
            meta_address = f"{host}:{int(port)}"
        self.explicit_address = meta_address
        self.meta_address = find_meta_address(meta_address)
        with _mapped():
            self.client = Client(self.meta_address, config=config, user=user, groups=groups)

    def close(self) -> None:
        """Close the client (completing files still open for writing) and forget this
        instance in fsspec's cache."""
        self.client.close()
        type(self)._cache.pop(getattr(self, "_fs_token_", None), None)

    # ------------------------------------------------------------------ URLs
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith(f"{PROTOCOL}://"):
            rest = path[len(PROTOCOL) + 3:]
            slash = rest.find("/")
            path = rest[slash:] if slash >= 0 else "/"
        elif path.startswith(f"{PROTOCOL}:"):
            path = path[len(PROTOCOL) + 1:]
        path = re.sub("/+", "/", "/" + path)
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        path = stringify_path(path)
        if not path.startswith(f"{PROTOCOL}://"):
            return {}
        netloc = path[len(PROTOCOL) + 3:].split("/", 1)[0]
        if not netloc:
            return {}
        if "," in netloc:   # an HA list of metadata servers: leasefs://h1:p1,h2:p2/path
            return {"meta_address": netloc}
        host, sep, port = netloc.rpartition(":")
        if not sep or not port.isdigit():
            return {"host": netloc}
        return {"host": host, "port": int(port)}

    def unstrip_protocol(self, name: str) -> str:
        path = self._strip_protocol(name)
        return f"{PROTOCOL}://{self.explicit_address or ''}{path}"

    # ------------------------------------------------------------------ status
    def _info_from_status(self, status: FileStatus, path: str) -> dict:
        info = {
            "name": path,
            "size": status.length if status.type == "file" else 0,
            "type": _TYPES.get(status.type, "other"),
            "mtime": status.mtime_ns / 1e9,
            "created": status.ctime_ns / 1e9,
            "mode": status.mode,
            "owner": status.owner,
            "group": status.group,
            "ino": status.ino,
            "replication": status.replication,
            "block_size": status.block_size,
            "islink": status.type == "symlink",
            "under_construction": status.under_construction,
        }
        if status.symlink is not None:
            info["destination"] = status.symlink
        return info

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        with _mapped(path):
            return self._info_from_status(self.client.get_file_status(path), path)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        out = []
        with _mapped(path):
            for status in self.client.iter_status(path):
                if status.type != "dir" and status.path == path:
                    name = path                        # a file lists itself
                else:
                    name = posixpath.join(path, status.name)
                out.append(self._info_from_status(status, name))
        return out if detail else [entry["name"] for entry in out]

    def exists(self, path, **kwargs):
        with _mapped(path):
            return self.client.exists(self._strip_protocol(path))

    def checksum(self, path):
        """A stable token of the file version: inode, length and modification time (leasefs
        keeps no whole-file content hash, and hashing the content would read it all)."""
        info = self.info(path)
        key = f"{info['ino']}:{info['size']}:{info['mtime']!r}".encode()
        return int(hashlib.sha256(key).hexdigest()[:32], 16)

    def modified(self, path):
        path = self._strip_protocol(path)
        with _mapped(path):
            return _utc(self.client.get_file_status(path).mtime_ns)

    def created(self, path):
        """leasefs (like HDFS) keeps no birth time: the inode change time is returned."""
        path = self._strip_protocol(path)
        with _mapped(path):
            return _utc(self.client.get_file_status(path).ctime_ns)

    def du(self, path, total=True, maxdepth=None, withdirs=False, **kwargs):
        if total and maxdepth is None and isinstance(path, str) and not _has_magic(path):
            path = self._strip_protocol(path)
            with _mapped(path):
                return int(self.client.content_summary(path)["length"])
        return super().du(path, total=total, maxdepth=maxdepth, withdirs=withdirs, **kwargs)

    # ------------------------------------------------------------------ directories
    def mkdir(self, path, create_parents=True, permission=0o755, **kwargs):
        path = self._strip_protocol(path)
        with _mapped(path):
            if self.client.exists(path):
                raise FileExistsError(errno.EEXIST, f"mkdir {path}: already exists", path)
            if not create_parents:
                parent = self._parent(path)
                if not self.client.exists(parent):
                    raise FileNotFoundError(errno.ENOENT, f"mkdir {path}: parent {parent} "
                                            "does not exist", path)
                if not self.client.get_file_status(parent).is_dir:
                    raise NotADirectoryError(errno.ENOTDIR, f"mkdir {path}: parent {parent} "
                                             "is not a directory", path)
            self.client.mkdirs(path, permission)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        with _mapped(path):
            if not exist_ok and self.client.exists(path):
                raise FileExistsError(errno.EEXIST, f"makedirs {path}: already exists", path)
            self.client.mkdirs(path)

    def rmdir(self, path):
        path = self._strip_protocol(path)
        with _mapped(path):
            if not self.client.get_file_status(path).is_dir:
                raise NotADirectoryError(errno.ENOTDIR, f"rmdir {path}: not a directory", path)
            self.client.delete(path, recursive=False)

    # ------------------------------------------------------------------ delete
    def _delete_one(self, path: str, recursive: bool) -> None:
        with _mapped(path):
            status = self.client.get_file_status(path)
            if status.is_dir and not recursive:
                raise IsADirectoryError(errno.EISDIR, f"rm {path}: is a directory "
                                        "(use recursive=True)", path)
            self.client.delete(path, recursive=recursive)

    def rm_file(self, path):
        path = self._strip_protocol(path)
        with _mapped(path):
            if self.client.get_file_status(path).is_dir:
                raise IsADirectoryError(errno.EISDIR, f"rm_file {path}: is a directory", path)
            self.client.delete(path)

    def rm(self, path, recursive=False, maxdepth=None):
        """Delete files or directories; a directory tree goes in one ``delete`` call unless
        ``maxdepth`` limits the walk (then only what lies within it goes, and directories
        still holding deeper entries stay)."""
        if maxdepth is not None and recursive:
            for p in reversed(self.expand_path(path, recursive=True, maxdepth=maxdepth)):
                with _mapped(p):
                    try:
                        self.client.delete(p, recursive=False)
                    except DirectoryNotEmpty:
                        pass
            return
        if isinstance(path, str) and not _has_magic(path):
            self._delete_one(self._strip_protocol(path), recursive)
            return
        targets = self.expand_path(path, recursive=False)
        # parents before children: a recursive delete of a parent removes its children
        for p in sorted(targets):
            try:
                self._delete_one(p, recursive)
            except FileNotFoundError:
                if not recursive:
                    raise

    # ------------------------------------------------------------------ rename
    def _rename(self, src: str, dst: str) -> None:
        """``mv src dst`` with POSIX shell semantics: into ``dst`` when it is a directory,
        replacing ``dst`` when it is a file."""
        with _mapped(src):
            try:
                target = self.client.get_file_status(dst)
            except (FileNotFound, NotDirectory):
                target = None
            if target is not None and target.is_dir:
                dst = posixpath.join(dst, posixpath.basename(src))
                self.client.rename(src, dst)
            else:
                self.client.rename(src, dst, overwrite=target is not None)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """A real rename (one metadata call per source; inode ids are kept)."""
        if isinstance(path1, str) and not _has_magic(path1):
            src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
            if src != dst:
                self._rename(src, dst)
            return
        sources = self.expand_path(path1, recursive=False)
        if isinstance(path2, list):
            if len(path2) != len(sources):
                raise ValueError(f"mv: {len(sources)} sources but {len(path2)} targets")
            for src, dst in zip(sources, self._strip_protocol(path2)):
                self._rename(src, dst)
            return
        target = self._strip_protocol(path2)
        self.makedirs(target, exist_ok=True)
        for src in sources:
            self._rename(src, target)

    def rename(self, path1, path2, **kwargs):
        self.mv(path1, path2, **kwargs)

    # ------------------------------------------------------------------ files
    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        return LeaseFSFile(self, self._strip_protocol(path), mode, block_size or "default",
                           autocommit=autocommit, cache_options=cache_options, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        with _mapped(path):
            stream = self.client.open(path)
            try:
                size = stream.length
                start = 0 if start is None else (max(0, size + start) if start < 0 else start)
                end = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
                if end <= start:
                    return b""
                if start == 0:
                    return stream.read(end)
                return stream.pread(start, end - start)
            finally:
                stream.close()

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if self._intrans:
            self._write_deferred(path, io.BytesIO(bytes(value)), overwrite=mode != "create",
                                 callback=DEFAULT_CALLBACK, kwargs=kwargs)
            return
        with _mapped(path):
            self.client.write_file(path, bytes(value), overwrite=mode != "create",
                                   **_create_options(kwargs))

    def touch(self, path, truncate=True, **kwargs):
        """``truncate``: (re)create the file empty; else create it if missing, or set its
        modification time to now."""
        path = self._strip_protocol(path)
        with _mapped(path):
            if not truncate and self.client.exists(path):
                self.client.set_times(path, mtime_ns=time.time_ns())
                return
        self.pipe_file(path, b"", **kwargs)

    def _copy_stream(self, reader, writer, callback) -> None:
        while True:
            data = reader.read(COPY_CHUNK)
            if not data:
                return
            writer.write(data)
            callback.relative_update(len(data))

    def _write_from(self, path: str, reader, *, overwrite: bool, callback, kwargs) -> None:
        """Create ``path`` and fill it from ``reader``; on failure the half-written file
        is given up and deleted. In a transaction the file is written like ``open(path,
        "wb")`` writes it: under a hidden name, renamed into place at commit."""
        if self._intrans:
            self._write_deferred(path, reader, overwrite=overwrite, callback=callback,
                                 kwargs=kwargs)
            return
        out = self.client.create(path, overwrite=overwrite, **_create_options(kwargs))
        try:
            self._copy_stream(reader, out, callback)
        except BaseException:
            out.abort()
            try:
                self.client.delete(path)
            except LeaseFSError:
                pass
            raise
        out.close()

    def _write_deferred(self, path: str, reader, *, overwrite: bool, callback,
                        kwargs) -> None:
        """The transaction's part of ``_write_from``: a file the transaction commits or
        discards; a write that fails is discarded at once and left out of the commit."""
        out = self.open(path, "wb" if overwrite else "xb", **_create_options(kwargs))
        try:
            self._copy_stream(reader, out, callback)
            out.close()
        except BaseException:
            out.discard()
            if out in self.transaction.files:
                self.transaction.files.remove(out)
            raise

    def cp_file(self, path1, path2, callback=DEFAULT_CALLBACK, **kwargs):
        """Copy inside the cluster, streamed through this client (a directory source makes
        the target directory)."""
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        with _mapped(src):
            status = self.client.get_file_status(src)
            if status.is_dir:
                self.client.mkdirs(dst)
                return
            reader = self.client.open(src)
            try:
                callback.set_size(reader.length)
                self._write_from(dst, reader, overwrite=True, callback=callback,
                                 kwargs=kwargs)
            finally:
                reader.close()

    def put_file(self, lpath, rpath, callback=DEFAULT_CALLBACK, mode="overwrite", **kwargs):
        rpath = self._strip_protocol(rpath)
        lpath = os.fspath(lpath)
        with _mapped(rpath):
            if os.path.isdir(lpath):
                self.client.mkdirs(rpath)
                return
            with open(lpath, "rb") as reader:
                callback.set_size(os.fstat(reader.fileno()).st_size)
                self._write_from(rpath, reader, overwrite=mode != "create",
                                 callback=callback, kwargs=kwargs)

    def get_file(self, rpath, lpath=None, callback=DEFAULT_CALLBACK, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if outfile is None and hasattr(lpath, "write"):
            outfile = lpath
        with _mapped(rpath):
            if self.client.get_file_status(rpath).is_dir:
                if outfile is None:
                    os.makedirs(lpath, exist_ok=True)
                return
            reader = self.client.open(rpath)
            try:
                callback.set_size(reader.length)
                if outfile is not None:
                    self._copy_stream(reader, outfile, callback)
                    return
                lpath = os.fspath(lpath)
                os.makedirs(os.path.dirname(lpath) or ".", exist_ok=True)
                with open(lpath, "wb") as writer:
                    self._copy_stream(reader, writer, callback)
            finally:
                reader.close()


def _create_options(kwargs: dict) -> dict:
    """The ``fs.Client.create`` options a caller may pass through fsspec calls."""
    return {k: kwargs[k] for k in ("replication", "permission") if kwargs.get(k) is not None}


class LeaseFSFile(AbstractBufferedFile):
    """A leasefs file opened through fsspec.

    Reading (``rb``): fsspec's cache asks ``_fetch_range``, served by one streamed read
    while access is sequential and by ``pread`` otherwise. Writing (``wb``, ``xb``, ``ab``):
    the output stream is opened in the constructor, so the lease is taken (and ``xb`` fails
    with ``FileExistsError``) at ``open`` time; every buffered chunk is written through to
    the pipeline and closing completes the file. With ``autocommit=False`` (an fsspec
    transaction) a new file is written under a hidden temporary name in the same folder and
    ``commit`` renames it into place (``ab`` appends in place even then); ``discard`` gives
    the stream up and deletes the new file (for ``ab``: the file stays, and lease recovery
    later closes it at what its block servers hold).
    """

    DEFAULT_BLOCK_SIZE = 4 << 20

    def __init__(self, fs: LeaseFSFileSystem, path, mode="rb", block_size="default",
                 autocommit=True, cache_type="readahead", cache_options=None, **kwargs):
        self._reader = None
        self._writer = None
        self._committed = False
        self._write_path = path
        client = fs.client
        with _mapped(path):
            if mode == "rb":
                stream = client.open(path)
                self._reader = stream
                kwargs.setdefault("size", stream.length)
            elif mode in ("wb", "xb"):
                options = _create_options(kwargs)
                if not autocommit:
                    if mode == "xb" and client.exists(path):
                        raise FileExistsError(errno.EEXIST, f"{path}: already exists", path)
                    parent, name = posixpath.split(path)
                    self._write_path = posixpath.join(
                        parent, f".{name}.leasefs-tmp-{uuid.uuid4().hex}")
                self._writer = client.create(self._write_path, overwrite=mode == "wb",
                                             **options)
            elif mode == "ab":
                try:
                    self._writer = client.append(path)
                except FileNotFound:
                    self._writer = client.create(path, **_create_options(kwargs))
        for key in ("replication", "permission"):
            kwargs.pop(key, None)
        try:
            super().__init__(fs, path, mode, block_size, autocommit, cache_type=cache_type,
                             cache_options=cache_options, **kwargs)
        except BaseException:
            self._release()
            raise
        if self._writer is not None:
            self.loc = self._writer.tell()     # appends continue at the file's end

    # ------------------------------------------------------------------ reading
    def _fetch_range(self, start, end):
        end = min(end, self.size)
        if end <= start:
            return b""
        with _mapped(self.path):
            if start == self._reader.tell():   # sequential: keep streaming on one connection
                return self._reader.read(end - start)
            return self._reader.pread(start, end - start)

    # ------------------------------------------------------------------ writing
    def _initiate_upload(self):
        """The stream already exists (opened with the file); nothing to start."""

    def _upload_chunk(self, final=False):
        data = self.buffer.getvalue()
        with _mapped(self.path):
            if data:
                self._writer.write(data)
            if final:
                self._writer.close()
                if self.autocommit:
                    self._committed = True
        return True

    def commit(self):
        """Publish the written file: with autocommit the closed stream already is the
        file; in a transaction the temporary file is renamed into place."""
        if self._write_path != self.path and not self._committed:
            with _mapped(self.path):
                if self.mode == "xb" and self.fs.client.exists(self.path):
                    self.fs.client.delete(self._write_path)
                    raise FileExistsError(errno.EEXIST, f"{self.path}: already exists",
                                          self.path)
                self.fs.client.rename(self._write_path, self.path, overwrite=True)
        self._committed = True

    def discard(self):
        """Give the written data up: abort the stream and delete the file it wrote."""
        writer, self._writer = self._writer, None
        if writer is None or self._committed:
            return
        if not writer.closed:
            writer.abort()
        if self.mode != "ab":
            try:
                self.fs.client.delete(self._write_path)
            except LeaseFSError as exc:
                log.warning("discard %s: could not delete %s: %s", self.path,
                            self._write_path, exc)
        self.closed = True

    # ------------------------------------------------------------------ life cycle
    def _close_reader(self) -> None:
        """Closing a reader only drops its connections: nothing to report if that fails
        (e.g. a file garbage-collected after its filesystem was closed)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            try:
                reader.close()
            except LeaseFSError as exc:
                log.debug("closing reader of %s: %s", self.path, exc)

    def _release(self) -> None:
        self._close_reader()
        writer, self._writer = self._writer, None
        if writer is not None and not writer.closed:
            writer.abort()

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        except BaseException:
            self._release()
            raise
        self._close_reader()
        if self.autocommit:
            self._writer = None             # a transaction still needs it for discard
