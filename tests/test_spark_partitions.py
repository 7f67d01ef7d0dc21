"""Partitioned writes (option ``partitionBy``), typed partition columns on read, the save-mode
rule and a streaming sink that leaves no staging behind — each checked against what Spark's
own file source does with the same data (a local folder), in one process cluster and one
``local[2]`` SparkSession per module.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
import threading
import time
from decimal import Decimal

import pytest

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from sparkkit import run_client, run_cluster, run_spark, url  # noqa: E402

from spark_connector import commit as protocol  # noqa: E402
from spark_connector import datasource  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from run_cluster(tmp_path_factory, "spark-part-cluster")


@pytest.fixture(scope="module")
def client(cluster):
    yield from run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from run_spark("leasefs-partition-tests")


def local_folders(root) -> list[str]:
    """Relative folders holding data files under a local tree (Spark's output)."""
    out = []
    for folder, _, names in os.walk(root):
        if any(not n.startswith(("_", ".")) and not n.endswith(".crc") for n in names):
            out.append(os.path.relpath(folder, root))
    return sorted(out)


def cluster_folders(client, root) -> list[str]:
    out = set()
    stack = [root]
    while stack:
        for st in client.list_status(stack.pop()):
            if st.name.startswith(("_", ".")):
                continue
            if st.is_dir:
                stack.append(st.path)
            else:
                out.add(posixpath.relpath(posixpath.dirname(st.path), root))
    return sorted(out)


def copy_out(client, root, local) -> None:
    """The leasefs tree ``root`` (data files only) into the local folder ``local``."""
    stack = [root]
    while stack:
        for st in client.list_status(stack.pop()):
            if st.name.startswith(("_", ".")):
                continue
            dest = os.path.join(local, posixpath.relpath(st.path, root))
            if st.is_dir:
                stack.append(st.path)
            else:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as out:
                    out.write(client.read_file(st.path))


def rows(df, columns=None):
    columns = columns or sorted(df.columns)
    return sorted((tuple(repr(r[c]) for c in columns) for r in df.collect()))


AWKWARD = ["a/b", "sp ace", "100%", "x=y", "ünï€😀", None, "", "c:d#?*[]^{}\\'\"",
           "tab\there\nnl", "plain"]


def awkward_frame(spark):
    data = []
    for i, k in enumerate(AWKWARD * 3):
        data.append((i, k, None if i % 7 == 3 else dt.date(2024, 1, 1 + i % 3),
                     None if i % 5 == 4 else dt.datetime(2024, 1, 2, 3, 4, 5, (i % 4) * 120000,
                                                         tzinfo=dt.timezone.utc),
                     i % 4 * 0.75 if i % 6 else None, Decimal(i % 3) / 4))
    return spark.createDataFrame(data, "v int, k string, d date, t timestamp, f double, "
                                       "m decimal(10,2)").repartition(3)


# --------------------------------------------------------------------------- partitionBy

@pytest.mark.timeout(300)
@pytest.mark.parametrize("columns", [["k"], ["d", "t"], ["f", "m", "k"]])
def test_partitioned_write_names_folders_as_spark_and_spark_reads_them(spark, cluster, client,
                                                                       tmp_path, columns):
    """Same folder names as Spark's own ``partitionBy`` writer for awkward values (slash,
    space, %, =, quotes, control characters, unicode, null, empty string, dates,
    timestamps, doubles, decimals); the partition columns are not in the files; Spark's own
    reader reads our tree (copied out) as it reads its own, and we read Spark's tree (copied
    in) and ours as Spark does."""
    df = awkward_frame(spark)
    name = "-".join(columns)
    local = str(tmp_path / "spark")
    df.write.partitionBy(*columns).parquet(local)
    target = f"/pw/{name}"
    df.write.format("leasefs").option("partitionBy", ",".join(columns)) \
        .mode("overwrite").save(url(cluster, target))
    assert cluster_folders(client, target) == local_folders(local)
    assert client.exists(f"{target}/_SUCCESS") and not client.exists(f"{target}/_temporary")

    ours_local = str(tmp_path / "ours")
    copy_out(client, target, ours_local)
    expected = spark.read.parquet(local)
    import pyarrow.parquet as pq
    a_file = next(os.path.join(d, n) for d, _, ns in os.walk(ours_local) for n in ns)
    assert not set(columns) & set(pq.read_schema(a_file).names)
    theirs = spark.read.parquet(ours_local)
    assert theirs.schema == expected.schema
    assert rows(theirs) == rows(expected)
    ours = spark.read.format("leasefs").load(url(cluster, target))
    assert ours.schema == expected.schema
    assert rows(ours) == rows(expected)


def test_partition_by_refuses_unknown_and_all_columns(spark, cluster, client):
    df = spark.createDataFrame([(1, "a")], "v int, k string")
    with pytest.raises(Exception, match=r"partitionBy column 'nope' is not a column of the data"):
        df.write.format("leasefs").option("partitionBy", "k,nope").mode("overwrite") \
            .save(url(cluster, "/pw-bad/a"))
    with pytest.raises(Exception, match=r"cannot use all columns \(v, k\) as partition"):
        df.write.format("leasefs").option("partitionBy", "v,K").mode("overwrite") \
            .save(url(cluster, "/pw-bad/b"))
    with pytest.raises(Exception, match=r"partitionOverwriteMode='sometimes'"):
        df.write.format("leasefs").option("partitionBy", "k") \
            .option("partitionOverwriteMode", "sometimes").mode("overwrite") \
            .save(url(cluster, "/pw-bad/c"))
    assert not client.exists("/pw-bad/a/k=a")


def test_many_partitions_spill_open_files_and_publish_in_one_step(spark, cluster, client):
    """A task sees 20 partition values in random order with at most 4 files open: it closes
    and reopens (``-c001``...) files, every row lands once. Each job (a first write, then a
    static overwrite) appears to a concurrent lister in one step: every single listing of
    the target shows no partition folder, all of the first job's or all of the second's
    (the folders move in whole, so their inode numbers tell the generations apart)."""
    target = "/pw/many"
    gen = lambda lo, hi: spark.range(lo, hi, numPartitions=2).selectExpr(  # noqa: E731
        "id", "CAST((id * 7919) % 20 AS INT) AS p")
    seen, stop = [], threading.Event()
    lister = cluster.client()

    def view(c):
        try:
            return tuple(sorted((st.name, st.ino, st.children) for st in c.list_status(target)
                                if st.name != protocol.TEMPORARY))
        except Exception:  # noqa: BLE001 - not created yet
            return ()

    def watch():
        while not stop.is_set():
            seen.append(view(lister))

    watcher = threading.Thread(target=watch)
    watcher.start()
    generations = [()]
    try:
        gen(0, 4000).write.format("leasefs").option("partitionBy", "p").mode("overwrite") \
            .save(url(cluster, target))
        generations.append(view(client))
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        gen(10000, 14000).write.format("leasefs").option("partitionBy", "p") \
            .option("maxOpenFiles", "4").option("format", "json").mode("overwrite") \
            .save(url(cluster, target))
        generations.append(view(client))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        stop.set()
        watcher.join()
        lister.close()
    assert len(seen) > 5 and len(generations[1]) == len(generations[2]) == 21
    assert [s for s in seen if s not in generations] == []
    assert any("-c001." in f for f in protocol_view(client, target))   # files were spilled
    back = spark.read.format("leasefs").option("format", "json").schema("id long, p int") \
        .load(url(cluster, target))
    assert sorted(r.id for r in back.collect()) == list(range(10000, 14000))
    assert back.filter("p = (id * 7919) % 20").count() == 4000


def protocol_view(client, root):
    """Every visible file below ``root`` (relative paths), ``_SUCCESS`` included."""
    out, stack = [], [root]
    while stack:
        for st in client.list_status(stack.pop()):
            if st.name == protocol.TEMPORARY:
                continue
            if st.is_dir:
                stack.append(st.path)
            else:
                out.append(posixpath.relpath(st.path, root))
    return tuple(sorted(out))


def test_dynamic_overwrite_replaces_only_written_partitions(spark, cluster, client, tmp_path):
    """``partitionOverwriteMode=dynamic`` replaces the partition folders the job writes and
    keeps the others, as Spark's own source with the session setting does; the default
    (static) replaces everything."""
    first = spark.createDataFrame([(1, "a", 1), (2, "b", 1), (3, "c", 2)], "v int, k string, j int")
    second = spark.createDataFrame([(10, "b", 1), (11, "d", 1)], "v int, k string, j int")
    local = str(tmp_path / "spark")
    first.write.partitionBy("k", "j").parquet(local)
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        second.write.partitionBy("k", "j").mode("overwrite").parquet(local)
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    target = url(cluster, "/pw/dyn")
    first.write.format("leasefs").option("partitionBy", "k,j").mode("overwrite").save(target)
    second.write.format("leasefs").option("partitionBy", "k,j") \
        .option("partitionOverwriteMode", "dynamic").mode("overwrite").save(target)
    assert cluster_folders(client, "/pw/dyn") == local_folders(local)
    got = spark.read.format("leasefs").load(target)
    assert rows(got) == rows(spark.read.parquet(local)) and got.count() == 4
    second.write.format("leasefs").option("partitionBy", "k,j").mode("overwrite").save(target)
    assert sorted(r.v for r in spark.read.format("leasefs").load(target).collect()) == [10, 11]
    assert not client.exists("/pw/dyn/_temporary")


def _files_per_folder_and_rows(spark, paths):
    """``{folder: sorted row counts of its data files}`` for local or cluster paths."""
    out: dict[str, list[int]] = {}
    for folder, path in paths:
        n = spark.read.parquet(path).count() if path.startswith("/") \
            else spark.read.format("leasefs").load(path).count()
        out.setdefault(folder, []).append(n)
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("partition_by", [None, "k"])
def test_max_records_per_file_cuts_files_as_spark(spark, cluster, client, tmp_path,
                                                  partition_by):
    """``maxRecordsPerFile``: every file holds at most that many rows, and a folder gets
    as many files of as many rows as Spark's own writer gives it from the same tasks."""
    df = spark.range(0, 1000, numPartitions=2).selectExpr("id", "CAST(id % 3 AS STRING) AS k")
    local = str(tmp_path / "spark")
    writer = df.write.option("maxRecordsPerFile", 70)
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(local)
    root = f"/pw/maxrec-{partition_by}"
    ours = df.write.format("leasefs").option("maxRecordsPerFile", 70).mode("overwrite")
    if partition_by:
        ours = ours.option("partitionBy", partition_by)
    ours.save(url(cluster, root))
    theirs_files, our_files = [], []
    for folder, _, names in os.walk(local):
        for name in names:
            if name.endswith(".parquet"):
                theirs_files.append((os.path.relpath(folder, local),
                                     os.path.join(folder, name)))
    stack = [root]
    while stack:
        for st in client.list_status(stack.pop()):
            if st.is_dir and not st.name.startswith("_"):
                stack.append(st.path)
            elif st.name.endswith(".parquet"):
                our_files.append((posixpath.relpath(posixpath.dirname(st.path), root),
                                  url(cluster, st.path)))
    ours_counts = _files_per_folder_and_rows(spark, our_files)
    assert ours_counts == _files_per_folder_and_rows(spark, theirs_files)
    assert max(n for counts in ours_counts.values() for n in counts) == 70
    assert rows(spark.read.format("leasefs").load(url(cluster, root))) == \
        rows(spark.read.parquet(local))


# --------------------------------------------------------------------------- typed reads

FOLDERS = {
    "i": ["1", "-3", "+4", "007", "__HIVE_DEFAULT_PARTITION__"],
    "l": ["1", "3000000000"],
    "dec": ["1", "123456789012345678901234", "1e3"],
    "dbl": ["1", "2.5", "NaN", "-0.0"],
    "s1": ["3000000000", "2.5"],                 # long + double → string
    "dt": ["2024-01-02", "1969-12-31"],
    "ts": ["2024-01-02 03%3A04%3A05", "2024-01-02 03%3A04%3A05.1"],
    "dts": ["2024-01-02", "2024-01-02 03%3A04%3A05"],
    "s2": ["2024-01-02 03%3A04%3A05.123456", "2024-01-02T03%3A04%3A05"],
    "s3": ["1", "2024-01-02"],
    "s4": ["%31", "a%2Fb", "%C3%A9", "007x"],
}


def _build_trees(client, local_root, remote_root):
    import pyarrow.parquet as pq
    n = 0
    for column, values in FOLDERS.items():
        for value in values:
            table = pa.table({"v": [n]})
            folder = os.path.join(local_root, column, f"{column}={value}")
            os.makedirs(folder, exist_ok=True)
            pq.write_table(table, os.path.join(folder, "part-0.parquet"))
            with open(os.path.join(folder, "part-0.parquet"), "rb") as f:
                client.write_file(f"{remote_root}/{column}/{column}={value}/part-0.parquet",
                                  f.read(), overwrite=True)
            n += 1


def test_partition_types_inferred_as_spark_does(spark, cluster, client, tmp_path):
    """Folders like ``k=1``, ``k=2.5``, ``d=2024-01-02``, ``t=2024-01-02 03%3A04%3A05``,
    mixed and awkward ones: the same schema and values as Spark's own reader on the same
    tree, with inference on (default) and off (``partitionColumnTypeInference=false``)."""
    local = str(tmp_path / "tree")
    _build_trees(client, local, "/typed")
    for inference in ("true", "false"):
        spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", inference)
        try:
            for column in FOLDERS:
                expected = spark.read.parquet(os.path.join(local, column))
                ours = spark.read.format("leasefs") \
                    .option("partitionColumnTypeInference", inference) \
                    .load(url(cluster, f"/typed/{column}"))
                assert (column, ours.schema) == (column, expected.schema)
                assert (column, rows(ours)) == (column, rows(expected))
        finally:
            spark.conf.unset("spark.sql.sources.partitionColumnTypeInference.enabled")


def test_pushed_filters_on_typed_partition_columns_match_spark(spark, cluster, client, tmp_path):
    """With filter pushdown on, filters on int, double, decimal, date and timestamp
    partition columns prune files and give exactly Spark's rows for the same tree."""
    data = []
    for i in range(24):
        data.append((i, i % 4 - 1, [0.5, -1.0, float("nan"), 2.25][i % 4],
                     Decimal(i % 3) * 10 ** 20, dt.date(2024, 1, 1 + i % 3),
                     dt.datetime(2024, 1, 2, i % 3, 0, 0, tzinfo=dt.timezone.utc),
                     None if i % 5 == 0 else f"s{i % 2}"))
    df = spark.createDataFrame(data, "v int, i int, f double, m decimal(30,0), d date, "
                                     "t timestamp, s string")
    parts = ["i", "f", "m", "d", "t", "s"]
    local = str(tmp_path / "spark")
    df.write.partitionBy(*parts).parquet(local)
    df.write.format("leasefs").option("partitionBy", ",".join(parts)).mode("overwrite") \
        .save(url(cluster, "/push/typed"))
    expected = spark.read.parquet(local)
    ours = spark.read.format("leasefs").load(url(cluster, "/push/typed"))
    assert ours.schema == expected.schema
    conditions = ["i >= 1", "i = -1", "i IN (0, 2)", "f > 0.5", "f = 'NaN'", "f < 0",
                  "m = 100000000000000000000", "m >= 100000000000000000000",
                  "d > DATE'2024-01-01'", "d = DATE'2024-01-03'",
                  "t >= TIMESTAMP'2024-01-02 01:00:00'", "t = TIMESTAMP'2024-01-02 00:00:00'",
                  "s IS NULL", "s <=> 's1'", "NOT (s <=> 's1')", "s IS NOT NULL AND i < 1"]
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        for cond in conditions:
            assert (cond, rows(ours.filter(cond))) == (cond, rows(expected.filter(cond)))
        plan = ours.filter("d > DATE'2024-01-01' AND i >= 1")._jdf.queryExecution() \
            .executedPlan().toString()
        assert "Filter (" not in plan                 # claimed by the source and exact
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_pushable_needs_literals_of_the_column_type():
    from pyspark.sql.datasource import EqualTo, GreaterThan
    from spark_connector import partitioning as p
    kinds = {"i": p.PartitionType("integer"), "d": p.PartitionType("date"),
             "t": p.PartitionType("timestamp"), "f": p.PartitionType("double")}
    assert datasource._pushable(EqualTo(("i",), 3), kinds)
    assert not datasource._pushable(EqualTo(("i",), "3"), kinds)
    assert datasource._pushable(GreaterThan(("d",), dt.date(2024, 1, 1)), kinds)
    assert not datasource._pushable(GreaterThan(("d",), dt.datetime(2024, 1, 1)), kinds)
    assert datasource._pushable(GreaterThan(("t",), dt.datetime(2024, 1, 1,
                                                                tzinfo=dt.timezone.utc)), kinds)
    nan = float("nan")
    assert datasource._filter_matches(EqualTo(("f",), nan), {"f": nan})
    assert datasource._filter_matches(GreaterThan(("f",), 1e300), {"f": nan})


# --------------------------------------------------------------------------- save modes

def test_spark_save_mode_and_partition_by_errors(spark, cluster, client):
    """Spark refuses the default save mode (ErrorIfExists) and ``ignore`` for a Python data
    source before calling it, and rejects ``.partitionBy``: the exact messages the README
    quotes."""
    from pyspark.errors import AnalysisException, IllegalArgumentException
    df = spark.createDataFrame([(1, "a")], "v int, k string")
    target = url(cluster, "/modes/out")
    for mode, shown in ((None, "ErrorIfExists"), ("errorifexists", "ErrorIfExists"),
                        ("ignore", "Ignore")):
        writer = df.write.format("leasefs")
        if mode:
            writer = writer.mode(mode)
        with pytest.raises(AnalysisException) as info:
            writer.save(target)
        assert str(info.value).startswith(
            f'[UNSUPPORTED_DATA_SOURCE_SAVE_MODE] The data source "leasefs" cannot be written '
            f'in the "{shown}" mode. Please use either the "Append" or "Overwrite" mode '
            f'instead. SQLSTATE: 0A000')
    with pytest.raises(IllegalArgumentException) as info:
        df.write.format("leasefs").partitionBy("k").mode("overwrite").save(target)
    assert str(info.value).startswith(
        "requirement failed: The provided partitioning or clustering columns do not match the "
        "existing table's.\n - provided: identity(k)\n - table: ")
    assert not client.exists("/modes/out")
    df.write.format("leasefs").option("partitionBy", "k").mode("append").save(target)
    assert cluster_folders(client, "/modes/out") == ["k=a"]


# --------------------------------------------------------------------------- streaming

@pytest.mark.timeout(300)
def test_streaming_restarts_leave_no_staging_and_no_duplicates(spark, cluster, client,
                                                               tmp_path):
    """A streaming query into a target, stopped and restarted with the same checkpoint three
    times, then stopped: no ``_temporary`` left, every input row once; a half-written
    attempt folder left by a killed run of the query, and an empty job folder of another
    stopped query, are gone after the next start and stop. ``partitionBy`` names folders
    per batch."""
    client.mkdirs("/srs/in")
    checkpoint = str(tmp_path / "ckpt")
    expected = []

    def add_file(i):
        client.write_file(f"/srs/in/f{i}.json", "".join(
            f'{{"k": {i * 100 + j}, "g": "g{j % 2}"}}\n' for j in range(10)).encode())
        expected.extend(i * 100 + j for j in range(10))

    def start():
        return (spark.readStream.format("leasefs").option("format", "json")
                .schema("k long, g string").load(url(cluster, "/srs/in"))
                .writeStream.format("leasefs").option("format", "json")
                .option("partitionBy", "g").option("checkpointLocation", checkpoint)
                .trigger(processingTime="300 milliseconds")
                .start(url(cluster, "/srs/out")))

    def out_keys():
        try:
            return sorted(r.k for r in spark.read.format("leasefs").option("format", "json")
                          .schema("k long").load(url(cluster, "/srs/out")).collect())
        except Exception:  # noqa: BLE001 - nothing written yet
            return []

    def run_once(i):
        add_file(i)
        query = start()
        try:
            deadline = time.monotonic() + 60
            while len(out_keys()) < len(expected) and time.monotonic() < deadline:
                time.sleep(0.3)
        finally:
            query.stop()

    for i in range(4):              # the first start and three restarts
        run_once(i)
        assert out_keys() == sorted(expected)
        assert not client.exists("/srs/out/_temporary"), client.list_status(
            "/srs/out/_temporary")
    assert cluster_folders(client, "/srs/out") == ["g=g0", "g=g1"]

    # a killed run of this query left a half-written attempt; another query an empty folder
    own = datasource._stream_job_id({"checkpointlocation": checkpoint})
    client.write_file(f"/srs/out/_temporary/{own}/attempt-x/g=g0/staged-00000-1-c000.json",
                      b'{"k": 99999', overwrite=True)
    client.mkdirs("/srs/out/_temporary/stream-otherquery/attempt-y")
    run_once(4)
    assert not client.exists("/srs/out/_temporary")
    assert out_keys() == sorted(expected)


def test_cleanup_keeps_a_running_stream_jobs_files(cluster, client):
    """Another query's stream folder that holds staged files (a batch in progress) is kept;
    an empty one (a stopped query) goes at once; a batch job's empty folder (its tasks not
    started yet) is kept."""
    root = "/srs2/out"
    client.write_file(f"{root}/_temporary/stream-running/attempt-1/staged.json", b"{}\n",
                      overwrite=True)
    client.mkdirs(f"{root}/_temporary/stream-stopped/attempt-2")
    client.mkdirs(f"{root}/_temporary/batchjob")
    removed = protocol.cleanup_stale(client, root, 3600)
    assert removed == [f"{root}/_temporary/stream-stopped"]
    assert sorted(s.name for s in client.list_status(f"{root}/_temporary")) == \
        ["batchjob", "stream-running"]
