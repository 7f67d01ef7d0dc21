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

import struct

import msgpack
import trio

from .errors import FrameTooLarge, ProtocolError, ServerUnavailable

LENGTH = struct.Struct(">I")
DEFAULT_MAX_FRAME = 64 << 20
_RECEIVE_CHUNK = 1 << 20


def packb(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpackb(body) -> object:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"frame body is not valid msgpack: {exc}") from None


def encode_frame(obj) -> bytes:
    body = packb(obj)
    return LENGTH.pack(len(body)) + body


class FramedStream:
    """A stream with a receive buffer: whole frames, exact byte counts, raw sends."""

    def __init__(self, stream: trio.abc.Stream, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.max_frame = max_frame
        self._buf = bytearray()

    async def _fill(self, need: int) -> None:
        while len(self._buf) < need:
            try:
                chunk = await self.stream.receive_some(max(_RECEIVE_CHUNK, need - len(self._buf)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise ServerUnavailable(f"connection lost: {exc}") from None
            if not chunk:
                raise EOFError("peer closed the connection")
            self._buf += chunk

    async def receive_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``EOFError`` if the peer closes first."""
        if n <= 0:
            return b""
        if not self._buf and n >= _RECEIVE_CHUNK:
            # large read: gather pieces in a list and join once (no repeated buffer growth)
            parts, got = [], 0
            while got < n:
                try:
                    chunk = await self.stream.receive_some(n - got)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise ServerUnavailable(f"connection lost: {exc}") from None
                if not chunk:
                    raise EOFError("peer closed the connection")
                parts.append(chunk)
                got += len(chunk)
            return b"".join(parts)
        await self._fill(n)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def receive_frame(self) -> object:
        """The next frame's decoded body; ``EOFError`` on a clean close between frames."""
        await self._fill(4)
        (length,) = LENGTH.unpack_from(self._buf)
        if length > self.max_frame:
            raise FrameTooLarge(
                f"frame of {length} bytes exceeds the maximum of {self.max_frame} bytes")
        del self._buf[:4]
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
            raise ServerUnavailable(f"connection lost: {exc}") from None

    async def aclose(self) -> None:
        await self.stream.aclose()
