"""The operator side of metadata HA with real processes: ``leasefs cluster up --ha`` (3 etcd
members, an active, a standby and an observer, block servers), ``cluster status``,
``leasefs haadmin`` (-getServiceState, -getAllServiceState, -failover), the HA role on a
standby's web page and in ``leasefs report``, the ``leasefs_ha_*`` metrics, ``cluster
down`` leaving none of the recorded processes running, and ``cluster up --ha`` with
``tls = on`` (certificates, a kill -9 failover read back over TLS, a restart keeping them).

Block servers take the comma-separated list of metadata addresses; where this checkout's
RPC client cannot take a list yet, the cluster starts without block servers (``--storage
0``) and everything else is tested the same way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.request

import pytest
import trio

from etcd_cluster import ETCD
from hakit import check_failover_parts
from fs import tls as tlsmod
from fs.errors import sole_exception
from fs.rpc import RpcClient
from tools.cluster import etcd as etcdmod
from tools.cluster.processes import is_ours, process_state

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                                 reason=f"{ETCD} is not installed (Debian etcd-server)")]

FAST = ["--set", "heartbeat_interval=0.2", "--set", "safemode_extension=0",
        "--set", "ha_election_timeout=2"]


def address_lists_supported() -> bool:
    """Does ``RpcClient`` take ``host:port,host:port`` (block servers and clients then
    follow the active)?"""
    try:
        rpc = RpcClient("127.0.0.1:1,127.0.0.1:2", "probe")
    except Exception:
        return False
    address = getattr(rpc, "address", None)
    return not (isinstance(address, tuple) and "," in str(address[0]))


N_STORAGE = 3 if address_lists_supported() else 0


def leasefs(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def alive(pid) -> bool:
    return bool(pid) and process_state(pid) not in (None, "Z", "X")


def recorded(home) -> dict:
    return json.loads((home / "cluster.json").read_text())


def all_pids(state) -> dict[str, int]:
    pids = {m["name"]: m["pid"] for m in state["ha"]["etcd"]}
    pids.update({m["name"]: m["pid"] for m in state["metas"]})
    pids.update({f"storage{i}": s["pid"] for i, s in enumerate(state.get("storage", []))})
    return pids


def roles(env) -> dict[str, str]:
    """node id -> role, from ``haadmin -getAllServiceState --json``."""
    out = leasefs("haadmin", "-getAllServiceState", "--json", env=env)
    answers = json.loads(out.stdout)
    return {s.get("node_id"): s.get("role", s.get("error")) for s in answers.values()}


async def _calls(address, calls):
    async with RpcClient(address, "test-ha-ops", retry_seconds=2) as rpc:
        return [await rpc.call(method, args) for method, args in calls]


def call_many(address, calls):
    try:
        return trio.run(_calls, address, calls)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("ha-ops") / "home"
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    started = time.monotonic()
    up = leasefs("cluster", "up", "--ha", "--port", "0", "--http-port", "0", "--storage",
                 N_STORAGE, "--storage-port", "0", *FAST, env=env)
    print(f"cluster up --ha took {time.monotonic() - started:.1f} s:\n{up.stdout}{up.stderr}")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield home, env
    finally:
        kill_recorded(home)


def kill_recorded(home) -> None:
    """Whatever a test did: never leak a process (recorded pids only, checked first)."""
    try:
        state = recorded(home)
    except (OSError, ValueError):
        return
    for m in state.get("metas", []):
        if is_ours(m.get("pid"), "meta", str(home / m["name"])):
            os.kill(m["pid"], signal.SIGKILL)
    for i, s in enumerate(state.get("storage", [])):
        if is_ours(s.get("pid"), "storage", str(home / f"storage{i}")):
            os.kill(s["pid"], signal.SIGKILL)
    for m in state.get("ha", {}).get("etcd", []):
        if etcdmod.is_etcd(m.get("pid"), m["data_dir"]):
            os.kill(m["pid"], signal.SIGKILL)


def test_up_status_and_haadmin(cluster):
    home, env = cluster
    state = recorded(home)
    assert len(state["ha"]["etcd"]) == 3
    assert [m["role"] for m in state["metas"]] == ["standby", "standby", "observer"]
    assert state["meta_address"] == ",".join(m["address"] for m in state["metas"])
    assert all(alive(pid) for pid in all_pids(state).values()), all_pids(state)

    status = leasefs("cluster", "status", env=env)
    print(status.stdout)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines()[2:] if line.strip()}
    assert all("healthy" in lines[f"etcd{i}"] for i in range(3))
    assert " active " in lines["meta0"] and " standby " in lines["meta1"]
    assert " observer " in lines["meta2"]
    st = json.loads(leasefs("cluster", "status", "--json", env=env).stdout)
    assert [m["ha"]["role"] for m in st["ha"]["metas"]] == ["active", "standby", "observer"]
    # every metadata server answers Hadoop's client on its own port, named everywhere
    hdfs = [m["hdfs_address"] for m in state["metas"]]
    assert hdfs == [f"hdfs://127.0.0.1:{m['hdfs_port']}" for m in state["metas"]]
    assert len(set(hdfs)) == 3
    assert [m["hdfs_address"] for m in st["ha"]["metas"]] == hdfs
    for m in state["metas"]:
        assert lines[m["name"]].endswith(f"{m['address']}  {m['hdfs_address']}")
        socket.create_connection(("127.0.0.1", m["hdfs_port"]), timeout=5).close()

    table = leasefs("haadmin", "-getAllServiceState", env=env)
    print(table.stdout)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (m["address"], m["name"], role)
        for m, role in zip(state["metas"], ["active", "standby", "observer"])]
    assert len({r[3] for r in rows}) == 1   # one epoch everywhere
    for target, role in (("meta2", "observer"), (state["metas"][1]["address"], "standby")):
        one = leasefs("haadmin", "--getServiceState", target, env=env)
        assert (one.returncode, one.stdout.strip()) == (0, role), one.stderr
    bad = leasefs("haadmin", "-getServiceState", "nosuch", env=env)
    assert bad.returncode == 2 and "nosuch" in bad.stderr and "Traceback" not in bad.stderr

    # report through the active shows its HA state
    report = leasefs("report", "--meta", state["metas"][0]["address"], env=env)
    assert report.returncode == 0, report.stderr
    assert "HA: active (node meta0, epoch" in report.stdout


def test_up_again_restarts_only_what_is_missing(cluster):
    home, env = cluster
    again = leasefs("cluster", "up", env=env)
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    state = recorded(home)
    meta1 = state["metas"][1]
    assert is_ours(meta1["pid"], "meta", str(home / "meta1"))
    os.kill(meta1["pid"], signal.SIGKILL)
    up = leasefs("cluster", "up", env=env)
    print(up.stdout)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "meta1: starting" in up.stdout and "meta0: starting" not in up.stdout
    assert "etcd: starting" not in up.stdout
    after = recorded(home)
    assert after["metas"][1]["pid"] != meta1["pid"]
    assert after["metas"][1]["address"] == meta1["address"]   # same port: lists stay valid
    assert roles(env) == {"meta0": "active", "meta1": "standby", "meta2": "observer"}


def test_standby_web_page_and_metrics(cluster):
    home, env = cluster
    state = recorded(home)
    active = next(m for m in state["metas"] if roles(env)[m["name"]] == "active")
    standby = next(m for m in state["metas"] if roles(env)[m["name"]] == "standby")
    call_many(active["address"], [("mkdirs", {"path": f"/ops/{i}"}) for i in range(20)])
    with urllib.request.urlopen(f"http://127.0.0.1:{standby['http_port']}/",
                                timeout=10) as page:
        html = page.read().decode()
    assert 'id="ha-role"' in html
    cell = html[html.index('id="ha-role"'):].split("</td>")[0]
    assert "standby" in cell and f"node {standby['name']}" in cell, cell

    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{standby['http_port']}/metrics",
                                    timeout=10) as answer:
            metrics = answer.read().decode()
        values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in metrics.splitlines() if line.startswith("leasefs_ha_")}
        if values.get("leasefs_ha_lag_seconds_count", 0) > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert values['leasefs_ha_role{role="standby"}'] == 1
    assert values['leasefs_ha_role{role="active"}'] == 0
    assert values["leasefs_ha_epoch"] >= 1
    assert values["leasefs_ha_applied_txid"] >= 20
    assert values["leasefs_ha_lag_seconds_count"] > 0, metrics
    print({k: v for k, v in values.items() if "bucket" not in k})


def test_failover(cluster):
    home, env = cluster
    before = roles(env)
    old = next(n for n, r in before.items() if r == "active")
    out = leasefs("haadmin", "-failover", "--timeout", "20", env=env)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    took = float(out.stdout.split(" after ")[1].split(" s")[0])
    print(f"failover took {took:.3f} s (benchmark, not asserted)")
    new = out.stdout.split()[1]
    assert new != old and before[new] == "standby"
    deadline = time.monotonic() + 30
    while (now := roles(env)) != {**before, old: "standby", new: "active"}:
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    # and back with the long form
    back = leasefs("haadmin", "--failover", "--timeout", "20", env=env)
    assert back.returncode == 0 and back.stdout.split()[1] == old, back.stdout + back.stderr


def test_down_stops_everything(cluster):
    home, env = cluster
    state = recorded(home)
    pids = all_pids(state)
    down = leasefs("cluster", "down", env=env)
    print(down.stdout, down.stderr)
    assert down.returncode == 0, down.stderr
    left = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not left, left
    status = leasefs("cluster", "status", env=env)
    assert status.returncode == 3, status.stdout


def presented(address: str, ca_file: str) -> dict:
    """The certificate the server at ``address`` presents, verified against ``ca_file``
    and the IP address connected to (``ssl.SSLCertVerificationError`` when it is not)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with context.wrap_socket(sock, server_hostname=host) as secured:
            return secured.getpeercert()


