"""The columnar formats of the ``leasefs`` data source: parquet and ORC. Schema from the
footer (one file's, or the union of all with ``mergeSchema``), planning splits of row groups
(parquet) or stripes (ORC), reading a split into Arrow batches (``conform``-ed to the Spark
schema, pushed filters applied exactly), writing.

Why: a large columnar file read by one task leaves the other cores idle, reading columns a
query does not use wastes the cluster's bandwidth, and a selective query should not decode
row groups whose statistics exclude it. Spark 4.3 passes Python data sources no required
columns, so the columns read are those of the schema Spark holds: the user's
``.schema(...)`` when given (a subset schema prunes), else the inferred one.

Splits (``plan_columnar_splits``):

1. A file no larger than one split (``splitSize``, default its block size, with
   ``splits.SPLIT_SLOP``) is one split with ``row_groups=()`` (all): the driver reads no
   footer for it, the task skips row groups by statistics itself.
2. A larger file: the driver reads its footer, drops the row groups (parquet) whose
   statistics exclude the pushed filters, and packs the rest, in file order, into splits of
   about the split size of compressed bytes; each split names its row-group indices. ORC
   stripes (pyarrow exposes neither their sizes nor their statistics) are packed by count:
   ``ceil(length / splitSize)`` splits of consecutive stripes, none skipped.
3. With data filters pushed, every parquet file's footer is read on the driver (eight at a
   time): a file whose row groups the statistics all exclude gets no split, so a selective
   query starts no task for it (a Python task costs Spark tens of milliseconds even when it
   reads nothing).

Reading: parquet reads only the target's columns of the split's row groups (pyarrow
``pre_buffer`` coalesces each row group's column chunks into few large reads); every batch
is ``conform``-ed and then filtered with the exact expression of ``pushdown.py``.

Concurrency contract: pure functions over a blocking ``fs.Client`` stream; no shared state
except ``READ_COUNTS``, a per-process tally for tests and logs.
"""

from __future__ import annotations

import io
import logging
import math
from collections import Counter

import pyarrow as pa

from fs.errors import InvalidArgument

from . import pushdown
from .arrowcast import conform, spark_type
from .optionvalues import flag, option
from .splits import SPLIT_SLOP, Split

log = logging.getLogger(__name__)

COLUMNAR = ("parquet", "orc")
#: row groups / stripes read and skipped in this process ("read", "skipped" keys)
READ_COUNTS: Counter = Counter()

# Spark's codec names of the ``compression`` option -> (pyarrow's name, the tag Spark puts
# before the extension: ``part-...-c000.snappy.parquet``; none for uncompressed files)
PARQUET_CODECS = {"none": ("none", ""), "uncompressed": ("none", ""),
                  "snappy": ("snappy", "snappy"), "gzip": ("gzip", "gz"),
                  "zstd": ("zstd", "zstd"), "lz4_raw": ("lz4", "lz4raw"),
                  "brotli": ("brotli", "br")}
PARQUET_DEFAULT_CODEC = "snappy"
# codecs Spark writes that pyarrow cannot: refused, with why
PARQUET_REFUSED = {"lz4": "Spark's lz4 is Hadoop's LZ4 framing, which pyarrow cannot write; "
                          "use lz4_raw", "lzo": "pyarrow cannot write LZO"}
ORC_CODECS = {"none": ("uncompressed", ""), "uncompressed": ("uncompressed", ""),
              "snappy": ("snappy", "snappy"), "zlib": ("zlib", "zlib"), "lz4": ("lz4", "lz4"),
              "zstd": ("zstd", "zstd")}
