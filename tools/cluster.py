"""``leasefs cluster up|down|status``: the embedded default cluster on one machine.

Why: one command should give a working filesystem — a metadata server and N block servers
as detached local processes, all state under one home folder (``LEASEFS_HOME`` or
``~/.leasefs``)::

    <home>/cluster.json      address, pids, ports, settings (read by address discovery)
    <home>/meta/             metadata server data (LevelDB namespace + edit journal)
    <home>/storage<i>/       block server i's replicas
    <home>/logs/<name>.log   each process's log (appended across restarts)
    <home>/run/<name>.pid    pid files; <name>.addr the bound address each server wrote

``up`` is idempotent: a running cluster is left alone, a half-dead one gets exactly its
missing processes restarted (on their recorded ports, so the address stays valid). ``down``
signals only the pids it recorded, after checking ``/proc/<pid>/cmdline`` shows our own
server for that data folder (a recycled pid is never killed), SIGTERM first, SIGKILL after a
timeout; data is kept.

Concurrency contract: a short-lived CLI process; readiness probing runs in one ``trio.run``
on the main thread. Two ``cluster up`` in the same home at once are not supported.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import trio

from fs import nodeauth
from fs.client import authentication
from fs import tls as tlsmod
from fs.config import Config, default_home
from fs.errors import InvalidArgument, LeaseFSError, NotDirectory, sole_exception
from fs.rpc import RpcClient

from .common import PROG
from .formatting import UsageError, parse_settings

log = logging.getLogger(__name__)

STATE_FILE = "cluster.json"
DEFAULT_STORAGE = 3
DEFAULT_META_PORT = 8020
DEFAULT_STORAGE_PORT = 9866
DEFAULT_HTTP_PORT = 9870
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
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


# --------------------------------------------------------------------------- commands

def _home(args) -> Layout:
    return Layout(args.home or default_home())


def embedded_defaults(n: int) -> dict:
    # A whole-cluster launch knows how many block servers to expect: wait for all of them
    # (safemode_min_storage) and skip most of HDFS's 30 s safe-mode extension, which exists
    # for clusters whose nodes report at unknown times. With 3 block servers or fewer there
    # is no spare to replace a failed pipeline node (HDFS advises such clusters not to insist
    # on one): writers go on with the survivors and re-replication restores the count.
    return {"safemode_min_storage": n, "safemode_extension": 2.0,
            "replace_datanode_best_effort": n <= 3}


def _members(state: dict) -> list[tuple[str, str]]:
    if state.get("ha"):
        from .clusterha import members
        return members(state)
    n = len(state.get("storage", []))
    return [("meta", "meta")] + [(f"storage{i}", "storage") for i in range(n)]


def _pid_of(state: dict, name: str) -> int | None:
    if state.get("ha"):
        from .clusterha import pid_of
        return pid_of(state, name)
    entry = state["meta"] if name == "meta" else state["storage"][int(name[len("storage"):])]
    return entry.get("pid")


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


def cmd_up(args) -> int:
    layout = _home(args)
    state = load_state(layout) or {}
    if args.ha or state.get("ha"):
        from .clusterha import cmd_up as cmd_up_ha
        return cmd_up_ha(args, layout, state)
    recorded_n = len(state.get("storage", []))
    n = args.storage if args.storage is not None else (recorded_n or DEFAULT_STORAGE)
    if n < 1:
        raise UsageError("--storage must be at least 1")
    n = max(n, recorded_n)  # never forget block servers that hold data
    if args.replication is not None and args.replication < 1:
        raise UsageError("--replication must be at least 1")
    settings = {**embedded_defaults(n), **state.get("settings", {})}
    settings["safemode_min_storage"] = n
    if args.replication is not None:
        settings["replication"] = args.replication
    settings.setdefault("replication", min(3, n))
    settings.update(parse_settings(getattr(args, "set", None)))
    Config.load(env={}, **settings)  # refuse a bad --set here, not in n log files

    state.setdefault("meta", {})
    storage = state.setdefault("storage", [])
    while len(storage) < n:
        storage.append({})
    state.update(home=layout.home, settings=settings)
    meta_alive = is_ours(state["meta"].get("pid"), "meta", layout.meta_data)
    storage_alive = [is_ours(s.get("pid"), "storage", layout.storage_data(i))
                     for i, s in enumerate(storage)]
    if args.storage is not None and args.storage < recorded_n:
        print(f"{PROG} cluster up: this cluster has {recorded_n} block servers holding data; "
              f"keeping all of them", file=sys.stderr)
    if meta_alive and all(storage_alive):
        print(f"leasefs cluster is already up at {state.get('meta_address')} "
              f"(metadata server pid {state['meta']['pid']}, {n} block servers)")
        if getattr(args, "set", None) or args.replication is not None:
            print(f"{PROG} cluster up: settings are not applied to running servers; "
                  "run 'leasefs cluster down' first", file=sys.stderr)
        mountpoint = args.mount or state.get("mount")
        if mountpoint:   # the mount may have died on its own: bring it back
            return ensure_mounted(layout, state, os.path.abspath(mountpoint),
                                   state.get("meta_address"))
        return 0

    deadline = time.monotonic() + args.timeout
    procs: dict[str, subprocess.Popen] = {}
    started = []
    # the cluster key (security = secure): made here, in the metadata server's folder, so the
    # block servers started next read the same file; nothing to set up by hand
    key_file = nodeauth.key_path(settings.get("cluster_key_file", ""), layout.meta_data)
    try:
        nodeauth.ensure_key(key_file)
    except (OSError, LeaseFSError) as exc:
        print(f"{PROG} cluster up: cluster key {key_file}: {exc}", file=sys.stderr)
        return 1
    # tls = on: the CA made here too, and each block server's certificate issued from it
    # (the block servers never read the CA key); clients find the CA through cluster.json.
    # The metadata server issues its own certificate from the CA in its data folder.
    try:
        ca_file, _, storage_tls = cluster_tls(Config.load(env={}, **settings),
                                              layout.meta_data, [],
                                              [layout.storage_data(i) for i in range(n)])
    except (OSError, LeaseFSError) as exc:
        print(f"{PROG} cluster up: TLS certificates: {exc}", file=sys.stderr)
        return 1
    state["tls_ca_file"] = ca_file
    try:
        if not meta_alive:
            port = state["meta"].get("port")  # a restart keeps the recorded address valid
            if port is None:
                port = args.port if args.port is not None else DEFAULT_META_PORT
            http_port = args.http_port
            if http_port is None:
                http_port = state["meta"].get("http_port", 0 if port == 0 else DEFAULT_HTTP_PORT)
            procs["meta"] = spawn(layout, "meta", "meta",
                                  ["--port", str(port), "--http-port", str(http_port)],
                                  {**settings, "tls_ca_file": ca_file} if ca_file else settings)
            started.append("meta")
            state["meta"].update(pid=procs["meta"].pid, http_port=http_port)
            save_state(layout, state)
            address = wait_address(layout, "meta", procs["meta"], deadline)
            state["meta_address"] = address
            state["meta"]["port"] = int(address.rsplit(":", 1)[1])
            save_state(layout, state)
        address = state["meta_address"]
        start_block_servers(layout, state, args, storage_alive, procs, started, deadline,
                            lambda i: {**settings, "cluster_key_file": key_file,
                                       **storage_tls[i]})
        report = wait_ready(layout, address, n, procs, deadline, ca_file)
    except StartupFailed as exc:
        print(f"{PROG} cluster up: {exc}", file=sys.stderr)
        if exc.log_path:
            tail = log_tail(exc.log_path)
            if tail:
                print(f"  last lines of {exc.log_path}:\n{tail}", file=sys.stderr)
        print(f"  (processes started so far keep running; stop them with "
              f"'leasefs cluster down --home {layout.home}')", file=sys.stderr)
        return 1
    restarted = "" if len(started) == n + 1 else f" (restarted: {', '.join(started)})"
    pids = ", ".join(str(s["pid"]) for s in storage)
    print(f"leasefs cluster is up at {address}{restarted}")
    print(f"  metadata server pid {state['meta']['pid']}; {len(report['live_nodes'])} block "
          f"servers live (pids {pids}); default replication {settings['replication']}")
    print(f"  home {layout.home}  (logs in {layout.logs})")
    run = client_prefix(layout.home)
    print(f"  try: {run}ls -l /   |   {run}put FILE /   |   {run}report")
    mountpoint = args.mount or state.get("mount")
    if mountpoint:
        return ensure_mounted(layout, state, os.path.abspath(mountpoint), address)
    return 0


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


def _unmount(state: dict) -> None:
    mountpoint = state.get("mount")
    if not mountpoint or not mounted_fuse(mountpoint):
        return
    proc = subprocess.run([sys.executable, "-m", "tools", "umount", "--force", mountpoint],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        print(f"unmounted {mountpoint}")
    else:
        print(f"{PROG} cluster down: unmounting {mountpoint} failed "
              f"({(proc.stderr or proc.stdout).strip()}); lazy unmount", file=sys.stderr)
        subprocess.run(["umount", "-l", mountpoint], check=False, capture_output=True)


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def cmd_down(args) -> int:
    layout = _home(args)
    state = load_state(layout)
    if state is None:
        print(f"no leasefs cluster recorded in {layout.home}; nothing to stop")
        return 0
    _unmount(state)   # first: the mount publishes its open files while the servers still run
    victims = []
    # block servers first, so they do not log connection errors about a vanished meta
    for name, role in reversed(_members(state)):
        pid = _pid_of(state, name)
        if not pid:
            continue
        if is_ours(pid, role, layout.data_dir(name)):
            victims.append((name, role, pid))
        elif process_state(pid) not in (None, "Z", "X"):
            print(f"{PROG} cluster down: {name}: pid {pid} is not our {role} server any more "
                  f"({' '.join(cmdline(pid))[:120] or '?'}); left alone", file=sys.stderr)
    for name, role, pid in victims:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    remaining = list(victims)
    while remaining and time.monotonic() < deadline:
        remaining = [v for v in remaining if is_ours(v[2], v[1], layout.data_dir(v[0]))]
        if remaining:
            time.sleep(0.1)
    for name, role, pid in remaining:
        if is_ours(pid, role, layout.data_dir(name)):
            print(f"{PROG} cluster down: {name} (pid {pid}) ignored SIGTERM for "
                  f"{args.timeout:g} s; sending SIGKILL", file=sys.stderr)
            _signal(pid, signal.SIGKILL)
    if state.get("ha"):   # last: the metadata servers need it while they stop
        from .clusterha import stop_etcd
        victims += [(name, "etcd", None) for name in stop_etcd(layout, state, args.timeout)]
    for name, _ in _members(state):
        for path in (layout.pid_file(name), layout.addr_file(name)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    state["running"] = False
    save_state(layout, state)
    if victims:
        print("stopped " + ", ".join(name if pid is None else f"{name} (pid {pid})"
                                     for name, _, pid in victims)
              + f"; data kept in {layout.home}")
    else:
        print(f"leasefs cluster in {layout.home} was not running")
    return 0


def cmd_status(args) -> int:
    layout = _home(args)
    state = load_state(layout)
    if state is None:
        if args.json:
            print(json.dumps({"home": layout.home, "state": "absent"}))
        else:
            print(f"no leasefs cluster recorded in {layout.home}")
        return 3
    if state.get("ha"):
        return _status_ha(args, layout, state)
    procs = []
    for name, role in _members(state):
        pid = _pid_of(state, name)
        entry = state["meta"] if name == "meta" else state["storage"][int(name[7:])]
        procs.append({"name": name, "pid": pid, "alive": is_ours(pid, role, layout.data_dir(name)),
                      "address": state.get("meta_address") if name == "meta" else entry.get("address")})
    report, error = (None, None)
    if procs[0]["alive"]:
        report, error = report_or_none(state["meta_address"], timeout=3.0,
                                       ca_file=state.get("tls_ca_file") or "")
    n_alive = sum(p["alive"] for p in procs)
    if n_alive == 0:
        overall, code = "down", 3
    elif n_alive == len(procs) and report is not None and \
            len(report.get("live_nodes", [])) >= len(procs) - 1:
        overall, code = "up", 0
    else:
        overall, code = "degraded", 1
    _print_status(args, layout, state, overall, procs, report, nodes=True,
                  error_line=f"  metadata server not answering: {error}"
                  if procs[0]["alive"] else None)
    return code


def _print_status(args, layout: Layout, state: dict, overall: str, procs: list[dict],
                  report: dict | None, *, ha: dict | None = None, lines=(),
                  nodes: bool = False, error_line: str | None = None) -> None:
    """``cluster status`` output, JSON or text: the processes, then the (active) metadata
    server's view of the block servers (each one with ``nodes``), or ``error_line``."""
    if args.json:
        out = {"home": layout.home, "state": overall, **({"ha": ha} if ha is not None else {}),
               "meta_address": state.get("meta_address"),
               "tls_ca_file": state.get("tls_ca_file") or None, "processes": procs,
               "live_nodes": None if report is None else report.get("live_nodes"),
               "safemode": None if report is None else report.get("safemode")}
        print(json.dumps(out, indent=2, default=str))
        return
    print(f"leasefs cluster in {layout.home}: {overall}" + (" (HA)" if ha is not None else ""))
    print(f"  metadata server address{'es' if ha is not None else ''}: "
          f"{state.get('meta_address')}")
    if state.get("tls_ca_file"):
        print(f"  tls on: servers' certificates from the CA {state['tls_ca_file']}")
    for line in lines:
        print(line)
    for p in procs:
        print(f"  {p['name']:<10} pid {p['pid'] or '-':<8} {'running' if p['alive'] else 'stopped'}"
              + (f"  {p['address']}" if p["address"] else ""))
    if report is not None:
        sm = report.get("safemode") or {}
        print(f"  live block servers: {len(report.get('live_nodes', []))}, dead: "
              f"{len(report.get('dead_nodes', []))}; safe mode {'ON' if sm.get('on') else 'OFF'}")
        for node in report.get("live_nodes", []) if nodes else ():
            print(f"    {node.get('node_id', '?')}  {node.get('address', '?')}  "
                  f"blocks {node.get('blocks', 0)}  heartbeat {node.get('last_heartbeat_age', 0):.1f}s ago")
    elif error_line:
        print(error_line)


