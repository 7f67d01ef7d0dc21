"""The block server's data-transfer server (HDFS DataXceiver): WRITE_BLOCK pipelines,
READ_BLOCK and BLOCK_LENGTH over the stream protocol of docs/PROTOCOL.md §3.

Why it exists: block data never goes through the metadata server; clients and block servers
stream it here, packet by packet, with CRC32C checksums per chunk.

Write pipeline (seed 003 "DatanodeWrite"): the op header creates an RBW replica and is
forwarded to ``targets[0]`` with ``targets[1:]``; once the downstream answered, this node
answers upstream. Then three tasks run per write:

* the receiver reads a packet, verifies its checksums and forwards it downstream, then hands it
  to the disk writer (one packet in hand, so receiving the next packet overlaps writing this
  one), which writes data and checksums locally (fsync for SYNC packets; at finalize only
  with ``sync_on_close``) and queues it for
  the responder; that queue holds at most ``write_window_packets`` entries, so the receiver
  stops reading (and TCP pushes back on the writer) when the acks lag;
* the responder takes the queued packets in order, waits for the downstream ack of the same
  seqno (the last node: none), marks the bytes visible, finalizes on LAST (then queues the
  incremental block report, which the writer's ``complete`` waits for on the metadata
  server), and acks upstream ``[own status] + downstream statuses``.

A checksum error stops this node with ERROR_CHECKSUM; a downstream that breaks, stops
reading while a packet is forwarded to it, or sends no ack, for ``data_timeout`` plus
``data_ack_timeout_step`` per node below this one (``fs.datatransfer.ack_timeout``: one step
less than the upstream waits for this node), is acked as ``SUCCESS`` for this node and
``ERROR`` at the downstream's index, then the pipeline closes (pipeline recovery is the
client's job, which so drops the silent node, not a healthy one above it). The replica stays RBW with its visible length.

The same pipeline serves HDFS's data-transfer port (``storage.hdfs.xfer``): a
``WritePipeline`` takes its packet and ack layout from a wire object (``NativeWire`` here),
and the READ_BLOCK packet loop (``send_block_range``) its packet writer.

Pipeline recovery (docs/PROTOCOL.md §5): WRITE_BLOCK stage PIPELINE_SETUP_STREAMING_RECOVERY
stops the old pipeline on the replica, cuts it to the acknowledged ``min_bytes`` under the
new stamp, then runs as above; TRANSFER_BLOCK (stage TRANSFER_RBW) copies the acknowledged
part of a replica into a WRITE_BLOCK stage TRANSFER_RBW on a replacement node, which keeps
it RBW. ``LEASEFS_TEST_CORRUPT_PACKETS`` is a test-only fault injection (see below).

PIPELINE_SETUP_APPEND (docs/PROTOCOL.md §4): the same pipeline, but each node reopens its
FINALIZED replica of exactly ``min_bytes`` bytes as RBW under the new generation stamp instead
of creating one; the writer's first packet repeats the last partial chunk.

Block access tokens (security = secure, ``fs.blocktoken``): every op that reads, writes or
copies a replica is checked before it touches anything: READ_BLOCK, BLOCK_LENGTH and
BLOCK_CHECKSUM (``storage.blockchecksum``) need a read token, WRITE_BLOCK a write token
(CREATE, APPEND, STREAMING_RECOVERY: for the stamp the header names, which for APPEND and
STREAMING_RECOVERY is the new one) or a copy token (TRANSFER_RBW, TRANSFER_FINALIZED:
``STAGE_MODES``), TRANSFER_BLOCK and WRITE_BLOCK_ONESHOT as their writes do, PATCH_BLOCK a
write token for its NEW stamp. A pipeline
node forwards the header with the token unchanged; a copy's sender shows its receiver the
copy token it was given (by the client, or in the metadata server's TRANSFER command).
A refused token is an ``InvalidToken`` error response.

INIT_REPLICA_RECOVERY / UPDATE_REPLICA_UNDER_RECOVERY: the block-recovery ops a primary
(``storage.recovery``) sends to every replica holder; INIT stops a running pipeline of that
replica (its cancel scope) and answers the replica's length, stamp and original state.

WRITE_BLOCK_ONESHOT (a whole small block in one message, answered once) is served by
``storage.oneshot``; PATCH_BLOCK (byte ranges written into a finalized replica under a new
stamp, one message down a chain, answered once) by ``storage.patch``; the header checks the
write ops share are ``storage.opheader``.

READ_BLOCK: every packet send has ``data_timeout``; a reader that stops reading for that
long, or closes the connection early (normal: it read what it needed), ends the op with a
debug line, and the replica's files are closed at once. A replica whose files cannot be
opened or read in full is dropped and reported deleted if they are gone or cut
(``reporter.replica_lost``), so the metadata server stops listing it and re-replicates.

Concurrency contract: every connection is served by its own task(s) in the trio thread; each
op owns its connection; disk work goes through the ``ReplicaStore``'s worker threads. Bad
input never escapes a connection: it is answered with an error response (before the op's
response) or an ERROR ack (during a write), and the connection is closed.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import trio

from fs import blocktoken, nodeauth
from fs import tls as tlsmod
from fs.config import Config
from fs.datatransfer import (ack_timeout, BLOCK_CHECKSUM, BLOCK_LENGTH, CHECKSUM_SIZE, DATA_TRANSFER_VERSION, ERROR,
                             ERROR_CHECKSUM, FLAG_HEARTBEAT, FLAG_LAST, FLAG_SYNC, MAX_PACKET_DATA, PACKET_HEADER,
                             PIPELINE_SETUP_APPEND, PIPELINE_SETUP_CREATE,
                             PIPELINE_SETUP_STREAMING_RECOVERY, READ_BLOCK, SUCCESS,
                             TRANSFER_BLOCK, TRANSFER_FINALIZED, TRANSFER_RBW, WRITE_BLOCK,
                             WRITE_BLOCK_ONESHOT, PATCH_BLOCK,
                             Packet, encode_packet_header, num_chunks, receive_ack, take_ack,
                             encode_ack, send_packet, verify_checksums)
from fs.dataconn import close_gracefully, failure_cause, open_data_connection
from fs.errors import (ChecksumError, InternalError, InvalidArgument, InvalidToken,
                       LeaseFSError, NotSupported, PipelineError, ProtocolError,
                       ReplicaNotFound, ServerUnavailable)
from fs.framing import FramedStream, encode_frame
from fs.limits import ByteBudget
from fs.rpc import check_version, parse_address

from .blockchecksum import FOLDS, replica_checksum, serve_block_checksum
from .blockcopy import copy_replica, send_replica
from .layout import check_packet_range
from .oneshot import write_oneshot
from .patch import serve_patch
from .opheader import (HEADER_MAX_FRAME, block_ref as _block,
                       bytes_per_checksum as _bytes_per_checksum, error_response as _error_response,
                       field as _field, write_targets as _targets)
from .recovery import INIT_REPLICA_RECOVERY, UPDATE_REPLICA_UNDER_RECOVERY, replica_wire
from .replica_records import Replica
from .replica_states import ReplicaState
from .replicas import ReplicaStore

log = logging.getLogger(__name__)


def _log_local_failure(replica: Replica, what: str, exc: BaseException) -> None:
    """A replica the metadata server deleted under a writer (its file deleted or overwritten,
    a newer stamp won) is the writer's problem, not this server's: a warning, not an error."""
    if isinstance(exc, ReplicaNotFound):
        log.warning("WRITE_BLOCK %s: %s refused: %s", replica.name, what, exc)
    else:
        log.error("WRITE_BLOCK %s: %s failed: %s", replica.name, what, exc)


#: the access each WRITE_BLOCK stage needs (HDFS AccessMode): a client writing its block,
#: or a block server copying a replica (re-replication, a pipeline's replacement node)
STAGE_MODES = {
    PIPELINE_SETUP_CREATE: blocktoken.WRITE,
    PIPELINE_SETUP_APPEND: blocktoken.WRITE,
    PIPELINE_SETUP_STREAMING_RECOVERY: blocktoken.WRITE,
    TRANSFER_RBW: blocktoken.COPY,
    TRANSFER_FINALIZED: blocktoken.COPY,
}

_KNOWN_FLAGS = FLAG_LAST | FLAG_SYNC | FLAG_HEARTBEAT
#: the seqno of the ERROR ack for a packet whose header could not be read
UNREAD_SEQNO = -2
#: TEST-ONLY fault injection: ``LEASEFS_TEST_CORRUPT_PACKETS=once|always`` in a block server's
#: environment flips a byte of a received data packet before it is verified, as if the
#: network had corrupted it in flight (``once``: the first data packet this process receives;
#: ``always``: every one). The write path must then report ERROR_CHECKSUM and the client
#: recover its pipeline. Never set it outside tests.
CORRUPT_PACKETS_ENV = "LEASEFS_TEST_CORRUPT_PACKETS"


class _CorruptionHook:
    """State of the test-only in-flight corruption (process-wide, like the env var)."""

    def __init__(self):
        self.fired = 0

    def due(self) -> bool:
        mode = os.environ.get(CORRUPT_PACKETS_ENV, "")
        if not mode or (mode == "once" and self.fired):
            return False
        if mode not in ("once", "always"):
            return False
        self.fired += 1
        log.warning("TEST HOOK %s=%s: corrupting a received packet", CORRUPT_PACKETS_ENV, mode)
        return True


_TEST_CORRUPTION = _CorruptionHook()


def _flip_first_byte(data) -> bytes:
    raw = bytearray(data)
    raw[0] ^= 0xFF
    return bytes(raw)


@dataclass
class TransferStats:
    """What the data-transfer server did, for its metrics (``storage/metrics.py``): plain
    counters the trio thread adds to; read at scrape time."""
    bytes_read: int = 0           # block data sent to readers (READ_BLOCK)
    bytes_written: int = 0        # block data written to local replicas (all write ops)
    checksum_errors: int = 0      # received packets whose data did not match its checksums
    streaming_recoveries: int = 0   # WRITE_BLOCK stage PIPELINE_SETUP_STREAMING_RECOVERY set up
    copies_sent: int = 0          # TRANSFER_BLOCK copies for a writer's pipeline recovery
    token_refusals: int = 0       # ops refused for their block access token


class NullReporter:
    """Stands in for the heartbeat service where no metadata server is wired (tests)."""

    def block_received(self, block_id: int, gs: int, num_bytes: int, state: str) -> None:
        pass

    async def replica_lost(self, block_id: int, gs: int, why) -> bool:
        return False

    async def reports_sent(self, timeout: float) -> bool:
        return True


class _Conn:
    """One data-transfer connection and whether its op response went out already."""

    def __init__(self, stream: trio.abc.Stream, peer: str):
        self.framed = FramedStream(stream, HEADER_MAX_FRAME)
        self.peer = peer
        self.responded = False
        #: the op read everything the peer sends and answered: a plain close sends no RST
        #: (no unread input), so the half-close and drain are skipped
        self.drained = False

    async def respond(self, response: dict) -> None:
        self.responded = True
        await self.framed.send_frame(response)


# --------------------------------------------------------------------------- server


class DataTransferServer:
    """Serves data-transfer connections for one replica store."""

    def __init__(self, config: Config, store: ReplicaStore, reporter=None):
        self.config = config
        self.store = store
        self.reporter = reporter or NullReporter()
        # the cluster key (security = secure, set by the block server): recovery ops must be
        # signed with it (fs.nodeauth)
        self.node_key: bytes | None = None
        # block keys the tokens of reads, writes and copies are checked with (security =
        # secure: from the metadata server's registration and heartbeat replies)
        self.block_keys: dict[int, bytes] = {}
        self.active_ops = 0   # HDFS xceiver count, reported in heartbeats
        self.oneshot_writes = 0   # WRITE_BLOCK_ONESHOT packets received (tests, metrics)
        self.stats = TransferStats()
        # metrics hook: None, or ``observe(op, result, seconds)`` once per connection's op
        # (``op`` as the peer sent it; ``result`` "ok", "peer_gone", "disk_error" or the
        # error's class name)
        self.op_observer = None
        #: packet data held by all write pipelines (being received or waiting for the disk)
        self.budget = ByteBudget(max(config.data_buffer_limit, MAX_PACKET_DATA))

    async def handle(self, stream: trio.abc.Stream, peer: str = "?") -> None:
        """Serve one connection: one op header, one op."""
        conn = _Conn(stream, peer)
        self.active_ops += 1
        try:
            await self._serve(conn)
        finally:
            self.active_ops -= 1
            if conn.drained:
                with trio.CancelScope(shield=True):
                    await conn.framed.aclose()
            else:
                await close_gracefully(conn.framed)

    async def _serve(self, conn: _Conn) -> None:
        op = "?"
        started = time.perf_counter()
        result = "ok"
        try:
            with trio.move_on_after(self.config.idle_timeout) as scope:
                header = await conn.framed.receive_frame()
            if scope.cancelled_caught:
                raise ProtocolError(f"no op header within {self.config.idle_timeout:g} s")
            if not isinstance(header, dict) or not isinstance(header.get("op"), str):
                raise ProtocolError(f"op header must be a map with an 'op' name, got "
                                    f"{header!r:.120}")
            op = header["op"]
            check_version(header.get("version", DATA_TRANSFER_VERSION), DATA_TRANSFER_VERSION,
                          f"{op[:80]} header")
            if op == WRITE_BLOCK:
                await self._write_block(conn, header)
            elif op == WRITE_BLOCK_ONESHOT:   # the corruption hook as tests patch it
                await write_oneshot(self, conn, header, corruption=_TEST_CORRUPTION)
            elif op == PATCH_BLOCK:
                await serve_patch(self, conn, header)
            elif op == READ_BLOCK:
                await self._read_block(conn, header)
            elif op == BLOCK_LENGTH:
                await self._block_length(conn, header)
            elif op == TRANSFER_BLOCK:
                await self._transfer_block(conn, header)
            elif op == BLOCK_CHECKSUM:
                await serve_block_checksum(self, conn, header)
            elif op == INIT_REPLICA_RECOVERY:
                await self._init_replica_recovery(conn, header)
            elif op == UPDATE_REPLICA_UNDER_RECOVERY:
                await self._update_replica_under_recovery(conn, header)
            else:
                raise NotSupported(f"unknown or unsupported data-transfer op {op[:80]!r}")
        except (EOFError, ServerUnavailable) as exc:
            result = "peer_gone"
            log.debug("%s from %s: peer went away: %s", op, conn.peer, exc)
        except LeaseFSError as exc:
            result = type(exc).__name__
            log.info("%s from %s refused: %s", op, conn.peer, exc)
            await self._try_error_response(conn, exc, op)
        except OSError as exc:   # the disk, not the peer
            result = "disk_error"
            log.warning("%s from %s: disk error: %s", op, conn.peer, exc)
            await self._try_error_response(
                conn, LeaseFSError(f"{op}: disk error on the block server: {exc}",
                                   errno=exc.errno or None), op)
        except Exception as exc:   # a bug: keep serving everybody else
            result = "InternalError"
            log.exception("%s from %s failed", op, conn.peer)
            await self._try_error_response(
                conn, InternalError(f"{op}: internal error: {type(exc).__name__}: {exc}"), op)
        finally:
            if self.op_observer is not None:
                self.op_observer(op, result, time.perf_counter() - started)

    @staticmethod
    async def _try_error_response(conn: _Conn, exc: LeaseFSError, op: str) -> None:
        if conn.responded:
            return
        extra = {"first_bad_link": ""} if op in (WRITE_BLOCK, WRITE_BLOCK_ONESHOT) else {}
        try:
            await conn.respond(_error_response(exc, **extra))
        except (ServerUnavailable, EOFError):
            pass

    # ------------------------------------------------------------------ other front ends

    async def run_pipeline(self, upstream: FramedStream, peer: str,
                           downstream: FramedStream | None, replica: Replica, below: int,
                           wire, transfer: bool = False) -> None:
        """Receive, write, forward and ack the packets of a write whose setup was answered
        (``WritePipeline``), in ``wire``'s layout of packets and acks (``storage.hdfs``);
        ``transfer``: a TRANSFER_RBW copy (the replica stays RBW)."""
        await WritePipeline(self, _Upstream(upstream, peer), downstream, replica,
                            below=below, transfer=transfer, wire=wire).run()

    def report_receiving(self, block_id: int, gs: int, num_bytes: int) -> None:
        """HDFS "receiving block" report: the metadata server learns the RBW location."""
        self.reporter.block_received(block_id, gs, num_bytes, ReplicaState.RBW.value)

    async def keep_after_failed_setup(self, replica: Replica, created: bool) -> None:
        """A WRITE_BLOCK whose downstream setup failed keeps its replica (stops writing it),
        as HDFS does: the writer's recovery may still cut and reopen it, or have it copied
        to a replacement (TRANSFER_RBW of what was acknowledged, even nothing). One this op
        ``created`` is reported as being received, as HDFS reports it at creation: the
        metadata server then knows where it is, and the abandonBlock that usually answers a
        failed setup (or any later removal of the block) invalidates it here."""
        await self.store.release_writer(replica)
        if created:
            self.report_receiving(replica.block_id, replica.gs, 0)

    async def release_own_writer(self, replica: Replica, own_writer) -> None:
        """At the end of a write op: stop writing the replica, if it is still RBW and this
        op's (a later pipeline recovery may have given it a new writer meanwhile)."""
        if not replica.removed and replica.state is ReplicaState.RBW \
                and replica.writer is own_writer:
            with trio.CancelScope(shield=True):
                await self.store.release_writer(replica)

    # ------------------------------------------------------------------ access tokens

    def set_block_keys(self, keys: dict[int, bytes]) -> None:
        self.block_keys = dict(keys)

    async def replica_checksum(self, block_id: int, gs: int, length: int, fold: str, op: str):
        """``(reader, digest)``: a replica's chunk CRCs over ``[0, length)`` folded as
        ``fold`` (a ``storage.blockchecksum.FOLDS`` name), for another front end's op."""
        return await replica_checksum(self, block_id, gs, length, FOLDS[fold], op)

    def check_token(self, header: dict, block_id: int, gs: int, op: str,
                    mode: str = blocktoken.READ) -> None:
        """Every read, write and copy of a replica needs a block access token of the
        metadata server for this block, stamp and ``mode`` (security = secure); checked
        before the op touches anything."""
        if self.node_key is not None:
            try:
                blocktoken.check(self.block_keys, header.get("token"), block_id, gs, mode,
                                 time.time(), f"{op} of block {block_id} stamp {gs}")
            except InvalidToken:
                self.stats.token_refusals += 1
                raise

    # ------------------------------------------------------------------ BLOCK_LENGTH

    async def _block_length(self, conn: _Conn, header: dict) -> None:
        block_id, gs = _block(header, BLOCK_LENGTH)
        self.check_token(header, block_id, gs, BLOCK_LENGTH)
        replica = self.store.readable(block_id, gs)
        await conn.respond({"status": "SUCCESS", "message": "",
                            "visible_length": replica.readable_length,
                            "gs": replica.gs, "state": replica.state.value})

    # ------------------------------------------------------------------ block recovery

    def _check_signed(self, header: dict, op: str) -> None:
        """Recovery ops stop writers and cut replicas: only a block server of this cluster
        may send them (security = secure)."""
        if self.node_key is not None:
            nodeauth.check_op(self.node_key, header, time.time(), op)

    async def _init_replica_recovery(self, conn: _Conn, header: dict) -> None:
        self._check_signed(header, INIT_REPLICA_RECOVERY)
        block_id, gs = _block(header, INIT_REPLICA_RECOVERY)
        recovery_id = _field(header, "recovery_id", int, INIT_REPLICA_RECOVERY)
        replica = await self.store.init_replica_recovery(block_id, gs, recovery_id)
        await conn.respond({"status": "SUCCESS", "message": "",
                            "replica": replica_wire(replica, replica.original_state)})

    async def _update_replica_under_recovery(self, conn: _Conn, header: dict) -> None:
        op = UPDATE_REPLICA_UNDER_RECOVERY
        self._check_signed(header, op)
        block_id, _gs = _block(header, op)
        recovery_id = _field(header, "recovery_id", int, op)
        new_length = _field(header, "new_length", int, op)
        replica = await self.store.update_replica_under_recovery(block_id, recovery_id,
                                                                 new_length)
        self.reporter.block_received(block_id, replica.gs, replica.num_bytes,
                                     ReplicaState.FINALIZED.value)
        await conn.respond({"status": "SUCCESS", "message": "", "replica": replica_wire(replica)})

    # ------------------------------------------------------------------ TRANSFER_BLOCK

    async def _transfer_block(self, conn: _Conn, header: dict) -> None:
        """TRANSFER_BLOCK stage TRANSFER_RBW (pipeline recovery, HDFS transferBlock): copy
        the first ``block.num_bytes`` bytes (the length every pipeline node acknowledged)
        of this node's replica to ``targets[0]`` (WRITE_BLOCK stage TRANSFER_RBW), stopping
        the old pipeline still writing it first. Stage TRANSFER_FINALIZED (a patch writer
        replacing a replica that missed its patch): the whole finalized replica at exactly
        ``block.gs``, as a TRANSFER command copies it. Answers once the target acked the
        copy."""
        op = TRANSFER_BLOCK
        block_id, gs = _block(header, op)
        # HDFS: the client's token, mode COPY; the target checks the same token again
        self.check_token(header, block_id, gs, op, blocktoken.COPY)
        length = header["block"].get("num_bytes", -1)
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ProtocolError(f"{op}: block.num_bytes must be the length to copy")
        targets = _field(header, "targets", list, op)
        if len(targets) != 1 or not isinstance(targets[0], str):
            raise ProtocolError(f"{op}: targets must be one \"host:port\", got {targets!r:.120}")
        parse_address(targets[0])
        stage = _field(header, "stage", str, op, TRANSFER_RBW)
        if stage == TRANSFER_FINALIZED:
            # a patch writer's replacement: a finalized replica at exactly this stamp, copied
            # whole (the writer makes no other patch of the block meanwhile)
            replica = self.store.readable(block_id, gs)
            if replica.num_bytes != length:
                raise InvalidArgument(f"{op} blk_{block_id}_{gs}: {length} bytes asked, the "
                                      f"replica here holds {replica.num_bytes}")
            sent = await copy_replica(self.config, self.store, block_id, gs, [targets[0]],
                                      client=str(header.get("client", ""))[:200],
                                      token=header.get("token"))
            await conn.respond({"status": "SUCCESS", "message": "", "bytes": sent})
            return
        if stage != TRANSFER_RBW:
            raise NotSupported(f"{op} stage {stage[:60]!r} is not supported")
        sent = await self.transfer_replica(block_id, gs, length, targets[0],
                                           client=str(header.get("client", ""))[:200],
                                           token=header.get("token"))
        await conn.respond({"status": "SUCCESS", "message": "", "bytes": sent})

    async def transfer_replica(self, block_id: int, gs: int, length: int, target: str, *,
                               client: str = "", token: dict | None = None,
                               link=None) -> int:
        """Stream ``[0, length)`` of the local replica of ``(block_id, gs)`` with its stored
        checksums into a WRITE_BLOCK TRANSFER_RBW on ``target``, under stamp ``gs`` (the
        one ``token``, the client's copy token, names; the replica here may carry a newer
        one from a recovery that did not finish, and the writer's recovery gives the copy
        its new stamp anyway); ``link``: the target's port (``blockcopy.send_replica``);
        returns the bytes sent."""
        replica = self.store.readable(block_id, gs)
        have = replica.readable_length
        if length > have:
            raise InvalidArgument(f"{TRANSFER_BLOCK} {replica.name}: {length} bytes asked, "
                                  f"only {have} acknowledged here")
        if replica.state is ReplicaState.RBW:
            await self.store.stop_writer(replica)
        reader = await self.store.open_reader(block_id, gs)
        try:
            await send_replica(self.config, self.store, reader, block_id, gs, length,
                               [target], stage=TRANSFER_RBW, client=client, token=token,
                               link=link)
        except ServerUnavailable as exc:   # the replacement failed: a pipeline matter
            raise PipelineError(f"{TRANSFER_BLOCK} {replica.name}: {exc.message}") from None
        finally:
            with trio.CancelScope(shield=True):
                await self.store.close_reader(reader)
        self.stats.copies_sent += 1
        log.info("transferred %s (%d bytes) to %s for pipeline recovery", replica.name,
                 length, target)
        return length

    # ------------------------------------------------------------------ READ_BLOCK

    async def _read_block(self, conn: _Conn, header: dict) -> None:
        block_id, gs = _block(header, READ_BLOCK)
        self.check_token(header, block_id, gs, READ_BLOCK)
        offset = _field(header, "offset", int, READ_BLOCK, 0)
        length = _field(header, "length", int, READ_BLOCK, -1)
        try:
            await self._read_range(conn, block_id, gs, offset, length)
        except OSError as exc:
            # a replica we believe we have cannot be opened or read in full: if its files
            # are gone or cut it is dropped and reported now (the reader tries another)
            await self.reporter.replica_lost(block_id, gs, exc)
            raise

    async def _read_range(self, conn: _Conn, block_id: int, gs: int, offset: int,
                          length: int) -> None:
        """A range that fits one packet is read in one worker hop (open, read, close) and
        goes out with the response and the LAST packet in one send; a longer one streams."""
        chosen: list[int] = []

        def span(reader):
            visible, bpc = reader.visible_length, reader.bytes_per_checksum
            want = max(0, visible - offset) if length == -1 else length
            if offset < 0 or want < 0 or offset + want > visible:
                raise InvalidArgument(
                    f"READ_BLOCK blk_{block_id}: range [{offset}, {offset + want}) is outside "
                    f"the {visible} visible bytes")
            chunk_offset = offset - offset % bpc
            end = (chunk_offset if want == 0
                   else min(visible, math.ceil((offset + want) / bpc) * bpc))
            chosen[:] = [chunk_offset, end]
            one_packet = max(bpc, self.config.packet_size // bpc * bpc)
            return (chunk_offset, end - chunk_offset) if end - chunk_offset <= one_packet else None

        reader, data, sums = await self.store.read_or_open(block_id, gs, span)
        chunk_offset, end = chosen
        # ``gs``: the version served (a patched replica serves readers of an older stamp)
        response = {"status": "SUCCESS", "message": "", "visible_length": reader.visible_length,
                    "bytes_per_checksum": reader.bytes_per_checksum,
                    "chunk_offset": chunk_offset, "gs": reader.gs}
        if data is not None:
            wire = [encode_frame(response)]
            if data:
                wire += [encode_packet_header(0, chunk_offset, len(data), 0), sums, data]
            wire.append(encode_packet_header(1 if data else 0, end, 0, FLAG_LAST))
            conn.responded = True
            try:
                with trio.fail_after(self.config.data_timeout):
                    await conn.framed.send_all(b"".join(wire))
                self.stats.bytes_read += len(data)
            except trio.TooSlowError:
                log.debug("READ_BLOCK blk_%d to %s: reader took nothing for %gs",
                          block_id, conn.peer, self.config.data_timeout)
            except ServerUnavailable as exc:
                log.debug("READ_BLOCK blk_%d to %s: reader closed the connection (%s)",
                          block_id, conn.peer, exc)
            return
        try:
            try:
                with trio.fail_after(self.config.data_timeout):
                    await conn.respond(response)
            except trio.TooSlowError:
                log.debug("READ_BLOCK blk_%d to %s: reader took no response for %gs",
                          block_id, conn.peer, self.config.data_timeout)
                return
            await self.send_block_range(conn, reader, chunk_offset, end)
        finally:
            await self.store.close_reader(reader)

    async def send_block_range(self, conn, reader, start: int, end: int,
                               packet_size: int | None = None, send=send_packet) -> bool:
        """Packets of ``packet_size`` (default ``packet_size``; rounded to whole chunks)
        read one ahead in a worker thread while the previous one is sent, then the empty
        LAST packet; True when that went out. A reader that goes away or stalls just ends
        the op (False); a disk error is raised as itself (not wrapped in an exception
        group). ``send(framed, seqno, offset, data, sums, flags)`` puts a packet on the
        wire (leasefs's layout, or HDFS's for ``storage.hdfs``)."""
        bpc = reader.bytes_per_checksum
        step = max(bpc, (packet_size or self.config.packet_size) // bpc * bpc)
        send_ch, receive_ch = trio.open_memory_channel(1)
        read_failure: list[Exception] = []

        async def producer():
            async with send_ch:
                try:
                    for pos in range(start, end, step):
                        data, sums = await self.store.run_io(reader.read, pos,
                                                             min(step, end - pos))
                        await send_ch.send((pos, data, sums))
                except Exception as exc:   # reported below, after the nursery
                    read_failure.append(exc)

        seqno = 0
        reader_gone = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            async with receive_ch:
                async for pos, data, sums in receive_ch:
                    if not await self._send_to_reader(conn, reader, seqno, pos, data, sums,
                                                      send=send):
                        # a flag, not a return: the nursery's cancelled scope would swallow
                        # a return at the channel's closing checkpoint
                        reader_gone = True
                        nursery.cancel_scope.cancel()
                        break
                    seqno += 1
        if reader_gone:
            return False
        if read_failure:
            raise read_failure[0]
        return await self._send_to_reader(conn, reader, seqno, end, b"", b"", FLAG_LAST,
                                          send=send)

    async def _send_to_reader(self, conn, reader, seqno: int, offset: int, data,
                              sums: bytes, flags: int = 0, send=send_packet) -> bool:
        """Send one READ_BLOCK packet; False (after a debug line) when the reader closed the
        connection or read nothing for ``data_timeout``."""
        if not await self.to_reader(conn, reader, offset,
                                    send(conn.framed, seqno, offset, data, sums, flags)):
            return False
        self.stats.bytes_read += len(data)
        return True

    async def to_reader(self, conn, reader, offset: int, sending) -> bool:
        """Await ``sending`` (bytes of a READ_BLOCK from ``offset`` going out on ``conn``)
        within ``data_timeout``; False, after a debug line, when the reader took nothing for
        that long or closed the connection: that ends the op, it is no error of this
        server (the HDFS port's reads share it)."""
        try:
            with trio.fail_after(self.config.data_timeout):
                await sending
            return True
        except trio.TooSlowError:
            log.debug("READ_BLOCK blk_%d to %s: reader stopped reading for %gs at offset %d; "
                      "ending the read", reader.block_id, conn.peer, self.config.data_timeout,
                      offset)
        except ServerUnavailable as exc:
            log.debug("READ_BLOCK blk_%d to %s: reader closed the connection at offset %d "
                      "(%s)", reader.block_id, conn.peer, offset, exc)
        return False

    # ------------------------------------------------------------------ WRITE_BLOCK

    async def _write_block(self, conn: _Conn, header: dict) -> None:
        block_id, gs = _block(header, WRITE_BLOCK)
        targets = _targets(header, WRITE_BLOCK)
        stage = _field(header, "stage", str, WRITE_BLOCK, PIPELINE_SETUP_CREATE)
        if stage not in STAGE_MODES:
            raise NotSupported(f"WRITE_BLOCK stage {stage[:60]!r} is not supported yet")
        # before anything is created, cut or renamed; for APPEND and STREAMING_RECOVERY
        # ``gs`` is the new stamp the writer got from the metadata server with its token
        self.check_token(header, block_id, gs, f"{WRITE_BLOCK} {stage}", STAGE_MODES[stage])
        if stage == TRANSFER_RBW and targets:
            raise ProtocolError("WRITE_BLOCK stage TRANSFER_RBW takes no downstream targets")
        min_bytes = 0
        reopening = stage in (PIPELINE_SETUP_APPEND, PIPELINE_SETUP_STREAMING_RECOVERY)
        if reopening:
            min_bytes = _field(header, "min_bytes", int, WRITE_BLOCK)
            if min_bytes < 0:
                raise ProtocolError(f"WRITE_BLOCK: min_bytes {min_bytes} is negative")
        bpc = _bytes_per_checksum(header, block_id, WRITE_BLOCK, self.config)
        if stage == PIPELINE_SETUP_APPEND:
            # without an explicit bytes_per_checksum the replica's own is used
            replica = await self.store.reopen_for_append(
                block_id, gs, min_bytes, bpc if "bytes_per_checksum" in header else None)
        elif stage == PIPELINE_SETUP_STREAMING_RECOVERY:
            # the old pipeline is stopped, the replica cut to the acked length, new stamp
            replica = await self.store.recover_rbw(
                block_id, gs, min_bytes, bpc if "bytes_per_checksum" in header else None)
            self.stats.streaming_recoveries += 1
        else:
            replica = await self.store.create_rbw(block_id, gs, bpc)
        # a later pipeline recovery may give the replica a new writer while this op is
        # still unwinding: only ever release our own
        own_writer = replica.writer
        downstream: FramedStream | None = None
        try:
            if targets:
                downstream, failure = await self._connect_downstream(header, targets)
                if failure is not None:
                    message, bad_link, kind = failure
                    log.info("WRITE_BLOCK %s: downstream setup failed at %s: %s",
                             replica.name, bad_link, message)
                    await self.keep_after_failed_setup(replica, created=not reopening)
                    # a refused token stays one upstream: the writer asks for a fresh
                    # token instead of blaming the node
                    error = InvalidToken if kind == InvalidToken.__name__ else ServerUnavailable
                    exc = error(f"pipeline setup failed at {bad_link}: {message}")
                    await conn.respond(_error_response(exc, first_bad_link=bad_link))
                    return
            # HDFS "receiving block" report: the metadata server learns the RBW location
            # (not for a TRANSFER_RBW copy: it is reported once a recovered pipeline uses it)
            if stage != TRANSFER_RBW:
                self.report_receiving(block_id, gs, min_bytes)
            await conn.respond({"status": "SUCCESS", "message": "", "first_bad_link": ""})
            pipeline = WritePipeline(self, conn, downstream, replica, below=len(targets),
                                      transfer=stage == TRANSFER_RBW)
            await pipeline.run()
        finally:
            if downstream is not None:
                with trio.CancelScope(shield=True):
                    await downstream.aclose()
            await self.release_own_writer(replica, own_writer)

    async def _connect_downstream(self, header: dict, targets: list[str]):
        """``(stream, None)`` or ``(None, (message, first_bad_link, error type or None))``.
        The header goes on as it came (the writer's token too: each node checks it)."""
        target = targets[0]
        try:
            framed = await open_data_connection(target, self.config.data_connect_timeout,
                                                HEADER_MAX_FRAME, tlsmod.client(self.config))
        except LeaseFSError as exc:   # unreachable, or TLS refused
            return None, (str(exc), target, None)
        # one step longer than our downstream waits for its own: a silent node further down
        # is named by the node right above it, before we give up on the whole chain
        wait = ack_timeout(self.config.data_timeout, self.config.data_ack_timeout_step,
                           len(targets))
        try:
            await framed.send_frame({**header, "targets": targets[1:]})
            with trio.fail_after(wait):
                response = await framed.receive_frame()
        except (LeaseFSError, EOFError, trio.TooSlowError) as exc:
            await framed.aclose()
            return None, (f"no setup response from {target}: "
                          f"{failure_cause(exc, wait)}", target, None)
        if isinstance(response, dict) and response.get("status") == "SUCCESS":
            return framed, None
        await framed.aclose()
        if not isinstance(response, dict):
            return None, (f"malformed setup response {response!r:.100}", target, None)
        bad = response.get("first_bad_link") or target
        error = response.get("error")
        kind = error.get("type") if isinstance(error, dict) else None
        return None, (str(response.get("message", "refused")), bad, kind)


@dataclass(slots=True)
class _Queued:
    """A packet written locally, waiting for its downstream ack (or an error to report)."""

    seqno: int
    end: int = 0                    # offset after the packet's data
    last_sum: bytes | None = None   # checksum of the packet's last chunk
    has_data: bool = False
    last: bool = False
    own_status: int = SUCCESS


#: bytes of data one worker-thread trip of a write pipeline writes at most
_DISK_BATCH = 8 << 20


async def _send_all(channel: trio.MemorySendChannel, items) -> None:
    """Queue ``items`` in order, without a checkpoint between them while there is room (the
    receiving task then takes them together)."""
    for item in items:
        try:
            channel.send_nowait(item)
        except trio.WouldBlock:
            await channel.send(item)


class WritePipeline:
    """The receiver and responder of one WRITE_BLOCK after a successful setup."""

    def __init__(self, server: DataTransferServer, conn: _Conn,
                 downstream: FramedStream | None, replica: Replica, below: int = 0,
                 transfer: bool = False, wire=None):
        self.server = server
        #: how packets and acks look on this pipeline's connections (leasefs's own, or
        #: HDFS's: ``storage.hdfs.xfer``)
        self.wire = wire or NativeWire()
        #: TRANSFER_RBW copy: LAST ends the copy, the replica stays RBW (not finalized)
        self.transfer = transfer
        self.store = server.store
        self.config = server.config
        self.upstream = conn.framed
        self.peer = conn.peer
        self.downstream = downstream
        self.downstream_failed = False
        # the timeout ladder (fs.datatransfer.ack_timeout): we wait for our downstream's
        # acks and writes one step less than our upstream waits for ours, and for the
        # upstream's packets as long as it waits for our acks (it sends nothing while an
        # ack is outstanding), so when a node below goes silent we answer first, naming it
        step = self.config.data_ack_timeout_step
        self.downstream_timeout = ack_timeout(self.config.data_timeout, step, below)
        self.upstream_timeout = ack_timeout(self.config.data_timeout, step, below + 1)
        self.replica = replica
        self.scope: trio.CancelScope | None = None
        self._held = 0      # bytes of the server's budget this pipeline's packets hold

    async def run(self) -> None:
        # receiver -> (window of packets) -> disk writer -> (window of entries) -> responder
        disk_send, disk_receive = trio.open_memory_channel(
            max(1, self.config.write_window_packets))
        ack_send, ack_receive = trio.open_memory_channel(max(1, self.config.write_window_packets))
        stopped = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                self.scope = nursery.cancel_scope
                # block recovery stops this pipeline through these (init_replica_recovery)
                self.replica.writer_scope, self.replica.writer_stopped = self.scope, stopped
                nursery.start_soon(self._receiver, disk_send)
                nursery.start_soon(self._disk_writer, disk_receive, ack_send)
                nursery.start_soon(self._responder, ack_receive)
        finally:
            self.replica.writer_scope = self.replica.writer_stopped = None
            stopped.set()
            self._unreserve(self._held)    # packets dropped unwritten

    def _unreserve(self, n: int) -> None:
        if n:
            self._held -= n
            self.server.budget.release(n)

    def _stop(self) -> None:
        self.scope.cancel()

    # -- receiver
    async def reserve(self, data_len: int, deadline: float | None = None) -> None:
        """Hold ``data_len`` bytes of the server's budget for a packet about to be read
        (released once the disk writer is done with it): many peers sending large packets
        slowly, or stalling half way, cannot make the server buffer without bound. A wait
        for them ends at ``deadline`` (trio time) with ``trio.TooSlowError``."""
        budget = self.server.budget
        if deadline is None or budget.fits(data_len):
            await budget.acquire(data_len)
        else:
            with trio.fail_at(deadline):
                await budget.acquire(data_len)
        self._held += data_len

    async def _receiver(self, disk: trio.MemorySendChannel) -> None:
        """Receive, verify, forward; hand the packets to the disk writer. Packets whose
        bytes are already here (the upstream is ahead) are taken together, forwarded in one
        send and handed over at once, so the disk writer writes them in one trip; a packet
        with nothing behind it goes on at once. The disk writer lags by at most a window of
        packets (held in the server's budget), so network and disk work overlap."""
        replica = self.replica
        bpc = replica.bytes_per_checksum
        received = replica.num_bytes     # bytes accepted so far, ahead of the disk writer
        where = f"in {replica.name} from {self.peer}"
        group: list[tuple[Packet, _Queued]] = []
        size = 0

        async def pass_on() -> None:
            nonlocal size
            await self._forward([packet for packet, _ in group])
            await _send_all(disk, group)
            group.clear()
            size = 0

        async def fail(entry: _Queued) -> None:
            await pass_on()   # the good packets before it are still written and acked
            await disk.send((None, entry))

        async with disk:
            while True:
                try:   # the whole packet within the timeout (the wire sees to it)
                    packet = await self.wire.receive_packet(
                        self, trio.current_time() + self.upstream_timeout)
                except (EOFError, ServerUnavailable, trio.TooSlowError) as exc:
                    log.info("WRITE_BLOCK %s: writer %s went away: %s", replica.name, self.peer,
                             failure_cause(exc, self.upstream_timeout))
                    self._stop()
                    return
                except ProtocolError as bad:   # acked ERROR (the seqno, if it was read)
                    log.warning("WRITE_BLOCK %s from %s: %s", replica.name, self.peer, bad)
                    seqno = bad.seqno if isinstance(bad, BadPacket) else UNREAD_SEQNO
                    await fail(_Queued(seqno, own_status=ERROR))
                    return
                entry = _Queued(packet.seqno, last=packet.last)
                try:
                    if replica.removed:
                        raise ReplicaNotFound(f"{replica.name} was deleted while being written")
                    if len(packet.data):
                        check_packet_range(received, packet.offset, len(packet.data), bpc)
                        if _TEST_CORRUPTION.due():
                            packet.data = _flip_first_byte(packet.data)
                        verify_checksums(packet.data, packet.sums, bpc, where=where,
                                         base_offset=packet.offset)
                        received = packet.offset + len(packet.data)
                except ChecksumError as exc:
                    self.server.stats.checksum_errors += 1
                    log.warning("WRITE_BLOCK %s: %s", replica.name, exc)
                    entry.own_status = ERROR_CHECKSUM
                    await fail(entry)
                    return
                except LeaseFSError as exc:
                    log.warning("WRITE_BLOCK %s from %s: %s", replica.name, self.peer, exc)
                    entry.own_status = ERROR
                    await fail(entry)
                    return
                group.append((packet, entry))
                size += len(packet.data)
                if (packet.last or packet.sync or size >= _DISK_BATCH
                        or len(group) >= self.config.write_window_packets
                        or not self.upstream.buffered()):
                    await pass_on()
                if packet.last:
                    return

    async def _disk_writer(self, disk: trio.MemoryReceiveChannel,
                           acks: trio.MemorySendChannel) -> None:
        """Write the packets' data and checksums (fsync for SYNC; LAST finalizes), then queue
        them for the responder; the responder's queue bounds how far writing runs ahead of
        acks. The packets that queued up meanwhile are written in one worker-thread trip
        (a thread hop per 64 KiB packet would cost more than the write)."""
        async with disk, acks:
            pending = None
            while True:
                if pending is None:
                    try:
                        pending = await disk.receive()
                    except trio.EndOfChannel:
                        return
                batch, pending = self._take_batch(disk, pending)
                error = await self._write_batch(batch)
                if error is not None and batch:   # nothing of it is acknowledged SUCCESS
                    batch[0][1].own_status = error
                    await acks.send(batch[0][1])
                    return
                # queued without a checkpoint in between, so the responder finds them all
                # and acks them in one send
                await _send_all(acks, [entry for _, entry in batch])
                if pending is not None and pending[0] is None:   # the receiver's failure
                    await acks.send(pending[1])
                    return

    def _take_batch(self, disk: trio.MemoryReceiveChannel, first):
        """``(batch, pending)``: ``first`` and the packets already queued behind it, up to a
        SYNC packet, the last packet or ``_DISK_BATCH`` bytes; ``pending`` is the queued item
        that did not join (a receiver failure, ``(None, entry)``, never does)."""
        if first[0] is None:
            return [], first
        batch, size = [first], len(first[0].data)
        while not (batch[-1][0].sync or batch[-1][0].last) and size < _DISK_BATCH:
            try:
                item = disk.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return batch, None
            if item[0] is None:
                return batch, item
            batch.append(item)
            size += len(item[0].data)
        return batch, None

    async def _write_batch(self, batch) -> int | None:
        """Write ``batch``'s data (then fsync if its last packet asks for it); None, or the
        status every packet of it is acked with when the disk failed."""
        if not batch:
            return None
        replica = self.replica
        written = [(p.offset, p.data, p.sums) for p, _ in batch if len(p.data)]
        size = sum(len(data) for _, data, _ in written)
        try:
            try:
                if written:
                    await self.store.write_packets(replica, written)
                    self.server.stats.bytes_written += size
            finally:
                self._unreserve(size)
            if batch[-1][0].sync:   # hsync; finalize syncs per sync_on_close
                await self.store.sync(replica)
        except (OSError, LeaseFSError) as exc:
            _log_local_failure(replica, "local write", exc)
            return ERROR
        for packet, entry in batch:
            if len(packet.data):
                entry.has_data = True
                entry.end = packet.offset + len(packet.data)
                entry.last_sum = packet.sums[-CHECKSUM_SIZE:]
        return None

    async def _forward(self, packets: list[Packet]) -> None:
        """Send the packets on; a downstream that broke or read nothing for
        ``downstream_timeout`` is failed (the responder then acks ERROR at its index)."""
        if self.downstream is None or self.downstream_failed or not packets:
            return
        try:
            with trio.fail_after(self.downstream_timeout):
                await self.wire.send_packets(self.downstream, packets)
        except (ServerUnavailable, trio.TooSlowError) as exc:
            log.warning("WRITE_BLOCK %s: forwarding packets %d-%d to the downstream failed: "
                        "%s", self.replica.name, packets[0].seqno, packets[-1].seqno,
                        failure_cause(exc, self.downstream_timeout))
            self.downstream_failed = True

    # -- responder
    async def _downstream_statuses(self, seqno: int) -> list[int]:
        if self.downstream is None:
            return []
        if not self.downstream_failed:
            try:
                got = self.wire.take_ack(self.downstream)
                if got is None:
                    with trio.fail_after(self.downstream_timeout):
                        got = await self.wire.receive_ack(self.downstream)
                ack_seqno, statuses = got
                if ack_seqno != seqno:
                    raise ProtocolError(f"downstream acked seqno {ack_seqno}, expected {seqno}")
                if not statuses:
                    raise ProtocolError("downstream ack carries no status")
                return statuses
            except (EOFError, LeaseFSError, trio.TooSlowError) as exc:
                log.warning("WRITE_BLOCK %s: downstream ack for packet %d failed: %s",
                            self.replica.name, seqno,
                            failure_cause(exc, self.downstream_timeout))
                self.downstream_failed = True
        return [ERROR]

    async def _responder(self, queue: trio.MemoryReceiveChannel) -> None:
        """Ack each packet once it is written here and acked downstream. Acks that are ready
        together go upstream in one send: the responder sends what it holds before it
        would wait (for the next written packet, a downstream ack not yet received, or the
        finalize), so batching never delays an ack."""
        replica = self.replica
        held: list[bytes] = []

        async def send_held() -> bool:
            if held:
                try:
                    await self.upstream.send_all(b"".join(held))
                except ServerUnavailable as exc:
                    log.info("WRITE_BLOCK %s: cannot ack to %s: %s", replica.name, self.peer,
                             exc)
                    return False
                held.clear()
            return True

        async with queue:
            while True:
                try:
                    entry = queue.receive_nowait()
                except trio.WouldBlock:
                    if not await send_held():
                        break
                    try:
                        entry = await queue.receive()
                    except trio.EndOfChannel:
                        break
                except trio.EndOfChannel:
                    break
                if entry.own_status != SUCCESS:
                    statuses = [entry.own_status]
                else:
                    if (self.downstream is not None and not self.downstream.buffered()
                            and not await send_held()):
                        break
                    statuses = [SUCCESS] + await self._downstream_statuses(entry.seqno)
                ok = all(s == SUCCESS for s in statuses)
                if ok and entry.has_data:
                    replica.set_visible(entry.end, entry.last_sum)
                if ok and entry.last and not self.transfer:
                    if not await send_held():
                        break
                    try:
                        await self.store.finalize(replica)
                    except (OSError, LeaseFSError) as exc:
                        _log_local_failure(replica, "finalize", exc)
                        statuses[0] = ERROR
                        ok = False
                    else:
                        self._report_finalized(replica)
                        if self.wire.report_wait:
                            await self.server.reporter.reports_sent(self.wire.report_wait)
                held.append(self.wire.encode_ack(entry.seqno, statuses))
                if not ok or entry.last:
                    await send_held()
                    break
        self._stop()

    def _report_finalized(self, replica: Replica) -> None:
        log.debug("finalized %s (%d bytes)", replica.name, replica.num_bytes)
        self.server.reporter.block_received(
            replica.block_id, replica.gs, replica.num_bytes, ReplicaState.FINALIZED.value)


class NativeWire:
    """leasefs's own packets and acks (``fs.datatransfer``) for a ``WritePipeline``."""

    #: seconds the last packet's ack may wait for the finalized replica's report to reach
    #: the metadata server (0: not at all; leasefs's ``complete`` waits for it instead)
    report_wait = 0.0

    async def receive_packet(self, pipeline: WritePipeline, deadline: float) -> Packet:
        """One packet with the limits checked before anything big is read, by ``deadline``
        (trio time; ``trio.TooSlowError``)."""
        with trio.fail_at(deadline):
            return await self._receive_packet(pipeline)

    async def _receive_packet(self, pipeline: WritePipeline) -> Packet:
        framed = pipeline.upstream
        raw = await framed.receive_exactly(PACKET_HEADER.size)
        seqno, offset, data_len, flags = PACKET_HEADER.unpack(raw)
        problem = None
        if data_len > MAX_PACKET_DATA:
            problem = f"claims {data_len} bytes, more than {MAX_PACKET_DATA}"
        elif offset < 0:
            problem = f"has a negative offset {offset}"
        elif flags & ~_KNOWN_FLAGS:
            problem = f"has unknown flags {flags:#x}"
        elif flags & FLAG_HEARTBEAT and data_len:
            problem = "is a heartbeat carrying data"
        if problem:
            raise BadPacket(seqno, f"{pipeline.replica.name}: packet {seqno} {problem}")
        if data_len:   # the payload is read once the server's budget has room for it
            await pipeline.reserve(data_len)
        sums = await framed.receive_exactly(
            CHECKSUM_SIZE * num_chunks(data_len, pipeline.replica.bytes_per_checksum))
        data = await framed.receive_exactly(data_len)
        return Packet(seqno, offset, data, sums, flags)

    async def send_packets(self, framed: FramedStream, packets: list[Packet]) -> None:
        for packet in packets:   # leasefs's packets are large: each one's data as is
            await send_packet(framed, packet.seqno, packet.offset, packet.data, packet.sums,
                              packet.flags)

    def encode_ack(self, seqno: int, statuses) -> bytes:
        return encode_ack(seqno, statuses)

    async def receive_ack(self, framed: FramedStream) -> tuple[int, list[int]]:
        return await receive_ack(framed)

    def take_ack(self, framed: FramedStream) -> tuple[int, list[int]] | None:
        return take_ack(framed)


class BadPacket(ProtocolError):
    """A packet that breaks the protocol, with its seqno when it could be read."""

    def __init__(self, seqno: int, message: str):
        super().__init__(message)
        self.seqno = seqno


@dataclass
class _Upstream:
    """The connection a ``WritePipeline`` receives packets from and acks to."""
    framed: FramedStream
    peer: str
