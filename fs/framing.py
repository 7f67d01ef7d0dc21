"""Length-prefixed msgpack frames and exact-size reads over a ``trio.abc.Stream``.

Frame = 4-byte big-endian body length + msgpack body. A length above the reader's
``max_frame`` is refused with ``FrameTooLarge`` *before* anything is allocated, and the
connection is then unusable (the caller closes it). A body that is not valid msgpack raises
``ProtocolError``. Bulk block data never goes through msgpack: the data-transfer protocol
reads raw byte runs with ``receive_exactly``.

Concurrency contract: one task reads a ``FramedStream`` at a time and one task writes at a
time (callers that share a writer wrap ``send_*`` in their own ``trio.Lock``); reading and
writing may run concurrently in two tasks.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass

import trio

from . import tcpliveness
from .errors import FrameTooLarge, ProtocolError, ServerUnavailable
# the codec; re-exported (noqa) for the streams' users, who speak it too
from .frames import (DEFAULT_MAX_FRAME, LENGTH, MAX_CONTAINER_ITEMS, brief,  # noqa: F401
                     encode_frame, packb, too_large, unpackb)  # noqa: F401

_RECEIVE_CHUNK = 1 << 20
# most bytes asked of a TLS stream at once: ``SSLObject.read(n)`` allocates all ``n`` and
# hands back one 16 KiB record, so asking for 1 MiB cost a third of the throughput (loopback,
# measured: 500 MB/s at 1 MiB, 730 at 64 KiB, 650 at 16 KiB)
_TLS_RECEIVE_CHUNK = 64 << 10


def receive_limit(stream) -> int:
    """The most bytes one ``receive_some`` on ``stream`` should ask for."""
    return _TLS_RECEIVE_CHUNK if isinstance(stream, trio.SSLStream) else 1 << 62


def connection_lost(stream, exc: BaseException | None = None) -> ServerUnavailable:
    """The error of a connection that broke; it says "peer unreachable" when the peer's
    host stopped acknowledging at the TCP level (``fs.tcpliveness``)."""
    return ServerUnavailable(f"connection lost: {tcpliveness.lost(stream, exc) or exc}")


def closed(stream) -> Exception:
    """What an end of stream is: ``EOFError`` (the peer closed it), or the
    ``connection_lost`` of a connection shut for want of TCP acknowledgements."""
    if tcpliveness.lost(stream):
        return connection_lost(stream)
    return EOFError("peer closed the connection")


def plain_socket(stream):
    """The trio socket under ``stream`` when nothing (TLS) sits between: what a sender may
    write to directly (``os.write``, ``os.sendfile``); None otherwise. Bytes written around
    the stream this way must not interleave with a ``send_all`` in progress."""
    sock = getattr(stream, "socket", None)
    return sock if isinstance(sock, trio.socket.SocketType) else None


class FramedStream:
    """A stream with a receive buffer: whole frames, exact byte counts, raw sends.

    The buffer is the list of byte strings as received, read from ``_pos`` in the first:
    taking bytes copies them once (a whole received string not at all), and nothing else
    moves. (A bytearray that takes each receive and gives up its front at each take moves
    every byte two or three times more: with 1 MiB receives and 64 KiB packets that copying
    was a tenth of a block server's CPU taking a Hadoop client's write.)"""

    def __init__(self, stream: trio.abc.Stream, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.max_frame = max_frame
        self._chunks: deque[bytes] = deque()
        self._pos = 0       # bytes of the first chunk already taken
        self._size = 0      # bytes received and not taken
        self._limit = receive_limit(stream)

    async def _fill(self, need: int) -> None:
        """Until ``need`` bytes are buffered."""
        while self._size < need:
            try:
                chunk = await self.stream.receive_some(
                    min(self._limit, max(_RECEIVE_CHUNK, need - self._size)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise connection_lost(self.stream, exc) from None
            if not chunk:
                raise closed(self.stream)
            if type(chunk) is not bytes:   # a stream may hand out views: take copies
                chunk = bytes(chunk)
            self._chunks.append(chunk)
            self._size += len(chunk)

    def buffered(self) -> int:
        """Bytes received and not yet taken (a receive of up to this many will not wait)."""
        return self._size

    def peek(self, n: int) -> bytes:
        """Up to ``n`` of the bytes received and not yet taken, left in place."""
        n = min(n, self._size)
        if not n:
            return b""
        first, pos = self._chunks[0], self._pos
        if pos + n <= len(first):
            return bytes(first[pos:pos + n])
        parts, left = [], n
        for chunk in self._chunks:
            piece = chunk[pos:pos + left]
            parts.append(piece)
            left -= len(piece)
            pos = 0
            if not left:
                break
        return b"".join(parts)

    def unpack_buffered(self, layout, offset: int = 0) -> tuple | None:
        """``layout`` (a ``struct.Struct``) unpacked from the bytes received at ``offset``,
        left in place; None while fewer have arrived."""
        end = offset + layout.size
        if self._size < end:
            return None
        first, pos = self._chunks[0], self._pos
        if pos + end <= len(first):
            return layout.unpack_from(first, pos + offset)
        return layout.unpack_from(self.peek(end), offset)

    async def receive_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``EOFError`` if the peer closes first."""
        if n <= 0:
            return b""
        await self._fill(n)
        return self.take(n)

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes, which were received already (``buffered() >= n``): taken
        without a trip through trio."""
        chunks = self._chunks
        first, pos = chunks[0], self._pos
        self._size -= n
        end = pos + n
        if end < len(first):
            self._pos = end
            return first[pos:end]
        if end == len(first):
            chunks.popleft()
            self._pos = 0
            return first[pos:] if pos else first
        parts = [first[pos:] if pos else first]
        chunks.popleft()
        left = n - len(parts[0])
        while left:
            chunk = chunks[0]
            if len(chunk) <= left:
                parts.append(chunk)
                chunks.popleft()
                left -= len(chunk)
            else:
                parts.append(chunk[:left])
                self._pos = left
                break
        else:
            self._pos = 0
        return b"".join(parts)

    async def receive_frame(self) -> object:
        """The next frame's decoded body; ``EOFError`` on a clean close between frames."""
        await self._fill(4)
        (length,) = self.unpack_buffered(LENGTH)
        if length > self.max_frame:
            raise too_large(length, self.max_frame)
        self.take(4)
        try:
            body = await self.receive_exactly(length)
        except EOFError:
            raise ProtocolError(f"connection closed inside a frame of {length} bytes") from None
        return unpackb(body)

    async def send_frame(self, obj) -> None:
        await self.send_all(encode_frame(obj))

    async def send_all(self, data) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise connection_lost(self.stream, exc) from None

    async def aclose(self) -> None:
        await self.stream.aclose()


