"""leasefs's answers (the msgpack protocol's file status and located blocks, docs/PROTOCOL.md)
as HDFS's records, for the front ends that answer Hadoop's client.

A block server is reached by Hadoop's client at ``ipAddr:xferPort``: a location that names
no HDFS data-transfer port (``hdfs_port``: a block server that serves none) is left out of
the answer, as a dead replica would be. The same port answers Hadoop IPC
(``ClientDatanodeProtocol``, the visible length of a replica being written: ``fs.hdfs.
sniff`` tells the two apart), so ``ipcPort`` is ``xferPort``. ``pool_id`` names the
namespace's one block pool (any stable string: the client only hands it back).

A file kept inline in the namespace is one synthetic block (``inline_located_blocks``)
whose only location is the metadata server's own HDFS port: its id is the inode number in
a space leasefs's block ids never reach (``INLINE_BLOCK_BASE``), its generation stamp a
digest of the content (``content_stamp``), so a read of content that changed since its
locations were fetched is refused as stale, never served mixed.

Concurrency contract: pure.
"""

from __future__ import annotations

import hashlib

from ..rpcbase import parse_address
from . import tokens
from .pb import hdfs_pb2 as pb

_FILE_TYPES = {"file": pb.HdfsFileStatusProto.IS_FILE, "dir": pb.HdfsFileStatusProto.IS_DIR,
               "symlink": pb.HdfsFileStatusProto.IS_SYMLINK}
UNSIGNED_MINUS_ONE = (1 << 64) - 1   # HDFS's -1 in an unsigned field
#: block ids at and above this name inline files (``INLINE_BLOCK_BASE | ino``); leasefs
#: counts its own block ids up from 1, and Java's signed block id stays positive
INLINE_BLOCK_BASE = 1 << 62


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
                              ipcPort=port),
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
                              infoPort=node.get("http_port") or 0,
                              ipcPort=node.get("hdfs_port") or 0),
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
    """``get_block_locations``' answer (without inline content: ``inline_located_blocks``).

    A file being written whose last block is not complete is told as HDFS's NameNode tells
    it: ``fileLength`` counts the complete blocks only and ``lastBlock`` is the block being
    written (``answer["last"]``), whose visible length the client asks a replica's block
    server for (``getReplicaVisibleLength``) and adds."""
    blocks = [located_block(b, pool) for b in answer["blocks"]]
    length = answer["length"]
    last = answer.get("last")
    if last is not None and not answer["last_block_complete"]:
        length = last["offset"]
        last_block = located_block(last, pool)
    else:
        last_block = blocks[-1] if blocks else None
    out = pb.LocatedBlocksProto(fileLength=length, blocks=blocks,
                                underConstruction=answer["under_construction"],
                                isLastBlockComplete=answer["last_block_complete"])
    if last_block is not None:
        out.lastBlock.CopyFrom(last_block)
    return out


def inline_block_id(ino: int) -> int:
    return INLINE_BLOCK_BASE | ino


def inline_ino(block_id: int) -> int | None:
    """The inode number an inline file's synthetic block id names; None for any other id."""
    if INLINE_BLOCK_BASE <= block_id < INLINE_BLOCK_BASE << 1:
        return block_id - INLINE_BLOCK_BASE
    return None


def content_stamp(data: bytes) -> int:
    """The generation stamp of an inline file's synthetic block: a digest of the content
    (positive in Java's long, never 0), so it changes when the content does."""
    digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    return (digest >> 1) or 1


def self_node(host: str, port: int, node_id: str) -> pb.DatanodeInfoProto:
    """The metadata server as the one location of inline files' blocks (``host:port``: its
    HDFS port, which answers their READ_BLOCK)."""
    return pb.DatanodeInfoProto(
        id=pb.DatanodeIDProto(ipAddr=host, hostName=host, datanodeUuid=node_id,
                              xferPort=port, infoPort=0, ipcPort=port),
        location="/default-rack")


def inline_pool(pool: str, stamp: int) -> str:
    """The block pool an inline file's block is told in: one per content. Hadoop's client
    keeps what it learnt of a block (the files a short-circuit read opens) under its pool
    and id, never its stamp; a rewritten file must not find the old content's entry."""
    return f"{pool}-inline-{stamp}"


def inline_located_blocks(answer: dict, ino: int, pool: str, node: pb.DatanodeInfoProto,
                          token: dict | None) -> pb.LocatedBlocksProto:
    """``get_block_locations``' answer for an inline file (``answer["inline"]``): one
    complete block at offset 0 on ``node``; an empty file has none."""
    data = answer["inline"]
    out = pb.LocatedBlocksProto(fileLength=len(data), underConstruction=answer[
        "under_construction"], isLastBlockComplete=True)
    if not data:
        return out
    stamp = content_stamp(data)
    block = pb.LocatedBlockProto(
        b=pb.ExtendedBlockProto(poolId=inline_pool(pool, stamp), blockId=inline_block_id(ino),
                                generationStamp=stamp, numBytes=len(data)),
        offset=0, locs=[node], corrupt=False, blockToken=tokens.to_proto(token),
        storageTypes=[pb.DISK], storageIDs=[f"DS-{node.id.datanodeUuid}"])
    out.blocks.append(block)
    out.lastBlock.CopyFrom(block)
    return out


def no_quota(value) -> int:
    """A leasefs quota (-1 or None = none) in HDFS's unsigned quota fields."""
    return UNSIGNED_MINUS_ONE if value is None or value < 0 else value
