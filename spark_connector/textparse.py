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

class _End(Exception):
    """The end of the input reached inside a record."""


class _CsvRecords:
    """Spark's csv tokenizer (Univocity 2.9 ``CsvParser`` with the settings Spark gives it:
    ``unescapedQuoteHandling=STOP_AT_DELIMITER``, quotes not kept, escapes processed only
    inside quoted values, ``charToEscapeQuoteEscaping`` = the escape when it differs from
    the quote), one record at a time. Spark's results on odd input come from this exact
    sequence of steps (with escape ``\\``, a doubled quote inside quotes ends the quoting
    and the value is read raw to the delimiter, opening quote included), so the steps are
    kept as they are: the attribute ``ch`` is the parser's current character, which a
    helper's local loop does not move when the input ends in it.

    Why by hand: pyarrow and Python's ``csv`` follow RFC 4180 and read those records
    otherwise; this runs only on pieces where they could differ (``csv_needs_records``)."""

    def __init__(self, text: str, opts):
        self.s, self.i = text, 0
        self.d, self.nl = opts.delimiter, "\n"
        self.q = opts.quote or "\0"
        self.e = opts.escape or "\0"
        self.ee = self.e if self.e != self.q else "\0"
        self.lead, self.trail = opts.trim_leading, opts.trim_trailing
        self.ch = self.prev = "\0"
        self.unescaped = False

    # -- input and output
    def next(self) -> str:
        if self.i >= len(self.s):
            raise _End
        self.i += 1
        return self.s[self.i - 1]

    def _white(self, ch: str) -> bool:
        return "\0" < ch <= " "

    def append_until(self, ch: str, *stops: str) -> str:
        while ch not in stops:
            self.buf.append(ch)
            ch = self.next()
        return ch

    def value(self) -> None:
        text = "".join(self.buf)
        if self.trim:
            text = text.rstrip("".join(chr(c) for c in range(1, 33)))
        self.values.append(text if text or self.quoted else None)
        self.buf, self.trim, self.quoted = [], False, False

    def empty(self) -> None:
        self.values.append(None)

    # -- records
    def records(self):
        """``(values, raw text)`` of each record; a value is ``None`` when empty unquoted."""
        n = len(self.s)
        while self.i < n:
            start = self.i
            self.values, self.buf, self.trim, self.quoted = [], [], False, False
            self.unescaped, self.prev = False, "\0"
            try:
                self.ch = self.next()
                self.record()
            except _End:
                self.at_end()
            if self.values:
                yield self.values, self.s[start:self.i].rstrip("\r\n")

    def at_end(self) -> None:
        consume = False
        if self.ch == self.q:
            if self.prev == self.q:
                consume = True
            elif not self.unescaped:
                self.buf.append(self.q)
        consume = consume or (self.prev != "\0" and self.ch not in (self.d, self.nl))
        if self.values or consume:
            if self.buf or consume:
                self.value()
            else:
                self.empty()
        elif self.buf:
            self.value()

    def record(self) -> None:
        if self.lead and self._white(self.ch):
            self.ch = self.skip_white(self.ch)
        while self.ch != self.nl:
            if self.lead and self._white(self.ch):
                self.ch = self.skip_white(self.ch)
            if self.ch in (self.d, self.nl):
                self.empty()
            else:
                self.unescaped, self.prev = False, "\0"
                if self.ch == self.q:
                    self.quoted = True
                    self.quoted_value()
                else:
                    self.trim = self.trail
                    self.ch = self.append_until(self.ch, self.d, self.nl)
                self.value()
            if self.ch != self.nl:
                self.ch = self.next()
                if self.ch == self.nl:
                    self.empty()

    def skip_white(self, ch: str) -> str:
        while self._white(ch) and ch not in (self.d, self.nl, self.q):
            ch = self.next()
        return ch

    def quoted_value(self) -> None:
        q, e = self.q, self.e
        if self.prev != "\0":          # after an unescaped quote: raw text to the delimiter
            self.buf.insert(0, q)
            self.ch = self.next()
            self.trim = self.trail
            self.ch = self.append_until(self.ch, self.d, self.nl)
            return
        self.ch = self.next()
        while True:
            ch = self.ch
            if self.prev == q and (self._white(ch) or ch in (self.d, self.nl)):
                break
            if ch != q and ch != e:
                if self.prev == q:      # unescaped quote: STOP_AT_DELIMITER
                    self.unescaped = True
                    self.buf += [q, ch]
                    self.prev = ch
                    self.quoted_value()
                    return
                if self.prev == e and e != "\0":
                    self.buf.append(e)
                self.ch = self.append_until(ch, q, e, self.ee)
                self.prev = self.ch
                self.ch = self.next()
            else:
                self.quote_escape()
                self.prev = self.ch
                self.ch = self.next()
                if self.unescaped and self.ch in (self.d, self.nl):
                    return
        if self.ch not in (self.d, self.nl) and self._white(self.ch):
            white = []
            while True:
                white.append(self.ch)
                self.ch = self.next()
                if self.ch == self.nl:
                    return
                if not self._white(self.ch):
                    break
            if self.ch != self.d:       # text after the closing quote: kept, quote and all
                self.buf += [q] + white + [self.ch]
                self.prev = self.ch
                self.quoted_value()

    def quote_escape(self) -> None:
        q, e, ch, prev = self.q, self.e, self.ch, self.prev
        if ch == e and prev == self.ee and self.ee != "\0":
            self.buf.append(e)
            self.ch = "\0"
        elif prev == e:
            if ch == q:
                self.buf.append(q)
                self.ch = "\0"
            else:
                self.buf.append(prev)
        elif ch == q and prev == q:
            self.buf.append(q)
        elif prev == q:                 # unescaped quote inside a value
            self.in_value_quote()

    def in_value_quote(self) -> None:
        self.buf.append(self.q)
        self.prev = self.ch
        while self.ch not in (self.d, self.nl):
            ch = self.ch
            if ch != self.q and ch != self.e:
                if self.prev == self.q:
                    self.in_value_quote()
                    return
                self.buf.append(ch)
            else:
                self.quote_escape()
            self.prev = self.ch
            self.ch = self.next()


