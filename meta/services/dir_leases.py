"""Directory write leases, served: grants and releases journaled, other clients' access
recalled first, recalls handed to their holders (docs/design/dirleases.md).

Why it exists: ``meta.leases.dirleases.DirLeaseTable`` decides (pure); this service
performs what it decides: a grant or a release is a journal record (``DIR_LEASE_GRANT``,
``DIR_LEASE_RELEASE``, ``meta.journal.ops_dirleases``) whose apply changes the table, so
the table comes back at a restart and on an HA successor; a recall is an event queued for
its holder, who collects it with a long poll (``events``).

* ``acquire``: the caller must be allowed to write the directory; a directory with more
  than ``dir_lease_max_entries`` entries, or one another client holds, is not leased (the
  answer says why, the client stays synchronous there). A holder asking again for a
  directory it holds gets its lease as it is (a retry after a lost reply), its reserved
  inode ids included. A grant reserves up to ``want_inos`` (at most
  ``MAX_RESERVED_INOS``) inode ids for the files the holder creates there, taken from the
  namespace's allocator and journaled in the grant; none when the directory or a folder
  above it has a quota (a create acknowledged by the holder could be refused by it later).
* ``acquire`` first waits for the calls already in flight (``enter``/``leave``, counted by
  ``MetaServer.dispatch``; but the caller's own, ``IN_FLIGHT``), so the entries it answers
  hold every change that passed its access check before the grant. A holder's batched
  changes are not counted: each changes only folders its holder holds (their epochs are
  checked first), and nobody holds a folder being granted. The one exception, an entry's
  attributes set in the folder above (the folder's own status), is the holder's: its
  parent's holder is recalled before the grant goes on, and a holder asking for a lease
  itself sends its queued changes naming the folder first.
* ``release``: only under the epoch the holder was granted (``LeaseExpired`` otherwise).
* ``batch``: the holder's changes made ahead of the server (``fs.dirops``), in order,
  each run through ``dispatch`` without the recall hook; a resent change is skipped (its
  source no longer holds the inode it names; a create, when its inode exists); a lease
  that ended stops the batch. A create runs as ``create`` with the inode id chosen
  (``dirops.CHOSEN_INO``, from its lease's reserved range only), a write as ``complete`` or
  ``fsync`` with the content inline.
* ``events``: a holder's recalls, and the ends of its leases it did not ask for (an
  overdue recall, its silence), or ``[]`` once ``wait`` seconds passed; each is answered
  again until the holder acknowledges it in a later poll.
* ``before_access``: what ``MetaServer.dispatch`` awaits before any namespace call that
  names paths (``ACCESS_ARGS``; msgpack and Hadoop IPC calls alike, both dispatch there):
  for every directory the call's path walks touch (the root, each directory on the way,
  the last component when it is one; for a call that reaches a whole tree,
  ``SUBTREE_ARGS``, every folder below it too) that another client holds, the table's
  verdict —
  PROCEED runs the call as today; RECALL queues a recall for the holder, then waits; WAIT
  waits — until the lease is given back or ends: a recall unanswered for
  ``dir_lease_recall_limit`` (``overdue``: that holder loses all its leases), or a holder
  silent for ``lease_hard_limit``
  (``expire_ended``, from the lease monitor: a holder renews by ``renew_lease`` and by any
  directory lease call, its outstanding ``dir_lease_events`` poll included). An ended
  lease is journaled (DIR_LEASE_RELEASE) before anyone waiting proceeds, so after a crash
  the holder cannot come back with it.

The holder's name is the client name its file leases use (``client_name``); the caller of
an access is named by its connection, ``<client name>#<connection id>`` (``fs.rpcclient``,
``caller_name``), so a holder's own calls never recall its leases.

Concurrency contract: trio thread only; ``acquire``, ``release`` and an expiry await their
journal record, and the table changes in that record's apply (``lease_granted``,
``lease_ended``: synchronous, no await; an end wakes the accesses waiting for it). A grant
being journaled is remembered (``_granting``), so two acquires of one directory cannot
both journal a grant, and an end being journaled (``_ending``), so it is journaled once.
``before_access`` waits before the call takes any lock, so a holder's release (which
takes none) is never stuck behind a waiter. Every other method is atomic.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from fs import dirops, paths
from fs.errors import InvalidArgument, LeaseExpired, LeaseFSError, NotDirectory

from ..journal.ops_dirleases import DirLeaseGrant, DirLeaseRefill, DirLeaseRelease
from ..leases.dirleases import NO_INOS, DirLease, InoRange, StoredLease, Verdict
from ..namespace.args import MAX_LIST_LIMIT, check_int, check_name
from ..namespace.locks import LOCK_PARENT, LOCK_WRITE, lock_set, merge
from ..namespace.permissions import WRITE
from ..schema import keys
from ..schema.inode import DIR, FILE

if TYPE_CHECKING:
    from ..journal.edits import Edits
    from ..leases.dirleases import DirLeaseTable
    from ..namespace.access import Access
    from ..namespace.allocators import Allocators
    from ..namespace.locks import NamespaceLocking
    from ..namespace.plan import NamespacePlanner
    from ..namespace.quota import QuotaPlanner
    from ..namespace.view import NamespaceView

log = logging.getLogger(__name__)

#: the longest a ``dir_lease_events`` poll is held (well under a client's rpc_timeout)
MAX_EVENTS_WAIT = 30.0

#: the most events kept for one holder (one per lease recalled or ended: a holder polls
#: while it holds a lease, so only one that stopped polling reaches it)
MAX_EVENTS = 4096

#: the longest a grant waits for the calls already in flight to finish (then it is refused:
#: the client stays synchronous there)
GRANT_DRAIN_WAIT = 2.0

#: the most inode ids one grant reserves (a bigger ``want_inos`` gets this many): a
#: holder that uses them up asks again after giving the lease back, and ids reserved but
#: never used are a gap in the inode numbers, nothing more
MAX_RESERVED_INOS = 4096

#: the most folders below the one asked for that one grant also leases (``below``), and
#: the most entries they may hold together (what the answer lists)
MAX_BELOW = 256
MAX_BELOW_ENTRIES = 8192
#: the inode ids each folder leased along with another gets for its holder's creates
BELOW_INOS = 64

#: the arguments naming the paths a namespace call accesses, by method (msgpack names;
#: the Hadoop IPC translators dispatch the same methods)
ACCESS_ARGS: dict[str, tuple[str, ...]] = {
    name: ("path",) for name in (
        "get_file_info", "exists", "list_status", "get_block_locations", "content_summary",
        "mkdirs", "create", "create_symlink", "delete", "set_permission", "set_owner",
        "set_times", "set_replication", "set_quota", "append", "truncate", "recover_lease",
        "list_open_files", "fsck", "dir_lease_acquire")}
ACCESS_ARGS.update({"rename": ("src", "dst"), "rename_many": ("moves",),
                    "concat": ("target", "srcs")})

#: the arguments naming a folder whose whole tree a call reaches, by method: another
#: client's leases on folders below it are recalled too (a recursive delete removes what
#: a holder made there, a summary counts it, a quota must find no holder with ids below
#: it, a moved tree takes its leases under another quota). fsck and list_open_files look
#: at blocks and writers, not at names: an admin's fsck of / recalls nothing
SUBTREE_ARGS: dict[str, tuple[str, ...]] = {
    name: ("path",) for name in ("delete", "content_summary", "set_quota")}
SUBTREE_ARGS["rename"] = ("src",)

#: the calls a grant waits for when they are in flight (``enter``/``leave``): every access
#: but a lease request itself
DRAINED = frozenset(ACCESS_ARGS) - {"dir_lease_acquire"}
#: the generation of the call the running task serves (``MetaServer.dispatch`` sets it):
#: a grant that call asks for itself (``mkdirs`` with ``dir_lease``) does not wait for it
IN_FLIGHT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dir_lease_generation", default=None)

#: how the service runs one change of a batch: the server's dispatch without the recall
#: hook (a holder's change names its directories by inode: it neither sees nor waits for
#: another holder's directory on its path)
Dispatch = Callable[[object, str, dict], Awaitable[object]]


def caller_name(ctx) -> str:
    """The client name of a call's connection (``<name>#<connection id>``)."""
    return ctx.client_id.partition("#")[0]


