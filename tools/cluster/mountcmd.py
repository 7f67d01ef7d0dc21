"""``leasefs mount`` and ``leasefs umount``: the FUSE mount as a command.

Why: people mount with one command and get their shell back (the mount daemonizes and the
command returns only once the mountpoint works, or fails with one line saying why); tests
and debugging use ``--foreground``. ``umount`` is ``fusermount3 -u`` (``umount`` as a
fallback), which makes the mount publish its open files and exit.

Concurrency contract: the CLI's main thread. The daemon is a forked child that reports
readiness through a pipe before the parent exits; the mount itself runs in one trio run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

from fs.client import FileSettings
from fs.config import Config, default_home

from ..common import PROG, command_meta_address, command_parser, load_config
from ..formatting import UsageError, parse_settings
from .processes import mounted_fuse, process_state

log = logging.getLogger(__name__)


def _setup_logging(args, stream) -> None:
    level = getattr(args, "log_level", None) or ("DEBUG" if getattr(args, "debug", False)
                                                 else "WARNING")
    logging.basicConfig(level=getattr(logging, level.upper()), stream=stream,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a mountpoint, or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file or directory"
    except OSError as exc:  # e.g. a dead FUSE mount: "transport endpoint is not connected"
        return (exc.strerror or str(exc)).lower()
    return None if stat.S_ISDIR(st.st_mode) else "not a directory"


def cmd_mount(args) -> int:
    mountpoint = os.path.abspath(args.mountpoint)
    problem = _path_problem(mountpoint)
    if problem:
        print(f"{PROG} mount: {mountpoint}: {problem}", file=sys.stderr)
        return 1
    try:
        config = load_config(args, client=True)
    except UsageError as exc:
        print(f"{PROG} mount: {exc}", file=sys.stderr)
        return 2
    meta = command_meta_address(args)
    try:
        import pyfuse3  # noqa: F401
    except ImportError as exc:
        print(f"{PROG} mount: pyfuse3 is not installed ({exc})", file=sys.stderr)
        return 1
    from mount.runner import run_mount

    # per-file settings given explicitly (--set, LEASEFS_*, --config) apply to the files
    # the mount creates; the client's other settings follow the cluster's defaults
    chosen = Config.chosen(getattr(args, "config", None),
                           **parse_settings(getattr(args, "set", None)))
    kwargs = dict(options=args.options, cache_dir=args.cache_dir, subdir=args.subdir,
                  entry_timeout=args.entry_timeout, attr_timeout=args.attr_timeout,
                  file_settings=FileSettings.chosen_in(config, chosen))
    if args.foreground:
        _setup_logging(args, sys.stderr)
        try:
            run_mount(mountpoint, meta, config, **kwargs)
        except Exception as exc:  # noqa: BLE001 - one line, exit 1
            if getattr(args, "debug", False):
                raise
            print(f"{PROG} mount: {mountpoint}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        return 0
    return _daemonize(args, mountpoint, meta, config, kwargs, run_mount)


def default_log_file(mountpoint: str) -> str:
    """Where a daemonized mount logs unless told (``--log-file``): a file per mountpoint
    beside the embedded cluster's logs, ``<home>/logs/mount-<path with dashes>.log``."""
    name = os.path.abspath(mountpoint).strip("/").replace("/", "-") or "root"
    return os.path.join(default_home(), "logs", f"mount-{name}.log")


