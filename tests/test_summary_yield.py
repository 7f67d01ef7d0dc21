"""A summary of one huge folder (content summary: ``count``, ``du -s``; ``fsck``) on a real
metadata server process does not hold the other clients: the subtree walk reads a folder's
entries a page at a time and yields by the clock (``meta.namespace.timeslice``).

The folder is built fast in process (the namespace and journal directly, as
``test_reclaim_cost`` does), then a real ``leasefs meta`` process serves it: one client asks
for the summary while another calls getFileInfo back to back over its own connection."""

from __future__ import annotations

import time

import pytest
import trio

from fs.client import AsyncClient
from harness import ProcessCluster
from test_meta_server import inprocess_meta

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

N_FILES = 50_000
N_DIRS = 40    # a few subfolders among the files: the walk goes down and back up


async def _build(folder) -> None:
    async with inprocess_meta(folder) as server:
        ns, journal = server.ns, server.journal
        await journal.log(ns.planner.plan_mkdirs("/big", now_ns=1))
        for d in range(N_DIRS):
            await journal.log(ns.planner.plan_mkdirs(f"/big/d{d:02d}/sub", now_ns=1))

        async def make(first: int, last: int) -> None:
            for i in range(first, last):
                path = f"/big/f{i:06d}" if i % 10 else f"/big/d{i % N_DIRS:02d}/f{i:06d}"
                # written, not each fsynced: the checkpoint below makes it all durable
                await journal.log(ns.planner.plan_create(path, holder="w", now_ns=2), durable=False)
                ino = ns.view.get_file_info(path)["ino"]
                await journal.log(ns.planner.plan_close(ino, None, None, 3, data=b"x" * (i % 7)),
                                  durable=False)

        async with trio.open_nursery() as nursery:   # concurrent: the journal groups fsyncs
            for k in range(100):
                nursery.start_soon(make, k * N_FILES // 100, (k + 1) * N_FILES // 100)
        await server.monitors.checkpoint()


async def _summary_while_probing(address: str, config, call) -> tuple[float, list[float], object]:
    """``call(client)`` on one client while another calls getFileInfo back to back: the
    call's wall time, the probe latencies during it, the call's answer."""
    done, probing_started = trio.Event(), trio.Event()
    latencies: list[float] = []
    async with AsyncClient(address, config=config) as probe, \
            AsyncClient(address, config=config) as caller:
        await probe.get_file_status("/big")
        await caller.get_file_status("/big")

        async def probing():
            while not done.is_set():
                started = time.perf_counter()
                await probe.get_file_status("/big/f000001")
                latencies.append(time.perf_counter() - started)
                probing_started.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probing)
            await probing_started.wait()
            latencies.clear()
            started = time.perf_counter()
            answer = await call(caller)
            took = time.perf_counter() - started
            done.set()
    return took, latencies, answer


def test_a_summary_of_a_huge_folder_lets_other_clients_through(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=0)
    trio.run(_build, cluster.meta_dir())
    cluster.start_meta()
    try:
        cluster.wait_ready(0)
        config = cluster.config()
        expected_length = sum(i % 7 for i in range(N_FILES))

        async def count(client):
            return await client.content_summary("/big")

        async def fsck(client):
            return await client._call("fsck", path="/big")

        for name, call in (("content summary", count), ("fsck", fsck)):
            took, latencies, answer = trio.run(_summary_while_probing, cluster.meta_address,
                                               config, call)
            # the answer counts exactly what the folder holds
            if call is count:
                assert (answer["file_count"], answer["directory_count"], answer["length"]) \
                    == (N_FILES, 1 + 2 * N_DIRS, expected_length)
            else:
                totals = answer["totals"]
                assert (totals["files"], totals["directories"], totals["total_size"]) == (
                    N_FILES, 1 + 2 * N_DIRS, expected_length), totals
            worst = max(latencies, default=took)
            print(f"{name} of {N_FILES} entries: {took * 1000:.0f} ms; {len(latencies)} "
                  f"getFileInfo calls meanwhile, slowest {worst * 1000:.1f} ms, median "
                  f"{sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
            # unyielding, the walk of the flat folder is one step: the probe waits about
            # the whole call; yielding every few ms, calls pass all along
            assert len(latencies) >= 20, (name, took, latencies)
            assert worst < took / 5, (name, took, worst)
    finally:
        cluster.stop()
