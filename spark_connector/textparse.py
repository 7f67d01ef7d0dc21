"""Turning parsed text into typed Arrow columns the way Spark's csv and json sources do in
their default PERMISSIVE mode: a value that does not parse as its column's type becomes null
and marks its record malformed (``DROPMALFORMED`` drops such records, ``FAILFAST`` fails
naming the path, ``PERMISSIVE`` keeps them, with the raw record in the corrupt-record column
when the schema has one). Also the record-level slow paths: csv with Python's ``csv`` module
(rows with too few fields padded with nulls, too many truncated) and json line by line
(partial results, top-level arrays of objects giving one row each).

Why separate: pyarrow's fast parsers fail a whole file on one bad value; the readers in
``textformats.py`` use them first and come here only when they fail or when records must be
checked, so clean data keeps the fast path.

Concurrency contract: pure.
"""

from __future__ import annotations

import csv
import json
import re

import pyarrow as pa
import pyarrow.compute as pc

from fs.errors import InvalidArgument

from .arrowcast import cast_column
from .textoptions import TextOptions

_INT = re.compile(r"[+-]?\d+$")


def malformed_error(path: str, record: str | None, why: str = "") -> InvalidArgument:
    shown = (record or "")[:200]
    return InvalidArgument(f"{path}: malformed record in FAILFAST mode{': ' + why if why else ''}"
                           f": {shown!r}")


def _per_value(strings: pa.Array, convert, at: pa.DataType):
    """Convert value by value; a value ``convert`` rejects becomes null and bad."""
    out, bad = [], []
    for text in strings.to_pylist():
        if text is None:
            out.append(None)
            bad.append(False)
            continue
        try:
            out.append(convert(text))
            bad.append(False)
        except (ValueError, TypeError, OverflowError, pa.ArrowException):
            out.append(None)
            bad.append(True)
    return pa.array(out, at) if not pa.types.is_timestamp(at) else \
        pa.array(out, pa.timestamp("us", tz="UTC")).cast(at), pa.array(bad, pa.bool_())


def _scalar_cast(at: pa.DataType):
    def convert(text):
        return pa.array([text], pa.string()).cast(at)[0].as_py()
    return convert


