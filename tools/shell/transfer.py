"""Copying files and whole trees between the cluster and the local disk: ``put``, ``get``,
``cp`` (cluster↔cluster, local↔cluster with ``file:`` URLs).

Why one engine for three commands: the rules are the same whatever the two sides are — a
source tree is planned first (so a name clash is reported before a single byte moves and the
progress bar knows the total), files are copied in large chunks into ``<name>._COPYING_``
and renamed into place at the end (as ``hdfs dfs -put`` does), so a copy that fails or is
interrupted never leaves a half-written file under the real name.

A "side" (``LocalSide``, ``ClusterSide``) offers the handful of file operations a copy needs;
errors are raised as they come (``OSError`` locally, ``LeaseFSError`` from the cluster) and
reported per source by the caller.

Concurrency contract: synchronous, main thread; the cluster side goes through the sync
``Client`` facade (one client per CLI process).
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import stat as _stat
from dataclasses import dataclass

from fs import paths
from fs.errors import FileExists, FileNotFound, InvalidArgument, IsDirectory, NotDirectory

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes per read/write call: large, so per-call overhead is noise
TMP_SUFFIX = "._COPYING_"


@dataclass
class Entry:
    kind: str  # "file" | "dir" | "other"
    size: int = 0


@dataclass(frozen=True)
class Attributes:
    """What ``-p`` carries from a source to its copy (HDFS: timestamps, ownership, mode)."""

    mode: int            # permission bits, sticky bit included
    owner: str
    group: str
    atime_ns: int
    mtime_ns: int


@dataclass
class Step:
    kind: str  # "mkdir" | "file"
    src: str
    dst: str
    size: int = 0


class LocalSide:
    """The local disk; paths are whatever the user typed (relative to the cwd)."""

    local = True

    def stat(self, path: str) -> Entry | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if _stat.S_ISDIR(st.st_mode):
            return Entry("dir")
        if _stat.S_ISREG(st.st_mode):
            return Entry("file", st.st_size)
        return Entry("other")

    def children(self, path: str):
        with os.scandir(path) as it:
            names = sorted(e.name for e in it)
        for name in names:
            child = os.path.join(path, name)
            yield name, child, self.stat(child)

    def join(self, parent: str, name: str) -> str:
        return os.path.join(parent, name)

    def parent(self, path: str) -> str:
        return os.path.dirname(os.path.abspath(path))

    def basename(self, path: str) -> str:
        return os.path.basename(os.path.normpath(path))

    def contains(self, ancestor: str, path: str) -> bool:
        a, p = os.path.realpath(ancestor), os.path.realpath(path)
        return p == a or p.startswith(a.rstrip("/") + "/")

    def mkdirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def open_read(self, path: str):
        return open(path, "rb", buffering=0)

    def open_write(self, path: str, options: dict):
        return open(path, "wb", buffering=0)

    def publish(self, tmp: str, path: str, overwrite: bool) -> None:
        if overwrite:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)  # atomic "rename unless it exists"
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links: check, then rename
            if os.path.lexists(path):
                raise FileExistsError(_errno.EEXIST, "File exists", path) from None
            os.replace(tmp, path)
            return
        os.unlink(tmp)

    def remove_quietly(self, path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    def attributes(self, path: str) -> Attributes:
        import grp
        import pwd

        st = os.stat(path)
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = str(st.st_gid)
        return Attributes(st.st_mode & 0o7777, owner, group, st.st_atime_ns, st.st_mtime_ns)

    def apply(self, path: str, attrs: Attributes) -> None:
        """Owner and group (by name; an unknown name is an error, as chown(1)), then the
        mode, then the times, so that nothing after them moves the times again."""
        import grp
        import pwd

        try:
            uid = pwd.getpwnam(attrs.owner).pw_uid
            gid = grp.getgrnam(attrs.group).gr_gid
        except KeyError as exc:
            raise item_error(InvalidArgument, path, f"cannot preserve the owner: no local "
                                                    f"user or group {exc.args[0]}") from None
        st = os.stat(path)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(path, uid if st.st_uid != uid else -1, gid)
        os.chmod(path, attrs.mode)
        os.utime(path, ns=(attrs.atime_ns, attrs.mtime_ns))


class ClusterSide:
    """The leasefs namespace through the public ``Client``."""

    local = False

    def __init__(self, client):
        self.client = client

    def stat(self, path: str) -> Entry | None:
        try:
            st = self.client.get_file_status(path)
        except FileNotFound:
            return None
        return self._entry(st)

    @staticmethod
    def _entry(st) -> Entry:
        if st.type == "dir":
            return Entry("dir")
        if st.type == "file":
            return Entry("file", st.length)
        return Entry("other")

    def children(self, path: str):
        for st in self.client.iter_status(path):
            yield st.name, paths.join(path, st.name), self._entry(st)

    def join(self, parent: str, name: str) -> str:
        return paths.join(parent, name)

    def parent(self, path: str) -> str:
        return paths.parent(path)

    def basename(self, path: str) -> str:
        return paths.basename(path)

    def contains(self, ancestor: str, path: str) -> bool:
        return paths.is_ancestor(ancestor, path)

    def mkdirs(self, path: str) -> None:
        self.client.mkdirs(path)

    def open_read(self, path: str):
        return self.client.open(path)

    def open_write(self, path: str, options: dict):
        return self.client.create(path, overwrite=True, replication=options.get("replication"),
                                  block_size=options.get("block_size"))

    def publish(self, tmp: str, path: str, overwrite: bool) -> None:
        self.client.rename(tmp, path, overwrite=overwrite)

    def remove_quietly(self, path: str) -> None:
        try:
            self.client.delete(path)
        except Exception:
            log.debug("could not remove %s", path, exc_info=True)

    def attributes(self, path: str) -> Attributes:
        st = self.client.get_file_status(path)
        return Attributes(st.mode & 0o7777, st.owner, st.group, st.atime_ns, st.mtime_ns)

    def apply(self, path: str, attrs: Attributes) -> None:
        """As ``LocalSide.apply``; the owner is only set when it differs (changing it needs
        the superuser, keeping it does not)."""
        st = self.client.get_file_status(path)
        if (st.owner, st.group) != (attrs.owner, attrs.group):
            self.client.set_owner(path, owner=attrs.owner if st.owner != attrs.owner else None,
                                  group=attrs.group)
        self.client.set_permission(path, attrs.mode)
        self.client.set_times(path, mtime_ns=attrs.mtime_ns, atime_ns=attrs.atime_ns)


def target_for(src_side, src: str, dst_side, dst: str, dst_entry: Entry | None) -> str:
    """Where ``src`` lands: inside ``dst`` when that is an existing directory, else ``dst``."""
    if dst_entry is not None and dst_entry.kind == "dir":
        name = src_side.basename(src)
        if not name:
            raise item_error(InvalidArgument, src, "cannot copy the root into a directory; name a target")
        return dst_side.join(dst, name)
    return dst


def item_error(cls, path: str, cause: str):
    """A ``LeaseFSError`` that names exactly the item it is about (``leasefs put: <item>: ...``)."""
    exc = cls(f"{path}: {cause}")
    exc.item_path = path
    return exc


def plan(src_side, src: str, dst_side, dst: str, *, overwrite: bool) -> list[Step]:
    """Every directory to create and file to copy for ``src`` → ``dst``, checked up front:
    a missing source, a file/directory clash or (without ``overwrite``) an existing file
    raises before anything is written."""
    top = src_side.stat(src)
    if top is None:
        raise item_error(FileNotFound, src, "no such file or directory")
    if top.kind == "other":
        raise item_error(InvalidArgument, src, "not a regular file or directory")
    if top.kind == "dir" and src_side is dst_side and dst_side.contains(src, dst):
        raise item_error(InvalidArgument, src, f"cannot copy a directory into itself ({dst})")
    steps: list[Step] = []
    existing = dst_side.stat(dst)
    if existing is None:  # like cp(1): the target's folder must exist, it is not invented
        parent = dst_side.parent(dst)
        holder = dst_side.stat(parent)
        if holder is None:
            raise item_error(FileNotFound, dst, f"parent directory {parent} does not exist")
        if holder.kind != "dir":
            raise item_error(NotDirectory, dst, f"parent {parent} is not a directory")
    _plan_into(src_side, src, top, dst_side, dst, existing, overwrite, steps)
    return steps


def _plan_into(src_side, src, entry, dst_side, dst, existing, overwrite, steps):
    if entry.kind == "file":
        if existing is not None:
            if existing.kind == "dir":
                raise item_error(IsDirectory, dst, f"is a directory; cannot overwrite it with file {src}")
            if not overwrite:
                raise item_error(FileExists, dst, "file exists (use -f to overwrite)")
        steps.append(Step("file", src, dst, entry.size))
        return
    if existing is not None and existing.kind != "dir":
        raise item_error(NotDirectory, dst, f"exists and is not a directory; cannot copy directory {src} there")
    steps.append(Step("mkdir", src, dst))
    for name, child, child_entry in src_side.children(src):
        if child_entry is None or child_entry.kind == "other":
            log.warning("%s: not a regular file or directory, skipped", child)
            continue
        child_dst = dst_side.join(dst, name)
        child_existing = dst_side.stat(child_dst) if existing is not None else None
        _plan_into(src_side, child, child_entry, dst_side, child_dst, child_existing,
                   overwrite, steps)


def copy_file(src_side, src: str, dst_side, dst: str, *, overwrite: bool, progress=None,
              options: dict | None = None, chunk: int = CHUNK) -> int:
    """Copy one file through ``<dst>._COPYING_`` and a final rename; returns bytes copied."""
    tmp = tmp_name(dst_side, dst)
    copied = 0
    try:
        with src_side.open_read(src) as reader, dst_side.open_write(tmp, options or {}) as writer:
            copied = pump(reader, writer, progress=progress, chunk=chunk)
        dst_side.publish(tmp, dst, overwrite)
    except BaseException:
        dst_side.remove_quietly(tmp)
        raise
    return copied


def tmp_name(side, path: str) -> str:
    if side.local:
        head, tail = os.path.split(path)
        return os.path.join(head, tail + TMP_SUFFIX)
    return path + TMP_SUFFIX


def pump(reader, writer, *, progress=None, chunk: int = CHUNK) -> int:
    """Move everything from ``reader`` to ``writer`` in ``chunk``-sized pieces."""
    total = 0
    while True:
        data = reader.read(chunk)
        if not data:
            return total
        written = writer.write(data)
        if written is not None and written < len(data):  # a raw writer took only part
            view = memoryview(data)[written:]
            while view:
                written = writer.write(view)
                view = view[len(view) if written is None else written:]
        total += len(data)
        if progress is not None:
            progress.update(len(data))


def run_steps(steps, src_side, dst_side, *, overwrite: bool, progress=None,
              options: dict | None = None, preserve: bool = False) -> int:
    """Carry out a ``plan``; ``preserve`` (``-p``): then give every copy its source's
    times, owner and mode, a folder after everything in it (copying into a folder moves
    its times)."""
    total = 0
    for step in steps:
        if step.kind == "mkdir":
            dst_side.mkdirs(step.dst)
        else:
            total += copy_file(src_side, step.src, dst_side, step.dst, overwrite=overwrite,
                               progress=progress, options=options)
    if preserve:
        for step in reversed(steps):
            dst_side.apply(step.dst, src_side.attributes(step.src))
    return total
