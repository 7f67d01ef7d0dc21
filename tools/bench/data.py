"""``leasefs bench write|read``: sequential throughput against the running cluster, with
same-run baselines so a number means something on this machine (``--tls``: the cost of wire
encryption on two fresh local clusters).

Why: a bare "120 MB/s" says nothing on a 2-core VM shared with other work. Every data run
therefore also measures, with the same bytes in the same run, the local disk (write + fsync
a temp file on the filesystem of the cluster home; read it back) and raw loopback TCP (a trio
socket pair), and prints leasefs/baseline ratios. ``--moosefs`` adds the same workload on a
MooseFS peer (started by ``../shared/peers/moosefs-up.sh`` if it is not mounted, stopped
again only if we started it) through plain file I/O on its FUSE mount.

Concurrency contract: a CLI process. Progress lines go to stderr, results to stdout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import trio

from fs.framing import receive_limit

from ..common import Command
from ..formatting import UsageError, format_table, parse_size
from ..progress import StatusLine
from .base import CHUNK, BenchFailed, MooseFSPeer, baseline_dir, mbps, payload, size_label

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- helpers

def _parse_replications(text: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UsageError(f"--replication {text!r}: expected positive integers like 1, 3 or 1,3")
    return values


# --------------------------------------------------------------------------- baselines

def local_disk_write(directory: str, size: int, data: bytes) -> tuple[float, str]:
    """Seconds to write ``size`` bytes and fsync them into a temp file in ``directory``."""
    fd, path = tempfile.mkstemp(prefix=".leasefs-bench-", dir=directory)
    try:
        start = time.perf_counter()
        left = size
        while left > 0:
            n = min(left, len(data))
            written = os.write(fd, data[:n] if n < len(data) else data)
            left -= written
        os.fsync(fd)
        elapsed = time.perf_counter() - start
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return elapsed, path


def local_disk_read(path: str) -> tuple[float, int]:
    start = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            data = fh.read(CHUNK)
            if not data:
                break
            total += len(data)
    return time.perf_counter() - start, total


async def _loopback(size: int, data: bytes, tls_files: tuple[str, str, str] | None = None) -> float:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    received = trio.Event()
    server_context = client_tls = None
    if tls_files:   # (CA, certificate, key): both ends as leasefs sets them up
        from fs import tls as tlsmod
        ca, cert, key = tls_files
        server_context = tlsmod.server_context(cert, key)
        client_tls = tlsmod.ClientTls(ca)

    async def sink(stream):
        if server_context is not None:
            stream = trio.SSLStream(stream, server_context, server_side=True,
                                    https_compatible=True)
        got = 0
        while got < size:
            chunk = await stream.receive_some(min(1 << 20, receive_limit(stream)))
            if not chunk:
                break
            got += len(chunk)
        received.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, sink, listeners)
        start = time.perf_counter()    # with TLS the handshake counts, as for a block
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        if client_tls is not None:
            stream = await tlsmod.connect(stream, client_tls, "127.0.0.1", f"127.0.0.1:{port}")
        view = memoryview(data)[: 1 << 20]
        if client_tls is None:
            start = time.perf_counter()
        left = size
        async with stream:
            while left > 0:
                piece = view[: min(left, len(view))]
                await stream.send_all(piece)
                left -= len(piece)
            await received.wait()
        elapsed = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return elapsed


def loopback_tcp(size: int, data: bytes, tls_files: tuple[str, str, str] | None = None) -> float:
    """Seconds to move ``size`` bytes over one loopback TCP connection (trio both ends);
    ``tls_files`` (CA, certificate, key): over TLS, as leasefs's connections."""
    return trio.run(_loopback, size, data, tls_files)


# --------------------------------------------------------------------------- MooseFS peer

def moosefs_write(folder: str, size: int, data: bytes) -> tuple[float, str]:
    path = os.path.join(folder, f"leasefs-bench-{os.getpid()}")
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as fh:
        left = size
        while left > 0:
            n = min(left, len(data))
            fh.write(data if n == len(data) else data[:n])
            left -= n
    return time.perf_counter() - start, path


# --------------------------------------------------------------------------- write / read

