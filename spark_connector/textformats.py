"""The line-based formats of the ``leasefs`` data source: text, csv and json lines. Schema
inference from a sample and reading one split into Arrow batches (``conform``-ed to the
Spark schema); writing is ``textwrite.py``, value parsing and malformed records
``textparse.py``, compressed files ``compression.py``.

Why: pyarrow does the parsing (C++, 3-5x faster than building Python tuples); what Spark's
own sources do differently is bridged here. Files are consumed in pieces that end at a
record separator (``PIECE_BYTES`` each, or the whole file for multi-line csv and
``wholetext``), so a large or compressed file never has to be in memory at once.

Concurrency contract: pure functions over a blocking ``fs.Client`` stream; no shared state.
"""

from __future__ import annotations

import io
import random
import re

import pyarrow as pa
import pyarrow.compute as pc

from fs.errors import InvalidArgument

from .arrowcast import BATCH_ROWS, cast_column, conform, spark_type
from .compression import codec_for_path, decompressed_chunks, file_chunks
from .optionvalues import flag, option
from .ranges import read_range
from .splits import _find_newline, line_split_range
from .textoptions import DatetimePattern, TextOptions
from .textparse import (canonical_csv, csv_needs_records, csv_records, csv_rows_slow,
                        infer_json, is_nested as _nested, json_rows_slow, malformed_error,
                        to_type)

SAMPLE_BYTES = 8 << 20        # bytes of the first file used for csv/json schema inference
PIECE_BYTES = 4 << 20         # decompressed bytes parsed at a time
_PLACEHOLDERS = ("\x1e", "\x1f", "\x1d", "\x1c", "\x07")


def csv_delimiter(options) -> str:
    value = option(options, "delimiter", option(options, "sep", ","))
    return "\t" if value == "\\t" else value


# --------------------------------------------------------------------------- bytes in pieces

def owned_chunks(stream, split):
    """The bytes a split owns: a compressed file whole and decompressed, else the
    ``LineRecordReader`` range."""
    codec = codec_for_path(split.path)
    if codec is not None:
        return decompressed_chunks(stream, split.length, codec, split.path)
    begin, stop = line_split_range(stream, split.start, split.end, split.length)
    return read_range(stream, begin, stop)


def pieces(chunks, sep: bytes | None, limit: int = PIECE_BYTES):
    """Pieces of about ``limit`` bytes, each ending at ``sep`` (except maybe the last);
    ``sep=None``: everything as one piece."""
    if sep is None:
        data = b"".join(chunks)
        if data:
            yield data
        return
    carry = bytearray()
    for chunk in chunks:
        carry += chunk
        if len(carry) >= limit:
            cut = carry.rfind(sep)
            if cut >= 0:
                yield bytes(carry[:cut + len(sep)])
                del carry[:cut + len(sep)]
    if carry:
        yield bytes(carry)


def _sample(client, first, opts: TextOptions) -> bytes:
    """The first ``SAMPLE_BYTES`` (decompressed) of the first file, cut at a record end."""
    out = bytearray()
    with client.open(first.path) as stream:
        for chunk in file_chunks(stream, first.path, first.length):
            out += chunk
            if len(out) >= SAMPLE_BYTES:
                break
    if len(out) >= SAMPLE_BYTES:
        sep = (opts.line_sep or "\n").encode()
        cut = out.rfind(sep)
        out = out[:cut + len(sep)] if cut >= 0 else out
    return bytes(out)


def _sampled(records: list, opts: TextOptions) -> list:
    """``samplingRatio``: a seeded random share of the records (at least one)."""
    if opts.sampling_ratio >= 1 or not records:
        return records
    rnd = random.Random(1)
    kept = [r for r in records if rnd.random() < opts.sampling_ratio]
    return kept or records[:1]


# --------------------------------------------------------------------------- csv helpers

def _csv_text(data: bytes, opts: TextOptions) -> tuple[bytes, str | None]:
    """csv bytes prepared for pyarrow: a one-character ``lineSep`` swapped with ``\\n``
    (the placeholder returned replaces line breaks inside values), comment lines removed."""
    placeholder = None
    if opts.line_sep not in (None, "\n", "\r\n"):
        text = data.decode("utf-8", errors="replace")
        placeholder = next((p for p in _PLACEHOLDERS if p not in text), None)
        if placeholder is None:
            raise InvalidArgument("leasefs data source: csv lineSep: the data holds every "
                                  "placeholder control character")
        data = text.replace("\n", placeholder).replace(opts.line_sep, "\n").encode()
    if opts.comment:
        data = re.sub(rb"(?m)^" + re.escape(opts.comment.encode()) + rb"[^\n]*(\n|$)", b"",
                      data)
    return data, placeholder


