"""A file opened for patches (``AsyncClient.open_for_patch``): its lease holder rewrites
byte ranges of its complete blocks in place, each block's new version under a new
generation stamp (docs/PROTOCOL.md, "Patches").

Why it exists: a file is append-only as in HDFS, so a database or an editor that rewrites
a few pages of a big file would otherwise send the whole file again. Here only the
changed ranges travel: for each touched block the metadata server hands out a new stamp
(``patch_block``), every replica holder applies the ranges crash-atomically under it
(``PATCH_BLOCK``, ``fs.patching``), and the metadata server commits the stamp with the
holders that applied it (``patch_done``); the others are stale and repaired as any
stale replica. Readers see the old version of a block or the new one.

The steps of one block's patch:

1. ``patch_block``: the new stamp and the block's replica locations (the caller must hold
   the file's lease, the block must be complete at the stamp this file last knew); or, for
   a block patched before through this object, the stamp the last ``patch_done`` began.
2. ``PATCH_BLOCK`` to every location at once (no chain: one hop each, as the one-shot
   write); each answers SUCCESS once its new version is durable.
3. ``patch_done`` with the nodes that answered SUCCESS, which also begins the block's
   next patch (``begin_next``: its stamp is kept for step 1 of the next one, so a block
   patched again and again costs one metadata call per patch). None did: the block stays
   at its old version (nothing committed; the stamp handed out is superseded by the next
   patch or dropped by lease recovery) and the patch fails. A stamp begun and never used
   is dropped by the file's close.

A patch may grow the file's partial last block up to the block size (never past it:
bytes beyond go through ``extend``, an ordinary stream that adds blocks).

Concurrency contract: one task at a time per file (the caller serializes, as the mount
does under its open file's lock); methods await the metadata server and block servers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from . import paths
from .datatransfer import ERROR_CHECKSUM, SUCCESS
from .errors import InvalidArgument, LeaseFSError, PipelineError
from .patching import send_patch
from .pipeline import transfer_finalized
from .writer import complete_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PatchedBlock:
    """What one block's patch did: its new stamp and length, the nodes that hold the new
    version, and why the others do not (node id → cause)."""
    block_id: int
    gs: int
    num_bytes: int
    nodes: tuple[str, ...]
    failed: dict


def block_versions(located_blocks) -> tuple:
    """``(id, stamp, length)`` of each located block: which version of a file's content
    they are (a patch gives a block a new stamp)."""
    return tuple((b["block"]["id"], b["block"]["gs"], b["block"]["num_bytes"])
                 for b in located_blocks)


def split_by_block(ranges, block_size: int) -> dict[int, list[tuple[int, bytes]]]:
    """``(file offset, bytes)`` ranges as ``{block index: [(offset in block, bytes)]}``,
    a range crossing a block boundary cut in two."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    for offset, data in ranges:
        view = memoryview(data)
        while len(view):
            index, inside = divmod(offset, block_size)
            take = min(len(view), block_size - inside)
            out.setdefault(index, []).append((inside, bytes(view[:take])))
            view = view[take:]
            offset += take
    return out


#: seconds a stamp begun by ``patch_done`` is used with the replicas it came with; an
#: older one is left to be superseded (``patch_block`` asked again: the block may have
#: been copied to other block servers meanwhile)
BEGUN_FRESH = 1.0

#: the most bytes one block's patch carries (a block server takes at most
#: ``MAX_PACKET_DATA`` in one message); more go as further patches of the block
ROUND_BYTES = 8 << 20


def _rounds(ranges):
    """``ranges`` of one block in groups of at most ``ROUND_BYTES`` bytes (a range longer
    than that cut in pieces)."""
    group, size = [], 0
    for offset, data in ranges:
        while data:
            take = data[:ROUND_BYTES - size]
            group.append((offset, take))
            size += len(take)
            offset += len(take)
            data = data[len(take):]
            if size >= ROUND_BYTES:
                yield group
                group, size = [], 0
    if group:
        yield group


