"""Real clusters for tests: in-process (one trio run) and as subprocesses (the real CLI).

``inprocess_cluster`` starts the real metadata server and N real block servers as tasks on
port 0 in the test's own trio run, each under its own cancel scope so a test can stop and
restart one. ``ProcessCluster`` starts them as separate ``python -m tools`` processes with
address files, so fault tests can ``kill -9`` and restart real processes. ``Mount`` is one
``leasefs mount --foreground`` process of a ``ProcessCluster`` (two of them = two clients).

Both use short timings (heartbeats of a tenth of a second) so that failures are seen fast.
"""

from __future__ import annotations

import errno
import keyword
import inspect
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from fs import nodeauth
from fs import tls as tlsmod
from fs.config import Config
from fs.client import authentication
from fs.rpc import RpcClient, format_address

REPO = Path(__file__).resolve().parents[1]

TEST_SETTINGS = {
    "heartbeat_interval": 0.1,
    "dead_node_interval": 3.0,
    "safemode_extension": 0.0,
    "block_report_interval": 60.0,
    "rpc_retry_seconds": 10.0,
    "rpc_timeout": 30.0,
    "lease_monitor_period": 0.2,
    "min_block_size": 4096,
    # many tests run a metadata server alone; clusters with block servers wait for theirs
    # (``wait_ready``), so start-up safe mode need not
    "safemode_min_storage": 0,
    # Hadoop's client port off: a fixed port would collide between clusters (tests that
    # use it set a free one)
    "meta_hdfs_port": 0,
}


def free_port() -> int:
    """A free TCP port BELOW the kernel's ephemeral range, held for this process until the
    test ends (``release_ports``); under pytest-xdist from this worker's own slice.

    Servers that tests restart must come back on the same port. A port handed out by
    ``bind(0)`` lies in the ephemeral range, where the clients that keep reconnecting to the
    dead server may get that very number as their source port (a TCP self-connect) and hold
    it, so the restart fails with EADDRINUSE. Below the range no outgoing socket ever gets it.
    The port is held by a socket bound to it exclusively, then marked SO_REUSEADDR: servers
    (which all set SO_REUSEADDR) can bind and listen beside it, while every other process's
    probe (this one, the etcd tooling's ``free_port``: a bind without SO_REUSEADDR) finds it taken,
    so parallel workers and other test runs on the machine never get the same number.
    """
    ports = _port_slice()
    for _ in range(200):
        port = random.choice(ports)
        if port in _held:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _held[port] = sock
        return port
    raise RuntimeError(f"no free port found in {ports}")


def release_ports() -> None:
    """Let go of the ports ``free_port`` handed out (after each test: tests/conftest.py)."""
    for sock in _held.values():
        sock.close()
    _held.clear()


_held: dict[int, socket.socket] = {}


