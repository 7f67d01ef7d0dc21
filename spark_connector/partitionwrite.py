"""The task side of a ``partitionBy`` write: one task's Arrow batches split by partition
value into one staged file per ``k1=v1/k2=v2`` folder, with the partition columns left out
of the file data (as Spark's writer does).

Why: the rows of a task arrive unsorted, so a task may see any partition value at any time.
Like Spark's concurrent-writer mode it keeps one open file per folder seen, but at most
``maxOpenFiles`` (default 32) at once: past that the least recently written one is closed,
and a later row of its folder starts a new file (``.c001``, ...). Every file is its own
staged file of the commit protocol (``commit.py``), published by the job commit with the
rest, so how many files a task needed does not matter to readers.

Steps per batch:

1. dictionary-encode each partition column and turn each distinct value into its folder
   text (``partitioning.value_text``: Spark's cast to string, null and ``""`` → the default
   partition);
2. number the distinct folders of the batch and order the rows by folder (stable);
3. hand each folder's slice, without the partition columns, to its open file.

Concurrency contract: one instance per task, used by one thread.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from . import commit as protocol
from . import formats
from .partitioning import partition_dir, value_text

log = logging.getLogger(__name__)

DEFAULT_MAX_OPEN_FILES = 32


def _folder_texts(column) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its value's folder text; and the texts (step 1)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    try:
        encoded = column.dictionary_encode(null_encoding="encode")
        indices = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        values = encoded.dictionary.to_pylist()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        values, lookup, idx = [], {}, []
        for v in column.to_pylist():
            key = (type(v), v)
            if key not in lookup:
                lookup[key] = len(values)
                values.append(v)
            idx.append(lookup[key])
        indices = np.asarray(idx, dtype=np.int64)
    return indices, [value_text(v, column.type) for v in values]


def split_by_folder(batch: pa.RecordBatch, columns: list[str]):
    """``(folder, rows without the partition columns)`` for each partition folder of
    ``batch`` (steps 1-3); no columns: the whole batch in folder ``""``."""
    if not columns:
        yield "", batch
        return
    per_column = [_folder_texts(batch.column(c)) for c in columns]
    codes = np.stack([idx for idx, _ in per_column], axis=1)
    combos, inverse = np.unique(codes, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    folder_of_combo, folder_ids = [], {}
    for combo in combos:
        folder = partition_dir(columns, [per_column[i][1][j] for i, j in enumerate(combo)])
        folder_of_combo.append(folder_ids.setdefault(folder, len(folder_ids)))
    row_folder = np.asarray(folder_of_combo, dtype=np.int64)[inverse]
    order = np.argsort(row_folder, kind="stable")
    bounds = np.searchsorted(row_folder[order], np.arange(len(folder_ids) + 1))
    keep = [i for i, name in enumerate(batch.schema.names) if name not in columns]
    data = batch.select(keep)
    names = list(folder_ids)
    for fid, folder in enumerate(names):
        rows = order[bounds[fid]:bounds[fid + 1]]
        if len(rows):
            yield folder, data.take(pa.array(rows))


class PartitionedTaskWriter:
    """One task attempt's files of a partitioned write (module docstring); with
    ``max_records`` (Spark's ``maxRecordsPerFile``) a file that reaches that many rows is
    closed and the folder's next rows start its next file. With no partition columns it is
    the task's files of a plain write cut at ``max_records``."""

    def __init__(self, client, paths: protocol.JobPaths, attempt: str, partition: int,
                 fmt: str, options, columns: list[str], file_name, max_open: int,
                 max_records: int = 0):
        self.client, self.paths, self.attempt = client, paths, attempt
        self.partition, self.fmt, self.options = partition, fmt, options
        self.columns, self.file_name = columns, file_name      # file_name(counter) -> str
        self.max_open = max(1, max_open)
        self.max_records = max(0, max_records)
        self.open: OrderedDict = OrderedDict()   # folder -> [staged, stream, writer, name]
        self.counters: dict[str, int] = {}
        self.done: list[protocol.StagedFile] = []

    def write(self, batch: pa.RecordBatch) -> None:
        for folder, rows in split_by_folder(batch, self.columns):
            while rows.num_rows:
                entry = self.open.get(folder)
                if entry is None:
                    entry = self._start(folder, rows.schema)
                else:
                    self.open.move_to_end(folder)
                room = (self.max_records - entry[2].rows if self.max_records
                        else rows.num_rows)
                entry[2].write(rows.slice(0, room))
                rows = rows.slice(room)
                if self.max_records and entry[2].rows >= self.max_records:
                    self._finish(folder, self.open.pop(folder))

    def _start(self, folder: str, schema: pa.Schema):
        while len(self.open) >= self.max_open:
            self._finish(*self.open.popitem(last=False))
        counter = self.counters.get(folder, 0)
        self.counters[folder] = counter + 1
        name = f"{folder}/{self.file_name(counter)}" if folder else self.file_name(counter)
        staged, stream = protocol.open_task_file(self.client, self.paths, self.attempt, name)
        try:
            writer = formats.FormatWriter(self.fmt, stream, schema, self.options)
        except BaseException:
            stream.abort()
            raise
        entry = [staged, stream, writer, name, counter]
        self.open[folder] = entry
        return entry

    def _finish(self, folder, entry) -> None:
        staged, stream, writer, name, counter = entry
        writer.close()
        done = protocol.close_task_file(self.client, staged, stream, name, writer.rows)
        if done is not None:
            done.partition, done.counter = self.partition, counter
            self.done.append(done)

    def close(self) -> list[protocol.StagedFile]:
        while self.open:
            self._finish(*self.open.popitem(last=False))
        return self.done

    def abort(self) -> None:
        streams = [entry[1] for entry in self.open.values()]
        self.open.clear()
        protocol.give_up_attempt(self.client, self.paths, self.attempt, streams)