def _closing(change, following) -> dirops.Write | None:
    """``following`` when ``change`` is a create and ``following`` the write that closes
    the same file under the same lease (the two run as one)."""
    if (isinstance(change, dirops.Create) and isinstance(following, dirops.Write)
            and following.close and following.ino == change.ino
            and following.dir == change.dir and following.epoch == change.epoch
            and following.name == change.name):
        return following
    return None


def _failed(failed: list, index: int, whole, exc: LeaseFSError) -> None:
    """Report the change at ``index`` refused (and the write that closes its file, which
    was not made either)."""
    failed.append({"index": index, "error": exc.to_wire()})
    if whole is not None:
        failed.append({"index": index + 1, "error": exc.to_wire()})


def access_paths(method: str, args: dict, names=ACCESS_ARGS) -> list[str]:
    """The path strings a call names (lists and lists of lists too: ``srcs``, ``moves``),
    of the arguments ``names`` lists for it; anything else is left to the handler to
    refuse."""
    out = []
    if not isinstance(args, dict):   # the dispatcher refuses it next
        return out
    for name in names.get(method, ()):
        value = args.get(name)
        for item in (value if isinstance(value, list) else [value]):
            for one in (item if isinstance(item, list) else [item]):
                if isinstance(one, str):
                    out.append(one)
    return out


def _acked(ack) -> set[tuple[int, str]]:
    """``dir_lease_events``' ``ack`` as a set of ``(epoch, kind)``; malformed pairs are
    left out (their events are answered again, which the holder ignores)."""
    if ack is None:
        return set()
    if not isinstance(ack, (list, tuple)):
        raise InvalidArgument(f"dir_lease_events: ack must be a list of [epoch, kind], "
                              f"got {type(ack).__name__}")
    return {(pair[0], pair[1]) for pair in ack[:MAX_EVENTS]
            if isinstance(pair, (list, tuple)) and len(pair) == 2
            and isinstance(pair[0], int) and isinstance(pair[1], str)}


@dataclasses.dataclass(frozen=True)
class BatchPlans:
    """How a run of a holder's changes is checked and planned without locks or journal:
    the front ends' own checks and planners (``ClientProtocol.plan_whole_create``,
    ``plan_inline_close`` and ``plan_mkdir``, ``NamespaceProtocol.plan_unlink``,
    ``plan_attrs`` and ``plan_move``), so a change in a run is refused exactly as its call
    would be."""
    create_whole: Callable[..., list]
    inline_close: Callable[..., object]
    mkdir: Callable[..., object]
    unlink: Callable[..., object]
    attrs: Callable[..., list]
    move: Callable[..., object]


def _refilled(lease: DirLease, change: dirops.Refill) -> bool:
    """Whether ``change`` was applied to ``lease``: its newest range is no longer the one
    the refill names as taken last."""
    return lease.inos.first != change.after


def _runnable(change, whole) -> bool:
    """Whether ``change`` may be planned in a run: a create (with the write that closes
    it or alone), the close of a small file with its content, an unlink, a mkdir, a mode
    or times change, a refill of ids, a rename that replaces nothing (the most of what a
    tree being written, committed or removed sends; git renames every object it writes).
    A rename of a folder is not (``_run_path``): it would move the paths of what follows
    it."""
    if isinstance(change, dirops.Write):
        return change.close and bool(change.data)
    if isinstance(change, dirops.SetAttr):
        return change.owner is None and change.group is None
    if isinstance(change, dirops.Rename):
        return change.replaced == 0
    return isinstance(change, (dirops.Create, dirops.Unlink, dirops.Mkdir, dirops.Refill))


@dataclasses.dataclass(frozen=True)
class _RunItem:
    index: int
    change: object
    whole: dirops.Write | None
    lease: DirLease
    parts: list
    path: str
    dst_parts: list | None = None   # a rename's destination
    dst_path: str | None = None


@dataclasses.dataclass
class _Run:
    """Changes of one batch planned together: one lock pass, one journal batch. Each
    plans against the state before the run, which is what it would see after the ones
    before it: they never share a name or an inode, nothing joins at or below an entry
    whose mode a change before it sets (that mode could decide its permission checks),
    and the records change only the fields they name, applied in order (a folder's times
    set after creates in it are the folder's times, as one at a time)."""
    items: list[_RunItem] = dataclasses.field(default_factory=list)
    names: set = dataclasses.field(default_factory=set)      # (folder, name)
    inos: set = dataclasses.field(default_factory=set)       # the entries changed
    guarded: list = dataclasses.field(default_factory=list)  # parts whose mode changed

    def takes(self, change, parts, dst_parts=None) -> bool:
        """Whether ``change`` (runnable, at path ``parts``; a rename's destination at
        ``dst_parts``) may join: independent of the run."""
        if isinstance(change, dirops.Refill):
            return True   # no name: only the lease's ids, which no other change here uses
        if (change.dir, change.name) in self.names or change.dir in self.inos \
                or change.ino in self.inos:
            return False
        if isinstance(change, dirops.Rename) and (
                (change.dst_dir, change.dst_name) in self.names
                or change.dst_dir in self.inos
                or any(dst_parts[:len(at)] == at for at in self.guarded)):
            return False
        return not any(parts[:len(at)] == at for at in self.guarded)

    def add(self, item: _RunItem) -> None:
        change = item.change
        self.items.append(item)
        if isinstance(change, dirops.Refill):
            return
        self.names.add((change.dir, change.name))
        self.inos.add(change.ino)
        if isinstance(change, dirops.Rename):
            self.names.add((change.dst_dir, change.dst_name))
        if isinstance(change, dirops.SetAttr) and change.permission is not None:
            self.guarded.append(item.parts)


