"""The mount as a directory lease holder (``DirLeaseHolder``, a part of the mount that
``mount.operations`` composes; docs/design/dirleases.md): the leases it holds, what each
covers, and the one queue of changes it acknowledged ahead of the metadata server.

Why a part of its own: creating, removing and renaming names through the mount would
otherwise wait one synchronous metadata round trip per call. While the mount holds a directory's write
lease, no other client sees or changes the directory (the server recalls the lease first),
so the mount decides a change there from what the grant carried plus its own changes since
(``LeasedDir.entries``), answers the application at once, and sends the change later with
the others (``dir_batch``: in order, batched, one batch in flight).

Rules that keep the namespace what the applications were told:

* One queue per mount, in the order the changes were acknowledged: a crash of the mount
  leaves the server's namespace equal to its operations up to some point, never reordered.
* ``barrier`` (installed as the client's): every other change the mount makes on the
  metadata server first waits until the queue is sent (the order is kept); a read waits
  only when it could see a queued change (it names a changed name, a path below one, or a
  changed folder), so the server answers it with the mount's changes applied.
* A lease is asked for at the first change in a directory (after the queued changes in it,
  of a lease given back since, are sent: the grant's snapshot holds them); a directory the
  server will not lease (too big, another holder, calls in flight) is not asked again for
  ``REFUSED_FOR``. A held folder's getattr, its misses, the lookups of names the mount did
  not change since the grant and its listing are answered from the lease; a folder under a
  held one is listed by taking its lease (the grant carries the entries).
* A lease answers and decides only while the mount heard from the server within its trust
  (``usable``: 0.6 of the recall limit; the events poll, answered at least every third of
  it, keeps that true while the server is reachable): past the recall limit the server may
  have ended it over a recall the mount never saw. An ``ended`` event drops it at once.
* A recall (the server's ``dir_lease_events`` long poll, kept outstanding: it also keeps
  the holder's leases alive) sends the queue and gives the lease back, in the queue, so
  the release follows the changes it covers. A lease idle for ``IDLE_FOR`` is given back
  the same way: another client then pays no recall. A recall of a lease the mount does
  not know it holds is answered at once, unless a grant is being asked for: its answer
  may be the one recalled (``asking``), and is then given back unused.
* A file created here gets an inode from the grant's reserved range (``take_ino``) and the
  status ``create`` would give it (a lease running low asks for more in the queue,
  ``Refill``, ``REFILL_AT``, so the next range is there before this one is spent); its
  stream's small-file publish and close are queued as ``Write`` (``file_calls``), a close
  in its publish's place, and the sender gathers changes ``GATHER`` seconds (unless
  someone waits) so a file made whole goes as a create and its close, which the server
  applies as one. Such a file, once closed, is answered
  from the lease (``known_file``), once no handle of it is open here. chmod and utimens
  of an entry whose attributes the lease knows are queued as ``SetAttr`` (``set_attrs``)
  when the grant says its server applies them. Only the mount's own user's calls are
  decided here: the queue is sent as that user.
* A lease that ended under the mount (its holder was silent past the server's limits)
  loses the changes sent after it ended: the batch's answer says where, and the log names
  every change lost. A change the server refuses ends the leases it was decided under
  (``_end_after_loss``); a batch refused whole is sent again one change per call.

Concurrency contract: methods of the mount's one trio run. The decisions of a change
(``held``, ``queue``, the ``LeasedDir`` fields) run without an await, so a handler decides
and queues atomically; the kernel itself serialises the changes of one directory (its
i_rwsem). ``lease_for`` and ``flush`` await; the sender and the events poll are tasks of
``run``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable

import trio

from fs import dirops
from fs.errors import LeaseFSError, ServerUnavailable
from fs.rpc import ACTING_FOR
from fs.status import FileStatus

log = logging.getLogger(__name__)

#: seconds a directory the server would not lease is not asked for again
REFUSED_FOR = 10.0
#: seconds without use (a change decided under it, a name, status or listing it answered)
#: after which a lease is given back, so another client's access to a folder held idle
#: costs it no recall; long enough that a tree being extracted or committed keeps the
#: folders it comes back to (tar sets a folder's times after its subtree). Reads count: a
#: tree extracted and then read (git add, a build) would otherwise lose its leases while
#: being read, and every open after that would ask the server again. 10 s was too short
#: on a busy machine: tar's first folders went idle before git add came back to them
IDLE_FOR = 30.0
#: changes queued at most; a change beyond waits for the sender
QUEUE_LIMIT = 4096
#: the longest the events poll waits on the server: shorter when the client's call timeout
#: or the leases' recall limit is (``_poll_wait``), so a poll is answered before its call
#: gives up and before the mount stops trusting its leases
EVENTS_WAIT = 20.0
#: the share of the server's recall limit a lease is trusted for after the mount last
#: heard the server had no recall for it (``usable``): the rest is the margin for the
#: answer's way back and the two clocks' rates
TRUST_SHARE = 0.6
#: the recall limit assumed when a grant does not say (an older server's default)
RECALL_LIMIT = 10.0
#: how long the sender lets changes gather before it sends them, unless someone waits for
#: them: a small file created, written and closed meanwhile goes as one change
GATHER = 0.005
#: inode numbers a grant is asked to reserve for the files this mount creates under it
#: (unused ones are only a gap in the numbering)
INOS_PER_GRANT = 1024
#: a lease with fewer ids than this left (or than half of the range it got last) and none
#: on their way asks for ``INOS_PER_GRANT`` more (``dirops.Refill``, answered with the
#: batch it goes in): a folder of many files waits for no ids and makes no create a call,
#: and a folder of a few files asks for none
REFILL_AT = 512
#: folders below a folder that one grant is asked to lease too, when a tree is being
#: walked and changed here (``lease_for(below=True)``: a listing in a held folder, an
#: rmdir of a held folder): rm -rf of a tree takes a few grants, not one per folder
BELOW_FOLDERS = 256
#: bytes of small files made and closed here kept for reading them back (``content_of``),
#: least recently used first out
CONTENT_KEPT = 128 << 20
#: the ids a folder made here takes along for its own lease out of its parent's range,
#: while the parent keeps at least as many (else the server reserves fresh ones for it)
CHILD_INOS = 256


#: the metadata server's calls that change nothing: they wait for the queue only when
#: they could see a change in it
READS = frozenset({"get_file_info", "exists", "list_status", "get_block_locations",
                   "content_summary", "report", "get_server_defaults"})
#: the reads that see below the path they name
RECURSIVE_READS = frozenset({"content_summary"})
#: the calls that name a file by inode, not path: they wait for the queue only when it
#: still holds that file's create
BY_INODE = frozenset({"lock_get", "lock_set", "lock_release"})


def _reserved(inos) -> tuple[int, int]:
    """A grant's reserved inode numbers ``[first, count]`` (none when absent or malformed)."""
    if (isinstance(inos, (list, tuple)) and len(inos) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in inos)):
        return inos[0], inos[1]
    return 0, 0