ORC_DEFAULT_CODEC = "zstd"     # Spark 4's default
#: rows per batch handed to Spark: measured on 2 cores (``leasefs bench spark``), 256Ki rows
#: beat 64Ki (more per-batch overhead in the worker and the JVM) and 1Mi (Python and the JVM
#: no longer overlap)
COLUMNAR_BATCH_ROWS = 1 << 18
#: rows per parquet row group written: small enough that statistics let a selective query
#: skip most of a file, large enough that dictionaries and statistics stay a small share
#: (DuckDB writes 122,880)
ROW_GROUP_ROWS = 1 << 17
#: footers read at once on the driver while planning
FOOTER_THREADS = 8


class PreadFile(io.RawIOBase):
    """A leasefs input stream as the random-access file pyarrow wants: each ``read`` at the
    position is ONE ``pread`` of exactly the bytes asked for. pyarrow asks for the footer,
    then (``pre_buffer``) each row group's wanted column chunks coalesced into few large
    ranges, so a read moves only the bytes of the columns and row groups it uses (a
    ``BufferedReader`` would read ahead a whole buffer at every seek)."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.pos, self.length = stream, 0, stream.length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        data = self.stream.pread(self.pos, n) if n > 0 else b""
        self.pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)


# --------------------------------------------------------------------------- schema

def _file_schema(client, path: str, fmt: str) -> pa.Schema:
    with client.open(path) as raw:
        stream = PreadFile(raw)
        if fmt == "orc":
            import pyarrow.orc as orc
            return orc.ORCFile(stream).schema
        import pyarrow.parquet as pq
        return pq.ParquetFile(stream).schema_arrow


def infer_columnar_schema(client, files, fmt: str, options):
    """The Spark schema of the first file, or with ``mergeSchema=true`` the union of every
    file's: columns in order of first appearance, a name with two Spark types is an error
    naming both files (Spark's ``StructType.merge`` refuses it too)."""
    from pyspark.sql.types import StructField, StructType
    chosen = files if flag(options, "mergeSchema", False) else files[:1]
    fields: dict[str, tuple] = {}
    for f in chosen:
        for af in _file_schema(client, f.path, fmt):
            st = spark_type(af.type)
            seen = fields.get(af.name)
            if seen is None:
                fields[af.name] = (st, f.path)
            elif seen[0] != st:
                raise InvalidArgument(
                    f"leasefs data source: mergeSchema: column {af.name!r} is "
                    f"{seen[0].simpleString()} in {seen[1]} but {st.simpleString()} in "
                    f"{f.path}; incompatible types")
    return StructType([StructField(name, st, True) for name, (st, _) in fields.items()])


# --------------------------------------------------------------------------- statistics

def _parquet_stats(md, index: int, kinds: dict[str, str]) -> dict:
    """``name -> pushdown.ColumnStats`` of the top-level columns of row group ``index``."""
    rg = md.row_group(index)
    out = {}
    for j in range(rg.num_columns):
        col = rg.column(j)
        name = col.path_in_schema
        kind = kinds.get(name)
        if kind is None or "." in name:
            continue
        lo = hi = nulls = None
        try:
            st = col.statistics
            if st is not None:
                if st.has_null_count:
                    nulls = st.null_count
                if st.has_min_max:
                    lo = pushdown.comparable(st.min, kind)
                    hi = pushdown.comparable(st.max, kind)
        except (ValueError, TypeError, OverflowError, pa.ArrowException):
            lo = hi = nulls = None
        out[name] = pushdown.ColumnStats(lo, hi, nulls, rg.num_rows)
    return out


def kept_row_groups(md, filters, kinds, chosen=()) -> list[int]:
    """Indices of the row groups (of ``chosen``; all when empty) whose statistics do not
    exclude ``filters``; counts the skipped ones in ``READ_COUNTS``."""
    indices = list(chosen) if chosen else list(range(md.num_row_groups))
    if not filters:
        return indices
    kept = [i for i in indices if pushdown.may_match(filters, _parquet_stats(md, i, kinds), kinds)]
    READ_COUNTS["skipped"] += len(indices) - len(kept)
    return kept


def _group_range(rg) -> tuple[int, int]:
    start, end = None, 0
    for j in range(rg.num_columns):
        col = rg.column(j)
        first = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            first = min(first, col.dictionary_page_offset)
        start = first if start is None else min(start, first)
        end = max(end, first + col.total_compressed_size)
    return start or 0, end


# --------------------------------------------------------------------------- planning

def split_size(f, options) -> int:
    size_option = option(options, "splitSize")
    return int(size_option) if size_option else f.block_size


def plan_columnar_splits(client, files, fmt: str, options, filters=(), kinds=None) -> list[Split]:
    """Splits of parquet row groups / ORC stripes (module docstring, steps 1-3)."""
    def plan(f) -> list[Split]:
        size = split_size(f, options)
        footer = fmt == "parquet" and filters
        if not footer and (size <= 0 or f.length <= size * SPLIT_SLOP):
            return [Split(f.path, 0, f.length, f.length, f.mtime_ns, f.partition)]
        with client.open(f.path) as raw:
            stream = PreadFile(raw)
            if fmt == "orc":
                return _orc_splits(f, stream, size)
            return _parquet_splits(f, stream, size if size > 0 else f.length, filters,
                                   kinds or {})

    if len(files) < 2:
        return [s for f in files for s in plan(f)]
    # footers are small reads: fetch them side by side (the client is thread-safe)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(files))) as pool:
        return [s for splits in pool.map(plan, files) for s in splits]


def _parquet_splits(f, stream, size: int, filters, kinds) -> list[Split]:
    import pyarrow.parquet as pq
    md = pq.read_metadata(stream)
    groups = kept_row_groups(md, filters, kinds)
    out, current, begin, stop = [], [], None, 0
    for i in groups:
        start, end = _group_range(md.row_group(i))
        begin = start if begin is None else begin
        current.append(i)
        stop = max(stop, end)
        if stop - begin >= size:
            out.append(Split(f.path, begin, stop, f.length, f.mtime_ns, f.partition,
                             tuple(current)))
            current, begin, stop = [], None, 0
    if current:
        out.append(Split(f.path, begin, stop, f.length, f.mtime_ns, f.partition, tuple(current)))
    return out


def _orc_splits(f, stream, size: int) -> list[Split]:
    import pyarrow.orc as orc
    n = orc.ORCFile(stream).nstripes
    count = max(1, min(n, math.ceil(f.length / size)))
    out = []
    for k in range(count):
        lo, hi = k * n // count, (k + 1) * n // count
        if hi > lo:
            out.append(Split(f.path, f.length * lo // n, f.length * hi // n, f.length,
                             f.mtime_ns, f.partition, tuple(range(lo, hi))))
    return out


# --------------------------------------------------------------------------- reading

def read_columnar_split(stream, split: Split, fmt: str, target: pa.Schema, options,
                        filters=(), kinds=None):
    """Arrow batches of exactly ``target`` for one split, ``filters`` applied exactly."""
    expr = pushdown.expression(filters, target) if filters else None
    partition = split.partition or {}
    source = (_orc_batches if fmt == "orc" else _parquet_batches)(
        stream, split, target, partition, filters, kinds or {})
    for batch in source:
        for out in conform(batch, target, partition, batch_rows=COLUMNAR_BATCH_ROWS):
            out = pushdown.apply(out, expr)
            if out.num_rows:
                yield out


def _present(target: pa.Schema, partition: dict, names) -> list[str]:
    names = set(names)
    return [f.name for f in target if f.name not in partition and f.name in names]


def _parquet_batches(stream, split, target, partition, filters, kinds):
    import pyarrow.parquet as pq
    pf = pq.ParquetFile(PreadFile(stream), pre_buffer=True)
    groups = kept_row_groups(pf.metadata, filters, kinds, split.row_groups)
    READ_COUNTS["read"] += len(groups)
    if not groups:
        return
    present = _present(target, partition, pf.schema_arrow.names)
    yield from pf.iter_batches(batch_size=COLUMNAR_BATCH_ROWS, row_groups=groups,
                               columns=present, use_threads=False)


def _orc_batches(stream, split, target, partition, filters, kinds):
    import pyarrow.orc as orc
    of = orc.ORCFile(PreadFile(stream))
    present = _present(target, partition, of.schema.names)
    stripes = list(split.row_groups) or list(range(of.nstripes))
    READ_COUNTS["read"] += len(stripes)
    for i in stripes:
        yield of.read_stripe(i, columns=present)


# --------------------------------------------------------------------------- writing

class ParquetFormatWriter:
    """Writes Arrow batches as one parquet file to a file-like output stream, in row groups
    of ``ROW_GROUP_ROWS`` rows (the last one smaller).

    Why buffer: Spark hands a writer batches of ``maxRecordsPerBatch`` (10,000) rows, and
    ``ParquetWriter.write_batch`` closes a row group per call; files of 10,000-row groups
    are half again larger (a dictionary page and statistics per column per group) and
    slower to decode for every reader."""

    def __init__(self, out, schema: pa.Schema | None, options):
        self.out, self.options = out, options
        self._parquet = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        import pyarrow.parquet as pq
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self.out, batch.schema,
                                             compression=codec("parquet", self.options)[0])
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            table = pa.Table.from_batches(self._pending)
            full = (self._pending_rows // ROW_GROUP_ROWS) * ROW_GROUP_ROWS
            self._parquet.write_table(table.slice(0, full), row_group_size=ROW_GROUP_ROWS)
            rest = table.slice(full)
            self._pending = rest.to_batches() if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def close(self) -> None:
        if self._parquet is not None:
            if self._pending_rows:
                self._parquet.write_table(pa.Table.from_batches(self._pending),
                                          row_group_size=ROW_GROUP_ROWS)
            self._parquet.close()
        self._pending, self._pending_rows = [], 0


def codec(fmt: str, options) -> tuple[str, str]:
    """(pyarrow's codec, Spark's file-name tag) of the ``compression`` option of a parquet
    or ORC write; a codec pyarrow cannot write is refused naming it."""
    table, default = ((PARQUET_CODECS, PARQUET_DEFAULT_CODEC) if fmt == "parquet"
                      else (ORC_CODECS, ORC_DEFAULT_CODEC))
    name = str(option(options, "compression", default)).strip().lower()
    found = table.get(name)
    if found is None:
        why = PARQUET_REFUSED.get(name) if fmt == "parquet" else None
        raise InvalidArgument(f"leasefs data source: {fmt} compression {name!r} not supported"
                              f"{' (' + why + ')' if why else ''} (one of "
                              f"{', '.join(table)})")
    return found


def _orc_friendly(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Zone-aware timestamps as UTC wall time: ORC's plain TIMESTAMP, which Spark reads as
    its TIMESTAMP (pyarrow would write zone-aware ones as TIMESTAMP_INSTANT)."""
    if not any(pa.types.is_timestamp(f.type) and f.type.tz for f in batch.schema):
        return batch
    arrays, fields = [], []
    for f, a in zip(batch.schema, batch.columns):
        if pa.types.is_timestamp(f.type) and f.type.tz:
            a = a.cast(pa.timestamp(f.type.unit))
            f = pa.field(f.name, a.type, f.nullable)
        arrays.append(a)
        fields.append(f)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class OrcFormatWriter:
    """Writes Arrow batches as one ORC file to a file-like output stream."""

    def __init__(self, out, schema: pa.Schema | None, options):
        self.out, self.codec = out, codec("orc", options)[0]
        self._orc = None

    def write(self, batch: pa.RecordBatch) -> None:
        import pyarrow.orc as orc
        if self._orc is None:
            self._orc = orc.ORCWriter(self.out, compression=self.codec)
        self._orc.write(pa.Table.from_batches([_orc_friendly(batch)]))

    def close(self) -> None:
        if self._orc is not None:
            self._orc.close()
