"""Copy a finalized replica from this block server to others (the TRANSFER command of the
replication monitor; HDFS ``DataNode.DataTransfer``).

Why it exists: re-replication and decommission need block servers to copy replicas among
themselves; the metadata server only says "copy block B to targets T" in a heartbeat reply.
The copy reuses the ordinary write pipeline: this node plays the client and sends a
WRITE_BLOCK (stage ``TRANSFER_FINALIZED``) to ``targets[0]`` with ``targets[1:]`` downstream,
so every target verifies the checksums, finalizes on the LAST packet and reports the replica
received itself, exactly as for a client write. The header carries the copy token of the
metadata server's command (security = secure): each target checks it, so nobody else can
have a block server write a replica. The source verifies every chunk it reads
first: a replica whose bytes do not match their checksums is never copied, and is reported
bad (``ChecksumError``) so the metadata server picks another source.

``send_replica`` is also the sender of pipeline recovery's TRANSFER_RBW (``storage.transfer``).

Concurrency contract: ``copy_replica`` runs as one trio task per command; disk reads go to
the store's worker threads; a sender and an ack reader run side by side so the pipeline
stays full. Everything is bounded by ``data_timeout``.
"""

from __future__ import annotations

import logging

import trio

from fs import tls as tlsmod
from fs.config import Config
from fs.datatransfer import (CHECKSUM_SIZE, FLAG_LAST, SUCCESS, TRANSFER_FINALIZED, WRITE_BLOCK,
                             crc32c, op_header, receive_ack, send_packet, verify_checksums)
from fs.dataconn import open_data_connection
from fs.errors import LeaseFSError, ProtocolError, ServerUnavailable

from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)

HEADER_MAX_FRAME = 1 << 20


async def copy_replica(config: Config, store: ReplicaStore, block_id: int, gs: int,
                       targets: list[str], *, client: str = "transfer",
                       token: dict | None = None) -> int:
    """Send the finalized replica ``blk_<id>_<gs>`` to ``targets`` (a pipeline), showing them
    ``token`` (the command's copy token); returns the bytes sent. Raises ``ChecksumError`` when the local replica is corrupt, ``LeaseFSError``
    (``ServerUnavailable``, ``ProtocolError``) when a target fails."""
    replica = store.readable(block_id, gs)
    if replica.state is not ReplicaState.FINALIZED or replica.gs != gs:
        raise ProtocolError(f"TRANSFER blk_{block_id}_{gs}: local replica is "
                            f"{replica.state.value} with stamp {replica.gs}, not finalized "
                            f"with {gs}")
    reader = await store.open_reader(block_id, gs)
    try:
        return await send_replica(config, store, reader, block_id, gs, reader.visible_length,
                                  targets, stage=TRANSFER_FINALIZED, client=client, token=token)
    finally:
        with trio.CancelScope(shield=True):
            await store.close_reader(reader)


class NativeLink:
    """How a copy reaches its target on leasefs's own data-transfer port: the WRITE_BLOCK
    header frame (with the copy ``token``), its packets and acks. ``storage.hdfs.xfer``
    has HDFS's twin, for a copy Hadoop's client asked for on the HDFS port."""

    def __init__(self, token: dict | None = None):
        self.token = token

    @staticmethod
    async def connect(config: Config, target: str, block_id: int):
        try:
            return await open_data_connection(target, config.data_connect_timeout,
                                              HEADER_MAX_FRAME, tlsmod.client(config))
        except LeaseFSError as exc:   # unreachable, or TLS refused
            raise ServerUnavailable(f"copy of blk_{block_id}: {exc}") from None

    async def setup(self, framed, targets: list[str], block_id: int, gs: int, *, stage: str,
                    client: str, bytes_per_checksum: int, length: int) -> None:
        """The WRITE_BLOCK setup, answered SUCCESS (else ``ServerUnavailable``)."""
        header = op_header(WRITE_BLOCK, block={"id": block_id, "gs": gs},
                           targets=list(targets[1:]), stage=stage, client=client,
                           bytes_per_checksum=bytes_per_checksum)
        if self.token is not None:
            header["token"] = self.token
        await framed.send_frame(header)
        response = await framed.receive_frame()
        if not isinstance(response, dict) or response.get("status") != "SUCCESS":
            message = response.get("message") if isinstance(response, dict) else response
            raise ServerUnavailable(f"copy of blk_{block_id}: {targets[0]} refused it: "
                                    f"{message!s:.300}")

    send_packet = staticmethod(send_packet)
    receive_ack = staticmethod(receive_ack)