def _port_slice(low: int = 10000) -> range:
    """10000 up to the ephemeral range; under xdist, worker ``gwN``'s Nth of it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            high = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        width = (high - low) // max(count, 1)
        low += int(worker[2:]) * width
        high = low + width
    return range(low, high)


async def wait_cluster_ready(meta_address: str, n_live: int, timeout: float = 30.0,
                             config: Config | None = None) -> dict:
    """Poll ``report`` until ``n_live`` block servers are live and safe mode is off
    (``config``: the cluster's, for its TLS settings)."""
    deadline = trio.current_time() + timeout
    last = None
    tls = tlsmod.client(config) if config is not None else None
    how = authentication(config, meta_address) if config is not None else {}
    async with RpcClient(meta_address, "harness-probe", retry_seconds=1.0, timeout=5.0,
                         tls=tls, **how) as rpc:
        while trio.current_time() < deadline:
            try:
                last = await rpc.call("report", {}, retry_seconds=0.5)
                if len(last["live_nodes"]) >= n_live and not last["safemode"]["on"]:
                    return last
            except Exception as exc:  # server still starting
                last = exc
            await trio.sleep(0.05)
    raise TimeoutError(f"cluster at {meta_address} not ready after {timeout}s: {last!r:.500}")


class _Task:
    """A server task under its own cancel scope, stoppable and awaitable."""

    def __init__(self):
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.address = None

    async def stop(self):
        self.scope.cancel()
        await self.done.wait()


class InProcessCluster:
    def __init__(self, nursery, base: Path, config: Config, n_storage: int):
        self.nursery = nursery
        self.base = Path(base)
        self.config = config
        self.meta_dir = self.base / "meta"
        self.storage_dirs = [self.base / f"storage{i}" for i in range(n_storage)]
        self.meta: _Task | None = None
        self.storage: list[_Task | None] = [None] * n_storage
        self.meta_address: str | None = None
        self._meta_port = free_port()
        self._storage_ports = [free_port() for _ in range(n_storage)]

    async def _start(self, fn, **kwargs) -> _Task:
        task = _Task()

        async def runner(task_status=trio.TASK_STATUS_IGNORED):
            try:
                with task.scope:
                    await fn(task_status=task_status, **kwargs)
            finally:
                task.done.set()

        task.address = await self.nursery.start(runner)
        return task

    async def start_meta(self):
        from meta.serverrun import run_meta_server

        if self.config.tls == "on" and not self.config.tls_ca_file:
            # the CA the metadata server would make, made first so every config names it
            ca = await trio.to_thread.run_sync(tlsmod.ensure_ca, self.meta_dir)
            self.config = self.config.replace(tls_ca_file=ca)

        self.meta = await self._start(run_meta_server, config=self.config,
                                      data_dir=str(self.meta_dir), host="127.0.0.1",
                                      port=self._meta_port)
        self._meta_port = self.meta.address[1]
        self.meta_address = format_address(self.meta.address)

    async def stop_meta(self):
        await self.meta.stop()

    async def start_storage(self, i: int):
        from storage.server import run_block_server

        # the key the metadata server made (security = secure)
        config = self.config.replace(cluster_key_file=nodeauth.key_path(
            self.config.cluster_key_file, self.meta_dir))
        if config.tls == "on":   # its certificate, issued from the cluster CA
            config = config.replace(**await trio.to_thread.run_sync(
                tlsmod.block_server_settings, self.meta_dir, self.storage_dirs[i],
                tlsmod.default_hosts()))
        task = await self._start(run_block_server, config=config,
                                 data_dir=str(self.storage_dirs[i]),
                                 meta_address=self.meta_address, host="127.0.0.1",
                                 port=self._storage_ports[i])
        self._storage_ports[i] = task.address[1]
        self.storage[i] = task

    async def stop_storage(self, i: int):
        await self.storage[i].stop()
        self.storage[i] = None

    def storage_address(self, i: int) -> str:
        return f"127.0.0.1:{self._storage_ports[i]}"

    async def wait_ready(self, n_live: int | None = None, timeout: float = 30.0) -> dict:
        n = sum(t is not None for t in self.storage) if n_live is None else n_live
        return await wait_cluster_ready(self.meta_address, n, timeout, self.config)

    def client(self, **kwargs):
        from fs.client import AsyncClient

        return AsyncClient(self.meta_address, config=self.config, **kwargs)

    async def remote_config(self, base: Config | None = None) -> Config:
        """Settings of a client on another machine: no local socket (so TCP, and TLS when
        on), authenticated with a delegation token of this process's user, fetched here on
        the local socket."""
        from fs.delegation import TokenFile, TokenId

        async with self.client() as local:
            got = await local.rpc.call("get_delegation_token", {})
        path = self.base / f"remote-{got['id']['seq']}.token"
        TokenFile(TokenId.from_wire(got["id"]), bytes(got["password"]),
                  self.meta_address).save(str(path))
        return (base or self.config).replace(meta_socket="", token_file=str(path))


async def recover_until_closed(client, path: str, timeout: float = 20.0) -> list[bool]:
    """Call recover_lease until it answers True; the answers in order."""
    answers = []
    with trio.fail_after(timeout):
        while True:
            answers.append(await client.recover_lease(path))
            if answers[-1]:
                return answers
            await trio.sleep(0.2)


def make_test_config(**overrides) -> Config:
    return Config.load(env={}, **{**TEST_SETTINGS, **overrides})


@asynccontextmanager
async def inprocess_cluster(tmp_path, n_storage: int = 3, **overrides):
    config = make_test_config(**overrides)
    async with trio.open_nursery() as nursery:
        cluster = InProcessCluster(nursery, Path(tmp_path), config, n_storage)
        await cluster.start_meta()
        for i in range(n_storage):
            await cluster.start_storage(i)
        await cluster.wait_ready(n_storage)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- server logs


class LogWatch:
    """Finds ERROR/CRITICAL lines and tracebacks in the log files of server processes.

    Each watched folder's ``*.log`` files are read from where the previous ``scan`` stopped,
    so every finding is reported once, to the test during which it was written (the conftest
    scans after each test). ``ProcessCluster`` watches its logs folder by itself; tests that
    start servers another way call ``LOG_WATCH.watch(folder)``.
    """

    LEVELS = (" ERROR ", " CRITICAL ")

    def __init__(self):
        self._dirs: list[Path] = []
        self._offsets: dict[Path, int] = {}

    def watch(self, folder) -> None:
        folder = Path(folder)
        if folder not in self._dirs:
            self._dirs.append(folder)

    def skip(self, path) -> None:
        """Ignore what ``path`` holds so far (e.g. a start that failed and was retried)."""
        path = Path(path)
        try:
            self._offsets[path] = path.stat().st_size
        except OSError:
            pass

    def scan(self) -> list[str]:
        """New findings as one-line texts ``<file>: <line>`` (a traceback: its last line)."""
        found = []
        for folder in list(self._dirs):
            if not folder.exists():
                continue
            for path in sorted(folder.glob("*.log")):
                found += self._scan_file(path)
        return found

    def _scan_file(self, path: Path) -> list[str]:
        start = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offsets[path] = start + end
        return [f"{path.name}: {text}"
                for text in log_findings(data[:end].decode(errors="replace").splitlines())]


_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")


def log_findings(lines: list[str]) -> list[str]:
    """ERROR/CRITICAL log lines and tracebacks of a server log, one text each.

    A traceback is everything up to the next timestamped log line (chained and grouped
    exceptions included); it is reported by its last exception line, joined to the log
    line it belongs to, so one allow pattern covers "ERROR ... | Traceback: ValueError: x".
    """
    found: list[str] = []
    owner: str | None = None  # the log line a following traceback belongs to
    owner_index: int | None = None  # its finding, when it is one itself
    i = 0
    while i < len(lines):
        line = lines[i]
        if "Traceback (most recent call last)" in line:
            exception = None
            j = i + 1
            while j < len(lines) and not _LOG_LINE.match(lines[j]):
                text = lines[j].strip(" |+-\t")
                if _EXCEPTION_LINE.match(text) and text.split(":")[0] not in keyword.kwlist:
                    exception = text
                j += 1
            what = f"Traceback: {exception or '(no exception line)'}"
            if owner_index is not None:
                found[owner_index] += f" | {what}"
            else:
                found.append(f"{owner} | {what}" if owner else what)
            owner = owner_index = None
            i = j
            continue
        if _LOG_LINE.match(line):
            owner, owner_index = line.strip(), None
            if any(level in line for level in LogWatch.LEVELS):
                found.append(owner)
                owner_index = len(found) - 1
        i += 1
    return found


LOG_WATCH = LogWatch()


# --------------------------------------------------------------------------- subprocesses


# The running test, set by the conftest: (node id, carries the ``slow`` marker).
RUNNING_TEST: tuple[str, bool] | None = None


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a child a test sends SIGINT (Ctrl-C): a shell that started the
    tests in the background without job control left SIGINT ignored, which the child
    would inherit, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def require_slow_marker(what: str) -> None:
    """Refuse to start real server processes for a test that is not marked ``slow``, so
    ``-m "not slow"`` really leaves out every test that needs them."""
    if RUNNING_TEST is not None and not RUNNING_TEST[1]:
        raise RuntimeError(f"{RUNNING_TEST[0]} starts {what}: mark it @pytest.mark.slow")


class PortTaken(RuntimeError):
    """A server process could not bind the port it was given (``--port``)."""


# how a server names the address it could not listen on (tools.cluster.daemons: the
# OSError's text, then its address and setting)
_IN_USE = re.compile(r"Address already in use(?:: \[?([^\s\]]*?)\]?:(\d+)\b)?")


def start_failure(name: str, status: int, port: int, log_path: Path, began: int,
                  argv: list[str]) -> RuntimeError:
    """Why server process ``name`` exited before reporting its address, from what this start
    wrote to its log (from offset ``began``): ``PortTaken`` when the port it was given is in
    use (another may be tried), else a ``RuntimeError`` naming the cause. Says so when the
    start wrote nothing, with the exit status and the command, so no failure is blank."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(began)
            said = fh.read().decode(errors="replace")
    except OSError as exc:
        said = f"(its log {log_path} could not be read: {exc})"
    how = (f"was killed by {signal.Signals(-status).name}" if status < 0
           else f"exited with status {status}")
    if not said.strip():
        # a write to the log that failed (a full disk) leaves it empty too: say what is free
        try:
            free = f"{shutil.disk_usage(log_path.parent).free // (1 << 20)} MiB free there"
        except OSError as exc:
            free = f"free space unknown: {exc}"
        return RuntimeError(f"{name} {how} before writing anything to {log_path} "
                            f"(its stdout and stderr; {free}); command: {' '.join(argv)}")
    tail = "\n".join(said.splitlines()[-40:])
    taken = _IN_USE.search(said)
    if taken is not None and taken.group(2) in (None, str(port)):
        return PortTaken(f"{name}: port {port} taken:\n{tail}")
    if taken is not None:   # a port from its settings: another --port would not help
        return RuntimeError(f"{name}: port {taken.group(2)} from its settings is taken "
                            f"(not its --port {port}):\n{tail}")
    return RuntimeError(f"{name} {how}:\n{tail}")


class ProcessCluster:
    """A metadata server and N block servers as real ``python -m tools`` processes."""

    def __init__(self, base_dir, n_storage: int = 3, settings: dict | None = None,
                 python: str = sys.executable, meta_http: bool = False,
                 meta_http_port: int = 0, placement=None):
        """``meta_http``: the metadata server serves its web pages (on a free port);
        ``meta_http_port``: on that port. ``placement``: where each server process runs
        (``hostkit.Placement``: its ``command(name, argv)`` and the ``bind_host(name)`` it
        gets as ``--host``); None: here, on the bind_host setting."""
        require_slow_marker("server processes (ProcessCluster)")
        self.base = Path(base_dir)
        self.n_storage = n_storage
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.python = python
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.meta_address: str | None = None
        self.placement = placement
        # 0: no web pages
        self.meta_http_port = meta_http_port or (free_port() if meta_http else 0)
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        LOG_WATCH.watch(self.base / "logs")

    # -- plumbing
    def _set_args(self, name: str | None = None) -> list[str]:
        """The settings as ``--set`` arguments for the process ``name``."""
        out = []
        for key, value in self.settings.items():
            out += ["--set", f"{key}={value}"]
        return out

    def _spawn(self, name: str, args: list[str]) -> str:
        first_start = name not in self.ports
        for attempt in range(3):
            try:
                return self._spawn_once(name, args)
            except PortTaken:
                # free_port() only probed the port; on a shared machine another process may
                # bind it first. Only a first start may move: a restart keeps its address.
                if not first_start or attempt == 2:
                    raise
                LOG_WATCH.skip(self.base / "logs" / f"{name}.log")
                del self.ports[name]
        raise AssertionError("unreachable")

    def _spawn_once(self, name: str, args: list[str]) -> str:
        addr_file = self.base / "run" / f"{name}.addr"
        addr_file.parent.mkdir(parents=True, exist_ok=True)
        addr_file.unlink(missing_ok=True)
        log_path = self.base / "logs" / f"{name}.log"
        log = open(log_path, "ab")
        began = log.tell()   # this start's output: a restart appends to the earlier lives'
        port = str(self.ports.setdefault(name, free_port()))
        argv = [self.python, "-m", "tools", *args, "--port", port, "--address-file",
                str(addr_file), *self._set_args(name)]
        if self.placement is not None:
            argv = self.placement.command(name, [*argv, "--host",
                                                 self.placement.bind_host(name)])
        proc = subprocess.Popen(
            argv,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env_base(), start_new_session=True)
        log.close()
        self.procs[name] = proc
        deadline = time.monotonic() + 30
        while not addr_file.exists():
            if proc.poll() is not None:
                raise start_failure(name, proc.returncode, int(port), log_path, began, argv)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not report its address:\n{self.log_tail(name)}")
            time.sleep(0.02)
        address = addr_file.read_text().strip()
        self.ports[name] = int(address.rsplit(":", 1)[1])
        return address

    def env_base(self) -> dict:
        env = dict(os.environ)
        env.pop("LEASEFS_META", None)
        env["LEASEFS_HOME"] = str(self.base / "home")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    @property
    def env(self) -> dict:
        """Environment for CLI subprocesses that should find this cluster."""
        tls = ({"LEASEFS_TLS": "on", "LEASEFS_TLS_CA_FILE": self.settings["tls_ca_file"]}
               if self.settings.get("tls") == "on" else {})
        return {**self.env_base(), "LEASEFS_META": self.meta_address, **tls}

    def config(self) -> Config:
        """A client's settings for this cluster (its TLS ones included)."""
        keep = ("tls", "tls_ca_file")
        return make_test_config(**{k: v for k, v in self.settings.items() if k in keep})

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.base / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def meta_dir(self) -> Path:
        return self.base / "meta"

    def storage_dir(self, i: int) -> Path:
        return self.base / f"storage{i}"

    # -- lifecycle
    def start(self, wait: bool = True):
        self.start_meta()
        for i in range(self.n_storage):
            self.start_storage(i)
        if wait:
            self.wait_ready()
        return self

    def start_meta(self):
        if self.settings.get("tls") == "on" and not self.settings.get("tls_ca_file"):
            # made before the metadata server starts, so every process's settings name it
            self.settings["tls_ca_file"] = tlsmod.ensure_ca(self.meta_dir())
        self.meta_address = self._spawn("meta", ["meta", "--data", str(self.meta_dir()),
                                                 "--http-port", str(self.meta_http_port)])

    def start_storage(self, i: int):
        # the metadata server made its cluster key at its first start (security = secure)
        key = nodeauth.key_path(self.settings.get("cluster_key_file", ""), self.meta_dir())
        tls = []
        if self.settings.get("tls") == "on":
            for name, value in tlsmod.block_server_settings(
                    self.meta_dir(), self.storage_dir(i), tlsmod.default_hosts()).items():
                tls += ["--set", f"{name}={value}"]
        self._spawn(f"storage{i}", ["storage", "--data", str(self.storage_dir(i)),
                                    "--meta", self.meta_address,
                                    "--set", f"cluster_key_file={key}", *tls])

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def storage_http_port(self, i: int) -> int:
        """The port of block server ``i``'s web page (``storage_http_port`` 0: any free
        one, which it logs)."""
        def find():
            for line in (self.base / "logs" / f"storage{i}.log").read_text().splitlines():
                if "block server web page on http://" in line:
                    return int(line.rsplit(":", 1)[1].strip("/ \n"))
            return None
        port = poll_until(find, 20)
        assert port, self.log_tail(f"storage{i}")
        return port

    def kill(self, name: str, sig=signal.SIGKILL, timeout: float = 30.0):
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill_meta(self, sig=signal.SIGKILL):
        self.kill("meta", sig)

    def kill_storage(self, i: int, sig=signal.SIGKILL):
        self.kill(f"storage{i}", sig)

    def wait_ready(self, n_live: int | None = None, timeout: float = 60.0) -> dict:
        n = self.n_storage if n_live is None else n_live
        return trio.run(wait_cluster_ready, self.meta_address, n, timeout, self.config())

    def stop(self):
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM, timeout=10)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            # __exit__ is not called when __enter__ raises: the servers that did start would
            # run on past the test (their own sessions), holding ports and CPU
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()

    def client(self):
        from fs.client import Client

        return Client(self.meta_address, config=self.config())