def to_type(strings: pa.Array, at: pa.DataType, opts: TextOptions):
    """``strings`` as ``at`` plus a mask of the values that did not parse (or ``None``)."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks() if strings.num_chunks != 1 else strings.chunk(0)
    if not pa.types.is_string(strings.type):
        strings = strings.cast(pa.string())
    if pa.types.is_string(at) or pa.types.is_large_string(at):
        return strings.cast(at), None
    if pa.types.is_timestamp(at) or pa.types.is_date(at):
        pattern = opts.timestamp if pa.types.is_timestamp(at) else opts.date
        if pattern is not None:
            def convert(text, pattern=pattern):
                value = pattern.parse_value(text)
                if value is None:
                    raise ValueError(text)
                return value if pa.types.is_timestamp(at) else value.date()
            if pa.types.is_date(at):
                arr, bad = _per_value(strings, convert, pa.date32())
                return arr.cast(at), bad
            return _per_value(strings, convert, at)
        try:
            return cast_column(strings, at), None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _per_value(strings, lambda t: cast_column(pa.array([t]), at)[0].as_py(),
                              at)
    if pa.types.is_floating(at):
        for token, spark in ((opts.nan_value, "NaN"), (opts.positive_inf, "inf"),
                             (opts.negative_inf, "-inf")):
            strings = pc.if_else(pc.equal(strings, token), spark, strings)
        strings = pc.if_else(pc.equal(strings, "Infinity"), "inf", strings)
        strings = pc.if_else(pc.equal(strings, "-Infinity"), "-inf", strings)
    try:
        return strings.cast(at), None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _per_value(strings, _scalar_cast(at), at)


# --------------------------------------------------------------------------- csv

def csv_rows_slow(text: str, opts: TextOptions, expected: int):
    """Records of csv ``text`` with Python's csv module: (columns as lists of strings,
    per-record wrong-field-count flags, raw record texts)."""
    lines = text.splitlines(keepends=True)
    reader = csv.reader(iter(lines), delimiter=opts.delimiter, quotechar=opts.quote or '"',
                        escapechar=(opts.escape if opts.escape and opts.escape != opts.quote
                                    else None),
                        doublequote=True, quoting=csv.QUOTE_MINIMAL if opts.quote
                        else csv.QUOTE_NONE, strict=False)
    columns = [[] for _ in range(expected)]
    wrong, raws = [], []
    consumed = 0
    for row in reader:
        raw = "".join(lines[consumed:reader.line_num]).rstrip("\r\n")
        consumed = reader.line_num
        if not row or row == [""] and not raw:
            continue
        wrong.append(len(row) != expected)
        raws.append(raw)
        for i in range(expected):
            value = row[i] if i < len(row) else None
            if value is not None and value in ("", opts.null_value):
                value = None
            columns[i].append(value)
    return columns, wrong, raws


# --------------------------------------------------------------------------- json

class _Number(str):
    """A json number kept as its text (Spark reads a number into a string column as the
    text it was written as, and tells ints from fractions by it)."""


def _loads(line: str):
    return json.loads(line, parse_int=_Number, parse_float=_Number, parse_constant=_Number)


def _json_records(line: str) -> list:
    """The records of one json line, as Spark reads them: each object of a top-level array
    of objects, else the one parsed value (``None`` when the line does not parse; anything
    but a dict is a malformed record)."""
    try:
        parsed = _loads(line)
    except ValueError:
        return [None]
    if isinstance(parsed, list) and parsed and all(isinstance(o, dict) for o in parsed):
        return parsed
    return [parsed]


def _plain(value):
    """A parsed value with numbers turned back into Python numbers (nested columns)."""
    if isinstance(value, _Number):
        return int(value) if _INT.match(value) else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _dump(value) -> str:
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)


def json_text(value, at: pa.DataType):
    """The string a json value gives for a primitive column of type ``at`` (then parsed by
    ``to_type``), or raise ``ValueError`` for a value of the wrong json kind."""
    if value is None:
        return None
    if pa.types.is_string(at) or pa.types.is_large_string(at):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (dict, list)):
            return _dump(value)
        return str(value)
    if pa.types.is_boolean(at):
        if isinstance(value, bool):
            return "true" if value else "false"
        raise ValueError(value)
    if pa.types.is_integer(at):
        if isinstance(value, _Number) and _INT.match(value):
            return str(value)
        raise ValueError(value)
    if pa.types.is_floating(at) or pa.types.is_decimal(at):
        if isinstance(value, _Number):
            return {"Infinity": "inf", "-Infinity": "-inf"}.get(value, str(value))
        if pa.types.is_floating(at) and value in ("NaN", "Infinity", "-Infinity"):
            return {"Infinity": "inf", "-Infinity": "-inf"}.get(value, value)
        raise ValueError(value)
    if isinstance(value, str) and not isinstance(value, _Number):
        return value           # dates and timestamps
    raise ValueError(value)


def is_nested(at: pa.DataType) -> bool:
    return pa.types.is_struct(at) or pa.types.is_list(at) or pa.types.is_map(at) or \
        pa.types.is_large_list(at)


def json_rows_slow(lines, fields: list[pa.Field], opts: TextOptions):
    """json lines parsed one by one: (columns: strings for primitive fields, Python values
    for nested ones; per-record malformed flags; raw record texts)."""
    columns = {f.name: [] for f in fields}
    bad, raws = [], []
    for line in lines:
        if not line.strip():
            continue
        for obj in _json_records(line):
            broken = not isinstance(obj, dict)
            for f in fields:
                value = obj.get(f.name) if isinstance(obj, dict) else None
                if is_nested(f.type):
                    try:
                        pa.array([_plain(value)], f.type)
                        columns[f.name].append(_plain(value))
                    except (pa.ArrowException, TypeError, ValueError):
                        columns[f.name].append(None)
                        broken = True
                    continue
                try:
                    columns[f.name].append(json_text(value, f.type))
                except ValueError:
                    columns[f.name].append(None)
                    broken = True
            bad.append(broken)
            raws.append(line.rstrip("\r\n"))
    return columns, bad, raws


def _merge(a, b):
    if a is None:
        return b
    if b is None or a == b:
        return a
    if {a, b} == {"long", "double"}:
        return "double"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:
        if a[0] == "struct":
            merged = dict(a[1])
            for k, v in b[1].items():
                merged[k] = _merge(merged.get(k), v)
            return ("struct", merged)
        return ("array", _merge(a[1], b[1]))
    return "string"


def _kind(value, as_string: bool):
    if value is None:
        return None
    if isinstance(value, dict):
        kinds: dict = {}
        for k, v in value.items():
            kinds[k] = _merge(kinds.get(k), _kind(v, as_string))
        return ("struct", kinds)
    if isinstance(value, list):
        kind = None
        for v in value:
            kind = _merge(kind, _kind(v, as_string))
        return ("array", kind)
    if as_string:
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, _Number):
        return "long" if _INT.match(value) and -(1 << 63) <= int(value) < (1 << 63) \
            else "double"
    return "string"


def _spark(kind):
    from pyspark.sql.types import (ArrayType, BooleanType, DoubleType, LongType, StringType,
                                   StructField, StructType)
    if isinstance(kind, tuple):
        if kind[0] == "array":
            return ArrayType(_spark(kind[1]), True)
        return StructType([StructField(k, _spark(v), True) for k, v in sorted(kind[1].items())])
    return {"long": LongType(), "double": DoubleType(), "boolean": BooleanType()}.get(
        kind, StringType())


def infer_json(lines, opts: TextOptions):
    """Spark's json schema inference over sample lines: fields sorted by name, conflicting
    kinds widened (long+double → double, anything else → string), a ``_corrupt_record``
    string column when a line is not a json object (PERMISSIVE)."""
    from pyspark.sql.types import StringType, StructField, StructType
    kinds: dict = {}
    corrupt = False
    for line in lines:
        if not line.strip():
            continue
        for obj in _json_records(line):
            if not isinstance(obj, dict):
                corrupt = True
                continue
            for k, v in obj.items():
                kinds[k] = _merge(kinds.get(k), _kind(v, opts.primitives_as_string))
    fields = {k: StructField(k, _spark(v), True) for k, v in kinds.items()}
    if corrupt and opts.mode == "PERMISSIVE":
        fields.setdefault(opts.corrupt_column, StructField(opts.corrupt_column, StringType(),
                                                           True))
    return StructType([fields[k] for k in sorted(fields)])


__all__ = ["to_type", "csv_rows_slow", "json_rows_slow", "json_text", "infer_json",
           "malformed_error"]
