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

from fs.errors import LeaseFSError, NothingListens, ServerUnavailable, sole_exception

from .common import PROG, Command, configured_meta_address, error_line
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


#: every command: the module whose ``register`` adds it, and its one-line help. ``--help`` is
#: made from this table and a command's module is imported only when that command runs, so
#: start-up does not pay for every command (tests/test_cli.py checks it against the modules).
COMMANDS: dict[str, tuple[str, str]] = {
    'meta': ('cluster.daemons', 'run the metadata server (foreground)'),
    'storage': ('cluster.daemons', 'run one block server (foreground)'),
    'tls': ('cluster.embedded', 'wire encryption: issue a certificate from the cluster CA'),
    'cluster': ('cluster.embedded', 'the embedded local cluster: up, down, status'),
    'ls': ('shell.core', 'list directories (-l long format, -R recursive)'),
    'stat': ('shell.core', 'show every field of a file or directory status'),
    'cat': ('shell.core', 'write files to stdout'),
    'put': ('shell.core', 'copy local files or directories into the cluster'),
    'get': ('shell.core', 'copy cluster files or directories to the local disk'),
    'cp': ('shell.core', 'copy within the cluster, or to/from file: URLs'),
    'mv': ('shell.core', 'rename or move into a directory'),
    'rm': ('shell.core', 'delete files and directories'),
    'expunge': ('shell.core', 'empty the trash: checkpoint it and delete checkpoints older than the '
                         "cluster's trash_interval (hdfs dfs -expunge)"),
    'mkdir': ('shell.core', 'create directories'),
    'touch': ('shell.core', 'create empty files or set their times to now'),
    'du': ('shell.core', 'space used by files and directories'),
    'df': ('shell.core', 'cluster capacity and usage'),
    'setrep': ('shell.core', 'change the replication of files (all files below a directory)'),
    'chmod': ('shell.core', 'change permissions (octal or symbolic MODE)'),
    'chown': ('shell.core', 'change owner and/or group (OWNER[:GROUP] or :GROUP)'),
    'tail': ('shell.core', 'the last bytes of a file (default 1K)'),
    'report': ('shell.core', 'cluster report: capacity, blocks, block servers'),
    'safemode': ('shell.core', 'get, enter, leave or wait for safe mode'),
    'checksum': ('shell.checksum', 'content checksums (COMPOSITE-CRC32C) that do not depend on block '
                             'size'),
    'copyFromLocal': ('shell.alias', 'copy local files into the cluster (= put)'),
    'copyToLocal': ('shell.alias', 'copy cluster files to the local disk (= get)'),
    'moveFromLocal': ('shell.alias', 'copy local files into the cluster, then delete the local '
                                    'sources'),
    'moveToLocal': ('shell.alias', 'copy cluster files to the local disk, then delete them from '
                                  'the cluster'),
    'touchz': ('shell.attr', 'create zero-length files'),
    'chgrp': ('shell.attr', 'change the group of files and directories'),
    'rmdir': ('shell.attr', 'delete empty directories'),
    'test': ('shell.testpath', 'answer a question about a path with the exit status'),
    'find': ('shell.find', 'find files and directories by name or type'),
    'count': ('shell.count', 'count directories, files and bytes below paths'),
    'head': ('shell.read', 'the first kilobyte of a file'),
    'text': ('shell.read', 'write files to stdout, decompressing .gz/.bz2/.zst'),
    'getmerge': ('shell.read', 'concatenate cluster files into one local file'),
    'recover-lease': ('shell.leases', 'force lease recovery of a file left open (hdfs debug '
                                    'recoverLease)'),
    'leases': ('shell.leases', '(superuser) files open for writing: holder, client machine, '
                             'seconds since the last lease renewal, last block state'),
    'truncate': ('shell.leases', 'cut files to LENGTH bytes (hdfs dfs -truncate)'),
    'append': ('shell.leases', 'append local files or stdin to a cluster file (hdfs dfs '
                             '-appendToFile; creates it when missing)'),
    'fsck': ('admin.maintenance', "(superuser) check the health of files' blocks; exit 1 when a block "
                      'is missing or corrupt'),
    'decommission': ('admin.maintenance', 'retire a block server: copy its replicas elsewhere, then mark it '
                              'decommissioned (--status: progress)'),
    'save-namespace': ('admin.maintenance', 'take a checkpoint now (LevelDB made durable, journal rolled, '
                                'old segments purged); needs safe mode and the superuser, as '
                                'HDFS dfsadmin -saveNamespace'),
    'haadmin': ('admin.haadmin', "metadata HA: the servers' roles, a graceful failover (hdfs haadmin)"),
    'dfsadmin': ('admin.dfsadmin', 'HDFS dfsadmin: -report, -safemode, -saveNamespace, -refreshNodes, '
                             '-printTopology, -listOpenFiles and the quota verbs, each running '
                             'its leasefs command'),
    'set-quota': ('admin.quotas', "set a folder's name quota (dfsadmin -setQuota)"),
    'clr-quota': ('admin.quotas', "clear a folder's name quota (dfsadmin -clrQuota)"),
    'set-space-quota': ('admin.quotas', "set a folder's space quota, bytes × replication, suffix "
                                  'k/m/g/t (dfsadmin -setSpaceQuota)'),
    'clr-space-quota': ('admin.quotas', "clear a folder's space quota (dfsadmin -clrSpaceQuota)"),
    'concat': ('shell.concat', 'append the blocks of SRC... to TARGET without copying and delete the '
                         "sources (HDFS concat; same folder, full blocks but the last source's "
                         'last, same block size)'),
    'token': ('admin.tokens', 'delegation tokens for clients on other machines (HDFS fetchdt): fetch, '
                        'renew, cancel, print'),
    'mount': ('cluster.mountcmd', 'mount the cluster with FUSE (daemonizes unless --foreground)'),
    'umount': ('cluster.mountcmd', 'unmount a leasefs mount (fusermount3 -u)'),
    'bench': ('bench.command', 'benchmarks: write, read, meta (cluster), fuse and apps (any '
                               "folder), cli (start-up), ha and partition (private clusters), "
                               "hdfs (Hadoop's client vs leasefs's), packets (block "
                               "servers' cost of an HDFS write stream)"),
    'settings': ('docgen', 'list every setting with its default'),
    'commands': ('cmddoc', 'list every command with its one-line help'),
}