def store_problems(cluster: ProcessCluster) -> list[str]:
    """``check_namespace`` of the stopped metadata server's LevelDB store."""
    return namespace_problems(cluster.meta_dir())


def namespace_problems(meta_dir) -> list[str]:
    """``check_namespace`` of the LevelDB store in a stopped metadata server's folder."""
    from meta.namespace.invariants import check_namespace
    from meta.journal.kv import PlyvelStore

    store = PlyvelStore(str(Path(meta_dir) / "db"), create=False)
    try:
        return check_namespace(store)
    finally:
        store.close()


def storage_index(cluster: ProcessCluster, address: str) -> int:
    """The index of the block server of ``cluster`` listening at ``address``."""
    port = int(address.rsplit(":", 1)[1])
    return next(i for i in range(cluster.n_storage) if cluster.ports[f"storage{i}"] == port)


def flip_finalized_byte(cluster: ProcessCluster, location: dict, block_id: int,
                        offset: int) -> Path:
    """Flip one byte of the finalized replica file of ``block_id`` on the block server at
    ``location`` (a rotting disk: its stored CRC32C no longer matches); the file's path."""
    index = storage_index(cluster, location["address"])
    replica = next(p for p in cluster.storage_dir(index).rglob(f"blk_{block_id}")
                   if "finalized" in str(p))
    with open(replica, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    return replica


def leasefs(cluster: ProcessCluster, *args) -> subprocess.CompletedProcess:
    """``leasefs ARGS`` against ``cluster`` as a user runs it (text output captured)."""
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=cluster.env,
                          capture_output=True, text=True, timeout=60)


