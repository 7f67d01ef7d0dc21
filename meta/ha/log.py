"""The replicated edit log on etcd: leader election, fenced appends, ordered reads.

The engine under metadata high availability (active + standby + observer metadata
servers; ``meta/ha/controller.py`` drives it). etcd (3.4, Debian ``etcd-server``) is the engine.
Every call is one of etcd's native gRPC methods on one ``etcdgrpc.Channel``
(``meta/ha/etcdgrpc.py``), with etcd's messages generated from ``meta/ha/etcdpb/rpc.proto``:
the append's ``KV.Txn`` once per journal batch, the election's txns and ranges, the lease's
grant, keepalive and revoke, the reads' ranges and the followers' ``Watch`` stream (which
etcd ends when its member loses the raft leader). All on trio. See docs/design/ha.md,
"Metadata HA engine".

Keys under ``prefix`` (e.g. ``/leasefs/ns1``)::

    <prefix>/leader                    value: the holder's node id, attached to its lease
    <prefix>/log/<txid, 20 digits>     value: one batch of journal records, first txid = key

Entries below a txid every server has checkpointed past, less a margin, are deleted by the
active (``purge``), so the log does not grow without bound (etcd's quota: 2 GiB).

Algorithm
---------
Campaign (``campaign(node_id)``):

1. Grant a lease of ``ttl`` seconds (the election timeout) and keep it alive from a
   background task every ``ttl/3`` s.
2. One txn: if ``create_revision(<prefix>/leader) == 0`` (no leader) put the leader key
   with our node id, attached to the lease; else read the leader key.
3. If the put happened, the leader key's create revision (the txn's revision) is our
   EPOCH: etcd revisions only grow and each creation of the key gets a new one, so
   epochs are unique per term and increase across terms. Return ``Term(epoch, node_id,
   lease_id)``.
4. If the key exists but carries OUR lease, an earlier try of this txn (retried after a
   timeout or a broken connection) created it: we won, epoch = its create revision.
5. Otherwise watch the leader key from the txn's revision on until etcd reports it
   deleted — resigned, or deleted by etcd when its holder's lease expired — and go to 2
   (also after ``ttl / 3`` s without such news: a failed compare writes nothing, but each
   txn is a raft proposal, so it is not sent every ``poll`` s).
6. A campaign that ends without winning (``timeout``, ``Unavailable``, cancelled) revokes
   its lease, so a txn of it that etcd applied late cannot leave a leader nobody knows of
   kept alive; if the revoke cannot reach etcd the keepalive stops and the lease expires.

Append (``append(term, first_txid, payload)``):

1. Refuse a payload over ``MAX_PAYLOAD`` (etcd refuses requests over 1.5 MiB by default;
   the caller splits its batch) with ``PayloadTooLarge``.
2. ONE txn: compare ``create_revision(<prefix>/leader) == term.epoch`` AND
   ``create_revision(<prefix>/log/<first_txid>) == 0``; on success put the entry; on
   failure read both keys.
3. ``decide`` (pure) maps the txn result to: appended; ``Fenced`` (the leader key is gone
   or has another create revision: a newer term exists or ours expired — the error names
   both epochs); or ``DuplicateTxid``.
4. etcd answers a txn only after raft committed it on a quorum, so a returned append is
   durable on a majority of members. No answer within ``op_timeout`` (no quorum, all
   members down) raises ``Unavailable``: the outcome is then UNKNOWN, and the caller
   reads the entry back before deciding anything. Within ``op_timeout`` each request is
   retried on the next member after a broken connection, an etcd "no leader"/"timed out"
   answer or ``attempt_timeout`` without an answer; a retry may find its own first try's
   entry already there, and ``decide`` accepts that (same epoch, same bytes) as appended.
   A late first try cannot write twice: its put-if-absent compare fails.

Read and tail:

* ``read(from_txid)``: the entries with key txid >= from_txid in txid order (paged ranges
  of ``page`` entries), each as ``Entry(txid, payload, revision)``.
* ``tail(from_txid)``: yields what ``read`` finds, then follows new entries with an etcd
  WATCH (a native gRPC stream, puts only) starting at the revision after that read, so
  nothing is missed between the two; a broken watch (member killed, or its member lost
  the raft leader: the stream asks etcd's require-leader) is replaced by a new read from
  the entry after the last one yielded and a new watch on the next endpoint; a read that
  no member answers within ``op_timeout`` raises ``Unavailable`` out of the iterator. A watch rather than polling: a standby follows the
  active's journal within milliseconds at no cost while idle. Entries are yielded in
  commit order, which is txid order as long as the single writer's appends are sequential
  (below); an entry whose txid is below one already yielded is skipped, so a txid is never
  yielded twice.

``lost(term)`` is an event set when the keepalive finds the lease expired or on resign.

Resign (``resign(term)``): delete the leader key if its create revision is still the
term's epoch (one txn), revoke the lease and stop keeping it alive. A term also ends when
its lease expires (holder stopped, partitioned or dead for ``ttl`` s): etcd deletes the
leader key and the next campaign wins with a higher epoch; the old holder's appends are
then ``Fenced``.

Concurrency contract: one ``HALog`` serves one trio task tree; its calls may run from
several tasks at once. The log has ONE writer, the term holder, and that writer awaits
each ``append`` before the next one (the journal's group commit already makes one batch
per flush), so entries commit in txid order. Safety never depends on timing: a holder that
believes it still leads after its lease expired is stopped by the epoch compare in the
same txn as its put, not by a clock.

Which member: every call goes to one endpoint at a time, moving to the next on failure.
Writes are best sent to etcd's raft leader: a follower forwards each proposal to the leader
and answers only after applying the entry itself, one more hop of CPU and latency (a quiet
append measured 1.47/1.37 ms through a follower, 1.26/1.19 ms at the leader). So
at open and every ``LEADER_PROBE`` s a background task asks the member in use who leads
(``Maintenance.Status``), looks its client URLs up (``Cluster.MemberList``) and
moves to it when it is one of ``endpoints``. Only a hint: a probe that fails changes nothing,
and any member serves every call correctly.

``decide`` and the key/encoding helpers are pure; everything that does I/O is a method of
``HALog``.
"""

