"""The one-shot small-block write (WRITE_BLOCK_ONESHOT): a block the writer holds whole goes
to its pipeline's nodes in one message per hop, each node finalizes its replica in one step
and answers once, with every downstream node's status.

Real block servers on loopback: in-process with a recording fake metadata server (the
``test_storage`` helpers) for what one node does and reports, and in-process clusters with
the real metadata server for the writer's side (a small file's close uses the one-shot; a
failed node is excluded and the block retried under a new id).
"""

from __future__ import annotations

import logging
import random
import struct

import pytest
import trio

from harness import inprocess_cluster, recover_until_closed
from test_storage import (BPC, connect, decode_frame, expected_meta, raw_exchange, read_block,
                          replica_paths, start_cluster, wait_for)

from fs.datatransfer import (ERROR, ERROR_CHECKSUM, FLAG_LAST, FLAG_SYNC, SUCCESS,
                             WRITE_BLOCK_ONESHOT, chunk_checksums, encode_packet_header,
                             op_header)
from fs.framing import encode_frame
from fs.errors import LeaseFSError
from fs.pipeline import SetupFailed, write_oneshot
import storage.transfer as transfer_mod
from storage.transfer import CORRUPT_PACKETS_ENV

KiB = 1 << 10
# small blocks are under test: no file is kept inline
SMALL = dict(block_size=64 * KiB, bytes_per_checksum=BPC, packet_size=16 * KiB,
             write_window_packets=4, inline_max=0)

pytestmark = pytest.mark.timeout(90)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def located(nodes, block_id: int, gs: int = 1) -> dict:
    return {"block": {"id": block_id, "gs": gs, "num_bytes": 0},
            "locations": [{"address": n.address, "node_id": n.node_id} for n in nodes]}


async def oneshot(nodes, block_id: int, data: bytes, gs: int = 1, timeout: float = 10.0):
    await write_oneshot(path="/t", located=located(nodes, block_id, gs), client_name="t",
                        bytes_per_checksum=BPC, data=data, sums=chunk_checksums(data, BPC),
                        timeout=timeout, connect_timeout=timeout, max_frame=1 << 20)


def message(block_id: int, data: bytes, *, targets=(), offset: int = 0, flags: int = FLAG_LAST,
            sums: bytes | None = None, **header) -> bytes:
    """A whole WRITE_BLOCK_ONESHOT as a peer sends it: header frame + the one packet."""
    head = op_header(WRITE_BLOCK_ONESHOT, block={"id": block_id, "gs": 1},
                     targets=targets if isinstance(targets, str) else list(targets),
                     client="raw", bytes_per_checksum=BPC)
    head.update(header)
    sums = chunk_checksums(data, BPC) if sums is None else sums
    return encode_frame(head) + encode_packet_header(0, offset, len(data), flags) + sums + data


def answer(raw: bytes) -> tuple[dict, list[int] | None]:
    """The response frame and, after a SUCCESS one, the ack's statuses."""
    (length,) = struct.unpack(">I", raw[:4])
    response = decode_frame(raw)
    rest = raw[4 + length:]
    if not rest:
        return response, None
    seqno, n = struct.unpack(">qB", rest[:9])
    assert seqno == 0 and len(rest) == 9 + n
    return response, list(rest[9:])


# --------------------------------------------------------------------------- one node's work


async def test_three_nodes_finalize_identical_replicas_and_report_only_finalized(tmp_path):
    data = payload(10_000, seed=1)   # a partial last chunk too

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 3)
            await oneshot(nodes, 41, data)
            for node in nodes:
                replica = node.store.get(41)
                assert replica.state.value == "FINALIZED" and replica.num_bytes == len(data)
                assert replica.writer is None and replica.visible_length == len(data)
                data_path, meta_path = replica_paths(node, 41, 1)
                assert data_path.read_bytes() == data
                assert meta_path.read_bytes() == expected_meta(data)
                assert not list((node.data_dir / "rbw").iterdir())
                assert node.server.transfer.oneshot_writes == 1
                _, got, _ = await read_block(node.address, 41, 1)
                assert got == data
            # one incremental report per node, FINALIZED, no "receiving" (RBW) entry first
            await wait_for(lambda: all(meta.received(n.node_id) for n in nodes))
            for node in nodes:
                assert meta.received(node.node_id) == [[41, 1, len(data), "FINALIZED"]]
            nursery.cancel_scope.cancel()

    await main()


