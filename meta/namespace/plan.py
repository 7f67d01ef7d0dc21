"""The planners of every op but rename and reclaim: ``plan_<op>`` validates against the
current state (raising a ``LeaseFSError`` that names the path; nothing changes on error),
decides everything (new inode/block ids, generation stamps, times) and returns the one
journal record ``(op, args)`` — or None when there is nothing to do. Also the writer
(lease holder) checks that classify a client's block reports.

Why it exists: deciding is apart from applying (``meta.journal.ops``), so replay needs only
the records, and apart from the RPC shell, so the conformance suite drives it directly.
``NamespacePlanner`` is a part of ``meta.namespace.namespace.Namespace``: it reads through
the ``NamespaceView``, takes ids and stamps from the ``Allocators``, asks the
``QuotaPlanner`` to check quotas and ``ReclaimPlanner.needs_detach`` whether a removed
subtree must be detached.

Purity / concurrency contract: never writes the store; the only state a plan changes is
the in-memory allocation counters (ids and stamps), so an abandoned plan only leaves a
gap. Called under the caller's path locks, on the trio thread, no awaits.
"""

from __future__ import annotations

from fs import paths
from fs.errors import (FileExists, FileNotFound, InternalError, InvalidArgument, IsDirectory,
                       DirectoryNotEmpty, NotDirectory, StaleGenerationStamp)

from ..schema import keys
from ..blocks.blocks import COMMITTED, UNDER_CONSTRUCTION
from ..leases.leases import LeaseManager
from .args import (MAX_TARGET_BYTES, Defaults, check_block_ref, check_bool, check_int,
                   check_mode, check_name, is_int)
from .allocators import Allocators
from ..journal.charge import file_charge
from .quota import QuotaPlanner
from .reclaim import ReclaimPlanner
from .view import NamespaceView
from ..journal.ops import ABSENT
from ..journal.ops_blocks import (AbandonBlock, AddBlock, Append, Close, CommitBlockSync, Fsync,
                                  Inline, PatchBegin, PatchBlock, PatchDrop, ReassignLease,
                                  SetGenstamp, SetReplication, Truncate, UpdateBlocks)
from ..journal.ops_namespace import (Add, Delete, Format, Mkdir, SetOwner, SetPermissions,
                                     Symlink, Times)
from ..schema.inode import DIR, FILE, Inode

#: the set-group-id bit: on a folder, new entries take its group and new folders the bit
SETGID = 0o2000


def _full(block: dict | None, block_size: int) -> bool:
    """A finished block holding a whole ``block_size``: no writer continues it."""
    return (block is not None and block["state"] != UNDER_CONSTRUCTION
            and block["num_bytes"] >= block_size)


