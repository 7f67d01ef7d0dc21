"""Answers of retry-cached calls applied before a failover or a restart (HDFS rebuilds its
retry cache from the edits it tails; here the answers themselves are rebuilt).

Why it exists: a record written for a retry-cached call carries the call's key, and a
server applying it notes the key (``RetryCache.note``: applied, answer not known). A client
whose reply was lost in the failover sends the same call again to the new active; running
it a second time would answer ``FileExists`` to its own create, ``FileNotFound`` to its own
rename or delete. Here each cached method gets one function that makes the answer the first
call had from the current state, which the retry found right after that call (its client
waits for the answer, so nothing of its own happened in between).

Each function takes the server, the call's context, ``rerun`` (``await rerun()`` runs the
call again, under the same retry cache key), ``kept`` (what the call's record kept of its
answer, ``meta.journal.ops.RPC_KEPT``; None when nothing) and the call's arguments by the handler's
own names and defaults. Per method, one of:

* rebuilt: the answer from the state the call left (mkdirs, create, create_symlink,
  delete and rename (their ``want_status`` answers: below), rename_many, append,
  truncate, rewrite);
* rebuilt with what the record kept: the part of the answer the call itself removed from
  the namespace. delete and rename with ``want_status`` answer the status of the inode
  they deleted or replaced (a mount's unlink, rmdir and rename act on its inode id and
  type); such a call passes it to its journal record (``keep_removed``, the handler's
  ``log_plan(kept=...)``), only then, in a compact form (``_REMOVED_FIELDS``);
* run again, where a second run is safe and gives the first answer: add_block (its
  ``previous`` check recognizes a retry and hands out the same last block; without
  ``previous`` after an append to a full block: rebuilt), complete (a
  file already closed with that last block answers true), recover_lease (idempotent: closed
  → true, in recovery → false), and create/create_symlink/rewrite/append when the caller's
  result is not there and a second run cannot destroy anything (it creates, reopens or
  fails). Not there is also what a call leaves that failed after its first record: create,
  append and truncate of a file open for another writer journal its lease recovery first
  and may then answer ``RecoveryInProgress``;
* ``AnswerLost`` (retriable, but not by ``RpcClient``'s same-id retry, which would meet
  it again): the answer cannot be rebuilt and a second run is not safe (a file a truncate
  left that has changed since; a delete or rename with ``want_status`` whose record was
  written without ``RPC_KEPT``, by a server from before it; a parent or moved inode gone
  since). The call changed the namespace; the client may look at it or send the
  operation again as a new call.

Permissions are not checked again: the key is the caller's own client id (random per
client), as for answers cached before the failover.

Concurrency contract: called on the server's trio thread by ``RetryCache.run`` (through
``MetaServer.retry_answer``) while the key's entry is marked running; a rebuilt answer is
read without awaiting (the state between two applied journal batches, as the inline reads
see it) and takes no lock; a rerun takes the handler's own locks.
"""

from __future__ import annotations

from fs import paths
from fs.blocktoken import WRITE as WRITE_TOKEN
from fs.errors import AnswerLost, FileNotFound, InternalError, NotDirectory

from ..blocks import blocks as bm
from ..schema.inode import FILE, SYMLINK


def _lost(method: str, path: str, why: str) -> AnswerLost:
    return AnswerLost(f"{method} {path}: this call changed the namespace before a failover "
                      f"or restart, but its answer cannot be rebuilt ({why}); look at the "
                      f"namespace, or send the operation again as a new call")


def _found(server, canonical: str):
    """``(ino, inode)`` at ``canonical``, or None when nothing is there."""
    parts = paths.split(canonical)
    try:
        found = server.ns.view.walk(parts, canonical)
    except NotDirectory:
        return None
    return found[-1] if len(found) == len(parts) + 1 else None


