"""The calls of HDFS's ``ClientProtocol`` that read the namespace, for Hadoop's client on the
metadata server's HDFS port (``fs.hdfs.ipc_server`` serves it).

Each method translates one HDFS request into the msgpack protocol's call of the same
meaning and its answer into HDFS's records (``fs.hdfs.convert``). The calls go through
``call`` (``MetaServer.dispatch``), so the HA role, observer reads, the retry cache and the
permission checks apply exactly as to a msgpack client.

HDFS's own conventions kept here: a missing path is an *empty* answer to getFileInfo and
getListing (the client raises FileNotFoundException itself); a listing's entries carry
only their names, and a file listed alone carries none (the client fills in the path); a
listing's page ends after the name ``startAfter``, ``remainingEntries`` non-zero while more
follow; ``needLocation`` gives every file of the page its located blocks (Spark lists a
folder with it).

Small files kept inline in the namespace are located as one synthetic block on the
metadata server itself (``inline.InlineBlocks``), which its HDFS port serves.

Concurrency contract: the metadata server's trio thread; no state but the constructor's.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from fs import paths
from fs.errors import FileNotFound, InvalidArgument, NotDirectory, PermissionDenied
from fs.hdfs import convert
from fs.hdfs.ipc import CLIENT_PROTOCOL
from fs.hdfs.pb import hdfs_pb2 as hdfs
from fs.hdfs.pb import namenode_reads_pb2 as pb
from fs.rpcbase import CallContext

# the client's own defaults for what leasefs does not decide: it writes 64 KiB packets of
# 512-byte CRC32C chunks (a replica may be read at any chunk size it was stored with)
BYTES_PER_CHECKSUM = 512
WRITE_PACKET_SIZE = 65536
FILE_BUFFER_SIZE = 4096
LISTING_PAGE = 1000          # HDFS's dfs.ls.limit
_MISSING = (FileNotFound, NotDirectory)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class NamenodeReads:
    """``ClientProtocol``'s reads as a translator of ``fs.hdfs.ipc_server``; ``call`` is
    ``MetaServer.dispatch``: ``await call(ctx, method, args)``."""

    PROTOCOL = CLIENT_PROTOCOL
    CALLS = {
        "getFileInfo": (pb.GetFileInfoRequestProto, pb.GetFileInfoResponseProto),
        "getFileLinkInfo": (pb.GetFileLinkInfoRequestProto, pb.GetFileLinkInfoResponseProto),
        "getLinkTarget": (pb.GetLinkTargetRequestProto, pb.GetLinkTargetResponseProto),
        "getListing": (pb.GetListingRequestProto, pb.GetListingResponseProto),
        "getBlockLocations": (pb.GetBlockLocationsRequestProto,
                              pb.GetBlockLocationsResponseProto),
        "getServerDefaults": (pb.GetServerDefaultsRequestProto,
                              pb.GetServerDefaultsResponseProto),
        "getFsStats": (pb.GetFsStatusRequestProto, pb.GetFsStatsResponseProto),
        "getContentSummary": (pb.GetContentSummaryRequestProto,
                              pb.GetContentSummaryResponseProto),
        "getQuotaUsage": (pb.GetQuotaUsageRequestProto, pb.GetQuotaUsageResponseProto),
        "getPreferredBlockSize": (pb.GetPreferredBlockSizeRequestProto,
                                  pb.GetPreferredBlockSizeResponseProto),
        "getDatanodeReport": (pb.GetDatanodeReportRequestProto,
                              pb.GetDatanodeReportResponseProto),
        "getHAServiceState": (pb.HAServiceStateRequestProto, pb.HAServiceStateResponseProto),
        "msync": (pb.MsyncRequestProto, pb.MsyncResponseProto),
    }

    def __init__(self, call: Callable[[CallContext, str, dict], Awaitable], inline=None):
        """``inline``: an ``inline.InlineBlocks`` (None: inline files show no block)."""
        self.call = call
        self.inline = inline

    def _located(self, ctx, answer: dict, pool: str) -> hdfs.LocatedBlocksProto:
        if "inline" in answer and self.inline is not None:
            return self.inline.located_blocks(ctx, answer, pool)
        return convert.located_blocks(answer, pool)

    async def _defaults(self, ctx) -> dict:
        return await self.call(ctx, "get_server_defaults", {})

    async def _pool(self, ctx) -> str:
        return convert.pool_id((await self._defaults(ctx))["namespace_id"])

    async def _status(self, ctx, path: str) -> dict | None:
        try:
            return await self.call(ctx, "get_file_info", {"path": path})
        except _MISSING:
            return None

    # ------------------------------------------------------------------ status
    async def getFileInfo(self, ctx, request):
        status = await self._status(ctx, request.src)
        if status is None:
            return pb.GetFileInfoResponseProto()
        return pb.GetFileInfoResponseProto(fs=convert.file_status(status))

    async def getFileLinkInfo(self, ctx, request):
        # leasefs resolves no links on the server: a link's status is the link's own
        status = await self._status(ctx, request.src)
        if status is None:
            return pb.GetFileLinkInfoResponseProto()
        return pb.GetFileLinkInfoResponseProto(fs=convert.file_status(status))

    async def getLinkTarget(self, ctx, request):
        status = await self.call(ctx, "get_file_info", {"path": request.path})
        if status["type"] != "symlink":
            raise InvalidArgument(f"{status['path']}: is not a symbolic link")
        return pb.GetLinkTargetResponseProto(targetPath=status["symlink"])

    async def getPreferredBlockSize(self, ctx, request):
        status = await self.call(ctx, "get_file_info", {"path": request.filename})
        if status["type"] != "file":
            raise FileNotFound(f"{status['path']}: is not a file")
        return pb.GetPreferredBlockSizeResponseProto(bsize=status["block_size"])

    # ------------------------------------------------------------------ listing
    async def getListing(self, ctx, request):
        try:
            page = await self.call(ctx, "list_status", {
                "path": request.src, "start_after": _text(request.startAfter),
                "limit": LISTING_PAGE})
        except _MISSING:
            return pb.GetListingResponseProto()
        entries = page["entries"]
        # a file is listed as itself, without a name: the client keeps the path it asked
        alone = len(entries) == 1 and \
            entries[0]["path"] == paths.join_parts(paths.split(request.src))
        pool = await self._pool(ctx) if request.needLocation else None
        out = []
        for status in entries:
            locations = None
            if pool is not None and status["type"] == "file":
                try:
                    answer = await self.call(ctx, "get_block_locations",
                                             {"path": status["path"]})
                except _MISSING:   # gone since the page was read
                    continue
                except PermissionDenied:   # listed, not readable: its open will say so
                    answer = None
                if answer is not None:
                    locations = self._located(ctx, answer, pool)
            entry = convert.file_status(status, name_only=not alone, locations=locations)
            out.append(entry)
        listing = hdfs.DirectoryListingProto(partialListing=out,
                                             remainingEntries=1 if page["has_more"] else 0)
        return pb.GetListingResponseProto(dirList=listing)

    async def getBlockLocations(self, ctx, request):
        answer = await self.call(ctx, "get_block_locations", {
            "path": request.src, "offset": request.offset, "length": request.length})
        return pb.GetBlockLocationsResponseProto(
            locations=self._located(ctx, answer, await self._pool(ctx)))

    # ------------------------------------------------------------------ the server
    async def getServerDefaults(self, ctx, request):
        c = await self._defaults(ctx)
        defaults = hdfs.FsServerDefaultsProto(
            blockSize=c["block_size"], bytesPerChecksum=BYTES_PER_CHECKSUM,
            writePacketSize=WRITE_PACKET_SIZE, replication=c["replication"],
            fileBufferSize=FILE_BUFFER_SIZE, encryptDataTransfer=False,
            trashInterval=max(0, round(c["trash_interval"])),
            checksumType=hdfs.CHECKSUM_CRC32C)
        return pb.GetServerDefaultsResponseProto(serverDefaults=defaults)

    async def getFsStats(self, ctx, request):
        report = await self.call(ctx, "report", {})
        return pb.GetFsStatsResponseProto(
            capacity=report["capacity"], used=report["used"], remaining=report["remaining"],
            under_replicated=report["under_replicated"], corrupt_blocks=report["corrupt"],
            missing_blocks=report["missing"],
            pending_deletion_blocks=report["pending_deletion"])

    async def getDatanodeReport(self, ctx, request):
        report = await self.call(ctx, "report", {})
        kind = request.type
        nodes = []
        if kind in (pb.ALL, pb.LIVE):
            nodes += report["live_nodes"]
        if kind in (pb.ALL, pb.DEAD):
            nodes += report["dead_nodes"]
        if kind == pb.DECOMMISSIONING:
            nodes += [n for n in report["live_nodes"] if n["admin"] == "DECOMMISSION_IN_PROGRESS"]
        return pb.GetDatanodeReportResponseProto(di=[convert.datanode_report(n)
                                                     for n in nodes])

    # ------------------------------------------------------------------ usage
    async def getContentSummary(self, ctx, request):
        s = await self.call(ctx, "content_summary", {"path": request.path})
        return pb.GetContentSummaryResponseProto(summary=hdfs.ContentSummaryProto(
            length=s["length"], fileCount=s["file_count"], directoryCount=s["directory_count"],
            quota=convert.no_quota(s["ns_quota"]), spaceConsumed=s["space_consumed"],
            spaceQuota=convert.no_quota(s["ds_quota"])))

    async def getQuotaUsage(self, ctx, request):
        # a quota folder keeps its usage counted: no walk; any other path is summed up
        status = await self.call(ctx, "get_file_info", {"path": request.path})
        quota = status.get("quota")
        if quota is not None:
            usage = pb.QuotaUsageProto(
                fileAndDirectoryCount=quota["ns_used"], quota=convert.no_quota(quota["ns"]),
                spaceConsumed=quota["ds_used"], spaceQuota=convert.no_quota(quota["ds"]))
        else:
            s = await self.call(ctx, "content_summary", {"path": request.path})
            usage = pb.QuotaUsageProto(
                fileAndDirectoryCount=s["file_count"] + s["directory_count"],
                quota=convert.no_quota(None), spaceConsumed=s["space_consumed"],
                spaceQuota=convert.no_quota(None))
        return pb.GetQuotaUsageResponseProto(usage=usage)

    # ------------------------------------------------------------------ observer reads
    async def getHAServiceState(self, ctx, request):
        """This server's role, asked of every server by Hadoop's observer read proxy (a
        server without HA is active)."""
        status = await self.call(ctx, "ha_status", {})
        return pb.HAServiceStateResponseProto(state=_HA_STATES.get(status["role"],
                                                                   pb.INITIALIZING))

    async def msync(self, ctx, request):
        """Served by the active only: its answer's state id (the IPC answer header's)
        is what the client's next observer reads wait for."""
        await self.call(ctx, "msync", {})
        return pb.MsyncResponseProto()


# a server taking over is no active yet: the client is to go on looking
_HA_STATES = {"active": pb.ACTIVE, "standby": pb.STANDBY, "taking_over": pb.STANDBY,
              "observer": pb.OBSERVER}

