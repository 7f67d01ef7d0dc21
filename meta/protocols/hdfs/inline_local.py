"""Short-circuit reads of files kept inline in the namespace: the metadata server answers
``ClientDatanodeProtocol.getBlockLocalPathInfo`` for their synthetic blocks, as a block
server does for its replicas (``storage.hdfs.datanode_ipc``).

Why: Hadoop's client with short-circuit reads on asks whichever node a block is located on
for its local files, and at the first refusal stops short-circuit reads for its whole
client context: one small file read through ``hdfs://`` would send every later read of
that Spark executor over the network. So an inline file's content is written out once, as
HDFS's replica layout (data file, meta file of CRC32Cs), and named.

How it stays right:

1. Files are named by block id *and* content stamp (``blk_<id>_<stamp>``), written under a
   temporary name and renamed, so a name always holds one whole content.
2. Hadoop's client remembers named files by block pool and id, not by stamp; the located
   block of an inline file carries a pool of its content (``convert.inline_pool``), so a
   rewritten file is a different key and never maps to the old content's files.
3. A request whose stamp is not the file's current content is refused as stale before
   anything is written (``InlineBlocks.content``: Hadoop's client fetches the locations
   again and retries).
4. At most ``max_files`` contents are kept; the least recently named go first. A client
   that named an evicted file and reads it again fails to open it and reads over the
   network (then stops short-circuit for its context, as after any failure): the bound
   is what makes that rare.

Refused: a client not on this host, no folder (a server built without one), and what
``InlineBlocks.content`` refuses (tokens, stale stamps, blocks not of inline files).

Concurrency contract: the metadata server's trio thread; files are written and removed in
worker threads; two requests for the same content may both write it (the renames put the
same bytes in place).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import uuid

import trio

from fs.datafolder import make_private_folder
from fs.datatransfer import chunk_checksums, encode_meta_header
from fs.errors import PermissionDenied
from fs.hdfs.ipc import CLIENT_DATANODE_PROTOCOL
from fs.hdfs.ipc_server import on_this_host
from fs.hdfs.pb import client_datanode_pb2 as cdp
from fs.hdfs.pb import datatransfer_pb2 as dt

log = logging.getLogger(__name__)

_BYTES_PER_CHECKSUM = 512


class InlineLocalFiles:
    """``inline``: the server's ``InlineBlocks`` (the content a block names, or the
    refusal); ``folder``: where contents are written (None: every call refused)."""

    PROTOCOL = CLIENT_DATANODE_PROTOCOL
    CALLS = {"getBlockLocalPathInfo": (cdp.GetBlockLocalPathInfoRequestProto,
                                       cdp.GetBlockLocalPathInfoResponseProto)}

    def __init__(self, inline, folder: str | None, *, max_files: int = 4096):
        self.inline = inline
        self.folder = folder
        self.max_files = max_files
        # (block id, stamp) -> (data path, meta path), least recently named first
        self._named: collections.OrderedDict = collections.OrderedDict()
        self._cleared = False
        self._clearing = trio.Lock()

    async def getBlockLocalPathInfo(self, ctx, request):
        block = request.block
        what = f"getBlockLocalPathInfo blk_{block.blockId}"
        if self.folder is None:
            raise PermissionDenied(f"{what}: this metadata server names no local files")
        if not on_this_host(ctx.session):
            raise PermissionDenied(f"{what}: local files are only named to a client on "
                                   f"this host")
        header = dt.BaseHeaderProto(block=block)
        if request.HasField("token"):
            header.token.CopyFrom(request.token)
        data = await self.inline.content(header, "getBlockLocalPathInfo", ctx.peer)
        data_path, meta_path = await self._written(block.blockId, block.generationStamp,
                                                   data)
        answer = cdp.GetBlockLocalPathInfoResponseProto(localPath=data_path,
                                                        localMetaPath=meta_path)
        answer.block.CopyFrom(block)
        return answer

    async def _written(self, block_id: int, stamp: int, data: bytes) -> tuple[str, str]:
        key = (block_id, stamp)
        paths = self._named.get(key)
        if paths is not None:
            self._named.move_to_end(key)
            return paths
        async with self._clearing:
            if not self._cleared:
                # contents of an earlier run are not tracked: start from an empty folder
                await trio.to_thread.run_sync(_clear, self.folder)
                self._cleared = True
        paths = await trio.to_thread.run_sync(_write, self.folder, block_id, stamp, data)
        self._named[key] = paths
        evicted = []
        while len(self._named) > self.max_files:
            evicted.append(self._named.popitem(last=False)[1])
        if evicted:
            await trio.to_thread.run_sync(_remove, evicted)
        return paths


def _clear(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    make_private_folder(folder)


def _write(folder: str, block_id: int, stamp: int, data: bytes) -> tuple[str, str]:
    base = os.path.join(folder, f"blk_{block_id}_{stamp}")
    meta = encode_meta_header(_BYTES_PER_CHECKSUM) + chunk_checksums(
        data, _BYTES_PER_CHECKSUM)
    for path, content in ((base, data), (base + ".meta", meta)):
        # a temporary name of its own: two requests for one content may write at once; no
        # fsync: a crash leaves temporary names only, and the folder is cleared at start
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "wb") as fh:
            fh.write(content)
        os.replace(temporary, path)
    return base, base + ".meta"


def _remove(evicted: list[tuple[str, str]]) -> None:
    for paths in evicted:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove %s: %s", path, exc)
