"""``LeaseFSDataSource``: the Spark Python Data Source named ``leasefs`` (batch read and write,
streaming read and write).

Why: Spark 4's ``pyspark.sql.datasource`` API is the only way to make Spark read and write
leasefs without a JVM client. The data source object is built on the driver and pickled to
Python workers, so it carries only plain values (URL, options, schema, splits); the cluster
connection is the per-process ``fs.Client`` of ``location.client_for``.

Usage::

    spark.dataSource.register(LeaseFSDataSource)
    df = spark.read.format("leasefs").option("format", "csv").option("header", "true") \\
        .load("leasefs://127.0.0.1:8020/data/*.csv")
    df.write.format("leasefs").option("format", "parquet").mode("overwrite") \\
        .save("leasefs://127.0.0.1:8020/out")

Options (Spark lower-cases the keys): ``format`` (text, binaryFile, csv, json, parquet,
orc; default parquet), ``meta`` (cluster address for plain ``/paths``), ``splitSize`` (bytes,
default the file's block size; parquet/orc split by row groups / stripes), ``mergeSchema``
(parquet, orc), the listing options ``pathGlobFilter``,
``recursiveFileLookup``, ``modifiedBefore``/``modifiedAfter``, ``ignoreMissingFiles``,
``ignoreCorruptFiles`` (``location.ListingOptions``, ``formats.read_split``), the text/csv/json
options of ``textoptions.TextOptions`` (csv: ``header``, ``sep``, ``quote``, ``escape``,
``comment``, ``nullValue``, ``emptyValue``, ``nanValue``..., ``mode``, ``lineSep``,
``dateFormat``, ``timestampFormat``...; json: ``mode``, ``primitivesAsString``,
``ignoreNullFields``...; text: ``lineSep``, ``wholetext``, ``includePath``), ``multiLine``
(csv: false allows splitting files at block boundaries), ``compression`` / ``codec``
(parquet, orc; text/csv/json: gzip, bzip2, deflate, zstd, lz4, snappy — ``compression.py``),
``staleStagingSeconds`` (write: age after which abandoned staging is removed),
``maxFilesPerTrigger`` and ``lookbackSeconds`` (streaming source). Any other option Spark's
own source honours for the format is refused before planning (``options.py``).

Filter pushdown: only with ``spark.sql.python.filterPushdown.enabled=true`` does Spark call
``pushFilters``, with the AND-ed conjuncts of the query. Comparisons of partition columns
(``key=value`` folders) with literals prune whole files on the driver and are exact. For
parquet and orc, filters on data columns that ``pushdown.pushable`` accepts (the literal's
type is the column's; no float comparisons, see ``pushdown.py``) skip row groups by their
statistics (driver and task) and are applied exactly to every batch. Spark may drop every
filter we take; the rest are handed back and Spark evaluates them. Spark passes no required
columns to Python data sources: the columns read are those of the schema, so a subset
``.schema(...)`` prunes.

Concurrency contract: planning (``schema``, ``partitions``, ``commit``, ``abort``, offsets) runs
in driver-side Python processes, ``read``/``write`` in worker processes; each uses the
blocking ``fs.Client`` of its process, safe to share between threads.
"""

from __future__ import annotations

import json
import logging
import posixpath
import sys
import time
from dataclasses import dataclass, field

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamArrowWriter, DataSourceStreamReader,
                                    InputPartition, WriterCommitMessage)

from fs.errors import InvalidArgument

from . import commit as protocol
from . import formats, pushdown
from .formats import flag, option
from .location import ListingOptions, client_for, list_data_files, parse_location
from .options import check as options_check

log = logging.getLogger(__name__)

__all__ = ["LeaseFSDataSource"]


def _paths_option(options) -> list[str]:
    paths = option(options, "paths")
    if paths:
        try:
            value = json.loads(paths)
            if isinstance(value, list):
                return [str(p) for p in value]
        except ValueError:
            pass
        return [p for p in str(paths).split(",") if p]
    path = option(options, "path")
    if not path:
        raise InvalidArgument("leasefs data source: no path given (load(path) / save(path))")
    return [path]


def _infer_partition_type(values: list):
    from pyspark.sql.types import LongType, StringType
    present = [v for v in values if v is not None]
    if present and all(v.lstrip("-").isdigit() for v in present):
        return LongType()
    return StringType()


class LeaseFSPartition(InputPartition):
    """One split of one file (``formats.Split``) as a Spark input partition."""

    def __init__(self, split, meta):
        super().__init__(split.path)
        self.split = split
        self.meta = meta


# --------------------------------------------------------------------------- filters

