"""Safe mode on real processes: after a metadata-server restart with block
servers down, mutations are refused, reads of data whose replicas are reported work, and safe
mode ends by itself once the reports arrive; a manual safe mode never ends by itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fs import errors
from fs.client import Client
from harness import ProcessCluster, make_test_config
from test_ha import node_status

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def _fast_client(cluster) -> Client:
    """A client that does not wait out safe mode (the default client retries it)."""
    return Client(cluster.meta_address, config=make_test_config(rpc_retry_seconds=0.5))


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _safemode_on(client) -> bool:
    return bool(client.safemode("get")["on"])


def test_restart_with_block_servers_down_is_read_only_until_reports(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=3,
                             settings={"replication": 1, "block_size": 1 * MiB,
                                       "safemode_extension": 1.0})
    with cluster:
        contents: dict[str, bytes] = {}
        holders: dict[str, set[str]] = {}
        with cluster.client() as client:
            for i in range(12):
                path = f"/data/f{i:02d}"
                contents[path] = os.urandom(200_000 + 4096 * i)   # one block each
                client.write_file(path, contents[path])
            for path in contents:
                located = client.get_block_locations(path)
                holders[path] = {loc["address"] for b in located["blocks"]
                                 for loc in b["locations"]}
        # everything stops; the metadata server comes back with one block server of three
        for i in range(3):
            cluster.kill_storage(i, sig=15)
        cluster.kill_meta()
        cluster.start_meta()
        cluster.start_storage(0)
        with _fast_client(cluster) as client:
            live = _wait(lambda: client.report()["live_nodes"], 30,
                         "block server 0 to register")
            storage0 = live[0]["address"]
            # its block report is in; still far below the threshold
            _wait(lambda: client.report()["live_nodes"][0]["blocks"], 30,
                  "block server 0's block report")
            status = client.safemode("get")
            assert status["on"] and not status["manual"], status
            assert "threshold" in status["reason"], status
            for attempt in (lambda: client.mkdirs("/new"),
                            lambda: client.write_file("/new-file", b"x"),
                            lambda: client.delete("/data/f00"),
                            lambda: client.rename("/data/f01", "/data/moved")):
                with pytest.raises(errors.SafeMode) as info:
                    attempt()
                assert info.value.errno == 30 and "safe mode" in str(info.value)
            local = [p for p, h in holders.items() if h == {storage0}]
            remote = [p for p, h in holders.items() if storage0 not in h]
            assert local and remote, holders
            for path in local:            # reads of what is reported work
                assert client.read_file(path) == contents[path]
            with pytest.raises(errors.LeaseFSError) as info:   # the rest: a clear error
                client.read_file(remote[0])
            assert remote[0] in str(info.value) or "block" in str(info.value).lower()
            # the other reports arrive: safe mode ends by itself (after the 1 s extension)
            cluster.start_storage(1)
            cluster.start_storage(2)
            _wait(lambda: not _safemode_on(client), 60, "safe mode to end")
            client.mkdirs("/new")
            for path, data in contents.items():
                assert client.read_file(path) == data


def test_manual_safe_mode_never_leaves_by_itself(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=1, settings={"replication": 1})
    with cluster:
        env = cluster.env
        result = subprocess.run([sys.executable, "-m", "tools", "safemode", "enter"], env=env,
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        port = cluster.storage_http_port(0)

        def sent() -> dict:
            return node_status(port)["meta_servers"][0]
        with _fast_client(cluster) as client:
            # reports and heartbeats keep arriving (a full report, ten heartbeats); it stays on
            before = sent()
            _wait(lambda: (now := sent())["heartbeats_sent"] >= before["heartbeats_sent"] + 10
                  and now["full_reports_sent"] >= 1, 30, "ten heartbeats and a block report")
            status = client.safemode("get")
            assert status["on"] and status["manual"], status
            with pytest.raises(errors.SafeMode):
                client.mkdirs("/x")
        result = subprocess.run([sys.executable, "-m", "tools", "safemode", "leave"], env=env,
                                cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        with cluster.client() as client:
            assert not client.safemode("get")["on"]
            client.mkdirs("/x")


def test_fresh_cluster_started_by_hand_waits_for_a_block_server(tmp_path):
    """A fresh cluster started by hand with the default settings: start-up safe mode lasts
    until a block server is live, and says so, so a put issued before any block server has
    registered waits for one and succeeds, instead of failing with "could only be placed
    on 0 block server(s)"."""
    cluster = ProcessCluster(tmp_path, n_storage=1, settings={"replication": 1})
    del cluster.settings["safemode_min_storage"]   # the default, as an operator's start
    try:
        cluster.start_meta()
        with _fast_client(cluster) as client:
            status = client.safemode("get")
            assert status["on"] and "0 live block servers, 1 needed" in status["reason"], status
            with pytest.raises(errors.SafeMode, match="1 needed"):
                client.mkdirs("/x")
        data = os.urandom(300_000)
        (tmp_path / "in.bin").write_bytes(data)
        put = subprocess.Popen([sys.executable, "-m", "tools", "put", str(tmp_path / "in.bin"),
                                "/f"], env=cluster.env, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        cluster.start_storage(0)
        _, err = put.communicate(timeout=90)
        assert put.returncode == 0, err
        with cluster.client() as client:
            assert client.read_file("/f") == data
    finally:
        cluster.stop()