def _leasefs_write(client, path: str, size: int, data: bytes, replication: int,
                   block_size: int | None, status: StatusLine) -> float:
    start = time.perf_counter()
    last_report = start
    with client.create(path, overwrite=True, replication=replication,
                       block_size=block_size) as out:
        left = size
        while left > 0:
            n = min(left, len(data))
            out.write(data if n == len(data) else data[:n])
            left -= n
            now = time.perf_counter()
            if now - last_report > 2.0:
                status(f"  wrote {size_label(size - left)} of {size_label(size)}")
                last_report = now
    return time.perf_counter() - start


def _leasefs_read(client, path: str) -> tuple[float, int]:
    start = time.perf_counter()
    total = 0
    with client.open(path) as reader:
        while True:
            data = reader.read(CHUNK)
            if not data:
                break
            total += len(data)
    return time.perf_counter() - start, total


def run_data_bench(cmd: Command) -> int:
    a = cmd.args
    if a.tls:
        return run_tls_bench(cmd)
    kind = a.kind
    size = parse_size(a.size)
    if size <= 0:
        raise UsageError("--size must be positive")
    replications = _parse_replications(a.replication)
    block_size = parse_size(a.block_size) if a.block_size else None
    status = StatusLine(enabled=not a.quiet)
    client = cmd.client
    folder = f"{a.dir.rstrip('/')}/{os.getpid()}"
    data = payload(min(CHUNK, size))
    rows = []  # dicts: name, seconds, mbps, compare_to (name of the leasefs row)
    peer = MooseFSPeer(a.moosefs_script, status) if a.moosefs else None
    tmp_path = None
    status(f"bench {kind}: {size_label(size)}, replication {','.join(map(str, replications))}"
           f", cluster {cmd.meta_address}")
    try:
        if peer:
            peer.ensure_up()
        client.mkdirs(folder)
        for r in replications:
            path = f"{folder}/data-r{r}"
            status(f"leasefs write, replication {r} ...")
            seconds = _leasefs_write(client, path, size, data, r, block_size, status)
            if kind == "write":
                rows.append({"name": f"leasefs write r={r}", "seconds": seconds,
                             "mbps": mbps(size, seconds), "leasefs": True, "replication": r})
            else:
                status(f"leasefs read, replication {r} ...")
                seconds, got = _leasefs_read(client, path)
                if got != size:
                    raise RuntimeError(f"{path}: read {got} bytes, expected {size}")
                rows.append({"name": f"leasefs read r={r}", "seconds": seconds,
                             "mbps": mbps(size, seconds), "leasefs": True, "replication": r})
            if not a.keep:
                client.delete(path)
        status("baseline: local disk write + fsync ...")
        seconds, tmp_path = local_disk_write(baseline_dir(a.home), size, data)
        if kind == "write":
            rows.append({"name": "local disk write+fsync", "seconds": seconds,
                         "mbps": mbps(size, seconds)})
        else:
            status("baseline: local disk read ...")
            seconds, _ = local_disk_read(tmp_path)
            rows.append({"name": "local disk read (page cache warm)", "seconds": seconds,
                         "mbps": mbps(size, seconds)})
        status("baseline: loopback TCP (trio) ...")
        seconds = loopback_tcp(size, data)
        rows.append({"name": "loopback TCP", "seconds": seconds, "mbps": mbps(size, seconds)})
        if peer:
            for r in replications:
                mfs_folder = peer.folder(r)
                if mfs_folder is None:
                    status(f"MooseFS has no g{r} folder; skipped")
                    continue
                status(f"MooseFS write, goal {r} ...")
                seconds, mpath = moosefs_write(mfs_folder, size, data)
                try:
                    if kind == "write":
                        rows.append({"name": f"MooseFS write goal={r}", "seconds": seconds,
                                     "mbps": mbps(size, seconds), "replication": r})
                    else:
                        status(f"MooseFS read, goal {r} ...")
                        seconds, _ = local_disk_read(mpath)
                        rows.append({"name": f"MooseFS read goal={r}", "seconds": seconds,
                                     "mbps": mbps(size, seconds), "replication": r})
                finally:
                    os.unlink(mpath)
    finally:
        if tmp_path:
            try:
                os.unlink(tmp_path)
            except OSError:
                pass
        if not a.keep:
            try:
                client.delete(folder, recursive=True)
            except Exception:
                log.debug("cleanup of %s failed", folder, exc_info=True)
        if peer:
            peer.stop_if_ours()
    _print_data_results(cmd, kind, size, rows)
    return 0


