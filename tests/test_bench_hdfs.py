"""``leasefs bench hdfs`` as a real ``python -m tools`` process against a real cluster: Hadoop's
FsShell (PySpark's jars) and leasefs's CLI each write and read the file, the figures come out
as JSON, and the bench files are gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hadoopkit import requires_java
from harness import ProcessCluster, free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@requires_java
def test_bench_hdfs_times_both_clients_on_one_cluster(tmp_path):
    cluster = ProcessCluster(tmp_path / "cluster", n_storage=1, settings={
        "security": "simple", "meta_hdfs_port": free_port()})
    cluster.start()
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
        proc = subprocess.run(
            [sys.executable, "-m", "tools", "bench", "hdfs", "--meta", cluster.meta_address,
             "--hdfs", f"127.0.0.1:{cluster.settings['meta_hdfs_port']}", "--size", "3M",
             "--repeat", "1", "--replication", "1", "--json", "--quiet"],
            env=env, capture_output=True, timeout=300, cwd=str(REPO))
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        report = json.loads(proc.stdout)
        assert report["size"] == 3 << 20 and report["replication"] == 1
        for key in ("java_put", "java_cat", "py_put", "py_cat", "jvm_put", "jvm_cat"):
            result = report["results"][key]
            assert result["median_s"] > 0 and result["mb_s"] > 0
            assert (result["start_s"] > 0) == (not key.startswith("jvm"))
            assert len(result["all_s"]) == 1
        assert report["java_over_python"]["put_raw"] > 0
        with cluster.client() as client:
            assert [s.name for s in client.list_status("/.leasefs-bench")] == []
    finally:
        cluster.stop()
