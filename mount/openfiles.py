"""The mount's per-inode and per-handle state, and the open-file state table.

Why a module of its own: ``mount.operations`` translates FUSE requests; what one open file
is (its mode, stream, staging file, pending times, lease-holding handles) and the moves
between its modes are kept here, table-driven like ``storage/replica_states.py``: every
change of ``OpenFile.mode`` goes through ``OpenFile.move``, which asks ``TRANSITIONS`` first.

Modes of an open file, named after what holds its content:

* ``CLEAN``: the cluster's copy is the content; nothing of ours is pending.
* ``STREAM``: we hold the lease and an output stream (``create``/``append``) that takes
  sequential writes; the content is the cluster's copy plus what the stream has taken.
  A stream this mount began at offset 0 keeps a copy of what it took (``shadow``, while
  the file is at most ``SHADOW_MAX`` bytes): moving such a file to ``STAGING`` (a database
  journal rewriting its header) then needs no hflush and no read back from the cluster.
* ``STAGING``: the whole content is in a local staging file, uploaded (truncate, append)
  when flushed; ``keeper``, an idle output stream, holds the lease meanwhile when the file
  came from ``STREAM`` (so another client's open for writing still gets EBUSY). A file
  first written inside its content (a database, an editor saving in place) holds its
  lease through ``patcher`` instead (``fs.patchfile.PatchableFile``): what ``dirty``
  ranges say changed goes to the block servers as patches, not the whole file.

``OpenFiles`` is the mount's table of them: the open files by inode, the file and folder
handles by number, and the budget their stream copies share. It is a part of the mount
(``mount.operations``) that the other parts are given: ``mount.kernelview`` reads it (an open
file's own size, mode and times overlay the attributes; an open inode is not forgotten),
``mount.files`` adds and drops entries, ``mount.writes`` and ``mount.names`` look files up.

Concurrency contract: plain objects of the mount's one trio run; ``OpenFiles`` never awaits,
so each of its calls is atomic for the tasks of that run. An ``OpenFile`` changes only under
its ``lock`` (taken by every handler before its first await), a ``Handle``'s read window
under its ``read_lock``.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import errno
import math
import os

import pyfuse3
import trio

from fs.client import FileStatus
from fs.rpc import ACTING_FOR
from fs.errors import InternalError, LeaseFSError


class FileMode(str, enum.Enum):
    CLEAN = "clean"
    STREAM = "stream"
    STAGING = "staging"


class FileEvent(str, enum.Enum):
    """What happens to an open file, named after the client calls that do it."""

    CREATE = "create"          # a new file (or a new inode replacing our own stream's)
    APPEND = "append"          # the lease taken on an existing file, writes go on at its end
    COMPLETE = "complete"      # the stream closed: file completed, lease released
    STAGE = "stage"            # the content copied into a local staging file
    DISCARD = "discard"        # the staging file uploaded (or abandoned) and removed


M, E = FileMode, FileEvent

# the largest file whose stream keeps a copy of its bytes for a move to staging, and what
# the copies of all the files open in one mount may hold together
SHADOW_MAX = 1 << 20
SHADOW_TOTAL = 64 << 20


class CopyBudget:
    """The bytes the stream copies (``OpenFile.shadow``) of one mount hold together: past
    ``limit`` a file keeps no copy (staging it then reads it back from the cluster)."""

    def __init__(self, limit: int = SHADOW_TOTAL):
        self.limit = limit
        self.used = 0

TRANSITIONS: dict[tuple[FileMode, FileEvent], FileMode] = {
    (M.CLEAN, E.CREATE): M.STREAM,
    (M.CLEAN, E.APPEND): M.STREAM,
    (M.STREAM, E.COMPLETE): M.CLEAN,
    (M.CLEAN, E.STAGE): M.STAGING,
    (M.STREAM, E.STAGE): M.STAGING,         # the stream stays open as the lease keeper
    (M.STAGING, E.DISCARD): M.CLEAN,
}


def next_state(mode: FileMode, event: FileEvent) -> FileMode:
    """The mode after ``event``; ``InternalError`` (a bug of the mount) if the table has
    no such move."""
    try:
        return TRANSITIONS[(mode, event)]
    except KeyError:
        raise InternalError(f"open file: {event.value} is not allowed in mode "
                            f"{mode.value}") from None


class Node:
    """An inode the kernel knows: its current path and lookup count (and a symlink's
    target, once seen)."""

    __slots__ = ("ino", "path", "lookups", "target")

    def __init__(self, ino: int, path: str | None):
        self.ino = ino
        self.path = path
        self.lookups = 0
        self.target: str | None = None


class OpenFile:
    """State of one inode while any handle has it open.

    ``mode`` (a ``FileMode``, changed only by ``move``): ``CLEAN`` (nothing written),
    ``STREAM`` (``stream`` takes sequential writes) or ``STAGING`` (the whole content lives
    in ``staging``, a ``mount.staging.StagingFile``; ``dirty`` when it differs from the cluster's copy).
    """

    def __init__(self, ino: int, size: int, permission: int, owner: str | None = None,
                 group: str | None = None, replication: int | None = None,
                 block_size: int | None = None, copies: CopyBudget | None = None):
        self.ino = ino
        # the namespace inode holding the content now: ``ino`` until a re-upload replaces
        # the file (a new inode under the same name); what runs after a release addresses
        # this id, so a rename meanwhile does not lose it
        self.ns_ino = ino
        self.size = size
        self.permission = permission
        # kept so that a re-upload (a new inode under the same name) keeps them
        self.owner = owner
        self.group = group
        self.replication = replication
        self.block_size = block_size
        self._status = None
        self.status_at = -math.inf  # trio time ``status`` was last set
        # (mtime_ns, atime_ns) set explicitly while written (rsync, tar, cp -p): the
        # completion or upload at release would replace them, so they are set again then
        self.pending_times: tuple[int | None, int | None] | None = None
        # a chmod while written: set with the completion (or by fsync / after an upload)
        self.pending_mode: int | None = None
        self.mode = FileMode.CLEAN
        self.stream = None
        # STREAM begun at offset 0 here: a copy of every byte it took (None past SHADOW_MAX,
        # or when ``copies``, the mount's budget, is used up; no budget: never)
        self.shadow: bytearray | None = None
        self._copies = copies
        self.keeper = None          # STAGING: the idle output stream holding the lease
        # STAGING: the file opened for patches holding the lease instead, and the ranges
        # written since the last upload (``patchable`` false once a shrink made patches
        # unable to say what changed: the next upload sends the whole file)
        self.patcher = None
        self.dirty_ranges = DirtyRanges()
        self.patchable = True
        # CLEAN: the staging copy kept after a patched file was closed (``KeptCopy``)
        self.cache: KeptCopy | None = None
        self.closed_version: tuple | None = None   # set by the patcher's close, taken at once
        self.staging = None         # STAGING: the local copy (``mount.staging.StagingFile``)
        self.dirty = False
        self.error: LeaseFSError | None = None
        self.handles = 0
        self.writers = 0
        self.opened_for_writing = False   # by any handle since it was opened here
        self.unlinked = False
        self.generation = 0       # bumps whenever the cluster copy changes under readers
        self.lock = trio.Lock()

    @property
    def clean(self) -> bool:
        """Nothing written here, no writer, not unlinked: the cluster's copy is its content
        (a read may take it, or the lease's status of it, as it is)."""
        return self.mode is FileMode.CLEAN and not self.writers and not self.unlinked

    @property
    def status(self):
        """Last FileStatus seen: attributes once it is unlinked, and while this mount
        writes the file (under its lease) for ``attr_timeout`` after it was fetched."""
        return self._status

    @status.setter
    def status(self, value) -> None:
        self._status = value
        self.status_at = trio.current_time()

    def move(self, event: FileEvent) -> None:
        """Change ``mode`` as the transition table says (``InternalError`` if it may not)."""
        self.mode = next_state(self.mode, event)
        self.drop_copy()
        # only a stream that starts the content here can copy all of it
        if event is FileEvent.CREATE and self._copies is not None:
            self.shadow = bytearray()

    def stream_took(self, data) -> None:
        """The stream took ``data`` at its end: the copy follows, or is dropped once the
        file outgrows ``SHADOW_MAX`` or the mount's budget is used up. Lock held."""
        if self.shadow is not None:
            copies = self._copies
            if (len(self.shadow) + len(data) > SHADOW_MAX
                    or copies.used + len(data) > copies.limit):
                self.drop_copy()
            else:
                self.shadow += data
                copies.used += len(data)

    def drop_copy(self) -> None:
        """Give the stream copy's bytes back to the mount's budget (the file left STREAM,
        or is forgotten)."""
        if self.shadow is not None:
            self._copies.used -= len(self.shadow)
            self.shadow = None

    def handle_gone(self, handle: "Handle") -> None:
        """``handle`` of this file is released: no longer counted among its handles."""
        self.handles -= 1
        if handle.writable:
            self.writers -= 1

    def shadow_content(self) -> bytes | None:
        """The whole content from the copy, when it holds every byte the stream took."""
        if (self.mode is FileMode.STREAM and self.shadow is not None
                and len(self.shadow) == self.stream.pos):
            return bytes(self.shadow)
        return None


@dataclasses.dataclass(frozen=True)
class KeptCopy:
    """The staging copy a patched file keeps after its close: the ``version`` of the
    content it holds (``fs.patchfile.block_versions``) and that version's ``(length,
    mtime_ns)``. Reads take it while the open file's ``generation`` is still the one it was
    kept at (nothing told the mount the file changed; an open that finds another version
    sets it to -1); the next open for patches reuses it when the versions match."""
    file: object   # mount.staging.StagingFile
    version: tuple
    status: tuple
    generation: int


class DirtyRanges:
    """The byte ranges of a staged file written since its last upload: sorted, disjoint
    ``[start, end)`` spans, touching ones merged (a database's page writes come in runs)."""

    def __init__(self):
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        # the first span that ends at or after ``start`` and the first that starts after
        # ``end``: everything between merges with the new one
        lo = bisect.bisect_left(ends, start)
        hi = bisect.bisect_right(starts, end)
        if lo < hi:
            start = min(start, starts[lo])
            end = max(end, ends[hi - 1])
        starts[lo:hi] = [start]
        ends[lo:hi] = [end]

    def spans(self, limit: int) -> list[tuple[int, int]]:
        """The spans, cut at ``limit`` (the file's size now)."""
        return [(a, min(b, limit)) for a, b in zip(self._starts, self._ends) if a < limit]

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()


class Handle:
    """One ``open``/``create``: its file and (for reads of a clean file) an input stream."""

    def __init__(self, fh: int, of: OpenFile, flags: int):
        self.fh = fh
        self.of = of
        self.flags = flags
        self.writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        self.input = None
        self.input_generation = -1
        # (generation, block locations) handed out with the status at open: the first read
        # opens its input stream from them when the file has not changed here since
        self.located: tuple[int, dict] | None = None
        # read window: the kernel reads in requests of at most 128 KiB (readahead folios);
        # one sequential fetch of READ_WINDOW serves the next ones from memory
        self.window_offset = 0
        self.window = b""
        self.window_ends_file = False   # the window holds the file up to its end
        self.read_lock = trio.Lock()
        self.stalled_at: float | None = None   # trio time the last read ended stalled
        # who opened it (``mount.callers``): the calls for this handle's reads, writes,
        # flushes and release act for that user
        self.identity = ACTING_FOR.get()

    def from_window(self, off: int, size: int) -> bytes | None:
        start = off - self.window_offset
        if 0 <= start and (self.window_ends_file
                           or off + size <= self.window_offset + len(self.window)):
            return self.window[start:start + size]
        return None


class DirHandle:
    """An open directory: readdir cookies are indexes into ``names``, the names handed to the
    kernel so far (stable for the handle); ``fetched`` holds entries of the last page not
    handed out yet (the kernel's buffer was full), ``complete`` says the server has no more."""

    def __init__(self, ino: int):
        self.ino = ino
        self.identity = ACTING_FOR.get()   # who opened it: readdir lists as that user
        self.names: list[str] = []
        self.fetched: collections.deque = collections.deque()
        self.complete = False

    def rewind(self, start_id: int) -> None:
        """The kernel asks from an earlier cookie than the next (rewinddir, seekdir): fetch
        from there again."""
        del self.names[start_id:]
        self.fetched.clear()
        self.complete = False


class OpenFiles:
    """The open files of one mount by inode, its file and folder handles by number (one
    sequence of numbers for both), and the budget of the open files' stream copies."""

    def __init__(self):
        self._open: dict[int, OpenFile] = {}
        self._copies = CopyBudget()   # what the open files' stream copies hold together
        self._handles: dict[int, Handle] = {}
        self._dirs: dict[int, DirHandle] = {}
        self._next_fh = 1

    # ------------------------------------------------------------------ open files
    def get(self, ino: int) -> OpenFile | None:
        """The open file the kernel knows as ``ino``, if any handle has it open."""
        return self._open.get(ino)

    def files(self):
        """The open files (a live view: no await while walking it)."""
        return self._open.values()

    def open_file(self, ino: int, size: int, permission: int, status: FileStatus) -> OpenFile:
        """The open file of ``ino``, registered now (``size``, ``permission`` and what
        ``status`` says) unless it is open already."""
        of = self._open.get(ino)
        if of is None:
            of = self._open[ino] = OpenFile(
                ino, size, permission, owner=status.owner, group=status.group,
                replication=status.replication or None, block_size=status.block_size or None,
                copies=self._copies)
            of.ns_ino = status.ino   # the kernel's number may be an alias of a re-upload
        return of

    def is_current(self, of: OpenFile) -> bool:
        """Whether ``of`` is still the registered open file of its inode (not finished)."""
        return self._open.get(of.ino) is of

    def remove(self, of: OpenFile) -> None:
        """Forget ``of``, its last handle gone and its file published."""
        of.drop_copy()   # a stream whose completion failed may still hold one
        del self._open[of.ino]

    # ------------------------------------------------------------------ handles
    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def add_handle(self, of: OpenFile, flags: int) -> Handle:
        """A new handle of ``of`` opened with ``flags``."""
        handle = Handle(self._new_fh(), of, flags)
        of.handles += 1
        if handle.writable:
            of.writers += 1
            of.opened_for_writing = True
        self._handles[handle.fh] = handle
        return handle

    def handle(self, fh: int) -> Handle:
        """The file handle ``fh`` (``EBADF`` if there is none)."""
        handle = self._handles.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return handle

    def find_handle(self, fh: int) -> Handle | None:
        return self._handles.get(fh)

    def handles(self) -> list[Handle]:
        """The file handles open now (a snapshot)."""
        return list(self._handles.values())

    def drop_handle(self, handle: Handle) -> None:
        """``handle`` is being released: its number names nothing from now on (its file
        still counts it until the release is through, ``OpenFile.handle_gone``)."""
        self._handles.pop(handle.fh, None)

    def add_dir(self, ino: int) -> int:
        """A new folder handle of ``ino``: its number."""
        fh = self._new_fh()
        self._dirs[fh] = DirHandle(ino)
        return fh

    def dir(self, fh: int) -> DirHandle | None:
        return self._dirs.get(fh)

    def drop_dir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    def identity(self, fh: int) -> dict | None:
        """Who opened file or folder handle ``fh`` (``mount.callers``)."""
        handle = self._handles.get(fh) or self._dirs.get(fh)
        return None if handle is None else handle.identity


__all__ = ["FileMode", "FileEvent", "TRANSITIONS", "SHADOW_MAX", "SHADOW_TOTAL", "CopyBudget",
           "next_state", "Node", "OpenFile", "Handle", "DirHandle", "OpenFiles"]
