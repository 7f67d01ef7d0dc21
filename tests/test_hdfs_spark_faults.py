"""Faults under a running Spark job on ``hdfs://``: a kill -9 of the active metadata server
of an ``ha = etcd`` cluster (Spark configured with the nameservice and Hadoop's configured
failover proxy provider), a kill -9 of a block server in the job's write pipelines, and a
restart of the metadata server. Each job writes enough to be running when the fault lands
(it lands when the first output file appears) and must finish as if nothing happened:
``_SUCCESS``, every row (read by Spark and by the leasefs Python client), no
``_temporary`` left.

One ``local[2]`` session for the module (``local[2]``: a failed task fails the job, so a
job that finishes rode the fault out inside Hadoop's client, with no Spark retry).
"""

from __future__ import annotations

import io
import threading
import time

import pyarrow.parquet as pq
import pytest

import sparkkit
from hadoopkit import requires_java
from hakit import HACluster
from harness import ProcessCluster, free_port, poll_until
from storage.hdfs.xfer import HdfsWire

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, requires_java]

BLOCK = 1 << 20
#: rows and tasks of each job: ~60 MB of parquet in 16 files of several blocks each
ROWS, TASKS = 240_000, 16
#: Hadoop client settings of the jobs on one metadata server: its client retries nothing
#: unless its retry policy is on (neither a refused connection nor a call in flight when
#: the server died; as against HDFS's namenode): on, every 0.1-0.3 s for up to 30 s
RETRYING = {"dfs.client.retry.policy.enabled": "true", "dfs.client.retry.policy.spec": "200,150",
            "dfs.blocksize": BLOCK}
#: ... and of the jobs on a nameservice: no retry policy (it would also be each server's
#: connection retry policy: 30 s of connection attempts to a dead active before the first
#: failover), failovers at most 0.2-0.6 s apart rather than Hadoop's default backoff (up to
#: 15 s), and enough of them to outlast the election (docs/CLIENTS.md, "hdfs:// and HA")
FAILING_OVER = {"dfs.client.retry.policy.enabled": "false",
                "dfs.client.failover.sleep.base.millis": 100,
                "dfs.client.failover.sleep.max.millis": 400,
                "dfs.client.failover.max.attempts": 40, "dfs.blocksize": BLOCK}


#: how long a block server holds a Java writer's last ack for its block reports
REPORT_WAIT = HdfsWire.report_wait
FILES_AFTER = 10