def _changed(server, canonical: str, status: dict | None = None) -> dict:
    """The ``want_status`` answer of a change at ``canonical``, as the handlers make it:
    the inode's status and its parent directory's."""
    return {"status": server.ns.view.get_file_info(canonical) if status is None else status,
            "parent": server.ns.view.get_file_info(paths.parent(canonical))}


# a removed inode's status as its call's record keeps it (``RPC_KEPT``), in this order:
# every field of ``NamespaceView.status`` but ``path`` and ``name``, the call's own path and its
# last name (an inode's name is its entry's). Positional, so a mount's unlink grows its
# record by ~75 bytes, not ~280; a field added to the status is added at the end, and a
# record with fewer is answered ``AnswerLost``
_REMOVED_FIELDS = ("ino", "type", "mode", "owner", "group", "mtime_ns", "atime_ns",
                   "ctime_ns", "length", "replication", "block_size", "symlink",
                   "under_construction", "children", "subdirs", "parent", "quota")


def keep_removed(status: dict | None) -> list:
    """What a delete or rename answering ``want_status`` keeps in its record for a retry:
    the status (``NamespaceView.status``) of the inode it removed, or ``[]`` when it replaced
    none (a rename with overwrite onto a free destination)."""
    return [] if status is None else [status[name] for name in _REMOVED_FIELDS]


class _NotKept(Exception):
    """A record without a usable ``keep_removed`` value."""


def _removed(kept, canonical: str) -> dict | None:
    """The status ``keep_removed`` kept, the inode having been at ``canonical``; None for
    ``[]``; ``_NotKept`` for anything else (no value: a record of an older server)."""
    if kept == []:
        return None
    if not isinstance(kept, list) or len(kept) != len(_REMOVED_FIELDS):
        raise _NotKept
    return {"name": paths.split(canonical)[-1], "path": canonical,
            **dict(zip(_REMOVED_FIELDS, kept))}


def _held_by(inode, client_name) -> bool:
    """The file is open for writing by ``client_name``."""
    if inode is None or inode.type != FILE:
        return False
    uc = inode.uc
    return bool(uc) and uc.holder == client_name


async def mkdirs(server, ctx, rerun, kept, path, permission=0o755, owner=None, group=None,
                 create_parent=True, exclusive=False, want_status=False):
    """Rebuilt: true, or ``{status, parent}`` of the directory now."""
    canonical = paths.join_parts(paths.split(path))
    if not want_status:
        return True
    try:
        return _changed(server, canonical)
    except FileNotFound:
        raise _lost("mkdirs", canonical, "the directory is gone since") from None


async def create(server, ctx, rerun, kept, path, client_name, overwrite=False,
                 create_parent=True, replication=None, block_size=None, permission=0o644,
                 owner=None, group=None, want_status=False, first_block=False):
    """Rebuilt when the file at ``path`` is open for ``client_name``: its status (``want_status``:
    and its parent's), with ``first_block``: its first block located for the writer (None
    when the file has none: the first call found no node for it). Otherwise the create
    did not get as far as the file (its tagged record was a lease recovery before it) or
    its file was changed since: without ``overwrite`` run again (it creates the file or
    fails, destroying nothing); with ``overwrite`` ``AnswerLost`` (a second run could replace
    a file someone else made)."""
    canonical = paths.join_parts(paths.split(path))
    found = _found(server, canonical)
    if found is None or not _held_by(found[1], client_name):
        if overwrite is False:
            return await rerun()
        raise _lost("create", canonical, f"{canonical} is no longer open for {client_name}")
    ino, inode = found
    status = server.ns.view.status(canonical, ino, inode)
    answer = _changed(server, canonical, status) if want_status else status
    if not first_block:
        return answer
    blocks = server.ns.view.blocks_of(ino)
    located = blocks and server.locator.located(blocks[0], server.blocks.get(blocks[0]["id"]), 0,
                                        server.access.token_user(ctx), WRITE_TOKEN)
    return {**(answer if want_status else {"status": status}), "first_block": located or None}


