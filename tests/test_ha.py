"""Metadata high availability (ha = etcd) with real etcd members and real metadata server
processes: the standby follows the active, refuses client calls, takes over after a
kill -9 with everything acknowledged, and a deposed active starts again as a standby."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
import trio

from fs.errors import FileNotFound, LeaseFSError, StandbyError
from hakit import (ELECTION_TIMEOUT, HACluster, call, election_bound, ha_status,
                   successor_bound)
from harness import poll_until

pytestmark = pytest.mark.slow


@pytest.fixture
def ha(tmp_path):
    cluster = HACluster(tmp_path, n_meta=2, n_storage=0)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_standby_follows_and_refuses(ha):
    active, standby = ha.active_and_standby()
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
    killed = time.time()
    ha.kill_meta(active)
    new = ha.wait_active(timeout=15, besides=active)
    assert new != active
    status = ha.statuses()[new]
    assert status["epoch"] > epoch
    # in parts, as the successor records them: its election within the lease's TTL and
    # etcd's expiry sweep of the kill, its take-over within what leasefs adds once elected
    # (not the sum, which CPU starvation stretches in etcd's part)
    print(f"election {status['elected_at'] - killed:.3f} s after the kill, take-over "
          f"{status['active_at'] - status['elected_at']:.3f} s")
    assert killed <= status["elected_at"] <= killed + election_bound(ELECTION_TIMEOUT), status
    assert status["active_at"] - status["elected_at"] <= successor_bound(ELECTION_TIMEOUT), \
        status
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
        # fixed-sleep: the scenario's pause of twice the election timeout, whatever the takeover
        # took
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


def node_status(port: int) -> dict:
    """A block server's ``/api/v1/status``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=10) as answer:
        return json.load(answer)


def commands_from(status: dict, address: str, outcome: str, kind: str | None = None):
    """The commands a block server ``outcome`` ("obeyed" or "dropped") from the metadata
    server at ``address``: all of them by type, or the count of one ``kind``."""
    counts = next(m for m in status["meta_servers"] if m["address"] == address)["commands"]
    return counts[outcome] if kind is None else counts[outcome].get(kind, 0)