class PatchableFile:
    """A file under this client's lease whose complete blocks take patches."""

    def __init__(self, client, path: str, answer: dict):
        self._client = client
        self.path = path
        status = answer["status"]
        self._status = status
        self.ino = status["ino"]
        self.block_size = int(status.get("block_size") or client.config.block_size)
        self.blocks: list[dict] = list(answer.get("blocks") or [])
        self.length = int(status.get("length") or 0)
        #: block id → (when, what ``patch_done`` answered for the block's next patch: its
        #: stamp begun on the metadata server, its replicas, its token)
        self._begun: dict[int, tuple[float, dict]] = {}
        self._closed = False
        self._error: LeaseFSError | None = None

    @property
    def version(self) -> tuple:
        """The file's content version: every block's ``(id, stamp, length)``."""
        return block_versions(self.blocks)

    @property
    def capacity(self) -> int:
        """The end of the room patches may write into: the last block's end once grown to
        the block size (0 for an empty file: its first block comes from ``extend``)."""
        return len(self.blocks) * self.block_size

    async def patch(self, ranges, *, more: bool = True) -> list[PatchedBlock]:
        """Write ``(offset, bytes)`` ranges (sorted, not overlapping) into the file: each
        must start at or before the file's end (no holes) and end within ``capacity``.
        ``more``: the caller expects to patch these blocks again before the close, so each
        block's commit begins its next patch (``begin_next``); False for the last patches
        before a close (a stamp begun and never used costs the close a journal record)."""
        self._check()
        end = self.length
        for offset, data in ranges:
            if offset < 0 or offset > end or offset + len(data) > self.capacity:
                raise InvalidArgument(
                    f"{self.path}: a patch of {len(data)} bytes at {offset} is outside the "
                    f"file's {self.length} bytes (a patch may grow it up to {self.capacity})")
            end = max(end, offset + len(data))
        done = []
        for index, block_ranges in sorted(split_by_block(ranges, self.block_size).items()):
            for part in _rounds(block_ranges):
                done.append(await self._patch_block(index, part, more))
        return done

    async def _patch_block(self, index: int, ranges, more: bool = True) -> PatchedBlock:
        client = self._client
        located = self.blocks[index]
        block = located["block"]
        if index < len(self.blocks) - 1 and any(
                o + len(d) > int(block["num_bytes"]) for o, d in ranges):
            raise InvalidArgument(f"{self.path}: only the last block may grow")
        begun = self._begun.pop(block["id"], None)
        answer = None
        if begun is not None and trio.current_time() - begun[0] < BEGUN_FRESH:
            answer = begun[1]
        num_bytes = max(int(block["num_bytes"]), max(o + len(d) for o, d in ranges))
        while True:
            if answer is None:
                answer = await client.call_meta("patch_block", {
                    "path": self.path, "client_name": client.client_name, "ino": self.ino,
                    "block": {"id": block["id"], "gs": block["gs"]}})
                fresh = True
            else:
                fresh = False
            new, locations, failed = await self._send_to_all(block, answer, ranges)
            nodes = tuple(n["node_id"] for n in locations if n["node_id"] not in failed)
            if nodes or fresh:
                break
            # the replicas a begun stamp came with all failed: they may have moved since
            # (a server died, the block was copied elsewhere); once more, as patch_block
            # sees them now (its new stamp supersedes the begun one)
            answer = None
        if not nodes:
            raise PipelineError(f"{self.path}: no block server took the patch of block "
                                f"{block['id']}: " + "; ".join(
                                    f"{k}: {v}" for k, v in failed.items()))
        for node_id, cause in failed.items():
            log.warning("%s: block %d: %s missed the patch (%s)", self.path, block["id"],
                        node_id, cause)
        if failed:
            nodes += await self._replace(block, new["gs"], num_bytes, locations, nodes,
                                         list(failed))
        done = await client.call_meta("patch_done", {
            "path": self.path, "client_name": client.client_name, "ino": self.ino,
            "block": {"id": block["id"], "gs": new["gs"], "num_bytes": num_bytes},
            "nodes": list(nodes), "begin_next": more})
        if isinstance(done, dict) and isinstance(done.get("next"), dict):
            self._begun[block["id"]] = (trio.current_time(), done["next"])
        self.blocks[index] = {**located, "block": {**block, "gs": new["gs"],
                                                   "num_bytes": num_bytes},
                              "locations": [n for n in locations if n["node_id"] in nodes]}
        self.length = max(self.length, index * self.block_size + num_bytes)
        return PatchedBlock(block["id"], new["gs"], num_bytes, nodes, failed)

    async def _send_to_all(self, block: dict, answer: dict, ranges):
        """The patch ``ranges`` of ``block`` to every location of ``answer`` (a patch_block
        answer) at once, no chain: one hop each, as the one-shot write. Returns the new
        block, the locations and the failed ones (node id → cause)."""
        client = self._client
        new = answer["block"]
        locations = answer["locations"]
        failed: dict[str, str] = {}

        async def one(node: dict) -> None:
            try:
                status = (await send_patch(
                    client.config, [node["address"]], block["id"], block["gs"], new["gs"],
                    self.block_size, ranges, answer.get("token"), tls=client.tls,
                    client_name=client.client_name))[0]
            except LeaseFSError as exc:
                failed[node["node_id"]] = str(exc)
                return
            if status != SUCCESS:
                failed[node["node_id"]] = ("checksum error in flight" if status == ERROR_CHECKSUM
                                           else "unreachable, or it refused the patch")

        async with trio.open_nursery() as nursery:
            for node in locations:
                nursery.start_soon(one, node)
        return new, locations, failed

    async def extend(self, chunks) -> "PatchableFile":
        """Append ``chunks`` (an async iterable of bytes, in order) past ``capacity``: the
        last block is full (or the file is empty), so an ordinary stream adds the blocks
        after it. The stream's close completes the file; it is then taken again for
        patches, and the object returned holds the lease (this one is done)."""
        self._check()
        if self.length != self.capacity:
            raise InvalidArgument(f"{self.path}: extend past a last block of "
                                  f"{self.length - (len(self.blocks) - 1) * self.block_size} "
                                  f"bytes: patch it up to the block size first")
        client = self._client
        stream = client.new_output(self.path, self._status)
        if self.blocks:
            last = self.blocks[-1]["block"]
            stream.continue_from(self.length, previous={
                "id": last["id"], "gs": last["gs"], "num_bytes": last["num_bytes"]})
        self._closed = True
        client.output_closed(self)
        try:
            async for chunk in chunks:
                await stream.write(chunk)
            await stream.hsync()
            await stream.close()
        except BaseException as exc:
            stream.abort(exc if isinstance(exc, LeaseFSError)
                         else LeaseFSError(f"{self.path}: extend interrupted"))
            raise
        return await open_for_patch(client, self.path)

    async def _replace(self, block: dict, gs: int, num_bytes: int, locations: list[dict],
                       nodes: tuple, failed: list[str]) -> tuple:
        """New replicas in place of those that missed a patch, before it is committed
        (HDFS's replace-datanode-on-failure, for a finished block): for each, a block
        server from ``get_additional_datanode`` gets a copy of the new version from one
        that took the patch. Nothing else patches this block meanwhile (this writer holds
        the file), so the copy is of the version committed next. A copy that fails leaves
        the block with fewer replicas, which the metadata server's replication restores;
        the patch goes on. Returns the node ids added."""
        client = self._client
        config = client.config
        sources = [n for n in locations if n["node_id"] in nodes]
        added: list[str] = []
        excluded = list(failed)
        for _ in failed:
            try:
                answer = await client.call_meta("get_additional_datanode", {
                    "path": self.path, "ino": self.ino,
                    "block": {"id": block["id"], "gs": gs, "num_bytes": num_bytes},
                    "existing": [n["node_id"] for n in sources] + added,
                    "excluded": excluded, "num": 1, "client_name": client.client_name})
            except LeaseFSError as exc:
                log.warning("%s: block %d: no replacement for a replica that missed the "
                            "patch: %s", self.path, block["id"], exc)
                break
            targets = answer.get("locations") or []
            if not targets:
                break
            target = targets[0]
            for source in sources:
                try:
                    await transfer_finalized(
                        source, target, {"id": block["id"], "gs": gs, "num_bytes": num_bytes},
                        client_name=client.client_name, timeout=config.data_timeout,
                        connect_timeout=config.data_connect_timeout,
                        max_frame=config.max_frame, tls=client.tls, token=answer.get("token"))
                except LeaseFSError as exc:
                    log.warning("%s: block %d: copy from %s to %s failed: %s", self.path,
                                block["id"], source["node_id"], target["node_id"], exc)
                    continue
                added.append(target["node_id"])
                log.info("%s: block %d: copied to %s in place of a replica that missed the "
                         "patch", self.path, block["id"], target["node_id"])
                break
            else:
                excluded.append(target["node_id"])
        return tuple(added)

    async def rewrite(self):
        """Start the file over, empty, under the same lease (``rewrite``), and return the
        output stream that takes its content from offset 0; this object is done."""
        self._check()
        client = self._client
        status = await client.call_meta("rewrite", {
            "path": self.path, "client_name": client.client_name, "ino": self.ino})
        self._closed = True
        client.output_closed(self)
        return client.new_output(self.path, status)

    async def close(self, *, mtime_ns: int | None = None) -> None:
        """Close the file (``complete`` with its last block as it is now)."""
        self._check()
        last = self.blocks[-1]["block"] if self.blocks else None
        args = {"path": self.path, "client_name": self._client.client_name, "ino": self.ino,
                "last": ({"id": last["id"], "gs": last["gs"], "num_bytes": last["num_bytes"]}
                         if last else None)}
        if mtime_ns is not None:
            args["mtime_ns"] = mtime_ns
        # its blocks were complete before: only a replica count below the minimum after a
        # patch that reached fewer nodes keeps it open, retried as a writer's close is
        await complete_file(self._client.call_meta, self.path, args,
                            self._client.config.complete_retries)
        self._closed = True
        self._client.output_closed(self)

    def abort(self, exc: LeaseFSError) -> None:
        """Stop at once (lease lost, client closing): the file stays open until lease
        recovery, which ends every block at one complete version."""
        self._error = self._error or exc
        self._closed = True
        self._client.output_closed(self)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise InvalidArgument(f"{self.path}: closed")


async def open_for_patch(client, path: str) -> PatchableFile:
    """Take ``path``'s lease for patches (``append`` with ``patch``: no block reopened)."""
    path = paths.validate(path)
    answer = await client.call_meta("append", {"path": path, "client_name": client.client_name,
                                               "patch": True})
    pf = PatchableFile(client, path, answer)
    client.track_output(pf)
    return pf
