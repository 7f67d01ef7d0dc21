"""The repair and admin commands of ``leasefs``: ``fsck``, ``decommission`` and
``save-namespace`` (HDFS ``hdfs fsck``, ``hdfs dfsadmin -decommission``/``-refreshNodes`` and
``hdfs dfsadmin -saveNamespace``).

Why a module of its own: their outcome is a health verdict scripts rely on — ``fsck`` exits 1
when any block is missing or corrupt (0 when healthy, even with under-replicated blocks, as
HDFS does), ``decommission --status`` lists what is still being copied.

Concurrency contract: synchronous, the CLI's main thread; one short RPC conversation with the
metadata server per command (``trio.run``).
"""

from __future__ import annotations

import json
import logging

import trio

from fs import paths
from fs import tls as tlsmod
from fs.errors import LeaseFSError, sole_exception
from fs.client import authentication
from fs.rpc import RpcClient

from ..common import Command, command_parser
from ..formatting import format_checkpoint, format_table

log = logging.getLogger(__name__)


def _rpc(cmd: Command, method: str, args: dict):
    config = cmd.config

    async def call():
        async with RpcClient(cmd.meta_address, "leasefs-admin", timeout=config.rpc_timeout,
                             retry_seconds=min(10.0, config.rpc_retry_seconds),
                             max_frame=config.max_frame, tls=tlsmod.client(config),
                             retry_policy=cmd.retry_policy, silence=config.rpc_silence,
                             **authentication(config, cmd.meta_address)) as rpc:
            return await rpc.call(method, args)
    try:
        return trio.run(call)
    except BaseExceptionGroup as group:  # the RPC client's nursery wraps the server's error
        raise sole_exception(group) from None


# --------------------------------------------------------------------------- fsck

def format_fsck(r: dict, *, locations: bool = False) -> list[str]:
    """``hdfs fsck`` style text of the ``fsck`` RPC result."""
    lines = []
    for f in r.get("files", []):
        flags = " OPENFORWRITE" if f.get("open") else ""
        lines.append(f"{f['path']} {f.get('length', 0)} bytes, replication "
                     f"{f.get('replication', 0)}, {len(f.get('blocks', []))} block(s): "
                     f"{f.get('status')}{flags}")
        for i, b in enumerate(f.get("blocks", [])):
            status = b.get("status")
            show = locations or status != "HEALTHY" or b.get("corrupt_replicas")
            if not show:
                continue
            text = (f"  {i}. blk_{b['id']}_{b['gs']} len={b['num_bytes']} {status} "
                    f"live={b.get('live', 0)}/{b.get('expected', 0)}")
            if b.get("decommissioning"):
                text += f" decommissioning={b['decommissioning']}"
            if locations and b.get("locations") is not None:
                text += " [" + ", ".join(loc["address"] for loc in b["locations"]) + "]"
            lines.append(text)
            for bad in b.get("corrupt_replicas", []):
                lines.append(f"     corrupt replica on {bad['node_id']} ({bad['address']}): "
                             f"{bad['reason']}")
    t = r.get("totals", {})
    if r.get("truncated"):
        lines.append("(file list truncated)")
    lines += [
        "",
        f"Status: {r.get('status')}",
        f" Total size:\t{t.get('total_size', 0)} B",
        f" Total dirs:\t{t.get('directories', 0)}",
        f" Total files:\t{t.get('files', 0)}",
        f" Total symlinks:\t{t.get('symlinks', 0)}",
        f" Total blocks (validated):\t{t.get('blocks', 0)}",
        f" Healthy blocks:\t{t.get('healthy_blocks', 0)}",
        f" Under-replicated blocks:\t{t.get('under_replicated_blocks', 0)}",
        f" Corrupt blocks:\t{t.get('corrupt_blocks', 0)}",
        f" Corrupt replicas:\t{t.get('corrupt_replicas', 0)}",
        f" Missing blocks:\t{t.get('missing_blocks', 0)} ({t.get('missing_size', 0)} B)",
        f" Blocks under construction:\t{t.get('under_construction_blocks', 0)}",
        f" Files open for write:\t{t.get('open_files', 0)}",
        "",
        f"The filesystem under path '{r.get('path')}' is {r.get('status')}",
    ]
    return lines


def format_fsck_files(r: dict, *, blocks: bool = False, locations: bool = False) -> list[str]:
    """``hdfs fsck PATH -files [-blocks [-locations]]`` lines: one per file, then one per
    block (``-blocks``), each with its replicas' addresses (``-locations``)."""
    lines = []
    for f in r.get("files", []):
        status = f.get("status")
        flags = " OPENFORWRITE" if f.get("open") else ""
        lines.append(f"{f['path']} {f.get('length', 0)} bytes, replicated: replication="
                     f"{f.get('replication', 0)}, {len(f.get('blocks', []))} block(s): "
                     f"{' OK' if status == 'HEALTHY' else ' ' + str(status)}{flags}")
        if not blocks:
            continue
        for i, b in enumerate(f.get("blocks", [])):
            text = f"{i}. blk_{b['id']}_{b['gs']} len={b['num_bytes']} Live_repl={b.get('live', 0)}"
            if b.get("status") != "HEALTHY":
                text += f" {b.get('status')}"
            if locations:
                text += "  [" + ", ".join(
                    f"DatanodeInfoWithStorage[{loc['address']},{loc.get('node_id', '')},DISK]"
                    for loc in b.get("locations") or []) + "]"
            lines.append(text)
        lines.append("")
    return lines