def _parse_options(opts: TextOptions, invalid=None, canonical: bool = False):
    """pyarrow's reading of csv that ``csv_needs_records`` passed (escapes only of a quote
    or an escape, inside quotes: read alike by both); ``canonical``: the RFC 4180 text of
    ``canonical_csv``."""
    import pyarrow.csv as pcsv
    escape = opts.escape if opts.quote and opts.escape and opts.escape != opts.quote else None
    if canonical:
        return pcsv.ParseOptions(delimiter=opts.delimiter, quote_char='"', escape_char=False,
                                 newlines_in_values=True, double_quote=True,
                                 ignore_empty_lines=True, invalid_row_handler=invalid)
    return pcsv.ParseOptions(delimiter=opts.delimiter, quote_char=opts.quote or False,
                             escape_char=escape or False, newlines_in_values=True,
                             double_quote=escape is None, ignore_empty_lines=True,
                             invalid_row_handler=invalid)


def read_csv_bytes(data: bytes, opts: TextOptions, *, header: bool, column_types,
                   names=None, infer: bool = True, skip_header: bool = True,
                   canonical: bool = False):
    """pyarrow's csv reader with the source's options (schema inference)."""
    import pyarrow.csv as pcsv
    read_options = pcsv.ReadOptions(
        column_names=names, autogenerate_column_names=not header and names is None,
        skip_rows=1 if header and names is not None and skip_header else 0,
        block_size=16 << 20)
    convert_kw = dict(null_values=sorted({opts.null_value, ""}), strings_can_be_null=True,
                      quoted_strings_can_be_null=False)
    if column_types:
        convert_kw["column_types"] = column_types
    elif not infer:
        convert_kw["column_types"] = {}
    table = pcsv.read_csv(io.BytesIO(data), read_options=read_options,
                          parse_options=_parse_options(opts, lambda row: "skip", canonical),
                          convert_options=pcsv.ConvertOptions(**convert_kw))
    if names is None and not header:
        table = table.rename_columns([f"_c{i}" for i in range(table.num_columns)])
    if not infer and not column_types:
        table = pa.table([c.cast(pa.string()) for c in table.columns], names=table.column_names)
    return table


def _header_line(data: bytes) -> tuple[bytes, bytes]:
    """(first line, the rest) of csv bytes (a header never holds a line break)."""
    start = len(data) - len(data.lstrip(b"\r\n"))
    end = data.find(b"\n", start)
    if end < 0:
        return data[start:], b""
    return data[start:end + 1], data[end + 1:]


def _names_of(line: bytes, opts: TextOptions) -> list[str]:
    import pyarrow.csv as pcsv
    table = pcsv.read_csv(io.BytesIO(line.rstrip(b"\r\n") + b"\n"),
                          read_options=pcsv.ReadOptions(block_size=1 << 20),
                          parse_options=_parse_options(opts),
                          convert_options=pcsv.ConvertOptions(column_types={}))
    return table.column_names


def _csv_header_names(stream, opts: TextOptions) -> list[str]:
    """Column names from an uncompressed file's first line (splits after the first)."""
    end = _find_newline(stream, 0, stream.length)
    data, _ = _csv_text(stream.pread(0, end) + b"\n", opts)
    return _names_of(_header_line(data)[0], opts)


# --------------------------------------------------------------------------- inference