async def test_dead_downstream_is_acked_at_its_index_and_the_rest_is_written(tmp_path):
    data = payload(3000, seed=2)

    async with trio.open_nursery() as nursery:
        meta, nodes = await start_cluster(nursery, tmp_path, 3)
        await nodes[2].stop()
        with pytest.raises(SetupFailed) as info:
            await oneshot(nodes, 51, data)
        assert info.value.node["address"] == nodes[2].address
        # the nodes before it finalized their replicas (the metadata server invalidates
        # them once the writer abandons the block)
        for node in nodes[:2]:
            assert node.store.get(51).state.value == "FINALIZED"
        # the same through raw bytes: the statuses say which node failed
        raw = await raw_exchange(nodes[0].address, message(52, data,
                                 targets=[nodes[1].address, nodes[2].address]))
        assert answer(raw) == ({"status": "SUCCESS", "message": "",
                                "first_bad_link": ""}, [SUCCESS, SUCCESS, ERROR])
        nursery.cancel_scope.cancel()


async def test_a_downstream_that_refuses_is_blamed_not_the_sender(tmp_path):
    """The last node already holds the block with a newer stamp, so it cannot create its
    replica: its upstream acks ERROR at its index."""
    async with trio.open_nursery() as nursery:
        meta, nodes = await start_cluster(nursery, tmp_path, 2)
        await oneshot(nodes[1:], 61, b"x" * 100, gs=5)
        with pytest.raises(SetupFailed) as info:
            await oneshot(nodes, 61, b"y" * 100, gs=4)
        assert info.value.node["address"] == nodes[1].address
        assert "ERROR" in info.value.reason
        nursery.cancel_scope.cancel()


async def test_checksum_corruption_is_refused_with_error_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv(CORRUPT_PACKETS_ENV, "once")
    monkeypatch.setattr(transfer_mod, "_TEST_CORRUPTION", transfer_mod._CorruptionHook())
    data = payload(4096, seed=3)

    async with trio.open_nursery() as nursery:
        meta, nodes = await start_cluster(nursery, tmp_path, 3)
        with pytest.raises(SetupFailed) as info:
            await oneshot(nodes, 71, data)
        # the node that got the corrupted copy refused it and wrote nothing (the
        # writer abandons the block, so the others' replicas are invalidated)
        refusing = [n for n in nodes if n.address == info.value.node["address"]]
        assert len(refusing) == 1 and refusing[0].store.get(71) is None
        assert "ERROR_CHECKSUM" in info.value.reason
        assert transfer_mod._TEST_CORRUPTION.fired == 1
        # a peer sending wrong checksums gets the same answer
        raw = await raw_exchange(nodes[0].address,
                                 message(72, data, sums=b"\0" * 32))
        assert answer(raw)[1] == [ERROR_CHECKSUM]
        assert nodes[0].store.get(72) is None
        nursery.cancel_scope.cancel()


