"""``LeaseFS``: the pyfuse3 ``Operations`` of a leasefs mount over ONE ``fs.client.AsyncClient``.

Why: the mount is a thin translation layer (DESIGN.md §7) — a FUSE request becomes one
client call (the server decides POSIX errors and answers the statuses the kernel needs) and
the result becomes ``EntryAttributes`` or a ``FUSEError`` (mapped in ``mount.errors`` only).
The kernel caches names, misses and attributes for the mount's timeouts and keeps pages of
files unchanged since their last open for reading (DESIGN.md, "caching"). The mount is one
lease holder: every file it writes is leased to its one client, whose renewer keeps the
leases alive while files are open.

``LeaseFS`` is the translator: it owns the mount's parts, made in this order, each given
what it needs, and each handler below calls one of them; the parts call each other only
through their public methods.

* ``OpenFiles`` (``mount.openfiles``): the table of open files, file and folder handles.
* ``KernelView`` (``mount.kernelview``): the inode ↔ path table, the attributes the
  kernel caches, and the caches that answer without asking the server.
* ``DirLeaseHolder`` (``mount.dirleases``): the folders this mount holds the write lease
  of, and the queue of changes answered ahead of the metadata server (the client's
  ``barrier``); off with ``dir_leases=False`` (``-o sync_namespace``).
* ``Writer`` (``mount.writes``): what writes, flushes, truncates and releases do to the
  cluster, the local staging files, closes completed after an outage.
* ``Names`` (``mount.names``): the namespace requests.
* ``Files`` (``mount.files``): the open-file requests and the mount's housekeeping.
* ``MountLocks`` (``mount.locks``): flock and fcntl locks, held on the metadata server so
  every mount sees them (with pyfuse3's lock handlers: ``deploy/pyfuse3-locks.patch``).

Writes: a file opened for writing streams sequential writes into an ``AsyncOutputStream``
(the fast path; a file created under a folder lease first into a ``mount.drafts.Draft``,
which holds a small file's bytes and becomes a stream when it needs one); a growing truncate appends zeros to it, a shrinking one is the
``truncate`` RPC. A write at another offset, a read of a file being written, or shrinking
a file being written moves the file to a local staging file (under the cache folder) that
is uploaded (truncate to 0, append: the lease rules apply and the inode stays) at
flush/fsync/release. Errors surface in ``flush``/``fsync`` so ``close(2)`` sees them. While
a file is open the mount reports its own size for it at once.

Concurrency contract: all handlers run as tasks of the one trio run that ``pyfuse3.main``
drives; they call the async client directly. Per-file state changes are serialised by that
file's ``trio.Lock``, which every handler changing an open file takes before its first
await (the asynchronous release of a closed file may run at any await). Staging-file I/O
follows ``mount.staging``: reads and writes of a few pages are page-cache copies on the
trio thread, everything else runs in worker threads (``trio.to_thread``) limited by one
``CapacityLimiter``. ``fuse_op`` (``mount.errors``) wraps each handler here: errnos,
metrics, the caller's identity.
"""

from __future__ import annotations

import errno
import os

import pyfuse3
import trio

from fs.client import FileSettings

from .errors import fuse_error, fuse_op
from .dirleases import DirLeaseHolder
from .files import Files
from .kernelview import ROOT_INO, KernelView
from .locks import MountLocks
from .metrics import MountMetrics
from .names import Names
from .openfiles import OpenFiles
from .writes import Writer


