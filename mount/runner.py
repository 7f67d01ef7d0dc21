"""Run a leasefs mount: connect the client, ``pyfuse3.init``, ``pyfuse3.main``, clean up.

Why a module of its own: the CLI (``tools/mountcmd.py``) only parses options and
daemonizes; everything that must happen in order around the FUSE loop lives here — the
client is connected before the mount appears (so a wrong ``--meta`` fails at once), the
mount reports readiness through ``on_ready`` only after ``pyfuse3.init`` succeeded, and on
the way out (``fusermount3 -u``, SIGTERM, SIGINT) every open file is published and the
client closes its leases before the process exits.

Concurrency contract: ``run_mount`` is called once per process, on the main thread, and
owns the one trio run; pyfuse3 runs its request tasks inside it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile

import pyfuse3
import trio

from fs.client import AsyncClient
from fs.config import Config

from .operations import LeaseFS

log = logging.getLogger(__name__)


def default_cache_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "leasefs-mount-cache")


def mount_options(extra: list[str] | None, fsname: str) -> set[str]:
    """pyfuse3 defaults plus ``fsname``/``subtype`` and the user's ``-o`` options."""
    options = set(pyfuse3.default_options)
    options.add(f"fsname=leasefs:{fsname}")
    options.add("subtype=leasefs")
    for item in extra or []:
        for opt in item.split(","):
            if opt.strip():
                options.add(opt.strip())
    return options


async def _serve(mountpoint: str, meta_address: str, config: Config, options: set[str],
                 cache_dir: str, entry_timeout: float, attr_timeout: float, on_ready) -> None:
    own_cache = os.path.join(cache_dir, f"mount-{os.getpid()}")
    async with AsyncClient(meta_address, config=config) as client:
        ops = LeaseFS(client, own_cache, entry_timeout=entry_timeout, attr_timeout=attr_timeout)
        pyfuse3.init(ops, mountpoint, options)
        mounted = True
        try:
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
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
            await ops.close_all()
        finally:
            if mounted:
                pyfuse3.close(unmount=True)
            shutil.rmtree(own_cache, ignore_errors=True)


def run_mount(mountpoint: str, meta_address: str, config: Config, *, options=None,
              cache_dir: str | None = None, entry_timeout: float = 1.0,
              attr_timeout: float = 1.0, on_ready=None) -> None:
    """Mount the cluster at ``mountpoint`` and serve until unmounted or signalled."""
    opts = mount_options(options, meta_address)
    trio.run(_serve, os.path.abspath(mountpoint), meta_address, config, opts,
             cache_dir or default_cache_dir(), entry_timeout, attr_timeout, on_ready)


__all__ = ["run_mount", "mount_options", "default_cache_dir"]
