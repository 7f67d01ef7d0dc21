"""``leasefs cluster up|down|status`` with ``--ha``: the embedded cluster with metadata high
availability (``ha = etcd``) on one machine.

Why: trying metadata HA should take one command, as the plain cluster does. ``up --ha``
starts, in this order, each step shown as it goes:

1. a 3-member etcd on loopback (``tools/cluster/etcd.py``: data in ``<home>/etcd/etcd<i>``);
2. ``meta0`` and ``meta1`` (``ha_role = standby``; ``meta0`` is started first and waited
   for until it is active, so the active is predictable), then ``meta2`` (``ha_role =
   observer``), each with its own RPC and web port, the same ``ha_prefix`` and one cluster
   key file (``<home>/cluster.key``) so block servers authenticate to each;
3. the block servers, and the mount when asked, with the comma-separated list of all
   metadata addresses (they move to whichever server is active).

With ``tls = on`` the cluster CA is made in ``<home>/tls/`` and every metadata and block
server gets a certificate from it (``cluster.cluster_tls``) before anything starts; etcd
stays plain HTTP on loopback.

``cluster.json`` records every member: ``ha`` (prefix, etcd token and members with pids and
ports), ``metas`` (name, configured role, pid, ports, address) and ``meta_address`` (the
list). ``down`` stops block servers, then metadata servers, then etcd, each by its recorded
pid after checking ``/proc`` still shows our process for that data folder. ``status`` asks
each metadata server for ``ha_status`` (role, epoch, applied txid, lag).

Ports: ``--port P`` gives metadata servers P, P+1, P+2 (default 8020...), ``--http-port H``
their web pages H, H+1, H+2 (default 9870...), and each answers Hadoop's client on its own
HDFS port (9000, 9001, 9002; ``hdfs_address`` in ``cluster.json`` and ``status``: a standby
refuses as HDFS's standby does, so Hadoop's failover proxy provider, given all three, finds
the active); ``--port 0`` picks free ports below the ephemeral range
for all (an HA server restarts in place on its ports, and so do restarted members), and
they are recorded so a restart keeps every address valid. etcd takes ``--etcd-port E``
(clients E..E+2, peers E+3..E+5) or free ports (default: 2379/2380 may be Debian's own
etcd.service).

Concurrency contract: a short-lived CLI process, main thread only; probes are one
``trio.run`` each. Two ``cluster up`` in the same home at once are not supported.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from fs import nodeauth
from fs.config import Config
from fs.errors import LeaseFSError

from ..admin.haadmin import active_of, statuses, why_not
from ..common import PROG
from ..formatting import UsageError, parse_settings
from . import etcd as etcdmod
from .processes import (client_prefix, DEFAULT_HTTP_PORT, DEFAULT_META_PORT, DEFAULT_STORAGE,
                        Layout, StartupFailed, cluster_tls, embedded_defaults,
                        ensure_mounted, is_ours, log_tail, probe_report, save_state, spawn,
                        start_block_servers, wait_address)

N_ETCD = 3
#: (name, ha_role) of the metadata servers, in start order
METAS = (("meta0", "standby"), ("meta1", "standby"), ("meta2", "observer"))


def say(text: str) -> None:
    """Progress of a long start, on stdout as it happens."""
    print(text, flush=True)


def etcd_members(state: dict) -> list[etcdmod.Member]:
    return [etcdmod.Member.from_dict(m) for m in (state.get("ha") or {}).get("etcd", [])]


def members(state: dict) -> list[tuple[str, str]]:
    """``(name, role)`` of the leasefs processes, metadata servers first."""
    return ([(m["name"], "meta") for m in state.get("metas", [])]
            + [(f"storage{i}", "storage") for i in range(len(state.get("storage", [])))])


def pid_of(state: dict, name: str) -> int | None:
    if name.startswith("storage"):
        return state["storage"][int(name[len("storage"):])].get("pid")
    for m in state.get("metas", []):
        if m["name"] == name:
            return m.get("pid")
    return None


def _ports(first: int | None, default: int, n: int, recorded: list) -> list[int]:
    """Recorded ports first (a restart keeps addresses), else ``first + i``, else free."""
    if first is None:
        first = default
    return [recorded[i] if i < len(recorded) and recorded[i] else
            (first + i if first else etcdmod.free_port()) for i in range(n)]


def _fail(exc: Exception, layout: Layout) -> int:
    print(f"{PROG} cluster up: {exc}", file=sys.stderr)
    path = getattr(exc, "log_path", None)
    if path:
        tail = log_tail(path)
        if tail:
            print(f"  last lines of {path}:\n{tail}", file=sys.stderr)
    print(f"  (processes started so far keep running; stop them with "
          f"'leasefs cluster down --home {layout.home}')", file=sys.stderr)
    return 1


def probe_config(ca_file: str) -> Config:
    """How this process asks the cluster's metadata servers: over TLS verified against
    ``ca_file`` when the cluster has one (the local socket, tried first, needs none)."""
    config = Config.load()
    return config.replace(tls="on", tls_ca_file=ca_file) if ca_file else config


def wait_roles(layout: Layout, state: dict, procs: dict, deadline: float, probe: Config,
               need_all: bool = True) -> str:
    """Until one metadata server is active and (``need_all``) every other answers as a
    standby or observer; the active's address. Names the process and its log on failure."""
    metas = state["metas"]
    last = ""
    while True:
        for name, proc in procs.items():
            if name.startswith("meta") and proc.poll() is not None:
                raise StartupFailed(f"{name} exited with status {proc.returncode}; see "
                                    f"{layout.log_file(name)}", layout.log_file(name))
        found = statuses([m["address"] for m in metas], probe, timeout=1.0)
        active = active_of(found)
        settled = all(s is not None and s["role"] in ("active", "standby", "observer")
                      for s, _ in found.values())
        if active is not None and (settled or not need_all):
            return active
        last = "; ".join(f"{m['name']} {found[m['address']][0]['role']}"
                         if found[m["address"]][0] else
                         f"{m['name']} {why_not(found[m['address']][1])}" for m in metas)
        if time.monotonic() > deadline:
            raise StartupFailed(f"metadata servers not settled in time ({last}); see "
                                f"{layout.logs}", layout.log_file(metas[0]["name"]))
        time.sleep(0.1)


