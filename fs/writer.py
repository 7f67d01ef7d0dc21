"""The output stream of the client (``AsyncOutputStream``): bytes become packets, blocks
are added and ended, a file is appended to, a broken pipeline is recovered, and the file is
completed on close.

Why a module of its own: this is every HDFS rule of the write side above the wire —
chunk-aligned packets with a CRC32C per chunk, hflush/hsync visibility, the partial-chunk
rewrite after a flush, the append setup, pipeline recovery with the replace-datanode policy,
complete() with backoff on close. The pipeline itself (connection, window, acks) is
``fs/pipeline.py``; ``fs/client.py`` only opens and closes streams.

Write path: bytes are buffered into packets of ``packet_size`` bytes (a multiple of
``bytes_per_checksum``). Per block, once its first packet is due (a full packet, an hflush
or the close; so a small file costs one packet and an empty one no block): ``add_block`` →
WRITE_BLOCK to the first location with the others as downstream ``targets`` → a
``Pipeline`` whose sender is the writer itself and whose responder task matches acks to the
queue of unacked packets (kept whole, so a later pipeline recovery can resend them). At most
``write_window_packets`` are unacked: ``write`` waits, so memory stays bounded. A block ends
with a LAST packet carrying its unsent bytes (empty when all were sent); the next
``add_block`` passes it as ``previous``. A block that is wholly in the buffer when it ends,
in one packet, with no pipeline open (a small file closed before any flush; a file's last
block of at most one packet: the mount's close(2) of a small file) is instead written
with one WRITE_BLOCK_ONESHOT (``_write_whole_block``, docs/PROTOCOL.md §3): its data is still
in hand, so any failure is handled as a failed setup (abandon the block, exclude the node,
take a new one). ``close`` ends the last block and calls ``complete``
until the server says the file is closed. ``append`` reopens a partial last block
(``setup_append``: reread its last partial chunk, WRITE_BLOCK stage PIPELINE_SETUP_APPEND
under the new stamp; a setup that fails at a node goes on as a pipeline recovery, below) and
then writes on exactly as after an hflush.
A pipeline that breaks because the file was deleted or overwritten under the writer is
reported as ``FileNotFound``, as HDFS's writer sees it.

Block access tokens (security = secure): every block the metadata server hands the writer
comes with a write token for its stamp, which the writer's op header carries and every node
checks at setup (a running pipeline is not checked again, so a token expiring under it does
not matter). A recovery's ``update_block_for_pipeline`` brings a fresh token for the new
stamp, ``get_additional_datanode`` a copy token for the replacement's TRANSFER_BLOCK; a
setup refused for its token (``create``'s first block, used long after) abandons the block
without blaming the node and takes a new one, with a fresh token.

Pipeline recovery (``_recover_pipeline``, docs/design/datapath.md "Pipeline recovery"): a pipeline
that fails through one of its nodes records which (``bad_index``); the writer's next send or
wait drops that node, gets a new stamp (``update_block_for_pipeline``), adds a replacement
when the replace-datanode policy says so (``get_additional_datanode`` + TRANSFER_RBW from a
survivor), sets up PIPELINE_SETUP_STREAMING_RECOVERY, calls ``update_pipeline`` and resends
the unacked packets; at most ``pipeline_recovery_retries`` rounds per block. ``_rebuild``
does one recovery from a ``_Broken`` pipeline (a failed one, or an append setup that failed).

Stall bound (``data_stall_timeout``, a mount's ``mount_meta_timeout``; 0 = none): each
write, hflush, publish, hsync and close fails with ``StreamStalled`` once it went that long
without a packet acknowledged by every node (``_progress_bound``), however many pipeline
recoveries were still allowed; silent peers keep their connections open, so nothing else
would end the wait before ``data_timeout`` per node and round.

Concurrency contract: every async method runs on the client's trio thread. An output stream
serialises its operations with one lock (writes from several tasks do not interleave inside
a packet); its pipeline's responder runs as a task in the client's nursery and never raises
(failures are stored and re-raised by the writer's next call). ``abort`` is synchronous and
may run while an operation waits: it records the error and fails the pipeline, which wakes
that operation.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import trio

from .dataconn import DATA_BACKOFF, IO_ERRORS, close_quietly, failure_cause, node_name
from .datatransfer import (FLAG_LAST, FLAG_SYNC, MAX_PACKET_DATA,
                           PIPELINE_SETUP_STREAMING_RECOVERY, Packet, block_dict,
                           chunk_checksums)
from .errors import (FileNotFound, InvalidArgument, LeaseExpired, LeaseFSError,
                     NotReplicatedYet, PipelineError, ProtocolError, ServerUnavailable,
                     StreamStalled)
from .pipeline import Pipeline, SetupFailed, transfer_rbw, write_oneshot
from .reader import Block, BlockReader

log = logging.getLogger(__name__)

#: attempts to set up a pipeline for one new block before giving up (HDFS: 3)
PIPELINE_SETUP_ATTEMPTS = 3


#: hsyncs of one stream that may store its content inline (each sends all of it again)
INLINE_SYNCS = 4


def _effective_packet_size(packet_size: int, bytes_per_checksum: int) -> int:
    """Packets carry whole chunks: round down to a multiple of bytes_per_checksum."""
    size = min(int(packet_size), MAX_PACKET_DATA)
    return max(bytes_per_checksum, size - size % bytes_per_checksum)


def kept_whole_max(config, status: dict, bytes_per_checksum: int | None = None) -> int:
    """The most bytes a new stream of the file ``status`` describes keeps wholly in hand
    (none sent to a block server) and may still store inline: within ``inline_max``,
    below a packet and below a block (a full packet or block is sent at once). A writer
    that holds a small file's bytes itself (the mount's ``Draft``) hands them to a stream
    (``take_over``) before they pass this, so the stream's calls are the same."""
    block_size = int(status.get("block_size") or config.block_size)
    packet = _effective_packet_size(config.packet_size,
                                    int(bytes_per_checksum or config.bytes_per_checksum))
    return max(0, min(int(config.inline_max), block_size - 1, packet - 1))


