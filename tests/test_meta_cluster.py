"""The metadata server inside a real in-process cluster (real block servers, real client):
behaviour that only shows when the metadata server restarts under live writers or when a
heartbeat reply is lost."""

from __future__ import annotations

import random

import pytest
import trio

from fs import errors


KiB = 1 << 10
BLOCK = 64 * KiB
SMALL = dict(block_size=BLOCK, bytes_per_checksum=512, packet_size=4 * KiB,
             write_window_packets=4, replication=2)

pytestmark = pytest.mark.timeout(90)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.mark.cluster(n_storage=3, **SMALL)
async def test_hflushed_bytes_of_an_open_file_survive_a_metadata_server_restart(cluster):
    """Finding 5: after a restart the under-construction last block must have locations
    (the RBW/RWR replicas the block servers re-report), so a new reader sees every
    hflushed byte, not the file cut at the last complete block."""
    data = payload(BLOCK + 5000, seed=1)
    async with cluster.client() as writer:
        out = await writer.create("/open/f")
        await out.write(data)
        await out.hflush()
        before = await writer.get_block_locations("/open/f")
        uc = before["blocks"][-1]
        assert uc["state"] == "UNDER_CONSTRUCTION" and len(uc["locations"]) == 2

        await cluster.stop_meta()
        await cluster.start_meta()
        await cluster.wait_ready(3)
        # the block servers re-registered and re-reported their replicas
        async with cluster.client() as reader:
            with trio.fail_after(10):
                while True:
                    located = await reader.get_block_locations("/open/f")
                    if len(located["blocks"][-1]["locations"]) == 2:
                        break
                    await trio.sleep(0.05)
            last = located["blocks"][-1]
            assert last["block"]["id"] == uc["block"]["id"]
            assert {n["node_id"] for n in last["locations"]} == \
                {n["node_id"] for n in uc["locations"]}
            assert located["under_construction"]
            assert await reader.read_file("/open/f") == data

        # the writer's stream: it may fail on the restart, but never corrupts
        more = payload(3000, seed=2)
        try:
            await out.write(more)
            await out.close()
            expected = data + more
        except errors.LeaseFSError:
            expected = None
        async with cluster.client() as reader:
            if expected is not None:
                st = await reader.get_file_status("/open/f")
                assert not st.under_construction and st.length == len(expected)
                assert await reader.read_file("/open/f") == expected
            else:   # still readable up to what was hflushed
                got = await reader.read_file("/open/f")
                assert got[:len(data)] == data
