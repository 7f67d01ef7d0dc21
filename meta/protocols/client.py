"""The metadata server's client protocol (HDFS ``ClientProtocol``), its creating and writing
part — mkdirs, create, create_symlink, add_block, abandon_block, complete, fsync, rewrite,
the pipeline-recovery calls (update_block_for_pipeline, update_pipeline,
get_additional_datanode), the patch calls (append with ``patch``, patch_block,
patch_done), recover_lease, append, truncate, list_open_files, renew_lease,
get_block_locations, sync_metadata, the directory leases (dir_lease_acquire,
dir_lease_release, dir_lease_events: ``dir_leases``) and the mounts' file locks (lock_get,
lock_set, lock_release, lock_release_all, lock_hold, lock_reclaim: ``locks``) (PROTOCOL.md
§2). The calls that read or change the namespace of existing paths (get_file_info, list_status, rename, concat, delete, the set_*
calls) are in ``namespace.py``.

What it is: a front end, a translator from the leasefs client RPC to the metadata server's
services. A handler checks the arguments, takes the locks (``locking``), checks the caller
(``access``, ``permissions``), asks the namespace to plan (``ns.planner``), journals the plan
(``edits``, ``journal``) and answers with located blocks (``locator``); it changes no state
of its own and holds none. Which calls go through the retry cache or run inline is declared
on ``MetaServer`` (its dispatcher reads them by method name).

Constructor: keyword arguments naming exactly what the handlers call — the services
(``ns``, ``edits``, ``access``, ``locking``, ``locator``, ``recovery`` for lease and block
recovery, ``security`` for block keys and tokens, ``dir_leases`` for directory leases), the state objects they read or change
through their public methods (``blocks``, ``reports``, ``leases``, ``datanodes``,
``journal``, ``permissions``), the ``config`` and the two clocks (``clock``: monotonic
seconds, lease times; ``wall_ns``: the times recorded in the namespace). Nothing else of
the server is reachable from here.

Durability: a handler journals with ``durable=ctx.sync_metadata`` where its record only
changes the namespace (``MetaServer.LAZY_OPS``); a connection whose hello turned
``sync_metadata`` off is then answered once the record is written and applied, before its
fsync. Records that hand out block ids or generation stamps, or that an hsync asks for,
always wait for the fsync.

Why it exists: one role per module. HDFS keeps the calls of clients apart from those of
DataNodes (``datanode.py``) and of administrators (``admin.py``).

Concurrency contract: every handler runs on the metadata server's one trio thread, each call
its own task; a mutation changes state only under its locks (``locking``) and through the
journal's apply, so two handlers interleave only at their awaits. The object itself has no
mutable state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from fs import paths
from fs.dirops import CHOSEN_INO, HOLDER_TIME, WHOLE, change_time
from fs.blocktoken import COPY as COPY_TOKEN, WRITE as WRITE_TOKEN
from fs.errors import (InvalidArgument, IsDirectory, LeaseFSError, NotReplicatedYet,
                       RecoveryInProgress, StaleGenerationStamp)

from ..blocks import blocks as bm
from ..services.dir_leases import MAX_EVENTS_WAIT, caller_name
from fs.locktable import TO_EOF
from ..services.locate import caller_host
from ..namespace.args import check_ino
from ..blocks.blocks import BlockInfo
from ..namespace.locks import LOCK_WRITE, lock_set
from ..namespace.namespace import check_bool, check_int, check_name
from ..journal.ops_blocks import AddBlock, UpdateBlocks
from ..namespace.permissions import READ, WRITE
from ..schema import keys
from ..schema.inode import DIR, FILE, SYMLINK, Inode

if TYPE_CHECKING:
    from fs.config import Config

    from ..blocks.blocks import BlocksMap
    from ..blocks.datanodes import DatanodeManager
    from ..services.locate import Locator
    from ..blocks.reports import BlockReports
    from ..journal.edits import Edits
    from ..journal.journal import Journal
    from ..leases.leases import LeaseManager
    from ..services.lease_recovery import LeaseRecovery
    from ..namespace.access import Access
    from ..namespace.locks import NamespaceLocking
    from ..namespace.namespace import Namespace
    from ..namespace.permissions import PermissionChecker
    from ..services.dir_leases import DirLeases
    from ..services.locks import Locks
    from ..services.security import Security

#: seconds ``complete`` waits for the report of the last block's first replica before it
#: answers False (the client then retries with backoff)
COMPLETE_REPORT_WAIT = 0.5

log = logging.getLogger(__name__)


class ClientProtocol:
    """Handlers of HDFS ClientProtocol calls, as ``rpc_<method>(ctx, **args)``."""

    def __init__(self, *, ns: Namespace, edits: Edits, access: Access,
                 locking: NamespaceLocking, locator: Locator, recovery: LeaseRecovery,
                 security: Security, blocks: BlocksMap, reports: BlockReports,
                 leases: LeaseManager, datanodes: DatanodeManager, journal: Journal,
                 permissions: PermissionChecker, dir_leases: DirLeases, locks: Locks,
                 config: Config,
                 clock: Callable[[], float], wall_ns: Callable[[], int]):
        self.ns = ns
        self.edits = edits
        self.access = access
        self.locking = locking
        self.locator = locator
        self.recovery = recovery
        self.security = security
        self.blocks = blocks
        self.reports = reports
        self.leases = leases
        self.datanodes = datanodes
        self.journal = journal
        self.permissions = permissions
        self.dir_leases = dir_leases
        self.locks = locks
        self.config = config
        self.clock = clock
        self.wall_ns = wall_ns

    def _now(self) -> tuple[float, int]:
        """(monotonic seconds, wall-clock ns) of this moment."""
        return self.clock(), self.wall_ns()

    def _wall(self, ctx) -> int:
        """The time a change is stamped with: the server's, or a directory lease holder's
        for its batched change (``dirops.change_time``)."""
        return change_time(ctx.extra, self.wall_ns())

    # ================================================================== client RPCs
    async def rpc_get_server_defaults(self, ctx):
        c = self.config
        return {"block_size": c.block_size, "replication": c.replication,
                "min_replication": c.min_replication, "bytes_per_checksum": c.bytes_per_checksum,
                "packet_size": c.packet_size, "write_window_packets": c.write_window_packets,
                "lease_soft_limit": c.lease_soft_limit, "lease_hard_limit": c.lease_hard_limit,
                "max_blocks_per_file": c.max_blocks_per_file, "inline_max": c.inline_max,
                "replace_datanode_best_effort": c.replace_datanode_best_effort,
                "trash_interval": c.trash_interval,
                "namespace_id": self.ns.view.namespace_id}

    async def rpc_mkdirs(self, ctx, path, permission=0o755, owner=None, group=None,
                         create_parent=True, exclusive=False, want_status=False,
                         dir_lease=None, dir_lease_inos=0):
        """``create_parent=False``/``exclusive=True`` give POSIX mkdir(2) (a missing parent
        is ``FileNotFound``, an existing path ``FileExists``); ``want_status``: answer
        ``{status, parent}`` (``changed``) instead of ``true`` (a mount's mkdir in one round
        trip). ``dir_lease`` (a client name; with ``exclusive`` and ``want_status``): the
        answer also holds ``lease``, the new directory's write lease for that client, as
        ``dir_lease_acquire`` answers it (a mount changing a tree keeps changing it), with
        up to ``dir_lease_inos`` inode ids reserved (its ``want_inos``). A directory lease
        holder's batched mkdir (``dir_batch``) comes with its inode id chosen
        (``ctx.extra[CHOSEN_INO]``) and its own time."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(create_parent, f"mkdirs {canonical}: create_parent")
        check_bool(exclusive, f"mkdirs {canonical}: exclusive")
        check_bool(want_status, f"mkdirs {canonical}: want_status")

        async def body():
            new_owner, new_group = self._mkdirs_access(ctx, parts, canonical, owner, group)
            plan = self.ns.planner.plan_mkdirs(canonical, permission, new_owner, new_group,
                                               create_parent=create_parent, exclusive=exclusive,
                                               now_ns=self._wall(ctx),
                                               chosen_ino=ctx.extra.get(CHOSEN_INO))
            await self.edits.log_plan(plan, durable=ctx.sync_metadata)
            return self.ns.view.changed(canonical) if want_status else True
        # refused before the directory is made, not after
        check_int(dir_lease_inos, f"mkdirs {canonical}: dir_lease_inos", low=0)
        if dir_lease is None and dir_lease_inos:
            raise InvalidArgument(f"mkdirs {canonical}: dir_lease_inos needs dir_lease")
        answer = await self.locking.with_ancestor_locks(f"mkdirs {canonical}", parts, body,
                                                        keep_parent_write=False)
        if dir_lease is not None:
            if not (exclusive and want_status):
                raise InvalidArgument(f"mkdirs {canonical}: dir_lease needs exclusive and "
                                      f"want_status")
            answer["lease"] = await self.dir_leases.acquire(ctx, canonical, dir_lease,
                                                            dir_lease_inos)
        return answer

    def _mkdirs_access(self, ctx, parts, canonical: str, owner, group):
        """mkdirs' permission check (an existing directory needs only traverse, as HDFS
        checks) and the new folders' owner and group."""
        caller = self.access.checked_caller(ctx)
        if caller is not None:
            chain = self.access.inode_chain(parts)
            self.permissions.check_path(caller, parts, chain,
                                        ancestor=WRITE if len(chain) <= len(parts) else 0)
        return self.access.new_owner(ctx, f"mkdirs {canonical}", canonical, owner, group)

    def plan_mkdir(self, ctx, parts, canonical: str, change):
        """A directory lease holder's batched mkdir (a ``dirops.Mkdir``), checked and
        planned as ``mkdirs`` (exclusive, no missing parents) would, without locks or
        journal: the caller holds the path locks and journals the record."""
        new_owner, new_group = self._mkdirs_access(ctx, parts, canonical, change.owner,
                                                   change.group)
        return self.ns.planner.plan_mkdirs(
            canonical, change.permission, new_owner, new_group, create_parent=False,
            exclusive=True, now_ns=change_time({HOLDER_TIME: change.time_ns}, self.wall_ns()),
            chosen_ino=change.ino)

    async def rpc_create(self, ctx, path, client_name, overwrite=False, create_parent=True,
                         replication=None, block_size=None, permission=0o644, owner=None,
                         group=None, want_status=False, first_block=False):
        """``want_status``: answer ``{status, parent}`` (the parent directory's status
        after the create) instead of the status alone. ``first_block``: also allocate the
        file's first block, as ``add_block`` would, and answer ``{status, parent?,
        first_block}`` (a writer that will write saves a round trip; one that closes the
        file empty abandons it). A directory lease holder's batched create
        (``dir_batch``) comes with its inode id chosen (``ctx.extra[CHOSEN_INO]``) and
        its own time."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(client_name, f"create {canonical}: client_name")
        check_bool(want_status, f"create {canonical}: want_status")
        check_bool(first_block, f"create {canonical}: first_block")

        async def body():
            new_owner, new_group = self._create_access(ctx, parts, canonical, overwrite,
                                                       owner, group)
            now, wall = self.clock(), self._wall(ctx)
            found = self.ns.view.walk(parts, canonical) if parts else []
            if parts and len(found) == len(parts) + 1 and overwrite is False:
                ino, inode = found[-1]
                uc = inode.uc if inode.type == FILE else None
                if uc and not await self.recovery.recover_lease_internal("create", canonical, ino,
                                                                         inode, client_name, now):
                    raise RecoveryInProgress(f"failed to create {canonical} for {client_name}: "
                                             f"lease recovery is in progress; try again later")
            plan = self.ns.planner.plan_create(
                canonical, holder=client_name, client_machine=ctx.peer, overwrite=overwrite,
                create_parent=create_parent, replication=replication, block_size=block_size,
                permission=permission, owner=new_owner, group=new_group, now_ns=wall,
                chosen_ino=ctx.extra.get(CHOSEN_INO))
            ino = plan.ino
            whole = ctx.extra.get(WHOLE)
            if whole is not None:   # a batched create with its closing write: one batch
                close = self._close_new(ctx, canonical, parts, plan, whole, change_time(
                    {HOLDER_TIME: whole.time_ns}, self.wall_ns()))
                await self.edits.log_plans([plan, close], durable=ctx.sync_metadata)
                return self.ns.view.status(canonical, ino, self.ns.view.get_inode(ino))
            block = None
            if first_block:
                # no node to place it on: the file is created without it, and the writer's
                # own add_block meets the cause when a packet is due
                try:
                    block = self._plan_block(ctx, canonical, ino, plan.replication,
                                             plan.block_size, [], None, ())
                except LeaseFSError as exc:
                    log.info("create %s: no first block: %s", canonical, exc)
            # the first block's record goes in the create's batch: one fsync for both
            await self.edits.log_plans([plan, block and block[0]], durable=ctx.sync_metadata)
            status = self.ns.view.status(canonical, ino, self.ns.view.get_inode(ino))
            answer = self.ns.view.changed(canonical, status) if want_status else status
            if not first_block:
                return answer
            located = block and self._located_new(ctx, block[1], 0)
            return {**(answer if want_status else {"status": status}), "first_block": located}
        return await self.locking.with_ancestor_locks(f"create {canonical}", parts, body)

    def _create_access(self, ctx, parts, canonical: str, overwrite, owner, group):
        """create's permission checks (WRITE on the parent; on the file too when it
        replaces one, as HDFS checks) and the new file's owner and group."""
        caller = self.access.checked_caller(ctx)
        if caller is not None:
            chain = self.access.inode_chain(parts)
            replaces = (overwrite is True and len(chain) == len(parts) + 1
                        and chain[-1].type == FILE)
            self.permissions.check_path(caller, parts, chain, ancestor=WRITE,
                                        access=WRITE if replaces else 0)
        return self.access.new_owner(ctx, f"create {canonical}", canonical, owner, group)

    def plan_whole_create(self, ctx, parts, canonical: str, holder: str, change,
                          whole) -> list:
        """A directory lease holder's batched create (a ``dirops.Create``), with the write
        that closes it (``whole``) when there is one, checked and planned as ``create``
        and ``complete`` would, without locks or journal: the caller holds create's path
        locks and journals the records (``DirLeases``' runs). The name is the holder's to
        have checked: one that exists is refused (its lease holder is the folder's)."""
        new_owner, new_group = self._create_access(ctx, parts, canonical, False,
                                                   change.owner, change.group)
        plan = self.ns.planner.plan_create(
            canonical, holder=holder, client_machine=ctx.peer, create_parent=False,
            replication=change.replication, block_size=change.block_size,
            permission=change.permission, owner=new_owner, group=new_group,
            now_ns=change_time({HOLDER_TIME: change.time_ns}, self.wall_ns()),
            chosen_ino=change.ino)
        if whole is None:
            return [plan]
        return [plan, self._close_new(ctx, canonical, parts, plan, whole, change_time(
            {HOLDER_TIME: whole.time_ns}, self.wall_ns()))]

    def plan_inline_close(self, ctx, parts, canonical: str, holder: str, change):
        """A directory lease holder's batched close of a small file it created (a
        ``dirops.Write`` with ``close`` and its content), checked and planned as
        ``complete(data=...)`` would, without locks or journal: the caller holds the
        file's lock and has found it not closed with that content already."""
        attrs = self.ns.planner.close_attrs(canonical, change.mtime_ns, change.atime_ns,
                                            change.permission)
        return self._inline_close(ctx, canonical, parts, holder, change.ino, attrs,
                                  change.data, change_time({HOLDER_TIME: change.time_ns},
                                                           self.wall_ns()))

    def _inline_close(self, ctx, canonical: str, parts, holder: str, ino, attrs, data,
                      wall: int):
        """The CLOSE of file ``ino`` its writer ``holder`` completes with its whole
        content ``data`` kept inline, checked as ``complete`` checks it."""
        _, ino, inode = self.ns.planner.writer_file(canonical, ino, holder)
        if attrs and attrs["mode"] is not None:
            self.access.check_set_mode(ctx, parts, attrs["mode"])
        self.ns.planner.check_inline(canonical, ino, inode, data)
        return self.ns.planner.plan_close(ino, None, None, wall, attrs, data=data)

    def _close_new(self, ctx, canonical: str, parts, plan, whole, wall: int):
        """The CLOSE of a file ``plan`` creates, with the whole content, times and mode of
        ``whole`` (a ``dirops.Write``), checked as ``complete`` checks them."""
        attrs = self.ns.planner.close_attrs(canonical, whole.mtime_ns, whole.atime_ns,
                                            whole.permission)
        if attrs and attrs["mode"] is not None:
            self.access.check_set_mode(ctx, parts, attrs["mode"])
        data = whole.data or None
        if data is not None:
            self.ns.planner.check_new_inline(canonical, plan.parent, plan.replication,
                                             plan.block_size, data)
        return self.ns.planner.plan_close(plan.ino, None, None, wall, attrs, data=data)

    async def rpc_create_symlink(self, ctx, target, path, create_parent=False, owner=None,
                                 group=None, want_status=False):
        """``want_status``: answer ``{status, parent}`` instead of the status alone."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(want_status, f"symlink {canonical}: want_status")

        async def body():
            self.access.check_access(ctx, parts, ancestor=WRITE)
            new_owner, new_group = self.access.new_owner(ctx, f"symlink {canonical}", canonical,
                                                         owner, group)
            _, wall = self._now()
            plan = self.ns.planner.plan_symlink(target, canonical, create_parent=create_parent,
                                        owner=new_owner, group=new_group, now_ns=wall)
            await self.edits.log_plan(plan, durable=ctx.sync_metadata)
            ino = plan.ino
            status = self.ns.view.status(canonical, ino, self.ns.view.get_inode(ino))
            return self.ns.view.changed(canonical, status) if want_status else status
        return await self.locking.with_ancestor_locks(f"symlink {canonical}", parts, body)

    async def rpc_add_block(self, ctx, path, client_name, ino=None, previous=None, excluded=()):
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        if not isinstance(excluded, (list, tuple)) or not all(isinstance(x, str) for x in excluded):
            raise InvalidArgument(f"add_block {canonical}: excluded must be a list of node ids "
                                  f"or addresses")
        async with self.locking.file_lock(f"add a block to {canonical}", canonical, ino) as current:
            _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            blocks = self.ns.view.tail_blocks(ino, inode)
            kind, last = self.ns.planner.check_previous(current, blocks, previous,
                                                        inode.block_size or 0)
            if kind != "retry" and last is not None and self._patch_pending(last["id"]):
                # the block after it would start at a length the patch may still change:
                # settled first, as a close settles it (a stamp patch_done began for a
                # patch that never came is dropped)
                if not await self.recovery.settle_patches(current, ino):
                    raise NotReplicatedYet(f"add_block {current}: block {last['id']} has a "
                                           f"patch pending and no live replica to settle it")
                inode = self.ns.view.get_inode(ino)
                blocks = self.ns.view.tail_blocks(ino, inode)
                kind, last = self.ns.planner.check_previous(current, blocks, previous,
                                                            inode.block_size or 0)
            # every block before the last is final: the last one starts at length - its size
            last_offset = (inode.length or 0) - (last["num_bytes"] if last else 0)
            if kind == "retry":
                return self.locator.located(last, self.blocks.get(last["id"]), last_offset,
                                            self.access.token_user(ctx), WRITE_TOKEN)
            commit = None
            if kind == "commit":
                self.ns.planner.check_writer_length(current, inode, previous["num_bytes"])
                commit = {"num_bytes": previous["num_bytes"]}
            waiting = [b for b in blocks[:-1] if not self.locator.is_complete(b)]
            if waiting:
                if commit is not None:
                    await self.edits.log_plan(self.ns.planner.plan_commit(ino, last, commit["num_bytes"]))
                b = waiting[0]
                raise NotReplicatedYet(f"{current}: block {b['id']} (#{b['index']}) is not yet "
                                       f"minimally replicated; try again")
            self.ns.planner.check_block_count(current, inode)
            offset = 0
            if last is not None:
                offset = last_offset + (commit["num_bytes"] if commit else last["num_bytes"])
            plan, block = self._plan_block(ctx, current, ino, inode.replication or 1,
                                           inode.block_size, blocks, commit, excluded)
            await self.edits.log_plan(plan)
            return self._located_new(ctx, block, offset)

    def _plan_block(self, ctx, current: str, ino: int, replication: int, block_size: int,
                    blocks: list, commit: dict | None, excluded) -> tuple[AddBlock, dict]:
        """The file's next block on chosen nodes: its ADD_BLOCK plan and the block. The
        caller holds the file's lock, has checked the writer and the previous block, and
        journals the plan."""
        targets = self.datanodes.choose_targets(
            replication, excluded=excluded, writer_host=caller_host(ctx),
            block_size=block_size, what=f"add_block {current}")
        block_id = self.ns.ids.allocate_block_id()
        gs = self.ns.ids.next_genstamp()
        _, wall = self._now()
        plan = self.ns.planner.plan_add_block(ino, blocks, block_id, gs, commit,
                                      [t.node_id for t in targets], wall)
        return plan, {"id": block_id, "gs": gs, "num_bytes": 0, "state": bm.UNDER_CONSTRUCTION}

    def _located_new(self, ctx, block: dict, offset: int) -> dict:
        """A block just journaled by ``_plan_block``, located for its writer, with the
        write token its block servers check (security = secure)."""
        return self.locator.located(block, self.blocks.get(block["id"]), offset,
                                    self.access.token_user(ctx), WRITE_TOKEN)

    async def rpc_abandon_block(self, ctx, path, client_name, ino=None, block=None):
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        async with self.locking.file_lock(f"abandon a block of {canonical}", canonical,
                                          ino) as current:
            _, ino, _ = self.ns.planner.writer_file(current, ino, client_name)
            blocks = self.ns.view.blocks_of(ino)
            await self.edits.log_plan(self.ns.planner.plan_abandon(current, ino, blocks, block))
            return True

    async def rpc_complete(self, ctx, path, client_name, ino=None, last=None, mtime_ns=None,
                           atime_ns=None, permission=None, data=None):
        """Close the file once its last block has ``min_replication`` reported replicas.
        The writer's block servers report their replicas while its ``complete`` is on the
        way: one not reported yet is waited for here (``COMPLETE_REPORT_WAIT``), so the
        usual complete succeeds at the first call; after that False and the client backs
        off and retries (HDFS). ``mtime_ns``/``atime_ns``/``permission``: times and mode the
        writer set while it wrote (utimens, chmod through the mount), recorded by the close
        (times instead of its own), so they need no call after it; the lease holder may set
        the times, the mode takes what chmod takes (``check_set_mode``). ``data``: the
        file's whole content, kept inline (``inline_max``) instead of in a block: the
        writer sent nothing to block servers, and the close needs no replica."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        attrs = self.ns.planner.close_attrs(canonical, mtime_ns, atime_ns, permission)
        deadline = trio.current_time() + COMPLETE_REPORT_WAIT
        while True:
            result = await self._complete_once(ctx, canonical, client_name, ino, last, attrs,
                                               data)
            if not isinstance(result, trio.Event):
                return result
            with trio.move_on_at(deadline):
                await result.wait()
            if trio.current_time() >= deadline:
                return False

    async def _complete_once(self, ctx, canonical, client_name, ino, last, attrs,
                             data=None) -> bool | trio.Event:
        """One try of ``complete``: True/False, or the event of the last block's next
        replica report to wait for (taken under the lock before any await: no report is
        missed). With inline ``data`` the close needs no replica: True or an error."""
        async with self.locking.file_lock(f"complete {canonical}", canonical, ino) as current:
            inline = isinstance(data, (bytes, bytearray))
            if (data is None or inline) and self.ns.planner.closed_with(
                    current, ino, last, bytes(data) if inline else None):
                return True
            if data is not None:   # the whole content, kept in the namespace
                # (a batched write's time: the holder's)
                await self.edits.log_plan(self._inline_close(
                    ctx, current, paths.split(current), client_name, ino, attrs, data,
                    self._wall(ctx)), durable=ctx.sync_metadata)
                return True
            _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            if attrs and attrs["mode"] is not None:
                self.access.check_set_mode(ctx, paths.split(current), attrs["mode"])
            # drops of pending patches go with the close record, in its batch: a stamp
            # patch_done began for a patch that never came costs the close no fsync of its own
            drops: list = []
            if self.blocks.pending_patches(ino):
                # a patch its writer never finished ends as lease recovery ends it: the
                # closed file holds one version of every block (not yet: asked again)
                if not await self.recovery.settle_patches(current, ino, drops=drops):
                    return False
                inode = self.ns.view.get_inode(ino)
            blocks = self.ns.view.tail_blocks(ino, inode)
            kind, block = self.ns.planner.check_last(current, blocks, last)
            wall = self._wall(ctx)
            if kind == "none":
                await self.edits.log_plans(
                    drops + [self.ns.planner.plan_close(ino, None, None, wall, attrs)],
                    durable=ctx.sync_metadata)
                return True
            earlier_ok = all(self.locator.is_complete(b) for b in blocks[:-1])
            num_bytes = last["num_bytes"]
            if kind == "commit":
                self.ns.planner.check_writer_length(current, inode, num_bytes)
                last_ok = self.blocks.would_complete(block["id"], num_bytes)
            else:
                last_ok = self.locator.is_complete(block)
            if earlier_ok and last_ok:
                await self.edits.log_plans(
                    drops + [self.ns.planner.plan_close(ino, block, num_bytes, wall, attrs)],
                    durable=ctx.sync_metadata)
                return True
            if not earlier_ok:
                if kind == "commit":
                    await self.edits.log_plan(self.ns.planner.plan_commit(ino, block, num_bytes))
                return False
            # taken before the commit record's fsync: the replicas reported during it
            # (every node answered the writer already) must not be missed
            waiter = self.reports.waiter(block["id"])
            if kind == "commit":
                await self.edits.log_plan(self.ns.planner.plan_commit(ino, block, num_bytes))
            return waiter

    async def rpc_fsync(self, ctx, path, client_name, ino=None, last_block_length=0, data=None,
                        sync=True):
        """Record the last block's length (hsync). ``data``: the file's whole content from
        a writer that sent nothing to block servers, kept inline while the file stays open
        (an hflush/hsync of a small file: one journaled call, no pipeline). ``sync=False``:
        a flush (readers see it; new opens see the length), not an hsync: durable as the
        connection's other namespace changes are (``sync_metadata``)."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        check_bool(sync, f"fsync {canonical}: sync")
        durable = sync or ctx.sync_metadata
        async with self.locking.file_lock(f"fsync {canonical}", canonical, ino) as current:
            _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            if data is not None:
                self.ns.planner.check_inline(current, ino, inode, data, "fsync")
                await self.edits.log_plan(self.ns.planner.plan_inline(ino, data), durable=durable)
                return True
            blocks = self.ns.view.tail_blocks(ino, inode, 1)
            plan = self.ns.planner.plan_fsync(current, ino, blocks, last_block_length)
            if plan is not None:
                self.ns.planner.check_writer_length(current, inode, last_block_length)
                await self.edits.log_plan(plan, durable=durable)
            elif durable:   # nothing new to record: what was answered before is durable too
                await self.journal.sync()
            return True

    async def rpc_rewrite(self, ctx, path, client_name, ino=None):
        """Start the file the caller is writing over, empty, under its lease: its blocks go
        (invalidated once durable), the file stays open for the caller. The writer replaces
        the whole content (the mount's upload of a staging file) with one journaled call
        instead of complete, truncate and append, and nobody can take the file in between.
        Answers the file's status."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        async with self.locking.file_lock(f"rewrite {canonical}", canonical, ino) as current:
            current, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            _, wall = self._now()
            await self.edits.log_plan(self.ns.planner.plan_rewrite(ino, inode, now_ns=wall))
            return self.ns.view.status(current, ino, self.ns.view.get_inode(ino))

    async def rpc_sync_metadata(self, ctx):
        """Wait until every namespace change answered so far is durable (the changes of a
        client without ``sync_metadata``: a mount's fsync(2) of a folder, ``sync``); returns
        the durable txid."""
        return await self.journal.sync()

    # ------------------------------------------------------------------ pipeline recovery
    def _pipeline_block(self, what: str, block) -> tuple[int, BlockInfo, str]:
        """``(block id, its BlockInfo, its file's path)`` for a pipeline-recovery call."""
        if not isinstance(block, dict):
            raise InvalidArgument(f"{what}: block must be {{id, gs, num_bytes}}, got "
                                  f"{block!r:.80}")
        block_id = check_int(block.get("id"), f"{what}: block.id", low=0)
        info = self.blocks.get(block_id)
        path = self.ns.view.path_of(info.ino) if info is not None else None
        if info is None or path is None:
            raise StaleGenerationStamp(f"{what}: block {block_id} belongs to no file (deleted "
                                       f"or abandoned)")
        return block_id, info, path

    def _writer_last_block(self, what: str, current: str, ino: int, block_id: int,
                           client_name: str) -> dict:
        """The file's last block after the writer checks: the caller holds the lease (checked
        first, as HDFS checkUCBlock: a writer whose file was taken over learns that, not the
        block state the takeover left), the block is the last one and still under
        construction."""
        _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
        tail = self.ns.view.tail_blocks(ino, inode, 1)
        if not tail or tail[-1]["id"] != block_id:
            raise StaleGenerationStamp(f"{what}: block {block_id} is not the last block of "
                                       f"{current}")
        last = tail[-1]
        info = self.blocks.get(block_id)
        if last["state"] != bm.UNDER_CONSTRUCTION or info is None \
                or info.state != bm.UNDER_CONSTRUCTION:
            raise StaleGenerationStamp(f"{what}: block {block_id} of {current} is "
                                       f"{info.state if info else last['state']}, not under "
                                       f"construction")
        return last

    async def rpc_update_block_for_pipeline(self, ctx, block, client_name):
        """A fresh generation stamp for the pipeline recovery of a block being written
        (HDFS updateBlockForPipeline): only the lease holder, only the file's last block
        under construction. The stamp is journaled; the block keeps its old one until
        ``update_pipeline``."""
        what = "update_block_for_pipeline"
        check_name(client_name, f"{what}: client_name")
        block_id, info, path = self._pipeline_block(what, block)
        async with self.locking.file_lock(f"{what} {path}", path, info.ino) as current:
            last = self._writer_last_block(what, current, info.ino, block_id, client_name)
            stamp = self.ns.planner.plan_set_genstamp()
            await self.journal.log(stamp)
            log.info("%s: new generation stamp %d for block %d of %s", what, stamp.gs,
                     block_id, current)
            answer = {"block": {"id": block_id, "gs": stamp.gs,
                                "num_bytes": last["num_bytes"]},
                      "locations": [loc for loc in map(self.locator.location, info.location_nodes())
                                    if loc is not None]}
            # the recovered pipeline is set up under the new stamp: a write token for it
            # (also how a writer whose token expired gets a fresh one)
            token = self.security.block_token(block_id, stamp.gs, self.access.token_user(ctx),
                                              WRITE_TOKEN)
            if token is not None:
                answer["token"] = token
            return answer

    async def rpc_update_pipeline(self, ctx, client_name, old_block, new_block, new_nodes):
        """Commit a pipeline recovery (HDFS updatePipeline): the block takes the new stamp
        (larger than its current one) and the acknowledged length (never shorter), and the
        new pipeline's nodes become its expected locations. Journaled."""
        what = "update_pipeline"
        check_name(client_name, f"{what}: client_name")
        block_id, info, path = self._pipeline_block(what, old_block)
        if not isinstance(new_block, dict) or new_block.get("id") != block_id:
            raise InvalidArgument(f"{what}: new_block must be block {block_id} with its new "
                                  f"stamp, got {new_block!r:.80}")
        old_gs = check_int(old_block.get("gs"), f"{what}: old_block.gs", low=0)
        new_gs = check_int(new_block.get("gs"), f"{what}: new_block.gs", low=0)
        new_length = check_int(new_block.get("num_bytes"), f"{what}: new_block.num_bytes", low=0)
        if not isinstance(new_nodes, (list, tuple)) or not new_nodes:
            raise InvalidArgument(f"{what}: new_nodes must be a non-empty list of node ids")
        node_ids = [n.get("node_id") if isinstance(n, dict) else n for n in new_nodes]
        if not all(isinstance(n, str) and n for n in node_ids) \
                or len(set(node_ids)) != len(node_ids):
            raise InvalidArgument(f"{what}: new_nodes must be distinct node ids, got "
                                  f"{new_nodes!r:.200}")
        async with self.locking.file_lock(f"{what} {path}", path, info.ino) as current:
            last = self._writer_last_block(what, current, info.ino, block_id, client_name)
            where = f"{what} of block {block_id} of {current}"
            if last["gs"] == new_gs and old_gs < new_gs and new_length >= last["num_bytes"]:
                # a retry whose first reply was lost: already done
                self.blocks.update_pipeline(block_id, new_gs, new_length, node_ids)
                return True
            if old_gs != last["gs"]:
                raise StaleGenerationStamp(f"{where}: the old stamp {old_gs} is not the "
                                           f"block's current stamp {last['gs']}")
            if new_gs <= last["gs"]:
                raise StaleGenerationStamp(f"{where}: the new stamp {new_gs} is not larger "
                                           f"than the current {last['gs']}")
            if new_gs > self.ns.ids.genstamp:
                raise StaleGenerationStamp(f"{where}: stamp {new_gs} was never issued")
            if new_length < last["num_bytes"]:
                raise InvalidArgument(f"{where}: the length may not shrink from "
                                      f"{last['num_bytes']} to {new_length}")
            inode = self.ns.view.get_inode(info.ino)
            self.ns.planner.check_block_length(current, inode, new_length)
            await self.journal.log(UpdateBlocks(ino=info.ino, blocks=[{
                "index": last["index"], "id": block_id, "gs": new_gs, "num_bytes": new_length,
                "state": bm.UNDER_CONSTRUCTION}]))
            self.blocks.update_pipeline(block_id, new_gs, new_length, node_ids)
            log.info("%s: stamp %d -> %d, length %d, pipeline %s", where, old_gs, new_gs,
                     new_length, node_ids)
            return True

    async def rpc_get_additional_datanode(self, ctx, path, ino=None, block=None, existing=(),
                                          excluded=(), num=1, client_name=None):
        """Replacement block servers for a pipeline being recovered (HDFS
        getAdditionalDatanode): ``num`` live nodes that are neither in ``existing`` nor in
        ``excluded`` (node ids or addresses). Returns ``{block, locations}``."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        what = f"get_additional_datanode {canonical}"
        num = check_int(num, f"{what}: num", low=1, high=self.config.max_replication)
        for name, value in (("existing", existing), ("excluded", excluded)):
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
                raise InvalidArgument(f"{what}: {name} must be a list of node ids or addresses")
        if client_name is not None:
            _, ino, inode = self.ns.planner.writer_file(canonical, ino, client_name)
        else:
            _, ino, inode, _ = self.ns.view.resolve(canonical)
        if inode is None or inode.type != FILE:
            raise InvalidArgument(f"{what}: not a file")
        # only the lease holder may have its block copied to the replacement
        token = None if client_name is None else self._copy_token(ctx, what, canonical, ino,
                                                                  inode, block)
        targets = self.datanodes.choose_targets(
            num, excluded=list(existing) + list(excluded), writer_host=caller_host(ctx),
            block_size=(inode.block_size or 0), what=what)
        # described as every located block's nodes are (``Locator.location``), so a front
        # end that needs more of a node (its HDFS data port) finds it here too
        answer = {"block": block, "locations": [self.locator.location(t.node_id)
                                                for t in targets]}
        if token is not None:
            answer["token"] = token
        return answer

    def _copy_token(self, ctx, what: str, canonical: str, ino: int, inode: Inode,
                    block) -> dict | None:
        """The copy token (security = secure) with which the writer has a pipeline node copy
        ``block`` to a replacement (TRANSFER_BLOCK): only for the file's last block under
        construction, at a stamp it has had (the copy's source may still carry the stamp
        from before ``append`` or an unfinished recovery)."""
        if self.security.block_keys is None:
            return None
        if not isinstance(block, dict):
            raise InvalidArgument(f"{what}: block must be {{id, gs, num_bytes}}, got "
                                  f"{block!r:.80}")
        block_id = check_int(block.get("id"), f"{what}: block.id", low=0)
        gs = check_int(block.get("gs"), f"{what}: block.gs", low=0)
        info = self.blocks.get(block_id)
        if info is not None and info.ino == ino and info.patch_gs and gs == info.patch_gs:
            # a block being patched: the writer has a replica that took the patch copied
            # (finalized, at the patch's stamp) to replace one that missed it
            return self.security.block_token(block_id, gs, self.access.token_user(ctx),
                                             COPY_TOKEN)
        tail = self.ns.view.tail_blocks(ino, inode, 1)
        if not tail or tail[-1]["id"] != block_id \
                or tail[-1]["state"] != bm.UNDER_CONSTRUCTION:
            raise StaleGenerationStamp(f"{what}: block {block_id} is not the last block under "
                                       f"construction of {canonical}, nor one being patched")
        if gs > tail[-1]["gs"]:
            raise StaleGenerationStamp(f"{what}: block {block_id} of {canonical} has stamp "
                                       f"{tail[-1]['gs']}, not {gs}")
        return self.security.block_token(block_id, gs, self.access.token_user(ctx), COPY_TOKEN)

    async def rpc_recover_lease(self, ctx, path, client_name):
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(client_name, f"recover_lease {canonical}: client_name")
        async with self.locking.mutation(f"recover lease of {canonical}",
                                         lock_set(parts, LOCK_WRITE)):
            self.access.check_access(ctx, parts, access=WRITE)
            _, ino, inode, _ = self.ns.view.resolve(canonical)
            if inode.type != FILE:
                raise IsDirectory(f"recover_lease {canonical}: not a file") \
                    if inode.type == DIR else InvalidArgument(
                        f"recover_lease {canonical}: not a file")
            if not inode.uc:
                return True
            return await self.recovery.recover_lease_internal(
                "recover the lease of", canonical, ino, inode, client_name, self.clock(),
                force=True)

    async def _reopen_checks(self, op: str, canonical: str, client_name: str) -> tuple[int, dict]:
        """append/truncate: the path must be a file; an open one goes through
        recoverLeaseInternal first (closed at once → go on, else RecoveryInProgress)."""
        _, ino, inode, _ = self.ns.view.resolve(canonical)
        if inode.type == DIR:
            raise IsDirectory(f"cannot {op} {canonical}: it is a directory")
        if inode.type != FILE:
            raise InvalidArgument(f"cannot {op} {canonical}: not a file")
        if inode.uc:
            if not await self.recovery.recover_lease_internal(op, canonical, ino, inode,
                                                              client_name, self.clock()):
                raise RecoveryInProgress(f"failed to {op} {canonical} for {client_name}: lease "
                                         f"recovery is in progress; try again later")
            inode = self.ns.view.get_inode(ino)
        return ino, inode

    async def rpc_truncate(self, ctx, path, new_length, client_name):
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(client_name, f"truncate {canonical}: client_name")
        check_int(new_length, f"truncate {canonical}: new_length", low=0)
        async with self.locking.mutation(f"truncate {canonical}", lock_set(parts, LOCK_WRITE)):
            self.access.check_access(ctx, parts, access=WRITE)
            ino, inode = await self._reopen_checks("truncate", canonical, client_name)
            _, wall = self._now()
            plan = self.ns.planner.plan_truncate(canonical, ino, inode, new_length, holder=client_name,
                                         client_machine=ctx.peer or "", now_ns=wall)
            if plan is None:
                return True
            await self.edits.log_plan(plan)
            last = plan.last
            if last is None:
                return True
            await self.recovery.start_block_recovery(canonical, ino, last,
                                                     new_length=last["num_bytes"])
            return False

    async def rpc_append(self, ctx, path, client_name, patch=False):
        """HDFS append: the file under construction for the caller, a partial last block
        reopened under a new stamp (``last_block``). ``patch``: opened for patches instead
        (``patch_block``/``patch_done``, PROTOCOL.md "Patches"): as an append on a block
        boundary leaves it, no block reopened, every block stays COMPLETE with its stamp;
        the answer's ``blocks`` are the file's located blocks, with write tokens. A file
        kept inline has no block to patch: refused."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_name(client_name, f"append {canonical}: client_name")
        check_bool(patch, f"append {canonical}: patch")
        async with self.locking.mutation(f"append to {canonical}", lock_set(parts, LOCK_WRITE)):
            self.access.check_access(ctx, parts, access=WRITE)
            ino, inode = await self._reopen_checks("append", canonical, client_name)
            if patch:
                return await self._open_for_patch(ctx, canonical, client_name, ino, inode)
            tail = self.ns.view.tail_blocks(ino, inode, 1)
            partial = bool(tail) and tail[-1]["num_bytes"] < inode.block_size
            new_gs = self.ns.ids.next_genstamp() if partial else None
            _, wall = self._now()
            plan = self.ns.planner.plan_append(ino, inode, holder=client_name,
                                       client_machine=ctx.peer or "", new_gs=new_gs, now_ns=wall)
            await self.edits.log_plan(plan)
            inode = self.ns.view.get_inode(ino)
            last_block = None
            last = plan.last
            if last is not None:
                block = {**self.ns.view.tail_blocks(ino, inode, 1)[-1]}
                offset = (inode.length or 0) - block["num_bytes"]
                # written on under the new stamp: a write token for it
                last_block = self.locator.located(block, self.blocks.get(block["id"]), offset,
                                                  self.access.token_user(ctx), WRITE_TOKEN)
            answer = {"status": self.ns.view.status(canonical, ino, inode), "last_block": last_block}
            data = self.ns.view.inline_data(ino, inode)
            if data is not None:   # the writer starts with these bytes (sent first)
                answer["inline"] = data
            return answer

    async def _open_for_patch(self, ctx, canonical: str, client_name: str, ino: int,
                              inode: Inode) -> dict:
        """``append(patch=true)`` after the reopen checks (the caller holds the path lock):
        an APPEND record without a block, answered with every block located for its
        writer."""
        if inode.inline is not None:
            # no block to patch: its content lives in the namespace, not on block servers
            raise InvalidArgument(f"append {canonical} with patch: the file is kept "
                                  f"inline: write it whole")
        _, wall = self._now()
        await self.edits.log_plan(self.ns.planner.plan_append(
            ino, inode, holder=client_name, client_machine=ctx.peer or "", new_gs=None,
            now_ns=wall))
        inode = self.ns.view.get_inode(ino)
        return {"status": self.ns.view.status(canonical, ino, inode), "last_block": None,
                "blocks": self.locator.writer_blocks(ino, inode, self.access.token_user(ctx),
                                                     WRITE_TOKEN)}

    # ------------------------------------------------------------------ patches
    def _patch_pending(self, block_id: int) -> bool:
        info = self.blocks.get(block_id)
        return info is not None and bool(info.patch_gs)

    @staticmethod
    def _patch_ref(what: str, block, *, with_length: bool) -> tuple[int, int, int | None]:
        """``(id, gs, num_bytes)`` of a patch call's ``block`` argument."""
        form = "{id, gs, num_bytes}" if with_length else "{id, gs}"
        if not isinstance(block, dict):
            raise InvalidArgument(f"{what}: block must be {form}, got {block!r:.80}")
        block_id = check_int(block.get("id"), f"{what}: block.id", low=0)
        gs = check_int(block.get("gs"), f"{what}: block.gs", low=0)
        num_bytes = check_int(block.get("num_bytes"), f"{what}: block.num_bytes",
                              low=0) if with_length else None
        return block_id, gs, num_bytes

    def _block_of_file(self, what: str, current: str, ino: int,
                       block_id: int) -> tuple[dict, BlockInfo]:
        """The stored block ``block_id`` of file ``ino`` (with its ``index``) and its
        BlockInfo; StaleGenerationStamp when the file has no such block (never had, or
        lost it to a truncate, rewrite or abandon), as the pipeline calls answer."""
        info = self.blocks.get(block_id)
        stored = None
        if info is not None and info.ino == ino:
            stored = self.ns.view.read(keys.block_key(ino, info.index))
        if stored is None or stored.get("id") != block_id:
            raise StaleGenerationStamp(f"{what}: block {block_id} is not a block of {current}")
        return {**stored, "index": info.index}, info

    async def rpc_patch_block(self, ctx, path, client_name, ino=None, block=None):
        """A new generation stamp for a patch of a COMPLETE block of the file the caller
        holds the lease on (PROTOCOL.md "Patches"): journaled (PATCH_BEGIN) and pending on
        the block, which keeps its stamp for readers until ``patch_done``. A second patch
        of the block before that gets a newer stamp and supersedes the first. Answers the
        block under the new stamp, its live replicas (the patch goes to all of them), a
        write token for the new stamp (security = secure) and the file's block size."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        what = f"patch_block {canonical}"
        check_name(client_name, f"{what}: client_name")
        block_id, gs, _ = self._patch_ref(what, block, with_length=False)
        async with self.locking.file_lock(f"patch a block of {canonical}", canonical,
                                          ino) as current:
            # the lease first, as the pipeline calls check it: a writer whose file was
            # taken over learns that, not the state the takeover left
            _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            stored, info = self._block_of_file(f"patch_block {current}", current, ino,
                                               block_id)
            if stored["state"] != bm.COMPLETE or info.state != bm.COMPLETE:
                raise StaleGenerationStamp(
                    f"patch_block {current}: block {block_id} is "
                    f"{info.state if stored['state'] == bm.COMPLETE else stored['state']}, "
                    f"not COMPLETE: only a finished block is patched")
            if gs != stored["gs"]:
                raise StaleGenerationStamp(f"patch_block {current}: block {block_id} has "
                                           f"stamp {stored['gs']}, not {gs}")
            plan = self.ns.planner.plan_patch_begin(ino, stored)
            await self.edits.log_plan(plan)
            log.debug("patch_block %s: block %d stamp %d, patch stamp %d%s", current, block_id,
                      gs, plan.gs, f" (supersedes {info.patch_gs})"
                      if info.patch_gs and info.patch_gs != plan.gs else "")
            return self._patch_answer(ctx, inode, stored, info, plan.gs)

    def _patch_answer(self, ctx, inode, stored: dict, info: BlockInfo, patch_gs: int) -> dict:
        """What a patch of block ``stored`` at the pending stamp ``patch_gs`` needs: the
        block under that stamp, its live good replicas (the patch goes to all of them), a
        write token for the stamp (security = secure) and the file's block size."""
        answer = {"block": {"id": stored["id"], "gs": patch_gs,
                            "num_bytes": stored["num_bytes"]},
                  "locations": [loc for loc in map(self.locator.location, info.good_nodes())
                                if loc is not None],
                  "block_size": inode.block_size}
        token = self.security.block_token(stored["id"], patch_gs, self.access.token_user(ctx),
                                          WRITE_TOKEN)
        if token is not None:
            answer["token"] = token
        return answer

    async def rpc_patch_done(self, ctx, path, client_name, ino=None, block=None, nodes=(),
                             begin_next=False):
        """Commit a patch (PATCH_BLOCK): the block takes its pending patch stamp and the
        length ``block.num_bytes`` (never shorter; longer only for the file's last block,
        within the block size; growth is charged to space quotas), ``nodes`` (those that
        acknowledged the patch) become its replicas, the other replicas turn stale
        (invalidated, and the block re-replicated from the new ones). A retry whose reply
        was lost finds it done: True again.

        ``begin_next``: the block's next patch begins in the same journal batch
        (PATCH_BEGIN, a new pending stamp), and the answer is ``{"done": true, "next":
        <what patch_block answers>}``: a writer that patches a block again and again (a
        database) asks the metadata server once per patch instead of twice. A stamp handed
        out this way and never used is dropped when the file closes, as any pending patch
        is."""
        canonical = paths.validate(path)
        ino = check_ino(ino, canonical)
        what = f"patch_done {canonical}"
        check_name(client_name, f"{what}: client_name")
        check_bool(begin_next, f"{what}: begin_next")
        block_id, gs, num_bytes = self._patch_ref(what, block, with_length=True)
        if not isinstance(nodes, (list, tuple)) or not nodes:
            raise InvalidArgument(f"{what}: nodes must be a non-empty list of node ids")
        node_ids = [n.get("node_id") if isinstance(n, dict) else n for n in nodes]
        if not all(isinstance(n, str) and n for n in node_ids) \
                or len(set(node_ids)) != len(node_ids):
            raise InvalidArgument(f"{what}: nodes must be distinct node ids, got "
                                  f"{nodes!r:.200}")
        async with self.locking.file_lock(f"commit a patch of {canonical}", canonical,
                                          ino) as current:
            _, ino, inode = self.ns.planner.writer_file(current, ino, client_name)
            where = f"patch_done {current}"
            stored, info = self._block_of_file(where, current, ino, block_id)
            if info.patch_gs != gs:
                if stored["gs"] == gs and stored["num_bytes"] == num_bytes:
                    # a retry whose first reply was lost: already done
                    if not begin_next:
                        return True
                    if info.patch_gs:   # the next patch it began then
                        return {"done": True,
                                "next": self._patch_answer(ctx, inode, stored, info,
                                                           info.patch_gs)}
                raise StaleGenerationStamp(
                    f"{where}: stamp {gs} is not the pending patch stamp of block {block_id} "
                    f"({info.patch_gs or 'none pending'}; its stamp is {stored['gs']})")
            for node_id in node_ids:
                replica = info.replicas.get(node_id)
                if replica is not None and replica.gs in (stored["gs"], gs):
                    continue
                if self.datanodes.live(node_id) is not None:
                    # a replacement the writer had a copy made on, not reported yet; the
                    # stale replica it may have held before (a patch it missed) is the one
                    # the copy replaced. Its own report corrects a claim that is wrong.
                    continue
                raise InvalidArgument(
                    f"{where}: node {node_id} holds no replica of block {block_id} at its "
                    f"stamp {stored['gs']} or the patch's {gs}")
            _, wall = self._now()
            plan = self.ns.planner.plan_patch_block(
                current, ino, inode, stored, gs, num_bytes, node_ids,
                last=info.index == (inode.nblocks or 0) - 1, now_ns=wall)
            log.debug("%s: block %d stamp %d -> %d, length %d, replicas %s", where, block_id,
                      stored["gs"], gs, num_bytes, node_ids)
            if not begin_next:
                await self.edits.log_plan(plan)
                return True
            begin = self.ns.planner.plan_patch_begin(ino, stored)
            await self.edits.log_plans([plan, begin])
            stored = {**self.ns.view.read(keys.block_key(ino, info.index)), "index": info.index}
            return {"done": True, "next": self._patch_answer(
                ctx, self.ns.view.get_inode(ino), stored, info, begin.gs)}

    async def rpc_list_open_files(self, ctx, path="/"):
        """HDFS ``dfsadmin -listOpenFiles``: the superuser's (it names files and their
        writers in folders others may not list; the web page hides those instead)."""
        canonical = paths.validate(path)
        self.permissions.check_superuser(self.access.caller_of(ctx), f"list open files {canonical}")
        now = self.clock()
        out = []
        for ino, holder in list(self.leases.lease_by_ino.items()):
            file_path = self.ns.view.path_of(ino)
            if file_path is None or not (canonical == "/" or file_path == canonical
                                         or file_path.startswith(canonical + "/")):
                continue
            inode = self.ns.view.get_inode(ino)
            if inode is None or not inode.uc:
                continue
            lease = self.leases.lease_of(holder)
            tail = self.ns.view.tail_blocks(ino, inode, 1)
            out.append({"path": file_path, "ino": ino, "holder": holder,
                        "client_machine": (inode.uc.client_machine or ""),
                        "last_renewal_age": round(now - lease.last_update, 3) if lease else None,
                        "last_block_state": self.recovery.block_state(tail[-1]) if tail else None})
        out.sort(key=lambda e: e["path"])
        return out

    async def rpc_renew_lease(self, ctx, client_name):
        check_name(client_name, "renew_lease: client_name")
        self.leases.renew(client_name, self.clock())
        self.dir_leases.renewed(client_name)
        self.locks.renewed(client_name)
        return True

    async def rpc_get_block_locations(self, ctx, path, offset=0, length=None):
        self.access.check_access(ctx, paths.split(path), access=READ)
        parts, ino, inode, _ = self.ns.view.resolve(path)
        canonical = paths.join_parts(parts)
        if inode.type == DIR:
            raise IsDirectory(f"{canonical}: is a directory")
        if inode.type == SYMLINK:
            raise InvalidArgument(f"{canonical}: is a symlink (to {inode.target})")
        check_int(offset, f"{canonical}: offset", low=0)
        if length is not None:
            check_int(length, f"{canonical}: length", low=0)
        return self.locator.file_locations(ino, inode, offset,
                                           math.inf if length is None else offset + length,
                                           self.access.token_user(ctx), caller_host(ctx))

    # ================================================================== directory leases
    async def rpc_dir_lease_acquire(self, ctx, path, client_name, want_inos=0, below=0):
        return await self.dir_leases.acquire(ctx, path, client_name, want_inos, below)

    async def rpc_dir_lease_release(self, ctx, path, client_name, epoch):
        return await self.dir_leases.release(ctx, path, client_name, epoch)

    async def rpc_dir_lease_events(self, ctx, client_name, wait=MAX_EVENTS_WAIT, ack=None):
        return await self.dir_leases.events(ctx, client_name, wait, ack)

    async def rpc_dir_batch(self, ctx, client_name, ops):
        return await self.dir_leases.batch(ctx, client_name, ops)

    # ================================================================== file locks
    @staticmethod
    def _own_name(ctx, client_name, method: str) -> None:
        """A client takes and drops only its own locks."""
        if caller_name(ctx) != client_name:
            raise InvalidArgument(f"{method}: client_name {client_name!r:.60} is not this "
                                  f"connection's client ({caller_name(ctx)})")

    async def rpc_lock_get(self, ctx, client_name, ino, owner, kind, start=0, end=TO_EOF):
        self._own_name(ctx, client_name, "lock_get")
        return self.locks.get(client_name, ino, owner, kind, start, end)

    async def rpc_lock_set(self, ctx, client_name, ino, owner, kind, style="posix", start=0,
                           end=TO_EOF, pid=0, wait=0):
        self._own_name(ctx, client_name, "lock_set")
        return await self.locks.set(client_name, ino, owner, kind, style, start, end, pid,
                                    wait)

    async def rpc_lock_release(self, ctx, client_name, ino, owner, style="posix"):
        self._own_name(ctx, client_name, "lock_release")
        return self.locks.release(client_name, ino, owner, style)

    async def rpc_lock_release_all(self, ctx, client_name):
        self._own_name(ctx, client_name, "lock_release_all")
        return await self.locks.release_all(client_name)

    async def rpc_lock_hold(self, ctx, client_name, held=0):
        self._own_name(ctx, client_name, "lock_hold")
        return self.locks.hold(client_name, held)

    async def rpc_lock_reclaim(self, ctx, client_name, locks):
        self._own_name(ctx, client_name, "lock_reclaim")
        return await self.locks.reclaim(client_name, locks)
