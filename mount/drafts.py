"""The output of a file created in a folder whose lease the mount holds (``Draft``): its
bytes are held here, in memory, while the file stays small enough to be stored inline,
and it becomes a real output stream only when it needs one.

Why: a tree being extracted or built creates thousands of small files, each written,
published at its close(2) and completed at its release. For such a file the general
``fs.writer.AsyncOutputStream`` does nothing a buffer could not (its bytes go to the
metadata server inline, and under the folder's lease those calls only join the lease's
queue), yet its construction, lock and per-operation stall scope cost as much as the rest
of the mount's work for the file. A ``Draft`` keeps only what such a file needs.

Behaviour: the metadata calls a ``Draft`` makes go through ``meta_via`` (set by
``Files._create_here`` to ``DirLeaseHolder.file_calls``) and are exactly those an
``AsyncOutputStream`` of the same file would make at the same moments, with the same
arguments: ``publish`` stores the content inline (``fsync`` with ``data``, not durable),
``hsync`` does so durably, each at most ``INLINE_SYNCS`` times; ``close`` completes the
file with its content inline (none for an empty file), retrying while the server waits,
and leaves ``complete_pending`` set when the metadata server was unreachable, for
``retry_complete``. The operations that call the metadata server run under the stream's
stall bound (``data_stall_timeout``). Anything a buffer cannot do - a write that takes
the content past ``kept_whole_max`` (``inline_max``, below a packet and a block), an
``hflush`` of bytes, ``rewrite``, an inline store past ``INLINE_SYNCS`` - first promotes
the draft: a stream from ``client.new_output`` (same path, status, checksum chunk and
``meta_via``) takes over its bytes and its inline stores (``AsyncOutputStream.take_over``)
and the draft passes every call on to it from then on. The client tracks the draft as
one of its outputs (its lease renewer keeps renewing while it is open, ``aclose`` closes
it) until it closes, aborts or is promoted (then the stream is tracked).

Concurrency contract: every method runs on the mount's trio thread. A draft has no lock
of its own: the mount serialises an open file's operations under its ``OpenFile.lock``,
the only caller besides being the client's ``aclose`` at unmount, after the mount closed
its files. ``abort`` is synchronous and may run at any await (the renewer's lease loss).
"""

from __future__ import annotations

import trio

from fs.dataconn import DATA_BACKOFF
from fs.errors import (InvalidArgument, LeaseFSError, NotReplicatedYet,
                       ServerUnavailable, StreamStalled)
from fs.writer import INLINE_SYNCS, Unsent, kept_whole_max, stream_failure


