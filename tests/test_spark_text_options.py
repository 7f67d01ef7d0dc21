"""Options and codecs of the text, csv and json formats of the ``leasefs`` data source,
each checked against Spark's own source on the same bytes: the same files go to a local
folder (Spark's ``spark.read.csv``...) and to leasefs (``format("leasefs")``), and both
reads must collect the same rows. Files Spark writes are read by us and files we write
are read by Spark.

One ProcessCluster and one SparkSession per module, as tests/test_spark.py.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import time

import pytest

pytestmark = pytest.mark.slow

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from sparkkit import (copy_out, ours, put, rows, run_client, run_cluster,  # noqa: E402
                      run_spark, same, theirs, url)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from run_cluster(tmp_path_factory, "spark-text")


@pytest.fixture(scope="module")
def client(cluster):
    yield from run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from run_spark("leasefs-text-tests")


def frame(spark):
    return spark.sql("""SELECT id, CAST(id * 3 AS INT) AS i, id / 8.0D AS f,
        CASE WHEN id % 5 = 0 THEN NULL WHEN id % 5 = 1 THEN concat('a,b "q" ', id)
             WHEN id % 5 = 2 THEN '' ELSE concat('ü ', id) END AS s,
        timestamp_micros(1500000000000000 + id * 1000000) AS ts,
        date_add(DATE'2020-01-01', CAST(id AS INT)) AS d
        FROM range(300)""").repartition(2)


SCHEMA = "id long, i int, f double, s string, ts timestamp, d date"

# --------------------------------------------------------------------------- codecs

@pytest.mark.parametrize("codec,ext", [("gzip", ".gz"), ("bzip2", ".bz2"),
                                       ("deflate", ".deflate"), ("lz4", ".lz4"),
                                       ("snappy", ".snappy")])
def test_spark_compressed_csv_is_read_by_us(spark, cluster, client, tmp_path, codec, ext):
    df = frame(spark)
    local = str(tmp_path / f"spark-{codec}")
    df.write.option("header", "true").option("compression", codec).csv(local)
    files = {os.path.basename(p): open(p, "rb").read()
             for p in glob.glob(f"{local}/part-*")}
    assert files and all(n.endswith(".csv" + ext) for n in files)
    folder = f"/codec-in/{codec}"
    for name, data in files.items():
        client.write_file(f"{folder}/{name}", data, overwrite=True)
    got = ours(spark, cluster, "csv", folder, {"header": "true"}, SCHEMA)
    assert rows(got) == rows(spark.read.option("header", "true").schema(SCHEMA).csv(local))
    assert got.count() == 300
    inferred = ours(spark, cluster, "csv", folder, {"header": "true", "inferSchema": "true"})
    assert inferred.columns == df.columns and inferred.count() == 300


@pytest.mark.parametrize("fmt", ["csv", "json", "text"])
@pytest.mark.parametrize("codec,ext", [("gzip", ".gz"), ("bzip2", ".bz2"),
                                       ("deflate", ".deflate"), ("lz4", ".lz4"),
                                       ("snappy", ".snappy"), ("zstd", ".zst")])
def test_our_compressed_files_are_read_by_spark(spark, cluster, client, tmp_path, fmt,
                                                codec, ext):
    df = frame(spark) if fmt != "text" else frame(spark).selectExpr("CAST(id AS STRING) AS v")
    folder = f"/codec-out/{fmt}-{codec}"
    df.write.format("leasefs").option("format", fmt).option("header", "true") \
        .option("compression", codec).mode("overwrite").save(url(cluster, folder))
    local = str(tmp_path / "ours")
    names = copy_out(client, folder, local)
    suffix = {"text": ".txt"}.get(fmt, "." + fmt) + ext
    assert names and all(n.endswith(suffix) for n in names), names
    schema = SCHEMA if fmt != "text" else None
    back = ours(spark, cluster, fmt, folder, {"header": "true"}, schema)
    # csv keeps no difference between "" and null (Spark's own round trip neither)
    expected = df if fmt != "csv" else df.selectExpr("* except (s)",
                                                     "nullif(s, '') AS s").select(*df.columns)
    assert rows(back) == rows(expected)
    if codec == "zstd":
        # Spark 4.3's Hadoop has no zstd without native libraries: check the stream itself
        raw = pa.CompressedInputStream(pa.OSFile(os.path.join(local, names[0])), "zstd").read()
        assert raw.count(b"\n") >= 100
        return
    spark_read = theirs(spark, fmt, local, {"header": "true"}, schema)
    assert rows(spark_read) == rows(expected)


def test_unreadable_compression_and_corrupt_data_fail_naming_the_file(spark, cluster, client):
    client.write_file("/codec-bad/xz/a.csv.xz", b"\xfd7zXZ\x00garbage", overwrite=True)
    with pytest.raises(Exception, match=r"/codec-bad/xz/a.csv.xz: compressed with xz"):
        ours(spark, cluster, "csv", "/codec-bad/xz", schema="a string").collect()
    client.write_file("/codec-bad/gz/a.csv.gz", b"not gzip at all\n", overwrite=True)
    with pytest.raises(Exception, match=r"/codec-bad/gz/a.csv.gz: not valid gzip data"):
        ours(spark, cluster, "csv", "/codec-bad/gz", schema="a string").collect()


# --------------------------------------------------------------------------- read modes

CSV_BAD = b"a,b,c\n1,2,3\nx,5,6\n7,8\n9,10,11,12\n13,1.5,2020-01-01\n,\"\",z\n"
JSON_BAD = (b'{"a": 1, "b": "s"}\n{"a": "x", "b": "t"}\n{bad json\n{"a": 2.5, "b": 3}\n'
            b'[{"a":4},{"a":5}]\n7\n{"b":"only"}\n')


@pytest.mark.parametrize("options,schema", [
    ({"header": "true"}, "a int, b double, c string"),                       # PERMISSIVE
    ({"header": "true", "mode": "DROPMALFORMED"}, "a int, b double, c string"),
    ({"header": "true"}, "a int, b double, c string, _corrupt_record string"),
    ({"header": "true", "columnNameOfCorruptRecord": "bad"}, "a int, b double, c string, bad string"),
])
def test_csv_read_modes_match_spark(spark, cluster, client, tmp_path, options, schema):
    same(spark, cluster, client, tmp_path, "csv", "/modes/csv", {"d.csv": CSV_BAD}, options,
         schema)


@pytest.mark.parametrize("options,schema", [
    ({}, "a int, b string"),
    ({}, "a int, b string, _corrupt_record string"),
    ({"mode": "DROPMALFORMED"}, "a int, b string"),
    ({}, None),
    ({"primitivesAsString": "true"}, None),
])
def test_json_read_modes_match_spark(spark, cluster, client, tmp_path, options, schema):
    same(spark, cluster, client, tmp_path, "json", "/modes/json", {"d.json": JSON_BAD},
         options, schema)


def test_failfast_fails_naming_the_file(spark, cluster, client):
    client.write_file("/modes/ff/d.csv", CSV_BAD, overwrite=True)
    with pytest.raises(Exception, match=r"/modes/ff/d.csv: malformed record in FAILFAST"):
        ours(spark, cluster, "csv", "/modes/ff", {"header": "true", "mode": "FAILFAST"},
             "a int, b double, c string").collect()


# --------------------------------------------------------------------------- read options

CSV_OPTION_CASES = [
    ({"lineSep": ";"}, b"1,a;2,b;3,c", "k int, v string"),
    ({"comment": "#"}, b"#skip me\n1,a\n# and me\n2,b\n", "k int, v string"),
    ({"ignoreLeadingWhiteSpace": "true"}, b"  1,  a  \n2,b\n", "k int, v string"),
    ({"ignoreTrailingWhiteSpace": "true"}, b"1  ,  a  \n2,b\n", "k int, v string"),
    # quoted values keep their spaces; only the space outside the quotes goes
    ({"ignoreLeadingWhiteSpace": "true", "ignoreTrailingWhiteSpace": "true",
      "multiLine": "true"},
     b'1,  "  a  "  ,  b  \n2,"c ,\n d " , e\n', "k int, v string, w string"),
    ({"ignoreLeadingWhiteSpace": "true"}, b'1,  " a ",  b  \n', "k int, v string, w string"),
    ({"ignoreTrailingWhiteSpace": "true"}, b'1," a "  ,  b  \n', "k int, v string, w string"),
    ({"nanValue": "nan!", "positiveInf": "+big", "negativeInf": "-big"},
     b"nan!,1\n+big,2\n-big,3\n1.5,4\n", "x double, k int"),
    ({"emptyValue": "EMPTY"}, b'1,""\n2,x\n3,\n', "k int, v string"),
    ({"nullValue": "NA"}, b"1,NA\n2,x\n", "k int, v string"),
    ({"timestampFormat": "dd/MM/yyyy HH:mm", "dateFormat": "dd.MM.yyyy"},
     b"03/02/2021 10:30,04.05.2022\nbad,worse\n", "t timestamp, d date"),
    ({"timestampFormat": "yyyy-MM-dd HH:mm:ss.SSS"}, b"2021-02-03 10:30:01.250\n",
     "t timestamp"),
    ({"samplingRatio": "0.5"}, b"1,x\n2,y\n3,z\n", None),
]


@pytest.mark.parametrize("options,data,schema", CSV_OPTION_CASES)
def test_csv_read_options_match_spark(spark, cluster, client, tmp_path, options, data, schema):
    got = same(spark, cluster, client, tmp_path, "csv", "/ropts/csv", {"d.csv": data},
               options, schema)
    assert got


@pytest.mark.parametrize("options,data,schema", [
    ({"lineSep": "|"}, b'{"k": 1}|{"k": 2, "v": "x"}|', "k long, v string"),
    ({"timestampFormat": "dd/MM/yyyy HH:mm", "dateFormat": "dd.MM.yyyy"},
     b'{"t": "03/02/2021 10:30", "d": "04.05.2022"}\n{"t": "x", "d": "y"}\n',
     "t timestamp, d date"),
    ({"samplingRatio": "1.0"}, b'{"k": 1, "f": 2.5}\n{"k": 2, "f": 3}\n', None),
])
def test_json_read_options_match_spark(spark, cluster, client, tmp_path, options, data, schema):
    same(spark, cluster, client, tmp_path, "json", "/ropts/json", {"d.json": data}, options,
         schema)


@pytest.mark.parametrize("options", [{"lineSep": ";"}, {"lineSep": "\r\n"},
                                     {"wholetext": "true"}, {}])
def test_text_read_options_match_spark(spark, cluster, client, tmp_path, options):
    data = {"a.txt": b"one;two\r\nthree;\nfour", "b.txt": b"x\ny;z\n"}
    same(spark, cluster, client, tmp_path, "text", "/ropts/text", data, options)


# --------------------------------------------------------------------------- write options

@pytest.mark.parametrize("options", [
    {},
    {"quote": "'", "escape": "\\"},
    {"quoteAll": "true"},
    {"escapeQuotes": "false", "sep": ";"},
    {"nullValue": "NULL", "emptyValue": "EMPTY"},
    {"timestampFormat": "yyyy/MM/dd HH:mm:ss", "dateFormat": "dd.MM.yyyy"},
    {"lineSep": ";"},
    {"ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false"},
])
def test_csv_write_options_read_the_same_as_sparks_files(spark, cluster, client, tmp_path,
                                                        options):
    df = frame(spark).union(spark.sql(
        "SELECT 999L, 1, 0.5D, '  padded  ', TIMESTAMP'2021-01-01 00:00:00', DATE'2021-01-01'"))
    theirs_dir = str(tmp_path / "spark")
    writer = df.write
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.option("header", "true").csv(theirs_dir)
    folder = "/wopts/csv"
    writer = df.write.format("leasefs").option("format", "csv").option("header", "true")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("overwrite").save(url(cluster, folder))
    ours_dir = str(tmp_path / "ours")
    copy_out(client, folder, ours_dir)
    read_opts = dict(options, header="true")
    a = theirs(spark, "csv", theirs_dir, read_opts, SCHEMA)
    b = theirs(spark, "csv", ours_dir, read_opts, SCHEMA)
    assert rows(b) == rows(a)
    assert rows(ours(spark, cluster, "csv", folder, read_opts, SCHEMA)) == rows(a)


@pytest.mark.parametrize("options", [{}, {"ignoreNullFields": "false"}, {"lineSep": "|"},
                                     {"timestampFormat": "dd/MM/yyyy HH:mm:ss.SSS",
                                      "dateFormat": "yyyyMMdd"}])
def test_json_write_options_match_spark(spark, cluster, client, tmp_path, options):
    df = frame(spark)
    theirs_dir = str(tmp_path / "spark")
    writer = df.coalesce(1).write
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.json(theirs_dir)
    writer = df.coalesce(1).write.format("leasefs").option("format", "json")
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.mode("overwrite").save(url(cluster, "/wopts/json"))
    ours_dir = str(tmp_path / "ours")
    copy_out(client, "/wopts/json", ours_dir)
    sep = options.get("lineSep", "\n")

    def records(folder):
        text = "".join(open(p, encoding="utf-8").read()
                       for p in glob.glob(f"{folder}/part-*"))
        return sorted((json.loads(r) for r in text.split(sep) if r.strip()),
                      key=lambda o: o["id"])

    assert records(ours_dir) == records(theirs_dir)


def test_text_write_line_separator_matches_spark(spark, cluster, client, tmp_path):
    df = spark.createDataFrame([("a",), ("b c",), ("",)], "value string").coalesce(1)
    df.write.option("lineSep", "~").text(str(tmp_path / "spark"))
    df.write.format("leasefs").option("format", "text").option("lineSep", "~") \
        .mode("overwrite").save(url(cluster, "/wopts/text"))
    copy_out(client, "/wopts/text", str(tmp_path / "ours"))
    read = lambda d: open(glob.glob(f"{d}/part-*")[0], "rb").read()  # noqa: E731
    assert read(tmp_path / "ours") == read(tmp_path / "spark")


# --------------------------------------------------------------------------- listing

def test_listing_options_match_spark(spark, cluster, client, tmp_path):
    old = {"a.csv": b"1\n", "sub/b.csv": b"2\n", "k=7/c.csv": b"3\n", "d.txt": b"4\n"}
    local = put(client, tmp_path, "/list/x", old)
    # fixed-sleep: the files' modification times must fall before the cut, in whole wall-clock
    # seconds
    time.sleep(1.2)
    cut = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) \
        + datetime.timedelta(seconds=1)
    # fixed-sleep: the next file's modification time must fall after the cut, in whole wall-
    # clock seconds
    time.sleep(1.5)
    put(client, tmp_path, "/list/x", {"e.csv": b"5\n"})
    stamp = cut.strftime("%Y-%m-%dT%H:%M:%S")
    for options in ({"pathGlobFilter": "*.csv", "recursiveFileLookup": "true"},
                    {"recursiveFileLookup": "true"},
                    {"modifiedBefore": stamp, "recursiveFileLookup": "true"},
                    {"modifiedAfter": stamp, "recursiveFileLookup": "true"}):
        expected = theirs(spark, "csv", local, options)
        got = ours(spark, cluster, "csv", "/list/x", options)
        assert got.columns == expected.columns == ["_c0"], options
        assert rows(got) == rows(expected), options
    # partition folders without recursiveFileLookup: the k column, as Spark
    assert ours(spark, cluster, "csv", "/list/x/k=7/..").count() >= 1


def test_ignore_corrupt_and_missing_files(spark, cluster, client):
    client.write_file("/list/c/good.csv.gz", __import__("gzip").compress(b"1\n2\n"),
                      overwrite=True)
    client.write_file("/list/c/bad.csv.gz", b"not gzip\n", overwrite=True)
    with pytest.raises(Exception, match="bad.csv.gz"):
        ours(spark, cluster, "csv", "/list/c", schema="a int").collect()
    got = ours(spark, cluster, "csv", "/list/c", {"ignoreCorruptFiles": "true"}, "a int")
    assert sorted(r.a for r in got.collect()) == [1, 2]
    df = ours(spark, cluster, "csv", "/list/c", {"ignoreCorruptFiles": "true",
                                                 "ignoreMissingFiles": "true"}, "a int")
    client.delete("/list/c/good.csv.gz")
    assert df.collect() == []