def _status_ha(args, layout: Layout, state: dict) -> int:
    """``cluster status`` of an HA cluster: etcd members, each metadata server's role,
    epoch, applied txid and lag, the block servers, and the active's report."""
    from .clusterha import status_lines
    lines, ha, ha_ok = status_lines(layout, state)
    storage = []
    for i, entry in enumerate(state.get("storage", [])):
        storage.append({"name": f"storage{i}", "pid": entry.get("pid"),
                        "alive": is_ours(entry.get("pid"), "storage", layout.storage_data(i)),
                        "address": entry.get("address")})
    report, error = (None, None)
    if ha["active"]:
        report, error = report_or_none(ha["active"], timeout=3.0,
                                       ca_file=state.get("tls_ca_file") or "")
    n_alive = sum(s["alive"] for s in storage) + sum(m["alive"] for m in ha["metas"]) \
        + sum(e["alive"] for e in ha["etcd"])
    if n_alive == 0:
        overall, code = "down", 3
    elif ha_ok and all(s["alive"] for s in storage) and report is not None and \
            len(report.get("live_nodes", [])) >= len(storage):
        overall, code = "up", 0
    else:
        overall, code = "degraded", 1
    _print_status(args, layout, state, overall, storage, report, ha=ha, lines=lines,
                  error_line=f"  active metadata server not answering: {error}"
                  if ha["active"] else None)
    return code