async def add_block(server, ctx, rerun, kept, path, client_name, ino=None, previous=None,
                    excluded=()):
    """Run again: ``check_previous`` sees that the file's last block follows ``previous``
    (a retry) and answers that block located, allocating nothing. Rebuilt without
    ``previous`` on a file with blocks: applied, such a call was the first after an append
    to a full last block, which a second run would refuse; the empty block it added is
    still the last one while its writer waits for this answer."""
    if previous is None:
        found = _found(server, paths.join_parts(paths.split(path)))
        if found is not None and _held_by(found[1], client_name):
            ino, inode = found
            last = server.ns.planner.added_after_full(server.ns.view.tail_blocks(ino, inode),
                                                      inode.block_size or 0)
            if last is not None:
                return server.locator.located(last, server.blocks.get(last["id"]),
                                              inode.length or 0, server.access.token_user(ctx),
                                              WRITE_TOKEN)
    return await rerun()


async def complete(server, ctx, rerun, kept, path, client_name, ino=None, last=None,
                   mtime_ns=None, atime_ns=None, permission=None, data=None):
    """Run again: a file already closed with ``last`` answers true at once
    (``closed_with``); one the first call only committed is completed now."""
    return await rerun()


async def delete(server, ctx, rerun, kept, path, recursive=False, expect=None,
                 want_status=False):
    """Rebuilt: true; with ``want_status`` the status the deleted inode had (kept in the
    record: it is gone with the inode) and its parent's now. ``AnswerLost`` when the record
    kept none (a second run would delete what is there now, or fail) or the parent is gone
    since."""
    canonical = paths.join_parts(paths.split(path))
    if not want_status:
        return True
    try:
        removed = _removed(kept, canonical)
        if removed is None:   # ``[]`` is a rename's; a delete always removed an inode
            raise _NotKept
        return _changed(server, canonical, removed)
    except _NotKept:
        raise _lost("delete", canonical, "its record did not keep the status the deleted "
                                         "inode had") from None
    except (FileNotFound, NotDirectory):
        raise _lost("delete", canonical, "its parent directory is gone since") from None


async def rename(server, ctx, rerun, kept, src, dst, overwrite=False, want_status=False):
    """Rebuilt: true; with ``want_status`` the moved inode at ``dst`` and both parents now,
    and ``replaced``: null when ``overwrite`` was off (nothing can have been replaced), else
    the replaced destination's status as the record kept it (null: it replaced nothing);
    ``AnswerLost`` when the record kept none or the moved inode is gone since."""
    s, d = paths.join_parts(paths.split(src)), paths.join_parts(paths.split(dst))
    if not want_status:
        return True
    try:
        replaced = _removed(kept, d) if overwrite is not False else None
        return {**_changed(server, d), "replaced": replaced,
                "src_parent": server.ns.view.get_file_info(paths.parent(s))}
    except _NotKept:
        raise _lost("rename", f"{s} to {d}", "its record did not keep the status of the "
                                             "replaced destination") from None
    except (FileNotFound, NotDirectory):
        raise _lost("rename", f"{s} to {d}", "the moved inode is gone since") from None


async def rename_many(server, ctx, rerun, kept, moves, overwrite=False):
    """Rebuilt: true (all the moves were one record)."""
    return True


async def create_symlink(server, ctx, rerun, kept, target, path, create_parent=False,
                         owner=None, group=None, want_status=False):
    """Rebuilt when a symlink to ``target`` is at ``path``: its status (``want_status``: and
    its parent's). Otherwise run again: it creates the link or fails, destroying nothing."""
    canonical = paths.join_parts(paths.split(path))
    found = _found(server, canonical)
    if found is None or found[1].type != SYMLINK or found[1].target != target:
        return await rerun()
    status = server.ns.view.status(canonical, *found)
    return _changed(server, canonical, status) if want_status else status