def _ratio_rows(rows):
    leasefs = [r for r in rows if r.get("leasefs")]
    for row in rows:
        ratios = {}
        if not row.get("leasefs"):
            for mine in leasefs:
                if "replication" in row and row["replication"] != mine["replication"]:
                    continue
                ratios[mine["name"]] = mine["mbps"] / row["mbps"] if row["mbps"] else None
        row["ratios"] = ratios
    return rows


def _print_data_results(cmd: Command, kind: str, size: int, rows) -> None:
    rows = _ratio_rows(rows)
    if cmd.args.json:
        cmd.out(json.dumps({"benchmark": kind, "size": size, "results": rows}, indent=2))
        return
    table = []
    for row in rows:
        ratio = ", ".join(f"{r:.2f} ({name.split()[-1]})" for name, r in row["ratios"].items()
                          if r is not None)
        table.append([row["name"], f"{row['mbps']:.1f}", f"{row['seconds']:.3f}", ratio or "-"])
    cmd.out(f"bench {kind}: {size_label(size)} ({size} bytes); MB/s = 10^6 bytes per second")
    for line in format_table(["measurement", "MB/s", "seconds", "leasefs / this"], table,
                             align="<>><"):
        cmd.out(line)


# --------------------------------------------------------------------------- TLS on / off

class _TempCluster:
    """A throw-away ``leasefs cluster up`` (its own home, ports chosen by the system) with
    ``tls`` on or off, for ``--tls``: both clusters run side by side, so their runs can
    alternate and the machine's drift hits both alike."""

    def __init__(self, tls: str, n_storage: int, parent: str, status: StatusLine):
        self.tls = tls
        self.n_storage = n_storage
        self.status = status
        self.home = tempfile.mkdtemp(prefix=f".leasefs-bench-tls-{tls}-", dir=parent)
        self.address = ""
        self.ca_file = ""

    def _cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tools", "cluster", *args,
                               "--home", self.home], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items()
                                   if k not in ("LEASEFS_META", "LEASEFS_HOME")})

    def up(self) -> None:
        self.status(f"starting a cluster with tls = {self.tls} in {self.home} ...")
        done = self._cli("up", "--storage", str(self.n_storage), "--port", "0",
                         "--storage-port", "0", "--http-port", "0", "--set", f"tls={self.tls}")
        if done.returncode != 0:
            raise BenchFailed(f"cluster with tls = {self.tls} did not start: "
                              f"{(done.stderr or done.stdout).strip()[-600:]}")
        with open(os.path.join(self.home, "cluster.json")) as fh:
            state = json.load(fh)
        self.address = state["meta_address"]
        self.ca_file = state.get("tls_ca_file") or ""

    def client(self, config):
        from fs.client import Client
        return Client(self.address, config=config.replace(tls=self.tls,
                                                          tls_ca_file=self.ca_file))

    def tls_files(self) -> tuple[str, str, str]:
        """The CA and the metadata server's certificate and key (the loopback baseline)."""
        folder = os.path.join(self.home, "meta", "tls")
        return (self.ca_file, os.path.join(folder, "meta.crt"), os.path.join(folder, "meta.key"))

    def down(self) -> None:
        self._cli("down")
        shutil.rmtree(self.home, ignore_errors=True)


