"""``leasefs haadmin``: the roles of the metadata servers of an HA namespace (``ha = etcd``)
and a graceful failover, as ``hdfs haadmin`` does for NameNodes.

* ``-getServiceState ADDR|NODE``: one server's role (``active``, ``standby``, ``observer``,
  ``taking_over``, ``initializing``);
* ``-getAllServiceState``: every server's address, node id, role, epoch, applied txid and
  lag, asked of all of them at once;
* ``-failover``: the active gives its term away (``ha_failover``, superuser only); the
  command then waits until ANOTHER server reports active and prints who and how long it
  took. Exit 1 when no other server became active in ``--timeout`` seconds.

Why: an operator needs to see which server is active before maintenance and to move the
active role off a machine without killing it. The servers come from ``--meta``,
``LEASEFS_META`` or the embedded cluster's ``cluster.json`` (all of them a comma-separated
list); a NODE is a server's ``ha_node_id`` (``meta0`` ... in an embedded cluster).

Concurrency contract: a short-lived CLI process; each step is one ``trio.run`` on the main
thread that asks every server concurrently (one connection each, closed at the end).
"""

from __future__ import annotations

import json
import os
import time

import trio

from fs import tls as tlsmod
from fs.client import authentication
from fs.config import Config, default_home
from fs.errors import LeaseFSError
from fs.rpcclient import call_each

from ..common import Command
from ..formatting import UsageError, format_table

#: how often -failover asks every server for its role while it waits
POLL = 0.02


def split_addresses(text: str) -> list[str]:
    """``"a:1, b:2"`` -> ``["a:1", "b:2"]`` (a metadata address may list several servers)."""
    return [a.strip() for a in (text or "").split(",") if a.strip()]


