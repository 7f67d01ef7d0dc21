"""PATCH_BLOCK, the data-transfer op that writes byte ranges into a finalized block's
replicas under a new generation stamp (``storage/patch.py``, client ``fs/patching.py``):
in-process block servers on loopback with a fake metadata server (a chain of three, a dead
or refusing downstream, a range corrupted in flight, malformed headers), then real block
server processes: a file written by the normal client patched through its chain and read back
replica by replica, and a block server killed with SIGKILL while patches stream into it,
whose replica comes back at one complete version with valid checksums."""

from __future__ import annotations

import os
import random
import threading

import pytest
import trio

from harness import ProcessCluster, free_port, storage_index
from test_storage import (BPC, block_length, connect, make_config, read_block, replica_paths,
                          start_cluster, wait_for)

from fs.datatransfer import ERROR, ERROR_CHECKSUM, SUCCESS, chunk_checksums
from fs.errors import ProtocolError, ServerUnavailable
from fs.framing import encode_frame
from fs.patching import patch_header, send_patch

pytestmark = pytest.mark.timeout(120)

MAX = 1 << 20


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def model_after(old: bytes, ranges) -> bytes:
    out = bytearray(old)
    for offset, data in ranges:
        if offset + len(data) > len(out):
            out.extend(b"\0" * (offset + len(data) - len(out)))
        out[offset:offset + len(data)] = data
    return bytes(out)


async def oneshot_block(nodes, block_id: int, data: bytes, gs: int = 1) -> None:
    from fs.pipeline import write_oneshot
    await write_oneshot(path="/t", located={
        "block": {"id": block_id, "gs": gs, "num_bytes": 0},
        "locations": [{"address": n.address, "node_id": n.node_id} for n in nodes]},
        client_name="t", bytes_per_checksum=BPC, data=data, sums=chunk_checksums(data, BPC),
        timeout=10, connect_timeout=10, max_frame=1 << 20)


async def raw_patch(address: str, header: dict, body: bytes) -> dict:
    framed = await connect(address)
    try:
        await framed.send_all(encode_frame(header) + body)
        return await framed.receive_frame()
    finally:
        await framed.aclose()


def node_files(node, block_id: int, gs: int) -> tuple[bytes, bytes]:
    data_path, meta_path = replica_paths(node, block_id, gs)
    return data_path.read_bytes(), meta_path.read_bytes()


# --------------------------------------------------------------------------- in-process


async def test_a_patch_goes_down_the_chain_and_every_replica_is_the_new_version(tmp_path):
    old = payload(10_000, 1)
    ranges = [(3, payload(10, 2)), (5000, payload(700, 3)), (9990, payload(3000, 4))]
    new = model_after(old, ranges)
    async with trio.open_nursery() as nursery:
        meta, nodes = await start_cluster(nursery, tmp_path, 3)
        await oneshot_block(nodes, 41, old)
        config = make_config()
        statuses = await send_patch(config, [n.address for n in nodes], 41, 1, 2, MAX, ranges)
        assert statuses == [SUCCESS] * 3
        for node in nodes:
            replica = node.store.get(41)
            assert replica.gs == 2 and replica.num_bytes == len(new)
            data, meta_bytes = node_files(node, 41, 2)
            assert data == new and meta_bytes[7:] == chunk_checksums(new, BPC)
            response, got, _ = await read_block(node.address, 41, 2)
            assert response["visible_length"] == len(new) and got == new
        await wait_for(lambda: all([41, 2, len(new), "FINALIZED"] in meta.received(n.node_id)
                                   for n in nodes))
        # the same patch again (its answer lost): every node says SUCCESS, nothing changes
        assert await send_patch(config, [n.address for n in nodes], 41, 1, 2, MAX,
                                ranges) == [SUCCESS] * 3
        nursery.cancel_scope.cancel()


