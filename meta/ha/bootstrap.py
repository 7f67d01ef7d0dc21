"""Bootstrapping a follower from another metadata server's image (HDFS ``namenode
-bootstrapStandby``), for a follower that is behind the replicated log.

Why it exists: after each checkpoint the active purges the log entries more than
``ha_log_retain`` txids older (``HAController.after_checkpoint``). A standby or observer
that was down for longer finds the entries it needs gone, and its own journal cannot bridge
that gap. It needs the namespace store of a server that applied further, at one txid T, and
then follows the log from T + 1.

Follower (``HAController`` notices the gap, ``run_meta_server`` runs ``recover`` with the
server stopped, then starts it again):

1. The log's first entry after ``applied`` starts at ``log_first > applied + 1``
   (``behind``): raise ``BehindLog`` out of the server; it closes its store and journal.
2. Sources (``sources``): the leader the log names when its node id is an address, then
   every other server of ``meta_address``, asked in turn until one gives an image.
3. Download (``fetch``): ``image_read`` opens an image at the source at txid T >=
   ``log_first - 1`` (a source that has not applied that far refuses), then pages of at most
   ``CHUNK_BYTES`` of keys and values follow, each written as one batch into a new store
   ``<data>/db.image`` (a half-written one left by an earlier try is removed first; it is
   only ever a copy). The new store is synced, and must say it applied exactly T.
4. Install (``install``): ``<data>/db`` and ``<data>/journal`` move to
   ``<data>/before-bootstrap-<applied>-<UTC time>/`` (never deleted: an operator decides),
   ``db.image`` becomes ``db``, a new ``journal/`` holds only an empty in-progress segment
   starting at T + 1 (so the journal start plan continues at T + 1 without a bridge).
   A WARNING names both txids and where the old state went.
5. The server starts again: nothing to replay, it reads the log from T + 1. A source that
   fails (or has not applied far enough) is skipped for the next; when none serves, try
   again after ``RETRY`` seconds.

Source (``image_read``, an ANY_ROLE call for the cluster's servers: a connection that
proved the cluster key, or the superuser):

6. Open: refuse (``TryAgain``, naming both txids) when this server has applied less than
   asked; else take a LevelDB snapshot on the trio thread. Batches are applied there in
   one synchronous step, so the snapshot is the namespace at exactly one txid, which it
   records itself (the applied counter is written with the data it applied).
7. Each read returns the pairs after the caller's last key, at most ``CHUNK_BYTES``; the
   snapshot is released when the last page is read, after ``IDLE`` seconds without a read,
   or when more than ``MAX_IMAGES`` are open (the oldest goes). Neither side ever holds
   more than one page in memory.

Concurrency contract: ``ImageSource`` and ``behind``/``sources`` run on the server's trio
thread (pure apart from the snapshot); ``recover``/``fetch`` run while the follower's
server is stopped (its store writes block the trio thread: nothing else runs on it then),
``install`` in a worker thread.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from functools import partial

import trio

from fs import nodeauth
from fs import tls as tlsmod
from fs.backoff import Backoff
from fs.datafolder import FILE_MODE
from fs.errors import InvalidArgument, LeaseFSError, TryAgain, sole_exception
from fs.rpc import format_address, parse_address_list
from fs.rpcclient import RpcClient

from ..schema import keys
from ..journal.files import fsync_dir, inprogress_name

log = logging.getLogger(__name__)

#: keys and values a page of the image carries at most
CHUNK_BYTES = 1 << 20
#: seconds an open image is kept without a read
IDLE = 60.0
#: open images a server keeps at once (each pins a LevelDB snapshot)
MAX_IMAGES = 4
#: the wait between two rounds of asking every source (1 to 2 s)
RETRY = Backoff(first=2.0, factor=1, cap=2.0, jitter=0.5)
#: seconds a source may take to answer one call
CALL_TIMEOUT = 30.0
STAGING = "db.image"
ASIDE = "before-bootstrap"


class BehindLog(Exception):
    """This follower needs log entries that are gone: it must be bootstrapped."""

    def __init__(self, gap: "Gap"):
        super().__init__(gap.describe())
        self.gap = gap


@dataclass(frozen=True)
class Gap:
    applied: int       # what this server has applied
    log_first: int     # the txid the replicated log continues at

    @property
    def needed(self) -> int:
        """The least txid an image must be at for the log to continue after it."""
        return self.log_first - 1

    def describe(self) -> str:
        return (f"the replicated log continues at txid {self.log_first} but this server has "
                f"applied up to {self.applied} (txids {self.applied + 1}..{self.log_first - 1} "
                f"were purged from the log)")


@dataclass(frozen=True)
class Installed:
    txid: int          # the image's txid: the log is followed from txid + 1
    source: str
    pairs: int
    size: int
    aside: str         # where the old store and journal went


# ------------------------------------------------------------------ decisions (pure)
def behind(applied: int, log_first: int) -> Gap | None:
    """The gap when the log's next entry does not follow ``applied`` (step 1)."""
    return Gap(applied, log_first) if log_first > applied + 1 else None


