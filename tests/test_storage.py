"""Block server tests: real block servers (real files, real sockets on 127.0.0.1) in one trio
run, with a small recording ``Dispatcher`` standing in for the metadata server.

Covers the WRITE_BLOCK pipeline through three servers (files byte for byte, acks with every
node's status, checksum errors, a broken downstream, the hflush partial-chunk rewrite),
READ_BLOCK / BLOCK_LENGTH, generation stamps, restart rescans, INVALIDATE, registration
retries and hostile input; peers that stop reading (in-memory lockstep streams against the
real server code and real files, with a short ``data_timeout``), and the ordering of full
and incremental block reports.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
from pathlib import Path

import pytest
import trio
import trio.testing

from harness import free_port

import fs.dataconn
from fs.config import Config
from fs.datatransfer import (ERROR, ERROR_CHECKSUM, FLAG_HEARTBEAT, FLAG_LAST,
                             FLAG_SYNC, PIPELINE_SETUP_CREATE, SUCCESS, block_dict,
                             chunk_checksums, encode_packet_header, receive_ack, receive_packet,
                             send_packet, verify_checksums)
from fs.errors import LeaseFSError
from fs.framing import FramedStream, encode_frame
from fs.rpc import Dispatcher, format_address, parse_address, serve_rpc, serve_tcp
from storage.replica_states import ReplicaState
from storage.replicas import ReplicaStore, encode_meta_header, finalized_subdir
from storage.server import BlockServer
from storage.transfer import DataTransferServer

pytestmark = pytest.mark.timeout(60)

BPC = 512


def make_config(**overrides) -> Config:
    # the metadata server here is a test double that does not check the cluster key
    settings = {"security": "simple", "heartbeat_interval": 0.05, "data_timeout": 5.0, "rpc_timeout": 5.0,
                "block_report_interval": 3600.0, "bytes_per_checksum": BPC,
                "packet_size": 4096, "write_window_packets": 4, "disk_io_threads": 4}
    return Config.load(env={}, **{**settings, **overrides})


# --------------------------------------------------------------------------- test doubles


class FakeMeta(Dispatcher):
    """Records every block-server RPC; hands out queued commands and reregister requests."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, dict]] = []
        self.commands: dict[str, list] = {}
        self.reregister: set[str] = set()

    def of(self, method: str, node_id: str | None = None) -> list[dict]:
        return [args for m, args in self.calls
                if m == method and (node_id is None or args["node_id"] == node_id)]

    def received(self, node_id: str) -> list[list]:
        return [entry for args in self.of("block_received_and_deleted", node_id)
                for entry in args["received"]]

    def deleted(self, node_id: str) -> list[int]:
        return [b for args in self.of("block_received_and_deleted", node_id)
                for b in args["deleted"]]

    async def rpc_register_storage(self, ctx, node_id, address, capacity, used, remaining,
                                   http_port=0, wall_time=None, hdfs_port=None):
        self.calls.append(("register_storage", dict(node_id=node_id, address=address,
                                                    capacity=capacity, used=used,
                                                    remaining=remaining,
                                                    hdfs_port=hdfs_port)))
        return {"namespace_id": 42}

    async def rpc_heartbeat(self, ctx, node_id, capacity, used, remaining, xceivers=0,
                            wall_time=None):
        self.calls.append(("heartbeat", dict(node_id=node_id, capacity=capacity, used=used,
                                             remaining=remaining, xceivers=xceivers)))
        commands = self.commands.pop(node_id, [])
        reregister = node_id in self.reregister
        self.reregister.discard(node_id)
        return {"reregister": reregister, "commands": commands}

    async def rpc_block_report(self, ctx, node_id, blocks, report_id=None, chunk=0, last=True):
        self.calls.append(("block_report", dict(node_id=node_id, blocks=blocks,
                                                report_id=report_id, chunk=chunk, last=last)))
        return True

    async def rpc_block_received_and_deleted(self, ctx, node_id, received, deleted):
        self.calls.append(("block_received_and_deleted",
                           dict(node_id=node_id, received=received, deleted=deleted)))
        return True

    async def rpc_report_bad_blocks(self, ctx, blocks):
        self.calls.append(("report_bad_blocks", dict(node_id=None, blocks=blocks)))
        return True


class EarlierFakeMeta(FakeMeta):
    """A metadata server of the release before register_storage took ``hdfs_port``."""

    async def rpc_register_storage(self, ctx, node_id, address, capacity, used, remaining,
                                   http_port=0, wall_time=None):
        return await super().rpc_register_storage(ctx, node_id, address, capacity, used,
                                                  remaining, http_port, wall_time)


async def start_fake_meta(nursery, port: int = 0, meta: FakeMeta | None = None):
    meta = meta or FakeMeta()
    bound = await nursery.start(
        serve_tcp, lambda stream, peer: serve_rpc(stream, meta, peer=peer), "127.0.0.1", port)
    return meta, format_address(bound)