def cmd_tls_issue(args) -> int:
    """``leasefs tls issue``: a server certificate from the cluster CA, for a block server
    (or a metadata server) on another machine; prints the settings that use it."""
    ca_dir = os.path.abspath(args.ca_dir)
    ca_cert, ca_key = os.path.join(ca_dir, tlsmod.CA_CERT), os.path.join(ca_dir, tlsmod.CA_KEY)
    if not os.path.exists(ca_cert):
        raise UsageError(f"--ca-dir {ca_dir}: no {tlsmod.CA_CERT} there (the metadata server "
                         f"makes it in <meta data>/tls when it first starts with tls = on; "
                         f"cluster up --ha in <home>/tls)")
    hosts = list(dict.fromkeys(h for h in args.host if h)) or tlsmod.default_hosts()
    cert, key = tlsmod.issue(ca_cert, ca_key, args.out, hosts, name=args.name)
    print(f"issued {cert} (key {key}, mode 0600) for {', '.join(hosts)}")
    print(f"  settings: tls = \"on\", tls_ca_file = \"{ca_cert}\" (a copy), "
          f"tls_cert_file = \"{cert}\", tls_key_file = \"{key}\"")
    return 0


def cmd_tls_ca(args) -> int:
    """``leasefs tls ca``: the cluster CA in a folder of its own (hosts by hand, HA), made
    when missing, so that every server's certificate can be issued before any starts."""
    cert = tlsmod.ensure_ca_in(os.path.abspath(args.ca_dir))
    print(f"CA {cert} (key {os.path.join(os.path.dirname(cert), tlsmod.CA_KEY)}, mode 0600); "
          f"issue certificates with: leasefs tls issue --ca-dir {os.path.dirname(cert)}")
    return 0


