"""Reading a byte range of a file in bounded preads: what text splits, compressed streams
and whole-file formats all do with a blocking ``fs.Client`` stream.

Why it exists: it is the ground floor of the readers; ``textformats``, ``formats`` and
``compression`` (which ``splits`` asks whether a file can be cut) all build on it, and
``splits`` takes its read size.

Concurrency contract: pure generator over a blocking stream; no shared state.
"""

from __future__ import annotations

READ_CHUNK = 4 << 20          # bytes per pread while reading a split


def read_range(stream, begin: int, stop: int, chunk_size: int = READ_CHUNK):
    """The bytes ``[begin, stop)`` in chunks of ``chunk_size``."""
    pos = begin
    while pos < stop:
        chunk = stream.pread(pos, min(chunk_size, stop - pos))
        if not chunk:
            break
        yield chunk
        pos += len(chunk)
