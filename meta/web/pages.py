"""What each page of the metadata server's web UI shows, as plain dicts (the HTML pages
render them, ``/api/v1/...`` answers them as JSON): overview, block servers, open files
and leases, the file browser's folder listing and file details, fsck, recent log lines.

Why it exists apart from ``web.py``: gathering reads the server's state through its public
RPC handlers and accessors, with the viewer's identity, so every permission rule of the
RPCs applies to the web viewer too (``viewer``); ``web.py`` only routes and renders.

Security: the viewer is a ``CallContext`` whose ``user`` is ``dr.who`` (no groups) under
``security = "secure"`` (unauthenticated, like HDFS's web UI without SPNEGO), or the
``user.name`` query parameter under ``"simple"`` (HDFS pseudo authentication). Nothing
here reads a key, a token or a password.

Concurrency contract: every function runs on the metadata server's trio thread; the
synchronous ones never await (they see the state between two applied journal batches),
the async ones await only the server's own handlers, which checkpoint on big walks.
"""

from __future__ import annotations

import logging
import re
import time

from fs import paths
from fs.errors import FileNotFound, InvalidArgument, PermissionDenied
from fs.rpc import CallContext
from fs.webui import version

from ..blocks import datanodes as dm
from ..schema.inode import DIR, FILE, SYMLINK
from ..namespace.permissions import READ_EXECUTE, mode_string

SCHEMA_VERSION = 1
WEB_USER = "dr.who"   # HDFS's name for an unauthenticated web viewer
LISTING_LIMIT = 1000  # entries on one folder page (the RPC's own cap)
FSCK_FILE_LIMIT = 500
LOG_LIMIT = 500
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@$-]{0,63}")


def viewer(server, request_peer: str, user_name: str | None) -> CallContext:
    """Who the viewer acts as (see the module docstring)."""
    user = WEB_USER
    if server.config.security != "secure" and user_name:
        if not USER_NAME.fullmatch(user_name):
            raise InvalidArgument(f"user.name {user_name[:40]!r} is not a user name "
                                  f"(letters, digits, . _ - @ $, at most 64)")
        user = user_name
    return CallContext(client_id="http", peer=request_peer, user=user, groups=())


async def overview(server, ctx) -> dict:
    report = await server.admin_protocol.rpc_report(ctx)
    now_ns = server.wall_ns()
    startup = server.startup.as_dict(now_ns / 1e9)
    started_ns = int(startup["started"] * 1e9)
    return {
        "schema_version": SCHEMA_VERSION, "viewer": ctx.user,
        "version": version(), "started_ns": started_ns,
        "uptime_seconds": round((now_ns - started_ns) / 1e9, 1),
        "security": server.config.security, "namespace_id": report["namespace_id"],
        "safemode": report["safemode"],
        "ha": report["ha"],
        "startup": {"store_txid": startup["applied_txid"], "replayed": startup["replayed"],
                    "replay_seconds": startup["durations"].get("REPLAYING_JOURNAL", 0.0),
                    "replaying": startup["phase"] == "REPLAYING_JOURNAL",
                    "phases": startup["durations"],
                    "blocks_reported": _blocks_reported(server)},
        "capacity": report["capacity"], "used": report["used"],
        "remaining": report["remaining"],
        "files": report["files"], "directories": report["directories"],
        "blocks": report["blocks"], "open_files": report["open_files"],
        "under_replicated": report["under_replicated"], "corrupt": report["corrupt"],
        "missing": report["missing"], "pending_deletion": report["pending_deletion"],
        "live_nodes": len(report["live_nodes"]), "dead_nodes": len(report["dead_nodes"]),
        "decommissioning": report["decommissioning"],
        "decommissioned": report["decommissioned"],
        "journal": report["journal"], "checkpoint": report["checkpoint"],
    }


def _blocks_reported(server) -> dict:
    """Safe mode's progress: blocks with enough reported replicas, of all."""
    total = len(server.blocks)
    missing = server.blocks.counts()["missing"]
    return {"safe": max(0, total - missing), "total": total}


async def datanodes(server, ctx) -> dict:
    report = await server.admin_protocol.rpc_report(ctx)

    def node(entry, state):
        host = entry["address"].rsplit(":", 1)[0]
        port = entry.get("http_port")
        admin = entry["admin"]
        if state == "live" and admin == dm.DECOMMISSION_IN_PROGRESS:
            state = "decommissioning"
        elif state == "live" and admin == dm.DECOMMISSIONED:
            state = "decommissioned"
        return {**entry, "state": state,
                "web_url": f"http://{host}:{port}/" if port else None}
    nodes = ([node(n, "live") for n in report["live_nodes"]]
             + [node(n, "dead") for n in report["dead_nodes"]])
    counts = {state: sum(1 for n in nodes if n["state"] == state)
              for state in ("live", "decommissioning", "decommissioned", "dead")}
    return {"schema_version": SCHEMA_VERSION, "counts": counts,
            "dead_node_interval": server.config.dead_node_interval, "nodes": nodes}