def _ancestors(path: str) -> list[str]:
    """The folders above ``path``, the root included."""
    out = []
    while path not in ("/", ""):
        path = path.rpartition("/")[0] or "/"
        out.append(path)
    return out


@dataclasses.dataclass
class LeasedDir:
    """A directory this mount holds the write lease of, as the mount sees it now."""

    kernel_ino: int
    ino: int                              # its namespace inode
    epoch: int
    status: FileStatus                    # its own attributes, with the changes made here
    entries: dict[bytes, FileStatus]      # every entry, with the changes made here
    used: float = 0.0                     # trio time of the last use (IDLE_FOR)
    giving_back: bool = False             # recalled or idle: no change is decided here
    # names whose attributes this mount may have changed since (written, set, moved):
    # a lookup of them asks the server (``mark``)
    stale: set[bytes] = dataclasses.field(default_factory=set)
    marks: int = 0                        # names marked stale so far
    # the inode numbers the grant reserved for files created here, not used yet
    next_ino: int = 0
    end_ino: int = 0
    # attribute changes and folders made here may be queued (the grant's server applies
    # them)
    sets_attrs: bool = False
    makes_dirs: bool = False
    # made here: the server hands its reserved ids with the answer to its mkdir
    awaiting_inos: bool = False
    # the grant's server refills a lease's ids (and the grant reserved some), the first id
    # of the newest range this mount knows (a refill names it, so a resend is not a second
    # refill), the next range once a refill answered it, and whether one is on its way
    refills: bool = False
    newest: int = 0
    newest_count: int = 0
    spare_first: int = 0
    spare_end: int = 0
    refilling: bool = False
    # trio time the grant was asked for, and how long after the mount last heard from
    # the server the lease may decide anything (``DirLeaseHolder.usable``)
    asked_at: float = 0.0
    trust: float = RECALL_LIMIT * TRUST_SHARE

    def take_ino(self) -> int | None:
        """A reserved inode number for a file created here, or None (create it by a call)."""
        if self.next_ino >= self.end_ino:
            if not self._next_range():
                return None
        self.next_ino += 1
        return self.next_ino - 1

    def _next_range(self) -> bool:
        """Go on with the range a refill gave, if any."""
        if not self.spare_first:
            return False
        self.next_ino, self.end_ino = self.spare_first, self.spare_end
        self.spare_first = self.spare_end = 0
        return True

    def ids_on_their_way(self) -> bool:
        """Whether none is left to take now but some are coming (its mkdir's answer, or a
        refill's): a create or mkdir here waits for them rather than being a call."""
        return self.awaiting_inos or (self.refilling and self.next_ino >= self.end_ino
                                      and not self.spare_first)

    def wants_refill(self) -> bool:
        """Whether to ask for more ids now (few left, none on their way)."""
        return (self.refills and not self.refilling and not self.spare_first
                and not self.awaiting_inos and self.newest > 0
                and self.end_ino - self.next_ino < min(REFILL_AT, self.newest_count // 2))

    def refilled(self, first: int, count: int) -> None:
        """A refill's answer: its range comes after the one in use (none: under a quota,
        no refill is asked again)."""
        self.refilling = False
        if count:
            self.spare_first, self.spare_end = first, first + count
            self.newest, self.newest_count = first, count
        else:
            self.refills = False

    def take_dir_inos(self) -> tuple[int, int, int] | None:
        """For a folder made here: its inode number and the ids its own lease gets: ``first,
        count`` out of this range (``CHILD_INOS``, from its far end) while it keeps as
        many for itself, else ``0, INOS_PER_GRANT``: the server reserves them when it
        makes the folder and answers them. None when no id is left (make it by a call)."""
        if self.next_ino >= self.end_ino:
            self._next_range()
        left = self.end_ino - self.next_ino
        if left < 1:
            return None
        ino = self.next_ino
        self.next_ino += 1
        if left > 2 * CHILD_INOS:
            self.end_ino -= CHILD_INOS
            return ino, self.end_ino, CHILD_INOS
        if self.spare_end - self.spare_first > 2 * CHILD_INOS:
            self.spare_end -= CHILD_INOS
            return ino, self.spare_end, CHILD_INOS
        return ino, 0, INOS_PER_GRANT

    def closed_here(self, close: dirops.Write) -> None:
        """A file made here was closed with ``close`` (queued): its entry is what the
        server will have once it applies it, so lookups are answered from it again."""
        name = os.fsencode(close.name)
        entry = self.entries[name]
        self.entries[name] = dataclasses.replace(
            entry, length=len(close.data), under_construction=False,
            mtime_ns=close.time_ns if close.mtime_ns is None else close.mtime_ns,
            atime_ns=entry.atime_ns if close.atime_ns is None else close.atime_ns,
            ctime_ns=close.time_ns,
            mode=entry.mode if close.permission is None else close.permission)
        self.stale.discard(name)

    def mark(self, name: bytes) -> None:
        """``name``'s attributes may have changed here: the server's to say again."""
        self.stale.add(name)
        self.marks += 1

    def known(self, name: bytes) -> FileStatus | None:
        """The status of a file or symlink ``name`` as the server has it (nobody else
        changes it while the lease is held), or None: ask the server."""
        entry = self.entries.get(name)
        if entry is None or entry.is_dir or name in self.stale:
            return None
        return entry


class DirLeaseHolder:
    """The directory leases of one mount and its queue of changes."""

    def __init__(self, client, path_of: Callable[[int], str | None],
                 is_open: Callable[[int], bool], *, enabled: bool = True,
                 timeout: float = 30.0, paths_gen: Callable[[], int] = lambda: 0,
                 kernel_ino: Callable[[int], int] = lambda ino: ino):
        self._client = client
        self._path_of = path_of    # a kernel inode's path as the mount knows it
        self._kernel_ino = kernel_ino   # the kernel's inode for a namespace inode
        self._paths_gen = paths_gen   # changes whenever such a path may have changed
        # whether a namespace inode is open here (its size and times are the mount's own
        # until its release completes it: a snapshot's status of it may be behind)
        self._is_open = is_open
        self.enabled = enabled
        # a call waiting for the queue fails (EIO) after this long, as one waiting for
        # an unreachable server does
        self.timeout = timeout
        self._leases: dict[int, LeasedDir] = {}       # kernel inode -> lease
        # path -> lease, for ``_at``; rebuilt when a lease came or went (``_leases_gen``)
        # or a path changed
        self._by_path: dict[str, LeasedDir] = {}
        self._by_path_key: tuple[int, int] | None = None
        self._leases_gen = 0
        # grants asked for and not answered yet, and the recalls that came meanwhile for
        # leases this mount does not hold (epoch -> directory inode): the recall of a grant
        # may overtake its answer, which then must not be used
        self._asking = 0
        self._early: dict[int, int] = {}
        self._holding = trio.Event()              # set when a lease is asked for or held
        # leases a refused change relied on, their release queued (epoch -> lease): they
        # are forgotten once it is sent
        self._ending: dict[int, LeasedDir] = {}
        # leases whose refill of ids is on its way (epoch -> lease)
        self._refilling: dict[int, LeasedDir] = {}
        self._refused: dict[str, float] = {}          # path -> not asked again until
        # trio time the last answered events poll was sent: no recall the mount has not
        # seen is older than it; and the events it acted on, acknowledged by the next poll
        self._confirmed = -float("inf")
        # the events poll in flight (its scope, its wait)
        self._poll_scope: trio.CancelScope | None = None
        self._poll_for = 0.0
        self._to_ack: list[list] = []
        self._queue: list[dirops.DirOp] = []
        # what the queued changes touch, for the barrier's reads (``_touches``): per change
        # (in queue order) its paths; counted: the folders changed, the names changed and
        # every folder above a changed name
        self._touched: collections.deque[tuple[tuple[str, ...], ...]] = collections.deque()
        self._dirs: collections.Counter[str] = collections.Counter()
        self._names: collections.Counter[str] = collections.Counter()
        self._making: collections.Counter[int] = collections.Counter()   # queued creates
        self._above: collections.Counter[str] = collections.Counter()
        self._queued = 0       # changes ever queued
        self._acked = 0        # changes ever answered by the server
        self._sent = trio.Event()                 # set (and replaced) when a batch is answered
        self._wake = trio.Event()                 # the sender has work
        self._hurry = trio.Event()                # someone waits for the queue: no gathering
        self._sending = trio.Lock()               # one batch in flight
        self._in_flight = 0    # the queue's first changes, sent and not answered yet
        # small files made and closed here: their whole content by namespace inode, read
        # back without a call while the lease on their folder knows them (``content_of``)
        self._contents: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._content_bytes = 0
        self.lost = 0          # changes the server refused (logged)
        self.refused = 0       # grants the server refused
        self.batches = 0
        self.local_changes = 0

    # ------------------------------------------------------------------ decisions
    def holds(self, kernel_ino: int) -> bool:
        """Whether this mount has a lease on directory ``kernel_ino`` (usable or not)."""
        return kernel_ino in self._leases

    def held(self, kernel_ino: int) -> LeasedDir | None:
        """The lease on directory ``kernel_ino`` if changes there may be decided here (what
        is asked of it counts as its use, ``IDLE_FOR``)."""
        leased = self._leases.get(kernel_ino)
        if leased is None or not self.usable(leased) or not self._own_caller():
            return None
        leased.used = trio.current_time()
        return leased

    def usable(self, leased: LeasedDir) -> bool:
        """Whether ``leased`` may answer or decide anything now: not being given back, the
        metadata server not known unreachable (a connection broke without the server
        closing it, a connect failed: the lease may end meanwhile and the server would not
        be told), and a recall of it could not have waited unseen long enough for the
        server to end it: the mount heard from the server (an answered events poll, the
        grant) within ``trust`` seconds. Otherwise the calls go to the server, and fail as
        any call to it does (EIO after the mount's bound)."""
        if leased.giving_back or self._client.rpc.unreachable_since is not None:
            return False
        heard = max(leased.asked_at, self._confirmed)
        return trio.current_time() - heard < leased.trust

    def _reachable(self) -> bool:
        return self._client.rpc.unreachable_since is None

    def _poll_wait(self) -> float:
        """How long a poll may wait on the server: answered (recall or not) well within
        the call's timeout, and within a third of the shortest trust of a lease held (just
        before an answer, the mount last heard from the server two waits ago)."""
        trust = min((d.trust for d in self._leases.values()), default=RECALL_LIMIT * TRUST_SHARE)
        return max(0.1, min(EVENTS_WAIT, self.timeout / 2, trust / 3))

    def _own_caller(self) -> bool:
        """Whether the request being served is the mount's own user's. The queue is sent
        as that user; a mount acting for other callers (a proxy user: each call carries
        its caller, ``fs.rpc.ACTING_FOR``) decides nothing for them ahead of the server,
        whose permission check is for the caller."""
        acting = ACTING_FOR.get()
        return acting is None or acting.get("user") == self._client.rpc.user

    def _at(self, path: str) -> LeasedDir | None:
        """The lease on the folder at ``path`` (being given back too), or None: from an
        index by path, rebuilt only after a lease came or went or a held folder's path
        may have changed (``paths_gen``; a tree being extracted asks for every file, and a
        scan of the leases each time grows with the tree)."""
        key = (self._leases_gen, self._paths_gen())
        if key != self._by_path_key:
            self._by_path = {}
            for leased in self._leases.values():
                where = self._path_of(leased.kernel_ino)
                if where is not None:
                    self._by_path[where] = leased
            self._by_path_key = key
        return self._by_path.get(path)

    def _holding_folder(self, path: str) -> tuple[LeasedDir | None, str, bytes]:
        """The lease on the folder of the entry at ``path`` (being given back too, or
        None), that folder's path and the entry's name."""
        folder, _, name = path.rpartition("/")
        folder = folder or "/"
        return self._at(folder), folder, os.fsencode(name)

    def held_at(self, path: str) -> bool:
        """Whether the folder at ``path`` is held here (and not being given back)."""
        leased = self._at(path)
        return leased is not None and self.usable(leased)

    async def lease_for(self, kernel_ino: int, path: str, *,
                        below: bool = False) -> LeasedDir | None:
        """The lease to decide a change in directory ``kernel_ino`` (at ``path``) under,
        asked for if this mount holds none; None: change it synchronously. ``below``: a
        tree is being walked and changed here: the grant also leases up to
        ``BELOW_FOLDERS`` folders below it (those the server can)."""
        if not self.enabled or not self._own_caller() or not self._reachable():
            return None
        leased = self._leases.get(kernel_ino)
        if leased is not None:
            return leased if self.usable(leased) else None
        now = trio.current_time()
        if self._refused.get(path, 0.0) > now:
            return None
        # the grant's snapshot must hold every change queued in the folder before it (an
        # earlier lease's, given back since) and of the folder itself (its mode or times
        # set from the folder above): the server does not wait for batched changes, and
        # changes elsewhere need not wait
        if self._dirs[path] > 0 or self._names[path] > 0:
            await self.flush()
        with self.asking():   # the answer is adopted before a recall of it is answered
            asked = trio.current_time()
            try:
                grant = await self._client.dir_lease_acquire(
                    path, want_inos=INOS_PER_GRANT, below=BELOW_FOLDERS if below else 0)
            except LeaseFSError as exc:   # the synchronous call says it better
                log.debug("directory lease on %s not granted: %s", path, exc)
                return None
            if grant.get("epoch") is None:
                self.refused += 1
                if len(self._refused) > 4096:
                    self._refused = {p: t for p, t in self._refused.items() if t > now}
                self._refused[path] = now + REFUSED_FOR
                log.debug("%s", grant.get("reason"))
                return None
            for sub in grant.get("below") or ():
                attrs = sub.get("attrs") if isinstance(sub, dict) else None
                if isinstance(attrs, dict) and isinstance(attrs.get("ino"), int):
                    self.adopt(self._kernel_ino(attrs["ino"]), sub, asked)
            return self.adopt(kernel_ino, grant, asked)

    @contextlib.contextmanager
    def asking(self):
        """Around a call that may answer a grant (``dir_lease_acquire``, ``mkdir`` with
        ``lease``): a recall overtaking its answer is kept for ``adopt``; recalls kept for
        no grant are answered (given back) once no grant is being asked for."""
        self._asking += 1
        self._holding.set()
        try:
            yield
        finally:
            self._asking -= 1
            if not self._asking and self._early:
                for epoch, ino in self._early.items():
                    self._append(dirops.Release(ino, epoch))
                self._early.clear()
                self._wake.set()

    def adopt(self, kernel_ino: int, grant: dict, asked: float) -> LeasedDir | None:
        """Hold the lease ``grant`` (``dir_lease_acquire``'s answer, asked for at trio time
        ``asked``) on directory ``kernel_ino``; None when it was not granted, or recalled
        already (then it is given back)."""
        if grant.get("epoch") is None:
            return None
        if self._early.pop(grant["epoch"], None) is not None:
            self._append(dirops.Release(grant["attrs"]["ino"], grant["epoch"]))
            self._wake.set()
            return None
        leased = self._leases.get(kernel_ino)
        if leased is not None:   # another handler's grant of it came first: the same lease
            return leased if self.usable(leased) else None
        status = FileStatus.from_wire(grant["attrs"])
        entries = {os.fsencode(e["name"]): FileStatus.from_wire(e) for e in grant["entries"]}
        first, count = _reserved(grant.get("inos"))
        limit = grant.get("recall_limit")
        if not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit <= 0:
            limit = RECALL_LIMIT
        leased = LeasedDir(kernel_ino, status.ino, grant["epoch"], status, entries,
                           used=trio.current_time(),
                           stale={name for name, e in entries.items() if self._is_open(e.ino)},
                           next_ino=first, end_ino=first + count,
                           sets_attrs="setattr" in (grant.get("changes") or ()),
                           makes_dirs="mkdir" in (grant.get("changes") or ()),
                           refills="refill" in (grant.get("changes") or ()) and count > 0,
                           newest=first, newest_count=count,
                           asked_at=asked, trust=limit * TRUST_SHARE)
        self._leases[kernel_ino] = leased
        self._leases_gen += 1
        self._holding.set()
        if self._poll_scope is not None and leased.trust / 3 < self._poll_for:
            # the poll in flight would confirm this lease too late (asked before it was
            # held, with a longer wait): it is asked again with this lease's
            self._poll_scope.cancel()
        return leased

    async def listing(self, kernel_ino: int, path: str) -> list[FileStatus] | None:
        """A folder's listing from its lease, or None (list it on the server): the lease
        held here, or taken now when the folder's parent is held (a tree being changed
        here, as by rm -rf: the grant is the listing, one call instead of two). Not while
        a name in it was changed here (its attributes are the server's to say)."""
        if not self.enabled:
            return None
        leased = self.held(kernel_ino)
        if leased is None:
            if path == "/" or not self.held_at(path.rpartition("/")[0] or "/"):
                return None
            leased = await self.lease_for(kernel_ino, path, below=True)
            if leased is None:
                return None
        if leased.stale:
            return None
        out = []
        for name in sorted(leased.entries):
            entry = leased.entries[name]
            if entry.is_dir:
                # a folder held here too: its own lease has its attributes (the changes
                # in it moved its times since this entry was made)
                below = self._leases.get(entry.ino)
                if below is not None and below.ino == entry.ino and self.usable(below):
                    entry = below.status
            text = os.fsdecode(name)
            if entry.name != text:   # renamed here: the lease keeps its status as it was
                entry = dataclasses.replace(
                    entry, name=text, path=("/" if path == "/" else path + "/") + text)
            out.append(entry)
        return out

    def changed(self, leased: LeasedDir, *, children: int = 0, subdirs: int = 0,
                now: int | None = None) -> int:
        """A change decided here at ``now`` (default: the clock's): the directory's times
        and counts as the server will have them (the change carries its time); the time."""
        now = time.time_ns() if now is None else now
        status = leased.status
        leased.status = dataclasses.replace(
            status, mtime_ns=now, ctime_ns=now,
            children=max(0, status.children + children),
            subdirs=max(0, status.subdirs + subdirs))
        leased.used = trio.current_time()
        self.local_changes += 1
        return now

    # the mount's synchronous changes in a directory it holds: the lease's view follows
    def note_made(self, parent: int, name: bytes, status: FileStatus,
                  parent_status: FileStatus | None = None) -> None:
        """``name`` was made (or replaced under a new inode) in ``parent`` by a call
        (``parent_status``: the folder's status the call answered with)."""
        leased = self._leases.get(parent)
        if leased is not None:
            fresh = name not in leased.entries
            leased.entries[name] = status
            leased.mark(name)   # a file made by a call is written next
            self._synced(leased, parent_status, children=1 if fresh else 0,
                         subdirs=1 if fresh and status.is_dir else 0)

    def _synced(self, leased: LeasedDir, parent_status: FileStatus | None, **counts) -> None:
        if parent_status is not None and parent_status.ino == leased.ino:
            leased.status = parent_status   # the server's own: nothing queued changes it
            leased.used = trio.current_time()
        else:
            self.changed(leased, **counts)

    def note_status(self, kernel_ino: int, status: FileStatus) -> None:
        """A held folder's attributes were set by a call (chmod, chown, utimens): its
        status is the one the call answered."""
        leased = self._leases.get(kernel_ino)
        if leased is not None and status.ino == leased.ino:
            leased.status = status

    def note_changed(self, path: str) -> None:
        """This mount changes the attributes of the entry at ``path`` (opened for writing,
        setattr, truncate): a held folder's lookup of it asks the server from now on."""
        leased, _, name = self._holding_folder(path)
        if leased is not None:
            leased.mark(name)

    def note_replaced(self, path: str, status: FileStatus) -> None:
        """The file at ``path`` got a new inode under its name (its content replaced)."""
        leased, _, name = self._holding_folder(path)
        if leased is not None:
            self.note_made(leased.kernel_ino, name, status)

    def note_gone(self, parent: int, name: bytes,
                  parent_status: FileStatus | None = None) -> None:
        """``name`` went from ``parent`` by a call."""
        leased = self._leases.get(parent)
        if leased is not None:
            entry = leased.entries.pop(name, None)
            if entry is not None:
                self._synced(leased, parent_status, children=-1,
                             subdirs=-1 if entry.is_dir else 0)

    def known_file(self, kernel_ino: int) -> FileStatus | None:
        """The status of file ``kernel_ino`` from the lease on its folder, when the lease
        knows it as the server has it (a file made and closed here: its create and
        content may still be queued, and asking the server would wait for them)."""
        path = self._path_of(kernel_ino)
        if path is None:
            return None
        leased, _, name = self._holding_folder(path)
        if leased is None or not self.usable(leased):
            return None
        known = leased.known(name)
        if known is not None:
            leased.used = trio.current_time()
        return known

    def content_of(self, kernel_ino: int) -> tuple[FileStatus, bytes] | None:
        """The status and whole content of small file ``kernel_ino`` made and closed here,
        while the lease on its folder knows it as closed then: nobody else changes it
        while the lease is held, and this mount's own changes (an open for writing, a
        truncate, a rename) leave the lease not knowing it until its next close here."""
        status = self.known_file(kernel_ino)
        if status is None:
            return None
        data = self._contents.get(status.ino)
        if data is None or len(data) != status.length:
            return None
        self._contents.move_to_end(status.ino)
        return status, data

    def _keep_content(self, ino: int, data: bytes) -> None:
        old = self._contents.pop(ino, None)
        if old is not None:
            self._content_bytes -= len(old)
        if len(data) > CONTENT_KEPT // 64:
            return
        self._contents[ino] = data
        self._content_bytes += len(data)
        while self._content_bytes > CONTENT_KEPT:
            _, gone = self._contents.popitem(last=False)
            self._content_bytes -= len(gone)

    # ------------------------------------------------------------------ files made here
    async def create(self, leased: LeasedDir, folder: str, name: bytes, status: FileStatus,
                     *, owner: str | None, group: str | None,
                     replication: int | None, block_size: int | None) -> None:
        """A file created here under ``leased`` (``status``: as the server will have it,
        with an inode the grant reserved): the lease's view has it at once, the server gets
        it in the queue (under construction, leased to this client, as ``create`` makes
        it). Its stream's metadata calls go through ``file_calls``."""
        leased.entries[name] = status
        leased.mark(name)   # written next: its size and times are the open file's
        now = self.changed(leased, children=1, now=status.mtime_ns)
        self._refill_if_low(leased)
        await self.queue(dirops.Create(leased.ino, leased.epoch, os.fsdecode(name), status.ino,
                                       status.mode, owner, group, replication, block_size, now),
                         dirs=(folder,), names=(status.path,))

    async def make_dir(self, leased: LeasedDir, folder: str, name: bytes, status: FileStatus,
                       inos: tuple[int, int, int], *, owner: str | None,
                       group: str | None) -> LeasedDir:
        """A folder made here under ``leased`` (``status``: as the server will have it,
        with the inode ``inos[0]`` the grant reserved): the lease's view has it at once,
        the server gets it in the queue, and this mount holds its lease from now on (the
        epoch it names, ``dirops.child_epoch``; the range ``inos[1:]``), as the server
        grants it when it applies the change."""
        ino, first, count = inos
        leased.entries[name] = status
        now = self.changed(leased, children=1, subdirs=1, now=status.mtime_ns)
        change = dirops.Mkdir(leased.ino, leased.epoch, os.fsdecode(name), ino,
                              status.mode, owner, group, first, count, now)
        own = first + count if first else 0
        child = LeasedDir(ino, ino, change.lease_epoch, status, {},
                          used=trio.current_time(), next_ino=first, end_ino=own,
                          sets_attrs=leased.sets_attrs, makes_dirs=leased.makes_dirs,
                          refills=leased.refills, newest=first, newest_count=count,
                          awaiting_inos=not first and count > 0,
                          asked_at=leased.asked_at, trust=leased.trust)
        self._leases[ino] = child
        self._leases_gen += 1
        self._refill_if_low(leased)
        await self.queue(change, dirs=(folder,), names=(status.path,))
        return child

    def _refill_if_low(self, leased: LeasedDir) -> None:
        """Ask for more ids for ``leased`` when it runs low (in the queue: the answer
        comes with the batch, before the range in use is spent)."""
        if leased.wants_refill():
            leased.refilling = True
            self._refilling[leased.epoch] = leased
            self._append(dirops.Refill(leased.ino, leased.epoch, leased.newest,
                                       INOS_PER_GRANT))

    def file_calls(self, kernel_ino: int, ino: int, ended: Callable[[], bool]):
        """The metadata calls of the stream of file ``ino`` created here: a small file's
        publish (``fsync`` of inline data, not durable) and its close (``complete`` with no
        block) are queued as ``Write`` while its folder is held here, so a close answers at
        once and the content follows the create in the queue; every other call (a block,
        a durable fsync, or once the lease is gone) is made as the stream would. The
        callable's ``now(method, args)`` queues such a call without awaiting (False when
        it is not one, or the queue is full: then ``call`` it).
        ``ended()``: whether the file has no handle open here any more. Only a close then
        makes the lease answer for the file again: a close while it stays open (its
        stream ended at an unlock, a database's) is followed by changes made by calls,
        which the lease's entry would not see."""
        def queue(found) -> None:
            leased, folder, path, change = found
            leased.used = trio.current_time()
            self._put_write(change, folder, path)
            if change.close and ended():
                leased.closed_here(change)
                self._keep_content(change.ino, change.data)

        async def call(method: str, args: dict, **kwargs):
            found = self._file_write(kernel_ino, ino, method, args)
            if found is None:
                answer = await self._client.call_meta(method, args, **kwargs)
                if method == "complete" and answer is True and ended():
                    await self._learn_closed(kernel_ino, ino)
                return answer
            queue(found)
            if len(self._queue) > QUEUE_LIMIT:
                await self.flush()
            return True

        def now(method: str, args: dict) -> bool:
            """The call queued at once (True), when it is one the queue takes and the
            queue has room; False: make it through ``call`` (nothing was done)."""
            if len(self._queue) >= QUEUE_LIMIT:
                return False
            found = self._file_write(kernel_ino, ino, method, args)
            if found is None:
                return False
            queue(found)
            return True

        call.now = now
        return call

    async def _learn_closed(self, kernel_ino: int, ino: int) -> None:
        """File ``ino`` made here and written through blocks was closed by a call: the
        lease on its folder learns its status from the server, so lookups and listings
        there are answered from the lease again (a tree with a few big files would
        otherwise list each of its folders on the server). Nothing is learned when a
        change here may have overtaken the answer (a name marked meanwhile)."""
        path = self._path_of(kernel_ino)
        if path is None:
            return
        leased, _, name = self._holding_folder(path)
        if leased is None or name not in leased.stale or not self.usable(leased):
            return
        entry, marks = leased.entries.get(name), leased.marks
        if entry is None or entry.ino != ino:
            return
        try:
            status = await self._client.get_file_status(path)
        except LeaseFSError as exc:
            log.debug("%s: status after its close: %s", path, exc)
            return
        if (leased.marks == marks and leased.entries.get(name) is entry
                and status.ino == ino and self._leases.get(leased.kernel_ino) is leased
                and self.usable(leased)):
            leased.entries[name] = status
            leased.stale.discard(name)

    def _file_write(self, kernel_ino: int, ino: int, method: str, args: dict):
        if method == "complete" and args.get("last") is None:
            data, close = args.get("data") or b"", True
        elif method == "fsync" and args.get("sync") is False and args.get("data"):
            data, close = args["data"], False
        else:
            return None
        path = self._path_of(kernel_ino)
        if path is None:
            return None
        leased, folder, name = self._holding_folder(path)
        entry = leased.entries.get(name) if leased is not None else None
        if entry is None or entry.ino != ino or not self.usable(leased):
            return None
        return leased, folder, path, dirops.Write(
            leased.ino, leased.epoch, os.fsdecode(name), ino, bytes(data), close,
            args.get("mtime_ns"),
            args.get("atime_ns"), args.get("permission"), time.time_ns())

    def _put_write(self, change: dirops.Write, folder: str, path: str) -> None:
        """Queue ``change``. A publish of the same file not sent yet is replaced: by a
        later publish when it is the queue's last change, by the close when that carries
        the same content under the same name (the kernel sends a file's release after
        its flush, often after the next file's create: the close then takes the publish's
        place, where the server applies it with the create before it as one)."""
        for at in range(len(self._queue) - 1, self._in_flight - 1, -1):
            queued = self._queue[at]
            if (isinstance(queued, dirops.Write) and not queued.close
                    and queued.ino == change.ino and queued.dir == change.dir
                    and queued.name == change.name
                    and (at == len(self._queue) - 1 or change.close
                         and queued.data == change.data)):
                self._queue[at] = change
                return
            if getattr(queued, "ino", None) == change.ino:
                break   # the file's own earlier change: nothing to replace before it
        self._append(change, (folder,), (path,))

    def set_attrs(self, kernel_ino: int, *, mode: int | None = None,
                  owner: str | None = None, group: str | None = None,
                  mtime_ns: int | None = None,
                  atime_ns: int | None = None) -> FileStatus | None:
        """chmod, chown, utimens of an entry of a folder held here (not open here): the
        entry's status after them, the change queued (``SetAttr``); None: set them by
        calls. Decided here only when the lease knows the entry's attributes (a file not
        changed by calls since, a folder held here too) and the owner and group stay
        (a new owner or group is the server's to allow: its users and groups are not the
        kernel's; a chown to the same ones changes nothing). The kernel has checked the
        caller may (default_permissions)."""
        path = self._path_of(kernel_ino)
        if path is None or not self._own_caller():
            return None
        leased, folder, name = self._holding_folder(path)
        if leased is None or not leased.sets_attrs or not self.usable(leased):
            return None
        entry = leased.entries.get(name)
        if entry is None or entry.ino != kernel_ino:
            return None
        below = self.held(kernel_ino) if entry.is_dir else None
        base = below.status if below is not None else leased.known(name)
        if base is None or (owner or base.owner) != base.owner \
                or (group or base.group) != base.group:
            return None
        if mode is None and mtime_ns is None and atime_ns is None:
            return base   # tar's chown of what it made to who made it: nothing changes
        now = time.time_ns()
        status = dataclasses.replace(
            base, mode=base.mode if mode is None else mode,
            mtime_ns=base.mtime_ns if mtime_ns is None else mtime_ns,
            atime_ns=base.atime_ns if atime_ns is None else atime_ns, ctime_ns=now)
        leased.entries[name] = status
        if below is not None:
            below.status = status
        leased.used = trio.current_time()
        self.local_changes += 1
        self._append(dirops.SetAttr(leased.ino, leased.epoch, os.fsdecode(name), entry.ino,
                                    mode, None, None, mtime_ns, atime_ns, now),
                     (folder,), (path,))
        return status

    def forget(self, kernel_ino: int) -> LeasedDir | None:
        """The directory is gone here (an rmdir decided here): its lease ends with it."""
        self._leases_gen += 1
        return self._leases.pop(kernel_ino, None)

    # ------------------------------------------------------------------ the queue
    async def queue(self, change: dirops.DirOp, *, dirs: tuple[str, ...] = (),
                    names: tuple[str, ...] = ()) -> None:
        """Queue a change decided here (after its decision, without an await before it);
        ``dirs``: the paths of the folders it changes, ``names``: of the names it changes
        (what a read must not see without it)."""
        self._append(change, dirs, names)
        if len(self._queue) > QUEUE_LIMIT:
            await self.flush()

    def _append(self, change: dirops.DirOp, dirs: tuple[str, ...] = (),
                names: tuple[str, ...] = ()) -> None:
        self._queue.append(change)
        if isinstance(change, dirops.Create):
            self._making[change.ino] += 1
        above = tuple(a for name in names for a in _ancestors(name))
        self._touched.append((dirs, names, above))
        self._dirs.update(dirs)
        self._names.update(names)
        self._above.update(above)
        self._queued += 1
        self._wake.set()

    @property
    def pending(self) -> int:
        return self._queued - self._acked

    @property
    def held_count(self) -> int:
        return len(self._leases)

    async def flush(self) -> None:
        """Return once every change queued before the call was answered by the server."""
        target = self._queued
        while self._acked < target:
            self._wake.set()
            self._hurry.set()
            await self._sent.wait()

    async def barrier(self, method: str, args: dict) -> None:
        """The client's, before each call on the metadata server: a change waits for
        every change queued before it (the server applies them in the order the
        applications saw them); a read waits only when it could see a queued change (it
        names a changed name, a path below one or above one, or a changed folder)."""
        if method in BY_INODE:
            if self._making[args.get("ino")] <= 0:
                return
        elif self._acked < self._queued and method in READS \
                and not self._touches(method, args):
            return
        if self._acked < self._queued:
            with trio.move_on_after(self.timeout):
                await self.flush()
                return
            raise ServerUnavailable(f"{self.pending} namespace changes made here could not "
                                    f"be sent to the metadata server for {self.timeout:g} s")

    def _touches(self, method: str, args: dict) -> bool:
        path = args.get("path")
        if not isinstance(path, str):
            return True   # a read naming no path: it waits, to be safe
        if self._dirs[path] > 0 or self._names[path] > 0:
            return True
        if method in RECURSIVE_READS and self._above[path] > 0:
            return True
        return any(self._names[a] > 0 for a in _ancestors(path))

    async def give_back(self, leased: LeasedDir) -> None:
        """Send the changes and give the lease back (a recall, idle, unmount)."""
        if self._leases.get(leased.kernel_ino) is not leased:
            return
        leased.giving_back = True
        await self.queue(dirops.Release(leased.ino, leased.epoch))
        await self.flush()
        if self._leases.get(leased.kernel_ino) is leased:
            del self._leases[leased.kernel_ino]
            self._leases_gen += 1

    async def close(self) -> None:
        """Unmount (the sender has stopped): everything queued is sent and every lease
        given back, trying for ``timeout`` at most (what is left then is logged lost)."""
        for leased in list(self._leases.values()):
            leased.giving_back = True
            self._append(dirops.Release(leased.ino, leased.epoch))
        self._leases.clear()
        self._leases_gen += 1
        with trio.move_on_after(self.timeout):
            while self._queue:
                await self._send_next()
        if self._queue:
            self._drop(list(self._queue), 0, "the metadata server was not reachable at unmount")

    # ------------------------------------------------------------------ background
    async def run(self) -> None:
        """The sender, the recalls poll and the idle leases' return (the mount's nursery)."""
        if not self.enabled:
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_loop)
            nursery.start_soon(self._events_loop)
            nursery.start_soon(self._idle_loop)

    async def _send_loop(self) -> None:
        while True:
            if not self._queue:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            if not self._hurry.is_set() and len(self._queue) < dirops.MAX_BATCH:
                with trio.move_on_after(GATHER):
                    await self._hurry.wait()
            self._hurry = trio.Event()
            await self._send_next()

    async def _send_next(self) -> None:
        """Send the queue's first batch until the server answers it (a connection lost:
        sent again, which the server recognises)."""
        delay = 0.05
        async with self._sending:
            while True:
                batch = self._queue[:dirops.MAX_BATCH]
                if not batch:
                    return
                self._in_flight = len(batch)
                try:
                    try:
                        answer = await self._client.dir_batch(batch)
                    except LeaseFSError as exc:
                        if exc.retriable or len(batch) == 1:
                            raise
                        # refused whole for one change (a bug of ours or the server's):
                        # each sent alone, so only the one refused is lost
                        log.error("a batch of %d namespace changes was refused (%s): "
                                  "sending them one by one", len(batch), exc)
                        answer = await self._one_by_one(batch)
                    break
                except LeaseFSError as exc:
                    if not exc.retriable:   # not sent again
                        self._drop(batch, 0, f"refused: {exc}")
                        return
                    log.warning("sending %d namespace changes: %s; sending again",
                                len(batch), exc)
                await trio.sleep(delay)
                delay = min(2.0, delay * 2)
            self.batches += 1
            for granted in answer.get("inos") or ():
                self._got_inos(batch, granted)
            for failure in answer.get("failed") or ():
                self.lost += 1
                change = batch[failure["index"]]
                log.error("namespace change %s was refused by the metadata server: %s",
                          change, failure["error"].get("message"))
                self._end_after_loss(change)
            if answer.get("ended") is not None:
                self._drop(batch, int(answer.get("done") or 0), answer["ended"].get("message"))
            else:
                self._ack(len(batch))

    def _got_inos(self, batch: list, granted) -> None:
        """The ids the server reserved for a folder made here (``dir_batch``'s ``inos``):
        its lease decides creates from now on."""
        try:
            change = batch[granted["index"]]
            first, count = _reserved(granted["inos"])
        except (KeyError, IndexError, TypeError):
            return
        if isinstance(change, dirops.Refill):
            leased = self._refilling.pop(change.epoch, None)
            if leased is not None and self._leases.get(leased.kernel_ino) is leased:
                leased.refilled(first, count)
            return
        made = self._leases.get(change.ino) if isinstance(change, dirops.Mkdir) else None
        if made is not None and made.epoch == change.lease_epoch and made.awaiting_inos:
            made.next_ino, made.end_ino = first, first + count
            made.newest, made.newest_count = first, count
            made.awaiting_inos = False

    async def lease_to_make(self, kernel_ino: int, path: str,
                            name: bytes) -> LeasedDir | None:
        """``lease_for``, for a create or mkdir of ``name``: in a folder whose ids are
        still on their way (a folder made here: its mkdir's answer; a refill asked for too
        late), first waits for them (a call would wait for the queue all the same)."""
        leased = await self.lease_for(kernel_ino, path)
        if leased is not None and leased.ids_on_their_way() and name not in leased.entries:
            await self.flush()
            if not leased.ids_on_their_way():
                leased = await self.lease_for(kernel_ino, path)
        return leased

    def _end_after_loss(self, change: dirops.DirOp) -> None:
        """A change the server refused: the leases it was decided under no longer say what
        the server has. Nothing more is decided under them, and they are given back after
        what is queued (their view is forgotten then: the server's is the truth)."""
        pairs = [(change.dir, change.epoch)]
        if isinstance(change, dirops.Rename):
            pairs.append((change.dst_dir, change.dst_epoch))
        for leased in list(self._leases.values()):
            if (leased.ino, leased.epoch) in pairs and not leased.giving_back:
                leased.giving_back = True
                self._ending[leased.epoch] = leased
                self._append(dirops.Release(leased.ino, leased.epoch))
        if isinstance(change, dirops.Mkdir):
            # the folder was not made, so its lease was never granted: what was queued
            # under it is refused (and logged), nothing more is decided under it
            made = self._leases.get(change.ino)
            if made is not None and made.epoch == change.lease_epoch:
                made.giving_back = True
                del self._leases[change.ino]
                self._leases_gen += 1

    async def _one_by_one(self, batch: list) -> dict:
        """``batch`` sent one change per call: a ``dir_batch`` answer for all of it (an
        error that may pass is raised: the whole batch is sent again, and what was
        applied already is skipped as a resend)."""
        failed, granted = [], []
        for index, change in enumerate(batch):
            try:
                answer = await self._client.dir_batch([change])
            except LeaseFSError as exc:
                if exc.retriable:
                    raise
                failed.append({"index": index, "error": exc.to_wire()})
                continue
            failed += [{**f, "index": index} for f in answer.get("failed") or ()]
            granted += [{**g, "index": index} for g in answer.get("inos") or ()]
            if answer.get("ended") is not None:
                return {"done": index, "failed": failed, "ended": answer["ended"],
                        "inos": granted}
        return {"done": len(batch), "failed": failed, "ended": None, "inos": granted}

    def _ack(self, count: int) -> None:
        self._in_flight = 0
        for change in self._queue[:count]:
            if isinstance(change, dirops.Create):
                self._making[change.ino] -= 1
            elif isinstance(change, dirops.Release):
                ended = self._ending.pop(change.epoch, None)
                if ended is not None and self._leases.get(ended.kernel_ino) is ended:
                    del self._leases[ended.kernel_ino]
                    self._leases_gen += 1
        del self._queue[:count]
        for _ in range(count):
            dirs, names, above = self._touched.popleft()
            self._dirs.subtract(dirs)
            self._names.subtract(names)
            self._above.subtract(above)
        if not self._queue:   # the counters' zeros go with the last change
            self._making.clear()
            self._dirs.clear()
            self._names.clear()
            self._above.clear()
        self._acked += count
        sent, self._sent = self._sent, trio.Event()
        sent.set()

    def _drop(self, batch: list, done: int, why: str | None) -> None:
        """The changes from ``done`` on were not applied and never will be: a lease they
        rely on ended. The leases are forgotten (the server's view is the truth now)."""
        lost = batch[done:]
        self.lost += len(lost)
        for change in lost:
            log.error("namespace change %s is lost: %s", change, why)
        self._leases.clear()
        self._leases_gen += 1
        self._ending.clear()
        self._refilling.clear()
        self._ack(len(batch))

    async def _events_loop(self) -> None:
        delay = 0.1
        while True:
            # only while a lease is held or asked for, or events wait for their
            # acknowledgement (that poll does not wait): an idle mount's connection stays
            # idle (the server may close it, as any idle client's)
            while not self._leases and not self._asking and not self._to_ack:
                self._holding = trio.Event()
                await self._holding.wait()
            wait = self._poll_wait() if self._leases or self._asking else 0.0
            sent = trio.current_time()
            acks, self._to_ack = self._to_ack, []
            events = failed = None
            with trio.CancelScope() as self._poll_scope:
                self._poll_for = wait
                try:
                    events = await self._client.dir_lease_events(wait=wait, ack=acks)
                except LeaseFSError as exc:
                    failed = exc
            self._poll_scope = None
            if events is None:   # failed, or cut short for a lease trusted less long
                self._to_ack = acks + self._to_ack   # acknowledged by the next poll
                if failed is not None:
                    log.info("directory lease recalls: %s; asking again", failed)
                    await trio.sleep(delay)
                    delay = min(2.0, delay * 2)
                continue
            delay = 0.1
            self._confirmed = max(self._confirmed, sent)
            for event in events:
                if isinstance(event, dict):
                    await self._on_event(event)

    async def _on_event(self, event: dict) -> None:
        """Act on one of the server's events (a recall, the end of a lease), then
        acknowledge it in the next poll; one answered again (its acknowledgement was lost)
        finds nothing left to do."""
        epoch, ino, kind = event.get("epoch"), event.get("ino"), event.get("kind", "recall")
        if not isinstance(epoch, int) or not isinstance(kind, str):
            return
        self._to_ack.append([epoch, kind])
        leased = next((d for d in self._leases.values() if d.epoch == epoch), None)
        if kind == "ended":
            if leased is not None:
                # what is queued under it is refused, and the log names each change lost
                log.warning("directory lease on %s ended by the metadata server (a recall "
                            "unanswered in time, or this mount silent too long)",
                            event.get("path") or f"inode {ino}")
                leased.giving_back = True
                del self._leases[leased.kernel_ino]
                self._leases_gen += 1
            return
        if kind != "recall":
            return
        if leased is not None and not leased.giving_back:
            log.debug("directory lease on %s recalled", event.get("path"))
            await self.give_back(leased)
        elif leased is None and isinstance(ino, int):
            if self._asking:   # maybe the grant whose answer is on its way
                self._early[epoch] = ino
                return
            if any(isinstance(c, dirops.Release) and c.epoch == epoch for c in self._queue):
                return   # given back already, not sent yet
            # a lease this mount does not know it holds (its grant's answer was lost, or
            # given back and forgotten): given back at once, so the caller does not wait
            # for it to expire (the server skips a release it has had)
            self._append(dirops.Release(ino, epoch))
            await self.flush()

    async def _idle_loop(self) -> None:
        while True:
            await trio.sleep(IDLE_FOR / 2)
            now = trio.current_time()
            for leased in list(self._leases.values()):
                if not leased.giving_back and now - leased.used > IDLE_FOR:
                    await self.give_back(leased)


__all__ = ["DirLeaseHolder", "LeasedDir", "IDLE_FOR", "INOS_PER_GRANT", "QUEUE_LIMIT",
           "CHILD_INOS",
           "REFUSED_FOR"]
