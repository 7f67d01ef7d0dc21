"""The block server's one-shot small-block write (WRITE_BLOCK_ONESHOT, docs/PROTOCOL.md §3):
a block whose whole content the writer held when the block was allocated arrives as one
message — the op header and the block's single LAST packet — and is answered once.

Why it exists: a small file's block through the pipeline write (``storage.transfer``) costs
a setup round trip before any data, three tasks per node (receiver, disk writer,
responder), a thread hop per step (create, write, finalize) and a "receiving" report; at a
few KiB that machinery, not the bytes, is what a block server spends its CPU on. Here each
node, in the connection's own task: reads the packet (limits checked before the payload is
read, the server's ``ByteBudget`` held for it), verifies its checksums, forwards header and
packet to ``targets[0]`` in one send (with ``targets[1:]``), creates, writes and finalizes
the replica in ONE worker-thread hop (``ReplicaStore.create_finalized``: RBW → FINALIZED
through the state table, the files and meta layout of any replica, fsync per
``sync_on_close``), queues the FINALIZED report (no RBW report), then waits for the
downstream's answer and answers upstream: the setup response a WRITE_BLOCK would have sent
and the ack of the packet, ``[own status] + downstream statuses``, in one send. The
downstream works on its copy while this node writes, so the nodes' disk work overlaps.

Failures are answered, never raised past the connection: a block access token that does not
let this write (security = secure) is refused with ``InvalidToken`` before the packet is
read; a bad header or packet header (oversized, not one LAST packet at offset 0, too slow)
gets an error response before anything is created; a checksum error acks ``ERROR_CHECKSUM`` for this node (nothing
written, nothing forwarded); a local write that fails acks ``ERROR`` for this node; a
downstream that cannot be reached, refuses, breaks or stays silent for ``data_timeout`` is
acked ``ERROR`` at its index. The writer treats any failure as a failed pipeline setup
(abandons the block, excludes the node — not for a refused token — takes a new block); replicas already finalized of the
abandoned block are invalidated by the metadata server as for any abandoned block.

Concurrency contract: runs in the task that serves the connection, on the trio thread; the
only blocking work is the one ``create_finalized`` call in a worker thread. The op owns its
connection and the downstream connection it opens (closed here before returning).
"""

from __future__ import annotations

import logging

import trio

from fs import blocktoken
from fs.datatransfer import (ACK_HEADER, CHECKSUM_SIZE, ERROR, ERROR_CHECKSUM, FLAG_LAST,
                             MAX_PACKET_DATA, PACKET_HEADER, SUCCESS, WRITE_BLOCK_ONESHOT,
                             encode_ack, num_chunks, verify_checksums)
from fs.dataconn import failure_cause
from fs.errors import ChecksumError, LeaseFSError, ProtocolError, ServerBusy
from fs.framing import FramedStream, encode_frame

from .chain import forward
from .opheader import block_ref, bytes_per_checksum, write_targets
from .replica_states import ReplicaState

log = logging.getLogger(__name__)

OP = WRITE_BLOCK_ONESHOT
#: the response that precedes the ack: the op was taken (what a WRITE_BLOCK setup answers)
_TAKEN = encode_frame({"status": "SUCCESS", "message": "", "first_bad_link": ""})


