"""Run a leasefs mount: connect the client, ``pyfuse3.init``, ``pyfuse3.main``, clean up.

Why a module of its own: the CLI (``tools/cluster/mountcmd.py``) only parses options and
daemonizes; everything that must happen in order around the FUSE loop lives here — the
client is connected before the mount appears (so a wrong ``--meta`` fails at once), the
mount reports readiness through ``on_ready`` only after ``pyfuse3.init`` succeeded, and on
the way out (``fusermount3 -u``, SIGTERM, SIGINT) every open file is published and the
client closes its leases before the process exits. With ``mount_metrics_port`` >= 0 the
mount's ``/metrics`` page (``mount/web.py``) is served in the FUSE loop's nursery.

Concurrency contract: ``run_mount`` is called once per process, on the main thread, and
owns the one trio run; pyfuse3 runs its request tasks inside it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import signal
import socket
import tempfile
from functools import partial

import pyfuse3
import trio

from fs.client import AsyncClient, FileSettings
from fs.config import Config, default_home
from fs.errors import NotDirectory
from fs.web import serve_app

from .operations import LeaseFS
from .web import make_app as make_metrics_app

log = logging.getLogger(__name__)


class LateReplyFilter(logging.Filter):
    """pyfuse3 logs an ERROR when the kernel refuses a reply with ENOENT. That means the
    kernel no longer waits for it: the caller was interrupted, or the mount went away while
    the request ran (an unmount right after a close races the asynchronous release, whose
    work is done all the same). Nothing is lost, so it is logged as INFO."""

    _NO_WAITER = f"fuse_reply_* failed with {os.strerror(errno.ENOENT)}"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and self._NO_WAITER in record.getMessage():
            record.msg = (f"{record.getMessage()}: the kernel no longer waits for this reply "
                          f"(caller interrupted or mount going away)")
            record.args = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def default_cache_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "leasefs-mount-cache")


#: ``-o`` options that are the mount's own, not the kernel's (``split_own_options``)
SYNC_NAMESPACE = "sync_namespace"


def split_own_options(extra: list[str] | None) -> tuple[list[str], set[str]]:
    """The ``-o`` items without the mount's own options, and those found."""
    kept, own = [], set()
    for item in extra or []:
        opts = [opt.strip() for opt in item.split(",") if opt.strip()]
        own.update(opt for opt in opts if opt == SYNC_NAMESPACE)
        kept.append(",".join(opt for opt in opts if opt != SYNC_NAMESPACE))
    return kept, own


def mount_options(extra: list[str] | None, fsname: str) -> set[str]:
    """pyfuse3 defaults plus ``fsname``/``subtype`` and the user's ``-o`` options."""
    options = set(pyfuse3.default_options)
    # libfuse splits -o values at commas: an HA list of servers is shown joined with "+"
    options.add(f"fsname=leasefs:{fsname.replace(',', '+')}")
    options.add("subtype=leasefs")
    for item in extra or []:
        for opt in item.split(","):
            if opt.strip():
                options.add(opt.strip())
    return options


def registry_path(mountpoint: str, pid: int | None = None) -> str:
    """Where the mount process ``pid`` (default: this one) serving ``mountpoint`` records
    itself, so ``leasefs umount --force`` can ask exactly that process (and no other) to
    publish its open files and go. One file per process: mounts stacked on one folder each
    keep theirs."""
    digest = hashlib.sha1(os.path.abspath(mountpoint).encode()).hexdigest()[:16]
    return os.path.join(default_home(), "mounts", f"{digest}-{pid or os.getpid()}.pid")


def _register(mountpoint: str, device: str | None) -> str | None:
    path = registry_path(mountpoint)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(f"{os.getpid()} {device or '-'} {mountpoint}\n")
        return path
    except OSError as exc:
        log.info("mount registry %s not written: %s", path, exc)
        return None


