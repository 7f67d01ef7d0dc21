"""Located blocks: where a client finds a block's replicas, in which order, with which
token (HDFS ``LocatedBlock``s from ``BlockManager.createLocatedBlocks``).

Why it exists: reads (``get_block_locations``, listings with locations), the write path
(``add_block``, ``append``, pipeline updates) and the retry cache's rebuilt answers all hand
clients located blocks; the rules (pipeline nodes while a block is written, good replicas
first and corrupt ones only when nothing else is left, the reader's order, the token) live
here once.

Concurrency contract: synchronous reads of the namespace, the blocks map and the block
servers on the trio thread.
"""

from __future__ import annotations

import math
from typing import Callable

from fs.blocktoken import READ as READ_TOKEN
from fs.rpc import LOCAL_PEER_PREFIX

from ..schema.inode import Inode
from ..namespace.view import NamespaceView
from ..blocks import blocks as bm
from ..blocks.blocks import BlockInfo, BlocksMap
from ..blocks.datanodes import DatanodeManager

#: the host of a caller on the local socket: this machine, as block servers on it name it
LOOPBACK_HOST = "127.0.0.1"


def caller_host(ctx) -> str | None:
    """The host a caller runs on, for locality: its TCP peer's address; a caller on the
    local socket runs on this machine, which block servers on loopback share."""
    peer = getattr(ctx, "peer", None)
    if not peer or peer == "?":
        return None
    if peer.startswith(LOCAL_PEER_PREFIX):
        return LOOPBACK_HOST
    return peer.rsplit(":", 1)[0].strip("[]")


class Locator:
    """``block_token(block_id, gs, user, mode)``: a block access token, or None in
    security = simple."""

    def __init__(self, view: NamespaceView, blocks: BlocksMap, datanodes: DatanodeManager,
                 block_token: Callable[[int, int, str, str], dict | None]):
        self.view = view
        self.blocks = blocks
        self.datanodes = datanodes
        self.block_token = block_token

    def location(self, node_id: str) -> dict | None:
        """A replica's live block server: its id and data address, plus its HDFS
        data-transfer and web ports when it serves them (``hdfs_port``, ``http_port``:
        Hadoop's client front end advertises them; other clients ignore them)."""
        node = self.datanodes.live(node_id)
        if node is None:
            return None
        out = {"node_id": node.node_id, "address": node.address}
        if node.hdfs_port:
            out["hdfs_port"] = node.hdfs_port
        if node.http_port:
            out["http_port"] = node.http_port
        return out

    def is_complete(self, block: dict) -> bool:
        info = self.blocks.get(block["id"])
        return info is not None and info.state == bm.COMPLETE

    def located(self, block: dict, info: BlockInfo | None, offset: int,
                user: str | None = None, mode: str = READ_TOKEN,
                reader_host: str | None = None) -> dict:
        """A located block for clients (pipeline nodes while being written); with a
        ``user`` and block keys, the block access token (``mode``: read, or write for the
        block's writer) its caller shows block servers. A finished block's replicas come in
        ``DatanodeManager.sort_for_reader``'s order for a reader on ``reader_host``: a new
        order at every call, so that reads spread over every replica."""
        state = info.state if info is not None else block["state"]
        corrupt = False
        if info is None:
            nodes = []
        elif state in (bm.UNDER_CONSTRUCTION, bm.UNDER_RECOVERY):
            nodes = info.location_nodes()
        else:
            nodes = info.location_nodes()
            if not nodes:
                nodes = info.corrupt_nodes()
                corrupt = bool(nodes)
            nodes = self.datanodes.sort_for_reader(nodes, reader_host)
        locations = [loc for loc in map(self.location, nodes) if loc is not None]
        gs = info.gs if info else block["gs"]
        out = {"block": {"id": block["id"], "gs": gs, "num_bytes": block["num_bytes"]},
               "offset": offset, "locations": locations, "state": state, "corrupt": corrupt}
        token = None if user is None else self.block_token(block["id"], gs, user, mode)
        if token is not None:
            out["token"] = token
        return out

    def writer_blocks(self, ino: int, inode: Inode, user: str, mode: str) -> list[dict]:
        """Every block of the file ``ino`` located for its writer, each with a ``mode``
        token for ``user``: what ``append(patch=true)`` answers."""
        return [self.located(block, self.blocks.get(block["id"]), pos, user, mode)
                for block, pos in self.view.blocks_in_range(ino, inode, 0, math.inf)]

    def file_locations(self, ino: int, inode: Inode, offset: int, end, user: str,
                       reader_host: str | None) -> dict:
        """``get_block_locations``' answer for the blocks of a file overlapping
        ``[offset, end)``, each with a read token for ``user`` (security = secure) and its
        replicas in the order for a reader on ``reader_host``."""
        under_construction = bool(inode.uc)
        data = self.view.inline_data(ino, inode)
        if data is not None:   # the whole content, whatever the range asked
            return {"length": len(data), "under_construction": under_construction,
                    "blocks": [], "last_block_complete": True, "inline": data, "ino": ino}
        located = [self.located(block, self.blocks.get(block["id"]), pos, user,
                                reader_host=reader_host)
                   for block, pos in self.view.blocks_in_range(ino, inode, offset, end)]
        last = self.view.tail_blocks(ino, inode, 1)
        complete = not last or self.is_complete(last[-1])
        out = {"length": (inode.length or 0), "under_construction": under_construction,
               "blocks": located, "last_block_complete": complete}
        if not complete:
            # the block being written, wherever the range ends: HDFS's client asks its
            # replicas how much of it is visible (``lastBlock``)
            block = last[-1]
            out["last"] = self.located(block, self.blocks.get(block["id"]),
                                       (inode.length or 0) - block["num_bytes"], user,
                                       reader_host=reader_host)
        return out