from __future__ import annotations

import logging
import math
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import trio

from fs.backoff import Backoff

from . import etcdgrpc
from .etcdgrpc import TransportError
from .etcdpb import rpc_pb2 as pb

log = logging.getLogger(__name__)

#: etcd's default ``--max-request-bytes`` (1.5 MiB) less room for keys and the compares
MAX_REQUEST_BYTES = 1_572_864
MAX_PAYLOAD = MAX_REQUEST_BYTES - 4096
TXID_DIGITS = 20
#: seconds between asks for etcd's raft leader (see "Which member")
LEADER_PROBE = 5.0
#: the wait before a call goes to the next member after a transport error (25 to 50 ms)
NEXT_MEMBER_RETRY = Backoff(first=0.05, factor=1, cap=0.05, jitter=0.5)
#: the wait before a call that etcd answered with a transient error ("no leader") is tried
#: again, and before a broken watch is opened again (50 to 100 ms)
TRANSIENT_RETRY = Backoff(first=0.1, factor=1, cap=0.1, jitter=0.5)


class HALogError(Exception):
    """Base of the errors of this module."""


class Fenced(HALogError):
    """The term is over: the leader key is gone or belongs to a newer term."""

    def __init__(self, epoch: int, current_epoch: int | None, holder: str | None):
        self.epoch, self.current_epoch, self.holder = epoch, current_epoch, holder
        now = (f"the leader key has epoch {current_epoch} (holder {holder!r})"
               if current_epoch is not None else "there is no leader key (lease expired or "
               "resigned)")
        super().__init__(f"fenced: this term's epoch is {epoch} but {now}")


class DuplicateTxid(HALogError):
    """An entry with that first txid is already in the log."""

    def __init__(self, txid: int, revision: int):
        self.txid, self.revision = txid, revision
        super().__init__(f"txid {txid} is already in the log (written at revision {revision})")