class LeaseFS(pyfuse3.Operations):
    """The FUSE operations of a leasefs mount."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, client, cache_dir: str, *, entry_timeout: float = 1.0,
                 attr_timeout: float = 1.0, negative_timeout: float = 1.0, io_threads: int = 4,
                 cache_limit: int = 8 << 30, file_settings: FileSettings | None = None,
                 root: str = "/", root_ino: int | None = None, dir_leases: bool = True):
        super().__init__()
        # what the mount's user chose for new files (``--set block_size=...``)
        file_settings = file_settings or FileSettings()
        self.open_files = OpenFiles()
        # ``root``: the cluster folder the mount shows at its top (MooseFS mfsmount -S, a
        # subfolder mount); ``root_ino`` is that folder's namespace inode, the FUSE root
        self.view = KernelView(client, self.open_files, root=root, root_ino=root_ino,
                               entry_timeout=entry_timeout, attr_timeout=attr_timeout,
                               negative_timeout=negative_timeout)
        # ``dir_leases`` False: every namespace change is synchronous (-o sync_namespace)
        self.leases = DirLeaseHolder(
            client, self.view.known_path,
            lambda ino: self.open_files.get(self.view.kernel_ino(ino)) is not None,
            enabled=dir_leases, timeout=client.config.rpc_timeout,
            paths_gen=lambda: self.view.paths_gen, kernel_ino=self.view.kernel_ino)
        self.view.watch_paths(self.leases.holds)
        if dir_leases:
            client.barrier = self.leases.barrier
        self.metrics = MountMetrics(client, self.leases)   # counted by fuse_op (mount.errors)
        self.writer = Writer(client, self.view, self.open_files, self.leases,
                             cache_dir=cache_dir, cache_limit=cache_limit,
                             file_settings=file_settings, io_threads=io_threads)
        self.names = Names(client, self.view, self.open_files, self.writer, self.leases,
                           root=root)
        self.files = Files(client, self.view, self.open_files, self.writer, self.leases,
                           file_settings=file_settings)
        self.locks = MountLocks(client, self.view, self.open_files, self.writer)
        os.makedirs(cache_dir, exist_ok=True)

    def handle_identity(self, fh: int) -> dict | None:
        """Who opened file or directory handle ``fh`` (``mount.callers``)."""
        return self.open_files.identity(fh)

    async def run_background(self) -> None:
        """The mount's housekeeping tasks (started by the runner next to ``pyfuse3.main``):
        closes completed after an outage, the directory leases' sender and recalls, the
        locks' keep-alive."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.files.run_background)
            nursery.start_soon(self.leases.run)
            nursery.start_soon(self.locks.keep_alive)

    async def close_all(self) -> None:
        """Publish and forget every open file, give back every lock, and send every
        change made here ahead of the server, giving the directory leases back (the
        mount is going away)."""
        await self.files.close_all()
        await self.locks.release_all()
        await self.leases.close()

    # ================================================================== names, attributes
    @fuse_op
    async def lookup(self, parent_inode, name, ctx=None):
        return await self.names.lookup(parent_inode, name)

    def forget(self, inode_list):
        self.view.forget(inode_list)

    @fuse_op
    async def getattr(self, inode, ctx=None):
        return await self.names.getattr(inode)

    @fuse_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        return await self.names.setattr(inode, attr, fields, fh)

    @fuse_op
    async def access(self, inode, mode, ctx):
        return await self.names.access(inode)

    @fuse_op
    async def statfs(self, ctx):
        return await self.names.statfs()

    # ================================================================== folders
    @fuse_op
    async def opendir(self, inode, ctx):
        return await self.names.opendir(inode)

    @fuse_op
    async def readdir(self, fh, start_id, token):
        return await self.names.readdir(fh, start_id, token)

    @fuse_op
    async def releasedir(self, fh):
        return await self.names.releasedir(fh)

    @fuse_op
    async def fsyncdir(self, fh, datasync):
        return await self.files.fsyncdir(fh, datasync)

    # ================================================================== namespace changes
    @fuse_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        return await self.names.mkdir(parent_inode, name, mode, ctx)

    @fuse_op
    async def rmdir(self, parent_inode, name, ctx):
        return await self.names.rmdir(parent_inode, name)

    @fuse_op
    async def unlink(self, parent_inode, name, ctx):
        return await self.names.unlink(parent_inode, name)

    @fuse_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        return await self.names.rename(parent_inode_old, name_old, parent_inode_new,
                                       name_new, flags)

    @fuse_op
    async def symlink(self, parent_inode, name, target, ctx):
        return await self.names.symlink(parent_inode, name, target, ctx)

    @fuse_op
    async def readlink(self, inode, ctx):
        return await self.names.readlink(inode)

    @fuse_op
    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise fuse_error(errno.EPERM)   # no hard links in the namespace (as HDFS)

    @fuse_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise fuse_error(errno.EOPNOTSUPP)   # no device nodes, FIFOs or sockets

    # ================================================================== open files
    @fuse_op
    async def create(self, parent_inode, name, mode, flags, ctx):
        return await self.files.create(parent_inode, name, mode, flags, ctx)

    @fuse_op
    async def open(self, inode, flags, ctx):
        return await self.files.open(inode, flags)

    @fuse_op
    async def read(self, fh, off, size):
        return await self.files.read(fh, off, size)

    @fuse_op
    async def write(self, fh, off, buf):
        return await self.files.write(fh, off, buf)

    @fuse_op
    async def flush(self, fh):
        return await self.files.flush(fh)

    @fuse_op
    async def fsync(self, fh, datasync):
        return await self.files.fsync(fh, datasync)

    @fuse_op
    async def release(self, fh):
        return await self.files.release(fh)

    # ================================================================== locks
    # (called by pyfuse3 built with deploy/pyfuse3-locks.patch; a stock pyfuse3 never
    # calls them and the kernel keeps locks per mount)
    @fuse_op
    async def getlk(self, fh, inode, lock_owner, l_type, start, length, pid):
        return await self.locks.getlk(inode, fh, lock_owner, l_type, start, length, pid)

    @fuse_op
    async def setlk(self, fh, inode, lock_owner, l_type, start, length, pid, sleep,
                    interrupted):
        return await self.locks.setlk(inode, fh, lock_owner, l_type, start, length, pid,
                                      sleep, interrupted)

    @fuse_op
    async def flock(self, fh, inode, lock_owner, op, interrupted):
        return await self.locks.flock(inode, fh, lock_owner, op, interrupted)

    async def release_posix_locks(self, fh, inode, lock_owner):
        # every close(2) comes here; without a lock held there is nothing to end, and
        # the request's wrapper (its caller, its metrics) would cost a fifth of a close
        if self.locks.any_held():
            await self._release_posix_locks(fh, inode, lock_owner)

    @fuse_op
    async def _release_posix_locks(self, fh, inode, lock_owner):
        return await self.locks.release_posix_locks(inode, fh, lock_owner)

    @fuse_op
    async def release_flock(self, fh, inode, lock_owner):
        return await self.locks.release_flock(inode, fh, lock_owner)


__all__ = ["LeaseFS", "ROOT_INO"]