@pytest.fixture(scope="module")
def spark():
    yield from sparkkit.run_spark("leasefs-hdfs-spark-faults")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Replication 3 on 4 block servers: a pipeline loses one node and keeps going.
    ``safemode_min_storage`` 1 as by default (the tests' 0 would let a restarted server whose
    namespace holds no complete block yet leave safe mode before any block server is back,
    and refuse the jobs' ``addBlock`` for want of one, instead of answering SafeMode, which
    the client retries)."""
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-spark-faults"), n_storage=4, settings={
            "inline_max": 0, "replication": 3, "block_size": BLOCK, "safemode_min_storage": 1,
            "meta_hdfs_port": free_port()}) as running:
        yield running


def configure(spark, settings: dict) -> None:
    """Settings of the Hadoop client a job makes for a file system it has not met yet
    (Hadoop caches one client per file system and user)."""
    conf = spark._jsc.hadoopConfiguration()
    for key, value in settings.items():
        conf.set(key, str(value))


def frame(spark):
    """Rows of hashes (parquet cannot squeeze them) numbered 0..ROWS-1."""
    return spark.range(ROWS, numPartitions=TASKS).selectExpr(
        "id", "sha2(CAST(id AS STRING), 512) AS h", "sha2(CAST(-id AS STRING), 512) AS g")


class Job:
    """A Spark write in a thread of its own: ``wait()`` re-raises what the job raised."""

    def __init__(self, spark, target: str):
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, args=(spark, target), daemon=True)
        self.thread.start()

    def _run(self, spark, target):
        try:
            frame(spark).write.parquet(target)
        except BaseException as exc:            # handed to the test's thread
            self.error = exc
        finally:
            self.seconds = time.monotonic() - self.started

    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout: float = 300) -> float:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the job still runs after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.seconds


def outputs(client, root: str) -> list[str]:
    """The part files under ``root``, also those of task attempts not yet committed."""
    found = []
    if not client.exists(root):
        return found
    for entry in client.list_status(root):
        path = f"{root}/{entry.name}"
        if entry.type == "dir":
            found += outputs(client, path)
        elif entry.name.startswith("part-"):
            found.append(path)
    return found


def until_writing(client, job: Job, root: str) -> None:
    """Returns once the job is writing its first output file (and is still running)."""
    assert poll_until(lambda: outputs(client, root) or not job.running(), timeout=120)
    assert job.running(), "the job finished before the fault: make it bigger"


def check_every_row(spark, client, folder: str, target: str) -> None:
    assert client.exists(f"{folder}/_SUCCESS")
    assert sparkkit.leftovers(client, folder) == []
    got = spark.read.parquet(target)
    assert got.count() == ROWS
    assert got.where("h != sha2(CAST(id AS STRING), 512)").count() == 0
    # the same files through the leasefs Python client, read by pyarrow
    ids = []
    for path in outputs(client, folder):
        table = pq.read_table(io.BytesIO(client.read_file(path)), columns=["id"])
        ids += table.column("id").to_pylist()
    assert sorted(ids) == list(range(ROWS))


def test_a_kill_of_the_active_during_a_spark_job_fails_over_and_the_job_finishes(
        spark, tmp_path):
    with HACluster(tmp_path / "ha", n_meta=2, n_storage=1, hdfs=True, settings={
            "inline_max": 0, "replication": 1, "block_size": BLOCK}) as cluster:
        active, standby = cluster.active_and_standby()
        configure(spark, {**FAILING_OVER,
                           **cluster.hdfs_conf([active, standby], nameservice="leasefs-ha")})
        target = "hdfs://leasefs-ha/ha-job"
        with cluster.client() as client:
            job = Job(spark, target)
            until_writing(client, job, "/ha-job")
            cluster.kill_meta(active)
            seconds = job.wait()
            print(f"job with a kill -9 of the active: {seconds:.1f} s")
            assert cluster.wait_active(besides=active) == standby
            check_every_row(spark, client, "/ha-job", target)
        # with the old active still dead, a file's last packet is acked as soon as the new
        # active knows the replica, not after the block server's wait for its reports to
        # every metadata server (REPORT_WAIT each) runs out on the dead one
        jvm = spark._jvm
        path = jvm.org.apache.hadoop.fs.Path("hdfs://leasefs-ha/after/f")
        fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        started = time.monotonic()
        for i in range(FILES_AFTER):
            out = fs.create(jvm.org.apache.hadoop.fs.Path(f"hdfs://leasefs-ha/after/{i}"))
            out.write(bytearray(b"x" * 1000))
            out.close()
        seconds = time.monotonic() - started
        print(f"{FILES_AFTER} small files written after the failover: {seconds:.1f} s")
        assert seconds < FILES_AFTER * REPORT_WAIT / 2


def test_a_block_server_killed_during_a_spark_job_and_the_job_writes_every_row(
        spark, cluster):
    configure(spark, RETRYING)
    target = f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}/pipe-job"
    with cluster.client() as client:
        job = Job(spark, target)
        until_writing(client, job, "/pipe-job")
        # every pipeline runs through three of the four: most of the open ones lose a node
        cluster.kill_storage(1)
        try:
            seconds = job.wait()
            print(f"job with a kill -9 of a block server: {seconds:.1f} s")
            check_every_row(spark, client, "/pipe-job", target)
        finally:
            cluster.start_storage(1)
            cluster.wait_ready()


def test_a_metadata_server_restart_during_a_spark_job_and_the_job_finishes(spark, cluster):
    configure(spark, RETRYING)
    target = f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}/restart-job"
    with cluster.client() as client:
        job = Job(spark, target)
        until_writing(client, job, "/restart-job")
        cluster.kill_meta()
        cluster.start_meta()
        seconds = job.wait()
        print(f"job with a restart of the metadata server: {seconds:.1f} s")
        cluster.wait_ready()
        check_every_row(spark, client, "/restart-job", target)