async def test_an_unreachable_or_refusing_downstream_is_error_at_its_index(tmp_path):
    old = payload(3000, 5)
    ranges = [(100, b"patched")]
    async with trio.open_nursery() as nursery:
        _meta, nodes = await start_cluster(nursery, tmp_path, 3)
        await oneshot_block(nodes, 7, old)
        config = make_config()
        dead = f"127.0.0.1:{free_port()}"
        statuses = await send_patch(config, [nodes[0].address, dead, nodes[2].address], 7, 1,
                                    2, MAX, ranges)
        assert statuses == [SUCCESS, ERROR, ERROR]
        assert nodes[0].store.get(7).gs == 2 and nodes[2].store.get(7).gs == 1
        # node 1 holds the block at another stamp: it refuses, the others go on
        await oneshot_block(nodes[1:2], 8, old, gs=5)
        await oneshot_block([nodes[0], nodes[2]], 8, old, gs=1)
        statuses = await send_patch(config, [n.address for n in nodes], 8, 1, 2, MAX, ranges)
        assert statuses == [SUCCESS, ERROR, SUCCESS]
        assert [n.store.get(8).gs for n in nodes] == [2, 5, 2]
        # the first node unreachable: every status ERROR, no exception
        assert await send_patch(config, [dead, nodes[0].address], 8, 1, 3, MAX,
                                ranges) == [ERROR, ERROR]
        nursery.cancel_scope.cancel()


async def test_a_range_corrupted_in_flight_is_error_checksum_and_changes_nothing(tmp_path):
    old = payload(3000, 6)
    async with trio.open_nursery() as nursery:
        _meta, nodes = await start_cluster(nursery, tmp_path, 2)
        await oneshot_block(nodes, 9, old)
        before = [node_files(n, 9, 1) for n in nodes]
        header = patch_header(9, 1, 2, MAX, [nodes[1].address], [(10, b"abcdef")])
        response = await raw_patch(nodes[0].address, header, b"abcdeX")
        assert response["status"] == "ERROR"
        assert response["statuses"] == [ERROR_CHECKSUM, ERROR]
        assert [node_files(n, 9, 1) for n in nodes] == before
        assert all(n.store.get(9).gs == 1 for n in nodes)
        # between block servers: node 1 finds it, node 0 applied its good copy
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("change,words", [
    ({"new_gs": 1}, "must be above"),
    ({"new_gs": "2"}, "wrong type"),
    ({"max_length": 0}, "positive"),
    ({"ranges": [[10, 5], [12, 5]], "crcs": [0, 0]}, "overlapping"),
    ({"ranges": [[10, 0]], "crcs": [0]}, "empty"),
    ({"ranges": [[0, 1]] * 4097, "crcs": [0] * 4097}, "ranges"),
    ({"crcs": []}, "crcs for"),
    ({"ranges": [[0, 17 << 20]], "crcs": [0]}, "more than"),
    ({"ranges": [[MAX - 1, 2]], "crcs": [0]}, "past max_length"),
    ({"targets": ["nonsense"]}, "HOST:PORT"),
])
async def test_malformed_patch_headers_get_a_clear_error_and_change_nothing(tmp_path, change,
                                                                            words):
    old = payload(2000, 7)
    async with trio.open_nursery() as nursery:
        _meta, nodes = await start_cluster(nursery, tmp_path, 1)
        await oneshot_block(nodes, 3, old)
        before = node_files(nodes[0], 3, 1)
        header = {**patch_header(3, 1, 2, MAX, [], [(0, b"xy")]), **change}
        response = await raw_patch(nodes[0].address, header, b"xy")
        assert response["status"] == "ERROR" and "statuses" not in response
        assert words in response["message"], response["message"]
        assert node_files(nodes[0], 3, 1) == before and nodes[0].store.get(3).gs == 1
        # the client helper raises the refusal; the server keeps serving
        with pytest.raises(ProtocolError):
            await send_patch(make_config(), [nodes[0].address], 3, 1, 2, MAX,
                             [(5, b"a"), (4, b"b")])
        assert (await block_length(nodes[0].address, 3, 1))["visible_length"] == len(old)
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- real processes


SETTINGS = {"security": "simple", "bytes_per_checksum": BPC, "replication": 3}
BLOCK_SIZE = 256 * 1024


async def read_replica(address: str, block_id: int, gs: int) -> bytes | None:
    """The replica at ``gs`` through READ_BLOCK, every checksum verified (None: refused)."""
    response, data, _ = await read_block(address, block_id, gs)
    return data


async def until_serving(address: str, timeout: float = 30.0) -> None:
    """Until the block server at ``address`` accepts a data connection again."""
    with trio.fail_after(timeout):
        while True:
            try:
                framed = await connect(address)
            except (OSError, ServerUnavailable):
                await trio.sleep(0.05)
                continue
            await framed.aclose()
            return


