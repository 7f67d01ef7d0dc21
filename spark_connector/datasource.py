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
(csv: true lets records span lines and keeps a file in one split; json: false only),
``compression`` / ``codec`` (parquet, orc: ``columnar.codec``; text/csv/json: gzip,
bzip2, deflate, zstd, lz4, snappy — ``compression.py``),
``staleStagingSeconds`` (write: age after which abandoned staging is removed),
``partitionBy`` (write: comma-separated columns → ``k=v`` folders named as Spark names them;
Spark itself refuses ``.partitionBy`` for Python sources), ``partitionOverwriteMode``
(``static``: overwrite replaces the target; ``dynamic``: only the partition folders written),
``maxOpenFiles`` (partitioned write: open files per task, default 32),
``maxRecordsPerFile`` (write: a file is cut at that many rows, as Spark's),
``partitionColumnTypeInference`` (read: false → partition columns are strings),
``basePath`` (read: partition discovery starts there, ``location.list_data_files``),
``maxFilesPerTrigger`` and ``lookbackSeconds`` (streaming source). Any other option Spark's
own source honours for the format is refused before planning (``options.py``).

Filter pushdown: only with ``spark.sql.python.filterPushdown.enabled=true`` does Spark call
``pushFilters``, with the AND-ed conjuncts of the query. Comparisons of partition columns
(``key=value`` folders) with literals of the column's (inferred, ``partitioning.py``) type
are compared with the typed values, prune whole files on the driver and are exact. For
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

import dataclasses
import hashlib
import json
import logging
import sys
import time
from dataclasses import dataclass, field

import pyarrow as pa

from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    DataSourceStreamArrowWriter, DataSourceStreamReader,
                                    InputPartition, WriterCommitMessage)

from fs.errors import InvalidArgument

from . import commit as protocol
from . import formats, pushdown
from . import partitioning as parts
from .partitionwrite import DEFAULT_MAX_OPEN_FILES, PartitionedTaskWriter
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


class LeaseFSPartition(InputPartition):
    """One split of one file (``formats.Split``) as a Spark input partition."""

    def __init__(self, split, meta):
        super().__init__(split.path)
        self.split = split
        self.meta = meta


# --------------------------------------------------------------------------- filters

def _filter_matches(flt, values: dict) -> bool:
    """Does a pushed partition filter keep a file with these typed partition values?"""
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, IsNotNull, IsNull, LessThan, LessThanOrEqual, Not)
    if isinstance(flt, Not):
        return not _filter_matches(flt.child, values)
    value = values.get(flt.attribute[0])
    if isinstance(flt, IsNull):
        return value is None
    if isinstance(flt, IsNotNull):
        return value is not None
    if isinstance(flt, EqualNullSafe):
        return value is None and flt.value is None or \
            value is not None and flt.value is not None and parts.compare(value, flt.value) == 0
    if value is None:
        return False
    if isinstance(flt, In):
        return any(v is not None and parts.compare(value, v) == 0 for v in flt.value)
    order = None if flt.value is None else parts.compare(value, flt.value)
    if order is None:
        return False
    return {EqualTo: order == 0, GreaterThan: order > 0, GreaterThanOrEqual: order >= 0,
            LessThan: order < 0, LessThanOrEqual: order <= 0}.get(type(flt), False)


def _pushable(flt, partition_kinds: dict) -> bool:
    """Can ``flt`` be applied exactly to the typed partition values (``partition_kinds``:
    column → ``partitioning.PartitionType``)? Only literals of the column's own type."""
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, IsNotNull, IsNull, LessThan, LessThanOrEqual, Not)
    if isinstance(flt, Not):
        # NOT of a null-rejecting comparison differs from ours on nulls only: keep exact
        return isinstance(flt.child, (EqualNullSafe, IsNull, IsNotNull)) and \
            _pushable(flt.child, partition_kinds)
    if not isinstance(flt, (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan,
                            LessThanOrEqual, In, IsNull, IsNotNull)):
        return False
    if len(flt.attribute) != 1 or flt.attribute[0] not in partition_kinds:
        return False
    kind = partition_kinds[flt.attribute[0]]
    literals = list(flt.value) if isinstance(flt, In) else \
        ([] if isinstance(flt, (IsNull, IsNotNull)) else [flt.value])
    return all(parts.literal_fits(kind, v) for v in literals)


