"""Filters on DATA columns pushed into the columnar readers (parquet, orc): which of Spark's
filters we take, their exact pyarrow form, and whether a row group's statistics exclude them.

Why: with ``spark.sql.python.filterPushdown.enabled=true`` Spark hands ``pushFilters`` the
conjuncts of a query's WHERE clause (a list that is AND-ed). A filter we take is (1) used to
skip whole row groups whose min/max/null-count statistics prove no row can match — on the
driver while planning row-group splits, and again in the task — and (2) applied EXACTLY to
every batch we return, so Spark drops it from its own plan. A filter we cannot apply exactly
is handed back and Spark evaluates it after us. Partition-column filters are
``datasource.py``'s (they prune files).

Exactness rules (SQL three-valued logic: a row is kept only when the filter is TRUE):

1. A column takes a filter only when the literal's Python type is the column's: ``int`` for
   byte/short/int/long (never ``bool``), ``str`` for string, ``bool`` for boolean,
   ``date`` for date, a zone-aware ``datetime`` for timestamp (a naive one for
   timestamp_ntz). Anything else (decimal, binary, float/double comparisons — Spark orders
   NaN above every number and makes ``NaN = NaN`` true, pyarrow does neither, and parquet
   statistics leave NaN out) goes back to Spark. IS NULL / IS NOT NULL work on any type.
2. A comparison with a NULL literal is never TRUE: we do not take it (Spark folds it anyway);
   ``<=>`` (EqualNullSafe) with NULL means IS NULL.
3. ``Not(c)`` is TRUE only where ``c`` is FALSE — never on a NULL column value — so it becomes
   ``is_valid(col) & ~c`` for the null-rejecting ``c``; ``Not(col IN (.., NULL))`` is never
   TRUE and is not taken. ``<=>`` is never NULL, so ``Not(col <=> v)`` keeps NULL rows.
4. The filter runs on the batch AFTER ``arrowcast.conform``, i.e. on the exact Arrow types of
   the Spark schema (timestamps UTC microseconds), whatever the file stored.

Statistics rule: a row group is skipped only when, for some filter, its statistics prove the
filter is not TRUE for any row; any missing, unordered or unreadable statistic means "may
match" (INT96 timestamps, for one, have none).

Concurrency contract: pure functions.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

_INTEGRAL = ("byte", "short", "integer", "long")
ORDERED = _INTEGRAL + ("string", "date", "timestamp", "timestamp_ntz", "boolean")

__all__ = ["column_kinds", "pushable", "expression", "apply", "may_match", "ColumnStats"]


def column_kinds(schema, exclude=()) -> dict[str, str]:
    """``name -> Spark type name`` of the top-level columns of ``schema`` filters may use."""
    return {f.name: f.dataType.typeName() for f in schema.fields if f.name not in exclude}


def _literal_ok(value, kind: str) -> bool:
    if kind in _INTEGRAL:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "date":
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    if kind == "timestamp":
        return isinstance(value, dt.datetime) and value.tzinfo is not None
    if kind == "timestamp_ntz":
        return isinstance(value, dt.datetime) and value.tzinfo is None
    return False


def _names():
    from pyspark.sql import datasource as d
    return d


def pushable(flt, kinds: dict[str, str]) -> bool:
    """Can ``flt`` (one of Spark's ``pyspark.sql.datasource`` filters) be applied exactly to
    the data columns ``kinds`` (see the module docstring's rules)?"""
    d = _names()
    if isinstance(flt, d.Not):
        child = flt.child
        if isinstance(child, d.In) and any(v is None for v in child.value):
            return False
        return not isinstance(child, d.Not) and pushable(child, kinds)
    if len(getattr(flt, "attribute", ())) != 1 or flt.attribute[0] not in kinds:
        return False
    kind = kinds[flt.attribute[0]]
    if isinstance(flt, (d.IsNull, d.IsNotNull)):
        return True
    if kind not in ORDERED:
        return False
    if isinstance(flt, d.EqualNullSafe):
        return flt.value is None or _literal_ok(flt.value, kind)
    if isinstance(flt, (d.EqualTo, d.GreaterThan, d.GreaterThanOrEqual, d.LessThan,
                        d.LessThanOrEqual)):
        return _literal_ok(flt.value, kind)
    if isinstance(flt, d.In):
        values = list(flt.value)
        return bool(values) and all(v is None or _literal_ok(v, kind) for v in values)
    if isinstance(flt, d.StringStartsWith):
        return kind == "string" and isinstance(flt.value, str)
    return False


def _scalar(value, kind: str, arrow_type: pa.DataType):
    if kind == "timestamp":
        value = value.astimezone(dt.timezone.utc)
    return pa.scalar(value, arrow_type)


def _one(flt, target: pa.Schema) -> pc.Expression:
    """The exact pyarrow expression of one pushable filter over the conformed batch."""
    d = _names()
    if isinstance(flt, d.Not):
        child = flt.child
        col = pc.field(child.attribute[0])
        if isinstance(child, d.IsNull):
            return col.is_valid()
        if isinstance(child, d.IsNotNull):
            return col.is_null()
        if isinstance(child, d.EqualNullSafe):
            return ~_one(child, target)    # <=> is never NULL: its NOT keeps NULL rows
        return col.is_valid() & ~_one(child, target)
    name = flt.attribute[0]
    col = pc.field(name)
    if isinstance(flt, d.IsNull):
        return col.is_null()
    if isinstance(flt, d.IsNotNull):
        return col.is_valid()
    arrow_type = target.field(name).type
    kind = _kind_of(arrow_type)
    if isinstance(flt, d.EqualNullSafe):
        if flt.value is None:
            return col.is_null()
        return col.is_valid() & (col == _scalar(flt.value, kind, arrow_type))
    if isinstance(flt, d.In):
        values = [_scalar(v, kind, arrow_type).as_py() for v in flt.value if v is not None]
        return col.isin(pa.array(values, arrow_type))
    if isinstance(flt, d.StringStartsWith):
        return pc.starts_with(col, pattern=flt.value)
    value = _scalar(flt.value, kind, arrow_type)
    if isinstance(flt, d.EqualTo):
        return col == value
    if isinstance(flt, d.GreaterThan):
        return col > value
    if isinstance(flt, d.GreaterThanOrEqual):
        return col >= value
    if isinstance(flt, d.LessThan):
        return col < value
    return col <= value


def _kind_of(arrow_type: pa.DataType) -> str:
    if pa.types.is_timestamp(arrow_type):
        return "timestamp" if arrow_type.tz else "timestamp_ntz"
    return "other"


def expression(filters, target: pa.Schema) -> pc.Expression | None:
    """The AND of ``filters`` as one pyarrow expression (None for no filter)."""
    out = None
    for flt in filters:
        e = _one(flt, target)
        out = e if out is None else out & e
    return out


def apply(batch: pa.RecordBatch, expr: pc.Expression | None) -> pa.RecordBatch:
    """The rows of ``batch`` for which ``expr`` is TRUE (NULL counts as not TRUE)."""
    if expr is None:
        return batch
    return batch.filter(expr)


# --------------------------------------------------------------------------- statistics

@dataclass(frozen=True)
class ColumnStats:
    """What a row group (or stripe) knows of one column: ``lo``/``hi`` in the comparable form
    of ``comparable`` (None: unknown), and the null and row counts (None: unknown)."""

    lo: object
    hi: object
    nulls: int | None
    rows: int


def comparable(value, kind: str):
    """``value`` (a literal or a statistic) in a form that orders like Spark: timestamps as
    UTC microseconds (naive = UTC), dates as day ordinals; None when it cannot be compared."""
    try:
        if kind in ("timestamp", "timestamp_ntz"):
            if isinstance(value, dt.datetime):
                if value.tzinfo is None:
                    value = value.replace(tzinfo=dt.timezone.utc)
                delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
                return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
            return None
        if kind == "date":
            return value.toordinal() if isinstance(value, dt.date) else None
        if kind in _INTEGRAL:
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        if kind == "string":
            return value if isinstance(value, str) else None
        if kind == "boolean":
            return value if isinstance(value, bool) else None
    except (OverflowError, ValueError, AttributeError):
        return None
    return None


def _may_match_one(flt, stats: dict[str, ColumnStats], kinds: dict[str, str]) -> bool:
    d = _names()
    negated = isinstance(flt, d.Not)
    base = flt.child if negated else flt
    s = stats.get(base.attribute[0])
    if s is None:
        return True
    kind = kinds[base.attribute[0]]
    all_null = s.nulls is not None and s.nulls >= s.rows
    if isinstance(base, d.IsNull):
        return (s.nulls is None or s.nulls > 0) if not negated else not all_null
    if isinstance(base, d.IsNotNull):
        return not all_null if not negated else (s.nulls is None or s.nulls > 0)
    if isinstance(base, d.EqualNullSafe) and base.value is None:
        return (s.nulls is None or s.nulls > 0) if not negated else not all_null
    if all_null:
        return False                       # every other filter needs a non-null value
    if negated or s.lo is None or s.hi is None:
        return True
    lo, hi = s.lo, s.hi
    try:
        if isinstance(base, (d.EqualTo, d.EqualNullSafe)):
            v = comparable(base.value, kind)
            return v is None or lo <= v <= hi
        if isinstance(base, d.In):
            vs = [comparable(v, kind) for v in base.value if v is not None]
            return any(v is None or lo <= v <= hi for v in vs)
        if isinstance(base, d.StringStartsWith):
            p = base.value
            return not (hi < p or (lo > p and not lo.startswith(p)))
        v = comparable(base.value, kind)
        if v is None:
            return True
        if isinstance(base, d.GreaterThan):
            return hi > v
        if isinstance(base, d.GreaterThanOrEqual):
            return hi >= v
        if isinstance(base, d.LessThan):
            return lo < v
        if isinstance(base, d.LessThanOrEqual):
            return lo <= v
    except TypeError:
        return True
    return True


def may_match(filters, stats: dict[str, ColumnStats], kinds: dict[str, str]) -> bool:
    """False only when ``stats`` (one row group's, by column name) prove that no row makes
    every filter TRUE."""
    return all(_may_match_one(f, stats, kinds) for f in filters)