def test_a_deposed_active_that_comes_back_commands_no_block_server(tmp_path):
    """Split brain with real block servers. The active holds a deletion for block server X
    that only it decided (a replica reported corrupt to it alone), queued while X is frozen,
    when it is itself frozen (SIGSTOP) for twice the election timeout; the standby takes
    over in a newer epoch and every block server hears of it. The old active then runs
    again cut off from etcd (the others are not: an etcd outage would end the new term
    too, as soon as the new active can no longer vouch for it), so nothing can tell it
    that its term is over (a keepalive that cannot reach etcd: the worst case). Proven: it
    fences itself on its own clock (its lease is older than it can vouch for), says so and
    starts again as a standby without etcd; X's heartbeat waiting in its socket
    gets no command X obeys (answered before the fence, it carries none: the server is no
    longer sure of its term; and X would drop one of the old epoch: ``test_ha_datanode``
    proves both); no block server runs any command of the old active after the new epoch,
    X keeps the replica and the new active lists it; the old active answers no client call
    meanwhile, a read of what the new active made included; it comes back as a standby."""
    election_timeout = 3.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=3, election_timeout=election_timeout,
                        settings={
                            # frozen processes stay live in every node table: a dead node's
                            # queued deletions would be forgotten
                            "dead_node_interval": 120.0,
                            # the active queues the corrupt replica's deletion at once
                            "replication_interval": 0.1,
                            "inline_max": 0},   # the file's data in a block, not inline
                        cuttable=True)
    cut = False
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        a = cluster.address(active)
        old_epoch = ha_status(a)["epoch"]
        data = bytes(range(256)) * 64
        with cluster.client() as client:
            client.write_file("/kept", data, replication=3)

        def kept_block() -> dict:
            return call(a, "get_block_locations", path="/kept")["blocks"][0]
        assert poll_until(lambda: len(kept_block()["locations"]) == 3, 20), kept_block()
        block = kept_block()["block"]
        ports = [cluster.storage_http_port(i) for i in range(3)]
        x_id = node_status(ports[0])["node_id"]
        assert x_id in {loc["node_id"] for loc in kept_block()["locations"]}

        # X hears nothing from the active while the deletion is decided: frozen, and the
        # active has stopped hearing from it (no heartbeat of it is still on its way)
        cluster.pause("storage0")

        def x_silent() -> bool:
            nodes = call(a, "report")["live_nodes"]
            return next(n for n in nodes if n["node_id"] == x_id)["last_heartbeat_age"] > 1.0
        assert poll_until(x_silent, 20)
        call(a, "report_bad_blocks", blocks=[{"block": {"id": block["id"], "gs": block["gs"]},
                                              "node_id": x_id}])
        assert poll_until(lambda: call(a, "report")["pending_deletion"] == 1, 20), \
            call(a, "report")
        paused_at = time.monotonic()
        cluster.pause(active)
        try:
            cluster.resume("storage0")
            new = cluster.wait_active(timeout=30, besides=active)
            new_epoch = ha_status(cluster.address(new))["epoch"]
            assert new_epoch > old_epoch
            assert poll_until(lambda: all(node_status(p)["active_epoch"] == new_epoch
                                          for p in ports), 20), [node_status(p) for p in ports]
            call(cluster.address(new), "mkdirs", path="/made-after")
            # fixed-sleep: the scenario's pause of twice the election timeout, whatever the
            # takeover took
            time.sleep(max(0.0, paused_at + 2 * election_timeout - time.monotonic()))
            obeyed = [commands_from(node_status(p), a, "obeyed") for p in ports]
            cluster.cut_from_etcd(active)
            cut = True
        finally:
            cluster.resume(active)
        outcomes: list = []
        try:
            # its lease is long past what it can vouch for: it fences itself at once,
            # without a word from etcd, says so and starts again. Its next run is waited
            # for: calls that reach the stopping one may find their connection closed
            cluster.wait_role(active, ("initializing", "standby"), timeout=10)
            log = (cluster.base / "logs" / f"{active}.log").read_text(errors="replace")
            assert f"gave up its term (epoch {old_epoch})" in log, cluster.log_tail(active)

            def send() -> None:
                try:
                    outcomes.append(("ok", call(a, "mkdirs", path="/split/after")))
                except LeaseFSError as exc:
                    outcomes.append(("refused", exc))

            sender = threading.Thread(target=send)
            sender.start()
            # X's heartbeat, waiting in the old active's socket since the pause, is answered
            # (without the queued deletion: its term is past what it can vouch for), and X
            # hears from it again that it is not active
            def x_heard_it_step_down() -> bool:
                view = next(m for m in node_status(ports[0])["meta_servers"]
                            if m["address"] == a)
                return view["role"] not in (None, "active")
            assert poll_until(x_heard_it_step_down, 20), node_status(ports[0])
            # refused as a standby (which cannot reach etcd to follow the log)
            with pytest.raises(StandbyError):
                call(a, "get_file_info", path="/made-after")
            sender.join(30)
            assert len(outcomes) == 1 and isinstance(outcomes[0][1], StandbyError), outcomes
        finally:
            cluster.heal(active)
            cut = False
        sender.join(60)
        assert len(outcomes) == 1 and outcomes[0][0] == "refused", outcomes
        cluster.wait_role(active, "standby", timeout=30)
        assert cluster.wait_active() == new
        n = cluster.address(new)
        with pytest.raises(FileNotFound):
            call(n, "get_file_info", path="/split/after")

        statuses = [node_status(p) for p in ports]
        assert [commands_from(st, a, "obeyed") for st in statuses] == obeyed, statuses
        assert statuses[0]["replicas_by_state"] == {"FINALIZED": 1}, statuses[0]
        located = call(n, "get_block_locations", path="/kept")["blocks"][0]
        assert x_id in {loc["node_id"] for loc in located["locations"]}, located
        assert len(located["locations"]) == 3 and not located["corrupt"], located
        with cluster.client() as client:
            assert client.read_file("/kept") == data
    finally:
        if cut:
            cluster.heal(active)
        for name in cluster.names + ["storage0"]:
            if name in cluster.procs:
                cluster.resume(name)   # SIGCONT to a running process is a no-op
        cluster.stop()


def test_checkpoint_purges_the_log_and_a_standby_still_catches_up(tmp_path):
    from meta.ha.log import HALog

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
    active, standby = ha.active_and_standby()
    epoch = ha.statuses()[active]["epoch"]
    call(ha.address(active), "mkdirs", path="/graceful/before")
    answer = call(ha.address(active), "ha_failover")
    assert answer == {"resigned": active, "epoch": epoch}
    # the other server wins; the one that resigned follows and does not take it back
    assert ha.wait_active(timeout=10, besides=active) == standby
    ha.wait_role(active, "standby")
    # fixed-sleep: two election timeouts in which the resigned server must not take the role
    # back; not taking it is a non-event
    time.sleep(2 * ha.settings["ha_election_timeout"])
    statuses = ha.statuses()
    assert statuses[standby]["role"] == "active" and statuses[active]["role"] == "standby"
    assert statuses[standby]["epoch"] > epoch
    assert call(ha.address(standby), "get_file_info", path="/graceful/before")["type"] == "dir"
    with pytest.raises(StandbyError):
        call(ha.address(active), "ha_failover")


def test_a_term_handed_back_at_once_is_taken_at_once(tmp_path):
    """haadmin -failover twice in a row: the server that gave the term away a moment ago
    (restarted in place, ceding) takes it back as soon as it sees that nobody else does,
    not after a whole election timeout in which both servers cede. (How fast a graceful
    failover is, is measured by ``leasefs bench ha``.)"""
    timeout = 10.0
    cluster = HACluster(tmp_path, n_meta=2, n_storage=0, election_timeout=timeout)
    try:
        cluster.start()
        first, second = cluster.active_and_standby(timeout=30)
        call(cluster.address(first), "ha_failover")
        assert cluster.wait_active(timeout=10, besides=first) == second
        cluster.wait_role(first, "standby")
        started = time.monotonic()
        call(cluster.address(second), "ha_failover")
        assert cluster.wait_active(timeout=2 * timeout, besides=second) == first
        # ceding until the election timeout ran out took all of it
        assert time.monotonic() - started < timeout / 2
    finally:
        cluster.stop()