def infer_text_schema(client, first, fmt: str, options):
    """The Spark schema of csv or json data from the first file's sample."""
    from pyspark.sql.types import StringType, StructField, StructType
    opts = TextOptions.of(options, fmt, "read")
    data = _sample(client, first, opts)
    if fmt == "json":
        sep = opts.line_sep or "\n"
        lines = data.decode("utf-8", errors="replace").split(sep)
        return infer_json(_sampled(lines, opts), opts)
    data, _ = _csv_text(data, opts)
    if not data.strip():
        return StructType([])       # Spark: no record, no column (and no row to read)
    text = data.decode("utf-8", errors="replace")
    canonical = csv_needs_records(text, opts)
    if canonical:
        data = canonical_csv(csv_records(text, opts), opts.delimiter)
    infer = flag(options, "inferSchema", False)
    if opts.sampling_ratio < 1 and infer:
        head, rest = _header_line(data) if opts.header else (b"", data)
        data = head + b"".join(_sampled(rest.splitlines(keepends=True), opts))
    table = read_csv_bytes(data, opts, header=opts.header, column_types=None, infer=infer,
                           canonical=canonical)
    texts = None
    if infer and any(_datetime_candidate(c.type, opts) for c in table.columns):
        # the values unparsed, for Spark's date and timestamp inference
        texts = read_csv_bytes(data, opts, header=opts.header, names=table.column_names,
                               column_types={n: pa.string() for n in table.column_names},
                               canonical=canonical).columns
    texts = texts or [None] * table.num_columns
    return StructType([StructField(name, _csv_inferred_type(table.column(name), texts[i], opts)
                                   if infer else StringType(), True)
                       for i, name in enumerate(table.column_names)])


def _csv_inferred_type(column, texts, opts: TextOptions):
    """Spark's csv inference for a parsed column: integers are ``int`` when every value
    fits 32 bits (Spark tries int before long); with ``dateFormat`` / ``timestampFormat``
    given, text columns are tried with those patterns (``texts``: the column unparsed);
    else as pyarrow parsed them."""
    from pyspark.sql.types import IntegerType
    if pa.types.is_int64(column.type):
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or (-(1 << 31) <= low and high < (1 << 31)):
            return IntegerType()
    at = column.type
    if texts is not None and _datetime_candidate(at, opts):
        return _datetime_type(texts, opts) or spark_type(pa.string())
    return spark_type(at)


def _datetime_candidate(at: pa.DataType, opts: TextOptions) -> bool:
    """Is a column pyarrow inferred as ``at`` to be tried as date / timestamp Spark's way?
    Text (pyarrow knows fewer forms than Spark's lenient parser), and with a pattern
    given, pyarrow's dates and timestamps too (the pattern decides)."""
    return pa.types.is_string(at) or bool(opts.date or opts.timestamp) and (
        pa.types.is_date(at) or pa.types.is_timestamp(at))


_ISO_DATE = DatetimePattern.parse("yyyy-MM-dd", "dateFormat")


def _datetime_type(texts, opts: TextOptions):
    """Spark's inference of a text column as date or timestamp: a value is a date when
    ``dateFormat`` (default ``yyyy-MM-dd``) reads it whole, else a timestamp when
    ``timestampFormat`` does (without it: any ISO 8601 date-time, as Spark's default
    parser); all dates → date, dates and timestamps → timestamp, else ``None``."""
    from pyspark.sql.types import DateType, TimestampType
    date = opts.date or _ISO_DATE
    kinds = set()
    for text in set(pc.drop_null(texts).to_pylist()) - {opts.null_value}:
        if date.parse_value(text) is not None:
            kinds.add("date")
        elif _is_timestamp(text, opts):
            kinds.add("timestamp")
        else:
            return None
    if not kinds:
        return None
    return DateType() if kinds == {"date"} else TimestampType()


def _is_timestamp(text: str, opts: TextOptions) -> bool:
    if opts.timestamp is not None:
        return opts.timestamp.parse_value(text) is not None
    try:
        cast_column(pa.array([text]), pa.timestamp("us", tz="UTC"))
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return False


# --------------------------------------------------------------------------- reading

def _plain_type(at: pa.DataType, fmt: str = "csv") -> pa.DataType:
    """The type pyarrow's json reader should produce (timestamps and dates parsed later;
    json decimals arrive as numbers and go through float64)."""
    if pa.types.is_timestamp(at) or pa.types.is_binary(at) or pa.types.is_date(at):
        return pa.string()
    if pa.types.is_decimal(at):
        return pa.float64()
    return at


def _corrupt_field(target: pa.Schema, opts: TextOptions) -> str | None:
    name = opts.corrupt_column
    if name in target.names and pa.types.is_string(target.field(name).type):
        return name
    return None


