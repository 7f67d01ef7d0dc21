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
    cmd, run_env = shell_command(address, *args, conf=conf, user=user, env=env)
    return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=run_env)


def shell_command(address: str, *args: str, conf: Path, user: str | None = None,
                  env: dict | None = None) -> tuple[list[str], dict]:
    """The command line and environment of ``fs_shell`` (for a shell the test feeds or
    kills while it runs: ``-put -`` from a pipe)."""
    run_env = {**os.environ, **(env or {})}
    if user is not None:
        run_env["HADOOP_USER_NAME"] = user
    cmd = ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
           "-cp", f"{conf}{os.pathsep}{jars()}/*", "org.apache.hadoop.fs.FsShell",
           "-fs", f"hdfs://{address}", *args]
    return cmd, run_env


class HadoopJvm:
    """A JVM of its own holding Hadoop's client, driven through py4j (``jvm``): Java
    writers that hflush and stay open, and a process a test can kill -9 (``kill``)
    without taking a SparkSession down with it. ``fs(uri, settings)``: Hadoop's
    ``FileSystem`` for ``uri`` as ``user`` (simple authentication)."""

    def __init__(self, user: str = "root", heap: str = "512m", conf: Path | None = None):
        """``conf``: a configuration folder put first on the class path."""
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        saved = os.environ.get("HADOOP_USER_NAME")
        os.environ["HADOOP_USER_NAME"] = user   # the launched JVM inherits it
        classpath = f"{jars()}/*" if conf is None else f"{conf}{os.pathsep}{jars()}/*"
        try:
            # the process is kept to be killed: py4j's die_on_exit waits for its stdin to
            # close, which never happens while subprocess keeps the Popen of a live child
            port, self.proc = launch_gateway(
                classpath=classpath, die_on_exit=True, return_proc=True,
                javaopts=[f"-Xmx{heap}", "-XX:TieredStopAtLevel=1"],
                redirect_stdout=subprocess.DEVNULL, redirect_stderr=subprocess.DEVNULL)
        finally:
            if saved is None:
                os.environ.pop("HADOOP_USER_NAME", None)
            else:
                os.environ["HADOOP_USER_NAME"] = saved
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
        self.jvm = self.gateway.jvm

    def fs(self, uri: str, settings: dict | None = None):
        conf = self.jvm.org.apache.hadoop.conf.Configuration()
        # a new FileSystem (and DFSClient, with its own client name) per call
        conf.set("fs.hdfs.impl.disable.cache", "true")
        for key, value in (settings or {}).items():
            conf.set(key, str(value))
        return self.jvm.org.apache.hadoop.fs.FileSystem.get(self.jvm.java.net.URI(uri), conf)

    def path(self, path: str):
        return self.jvm.org.apache.hadoop.fs.Path(path)

    def bytes(self, data: bytes):
        """``data`` as a Java byte[] (py4j passes Python bytes as one)."""
        return bytearray(data)

    def kill(self) -> None:
        """kill -9: nothing of the client runs on (no close, no lease renewal)."""
        self.proc.kill()
        self.proc.wait()
        # py4j's finalizers would ask the dead JVM to free each object (an ERROR logged
        # per object): a client marked disconnected asks nothing
        client = self.gateway._gateway_client
        client.close()
        client.is_connected = False

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.gateway.shutdown()
            except Exception:   # noqa: BLE001 - a JVM that died answers nothing
                pass
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def java_read(jvm: HadoopJvm, fs, path: str) -> bytes:
    """The whole file at ``path`` read through Hadoop's ``FileSystem`` ``fs``."""
    stream = fs.open(jvm.path(path))
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()
