"""``leasefs bench packets`` as a real ``python -m tools`` process against a real cluster:
pre-built HDFS packets of both shapes go through a two-node pipeline, the figures come out
as JSON, the written block reads back, and the bench files are gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ProcessCluster, free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_packets_times_both_packet_shapes_through_a_pipeline(tmp_path):
    cluster = ProcessCluster(tmp_path / "cluster", n_storage=2, settings={
        "security": "simple", "meta_hdfs_port": free_port()})
    cluster.start()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), "LEASEFS_HOME": str(tmp_path / "home")}
        proc = subprocess.run(
            [sys.executable, "-m", "tools", "bench", "packets", "--meta", cluster.meta_address,
             "--block-size", "2M", "--blocks", "2", "--repeat", "2", "--replication", "2",
             "--json", "--quiet"],
            env=env, capture_output=True, timeout=300, cwd=str(REPO))
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        report = json.loads(proc.stdout)
        assert (report["block_size"], report["blocks"], report["replication"]) == (2 << 20, 2, 2)
        for shape in ("hadoop_64k", "large_1m"):
            result = report["results"][shape]
            assert len(result["all_s"]) == 2 and result["mb_s"] > 0
            assert result["cpu_s_per_gib_node"] is None   # not this machine's embedded cluster
        with cluster.client() as client:
            assert [s.name for s in client.list_status("/.leasefs-bench")] == []
    finally:
        cluster.stop()
