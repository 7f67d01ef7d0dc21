"""The metadata server's edit journal (the HDFS edit log) with group commit.

Why it exists: the namespace lives in LevelDB, whose ordinary writes are not fsynced. A
mutation is acknowledged only once its journal record is on disk; at restart the namespace
replays every record after the txid it had applied, so no acknowledged mutation is lost.

The file format, the scan that verifies and recovers a folder, and the offline check
(``check_journal``) live in ``meta/journal/files.py``.

Group commit. ``log()`` encodes the record, takes the next txid, appends it to the pending
batch and waits. One syncer task (``run``) loops: take the whole pending batch, write it and
``os.fsync`` in ONE call to the journal's own worker thread (``_SyncThread``), then
on the trio thread call ``apply(records)`` ONCE with the batch in txid order and wake every
waiter of the batch. Records logged while an fsync runs form the next batch, so N
concurrent ``log()`` calls cost about one fsync (``stats`` counts fsyncs, records, bytes).
``apply`` receives the records exactly as ``replay`` will decode them after a restart.
Replicated (ha = etcd), where a batch's cost is mostly per append, the syncer lets a
batch smaller than the previous one grow for a moment first (``_gather``).

Retry-cached calls. A ``log``/``log_many`` made inside one (``fs.retry_cache.current_call``)
adds ``"rpc": [client_id, call_id, method]`` (``meta.journal.ops.RPC_CALL``) to the args of its
last record: whoever applies the record later (a standby from the replicated log, this
server replaying after a restart) notes the call in its retry cache, as an HDFS standby
does with the rpcClientId/rpcCallId of the edits it tails. A call whose answer holds
something the namespace will not keep passes it as ``kept``, added next to it as
``"rpc_kept"`` (``meta.journal.ops.RPC_KEPT``) for a retry's answer.

Written or durable acknowledgement. ``log(..., durable=False)`` (the namespace changes of a
client that asked for local-filesystem semantics, see ``sync_metadata`` in docs/design/metadata.md) returns
once its record is written to the segment (the page cache: a crash of this process loses
nothing) and applied; the fsync follows in the background (``_background_sync``) within
``sync_delay`` (5 ms: writes of that moment share one fsync), so a machine crash loses at
most the records of that moment, as a local filesystem loses metadata not yet committed
(ext4: 5 s). A batch holding any durable record takes the durable path
(write + fsync, then apply), which makes everything written before it durable too.
``durable_txid`` is the last txid known to be on disk (the server hands block deletions to
block servers only up to it); ``sync()`` waits until everything acknowledged so far is
durable.
A lazy batch is written by the trio thread itself (a small append to the page cache, like
the LevelDB batch its apply writes); only the fsync runs in the worker thread.

Instrumentation: ``observer`` (None, or a sync callable set by tests and the status page)
gets ``("queued", first, last)`` when records join the pending batch and
``("fsync_start"|"fsync_end", first, last)`` around each batch's write+fsync; tests use it
to prove which mutations overlapped an fsync without timing anything. ``sync_observer``
(None, or a sync callable set by the server's metrics) gets ``(seconds, records)`` after
each fsync: its duration in the worker thread (with the batch's write on the durable
path) and the records it made durable.

Concurrency contract:
* ``log``/``roll``/``aclose`` are called from any number of tasks of the server's trio
  thread; ``open``, ``replay``, ``purge``, ``segments`` are sync and run on that thread
  (``open``/``replay`` at startup before ``run``; ``purge`` only unlinks a few files).
* ``apply`` is sync, called only by the syncer on the trio thread, never concurrently with
  itself and never awaited; it must not await (it is what writes the LevelDB batch).
* Durable batch writes, fsyncs, renames run in the journal's one worker thread
  (``_SyncThread``) under ``_sync_lock``, so a batch write, a roll and the final flush never
  overlap; a lazy batch is written under ``_sync_lock`` on the trio thread (no await between
  the write and its apply). The background fsync does not take ``_sync_lock`` (a lazy write
  must not wait for it): it runs in the same worker thread as rolls and closes, so it never
  meets a closed descriptor, and a roll fsyncs the segment it finalizes.
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
  durable but not applied), when a roll fails, or when the background fsync of written and
  acknowledged records fails, the journal answers nobody (neither the waiting callers nor
  later ones: their clients retry on a server that took over, or after a restart), and
  ``run`` raises ``JournalError`` so the server stops. A restart replays what is durable.
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import outcome
import trio

from fs.datafolder import FILE_MODE, make_private_folder
from fs.datatransfer import crc32c
from fs.frames import packb
from fs.errors import InternalError, InvalidArgument, LeaseFSError, NoSpace, StandbyError
from fs.retry_cache import current_call

from .files import (RECORD_HEADER, JournalError, JournalStats, Record, Scan, SegmentInfo,
                            finalized_name, fsync_dir, inprogress_name, read_tail,
                            span_of, verify_directory, write_lost_marker)
from .start import StartPlan, decide
from .opbase import RPC_CALL, RPC_KEPT, Op, to_wire

log = logging.getLogger(__name__)

#: replicated: the share of the previous batch a pending batch waits to reach (``_gather``)
GATHER_SHARE = 0.75

# ------------------------------------------------------------------------------ the journal
class _SyncThread:
    """The journal's own worker thread for batch writes, fsyncs, cut-backs and rolls.

    Why not ``trio.to_thread.run_sync``: it is run once per batch, and its per-call
    machinery (thread cache hand-off, thread renaming, capacity limiter, context copy) cost
    ~75 us of CPU against ~50 us for a queue put and one ``run_sync_soon`` back. One thread
    also runs the jobs in order, which ``_sync_lock`` needed a limiter of 1 for.

    Contract: ``run`` is awaited from tasks of the trio thread (the syncer under
    ``_sync_lock``, and the background fsync); jobs run one after the other in the order
    they were queued, each outcome delivered to its own task. It is not cancellable
    (neither was ``to_thread.run_sync``: a write in progress finishes and its outcome is
    delivered). ``close`` ends the thread after the jobs queued before it."""

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
    """Records waiting for one write (+fsync), and the events their callers wait on:
    ``written`` (written and applied) and, for a batch that takes the durable path because
    a caller waits for durability, ``done`` (durable and applied)."""
    __slots__ = ("records", "chunks", "durable", "written", "done", "error")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.chunks: list[bytes] = []
        self.durable = False    # some caller waits for the fsync: the batch takes that path
        self.written = trio.Event()
        self.done = trio.Event()
        self.error: tuple[type[LeaseFSError], str] | None = None

    def fail(self, message: str, error: type[LeaseFSError] = InternalError) -> None:
        self.error = (error, message)
        self.written.set()
        self.done.set()


class Journal:
    """The edit log of one metadata server folder; see the module docstring."""

    def __init__(self, directory: str, apply: Callable[[list[Record]], None], *,
                 keep_segments: int = 10,
                 max_record: int = 64 << 20, sync_delay: float = 0.005):
        if keep_segments < 0:
            raise InvalidArgument(f"journal keep_segments must be >= 0, got {keep_segments}")
        self.directory = os.path.abspath(directory)
        self._apply = apply
        self._thread = _SyncThread(f"journal {os.path.basename(self.directory)}")
        self.keep_segments = keep_segments
        self.max_record = max_record
        self.last_txid = 0       # the last txid written to the segment (and applied)
        self.durable_txid = 0    # the last txid known to be on disk
        self.stats = JournalStats()
        self.observer: Callable[[str, int, int], None] | None = None
        self.sync_observer: Callable[[float, int], None] | None = None
        self._unsynced_wakeup = trio.lowlevel.ParkingLot()
        self._sync_now = trio.lowlevel.ParkingLot()
        self._sync_wanted = False   # a sync() waits: no delay before the next fsync
        self.sync_delay = max(0.0, sync_delay)
        self._durable_wakeup = trio.lowlevel.ParkingLot()
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
        # Replication (ha = etcd, set by ``meta.ha.controller``): ``replicator(records, chunks)`` puts a
        # batch into the replicated log before it is written here; it raises
        # ``StandbyError`` when the term is over (nothing of the batch is in the log).
        # ``refusal``: why ``log`` refuses now (a follower, a server leaving its term).
        self.replicator = None
        self.refusal: str | None = None
        # replicated group commit (``_gather``): how long a batch may wait to grow, as a
        # share of the previous append's duration (0: never); records and seconds of that
        # append
        self.gather = 0.0
        self._appended: tuple[int, float] = (0, 0.0)

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
            make_private_folder(self.directory)
        except OSError as exc:
            raise JournalError(f"journal directory {self.directory}: {exc}",
                               file=self.directory) from None
        # what the store has applied is never replayed: verifying it would only cost time
        scans = verify_directory(self.directory, self.max_record, store_applied)
        plan = decide(span_of(scans), store_applied)
        if plan.refusal is not None:
            raise JournalError(f"journal {self.directory}: {plan.refusal}", file=self.directory)
        reuse_empty: Scan | None = None
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
                    fsync_dir(self.directory)
                    log.info("journal %s: finalized recovered segment as %s", path, final)
                    scans[-1] = Scan(name=final, first=scan.first, last=scan.last,
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
            self.durable_txid = self.last_txid
            self._inprogress_first = self._next_txid
            self._fd = self._open_inprogress(self._inprogress_first)
            self._inprogress_size = 0
        except OSError as exc:
            raise JournalError(f"journal directory {self.directory}: cannot recover: {exc}",
                               file=self.directory) from None
        self._opened = True
        log.info("journal %s opened: %d finalized segments, last txid %d",
                 self.directory, len(self._finalized), self.last_txid)
        return plan

    def _bridge(self, plan: StartPlan, empty: Scan | None) -> None:
        """Record the txids the store applied but the journal lost (startup, sync)."""
        first, last = plan.bridge
        if empty is not None:   # its name claims txid first - 1 was the last one written
            os.unlink(os.path.join(self.directory, empty.name))
        name = write_lost_marker(self.directory, first, last, plan.applied)
        self._finalized.append(SegmentInfo(name, first, last, 0, False, True))
        self.last_txid = last
        log.warning("journal %s: %s (marker %s)", self.directory, plan.lines()[0], name)

    def _open_inprogress(self, first: int) -> int:
        """Open (creating empty) the in-progress segment starting at ``first``; worker or startup."""
        path = os.path.join(self.directory, inprogress_name(first))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        try:
            os.ftruncate(fd, 0)   # only ever called for a segment without records
            fsync_dir(self.directory)
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
            # of a segment the store has partly applied, only the rest is decoded; a bad
            # record refuses the start before any record of its segment is applied
            yield from list(read_tail(self.directory, seg.name, seg.first, seg.last,
                                      max(seg.first, after_txid + 1), self.max_record))

    def recent(self, since: float, limit: int) -> Iterator[Record]:
        """The newest ``limit`` records (at most) of the finalized segments last written at
        wall time ``since`` or later (their files' mtime: records carry no time), newest
        segment first, each segment's in txid order, decoded as the caller takes them
        (startup, after ``open``, on the trio thread: while the journal runs, it reads the
        segments finalized when it began; one a checkpoint purges meanwhile ends it).

        Why: a restarted server notes the retry-cached calls of recent records, applied or
        not (``MetaServer``); the store already holds most of them, so replay does not see
        them. Only what the caller keeps is decoded, one record at a time (none is held
        here): segments are taken newest first, and of the oldest one taken only its
        newest records (``read_tail``), so a start after heavy writes reads about ``limit``
        records, not every record of a big segment. A record that cannot be read ends the
        look back (logged), so what is missed is the oldest: the retry cache is best
        effort, the start must not fail for it."""
        chosen: list[tuple[SegmentInfo, int]] = []   # (segment, first txid wanted)
        count = 0
        for seg in reversed(list(self._finalized)):
            if seg.lost or count >= limit:
                break
            try:
                written = os.stat(os.path.join(self.directory, seg.name)).st_mtime
            except OSError:
                break
            if written < since:
                break
            take = min(seg.last - seg.first + 1, limit - count)
            chosen.append((seg, seg.last - take + 1))
            count += take
        for seg, from_txid in chosen:
            try:
                yield from read_tail(self.directory, seg.name, seg.first, seg.last, from_txid,
                                     self.max_record)
            except JournalError as exc:
                log.warning("journal %s: recent records: %s", self.directory, exc)
                return

    # ------------------------------------------------------------------ appending
    async def log(self, op: Op | str, args: dict | None = None, *, durable: bool = True,
                  kept=None) -> int:
        """Append one record (a typed op, or an op name and its args), wait until it is
        durable (or, with ``durable=False``, written) AND applied; return its txid."""
        record = op if args is None else (op, args)
        return (await self.log_many([record], durable=durable, kept=kept))[0]

    async def log_many(self, records: list[Op | tuple[str, dict]], *,
                       durable: bool = True, kept=None) -> list[int]:
        """Append records (typed ops, whose ``to_wire`` makes the record, or ``(op, args)``
        pairs) to the same batch, in order, and wait until all are
        durable (``durable=False``: written) and applied; their txids. A record that cannot be
        encoded refuses them all before any is queued. ``kept`` (not None): what a retry of
        the retry-cached call running needs of its answer (``meta.services.retry_answers``), written
        next to the call's key; outside such a call nobody can retry, and it is dropped."""
        if self._failure is not None:
            await self._stopped()
        if not self._opened or self._closing:
            raise InternalError(f"journal {self.directory} is not open for writing")
        if self.refusal is not None:
            raise StandbyError(self.refusal)
        encoded = []
        # written on behalf of a retry-cached call: its last record names the call, so a
        # server that applies it (a standby, a restart) knows the call was carried out
        call = current_call()
        tagged = self._next_txid + len(records) - 1 if call is not None else None
        for txid, (op, args) in enumerate(map(to_wire, records), start=self._next_txid):
            if not isinstance(op, str) or not isinstance(args, dict):
                raise InvalidArgument(f"journal record needs op: str and args: dict, got "
                                      f"{type(op).__name__} and {type(args).__name__}")
            if txid == tagged:
                args = {**args, RPC_CALL: call.to_wire()}
                if kept is not None:
                    args[RPC_KEPT] = kept
            try:
                body = packb([txid, op, args])
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidArgument(f"journal record {op}: arguments cannot be encoded: "
                                      f"{exc}") from None
            if len(body) > self.max_record:
                raise InvalidArgument(f"journal record {op} is {len(body)} bytes, over the "
                                      f"{self.max_record}-byte limit")
            # what replay will see after a restart (tuples become lists, ...)
            record = Record(txid, op, msgpack.unpackb(body, raw=False, strict_map_key=False)[2])
            encoded.append((record, RECORD_HEADER.pack(len(body), crc32c(body)) + body))
        first = self._next_txid
        self._next_txid = first + len(encoded)
        batch = self._pending
        for record, chunk in encoded:
            batch.records.append(record)
            batch.chunks.append(chunk)
        batch.durable = batch.durable or durable
        self._wakeup.unpark_all()
        if self.observer is not None:
            self.observer("queued", first, self._next_txid - 1)
        await (batch.done if durable else batch.written).wait()
        if batch.error is not None:
            error, message = batch.error
            raise error(message)
        return list(range(first, first + len(encoded)))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit syncer task (and its background fsync of written records); runs
        in the server's nursery until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._background_sync)
            task_status.started()
            while True:
                if self._failure is not None:
                    raise JournalError(f"journal {self.directory}: {self._failure}",
                                       file=self.directory)
                if not self._pending.records:
                    await self._wakeup.park()
                    continue
                if self.replicator is not None and self.gather > 0:
                    await self._gather()
                await self._flush_once()

    async def _gather(self) -> None:
        """Replicated: an append costs the engine (and both servers) about the same whatever
        its size, so under load wait for the pending batch to grow to ``GATHER_SHARE`` of
        the previous one (its callers are on their way back with their next calls), at most
        ``gather`` times the previous append's duration. A lone caller never waits: after
        a batch of one record there is nothing to wait for."""
        size, seconds = self._appended
        target = int(size * GATHER_SHARE)
        if len(self._pending.records) >= target:
            return
        with trio.move_on_after(self.gather * seconds):
            while len(self._pending.records) < target:
                await self._wakeup.park()

    async def _flush_once(self) -> None:
        """Write the whole pending batch (+ fsync in one worker call when a caller waits for
        durability), apply it, wake its waiters."""
        async with self._sync_lock:
            batch = self._pending
            if not batch.records or self._failure is not None:
                return
            self._pending = _Batch()
            data = b"".join(batch.chunks)
            first, last = batch.records[0].txid, batch.records[-1].txid
            if self.replicator is not None:
                await self._flush_replicated(batch, data)
                return
            if batch.durable:
                if self.observer is not None:
                    self.observer("fsync_start", first, last)
                started = time.perf_counter()
                try:
                    await self._thread.run(self._write_and_fsync, data)
                except OSError as exc:
                    await self._write_failed(exc, batch)
                    return
                self.stats.fsyncs += 1
                if self.sync_observer is not None:
                    # records made durable: this batch and any written lazily before it
                    self.sync_observer(time.perf_counter() - started, last - self.durable_txid)
            else:
                try:
                    self._write(data)
                except OSError as exc:
                    await self._write_failed(exc, batch)
                    return
            # from here to the wake-up there is no checkpoint: written (durable) → applied →
            # acknowledged
            self._count_written(batch.records, data)
            if batch.durable:
                if self.observer is not None:
                    self.observer("fsync_end", first, last)
                self._mark_durable(last)
            if not self._apply_or_stop(batch.records):
                return
            batch.written.set()
            if batch.durable:
                batch.done.set()
            else:   # its callers are answered; the background fsync follows
                self._unsynced_wakeup.unpark_all()

    async def _flush_replicated(self, batch: _Batch, data: bytes) -> None:
        """ha = etcd, under ``_sync_lock``: the batch is durable once the replicated log has
        it (a quorum of etcd members); only then is it written here (no fsync of its own:
        what a crash of this machine loses, the log gives back at restart), applied and
        acknowledged. A refused append leaves nothing anywhere: the batch and everything
        queued behind it fail with ``StandbyError``."""
        first, last = batch.records[0].txid, batch.records[-1].txid
        started = trio.current_time()
        try:
            await self.replicator(batch.records, batch.chunks)
        except StandbyError as exc:
            self._fail_from(first, f"{exc}; the mutation did not happen here (txids "
                                   f"{first}..{last})", StandbyError, batch)
            return
        except Exception as exc:
            log.exception("journal: replicating txids %d..%d failed", first, last)
            self._stop(f"replicating txids {first}..{last} failed ({type(exc).__name__}: "
                       f"{exc}); their fate in the log is unknown")
            return
        self._appended = (len(batch.records), trio.current_time() - started)
        self._take_replicated(batch.records, data)
        batch.written.set()
        batch.done.set()

    def _take_replicated(self, records: list[Record], data: bytes) -> None:
        """Write records the replicated log holds to the segment and apply them (sync: no
        await between the write and the apply)."""
        first, last = records[0].txid, records[-1].txid
        try:
            self._write(data)
        except OSError as exc:
            self._stop(f"journal write of txids {first}..{last} (already in the replicated "
                       f"log) failed: {exc}; a restart takes them from the log")
            return
        self._count_written(records, data)
        self._next_txid = max(self._next_txid, last + 1)
        self._mark_durable(last)
        self._apply_or_stop(records)
        self._unsynced_wakeup.unpark_all()

    def _count_written(self, records: list[Record], data: bytes) -> None:
        """Records just written to the segment: the counters and ``last_txid``."""
        self.stats.records += len(records)
        self.stats.bytes += len(data)
        self.stats.largest_batch = max(self.stats.largest_batch, len(records))
        self._inprogress_size += len(data)
        self.last_txid = records[-1].txid

    def _apply_or_stop(self, records: list[Record]) -> bool:
        """``apply`` written records; a failure stops the journal (they replay at the next
        start). False then."""
        try:
            self._apply(records)
        except Exception as exc:
            first, last = records[0].txid, records[-1].txid
            log.exception("journal: applying txids %d..%d failed", first, last)
            self._stop(f"applying txids {first}..{last} failed after they were "
                       f"written ({type(exc).__name__}: {exc}); they replay at the next start")
            return False
        return True

    def _fail_from(self, first: int, message: str, error: type[LeaseFSError],
                   batch: _Batch | None = None) -> int:
        """Nothing from txid ``first`` on was kept: fail ``batch`` and everything queued
        behind it with ``error(message)`` and hand their txids out again (synchronous: no
        ``log`` slips in between). Returns how many callers failed."""
        queued, self._pending = self._pending, _Batch()
        self._next_txid = first
        failed = len(queued.records) + (len(batch.records) if batch is not None else 0)
        if batch is not None:
            batch.fail(message, error)
        queued.fail(message, error)
        return failed

    async def ingest(self, records: list[Record], data: bytes) -> None:
        """A follower's way in (ha = etcd): write and apply a batch another server put into
        the replicated log; ``data`` is its framed records exactly as that server's journal
        wrote them. They must follow ``last_txid`` without a gap (``JournalError``
        otherwise: the log lost entries this server needs)."""
        async with self._sync_lock:
            if self._failure is not None:
                raise JournalError(f"journal {self.directory}: {self._failure}",
                                   file=self.directory)
            if self._pending.records:
                raise InternalError("journal: a follower has records of its own queued")
            if records[0].txid != self.last_txid + 1:
                raise JournalError(
                    f"journal {self.directory}: the replicated log continues at txid "
                    f"{records[0].txid} but this server has applied up to {self.last_txid} "
                    f"(entries it needs are gone from the log)", file=self.directory)
            self._take_replicated(records, data)
            if self._failure is not None:
                raise JournalError(f"journal {self.directory}: {self._failure}",
                                   file=self.directory)

    async def quiesce(self, why: str) -> None:
        """Refuse new records with ``StandbyError(why)`` and wait until no batch is being
        replicated, written or applied; what is queued fails with the same error."""
        self.refusal = why
        async with self._sync_lock:
            if self._pending.records:
                self._fail_from(self._pending.records[0].txid,
                                f"{why}; the mutation did not happen here", StandbyError)

    def _write(self, data: bytes) -> None:
        """Append ``data`` to the in-progress segment (no fsync)."""
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _write_and_fsync(self, data: bytes) -> None:
        """Worker thread: append ``data`` to the in-progress segment and fsync it."""
        self._write(data)
        os.fsync(self._fd)

    def _fsync_segment(self) -> None:
        """Worker thread: fsync the in-progress segment (nothing to do once closed)."""
        if self._fd is not None:
            os.fsync(self._fd)

    async def _background_sync(self) -> None:
        """Make written (acknowledged) records durable: fsync as soon as there are any, in
        the worker thread. A failure stops the server: those callers were answered."""
        while self._failure is None:
            if self.durable_txid >= self.last_txid:
                await self._unsynced_wakeup.park()
                continue
            # a moment for more writes to share the fsync (a mount's calls come one at a
            # time: an fsync per call cost each ~0.1 ms of both threads); sync() cuts it short
            if not self._sync_wanted:
                with trio.move_on_after(self.sync_delay):
                    await self._sync_now.park()
            self._sync_wanted = False
            target = self.last_txid
            started = time.perf_counter()
            try:
                await self._thread.run(self._fsync_segment)
            except OSError as exc:
                self._stop(f"journal fsync of {inprogress_name(self._inprogress_first)} "
                           f"failed: {exc}; txids up to {target} were acknowledged when "
                           f"written and may not be durable")
                return
            self.stats.fsyncs += 1
            if self.sync_observer is not None and target > self.durable_txid:
                self.sync_observer(time.perf_counter() - started, target - self.durable_txid)
            self._mark_durable(target)

    def _mark_durable(self, txid: int) -> None:
        """Everything up to ``txid`` is on disk: wake the ``sync()`` waiters."""
        if txid <= self.durable_txid:
            return
        self.durable_txid = txid
        self._durable_wakeup.unpark_all()

    async def sync(self) -> int:
        """Wait until every record written so far (everything acknowledged) is durable;
        returns the durable txid."""
        target = self.last_txid
        while self.durable_txid < target:
            if self._failure is not None:
                await self._stopped()
            self._sync_wanted = True
            self._sync_now.unpark_all()
            await self._durable_wakeup.park()
        return self.durable_txid

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
        self._mark_durable(self.last_txid)   # the cut-back's fsync covers what was written
        error = NoSpace if exc.errno in (_errno.ENOSPC, _errno.EDQUOT) else InternalError
        message = f"{what}; nothing of it was kept: the mutation did not happen"
        failed = self._fail_from(first, message, error, batch)
        log.error("%s (%d callers failed)", message, failed)

    def _cut_back(self, size: int) -> None:
        """Worker thread: drop whatever a failed write left after ``size`` bytes, durably."""
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)

    async def _stopped(self) -> None:
        """A caller that comes after a fail-stop waits, unanswered, until the stopping server
        cancels it. An error reply would be final for its client; with no reply the client
        retries where it can (another server that took over, or this one started again)."""
        await trio.sleep_forever()

    def _stop(self, message: str) -> None:
        """Fail-stop: answer nobody (no waiting caller, no later one), make ``run`` raise."""
        log.critical("%s; the metadata server stops", message)
        self._failure = message
        self._wakeup.unpark_all()
        self._durable_wakeup.unpark_all()

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
            self._mark_durable(last)
            self._finalized.append(SegmentInfo(finalized_name(first, last), first, last,
                                               self._inprogress_size, False))
            self._inprogress_first = last + 1
            self._inprogress_size = 0
            log.info("journal: rolled segment %s", finalized_name(first, last))
            return first, last

    def _roll_files(self, first: int, last: int) -> int:
        """Worker thread: fsync (records written without one), close, rename to the finalized
        name, open the next segment."""
        fd, self._fd = self._fd, None
        os.fsync(fd)
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

    def bytes_after(self, txid: int) -> int:
        """Bytes of the segments holding txids after ``txid`` (a segment straddling it
        counts whole; no disk I/O)."""
        return sum(seg.size for seg in self.segments() if seg.last > txid)

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
                try:
                    await self._thread.run(self._close_segment)
                except OSError as exc:
                    log.warning("journal: closing %s: %s", inprogress_name(self._inprogress_first), exc)
                else:
                    self._mark_durable(self.last_txid)
            self._thread.close()

    def _close_segment(self) -> None:
        """Worker thread: fsync (records written without one) and close the segment."""
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
