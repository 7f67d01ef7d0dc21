"""Metadata HA for Hadoop's own client: every metadata server of an ``ha = etcd`` cluster
answers on an HDFS port of its own, a standby as HDFS's standby does (StandbyException),
and the client's ``ConfiguredFailoverProxyProvider`` (``hdfs://<nameservice>/``) finds
the active, also when the active is killed while FsShell writes."""

from __future__ import annotations

import random
import subprocess
import time

import pytest
from hadoopkit import HadoopJvm, fs_shell, requires_java, shell_command, write_conf
from hakit import HACluster

from harness import poll_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, requires_java]

SETTINGS = {"security": "simple", "inline_max": 0, "block_size": 1 << 20}
RPC_TIMEOUT_MS = 60_000
DATA = random.Random(35).randbytes(3 * (1 << 20) + 777)   # several blocks, a partial last


@pytest.fixture
def cluster(tmp_path):
    with HACluster(tmp_path / "c", n_meta=2, n_storage=1, hdfs=True,
                   settings=SETTINGS) as running:
        yield running


def test_the_failover_proxy_provider_finds_the_active_past_a_standby(cluster, tmp_path):
    active, standby = cluster.active_and_standby()
    # the standby first: the client must be told to move on, not fail
    conf = write_conf(tmp_path / "conf", cluster.hdfs_conf([standby, active]))
    src = tmp_path / "src"
    src.write_bytes(DATA)
    proc = fs_shell("leasefs", "-put", str(src), "/ha-f", conf=conf, user="root")
    assert proc.returncode == 0, proc.stderr.decode()
    proc = fs_shell("leasefs", "-cat", "/ha-f", conf=conf, user="root")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == DATA
    # asked alone, the standby refuses and names the active
    proc = fs_shell(cluster.hdfs_address(standby), "-ls", "/", conf=conf, user="root")
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [
        f"ls: metadata server {standby} is standby; the active is {active}"]


def test_a_kill_of_the_active_during_a_java_write_fails_over_and_the_write_completes(
        cluster, tmp_path):
    active, standby = cluster.active_and_standby()
    conf = write_conf(tmp_path / "conf", {
        **cluster.hdfs_conf([active, standby]),
        # the first failover waits 0.5-1 s, not Hadoop's default backoff of up to 15 s
        "dfs.client.failover.sleep.base.millis": 200,
        "dfs.client.failover.sleep.max.millis": 1000})
    cmd, env = shell_command("leasefs", "-put", "-d", "-", "/ha-streamed", conf=conf,
                             user="root")
    log = tmp_path / "writer.log"
    with open(log, "wb") as out:
        writer = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=out)
    try:
        half = len(DATA) // 2
        writer.stdin.write(DATA[:half])
        writer.stdin.flush()
        with cluster.client() as client:
            # the file is open for writing through the active: now kill it
            assert poll_until(lambda: client.exists("/ha-streamed"), timeout=60)
        cluster.kill_meta(active)
        writer.stdin.write(DATA[half:])
        writer.stdin.close()
        writer.wait(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, log.read_text()
    assert cluster.wait_active(besides=active) == standby
    with cluster.client() as client:
        assert client.read_file("/ha-streamed") == DATA
    # a read through the nameservice whose first server is the dead one moves on too
    proc = fs_shell("leasefs", "-cat", "/ha-streamed", conf=conf, user="root")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == DATA


def test_observer_reads_through_the_observer_read_proxy_provider(tmp_path):
    """``ObserverReadProxyProvider``: writes go to the active, reads to the observer, which
    sees the writer's own writes (the state id of the answers' headers): with the active
    and the standby frozen, the writer still stats, lists and reads what it wrote, at once
    (a client that did not know the observer would wait out its RPC timeout on the frozen
    active before it tried another server)."""
    with HACluster(tmp_path / "c", n_meta=2, observers=1, n_storage=1, hdfs=True,
                   settings=SETTINGS) as cluster, HadoopJvm() as jvm:
        active, standby = cluster.active_and_standby()
        cluster.wait_role("meta2", "observer")
        settings = {**cluster.hdfs_conf(), "dfs.client.failover.proxy.provider.leasefs":
                    "org.apache.hadoop.hdfs.server.namenode.ha.ObserverReadProxyProvider",
                    "ipc.client.rpc-timeout.ms": RPC_TIMEOUT_MS}
        fs = jvm.fs("hdfs://leasefs/", settings)
        out = fs.create(jvm.path("/obs/f"), True)
        out.write(jvm.bytes(DATA))
        out.close()
        assert fs.getFileStatus(jvm.path("/obs/f")).getLen() == len(DATA)
        for name in (active, standby):
            cluster.pause(name)
        started = time.monotonic()
        try:
            assert fs.getFileStatus(jvm.path("/obs/f")).getLen() == len(DATA)
            assert [s.getPath().getName() for s in fs.listStatus(jvm.path("/obs"))] == ["f"]
            stream = fs.open(jvm.path("/obs/f"))
            try:
                assert bytes(stream.readAllBytes()) == DATA
            finally:
                stream.close()
            assert time.monotonic() - started < RPC_TIMEOUT_MS / 1000 / 2
        finally:
            for name in (active, standby):
                cluster.resume(name)
        fs.close()
