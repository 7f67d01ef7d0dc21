"""A silently partitioned active metadata server (cut from etcd and from everyone else by
proxies that stop forwarding: nothing killed, no connection reset), with real etcd members,
two metadata servers and a block server as processes, under client load.

Clients with calls in flight, and one started during the cut, get through the new active
about as soon as it has taken over (within a probe for the active, the new one also a
connect to the cut-off server given up, of the successor's election; the election itself
within the lease's TTL and etcd's expiry sweep of the cut: ``hakit.check_failover_parts``),
not after their retry budget; the cut-off server stops calling itself active once its etcd
lease can have expired (its own clock says so: no answer from etcd needed), so its status
never shows two actives; after the heal it follows as a standby and nothing acknowledged
is lost."""

from __future__ import annotations

import time

import pytest
import trio

from fs.rpcclient import call_each
from hakit import HACluster, check_failover_parts, writes_through

pytestmark = pytest.mark.slow

WRITERS = 4


def test_writers_get_through_a_partitioned_active_within_the_failover_time(tmp_path):
    election = 2.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=1, election_timeout=election,
                        settings={"inline_max": 0, "replication": 1}, cuttable=True)
    cut = False
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        # the cut-off server first in every client's list: each starts there
        assert active == cluster.names[0], active
        # (seconds from the cut to the question, the role it answered)
        roles: list[tuple[float, str]] = []

        def partition() -> None:
            nonlocal cut
            cluster.cut(active)
            cut = True

        async def watch_role(seen, stop) -> None:
            """The cut-off server's role as it says itself (asked past the proxies)."""
            while not stop.is_set():
                asked = time.monotonic() - seen.failed_at
                answer = await call_each([cluster.direct(active)], timeout=0.5)
                status = answer[cluster.direct(active)][0]
                if status is not None:
                    roles.append((asked, status["role"]))
                await trio.sleep(0.05)

        seen = writes_through(cluster, partition, election, writers=WRITERS,
                              watch=watch_role, hold=election + 0.5)
        demoted = next((at for at, role in roles if role != "active"), None)
        print(f"partition: first write after {seen.first:.2f} s, a client started "
              f"after it through in {seen.late:.2f} s; the cut-off server stopped "
              f"saying active after {demoted} s; {len(seen.acked)} writes")
        successor = cluster.statuses()[standby]
        assert successor["role"] == "active", successor
        check_failover_parts([seen.parts(successor)], 1, election, connecting=True)
        assert not seen.failures, seen.failures[:5]
        # never two actives: the cut-off server drops the role before a successor can
        # have won (its lease's TTL from the last keepalive it sent, less the margin), so
        # it says active to no question asked a whole election timeout after the cut
        # (asked, not answered: the answer's way back may be slow on a busy machine)
        assert demoted is not None, roles[-5:]
        assert all(at < election for at, role in roles if role == "active"), roles
        assert all(role != "active" for at, role in roles if at >= demoted), roles
        cluster.heal(active)
        cut = False
        # healed, it follows as a standby; the new active stays
        cluster.wait_role(active, "standby", timeout=30)
        assert cluster.wait_active() == standby
        lost = seen.lost(cluster)
        assert not lost, lost[:5]
    finally:
        if cut:
            cluster.heal(active)
        cluster.stop()