def roles_over(args, env, deadline: float, want) -> dict[str, str]:
    """``roles`` (through ``args``' settings) polled until ``want(roles)`` or the deadline."""
    while True:
        out = leasefs("haadmin", "-getAllServiceState", "--json", *args, env=env)
        now = {s.get("node_id") or address: s.get("role", s.get("error"))
               for address, s in json.loads(out.stdout).items()}
        if want(now):
            return now
        assert time.monotonic() < deadline, now
        time.sleep(0.2)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not N_STORAGE, reason="block servers cannot take a list of metadata "
                                          "addresses in this checkout")
def test_up_with_tls_fails_over_and_restarts_with_the_same_certificates(tmp_path):
    """``cluster up --ha --set tls=on``: one CA in ``<home>/tls``, every metadata and block
    server presents a certificate from it for its address (a wrong CA or a plaintext client
    is refused), a file written over TLS is read back byte-exact over TLS after a kill -9
    of the active, and ``up`` again restarts the killed server with the same CA and
    certificates."""
    home = tmp_path / "home"
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    try:
        up = leasefs("cluster", "up", "--ha", "--port", "0", "--http-port", "0", "--storage",
                     N_STORAGE, "--storage-port", "0", "--set", "tls=on", *FAST, env=env)
        print(up.stdout, up.stderr)
        assert up.returncode == 0, up.stdout + up.stderr
        state = recorded(home)
        ca = home / "tls" / "ca.crt"
        assert state["tls_ca_file"] == str(ca)
        assert stat.S_IMODE(os.stat(home / "tls" / "ca.key").st_mode) == 0o600
        servers = {m["name"]: m["address"] for m in state["metas"]}
        servers.update({f"storage{i}": s["address"] for i, s in enumerate(state["storage"])})
        wrong = tlsmod.ensure_ca(tmp_path / "wrong")
        for name, address in servers.items():
            key = home / name / "tls" / ("storage.key" if name.startswith("storage")
                                         else "meta.key")
            assert stat.S_IMODE(os.stat(key).st_mode) == 0o600, key
            cert = presented(address, str(ca))
            assert ("IP Address", "127.0.0.1") in cert["subjectAltName"], (name, cert)
            with pytest.raises(ssl.SSLCertVerificationError):
                presented(address, wrong)
        certificates = {path: path.read_bytes() for path in [ca, *home.glob("*/tls/*.crt")]}
        assert len(certificates) == 1 + len(servers)

        status = leasefs("cluster", "status", env=env)
        print(status.stdout)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"tls on: servers' certificates from the CA {ca}" in status.stdout
        assert json.loads(leasefs("cluster", "status", "--json",
                                  env=env).stdout)["tls_ca_file"] == str(ca)

        # over TCP (no local socket), as a client on another machine would: a delegation
        # token for who we are, TLS with the CA from cluster.json for every server
        plain = leasefs("haadmin", "-getAllServiceState", "--json", "--set", "meta_socket=",
                        "--set", "tls=off", env=env)
        refusals = [s.get("error", "") for s in json.loads(plain.stdout).values()]
        assert len(refusals) == 3 and all("speaks TLS only" in r for r in refusals), refusals
        token = tmp_path / "token"
        fetched = leasefs("token", "fetch", token, env=env)
        assert fetched.returncode == 0, fetched.stderr
        remote = ["--set", "meta_socket=", "--set", f"token_file={token}"]
        first = {"meta0": "active", "meta1": "standby", "meta2": "observer"}
        roles_over(remote, env, time.monotonic() + 30, lambda r: r == first)
        local = tmp_path / "local.bin"
        data = os.urandom(3 * 1024 * 1024 + 17)
        local.write_bytes(data)
        put = leasefs("put", local, "/tls.bin", *remote, env=env)
        assert put.returncode == 0, put.stderr

        os.kill(state["metas"][0]["pid"], signal.SIGKILL)
        after = roles_over(remote, env, time.monotonic() + 30,
                           lambda r: r.get("meta1") == "active")
        print(f"after kill -9 of meta0: {after}")
        got = subprocess.run([sys.executable, "-m", "tools", "cat", "/tls.bin", *remote],
                             env=env, capture_output=True, timeout=120)
        assert got.returncode == 0, got.stderr
        assert got.stdout == data

        again = leasefs("cluster", "up", env=env)
        print(again.stdout, again.stderr)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "meta0: starting" in again.stdout and "meta1: starting" not in again.stdout
        assert {path: path.read_bytes() for path in certificates} == certificates
        presented(state["metas"][0]["address"], str(ca))
        swapped = {"meta0": "standby", "meta1": "active", "meta2": "observer"}
        roles_over(remote, env, time.monotonic() + 30, lambda r: r == swapped)
        cat = subprocess.run([sys.executable, "-m", "tools", "cat", "/tls.bin"], env=env,
                             capture_output=True, timeout=120)
        assert cat.returncode == 0 and cat.stdout == data, cat.stderr

        pids = all_pids(recorded(home))
        down = leasefs("cluster", "down", env=env)
        assert down.returncode == 0, down.stderr
        left = {name: pid for name, pid in pids.items() if alive(pid)}
        assert not left, left
    finally:
        kill_recorded(home)


