"""Faults under Hadoop's own Java client (``hadoopkit.HadoopJvm``: the client in a JVM of
its own, driven through py4j): a block server killed in a Java writer's pipeline, a
corrupt replica under a Java reader, a restart of the metadata server under a Java writer,
a Java writer killed after hflush, and leases held across the two worlds (Java writers,
leasefs clients, a FUSE mount). Short lease limits keep each test to seconds."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from hadoopkit import HadoopJvm, java_read, requires_java
from hakit import call
from py4j.protocol import Py4JJavaError

from harness import (ProcessCluster, errno_of, flip_finalized_byte, free_port, mounted,
                     poll_until, storage_index)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, requires_java]

BLOCK = 1 << 20
SOFT_LIMIT = 4.0
SETTINGS = {"security": "simple", "inline_max": 0, "replication": 3, "block_size": BLOCK,
            "lease_soft_limit": SOFT_LIMIT, "replication_interval": 0.2,
            "replication_pending_timeout": 5.0}
# the Java client's settings: its lease renewer runs every half RPC timeout (well inside
# the cluster's soft limit), and it reconnects quickly to a restarted metadata server
JAVA = {"ipc.client.rpc-timeout.ms": int(SOFT_LIMIT * 1000), "dfs.blocksize": BLOCK,
        "ipc.client.connect.max.retries": 100, "ipc.client.connect.retry.interval": 100,
        "dfs.client.block.write.locateFollowingBlock.initial.delay.ms": 50}


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-faults"), n_storage=4, settings={
            **SETTINGS, "meta_hdfs_port": free_port()}) as running:
        yield running


@pytest.fixture(scope="module")
def jvm():
    with HadoopJvm() as running:
        yield running


@pytest.fixture
def hdfs(cluster, jvm):
    """A new Java FileSystem (its own DFSClient, its own client name) on the cluster."""
    fs = jvm.fs(uri(cluster), JAVA)
    yield fs
    try:
        fs.close()
    except Py4JJavaError:
        pass   # a test left a file its writer can no longer close


def uri(cluster) -> str:
    return f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}/"


def client(cluster):
    """A leasefs client that renews its leases within the cluster's soft limit."""
    from fs.client import Client
    return Client(cluster.meta_address,
                  config=cluster.config().replace(lease_renew_period=SOFT_LIMIT / 4))


def last_block(c, path: str) -> dict:
    return c.get_block_locations(path)["blocks"][-1]


def java_error(exc: Py4JJavaError) -> str:
    return str(exc.java_exception.toString())


# --------------------------------------------------------------------------- block servers