async def send_replica(config: Config, store: ReplicaStore, reader, block_id: int, gs: int,
                       length: int, targets: list[str], *, stage: str, client: str,
                       token: dict | None = None, link=None) -> int:
    """Stream ``[0, length)`` of an open replica ``reader`` into a WRITE_BLOCK ``stage`` of
    block ``block_id`` at stamp ``gs`` on ``targets[0]`` (``targets[1:]`` downstream), with
    the copy ``token`` (None: security = simple); the one sender of every block-server-side
    copy: re-replication (``TRANSFER_FINALIZED``, finalized replicas) and pipeline recovery
    (``TRANSFER_RBW``, the acknowledged part of a replica being written). Every chunk is
    verified before it is sent (``ChecksumError`` for a corrupt source); when ``length`` ends
    inside a chunk whose stored checksum covers more bytes, that checksum is recomputed for
    the bytes sent. ``link``: the target's port (default ``NativeLink(token)``). Returns
    ``length``."""
    bpc = reader.bytes_per_checksum
    timeout = config.data_timeout
    link = link or NativeLink(token)
    send, receive = link.send_packet, link.receive_ack
    framed = await link.connect(config, targets[0], block_id)
    try:
        with trio.fail_after(timeout):
            await link.setup(framed, targets, block_id, gs, stage=stage, client=client,
                             bytes_per_checksum=bpc, length=length)
        step = max(bpc, config.packet_size // bpc * bpc)
        offsets = list(range(0, length, step))
        last_seqno = len(offsets)

        async def sender():
            for seqno, pos in enumerate(offsets):
                end = min(pos + step, length)
                data, sums = await store.run_io(reader.read, pos, end - pos)
                if end % bpc and end != reader.visible_length:
                    # the stored checksum covers a longer chunk than is being sent
                    tail = data[len(data) - end % bpc:]
                    sums = sums[:-CHECKSUM_SIZE] + crc32c(tail).to_bytes(CHECKSUM_SIZE, "big")
                verify_checksums(data, sums, bpc, f"in blk_{block_id}_{gs} on the source", pos)
                with trio.fail_after(timeout):
                    await send(framed, seqno, pos, data, sums, 0)
            with trio.fail_after(timeout):
                await send(framed, last_seqno, length, b"", b"", FLAG_LAST)

        async def acker():
            expected = 0
            while expected <= last_seqno:
                with trio.fail_after(timeout):
                    seqno, statuses = await receive(framed)
                if seqno != expected:
                    raise ProtocolError(f"copy of blk_{block_id}: ack {seqno}, expected "
                                        f"{expected}")
                bad = [targets[i] for i, s in enumerate(statuses[:len(targets)])
                       if s != SUCCESS]
                if bad:
                    raise ServerUnavailable(f"copy of blk_{block_id}: target(s) "
                                            f"{', '.join(bad)} failed (statuses {statuses})")
                expected += 1

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender)
                nursery.start_soon(acker)
        except BaseExceptionGroup as group:   # one clear error, not a group
            first = group.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
    except (trio.TooSlowError, EOFError) as exc:
        raise ServerUnavailable(f"copy of blk_{block_id} to {targets[0]}: "
                                f"{type(exc).__name__} {exc}") from None
    finally:
        with trio.CancelScope(shield=True):
            await framed.aclose()
    return length


__all__ = ["copy_replica", "send_replica", "NativeLink", "LeaseFSError"]
