"""The columnar formats of the ``leasefs`` data source against a real process cluster and a
real local Spark: parquet row-group splits, filters pushed into the reader (exactly Spark's
results, row groups really skipped), column pruning by the given schema, ORC both ways with
Spark's own ORC, and ``mergeSchema`` like Spark's.

Reference data is written by Spark's own file sources into a local folder and copied into
the cluster with the client, so both readers see the same bytes.
"""

from __future__ import annotations

import datetime as dt
import glob
import io
import os

import pytest

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from sparkkit import run_client, run_cluster, run_spark, url  # noqa: E402

from spark_connector import columnar, pushdown  # noqa: E402
from spark_connector.splits import Split  # noqa: E402

pytestmark = pytest.mark.slow

ROWS = 60_000
ROW_GROUP_BYTES = 64 << 10      # Spark's parquet.block.size for the reference file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from run_cluster(tmp_path_factory, "spark-columnar")


@pytest.fixture(scope="module")
def client(cluster):
    yield from run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from run_spark("leasefs-columnar-tests")


def frame(spark, n: int, partitions: int = 1):
    """Sorted ids; ints, strings, dates, timestamps, booleans and doubles with nulls."""
    return spark.range(n, numPartitions=partitions).selectExpr(
        "id",
        "CASE WHEN id % 7 = 0 THEN NULL ELSE CAST(id % 1000 AS INT) END AS i",
        "CASE WHEN id % 5 = 0 THEN NULL ELSE concat(CASE WHEN id % 3 = 0 THEN 'ab' ELSE 'x' END,"
        " CAST(id AS STRING)) END AS s",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE date_add(DATE'2020-01-01', CAST(id / 100 AS INT))"
        " END AS d",
        "CASE WHEN id % 13 = 0 THEN NULL ELSE timestamp_micros(1600000000000000 + id * 1000000)"
        " END AS ts",
        "CASE WHEN id % 4 = 0 THEN NULL ELSE id % 2 = 0 END AS b",
        "CAST(id AS DOUBLE) / 3 AS f")


def upload_spark_output(client, local_dir: str, target_dir: str, ext: str) -> list[str]:
    """Copy the data files Spark wrote to ``local_dir`` into the cluster at ``target_dir``."""
    names = []
    for path in sorted(glob.glob(os.path.join(local_dir, f"*.{ext}"))):
        name = os.path.basename(path)
        with open(path, "rb") as src, client.create(f"{target_dir}/{name}", overwrite=True) as out:
            out.write(src.read())
        names.append(name)
    assert names
    return names


def download(client, src_dir: str, local_dir: str, ext: str) -> None:
    os.makedirs(local_dir, exist_ok=True)
    for st in client.list_status(src_dir):
        if st.name.endswith("." + ext):
            with open(os.path.join(local_dir, st.name), "wb") as out:
                out.write(client.read_file(st.path))


def rows(df):
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.fixture(scope="module")
def many_groups(spark, cluster, client, tmp_path_factory):
    """One parquet file of many row groups written by Spark itself, in the cluster and in a
    local folder: (leasefs url, local folder, number of row groups)."""
    import pyarrow.parquet as pq
    local = str(tmp_path_factory.mktemp("pq-many"))
    frame(spark, ROWS).coalesce(1).write.option("parquet.block.size", ROW_GROUP_BYTES) \
        .mode("overwrite").parquet(local)
    names = upload_spark_output(client, local, "/col/many", "parquet")
    assert len(names) == 1
    groups = pq.ParquetFile(os.path.join(local, names[0])).num_row_groups
    assert groups >= 8
    return url(cluster, "/col/many"), local, groups


def leasefs_parquet(spark, src, **options):
    reader = spark.read.format("leasefs").option("format", "parquet")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(src)


# --------------------------------------------------------------------------- splits

