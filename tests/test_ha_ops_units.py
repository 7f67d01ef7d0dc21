"""The operator side of metadata HA without processes: the etcd command line
(``tools/cluster/etcd.py``), ``haadmin``'s flags and table, ``report``'s HA line, and the follower
lag histogram fed from the HA controller's samples (``meta/metrics.py``)."""

from __future__ import annotations

import os
from collections import deque
from types import SimpleNamespace

import pytest

from fs.metrics import Histograms
from meta.metrics import LAG_BUCKETS, MetaMetrics
from tools.cluster import etcd as etcdmod
from tools.cli import build_parser, main
from tools.admin.haadmin import active_of, split_addresses, status_rows
from tools.shell.core import format_ha


def test_etcd_plan_and_command_line(tmp_path):
    members = etcdmod.plan(str(tmp_path / "etcd"), str(tmp_path / "logs"), 3, first_port=20000)
    assert [(m.name, m.client_port, m.peer_port) for m in members] == [
        ("etcd0", 20000, 20003), ("etcd1", 20001, 20004), ("etcd2", 20002, 20005)]
    assert etcdmod.endpoints(members) == ",".join(
        f"http://127.0.0.1:{p}" for p in (20000, 20001, 20002))
    argv = etcdmod.argv(members[1], members, "tok")
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["--name"] == "etcd1" and flags["--data-dir"] == members[1].data_dir
    assert flags["--listen-client-urls"] == "http://127.0.0.1:20001"
    assert flags["--initial-cluster"] == ",".join(
        f"etcd{i}=http://127.0.0.1:{20003 + i}" for i in range(3))
    assert flags["--heartbeat-interval"] == "50" and flags["--election-timeout"] == "500"
    assert flags["--quota-backend-bytes"] == str(2 * 1024 ** 3)
    assert flags["--auto-compaction-mode"] == "periodic"
    # free ports: distinct, below the ephemeral range, never etcd's well-known ones
    free = etcdmod.plan(str(tmp_path), str(tmp_path), 3)
    ports = [p for m in free for p in (m.client_port, m.peer_port)]
    assert len(set(ports)) == 6 and not {2379, 2380} & set(ports)
    assert etcdmod.Member.from_dict(free[0].to_dict()) == free[0]


def test_etcd_members_share_the_cores(tmp_path, monkeypatch):
    members = etcdmod.plan(str(tmp_path), str(tmp_path), 3, first_port=20000)
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert etcdmod.environment(members, {0, 1})["GOMAXPROCS"] == "1"
    assert etcdmod.environment(members, set(range(8)))["GOMAXPROCS"] == "2"
    assert etcdmod.environment(members[:1], set(range(8)))["GOMAXPROCS"] == "8"
    monkeypatch.setenv("GOMAXPROCS", "3")            # an operator's choice stands
    assert etcdmod.environment(members, {0, 1})["GOMAXPROCS"] == "3"


def test_is_etcd_refuses_other_processes(tmp_path):
    assert not etcdmod.is_etcd(os.getpid(), str(tmp_path))
    assert not etcdmod.is_etcd(None, str(tmp_path))
    assert etcdmod.stop([etcdmod.Member("e", 1, 2, str(tmp_path), "", pid=os.getpid())]) == []


def test_haadmin_flags_hdfs_and_long_forms():
    parser = build_parser()
    for flag in ("-getAllServiceState", "--getAllServiceState", "--get-all-service-state"):
        assert parser.parse_args(["haadmin", flag]).get_all_service_state
    for flag in ("-failover", "--failover"):
        assert parser.parse_args(["haadmin", flag]).failover
    assert parser.parse_args(["haadmin", "-getServiceState", "meta1"]).get_service_state \
        == "meta1"


@pytest.mark.parametrize("argv", [["haadmin"], ["haadmin", "-failover", "-getAllServiceState"]])
def test_haadmin_usage_errors(argv, capsys):
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_haadmin_table_and_active():
    found = {"a:1": ({"role": "standby", "node_id": "m1", "epoch": 4, "applied_txid": 9,
                      "lag": 0.0123}, None),
             "b:2": ({"role": "active", "node_id": "m0", "epoch": 4, "applied_txid": 9,
                      "lag": 0.0}, None),
             "c:3": (None, OSError("connection refused"))}
    rows = status_rows(found)
    assert rows[0] == ["a:1", "m1", "standby", 4, 9, "0.012s"]
    assert rows[2][2].startswith("unreachable (connection refused")
    assert active_of(found) == "b:2" and active_of(found, besides="b:2") is None
    assert split_addresses(" a:1, b:2 ,,") == ["a:1", "b:2"]


def test_report_ha_line():
    assert format_ha(None) == "none (one metadata server)"
    assert format_ha({"role": "active", "epoch": 0, "mode": "none"}).startswith("none")
    assert format_ha({"role": "standby", "node_id": "meta1", "epoch": 7, "applied_txid": 42,
                      "lag": 0.25, "mode": "etcd"}) == \
        "standby (node meta1, epoch 7, applied txid 42, lag 0.250s)"


def test_lag_histogram_takes_only_new_samples():
    ha = SimpleNamespace(lag_samples=deque(maxlen=4), entries_applied=0)
    metrics = MetaMetrics.__new__(MetaMetrics)   # only the lag part, no server around it
    metrics.server = SimpleNamespace(ha=ha)
    metrics.ha_lag = Histograms("leasefs_ha_lag_seconds", "lag", buckets=LAG_BUCKETS)
    metrics._ha_seen = (None, 0)

    def applied(n, *lags):
        ha.entries_applied += n
        ha.lag_samples.extend(lags)
        metrics._take_lag_samples()
        return metrics.ha_lag.count()
    assert applied(10) == 0                   # catch-up: applied, not sampled
    assert applied(3, 0.1, 0.2, 0.3) == 3
    assert applied(0) == 3                    # a scrape without news adds nothing
    assert applied(6, *[0.01] * 6) == 7       # more than the window holds: the window
    ha2 = SimpleNamespace(lag_samples=deque([0.5]), entries_applied=1)
    metrics.server.ha = ha2                   # started again in place: a new controller
    metrics._take_lag_samples()
    assert metrics.ha_lag.count() == 8