def wait_storage(layout: Layout, active: str, n: int, procs: dict, deadline: float,
                 ca_file: str = "") -> dict:
    """Until the active reports ``n`` live block servers and safe mode off."""
    import trio

    from fs.errors import sole_exception
    last = "the active metadata server is not answering yet"
    while True:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise StartupFailed(f"{name} exited with status {proc.returncode}; see "
                                    f"{layout.log_file(name)}", layout.log_file(name))
        try:
            report = trio.run(probe_report, active, 2.0, ca_file)
        except BaseException as raised:
            exc = sole_exception(raised)
            if not isinstance(exc, (LeaseFSError, OSError)):
                raise
            last = f"the active metadata server {active} is not answering ({exc})"
        else:
            live = len(report.get("live_nodes", []))
            safemode = report.get("safemode") or {}
            if live >= n and not safemode.get("on"):
                return report
            last = (f"{live} of {n} block servers live" if live < n else
                    f"safe mode is on ({safemode.get('reason') or 'no reason given'})")
        if time.monotonic() > deadline:
            raise StartupFailed(f"cluster not ready in time: {last}; see the logs in "
                                f"{layout.logs}", layout.log_file("storage0") if n else None)
        time.sleep(0.2)


def cmd_up(args, layout: Layout, state: dict) -> int:
    if state.get("meta") and not state.get("ha"):
        raise UsageError(f"{layout.home} holds a cluster without HA (its metadata server's "
                         f"data is in {layout.meta_data}); use another --home for --ha")
    recorded_n = len(state.get("storage", []))
    if args.storage is not None:
        n = args.storage
    else:   # a metadata-only HA cluster (--storage 0) stays one
        n = recorded_n if "storage" in state else DEFAULT_STORAGE
    if n < 0:
        raise UsageError("--storage must be at least 0")
    n = max(n, recorded_n)
    ha = state.setdefault("ha", {})
    settings = {**embedded_defaults(n), **state.get("settings", {})}
    settings["safemode_min_storage"] = n
    if args.replication is not None:
        if args.replication < 1:
            raise UsageError("--replication must be at least 1")
        settings["replication"] = args.replication
    settings.setdefault("replication", max(1, min(3, n)))
    settings.update(parse_settings(getattr(args, "set", None)))
    key_file = os.path.join(layout.home, "cluster.key")
    ha.setdefault("prefix", f"/leasefs/{uuid.uuid4().hex[:12]}")
    ha.setdefault("etcd_token", etcdmod.new_token())
    settings.update(ha="etcd", ha_prefix=settings.get("ha_prefix", ha["prefix"]),
                    cluster_key_file=key_file)
    config = Config.load(env={}, **settings)  # refuse a bad --set here, not in n log files
    os.makedirs(layout.home, exist_ok=True)
    try:
        nodeauth.ensure_key(key_file)
    except (OSError, LeaseFSError) as exc:
        print(f"{PROG} cluster up: cluster key {key_file}: {exc}", file=sys.stderr)
        return 1
    # tls = on: one CA for the cluster in <home>/tls/ (no metadata server's folder is more
    # the cluster's than another's) and a certificate from it for every metadata and block
    # server, each in its data folder; clients find the CA through cluster.json
    storage = state.setdefault("storage", [])
    while len(storage) < n:
        storage.append({})
    try:
        ca_file, meta_tls, storage_tls = cluster_tls(
            config, layout.home, [layout.data_dir(name) for name, _ in METAS],
            [layout.storage_data(i) for i in range(n)])
    except (OSError, LeaseFSError) as exc:
        print(f"{PROG} cluster up: TLS certificates: {exc}", file=sys.stderr)
        return 1
    probe = probe_config(ca_file)

    # -- etcd
    etcd = etcd_members(state)
    if not etcd:
        etcd = etcdmod.plan(os.path.join(layout.home, "etcd"), layout.logs, N_ETCD,
                            args.etcd_port or 0)
    settings["ha_etcd_endpoints"] = etcdmod.endpoints(etcd)
    state.update(home=layout.home, settings=settings, tls_ca_file=ca_file)
    deadline = time.monotonic() + args.timeout
    procs: dict = {}
    started: list[str] = []
    try:
        etcd_procs = {}
        for m in etcd:
            if not etcdmod.is_etcd(m.pid, m.data_dir):
                etcd_procs[m.name] = etcdmod.spawn(m, etcd, ha["etcd_token"],
                                                   layout.pid_file(m.name))
                started.append(m.name)
        ha["etcd"] = [m.to_dict() for m in etcd]
        save_state(layout, state)
        if etcd_procs:
            say(f"etcd: starting {', '.join(etcd_procs)} "
                f"({', '.join(m.client_url for m in etcd)}) ...")

        def progress(ok, total):
            if etcd_procs:
                say(f"etcd: {ok} of {total} members healthy")
        etcdmod.wait_healthy(etcd, etcd_procs, max(1.0, deadline - time.monotonic()),
                             progress)

        # -- metadata servers
        metas = state.setdefault("metas", [])
        by_name = {m["name"]: m for m in metas}
        rpc_ports = _ports(args.port, DEFAULT_META_PORT, len(METAS),
                           [by_name.get(name, {}).get("port") for name, _ in METAS])
        # --port 0 alone: free web ports too (fixed ones would collide between clusters)
        http_first = 0 if args.http_port is None and args.port == 0 else args.http_port
        http_ports = _ports(http_first, DEFAULT_HTTP_PORT, len(METAS),
                            [by_name.get(name, {}).get("http_port") for name, _ in METAS])
        hdfs_first = getattr(args, "hdfs_port", None)
        hdfs_first = 0 if hdfs_first is None and args.port == 0 else hdfs_first
        hdfs_ports = _ports(hdfs_first, Config().meta_hdfs_port, len(METAS),
                            [by_name.get(name, {}).get("hdfs_port") for name, _ in METAS])
        state["metas"] = metas = [
            {**by_name.get(name, {}), "name": name, "role": role, "port": rpc_ports[i],
             "http_port": http_ports[i], "address": f"127.0.0.1:{rpc_ports[i]}",
             "hdfs_port": hdfs_ports[i], "hdfs_address": f"hdfs://127.0.0.1:{hdfs_ports[i]}"}
            for i, (name, role) in enumerate(METAS)]
        state["meta_address"] = ",".join(m["address"] for m in metas)
        save_state(layout, state)
        alive = [is_ours(m.get("pid"), "meta", layout.data_dir(m["name"])) for m in metas]
        for i, m in enumerate(metas):
            if alive[i]:
                continue
            name = m["name"]
            say(f"{name}: starting ({m['role']}) on {m['address']}, web pages on "
                f"http://127.0.0.1:{m['http_port']}/, Hadoop's client on "
                f"{m['hdfs_address']} ...")
            procs[name] = spawn(layout, name, "meta",
                                ["--port", str(m["port"]), "--http-port", str(m["http_port"]),
                                 "--hdfs-port", str(m["hdfs_port"])],
                                {**settings, "ha_node_id": name, "ha_role": m["role"],
                                 # where a follower behind the log finds an image
                                 "meta_address": state["meta_address"],
                                 **meta_tls[i]})
            started.append(name)
            m["pid"] = procs[name].pid
            save_state(layout, state)
            wait_address(layout, name, procs[name], deadline)
            if i == 0 and not any(alive):
                # none of them runs yet: let meta0 win the election, so the active is
                # predictable (the next standby only campaigns after it)
                wait_roles(layout, {"metas": [m]}, procs, deadline, probe, need_all=False)
                say(f"{name}: active")
        active = wait_roles(layout, state, procs, deadline, probe)
        found = statuses([m["address"] for m in metas], probe, timeout=2.0)
        say("metadata servers: " + ", ".join(
            f"{m['name']} {found[m['address']][0]['role']}" for m in metas
            if found[m["address"]][0]))

        # -- block servers
        alive = [is_ours(storage[i].get("pid"), "storage", layout.storage_data(i))
                 for i in range(n)]
        start_block_servers(layout, state, args, alive, procs, started, deadline,
                            lambda i: {**settings, **storage_tls[i]})
        if n:
            say(f"block servers: waiting for {n} to report to the active ...")
        report = wait_storage(layout, active, n, procs, deadline, ca_file)
    except (StartupFailed, etcdmod.EtcdError) as exc:
        return _fail(exc, layout)
    if not started:
        print(f"leasefs cluster (HA) is already up at {state['meta_address']}")
    else:
        print(f"leasefs cluster (HA) is up at {state['meta_address']}")
    print(f"  active metadata server {found[active][0].get('node_id')} ({active}), epoch "
          f"{found[active][0].get('epoch')}; {len(report.get('live_nodes', []))} block "
          f"servers live; etcd {settings['ha_etcd_endpoints']}")
    print(f"  Hadoop's client: {', '.join(m['hdfs_address'] for m in metas)} (one "
          f"nameservice: docs/CLIENTS.md, \"hdfs:// and HA\")")
    print(f"  home {layout.home}  (logs in {layout.logs})")
    run = client_prefix(layout.home)
    print(f"  try: {run}haadmin -getAllServiceState   |   {run}haadmin -failover")
    mountpoint = args.mount or state.get("mount")
    if mountpoint:
        return ensure_mounted(layout, state, os.path.abspath(mountpoint),
                               state["meta_address"])
    return 0


