"""Hosts need synchronized clocks (tokens and leases use wall time): block servers carry
their wall clock in register and heartbeat calls; the metadata server warns about a skew past
``clock_skew_warn`` (log, report, web page, metrics) and refuses a registration past
``clock_skew_max``. A block server's clock is faked with ``LEASEFS_TEST_CLOCK_OFFSET``."""

from __future__ import annotations

import re
import urllib.request

import pytest

from harness import ProcessCluster, leasefs, poll_until
from storage.heartbeat import CLOCK_OFFSET_ENV

pytestmark = pytest.mark.slow


def test_clock_skew_is_warned_about_and_refused_past_the_limit(tmp_path, monkeypatch):
    cluster = ProcessCluster(tmp_path / "c", n_storage=2, meta_http=True,
                             settings={"clock_skew_warn": 2.0, "clock_skew_max": 10.0})
    try:
        cluster.start_meta()
        cluster.start_storage(0)                      # in step
        monkeypatch.setenv(CLOCK_OFFSET_ENV, "5")     # ahead: warned about, taken
        cluster.start_storage(1)
        monkeypatch.setenv(CLOCK_OFFSET_ENV, "-60")   # far behind: refused
        cluster.start_storage(2)
        monkeypatch.delenv(CLOCK_OFFSET_ENV)
        report = cluster.wait_ready(2)
        by_address = {n["address"]: n for n in report["live_nodes"]}
        assert len(by_address) == 2
        ahead = by_address[(cluster.base / "run" / "storage1.addr").read_text().strip()]
        in_step = by_address[(cluster.base / "run" / "storage0.addr").read_text().strip()]
        assert ahead["clock_warning"] and 4.0 < ahead["clock_skew"] < 6.0, ahead
        assert not in_step["clock_warning"] and abs(in_step["clock_skew"]) < 1.0, in_step

        meta_log = (cluster.base / "logs" / "meta.log")
        refused = poll_until(lambda: re.search(
            r"refused: its clock is 6\d\.\d s behind the metadata server's \(more than "
            r"clock_skew_max = 10 s\)", meta_log.read_text()), timeout=20)
        assert refused, cluster.log_tail("meta")
        assert f"{ahead['node_id']} at {ahead['address']}: its clock is " in meta_log.read_text()
        assert poll_until(lambda: "refusing (ClockSkew)" in cluster.log_tail("storage2")
                          and "synchronize the hosts' clocks" in cluster.log_tail("storage2"),
                          timeout=20), cluster.log_tail("storage2")

        shown = leasefs(cluster, "report")
        assert re.search(rf"warning: {ahead['node_id']}'s clock is [45]\.\d s ahead of the "
                         rf"metadata server's", shown.stdout), shown.stdout
        assert in_step["node_id"] not in shown.stdout.split("warning:", 1)[1]

        base = f"http://127.0.0.1:{cluster.meta_http_port}"
        page = urllib.request.urlopen(f"{base}/datanodes", timeout=10).read().decode()
        assert re.search(r"clock \+[45]\.\d s", page), page
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
        value = re.search(r"^leasefs_meta_block_server_clock_skew_seconds (\S+)$", metrics,
                          re.M)
        assert value and 4.0 < float(value.group(1)) < 6.0, metrics
    finally:
        cluster.stop()