class Node:
    """A real block server task that the test can stop and restart on the same folder."""

    def __init__(self, nursery, config: Config, data_dir: Path, meta_address: str):
        self.nursery, self.config, self.data_dir = nursery, config, data_dir
        self.meta_address = meta_address
        self.port = free_port()  # below the ephemeral range: restarts reuse it safely
        self.server: BlockServer | None = None
        self.scope: trio.CancelScope | None = None
        self.done: trio.Event | None = None

    async def start(self) -> "Node":
        self.server = BlockServer(self.config, str(self.data_dir),
                                  meta_address=self.meta_address)
        self.scope, self.done = trio.CancelScope(), trio.Event()

        async def runner(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with self.scope:
                    await self.server.run("127.0.0.1", self.port, task_status=task_status)
            finally:
                self.done.set()

        bound = await self.nursery.start(runner)
        self.port = bound[1]
        return self

    async def stop(self) -> None:
        self.scope.cancel()
        await self.done.wait()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def store(self):
        return self.server.store

    @property
    def node_id(self) -> str:
        return self.server.store.node_id


async def start_cluster(nursery, tmp_path: Path, n: int, **overrides):
    config = make_config(**overrides)
    meta, meta_address = await start_fake_meta(nursery)
    nodes = [await Node(nursery, config, tmp_path / f"dn{i}", meta_address).start()
             for i in range(n)]
    await wait_for(lambda: all(node.server.heartbeat.registered for node in nodes))
    return meta, nodes


async def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------- test client


async def connect(address: str) -> FramedStream:
    host, port = parse_address(address)
    return FramedStream(await trio.open_tcp_stream(host, port))


async def open_write(address: str, block_id: int, gs: int, targets=(), bpc: int = BPC):
    framed = await connect(address)
    await framed.send_frame({"op": "WRITE_BLOCK", "block": block_dict(block_id, gs),
                             "targets": list(targets), "stage": PIPELINE_SETUP_CREATE,
                             "client": "test-client", "bytes_per_checksum": bpc})
    return framed, await framed.receive_frame()


async def stream_packets(framed: FramedStream, packets) -> list[tuple[int, list[int]]]:
    """Send ``(seqno, offset, data, sums, flags)`` packets while collecting acks until the
    server closes or every packet is acked."""
    acks: list[tuple[int, list[int]]] = []
    packets = list(packets)

    async def sender():
        for seqno, offset, data, sums, flags in packets:
            try:
                await send_packet(framed, seqno, offset, data, sums, flags)
            except LeaseFSError:
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        try:
            while len(acks) < len(packets):
                acks.append(await receive_ack(framed))
        except (EOFError, LeaseFSError):
            pass
    return acks


def data_packets(data: bytes, packet_size: int = 4096, bpc: int = BPC, start_seqno: int = 0,
                 base: int = 0, last: bool = True, flags: int = 0):
    packets, seqno = [], start_seqno
    for pos in range(0, len(data), packet_size):
        chunk = data[pos:pos + packet_size]
        packets.append((seqno, base + pos, chunk, chunk_checksums(chunk, bpc), flags))
        seqno += 1
    if last:
        packets.append((seqno, base + len(data), b"", b"", FLAG_LAST))
    return packets


async def write_block(address, block_id, gs, data, targets=(), **kw):
    framed, response = await open_write(address, block_id, gs, targets)
    assert response["status"] == "SUCCESS", response
    try:
        return await stream_packets(framed, data_packets(data, **kw))
    finally:
        await framed.aclose()


async def read_block(address, block_id, gs, offset=0, length=-1):
    """``(response, data_from_offset, chunk_offset)`` with every checksum verified."""
    framed = await connect(address)
    try:
        await framed.send_frame({"op": "READ_BLOCK", "block": {"id": block_id, "gs": gs},
                                 "offset": offset, "length": length, "verify": True})
        response = await framed.receive_frame()
        if response["status"] != "SUCCESS":
            return response, None, None
        bpc = response["bytes_per_checksum"]
        pos, parts = response["chunk_offset"], []
        while True:
            packet = await receive_packet(framed, bpc)
            if packet.last:
                assert not packet.data
                break
            assert packet.offset == pos and packet.offset % bpc == 0
            verify_checksums(packet.data, packet.sums, bpc, base_offset=packet.offset)
            parts.append(packet.data)
            pos += len(packet.data)
        blob = b"".join(parts)
        skip = offset - response["chunk_offset"]
        want = response["visible_length"] - offset if length == -1 else length
        return response, blob[skip:skip + want], response["chunk_offset"]
    finally:
        await framed.aclose()


async def block_length(address, block_id, gs):
    framed = await connect(address)
    try:
        await framed.send_frame({"op": "BLOCK_LENGTH", "block": {"id": block_id, "gs": gs}})
        return await framed.receive_frame()
    finally:
        await framed.aclose()


def replica_paths(node: Node, block_id: int, gs: int, folder: str = "finalized"):
    base = node.data_dir / folder
    if folder == "finalized":
        base = base / finalized_subdir(block_id)
    return base / f"blk_{block_id}", base / f"blk_{block_id}_{gs}.meta"


def expected_meta(data: bytes, bpc: int = BPC) -> bytes:
    return encode_meta_header(bpc) + chunk_checksums(data, bpc)


async def proxy(nursery, target: str, *, flip_at: int | None = None,
                cut_after: int | None = None, swallow_replies: bool = False) -> str:
    """A TCP relay to ``target`` that may flip one byte of the upstream→downstream stream at
    position ``flip_at``, drop both connections once ``cut_after`` bytes went through, or
    swallow everything after the first frame coming back (the setup response), i.e. acks."""
    async def handle(client_stream, peer):
        host, port = parse_address(target)
        server_stream = await trio.open_tcp_stream(host, port)
        async with trio.open_nursery() as inner:
            async def down():
                seen = 0
                try:
                    while chunk := await client_stream.receive_some(65536):
                        chunk = bytearray(chunk)
                        if flip_at is not None and seen <= flip_at < seen + len(chunk):
                            chunk[flip_at - seen] ^= 0xFF
                        if cut_after is not None and seen + len(chunk) > cut_after:
                            inner.cancel_scope.cancel()
                            return
                        seen += len(chunk)
                        await server_stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                inner.cancel_scope.cancel()

            async def up():
                try:
                    if swallow_replies:
                        framed = FramedStream(server_stream)
                        await client_stream.send_all(encode_frame(await framed.receive_frame()))
                        await trio.sleep_forever()
                    while chunk := await server_stream.receive_some(65536):
                        await client_stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                inner.cancel_scope.cancel()

            inner.start_soon(down)
            inner.start_soon(up)
        await server_stream.aclose()
        await client_stream.aclose()

    bound = await nursery.start(serve_tcp, handle, "127.0.0.1", 0)
    return format_address(bound)


# --------------------------------------------------------------------------- pipeline


async def test_three_node_pipeline_writes_identical_replicas(tmp_path):
    data = random.Random(1).randbytes(100_000 + 123)   # not chunk aligned

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            acks = await write_block(nodes[0].address, 1001, 7, data,
                                     targets=[nodes[1].address, nodes[2].address])
            n_packets = len(data_packets(data))
            assert [seq for seq, _ in acks] == list(range(n_packets))
            assert all(statuses == [SUCCESS] * 3 for _, statuses in acks), acks
            for node in nodes:
                data_path, meta_path = replica_paths(node, 1001, 7)
                assert data_path.read_bytes() == data
                assert meta_path.read_bytes() == expected_meta(data)
                assert not list((node.data_dir / "rbw").iterdir())
                replica = node.store.get(1001)
                assert replica.state.value == "FINALIZED" and replica.num_bytes == len(data)
                # the incremental report follows the ack (complete waits for it)
                await wait_for(lambda: [1001, 7, len(data), "FINALIZED"]
                               in meta.received(node.node_id))
            response, got, _ = await read_block(nodes[2].address, 1001, 7)
            assert got == data and response["visible_length"] == len(data)
            nursery.cancel_scope.cancel()

    await main()


async def test_checksum_error_from_client_is_reported_by_first_node(tmp_path):
    data = random.Random(2).randbytes(5 * 4096)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            framed, response = await open_write(nodes[0].address, 2002, 1,
                                                [nodes[1].address, nodes[2].address])
            assert response["status"] == "SUCCESS"
            packets = data_packets(data)
            seqno, offset, chunk, sums, flags = packets[2]
            bad = bytearray(chunk)
            bad[100] ^= 1
            packets[2] = (seqno, offset, bytes(bad), sums, flags)
            acks = await stream_packets(framed, packets)
            await framed.aclose()
            assert acks[:2] == [(0, [SUCCESS] * 3), (1, [SUCCESS] * 3)]
            assert acks[2] == (2, [ERROR_CHECKSUM])
            assert len(acks) == 3   # the node stopped after the checksum error
            # nothing of the bad packet was stored; the good prefix is the visible length
            for node in nodes:
                await wait_for(lambda: node.store.get(2002).writer is None)
                assert node.store.get(2002).state.value == "RBW"
                assert node.store.get(2002).visible_length == 2 * 4096
            length = await block_length(nodes[1].address, 2002, 1)
            assert length["visible_length"] == 2 * 4096 and length["state"] == "RBW"
            nursery.cancel_scope.cancel()

    await main()


async def test_checksum_error_between_block_servers_names_the_node(tmp_path):
    data = random.Random(3).randbytes(3 * 4096)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            # node0 -> (corrupting relay) -> node1 -> node2; the flip lands in packet data
            relay = await proxy(nursery, nodes[1].address, flip_at=1000)
            acks = await write_block(nodes[0].address, 3003, 1, data,
                                     targets=[relay, nodes[2].address])
            assert acks[0] == (0, [SUCCESS, ERROR_CHECKSUM]), acks
            assert len(acks) == 1
            nursery.cancel_scope.cancel()

    await main()


async def test_broken_downstream_is_acked_with_its_index(tmp_path):
    data = random.Random(4).randbytes(20 * 4096)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            # node0 -> node1 -> (relay that dies after ~3 packets) -> node2
            relay = await proxy(nursery, nodes[2].address, cut_after=3 * 4200)
            framed, response = await open_write(nodes[0].address, 4004, 1,
                                                [nodes[1].address, relay])
            assert response["status"] == "SUCCESS"
            acks = await stream_packets(framed, data_packets(data))
            await framed.aclose()
            assert acks, "no ack at all"
            *good, failed = acks
            assert all(statuses == [SUCCESS] * 3 for _, statuses in good)
            assert failed[1] == [SUCCESS, SUCCESS, ERROR], acks
            assert len(acks) < len(data_packets(data))   # the pipeline closed after it
            # nodes 0 and 1 wrote that packet locally: visible length stops before it
            for node in nodes[:2]:
                replica = node.store.get(4004)
                await wait_for(lambda: replica.writer is None)
                assert replica.state.value == "RBW"
                assert replica.num_bytes >= (failed[0] + 1) * 4096
                assert replica.visible_length == failed[0] * 4096
            nursery.cancel_scope.cancel()

    await main()


async def test_receiver_runs_at_most_a_window_ahead_of_acks(tmp_path):
    """With the downstream's acks held back, the first node stops writing (and reading) once
    its ack queue of ``write_window_packets`` is full, and its disk queue behind it."""
    window = 4
    data = random.Random(11).randbytes(40 * 4096)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 2, write_window_packets=window)
            relay = await proxy(nursery, nodes[1].address, swallow_replies=True)
            framed, response = await open_write(nodes[0].address, 4100, 1, [relay])
            assert response["status"] == "SUCCESS"
            async with trio.open_nursery() as inner:
                inner.start_soon(stream_packets, framed, data_packets(data, last=False))
                first = nodes[0].store.get(4100)
                await wait_for(lambda: first.num_bytes >= (window + 2) * 4096,
                               what="the first node to write packets")
                # fixed-sleep: the writer must stall at the window; a stall is a non-event
                # (no counter of packets refused for want of queue space to wait on)
                await trio.sleep(0.3)
                written = first.num_bytes // 4096
                forwarded = nodes[1].store.get(4100).num_bytes // 4096
                # fixed-sleep: the same stall, watched a while longer: it must not move
                await trio.sleep(0.3)
                assert first.num_bytes == written * 4096, "the first node kept writing"
                # written: one packet awaiting its ack, `window` queued for the responder,
                # and the batch the disk writer holds waiting for queue space (at most the
                # one it had taken, the disk queue's `window`, and the packet a receiver
                # blocked on the full disk queue was handing over: a memory channel moves a
                # waiting send into the queue as the batch takes from it); forwarded: also
                # the disk queue refilled and the receiver's group waiting for room in it
                # (at most `window` packets)
                assert window + 2 <= written <= 2 * window + 3
                assert written < forwarded <= written + 2 * window
                assert nodes[1].store.get(4100).num_bytes == forwarded * 4096
                assert first.visible_length == 0    # nothing acked, nothing visible
                inner.cancel_scope.cancel()
            await framed.aclose()
            nursery.cancel_scope.cancel()

    await main()