def _filter_matches(flt, values: dict, types: dict) -> bool:
    """Does a pushed partition filter keep a file with these partition values?"""
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, IsNotNull, IsNull, LessThan, LessThanOrEqual, Not)
    if isinstance(flt, Not):
        return not _filter_matches(flt.child, values, types)
    col = flt.attribute[0]
    raw = values.get(col)
    value = None if raw is None else (int(raw) if types[col] == "long" else raw)
    if isinstance(flt, IsNull):
        return value is None
    if isinstance(flt, IsNotNull):
        return value is not None
    if isinstance(flt, EqualNullSafe):
        return value == flt.value
    if value is None:
        return False
    if isinstance(flt, EqualTo):
        return value == flt.value
    if isinstance(flt, In):
        return value in flt.value
    try:
        if isinstance(flt, GreaterThan):
            return value > flt.value
        if isinstance(flt, GreaterThanOrEqual):
            return value >= flt.value
        if isinstance(flt, LessThan):
            return value < flt.value
        if isinstance(flt, LessThanOrEqual):
            return value <= flt.value
    except TypeError:
        return False
    return False


def _pushable(flt, partition_types: dict) -> bool:
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, IsNotNull, IsNull, LessThan, LessThanOrEqual, Not)
    if isinstance(flt, Not):
        # NOT of a null-rejecting comparison differs from ours on nulls only: keep exact
        return isinstance(flt.child, (EqualNullSafe, IsNull, IsNotNull)) and \
            _pushable(flt.child, partition_types)
    if not isinstance(flt, (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan,
                            LessThanOrEqual, In, IsNull, IsNotNull)):
        return False
    if len(flt.attribute) != 1 or flt.attribute[0] not in partition_types:
        return False
    kind = partition_types[flt.attribute[0]]
    literals = list(flt.value) if isinstance(flt, In) else \
        ([] if isinstance(flt, (IsNull, IsNotNull)) else [flt.value])
    ok = (lambda v: isinstance(v, int) and not isinstance(v, bool)) if kind == "long" \
        else (lambda v: isinstance(v, str))
    return all(v is None or ok(v) for v in literals)


# --------------------------------------------------------------------------- reader

class LeaseFSReader(DataSourceReader):
    """Plans splits on the driver; reads one split per task into Arrow batches."""

    def __init__(self, source: "LeaseFSDataSource", schema):
        self.options = dict(source.options)
        self.fmt = source.fmt
        self.meta = source.location_meta
        self.schema = schema
        self.partition_types = {name: kind for name, kind in source.partition_types().items()}
        self.files = source.files()
        self.filters: list = []
        self.data_filters: list = []     # data-column filters for the reader (pushdown.py)
        self.data_kinds = pushdown.column_kinds(schema, exclude=self.partition_types)

    def partitions(self):
        files = [f for f in self.files
                 if all(_filter_matches(flt, f.partition, self.partition_types)
                        for flt in self.filters)]
        splits = formats.plan_read_splits(client_for(self.meta), files, self.fmt, self.options,
                                          self.data_filters, self.data_kinds)
        return [LeaseFSPartition(s, self.meta) for s in splits]

    def read(self, partition: LeaseFSPartition):
        client = client_for(partition.meta)
        target = formats.arrow_schema(self.schema)
        yield from formats.read_split(client, partition.split, self.fmt, target, self.options,
                                      self.data_filters, self.data_kinds)


class LeaseFSPushdownReader(LeaseFSReader):
    """``LeaseFSReader`` with ``pushFilters``: Spark refuses a reader that implements it
    while ``spark.sql.python.filterPushdown.enabled`` is false, so ``reader()`` hands this
    class out only when pushdown is on (see ``_pushdown_enabled``)."""

    def pushFilters(self, filters):
        data = self.fmt in formats.PUSHDOWN_FORMATS
        for flt in filters:
            if _pushable(flt, self.partition_types):
                self.filters.append(flt)
            elif data and pushdown.pushable(flt, self.data_kinds):
                self.data_filters.append(flt)
            else:
                yield flt


def _pushdown_enabled(options) -> bool:
    """Is Spark's ``spark.sql.python.filterPushdown.enabled`` on for this plan?

    pyspark 4.3 does not tell the data source: with the setting on, its worker
    ``data_source_pushdown_filters.py`` calls ``reader()`` and then ``pushFilters``; with it
    off, ``plan_data_source_read.py`` calls ``reader()`` (its local ``enable_pushdown`` is
    false) and refuses a reader that has ``pushFilters``. So we look at who called us.
    Option ``filterPushdown=false`` opts out; an unknown caller gets no pushdown."""
    if not flag(options, "filterPushdown", True):
        return False
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            break
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        value = frame.f_locals.get("enable_pushdown")
        if isinstance(value, bool):
            return value
        frame = frame.f_back
    return False


# --------------------------------------------------------------------------- writer