def sources(leader: str | None, meta_address: str, own: str | None) -> list[str]:
    """Addresses to ask, the leader first when its node id is an address (step 2)."""
    out: list[str] = []
    listed = []
    for text in ([leader] if leader else []) + [meta_address]:
        try:
            listed.extend(format_address(a) for a in parse_address_list(text))
        except (LeaseFSError, ValueError):
            continue   # a node id that is a name, not an address
    for address in listed:
        if address != own and address not in out:
            out.append(address)
    return out


def aside_name(applied: int, wall: float) -> str:
    return f"{ASIDE}-{applied}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(wall))}"


# ------------------------------------------------------------------ the source
class _Image:
    def __init__(self, snapshot, txid: int, now: float):
        self.snapshot = snapshot
        self.txid = txid
        self.used = now


class ImageSource:
    """A server's open images (steps 6-7); trio thread."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._open: dict[str, _Image] = {}

    def read(self, kv, applied: int, *, min_txid: int = 0, session: str | None = None,
             after: bytes | None = None, max_bytes: int = CHUNK_BYTES) -> dict:
        now = self.clock()
        self._expire(now)
        if session is None:
            if applied < min_txid:
                raise TryAgain(f"image_read: this server has applied up to txid {applied}; "
                               f"an image at txid {min_txid} or later is needed")
            snapshot = kv.snapshot()
            txid = int(keys.unpack(snapshot.get(keys.meta_key(keys.APPLIED_TXID))) or 0)
            while len(self._open) >= MAX_IMAGES:
                self._close(next(iter(self._open)))
            session = secrets.token_hex(8)
            self._open[session] = _Image(snapshot, txid, now)
        image = self._open.get(session)
        if image is None:
            raise InvalidArgument(f"image_read: image {session!r} is not open here (read to "
                                  f"its end, idle for {IDLE:.0f} s, or the server restarted)")
        image.used = now
        items, done = image.snapshot.items_after(after, max_bytes)
        if done:
            self._close(session)
        return {"session": session, "txid": image.txid, "done": done,
                "items": [[k, v] for k, v in items]}

    def _expire(self, now: float) -> None:
        for session in [s for s, i in self._open.items() if now - i.used > IDLE]:
            self._close(session)

    def _close(self, session: str) -> None:
        image = self._open.pop(session, None)
        if image is not None:
            image.snapshot.close()

    def close(self) -> None:
        for session in list(self._open):
            self._close(session)


# ------------------------------------------------------------------ the follower
def _authenticate(config, address: str, key: bytes | None):
    if key is None:
        return None
    node_id = config.ha_node_id or "metadata-bootstrap"
    # the namespace is only taken from a server that holds the cluster key too
    return partial(nodeauth.authenticate, key=key, node_id=node_id, address=address)


def _client(config, address: str, key: bytes | None) -> RpcClient:
    return RpcClient(address, f"leasefs-bootstrap-{os.getpid()}", timeout=CALL_TIMEOUT,
                     retry_seconds=0, connect_timeout=5.0, max_frame=config.max_frame,
                     tls=tlsmod.client(config), authenticate=_authenticate(config, address, key),
                     local_socket=None)


async def fetch(config, address: str, key: bytes | None, staging: str, needed: int):
    """Download an image at txid >= ``needed`` into a new store at ``staging`` (step 3);
    ``(txid, pairs, bytes)``."""
    from ..journal.kv import PlyvelStore

    if os.path.exists(staging):
        shutil.rmtree(staging)   # a half-downloaded copy of an earlier try
    store = PlyvelStore(staging)
    pairs = size = 0
    try:
        async with _client(config, address, key) as rpc:
            page = await rpc.call("image_read", {"min_txid": needed}, retry_seconds=0)
            txid, session = page["txid"], page["session"]
            while True:
                items = [(bytes(k), bytes(v)) for k, v in page["items"]]
                store.write(puts=items)
                pairs += len(items)
                size += sum(len(k) + len(v) for k, v in items)
                if page["done"] or not items:
                    break
                page = await rpc.call("image_read", {"session": session, "after": items[-1][0]},
                                      retry_seconds=0)
        store.sync()
        got = int(keys.read_counter(store, keys.APPLIED_TXID))
        if got != txid or txid < needed:
            raise InvalidArgument(f"bootstrap: the image from {address} says txid {got}, "
                                  f"announced {txid}, needed at least {needed}")
    finally:
        store.close()
    return txid, pairs, size


def install(data_dir: str, staging: str, applied: int, txid: int, wall: float) -> str:
    """Put the downloaded store in place of the old store and journal (step 4); returns
    the folder the old ones were moved to."""
    aside = os.path.join(data_dir, aside_name(applied, wall))
    n = 1
    while os.path.exists(aside):
        aside = os.path.join(data_dir, f"{aside_name(applied, wall)}.{n}")
        n += 1
    os.makedirs(aside)
    for name in ("db", "journal"):
        if os.path.exists(os.path.join(data_dir, name)):
            os.rename(os.path.join(data_dir, name), os.path.join(aside, name))
    fsync_dir(aside)
    os.rename(staging, os.path.join(data_dir, "db"))
    journal = os.path.join(data_dir, "journal")
    os.makedirs(journal)
    fd = os.open(os.path.join(journal, inprogress_name(txid + 1)),
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(journal)
    fsync_dir(data_dir)
    return aside


async def recover(config, data_dir: str, gap: Gap, *, leader: str | None,
                  own: str | None, key: bytes | None) -> Installed:
    """Steps 2-5: returns once an image is installed (trying again while none serves)."""
    staging = os.path.join(data_dir, STAGING)
    while True:
        addresses = sources(leader, config.meta_address, own)
        for address in addresses:
            try:
                txid, pairs, size = await fetch(config, address, key, staging, gap.needed)
            except BaseException as raised:   # trio wraps errors crossing the client's nursery
                exc = sole_exception(raised)
                if not isinstance(exc, (LeaseFSError, OSError, trio.TooSlowError, KeyError,
                                        TypeError)):
                    raise
                log.warning("bootstrap: no image from %s: %s", address, exc)
                continue
            aside = await trio.to_thread.run_sync(install, data_dir, staging, gap.applied,
                                                  txid, time.time())
            done = Installed(txid, address, pairs, size, aside)
            log.warning("metadata server bootstrapped from %s: %s; installed its namespace "
                        "image at txid %d (%d keys, %d bytes) and follows the log from txid "
                        "%d; the old store and journal (applied txid %d) were moved to %s",
                        done.source, gap.describe(), txid, pairs, size, txid + 1,
                        gap.applied, aside)
            return done
        known = addresses or "(none known: set meta_address to the namespace's servers)"
        delay = RETRY.delay(0)
        log.warning("bootstrap: no metadata server of %s gave an image at txid %d or "
                    "later; trying again in %.1f s", known, gap.needed, delay)
        await trio.sleep(delay)