def register(sub, common) -> None:
    t = sub.add_parser("tls", help="wire encryption: issue a certificate from the cluster CA",
                       description="Certificates for tls = on. 'leasefs cluster up' needs none "
                                   "of this; a server on another machine needs a certificate "
                                   "from the cluster CA, made here and copied there.")
    tsub = t.add_subparsers(dest="action", metavar="{ca,issue}")
    tsub.required = True
    ca = tsub.add_parser("ca", parents=[common],
                         help="make the cluster CA in a folder (if it is not there yet)")
    ca.add_argument("--ca-dir", required=True, help="folder for ca.crt and ca.key (0600)")
    ca.set_defaults(func=cmd_tls_ca, raw=True)
    issue = tsub.add_parser("issue", parents=[common],
                            help="a server certificate (and key) from the cluster CA")
    issue.add_argument("--ca-dir", required=True,
                       help="the CA's folder: <meta data>/tls of the metadata server "
                            "(<home>/tls of a 'cluster up --ha' cluster)")
    issue.add_argument("--host", action="append", default=[],
                       help="host name or IP address the server is reached at (repeatable; "
                            "default: this machine's loopback and host names)")
    issue.add_argument("--out", required=True, help="folder for <name>.crt and <name>.key")
    issue.add_argument("--name", default="server", help="file name stem (default server)")
    issue.set_defaults(func=cmd_tls_issue, raw=True)

    p = sub.add_parser("cluster", help="the embedded local cluster: up, down, status",
                       description="Run a metadata server and N block servers as local processes "
                                   "with all state under one home folder.")
    csub = p.add_subparsers(dest="action", metavar="{up,down,status}")
    csub.required = True
    home_help = "cluster home (default: $LEASEFS_HOME or ~/.leasefs)"

    up = csub.add_parser("up", parents=[common], help="start (or complete) the cluster and wait until it is ready")
    up.add_argument("--home", default=None, help=home_help)
    up.add_argument("--storage", type=int, default=None, help=f"block servers (default {DEFAULT_STORAGE})")
    up.add_argument("--port", type=int, default=None,
                    help=f"metadata server port (default {DEFAULT_META_PORT}; 0 = any free; "
                         "with --ha one each from there)")
    up.add_argument("--storage-port", type=int, default=None,
                    help=f"first block server port (default {DEFAULT_STORAGE_PORT}, then +1 each; "
                         "0 = any free)")
    up.add_argument("--http-port", type=int, default=None,
                    help=f"status page port (default {DEFAULT_HTTP_PORT}, off with --port 0; "
                         "with --ha one each from there, 0 = free ports)")
    up.add_argument("--replication", type=int, default=None,
                    help="default replication of new files (default min(3, storage))")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for readiness")
    up.add_argument("--ha", action="store_true",
                    help="metadata HA: a 3-member etcd, two metadata servers (active and "
                         "standby) and an observer (remembered: a later 'up' keeps HA)")
    up.add_argument("--etcd-port", type=int, default=None,
                    help="--ha: first etcd client port (3 clients, then 3 peers; default: "
                         "free ports)")
    up.add_argument("--mount", default=None, metavar="DIR",
                    help="also mount the cluster there with FUSE (remembered: a later "
                         "'up' remounts it, 'down' unmounts it)")
    up.set_defaults(func=cmd_up, raw=True)

    down = csub.add_parser("down", parents=[common], help="stop the cluster's processes (data is kept)")
    down.add_argument("--home", default=None, help=home_help)
    down.add_argument("--timeout", type=float, default=20.0,
                      help="seconds to wait after SIGTERM before SIGKILL")
    down.set_defaults(func=cmd_down, raw=True)

    status = csub.add_parser("status", parents=[common], help="processes, address and live block servers "
                             "(exit 0 up, 1 degraded, 3 down)")
    status.add_argument("--home", default=None, help=home_help)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status, raw=True)