def test_bench_ha_times_sigstop_rounds(tmp_path):
    """``bench ha --freeze 2``: the active SIGSTOPped; the successor is elected within the
    lease's TTL and etcd's expiry sweep, and the client's first create goes through it
    within a probe of its taking over; the woken server follows, so the second round
    freezes the new active."""
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
    run = leasefs("bench", "ha", "--rounds", "0", "--freeze", "2", "--graceful", "0",
                  "--partition", "0", "--lag-seconds", "0", "--election-timeout", "2",
                  "--json", "--home", tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    assert len(results["freeze"]) == 2, results
    check_failover_parts(results["freeze_parts"], 2, 2.0, log=run.stderr)


def test_bench_ha_times_partition_rounds_next_to_kill_rounds(tmp_path):
    """``bench ha --rounds 1 --partition 2``: the active cut off by proxies that go silent;
    the successor is elected within the lease's TTL and etcd's sweep, and the running client
    and one started at the cut each get through it within a probe (the new one: and a
    connect to the cut server given up) of its taking over, as in the kill round; after the
    heal the cut-off server follows, so the second round cuts the new active."""
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
    run = leasefs("bench", "ha", "--rounds", "1", "--freeze", "0", "--graceful", "0",
                  "--partition", "2", "--lag-seconds", "0", "--election-timeout", "2",
                  "--json", "--home", tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    assert len(results["kill"]) == 1 and len(results["kill_new"]) == 1, results
    check_failover_parts(results["kill_parts"], 1, 2.0, log=run.stderr)
    for kind in ("partition", "partition_new"):
        assert len(results[kind]) == 2, results
    check_failover_parts(results["partition_parts"], 2, 2.0, connecting=True,
                         log=run.stderr)


def test_bench_meta_ha_alternates_rounds_and_reports_each(tmp_path):
    """``bench meta --ha --rounds 3``: both modes measured three times, alternating; the
    table's ratio is the median of the rounds' ratios, each round's is in the JSON."""
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
    run = leasefs("bench", "meta", "--ha", "--rounds", "3", "--clients", "2", "--ops", "3",
                  "--op", "create", "--op", "getFileInfo", "--no-local", "--json", "--quiet",
                  "--home", tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    by_round = results["etcd_per_none_by_round"]
    assert set(by_round) == {"create", "getFileInfo"}
    for op, ratios in by_round.items():
        assert len(ratios) == 3 and all(r > 0 for r in ratios), (op, ratios)
        # the table rows are each mode's median round
        assert results["none"][op]["ops_per_s"] > 0 and results["etcd"][op]["ops_per_s"] > 0
    even = leasefs("bench", "meta", "--ha", "--rounds", "2", "--no-local", "--quiet",
                   env=env)
    assert even.returncode != 0 and "odd number" in even.stderr and "Traceback" not in even.stderr
