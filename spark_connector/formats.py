"""File formats of the ``leasefs`` data source: schema inference, reading one split into Arrow
batches cast exactly to the Spark schema, and writing Arrow batches to an output stream.

Why: Spark's own file formats live in the JVM and cannot open ``leasefs://``; the Python data
source must parse text, csv, json lines and parquet itself. pyarrow does the parsing (C++,
3-5x faster than building Python tuples), so every reader ends in ``conform`` which casts the
parsed table to the exact Arrow form of the Spark schema (Spark rejects a batch whose types
differ) and adds partition columns.

Splits follow Hadoop's ``LineRecordReader`` (``line_split_range``): a split ``[start, end)``
owns every line that STARTS in ``(start, end]`` (and the line at 0 for the first split); a
split not at 0 skips to just after the first line break at or after ``start``, and reads past
``end`` to the line break that finishes its last line. So each line is read exactly once
whatever the block boundaries. CSV files are split only with ``multiLine=false`` (the user
promises no quoted line breaks); by default a csv file is one partition, since a split
starting inside a quoted field cannot know it is inside one.

Concurrency contract: pure functions over a blocking ``fs.Client``; no shared state.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from fs.errors import InvalidArgument

log = logging.getLogger(__name__)

FORMATS = ("text", "binaryfile", "csv", "json", "parquet")
WRITE_FORMATS = ("text", "csv", "json", "parquet")
EXTENSIONS = {"text": "txt", "csv": "csv", "json": "json", "parquet": "parquet"}
SPLITTABLE = ("text", "json", "csv")
READ_CHUNK = 4 << 20          # bytes per pread while reading a split
BATCH_ROWS = 65536            # rows per Arrow batch handed to Spark
SAMPLE_BYTES = 8 << 20        # bytes of the first file used for csv/json schema inference
SPLIT_SLOP = 1.1              # Hadoop FileInputFormat: the last split may be 10% larger


def option(options, name: str, default=None):
    """An option by its lower-cased name (Spark lower-cases keys), or ``default``."""
    value = options.get(name.lower()) if options is not None else None
    return default if value is None else value


def flag(options, name: str, default: bool) -> bool:
    value = option(options, name)
    if value is None:
        return default
    return str(value).strip().lower() in ("true", "1", "yes")


def read_format(options) -> str:
    fmt = str(option(options, "format", "parquet")).lower()
    if fmt == "binary":
        fmt = "binaryfile"
    if fmt not in FORMATS:
        raise InvalidArgument(f"leasefs data source: unknown format {fmt!r} "
                              f"(one of {', '.join(FORMATS)})")
    return fmt


def csv_delimiter(options) -> str:
    value = option(options, "delimiter", option(options, "sep", ","))
    return "\t" if value == "\\t" else value


# --------------------------------------------------------------------------- splits

@dataclass
class Split:
    """One task's share of one file (pickled from the driver to a Python worker)."""

    path: str
    start: int
    end: int                 # exclusive; == length for the last split
    length: int              # the whole file's length
    mtime_ns: int
    partition: dict = field(default_factory=dict)


def plan_splits(files, fmt: str, options) -> list[Split]:
    """One split per file; text/json (and csv with ``multiLine=false``) files larger than
    their block size are cut at block boundaries (option ``splitSize`` overrides it)."""
    splittable = fmt in SPLITTABLE and (fmt != "csv" or not flag(options, "multiLine", True))
    size_option = option(options, "splitSize")
    out = []
    for f in files:
        size = int(size_option) if size_option else f.block_size
        if not splittable or size <= 0 or f.length <= size * SPLIT_SLOP:
            out.append(Split(f.path, 0, f.length, f.length, f.mtime_ns, f.partition))
            continue
        start = 0
        while f.length - start > size * SPLIT_SLOP:
            out.append(Split(f.path, start, start + size, f.length, f.mtime_ns, f.partition))
            start += size
        out.append(Split(f.path, start, f.length, f.length, f.mtime_ns, f.partition))
    return out


