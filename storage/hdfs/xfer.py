"""The block server's HDFS data-transfer port (DataTransferProtocol version 28): Hadoop's
client reads (READ_BLOCK) and writes (WRITE_BLOCK, a chained pipeline of block servers
that all speak it) the same replicas as leasefs's own port, through the same code.

Why it exists: Hadoop's client (Spark, FsShell) only knows HDFS's wire. The replicas,
their stored CRC32C chunks, generation stamps, block reports and the write pipeline's
receiver, disk writer and responder are ``storage.transfer``'s; this module only speaks
the other framing (``fs.hdfs.datatransfer``).

* READ_BLOCK answers SUCCESS with the replica's own checksum chunking (no recomputation:
  the stored CRCs go out), sends packets from the chunk boundary at or below ``offset`` to
  the chunk end at or past ``offset + len`` (capped at the visible length), then the empty
  last packet, reads the client's read status, and waits ``KEEPALIVE`` seconds for the
  next op on the same connection (Hadoop's client pools its sockets; it closes one it does
  not reuse, which is normal).
* WRITE_BLOCK (stages CREATE, APPEND and the recoveries: STREAMING, APPEND, CLOSE)
  creates or reopens the RBW
  replica at the client's bytesPerChecksum, sets up the rest of the pipeline over this
  protocol (``targets`` carry each node's HDFS port), answers, then runs
  ``storage.transfer.WritePipeline`` with HDFS's packets and acks (``HdfsWire``): acks
  carry this node's status first, then the downstream's; a bad checksum is ERROR_CHECKSUM
  in this node's slot; the last packet finalizes and reports the replica before its ack.
* A connection that opens with SASL's magic number is refused with an error message;
  security = secure checks each op's block token (``fs.hdfs.tokens``) as the leasefs port
  does.

Concurrency contract: one trio task per connection, ops in turn on it; disk work through
the store's worker threads. A peer's mistake is answered with an error response and the
connection closed; it never escapes the connection.
"""

from __future__ import annotations

import logging
import math
import time
import trio

from fs import blocktoken
from fs.dataconn import close_gracefully, failure_cause
from fs.datatransfer import FLAG_HEARTBEAT, FLAG_LAST, FLAG_SYNC, Packet
from fs.errors import (InvalidArgument, InvalidToken, LeaseFSError, NotSupported,
                       ProtocolError, ServerUnavailable)
from fs.framing import FramedStream
from fs.hdfs import datatransfer as hdt
from fs.hdfs import tokens
from fs.hdfs.pb import datatransfer_pb2 as dt
from fs.rpc import parse_address


log = logging.getLogger(__name__)

#: seconds a kept-alive connection waits for its next op (HDFS's DataNode waits 4 s; the
#: client drops pooled sockets after 3 s)
KEEPALIVE = 4.0
#: data bytes per READ_BLOCK packet: few, large packets (Hadoop's client takes up to 16 MiB)
READ_PACKET = 4 << 20
#: data bytes up to which a packet is copied into a single send
_JOINED_SEND = 256 << 10
#: the op names this port's ops are counted under in the block server's metrics
METRIC_OPS = frozenset({"HDFS_READ_BLOCK", "HDFS_WRITE_BLOCK"})

Stage = hdt.Stage
_SETUP_STAGES = {Stage.PIPELINE_SETUP_CREATE, Stage.PIPELINE_SETUP_STREAMING_RECOVERY,
                 Stage.PIPELINE_SETUP_APPEND, Stage.PIPELINE_SETUP_APPEND_RECOVERY,
                 Stage.PIPELINE_CLOSE_RECOVERY}