#: frames up to this size (length prefix included) are read without reserving a server's
#: ``ByteBudget``: ordinary calls never wait for one; a connection holds at most this much
#: unreserved
UNBUDGETED_FRAME = 64 << 10
_OUT_HIGH_WATER = 4 << 20   # queued bytes above which senders wait (``backlogged``)


@dataclass
class ChannelStats:
    """What batching achieved on one channel: frames per read and per write."""

    frames_in: int = 0
    reads: int = 0
    frames_out: int = 0
    writes: int = 0


class FrameChannel:
    """Batched frames over a stream, for the RPC layer (many small frames both ways).

    Why not ``FramedStream``: every trio socket call that succeeds still yields to the
    scheduler, a send under a ``trio.Lock`` yields again, and on loopback TCP each ``send``
    syscall carries the whole delivery to the peer; for a metadata RPC of ~100 bytes each way
    that cost more than the server's handler. So on a ``trio.SocketStream`` this

    - reads whatever the socket holds into one buffer and hands back every complete frame
      at once (``receive_batch``): a connection shared by many callers (Hadoop IPC style)
      costs one wake-up and one ``read`` per batch of requests or replies;
    - sends with ``send_nowait`` (no await, no lock, a frame is queued whole): the first
      frame since the flusher task last ran is written at once (a lone call waits for
      nothing), the frames sent after it queue until the flusher runs, after the other
      tasks of the same scheduler round, and leave in one ``write``: the replies to one
      batch, or the requests of the many tasks one batch of replies woke, travel together.
      A sender that knows more frames follow passes ``defer`` (the RPC server, for a reply
      while other calls of the connection are running): then the first one waits too. A
      task that makes several frames in one step may ``hold`` them and ``flush_nowait``
      once: one write from that task, no flusher wake-up (the RPC reader's answers to the
      reads of one batch of requests).

    Other streams (in-memory test streams) get the same interface through the stream's own
    awaited calls. Frames and their limits are ``FramedStream``'s: 4-byte length + msgpack
    body, ``FrameTooLarge`` above ``max_frame`` before any body is read, ``ProtocolError``
    for a body that is not msgpack; frames before a bad one are delivered first, the error
    comes with the next receive. A flush that cannot make progress for ``send_timeout``
    (the peer reads nothing) breaks the channel and closes the stream.

    Memory: with a ``budget`` (``fs.limits.ByteBudget``, shared by a server's connections)
    a frame larger than ``UNBUDGETED_FRAME`` is read only once its whole size is reserved
    there (the read waits until it fits); the reservation is released when the frame has
    been parsed or the channel closes. ``partial_since`` and ``last_received`` let the owner
    time out a frame that never completes and a connection that stays idle
    (``awaiting_budget``: neither, the wait is the server's).

    Concurrency contract: one task receives at a time; ``send_nowait`` may be called from any
    task of the channel's trio thread; the flusher runs in ``nursery`` until ``aclose`` or
    ``finish``.
    """

    def __init__(self, stream: trio.abc.Stream, nursery: trio.Nursery,
                 max_frame: int = DEFAULT_MAX_FRAME, *, send_timeout: float | None = None,
                 on_send_timeout=None, budget=None):
        self.stream = stream
        self.max_frame = max_frame
        self._budget = budget
        self._reserved = 0        # bytes of ``budget`` this channel holds
        self._frame_size = 0      # 4 + length of the incomplete frame at the buffer's head
        #: trio time of the read that brought the first bytes of the incomplete frame at
        #: the head of the buffer; None while the buffer holds no partial frame
        self.partial_since: float | None = None
        self.last_received = trio.current_time()   # trio time of the last read with data
        #: True while a read waits for ``budget`` to have room for the frame at the head
        self.awaiting_budget = False
        self.send_timeout = math.inf if send_timeout is None else send_timeout
        self._on_send_timeout = on_send_timeout
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._inbuf = bytearray()
        self._want = 4            # bytes the buffer must hold before the next frame parses
        self._error: BaseException | None = None   # raised by the next receive
        self._out = bytearray()   # queued bytes the flusher has not written yet
        self._wake = trio.Event()         # set: the flusher has work
        self._holding = False             # frames queued with ``hold`` since the last flush
        # a sender waiting in drained() waits on this; the flusher sets it after a write
        # (created only then: no Event per write on the hot path)
        self._progress: trio.Event | None = None
        self._finishing = False
        self._finished = trio.Event()
        self.broken: BaseException | None = None   # set when a send failed or on close
        self.stats = ChannelStats()
        nursery.start_soon(self._flusher)

    # ------------------------------------------------------------------ receiving
    async def receive_frame(self) -> object:
        """One frame (the hello): parses no further, so a later ``max_frame`` applies to the
        frames after it."""
        while True:
            frames = self._parse(1)
            if frames:
                return frames[0]
            await self._read()

    async def receive_batch(self) -> list:
        """Every complete frame the stream holds (at least one); ``EOFError`` on a clean
        close between frames."""
        while True:
            frames = self._parse(None)
            if frames:
                return frames
            await self._read()

    def _parse(self, limit: int | None) -> list:
        frames: list = []
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        buf, pos, end = self._inbuf, 0, len(self._inbuf)
        try:
            while end - pos >= 4 and (limit is None or len(frames) < limit):
                (length,) = LENGTH.unpack_from(buf, pos)
                if length > self.max_frame:
                    raise too_large(length, self.max_frame)
                if end - pos - 4 < length:
                    self._want = 4 + length - (end - pos)
                    self._frame_size = 4 + length
                    break
                body = buf[pos + 4:pos + 4 + length]
                pos += 4 + length          # a bad body is consumed: the next frame stays whole
                frames.append(unpackb(body))
            else:
                self._want = 4 - (end - pos) if end - pos < 4 else 0
                self._frame_size = 0
        except (FrameTooLarge, ProtocolError) as exc:
            if not frames:
                raise
            self._error = exc
        finally:
            if pos:
                del buf[:pos]
            if not buf:
                self.partial_since = None
            elif pos or self.partial_since is None:   # a new frame began with the last read
                self.partial_since = self.last_received
            if self._reserved > self._budgeted_need():
                self._release_budget(self._reserved - self._budgeted_need())
        self.stats.frames_in += len(frames)
        return frames

    def _budgeted_need(self) -> int:
        return self._frame_size if self._frame_size > UNBUDGETED_FRAME else 0

    def _release_budget(self, n: int) -> None:
        self._reserved -= n
        self._budget.release(n)

    async def _read(self) -> None:
        if self._budget is not None and self._budgeted_need() > self._reserved:
            more = self._budgeted_need() - self._reserved
            self.awaiting_budget = True
            try:
                await self._budget.acquire(more)
            finally:
                self.awaiting_budget = False
            self._reserved += more
            # the peer is timed from when the server can read it, not while it waited
            self.partial_since = trio.current_time()
        want = max(65536, min(self._want, _RECEIVE_CHUNK))
        sock = self._socket
        if sock is None:
            chunk = await self._receive_some(want)
        else:
            waited = False
            while True:
                try:
                    chunk = os.read(sock.fileno(), want)
                    break
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise connection_lost(self.stream, exc) from None
                try:
                    await trio.lowlevel.wait_readable(sock)
                except (trio.ClosedResourceError, OSError, ValueError) as exc:
                    raise ServerUnavailable(f"connection lost: {exc}") from None
                waited = True
            if not waited:
                # data without waiting: yield once per batch, so a peer that keeps the
                # socket full cannot starve the other tasks (and cancellation gets in)
                await trio.lowlevel.checkpoint()
        if not chunk:
            if self._inbuf:
                raise ProtocolError(f"connection closed inside a frame "
                                    f"({len(self._inbuf)} bytes of it received)")
            raise closed(self.stream)
        self.stats.reads += 1
        self.last_received = trio.current_time()
        self._inbuf += chunk

    async def _receive_some(self, n: int) -> bytes:
        try:
            return await self.stream.receive_some(min(n, receive_limit(self.stream)))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise connection_lost(self.stream, exc) from None

    # ------------------------------------------------------------------ sending
    def send_nowait(self, obj, *, defer: bool = False, hold: bool = False) -> None:
        """Queue one frame for the flusher; ``ServerUnavailable`` if the channel is broken;
        encoding errors (``TypeError``/``ValueError``) before anything is queued.
        ``defer``: even a first frame waits for the flusher (the caller knows more frames
        follow in this scheduler round: one write for all of them, not two). ``hold``:
        queue it without waking the flusher; the caller calls ``flush_nowait`` before it
        next awaits (the RPC reader, for the replies it makes while parsing one batch)."""
        data = encode_frame(obj)
        if self.broken is not None:
            raise ServerUnavailable(f"connection lost: {self.broken}")
        self.stats.frames_out += 1
        if hold:
            self._out += data
            self._holding = True
            return
        if not defer and not self._out and not self._wake.is_set() and self._socket is not None:
            # the first frame since the flusher last ran goes out at once (no added
            # latency for a lone call); frames sent after it in the same scheduler round
            # queue behind it and leave together when the flusher runs
            try:
                sent = os.write(self._socket.fileno(), data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._break(exc)
                raise ServerUnavailable(f"connection lost: {exc}") from None
            self.stats.writes += sent > 0
            if sent < len(data):
                self._out += memoryview(data)[sent:]
        else:
            self._out += data
        self._wake.set()

    def flush_nowait(self) -> None:
        """Write what is queued from the caller's task, without waiting: the frames a task
        ``hold``-queued in one step leave in one ``write``, and the flusher is woken only
        for what the socket did not take (a wake-up per batch saved)."""
        if not self._holding:
            return
        self._holding = False
        if not self._out:
            return
        if self._socket is not None and self.broken is None:
            try:
                sent = os.write(self._socket.fileno(), self._out)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._break(exc)
                return
            if sent:
                del self._out[:sent]
                self.stats.writes += 1
                self._wake_drained()
            if not self._out:
                return
        self._wake.set()

    @property
    def sending(self) -> bool:
        """Frames are queued that the flusher has not written yet."""
        return bool(self._out)

    @property
    def backlogged(self) -> bool:
        """More than the high-water mark of bytes queued: senders should ``await drained()``."""
        return len(self._out) > _OUT_HIGH_WATER

    async def drained(self) -> None:
        """Wait until the queue is below the high-water mark (or the channel broke)."""
        while self.backlogged and self.broken is None:
            if self._progress is None:
                self._progress = trio.Event()
            await self._progress.wait()

    async def _flusher(self) -> None:
        try:
            while self.broken is None:
                if not self._out:
                    if self._finishing:
                        break
                    await self._wake.wait()
                    # (frames queued from here on wake us again; until here they queued)
                    self._wake = trio.Event()
                    continue
                if self._socket is None:
                    data = bytes(self._out)
                    del self._out[:]
                    with trio.fail_after(self.send_timeout):
                        await self.stream.send_all(data)
                    self.stats.writes += 1
                else:
                    try:
                        sent = os.write(self._socket.fileno(), self._out)
                    except BlockingIOError:
                        with trio.fail_after(self.send_timeout):
                            await trio.lowlevel.wait_writable(self._socket)
                        continue
                    del self._out[:sent]
                    self.stats.writes += 1
                    # (no yield here: the next loop turn waits for new frames, which yields)
                self._wake_drained()
        except trio.TooSlowError:
            self._break(trio.TooSlowError(f"peer read nothing for {self.send_timeout:g} s"))
            if self._on_send_timeout is not None:
                self._on_send_timeout()
            with trio.CancelScope(shield=True):
                await self.stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError) as exc:
            self._break(exc)
        finally:
            self._wake_drained()
            self._finished.set()

    def _wake_drained(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    async def finish(self) -> None:
        """Write what is queued (within ``send_timeout``), then stop the flusher."""
        self._finishing = True
        self._wake.set()
        await self._finished.wait()

    def _break(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
        if self._reserved:    # a frame that will never be parsed frees its share at once
            self._release_budget(self._reserved)
        self._out.clear()
        self._wake.set()
        self._wake_drained()

    async def aclose(self) -> None:
        """Drop what is queued, stop the flusher, close the stream."""
        self._break(ServerUnavailable("connection closed"))
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
