"""The replicated edit log on etcd: leader election, fenced appends, ordered reads.

The engine under metadata high availability (active + standby + observer metadata
servers; ``meta/ha/controller.py`` drives it). etcd (3.4, Debian ``etcd-server``) is the engine.
The append, once per journal batch, is a native gRPC ``KV.Txn`` and the followers' watch a
native gRPC ``Watch`` stream (``meta/ha/etcdgrpc.py``: a third less of etcd's CPU and of the
append's latency than through the JSON gateway, and a watch etcd ends when its member
loses the raft leader); the other calls (election, reads, leases) go through etcd's JSON
gateway (``/v3/kv/txn``, ``/v3/kv/range``, ``/v3/lease/*``; keys and values base64) with
the lean client of ``meta/ha/etcdhttp.py``. All on trio. See docs/design/ha.md, "Metadata HA
engine".

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
5. Otherwise wait (polling with the same txn every ``poll`` s: a failed compare writes
   nothing) until the key is gone — resigned, or deleted by etcd when its holder's lease
   expired — and go to 2.
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
(``/v3/maintenance/status``), looks its client URLs up (``/v3/cluster/member/list``) and
moves to it when it is one of ``endpoints``. Only a hint: a probe that fails changes nothing,
and any member serves every call correctly.

``decide`` and the key/encoding helpers are pure; everything that does I/O is a method of
``HALog``.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import trio

from fs.backoff import Backoff

from . import etcdgrpc
from .etcdhttp import Gateway, GatewayError

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

def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(key: bytes) -> bytes:
    """The smallest key after every key that starts with ``key`` (etcd's range_end)."""
    return key[:-1] + bytes([key[-1] + 1])


@dataclass(frozen=True)
class Appended:
    revision: int


def decide(term: Term, txid: int, payload: bytes, result: dict, retried: bool = False):
    """What an append's txn answer means: ``Appended`` or the error to raise (pure).

    ``result`` is the txn answer in the gateway's JSON shape (``etcdgrpc.txn_result``
    gives that shape too); on failure its two responses are the
    ranges of the leader key and of the log key, in that order. ``retried``: this was a
    second try after a broken connection, so an entry with our exact bytes may be our own
    first try."""
    if result.get("succeeded"):
        return Appended(int(result["header"]["revision"]))
    responses = result.get("responses", [])
    leader = (responses[0].get("response_range", {}).get("kvs") or [None])[0] \
        if responses else None
    entry = (responses[1].get("response_range", {}).get("kvs") or [None])[0] \
        if len(responses) > 1 else None
    current = int(leader["create_revision"]) if leader else None
    if current != term.epoch:
        return Fenced(term.epoch, current, unb64(leader.get("value")).decode()
                      if leader else None)
    assert entry is not None, result
    if retried and unb64(entry.get("value")) == payload \
            and int(entry["create_revision"]) > term.epoch:
        return Appended(int(entry["create_revision"]))
    return DuplicateTxid(txid, int(entry["create_revision"]))


#: gRPC status codes as the gateway's HTTP status for them (``_transient``):
#: UNAVAILABLE, DEADLINE_EXCEEDED
GRPC_TRANSIENT = {14: 503, 4: 504}


def _transient(status: int, data: dict) -> bool:
    """An etcd error answer worth retrying (no leader, timeout, member unavailable)."""
    text = str(data.get("error") or data.get("message") or "").lower()
    return status in (503, 504) or any(
        word in text for word in ("timed out", "leader", "unavailable", "stopped"))


# ---- I/O -----------------------------------------------------------------------------------

class HALog:
    """The edit log of one namespace in etcd. Open with ``async with HALog.open(...)``."""

    def __init__(self, nursery: trio.Nursery, endpoints: list[str],
                 prefix: str, ttl: float, op_timeout: float, poll: float, page: int,
                 attempt_timeout: float):
        # the append and the watch through native gRPC (``meta.ha.etcdgrpc``), the other
        # unary calls through the lean gateway client (``meta.ha.etcdhttp``)
        self._nursery = nursery
        self._gateway = Gateway()
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
        ``attempt_timeout``: bound on one HTTP request, after which it is retried on the
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
                    await halog._gateway.aclose()
                    await halog._grpc.aclose()

    async def _follow_raft_leader(self) -> None:
        while True:
            await self.prefer_raft_leader()
            await trio.sleep(LEADER_PROBE)

    async def prefer_raft_leader(self) -> bool:
        """Point the calls at etcd's raft leader when it is one of ``endpoints`` (module
        docstring, "Which member"); True if they now go there. One try per request, no
        retries: the hint can wait for the next probe."""
        async def ask(path: str) -> dict:
            status, content = await self._gateway.post(
                self.endpoints[self._current], path, b"{}", self.attempt_timeout)
            if status != 200:
                raise HALogError(f"{path}: HTTP {status}")
            return json.loads(content)
        try:
            leader = str((await ask("/v3/maintenance/status")).get("leader", ""))
            members = (await ask("/v3/cluster/member/list")).get("members") or []
        except (GatewayError, HALogError, ValueError) as exc:
            log.debug("halog: could not ask for etcd's raft leader: %r", exc)
            return False
        urls = next((m.get("clientURLs") or [] for m in members
                     if str(m.get("ID")) == leader), [])
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

    async def _call(self, path: str, body: dict) -> tuple[dict, bool]:
        """POST to the gateway; on a connection error try the next member, all within
        ``op_timeout``. Returns (answer, whether an earlier try may have reached etcd)."""
        request = json.dumps(body).encode()

        async def attempt(endpoint: str) -> tuple[dict | HALogError, bool]:
            status, content = await self._gateway.post(endpoint, path, request,
                                                       self.attempt_timeout)
            try:
                data = json.loads(content) if content else {}
            except ValueError:
                data = {"error": content[:200].decode(errors="replace")}
            if status != 200:
                return HALogError(f"{path}: HTTP {status} {data}"), _transient(status, data)
            return data, False
        return await self._retrying(path, attempt)

    async def _txn(self, request: bytes) -> tuple[dict, bool]:
        """A txn (``etcdgrpc.txn_request``) over etcd's native gRPC API, as ``_call``: the
        append's way (module ``meta/ha/etcdgrpc.py`` says why). The answer has the gateway's
        shape."""
        async def attempt(endpoint: str) -> tuple[dict | HALogError, bool]:
            code, message, answer = await self._grpc.call(endpoint, etcdgrpc.TXN, request,
                                                          self.attempt_timeout)
            if code != 0:
                return (HALogError(f"txn: gRPC status {code} {message}"),
                        _transient(GRPC_TRANSIENT.get(code, 0), {"error": message}))
            try:
                return etcdgrpc.txn_result(answer), False
            except ValueError as exc:
                raise GatewayError(f"{endpoint}: malformed txn answer ({exc})",
                                   sent=True) from None
        return await self._retrying("txn", attempt)

    async def _retrying(self, what: str, attempt) -> tuple[dict, bool]:
        """Run ``attempt(endpoint)`` until it answers, within ``op_timeout``: after a
        transport error on the next member, after a transient etcd error again. Returns
        (answer, whether an earlier try may have reached etcd)."""
        retried = False
        last: Exception | None = None
        with trio.move_on_after(self.op_timeout):
            while True:
                try:
                    data, transient = await attempt(self.endpoints[self._current])
                except GatewayError as exc:
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
        grant, _ = await self._call("/v3/lease/grant", {"TTL": max(1, round(self.ttl))})
        lease = int(grant["ID"])
        self._held[lease] = sent + int(grant.get("TTL", 0))
        scope = trio.CancelScope()
        self._keepalives[lease] = scope
        self._lost[lease] = trio.Event()
        self._nursery.start_soon(self._keepalive, lease, scope)
        key = b64(self.leader_key)
        won = False
        try:
            with trio.move_on_after(timeout):
                while True:
                    result, _ = await self._call("/v3/kv/txn", {
                        "compare": [{"target": "CREATE", "key": key, "create_revision": "0",
                                     "result": "EQUAL"}],
                        "success": [{"request_put": {"key": key, "value": b64(node_id),
                                                     "lease": str(lease)}}],
                        "failure": [{"request_range": {"key": key}}]})
                    holder = (result.get("responses") or [{}])[0].get(
                        "response_range", {}).get("kvs") or [{}]
                    if result.get("succeeded") or int(holder[0].get("lease", 0)) == lease:
                        # won now, or an earlier try of this very txn won (retried request)
                        epoch = int(result["header"]["revision"]) if result.get("succeeded") \
                            else int(holder[0]["create_revision"])
                        won = True
                        log.info("halog %s: %s leads with epoch %d", self.prefix.decode(),
                                 node_id, epoch)
                        return Term(epoch, node_id, lease)
                    await trio.sleep(self.poll)
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
                answer, _ = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
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
        ttl = int(answer.get("result", {}).get("TTL", 0))
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
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except Unavailable:
            log.warning("halog: could not revoke lease %x; it expires in %s s", lease, self.ttl)

    async def leader(self) -> tuple[int, str] | None:
        """(epoch, node id) of the current leader key, or None."""
        answer, _ = await self._call("/v3/kv/range", {"key": b64(self.leader_key)})
        kvs = answer.get("kvs") or []
        return (int(kvs[0]["create_revision"]), unb64(kvs[0].get("value")).decode()) \
            if kvs else None

    async def resign(self, term: Term) -> None:
        key = b64(self.leader_key)
        await self._call("/v3/kv/txn", {
            "compare": [{"target": "CREATE", "key": key, "create_revision": str(term.epoch),
                         "result": "EQUAL"}],
            "success": [{"request_delete_range": {"key": key}}]})
        await self._revoke(term.lease_id)

    # -- the log --

    async def purge(self, term: Term, below_txid: int) -> int:
        """Delete the entries whose first txid is below ``below_txid`` (one txn, fenced by
        the term like an append); returns how many went. etcd's compaction then frees
        their space."""
        if below_txid <= 1:
            return 0
        leader = b64(self.leader_key)
        result, _ = await self._call("/v3/kv/txn", {
            "compare": [{"target": "CREATE", "key": leader, "create_revision": str(term.epoch),
                         "result": "EQUAL"}],
            "success": [{"request_delete_range": {
                "key": b64(self.log_prefix), "range_end": b64(self.log_key(below_txid))}}]})
        if not result.get("succeeded"):
            raise Fenced(term.epoch, None, None)
        responses = result.get("responses") or [{}]
        return int(responses[0].get("response_delete_range", {}).get("deleted", 0))

    async def append(self, term: Term, first_txid: int, payload: bytes, *,
                     retried: bool = False) -> int:
        """Put one entry iff ``term`` still leads and ``first_txid`` is new; returns the
        etcd revision once a quorum committed it. Raises Fenced, DuplicateTxid,
        PayloadTooLarge or Unavailable (outcome unknown). ``retried``: the caller sends
        the same entry again after an ``Unavailable`` (its first try may have committed)."""
        if len(payload) > MAX_PAYLOAD:
            raise PayloadTooLarge(len(payload))
        leader, entry = self.leader_key, self.log_key(first_txid)
        result, again = await self._txn(etcdgrpc.txn_request(
            [etcdgrpc.compare_create(leader, term.epoch), etcdgrpc.compare_create(entry, 0)],
            [etcdgrpc.op_put(entry, payload)],
            [etcdgrpc.op_range(leader), etcdgrpc.op_range(entry)]))
        outcome = decide(term, first_txid, payload, result, retried or again)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome.revision

    def _entry(self, kv: dict) -> Entry:
        txid = int(unb64(kv["key"])[len(self.log_prefix):])
        return Entry(txid, unb64(kv.get("value")), int(kv["mod_revision"]))

    async def _read_page(self, from_txid: int) -> tuple[list[Entry], int, bool]:
        answer, _ = await self._call("/v3/kv/range", {
            "key": b64(self.log_key(from_txid)), "range_end": b64(prefix_end(self.log_prefix)),
            "limit": str(self.page), "sort_order": "ASCEND", "sort_target": "KEY"})
        entries = [self._entry(kv) for kv in answer.get("kvs") or []]
        return entries, int(answer["header"]["revision"]), bool(answer.get("more"))

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
            except (GatewayError, ValueError, KeyError) as exc:
                log.info("halog: watch broke (%r); reading again from txid %d", exc, from_txid)
                self._current = (self._current + 1) % len(self.endpoints)
                await TRANSIENT_RETRY.sleep(0)

    async def _watch(self, start_revision: int) -> AsyncIterator[Entry]:
        """The log's new entries from ``start_revision`` as etcd commits them: a native
        gRPC watch stream that etcd ends when its member loses the raft leader."""
        request = etcdgrpc.watch_request(self.log_prefix, prefix_end(self.log_prefix),
                                         start_revision)
        async for message in self._grpc.watch(self.endpoints[self._current], etcdgrpc.WATCH,
                                              request, self.op_timeout):
            result = etcdgrpc.watch_result(message)
            if result.get("canceled") or result.get("compact_revision"):
                raise ValueError(f"watch ended by etcd: {result}")
            for event in result["events"]:
                kv = event.get("kv")
                if event["type"] == "PUT" and kv is not None:
                    yield Entry(int(kv["key"][len(self.log_prefix):]), kv["value"],
                                kv["mod_revision"])
