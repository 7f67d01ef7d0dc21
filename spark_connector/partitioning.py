"""Hive-style partition folders as Spark names and types them: ``k1=v1/k2=v2`` folder names
for ``partitionBy`` writes, and typed partition columns on read.

Why: Spark does not hand ``df.write.partitionBy(...)`` to a Python data source (4.3 fails
with ``requirement failed: The provided partitioning or clustering columns do not match the
existing table's``), so the option ``partitionBy`` does it here, and a tree written by
either side must read the same with either: the same escaping
(``ExternalCatalogUtils.escapePathName``), the same value text (Spark's cast to string, in
the session time zone for timestamps) and, on read, the same type inference
(``PartitioningUtils.inferPartitionColumnValue`` and its widening rule). The rules below
were checked against Spark 4.3's own writer and reader (tests/test_spark_partitions.py).

Inference, per value (the first that parses wins; Spark's order):

1. int32, 2. int64 (Java ``parseInt``/``parseLong``: optional sign, digits),
3. decimal(p, 0) for an integral ``BigDecimal`` text of at most 38 digits (``1e3``, ``1.``),
4. double (Java ``parseDouble``: ``1.5``, ``NaN``, ``Infinity``, ``1.5d``, blanks around),
5. timestamp ``yyyy-MM-dd HH:mm:ss`` with at most ONE fraction digit (Spark's pattern
   ``[.S]``: ``03:04:05.123456`` stays a string), after unescaping,
6. date ``yyyy-MM-dd``, 7. string; ``__HIVE_DEFAULT_PARTITION__`` is null (no type).

A column's type widens over its values: int+long → long, integral+decimal → decimal,
int+double → double, but long or decimal with double → string (no precision loss), date +
timestamp → timestamp, anything else mixed → string; all-null → string. Values are then
parsed from their text for that type (``007`` is 7 in an int column, ``"007"`` in a string
one). Values Spark would have escaped (``%XX`` in the folder name) never parse as numbers or
dates, as in Spark.

Concurrency contract: pure functions.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from fs.errors import InvalidArgument

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# ExternalCatalogUtils.charToEscape (Unix): control characters and "#%'*/:=?[\]^{ DEL
_ESCAPED = frozenset(list(range(1, 32)) + [ord(c) for c in "\"#%'*/:=?[\\]^{"] + [127])
_HEX_CODE = re.compile(r"\+?[0-9a-fA-F]+\Z")


def escape_path_name(text: str) -> str:
    """Spark's ``escapePathName``: each character of the set above → ``%XX``."""
    return "".join(f"%{ord(c):02X}" if ord(c) in _ESCAPED else c for c in text)


