"""CRC32C combine math (HDFS COMPOSITE-CRC): ``CRC(A||B)`` from ``CRC(A)``, ``CRC(B)`` and
``len(B)``, so a file's CRC32C follows from its stored chunk CRCs without reading its data.

Why it exists: the chunk CRCs a replica's meta file keeps depend on ``bytes_per_checksum``
and the block boundaries; combined in order they give the CRC32C of the whole content, which
depends on nothing but the bytes (equal content, equal checksum, whatever the layout).

The math is zlib's ``crc32_combine`` for the reflected Castagnoli polynomial: appending
``n`` bytes multiplies the first CRC by ``x^(8n)`` modulo the polynomial (the init and final
XOR of both CRCs cancel out), then the second CRC is XORed in. Multiplying by a fixed power
is linear over GF(2), so ``Shifter`` precomputes it as four 256-entry tables: folding the
thousands of equal-length chunk CRCs of a block costs a few lookups each.

Concurrency contract: pure functions and immutable tables, no I/O; safe from any thread.
"""

from __future__ import annotations

import functools

POLY = 0x82F63B78          # CRC32C (Castagnoli), reflected
_ONE = 1 << 31             # the polynomial 1 in the reflected representation


def multmodp(a: int, b: int) -> int:
    """``a(x) * b(x)`` modulo the polynomial (reflected representation)."""
    product = 0
    m = _ONE
    while m and a:
        if a & m:
            product ^= b
            a ^= m
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return product


def _x2n_table() -> list[int]:
    """``x^(2^k)`` modulo the polynomial for k = 0..31 (the square-and-multiply steps)."""
    table, p = [], 1 << 30     # x^1
    for _ in range(32):
        table.append(p)
        p = multmodp(p, p)
    return table


_X2N = _x2n_table()


def x8nmodp(n: int) -> int:
    """``x^(8n)`` modulo the polynomial: the operator that appends ``n`` zero bytes."""
    if n < 0:
        raise ValueError(f"length {n} is negative")
    p, k = _ONE, 3             # 8n = n * 2^3
    while n:
        if n & 1:
            p = multmodp(_X2N[k % 32], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of ``A || B`` from ``crc1 = CRC32C(A)``, ``crc2 = CRC32C(B)``, ``len2 = len(B)``."""
    return multmodp(x8nmodp(len2), crc1) ^ crc2


class Shifter:
    """``crc -> crc * x^(8n) mod P`` for one fixed ``n``, as table lookups (linear in crc)."""

    __slots__ = ("length", "t0", "t1", "t2", "t3")

    def __init__(self, length: int):
        self.length = length
        op = x8nmodp(length)
        bits = [multmodp(op, 1 << i) for i in range(32)]   # images of single bits
        tables = []
        for byte in range(4):
            table = [0] * 256
            for v in range(1, 256):
                low = v & -v                      # v = low-bit + rest: reuse the rest's entry
                table[v] = table[v ^ low] ^ bits[8 * byte + low.bit_length() - 1]
            tables.append(table)
        self.t0, self.t1, self.t2, self.t3 = tables

    def __call__(self, crc: int) -> int:
        return (self.t0[crc & 0xFF] ^ self.t1[(crc >> 8) & 0xFF]
                ^ self.t2[(crc >> 16) & 0xFF] ^ self.t3[crc >> 24])


@functools.lru_cache(maxsize=16)
def shifter(length: int) -> Shifter:
    """A ``Shifter`` per chunk size: a block server sees only a handful of them."""
    return Shifter(length)


def combine_chunks(crcs, chunk_len: int, last_len: int | None = None, crc: int = 0) -> int:
    """Fold chunk CRCs in order onto ``crc`` (the CRC32C of what precedes them, 0 for
    nothing): every chunk covers ``chunk_len`` bytes except the last, which covers
    ``last_len`` (None: ``chunk_len`` too)."""
    crcs = list(crcs)
    if not crcs:
        return crc
    full = crcs if last_len is None else crcs[:-1]
    shift = shifter(chunk_len)
    for chunk_crc in full:
        crc = shift(crc) ^ chunk_crc
    if last_len is not None:
        crc = crc32c_combine(crc, crcs[-1], last_len)
    return crc


class CompositeCrc:
    """The running CRC32C of consecutive pieces known only by their CRC and length."""

    def __init__(self):
        self.crc = 0
        self.length = 0

    def add(self, crc: int, length: int) -> None:
        self.crc = crc32c_combine(self.crc, crc, length) if self.length else crc
        self.length += length

    def hex(self) -> str:
        return f"{self.crc:08x}"
