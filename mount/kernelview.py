"""The kernel's view of a leasefs mount: which path each inode number the kernel holds
stands for (``_nodes``, with pyfuse3's lookup counts), names checked and turned into
paths, and the ``EntryAttributes`` the kernel caches, as ``KernelView``, a mixin of
``mount.operations.LeaseFS``.

Why a module of its own: ``mount.operations`` translates FUSE requests; the inode table
and the attributes it answers with are what every handler shares, kept apart so each module
has one job. Directory statuses a change answered with are kept here for the kernel's next
getattr (``_keep_fresh``/``_fresh_status``), for ``attr_timeout`` at most; directories
this mount made are known empty but for what it made in them (``_note_new_dir``), for
``negative_timeout`` at most.

Misses: a name a lookup here found missing is answered missing by the mount itself for
``negative_timeout`` (``_note_miss``/``_cached_miss``), the bound the kernel's own cached
miss has: the kernel looks a name up again before an ``O_EXCL`` create, a link and a rename
whatever it cached (git does all three per object), and the call that follows is decided by
the server anyway. A change of that name here forgets it.

Folder listings (statahead, as Lustre's): when lookups or getattrs in one folder keep
finding names one by one on the server, with no change here in that folder between them
(``STATAHEAD_AFTER`` within the listing's life: stat walks without a readdir, ``git
status``, a stat of every file just written), the mount fetches the folder's listing (at
most ``STATAHEAD_MAX`` entries) once and answers the next lookups and getattrs of names it
holds from it for min(``entry_timeout``, ``negative_timeout``, 1 s) from the fetch: the
staleness the kernel's own name and attribute caches have, for names it had not cached
yet. A name the listing does not hold is asked for (another client may have just made it:
misses are cached only for names looked up, as before). A name this mount changes (every
name handler but lookup, setattr, the release of a file opened for writing) is marked
``ASK`` in its folder's listing: the server answers for it from then on; a folder renamed
here drops every listing (their paths move); and a listing whose fetch overlapped any
change of ours is not kept (``_listing_gen``).

Concurrency contract: plain methods of the mount's one trio run; only ``_status_of``,
``_statahead`` and ``_listed_status`` await (a listing is stored only if no change of ours
ran meanwhile); the tables change only between awaits of the handlers that call them.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat

import pyfuse3
import trio

from fs.client import FileStatus
from fs.errors import LeaseFSError
from fs.paths import validate as validate_path

from .errors import fuse_error
from .openfiles import FileMode, Node

FRESH_LIMIT = 4096
STATAHEAD_AFTER = 4      # names of one folder found on the server one by one, then a listing
STATAHEAD_MAX = 4096     # entries of a listing: a bigger folder is looked up name by name
LISTINGS_LIMIT = 64      # folders with a listing at once
TOO_BIG_FOR = 10         # listing lives a folder too big for one stays unlisted
# a listing answers for names the kernel never asked about: however long a mount lets the
# kernel cache what it asked, another client's change shows within the default timeout
LISTING_LIFE_MAX = 1.0


ASK = None   # a listing's answer for a name changed here since the fetch: ask the server


class Listing:
    """A folder's entries as fetched at one moment, usable until ``until`` (trio time);
    ``ASK`` for names this mount changed since."""

    __slots__ = ("until", "entries")

    def __init__(self, until: float, entries: dict[bytes, FileStatus]):
        self.until = until
        self.entries: dict[bytes, FileStatus | None] = entries


class KernelView:
    """The inode table and attributes of ``LeaseFS`` (needs its ``client``, ``_nodes``,
    ``_alias``, ``_open``, ``_fresh``, ``_new_dirs``, ``_listings``, ``_listing_gen``,
    ``_asked``, ``_too_big``, ``_misses``, ``_named``, ``_uid_cache``,
    ``_gid_cache``, ``_next_fh``, ``entry_timeout``, ``attr_timeout`` and
    ``negative_timeout``)."""

    # ================================================================== new directories
    def _note_new_dir(self, ino: int) -> None:
        """A directory this mount just made is empty as of now: for ``negative_timeout`` (the
        bound a cached miss has) a name not made in it through this mount since is missing,
        without asking the server (tar, cp -r and git fill new folders name by name)."""
        if self.negative_timeout <= 0:
            return
        now = trio.current_time()
        if len(self._new_dirs) >= FRESH_LIMIT:
            self._new_dirs = {k: v for k, v in self._new_dirs.items() if v[0] > now}
            if len(self._new_dirs) >= FRESH_LIMIT:
                self._new_dirs.clear()
        self._new_dirs[ino] = (now + self.negative_timeout, set())

    def _note_made(self, parent_ino: int, name: bytes) -> None:
        """``name`` was made in ``parent_ino`` through this mount."""
        entry = self._new_dirs.get(parent_ino)
        if entry is not None:
            entry[1].add(name)

    def _drop_new_dirs(self, *inos: int) -> None:
        """Names went or moved in these directories: ask the server again."""
        for ino in inos:
            self._new_dirs.pop(ino, None)

    def _known_missing(self, parent_ino: int, name: bytes) -> float | None:
        """Seconds for which ``name`` is known to be missing in ``parent_ino`` (None: not
        known, ask the server)."""
        entry = self._new_dirs.get(parent_ino)
        if entry is None:
            return None
        left = entry[0] - trio.current_time()
        if left <= 0:
            del self._new_dirs[parent_ino]
            return None
        return None if name in entry[1] else left

    # ================================================================== folder listings
    @property
    def _listing_life(self) -> float:
        return min(self.entry_timeout, self.negative_timeout, LISTING_LIFE_MAX)

    def _listed(self, folder: str, name: bytes):
        """From a live listing of the folder at path ``folder``: ``(seconds left, status)``
        of a name it holds, ``ASK`` for a name it does not hold or that changed here since;
        None without a live listing."""
        listing = self._listings.get(folder)
        if listing is None:
            return None
        left = listing.until - trio.current_time()
        if left <= 0:
            del self._listings[folder]
            return None
        status = listing.entries.get(name)
        return ASK if status is None else (left, status)

    async def _listed_status(self, ino: int) -> tuple[float, FileStatus] | None:
        """A getattr's answer ``(seconds left, status)`` from its folder's listing (the
        kernel keeps a name it looked up but asks for its attributes again, e.g. after the
        release of a written file), or None: ask the server."""
        where = self._where(ino)
        if where is None:
            return None
        listed = self._listed(*where)
        if listed is None and await self._statahead(where[0]):
            listed = self._listed(*where)
        if listed is None or listed is ASK or self._kernel_ino(listed[1].ino) != ino:
            return None
        return listed

    def _listed_attrs(self, left: float, status: FileStatus) -> pyfuse3.EntryAttributes:
        """The attributes of a listing's entry, which the kernel may keep no longer than the
        listing lives (``left`` seconds): its age counts."""
        attrs = self._attrs(status)
        attrs.entry_timeout = min(attrs.entry_timeout, left)
        attrs.attr_timeout = min(attrs.attr_timeout, left)
        return attrs

    def _where(self, ino: int) -> tuple[str, bytes] | None:
        """(folder path, name) of an inode the kernel knows by a path, but the root."""
        node = self._nodes.get(ino)
        if node is None or node.path is None or ino == pyfuse3.ROOT_INODE or node.path == "/":
            return None
        folder, _, name = node.path.rpartition("/")
        return folder or "/", os.fsencode(name)

    def _note_miss(self, folder: str, name: bytes) -> None:
        if len(self._misses) >= FRESH_LIMIT:
            now = trio.current_time()
            self._misses = {k: v for k, v in self._misses.items() if v > now}
            if len(self._misses) >= FRESH_LIMIT:
                self._misses.clear()
        self._misses[(folder, name)] = trio.current_time() + self.negative_timeout

    def _cached_miss(self, folder: str, name: bytes) -> float | None:
        """Seconds for which a lookup here found ``name`` missing in ``folder`` (None: ask)."""
        until = self._misses.get((folder, name))
        if until is None:
            return None
        left = until - trio.current_time()
        if left <= 0:
            del self._misses[(folder, name)]
            return None
        return left

    def _touch_listing(self, folder: str, name: bytes) -> None:
        """This mount is changing ``name`` in ``folder``: the server answers for it from now
        on, and a listing or a miss being fetched meanwhile is not kept."""
        self._listing_gen += 1
        self._misses.pop((folder, name), None)
        # a folder being changed here is not walked: count its names anew (a listing would
        # be stale at once; git stats each object file it just wrote)
        self._asked.pop(folder, None)
        listing = self._listings.get(folder)
        if listing is not None:
            listing.entries[name] = ASK

    def _touch_node(self, ino: int) -> None:
        """``_touch_listing`` for an inode's current name (the root and unlinked files are
        in no listing)."""
        where = self._where(ino)
        self._listing_gen += 1
        if where is not None:
            self._touch_listing(*where)

    def _drop_listings(self) -> None:
        """Paths moved here (a folder renamed): no listing or miss can be trusted."""
        self._listing_gen += 1
        if self._listings:
            self._listings.clear()
        if self._misses:
            self._misses.clear()

    async def _statahead(self, path: str) -> bool:
        """Count a name found on the server in the folder at ``path`` (a lookup's, or a
        getattr's about to ask); at the ``STATAHEAD_AFTER``-th within a listing's life fetch
        the folder's listing for the next ones. True when a listing of it is live now."""
        life = self._listing_life
        if life <= 0:
            return False
        now = trio.current_time()
        start, count = self._asked.get(path, (now, 0))
        if now - start > life:
            start, count = now, 0
        if count + 1 < STATAHEAD_AFTER:
            if len(self._asked) >= FRESH_LIMIT:
                self._asked.clear()
            self._asked[path] = (start, count + 1)
            return False
        self._asked.pop(path, None)
        if self._too_big.get(path, 0.0) > now:
            return False
        generation = self._listing_gen
        entries: dict[bytes, FileStatus] = {}
        start_after = ""
        try:
            while True:
                page, more = await self.client.list_page(path, start_after)
                for entry in page:
                    if entry.path == path:   # a file lists itself: let the lookup say so
                        return False
                    entries[os.fsencode(entry.name)] = entry
                if not more or not page:
                    break
                if len(entries) >= STATAHEAD_MAX:
                    if len(self._too_big) >= FRESH_LIMIT:
                        self._too_big.clear()
                    self._too_big[path] = now + TOO_BIG_FOR * life
                    return False
                start_after = page[-1].name
        except LeaseFSError:   # gone, not readable: the lookup asks for its name
            return False
        if generation != self._listing_gen:
            return False   # a change of ours overlapped the fetch: it may not show it
        if len(self._listings) >= LISTINGS_LIMIT:
            self._listings.clear()
        self._listings[path] = Listing(now + life, entries)
        return True

    # ================================================================== helpers: paths
    def _path(self, ino: int) -> str:
        node = self._nodes.get(ino)
        if node is None or node.path is None:
            raise fuse_error(errno.ESTALE if node is None else errno.ENOENT)
        return node.path

    def _child(self, parent_ino: int, name: bytes, *, changing: bool = True) -> str:
        """The path of ``name`` in ``parent_ino`` for a handler that may change the folder
        (``changing``: every name handler but lookup)."""
        self._fresh.pop(parent_ino, None)   # the handler may change the directory
        self._named += 1
        text = os.fsdecode(name)
        if "/" in text or text in ("", ".", ".."):
            raise fuse_error(errno.EINVAL)
        parent = self._path(parent_ino)
        if changing:   # the name, and the folder's own status (times, link count)
            self._touch_listing(parent, name)
            self._touch_node(parent_ino)
        path = "/" + text if parent == "/" else f"{parent}/{text}"
        try:
            return validate_path(path)
        except LeaseFSError as exc:
            raise fuse_error(exc.errno) from None

    def _kernel_ino(self, ns_ino: int) -> int:
        return self._alias.get(ns_ino, ns_ino)

    def _remember(self, ino: int, path: str, status: FileStatus | None = None) -> Node:
        """Register ``ino`` at ``path`` and count one lookup; a symlink's target is kept
        for readlink (an inode's target never changes: a new link is a new inode)."""
        node = self._nodes.get(ino)
        if node is None:
            node = self._nodes[ino] = Node(ino, path)
        else:
            node.path = path
        node.lookups += 1
        if status is not None and status.is_symlink:
            node.target = status.symlink
        return node

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    # ================================================================== helpers: attributes
    def _uid(self, owner: str) -> int:
        if owner not in self._uid_cache:
            try:
                self._uid_cache[owner] = pwd.getpwnam(owner).pw_uid
            except KeyError:
                self._uid_cache[owner] = int(owner) if owner.isdigit() else os.getuid()
        return self._uid_cache[owner]

    def _gid(self, group: str) -> int:
        if group not in self._gid_cache:
            try:
                self._gid_cache[group] = grp.getgrnam(group).gr_gid
            except KeyError:
                self._gid_cache[group] = int(group) if group.isdigit() else os.getgid()
        return self._gid_cache[group]

    def _attrs(self, status) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        ino = self._kernel_ino(status.ino)
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = self.entry_timeout
        attr.attr_timeout = self.attr_timeout
        kind = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(status.type, stat.S_IFREG)
        attr.st_mode = kind | (status.mode & 0o7777)
        of = self._open.get(ino)
        if of is not None and of.pending_mode is not None and of.mode is not FileMode.CLEAN:
            attr.st_mode = kind | of.pending_mode   # set here, reaches the server at close
        if status.is_dir:
            attr.st_nlink = 2 + status.subdirs      # "." and ".." of each subdirectory
        else:
            attr.st_nlink = 0 if of is not None and of.unlinked else 1
        attr.st_uid = self._uid(status.owner)
        attr.st_gid = self._gid(status.group)
        attr.st_rdev = 0
        size = status.length
        if status.is_symlink:
            size = len(os.fsencode(status.symlink or ""))
        if of is not None and of.mode is not FileMode.CLEAN:
            size = of.size
        attr.st_size = size
        attr.st_blksize = 1 << 16
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = status.atime_ns
        attr.st_mtime_ns = status.mtime_ns
        if of is not None and of.pending_times is not None and of.mode is not FileMode.CLEAN:
            mtime_ns, atime_ns = of.pending_times   # set here, reach the server at close
            if mtime_ns is not None:
                attr.st_mtime_ns = mtime_ns
            if atime_ns is not None:
                attr.st_atime_ns = atime_ns
        attr.st_ctime_ns = status.ctime_ns
        return attr

    async def _status_of(self, ino: int):
        return await self.client.get_file_status(self._path(ino))

    def _keep_fresh(self, named: int, *statuses: FileStatus | None) -> None:
        """Remember the directory statuses a change answered with for the kernel's next
        getattr, unless another handler addressed a name since this one (``named``: the
        count after its own ``_child``)."""
        if named != self._named:
            return
        if len(self._fresh) > FRESH_LIMIT:
            self._fresh.clear()
        now = trio.current_time()
        for status in statuses:
            if status is not None:
                self._fresh[self._kernel_ino(status.ino)] = (now, status)

    def _fresh_status(self, ino: int) -> FileStatus | None:
        entry = self._fresh.pop(ino, None)
        if entry is not None and trio.current_time() - entry[0] < self.attr_timeout:
            return entry[1]
        return None


__all__ = ["ASK", "KernelView", "FRESH_LIMIT", "Listing", "STATAHEAD_AFTER", "STATAHEAD_MAX"]
