"""The ``hdfs dfs`` copy names: ``copyFromLocal`` (= put), ``copyToLocal`` (= get),
``moveFromLocal`` (put, then delete each local source copied) and ``moveToLocal`` (get, then
delete each cluster source copied; HDFS only prints "not implemented yet" — this does the
useful thing).

Why: scripts written for ``hdfs dfs`` use these names. A source is deleted only after its
own copy succeeded, so a failure never loses data.

Concurrency contract: synchronous, the CLI's main thread; one client per process.
"""

from __future__ import annotations

import os
import shutil

from fs.errors import NotDirectory

from ..common import Command, command_parser
from ..formatting import UsageError, split_file_url
from . import transfer
from .core import (ITEM_ERRORS, PRESERVE_HELP, cluster_sources, cmd_get, cmd_put, copy_items,
                    user_path)


def _move(cmd: Command, sources, dst_side, dst: str, dst_raw: str, delete) -> None:
    """Copy each ``(side, path, raw)`` source on its own, deleting it when that copy worked."""
    if len(sources) > 1:
        try:
            entry = dst_side.stat(dst)
        except ITEM_ERRORS as exc:
            cmd.fail(dst_raw, exc)
            return
        if entry is None or entry.kind != "dir":
            what = "does not exist" if entry is None else "is not a directory"
            cmd.fail(dst_raw, NotDirectory(
                f"{what}; moving several sources needs an existing directory as target"))
            return
    worst = cmd.status
    for source in sources:
        cmd.status = 0
        copy_items(cmd, [source], dst_side, dst, dst_raw)
        if cmd.status == 0:
            try:
                delete(source[1])
            except ITEM_ERRORS as exc:
                cmd.fail(source[2], exc)
        worst = max(worst, cmd.status)
    cmd.status = worst


def _remove_local(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def cmd_move_from_local(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs LOCAL... DST")
    *srcs, dst_raw = a.args
    try:
        dst = user_path(dst_raw)
    except ITEM_ERRORS as exc:
        cmd.fail(dst_raw, exc)
        return
    local = transfer.LocalSide()
    _move(cmd, [(local, split_file_url(s)[1], s) for s in srcs],
          transfer.ClusterSide(cmd.client), dst, dst_raw, _remove_local)


def cmd_move_to_local(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs SRC... LOCALDST")
    *srcs, dst_raw = a.args
    _move(cmd, cluster_sources(cmd, srcs), transfer.LocalSide(), split_file_url(dst_raw)[1], dst_raw,
          lambda path: cmd.client.delete(path, recursive=True))


def _copy_options(p, *, to_cluster: bool) -> None:
    p.add_argument("-f", dest="force", action="store_true", help="overwrite existing files")
    p.add_argument("-p", dest="preserve", action="store_true", help=PRESERVE_HELP)
    p.add_argument("--progress", action="store_true", help="always show a progress bar")
    if to_cluster:
        p.add_argument("--replication", type=int, default=None, help="replication of new files")
        p.add_argument("--block-size", default=None, help="block size of new files (e.g. 64M)")


def register(sub, common) -> None:
    table = [
        ("copyFromLocal", cmd_put, True, "copy local files into the cluster (= put)",
         "LOCAL... DST", "leasefs copyFromLocal report.csv /data/"),
        ("copyToLocal", cmd_get, False, "copy cluster files to the local disk (= get)",
         "SRC... [LOCALDST]", "leasefs copyToLocal /data/report.csv ."),
        ("moveFromLocal", cmd_move_from_local, True,
         "copy local files into the cluster, then delete the local sources",
         "LOCAL... DST", "leasefs moveFromLocal /tmp/batch-7 /incoming/"),
        ("moveToLocal", cmd_move_to_local, False,
         "copy cluster files to the local disk, then delete them from the cluster",
         "SRC... LOCALDST", "leasefs moveToLocal /outbox/done.csv ./"),
    ]
    for name, func, to_cluster, help_text, operands, example in table:
        extra = ("\nA source is deleted only after its own copy succeeded (hdfs dfs "
                 "-moveToLocal is not implemented in HDFS; this one works)."
                 if name == "moveToLocal" else
                 "\nA source is deleted only after its own copy succeeded."
                 if name.startswith("move") else "")
        p = command_parser(sub, name, common, help_text,
                    description=f"leasefs {name} {operands}\n{help_text}.{extra}\n\n"
                                f"example:\n  {example}",
                    usage=f"leasefs {name} [options] {operands}")
        _copy_options(p, to_cluster=to_cluster)
        p.add_argument("args", nargs="+", metavar="PATH", help=operands)
        p.set_defaults(func=func)