async def test_concurrent_pipelines_and_reads(tmp_path):
    blobs = {100 + i: random.Random(i).randbytes(20_000 + 997 * i) for i in range(6)}

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            addresses = [n.address for n in nodes]

            async def one(block_id, blob):
                k = block_id % 3
                order = addresses[k:] + addresses[:k]
                acks = await write_block(order[0], block_id, 1, blob, targets=order[1:])
                assert all(st == [SUCCESS] * 3 for _, st in acks)
                for address in order:
                    _, got, _ = await read_block(address, block_id, 1)
                    assert got == blob

            async with trio.open_nursery() as inner:
                for block_id, blob in blobs.items():
                    inner.start_soon(one, block_id, blob)
            for node in nodes:
                assert sorted(r[0] for r in node.store.block_report()) == sorted(blobs)
            nursery.cancel_scope.cancel()

    await main()


async def test_setup_failure_names_first_bad_link_and_keeps_the_empty_replicas(tmp_path):
    """Nodes whose downstream setup failed keep the new RBW replica, empty and with no
    writer (as HDFS: the writer's recovery may have it copied or reopen it; an abandoned
    block's replicas are invalidated)."""
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 2)
            with socket.socket() as s:   # a port nobody listens on
                s.bind(("127.0.0.1", 0))
                dead = f"127.0.0.1:{s.getsockname()[1]}"
            framed, response = await open_write(nodes[0].address, 5005, 1,
                                                [nodes[1].address, dead])
            await framed.aclose()
            assert response["status"] == "ERROR"
            assert response["first_bad_link"] == dead
            assert dead in response["message"]
            for node in nodes:
                assert rbw_entry(node, 5005) == (1, ReplicaState.RBW, 0, None)
            # an existing replica with the same GS refuses the setup; the client learns it
            await write_block(nodes[1].address, 5006, 3, b"x" * 10)
            framed, response = await open_write(nodes[0].address, 5006, 3, [nodes[1].address])
            await framed.aclose()
            assert response["status"] == "ERROR" and response["first_bad_link"] == nodes[1].address
            assert rbw_entry(nodes[0], 5006) == (3, ReplicaState.RBW, 0, None)
            assert nodes[1].store.get(5006).num_bytes == 10
            nursery.cancel_scope.cancel()

    await main()


def rbw_entry(node: Node, block_id: int) -> tuple:
    """``(gs, state, num_bytes, writer)`` of the node's replica of ``block_id``."""
    r = node.store.get(block_id)
    return (r.gs, r.state, r.num_bytes, r.writer)


def node_has_no(node: Node, block_id: int) -> bool:
    return node.store.get(block_id) is None and not list(node.data_dir.rglob(f"blk_{block_id}"))


