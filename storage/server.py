"""Entry point of a block server (HDFS DataNode role): one data folder, one data-transfer
port, one conversation with each metadata server of ``meta_address`` (several with HA).

Why it exists: it wires the replica store, the data-transfer server, the heartbeat service,
the block scanner (``storage.scanner``) and the directory scanner (``storage.dirscan``)
together and reports the bound address before registration, so a test (or the cluster
launcher) can start block servers before the metadata server is up.

Concurrency contract: ``BlockServer.run`` is one trio task tree; the store is opened (scanned)
before the port is bound, the address is reported through ``task_status.started`` as soon as
the port listens, then the heartbeat service keeps trying to register for as long as the
server runs. Cancelling the task stops everything and releases the data folder.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial

import trio

from fs import nodeauth, weblog
from fs import tls as tlsmod
from fs.config import Config
from fs.datafolder import private_umask
from fs.limits import ConnectionLimits
from fs.metrics import new_registry
from fs.rpc import format_address, serve_tcp
from fs.web import serve_app

from .dirscan import DirectoryScanner
from .heartbeat import HeartbeatService
from .replicas import ReplicaStore
from .scanner import BlockScanner
from .opheader import refusal_response
from .metrics import StorageMetrics
from .transfer import DataTransferServer
from .web import make_app

log = logging.getLogger(__name__)


class BlockServer:
    """The parts of one running block server, for callers that want to look inside."""

    def __init__(self, config: Config, data_dir: str, *, meta_address: str):
        self.config = config
        self.store = ReplicaStore(data_dir, disk_io_threads=config.disk_io_threads,
                                  sync_on_close=config.sync_on_close)
        self.transfer = DataTransferServer(config, self.store)
        # security = secure: no key, no block server (a clear error at start, not a
        # server that is refused forever)
        key = nodeauth.load_key(config.cluster_key_file) if config.security == "secure" else None
        self.heartbeat = HeartbeatService(config, self.store, meta_address,
                                          xceiver_count=lambda: self.transfer.active_ops,
                                          key=key)
        self.transfer.reporter = self.heartbeat
        self.transfer.node_key = key
        self.heartbeat.on_block_keys = self.transfer.set_block_keys
        self.scanner = BlockScanner(config, self.store, self.heartbeat.report_bad_replicas,
                                    self.heartbeat.replica_lost)
        self.dirscan = DirectoryScanner(config, self.store, self.heartbeat)
        self.bound: tuple[str, int] | None = None
        self.advertised: str | None = None
        self.metrics_registry = new_registry()      # /metrics (web.py)
        self.metrics = StorageMetrics(self)
        self.transfer.op_observer = self.metrics.observe_op
        self.http_bound: tuple[str, int] | None = None
        self.recent_log = weblog.install()   # the page's recent errors

    async def run(self, host: str = "127.0.0.1", port: int = 9866,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:
        server_tls = None
        if self.config.tls == "on":
            # certificate, key and CA are read in a worker thread; a missing or bad one stops
            # the start with one line naming it, not a server every peer fails to reach
            server_tls = await trio.to_thread.run_sync(tlsmod.block_server_tls, self.config)
            await tlsmod.client(self.config).context()
        await self.store.open()
        try:
            async with trio.open_nursery() as nursery:
                self.bound = await nursery.start(partial(
                    serve_tcp, self.transfer.handle, host, port, name="block server",
                    limits=ConnectionLimits.from_config(self.config),
                    refusal=refusal_response, tls=server_tls))
                self.advertised = format_address((self.config.storage_advertise_host,
                                                  self.bound[1]))
                if self.config.storage_http_port >= 0:
                    self.http_bound = await nursery.start(partial(
                        serve_app, make_app(self), host, self.config.storage_http_port,
                        name="block server web page"))
                    self.heartbeat.http_port = self.http_bound[1]
                task_status.started(self.bound)
                nursery.start_soon(self.scanner.run)
                nursery.start_soon(self.dirscan.run)
                await self.heartbeat.run(self.advertised)
        finally:
            self.store.close()


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