def stop_etcd(layout: Layout, state: dict, timeout: float) -> list[str]:
    """Stop the recorded etcd members (after the metadata servers); their names."""
    etcd = etcd_members(state)
    victims = etcdmod.stop(etcd, timeout)
    for m in etcd:
        try:
            os.unlink(layout.pid_file(m.name))
        except FileNotFoundError:
            pass
    return [f"{m.name} (pid {m.pid})" for m in victims]


def status_lines(layout: Layout, state: dict) -> tuple[list[str], dict, bool]:
    """The HA part of ``cluster status``: etcd members and every metadata server's role,
    epoch, applied txid and lag; ``(lines, json part, all healthy)``."""
    lines, ok = [], True
    etcd = []
    for m in etcd_members(state):
        alive = etcdmod.is_etcd(m.pid, m.data_dir)
        healthy = alive and etcdmod.healthy(m.client_url)
        ok = ok and healthy
        etcd.append({"name": m.name, "pid": m.pid, "alive": alive, "healthy": healthy,
                     "address": m.client_url})
        lines.append(f"  {m.name:<10} pid {m.pid or '-':<8} "
                     f"{'healthy' if healthy else 'running' if alive else 'stopped'}  "
                     f"{m.client_url}")
    metas = state.get("metas", [])
    probe = probe_config(state.get("tls_ca_file") or "")
    found = statuses([m["address"] for m in metas], probe, timeout=2.0) if metas else {}
    rows = []
    for m in metas:
        alive = is_ours(m.get("pid"), "meta", layout.data_dir(m["name"]))
        status, error = found.get(m["address"], (None, None))
        ok = ok and alive and status is not None
        rows.append({"name": m["name"], "pid": m.get("pid"), "alive": alive,
                     "address": m["address"], "http_port": m.get("http_port"),
                     "hdfs_address": m.get("hdfs_address"),
                     "configured_role": m.get("role"), "ha": status,
                     "error": None if status else why_not(error)})
        if status:
            what = (f"{status['role']:<11} epoch {status.get('epoch', 0)}  applied txid "
                    f"{status.get('applied_txid', 0)}  lag {float(status.get('lag', 0)):.3f}s")
        else:
            what = "stopped" if not alive else f"not answering ({why_not(error)})"
        hdfs = f"  {m['hdfs_address']}" if m.get("hdfs_address") else ""
        lines.append(f"  {m['name']:<10} pid {m.get('pid') or '-':<8} {what}  "
                     f"{m['address']}{hdfs}")
    if metas and active_of(found) is None:
        ok = False
        lines.append("  no metadata server is active")
    return lines, {"etcd": etcd, "metas": rows, "active": active_of(found)}, ok


__all__ = ["cmd_up", "members", "pid_of", "stop_etcd", "status_lines"]