def corrupt_file_blocks(r: dict) -> list[str]:
    """``hdfs fsck PATH -list-corruptfileblocks`` text of the ``fsck`` RPC result: every
    block without a good replica (corrupt or missing) with its file, then the count."""
    bad = [f"blk_{b['id']}_{b['gs']}\t{f['path']}" for f in r.get("files", [])
           for b in f.get("blocks", []) if b.get("status") in ("CORRUPT", "MISSING")]
    path = r.get("path")
    if not bad:
        return [f"The filesystem under path '{path}' has no CORRUPT files"]
    return [f"The list of corrupt files under path '{path}' are:", *bad,
            f"The filesystem under path '{path}' has {len(bad)} CORRUPT files"]


def cmd_fsck(cmd: Command):
    a = cmd.args
    hdfs_style = a.files or a.blocks or a.hdfs_locations
    try:
        r = _rpc(cmd, "fsck", {"path": paths.normalize_user_path(a.path),
                               "openforwrite": a.openforwrite,
                               "locations": a.locations or bool(hdfs_style)})
    except (LeaseFSError, OSError) as exc:
        cmd.fail(a.path, exc)
        return 1
    if a.json:
        cmd.out(json.dumps(r, indent=2, sort_keys=True, default=str))
    elif a.list_corrupt:
        for line in corrupt_file_blocks(r):
            cmd.out(line)
    elif hdfs_style:
        # as hdfs fsck: the per-file lines, then the totals without the default listing
        lines = format_fsck_files(r, blocks=a.blocks or a.hdfs_locations,
                                  locations=a.hdfs_locations)
        for line in lines + format_fsck({**r, "files": []}):
            cmd.out(line)
    else:
        for line in format_fsck(r, locations=a.locations):
            cmd.out(line)
    return 0 if r.get("status") == "HEALTHY" else 1


# --------------------------------------------------------------------------- decommission

def cmd_decommission(cmd: Command):
    a = cmd.args
    try:
        return _decommission(cmd, a)
    except (LeaseFSError, OSError) as exc:
        cmd.fail(a.node, exc)
        return 1


def _decommission(cmd: Command, a):
    if a.status:
        r = _rpc(cmd, "decommission", {"node": a.node, "action": "status"})
    elif a.stop:
        r = _rpc(cmd, "decommission", {"node": a.node, "action": "stop"})
    else:
        r = _rpc(cmd, "decommission", {"node": a.node, "action": "start"})
    nodes = r if isinstance(r, list) else [r]
    if a.json:
        cmd.out(json.dumps(r, indent=2, sort_keys=True, default=str))
        return 0
    if not nodes:
        cmd.out("no block server is decommissioning or decommissioned")
        return 0
    rows = [[n["node_id"], n["address"], n["admin"], "live" if n["alive"] else "dead",
             n["blocks"], n["blocks_to_copy"]] for n in nodes]
    for line in format_table(["node", "address", "state", "", "blocks", "to copy"], rows,
                             align="<<<<>>"):
        cmd.out(line)
    return 0


# --------------------------------------------------------------------------- save-namespace

def cmd_save_namespace(cmd: Command):
    r = _rpc(cmd, "save_namespace", {})
    if cmd.args.json:
        cmd.out(json.dumps(r, indent=2, sort_keys=True, default=str))
        return 0
    cmd.out(f"Save namespace successful: checkpoint {format_checkpoint(r)}; "
            f"purged {len(r.get('purged', []))} journal segment(s)")
    return 0


def register(sub, common) -> None:
    p = command_parser(sub, "fsck", common, "(superuser) check the health of files' blocks; "
                "exit 1 when a block is missing or corrupt")
    p.add_argument("path", metavar="PATH", nargs="?", default="/")
    p.add_argument("--openforwrite", "-openforwrite", dest="openforwrite", action="store_true",
                   help="also check files open for writing")
    p.add_argument("-list-corruptfileblocks", "--list-corruptfileblocks", dest="list_corrupt",
                   action="store_true", help="only the blocks without a good replica (corrupt "
                   "or missing), one line each with its file")
    p.add_argument("--locations", action="store_true",
                   help="list every file and each block's replica locations")
    p.add_argument("-files", dest="files", action="store_true",
                   help="hdfs fsck style: a line per file")
    p.add_argument("-blocks", dest="blocks", action="store_true",
                   help="hdfs fsck style: and a line per block")
    p.add_argument("-locations", dest="hdfs_locations", action="store_true",
                   help="hdfs fsck style: and each block's replica addresses")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_fsck)

    p = command_parser(sub, "decommission", common, "retire a block server: copy its replicas "
                "elsewhere, then mark it decommissioned (--status: progress)")
    p.add_argument("node", metavar="HOST:PORT", nargs="?", default=None,
                   help="block server address or node id")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--status", action="store_true", help="show decommission progress")
    g.add_argument("--stop", action="store_true", help="put the node back in service")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_decommission)

    p = command_parser(sub, "save-namespace", common, "take a checkpoint now (LevelDB made durable, "
                "journal rolled, old segments purged); needs safe mode and the superuser, as "
                "HDFS dfsadmin -saveNamespace")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_save_namespace)
