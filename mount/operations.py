"""``LeaseFS``: the pyfuse3 ``Operations`` adapter over ONE ``fs.client.AsyncClient``.

Why: the mount is a thin translation layer (DESIGN.md §7) — a FUSE request becomes one
client call (the server decides POSIX errors and answers the statuses the kernel needs) and
the result becomes ``EntryAttributes`` or a ``FUSEError`` (mapped in ``mount.errors`` only).
The kernel caches names, misses and attributes for the mount's timeouts and keeps pages of
files unchanged since their last open for reading (DESIGN.md, "caching"). The mount is one lease holder: every file it writes is leased to its
one client, whose renewer keeps the leases alive while files are open.

Inodes: namespace inode ids are the FUSE inode numbers (root = 1). ``_nodes`` maps each inode
the kernel knows to its current path and lookup count (pyfuse3 rules: +1 per lookup,
create, mkdir, symlink and readdir entry; ``forget`` subtracts; a node with count 0 and no
open file is dropped). A rename rewrites the paths of the moved subtree. When the mount
replaces the content of a file it is writing with ``create(overwrite=True)`` (``O_TRUNC``
of its own stream) the namespace hands out a new id; ``_alias`` maps it back to the number
the kernel already holds. The table and the attributes built from statuses live in
``mount.kernelview`` (``KernelView``, a mixin of ``LeaseFS``).

Open files: ``mount.openfiles`` holds the per-inode state (``OpenFile`` and its mode
table) and the per-handle state; ``mount.files`` (``FileHandlers``, a mixin of ``LeaseFS``)
answers the open-file requests (create, open, read, write, flush, fsync, release) and
``mount.writes`` (``WriteMachinery``, another mixin) carries writes to the cluster; this
module answers the namespace requests. Writes: a file opened for writing
streams sequential writes into an ``AsyncOutputStream`` (the fast path); a growing truncate
appends zeros to it, a shrinking one is the ``truncate`` RPC. A write at another offset, a
read of a file being written, or shrinking a file being written moves the file to a local
staging file (under the cache folder) that is uploaded (truncate to 0, append: the lease
rules apply and the inode stays) at flush/fsync/release. Errors surface in
``flush``/``fsync`` so ``close(2)`` sees them. While a file is open the mount reports its
own size for it at once.

Concurrency contract: all handlers run as tasks of the one trio run that ``pyfuse3.main``
drives; they call the async client directly. Per-file state changes are serialised by that
file's ``trio.Lock``, which every handler changing an open file takes before its first
await (the asynchronous release of a closed file may run at any await). Staging-file I/O
follows ``mount.staging``: reads and writes of a few pages are page-cache copies on the
trio thread, everything else runs in worker threads (``trio.to_thread``) limited by one
``CapacityLimiter``.
"""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3
import trio

from fs.client import FileSettings, FileStatus
from fs.errors import FileNotFound
from fs.rpc import group_name, user_name

from .errors import fuse_error, fuse_op
from .metrics import MountMetrics
from .files import FileHandlers
from .kernelview import ASK, KernelView, Listing
from .openfiles import CopyBudget, DirHandle, FileMode, Handle, Node, OpenFile
from .writes import WriteMachinery

log = logging.getLogger(__name__)

ROOT_INO = pyfuse3.ROOT_INODE
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
READDIR_PAGE = 1000


