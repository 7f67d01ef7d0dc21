"""The frame codec every leasefs connection shares: 4-byte big-endian body length +
msgpack body, encoded and decoded with bounds. No I/O and no trio, so a process that
makes one blocking call (``fs.blockingrpc``) need not import an event loop.

A length above the reader's ``max_frame`` is refused before anything is allocated
(``too_large``); a body that is not valid msgpack, or that would nest into a huge object
graph, raises ``ProtocolError`` (``unpackb``).

Concurrency contract: pure functions; ``packb`` keeps one ``msgpack.Packer`` per thread.
"""

from __future__ import annotations

import struct
import threading

import msgpack

from .errors import FrameTooLarge, ProtocolError

LENGTH = struct.Struct(">I")
DEFAULT_MAX_FRAME = 64 << 20
_local = threading.local()


def packb(obj) -> bytes:
    """``msgpack.packb(obj, use_bin_type=True)`` with one ``Packer`` per thread, reused
    (``packb`` builds a Packer and its buffer per call; this runs several times per RPC).
    A failed pack leaves the Packer empty."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(obj)


MAX_CONTAINER_ITEMS = 4 << 20   # entries in one array or map
# the fewest arrays/maps a frame body may nest (a bigger body: one per 4 bytes)
_UNCOUNTED_BODY = 1024


class _TooManyContainers(Exception):
    pass


def unpackb(body) -> object:
    """Decode a frame body with bounds, so a small frame cannot become a huge object graph.

    msgpack's own limits scale with the buffer; a 60 MiB frame of nested empty arrays decodes
    into ~60 M Python lists (gigabytes, tens of seconds). Here one array/map holds at most
    ``MAX_CONTAINER_ITEMS`` entries and the frame at most one container per 4 body bytes
    (real messages use far fewer: a block report entry is ~25 bytes)."""
    size = len(body)
    if size <= _UNCOUNTED_BODY:
        # every array or map takes at least one byte, so a body this small cannot exceed
        # the budget: decode without the per-container hook (most requests and replies)
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError(f"frame body is not valid msgpack: {exc}") from None
    budget_total = max(_UNCOUNTED_BODY, size // 4)
    budget = [budget_total]

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
        raise ProtocolError(f"frame of {size} bytes nests more than {budget_total} "
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


def too_large(length: int, max_frame: int) -> FrameTooLarge:
    """The error for a frame length above the maximum; one whose bytes open a TLS record
    (0x16 0x03: a handshake) says so, since that is a peer with tls = on at a plaintext
    port, not a huge frame."""
    if length >> 16 == 0x1603:
        return FrameTooLarge("the peer started a TLS handshake, but this server has tls = off")
    return FrameTooLarge(f"frame of {length} bytes exceeds the maximum of {max_frame} bytes")


def encode_frame(obj) -> bytes:
    body = packb(obj)
    return LENGTH.pack(len(body)) + body
