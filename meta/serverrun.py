"""The metadata server's process life: open its folder, build a ``MetaServer``, serve it
(RPC over TCP and the local socket, web pages) and, with ``ha = etcd``, start it again in
place when its term ends or when it fell behind the replicated log.

Why apart from ``meta/server.py``: that module is what the server knows and does; this
one is how a process runs one — sockets, listeners, restarts — and holds no namespace
state of its own.

Concurrency contract: everything runs on the server's trio thread; ``run_meta_server``
owns the server for the process's life, one run (``_run_once``) at a time.
"""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial

import trio

from fs import nodeauth, tcpliveness
from fs import tls as tlsmod
from fs.blocktoken import KeyRing
from fs.config import Config
from fs.datafolder import open_data_folder
from fs.errors import ServerUnavailable, sole_exception
from fs.hdfs.ipc_server import IpcServer
from fs.hdfs.sniff import DATA_TRANSFER, IPC, describe, sniff
from fs.limits import ByteBudget, ConnectionLimits
from fs.rpc import (format_address, local_socket_name, rpc_refusal, serve_local, serve_rpc,
                    serve_tcp)

from . import start_space
from .ha.bootstrap import BehindLog, Gap
from .ha.bootstrap import recover as bootstrap_recover
from .server import MetaServer
from .services.startup import Phase

log = logging.getLogger(__name__)


