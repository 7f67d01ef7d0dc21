"""leasefs's answers (the msgpack protocol's file status and located blocks, docs/PROTOCOL.md)
as HDFS's records, for the front ends that answer Hadoop's client.

A block server is reached by Hadoop's client at ``ipAddr:xferPort``: a location that names
no HDFS data-transfer port (``hdfs_port``: a block server that serves none) is left out of
the answer, as a dead replica would be. ``pool_id`` names the namespace's one block pool
(any stable string: the client only hands it back).

Concurrency contract: pure.
"""

from __future__ import annotations

from ..rpcbase import parse_address
from . import tokens
from .pb import hdfs_pb2 as pb

_FILE_TYPES = {"file": pb.HdfsFileStatusProto.IS_FILE, "dir": pb.HdfsFileStatusProto.IS_DIR,
               "symlink": pb.HdfsFileStatusProto.IS_SYMLINK}
_NO_QUOTA = (1 << 64) - 1   # HDFS's -1 in an unsigned field


def pool_id(namespace_id: int) -> str:
    return f"BP-{namespace_id}"


def file_status(status: dict, *, name_only: bool = False,
                locations: pb.LocatedBlocksProto | None = None) -> pb.HdfsFileStatusProto:
    """``status`` (``get_file_info``'s answer); ``name_only``: the path field holds the
    entry's name, as in a listing (HDFS's client joins it to the folder's path); a lone
    status carries an empty path (the client fills in the one it asked for)."""
    kind = status["type"]
    out = pb.HdfsFileStatusProto(
        fileType=_FILE_TYPES[kind],
        path=status["name"].encode("utf-8", "surrogateescape") if name_only else b"",
        length=status["length"],
        permission=pb.FsPermissionProto(perm=status["mode"] & 0o7777),
        owner=status["owner"], group=status["group"],
        modification_time=status["mtime_ns"] // 1_000_000,
        access_time=status["atime_ns"] // 1_000_000,
        block_replication=status["replication"], blocksize=status["block_size"],
        fileId=status["ino"],
        childrenNum=status["children"] if kind == "dir" else 0)
    if kind == "symlink":
        out.symlink = status["symlink"].encode("utf-8", "surrogateescape")
    if locations is not None:
        out.locations.CopyFrom(locations)
    return out


def datanode(location: dict) -> pb.DatanodeInfoProto | None:
    """A replica's block server (``{node_id, address, hdfs_port, http_port?}``), or None
    when it serves no HDFS data transfer."""
    port = location.get("hdfs_port")
    if not port:
        return None
    host, _ = parse_address(location["address"])
    return pb.DatanodeInfoProto(
        id=pb.DatanodeIDProto(ipAddr=host, hostName=host, datanodeUuid=location["node_id"],
                              xferPort=port, infoPort=location.get("http_port") or 0,
                              ipcPort=0),
        location="/default-rack")


_ADMIN_STATES = {"NORMAL": pb.DatanodeInfoProto.NORMAL,
                 "DECOMMISSION_IN_PROGRESS": pb.DatanodeInfoProto.DECOMMISSION_INPROGRESS,
                 "DECOMMISSIONED": pb.DatanodeInfoProto.DECOMMISSIONED}


def datanode_report(node: dict) -> pb.DatanodeInfoProto:
    """A block server as the admin report lists it (``report``'s ``live_nodes`` entries),
    its HDFS data port 0 when it serves none."""
    host, _ = parse_address(node["address"])
    return pb.DatanodeInfoProto(
        id=pb.DatanodeIDProto(ipAddr=host, hostName=host, datanodeUuid=node["node_id"],
                              xferPort=node.get("hdfs_port") or 0,
                              infoPort=node.get("http_port") or 0, ipcPort=0),
        capacity=node["capacity"], dfsUsed=node["used"], remaining=node["remaining"],
        xceiverCount=node["xceivers"], location="/default-rack",
        adminState=_ADMIN_STATES.get(node["admin"], pb.DatanodeInfoProto.NORMAL))


def located_block(located: dict, pool: str) -> pb.LocatedBlockProto:
    """One located block (``Locator.located``'s shape); its block token, if any, rides in
    ``blockToken`` for the block servers."""
    block = located["block"]
    nodes = [d for d in map(datanode, located["locations"]) if d is not None]
    return pb.LocatedBlockProto(
        b=pb.ExtendedBlockProto(poolId=pool, blockId=block["id"],
                                generationStamp=block["gs"], numBytes=block["num_bytes"]),
        offset=located["offset"], locs=nodes, corrupt=bool(located.get("corrupt")),
        blockToken=tokens.to_proto(located.get("token")),
        storageTypes=[pb.DISK] * len(nodes),
        storageIDs=[f"DS-{d.id.datanodeUuid}" for d in nodes])


def located_blocks(answer: dict, pool: str) -> pb.LocatedBlocksProto:
    """``get_block_locations``' answer (without inline content: the caller serves that)."""
    blocks = [located_block(b, pool) for b in answer["blocks"]]
    out = pb.LocatedBlocksProto(fileLength=answer["length"], blocks=blocks,
                                underConstruction=answer["under_construction"],
                                isLastBlockComplete=answer["last_block_complete"])
    if blocks:
        out.lastBlock.CopyFrom(blocks[-1])
    return out


def no_quota(value) -> int:
    """A leasefs quota (-1 or None = none) in HDFS's unsigned quota fields."""
    return _NO_QUOTA if value is None or value < 0 else value