def test_a_block_server_killed_in_a_java_pipeline_is_replaced_and_every_byte_reads(
        cluster, jvm, hdfs):
    """Replication 3 on 4 block servers: a kill -9 of a pipeline node after hflush makes
    the Java writer recover the pipeline (updateBlockForPipeline, a spare from
    getAdditionalDatanode, updatePipeline); the write finishes with three replicas of
    every block and reads back in both worlds."""
    data = payload(1, 2 * BLOCK + BLOCK // 2 + 123)
    cut = BLOCK + BLOCK // 2
    out = hdfs.create(jvm.path("/pipe/f"), True)
    out.write(jvm.bytes(data[:cut]))
    out.hflush()
    with client(cluster) as c:
        victim = last_block(c, "/pipe/f")
        assert len(victim["locations"]) == 3
        node = victim["locations"][1]          # a middle node: both neighbours notice
        index = storage_index(cluster, node["address"])
        cluster.kill_storage(index)
        try:
            out.write(jvm.bytes(data[cut:]))
            out.close()
            blocks = c.get_block_locations("/pipe/f")["blocks"]
            assert [len(b["locations"]) for b in blocks] == [3, 3, 3]
            recovered = next(b for b in blocks if b["block"]["id"] == victim["block"]["id"])
            # the spare joined the pipeline: three replicas at once, none on the dead node
            assert node["node_id"] not in {loc["node_id"] for loc in recovered["locations"]}
            assert recovered["block"]["gs"] > victim["block"]["gs"]
            assert c.read_file("/pipe/f") == data
            assert java_read(jvm, hdfs, "/pipe/f") == data
        finally:
            cluster.start_storage(index)
            cluster.wait_ready()


def test_a_corrupt_replica_is_skipped_by_the_java_reader_reported_and_replaced(
        cluster, jvm, hdfs):
    """Bytes flipped in one of a block's three replica files: every Java read returns
    the right bytes; a Java reader that meets the bad replica reports it (reportBadBlocks)
    and the metadata server replaces it from a good one."""
    data = payload(2, BLOCK // 2)
    meta_log = cluster.base / "logs" / "meta.log"
    with client(cluster) as c:
        c.write_file("/rot/f", data, replication=3)
        located = last_block(c, "/rot/f")
        block_id = located["block"]["id"]
        bad = located["locations"][0]["node_id"]
        flip_finalized_byte(cluster, located["locations"][0], block_id, 1000)

        def reported() -> bool:
            return f"replica of block {block_id} on {bad} reported corrupt" in \
                meta_log.read_text(errors="replace")

        # each open asks for the locations anew, shuffled: within a few reads one meets
        # the bad replica first (the odds of 30 misses are 2/3**30)
        for _ in range(30):
            assert java_read(jvm, hdfs, "/rot/f") == data
            if reported():
                break
        assert reported(), f"the corrupt replica on {bad} was not reported"

        def replaced():
            found = call(cluster.meta_address, "fsck", path="/rot")
            return found["status"] == "HEALTHY" and found["totals"]["corrupt_replicas"] == 0 \
                and len(last_block(c, "/rot/f")["locations"]) == 3
        assert poll_until(replaced, timeout=60), (
            last_block(c, "/rot/f"), call(cluster.meta_address, "fsck", path="/rot"))
        assert c.read_file("/rot/f") == data
    assert java_read(jvm, hdfs, "/rot/f") == data


# --------------------------------------------------------------------------- metadata server

def test_a_metadata_server_restart_under_a_java_writer(cluster, jvm):
    """kill -9 and a start of the metadata server while a Java writer has a file open:
    the client reconnects, resends what was in flight, and the file completes.

    The client has the retry policy CLIENTS.md tells a lone server's users to turn on.
    Without it Hadoop's client retries nothing against a lone server: its idle
    connection does not notice the restart, and the next call (the writer's addBlock)
    fails with an EOFException unless the lease renewer happened to call first."""
    hdfs = jvm.fs(uri(cluster), {**JAVA, "dfs.client.retry.policy.enabled": "true",
                                 "dfs.client.retry.policy.spec": "200,50"})
    data = payload(3, 2 * BLOCK + 4567)
    out = hdfs.create(jvm.path("/restart/f"), True)
    out.write(jvm.bytes(data[:BLOCK // 2]))
    out.hflush()
    cluster.kill_meta()
    cluster.start_meta()
    out.write(jvm.bytes(data[BLOCK // 2:]))
    out.close()
    cluster.wait_ready()
    with client(cluster) as c:
        assert c.read_file("/restart/f") == data
        assert c.is_file_closed("/restart/f")
    assert java_read(jvm, hdfs, "/restart/f") == data
    hdfs.close()


# --------------------------------------------------------------------------- leases

def test_a_java_writer_killed_after_hflush_keeps_its_hflushed_bytes(cluster, jvm, hdfs):
    """kill -9 of a JVM after hflush: once the soft limit passed, Java's recoverLease
    (from another JVM) closes the file with every hflushed byte, read in both worlds."""
    data = payload(4, BLOCK + 9999)
    with HadoopJvm() as doomed:
        fs = doomed.fs(uri(cluster), JAVA)
        out = fs.create(doomed.path("/killed/f"), True)
        out.write(doomed.bytes(data))
        out.hflush()
        out.write(doomed.bytes(b"never flushed"))
        doomed.kill()
    with client(cluster) as c:
        assert not c.is_file_closed("/killed/f")
        started = time.monotonic()
        answers = []
        while not answers or not answers[-1]:
            answers.append(bool(hdfs.recoverLease(jvm.path("/killed/f"))))
            assert time.monotonic() - started < 3 * SOFT_LIMIT + 20, answers
            if not answers[-1]:
                time.sleep(0.2)
        assert c.is_file_closed("/killed/f")
        assert c.read_file("/killed/f") == data
    assert java_read(jvm, hdfs, "/killed/f") == data


def test_java_recover_lease_closes_a_file_a_python_writer_left_open(cluster, jvm, hdfs):
    """A leasefs writer process killed after its flush: Java's recoverLease closes the
    file with the flushed bytes."""
    data = payload(5, 300_000)
    script = (
        "import sys, time\n"
        "from fs.client import Client\n"
        "from fs.config import Config\n"
        f"c = Client({cluster.meta_address!r}, config=Config().replace(**{TEST_CLIENT!r}))\n"
        "out = c.create('/pyopen/f')\n"
        "out.write(sys.stdin.buffer.read())\n"
        "out.hflush()\n"
        "print('flushed', flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=cluster.env, start_new_session=True)
    try:
        proc.stdin.write(data)
        proc.stdin.close()
        assert proc.stdout.readline() == b"flushed\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    started = time.monotonic()
    while not hdfs.recoverLease(jvm.path("/pyopen/f")):
        assert time.monotonic() - started < 3 * SOFT_LIMIT + 20
        time.sleep(0.2)
    assert hdfs.isFileClosed(jvm.path("/pyopen/f"))
    assert java_read(jvm, hdfs, "/pyopen/f") == data
    with client(cluster) as c:
        assert c.read_file("/pyopen/f") == data


TEST_CLIENT = {"rpc_retry_seconds": 10.0, "lease_renew_period": SOFT_LIMIT / 4}


@pytest.fixture(scope="module")
def mount(cluster):
    yield from mounted(cluster, "hdfs-faults")


def test_a_java_writers_lease_refuses_a_leasefs_append_and_a_mounts_truncate(
        cluster, jvm, hdfs, mount):
    out = hdfs.create(jvm.path("/held/java"), True)
    out.write(jvm.bytes(b"java holds this"))
    out.hflush()
    try:
        with client(cluster) as c:
            with pytest.raises(Exception) as refused:
                c.append("/held/java")
            assert type(refused.value).__name__ == "AlreadyBeingCreated", refused.value
            assert "/held/java" in str(refused.value)
            target = mount.mp / "held" / "java"
            assert errno_of(os.open, target, os.O_WRONLY | os.O_TRUNC) == errno.EBUSY
            out.write(jvm.bytes(b", and more"))
        out.close()
        out = None
        with client(cluster) as c:
            assert c.read_file("/held/java") == b"java holds this, and more"
    finally:
        if out is not None:
            out.close()


def test_a_leasefs_writers_lease_refuses_a_java_append_and_create(
        cluster, jvm, hdfs, mount):
    with client(cluster) as c:
        out = c.create("/held/python")
        out.write(b"python holds this")
        out.hflush()
        # (an OVERWRITE create takes the file, in HDFS as in leasefs)
        for attempt in (lambda: hdfs.append(jvm.path("/held/python")),
                        lambda: hdfs.create(jvm.path("/held/python"), False)):
            with pytest.raises(Py4JJavaError) as refused:
                attempt()
            text = java_error(refused.value)
            assert "AlreadyBeingCreatedException" in text and "/held/python" in text, text
        out.write(b", and more")
        out.close()
        assert java_read(jvm, hdfs, "/held/python") == b"python holds this, and more"
    # a mount's writer holds it the same way
    fd = os.open(mount.mp / "held" / "mounted", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"the mount holds this")
        os.fsync(fd)
        with pytest.raises(Py4JJavaError) as refused:
            hdfs.append(jvm.path("/held/mounted"))
        assert "AlreadyBeingCreatedException" in java_error(refused.value)
    finally:
        os.close(fd)
    with client(cluster) as c:   # the mount closes the file after close(2) returned
        assert poll_until(lambda: c.is_file_closed("/held/mounted"))
    assert java_read(jvm, hdfs, "/held/mounted") == b"the mount holds this"
