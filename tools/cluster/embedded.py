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
timeout; data is kept. What it shares with ``up --ha`` (``embedded_ha.py``) and the
benchmarks' private clusters (layout, state file, processes) is in ``processes.py``.

Concurrency contract: a short-lived CLI process; readiness probing runs in one ``trio.run``
on the main thread. Two ``cluster up`` in the same home at once are not supported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from fs import nodeauth
from fs import tls as tlsmod
from fs.config import Config, default_home
from fs.errors import LeaseFSError

from ..common import PROG
from ..formatting import UsageError, parse_settings
from .etcd import free_port
from .processes import (DEFAULT_HTTP_PORT, DEFAULT_META_PORT, DEFAULT_STORAGE,
                        DEFAULT_STORAGE_PORT, Layout, StartupFailed, client_prefix, cluster_tls,
                        cmdline, embedded_defaults, ensure_mounted, is_ours, load_state,
                        log_tail, mounted_fuse, process_state, report_or_none, save_state, spawn,
                        start_block_servers, wait_address, wait_ready)


# --------------------------------------------------------------------------- commands

def _home(args) -> Layout:
    return Layout(args.home or default_home())


def _members(state: dict) -> list[tuple[str, str]]:
    if state.get("ha"):
        from .embedded_ha import members
        return members(state)
    n = len(state.get("storage", []))
    return [("meta", "meta")] + [(f"storage{i}", "storage") for i in range(n)]


def _pid_of(state: dict, name: str) -> int | None:
    if state.get("ha"):
        from .embedded_ha import pid_of
        return pid_of(state, name)
    entry = state["meta"] if name == "meta" else state["storage"][int(name[len("storage"):])]
    return entry.get("pid")


def cmd_up(args) -> int:
    layout = _home(args)
    state = load_state(layout) or {}
    if args.ha or state.get("ha"):
        from .embedded_ha import cmd_up as cmd_up_ha
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
            hdfs_port = _hdfs_port(args, state, port, settings)
            procs["meta"] = spawn(layout, "meta", "meta",
                                  ["--port", str(port), "--http-port", str(http_port),
                                   "--hdfs-port", str(hdfs_port)],
                                  {**settings, "tls_ca_file": ca_file} if ca_file else settings)
            started.append("meta")
            state["meta"].update(pid=procs["meta"].pid, http_port=http_port, hdfs_port=hdfs_port,
                                 hdfs_address=f"hdfs://127.0.0.1:{hdfs_port}")
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
    if state["meta"].get("hdfs_address"):
        print(f"  Hadoop's client (Spark, FsShell): {state['meta']['hdfs_address']}/ "
              f"(docs/CLIENTS.md)")
    mountpoint = args.mount or state.get("mount")
    if mountpoint:
        return ensure_mounted(layout, state, os.path.abspath(mountpoint), address)
    return 0


def _hdfs_port(args, state: dict, port: int, settings: dict) -> int:
    """The metadata server's port for Hadoop's client: the recorded one (a restart keeps
    the hdfs:// address), else ``--hdfs-port``, else ``meta_hdfs_port`` (9000: leasefs's own
    RPC has HDFS's 8020, and 9000 is the port of Hadoop's single-node guide); any free one
    with ``--port 0`` or ``--hdfs-port 0`` (tests, several clusters on one host)."""
    recorded = state["meta"].get("hdfs_port")
    if recorded:
        return recorded
    chosen = args.hdfs_port
    if chosen is None:
        chosen = 0 if port == 0 else Config.load(env={}, **settings).meta_hdfs_port
    return chosen or free_port()


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
        from .embedded_ha import stop_etcd
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
               "hdfs_address": (state.get("meta") or {}).get("hdfs_address"),
               "tls_ca_file": state.get("tls_ca_file") or None, "processes": procs,
               "live_nodes": None if report is None else report.get("live_nodes"),
               "safemode": None if report is None else report.get("safemode")}
        print(json.dumps(out, indent=2, default=str))
        return
    print(f"leasefs cluster in {layout.home}: {overall}" + (" (HA)" if ha is not None else ""))
    print(f"  metadata server address{'es' if ha is not None else ''}: "
          f"{state.get('meta_address')}")
    if (state.get("meta") or {}).get("hdfs_address"):
        print(f"  Hadoop's client (hdfs://): {state['meta']['hdfs_address']}")
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
    from .embedded_ha import status_lines
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
    up.add_argument("--hdfs-port", type=int, default=None,
                    help="port for Hadoop's client, hdfs:// (default 9000, the meta_hdfs_port "
                         "setting; 0 = any free, as with --port 0; with --ha one each from "
                         "there)")
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
