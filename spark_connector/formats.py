"""File formats of the ``leasefs`` data source: which formats exist, and the dispatch of
schema inference, reading one split and writing to the module that owns the format.

Why: Spark's own file formats live in the JVM and cannot open ``leasefs://``; the Python data
source must parse them itself. ``textformats.py`` owns text, csv and json lines,
``columnar.py`` parquet and ORC (row-group / stripe splits, pushed filters);
``splits.py`` cuts files into tasks and ``arrowcast.py`` turns parsed tables into the exact
Arrow form of the Spark schema.

Concurrency contract: pure functions over a blocking ``fs.Client``; no shared state.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from fs.errors import InvalidArgument

from . import columnar, textformats, textwrite
from .arrowcast import arrow_schema, conform
from .compression import write_codec
from .optionvalues import flag, option
from .ranges import read_range
from .splits import Split, plan_splits

log = logging.getLogger(__name__)

FORMATS = ("text", "binaryfile", "csv", "json", "parquet", "orc")
WRITE_FORMATS = ("text", "csv", "json", "parquet", "orc")
EXTENSIONS = {"text": "txt", "csv": "csv", "json": "json", "parquet": "parquet", "orc": "orc"}
#: formats whose readers apply pushed data-column filters (``pushdown.py``)
PUSHDOWN_FORMATS = columnar.COLUMNAR

__all__ = ["FORMATS", "WRITE_FORMATS", "EXTENSIONS", "PUSHDOWN_FORMATS", "Split",
           "plan_splits", "plan_read_splits", "arrow_schema", "flag", "option",
           "read_format", "infer_schema", "read_split", "FormatWriter", "file_extension"]


def file_extension(fmt: str, options) -> str:
    """The extension of the files a write produces, as Spark names them: ``csv`` or, with
    ``compression=gzip``, ``csv.gz``; parquet and ORC carry the codec before the extension
    (``snappy.parquet``, ``zstd.orc``; uncompressed: ``parquet``). An unknown codec is
    refused here, before any task runs."""
    ext = EXTENSIONS[fmt]
    if fmt in columnar.COLUMNAR:
        tag = columnar.codec(fmt, options)[1]
        return f"{tag}.{ext}" if tag else ext
    codec = write_codec(options)
    if codec is not None:
        ext += codec.extension
    return ext


def read_format(options) -> str:
    fmt = str(option(options, "format", "parquet")).lower()
    if fmt == "binary":
        fmt = "binaryfile"
    if fmt not in FORMATS:
        raise InvalidArgument(f"leasefs data source: unknown format {fmt!r} "
                              f"(one of {', '.join(FORMATS)})")
    return fmt


def infer_schema(client, files, fmt: str, options):
    """The Spark schema of the data files (partition columns added by the caller)."""
    from pyspark.sql.types import (BinaryType, LongType, StringType, StructField, StructType,
                                   TimestampType)
    if fmt == "text":
        fields = [StructField("value", StringType(), True)]
        if flag(options, "includePath", False):
            fields.append(StructField("path", StringType(), True))
        return StructType(fields)
    if fmt == "binaryfile":
        return StructType([StructField("path", StringType(), False),
                           StructField("length", LongType(), False),
                           StructField("modificationTime", TimestampType(), False),
                           StructField("content", BinaryType(), True)])
    if not files:
        raise InvalidArgument(f"leasefs data source: no {fmt} files to infer a schema from; "
                              f"give a schema with .schema(...)")
    if fmt in columnar.COLUMNAR:
        return columnar.infer_columnar_schema(client, files, fmt, options)
    # an empty file says nothing about the columns (Spark's inference skips it too)
    first = next((f for f in files if f.length), files[0])
    return textformats.infer_text_schema(client, first, fmt, options)


def plan_read_splits(client, files, fmt: str, options, filters=(), kinds=None) -> list[Split]:
    """The splits of ``files``: row groups / stripes for the columnar formats (footers read
    on the driver for files larger than one split, ``filters`` skipping row groups), byte
    ranges for the others."""
    if fmt in columnar.COLUMNAR:
        return columnar.plan_columnar_splits(client, files, fmt, options, filters, kinds)
    return plan_splits(files, fmt, options)


def read_split(client, split: Split, fmt: str, target: pa.Schema, options, filters=(),
               kinds=None):
    """Arrow batches of exactly ``target`` for one split, ``filters`` (data-column filters
    of ``PUSHDOWN_FORMATS``, see ``pushdown.py``) applied exactly; ``ignoreMissingFiles`` skips a
    file gone since planning, ``ignoreCorruptFiles`` the rest of a file that fails to parse
    (with a warning naming it), as Spark."""
    from fs.errors import FileNotFound
    try:
        yield from _read_split(client, split, fmt, target, options, filters, kinds)
    except FileNotFound:
        if not flag(options, "ignoreMissingFiles", False):
            raise
        log.warning("leasefs data source: %s is gone; skipped (ignoreMissingFiles)", split.path)
    except (InvalidArgument, pa.ArrowException, ValueError, OSError, EOFError) as exc:
        if not flag(options, "ignoreCorruptFiles", False):
            raise
        log.warning("leasefs data source: skipped the rest of corrupt file %s "
                    "(ignoreCorruptFiles): %s", split.path, exc)


def _read_split(client, split: Split, fmt: str, target: pa.Schema, options, filters,
                kinds):
    partition = split.partition or {}
    with client.open(split.path) as stream:
        if fmt == "binaryfile":
            content = b"".join(read_range(stream, 0, stream.length))
            table = pa.table({"path": [split.path], "length": [len(content)],
                              "modificationTime": pa.array([split.mtime_ns // 1000],
                                                           pa.timestamp("us", tz="UTC")),
                              "content": pa.array([content], pa.binary())})
            yield from conform(table, target, partition)
        elif fmt in columnar.COLUMNAR:
            yield from columnar.read_columnar_split(stream, split, fmt, target, options,
                                                    filters, kinds)
        else:
            yield from textformats.read_text_split(stream, split, fmt, target, options)


class FormatWriter:
    """Writes Arrow batches in one format to a file-like output stream."""

    def __init__(self, fmt: str, out, schema: pa.Schema | None, options):
        if fmt not in WRITE_FORMATS:
            raise InvalidArgument(f"leasefs data source cannot write format {fmt!r}")
        self.rows = 0
        if fmt == "parquet":
            self._writer = columnar.ParquetFormatWriter(out, schema, options)
        elif fmt == "orc":
            self._writer = columnar.OrcFormatWriter(out, schema, options)
        else:
            self._writer = textwrite.TextFormatWriter(fmt, out, schema, options)

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self._writer.write(batch)

    def close(self) -> None:
        self._writer.close()
