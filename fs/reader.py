"""The input stream of the client (``AsyncInputStream``): packets become verified bytes,
with replica failover.

Why a module of its own: this is every HDFS rule of the read side — block locations from the
metadata server (the last block of a file under construction is measured with
BLOCK_LENGTH), READ_BLOCK from one replica at a time (``BlockReader``), every chunk verified.
A checksum error is reported with ``report_bad_blocks``; any failure moves to the next
replica, all failed → locations are fetched again, and in the end ``BlockMissing`` names the
path, block and offset. ``BlockReader`` is also what the output stream's append uses to
reread a block's last partial chunk.

Concurrency contract: every async method runs on the client's trio thread. An input stream
serialises ``read`` on its position with one lock (``seek``/``tell`` do no I/O); ``pread``
uses its own connection (a ``_ReaderSlot`` of its own) and may run concurrently with
anything. A ``BlockReader`` belongs to one task at a time.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass

import trio

from .dataconn import (DATA_BACKOFF, IO_ERRORS, close_quietly, failure_cause, node_name,
                       node_unreachable, open_data_connection, response_error, time_limit)
from .datatransfer import (BLOCK_LENGTH, FLAG_LAST, READ_BLOCK, block_dict, op_header,
                           receive_packet, verify_checksums)
from .errors import (BlockMissing, ChecksumError, InvalidArgument, InvalidToken, LeaseFSError,
                     ProtocolError, ReplicaChanged)
from .framing import FramedStream

log = logging.getLogger(__name__)

#: times an input stream fetches locations again when every replica of a block failed
LOCATE_RETRIES = 3
TOKEN_REFRESHES = 2   # fresh locations (tokens) fetched for one read refused its token
#: a forward seek inside the current block within this many bytes reads on instead of
#: reconnecting (what HDFS does too: cheaper than a new connection)
SEEK_SKIP_LIMIT = 256 << 10


class Offset(int):
    """A stream position. ``seek``/``tell`` do no I/O, so both ``s.seek(0)`` and
    ``await s.seek(0)`` work: the result is an int that may also be awaited."""

    def __await__(self):
        if False:  # pragma: no cover - makes this a generator
            yield
        return int(self)


@dataclass
class Block:
    """A located block as the input stream uses it."""

    id: int
    gs: int
    num_bytes: int
    offset: int
    locations: list
    state: str = "COMPLETE"
    corrupt: bool = False
    token: dict | None = None     # the block access token block servers check (secure)

    @classmethod
    def from_wire(cls, lb: dict) -> "Block":
        block = lb["block"]
        return cls(id=block["id"], gs=block["gs"], num_bytes=block.get("num_bytes", 0),
                   offset=lb["offset"], locations=list(lb.get("locations") or []),
                   state=lb.get("state", "COMPLETE"), corrupt=bool(lb.get("corrupt", False)),
                   token=lb.get("token"))

    def op_fields(self) -> dict:
        """The block (and its token) as a read op's header names them."""
        fields = {"block": {"id": self.id, "gs": self.gs}}
        if self.token is not None:
            fields["token"] = self.token
        return fields

    @property
    def end(self) -> int:
        return self.offset + self.num_bytes

    def wire(self) -> dict:
        return block_dict(self.id, self.gs, self.num_bytes)


