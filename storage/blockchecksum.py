"""BLOCK_CHECKSUM (HDFS OP_BLOCK_CHECKSUM, COMPOSITE-CRC mode): a replica's CRC32C over its
first ``length`` bytes, combined from the chunk CRCs its meta file already holds.

Why it exists: ``leasefs checksum`` must compare contents whatever their block and chunk
sizes, without moving the data; the stored chunk CRCs, combined (``fs.crccombine``), give the
CRC32C of the bytes themselves. Only the meta file is read, except when ``length`` ends inside
a chunk that the stored CRC covers further: that one chunk's data is read, checked against
its stored CRC and the CRC of its prefix computed.

A meta file that is not ours (bad header, another ``bytes_per_checksum``) or holds too few
CRCs is a disk error (``OSError`` EIO), as an unreadable replica is for READ_BLOCK: the
replica is reported lost if its files are gone or cut, and the client asks another replica.
Stored CRCs that are wrong but well-formed cannot be told apart here (no data is read): the
block scanner finds those.

Concurrency contract: ``serve_block_checksum`` runs on the trio thread; the snapshot of the
replica is taken under ``replica.lock`` (as reads do) and ``block_crc`` (blocking file reads
and the folding) runs in one of the store's worker threads while the lock is held, so a
writer cannot reopen or cut the replica under it.
"""

from __future__ import annotations

import errno as _errno
import hashlib
import os
import struct

from fs.crccombine import combine_chunks
from fs.datatransfer import BLOCK_CHECKSUM, CHECKSUM_SIZE, crc32c
from fs.errors import ChecksumError, InvalidArgument, ProtocolError, ReplicaNotFound

from .layout import META_HEADER, decode_meta_header, meta_offset
from .opheader import block_ref, field
from .replica_records import ReplicaReader

_CRCS = struct.Struct(">I")


def chunk_crcs(reader: ReplicaReader, length: int) -> list[int]:
    """The CRC32C of each chunk of ``[0, length)`` of the replica ``reader`` snapshots (its
    files closed): the stored CRCs of the full chunks, then, when ``length`` ends inside a
    chunk, the CRC of that chunk's first ``length % bytes_per_checksum`` bytes (what HDFS's
    MD5-of-CRCs and composite CRC both fold). Blocks: run it in a worker thread."""
    bpc = reader.bytes_per_checksum
    name = f"blk_{reader.block_id}"
    full, tail = divmod(length, bpc)
    visible = reader.visible_length
    # the tail chunk's stored CRC covers exactly the tail when the tail is the replica's own
    # last chunk; of an RBW replica, that CRC is the visible one kept in memory (last_sum)
    tail_is_last = bool(tail) and length == visible
    with open(reader.meta_path, "rb", buffering=0) as meta:
        try:
            if decode_meta_header(os.pread(meta.fileno(), META_HEADER.size, 0)) != bpc:
                raise ValueError(f"meta header does not say bytes_per_checksum {bpc}")
        except ValueError as exc:
            raise OSError(_errno.EIO, f"{name}: meta file is damaged: {exc}") from None
        want = full + (1 if tail else 0)
        raw = os.pread(meta.fileno(), CHECKSUM_SIZE * want, meta_offset(0))
        if len(raw) != CHECKSUM_SIZE * want:
            raise OSError(_errno.EIO, f"{name}: meta file holds fewer checksums than chunk "
                                      f"{want}")
    crcs = [c for (c,) in _CRCS.iter_unpack(raw)]
    if tail and reader.last_sum is not None and full * bpc + bpc > visible:
        crcs[-1] = _CRCS.unpack(reader.last_sum)[0]
    if not tail or tail_is_last:
        return crcs
    # length ends inside a chunk the stored CRC covers further: read that chunk alone
    start = full * bpc
    chunk_len = min(bpc, visible - start)
    with open(reader.data_path, "rb", buffering=0) as data_file:
        chunk = os.pread(data_file.fileno(), chunk_len, start)
    if len(chunk) != chunk_len:
        raise OSError(_errno.EIO, f"{name}: data file holds fewer bytes than {start + chunk_len}")
    if crc32c(chunk) != crcs[-1]:
        raise ChecksumError(f"{name}: chunk at offset {start} does not match its stored CRC")
    crcs[-1] = crc32c(chunk[:tail])
    return crcs


def block_crc(reader: ReplicaReader, length: int) -> int:
    """CRC32C of ``[0, length)`` of the replica ``reader`` snapshots (its files closed).
    Blocks: run it in a worker thread."""
    tail = length % reader.bytes_per_checksum
    return combine_chunks(chunk_crcs(reader, length), reader.bytes_per_checksum, tail or None)


def md5_of_crcs(reader: ReplicaReader, length: int) -> bytes:
    """HDFS's MD5CRC block checksum: the MD5 of the chunk CRCs of ``[0, length)``, each 4
    bytes big-endian as a meta file holds them (it depends on ``bytes_per_checksum``).
    Blocks: run it in a worker thread."""
    crcs = chunk_crcs(reader, length)
    return hashlib.md5(struct.pack(f">{len(crcs)}I", *crcs)).digest()


def composite_crc(reader: ReplicaReader, length: int) -> bytes:
    """HDFS's COMPOSITE_CRC block checksum: the CRC32C of ``[0, length)``, 4 bytes
    big-endian. Blocks: run it in a worker thread."""
    return block_crc(reader, length).to_bytes(4, "big")


#: the folds of a replica's chunk CRCs a checksum op may ask for, by HDFS's names
FOLDS = {"MD5CRC": md5_of_crcs, "COMPOSITE_CRC": composite_crc}


async def replica_checksum(server, block_id: int, gs: int, length: int, compute, op: str):
    """``(reader, compute(reader, length))`` for the replica of ``block_id`` at stamp ``gs``
    on ``server`` (a ``storage.transfer.DataTransferServer``): the replica snapshotted under
    its lock, ``compute`` run in a worker thread while the lock is held, so that a writer
    cannot reopen or cut the replica under it."""
    store = server.store
    replica = store.readable(block_id, gs)
    try:
        async with replica.lock:
            if replica.removed:
                raise ReplicaNotFound(f"replica {replica.name} was deleted")
            reader = ReplicaReader(replica)
            if length > reader.visible_length:
                raise InvalidArgument(f"{op} {replica.name}: {length} bytes asked, only "
                                      f"{reader.visible_length} visible here")
            return reader, await store.run_io(compute, reader, length)
    except OSError as exc:
        # as READ_BLOCK: a replica whose files are gone or cut is dropped and reported
        await server.reporter.replica_lost(block_id, gs, exc)
        raise


async def serve_block_checksum(server, conn, header: dict) -> None:
    """Answer ``{crc, length, bytes_per_checksum}`` for the header's block, stamp and
    ``length`` (the visible length the client located); a READ token is needed, as for
    READ_BLOCK."""
    op = BLOCK_CHECKSUM
    block_id, gs = block_ref(header, op)
    server.check_token(header, block_id, gs, op)
    length = field(header, "length", int, op)
    if isinstance(length, bool) or length < 0:
        raise ProtocolError(f"{op}: length must be an int >= 0, got {length!r:.60}")
    reader, crc = await replica_checksum(server, block_id, gs, length, block_crc, op)
    await conn.respond({"status": "SUCCESS", "message": "", "crc": crc, "length": length,
                        "bytes_per_checksum": reader.bytes_per_checksum})
