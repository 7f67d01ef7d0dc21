"""The metadata server's client protocol (HDFS ``ClientProtocol``), its namespace part: the
calls that read or change existing paths — get_file_info, list_status, rename, rename_many,
concat, delete and the set_* calls (PROTOCOL.md §2). Creating and writing files is in
``client.py``.

Why it exists: one role per module; the write path (leases, blocks, pipelines) and the
namespace calls change for different reasons.

``NamespaceProtocol`` is a front end: a translator from each RPC to the services that do the
work. Its constructor takes exactly what it calls: the namespace (``ns``: resolve, plan,
status), ``access`` (who the caller is, permission checks), ``permissions`` (the checker the
handlers ask directly with an inode chain), ``locking`` (the mutation and file locks),
``edits`` (journaling a plan), ``locator`` (block locations in a file's status) and
``wall_ns`` (the wall clock the plans stamp times with). It keeps no state of its own.

Concurrency contract: every handler runs on the metadata server's one trio thread, each
call its own task; a mutation changes nothing before it holds its locks
(``locking.mutation``) and changes the namespace only through a journaled plan
(``edits.log_plan``); ``get_file_info`` and ``list_status`` never await (the server serves
them inline).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from fs import paths
from fs.dirops import HOLDER_TIME, change_time
from fs.errors import FileNotFound, InvalidArgument, IsDirectory, NotDirectory, PermissionDenied

from ..services.locate import caller_host
from ..namespace.args import check_ino
from ..namespace.locks import LOCK_PARENT, LOCK_WRITE, lock_set, merge
from ..namespace.namespace import check_bool, check_name
from ..namespace.permissions import ALL, READ, READ_EXECUTE, WRITE
from ..services.retry_answers import keep_removed
from ..schema.inode import DIR, FILE

if TYPE_CHECKING:
    from ..services.locate import Locator
    from ..journal.edits import Edits
    from ..namespace.access import Access
    from ..namespace.locks import NamespaceLocking
    from ..namespace.namespace import Namespace
    from ..namespace.permissions import PermissionChecker

log = logging.getLogger(__name__)


class NamespaceProtocol:
    """Handlers of the namespace calls of HDFS ClientProtocol, as ``rpc_<method>(ctx, **args)``."""

    def __init__(self, *, ns: Namespace, access: Access, permissions: PermissionChecker,
                 locking: NamespaceLocking, edits: Edits, locator: Locator,
                 wall_ns: Callable[[], int]):
        self.ns = ns
        self.access = access
        self.permissions = permissions
        self.locking = locking
        self.edits = edits
        self.locator = locator
        self.wall_ns = wall_ns

    def _wall(self, ctx) -> int:
        """The time a change is stamped with: the server's, or for a directory lease
        holder's batched change the holder's (what it showed its applications), when the
        two clocks agree within ``HOLDER_TIME_SKEW``."""
        return change_time(ctx.extra, self.wall_ns())

    async def rpc_get_file_info(self, ctx, path, locations=False):
        """``locations``: a file's status also carries ``locations``, what
        ``get_block_locations`` of the whole file answers, when the caller may read it (an
        open for reading then needs no second call before its first read)."""
        parts = paths.split(path)
        self.access.check_access(ctx, parts)
        check_bool(locations, f"get_file_info {path}: locations")
        found_parts, ino, inode, _ = self.ns.view.resolve(path)
        status = self.ns.view.status(paths.join_parts(found_parts), ino, inode)
        if locations and inode.type == FILE:
            try:
                self.access.check_access(ctx, parts, access=READ)
            except PermissionDenied:
                return status   # the read itself will be refused, with its own error
            status["locations"] = self.locator.file_locations(ino, inode, 0, math.inf,
                                                       self.access.token_user(ctx),
                                                       caller_host(ctx))
        return status

    async def rpc_list_status(self, ctx, path, start_after="", limit=1000):
        caller = self.access.checked_caller(ctx)
        if caller is not None:   # a directory: READ_EXECUTE on it; a file: traverse (HDFS)
            parts = paths.split(path)
            chain = self.access.inode_chain(parts)
            is_dir = len(chain) == len(parts) + 1 and chain[-1].type == DIR
            self.permissions.check_path(caller, parts, chain,
                                        access=READ_EXECUTE if is_dir else 0)
        return self.ns.view.list_status(path, start_after, limit)

    def _check_rename(self, ctx, src_parts, dst_parts) -> None:
        caller = self.access.checked_caller(ctx)
        if caller is None:
            return
        # replacing the destination counts as deleting it
        self.permissions.check_path(caller, src_parts, self.access.inode_chain(src_parts), parent=WRITE)
        dst_chain = self.access.inode_chain(dst_parts)
        self.permissions.check_path(caller, dst_parts, dst_chain, ancestor=WRITE,
                                    parent=WRITE if len(dst_chain) == len(dst_parts) + 1 else 0)

    async def rpc_rename(self, ctx, src, dst, overwrite=False, want_status=False):
        """``want_status``: answer ``{status, parent, src_parent, replaced}`` instead of
        ``true``: the moved inode's status at ``dst``, both parents' after the move and
        the status the replaced destination had (null when nothing was replaced), so a
        mount fixes its inode table without asking again."""
        src_parts, dst_parts = paths.split(src), paths.split(dst)
        s, d = paths.join_parts(src_parts), paths.join_parts(dst_parts)
        check_bool(want_status, f"rename {s} to {d}: want_status")
        wanted = merge(lock_set(src_parts, LOCK_PARENT), lock_set(dst_parts, LOCK_PARENT))
        async with self.locking.mutation(f"rename {s} to {d}", wanted):
            self._check_rename(ctx, src_parts, dst_parts)
            wall = self._wall(ctx)
            plan = self.ns.renames.plan_rename(s, d, overwrite, now_ns=wall)
            replaced = None
            if want_status and plan is not None and plan.overwrite is not None:
                replaced = self.ns.view.get_file_info(d)
            # the status it replaced is gone once the record is applied: a retry finds it
            # in the record (without overwrite nothing can have been replaced)
            kept = keep_removed(replaced) if want_status and overwrite else None
            await self.edits.log_plan(plan, durable=ctx.sync_metadata, kept=kept)
            if not want_status:
                return True
            return {**self.ns.view.changed(d), "replaced": replaced,
                    "src_parent": self.ns.view.get_file_info(paths.parent(s))}

    async def rpc_rename_many(self, ctx, moves, overwrite=False):
        """Several renames in one journal record: readers see all of them or none."""
        triples = self.ns.renames.check_moves(moves, overwrite)
        wanted = merge(*(lock_set(parts, LOCK_PARENT) for s, d, _ in triples
                         for parts in (s, d)))
        first = paths.join_parts(triples[0][0])
        async with self.locking.mutation(f"rename_many ({len(triples)} moves, first {first})", wanted):
            for src_parts, dst_parts, _ in triples:
                self._check_rename(ctx, src_parts, dst_parts)
            wall = self.wall_ns()
            await self.edits.log_plan(self.ns.renames.plan_rename_many(moves, overwrite, now_ns=wall),
                                durable=ctx.sync_metadata)
            return True

    async def rpc_concat(self, ctx, target, srcs):
        """HDFS concat: the sources' blocks move to the end of ``target``; they go."""
        if not isinstance(srcs, (list, tuple)) or not srcs:
            raise InvalidArgument(f"concat {target}: srcs must be a non-empty list of paths")
        t_parts = paths.split(target)
        s_parts = [paths.split(src) for src in srcs[:1001]]
        wanted = merge(lock_set(t_parts, LOCK_WRITE),
                       *(lock_set(parts, LOCK_PARENT) for parts in s_parts))
        async with self.locking.mutation(f"concat {paths.join_parts(t_parts)}", wanted):
            caller = self.access.checked_caller(ctx)
            if caller is not None:   # HDFS: WRITE on the target, and deleting each source
                self.permissions.check_path(caller, t_parts, self.access.inode_chain(t_parts),
                                            access=WRITE)
                for parts in s_parts:
                    self.permissions.check_path(caller, parts, self.access.inode_chain(parts),
                                                parent=WRITE)
            wall = self.wall_ns()
            await self.edits.log_plan(self.ns.concat.plan_concat(target, list(srcs), now_ns=wall),
                                durable=ctx.sync_metadata)
            return True

    async def rpc_delete(self, ctx, path, recursive=False, expect=None, want_status=False):
        """``expect``: ``"dir"`` (rmdir(2): anything else is ``NotDirectory``) or
        ``"nondir"`` (unlink(2): a directory is ``IsDirectory``). ``want_status``: answer
        ``{status, parent}`` (the deleted inode's status as it was) instead of ``true``."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        if expect not in (None, "dir", "nondir"):
            raise InvalidArgument(f"delete {canonical}: expect must be null, \"dir\" or "
                                  f"\"nondir\", got {expect!r:.40}")
        check_bool(want_status, f"delete {canonical}: want_status")
        async with self.locking.mutation(f"delete {canonical}", lock_set(parts, LOCK_PARENT)):
            caller = self._delete_access(ctx, parts)
            if caller is not None and recursive is True:
                # HDFS subAccess=ALL, empty directories ignored
                await self.access.check_subtree(caller, parts, ALL, ignore_empty_dir=True)
            wall = self._wall(ctx)
            gone = None
            if want_status:
                gone = self.ns.view.get_file_info(canonical)
            self._check_expect(canonical, expect, gone)
            # the status the inode had is gone with it: a retry finds it in the record
            await self.edits.log_plan(self.ns.planner.plan_delete(canonical, recursive, now_ns=wall),
                                durable=ctx.sync_metadata,
                                kept=keep_removed(gone) if want_status else None)
            return self.ns.view.changed(canonical, gone) if want_status else True

    def _delete_access(self, ctx, parts):
        """delete's permission check (WRITE on the parent); the caller, None for the
        superuser or without permission checks."""
        caller = self.access.checked_caller(ctx)
        if caller is not None:
            self.permissions.check_path(caller, parts, self.access.inode_chain(parts),
                                        parent=WRITE)
        return caller

    def _check_expect(self, canonical: str, expect, gone: dict | None) -> None:
        """``expect``: the type alone (a whole status costs a fifth of it), from ``gone``
        when the caller has the status."""
        if expect is None:
            return
        kind = gone["type"] if gone is not None else self.ns.view.resolve(canonical)[2].type
        if expect == "dir" and kind != DIR:
            raise NotDirectory(f"rmdir {canonical}: not a directory")
        if expect == "nondir" and kind == DIR:
            raise IsDirectory(f"unlink {canonical}: is a directory")

    def plan_unlink(self, ctx, parts, canonical: str, time_ns: int):
        """A directory lease holder's batched unlink, checked and planned as ``delete``
        with ``expect: "nondir"`` would, without locks or journal: the caller holds
        delete's path locks and journals the record (``DirLeases``' runs)."""
        self._delete_access(ctx, parts)
        self._check_expect(canonical, "nondir", None)
        return self.ns.planner.plan_delete(
            canonical, now_ns=change_time({HOLDER_TIME: time_ns}, self.wall_ns()))

    def plan_move(self, ctx, src_parts, dst_parts, src: str, dst: str, time_ns: int):
        """A directory lease holder's batched rename that replaces nothing, checked and
        planned as ``rename`` would, without locks or journal: the caller holds rename's
        path locks and journals the record (``DirLeases``' runs); None: nothing to do."""
        self._check_rename(ctx, src_parts, dst_parts)
        return self.ns.renames.plan_rename(
            src, dst, False, now_ns=change_time({HOLDER_TIME: time_ns}, self.wall_ns()))

    def plan_attrs(self, ctx, parts, canonical: str, permission, mtime_ns, atime_ns,
                   time_ns: int) -> list:
        """A directory lease holder's batched mode and times change, checked and planned
        as ``set_permission`` and ``set_times`` would, without locks or journal: the
        caller holds their path locks and journals the records (``DirLeases``' runs)."""
        wall = change_time({HOLDER_TIME: time_ns}, self.wall_ns())
        plans = []
        if permission is not None:
            self.access.check_set_mode(ctx, parts, permission)
            plans.append(self.ns.planner.plan_set_permission(canonical, permission,
                                                             now_ns=wall))
        if mtime_ns is not None or atime_ns is not None:
            self.access.check_access(ctx, parts, owner_or=WRITE)
            plans.append(self.ns.planner.plan_set_times(canonical, mtime_ns, atime_ns,
                                                        now_ns=wall))
        return plans

    async def _set_op(self, ctx, what: str, path, planner, check=None, want_status=False,
                      durable=True):
        """``want_status``: answer the inode's status after the change instead of ``true``
        (a mount's setattr in one round trip); the change is stamped ``_wall(ctx)``."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(want_status, f"{what} {canonical}: want_status")
        async with self.locking.mutation(f"{what} {canonical}", lock_set(parts, LOCK_WRITE)):
            if check is not None:
                check(parts, canonical)
            await self.edits.log_plan(planner(canonical, self._wall(ctx)), durable=durable)
            return self.ns.view.get_file_info(canonical) if want_status else True

    async def rpc_set_permission(self, ctx, path, permission, want_status=False):
        return await self._set_op(ctx, "chmod", path, lambda p, t: self.ns.planner.plan_set_permission(
            p, permission, now_ns=t), lambda parts, _: self.access.check_set_mode(ctx, parts, permission),
            want_status, ctx.sync_metadata)

    async def rpc_set_owner(self, ctx, path, owner=None, group=None, want_status=False):
        def check(parts, canonical):
            caller = self.access.checked_caller(ctx)
            if caller is None:
                return
            chain = self.access.inode_chain(parts)
            self.permissions.check_path(caller, parts, chain, owner=True)
            if len(chain) == len(parts) + 1:   # a missing path: the planner says so
                self.permissions.check_set_owner(
                    caller, canonical,
                    check_name(owner, f"chown {canonical}: owner", optional=True),
                    check_name(group, f"chown {canonical}: group", optional=True))
        return await self._set_op(ctx, "chown", path, lambda p, t: self.ns.planner.plan_set_owner(
            p, owner, group, now_ns=t), check, want_status, ctx.sync_metadata)

    async def rpc_set_times(self, ctx, path, mtime_ns=None, atime_ns=None, ino=None,
                            want_status=False):
        """``ino``: the file is addressed by inode id (``path`` only names it in errors),
        so a writer re-applying times after its close is not thrown off by a rename."""
        def planner(p, t):
            return self.ns.planner.plan_set_times(p, mtime_ns, atime_ns, now_ns=t)

        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        if ino is None:
            return await self._set_op(ctx, "set times of", path, planner,
                                      lambda parts, _: self.access.check_access(ctx, parts,
                                                                         owner_or=WRITE),
                                      want_status)
        async with self.locking.file_lock(f"set times of {canonical}", canonical, ino) as current:
            if self.ns.view.path_of(ino) != current:
                raise FileNotFound(f"{canonical}: inode {ino} no longer exists")
            self.access.check_access(ctx, paths.split(current), owner_or=WRITE)
            check_bool(want_status, f"set times of {canonical}: want_status")
            await self.edits.log_plan(planner(current, self._wall(ctx)), durable=ctx.sync_metadata)
            return self.ns.view.get_file_info(current) if want_status else True

    async def rpc_set_replication(self, ctx, path, replication):
        return await self._set_op(ctx, "setrep", path, lambda p, t: self.ns.planner.plan_set_replication(
            p, replication, now_ns=t), lambda parts, _: self.access.check_access(ctx, parts, access=WRITE))
