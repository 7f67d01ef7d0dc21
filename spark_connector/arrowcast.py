"""Arrow batches in exactly the form Spark expects: ``arrow_schema`` of a Spark schema,
``cast_column`` and ``conform`` (data columns cast, partition columns filled in, missing
columns null), and ``spark_type`` of a parsed Arrow type.

Why: Spark rejects a batch whose Arrow types differ from its schema's, so every reader ends
in ``conform``.

Concurrency contract: pure.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

BATCH_ROWS = 65536            # rows per Arrow batch handed to Spark


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


def partition_column(value, target: pa.DataType, n: int) -> pa.Array:
    """``n`` copies of one partition value: a typed value (int, float, Decimal, date,
    datetime, parsed by ``partitioning.parse_value``) as is, a text cast to ``target``."""
    if value is None:
        return pa.nulls(n, target)
    if isinstance(value, str):
        return pa.array([value] * n, pa.string()).cast(target)
    return pa.array([value] * n, target)


def conform(table_or_batch, target: pa.Schema, partition: dict, path: str | None = None,
            batch_rows: int = BATCH_ROWS):
    """``table_or_batch`` as RecordBatches of exactly ``target`` (at most ``batch_rows``
    rows each): data columns cast, partition columns (and ``path``) filled in, missing
    columns null."""
    if isinstance(table_or_batch, pa.RecordBatch):
        table = pa.Table.from_batches([table_or_batch])
    else:
        table = table_or_batch
    n = table.num_rows
    names = set(table.column_names)
    arrays = []
    for f in target:
        if f.name in partition:
            arrays.append(partition_column(partition[f.name], f.type, n))
        elif f.name in names:
            arrays.append(cast_column(table.column(f.name), f.type))
        elif f.name == "path" and path is not None:
            arrays.append(pa.array([path] * n, f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    batch = pa.RecordBatch.from_arrays(arrays, schema=target)
    if n <= batch_rows:
        yield batch
        return
    for offset in range(0, n, batch_rows):
        yield batch.slice(offset, batch_rows)


def spark_type(at: pa.DataType):
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
