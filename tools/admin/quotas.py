"""Folder quotas, as HDFS ``hdfs dfsadmin -setQuota/-clrQuota/-setSpaceQuota/-clrSpaceQuota``:
``leasefs set-quota N PATH...``, ``clr-quota``, ``set-space-quota``, ``clr-space-quota`` (and
the ``dfsadmin`` spelling, ``tools.admin.dfsadmin``). Superuser only (the server checks).

Why a module of its own: one small command family with its own argument forms (HDFS's
single-dash options, a size with a binary suffix) next to ``admin.py``'s health commands.

Concurrency contract: synchronous, the CLI's main thread; one ``set_quota`` call per path
through the command's client. A path that fails is reported and the others still go, as
HDFS does; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import re

from fs.errors import LeaseFSError

from ..common import Command, command_parser

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kmgtpe]?)b?$", re.IGNORECASE)
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "p": 50, "e": 60}


def parse_size(text: str) -> int:
    """HDFS ``TraditionalBinaryPrefix.string2long``: ``10g``, ``1.5m``, ``4096``."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 512k, 10g)")
    value = int(float(match.group(1)) * (1 << _SHIFT[match.group(2).lower()]))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a quota must be positive, got {text!r}")
    return value


def parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a quota must be positive, got {text!r}")
    return value


def _apply(cmd: Command, what: str, paths, **quota) -> int:
    for path in paths:
        try:
            cmd.client.set_quota(path, **quota)
        except LeaseFSError as exc:
            cmd.error(f"{what}: {exc.message}")
    return cmd.status


def cmd_quota(cmd: Command) -> int:
    a = cmd.args
    if a.action == "setQuota":
        return _apply(cmd, "setQuota", a.paths, ns_quota=a.value)
    if a.action == "clrQuota":
        return _apply(cmd, "clrQuota", a.paths, ns_quota=-1)
    if a.action == "setSpaceQuota":
        return _apply(cmd, "setSpaceQuota", a.paths, ds_quota=a.value)
    return _apply(cmd, "clrSpaceQuota", a.paths, ds_quota=-1)


def register(sub, common) -> None:
    for name, action, value_type, text in (
            ("set-quota", "setQuota", parse_count, "set a folder's name quota (dfsadmin "
             "-setQuota)"),
            ("clr-quota", "clrQuota", None, "clear a folder's name quota (dfsadmin -clrQuota)"),
            ("set-space-quota", "setSpaceQuota", parse_size, "set a folder's space quota, "
             "bytes × replication, suffix k/m/g/t (dfsadmin -setSpaceQuota)"),
            ("clr-space-quota", "clrSpaceQuota", None, "clear a folder's space quota "
             "(dfsadmin -clrSpaceQuota)")):
        p = command_parser(sub, name, common, text)
        if value_type is not None:
            p.add_argument("value", metavar="N", type=value_type)
        p.add_argument("paths", metavar="PATH", nargs="+")
        p.set_defaults(func=cmd_quota, action=action)