def disk_versions(cluster: ProcessCluster, index: int, block_id: int) -> tuple[int, bytes, bytes]:
    """``(gs, data, meta)`` of the replica files of ``block_id`` on block server ``index``
    (after its restart): exactly one meta file, no redo file left."""
    root = cluster.storage_dir(index) / "finalized"
    files = [p for p in root.rglob(f"blk_{block_id}*")]
    metas = [p for p in files if p.name.endswith(".meta")]
    assert len(metas) == 1 and not [p for p in files if p.name.endswith(".patch")], files
    data = next(p for p in files if p.name == f"blk_{block_id}")
    gs = int(metas[0].name[:-len(".meta")].rsplit("_", 1)[1])
    return gs, data.read_bytes(), metas[0].read_bytes()


@pytest.mark.slow
@pytest.mark.allow_log_errors(r".*", reason="block servers are killed with SIGKILL")
def test_patches_through_real_block_servers_and_a_kill_9_leaves_one_version(tmp_path):
    with ProcessCluster(tmp_path, n_storage=3, settings=SETTINGS) as cluster:
        config = cluster.config()
        content = payload(2 * BLOCK_SIZE + 5000, 8)   # two full blocks and a partial one
        with cluster.client() as client:
            client.write_file("/f", content, block_size=BLOCK_SIZE)
            located = client.get_block_locations("/f")["blocks"]
        assert len(located) == 3
        last = located[-1]
        block_id, gs = last["block"]["id"], last["block"]["gs"]
        addresses = [loc["address"] for loc in last["locations"]]
        old = content[2 * BLOCK_SIZE:]
        ranges = [(1, payload(100, 9)), (4000, payload(3000, 10))]   # grows it too
        new = model_after(old, ranges)

        async def patch_and_read() -> None:
            statuses = await send_patch(config, addresses, block_id, gs, gs + 100,
                                        BLOCK_SIZE, ranges)
            assert statuses == [SUCCESS] * 3
            for address in addresses:
                assert await read_replica(address, block_id, gs + 100) == new

        trio.run(patch_and_read)

        # one block server killed while patches stream into it (it alone, no chain)
        victim_address = addresses[0]
        victim = storage_index(cluster, victim_address)
        versions = {gs + 100: new}
        current = [gs + 100]
        rng = random.Random(11)
        for round_ in range(3):
            acknowledged: list[int] = []
            stop = threading.Event()

            async def stream_patches() -> None:
                while not stop.is_set():
                    base = current[0]
                    step = [(rng.randrange(0, 6000), payload(rng.randrange(1, 200_000),
                                                              base))]
                    step = [(o, d[:BLOCK_SIZE - o]) for o, d in step]
                    versions[base + 1] = model_after(versions[base], step)
                    statuses = await send_patch(config, [victim_address], block_id, base,
                                                base + 1, BLOCK_SIZE, step, timeout=10)
                    if statuses != [SUCCESS]:
                        return   # killed
                    acknowledged.append(base + 1)
                    current[0] = base + 1

            async def kill_later() -> None:
                # some patches in, then SIGKILL at a random point of the next ones
                with trio.fail_after(60):
                    while len(acknowledged) < 2:
                        await trio.sleep(0.01)
                # fixed-sleep: the kill lands at a random point of the next patches
                await trio.sleep(rng.random() * 0.05)
                await trio.to_thread.run_sync(cluster.kill_storage, victim)
                stop.set()

            async def one_round() -> None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream_patches)
                    nursery.start_soon(kill_later)

            trio.run(one_round)
            # what the kill left (a redo file if it hit a patch) is resolved by the restart
            cluster.start_storage(victim)
            served: list[bytes] = []

            async def read_back() -> None:
                await until_serving(victim_address)
                with trio.fail_after(30):
                    while True:   # the replica map is loaded before it serves reads
                        got = await read_replica(victim_address, block_id, current[0])
                        if got is not None:
                            served.append(got)
                            return
                        await trio.sleep(0.05)

            trio.run(read_back)
            on_disk_gs, data, meta = disk_versions(cluster, victim, block_id)
            # the last acknowledged version, or the one in flight when the kill hit
            assert on_disk_gs in (current[0], current[0] + 1), (round_, on_disk_gs, current)
            assert data == versions[on_disk_gs] == served[0]
            assert meta[7:] == chunk_checksums(data, BPC)
            current[0] = on_disk_gs
        assert os.path.exists(cluster.storage_dir(victim))