async def test_malformed_one_shot_messages_get_a_clear_error_and_the_server_keeps_serving(
        tmp_path, caplog):
    data = payload(2000, seed=4)

    async def main():
        async with trio.open_nursery() as nursery:
            meta, nodes = await start_cluster(nursery, tmp_path, 1, data_timeout=0.5)
            address = nodes[0].address
            head = encode_frame(op_header(WRITE_BLOCK_ONESHOT, block={"id": 81, "gs": 1},
                                          bytes_per_checksum=BPC))
            cases = [
                # header fields of the wrong type
                (message(80, data, targets="nope"), "ProtocolError"),
                (message(80, data, bytes_per_checksum="512"), "ProtocolError"),
                (message(80, data, bytes_per_checksum=100), "InvalidArgument"),
                (encode_frame({"op": WRITE_BLOCK_ONESHOT, "block": {"id": "x", "gs": 1}}),
                 "ProtocolError"),
                # a packet claiming more than any packet may carry
                (head + encode_packet_header(0, 0, 1 << 30, FLAG_LAST), "ProtocolError"),
                # not the block's single LAST packet
                (message(80, data, offset=512), "ProtocolError"),
                (message(80, data, flags=0), "ProtocolError"),
                (message(80, data, flags=FLAG_LAST | FLAG_SYNC), "ProtocolError"),
                # the header and no packet (the peer half-closes), half a packet
                (head, None),
                (head + encode_packet_header(0, 0, 4096, FLAG_LAST) + b"\0" * 100, None),
            ]
            for payload_bytes, error_type in cases:
                raw = await raw_exchange(address, payload_bytes)
                if error_type is None:
                    assert raw == b""   # the peer went away: nothing to answer
                    continue
                response, statuses = answer(raw)
                assert response["status"] == "ERROR" and statuses is None, response
                assert response["error"]["type"] == error_type, response
                assert "WRITE_BLOCK_ONESHOT" in response["message"] or \
                    error_type == "InvalidArgument", response
            # a peer that sends the header and stalls: refused after data_timeout
            framed = await connect(address)
            await framed.send_all(head + encode_packet_header(0, 0, 4096, FLAG_LAST))
            with trio.fail_after(5):
                response = await framed.receive_frame()
            assert response["status"] == "ERROR" and "did not arrive" in response["message"]
            await framed.aclose()
            # nothing was created by any of it, and a good write still works
            assert nodes[0].store.get(80) is None and nodes[0].store.get(81) is None
            await oneshot(nodes, 82, data)
            _, got, _ = await read_block(address, 82, 1)
            assert got == data
            assert nodes[0].server.transfer.budget.used == 0
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- the writer


def count_oneshots(monkeypatch) -> list:
    """A spy on the block servers' one-shot handler (the real one runs): the blocks served."""
    served = []
    real = transfer_mod.write_oneshot

    async def spy(server, conn, header, **kw):
        served.append(header["block"]["id"])
        await real(server, conn, header, **kw)

    monkeypatch.setattr(transfer_mod, "write_oneshot", spy)
    return served


async def meta_files(cluster, i: int, block_id: int) -> list:
    return sorted(p.name for p in cluster.storage_dirs[i].rglob(f"blk_{block_id}_*.meta"))


async def test_a_small_file_is_written_in_one_shot_and_reads_back(tmp_path, monkeypatch):
    served = count_oneshots(monkeypatch)
    data = payload(5000, seed=5)
    tail = payload(3 * KiB, seed=6)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/small", replication=3)
            await out.write(data)
            await out.close()
            assert await c.read_file("/small") == data
            blocks = (await c.get_block_locations("/small"))["blocks"]
            assert len(blocks) == 1 and len(blocks[0]["locations"]) == 3
            block = blocks[0]["block"]
            assert served == [block["id"]] * 3   # one message per node
            for i in range(3):
                # only a finalized replica, of the block's stamp, with every checksum
                names = await meta_files(cluster, i, block["id"])
                assert names == [f"blk_{block['id']}_{block['gs']}.meta"]
                path = next(cluster.storage_dirs[i].rglob(names[0]))
                assert "finalized" in path.parts
                assert path.read_bytes() == expected_meta(data)
            # a file of one full block and a one-packet tail: the tail goes in one shot
            out = await c.create("/two", replication=3)
            await out.write(payload(64 * KiB, seed=7) + tail)
            await out.close()
            assert await c.read_file("/two") == payload(64 * KiB, seed=7) + tail
            two = (await c.get_block_locations("/two"))["blocks"]
            assert served[3:] == [two[1]["block"]["id"]] * 3
            # hflush keeps the pipeline path
            out = await c.create("/flushed", replication=3)
            await out.write(data)
            await out.hflush()
            await out.close()
            assert await c.read_file("/flushed") == data
            assert len(served) == 6


