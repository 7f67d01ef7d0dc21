"""The ``calls`` phase of ``leasefs bench fuse``: the latency of single syscalls on one small
file, each timed on its own, so a slow application run can be traced to the call that costs.

Why: ``cp``, ``tar``, ``git`` and ``rsync`` touch one file at a time, so per-call latency, not
throughput, decides their speed; and the create phase's "open + write + close" figure does
not say which of the three is slow (on a FUSE mount the first write may set up a pipeline,
close may wait for acknowledgements). Per file, in this order and in passes over ``n`` files
so every call of a kind sees the same state of its folder:

1. ``open(O_CREAT|O_EXCL|O_WRONLY)``, the first ``write`` of ``size`` bytes, ``close``;
2. ``stat`` (the size must be the one written);
3. ``open(O_RDONLY)``, ``read`` of ``size`` bytes (must equal what was written), ``close``;
4. ``rename`` to a new name in the same folder;
5. ``mkdir`` and then ``rmdir`` of ``n`` folders;
6. ``unlink`` of the renamed files (the folder must then be empty).

Reads come after a plain close, with no cache dropping: that is what a ``git add`` after a
``tar -xf`` sees, and whether the page cache survives a close is the filesystem's choice.
Each call is timed with ``perf_counter_ns`` around the bare ``os`` function; Python's cyclic
garbage collector is off during the passes so its pauses do not land in the p99. A wrong
size, wrong bytes or a file left behind raises ``BenchFailed``: a broken filesystem must not
look fast.

Concurrency contract: plain blocking calls on the caller's thread, one folder, no sharing.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

from .base import BenchFailed, percentile


@dataclass(frozen=True)
class Call:
    key: str     # results key prefix, e.g. ``open_creat`` -> ``open_creat_p50_ms``
    label: str   # table label; ``{size}`` is replaced by the file size


CALLS = (
    Call("open_creat", "open(O_CREAT)"),
    Call("write_first", "first write {size}"),
    Call("close_write", "close (written)"),
    Call("stat", "stat"),
    Call("open_read", "open(O_RDONLY)"),
    Call("read", "read {size}"),
    Call("close_read", "close (read)"),
    Call("rename", "rename"),
    Call("mkdir", "mkdir"),
    Call("rmdir", "rmdir"),
    Call("unlink", "unlink"),
)
STATS = (("p50_ms", 50), ("p99_ms", 99))


def result_keys() -> list[str]:
    """Every figure key of the phase's result, in table order."""
    return [f"{c.key}_{name}" for c in CALLS for name, _ in STATS]


def measure_calls(folder: str, n: int, size: int, status=None) -> dict:
    """Run the passes in ``folder`` (which must be empty and is left empty); returns
    ``{"calls": n, "<call>_p50_ms": ..., "<call>_p99_ms": ..., "seconds": ...}``."""
    status = status or (lambda text: None)
    data = os.urandom(size)
    times: dict[str, list[int]] = {c.key: [] for c in CALLS}
    names = [os.path.join(folder, f"c{i:06d}") for i in range(n)]
    moved = [os.path.join(folder, f"r{i:06d}") for i in range(n)]
    dirs = [os.path.join(folder, f"d{i:06d}") for i in range(n)]
    clock = time.perf_counter_ns

    def timed(key, fn, *args):
        t0 = clock()
        out = fn(*args)
        times[key].append(clock() - t0)
        return out

    gc_was_on = gc.isenabled()
    gc.disable()
    start = time.perf_counter()
    try:
        status(f"  open(O_CREAT) + write + close of {n} files ...")
        for name in names:
            fd = timed("open_creat", os.open, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                written = timed("write_first", os.write, fd, data)
            finally:
                timed("close_write", os.close, fd)
            if written != size:
                raise BenchFailed(f"{name}: the first write took {written} of {size} bytes")
        status(f"  stat of {n} files ...")
        for name in names:
            got = timed("stat", os.stat, name).st_size
            if got != size:
                raise BenchFailed(f"{name}: stat says {got} bytes, {size} were written")
        status(f"  open + read + close of {n} files ...")
        for name in names:
            fd = timed("open_read", os.open, name, os.O_RDONLY)
            try:
                back = timed("read", os.read, fd, size)
            finally:
                timed("close_read", os.close, fd)
            if back != data:
                raise BenchFailed(f"{name}: read back {len(back)} bytes that differ from the "
                                  f"{size} written" if len(back) == size else
                                  f"{name}: read back {len(back)} of the {size} bytes written")
        status(f"  rename of {n} files, mkdir + rmdir of {n} folders ...")
        for old, new in zip(names, moved):
            timed("rename", os.rename, old, new)
        for d in dirs:
            timed("mkdir", os.mkdir, d)
        for d in dirs:
            timed("rmdir", os.rmdir, d)
        listed = sorted(os.listdir(folder))
        if listed != [os.path.basename(m) for m in moved]:
            raise BenchFailed(f"{folder}: after rename and rmdir it lists {len(listed)} "
                              f"entries, expected the {n} renamed files")
        status(f"  unlink of {n} files ...")
        for m in moved:
            timed("unlink", os.unlink, m)
        left = os.listdir(folder)
        if left:
            raise BenchFailed(f"{folder}: {len(left)} entries left after unlink")
    finally:
        if gc_was_on:
            gc.enable()
    out: dict = {"calls": n, "seconds": time.perf_counter() - start}
    for c in CALLS:
        for name, q in STATS:
            out[f"{c.key}_{name}"] = percentile(times[c.key], q) / 1e6
    return out
