"""The client side of PATCH_BLOCK (docs/PROTOCOL.md §3): byte ranges written into a
finalized block's replicas under a new generation stamp, as one message down the chain of
the block's locations, answered once by the first node with every node's status.

Why it exists: the writer that holds a file's lease gets a new stamp (and a write token for
it) from the metadata server and sends the patch here; which statuses are good enough and
what happens to a replica that answered ERROR is the caller's decision (a replica left at
the old stamp is stale and repaired by the metadata server).

Concurrency contract: one call owns its connection (opened, used and closed here); safe to
run several calls side by side.
"""

from __future__ import annotations

import trio

from .config import Config
from .dataconn import close_quietly, open_data_connection, response_error
from .datatransfer import ERROR, ERROR_CHECKSUM, PATCH_BLOCK, SUCCESS, crc32c, op_header
from .errors import LeaseFSError, ServerUnavailable
from .framing import encode_frame


def patch_header(block_id: int, gs: int, new_gs: int, max_length: int, targets: list[str],
                 ranges: list[tuple[int, bytes]], token: dict | None = None,
                 client_name: str = "") -> dict:
    """The PATCH_BLOCK op header for ``ranges`` (``(offset, data)``) to ``targets``."""
    header = op_header(PATCH_BLOCK, block={"id": block_id, "gs": gs}, new_gs=new_gs,
                       max_length=max_length, targets=list(targets),
                       ranges=[[offset, len(data)] for offset, data in ranges],
                       crcs=[crc32c(data) for _, data in ranges], client=client_name)
    if token is not None:
        header["token"] = token
    return header


async def send_patch(config: Config, addresses: list[str], block_id: int, gs: int,
                     new_gs: int, max_length: int, ranges: list[tuple[int, bytes]],
                     token: dict | None = None, *, tls=None, client_name: str = "",
                     timeout: float | None = None) -> list[int]:
    """Send the patch ``ranges`` (``(offset, data)``: sorted, not overlapping, none empty)
    of ``blk_<block_id>_<gs>`` to the chain ``addresses`` (the first node is connected to,
    the others are its ``targets``), making every replica ``new_gs``; ``max_length`` is the
    file's block size, ``token`` the write token for ``new_gs`` (None in security =
    simple), ``tls`` the client's ``fs.tls`` context (``LeaseFSClient.tls``).

    Returns one status per address (``fs.datatransfer`` SUCCESS, ERROR, ERROR_CHECKSUM):
    every node ERROR when the first node cannot be reached, breaks or stays silent.
    Raises the first node's refusal of the request itself (``InvalidToken``,
    ``ProtocolError`` for a bad header, ``ServerBusy``) as the error it answered."""
    if not addresses:
        raise ValueError("send_patch needs at least one address")
    header = patch_header(block_id, gs, new_gs, max_length, addresses[1:], ranges, token,
                          client_name)
    payload = b"".join(bytes(data) for _, data in ranges)
    # as a chain's own waits: the first node may wait data_timeout for each node below it
    wait = timeout if timeout is not None else config.data_timeout * (len(addresses) + 1)
    failed = [ERROR] * len(addresses)
    try:
        framed = await open_data_connection(addresses[0], config.data_connect_timeout,
                                            config.max_frame, tls)
    except ServerUnavailable:
        return failed
    try:
        with trio.fail_after(wait):
            await framed.send_all(encode_frame(header) + payload)
            response = await framed.receive_frame()
    except (LeaseFSError, EOFError, OSError, trio.TooSlowError, trio.BrokenResourceError):
        return failed   # the node broke or stayed silent: its status, not an exception
    finally:
        await close_quietly(framed)
    statuses = response.get("statuses") if isinstance(response, dict) else None
    if not (isinstance(statuses, list) and len(statuses) == len(addresses)
            and all(s in (SUCCESS, ERROR, ERROR_CHECKSUM) for s in statuses)):
        raise response_error(response, f"PATCH_BLOCK blk_{block_id}_{gs} at {addresses[0]}")
    return statuses


__all__ = ["patch_header", "send_patch"]
