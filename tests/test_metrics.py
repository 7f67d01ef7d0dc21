"""Prometheus metrics: the text format of every /metrics page (parsed with
prometheus_client's own parser), the numbers they count, and a real Prometheus server
scraping a running cluster and its mount."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from fs.config import Config
from fs.metrics import Counters, Histograms, exposition, new_registry, register
from fs.rpc import RpcClient, format_address
from harness import (TEST_SETTINGS, Mount, ProcessCluster, free_port, poll_until,
                     wait_cluster_ready)

pytestmark = pytest.mark.timeout(180)
PROMETHEUS = "/usr/bin/prometheus"


def samples(text: str) -> dict:
    """``{(sample name, sorted label items): value}`` of a /metrics page; fails on any
    line the Prometheus parser rejects."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: dict, name: str, **labels) -> float:
    """Sum over the series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= set(ls))


def test_counters_and_histograms_in_text_format():
    registry = new_registry()
    calls = Counters("x_calls", "calls", ("method",))
    hist = Histograms("x_seconds", "latency", ("method",), buckets=(0.1, 1.0))
    register(registry, lambda: [calls.collect(), hist.collect()])
    calls.inc(("a",))
    calls.inc(("a",), 2)
    for v in (0.05, 0.1, 0.5, 3.0):
        hist.observe(("a",), v)
    found = samples(exposition(registry)[0].decode())
    assert value(found, "x_calls_total", method="a") == 3
    # buckets are cumulative and inclusive (le): 0.1 falls in the 0.1 bucket
    assert value(found, "x_seconds_bucket", method="a", le="0.1") == 2
    assert value(found, "x_seconds_bucket", method="a", le="1.0") == 3
    assert value(found, "x_seconds_bucket", method="a", le="+Inf") == 4
    assert value(found, "x_seconds_count", method="a") == 4
    assert value(found, "x_seconds_sum", method="a") == pytest.approx(3.65)


async def http_get(port: int, path: str = "/metrics") -> str:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"text/plain" in head, head
    return body.decode()


async def test_server_metrics_pages(tmp_path):
    """Both servers' /metrics parse and count what a client did: RPC calls by method and
    outcome (an unknown method name is one series), journal syncs, blocks by state, bytes
    and ops on the block server, replicas by state."""
    from fs.client import AsyncClient
    from meta.serverrun import run_meta_server
    from storage.server import run_block_server

    meta_http, storage_http = free_port(), free_port()
    config = Config.load(env={}, **{**TEST_SETTINGS, "replication": 1, "security": "simple",
                                    "storage_http_port": storage_http})
    data = os.urandom(300_000)

    async def main():
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(lambda task_status: run_meta_server(
                config, str(tmp_path / "meta"), port=0, http_port=meta_http,
                task_status=task_status))
            meta = format_address(bound)
            await nursery.start(lambda task_status: run_block_server(
                config, str(tmp_path / "storage"), meta_address=meta, port=0,
                task_status=task_status))
            await wait_cluster_ready(meta, 1, 30, config)
            async with AsyncClient(meta, config=config) as client:
                await client.write_file("/a/f", data)
                assert await client.read_file("/a/f") == data
            async with RpcClient(bound, "metrics-test") as rpc:
                with pytest.raises(Exception):
                    await rpc.call("no_such_method", {})
                with pytest.raises(Exception):
                    await rpc.call("get_file_info", {"path": 7})
            meta_page = samples(await http_get(meta_http))
            storage_page = samples(await http_get(storage_http))
            nursery.cancel_scope.cancel()
        return meta_page, storage_page

    meta_page, storage_page = await main()
    m = "leasefs_meta_"
    assert value(meta_page, m + "rpc_calls_total", method="create", outcome="ok") >= 1
    assert value(meta_page, m + "rpc_calls_total", method="unknown",
                 outcome="UnknownMethod") == 1
    failed = {dict(ls)["outcome"]: v for (n, ls), v in meta_page.items()
              if n == m + "rpc_calls_total" and dict(ls)["method"] == "get_file_info"}
    assert failed == {"InvalidPath": 1}, failed
    assert value(meta_page, m + "rpc_duration_seconds_count", method="create") >= 1
    assert value(meta_page, m + "rpc_queue_seconds_count") >= 1
    assert value(meta_page, m + "journal_sync_duration_seconds_count") >= 1
    assert value(meta_page, m + "journal_sync_records_sum") >= 3   # mkdir, create, close
    assert value(meta_page, m + "blocks", state="COMPLETE") == 1
    assert value(meta_page, m + "files") == 1 and value(meta_page, m + "directories") >= 2
    assert value(meta_page, m + "block_servers", state="live") == 1
    assert value(meta_page, m + "safe_mode") == 0
    s = "leasefs_storage_"
    assert value(storage_page, s + "written_bytes_total") == len(data)
    assert value(storage_page, s + "read_bytes_total") >= len(data)
    assert total(storage_page, s + "ops_total", result="ok") >= 2
    assert value(storage_page, s + "op_duration_seconds_count", op="READ_BLOCK") >= 1
    assert value(storage_page, s + "replicas", state="FINALIZED") == 1
    assert value(storage_page, s + "checksum_errors_total") == 0


# ---------------------------------------------------------------- a real Prometheus


def mount_metrics_port(mount: Mount) -> int:
    def find():
        for line in mount.log.read_text(errors="replace").splitlines():
            if "/metrics on http://" in line:
                return int(line.rsplit(":", 1)[1].strip("/ \n"))
        return None
    port = poll_until(find, 20)
    assert port, mount.log_text()
    return port


class Prometheus:
    """``/usr/bin/prometheus`` on a free port, scraping ``targets`` every second, its
    data in a temp folder."""

    def __init__(self, base: Path, targets: list[str]):
        self.base = base
        self.port = free_port()
        config = base / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: leasefs\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n")
        self.log = open(base / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={base / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> float | None:
        """The single value of an instant query, None without a result."""
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def log_text(self) -> str:
        return (self.base / "prometheus.log").read_text(errors="replace")[-3000:]


@pytest.mark.slow
def test_prometheus_scrapes_a_running_cluster(tmp_path):
    if not os.path.exists(PROMETHEUS):
        pytest.skip(f"{PROMETHEUS} is not installed (Debian package prometheus; make test "
                    f"installs it)")
    meta_http = free_port()
    block = 1 << 20
    with ProcessCluster(tmp_path / "c", n_storage=2, meta_http_port=meta_http,
                        settings={"replication": 2, "block_size": block}) as cluster:
        mount = Mount(cluster, "metrics", "--set", "mount_metrics_port=0")
        prometheus = None
        try:
            mount.start()
            ports = [meta_http, cluster.storage_http_port(0), cluster.storage_http_port(1),
                     mount_metrics_port(mount)]
            client_data = os.urandom(2 * block + 1000)     # 3 blocks
            with cluster.client() as client:
                client.write_file("/client/f", client_data)
                assert client.read_file("/client/f") == client_data
            mount_data = os.urandom(block + 5)               # 2 blocks
            (mount.mp / "m").write_bytes(mount_data)
            assert (mount.mp / "m").read_bytes() == mount_data
            for name in ("x", "y", "z"):                     # changes under the folder's lease
                (mount.mp / name).write_bytes(b"")
            os.unlink(mount.mp / "x")
            os.rename(mount.mp / "y", mount.mp / "w")
            written = 2 * (len(client_data) + len(mount_data))   # 2 replicas each

            prometheus = Prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports])

            def all_up():
                try:
                    targets = prometheus.api("targets")["activeTargets"]
                except OSError:
                    return None
                if len(targets) == len(ports) and all(
                        t["health"] == "up" and not t["lastError"] for t in targets):
                    return targets
                return None

            assert poll_until(all_up, 60), (prometheus.api("targets"), prometheus.log_text())

            def query_at_least(expr, want):
                got = poll_until(lambda: (prometheus.query(expr) or 0) >= want, 30)
                assert got, (expr, prometheus.query(expr), want)

            # the client's create is a call; the mount's four go in its lease's batches
            query_at_least('sum(leasefs_meta_rpc_calls_total{method="create",outcome="ok"})', 1)
            query_at_least('sum(leasefs_meta_rpc_calls_total{method="dir_batch",outcome="ok"})',
                           1)
            query_at_least("leasefs_meta_journal_sync_duration_seconds_count", 1)
            query_at_least('leasefs_meta_blocks{state="COMPLETE"}', 5)
            assert prometheus.query('leasefs_meta_blocks{state="COMPLETE"}') == 5
            query_at_least("sum(leasefs_storage_written_bytes_total)", written)
            query_at_least('sum(leasefs_storage_ops_total{op="WRITE_BLOCK",result="ok"})', 5)
            query_at_least('sum(leasefs_mount_fuse_ops_total{op="write",result="ok"})', 1)
            query_at_least("leasefs_mount_written_bytes_total", len(mount_data))
            query_at_least('leasefs_mount_fuse_op_duration_seconds_count{op="write"}', 1)
            assert prometheus.query("leasefs_mount_pipeline_recoveries_total") == 0
            query_at_least("leasefs_mount_dir_lease_changes_total", 6)   # 4 creates, 2 more
            query_at_least("leasefs_mount_dir_lease_batches_total", 1)
            assert prometheus.query("leasefs_mount_dir_lease_lost_total") == 0
            assert prometheus.query("leasefs_mount_dir_lease_refused_total") == 0
            mount.stop()
        finally:
            if prometheus is not None:
                prometheus.stop()
            mount.cleanup()
