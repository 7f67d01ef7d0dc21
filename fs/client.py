"""The public leasefs client: ``AsyncClient`` (trio) and ``Client`` (blocking facade).

Why: the shell tools, the FUSE mount, the fsspec filesystem and the Spark connector are all
built on this one API, which mirrors Hadoop's ``FileSystem`` (DESIGN.md §6). One client is
one lease holder (``leasefs-client-<uuid hex>``): its lease renewer keeps every file it has
open for writing alive, and closing the client closes those files.

Namespace calls are single RPCs to the metadata server (``fs.rpc.RpcClient`` retries lost
connections with the same call id, so mutating calls are applied once). Data goes through
the streams of ``fs.streams`` (output: ``fs.writer``, input: ``fs.reader``). On entry the
client asks the server for its defaults (``get_server_defaults``) and merges them into
``config``, so block size, checksum chunk, packet size and lease limits always match the
cluster.

Concurrency contract: an ``AsyncClient`` must be used as ``async with AsyncClient(...) as c``
inside one trio run; any number of its tasks may call it at once. Its background tasks
(RPC reader, pipeline responders, lease renewer) live in a nursery it opens on entry and
never raise into it. ``Client`` runs an ``AsyncClient`` in ``trio.run`` on a daemon thread
and forwards each call with ``trio.from_thread.run``: it may be called from any number of
plain threads, but never from inside a trio run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

import trio

from . import paths, tcpliveness
from . import tls as tlsmod
from .config import Config, cluster_client_settings, find_meta_address
from .errors import (FileNotFound, InvalidArgument, LeaseFSError, NotDirectory, SafeMode,
                     ServerUnavailable, TryAgain, sole_exception)
from .renewer import LeaseRenewer
from .status import LIST_PAGE, FileStatus, iter_pages
from . import trash
from .delegation import TokenFile
from .observer import ObserverReads, find_observers
from .rpc import (RetryPolicy, RpcClient, StateAlignment, check_identity, current_groups,
                  current_user, format_address_list, normalize_address_list,
                  parse_address_list)

log = logging.getLogger(__name__)

#: the data path (``fs.streams`` and what it needs: block connections, CRC32C) is imported
#: on first use, so a client that only makes namespace calls (``leasefs ls``) starts faster
_STREAMS = ("AsyncInputStream", "AsyncOutputStream", "InputStream", "OutputStream")


def __getattr__(name: str):
    if name in _STREAMS:
        from . import streams
        return getattr(streams, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _output_class():
    """``AsyncOutputStream``, imported at the first output stream and kept: an import
    statement run per stream costs a lookup each time (a mount creating small files makes
    thousands)."""
    from .streams import AsyncOutputStream
    return AsyncOutputStream


__all__ = ["AsyncClient", "Client", "FileSettings", "FileStatus", "Changed", "Moved",
           "AsyncInputStream", "AsyncOutputStream", "InputStream", "OutputStream"]

#: server defaults (``get_server_defaults``) that override the client's own config
SERVER_DEFAULT_KEYS = ("block_size", "replication", "min_replication", "bytes_per_checksum",
                       "packet_size", "write_window_packets", "lease_soft_limit",
                       "lease_hard_limit", "max_blocks_per_file", "inline_max")


@dataclass(frozen=True)
class FileSettings:
    """What a client chooses per file at create (HDFS ``dfs.blocksize``, ``dfs.replication``,
    ``dfs.bytes-per-checksum``); None = the cluster's default."""

    block_size: int | None = None
    replication: int | None = None
    bytes_per_checksum: int | None = None

    @classmethod
    def chosen_in(cls, config: Config, chosen) -> "FileSettings":
        """The per-file settings of ``config`` that were given explicitly (names in
        ``chosen``, e.g. ``Config.chosen(...)``); the others stay the cluster's."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if f.name in chosen})

    def check(self, what: str) -> None:
        """``InvalidArgument`` naming ``what`` for a checksum chunk the block size does not
        hold a whole number of times (the metadata server checks the rest)."""
        bpc = self.bytes_per_checksum
        if bpc is None:
            return
        if isinstance(bpc, bool) or not isinstance(bpc, int) or bpc <= 0:
            raise InvalidArgument(f"{what}: bytes_per_checksum must be a positive integer, "
                                  f"got {bpc!r}")
        if self.block_size is not None and self.block_size % bpc:
            raise InvalidArgument(f"{what}: block_size {self.block_size} is not a multiple of "
                                  f"bytes_per_checksum {bpc}")


def _status(answer) -> FileStatus | None:
    return FileStatus.from_wire(answer) if isinstance(answer, dict) else None


@dataclass(frozen=True)
class Changed:
    """What a one-call namespace change (``mkdir``, ``symlink``, ``unlink``, ``rmdir``)
    answers: the inode's status (as it was, when it is gone) and its parent directory's
    after the change (None from a server that does not send it)."""

    status: FileStatus
    parent: FileStatus | None
    # ``mkdir(lease=True)``: the new directory's lease (``dir_lease_acquire``'s answer)
    lease: dict | None = None

    @classmethod
    def from_wire(cls, obj: dict) -> "Changed":
        lease = obj.get("lease")
        return cls(FileStatus.from_wire(obj["status"]), _status(obj.get("parent")),
                   lease if isinstance(lease, dict) else None)


@dataclass(frozen=True)
class Moved:
    """What ``AsyncClient.move`` did: the moved inode's status at its new path, the
    statuses of its new and old parent directories after the move, and the status of the
    destination it replaced (None when there was none)."""

    status: FileStatus
    parent: FileStatus | None
    src_parent: FileStatus | None
    replaced: FileStatus | None


def _want(want_status: bool) -> dict:
    # sent only when asked, so an older server that does not know the argument still works
    return {"want_status": True} if want_status else {}


def _meta_address(meta_address: str | None, config: Config | None) -> str:
    """The metadata server (or HA list of them, ``"h1:p1,h2:p2"``) to use, checked and
    written canonically; InvalidArgument names a bad entry."""
    if meta_address is not None:
        return normalize_address_list(meta_address)
    if config is not None and config.meta_address != Config().meta_address:
        return normalize_address_list(config.meta_address)
    return normalize_address_list(find_meta_address())


def meta_connection(meta_address: str | None = None, *, config: Config | None = None,
                    name: str = "leasefs-shared", user: str | None = None,
                    groups: list[str] | None = None,
                    retry_policy: RetryPolicy | None = None) -> RpcClient:
    """One RPC connection to the metadata server that several ``AsyncClient``s of this trio
    thread can share (``AsyncClient(rpc=...)``), as Hadoop IPC shares one connection among
    all DFSClients of a JVM with the same server and user: the calls of many clients then
    travel in batches (see ``fs.framing.FrameChannel``). Use as ``async with``; it outlives
    the clients that use it."""
    config = config if config is not None else Config.load()
    address = _meta_address(meta_address, config)
    return RpcClient(
        address, name, timeout=config.rpc_timeout,
        retry_seconds=config.rpc_retry_seconds, max_frame=config.max_frame,
        # a restarting metadata server (safe mode) or a request whose path kept moving
        # under it: wait and send it again, as HDFS does
        retry_errors=(SafeMode, TryAgain), user=user, groups=groups,
        sync_metadata=config.sync_metadata, tls=tlsmod.client(config),
        # observer reads: replies and calls carry state ids (read-your-writes)
        alignment=StateAlignment() if config.observer_reads else None,
        retry_policy=retry_policy, silence=config.rpc_silence,
        **authentication(config, address))


def authentication(config: Config, address: str) -> dict:
    """How an ``RpcClient`` to the metadata server at ``address`` (or to each of an HA
    list) proves who its user is (security = secure): the server's local socket when it is
    on this machine, else the configured delegation token. Arguments for ``RpcClient``,
    which fills in the ``meta_socket`` setting for each address of the list."""
    parse_address_list(address)   # a bad entry is named here, before any token is read
    return {"local_socket": config.meta_socket or None,
            "token": TokenFile.load(config.token_file) if config.token_file else None}


class AsyncClient:
    """The trio client. ``async with AsyncClient(address) as client: ...``.

    ``user``/``groups``: the identity the metadata server checks permissions against
    (HDFS simple authentication); default the calling process's user and group names.
    ``rpc``: a shared ``meta_connection`` to use instead of a connection of its own (the
    identity is then the connection's)."""

    def __init__(self, meta_address: str | None = None, *, config: Config | None = None,
                 client_name: str | None = None, user: str | None = None,
                 groups: list[str] | None = None, rpc: RpcClient | None = None,
                 retry_policy: RetryPolicy | None = None):
        if config is None:   # the embedded cluster it finds brings its TLS settings
            config = Config().replace(**{
                **(cluster_client_settings() if meta_address is None and rpc is None else {}),
                **Config.chosen()})
        self.config = config
        tcpliveness.configure(config.tcp_liveness_timeout)
        self.client_name = client_name or f"leasefs-client-{uuid.uuid4().hex}"
        if rpc is not None:
            if (user is not None and user != rpc.user) or \
                    (groups is not None and list(groups) != rpc.groups):
                raise InvalidArgument(f"client {self.client_name}: a shared connection "
                                      f"carries its own identity ({rpc.user})")
            user, groups = rpc.user, rpc.groups
            meta_address = format_address_list(rpc.addresses)
        self.meta_address = _meta_address(meta_address, config)
        self.user, identity_groups = check_identity(
            current_user() if user is None else user,
            current_groups() if groups is None else list(groups), "client identity")
        self.groups = list(identity_groups)
        self._shared_rpc = rpc
        # how its own connection retries (``fs.rpcclient.RetryPolicy``; the CLI's says a
        # refused connection at once and prints what it retries)
        self._retry_policy = retry_policy
        # tls = on: how data connections (and a connection of its own to the metadata
        # server) verify servers; None when off
        self.tls = tlsmod.client(self.config)
        self.server_defaults: dict = {}
        self.rpc: RpcClient | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._renewer: LeaseRenewer | None = None
        self._outputs: dict[int, AsyncOutputStream] = {}
        self._closed = False
        # pipeline recoveries its output streams went through (a mount's metrics show them)
        self.pipeline_recoveries = 0
        # ``fs.observer.ObserverReads`` with observer_reads on and an observer found
        self.observer_reads: ObserverReads | None = None
        # awaited with (method, args) before every call on the metadata server but the
        # lease calls: a mount holding directory leases sends the changes it made ahead
        # of the server first, so the server answers each of its calls with them applied
        self.barrier: Callable[[str, dict], Awaitable[None]] | None = None

    @functools.cached_property
    def avoided(self):
        """The block servers this client's reads could not reach lately, which every input
        stream tries last (``fs.dataconn.AvoidedNodes``; imported with the data path)."""
        from .dataconn import AvoidedNodes
        return AvoidedNodes(self.config.data_avoid_interval)

    # ------------------------------------------------------------------ life cycle
    async def __aenter__(self) -> "AsyncClient":
        if self._stack is not None:
            raise InvalidArgument("an AsyncClient can be entered only once")
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        self._stack = stack
        try:
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            # runs after the RPC client closed, just before the nursery waits for its tasks
            stack.callback(self._nursery.cancel_scope.cancel)
            self.rpc = self._shared_rpc or await stack.enter_async_context(meta_connection(
                self.meta_address, config=self.config, name=self.client_name,
                user=self.user, groups=self.groups, retry_policy=self._retry_policy))
            self.server_defaults = await self.rpc.call("get_server_defaults", {})
            overrides = {k: self.server_defaults[k] for k in SERVER_DEFAULT_KEYS
                         if self.server_defaults.get(k) is not None}
            # A cluster too small to find replacement block servers says so (HDFS advises
            # clusters of 3 nodes or less not to insist); a client may ask for it itself too.
            if self.server_defaults.get("replace_datanode_best_effort"):
                overrides["replace_datanode_best_effort"] = True
            self.config = self.config.replace(**overrides)
            self._renewer = LeaseRenewer(
                self._renew_lease, holder=self.client_name, period=self.config.renew_period,
                hard_limit=self.config.lease_hard_limit, nursery=self._nursery)
            if self.config.observer_reads and self.rpc.alignment is not None \
                    and len(self.rpc.addresses) > 1:
                await self._start_observer_reads(stack)
        except BaseException as exc:
            self._closed = True
            try:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseException as group:
                inner = sole_exception(group)
                if inner is not exc:
                    raise inner from None
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        try:
            await self.aclose()
        finally:
            try:
                suppressed = await self._stack.__aexit__(exc_type, exc, tb)
            except BaseException as group:
                inner = sole_exception(group)
                if exc is not None and inner is exc:
                    return False  # the body's own exception, unwrapped from trio's groups
                if inner is not group:
                    raise inner from None
                raise
        return bool(suppressed)

    async def aclose(self) -> None:
        """Close every open output stream (completing its file), then refuse new calls.
        The connection itself closes when the ``async with`` block ends."""
        if self._closed:
            return
        self._closed = True
        for stream in list(self._outputs.values()):
            try:
                await stream.close()
            except LeaseFSError as exc:
                log.warning("closing %s while closing the client: %s", stream.path, exc)

    def _check_open(self) -> None:
        if self.rpc is None:
            raise InvalidArgument("AsyncClient must be used as 'async with AsyncClient(...)'")
        if self._closed:
            raise InvalidArgument(f"client {self.client_name} is closed")

    async def _start_observer_reads(self, stack: contextlib.AsyncExitStack) -> None:
        """Reads go to the list's observers from now on (``fs.observer``), sharing the
        active connection's state ids."""
        auth = authentication(self.config, self.meta_address)
        found = await find_observers(self.meta_address, tls=self.tls, **auth)
        if not found:
            log.info("observer_reads: no observer among %s; reads go to the active",
                     self.meta_address)
            return
        observers = await stack.enter_async_context(RpcClient(
            ",".join(found), self.client_name, timeout=self.config.rpc_timeout,
            retry_seconds=0, max_frame=self.config.max_frame, user=self.user,
            groups=self.groups, sync_metadata=self.config.sync_metadata, tls=self.tls,
            alignment=self.rpc.alignment, **auth))
        self.observer_reads = ObserverReads(self.rpc, observers)

    async def msync(self) -> int:
        """HDFS msync: after it, this client's reads (on an observer too) see everything
        the active had acknowledged when it answered; the active's state id."""
        self._check_open()
        return (await self.rpc.call("msync", {}))["state_id"]

    async def call_meta(self, method: str, args: dict, **kwargs):
        """A call of the write or read path (``fs.writer``, ``fs.reader``) on the
        metadata server, after the ``barrier``."""
        if self.barrier is not None:
            await self.barrier(method, args)
        return await self.rpc.call(method, args, **kwargs)

    async def _call(self, method: str, **args):
        self._check_open()
        if self.barrier is not None:
            await self.barrier(method, args)
        if self.observer_reads is not None:
            return await self.observer_reads.call(method, args)
        return await self.rpc.call(method, args)

    async def _renew_lease(self):
        return await self.rpc.call("renew_lease", {"client_name": self.client_name},
                                   retry_seconds=0)

    def new_output(self, path: str, status: dict, *,
                    bytes_per_checksum: int | None = None) -> AsyncOutputStream:
        """A stream for a file this client now holds the lease of, kept alive by the
        renewer until it closes."""
        stream = _output_class()(self, path, status, bytes_per_checksum=bytes_per_checksum)
        self.track_output(stream)
        return stream

    def track_output(self, stream) -> None:
        """``stream`` (an output stream, or another writer of a file this client holds
        the lease of, with ``path``, ``abort`` and ``close``) is open: the renewer keeps
        the lease alive and ``aclose`` closes it, until ``output_closed``."""
        self._outputs[id(stream)] = stream
        self._renewer.add(stream)

    def output_closed(self, stream: AsyncOutputStream) -> None:
        self._outputs.pop(id(stream), None)
        if self._renewer is not None:
            self._renewer.remove(stream)

    @property
    def nursery(self) -> trio.Nursery:
        """The client's task group, open while it is: streams start their pipelines' ack
        readers in it."""
        return self._nursery

    @property
    def open_output_streams(self) -> list[AsyncOutputStream]:
        return list(self._outputs.values())

    # ------------------------------------------------------------------ files
    async def create(self, path: str, *, overwrite: bool = False, replication: int | None = None,
                     block_size: int | None = None, permission: int = 0o644,
                     create_parent: bool = True, owner: str | None = None,
                     group: str | None = None, bytes_per_checksum: int | None = None,
                     want_parent: bool = False, first_block: bool = False) -> AsyncOutputStream:
        """Create ``path`` for writing (lease held by this client); ``FileExists`` if it
        exists and not ``overwrite``. ``owner``/``group``: superuser only (the mount passes
        the calling process's identity). ``replication``/``block_size``/
        ``bytes_per_checksum``: this file's own (None: the cluster's default).
        ``want_parent``: the stream's ``created_parent`` is the parent directory's status
        after the create (same call). ``first_block``: the create also allocates the first
        block (one call fewer for a file that gets data; a file closed empty gives it back
        with ``abandon_block``)."""
        path = paths.validate(path)
        FileSettings(block_size, replication, bytes_per_checksum).check(path)
        answer = await self._call("create", path=path, client_name=self.client_name,
                                  overwrite=overwrite, create_parent=create_parent,
                                  replication=replication, block_size=block_size,
                                  permission=permission, owner=owner, group=group,
                                  **_want(want_parent),
                                  **({"first_block": True} if first_block else {}))
        status = answer["status"] if want_parent or first_block else answer
        stream = self.new_output(path, status, bytes_per_checksum=bytes_per_checksum)
        if first_block:
            stream.set_first_block(answer.get("first_block"))
        if want_parent:
            stream.created_parent = _status(answer.get("parent"))
        return stream

    async def append(self, path: str) -> AsyncOutputStream:
        """Open the existing file ``path`` for appending (lease held by this client;
        ``AlreadyBeingCreated``/``RecoveryInProgress`` while another writer holds it).

        A partial last block is reopened under the new generation stamp ``append`` hands
        out (its last checksum chunk is reread and rewritten); a full last block, or an
        empty file, goes on with a new block. ``pos`` starts at the file's length."""
        path = paths.validate(path)
        before = await self._last_block(path)   # the stamp the replicas carry now
        result = await self._call("append", path=path, client_name=self.client_name)
        status, last = result["status"], result.get("last_block")
        stream = self.new_output(path, status)
        try:
            if result.get("inline") is not None:
                stream.start_with(result["inline"])
            elif last is not None:
                same = before is not None and before["block"]["id"] == last["block"]["id"]
                await stream.setup_append(last, before["block"]["gs"] if same else 0,
                                           before.get("token") if same else None)
                stream.continue_from(int(last["offset"]) + int(last["block"]["num_bytes"]))
            else:
                located = await self._last_block(path)
                if located is not None:
                    b = located["block"]
                    stream.continue_from(int(located["offset"]) + int(b["num_bytes"]),
                                         previous={"id": b["id"], "gs": b["gs"],
                                                   "num_bytes": b["num_bytes"]})
        except BaseException as exc:
            stream.abort(exc if isinstance(exc, LeaseFSError) else LeaseFSError(
                f"{path}: append interrupted ({type(exc).__name__})"))
            await self.give_back(path, "append")
            raise
        return stream

    async def open_for_patch(self, path: str):
        """Take ``path``'s lease for in-place writes into its complete blocks
        (``fs.patchfile.PatchableFile``: ``patch``, ``close``); no block is reopened."""
        from .patchfile import open_for_patch
        return await open_for_patch(self, path)

    async def give_back(self, path: str, what: str) -> None:
        """A write that failed for good (``what``: an append that could not set up its
        pipeline, a close refused) gives the file back at once: lease recovery of our own
        file closes it now, or by block recovery of the last block, instead of leaving it
        open under our lease, which the renewer keeps alive while any other file is open.
        Never raises (logged)."""
        with trio.CancelScope(shield=True), trio.move_on_after(self.config.rpc_timeout):
            try:
                await self.recover_lease(path)
            except LeaseFSError as exc:
                log.warning("%s: the failed %s could not give the file back (%s); it "
                            "stays open until its lease expires", path, what, exc)

    async def _last_block(self, path: str) -> dict | None:
        """The located last block of ``path`` (None for an empty file)."""
        status = await self._call("get_file_info", path=path)
        length = int(status.get("length") or 0)
        info = await self._call("get_block_locations", path=path, offset=max(0, length - 1),
                                length=1)
        blocks = sorted(info.get("blocks") or [], key=lambda lb: lb["offset"])
        return blocks[-1] if blocks else None

    async def truncate(self, path: str, new_length: int) -> bool:
        """Cut the closed file ``path`` to ``new_length`` bytes. True: done (the length
        fell on a block boundary). False: the last block is being recovered to the new
        length; the file closes by itself (``is_file_closed`` turns True)."""
        if isinstance(new_length, bool) or not isinstance(new_length, int) or new_length < 0:
            raise InvalidArgument(f"{path}: truncate length must be a non-negative integer, "
                                  f"got {new_length!r}")
        return bool(await self._call("truncate", path=paths.validate(path),
                                     new_length=new_length, client_name=self.client_name))

    async def recover_lease(self, path: str) -> bool:
        """Force lease recovery of ``path`` (HDFS ``recoverLease``): True once the file is
        closed, False while block recovery runs (call again)."""
        return bool(await self._call("recover_lease", path=paths.validate(path),
                                     client_name=self.client_name))

    # ------------------------------------------------------------------ directory leases
    async def dir_lease_acquire(self, path: str, *, want_inos: int = 0,
                                below: int = 0) -> dict:
        """A write lease on directory ``path`` for this client (docs/design/dirleases.md):
        ``{epoch, attrs, entries, inos}`` (the directory's status and every entry's, and
        ``[first, count]``: inode numbers reserved for the files this client creates there
        under the lease, at most ``want_inos``; count 0 when none are), or
        ``{epoch: None, reason}`` when the server does not lease it. ``below``: leases on
        up to that many folders below it too, as ``below: [{path, epoch, attrs, entries,
        inos}]``."""
        self._check_open()
        return await self.rpc.call("dir_lease_acquire", {
            "path": paths.validate(path), "client_name": self.client_name,
            **({"want_inos": want_inos} if want_inos else {}),
            **({"below": below} if below else {})})

    async def dir_lease_release(self, path: str, epoch: int) -> bool:
        """Give back the lease ``epoch`` on ``path``; ``LeaseExpired`` if it had ended."""
        self._check_open()
        return bool(await self.rpc.call("dir_lease_release", {
            "path": paths.validate(path), "client_name": self.client_name, "epoch": epoch}))

    async def dir_lease_events(self, wait: float = 30.0, ack=None) -> list[dict]:
        """The events of this client's directory leases (``{path, epoch, ino, kind}``
        each; ``recall``: give it back; ``ended``: the server ended it), waiting up to
        ``wait`` seconds (at most 30) for one; [] if none came. ``ack``: the ``[epoch,
        kind]`` pairs acted on since the last poll; with it, events are answered again
        until acknowledged (without it, once)."""
        self._check_open()
        args = {"client_name": self.client_name, "wait": wait}
        if ack is not None:
            args["ack"] = ack
        return await self.rpc.call("dir_lease_events", args)

    async def dir_batch(self, ops) -> dict:
        """Send changes made ahead of the server under this client's directory leases
        (``fs.dirops`` records, in the order they were acknowledged); ``{done, skipped,
        failed: [{index, error}], ended}`` (PROTOCOL.md §2). Safe to send again after a
        lost reply: what was applied is skipped."""
        self._check_open()
        return await self.rpc.call("dir_batch", {
            "client_name": self.client_name,
            "ops": [op.to_wire() if hasattr(op, "to_wire") else op for op in ops]
            if isinstance(ops, list) else ops})   # the server says what is wrong with it

    # ------------------------------------------------------------------ file locks
    async def lock_get(self, ino: int, owner: int, kind: str, start: int, end: int) -> dict:
        """``{conflict}``: another owner's POSIX lock a ``kind`` lock of ``[start, end)``
        on file ``ino`` by lock owner ``owner`` of this client would meet (None: none)."""
        self._check_open()
        return await self.call_meta("lock_get", {
            "client_name": self.client_name, "ino": ino, "owner": owner, "kind": kind,
            "start": start, "end": end})

    async def lock_set(self, ino: int, owner: int, kind: str, *, style: str = "posix",
                       start: int = 0, end: int | None = None, pid: int = 0,
                       wait: float = 0) -> dict:
        """Take, convert or drop a lock (``kind`` read, write or unlock; ``style`` posix or
        flock): ``{granted, conflict, held}``; waits up to ``wait`` seconds (the server
        answers within 10 s at most: ask again)."""
        self._check_open()
        args = {"client_name": self.client_name, "ino": ino, "owner": owner, "kind": kind,
                "style": style, "pid": pid, "wait": wait}
        if style == "posix":
            args["start"] = start
            if end is not None:
                args["end"] = end
        return await self.call_meta("lock_set", args)

    async def lock_release(self, ino: int, owner: int, *, style: str = "posix") -> bool:
        """Drop every lock of ``style`` lock owner ``owner`` holds on file ``ino``."""
        self._check_open()
        return bool(await self.call_meta("lock_release", {
            "client_name": self.client_name, "ino": ino, "owner": owner, "style": style}))

    async def lock_release_all(self) -> int:
        """Drop every lock this client holds (unmount)."""
        self._check_open()
        return int(await self.rpc.call("lock_release_all", {"client_name": self.client_name}))

    async def lock_hold(self, held: int) -> dict:
        """A lock holder's check (``held``: how many locks it holds): ``{reclaim}``, true
        when the server lost its locks (a restart, a failover) and ``lock_reclaim`` must
        give them back to it."""
        self._check_open()
        return await self.rpc.call("lock_hold", {"client_name": self.client_name,
                                                 "held": held})

    async def lock_reclaim(self, locks: list[dict]) -> dict:
        """Take back every lock this client holds (``{ino, owner, kind, style, start, end,
        pid}`` each) after the server lost them: ``{lost: [index]}``, the ones another
        owner took meanwhile."""
        self._check_open()
        return await self.rpc.call("lock_reclaim", {"client_name": self.client_name,
                                                    "locks": locks})

    async def renew_lease(self) -> None:
        """Renew this client's lease (and so its locks) now."""
        self._check_open()
        await self._renew_lease()

    async def is_file_closed(self, path: str) -> bool:
        """True unless ``path`` is a file under construction."""
        return not (await self.get_file_status(path)).under_construction

    async def list_open_files(self, path: str = "/") -> list[dict]:
        """Files under construction below ``path``: ``[{path, ino, holder, client_machine,
        last_renewal_age, last_block_state}]`` (``leasefs leases``)."""
        return list(await self._call("list_open_files", path=paths.validate(path)))

    open_files = list_open_files

    async def open(self, path: str, *, located: dict | None = None) -> AsyncInputStream:
        """Open ``path`` for reading (seekable; ``pread`` for positional reads).
        ``located``: the file's block locations already fetched (``FileStatus.locations``),
        which spares the call that would fetch them."""
        from .streams import AsyncInputStream
        self._check_open()
        return await AsyncInputStream.open(self, paths.validate(path), located=located)

    async def write_file(self, path: str, data: bytes, **create_kw) -> None:
        """Create ``path`` with ``data`` as its whole content and close it."""
        stream = await self.create(path, **create_kw)
        async with stream:
            await stream.write(data)

    async def read_file(self, path: str) -> bytes:
        """The whole content of ``path``."""
        async with await self.open(path) as stream:
            return await stream.read()

    async def get_block_locations(self, path: str, offset: int = 0,
                                  length: int | None = None) -> dict:
        """``{length, under_construction, blocks: [located block], last_block_complete}``."""
        return await self._call("get_block_locations", path=paths.validate(path),
                                offset=offset, length=length)

    async def get_file_checksum(self, path: str) -> dict:
        """HDFS getFileChecksum, COMPOSITE-CRC: ``{"algorithm": "COMPOSITE-CRC32C", "crc":
        "8 hex digits", "length": n}``, the CRC32C of the content whatever its block and chunk
        sizes, combined on the block servers from stored chunk CRCs (``fs.checksum``)."""
        from .checksum import file_checksum
        self._check_open()
        return await file_checksum(self, paths.validate(path))

    # ------------------------------------------------------------------ namespace
    async def mkdirs(self, path: str, permission: int = 0o755, *, owner: str | None = None,
                     group: str | None = None) -> bool:
        """Create ``path`` and missing parents; True also if it already is a directory."""
        return bool(await self._call("mkdirs", path=paths.validate(path), permission=permission,
                                     owner=owner, group=group))

    async def mkdir(self, path: str, permission: int = 0o755, *, owner: str | None = None,
                    group: str | None = None, lease: bool = False,
                    want_inos: int = 0) -> "Changed":
        """POSIX mkdir(2) in one call: ``FileExists`` if ``path`` exists, ``FileNotFound``
        if its parent does not; the new directory's status and its parent's. ``lease``:
        also the new directory's write lease for this client (``Changed.lease``, with up
        to ``want_inos`` inode numbers reserved, as ``dir_lease_acquire``)."""
        args = {}
        if lease:
            args["dir_lease"] = self.client_name
            if want_inos:
                args["dir_lease_inos"] = want_inos
        return Changed.from_wire(await self._call(
            "mkdirs", path=paths.validate(path), permission=permission, owner=owner,
            group=group, create_parent=False, exclusive=True, want_status=True, **args))

    async def symlink(self, target: str, path: str, *, owner: str | None = None,
                      group: str | None = None) -> "Changed":
        """symlink(2) in one call: ``create_symlink`` answering the link's status and its
        parent's."""
        return Changed.from_wire(await self._call(
            "create_symlink", target=target, path=paths.validate(path), create_parent=False,
            owner=owner, group=group, want_status=True))

    async def get_file_status(self, path: str, *, locations: bool = False) -> FileStatus:
        """Status of ``path`` (symlinks not followed); ``FileNotFound`` if missing.
        ``locations``: a readable file's status also carries its block locations."""
        args = {"path": paths.validate(path)}
        if locations:
            args["locations"] = True
        return FileStatus.from_wire(await self._call("get_file_info", **args))

    async def exists(self, path: str) -> bool:
        try:
            await self.get_file_status(path)
        except (FileNotFound, NotDirectory):
            return False
        return True

    async def list_page(self, path: str, start_after: str = "",
                         limit: int | None = None) -> tuple[list[FileStatus], bool]:
        """One page of a directory's entries sorted by name, those after ``start_after``
        (at most ``limit``), and whether more follow."""
        page = await self._call("list_status", path=paths.validate(path),
                                start_after=start_after, limit=limit or LIST_PAGE)
        return [FileStatus.from_wire(e) for e in page["entries"]], bool(page.get("has_more"))

    async def iter_status(self, path: str):
        """Entries of a directory sorted by name (a file yields itself), fetched page by page."""
        start_after = ""
        while True:
            entries, more = await self.list_page(path, start_after)
            for entry in entries:
                yield entry
            if not more or not entries:
                return
            start_after = entries[-1].name

    async def list_status(self, path: str) -> list[FileStatus]:
        """All entries of a directory (all pages); a file lists itself."""
        return [entry async for entry in self.iter_status(path)]

    async def sync_metadata(self) -> int:
        """Wait until every namespace change the metadata server has answered so far (this
        client's and everyone's) is on its disk; returns the durable txid. Needed only with
        the ``sync_metadata`` setting off (a mount's fsync(2) of a folder); an hsync does it
        for its file's changes and everything before them."""
        return await self._call("sync_metadata")

    async def delete(self, path: str, recursive: bool = False) -> bool:
        """Delete a file or directory (a non-empty one only with ``recursive``). Missing
        paths raise ``FileNotFound``; returns True."""
        return bool(await self._call("delete", path=paths.validate(path), recursive=recursive))

    @property
    def trash_interval(self) -> float:
        """Minutes a path removed with ``move_to_trash`` stays in the trash (the metadata
        server's ``trash_interval``; 0 = no trash: the shell deletes at once)."""
        return float(self.server_defaults.get("trash_interval") or 0)

    async def move_to_trash(self, path: str) -> str | None:
        """HDFS ``Trash.moveToAppropriateTrash``: move ``path`` into the caller's trash
        (``fs.trash``); its path there, or None when it is already in a trash."""
        return await trash.move_to_trash(self, path)

    async def expunge(self, *, immediate: bool = False) -> dict:
        """HDFS ``-expunge``: checkpoint the caller's trash, delete checkpoints older than
        ``trash_interval`` (everything with ``immediate``)."""
        return await trash.expunge(self, self.trash_interval * 60, immediate=immediate)

    async def unlink(self, path: str) -> "Changed":
        """POSIX unlink(2) in one call: delete the file or symlink ``path`` (a directory is
        ``IsDirectory``); the status it had and its parent's after."""
        return Changed.from_wire(await self._call(
            "delete", path=paths.validate(path), recursive=False, expect="nondir",
            want_status=True))

    async def rmdir(self, path: str) -> "Changed":
        """POSIX rmdir(2) in one call: delete the empty directory ``path`` (``NotDirectory``,
        ``DirectoryNotEmpty``); the status it had and its parent's after."""
        return Changed.from_wire(await self._call(
            "delete", path=paths.validate(path), recursive=False, expect="dir",
            want_status=True))

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> "Moved":
        """``rename`` answering what it did: the moved inode's status at ``dst``, both
        parents' after the move and the status of the destination it replaced (None if
        none)."""
        out = await self._call("rename", src=paths.validate(src), dst=paths.validate(dst),
                               overwrite=overwrite, want_status=True)
        return Moved(_status(out["status"]), _status(out.get("parent")),
                     _status(out.get("src_parent")), _status(out.get("replaced")))

    async def rename(self, src: str, dst: str, *, overwrite: bool = False) -> bool:
        """POSIX-like rename; ``dst`` must not exist unless ``overwrite``."""
        return bool(await self._call("rename", src=paths.validate(src), dst=paths.validate(dst),
                                     overwrite=overwrite))

    async def rename_many(self, moves, *, overwrite: bool = False) -> bool:
        """Apply ``moves`` (``(src, dst)`` or ``(src, dst, overwrite)``) in order as ONE
        namespace change: a reader sees all of them or none (a job commit). A move may
        free a destination for a later one; see PROTOCOL.md for what is refused."""
        checked = []
        for move in moves:
            move = list(move)
            if len(move) not in (2, 3):
                raise InvalidArgument(f"rename_many: {move!r:.80} is not (src, dst[, overwrite])")
            checked.append([paths.validate(move[0]), paths.validate(move[1]), *move[2:]])
        return bool(await self._call("rename_many", moves=checked, overwrite=overwrite))

    # the set_* calls: ``want_status`` answers the status after the change (else None)
    async def set_permission(self, path: str, mode: int, *,
                             want_status: bool = False) -> FileStatus | None:
        return _status(await self._call(
            "set_permission", path=paths.validate(path), permission=mode,
            **_want(want_status)))

    async def set_owner(self, path: str, owner: str | None = None, group: str | None = None,
                        *, want_status: bool = False) -> FileStatus | None:
        return _status(await self._call(
            "set_owner", path=paths.validate(path), owner=owner, group=group,
            **_want(want_status)))

    async def set_times(self, path: str, mtime_ns: int | None = None,
                        atime_ns: int | None = None, *, ino: int | None = None,
                        want_status: bool = False) -> FileStatus | None:
        """``ino``: set them on that inode wherever it is now (``path`` names it in errors);
        ``FileNotFound`` once it is deleted."""
        return _status(await self._call(
            "set_times", path=paths.validate(path), mtime_ns=mtime_ns, atime_ns=atime_ns,
            ino=ino, **_want(want_status)))

    async def set_replication(self, path: str, n: int) -> None:
        await self._call("set_replication", path=paths.validate(path), replication=n)

    async def create_symlink(self, target: str, path: str, create_parent: bool = False, *,
                             owner: str | None = None, group: str | None = None) -> FileStatus:
        """A symlink at ``path`` pointing to ``target`` (stored as given, not followed)."""
        return FileStatus.from_wire(await self._call(
            "create_symlink", target=target, path=paths.validate(path),
            create_parent=create_parent, owner=owner, group=group))

    async def content_summary(self, path: str) -> dict:
        """``{length, file_count, directory_count, space_consumed, ns_quota, ns_used,
        ds_quota, ds_used}`` (quotas -1 when none)."""
        return await self._call("content_summary", path=paths.validate(path))

    get_content_summary = content_summary

    async def concat(self, target: str, srcs: list[str]) -> None:
        """HDFS concat: the blocks of ``srcs`` move, in order, to the end of ``target``
        without copying; the sources are deleted (same folder, full blocks but the last
        source's last, same block size)."""
        await self._call("concat", target=paths.validate(target),
                         srcs=[paths.validate(s) for s in srcs])

    async def set_quota(self, path: str, ns_quota: int | None = None,
                        ds_quota: int | None = None) -> None:
        """Set a folder's name quota and/or space quota (bytes × replication); -1 clears
        one, None leaves it as it is. Superuser only."""
        await self._call("set_quota", path=paths.validate(path), ns_quota=ns_quota,
                         ds_quota=ds_quota)

    async def report(self) -> dict:
        """Cluster report: capacity, live/dead block servers, block counts, safe mode."""
        return await self._call("report")

    async def safemode(self, action: str = "get") -> dict:
        """``get``/``enter``/``leave`` → ``{on, manual, reason}``."""
        return await self._call("safemode", action=action)


# =========================================================================== blocking facade


class Client:
    """Blocking facade over an ``AsyncClient`` running on a background thread.

    Same methods as ``AsyncClient`` without ``await``; ``create`` returns an ``OutputStream``
    and ``open`` an ``InputStream`` (an ``io.RawIOBase``). Use as a context manager or call
    ``close()`` (which closes the files still open for writing).
    """

    def __init__(self, meta_address: str | None = None, *, config: Config | None = None,
                 client_name: str | None = None, user: str | None = None,
                 groups: list[str] | None = None, retry_policy: RetryPolicy | None = None):
        self._async = AsyncClient(meta_address, config=config, client_name=client_name,
                                  user=user, groups=groups, retry_policy=retry_policy)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._startup_error: BaseException | None = None
        self._closed = False
        started = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(started,),
                                        name=f"leasefs {self._async.client_name}", daemon=True)
        self._thread.start()
        started.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._closed = True
            raise self._startup_error

    def _thread_main(self, started: threading.Event) -> None:
        try:
            trio.run(self._serve, started)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructing thread
            exc = sole_exception(exc)
            if not started.is_set():
                self._startup_error = exc
            else:
                log.error("leasefs client thread ended with an error: %r", exc)
        finally:
            started.set()

    async def _serve(self, started: threading.Event) -> None:
        async with self._async:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            started.set()
            await self._stop.wait()

    def _call(self, afn, *args, **kwargs):
        if self._closed:
            raise InvalidArgument(f"client {self._async.client_name} is closed")
        try:
            return trio.from_thread.run(functools.partial(afn, *args, **kwargs),
                                        trio_token=self._token)
        except trio.RunFinishedError:
            raise ServerUnavailable(f"client {self._async.client_name} has stopped") from None

    def _run_or_spawn(self, afn):
        """``_call(afn)`` — except inside a trio run (the client's own, or another one in this
        thread, where a finalizer run by the garbage collector may call ``close``): blocking
        there is impossible, so ``afn`` is started in the client's background instead and
        None returned. Only for fire-and-forget calls (close)."""
        if self._closed or sys.is_finalizing() or not self._thread.is_alive():
            return None   # the client (or the interpreter) is gone: nothing left to close
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:   # a plain thread: wait for it as usual
            return self._call(afn)
        try:
            self._token.run_sync_soon(self._async.nursery.start_soon, afn)
        except trio.RunFinishedError:
            pass
        return None

    # ------------------------------------------------------------------ life cycle
    @property
    def client_name(self) -> str:
        return self._async.client_name

    @property
    def config(self) -> Config:
        return self._async.config

    @property
    def user(self) -> str:
        return self._async.user

    @property
    def groups(self) -> list[str]:
        return list(self._async.groups)

    @property
    def meta_address(self) -> str:
        return self._async.meta_address

    @property
    def trash_interval(self) -> float:
        return self._async.trash_interval

    def close(self) -> None:
        """Close open output streams, the connection and the background thread."""
        if self._closed:
            return
        try:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._closed = True
        self._thread.join()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ streams
    def create(self, path: str, **kwargs) -> OutputStream:
        """Like ``AsyncClient.create``; returns a blocking ``OutputStream``."""
        from .streams import OutputStream
        return OutputStream(self._call(self._async.create, path, **kwargs), self._call)

    def append(self, path: str) -> OutputStream:
        """Like ``AsyncClient.append``; returns a blocking ``OutputStream``."""
        from .streams import OutputStream
        return OutputStream(self._call(self._async.append, path), self._call)

    def open(self, path: str) -> InputStream:
        """Like ``AsyncClient.open``; returns an ``io.RawIOBase`` ``InputStream``."""
        from .streams import InputStream
        return InputStream(self._call(self._async.open, path), self._call,
                           close_call=self._run_or_spawn)

    def iter_status(self, path: str):
        """Entries of a directory, fetched page by page as the iteration goes."""
        return iter_pages(self.list_page, path)


def _mirror(name: str):
    async_method = getattr(AsyncClient, name)

    @functools.wraps(async_method)
    def method(self, *args, **kwargs):
        return self._call(getattr(self._async, name), *args, **kwargs)

    return method


for _name in ("write_file", "read_file", "get_block_locations", "mkdirs", "mkdir",
              "get_file_status", "list_page", "symlink", "unlink", "rmdir", "move",
              "exists", "list_status", "delete", "rename", "rename_many", "set_permission", "set_owner",
              "set_times", "set_replication", "create_symlink", "content_summary",
              "get_content_summary", "set_quota", "concat", "report",
              "safemode", "truncate", "recover_lease", "is_file_closed", "list_open_files",
              "open_files", "sync_metadata", "move_to_trash", "expunge", "msync",
              "dir_lease_acquire", "dir_lease_release", "dir_lease_events", "dir_batch",
              "lock_get", "lock_set", "lock_release", "lock_release_all", "lock_hold",
              "lock_reclaim", "renew_lease"):
    setattr(Client, _name, _mirror(_name))
del _name
Client.get_file_checksum = _mirror("get_file_checksum")
