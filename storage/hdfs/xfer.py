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
  not reuse, which is normal). A range of one packet (Spark's footer and column-chunk
  reads) is read in one worker-thread hop and answered in one send; a longer one goes out
  with its data sent from the replica file by the kernel (``sendfile``), except over TLS.
* WRITE_BLOCK (stages CREATE, APPEND and the recoveries: STREAMING, APPEND, CLOSE)
  creates or reopens the RBW
  replica at the client's bytesPerChecksum, sets up the rest of the pipeline over this
  protocol (``targets`` carry each node's HDFS port), answers, then runs
  ``storage.transfer.WritePipeline`` with HDFS's packets and acks (``HdfsWire``): acks
  carry this node's status first, then the downstream's; a bad checksum is ERROR_CHECKSUM
  in this node's slot; the last packet finalizes and reports the replica before its ack.
  A reopened replica keeps its own chunk size: packets that are not in its whole chunks
  (an append's first, or all of a writer whose chunk is smaller) are re-chunked
  (``HdfsWire._rechunk``) after the writer's CRCs are checked.
* BLOCK_CHECKSUM answers, from the replica's stored chunk CRCs (``storage.blockchecksum``,
  as the leasefs port's op), the MD5 of the chunk CRCs (MD5CRC: the client MD5s those
  again, so it depends on bytesPerChecksum) or the CRC32C of the block's bytes
  (COMPOSITE_CRC: the client composes the file's CRC32C, what ``leasefs checksum`` prints).
* The same port answers Hadoop IPC (``datanode_ipc``: ``getReplicaVisibleLength`` for
  readers of a file being written): a connection's first bytes decide (``fs.hdfs.sniff``),
  so the advertised ``ipcPort`` is this port.
* A connection that opens with SASL's magic number is refused with an error message;
  security = secure checks each op's block token (``fs.hdfs.tokens``) as the leasefs port
  does.

Concurrency contract: one trio task per connection, ops in turn on it; disk work through
the store's worker threads. A peer's mistake is answered with an error response and the
connection closed; it never escapes the connection.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import trio

from fs import blocktoken
from fs.dataconn import close_gracefully, failure_cause
from fs.datatransfer import (CHECKSUM_SIZE, FLAG_HEARTBEAT, FLAG_LAST, FLAG_SYNC, Packet,
                             chunk_checksums, first_bad_chunk, num_chunks)
from fs.errors import (InvalidArgument, LeaseFSError, NotSupported,
                       ProtocolError, ServerUnavailable)
from fs.framing import FramedStream, plain_socket
from fs.hdfs import datatransfer as hdt
from fs.hdfs.ipc_server import IpcServer
from fs.hdfs.sniff import IPC, describe, sniff
from fs.hdfs.pb import datatransfer_pb2 as dt
from fs.rpc import parse_address

from .datanode_ipc import ClientDatanode, DatanodeIdentity, check_token


log = logging.getLogger(__name__)

#: seconds a kept-alive connection waits for its next op (HDFS's DataNode waits 4 s; the
#: client drops pooled sockets after 3 s)
KEEPALIVE = 4.0
#: data bytes per READ_BLOCK packet: few, large packets (Hadoop's client takes up to 16 MiB)
READ_PACKET = 4 << 20
#: data bytes up to which a packet is copied into a single send
_JOINED_SEND = 256 << 10
#: the op names this port's ops and IPC calls are counted under in the block server's
#: metrics
METRIC_OPS = frozenset({"HDFS_READ_BLOCK", "HDFS_WRITE_BLOCK", "HDFS_BLOCK_CHECKSUM",
                        "HDFS_TRANSFER_BLOCK"} | {f"HDFS_{m}" for m in ClientDatanode.CALLS})

Stage = hdt.Stage
_SETUP_STAGES = {Stage.PIPELINE_SETUP_CREATE, Stage.PIPELINE_SETUP_STREAMING_RECOVERY,
                 Stage.PIPELINE_SETUP_APPEND, Stage.PIPELINE_SETUP_APPEND_RECOVERY,
                 Stage.PIPELINE_CLOSE_RECOVERY, Stage.TRANSFER_RBW}


class HdfsWire:
    """HDFS's packets and acks for a ``WritePipeline``, in leasefs's ``Packet`` record.
    ``checksummed`` False: the writer asked for CHECKSUM_NULL (Spark's checkpoint files,
    written through FileContext with checksums disabled): its packets carry none, so this
    node computes the CRC32C every leasefs replica keeps, and forwards packets without them
    as the op downstream asks too."""

    #: the last packet is acked once the finalized replica was reported (bounded: a metadata
    #: server that does not answer delays the ack no longer), so that Hadoop's client's
    #: ``complete`` answers true at its first call instead of sleeping 400 ms and asking again
    report_wait = 5.0

    def __init__(self, checksummed: bool = True, writer_bpc: int | None = None):
        self.checksummed = checksummed
        #: the writer's chunk size when it is not the replica's (Hadoop's client appends at
        #: 512 to a replica leasefs wrote at 4096): its packets are checked at its own and
        #: written and forwarded re-chunked at the replica's
        self.writer_bpc = writer_bpc
        #: (start, bytes): what this pipeline received past the replica's last chunk
        #: boundary, the head of the next re-chunked packet (None: read it from disk)
        self.partial: tuple[int, bytes] | None = None

    async def receive_packet(self, pipeline, deadline: float) -> Packet:
        """The next packet from ``pipeline``'s upstream (a ``storage.transfer.
        WritePipeline``) by ``deadline`` (trio time; ``trio.TooSlowError``); a malformed
        one is a ``ProtocolError``, acked ERROR. A packet already received whole is taken
        without a cancel scope (``hdt.receive_packet``)."""
        bpc = pipeline.replica.bytes_per_checksum
        wbpc = self.writer_bpc or bpc

        async def reserve(n: int) -> None:
            await pipeline.reserve(n, deadline)

        packet = await hdt.receive_packet(pipeline.upstream, wbpc if self.checksummed else None,
                                          reserve=reserve, deadline=deadline)
        # the CRCs as a checksumming writer would have sent them
        sums = packet.sums if self.checksummed else chunk_checksums(packet.data, wbpc)
        flags = ((FLAG_LAST if packet.last else 0) | (FLAG_SYNC if packet.sync else 0)
                 | (FLAG_HEARTBEAT if packet.heartbeat else 0))
        offset, data, wire = max(packet.offset, 0), packet.data, packet.wire
        if data and (self.writer_bpc or offset % bpc):
            with trio.fail_at(deadline):   # it may read the replica's partial chunk
                offset, data, sums = await self._rechunk(pipeline, offset, data, sums)
            wire = None
        elif data:   # whole chunks, written as they come: what _rechunk kept is stale
            self.partial = None
        return Packet(packet.seqno, offset, data, sums, flags, wire)

    async def _rechunk(self, pipeline, offset: int, data: bytes, sums: bytes):
        """A packet that is not in the replica's whole chunks, as one that is: the bytes of
        the replica's partial last chunk go in front, CRCs are the replica's chunks'.
        Hadoop's client sends such packets when it appends: it fills the replica's partial
        last chunk first (one packet at the replica's length, at most to the chunk's end,
        its CRC over those bytes only), and at its own chunk size throughout. The writer's
        CRCs are checked first; wrong ones stay as sent, so the pipeline answers
        ERROR_CHECKSUM (no CRC of the block server's making covers bad bytes)."""
        replica = pipeline.replica
        bpc, wbpc = replica.bytes_per_checksum, self.writer_bpc or replica.bytes_per_checksum
        if self.partial is None:
            self.partial = await _partial_chunk(pipeline)
        start, head = self.partial
        end = start + len(head)
        fill = -offset % wbpc
        if not start <= offset <= end or (fill and (offset != end or len(data) > fill)):
            raise ProtocolError(f"packet [{offset}, {offset + len(data)}) of blk_"
                                f"{replica.block_id} is not in whole chunks and does not "
                                f"continue the {end} bytes received")
        bad = first_bad_chunk(data, sums, wbpc, fill)
        data = head[:offset - start] + data
        out = bytearray(chunk_checksums(data, bpc))
        if bad is not None:   # a CRC that cannot match where the writer's did not
            at = (offset - start + bad) // bpc * CHECKSUM_SIZE
            out[at:at + CHECKSUM_SIZE] = bytes(b ^ 0xFF for b in out[at:at + CHECKSUM_SIZE])
            return start, data, bytes(out)
        new_end = start + len(data)
        cut = new_end - new_end % bpc
        self.partial = (cut, data[cut - start:])
        return start, data, bytes(out)

    async def send_packets(self, framed: FramedStream, packets: list[Packet]) -> None:
        """Small packets (Hadoop's client's are 64 KiB) joined into one send: a copy costs
        less than a trip through trio and the kernel per packet. Without ``checksummed``
        they go without checksums, as the op downstream asks too."""
        joined: list = []
        for packet in packets:
            if packet.wire is not None:   # as it came in: nothing to encode again
                parts = [packet.wire]
            else:
                parts = hdfs_packet(packet.seqno, packet.offset, packet.data,
                                    packet.sums if self.checksummed else b"", packet.flags)
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

    def take_ack(self, framed: FramedStream) -> tuple[int, list[int]] | None:
        return hdt.take_ack(framed)


async def _partial_chunk(pipeline) -> tuple[int, bytes]:
    """(start, bytes) of the replica's partial last chunk on disk, before any packet of this
    pipeline was written."""
    replica = pipeline.replica
    length = replica.num_bytes
    start = length - length % replica.bytes_per_checksum

    def read() -> bytes:
        with open(replica.data_path, "rb", buffering=0) as f:
            return os.pread(f.fileno(), length - start, start)

    head = await pipeline.store.run_io(read) if length > start else b""
    if len(head) != length - start:
        raise OSError(errno.EIO, f"blk_{replica.block_id}: data file shorter than {length}")
    return start, head


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
        # Hadoop IPC on the same port (``ClientDatanodeProtocol``: a replica's visible
        # length, for readers of a file being written)
        self.ipc = IpcServer([ClientDatanode(transfer)], DatanodeIdentity(transfer),
                             name="block server HDFS port", max_frame=1 << 20,
                             max_calls=16, context_timeout=self.config.idle_timeout,
                             frame_timeout=self.config.data_timeout,
                             idle_timeout=self.config.idle_timeout,
                             call_observer=self._observe_call)

    def _observe_call(self, method: str, outcome: str, queued: float, seconds: float) -> None:
        # the IPC calls count beside the data-transfer ops (HDFS_getReplicaVisibleLength)
        if self.transfer.op_observer is not None:
            self.transfer.op_observer(f"HDFS_{method.removeprefix('hdfs.')}", outcome, seconds)

    async def handle(self, stream: trio.abc.Stream, peer: str = "?") -> None:
        kind, head, stream = await sniff(stream, self.config.idle_timeout)
        if kind == IPC:
            await self.ipc.serve(stream, peer)
            return
        if kind is None:   # neither protocol, or nothing within idle_timeout
            if head:
                log.warning("HDFS port: closing the connection from %s: it began with %s",
                            peer, describe(head))
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        await self._data_transfer(stream, peer)

    async def _data_transfer(self, stream: trio.abc.Stream, peer: str) -> None:
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
                raise NotSupported(hdt.SASL_REFUSED)
            hdt.parse_op_prefix(prefix)
            if code == hdt.READ_BLOCK:
                request = await self._request(framed, dt.OpReadBlockProto)
                return await self._read_block(op, request)
            if code == hdt.WRITE_BLOCK:
                request = await self._request(framed, dt.OpWriteBlockProto)
                await self._write_block(op, request)
                return False
            if code == hdt.BLOCK_CHECKSUM:
                request = await self._request(framed, dt.OpBlockChecksumProto)
                await self._block_checksum(op, request)
                return True
            if code == hdt.TRANSFER_BLOCK:
                request = await self._request(framed, dt.OpTransferBlockProto)
                await self._transfer_block(op, request)
                return False
            raise NotSupported(f"data-transfer {op.name} is not supported by this block server")
        except (EOFError, ServerUnavailable) as exc:
            result = "peer_gone"
            log.debug("HDFS %s from %s: peer went away: %s", op.name, peer, exc)
        except LeaseFSError as exc:
            result = type(exc).__name__
            log.info("HDFS %s from %s refused: %s", op.name, peer, exc)
            await self._error(op, hdt.status_of(exc), str(exc))
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
            answer = hdt.sasl_refusal(message)
        else:
            answer = hdt.response(status, message)
        try:
            await op.respond(answer)
        except ServerUnavailable:
            pass

    def _check_token(self, base: dt.BaseHeaderProto, block_id: int, gs: int,
                     op: str, mode: str) -> None:
        """security = secure: the op's token must be a leasefs block token for this block,
        stamp and mode (the leasefs port's own check)."""
        check_token(self.transfer, base.token if base.HasField("token") else None,
                    block_id, gs, op, mode)

    # ------------------------------------------------------------------ READ_BLOCK

    async def _read_block(self, op: _Op, request: dt.OpReadBlockProto) -> bool:
        """A range that fits one packet (a parquet footer, a column chunk's pread) is
        opened, read and closed in one worker-thread hop and answered in one send: its
        latency is what Spark's reads of small ranges wait on. A longer range streams."""
        block = request.header.baseHeader.block
        block_id, gs = block.blockId, block.generationStamp
        self._check_token(request.header.baseHeader, block_id, gs, op.name, blocktoken.READ)
        packet = max(READ_PACKET, self.config.packet_size)
        chosen: list[int] = []

        def span(reader) -> tuple[int, int] | None:
            start, end = hdt.read_range(f"blk_{reader.block_id}", request.offset, request.len,
                                        reader.visible_length, reader.bytes_per_checksum)
            chosen[:] = [start, end]
            return (start, end - start) if end - start <= packet else None

        try:
            reader, data, sums = await self.store.read_or_open(block_id, gs, span)
        except OSError as exc:
            await self.transfer.reporter.replica_lost(block_id, gs, exc)
            raise
        start, end = chosen
        if data is not None:
            return await self._send_whole(op, reader, request, start, end, data, sums)
        try:
            return await self._send_range(op, reader, request, start, end, packet)
        except OSError as exc:
            await self.transfer.reporter.replica_lost(block_id, gs, exc)
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.store.close_reader(reader)

    async def _send_whole(self, op: _Op, reader, request: dt.OpReadBlockProto, start: int,
                          end: int, data: bytes, sums: bytes) -> bool:
        checked = request.sendChecksums
        bpc = reader.bytes_per_checksum
        wire = [hdt.read_answer(start, bpc, checked)]
        if data:
            wire += hdfs_packet(0, start, data, sums if checked else b"", 0)
        wire += hdfs_packet(1 if data else 0, end, b"", b"", FLAG_LAST)
        op.responded = True
        sending = op.framed.send_all(b"".join(wire))
        if not await self.transfer.to_reader(op, reader, start, sending):
            return False
        self.transfer.stats.bytes_read += len(data)
        return await self._read_status(op, reader)

    async def _send_range(self, op: _Op, reader, request: dt.OpReadBlockProto, start: int,
                          end: int, packet: int) -> bool:
        checked = request.sendChecksums
        await op.respond(hdt.read_answer(start, reader.bytes_per_checksum, checked))
        sock = plain_socket(op.framed.stream)
        if sock is None:   # TLS: the bytes go through this process
            sent = await self.transfer.send_block_range(
                op, reader, start, end, packet_size=packet,
                send=send_hdfs_packet if checked else _send_unchecked)
        else:
            sent = await self._send_from_file(op, reader, sock, start, end, packet, checked)
        return sent and await self._read_status(op, reader)

    async def _send_from_file(self, op: _Op, reader, sock, start: int, end: int, packet: int,
                              checked: bool) -> bool:
        """The packets of ``[start, end)`` with their data sent from the replica file by the
        kernel (``ReplicaReader.send_data``), then the empty last one; True when that went
        out. A block server's CPU in a scan was mostly the copies of the data into this
        process and out again. A reader that goes away or takes nothing for
        ``data_timeout`` ends the op (False)."""
        bpc = reader.bytes_per_checksum
        step = max(bpc, packet // bpc * bpc)
        sums = await self.store.run_io(reader.read_sums, start, end - start) if checked else b""

        async def send(pos: int, n: int, prefix: bytes) -> None:
            await op.framed.send_all(prefix)
            done = 0
            while done < n:
                more = await self.store.run_io(reader.send_data, sock.fileno(), pos + done,
                                               n - done)
                if more is None:
                    raise ServerUnavailable("the reader closed the connection")
                done += more
                if done < n:
                    await trio.lowlevel.wait_writable(sock)

        seqno = 0
        for pos in [*range(start, end, step), end]:
            n = min(step, end - pos)   # 0: the last packet
            first = (pos - start) // bpc * CHECKSUM_SIZE
            part = sums[first:first + num_chunks(n, bpc) * CHECKSUM_SIZE]
            header = hdt.encode_packet_header(pos, seqno, not n, n)
            prefix = hdt.packet_prefix(header, len(part), n) + part
            if not await self.transfer.to_reader(op, reader, pos, send(pos, n, prefix)):
                return False
            self.transfer.stats.bytes_read += n
            seqno += 1
        return True

    async def _read_status(self, op: _Op, reader) -> bool:
        """The client's verdict when it read everything (it closes the socket otherwise);
        True when the connection may carry its next op."""
        with trio.move_on_after(self.config.data_timeout):
            status = await hdt.receive_delimited(op.framed, dt.ClientReadStatusProto)
            if status.status not in (hdt.Status.SUCCESS, hdt.Status.CHECKSUM_OK):
                log.warning("READ_BLOCK blk_%d to %s: the client reports status %s",
                            reader.block_id, op.peer, dt.Status.Name(status.status))
            return True
        return False

    # ------------------------------------------------------------------ BLOCK_CHECKSUM

    async def _block_checksum(self, op: _Op, request: dt.OpBlockChecksumProto) -> None:
        """The checksum of ``[0, block.numBytes)`` of the replica in the mode asked: an MD5
        of the chunk CRCs (MD5CRC, the default) or the CRC32C of the bytes (COMPOSITE_CRC),
        both from the stored CRCs (``storage.blockchecksum``)."""
        # this op's header is the base one (no client name)
        block = request.header.block
        block_id, gs = block.blockId, block.generationStamp
        self._check_token(request.header, block_id, gs, op.name, blocktoken.READ)
        options = request.blockChecksumOptions
        mode = options.blockChecksumType
        if options.stripeLength and options.stripeLength < block.numBytes:
            raise NotSupported(f"BLOCK_CHECKSUM blk_{block_id}: striped checksums "
                               f"(stripeLength {options.stripeLength}) are for erasure-coded "
                               f"blocks; leasefs replicates")
        reader, digest = await self.transfer.replica_checksum(
            block_id, gs, block.numBytes, dt.BlockChecksumTypeProto.Name(mode), op.name)
        bpc = reader.bytes_per_checksum
        await op.respond(hdt.response(hdt.Status.SUCCESS, checksumResponse=(
            dt.OpBlockChecksumResponseProto(
                bytesPerCrc=bpc, crcPerBlock=-(-reader.visible_length // bpc),
                blockChecksum=digest, crcType=hdt.CRC32C,
                blockChecksumOptions=dt.BlockChecksumOptionsProto(blockChecksumType=mode)))))

    # ------------------------------------------------------------------ WRITE_BLOCK

    def _kept_bpc(self, block_id: int, bpc: int) -> int | None:
        """The chunk size a reopened replica must have: any that the writer's divides (its
        packets are re-chunked: Hadoop's client appends at 512 to replicas leasefs wrote at
        4096), else the writer's (refused by the store, naming both)."""
        replica = self.store.replicas.get(block_id)
        if replica is None:
            return bpc      # the store names what is wrong
        return None if replica.bytes_per_checksum % bpc == 0 else bpc

    async def _write_block(self, op: _Op, request: dt.OpWriteBlockProto) -> None:
        block = request.header.baseHeader.block
        block_id, stage = block.blockId, request.stage
        if stage not in _SETUP_STAGES:
            raise NotSupported(f"WRITE_BLOCK stage {Stage.Name(stage)} is not supported")
        # the stamp the replica gets: the block's (create), the new one (recovery, append)
        gs = (block.generationStamp if stage == Stage.PIPELINE_SETUP_CREATE
              else request.latestGenerationStamp)
        copy = stage == Stage.TRANSFER_RBW
        self._check_token(request.header.baseHeader, block_id, gs,
                          f"WRITE_BLOCK {Stage.Name(stage)}",
                          blocktoken.COPY if copy else blocktoken.WRITE)
        if copy and request.targets:
            raise InvalidArgument(f"WRITE_BLOCK blk_{block_id}: stage TRANSFER_RBW takes no "
                                  f"downstream targets")
        checksum = request.requestedChecksum
        if checksum.type not in (hdt.CRC32C, hdt.NULL):
            raise NotSupported(f"WRITE_BLOCK blk_{block_id}: checksum type "
                               f"{checksum.type} asked; this block server keeps CRC32C")
        bpc = checksum.bytesPerChecksum
        checksummed = checksum.type != hdt.NULL
        if not checksummed:
            bpc = bpc if bpc > 0 else 512   # the chunking of the CRCs this node computes
        min_bytes = request.minBytesRcvd
        if stage in (Stage.PIPELINE_SETUP_CREATE, Stage.TRANSFER_RBW):
            replica = await self.store.create_rbw(block_id, gs, bpc)
        elif stage == Stage.PIPELINE_SETUP_APPEND:
            replica = await self.store.reopen_for_append(
                block_id, gs, min_bytes, self._kept_bpc(block_id, bpc))
        else:
            # streaming, append or close recovery: the replica, RBW or already FINALIZED
            # (a close whose last ack was lost), is cut to what every node acknowledged
            # and reopened under the new stamp; a close recovery's only packet is the last
            replica = await self.store.recover_rbw(
                block_id, gs, min_bytes, self._kept_bpc(block_id, bpc))
            self.transfer.stats.streaming_recoveries += 1
        # a replica kept at another chunk size takes the writer's packets re-chunked
        wire = HdfsWire(checksummed, bpc if bpc != replica.bytes_per_checksum else None)
        if wire.writer_bpc is not None:
            request.requestedChecksum.bytesPerChecksum = replica.bytes_per_checksum
        own_writer = replica.writer
        downstream: FramedStream | None = None
        try:
            if request.targets:
                downstream, bad_link, why = await self._connect_downstream(request)
                if downstream is None:
                    log.info("HDFS WRITE_BLOCK %s: downstream setup failed at %s: %s",
                             replica.name, bad_link, why)
                    await self.transfer.keep_after_failed_setup(
                        replica, created=stage == Stage.PIPELINE_SETUP_CREATE)
                    await op.respond(hdt.response(
                        hdt.Status.ERROR, f"pipeline setup failed at {bad_link}: {why}",
                        firstBadLink=bad_link))
                    return
            # a TRANSFER_RBW copy is reported once the recovered pipeline uses it
            if not copy:
                self.transfer.report_receiving(block_id, gs, min_bytes)
            await op.respond(hdt.response(hdt.Status.SUCCESS, firstBadLink=""))
            await self.transfer.run_pipeline(op.framed, op.peer, downstream, replica,
                                             len(request.targets), wire, transfer=copy)
        finally:
            if downstream is not None:
                with trio.CancelScope(shield=True):
                    await downstream.aclose()
            await self.transfer.release_own_writer(replica, own_writer)

    # ------------------------------------------------------------------ TRANSFER_BLOCK

    async def _transfer_block(self, op: _Op, request: dt.OpTransferBlockProto) -> None:
        """Pipeline recovery's copy to a replacement (the client got it from
        getAdditionalDatanode): the first ``numBytes`` (what every node acknowledged) of
        this node's replica go to the one target's HDFS port as a WRITE_BLOCK TRANSFER_RBW,
        through the leasefs port's own sender; answered once the target acked them."""
        block = request.header.baseHeader.block
        block_id, gs = block.blockId, block.generationStamp
        self._check_token(request.header.baseHeader, block_id, gs, op.name, blocktoken.COPY)
        if len(request.targets) != 1:
            raise InvalidArgument(f"TRANSFER_BLOCK blk_{block_id}: one target expected, "
                                  f"{len(request.targets)} given")
        await self.transfer.transfer_replica(
            block_id, gs, block.numBytes, hdt.datanode_address(request.targets[0]),
            client=request.header.clientName[:200], link=HdfsLink(request.header))
        await op.respond(hdt.response(hdt.Status.SUCCESS))

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


class HdfsLink:
    """``storage.blockcopy.send_replica``'s way to a target's HDFS data-transfer port (the
    twin of its ``NativeLink``): a WRITE_BLOCK TRANSFER_RBW carrying the header (and so the
    token) of the client's TRANSFER_BLOCK, then HDFS's packets and acks."""

    def __init__(self, header: dt.ClientOperationHeaderProto):
        self.header = header

    @staticmethod
    async def connect(config, target: str, block_id: int) -> FramedStream:
        try:
            host, port = parse_address(target)
            with trio.fail_after(config.data_connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise ServerUnavailable(f"copy of blk_{block_id} to {target}: "
                                    f"{failure_cause(exc, config.data_connect_timeout)}") from None
        return FramedStream(stream, hdt.MAX_MESSAGE)

    async def setup(self, framed: FramedStream, targets: list[str], block_id: int, gs: int, *,
                    stage: str, client: str, bytes_per_checksum: int, length: int) -> None:
        header = dt.ClientOperationHeaderProto()
        header.CopyFrom(self.header)
        header.baseHeader.block.numBytes = length
        request = dt.OpWriteBlockProto(
            header=header, stage=Stage.TRANSFER_RBW, pipelineSize=1, minBytesRcvd=0,
            maxBytesRcvd=length, latestGenerationStamp=gs,
            requestedChecksum=dt.ChecksumProto(type=hdt.CRC32C,
                                               bytesPerChecksum=bytes_per_checksum))
        await framed.send_all(hdt.encode_op(hdt.WRITE_BLOCK, request))
        answer = await hdt.receive_delimited(framed, dt.BlockOpResponseProto)
        if answer.status != hdt.Status.SUCCESS:
            raise ServerUnavailable(f"copy of blk_{block_id}: {targets[0]} refused it: "
                                    f"{answer.message or dt.Status.Name(answer.status)}")

    send_packet = staticmethod(send_hdfs_packet)
    receive_ack = staticmethod(hdt.receive_ack)