class BlockReader:
    """One READ_BLOCK connection serving ``[cursor, end)`` of a block, verified chunk by chunk."""

    def __init__(self, framed: FramedStream, block: Block, node: dict, start: int, end: int,
                 bytes_per_checksum: int, chunk_offset: int, timeout: float):
        self.framed = framed
        self.block_id = block.id
        self.node = node
        self.cursor = start
        self.end = end
        self.bytes_per_checksum = bytes_per_checksum
        self.timeout = timeout
        self._next_packet_offset = chunk_offset
        self._pending = memoryview(b"")
        self._saw_last = False
        self.gs: int | None = None   # the version the block server serves (None: not said)

    @classmethod
    async def connect(cls, block: Block, node: dict, start: int, end: int, *,
                      timeout: float, connect_timeout: float, max_frame: int,
                      tls=None) -> "BlockReader":
        """``connect_timeout`` bounds opening the connection, ``timeout`` the answer and
        every packet after it (``ServerUnavailable`` saying which timed out)."""
        framed = await open_data_connection(node["address"], connect_timeout, max_frame, tls)
        try:
            with time_limit(timeout, "no answer to READ_BLOCK"):
                await framed.send_frame(op_header(READ_BLOCK, **block.op_fields(),
                                                  offset=start, length=end - start, verify=True))
                resp = await framed.receive_frame()
            if not isinstance(resp, dict) or resp.get("status") != "SUCCESS":
                raise response_error(resp, f"READ_BLOCK of block {block.id} at {node['address']}")
            bpc = resp.get("bytes_per_checksum")
            chunk_offset = resp.get("chunk_offset", start)
            if not (isinstance(bpc, int) and bpc > 0 and isinstance(chunk_offset, int)
                    and 0 <= chunk_offset <= start):
                raise ProtocolError(f"READ_BLOCK response from {node['address']} is malformed: "
                                    f"{resp!r:.200}")
        except BaseException:
            await close_quietly(framed)
            raise
        reader = cls(framed, block, node, start, end, bpc, chunk_offset, timeout)
        served = resp.get("gs")
        reader.gs = served if isinstance(served, int) else None
        return reader

    def positioned_at(self, block_id: int, offset: int) -> bool:
        return block_id == self.block_id and offset == self.cursor and self.cursor < self.end

    async def skip_to(self, block_id: int, offset: int) -> bool:
        """Move forward to ``offset`` by reading on, if it is close ahead in this block."""
        if block_id != self.block_id or not self.cursor < offset < self.end \
                or offset - self.cursor > SEEK_SKIP_LIMIT:
            return False
        while self.cursor < offset:
            if not await self.read(offset - self.cursor):
                return False
        return True

    async def read(self, n: int) -> bytes:
        """Up to ``n`` verified bytes at ``cursor``; ``b""`` at the end of the range."""
        while not self._pending:
            if self.cursor >= self.end:
                return b""
            with time_limit(self.timeout, f"no packet at block offset {self._next_packet_offset}"):
                packet = await receive_packet(self.framed, self.bytes_per_checksum)
            if packet.flags & FLAG_LAST or not packet.data:
                if packet.flags & FLAG_LAST:
                    self._saw_last = True
                    raise ProtocolError(
                        f"replica of block {self.block_id} at {self.node['address']} ended at "
                        f"offset {self._next_packet_offset}, before {self.end}")
                continue  # a keep-alive
            if packet.offset != self._next_packet_offset:
                raise ProtocolError(
                    f"block {self.block_id} from {self.node['address']}: packet at offset "
                    f"{packet.offset}, expected {self._next_packet_offset}")
            verify_checksums(packet.data, packet.sums, self.bytes_per_checksum,
                             where=f"in block {self.block_id} from {self.node['address']}",
                             base_offset=packet.offset)
            self._next_packet_offset = packet.offset + len(packet.data)
            skip = self.cursor - packet.offset
            stop = min(len(packet.data), self.end - packet.offset)
            if skip < stop:
                self._pending = memoryview(packet.data)[skip:stop]
        take = self._pending[:n]
        self._pending = self._pending[len(take):]
        self.cursor += len(take)
        return bytes(take)

    async def aclose(self) -> None:
        if self.cursor >= self.end and not self._saw_last:
            # read the trailing LAST packet so the server sees a clean end of the op
            with trio.move_on_after(min(self.timeout, 1.0)):
                try:
                    while not self._saw_last:
                        packet = await receive_packet(self.framed, self.bytes_per_checksum)
                        self._saw_last = bool(packet.flags & FLAG_LAST)
                except IO_ERRORS:
                    pass
        await close_quietly(self.framed)


