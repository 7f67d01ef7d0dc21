"""Entry point of a block server (HDFS DataNode role): one data folder, one data-transfer
port, one conversation with each metadata server of ``meta_address`` (several with HA),
and (security = secure) a local socket where it vouches for its host's users
(``storage.vouch``).

Why it exists: it wires the replica store, the data-transfer server, the heartbeat service,
the block scanner (``storage.scanner``), the directory scanner (``storage.dirscan``) and
the patch flusher (``ReplicaStore.run_patch_flusher``) together and reports the bound
address before registration, so a test (or the cluster launcher) can start block servers
before the metadata server is up.

Concurrency contract: ``BlockServer.run`` is one trio task tree; the store is opened (scanned)
before the port is bound, the address is reported through ``task_status.started`` as soon as
the port listens, then the heartbeat service keeps trying to register for as long as the
server runs. Cancelling the task stops everything and releases the data folder.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from contextlib import contextmanager
from functools import partial

import trio

from fs import nodeauth, tcpliveness, weblog
from fs import tls as tlsmod
from fs.config import Config
from fs.datafolder import private_umask
from fs.limits import ConnectionLimits
from fs.metrics import new_registry
from fs.errors import InvalidArgument
from fs.rpc import format_address, parse_address_list, serve_tcp
from fs.web import serve_app

from .dirscan import DirectoryScanner
from .hdfs.xfer import HdfsDataTransfer
from .heartbeat import HeartbeatService
from .replicas import ReplicaStore
from .scanner import BlockScanner
from .opheader import refusal_response
from .metrics import StorageMetrics
from .transfer import DataTransferServer
from .vouch import serve_vouch
from .web import make_app

log = logging.getLogger(__name__)


class BlockServer:
    """The parts of one running block server, for callers that want to look inside."""

    def __init__(self, config: Config, data_dir: str, *, meta_address: str):
        self.config = config
        self.store = ReplicaStore(data_dir, disk_io_threads=config.disk_io_threads,
                                  sync_on_close=config.sync_on_close)
        self.transfer = DataTransferServer(config, self.store)
        self.hdfs = HdfsDataTransfer(self.transfer)   # Hadoop's client, same replicas
        # security = secure: no key, no block server (a clear error at start, not a
        # server that is refused forever)
        key = nodeauth.load_key(config.cluster_key_file) if config.security == "secure" else None
        self.heartbeat = HeartbeatService(config, self.store, meta_address,
                                          xceiver_count=lambda: self.transfer.active_ops,
                                          key=key)
        self.transfer.reporter = self.heartbeat
        self.store.on_dropped = self.heartbeat.blocks_deleted   # a patch that broke a replica
        self.transfer.node_key = key
        self.heartbeat.on_block_keys = self.transfer.set_block_keys
        self.scanner = BlockScanner(config, self.store, self.heartbeat.report_bad_replicas,
                                    self.heartbeat.replica_lost)
        self.dirscan = DirectoryScanner(config, self.store, self.heartbeat)
        self.bound: tuple[str, int] | None = None
        self.advertised: str | None = None
        # the local socket where it vouches for its host's users (storage.vouch), if any
        self.vouch_socket: str | None = None
        self.metrics_registry = new_registry()      # /metrics (web.py)
        self.metrics = StorageMetrics(self)
        self.transfer.op_observer = self.metrics.observe_op
        self.http_bound: tuple[str, int] | None = None
        self.hdfs_bound: tuple[str, int] | None = None
        self.recent_log = weblog.install()   # the page's recent errors

    async def run(self, host: str = "127.0.0.1", port: int = 9866,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        server_tls = None
        tcpliveness.configure(self.config.tcp_liveness_timeout)
        if self.config.tls == "on":
            # certificate, key and CA are read in a worker thread; a missing or bad one stops
            # the start with one line naming it, not a server every peer fails to reach
            server_tls = await trio.to_thread.run_sync(tlsmod.block_server_tls, self.config)
            await tlsmod.client(self.config).context()
        await self.store.open()
        try:
            async with trio.open_nursery() as nursery:
                with _naming_port(host, port, "storage_port, the data-transfer port"):
                    self.bound = await nursery.start(partial(
                        serve_tcp, self.transfer.handle, host, port, name="block server",
                        limits=ConnectionLimits.from_config(self.config),
                        refusal=refusal_response, tls=server_tls))
                self.advertised = format_address((await advertised_host(
                    self.config, host, self.heartbeat.meta_address), self.bound[1]))
                if self.transfer.node_key is not None:
                    # after the data port: a client checks the socket's holder against it
                    self.vouch_socket = await nursery.start(partial(
                        serve_vouch, self.config, self.heartbeat, self.bound[1]))
                if self.config.storage_http_port >= 0:
                    with _naming_port(host, self.config.storage_http_port,
                                      "storage_http_port, the web page; -1 = off"):
                        self.http_bound = await nursery.start(partial(
                            serve_app, make_app(self), host, self.config.storage_http_port,
                            name="block server web page"))
                    self.heartbeat.http_port = self.http_bound[1]
                if self.config.storage_hdfs_port >= 0:
                    with _naming_port(host, self.config.storage_hdfs_port,
                                      "storage_hdfs_port, the port for Hadoop's client; "
                                      "-1 = off"):
                        self.hdfs_bound = await nursery.start(partial(
                            serve_tcp, self.hdfs.handle, host, self.config.storage_hdfs_port,
                            name="block server HDFS data transfer",
                            limits=ConnectionLimits.from_config(self.config)))
                    self.heartbeat.hdfs_port = self.hdfs_bound[1]
                    if server_tls is not None:
                        log.warning("HDFS data-transfer port %d is plaintext (HDFS's protocol "
                                    "has no TLS; tls = on covers leasefs's own ports): set "
                                    "storage_hdfs_port = -1 where block data must not cross "
                                    "the network in the clear", self.hdfs_bound[1])
                task_status.started(self.bound)
                nursery.start_soon(self.scanner.run)
                nursery.start_soon(self.dirscan.run)
                # acknowledged patches made durable in place (storage/patching.py)
                nursery.start_soon(self.store.run_patch_flusher)
                await self.heartbeat.run(self.advertised)
        finally:
            self.store.close()


@contextmanager
def _naming_port(host: str, port: int, setting: str):
    """A failed listen names its address and setting: a block server serves up to three
    ports, and 'Address already in use' alone does not say which one was taken."""
    try:
        yield
    except OSError as exc:
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc),
                      f"{format_address((host, port))} ({setting})") from None


WILDCARDS = ("", "0.0.0.0", "::", "*")


async def advertised_host(config: Config, bind_host: str, meta_address: str) -> str:
    """The host a block server gives the metadata server as its address, which clients and
    other block servers connect to: ``advertise_host`` when set; else the address it is
    bound to; bound to every address (0.0.0.0, ::), this host's address on its route to
    the (first) metadata server, the one the metadata server sees it connect from. A
    loopback address is only right when the metadata server is on loopback too (the
    metadata server refuses it from a remote peer)."""
    if config.advertise_host:
        return config.advertise_host
    if bind_host not in WILDCARDS:
        return bind_host
    meta_host, meta_port = parse_address_list(meta_address)[0]
    try:
        return await trio.to_thread.run_sync(route_source, meta_host, meta_port)
    except OSError as exc:
        raise InvalidArgument(
            f"block server bound to {bind_host or 'every address'}: cannot tell which of "
            f"this host's addresses reaches metadata server {meta_host}:{meta_port} "
            f"({exc.strerror or exc}); bind to that address (--host) or set "
            f"advertise_host") from None


def route_source(host: str, port: int) -> str:
    """The local address this host sends from to ``host`` (its routing table's choice;
    connecting a UDP socket sends nothing)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)
        return sock.getsockname()[0]


async def run_block_server(config: Config, data_dir: str, *, meta_address: str,
                           host: str = "127.0.0.1", port: int = 9866,
                           task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``data_dir`` on ``host:port`` (0 = any free port) until cancelled; reports the
    bound ``(host, port)`` before registering with ``meta_address``."""
    await BlockServer(config, data_dir, meta_address=meta_address).run(
        host, port, task_status=task_status)


def main(argv=None) -> int:
    """``python -m storage.server --data DIR --meta HOST:PORT [--port N] [--host H]``."""
    parser = argparse.ArgumentParser(prog="python -m storage.server", description=__doc__)
    parser.add_argument("--data", required=True, help="data folder")
    parser.add_argument("--meta", required=True, help="metadata server HOST:PORT, or a "
                        "comma-separated list of every metadata server (HA)")
    parser.add_argument("--host", default=None, help="address to bind (default: bind_host)")
    parser.add_argument("--port", type=int, default=None, help="data port (default: storage_port)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    config = Config.load(**overrides)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    private_umask()   # replica files: the server user's alone
    try:
        trio.run(lambda: run_block_server(
            config, args.data, meta_address=args.meta, host=args.host or config.bind_host,
            port=config.storage_port if args.port is None else args.port))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
