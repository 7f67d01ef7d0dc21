"""The option check of the Spark data source (``spark_connector/options.py``): what is
refused, what passes, what is warned about. Pure; tests/test_spark.py runs it in Spark."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")

from fs.errors import InvalidArgument  # noqa: E402
from spark_connector.options import SPARK_READ, check  # noqa: E402


@pytest.mark.parametrize("fmt,direction,option,value", [
    ("parquet", "read", "datetimeRebaseMode", "LEGACY"),
    ("csv", "read", "locale", "de-DE"),
    ("csv", "read", "enforceSchema", "false"),
    ("csv", "read", "encoding", "ISO-8859-1"),
    ("csv", "read", "timestampNTZFormat", "yyyy"),
    ("json", "read", "multiLine", "true"),
    ("json", "read", "allowComments", "true"),
    ("json", "read", "allowSingleQuotes", "false"),
    ("json", "write", "timeZone", "Europe/Paris"),
    ("csv", "write", "charToEscapeQuoteEscaping", "x"),
])
def test_spark_options_not_implemented_are_refused_naming_them(fmt, direction, option, value):
    with pytest.raises(InvalidArgument) as info:
        check({option.lower(): value, "format": fmt}, fmt, direction)
    text = str(info.value)
    assert option.lower() in text and "supported: " in text and "format" in text


@pytest.mark.parametrize("fmt,direction,options", [
    ("parquet", "write", {"header": "true"}),          # Spark ignores it for parquet too
    ("csv", "read", {"header": "true", "inferSchema": "true", "sep": ";"}),
    ("csv", "read", {"mode": "FAILFAST", "mergeSchema": "false"}),
    ("parquet", "read", {"mergeSchema": "false", "encoding": "UTF-8",
                         "datetimeRebaseMode": "CORRECTED"}),
    ("parquet", "write", {"compression": "zstd"}),
    ("csv", "write", {"compression": "none"}),
    # implemented now, no longer refused
    ("csv", "read", {"mode": "PERMISSIVE", "pathGlobFilter": "*.csv", "lineSep": ";",
                     "timestampFormat": "yyyy", "recursiveFileLookup": "true"}),
    ("json", "read", {"mode": "DROPMALFORMED", "dateFormat": "yyyy", "samplingRatio": "0.5"}),
    ("text", "read", {"lineSep": ";", "wholetext": "true"}),
    ("csv", "write", {"compression": "gzip", "quote": "'", "quoteAll": "true"}),
    ("json", "write", {"codec": "bzip2", "ignoreNullFields": "false", "timeZone": "UTC"}),
])
def test_supported_neutral_and_other_format_options_pass(fmt, direction, options):
    assert check({k.lower(): v for k, v in options.items()}, fmt, direction) == []


def test_unknown_options_are_warned_with_the_closest_name():
    warnings = check({"headr": "true", "zzz": "1"}, "csv", "read")
    assert warnings[0].endswith("(did you mean 'header'?)")
    assert "unknown option 'zzz' ignored" in warnings[1]
    assert "does nothing when reading csv" in check({"includepath": "true"}, "csv", "read")[0]


def test_every_format_has_its_spark_options():
    assert set(SPARK_READ) == {"text", "binaryfile", "csv", "json", "parquet", "orc"}
