"""The edit journal's files: record framing, segment names, the scan that verifies a
folder and cuts a torn tail, and the offline check (``leasefs meta --check-journal``).

File format. Every namespace mutation is one record ``[txid, op, args]`` (msgpack,
``use_bin_type``), framed as::

    uint32 length | uint32 crc32c(body) | body          (big-endian, length = len(body) > 0)

Records live in segment files in one folder; txids are consecutive, starting at 1:

* ``edits_inprogress_<first:019d>`` - the segment being appended (at most one, the newest);
* ``edits_<first:019d>-<last:019d>`` - finalized segments (rolled by checkpoints);
* ``edits_lost_<first:019d>-<last:019d>`` - a marker (a few lines of text, no records): these
  txids were lost from the journal while the namespace store had applied them (see below).

An empty in-progress segment still counts: its name says that txid ``first - 1`` was the
last one written, so purging every finalized segment never forgets the txid counter.

Recovery (``open(store_applied)``): a bad record at the END of the in-progress segment
(short header, short body, bad CRC, zero fill) is a torn write from a crash and is cut with
a warning. A
bad record followed by more valid-looking records, any bad record in a finalized segment, a
txid out of sequence, or a gap between segments is corruption: ``JournalError`` naming the
file and byte offset, and nothing is modified. A record whose CRC matches but whose body is
not a record is corruption too (a torn write cannot produce a matching CRC). Then
``journal_start.decide`` judges the journal against the store's applied txid: when the store
has applied txids the journal no longer holds (the disk lost the tail), a lost-txids marker
bridges them and the new segment starts after the store's txid (WARNING naming the txids);
when the store needs records the journal lacks, ``open`` refuses before changing anything.
``check_journal`` runs the same decision, so the offline check and a start agree. A start
does not read finalized segments the store has applied past (they are never replayed; the
chain of their names is still checked), and steps over the applied records of the
in-progress segment by their headers (``_step_over``: what follows them is verified, a torn
tail cut; when the record reached does not verify, the whole segment is). Likewise a replay,
and ``read_tail`` for the retry cache, decode only the records they need of a segment.
``check_journal`` reads everything and reports corruption in what a start skips as a
WARNING, not as a failed check, since a start would go on.

Concurrency contract: plain functions on files, no shared state; the live journal
(``meta/journal/journal.py``) calls them at startup and from its own worker thread.
"""

from __future__ import annotations

import errno as _errno
import logging
import mmap
import os
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import msgpack

from fs.datatransfer import crc32c
from fs.errors import LeaseFSError

from .start import JournalSpan, decide

log = logging.getLogger(__name__)

RECORD_HEADER = struct.Struct(">II")  # length of body, crc32c(body)
INPROGRESS_PREFIX = "edits_inprogress_"
_FINALIZED_RE = re.compile(r"^edits_(\d{19})-(\d{19})$")
_INPROGRESS_RE = re.compile(r"^edits_inprogress_(\d{19})$")
_LOST_RE = re.compile(r"^edits_lost_(\d{19})-(\d{19})$")


def finalized_name(first: int, last: int) -> str:
    return f"edits_{first:019d}-{last:019d}"


def inprogress_name(first: int) -> str:
    return f"{INPROGRESS_PREFIX}{first:019d}"


def lost_name(first: int, last: int) -> str:
    return f"edits_lost_{first:019d}-{last:019d}"