class PayloadTooLarge(HALogError):
    def __init__(self, size: int):
        self.size = size
        super().__init__(f"payload of {size} bytes is over the {MAX_PAYLOAD}-byte limit "
                         f"(etcd's request limit {MAX_REQUEST_BYTES}); split the batch")


class Unavailable(HALogError):
    """No etcd answer in time (no quorum, or no member reachable); for an append the
    outcome is unknown."""


class CampaignTimeout(HALogError):
    """The campaign did not win in time; its lease (``lease_id``) is revoked."""

    def __init__(self, message: str, lease_id: int):
        self.lease_id = lease_id
        super().__init__(message)


@dataclass(frozen=True)
class Term:
    epoch: int
    node_id: str
    lease_id: int


@dataclass(frozen=True)
class Entry:
    txid: int
    payload: bytes
    revision: int


# ---- pure helpers ----------------------------------------------------------------------

def prefix_end(key: bytes) -> bytes:
    """The smallest key after every key that starts with ``key`` (etcd's range_end)."""
    return key[:-1] + bytes([key[-1] + 1])


@dataclass(frozen=True)
class Appended:
    revision: int


def compare_create(key: bytes, revision: int) -> pb.Compare:
    """``create_revision(key) == revision`` (0: the key does not exist)."""
    return pb.Compare(target=pb.Compare.CREATE, result=pb.Compare.EQUAL, key=key,
                      create_revision=revision)


def op_put(key: bytes, value: bytes, lease: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))


def op_range(key: bytes) -> pb.RequestOp:
    """A read of the one key."""
    return pb.RequestOp(request_range=pb.RangeRequest(key=key))


def op_delete(key: bytes, range_end: bytes = b"") -> pb.RequestOp:
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key,
                                                                   range_end=range_end))


def append_request(leader: bytes, epoch: int, entry: bytes, payload: bytes) -> pb.TxnRequest:
    """The append's txn: if the leader key has ``epoch`` and ``entry`` does not exist, put
    it; else read both. Filled in place rather than built from ``compare_create`` and
    ``op_*`` (which copies each part into the txn): it is sent once per journal batch."""
    txn = pb.TxnRequest()
    for key, revision in ((leader, epoch), (entry, 0)):
        compare = txn.compare.add()
        compare.target, compare.key, compare.create_revision = pb.Compare.CREATE, key, revision
    put = txn.success.add().request_put
    put.key, put.value = entry, payload
    txn.failure.add().request_range.key = leader
    txn.failure.add().request_range.key = entry
    return txn


def first_kv(result: pb.TxnResponse, index: int):
    """The first key-value of the ``index``-th response (a range) of a txn, or None."""
    if index >= len(result.responses):
        return None
    kvs = result.responses[index].response_range.kvs
    return kvs[0] if kvs else None


def decide(term: Term, txid: int, payload: bytes, result: pb.TxnResponse,
           retried: bool = False):
    """What an append's txn answer means: ``Appended`` or the error to raise (pure).

    On failure the txn's two responses are the ranges of the leader key and of the log
    key, in that order. ``retried``: this was a second try after a broken connection, so an
    entry with our exact bytes may be our own first try."""
    if result.succeeded:
        return Appended(result.header.revision)
    leader, entry = first_kv(result, 0), first_kv(result, 1)
    current = leader.create_revision if leader is not None else None
    if current != term.epoch:
        return Fenced(term.epoch, current, leader.value.decode() if leader is not None
                      else None)
    assert entry is not None, result
    if retried and entry.value == payload and entry.create_revision > term.epoch:
        return Appended(entry.create_revision)
    return DuplicateTxid(txid, entry.create_revision)


#: gRPC status codes worth a retry: UNAVAILABLE, DEADLINE_EXCEEDED
GRPC_TRANSIENT = (14, 4)


def _transient(code: int, message: str) -> bool:
    """An etcd error answer worth retrying (no leader, timeout, member unavailable)."""
    text = message.lower()
    return code in GRPC_TRANSIENT or any(
        word in text for word in ("timed out", "leader", "unavailable", "stopped"))