def _find_newline(stream, pos: int, length: int) -> int:
    """Offset of the first ``\\n`` at or after ``pos`` (``length`` if none)."""
    while pos < length:
        chunk = stream.pread(pos, min(READ_CHUNK // 16, length - pos) or 1)
        if not chunk:
            return length
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i
        pos += len(chunk)
    return length


def line_split_range(stream, start: int, end: int, length: int) -> tuple[int, int]:
    """``[begin, stop)`` byte range of the whole lines that split ``[start, end)`` owns
    (Hadoop LineRecordReader semantics, see the module docstring)."""
    begin = 0 if start == 0 else _find_newline(stream, start, length) + 1
    if begin > end or begin >= length:
        return begin, begin
    stop = _find_newline(stream, max(end, begin), length)
    return begin, min(length, stop + 1)


def read_range(stream, begin: int, stop: int):
    """The bytes ``[begin, stop)`` in chunks of ``READ_CHUNK``."""
    pos = begin
    while pos < stop:
        chunk = stream.pread(pos, min(READ_CHUNK, stop - pos))
        if not chunk:
            break
        yield chunk
        pos += len(chunk)


def split_bytes(stream, split: Split) -> bytes:
    begin, stop = line_split_range(stream, split.start, split.end, split.length)
    return b"".join(read_range(stream, begin, stop))


def split_line_chunks(stream, split: Split):
    """The owned bytes of a split in pieces that each end at a line break (for text)."""
    begin, stop = line_split_range(stream, split.start, split.end, split.length)
    carry = b""
    for chunk in read_range(stream, begin, stop):
        data = carry + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            carry = data
            continue
        yield data[:cut + 1]
        carry = data[cut + 1:]
    if carry:
        yield carry


# --------------------------------------------------------------------------- Arrow casting

def arrow_schema(schema):
    """The exact Arrow schema Spark expects for ``schema`` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def _timestamp(array: pa.Array, target: pa.DataType) -> pa.Array:
    """Strings or other timestamps → ``target``; zone-less strings are taken as UTC."""
    if pa.types.is_timestamp(array.type):
        if array.type.tz is None and target.tz is not None:
            array = pc.assume_timezone(array.cast(pa.timestamp(target.unit)), "UTC")
        return array.cast(target)
    strings = array.cast(pa.string())
    strings = pc.replace_substring_regex(strings, r"^(\d{4}-\d\d-\d\d) ", r"\1T")
    try:
        return strings.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        naive = strings.cast(pa.timestamp(target.unit))
        return pc.assume_timezone(naive, "UTC") if target.tz else naive


def cast_column(array, target: pa.DataType) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if array.type == target:
        return array
    if pa.types.is_timestamp(target):
        return _timestamp(array, target)
    if pa.types.is_string(target) and pa.types.is_timestamp(array.type):
        return pc.strftime(array, "%Y-%m-%dT%H:%M:%S.%f%z")
    return array.cast(target)


def conform(table_or_batch, target: pa.Schema, partition: dict, path: str | None = None):
    """``table_or_batch`` as RecordBatches of exactly ``target``: data columns cast,
    partition columns (and ``path``) filled in, missing columns null."""
    if isinstance(table_or_batch, pa.RecordBatch):
        table = pa.Table.from_batches([table_or_batch])
    else:
        table = table_or_batch
    n = table.num_rows
    names = set(table.column_names)
    arrays = []
    for f in target:
        if f.name in partition:
            value = partition[f.name]
            arrays.append(pa.array([value] * n, pa.string()).cast(f.type)
                          if value is not None else pa.nulls(n, f.type))
        elif f.name in names:
            arrays.append(cast_column(table.column(f.name), f.type))
        elif f.name == "path" and path is not None:
            arrays.append(pa.array([path] * n, f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    batch = pa.RecordBatch.from_arrays(arrays, schema=target)
    if n <= BATCH_ROWS:
        yield batch
        return
    for offset in range(0, n, BATCH_ROWS):
        yield batch.slice(offset, BATCH_ROWS)


# --------------------------------------------------------------------------- schema inference

def _spark_type(at: pa.DataType):
    """Spark type for a parsed Arrow type (zone-aware timestamps: Spark's TIMESTAMP)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, TimestampType
    if pa.types.is_timestamp(at):
        return TimestampType()
    if pa.types.is_null(at):
        return StringType()
    try:
        return from_arrow_type(at, prefer_timestamp_ntz=False)
    except Exception:  # noqa: BLE001 - unsupported nested types are read as strings
        return StringType()


def _sample(client, path: str, length: int) -> bytes:
    with client.open(path) as stream:
        data = stream.pread(0, min(length, SAMPLE_BYTES))
    if length > SAMPLE_BYTES:
        cut = data.rfind(b"\n")
        data = data[:cut + 1] if cut >= 0 else data
    return data


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
    first = files[0]
    if fmt == "parquet":
        import pyarrow.parquet as pq
        with client.open(first.path) as raw:
            arrow = pq.ParquetFile(io.BufferedReader(raw, 1 << 20)).schema_arrow
        return StructType([StructField(f.name, _spark_type(f.type), True) for f in arrow])
    data = _sample(client, first.path, first.length)
    if fmt == "csv":
        table = read_csv_bytes(data, options, header=flag(options, "header", False),
                               column_types=None,
                               infer=flag(options, "inferSchema", False))
        return StructType([StructField(name, _spark_type(table.column(name).type)
                                       if flag(options, "inferSchema", False) else StringType(),
                                       True) for name in table.column_names])
    import pyarrow.json as pj
    table = pj.read_json(io.BytesIO(data))
    return StructType([StructField(f.name, _spark_type(f.type), True) for f in table.schema])


# --------------------------------------------------------------------------- readers

def _plain_type(at: pa.DataType, fmt: str = "csv") -> pa.DataType:
    """The type pyarrow should parse text into (timestamps parsed later by ``cast_column``;
    json decimals arrive as numbers and go through float64)."""
    if pa.types.is_timestamp(at) or pa.types.is_binary(at):
        return pa.string()
    if pa.types.is_decimal(at):
        return pa.float64() if fmt == "json" else pa.string()
    if fmt == "json" and pa.types.is_date(at):
        return pa.string()
    return at


def read_csv_bytes(data: bytes, options, *, header: bool, column_types, names=None,
                   infer: bool = True, skip_header: bool = True):
    import pyarrow.csv as pcsv
    delimiter = csv_delimiter(options)
    quote = option(options, "quote", '"')
    escape = option(options, "escape")
    read_options = pcsv.ReadOptions(
        column_names=names, autogenerate_column_names=not header and names is None,
        skip_rows=1 if header and names is not None and skip_header else 0,
        block_size=16 << 20)
    parse = pcsv.ParseOptions(delimiter=delimiter, quote_char=quote or False,
                              escape_char=escape or False, newlines_in_values=True,
                              double_quote=escape is None, ignore_empty_lines=True)
    convert_kw = dict(null_values=[option(options, "nullValue", "")], strings_can_be_null=True,
                      quoted_strings_can_be_null=False)
    if column_types:
        convert_kw["column_types"] = column_types
    elif not infer:
        convert_kw["column_types"] = {}
    table = pcsv.read_csv(io.BytesIO(data), read_options=read_options, parse_options=parse,
                          convert_options=pcsv.ConvertOptions(**convert_kw))
    if names is None and not header:
        table = table.rename_columns([f"_c{i}" for i in range(table.num_columns)])
    if not infer and not column_types:
        table = pa.table([c.cast(pa.string()) for c in table.columns], names=table.column_names)
    return table


def _csv_header_names(stream, options) -> list[str]:
    """Column names from the file's first line (a header never holds a line break)."""
    import pyarrow.csv as pcsv
    end = _find_newline(stream, 0, stream.length)
    first = stream.pread(0, end) + b"\n"
    table = pcsv.read_csv(io.BytesIO(first), read_options=pcsv.ReadOptions(block_size=1 << 20),
                          parse_options=pcsv.ParseOptions(delimiter=csv_delimiter(options),
                                                          quote_char=option(options, "quote",
                                                                            '"')),
                          convert_options=pcsv.ConvertOptions(column_types={}))
    return table.column_names


def read_split(client, split: Split, fmt: str, target: pa.Schema, options):
    """Arrow batches of exactly ``target`` for one split."""
    partition = split.partition or {}
    with client.open(split.path) as stream:
        if fmt == "binaryfile":
            content = b"".join(read_range(stream, 0, stream.length))
            table = pa.table({"path": [split.path], "length": [len(content)],
                              "modificationTime": pa.array([split.mtime_ns // 1000],
                                                           pa.timestamp("us", tz="UTC")),
                              "content": pa.array([content], pa.binary())})
            yield from conform(table, target, partition)
            return
        if fmt == "parquet":
            import pyarrow.parquet as pq
            pf = pq.ParquetFile(io.BufferedReader(stream, 4 << 20))
            present = [f.name for f in target
                       if f.name not in partition and f.name in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=present):
                yield from conform(batch, target, partition)
            return
        if fmt == "text":
            path = split.path if "path" in target.names else None
            for chunk in split_line_chunks(stream, split):
                lines = chunk.decode("utf-8", errors="replace").split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
                for offset in range(0, len(lines), BATCH_ROWS):
                    table = pa.table({"value": pa.array(lines[offset:offset + BATCH_ROWS],
                                                        pa.string())})
                    yield from conform(table, target, partition, path)
            return
        data = split_bytes(stream, split)
        if not data.strip():
            return
        data_fields = [f for f in target if f.name not in partition]
        if fmt == "json":
            import pyarrow.json as pj
            explicit = pa.schema([pa.field(f.name, _plain_type(f.type, "json")) for f in data_fields])
            table = pj.read_json(io.BytesIO(data), parse_options=pj.ParseOptions(
                explicit_schema=explicit, unexpected_field_behavior="ignore"),
                read_options=pj.ReadOptions(block_size=16 << 20))
            yield from conform(table, target, partition)
            return
        # csv
        header = flag(options, "header", False)
        file_names = _csv_header_names(stream, options) if header else None
        wanted = [f.name for f in data_fields]
        if file_names is None or not set(wanted) <= set(file_names):
            # no header, or names that differ: columns by position (Spark's enforceSchema)
            count = len(file_names) if file_names else len(wanted)
            names = [wanted[i] if i < len(wanted) else f"_unused{i}" for i in range(count)]
        else:
            names = file_names
        types = {f.name: _plain_type(f.type) for f in data_fields if f.name in names}
        table = read_csv_bytes(data, options, header=header, column_types=types, names=names,
                               skip_header=split.start == 0)
        yield from conform(table, target, partition)


# --------------------------------------------------------------------------- writers

def _json_default(value):
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        import base64
        return base64.b64encode(value).decode()
    if hasattr(value, "__float__"):
        return float(value)
    return str(value)


class FormatWriter:
    """Writes Arrow batches in one format to a file-like output stream."""

    def __init__(self, fmt: str, out, schema: pa.Schema | None, options):
        self.fmt, self.out, self.options = fmt, out, options
        self.rows = 0
        self._parquet = None
        self._csv = None
        self._header_pending = flag(options, "header", False)

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(
                    self.out, batch.schema,
                    compression=option(self.options, "compression", "snappy"))
            self._parquet.write_batch(batch)
        elif self.fmt == "csv":
            import pyarrow.csv as pcsv
            opts = pcsv.WriteOptions(include_header=self._header_pending,
                                     delimiter=csv_delimiter(self.options))
            self._header_pending = False
            buf = io.BytesIO()
            pcsv.write_csv(batch, buf, opts)
            self.out.write(buf.getvalue())
        elif self.fmt == "json":
            names = batch.schema.names
            lines = []
            for row in batch.to_pylist():
                obj = {k: row[k] for k in names if row[k] is not None}
                lines.append(json.dumps(obj, default=_json_default, ensure_ascii=False))
            if lines:
                self.out.write(("\n".join(lines) + "\n").encode("utf-8"))
        elif self.fmt == "text":
            if batch.num_columns != 1 or not (pa.types.is_string(batch.schema.types[0])
                                              or pa.types.is_large_string(batch.schema.types[0])):
                raise InvalidArgument("leasefs text format writes exactly one string column, "
                                      f"got {batch.schema}")
            values = batch.column(0).fill_null("").to_pylist()
            if values:
                self.out.write(("\n".join(values) + "\n").encode("utf-8"))
        else:
            raise InvalidArgument(f"leasefs data source cannot write format {self.fmt!r}")

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