def cluster_nodes(env=None) -> dict[str, str]:
    """node id -> address of the embedded cluster's metadata servers (``cluster.json``)."""
    env = os.environ if env is None else env
    try:
        with open(os.path.join(default_home(env), "cluster.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {m["name"]: m["address"] for m in (state.get("metas") or [])
            if isinstance(m, dict) and m.get("name") and m.get("address")}


async def _one_status(address: str, config: Config, timeout: float, method: str = "ha_status"):
    return (await _all_statuses([address], config, timeout, method))[address]


async def _all_statuses(addresses: list[str], config: Config, timeout: float,
                        method: str = "ha_status") -> dict:
    return await call_each(addresses, method, timeout=timeout,
                           name=f"leasefs-haadmin-{os.getpid()}", tls=tlsmod.client(config),
                           max_frame=config.max_frame,
                           **authentication(config, ",".join(addresses)))


def statuses(addresses: list[str], config: Config | None = None,
             timeout: float = 2.0) -> dict[str, tuple[dict | None, BaseException | None]]:
    """address -> ``(ha_status answer, None)`` or ``(None, why it did not answer)``."""
    return trio.run(_all_statuses, addresses, config or Config.load(), timeout)


def why_not(exc: BaseException | None) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no answer in time"
    if isinstance(exc, LeaseFSError):
        return exc.message or type(exc).__name__
    return str(exc) if exc else "?"


# --------------------------------------------------------------------------- commands

def _addresses(cmd: Command) -> list[str]:
    addresses = split_addresses(cmd.meta_address)
    if not addresses:
        raise UsageError("no metadata server address (give --meta HOST:PORT[,HOST:PORT...])")
    return addresses


def _resolve(cmd: Command, target: str, found: dict) -> str:
    """The address of ``target`` (an address, or a node id some server reports)."""
    if target in found:
        return target
    for address, (status, _) in found.items():
        if status and status.get("node_id") == target:
            return address
    known = cluster_nodes()
    if target in known:
        return known[target]
    if ":" in target:
        return target
    raise UsageError(f"{target}: neither a HOST:PORT nor the node id of a metadata server "
                     f"of {', '.join(found) or 'the cluster'}")


def cmd_get_state(cmd: Command, target: str) -> int:
    addresses = _addresses(cmd)
    found = statuses(addresses, cmd.config, cmd.args.timeout)
    address = _resolve(cmd, target, found)
    status, error = found.get(address) or statuses([address], cmd.config,
                                                   cmd.args.timeout)[address]
    if status is None:
        cmd.error(f"leasefs haadmin: {target}: metadata server {address} did not answer "
                  f"({why_not(error)})")
        return 1
    cmd.out(status["role"])
    return 0


def status_rows(found: dict) -> list[list]:
    rows = []
    for address, (status, error) in found.items():
        if status is None:
            rows.append([address, "-", f"unreachable ({why_not(error)})", "-", "-", "-"])
        else:
            rows.append([address, status.get("node_id") or "-", status["role"],
                         status.get("epoch", 0), status.get("applied_txid", 0),
                         f"{float(status.get('lag', 0.0)):.3f}s"])
    return rows


def cmd_get_all(cmd: Command) -> int:
    found = statuses(_addresses(cmd), cmd.config, cmd.args.timeout)
    if cmd.args.json:
        cmd.out(json.dumps({a: (s if s is not None else {"error": why_not(e)})
                            for a, (s, e) in found.items()}, indent=2, sort_keys=True))
    else:
        for line in format_table(["address", "node", "role", "epoch", "applied txid", "lag"],
                                 status_rows(found), align="<<<>>>"):
            cmd.out(line)
    return 0 if all(s is not None for s, _ in found.values()) else 1


def active_of(found: dict, besides: str | None = None) -> str | None:
    for address, (status, _) in found.items():
        if address != besides and status and status.get("role") == "active":
            return address
    return None


def cmd_failover(cmd: Command) -> int:
    addresses = _addresses(cmd)
    config, timeout = cmd.config, cmd.args.timeout
    found = statuses(addresses, config, min(timeout, 2.0))
    old = active_of(found)
    if old is None:
        raise LeaseFSError(f"no metadata server of {', '.join(addresses)} is active: "
                           + "; ".join(f"{a} {s['role'] if s else why_not(e)}"
                                       for a, (s, e) in found.items()))
    old_status = found[old][0]
    others = [a for a in addresses if a != old]
    if not any(found[a][0] and found[a][0]["role"] == "standby" for a in others):
        raise LeaseFSError(f"the active {old_status.get('node_id') or old} has no standby to "
                           f"fail over to (an observer never becomes active): "
                           + "; ".join(f"{a} {s['role'] if s else why_not(e)}"
                                       for a, (s, e) in found.items() if a != old))
    started = time.monotonic()
    answer, error = trio.run(_one_status, old, config, min(timeout, 5.0), "ha_failover")
    if answer is None and not isinstance(error, (OSError, trio.TooSlowError)):
        # refused (not superuser, no longer active): nothing moved
        raise error
    # a dropped connection leaves it unknown whether the resignation got through: the
    # roles the servers report tell
    deadline = started + timeout
    while True:
        now_found = statuses(others, config, 0.5)
        new = active_of(now_found)
        if new is not None:
            took = time.monotonic() - started
            status = now_found[new][0]
            cmd.out(f"failover: {status.get('node_id') or new} ({new}) is active with epoch "
                    f"{status.get('epoch')} after {took:.3f} s; "
                    f"{old_status.get('node_id') or old} ({old}) gave up epoch "
                    f"{old_status.get('epoch')}")
            return 0
        if time.monotonic() > deadline:
            roles = "; ".join(f"{a} {s['role'] if s else why_not(e)}"
                              for a, (s, e) in now_found.items())
            cmd.error(f"leasefs haadmin: failover: no other metadata server became active "
                      f"within {timeout:g} s ({roles})")
            return 1
        time.sleep(POLL)


def run(cmd: Command) -> int:
    a = cmd.args
    if a.get_service_state:
        return cmd_get_state(cmd, a.get_service_state)
    if a.get_all_service_state:
        return cmd_get_all(cmd)
    return cmd_failover(cmd)


def register(sub, common) -> None:
    p = sub.add_parser("haadmin", parents=[common],
                       help="metadata HA: the servers' roles, a graceful failover "
                            "(hdfs haadmin)",
                       description="Roles of the metadata servers of an HA namespace "
                                   "(ha = etcd) and a graceful failover. The servers are "
                                   "--meta (a comma-separated list), $LEASEFS_META or the "
                                   "embedded cluster's. HDFS-style flags and long forms both "
                                   "work.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-getServiceState", "--getServiceState", "--get-service-state",
                   dest="get_service_state", metavar="ADDR|NODE",
                   help="the role of one metadata server (HOST:PORT or its node id)")
    g.add_argument("-getAllServiceState", "--getAllServiceState", "--get-all-service-state",
                   dest="get_all_service_state", action="store_true",
                   help="address, node id, role, epoch, applied txid and lag of every server")
    g.add_argument("-failover", "--failover", dest="failover", action="store_true",
                   help="the active resigns; waits until another server is active and "
                        "prints who and how long it took (superuser only)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for answers, and for a new active (default 10)")
    p.add_argument("--json", action="store_true", help="-getAllServiceState as JSON")
    p.set_defaults(func=run)
