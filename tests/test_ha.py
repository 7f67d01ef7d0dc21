"""Metadata high availability (ha = etcd) with real etcd members and real metadata server
processes: the standby follows the active, refuses client calls, takes over after a
kill -9 with everything acknowledged, and a deposed active starts again as a standby."""

from __future__ import annotations

import time

import pytest
import trio

from fs.errors import StandbyError, sole_exception
from fs.rpc import RpcClient
from hakit import HACluster

pytestmark = pytest.mark.slow


async def _calls(address: str, calls: list[tuple[str, dict]], retry_seconds: float = 0):
    async with RpcClient(address, "test-ha", retry_seconds=retry_seconds) as rpc:
        return [await rpc.call(method, args) for method, args in calls]


def call(address: str, method: str, **args):
    try:
        return trio.run(_calls, address, [(method, args)])[0]
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


@pytest.fixture
def ha(tmp_path):
    cluster = HACluster(tmp_path, n_meta=2, n_storage=0)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_standby_follows_and_refuses(ha):
    active = ha.wait_active()
    standby = next(n for n in ha.names if n != active)
    ha.wait_role(standby, "standby")
    for i in range(20):
        call(ha.address(active), "mkdirs", path=f"/d/{i}")
    applied = ha.statuses()[active]["applied_txid"]
    deadline = time.monotonic() + 10
    while ha.statuses()[standby]["applied_txid"] < applied:
        assert time.monotonic() < deadline, ha.statuses()
        time.sleep(0.05)
    with pytest.raises(StandbyError, match="standby"):
        call(ha.address(standby), "mkdirs", path="/refused")
    with pytest.raises(StandbyError):
        call(ha.address(standby), "get_file_info", path="/d/1")
    status = ha.statuses()[standby]
    assert status["epoch"] == ha.statuses()[active]["epoch"] > 0
    assert status["lag"] < 1.0


def test_kill9_active_standby_takes_over_with_everything(ha):
    active = ha.wait_active()
    epoch = ha.statuses()[active]["epoch"]
    for i in range(50):
        call(ha.address(active), "mkdirs", path=f"/before/{i}")
    ha.kill_meta(active)
    started = time.monotonic()
    new = ha.wait_active(timeout=15, besides=active)
    took = time.monotonic() - started
    assert new != active
    status = ha.statuses()[new]
    assert status["epoch"] > epoch
    assert took < 8, took
    listing = call(ha.address(new), "list_status", path="/before")
    assert len(listing["entries"] if isinstance(listing, dict) else listing) == 50
    call(ha.address(new), "mkdirs", path="/after")
    # the old active comes back as a standby and catches up
    ha.start_one(active)
    ha.wait_role(active, "standby")
    deadline = time.monotonic() + 10
    while ha.statuses()[active]["applied_txid"] < ha.statuses()[new]["applied_txid"]:
        assert time.monotonic() < deadline, ha.statuses()
        time.sleep(0.05)


def test_sigstop_active_is_fenced_and_acknowledges_nothing(ha):
    """Split brain: the active is frozen for twice the election timeout, the standby takes
    over, then the old active runs again with calls waiting in its sockets: none of them
    is acknowledged, none reaches the namespace, and it starts again as a standby."""
    import threading

    from fs.errors import FileNotFound, LeaseFSError

    active = ha.wait_active()
    old_epoch = ha.statuses()[active]["epoch"]
    call(ha.address(active), "mkdirs", path="/split")
    paused_at = time.monotonic()
    ha.pause(active)
    try:
        new = ha.wait_active(timeout=20, besides=active)
        assert ha.statuses()[new]["epoch"] > old_epoch
        outcomes: list = []

        def send(i: int) -> None:
            try:
                outcomes.append(("ok", call(ha.address(active), "mkdirs", path=f"/split/{i}")))
            except LeaseFSError as exc:
                outcomes.append(("refused", exc))

        senders = [threading.Thread(target=send, args=(i,)) for i in range(5)]
        for thread in senders:
            thread.start()
        time.sleep(max(0.0, paused_at + 2 * ha.settings["ha_election_timeout"]
                       - time.monotonic()) + 0.5)
    finally:
        ha.resume(active)
    for thread in senders:
        thread.join(60)
    assert len(outcomes) == 5 and all(kind == "refused" for kind, _ in outcomes), outcomes
    assert any(isinstance(exc, StandbyError) for _, exc in outcomes), outcomes
    for i in range(5):
        with pytest.raises(FileNotFound):
            call(ha.address(new), "get_file_info", path=f"/split/{i}")
    ha.wait_role(active, "standby", timeout=20)
    assert ha.wait_active() == new