def _finish(columns: dict, bad, raws, target, partition, opts, path, corrupt):
    """Apply the parse mode to typed ``columns`` with per-row ``bad`` flags (a boolean
    Arrow array or ``None``) and raw records (a list or a callable giving one)."""
    n = len(next(iter(columns.values()))) if columns else (len(raws) if raws else 0)
    table = pa.table(columns) if columns else pa.table({"_": pa.nulls(n)})
    if bad is not None and pc.any(bad).as_py():
        if opts.mode == "FAILFAST":
            first = pc.index(bad, True).as_py()
            raise malformed_error(path, (raws() if callable(raws) else raws)[first])
        if opts.mode == "DROPMALFORMED":
            table = table.filter(pc.invert(bad))
        elif corrupt:
            records = raws() if callable(raws) else raws
            table = table.append_column(corrupt, pc.if_else(bad, pa.array(records, pa.string()),
                                                            pa.nulls(n, pa.string())))
    yield from conform(table, target, partition)


def _typed(strings: dict, fields, opts: TextOptions):
    """String columns → typed columns and the rows with a value that did not parse. As
    Spark: a quoted empty value reads as ``emptyValue`` and then, like any value equal to
    ``nullValue``, as null (so ``""`` is null by default)."""
    columns, bad = {}, None
    empty = opts.empty_value if opts.empty_value is not None else ""
    for f in fields:
        col = strings.get(f.name)
        if col is None:
            continue
        col = pc.if_else(pc.equal(col, ""), empty, col)
        col = pc.if_else(pc.equal(col, opts.null_value), pa.scalar(None, pa.string()), col)
        arr, mask = to_type(col, f.type, opts)
        columns[f.name] = arr
        if mask is not None:
            bad = mask if bad is None else pc.or_(bad, mask)
    return columns, bad


def _read_text(chunks, split, target, partition, opts: TextOptions):
    path = split.path if "path" in target.names else None
    if opts.wholetext:
        data = b"".join(chunks)
        table = pa.table({"value": pa.array([data.decode("utf-8", errors="replace")])})
        yield from conform(table, target, partition, path)
        return
    sep = opts.line_sep or "\n"
    for piece in pieces(chunks, sep.encode()):
        lines = piece.decode("utf-8", errors="replace").split(sep)
        if lines and lines[-1] == "":
            lines.pop()
        if opts.line_sep is None:
            lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
        for offset in range(0, len(lines), BATCH_ROWS):
            table = pa.table({"value": pa.array(lines[offset:offset + BATCH_ROWS],
                                                pa.string())})
            yield from conform(table, target, partition, path)


_NONBLANK_LINE = re.compile(rb"(?m)^[ \t\r]*[^ \t\r\n]")


def _read_json(chunks, split, target, partition, opts: TextOptions):
    import pyarrow.json as pj
    corrupt = _corrupt_field(target, opts)
    fields = [f for f in target if f.name not in partition and f.name != corrupt]
    explicit = pa.schema([pa.field(f.name, _plain_type(f.type, "json")) for f in fields])
    sep = opts.line_sep or "\n"
    for piece in pieces(chunks, sep.encode()):
        if opts.line_sep is not None:
            records = [r.replace("\r", " ").replace("\n", " ")
                       for r in piece.decode("utf-8", errors="replace").split(sep)]
            piece = "\n".join(records).encode()
        if not piece.strip():
            continue
        try:
            table = pj.read_json(io.BytesIO(piece), parse_options=pj.ParseOptions(
                explicit_schema=explicit, unexpected_field_behavior="ignore"),
                read_options=pj.ReadOptions(block_size=16 << 20))
            if table.num_rows != len(_NONBLANK_LINE.findall(piece)):
                # pyarrow read several values from one line; Spark reads only the first
                raise pa.ArrowInvalid("not one json value per line")
            strings = {f.name: table.column(f.name) for f in fields}
            typed, bad = {}, None
            for f in fields:
                typed[f.name] = strings[f.name]
                if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type):
                    typed[f.name], mask = to_type(strings[f.name], f.type, opts)
                    if mask is not None:
                        bad = mask if bad is None else pc.or_(bad, mask)
            if bad is None or not pc.any(bad).as_py():
                yield from conform(pa.table(typed) if typed else table, target, partition)
                continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        lines = piece.decode("utf-8", errors="replace").split("\n")
        values, flags, raws = json_rows_slow(lines, fields, opts)
        columns, bad = {}, pa.array(flags, pa.bool_())
        for f in fields:
            if _nested(f.type):
                columns[f.name] = pa.array(values[f.name], f.type)
                continue
            columns[f.name], mask = to_type(pa.array(values[f.name], pa.string()), f.type,
                                            opts)
            if mask is not None:
                bad = pc.or_(bad, mask)
        yield from _finish(columns, bad, raws, target, partition, opts, split.path, corrupt)