def csv_records(text: str, opts):
    """Spark's records of csv ``text``: ``(values, raw text)`` each. With ``multiLine``
    every line is its own record (a quoted line break does not join lines) and blank
    lines are skipped, as Spark's line-based csv reader does."""
    if opts.multiline:
        yield from _CsvRecords(text.replace("\r\n", "\n"), opts).records()
        return
    for line in text.split("\n"):
        line = line[:-1] if line.endswith("\r") else line
        if line.strip():
            yield from _CsvRecords(line, opts).records()


def csv_needs_records(text: str, opts) -> bool:
    """Could pyarrow's RFC 4180 reading of ``text`` differ from Spark's? Not when every
    quote and escape character belongs to a whole quoted field whose inside holds only
    other characters, escaped quotes and escaped escapes (doubled quotes when the escape is
    the quote), and no line break unless ``multiLine``: there both read the same. Else, or
    when a line is blank but not empty (Spark skips it), it could."""
    if not opts.multiline and re.search(r"(?m)^[ \t\f\v]+\r?$", text):
        return True
    q, e = opts.quote, opts.escape if opts.quote else None
    if not q or (q not in text and (not e or e not in text)):
        return False
    qq, d = re.escape(q), re.escape(opts.delimiter)
    breaks = "" if opts.multiline else r"\r\n"
    if e and e != q:
        ee = re.escape(e)
        inside = f"(?:[^{qq}{ee}{breaks}]|{ee}{qq}|{ee}{ee})*"
    else:
        inside = f"(?:[^{qq}{breaks}]|{qq}{qq})*"
    clean = re.compile(f"(?:(?<={d})|(?<=\\n)|^){qq}{inside}{qq}(?={d}|\\r?\\n|$)", re.S)
    rest = clean.sub("", text)
    return q in rest or bool(e and e in rest)


def canonical_csv(records, delimiter: str) -> bytes:
    """Records as RFC 4180 csv that pyarrow reads to the same values (schema inference of
    pieces ``csv_needs_records`` flags): every non-empty value quoted."""
    out = []
    for values, _ in records:
        out.append(delimiter.join("" if v is None else '"' + v.replace('"', '""') + '"'
                                  for v in values))
    return ("\n".join(out) + "\n").encode() if out else b""


def csv_rows_slow(text: str, opts: TextOptions, expected: int):
    """Records of csv ``text`` as Spark reads them (``csv_records``): (columns as lists of
    strings, per-record wrong-field-count flags, raw record texts)."""
    columns = [[] for _ in range(expected)]
    wrong, raws = [], []
    for row, raw in csv_records(text, opts):
        wrong.append(len(row) != expected)
        raws.append(raw)
        for i in range(expected):
            columns[i].append(row[i] if i < len(row) else None)
    return columns, wrong, raws


# --------------------------------------------------------------------------- json

class _Number(str):
    """A json number kept as its text (Spark reads a number into a string column as the
    text it was written as, and tells ints from fractions by it)."""


_DECODER = json.JSONDecoder(parse_int=_Number, parse_float=_Number, parse_constant=_Number)


def _json_records(line: str) -> list:
    """The records of one json line, as Spark (Jackson) reads them: only the first json
    value of the line counts (text after it is ignored: ``{"a":1} {"a":2}`` is one
    record, ``{"a":2}]`` is ``{"a":2}``); a top-level array of objects gives one record
    each (``[]`` none); ``None`` when it does not parse, and anything but a dict is a
    malformed record."""
    try:
        parsed, _ = _DECODER.raw_decode(line.strip())
    except ValueError:
        return [None]
    if isinstance(parsed, list) and all(isinstance(o, dict) for o in parsed):
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


def _nested_value(value, at: pa.DataType):
    """A parsed json value as the Python value of nested Arrow type ``at``, each leaf read
    as Spark reads it into its type (``json_text``: a number or an object in a string field
    is its json text); ``ValueError`` for a value of the wrong kind."""
    if value is None:
        return None
    if pa.types.is_struct(at):
        if not isinstance(value, dict):
            raise ValueError(value)
        return {at.field(i).name: _nested_value(value.get(at.field(i).name), at.field(i).type)
                for i in range(at.num_fields)}
    if pa.types.is_list(at) or pa.types.is_large_list(at):
        if not isinstance(value, list):
            raise ValueError(value)
        return [_nested_value(v, at.value_type) for v in value]
    if is_nested(at):
        return _plain(value)              # maps: as parsed
    text = json_text(value, at)
    if text is None or pa.types.is_string(at) or pa.types.is_large_string(at):
        return text
    if pa.types.is_boolean(at):
        return text == "true"
    if pa.types.is_integer(at):
        return int(text)
    if pa.types.is_floating(at):
        return float(text)
    return _plain(value)


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
                        nested = _nested_value(value, f.type)
                        pa.array([nested], f.type)
                        columns[f.name].append(nested)
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
    """Spark's ``compatibleType`` of two inferred kinds: structs merge field by field (the
    union of their fields), arrays by element, long with double is double, and any other
    pair (a struct and a number, an array and a string...) is string."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, str) and isinstance(b, str) and {a, b} == {"long", "double"}:
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
