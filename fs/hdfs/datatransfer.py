"""HDFS's data-transfer protocol (version 28) on the wire: op framing, packets, acks, and a
small trio client (READ_BLOCK, WRITE_BLOCK with a pipeline) that the block servers use to
forward a write downstream and tests use to drive them.

Layout (all integers big-endian unless a protobuf encodes them)::

    op        int16 version 28 | uint8 op code | varint length | Op...Proto
    response  varint length | BlockOpResponseProto
    packet    int32 PLEN | int16 HLEN | PacketHeaderProto (HLEN bytes) | checksums | data
              PLEN = 4 + len(checksums) + len(data); 4 checksum bytes per chunk
    ack       varint length | PipelineAckProto (seqno, one status per node, this one first)

The packet header and the ack are the per-packet work, so they are packed with ``struct``
(the header's protobuf encoding is fixed: 25 bytes, 27 with syncBlock); any other header
encoding a peer sends is parsed by protobuf. Every length is bounded before anything is
allocated (``MAX_PACKET``, ``MAX_MESSAGE``).

Concurrency contract: the codecs are pure; the async helpers take a ``fs.framing.
FramedStream`` (one reader and one writer task per stream) and run on the trio thread.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import trio

from ..datatransfer import CHECKSUM_SIZE, chunk_checksums, crc32c, num_chunks, verify_checksums
from ..errors import (InvalidArgument, InvalidToken, LeaseFSError, NotSupported,
                      ProtocolError, ServerUnavailable)
from ..framing import FramedStream
from ..rpcbase import format_address, parse_address
from .delimit import delimited, varint
from .pb import datatransfer_pb2 as dt
from .pb import hdfs_pb2 as pb

VERSION = 28
WRITE_BLOCK = 80
READ_BLOCK = 81
READ_METADATA = 82
BLOCK_CHECKSUM = 85
TRANSFER_BLOCK = 86
OP_NAMES = {WRITE_BLOCK: "WRITE_BLOCK", READ_BLOCK: "READ_BLOCK",
            READ_METADATA: "READ_METADATA", 83: "REPLACE_BLOCK", 84: "COPY_BLOCK",
            BLOCK_CHECKSUM: "BLOCK_CHECKSUM", TRANSFER_BLOCK: "TRANSFER_BLOCK",
            87: "REQUEST_SHORT_CIRCUIT_FDS", 88: "RELEASE_SHORT_CIRCUIT_FDS",
            89: "REQUEST_SHORT_CIRCUIT_SHM", 90: "BLOCK_GROUP_CHECKSUM", 127: "CUSTOM"}
#: the first 4 bytes of a SASL handshake (a client with security on); a raw op starts
#: ``00 1C 5x``
SASL_MAGIC = 0xDEADBEEF
OP_PREFIX = struct.Struct(">hB")
#: header + checksums + data of one packet, whatever a peer claims (Hadoop's own limit)
MAX_PACKET = 16 << 20
#: an op request, response, ack or read status (they carry a few short strings)
MAX_MESSAGE = 1 << 20
MAX_HEADER = 1024

Status = dt.Status
Stage = dt.OpWriteBlockProto.BlockConstructionStage
CRC32C = pb.CHECKSUM_CRC32C
NULL = pb.CHECKSUM_NULL


# --------------------------------------------------------------------------- varints


def encode_op(op: int, message) -> bytes:
    return OP_PREFIX.pack(VERSION, op) + delimited(message)


def parse_op_prefix(raw: bytes) -> tuple[int, int]:
    """``(version, op)``; ``ProtocolError`` for another version."""
    version, op = OP_PREFIX.unpack(raw)
    if version != VERSION:
        raise ProtocolError(f"data-transfer version {version}, this server speaks {VERSION}")
    return version, op


async def receive_varint(framed: FramedStream) -> int:
    value = shift = 0
    for _ in range(10):
        byte = (await framed.receive_exactly(1))[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    raise ProtocolError("malformed varint length")


async def receive_delimited(framed: FramedStream, cls, limit: int = MAX_MESSAGE):
    """The next varint-delimited message of type ``cls``; bounded, and a body that does not
    parse (or lacks a required field) is a ``ProtocolError`` naming the type."""
    return parse(cls, await _receive_delimited_body(framed, cls.__name__, limit))


async def _receive_delimited_body(framed: FramedStream, name: str, limit: int) -> bytes:
    """The bytes of the next varint-delimited message (``name`` for the error), bounded."""
    n = await receive_varint(framed)
    if n > limit:
        raise ProtocolError(f"{name} of {n} bytes, more than {limit}")
    return await framed.receive_exactly(n)


def parse(cls, body: bytes):
    message = cls()
    try:
        message.ParseFromString(body)
    except Exception as exc:   # protobuf's DecodeError, or a required field missing
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None
    return message


# --------------------------------------------------------------------------- packets

PACKET_PREFIX = struct.Struct(">iH")
# PacketHeaderProto as protobuf encodes it: tags 0x09 (sfixed64 offsetInBlock), 0x11
# (sfixed64 seqno), 0x18 (bool lastPacketInBlock), 0x25 (sfixed32 dataLen), then 0x28 01
# when syncBlock is set (Hadoop's client leaves the field out otherwise)
_HEADER = struct.Struct("<BqBqBBBi")
_SYNC_TAIL = b"\x28\x01"
HEADER_SIZE = _HEADER.size            # 25
SYNC_HEADER_SIZE = HEADER_SIZE + 2    # 27


@dataclass(slots=True)
class Packet:
    seqno: int
    offset: int
    last: bool
    sync: bool
    sums: bytes
    data: bytes | memoryview   # received packets: a view into the received payload
    #: the whole packet as it was received, when it came in one piece
    wire: bytes | None = None

    @property
    def heartbeat(self) -> bool:
        return self.seqno == -1 and not self.data and not self.last


def encode_packet_header(offset: int, seqno: int, last: bool, data_len: int,
                         sync: bool = False) -> bytes:
    header = _HEADER.pack(0x09, offset, 0x11, seqno, 0x18, 1 if last else 0, 0x25, data_len)
    return header + _SYNC_TAIL if sync else header


def parse_packet_header(raw: bytes) -> tuple[int, int, bool, int, bool]:
    """``(offset, seqno, last, data_len, sync)``."""
    n = len(raw)
    if n in (HEADER_SIZE, SYNC_HEADER_SIZE):
        t1, offset, t2, seqno, t3, last, t4, data_len = _HEADER.unpack_from(raw)
        if (t1, t2, t3, t4) == (0x09, 0x11, 0x18, 0x25) and last in (0, 1) \
                and (n == HEADER_SIZE or raw[HEADER_SIZE:] == _SYNC_TAIL):
            return offset, seqno, bool(last), data_len, n == SYNC_HEADER_SIZE
    header = parse(dt.PacketHeaderProto, raw)
    return (header.offsetInBlock, header.seqno, header.lastPacketInBlock, header.dataLen,
            header.syncBlock)


def packet_prefix(header: bytes, sums_len: int, data_len: int) -> bytes:
    """What goes before a packet's checksums: lengths and header (the data is sent as is)."""
    return PACKET_PREFIX.pack(4 + sums_len + data_len, len(header)) + header


