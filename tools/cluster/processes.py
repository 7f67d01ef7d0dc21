"""The parts of a cluster on one machine that ``leasefs cluster`` (``embedded.py``, and
``embedded_ha.py`` with ``--ha``) and the benchmarks' private clusters share: the home
folder's layout and its state file, starting a server as a detached process and waiting for
its address, telling our own server processes from recycled pids (``/proc``), readiness
probes, the cluster's TLS files and its mount.

Why a module of its own: the plain and the HA launcher both start, check and stop the same
kind of processes in the same folders; keeping these here lets each launcher read as its
own sequence of steps.

Concurrency contract: a short-lived CLI process; readiness probing runs in one ``trio.run``
on the main thread.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import trio

from fs.client import authentication
from fs import tls as tlsmod
from fs.config import Config, default_home
from fs.errors import InvalidArgument, LeaseFSError, NotDirectory, sole_exception
from fs.rpc import RpcClient

from ..common import PROG, SOURCE_TREE

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
DEFAULT_STORAGE = 3
DEFAULT_META_PORT = 8020
DEFAULT_STORAGE_PORT = 9866
DEFAULT_HTTP_PORT = 9870


# --------------------------------------------------------------------------- layout, state

def client_prefix(home: str) -> str:
    """How a command typed next finds the cluster at ``home``: plain ``leasefs `` when it is
    the home clients look in by themselves, else with ``LEASEFS_HOME`` set to it."""
    import shlex

    if os.path.abspath(default_home()) == os.path.abspath(home):
        return f"{PROG} "
    return f"LEASEFS_HOME={shlex.quote(home)} {PROG} "


class Layout:
    """Where everything of one cluster home lives."""

    def __init__(self, home: str):
        self.home = os.path.abspath(home)
        self.state = os.path.join(self.home, STATE_FILE)
        self.logs = os.path.join(self.home, "logs")
        self.run = os.path.join(self.home, "run")
        self.meta_data = os.path.join(self.home, "meta")

    def storage_data(self, i: int) -> str:
        return os.path.join(self.home, f"storage{i}")

    def data_dir(self, name: str) -> str:
        return self.meta_data if name == "meta" else os.path.join(self.home, name)

    def log_file(self, name: str) -> str:
        return os.path.join(self.logs, f"{name}.log")

    def pid_file(self, name: str) -> str:
        return os.path.join(self.run, f"{name}.pid")

    def addr_file(self, name: str) -> str:
        return os.path.join(self.run, f"{name}.addr")


def load_state(layout: Layout) -> dict | None:
    try:
        with open(layout.state) as fh:
            state = json.load(fh)
        return state if isinstance(state, dict) else None
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # the home itself (or a folder above it) is a file
        raise NotDirectory(f"{os.path.dirname(layout.state)}: not a directory") from None
    except (OSError, ValueError) as exc:
        raise LeaseFSError(f"{layout.state}: unreadable cluster state ({exc}); "
                           "remove it to start over") from None


def save_state(layout: Layout, state: dict) -> None:
    os.makedirs(layout.home, exist_ok=True)
    tmp = layout.state + f".{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, layout.state)


def _write_small(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- processes

def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state letter first),
    or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:].split() or None
    except (OSError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The ``/proc/<pid>/stat`` state letter, or None when there is no such process."""
    fields = _stat_fields(pid)
    return fields[0].decode() if fields else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (0.0 once it is gone)."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def is_ours(pid: int | None, role: str, data_dir: str) -> bool:
    """Is ``pid`` a live (not zombie) leasefs ``role`` server for ``data_dir``?"""
    if not pid or process_state(pid) in (None, "Z", "X"):
        return False
    argv = cmdline(pid)
    if not argv:
        return False
    launched_by_us = "tools" in argv or any(os.path.basename(a) == "leasefs" for a in argv)
    try:
        data = argv[argv.index("--data") + 1]
    except (ValueError, IndexError):
        return False
    return launched_by_us and role in argv and os.path.abspath(data) == os.path.abspath(data_dir)


