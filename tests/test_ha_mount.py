"""The FUSE mount and a Spark job ride through a metadata failover (ha = etcd, real
processes): an open writer keeps its lease and its file is whole, the mount answers
again within the failover time, and a Spark write job started before a kill -9 of the
active finishes with every row."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from harness import Mount
from hakit import HACluster

pytestmark = pytest.mark.slow
MiB = 1 << 20


@pytest.fixture
def ha(tmp_path):
    cluster = HACluster(tmp_path, n_meta=2, n_storage=3,
                        settings={"block_size": 1 * MiB, "replication": 2})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_mount_writer_keeps_writing_through_a_kill9_of_the_active(ha):
    mount = Mount(ha, "ha")
    try:
        mount.start()
        path = mount.mp / "through-failover.bin"
        chunks = [os.urandom(256 * 1024) for _ in range(24)]   # 6 MiB: six blocks
        killed = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with open(path, "wb") as fh:
                    for i, chunk in enumerate(chunks):
                        fh.write(chunk)
                        fh.flush()
                        if i == 8:
                            killed.wait(30)   # the rest goes to the next active
                        time.sleep(0.05)
                    os.fsync(fh.fileno())
            except BaseException as exc:   # reported below
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(1.0)
        active = ha.wait_active()
        ha.kill_meta(active)
        killed.set()
        started = time.monotonic()
        new = ha.wait_active(besides=active)
        writer.join(120)
        assert not writer.is_alive() and errors == [], errors
        took = time.monotonic() - started
        data = path.read_bytes()
        assert hashlib.sha256(data).digest() == hashlib.sha256(b"".join(chunks)).digest()
        # the namespace is usable through the mount: a new folder and a listing
        (mount.mp / "after").mkdir()
        assert "after" in os.listdir(mount.mp)
        print(f"mount writer rode through a failover to {new} ({took:.1f} s after the kill)")
        mount.stop()
    finally:
        mount.cleanup()


def test_spark_write_job_rides_through_a_kill9_of_the_active(ha):
    """A Spark job writing parquet through ``leasefs://<every metadata server>/...`` while
    the active is killed: the job finishes and every row is there once."""
    from sparkkit import run_spark, url

    spark_gen = run_spark("ha-failover")
    spark = next(spark_gen)
    try:
        target = url(ha, "/spark/out")

        def slow(batches):   # runs in a Python worker: the job lasts a few seconds
            for batch in batches:
                time.sleep(0.4)
                yield batch

        df = spark.range(0, 200_000, numPartitions=16).selectExpr(
            "id", "repeat('x', 40) as pad")
        df = df.mapInArrow(slow, df.schema)
        killed: list = []

        def killer() -> None:
            # Spark's job runs on the test's thread (its data sources are registered there)
            with ha.client() as client:
                deadline = time.monotonic() + 120
                while not client.exists("/spark/out/_temporary"):
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.05)
            active = ha.wait_active()
            ha.kill_meta(active)
            killed.append(time.monotonic())

        watcher = threading.Thread(target=killer)
        watcher.start()
        df.write.format("leasefs").mode("overwrite").save(target)
        finished = time.monotonic()
        watcher.join(60)
        assert killed, "the job never started writing"
        assert finished > killed[0] + 1.0, "the job ended before the failover"
        back = spark.read.format("leasefs").load(target)
        assert back.count() == 200_000
        assert back.selectExpr("sum(id)").first()[0] == sum(range(200_000))
    finally:
        try:
            next(spark_gen)
        except StopIteration:
            pass
