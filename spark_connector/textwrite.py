"""Writing the line-based formats: csv, json lines and text, optionally compressed, with
Spark's writer options and defaults.

Why: files we write must read back the same with Spark's own sources, and look like
Spark's: csv values quoted and escaped as Spark's (Univocity) writer does (quote ``"``,
escape ``\\``, null as ``nullValue``, empty string as ``emptyValue`` ``""``, leading and
trailing white space trimmed by default), timestamps and dates in ``timestampFormat`` /
``dateFormat`` (UTC; without the option, timestamps keep their microseconds, where Spark's
default ``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` would cut them to milliseconds; without
sub-millisecond digits the text is Spark's), json nulls
left out unless ``ignoreNullFields=false``. csv cells are built with Arrow compute, a batch
at a time.

Concurrency contract: one writer per output stream, used by one thread.
"""

from __future__ import annotations

import base64
import datetime
import json

import pyarrow as pa
import pyarrow.compute as pc

from fs.errors import InvalidArgument

from .compression import CompressingWriter, write_codec
from .textoptions import DEFAULT_TIMESTAMP, TextOptions


def _formatted(col: pa.Array, at: pa.DataType, opts: TextOptions) -> pa.Array:
    """Timestamps and dates as text in the writer's patterns (UTC)."""
    if pa.types.is_date(at):
        if opts.date is None or opts.date.pattern == "yyyy-MM-dd":
            return col.cast(pa.string())
        return pa.array([None if v is None else opts.date.format_value(v)
                         for v in col.to_pylist()], pa.string())
    utc = col.cast(pa.timestamp("us", tz="UTC")) if at.tz else \
        pc.assume_timezone(col.cast(pa.timestamp("us")), "UTC")
    values = utc.to_pylist()
    if opts.timestamp.pattern == DEFAULT_TIMESTAMP:
        return pa.array([None if v is None else v.isoformat(
            timespec="milliseconds" if v.microsecond % 1000 == 0 else "microseconds")
            .replace("+00:00", "Z") for v in values], pa.string())
    return pa.array([None if v is None else opts.timestamp.format_value(v) for v in values],
                    pa.string())


def _cell_text(col: pa.Array, opts: TextOptions) -> pa.Array:
    """One column as csv text before quoting (nulls stay null)."""
    at = col.type
    if pa.types.is_timestamp(at) or pa.types.is_date(at):
        return _formatted(col, at, opts)
    if pa.types.is_string(at) or pa.types.is_large_string(at):
        return col.cast(pa.string())
    if pa.types.is_floating(at):
        text = col.cast(pa.string())
        text = pc.if_else(pc.match_substring_regex(text, r"^-?\d+$"),
                          pc.binary_join_element_wise(text, ".0", ""), text)
        for arrow, spark in (("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")):
            text = pc.if_else(pc.equal(text, arrow), spark, text)
        return text
    if pa.types.is_nested(at) or pa.types.is_binary(at):
        raise InvalidArgument(f"leasefs csv writer: cannot write a column of type {at} "
                              f"(Spark's csv source cannot either)")
    return col.cast(pa.string())


def csv_cells(col: pa.Array, opts: TextOptions) -> pa.Array:
    """One column as finished csv cells: quoted and escaped as needed, nulls written."""
    text = _cell_text(col, opts)
    if opts.trim_leading:
        text = pc.utf8_ltrim_whitespace(text)
    if opts.trim_trailing:
        text = pc.utf8_rtrim_whitespace(text)
    quote, escape = opts.quote or "", opts.escape or ""
    empty_mask = pc.equal(text, "")
    if quote:
        if opts.quote_all:
            needs = pc.is_valid(text)
        else:
            # escapeQuotes=false: a quote alone does not make a value quoted
            specials = [opts.delimiter, "\n", "\r"] + ([quote] if opts.escape_quotes else [])
            needs = pc.match_substring(text, specials[0])
            for s in specials[1:]:
                needs = pc.or_(needs, pc.match_substring(text, s))
        inner = text
        if escape and escape != quote:
            inner = pc.replace_substring(inner, escape, escape + escape)
        inner = pc.replace_substring(inner, quote, (escape or quote) + quote)
        text = pc.if_else(needs, pc.binary_join_element_wise(quote, inner, quote, ""), text)
    empty = opts.empty_value if opts.empty_value is not None else '""'
    text = pc.if_else(empty_mask, empty, text)
    null = opts.null_value
    if opts.quote_all and null and quote:
        null = quote + null + quote
    return pc.fill_null(text, null)


def _json_default(value):
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if hasattr(value, "__float__"):
        return float(value)
    return str(value)


class TextFormatWriter:
    """Writes Arrow batches as csv, json lines or text to a file-like output stream
    (compressed with the ``compression`` / ``codec`` option)."""

    def __init__(self, fmt: str, out, schema: pa.Schema | None, options):
        self.fmt = fmt
        self.opts = TextOptions.of(options, fmt, "write")
        codec = write_codec(options)
        self._compressing = CompressingWriter(out, codec) if codec else None
        self.out = self._compressing or out
        self._header_pending = self.opts.header
        self.sep = self.opts.line_sep or "\n"

    def _emit(self, lines: list[str] | pa.Array) -> None:
        if isinstance(lines, pa.Array):
            lines = lines.to_pylist()
        if lines:
            self.out.write((self.sep.join(lines) + self.sep).encode("utf-8"))

    def write(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "csv":
            opts = self.opts
            if self._header_pending:
                names = pa.array(batch.schema.names, pa.string())
                header = csv_cells(names, opts).to_pylist()
                self._emit([opts.delimiter.join(header)])
                self._header_pending = False
            cells = [csv_cells(col, opts) for col in batch.columns]
            lines = cells[0] if len(cells) == 1 else \
                pc.binary_join_element_wise(*cells, opts.delimiter)
            self._emit(lines)
        elif self.fmt == "json":
            columns = {}
            for name, col in zip(batch.schema.names, batch.columns):
                at = col.type
                columns[name] = (_formatted(col, at, self.opts)
                                 if pa.types.is_timestamp(at) or pa.types.is_date(at)
                                 else col).to_pylist()
            names = batch.schema.names
            keep_nulls = not self.opts.ignore_null_fields
            lines = []
            for i in range(batch.num_rows):
                obj = {k: columns[k][i] for k in names
                       if keep_nulls or columns[k][i] is not None}
                lines.append(json.dumps(obj, default=_json_default, ensure_ascii=False))
            self._emit(lines)
        elif self.fmt == "text":
            if batch.num_columns != 1 or not (pa.types.is_string(batch.schema.types[0])
                                              or pa.types.is_large_string(batch.schema.types[0])):
                raise InvalidArgument("leasefs text format writes exactly one string column, "
                                      f"got {batch.schema}")
            self._emit(batch.column(0).fill_null("").to_pylist())
        else:
            raise InvalidArgument(f"leasefs data source cannot write format {self.fmt!r}")

    def close(self) -> None:
        if self._compressing is not None:
            self._compressing.close()


__all__ = ["TextFormatWriter", "csv_cells"]