def spawn(layout: Layout, name: str, role: str, args: list[str], settings: dict) -> subprocess.Popen:
    """Start ``python -m tools <role> ...`` detached, logging to ``logs/<name>.log``."""
    os.makedirs(layout.logs, exist_ok=True)
    os.makedirs(layout.run, exist_ok=True)
    addr_file = layout.addr_file(name)
    try:
        os.unlink(addr_file)
    except FileNotFoundError:
        pass
    argv = [sys.executable, "-m", "tools", role, "--data", layout.data_dir(name),
            "--address-file", addr_file, *args]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    env = dict(os.environ)
    env.pop("LEASEFS_META", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SOURCE_TREE, env.get("PYTHONPATH")) if p)
    with open(layout.log_file(name), "ab") as logf:
        logf.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n"
                   .encode())
        logf.flush()
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=layout.home, env=env, close_fds=True)
    _write_small(layout.pid_file(name), f"{proc.pid}\n")
    return proc


def log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


class StartupFailed(Exception):
    def __init__(self, message: str, log_path: str | None = None):
        super().__init__(message)
        self.log_path = log_path


def wait_address(layout: Layout, name: str, proc: subprocess.Popen, deadline: float) -> str:
    path = layout.addr_file(name)
    while True:
        try:
            with open(path) as fh:
                text = fh.read().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        code = proc.poll()
        if code is not None:
            raise StartupFailed(f"{name} exited with status {code} while starting; "
                                f"see {layout.log_file(name)}", layout.log_file(name))
        if time.monotonic() > deadline:
            raise StartupFailed(f"{name} did not start listening in time; "
                                f"see {layout.log_file(name)}", layout.log_file(name))
        time.sleep(0.05)


async def probe_report(meta_address: str, timeout: float = 5.0, ca_file: str = "") -> dict:
    tls = tlsmod.ClientTls(ca_file) if ca_file else None
    async with RpcClient(meta_address, f"leasefs-cluster-{os.getpid()}", timeout=timeout,
                         retry_seconds=0.5, connect_timeout=min(timeout, 2.0), tls=tls,
                         **authentication(Config.load(), meta_address)) as rpc:
        return await rpc.call("report", {})


def report_or_none(meta_address: str, timeout: float = 5.0, ca_file: str = ""):
    """``(report, None)`` or ``(None, error)``; ``ca_file``: the cluster's CA when it runs
    with TLS."""
    try:
        return trio.run(probe_report, meta_address, timeout, ca_file), None
    except BaseException as group:  # trio wraps in exception groups
        exc = sole_exception(group)
        if isinstance(exc, (LeaseFSError, OSError)):
            return None, exc
        raise


def wait_ready(layout: Layout, meta_address: str, n: int, procs: dict, deadline: float,
               ca_file: str = "") -> dict:
    """Until the metadata server answers, ``n`` block servers are live and safe mode is off."""
    last_problem = "metadata server not answering yet"
    while True:
        for name, proc in procs.items():
            code = proc.poll()
            if code is not None:
                raise StartupFailed(f"{name} exited with status {code}; see "
                                    f"{layout.log_file(name)}", layout.log_file(name))
        report, error = report_or_none(meta_address, timeout=2.0, ca_file=ca_file)
        if report is not None:
            live = len(report.get("live_nodes", []))
            safemode = report.get("safemode") or {}
            if live >= n and not safemode.get("on"):
                return report
            if live < n:
                last_problem = f"{live} of {n} block servers live"
            else:
                last_problem = f"safe mode is on ({safemode.get('reason') or 'no reason given'})"
        else:
            last_problem = f"metadata server not answering ({error})"
        if time.monotonic() > deadline:
            raise StartupFailed(f"cluster not ready in time: {last_problem}; see the logs in "
                                f"{layout.logs} (meta.log first)", layout.log_file("meta"))
        time.sleep(0.2)


def embedded_defaults(n: int) -> dict:
    # A whole-cluster launch knows how many block servers to expect: wait for all of them
    # (safemode_min_storage) and skip most of HDFS's 30 s safe-mode extension, which exists
    # for clusters whose nodes report at unknown times. With 3 block servers or fewer there
    # is no spare to replace a failed pipeline node (HDFS advises such clusters not to insist
    # on one): writers go on with the survivors and re-replication restores the count.
    return {"safemode_min_storage": n, "safemode_extension": 2.0,
            "replace_datanode_best_effort": n <= 3}


