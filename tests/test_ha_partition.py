"""A silently partitioned active metadata server (cut from etcd and from everyone else by
proxies that stop forwarding: nothing killed, no connection reset), with real etcd members,
two metadata servers and a block server as processes, under client load.

Clients with calls in flight, and one started during the cut, get through the new active
about as soon as it has taken over (as after a kill -9, plus one probe for the active), not
after their retry budget; the cut-off server stops calling itself active once its etcd
lease can have expired (its own clock says so: no answer from etcd needed), so its status
never shows two actives; after the heal it follows as a standby and nothing acknowledged
is lost."""

from __future__ import annotations

import random
import time

import pytest
import trio

from fs.client import AsyncClient
from hakit import HACluster, ha_status, freeze_failover_bound

pytestmark = pytest.mark.slow

WRITERS = 4


def test_writers_get_through_a_partitioned_active_within_the_failover_time(tmp_path):
    election = 2.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=1, election_timeout=election,
                        settings={"inline_max": 0, "replication": 1}, cuttable=True)
    cut = None
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        # the cut-off server first in every client's list: each starts there
        assert active == cluster.names[0], active
        config = cluster.config()
        acked: dict[str, tuple[bytes, float]] = {}   # path → data, when acknowledged
        failures: list[str] = []
        figures: dict[str, float] = {}
        roles: list[tuple[float, str]] = []   # (seconds after the cut, its own role)

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
                        failures.append(f"{path}: {exc!r} after "
                                        f"{time.monotonic() - (cut or 0):.1f} s")
                        continue
                    acked[path] = (data, time.monotonic())

        async def watch_role(stop: trio.Event) -> None:
            """The cut-off server's role as it says itself (past the proxies)."""
            from fs.haclient import call_each
            while not stop.is_set():
                answer = (await call_each([cluster.direct(active)], timeout=0.5))
                status = answer[cluster.direct(active)][0]
                if status is not None:
                    roles.append((time.monotonic() - cut, status["role"]))
                await trio.sleep(0.05)

        async def main() -> None:
            nonlocal cut
            stop = trio.Event()
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(WRITERS):
                        nursery.start_soon(writer, i, stop)
                    while len(acked) < 5 * WRITERS:
                        await trio.sleep(0.01)
                    # at any moment of the active's keepalive cycle (a third of the timeout)
                    await trio.sleep(random.uniform(0, election / 3))
                    cluster.cut(active)
                    cut = time.monotonic()
                    nursery.start_soon(watch_role, stop)
                    async with AsyncClient(cluster.meta_address, config=config,
                                           client_name="late") as late:
                        await late.write_file("/late", b"after the cut")
                    figures["late"] = time.monotonic() - cut
                    acked["/late"] = (b"after the cut", time.monotonic())
                    while not any(at > cut for _, at in acked.values()):
                        await trio.sleep(0.01)
                    figures["first"] = min(at for _, at in acked.values() if at > cut) - cut
                    await trio.sleep(max(0.5, election + 0.5 - (time.monotonic() - cut)))
                    stop.set()

        trio.run(main)
        demoted = next((at for at, role in roles if role != "active"), None)
        print(f"partition: first write after {figures['first']:.2f} s, a client started "
              f"after it through in {figures['late']:.2f} s; the cut-off server stopped "
              f"saying active after {demoted} s; {len(acked)} writes")
        bound = freeze_failover_bound(election)
        assert figures["first"] <= bound, figures
        assert figures["late"] <= bound, figures
        assert not failures, failures[:5]
        # never two actives: the cut-off server drops the role before a successor can
        # have won (its lease's TTL from the last keepalive it sent, less the margin)
        assert demoted is not None and demoted < election, roles[-5:]
        assert all(role != "active" for at, role in roles if at >= election), roles[-5:]
        assert cluster.statuses()[standby]["role"] == "active"
        cluster.heal(active)
        cut = None
        # healed, it finds its term over and follows; the new one stays
        cluster.wait_role(active, "standby", timeout=30)
        assert cluster.wait_active() == standby
        with cluster.client() as client:
            lost = [p for p, (data, _) in acked.items() if client.read_file(p) != data]
        assert not lost, lost[:5]
    finally:
        if cut is not None:
            cluster.heal(active)
        cluster.stop()
