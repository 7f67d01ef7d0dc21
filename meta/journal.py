"""The metadata server's edit journal (the HDFS edit log) with group commit.

Why it exists: the namespace lives in LevelDB, whose ordinary writes are not fsynced. A
mutation is acknowledged only once its journal record is on disk; at restart the namespace
replays every record after the txid it had applied, so no acknowledged mutation is lost.

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
chain of their names is still checked); ``check_journal`` reads them and reports corruption
in them as a WARNING, not as a failed check, since a start would go on.

Group commit. ``log()`` encodes the record, takes the next txid, appends it to the pending
batch and waits. One syncer task (``run``) loops: take the whole pending batch, write it and
``os.fsync`` in ONE call to the journal's own worker thread (``_SyncThread``), then
on the trio thread call ``apply(records)`` ONCE with the batch in txid order and wake every
waiter of the batch. Records logged while an fsync runs form the next batch, so N
concurrent ``log()`` calls cost about one fsync (``stats`` counts fsyncs, records, bytes).
``apply`` receives the records exactly as ``replay`` will decode them after a restart.

Instrumentation: ``observer`` (None, or a sync callable set by tests and the status page)
gets ``("queued", txid, txid)`` when a record joins the pending batch and
``("fsync_start"|"fsync_end", first, last)`` around each batch's write+fsync; tests use it
to prove which mutations overlapped an fsync without timing anything.

Concurrency contract:
* ``log``/``roll``/``aclose`` are called from any number of tasks of the server's trio
  thread; ``open``, ``replay``, ``purge``, ``segments`` are sync and run on that thread
  (``open``/``replay`` at startup before ``run``; ``purge`` only unlinks a few files).
* ``apply`` is sync, called only by the syncer on the trio thread, never concurrently with
  itself and never awaited; it must not await (it is what writes the LevelDB batch).
* File writes, fsyncs, renames run in the journal's one worker thread (``_SyncThread``)
  under ``_sync_lock``, so a batch write, a roll and the final flush never overlap.
* A ``log`` caller cancelled while waiting leaves its record in the batch: it is still
  written and applied; the syncer and the other waiters are unaffected.

Write failures: a caller gets an error only for a mutation that is NOT durable, and a
durable mutation is never answered with an error:

* A write/fsync ``OSError`` (disk full, I/O error): the syncer cuts the in-progress segment
  back to its last durable length (``ftruncate`` + ``fsync``). Once that worked, nothing of
  the batch nor of the records queued behind it is on disk: their callers get ``NoSpace``
  (ENOSPC/EDQUOT) or ``InternalError`` naming the segment and the cause, the txid counter
  goes back, and the journal keeps serving (the next ``log`` tries the disk again).
* Fail-stop (HDFS: the NameNode terminates when it cannot write a required journal): when
  the cut fails too (the records' fate is unknown), when ``apply`` raises (the records are
  durable but not applied), or when a roll fails, the journal refuses everything, never
  answers the waiting callers, and ``run`` raises ``JournalError`` so the server stops. A
  restart replays what is durable.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import queue
import re
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgpack
import outcome
import trio

from fs.datatransfer import crc32c
from fs.framing import packb
from fs.errors import InternalError, InvalidArgument, LeaseFSError, NoSpace

from .journal_start import JournalSpan, StartPlan, decide

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
class _Scan:
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

    @property
    def torn_bytes(self) -> int:
        return self.size - self.valid_end


def _scan_segment(directory: str, name: str, first: int, in_progress: bool,
                  tail_may_be_torn: bool, max_record: int,
                  on_record: Callable[[Record], None] | None = None) -> _Scan:
    """Verify every record of one segment; raise ``JournalError`` on corruption."""
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as fh:
            buf = fh.read()
    except OSError as exc:
        raise JournalError(f"journal segment {path}: cannot read: {exc}", file=path) from None
    pos = 0
    expected = first
    torn_reason = ""
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
    return _Scan(name=name, first=first, last=expected - 1, records=expected - first,
                 size=len(buf), valid_end=pos, in_progress=in_progress, torn_reason=torn_reason)


def _list_segments(directory: str) -> list[tuple[str, int, int | None, bool]]:
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


def _verify_directory(directory: str, max_record: int,
                      applied_through: int | None = None) -> list[_Scan]:
    """Scan and verify every segment and the txid chain between them (reads only). A
    finalized segment wholly at or below ``applied_through`` (the store's applied txid) is
    not read: no start replays it (``unread`` scans; ``check_journal`` reads them)."""
    listed = _list_segments(directory)
    in_progress = [item for item in listed if item[2] is None]
    if len(in_progress) > 1 or (in_progress and listed[-1][2] is not None):
        names = ", ".join(item[0] for item in in_progress)
        raise JournalError(f"journal directory {directory}: in-progress segment(s) {names} "
                           f"are not the newest segment", file=os.path.join(directory, in_progress[0][0]),
                           offset=0)
    scans: list[_Scan] = []
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
            scans.append(_Scan(name=name, first=first, last=last, records=0, size=size,
                               valid_end=size, in_progress=False, lost=True))
            continue
        is_inprogress = last is None
        if not is_inprogress and applied_through is not None and last <= applied_through:
            size = os.path.getsize(path)
            scans.append(_Scan(name=name, first=first, last=last, records=last - first + 1,
                               size=size, valid_end=size, in_progress=False, unread=True))
            continue
        if is_inprogress:
            scans.append(_scan_segment(directory, name, first, True, tail_may_be_torn=True,
                                       max_record=max_record))
        else:
            scans.append(_scan_finalized(directory, name, first, last, max_record))
    return scans


def _scan_finalized(directory: str, name: str, first: int, last: int, max_record: int) -> _Scan:
    """Verify a finalized segment, including that it holds exactly the txids its name says."""
    scan = _scan_segment(directory, name, first, False, tail_may_be_torn=False,
                         max_record=max_record)
    if scan.last != last:
        path = os.path.join(directory, name)
        raise JournalError(f"journal segment {path}: name says txids {first}..{last} but it "
                           f"holds {first}..{scan.last} (ends at offset {scan.valid_end})",
                           file=path, offset=scan.valid_end)
    return scan


def _span(scans: list[_Scan]) -> JournalSpan:
    """The txids a verified folder holds, as ``journal_start.decide`` needs them."""
    last = scans[-1].last if scans else 0
    first = scans[0].first if scans else last + 1
    return JournalSpan(first=first, last=last,
                       lost=tuple((s.first, s.last) for s in scans if s.lost))


def _write_lost_marker(directory: str, first: int, last: int, applied: int) -> str:
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
    _fsync_dir(directory)
    return name


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ the journal
class _SyncThread:
    """The journal's own worker thread for batch writes, fsyncs, cut-backs and rolls.

    Why not ``trio.to_thread.run_sync``: it is run once per batch, and its per-call
    machinery (thread cache hand-off, thread renaming, capacity limiter, context copy) cost
    ~75 us of CPU against ~50 us for a queue put and one ``run_sync_soon`` back. One thread
    also runs the jobs in order, which ``_sync_lock`` needed a limiter of 1 for.

    Contract: ``run`` is awaited from the trio thread, one call at a time (the journal's
    ``_sync_lock``); it is not cancellable (neither was ``to_thread.run_sync``: a write in
    progress finishes and its outcome is delivered). ``close`` ends the thread after the
    jobs queued before it."""

    def __init__(self, name: str):
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, fn, *args):
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def deliver(result) -> None:
            trio.lowlevel.reschedule(task, result)

        def job() -> None:
            result = outcome.capture(fn, *args)
            try:
                token.run_sync_soon(deliver, result)
            except trio.RunFinishedError:   # the loop is gone: nobody waits any more
                pass

        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)
        return await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED)

    def _loop(self) -> None:
        # SCHED_BATCH (this thread only, Linux): its wake-up per batch no longer preempts the
        # trio thread, which holds the GIL this thread needs first anyway; measured on 2
        # cores, the trio thread's queue put took 170-540 us of wall time (12 us of CPU),
        # ~65 us after
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except (AttributeError, OSError):
            pass
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None


class _Batch:
    """Records waiting for one write+fsync, and the event their callers wait on."""
    __slots__ = ("records", "chunks", "done", "error")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.chunks: list[bytes] = []
        self.done = trio.Event()
        self.error: tuple[type[LeaseFSError], str] | None = None

    def fail(self, message: str, error: type[LeaseFSError] = InternalError) -> None:
        self.error = (error, message)
        self.done.set()


class Journal:
    """The edit log of one metadata server folder; see the module docstring."""

    def __init__(self, directory: str, apply: Callable[[list[Record]], None], *,
                 keep_segments: int = 10,
                 max_record: int = 64 << 20):
        if keep_segments < 0:
            raise InvalidArgument(f"journal keep_segments must be >= 0, got {keep_segments}")
        self.directory = os.path.abspath(directory)
        self._apply = apply
        self._thread = _SyncThread(f"journal {os.path.basename(self.directory)}")
        self.keep_segments = keep_segments
        self.max_record = max_record
        self.last_txid = 0
        self.stats = JournalStats()
        self.observer: Callable[[str, int, int], None] | None = None
        self._next_txid = 1
        self._opened = False
        self._closing = False
        self._failure: str | None = None   # set by _stop: the server must stop (module docstring)
        self._fd: int | None = None
        self._inprogress_first = 1
        self._inprogress_size = 0
        self._finalized: list[SegmentInfo] = []
        self._pending = _Batch()
        self._sync_lock = trio.Lock()
        self._wakeup = trio.lowlevel.ParkingLot()

    # ------------------------------------------------------------------ startup (sync)
    def open(self, store_applied: int | None = None) -> StartPlan:
        """Scan and verify the folder, judge it against the namespace store's applied txid
        (``journal_start.decide``; None = not known), cut a torn tail, finalize the recovered
        in-progress segment, bridge a lost tail, open a new segment. Returns the plan.
        Raises ``JournalError`` (nothing modified) on corruption or a refused start; the
        caller must have made the store durable when it passes ``store_applied``."""
        if self._opened:
            raise InternalError(f"journal {self.directory} is already open")
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"journal directory {self.directory}: {exc}",
                               file=self.directory) from None
        # what the store has applied is never replayed: verifying it would only cost time
        scans = _verify_directory(self.directory, self.max_record, store_applied)
        plan = decide(_span(scans), store_applied)
        if plan.refusal is not None:
            raise JournalError(f"journal {self.directory}: {plan.refusal}", file=self.directory)
        reuse_empty: _Scan | None = None
        try:
            if scans and scans[-1].in_progress:
                scan = scans[-1]
                path = os.path.join(self.directory, scan.name)
                if scan.torn_bytes:
                    log.warning("journal %s: cutting torn tail at offset %d: %d bytes (%s)",
                                path, scan.valid_end, scan.torn_bytes, scan.torn_reason)
                    with open(path, "r+b") as fh:
                        fh.truncate(scan.valid_end)
                        fh.flush()
                        os.fsync(fh.fileno())
                    scan.size = scan.valid_end
                if scan.records:
                    final = finalized_name(scan.first, scan.last)
                    os.rename(path, os.path.join(self.directory, final))
                    _fsync_dir(self.directory)
                    log.info("journal %s: finalized recovered segment as %s", path, final)
                    scans[-1] = _Scan(name=final, first=scan.first, last=scan.last,
                                      records=scan.records, size=scan.size,
                                      valid_end=scan.valid_end, in_progress=False)
                else:
                    reuse_empty = scans.pop()
            self._finalized = [SegmentInfo(s.name, s.first, s.last, s.size, False, s.lost)
                               for s in scans]
            if reuse_empty is not None:
                self.last_txid = reuse_empty.first - 1
            else:
                self.last_txid = scans[-1].last if scans else 0
            if plan.bridge is not None:
                self._bridge(plan, reuse_empty)
            self._next_txid = self.last_txid + 1
            self._inprogress_first = self._next_txid
            self._fd = self._open_inprogress(self._inprogress_first)
            self._inprogress_size = 0
        except OSError as exc:
            raise JournalError(f"journal directory {self.directory}: cannot recover: {exc}",
                               file=self.directory) from None
        self._opened = True
        log.info("journal %s opened: %d finalized segments, last txid %d",
                 self.directory, len(self._finalized), self.last_txid)

    def _bridge(self, plan: StartPlan, empty: _Scan | None) -> None:
        """Record the txids the store applied but the journal lost (startup, sync)."""
        first, last = plan.bridge
        if empty is not None:   # its name claims txid first - 1 was the last one written
            os.unlink(os.path.join(self.directory, empty.name))
        name = _write_lost_marker(self.directory, first, last, plan.applied)
        self._finalized.append(SegmentInfo(name, first, last, 0, False, True))
        self.last_txid = last
        log.warning("journal %s: %s (marker %s)", self.directory, plan.lines()[0], name)

    def _open_inprogress(self, first: int) -> int:
        """Open (creating empty) the in-progress segment starting at ``first``; worker or startup."""
        path = os.path.join(self.directory, inprogress_name(first))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.ftruncate(fd, 0)   # only ever called for a segment without records
            _fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @property
    def first_txid(self) -> int:
        """Oldest txid still in the journal (``last_txid + 1`` when it holds none)."""
        return self._finalized[0].first if self._finalized else self._inprogress_first

    def replay(self, after_txid: int) -> Iterator[Record]:
        """Records with txid > after_txid in order (at startup, after open(), before run())."""
        if not self._opened:
            raise InternalError(f"journal {self.directory}: replay before open()")
        if after_txid > self.last_txid:
            raise JournalError(f"journal {self.directory}: the namespace has applied txid "
                               f"{after_txid} but the journal ends at txid {self.last_txid}",
                               file=self.directory)
        if after_txid + 1 < self.first_txid:
            raise JournalError(f"journal {self.directory}: txids {after_txid + 1}.."
                               f"{self.first_txid - 1} are needed but no longer in the journal "
                               f"(oldest segment starts at {self.first_txid})", file=self.directory)
        for seg in self._finalized:
            if seg.lost and seg.last > after_txid:
                raise JournalError(f"journal {self.directory}: txids {max(seg.first, after_txid + 1)}"
                                   f"..{seg.last} are needed but were recorded as lost ({seg.name})",
                                   file=os.path.join(self.directory, seg.name))
        return self._replay(after_txid, list(self._finalized))

    def _replay(self, after_txid: int, segments: list[SegmentInfo]) -> Iterator[Record]:
        for seg in segments:
            if seg.last <= after_txid:   # lost segments past after_txid: refused by replay
                continue
            records: list[Record] = []
            _scan_segment(self.directory, seg.name, seg.first, False, tail_may_be_torn=False,
                          max_record=self.max_record, on_record=records.append)
            for record in records:
                if record.txid > after_txid:
                    yield record

    # ------------------------------------------------------------------ appending
    async def log(self, op: str, args: dict) -> int:
        """Append one record, wait until it is durable AND applied; return its txid."""
        if self._failure is not None:
            raise InternalError(f"journal refuses writes after an earlier failure: {self._failure}")
        if not self._opened or self._closing:
            raise InternalError(f"journal {self.directory} is not open for writing")
        if not isinstance(op, str) or not isinstance(args, dict):
            raise InvalidArgument(f"journal record needs op: str and args: dict, got "
                                  f"{type(op).__name__} and {type(args).__name__}")
        txid = self._next_txid
        try:
            body = packb([txid, op, args])
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"journal record {op}: arguments cannot be encoded: {exc}") from None
        if len(body) > self.max_record:
            raise InvalidArgument(f"journal record {op} is {len(body)} bytes, over the "
                                  f"{self.max_record}-byte limit")
        # what replay will see after a restart (tuples become lists, ...)
        record = Record(txid, op, msgpack.unpackb(body, raw=False, strict_map_key=False)[2])
        self._next_txid = txid + 1
        batch = self._pending
        batch.records.append(record)
        batch.chunks.append(RECORD_HEADER.pack(len(body), crc32c(body)) + body)
        self._wakeup.unpark_all()
        if self.observer is not None:
            self.observer("queued", txid, txid)
        await batch.done.wait()
        if batch.error is not None:
            error, message = batch.error
            raise error(message)
        return txid

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit syncer task; runs in the server's nursery until cancelled."""
        task_status.started()
        while True:
            if self._failure is not None:
                raise JournalError(f"journal {self.directory}: {self._failure}",
                                   file=self.directory)
            if not self._pending.records:
                await self._wakeup.park()
                continue
            await self._flush_once()

    async def _flush_once(self) -> None:
        """Write + fsync the whole pending batch in one worker call, apply it, wake waiters."""
        async with self._sync_lock:
            batch = self._pending
            if not batch.records or self._failure is not None:
                return
            self._pending = _Batch()
            data = b"".join(batch.chunks)
            first, last = batch.records[0].txid, batch.records[-1].txid
            if self.observer is not None:
                self.observer("fsync_start", first, last)
            try:
                await self._thread.run(self._write_and_fsync, data)
            except OSError as exc:
                await self._write_failed(exc, batch)
                return
            # from here to the wake-up there is no checkpoint: durable → applied → acknowledged
            self.stats.fsyncs += 1
            self.stats.records += len(batch.records)
            self.stats.bytes += len(data)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch.records))
            self._inprogress_size += len(data)
            self.last_txid = last
            if self.observer is not None:
                self.observer("fsync_end", first, last)
            try:
                self._apply(batch.records)
            except Exception as exc:
                log.exception("journal: applying txids %d..%d failed", first, last)
                self._stop(f"applying txids {first}..{last} failed after they were made "
                           f"durable ({type(exc).__name__}: {exc}); they replay at the next start")
                return
            batch.done.set()

    def _write_and_fsync(self, data: bytes) -> None:
        """Worker thread: append ``data`` to the in-progress segment and fsync it."""
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    async def _write_failed(self, exc: OSError, batch: _Batch) -> None:
        """Cut the segment back to its durable length, then fail the batch and everything
        queued behind it (nothing of theirs is on disk); fail-stop if the cut fails."""
        first, last = batch.records[0].txid, batch.records[-1].txid
        what = (f"journal write failed ({inprogress_name(self._inprogress_first)}, txids "
                f"{first}..{last}): {exc}")
        try:
            await self._thread.run(self._cut_back, self._inprogress_size)
        except OSError as cut_exc:
            self._stop(f"{what}; cutting the segment back to {self._inprogress_size} bytes "
                       f"failed too ({cut_exc}): whether those records are durable is unknown")
            return
        # synchronous from here on: no log() can slip in between the reset and the failures
        queued, self._pending = self._pending, _Batch()
        self._next_txid = first
        error = NoSpace if exc.errno in (_errno.ENOSPC, _errno.EDQUOT) else InternalError
        message = f"{what}; nothing of it was kept: the mutation did not happen"
        log.error("%s (%d callers failed)", message, len(batch.records) + len(queued.records))
        batch.fail(message, error)
        queued.fail(message, error)

    def _cut_back(self, size: int) -> None:
        """Worker thread: drop whatever a failed write left after ``size`` bytes, durably."""
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)

    def _stop(self, message: str) -> None:
        """Fail-stop: refuse everything, answer no waiting caller, make ``run`` raise."""
        log.critical("%s; the metadata server stops", message)
        self._failure = message
        self._wakeup.unpark_all()

    # ------------------------------------------------------------------ checkpoints
    async def roll(self) -> tuple[int, int]:
        """Finalize the in-progress segment (if non-empty) and start a new one; returns the
        finalized (first, last). An empty segment is not rolled: returns (first, first - 1)."""
        async with self._sync_lock:
            if self._failure is not None:
                raise InternalError(f"journal cannot roll after an earlier failure: {self._failure}")
            if not self._opened or self._fd is None:
                raise InternalError(f"journal {self.directory} is not open")
            first, last = self._inprogress_first, self.last_txid
            if last < first:
                return first, last
            try:
                new_fd = await self._thread.run(self._roll_files, first, last)
            except OSError as exc:
                self._stop(f"journal roll of {inprogress_name(first)} failed: {exc}")
                raise InternalError(self._failure) from None
            self._fd = new_fd
            self._finalized.append(SegmentInfo(finalized_name(first, last), first, last,
                                               self._inprogress_size, False))
            self._inprogress_first = last + 1
            self._inprogress_size = 0
            log.info("journal: rolled segment %s", finalized_name(first, last))
            return first, last

    def _roll_files(self, first: int, last: int) -> int:
        """Worker thread: close, rename to the finalized name, open the next segment."""
        fd, self._fd = self._fd, None
        os.close(fd)
        os.rename(os.path.join(self.directory, inprogress_name(first)),
                  os.path.join(self.directory, finalized_name(first, last)))
        return self._open_inprogress(last + 1)   # also fsyncs the directory (rename + create)

    def purge(self, durable_txid: int) -> list[str]:
        """Delete finalized segments whose last txid <= durable_txid, but always keep the
        newest ``keep_segments`` finalized segments. Returns removed file names."""
        keep_from = max(0, len(self._finalized) - self.keep_segments)
        removed: list[str] = []
        for seg in self._finalized[:keep_from]:
            if seg.last > durable_txid:
                break
            try:
                os.unlink(os.path.join(self.directory, seg.name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("journal: cannot purge %s: %s", seg.name, exc)
                break
            removed.append(seg.name)
        del self._finalized[:len(removed)]
        if removed:
            log.info("journal: purged %d segments up to txid %d", len(removed),
                     durable_txid)
        return removed

    def segments(self) -> list[SegmentInfo]:
        """Finalized segments oldest first, then the in-progress one (no disk I/O)."""
        result = list(self._finalized)
        if self._opened and self._fd is not None:
            result.append(SegmentInfo(inprogress_name(self._inprogress_first),
                                      self._inprogress_first, self.last_txid,
                                      self._inprogress_size, True))
        return result

    async def aclose(self) -> None:
        """Flush and fsync whatever is queued, then close the segment file."""
        if not self._opened or self._closing:
            return
        self._closing = True
        while self._pending.records and self._failure is None:
            await self._flush_once()
        async with self._sync_lock:
            if not self._pending.done.is_set():
                self._pending.fail(self._failure or f"journal {self.directory} closed")
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.close(fd)
                except OSError as exc:
                    log.warning("journal: closing %s: %s", inprogress_name(self._inprogress_first), exc)
            self._thread.close()


# ------------------------------------------------------------------------------ offline check
def check_journal(directory: str, max_record: int = 64 << 20, *,
                  store_applied: int | None = None) -> list[str]:
    """Offline verification for ``leasefs meta --check-journal DIR``: report lines, including
    what a start would do given the namespace store's ``store_applied`` txid (the same
    ``journal_start.decide`` as ``Journal.open``); raises ``JournalError`` (file + offset) on
    corruption or when a start would refuse. Never modifies anything."""
    if not os.path.isdir(directory):
        raise JournalError(f"journal directory {directory}: not a directory", file=directory)
    scans = _verify_directory(directory, max_record, store_applied)
    plan = decide(_span(scans), store_applied)
    if plan.refusal is not None:
        raise JournalError(f"journal {directory}: {plan.refusal}", file=directory)
    lines = [f"journal {directory}: {len(scans)} segment(s)"]
    for i, scan in enumerate(scans):
        if scan.unread:     # a start skips it; the check still reads it, as a warning
            try:
                scans[i] = scan = _scan_finalized(directory, scan.name, scan.first, scan.last,
                                                  max_record)
            except JournalError as exc:
                lines.append(f"  WARNING: {exc}; a start does not read this segment (the "
                             f"namespace store has applied past it), a replay from before "
                             f"txid {scan.last + 1} would fail")
                continue
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