async def test_hflush_partial_chunk_rewrite_and_sync(tmp_path, monkeypatch):
    data = random.Random(5).randbytes(3000)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 2)
            framed, response = await open_write(nodes[0].address, 6006, 1, [nodes[1].address])
            assert response["status"] == "SUCCESS"
            send = lambda *p: send_packet(framed, *p)
            # flush 1: 700 bytes = one full chunk + 188 bytes of the second, SYNC (hsync)
            before = len(synced)
            await send(0, 0, data[:700], chunk_checksums(data[:700], BPC), FLAG_SYNC)
            assert await receive_ack(framed) == (0, [SUCCESS, SUCCESS])
            assert len(synced) - before >= 4    # data + meta on both nodes
            for node in nodes:
                assert await block_length(node.address, 6006, 1) == {
                    "status": "SUCCESS", "message": "", "visible_length": 700, "gs": 1,
                    "state": "RBW"}
            response, got, chunk_offset = await read_block(nodes[1].address, 6006, 1, 600, 100)
            assert got == data[600:700] and chunk_offset == 512
            # flush 2 starts again at the partial chunk's beginning and repeats its bytes
            before = len(synced)
            await send(1, 512, data[512:1900], chunk_checksums(data[512:1900], BPC), 0)
            assert await receive_ack(framed) == (1, [SUCCESS, SUCCESS])
            assert len(synced) == before        # no fsync without SYNC
            _, got, _ = await read_block(nodes[0].address, 6006, 1, 0, 1900)
            assert got == data[:1900]
            # a heartbeat packet is simply acked
            await send(2, 0, b"", b"", FLAG_HEARTBEAT)
            assert await receive_ack(framed) == (2, [SUCCESS, SUCCESS])
            await send(3, 1536, data[1536:3000], chunk_checksums(data[1536:3000], BPC), 0)
            await send(4, 3000, b"", b"", FLAG_LAST)
            assert await receive_ack(framed) == (3, [SUCCESS, SUCCESS])
            assert await receive_ack(framed) == (4, [SUCCESS, SUCCESS])
            await framed.aclose()
            for node in nodes:
                data_path, meta_path = replica_paths(node, 6006, 1)
                assert data_path.read_bytes() == data
                assert meta_path.read_bytes() == expected_meta(data)

            # a packet that starts before the last chunk boundary is a protocol error
            framed, response = await open_write(nodes[0].address, 6007, 1, [nodes[1].address])
            acks = await stream_packets(framed, [
                (0, 0, data[:1100], chunk_checksums(data[:1100], BPC), 0),
                (1, 0, data[:1200], chunk_checksums(data[:1200], BPC), 0)])
            await framed.aclose()
            assert acks == [(0, [SUCCESS, SUCCESS]), (1, [ERROR])]
            # ... and so is one that leaves a gap
            framed, response = await open_write(nodes[0].address, 6008, 1)
            acks = await stream_packets(framed, [
                (0, 0, data[:512], chunk_checksums(data[:512], BPC), 0),
                (1, 1024, data[:512], chunk_checksums(data[:512], BPC), 0)])
            await framed.aclose()
            assert acks == [(0, [SUCCESS]), (1, [ERROR])]
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- reads


async def test_read_block_arbitrary_ranges_return_exact_bytes_and_valid_checksums(tmp_path):
    data = random.Random(6).randbytes(50_000 + 77)
    rng = random.Random(7)

    async def main():
        async with trio.open_nursery() as nursery:
            # small packets so reads span many packets
            meta, nodes = await start_cluster(nursery, tmp_path, 1, packet_size=2048)
            await write_block(nodes[0].address, 7007, 3, data)
            ranges = [(0, len(data)), (0, 0), (len(data), 0), (1, 1), (511, 2), (512, 512),
                      (len(data) - 1, 1), (49_999, 78), (300, -1)]
            ranges += [(o, rng.randrange(0, len(data) - o + 1))
                       for o in (rng.randrange(len(data)) for _ in range(25))]
            for offset, length in ranges:
                response, got, chunk_offset = await read_block(nodes[0].address, 7007, 3,
                                                               offset, length)
                want = data[offset:] if length == -1 else data[offset:offset + length]
                assert got == want, (offset, length)
                assert chunk_offset == offset - offset % BPC
                assert response["visible_length"] == len(data)
            # beyond the end is refused with a clear error
            response, _, _ = await read_block(nodes[0].address, 7007, 3, 50_000, 100)
            assert response["status"] == "ERROR"
            assert response["error"]["type"] == "InvalidArgument"
            assert "50100" in response["message"]
            nursery.cancel_scope.cancel()

    await main()


async def test_stale_generation_stamp_and_missing_replica_are_refused(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1)
            address = nodes[0].address
            await write_block(address, 8008, 5, b"hello world")
            response, _, _ = await read_block(address, 8008, 6)
            assert response["status"] == "ERROR"
            assert response["error"]["type"] == "StaleGenerationStamp"
            assert response["message"].startswith("StaleGenerationStamp: ")
            assert "generation stamp 5, older than the requested 6" in response["message"]
            length = await block_length(address, 8008, 6)
            assert length["error"]["type"] == "StaleGenerationStamp"
            response, got, _ = await read_block(address, 8008, 4)   # older request: fine
            assert got == b"hello world"
            response, _, _ = await read_block(address, 9999, 1)
            assert response["error"]["type"] == "ReplicaNotFound"
            assert response["error"]["errno"] == 2
            # the same or an older GS cannot be written again ...
            for gs in (5, 4):
                framed, response = await open_write(address, 8008, gs)
                await framed.aclose()
                assert response["error"]["type"] == "ReplicaAlreadyExists"
            # ... a newer one replaces the replica
            await write_block(address, 8008, 9, b"second version")
            response, got, _ = await read_block(address, 8008, 9)
            assert got == b"second version"
            files = sorted(p.name for p in nodes[0].data_dir.rglob("blk_8008*"))
            assert files == ["blk_8008", "blk_8008_9.meta"]
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- restart


async def test_restart_rescans_rbw_to_rwr_removes_tmp_cuts_torn_chunk(tmp_path):
    data = random.Random(8).randbytes(3 * BPC + 100)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1)
            node = nodes[0]
            node_id = node.node_id
            await write_block(node.address, 1, 1, data)                        # finalized
            framed, _ = await open_write(node.address, 2, 4)                   # RBW, abandoned
            acks = await stream_packets(framed, data_packets(data, last=False))
            assert acks[-1][1] == [SUCCESS]
            await framed.aclose()
            framed, _ = await open_write(node.address, 3, 1)                   # RBW, 2 chunks
            await stream_packets(framed, data_packets(data[:2 * BPC], last=False))
            await framed.aclose()
            await wait_for(lambda: all(r.writer is None for r in node.store.replicas.values()))
            await node.stop()

            # crash leftovers: a half-copied temporary; on blk_2 the data of the partial last
            # chunk ran ahead of its checksum (keep the 100 bytes the checksum covers); on
            # blk_3 a torn last chunk whose bytes disagree with its checksum (cut it)
            (node.data_dir / "tmp" / "blk_77").write_bytes(b"partial")
            (node.data_dir / "tmp" / "blk_77_1.meta").write_bytes(b"junk")
            rbw2, _ = replica_paths(node, 2, 4, "rbw")
            with open(rbw2, "ab") as fh:
                fh.write(b"torn tail without checksum")
            rbw3, _ = replica_paths(node, 3, 1, "rbw")
            with open(rbw3, "r+b") as fh:
                fh.seek(BPC + 10)
                fh.write(b"\x00garbage\x00")
            reports_before = len(meta.of("block_report", node_id))

            await node.start()
            await wait_for(lambda: len(meta.of("block_report", node_id)) > reports_before)
            assert node.node_id == node_id
            assert not list((node.data_dir / "tmp").iterdir())
            r1, r2, r3 = (node.store.get(i) for i in (1, 2, 3))
            assert r1.state.value == "FINALIZED" and r1.num_bytes == len(data)
            assert r2.state.value == "RWR" and r2.num_bytes == len(data)
            assert rbw2.read_bytes() == data
            assert r3.state.value == "RWR" and r3.num_bytes == BPC
            assert rbw3.read_bytes() == data[:BPC]
            _, meta3 = replica_paths(node, 3, 1, "rbw")
            assert meta3.read_bytes() == expected_meta(data[:BPC])
            report = meta.of("block_report", node_id)[-1]["blocks"]
            assert sorted(report) == [[1, 1, len(data), "FINALIZED"], [2, 4, len(data), "RWR"],
                                      [3, 1, BPC, "RWR"]]
            # RWR replicas are readable up to their recovered length
            _, got, _ = await read_block(node.address, 2, 4)
            assert got == data
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- heartbeat