#: how many times one read call starts over because a block it read became a new version
NEW_VERSION_RETRIES = 8


class _NewVersion(Exception):
    """A read call met a second version of block ``block_id`` (internal to the reader)."""

    def __init__(self, block_id: int):
        super().__init__(f"block {block_id} changed")
        self.block_id = block_id


@dataclass
class _ReaderSlot:
    reader: BlockReader | None = None
    #: block id -> the version (stamp) this read call took bytes of: a call that meets a
    #: second version of a block (patched meanwhile) starts over, so it returns one
    versions: dict | None = None

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.aclose()


class AsyncInputStream:
    """A file opened for reading: ``read``/``pread``/``seek``/``tell``/``length``/``close``.

    Obtained from ``AsyncClient.open``. The length is fixed when the file is opened (for a
    file still being written: what its block servers acknowledged then); ``refresh`` fetches
    it again.
    """

    def __init__(self, client, path: str):
        self._client = client
        self.path = path
        self._pos = 0
        self._blocks: list[Block] = []
        self._offsets: list[int] = []
        self._length = 0
        self._inline: bytes | None = None   # the content, for a file kept in the namespace
        self.under_construction = False
        self._dead: dict[int, set[str]] = {}   # block id -> node ids that failed it
        self._seq = _ReaderSlot()
        self._lock = trio.Lock()
        self._closed = False
        #: replicas this stream found corrupt and reported, as (block id, node id)
        self.reported_bad: list[tuple[int, str]] = []

    @classmethod
    async def open(cls, client, path: str, *, located: dict | None = None) -> "AsyncInputStream":
        """``located``: ``get_block_locations``' answer for the whole file, already fetched
        (with the file's status), so opening makes no call of its own."""
        stream = cls(client, path)
        await stream._locate(located)
        return stream

    # ------------------------------------------------------------------ public
    @property
    def inline(self) -> bytes | None:
        """The content of a file kept in the namespace (None for a file with blocks)."""
        return self._inline

    @property
    def blocks(self) -> list[Block]:
        """The located blocks, tokens included, with a block being written at its visible
        length."""
        return list(self._blocks)

    @property
    def length(self) -> int:
        return self._length

    def tell(self) -> Offset:
        return Offset(self._pos)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> Offset:
        """Move the position (no I/O; past the end is allowed, reads there return b"")."""
        if whence == os.SEEK_SET:
            new = offset
        elif whence == os.SEEK_CUR:
            new = self._pos + offset
        elif whence == os.SEEK_END:
            new = self._length + offset
        else:
            raise InvalidArgument(f"{self.path}: invalid whence {whence!r}")
        if new < 0:
            raise InvalidArgument(f"{self.path}: cannot seek to negative offset {new}")
        self._pos = int(new)
        return Offset(self._pos)

    async def read(self, n: int = -1) -> bytes:
        """``n`` bytes from the position (fewer only at the end of the file; all the rest
        for ``n < 0``), streamed over one kept connection for sequential reads."""
        async with self._lock:
            self._check_open()
            start = self._pos
            for attempt in range(NEW_VERSION_RETRIES + 1):
                end = self._length if n is None or n < 0 else min(self._length, start + n)
                parts = []
                self._seq.versions = {}
                try:
                    while self._pos < end:
                        data = await self._read_at(self._pos, end - self._pos, self._seq, None)
                        if not data:
                            break
                        parts.append(data)
                        self._pos += len(data)
                    return b"".join(parts)
                except _NewVersion as exc:
                    self._pos = start
                    await self._seq.close()
                    await self._new_version(exc, attempt)
            raise AssertionError("unreachable")

    async def _new_version(self, exc: "_NewVersion", attempt: int) -> None:
        """A read call met two versions of a block: fresh locations, or give up after
        ``NEW_VERSION_RETRIES`` (a block patched without pause)."""
        if attempt >= NEW_VERSION_RETRIES:
            raise ReplicaChanged(f"{self.path}: block {exc.block_id} became a new version "
                                 f"{attempt + 1} times while being read") from None
        await self._locate()

    async def pread(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset`` without moving the position (own connection)."""
        self._check_open()
        if offset < 0 or n < 0:
            raise InvalidArgument(f"{self.path}: pread({offset}, {n}) needs non-negative values")
        slot = _ReaderSlot()
        try:
            for attempt in range(NEW_VERSION_RETRIES + 1):
                end = min(self._length, offset + n)
                parts = []
                pos = offset
                slot.versions = {}
                try:
                    while pos < end:
                        data = await self._read_at(pos, end - pos, slot, end)
                        if not data:
                            break
                        parts.append(data)
                        pos += len(data)
                    return b"".join(parts)
                except _NewVersion as exc:
                    await slot.close()
                    await self._new_version(exc, attempt)
        finally:
            await slot.close()
        raise AssertionError("unreachable")

    async def refresh(self) -> int:
        """Fetch locations and length again (a file still being written may have grown)."""
        self._check_open()
        await self._locate()
        return self._length

    async def close(self) -> None:
        self._closed = True
        await self._seq.close()

    aclose = close

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    # ------------------------------------------------------------------ locating
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"{self.path}: stream is closed")

    async def _locate(self, info: dict | None = None) -> None:
        if info is None:
            info = await self._client.call_meta("get_block_locations",
                                               {"path": self.path, "offset": 0, "length": None})
        inline = info.get("inline")
        self._inline = None if inline is None else bytes(inline)
        blocks = sorted((Block.from_wire(lb) for lb in info.get("blocks", [])),
                        key=lambda b: b.offset)
        length = int(info.get("length", 0))
        self.under_construction = bool(info.get("under_construction"))
        if self.under_construction and blocks and not info.get("last_block_complete", False):
            last = blocks[-1]
            visible = await self._visible_length(last)
            if visible is not None:
                last.num_bytes = visible
                length = last.offset + visible
            else:
                length = max(length, last.end) if last.locations else last.offset
        self._blocks = blocks
        self._offsets = [b.offset for b in blocks]
        self._length = length

    async def _visible_length(self, block: Block) -> int | None:
        """BLOCK_LENGTH of the block being written, from the first node that answers."""
        config = self._client.config
        for node in block.locations:
            framed = None
            try:
                framed = await open_data_connection(node["address"], config.data_connect_timeout,
                                                    config.max_frame, self._client.tls)
                with time_limit(config.data_timeout, "no answer"):
                    await framed.send_frame(op_header(BLOCK_LENGTH, **block.op_fields()))
                    resp = await framed.receive_frame()
                if isinstance(resp, dict) and resp.get("status") == "SUCCESS" \
                        and isinstance(resp.get("visible_length"), int):
                    return resp["visible_length"]
                log.info("%s: BLOCK_LENGTH of block %s at %s: %s", self.path, block.id,
                         node["address"], response_error(resp, "refused"))
            except IO_ERRORS as exc:
                log.info("%s: BLOCK_LENGTH of block %s at %s failed: %s", self.path, block.id,
                         node["address"], failure_cause(exc))
            finally:
                await close_quietly(framed)
        return None

    def _block_at(self, pos: int) -> Block | None:
        i = bisect.bisect_right(self._offsets, pos) - 1
        if i < 0:
            return None
        block = self._blocks[i]
        return block if pos < block.end else None

    # ------------------------------------------------------------------ reading
    def _pick_node(self, block: Block) -> dict | None:
        """The replica to read next: not failed for this block by this stream, and not one
        the client could not reach lately while another is left."""
        dead = self._dead.get(block.id, ())
        return self._client.avoided.first(
            [node for node in block.locations if node.get("node_id") not in dead])

    async def _read_at(self, pos: int, want: int, slot: _ReaderSlot, span_end: int | None) -> bytes:
        """Up to ``want`` bytes at file offset ``pos`` from the block holding it, with
        replica failover. ``span_end`` bounds the range a new connection asks for (pread);
        ``None`` asks for the rest of the block (sequential reads keep the connection)."""
        if self._inline is not None:
            return self._inline[pos:pos + want]
        failures: list[str] = []
        refreshes = token_refreshes = 0
        while True:
            block = self._block_at(pos)
            if block is None:
                return b""
            off = pos - block.offset
            n = min(want, block.end - pos)
            reader = slot.reader
            if reader is not None and not reader.positioned_at(block.id, off):
                try:
                    moved = await reader.skip_to(block.id, off)
                except IO_ERRORS:
                    moved = False
                if not moved:
                    await slot.close()
            if slot.reader is None:
                node = self._pick_node(block)
                if node is None:
                    if refreshes >= LOCATE_RETRIES:
                        raise BlockMissing(
                            f"{self.path}: could not read block {block.id} at file offset "
                            f"{pos} from any replica: "
                            + ("; ".join(failures[-6:]) or "the block has no locations"))
                    refreshes += 1
                    await DATA_BACKOFF.sleep(refreshes)
                    self._dead.pop(block.id, None)
                    await self._locate()
                    continue
                range_end = block.num_bytes if span_end is None else min(span_end, block.end) - block.offset
                config = self._client.config
                try:
                    slot.reader = await BlockReader.connect(
                        block, node, off, range_end, timeout=config.data_timeout,
                        connect_timeout=config.data_connect_timeout,
                        max_frame=config.max_frame, tls=self._client.tls)
                    self._client.avoided.discard(node.get("address"))
                except InvalidToken as exc:
                    # expired (or made with a key the metadata server has since replaced):
                    # fresh locations bring fresh tokens; the replica is not to blame
                    if token_refreshes >= TOKEN_REFRESHES:
                        raise InvalidToken(f"{self.path}: block {block.id}: {exc}") from None
                    token_refreshes += 1
                    await self._locate()
                    continue
                except IO_ERRORS as exc:
                    await self._replica_failed(block, node, exc, failures)
                    continue
            try:
                data = await slot.reader.read(n)
                if not data:
                    raise ProtocolError(f"replica at {slot.reader.node['address']} "
                                        f"returned no data at block offset {off}")
                served = slot.reader.gs
                if slot.versions is not None and served is not None \
                        and slot.versions.setdefault(block.id, served) != served:
                    raise _NewVersion(block.id)
                return data
            except IO_ERRORS as exc:
                node = slot.reader.node
                await slot.close()
                await self._replica_failed(block, node, exc, failures)

    async def _replica_failed(self, block: Block, node: dict, exc: BaseException,
                              failures: list[str]) -> None:
        self._dead.setdefault(block.id, set()).add(node.get("node_id"))
        cause = failure_cause(exc)
        failures.append(f"{node.get('address')}: {cause}")
        unreachable = node_unreachable(exc)
        if unreachable:
            self._client.avoided.add(node.get("address"))
        if isinstance(exc, ChecksumError):
            log.warning("%s: %s; reporting the replica on %s as corrupt", self.path, exc,
                        node_name(node))
            self.reported_bad.append((block.id, node.get("node_id")))
            try:
                await self._client.call_meta(
                    "report_bad_blocks",
                    {"blocks": [{"block": block.wire(), "node_id": node.get("node_id")}]},
                    retry_seconds=min(5.0, self._client.config.rpc_retry_seconds))
            except LeaseFSError as report_exc:
                log.warning("%s: could not report bad block %s: %s", self.path, block.id,
                            report_exc)
        else:
            # an unreachable block server is the operator's business, a replica's refusal
            # (moved, stale stamp) the metadata server's
            log.log(logging.WARNING if unreachable else logging.INFO,
                    "%s: block %s from %s failed: %s; trying another replica", self.path,
                    block.id, node_name(node), cause)