class Draft:
    """A file created here, written into memory until it needs an output stream."""

    def __init__(self, client, path: str, status: dict, *,
                 bytes_per_checksum: int | None = None):
        self._client = client
        self._path = path
        self.ino = status["ino"]
        self.created_status = status   # as create would have answered (a FileStatus on the wire)
        self.created_parent = None
        self._bytes_per_checksum = bytes_per_checksum
        config = client.config
        self._limit = kept_whole_max(config, status, bytes_per_checksum)
        self._stall = max(0.0, float(config.data_stall_timeout))
        self._meta_via = client.call_meta
        self._buf = bytearray()
        self._pos = 0
        self._unpublished = False      # bytes written since the last publish
        self._inline_syncs = 0         # inline stores made (publish, hsync)
        self._error: LeaseFSError | None = None
        self._closed = False
        self._complete_pending = False
        # what the close's complete carries (a retry_complete sends it again)
        self._inline: bytes | None = None
        self._close_attrs: dict = {}
        self._waiting_for: str | None = None      # the metadata call in flight, if any
        self._stream = None            # the output stream it became, once promoted
        client.track_output(self)

    # ------------------------------------------------------------------ attributes
    @property
    def path(self) -> str:
        return self._path if self._stream is None else self._stream.path

    @path.setter
    def path(self, value: str) -> None:
        if self._stream is None:
            self._path = value
        else:
            self._stream.path = value

    @property
    def meta_via(self):
        """Who makes its metadata calls (``client.call_meta``'s signature)."""
        return self._meta_via if self._stream is None else self._stream.meta_via

    @meta_via.setter
    def meta_via(self, value) -> None:
        self._meta_via = value
        if self._stream is not None:
            self._stream.meta_via = value

    @property
    def pos(self) -> int:
        return self._pos if self._stream is None else self._stream.pos

    def tell(self) -> int:
        return self.pos

    @property
    def closed(self) -> bool:
        return self._closed if self._stream is None else self._stream.closed

    @property
    def promoted(self) -> bool:
        """Whether an output stream took over (every call goes to it)."""
        return self._stream is not None

    @property
    def complete_pending(self) -> bool:
        """As ``AsyncOutputStream.complete_pending``: the close failed only because the
        metadata server was unreachable for ``complete``."""
        return self._complete_pending if self._stream is None \
            else self._stream.complete_pending

    # ------------------------------------------------------------------ writing
    async def write(self, data) -> int:
        if self._stream is not None:
            return await self._stream.write(data)
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self._check_writable()
        total = len(view)
        if len(self._buf) + total > self._limit:
            return await self._promote().write(view)
        self._buf += view
        self._pos += total
        self._unpublished = total > 0 or self._unpublished
        return total

    async def publish(self) -> None:
        """As ``AsyncOutputStream.publish``: the content stored inline, not durably."""
        if self._stream is not None:
            return await self._stream.publish()
        self._check_writable()
        if not self._unpublished:
            return
        if self._inline_syncs >= INLINE_SYNCS:
            return await self._promote().publish()
        args = self._inline_args(False)
        self._inline_syncs += 1
        if not self._queued("fsync", args):
            await self._bounded("flush", self._meta, "fsync", args)
        self._unpublished = False

    async def hsync(self) -> None:
        """As ``AsyncOutputStream.hsync``: the content stored inline, durably (nothing for
        an empty file)."""
        if self._stream is not None:
            return await self._stream.hsync()
        self._check_writable()
        if self._buf:
            if self._inline_syncs >= INLINE_SYNCS:
                return await self._promote().hsync()
            self._inline_syncs += 1
            await self._bounded("hsync", self._meta, "fsync", self._inline_args(True))
        self._unpublished = False

    async def hflush(self) -> None:
        """Bytes to hflush need a pipeline: the draft is promoted first."""
        if self._stream is None:
            self._check_writable()
            if not self._buf:
                return
            self._promote()
        await self._stream.hflush()

    flush = hflush

    def _inline_args(self, sync: bool) -> dict:
        return {"path": self._path, "client_name": self._client.client_name, "ino": self.ino,
                "data": bytes(self._buf), **({} if sync else {"sync": False})}

    def _queued(self, method: str, args: dict) -> bool:
        """Whether the call was taken at once, without waiting for anything (``meta_via``'s
        ``now``: a lease's queue with room): then no stall bound is needed, and none is
        set up (a cancel scope per call cost a tenth of the mount's work for a file)."""
        now = getattr(self._meta_via, "now", None)
        return now is not None and now(method, args)

    # ------------------------------------------------------------------ ending
    async def close(self, *, mtime_ns: int | None = None, atime_ns: int | None = None,
                    permission: int | None = None) -> None:
        """As ``AsyncOutputStream.close``: ``complete`` with the content inline (none when
        empty) and the times and mode given. Closing twice is a no-op; closing a failed
        draft raises its failure once."""
        if self._stream is not None:
            return await self._stream.close(mtime_ns=mtime_ns, atime_ns=atime_ns,
                                            permission=permission)
        # set by a close after the first too: a retry_complete sends them
        self._close_attrs = {"mtime_ns": mtime_ns, "atime_ns": atime_ns,
                             "permission": permission}
        if self._closed:
            return
        self._closed = True
        ended = False
        try:
            if self._error is not None:
                raise self._error
            # the complete takes the bytes (an empty file: none)
            self._inline, self._buf = bytes(self._buf) or None, bytearray()
            ended = True
            if not self._queued("complete", self._complete_args()):
                await self._bounded("close", self._complete)
        except BaseException as exc:
            self._complete_pending = ended and isinstance(exc, ServerUnavailable)
            self._fail(exc)
            raise
        finally:
            self._client.output_closed(self)

    async def _complete(self) -> None:
        retries = max(0, self._client.config.complete_retries)
        waited = 0.0
        for attempt in range(retries + 1):
            if await self._meta("complete", self._complete_args()):
                return
            if attempt < retries:
                waited += await DATA_BACKOFF.sleep(attempt)
        raise NotReplicatedYet(
            f"{self._path}: could not close the file: the metadata server still reports "
            f"block None as not minimally replicated after {retries + 1} attempts over "
            f"{waited:.1f} s")

    def _complete_args(self) -> dict:
        return {"path": self._path, "client_name": self._client.client_name,
                "ino": self.ino, "last": None,
                **({"data": self._inline} if self._inline is not None else {}),
                **{k: v for k, v in self._close_attrs.items() if v is not None}}

    def unsent_content(self) -> bytes | None:
        """The whole file (none of it went to a block server)."""
        if self._stream is not None:
            return self._stream.unsent_content()
        return bytes(self._buf)

    async def retry_complete(self) -> None:
        """Ask ``complete`` again for a file whose ``close`` could not reach the server."""
        if self._stream is not None:
            return await self._stream.retry_complete()
        if not self._complete_pending:
            raise self._error or InvalidArgument(f"{self._path}: nothing to complete")
        await self._complete()
        self._complete_pending = False
        self._error = None

    def abort(self, exc: LeaseFSError) -> None:
        """Fail it at once (lease lost, client closing): no complete; later calls raise
        ``exc``."""
        if self._stream is not None:
            self._stream.abort(exc)
            return
        if self._error is None:
            self._error = exc
        self._closed = True
        self._client.output_closed(self)

    async def rewrite(self):
        """As ``AsyncOutputStream.rewrite`` (the stream the file starts over in), by the
        stream it is promoted to."""
        if self._stream is None:
            self._check_writable()
            self._promote()
        return await self._stream.rewrite()

    # ------------------------------------------------------------------ internals
    def _promote(self):
        """The output stream that goes on from here, with the bytes held and the inline
        stores made; tracked by the client instead of the draft from now on."""
        stream = self._client.new_output(self._path, self.created_status,
                                         bytes_per_checksum=self._bytes_per_checksum)
        stream.meta_via = self._meta_via
        stream.take_over(Unsent(bytes(self._buf), self._inline_syncs, self._unpublished))
        self._client.output_closed(self)
        self._stream, self._buf = stream, bytearray()
        return stream

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise InvalidArgument(f"{self._path}: stream is closed")

    async def _meta(self, method: str, args: dict):
        self._waiting_for = method
        answer = await self._meta_via(method, args)
        self._waiting_for = None
        return answer

    async def _bounded(self, what: str, fn, *args) -> None:
        """``fn(*args)`` under the stream's stall bound, failing the draft if it raises
        (``StreamStalled`` once it waited ``data_stall_timeout`` for the metadata server,
        as the stream's ``_progress_bound`` does)."""
        self._waiting_for = None
        try:
            if self._stall <= 0:
                await fn(*args)
                return
            with trio.CancelScope(deadline=trio.current_time() + self._stall) as scope:
                await fn(*args)
            if scope.cancelled_caught:
                cause = (f"the metadata server did not answer {self._waiting_for}"
                         if self._waiting_for is not None else "no block server answered")
                raise StreamStalled(f"{self._path}: {what} made no progress for "
                                    f"{self._stall:g} s ({cause})")
        except BaseException as exc:
            self._fail(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = stream_failure(self._path, exc)


__all__ = ["Draft"]
