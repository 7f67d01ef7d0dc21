"""``leasefs bench fuse [--path DIR ...]``: one filesystem benchmark for any folder — a local
disk, the leasefs FUSE mount, a MooseFS mount — so their figures come from the same workload
in the same run and can be divided by each other.

Why: "the mount writes at 40 MB/s" means nothing alone; next to "the local disk writes at
400 MB/s on this VM right now" it does. So the workload is plain POSIX file I/O (no leasefs
client: it must run on any folder), and the FIRST path (or the ``--baseline`` one, such as
``MooseFS``) is the baseline: every figure of the other paths is also printed as a ratio to
it. Phases per path, each timed:

- ``seq-write``: ``--size`` bytes in ``--io-size`` writes, then fsync and close (all timed);
  every chunk carries its index, so a read from the wrong offset cannot pass verification;
- ``seq-read``: page cache dropped (``POSIX_FADV_DONTNEED`` after the fsync, and a reopen),
  read back; the CRC32C and length of what was read must equal what was written, else the
  run fails loudly (a benchmark that reads garbage fast is worse than none);
- ``create`` / ``stat`` / ``unlink``: ``--files`` small files, ops/s and p50/p99 latency;
- ``cp-r``: ``cp -r`` of a ``--tree-files`` tree (built once per run in a local temp dir,
  deterministic sizes 1-64 KiB), files/s and MB/s, then the copy is checked (every relative
  path and size) and removed, untimed;
- ``calls``: p50/p99 latency of each single syscall on a ``--file-size`` file (open(O_CREAT),
  first write, close, stat, open, read, rename, mkdir, rmdir, unlink; calls.py).

``--phase`` picks some (repeatable). Whole applications (tar, git, sqlite, rm -rf) are
``leasefs bench apps`` (apps.py), which shares this module's path handling.

Each path gets a private work folder ``.leasefs-bench-<pid>-<rand>`` that is removed
afterwards, also on errors, Ctrl-C and SIGTERM. Checksum time is measured and subtracted, so
the figures are I/O time only.

Concurrency contract: a CLI process doing plain blocking file I/O on its main thread, one
path and one phase at a time (no trio: nothing here is concurrent, and a benchmark of the
filesystem should not measure a scheduler). Progress lines go to stderr, results to stdout.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import crc32c

from fs.config import default_home
from fs.errors import FileNotFound, NotDirectory, PermissionDenied

from ..common import Command
from ..formatting import UsageError, format_table, parse_size
from ..progress import StatusLine
from . import calls as benchcalls
from .base import BenchFailed, MooseFSPeer, baseline_dir, mbps, payload, percentile, size_label

log = logging.getLogger(__name__)

PHASES = ("seq-write", "seq-read", "create", "stat", "unlink", "cp-r", "calls", "patch")
#: what runs without ``--phase`` (``patch`` writes 364 MiB: asked for by name)
DEFAULT_PHASES = PHASES[:-1]
OP_PHASES = ("create", "stat", "unlink")
WORK_PREFIX = ".leasefs-bench-"
TREE_SEED = 20240601
FILES_PER_DIR = 100
TREE_MIN_FILE, TREE_MAX_FILE = 1 << 10, 64 << 10
REPORT_EVERY = 2.0  # seconds between progress lines inside a long phase
STAMP = 8           # bytes of chunk index written at the start of every seq-write chunk

# (phase, metric key, unit shown in the table)
TABLE_ROWS = (
    ("seq-write", "mbps", "MB/s"),
    ("seq-read", "mbps", "MB/s"),
    *((op, key, unit) for op in OP_PHASES
      for key, unit in (("ops_per_s", "ops/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"))),
    ("cp-r", "files_per_s", "files/s"),
    ("cp-r", "mbps", "MB/s"),
    *(("calls", f"{c.key}_{stat}", f"{c.label} {stat[:3]} ms") for c in benchcalls.CALLS
      for stat, _ in benchcalls.STATS),
    ("patch", "pwrite4k_fsync_p50_ms", "4 KiB pwrite+fsync p50 ms"),
    ("patch", "pwrite4k_fsync_p99_ms", "4 KiB pwrite+fsync p99 ms"),
    ("patch", "mid1m_fsync_ms", "1 MiB in 300 MiB +fsync ms"),
)
#: the ``patch`` phase: random 4 KiB pwrite + fsync in a file of PATCH_FILE bytes, and a
#: 1 MiB pwrite + fsync in the middle of a file of PATCH_BIG bytes (median of PATCH_BIG_N)
PATCH_FILE = 64 << 20
PATCH_OPS = 200
PATCH_BIG = 300 << 20
PATCH_BIG_N = 5
COUNT_KEYS = frozenset({"bytes", "ops", "files", "calls", "entries", "rows", "transactions"})


@dataclass
class Target:
    """One folder to benchmark: how it is labelled in the table and where it really is."""
    label: str
    path: str
    fstype: str = "?"
    work: str | None = None
    results: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    error: str | None = None


@dataclass
class Params:
    size: int
    io_size: int
    files: int
    file_size: int
    tree_files: int
    calls: int = 200
    phases: tuple = DEFAULT_PHASES


@dataclass
class Tree:
    """The cp -r source: where it is and what a correct copy must contain."""
    root: str
    sizes: dict  # relative path -> bytes
    dirs: int

    @property
    def files(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes.values())


# --------------------------------------------------------------------------- filesystem facts

def _unescape_mount(text: str) -> str:
    """/proc/self/mounts escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (``ext4``, ``fuse.leasefs``, ...)."""
    real = os.path.realpath(path)
    best, best_type = "", "?"
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = _unescape_mount(fields[1])
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, best_type = point, fields[2]
    except OSError:
        pass
    return best_type


def _live_fuse_mount(path: str | None) -> str | None:
    """``path`` (real) if it is an answering FUSE mount point, else None."""
    from ..cluster.processes import mounted_fuse

    if not path:
        return None
    real = os.path.realpath(path)
    if not mounted_fuse(real):
        return None
    try:
        os.stat(real)  # ENOTCONN when the mount daemon is gone
    except OSError:
        return None
    return real


def leasefs_mount() -> str | None:
    """The leasefs mount to benchmark by default: ``./mnt`` (what ``make up`` mounts) or the
    mount point ``leasefs cluster up --mount`` remembered in the cluster home."""
    found = _live_fuse_mount(os.path.join(os.getcwd(), "mnt"))
    if found:
        return found
    from ..cluster.processes import Layout, load_state

    try:
        state = load_state(Layout(default_home())) or {}
    except Exception:  # an unreadable state file only means "no remembered mount"
        log.debug("cluster state unreadable", exc_info=True)
        return None
    return _live_fuse_mount(state.get("mount"))


def check_folder(path: str) -> str:
    """The absolute folder, or an error naming it (before anything is written)."""
    if not os.path.exists(path):
        raise FileNotFound(f"{path}: no such file or directory")
    if not os.path.isdir(path):
        raise NotDirectory(f"{path}: not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionDenied(f"{path}: not writable")
    return os.path.abspath(path)


def make_work_dir(root: str) -> str:
    """A fresh private folder ``.leasefs-bench-<pid>-<rand>`` inside ``root``."""
    path = os.path.join(root, f"{WORK_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(path, 0o700)
    return path


def remove_tree(path: str) -> str | None:
    """Remove a folder we created; the error text if something of it is left."""
    errors = []
    shutil.rmtree(path, onerror=lambda fn, p, info: errors.append(f"{p}: {info[1]}"))
    if os.path.lexists(path):
        return errors[0] if errors else "still exists"
    return None


def run_on_targets(cmd: Command, targets, run, failures: tuple) -> None:
    """``run(target)`` in a fresh work folder (``target.work``) of each target, in order:
    a failure of one of ``failures`` is reported against that target's path and the others
    go on; the work folder is removed either way."""
    for t in targets:
        try:
            t.work = make_work_dir(t.path)
            t.results = run(t)
        except failures as exc:
            t.error = str(exc)
            cmd.fail(t.path, exc)
        finally:
            if t.work:
                problem = remove_tree(t.work)
                if problem:
                    cmd.warn(f"{t.path}: could not remove {t.work}: {problem}")


# --------------------------------------------------------------------------- sequential

def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _drop_cache(fd: int) -> None:
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):  # advisory only; the reopen still goes to FUSE
        pass


def seq_write(path: str, size: int, io_size: int, status=None) -> tuple[dict, int]:
    """Write ``size`` incompressible bytes to a new file, fsync, close. Returns the result
    and the CRC32C of what was written (checksum time is not counted)."""
    status = status or (lambda text: None)
    chunk = bytearray(payload(min(io_size, size)))
    view = memoryview(chunk)
    crc = 0
    hashing = 0.0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        start = last = time.perf_counter()
        done = index = 0
        while done < size:
            n = min(io_size, size - done)
            stamp = index.to_bytes(8, "little")[: min(STAMP, n)]
            chunk[: len(stamp)] = stamp
            _write_all(fd, view[:n])
            h0 = time.perf_counter()
            crc = crc32c.crc32c(view[:n], crc)
            now = time.perf_counter()
            hashing += now - h0
            done += n
            index += 1
            if now - last >= REPORT_EVERY:
                status(f"  wrote {size_label(done)} of {size_label(size)}")
                last = now
        os.fsync(fd)
        synced = time.perf_counter()
        _drop_cache(fd)  # untimed: the read phase must not be served from this cache
        closing = time.perf_counter()
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    seconds = (synced - start - hashing) + (time.perf_counter() - closing)
    return {"bytes": size, "seconds": seconds, "mbps": mbps(size, seconds)}, crc


def seq_read(path: str, size: int, io_size: int, expected_crc: int, status=None) -> dict:
    """Read the file back with a cold cache; raise ``BenchFailed`` unless exactly ``size``
    bytes with CRC32C ``expected_crc`` came back."""
    status = status or (lambda text: None)
    buf = bytearray(io_size)
    view = memoryview(buf)
    crc = 0
    hashing = 0.0
    total = 0
    with open(path, "rb", buffering=0) as fh:
        _drop_cache(fh.fileno())
        start = last = time.perf_counter()
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h0 = time.perf_counter()
            crc = crc32c.crc32c(view[:n], crc)
            now = time.perf_counter()
            hashing += now - h0
            total += n
            if now - last >= REPORT_EVERY:
                status(f"  read {size_label(total)} of {size_label(size)}")
                last = now
        seconds = time.perf_counter() - start - hashing
    if total != size:
        raise BenchFailed(f"read back {total} bytes of the {size} written")
    if crc != expected_crc:
        raise BenchFailed(f"read back {size} bytes but their CRC32C {crc:08x} differs from "
                          f"the {expected_crc:08x} written: the filesystem returned wrong data")
    return {"bytes": total, "seconds": seconds, "mbps": mbps(total, seconds)}


# --------------------------------------------------------------------------- small files

def _op_result(latencies: list[float], wall: float) -> dict:
    return {"ops": len(latencies), "seconds": wall,
            "ops_per_s": len(latencies) / wall if wall > 0 else float("inf"),
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000}


def _timed_loop(names, op, label: str, status) -> dict:
    latencies = []
    start = last = time.perf_counter()
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        op(name)
        now = time.perf_counter()
        latencies.append(now - t0)
        if now - last >= REPORT_EVERY:
            status(f"  {label} {i + 1} of {len(names)}")
            last = now
    return _op_result(latencies, time.perf_counter() - start)


def _filled(path: str, size: int) -> None:
    """``path`` with ``size`` bytes of payload, fsynced and closed (untimed setup)."""
    chunk = payload(4 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for pos in range(0, size, len(chunk)):
            _write_all(fd, memoryview(chunk)[:size - pos])
        os.fsync(fd)
    finally:
        os.close(fd)


def patch_writes(folder: str, status=None) -> dict:
    """Writes inside existing files, each made durable: ``PATCH_OPS`` random 4 KiB
    ``pwrite`` + ``fsync`` in a ``PATCH_FILE`` file opened read-write (a database page),
    then ``PATCH_BIG_N`` times a 1 MiB ``pwrite`` + ``fsync`` in the middle of a
    ``PATCH_BIG`` file; each file read back at the end to check what was written."""
    status = status or (lambda _m: None)
    rng = random.Random(TREE_SEED)
    small, big = os.path.join(folder, "pages.bin"), os.path.join(folder, "big.bin")
    _filled(small, PATCH_FILE)
    expected: dict[int, bytes] = {}
    latencies = []
    fd = os.open(small, os.O_RDWR)
    try:
        for i in range(PATCH_OPS):
            offset = rng.randrange(PATCH_FILE // 4096) * 4096
            page = rng.randbytes(4096)
            t0 = time.perf_counter()
            os.pwrite(fd, page, offset)
            os.fsync(fd)
            latencies.append(time.perf_counter() - t0)
            expected[offset] = page
            if i % 50 == 49:
                status(f"  pwrite+fsync {i + 1} of {PATCH_OPS}")
    finally:
        os.close(fd)
    _check_pages(small, expected)
    _filled(big, PATCH_BIG)
    bigs = []
    fd = os.open(big, os.O_RDWR)
    try:
        for i in range(PATCH_BIG_N):
            data = rng.randbytes(1 << 20)
            offset = PATCH_BIG // 2 + i * (1 << 20)
            t0 = time.perf_counter()
            os.pwrite(fd, data, offset)
            os.fsync(fd)
            bigs.append(time.perf_counter() - t0)
            expected_big = (offset, data)
    finally:
        os.close(fd)
    _check_pages(big, {expected_big[0]: expected_big[1]})
    os.unlink(small)
    os.unlink(big)
    return {"ops": len(latencies),
            "pwrite4k_fsync_p50_ms": percentile(latencies, 50) * 1000,
            "pwrite4k_fsync_p99_ms": percentile(latencies, 99) * 1000,
            "mid1m_fsync_ms": statistics.median(bigs) * 1000}


def _check_pages(path: str, expected: dict) -> None:
    with open(path, "rb") as f:
        for offset, data in expected.items():
            f.seek(offset)
            if f.read(len(data)) != data:
                raise BenchFailed(f"{path}: the bytes written at {offset} did not read back")


def small_file_names(folder: str, n: int) -> list[str]:
    return [os.path.join(folder, f"f{i:06d}") for i in range(n)]


def create_files(names, file_size: int, status=None) -> dict:
    """open(O_CREAT|O_WRONLY) + write ``file_size`` bytes + close, per file."""
    data = memoryview(payload(file_size)) if file_size else memoryview(b"")

    def create(name):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    return _timed_loop(names, create, "created", status or (lambda text: None))


def stat_files(names, file_size: int, status=None) -> dict:
    wrong = []

    def stat(name):
        st = os.stat(name)
        if st.st_size != file_size:
            wrong.append((name, st.st_size))

    result = _timed_loop(names, stat, "stat", status or (lambda text: None))
    if wrong:
        name, got = wrong[0]
        raise BenchFailed(f"stat: {len(wrong)} files have the wrong size "
                          f"(e.g. {os.path.basename(name)}: {got} bytes, wrote {file_size})")
    return result


def unlink_files(names, status=None) -> dict:
    result = _timed_loop(names, os.unlink, "unlinked", status or (lambda text: None))
    left = [n for n in names if os.path.lexists(n)]
    if left:
        raise BenchFailed(f"unlink: {len(left)} files still exist afterwards")
    return result


# --------------------------------------------------------------------------- cp -r

def build_tree(root: str, n_files: int, seed: int = TREE_SEED) -> Tree:
    """``n_files`` files of 1-64 KiB over ``ceil(n/100)`` folders, nested in groups of ten
    (``part0/d000/f00000.bin``); sizes and bytes are fixed by ``seed``."""
    rng = random.Random(seed)
    pool = rng.randbytes((1 << 20) + TREE_MAX_FILE)
    dirs = max(1, math.ceil(n_files / FILES_PER_DIR))
    sizes = {}
    for i in range(n_files):
        d = i * dirs // n_files
        rel = os.path.join(f"part{d // 10}", f"d{d:03d}", f"f{i:05d}.bin")
        size = rng.randint(TREE_MIN_FILE, TREE_MAX_FILE)
        offset = rng.randrange(1 << 20)
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(pool[offset:offset + size])
        sizes[rel] = size
    return Tree(root=root, sizes=sizes, dirs=dirs)


def tree_sizes(root: str) -> dict:
    """relative path -> size of every regular file under ``root``."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = os.lstat(path).st_size
    return found


