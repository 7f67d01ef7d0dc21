"""``localparquet`` and ``answerfloor``: the least any Spark 4 Python data source can do for
a parquet scan and for a selective query, as yardsticks for ``leasefs bench spark --floor``.

Why: Spark 4.3 runs a Python data source row by row on the JVM side (its scan reports no
columnar support, and it passes no required columns), so part of every Python source's cost
is Spark's, not the source's. This source reads Spark's own local parquet files with
pyarrow (no cluster, no network, no filters, no pruning) and hands the batches over cast
to the Spark schema: what it costs next to Spark's own reader is the floor of the API on
this machine. ``answerfloor`` returns a selective query's exact answer from memory: its
time is the per-query cost of the API (planning workers, a Python task) however little a
source reads.

Concurrency contract: plain Spark data source; each task reads one local file.
"""

from __future__ import annotations

import glob
import os

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

BATCH_ROWS = 1 << 18


class _FloorReader(DataSourceReader):
    def __init__(self, folder: str, schema):
        self.files = sorted(glob.glob(os.path.join(folder, "*.parquet")))
        self.schema = schema

    def partitions(self):
        return [InputPartition(path) for path in self.files]

    def read(self, partition):
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema
        target = to_arrow_schema(self.schema, timezone="UTC")
        pf = pq.ParquetFile(partition.value)
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, use_threads=False):
            columns = [batch.column(f.name).cast(f.type) for f in target]
            yield pa.RecordBatch.from_arrays(columns, schema=target)


class LocalParquetFloor(DataSource):
    """``spark.read.format("localparquet").schema(...).load(folder)``."""

    @classmethod
    def name(cls) -> str:
        return "localparquet"

    def reader(self, schema):
        return _FloorReader(self.options["path"], schema)


class _AnswerReader(DataSourceReader):
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def partitions(self):
        return [InputPartition((self.lo, self.hi))]

    def read(self, partition):
        import pyarrow as pa
        import pyarrow.compute as pc
        lo, hi = partition.value
        ids = pa.array(range(lo, hi + 1), pa.int64())
        rest = pc.subtract(ids, pc.multiply(pc.divide(ids, 100000), 100000))
        names = pc.binary_join_element_wise("name-", pc.cast(rest, pa.string()), "")
        yield pa.RecordBatch.from_arrays([ids, names], names=["id", "name"])


class SelectiveAnswerFloor(DataSource):
    """``spark.read.format("answerfloor").option("lo", ..).option("hi", ..).load()``: the
    selective query's exact answer from memory, one partition, no I/O — what a Python
    source pays Spark per query however little it reads."""

    @classmethod
    def name(cls) -> str:
        return "answerfloor"

    def schema(self):
        return "id long, name string"

    def reader(self, schema):
        return _AnswerReader(int(self.options["lo"]), int(self.options["hi"]))
