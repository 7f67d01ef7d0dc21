"""Compressed text files: which codec a file name means (read), which codec and file
extension the ``compression`` option means (write), and incremental decompression and
compression of byte streams.

Why: Spark reads ``part-0.csv.gz`` by decompressing it (Hadoop picks the codec from the file
extension) and writes ``.csv.gz`` when asked for ``compression=gzip``; a source that read the
compressed bytes as text would give garbage rows without an error. Codecs, as Hadoop writes
them:

- gzip (``.gz``, concatenated members allowed), bzip2 (``.bz2``, concatenated streams),
  deflate (``.deflate``: a zlib stream, Hadoop's ``DefaultCodec``) and zstd (``.zst`` /
  ``.zstd``, frames) are plain streams;
- lz4 (``.lz4``) and snappy (``.snappy``) use Hadoop's ``BlockCompressorStream`` framing, not
  lz4-frame or snappy-framing: blocks of a 4-byte big-endian uncompressed length followed by
  chunks of a 4-byte big-endian compressed length and a raw lz4 block / raw snappy data.

A name with another compression extension (``.xz``, ``.lzo``, ``.br``, ``.zip``...) is
refused naming the path and codec. A compressed file is one split (a stream cannot be
entered in the middle). Data is decompressed in pieces of at most ``CHUNK`` input bytes, so
memory stays bounded by what the caller keeps.

Concurrency contract: pure functions and per-stream objects; no shared state.
"""

from __future__ import annotations

import bz2
import posixpath
import struct
import zlib
from dataclasses import dataclass

import pyarrow as pa

from fs.errors import InvalidArgument

from .ranges import read_range

CHUNK = 1 << 20              # compressed bytes read per step
HADOOP_BLOCK = 128 << 10     # uncompressed bytes per lz4/snappy block we write (Hadoop's
#                              decompressor buffer is 256 KiB; a block must fit in it)
ZSTD_FRAME = 4 << 20         # uncompressed bytes per zstd frame we write


@dataclass(frozen=True)
class Codec:
    """A Hadoop compression codec as Spark names it and the extension it writes."""

    name: str
    extension: str


CODECS = {c.name: c for c in (Codec("gzip", ".gz"), Codec("bzip2", ".bz2"),
                              Codec("deflate", ".deflate"), Codec("zstd", ".zst"),
                              Codec("lz4", ".lz4"), Codec("snappy", ".snappy"))}
# Spark's short names for the ``compression`` / ``codec`` option
WRITE_NAMES = {"none": None, "uncompressed": None, "gzip": "gzip", "bzip2": "bzip2",
               "deflate": "deflate", "zstd": "zstd", "lz4": "lz4", "snappy": "snappy"}
READ_EXTENSIONS = {".gz": "gzip", ".bz2": "bzip2", ".deflate": "deflate", ".zst": "zstd",
                   ".zstd": "zstd", ".lz4": "lz4", ".snappy": "snappy"}
UNSUPPORTED_EXTENSIONS = {".xz": "xz", ".lzma": "lzma", ".lzo": "lzo", ".lzo_deflate": "lzo",
                          ".br": "brotli", ".zip": "zip", ".7z": "7z", ".z": "compress"}


def codec_for_path(path: str) -> str | None:
    """The codec a data file's name calls for (``None``: not compressed); a compression
    extension this source cannot read is refused naming the path."""
    ext = posixpath.splitext(path)[1].lower()
    if ext in UNSUPPORTED_EXTENSIONS:
        raise InvalidArgument(f"{path}: compressed with {UNSUPPORTED_EXTENSIONS[ext]} "
                              f"(by its extension), which the leasefs data source cannot "
                              f"read; readable: {', '.join(sorted(READ_EXTENSIONS))}")
    return READ_EXTENSIONS.get(ext)


def write_codec(options) -> Codec | None:
    """The codec of the ``compression`` (alias ``codec``) write option, or ``None``."""
    value = options.get("compression") if options is not None else None
    if value is None and options is not None:
        value = options.get("codec")
    if value is None:
        return None
    name = str(value).strip().lower()
    if name not in WRITE_NAMES:
        raise InvalidArgument(f"leasefs data source: unknown compression {value!r} (one of "
                              f"{', '.join(WRITE_NAMES)})")
    return CODECS[WRITE_NAMES[name]] if WRITE_NAMES[name] else None


# --------------------------------------------------------------------------- reading

def _members(chunks, new_decompressor, truncated):
    """Concatenated members (gzip) or streams (bzip2), each decompressed by a fresh
    decompressor, as Hadoop's codecs read them; ``truncated`` is raised when the data ends
    inside one."""
    dec = new_decompressor()
    started = False
    for data in chunks:
        while data:
            started = True
            out = dec.decompress(data)
            if out:
                yield out
            if dec.eof:
                data, started = dec.unused_data, False
                dec = new_decompressor()
            else:
                data = b""
    if started:
        raise truncated


def _gzip_members(chunks):
    return _members(chunks, lambda: zlib.decompressobj(wbits=31),
                    zlib.error("truncated gzip stream"))


def _bzip2_streams(chunks):
    return _members(chunks, bz2.BZ2Decompressor, OSError("truncated bzip2 stream"))


def _deflate(chunks):
    dec = zlib.decompressobj()
    for data in chunks:
        out = dec.decompress(data)
        if out:
            yield out
    tail = dec.flush()
    if tail:
        yield tail
    if not dec.eof:
        raise zlib.error("truncated deflate (zlib) stream")