def test_checkpoint_purges_the_log_and_a_standby_still_catches_up(tmp_path):
    from meta.halog import HALog

    cluster = HACluster(tmp_path, n_meta=2, n_storage=0, settings={"ha_log_retain": 5})
    try:
        cluster.start()
        active = cluster.wait_active()
        standby = next(n for n in cluster.names if n != active)
        for i in range(30):
            call(cluster.address(active), "mkdirs", path=f"/p/{i}")
        cluster.kill(standby)
        call(cluster.address(active), "safemode", action="enter")
        saved = call(cluster.address(active), "save_namespace")
        call(cluster.address(active), "safemode", action="leave")
        for i in range(30, 40):
            call(cluster.address(active), "mkdirs", path=f"/p/{i}")

        async def first_entry():
            async with HALog.open(cluster.etcd.endpoints, cluster.settings["ha_prefix"]) as log:
                return (await log.read())[0].txid

        first = trio.run(first_entry)
        assert first > 1 and first >= saved["txid"] - 5, (first, saved)
        cluster.start_one(standby)
        cluster.wait_role(standby, "standby")
        deadline = time.monotonic() + 10
        while cluster.statuses()[standby]["applied_txid"] < \
                cluster.statuses()[active]["applied_txid"]:
            assert time.monotonic() < deadline, cluster.statuses()
            time.sleep(0.05)
    finally:
        cluster.stop()


def test_leases_across_a_failover(tmp_path):
    """A writer that keeps renewing holds its lease through a failover and closes its file
    on the new active; a file whose writer went away is closed by the new active's
    hard-limit recovery."""
    cluster = HACluster(tmp_path, n_meta=2, n_storage=0,
                        settings={"lease_soft_limit": 1.0, "lease_hard_limit": 4.0})
    try:
        cluster.start()
        active = cluster.wait_active()
        a = cluster.address(active)
        call(a, "create", path="/kept", client_name="writer-kept")
        call(a, "create", path="/abandoned", client_name="writer-gone")
        cluster.kill_meta(active)
        new = cluster.wait_active(besides=active)
        n = cluster.address(new)
        # the surviving writer renews through the failover, past the hard limit
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            assert call(n, "renew_lease", client_name="writer-kept")
            time.sleep(0.5)
        # another client cannot take the kept file: its holder is alive
        from fs.errors import AlreadyBeingCreated, RecoveryInProgress
        with pytest.raises((AlreadyBeingCreated, RecoveryInProgress)):
            call(n, "append", path="/kept", client_name="intruder")
        call(n, "complete", path="/kept", client_name="writer-kept")
        assert not call(n, "get_file_info", path="/kept")["under_construction"]
        # the abandoned one was closed by the new active
        assert not call(n, "get_file_info", path="/abandoned")["under_construction"]
    finally:
        cluster.stop()


def test_graceful_failover_hands_the_term_to_the_standby(ha):
    active = ha.wait_active()
    standby = next(n for n in ha.names if n != active)
    ha.wait_role(standby, "standby")
    epoch = ha.statuses()[active]["epoch"]
    call(ha.address(active), "mkdirs", path="/graceful/before")
    answer = call(ha.address(active), "ha_failover")
    assert answer == {"resigned": active, "epoch": epoch}
    # the other server wins; the one that resigned follows and does not take it back
    assert ha.wait_active(timeout=10, besides=active) == standby
    ha.wait_role(active, "standby")
    time.sleep(2 * ha.settings["ha_election_timeout"])
    statuses = ha.statuses()
    assert statuses[standby]["role"] == "active" and statuses[active]["role"] == "standby"
    assert statuses[standby]["epoch"] > epoch
    assert call(ha.address(standby), "get_file_info", path="/graceful/before")["type"] == "dir"
    with pytest.raises(StandbyError):
        call(ha.address(active), "ha_failover")
