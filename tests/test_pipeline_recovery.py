"""Write-pipeline recovery (HDFS DataStreamer): a block server that dies or corrupts packets in
the middle of a write is dropped, the block gets a new generation stamp, a replacement is
added when the replace-datanode policy says so, and the write goes on.

In-process clusters (real metadata server, real block servers, real sockets and replica
files) for the fast cases; ``ProcessCluster`` with ``kill -9`` of the first, the middle and
the last node of a live pipeline for the acceptance runs (64 MiB in 1 MiB blocks).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import trio

from fs import errors
from fs.client import Client
from harness import ProcessCluster, inprocess_cluster, make_test_config, wait_stopped
from meta.blocks import blocks as bm
from meta.blocks.blocks import BlockInfo, BlocksMap
from storage.transfer import CORRUPT_PACKETS_ENV
import storage.transfer as transfer_mod

KiB = 1 << 10
MiB = 1 << 20
BPC = 512
SMALL = dict(block_size=64 * KiB, bytes_per_checksum=BPC, packet_size=4 * KiB,
             write_window_packets=4)

pytestmark = pytest.mark.timeout(90)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def meta_stamps(storage_dir, block_id: int) -> list[int]:
    """Generation stamps of the meta files of ``block_id`` in one data folder."""
    return sorted(int(p.name.rsplit("_", 1)[1].split(".")[0])
                  for p in storage_dir.rglob(f"blk_{block_id}_*.meta"))


def running_index(cluster, address: str) -> int | None:
    """Index of the running block server at ``address``; None if none runs there."""
    for i in range(len(cluster.storage_dirs)):
        if cluster.storage[i] is not None and cluster.storage_address(i) == address:
            return i
    return None


def index_of(cluster, address: str) -> int:
    i = running_index(cluster, address)
    if i is None:
        raise AssertionError(f"no block server at {address}")
    return i


async def wait_finalized_everywhere(c, cluster, path: str, replicas: int, timeout=10.0):
    """Every block of ``path`` has ``replicas`` locations, each holding exactly one meta
    file, of the block's generation stamp, in finalized/."""
    with trio.fail_after(timeout):
        while True:
            blocks = (await c.get_block_locations(path))["blocks"]
            ok = True
            for b in blocks:
                if len(b["locations"]) != replicas:
                    ok = False
                for loc in b["locations"]:
                    i = running_index(cluster, loc["address"])
                    if i is None:
                        # a stopped block server is listed until the metadata server
                        # declares it dead (dead_node_interval), as in HDFS: not settled yet
                        ok = False
                        continue
                    folder = cluster.storage_dirs[i]
                    if meta_stamps(folder / "finalized", b["block"]["id"]) != [b["block"]["gs"]]:
                        ok = False
            if ok:
                return blocks
            await trio.sleep(0.05)


# --------------------------------------------------------------------------- pure


def test_blocks_map_update_pipeline_makes_dropped_replicas_stale():
    blocks = BlocksMap(min_replication=1)
    blocks.add(BlockInfo(7, ino=2, index=0, gs=100, num_bytes=0, state=bm.UNDER_CONSTRUCTION,
                         replication=3, expected=["a", "b", "c"]))
    for node in ("a", "b", "c"):
        blocks.add_replica(node, 7, 100, 0, bm.RBW)
    blocks.update_pipeline(7, 101, 4096, ["a", "c"])
    info = blocks.get(7)
    assert (info.gs, info.num_bytes, info.expected) == (101, 4096, ["a", "c"])
    assert info.location_nodes() == ["a", "c"]
    # the dropped node reports its old-stamp replica later: stale, never a location
    blocks.add_replica("b", 7, 100, 4096, bm.RBW)
    assert info.replicas["b"].corrupt and "b" not in info.location_nodes()
    # the survivors' reports with the new stamp keep them as locations
    blocks.add_replica("a", 7, 101, 4096, bm.RBW)
    assert not info.replicas["a"].corrupt and info.location_nodes() == ["a", "c"]
    assert blocks.counts() == blocks.recount()
    blocks.commit(7, 5000)
    with pytest.raises(errors.InvalidArgument):   # only a block being written
        blocks.update_pipeline(7, 102, 5000, ["a"])


