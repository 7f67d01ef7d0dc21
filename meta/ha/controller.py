"""Metadata high availability (ha = etcd): the controller of one metadata server's role.

Why it exists: one metadata server is a single point of failure. With ``ha = etcd`` every
metadata server of a namespace runs this controller over the replicated edit log
(``meta/ha/log.py``): one is ACTIVE and appends every journal batch to the log, fenced by its
epoch; the STANDBYs and OBSERVERs follow the log and apply every entry through the same
journal apply as the active (``Journal.ingest`` → ``MetaServer._apply`` → ``meta.journal.ops``), so
their namespace, blocks map and leases are the active's. Roles and their moves are the
table in ``meta/ha/transitions.py``; this module does the I/O.

Algorithm
---------
Start (after the server replayed its own journal):

1. Install ``_replicate`` as the journal's replicator and refuse journal records
   (``StandbyError``): a follower never writes one itself. Records are at most one log
   entry (``halog.MAX_PAYLOAD`` less the envelope).
2. Read the log from ``last_txid + 1`` and ingest every entry; then follow it (etcd
   watch) for good.
3. A standby campaigns for the leader key at the same time (an observer never does). The
   campaign blocks while another server holds the key.

Take-over (the campaign won, epoch = the key's create revision):

4. Stop following, then read the log to its end and ingest it: no other server can
   append any more (its appends compare the epoch), so this is everything that was ever
   acknowledged.
5. Accept journal records again (each batch goes through ``_replicate``) and activate
   the server (``MetaServer.activate``): format a new namespace, renew every lease
   (holders get a full soft limit from now, as HDFS renews all leases on becoming active),
   start the active-only monitors, hold deletions until fresh block reports.

A batch (``_replicate``), on the journal's syncer under its lock (under load the syncer
first lets it grow for a moment, ``APPEND_GATHER``):

6. Cut the batch into entries of at most ``MAX_PAYLOAD`` at record boundaries; each entry
   is ``ENVELOPE`` (magic, the active's wall clock at the append: followers measure their
   lag with it) + the framed records exactly as the journal writes them.
7. Append each entry with the term (one etcd txn: the leader key still has our epoch AND
   the entry's txid is new). It returns once a quorum of etcd members has it: only then is
   the batch written locally, applied and acknowledged. ``Unavailable`` (no answer, the
   outcome unknown) is retried with the same bytes (``decide`` recognises our own earlier
   try); ``Fenced`` or ``DuplicateTxid`` end the term.

End of a term (the leader key's lease expired or was lost, an append was fenced, the
server can no longer vouch for its lease — self-fencing, on its own clock, so that a
partitioned active steps down before a successor can win — or ``resign`` for ``haadmin
-failover``):

8. Refuse new records and wait until no batch is in flight (``Journal.quiesce``; a
   self-fencing server abandons its append rather than wait for etcd); the waiting
   callers get ``StandbyError`` and move to the next server.
9. ``resign``: delete the leader key (the standby's campaign, watching it, wins at once); the
   resigning server does not campaign again until another server holds the key (at most
   an election timeout).
10. Raise ``Deposed`` out of the server: ``run_meta_server`` closes the store and journal
    and starts the server again on the same ports; it replays its journal and follows the
    log as a standby. A deposed active never serves again from the memory it had: a
    request it had planned when the term ended may have left traces there.

A follower behind the log (the entries after its applied txid were purged):

11. Reading or following the log, the next entry starts after ``last_txid + 1``: raise
    ``BehindLog`` out of the server; ``run_meta_server`` closes the store and journal,
    installs another server's image (``meta/ha/bootstrap.py``) and starts the server again,
    which then follows the log from the image's txid + 1.

Concurrency contract: every method runs on the server's trio thread. ``_replicate`` is
called only by the journal's syncer (one batch at a time, under the journal's sync lock);
``_ingest`` only by the follower task or the take-over, never concurrently with a batch of
the server's own (a follower's journal refuses records). ``role``, ``term`` and ``epoch``
change only through ``_move``, on the trio thread, before any await that follows.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections import deque

import trio

from fs.backoff import Backoff
from fs.errors import StandbyError
from fs.hastatus import HAStatus, Role

from .transitions import RoleEvent, next_role
from .bootstrap import BehindLog, behind
from .log import (MAX_PAYLOAD, DuplicateTxid, Fenced, HALog, Term, Unavailable)
from ..journal.files import RECORD_HEADER, decode_batch

log = logging.getLogger(__name__)

#: a log entry: magic, the active's wall clock (ns) when it appended, then framed records
ENVELOPE = struct.Struct(">4sQ")
MAGIC = b"LFSB"
#: the largest journal record a replicated server takes (one log entry)
MAX_RECORD = MAX_PAYLOAD - ENVELOPE.size - RECORD_HEADER.size
#: lag samples kept for the status and /metrics (the newest)
LAG_SAMPLES = 4096
#: the wait between two tries of an append whose outcome etcd left unknown (0.1 to 0.2 s)
APPEND_RETRY = Backoff(first=0.2, factor=1, cap=0.2, jitter=0.5)
#: the wait between two tries of an etcd call while etcd has no quorum (0.25 to 0.5 s: the
#: servers that lost etcd together do not all come back to it at the same instant)
ETCD_RETRY = Backoff(first=0.5, factor=1, cap=0.5, jitter=0.5)
#: seconds a server that gave its term away waits for another to take it before it may
#: campaign again itself (a campaigning standby, watching the leader key, wins at once)
CEDE_GRACE = 0.5
#: the share of the election timeout before its lease's sure end at which an active stops
#: answering clients (``sure_of_term``)
LEASE_MARGIN = 0.2
#: how long a batch may wait to grow, as a share of the previous append's duration
#: (``Journal.gather``): an append costs etcd ~1.2 ms of CPU over its 3 members whatever
#: its size, and each batch costs both servers a request and a store write; fewer, fuller
#: appends leave more CPU for the work itself (measured with ``bench meta --ha``)
APPEND_GATHER = 1.0


class Deposed(Exception):
    """The server's term ended (or it resigned): it must start again as a follower, and
    not campaign for ``cede`` seconds (HDFS ZKFC cedeActive: after a graceful failover the
    other server must win, not the one that just gave the term away)."""

    def __init__(self, why: str, cede: float = 0.0):
        super().__init__(why)
        self.cede = cede


# ------------------------------------------------------------------------ entries (pure)
def pack_entry(chunks: list[bytes], wall_ns: int) -> bytes:
    return ENVELOPE.pack(MAGIC, wall_ns) + b"".join(chunks)


def unpack_entry(payload: bytes) -> tuple[int, bytes]:
    """(the active's wall clock in ns at the append, framed records)."""
    if len(payload) < ENVELOPE.size:
        raise ValueError(f"log entry of {len(payload)} bytes is shorter than its envelope")
    magic, wall_ns = ENVELOPE.unpack_from(payload)
    if magic != MAGIC:
        raise ValueError(f"log entry starts with {magic!r}, not {MAGIC!r}")
    return wall_ns, payload[ENVELOPE.size:]


def group_chunks(first_txid: int, chunks: list[bytes],
                 limit: int = MAX_PAYLOAD - ENVELOPE.size) -> list[tuple[int, list[bytes]]]:
    """``(first txid, chunks)`` of each entry a batch becomes: consecutive records, at most
    ``limit`` bytes each (a record is never split: the journal refuses larger ones)."""
    groups: list[tuple[int, list[bytes]]] = []
    current: list[bytes] = []
    size = 0
    txid = start = first_txid
    for chunk in chunks:
        if current and size + len(chunk) > limit:
            groups.append((start, current))
            current, size, start = [], 0, txid
        current.append(chunk)
        size += len(chunk)
        txid += 1
    if current:
        groups.append((start, current))
    return groups


# ------------------------------------------------------------------------ the controller
class HAController:
    """The role of one metadata server with ``ha = etcd``; see the module docstring."""

    def __init__(self, server, halog: HALog, node_id: str, *, observer: bool = False,
                 cede: float = 0.0, wall_ns=time.time_ns):
        self.server = server
        self.log = halog
        self.node_id = node_id
        self.observer = observer
        self.cede = cede               # seconds to follow before the first campaign
        self.wall_ns = wall_ns
        self.role = Role.INITIALIZING
        self.term: Term | None = None
        self.epoch = 0                 # our term's, or the newest leader's we know of
        self.leader: str | None = None
        self.lag = 0.0                 # seconds the last applied entry took to reach us
        self.lag_samples: deque[float] = deque(maxlen=LAG_SAMPLES)
        self.entries_applied = 0
        self._ended = trio.Event()     # the term is over (fenced, lost, resigned)
        self._end_reason = ""
        self._resigning = False
        # entries appended before this are catch-up, not lag
        self._following_since = wall_ns()
        self._applied = trio.lowlevel.ParkingLot()   # woken after every ingested entry
        self._append_scope = trio.CancelScope()      # the append in flight (``_end``)
        # wall clock (ns) when this server won its term and when it began serving as active:
        # ``leasefs bench ha`` splits a failover at them (0: not in this process's life)
        self.elected_ns = 0
        self.active_ns = 0

    # ------------------------------------------------------------------ state
    def _move(self, event: RoleEvent) -> None:
        before = self.role
        self.role = next_role(before, event)
        if self.role is not before:
            log.info("metadata server %s: %s -> %s (%s)", self.node_id, before.value,
                     self.role.value, event.value)

    def status(self) -> HAStatus:
        return HAStatus(role=self.role, epoch=self.epoch,
                        applied_txid=self.server.ns.view.applied_txid,
                        lag=0.0 if self.role is Role.ACTIVE else self.lag,
                        node_id=self.node_id, mode="etcd")

    def lag_stats(self) -> dict:
        """Count, p50, p99 and max (seconds) of the recent lag samples."""
        samples = sorted(self.lag_samples)
        if not samples:
            return {"count": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
        pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
        return {"count": len(samples), "p50": pick(0.5), "p99": pick(0.99),
                "max": samples[-1]}

    def reset_lag_stats(self) -> None:
        """Start a new window of lag samples (``lag_stats``), e.g. for a benchmark."""
        self.lag_samples.clear()

    def sure_of_term(self) -> bool:
        """Whether this active server can vouch that no other holds a newer term: etcd
        surely keeps its lease (``HALog.held_until``) for more than ``LEASE_MARGIN`` of
        the election timeout yet (room for clocks that run at slightly different rates).
        An active frozen or cut off from etcd for longer stops answering clients before a
        successor can have been elected, so none of them reads state it no longer owns."""
        term = self.term
        return (term is not None and not self._ended.is_set()
                and trio.current_time() < self._sure_until(term))

    def _sure_until(self, term: Term) -> float:
        """Until when (``trio.current_time()``) this server vouches for ``term``."""
        return self.log.held_until(term) - LEASE_MARGIN * self.log.ttl

    def unsure(self) -> str:
        """What a client is told while ``sure_of_term`` is false."""
        held = self.log.held_until(self.term) if self.term is not None else -math.inf
        why = (f"etcd has not confirmed its lease for "
               f"{trio.current_time() - (held - self.log.ttl):.1f} s"
               if held != -math.inf else "it holds no etcd lease")
        return (f"metadata server {self.node_id} cannot vouch that it is still the active "
                f"one ({why}); another server may have taken over")

    def refusal(self) -> str:
        """What a call this server does not serve in its role is told."""
        leader = f"; the active is {self.leader}" if self.leader else ""
        return f"metadata server {self.node_id} is {self.role.value}{leader}"

    # ------------------------------------------------------------------ life
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Follow, campaign, take over, serve the term; raises ``Deposed`` when it ends."""
        journal = self.server.journal
        journal.max_record = min(journal.max_record, MAX_RECORD)
        journal.replicator = self._replicate
        journal.gather = APPEND_GATHER
        self._move(RoleEvent.START_OBSERVER if self.observer else RoleEvent.START_STANDBY)
        journal.refusal = self.refusal()
        await self._until_done("reading the replicated log", self._read_to_end)
        task_status.started()
        if self.observer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_leader)
                await self._until_done("following the replicated log", self._follow)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_done, "following the replicated log", self._follow)
            nursery.start_soon(self._watch_leader)
            await self._cede()
            term = await self._until_done("campaigning", self.log.campaign, self.node_id)
            nursery.cancel_scope.cancel()
        await self._take_over(term)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_lease, term)
            nursery.start_soon(self._fence_when_unsure, term)
            nursery.start_soon(self.server.monitors.run_active_services)
            await self._ended.wait()
            nursery.cancel_scope.cancel()
        await self._step_down()

    async def _until_done(self, what: str, fn, *args):
        """``await fn(*args)``, again while etcd has no quorum or cannot be reached
        (``Unavailable``): a metadata server outlives an etcd outage and goes on where it
        was. Logged once per outage."""
        down_since = None
        while True:
            try:
                result = await fn(*args)
            except Unavailable as exc:
                if down_since is None:
                    down_since = trio.current_time()
                    log.warning("metadata server %s: %s: %s; trying again until etcd answers",
                                self.node_id, what, exc)
                await ETCD_RETRY.sleep(0)
                continue
            if down_since is not None:
                log.info("metadata server %s: %s: etcd answers again after %.1f s",
                         self.node_id, what, trio.current_time() - down_since)
            return result

    async def _cede(self) -> None:
        """After giving a term away: no campaign until another server holds the leader key,
        or nobody has held it for ``CEDE_GRACE`` s (the other servers are ceding too, having
        just handed the term back, or are down), or ``cede`` s passed. Asked at the
        campaign's poll rate (a standby that campaigns wins as soon as the key is gone)."""
        absent_since = None
        with trio.move_on_after(self.cede):
            while self.cede > 0:
                try:
                    found = await self.log.leader()
                except Unavailable:
                    absent_since = None     # not known to be absent
                else:
                    self._note_leader(found)
                    if found is not None and found[1] != self.node_id:
                        return
                    now = trio.current_time()
                    absent_since = (absent_since or now) if found is None else None
                    if absent_since is not None and now - absent_since >= CEDE_GRACE:
                        return
                await trio.sleep(self.log.poll)

    async def _read_to_end(self) -> None:
        for entry in await self.log.read(self.server.journal.last_txid + 1):
            await self._ingest(entry)

    async def _follow(self) -> None:
        async for entry in self.log.tail(self.server.journal.last_txid + 1):
            await self._ingest(entry)

    async def _watch_leader(self) -> None:
        """Keep ``leader``/``epoch`` current for refusals and the status (a hint only)."""
        while True:
            try:
                self._note_leader(await self.log.leader())
            except Unavailable:
                pass
            await trio.sleep(max(0.2, self.log.ttl / 3))

    def _note_leader(self, found: tuple[int, str] | None) -> None:
        if found is not None:
            self.epoch, self.leader = max(self.epoch, found[0]), found[1]

    async def _ingest(self, entry) -> None:
        journal = self.server.journal
        wall_ns, data = unpack_entry(entry.payload)
        records = decode_batch(data, journal.max_record)
        if not records or records[-1].txid <= journal.last_txid:
            return   # already here (a read and the watch both delivered it)
        gap = behind(journal.last_txid, records[0].txid)
        if gap is not None and self.term is None:
            # the entries in between were purged: only another server's image bridges it
            raise BehindLog(gap)
        await journal.ingest(records, data)
        self.server.reports.retry_pending()
        self._applied.unpark_all()
        self.entries_applied += 1
        if wall_ns >= self._following_since:
            self.lag = max(0.0, (self.wall_ns() - wall_ns) / 1e9)
            self.lag_samples.append(self.lag)

    async def wait_applied(self, txid: int, timeout: float) -> None:
        """An observer's read waits until this server has applied ``txid`` (the client's
        state id); ``StandbyError`` after ``timeout`` s: the client asks the active."""
        with trio.move_on_after(timeout):
            while self.server.ns.view.applied_txid < txid:
                await self._applied.park()
            return
        raise StandbyError(f"{self.refusal()}: it has applied txid "
                           f"{self.server.ns.view.applied_txid}, the call needs {txid}")

    def takeover_times(self) -> dict:
        """Wall clock (seconds) of this server's last election win and of when it began
        to serve as active after it (absent: not while this process ran)."""
        return {key: ns / 1e9 for key, ns in (("elected_at", self.elected_ns),
                                               ("active_at", self.active_ns)) if ns}

    async def _take_over(self, term: Term) -> None:
        self.elected_ns = self.wall_ns()
        self.term, self.epoch, self.leader = term, term.epoch, self.node_id
        self._move(RoleEvent.ELECTED)
        await self._until_done("reading the replicated log to its end", self._read_to_end)
        self.server.journal.refusal = None
        self._move(RoleEvent.CAUGHT_UP)
        log.info("metadata server %s is active with epoch %d from txid %d", self.node_id,
                 term.epoch, self.server.journal.last_txid)
        await self.server.activate()
        self.active_ns = self.wall_ns()

    async def _watch_lease(self, term: Term) -> None:
        await self.log.lost(term).wait()
        self._end(f"metadata server {self.node_id} lost its term (epoch {term.epoch}): its "
                  f"etcd lease expired", RoleEvent.DEPOSED)

    async def _fence_when_unsure(self, term: Term) -> None:
        """Self-fencing: once this server can no longer vouch for its term
        (``sure_of_term``: etcd may let its lease lapse soon, and then another server may
        win), it ends the term itself, without waiting for an answer from etcd, which a
        partitioned server never gets. The append in flight is abandoned (its callers
        get ``StandbyError``; its outcome is unknown, as after any ``Unavailable``), the
        server starts again as a standby and no longer keeps the lease alive."""
        while not self._ended.is_set():
            await trio.sleep_until(self._sure_until(term))
            if not self.sure_of_term():
                self._end(f"metadata server {self.node_id} gave up its term (epoch "
                          f"{term.epoch}): {self.unsure()}", RoleEvent.DEPOSED, abort=True)

    def _end(self, why: str, event: RoleEvent, abort: bool = False) -> None:
        """The term is over; ``abort``: abandon the append in flight rather than wait for
        etcd's answer (which a cut-off server may never get)."""
        if self._ended.is_set():
            return
        self._end_reason = why
        self.server.journal.refusal = why
        self._move(event)
        self._ended.set()
        if abort:
            self._append_scope.cancel()

    async def _step_down(self) -> None:
        why = self._end_reason
        log.warning("%s; starting again as a standby", why)
        await self.server.journal.quiesce(why)
        if self._resigning and self.term is not None:
            with trio.move_on_after(self.log.op_timeout):
                await self.log.resign(self.term)
        self.term = None
        raise Deposed(why, cede=self.log.ttl if self._resigning else 0.0)

    async def resign(self) -> dict:
        """``haadmin -failover``: give the term away now (the standby's campaign, watching
        the leader key, wins at once); this server then starts again as a standby."""
        if self.role is not Role.ACTIVE or self.term is None:
            raise StandbyError(self.refusal())
        epoch = self.term.epoch
        self._resigning = True
        self._end(f"metadata server {self.node_id} resigned epoch {epoch} (failover)",
                  RoleEvent.RESIGN)
        return {"resigned": self.node_id, "epoch": epoch}

    async def after_checkpoint(self, txid: int) -> None:
        """The active checkpointed at ``txid``: entries more than ``ha_log_retain`` txids
        older leave the log (a follower that is further behind than that installs another
        server's image at its next read, ``meta/ha/bootstrap.py``: its own journal cannot
        bridge the gap)."""
        term = self.term
        below = txid - self.server.config.ha_log_retain
        if term is None or self.role is not Role.ACTIVE or below <= 1:
            return
        try:
            deleted = await self.log.purge(term, below)
        except (Fenced, Unavailable) as exc:
            log.warning("purging the replicated log below txid %d: %s", below, exc)
            return
        if deleted:
            log.info("purged %d entries below txid %d from the replicated log", deleted, below)

    # ------------------------------------------------------------------ the writer
    async def _replicate(self, records, chunks) -> None:
        term = self.term
        if term is None or self.role is not Role.ACTIVE or self._ended.is_set():
            raise StandbyError(self.refusal() if not self._end_reason else self._end_reason)
        for first, group in group_chunks(records[0].txid, chunks):
            payload = pack_entry(group, self.wall_ns())
            retried = False
            while True:
                try:
                    with trio.CancelScope() as self._append_scope:
                        await self.log.append(term, first, payload, retried=retried)
                    if self._append_scope.cancelled_caught:   # ``_end(abort=True)``
                        raise StandbyError(self._end_reason)
                    break
                except (Fenced, DuplicateTxid) as exc:
                    why = f"metadata server {self.node_id} was fenced: {exc}"
                    self._end(why, RoleEvent.DEPOSED)
                    raise StandbyError(why) from None
                except Unavailable as exc:
                    if self._ended.is_set():
                        raise StandbyError(self._end_reason) from None
                    log.warning("appending txid %d to the replicated log: %s; trying again",
                                first, exc)
                    retried = True
                    await APPEND_RETRY.sleep(0)