def wait_mounted(mp: Path, proc: subprocess.Popen | None, log: Path, timeout: float = 30.0):
    """Until ``mp`` is a mount point; fails naming the log when ``proc`` exited first."""
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mp):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mp} not mounted:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.05)


class Mount:
    """One ``leasefs mount --foreground`` process of ``cluster`` at a fresh mountpoint."""

    def __init__(self, cluster: ProcessCluster, name: str, *extra: str, launcher=None,
                 env: dict | None = None):
        """``launcher(argv)``: the command line that runs ``argv`` where the mount is to
        run (``hostkit``: on a client host), with ``env`` instead of the cluster's."""
        self.cluster = cluster
        self.name = name
        self.extra = list(extra)
        self.launcher = launcher
        self.env = env
        self.mp = Path(tempfile.mkdtemp(prefix=f"leasefs-{name}-"))
        os.chmod(self.mp, 0o755)
        self.log = cluster.base / "logs" / f"mount-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mount":
        with open(self.log, "ab") as out:
            argv = [sys.executable, "-m", "tools", "mount", "--foreground", str(self.mp),
                    "-o", "allow_other", "--cache-dir", str(self.cluster.base / "cache"),
                    "--log-level", "INFO", *self.extra]
            self.proc = subprocess.Popen(
                self.launcher(argv) if self.launcher else argv,
                env=self.env or self.cluster.env, cwd=REPO, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_mounted(self.mp, self.proc, self.log)
        return self

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Unmount cleanly and check the process exited 0 without a traceback."""
        if os.path.ismount(self.mp):
            subprocess.run(["fusermount3", "-u", str(self.mp)], check=True, capture_output=True)
        assert self.proc is not None
        assert self.proc.wait(60) == 0, self.log_text()
        assert "Traceback" not in self.log.read_text(errors="replace"), self.log_text()
        self.proc = None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        self.proc = None
        subprocess.run(["umount", "-l", str(self.mp)], capture_output=True)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if os.path.ismount(self.mp) or _stale(self.mp):
            subprocess.run(["umount", "-l", str(self.mp)], capture_output=True)
        shutil.rmtree(self.mp, ignore_errors=True)


def errno_of(fn, *args, **kwargs) -> int:
    """The errno of the ``OSError`` that ``fn(*args, **kwargs)`` must raise."""
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    return info.value.errno


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of process ``pid`` is stopped. ``kill(SIGSTOP)`` returns before
    that: a thread running on another core goes on for a moment, and a test that counts on
    the process being frozen (nothing it answers from now on) must wait for it."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                # the state follows the command name, which may itself hold ") "
                states.append((task / "stat").read_text().rsplit(") ", 1)[1][:1])
            except (OSError, IndexError):
                continue   # a thread that just ended
        if states and all(state in "Tt" for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} is not stopped after {timeout} s: {states}")
        time.sleep(0.005)


def poll_until(check, timeout: float = 20.0):
    """``check()``'s first truthy result, or its last result once ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


async def wait_until(check, timeout: float = 20.0, interval: float = 0.05):
    """``check()``'s first truthy result (awaited when ``check`` is async), or its last
    result once ``timeout`` passed: the async ``poll_until``, for a test that waits for a
    server to act (a lease to lapse, a checkpoint, a resent command) instead of sleeping as
    long as that should take."""
    deadline = trio.current_time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result or trio.current_time() > deadline:
            return result
        await trio.sleep(interval)


def mounted(cluster: ProcessCluster, name: str, *extra: str, **how):
    """A started ``Mount`` for a fixture to ``yield from``: stopped cleanly (exit 0, no
    traceback) after its tests, cleaned up whatever happened (``how``: ``Mount``'s
    ``launcher`` and ``env``)."""
    m = Mount(cluster, name, *extra, **how)
    try:
        m.start()
        yield m
        m.stop()
    finally:
        m.cleanup()


def _stale(path: Path) -> bool:
    try:
        os.stat(path)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