class _Chunks:
    """A read-only file over an iterator of byte chunks (for pyarrow's streams)."""

    def __init__(self, chunks):
        self._it, self._buf, self.closed = iter(chunks), b"", False

    def read(self, n=-1):
        while n < 0 or len(self._buf) < n:
            nxt = next(self._it, None)
            if nxt is None:
                break
            self._buf += nxt
        if n < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def readable(self):
        return True

    def seekable(self):
        return False

    def writable(self):
        return False

    def close(self):
        self.closed = True


def _zstd(chunks):
    raw = pa.PythonFile(_Chunks(chunks), mode="r")
    with pa.CompressedInputStream(raw, "zstd") as src:
        while True:
            out = src.read(CHUNK)
            if not out:
                break
            yield out


def _hadoop_blocks(chunks, codec: str):
    """Hadoop ``BlockDecompressorStream`` framing (module docstring)."""
    dec = pa.Codec("lz4_raw" if codec == "lz4" else "snappy")
    buf = b""
    it = iter(chunks)

    def need(n):
        nonlocal buf
        while len(buf) < n:
            nxt = next(it, None)
            if nxt is None:
                return False
            buf += nxt
        return True

    while need(1):
        if not need(4):
            raise OSError(f"truncated {codec} block header")
        (raw_len,) = struct.unpack(">I", buf[:4])
        buf = buf[4:]
        done = 0
        while done < raw_len:
            if not need(4):
                raise OSError(f"truncated {codec} chunk header")
            (size,) = struct.unpack(">I", buf[:4])
            if not need(4 + size):
                raise OSError(f"truncated {codec} chunk")
            chunk, buf = buf[4:4 + size], buf[4 + size:]
            if done == 0 and codec == "lz4" and size:
                # Hadoop's Lz4Compressor writes a block as one chunk; a raw lz4 block does
                # not say its own length, so a second chunk could not be sized
                out_len = raw_len
            elif codec == "snappy":
                out_len = _snappy_length(chunk)
            else:
                raise OSError("lz4 block split into several chunks is not supported")
            out = dec.decompress(chunk, decompressed_size=out_len, asbytes=True)
            done += len(out)
            if done > raw_len:
                raise OSError(f"{codec} block longer than its header says")
            yield out


def _snappy_length(chunk: bytes) -> int:
    """Raw snappy data starts with its uncompressed length as a varint."""
    value = shift = 0
    for byte in chunk[:5]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        shift += 7
    raise OSError("bad snappy chunk header")


_DECODERS = {"gzip": _gzip_members, "bzip2": _bzip2_streams, "deflate": _deflate,
             "zstd": _zstd}


def decompressed_chunks(stream, length: int, codec: str, path: str):
    """The decompressed bytes of a whole file, in pieces; corrupt data is an
    ``InvalidArgument`` naming the path and codec."""
    chunks = read_range(stream, 0, length, CHUNK)
    gen = (_hadoop_blocks(chunks, codec) if codec in ("lz4", "snappy")
           else _DECODERS[codec](chunks))
    try:
        yield from gen
    except (zlib.error, OSError, EOFError, ValueError, pa.ArrowException) as exc:
        raise InvalidArgument(f"{path}: not valid {codec} data ({exc})") from None


def file_chunks(stream, path: str, length: int):
    """A whole file's (decompressed, by its extension) bytes in pieces."""
    codec = codec_for_path(path)
    if codec is None:
        return read_range(stream, 0, length, CHUNK)
    return decompressed_chunks(stream, length, codec, path)


# --------------------------------------------------------------------------- writing

class CompressingWriter:
    """A write-only file that compresses into ``out`` with ``codec`` (``close`` writes the
    trailer; ``out`` itself is left open for its owner)."""

    def __init__(self, out, codec: Codec):
        self.out, self.codec = out, codec
        self._pending = bytearray()
        if codec.name == "gzip":
            self._obj = zlib.compressobj(6, zlib.DEFLATED, 31)
        elif codec.name == "deflate":
            self._obj = zlib.compressobj(6)
        elif codec.name == "bzip2":
            self._obj = bz2.BZ2Compressor(9)
        else:
            self._obj = None
            self._block = HADOOP_BLOCK if codec.name in ("lz4", "snappy") else ZSTD_FRAME
            self._arrow = pa.Codec({"lz4": "lz4_raw"}.get(codec.name, codec.name))

    def write(self, data: bytes) -> int:
        if self._obj is not None:
            out = self._obj.compress(data)
            if out:
                self.out.write(out)
            return len(data)
        self._pending += data
        while len(self._pending) >= self._block:
            self._emit(bytes(self._pending[:self._block]))
            del self._pending[:self._block]
        return len(data)

    def _emit(self, raw: bytes) -> None:
        packed = self._arrow.compress(raw, asbytes=True)
        if self.codec.name == "zstd":
            self.out.write(packed)          # one frame; a zstd stream may hold many
        else:
            self.out.write(struct.pack(">II", len(raw), len(packed)) + packed)

    def close(self) -> None:
        if self._obj is not None:
            self.out.write(self._obj.flush())
        elif self._pending:
            self._emit(bytes(self._pending))
            self._pending.clear()


__all__ = ["Codec", "CODECS", "codec_for_path", "write_codec", "decompressed_chunks",
           "file_chunks", "CompressingWriter"]
