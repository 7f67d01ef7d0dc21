"""Directory write leases, served: grants and releases journaled, recalls handed to their
holders (docs/design/dirleases.md).

Why it exists: ``meta.leases.dirleases.DirLeaseTable`` decides (pure); this service
performs what it decides: a grant or a release is a journal record (``DIR_LEASE_GRANT``,
``DIR_LEASE_RELEASE``, ``meta.journal.ops_dirleases``) whose apply changes the table, so
the table comes back at a restart and on an HA successor; a recall is an event queued for
its holder, who collects it with a long poll (``events``).

* ``acquire``: the caller must be allowed to write the directory; a directory with more
  than ``dir_lease_max_entries`` entries, or one another client holds, is not leased (the
  answer says why, the client stays synchronous there). A holder asking again for a
  directory it holds gets its lease as it is (a retry after a lost reply).
* ``release``: only under the epoch the holder was granted (``LeaseExpired`` otherwise).
* ``events``: the recalls queued for a holder, or ``[]`` once ``wait`` seconds passed.

The holder's name is the client name its file leases use (``client_name``).

Concurrency contract: trio thread only; ``acquire`` and ``release`` await their journal
record, and the table changes in that record's apply (synchronously, no await). A grant
being journaled is remembered (``_granting``), so two acquires of one directory cannot
both journal a grant. Every other method is atomic.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from fs import paths
from fs.errors import InvalidArgument, LeaseExpired, NotDirectory

from ..journal.ops_dirleases import DirLeaseGrant, DirLeaseRelease
from ..namespace.args import MAX_LIST_LIMIT, check_int, check_name
from ..namespace.locks import LOCK_WRITE, lock_set
from ..namespace.permissions import WRITE
from ..schema.inode import DIR

if TYPE_CHECKING:
    from ..journal.edits import Edits
    from ..leases.dirleases import DirLeaseTable
    from ..namespace.access import Access
    from ..namespace.locks import NamespaceLocking
    from ..namespace.view import NamespaceView

log = logging.getLogger(__name__)

#: the longest a ``dir_lease_events`` poll is held (well under a client's rpc_timeout)
MAX_EVENTS_WAIT = 30.0


class DirLeases:
    def __init__(self, *, table: DirLeaseTable, view: NamespaceView, edits: Edits,
                 locking: NamespaceLocking, access: Access, max_entries: int):
        self.table = table
        self.view = view
        self.edits = edits
        self.locking = locking
        self.access = access
        # one listing page holds them all
        self.max_entries = min(max_entries, MAX_LIST_LIMIT)
        self._granting: set[int] = set()
        self._events: dict[str, list[dict]] = {}       # holder -> recalls not yet collected
        self._polls: dict[str, trio.Event] = {}        # holder -> its waiting poll's wake-up

    # ------------------------------------------------------------------ RPC bodies
    async def acquire(self, ctx, path, holder) -> dict:
        """``{epoch, attrs, entries}`` of a lease on directory ``path`` for ``holder``, or
        ``{epoch: None, reason}`` when it is not leased."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(holder, f"dir_lease_acquire {canonical}: client_name")
        # the directory's write lock: nothing renames or removes it under the grant
        async with self.locking.mutation(f"dir_lease_acquire {canonical}",
                                         lock_set(parts, LOCK_WRITE)):
            _, ino, inode, _ = self.view.resolve(canonical)
            if inode.type != DIR:
                raise NotDirectory(f"dir_lease_acquire {canonical}: not a directory (only "
                                   f"directories are leased)")
            self.access.check_access(ctx, parts, access=WRITE)
            lease = self.table.lease_of(ino)
            if lease is None or lease.holder != holder:
                refusal = self._refusal(canonical, ino, inode, lease)
                if refusal is not None:
                    return {"epoch": None, "reason": refusal}
                self._granting.add(ino)
                try:
                    epoch = await self.edits.log_plan(DirLeaseGrant(ino=ino, holder=holder))
                finally:
                    self._granting.discard(ino)
                log.debug("directory lease on %s (inode %d) granted to %s, epoch %d",
                          canonical, ino, holder, epoch)
            else:
                epoch = lease.epoch
            # the state the lease covers (nothing else may change it while it is held)
            attrs = self.view.get_file_info(canonical)
            listing = self.view.list_status(canonical, "", self.max_entries)
        return {"epoch": epoch, "attrs": attrs, "entries": listing["entries"]}

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

    async def release(self, ctx, path, holder, epoch) -> bool:
        """``holder`` gives back its lease ``epoch`` on directory ``path``. Found by its
        epoch (unique), so a directory renamed or removed since is given back too; the
        path names it in the errors."""
        canonical = paths.join_parts(paths.split(path))
        check_name(holder, f"dir_lease_release {canonical}: client_name")
        check_int(epoch, f"dir_lease_release {canonical}: epoch", low=1)
        held = [lease for lease in self.table.held_by(holder) if lease.epoch == epoch]
        if not held:
            raise LeaseExpired(f"{canonical}: the directory lease (epoch {epoch}) of {holder} "
                               f"has ended (it holds no lease of that epoch)")
        await self.edits.log_plan(DirLeaseRelease(ino=held[0].ino, holder=holder, epoch=epoch))
        return True

    async def events(self, ctx, holder, wait) -> list[dict]:
        """The recalls queued for ``holder`` (``{path, epoch}`` each), waiting up to
        ``wait`` seconds for one."""
        check_name(holder, "dir_lease_events: client_name")
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or wait < 0:
            raise InvalidArgument(f"dir_lease_events: wait must be seconds >= 0, "
                                  f"got {wait!r:.60}")
        if not self._events.get(holder):
            woken = self._polls.setdefault(holder, trio.Event())
            with trio.move_on_after(min(wait, MAX_EVENTS_WAIT)):
                await woken.wait()
            if self._polls.get(holder) is woken:
                del self._polls[holder]
        return self._events.pop(holder, [])

    # ------------------------------------------------------------------ recalls
    def queue_recall(self, holder: str, path: str, epoch: int) -> None:
        """Hand ``holder`` a recall of its lease ``epoch`` on ``path`` (its next poll)."""
        self._events.setdefault(holder, []).append({"path": path, "epoch": epoch})
        woken = self._polls.pop(holder, None)
        if woken is not None:
            woken.set()