def _partition_kinds(schema, names) -> dict:
    """The ``PartitionType`` each partition column's values parse as: the type the read
    schema (inferred or the user's) gives it."""
    fields = {f.name: f for f in schema.fields}
    return {n: parts.kind_of(fields[n].dataType) for n in names if n in fields}


def _typed_files(files, kinds: dict) -> list:
    """``files`` with their partition values parsed to the column types."""
    return [dataclasses.replace(f, partition=parts.typed_values(f.partition, kinds))
            if f.partition else f for f in files]


# --------------------------------------------------------------------------- reader

class LeaseFSReader(DataSourceReader):
    """Plans splits on the driver; reads one split per task into Arrow batches."""

    def __init__(self, source: "LeaseFSDataSource", schema):
        self.options = dict(source.options)
        self.fmt = source.fmt
        self.meta = source.location_meta
        self.schema = schema
        self.partition_kinds = _partition_kinds(schema, source.partition_types())
        self.files = _typed_files(source.files(), _partition_kinds(schema, schema.names))
        self.filters: list = []
        self.data_filters: list = []     # data-column filters for the reader (pushdown.py)
        self.data_kinds = pushdown.column_kinds(schema, exclude=self.partition_kinds)

    def partitions(self):
        files = [f for f in self.files
                 if all(_filter_matches(flt, f.partition) for flt in self.filters)]
        splits = formats.plan_read_splits(client_for(self.meta), files, self.fmt, self.options,
                                          self.data_filters, self.data_kinds)
        return [LeaseFSPartition(s, self.meta) for s in splits]

    def read(self, partition: LeaseFSPartition):
        if not isinstance(partition, LeaseFSPartition):
            return      # Spark hands a plain InputPartition when we planned none
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
            if _pushable(flt, self.partition_kinds):
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


def _write_partitioned(client, writer, iterator, name_for):
    """A task of a ``partitionBy`` write (one staged file per partition folder) or of a
    write with ``maxRecordsPerFile`` (files cut at that many rows): ``partitionwrite.py``;
    ``name_for(partition, counter)`` names the files."""
    partition, attempt = _task_identity()
    task = PartitionedTaskWriter(client, writer.paths, attempt, partition, writer.fmt,
                                 writer.options, writer.partition_by,
                                 lambda counter: name_for(partition, counter),
                                 writer.max_open_files, writer.max_records)
    try:
        for batch in iterator:
            if batch.num_rows:
                task.write(batch)
        files = task.close()
    except BaseException:
        task.abort()
        raise
    return LeaseFSCommitMessage(attempt, files)


def _begin_job(writer, source: "LeaseFSDataSource", job_id: str, schema, *,
               streaming: bool = False) -> None:
    """What every writer (batch or stream) does on the driver first: remember the options,
    format, cluster and partition columns, name its job's staging paths, and clear stale
    staging of jobs that are over (the cleanup pass of the commit protocol)."""
    writer.options = dict(source.options)
    writer.fmt = source.write_format()
    writer.meta = source.location_meta
    writer.paths = protocol.JobPaths(source.location.path, job_id)
    writer.partition_by = parts.check_partition_columns(
        parts.parse_partition_by(option(writer.options, "partitionBy")), schema,
        source.location.path)
    writer.max_open_files = int(option(writer.options, "maxOpenFiles", DEFAULT_MAX_OPEN_FILES))
    writer.max_records = _max_records(writer.options, source.location.path)
    writer.ext = formats.file_extension(writer.fmt, writer.options)   # refuses a bad codec
    # files numbered c000, c001...: several per task and folder
    writer.counted = bool(writer.partition_by) or writer.max_records > 0
    stale = float(option(writer.options, "staleStagingSeconds", protocol.DEFAULT_STALE_SECONDS))
    client = client_for(writer.meta)
    if streaming and not _called_from("python_streaming_sink_runner.py"):
        # the query starts (pyspark also builds a writer for every batch commit): what an
        # earlier run of this same query left in its job folder is garbage now
        protocol.abort_job(client, writer.paths)
    protocol.start_job(client, writer.paths, stale, create=not streaming)


