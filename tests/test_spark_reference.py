"""The ``leasefs`` data source against Spark's own file sources, Spark as the reference:
the same bytes in a local folder (read by ``spark.read.csv``...) and in leasefs (read by
``format("leasefs")``) must give the same schema and rows; files written by both must be
named alike and read back alike. Odd input on purpose: struct shapes that differ from
record to record, empty files, quotes and escapes Spark's tokenizer reads its own way,
quoted line breaks, date patterns, json lines holding arrays or several values.

One ProcessCluster and one SparkSession per module, as tests/test_spark.py.
"""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.slow

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from sparkkit import (copy_out, ours, put, rows, run_client, run_cluster,  # noqa: E402
                      run_spark, same, theirs, url)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    yield from run_cluster(tmp_path_factory, "spark-reference")


@pytest.fixture(scope="module")
def client(cluster):
    yield from run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from run_spark("leasefs-reference-tests")


def visible_names(names) -> list[str]:
    """File names with the job's uuid blanked: ``part-00000-*-c000.snappy.parquet``."""
    return sorted(re.sub(r"^(part-\d{5})-[0-9a-f-]{36}-", r"\1-*-", n) for n in names
                  if not n.startswith((".", "_")))


# --------------------------------------------------------------------------- json

def test_json_struct_shapes_merge_as_spark(spark, cluster, client, tmp_path):
    """Each column has two shapes: structs with other fields, an array of structs next to
    an empty one, nested conflicts, a struct next to a number and an array."""
    data = (b'{"a":{"x":1}}\n{"a":{"y":2}}\n'
            b'{"b":[{"x":1}]}\n{"b":[]}\n{"b":[{"y":"s","x":2}]}\n'
            b'{"c":{"x":1,"n":{"p":true}}}\n{"c":{"x":1.5,"n":{"q":[1]}}}\n{"c":{"x":"s"}}\n'
            b'{"d":{"x":1}}\n{"d":5}\n{"d":[1]}\n')
    got = same(spark, cluster, client, tmp_path, "json", "/ref/json-shapes", {"d.json": data})
    assert len(got) == 11


def test_json_lines_with_arrays_and_extra_values_as_spark(spark, cluster, client, tmp_path):
    options = {"multiLine": "false"}
    data = (b'[{"a":1},{"a":2}]\n[{"a":1},\n{"a":2}]\n{"a":3} {"a":4}\n{"a":5} xyz\n'
            b'[]\n[1,2]\n[{"a":6}, 7]\n5\nnull\n{"a":[1,2]]}\n\n  \n{"b":"x"}\n')
    got = same(spark, cluster, client, tmp_path, "json", "/ref/json-lines", {"d.json": data},
               options)
    assert len(got) == 12


# --------------------------------------------------------------------------- empty input

@pytest.mark.parametrize("fmt,options,schema", [
    ("csv", {}, None), ("csv", {"header": "true", "inferSchema": "true"}, None),
    ("csv", {}, "a int, b string"), ("json", {}, None),
])
def test_empty_file_reads_as_spark(spark, cluster, client, tmp_path, fmt, options, schema):
    got = same(spark, cluster, client, tmp_path, fmt, f"/ref/empty-{fmt}",
               {f"a.{fmt}": b""}, options, schema)
    assert got == []


def test_empty_file_next_to_data_reads_as_spark(spark, cluster, client, tmp_path):
    files = {"a.csv": b"", "b.csv": b"k,v\n1,x\n"}
    got = same(spark, cluster, client, tmp_path, "csv", "/ref/empty-and-data", files,
               {"header": "true", "inferSchema": "true"})
    assert len(got) == 1


# --------------------------------------------------------------------------- writing

def small_frame(spark):
    return spark.sql("SELECT id, CAST(id AS STRING) AS s FROM range(5)").coalesce(1)


@pytest.mark.parametrize("fmt,codec", [
    ("parquet", None), ("parquet", "uncompressed"), ("parquet", "gzip"), ("orc", None),
    ("orc", "none"), ("csv", "gzip"),
])
def test_written_files_named_and_read_as_sparks(spark, cluster, client, tmp_path, fmt, codec):
    df = small_frame(spark)
    if fmt == "text":
        df = df.select("s")
    options = {"compression": codec} if codec else {}
    local = str(tmp_path / "spark")
    df.write.options(**options).format(fmt).save(local)
    folder = f"/ref/names/{fmt}-{codec}"
    df.write.format("leasefs").option("format", fmt).options(**options).mode("overwrite") \
        .save(url(cluster, folder))
    mine = str(tmp_path / "ours")
    names = copy_out(client, folder, mine)
    assert visible_names(names) == visible_names(os.listdir(local))
    back = rows(theirs(spark, fmt, mine))
    assert back == rows(theirs(spark, fmt, local)) and len(back) == 5


def test_parquet_codec_spark_names_but_pyarrow_cannot_write_is_refused(spark, cluster):
    with pytest.raises(Exception, match="parquet compression 'lz4' not supported.*lz4_raw"):
        small_frame(spark).write.format("leasefs").option("format", "parquet") \
            .option("compression", "lz4").mode("overwrite").save(url(cluster, "/ref/lz4"))