def _csv_strings(data: bytes, names: list[str], opts: TextOptions, placeholder):
    """String columns of csv ``data`` with ``names``, the per-row wrong-field-count flags
    (or ``None``) and a callable giving the raw records. pyarrow parses (fast) unless its
    reading could differ from Spark's (``csv_needs_records``; whitespace trimming next to
    quotes) or a row has the wrong number of fields: then Spark's tokenizer does."""
    import pyarrow.csv as pcsv
    trim = opts.trim_leading or opts.trim_trailing
    text = data.decode("utf-8", errors="replace")
    raws_cache: list = []

    def slow():
        cols, wrong, raws = csv_rows_slow(text, opts, len(names))
        if placeholder:
            raws = [r.replace(placeholder, "\n") for r in raws]
        raws_cache[:] = [raws]
        return {n: pa.array(c, pa.string()) for n, c in zip(names, cols)}, wrong

    def raws_of():
        if not raws_cache:
            slow()
        return raws_cache[0]

    wrong_rows = []
    if csv_needs_records(text, opts) or (trim and opts.quote and opts.quote in text):
        wrong_rows.append(None)
    else:
        table = pcsv.read_csv(
            io.BytesIO(data), read_options=pcsv.ReadOptions(column_names=names,
                                                            block_size=16 << 20),
            parse_options=_parse_options(opts, lambda row: wrong_rows.append(row) or "skip"),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                null_values=sorted({opts.null_value, ""}), strings_can_be_null=True,
                quoted_strings_can_be_null=False))
    if wrong_rows:
        strings, wrong = slow()
        wrong_mask = pa.array(wrong, pa.bool_()) if any(wrong) else None
    else:
        strings = {n: table.column(n) for n in names}
        wrong_mask = None
        if opts.trim_leading:
            strings = {n: pc.utf8_ltrim_whitespace(c) for n, c in strings.items()}
        if opts.trim_trailing:
            strings = {n: pc.utf8_rtrim_whitespace(c) for n, c in strings.items()}
    if placeholder:
        strings = {n: pc.replace_substring(c, placeholder, "\n") for n, c in strings.items()}
    return strings, wrong_mask, raws_of


def _read_csv(stream, chunks, split, target, partition, opts: TextOptions):
    corrupt = _corrupt_field(target, opts)
    fields = [f for f in target if f.name not in partition and f.name != corrupt]
    wanted = [f.name for f in fields]
    file_names = None
    if opts.header and split.start != 0:
        file_names = _csv_header_names(stream, opts)
    sep = None if opts.line_sep not in (None, "\n", "\r\n") or opts.multiline else b"\n"
    first = split.start == 0
    for piece in pieces(chunks, sep):
        data, placeholder = _csv_text(piece, opts)
        if first and opts.header:
            head, data = _header_line(data)
            file_names = _names_of(head, opts) if head.strip() else file_names
        first = False
        if not data.strip():
            continue
        if file_names is None or not set(wanted) <= set(file_names):
            # no header, or names that differ: columns by position (Spark's enforceSchema)
            count = len(file_names) if file_names else len(wanted)
            names = [wanted[i] if i < len(wanted) else f"_unused{i}" for i in range(count)]
        else:
            names = file_names
        strings, wrong, raws = _csv_strings(data, names, opts, placeholder)
        columns, bad = _typed(strings, fields, opts)
        if wrong is not None:
            bad = wrong if bad is None else pc.or_(bad, wrong)
        yield from _finish(columns, bad, raws, target, partition, opts, split.path, corrupt)


def read_text_split(stream, split, fmt: str, target: pa.Schema, options):
    """Arrow batches of exactly ``target`` for one split of a text, json or csv file."""
    partition = split.partition or {}
    opts = TextOptions.of(options, fmt, "read")
    chunks = owned_chunks(stream, split)
    if fmt == "text":
        yield from _read_text(chunks, split, target, partition, opts)
    elif fmt == "json":
        yield from _read_json(chunks, split, target, partition, opts)
    else:
        yield from _read_csv(stream, chunks, split, target, partition, opts)


__all__ = ["infer_text_schema", "read_text_split", "read_csv_bytes", "csv_delimiter",
           "owned_chunks", "pieces"]