async def append(server, ctx, rerun, kept, path, client_name, patch=False):
    """Rebuilt when the file is open for ``client_name``: its status, its partial last block
    located for the writer (reopened under a new stamp; None when the last block was full
    or the file empty: the writer starts a new block), its inline data; opened for patches
    (``patch``): no last block, every block located for the writer. Otherwise run again:
    the append did not get past the lease recovery of another writer's file (or the
    caller's lease went since), and reopening changes no data."""
    canonical = paths.join_parts(paths.split(path))
    found = _found(server, canonical)
    if found is None or not _held_by(found[1], client_name):
        return await rerun()
    ino, inode = found
    if patch is True:
        return {"status": server.ns.view.status(canonical, ino, inode), "last_block": None,
                "blocks": server.locator.writer_blocks(ino, inode, server.access.token_user(ctx),
                                                       WRITE_TOKEN)}
    last_block = None
    tail = server.ns.view.tail_blocks(ino, inode, 1)
    if tail and tail[-1]["num_bytes"] < inode.block_size:
        block = {**tail[-1]}
        offset = (inode.length or 0) - block["num_bytes"]
        last_block = server.locator.located(block, server.blocks.get(block["id"]), offset,
                                    server.access.token_user(ctx), WRITE_TOKEN)
    answer = {"status": server.ns.view.status(canonical, ino, inode), "last_block": last_block}
    data = server.ns.view.inline_data(ino, inode)
    if data is not None:
        answer["inline"] = data
    return answer


async def truncate(server, ctx, rerun, kept, path, new_length, client_name):
    """Rebuilt: false while the file is open for ``client_name`` with its last block in
    recovery (the truncate cut inside a block), true once the file is closed at
    ``new_length`` (a cut on a block boundary, or that recovery has finished: the caller's
    wait is over). Otherwise ``AnswerLost``: a second run would cut again a file that may
    have grown since (or the call only recovered another writer's lease, then failed)."""
    canonical = paths.join_parts(paths.split(path))
    found = _found(server, canonical)
    if found is not None and found[1].type == FILE:
        ino, inode = found
        if not inode.uc and (inode.length or 0) == new_length:
            return True
        if _held_by(inode, client_name):
            tail = server.ns.view.tail_blocks(ino, inode, 1)
            if tail and server.recovery.block_state(tail[-1]) == bm.UNDER_RECOVERY:
                return False
    raise _lost("truncate", canonical, f"{canonical} is not as the truncate left it")


async def rewrite(server, ctx, rerun, kept, path, client_name, ino=None):
    """Rebuilt when the file is open for ``client_name``: its status (the rewrite emptied it
    and the caller waited for the answer before writing). Otherwise run again: the writer
    checks refuse it, changing nothing."""
    canonical = paths.validate(path)
    inode = None
    if ino:
        inode = server.ns.view.linked_inode(ino)
        current = server.ns.view.path_of(ino) if inode is not None else None
    else:
        found = _found(server, canonical)
        if found is not None:
            ino, inode = found
            current = canonical
    if not _held_by(inode, client_name):
        return await rerun()
    return server.ns.view.status(current, ino, inode)


async def recover_lease(server, ctx, rerun, kept, path, client_name):
    """Run again: recover_lease is idempotent (a closed file answers true, one whose
    recovery runs false, and the lease is the caller's already)."""
    return await rerun()


ANSWERS = {f.__name__: f for f in (mkdirs, create, add_block, complete, delete, rename,
                                   rename_many, create_symlink, append, truncate, rewrite,
                                   recover_lease)}


async def answer(server, ctx, method: str, args: dict, rerun, kept=None):
    """The rebuilt answer of ``method`` called with ``args`` (already bound against the
    handler's signature by the dispatcher), ``kept`` what its record kept."""
    rebuild = ANSWERS.get(method)
    if rebuild is None:
        raise InternalError(f"{method}: retry cached but without an answer rebuild "
                            f"(meta.retry_answers)")
    return await rebuild(server, ctx, rerun, kept, **args)
