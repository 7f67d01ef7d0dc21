"""The block server's PATCH_BLOCK op (docs/PROTOCOL.md §3): byte ranges written into a
FINALIZED replica under a new generation stamp, one message forwarded down a chain of
replica holders and answered once.

Why it exists: files are append-only, but their lease holder may rewrite ranges of a block
that is already finalized (a patch). Each holder makes the new version of its replica
crash-atomically (``ReplicaStore.patch_finalized``, ``storage/patching.py``) under the new
stamp the metadata server handed out; a holder that misses it keeps the old stamp and is
repaired by the metadata server as any stale replica.

The message: the op header frame (``block`` {id, gs: the replica's current stamp},
``new_gs``, ``max_length`` (the file's block size), ``targets`` (the rest of the chain),
``token`` (a WRITE token for the block and the NEW stamp), ``ranges`` [[offset, length]...]
and ``crcs`` (the CRC32C of each range's bytes: transport integrity)), then the ranges'
bytes concatenated, raw. Each node, in the connection's own task: checks the header and the
token before reading the payload (total length at most ``MAX_PACKET_DATA``, at most
``MAX_RANGES`` ranges, the server's ``ByteBudget`` held for it, ``data_timeout`` for a slow
sender), verifies the crcs (a mismatch: this node answers ``ERROR_CHECKSUM``, applies and
forwards nothing), forwards header (with ``targets[1:]``) and payload to ``targets[0]`` in
one send, patches its replica in one worker-thread hop, queues the FINALIZED report at the
new stamp, waits for the downstream's answer and answers upstream ONE frame::

    {"status": "SUCCESS" | "ERROR", "message": str, "statuses": [own, *downstream]}

``statuses`` always has ``1 + len(targets)`` entries (``fs.datatransfer`` SUCCESS, ERROR,
ERROR_CHECKSUM); a downstream that cannot be reached, refuses, breaks or stays silent is
ERROR at its index and for every node after it. A bad header, a refused token, a payload
that does not arrive get the error response every op gets (``storage.opheader``), before
anything changed.

Concurrency contract: runs in the task that serves the connection, on the trio thread; the
only blocking work is the one ``patch_finalized`` hop in a worker thread. The op owns its
connection and the downstream connection it opens (closed here before returning).
"""

from __future__ import annotations

import logging

import trio

from fs import blocktoken
from fs.datatransfer import ERROR, ERROR_CHECKSUM, MAX_PACKET_DATA, PATCH_BLOCK, SUCCESS, crc32c
from fs.dataconn import failure_cause
from fs.errors import LeaseFSError, ProtocolError, ServerBusy
from fs.framing import FramedStream

from .chain import forward
from .opheader import block_ref, field, write_targets
from .replica_states import ReplicaState

log = logging.getLogger(__name__)

OP = PATCH_BLOCK
#: most ranges one patch may carry
MAX_RANGES = 4096


def patch_ranges(header: dict, name: str) -> tuple[list[tuple[int, int]], list[int]]:
    """``([(offset, length)], crcs)`` of the header: sorted, not overlapping, none empty,
    at most ``MAX_RANGES``, their bytes at most ``MAX_PACKET_DATA``; ``ProtocolError``."""
    ranges = field(header, "ranges", list, OP)
    crcs = field(header, "crcs", list, OP)
    if not ranges or len(ranges) > MAX_RANGES:
        raise ProtocolError(f"{OP} {name}: 1 to {MAX_RANGES} ranges, got {len(ranges)}")
    if len(crcs) != len(ranges):
        raise ProtocolError(f"{OP} {name}: {len(crcs)} crcs for {len(ranges)} ranges")
    out, end, total = [], -1, 0
    for item, crc in zip(ranges, crcs):
        if not (isinstance(item, list) and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
                and isinstance(crc, int) and not isinstance(crc, bool)
                and 0 <= crc < 1 << 32):
            raise ProtocolError(f"{OP} {name}: a range must be [offset, length] of ints with "
                                f"a 32-bit crc, got {item!r:.80} / {crc!r:.20}")
        offset, length = item
        if offset < 0 or length <= 0 or offset < end:
            raise ProtocolError(f"{OP} {name}: range [{offset}, {offset + length}) is empty, "
                                f"negative, out of order or overlapping")
        end = offset + length
        total += length
        if total > MAX_PACKET_DATA:
            raise ProtocolError(f"{OP} {name}: the ranges hold more than {MAX_PACKET_DATA} "
                                f"bytes")
        out.append((offset, length))
    return out, [int(c) for c in crcs]