def unescape_path_name(text: str) -> str:
    """Spark's ``unescapePathName``: ``%XX`` (hex, Java ``parseInt(XX, 16)``) → that ONE
    character (not UTF-8 decoding); any other ``%`` stays."""
    out, i = [], 0
    while i < len(text):
        code = text[i + 1:i + 3] if text[i] == "%" and i + 2 < len(text) else ""
        if code and _HEX_CODE.match(code):
            out.append(chr(int(code, 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# --------------------------------------------------------------------------- write side

def _java_double(x: float, single: bool = False) -> str:
    """Java's ``Double.toString``/``Float.toString`` (what Spark's cast to string gives):
    shortest digits, plain for 1e-3 <= |x| < 1e7, else ``d.dddE<n>``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1, x) < 0 else "0.0"
    if single:
        import numpy as np
        text = np.format_float_scientific(np.float32(x), unique=True, trim="-")
    else:
        text = repr(x)
    d = Decimal(text).normalize()
    digits = "".join(map(str, d.as_tuple().digits))
    point = d.adjusted()                          # exponent of the first digit
    lead = "-" if d.is_signed() else ""
    if 1e-3 <= abs(x) < 1e7:
        if point < 0:
            return f"{lead}0.{'0' * (-point - 1)}{digits}"
        return f"{lead}{digits[:point + 1].ljust(point + 1, '0')}.{digits[point + 1:] or '0'}"
    return f"{lead}{digits[0]}.{digits[1:] or '0'}E{point}"


def _timestamp_text(value: dt.datetime) -> str:
    text = (f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}")
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    return text


def value_text(value, arrow_type) -> str:
    """The folder text of one partition value as Spark writes it (before escaping):
    Spark's cast to string; null and ``""`` → ``__HIVE_DEFAULT_PARTITION__``."""
    import pyarrow as pa
    if value is None or value == "":
        return DEFAULT_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if pa.types.is_floating(arrow_type):
        return _java_double(float(value), single=pa.types.is_float32(arrow_type))
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        if pa.types.is_timestamp(arrow_type) and arrow_type.tz and value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        if value.tzinfo is not None and pa.types.is_timestamp(arrow_type) and arrow_type.tz:
            from zoneinfo import ZoneInfo
            zone = dt.timezone.utc if arrow_type.tz in ("UTC", "+00:00", "Z") \
                else ZoneInfo(arrow_type.tz)
            value = value.astimezone(zone)
        return _timestamp_text(value)
    if isinstance(value, dt.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    return str(value)


def partition_dir(columns: list[str], texts: list[str]) -> str:
    """``k1=v1/k2=v2`` with Spark's escaping of names and values."""
    return "/".join(f"{escape_path_name(c)}={escape_path_name(t)}"
                    for c, t in zip(columns, texts))


def parse_partition_by(text: str | None) -> list[str]:
    """Option ``partitionBy``: comma-separated column names, in order."""
    if not text:
        return []
    names = [n.strip() for n in str(text).split(",")]
    if any(not n for n in names):
        raise InvalidArgument(f"leasefs data source: option partitionBy={text!r} has an empty "
                              f"column name")
    return names


def check_partition_columns(columns: list[str], schema, target: str) -> list[str]:
    """The ``partitionBy`` columns resolved against the written schema (case-insensitive,
    as Spark resolves them); refuses unknown, repeated, nested or binary columns and a
    partitioning that leaves no data column."""
    from pyspark.sql.types import AtomicType, BinaryType
    by_lower = {f.name.lower(): f for f in schema.fields}
    out = []
    for name in columns:
        field = by_lower.get(name.lower())
        if field is None:
            raise InvalidArgument(f"{target}: partitionBy column {name!r} is not a column of "
                                  f"the data ({', '.join(schema.names)})")
        if field.name in out:
            raise InvalidArgument(f"{target}: partitionBy names column {field.name!r} twice")
        if not isinstance(field.dataType, AtomicType) or isinstance(field.dataType, BinaryType):
            raise InvalidArgument(f"{target}: cannot partition by column {field.name!r} of type "
                                  f"{field.dataType.simpleString()}")
        out.append(field.name)
    if columns and len(out) == len(schema.fields):
        raise InvalidArgument(f"{target}: cannot use all columns ({', '.join(out)}) as "
                              f"partition columns: no data column would be left")
    return out


# --------------------------------------------------------------------------- read side

@dataclass(frozen=True)
class PartitionType:
    """An inferred partition column type: ``kind`` is null, integer, long, decimal, double,
    timestamp, date or string; ``precision`` for decimal (scale is always 0)."""

    kind: str
    precision: int = 0

    def spark_type(self):
        from pyspark.sql import types as T
        return {"integer": T.IntegerType(), "long": T.LongType(), "double": T.DoubleType(),
                "timestamp": T.TimestampType(), "date": T.DateType(),
                "decimal": T.DecimalType(self.precision, 0)}.get(self.kind, T.StringType())


NULL, STRING = PartitionType("null"), PartitionType("string")
_INT = re.compile(r"[+-]?\d+\Z")
_BIG_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[fFdD]?)\Z")
_JAVA_HEX = re.compile(r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+"
                       r"[fFdD]?\Z")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})\Z")
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(\.\d)?\Z")


def _integral_decimal(text: str) -> Decimal | None:
    if not _BIG_DECIMAL.match(text):
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.as_tuple().exponent >= 0 else None   # Java scale <= 0


def _java_parse_double(text: str) -> float | None:
    stripped = text.strip(" \t\n\r\x0b\x0c\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f"
                          "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f")
    if _JAVA_DOUBLE.match(stripped):
        return float(stripped.rstrip("fFdD").replace("Infinity", "inf"))
    if _JAVA_HEX.match(stripped):
        return float.fromhex(stripped.rstrip("fFdD"))
    return None


def _parse_timestamp(text: str) -> dt.datetime | None:
    m = _TIMESTAMP.match(text)
    if not m:
        return None
    try:
        frac = m.group(7)
        return dt.datetime(*(int(g) for g in m.groups()[:6]),
                           int(frac[1:]) * 100000 if frac else 0, tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def _parse_date(text: str) -> dt.date | None:
    m = _DATE.match(text)
    if not m:
        return None
    try:
        return dt.date(*(int(g) for g in m.groups()))
    except ValueError:
        return None


def infer_value_type(value: str | None) -> PartitionType:
    """The type Spark infers for one (unescaped) partition value (module docstring)."""
    if value is None:
        return NULL
    if escape_path_name(value) == value:     # Spark parses numbers/dates on the raw text
        if _INT.match(value):
            n = int(value)
            if -2 ** 31 <= n < 2 ** 31:
                return PartitionType("integer")
            if -2 ** 63 <= n < 2 ** 63:
                return PartitionType("long")
        d = _integral_decimal(value)
        if d is not None and len(str(abs(int(d)))) <= 38:
            return PartitionType("decimal", len(str(abs(int(d)))))
        if _java_parse_double(value) is not None:
            return PartitionType("double")
    if _parse_timestamp(value) is not None:
        return PartitionType("timestamp")
    if escape_path_name(value) == value and _parse_date(value) is not None:
        return PartitionType("date")
    return STRING


def _decimal_bound(t: PartitionType) -> int | None:
    return {"integer": 10, "long": 20, "decimal": t.precision}.get(t.kind)


def wider(a: PartitionType, b: PartitionType) -> PartitionType:
    """Spark's ``findWiderTypeForPartitionColumn``."""
    if a == b:
        return a
    if a.kind == "null":
        return b
    if b.kind == "null":
        return a
    kinds = {a.kind, b.kind}
    if kinds == {"integer", "long"}:
        return PartitionType("long")
    if kinds == {"integer", "double"}:
        return PartitionType("double")
    if kinds == {"date", "timestamp"}:
        return PartitionType("timestamp")
    if "decimal" in kinds and kinds <= {"integer", "long", "decimal"}:
        return PartitionType("decimal", max(_decimal_bound(a), _decimal_bound(b)))
    return STRING


def infer_column(values, inference: bool = True) -> PartitionType:
    """One partition column's type over all its values (all null or no inference → string)."""
    if not inference:
        return STRING
    kind = NULL
    for v in values:
        kind = wider(kind, infer_value_type(v))
    return STRING if kind.kind == "null" else kind


def kind_of(spark_type) -> PartitionType:
    """The ``PartitionType`` a (user-given or inferred) Spark type parses values as."""
    from pyspark.sql import types as T
    for cls, kind in ((T.IntegerType, "integer"), (T.LongType, "long"),
                      (T.DoubleType, "double"), (T.TimestampType, "timestamp"),
                      (T.DateType, "date"), (T.StringType, "string")):
        if isinstance(spark_type, cls):
            return PartitionType(kind)
    if isinstance(spark_type, T.DecimalType):
        return PartitionType("decimal", spark_type.precision)
    return PartitionType("other")


def parse_value(value: str | None, kind: PartitionType):
    """The typed value of a partition value text (``castPartValueToDesiredType``): int,
    Decimal, float, date, datetime (UTC) or str; ``kind`` other → the text (cast later by
    Arrow). A text that does not parse as ``kind`` (a user schema) → None, as Spark's cast."""
    if value is None or kind.kind in ("null", "string", "other"):
        return value
    if kind.kind in ("integer", "long"):
        return int(value) if _INT.match(value) else None
    if kind.kind == "decimal":
        # a user schema may declare a decimal column over non-integral texts: Spark's cast
        return Decimal(value).quantize(Decimal(1)) if _BIG_DECIMAL.match(value) else None
    if kind.kind == "double":
        return _java_parse_double(value)
    if kind.kind == "timestamp":
        ts = _parse_timestamp(value)
        if ts is None and (d := _parse_date(value)) is not None:
            ts = dt.datetime(d.year, d.month, d.day, tzinfo=dt.timezone.utc)
        return ts
    return _parse_date(value)


def typed_values(texts: dict, kinds: dict) -> dict:
    """A file's ``{column: text}`` partition values parsed by ``{column: PartitionType}``."""
    return {k: parse_value(v, kinds.get(k, STRING)) for k, v in texts.items()}


def _sort_key(value):
    if isinstance(value, float) and math.isnan(value):
        return (1, 0.0)       # Spark: NaN equals NaN and is above every other double
    return (0, value)


def compare(value, literal) -> int | None:
    """-1/0/1 of a typed partition value against a filter literal in Spark's order; None
    when they do not compare."""
    try:
        a, b = _sort_key(value), _sort_key(literal)
        return (a > b) - (a < b)
    except TypeError:
        return None


def literal_fits(kind: PartitionType, literal) -> bool:
    """Is ``literal`` (as pyspark hands pushed filters over) a value of a column of
    ``kind``, so that comparing typed values is exactly Spark's comparison?"""
    if literal is None:
        return True
    if kind.kind in ("integer", "long"):
        return isinstance(literal, int) and not isinstance(literal, bool)
    if kind.kind == "decimal":
        return isinstance(literal, (Decimal, int)) and not isinstance(literal, bool)
    if kind.kind == "double":
        return isinstance(literal, float)
    if kind.kind == "timestamp":
        return isinstance(literal, dt.datetime) and literal.tzinfo is not None
    if kind.kind == "date":
        return isinstance(literal, dt.date) and not isinstance(literal, dt.datetime)
    if kind.kind == "string":
        return isinstance(literal, str)
    return False