class HdfsWire:
    """HDFS's packets and acks for a ``WritePipeline``, in leasefs's ``Packet`` record."""

    #: the last packet is acked once the finalized replica was reported (bounded: a metadata
    #: server that does not answer delays the ack no longer), so that Hadoop's client's
    #: ``complete`` answers true at its first call instead of sleeping 400 ms and asking again
    report_wait = 5.0

    async def receive_packet(self, pipeline) -> Packet:
        """The next packet from ``pipeline``'s upstream (a ``storage.transfer.
        WritePipeline``); a malformed one is a ``ProtocolError``, acked ERROR."""
        packet = await hdt.receive_packet(pipeline.upstream, pipeline.replica.bytes_per_checksum,
                                          reserve=pipeline.reserve)
        flags = ((FLAG_LAST if packet.last else 0) | (FLAG_SYNC if packet.sync else 0)
                 | (FLAG_HEARTBEAT if packet.heartbeat else 0))
        return Packet(packet.seqno, max(packet.offset, 0), packet.data, packet.sums, flags)

    async def send_packets(self, framed: FramedStream, packets: list[Packet]) -> None:
        """Small packets (Hadoop's client's are 64 KiB) joined into one send: a copy costs
        less than a trip through trio and the kernel per packet."""
        joined: list = []
        for packet in packets:
            parts = hdfs_packet(packet.seqno, packet.offset, packet.data, packet.sums,
                                packet.flags)
            if len(packet.data) > _JOINED_SEND:
                if joined:
                    await framed.send_all(b"".join(joined))
                    joined.clear()
                for part in parts:
                    await framed.send_all(part)
            else:
                joined.extend(parts)
        if joined:
            await framed.send_all(b"".join(joined))

    def encode_ack(self, seqno: int, statuses) -> bytes:
        return hdt.encode_ack(seqno, statuses)

    async def receive_ack(self, framed: FramedStream) -> tuple[int, list[int]]:
        return await hdt.receive_ack(framed)


def hdfs_packet(seqno: int, offset: int, data, sums: bytes, flags: int) -> list:
    return hdt.encode_packet(offset, seqno, data, sums, last=bool(flags & FLAG_LAST),
                             sync=bool(flags & FLAG_SYNC))


async def send_hdfs_packet(framed: FramedStream, seqno: int, offset: int, data, sums: bytes,
                           flags: int) -> None:
    """One packet: a small one in one send (a copy costs less than a second trip through
    trio and the kernel), a large one's data as is."""
    parts = hdfs_packet(seqno, offset, data, sums, flags)
    if len(data) <= _JOINED_SEND:
        await framed.send_all(b"".join(parts))
        return
    for part in parts:
        await framed.send_all(part)


async def _send_unchecked(framed, seqno, offset, data, sums, flags) -> None:
    """sendChecksums = false: the same packets without their checksums."""
    await send_hdfs_packet(framed, seqno, offset, data, b"", flags)


def _status_of(exc: LeaseFSError) -> int:
    if isinstance(exc, InvalidToken):
        return hdt.Status.ERROR_ACCESS_TOKEN
    if isinstance(exc, NotSupported):
        return hdt.Status.ERROR_UNSUPPORTED
    return hdt.Status.ERROR


class _Op:
    """One op on a connection: whether its response went out (errors after it are not
    answered with another)."""

    def __init__(self, framed: FramedStream, peer: str, name: str):
        self.framed = framed
        self.peer = peer
        self.name = name
        self.responded = False

    async def respond(self, message: bytes) -> None:
        self.responded = True
        await self.framed.send_all(message)


