"""The client's streams: the blocking facades ``OutputStream``/``InputStream`` that
``fs.client.Client`` hands out, and the one place to import every stream class from.

Why a module of its own: the data path is split by role — ``fs/pipeline.py`` (one block's
write pipeline and TRANSFER_RBW), ``fs/writer.py`` (``AsyncOutputStream``: packets, blocks,
append, pipeline recovery, complete), ``fs/reader.py`` (``AsyncInputStream``: READ_BLOCK with
checksum verification and replica failover), ``fs/dataconn.py`` (the data-connection helpers
they share). This module adds the blocking ``io.RawIOBase`` facades over the async streams
and re-exports ``AsyncInputStream``, ``AsyncOutputStream`` and ``Offset``, so ``fs.client`` and
users import streams from one module.

Concurrency contract: a facade holds no state of its own besides ``closed``; each call
crosses into the client's trio thread through ``call`` (``Client``'s thread-safe runner), so
calls from several threads run one at a time on that thread, under the async stream's own
contract (see ``fs/writer.py`` and ``fs/reader.py``).
"""

from __future__ import annotations

import io
import os

from .errors import PipelineError
from .reader import AsyncInputStream, Offset
from .writer import AsyncOutputStream

__all__ = ["AsyncInputStream", "AsyncOutputStream", "InputStream", "Offset", "OutputStream"]


class OutputStream(io.RawIOBase):
    """Blocking file-like facade of an ``AsyncOutputStream`` (``Client.create``).

    ``flush`` is ``hflush``. Thread-safe: calls run one at a time on the client's trio thread.
    """

    def __init__(self, stream: AsyncOutputStream, call):
        super().__init__()
        self._stream = stream
        self._call = call

    path = property(lambda self: self._stream.path)
    pos = property(lambda self: self._stream.pos)

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("write to closed file")
        return self._call(self._stream.write, data)

    def flush(self) -> None:
        if not self._stream.closed and not self.closed:
            self._call(self._stream.hflush)

    hflush = flush

    def hsync(self) -> None:
        self._call(self._stream.hsync)

    def tell(self) -> int:
        return self._stream.pos

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self._stream.closed:
                self._call(self._stream.close)
        finally:
            super().close()

    def abort(self) -> None:
        """Give the file up without completing it (it stays open until lease recovery)."""
        async def _abort():
            self._stream.abort(PipelineError(f"{self._stream.path}: aborted by the writer"))
        if not self._stream.closed:
            self._call(_abort)
        super().close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):  # never do network I/O from a finalizer (it may run on any thread)
        pass


class InputStream(io.RawIOBase):
    """Blocking ``io.RawIOBase`` facade of an ``AsyncInputStream`` (``Client.open``), so
    ``io.BufferedReader(stream)`` works. Thread-safe."""

    def __init__(self, stream: AsyncInputStream, call, close_call=None):
        super().__init__()
        self._stream = stream
        self._call = call
        # close may come from a finalizer that the garbage collector runs on the client's
        # own trio thread, where blocking is impossible: the client's run_or_spawn handles it
        self._close_call = close_call or call

    path = property(lambda self: self._stream.path)
    length = property(lambda self: self._stream.length)
    #: the located blocks, each replica in the order this stream tries them
    blocks = property(lambda self: self._stream.blocks)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self._call(self._stream.read, len(view))
        view[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read from closed file")
        return self._call(self._stream.read, -1 if size is None else size)

    def readall(self) -> bytes:
        return self.read(-1)

    def pread(self, offset: int, n: int) -> bytes:
        return self._call(self._stream.pread, offset, n)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        async def _seek():
            return int(self._stream.seek(offset, whence))
        return self._call(_seek)

    def tell(self) -> int:
        return int(self._stream.tell())

    def refresh(self) -> int:
        return self._call(self._stream.refresh)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._close_call(self._stream.close)
        finally:
            super().close()

    def __del__(self):
        pass