@pytest.mark.parametrize("fmt,options", [
    ("parquet", {}), ("orc", {}), ("csv", {"header": "true"}), ("json", {}),
])
def test_empty_dataframe_writes_a_file_with_the_schema_as_spark(spark, cluster, client,
                                                                tmp_path, fmt, options):
    empty = spark.sql("SELECT id, CAST(id AS STRING) AS s FROM range(0)")
    if fmt == "text":
        empty = empty.select("s")
    local = str(tmp_path / "spark")
    empty.write.options(**options).format(fmt).save(local)
    folder = f"/ref/empty-write/{fmt}-{len(options)}"
    empty.write.format("leasefs").option("format", fmt).options(**options) \
        .mode("overwrite").save(url(cluster, folder))
    mine = str(tmp_path / "ours")
    names = copy_out(client, folder, mine)
    assert client.exists(f"{folder}/_SUCCESS")
    assert visible_names(names) == visible_names(os.listdir(local))
    expected = theirs(spark, fmt, local, options)
    for back in (theirs(spark, fmt, mine, options), ours(spark, cluster, fmt, folder, options)):
        assert back.schema.simpleString() == expected.schema.simpleString()
        assert back.collect() == []


# --------------------------------------------------------------------------- basePath

@pytest.fixture(scope="module")
def base_tree(client, tmp_path_factory):
    files = {"k=1/j=a/x.json": b'{"v":1}\n', "k=2/j=b/x.json": b'{"v":2}\n',
             "k=2/j=c/x.json": b'{"v":3}\n'}
    return put(client, tmp_path_factory.mktemp("base"), "/ref/bp", files)


@pytest.mark.parametrize("sub,base", [
    ("/k=1", ""), ("/k=*/j=a", ""), ("/k=1/j=a/x.json", ""), ("/k=2/j=b", "/k=2"),
])
def test_base_path_discovers_partitions_as_spark(spark, cluster, client, base_tree, sub, base):
    opts = {} if base is None else {"basePath": base_tree + base}
    expected = theirs(spark, "json", base_tree + sub, opts)
    mine = {} if base is None else {"basePath": url(cluster, "/ref/bp" + base)}
    got = ours(spark, cluster, "json", "/ref/bp" + sub, mine)
    assert got.schema.simpleString() == expected.schema.simpleString()
    assert rows(got) == rows(expected)


def test_base_path_not_above_the_path_is_refused(spark, cluster, base_tree):
    with pytest.raises(Exception, match="Wrong basePath"):
        theirs(spark, "json", base_tree + "/k=1", {"basePath": base_tree + "/k=2"})
    with pytest.raises(Exception, match=r"basePath /ref/bp/k=2 is not a folder above "
                                        r"/ref/bp/k=1"):
        ours(spark, cluster, "json", "/ref/bp/k=1", {"basePath": url(cluster, "/ref/bp/k=2")})


# --------------------------------------------------------------------------- csv

# one record per line, each odd in its own way for an RFC 4180 reader; the first line
# sets the width (Spark pads or cuts the others)
CSV_ODD = (b'c1,c2,c3\n"say ""hi""",x,y\n"a""b",x,y\n"a""",x,y\n"""a",x,y\n"",x,\n'
           b'""""\n"ab"c,d\n"ab" c,d\n"ab" ,d\n "ab",d\nab"c,d\na\\"b,d\n"a\\"b",d\n'
           b'"a\\\\",d\n"a\\b",d\n"a""b, c",x\n"a"b"c",x\n"a\\\\"b",x\n"a"""b",x\n'
           b'x,"a"\n"q,\nw",e\n"x\ny""z",1\nlast,"open\n')


@pytest.mark.parametrize("options", [
    {}, {"multiLine": "true"}, {"escape": '"'},
    {"ignoreLeadingWhiteSpace": "true", "ignoreTrailingWhiteSpace": "true"},
])
def test_csv_quotes_and_escapes_read_as_spark(spark, cluster, client, tmp_path, options):
    got = same(spark, cluster, client, tmp_path, "csv", "/ref/csv-odd", {"d.csv": CSV_ODD},
               options)
    assert got


@pytest.mark.parametrize("options", [{"multiLine": "false"},
                                     {"multiLine": "false", "header": "true"},
                                     {"multiLine": "true", "header": "true"}])
def test_csv_quoted_line_breaks_as_spark(spark, cluster, client, tmp_path, options):
    data = b'h1,h2,h3\na,"b\nc",d\ne,f,g\n"x\n\ny"\n'
    same(spark, cluster, client, tmp_path, "csv", "/ref/csv-lines", {"d.csv": data}, options)


@pytest.mark.parametrize("options", [
    {"dateFormat": "dd/MM/yyyy", "timestampFormat": "dd/MM/yyyy HH:mm"},
    {"dateFormat": "dd/MM/yyyy"},
    {},
])
def test_csv_infer_schema_with_datetime_patterns_as_spark(spark, cluster, client, tmp_path,
                                                          options):
    data = (b"01/02/2020,01/02/2020 10:30,2020-01-02,2020-01-02 10:30:00,x\n"
            b"03/04/2021,05/06/2021 11:45,2021-03-04,2021-03-04T11:45:00.123Z,\n")
    same(spark, cluster, client, tmp_path, "csv", "/ref/csv-dates", {"d.csv": data},
         dict(options, inferSchema="true"))