class LeaseFS(FileHandlers, WriteMachinery, KernelView, pyfuse3.Operations):
    """The FUSE operations of a leasefs mount."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, client, cache_dir: str, *, entry_timeout: float = 1.0,
                 attr_timeout: float = 1.0, negative_timeout: float = 1.0, io_threads: int = 4,
                 cache_limit: int = 8 << 30, file_settings: FileSettings | None = None,
                 root: str = "/", root_ino: int | None = None):
        super().__init__()
        self.client = client
        # the cluster folder the mount shows at its top (MooseFS mfsmount -S): a subfolder
        # mount; ``root_ino`` is that folder's namespace inode, shown as the FUSE root
        self.root = root
        self.metrics = MountMetrics(client)   # counted by fuse_op (mount.errors)
        # what the mount's user chose for new files (``--set block_size=...``)
        self.file_settings = file_settings or FileSettings()
        self.cache_dir = cache_dir
        self.cache_limit = cache_limit
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout
        self.negative_timeout = negative_timeout
        # (mtime, ctime, length) of each closed file when it was last opened for reading
        # here: an open that finds the same stamp keeps the kernel's cached pages
        self._read_stamps: dict[int, tuple[int, int, int]] = {}
        # parent directories' statuses a change answered with, kept for the getattr the
        # kernel sends next: it drops a directory's attributes after every change in it and
        # (default_permissions) asks again at the next path walk. Directories only (no
        # write path changes them); served once, within attr_timeout of the answer (the
        # kernel would have cached them that long); dropped by any handler addressing a
        # name in the directory or changing it (_child, setattr), and not kept at all when
        # another such handler started while the change was in flight (_named counts them:
        # its answer may predate that handler's change).
        self._fresh: dict[int, tuple[float, FileStatus]] = {}
        self._statfs: tuple[float, dict] | None = None   # (when, the report statfs answered)
        self._named = 0
        self._io_limiter = trio.CapacityLimiter(io_threads)
        self._nodes: dict[int, Node] = {ROOT_INO: Node(ROOT_INO, root)}
        self._nodes[ROOT_INO].lookups = 1
        self._alias: dict[int, int] = {}
        if root_ino is not None and root_ino != ROOT_INO:
            self._alias[root_ino] = ROOT_INO
        self._open: dict[int, OpenFile] = {}
        self._copies = CopyBudget()   # what the open files' stream copies hold together
        self._handles: dict[int, Handle] = {}
        self._dirs: dict[int, DirHandle] = {}
        self._next_fh = 1
        # files whose last close reached every block server but not the metadata server
        # (unreachable for longer than the mount's timeout): completed in the background
        self._unfinished: list[tuple[int, object]] = []
        # directories this mount made: (known until, names made in them here since)
        self._new_dirs: dict[int, tuple[float, set[bytes]]] = {}
        # folder listings answering lookups (statahead, see mount.kernelview): by folder
        # path; their generation (a change here bumps it); lookups that asked the server,
        # per folder (since, count); folders too big to list (until)
        self._listings: dict[str, Listing] = {}
        self._listing_gen = 0
        self._asked: dict[str, tuple[float, int]] = {}
        self._too_big: dict[str, float] = {}
        # names a lookup here found missing: (folder path, name) -> until (trio time)
        self._misses: dict[tuple[str, bytes], float] = {}
        self._uid_cache: dict[str, int] = {}
        self._gid_cache: dict[str, int] = {}
        os.makedirs(cache_dir, exist_ok=True)

    # ================================================================== namespace handlers
    @fuse_op
    async def lookup(self, parent_inode, name, ctx=None):
        if name == b".":
            status = await self._status_of(parent_inode)
        elif name == b"..":
            path = self._path(parent_inode)
            parent = os.path.dirname(path) or "/"
            status = await self.client.get_file_status(parent)
            attrs = self._attrs(status)
            self._remember(attrs.st_ino, parent)
            return attrs
        else:
            path = self._child(parent_inode, name, changing=False)
            left = self._known_missing(parent_inode, name)
            if left is not None:
                return self._negative_entry(left)
            folder = self._path(parent_inode)
            left = self._cached_miss(folder, name)
            if left is not None:
                # the kernel looks a name up again before O_EXCL, link and rename whatever
                # it cached; the call that follows is decided by the server all the same
                return self._negative_entry(left)
            listed = self._listed(folder, name)
            if listed is not None and listed is not ASK:
                attrs = self._listed_attrs(*listed)
                self._remember(attrs.st_ino, path, listed[1])
                return attrs
            generation = self._listing_gen
            try:
                status = await self.client.get_file_status(path)
            except FileNotFound:
                if self.negative_timeout <= 0:
                    raise
                if generation == self._listing_gen:   # no change of ours since the ask
                    self._note_miss(folder, name)
                return self._negative_entry()
            attrs = self._attrs(status)
            self._remember(attrs.st_ino, path, status)
            if listed is None:
                await self._statahead(folder)   # names found one by one: list the folder
            return attrs
        attrs = self._attrs(status)
        attrs.st_ino = parent_inode
        self._nodes[parent_inode].lookups += 1
        return attrs

    def _negative_entry(self, timeout: float | None = None) -> pyfuse3.EntryAttributes:
        """A miss the kernel caches for ``negative_timeout`` (inode 0), or ``timeout`` when
        shorter. A name this mount creates meanwhile is no problem: the kernel turns its
        own negative entry into the new one at create, mkdir, symlink and rename."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = 0
        attr.entry_timeout = (self.negative_timeout if timeout is None
                              else min(timeout, self.negative_timeout))
        return attr

    def forget(self, inode_list):
        for ino, nlookup in inode_list:
            node = self._nodes.get(ino)
            if node is None or ino == ROOT_INO:
                continue
            node.lookups -= nlookup
            if node.lookups <= 0 and ino not in self._open:
                del self._nodes[ino]
                self._read_stamps.pop(ino, None)
                for ns, k in list(self._alias.items()):
                    if k == ino:
                        del self._alias[ns]

    @fuse_op
    async def getattr(self, inode, ctx=None):
        of = self._open.get(inode)
        node = self._nodes.get(inode)
        if of is not None and of.status is not None and (
                of.unlinked or node is None or node.path is None):
            return self._attrs(of.status)   # unlinked but open: still has attributes
        if (of is not None and of.status is not None and of.mode is FileMode.STREAM
                and trio.current_time() - of.status_at < self.attr_timeout):
            # written here under our lease: size and times are ours (``_attrs`` overlays
            # them); no call for the kernel's getattr before a chown or after a write
            return self._attrs(of.status)
        status = self._fresh_status(inode)
        if status is None and of is None:   # an open file's status is the server's own
            listed = await self._listed_status(inode)
            if listed is not None:
                return self._listed_attrs(*listed)
        if status is None:
            status = await self._status_of(inode)
        if of is not None:
            of.status = status
        return self._attrs(status)

    @fuse_op
    async def setattr(self, inode, attr, fields, fh, ctx):
        of = self._open.get(inode)
        self._fresh.pop(inode, None)
        self._touch_node(inode)
        if of is None:
            status = await self._set_attrs(inode, None, attr, fields, fh)
        else:
            # an open file's state (and its asynchronous release) changes only under its
            # lock: taken before the first await, so a release that completes the file
            # either ran before (then the times below land last) or sees pending_times
            async with of.lock:
                status = await self._set_attrs(inode, of if self._open.get(inode) is of
                                               else None, attr, fields, fh)
                if status is None and of.status is not None and not fields.update_size:
                    status = of.status   # nothing asked the server (kept times, no-op chown)
        if status is None:
            status = await self._status_of(inode)
        if of is not None:
            of.status = status
        return self._attrs(status)

    async def _set_attrs(self, inode: int, of: OpenFile | None, attr, fields, fh):
        """``setattr``'s changes; ``of`` (lock held) when the file is open here. Each call
        answers the status after it, so the usual one-field setattr (chmod, chown, utimens)
        is one round trip; the status after the last change, or None after a truncate."""
        path = self._path(inode)
        status = None
        # what a completion or upload still to come can carry waits for it (answered from
        # here meanwhile): tar sets mode and times of every file before its close
        later = of is not None and (of.mode is FileMode.STREAM
                                    or of.mode is FileMode.STAGING and of.dirty)
        if fields.update_mode:
            if of is not None:
                of.permission = attr.st_mode & 0o7777
            if later:
                of.pending_mode = attr.st_mode & 0o7777
            else:
                status = await self.client.set_permission(path, attr.st_mode & 0o7777,
                                                          want_status=True)
        if fields.update_uid or fields.update_gid:
            owner = user_name(attr.st_uid) if fields.update_uid else None
            group = group_name(attr.st_gid) if fields.update_gid else None
            # tar and cp -p chown what they just created to who created it: the kernel has
            # checked the caller may (default_permissions), and nothing would change
            if of is None or (owner or of.owner) != of.owner or (group or of.group) != of.group:
                status = await self.client.set_owner(path, owner, group, want_status=True)
                if of is not None:
                    of.owner, of.group = status.owner, status.group
        if fields.update_size:
            self._read_stamps.pop(inode, None)
            status = None
            if of is not None:
                await self._truncate_open(of, path, attr.st_size, by_handle=fh is not None)
            else:
                await self._truncate_closed(inode, path, attr.st_size)
        if fields.update_atime or fields.update_mtime:
            times = (attr.st_mtime_ns if fields.update_mtime else None,
                     attr.st_atime_ns if fields.update_atime else None)
            if later:   # the completion would replace them anyway
                of.pending_times = times
                return status
            status = await self.client.set_times(self._path(inode), mtime_ns=times[0],
                                                 atime_ns=times[1], want_status=True)
        return status

    def _identity(self, ctx) -> tuple[str | None, str | None]:
        """Owner and group for a new inode: the calling process's uid/gid (as names when
        the system knows them). ``None`` without a context (the server picks)."""
        if ctx is None:
            return None, None
        return user_name(ctx.uid), group_name(ctx.gid)

    def handle_identity(self, fh: int) -> dict | None:
        """Who opened file or directory handle ``fh`` (``mount.callers``)."""
        handle = self._handles.get(fh) or self._dirs.get(fh)
        return None if handle is None else handle.identity

    @fuse_op
    async def opendir(self, inode, ctx):
        # no call: the kernel opens only what it knows as a directory, and a directory
        # another client removed meanwhile fails at readdir (ENOENT)
        self._path(inode)
        fh = self._new_fh()
        self._dirs[fh] = DirHandle(inode)
        return fh

    @fuse_op
    async def readdir(self, fh, start_id, token):
        handle = self._dirs.get(fh)
        if handle is None:
            raise fuse_error(errno.EBADF)
        path = self._path(handle.ino)
        if start_id > len(handle.names):
            return
        if start_id < len(handle.names) or (start_id == 0 and handle.complete):
            handle.rewind(start_id)
        while True:
            # what the last page brought beyond the kernel's full buffer goes first: a folder
            # costs one call per page, and none for the kernel's last, empty readdir
            while handle.fetched:
                entry = handle.fetched[0]
                attrs = self._attrs(entry)
                if not pyfuse3.readdir_reply(token, os.fsencode(entry.name), attrs,
                                             len(handle.names) + 1):
                    return
                handle.fetched.popleft()
                handle.names.append(entry.name)
                child = "/" + entry.name if path == "/" else f"{path}/{entry.name}"
                self._remember(attrs.st_ino, child, entry)
            if handle.complete:
                return
            start_after = handle.names[-1] if handle.names else ""
            entries, more = await self.client.list_page(path, start_after, READDIR_PAGE)
            for entry in entries:
                if entry.path == path:   # a file lists itself: no longer a directory
                    raise fuse_error(errno.ENOTDIR)
            handle.fetched.extend(entries)
            handle.complete = not more or not entries

    @fuse_op
    async def releasedir(self, fh):
        self._dirs.pop(fh, None)

    @fuse_op
    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._child(parent_inode, name)
        named = self._named
        owner, group = self._identity(ctx)
        # one call: EEXIST, ENOENT (parent gone) and ENOTDIR come from the server
        made = await self.client.mkdir(path, permission=mode & 0o7777, owner=owner,
                                       group=group)
        self._keep_fresh(named, made.parent)
        attrs = self._attrs(made.status)
        self._remember(attrs.st_ino, path)
        self._note_made(parent_inode, name)
        self._note_new_dir(attrs.st_ino)
        return attrs

    @fuse_op
    async def rmdir(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        named = self._named
        gone = await self.client.rmdir(path)   # ENOTDIR, ENOTEMPTY from the server
        self._drop_new_dirs(parent_inode)
        self._keep_fresh(named, gone.parent)
        self._forget_path(self._kernel_ino(gone.status.ino))

    def _forget_path(self, ino: int) -> None:
        node = self._nodes.get(ino)
        if node is not None:
            node.path = None

    @fuse_op
    async def unlink(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        named = self._named
        if self._open_at(path):
            # a file open here: staged before it goes, so its handles keep their content
            status = await self.client.get_file_status(path)
            if status.is_dir:
                raise fuse_error(errno.EISDIR)
            await self._detach(self._kernel_ino(status.ino), path)
        gone = await self.client.unlink(path)   # EISDIR from the server
        self._drop_new_dirs(parent_inode)
        self._keep_fresh(named, gone.parent)
        ino = self._kernel_ino(gone.status.ino)
        self._check_gone(ino, path)
        self._forget_path(ino)

    def _open_at(self, path: str) -> bool:
        """Whether a file open here (and not yet detached) has ``path`` as far as this mount
        knows: its node's path (another client's rename moves it unseen)."""
        for ino, of in self._open.items():
            node = self._nodes.get(ino)
            if node is not None and node.path == path and not of.unlinked:
                return True
        return False

    def _check_gone(self, ino: int, path: str) -> None:
        """After an unlink or a rename over ``path`` removed inode ``ino``: an open file here
        that was not detached first (another client had moved it to ``path``) lost its
        content; its handles get errors from now on, which the log says."""
        of = self._open.get(ino)
        if of is not None and not of.unlinked:
            log.warning("%s (inode %d) was removed while open here under another name; "
                        "its open handles lose their content", path, ino)
            of.unlinked = True

    @fuse_op
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        if flags & RENAME_EXCHANGE:
            raise fuse_error(errno.EINVAL)
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        named = self._named
        overwrite = not (flags & RENAME_NOREPLACE)
        if overwrite and self._open_at(dst):
            # replacing a file open here: staged before it goes, as at unlink
            dst_status = await self.client.get_file_status(dst)
            if not dst_status.is_dir:
                await self._detach(self._kernel_ino(dst_status.ino), dst)
        # one call: EEXIST (NOREPLACE), EISDIR/ENOTDIR/ENOTEMPTY come from the server
        moved = await self.client.move(src, dst, overwrite=overwrite)
        self._drop_new_dirs(parent_inode_old, parent_inode_new)
        self._keep_fresh(named, moved.src_parent, moved.parent)
        if moved.replaced is not None:
            replaced = self._kernel_ino(moved.replaced.ino)
            if not moved.replaced.is_dir:
                self._check_gone(replaced, dst)
            self._forget_path(replaced)
        node = self._nodes.get(self._kernel_ino(moved.status.ino))
        if node is not None:
            node.path = dst
        if moved.status.is_dir:   # the paths of what the kernel knows below it move too
            self._drop_listings()
            prefix = src + "/"
            for node in self._nodes.values():
                if node.path is not None and node.path.startswith(prefix):
                    node.path = dst + node.path[len(src):]

    @fuse_op
    async def symlink(self, parent_inode, name, target, ctx):
        path = self._child(parent_inode, name)
        named = self._named
        owner, group = self._identity(ctx)
        made = await self.client.symlink(os.fsdecode(target), path, owner=owner, group=group)
        self._note_made(parent_inode, name)
        self._keep_fresh(named, made.parent)
        attrs = self._attrs(made.status)
        self._remember(attrs.st_ino, path, made.status)
        return attrs

    @fuse_op
    async def readlink(self, inode, ctx):
        node = self._nodes.get(inode)
        if node is not None and node.target is not None:
            return os.fsencode(node.target)   # no call: the kernel does not cache it
        status = await self._status_of(inode)
        if not status.is_symlink:
            raise fuse_error(errno.EINVAL)
        return os.fsencode(status.symlink or "")

    @fuse_op
    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise fuse_error(errno.EPERM)   # no hard links in the namespace (as HDFS)

    @fuse_op
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise fuse_error(errno.EOPNOTSUPP)   # no device nodes, FIFOs or sockets

    @fuse_op
    async def statfs(self, ctx):
        # rm -rf and find ask for every directory they open: one answer serves for as long
        # as the kernel keeps attributes
        now = trio.current_time()
        if self._statfs is None or now - self._statfs[0] > self.attr_timeout:
            # the root's own quota only: a quota above it limits it too, but df shows
            # the folder mounted (one status call; a walk per df would be too dear)
            quota = (await self.client.get_file_status(self.root)).quota
            self._statfs = (now, (await self.client.report(), quota))
        report, quota = self._statfs[1]
        bsize = 1 << 16
        out = pyfuse3.StatvfsData()
        out.f_bsize = bsize
        out.f_frsize = bsize
        out.f_blocks = int(report.get("capacity") or 0) // bsize
        out.f_bfree = int(report.get("remaining") or 0) // bsize
        files = int(report.get("files") or 0) + int(report.get("directories") or 0)
        out.f_files = files + 1_000_000
        out.f_ffree = 1_000_000
        # the mounted folder's quotas are what it may hold (as MooseFS shows them for a
        # subfolder mount): space in bytes x replication, names for files + folders
        if quota and quota.get("ds", -1) >= 0:
            out.f_blocks = quota["ds"] // bsize
            out.f_bfree = min(out.f_bfree, max(0, quota["ds"] - quota["ds_used"]) // bsize)
        if quota and quota.get("ns", -1) >= 0:
            out.f_files = quota["ns"]
            out.f_ffree = max(0, quota["ns"] - quota["ns_used"])
        out.f_bavail = out.f_bfree
        out.f_favail = out.f_ffree
        out.f_namemax = 255
        return out

    @fuse_op
    async def access(self, inode, mode, ctx):
        await self._status_of(inode)
        return True


__all__ = ["LeaseFS", "ROOT_INO"]