# --------------------------------------------------------------------------- in process


async def test_a_node_stopped_mid_block_is_dropped_and_the_write_goes_on(tmp_path):
    """replication 3 on 4 nodes, policy never: the middle node dies mid-block; the block
    continues on the 2 survivors under a new stamp, later blocks use fresh pipelines."""
    data = payload(600 * KiB, seed=1)

    async with inprocess_cluster(tmp_path, n_storage=4, replace_datanode_on_failure="never",
                                 **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/f", replication=3)
            await out.write(data[:100 * KiB])     # block 0 done, block 1 in flight
            block = (await c.get_block_locations("/f"))["blocks"][-1]
            assert block["state"] == "UNDER_CONSTRUCTION"
            old_gs = block["block"]["gs"]
            victim = block["locations"][1]["address"]
            await cluster.stop_storage(index_of(cluster, victim))
            await out.write(data[100 * KiB:])
            await out.close()
            assert out.recoveries == 1
            assert await c.read_file("/f") == data
            blocks = (await c.get_block_locations("/f"))["blocks"]
            recovered = blocks[1]
            assert recovered["block"]["id"] == block["block"]["id"]
            assert recovered["block"]["gs"] > old_gs
            assert victim not in [loc["address"] for loc in recovered["locations"]]
            assert out.replacements == 0 and len(recovered["locations"]) >= 2
            for b in blocks:
                for loc in b["locations"]:
                    if loc["address"] == victim:   # stopped after block 0 was done
                        assert b["block"]["id"] < block["block"]["id"]
                        continue
                    folder = cluster.storage_dirs[index_of(cluster, loc["address"])]
                    assert meta_stamps(folder / "finalized", b["block"]["id"]) == \
                        [b["block"]["gs"]]


async def test_policy_always_adds_a_replacement_with_the_copied_bytes(tmp_path):
    data = payload(300 * KiB, seed=2)

    async with inprocess_cluster(tmp_path, n_storage=4, replace_datanode_on_failure="always",
                                 **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/g", replication=3)
            await out.write(data[:90 * KiB])
            await out.hflush()
            block = (await c.get_block_locations("/g"))["blocks"][-1]
            pipeline = [loc["address"] for loc in block["locations"]]
            victim = pipeline[0]
            await cluster.stop_storage(index_of(cluster, victim))
            await out.write(data[90 * KiB:])
            await out.close()
            assert out.recoveries == 1 and out.replacements == 1
            assert await c.read_file("/g") == data
            blocks = await wait_finalized_everywhere(c, cluster, "/g", replicas=3)
            recovered = [b for b in blocks if b["block"]["id"] == block["block"]["id"]][0]
            now = {loc["address"] for loc in recovered["locations"]}
            spare = now - set(pipeline)
            assert victim not in now and len(spare) == 1   # the replacement holds it
            # the replacement's copy is byte-identical to a survivor's
            copies = []
            for address in now:
                folder = cluster.storage_dirs[index_of(cluster, address)]
                files = [p for p in folder.rglob(f"blk_{block['block']['id']}")
                         if p.is_file()]
                copies.append(files[0].read_bytes())
            assert len(set(copies)) == 1 and len(copies[0]) == recovered["block"]["num_bytes"]


async def test_default_policy_replaces_only_after_hflush_and_fails_without_a_spare(tmp_path):
    """HDFS DEFAULT with replication 3: one node lost of 3 needs a replacement only for an
    hflushed block; without a spare block server that write fails clearly (best_effort off)
    and goes on with best_effort on."""
    for best_effort in (False, True):
        base = tmp_path / f"be{best_effort}"
        async with inprocess_cluster(base, n_storage=3,
                                     replace_datanode_best_effort=best_effort,
                                     **SMALL) as cluster:
            async with cluster.client() as c:
                out = await c.create("/h", replication=3)
                await out.write(payload(3000))
                await out.hflush()
                block = (await c.get_block_locations("/h"))["blocks"][0]
                victim = block["locations"][-1]["address"]
                await cluster.stop_storage(index_of(cluster, victim))
                rest = payload(40 * KiB, seed=3)
                if not best_effort:
                    with pytest.raises(errors.PipelineError) as info:
                        await out.write(rest)
                        await out.hflush()
                    message = str(info.value)
                    assert "replacement" in message and victim in message
                    assert "/h" in message and str(block["block"]["id"]) in message
                    continue
                await out.write(rest)
                await out.close()
                assert await c.read_file("/h") == payload(3000) + rest


async def test_default_policy_without_hflush_goes_on_with_two_of_three_nodes(tmp_path):
    """The other half of the documented rule: replication 3 on exactly 3 block servers,
    default policy, best effort off, no hflush: a node death needs no replacement, the write
    goes on with the two survivors."""
    first, rest = payload(20 * KiB, seed=8), payload(40 * KiB, seed=9)

    async with inprocess_cluster(tmp_path, n_storage=3, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/n", replication=3)
            await out.write(first)
            block = (await c.get_block_locations("/n"))["blocks"][0]
            victim = block["locations"][-1]["address"]
            await cluster.stop_storage(index_of(cluster, victim))
            await out.write(rest)
            await out.close()
            assert out.recoveries >= 1 and out.replacements == 0
            assert await c.read_file("/n") == first + rest


async def test_default_policy_adds_a_spare_after_hflush(tmp_path):
    data = payload(150 * KiB, seed=5)

    async with inprocess_cluster(tmp_path, n_storage=4, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/d", replication=3)
            await out.write(data[:20 * KiB])
            await out.hflush()
            block = (await c.get_block_locations("/d"))["blocks"][0]
            victim = block["locations"][1]["address"]
            await cluster.stop_storage(index_of(cluster, victim))
            await out.write(data[20 * KiB:])
            await out.close()
            assert out.recoveries == 1 and out.replacements == 1
            assert await c.read_file("/d") == data
            blocks = await wait_finalized_everywhere(c, cluster, "/d", replicas=3)
            assert victim not in [loc["address"] for loc in blocks[0]["locations"]]


async def test_checksum_corruption_once_in_flight_recovers(tmp_path, monkeypatch):
    monkeypatch.setenv(CORRUPT_PACKETS_ENV, "once")
    monkeypatch.setattr(transfer_mod, "_TEST_CORRUPTION", transfer_mod._CorruptionHook())
    data = payload(200 * KiB, seed=4)

    async with inprocess_cluster(tmp_path, n_storage=4, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/once", replication=3)
            await out.write(data)
            await out.close()
            assert out.recoveries == 1
            assert transfer_mod._TEST_CORRUPTION.fired == 1
            assert await c.read_file("/once") == data


async def test_checksum_corruption_on_every_packet_fails_after_the_retries(tmp_path, monkeypatch):
    monkeypatch.setenv(CORRUPT_PACKETS_ENV, "always")
    monkeypatch.setattr(transfer_mod, "_TEST_CORRUPTION", transfer_mod._CorruptionHook())

    async with inprocess_cluster(tmp_path, n_storage=4, pipeline_recovery_retries=3,
                                 replace_datanode_on_failure="always",
                                 replace_datanode_best_effort=True, **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/always", replication=3)
            with trio.fail_after(30):
                with pytest.raises(errors.PipelineError) as info:
                    await out.write(payload(50 * KiB))
                    await out.close()
            message = str(info.value)
            assert "/always" in message and "block" in message
            assert "giving up after 3 pipeline recoveries" in message \
                or "every block server" in message
            assert "ERROR_CHECKSUM" in message
            with pytest.raises(errors.PipelineError):
                await out.close()


@pytest.mark.cluster(n_storage=3, **SMALL)
async def test_update_pipeline_and_update_block_for_pipeline_refusals(cluster):
    async with cluster.client() as c, cluster.client() as other:
        out = await c.create("/r", replication=2)
        await out.write(payload(1000))
        await out.hflush()
        located = (await c.get_block_locations("/r"))["blocks"][0]
        block = located["block"]
        nodes = [loc["node_id"] for loc in located["locations"]]
        call = c.rpc.call
        # not the lease holder
        with pytest.raises(errors.LeaseExpired):
            await other.rpc.call("update_block_for_pipeline",
                                 {"block": block, "client_name": other.client_name})
        fresh = await call("update_block_for_pipeline",
                           {"block": block, "client_name": c.client_name})
        new_gs = fresh["block"]["gs"]
        assert new_gs > block["gs"]
        new_block = {"id": block["id"], "gs": new_gs, "num_bytes": 1000}
        with pytest.raises(errors.LeaseExpired):
            await other.rpc.call("update_pipeline", {
                "client_name": other.client_name, "old_block": block,
                "new_block": new_block, "new_nodes": nodes})
        # a stamp that is not larger
        with pytest.raises(errors.StaleGenerationStamp):
            await call("update_pipeline", {
                "client_name": c.client_name, "old_block": block,
                "new_block": {**new_block, "gs": block["gs"]}, "new_nodes": nodes})
        # a stamp never issued
        with pytest.raises(errors.StaleGenerationStamp):
            await call("update_pipeline", {
                "client_name": c.client_name, "old_block": block,
                "new_block": {**new_block, "gs": new_gs + 1000}, "new_nodes": nodes})
        # nothing changed so far
        blocks = (await c.get_block_locations("/r"))["blocks"]
        assert blocks[0]["block"]["gs"] == block["gs"]
        await out.close()
        # the block of a closed file: the writer holds no lease any more, and that
        # is what it is told (not the block's state)
        with pytest.raises(errors.LeaseExpired, match="No lease on /r"):
            await call("update_block_for_pipeline",
                       {"block": block, "client_name": c.client_name})
        with pytest.raises(errors.LeaseExpired, match="No lease on /r"):
            await call("update_pipeline", {
                "client_name": c.client_name, "old_block": block,
                "new_block": new_block, "new_nodes": nodes})
        # an unknown block
        with pytest.raises(errors.StaleGenerationStamp):
            await call("update_block_for_pipeline",
                       {"block": {"id": 10 ** 9, "gs": 1}, "client_name": c.client_name})
        assert await c.read_file("/r") == payload(1000)


@pytest.mark.cluster(n_storage=3, **SMALL)
async def test_update_pipeline_may_not_shrink_the_length(cluster):
    async with cluster.client() as c:
        out = await c.create("/s", replication=2)
        await out.write(payload(5000))
        await out.hsync()          # records 5000 bytes on the metadata server
        located = (await c.get_block_locations("/s"))["blocks"][0]
        block = {**located["block"], "num_bytes": 5000}
        fresh = await c.rpc.call("update_block_for_pipeline",
                                 {"block": block, "client_name": c.client_name})
        with pytest.raises(errors.InvalidArgument, match="shrink"):
            await c.rpc.call("update_pipeline", {
                "client_name": c.client_name, "old_block": block,
                "new_block": {"id": block["id"], "gs": fresh["block"]["gs"],
                              "num_bytes": 4000},
                "new_nodes": [loc["node_id"] for loc in located["locations"]]})
        await out.close()
        assert await c.read_file("/s") == payload(5000)


# --------------------------------------------------------------------------- real processes


def _kill_during_write(tmp_path, position: str, policy: str, hflush: bool = False,
                       total=64 * MiB):
    """64 MiB in 1 MiB blocks at replication 3 on 4 block servers; once a quarter is
    written (``hflush``: and flushed), ``kill -9`` the ``position`` node of the live
    pipeline; the write and close succeed, the file reads back exactly, every replica
    carries its block's final stamp, and the recovered block has a replacement replica
    exactly when the policy asks for one."""
    data = payload(total, seed=7)
    # packets well under the block size, so the block's pipeline is up (its first packets
    # sent) when the node dies
    with ProcessCluster(tmp_path, n_storage=4,
                        settings={"replication_interval": 0.5,
                                  "packet_size": 128 * KiB}) as cluster:
        config = make_test_config(packet_size=128 * KiB, write_window_packets=8,
                                  replace_datanode_on_failure=policy)
        ports = {cluster.ports[f"storage{i}"]: i for i in range(4)}
        with Client(cluster.meta_address, config=config) as c:
            started = time.monotonic()
            out = c.create("/big", replication=3, block_size=1 * MiB)
            step = 256 * KiB
            killed = None
            for pos in range(0, total, step):
                out.write(data[pos:pos + step])
                if killed is None and pos + step >= total // 4 + 512 * KiB:
                    if hflush:
                        out.flush()
                    last = c.get_block_locations("/big")["blocks"][-1]
                    assert last["state"] == "UNDER_CONSTRUCTION"
                    pipeline = [loc["address"] for loc in last["locations"]]
                    assert len(pipeline) == 3
                    killed = {"first": pipeline[0], "middle": pipeline[1],
                              "last": pipeline[2]}[position]
                    killed_in, gs_at_kill = last["block"]["id"], last["block"]["gs"]
                    cluster.kill_storage(ports[int(killed.rsplit(":", 1)[1])], signal.SIGKILL)
            out.close()
            assert out._stream.recoveries >= 1
            with c.open("/big") as f:
                assert f.read() == data
            blocks = c.get_block_locations("/big")["blocks"]
            assert len(blocks) == total // MiB
            recovered = [b for b in blocks if b["block"]["id"] == killed_in][0]
            assert recovered["block"]["gs"] > gs_at_kill
            replaced = policy == "always" or (policy == "default" and hflush)
            assert out._stream.replacements == (1 if replaced else 0)
            # without a replacement the metadata server's re-replication may add the third
            assert len(recovered["locations"]) == 3 if replaced else \
                len(recovered["locations"]) >= 2
            assert killed not in [loc["address"] for loc in recovered["locations"]]
            for b in blocks:
                assert b["locations"], b
                for loc in b["locations"]:
                    if loc["address"] == killed:   # finished before the kill (not dead yet)
                        assert b["block"]["id"] < killed_in
                        continue
                    folder = cluster.storage_dir(ports[int(loc["address"].rsplit(":", 1)[1])])
                    assert meta_stamps(folder / "finalized", b["block"]["id"]) == \
                        [b["block"]["gs"]], (b, loc)
            written = time.monotonic()
            # then repair: the dead node is noticed and every block has 3 good replicas on
            # the three servers left (the spare included)
            while True:
                blocks = c.get_block_locations("/big")["blocks"]
                short = [b["block"]["id"] for b in blocks
                         if len([loc for loc in b["locations"] if loc["address"] != killed]) < 3
                         or any(loc["address"] == killed for loc in b["locations"])]
                if not short:
                    break
                assert time.monotonic() - written < 60, f"still under-replicated: {short}"
                time.sleep(0.25)
            repaired = time.monotonic() - written
            print(f"kill {position}: written in {written - started:.1f} s, 3 replicas "
                  f"again {repaired:.1f} s later")
            return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill_first_node_of_the_pipeline_mid_write(tmp_path):
    assert _kill_during_write(tmp_path, "first", "always") < 90


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill_middle_node_of_the_pipeline_mid_write(tmp_path):
    assert _kill_during_write(tmp_path, "middle", "default", hflush=True) < 90


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_kill_last_node_of_the_pipeline_mid_write(tmp_path):
    assert _kill_during_write(tmp_path, "last", "never") < 90


async def test_block_server_refuses_bad_recovery_and_transfer_requests(tmp_path):
    """STREAMING_RECOVERY to more bytes than the replica holds or with a stamp that is not
    newer, and a TRANSFER asking for more than was acknowledged, get an error response;
    the replica and the writer's stream are unharmed."""
    from fs.datatransfer import (PIPELINE_SETUP_STREAMING_RECOVERY, TRANSFER_BLOCK,
                                 TRANSFER_RBW, WRITE_BLOCK)
    from fs.framing import FramedStream
    from fs.rpc import parse_address

    async def ask(address: str, header: dict) -> dict:
        host, port = parse_address(address)
        framed = FramedStream(await trio.open_tcp_stream(host, port), 1 << 20)
        try:
            await framed.send_frame(header)
            return await framed.receive_frame()
        finally:
            await framed.aclose()

    # the replica's own checks, which come after the token's (security = secure refuses
    # these stamps for want of a token first: tests/test_block_tokens.py)
    async with inprocess_cluster(tmp_path, n_storage=3, security="simple",
                                 **SMALL) as cluster:
        async with cluster.client() as c:
            out = await c.create("/x", replication=2)
            await out.write(payload(3000))
            await out.hflush()
            located = (await c.get_block_locations("/x"))["blocks"][0]
            block = located["block"]
            a, b = [loc["address"] for loc in located["locations"]]
            base = {"op": WRITE_BLOCK, "targets": [], "client": "t",
                    "stage": PIPELINE_SETUP_STREAMING_RECOVERY, "bytes_per_checksum": BPC}
            resp = await ask(b, {**base, "block": {"id": block["id"], "gs": block["gs"] + 50},
                                 "min_bytes": 999_999})
            assert resp["status"] == "ERROR" and "fewer than" in resp["message"]
            resp = await ask(b, {**base, "block": {"id": block["id"], "gs": block["gs"]},
                                 "min_bytes": 3000})
            assert resp["status"] == "ERROR" and "StaleGenerationStamp" in resp["message"]
            spare = [cluster.storage_address(i) for i in range(3)
                     if cluster.storage_address(i) not in (a, b)][0]
            resp = await ask(a, {"op": TRANSFER_BLOCK, "stage": TRANSFER_RBW,
                                 "block": {**block, "num_bytes": 10_000}, "targets": [spare]})
            assert resp["status"] == "ERROR" and "acknowledged" in resp["message"]
            # the refused recovery stopped b's writer (HDFS recoverRbw stops it first):
            # the stream drops b and goes on with a
            await out.write(payload(5000, seed=1))
            await out.close()
            assert out.recoveries == 1
            assert await c.read_file("/x") == payload(3000) + payload(5000, seed=1)


SILENT_TIMEOUT = 3.0   # data_timeout of the silent-node test (servers and client)
SILENT_STEP = 1.5      # data_ack_timeout_step: the ladder's rungs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_silent_middle_node_is_the_one_dropped_and_replaced(tmp_path):
    """SIGSTOP the middle node of a live replication-3 pipeline (no RST, nothing answers):
    the first node times out on it one ladder step before the client gives up on the first
    node, and acks ERROR at its index, so the next hflush goes through within about one
    data_timeout with the silent node dropped, not the healthy first one, and a spare
    added; every acknowledged byte reads back once the node runs again and the file is
    closed."""
    timeouts = {"data_timeout": SILENT_TIMEOUT, "data_ack_timeout_step": SILENT_STEP}
    with ProcessCluster(tmp_path, n_storage=4, settings=timeouts) as cluster:
        config = make_test_config(packet_size=64 * KiB, **timeouts)
        ports = {cluster.ports[f"storage{i}"]: i for i in range(4)}
        data = payload(384 * KiB, seed=11)
        with Client(cluster.meta_address, config=config) as c:
            out = c.create("/silent", replication=3, block_size=1 * MiB)
            out.write(data[:128 * KiB])
            out.flush()
            before = [n["address"] for n in out._stream._pipeline.nodes]
            assert len(before) == 3
            middle = before[1]
            victim = cluster.pid(f"storage{ports[int(middle.rsplit(':', 1)[1])]}")
            os.kill(victim, signal.SIGSTOP)
            try:
                wait_stopped(victim)
                out.write(data[128 * KiB:256 * KiB])
                started = time.monotonic()
                out.flush()
                took = time.monotonic() - started
                after = [n["address"] for n in out._stream._pipeline.nodes]
            finally:
                os.kill(victim, signal.SIGCONT)
            print(f"hflush past a silent middle node: {took:.2f} s; {before} -> {after}")
            # the first node waits data_timeout + 2 steps on the silent one, the client
            # one step more: the answer comes from the ladder, not the client's timeout
            assert took < SILENT_TIMEOUT + 2 * SILENT_STEP + 5, took
            assert middle not in after
            assert after[:2] == [before[0], before[2]], (before, after)
            assert len(after) == 3 and out._stream.replacements == 1
            out.write(data[256 * KiB:])
            out.close()
            with c.open("/silent") as f:
                assert f.read() == data
            block = c.get_block_locations("/silent")["blocks"][0]
            assert middle not in [loc["address"] for loc in block["locations"]]
            assert len(block["locations"]) == 3
