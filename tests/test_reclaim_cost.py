"""What reclaiming a big deleted subtree costs the metadata server: time proportional to what
it removes, whatever the subtree's shape, and never a long hold of the server's trio thread.

A real ``MetaServer`` on real LevelDB with its journal running; the files are created through
the namespace and journal directly (fast), the delete and the reclaim go through the
server's own calls, and a probe task asks ``get_file_info`` every few milliseconds the whole
time, as an RPC reader would. The folder is all the namespace holds: then nothing live
lies between a file's (absent) block keys and the folder's removed entries in LevelDB's key
order, the layout where a scan that finds nothing walks every tombstone."""

from __future__ import annotations

import gc
import time

import pytest
import trio

from fs.rpc import CallContext
from meta.namespace.invariants import check_namespace
from test_meta_server import inprocess_meta

N_FILES = 20_000
CTX = CallContext(client_id="t", peer="127.0.0.1:1", call_id=None)

# a cost measurement over 40 000 files: the longest CPU-bound test, and its bound on how late
# calls are answered is wall time, which a lane of parallel workers would be measuring too
pytestmark = pytest.mark.slow


class StepTimes(trio.abc.Instrument):
    """CPU time of every task step while ``on``: how long the trio thread was held (CPU
    time, so that other processes on a busy machine do not count as the server's)."""

    def __init__(self):
        self.on = False
        self.steps: list[float] = []
        self._started: float | None = None

    def before_task_step(self, task):
        self._started = time.thread_time()

    def after_task_step(self, task):
        if self.on and self._started is not None:
            self.steps.append(time.thread_time() - self._started)


async def _create(server, layout: str) -> None:
    ns, journal = server.ns, server.journal
    folders = [f"/big/d{i}" for i in range(100)] if layout == "spread" else ["/big"]
    for folder in folders:
        await journal.log(ns.planner.plan_mkdirs(folder, now_ns=1))

    async def make(first: int, last: int) -> None:
        for i in range(first, last):
            path = f"{folders[i % len(folders)]}/f{i:06d}"
            await journal.log(ns.planner.plan_create(path, holder="w", now_ns=2))
            ino = ns.view.get_file_info(path)["ino"]
            await journal.log(ns.planner.plan_close(ino, None, None, 3))

    async with trio.open_nursery() as nursery:     # concurrent: the journal groups fsyncs
        for k in range(100):
            nursery.start_soon(make, k * N_FILES // 100, (k + 1) * N_FILES // 100)


async def _delete_and_reclaim(folder, layout: str) -> dict:
    async with inprocess_meta(folder) as server:
        await _create(server, layout)
        assert server.ns.view.file_count() == N_FILES
        assert await server.namespace_protocol.rpc_delete(CTX, "/big", recursive=True)
        steps = StepTimes()
        lateness: list[float] = []
        reclaimed = trio.Event()

        async def probe():
            while not reclaimed.is_set():
                due = trio.current_time() + 0.005
                await trio.sleep_until(due)
                root = await server.namespace_protocol.rpc_get_file_info(CTX, "/")
                assert root["type"] == "dir"
                lateness.append(trio.current_time() - due)

        # collector pauses are the gc policy's business (meta/services/gcpolicy.py), not the reclaimer's
        gc.disable()
        trio.lowlevel.add_instrument(steps)
        steps.on = True
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe)
                with trio.fail_after(300):
                    while await server.monitors.reclaim_once():
                        await trio.sleep(0)
                reclaimed.set()
        finally:
            steps.on = False
            trio.lowlevel.remove_instrument(steps)
            gc.enable()
        total, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
        assert server.ns.view.file_count() == 0 and server.ns.view.dir_count() == 1
        assert check_namespace(server.kv) == []
        holds, late = sorted(steps.steps), sorted(lateness)
        return {"total": total, "cpu": cpu, "records": server.monitors.reclaim_records,
                "max_hold": holds[-1],
                "p99_hold": holds[int(len(holds) * 0.99)], "max_late": late[-1]}


def test_reclaiming_a_flat_folder_costs_what_it_removes_and_never_stalls_other_calls(
        tmp_path):
    """20 000 empty files in one folder and the same number spread over 100 folders: each
    reclaim costs about the same CPU time (each record costs what it removes: no rescans of
    what earlier records removed), no step holds the trio thread for long, and get_file_info
    calls issued during the reclaim are answered within a bound."""

    async def main():
        flat = await _delete_and_reclaim(tmp_path / "flat", "flat")
        spread = await _delete_and_reclaim(tmp_path / "spread", "spread")
        for name, run in (("flat", flat), ("spread", spread)):
            print(f"{name}: {run['records']} records in {run['total']:.2f} s ({run['cpu']:.2f} s "
                  f"CPU), trio-thread "
                  f"hold p99 {run['p99_hold'] * 1000:.1f} ms max {run['max_hold'] * 1000:.1f}"
                  f" ms, get_file_info late by at most {run['max_late'] * 1000:.1f} ms")
        assert flat["cpu"] < 3 * spread["cpu"] + 0.5, (flat, spread)
        for run in (flat, spread):
            assert run["p99_hold"] < 0.02, run
            assert run["max_hold"] < 0.1, run
            assert run["max_late"] < 1.0, run      # wall time: a busy machine adds to it

    trio.run(main)