class DirLeases:
    def __init__(self, *, table: DirLeaseTable, view: NamespaceView, edits: Edits,
                 locking: NamespaceLocking, access: Access, ids: Allocators,
                 quota: QuotaPlanner, planner: NamespacePlanner, max_entries: int,
                 hard_limit: float, clock: Callable[[], float], dispatch: Dispatch,
                 plans: BatchPlans):
        self.table = table
        self.dispatch = dispatch
        self.plans = plans       # a run's changes, checked and planned as their calls
        self.view = view
        self.ids = ids           # a grant's reserved inode ids
        self.quota = quota       # no reservation under a quota
        self.planner = planner   # a resent close: the file holds its content already
        self.edits = edits
        self.locking = locking
        self.access = access
        # one listing page holds them all
        self.max_entries = min(max_entries, MAX_LIST_LIMIT)
        self.hard_limit = hard_limit
        self.clock = clock
        self._granting: dict[int, tuple[str, trio.Event]] = {}   # ino -> (holder, done)
        self._ending: set[int] = set()
        # calls in flight by the generation they started in; a grant starts a new one and
        # waits until none of an older generation is left (``enter``/``leave``/``_drain``)
        self._generation = 0
        self._inflight: dict[int, int] = {}
        self._drains: list[tuple[int, trio.Event]] = []
        self._batching: dict[str, trio.Lock] = {}     # holder -> its batches, one at a time
        self._ended: dict[int, trio.Event] = {}         # ino -> set when its lease ends
        self._seen: dict[str, float] = {}               # holder -> its last call (clock)
        # holder -> its events (recalls, ends) not acknowledged yet: a poll answers them and
        # the next one acknowledges them, so an answer the holder never read (its call timed
        # out) is answered again
        self._events: dict[str, list[dict]] = {}
        self._polls: dict[str, trio.Event] = {}        # holder -> its waiting poll's wake-up
        self._polled: dict[str, float] = {}            # holder -> its last poll (clock)

    # ------------------------------------------------------------------ RPC bodies
    async def acquire(self, ctx, path, holder, want_inos=0, below=0) -> dict:
        """``{epoch, attrs, entries, inos}`` of a lease on directory ``path`` for
        ``holder``, or ``{epoch: None, reason}`` when it is not leased. ``inos``: ``[first,
        count]``, the inode ids reserved for the holder's creates there (up to
        ``want_inos``, at most ``MAX_RESERVED_INOS``; count 0: none, as under a quota).
        ``below``: also lease up to that many folders below it (at most ``MAX_BELOW``;
        ``_below`` picks them), answered as ``below: [{path, epoch, attrs, entries,
        inos}]``: a tree being walked and changed (rm -rf) then takes one grant, not one
        per folder.

        1. Check (no await): a directory, the caller may write it, nobody else holds it or
           is being granted it, not too big. A holder asking again gets its lease as is.
        2. Mark it being granted: from now on another client's access to it waits
           (``before_access``), then recalls the lease.
        3. Wait until every call that started before step 2 has finished (``_drain``): a
           change inside the directory that passed its access check just before would
           otherwise land after the snapshot of step 5. Too long a wait refuses the grant.
           A holder's batched change is not waited for (it cannot change this folder: the
           module's notes).
        4. Under the directory's write lock (nothing renames or removes it meanwhile,
           nor changes anything below it: every call there locks it for reading), check
           again, pick the folders below, reserve the inode ids and journal the grants in
           one batch (DIR_LEASE_GRANT: its txid is the epoch; it carries the ids).
        5. Snapshot what the leases cover: each directory's status and every entry's.

        The folders below need no drain and no mark of their own: every access to them
        walks the directory, which is marked (step 2) and then held."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(holder, f"dir_lease_acquire {canonical}: client_name")
        want = min(check_int(want_inos, f"dir_lease_acquire {canonical}: want_inos", low=0),
                   MAX_RESERVED_INOS)
        below = min(check_int(below, f"dir_lease_acquire {canonical}: below", low=0),
                    MAX_BELOW)
        self.renewed(holder)
        _, ino, inode, _ = self.view.resolve(canonical)
        self._check_dir(ctx, canonical, parts, inode)
        lease = self.table.lease_of(ino)
        if lease is not None and lease.holder == holder:
            return await self._snapshot(canonical, parts, lease)
        refusal = self._refusal(canonical, ino, inode, lease)
        if refusal is not None:
            return {"epoch": None, "reason": refusal}
        done = trio.Event()
        self._granting[ino] = (holder, done)
        try:
            if not await self._drain(GRANT_DRAIN_WAIT, IN_FLIGHT.get()):
                return {"epoch": None, "reason": f"{canonical}: not leased: calls in flight "
                                                 f"did not finish within {GRANT_DRAIN_WAIT:g} s"}
            async with self.locking.mutation(f"dir_lease_acquire {canonical}",
                                             lock_set(parts, LOCK_WRITE)):
                _, now_ino, inode, _ = self.view.resolve(canonical)
                if now_ino != ino:
                    return {"epoch": None, "reason": f"{canonical}: not leased: it was "
                                                     f"replaced while the grant waited"}
                self._check_dir(ctx, canonical, parts, inode)
                folders = [(canonical, ino, self._reserve(ino, want))] + [
                    (sub, sub_ino, self._reserve(sub_ino, BELOW_INOS))
                    for sub, sub_ino in self._below(ctx, canonical, ino, below)]
                grants = [DirLeaseGrant(ino=at, holder=holder, **(
                    {"first_ino": inos.first, "inos": inos.count} if inos.count else {}))
                    for _, at, inos in folders]
                epochs = await self.edits.log_plans(grants, durable=ctx.sync_metadata)
                log.debug("directory lease on %s (inode %d) granted to %s, epoch %d, "
                          "inodes reserved: %s; %d folders below with it", canonical, ino,
                          holder, epochs[0], folders[0][2], len(folders) - 1)
                answer = self._snapshot_now(canonical, epochs[0], folders[0][2])
                if below:
                    answer["below"] = [{"path": sub, **self._snapshot_now(sub, epoch, inos)}
                                       for (sub, _, inos), epoch
                                       in zip(folders[1:], epochs[1:])]
                return answer
        finally:
            del self._granting[ino]
            done.set()

    def _below(self, ctx, canonical: str, ino: int, most: int) -> list[tuple[str, int]]:
        """Up to ``most`` folders below ``canonical`` (``ino``), nearest first, that a grant
        of it takes along: nobody holds them or is being granted them, each within
        ``dir_lease_max_entries``, the caller may write each, and all their entries
        together within ``MAX_BELOW_ENTRIES`` (a folder that does not pass is not looked
        into). Synchronous: under the directory's write lock, nothing below it changes."""
        found: list[tuple[str, int]] = []
        queue = collections.deque([(canonical, ino)])
        entries = 0
        while queue and len(found) < most:
            folder, at = queue.popleft()
            for name, child in self.view.children(at):
                inode = self.view.get_inode(child)
                if inode is None or inode.type != DIR:
                    continue
                sub = paths.join(folder, name)
                size = inode.children or 0
                if (self._refusal(sub, child, inode, self.table.lease_of(child)) is not None
                        or entries + size > MAX_BELOW_ENTRIES):
                    continue
                try:
                    self._check_dir(ctx, sub, paths.split(sub), inode)
                except LeaseFSError:
                    continue
                found.append((sub, child))
                entries += size
                queue.append((sub, child))
                if len(found) == most:
                    break
        return found

    def _check_dir(self, ctx, canonical: str, parts, inode) -> None:
        if inode.type != DIR:
            raise NotDirectory(f"dir_lease_acquire {canonical}: not a directory (only "
                               f"directories are leased)")
        self.access.check_access(ctx, parts, access=WRITE)

    def _reserve(self, ino: int, want: int) -> InoRange:
        """``want`` inode ids for a grant on directory ``ino``, or none under a quota: a
        holder's create is decided before the server sees it, and a name quota (or the
        space of the small file it writes) could refuse it after it was acknowledged.
        Nothing walks the folders above when no quota exists anywhere
        (``quota_chain``)."""
        if not want or self.quota.quota_chain(ino):
            return NO_INOS
        return InoRange(self.ids.allocate_inos(want), want)

    async def _snapshot(self, canonical: str, parts, lease: DirLease) -> dict:
        async with self.locking.mutation(f"dir_lease_acquire {canonical}",
                                         lock_set(parts, LOCK_WRITE)):
            return self._snapshot_now(canonical, lease.epoch, lease.inos)

    def _snapshot_now(self, canonical: str, epoch: int, inos: InoRange) -> dict:
        attrs = self.view.get_file_info(canonical)
        listing = self.view.list_status(canonical, "", self.max_entries)
        return {"epoch": epoch, "attrs": attrs, "entries": listing["entries"],
                "inos": inos.to_wire(), "changes": list(dirops.KINDS),
                "recall_limit": self.table.recall_limit}

    def _refusal(self, canonical: str, ino: int, inode, lease) -> str | None:
        if lease is not None:
            return (f"{canonical}: not leased: the directory is leased to another client "
                    f"({lease.holder})")
        if ino in self._granting:
            return f"{canonical}: not leased: another client's grant of it is under way"
        entries = inode.children or 0
        if entries > self.max_entries:
            return (f"{canonical}: not leased: {entries} entries, more than "
                    f"dir_lease_max_entries ({self.max_entries})")
        return None

    # ------------------------------------------------------------------ calls in flight
    @property
    def active(self) -> bool:
        """Whether any lease is held or being granted (``dispatch`` asks
        ``before_access`` only then)."""
        return bool(len(self.table) or self._granting)

    def enter(self) -> int:
        """A call that accesses paths starts (after ``before_access``); its generation,
        for ``leave``."""
        generation = self._generation
        self._inflight[generation] = self._inflight.get(generation, 0) + 1
        return generation

    def leave(self, generation: int) -> None:
        left = self._inflight[generation] - 1
        if left:
            self._inflight[generation] = left
        else:
            del self._inflight[generation]
        if self._drains:
            waiting = []
            for target, own, done in self._drains:
                if self._drained(target, own):
                    done.set()
                else:
                    waiting.append((target, own, done))
            self._drains = waiting

    def _drained(self, target: int, own: int | None) -> bool:
        """No call of a generation older than ``target`` is in flight, but the caller's
        own (``own``: its generation, when it is a call that accesses paths itself)."""
        older = sum(n for generation, n in self._inflight.items() if generation < target)
        return older <= (1 if own is not None and own < target else 0)

    async def _drain(self, timeout: float, own: int | None) -> bool:
        """Start a new generation and wait until no call of an older one is in flight
        (but the caller's own); False after ``timeout`` seconds."""
        self._generation += 1
        target = self._generation
        if self._drained(target, own):
            return True
        done = trio.Event()
        self._drains.append((target, own, done))
        with trio.move_on_after(timeout):
            await done.wait()
        if not done.is_set():
            self._drains = [entry for entry in self._drains if entry[2] is not done]
        return done.is_set()

    async def release(self, ctx, path, holder, epoch) -> bool:
        """``holder`` gives back its lease ``epoch`` on directory ``path``. Found by its
        epoch (unique), so a directory renamed or removed since is given back too; the
        path names it in the errors."""
        canonical = paths.join_parts(paths.split(path))
        check_name(holder, f"dir_lease_release {canonical}: client_name")
        check_int(epoch, f"dir_lease_release {canonical}: epoch", low=1)
        self.renewed(holder)
        held = [lease for lease in self.table.held_by(holder) if lease.epoch == epoch]
        if not held:
            raise LeaseExpired(f"{canonical}: the directory lease (epoch {epoch}) of {holder} "
                               f"has ended (it holds no lease of that epoch)")
        await self.edits.log_plan(DirLeaseRelease(ino=held[0].ino, holder=holder, epoch=epoch),
                                  durable=ctx.sync_metadata)
        return True

    async def events(self, ctx, holder, wait, ack=None) -> list[dict]:
        """The events of ``holder``'s leases (``{path, epoch, ino, kind}`` each: ``recall``,
        give it back; ``ended``, the server ended it), waiting up to ``wait`` seconds for
        one. ``ack``: the ``[epoch, kind]`` pairs the holder has acted on, dropped first;
        the rest are answered again until acknowledged (a poll's answer may be lost to
        its call's timeout). Without ``ack`` the events answered are dropped."""
        check_name(holder, "dir_lease_events: client_name")
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or wait < 0:
            raise InvalidArgument(f"dir_lease_events: wait must be seconds >= 0, "
                                  f"got {wait!r:.60}")
        done = _acked(ack)
        self.renewed(holder)
        self._polled[holder] = self.clock()
        if done and holder in self._events:
            left = [e for e in self._events[holder] if (e["epoch"], e["kind"]) not in done]
            if left:
                self._events[holder] = left
            else:
                del self._events[holder]
        if not self._events.get(holder):
            woken = self._polls.setdefault(holder, trio.Event())
            with trio.move_on_after(min(wait, MAX_EVENTS_WAIT)):
                await woken.wait()
            if self._polls.get(holder) is woken:
                del self._polls[holder]
        self.renewed(holder)
        self._polled[holder] = self.clock()
        if ack is None:
            return self._events.pop(holder, [])
        return list(self._events.get(holder, ()))

    async def batch(self, ctx, holder, ops) -> dict:
        """Apply ``holder``'s changes (``fs.dirops``) in order, as the mount acknowledged
        them; ``{done, skipped, failed: [{index, error}], ended}``.

        1. Read every change (a malformed one refuses the whole batch, nothing applied).
           A ``mkdir`` that asks for fresh ids (``inos: [0, count]``) gets them in the
           answer (``inos: [{index, inos: [first, count]}]``, also for a resend).
        2. One batch of a holder at a time (a batch resent while its first send still
           runs waits, then finds its changes applied).
        3. For each change: one applied before (a resend, ``_resent``) is skipped. Else
           its leases must be held under the epochs it names (``flush``: a recall's
           deadline moves, the holder is alive); a lease that ended stops the batch there
           (``ended``: the server's namespace is a prefix of what was sent). Otherwise it
           runs as the same call would (the caller's permissions, locks, journal), lazily
           journaled; an error it raises is reported by its index and the batch goes on.
           A create followed by the write that closes the same file (a small file made
           whole while the holder gathered its changes) runs as one: the file is created
           complete with its content, in one journal batch.
        4. A caller with ``sync_metadata`` is answered once all of it is durable."""
        check_name(holder, "dir_batch: client_name")
        changes = dirops.batch_from_wire(ops)
        self.renewed(holder)
        sub = dataclasses.replace(ctx, call_id=None, sync_metadata=False)
        lock = self._batching.setdefault(holder, trio.Lock())
        failed: list[dict] = []
        skipped = 0
        ended = None
        done = 0
        runs = not self.quota.quotas_exist()   # a run's creates would share one check
        try:
            async with lock:
                run = _Run()
                index = 0
                while index < len(changes):
                    change = changes[index]
                    whole = _closing(change, changes[index + 1] if index + 1 < len(changes)
                                     else None)
                    # where it would join a run (a run moves no folder, so a path found
                    # before the run is applied holds after it; a folder the run makes,
                    # a file it creates, has none until then)
                    place = self._run_place(change, whole) if runs else None
                    if run.items and (place is None
                                      or not run.takes(change, place[0], place[2])):
                        # what follows may depend on the run: it goes to the journal first
                        await self._run_changes(sub, holder, run, failed)
                        run = _Run()
                        if runs:   # found again on what the run changed
                            place = self._run_place(change, whole)
                    done = at = index
                    index += 1
                    if isinstance(change, dirops.Release):
                        # given back already (a resend), or ended: nothing is left to give
                        if not await self._give_back(sub, holder, change.dir, change.epoch):
                            skipped += 1
                        continue
                    if self._resent(holder, change):
                        skipped += 1
                        continue
                    try:
                        lease = self._flush_leases(holder, change)
                    except LeaseExpired as exc:
                        ended = exc.to_wire()
                        break
                    if whole is not None:   # the closing write goes with its create
                        index += 1
                    if place is not None:
                        parts, path, dst_parts, dst = place
                        run.add(_RunItem(at, change, whole, lease, parts, path, dst_parts,
                                         dst))
                        continue
                    try:
                        await self._apply_change(sub, holder, change, lease, whole)
                    except LeaseFSError as exc:
                        _failed(failed, at, whole, exc)
                else:
                    done = index
                if run.items:
                    await self._run_changes(sub, holder, run, failed)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._batching.pop(holder, None)
        if ctx.sync_metadata:
            await self.edits.sync()
        self.renewed(holder)
        answer = {"done": done, "skipped": skipped, "failed": failed, "ended": ended}
        granted = self._granted_inos(holder, changes[:done])
        if granted:
            answer["inos"] = granted
        return answer

    def _run_path(self, change, whole) -> str | None:
        """The path ``change`` works on, if it may join a run (None: it may not, or its
        folder has no path yet; a rename: its entry is not a file or symlink there yet)."""
        if not _runnable(change, whole):
            return None
        folder = self.view.path_of(change.dir)
        if folder is None or isinstance(change, dirops.Refill):
            return folder
        if isinstance(change, dirops.Rename):
            inode = self.view.get_inode(change.ino)
            if inode is None or inode.type == DIR \
                    or self.view.lookup(change.dir, change.name) != change.ino:
                return None
        return paths.join(folder, change.name)

    def _run_place(self, change, whole) -> tuple | None:
        """``(parts, path, dst_parts, dst_path)`` of ``change`` if it may join a run (the
        destination's only for a rename), else None."""
        path = self._run_path(change, whole)
        if path is None:
            return None
        if not isinstance(change, dirops.Rename):
            return paths.split(path), path, None, None
        folder = self.view.path_of(change.dst_dir)
        if folder is None:
            return None
        dst = paths.join(folder, change.dst_name)
        return paths.split(path), path, paths.split(dst), dst

    async def _run_changes(self, ctx, holder: str, run: _Run, failed: list) -> None:
        """Plan a run's changes under one lock pass and journal them in one batch (lazily,
        as each of their calls would); a change its call would refuse is reported by its
        index, and one the locks or the journal refuse refuses all that were left."""
        wanted = merge(*(lock_set(item.parts, LOCK_WRITE if isinstance(
            item.change, (dirops.SetAttr, dirops.Write)) else LOCK_PARENT)
            for item in run.items if not isinstance(item.change, dirops.Refill)),
            *(lock_set(item.dst_parts, LOCK_PARENT) for item in run.items
              if item.dst_parts is not None))
        planned = None   # the items planned, once the locks are held
        try:
            async with self.locking.mutation(f"dir_batch of {holder}", wanted):
                planned, plans = [], []
                for item in run.items:
                    try:
                        plans.extend(self._plan(ctx, holder, item))
                    except LeaseFSError as exc:
                        _failed(failed, item.index, item.whole, exc)
                        continue
                    planned.append(item)
                await self.edits.log_plans(plans, durable=ctx.sync_metadata)
        except LeaseFSError as exc:
            for item in run.items if planned is None else planned:
                _failed(failed, item.index, item.whole, exc)
            failed.sort(key=lambda one: one["index"])

    def _plan(self, ctx, holder: str, item: _RunItem) -> list:
        """One change of a run, checked and planned as its call would be."""
        change = item.change
        if isinstance(change, dirops.Create):
            self._check_reserved(change, item.lease, item.path)
            return self.plans.create_whole(ctx, item.parts, item.path, holder, change,
                                           item.whole)
        if isinstance(change, dirops.Write):
            return [self.plans.inline_close(ctx, item.parts, item.path, holder, change)]
        if isinstance(change, dirops.Refill):
            refill = self._refill_plan(holder, change)
            return [refill] if refill is not None else []
        if isinstance(change, dirops.Unlink):
            return [self.plans.unlink(ctx, item.parts, item.path, change.time_ns)]
        if isinstance(change, dirops.Mkdir):
            # the folder and its lease in one journal batch
            self._check_mkdir(change, item.lease, item.path)
            return [self.plans.mkdir(ctx, item.parts, item.path, change),
                    self._child_grant(holder, change)]
        if isinstance(change, dirops.Rename):
            moved = self.plans.move(ctx, item.parts, item.dst_parts, item.path,
                                    item.dst_path, change.time_ns)
            return [] if moved is None else [moved]
        return self.plans.attrs(ctx, item.parts, item.path, change.permission,
                                change.mtime_ns, change.atime_ns, change.time_ns)

    def _granted_inos(self, holder: str, changes: list) -> list[dict]:
        """The fresh ids the folders made by ``changes`` (``mkdir`` asking for them) got
        with their leases, by index."""
        out = []
        for index, change in enumerate(changes):
            if isinstance(change, dirops.Refill):
                lease = self.table.held(change.dir, holder, change.epoch)
                if lease is not None:
                    out.append({"index": index, "inos": lease.inos.to_wire()
                                if _refilled(lease, change) else [0, 0]})
            elif isinstance(change, dirops.Mkdir) and change.inos and not change.first_ino:
                lease = self.table.held(change.ino, holder, change.lease_epoch)
                if lease is not None:
                    out.append({"index": index, "inos": lease.inos.to_wire()})
        return out

    async def _give_back(self, ctx, holder: str, ino: int, epoch: int) -> bool:
        """End ``holder``'s lease ``epoch`` on ``ino`` if it still holds it (journaled as
        durably as the caller's changes)."""
        if self.table.held(ino, holder, epoch) is None or ino in self._ending:
            return False
        await self.edits.log_plan(DirLeaseRelease(ino=ino, holder=holder, epoch=epoch),
                                  durable=ctx.sync_metadata)
        return True

    def _resent(self, holder: str, change) -> bool:
        """Whether ``change`` was applied before (its batch sent again after a lost
        answer): the holder alone changes names in its leased directories, so a name that
        no longer holds the inode the change names was changed by it already.

        A create is applied when its name holds its inode, or when that inode exists at
        all (the holder renamed the file since): nobody else creates under the ids its
        grant reserved. Only when that lease is still held is an existing inode outside
        its range not taken for a resend (the create then fails, naming the range); once
        the lease ended nothing tells, and applying nothing is what a resend needs. A
        write to a file that is closed was applied: one that does not close it (a later
        close was applied too), and a close when the file holds exactly its content
        (``closed_with``, complete's own retry rule; with other content it is not taken
        for a resend, and its ``complete`` says what is wrong). A refill was applied when
        the lease's newest range is no longer the one it names as taken last."""
        if isinstance(change, dirops.Refill):
            lease = self.table.held(change.dir, holder, change.epoch)
            return lease is not None and _refilled(lease, change)
        if isinstance(change, (dirops.Create, dirops.Mkdir)):
            if self.view.lookup(change.dir, change.name) == change.ino:
                return True
            if self.view.get_inode(change.ino) is None:
                return False
            lease = self.table.held(change.dir, holder, change.epoch)
            return lease is None or lease.range_of(change.ino) is not None
        if self.view.lookup(change.dir, change.name) != change.ino:
            return True
        if isinstance(change, dirops.Write):
            inode = self.view.get_inode(change.ino)
            if inode is None or inode.type != FILE or inode.uc:
                return False
            if not change.close:
                return True
            path = paths.join(self.view.path_of(change.dir) or "/", change.name)
            return self.planner.closed_with(path, change.ino, None, change.data or None)
        return False

    def _flush_leases(self, holder: str, change) -> DirLease:
        """The leases ``change`` relies on, flushed (``LeaseExpired`` when one ended); the
        lease on its (source) directory."""
        now = self.clock()
        pairs = [(change.dir, change.epoch)]
        if isinstance(change, dirops.Rename):
            pairs.append((change.dst_dir, change.dst_epoch))
        flushed = [self.table.flush(ino, holder, epoch, now,
                                    self.view.path_of(ino) or f"inode {ino}")
                   for ino, epoch in pairs]
        return flushed[0]

    async def _apply_change(self, ctx, holder: str, change, lease: DirLease,
                            whole: dirops.Write | None = None) -> None:
        """One change of a batch, as its call would make it."""
        if isinstance(change, dirops.Refill):
            await self._refill(ctx, holder, change)
            return
        folder = self.view.path_of(change.dir)
        if folder is None:
            raise LeaseFSError(f"dir_batch: leased directory inode {change.dir} has no path")
        ctx = dataclasses.replace(ctx, extra={**ctx.extra, dirops.HOLDER_TIME: change.time_ns})
        path = paths.join(folder, change.name)
        if isinstance(change, dirops.Unlink):
            await self.dispatch(ctx, "delete", {"path": path, "expect": "nondir"})
        elif isinstance(change, dirops.Rmdir):
            await self.dispatch(ctx, "delete", {"path": path, "expect": "dir"})
            await self._give_back(ctx, holder, change.ino, change.ino_epoch)
        elif isinstance(change, dirops.Create):
            await self._create(ctx, holder, change, lease, folder, path, whole)
        elif isinstance(change, dirops.Mkdir):
            await self._mkdir(ctx, holder, change, lease, folder, path)
        elif isinstance(change, dirops.Write):
            await self._write(ctx, holder, change, path)
        elif isinstance(change, dirops.SetAttr):
            await self._set_attrs(ctx, change, path)
        else:
            dst_folder = self.view.path_of(change.dst_dir)
            if dst_folder is None:
                raise LeaseFSError(f"dir_batch: leased directory inode {change.dst_dir} "
                                   f"has no path")
            await self.dispatch(ctx, "rename", {
                "src": path, "dst": paths.join(dst_folder, change.dst_name),
                "overwrite": change.replaced != 0})

    async def _create(self, ctx, holder: str, change: dirops.Create, lease: DirLease,
                      folder: str, path: str, whole: dirops.Write | None) -> None:
        """A create the holder decided: ``create`` (not replacing, no missing parents) as
        the holder, the file under construction under its file lease, with the inode id
        its lease's grant reserved (``CHOSEN_INO``: checked here, so a client picks ids
        only from its own range)."""
        self._check_reserved(change, lease, path)
        ctx = dataclasses.replace(ctx, extra={**ctx.extra, dirops.CHOSEN_INO: change.ino,
                                              **({dirops.WHOLE: whole} if whole else {})})
        await self.dispatch(ctx, "create", {
            "path": path, "client_name": holder, "overwrite": False, "create_parent": False,
            "permission": change.permission, "owner": change.owner, "group": change.group,
            "replication": change.replication, "block_size": change.block_size})

    async def _refill(self, ctx, holder: str, change: dirops.Refill) -> None:
        """Fresh ids for a held lease's creates (``_refill_plan``), journaled with the
        changes they serve."""
        refill = self._refill_plan(holder, change)
        if refill is not None:
            await self.edits.log_plan(refill, durable=ctx.sync_metadata)

    def _refill_plan(self, holder: str, change: dirops.Refill) -> DirLeaseRefill | None:
        """The record of fresh ids for a held lease's creates, reserved as a grant
        reserves them; None under a quota (the answer then says ``[0, 0]``)."""
        reserved = self._reserve(change.dir, min(change.inos, MAX_RESERVED_INOS))
        if not reserved.count:
            return None
        return DirLeaseRefill(ino=change.dir, holder=holder, epoch=change.epoch,
                              first_ino=reserved.first, inos=reserved.count)

    @staticmethod
    def _check_reserved(change: dirops.Create, lease: DirLease, path: str) -> None:
        """A holder creates only under the ids its lease reserved."""
        if lease.range_of(change.ino) is None:
            raise InvalidArgument(
                f"dir_batch: create {path}: inode {change.ino} is not one the lease (epoch "
                f"{lease.epoch}) on {paths.parent(path)} reserved (reserved: "
                f"{lease.reserved_text()})")

    async def _mkdir(self, ctx, holder: str, change: dirops.Mkdir, lease: DirLease,
                     folder: str, path: str) -> None:
        """A folder the holder made: ``mkdirs`` (exclusive, no missing parents) as the
        holder, with the inode id its lease reserved, then the holder's lease on it under
        the epoch it named (``child_epoch``), with the part of the parent lease's range
        the change hands it. Journaled after the folder: a crash between leaves the folder
        unleased, and the holder's later changes in it are refused (a prefix)."""
        self._check_mkdir(change, lease, path)
        ctx = dataclasses.replace(ctx, extra={**ctx.extra, dirops.CHOSEN_INO: change.ino})
        await self.dispatch(ctx, "mkdirs", {
            "path": path, "permission": change.permission, "owner": change.owner,
            "group": change.group, "create_parent": False, "exclusive": True})
        await self.edits.log_plan(self._child_grant(holder, change),
                                  durable=ctx.sync_metadata)

    @staticmethod
    def _check_mkdir(change: dirops.Mkdir, lease: DirLease, path: str) -> None:
        """A folder's inode id and the range it hands the new folder's lease must be
        disjoint parts of its parent lease's range."""
        child = InoRange(change.first_ino, change.inos) if change.inos and change.first_ino \
            else NO_INOS
        within = lease.range_of(child.first) if child.count else None
        if lease.range_of(change.ino) is not None and change.ino not in child and (
                not child.count or (within is not None
                                    and child.first + child.count - 1 in within)):
            return
        raise InvalidArgument(
            f"dir_batch: mkdir {path}: inode {change.ino} and the new folder's range "
            f"{child} must be disjoint parts of the lease's (epoch {lease.epoch}) on "
            f"{paths.parent(path)} (reserved: {lease.reserved_text()})")

    def _child_grant(self, holder: str, change: dirops.Mkdir) -> DirLeaseGrant:
        """The holder's lease on the folder ``change`` makes, under the epoch it named
        (``child_epoch``), with the range it hands it, or (``inos`` without ``first_ino``)
        ids of the allocator's, as a grant reserves them (none under a quota)."""
        if change.inos and change.first_ino:
            child = InoRange(change.first_ino, change.inos)
        elif change.inos:
            child = self._reserve(change.ino, min(change.inos, MAX_RESERVED_INOS))
        else:
            child = NO_INOS
        return DirLeaseGrant(ino=change.ino, holder=holder, epoch=change.lease_epoch, **(
            {"first_ino": child.first, "inos": child.count} if child.count else {}))

    async def _write(self, ctx, holder: str, change: dirops.Write, path: str) -> None:
        """A small file's whole content, inline: ``complete`` with it (``close``; a close
        already made with the same content answers as done, ``closed_with``), else
        ``fsync`` with it, a flush (durable with the batch, not on its own)."""
        args = {"path": path, "client_name": holder, "ino": change.ino}
        if change.data:   # none: an empty file, closed without a byte
            args["data"] = change.data
        if not change.close:
            await self.dispatch(ctx, "fsync", {**args, "sync": False})
            return
        for name, value in (("mtime_ns", change.mtime_ns), ("atime_ns", change.atime_ns),
                            ("permission", change.permission)):
            if value is not None:
                args[name] = value
        # without a last block: a file whose bytes are in blocks is refused, not waited for
        await self.dispatch(ctx, "complete", {**args, "last": None})

    async def _set_attrs(self, ctx, change: dirops.SetAttr, path: str) -> None:
        """An entry's mode, owner and group, times: each as its call sets it (the caller's
        permission checks), stamped with the holder's time."""
        if change.permission is not None:
            await self.dispatch(ctx, "set_permission", {"path": path,
                                                        "permission": change.permission})
        if change.owner is not None or change.group is not None:
            await self.dispatch(ctx, "set_owner", {"path": path, "owner": change.owner,
                                                   "group": change.group})
        if change.mtime_ns is not None or change.atime_ns is not None:
            await self.dispatch(ctx, "set_times", {"path": path, "mtime_ns": change.mtime_ns,
                                                   "atime_ns": change.atime_ns,
                                                   "ino": change.ino})

    # ------------------------------------------------------------------ recalls
    def queue_recall(self, holder: str, path: str, epoch: int, ino: int) -> None:
        """Hand ``holder`` a recall of its lease ``epoch`` on directory ``ino`` at ``path``
        (its next poll)."""
        self._queue_event(holder, {"path": path, "epoch": epoch, "ino": ino, "kind": "recall"})

    def _queue_event(self, holder: str, event: dict) -> None:
        queued = self._events.setdefault(holder, [])
        if len(queued) >= MAX_EVENTS:   # a holder that stopped polling: its oldest go
            del queued[:len(queued) - MAX_EVENTS + 1]
        queued.append(event)
        woken = self._polls.pop(holder, None)
        if woken is not None:
            woken.set()

    # ------------------------------------------------------------------ the journal's apply
    def lease_granted(self, ino: int, holder: str, epoch: int,
                      inos: InoRange = NO_INOS) -> None:
        """A DIR_LEASE_GRANT applied (live, from the HA log)."""
        self.table.grant(ino, holder, epoch, inos)
        self._seen[holder] = self.clock()

    def lease_refilled(self, ino: int, holder: str, epoch: int, inos: InoRange) -> None:
        """A DIR_LEASE_REFILL applied (live, from the HA log) to a lease still held."""
        self.table.refill(ino, holder, epoch, inos,
                          self.view.path_of(ino) or f"inode {ino}")

    def lease_ended(self, ino: int, epoch: int) -> None:
        """A DIR_LEASE_RELEASE that ended lease ``epoch`` of ``ino`` applied: the accesses
        waiting for it go on, and its holder's uncollected recalls of it are moot."""
        lease = self.table.lease_of(ino)
        if lease is None or lease.epoch != epoch:
            return
        self.table.expire(ino)
        queued = self._events.get(lease.holder)
        if queued:
            queued[:] = [e for e in queued if e["epoch"] != epoch or e["kind"] != "recall"]
        woken = self._ended.pop(ino, None)
        if woken is not None:
            woken.set()

    def rebuild(self, stored: list[StoredLease]) -> None:
        """The table from the journal's live leases (start, activation): every holder's
        silence counts from now, and whoever waited on the old table looks again."""
        self.table.rebuild(stored)
        now = self.clock()
        self._seen = {lease.holder: now for lease in stored}
        self._wake_all()

    def _wake_all(self) -> None:
        for woken in self._ended.values():
            woken.set()
        self._ended.clear()

    # ------------------------------------------------------------------ access by others
    def renewed(self, holder: str) -> None:
        """``holder`` is alive (``renew_lease``, its directory lease calls)."""
        if holder in self._seen or self.table.held_by(holder):
            self._seen[holder] = self.clock()

    async def before_access(self, ctx, method: str, args: dict) -> None:
        """Returns once no directory the call's paths walk through is held by another
        client (see the module docstring)."""
        client = caller_name(ctx)
        for path, held in self._reached(method, args):
            while (ino := held(path, client)) is not None:
                await self._wait_for(ino, client)

    def held_by_other(self, method: str, args: dict, client: str) -> str | None:
        """The path of a folder the call reaches that another client holds, or None (what
        an observer asks: it recalls nothing, the call goes to the active instead)."""
        for path, held in self._reached(method, args):
            if (ino := held(path, client)) is not None:
                return self.view.path_of(ino) or f"inode {ino}"
        return None

    def _reached(self, method: str, args: dict) -> list[tuple[str, Callable]]:
        """Each path the call names with how a folder another client holds is found
        there: on its walk (``_held_by_other``), and for a call that reaches a whole tree
        below it too (``_held_below``)."""
        return ([(path, self._held_by_other) for path in access_paths(method, args)]
                + [(path, self._held_below)
                   for path in access_paths(method, args, SUBTREE_ARGS)])

    def _held_below(self, path: str, client: str) -> int | None:
        """A directory strictly below ``path`` that another client holds or is being
        granted, or None: each such lease's folder is walked up by its parent pointers
        (only while leases exist, and only for the calls that reach a whole tree)."""
        try:
            parts = paths.split(path)
            found = self.view.walk(parts, path, strict=False)
        except LeaseFSError:
            return None
        if len(found) != len(parts) + 1 or found[-1][1].type != DIR:
            return None     # a file, or no such folder: nothing below it
        top = found[-1][0]
        others = self.table.held_by_others(client) + [
            ino for ino, (holder, _) in self._granting.items() if holder != client]
        for ino in others:
            if ino != top and self._is_below(ino, top):
                return ino
        return None

    def _is_below(self, ino: int, top: int) -> bool:
        seen = 0
        while ino != keys.ROOT_INO and seen <= 10_000:
            inode = self.view.get_inode(ino)
            if inode is None:
                return False
            ino = inode.parent
            if ino == top:
                return True
            seen += 1
        return False

    def _held_by_other(self, path: str, client: str) -> int | None:
        """The first directory of ``path``'s walk another client holds, or None."""
        try:
            parts = paths.split(path)
            found = self.view.walk(parts, path, strict=False)
        except LeaseFSError:   # a bad path: the call itself says what is wrong
            return None
        for ino, inode in found:
            if inode.type == DIR:
                lease = self.table.lease_of(ino)
                if lease is not None and lease.holder != client:
                    return ino
                granting = self._granting.get(ino)
                if granting is not None and granting[0] != client:
                    return ino
        return None

    async def _wait_for(self, ino: int, client: str) -> None:
        """One verdict on ``ino`` for ``client``, then wait until its lease ends or its
        recall is overdue (which ends it); a grant under way is waited for first (the
        caller then looks again and recalls it)."""
        granting = self._granting.get(ino)
        if granting is not None:
            await granting[1].wait()
            return
        lease = self.table.lease_of(ino)
        verdict = self.table.access(ino, client, self.clock())
        if verdict is Verdict.PROCEED:
            return
        if verdict is Verdict.RECALL:
            path = self.view.path_of(ino) or f"inode {ino}"
            log.debug("directory lease on %s (epoch %d) recalled from %s for %s",
                      path, lease.epoch, lease.holder, client)
            self.queue_recall(lease.holder, path, lease.epoch, ino)
        lease = self.table.lease_of(ino)
        ended = self._ended.setdefault(ino, trio.Event())
        # an end being journaled wakes us; otherwise the recall's deadline does
        wait = math.inf if ino in self._ending else lease.recall_deadline - self.clock()
        with trio.move_on_after(max(0.0, wait)):
            await ended.wait()
        if not ended.is_set():
            await self.expire_ended()

    async def expire_ended(self) -> None:
        """End every lease whose recall is overdue, or whose holder was silent for the
        lease hard limit (a dead holder's; the lease monitor calls this), journaled in
        one batch. A holder that left a recall unanswered loses all its leases, as a
        client whose lease ran out loses all its files (HDFS): it is gone, and the next
        access to each of its folders would otherwise wait out a recall of its own."""
        now = self.clock()
        ending: dict[int, tuple[DirLease, str]] = {}
        for lease in self.table.overdue(now):
            why = (f"{lease.holder} left a recall unanswered for "
                   f"{self.table.recall_limit:g} s")
            for held in self.table.held_by(lease.holder):
                ending.setdefault(held.ino, (held, why))
        for holder, polled in list(self._polled.items()):
            # the events of a holder gone for good (no lease, no poll for the hard limit)
            if now - polled > self.hard_limit and not self.table.held_by(holder):
                del self._polled[holder]
                self._events.pop(holder, None)
        for holder, seen in list(self._seen.items()):
            held = self.table.held_by(holder)
            if not held:
                del self._seen[holder]
            elif now - seen > self.hard_limit:
                for lease in held:
                    ending.setdefault(lease.ino, (lease, f"{holder} was silent for "
                                                         f"{self.hard_limit:g} s"))
        ending_now = [(lease, why) for lease, why in ending.values()
                      if lease.ino not in self._ending and self.table.lease_of(lease.ino) == lease]
        if not ending_now:
            return
        for lease, why in ending_now:
            self._ending.add(lease.ino)
            log.warning("directory lease on %s (epoch %d) of %s ends: %s",
                        self.view.path_of(lease.ino) or f"inode {lease.ino}",
                        lease.epoch, lease.holder, why)
        try:
            await self.edits.log_plans([
                DirLeaseRelease(ino=lease.ino, holder=lease.holder, epoch=lease.epoch)
                for lease, _ in ending_now])
            # the holder may be alive (its recall's answer lost, its calls slow): it
            # stops answering from the lease once it hears of it
            for lease, _ in ending_now:
                self._queue_event(lease.holder, {
                    "path": self.view.path_of(lease.ino) or "", "epoch": lease.epoch,
                    "ino": lease.ino, "kind": "ended"})
        finally:
            for lease, _ in ending_now:
                self._ending.discard(lease.ino)
                # its waiters waited for this end without a deadline: whatever came of it,
                # they look again
                woken = self._ended.pop(lease.ino, None)
                if woken is not None:
                    woken.set()