def start_block_servers(layout: Layout, state: dict, args, alive: list[bool], procs: dict,
                        started: list, deadline: float, settings_of) -> None:
    """Start every block server of ``state["storage"]`` not ``alive`` against
    ``state["meta_address"]`` (its recorded port, else ``--storage-port`` + i, or a free one
    with 0; ``settings_of(i)`` its settings), record it, and wait for every started one's
    address; then the cluster is recorded as running."""
    storage = state["storage"]
    base = args.storage_port if args.storage_port is not None else DEFAULT_STORAGE_PORT
    for i, running in enumerate(alive):
        if running:
            continue
        name = f"storage{i}"
        port = storage[i].get("port")
        if port is None:
            port = base + i if base else 0
        procs[name] = spawn(layout, name, "storage",
                            ["--meta", state["meta_address"], "--port", str(port)],
                            settings_of(i))
        started.append(name)
        storage[i]["pid"] = procs[name].pid
        save_state(layout, state)
    for i in range(len(alive)):
        name = f"storage{i}"
        if name in procs:
            storage[i]["address"] = wait_address(layout, name, procs[name], deadline)
            storage[i]["port"] = int(storage[i]["address"].rsplit(":", 1)[1])
    state["running"] = True
    save_state(layout, state)


def cluster_tls(config: Config, ca_home: str, meta_dirs: list[str],
                storage_dirs: list[str]) -> tuple[str, list[dict], list[dict]]:
    """``tls = on`` for ``cluster up`` (both modes): ``(CA file, settings of each metadata
    server of meta_dirs, settings of each block server of storage_dirs)``. The CA is kept
    in ``<ca_home>/tls/`` (made when missing) and each server gets a certificate from it for
    this machine's names in ``<its data>/tls/``, kept while it still covers them, so a
    restart reuses both. A certificate chosen with ``tls_cert_file`` is used as it is (all
    servers share the settings then). ``("", [{}...], [{}...])`` with tls off. Blocking."""
    none = ([{} for _ in meta_dirs], [{} for _ in storage_dirs])
    if config.tls != "on":
        return ("", *none)
    if config.tls_cert_file:
        return (config.tls_ca_file or tlsmod.ensure_ca(ca_home), *none)
    own = tlsmod.ca_paths(ca_home)[0]
    if config.tls_ca_file and os.path.abspath(config.tls_ca_file) != os.path.abspath(own):
        raise InvalidArgument(f"tls_ca_file is {config.tls_ca_file} but no tls_cert_file is "
                              f"set: cluster up issues certificates only from its own CA "
                              f"({own}); set tls_cert_file and tls_key_file to one from "
                              f"your CA, or neither")
    hosts = tlsmod.default_hosts(config.bind_host, config.advertise_host)
    return (tlsmod.ensure_ca(ca_home),
            [tlsmod.server_settings(ca_home, d, hosts, "meta") for d in meta_dirs],
            [tlsmod.server_settings(ca_home, d, hosts, "storage") for d in storage_dirs])


# --------------------------------------------------------------------------- the mount

def mounted_fuse(path: str) -> bool:
    """True if ``path`` is a FUSE mount point (alive or stale) in /proc/self/mounts."""
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[1] == path and fields[2].startswith("fuse"):
                    return True
    except OSError:
        pass
    return False


def _mount_alive(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except OSError:   # ENOTCONN: the mount daemon is gone
        return False


def ensure_mounted(layout, state: dict, mountpoint: str, address: str) -> int:
    """Mount the cluster at ``mountpoint`` with the daemonized ``leasefs mount`` (a stale
    mount left by a dead daemon is lazily unmounted first); remembered for ``down``."""
    if mounted_fuse(mountpoint):
        if _mount_alive(mountpoint):
            print(f"  mounted at {mountpoint} (already)")
            state["mount"] = mountpoint
            save_state(layout, state)
            return 0
        subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)
    os.makedirs(mountpoint, exist_ok=True)
    tls = (["--set", "tls=on", "--set", f"tls_ca_file={state['tls_ca_file']}"]
           if state.get("tls_ca_file") else [])
    proc = subprocess.run([sys.executable, "-m", "tools", "mount", mountpoint, "--meta", address,
                           "--log-file", os.path.join(layout.logs, "mount.log"), *tls],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{PROG} cluster up: mount at {mountpoint} failed: "
              f"{(proc.stderr or proc.stdout).strip()}", file=sys.stderr)
        return 1
    state["mount"] = mountpoint
    save_state(layout, state)
    print(f"  mounted at {mountpoint}  (try: ls -l {mountpoint}; 'leasefs umount' or "
          f"'leasefs cluster down' unmounts)")
    return 0
