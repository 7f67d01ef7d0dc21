"""Spark's own readers, writers and commit protocol on ``hdfs://``: Hadoop's client from
PySpark's jars talking to leasefs's HDFS ports (the metadata server's IPC, the block
servers' data transfer), against Spark on a local folder and the leasefs Python data source
on the same files.

One process cluster (two block servers) and one ``local[2]`` session for the module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from hadoopkit import requires_java
from harness import ProcessCluster, free_port
import sparkkit

pytestmark = [requires_java, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("hdfs-spark"), n_storage=2, meta_http=True,
                       settings={"replication": 2, "meta_hdfs_port": free_port()})
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    yield from sparkkit.run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from sparkkit.run_spark("leasefs-hdfs-spark")


def hdfs(cluster, path: str) -> str:
    return f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}{path}"


def frame(spark, n=20_000):
    return spark.range(n, numPartitions=3).selectExpr(
        "id", "CAST(id % 7 AS INT) AS part", "CAST(id AS DOUBLE) / 3 AS ratio",
        "concat('name-', id) AS name", "date_add(DATE'2000-01-01', CAST(id % 50 AS INT)) AS day")


@pytest.mark.parametrize("fmt", ["parquet", "orc", "csv", "json"])
def test_partitioned_writes_and_reads_match_spark_on_local_disk(spark, cluster, client,
                                                                tmp_path, fmt):
    df = frame(spark)
    options = {"header": "true"} if fmt == "csv" else {}
    target, local = hdfs(cluster, f"/w-{fmt}"), str(tmp_path / fmt)
    for where in (target, local):
        df.write.partitionBy("part").options(**options).format(fmt).save(where)
    schema = df.schema if fmt in ("csv", "json") else None

    def read(where):
        reader = spark.read.format(fmt).options(**options)
        return reader.schema(schema).load(where) if schema else reader.load(where)

    assert sparkkit.rows(read(target)) == sparkkit.rows(read(local))
    assert client.exists(f"/w-{fmt}/_SUCCESS")
    assert sparkkit.leftovers(client, f"/w-{fmt}") == []
    # the Python data source reads the same files the JVM wrote
    ours = spark.read.format("leasefs").option("format", fmt).options(**options)
    if schema:
        ours = ours.schema(schema)
    assert sparkkit.rows(ours.load(sparkkit.url(cluster, f"/w-{fmt}")).select(*df.columns)) \
        == sparkkit.rows(read(local).select(*df.columns))


def test_append_overwrite_and_dynamic_overwrite(spark, cluster, client):
    target = hdfs(cluster, "/modes")
    df = frame(spark, 3000)
    df.write.partitionBy("part").parquet(target)
    df.where("part < 2").write.mode("append").partitionBy("part").parquet(target)
    assert spark.read.parquet(target).count() == 3000 + df.where("part < 2").count()
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        df.where("part = 3").limit(10).write.mode("overwrite").partitionBy("part").parquet(target)
    finally:
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", "static")
    got = spark.read.parquet(target)
    assert got.where("part = 3").count() == 10
    assert got.where("part = 4").count() == df.where("part = 4").count()
    df.limit(5).write.mode("overwrite").parquet(target)
    assert spark.read.parquet(target).count() == 5
    assert sparkkit.leftovers(client, "/modes") == []


def test_files_the_python_client_wrote_read_through_hdfs(spark, cluster, client, tmp_path):
    """Written by leasefs's own client (big enough for blocks, and a small one kept inline
    in the namespace): Spark's csv reader on hdfs:// sees what it sees locally."""
    lines = "".join(f"{i},name-{i}\n" for i in range(40_000)).encode()
    small = b"0,zero\n1,one\n"
    for name, data in (("big.csv", lines), ("small.csv", small)):
        client.write_file(f"/py/{name}", data)
        (tmp_path / name).write_bytes(data)
    for name in ("big.csv", "small.csv"):
        assert sparkkit.rows(spark.read.csv(hdfs(cluster, f"/py/{name}"))) == \
            sparkkit.rows(spark.read.csv(os.fspath(tmp_path / name)))


def test_bench_spark_times_spark_on_hdfs_beside_its_local_folder(cluster):
    """``leasefs bench spark --hdfs``: Spark's own parquet on hdfs:// timed beside the
    data source and Spark on a local folder, every row read back, nothing left behind."""
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "bench", "spark", "--rows", "3000", "--partitions", "2",
         "--hdfs", f"127.0.0.1:{cluster.settings['meta_hdfs_port']}", "--json", "--quiet"],
        env=cluster.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert {"hdfs_write", "hdfs_read", "hdfs_select"} <= result["rows_per_s"].keys()
    assert result["hdfs_reads"] == "short-circuit"
    with cluster.client() as c:
        assert not [s.name for s in c.list_status("/.leasefs-bench")]


def test_a_streaming_file_sink_with_its_checkpoint_on_hdfs_survives_a_restart(spark, cluster,
                                                                             client, tmp_path):
    """Structured Streaming's file sink and its checkpoint (offsets and commits written
    through FileContext: rename2 with overwrite, hflush) on hdfs://: a second query on the
    same checkpoint takes up only the new input, so every row is in the output once."""
    source = tmp_path / "in"
    source.mkdir()
    out, checkpoint = hdfs(cluster, "/stream/out"), hdfs(cluster, "/stream/checkpoint")

    def batch(name, first, n):
        (source / name).write_text("".join(f"{i}\n" for i in range(first, first + n)))

    def run():
        query = (spark.readStream.schema("v long").csv(str(source))
                 .writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()

    batch("a.csv", 0, 100)
    run()
    batch("b.csv", 100, 50)
    batch("c.csv", 150, 25)
    run()                                  # a restart: a new query, the same checkpoint
    values = sorted(r.v for r in spark.read.parquet(out).collect())
    assert values == list(range(175))
    assert client.exists("/stream/checkpoint/commits/1")


def hdfs_calls(cluster) -> dict[str, float]:
    """Calls the metadata server answered on its HDFS port, by method (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.meta_http_port}/metrics",
                                timeout=30) as page:
        text = page.read().decode()
    counts: dict[str, float] = {}
    for m in re.finditer(r'^leasefs_meta_rpc_calls_total\{method="hdfs\.(\w+)",'
                         r'outcome="ok"\} (\S+)$', text, re.M):
        counts[m.group(1)] = float(m.group(2))
    return counts


def test_a_job_writing_2000_small_files_completes_each_at_the_first_call(spark, cluster):
    """Hadoop's client sleeps 400 ms (doubling) after a ``complete`` that answers false:
    every file of a job writing 2,000 small ones is completed by exactly one call."""
    before = hdfs_calls(cluster)
    spark.range(2000, numPartitions=2).write.option("maxRecordsPerFile", 1) \
        .parquet(hdfs(cluster, "/small-files"))
    after = hdfs_calls(cluster)
    created = after.get("create", 0) - before.get("create", 0)
    completed = after.get("complete", 0) - before.get("complete", 0)
    assert created >= 2000
    assert completed == created, (created, completed)
