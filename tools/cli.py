"""The ``leasefs`` command line: one entry point (``main``) for the servers (``meta``,
``storage``), the embedded cluster (``cluster up|down|status``), the shell tools (``ls``,
``put``, ...) and the benchmarks (``bench``).

Why one dispatcher: exit statuses and error lines are part of the interface scripts rely on —
0 on success; on failure one line ``leasefs <cmd>: <path>: <cause>`` on stderr and 1; usage
mistakes 2; never a traceback for a user mistake or an unreachable cluster (``--debug``
shows tracebacks). Options shared by every command (``--meta``, ``--config``, ``--set``,
``--debug``, ``--log-level``) may be given before or after the command name.

Concurrency contract: runs on the main thread of a short-lived process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from fs.errors import LeaseFSError, ServerUnavailable, sole_exception

from .common import PROG, Command, error_line
from .formatting import UsageError

log = logging.getLogger(__name__)


class Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (one line, exit 2) instead of printing usage."""

    def error(self, message):
        err = UsageError(f"{message} (see '{self.prog} --help')")
        err.prog = self.prog
        raise err


def common_options() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    g = common.add_argument_group("common options")
    g.add_argument("--meta", default=argparse.SUPPRESS, metavar="HOST:PORT[,HOST:PORT...]",
                   help="metadata server, or the comma-separated HA list of them (default: "
                        "$LEASEFS_META, the running embedded "
                        "cluster, the config file, 127.0.0.1:8020)")
    g.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE",
                   help="TOML settings file (default: $LEASEFS_CONFIG)")
    g.add_argument("--set", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUE",
                   help="override any setting (repeatable), e.g. --set rpc_retry_seconds=1")
    g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks and debug logs")
    g.add_argument("--log-level", default=argparse.SUPPRESS,
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning",
                            "error"], help="log level (servers: INFO, tools: ERROR)")
    return common


def build_parser() -> Parser:
    from . import (admin, bench, cluster, cmddoc, concat, daemons, docgen, haadmin,
                   leasetools, mountcmd, quotas, shell, shellalias, shellattr, shellcount, shellfind,
                   shellread, shelltest, tokens)

    common = common_options()
    parser = Parser(prog=PROG, parents=[common],
                    description="leasefs: a pure-Python distributed filesystem in the mould of "
                                "HDFS. 'leasefs COMMAND --help' describes each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    daemons.register(sub, common)
    cluster.register(sub, common)
    shell.register(sub, common)
    from . import checksum
    checksum.register(sub, common)
    shellalias.register(sub, common)
    shellattr.register(sub, common)
    shelltest.register(sub, common)
    shellfind.register(sub, common)
    shellcount.register(sub, common)
    shellread.register(sub, common)
    leasetools.register(sub, common)
    admin.register(sub, common)
    haadmin.register(sub, common)
    quotas.register(sub, common)
    concat.register(sub, common)
    tokens.register(sub, common)
    mountcmd.register(sub, common)
    bench.register(sub, common)
    docgen.register(sub, common)
    cmddoc.register(sub, common)
    return parser


def _command_name(args) -> str:
    name = getattr(args, "command", None) or ""
    for attr in ("action", "kind"):
        sub = getattr(args, attr, None)
        if sub and name in ("cluster", "bench", "tls"):
            return f"{name} {sub}"
    return name


def _setup_tool_logging(args) -> None:
    level = getattr(args, "log_level", None)
    if level is None:
        level = "DEBUG" if getattr(args, "debug", False) else "ERROR"
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")


def _report(name: str, exc: BaseException, cmd, debug: bool) -> int:
    """Print the one line a failed command ends with; its exit status."""
    if isinstance(exc, UsageError):
        print(f"{PROG} {name}: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, KeyboardInterrupt):
        print(f"{PROG} {name}: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, BrokenPipeError):  # `leasefs cat f | head`: the reader left, that is fine
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    if isinstance(exc, (LeaseFSError, OSError)):
        line = error_line(name, getattr(exc, "item_path", None), exc)
        if isinstance(exc, ServerUnavailable):
            where = getattr(cmd, "meta_address", None) if cmd is not None else None
            line += (f" (metadata server {where}; is the cluster running? "
                     "see 'leasefs cluster status')" if where else "")
        print(line, file=sys.stderr)
        return 1
    if not debug:  # a bug: one line unless --debug
        print(f"{PROG} {name}: internal error: {type(exc).__name__}: {exc} "
              "(run with --debug for the traceback)", file=sys.stderr)
    return 1


def main(argv=None) -> int:
    """Run one ``leasefs`` command; returns the exit status."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
    except UsageError as exc:
        print(f"{getattr(exc, 'prog', PROG)}: {exc}", file=sys.stderr)
        return 2
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    name = _command_name(args)
    if extras:
        print(f"{PROG} {name}: unrecognized arguments: {' '.join(extras)} "
              f"(see '{PROG} {name} --help')", file=sys.stderr)
        return 2
    debug = bool(getattr(args, "debug", False))
    raw = getattr(args, "raw", False)
    if not raw:
        _setup_tool_logging(args)
    cmd = None
    try:
        if raw:  # servers, cluster launcher: they own their output and logging
            status = args.func(args)
        else:
            cmd = Command(name, args)
            result = args.func(cmd)
            status = cmd.status if result is None else result
        sys.stdout.flush()
        return int(status or 0)
    except BaseException as raised:
        # trio wraps an error that crosses a nursery in a group: report the one inside
        exc = sole_exception(raised)
        if not isinstance(exc, (Exception, KeyboardInterrupt)):
            raise
        if debug and not isinstance(exc, (UsageError, KeyboardInterrupt, BrokenPipeError)):
            traceback.print_exception(raised)
        return _report(name, exc, cmd, debug)
    finally:
        if cmd is not None:
            cmd.close()