def _max_records(options, target: str) -> int:
    """Option ``maxRecordsPerFile`` (Spark's: 0 or less means no limit)."""
    text = str(option(options, "maxRecordsPerFile", 0)).strip()
    try:
        return max(0, int(text))
    except ValueError:
        raise InvalidArgument(f"{target}: maxRecordsPerFile={text!r} is not a whole "
                              f"number") from None


def _called_from(filename: str) -> bool:
    """Is a caller of ours in pyspark's worker module ``filename``?"""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(filename):
            return True
        frame = frame.f_back
    return False


def _overwrite_mode(options, target: str) -> bool:
    """Option ``partitionOverwriteMode``: static (default) → False, dynamic → True."""
    mode = str(option(options, "partitionOverwriteMode", "static")).strip().lower()
    if mode not in ("static", "dynamic"):
        raise InvalidArgument(f"{target}: partitionOverwriteMode={mode!r}: use static or "
                              f"dynamic")
    return mode == "dynamic"


class LeaseFSWriter(DataSourceArrowWriter):
    """Batch write with the commit protocol of ``commit.py``."""

    def __init__(self, source: "LeaseFSDataSource", schema, overwrite: bool):
        self.dynamic = _overwrite_mode(source.options, source.location.path)
        _begin_job(self, source, protocol.new_job_id(), schema)
        self.overwrite = overwrite
        self.dynamic = self.dynamic and bool(self.partition_by)
        self.schema = schema

    def _name(self, partition: int, counter: int = 0) -> str:
        """Spark's file name: ``part-00000-<job uuid>-c000.snappy.parquet``."""
        return f"part-{partition:05d}-{self.paths.job}-c{counter:03d}.{self.ext}"

    def write(self, iterator):
        client = client_for(self.meta)
        if self.counted:
            return _write_partitioned(client, self, iterator, self._name)
        return _write_batches(client, self.paths, self.fmt, self.options, iterator,
                              self._name)

    def commit(self, messages):
        client = client_for(self.meta)
        if not self.partition_by and not any(getattr(m, "files", None) for m in messages or []):
            # no task wrote a row: as Spark, one file that holds the schema (parquet/orc
            # footer, csv header), so the folder reads back with its columns
            messages = list(messages or []) + [self._schema_only_file(client)]
        protocol.commit_job(client, self.paths, messages, self.overwrite,
                            dynamic=self.dynamic)

    def _schema_only_file(self, client) -> LeaseFSCommitMessage:
        target = formats.arrow_schema(self.schema)

        def body(stream):
            writer = formats.FormatWriter(self.fmt, stream, target, self.options)
            writer.write(pa.RecordBatch.from_pylist([], schema=target))
            writer.close()
            return 0

        attempt = "attempt-driver-empty"
        staged = protocol.write_task_file(client, self.paths, attempt, self._name(0), body,
                                          keep_empty=True)
        return LeaseFSCommitMessage(attempt, [staged])

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
        self.base = source.base_path()
        self.schema = schema
        self.lookback_ns = int(float(option(self.options, "lookbackSeconds", 600)) * 1e9)
        self.max_files = int(option(self.options, "maxFilesPerTrigger", 0) or 0)

    def _list(self):
        from fs.errors import FileNotFound
        try:
            return list_data_files(client_for(self.meta), self.path, base_path=self.base,
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
        files = _typed_files([f for f in self._list() if f.path in added],
                             _partition_kinds(self.schema, self.schema.names))
        splits = formats.plan_splits(sorted(files, key=_file_key), self.fmt, self.options)
        return [LeaseFSPartition(s, self.meta) for s in splits]

    def read(self, partition):
        client = client_for(partition.meta)
        target = formats.arrow_schema(self.schema)
        yield from formats.read_split(client, partition.split, self.fmt, target, self.options)

    def commit(self, end):
        pass   # files are never consumed or moved: the checkpointed offset is the state


def _stream_job_id(options) -> str:
    """The sink's job folder name: stable per checkpoint (one query, which Spark never runs
    twice at once), so a restarted query removes what an earlier run of it left; without a
    ``checkpointLocation`` option, a new one per start."""
    checkpoint = option(options, "checkpointLocation")
    if checkpoint:
        return protocol.STREAM_PREFIX + hashlib.sha256(str(checkpoint).encode()).hexdigest()[:24]
    return protocol.STREAM_PREFIX + protocol.new_job_id()


class LeaseFSStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: per micro-batch files ``part-<batch>-<partition>.<ext>`` (with
    ``partitionBy``: ``k=v/part-<batch>-<partition>-c<n>.<ext>``) published once per batch
    id (``commit.commit_batch``); the job folder exists only while a batch is written."""

    def __init__(self, source: "LeaseFSDataSource", schema):
        _begin_job(self, source, _stream_job_id(source.options), schema, streaming=True)

    def write(self, iterator):
        client = client_for(self.meta)
        ext = self.ext
        if self.counted:
            return _write_partitioned(
                client, self, iterator,
                lambda p, c: f"staged-{p:05d}-{time.time_ns()}-c{c:03d}.{ext}")
        return _write_batches(client, self.paths, self.fmt, self.options, iterator,
                              lambda p: f"staged-{p:05d}-{time.time_ns()}.{ext}")

    def commit(self, messages, batchId):
        ext = self.ext
        for m in messages or []:
            for f in getattr(m, "files", None) or []:
                name = f"part-{int(batchId):010d}-{f.partition:05d}"
                if self.counted:
                    name += f"-c{f.counter:03d}"
                if "/" in f.final_name:
                    name = f.final_name.rsplit("/", 1)[0] + "/" + name
                f.final_name = f"{name}.{ext}"
        protocol.commit_batch(client_for(self.meta), self.paths, messages, batchId)

    def abort(self, messages, batchId):
        protocol.end_batch(client_for(self.meta), self.paths)


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
                loc = self._same_cluster(parse_location(text, option(self.options, "meta")))
                files.extend(list_data_files(client, loc.path, base_path=self.base_path(),
                                             filters=ListingOptions.of(self.options)))
            self._files = files
        return self._files

    def base_path(self) -> str | None:
        """Option ``basePath``: where partition discovery starts (``location.py``)."""
        base = option(self.options, "basePath")
        if base is None:
            return None
        return self._same_cluster(parse_location(str(base), option(self.options, "meta"))).path

    def _same_cluster(self, loc):
        if loc.meta != self.location_meta:
            raise InvalidArgument(f"leasefs data source: all paths must be on one "
                                  f"cluster ({loc.meta} vs {self.location_meta})")
        return loc

    def partition_types(self) -> dict:
        """Each partition column's ``partitioning.PartitionType``, inferred over all its
        values as Spark does (option ``partitionColumnTypeInference=false``: strings)."""
        names: dict[str, list] = {}
        for f in self.files():
            for k, v in f.partition.items():
                names.setdefault(k, []).append(v)
        inference = flag(self.options, "partitionColumnTypeInference", True)
        return {k: parts.infer_column(v, inference) for k, v in names.items()}

    def check_options(self, direction: str, *, streaming: bool = False) -> None:
        """Refuse a Spark option this source would otherwise ignore (``options.py``)."""
        fmt = self.write_format() if direction == "write" else self.fmt
        options_check(self.options, fmt, direction, streaming=streaming)

    # -- DataSource API
    def schema(self):
        from pyspark.sql.types import StructField, StructType
        # before any file is read; streaming or not is known only at reader(), which
        # checks again without the streaming options for a batch read
        self.check_options("read", streaming=True)
        client = client_for(self.location_meta)
        data = formats.infer_schema(client, self.files(), self.fmt, self.options)
        fields = list(data.fields)
        names = {f.name for f in fields}
        for key, kind in self.partition_types().items():
            if key not in names:
                fields.append(StructField(key, kind.spark_type(), True))
        return StructType(fields)

    def reader(self, schema):
        self.check_options("read")
        if _pushdown_enabled(self.options):
            return LeaseFSPushdownReader(self, schema)
        return LeaseFSReader(self, schema)

    def writer(self, schema, overwrite):
        self.check_options("write")
        return LeaseFSWriter(self, schema, overwrite)

    def streamReader(self, schema):
        self.check_options("read", streaming=True)
        return LeaseFSStreamReader(self, schema)

    def streamWriter(self, schema, overwrite):
        self.check_options("write", streaming=True)
        return LeaseFSStreamWriter(self, schema)