@dataclass
class LeaseFSCommitMessage(WriterCommitMessage):
    """What one task attempt staged: the files the driver publishes."""

    attempt: str
    files: list = field(default_factory=list)


def _task_identity() -> tuple[int, str]:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None:
        return 0, "attempt-local"
    return ctx.partitionId(), (f"attempt-{ctx.stageId()}-{ctx.partitionId():05d}-"
                               f"{ctx.attemptNumber()}-{ctx.taskAttemptId()}")


def _write_batches(client, paths, fmt, options, iterator, name_for_partition):
    partition, attempt = _task_identity()
    name = name_for_partition(partition)
    first = None
    for batch in iterator:        # peek: an empty partition writes no file
        if batch.num_rows:
            first = batch
            break
    if first is None:
        return LeaseFSCommitMessage(attempt, [])

    def body(stream):
        writer = formats.FormatWriter(fmt, stream, first.schema, options)
        writer.write(first)
        for batch in iterator:
            if batch.num_rows:
                writer.write(batch)
        writer.close()
        return writer.rows

    staged = protocol.write_task_file(client, paths, attempt, name, body)
    if staged is not None:
        staged.partition = partition
    return LeaseFSCommitMessage(attempt, [staged] if staged else [])


def _begin_job(writer, source: "LeaseFSDataSource", job_id: str) -> None:
    """What every writer (batch or stream) does on the driver first: remember the options,
    format and cluster, name its job's staging paths, and clear stale staging of jobs that
    are over (the cleanup pass of the commit protocol)."""
    writer.options = dict(source.options)
    writer.fmt = source.write_format()
    writer.meta = source.location_meta
    writer.paths = protocol.JobPaths(source.location.path, job_id)
    stale = float(option(writer.options, "staleStagingSeconds", protocol.DEFAULT_STALE_SECONDS))
    protocol.start_job(client_for(writer.meta), writer.paths, stale)


class LeaseFSWriter(DataSourceArrowWriter):
    """Batch write with the commit protocol of ``commit.py``."""

    def __init__(self, source: "LeaseFSDataSource", overwrite: bool):
        _begin_job(self, source, protocol.new_job_id())
        self.overwrite = overwrite

    def write(self, iterator):
        client = client_for(self.meta)
        ext = formats.file_extension(self.fmt, self.options)
        job = self.paths.job
        return _write_batches(client, self.paths, self.fmt, self.options, iterator,
                              lambda p: f"part-{p:05d}-{job}.{ext}")

    def commit(self, messages):
        protocol.commit_job(client_for(self.meta), self.paths, messages, self.overwrite)

    def abort(self, messages):
        protocol.abort_job(client_for(self.meta), self.paths)


# --------------------------------------------------------------------------- streaming

def _file_key(f) -> list:
    return [f.mtime_ns, f.path]


class LeaseFSStreamReader(DataSourceStreamReader):
    """New files in a folder. Offset: ``{"watermark_ns": newest mtime seen, "files": sorted
    paths seen with mtime after the previous watermark minus lookbackSeconds}``; a file is
    new when it is not in that list and not older than the lookback."""

    def __init__(self, source: "LeaseFSDataSource", schema):
        self.options = dict(source.options)
        self.fmt = source.fmt
        self.meta = source.location_meta
        self.path = source.location.path
        self.schema = schema
        self.lookback_ns = int(float(option(self.options, "lookbackSeconds", 600)) * 1e9)
        self.max_files = int(option(self.options, "maxFilesPerTrigger", 0) or 0)

    def _list(self):
        from fs.errors import FileNotFound
        try:
            return list_data_files(client_for(self.meta), self.path,
                                   filters=ListingOptions.of(self.options))
        except FileNotFound:
            return []

    def initialOffset(self):
        return {"watermark_ns": 0, "files": []}

    def _new_files(self, start, files):
        seen = set(start.get("files") or [])
        floor = int(start.get("watermark_ns") or 0) - self.lookback_ns
        new = [f for f in files if f.path not in seen and f.mtime_ns > floor]
        return sorted(new, key=_file_key)

    def latestOffset(self, start=None, limit=None):
        start = start or self.initialOffset()
        files = self._list()
        new = self._new_files(start, files)
        if self.max_files and len(new) > self.max_files:
            new = new[:self.max_files]
        if not new:
            return start
        watermark = max([int(start.get("watermark_ns") or 0)] + [f.mtime_ns for f in new])
        floor = int(start.get("watermark_ns") or 0) - self.lookback_ns
        by_path = {f.path: f for f in files}
        keep = [p for p in start.get("files") or []
                if p in by_path and by_path[p].mtime_ns > floor]
        return {"watermark_ns": watermark, "files": sorted(set(keep) | {f.path for f in new})}

    def partitions(self, start, end):
        added = set(end.get("files") or []) - set(start.get("files") or [])
        files = [f for f in self._list() if f.path in added]
        splits = formats.plan_splits(sorted(files, key=_file_key), self.fmt, self.options)
        return [LeaseFSPartition(s, self.meta) for s in splits]

    def read(self, partition):
        client = client_for(partition.meta)
        target = formats.arrow_schema(self.schema)
        yield from formats.read_split(client, partition.split, self.fmt, target, self.options)

    def commit(self, end):
        pass   # files are never consumed or moved: the checkpointed offset is the state


class LeaseFSStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: per micro-batch files ``part-<batch>-<partition>.<ext>`` published
    once per batch id (``commit.commit_batch``)."""

    def __init__(self, source: "LeaseFSDataSource"):
        _begin_job(self, source, "stream-" + protocol.new_job_id())

    def write(self, iterator):
        client = client_for(self.meta)
        ext = formats.file_extension(self.fmt, self.options)
        return _write_batches(client, self.paths, self.fmt, self.options, iterator,
                              lambda p: f"staged-{p:05d}-{time.time_ns()}.{ext}")

    def commit(self, messages, batchId):
        ext = formats.file_extension(self.fmt, self.options)
        for m in messages or []:
            for f in getattr(m, "files", None) or []:
                f.final_name = f"part-{int(batchId):010d}-{f.partition:05d}.{ext}"
        protocol.commit_batch(client_for(self.meta), self.paths, messages, batchId)

    def abort(self, messages, batchId):
        client = client_for(self.meta)
        for m in messages or []:
            for f in getattr(m, "files", None) or []:
                protocol._delete_quietly(client, posixpath.dirname(f.staged))


# --------------------------------------------------------------------------- data source

class LeaseFSDataSource(DataSource):
    """``spark.read/write.format("leasefs")`` over a leasefs cluster (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "leasefs"

    def __init__(self, options):
        super().__init__(options)
        self._files = None
        self._location = None

    # -- shared planning helpers (driver side)
    @property
    def fmt(self) -> str:
        return formats.read_format(self.options)

    def write_format(self) -> str:
        fmt = self.fmt
        if fmt not in formats.WRITE_FORMATS:
            raise InvalidArgument(f"leasefs data source cannot write format {fmt!r} "
                                  f"(one of {', '.join(formats.WRITE_FORMATS)})")
        return fmt

    @property
    def location(self):
        if self._location is None:
            paths = _paths_option(self.options)
            self._location = parse_location(paths[0], option(self.options, "meta"))
        return self._location

    @property
    def location_meta(self) -> str:
        return self.location.meta

    def files(self):
        if self._files is None:
            client = client_for(self.location_meta)
            files = []
            for text in _paths_option(self.options):
                loc = parse_location(text, option(self.options, "meta"))
                if loc.meta != self.location_meta:
                    raise InvalidArgument(f"leasefs data source: all paths must be on one "
                                          f"cluster ({loc.meta} vs {self.location_meta})")
                files.extend(list_data_files(client, loc.path,
                                             filters=ListingOptions.of(self.options)))
            self._files = files
        return self._files

    def partition_types(self) -> dict[str, str]:
        names: dict[str, list] = {}
        for f in self.files():
            for k, v in f.partition.items():
                names.setdefault(k, []).append(v)
        return {k: _infer_partition_type(v).typeName() for k, v in names.items()}

    def check_options(self, direction: str, *, streaming: bool = False) -> None:
        """Refuse a Spark option this source would otherwise ignore (``options.py``)."""
        fmt = self.write_format() if direction == "write" else self.fmt
        options_check(self.options, fmt, direction, streaming=streaming)

    # -- DataSource API
    def schema(self):
        from pyspark.sql.types import LongType, StringType, StructField, StructType
        # before any file is read; streaming or not is known only at reader(), which
        # checks again without the streaming options for a batch read
        self.check_options("read", streaming=True)
        client = client_for(self.location_meta)
        data = formats.infer_schema(client, self.files(), self.fmt, self.options)
        fields = list(data.fields)
        names = {f.name for f in fields}
        for key, kind in self.partition_types().items():
            if key not in names:
                fields.append(StructField(key, LongType() if kind == "long" else StringType(),
                                          True))
        return StructType(fields)

    def reader(self, schema):
        self.check_options("read")
        if _pushdown_enabled(self.options):
            return LeaseFSPushdownReader(self, schema)
        return LeaseFSReader(self, schema)

    def writer(self, schema, overwrite):
        self.check_options("write")
        return LeaseFSWriter(self, overwrite)

    def streamReader(self, schema):
        self.check_options("read", streaming=True)
        return LeaseFSStreamReader(self, schema)

    def streamWriter(self, schema, overwrite):
        self.check_options("write", streaming=True)
        return LeaseFSStreamWriter(self)
