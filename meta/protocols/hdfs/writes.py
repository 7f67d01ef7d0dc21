"""HDFS ``ClientProtocol``'s namespace-changing and writing calls (mkdirs, delete, both
renames, the set* calls, create, addBlock, complete, the lease and pipeline calls, append,
truncate, concat, ...) translated to the leasefs calls the msgpack protocol makes.

What it is: a front end with no state. Each method takes the request message Hadoop's client
sent and answers the response message, through ``call`` (``MetaServer.dispatch``): the HA
role, the retry cache (the IPC server's ``ctx`` carries HDFS's clientId and callId),
permissions and safe mode apply exactly as to a msgpack client. Errors are leasefs's
(``fs.errors``), raised as the msgpack handlers raise them; the IPC server names them as
Java's exception classes. Where HDFS's NameNode answers a result instead of an exception,
this translates as it does (docs/PROTOCOL.md, "HDFS ClientProtocol: mutations"):

* old ``rename``: a destination that is a directory means "into it"; a missing source, a
  missing destination parent, an existing destination, a move into itself or of the root
  answer false; a source equal to the destination answers true.
* ``rename2``: exceptions, OVERWRITE; a source equal to the destination is
  FileAlreadyExists.
* ``delete``: a missing path and the root answer false.
* ``setReplication``: a missing path or a directory answers false.
* ``create``: without CREATE a missing path is FileNotFound; APPEND is the client's own
  (it calls append for an existing file), so the NameNode ignores it, as HDFS's does.
* ``fileId`` is leasefs's inode number (0: go by the path).
* ``append`` of a file kept inline in the namespace: its bytes first become its first
  block, which the answer names as the partly full last block (``inline_append``).

Concurrency contract: runs on the metadata server's trio thread, each call its own task; it
holds nothing between awaits but ``inline_append``'s per-file lock (a call made of two
leasefs calls, e.g. the old rename's look at its destination, sees whatever happened
between them, as a msgpack client would).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fs import paths
from fs.errors import (DirectoryNotEmpty, FileExists, FileNotFound, InvalidArgument,
                       IsDirectory, NotSupported)
from fs.hdfs import convert
from fs.hdfs.pb import hdfs_pb2 as hpb
from fs.hdfs.pb import namenode_writes_pb2 as pb
from fs.rpcbase import CallContext

from .inline_append import InlineToBlock

Call = Callable[[CallContext, str, dict], Awaitable[object]]

_UNSET = convert.UNSIGNED_MINUS_ONE   # "leave as it is" / reset
_QUOTA_DONT_SET = (1 << 63) - 1   # HdfsConstants.QUOTA_DONT_SET
_OPEN_FILES_PAGE = 1000           # dfs.namenode.list.openfiles.num.responses


def _ino(file_id: int) -> int | None:
    return file_id or None


def _block(proto: hpb.ExtendedBlockProto) -> dict:
    return {"id": proto.blockId, "gs": proto.generationStamp, "num_bytes": proto.numBytes}


def _node_ids(nodes) -> list[str]:
    """leasefs node ids of HDFS ``DatanodeInfoProto``s (their ``datanodeUuid``)."""
    return [n.id.datanodeUuid for n in nodes]


def _canonical(path: str) -> str:
    return paths.join_parts(paths.split(path))


def _quota(value: int) -> int | None:
    """An HDFS quota field as ``set_quota`` takes it: None leaves it, -1 clears it."""
    if value == _QUOTA_DONT_SET:
        return None
    return -1 if value == _UNSET else value


async def _on_file(what: str, path: str, coro):
    """HDFS's ``INodeFile.valueOf``: a call meant for a file meets a directory as
    FileNotFound ("is not a file"), where leasefs says IsDirectory."""
    try:
        return await coro
    except IsDirectory:
        raise FileNotFound(f"{what} {path}: path is not a file") from None


class NamenodeWrites:
    """The mutating calls of ``ClientProtocol``. ``call``: ``MetaServer.dispatch``;
    ``pool_id``: the namespace's block pool id (``convert.pool_id`` of its namespace id),
    asked at each answer that names a block (a new namespace gets its id at format);
    ``inline_to_block``: what makes an inline file's bytes its first block for append."""

    PROTOCOL = "org.apache.hadoop.hdfs.protocol.ClientProtocol"
    CALLS: dict[str, tuple[type, type]] = {
        name: (getattr(pb, f"{name[0].upper()}{name[1:]}RequestProto"),
               getattr(pb, f"{name[0].upper()}{name[1:]}ResponseProto"))
        for name in ("mkdirs", "delete", "rename", "rename2", "setPermission", "setOwner",
                     "setTimes", "setReplication", "renewLease", "recoverLease",
                     "isFileClosed", "create", "addBlock", "complete", "abandonBlock",
                     "fsync", "getAdditionalDatanode", "updateBlockForPipeline",
                     "updatePipeline", "append", "truncate", "concat", "createSymlink",
                     "setQuota", "listOpenFiles", "reportBadBlocks")}

    def __init__(self, call: Call, pool_id: Callable[[], str], inline_to_block: InlineToBlock):
        self.call = call
        self.pool_id = pool_id
        self.inline_to_block = inline_to_block

    # ------------------------------------------------------------------ namespace
    async def mkdirs(self, ctx, request):
        """An existing directory is true (leasefs's mkdirs); an existing file
        FileAlreadyExists, a missing parent without createParent FileNotFound."""
        result = await self.call(ctx, "mkdirs", {
            "path": request.src, "permission": request.masked.perm & 0o7777,
            "create_parent": request.createParent})
        return pb.MkdirsResponseProto(result=bool(result))

    async def delete(self, ctx, request):
        """A missing path and the root answer false (HDFS ``deleteAllowed``); a non-empty
        root without ``recursive`` is still refused as non-empty."""
        if _canonical(request.src) == "/":
            root = await self.call(ctx, "get_file_info", {"path": "/"})
            if root["children"] and not request.recursive:
                raise DirectoryNotEmpty("cannot delete /: directory is not empty; use "
                                        "recursive")
            return pb.DeleteResponseProto(result=False)
        try:
            await self.call(ctx, "delete", {"path": request.src,
                                            "recursive": request.recursive})
        except FileNotFound:
            return pb.DeleteResponseProto(result=False)
        return pb.DeleteResponseProto(result=True)

    async def rename(self, ctx, request):
        """The old boolean rename (``FileSystem.rename``, FileOutputCommitter): into a
        destination directory; false where HDFS's ``unprotectedRenameTo`` says false."""
        dst = request.dst
        try:
            target = await self.call(ctx, "get_file_info", {"path": dst})
        except FileNotFound:
            target = None
        if target is not None and target["type"] == "dir":
            src_parts = paths.split(request.src)
            if src_parts:   # the root's own rename answers false below
                dst = paths.join_parts(paths.split(dst) + src_parts[-1:])
        try:
            await self.call(ctx, "rename", {"src": request.src, "dst": dst})
        except (FileNotFound, FileExists, InvalidArgument):
            return pb.RenameResponseProto(result=False)
        return pb.RenameResponseProto(result=True)

    async def rename2(self, ctx, request):
        """``FileContext.rename(..., OVERWRITE)``: errors as exceptions; the source as its
        own destination is FileAlreadyExists (once the source is known to exist)."""
        if _canonical(request.src) == _canonical(request.dst):
            await self.call(ctx, "get_file_info", {"path": request.src})
            raise FileExists(f"rename {request.src} to {request.dst}: the source and the "
                             f"destination are the same")
        await self.call(ctx, "rename", {"src": request.src, "dst": request.dst,
                                        "overwrite": request.overwriteDest})
        return pb.Rename2ResponseProto()

    async def setPermission(self, ctx, request):
        await self.call(ctx, "set_permission", {"path": request.src,
                                                "permission": request.permission.perm & 0o7777})
        return pb.SetPermissionResponseProto()

    async def setOwner(self, ctx, request):
        args = {"path": request.src}
        if request.HasField("username"):
            args["owner"] = request.username
        if request.HasField("groupname"):
            args["group"] = request.groupname
        await self.call(ctx, "set_owner", args)
        return pb.SetOwnerResponseProto()

    async def setTimes(self, ctx, request):
        """Times in ms; -1 leaves one as it is."""
        args = {"path": request.src}
        for field, name in (("mtime", "mtime_ns"), ("atime", "atime_ns")):
            value = getattr(request, field)
            if value != _UNSET:
                args[name] = value * 1_000_000
        await self.call(ctx, "set_times", args)
        return pb.SetTimesResponseProto()

    async def setReplication(self, ctx, request):
        """False for a missing path or a directory (HDFS sets it on files only)."""
        try:
            await self.call(ctx, "set_replication", {"path": request.src,
                                                     "replication": request.replication})
        except (FileNotFound, IsDirectory):
            return pb.SetReplicationResponseProto(result=False)
        return pb.SetReplicationResponseProto(result=True)

    async def concat(self, ctx, request):
        await self.call(ctx, "concat", {"target": request.trg, "srcs": list(request.srcs)})
        return pb.ConcatResponseProto()

    async def createSymlink(self, ctx, request):
        await self.call(ctx, "create_symlink", {"target": request.target, "path": request.link,
                                                "create_parent": request.createParent})
        return pb.CreateSymlinkResponseProto()

    async def setQuota(self, ctx, request):
        """-1 clears a quota, ``QUOTA_DONT_SET`` leaves it; leasefs has no quotas by
        storage type."""
        if request.HasField("storageType"):
            raise NotSupported(f"set quota of {request.path}: quotas by storage type are not "
                               f"supported (leasefs stores on one type)")
        await self.call(ctx, "set_quota", {"path": request.path,
                                           "ns_quota": _quota(request.namespaceQuota),
                                           "ds_quota": _quota(request.storagespaceQuota)})
        return pb.SetQuotaResponseProto()

    # ------------------------------------------------------------------ leases
    async def renewLease(self, ctx, request):
        await self.call(ctx, "renew_lease", {"client_name": request.clientName})
        return pb.RenewLeaseResponseProto()

    async def recoverLease(self, ctx, request):
        result = await _on_file("recover the lease of", request.src, self.call(
            ctx, "recover_lease", {"path": request.src, "client_name": request.clientName}))
        return pb.RecoverLeaseResponseProto(result=bool(result))

    async def isFileClosed(self, ctx, request):
        status = await self.call(ctx, "get_file_info", {"path": request.src})
        if status["type"] != "file":
            raise FileNotFound(f"{request.src}: path is not a file")
        return pb.IsFileClosedResponseProto(result=not status["under_construction"])

    async def listOpenFiles(self, ctx, request):
        """Pages of 1000 files by inode number (``id``: the last one of the previous
        page); no open file blocks a decommission (leasefs's decommission waits for the
        writer's close)."""
        types = set(request.types) or {pb.ALL_OPEN_FILES}
        entries = []
        if pb.ALL_OPEN_FILES in types:
            found = await self.call(ctx, "list_open_files",
                                    {"path": request.path if request.HasField("path") else "/"})
            entries = sorted((e for e in found if e["ino"] > request.id),
                             key=lambda e: e["ino"])
        page = entries[:_OPEN_FILES_PAGE]
        return pb.ListOpenFilesResponseProto(
            entries=[pb.OpenFilesBatchResponseProto(id=e["ino"], path=e["path"],
                                                    clientName=e["holder"],
                                                    clientMachine=e["client_machine"])
                     for e in page],
            hasMore=len(entries) > len(page), types=sorted(types))

    # ------------------------------------------------------------------ writing
    async def create(self, ctx, request):
        """The lease holder is HDFS's ``clientName``. OVERWRITE replaces a file; without
        it an existing file is FileAlreadyExists (AlreadyBeingCreated while another holder
        writes it); without CREATE a missing file is FileNotFound."""
        flags = request.createFlag
        if not flags & pb.CREATE:
            try:
                await self.call(ctx, "get_file_info", {"path": request.src})
            except FileNotFound:
                raise FileNotFound(f"cannot overwrite non-existent {request.src}: the create "
                                   f"flags lack CREATE") from None
        try:
            status = await self.call(ctx, "create", {
                "path": request.src, "client_name": request.clientName,
                "overwrite": bool(flags & pb.OVERWRITE), "create_parent": request.createParent,
                "replication": request.replication, "block_size": request.blockSize,
                "permission": request.masked.perm & 0o7777})
        except IsDirectory:
            raise FileExists(f"cannot create {request.src}: it already exists as a "
                             f"directory") from None
        return pb.CreateResponseProto(fs=convert.file_status(status))

    async def addBlock(self, ctx, request):
        args = {"path": request.src, "client_name": request.clientName,
                "ino": _ino(request.fileId), "excluded": _node_ids(request.excludeNodes)}
        if request.HasField("previous"):
            args["previous"] = _block(request.previous)
        located = await self.call(ctx, "add_block", args)
        return pb.AddBlockResponseProto(block=convert.located_block(located, self.pool_id()))

    async def complete(self, ctx, request):
        """True once the file is closed: leasefs's complete waits briefly for the last
        block's replica reports, so the first answer is true when the pipeline finished."""
        args = {"path": request.src, "client_name": request.clientName,
                "ino": _ino(request.fileId)}
        if request.HasField("last"):
            args["last"] = _block(request.last)
        result = await self.call(ctx, "complete", args)
        return pb.CompleteResponseProto(result=bool(result))

    async def abandonBlock(self, ctx, request):
        await self.call(ctx, "abandon_block", {"path": request.src, "client_name": request.holder,
                                               "ino": _ino(request.fileId),
                                               "block": _block(request.b)})
        return pb.AbandonBlockResponseProto()

    async def fsync(self, ctx, request):
        """hflush (the first of a block) and hsync: the last block's length, -1 = not
        known (nothing recorded, what was recorded made durable)."""
        await self.call(ctx, "fsync", {"path": request.src, "client_name": request.client,
                                       "ino": _ino(request.fileId),
                                       "last_block_length": max(request.lastBlockLength, 0)})
        return pb.FsyncResponseProto()

    async def getAdditionalDatanode(self, ctx, request):
        """The pipeline's nodes plus ``numAdditionalNodes`` new ones: Hadoop's client
        finds the new node as the one its pipeline lacks, and fails unless there are
        exactly that many more."""
        answer = await self.call(ctx, "get_additional_datanode", {
            "path": request.src, "ino": _ino(request.fileId), "block": _block(request.blk),
            "existing": _node_ids(request.existings), "excluded": _node_ids(request.excludes),
            "num": request.numAdditionalNodes, "client_name": request.clientName})
        added = convert.located_block({**answer, "offset": 0}, self.pool_id())
        existing = list(request.existings)
        ids = list(request.existingStorageUuids)
        if len(ids) != len(existing):
            ids = [f"DS-{n.id.datanodeUuid}" for n in existing]
        block = hpb.LocatedBlockProto(
            b=added.b, offset=0, locs=existing + list(added.locs), corrupt=False,
            blockToken=added.blockToken,
            storageTypes=[hpb.DISK] * (len(existing) + len(added.locs)),
            storageIDs=ids + list(added.storageIDs))
        return pb.GetAdditionalDatanodeResponseProto(block=block)

    async def updateBlockForPipeline(self, ctx, request):
        answer = await self.call(ctx, "update_block_for_pipeline", {
            "block": _block(request.block), "client_name": request.clientName})
        return pb.UpdateBlockForPipelineResponseProto(
            block=convert.located_block({**answer, "offset": 0}, self.pool_id()))

    async def updatePipeline(self, ctx, request):
        await self.call(ctx, "update_pipeline", {
            "client_name": request.clientName, "old_block": _block(request.oldBlock),
            "new_block": _block(request.newBlock),
            "new_nodes": [n.datanodeUuid for n in request.newNodes]})
        return pb.UpdatePipelineResponseProto()

    async def reportBadBlocks(self, ctx, request):
        """A Java reader's checksum failure: each listed node's replica is marked corrupt,
        as a leasefs reader's report does (the metadata server re-replicates it)."""
        reports = [{"block": _block(located.b), "node_id": node.id.datanodeUuid}
                   for located in request.blocks for node in located.locs]
        if reports:
            await self.call(ctx, "report_bad_blocks", {"blocks": reports})
        return pb.ReportBadBlocksResponseProto()

    async def append(self, ctx, request):
        """The last block when it is partly full, and the file's status. A file kept
        inline in the namespace (a small file written by a leasefs client) has no block
        for Hadoop's writer to continue, and the writer sends no bytes it did not write:
        its bytes become its first block first (``inline_append``), which the answer
        names. NEW_BLOCK is refused (leasefs continues the last block)."""
        if request.flag & pb.NEW_BLOCK:
            raise NotSupported(f"append to {request.src}: NEW_BLOCK is not supported "
                               f"(leasefs appends into the last block)")
        answer = await _on_file("append to", request.src, self.call(
            ctx, "append", {"path": request.src, "client_name": request.clientName}))
        last_block = answer.get("last_block")
        if answer.get("inline") is not None:
            last_block = await self.inline_to_block.convert(ctx, request.src,
                                                            request.clientName, answer)
        out = pb.AppendResponseProto(stat=convert.file_status(answer["status"]))
        if last_block is not None:
            out.block.CopyFrom(convert.located_block(last_block, self.pool_id()))
        return out

    async def truncate(self, ctx, request):
        """True: done; false: the new last block is being recovered (the client waits
        for the file to close)."""
        result = await _on_file("truncate", request.src, self.call(
            ctx, "truncate", {"path": request.src, "new_length": request.newLength,
                              "client_name": request.clientName}))
        return pb.TruncateResponseProto(result=bool(result))
