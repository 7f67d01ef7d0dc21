"""What the benchmarks share: ``BenchFailed`` (a wrong result is a failure, never a
figure), the nearest-rank percentile, incompressible payloads, size and rate units, the
folder of the local-disk baseline and the loopback MooseFS peer.

Concurrency contract: plain functions; ``MooseFSPeer`` belongs to the thread that made it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from fs.config import default_home

from ..common import SOURCE_TREE
from ..formatting import UsageError, human_size
from ..progress import StatusLine

CHUNK = 8 << 20
MB = 1_000_000


QUIET_BUSY = 0.15     # share of all cores in use below which the machine counts as quiet
QUIET_WINDOW = 1.0    # seconds of each sample


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_quiet(status: StatusLine, timeout: float = 60.0) -> float:
    """Wait until the machine is quiet: two samples in a row with under ``QUIET_BUSY`` of
    its cores busy, at most ``timeout`` seconds. A peer's background work (MooseFS's
    chunk servers deleting what the last step removed, a compaction) otherwise lands in
    the next path's timings. Returns the share busy in the last sample (above the limit
    when the wait gave up, which is shown)."""
    deadline = time.monotonic() + timeout
    quiet_in_a_row = 0
    busy_share = 0.0
    shown = False
    while True:
        busy0, total0 = _cpu_ticks()
        time.sleep(QUIET_WINDOW)
        busy1, total1 = _cpu_ticks()
        busy_share = (busy1 - busy0) / max(1, total1 - total0)
        quiet_in_a_row = quiet_in_a_row + 1 if busy_share < QUIET_BUSY else 0
        if quiet_in_a_row >= 2:
            return busy_share
        if time.monotonic() >= deadline:
            status(f"the machine is still busy ({busy_share:.0%} of its cores) after "
                   f"{timeout:g} s: going on")
            return busy_share
        if not shown and not quiet_in_a_row:
            status(f"waiting for a quiet machine ({busy_share:.0%} of its cores busy) ...")
            shown = True


class BenchFailed(Exception):
    """A benchmark produced a wrong result (short read, checksum mismatch, incomplete copy,
    wrong entry count): reported as that path's failure, never as a figure."""


def percentile(values, q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def payload(size: int = CHUNK) -> bytes:
    """One chunk of incompressible bytes, reused for every write (the content is irrelevant,
    only that no layer can compress it)."""
    return os.urandom(size)


def size_label(n: int) -> str:
    """``64 MiB``: binary units spelled out, since the rates are decimal MB/s."""
    text = human_size(n)
    return text + "iB" if text[-1].isalpha() else text + " B"


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else float("inf")


def add_output_options(q) -> None:
    """The options of a benchmark that writes its files into the cluster: ``--json``,
    ``--quiet``, ``--dir`` and ``--keep``."""
    q.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.add_argument("--dir", default="/.leasefs-bench", help="cluster folder for bench files")
    q.add_argument("--keep", action="store_true", help="keep the files written")


def embedded_state(meta: str) -> dict | None:
    """The embedded cluster's recorded state (``cluster.json``) when ``meta`` is its
    metadata server; None otherwise."""
    try:
        with open(os.path.join(default_home(), "cluster.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("meta_address") == meta else None


def baseline_dir(home: str | None) -> str:
    """An existing folder on the filesystem that holds the cluster home."""
    path = os.path.abspath(home or default_home())
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


class MooseFSPeer:
    """The loopback MooseFS peer: its mount, started by us only if it was not up."""

    def __init__(self, script: str | None, status: StatusLine):
        self.up_script = os.path.abspath(script or os.path.join(SOURCE_TREE, "..", "shared",
                                                                "peers", "moosefs-up.sh"))
        self.down_script = os.path.join(os.path.dirname(self.up_script), "moosefs-down.sh")
        self.mount = os.path.join(os.environ.get("MFS_BASE", "/tmp/moosefs-peer"), "mnt")
        self.started_by_us = False
        self.status = status

    def mounted(self) -> bool:
        return os.path.ismount(self.mount) and os.path.isdir(os.path.join(self.mount, "g1"))

    def ensure_up(self) -> None:
        if self.mounted():
            self.status(f"MooseFS peer already mounted at {self.mount}")
            return
        if not os.path.isfile(self.up_script):
            raise UsageError(f"--moosefs: {self.up_script} not found (use --moosefs-script PATH)")
        self.status(f"starting the MooseFS peer: {self.up_script}")
        proc = subprocess.run(["bash", self.up_script], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not self.mounted():
            tail = "\n".join(proc.stdout.splitlines()[-10:])
            raise RuntimeError(f"moosefs-up.sh failed (exit {proc.returncode}):\n{tail}")
        self.started_by_us = True

    def stop_if_ours(self) -> None:
        if self.started_by_us and os.path.isfile(self.down_script):
            self.status("stopping the MooseFS peer we started")
            subprocess.run(["bash", self.down_script], stdout=subprocess.DEVNULL,
                           stderr=subprocess.STDOUT)

    def folder(self, replication: int) -> str | None:
        path = os.path.join(self.mount, f"g{replication}")
        return path if os.path.isdir(path) else None
