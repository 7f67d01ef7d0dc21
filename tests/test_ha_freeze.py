"""A frozen active metadata server (SIGSTOP: a long pause, a stuck disk) under client load,
with real etcd members, two metadata servers and a block server as processes: the clients
writing, and one started after the freeze, get through the new active about as soon as it
has taken over (as after a kill -9), not when the frozen one wakes; once it wakes nothing
acknowledged is lost and it follows as a standby. Timed in parts, as ``bench ha`` does
(``hakit.check_failover_parts``): the successor's election from the freeze, and the
writers' and the new client's first write from that election."""

from __future__ import annotations

import pytest

from hakit import HACluster, check_failover_parts, writes_through

pytestmark = pytest.mark.slow

WRITERS = 4


def test_writers_get_through_a_frozen_active_within_the_failover_time(tmp_path):
    election = 2.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=1, election_timeout=election,
                        settings={"inline_max": 0, "replication": 1})
    frozen = False
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        # the frozen server first in every client's list: each starts there
        assert active == cluster.names[0], active

        def freeze() -> None:
            nonlocal frozen
            cluster.pause(active)
            frozen = True
        seen = writes_through(cluster, freeze, election, writers=WRITERS)
        print(f"freeze: first write after {seen.first:.2f} s, a client started "
              f"after it through in {seen.late:.2f} s; {len(seen.acked)} writes")
        successor = cluster.statuses()[standby]
        assert successor["role"] == "active", successor
        # a client started at the freeze finds the successor as the writers do: its first
        # call goes silent (the frozen server's kernel still accepts the connection)
        check_failover_parts([seen.parts(successor)], 1, election)
        assert not seen.failures, seen.failures[:5]
        after = [p for p, (_, at) in seen.acked.items() if at > seen.failed_at]
        assert len(after) > WRITERS, len(after)
        cluster.resume(active)
        frozen = False
        # the old active wakes, finds its term over and follows; the new one stays
        cluster.wait_role(active, "standby", timeout=30)
        assert cluster.wait_active() == standby
        lost = seen.lost(cluster)
        assert not lost, lost[:5]
    finally:
        if frozen:
            cluster.resume(active)
        cluster.stop()