def copy_tree(tree: Tree, dest: str, status=None) -> dict:
    """Timed ``cp -r SRC DEST``; then (untimed) check the copy and remove it."""
    status = status or (lambda text: None)
    start = time.perf_counter()
    proc = subprocess.run(["cp", "-r", "--", tree.root, dest], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        lines = proc.stdout.strip().splitlines()
        raise BenchFailed(f"cp -r failed (exit {proc.returncode}): "
                          f"{lines[-1] if lines else 'no output'}")
    status("  verifying the copy ...")
    copied = tree_sizes(dest)
    if copied != tree.sizes:
        missing = len(set(tree.sizes) - set(copied))
        wrong = sum(1 for k, v in copied.items() if k in tree.sizes and tree.sizes[k] != v)
        raise BenchFailed(f"cp -r copied {len(copied)} files ({sum(copied.values())} bytes), "
                          f"expected {tree.files} ({tree.total} bytes): {missing} missing, "
                          f"{wrong} with the wrong size")
    problem = remove_tree(dest)
    if problem:
        raise BenchFailed(f"removing the copy failed: {problem}")
    return {"files": tree.files, "bytes": tree.total, "seconds": seconds,
            "files_per_s": tree.files / seconds if seconds > 0 else float("inf"),
            "mbps": mbps(tree.total, seconds)}


# --------------------------------------------------------------------------- one path

def bench_path(work: str, params: Params, tree: Tree, status, label: str) -> dict:
    """All phases in the work folder ``work``; returns phase -> figures."""
    results = {}
    wanted = set(params.phases)
    if wanted & {"seq-write", "seq-read"}:
        big = os.path.join(work, "seq.bin")
        status(f"{label}: seq-write {size_label(params.size)} in {size_label(params.io_size)} "
               f"writes + fsync ...")
        written, crc = seq_write(big, params.size, params.io_size, status)
        if "seq-write" in wanted:
            results["seq-write"] = written
            status(f"{label}: seq-write {written['mbps']:.1f} MB/s")
        if "seq-read" in wanted:
            status(f"{label}: seq-read ...")
            results["seq-read"] = seq_read(big, params.size, params.io_size, crc, status)
            status(f"{label}: seq-read {results['seq-read']['mbps']:.1f} MB/s (checksum ok)")
        os.unlink(big)
    if wanted & set(OP_PHASES):
        # stat and unlink need the files create makes: create runs (and is reported) for them
        small = os.path.join(work, "small")
        os.mkdir(small)
        names = small_file_names(small, params.files)
        status(f"{label}: create {params.files} files of {size_label(params.file_size)} ...")
        results["create"] = create_files(names, params.file_size, status)
        if "stat" in wanted:
            status(f"{label}: stat {params.files} files ...")
            results["stat"] = stat_files(names, params.file_size, status)
        status(f"{label}: unlink {params.files} files ...")
        unlinked = unlink_files(names, status)
        if "unlink" in wanted:
            results["unlink"] = unlinked
        os.rmdir(small)
    if "cp-r" in wanted:
        status(f"{label}: cp-r {tree.files} files ({size_label(tree.total)}) ...")
        results["cp-r"] = copy_tree(tree, os.path.join(work, "tree"), status)
        status(f"{label}: cp-r {results['cp-r']['files_per_s']:.0f} files/s, "
               f"{results['cp-r']['mbps']:.1f} MB/s")
    if "calls" in wanted:
        folder = os.path.join(work, "calls")
        os.mkdir(folder)
        status(f"{label}: calls: single syscalls on {params.calls} files of "
               f"{size_label(params.file_size)} ...")
        results["calls"] = benchcalls.measure_calls(folder, params.calls, params.file_size,
                                                    status)
        os.rmdir(folder)
        status(f"{label}: calls: open(O_CREAT) p50 "
               f"{fmt_figure(results['calls']['open_creat_p50_ms'])} ms, first write "
               f"{fmt_figure(results['calls']['write_first_p50_ms'])} ms")
    if "patch" in wanted:
        folder = os.path.join(work, "patch")
        os.mkdir(folder)
        status(f"{label}: patch: {PATCH_OPS} random 4 KiB pwrite+fsync in "
               f"{size_label(PATCH_FILE)}, 1 MiB in the middle of {size_label(PATCH_BIG)} ...")
        results["patch"] = patch_writes(folder, status)
        os.rmdir(folder)
        status(f"{label}: patch: 4 KiB pwrite+fsync p50 "
               f"{fmt_figure(results['patch']['pwrite4k_fsync_p50_ms'])} ms, 1 MiB "
               f"{fmt_figure(results['patch']['mid1m_fsync_ms'])} ms")
    return results


def ratios(results: dict, baseline: dict) -> dict:
    """phase -> metric -> this figure / the baseline's (None where undefined)."""
    out = {}
    for phase, figures in results.items():
        base = baseline.get(phase, {})
        out[phase] = {}
        for key, value in figures.items():
            if key in COUNT_KEYS:
                continue
            b = base.get(key)
            out[phase][key] = value / b if b and math.isfinite(b) and math.isfinite(value) \
                else None
    return out


# --------------------------------------------------------------------------- command

@contextmanager
def sigterm_as_interrupt():
    """SIGTERM unwinds like Ctrl-C, so the work folders are removed either way."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (called from a test): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _params(a) -> Params:
    phases = tuple(ph for ph in PHASES if ph in (a.phase or DEFAULT_PHASES))
    p = Params(size=parse_size(a.size), io_size=parse_size(a.io_size), files=a.files,
               file_size=parse_size(a.file_size), tree_files=a.tree_files, calls=a.calls,
               phases=phases)
    if p.size <= 0 or p.io_size <= 0:
        raise UsageError("--size and --io-size must be positive")
    if p.files < 1 or p.tree_files < 1 or p.calls < 1:
        raise UsageError("--files, --tree-files and --calls must be at least 1")
    return p


@dataclass
class Peers:
    """What a run starts besides the folders it was given: the MooseFS peer, the in-memory
    floor filesystem (``--floor``)."""
    moosefs: MooseFSPeer | None = None
    floor: object | None = None   # fusefloor.FloorMount (imported when asked for: pyfuse3)

    def stop_if_ours(self) -> None:
        if self.floor is not None:
            self.floor.stop()
        if self.moosefs is not None:
            self.moosefs.stop_if_ours()


def targets_from_args(a, status) -> tuple[list[Target], Peers | None]:
    targets = []
    if a.path:
        for given in a.path:
            targets.append(Target(label=given.rstrip("/") or "/", path=check_folder(given)))
    else:
        targets.append(Target(label="local", path=baseline_dir(None)))
        mount = leasefs_mount()
        if mount:
            targets.append(Target(label="leasefs", path=mount))
    peer = None
    if a.moosefs or a.floor:
        floor = None
        if a.floor:
            from .fusefloor import FloorMount
            floor = FloorMount(status)
        peer = Peers(MooseFSPeer(a.moosefs_script, status) if a.moosefs else None, floor)
    seen = {}
    for t in targets:  # two --path of the same folder still need two columns
        seen[t.label] = seen.get(t.label, 0) + 1
        if seen[t.label] > 1:
            t.label += f"#{seen[t.label]}"
    return targets, peer


def finish_targets(targets: list[Target], peer: Peers | None,
                   baseline: str | None) -> list[Target]:
    """The targets to run: plus the MooseFS peer's g3/ folder (starting the peer if need be),
    each with its filesystem type, the ``--baseline`` one (a label or a path) first."""
    if peer and peer.moosefs:
        peer.moosefs.ensure_up()
        folder = peer.moosefs.folder(3)
        if folder is None:
            raise UsageError(f"--moosefs: {peer.moosefs.mount}/g3 not found")
        targets.append(Target(label="MooseFS", path=folder))
    if peer and peer.floor:
        targets.append(Target(label="floor", path=peer.floor.start()))
    for t in targets:
        t.fstype = fs_type(t.path)
    if baseline:
        real = os.path.realpath(baseline)
        chosen = [t for t in targets if t.label == baseline or t.path == real]
        if not chosen:
            raise UsageError(f"--baseline {baseline}: not one of the paths benchmarked "
                             f"({', '.join(t.label for t in targets)})")
        targets = [chosen[0]] + [t for t in targets if t is not chosen[0]]
    return targets


def add_path_options(q) -> None:
    """--path, --baseline, --moosefs: how ``bench fuse`` and ``bench apps`` pick folders."""
    q.add_argument("--path", action="append", default=None, metavar="DIR",
                   help="folder to benchmark (repeatable; default: a local folder on the "
                        "filesystem of the cluster home, plus the leasefs mount if mounted)")
    q.add_argument("--baseline", default=None, metavar="LABEL|DIR",
                   help="the path the ratio columns divide by: a --path, 'MooseFS', or "
                        "'local'/'leasefs' without --path (default: the first)")
    q.add_argument("--moosefs", action="store_true",
                   help="also the MooseFS peer's g3/ folder (started if needed, and then "
                        "stopped only if this run started it)")
    q.add_argument("--moosefs-script", default=None, metavar="PATH",
                   help="moosefs-up.sh to start the peer (default ../shared/peers/)")
    q.add_argument("--floor", action="store_true",
                   help="also an in-memory pyfuse3 + trio filesystem mounted for the run "
                        "(fusefloor.py): what any Python FUSE mount costs per request, the "
                        "floor under leasefs's mount")


def fmt_figure(value) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def run_fuse_bench(cmd: Command) -> int:
    a = cmd.args
    params = _params(a)
    status = StatusLine(enabled=not a.quiet)
    targets, peer = targets_from_args(a, status)
    tree_home = None
    tree = None
    with sigterm_as_interrupt():
        try:
            targets = finish_targets(targets, peer, a.baseline)
            if "cp-r" in params.phases:
                tree_home = tempfile.mkdtemp(prefix=WORK_PREFIX + "tree-")
                status(f"building the cp -r source: {params.tree_files} files in "
                       f"{tree_home} ...")
                tree = build_tree(os.path.join(tree_home, "src"), params.tree_files)
                status(f"  {tree.files} files in {tree.dirs} folders, {size_label(tree.total)}")
            run_on_targets(cmd, targets,
                           lambda t: bench_path(t.work, params, tree, status, t.label),
                           (OSError, BenchFailed, subprocess.SubprocessError))
        finally:
            if tree_home:
                remove_tree(tree_home)
            if peer:
                peer.stop_if_ours()
    _print_results(cmd, params, tree, targets)
    return cmd.status


def _print_results(cmd: Command, params: Params, tree: Tree | None,
                   targets: list[Target]) -> None:
    base = targets[0]
    for t in targets:
        t.ratios = ratios(t.results, base.results) if t is not base else {}
    if cmd.args.json:
        cmd.out(json.dumps({
            "benchmark": "fuse",
            "params": {"size": params.size, "io_size": params.io_size, "files": params.files,
                       "file_size": params.file_size, "tree_files": params.tree_files,
                       "calls": params.calls, "phases": list(params.phases)},
            "tree": {"files": tree.files, "dirs": tree.dirs, "bytes": tree.total} if tree
            else None,
            "baseline": base.label,
            "paths": [{"label": t.label, "path": t.path, "fstype": t.fstype,
                       "baseline": t is base, "error": t.error, "results": t.results,
                       "ratios": t.ratios} for t in targets],
        }, indent=2))
        return
    if all(t.error for t in targets):
        return
    what = []
    if {"seq-write", "seq-read"} & set(params.phases):
        what.append(f"{size_label(params.size)} sequential in {size_label(params.io_size)} I/Os")
    if set(OP_PHASES) & set(params.phases):
        what.append(f"{params.files} files of {size_label(params.file_size)}")
    if tree:
        what.append(f"cp -r of {tree.files} files in {tree.dirs} "
                    f"folder{'s' if tree.dirs != 1 else ''} ({size_label(tree.total)})")
    if "calls" in params.phases:
        what.append(f"single calls on {params.calls} files of {size_label(params.file_size)}")
    cmd.out(f"bench fuse: {'; '.join(what)}")
    width = max(len(t.label) for t in targets)
    for t in targets:
        where = f"{t.label:<{width}}" + (f"  {t.path}" if t.path != t.label else "")
        note = " (baseline)" if t is base else ""
        note += f"  FAILED: {t.error}" if t.error else ""
        cmd.out(f"  {where}  [{t.fstype}]{note}")
    others = targets[1:]
    headers = ["phase", "metric", *(t.label for t in targets),
               *(f"{t.label} ratio" for t in others)]
    rows = []
    size = size_label(params.file_size)
    for phase, key, unit in TABLE_ROWS:
        if not any(key in t.results.get(phase, {}) for t in targets):
            continue  # a phase not run, or failed on every path
        row = [phase, unit.format(size=size)]
        row += [fmt_figure(t.results.get(phase, {}).get(key)) for t in targets]
        row += [fmt_figure(t.ratios.get(phase, {}).get(key)) for t in others]
        rows.append(row)
    for line in format_table(headers, rows, align="<<" + ">" * (len(headers) - 2)):
        cmd.out(line)
    if others:
        cmd.out(f"ratio = figure / the baseline's ({base.label}): for rates above 1 is faster, "
                f"for latencies above 1 is slower")
    cmd.out("MB/s = 10^6 bytes per second; p50/p99 = median and 99th percentile latency")


# --------------------------------------------------------------------------- parser

def register(bsub, common) -> None:
    """The ``fuse`` subcommand under ``leasefs bench``."""
    q = bsub.add_parser("fuse", parents=[common],
                        help="POSIX filesystem benchmark of any folders (local, mount, MooseFS)",
                        description="Sequential write+fsync and read, create/stat/unlink of "
                                    "small files, cp -r of a file tree and single-syscall "
                                    "latencies, in each --path; the first path is the "
                                    "baseline of the ratio columns.")
    add_path_options(q)
    q.add_argument("--size", default="1G", help="sequential file size (default 1G)")
    q.add_argument("--io-size", default="1M", help="bytes per read/write call (default 1M)")
    q.add_argument("--files", type=int, default=1000,
                   help="small files for create/stat/unlink (default 1000)")
    q.add_argument("--file-size", default="4K", help="bytes per small file (default 4K)")
    q.add_argument("--tree-files", type=int, default=2000,
                   help="files in the cp -r tree (default 2000, 100 per folder)")
    q.add_argument("--calls", type=int, default=200,
                   help="files (and folders) of the calls phase (default 200)")
    q.add_argument("--phase", action="append", choices=PHASES, default=None,
                   help="run only this phase (repeatable; stat and unlink also run create; "
                        "patch, writes inside existing files, runs only when named)")
    q.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=run_fuse_bench)
