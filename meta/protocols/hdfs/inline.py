"""Files kept inline in the namespace, for Hadoop's client: each is one synthetic block
(``fs.hdfs.convert.inline_located_blocks``) located on the metadata server itself, whose
HDFS port answers its READ_BLOCK (``fs.hdfs.datatransfer.MemoryBlocks``; the port tells
data transfer from IPC by the first bytes, ``fs.hdfs.sniff``).

Why: Hadoop's client reads only blocks. A small file written by the mount or leasefs's own
client has none (its bytes live in the namespace), so without this it would show a length
and fail to read.

* The block's id is the inode number in the reserved space (``INLINE_BLOCK_BASE``), its
  generation stamp a digest of the content. A READ_BLOCK whose stamp is not the current
  content's (the file was rewritten, or is no longer inline, or is gone since its
  locations were fetched) is refused with ERROR_ACCESS_TOKEN: Hadoop's client then fetches
  the locations again at once and reads the new content, never a mix.
* The location is the address the client reached the HDFS port at (so it is reachable
  from the client), the node id ``meta-<namespace id>``.
* security = secure: the located block carries a read block token made out to the caller
  (``Security.block_token``), and the READ_BLOCK must show it; the metadata server checks
  it with its own block keys, as a block server does.

Concurrency contract: the metadata server's trio thread; the content is read from the
namespace view in one step (no await in between), so one op serves one version.
"""

from __future__ import annotations

import logging

from fs import blocktoken
from fs.errors import InvalidArgument, InvalidToken
from fs.hdfs import convert, tokens
from fs.hdfs.datatransfer import MemoryBlocks
from fs.hdfs.pb import datatransfer_pb2 as dt
from fs.hdfs.pb import hdfs_pb2 as pb

log = logging.getLogger(__name__)


class InlineBlocks:
    """``view``: the namespace view; ``security``: the server's ``Security`` (block tokens
    made and checked); ``namespace_id()``: the namespace's id (pool and node names)."""

    def __init__(self, view, security, namespace_id, *, idle_timeout: float,
                 data_timeout: float):
        self.view = view
        self.security = security
        self.namespace_id = namespace_id
        self.server = MemoryBlocks(self.content, name="metadata server",
                                   idle_timeout=idle_timeout, data_timeout=data_timeout,
                                   log=log)

    # ------------------------------------------------------------------ locating
    def node(self, session: dict) -> pb.DatanodeInfoProto:
        host, port = session.get("local_address") or ("127.0.0.1", 0)
        return convert.self_node(host, port, f"meta-{self.namespace_id()}")

    def located_blocks(self, ctx, answer: dict, pool: str) -> pb.LocatedBlocksProto:
        """``get_block_locations``' answer for an inline file, as Hadoop's client reads it."""
        data = answer["inline"]
        ino = answer["ino"]
        token = None
        if data:
            token = self.security.block_token(convert.inline_block_id(ino),
                                              convert.content_stamp(data), ctx.user,
                                              blocktoken.READ)
        return convert.inline_located_blocks(answer, ino, pool, self.node(ctx.session or {}),
                                             token)

    # ------------------------------------------------------------------ serving
    async def serve(self, stream, peer: str) -> None:
        await self.server.serve(stream, peer)

    async def content(self, header: dt.BaseHeaderProto, op: str, peer: str) -> bytes:
        """The bytes of the inline file a READ_BLOCK or BLOCK_CHECKSUM names, or the
        refusal."""
        block = header.block
        what = f"{op} blk_{block.blockId}_{block.generationStamp}"
        ino = convert.inline_ino(block.blockId)
        if ino is None:
            raise InvalidArgument(f"{what}: not a block of this metadata server (it serves "
                                  f"the blocks of files kept inline in the namespace only)")
        if self.security.block_keys is not None:
            token = tokens.from_proto(header.token) if header.HasField("token") else None
            keys = {k.key_id: k.secret for k in self.security.block_keys.keys()}
            blocktoken.check(keys, token, block.blockId, block.generationStamp,
                             blocktoken.READ, self.security.wall_ns() / 1e9, what)
        inode = self.view.get_inode(ino)
        data = None if inode is None else self.view.inline_data(ino, inode)
        if data is None:
            raise InvalidToken(f"{what}: stale: inode {ino} is no longer a file kept inline "
                               f"(replaced, grown or deleted since its locations were "
                               f"fetched): fetch them again")
        if convert.content_stamp(data) != block.generationStamp:
            raise InvalidToken(f"{what}: stale: the file's content changed since its "
                               f"locations were fetched: fetch them again")
        return data