class NamespacePlanner:
    """``plan_<op>`` of the create/mkdir/delete/attribute/writer/lease ops, deciding from
    ``view``; ids and stamps come from ``ids``, quota checks from ``quota``, detach
    decisions from ``reclaim``."""

    def __init__(self, view: NamespaceView, defaults: Defaults, ids: Allocators,
                 quota: QuotaPlanner, reclaim: ReclaimPlanner):
        self._view = view
        self.defaults = defaults
        self._ids = ids
        self._quota = quota
        self._reclaim = reclaim

    # ------------------------------------------------------------------ plan helpers
    def _owner_group(self, owner, group, parent_inode: Inode) -> tuple[str, str]:
        """Owner and group of an entry made in ``parent_inode``: the group asked for, else
        the parent's (HDFS); in a setgid folder always the folder's (POSIX/BSD: the mount
        asks for the creator's group, as a kernel would give it outside such a folder)."""
        owner = check_name(owner, "owner", optional=True) or self.defaults.owner
        group = check_name(group, "group", optional=True)
        if group is None or parent_inode.mode & SETGID:
            group = parent_inode.group
        return owner, group

    def _missing_dirs(self, parts, found, upto: int, mode: int, owner: str,
                      group: str) -> list[dict]:
        """New directories for ``parts[len(found)-1 : upto]`` (ids allocated now); under a
        setgid folder each keeps the bit (POSIX), so its own entries get the group too."""
        dirs = []
        parent = found[-1][0]
        mode |= (found[-1][1].mode or 0) & SETGID
        for name in parts[len(found) - 1:upto]:
            ino = self._ids.allocate_ino()
            dirs.append({"parent": parent, "name": name, "ino": ino, "mode": mode,
                         "owner": owner, "group": group})
            parent = ino
        return dirs

    @staticmethod
    def check_parent_dir(path: str, found) -> None:
        ino, inode = found[-1]
        if inode.type != DIR:
            raise NotDirectory(f"{path}: parent is not a directory")

    # ------------------------------------------------------------------ planners
    def plan_format(self, namespace_id: int, now_ns: int) -> Format:
        if self._view.formatted:
            raise InternalError("the namespace is already formatted")
        return Format(namespace_id=namespace_id, time=now_ns, mode=0o755,
                      owner=self.defaults.owner, group=self.defaults.group)

    def plan_mkdirs(self, path, permission=0o755, owner=None, group=None, *,
                    create_parent: bool = True, exclusive: bool = False,
                    now_ns: int, chosen_ino: int | None = None) -> Mkdir | None:
        """``create_parent=False``: a missing parent is ``FileNotFound``; ``exclusive``: an
        existing path is ``FileExists`` even when it is a directory (mkdir(2)).
        ``chosen_ino``: the last directory's inode id, chosen by the caller (a directory
        lease holder's mkdir, as ``plan_create``'s); refused when that id is in use."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        permission = check_mode(permission, f"mkdirs {canonical}: permission")
        found = self._view.walk(parts, canonical)
        if len(found) == len(parts) + 1:
            if found[-1][1].type == DIR and not exclusive:
                return None
            raise FileExists(f"mkdirs {canonical}: exists"
                             + ("" if found[-1][1].type == DIR else " and is not a directory"))
        if len(found) < len(parts) and not create_parent:
            raise FileNotFound(f"mkdir {canonical}: parent {paths.join_parts(parts[:-1])} "
                               f"does not exist")
        self.check_parent_dir(canonical, found)
        owner, group = self._owner_group(owner, group, found[-1][1])
        if chosen_ino is not None:
            if len(found) != len(parts):
                raise InvalidArgument(f"mkdirs {canonical}: a chosen inode id makes one "
                                      f"directory, in an existing parent")
            chosen = check_int(chosen_ino, f"mkdirs {canonical}: inode", low=1)
            if self._view.get_inode(chosen) is not None:
                raise InvalidArgument(f"cannot make {canonical} as inode {chosen}: an inode "
                                      f"with that id exists")
            dirs = [{"parent": found[-1][0], "name": parts[-1], "ino": chosen,
                     "mode": permission | (found[-1][1].mode or 0) & SETGID,
                     "owner": owner, "group": group}]
        else:
            dirs = self._missing_dirs(parts, found, len(parts), permission, owner, group)
        for d in dirs[:-1]:
            d["mode"] |= 0o300   # parents stay writable and searchable by the owner
        self._quota.check_quota(found[-1][0], len(dirs), 0)
        return Mkdir(dirs=dirs, time=now_ns)

    def plan_create(self, path, *, holder, client_machine: str = "", overwrite=False,
                    create_parent=True, replication=None, block_size=None, permission=0o644,
                    owner=None, group=None, now_ns: int,
                    chosen_ino: int | None = None) -> Add:
        """``chosen_ino``: the new file's inode id, chosen by the caller instead of allocated (a
        directory lease holder's create, under an id its grant reserved: the caller checked
        that); refused when an inode with that id exists."""
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        holder = check_name(holder, f"create {canonical}: client_name")
        check_bool(overwrite, f"create {canonical}: overwrite")
        check_bool(create_parent, f"create {canonical}: create_parent")
        permission = check_mode(permission, f"create {canonical}: permission")
        replication = self.check_replication(canonical, replication)
        block_size = self.check_block_size(canonical, block_size)
        if not parts:
            raise IsDirectory("cannot create /: it is a directory")
        found = self._view.walk(parts, canonical)
        overwrite_ino = None
        detach = False
        dirs: list[dict] = []
        if len(found) == len(parts) + 1:
            ino, inode = found[-1]
            if inode.type == DIR:
                raise IsDirectory(f"cannot create {canonical}: it is a directory")
            if not overwrite:
                uc = inode.uc
                if uc:
                    LeaseManager.check_create_conflict(canonical, uc.holder, holder)
                raise FileExists(f"cannot create {canonical}: file exists")
            overwrite_ino = ino
            detach = self._reclaim.needs_detach(ino, inode)
            parent_ino, parent_inode = found[-2]
        else:
            if len(found) < len(parts):
                if not create_parent:
                    raise FileNotFound(f"cannot create {canonical}: parent "
                                       f"{paths.join_parts(parts[:-1])} does not exist")
            self.check_parent_dir(canonical, found)
            parent_ino, parent_inode = found[-1]
        owner, group = self._owner_group(owner, group, parent_inode)
        self._quota.check_quota(parent_ino, 1 + max(0, len(parts) - len(found))
                                - (overwrite_ino is not None), 0)
        usage = None if overwrite_ino is None else \
            self._quota.detached_usage(parent_ino, overwrite_ino, found[-1][1], detach)
        if len(found) < len(parts):
            dirs = self._missing_dirs(parts, found, len(parts) - 1, 0o755, owner, group)
            parent_ino = dirs[-1]["ino"]
        if chosen_ino is None:
            new_ino = self._ids.allocate_ino()
        else:
            new_ino = check_int(chosen_ino, f"create {canonical}: inode", low=1)
            if self._view.get_inode(new_ino) is not None:
                raise InvalidArgument(f"cannot create {canonical} as inode {new_ino}: an "
                                      f"inode with that id exists")
        return Add(
            dirs=dirs, parent=parent_ino, name=parts[-1], ino=new_ino,
            mode=permission, owner=owner, group=group, time=now_ns,
            replication=replication, block_size=block_size, holder=holder,
            client_machine=str(client_machine)[:256], overwrite=overwrite_ino,
            detach=detach, usage=usage,
        )

    def check_replication(self, path: str, replication) -> int:
        if replication is None:
            return self.defaults.replication
        return check_int(replication, f"{path}: replication", low=1,
                         high=self.defaults.max_replication)

    def check_block_size(self, path: str, block_size) -> int:
        if block_size is None:
            block_size = self.defaults.block_size
        check_int(block_size, f"{path}: block_size", low=self.defaults.bytes_per_checksum)
        if block_size < self.defaults.min_block_size:
            raise InvalidArgument(f"{path}: block_size {block_size} is below the limit "
                                  f"min_block_size {self.defaults.min_block_size}")
        if block_size % self.defaults.bytes_per_checksum:
            raise InvalidArgument(f"{path}: block_size {block_size} is not a multiple of "
                                  f"bytes_per_checksum {self.defaults.bytes_per_checksum}")
        return block_size

    def plan_symlink(self, target, path, *, create_parent=False, owner=None, group=None,
                     now_ns: int) -> Symlink:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(create_parent, f"symlink {canonical}: create_parent")
        if not isinstance(target, str) or not target or "\0" in target:
            raise InvalidArgument(f"symlink {canonical}: target must be a non-empty string "
                                  f"without NUL, got {target!r:.80}")
        if len(keys.encode_name(target)) > MAX_TARGET_BYTES:
            raise InvalidArgument(f"symlink {canonical}: target longer than "
                                  f"{MAX_TARGET_BYTES} bytes")
        if not parts:
            raise FileExists("cannot create a symlink at /: it exists")
        found = self._view.walk(parts, canonical)
        if len(found) == len(parts) + 1:
            raise FileExists(f"cannot create symlink {canonical}: it exists")
        if len(found) < len(parts) and not create_parent:
            raise FileNotFound(f"cannot create symlink {canonical}: parent "
                               f"{paths.join_parts(parts[:-1])} does not exist")
        self.check_parent_dir(canonical, found)
        owner, group = self._owner_group(owner, group, found[-1][1])
        dirs = self._missing_dirs(parts, found, len(parts) - 1, 0o755, owner, group)
        self._quota.check_quota(found[-1][0], len(dirs) + 1, 0)
        parent_ino = dirs[-1]["ino"] if dirs else found[-1][0]
        return Symlink(dirs=dirs, parent=parent_ino, name=parts[-1], ino=self._ids.allocate_ino(),
                       target=target, mode=0o777, owner=owner, group=group, time=now_ns)

    def plan_delete(self, path, recursive=False, *, now_ns: int) -> Delete:
        parts = paths.split(path)
        canonical = paths.join_parts(parts)
        check_bool(recursive, f"delete {canonical}: recursive")
        if not parts:
            raise InvalidArgument("cannot delete the root directory /")
        _, ino, inode, found = self._view.resolve(canonical)
        if inode.type == DIR and (inode.children or 0) and not recursive:
            raise DirectoryNotEmpty(f"cannot delete {canonical}: directory is not empty "
                                    f"({inode.children} entries); use recursive")
        detach = self._reclaim.needs_detach(ino, inode)
        return Delete(parent=found[-2][0], name=parts[-1], ino=ino, time=now_ns, detach=detach,
                      usage=self._quota.detached_usage(found[-2][0], ino, inode, detach))

    def plan_set_permission(self, path, permission, *, now_ns: int) -> SetPermissions:
        parts, ino, inode, _ = self._view.resolve(path)
        canonical = paths.join_parts(parts)
        permission = check_mode(permission, f"chmod {canonical}: permission")
        return SetPermissions(ino=ino, mode=permission, time=now_ns)

    def plan_set_owner(self, path, owner=None, group=None, *, now_ns: int) -> SetOwner | None:
        parts, ino, inode, _ = self._view.resolve(path)
        canonical = paths.join_parts(parts)
        owner = check_name(owner, f"chown {canonical}: owner", optional=True)
        group = check_name(group, f"chown {canonical}: group", optional=True)
        if owner is None and group is None:
            return None
        return SetOwner(ino=ino, owner=owner, group=group, time=now_ns)

    def plan_set_times(self, path, mtime_ns=None, atime_ns=None, *,
                       now_ns: int) -> Times | None:
        parts, ino, inode, _ = self._view.resolve(path)
        canonical = paths.join_parts(parts)
        if mtime_ns is not None:
            check_int(mtime_ns, f"set_times {canonical}: mtime_ns")
        if atime_ns is not None:
            check_int(atime_ns, f"set_times {canonical}: atime_ns")
        if mtime_ns is None and atime_ns is None:
            return None
        return Times(ino=ino, mtime=mtime_ns, atime=atime_ns, time=now_ns)

    def plan_set_replication(self, path, replication, *, now_ns: int) -> SetReplication | None:
        parts, ino, inode, _ = self._view.resolve(path)
        canonical = paths.join_parts(parts)
        if inode.type != FILE:
            raise IsDirectory(f"setrep {canonical}: not a file") if inode.type == DIR \
                else InvalidArgument(f"setrep {canonical}: not a file")
        replication = check_int(replication, f"setrep {canonical}: replication", low=1,
                                high=self.defaults.max_replication)
        if replication == inode.replication:
            return None
        old = (inode.replication or 1)
        self._quota.check_quota(inode.parent, 0, file_charge(self._view.read, ino, inode)
                                // old * (replication - old))
        return SetReplication(ino=ino, replication=replication, time=now_ns)

    # -------------------------------------------------------- writer (lease holder) ops
    def writer_file(self, path, ino, holder) -> tuple[str, int, dict]:
        """The open file a writer addresses (by inode id when given, else path), after the
        HDFS writer checks. Returns ``(canonical path, ino, inode)``."""
        canonical = paths.validate(path)
        holder = check_name(holder, f"{canonical}: client_name")
        if ino is not None and ino != 0:
            check_int(ino, f"{canonical}: ino", low=1)
            inode = self._view.linked_inode(ino)
        else:
            try:
                _, ino, inode, _ = self._view.resolve(canonical)
            except FileNotFound:
                inode = None
        exists = inode is not None and inode.type == FILE
        uc = inode.uc if exists else None
        LeaseManager.check_writer(canonical, exists, uc.holder if uc else None, holder)
        return canonical, ino, inode

    def check_previous(self, path: str, blocks: list[dict], previous,
                       block_size: int) -> tuple[str, dict | None]:
        """Classify add_block's ``previous`` against the file's blocks:

        * ``("retry", last)``   the last call's reply was lost: hand out the same last block
        * ``("first", None)``   the first block of an empty file
        * ``("commit", last)``  ``previous`` is the last block, to be committed now
        * ``("committed", last)`` already committed with that length (a retried add_block),
          or no ``previous`` after an append to a file whose last block is full: append
          answered no block to go on with, so Hadoop's writer names none (HDFS allows it).
          A second run finds the new block last and refuses, as HDFS does, so no stale
          call adds a block; a retry is answered by the retry cache (``added_after_full``
          after a restart)
        """
        last = blocks[-1] if blocks else None
        if previous is not None:
            check_block_ref(previous, f"add_block {path}: previous")
        nblocks = last["index"] + 1 if last is not None else 0
        if last is not None and last["state"] == UNDER_CONSTRUCTION:
            penultimate = blocks[-2] if len(blocks) >= 2 else None
            if (previous is None and nblocks == 1) or (
                    previous is not None and penultimate is not None
                    and previous["id"] == penultimate["id"]):
                return "retry", last
        if previous is None:
            if _full(last, block_size):
                return "committed", last
            if blocks:
                raise InvalidArgument(f"add_block {path}: previous is missing but the file "
                                      f"already has {nblocks} block(s)")
            return "first", None
        if last is None or previous["id"] != last["id"]:
            raise InvalidArgument(f"add_block {path}: previous block {previous['id']} is not "
                                  f"the file's last block "
                                  f"({last['id'] if last else 'the file has none'})")
        kind = self._commit_kind(path, last, previous)
        if kind == "committed" and last["num_bytes"] < block_size:
            # a finished partial block (a file opened for patches whose writer has not grown
            # it to full size yet): a block after it would leave a hole in the offsets
            raise InvalidArgument(f"add_block {path}: the last block {last['id']} holds "
                                  f"{last['num_bytes']} of {block_size} bytes; only a full "
                                  f"block may be followed by another")
        return kind, last

    @staticmethod
    def added_after_full(blocks: list[dict], block_size: int) -> dict | None:
        """The block an add_block without ``previous`` added after a full last block (the
        append case of ``check_previous``), while it is still the file's last, empty block;
        else None."""
        if (len(blocks) >= 2 and blocks[-1]["state"] == UNDER_CONSTRUCTION
                and blocks[-1]["num_bytes"] == 0 and _full(blocks[-2], block_size)):
            return blocks[-1]
        return None

    def _commit_kind(self, path: str, last: dict, reported: dict) -> str:
        if reported.get("gs") is not None and reported["gs"] != last["gs"]:
            raise StaleGenerationStamp(f"{path}: block {last['id']} has generation stamp "
                                       f"{last['gs']}, the client reported {reported['gs']}")
        if last["state"] == UNDER_CONSTRUCTION:
            return "commit"
        if last["num_bytes"] != reported["num_bytes"]:
            raise InvalidArgument(f"{path}: block {last['id']} was committed with "
                                  f"{last['num_bytes']} bytes, now reported as "
                                  f"{reported['num_bytes']}")
        return "committed"

    def check_block_length(self, path: str, inode: Inode, num_bytes: int) -> None:
        if num_bytes > inode.block_size:
            raise InvalidArgument(f"{path}: block length {num_bytes} exceeds the file's block "
                                  f"size {inode.block_size}")

    def check_writer_length(self, path: str, inode: Inode, num_bytes: int) -> None:
        """A length the writer reports for its block: within the block size, and for a
        reopened inline file's first block at least the inline bytes, which it sends first."""
        self.check_block_length(path, inode, num_bytes)
        if num_bytes < (inode.inline or 0):
            raise InvalidArgument(f"{path}: block length {num_bytes} is short of the file's "
                                  f"{inode.inline} inline bytes, which its first block "
                                  f"must hold")

    def check_block_count(self, path: str, inode: Inode) -> None:
        """HDFS ``dfs.namenode.fs-limits.max-blocks-per-file``: refuse one block more."""
        limit = self.defaults.max_blocks_per_file
        if (inode.nblocks or 0) >= limit:
            raise InvalidArgument(f"add_block {path}: the file already has "
                                  f"{(inode.nblocks or 0)} blocks, the limit "
                                  f"max_blocks_per_file is {limit}")

    def plan_add_block(self, ino: int, blocks: list[dict], block_id: int, gs: int,
                       commit: dict | None, targets: list[str], now_ns: int) -> AddBlock:
        """``blocks``: the file's blocks or at least its last one (``tail_blocks``).
        ``previous`` names the last block even when it was committed by an earlier call,
        so the apply marks the block before it COMPLETE (only the last two blocks may be
        incomplete: writer checks read just those)."""
        inode = self._view.get_inode(ino)
        if inode is not None:   # (None: the first block of a file created in this batch)
            # HDFS reserves a whole block for the block being written
            self._quota.check_quota(inode.parent, 0,
                                    (inode.block_size or 0) * (inode.replication or 1))
        previous = None
        if blocks:
            last = blocks[-1]
            previous = {"index": last["index"], "id": last["id"],
                        "num_bytes": commit["num_bytes"] if commit else last["num_bytes"]}
        index = blocks[-1]["index"] + 1 if blocks else 0
        return AddBlock(ino=ino, index=index, block={"id": block_id, "gs": gs},
                        previous=previous, targets=list(targets), time=now_ns)

    def plan_commit(self, ino: int, block: dict, num_bytes: int) -> UpdateBlocks:
        return UpdateBlocks(ino=ino, blocks=[{
            "index": block["index"], "id": block["id"], "gs": block["gs"],
            "num_bytes": num_bytes, "state": COMMITTED}])

    def check_last(self, path: str, blocks: list[dict], last) -> tuple[str, dict | None]:
        """complete's ``last`` against the file: ``("none"|"commit"|"committed", block)``."""
        if last is None:
            if blocks:
                raise InvalidArgument(f"complete {path}: last block is missing but the file "
                                      f"has {blocks[-1]['index'] + 1} block(s)")
            return "none", None
        check_block_ref(last, f"complete {path}: last")
        if not blocks or blocks[-1]["id"] != last["id"]:
            raise InvalidArgument(f"complete {path}: block {last['id']} is not the file's "
                                  f"last block ({blocks[-1]['id'] if blocks else 'none'})")
        return self._commit_kind(path, blocks[-1], last), blocks[-1]

    def closed_with(self, path, ino, last, data=None) -> bool:
        """A complete() retried after the file was already closed with this last block: the
        same id, length and generation stamp (HDFS-3031). A block recovery after another
        client took the file over gives the last block a new stamp, so a late complete of
        the old writer does not match and gets the lease error instead. With inline
        ``data``: the file holds exactly those bytes inline (a recovery that closed it
        without them does not match)."""
        canonical = paths.validate(path)
        if ino:
            inode = self._view.linked_inode(ino) if is_int(ino) else None
        else:
            try:
                _, ino, inode, _ = self._view.resolve(canonical)
            except FileNotFound:
                return False
        if inode is None or inode.type != FILE or inode.uc:
            return False
        if data is not None:
            return inode.inline == len(data) and self._view.inline_data(ino, inode) == data
        blocks = self._view.tail_blocks(ino, inode, 1)
        if last is None:
            return not blocks
        return (isinstance(last, dict) and bool(blocks) and blocks[-1]["id"] == last.get("id")
                and blocks[-1]["num_bytes"] == last.get("num_bytes")
                and blocks[-1]["gs"] == last.get("gs"))

    def plan_close(self, ino: int, block: dict | None, num_bytes: int | None,
                   now_ns: int, attrs: dict | None = None,
                   data: bytes | None = None) -> Close:
        """``attrs``: ``{"mtime": ns, "atime": ns, "mode": bits}`` (any may be None) the writer
        set while it wrote, taken instead of the completion's own time and the file's mode
        (checked by ``close_attrs``). ``data``: the file's whole content, kept inline
        (checked by ``check_inline``; the file's unused blocks go with the same record)."""
        last = None
        if block is not None:
            last = {"index": block["index"], "id": block["id"], "num_bytes": num_bytes}
        extra = {} if data is None else {"data": bytes(data)}
        return Close(ino=ino, last=last, time=now_ns, **(attrs or {}), **extra)

    def check_inline(self, path: str, ino: int, inode: Inode, data,
                     op: str = "complete") -> None:
        """``complete(data=...)``/``fsync(data=...)``: the bytes fit ``inline_max`` and the
        file's block size, and no byte of the file is in a block: it has none, or only the
        block ``create`` allocated with it, still empty (it goes with the record)."""
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgument(f"{op} {path}: data must be bytes, got "
                                  f"{type(data).__name__}")
        self._check_inline_size(path, op, inode.block_size, data)
        # a file created while its first block was refused holds no space yet
        self._quota.check_quota(inode.parent, 0, len(data) * (inode.replication or 1)
                                - file_charge(self._view.read, ino, inode))
        blocks = self._view.tail_blocks(ino, inode)
        if len(blocks) > 1 or any(b["index"] != 0 or b["num_bytes"] or
                                  b["state"] != UNDER_CONSTRUCTION for b in blocks):
            raise InvalidArgument(f"{op} {path}: inline data for a file whose bytes are "
                                  f"in blocks already; {op} its last block instead")

    def check_new_inline(self, path: str, parent_ino: int, replication: int,
                         block_size: int, data: bytes) -> None:
        """The whole content of a file created with it (a batched create and close): it
        fits ``inline_max`` and the block size, and the folder's space quota."""
        self._check_inline_size(path, "complete", block_size, data)
        self._quota.check_quota(parent_ino, 0, len(data) * (replication or 1))

    def _check_inline_size(self, path: str, op: str, block_size: int, data) -> None:
        limit = min(self.defaults.inline_max, block_size)
        if not 0 < len(data) <= limit:
            raise InvalidArgument(f"{op} {path}: {len(data)} bytes of inline data; this "
                                  f"server keeps 1 to {limit} bytes inline (inline_max)")

    @staticmethod
    def plan_inline(ino: int, data: bytes) -> Inline:
        """A writer's flush of a file wholly in its buffer: ``data`` becomes the content of
        the still open file, durable and visible to readers (``fsync(data=...)``)."""
        return Inline(ino=ino, data=bytes(data))

    @staticmethod
    def close_attrs(path: str, mtime_ns, atime_ns, permission) -> dict | None:
        """The times and mode a ``complete`` asks for, validated, as CLOSE record fields."""
        if mtime_ns is None and atime_ns is None and permission is None:
            return None
        for name, value in (("mtime_ns", mtime_ns), ("atime_ns", atime_ns)):
            if value is not None:
                check_int(value, f"complete {path}: {name}")
        mode = None if permission is None else check_mode(permission,
                                                          f"complete {path}: permission")
        return {"mtime": mtime_ns, "atime": atime_ns, "mode": mode}

    def plan_abandon(self, path: str, ino: int, blocks: list[dict], block) -> AbandonBlock | None:
        check_block_ref(block, f"abandon_block {path}: block")
        match = [b for b in blocks if b["id"] == block["id"]]
        if not match:
            return None   # already abandoned (a retry)
        if match[0] is not blocks[-1] or match[0]["state"] != UNDER_CONSTRUCTION:
            raise InvalidArgument(f"abandon_block {path}: block {block['id']} is not the "
                                  f"file's last block under construction")
        return AbandonBlock(ino=ino, index=match[0]["index"], id=block["id"])

    def plan_fsync(self, path: str, ino: int, blocks: list[dict],
                   last_block_length) -> Fsync | None:
        check_int(last_block_length, f"fsync {path}: last_block_length", low=0)
        if not blocks or blocks[-1]["state"] != UNDER_CONSTRUCTION:
            return None
        last = blocks[-1]
        if last_block_length <= last["num_bytes"]:
            return None
        return Fsync(ino=ino, index=last["index"], id=last["id"], num_bytes=last_block_length)

    def plan_set_genstamp(self) -> SetGenstamp:
        return SetGenstamp(gs=self._ids.next_genstamp())

    # ------------------------------------------------------------------ patches
    def plan_patch_begin(self, ino: int, block: dict) -> PatchBegin:
        """A new stamp for a patch of ``block`` (a COMPLETE block of the open file ``ino``),
        pending on it until PATCH_BLOCK or PATCH_DROP."""
        return PatchBegin(ino=ino, index=block["index"], id=block["id"],
                          gs=self._ids.next_genstamp())

    def plan_patch_block(self, path: str, ino: int, inode: Inode, block: dict, gs: int,
                         num_bytes: int, nodes: list[str], *, last: bool,
                         now_ns: int, check_quota: bool = True) -> PatchBlock:
        """Commit the patch at stamp ``gs`` of ``block``: its new length ``num_bytes`` never
        shrinks, stays within the block size, and only the file's ``last`` block may grow
        (every other block is full); growth counts against space quotas as a write's
        bytes do (not when lease recovery commits bytes the replicas already hold:
        ``check_quota`` False, as HDFS's commitBlockSynchronization)."""
        if num_bytes < block["num_bytes"]:
            raise InvalidArgument(f"{path}: block {block['id']} may not shrink from "
                                  f"{block['num_bytes']} to {num_bytes} bytes by a patch")
        self.check_block_length(path, inode, num_bytes)
        if num_bytes != block["num_bytes"] and not last:
            raise InvalidArgument(f"{path}: block {block['id']} (#{block['index']}) is not the "
                                  f"file's last block: a patch may not change its length "
                                  f"{block['num_bytes']}")
        grown = num_bytes - block["num_bytes"]
        if grown and check_quota:
            self._quota.check_quota(inode.parent, 0, grown * (inode.replication or 1))
        return PatchBlock(ino=ino, index=block["index"], id=block["id"], gs=gs,
                          num_bytes=num_bytes, nodes=list(nodes), time=now_ns)

    @staticmethod
    def plan_patch_drop(ino: int, block: dict, gs: int) -> PatchDrop:
        """Forget the pending patch stamp ``gs`` of ``block`` (lease recovery found no
        replica of it)."""
        return PatchDrop(ino=ino, index=block["index"], id=block["id"], gs=gs)

    # ------------------------------------------------------------------ leases
    def plan_reassign_lease(self, ino: int, holder: str) -> ReassignLease:
        """Lease recovery hands an open file to ``holder`` (HDFS REASSIGN_LEASE)."""
        return ReassignLease(ino=ino, holder=holder)

    def plan_commit_block_sync(self, ino: int, block: dict, gs: int, num_bytes: int, *,
                               delete: bool, close: bool, now_ns: int,
                               targets: list[str] = ABSENT) -> CommitBlockSync:
        """Block recovery finished: the last block gets the recovery id and the agreed
        length (or goes, when every replica was empty); ``close`` closes the file;
        ``targets``: the block servers that finalized it."""
        return CommitBlockSync(ino=ino, index=block["index"], id=block["id"], gs=gs,
                               num_bytes=num_bytes, delete=delete, close=close, time=now_ns,
                               targets=targets)

    def plan_truncate(self, path: str, ino: int, inode: Inode, new_length, *, holder: str,
                      client_machine: str = "", now_ns: int) -> Truncate | None:
        """Truncate a closed file. Blocks wholly past ``new_length`` go; when the new end
        falls inside a block, that block is kept (for block recovery to cut) and the file
        becomes under construction for ``holder``: ``last`` says which block and its new
        length. None when the length does not change."""
        check_int(new_length, f"truncate {path}: new_length", low=0)
        length = (inode.length or 0)
        if new_length > length:
            raise InvalidArgument(f"truncate {path}: new length {new_length} is beyond the "
                                  f"end of the file ({length} bytes); truncate cannot grow")
        if new_length == length:
            return None
        keep = 0
        pos = 0
        last = None
        for block in self._view.blocks_of(ino):
            if pos >= new_length:
                break
            keep = block["index"] + 1
            end = pos + block["num_bytes"]
            if end > new_length:
                last = {"index": block["index"], "id": block["id"], "gs": block["gs"],
                        "num_bytes": new_length - pos, "old_num_bytes": block["num_bytes"]}
            pos = end
        if last is not None:   # the cut block is written again: it counts whole meanwhile
            self._quota.check_quota(inode.parent, 0, (new_length - last["num_bytes"]
                                                         + inode.block_size)
                                    * (inode.replication or 1)
                                    - file_charge(self._view.read, ino, inode))
        return Truncate(ino=ino, new_length=new_length, keep=keep, last=last,
                        holder=holder if last else None,
                        client_machine=str(client_machine)[:256], time=now_ns)

    def plan_rewrite(self, ino: int, inode: Inode, *, now_ns: int) -> Truncate:
        """Start a file its holder is writing over, empty: every block (and inline content)
        goes, the file stays under construction for the same holder. A TRUNCATE record to
        0 without a ``last`` block, which leaves the lease alone."""
        return Truncate(ino=ino, new_length=0, keep=0, last=None, holder=None,
                        client_machine="", time=now_ns)

    def plan_append(self, ino: int, inode: Inode, *, holder: str, client_machine: str = "",
                    new_gs: int | None, now_ns: int) -> Append:
        """Reopen a closed file for ``holder``; a partial last block is reopened under the
        new generation stamp ``new_gs`` (None: the client starts a new block)."""
        last = None
        tail = self._view.tail_blocks(ino, inode, 1)
        if tail and new_gs is not None and tail[-1]["num_bytes"] < inode.block_size:
            b = tail[-1]
            last = {"index": b["index"], "id": b["id"], "gs": new_gs, "old_gs": b["gs"],
                    "num_bytes": b["num_bytes"]}
            # the reopened block counts at its full size while it is written again
            self._quota.check_quota(inode.parent, 0, (inode.block_size - b["num_bytes"])
                                    * (inode.replication or 1))
        return Append(ino=ino, holder=holder, client_machine=str(client_machine)[:256],
                      last=last, time=now_ns)