async def serve_patch(server, conn, header: dict) -> None:
    """Serve one PATCH_BLOCK on ``conn`` (the data-transfer server's connection) for
    ``server`` (its ``config``, ``store``, ``reporter``, ``budget``, ``stats``,
    ``check_token``). Raises what the caller answers as an error response (a bad header,
    a refused token, a payload that did not arrive) before anything changed."""
    config = server.config
    block_id, gs = block_ref(header, OP)
    name = f"blk_{block_id}_{gs}"
    new_gs = field(header, "new_gs", int, OP)
    max_length = field(header, "max_length", int, OP)
    if new_gs <= gs or max_length <= 0:
        raise ProtocolError(f"{OP} {name}: new_gs {new_gs} must be above {gs} and max_length "
                            f"{max_length} positive")
    targets = write_targets(header, OP)
    ranges, crcs = patch_ranges(header, name)
    if ranges[-1][0] + ranges[-1][1] > max_length:
        raise ProtocolError(f"{OP} {name}: the ranges end past max_length {max_length}")
    # a write token for the NEW stamp, before the payload is even read; the header (and so
    # the token) goes downstream unchanged
    server.check_token(header, block_id, new_gs, OP, blocktoken.WRITE)
    total = sum(length for _, length in ranges)
    with trio.move_on_after(config.data_timeout) as slow:
        await server.budget.acquire(total)   # held until the op is answered
    if slow.cancelled_caught:
        raise ServerBusy(f"{OP} {name}: no buffer room for {total} bytes within "
                         f"{config.data_timeout:g} s")
    framed: FramedStream = conn.framed
    try:
        with trio.move_on_after(config.data_timeout) as slow:
            payload = await framed.receive_exactly(total)
        if slow.cancelled_caught:
            raise ProtocolError(f"{OP} {name}: the {total} bytes of the ranges did not arrive "
                                f"within {config.data_timeout:g} s")
        view, pieces, pos = memoryview(payload), [], 0
        for (offset, length), crc in zip(ranges, crcs):
            piece = view[pos:pos + length]
            if crc32c(piece) != crc:   # nothing applied, nothing forwarded
                server.stats.checksum_errors += 1
                log.warning("%s %s: range at %d from %s does not match its crc", OP, name,
                            offset, conn.peer)
                await _answer(conn, [ERROR_CHECKSUM] + [ERROR] * len(targets),
                              f"checksum error in the range at offset {offset}")
                return
            pieces.append((offset, bytes(piece)))
            pos += length
        downstream = None
        try:
            if targets:
                downstream = await forward(config, OP, header, targets, payload, name)
            own, message = await _patch_locally(server, block_id, gs, new_gs, max_length,
                                                pieces, name)
            down, down_message = [], ""
            if targets:
                down, down_message = await _downstream_statuses(config, downstream, targets,
                                                                name)
        finally:
            if downstream is not None:
                with trio.CancelScope(shield=True):
                    await downstream.aclose()
    finally:
        server.budget.release(total)
    await _answer(conn, [own] + down, "; ".join(m for m in (message, down_message) if m))
    conn.drained = True   # the message was read whole: nothing unread to cause an RST


async def _answer(conn, statuses: list[int], message: str) -> None:
    conn.responded = True
    ok = all(s == SUCCESS for s in statuses)
    await conn.framed.send_frame({"status": "SUCCESS" if ok else "ERROR", "message": message,
                                  "statuses": statuses})


async def _patch_locally(server, block_id: int, gs: int, new_gs: int, max_length: int,
                         pieces: list, name: str) -> tuple[int, str]:
    """This node's status (and why not SUCCESS) after patching its replica."""
    try:
        replica = await server.store.patch_finalized(block_id, gs, new_gs, pieces, max_length)
    except LeaseFSError as exc:   # the replica's state refuses it, or a corrupt old chunk
        log.warning("%s %s: refused: %s", OP, name, exc)
        return ERROR, f"{server.store.node_id}: {type(exc).__name__}: {exc}"
    except OSError as exc:        # the disk (a replica dropped as broken: the store told)
        log.error("%s %s: local patch failed: %s", OP, name, exc)
        return ERROR, f"{server.store.node_id}: disk error: {exc}"
    server.reporter.block_received(block_id, new_gs, replica.num_bytes,
                                   ReplicaState.FINALIZED.value)
    return SUCCESS, ""


async def _downstream_statuses(config, downstream: FramedStream | None, targets: list[str],
                               name: str) -> tuple[list[int], str]:
    """The downstream's ``len(targets)`` statuses and message from its answer; ERROR for it
    and every node after it when it cannot be reached, refused, broke, or did not answer
    within ``data_timeout`` per node down."""
    failed = [ERROR] * len(targets)
    if downstream is None:
        return failed, f"{targets[0]}: unreachable"
    wait = config.data_timeout * len(targets)
    try:
        with trio.fail_after(wait):   # each node further down may wait as long
            response = await downstream.receive_frame()
    except (EOFError, LeaseFSError, trio.TooSlowError) as exc:
        log.warning("%s %s: the downstream %s failed: %s", OP, name, targets[0],
                    failure_cause(exc, wait))
        return failed, f"{targets[0]}: {failure_cause(exc, wait)}"
    statuses = response.get("statuses") if isinstance(response, dict) else None
    message = response.get("message") if isinstance(response, dict) else None
    message = message if isinstance(message, str) else ""
    if not (isinstance(statuses, list) and len(statuses) == len(targets)
            and all(s in (SUCCESS, ERROR, ERROR_CHECKSUM) for s in statuses)):
        log.warning("%s %s: the downstream %s refused or answered garbage: %r", OP, name,
                    targets[0], response)
        return failed, f"{targets[0]}: {message or repr(response)[:200]}"
    return list(statuses), message
