"""Hadoop's client appending to a file kept inline in the namespace: the metadata server
first makes the inline bytes the file's first block, then answers the append with that
block as the partly full last block, which Hadoop's writer continues as any other.

Why: Hadoop's writer continues the file's last block and sends only bytes it wrote
itself; a small file a leasefs client, the mount, fsspec or the Python data source wrote
has no block (its bytes live in the namespace, ``inline_max``). leasefs's own writer
starts its stream with the inline bytes instead (``fs.writer``, ``start_with``); for
Hadoop's writer the metadata server does that part, with the same service calls.

The steps, under the lease the append gave the Java client's name (never released
between them):

1. ``append`` (the caller's): the file is open for the Java client; the inline copy stays
   its content, and what readers are served.
2. ``add_block``: the first block, placed as any block of the file (its replication, the
   Java client's host first).
3. ``WRITE_BLOCK_ONESHOT`` of the inline bytes to every location
   (``fs.pipeline.write_oneshot``): FINALIZED replicas, reported as any. A node that fails
   gets the block abandoned and a new one placed without it, as leasefs's writer does.
4. ``fsync`` of the block's length: its one journal record drops the inline copy (the
   namespace keeps it until the first block holds at least its bytes).

Crash safety: before step 4's record the inline copy is the content; a crash leaves the
file open for the Java client with that content and at most an unrecorded first block,
and lease recovery keeps that block only if it holds every inline byte, else drops it
(``CommitBlockSync``): the same bytes either way, never a mix, never none. A failure
before step 4 closes the file again as it was (``complete`` with the inline bytes and its
old times: the one lease step 1 took goes; a file whose block already holds bytes is
refused by ``complete`` and left to lease recovery) and the Java client gets the cause.

Retries: the internal calls carry no retry key (each ``add_block`` attempt is a call of
its own). A retried append answered from the retry cache gets the first block
``add_block`` hands a retry, already holding the bytes, and is answered with it; one
answered from the journal after a restart or failover names the first block an
interrupted run left: answered when it holds the bytes, else abandoned (its replicas may
hold them already) and the bytes written to a new one. Conversions of one file run one at
a time.

Concurrency contract: the metadata server's trio thread; the only state is the per-file
lock of a conversion in progress.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

import trio

from fs import tls as tlsmod
from fs.dataconn import node_name
from fs.datatransfer import chunk_checksums
from fs.errors import LeaseFSError, NotSupported, PipelineError
from fs.pipeline import SetupFailed, write_oneshot
from fs.rpcbase import CallContext
from fs.writer import PIPELINE_SETUP_ATTEMPTS

log = logging.getLogger(__name__)

Call = Callable[[CallContext, str, dict], Awaitable[object]]

#: bound on putting a file back as it was after a failed conversion
RESTORE_TIMEOUT = 30.0


class InlineToBlock:
    """``call``: ``MetaServer.dispatch``; ``config``: the server's (data timeouts, chunk
    size, TLS of data connections)."""

    def __init__(self, call: Call, config):
        self.call = call
        self.config = config
        self._converting: dict[int, trio.Lock] = {}

    async def convert(self, ctx: CallContext, path: str, client_name: str,
                      appended: dict) -> dict:
        """``appended``: leasefs's ``append`` answer with ``inline`` (the file is open for
        ``client_name``). Returns the located first block holding the inline bytes, now
        the file's whole content (``num_bytes`` = its length, offset 0)."""
        data = bytes(appended["inline"])
        status = appended["status"]
        ino = status["ino"]
        own = dataclasses.replace(ctx, call_id=None)   # not the Java call's retry key
        base = {"path": path, "client_name": client_name, "ino": ino}
        lock = self._converting.setdefault(ino, trio.Lock())
        try:
            async with lock:
                try:
                    if len(data) >= (status["block_size"] or 0):
                        raise NotSupported(
                            f"append to {path}: its {len(data)} bytes are kept inline and "
                            f"fill a whole block of {status['block_size']} bytes (only a "
                            f"block size below inline_max makes such a file); append with "
                            f"a leasefs client")
                    located = await self._earlier_block(own, base, data, appended)
                    if located is None:
                        located = await self._write_block(own, base, data)
                    await self.call(own, "fsync", {**base, "last_block_length": len(data)})
                except BaseException as exc:
                    await self._restore(own, base, data, status, exc)
                    raise
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._converting.pop(ino, None)
        return {**located, "offset": 0, "block": {
            **located["block"], "num_bytes": max(len(data), located["block"]["num_bytes"])}}

    async def _earlier_block(self, ctx: CallContext, base: dict, data: bytes,
                             appended: dict) -> dict | None:
        """The first block an earlier run of this append left (a retry answered from
        the journal after a restart or failover): returned when it holds every inline
        byte (done, only the answer was lost); else abandoned, since its replicas may
        already hold bytes a new write to the same block would collide with."""
        last = appended.get("last_block")
        if last is None:
            return None
        if last["block"]["num_bytes"] >= len(data):
            return last
        await self.call(ctx, "abandon_block", {**base, "block": last["block"]})
        return None

    async def _write_block(self, ctx: CallContext, base: dict, data: bytes) -> dict:
        """Steps 2 and 3: the first block, written whole; a node that fails is left out
        of the next try. The block ``add_block`` answers a retry already holding the
        bytes: written by an earlier run of this append, so nothing to write."""
        config = self.config
        bpc = config.bytes_per_checksum
        sums = chunk_checksums(data, bpc)
        excluded: list[str] = []
        failures: list[str] = []
        for _attempt in range(PIPELINE_SETUP_ATTEMPTS):
            located = await self.call(ctx, "add_block", {**base, "excluded": excluded})
            if located["block"]["num_bytes"] >= len(data):
                return located
            if not located.get("locations"):
                raise PipelineError(f"append to {base['path']}: block "
                                    f"{located['block']['id']} has no block server")
            try:
                await write_oneshot(
                    path=base["path"], located=located, client_name=base["client_name"],
                    bytes_per_checksum=bpc, data=data, sums=sums, timeout=config.data_timeout,
                    connect_timeout=config.data_connect_timeout, max_frame=config.max_frame,
                    tls=tlsmod.client(config))
            except SetupFailed as exc:
                failures.append(exc.reason)
                log.warning("%s: writing the inline bytes as block %s failed at %s: %s; "
                            "abandoning the block", base["path"], located["block"]["id"],
                            node_name(exc.node), exc.reason)
                await self.call(ctx, "abandon_block", {**base, "block": located["block"]})
                if not exc.token_refused and exc.node.get("node_id"):
                    excluded.append(exc.node["node_id"])
                continue
            return located
        raise PipelineError(f"append to {base['path']}: could not write its {len(data)} "
                            f"inline bytes as its first block after {PIPELINE_SETUP_ATTEMPTS} "
                            f"attempts: " + "; ".join(failures))

    async def _restore(self, ctx: CallContext, base: dict, data: bytes, status: dict,
                       cause: BaseException) -> None:
        """The file closed again with its inline bytes and old times, as before the
        append (``complete`` refuses it once a block holds bytes: lease recovery then
        closes it with them). Never raises: the cause is what the Java client hears."""
        with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
            try:
                await self.call(ctx, "complete", {
                    **base, "data": data, "mtime_ns": status["mtime_ns"],
                    "atime_ns": status["atime_ns"]})
                log.info("%s: the append could not move the inline bytes into a block "
                         "(%s); the file is closed again as it was", base["path"],
                         _brief(cause))
                return
            except LeaseFSError as exc:
                log.warning("%s: the append could not move the inline bytes into a block "
                            "(%s), nor close the file again (%s); lease recovery will",
                            base["path"], _brief(cause), exc)


def _brief(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