class HdfsDataTransfer:
    """Serves HDFS data-transfer connections over a ``storage.transfer.DataTransferServer``
    (its replica store, token check, write pipeline and block reports)."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.store = transfer.store
        self.config = transfer.config
        self.wire = HdfsWire()

    async def handle(self, stream: trio.abc.Stream, peer: str = "?") -> None:
        framed = FramedStream(stream, hdt.MAX_MESSAGE)
        self.transfer.active_ops += 1
        try:
            wait = self.config.idle_timeout
            while True:
                prefix = None
                with trio.move_on_after(wait):
                    try:
                        prefix = await framed.receive_exactly(hdt.OP_PREFIX.size)
                    except (EOFError, ServerUnavailable):
                        pass
                if prefix is None or not await self._serve_op(framed, peer, prefix):
                    return
                wait = KEEPALIVE
        finally:
            self.transfer.active_ops -= 1
            await close_gracefully(framed)

    async def _serve_op(self, framed: FramedStream, peer: str, prefix: bytes) -> bool:
        """One op; True when the connection may carry the next one."""
        version, code = hdt.OP_PREFIX.unpack(prefix)
        op = _Op(framed, peer, hdt.OP_NAMES.get(code, f"op {code}"))
        started = time.perf_counter()
        result = "ok"
        try:
            if prefix == b"\xde\xad\xbe" and await framed.receive_exactly(1) == b"\xef":
                op.name = "SASL"
                raise NotSupported(
                    "this block server takes no SASL handshake on its HDFS data-transfer "
                    "port: set dfs.data.transfer.protection unset and "
                    "hadoop.security.authentication=simple on the client, or use leasefs's "
                    "own client")
            hdt.parse_op_prefix(prefix)
            if code == hdt.READ_BLOCK:
                request = await self._request(framed, dt.OpReadBlockProto)
                return await self._read_block(op, request)
            if code == hdt.WRITE_BLOCK:
                request = await self._request(framed, dt.OpWriteBlockProto)
                await self._write_block(op, request)
                return False
            raise NotSupported(f"data-transfer {op.name} is not supported by this block server")
        except (EOFError, ServerUnavailable) as exc:
            result = "peer_gone"
            log.debug("HDFS %s from %s: peer went away: %s", op.name, peer, exc)
        except LeaseFSError as exc:
            result = type(exc).__name__
            log.info("HDFS %s from %s refused: %s", op.name, peer, exc)
            await self._error(op, _status_of(exc), str(exc))
        except OSError as exc:   # the disk, not the peer
            result = "disk_error"
            log.warning("HDFS %s from %s: disk error: %s", op.name, peer, exc)
            await self._error(op, hdt.Status.ERROR,
                              f"{op.name}: disk error on the block server: {exc}")
        except Exception as exc:   # a bug: keep serving everybody else
            result = "InternalError"
            log.exception("HDFS %s from %s failed", op.name, peer)
            await self._error(op, hdt.Status.ERROR,
                              f"{op.name}: internal error: {type(exc).__name__}: {exc}")
        finally:
            if self.transfer.op_observer is not None:
                self.transfer.op_observer(f"HDFS_{op.name}", result,
                                          time.perf_counter() - started)
        return False

    async def _request(self, framed: FramedStream, cls):
        with trio.move_on_after(self.config.idle_timeout):
            return await hdt.receive_delimited(framed, cls)
        raise ProtocolError(f"no complete {cls.__name__} within {self.config.idle_timeout:g} s")

    @staticmethod
    async def _error(op: _Op, status: int, message: str) -> None:
        if op.responded:
            return
        if op.name == "SASL":
            answer = hdt.delimited(dt.DataTransferEncryptorMessageProto(
                status=dt.DataTransferEncryptorMessageProto.ERROR, message=message))
        else:
            answer = hdt.response(status, message)
        try:
            await op.respond(answer)
        except ServerUnavailable:
            pass

    def _check_token(self, header: dt.ClientOperationHeaderProto, block_id: int, gs: int,
                     op: str, mode: str) -> None:
        """security = secure: the op's token must be a leasefs block token for this block,
        stamp and mode (the leasefs port's own check)."""
        if self.transfer.node_key is None:
            return
        base = header.baseHeader
        try:
            token = tokens.from_proto(base.token) if base.HasField("token") else None
        except InvalidToken:
            self.transfer.stats.token_refusals += 1
            raise
        self.transfer.check_token({"token": token}, block_id, gs, op, mode)

    # ------------------------------------------------------------------ READ_BLOCK

    async def _read_block(self, op: _Op, request: dt.OpReadBlockProto) -> bool:
        block = request.header.baseHeader.block
        block_id, gs = block.blockId, block.generationStamp
        self._check_token(request.header, block_id, gs, op.name, blocktoken.READ)
        try:
            reader = await self.store.open_reader(block_id, gs)
        except OSError as exc:
            await self.transfer.reporter.replica_lost(block_id, gs, exc)
            raise
        try:
            return await self._send_range(op, reader, request)
        except OSError as exc:
            await self.transfer.reporter.replica_lost(block_id, gs, exc)
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.store.close_reader(reader)

    async def _send_range(self, op: _Op, reader, request: dt.OpReadBlockProto) -> bool:
        visible, bpc = reader.visible_length, reader.bytes_per_checksum
        offset, length = request.offset, request.len
        if offset + length > visible:
            raise InvalidArgument(
                f"READ_BLOCK blk_{reader.block_id}: range [{offset}, {offset + length}) is "
                f"past the end of the {visible} visible bytes")
        start = offset - offset % bpc
        end = min(visible, math.ceil((offset + length) / bpc) * bpc) if length else start
        checked = request.sendChecksums
        await op.respond(hdt.response(hdt.Status.SUCCESS, readOpChecksumInfo=(
            dt.ReadOpChecksumInfoProto(
                checksum=dt.ChecksumProto(type=hdt.CRC32C if checked else hdt.NULL,
                                          bytesPerChecksum=bpc),
                chunkOffset=start))))
        sent = await self.transfer.send_block_range(
            op, reader, start, end, packet_size=max(READ_PACKET, self.config.packet_size),
            send=send_hdfs_packet if checked else _send_unchecked)
        if not sent:
            return False
        # the client's verdict when it read everything (it closes the socket otherwise)
        with trio.move_on_after(self.config.data_timeout):
            status = await hdt.receive_delimited(op.framed, dt.ClientReadStatusProto)
            if status.status not in (hdt.Status.SUCCESS, hdt.Status.CHECKSUM_OK):
                log.warning("READ_BLOCK blk_%d to %s: the client reports status %s",
                            reader.block_id, op.peer, dt.Status.Name(status.status))
            return True
        return False

    # ------------------------------------------------------------------ WRITE_BLOCK

    async def _write_block(self, op: _Op, request: dt.OpWriteBlockProto) -> None:
        block = request.header.baseHeader.block
        block_id, stage = block.blockId, request.stage
        if stage not in _SETUP_STAGES:
            raise NotSupported(f"WRITE_BLOCK stage {Stage.Name(stage)} is not supported")
        # the stamp the replica gets: the block's (create), the new one (recovery, append)
        gs = (block.generationStamp if stage == Stage.PIPELINE_SETUP_CREATE
              else request.latestGenerationStamp)
        self._check_token(request.header, block_id, gs, f"WRITE_BLOCK {Stage.Name(stage)}",
                          blocktoken.WRITE)
        checksum = request.requestedChecksum
        if checksum.type != hdt.CRC32C:
            raise NotSupported(f"WRITE_BLOCK blk_{block_id}: checksum type "
                               f"{checksum.type} asked; this block server keeps CRC32C")
        bpc = checksum.bytesPerChecksum
        min_bytes = request.minBytesRcvd
        if stage == Stage.PIPELINE_SETUP_CREATE:
            replica = await self.store.create_rbw(block_id, gs, bpc)
        elif stage == Stage.PIPELINE_SETUP_APPEND:
            replica = await self.store.reopen_for_append(block_id, gs, min_bytes, bpc)
        else:
            # streaming, append or close recovery: the replica, RBW or already FINALIZED
            # (a close whose last ack was lost), is cut to what every node acknowledged
            # and reopened under the new stamp; a close recovery's only packet is the last
            replica = await self.store.recover_rbw(block_id, gs, min_bytes, bpc)
            self.transfer.stats.streaming_recoveries += 1
        own_writer = replica.writer
        downstream: FramedStream | None = None
        try:
            if request.targets:
                downstream, bad_link, why = await self._connect_downstream(request)
                if downstream is None:
                    log.info("HDFS WRITE_BLOCK %s: downstream setup failed at %s: %s",
                             replica.name, bad_link, why)
                    if stage == Stage.PIPELINE_SETUP_CREATE:
                        await self.store.delete(replica)
                    else:   # keep the acknowledged data: only stop writing
                        await self.store.release_writer(replica)
                    await op.respond(hdt.response(
                        hdt.Status.ERROR, f"pipeline setup failed at {bad_link}: {why}",
                        firstBadLink=bad_link))
                    return
            self.transfer.report_receiving(block_id, gs, min_bytes)
            await op.respond(hdt.response(hdt.Status.SUCCESS, firstBadLink=""))
            await self.transfer.run_pipeline(op.framed, op.peer, downstream, replica,
                                             len(request.targets), self.wire)
        finally:
            if downstream is not None:
                with trio.CancelScope(shield=True):
                    await downstream.aclose()
            await self.transfer.release_own_writer(replica, own_writer)

    async def _connect_downstream(self, request: dt.OpWriteBlockProto):
        """``(stream, "", "")`` or ``(None, first bad link, why)``: the op goes on to the
        first target with the rest of the targets (the client's token unchanged)."""
        target = hdt.datanode_address(request.targets[0])
        forward = dt.OpWriteBlockProto()
        forward.CopyFrom(request)
        for name in ("targets", "targetStorageTypes", "targetPinnings", "targetStorageIds"):
            rest = list(getattr(request, name))[1:]
            forward.ClearField(name)
            getattr(forward, name).extend(rest)
        wait = self.config.data_timeout + self.config.data_ack_timeout_step * len(
            request.targets)
        framed = None
        try:
            host, port = parse_address(target)
            with trio.fail_after(self.config.data_connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
            framed = FramedStream(stream, hdt.MAX_MESSAGE)
            await framed.send_all(hdt.encode_op(hdt.WRITE_BLOCK, forward))
            with trio.fail_after(wait):
                answer = await hdt.receive_delimited(framed, dt.BlockOpResponseProto)
        except (OSError, LeaseFSError, EOFError, trio.TooSlowError) as exc:
            if framed is not None:
                await framed.aclose()
            return None, target, failure_cause(exc, wait)
        if answer.status == hdt.Status.SUCCESS:
            return framed, "", ""
        await framed.aclose()
        return None, answer.firstBadLink or target, answer.message or dt.Status.Name(
            answer.status)