# ---- I/O -----------------------------------------------------------------------------------

class HALog:
    """The edit log of one namespace in etcd. Open with ``async with HALog.open(...)``."""

    def __init__(self, nursery: trio.Nursery, endpoints: list[str],
                 prefix: str, ttl: float, op_timeout: float, poll: float, page: int,
                 attempt_timeout: float):
        self._nursery = nursery
        self._grpc = etcdgrpc.Channel()
        self.endpoints, self.ttl, self.op_timeout = list(endpoints), ttl, op_timeout
        self.attempt_timeout = attempt_timeout
        self.poll, self.page = poll, page
        self.prefix = prefix.rstrip("/").encode()
        self.leader_key = self.prefix + b"/leader"
        self.log_prefix = self.prefix + b"/log/"
        self._current = 0                      # index of the endpoint in use
        self._keepalives: dict[int, trio.CancelScope] = {}
        self._lost: dict[int, trio.Event] = {}
        self._held: dict[int, float] = {}      # lease id -> see held_until
        self._unanswered: set[int] = set()     # leases whose last keepalive failed

    @classmethod
    @asynccontextmanager
    async def open(cls, endpoints: list[str], prefix: str, *, ttl: float = 5.0,
                   op_timeout: float = 5.0, poll: float = 0.1, page: int = 1000,
                   attempt_timeout: float = 1.5):
        """``ttl``: the election timeout (lease TTL, whole seconds in etcd, at least 1);
        ``op_timeout``: bound on one call, retries on other members included;
        ``attempt_timeout``: bound on one request, after which it is retried on the
        next member (etcd itself gives up on a proposal lost with a dead raft leader only
        after 5 s + 2 election timeouts; a retried append is safe, see ``decide``)."""
        async with trio.open_nursery() as nursery:
            halog = cls(nursery, endpoints, prefix, ttl, op_timeout, poll, page,
                        attempt_timeout)
            nursery.start_soon(halog._follow_raft_leader)
            try:
                yield halog
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await halog._grpc.aclose()

    async def _follow_raft_leader(self) -> None:
        while True:
            await self.prefer_raft_leader()
            await trio.sleep(LEADER_PROBE)

    async def prefer_raft_leader(self) -> bool:
        """Point the calls at etcd's raft leader when it is one of ``endpoints`` (module
        docstring, "Which member"); True if they now go there. One try per request, no
        retries: the hint can wait for the next probe."""
        async def ask(method: etcdgrpc.Method, request):
            code, message, answer = await self._grpc.call(
                self.endpoints[self._current], method, request, self.attempt_timeout)
            if answer is None:
                raise HALogError(f"{method.path}: gRPC status {code} {message}")
            return answer
        try:
            leader = (await ask(etcdgrpc.STATUS, pb.StatusRequest())).leader
            members = (await ask(etcdgrpc.MEMBER_LIST, pb.MemberListRequest())).members
        except (TransportError, HALogError) as exc:
            log.debug("halog: could not ask for etcd's raft leader: %r", exc)
            return False
        urls = next((m.clientURLs for m in members if m.ID == leader), [])
        ours = [e.rstrip("/") for e in self.endpoints]
        for url in urls:
            if url.rstrip("/") in ours:
                self._current = ours.index(url.rstrip("/"))
                return True
        return False

    @property
    def endpoint(self) -> str:
        """The member the calls go to now."""
        return self.endpoints[self._current]

    def log_key(self, txid: int) -> bytes:
        return self.log_prefix + str(txid).zfill(TXID_DIGITS).encode()

    async def _call(self, method: etcdgrpc.Method, request) -> tuple:
        """One call (``method`` with the ``request`` message), tried again as ``_retrying``
        says. Returns (answer, whether an earlier try may have reached etcd)."""
        async def attempt(endpoint: str):
            code, message, answer = await self._grpc.call(endpoint, method, request,
                                                          self.attempt_timeout)
            if answer is None:
                return (HALogError(f"{method.path}: gRPC status {code} {message}"),
                        _transient(code, message))
            return answer, False
        return await self._retrying(method.path, attempt)

    async def _retrying(self, what: str, attempt) -> tuple:
        """Run ``attempt(endpoint)`` until it answers, within ``op_timeout``: after a
        transport error on the next member, after a transient etcd error again. Returns
        (answer, whether an earlier try may have reached etcd)."""
        retried = False
        last: Exception | None = None
        with trio.move_on_after(self.op_timeout):
            while True:
                try:
                    data, transient = await attempt(self.endpoints[self._current])
                except TransportError as exc:
                    last = exc
                    retried = retried or exc.sent   # the request may have reached etcd
                    self._current = (self._current + 1) % len(self.endpoints)
                    await NEXT_MEMBER_RETRY.sleep(0)
                    continue
                if isinstance(data, HALogError):
                    last = data
                    if not transient:
                        raise data
                    # "request timed out", "no leader" while a member has no quorum: the
                    # request may still commit later, so a retry may meet its own entry
                    retried = True
                    await TRANSIENT_RETRY.sleep(0)
                    continue
                return data, retried
        raise Unavailable(f"etcd gave no answer to {what} within {self.op_timeout} s "
                          f"(no quorum or no member reachable; last error: {last!r})")

    # -- election --

    async def campaign(self, node_id: str, timeout: float = math.inf) -> Term:
        """Block until this node holds the leader key (or ``timeout`` → CampaignTimeout)."""
        sent = trio.current_time()
        grant, _ = await self._call(etcdgrpc.LEASE_GRANT,
                                    pb.LeaseGrantRequest(TTL=max(1, round(self.ttl))))
        lease = grant.ID
        self._held[lease] = sent + grant.TTL
        scope = trio.CancelScope()
        self._keepalives[lease] = scope
        self._lost[lease] = trio.Event()
        self._nursery.start_soon(self._keepalive, lease, scope)
        key = self.leader_key
        campaign = pb.TxnRequest(compare=[compare_create(key, 0)],
                                 success=[op_put(key, node_id.encode(), lease)],
                                 failure=[op_range(key)])
        won = False
        try:
            with trio.move_on_after(timeout):
                while True:
                    result, _ = await self._call(etcdgrpc.TXN, campaign)
                    holder = None if result.succeeded else first_kv(result, 0)
                    if result.succeeded or (holder is not None and holder.lease == lease):
                        # won now, or an earlier try of this very txn won (retried request)
                        epoch = result.header.revision if holder is None \
                            else holder.create_revision
                        won = True
                        log.info("halog %s: %s leads with epoch %d", self.prefix.decode(),
                                 node_id, epoch)
                        return Term(epoch, node_id, lease)
                    await self._until_leader_gone(result.header.revision)
            raise CampaignTimeout(f"{node_id} did not win the election within {timeout} s",
                                  lease)
        finally:
            if not won:
                # timed out, Unavailable or cancelled: a txn of ours may still have created
                # the key, so the lease must not outlive the campaign (revoke it; if etcd
                # cannot be reached, at least stop keeping it alive: it expires in ttl s)
                with trio.CancelScope(shield=True), trio.move_on_after(self.op_timeout):
                    await self._revoke(lease)
                scope.cancel()

    async def _until_leader_gone(self, revision: int) -> None:
        """Returns once an etcd watch reports the leader key deleted after ``revision``
        (resigned, or its holder's lease expired); at the latest after ``ttl / 3`` s, and
        ``poll`` s after it began if the watch broke, so that the campaign's txn still asks
        now and then. A watch rather than that txn every ``poll`` s: a txn whose compare
        fails is a raft proposal on every member all the same (its success branch writes),
        ten a second per waiting standby, and a poll finds the key gone up to ``poll`` s
        late."""
        request = pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=self.leader_key, start_revision=revision + 1,
            filters=[pb.WatchCreateRequest.NOPUT]))
        began = trio.current_time()
        with trio.move_on_after(self.ttl / 3):
            try:
                async with aclosing(self._grpc.watch(self.endpoints[self._current],
                                                     etcdgrpc.WATCH, request,
                                                     self.op_timeout)) as results:
                    async for result in results:
                        if (result.canceled or result.compact_revision
                                or any(e.type == e.DELETE for e in result.events)):
                            return
            except TransportError as exc:
                log.debug("halog: the campaign's watch of the leader key broke: %r", exc)
            await trio.sleep_until(began + self.poll)

    async def _keepalive(self, lease: int, scope: trio.CancelScope) -> None:
        """A keepalive every ``ttl/3`` s, each sent on time whether or not the one before
        has answered yet: one request stuck on a slow or cut-off member must not hold the
        next one back, or the holder's sure time (``held_until``) would lapse while etcd
        still answers."""
        with scope:
            async with trio.open_nursery() as nursery:
                while True:
                    await trio.sleep(self.ttl / 3)
                    nursery.start_soon(self._keep_alive_once, lease, scope)

    async def _keep_alive_once(self, lease: int, scope: trio.CancelScope) -> None:
        sent = trio.current_time()
        # no use past the TTL: a later answer could only say the lease is gone
        with trio.move_on_after(self.ttl) as timer:
            try:
                answer, _ = await self._call(etcdgrpc.LEASE_KEEPALIVE,
                                             pb.LeaseKeepAliveRequest(ID=lease))
            except Unavailable as exc:
                answer, why = None, str(exc)
        if timer.cancelled_caught:
            answer, why = None, f"no answer from etcd within {self.ttl:g} s"
        if answer is None:
            if lease not in self._unanswered:    # once per outage: one every ttl/3 else
                self._unanswered.add(lease)
                log.warning("halog: lease %x keepalive failed: %s", lease, why)
            return
        if lease in self._unanswered:
            self._unanswered.discard(lease)
            log.info("halog: lease %x keepalive answered again", lease)
        ttl = answer.TTL
        if ttl <= 0:
            log.warning("halog: lease %x expired; its term is over", lease)
            self._lost[lease].set()
            scope.cancel()
            return
        # etcd restarted the lease's TTL after we sent this: it lives until then
        if lease in self._held:
            self._held[lease] = max(self._held[lease], sent + ttl)

    def held_until(self, term: Term) -> float:
        """The ``trio.current_time()`` until which etcd surely keeps the term's lease: the
        TTL etcd gave at its last grant or keepalive, counted from when that request was
        SENT (etcd restarted the TTL later than that). Before it, no other server can have
        won a term (its leader key lives as long as the lease), unless this one resigned;
        ``-inf`` for a lease this process never held."""
        return self._held.get(term.lease_id, -math.inf)

    def lost(self, term: Term) -> trio.Event:
        """Set once this process KNOWS the term is over (its lease expired or it resigned).
        A hint for stepping down early: a term can also end unseen (a keepalive that cannot
        reach etcd); the fencing compare in ``append`` is what makes that safe."""
        return self._lost.setdefault(term.lease_id, trio.Event())

    async def _revoke(self, lease: int) -> None:
        scope = self._keepalives.pop(lease, None)
        if scope is not None:
            scope.cancel()
        self._lost.setdefault(lease, trio.Event()).set()
        self._held.pop(lease, None)
        try:
            await self._call(etcdgrpc.LEASE_REVOKE, pb.LeaseRevokeRequest(ID=lease))
        except Unavailable:
            log.warning("halog: could not revoke lease %x; it expires in %s s", lease, self.ttl)

    async def leader(self) -> tuple[int, str] | None:
        """(epoch, node id) of the current leader key, or None."""
        answer, _ = await self._call(etcdgrpc.RANGE, pb.RangeRequest(key=self.leader_key))
        kvs = answer.kvs
        return (kvs[0].create_revision, kvs[0].value.decode()) if kvs else None

    async def resign(self, term: Term) -> None:
        await self._call(etcdgrpc.TXN, pb.TxnRequest(
            compare=[compare_create(self.leader_key, term.epoch)],
            success=[op_delete(self.leader_key)]))
        await self._revoke(term.lease_id)

    # -- the log --

    async def purge(self, term: Term, below_txid: int) -> int:
        """Delete the entries whose first txid is below ``below_txid`` (one txn, fenced by
        the term like an append); returns how many went. etcd's compaction then frees
        their space."""
        if below_txid <= 1:
            return 0
        result, _ = await self._call(etcdgrpc.TXN, pb.TxnRequest(
            compare=[compare_create(self.leader_key, term.epoch)],
            success=[op_delete(self.log_prefix, self.log_key(below_txid))]))
        if not result.succeeded:
            raise Fenced(term.epoch, None, None)
        return result.responses[0].response_delete_range.deleted if result.responses else 0

    async def append(self, term: Term, first_txid: int, payload: bytes, *,
                     retried: bool = False) -> int:
        """Put one entry iff ``term`` still leads and ``first_txid`` is new; returns the
        etcd revision once a quorum committed it. Raises Fenced, DuplicateTxid,
        PayloadTooLarge or Unavailable (outcome unknown). ``retried``: the caller sends
        the same entry again after an ``Unavailable`` (its first try may have committed)."""
        if len(payload) > MAX_PAYLOAD:
            raise PayloadTooLarge(len(payload))
        result, again = await self._call(etcdgrpc.TXN, append_request(
            self.leader_key, term.epoch, self.log_key(first_txid), payload))
        outcome = decide(term, first_txid, payload, result, retried or again)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.revision

    def _entry(self, kv) -> Entry:
        """An entry from its ``mvccpb.KeyValue``."""
        return Entry(int(kv.key[len(self.log_prefix):]), kv.value, kv.mod_revision)

    async def _read_page(self, from_txid: int) -> tuple[list[Entry], int, bool]:
        answer, _ = await self._call(etcdgrpc.RANGE, pb.RangeRequest(
            key=self.log_key(from_txid), range_end=prefix_end(self.log_prefix),
            limit=self.page, sort_order=pb.RangeRequest.ASCEND,
            sort_target=pb.RangeRequest.KEY))
        return [self._entry(kv) for kv in answer.kvs], answer.header.revision, answer.more

    async def read(self, from_txid: int = 0) -> list[Entry]:
        """Every entry with txid >= from_txid, in txid order (one consistent snapshot
        per page)."""
        out: list[Entry] = []
        while True:
            entries, _, more = await self._read_page(from_txid)
            out.extend(entries)
            if not more or not entries:
                return out
            from_txid = entries[-1].txid + 1

    async def tail(self, from_txid: int = 0) -> AsyncIterator[Entry]:
        """Entries from ``from_txid`` on, then each new one as it commits (forever)."""
        while True:
            # catch up by reads, remembering the revision the last read saw
            while True:
                entries, revision, more = await self._read_page(from_txid)
                for e in entries:
                    yield e
                if entries:
                    from_txid = entries[-1].txid + 1
                if not more:
                    break
            try:
                async for e in self._watch(revision + 1):
                    if e.txid >= from_txid:
                        yield e
                        from_txid = e.txid + 1
            except (TransportError, ValueError) as exc:
                log.info("halog: watch broke (%r); reading again from txid %d", exc, from_txid)
                self._current = (self._current + 1) % len(self.endpoints)
                await TRANSIENT_RETRY.sleep(0)

    async def _watch(self, start_revision: int) -> AsyncIterator[Entry]:
        """The log's new entries from ``start_revision`` as etcd commits them: a native
        gRPC watch stream that etcd ends when its member loses the raft leader."""
        request = pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=self.log_prefix, range_end=prefix_end(self.log_prefix),
            start_revision=start_revision, filters=[pb.WatchCreateRequest.NODELETE]))
        async for result in self._grpc.watch(self.endpoints[self._current], etcdgrpc.WATCH,
                                             request, self.op_timeout):
            if result.canceled or result.compact_revision:
                raise ValueError(f"watch ended by etcd: canceled {result.canceled}, "
                                 f"compact revision {result.compact_revision}, "
                                 f"{result.cancel_reason!r}")
            for event in result.events:
                if event.type == event.PUT and event.HasField("kv"):
                    yield self._entry(event.kv)
