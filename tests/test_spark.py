"""The Spark data source ``leasefs`` against a real process cluster and a real local Spark.

One ProcessCluster and one SparkSession (``local[2]``) per module: Spark's Python workers run
in other processes, so they reach the cluster over TCP like any client.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from sparkkit import run_client, run_cluster, run_spark, url  # noqa: E402

from spark_connector import commit as protocol  # noqa: E402
from spark_connector import formats, splits  # noqa: E402

ROUND_TRIP_ROWS = int(os.environ.get("LEASEFS_SPARK_ROWS", "1000000"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from run_cluster(tmp_path_factory, "spark-cluster")


@pytest.fixture(scope="module")
def client(cluster):
    yield from run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from run_spark("leasefs-tests")


def source_frame(spark, n: int, partitions: int = 4):
    """Rows with ints, floats, strings with commas/quotes/newlines/unicode, nulls,
    timestamps and dates (deterministic)."""
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id",
        "CASE WHEN id % 7 = 0 THEN NULL ELSE CAST(id * 3 - 5 AS INT) END AS i",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE CAST(id AS DOUBLE) / 8.0 - 1234.125 END AS f",
        "CASE WHEN id % 5 = 0 THEN NULL "
        "     WHEN id % 5 = 1 THEN concat('a,b \"q\" ', id) "
        "     WHEN id % 5 = 2 THEN concat('line1\\nline2,', id) "
        "     WHEN id % 5 = 3 THEN concat('ünï €😀 ', id) "
        "     ELSE '' END AS s",
        "CASE WHEN id % 13 = 0 THEN NULL ELSE "
        "     timestamp_micros(1500000000000000 + id * 1000003) END AS ts",
        "CASE WHEN id % 17 = 0 THEN NULL ELSE date_add(DATE'1969-12-01', CAST(id % 20000 AS INT))"
        " END AS d")


def assert_same(expected, actual):
    assert sorted(actual.columns) == sorted(expected.columns)
    actual = actual.select(*expected.columns)
    assert actual.count() == expected.count()
    assert expected.exceptAll(actual).count() == 0
    assert actual.exceptAll(expected).count() == 0


def visible(client, path):
    return sorted(s.name for s in client.list_status(path))


def published(client, path):
    """What a reader of ``path`` sees as output (staging folders aside)."""
    return tuple(n for n in visible(client, path) if n != protocol.TEMPORARY)


# --------------------------------------------------------------------------- round trips

@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,rows", [("parquet", ROUND_TRIP_ROWS), ("csv", ROUND_TRIP_ROWS),
                                      ("json", ROUND_TRIP_ROWS)])
@pytest.mark.slow
def test_round_trip(spark, cluster, client, fmt, rows):
    df = source_frame(spark, rows).cache()
    target = url(cluster, f"/rt/{fmt}")
    start = time.monotonic()
    df.write.format("leasefs").option("format", fmt).option("header", "true") \
        .mode("overwrite").save(target)
    names = visible(client, f"/rt/{fmt}")
    assert "_SUCCESS" in names and "_temporary" not in names
    assert len([n for n in names if n.endswith(formats.EXTENSIONS[fmt])]) == 4
    # values hold line breaks: csv needs multiLine, as with Spark's own source
    back = spark.read.format("leasefs").option("format", fmt).option("header", "true") \
        .option("multiLine", str(fmt == "csv").lower()).schema(df.schema).load(target)
    if fmt == "csv":     # Spark's csv reads a written "" back as null (nullValue "")
        df = df.selectExpr(*[c if c != "s" else "nullif(s, '') AS s" for c in df.columns])
    assert_same(df, back)
    print(f"{fmt}: {rows} rows round trip in {time.monotonic() - start:.1f}s")
    df.unpersist()


@pytest.mark.slow
def test_parquet_schema_inferred_and_csv_inference(spark, cluster, client, tmp_path):
    df = source_frame(spark, 2000, partitions=2)
    df.write.format("leasefs").option("format", "parquet").mode("overwrite") \
        .save(url(cluster, "/infer/pq"))
    back = spark.read.format("leasefs").option("format", "parquet").load(url(cluster, "/infer/pq"))
    assert [(f.name, f.dataType.typeName()) for f in back.schema.fields] == \
        [("id", "long"), ("i", "integer"), ("f", "double"), ("s", "string"),
         ("ts", "timestamp"), ("d", "date")]
    assert_same(df, back)
    data = b"k;big;v;name\n1;3000000000;2.5;x\n2;-4;;\"y;z\"\n"
    client.write_file("/infer/csv/a.csv", data, overwrite=True)
    got = spark.read.format("leasefs").option("format", "csv").option("header", "true") \
        .option("delimiter", ";").option("inferSchema", "true").load(url(cluster, "/infer/csv"))
    assert [(f.name, f.dataType.typeName()) for f in got.schema.fields] == \
        [("k", "integer"), ("big", "long"), ("v", "double"), ("name", "string")]
    assert sorted(tuple(r) for r in got.collect()) == \
        [(1, 3000000000, 2.5, "x"), (2, -4, None, "y;z")]
    local = tmp_path / "infer.csv"
    local.write_bytes(data)
    theirs = spark.read.option("header", "true").option("delimiter", ";") \
        .option("inferSchema", "true").csv(str(local))
    assert got.schema == theirs.schema


@pytest.mark.slow
def test_text_round_trip_and_binary_file(spark, cluster, client):
    lines = [f"line {i}, with \"quotes\" and ünïcode €" for i in range(5000)]
    df = spark.createDataFrame([(x,) for x in lines], "value string").repartition(3)
    df.write.format("leasefs").option("format", "text").mode("overwrite") \
        .save(url(cluster, "/txt/out"))
    back = spark.read.format("leasefs").option("format", "text").option("includePath", "true") \
        .load(url(cluster, "/txt/out"))
    assert sorted(r.value for r in back.collect()) == sorted(lines)
    assert all(r.path.startswith("/txt/out/part-") for r in back.select("path").collect())
    client.write_file("/bin/x/blob.bin", bytes(range(256)) * 10, overwrite=True)
    client.write_file("/bin/x/_hidden", b"no", overwrite=True)
    rows = spark.read.format("leasefs").option("format", "binaryFile") \
        .load(url(cluster, "/bin/x")).collect()
    assert len(rows) == 1
    assert rows[0].path == "/bin/x/blob.bin" and rows[0].length == 2560
    assert bytes(rows[0].content) == bytes(range(256)) * 10
    assert rows[0].modificationTime.year >= 2024


# --------------------------------------------------------------------------- splits, globs

@pytest.mark.slow
def test_text_file_split_by_block_reads_every_line_once(spark, cluster, client):
    import random
    rnd = random.Random(6)
    lines = [f"{i}:" + "x" * rnd.randrange(0, 3000) for i in range(2000)]
    data = ("\n".join(lines) + "\n").encode()
    with client.create("/split/big.txt", overwrite=True, block_size=64 << 10) as out:
        out.write(data)
    status = client.get_file_status("/split/big.txt")
    assert status.block_size == 64 << 10 and status.length == len(data)
    df = spark.read.format("leasefs").option("format", "text").load(url(cluster, "/split/big.txt"))
    assert df.rdd.getNumPartitions() >= len(data) // (64 << 10) - 1 > 10
    assert df.count() == data.count(b"\n") == len(lines)       # wc -l
    assert df.distinct().count() == len(lines)                 # no duplicates
    assert sorted(r.value for r in df.collect()) == sorted(lines)
    # json lines split the same way
    json_data = "".join(f'{{"n": {i}, "pad": "{"y" * rnd.randrange(0, 500)}"}}\n'
                        for i in range(3000)).encode()
    with client.create("/split/j/big.json", overwrite=True, block_size=64 << 10) as out:
        out.write(json_data)
    jdf = spark.read.format("leasefs").option("format", "json").schema("n long, pad string") \
        .load(url(cluster, "/split/j"))
    assert jdf.rdd.getNumPartitions() > 5
    assert sorted(r.n for r in jdf.select("n").collect()) == list(range(3000))


def test_line_split_ranges_cover_file_exactly_once():
    """Hadoop LineRecordReader semantics for every split size, no Spark involved."""
    class Mem:
        def __init__(self, data):
            self.data = data

        def pread(self, off, n):
            return self.data[off:off + n]

    data = b"a\nbb\n\nccc\ndddd\ne\n\nffffffffff\ng"
    for size in range(1, len(data) + 2):
        got = []
        for start in range(0, len(data), size):
            begin, stop = splits.line_split_range(Mem(data), start, min(start + size, len(data)),
                                                   len(data))
            got.append(data[begin:stop])
        assert b"".join(got) == data, size


@pytest.mark.slow
def test_globs_hidden_names_partitions_and_pushdown(spark, cluster, client):
    for year in (2023, 2024):
        for month in (1, 2):
            client.write_file(f"/part/year={year}/month={month}/data.csv",
                              f"{year},{month}\n{year},{month * 10}\n".encode(), overwrite=True)
    client.write_file("/part/year=2024/month=1/_ignored.csv", b"9,9\n", overwrite=True)
    client.write_file("/part/year=2024/month=1/.hidden.csv", b"9,9\n", overwrite=True)
    df = spark.read.format("leasefs").option("format", "csv").schema("a long, b long") \
        .load(url(cluster, "/part"))
    assert [(f.name, f.dataType.typeName()) for f in df.schema.fields] == \
        [("a", "long"), ("b", "long")]
    df = spark.read.format("leasefs").option("format", "csv").load(url(cluster, "/part"))
    assert [f.name for f in df.schema.fields] == ["_c0", "_c1", "year", "month"]
    assert df.count() == 8
    assert sorted((r.year, r.month) for r in df.select("year", "month").distinct().collect()) \
        == [(2023, 1), (2023, 2), (2024, 1), (2024, 2)]
    globbed = spark.read.format("leasefs").option("format", "csv") \
        .load(url(cluster, "/part/year=202[4]/month=*"))
    assert globbed.count() == 4
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        pushed = df.filter("year = 2024 AND month >= 2")
        assert pushed.count() == 2
        assert sorted(tuple(r) for r in pushed.collect()) == \
            [("2024", "2", 2024, 2), ("2024", "20", 2024, 2)]
        mixed = df.filter("year = 2023 AND _c1 = '10'")
        assert [tuple(r) for r in mixed.collect()] == [("2023", "10", 2023, 1)]
        plan = pushed._jdf.queryExecution().executedPlan().toString()
        assert "Filter (" not in plan        # both conjuncts pushed and enforced exactly
        plan = mixed._jdf.queryExecution().executedPlan().toString()
        assert "Filter (" in plan and "_c1" in plan    # the data-column filter stays in Spark
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


# --------------------------------------------------------------------------- commit protocol

@pytest.mark.slow
def test_failed_job_leaves_nothing_and_rerun_gives_one_copy(spark, cluster, client):
    from pyspark.sql.functions import udf
    target = url(cluster, "/jobs/out")
    client.mkdirs("/jobs/out")
    before = visible(client, "/jobs/out")

    @udf("long")
    def explode_on_partition_two(x):
        if x >= 2000 and x < 2100:
            raise ValueError("injected task failure")
        return x

    df = spark.range(0, 4000, numPartitions=4)
    failing = df.withColumn("id", explode_on_partition_two("id"))
    with pytest.raises(Exception, match="injected task failure"):
        failing.write.format("leasefs").option("format", "parquet").mode("append").save(target)
    left = [n for n in visible(client, "/jobs/out") if not n.startswith("_")]
    assert left == before == []           # no new visible files
    # a straggler's leftover (a task that was still running when abort ran)
    client.write_file("/jobs/out/_temporary/deadjob/attempt-x/part-00000-deadjob.parquet",
                      b"partial", overwrite=True)
    # fixed-sleep: the leftover must be older than staleStagingSeconds on the wall clock
    time.sleep(1.1)
    df.write.format("leasefs").option("format", "parquet").option("staleStagingSeconds", "1") \
        .mode("append").save(target)
    names = visible(client, "/jobs/out")
    assert "_temporary" not in names and "_SUCCESS" in names
    assert len([n for n in names if n.endswith(".parquet")]) == 4
    back = spark.read.format("leasefs").option("format", "parquet").load(target)
    assert back.count() == 4000 and back.distinct().count() == 4000


@pytest.mark.slow
def test_overwrite_replaces_at_commit_and_append_adds(spark, cluster, client):
    target = url(cluster, "/ow/out")
    spark.range(0, 100, numPartitions=2).write.format("leasefs").option("format", "json") \
        .mode("overwrite").save(target)
    spark.range(100, 150, numPartitions=1).write.format("leasefs").option("format", "json") \
        .mode("append").save(target)
    read = lambda: sorted(r.id for r in spark.read.format("leasefs")  # noqa: E731
                          .option("format", "json").schema("id long").load(target).collect())
    assert read() == list(range(150))
    old_names = visible(client, "/ow/out")
    old_files = [n for n in old_names if n.endswith(".json")]
    assert len(old_files) == 3

    # while the overwrite job's tasks run (slowly), readers still see the old data only
    from pyspark.sql.functions import udf

    @udf("long")
    def slow(x):
        # fixed-sleep: a slow UDF: the job's duration is the scenario
        time.sleep(0.002)
        return x

    seen_during = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen_during.append(published(client, "/ow/out"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        spark.range(500, 1000, numPartitions=2).withColumn("id", slow("id")) \
            .write.format("leasefs").option("format", "json").mode("overwrite").save(target)
    finally:
        stop.set()
        watcher.join()
    assert read() == list(range(500, 1000))
    final = visible(client, "/ow/out")
    assert not set(old_files) & set(final)
    # every listing taken while the job ran showed either the old set or the new set
    for names in seen_during:
        assert set(names) in (set(old_names), set(final)), names
    assert sum(1 for names in seen_during if set(old_files) <= set(names)) >= 1


@pytest.mark.slow
def test_commit_publishes_only_named_files(cluster, client):
    paths = protocol.JobPaths("/cp/out", "job1")
    protocol.start_job(client, paths, 3600)
    good = protocol.write_task_file(client, paths, "a0", "part-00000-job1.txt",
                                    lambda s: s.write(b"x\n") and 1)
    protocol.write_task_file(client, paths, "a1-spec", "part-00001-job1.txt",
                             lambda s: s.write(b"spec\n") and 1)   # no message names it
    protocol.commit_job(client, paths, [type("M", (), {"files": [good]})()], overwrite=False)
    assert visible(client, "/cp/out") == ["_SUCCESS", "part-00000-job1.txt"]
    assert client.read_file("/cp/out/part-00000-job1.txt") == b"x\n"


@pytest.mark.slow
def test_job_commit_is_one_step_for_a_concurrent_lister(cluster, client):
    """commit_job publishes (and, overwriting, swaps out) a whole set at once: a lister
    polling the target from another connection sees the old set or the new one, never a
    mix and never a missing ``_SUCCESS`` beside new files."""
    target = "/atomic/out"
    generations = []

    def run_job(job: str, parts: int, overwrite: bool):
        paths = protocol.JobPaths(target, job)
        protocol.start_job(client, paths, 3600)
        staged = [protocol.write_task_file(client, paths, f"a{i}", f"part-{i:05d}-{job}.txt",
                                           lambda s, i=i: s.write(b"%d\n" % i) and 1)
                  for i in range(parts)]
        protocol.commit_job(client, paths, [type("M", (), {"files": staged})()], overwrite)
        generations.append(published(client, target))

    run_job("j0", 30, overwrite=False)
    seen, stop = [], threading.Event()
    lister = cluster.client()

    def watch():
        while not stop.is_set():
            seen.append(published(lister, target))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for k in range(1, 5):
            run_job(f"j{k}", 30 if k % 2 else 12, overwrite=k != 2)
    finally:
        stop.set()
        watcher.join()
        lister.close()
    allowed = set(generations)
    assert len(seen) > 20
    assert [s for s in seen if s not in allowed] == []
    assert len(generations[2]) == 30 + 12 + 1            # append kept j1's files
    assert len(generations[-1]) == 12 + 1                # overwrite kept only j4's
    assert not client.exists(f"{target}/_temporary")


# --------------------------------------------------------------------------- streaming

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_streaming_picks_up_new_files_and_restarts_from_checkpoint(spark, cluster, client,
                                                                  tmp_path):
    client.mkdirs("/stream/in")
    for i in range(3):
        client.write_file(f"/stream/in/f{i}.json",
                          "".join(f'{{"k": {i * 100 + j}}}\n' for j in range(10)).encode())
    checkpoint = str(tmp_path / "ckpt")

    def start():
        return (spark.readStream.format("leasefs").option("format", "json").schema("k long")
                .load(url(cluster, "/stream/in"))
                .writeStream.format("leasefs").option("format", "json")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="500 milliseconds")
                .start(url(cluster, "/stream/out")))

    def out_keys():
        try:
            return sorted(r.k for r in spark.read.format("leasefs").option("format", "json")
                          .schema("k long").load(url(cluster, "/stream/out")).collect())
        except Exception:  # noqa: BLE001 - nothing written yet
            return []

    def wait_for(n, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            keys = out_keys()
            if len(keys) >= n:
                return keys
            time.sleep(0.5)
        return out_keys()

    query = start()
    try:
        assert wait_for(30) == sorted(i * 100 + j for i in range(3) for j in range(10))
        client.write_file("/stream/in/f3.json",
                          "".join(f'{{"k": {300 + j}}}\n' for j in range(10)).encode())
        assert len(wait_for(40)) == 40
    finally:
        query.stop()
    client.write_file("/stream/in/f4.json",
                      "".join(f'{{"k": {400 + j}}}\n' for j in range(10)).encode())
    query = start()
    try:
        keys = wait_for(50)
        # fixed-sleep: a few more (empty) triggers in which nothing may be re-emitted: a non-
        # event
        time.sleep(2)
        keys = out_keys()
    finally:
        query.stop()
    assert keys == sorted(i * 100 + j for i in range(5) for j in range(10))
    assert client.exists("/stream/out/_batches")


@pytest.mark.slow
def test_stream_sink_replayed_batch_is_not_duplicated(cluster, client):
    paths = protocol.JobPaths("/sink/out", "stream-x")
    protocol.start_job(client, paths, 3600)
    for attempt in ("a", "b"):   # the same batch id committed twice (a replay)
        staged = protocol.write_task_file(client, paths, attempt, f"staged-{attempt}.json",
                                          lambda s: s.write(b'{"k": 1}\n') and 1)
        staged.final_name = "part-0000000007-00000.json"
        protocol.commit_batch(client, paths, [type("M", (), {"files": [staged]})()], 7)
    names = visible(client, "/sink/out")
    assert [n for n in names if n.endswith(".json")] == ["part-0000000007-00000.json"]
    assert client.list_status("/sink/out/_batches")[0].name == "7"


# --------------------------------------------------------------------------- other readers

@pytest.mark.slow
def test_pandas_and_pyarrow_read_what_spark_wrote(spark, cluster):
    """Spark writes parquet and csv through the data source; pandas (fsspec URL) and pyarrow
    (``PyFileSystem(FSSpecHandler(...))``) read the same rows back, skipping ``_SUCCESS``."""
    import fsspec
    import pandas as pd
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    frame = source_frame(spark, 5000).select("id", "i", "f", "s")
    frame.write.format("leasefs").option("format", "parquet").mode("overwrite") \
        .save(url(cluster, "/interop/pq"))
    frame.write.format("leasefs").option("format", "csv").option("header", "true") \
        .mode("overwrite").save(url(cluster, "/interop/csv"))
    expected = frame.toPandas().sort_values("id").reset_index(drop=True)

    fs = fsspec.filesystem("leasefs", host=cluster.meta_address.rsplit(":", 1)[0],
                           port=int(cluster.meta_address.rsplit(":", 1)[1]))
    assert "_SUCCESS" in [p.rsplit("/", 1)[1] for p in fs.ls("/interop/pq", detail=False)]
    parts = [p for p in fs.ls("/interop/pq", detail=False)
             if not p.rsplit("/", 1)[1].startswith(("_", "."))]
    got = pd.concat([pd.read_parquet(url(cluster, p)) for p in parts])
    got = got.sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)

    dataset = ds.dataset("/interop/pq", filesystem=pafs.PyFileSystem(pafs.FSSpecHandler(fs)),
                         format="parquet", exclude_invalid_files=True)
    table = dataset.to_table().to_pandas().sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(table[expected.columns], expected, check_dtype=False)

    csv_parts = [p for p in fs.ls("/interop/csv", detail=False)
                 if not p.rsplit("/", 1)[1].startswith(("_", "."))]
    got = pd.concat([pd.read_csv(url(cluster, p), keep_default_na=True) for p in csv_parts])
    got = got.sort_values("id").reset_index(drop=True)
    assert list(got["id"]) == list(expected["id"])
    pd.testing.assert_series_equal(got["f"], expected["f"], check_dtype=False,
                                   check_names=False)


@pytest.mark.slow
def test_spark_options_this_source_would_ignore_are_refused_up_front(spark, cluster, client):
    """An option Spark's own csv source honours and this one does not (locale or
    enforceSchema on a read, charToEscapeQuoteEscaping on a csv write) fails the job before anything is
    read or written, naming the option and what is supported; options Spark itself ignores
    for the format (header for parquet) and neutral values (mode FAILFAST) pass."""
    client.write_file("/opts/a.csv", b"k,v\n1,x\n")
    client.write_file("/opts/b.txt", b"k,v\n2,y\n")
    src = url(cluster, "/opts")
    with pytest.raises(Exception, match="locale not supported"):
        spark.read.format("leasefs").option("format", "csv").option("header", "true") \
            .option("locale", "de-DE").load(src).collect()
    with pytest.raises(Exception, match="(?s)enforceschema not supported.*supported: "):
        spark.read.format("leasefs").option("format", "csv").option("header", "true") \
            .option("enforceSchema", "false").load(src).collect()
    rows = spark.read.format("leasefs").option("format", "csv").option("header", "true") \
        .option("mode", "FAILFAST").load(src).collect()
    assert sorted(r["k"] for r in rows) == ["1", "2"]
    df = spark.createDataFrame([(1, "a")], "k int, v string")
    with pytest.raises(Exception, match="chartoescapequoteescaping not supported when "
                                        "writing format 'csv'"):
        df.write.format("leasefs").option("format", "csv") \
            .option("charToEscapeQuoteEscaping", "x") \
            .mode("overwrite").save(url(cluster, "/opts-out/csv"))
    assert not client.exists("/opts-out/csv") or not [
        n for n in visible(client, "/opts-out/csv") if n.endswith(".csv")]
    df.write.format("leasefs").option("format", "parquet").option("header", "true") \
        .mode("overwrite").save(url(cluster, "/opts-out/parquet"))
    assert any(n.endswith(".parquet") for n in visible(client, "/opts-out/parquet"))
