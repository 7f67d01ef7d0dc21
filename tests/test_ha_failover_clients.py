"""How soon leasefs's clients use a new active after a kill -9 of the old one (ha = etcd),
measured from the moment the successor says it began to serve (``ha_status``'s
``active_at``), not from the kill: the election before it is etcd's lease expiry, which
CPU starvation stretches; what comes after it is the client's.

Clients started at the kill find the old active refusing connections and the other server
answering that it is a standby; they go round the list until the successor serves. Their
wait between two rounds must not hold them back long after it does (``RpcClient``:
capped at the probes' pace while a standby answers).
"""

from __future__ import annotations

import os
import time

import pytest
import trio

from etcd_cluster import ETCD
from fs.client import AsyncClient
from hakit import FIRST_CREATE, HACluster, ha_status
from fs.rpcclient import PROBE_PAUSE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                                 reason=f"{ETCD} is not installed (Debian etcd-server)")]

#: clients started at the kill: each one's wait at the election's end falls at random
#: within its backoff, so several show the longest one
CLIENTS = 8


async def first_creates(address: str, config, n: int) -> list[float]:
    """Wall clock at which each of ``n`` new clients finished its first create and close."""
    ends = [0.0] * n

    async def one(i: int) -> None:
        async with AsyncClient(address, config=config, client_name=f"after-kill-{i}") as c:
            out = await c.create(f"/after-kill-{i}")
            await out.close()
            ends[i] = time.time()

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return ends


def test_clients_going_round_the_list_during_an_election_use_the_successor_at_once(
        tmp_path):
    with HACluster(tmp_path, n_meta=2, n_storage=0) as cluster:
        active, standby = cluster.active_and_standby()
        config = cluster.config().replace(rpc_retry_seconds=60.0)
        killed = time.time()
        cluster.kill_meta(active)
        ends = trio.run(first_creates, cluster.meta_address, config, CLIENTS)
        status = ha_status(cluster.address(standby))
        assert status["role"] == "active" and status["elected_at"] >= killed, status
        late = sorted(round(end - status["active_at"], 3) for end in ends)
        print(f"election {status['elected_at'] - killed:.2f} s after the kill; clients' "
              f"first creates {late} s after the successor served")
        # one pause between two rounds of the list at most, and the create itself
        assert late[-1] <= config.rpc_silence * PROBE_PAUSE + FIRST_CREATE, late