async def test_writer_excludes_a_dead_node_and_retries_the_block(tmp_path, caplog):
    """Replication 3 on 3 block servers, one of them stopped: the metadata server still
    places blocks on it (it is not declared dead yet), so the one-shot fails at it; the
    writer abandons the block, excludes the node and writes a new block on the other two.
    The abandoned block's finalized replicas are then invalidated."""
    data = payload(7000, seed=8)
    caplog.set_level(logging.WARNING, logger="fs.writer")

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c:
            dead = cluster.storage_address(1)
            await cluster.stop_storage(1)
            out = await c.create("/f", replication=3)
            await out.write(data)
            await out.close()
            assert await c.read_file("/f") == data
            blocks = (await c.get_block_locations("/f"))["blocks"]
            assert len(blocks) == 1
            kept = blocks[0]["block"]
            assert dead not in [loc["address"] for loc in blocks[0]["locations"]]
            assert len(blocks[0]["locations"]) == 2
            abandoned = [r.getMessage() for r in caplog.records
                         if "abandoning" in r.getMessage()]
            assert len(abandoned) == 1 and dead in abandoned[0]
            # the survivors' replicas of the abandoned block go; the kept one stays
            lost_id = int(abandoned[0].split("for block ")[1].split()[0])
            assert lost_id != kept["id"]

            async def only_kept():
                for i in (0, 2):
                    if await meta_files(cluster, i, lost_id):
                        return False
                return True

            with trio.fail_after(20):
                while not await only_kept():
                    await trio.sleep(0.1)
            for i in (0, 2):
                assert await meta_files(cluster, i, kept["id"]) == \
                    [f"blk_{kept['id']}_{kept['gs']}.meta"]


async def test_writer_retries_a_block_refused_for_a_corrupted_packet(tmp_path, monkeypatch):
    monkeypatch.setenv(CORRUPT_PACKETS_ENV, "once")
    monkeypatch.setattr(transfer_mod, "_TEST_CORRUPTION", transfer_mod._CorruptionHook())
    data = payload(9000, seed=9)

    async with inprocess_cluster(tmp_path, n_storage=4, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/c", replication=3)
            await out.write(data)
            await out.close()
            assert transfer_mod._TEST_CORRUPTION.fired == 1
            assert await c.read_file("/c") == data
            blocks = (await c.get_block_locations("/c"))["blocks"]
            assert len(blocks) == 1 and len(blocks[0]["locations"]) == 3


def _count_calls(client) -> list[str]:
    """Record the method of every RPC ``client`` makes from now on."""
    calls: list[str] = []
    call = client.rpc.call

    async def recording(method, *args, **kwargs):
        calls.append(method)
        return await call(method, *args, **kwargs)

    client.rpc.call = recording
    return calls


async def test_a_create_that_allocates_the_first_block_saves_the_add_block_call(tmp_path):
    """``create(first_block=True)``: the small file's block comes with the create (no
    ``add_block``) and is written in one shot; a file closed empty gives its block back
    (``abandon_block``) and ends with no block; a second file's block ids follow on."""
    data = payload(5000, seed=9)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c:
            calls = _count_calls(c)
            out = await c.create("/small", replication=3, first_block=True)
            await out.write(data)
            await out.close()
            assert calls == ["create", "complete"]
            assert await c.read_file("/small") == data
            blocks = (await c.get_block_locations("/small"))["blocks"]
            assert len(blocks) == 1 and len(blocks[0]["locations"]) == 3
            assert blocks[0]["block"]["num_bytes"] == len(data)

            del calls[:]
            out = await c.create("/empty", first_block=True)
            await out.close()
            assert calls == ["create", "abandon_block", "complete"]
            status = await c.get_file_status("/empty")
            assert status.length == 0 and not status.under_construction
            assert (await c.get_block_locations("/empty"))["blocks"] == []

            # more than one block: the first from the create, the rest from add_block
            big = payload(64 * KiB + 3000, seed=10)
            del calls[:]
            out = await c.create("/big", first_block=True)
            await out.write(big)
            await out.close()
            assert calls.count("add_block") == 1
            assert await c.read_file("/big") == big


@pytest.mark.cluster(n_storage=3, **SMALL)
async def test_a_writer_that_dies_holding_an_unwritten_first_block_loses_nothing(cluster):
    """A writer created a file with its first block and went away before writing: another
    client's ``recover_lease`` closes the file empty (every holder answers that it has no
    replica), and the file can be written again."""
    async with cluster.client() as a, cluster.client() as b:
        out = await a.create("/orphan", first_block=True)
        out.abort(LeaseFSError("the writer went away"))   # no complete
        assert (await b.get_file_status("/orphan")).under_construction
        await recover_until_closed(b, "/orphan", timeout=30)
        status = await b.get_file_status("/orphan")
        assert status.length == 0 and not status.under_construction
        assert (await b.get_block_locations("/orphan"))["blocks"] == []
        again = await b.create("/orphan", overwrite=True, first_block=True)
        await again.write(b"x" * 100)
        await again.close()
        assert await b.read_file("/orphan") == b"x" * 100
