"""One block's chained write pipeline, from the client's side, and the TRANSFER_RBW request
that copies a block under construction to a replacement node.

Why a module of its own: this is where the output stream's packets meet the wire — the
WRITE_BLOCK setup (``Pipeline.connect``: stage PIPELINE_SETUP_CREATE, or with ``min_bytes``
PIPELINE_SETUP_APPEND / PIPELINE_SETUP_STREAMING_RECOVERY; ``SetupFailed`` names the first bad
node), a bounded window of unacknowledged packets (``send`` waits while it is full) and the
responder that matches acks to the queue of unacked packets. The packets are kept whole, so
a pipeline recovery (``fs/writer.py``) can resend them; a pipeline that fails through one of
its nodes records which (``bad_index``) and stops, and deciding what happens next is the
writer's job, not this module's. ``write_oneshot`` sends a block held whole as one
WRITE_BLOCK_ONESHOT message instead (no pipeline, no responder task).

Concurrency contract: everything runs on the client's trio thread. Sending happens in the
writer's task (the output stream's lock serialises it; ``send`` also holds the pipeline's
own send lock while a packet goes out, since the responder sends heartbeats on an idle
pipeline). The responder (``run_responder``) runs as a task in the client's nursery and
never raises: the first failure is stored in ``error`` and re-raised by the writer's next
``send``/``wait_all_acked``; ``fail``/``close`` cancel it, which closes the connection.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from .dataconn import (close_quietly, failure_cause, node_name, open_data_connection,
                       response_error)
from .datatransfer import (ERROR_CHECKSUM, FLAG_HEARTBEAT, FLAG_LAST, PIPELINE_SETUP_APPEND,
                           PIPELINE_SETUP_CREATE, Packet, SUCCESS, TRANSFER_BLOCK,
                           TRANSFER_FINALIZED, TRANSFER_RBW, WRITE_BLOCK, WRITE_BLOCK_ONESHOT,
                           ack_timeout, encode_packet_header, op_header, receive_ack,
                           send_packet)
from .errors import InvalidToken, LeaseFSError, PipelineError, ProtocolError, ServerUnavailable
from .framing import FramedStream, encode_frame

log = logging.getLogger(__name__)

_ACK_NAMES = {SUCCESS: "SUCCESS", 1: "ERROR", ERROR_CHECKSUM: "ERROR_CHECKSUM"}


class SetupFailed(Exception):
    """Pipeline setup failed at ``node`` (the first bad link). ``token_refused``: for the
    block access token (expired, or made with a key the node does not have yet): the node
    is not to blame, the writer asks the metadata server again."""

    def __init__(self, node: dict, reason: str, token_refused: bool = False):
        super().__init__(reason)
        self.node = node
        self.reason = reason
        self.token_refused = token_refused


def _refused_token(resp) -> bool:
    error = resp.get("error") if isinstance(resp, dict) else None
    return isinstance(error, dict) and error.get("type") == InvalidToken.__name__


def _with_token(header: dict, token: dict | None) -> dict:
    """The op header with the block access token (none in security = simple)."""
    if token is not None:
        header["token"] = token
    return header


class Pipeline:
    """One block's write pipeline: the connection to its first node, the unacked packet
    queue, and the responder that consumes acks. Sending happens in the caller's task."""

    def __init__(self, *, path: str, located: dict, framed: FramedStream, window: int,
                 timeout: float, start: int = 0, on_ack=None, ack_step: float = 0.0):
        self.path = path
        # called at every acknowledged packet but heartbeats: the writer's measure of
        # progress (``fs.writer``: its stall bound)
        self.on_ack = on_ack
        self.block = dict(located["block"])
        self.nodes = list(located["locations"])
        self.framed = framed
        self.window = window
        self.timeout = timeout
        # sends and acks wait one ladder step per node longer than the first node waits
        # on its downstream (``ack_timeout``): a silent node further down is named by the
        # node above it in an ERROR ack before this side gives up on the first node
        self.ack_timeout = ack_timeout(timeout, ack_step, len(self.nodes))
        self.error: LeaseFSError | None = None
        #: index in ``nodes`` of the node blamed for ``error`` (None: not a node's fault,
        #: e.g. the stream was aborted, so no pipeline recovery)
        self.bad_index: int | None = None
        self.queued = 0               # packets ever queued (tells a caller if its packet was)
        self.done = trio.Event()      # the responder ended (and closed the connection)
        self.acked_bytes = start      # block offset up to which every node acknowledged
        self.sent_end = start         # block offset just past the last data sent
        self._seqno = 0
        self._unacked: deque[Packet] = deque()
        self._send_lock = trio.Lock()
        self._progress = trio.Event()  # set (and replaced) on every ack and on failure
        self._wake = trio.Event()      # wakes an idle responder when a packet goes out
        self._finished = False
        self._scope = trio.CancelScope()

    @property
    def where(self) -> str:
        return f"{self.path}: block {self.block['id']}"

    @classmethod
    async def connect(cls, *, path: str, located: dict, client_name: str,
                      bytes_per_checksum: int, window: int, timeout: float,
                      connect_timeout: float, max_frame: int, min_bytes: int | None = None,
                      stage: str = PIPELINE_SETUP_APPEND, tls=None,
                      on_ack=None, ack_step: float = 0.0) -> "Pipeline":
        """WRITE_BLOCK to the first location; ``SetupFailed`` names the first bad node.
        With ``min_bytes`` the stage is PIPELINE_SETUP_APPEND (the nodes reopen their
        replicas of exactly that length under the block's new generation stamp) or
        PIPELINE_SETUP_STREAMING_RECOVERY (they cut their RBW replicas to that acknowledged
        length and take the new stamp). ``located["token"]``: the write token for the
        block's stamp (security = secure), which every node checks. ``connect_timeout``
        bounds the connection to the first node; its setup answer, packets and acks have
        ``timeout`` plus ``ack_step`` per node (``ack_timeout``)."""
        nodes = located["locations"]
        first = nodes[0]
        try:
            framed = await open_data_connection(first["address"], connect_timeout, max_frame, tls)
        except ServerUnavailable as exc:
            raise SetupFailed(first, str(exc)) from None
        header = _with_token(op_header(WRITE_BLOCK, block=located["block"],
                                       targets=[n["address"] for n in nodes[1:]],
                                       stage=PIPELINE_SETUP_CREATE, client=client_name,
                                       bytes_per_checksum=bytes_per_checksum),
                             located.get("token"))
        if min_bytes is not None:
            header["stage"] = stage
            header["min_bytes"] = min_bytes
        wait = ack_timeout(timeout, ack_step, len(nodes))
        try:
            with trio.fail_after(wait):
                await framed.send_frame(header)
                resp = await framed.receive_frame()
        except (LeaseFSError, EOFError, trio.TooSlowError) as exc:
            await close_quietly(framed)
            raise SetupFailed(first, f"no setup response from {first['address']}: "
                              f"{failure_cause(exc, wait)}") from None
        if not isinstance(resp, dict) or resp.get("status") != "SUCCESS":
            await close_quietly(framed)
            bad_address = resp.get("first_bad_link") if isinstance(resp, dict) else ""
            bad = next((n for n in nodes if bad_address and n["address"] == bad_address), first)
            raise SetupFailed(bad, str(response_error(resp, f"pipeline setup at {first['address']}")),
                              token_refused=_refused_token(resp))
        return cls(path=path, located=located, framed=framed, window=window, timeout=timeout,
                   start=min_bytes or 0, on_ack=on_ack, ack_step=ack_step)

    # ------------------------------------------------------------------ sending
    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _notify(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def send(self, offset: int, data, sums: bytes, flags: int = 0) -> None:
        """Send one packet once the window has room; raises the pipeline's failure."""
        while len(self._unacked) >= self.window and self.error is None:
            await self._progress.wait()
        self._raise_if_failed()
        packet = Packet(self._seqno, offset, data, sums, flags)
        self._seqno += 1
        self._unacked.append(packet)
        self.queued += 1
        self._wake.set()
        try:
            async with self._send_lock:
                with trio.fail_after(self.ack_timeout):
                    await send_packet(self.framed, packet.seqno, offset, data, sums, flags)
        except (LeaseFSError, trio.TooSlowError) as exc:
            self.fail(self.error or PipelineError(
                f"{self.where}: cannot send to {node_name(self.nodes[0])}: "
                f"{failure_cause(exc, self.ack_timeout)}"),
                bad_index=0)
            raise self.error from None
        if data:
            self.sent_end = offset + len(data)

    async def wait_all_acked(self) -> None:
        while self._unacked and self.error is None:
            await self._progress.wait()
        self._raise_if_failed()

    # ------------------------------------------------------------------ acks
    async def run_responder(self) -> None:
        """Consume acks in order; on any failure record it and close the connection."""
        heartbeat_after = max(self.timeout / 2, 0.05)
        try:
            with self._scope:
                while True:
                    if not self._unacked:
                        if self._finished:
                            return
                        self._wake = trio.Event()
                        with trio.move_on_after(heartbeat_after) as idle:
                            await self._wake.wait()
                        if idle.cancelled_caught and not self._unacked and not self._finished:
                            # keep an idle pipeline alive (HDFS heartbeat packets)
                            await self.send(self.sent_end, b"", b"", FLAG_HEARTBEAT)
                        continue
                    try:
                        with trio.fail_after(self.ack_timeout):
                            seqno, statuses = await receive_ack(self.framed)
                    except trio.TooSlowError:
                        raise PipelineError(
                            f"{self.where}: no ack from {node_name(self.nodes[0])} for "
                            f"{self.ack_timeout:g} s") from None
                    except EOFError:
                        raise PipelineError(
                            f"{self.where}: {node_name(self.nodes[0])} closed the pipeline "
                            f"with {len(self._unacked)} packet(s) unacknowledged") from None
                    self._handle_ack(seqno, statuses)
        except _BadNode as exc:
            self.fail(exc.error, bad_index=exc.index)
        except PipelineError as exc:   # the first node's connection broke or timed out
            self.fail(exc, bad_index=0)
        except LeaseFSError as exc:
            self.fail(PipelineError(f"{self.where}: pipeline to {node_name(self.nodes[0])} "
                                    f"broke: {exc}"), bad_index=0)
        except Exception as exc:  # never let a data-path surprise kill the client's nursery
            log.exception("%s: responder failed", self.where)
            self.fail(PipelineError(f"{self.where}: responder failed: {type(exc).__name__}: {exc}"))
        finally:
            if self.error is None and not self._finished:
                self.error = PipelineError(f"{self.where}: pipeline closed")
            self._notify()
            await close_quietly(self.framed)
            self.done.set()

    def _handle_ack(self, seqno: int, statuses: list[int]) -> None:
        if not self._unacked:
            raise ProtocolError(f"{self.where}: ack for packet {seqno} with none outstanding")
        packet = self._unacked[0]
        if seqno != packet.seqno:
            raise ProtocolError(f"{self.where}: ack for packet {seqno}, expected {packet.seqno}")
        for index, status in enumerate(statuses):
            if status != SUCCESS:
                node = self.nodes[index] if index < len(self.nodes) else {"address": f"node #{index}"}
                raise _BadNode(min(index, len(self.nodes) - 1), PipelineError(
                    f"{self.where}: block server {node_name(node)} answered "
                    f"{_ACK_NAMES.get(status, status)} for packet {seqno} (block offset "
                    f"{packet.offset})"))
        if len(statuses) < len(self.nodes):
            node = self.nodes[len(statuses)]
            raise _BadNode(len(statuses), PipelineError(
                f"{self.where}: ack for packet {seqno} carries no status for {node_name(node)}"))
        self._unacked.popleft()
        if packet.data:
            self.acked_bytes = max(self.acked_bytes, packet.offset + len(packet.data))
        if packet.flags & FLAG_LAST:
            self._finished = True
        if self.on_ack is not None and not packet.flags & FLAG_HEARTBEAT:
            self.on_ack()
        self._notify()

    def fail(self, exc: LeaseFSError, bad_index: int | None = None) -> None:
        """Record the first failure (and the node it blames, if any), wake every waiter,
        stop the responder (closes the socket)."""
        if self.error is None:
            self.error = exc
            self.bad_index = bad_index
            log.warning("%s", exc)
        self._notify()
        self._scope.cancel()

    def close(self) -> None:
        """Stop using the pipeline (after the LAST ack, or to abandon it)."""
        self._finished = True
        self._scope.cancel()

    @property
    def recoverable(self) -> bool:
        """Failed through one of its nodes: pipeline recovery may go on without it."""
        return self.error is not None and self.bad_index is not None

    def pending_packets(self) -> list[Packet]:
        """The unacknowledged packets a recovered pipeline must resend (not heartbeats)."""
        return [p for p in self._unacked if not p.flags & FLAG_HEARTBEAT]


async def write_oneshot(*, path: str, located: dict, client_name: str,
                        bytes_per_checksum: int, data, sums: bytes, timeout: float,
                        connect_timeout: float, max_frame: int, tls=None) -> None:
    """Write a whole block held in hand with WRITE_BLOCK_ONESHOT (docs/PROTOCOL.md §3) to
    every location at once, each without downstream targets: a block of one packet gains
    nothing from a chain (the client's bandwidth is no concern for it), while each hop of a
    chain adds a process wake-up and a connection to the close's latency (measured: the
    fan-out's p50 15-30% below the chain's). Returns once every node acknowledged (its
    replica is finalized). Any failure is a ``SetupFailed`` naming the first node (in
    location order) that failed: the writer abandons the block and retries with a new one,
    excluding that node; the other nodes' replicas go with the abandoned block."""
    nodes = located["locations"]
    message = encode_packet_header(0, 0, len(data), FLAG_LAST) + sums + bytes(data)
    failures: dict[int, SetupFailed] = {}

    async def one(index: int, node: dict) -> None:
        try:
            await _oneshot_to(node, path, located["block"], located.get("token"), client_name,
                              bytes_per_checksum, message, timeout, connect_timeout,
                              max_frame, tls)
        except SetupFailed as exc:
            failures[index] = exc

    async with trio.open_nursery() as nursery:
        for index, node in enumerate(nodes):
            nursery.start_soon(one, index, node)
    if failures:
        raise failures[min(failures)]


async def _oneshot_to(node: dict, path: str, block: dict, token: dict | None,
                      client_name: str, bytes_per_checksum: int, message: bytes,
                      timeout: float, connect_timeout: float, max_frame: int,
                      tls=None) -> None:
    """One node's one-shot write (no downstream); ``SetupFailed`` naming it if it fails."""
    where = f"{path}: block {block['id']}"
    try:
        framed = await open_data_connection(node["address"], connect_timeout, max_frame, tls)
    except ServerUnavailable as exc:
        raise SetupFailed(node, str(exc)) from None
    header = _with_token(op_header(WRITE_BLOCK_ONESHOT, block=block, targets=[],
                                   client=client_name, bytes_per_checksum=bytes_per_checksum),
                         token)
    try:
        with trio.fail_after(timeout):
            await framed.send_all(encode_frame(header) + message)
            resp = await framed.receive_frame()
            if isinstance(resp, dict) and resp.get("status") == "SUCCESS":
                seqno, statuses = await receive_ack(framed)
    except (LeaseFSError, EOFError, trio.TooSlowError) as exc:
        raise SetupFailed(node, f"{where}: no answer to the one-shot write from "
                          f"{node_name(node)}: {failure_cause(exc, timeout)}") from None
    finally:
        await close_quietly(framed)
    if not isinstance(resp, dict) or resp.get("status") != "SUCCESS":
        raise SetupFailed(node, str(response_error(resp, f"{where}: one-shot write at "
                                                         f"{node['address']}")),
                          token_refused=_refused_token(resp))
    if seqno != 0:
        raise SetupFailed(node, f"{where}: {node_name(node)} acked packet {seqno}, not 0")
    status = statuses[0] if statuses else None
    if status != SUCCESS:
        what = ("gave no status" if status is None
                else f"answered {_ACK_NAMES.get(status, status)}")
        raise SetupFailed(node, f"{where}: block server {node_name(node)} {what} for the "
                          f"one-shot write")


class _BadNode(Exception):
    """An ack blamed the pipeline node at ``index`` (internal to the responder)."""

    def __init__(self, index: int, error: PipelineError):
        super().__init__(str(error))
        self.index = index
        self.error = error


async def transfer_finalized(source: dict, target: dict, block: dict, **kwargs) -> None:
    """Ask ``source`` to copy its finalized replica of ``block`` (exactly its stamp and
    ``num_bytes``) to ``target`` (TRANSFER_BLOCK stage TRANSFER_FINALIZED: a patch writer
    replacing a replica that missed the patch); returns once it is done."""
    await transfer_rbw(source, target, block, stage=TRANSFER_FINALIZED, **kwargs)


async def transfer_rbw(source: dict, target: dict, block: dict, *, client_name: str,
                       timeout: float, connect_timeout: float, max_frame: int, tls=None,
                       token: dict | None = None, stage: str = TRANSFER_RBW) -> None:
    """Ask ``source`` to copy ``block`` up to ``block['num_bytes']`` to ``target``
    (TRANSFER_BLOCK stage TRANSFER_RBW, docs/PROTOCOL.md §3) with the copy ``token`` of
    ``get_additional_datanode`` (security = secure: the source checks it and shows it to
    the target); returns once it is done."""
    framed = await open_data_connection(source["address"], connect_timeout, max_frame, tls)
    try:
        with trio.fail_after(timeout):
            await framed.send_frame(_with_token(op_header(
                TRANSFER_BLOCK, block=block, targets=[target["address"]], stage=stage,
                client=client_name), token))
            resp = await framed.receive_frame()
    except trio.TooSlowError:
        raise PipelineError(f"no TRANSFER_BLOCK answer from {source['address']} in "
                            f"{timeout:g} s") from None
    finally:
        await close_quietly(framed)
    if not isinstance(resp, dict) or resp.get("status") != "SUCCESS":
        raise response_error(resp, f"TRANSFER_BLOCK at {source['address']}")
