"""Local clients (the superuser, no token) ride through metadata server restarts: while the
server stops and starts, their calls wait and go on, none fails. A real server process,
killed and started again under load: many connections of the test's own process (root,
the server's user) that all reconnect to the new server at once, through its local socket
(a client that reached it over TCP instead would be unauthenticated there)."""

from __future__ import annotations

import pytest
import trio

from fs.rpc import RpcClient

RESTARTS = 3
CLIENTS = 250


@pytest.mark.slow
@pytest.mark.cluster(n_storage=0, settings={"max_connections_per_peer": 2 * CLIENTS})
async def test_local_clients_ride_through_restarts_under_load(process_cluster):
    # each client has its own connection: room for all of them (one uid) and their reconnects
    async def main():
        failures: list[str] = []
        served = [0] * CLIENTS       # calls answered, per client

        async def load(n: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with RpcClient(process_cluster.meta_address, f"load{n}",
                                 retry_seconds=20.0) as rpc:
                assert rpc.local_socket is not None   # the local socket, no token
                task_status.started()
                while True:
                    try:
                        await rpc.call("get_file_info", {"path": "/"})
                        served[n] += 1
                    except Exception as exc:   # noqa: BLE001 - every failure counts
                        failures.append(f"{type(exc).__name__}: {exc}")

        async def all_served_again() -> None:
            before = list(served)
            with trio.fail_after(20):
                while not failures and any(now == then for now, then in zip(served, before)):
                    await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            for n in range(CLIENTS):
                await nursery.start(load, n)
            await all_served_again()
            for _ in range(RESTARTS):
                await trio.to_thread.run_sync(process_cluster.kill_meta)
                await trio.to_thread.run_sync(process_cluster.start_meta)
                await all_served_again()
            nursery.cancel_scope.cancel()
        return failures

    failures = await main()
    assert failures == [], f"{len(failures)} calls failed, the first: {failures[0]}"
