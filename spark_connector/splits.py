"""How files are cut into tasks: ``Split`` and ``plan_splits``, and the Hadoop
``LineRecordReader`` rule for line-based formats.

Splits follow Hadoop's ``LineRecordReader`` (``line_split_range``): a split ``[start, end)``
owns every line that STARTS in ``(start, end]`` (and the line at 0 for the first split); a
split not at 0 skips to just after the first line break at or after ``start``, and reads past
``end`` to the line break that finishes its last line. So each line is read exactly once
whatever the block boundaries. Compressed files, a custom ``lineSep`` and ``wholetext``
mean one split per file. CSV files are split like text unless ``multiLine=true`` (Spark's
default is false: every line is a record, a quoted line break does not join lines); with
it a csv file is one partition, since a split starting inside a quoted field cannot know
it is inside one.

Concurrency contract: pure functions over a blocking ``fs.Client`` stream; no shared state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .compression import codec_for_path
from .optionvalues import flag, option
from .ranges import READ_CHUNK

SPLITTABLE = ("text", "json", "csv")
SPLIT_SLOP = 1.1              # Hadoop FileInputFormat: the last split may be 10% larger


@dataclass
class Split:
    """One task's share of one file (pickled from the driver to a Python worker)."""

    path: str
    start: int
    end: int                 # exclusive; == length for the last split
    length: int              # the whole file's length
    mtime_ns: int
    partition: dict = field(default_factory=dict)
    #: parquet row groups / ORC stripes this split reads (``columnar.py``); empty: all
    row_groups: tuple = ()


def plan_splits(files, fmt: str, options) -> list[Split]:
    """One split per file; text/json (and csv with ``multiLine=false``) files larger than
    their block size are cut at block boundaries (option ``splitSize`` overrides it)."""
    splittable = fmt in SPLITTABLE and (fmt != "csv" or not flag(options, "multiLine", False))
    # records end at Hadoop's default line breaks only; wholetext is a row per file
    splittable = splittable and option(options, "lineSep") in (None, "\n", "\\n") \
        and not flag(options, "wholetext", False)
    size_option = option(options, "splitSize")
    out = []
    for f in files:
        size = int(size_option) if size_option else f.block_size
        # a compressed stream cannot be entered in the middle (refuses unreadable codecs)
        compressed = fmt in SPLITTABLE and codec_for_path(f.path) is not None
        if not splittable or compressed or size <= 0 or f.length <= size * SPLIT_SLOP:
            out.append(Split(f.path, 0, f.length, f.length, f.mtime_ns, f.partition))
            continue
        start = 0
        while f.length - start > size * SPLIT_SLOP:
            out.append(Split(f.path, start, start + size, f.length, f.mtime_ns, f.partition))
            start += size
        out.append(Split(f.path, start, f.length, f.length, f.mtime_ns, f.partition))
    return out


def _find_newline(stream, pos: int, length: int) -> int:
    """Offset of the first ``\\n`` at or after ``pos`` (``length`` if none)."""
    while pos < length:
        chunk = stream.pread(pos, min(READ_CHUNK // 16, length - pos) or 1)
        if not chunk:
            return length
        i = chunk.find(b"\n")
        if i >= 0:
            return pos + i
        pos += len(chunk)
    return length


def line_split_range(stream, start: int, end: int, length: int) -> tuple[int, int]:
    """``[begin, stop)`` byte range of the whole lines that split ``[start, end)`` owns
    (Hadoop LineRecordReader semantics, see the module docstring)."""
    begin = 0 if start == 0 else _find_newline(stream, start, length) + 1
    if begin > end or begin >= length:
        return begin, begin
    stop = _find_newline(stream, max(end, begin), length)
    return begin, min(length, stop + 1)