def run_tls_bench(cmd: Command) -> int:
    """``bench write|read --tls``: the same workload on two fresh local clusters, one with
    ``tls = off`` and one with ``tls = on``, in alternating order (off/on, on/off, ...) for
    ``--rounds`` rounds, and raw loopback TCP without and with TLS; MB/s of every run, the
    means and the on/off ratios."""
    a = cmd.args
    kind = a.kind
    size = parse_size(a.size)
    if size <= 0:
        raise UsageError("--size must be positive")
    if a.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    replications = _parse_replications(a.replication)
    block_size = parse_size(a.block_size) if a.block_size else None
    status = StatusLine(enabled=not a.quiet)
    data = payload(min(CHUNK, size))
    parent = baseline_dir(a.home)
    clusters = {tls: _TempCluster(tls, max(3, max(replications)), parent, status)
                for tls in ("off", "on")}
    clients: dict = {}
    runs: dict[tuple[str, str], list[float]] = {}
    try:
        for cluster in clusters.values():
            cluster.up()
            clients[cluster.tls] = cluster.client(cmd.config)
        for r in replications:
            for k in range(a.rounds):
                for tls in (("off", "on") if k % 2 == 0 else ("on", "off")):
                    client = clients[tls]
                    path = f"/bench-r{r}"
                    status(f"round {k + 1}: leasefs {kind}, replication {r}, tls = {tls} ...")
                    seconds = _leasefs_write(client, path, size, data, r, block_size, status)
                    if kind == "read":
                        seconds, got = _leasefs_read(client, path)
                        if got != size:
                            raise BenchFailed(f"{path}: read {got} bytes, expected {size}")
                    client.delete(path)
                    runs.setdefault((f"leasefs {kind} r={r}", tls), []).append(mbps(size, seconds))
        for k in range(a.rounds):
            for tls in (("off", "on") if k % 2 == 0 else ("on", "off")):
                status(f"round {k + 1}: loopback TCP, tls = {tls} ...")
                seconds = loopback_tcp(size, data, clusters["on"].tls_files() if tls == "on"
                                       else None)
                runs.setdefault(("loopback TCP (trio)", tls), []).append(mbps(size, seconds))
    finally:
        for client in clients.values():
            try:
                client.close()
            except Exception:
                log.debug("closing a bench client failed", exc_info=True)
        for cluster in clusters.values():
            cluster.down()
    rows = []
    for name in dict.fromkeys(n for n, _ in runs):
        off, on = runs[(name, "off")], runs[(name, "on")]
        mean_off, mean_on = sum(off) / len(off), sum(on) / len(on)
        rows.append({"name": name, "off": off, "on": on, "mean_off": mean_off,
                     "mean_on": mean_on, "ratio": mean_on / mean_off if mean_off else None})
    if a.json:
        cmd.out(json.dumps({"benchmark": f"{kind} --tls", "size": size, "rounds": a.rounds,
                            "results": rows}, indent=2))
        return 0
    cmd.out(f"bench {kind} --tls: {size_label(size)} ({size} bytes) per run, {a.rounds} "
            f"round(s) in alternating order; MB/s = 10^6 bytes per second")
    table = [[row["name"], " ".join(f"{v:.0f}" for v in row["off"]), f"{row['mean_off']:.1f}",
              " ".join(f"{v:.0f}" for v in row["on"]), f"{row['mean_on']:.1f}",
              "-" if row["ratio"] is None else f"{row['ratio']:.2f}"] for row in rows]
    for line in format_table(["measurement", "tls off runs", "off MB/s", "tls on runs",
                              "on MB/s", "on / off"], table, align="<>>>>>"):
        cmd.out(line)
    return 0


# --------------------------------------------------------------------------- parser

def register(bsub, common, shared) -> None:
    """``bench write`` and ``bench read`` (``shared``: the options every cluster benchmark has)."""
    for kind, text in (("write", "sequential write MB/s"), ("read", "sequential read MB/s")):
        q = bsub.add_parser(kind, parents=[common], help=text)
        q.add_argument("--size", default="256M", help="bytes per file (default 256M)")
        q.add_argument("--replication", default="3", help="1, 3 or a list such as 1,3")
        q.add_argument("--block-size", default=None, help="block size (default: cluster's)")
        q.add_argument("--home", default=None,
                       help="folder whose filesystem the local-disk baseline uses "
                            "(default: the cluster home)")
        q.add_argument("--tls", action="store_true",
                       help="measure the cost of wire encryption instead: the same workload "
                            "on two fresh local clusters, tls = off and tls = on, in "
                            "alternating order, plus loopback TCP without and with TLS")
        q.add_argument("--rounds", type=int, default=2,
                       help="with --tls: runs of each (default 2)")
        shared(q)
        q.set_defaults(func=run_data_bench)
