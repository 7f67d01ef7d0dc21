"""File checksums that depend on the content only (HDFS getFileChecksum, COMPOSITE-CRC):
the CRC32C of the whole file, combined from each block's CRC32C, which its block server
combines from the replica's stored chunk CRCs (BLOCK_CHECKSUM) without sending the data.

Why it exists: two copies of a file with other block sizes or ``bytes_per_checksum`` hold
other chunk CRCs, but the CRC32C of their bytes is the same, and so is that of a local file
(``local_file_checksum``): ``leasefs checksum`` and ``cp``/``get --verify`` compare them.

A block is asked of one replica at a time; a replica that fails (gone, damaged meta file,
refused) is skipped for the next; a refused token fetches fresh locations once. Files kept
in the namespace (inline) are checksummed from their bytes.

Concurrency contract: ``file_checksum`` runs on the client's trio thread (data connections
are opened there); ``local_file_checksum`` blocks (the sync CLI calls it directly).
"""

from __future__ import annotations

import logging


from .crccombine import CompositeCrc
from .dataconn import (IO_ERRORS, close_quietly, failure_cause, open_data_connection,
                       response_error, time_limit)
from .datatransfer import BLOCK_CHECKSUM, crc32c, op_header
from .errors import BlockMissing, InvalidToken, ProtocolError
from .reader import AsyncInputStream, Block

log = logging.getLogger(__name__)

ALGORITHM = "COMPOSITE-CRC32C"
LOCAL_CHUNK = 8 << 20


def result(crc: int, length: int) -> dict:
    return {"algorithm": ALGORITHM, "crc": f"{crc:08x}", "length": length}


def local_file_checksum(path: str, chunk: int = LOCAL_CHUNK) -> dict:
    """The same checksum of a local file, streamed through crc32c."""
    crc, length = 0, 0
    with open(path, "rb") as f:
        while data := f.read(chunk):
            crc = crc32c(data, crc)
            length += len(data)
    return result(crc, length)


async def _ask(client, block: Block, node: dict, length: int) -> int:
    config = client.config
    framed = await open_data_connection(node["address"], config.data_connect_timeout,
                                        config.max_frame, client.tls)
    try:
        with time_limit(config.data_timeout, f"{BLOCK_CHECKSUM} of block {block.id} at "
                                             f"{node['address']}"):
            await framed.send_frame(op_header(BLOCK_CHECKSUM, **block.op_fields(),
                                              length=length))
            resp = await framed.receive_frame()
    finally:
        await close_quietly(framed)
    if not isinstance(resp, dict) or resp.get("status") != "SUCCESS":
        raise response_error(resp, f"{BLOCK_CHECKSUM} of block {block.id} at {node['address']}")
    crc = resp.get("crc")
    if not isinstance(crc, int) or not 0 <= crc < 1 << 32 or resp.get("length") != length:
        raise ProtocolError(f"{BLOCK_CHECKSUM} answer from {node['address']} is malformed: "
                            f"{resp!r:.200}")
    return crc


async def _block_crc(client, path: str, block: Block) -> int:
    failures = []
    for node in block.locations:
        try:
            return await _ask(client, block, node, block.num_bytes)
        except InvalidToken:
            raise
        except IO_ERRORS as exc:
            log.info("%s: %s of block %s at %s failed: %s; trying another replica", path,
                     BLOCK_CHECKSUM, block.id, node.get("address"), failure_cause(exc))
            failures.append(f"{node.get('address')}: {failure_cause(exc)}")
    raise BlockMissing(f"{path}: no replica of block {block.id} answered its checksum: "
                       + ("; ".join(failures[-6:]) or "the block has no locations"))


async def file_checksum(client, path: str) -> dict:
    """``{"algorithm": "COMPOSITE-CRC32C", "crc": "8 hex digits", "length": n}`` of ``path``
    (its visible length, for a file being written)."""
    try:
        return await _file_checksum(client, path)
    except InvalidToken:   # expired: fresh locations bring fresh tokens, once
        return await _file_checksum(client, path)


async def _file_checksum(client, path: str) -> dict:
    # the input stream's locating: tokens, inline content, the visible length of a block
    # being written (BLOCK_LENGTH)
    async with await AsyncInputStream.open(client, path) as stream:
        if stream.inline is not None:
            data = stream.inline[:stream.length]
            return result(crc32c(data), len(data))
        blocks = [b for b in stream.blocks if b.num_bytes > 0]
        length = stream.length
    total = CompositeCrc()
    for block in blocks:
        total.add(await _block_crc(client, path, block), block.num_bytes)
    if total.length != length:
        raise ProtocolError(f"{path}: blocks cover {total.length} bytes, the file has {length}")
    return result(total.crc, length)
