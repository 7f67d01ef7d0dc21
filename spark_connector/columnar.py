"""The columnar format of the ``leasefs`` data source: parquet. Schema from the footer,
reading a file into Arrow batches (``conform``-ed to the Spark schema), writing.

Concurrency contract: pure functions over a blocking ``fs.Client`` stream; no shared state.
"""

from __future__ import annotations

import io

import pyarrow as pa

from .arrowcast import BATCH_ROWS, conform, spark_type
from .optionvalues import option


def infer_parquet_schema(client, first):
    from pyspark.sql.types import StructField, StructType
    import pyarrow.parquet as pq
    with client.open(first.path) as raw:
        arrow = pq.ParquetFile(io.BufferedReader(raw, 1 << 20)).schema_arrow
    return StructType([StructField(f.name, spark_type(f.type), True) for f in arrow])


def read_parquet_split(stream, split, target: pa.Schema, options):
    import pyarrow.parquet as pq
    partition = split.partition or {}
    pf = pq.ParquetFile(io.BufferedReader(stream, 4 << 20))
    present = [f.name for f in target
               if f.name not in partition and f.name in pf.schema_arrow.names]
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=present):
        yield from conform(batch, target, partition)


class ParquetFormatWriter:
    """Writes Arrow batches as one parquet file to a file-like output stream."""

    def __init__(self, out, schema: pa.Schema | None, options):
        self.out, self.options = out, options
        self._parquet = None

    def write(self, batch: pa.RecordBatch) -> None:
        import pyarrow.parquet as pq
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(
                self.out, batch.schema,
                compression=option(self.options, "compression", "snappy"))
        self._parquet.write_batch(batch)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
