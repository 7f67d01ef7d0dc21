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


MAX_CONTAINER_ITEMS = 4 << 20   # entries in one array or map


class _TooManyContainers(Exception):
    pass


def unpackb(body) -> object:
    """Decode a frame body with bounds, so a small frame cannot become a huge object graph.

    msgpack's own limits scale with the buffer; a 60 MiB frame of nested empty arrays decodes
    into ~60 M Python lists (gigabytes, tens of seconds). Here one array/map holds at most
    ``MAX_CONTAINER_ITEMS`` entries and the frame at most one container per 4 body bytes
    (real messages use far fewer: a block report entry is ~25 bytes)."""
    size = len(body)
    budget = [max(1024, size // 4)]

    def count(obj):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooManyContainers
        return obj

    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False, list_hook=count,
                               object_hook=count, max_array_len=MAX_CONTAINER_ITEMS,
                               max_map_len=MAX_CONTAINER_ITEMS, max_str_len=size,
                               max_bin_len=size, max_ext_len=size)
    except _TooManyContainers:
        raise ProtocolError(f"frame of {size} bytes nests more than {max(1024, size // 4)} "
                            f"arrays/maps") from None
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"frame body is not valid msgpack: {exc}") from None


def brief(obj, limit: int = 120) -> str:
    """A short description of a decoded object for error messages, without building the
    repr of a huge one first."""
    if isinstance(obj, (list, tuple, dict, str, bytes)) and len(obj) > 16:
        return f"<{type(obj).__name__} of {len(obj)} items>"
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


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