async def test_invalidate_command_deletes_replicas_and_reports_them(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1)
            node = nodes[0]
            for block_id in (11, 12, 13):
                await write_block(node.address, block_id, 2, bytes([block_id]) * 5000)
            await wait_for(lambda: meta.of("heartbeat", node.node_id)[-1]["used"] >= 3 * 5000)
            used_before = meta.of("heartbeat", node.node_id)[-1]["used"]
            meta.commands[node.node_id] = [
                {"type": "INVALIDATE", "blocks": [block_dict(11, 2, 5000), block_dict(12, 2),
                                                  block_dict(13, 1)]},   # 13: newer here, kept
                {"type": "NO_SUCH_COMMAND", "x": 1}]
            await wait_for(lambda: 12 in meta.deleted(node.node_id))
            assert sorted(meta.deleted(node.node_id)) == [11, 12]
            assert node_has_no(node, 11) and node_has_no(node, 12)
            assert replica_paths(node, 13, 2)[0].read_bytes() == bytes([13]) * 5000
            await wait_for(lambda: meta.of("heartbeat", node.node_id)[-1]["used"] < used_before)
            # heartbeats go on after the unknown command
            n = len(meta.of("heartbeat", node.node_id))
            await wait_for(lambda: len(meta.of("heartbeat", node.node_id)) > n + 2)
            nursery.cancel_scope.cancel()

    await main()


async def test_registration_retries_until_meta_is_up_and_reregisters_on_request(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            config = make_config()
            node = Node(nursery, config, tmp_path / "dn", f"127.0.0.1:{port}")
            with trio.fail_after(5):
                await node.start()   # reports its address although nobody answers
            response, _, _ = await read_block(node.address, 1, 1)   # and serves data already
            assert response["error"]["type"] == "ReplicaNotFound"
            await write_block(node.address, 21, 1, b"early")
            # fixed-sleep: registering keeps failing while nobody answers; no count of
            # failed attempts to wait on, and "not registered" is a non-event
            await trio.sleep(0.3)
            assert not node.server.heartbeat.registered
            meta, _ = await start_fake_meta(nursery, port)
            await wait_for(lambda: node.server.heartbeat.registered, timeout=10)
            register = meta.of("register_storage")[0]
            assert register["node_id"] == node.node_id
            assert register["address"] == node.address
            assert register["capacity"] > register["remaining"] > 0
            assert meta.of("block_report")[0]["blocks"] == [[21, 1, 5, "FINALIZED"]]
            # the finalize report queued while the meta server was away arrives too
            await wait_for(lambda: [21, 1, 5, "FINALIZED"] in meta.received(node.node_id))
            meta.reregister.add(node.node_id)
            await wait_for(lambda: len(meta.of("register_storage")) == 2)
            await wait_for(lambda: len(meta.of("block_report")) == 2)
            assert meta.of("block_report")[1]["blocks"] == [[21, 1, 5, "FINALIZED"]]
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- hostile input


async def raw_exchange(address: str, payload: bytes) -> bytes:
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(payload)
        await stream.send_eof()
        out = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                out += chunk
        return out
    finally:
        await stream.aclose()


def decode_frame(raw: bytes):
    import msgpack
    (length,) = struct.unpack(">I", raw[:4])
    return msgpack.unpackb(raw[4:4 + length], raw=False)


async def test_bad_input_gets_an_error_and_the_server_keeps_serving(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1)
            address = nodes[0].address
            bad_headers = [
                [1, 2, 3],
                {"no": "op"},
                {"op": "NO_SUCH_OP"},
                {"op": "READ_BLOCK"},
                {"op": "READ_BLOCK", "block": {"id": "x", "gs": 1}},
                {"op": "READ_BLOCK", "block": {"id": 1, "gs": 1}, "offset": "zero"},
                {"op": "WRITE_BLOCK", "block": {"id": 1, "gs": 1}, "targets": "nope"},
                {"op": "WRITE_BLOCK", "block": {"id": 1, "gs": 1}, "targets": ["no-port"]},
                {"op": "WRITE_BLOCK", "block": {"id": 1, "gs": 1}, "stage": "WHATEVER"},
                {"op": "WRITE_BLOCK", "block": {"id": 1, "gs": 1}, "bytes_per_checksum": 0},
            ]
            for header in bad_headers:
                reply = decode_frame(await raw_exchange(address, encode_frame(header)))
                assert reply["status"] == "ERROR", header
                assert reply["error"]["type"] in ("ProtocolError", "NotSupported",
                                                  "InvalidArgument"), reply
                assert reply["message"]
            reply = decode_frame(await raw_exchange(address, encode_frame({"op": "NO_SUCH_OP"})))
            assert "NO_SUCH_OP" in reply["message"]
            # a frame far larger than an op header may be, and plain garbage
            reply = decode_frame(await raw_exchange(address, b"\xff\xff\xff\xff" + b"x" * 100))
            assert reply["error"]["type"] == "FrameTooLarge"
            garbage = random.Random(9).randbytes(5000)
            reply = decode_frame(await raw_exchange(address, b"\x00\x00\x00\x10" + garbage))
            assert reply["status"] == "ERROR"
            # an oversized packet inside a write: ERROR ack, replica left RBW, no allocation
            framed, response = await open_write(address, 31, 1)
            await framed.send_all(encode_packet_header(0, 0, 1 << 30, 0))
            assert await receive_ack(framed) == (0, [ERROR])
            await framed.aclose()
            # a packet with unknown flags
            framed, response = await open_write(address, 32, 1)
            await framed.send_all(encode_packet_header(5, 0, 0, 0x80))
            assert await receive_ack(framed) == (5, [ERROR])
            await framed.aclose()
            # a writer that vanishes mid-packet
            framed, response = await open_write(address, 33, 1)
            await framed.send_all(encode_packet_header(0, 0, 4096, 0) + b"\x00" * 100)
            await framed.aclose()
            # after all that, a normal write and read still work
            data = random.Random(10).randbytes(10_000)
            acks = await write_block(address, 34, 1, data)
            assert all(s == [SUCCESS] for _, s in acks)
            _, got, _ = await read_block(address, 34, 1)
            assert got == data
            await wait_for(lambda: nodes[0].store.get(33).writer is None)
            assert nodes[0].store.get(31).visible_length == 0
            nursery.cancel_scope.cancel()

    await main()


async def test_full_block_report_repeats_every_interval(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1, block_report_interval=0.2)
            await write_block(nodes[0].address, 51, 2, b"z" * 700)
            await wait_for(lambda: [51, 2, 700, "FINALIZED"] in
                           (meta.of("block_report") or [{"blocks": []}])[-1]["blocks"])
            n = len(meta.of("block_report"))
            # fixed-sleep: counts the reports in a fixed window, a rate (both bounds)
            await trio.sleep(0.7)
            assert 2 <= len(meta.of("block_report")) - n <= 5
            assert len(meta.of("register_storage")) == 1
            nursery.cancel_scope.cancel()

    await main()


async def test_write_block_refuses_bytes_per_checksum_outside_512_to_1mib(tmp_path):
    data = random.Random(12).randbytes(5000)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1)
            node = nodes[0]
            for bpc in (16, 511, (1 << 20) + 1, 1 << 24):
                framed, response = await open_write(node.address, 70, 1, bpc=bpc)
                await framed.aclose()
                assert response["status"] == "ERROR", bpc
                assert response["error"]["type"] == "InvalidArgument"
                assert f"bytes_per_checksum {bpc} " in response["message"]
                assert "blk_70" in response["message"] and "[512, 1048576]" in response["message"]
                assert node_has_no(node, 70)
            for block_id, bpc in ((71, 512), (72, 1 << 20)):   # the bounds themselves are fine
                framed, response = await open_write(node.address, block_id, 1, bpc=bpc)
                assert response["status"] == "SUCCESS"
                acks = await stream_packets(framed, data_packets(data, len(data), bpc=bpc))
                await framed.aclose()
                assert [s for _, s in acks] == [[SUCCESS], [SUCCESS]]
                _, got, _ = await read_block(node.address, block_id, 1)
                assert got == data
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- stalled peers


