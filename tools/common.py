"""What every ``leasefs`` subcommand shares: settings from ``--config``/``--set``, the client
built from ``--meta`` (or address discovery), and the one-line error report.

Why: the CLI's promise is "exit 0 on success; on failure one line ``leasefs <cmd>: <path>:
<cause>`` on stderr and exit 1 (2 for usage errors), never a traceback for a user mistake or
an unreachable cluster". Keeping that promise in one place keeps every command honest.

Concurrency contract: a ``Command`` belongs to the main thread of one CLI process; the sync
``Client`` it opens runs its own trio thread behind the facade.
"""

from __future__ import annotations

import argparse
import errno as _errno
import logging
import os
import sys

from fs.config import Config, cluster_client_settings, default_home, find_meta_address
from fs.errors import InvalidArgument, LeaseFSError, ServerUnavailable
from fs.paths import normalize_user_path

from .formatting import UsageError, parse_settings

log = logging.getLogger(__name__)

PROG = "leasefs"
#: the source tree this package runs from: servers, agents and mounts the tools start as
#: ``python -m tools`` processes run from it too
SOURCE_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(args, *, client: bool = False) -> Config:
    """``Config`` from ``--config FILE`` and ``--set KEY=VALUE`` pairs (env vars in between).
    ``client``: a client of the embedded cluster found through its cluster.json also takes
    that cluster's TLS settings (under everything chosen explicitly)."""
    settings = parse_settings(getattr(args, "set", None))
    try:
        chosen = Config.chosen(getattr(args, "config", None), **settings)
        found = cluster_client_settings(getattr(args, "meta", None)) if client else {}
        return Config().replace(**{**found, **chosen})
    except InvalidArgument as exc:  # unknown setting, bad value, unreadable file
        raise UsageError(str(exc)) from None


def command_meta_address(args) -> str:
    """The metadata server a command talks to: ``--meta`` or ``--set meta_address=``, then
    as ``find_meta_address`` with the command's ``--config`` file."""
    explicit = getattr(args, "meta", None) or \
        parse_settings(getattr(args, "set", None)).get("meta_address")
    return find_meta_address(explicit, config_file=getattr(args, "config", None))


def configured_meta_address(explicit: str | None = None) -> str | None:
    """What ``find_meta_address`` answers when something chose it (``--meta``,
    ``LEASEFS_META``, an embedded cluster's state file, the config file); None when it would
    fall back to the built-in default."""
    if explicit or os.environ.get("LEASEFS_META") or \
            os.path.exists(os.path.join(default_home(), "cluster.json")):
        return find_meta_address(explicit)
    address = Config.load().meta_address
    return None if address == Config().meta_address else address


def _said_already(cmd: str | None, path: str | None) -> list[str]:
    """Openings of an error text that repeat what the line already says (the command and
    the path as typed or normalised), e.g. the server's "decommission: " or "/a/b: "."""
    forms = [path] if path else []
    if path:
        try:
            forms.append(normalize_user_path(path))
        except LeaseFSError:
            pass
    out = [f"{cmd}: "] if cmd else []
    for form in forms:
        out += [f"{form}: ", f"'{form}': "]
    return out


def cause_of(exc: BaseException, path: str | None = None, cmd: str | None = None) -> str:
    """The human cause of an error, without repeating the command or path the line names."""
    if isinstance(exc, LeaseFSError):
        text = exc.message or type(exc).__name__
    elif isinstance(exc, OSError):
        text = exc.strerror or str(exc)
        if exc.errno is not None and not exc.strerror:
            text = os.strerror(exc.errno)
    else:
        text = str(exc) or type(exc).__name__
    openings = _said_already(cmd, path)
    stripped = True
    while stripped:
        stripped = False
        for prefix in openings:
            if text.startswith(prefix) and len(text) > len(prefix):
                text = text[len(prefix):]
                stripped = True
    return " ".join(text.split())  # one line, always


def error_line(cmd: str, path: str | None, exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, LeaseFSError) and exc.filename and not path:
        path = str(exc.filename)
    cause = cause_of(exc, path, cmd)
    return f"{PROG} {cmd}: {path}: {cause}" if path else f"{PROG} {cmd}: {cause}"


class Command:
    """One run of a subcommand: its parsed args, a lazily opened client, the exit status.

    ``fail(path, exc)`` prints the one-line error and marks the run failed, so commands that
    take several paths carry on with the next one (as ``hdfs dfs`` and coreutils do).
    A lost cluster (``ServerUnavailable``) is not per-path: it aborts the command at once
    instead of timing out once per argument.
    """

    def __init__(self, name: str, args, *, stdout=None, stderr=None):
        self.name = name
        self.args = args
        self.status = 0
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self._client = None
        self._config = None

    # ------------------------------------------------------------------ settings, client
    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.args, client=True)
        return self._config

    @property
    def meta_address(self) -> str:
        return command_meta_address(self.args)

    @property
    def retry_policy(self):
        """How this command's RPCs retry: a cluster that is not running (nothing listens on
        loopback) is said at once, and what is retried meanwhile is said on stderr, instead
        of a silent wait of ``rpc_retry_seconds``."""
        from fs.rpc import RetryPolicy
        return RetryPolicy(refused_is_final=True, notice=self.warn)

    @property
    def client(self):
        """The command's client: its namespace reads over a blocking connection to a
        server of this machine where one answers, without trio (``fs.blockingrpc``), the
        full ``fs.client.Client`` for the rest, made when first needed."""
        if self._client is None:
            from fs.blockingrpc import BlockingReads
            self._client = BlockingReads(self.meta_address, self.config, self._full_client)
        return self._client

    def _full_client(self):
        from fs.client import Client  # lazy: a command that only reads may never need it
        return Client(meta_address=self.meta_address, config=self.config,
                      retry_policy=self.retry_policy)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            close = getattr(client, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # closing must not hide the command's own outcome
                    log.debug("closing the client failed", exc_info=True)

    # ------------------------------------------------------------------ reporting
    def fail(self, path: str | None, exc: BaseException) -> None:
        """Report one failed item and remember the failure; re-raise a lost cluster, and a
        reader of our output that went away (``leasefs cat f | head``): neither is about
        this item, and the next would meet it too."""
        if isinstance(exc, ServerUnavailable):
            if not getattr(exc, "item_path", None):
                exc.item_path = path
            raise exc
        if isinstance(exc, BrokenPipeError):
            raise exc
        if getattr(self.args, "debug", False):
            import traceback
            traceback.print_exception(exc, file=self.stderr)
        self.error(error_line(self.name, path, exc))

    def error(self, line: str, status: int = 1) -> None:
        print(line, file=self.stderr, flush=True)
        self.status = max(self.status, status)

    def warn(self, text: str) -> None:
        print(f"{PROG} {self.name}: {text}", file=self.stderr, flush=True)

    def out(self, text: str = "") -> None:
        print(text, file=self.stdout)


def is_missing(exc: BaseException) -> bool:
    """True for "no such file" whatever side (cluster or local) it came from."""
    return getattr(exc, "errno", None) == _errno.ENOENT


def command_parser(sub, name, common, help_text, *, description=None, usage=None):
    """The parser of one command, as every command module adds its own: the common options,
    ``--help`` only in long form (``-h`` is a command option, e.g. human sizes), and the
    description as written."""
    p = sub.add_parser(name, parents=[common], help=help_text, add_help=False, usage=usage,
                       description=description or help_text,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--help", action="help", help="show this help and exit")
    return p


__all__ = ["Command", "UsageError", "load_config", "error_line", "cause_of", "is_missing", "PROG",
           "command_parser"]
