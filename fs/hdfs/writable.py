"""Hadoop's ``Writable`` primitives (``WritableUtils`` variable-length integers, ``Text``):
the encoding of token identifiers and of the token storage file Hadoop's client reads.

A vlong is one byte for -112..127; otherwise a length byte (-113..-120 positive, -121..-128
negative, 1..8 bytes follow) then the value's bytes big-endian, one's complement for a
negative. ``Text`` is a vint length then UTF-8. The reader bounds every length by what is
left, so hostile input cannot make it allocate more than it was given.

Concurrency contract: pure.
"""

from __future__ import annotations

from ..errors import InvalidArgument

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def vlong(value: int) -> bytes:
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise InvalidArgument(f"{value} does not fit a Hadoop vlong (64 bits)")
    if -112 <= value <= 127:
        return (value & 0xFF).to_bytes(1, "big")
    negative = value < 0
    if negative:
        value = ~value
    size = (value.bit_length() + 7) // 8
    first = (-120 if negative else -112) - size
    return (first & 0xFF).to_bytes(1, "big") + value.to_bytes(size, "big")


def vint(value: int) -> bytes:
    if not _INT_MIN <= value <= _INT_MAX:
        raise InvalidArgument(f"{value} does not fit a Hadoop vint (32 bits)")
    return vlong(value)


def text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return vint(len(raw)) + raw


def blob(value: bytes) -> bytes:
    """A vint length then the bytes (a token's identifier and password)."""
    return vint(len(value)) + bytes(value)


class Reader:
    """Reads Writable fields from ``data``; ``InvalidArgument`` naming ``what`` on any
    malformed or truncated field."""

    def __init__(self, data: bytes, what: str):
        self.data = memoryview(bytes(data))
        self.pos = 0
        self.what = what

    def fail(self, why: str):
        raise InvalidArgument(f"{self.what}: {why} at byte {self.pos}")

    def take(self, n: int) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            self.fail(f"{n} bytes announced, {len(self.data) - self.pos} left")
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def byte(self) -> int:
        return int.from_bytes(self.take(1), "big", signed=True)

    def vlong(self) -> int:
        first = self.byte()
        if first >= -112:
            return first
        negative = first < -120
        size = (-120 - first) if negative else (-112 - first)
        value = int.from_bytes(self.take(size), "big")
        return ~value if negative else value

    def vint(self) -> int:
        value = self.vlong()
        if not _INT_MIN <= value <= _INT_MAX:
            self.fail(f"{value} does not fit a vint")
        return value

    def blob(self, limit: int) -> bytes:
        n = self.vint()
        if n > limit:
            self.fail(f"length {n} over the limit {limit}")
        return self.take(n)

    def text(self, limit: int = 1 << 20) -> str:
        raw = self.blob(limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail("text is not UTF-8")

    def count(self) -> int:
        """A vint count of records that follow; each takes at least one byte, so a count
        over what is left is malformed (and never drives a loop or an allocation)."""
        n = self.vint()
        if n < 0 or n > len(self.data) - self.pos:
            self.fail(f"count {n} with {len(self.data) - self.pos} bytes left")
        return n

    def end(self) -> None:
        if self.pos != len(self.data):
            self.fail(f"{len(self.data) - self.pos} bytes left over")