@dataclass(frozen=True)
class Unsent:
    """What a writer that held a new file's first bytes itself hands the stream that goes
    on with it (``AsyncOutputStream.take_over``): the bytes (none sent to a block server),
    how many times they were stored inline on the metadata server (``fsync`` with
    ``data``), and whether bytes were written since the last publish."""

    data: bytes
    inline_syncs: int
    unpublished: bool


@dataclass(frozen=True)
class _Broken:
    """What a pipeline recovery starts from: the block as the metadata server knows it, the
    pipeline's nodes, the index of the one to drop and why, the bytes every node
    acknowledged and the block offset sent up to; ``source_gs``: the oldest stamp a
    survivor's replica may still carry (an append setup: the stamp before ``append``;
    None: the block's stamp)."""

    block: dict
    nodes: tuple
    bad_index: int | None
    cause: LeaseFSError
    acked: int
    sent_end: int
    source_gs: int | None = None


def stream_failure(path: str, exc: BaseException) -> LeaseFSError:
    """What a writer of ``path`` that ``exc`` stopped raises from then on: the error
    itself, naming the path, or (a cancellation, a bug) a ``PipelineError`` saying the
    stream cannot continue."""
    if isinstance(exc, LeaseFSError):
        if exc.message and path not in exc.message:
            exc.message = f"{path}: {exc.message}"
        return exc
    return PipelineError(f"{path}: write interrupted ({type(exc).__name__}); the stream "
                         f"cannot continue")


async def complete_file(call, path: str, args: dict, retries: int) -> None:
    """``complete`` with ``args`` through ``call`` (``call_meta``'s signature) until the
    metadata server closes the file: it answers false while the last block is not yet
    minimally replicated, so it is asked ``retries`` more times, ``DATA_BACKOFF`` apart;
    then ``NotReplicatedYet`` naming that block."""
    retries = max(0, retries)
    waited = 0.0
    for attempt in range(retries + 1):
        if await call("complete", args):
            return
        if attempt < retries:
            waited += await DATA_BACKOFF.sleep(attempt)
    block = args["last"]["id"] if args.get("last") else None
    raise NotReplicatedYet(
        f"{path}: could not close the file: the metadata server still reports "
        f"block {block} as not minimally replicated after {retries + 1} attempts over "
        f"{waited:.1f} s")