class JournalError(LeaseFSError):
    """The journal is corrupt or inconsistent; ``file`` and ``offset`` say where."""
    errno = _errno.EIO

    def __init__(self, message: str, *, file: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.file = file
        self.offset = offset


@dataclass(frozen=True)
class Record:
    txid: int
    op: str
    args: dict


@dataclass(frozen=True)
class SegmentInfo:
    name: str
    first: int
    last: int          # first - 1 for an empty in-progress segment
    size: int
    in_progress: bool
    lost: bool = False     # a lost-txids marker: no records


@dataclass
class JournalStats:
    fsyncs: int = 0
    records: int = 0
    bytes: int = 0
    largest_batch: int = 0


def encode_record(txid: int, op: str, args: dict) -> bytes:
    """One framed record (header + msgpack body)."""
    body = msgpack.packb([txid, op, args], use_bin_type=True)
    return RECORD_HEADER.pack(len(body), crc32c(body)) + body


def _decode_body(body) -> Record | None:
    """The record in ``body``, or None when it is not ``[txid>0, str, dict]``."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:
        return None
    if (isinstance(obj, list) and len(obj) == 3 and type(obj[0]) is int and obj[0] > 0
            and isinstance(obj[1], str) and isinstance(obj[2], dict)):
        return Record(obj[0], obj[1], obj[2])
    return None


# ------------------------------------------------------------------------------ scanning
class _Bad:
    """Why the bytes at an offset are not a record; ``torn`` = could be a torn write."""
    __slots__ = ("reason", "torn")

    def __init__(self, reason: str, torn: bool = True):
        self.reason = reason
        self.torn = torn


def _parse_at(buf: bytes, pos: int, max_record: int) -> tuple[Record, int] | _Bad:
    size = len(buf)
    if size - pos < RECORD_HEADER.size:
        return _Bad(f"short record header ({size - pos} of {RECORD_HEADER.size} bytes)")
    length, crc = RECORD_HEADER.unpack_from(buf, pos)
    if length == 0:
        return _Bad("zero length (zero fill)")
    if length > max_record:
        return _Bad(f"record length {length} exceeds the {max_record}-byte limit")
    end = pos + RECORD_HEADER.size + length
    if end > size:
        return _Bad(f"short record (body needs {length} bytes, {size - pos - RECORD_HEADER.size} present)")
    body = memoryview(buf)[pos + RECORD_HEADER.size:end]
    if crc32c(body) != crc:
        return _Bad("CRC mismatch")
    record = _decode_body(body)
    if record is None:
        return _Bad("CRC matches but the body is not a journal record", torn=False)
    return record, end


def _step_over(buf, pos: int, count: int) -> int | None:
    """The offset ``count`` records after ``pos``, read from their headers alone (no CRC, no
    decode); None when the headers lead outside ``buf``. Only for records a start needs
    no verdict on (the store applied them); the record reached must then verify with the
    expected txid, which it does not when a header in between was damaged."""
    size = len(buf)
    unpack = RECORD_HEADER.unpack_from
    step = RECORD_HEADER.size
    for _ in range(count):
        if size - pos < step:
            return None
        pos += step + unpack(buf, pos)[0]
    return pos if pos <= size else None


def decode_batch(data: bytes, max_record: int) -> list[Record]:
    """The framed records of ``data`` (a batch as the journal writes it, e.g. an entry of
    the replicated log), each verified; ``JournalError`` at the first bad one."""
    records: list[Record] = []
    pos = 0
    while pos < len(data):
        parsed = _parse_at(data, pos, max_record)
        if isinstance(parsed, _Bad):
            raise JournalError(f"bad record at offset {pos} of a {len(data)}-byte batch: "
                               f"{parsed.reason}")
        record, pos = parsed
        if records and record.txid != records[-1].txid + 1:
            raise JournalError(f"batch txids jump from {records[-1].txid} to {record.txid}")
        records.append(record)
    return records


def _verifies_as(buf, pos: int, max_record: int, txid: int) -> bool:
    parsed = _parse_at(buf, pos, max_record)
    return not isinstance(parsed, _Bad) and parsed[0].txid == txid


def _valid_record_after(buf: bytes, start: int, max_record: int) -> int | None:
    """Offset of the first position >= start where a valid-looking record begins."""
    size = len(buf)
    unpack = RECORD_HEADER.unpack_from
    limit = size - RECORD_HEADER.size
    for pos in range(start, limit + 1):
        length, _crc = unpack(buf, pos)
        if length == 0 or length > max_record or pos + RECORD_HEADER.size + length > size:
            continue
        if not isinstance(_parse_at(buf, pos, max_record), _Bad):
            return pos
    return None


@dataclass
class Scan:
    """Result of verifying one segment file."""
    name: str
    first: int
    last: int              # last txid found (first - 1 when no records)
    records: int
    size: int              # file size on disk
    valid_end: int         # bytes of valid records
    in_progress: bool
    torn_reason: str = ""
    lost: bool = False
    unread: bool = False   # not verified: the store has applied past it
    stepped: int = 0       # leading records not verified (the store applied them)

    @property
    def torn_bytes(self) -> int:
        return self.size - self.valid_end


@contextmanager
def _mapped(path: str):
    """The segment's bytes as a read-only map (b"" when empty): verifying or stepping
    through a 200 MB segment does not make it resident in this process."""
    try:
        with open(path, "rb") as fh:
            buf = (mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                   if os.fstat(fh.fileno()).st_size else b"")
    except OSError as exc:
        raise JournalError(f"journal segment {path}: cannot read: {exc}", file=path) from None
    try:
        yield buf
    finally:
        if buf:
            try:
                buf.close()
            except BufferError:   # a view still refers to it: the collector closes it
                pass


def scan_segment(directory: str, name: str, first: int, in_progress: bool,
                  tail_may_be_torn: bool, max_record: int,
                  on_record: Callable[[Record], None] | None = None,
                  skip_through: int = 0) -> Scan:
    """Verify every record of one segment; raise ``JournalError`` on corruption. Records
    up to txid ``skip_through`` (the store applied them) are stepped over by their headers
    when the record after them verifies; otherwise the whole segment is verified."""
    path = os.path.join(directory, name)
    with _mapped(path) as buf:
        return _scan(path, buf, name, first, in_progress, tail_may_be_torn, max_record,
                     on_record, skip_through)


def _scan(path: str, buf, name: str, first: int, in_progress: bool, tail_may_be_torn: bool,
          max_record: int, on_record: Callable[[Record], None] | None,
          skip_through: int) -> Scan:
    pos = 0
    expected = first
    torn_reason = ""
    if skip_through >= first:
        after = _step_over(buf, 0, skip_through - first + 1)
        if after is not None and (after == len(buf) or _verifies_as(buf, after, max_record,
                                                                    skip_through + 1)):
            pos, expected = after, skip_through + 1
    stepped = expected - first
    while pos < len(buf):
        parsed = _parse_at(buf, pos, max_record)
        if isinstance(parsed, _Bad):
            if not tail_may_be_torn or not parsed.torn:
                raise JournalError(f"journal segment {path}: bad record at offset {pos}: "
                                   f"{parsed.reason}", file=path, offset=pos)
            later = _valid_record_after(buf, pos + 1, max_record)
            if later is not None:
                raise JournalError(
                    f"journal segment {path}: bad record at offset {pos} ({parsed.reason}) "
                    f"followed by a valid record at offset {later}: corruption in the middle",
                    file=path, offset=pos)
            torn_reason = parsed.reason
            break
        record, end = parsed
        if record.txid != expected:
            raise JournalError(f"journal segment {path}: record at offset {pos} has txid "
                               f"{record.txid}, expected {expected}", file=path, offset=pos)
        if on_record is not None:
            on_record(record)
        expected += 1
        pos = end
    return Scan(name=name, first=first, last=expected - 1, records=expected - first,
                 size=len(buf), valid_end=pos, in_progress=in_progress, torn_reason=torn_reason,
                 stepped=stepped)


def read_tail(directory: str, name: str, first: int, last: int, from_txid: int,
              max_record: int) -> Iterator[Record]:
    """Records ``from_txid..last`` of the finalized segment ``name`` (``first..last``), each
    verified as it is reached (lazily: the caller keeps only what it wants of them). The
    records before ``from_txid`` are stepped over by their headers alone (no CRC, no
    decode), through a read-only map of the file: reading the newest thousand records of a
    200 MB segment costs about what they are, not the segment. ``JournalError`` where a
    record is bad (those before it were yielded)."""
    path = os.path.join(directory, name)
    with _mapped(path) as buf:
        size = len(buf)
        pos, txid = _step_over(buf, 0, from_txid - first), from_txid
        if pos is None:
            raise JournalError(f"journal segment {path}: its record headers lead past its "
                               f"end before txid {from_txid}", file=path)
        while pos < size:
            parsed = _parse_at(buf, pos, max_record)
            if isinstance(parsed, _Bad):
                raise JournalError(f"journal segment {path}: bad record at offset {pos}: "
                                   f"{parsed.reason}", file=path, offset=pos)
            record, end = parsed
            if record.txid != txid:
                raise JournalError(f"journal segment {path}: record at offset {pos} has txid "
                                   f"{record.txid}, expected {txid}", file=path, offset=pos)
            yield record
            txid, pos = txid + 1, end
        if txid - 1 != last:
            raise JournalError(f"journal segment {path}: name says txids {first}..{last} but "
                               f"it ends at txid {txid - 1}", file=path, offset=pos)


def list_segments(directory: str) -> list[tuple[str, int, int | None, bool]]:
    """``(name, first, last or None for in-progress, lost marker?)`` sorted by first txid."""
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise JournalError(f"journal directory {directory}: {exc}", file=directory) from None
    found = []
    for name in names:
        m = _FINALIZED_RE.match(name) or _LOST_RE.match(name)
        if m:
            first, last = int(m.group(1)), int(m.group(2))
            if first < 1 or last < first:
                raise JournalError(f"journal segment {os.path.join(directory, name)}: "
                                   f"bad txid range in the name",
                                   file=os.path.join(directory, name), offset=0)
            found.append((name, first, last, m.re is _LOST_RE))
            continue
        m = _INPROGRESS_RE.match(name)
        if m:
            first = int(m.group(1))
            if first < 1:
                raise JournalError(f"journal segment {os.path.join(directory, name)}: "
                                   f"bad first txid in the name",
                                   file=os.path.join(directory, name), offset=0)
            found.append((name, first, None, False))
    found.sort(key=lambda item: (item[1], item[2] is None))
    return found


def verify_directory(directory: str, max_record: int,
                      applied_through: int | None = None) -> list[Scan]:
    """Scan and verify every segment and the txid chain between them (reads only). A
    finalized segment wholly at or below ``applied_through`` (the store's applied txid) is
    not read: no start replays it (``unread`` scans; ``check_journal`` reads them)."""
    listed = list_segments(directory)
    in_progress = [item for item in listed if item[2] is None]
    if len(in_progress) > 1 or (in_progress and listed[-1][2] is not None):
        names = ", ".join(item[0] for item in in_progress)
        raise JournalError(f"journal directory {directory}: in-progress segment(s) {names} "
                           f"are not the newest segment", file=os.path.join(directory, in_progress[0][0]),
                           offset=0)
    scans: list[Scan] = []
    for name, first, last, lost in listed:
        path = os.path.join(directory, name)
        if scans and first != scans[-1].last + 1:
            prev = scans[-1]
            kind = "gap" if first > prev.last + 1 else "overlap"
            raise JournalError(f"journal segment {path} (offset 0) starts at txid {first} but "
                               f"the previous segment {prev.name} ends at txid {prev.last}: txid "
                               f"{kind}", file=path, offset=0)
        if lost:
            size = os.path.getsize(path)
            scans.append(Scan(name=name, first=first, last=last, records=0, size=size,
                               valid_end=size, in_progress=False, lost=True))
            continue
        is_inprogress = last is None
        if not is_inprogress and applied_through is not None and last <= applied_through:
            size = os.path.getsize(path)
            scans.append(Scan(name=name, first=first, last=last, records=last - first + 1,
                               size=size, valid_end=size, in_progress=False, unread=True))
            continue
        if is_inprogress:   # read for its torn tail; what the store applied is stepped over
            scans.append(scan_segment(directory, name, first, True, tail_may_be_torn=True,
                                       max_record=max_record,
                                       skip_through=applied_through or 0))
        else:
            scans.append(scan_finalized(directory, name, first, last, max_record))
    return scans


def scan_finalized(directory: str, name: str, first: int, last: int, max_record: int) -> Scan:
    """Verify a finalized segment, including that it holds exactly the txids its name says."""
    scan = scan_segment(directory, name, first, False, tail_may_be_torn=False,
                         max_record=max_record)
    if scan.last != last:
        path = os.path.join(directory, name)
        raise JournalError(f"journal segment {path}: name says txids {first}..{last} but it "
                           f"holds {first}..{scan.last} (ends at offset {scan.valid_end})",
                           file=path, offset=scan.valid_end)
    return scan


def span_of(scans: list[Scan]) -> JournalSpan:
    """The txids a verified folder holds, as ``journal_start.decide`` needs them."""
    last = scans[-1].last if scans else 0
    first = scans[0].first if scans else last + 1
    return JournalSpan(first=first, last=last,
                       lost=tuple((s.first, s.last) for s in scans if s.lost))


def write_lost_marker(directory: str, first: int, last: int, applied: int) -> str:
    """Create the marker for txids first..last (durably, before any later segment)."""
    name = lost_name(first, last)
    path = os.path.join(directory, name)
    text = (f"txids {first}..{last} were lost from this journal (its tail was cut); the "
            f"namespace store had applied them (applied txid {applied}), so it keeps their "
            f"effects. Replaying from before txid {first} is no longer possible.\n")
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(directory)
    return name


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_journal(directory: str, max_record: int = 64 << 20, *,
                  store_applied: int | None = None) -> list[str]:
    """Offline verification for ``leasefs meta --check-journal DIR``: report lines, including
    what a start would do given the namespace store's ``store_applied`` txid (the same
    ``journal_start.decide`` as ``Journal.open``); raises ``JournalError`` (file + offset) on
    corruption or when a start would refuse. Never modifies anything."""
    if not os.path.isdir(directory):
        raise JournalError(f"journal directory {directory}: not a directory", file=directory)
    scans = verify_directory(directory, max_record, store_applied)
    plan = decide(span_of(scans), store_applied)
    if plan.refusal is not None:
        raise JournalError(f"journal {directory}: {plan.refusal}", file=directory)
    lines = [f"journal {directory}: {len(scans)} segment(s)"]
    for i, scan in enumerate(scans):
        if scan.unread:     # a start skips it; the check still reads it, as a warning
            try:
                scans[i] = scan = scan_finalized(directory, scan.name, scan.first, scan.last,
                                                  max_record)
            except JournalError as exc:
                lines.append(f"  WARNING: {exc}; a start does not read this segment (the "
                             f"namespace store has applied past it), a replay from before "
                             f"txid {scan.last + 1} would fail")
                continue
        if scan.stepped:    # a start steps over the applied records; the check reads them
            try:
                scan_segment(directory, scan.name, scan.first, True, tail_may_be_torn=True,
                             max_record=max_record)
            except JournalError as exc:
                lines.append(f"  WARNING: {exc}; a start does not read txids {scan.first}.."
                             f"{scan.first + scan.stepped - 1} of this segment (the namespace "
                             f"store has applied them), a replay from before txid "
                             f"{scan.first + scan.stepped} would fail")
        if scan.lost:
            lines.append(f"  {scan.name}: txids {scan.first}..{scan.last}: lost from the "
                         f"journal (the namespace store had applied them)")
            continue
        kind = "in progress" if scan.in_progress else "finalized"
        span = f"txids {scan.first}..{scan.last}, {scan.records} records" if scan.records \
            else "no records"
        lines.append(f"  {scan.name}: {kind}, {span}, {scan.size} bytes")
        if scan.torn_bytes:
            lines.append(f"    torn tail at offset {scan.valid_end}: {scan.torn_bytes} bytes "
                         f"({scan.torn_reason}); would be cut at the next start")
    lines += [f"next start: {line}" for line in plan.lines()]
    total = sum(scan.records for scan in scans)
    if total:
        first = next(scan.first for scan in scans if scan.records)
        last = max(scan.last for scan in scans)
        lines.append(f"OK: {total} records, txids {first}..{last}")
    else:
        last = scans[-1].last if scans else 0
        lines.append(f"OK: no records (last txid {last})")
    return lines