def encode_packet(offset: int, seqno: int, data, sums: bytes, last: bool = False,
                  sync: bool = False) -> list:
    """The packet as buffers to send in order (the data is not copied)."""
    header = encode_packet_header(offset, seqno, last, len(data), sync)
    out = [packet_prefix(header, len(sums), len(data)) + sums]
    if len(data):
        out.append(data)
    return out


def _whole_packet(framed: FramedStream) -> tuple[int, int, int] | None:
    """``(plen, hlen, size)`` of the next packet when it was received whole (then it is
    taken without a trip through trio), else None."""
    prefix = framed.unpack_buffered(PACKET_PREFIX)
    if prefix is None:
        return None
    plen, hlen = prefix
    size = PACKET_PREFIX.size + hlen + plen - 4
    return (plen, hlen, size) if framed.buffered() >= size else None


def _packet_layout(plen: int, hlen: int) -> None:
    if plen < 4 or not HEADER_SIZE <= hlen <= MAX_HEADER or plen - 4 + hlen > MAX_PACKET:
        raise ProtocolError(f"packet of {plen} bytes with a {hlen}-byte header: more than "
                            f"{MAX_PACKET} bytes, or malformed")


def _packet_fields(header, payload: int, bytes_per_checksum: int | None):
    """``(offset, seqno, last, data_len, sync, sums_len)`` of a packet whose header is
    ``header`` and whose checksums and data are ``payload`` bytes, checked."""
    offset, seqno, last, data_len, sync = parse_packet_header(header)
    sums_len = payload - data_len
    want = 0 if bytes_per_checksum is None else CHECKSUM_SIZE * num_chunks(
        data_len, bytes_per_checksum)
    if data_len < 0 or sums_len != want or offset < 0 and seqno != -1:
        raise ProtocolError(f"packet {seqno}: {data_len} data bytes and {sums_len} checksum "
                            f"bytes (expected {want}) at offset {offset}")
    if last and data_len:
        raise ProtocolError(f"packet {seqno}: the last packet carries {data_len} data bytes")
    return offset, seqno, last, data_len, sync, sums_len