async def open_transfer_server(tmp_path: Path, **overrides) -> DataTransferServer:
    """The real data-transfer server on a real replica store, without a socket: tests hand
    it in-memory streams, so a peer that stops reading blocks the server at once."""
    store = ReplicaStore(str(tmp_path / "dn"), disk_io_threads=4)
    await store.open()
    return DataTransferServer(make_config(**overrides), store)


async def store_finalized(store: ReplicaStore, block_id: int, gs: int, data: bytes) -> Path:
    replica = await store.create_rbw(block_id, gs, BPC)
    await store.write_packet(replica, 0, data, chunk_checksums(data, BPC))
    await store.finalize(replica)
    return Path(replica.data_path)


def open_fds_on(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return count


def transfer_log(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "storage.transfer"]


async def start_read(server: DataTransferServer, block_id: int, gs: int):
    """A READ_BLOCK over a lockstep stream (every send waits for the reader): returns the
    client end, the response, and an event set when the server's handler returned."""
    client_end, server_end = trio.testing.lockstep_stream_pair()
    done = trio.Event()

    async def serve():
        try:
            await server.handle(server_end, "test-reader")
        finally:
            done.set()

    server.nursery.start_soon(serve)
    client = FramedStream(client_end)
    await client.send_frame({"op": "READ_BLOCK", "block": {"id": block_id, "gs": gs},
                             "offset": 0, "length": -1})
    return client, await client.receive_frame(), done


async def test_read_block_to_a_reader_that_stops_reading_ends_after_data_timeout(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="storage")
    data = random.Random(13).randbytes(20 * 4096)

    async def main():
        server = await open_transfer_server(tmp_path, data_timeout=0.3)
        data_path = await store_finalized(server.store, 1, 1, data)
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            client, response, done = await start_read(server, 1, 1)
            assert response["status"] == "SUCCESS"
            first = await receive_packet(client, BPC)
            assert first.data == data[:4096]
            assert open_fds_on(data_path) == 1        # the read holds the replica open
            # the reader stops reading: the server gives up on the next packet
            with trio.fail_after(5):
                await wait_for(lambda: open_fds_on(data_path) == 0, timeout=5,
                               what="the server to close the replica")
            await client.aclose()
            with trio.fail_after(5):
                await done.wait()
            assert server.active_ops == 0
        server.store.close()

    await main()
    records = transfer_log(caplog)
    assert any("stopped reading" in r.getMessage() for r in records), records
    assert all(r.levelno == logging.DEBUG for r in records), records


async def test_reader_closing_a_read_early_is_only_a_debug_line(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="storage")
    data = random.Random(14).randbytes(20 * 4096)

    async def main():
        server = await open_transfer_server(tmp_path)
        data_path = await store_finalized(server.store, 2, 1, data)
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            client, response, done = await start_read(server, 2, 1)
            assert (await receive_packet(client, BPC)).data == data[:4096]
            await client.aclose()                     # read what it needed, went away
            with trio.fail_after(5):
                await done.wait()
            assert open_fds_on(data_path) == 0 and server.active_ops == 0
            # and the next reader is served in full
            client, response, done = await start_read(server, 2, 1)
            got = []
            while not (packet := await receive_packet(client, BPC)).last:
                got.append(packet.data)
            assert b"".join(got) == data
            await client.aclose()
        server.store.close()

    await main()
    records = transfer_log(caplog)
    assert any("closed the connection" in r.getMessage() for r in records), records
    assert all(r.levelno == logging.DEBUG for r in records), records


async def test_downstream_that_stops_reading_is_failed_after_data_timeout(tmp_path, monkeypatch):
    """The downstream accepts the setup, then reads nothing: forwarding the first packet
    times out (``data_timeout`` and one ``data_ack_timeout_step`` for the one node below)
    and the writer gets ERROR at the downstream's index instead of hanging."""
    data = random.Random(15).randbytes(3 * 4096)

    async def main():
        server = await open_transfer_server(tmp_path, data_timeout=0.3,
                                            data_ack_timeout_step=0.2)
        async with trio.open_nursery() as nursery:
            headers_seen = []

            async def stalled_downstream(stream):
                framed = FramedStream(stream)
                headers_seen.append(await framed.receive_frame())
                await framed.send_frame({"status": "SUCCESS", "message": "",
                                         "first_bad_link": ""})
                await trio.sleep_forever()            # never reads a packet

            async def open_lockstep(host, port, tls=None, **kw):
                ours, theirs = trio.testing.lockstep_stream_pair()
                nursery.start_soon(stalled_downstream, theirs)
                return ours

            monkeypatch.setattr(fs.dataconn, "connect_tcp", open_lockstep)
            client_end, server_end = trio.testing.memory_stream_pair()
            nursery.start_soon(server.handle, server_end, "test-writer")
            client = FramedStream(client_end)
            await client.send_frame({"op": "WRITE_BLOCK", "block": block_dict(80, 1),
                                     "targets": ["127.0.0.1:9", "127.0.0.1:10"],
                                     "stage": PIPELINE_SETUP_CREATE, "bytes_per_checksum": BPC})
            assert (await client.receive_frame())["status"] == "SUCCESS"
            assert headers_seen[0]["targets"] == ["127.0.0.1:10"]
            with trio.fail_after(5):
                acks = await stream_packets(client, data_packets(data))
            assert acks == [(0, [SUCCESS, ERROR])]
            replica = server.store.get(80)
            await wait_for(lambda: replica.writer is None)
            assert replica.state.value == "RBW" and replica.visible_length == 0
            nursery.cancel_scope.cancel()
        server.store.close()

    await main()


# --------------------------------------------------------------------------- report ordering


class HoldingMeta(FakeMeta):
    """Holds the ``hold``-th full block report until ``release`` is set, and records a full
    report when it is processed (after the hold), so ``calls`` is the processing order."""

    def __init__(self, hold: int):
        super().__init__()
        self.hold = hold
        self.reports_started = 0
        self.held = trio.Event()
        self.release = trio.Event()

    async def rpc_block_report(self, ctx, node_id, blocks, report_id=None, chunk=0, last=True):
        self.reports_started += 1
        if self.reports_started == self.hold:
            self.held.set()
            await self.release.wait()
        self.calls.append(("block_report", dict(node_id=node_id, blocks=blocks,
                                                report_id=report_id, chunk=chunk, last=last)))
        return True


async def test_incremental_report_waits_for_a_full_report_in_flight(tmp_path):
    """The periodic full report's snapshot (without blk_61) is being processed when blk_61
    is written and finalized: its incremental report must reach the metadata server only
    after that report, or the stale snapshot would undo it."""
    async def main():
        async with trio.open_nursery() as nursery:
            meta = HoldingMeta(hold=2)     # 1 = the report at registration, 2 = periodic
            bound = await nursery.start(
                serve_tcp, lambda stream, peer: serve_rpc(stream, meta, peer=peer),
                "127.0.0.1", 0)
            node = await Node(nursery, make_config(block_report_interval=0.2),
                              tmp_path / "dn", format_address(bound)).start()
            with trio.fail_after(5):
                await meta.held.wait()
            acks = await write_block(node.address, 61, 1, b"q" * 1000)
            assert acks[-1] == (1, [SUCCESS])
            assert not meta.of("block_received_and_deleted"), \
                "an incremental report overtook the full report in flight"
            meta.release.set()
            await wait_for(lambda: [61, 1, 1000, "FINALIZED"] in meta.received(node.node_id))
            order = [(m, a) for m, a in meta.calls
                     if m in ("block_report", "block_received_and_deleted")]
            held_at = [i for i, (m, _) in enumerate(order) if m == "block_report"][1]
            assert order[held_at][1]["blocks"] == []           # the snapshot before the write
            first_incremental = next(i for i, (m, a) in enumerate(order)
                                     if m == "block_received_and_deleted"
                                     and any(e[0] == 61 for e in a["received"]))
            assert held_at < first_incremental
            nursery.cancel_scope.cancel()

    await main()


def _reports_by_id(meta: FakeMeta) -> dict:
    """report id → its chunks in arrival order."""
    out: dict = {}
    for args in meta.of("block_report"):
        out.setdefault(args["report_id"], []).append(args)
    return out


async def test_full_report_is_sent_in_chunks_of_the_configured_size(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1, block_report_chunk=3,
                                              block_report_interval=0.2)
            node = nodes[0]
            for block_id in range(101, 108):
                await write_block(node.address, block_id, 1, bytes([block_id]) * 600)

            finalized = sorted([block_id, 1, 600, "FINALIZED"] for block_id in range(101, 108))

            def complete_reports():
                # a report snapshotted while blk_107 was still being written lists it as
                # RBW: wait for one that lists all seven replicas finalized
                return [chunks for chunks in _reports_by_id(meta).values()
                        if chunks[-1]["last"]
                        and sorted(e for c in chunks for e in c["blocks"]) == finalized]
            await wait_for(complete_reports, timeout=30,
                           what="a full report of all 7 finalized replicas")
            chunks = complete_reports()[0]
            assert [len(c["blocks"]) for c in chunks] == [3, 3, 1]
            assert [c["chunk"] for c in chunks] == [0, 1, 2]
            assert [c["last"] for c in chunks] == [False, False, True]
            # one report id per full report; an empty store sends one empty last chunk
            registration = meta.of("block_report")[0]
            assert registration["blocks"] == [] and registration["last"] is True
            assert len({c["report_id"] for c in meta.of("block_report")}) == \
                len(_reports_by_id(meta))
            nursery.cancel_scope.cancel()

    await main()


class ChunkHoldingMeta(FakeMeta):
    """Holds the first chunk of the first report with more than one chunk until
    ``release``; ``calls`` is the order in which the metadata server processed the calls."""

    def __init__(self):
        super().__init__()
        self.held = trio.Event()
        self.release = trio.Event()

    async def rpc_block_report(self, ctx, node_id, blocks, report_id=None, chunk=0, last=True):
        if chunk == 0 and not last and not self.held.is_set():
            self.held.set()
            await self.release.wait()
        return await super().rpc_block_report(ctx, node_id, blocks, report_id, chunk, last)


async def test_no_incremental_report_overtakes_a_chunked_full_report(tmp_path):
    """blk_73 is finalized while the first of two chunks of a full report is held: its
    incremental report must reach the metadata server after the report's LAST chunk (not
    merely after the held one)."""
    async def main():
        async with trio.open_nursery() as nursery:
            meta = ChunkHoldingMeta()
            bound = await nursery.start(
                serve_tcp, lambda stream, peer: serve_rpc(stream, meta, peer=peer),
                "127.0.0.1", 0)
            node = await Node(nursery, make_config(block_report_chunk=1,
                                                   block_report_interval=0.2),
                              tmp_path / "dn", format_address(bound)).start()
            await wait_for(lambda: node.server.heartbeat.registered)
            for block_id in (71, 72):
                await write_block(node.address, block_id, 1, b"p" * 300)
            with trio.fail_after(5):
                await meta.held.wait()
            acks = await write_block(node.address, 73, 1, b"q" * 1000)
            assert acks[-1] == (1, [SUCCESS])
            # fixed-sleep: room for an incremental report to overtake; not overtaking is a
            # non-event, and no heartbeat is sent while the full report is held
            await trio.sleep(0.3)
            assert not any(e[0] == 73 for e in meta.received(node.node_id)), \
                "an incremental report overtook the chunked full report in flight"
            meta.release.set()
            await wait_for(lambda: [73, 1, 1000, "FINALIZED"] in meta.received(node.node_id))
            order = [(m, a) for m, a in meta.calls
                     if m in ("block_report", "block_received_and_deleted")]
            held_last = next(i for i, (m, a) in enumerate(order)
                             if m == "block_report" and a["chunk"] == 1)
            assert order[held_last][1]["last"] is True
            held_id = order[held_last][1]["report_id"]
            held_entries = [e for m, a in order if m == "block_report"
                            and a["report_id"] == held_id for e in a["blocks"]]
            assert sorted(e[0] for e in held_entries) == [71, 72]   # the snapshot before 73
            first_incremental = next(i for i, (m, a) in enumerate(order)
                                     if m == "block_received_and_deleted"
                                     and any(e[0] == 73 for e in a["received"]))
            assert held_last < first_incremental
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- lost replicas


def damage_replica(node: Node, block_id: int, gs: int, how: str) -> None:
    data_path, meta_path = replica_paths(node, block_id, gs)
    if how == "delete":
        data_path.unlink()
        meta_path.unlink()
    elif how == "delete meta":
        meta_path.unlink()
    elif how == "cut data":
        os.truncate(data_path, 1000)
    elif how == "cut meta":
        os.truncate(meta_path, 20)


async def test_a_read_of_a_replica_whose_files_are_gone_or_cut_drops_it_and_reports_it(tmp_path):
    damages = {21: "delete", 22: "delete meta", 23: "cut data", 24: "cut meta"}

    async def main():
        async with trio.open_nursery() as nursery:
            meta, (node,) = await start_cluster(nursery, tmp_path, 1)
            for block_id in (*damages, 25):
                await write_block(node.address, block_id, 3, bytes([block_id]) * 5000)
            used_before = node.store.used_bytes()
            for block_id, how in damages.items():
                damage_replica(node, block_id, 3, how)
                try:
                    response, data, _ = await read_block(node.address, block_id, 3)
                    assert response["status"] != "SUCCESS" or data != bytes([block_id]) * 5000
                except (LeaseFSError, EOFError):   # the read broke off after its response
                    pass
            await wait_for(lambda: set(damages) <= set(meta.deleted(node.node_id)),
                           what="the lost replicas reported deleted")
            assert all(node.store.get(b) is None for b in damages)
            assert node.store.used_bytes() < used_before
            # what was left of them is kept aside, never served
            aside = sorted(p.name for p in (node.data_dir / "corrupt").iterdir())
            assert aside == ["blk_22", "blk_23", "blk_23_3.meta", "blk_24", "blk_24_3.meta"]
            # an intact replica is served and stays
            response, data, _ = await read_block(node.address, 25, 3)
            assert data == bytes([25]) * 5000 and 25 not in meta.deleted(node.node_id)
            nursery.cancel_scope.cancel()

    await main()


async def test_a_transfer_source_whose_replica_files_are_gone_drops_and_reports_it(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, (source, target) = await start_cluster(nursery, tmp_path, 2)
            await write_block(source.address, 41, 2, b"t" * 4000)
            damage_replica(source, 41, 2, "delete")
            meta.commands[source.node_id] = [{"type": "TRANSFER",
                                              "block": block_dict(41, 2, 4000),
                                              "targets": [target.address]}]
            await wait_for(lambda: 41 in meta.deleted(source.node_id),
                           what="the lost TRANSFER source reported deleted")
            assert source.store.get(41) is None and node_has_no(target, 41)
            nursery.cancel_scope.cancel()

    await main()


async def test_block_scanner_reports_bad_bytes_bad_and_lost_files_deleted(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, (node,) = await start_cluster(nursery, tmp_path, 1, scanner_period=0.2,
                                                scanner_bytes_per_second=100 << 20)
            for block_id in (51, 52):
                await write_block(node.address, block_id, 2, bytes([block_id]) * 3000)
            data_path, _ = replica_paths(node, 51, 2)
            data_path.write_bytes(b"\xff" * 3000)        # garbage: a checksum matter
            damage_replica(node, 52, 2, "cut data")      # cut: lost, not corrupt

            def bad_ids():
                return {b["block"]["id"] for args in meta.of("report_bad_blocks")
                        for b in args["blocks"]}
            await wait_for(lambda: 51 in bad_ids() and 52 in meta.deleted(node.node_id),
                           what="the scanner's reports")
            assert 52 not in bad_ids() and 51 not in meta.deleted(node.node_id)
            assert node.store.get(52) is None and node.store.get(51) is not None
            nursery.cancel_scope.cancel()

    await main()


async def test_directory_scan_reports_lost_replicas_deleted_and_unknown_files_received(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, (node,) = await start_cluster(nursery, tmp_path, 1,
                                                directory_scan_interval=0.2)
            for block_id in (31, 32, 33):
                await write_block(node.address, block_id, 4, bytes([block_id]) * 3000)
            damage_replica(node, 31, 4, "delete")
            damage_replica(node, 32, 4, "cut meta")
            # replica files of block 34 appear (a copy of 33's bytes; each file whole)
            src_data, src_meta = replica_paths(node, 33, 4)
            dst_data, dst_meta = replica_paths(node, 34, 4)
            dst_data.parent.mkdir(parents=True, exist_ok=True)
            for src, dst in ((src_meta, dst_meta), (src_data, dst_data)):
                tmp = node.data_dir / "copying"
                tmp.write_bytes(src.read_bytes())
                os.replace(tmp, dst)
            await wait_for(lambda: {31, 32} <= set(meta.deleted(node.node_id))
                           and [34, 4, 3000, "FINALIZED"] in meta.received(node.node_id),
                           what="the directory scan's reports")
            assert node.store.get(31) is None and node.store.get(32) is None
            response, data, _ = await read_block(node.address, 34, 4)
            assert data == bytes([33]) * 3000
            assert 33 not in meta.deleted(node.node_id) and node.store.get(33) is not None
            assert node.server.dirscan.passes >= 1
            nursery.cancel_scope.cancel()

    await main()


async def test_advertised_address_follows_the_bind_address():
    """``advertise_host`` when set; else the bound address; bound to every address, the
    source address of the route to the metadata server (here loopback, its own); a
    metadata server nothing routes to is a clear error naming both fixes."""
    from fs.errors import InvalidArgument
    from storage.server import advertised_host

    config = make_config()

    async def main():
        assert await advertised_host(config, "10.1.2.3", "127.0.0.1:8020") == "10.1.2.3"
        assert await advertised_host(config.replace(advertise_host="node7"), "10.1.2.3",
                                     "127.0.0.1:8020") == "node7"
        for wildcard in ("0.0.0.0", ""):
            assert await advertised_host(config, wildcard, "127.0.0.1:8020") == "127.0.0.1"
        with pytest.raises(InvalidArgument, match="--host.*advertise_host"):
            await advertised_host(config, "0.0.0.0", "no-such-host.invalid:8020")

    await main()


async def test_the_hdfs_port_is_registered_and_an_earlier_metadata_server_still_takes_the_node(
        tmp_path):
    async with trio.open_nursery() as nursery:
        for meta in (FakeMeta(), EarlierFakeMeta()):
            meta, address = await start_fake_meta(nursery, meta=meta)
            node = await Node(nursery, make_config(), tmp_path / type(meta).__name__,
                              address).start()
            await wait_for(lambda: node.server.heartbeat.registered, 10, "registration")
            (registered,) = meta.of("register_storage")
            want = None if isinstance(meta, EarlierFakeMeta) else node.server.hdfs_bound[1]
            assert registered["hdfs_port"] == want
            await node.stop()
        nursery.cancel_scope.cancel()


def test_packets_written_as_runs_store_what_one_write_each_stores(tmp_path):
    """A write batch goes to disk as runs (one pwritev per file for packets back to back in
    whole chunks): the data and meta files are byte for byte what one write per packet
    leaves, also across a partial chunk rewritten by the next packet, an empty packet and
    runs longer than one pwritev takes."""
    from storage import replica_records
    from storage.replica_records import ReplicaWriter

    bpc = 512
    rng = random.Random(9)

    def packet(offset: int, size: int):
        data = rng.randbytes(size)
        return offset, memoryview(data), chunk_checksums(data, bpc)

    packets = [packet(0, 1024), packet(1024, 1024), packet(2048, 300),   # partial chunk:
               packet(2048, 812), packet(2860, 0), packet(2560, 1024)]    # rewritten after
    packets += [packet(3584 + i * bpc, bpc) for i in range(5)]
    stored = []
    for name, write in (("each", lambda w: [w.write(*p) for p in packets]),
                        ("runs", lambda w: w.write_run(packets))):
        writer = ReplicaWriter(str(tmp_path / f"{name}.data"), str(tmp_path / f"{name}.meta"),
                               bpc, create=True)
        write(writer)
        writer.close_for_finalize(False)
        stored.append(((tmp_path / f"{name}.data").read_bytes(),
                       (tmp_path / f"{name}.meta").read_bytes()))
    assert stored[0] == stored[1]
    assert len(stored[1][0]) == 3584 + 5 * bpc
    # runs cut at the kernel's vector limit store the same
    replica_records._IOV_MAX, limit = 2, replica_records._IOV_MAX
    try:
        writer = ReplicaWriter(str(tmp_path / "cut.data"), str(tmp_path / "cut.meta"), bpc,
                               create=True)
        writer.write_run(packets)
        writer.close_for_finalize(False)
    finally:
        replica_records._IOV_MAX = limit
    assert ((tmp_path / "cut.data").read_bytes(), (tmp_path / "cut.meta").read_bytes()) \
        == stored[0]
