"""The kernel's view of a leasefs mount (``KernelView``, a part of the mount that
``mount.operations`` composes): which path each inode number the kernel holds stands for
(with pyfuse3's lookup counts), names checked and turned into paths, the
``EntryAttributes`` the kernel caches, and what the mount answers without asking the
server because the kernel would have cached it as long.

Why a part of its own: every handler shares the inode table and the attributes, and the
caches that spare round trips all follow one rule (nothing is kept longer than the kernel
would keep it); kept apart, the handlers (``mount.names``, ``mount.files``) and the write
path (``mount.writes``) call it through its methods and never touch its tables. It is given
the client (it fetches statuses and listings) and the mount's ``OpenFiles`` (read only: an
open file's own size, mode and times overlay its attributes, and an open inode is not
forgotten).

Inodes: namespace inode ids are the FUSE inode numbers (root = 1). The table maps each
inode the kernel knows to its current path and lookup count (pyfuse3 rules: +1 per lookup,
create, mkdir, symlink and readdir entry; ``forget`` subtracts; a node with count 0 and no
open file is dropped). A rename rewrites the paths of the moved subtree. When the mount
replaces the content of a file it is writing with ``create(overwrite=True)`` (``O_TRUNC`` of
its own stream) the namespace hands out a new id; ``alias`` maps it back to the number the
kernel already holds.

Directory statuses a change answered with are kept for the kernel's next getattr
(``keep_fresh``/``fresh_status``), for ``attr_timeout`` at most; directories this mount made
are known empty but for what it made in them (``note_new_dir``), for ``negative_timeout`` at
most. The (mtime, ctime, length) of each closed file when it was last opened for reading
here says whether the kernel's cached pages still hold its content (``unchanged_since_read``).

Misses: a name a lookup here found missing is answered missing by the mount itself for
``negative_timeout`` (``note_miss``/``cached_miss``), the bound the kernel's own cached
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
change of ours is not kept (``listing_gen``).

Concurrency contract: methods of the mount's one trio run; only ``status_of``,
``statahead`` and ``listed_status`` await (a listing is stored only if no change of ours
ran meanwhile); every other method runs without an await, so the tables change only between
the awaits of the handlers that call them.
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import stat
from collections.abc import Callable

import pyfuse3
import trio

from fs.client import FileStatus
from fs.errors import LeaseFSError
from fs.paths import MAX_NAME_BYTES, MAX_PATH_CHARS
from fs.paths import validate as validate_path

from .errors import fuse_error
from .openfiles import FileMode, Node, OpenFiles

log = logging.getLogger(__name__)

ROOT_INO = pyfuse3.ROOT_INODE
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
    """The inode table, attributes and name caches of one mount."""

    def __init__(self, client, open_files: OpenFiles, *, root: str = "/",
                 root_ino: int | None = None, entry_timeout: float = 1.0,
                 attr_timeout: float = 1.0, negative_timeout: float = 1.0):
        self._client = client
        self._open_files = open_files
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout
        self.negative_timeout = negative_timeout
        # the cluster folder shown at the FUSE root (a subfolder mount): its path is the
        # root node's and ``root_ino``, its namespace inode, is aliased to the root
        self._nodes: dict[int, Node] = {ROOT_INO: Node(ROOT_INO, root)}
        self._nodes[ROOT_INO].lookups = 1
        self._alias: dict[int, int] = {}
        if root_ino is not None and root_ino != ROOT_INO:
            self._alias[root_ino] = ROOT_INO
        # (mtime, ctime, length) of each closed file when it was last opened for reading
        # here: an open that finds the same stamp keeps the kernel's cached pages
        self._read_stamps: dict[int, tuple[int, int, int]] = {}
        # (size, mtime) of each file as last handed to the kernel (``attrs``): an open
        # that finds the server's differ makes the kernel ask again (``revalidate``)
        self._handed: dict[int, tuple[int, int]] = {}
        # parent directories' statuses a change answered with, kept for the getattr the
        # kernel sends next: it drops a directory's attributes after every change in it and
        # (default_permissions) asks again at the next path walk. Directories only (no
        # write path changes them); served once, within attr_timeout of the answer (the
        # kernel would have cached them that long); dropped by any handler addressing a
        # name in the directory or changing it (child, drop_fresh), and not kept at all when
        # another such handler started while the change was in flight (``named`` counts
        # them: its answer may predate that handler's change).
        self._fresh: dict[int, tuple[float, FileStatus]] = {}
        self._named = 0
        # directories this mount made: (known until, names made in them here since)
        self._new_dirs: dict[int, tuple[float, set[bytes]]] = {}
        # folder listings answering lookups (statahead): by folder path; their generation
        # (a change here bumps it); lookups that asked the server, per folder (since,
        # count); folders too big to list (until)
        self._listings: dict[str, Listing] = {}
        self._listing_gen = 0
        self._asked: dict[str, tuple[float, int]] = {}
        self._too_big: dict[str, float] = {}
        # names a lookup here found missing: (folder path, name) -> until (trio time)
        self._misses: dict[tuple[str, bytes], float] = {}
        self._uid_cache: dict[str, int] = {}
        self._gid_cache: dict[str, int] = {}
        # bumped whenever the path of a watched inode (``watch_paths``) may have changed
        # (``paths_gen``)
        self._paths_gen = 0
        self._watched: Callable[[int], bool] = lambda ino: True

    @property
    def named(self) -> int:
        """How many handlers addressed a name so far (``keep_fresh`` compares it)."""
        return self._named

    @property
    def paths_gen(self) -> int:
        """The generation of the watched inodes' paths: whoever indexes them by path
        rebuilds the index when it changed."""
        return self._paths_gen

    def watch_paths(self, watched: Callable[[int], bool]) -> None:
        """Bump ``paths_gen`` only for the inodes ``watched`` says (and a folder's move,
        which moves what is below it): the directory leases index their folders by path,
        and a tree's files coming and going must not rebuild that index each time."""
        self._watched = watched

    @property
    def listing_gen(self) -> int:
        """The generation of changes here: a fetch that saw it change may predate one."""
        return self._listing_gen

    # ================================================================== the inode table
    def known_path(self, ino: int) -> str | None:
        """The path the kernel's ``ino`` has as far as this mount knows (None: not known,
        or gone)."""
        node = self._nodes.get(ino)
        return None if node is None else node.path

    def current_path(self, ino: int, fallback: str) -> str:
        """The path of the file the kernel knows as ``ino``, as far as this mount knows (a
        rename here moves it), else ``fallback``."""
        node = self._nodes.get(ino)
        return node.path if node is not None and node.path else fallback

    def symlink_target(self, ino: int) -> str | None:
        """A symlink's target, once a status of it was seen (it never changes)."""
        node = self._nodes.get(ino)
        return None if node is None else node.target

    def count_lookup(self, ino: int) -> None:
        """One more lookup of an inode the kernel holds (``.``)."""
        self._nodes[ino].lookups += 1

    def alias(self, ns_ino: int, ino: int) -> None:
        """The namespace's new inode ``ns_ino`` is the kernel's ``ino`` (a re-created file)."""
        self._alias[ns_ino] = ino

    def forget(self, inode_list) -> None:
        """pyfuse3's ``forget``: subtract lookups; drop what the kernel holds no more."""
        for ino, nlookup in inode_list:
            node = self._nodes.get(ino)
            if node is None or ino == ROOT_INO:
                continue
            node.lookups -= nlookup
            if node.lookups <= 0 and self._open_files.get(ino) is None:
                del self._nodes[ino]
                if self._watched(ino):
                    self._paths_gen += 1
                self._read_stamps.pop(ino, None)
                self._handed.pop(ino, None)
                for ns, k in list(self._alias.items()):
                    if k == ino:
                        del self._alias[ns]

    def drop_if_forgotten(self, ino: int) -> None:
        """The last open file of ``ino`` went: drop its node if the kernel forgot it."""
        node = self._nodes.get(ino)
        if node is not None and node.lookups <= 0 and ino != ROOT_INO:
            del self._nodes[ino]
            self._handed.pop(ino, None)
            if self._watched(ino):
                self._paths_gen += 1

    def forget_path(self, ino: int) -> None:
        """``ino`` has no name any more (removed, or replaced by a rename)."""
        node = self._nodes.get(ino)
        if node is not None:
            node.path = None
            if self._watched(ino):
                self._paths_gen += 1

    def moved(self, ino: int, src: str, dst: str, is_dir: bool) -> None:
        """A rename here moved ``ino`` from ``src`` to ``dst``; the paths of what the
        kernel knows below a folder move too."""
        if is_dir or self._watched(ino):
            self._paths_gen += 1
        node = self._nodes.get(ino)
        if node is not None:
            node.path = dst
        if is_dir:
            self.drop_listings()
            prefix = src + "/"
            for node in self._nodes.values():
                if node.path is not None and node.path.startswith(prefix):
                    node.path = dst + node.path[len(src):]

    @staticmethod
    def invalidate_attrs(ino: int) -> None:
        """Make the kernel ask getattr again: a released file's length now comes from the
        cluster, and what the kernel cached while it was open may be behind."""
        try:
            pyfuse3.invalidate_inode(ino, attr_only=True)
        except (OSError, RuntimeError) as exc:   # not known to the kernel (any more)
            log.debug("invalidate inode %d: %s", ino, exc)

    # ================================================================== kernel page cache
    def unchanged_since_read(self, ino: int, status: FileStatus, clean: bool) -> bool:
        """Whether the kernel's cached pages of ``ino`` still hold its content: the file is
        closed (``clean``: not written here either) and has the mtime, ctime and length it
        had at the last open for reading here (any write, truncate or append, here or by
        another client, changes them). Records the stamp for the next open."""
        if status.under_construction or not clean:
            self._read_stamps.pop(ino, None)
            return False
        stamp = (status.mtime_ns, status.ctime_ns, status.length)
        same = self._read_stamps.get(ino) == stamp
        self._read_stamps[ino] = stamp
        return same

    def revalidate(self, ino: int, status: FileStatus) -> None:
        """An open found file ``ino`` as ``status`` on the server: when the kernel was
        handed another size or mtime for it (another client changed it within
        ``attr_timeout``), it is made to ask again, so a read after the open sees the
        whole new content (close-to-open, as NFS gives)."""
        handed = self._handed.get(ino)
        if handed is not None and handed != (status.length, status.mtime_ns):
            self.invalidate_attrs(ino)

    def drop_read_stamp(self, ino: int) -> None:
        """``ino`` is opened for writing or truncated: its cached pages are not kept."""
        self._read_stamps.pop(ino, None)

    # ================================================================== misses
    def negative_entry(self, timeout: float | None = None) -> pyfuse3.EntryAttributes:
        """A miss the kernel caches for ``negative_timeout`` (inode 0), or ``timeout`` when
        shorter. A name this mount creates meanwhile is no problem: the kernel turns its
        own negative entry into the new one at create, mkdir, symlink and rename."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = 0
        attr.entry_timeout = (self.negative_timeout if timeout is None
                              else min(timeout, self.negative_timeout))
        return attr

    # ================================================================== new directories
    def note_new_dir(self, ino: int) -> None:
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

    def note_made(self, parent_ino: int, name: bytes) -> None:
        """``name`` was made in ``parent_ino`` through this mount."""
        entry = self._new_dirs.get(parent_ino)
        if entry is not None:
            entry[1].add(name)

    def drop_new_dirs(self, *inos: int) -> None:
        """Names went or moved in these directories: ask the server again."""
        for ino in inos:
            self._new_dirs.pop(ino, None)

    def known_missing(self, parent_ino: int, name: bytes) -> float | None:
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

    def listed(self, folder: str, name: bytes):
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

    async def listed_status(self, ino: int) -> tuple[float, FileStatus] | None:
        """A getattr's answer ``(seconds left, status)`` from its folder's listing (the
        kernel keeps a name it looked up but asks for its attributes again, e.g. after the
        release of a written file), or None: ask the server."""
        where = self._where(ino)
        if where is None:
            return None
        listed = self.listed(*where)
        if listed is None and await self.statahead(where[0]):
            listed = self.listed(*where)
        if listed is None or listed is ASK or self.kernel_ino(listed[1].ino) != ino:
            return None
        return listed

    def listed_attrs(self, left: float, status: FileStatus) -> pyfuse3.EntryAttributes:
        """The attributes of a listing's entry, which the kernel may keep no longer than the
        listing lives (``left`` seconds): its age counts."""
        attrs = self.attrs(status)
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

    def note_miss(self, folder: str, name: bytes) -> None:
        if len(self._misses) >= FRESH_LIMIT:
            now = trio.current_time()
            self._misses = {k: v for k, v in self._misses.items() if v > now}
            if len(self._misses) >= FRESH_LIMIT:
                self._misses.clear()
        self._misses[(folder, name)] = trio.current_time() + self.negative_timeout

    def cached_miss(self, folder: str, name: bytes) -> float | None:
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

    def touch_node(self, ino: int) -> None:
        """``_touch_listing`` for an inode's current name (the root and unlinked files are
        in no listing)."""
        where = self._where(ino)
        self._listing_gen += 1
        if where is not None:
            self._touch_listing(*where)

    def drop_listings(self) -> None:
        """Paths moved here (a folder renamed): no listing or miss can be trusted."""
        self._listing_gen += 1
        if self._listings:
            self._listings.clear()
        if self._misses:
            self._misses.clear()

    async def statahead(self, path: str) -> bool:
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
                page, more = await self._client.list_page(path, start_after)
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
    def path(self, ino: int) -> str:
        node = self._nodes.get(ino)
        if node is None or node.path is None:
            raise fuse_error(errno.ESTALE if node is None else errno.ENOENT)
        return node.path

    def child(self, parent_ino: int, name: bytes, *, changing: bool = True) -> str:
        """The path of ``name`` in ``parent_ino`` for a handler that may change the folder
        (``changing``: every name handler but lookup)."""
        self._fresh.pop(parent_ino, None)   # the handler may change the directory
        self._named += 1
        text = os.fsdecode(name)
        if "/" in text or text in ("", ".", ".."):
            raise fuse_error(errno.EINVAL)
        parent = self.path(parent_ino)
        if changing:   # the name, and the folder's own status (times, link count)
            self._touch_listing(parent, name)
            self.touch_node(parent_ino)
        path = "/" + text if parent == "/" else f"{parent}/{text}"
        if text.isascii() and "\0" not in text and len(text) <= MAX_NAME_BYTES \
                and len(path) <= MAX_PATH_CHARS:
            return path   # the parent's path is valid already: the name alone is checked
        try:
            return validate_path(path)
        except LeaseFSError as exc:
            raise fuse_error(exc.errno) from None

    def kernel_ino(self, ns_ino: int) -> int:
        return self._alias.get(ns_ino, ns_ino)

    def remember(self, ino: int, path: str, status: FileStatus | None = None) -> Node:
        """Register ``ino`` at ``path`` and count one lookup; a symlink's target is kept
        for readlink (an inode's target never changes: a new link is a new inode)."""
        node = self._nodes.get(ino)
        if node is None:
            node = self._nodes[ino] = Node(ino, path)
            if self._watched(ino):
                self._paths_gen += 1
        elif node.path != path:
            node.path = path
            self._paths_gen += 1
        node.lookups += 1
        if status is not None and status.is_symlink:
            node.target = status.symlink
        return node

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

    def attrs(self, status) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        ino = self.kernel_ino(status.ino)
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = self.entry_timeout
        attr.attr_timeout = self.attr_timeout
        kind = {"dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}.get(status.type, stat.S_IFREG)
        attr.st_mode = kind | (status.mode & 0o7777)
        of = self._open_files.get(ino)
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
        if not status.is_dir:
            self._handed[ino] = (attr.st_size, attr.st_mtime_ns)
        return attr

    async def status_of(self, ino: int):
        return await self._client.get_file_status(self.path(ino))

    def keep_fresh(self, named: int, *statuses: FileStatus | None) -> None:
        """Remember the directory statuses a change answered with for the kernel's next
        getattr, unless another handler addressed a name since this one (``named``: the
        count after its own ``child``)."""
        if named != self._named:
            return
        if len(self._fresh) > FRESH_LIMIT:
            self._fresh.clear()
        now = trio.current_time()
        for status in statuses:
            if status is not None:
                self._fresh[self.kernel_ino(status.ino)] = (now, status)

    def drop_fresh(self, ino: int) -> None:
        """A handler is changing ``ino``: a status kept for it no longer holds."""
        self._fresh.pop(ino, None)

    def fresh_status(self, ino: int) -> FileStatus | None:
        entry = self._fresh.pop(ino, None)
        if entry is not None and trio.current_time() - entry[0] < self.attr_timeout:
            return entry[1]
        return None


__all__ = ["ASK", "KernelView", "FRESH_LIMIT", "Listing", "ROOT_INO", "STATAHEAD_AFTER",
           "STATAHEAD_MAX"]