def test_row_group_splits_read_every_row_once(spark, client, many_groups):
    src, local, groups = many_groups
    size = client.get_file_status(_only_file(client, "/col/many")).length
    df = leasefs_parquet(spark, src, splitSize=str(size // 4))
    assert df.rdd.getNumPartitions() >= 3
    assert df.count() == ROWS
    assert df.select("id").distinct().count() == ROWS
    assert rows(df) == rows(spark.read.parquet(local))
    whole = leasefs_parquet(spark, src, splitSize=str(size * 2))
    assert whole.rdd.getNumPartitions() == 1


def _only_file(client, folder):
    files = [s.path for s in client.list_status(folder) if s.name.endswith(".parquet")]
    assert len(files) == 1
    return files[0]


# --------------------------------------------------------------------------- pushdown

FILTERS = [
    "id = 1234", "id <=> 1234", "id > 59000", "id >= 59000 AND id < 59010",
    "id < 10", "id <= 10", "id IN (5, 30000, 59999)", "id BETWEEN 100 AND 120",
    "NOT (id = 3)", "NOT (id > 5)", "NOT (id IN (1, 2, 3))",
    "i = 5", "i IS NULL", "i IS NOT NULL", "NOT (i = 5)", "NOT (i <=> 5)", "i <=> NULL",
    "i IN (1, 2, NULL)", "NOT (i IN (1, 2))", "i < 3 AND id > 50000",
    "s = 'ab33'", "s LIKE 'ab1%'", "NOT (s LIKE 'ab%')", "s > 'x5'", "s IN ('x1', 'ab3', 'zz')",
    "d = DATE'2020-01-05'", "d >= DATE'2021-07-01'", "NOT (d < DATE'2020-06-01')",
    "ts > TIMESTAMP'2020-09-13 12:26:40'", "ts = TIMESTAMP'2020-09-13 12:36:40'",
    "ts < TIMESTAMP'2020-09-13 12:30:00' AND i > 100",
    "b = true", "NOT (b = true)", "b IS NULL",
    "f > 100.5",                      # double comparisons stay with Spark (NaN ordering)
]


@pytest.fixture
def pushdown_on(spark):
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    yield
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_pushed_filters_give_exactly_sparks_results(spark, many_groups, pushdown_on):
    src, local, _ = many_groups
    ours = leasefs_parquet(spark, src)
    theirs = spark.read.parquet(local)
    for cond in FILTERS:
        assert rows(ours.filter(cond)) == rows(theirs.filter(cond)), cond
    # our own parquet (TIMESTAMP_MICROS with statistics, not Spark's INT96) too
    ours.write.format("leasefs").option("format", "parquet").mode("overwrite") \
        .save(src + "-ours")
    again = leasefs_parquet(spark, src + "-ours")
    for cond in FILTERS:
        assert rows(again.filter(cond)) == rows(theirs.filter(cond)), cond


def test_pushed_filters_leave_spark_plan_and_skip_row_groups(spark, client, many_groups,
                                                             pushdown_on):
    src, local, groups = many_groups
    ours = leasefs_parquet(spark, src, splitSize="1")    # one split per row group
    assert ours.rdd.getNumPartitions() == groups
    selective = ours.filter("id >= 100 AND id < 200 AND s LIKE 'ab%'")
    plan = selective._jdf.queryExecution().executedPlan().toString()
    assert "Filter (" not in plan                  # all three applied exactly by us
    assert selective.rdd.getNumPartitions() == 1   # the driver skipped the other groups
    assert selective.count() == len([i for i in range(100, 200) if i % 5 and i % 3 == 0])
    kept = ours.filter("f > 10.0")                 # a double comparison: Spark's
    plan = kept._jdf.queryExecution().executedPlan().toString()
    assert "Filter (" in plan and kept.rdd.getNumPartitions() == groups
    # in the task: a one-split file reads only the row groups its statistics allow
    from pyspark.sql import datasource as d
    path = _only_file(client, "/col/many")
    schema = ours.schema
    kinds = pushdown.column_kinds(schema)
    target = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
    st = client.get_file_status(path)
    split = Split(path, 0, st.length, st.length, st.mtime_ns)
    columnar.READ_COUNTS.clear()
    with client.open(path) as stream:
        got = list(columnar.read_columnar_split(
            stream, split, "parquet", target, {}, [d.LessThan(("id",), 10)], kinds))
    assert sum(b.num_rows for b in got) == 10
    assert columnar.READ_COUNTS["read"] == 1
    assert columnar.READ_COUNTS["skipped"] == groups - 1


def test_subset_schema_reads_only_its_columns(spark, client, many_groups):
    src, local, _ = many_groups
    df = spark.read.format("leasefs").option("format", "parquet").schema("id long, s string") \
        .load(src)
    assert df.columns == ["id", "s"]
    assert rows(df) == rows(spark.read.parquet(local).select("id", "s"))
    # what the reader asks the cluster for: the pruned read moves far fewer bytes
    path = _only_file(client, "/col/many")
    st = client.get_file_status(path)
    split = Split(path, 0, st.length, st.length, st.mtime_ns)

    def bytes_read(target):
        with client.open(path) as stream:
            counting = _Counting(stream)
            for _ in columnar.read_columnar_split(counting, split, "parquet", target, {}):
                pass
            return counting.bytes

    narrow = bytes_read(pa.schema([pa.field("id", pa.int64())]))
    wide = bytes_read(pa.schema([pa.field(n, t) for n, t in [
        ("id", pa.int64()), ("i", pa.int32()), ("s", pa.string()), ("f", pa.float64()),
        ("d", pa.date32()), ("b", pa.bool_())]]))
    assert narrow * 2 < wide


class _Counting(io.RawIOBase):
    """A stream wrapper counting the bytes read from the cluster."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.bytes, self.length = stream, 0, stream.length

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.stream.seek(offset, whence)

    def tell(self):
        return self.stream.tell()

    def readinto(self, buffer):
        n = self.stream.readinto(buffer)
        self.bytes += n
        return n

    def pread(self, offset, n):
        data = self.stream.pread(offset, n)
        self.bytes += len(data)
        return data


# --------------------------------------------------------------------------- ORC

def test_orc_round_trips_both_ways_with_sparks_orc(spark, cluster, client, tmp_path,
                                                  pushdown_on):
    df = frame(spark, 20_000, partitions=2)
    # ours -> Spark's
    df.write.format("leasefs").option("format", "orc").mode("overwrite") \
        .save(url(cluster, "/col/orc-ours"))
    local = str(tmp_path / "from-leasefs")
    download(client, "/col/orc-ours", local, "orc")
    assert rows(spark.read.orc(local)) == rows(df)
    # Spark's -> ours, stripes split across tasks
    spark_dir = str(tmp_path / "by-spark")
    df.coalesce(1).write.option("orc.stripe.size", 64 << 10).mode("overwrite").orc(spark_dir)
    upload_spark_output(client, spark_dir, "/col/orc-spark", "orc")
    ours = spark.read.format("leasefs").option("format", "orc").option("splitSize", "16384") \
        .load(url(cluster, "/col/orc-spark"))
    assert ours.schema == spark.read.orc(spark_dir).schema
    assert ours.rdd.getNumPartitions() > 1
    assert rows(ours) == rows(df)
    theirs = spark.read.orc(spark_dir)
    for cond in ("id > 19000", "s LIKE 'ab%' AND i IS NULL", "NOT (d = DATE'2020-01-05')",
                 "ts > TIMESTAMP'2020-09-13 14:00:00'", "i IN (3, 4)"):
        assert rows(ours.filter(cond)) == rows(theirs.filter(cond)), cond
    # compression: Spark's codec names; one pyarrow lacks is refused
    df.write.format("leasefs").option("format", "orc").option("compression", "zlib") \
        .mode("overwrite").save(url(cluster, "/col/orc-zlib"))
    assert spark.read.format("leasefs").option("format", "orc") \
        .load(url(cluster, "/col/orc-zlib")).count() == 20_000
    with pytest.raises(Exception, match="orc compression 'lzo' not supported"):
        df.write.format("leasefs").option("format", "orc").option("compression", "lzo") \
            .mode("overwrite").save(url(cluster, "/col/orc-lzo"))


# --------------------------------------------------------------------------- mergeSchema

@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_merge_schema_equals_sparks(spark, cluster, client, tmp_path, fmt):
    """Two files with different columns in one folder (no partition folders: their typing
    is another part's), read by Spark's own source and ours with mergeSchema."""
    local = str(tmp_path / fmt)
    a = spark.range(10).selectExpr("id", "CAST(id AS STRING) AS s")
    b = spark.range(10, 15).selectExpr("id", "id * 2 AS extra")
    a.coalesce(1).write.mode("overwrite").format(fmt).save(local + "/a")
    b.coalesce(1).write.mode("overwrite").format(fmt).save(local + "/b")
    merged = local + "/both"
    os.makedirs(merged)
    for path in glob.glob(f"{local}/[ab]/*.{fmt}"):
        os.rename(path, os.path.join(merged, os.path.basename(path)))
    upload_spark_output(client, merged, f"/col/merge-{fmt}", fmt)
    src = url(cluster, f"/col/merge-{fmt}")
    theirs = spark.read.format(fmt).option("mergeSchema", "true").load(merged)
    ours = spark.read.format("leasefs").option("format", fmt).option("mergeSchema", "true") \
        .load(src)
    assert sorted(ours.columns) == ["extra", "id", "s"]
    assert sorted((f.name, f.dataType) for f in ours.schema.fields) == \
        sorted((f.name, f.dataType) for f in theirs.schema.fields)
    cols = sorted(theirs.columns)
    assert rows(ours.select(*cols)) == rows(theirs.select(*cols))
    # without it: one file's columns only, as Spark
    plain = spark.read.format("leasefs").option("format", fmt).load(src)
    assert len(plain.columns) == 2
    # incompatible types are an error naming both files (in listing order: random names)
    c = spark.range(3).selectExpr("CAST(id AS STRING) AS id")
    c.coalesce(1).write.mode("overwrite").format(fmt).save(local + "/c")
    upload_spark_output(client, local + "/c", f"/col/merge-{fmt}", fmt)
    with pytest.raises(Exception, match="mergeSchema: column 'id' is (bigint|string) in "
                                        f"/col/merge-{fmt}/.* but (string|bigint) in "):
        spark.read.format("leasefs").option("format", fmt).option("mergeSchema", "true") \
            .load(src).collect()


# --------------------------------------------------------------------------- pure parts

def test_pushable_decisions_follow_types_and_null_rules():
    from pyspark.sql import datasource as d
    kinds = {"id": "long", "s": "string", "f": "double", "ts": "timestamp", "d": "date",
             "dec": "decimal"}
    utc = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    yes = [d.EqualTo(("id",), 3), d.In(("id",), (1, None)), d.Not(d.EqualTo(("id",), 3)),
           d.StringStartsWith(("s",), "ab"), d.GreaterThan(("ts",), utc),
           d.LessThan(("d",), dt.date(2020, 1, 1)), d.IsNull(("f",)),
           d.EqualNullSafe(("s",), None), d.IsNotNull(("dec",))]
    no = [d.EqualTo(("id",), "3"), d.EqualTo(("id",), True), d.EqualTo(("id",), None),
          d.GreaterThan(("f",), 1.5), d.GreaterThan(("ts",), utc.replace(tzinfo=None)),
          d.LessThan(("d",), utc), d.Not(d.In(("id",), (1, None))),
          d.StringContains(("s",), "a"), d.EqualTo(("missing",), 1),
          d.EqualTo(("dec",), 1), d.EqualTo(("a", "b"), 1)]
    assert [f for f in yes if not pushdown.pushable(f, kinds)] == []
    assert [f for f in no if pushdown.pushable(f, kinds)] == []
    stats = {"id": pushdown.ColumnStats(10, 20, 0, 100)}
    assert not pushdown.may_match([d.LessThan(("id",), 10)], stats, kinds)
    assert pushdown.may_match([d.LessThanOrEqual(("id",), 10)], stats, kinds)
    assert not pushdown.may_match([d.IsNull(("id",))], stats, kinds)
    assert pushdown.may_match([d.Not(d.EqualTo(("id",), 15))], stats, kinds)
    assert not pushdown.may_match([d.In(("id",), (1, 25, None))], stats, kinds)
    nulls = {"s": pushdown.ColumnStats(None, None, 5, 5)}
    assert not pushdown.may_match([d.StringStartsWith(("s",), "a")], nulls, kinds)
    assert pushdown.may_match([d.EqualNullSafe(("s",), None)], nulls, kinds)
