"""The floor of a pyfuse3 + trio filesystem: an in-memory one (a dict of inodes, no
server, no disk) mounted with the same pyfuse3 build and the same kernel cache timeouts as
the leasefs mount, for ``bench apps --floor`` and ``bench fuse --floor`` to run on beside
leasefs and MooseFS (``FloorMount``; by hand: ``python -m tools.bench.fusefloor DIR``).

Why: what leasefs's mount costs per request is partly its own work and partly what every
request costs a Python FUSE filesystem (the kernel round trip, pyfuse3's request loop, a
trio task per request). The floor shows the second part alone: a figure leasefs cannot go
under, whatever its design, and so which targets a Python mount can reach at all.

Not a filesystem to keep data in: no permissions beyond the kernel's
(``default_permissions``), no hard links, no extended attributes, no locks (the kernel
keeps them per mount), everything gone at unmount. It answers what tar, git, sqlite3,
rm and cp ask of it, with POSIX results (tests/test_bench_apps.py).

Concurrency contract: one trio thread (pyfuse3's); every handler runs to completion
without awaiting, so nothing interleaves.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import tempfile
import time

import pyfuse3
import trio

from ..common import SOURCE_TREE

TIMEOUT = 1.0   # the leasefs mount's entry, attribute and negative timeouts (defaults)


class _Node:
    __slots__ = ("ino", "mode", "uid", "gid", "size", "data", "target", "atime_ns",
                 "mtime_ns", "ctime_ns", "entries", "nlink", "lookups")

    def __init__(self, ino: int, mode: int, uid: int, gid: int, target: bytes = b""):
        now = time.time_ns()
        self.ino, self.mode, self.uid, self.gid = ino, mode, uid, gid
        self.data = bytearray()
        self.target = target
        self.atime_ns = self.mtime_ns = self.ctime_ns = now
        self.entries: dict[bytes, int] | None = {} if stat.S_ISDIR(mode) else None
        self.nlink = 2 if stat.S_ISDIR(mode) else 1
        self.lookups = 0


def _error(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)


class FloorFS(pyfuse3.Operations):
    """The in-memory filesystem: inodes by number, folders as name -> inode dicts."""

    enable_writeback_cache = False

    def __init__(self):
        super().__init__()
        root = _Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, os.getuid(), os.getgid())
        self.nodes: dict[int, _Node] = {root.ino: root}
        self.next_ino = root.ino + 1
        self.open_dirs: dict[int, list] = {}
        self.next_fh = 1

    # ------------------------------------------------------------------ helpers
    def _attrs(self, node: _Node) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = node.ino
        attrs.generation = 0
        attrs.entry_timeout = TIMEOUT
        attrs.attr_timeout = TIMEOUT
        attrs.st_mode = node.mode
        attrs.st_nlink = node.nlink
        attrs.st_uid, attrs.st_gid = node.uid, node.gid
        attrs.st_rdev = 0
        size = len(node.target) if stat.S_ISLNK(node.mode) else len(node.data)
        attrs.st_size = size
        attrs.st_blksize = 4096
        attrs.st_blocks = (size + 511) // 512
        attrs.st_atime_ns, attrs.st_mtime_ns = node.atime_ns, node.mtime_ns
        attrs.st_ctime_ns = node.ctime_ns
        return attrs

    def _dir(self, ino: int) -> _Node:
        node = self.nodes.get(ino)
        if node is None:
            raise _error(errno.ENOENT)
        if node.entries is None:
            raise _error(errno.ENOTDIR)
        return node

    def _child(self, parent: _Node, name: bytes) -> _Node:
        ino = parent.entries.get(name)
        if ino is None:
            raise _error(errno.ENOENT)
        return self.nodes[ino]

    def _touch(self, node: _Node) -> None:
        node.mtime_ns = node.ctime_ns = time.time_ns()

    def _make(self, parent_inode: int, name: bytes, mode: int, ctx,
              target: bytes = b"") -> _Node:
        parent = self._dir(parent_inode)
        if name in parent.entries:
            raise _error(errno.EEXIST)
        node = _Node(self.next_ino, mode, ctx.uid, ctx.gid, target)
        if parent.mode & stat.S_ISGID:
            node.gid = parent.gid
            if stat.S_ISDIR(mode):
                node.mode |= stat.S_ISGID
        self.next_ino += 1
        self.nodes[node.ino] = node
        parent.entries[name] = node.ino
        if node.entries is not None:
            parent.nlink += 1
        self._touch(parent)
        node.lookups += 1
        return node

    def _drop(self, node: _Node) -> None:
        if node.nlink <= 0 and node.lookups <= 0:
            self.nodes.pop(node.ino, None)

    # ------------------------------------------------------------------ names
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._dir(parent_inode)
        if name == b".":
            node = parent
        elif name == b"..":
            raise _error(errno.ENOENT)   # the kernel answers ".." itself
        else:
            ino = parent.entries.get(name)
            if ino is None:
                attrs = pyfuse3.EntryAttributes()
                attrs.st_ino = 0
                attrs.entry_timeout = TIMEOUT
                return attrs
            node = self.nodes[ino]
        node.lookups += 1
        return self._attrs(node)

    async def forget(self, inode_list):
        for ino, count in inode_list:
            node = self.nodes.get(ino)
            if node is not None:
                node.lookups -= count
                self._drop(node)

    async def getattr(self, inode, ctx=None):
        node = self.nodes.get(inode)
        if node is None:
            raise _error(errno.ENOENT)
        return self._attrs(node)

    async def setattr(self, inode, attr, fields, fh, ctx):
        node = self.nodes[inode]
        now = time.time_ns()
        if fields.update_size:
            size = attr.st_size
            if size < len(node.data):
                del node.data[size:]
            else:
                node.data.extend(bytes(size - len(node.data)))
            node.mtime_ns = now
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | (attr.st_mode & 0o7777)
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
        node.ctime_ns = now
        return self._attrs(node)

    async def readlink(self, inode, ctx):
        return self.nodes[inode].target

    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._attrs(self._make(parent_inode, name, stat.S_IFDIR | (mode & 0o7777), ctx))

    async def symlink(self, parent_inode, name, target, ctx):
        return self._attrs(self._make(parent_inode, name, stat.S_IFLNK | 0o777, ctx, target))

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise _error(errno.EOPNOTSUPP)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise _error(errno.EPERM)   # as leasefs: no hard links

    async def unlink(self, parent_inode, name, ctx):
        parent = self._dir(parent_inode)
        node = self._child(parent, name)
        if node.entries is not None:
            raise _error(errno.EISDIR)
        del parent.entries[name]
        node.nlink -= 1
        node.ctime_ns = time.time_ns()
        self._touch(parent)
        self._drop(node)

    async def rmdir(self, parent_inode, name, ctx):
        parent = self._dir(parent_inode)
        node = self._child(parent, name)
        if node.entries is None:
            raise _error(errno.ENOTDIR)
        if node.entries:
            raise _error(errno.ENOTEMPTY)
        del parent.entries[name]
        parent.nlink -= 1
        node.nlink = 0
        self._touch(parent)
        self._drop(node)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags,
                     ctx):
        if flags:
            raise _error(errno.EINVAL)   # no RENAME_EXCHANGE / RENAME_NOREPLACE
        old, new = self._dir(parent_inode_old), self._dir(parent_inode_new)
        node = self._child(old, name_old)
        replaced = new.entries.get(name_new)
        if replaced == node.ino:
            return
        if node.entries is not None:
            up = new
            while up.ino != pyfuse3.ROOT_INODE:   # not into itself
                if up.ino == node.ino:
                    raise _error(errno.EINVAL)
                up = self.nodes[self._parent_of(up.ino)]
        if replaced is not None:
            gone = self.nodes[replaced]
            if gone.entries is not None:
                if node.entries is None:
                    raise _error(errno.EISDIR)
                if gone.entries:
                    raise _error(errno.ENOTEMPTY)
                new.nlink -= 1
                gone.nlink = 0
            elif node.entries is not None:
                raise _error(errno.ENOTDIR)
            else:
                gone.nlink -= 1
            self._drop(gone)
        del old.entries[name_old]
        new.entries[name_new] = node.ino
        if node.entries is not None and old is not new:
            old.nlink -= 1
            new.nlink += 1
        node.ctime_ns = time.time_ns()
        self._touch(old)
        self._touch(new)

    def _parent_of(self, ino: int) -> int:
        for node in self.nodes.values():
            if node.entries is not None and ino in node.entries.values():
                return node.ino
        return pyfuse3.ROOT_INODE

    # ------------------------------------------------------------------ folders
    async def opendir(self, inode, ctx):
        node = self._dir(inode)
        fh = self.next_fh
        self.next_fh += 1
        self.open_dirs[fh] = sorted(node.entries.items())
        return fh

    async def readdir(self, fh, start_id, token):
        listing = self.open_dirs[fh]
        for index in range(start_id, len(listing)):
            name, ino = listing[index]
            node = self.nodes.get(ino)
            if node is None:
                continue
            if not pyfuse3.readdir_reply(token, name, self._attrs(node), index + 1):
                return
            node.lookups += 1

    async def releasedir(self, fh):
        self.open_dirs.pop(fh, None)

    async def fsyncdir(self, fh, datasync):
        pass

    async def statfs(self, ctx):
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = 4096
        out.f_blocks = out.f_bfree = out.f_bavail = 1 << 30
        out.f_files = out.f_ffree = out.f_favail = 1 << 30
        out.f_namemax = 255
        return out

    # ------------------------------------------------------------------ files
    async def create(self, parent_inode, name, mode, flags, ctx):
        node = self._make(parent_inode, name, stat.S_IFREG | (mode & 0o7777), ctx)
        return pyfuse3.FileInfo(fh=node.ino), self._attrs(node)

    async def open(self, inode, flags, ctx):
        node = self.nodes[inode]
        if flags & os.O_TRUNC:
            del node.data[:]
            self._touch(node)
        return pyfuse3.FileInfo(fh=inode)

    async def read(self, fh, off, size):
        return bytes(self.nodes[fh].data[off:off + size])

    async def write(self, fh, off, buf):
        node = self.nodes[fh]
        data = node.data
        if off > len(data):
            data.extend(bytes(off - len(data)))
        data[off:off + len(buf)] = buf
        self._touch(node)
        return len(buf)

    async def flush(self, fh):
        pass

    async def fsync(self, fh, datasync):
        pass

    async def release(self, fh):
        pass


def run_floor(mountpoint: str, ready=None) -> None:
    """Mount the floor filesystem at ``mountpoint`` until it is unmounted (``fusermount3
    -u``) or the process is interrupted."""
    ops = FloorFS()
    options = set(pyfuse3.default_options) | {"fsname=leasefs-floor", "subtype=floor"}
    pyfuse3.init(ops, mountpoint, options)
    try:
        if ready is not None:
            ready()
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


class FloorMount:
    """The floor filesystem mounted for one benchmark run: in a child process of its own
    (as a real mount is), on a fresh folder; ``stop`` unmounts it and removes the folder."""

    def __init__(self, status):
        self.status = status
        self.folder: str | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.folder = tempfile.mkdtemp(prefix=".leasefs-bench-floor-")
        self.status(f"mounting the in-memory floor filesystem at {self.folder}")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tools.bench.fusefloor", self.folder], cwd=SOURCE_TREE,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + MOUNT_WAIT
        while not os.path.ismount(self.folder):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                said = self._proc.communicate(timeout=5)[1].decode(errors="replace") \
                    if self._proc.poll() is not None else "no mount within " \
                    f"{MOUNT_WAIT:g} s"
                self.stop()
                raise RuntimeError(f"--floor: the floor filesystem did not mount: "
                                   f"{said.strip()[-500:]}")
            time.sleep(0.05)
        return self.folder

    def stop(self) -> None:
        if self.folder is None:
            return
        if os.path.ismount(self.folder):
            subprocess.run(["fusermount3", "-u", self.folder], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
        try:
            os.rmdir(self.folder)
        except OSError:
            pass
        self.folder = None


MOUNT_WAIT = 20.0

__all__ = ["FloorFS", "FloorMount", "run_floor"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.bench.fusefloor MOUNTPOINT")
    run_floor(sys.argv[1])