def _modules() -> list[str]:
    """The command modules in the order their commands are listed."""
    return list(dict.fromkeys(module for module, _ in COMMANDS.values()))


def build_parser(only: str | None = None, *, light: bool = False) -> Parser:
    """The parser of every command (each command's module imported); with ``only`` just
    that command's module is imported, with ``light`` none: the other commands are then
    entries of the command list that ``--help`` prints."""
    import importlib

    common = common_options()
    parser = Parser(prog=PROG, parents=[common],
                    description="leasefs: a pure-Python distributed filesystem in the mould of "
                                "HDFS. 'leasefs COMMAND --help' describes each command. HDFS's "
                                "forms work too: 'leasefs dfs -ls /', 'leasefs fs -du -s -h /'.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [COMMANDS[only][0]] if only else [] if light else _modules()
    for module in modules:
        importlib.import_module(f".{module}", __package__).register(sub, common)
    for name, (_, text) in COMMANDS.items():
        if name not in sub.choices:
            # a line of the command list, no parser: main() builds a parser with this
            # command's module whenever the command is named
            sub.choices[name] = None
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), text))
    return parser


class VersionAction(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib import metadata

        try:
            version = metadata.version("leasefs")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        print(f"{PROG} {version}")
        parser.exit()


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
        if isinstance(exc, NothingListens):
            line += "; is the cluster running? see 'leasefs cluster status'"
        elif isinstance(exc, ServerUnavailable):
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
    from .hdfsnames import check_authority, cluster_uris, command_index, translate

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = translate(argv, COMMANDS)
        argv, authority = cluster_uris(argv)
        index = command_index(argv)
        name = argv[index] if index is not None else None
        if name is not None and name not in COMMANDS:
            raise UsageError(f"unknown command '{name}' (see '{PROG} --help')")
        parser = build_parser(only=name) if name in COMMANDS else build_parser(light=True)
        args, extras = parser.parse_known_args(argv)
        if authority is not None:   # a leasefs://HOST:PORT/path argument names the server
            args.meta = check_authority(authority, configured_meta_address(
                getattr(args, "meta", None)))
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
