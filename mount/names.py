"""The mount's namespace requests (``Names``, a part of the mount that
``mount.operations`` composes): lookup, getattr, setattr, folders (opendir, readdir),
mkdir, rmdir, unlink, rename, symlink, readlink, statfs, access.

Why a part of its own: each request is one client call (the server decides POSIX errors
and answers the statuses the kernel needs) plus what the answer changes in the kernel's
view; the inode table and the caches are ``mount.kernelview``'s, what a change does to a
file open here (an unlink or a rename over it stages it first, a truncate goes through its
pending state) is ``mount.writes``'. It is given the client, the mount's ``KernelView``,
``OpenFiles`` (which files are open here, and folder handles), ``Writer``, the
``DirLeaseHolder`` (unlink, rmdir and rename in a folder it holds are decided here from the
lease and queued, not sent; a synchronous change in a held folder updates the lease's
entries) and the cluster folder the mount shows at its top (``root``: ``statfs`` reports
its quotas).

Concurrency contract: methods of the mount's one trio run, called by the FUSE handlers. A
handler changing an open file takes that file's ``trio.Lock`` before its first await (the
asynchronous release of a closed file may run at any await); everything else it changes is
``KernelView``'s, between awaits.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import stat
import time

import pyfuse3
import trio

from fs import dirops
from fs.errors import FileNotFound
from fs.rpc import group_name, user_name
from fs.status import FileStatus

from .callers import new_owner
from .dirleases import INOS_PER_GRANT, DirLeaseHolder, LeasedDir
from .errors import fuse_error
from .kernelview import ASK, KernelView
from .openfiles import FileMode, OpenFile, OpenFiles
from .writes import Writer

log = logging.getLogger(__name__)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
READDIR_PAGE = 1000


class Names:
    """The namespace half of the mount's requests."""

    def __init__(self, client, view: KernelView, open_files: OpenFiles, writer: Writer,
                 leases: DirLeaseHolder, *, root: str = "/"):
        self._client = client
        self._leases = leases
        self._view = view
        self._open_files = open_files
        self._writer = writer
        self._root = root
        self._statfs: tuple[float, tuple] | None = None   # (when, what statfs answered from)

    async def lookup(self, parent_inode, name):
        if name == b".":
            status = await self._view.status_of(parent_inode)
        elif name == b"..":
            path = self._view.path(parent_inode)
            parent = os.path.dirname(path) or "/"
            status = await self._client.get_file_status(parent)
            attrs = self._view.attrs(status)
            self._view.remember(attrs.st_ino, parent)
            return attrs
        else:
            path = self._view.child(parent_inode, name, changing=False)
            left = self._view.known_missing(parent_inode, name)
            if left is not None:
                return self._view.negative_entry(left)
            leased = self._leases.held(parent_inode)
            if leased is not None:   # the lease knows every name there
                if name not in leased.entries:
                    return self._view.negative_entry()
                known = leased.known(name)
                if known is None and leased.entries[name].is_dir:
                    # a folder held here too: its own lease has its attributes (tar and
                    # git walk their paths again once the kernel's entry of it expired)
                    below = self._leases.held(self._view.kernel_ino(leased.entries[name].ino))
                    known = below.status if below is not None else None
                if known is not None and self._open_files.get(
                        self._view.kernel_ino(known.ino)) is None:
                    attrs = self._view.attrs(known)
                    self._view.remember(attrs.st_ino, path, known)
                    return attrs
            folder = self._view.path(parent_inode)
            left = self._view.cached_miss(folder, name)
            if left is not None:
                # the kernel looks a name up again before O_EXCL, link and rename whatever
                # it cached; the call that follows is decided by the server all the same
                return self._view.negative_entry(left)
            listed = self._view.listed(folder, name)
            if listed is not None and listed is not ASK:
                attrs = self._view.listed_attrs(*listed)
                self._view.remember(attrs.st_ino, path, listed[1])
                return attrs
            generation = self._view.listing_gen
            try:
                status = await self._client.get_file_status(path)
            except FileNotFound:
                if self._view.negative_timeout <= 0:
                    raise
                if generation == self._view.listing_gen:   # no change of ours since the ask
                    self._view.note_miss(folder, name)
                return self._view.negative_entry()
            attrs = self._view.attrs(status)
            self._view.remember(attrs.st_ino, path, status)
            if listed is None:
                await self._view.statahead(folder)   # names found one by one: list the folder
            return attrs
        attrs = self._view.attrs(status)
        attrs.st_ino = parent_inode
        self._view.count_lookup(parent_inode)
        return attrs

    async def getattr(self, inode):
        leased = self._leases.held(inode)
        if leased is not None:   # nobody else changes it: its attributes are the mount's
            return self._view.attrs(leased.status)
        of = self._open_files.get(inode)
        if of is not None and of.status is not None and (
                of.unlinked or self._view.known_path(inode) is None):
            return self._view.attrs(of.status)   # unlinked but open: still has attributes
        if (of is not None and of.status is not None and of.mode is FileMode.STREAM
                and trio.current_time() - of.status_at < self._view.attr_timeout):
            # written here under our lease: size and times are ours (``attrs`` overlays
            # them); no call for the kernel's getattr before a chown or after a write
            return self._view.attrs(of.status)
        if of is None or of.clean:
            # a file made here and closed (perhaps open for reading): its folder's lease
            # knows it
            known = self._leases.known_file(inode)
            if known is not None and self._view.kernel_ino(known.ino) == inode:
                return self._view.attrs(known)
        status = self._view.fresh_status(inode)
        if status is None and of is None:   # an open file's status is the server's own
            listed = await self._view.listed_status(inode)
            if listed is not None:
                return self._view.listed_attrs(*listed)
        if status is None:
            status = await self._view.status_of(inode)
        if of is not None:
            of.status = status
        return self._view.attrs(status)

    async def setattr(self, inode, attr, fields, fh):
        while True:
            status = await self._setattr_once(inode, attr, fields, fh)
            if status is not None:
                return status
            # the file's asynchronous release finished while this waited for its lock: it
            # is a closed file now, whose folder's lease may decide the change

    async def _setattr_once(self, inode, attr, fields, fh):
        """``setattr``; None when the open file it found was released meanwhile."""
        if not fields.update_size and self._open_files.get(inode) is None:
            status = self._leases.set_attrs(
                inode, mode=attr.st_mode & 0o7777 if fields.update_mode else None,
                owner=user_name(attr.st_uid) if fields.update_uid else None,
                group=group_name(attr.st_gid) if fields.update_gid else None,
                mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
                atime_ns=attr.st_atime_ns if fields.update_atime else None)
            if status is not None:   # decided under the lease on its folder
                self._view.drop_fresh(inode)
                self._view.touch_node(inode)
                return self._view.attrs(status)
        known = self._view.known_path(inode)
        if known is not None:
            self._leases.note_changed(known)
        of = self._open_files.get(inode)
        self._view.drop_fresh(inode)
        self._view.touch_node(inode)
        if of is None:
            status = await self._set_attrs(inode, None, attr, fields, fh)
        else:
            # an open file's state (and its asynchronous release) changes only under its
            # lock: taken before the first await, so a release that completes the file
            # either ran before (then this starts again, as for a closed file) or sees
            # pending_times
            async with of.lock:
                if self._open_files.get(inode) is not of:
                    return None
                status = await self._set_attrs(inode, of, attr, fields, fh)
                if status is None and of.status is not None and not fields.update_size:
                    status = of.status   # nothing asked the server (kept times, no-op chown)
        if status is None:
            status = await self._view.status_of(inode)
        if of is not None:
            of.status = status
        self._leases.note_status(inode, status)   # a held folder's own, as set now
        return self._view.attrs(status)

    async def _set_attrs(self, inode: int, of: OpenFile | None, attr, fields, fh):
        """``setattr``'s changes; ``of`` (lock held) when the file is open here. Each call
        answers the status after it, so the usual one-field setattr (chmod, chown, utimens)
        is one round trip; the status after the last change, or None after a truncate."""
        path = self._view.path(inode)
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
                status = await self._client.set_permission(path, attr.st_mode & 0o7777,
                                                           want_status=True)
        if fields.update_uid or fields.update_gid:
            owner = user_name(attr.st_uid) if fields.update_uid else None
            group = group_name(attr.st_gid) if fields.update_gid else None
            # tar and cp -p chown what they just created to who created it: the kernel has
            # checked the caller may (default_permissions), and nothing would change
            if of is None or (owner or of.owner) != of.owner or (group or of.group) != of.group:
                status = await self._client.set_owner(path, owner, group, want_status=True)
                if of is not None:
                    of.owner, of.group = status.owner, status.group
        if fields.update_size:
            self._view.drop_read_stamp(inode)
            status = None
            if of is not None:
                await self._writer.truncate_open(of, path, attr.st_size, by_handle=fh is not None)
            else:
                await self._writer.truncate_closed(inode, path, attr.st_size)
        if fields.update_atime or fields.update_mtime:
            times = (attr.st_mtime_ns if fields.update_mtime else None,
                     attr.st_atime_ns if fields.update_atime else None)
            if later:   # the completion would replace them anyway
                of.pending_times = times
                return status
            status = await self._client.set_times(self._view.path(inode), mtime_ns=times[0],
                                                  atime_ns=times[1], want_status=True)
        return status

    async def opendir(self, inode):
        # no call: the kernel opens only what it knows as a directory, and a directory
        # another client removed meanwhile fails at readdir (ENOENT)
        self._view.path(inode)
        return self._open_files.add_dir(inode)

    async def readdir(self, fh, start_id, token):
        handle = self._open_files.dir(fh)
        if handle is None:
            raise fuse_error(errno.EBADF)
        path = self._view.path(handle.ino)
        if start_id > len(handle.names):
            return
        if start_id < len(handle.names) or (start_id == 0 and handle.complete):
            handle.rewind(start_id)
        while True:
            # what the last page brought beyond the kernel's full buffer goes first: a folder
            # costs one call per page, and none for the kernel's last, empty readdir
            while handle.fetched:
                entry = handle.fetched[0]
                attrs = self._view.attrs(entry)
                if not pyfuse3.readdir_reply(token, os.fsencode(entry.name), attrs,
                                             len(handle.names) + 1):
                    return
                handle.fetched.popleft()
                handle.names.append(entry.name)
                child = "/" + entry.name if path == "/" else f"{path}/{entry.name}"
                self._view.remember(attrs.st_ino, child, entry)
            if handle.complete:
                return
            start_after = handle.names[-1] if handle.names else ""
            if not start_after:
                listed = await self._leases.listing(handle.ino, path)
                if listed is not None:   # the lease's entries are the folder's
                    handle.fetched.extend(listed)
                    handle.complete = True
                    continue
            entries, more = await self._client.list_page(path, start_after, READDIR_PAGE)
            for entry in entries:
                if entry.path == path:   # a file lists itself: no longer a directory
                    raise fuse_error(errno.ENOTDIR)
            handle.fetched.extend(entries)
            handle.complete = not more or not entries

    async def releasedir(self, fh):
        self._open_files.drop_dir(fh)

    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._view.child(parent_inode, name)
        named = self._view.named
        owner, group = new_owner(ctx)
        # one call: EEXIST, ENOENT (parent gone) and ENOTDIR come from the server; the
        # folder is held here from now on (as for a create: a tree being made, whose
        # entries' attributes are set next), and the new one's lease comes with it
        leased = await self._leases.lease_to_make(parent_inode, self._view.path(parent_inode),
                                                  name)
        if leased is not None and leased.makes_dirs:
            if name in leased.entries:
                raise fuse_error(errno.EEXIST)
            inos = leased.take_dir_inos()
            if inos is not None:
                return await self._mkdir_here(leased, parent_inode, name, path, mode,
                                              owner, group, inos)
        with self._leases.asking():
            asked = trio.current_time()
            made = await self._client.mkdir(path, permission=mode & 0o7777, owner=owner,
                                            group=group, lease=leased is not None,
                                            want_inos=INOS_PER_GRANT)
            self._leases.note_made(parent_inode, name, made.status, made.parent)
            if made.lease is not None:
                self._leases.adopt(self._view.kernel_ino(made.status.ino), made.lease,
                                  asked)
        self._view.keep_fresh(named, made.parent)
        return self._made_dir(parent_inode, name, path, made.status)

    def _made_dir(self, parent_inode: int, name: bytes, path: str, status: FileStatus):
        """The kernel's view of folder ``name`` just made in ``parent_inode``: its attrs."""
        attrs = self._view.attrs(status)
        self._view.remember(attrs.st_ino, path)
        self._view.note_made(parent_inode, name)
        self._view.note_new_dir(attrs.st_ino)
        return attrs

    async def _mkdir_here(self, leased: LeasedDir, parent_inode: int, name: bytes, path: str,
                          mode: int, owner: str | None, group: str | None,
                          inos: tuple[int, int, int]):
        """mkdir(2) decided under the folder's lease (the kernel checked the caller may
        write it; the lease knows the name is free): the folder gets an inode the grant
        reserved and the status ``mkdirs`` would give it (the caller's owner, the folder's
        group unless asked otherwise or the folder is setgid, which the new one keeps),
        and this mount holds its lease from now on."""
        folder = leased.status
        now = time.time_ns()
        setgid = folder.mode & stat.S_ISGID
        status = FileStatus(
            name=os.fsdecode(name), path=path, ino=inos[0], type="dir",
            mode=(mode & 0o7777) | setgid, owner=owner or self._client.rpc.user,
            group=folder.group if group is None or setgid else group,
            mtime_ns=now, atime_ns=now, ctime_ns=now, length=0, replication=0,
            block_size=0, symlink=None, under_construction=False, children=0)
        await self._leases.make_dir(leased, self._view.path(parent_inode), name, status,
                                    inos, owner=owner, group=group)
        return self._made_dir(parent_inode, name, path, status)

    async def rmdir(self, parent_inode, name):
        path = self._view.child(parent_inode, name)
        leased = self._leases.held(parent_inode)
        if leased is None and self._leases.held_at(path):
            # the folder is held here (a tree being removed): so is its parent from now on,
            # with the folders below it, and the rmdir is decided here; a lone rmdir stays
            # one call
            leased = await self._leases.lease_for(parent_inode, self._view.path(parent_inode),
                                                  below=True)
        if leased is not None and await self._rmdir_leased(leased, parent_inode, name, path):
            return
        named = self._view.named
        gone = await self._client.rmdir(path)   # ENOTDIR, ENOTEMPTY from the server
        self._leases.note_gone(parent_inode, name, gone.parent)
        self._view.drop_new_dirs(parent_inode)
        self._view.keep_fresh(named, gone.parent)
        ino = self._view.kernel_ino(gone.status.ino)
        self._view.forget_path(ino)
        child = self._leases.forget(ino)
        if child is not None:   # it had been leased here: give that lease back too
            await self._leases.queue(dirops.Release(child.ino, child.epoch))

    async def _rmdir_leased(self, leased: LeasedDir, parent_inode: int, name: bytes,
                            path: str) -> bool:
        """rmdir decided under the parent's lease: True when done here; False when the
        server must decide (the directory's own content is not known here)."""
        entry = leased.entries.get(name)
        if entry is None:
            raise fuse_error(errno.ENOENT)
        if not entry.is_dir:
            raise fuse_error(errno.ENOTDIR)
        ino = self._view.kernel_ino(entry.ino)
        child = self._leases.held(ino)
        if child is None:
            return False
        if child.entries:
            raise fuse_error(errno.ENOTEMPTY)
        self._leases.forget(ino)
        del leased.entries[name]
        now = self._leases.changed(leased, children=-1, subdirs=-1)
        await self._leases.queue(dirops.Rmdir(leased.ino, leased.epoch, os.fsdecode(name),
                                              entry.ino, child.epoch, now),
                                 dirs=(self._view.path(parent_inode),), names=(path,))
        self._view.drop_new_dirs(parent_inode, ino)
        self._view.forget_path(ino)
        return True

    async def unlink(self, parent_inode, name):
        path = self._view.child(parent_inode, name)
        await self._released(path)
        if not self._open_at(path):
            leased = await self._leases.lease_for(parent_inode, self._view.path(parent_inode))
            if leased is not None:
                await self._unlink_leased(leased, parent_inode, name, path)
                return
        named = self._view.named
        if self._open_at(path):
            # a file open here: staged before it goes, so its handles keep their content
            status = await self._client.get_file_status(path)
            if status.is_dir:
                raise fuse_error(errno.EISDIR)
            await self._writer.detach(self._view.kernel_ino(status.ino), path)
        gone = await self._client.unlink(path)   # EISDIR from the server
        self._leases.note_gone(parent_inode, name, gone.parent)
        self._view.drop_new_dirs(parent_inode)
        self._view.keep_fresh(named, gone.parent)
        ino = self._view.kernel_ino(gone.status.ino)
        self._check_gone(ino, path)
        self._view.forget_path(ino)

    async def _unlink_leased(self, leased: LeasedDir, parent_inode: int, name: bytes,
                             path: str) -> None:
        entry = leased.entries.get(name)
        if entry is None:
            raise fuse_error(errno.ENOENT)
        if entry.is_dir:
            raise fuse_error(errno.EISDIR)
        del leased.entries[name]
        now = self._leases.changed(leased, children=-1)
        await self._leases.queue(dirops.Unlink(leased.ino, leased.epoch, os.fsdecode(name),
                                               entry.ino, now),
                                 dirs=(self._view.path(parent_inode),), names=(path,))
        self._view.drop_new_dirs(parent_inode)
        ino = self._view.kernel_ino(entry.ino)
        self._check_gone(ino, path)
        self._view.forget_path(ino)

    async def _released(self, path: str) -> None:
        """Wait for the release in progress of a file at ``path`` whose handles are all
        gone. close(2) queues the kernel's release before it returns, so a program that
        closes a file and then unlinks or renames over it (sqlite's journal, an editor's
        or git's lock file) finds the file still open here while its release publishes
        it; once that is through, the change is one of a closed file."""
        for of in [of for of in self._open_files.files()
                   if of.handles == 0 and not of.unlinked
                   and self._view.known_path(of.ino) == path]:
            async with of.lock:   # the release's publishing holds it
                pass

    def _open_at(self, path: str) -> bool:
        """Whether a file open here (and not yet detached) has ``path`` as far as this mount
        knows: its node's path (another client's rename moves it unseen)."""
        for of in self._open_files.files():
            if self._view.known_path(of.ino) == path and not of.unlinked:
                return True
        return False

    def _check_gone(self, ino: int, path: str) -> None:
        """After an unlink or a rename over ``path`` removed inode ``ino``: an open file here
        that was not detached first (another client had moved it to ``path``) lost its
        content; its handles get errors from now on, which the log says."""
        of = self._open_files.get(ino)
        if of is not None and not of.unlinked:
            log.warning("%s (inode %d) was removed while open here under another name; "
                        "its open handles lose their content", path, ino)
            of.unlinked = True

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags):
        if flags & RENAME_EXCHANGE:
            raise fuse_error(errno.EINVAL)
        src = self._view.child(parent_inode_old, name_old)
        dst = self._view.child(parent_inode_new, name_new)
        overwrite = not (flags & RENAME_NOREPLACE)
        if overwrite:
            await self._released(dst)
        if not (overwrite and self._open_at(dst)) and await self._rename_leased(
                parent_inode_old, name_old, parent_inode_new, name_new, src, dst, overwrite):
            return
        named = self._view.named
        if overwrite and self._open_at(dst):
            # replacing a file open here: staged before it goes, as at unlink
            dst_status = await self._client.get_file_status(dst)
            if not dst_status.is_dir:
                await self._writer.detach(self._view.kernel_ino(dst_status.ino), dst)
        # one call: EEXIST (NOREPLACE), EISDIR/ENOTDIR/ENOTEMPTY come from the server
        moved = await self._client.move(src, dst, overwrite=overwrite)
        self._leases.note_gone(parent_inode_old, name_old, moved.src_parent)
        self._leases.note_made(parent_inode_new, name_new, moved.status, moved.parent)
        if moved.replaced is not None and moved.replaced.is_dir:
            child = self._leases.forget(self._view.kernel_ino(moved.replaced.ino))
            if child is not None:
                await self._leases.queue(dirops.Release(child.ino, child.epoch))
        self._view.drop_new_dirs(parent_inode_old, parent_inode_new)
        self._view.keep_fresh(named, moved.src_parent, moved.parent)
        if moved.replaced is not None:
            replaced = self._view.kernel_ino(moved.replaced.ino)
            if not moved.replaced.is_dir:
                self._check_gone(replaced, dst)
            self._view.forget_path(replaced)
        self._view.moved(self._view.kernel_ino(moved.status.ino), src, dst,
                         moved.status.is_dir)

    async def _rename_leased(self, parent_old: int, name_old: bytes, parent_new: int,
                             name_new: bytes, src: str, dst: str, overwrite: bool) -> bool:
        """A rename decided under the leases of both directories: True when done here;
        False when the server must decide (a directory moving to another folder could
        land under itself; a directory replaced must be known empty)."""
        source = await self._leases.lease_for(parent_old, self._view.path(parent_old))
        if source is None:
            return False
        target = source if parent_new == parent_old else await self._leases.lease_for(
            parent_new, self._view.path(parent_new))
        if target is None or source.giving_back or target.giving_back:
            return False
        entry = source.entries.get(name_old)
        if entry is None:
            raise fuse_error(errno.ENOENT)
        if entry.is_dir and target is not source:
            return False
        replaced = target.entries.get(name_new)
        replaced_lease = None
        if replaced is not None:
            if not overwrite:
                raise fuse_error(errno.EEXIST)
            if replaced.ino == entry.ino:
                return True   # POSIX: the same file under both names, nothing to do
            if entry.is_dir and not replaced.is_dir:
                raise fuse_error(errno.ENOTDIR)
            if not entry.is_dir and replaced.is_dir:
                raise fuse_error(errno.EISDIR)
            if replaced.is_dir:
                replaced_lease = self._leases.held(self._view.kernel_ino(replaced.ino))
                if replaced_lease is None:
                    return False
                if replaced_lease.entries:
                    raise fuse_error(errno.ENOTEMPTY)
        del source.entries[name_old]
        was_stale = name_old in source.stale
        source.stale.discard(name_old)
        subdirs = 1 if entry.is_dir else 0
        if target is not source:
            now = self._leases.changed(source, children=-1, subdirs=-subdirs)
            self._leases.changed(target, children=0 if replaced else 1,
                                 subdirs=0 if replaced else subdirs, now=now)
        else:
            now = self._leases.changed(
                source, children=-1 if replaced else 0,
                subdirs=-1 if replaced is not None and replaced.is_dir else 0)
        # the server stamps the moved entry's ctime with the change's time, as the
        # folders' times: the lease still knows it (git renames every object it writes,
        # and then stats and lists them)
        target.entries[name_new] = dataclasses.replace(
            entry, ctime_ns=now, name=os.fsdecode(name_new), path=dst)
        target.stale.discard(name_new)
        if was_stale:
            target.mark(name_new)   # its size and times are still an open file's
        moved_lease = self._leases.held(self._view.kernel_ino(entry.ino)) if entry.is_dir \
            else None
        if moved_lease is not None:   # a folder held here: its own lease answers for it
            moved_lease.status = dataclasses.replace(
                moved_lease.status, ctime_ns=now, name=os.fsdecode(name_new), path=dst)
        await self._leases.queue(dirops.Rename(
            source.ino, source.epoch, os.fsdecode(name_old), entry.ino, target.ino,
            target.epoch, os.fsdecode(name_new), replaced.ino if replaced else 0, now),
            dirs=(self._view.path(parent_old), self._view.path(parent_new)), names=(src, dst))
        if replaced_lease is not None:   # the replaced directory went, and its lease
            self._leases.forget(replaced_lease.kernel_ino)
            await self._leases.queue(dirops.Release(replaced_lease.ino, replaced_lease.epoch))
        self._view.drop_new_dirs(parent_old, parent_new)
        if replaced is not None:
            gone = self._view.kernel_ino(replaced.ino)
            if not replaced.is_dir:
                self._check_gone(gone, dst)
            self._view.forget_path(gone)
        self._view.moved(self._view.kernel_ino(entry.ino), src, dst, entry.is_dir)
        return True

    async def symlink(self, parent_inode, name, target, ctx):
        path = self._view.child(parent_inode, name)
        named = self._view.named
        owner, group = new_owner(ctx)
        made = await self._client.symlink(os.fsdecode(target), path, owner=owner, group=group)
        self._leases.note_made(parent_inode, name, made.status, made.parent)
        self._view.note_made(parent_inode, name)
        self._view.keep_fresh(named, made.parent)
        attrs = self._view.attrs(made.status)
        self._view.remember(attrs.st_ino, path, made.status)
        return attrs

    async def readlink(self, inode):
        target = self._view.symlink_target(inode)
        if target is not None:
            return os.fsencode(target)   # no call: the kernel does not cache it
        status = await self._view.status_of(inode)
        if not status.is_symlink:
            raise fuse_error(errno.EINVAL)
        return os.fsencode(status.symlink or "")

    async def statfs(self):
        # rm -rf and find ask for every directory they open: one answer serves for as long
        # as the kernel keeps attributes
        now = trio.current_time()
        if self._statfs is None or now - self._statfs[0] > self._view.attr_timeout:
            # the root's own quota only: a quota above it limits it too, but df shows
            # the folder mounted (one status call; a walk per df would be too dear)
            quota = (await self._client.get_file_status(self._root)).quota
            self._statfs = (now, (await self._client.report(), quota))
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

    async def access(self, inode):
        await self._view.status_of(inode)
        return True


__all__ = ["Names", "READDIR_PAGE"]