def mounted_device(mountpoint: str) -> str | None:
    """The device (``major:minor``) of the topmost mount at ``mountpoint``, the one the path
    resolves to now, from /proc/self/mountinfo (so no request reaches a mount's own, maybe
    still starting, handlers); None if nothing is mounted there."""
    # mountinfo escapes blanks and backslashes in paths as octal; a mount stacked on another
    # is listed after it
    escaped = "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] == escaped:
                    found = fields[2]
    except OSError:
        return None
    return found


def registered_pid(mountpoint: str) -> int | None:
    """The pid of the leasefs mount process serving the topmost mount at ``mountpoint`` (of
    mounts stacked there, the one the path resolves to), if it still runs."""
    mountpoint = os.path.abspath(mountpoint)
    device = mounted_device(mountpoint)
    if device is None:
        return None
    folder = os.path.dirname(registry_path(mountpoint))
    prefix = os.path.basename(registry_path(mountpoint, 1))[:-len("1.pid")]
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return None
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path) as fh:
                pid_text, recorded_device, recorded = fh.read().strip().split(" ", 2)
            pid = int(pid_text)
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except FileNotFoundError:   # a mount process killed before it could unregister
            if os.path.exists(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            continue
        except (OSError, ValueError):
            continue
        if recorded == mountpoint and recorded_device == device and b"mount" in cmdline:
            return pid
    return None


def mount_client_name(mountpoint: str) -> str:
    """The mount's lease holder name: says it is a mount, where, and which process."""
    return f"leasefs-mount-{socket.gethostname()}-{os.getpid()}"


def mount_client_config(config: Config) -> Config:
    """The mount's client settings: an unreachable or silent metadata server fails a request
    within ``mount_meta_timeout`` (EIO) instead of hanging the shell that made it, and
    namespace changes are durable at fsync(2) (``mount_sync_metadata``).

    Data calls obey the same bound, as a bound on no progress (a large write to slow but
    live block servers goes on): a write, flush or close fails once its stream went
    ``mount_meta_timeout`` without a packet acknowledged (``data_stall_timeout``). One
    silent block server is noticed within a third of it (``data_timeout``, not below a
    second: a loaded but live server must not be dropped from every pipeline), so that the
    pipeline recovery that drops it fits in the bound and the write goes on. The mount waits
    for acks without the timeout ladder's steps (``data_ack_timeout_step`` 0): its third of
    the bound is the whole wait, shorter than the block servers' own, so it is the first
    to time out anyway and the bound is what keeps the call short."""
    bound = max(1.0, config.mount_meta_timeout)
    return config.replace(rpc_retry_seconds=min(config.rpc_retry_seconds, bound),
                          rpc_timeout=min(config.rpc_timeout, bound),
                          data_timeout=min(config.data_timeout, max(1.0, bound / 3)),
                          data_ack_timeout_step=0.0,
                          data_stall_timeout=bound,
                          sync_metadata=config.mount_sync_metadata)


def _mount_bdi(mountpoint: str) -> str | None:
    """``/sys/class/bdi/<major:minor>`` of the topmost FUSE mount at ``mountpoint``."""
    device = mounted_device(mountpoint)
    path = f"/sys/class/bdi/{device}"
    return path if device is not None and os.path.isdir(path) else None


def set_readahead(mountpoint: str, nbytes: int) -> int | None:
    """Set the kernel readahead window of the mount (root only); the value now in effect
    in bytes, or None when it cannot be read/set. Readahead makes the kernel keep several
    large read requests in flight, which hides the per-request round trip."""
    bdi = _mount_bdi(mountpoint)
    if bdi is None:
        return None
    knob = os.path.join(bdi, "read_ahead_kb")
    try:
        if nbytes > 0:
            with open(knob, "w") as fh:
                fh.write(str(max(4, nbytes // 1024)))
        with open(knob) as fh:
            return int(fh.read().strip()) * 1024
    except (OSError, ValueError) as exc:
        log.info("readahead of %s not set: %s", mountpoint, exc)
        return None


async def _serve(mountpoint: str, meta_address: str, config: Config, options: set[str],
                 cache_dir: str, entry_timeout: float, attr_timeout: float, on_ready,
                 file_settings: FileSettings, subdir: str) -> None:
    own_cache = os.path.join(cache_dir, f"mount-{os.getpid()}")
    file_settings.check(f"mount {mountpoint}")
    async with AsyncClient(meta_address, config=mount_client_config(config),
                           client_name=mount_client_name(mountpoint)) as client:
        root = await client.get_file_status(subdir)
        if not root.is_dir:
            raise NotDirectory(f"--subdir {subdir}: not a folder")
        ops = LeaseFS(client, own_cache, entry_timeout=entry_timeout, attr_timeout=attr_timeout,
                      negative_timeout=config.mount_negative_timeout,
                      cache_limit=config.mount_cache_limit, file_settings=file_settings,
                      root=root.path, root_ino=root.ino,
                      dir_leases=config.mount_dir_leases and not config.mount_sync_metadata)
        pyfuse3.init(ops, mountpoint, options)
        mounted = True
        # pyfuse3.init has just mounted it: the topmost mount there is this one
        device = mounted_device(mountpoint)
        registry = _register(mountpoint, device)
        try:
            readahead = await trio.to_thread.run_sync(set_readahead, mountpoint,
                                                      config.mount_readahead)
            log.info("mounted %s at %s (readahead %s, meta timeout %gs, cache %s)",
                     meta_address, mountpoint, readahead, config.mount_meta_timeout, own_cache)
            if on_ready is not None:
                on_ready()
            async with trio.open_nursery() as nursery:
                async def stop_on_signal():
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for signum in signals:
                            log.info("signal %d: unmounting %s", signum, mountpoint)
                            pyfuse3.terminate()
                            return

                nursery.start_soon(stop_on_signal)
                nursery.start_soon(ops.run_background)
                if config.mount_metrics_port >= 0:   # serve_app logs the bound URL
                    await nursery.start(partial(
                        serve_app, make_metrics_app(ops.metrics), config.bind_host,
                        config.mount_metrics_port, name=f"mount {mountpoint} /metrics"))
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
            await ops.close_all()
        finally:
            if mounted:
                # unmounting goes by path, which names the topmost mount: under another
                # mount stacked on ours that would stop the other one; closing our FUSE
                # connection ends ours
                pyfuse3.close(unmount=device is None or mounted_device(mountpoint) == device)
            shutil.rmtree(own_cache, ignore_errors=True)
            if registry is not None:
                try:
                    os.unlink(registry)
                except OSError:
                    pass


def run_mount(mountpoint: str, meta_address: str, config: Config, *, options=None,
              cache_dir: str | None = None, entry_timeout: float | None = None,
              attr_timeout: float | None = None, on_ready=None,
              file_settings: FileSettings | None = None, subdir: str = "/") -> None:
    """Mount the cluster at ``mountpoint`` and serve until unmounted or signalled. Unset
    arguments come from ``config`` (``mount_*`` settings). ``file_settings``: what files
    created through the mount get (block size, replication, checksum chunk; unset = the
    cluster's defaults). ``subdir``: the cluster folder shown at the top of the mount (its
    quotas are what ``df`` shows)."""
    options, own = split_own_options(options)
    if SYNC_NAMESPACE in own:
        config = config.replace(mount_dir_leases=False)
    opts = mount_options(options, meta_address)
    pyfuse3_log = logging.getLogger("pyfuse3")
    if not any(isinstance(f, LateReplyFilter) for f in pyfuse3_log.filters):
        pyfuse3_log.addFilter(LateReplyFilter())
    trio.run(_serve, os.path.abspath(mountpoint), meta_address, config, opts,
             cache_dir or config.mount_cache_dir or default_cache_dir(),
             config.mount_entry_timeout if entry_timeout is None else entry_timeout,
             config.mount_attr_timeout if attr_timeout is None else attr_timeout, on_ready,
             file_settings or FileSettings(), subdir)


__all__ = ["run_mount", "mount_options", "default_cache_dir", "mount_client_config",
           "set_readahead", "registry_path", "registered_pid", "mounted_device",
           "mount_client_name"]