async def run_meta_server(config: Config, data_dir: str, *, host: str = "127.0.0.1",
                          port: int = 8020, http_port: int = 0, hdfs_port: int = 0,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run a metadata server on ``data_dir`` (``db/`` = LevelDB, ``journal/`` = edit log)
    until cancelled; reports the bound ``(host, port)`` through ``task_status.started``.
    ``hdfs_port``: Hadoop's client is served there too (``fs.hdfs.ipc_server``; 0 = off).

    With ``ha = etcd`` a server whose term ended (``meta.ha.Deposed``) closes everything
    and starts again here, on the ports it had, as a follower. So does a follower behind
    the replicated log (``meta.bootstrap.BehindLog``), once another server's image is
    installed in place of its store and journal."""
    bound: list = []
    cede = 0.0
    while True:
        again = await _run_once(config, data_dir, host, port, http_port, hdfs_port, bound,
                                task_status if not bound else trio.TASK_STATUS_IGNORED, cede)
        if again is None:
            return
        if bound:
            (host, port), http_port = bound[0], bound[1] or http_port
        cede = again.cede
        if again.gap is not None:
            log.warning("metadata server on %s: %s; bootstrapping from another metadata "
                        "server's image", format_address((host, port)), again.gap.describe())
            key = nodeauth.ensure_key(nodeauth.key_path(config.cluster_key_file, data_dir)) \
                if config.security == "secure" else None
            await bootstrap_recover(config, data_dir, again.gap, leader=again.leader,
                                    own=format_address((host, port)), key=key)
        log.info("metadata server on %s starts again as a follower", format_address((host, port)))


@dataclass(frozen=True)
class Again:
    """Why a run of the server ended and the next must start: its HA term ended (the next
    run must not campaign for ``cede`` seconds), or it is behind the replicated log by
    ``gap`` and must first be bootstrapped from another server's image (``leader``: the
    active it knew of, asked first)."""
    cede: float = 0.0
    gap: Gap | None = None
    leader: str | None = None


async def _run_once(config: Config, data_dir: str, host: str, port: int, http_port: int,
                    hdfs_port: int, bound: list, task_status, cede: float = 0.0) -> Again | None:
    """One run of the server; ``Again`` when it must start again, else None."""
    open_data_folder(data_dir, "metadata server data folder")
    kv = start_space.open_store(data_dir)   # as --check-journal opens it
    server = None
    again = None
    try:
        server = MetaServer(config, kv, os.path.join(data_dir, "journal"),
                            local_dir=os.path.join(data_dir, "hdfs-local"))
        if config.security == "secure":
            key = nodeauth.ensure_key(nodeauth.key_path(config.cluster_key_file, data_dir))
            server.security.node_key = key
            # with HA every metadata server derives the same keys from the cluster key
            server.security.block_keys = KeyRing(
                config.block_key_interval, config.block_token_lifetime, server.wall_ns() / 1e9,
                shared=key if config.ha != "none" else None)
        server_tls = None
        tcpliveness.configure(config.tcp_liveness_timeout)
        if config.tls == "on":
            # the CA and this server's certificate are made (key generation, file writes)
            # in a worker thread, not on the trio thread
            server_tls, _ca = await trio.to_thread.run_sync(
                tlsmod.meta_server_tls, config, data_dir, host)
        async with AsyncExitStack() as stack:
            halog = None
            if config.ha == "etcd":
                from .ha.controller import HAController
                from .ha.log import HALog
                endpoints = [e.strip() for e in config.ha_etcd_endpoints.split(",") if e.strip()]
                halog = await stack.enter_async_context(HALog.open(
                    endpoints, config.ha_prefix, ttl=config.ha_election_timeout))
                # refuses client calls from the first one on (role INITIALIZING)
                server.ha = HAController(server, halog, config.ha_node_id,
                                         observer=config.ha_role == "observer", cede=cede)
            nursery = await stack.enter_async_context(trio.open_nursery())
            http_bound = None
            if http_port:
                # up first: the pages show the start-up progress while the journal replays
                from fs.web import serve_app
                from .web.app import make_app
                from .web.startup import StartupGate
                http_bound = await nursery.start(partial(
                    serve_app, StartupGate(make_app(server), server), host, http_port,
                    name="metadata server web pages"))
            for _ in server.recover_steps():
                await trio.sleep(0)
            # the retry cache's look back runs while the server answers: until it is done,
            # calls that carry a retry key wait for it (``RetryCache.hold``)
            nursery.start_soon(server.look_back)
            await nursery.start(server.journal.run)
            if server.ha is None:
                await server.start()
            else:   # a follower: the namespace comes from the log
                server.startup.move(Phase.LOADING_MEMORY, server.wall_ns() / 1e9)
                if server.ns.view.formatted:
                    server.rebuild_memory()
            nursery.start_soon(server.monitors.run_monitors)
            if server.ha is None:
                nursery.start_soon(server.monitors.run_active_services)
            nursery.start_soon(server.gc_governor.run)
            budget = ByteBudget(max(config.rpc_buffer_limit, config.max_frame + 4))
            handler = partial(_serve_connection, server, budget)
            # the local socket counts its connections apart (per uid): TCP peers never
            # starve it. TCP connections count as unauthenticated until they prove who
            # they are (security = secure), so peers that never do fill only their own count
            limits = ConnectionLimits.from_config(config)
            local_limits = ConnectionLimits.from_config(config)
            unauthenticated = ConnectionLimits(config.max_unauthenticated_connections,
                                               config.max_connections_per_peer) \
                if server.security.secure else None
            # local clients need no TLS: nothing of theirs leaves the machine. On a known
            # port (a restart) the local socket listens first: a client reconnecting while
            # only TCP listened would fall back to it and be refused as unauthenticated
            serve_local_socket = partial(serve_local, handler, server="metadata server",
                                         limits=local_limits, refusal=rpc_refusal)
            local = local_socket_name(config.meta_socket, (host, port)) \
                if port else None
            if local:
                await nursery.start(partial(serve_local_socket, name=local))
            address = await nursery.start(partial(
                serve_tcp, handler, host, port, name="metadata server", limits=limits,
                refusal=rpc_refusal, tls=server_tls, unauthenticated=unauthenticated))
            if hdfs_port:
                await nursery.start(partial(_serve_hdfs, server, host, hdfs_port, limits,
                                            budget))
            bound[:] = [address, http_bound[1] if http_bound else 0]
            if server.ha is None:   # an HA server renews them when it becomes active
                server.began_serving()
            if not local:
                local = local_socket_name(config.meta_socket, address)
                if local:
                    await nursery.start(partial(serve_local_socket, name=local))
            if server.ha is not None:
                if not server.ha.node_id:
                    server.ha.node_id = format_address(address)

                async def run_ha(task_status=trio.TASK_STATUS_IGNORED):
                    nonlocal again
                    from .ha.controller import Deposed
                    task_status = _StartedOnce(task_status)
                    try:
                        await server.ha.run(task_status=task_status)
                    except Deposed as exc:
                        again = Again(cede=exc.cede)
                        nursery.cancel_scope.cancel()
                    except BaseException as raised:   # a nursery of ``run`` may wrap it
                        exc = sole_exception(raised)
                        if not isinstance(exc, BehindLog):
                            raise
                        again = Again(gap=exc.gap, leader=server.ha.leader)
                        nursery.cancel_scope.cancel()
                        # the address is bound: report it, the next run serves it
                        task_status.started()

                await nursery.start(run_ha)
                server.startup.move(Phase.RUNNING, server.wall_ns() / 1e9)
            if not nursery.cancel_scope.cancel_called:
                log.info("metadata server ready on %s (data %s)", format_address(address),
                         data_dir)
            task_status.started(address)
    finally:
        if server is not None:
            server.images.close()   # their snapshots go before the store
        with trio.CancelScope(shield=True):
            if server is not None:
                try:
                    await server.journal.aclose()
                except Exception:
                    log.exception("closing the journal failed")
        kv.close()
    return again


class _StartedOnce:
    """A task status ``started`` may be called on again (a no-op then)."""

    def __init__(self, status):
        self._status, self._done = status, False

    def started(self, value=None) -> None:
        if not self._done:
            self._done = True
            self._status.started(value)


async def _serve_hdfs(server: MetaServer, host: str, port: int, limits: ConnectionLimits,
                      budget: ByteBudget, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Hadoop's client on ``port``: IPC to the server's HDFS translators (its connections
    count in the TCP limits, its request bytes in the budget, with the msgpack ones)."""
    config = server.config
    ipc = IpcServer(server.hdfs_translators, server.hdfs_identity,
                    name="metadata server HDFS port", max_frame=config.max_frame,
                    frame_timeout=config.frame_timeout, idle_timeout=config.idle_timeout,
                    context_timeout=config.auth_timeout, budget=budget,
                    state_id=server.state_id, call_observer=server.call_observer)

    async def serve(stream, peer: str, **_ignored) -> None:
        # Hadoop IPC, or a READ_BLOCK of an inline file's block (``fs.hdfs.sniff``)
        kind, head, rewound = await sniff(stream, config.auth_timeout)
        if kind == IPC:
            await ipc.serve(rewound, peer)
        elif kind == DATA_TRANSFER:
            await server.hdfs_inline.serve(rewound, peer)
        else:   # neither protocol, or nothing within auth_timeout (a port probe)
            if head:
                log.warning("metadata server HDFS port: closing the connection from %s: it "
                            "began with %s", peer, describe(head))
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async with trio.open_nursery() as nursery:
        try:
            bound = await nursery.start(partial(serve_tcp, serve, host, port,
                                                name="metadata server HDFS port",
                                                limits=limits))
        except OSError as exc:   # name the port and its setting (9000 is a common one)
            raise OSError(exc.errno, exc.strerror,
                          f"{format_address((host, port))} (meta_hdfs_port, the port for "
                          f"Hadoop's client; 0 = off)") from None
        log.info("Hadoop clients: hdfs://%s", format_address(bound))
        task_status.started(bound)


async def _serve_connection(server: MetaServer, budget: ByteBudget, stream, peer: str,
                            credentials=None, admission=None) -> None:
    config = server.config
    try:
        await serve_rpc(stream, server, max_frame=config.max_frame, peer=peer,
                        frame_timeout=config.frame_timeout, idle_timeout=config.idle_timeout,
                        budget=budget, credentials=credentials,
                        auth_timeout=config.auth_timeout, admission=admission)
    except ServerUnavailable:
        pass