async def write_oneshot(server, conn, header: dict, *, corruption) -> None:
    """Serve one WRITE_BLOCK_ONESHOT on ``conn`` (the data-transfer server's connection:
    ``framed``, ``peer``, ``responded``, ``drained``) for ``server`` (its ``config``, ``store``,
    ``reporter``, ``budget``, ``oneshot_writes``, ``stats``, ``check_token``). ``corruption``: the test-only in-flight
    corruption hook of ``storage.transfer``. Raises what the caller answers as an error
    response (a bad header or packet header) before anything was created."""
    config = server.config
    block_id, gs = block_ref(header, OP)
    targets = write_targets(header, OP)
    bpc = bytes_per_checksum(header, block_id, OP, config)
    # a write token for this block and stamp (security = secure), before the packet is
    # even read; the header (and so the token) goes downstream unchanged
    server.check_token(header, block_id, gs, OP, blocktoken.WRITE)
    name = f"blk_{block_id}_{gs}"
    framed: FramedStream = conn.framed
    with trio.move_on_after(config.data_timeout) as slow:
        raw = await framed.receive_exactly(PACKET_HEADER.size)
    if slow.cancelled_caught:
        raise ProtocolError(f"{OP} {name}: no packet within {config.data_timeout:g} s")
    seqno, offset, data_len, flags = PACKET_HEADER.unpack(raw)
    if data_len > MAX_PACKET_DATA:
        raise ProtocolError(f"{OP} {name}: packet claims {data_len} bytes, more than "
                            f"{MAX_PACKET_DATA}")
    if offset != 0 or flags != FLAG_LAST:
        raise ProtocolError(f"{OP} {name}: the packet must be the block's only one (offset 0, "
                            f"flags LAST), got offset {offset}, flags {flags:#x}")
    with trio.move_on_after(config.data_timeout) as slow:
        await server.budget.acquire(data_len)   # held until the op is answered
    if slow.cancelled_caught:
        raise ServerBusy(f"{OP} {name}: no buffer room for {data_len} bytes within "
                         f"{config.data_timeout:g} s")
    try:
        with trio.move_on_after(config.data_timeout) as slow:
            sums = await framed.receive_exactly(CHECKSUM_SIZE * num_chunks(data_len, bpc))
            data = await framed.receive_exactly(data_len)
        if slow.cancelled_caught:
            raise ProtocolError(f"{OP} {name}: the packet's {data_len} bytes did not arrive "
                                f"within {config.data_timeout:g} s")
        server.oneshot_writes += 1
        if data_len and corruption.due():
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        try:
            verify_checksums(data, sums, bpc, where=f"in {name} from {conn.peer}")
        except ChecksumError as exc:   # nothing written, nothing forwarded
            server.stats.checksum_errors += 1
            log.warning("%s %s: %s", OP, name, exc)
            await _answer(conn, seqno, [ERROR_CHECKSUM])
            return
        downstream = None
        try:
            if targets:
                downstream = await forward(config, OP, header, targets, raw + sums + data, name)
            own = await _write_locally(server, block_id, gs, bpc, data, sums, name)
            down = []
            if targets:
                down = await _downstream_statuses(config, downstream, targets, seqno, name)
        finally:
            if downstream is not None:
                with trio.CancelScope(shield=True):
                    await downstream.aclose()
    finally:
        server.budget.release(data_len)
    await _answer(conn, seqno, [own] + down)
    conn.drained = True   # the message was read whole: nothing unread to cause an RST


async def _answer(conn, seqno: int, statuses: list[int]) -> None:
    conn.responded = True
    await conn.framed.send_all(_TAKEN + encode_ack(seqno, statuses))


async def _write_locally(server, block_id: int, gs: int, bpc: int, data, sums: bytes,
                         name: str) -> int:
    """This node's status after creating, writing and finalizing its replica."""
    try:
        replica = await server.store.create_finalized(block_id, gs, bpc, data, sums)
    except LeaseFSError as exc:   # the replica's state refuses it: the writer's problem
        log.warning("%s %s: refused: %s", OP, name, exc)
        return ERROR
    except OSError as exc:        # the disk: this server's problem
        log.error("%s %s: local write failed: %s", OP, name, exc)
        return ERROR
    server.stats.bytes_written += replica.num_bytes
    server.reporter.block_received(block_id, gs, replica.num_bytes,
                                   ReplicaState.FINALIZED.value)
    return SUCCESS


async def _downstream_statuses(config, downstream: FramedStream | None, targets: list[str],
                               seqno: int, name: str) -> list[int]:
    """The downstream's statuses from its answer; ``[ERROR]`` (blaming it) when it cannot
    be reached, refused, broke, or did not answer within ``data_timeout`` per node down."""
    if downstream is None:
        return [ERROR]
    try:
        # each node further down may wait as long for its own downstream
        with trio.fail_after(config.data_timeout * len(targets)):
            response = await downstream.receive_frame()
            if not isinstance(response, dict) or response.get("status") != "SUCCESS":
                message = response.get("message") if isinstance(response, dict) else response
                raise ProtocolError(f"refused: {message!r:.200}")
            ack_seqno, n = ACK_HEADER.unpack(await downstream.receive_exactly(ACK_HEADER.size))
            statuses = list(await downstream.receive_exactly(n))
        if ack_seqno != seqno or not statuses:
            raise ProtocolError(f"acked packet {ack_seqno} with {len(statuses)} statuses, "
                                f"expected packet {seqno}")
        return statuses
    except (EOFError, LeaseFSError, trio.TooSlowError) as exc:
        log.warning("%s %s: the downstream failed: %s", OP, name,
                    failure_cause(exc, config.data_timeout * len(targets)))
        return [ERROR]