async def receive_packet(framed: FramedStream, bytes_per_checksum: int | None,
                         reserve=None, deadline: float | None = None) -> Packet:
    """The next packet; lengths are checked before anything big is read. With
    ``bytes_per_checksum`` the checksums must be one per chunk of the data (None: no
    checksums, CHECKSUM_NULL). ``reserve(n)`` (awaited) is told the payload size first,
    so a server can bound what all its connections buffer. ``deadline`` (trio time): the
    whole packet is read by then, or ``trio.TooSlowError`` (``reserve`` sees to its own).

    A packet already received whole (most of a fast writer's) is taken in one piece,
    without a cancel scope, and keeps its bytes as received in ``wire`` (a node that
    passes it on unchanged sends those)."""
    whole = _whole_packet(framed)
    if whole is not None:
        plen, hlen, size = whole
        _packet_layout(plen, hlen)
        raw = framed.take(size)
        view = memoryview(raw)
        at = PACKET_PREFIX.size + hlen
        offset, seqno, last, data_len, sync, sums_len = _packet_fields(
            raw[PACKET_PREFIX.size:at], plen - 4, bytes_per_checksum)
        if reserve is not None and data_len:
            await reserve(data_len)
        return Packet(seqno, offset, last, sync, bytes(view[at:at + sums_len]),
                      view[at + sums_len:], raw)
    if deadline is not None:
        with trio.fail_at(deadline):
            return await receive_packet(framed, bytes_per_checksum, reserve)
    # the lengths and the shortest header in one receive: every header holds the four
    # required fields, HEADER_SIZE bytes at least
    head = await framed.receive_exactly(PACKET_PREFIX.size + HEADER_SIZE)
    plen, hlen = PACKET_PREFIX.unpack_from(head)
    _packet_layout(plen, hlen)
    header = head[PACKET_PREFIX.size:]
    if hlen > HEADER_SIZE:
        header += await framed.receive_exactly(hlen - HEADER_SIZE)
    offset, seqno, last, data_len, sync, sums_len = _packet_fields(
        header, plen - 4, bytes_per_checksum)
    if reserve is not None and data_len:
        await reserve(data_len)
    # checksums and data in one receive (one await and one copy out of the stream's buffer,
    # not two); the data is a view into it, the small checksums a copy of their own
    body = memoryview(await framed.receive_exactly(plen - 4))
    return Packet(seqno, offset, last, sync, bytes(body[:sums_len]), body[sums_len:])


# --------------------------------------------------------------------------- acks


def zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def encode_ack(seqno: int, statuses) -> bytes:
    """A delimited PipelineAckProto (statuses are small enum values: one byte each)."""
    body = b"\x08" + varint(zigzag(seqno) & 0xFFFFFFFFFFFFFFFF) + b"".join(
        b"\x10" + varint(s) for s in statuses)
    return varint(len(body)) + body


_BYTE = struct.Struct("B")