class AsyncOutputStream:
    """A file being written: ``write``/``hflush``/``hsync``/``close``; ``async with`` closes.

    Obtained from ``AsyncClient.create``. ``pos`` is the number of bytes written so far.
    """

    def __init__(self, client, path: str, status: dict, *, bytes_per_checksum: int | None = None):
        self._client = client
        self.path = path
        self.ino = status["ino"]
        self.created_status = status   # what create/append answered (a FileStatus on the wire)
        self.created_parent = None     # the parent's FileStatus, when create was asked for it
        config = client.config
        self.block_size = int(status.get("block_size") or config.block_size)
        self.replication = int(status.get("replication") or config.replication)
        # the file's own checksum chunk (chosen at create), else the cluster's
        self.bytes_per_checksum = int(bytes_per_checksum or config.bytes_per_checksum)
        self.packet_size = _effective_packet_size(config.packet_size, self.bytes_per_checksum)
        self.window = max(1, int(config.write_window_packets))
        self.inline_max = min(max(0, int(config.inline_max)), self.block_size)
        self._lock = trio.Lock()
        self._pos = 0
        self._buf = bytearray()     # bytes of the current block not yet sent in a full chunk
        self._buf_start = 0         # block offset of _buf[0] (always chunk aligned)
        self._buf_sent = 0          # leading bytes of _buf already sent by an hflush
        self._pipeline: Pipeline | None = None
        self._previous: dict | None = None  # last finished block with its final length
        # the first block, allocated with the create (``first_block``) and not used yet
        self._first_block: dict | None = None
        self.blocks_written = 0
        # pipeline recovery: nodes that failed this stream (excluded from later pipelines),
        # recoveries of the current block, and what the replace-datanode policy looks at
        self._failed_nodes: list[dict] = []
        self._block_recoveries = 0
        self._hflushed = False
        self._appended = False
        self.recoveries = 0           # pipeline recoveries over the stream's life
        self.replacements = 0         # replacement block servers added by recoveries
        self._error: LeaseFSError | None = None
        self._closed = False
        # close() got every byte acknowledged but could not reach the metadata server for
        # ``complete``: retry_complete() finishes the file later
        self._complete_pending = False
        self._close_attrs: dict = {}
        # the whole content, when the close keeps it in the namespace (``inline_max``)
        self._inline: bytes | None = None
        # an appended inline file: the server answers readers with its inline copy until
        # told that the first block holds those bytes (``fsync`` at the first hflush)
        self._inline_to_settle = False
        self._inline_syncs = 0
        self._unpublished = False   # bytes written since the last ``publish``
        # an operation's bound on no progress (``_progress_bound``) and its cancel scope
        self._stall = max(0.0, float(config.data_stall_timeout))
        self._stall_scope: trio.CancelScope | None = None
        self._waiting_for: str | None = None   # the metadata call in flight, if any
        # who makes the stream's metadata calls (``client.call_meta``'s signature): a mount
        # that created the file under a directory lease queues a small file's publish and
        # close with its other changes instead of calling
        self.meta_via = client.call_meta

    # ------------------------------------------------------------------ public
    @property
    def pos(self) -> int:
        return self._pos

    def tell(self) -> int:
        return self._pos

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        if exc_type is None:
            await self.close()
        else:  # do not publish a half-written file as complete: leave it to lease recovery
            self.abort(PipelineError(f"{self.path}: abandoned after {exc_type.__name__}"))

    async def write(self, data) -> int:
        """Append ``data``; returns its length. Waits while the window of unacked packets is
        full, so a fast writer cannot outrun the block servers."""
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        total = len(view)
        if not self._lock.locked() and self._error is None and not self._closed \
                and len(self._buf) + total < self.packet_size \
                and self._buf_start + len(self._buf) + total < self.block_size:
            # it fits in the packet being gathered: nothing is sent, nothing can stall (a
            # tree's small files are written in a few of these)
            self._buf += view
            self._pos += total
            self._unpublished = total > 0 or self._unpublished
            return total
        async with self._lock:
            self._check_writable()
            try:
                with self._progress_bound("write"):
                    await self._write_view(view)
            except BaseException as exc:
                await self._fail_and_raise(exc)
        return total

    async def _write_view(self, view: memoryview) -> None:
        while view:
            block_used = self._buf_start + len(self._buf)
            n = min(len(view), self.block_size - block_used,
                    self.packet_size - len(self._buf))
            self._buf += view[:n]
            view = view[n:]
            self._pos += n
            self._unpublished = True
            block_full = block_used + n >= self.block_size
            if block_full or len(self._buf) >= self.packet_size:
                await self._send_buffer()
            if block_full:
                await self._end_block()

    async def hflush(self) -> None:
        """Send everything written (a partial chunk too) and wait until every block server
        of the pipeline acknowledged it: new readers then see these bytes."""
        async with self._lock:
            self._check_writable()
            try:
                with self._progress_bound("hflush"):
                    await self._hflush()
            except BaseException as exc:
                await self._fail_and_raise(exc)

    flush = hflush

    async def publish(self) -> None:
        """New readers see every byte written, and so does a new open's length (a client
        that asks the metadata server for it, as a mount's getattr), the file stays open:
        what a close of one descriptor among several needs (the mount's FUSE flush). A
        small file wholly in the buffer goes to the metadata server inline, as ``hsync``
        sends it (one call, no pipeline, and its close can still keep it inline); anything
        else is hflushed and its length recorded (HDFS's hsync UPDATE_LENGTH without the
        disk syncs). Not durable: both ``fsync(sync=false)``, as lazy as the client's other
        namespace changes. Nothing when nothing was written since."""
        async with self._lock:
            self._check_writable()
            if not self._unpublished:
                return
            try:
                with self._progress_bound("flush"):
                    if not await self._sync_inline(sync=False):
                        await self._hflush()
                        if self._pipeline is not None:
                            await self._record_length(self._buf_start + len(self._buf),
                                                      sync=False)
                self._unpublished = False
            except BaseException as exc:
                await self._fail_and_raise(exc)

    async def _hflush(self) -> None:
        if await self._ensure_pipeline():
            self._hflushed = True
            await self._send_buffer()
            await self._wait_all_acked()
            if self._inline_to_settle:
                await self._record_length(self._buf_start + len(self._buf))

    async def _sync_inline(self, *, sync: bool = True) -> bool:
        """hsync of a file wholly in the buffer within ``inline_max``: its bytes go to the
        metadata server as the open file's content (durable, visible to readers) in one
        call; they stay buffered, so a close or a later block carries them again. At most
        ``INLINE_SYNCS`` times per stream (each sends the whole content again), then the
        pipeline; hflush always takes the pipeline (streaming writers flush often)."""
        data = self._inline_content()
        if data is None or self._inline_syncs >= INLINE_SYNCS:
            return False
        self._inline_syncs += 1
        await self._fsync_call(data=data, sync=sync)
        self._first_block = None   # the server dropped it with the record
        self._inline_to_settle = True
        return True

    async def _record_length(self, length: int, *, sync: bool = True) -> None:
        """The metadata server records the current block's length (``sync``: durable when
        answered, as hsync promises)."""
        await self._fsync_call(last_block_length=length, sync=sync)
        self._inline_to_settle = False

    async def _fsync_call(self, *, sync: bool = True, **args) -> None:
        await self._meta("fsync", {
            "path": self.path, "client_name": self._client.client_name, "ino": self.ino,
            **args, **({} if sync else {"sync": False})})

    async def hsync(self) -> None:
        """hflush, with the block servers fsyncing the data, then record the block's length
        on the metadata server (``fsync`` RPC). A small file wholly in the buffer is stored
        on the metadata server instead (``_sync_inline``)."""
        async with self._lock:
            self._check_writable()
            try:
                with self._progress_bound("hsync"):
                    await self._hsync()
                self._unpublished = False   # what publish would do, done durably
            except BaseException as exc:
                await self._fail_and_raise(exc)

    async def _hsync(self) -> None:
        if await self._sync_inline():
            return
        length = None
        if await self._ensure_pipeline():
            self._hflushed = True
            await self._send_buffer(FLAG_SYNC)
            await self._wait_all_acked()
            length = self._buf_start + len(self._buf)
        elif self._previous is not None:
            length = self._previous["num_bytes"]
        if length is not None:
            await self._record_length(length)

    async def close(self, *, mtime_ns: int | None = None, atime_ns: int | None = None,
                    permission: int | None = None) -> None:
        """End the last block and ``complete`` the file (retrying with doubling backoff
        while the server waits for replicas). Closing twice is a no-op; closing a failed
        stream raises its failure once. ``mtime_ns``/``atime_ns``/``permission``: times
        the file gets with its completion instead of the completion's own, and its new
        mode (one call, not a ``set_times``/``set_permission`` after)."""
        async with self._lock:
            self._close_attrs = {"mtime_ns": mtime_ns, "atime_ns": atime_ns,
                                 "permission": permission}
            if self._closed:
                return
            self._closed = True
            ended = False
            try:
                if self._error is not None:
                    raise self._error
                with self._progress_bound("close"):
                    self._inline = self._inline_content()
                    if self._inline is None:
                        await self._end_block()
                        if self._first_block is not None:   # closed empty: give it back
                            await self._abandon_first_block()
                    else:   # the complete takes the bytes; an unused first block goes too
                        self._buf, self._first_block = bytearray(), None
                    ended = True
                    await self._complete()
            except BaseException as exc:
                self._complete_pending = ended and isinstance(exc, ServerUnavailable)
                await self._fail_and_raise(exc)
            finally:
                self._client.output_closed(self)

    aclose = close

    def unsent_content(self) -> bytes | None:
        """The whole file, when none of it went to a block server (it is all buffered
        here, from offset 0), else None."""
        if (self._pipeline is None and self.blocks_written == 0 and self._previous is None
                and self._buf_start == 0 and not self._buf_sent and not self._hflushed):
            return bytes(self._buf)
        return None

    def _inline_content(self) -> bytes | None:
        """The whole file, when it is all buffered here and fits ``inline_max``: the close
        hands it to ``complete`` instead of a block."""
        data = self.unsent_content()
        return data if data and len(data) <= self.inline_max else None

    def continue_from(self, end: int, previous: dict | None = None) -> None:
        """An appended file: its next byte is at ``end``; ``previous``: its last block
        (complete, ``{id, gs, num_bytes}``), which the stream's first block follows."""
        self._pos = end
        if previous is not None:
            self._previous = previous

    def take_over(self, unsent: Unsent) -> None:
        """A new stream (nothing written yet) going on from a writer that held the file's
        first bytes itself (``kept_whole_max``): they come first in the stream, as if
        written here, with the inline copies already stored counted (the server answers
        readers with the latest until the first block settles it, as for ``start_with``)."""
        self._buf, self._buf_start, self._buf_sent = bytearray(unsent.data), 0, 0
        self._pos = len(unsent.data)
        self._unpublished = unsent.unpublished
        self._inline_syncs = unsent.inline_syncs
        self._inline_to_settle = unsent.inline_syncs > 0

    def start_with(self, data: bytes) -> None:
        """An appended file whose content is inline: those bytes come first in the stream
        (the first block holds them, or the close keeps them inline with what follows)."""
        self._buf, self._buf_start, self._buf_sent = bytearray(data), 0, 0
        self._pos = len(data)
        self._inline_to_settle = True

    @property
    def complete_pending(self) -> bool:
        """True after a ``close`` that failed only at ``complete`` because the metadata
        server was unreachable: every byte is on the block servers, the file is still under
        construction, and ``retry_complete`` can finish it."""
        return self._complete_pending

    async def retry_complete(self) -> None:
        """Ask ``complete`` again for a file whose ``close`` could not reach the server."""
        async with self._lock:
            if not self._complete_pending:
                raise self._error or InvalidArgument(f"{self.path}: nothing to complete")
            await self._complete()
            self._complete_pending = False
            self._error = None

    def abort(self, exc: LeaseFSError) -> None:
        """Fail the stream at once (lease lost, client closing): no complete, the file stays
        under construction until lease recovery. Later calls raise ``exc``."""
        if self._error is None:
            self._error = exc
        if self._pipeline is not None:
            self._pipeline.fail(exc)
        self._closed = True
        self._client.output_closed(self)

    async def rewrite(self) -> "AsyncOutputStream":
        """Start the file over, empty, under the same lease, and return the stream that
        takes its writes from offset 0. One journaled ``rewrite`` call drops the file's
        blocks and keeps it open for this client; this stream then ends without a close
        (its pipeline is abandoned, its unsent bytes dropped). For a writer replacing the
        whole content of its file, where close, truncate and append would cost five calls
        and a pipeline close and let the lease go in between. On an error this stream is
        left as it was."""
        async with self._lock:
            self._check_writable()
            status = await self._meta("rewrite", {
                "path": self.path, "client_name": self._client.client_name, "ino": self.ino})
            self._error = InvalidArgument(f"{self.path}: this stream was started over by "
                                          f"rewrite")
            self._closed = True
            if self._pipeline is not None:
                self._pipeline.close()
                self._pipeline = None
            self._client.output_closed(self)
        return self._client.new_output(self.path, status,
                                        bytes_per_checksum=self.bytes_per_checksum)

    # ------------------------------------------------------------------ internals
    @contextlib.contextmanager
    def _progress_bound(self, what: str):
        """Run one operation (``what``) under the stream's stall bound
        (``data_stall_timeout`` s, 0 = none): it fails with ``StreamStalled`` once that long
        passed since it began or since the last packet every block server acknowledged,
        whichever is later. A bound on no progress, not on total time: a large write to
        slow but live block servers goes on, one to silent ones (a partition, a stopped
        process: the connection stays open and nothing answers) ends; the metadata calls
        it makes (add_block, update_block_for_pipeline, complete) count within it."""
        if self._stall <= 0:
            yield
            return
        scope = trio.CancelScope(deadline=trio.current_time() + self._stall)
        self._stall_scope, self._waiting_for = scope, None
        try:
            with scope:
                yield
        finally:
            self._stall_scope = None
        if scope.cancelled_caught:
            if self._waiting_for is not None:
                cause = f"the metadata server did not answer {self._waiting_for}"
            elif self._pipeline is not None:
                cause = ("no acknowledgement from the pipeline "
                         + ", ".join(node_name(n) for n in self._pipeline.nodes))
            else:
                cause = "no block server answered"
            raise StreamStalled(f"{self.path}: {what} made no progress for {self._stall:g} s "
                                f"({cause})")

    async def _meta(self, method: str, args: dict, **kwargs):
        """The stream's call of ``method`` on the metadata server (named in the error of
        an operation that stalls while it waits)."""
        self._waiting_for = method
        answer = await self.meta_via(method, args, **kwargs)
        self._waiting_for = None
        return answer

    def _progressed(self) -> None:
        """A packet acknowledged by every block server: the stall bound starts again."""
        if self._stall_scope is not None:
            self._stall_scope.deadline = trio.current_time() + self._stall

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise InvalidArgument(f"{self.path}: stream is closed")

    async def _fail_and_raise(self, exc: BaseException):
        """Fail the stream with ``exc`` and raise it — or, when the pipeline broke because
        the file itself is gone (deleted, or replaced by ``create(overwrite=True)``, so its
        blocks were invalidated under the writer), the ``FileNotFound`` the metadata server
        would have answered, as HDFS's writer sees it."""
        self._fail(exc)
        if isinstance(exc, PipelineError) and self._error is exc:
            gone = await self._file_gone(exc)
            if gone is not None:
                self._error = gone
                raise gone from None
        raise exc

    async def _file_gone(self, cause: LeaseFSError) -> FileNotFound | None:
        """``FileNotFound`` if ``path`` no longer names this stream's inode, else None."""
        client = self._client
        try:
            # a question asked after the failure: brief, so a silent server cannot
            # stretch the failure past the bound the caller was promised
            status = await self._meta(
                "get_file_info", {"path": self.path},
                retry_seconds=min(2.0, client.config.rpc_retry_seconds),
                timeout=min(2.0, client.config.rpc_timeout))
        except FileNotFound:
            status = None
        except LeaseFSError:
            return None  # cannot tell; keep the pipeline's own error
        if status is not None and status.get("ino") == self.ino:
            return None
        return FileNotFound(f"{self.path}: the file was deleted or replaced while open for "
                            f"writing (the write failed: {cause.message})")

    async def setup_append(self, located: dict, old_gs: int,
                            old_token: dict | None = None) -> None:
        """Reopen the file's partial last block for appending (PROTOCOL.md §4): read its
        last partial checksum chunk from a replica (with the stamp it had before ``append``),
        then WRITE_BLOCK stage PIPELINE_SETUP_APPEND to its replicas under the new stamp;
        the first packet starts at that chunk's boundary and repeats those bytes, so the
        last checksum is recomputed exactly as after an hflush. A setup that fails at a
        node goes on as a pipeline recovery (``_rebuild``): the node is dropped (or replaced
        as the policy says) and the survivors are set up again under a new stamp.
        ``old_token``: the read token of the block at ``old_gs`` (security = secure)."""
        client = self._client
        block = located["block"]
        min_bytes = int(block["num_bytes"])
        nodes = list(located.get("locations") or [])
        if not nodes:
            raise PipelineError(f"{self.path}: cannot append: the last block {block['id']} "
                                f"has no replica")
        tail = b""
        if min_bytes % self.bytes_per_checksum:
            tail = await self._read_partial_chunk(located, old_gs, min_bytes, old_token)
        self._appended = True
        self._block_recoveries = 0
        try:
            pipeline = await Pipeline.connect(
                path=self.path, located={**located, "locations": nodes},
                client_name=client.client_name, bytes_per_checksum=self.bytes_per_checksum,
                window=self.window, timeout=client.config.data_timeout,
                connect_timeout=client.config.data_connect_timeout,
                max_frame=client.config.max_frame, min_bytes=min_bytes, tls=client.tls,
                on_ack=self._progressed, ack_step=client.config.data_ack_timeout_step)
        except SetupFailed as exc:
            # HDFS setupPipelineForAppendOrRecovery: the failed node is dropped and every
            # retry takes a new stamp (a node that reopened its replica under the append's
            # stamp before the failure refuses that stamp again)
            log.warning("%s: append pipeline setup for block %s failed at %s: %s", self.path,
                        block["id"], node_name(exc.node), exc.reason)
            bad_index = next((i for i, n in enumerate(nodes)
                              if n.get("node_id") == exc.node.get("node_id")), 0)
            pipeline = await self._rebuild(_Broken(
                block=dict(block), nodes=tuple(nodes), bad_index=bad_index,
                cause=PipelineError(f"{self.path}: append pipeline setup for block "
                                    f"{block['id']} failed: {exc.reason}"),
                acked=min_bytes, sent_end=min_bytes, source_gs=old_gs))
        else:
            client.nursery.start_soon(pipeline.run_responder,
                                       name=f"responder {self.path} blk {block['id']} (append)")
        self._pipeline = pipeline
        whole = min_bytes - len(tail)
        self._buf, self._buf_start, self._buf_sent = bytearray(tail), whole, len(tail)

    async def _read_partial_chunk(self, located: dict, old_gs: int, min_bytes: int,
                                  old_token: dict | None) -> bytes:
        """The bytes of the block's last partial chunk, from the first replica that serves
        them (verified); adopts the replica's bytes_per_checksum if it differs."""
        config = self._client.config
        block = Block.from_wire({**located, "block": {**located["block"], "gs": old_gs},
                                 "token": old_token})
        failures = []
        for node in block.locations:
            bpc = self.bytes_per_checksum
            for _ in range(2):  # a second round when the replica's chunk size differs
                start = min_bytes - min_bytes % bpc
                reader = None
                try:
                    reader = await BlockReader.connect(block, node, start, min_bytes,
                                                       timeout=config.data_timeout,
                                                       connect_timeout=config.data_connect_timeout,
                                                       max_frame=config.max_frame,
                                                       tls=self._client.tls)
                    if reader.bytes_per_checksum != bpc:
                        bpc = reader.bytes_per_checksum
                        continue
                    parts = []
                    while reader.cursor < min_bytes:
                        data = await reader.read(min_bytes - reader.cursor)
                        if not data:
                            raise ProtocolError(f"replica ended at block offset {reader.cursor}")
                        parts.append(data)
                    if bpc != self.bytes_per_checksum:
                        self.bytes_per_checksum = bpc
                        self.packet_size = _effective_packet_size(config.packet_size, bpc)
                    return b"".join(parts)
                except IO_ERRORS as exc:
                    failures.append(f"{node.get('address')}: {failure_cause(exc)}")
                    break
                finally:
                    if reader is not None:
                        await reader.aclose()
        raise PipelineError(f"{self.path}: cannot append: could not read the last partial "
                            f"chunk of block {block.id}: " + ("; ".join(failures) or
                                                              "no replica answered"))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = stream_failure(self.path, exc)
        if self._pipeline is not None:
            self._pipeline.fail(self._error)
            self._pipeline = None

    async def _add_block(self, excluded: list) -> dict:
        """``add_block``, retrying ``NotReplicatedYet`` with doubling backoff; the block the
        create allocated, when there is one (no call)."""
        if self._first_block is not None:
            located, self._first_block = self._first_block, None
            return located
        retries = max(1, self._client.config.complete_retries)
        for attempt in range(retries + 1):
            try:
                return await self._meta("add_block", {
                    "path": self.path, "client_name": self._client.client_name,
                    "ino": self.ino, "previous": self._previous, "excluded": excluded})
            except NotReplicatedYet as exc:
                if attempt == retries:
                    raise NotReplicatedYet(
                        f"{self.path}: cannot add a block: the previous block is still not "
                        f"replicated after {retries} retries ({exc})") from None
                delay = DATA_BACKOFF.delay(attempt)
                log.debug("%s: add_block: %s; retrying in %.2f s", self.path, exc, delay)
                await trio.sleep(delay)
        raise AssertionError("unreachable")

    async def _start_block(self) -> None:
        """Allocate the next block and set up its pipeline, excluding nodes that fail."""
        client = self._client
        # nodes that already failed this stream stay out (HDFS excludedNodes)
        excluded: list[str] = [n["node_id"] for n in self._failed_nodes if n.get("node_id")]
        failures: list[str] = []
        self._block_recoveries = 0
        for _attempt in range(PIPELINE_SETUP_ATTEMPTS):
            located = await self._add_block(excluded)
            if not located.get("locations"):
                raise PipelineError(f"{self.path}: the metadata server gave block "
                                    f"{located['block']['id']} no block server")
            try:
                pipeline = await Pipeline.connect(
                    path=self.path, located=located, client_name=client.client_name,
                    bytes_per_checksum=self.bytes_per_checksum, window=self.window,
                    timeout=client.config.data_timeout,
                    connect_timeout=client.config.data_connect_timeout,
                    max_frame=client.config.max_frame, tls=client.tls,
                    on_ack=self._progressed, ack_step=client.config.data_ack_timeout_step)
            except SetupFailed as exc:
                await self._abandon_block(located, exc, excluded, failures)
                continue
            self._pipeline = pipeline
            client.nursery.start_soon(pipeline.run_responder,
                                       name=f"responder {self.path} blk {located['block']['id']}")
            return
        raise PipelineError(f"{self.path}: could not set up a write pipeline after "
                            f"{PIPELINE_SETUP_ATTEMPTS} attempts: " + "; ".join(failures))

    async def _abandon_block(self, located: dict, exc: SetupFailed, excluded: list[str],
                             failures: list[str]) -> None:
        """A new block's setup (or one-shot write) failed at ``exc.node``: abandon the block
        (the metadata server forgets it; replicas a node made already are invalidated) and
        exclude the node from the next ``add_block`` — unless the node refused the block's
        token (expired: the block came with ``create`` long ago), which is not the node's
        fault: the next ``add_block`` brings a fresh token."""
        client = self._client
        failures.append(exc.reason)
        log.warning("%s: pipeline setup for block %s failed at %s: %s; abandoning "
                    "the block%s", self.path, located["block"]["id"], node_name(exc.node),
                    exc.reason, "" if exc.token_refused else " and excluding the node")
        await self._meta("abandon_block", {
            "path": self.path, "client_name": client.client_name, "ino": self.ino,
            "block": located["block"]})
        if exc.token_refused:
            return
        excluded.append(exc.node["node_id"])
        # and for the stream's later blocks too (HDFS's excludedNodes cache): a dead
        # node stays in the metadata server's placement until it is declared dead
        self._failed_nodes.append(exc.node)

    def set_first_block(self, located: dict | None) -> None:
        """The block ``create(first_block=True)`` allocated (None: it could not): the first
        block this stream needs, instead of an ``add_block`` call."""
        self._first_block = located

    async def _abandon_first_block(self) -> None:
        located, self._first_block = self._first_block, None
        await self._meta("abandon_block", {
            "path": self.path, "client_name": self._client.client_name, "ino": self.ino,
            "block": located["block"]})

    def _whole_block_buffered(self) -> bool:
        """No pipeline is open and the current block's every byte is buffered, in one packet."""
        return (self._pipeline is None and bool(self._buf) and self._buf_start == 0
                and not self._buf_sent and len(self._buf) <= self.packet_size)

    async def _write_whole_block(self) -> None:
        """The block's every byte is in the buffer and fits one packet, and no pipeline is
        open (a small file closed before any flush, or a file's last block of at most one
        packet): one WRITE_BLOCK_ONESHOT instead of a pipeline. The data stays in hand, so
        any failure is a failed setup: abandon the block, exclude the node, take a new one
        (HDFS createBlockOutputStream). Returns once every node acknowledged."""
        client = self._client
        config = client.config
        data = bytes(self._buf)
        sums = chunk_checksums(data, self.bytes_per_checksum)
        excluded: list[str] = [n["node_id"] for n in self._failed_nodes if n.get("node_id")]
        failures: list[str] = []
        self._block_recoveries = 0
        for _attempt in range(PIPELINE_SETUP_ATTEMPTS):
            if self._error is not None:   # aborted meanwhile (lease lost, client closing)
                raise self._error
            located = await self._add_block(excluded)
            if not located.get("locations"):
                raise PipelineError(f"{self.path}: the metadata server gave block "
                                    f"{located['block']['id']} no block server")
            try:
                await write_oneshot(
                    path=self.path, located=located, client_name=client.client_name,
                    bytes_per_checksum=self.bytes_per_checksum, data=data, sums=sums,
                    timeout=config.data_timeout, connect_timeout=config.data_connect_timeout,
                    max_frame=config.max_frame, tls=client.tls)
            except SetupFailed as exc:
                await self._abandon_block(located, exc, excluded, failures)
                continue
            self._progressed()
            block = located["block"]
            self._previous = block_dict(block["id"], block["gs"], len(data))
            self._buf, self._buf_start, self._buf_sent = bytearray(), 0, 0
            self.blocks_written += 1
            return
        raise PipelineError(f"{self.path}: could not write a block after "
                            f"{PIPELINE_SETUP_ATTEMPTS} attempts: " + "; ".join(failures))

    async def _ensure_pipeline(self) -> bool:
        """The current block's pipeline, set up now if bytes wait for it. A block is
        allocated only once its first packet is due (a full packet, an hflush, the close),
        as HDFS's DataStreamer does: a small file's bytes then travel in one packet, and a
        file closed empty gets no block. False: no block is open and nothing waits."""
        if self._pipeline is None:
            if not self._buf:
                return False
            await self._start_block()
        return True

    async def _send_buffer(self, flags: int = 0) -> None:
        """Send the buffer as one packet (starting at a chunk boundary). A partial chunk at
        the end stays buffered so the next packet repeats it from the chunk's start."""
        if not flags & (FLAG_SYNC | FLAG_LAST) and self._buf_sent >= len(self._buf):
            return  # nothing new
        if not await self._ensure_pipeline():
            return
        data, offset = self._buf, self._buf_start
        sums = chunk_checksums(data, self.bytes_per_checksum)
        await self._send(offset, data, sums, flags)
        whole = len(data) - len(data) % self.bytes_per_checksum
        tail = bytes(data[whole:])  # the packet keeps `data`; never mutate it again
        self._buf = bytearray(tail)
        self._buf_start = offset + whole
        self._buf_sent = len(tail)

    async def _end_block(self) -> None:
        """Send what is buffered with the LAST flag (an empty LAST packet when all was sent),
        wait for every ack, remember the block. Nothing to do when no block is open and
        nothing is buffered; a block wholly in the buffer goes in one message instead."""
        if self._whole_block_buffered():
            await self._write_whole_block()
            return
        if not await self._ensure_pipeline():
            return
        length = self._buf_start + len(self._buf)
        if self._buf_sent < len(self._buf):
            await self._send_buffer(FLAG_LAST)   # the block's last bytes ride on LAST
        else:
            await self._send(length, b"", b"", FLAG_LAST)
        await self._wait_all_acked()
        pipeline = self._pipeline   # a recovery may have replaced it
        pipeline.close()
        self._previous = block_dict(pipeline.block["id"], pipeline.block["gs"], length)
        self._pipeline = None
        self._buf, self._buf_start, self._buf_sent = bytearray(), 0, 0
        self.blocks_written += 1

    # ------------------------------------------------------------------ pipeline recovery
    async def _send(self, offset: int, data, sums: bytes, flags: int = 0) -> None:
        """Send one packet on the current pipeline, recovering the pipeline when one of its
        nodes fails (the packet is then resent by the recovery, or sent afterwards)."""
        while True:
            pipeline = self._pipeline
            before = pipeline.queued
            try:
                await pipeline.send(offset, data, sums, flags)
                return
            except PipelineError:
                if not pipeline.recoverable:
                    raise
                queued = pipeline.queued > before
            await self._recover_pipeline()
            if queued:
                return   # it was in the unacked queue: the recovery resent it

    async def _wait_all_acked(self) -> None:
        while True:
            pipeline = self._pipeline
            try:
                await pipeline.wait_all_acked()
                return
            except PipelineError:
                if not pipeline.recoverable:
                    raise
            await self._recover_pipeline()

    def _should_replace(self, remaining: int) -> bool:
        """HDFS ReplaceDatanodeOnFailure: add a replacement for a failed node?"""
        policy = self._client.config.replace_datanode_on_failure   # checked by Config
        if remaining == 0 or remaining >= self.replication or policy == "never":
            return False
        if policy == "always":
            return True
        if self.replication < 3:
            return False
        return remaining <= self.replication // 2 or self._hflushed or self._appended

    async def _recover_pipeline(self) -> None:
        """HDFS pipeline recovery (DataStreamer.setupPipelineForAppendOrRecovery), run by
        the writer's task once the current pipeline failed through one of its nodes: drop
        the bad node, get a new generation stamp, add a replacement (copied up to the
        acknowledged length) when the policy says so, rebuild the pipeline with stage
        PIPELINE_SETUP_STREAMING_RECOVERY, ``update_pipeline``, then resend every unacked
        packet. Repeats while failures continue, up to ``pipeline_recovery_retries`` per
        block; raises ``PipelineError`` naming the block and the nodes tried."""
        pipeline = self._pipeline
        leftover: list[Packet] = []    # packets never queued on ``pipeline``
        while True:
            with trio.move_on_after(pipeline.timeout):
                await pipeline.done.wait()
            pending = pipeline.pending_packets() + leftover
            new = await self._rebuild(_Broken(
                block=dict(pipeline.block), nodes=tuple(pipeline.nodes),
                bad_index=pipeline.bad_index, cause=pipeline.error,
                acked=pipeline.acked_bytes, sent_end=pipeline.sent_end))
            self._pipeline = new
            leftover = []
            for i, packet in enumerate(pending):
                before = new.queued
                try:
                    await new.send(packet.offset, packet.data, packet.sums, packet.flags)
                except PipelineError:
                    if not new.recoverable:
                        raise
                    leftover = pending[i + (1 if new.queued > before else 0):]
                    break
            else:
                return
            pipeline = new

    async def _rebuild(self, old: _Broken) -> Pipeline:
        """One recovery of ``old`` (a failed pipeline or append setup): returns the new,
        running pipeline."""
        client = self._client
        config = client.config
        retries = max(0, int(config.pipeline_recovery_retries))
        block = dict(old.block)          # as the metadata server knows it
        nodes = list(old.nodes)
        bad_index, cause = old.bad_index, old.cause
        acked = old.acked
        where = f"{self.path}: block {block['id']}"
        while True:
            if self._error is not None:   # aborted meanwhile (lease lost, client closing)
                raise self._error
            if bad_index is None or not 0 <= bad_index < len(nodes):
                raise cause
            bad = nodes.pop(bad_index)
            if all(bad.get("node_id") != n.get("node_id") for n in self._failed_nodes):
                self._failed_nodes.append(bad)
            self._block_recoveries += 1
            self.recoveries += 1
            self._client.pipeline_recoveries += 1
            tried = ", ".join(node_name(n) for n in self._failed_nodes)
            if self._block_recoveries > retries:
                raise PipelineError(f"{where}: giving up after {retries} pipeline recoveries; "
                                    f"failed block servers: {tried}; last error: {cause}")
            if not nodes:
                raise PipelineError(f"{where}: every block server of the pipeline failed "
                                    f"({tried}); last error: {cause}")
            log.warning("%s: pipeline recovery %d: dropping %s (%s); %d node(s) left, %d "
                        "bytes acknowledged", where, self._block_recoveries, node_name(bad),
                        cause, len(nodes), acked)
            try:
                located = await self._meta("update_block_for_pipeline", {
                    "block": block, "client_name": client.client_name})
            except (FileNotFound, LeaseExpired, ServerUnavailable):
                raise
            except LeaseFSError as exc:
                raise PipelineError(f"{where}: pipeline recovery refused by the metadata "
                                    f"server: {exc}") from None
            # with the new stamp comes a fresh write token for it (security = secure)
            new_gs = located["block"]["gs"]
            if self._should_replace(len(nodes)):
                try:
                    source_gs = block["gs"] if old.source_gs is None else old.source_gs
                    nodes = await self._add_replacement(
                        block_dict(block["id"], source_gs, acked), nodes)
                except LeaseFSError as exc:
                    if not config.replace_datanode_best_effort:
                        raise PipelineError(f"{where}: cannot add a replacement block server "
                                            f"({exc}); {len(nodes)} node(s) left, failed: "
                                            f"{tried}; last error: {cause}") from None
                    log.warning("%s: no replacement block server (%s); going on with %d "
                                "node(s) (best effort)", where, exc, len(nodes))
            new_block = block_dict(block["id"], new_gs, acked)
            try:
                pipeline = await Pipeline.connect(
                    path=self.path, located={"block": new_block, "locations": nodes,
                                             "token": located.get("token")},
                    client_name=client.client_name, bytes_per_checksum=self.bytes_per_checksum,
                    window=self.window, timeout=config.data_timeout,
                    connect_timeout=config.data_connect_timeout, max_frame=config.max_frame,
                    min_bytes=acked, stage=PIPELINE_SETUP_STREAMING_RECOVERY, tls=client.tls,
                    on_ack=self._progressed, ack_step=config.data_ack_timeout_step)
            except SetupFailed as exc:
                cause = PipelineError(f"{where}: recovery setup failed: {exc.reason}")
                bad_index = next((i for i, n in enumerate(nodes)
                                  if n.get("node_id") == exc.node.get("node_id")), 0)
                continue
            try:
                await self._meta("update_pipeline", {
                    "client_name": client.client_name, "old_block": block,
                    "new_block": new_block, "new_nodes": [n["node_id"] for n in nodes]})
            except BaseException:
                pipeline.close()
                await close_quietly(pipeline.framed)
                raise
            log.info("%s: pipeline recovered: generation stamp %d, %d bytes acknowledged, "
                     "nodes %s", where, new_gs, acked, ", ".join(node_name(n) for n in nodes))
            pipeline.sent_end = max(old.sent_end, acked)
            client.nursery.start_soon(pipeline.run_responder,
                                       name=f"responder {self.path} blk {block['id']} (recovered)")
            return pipeline

    async def _add_replacement(self, copy: dict, nodes: list[dict]) -> list[dict]:
        """A new block server from ``get_additional_datanode``, given a copy of the first
        ``copy["num_bytes"]`` (acknowledged) bytes of block ``copy["id"]`` by one of
        ``nodes`` (TRANSFER_BLOCK stage TRANSFER_RBW; ``copy["gs"]`` is the oldest stamp a
        source's replica may carry); returns the pipeline with it appended."""
        client = self._client
        config = client.config
        answer = await self._meta("get_additional_datanode", {
            "path": self.path, "ino": self.ino, "block": copy,
            "existing": [n["node_id"] for n in nodes],
            "excluded": [n["node_id"] for n in self._failed_nodes if n.get("node_id")],
            "num": 1, "client_name": client.client_name})
        new_nodes = answer.get("locations") or []
        if not new_nodes:
            raise PipelineError("the metadata server has no block server to add")
        target = new_nodes[0]
        failures = []
        for source in nodes:
            try:
                await transfer_rbw(source, target, copy, client_name=client.client_name,
                                   timeout=config.data_timeout,
                                   connect_timeout=config.data_connect_timeout,
                                   max_frame=config.max_frame, tls=client.tls,
                                   token=answer.get("token"))
            except IO_ERRORS as exc:
                failures.append(f"from {node_name(source)}: {failure_cause(exc)}")
                continue
            log.info("%s: block %s: copied %d bytes from %s to the replacement %s", self.path,
                     copy["id"], copy["num_bytes"], node_name(source), node_name(target))
            self.replacements += 1
            return nodes + [target]
        self._failed_nodes.append(target)
        raise PipelineError(f"could not copy block {copy['id']} to {node_name(target)}: "
                            + "; ".join(failures))

    async def _complete(self) -> None:
        client = self._client
        await complete_file(self._meta, self.path, {
            "path": self.path, "client_name": client.client_name, "ino": self.ino,
            "last": self._previous,
            **({"data": self._inline} if self._inline is not None else {}),
            **{k: v for k, v in self._close_attrs.items() if v is not None}},
            client.config.complete_retries)
