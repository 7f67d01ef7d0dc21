"""A frozen active metadata server (SIGSTOP: a long pause, a stuck disk) under client load,
with real etcd members, two metadata servers and a block server as processes: the clients
writing, and one started after the freeze, get through the new active about as soon as it
has taken over (as after a kill -9), not when the frozen one wakes; once it wakes nothing
acknowledged is lost and it follows as a standby."""

from __future__ import annotations

import random
import time

import pytest
import trio

from fs.client import AsyncClient
from hakit import HACluster, freeze_failover_bound

pytestmark = pytest.mark.slow

WRITERS = 4


def test_writers_get_through_a_frozen_active_within_the_failover_time(tmp_path):
    election = 2.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=1, election_timeout=election,
                        settings={"inline_max": 0, "replication": 1})
    frozen = None
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        # the frozen server first in every client's list: each starts there
        assert active == cluster.names[0], active
        config = cluster.config()
        acked: dict[str, tuple[bytes, float]] = {}   # path → data, when acknowledged
        failures: list[str] = []
        figures: dict[str, float] = {}

        async def writer(i: int, stop: trio.Event) -> None:
            async with AsyncClient(cluster.meta_address, config=config,
                                   client_name=f"writer-{i}") as client:
                n = 0
                while not stop.is_set():
                    n += 1
                    path, data = f"/load/w{i}/{n}", f"{i}:{n}:".encode() * 512
                    try:
                        await client.write_file(path, data)
                    except Exception as exc:   # noqa: BLE001 - the test lists them
                        failures.append(f"{path}: {exc!r}")
                        continue
                    acked[path] = (data, time.monotonic())

        async def main() -> None:
            nonlocal frozen
            stop = trio.Event()
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(WRITERS):
                        nursery.start_soon(writer, i, stop)
                    while len(acked) < 5 * WRITERS:
                        await trio.sleep(0.01)
                    # at any moment of the active's keepalive cycle (a third of the timeout)
                    await trio.sleep(random.uniform(0, election / 3))
                    await trio.to_thread.run_sync(cluster.pause, active)
                    frozen = time.monotonic()
                    begun = time.monotonic()
                    async with AsyncClient(cluster.meta_address, config=config,
                                           client_name="late") as late:
                        await late.write_file("/late", b"after the freeze")
                    figures["late"] = time.monotonic() - begun
                    acked["/late"] = (b"after the freeze", time.monotonic())
                    while not any(at > frozen for _, at in acked.values()):
                        await trio.sleep(0.01)
                    figures["first"] = min(at for _, at in acked.values()
                                           if at > frozen) - frozen
                    await trio.sleep(0.5)      # the writers go on through the new active
                    stop.set()

        trio.run(main)
        print(f"freeze: first write after {figures['first']:.2f} s, a client started "
              f"after it through in {figures['late']:.2f} s; {len(acked)} writes")
        bound = freeze_failover_bound(election)
        assert figures["first"] <= bound, figures
        assert figures["late"] <= bound, figures
        assert not failures, failures[:5]
        after = [p for p, (_, at) in acked.items() if at > frozen]
        assert len(after) > WRITERS, len(after)
        assert cluster.statuses()[standby]["role"] == "active"
        cluster.resume(active)
        frozen = None
        # the old active wakes, finds its term over and follows; the new one stays
        cluster.wait_role(active, "standby", timeout=30)
        assert cluster.wait_active() == standby
        with cluster.client() as client:
            lost = [p for p, (data, _) in acked.items() if client.read_file(p) != data]
        assert not lost, lost[:5]
    finally:
        if frozen is not None:
            cluster.resume(active)
        cluster.stop()