def open_files(server, ctx) -> dict:
    """Every lease and its files; under permission checks, only files whose folder the
    viewer may list (a name it could not see otherwise stays hidden)."""
    now = server.clock()
    leases = server.leases
    caller = server.access.checked_caller(ctx)
    files, hidden = [], 0
    for holder, lease in sorted(leases.leases.items()):
        age = now - lease.last_update
        for ino in sorted(lease.files):
            inode = server.ns.view.get_inode(ino)
            path = server.ns.view.path_of(ino)
            if inode is None or path is None:
                continue
            if caller is not None and not _may_list_parent(server, caller, path):
                hidden += 1
                continue
            files.append({"path": path, "holder": holder,
                          "client_machine": inode.uc.client_machine if inode.uc else "",
                          "length": inode.length or 0,
                          "lease_age_seconds": round(age, 1),
                          "soft_expires_in": round(leases.soft_limit - age, 1),
                          "hard_expires_in": round(leases.hard_limit - age, 1),
                          "soft_expired": age > leases.soft_limit})
    return {"schema_version": SCHEMA_VERSION, "viewer": ctx.user,
            "soft_limit": leases.soft_limit, "hard_limit": leases.hard_limit,
            "leases": len(leases), "files": files, "hidden": hidden}


def _may_list_parent(server, caller, path: str) -> bool:
    parts = paths.split(path)[:-1]
    try:
        server.permissions.check_path(caller, parts, server.access.inode_chain(parts),
                                      access=READ_EXECUTE)
    except PermissionDenied:
        return False
    return True


async def explorer(server, ctx, path: str) -> dict:
    """A folder's listing, or a file's details with its blocks and their replicas."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidArgument(f"path must be absolute, got {str(path)[:100]!r}")
    status = await server.namespace_protocol.rpc_get_file_info(ctx, path=path)
    if status is None:
        raise FileNotFound(f"{path[:200]}: no such file or folder")
    canonical = status["path"]
    out = {"schema_version": SCHEMA_VERSION, "viewer": ctx.user, "path": canonical,
           "crumbs": _crumbs(canonical), "status": _entry(status)}
    if status["type"] == DIR:
        listing = await server.namespace_protocol.rpc_list_status(ctx, path=canonical,
                                                                  limit=LISTING_LIMIT)
        out["kind"] = "folder"
        out["entries"] = [_entry(e) for e in listing["entries"]]
        out["has_more"] = listing["has_more"]
        return out
    out["kind"] = "file" if status["type"] == FILE else "symlink"
    if status["type"] == FILE:
        located = await server.client_protocol.rpc_get_block_locations(ctx, path=canonical)
        out["inline"] = located.get("inline") is not None
        out["under_construction"] = located["under_construction"]
        out["blocks"] = [{"id": lb["block"]["id"], "gs": lb["block"]["gs"],
                          "patch_gs": _patch_gs(server, lb["block"]["id"]),
                          "num_bytes": lb["block"]["num_bytes"], "offset": lb["offset"],
                          "state": lb["state"], "corrupt": lb["corrupt"],
                          "locations": [{"node_id": loc["node_id"], "address": loc["address"]}
                                        for loc in lb["locations"]]}
                         for lb in located["blocks"]]
    return out


def _patch_gs(server, block_id: int) -> int | None:
    """The stamp of a patch of the block under way (its new version's), or None."""
    info = server.blocks.get(block_id)
    return info.patch_gs if info is not None and info.patch_gs else None


def _entry(status: dict) -> dict:
    kind = status["type"]
    return {"name": status.get("name") or "/", "path": status["path"],
            "type": {DIR: "folder", FILE: "file", SYMLINK: "symlink"}.get(kind, str(kind)),
            "permission": mode_string(status["mode"], status["type"]), "owner": status["owner"],
            "group": status["group"], "length": status.get("length", 0),
            "replication": status.get("replication", 0),
            "block_size": status.get("block_size", 0), "mtime_ns": status["mtime_ns"],
            "target": status.get("symlink")}


def _crumbs(path: str) -> list[tuple[str, str]]:
    out = [("/", "/")]
    parts = paths.split(path)
    for i, name in enumerate(parts):
        out.append((name, "/" + "/".join(parts[:i + 1])))
    return out


async def fsck(server, ctx, path: str) -> dict:
    """``fsck`` of a subtree; a viewer under permission checks must be able to list
    every folder of it (HDFS subAccess), as for content_summary."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidArgument(f"path must be absolute, got {str(path)[:100]!r}")
    caller = server.access.checked_caller(ctx)
    parts = paths.split(path)
    if caller is not None:
        server.permissions.check_path(caller, parts, server.access.inode_chain(parts))
        await server.access.check_subtree(caller, parts, READ_EXECUTE)
    answer = await server.admin_protocol.fsck_report(ctx, path=path, openforwrite=True,
                                                     limit=FSCK_FILE_LIMIT)
    return {"schema_version": SCHEMA_VERSION, "viewer": ctx.user, **answer}


def logs(server, ctx, min_level: str = "INFO") -> dict:
    """Recent log lines; under ``secure`` the superuser's (HDFS: admin only), since they
    name files and users of the whole namespace: the unauthenticated viewer is refused."""
    if server.config.security == "secure":
        server.permissions.check_superuser(server.access.caller_of(ctx), "recent log lines")
    level = logging.getLevelName(str(min_level).upper())
    if not isinstance(level, int):
        raise InvalidArgument(f"level must be DEBUG, INFO, WARNING or ERROR, "
                              f"got {str(min_level)[:20]!r}")
    return {"schema_version": SCHEMA_VERSION, "level": logging.getLevelName(level),
            "now": time.time(),
            "lines": server.recent_log.lines(level, LOG_LIMIT)}


__all__ = ["viewer", "overview", "datanodes", "open_files", "explorer", "fsck", "logs",
           "SCHEMA_VERSION", "WEB_USER"]
