"""The lease and file-length commands of ``leasefs``: ``recover-lease``, ``leases``,
``truncate``, ``append``.

Why a module of its own: these are the commands that act on files *under construction*
(HDFS ``hdfs debug recoverLease``, ``hdfs dfsadmin -listOpenFiles``, ``hdfs dfs -truncate``,
``hdfs dfs -appendToFile``); their outcomes are "done", "still in progress" or "someone else
holds the file", and scripts need those as exit statuses: 0 done, 1 not done (one line on
stderr saying why), 2 usage.

Concurrency contract: synchronous, the CLI's main thread; one client per process.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from fs.errors import FileNotFound, IsDirectory, LeaseFSError

from ..common import Command, command_parser
from ..formatting import UsageError, format_table
from . import transfer

log = logging.getLogger(__name__)

ITEM_ERRORS = (LeaseFSError, OSError)


def _user_path(text: str) -> str:
    from fs import paths
    return paths.normalize_user_path(text)


# --------------------------------------------------------------------------- recover-lease

def cmd_recover_lease(cmd: Command):
    """``recover_lease`` up to ``--retries`` times, ``--interval`` seconds apart."""
    a = cmd.args
    if a.retries < 1:
        raise UsageError("--retries must be at least 1")
    if a.interval < 0:
        raise UsageError("--interval must not be negative")
    try:
        path = _user_path(a.path)
        if cmd.client.get_file_status(path).is_dir:  # leases belong to files only
            raise IsDirectory("is a directory")
        for attempt in range(1, a.retries + 1):
            if cmd.client.recover_lease(path):
                cmd.out(f"recover-lease succeeded on {path}")
                return
            if attempt < a.retries:
                time.sleep(a.interval)
        cmd.error(f"leasefs recover-lease: {path}: lease recovery still in progress after "
                  f"{a.retries} attempt(s) (block recovery is running); try again later")
    except ITEM_ERRORS as exc:
        cmd.fail(a.path, exc)


# --------------------------------------------------------------------------- leases

def _age(value) -> str:
    if value is None:
        return "-"
    try:
        return f"{float(value):.1f}"
    except (TypeError, ValueError):
        return str(value)


def lease_rows(entries: list[dict]) -> list[list]:
    return [[e.get("path", "?"), e.get("holder", "?"), e.get("client_machine") or "-",
             _age(e.get("last_renewal_age")), e.get("last_block_state") or "-"]
            for e in sorted(entries, key=lambda e: str(e.get("path", "")))]


def cmd_leases(cmd: Command):
    a = cmd.args
    try:
        path = _user_path(a.path or "/")
        cmd.client.get_file_status(path)  # a mistyped path is an error, not "nothing open"
        entries = cmd.client.list_open_files(path)
    except ITEM_ERRORS as exc:
        cmd.fail(a.path or "/", exc)
        return
    if a.json:
        cmd.out(json.dumps(entries, indent=2, sort_keys=True, default=str))
        return
    if not entries:
        cmd.out(f"no files open for writing below {path}")
        return
    for line in format_table(["PATH", "HOLDER", "CLIENT MACHINE", "SINCE RENEWAL (s)",
                              "LAST BLOCK"], lease_rows(entries), align="<<<><"):
        cmd.out(line)


# --------------------------------------------------------------------------- truncate

def _wait_closed(cmd: Command, path: str, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if cmd.client.is_file_closed(path):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def cmd_truncate(cmd: Command):
    a = cmd.args
    try:
        length = int(a.length)
    except ValueError:
        raise UsageError(f"LENGTH must be a non-negative integer, got {a.length!r}") from None
    if length < 0:
        raise UsageError(f"LENGTH must be a non-negative integer, got {a.length!r}")
    for raw in a.paths:
        try:
            path = _user_path(raw)
            if cmd.client.truncate(path, length):
                cmd.out(f"Truncated {path} to length: {length}")
                continue
            if not a.wait:
                cmd.out(f"Truncating {path} to length: {length}. The last block is being "
                        f"recovered; wait for it (-w) before writing to the file again.")
                continue
            cmd.out(f"Waiting for {path} ...")
            if _wait_closed(cmd, path, a.timeout):
                cmd.out(f"Truncated {path} to length: {length}")
            else:
                cmd.error(f"leasefs truncate: {path}: block recovery to length {length} did "
                          f"not finish within {a.timeout:g} s")
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


# --------------------------------------------------------------------------- append

def cmd_append(cmd: Command):
    """``hdfs dfs -appendToFile``: append local files (``-`` = stdin) to one cluster file,
    creating it when missing."""
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs LOCAL... DST (at least one source and a destination)")
    *srcs, dst_raw = a.args
    if srcs.count("-") and len(srcs) > 1:
        raise UsageError("'-' (stdin) must be the only source")
    try:
        dst = _user_path(dst_raw)
        readers = []
        for src in srcs:  # open every source first: a missing one must not half-append
            if src == "-":
                readers.append(getattr(sys.stdin, "buffer", sys.stdin))
            else:
                readers.append(open(_local(src), "rb"))
        try:
            try:
                st = cmd.client.get_file_status(dst)
            except FileNotFound:
                st = None
            if st is not None and st.is_dir:
                raise IsDirectory(f"{dst}: is a directory; name the file to append to")
            writer = (cmd.client.append(dst) if st is not None
                      else cmd.client.create(dst, overwrite=False))
            with writer:
                for reader in readers:
                    transfer.pump(reader, writer)
        finally:
            for reader in readers:
                if reader is not getattr(sys.stdin, "buffer", sys.stdin):
                    reader.close()
    except ITEM_ERRORS as exc:
        cmd.fail(getattr(exc, "filename", None) or dst_raw, exc)


def _local(text: str) -> str:
    from ..formatting import split_file_url
    return split_file_url(text)[1]


# --------------------------------------------------------------------------- parsers

def register(sub, common) -> None:
    p = command_parser(sub, "recover-lease", common,
                "force lease recovery of a file left open (hdfs debug recoverLease)",
                description="leasefs recover-lease PATH [--retries N] [--interval S]\n"
                            "Closes a file whose writer died: prints 'recover-lease succeeded "
                            "on PATH' (exit 0),\nor reports that block recovery is still in "
                            "progress (exit 1; run it again).")
    p.add_argument("--retries", type=int, default=1, help="attempts (default 1)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between attempts (default 1)")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(func=cmd_recover_lease)

    p = command_parser(sub, "leases", common, "(superuser) files open for writing: holder, "
                "client machine, seconds since the last lease renewal, last block state")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("path", nargs="?", default=None, metavar="PATH", help="default /")
    p.set_defaults(func=cmd_leases)

    p = command_parser(sub, "truncate", common, "cut files to LENGTH bytes (hdfs dfs -truncate)",
                description="leasefs truncate [-w] LENGTH PATH...\nOn a block boundary the "
                            "file is cut at once; mid-block its last block is recovered\nto "
                            "the new length in the background (-w waits for that).",
                usage="leasefs truncate [options] LENGTH PATH...")
    p.add_argument("-w", dest="wait", action="store_true",
                   help="wait until a mid-block truncate has finished")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds -w waits (default 120)")
    p.add_argument("length", metavar="LENGTH")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_truncate)

    p = command_parser(sub, "append", common, "append local files or stdin to a cluster file "
                "(hdfs dfs -appendToFile; creates it when missing)",
                description="leasefs append LOCAL... PATH  ('-' as LOCAL reads stdin)",
                usage="leasefs append [options] LOCAL... PATH")
    p.add_argument("args", nargs="+", metavar="PATH", help="LOCAL... DST")
    p.set_defaults(func=cmd_append)
