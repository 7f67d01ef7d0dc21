"""The real Hadoop client from PySpark's jars, driven from tests: ``fs_shell`` runs
``org.apache.hadoop.fs.FsShell`` (``hdfs dfs``) in a JVM of its own against an ``hdfs://``
address, with a configuration folder of the test's making (FsShell refuses to start without
a ``core-site.xml`` on its class path). Tests that need it carry ``requires_java``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.bench.hdfs import hadoop_conf as write_conf
from tools.bench.hdfs import hadoop_jars as jars

__all__ = ["fs_shell", "jars", "requires_java", "write_conf"]


requires_java = pytest.mark.skipif(shutil.which("java") is None or jars() is None,
                                   reason="needs java and pyspark's Hadoop client jars")


def fs_shell(address: str, *args: str, conf: Path, user: str | None = None,
             timeout: float = 120.0, stdin: bytes | None = None,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """``FsShell -fs hdfs://ADDRESS ARGS`` in a new JVM; ``user``: who the client says it
    is in simple mode (``HADOOP_USER_NAME``). Output as bytes (``-cat`` of binary data)."""
    run_env = {**os.environ, **(env or {})}
    if user is not None:
        run_env["HADOOP_USER_NAME"] = user
    cmd = ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
           "-cp", f"{conf}{os.pathsep}{jars()}/*", "org.apache.hadoop.fs.FsShell",
           "-fs", f"hdfs://{address}", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=run_env)