def _decode_ack(body: bytes) -> tuple[int, list[int]] | None:
    """``encode_ack``'s form (the seqno, then one-byte statuses) decoded by hand; None for
    any other encoding of the message (protobuf parses those)."""
    if len(body) < 2 or body[0] != 0x08:
        return None
    value = shift = 0
    for at in range(1, min(len(body), 11)):
        byte = body[at]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    else:
        return None
    replies = body[at + 1:]
    if len(replies) % 2 or replies[::2] != b"\x10" * (len(replies) // 2) \
            or any(s & 0x80 for s in replies[1::2]):
        return None
    if value >= 1 << 64:
        return None
    return (value >> 1) ^ -(value & 1), list(replies[1::2])


def _ack(body: bytes) -> tuple[int, list[int]]:
    fast = _decode_ack(body)
    if fast is not None:
        return fast
    ack = parse(dt.PipelineAckProto, body)
    return ack.seqno, list(ack.reply)


def take_ack(framed: FramedStream) -> tuple[int, list[int]] | None:
    """The next ack when it was received whole (taken without a trip through trio), else
    None."""
    first = framed.unpack_buffered(_BYTE)
    if first is None or first[0] & 0x80 or framed.buffered() < 1 + first[0]:
        return None
    return _ack(framed.take(1 + first[0])[1:])


async def receive_ack(framed: FramedStream) -> tuple[int, list[int]]:
    got = take_ack(framed)
    if got is not None:
        return got
    return _ack(await _receive_delimited_body(framed, "PipelineAckProto", MAX_MESSAGE))


def response(status: int, message: str = "", **fields) -> bytes:
    return delimited(dt.BlockOpResponseProto(status=status, message=message, **fields))


def checksum_chunks(sums: bytes) -> int:
    return len(sums) // CHECKSUM_SIZE


# --------------------------------------------------------------------------- requests


def op_header(block: pb.ExtendedBlockProto, token: pb.TokenProto | None,
              client: str) -> dt.ClientOperationHeaderProto:
    base = dt.BaseHeaderProto(block=block)
    if token is not None:
        base.token.CopyFrom(token)
    return dt.ClientOperationHeaderProto(baseHeader=base, clientName=client)


def datanode_address(node: pb.DatanodeInfoProto) -> str:
    """Where a pipeline target takes data-transfer connections (``ipAddr:xferPort``)."""
    return format_address((node.id.ipAddr, node.id.xferPort))


# --------------------------------------------------------------------------- serving reads


def status_of(exc: LeaseFSError) -> int:
    """The op status of a refusal: a token's is ERROR_ACCESS_TOKEN (Hadoop's client then
    fetches the block's locations again, once, at once), an op not served
    ERROR_UNSUPPORTED."""
    if isinstance(exc, InvalidToken):
        return Status.ERROR_ACCESS_TOKEN
    if isinstance(exc, NotSupported):
        return Status.ERROR_UNSUPPORTED
    return Status.ERROR


SASL_REFUSED = ("this server takes no SASL handshake on its HDFS data-transfer port: leave "
                "dfs.data.transfer.protection unset and hadoop.security.authentication="
                "simple on the client, or use leasefs's own client")


def sasl_refusal(message: str) -> bytes:
    """The answer to a client that opened with SASL's magic number (in SASL's own message,
    which the client reads next)."""
    return delimited(dt.DataTransferEncryptorMessageProto(
        status=dt.DataTransferEncryptorMessageProto.ERROR, message=message))


def read_range(what: str, offset: int, length: int, visible: int,
               bytes_per_checksum: int) -> tuple[int, int]:
    """``(start, end)`` of the bytes a READ_BLOCK of ``[offset, offset + length)`` sends:
    from the chunk boundary at or below ``offset`` to the chunk end at or past its end,
    capped at ``visible``; ``InvalidArgument`` for a range past the visible bytes."""
    if offset + length > visible:
        raise InvalidArgument(f"READ_BLOCK {what}: range [{offset}, {offset + length}) is "
                              f"past the end of the {visible} visible bytes")
    start = offset - offset % bytes_per_checksum
    end = min(visible, -(-(offset + length) // bytes_per_checksum) * bytes_per_checksum) \
        if length else start
    return start, end


def read_answer(start: int, bytes_per_checksum: int, checked: bool) -> bytes:
    """READ_BLOCK's SUCCESS answer: the checksum chunking and the first chunk's offset."""
    return response(Status.SUCCESS, readOpChecksumInfo=dt.ReadOpChecksumInfoProto(
        checksum=dt.ChecksumProto(type=CRC32C if checked else NULL,
                                  bytesPerChecksum=bytes_per_checksum),
        chunkOffset=start))


class MemoryBlocks:
    """READ_BLOCK and BLOCK_CHECKSUM of blocks whose bytes a server holds in memory (small,
    e.g. the files the metadata server keeps inline), over HDFS data-transfer connections:
    the checksums are CRC32C computed as the bytes go out, at ``BYTES_PER_CHECKSUM``; a
    block checksum is what a block server answers for the same bytes at that chunk size.

    ``content(header, op, peer)`` (awaited) gives the bytes of the block a
    ``BaseHeaderProto`` names (with its token; ``op`` names the op for messages) or raises
    a leasefs error, which is the op's refusal (``status_of``). A connection serves ops
    until the peer closes it, sends another op, or is idle ``idle_timeout`` seconds before
    its first op
    (``keepalive`` between ops, as Hadoop's client pools its sockets); a peer that does not
    take the bytes within ``data_timeout`` is dropped."""

    BYTES_PER_CHECKSUM = 512
    PACKET = 4 << 20

    def __init__(self, content, *, name: str, idle_timeout: float, keepalive: float = 4.0,
                 data_timeout: float = 30.0, log=None):
        self.content = content
        self.name = name
        self.idle_timeout = idle_timeout
        self.keepalive = keepalive
        self.data_timeout = data_timeout
        self.log = log

    async def serve(self, stream, peer: str) -> None:
        """Serve one connection until it ends; never raises for the peer's doing."""
        framed = FramedStream(stream, MAX_MESSAGE)
        try:
            wait = self.idle_timeout
            while True:
                prefix = None
                with trio.move_on_after(wait):
                    try:
                        prefix = await framed.receive_exactly(OP_PREFIX.size)
                    except (EOFError, ServerUnavailable):
                        pass
                if prefix is None or not await self._op(framed, peer, prefix):
                    return
                wait = self.keepalive
        finally:
            with trio.CancelScope(shield=True):
                await framed.aclose()

    async def _op(self, framed: FramedStream, peer: str, prefix: bytes) -> bool:
        responded = False
        try:
            if prefix == b"\xde\xad\xbe":
                raise _Sasl(SASL_REFUSED)
            _, code = parse_op_prefix(prefix)
            if code not in (READ_BLOCK, BLOCK_CHECKSUM):
                raise NotSupported(f"data-transfer {OP_NAMES.get(code, f'op {code}')} is not "
                                   f"served by the {self.name}: it serves READ_BLOCK and "
                                   f"BLOCK_CHECKSUM only")
            kind = dt.OpReadBlockProto if code == READ_BLOCK else dt.OpBlockChecksumProto
            request = None
            with trio.move_on_after(self.idle_timeout):
                request = await receive_delimited(framed, kind)
            if request is None:
                raise ProtocolError(f"no complete {kind.__name__} within "
                                    f"{self.idle_timeout:g} s")
            if code == BLOCK_CHECKSUM:
                data = await self.content(request.header, "BLOCK_CHECKSUM", peer)
                responded = True
                await framed.send_all(self.checksum_answer(request, data))
                return True
            data = await self.content(request.header.baseHeader, "READ_BLOCK", peer)
            block = request.header.baseHeader.block
            bpc = self.BYTES_PER_CHECKSUM
            start, end = read_range(f"blk_{block.blockId}", request.offset, request.len,
                                    len(data), bpc)
            checked = request.sendChecksums
            responded = True
            with trio.move_on_after(self.data_timeout) as sending:   # a peer that reads not
                await framed.send_all(read_answer(start, bpc, checked))
                seqno = 0
                view = memoryview(data)
                for pos in range(start, end, self.PACKET):
                    chunk = view[pos:min(end, pos + self.PACKET)]
                    sums = chunk_checksums(chunk, bpc) if checked else b""
                    for buf in encode_packet(pos, seqno, chunk, sums):
                        await framed.send_all(buf)
                    seqno += 1
                for buf in encode_packet(end, seqno, b"", b"", last=True):
                    await framed.send_all(buf)
            if sending.cancelled_caught:
                return False
            with trio.move_on_after(self.data_timeout):
                await receive_delimited(framed, dt.ClientReadStatusProto)
                return True
            return False
        except (EOFError, ServerUnavailable):
            return False
        except _Sasl as exc:
            await _send_quietly(framed, sasl_refusal(str(exc)))
        except LeaseFSError as exc:
            if self.log is not None:
                self.log.info("%s: HDFS op from %s refused: %s", self.name, peer, exc)
            if not responded:
                await _send_quietly(framed, response(status_of(exc), str(exc)))
        return False


    def checksum_answer(self, request: dt.OpBlockChecksumProto, data: bytes) -> bytes:
        """BLOCK_CHECKSUM of ``[0, numBytes)``: the MD5 of the chunk CRCs (MD5CRC) or the
        CRC32C of the bytes (COMPOSITE_CRC), as a block server answers from stored CRCs."""
        length = request.header.block.numBytes
        if length > len(data):
            raise InvalidArgument(f"BLOCK_CHECKSUM blk_{request.header.block.blockId}: "
                                  f"{length} bytes asked, the block holds {len(data)}")
        mode = request.blockChecksumOptions.blockChecksumType
        bpc = self.BYTES_PER_CHECKSUM
        body = memoryview(data)[:length]
        if mode == dt.COMPOSITE_CRC:
            digest = crc32c(body).to_bytes(CHECKSUM_SIZE, "big")
        else:
            digest = hashlib.md5(chunk_checksums(body, bpc)).digest()
        return response(Status.SUCCESS, checksumResponse=dt.OpBlockChecksumResponseProto(
            bytesPerCrc=bpc, crcPerBlock=num_chunks(length, bpc), blockChecksum=digest,
            crcType=CRC32C, blockChecksumOptions=dt.BlockChecksumOptionsProto(
                blockChecksumType=mode)))


class _Sasl(Exception):
    pass


async def _send_quietly(framed: FramedStream, data: bytes) -> None:
    try:
        await framed.send_all(data)
    except (ServerUnavailable, EOFError):
        pass


# --------------------------------------------------------------------------- test client


@dataclass
class ReadResult:
    response: dt.BlockOpResponseProto
    data: bytes = b""       # exactly [offset, offset + len) of what was asked
    packets: int = 0        # data packets received


@dataclass
class WriteResult:
    response: dt.BlockOpResponseProto
    acks: list[tuple[int, list[int]]] = field(default_factory=list)


class DataTransferClient:
    """One kept-alive connection to a block server's HDFS data-transfer port (trio). Reads
    verify every chunk's CRC32C; writes compute them."""

    def __init__(self, framed: FramedStream, address: str):
        self.framed = framed
        self.address = address

    @classmethod
    async def connect(cls, address: str, timeout: float = 30.0) -> "DataTransferClient":
        host, port = parse_address(address)
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
        return cls(FramedStream(stream, MAX_MESSAGE), address)

    async def aclose(self) -> None:
        await self.framed.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def send_raw(self, data: bytes) -> None:
        await self.framed.send_all(data)

    async def read_block(self, block: pb.ExtendedBlockProto, offset: int, length: int, *,
                         token: pb.TokenProto | None = None, client: str = "leasefs-test",
                         send_checksums: bool = True, abort_after: int | None = None
                         ) -> ReadResult:
        """READ_BLOCK ``[offset, offset + length)``; on SUCCESS the packets up to the last
        one, then ClientReadStatus CHECKSUM_OK (or SUCCESS without checksums).
        ``abort_after``: stop after that many data packets, sending no status (the
        connection is then unusable: close it)."""
        await self.framed.send_all(encode_op(READ_BLOCK, dt.OpReadBlockProto(
            header=op_header(block, token, client), offset=offset, len=length,
            sendChecksums=send_checksums)))
        answer = await receive_delimited(self.framed, dt.BlockOpResponseProto)
        result = ReadResult(answer)
        if answer.status != Status.SUCCESS:
            return result
        info = answer.readOpChecksumInfo
        bpc = info.checksum.bytesPerChecksum
        checked = info.checksum.type != NULL
        pos = info.chunkOffset
        if not pos <= offset < pos + max(bpc, 1) and length:
            raise ProtocolError(f"chunkOffset {pos} does not cover offset {offset}")
        parts = []
        expected_seqno = 0
        while True:
            packet = await receive_packet(self.framed, bpc if checked else None)
            if packet.seqno != expected_seqno:
                raise ProtocolError(f"packet seqno {packet.seqno}, expected {expected_seqno}")
            expected_seqno += 1
            if packet.last:
                break
            if packet.offset != pos:
                raise ProtocolError(f"packet at offset {packet.offset}, expected {pos}")
            if checked:
                verify_checksums(packet.data, packet.sums, bpc, f"from {self.address}",
                                 packet.offset)
            parts.append(packet.data)
            pos += len(packet.data)
            result.packets += 1
            if abort_after is not None and result.packets >= abort_after:
                return result
        skip = offset - info.chunkOffset
        result.data = b"".join(parts)[skip:skip + length]
        await self.framed.send_all(delimited(dt.ClientReadStatusProto(
            status=Status.CHECKSUM_OK if checked else Status.SUCCESS)))
        return result

    async def write_block(self, block: pb.ExtendedBlockProto, data: bytes, *,
                          targets: list[pb.DatanodeInfoProto] = (),
                          token: pb.TokenProto | None = None, client: str = "leasefs-test",
                          bytes_per_checksum: int = 512, packet_size: int = 64512,
                          corrupt_seqno: int | None = None, sync_seqnos=(),
                          heartbeat: bool = False, stage: int = Stage.PIPELINE_SETUP_CREATE,
                          start: int = 0, new_gs: int = 0, finish: bool = True
                          ) -> WriteResult:
        """WRITE_BLOCK of ``data`` (block bytes from ``start``, a chunk boundary) in packets
        of ``packet_size``, then (``finish``) the empty last packet; every ack is collected
        (this stops at the first ack that is not all SUCCESS). ``stage`` other than CREATE
        (recovery, append): the replicas keep ``start`` bytes and take stamp ``new_gs``.
        ``corrupt_seqno``: that packet's data is altered after its checksums are computed;
        ``sync_seqnos``: packets sent with syncBlock; ``heartbeat``: a heartbeat packet
        (seqno -1) goes first."""
        request = dt.OpWriteBlockProto(
            header=op_header(block, token, client), targets=list(targets),
            stage=stage, pipelineSize=len(targets) + 1,
            minBytesRcvd=start, maxBytesRcvd=start, latestGenerationStamp=new_gs,
            requestedChecksum=dt.ChecksumProto(type=CRC32C,
                                               bytesPerChecksum=bytes_per_checksum))
        await self.framed.send_all(encode_op(WRITE_BLOCK, request))
        answer = await receive_delimited(self.framed, dt.BlockOpResponseProto)
        result = WriteResult(answer)
        if answer.status != Status.SUCCESS:
            return result
        step = max(bytes_per_checksum, packet_size // bytes_per_checksum * bytes_per_checksum)
        packets = []
        if heartbeat:
            packets.append((-1, 0, b"", False))
        for seqno, pos in enumerate(range(0, len(data), step)):
            packets.append((seqno, start + pos, data[pos:pos + step], False))
        if finish:
            packets.append((len(packets) - (1 if heartbeat else 0), start + len(data), b"",
                            True))
        for seqno, pos, chunk, last in packets:
            sums = chunk_checksums(chunk, bytes_per_checksum)
            if seqno == corrupt_seqno and chunk:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if last:   # Hadoop's client sends the last packet once every other is acked
                if not await self._acks(result, len(result.acks), len(packets) - 1):
                    return result
            for buf in encode_packet(pos, seqno, chunk, sums, last=last,
                                     sync=seqno in sync_seqnos):
                await self.framed.send_all(buf)
        await self._acks(result, len(result.acks), len(packets))
        return result

    async def _acks(self, result: WriteResult, have: int, want: int) -> bool:
        for _ in range(have, want):
            seqno, statuses = await receive_ack(self.framed)
            result.acks.append((seqno, statuses))
            if any(s != Status.SUCCESS for s in statuses):
                return False
        return True