def _daemonize(args, mountpoint, meta, config, kwargs, run_mount) -> int:
    log_file = os.path.abspath(args.log_file or default_log_file(mountpoint))
    try:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        log_target = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        print(f"{PROG} mount: {mountpoint}: log file {log_file}: "
              f"{exc.strerror or exc} (--log-file elsewhere)", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid > 0:  # parent: wait for "ready" or the child's error
        os.close(write_end)
        os.close(log_target)
        chunks = []
        while True:
            data = os.read(read_end, 4096)
            if not data:
                break
            chunks.append(data)
        os.close(read_end)
        message = b"".join(chunks).decode(errors="replace")
        if message.startswith("ok"):
            print(f"mounted {meta} at {mountpoint} (log: {log_file})")
            return 0
        print(f"{PROG} mount: {mountpoint}: {message or 'mount process exited'}",
              file=sys.stderr)
        return 1
    # child
    os.close(read_end)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(log_target, 1)
    os.dup2(log_target, 2)
    _setup_logging(args, sys.stderr)
    status = 0

    def ready():
        os.write(write_end, b"ok")
        os.close(write_end)

    try:
        run_mount(mountpoint, meta, config, on_ready=ready, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        log.exception("mount failed")
        try:
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode())
        except OSError:
            pass
        status = 1
    os._exit(status)


def _fusermount(mountpoint: str, lazy: bool) -> tuple[bool, str]:
    flag = ["-z"] if lazy else []
    tools = [["fusermount3", "-u", *flag, mountpoint], ["fusermount", "-u", *flag, mountpoint]]
    if os.geteuid() == 0:
        tools.append(["umount", *(["-l"] if lazy else []), mountpoint])
    last = "no fusermount3/fusermount/umount found"
    for argv in tools:
        if shutil.which(argv[0]) is None:
            continue
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            return True, ""
        last = " ".join((proc.stderr or proc.stdout).split()) or f"{argv[0]} failed"
    return False, last


def _stop_mount_process(mountpoint: str, timeout: float = 120.0) -> str | None:
    """SIGTERM the registered mount process of ``mountpoint`` (it publishes its open files,
    releases its leases and unmounts) and wait for it; an error text or None."""
    from mount.runner import registered_pid

    pid = registered_pid(mountpoint)
    if pid is None:
        return "no running leasefs mount process is registered for it"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            return None
        time.sleep(0.1)
    return f"mount process {pid} did not exit within {timeout:g} s"


def _zombie(pid: int) -> bool:
    """Exited and not yet reaped (or gone)."""
    return process_state(pid) in (None, "Z")


def cmd_umount(args) -> int:
    """Unmount. A busy mount (files open) is refused unless ``--lazy`` (detach now; the
    mount finishes when the last file closes) or ``--force`` (the mount process publishes
    every open file with its data, releases the leases and exits)."""
    mountpoint = os.path.abspath(args.mountpoint)
    try:
        os.lstat(mountpoint)  # lstat: a dead FUSE mount still unmounts
    except FileNotFoundError:
        print(f"{PROG} umount: {mountpoint}: no such file or directory", file=sys.stderr)
        return 1
    except OSError:
        pass
    if not mounted_fuse(mountpoint):  # listed even when its process died
        print(f"{PROG} umount: {mountpoint}: not a FUSE mount point", file=sys.stderr)
        return 1
    if getattr(args, "force", False):
        problem = _stop_mount_process(mountpoint)
        if problem is None:
            return 0
        ok, last = _fusermount(mountpoint, lazy=False)
        if ok:
            return 0
        print(f"{PROG} umount: {mountpoint}: {problem}; {last}", file=sys.stderr)
        return 1
    ok, last = _fusermount(mountpoint, lazy=getattr(args, "lazy", False))
    if ok:
        return 0
    if "busy" in last.lower():
        last += (" (files are open on it: --lazy detaches it now and it finishes when they "
                 "close; --force closes them with their data and unmounts)")
    print(f"{PROG} umount: {mountpoint}: {last}", file=sys.stderr)
    return 1


def register(sub, common) -> None:
    p = command_parser(sub, "mount", common, "mount the cluster with FUSE (daemonizes unless "
                "--foreground)",
                description="leasefs mount MOUNTPOINT [--foreground] [-o OPT,...] "
                            "[--cache-dir DIR]\nReturns once the mount works (or fails "
                            "with one line). Unmount with 'leasefs umount MOUNTPOINT'.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--foreground", "-f", action="store_true",
                   help="stay in the foreground (logs to stderr)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT,...",
                   help="FUSE mount options, e.g. allow_other")
    p.add_argument("--subdir", "-S", default="/", metavar="PATH",
                   help="show this cluster folder at the top of the mount (MooseFS mfsmount "
                        "-S); df then shows its quotas")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="folder for staging files of random writes (setting mount_cache_dir; "
                        "default $TMPDIR/leasefs-mount-cache)")
    p.add_argument("--entry-timeout", type=float, default=None,
                   help="seconds the kernel caches names (setting mount_entry_timeout, 1)")
    p.add_argument("--attr-timeout", type=float, default=None,
                   help="seconds the kernel caches attributes (setting mount_attr_timeout, 1)")
    p.add_argument("--log-file", default=None, metavar="FILE",
                   help="where the daemonized mount logs (default: <home>/logs/"
                        "mount-<mountpoint with dashes>.log; --foreground: stderr)")
    p.set_defaults(func=cmd_mount, raw=True)

    p = command_parser(sub, "umount", common, "unmount a leasefs mount (fusermount3 -u)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--lazy", "-z", action="store_true",
                     help="detach now even with files open; the mount finishes when they close")
    how.add_argument("--force", action="store_true",
                     help="make the mount process close every open file with its data, "
                          "release its leases and exit")
    p.set_defaults(func=cmd_umount, raw=True)
