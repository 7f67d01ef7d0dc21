"""``leasefs bench meta``: metadata throughput in the style of Hadoop's NNThroughputBenchmark.

Why: the metadata server is one Python process; what matters is how many namespace
operations per second it completes for many concurrent clients over real RPC, and what the
fine-grained path locks buy over one global lock. So by default the benchmark starts its own
private metadata servers (a fresh folder each, ``leasefs meta`` subprocesses) — one with
``namespace_lock=fine`` and one with ``namespace_lock=global`` — and runs the same workload
on both, printing the two figures and their ratio side by side. ``--cluster`` measures the
running cluster instead (its own lock mode only). ``--ha`` compares ``ha = none`` with
``ha = etcd`` (``ha.private_ha_cluster``: 3 etcd members, an active and a standby),
both with fine locks: what the replicated log costs. ``--compare REV|DIR`` runs the same
workload on a private server of another version of the code (a git revision, checked out
for the run, or a source folder) beside one of this code, rounds alternating: what a
change to the server's path buys, measured in one run.

Workload, per op in order (each a phase; the files of one phase feed the next): create
(create + complete, as NNThroughputBenchmark's create), mkdirs, getFileInfo, open
(getBlockLocations), listStatus, rename, delete. ``--clients N`` clients (one ``AsyncClient``
= one lease holder each) spread over ``--processes`` worker processes (Python clients cost
CPU too; one process would measure itself); the clients of a process share one RPC
connection (``--connections shared``, as NNThroughputBenchmark's threads share one Hadoop
IPC connection) or open one each (``own``). Each client
works in its own folder (disjoint) or, with ``--contended``, all in one folder. Per op:
ops/s (all clients' ops / wall time of the phase), p50/p99 latency, and fsyncs per op and
journal records per op, read from the server's journal counters before and after the
phase (group commit: many records per fsync). The local-disk baseline runs the same
POSIX-shaped workload on a temp folder, threads as clients; ``--moosefs`` adds the peer.

Concurrency contract: a CLI process; worker processes are started with the ``spawn``
method and synchronised per phase by a barrier passed twice (all set up → the parent reads the
journal counters → go); each runs one ``trio.run`` with one task per
client. The parent only starts/stops servers, reads counters and prints; the POSIX baseline
runs one OS thread per client (plain blocking file I/O, the GIL is released in the
syscalls). Progress lines go to stderr, results to stdout.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, contextmanager
from typing import NamedTuple

import trio

from fs.errors import sole_exception

from ..cluster.processes import cpu_seconds
from ..common import Command, SOURCE_TREE
from ..formatting import UsageError, format_table
from ..progress import StatusLine
from .base import MooseFSPeer, baseline_dir, percentile

log = logging.getLogger(__name__)

MUTATIONS = ("create", "mkdirs", "rename", "delete", "prefill")
# files per folder of the prefill phase
PREFILL_FOLDER = 10_000
LOCK_MODES = ("fine", "global")
META_OPS = ("create", "mkdirs", "getFileInfo", "open", "listStatus", "rename", "delete")


# --------------------------------------------------------------------------- POSIX baseline

class _Recorder:
    def __init__(self):
        self.latencies: dict[str, list[float]] = {op: [] for op in META_OPS}
        self.wall: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, op: str, seconds: float) -> None:
        with self.lock:
            self.latencies[op].append(seconds)


def client_folder(base: str, k: int, contended: bool) -> tuple[str, str]:
    """Folder and name prefix of meta-benchmark client ``k`` (leasefs and POSIX alike)."""
    return (f"{base}/shared", f"c{k}-") if contended else (f"{base}/c{k}", "")


def _posix_meta(root: str, args, rec: _Recorder, status: StatusLine, label: str,
                ops=META_OPS) -> None:
    """The same workload as plain POSIX calls under ``root``, from ``args.clients`` threads:
    the local-disk baseline, and the MooseFS peer through its FUSE mount."""
    base = os.path.join(root, f"leasefs-meta-bench-{os.getpid()}")
    os.makedirs(base, exist_ok=True)
    for k in range(args.clients):
        folder, _ = client_folder(base, k, args.contended)
        os.makedirs(folder, exist_ok=True)

    def one(op: str, k: int):
        folder, prefix = client_folder(base, k, args.contended)
        for i in range(args.ops):
            f = f"{folder}/{prefix}f{i}"
            t0 = time.perf_counter()
            if op == "create":
                with open(f, "xb"):
                    pass
            elif op == "mkdirs":
                os.makedirs(f"{folder}/{prefix}d{i}")
            elif op == "getFileInfo":
                os.stat(f)
            elif op == "open":
                with open(f, "rb"):
                    pass
            elif op == "listStatus":
                os.listdir(folder)
            elif op == "rename":
                os.rename(f, f"{folder}/{prefix}r{i}")
            elif op == "delete":
                os.unlink(f"{folder}/{prefix}r{i}")
            rec.add(op, time.perf_counter() - t0)

    try:
        with ThreadPoolExecutor(max_workers=args.clients) as pool:
            for op in ops:
                status(f"{label} {op}: {args.clients} clients x {args.ops} ops ...")
                t0 = time.perf_counter()
                for future in [pool.submit(one, op, k) for k in range(args.clients)]:
                    future.result()
                rec.wall[op] = time.perf_counter() - t0
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- workers

async def _worker_main(address: str, settings: dict, clients: list[int], plan: dict,
                       barrier, results) -> None:
    from fs.client import AsyncClient, meta_connection
    from fs.config import Config

    ops, n_ops, contended, base = plan["ops"], plan["n_ops"], plan["contended"], plan["base"]
    config = Config.load(env={}, **settings)
    async with AsyncExitStack() as stack:
        # "shared": the process's clients share one connection, as NNThroughputBenchmark's
        # threads share one ClientProtocol proxy (Hadoop IPC: one connection per server+user)
        rpc = (await stack.enter_async_context(meta_connection(address, config=config))
               if plan["connections"] == "shared" else None)
        conns = [await stack.enter_async_context(AsyncClient(address, config=config, rpc=rpc))
                 for _ in clients]
        for k, client in zip(clients, conns):
            await client.mkdirs(client_folder(base, k, contended)[0])

        async def run(op: str, k: int, client, out: array):
            folder, prefix = client_folder(base, k, contended)
            count = n_ops
            if op == "prefill":
                # files that only fill the namespace: a folder of their own per client, stage
                # and ``PREFILL_FOLDER`` files (no folder grows without bound)
                stage = plan["prefill"][plan["round"]] - (plan["prefill"][plan["round"] - 1]
                                                          if plan["round"] else 0)
                count = stage // plan["clients"] + (k < stage % plan["clients"])
            elif plan["round"]:
                prefix = f"{prefix}r{plan['round']}-"
            for i in range(count):
                f = f"{folder}/{prefix}f{i}"
                t0 = time.perf_counter()
                if op == "prefill":
                    stream = await client.create(
                        f"{base}/prefill/c{k}/s{plan['round']}/{i // PREFILL_FOLDER}/f{i}",
                        overwrite=False)
                    await stream.close()
                elif op == "create":
                    stream = await client.create(f, overwrite=False)
                    await stream.close()
                elif op == "mkdirs":
                    await client.mkdirs(f"{folder}/{prefix}d{i}")
                elif op == "getFileInfo":
                    await client.get_file_status(f)
                elif op == "open":
                    await client.get_block_locations(f)
                elif op == "listStatus":
                    await client.list_status(folder)
                elif op == "rename":
                    await client.rename(f, f"{folder}/{prefix}r{i}")
                elif op == "delete":
                    await client.delete(f"{folder}/{prefix}r{i}")
                out.append(time.perf_counter() - t0)

        for step, op in enumerate(ops):
            plan["round"] = ops[:step].count(op)   # a repeated op works on new names
            await trio.to_thread.run_sync(barrier.wait)   # ready: the parent reads counters
            await trio.to_thread.run_sync(barrier.wait)   # go
            latencies = array("d")
            async with trio.open_nursery() as nursery:
                for k, client in zip(clients, conns):
                    nursery.start_soon(run, op, k, client, latencies)
            results.put((op, latencies.tobytes()))


def _worker(address, settings, clients, plan, barrier, results):
    """Entry point of one worker process (spawned)."""
    logging.basicConfig(level=logging.WARNING)
    try:
        trio.run(_worker_main, address, settings, clients, plan, barrier, results)
    except BaseException as exc:   # tell the parent instead of leaving it at the barrier
        results.put(("error", f"{type(exc).__name__}: {sole_exception(exc)}"))
        barrier.abort()
        raise


# --------------------------------------------------------------------------- servers

class PrivateServer(NamedTuple):
    address: str
    pid: int


@contextmanager
def private_meta_server(home: str, lock: str, status: StatusLine, tree: str = SOURCE_TREE):
    """A fresh ``leasefs meta`` subprocess of the code in ``tree`` with
    ``namespace_lock=lock``; yields its ``PrivateServer`` (address, pid)."""
    folder = tempfile.mkdtemp(prefix=f".bench-meta-{lock}-", dir=home)
    address_file = os.path.join(folder, "address")
    log_path = os.path.join(folder, "meta.log")
    cmd = [sys.executable, "-m", "tools", "meta", "--data", os.path.join(folder, "data"),
           "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
           "--address-file", address_file, "--log-level", "WARNING",
           "--set", f"namespace_lock={lock}",
           # no block servers: metadata calls only, never held in start-up safe mode
           "--set", "safemode_min_storage=0"]
    status(f"starting a private metadata server (namespace_lock={lock}) in {folder}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (tree, os.environ.get("PYTHONPATH")) if p))
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                cwd=tree)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(address_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path, errors="replace") as fh:
                    tail = fh.read()[-2000:]
                raise UsageError(f"the private metadata server did not start "
                                 f"(exit {proc.poll()}): {tail.strip()}")
            time.sleep(0.05)
        with open(address_file) as fh:
            yield PrivateServer(fh.read().strip(), proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def other_tree(compare: str, home: str, status: StatusLine):
    """``(tree, name)``: the leasefs source to compare with. A folder holding a leasefs
    source tree is used as it is; anything else is a git revision of this checkout, made a
    detached worktree in ``home`` for the run and removed afterwards."""
    if os.path.isfile(os.path.join(compare, "tools", "__main__.py")):
        yield os.path.abspath(compare), os.path.basename(os.path.abspath(compare))
        return

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", SOURCE_TREE, *args], capture_output=True,
                                  text=True, timeout=120)
        except FileNotFoundError:
            raise UsageError(f"--compare {compare}: git is not installed") from None
        if done.returncode:
            said = " ".join((done.stderr or done.stdout).split())
            raise UsageError(f"--compare {compare}: git {args[0]}: {said[:300]}")
        return done.stdout.strip()

    sha = git("rev-parse", "--verify", "--short", f"{compare}^{{commit}}")
    folder = tempfile.mkdtemp(prefix=f".bench-meta-{sha}-", dir=home)
    status(f"checking out {compare} ({sha}) in {folder}")
    git("worktree", "add", "--detach", folder, sha)
    try:
        yield folder, sha
    finally:
        git("worktree", "remove", "--force", folder)
        shutil.rmtree(folder, ignore_errors=True)


def _median_rounds(runs: list[dict]) -> dict:
    """Each row's median round (by rate) over ``runs``, one dict of rows per round."""
    return {op: sorted((run[op] for run in runs), key=lambda row: row["ops_per_s"])
            [len(runs) // 2] for op in runs[0]}


def _journal_counters(control) -> tuple[int, int, float | None]:
    """(fsyncs, records, server CPU seconds or None from a server without the field)."""
    report = control.report()
    journal = report["journal"]
    return journal["fsyncs"], journal["records"], report.get("cpu_seconds")


def run_on_server(address: str, a, status: StatusLine, label: str,
                  processes: dict[str, list[int]] | None = None) -> dict:
    """The whole workload on one metadata server: per op ops/s, p50/p99, fsyncs/op, and
    the CPU each of ``processes`` (name → pids of this machine) and the clients spent per
    op (``cpu_us``)."""
    from fs.client import Client
    from fs.config import Config

    settings = {"rpc_timeout": 120.0}
    # one connection of the parent's for counters and cleanup, apart from the workers'
    with Client(address, config=Config.load(env={}, **settings)) as control:
        out = _run_workers(address, settings, control, a, status, label, processes or {})
        if not a.keep:
            control.delete(_base(a, label), recursive=True)
    return out


def _base(a, label: str) -> str:
    return f"{a.dir.rstrip('/')}/meta-{os.getpid()}-{label}"


def _cpu_by_name(processes: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in processes.items()}


def _run_workers(address: str, settings: dict, control, a, status: StatusLine,
                 label: str, processes: dict[str, list[int]]) -> dict:
    ops = list(a.op)
    for _ in a.prefill:   # the same ops on the empty namespace, then after each fill
        ops += ["prefill"] + list(a.op)
    n_proc = max(1, min(a.processes, a.clients))
    groups = [list(range(p, a.clients, n_proc)) for p in range(n_proc)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n_proc + 1)
    results = ctx.Queue()
    base = _base(a, label)
    plan = {"ops": ops, "n_ops": a.ops, "contended": a.contended, "base": base,
            "connections": a.connections, "prefill": a.prefill, "clients": a.clients,
            "round": 0}
    workers = [ctx.Process(target=_worker, args=(address, settings, g, plan, barrier, results),
                           daemon=True) for g in groups]
    for w in workers:
        w.start()
    processes = {**processes, "clients": [w.pid for w in workers]}
    out: dict = {}
    try:
        for step, op in enumerate(ops):
            stage = ops[:step].count("prefill")
            total = a.prefill[stage - 1] if stage else 0
            key = f"{op} @{total}" if stage and op != "prefill" else op
            if op == "prefill":
                key = f"prefill to {a.prefill[stage]}"
            count = (a.prefill[stage] - total) if op == "prefill" else f"{a.clients} x {a.ops}"
            status(f"{label} {key}: {count} ops by {a.clients} clients in {n_proc} "
                   f"processes ...")
            try:
                barrier.wait(timeout=120)   # every worker is set up and idle
                before = _journal_counters(control)
                cpu_before = _cpu_by_name(processes)
                barrier.wait(timeout=120)
            except threading.BrokenBarrierError:   # a worker failed (it aborted) or hangs
                raise UsageError(f"{label}: a benchmark worker failed: "
                                 f"{_first_error(results) or 'no reply'}") from None
            t0 = time.perf_counter()
            latencies = array("d")
            for _ in workers:
                got_op, payload = results.get(timeout=None if op == "prefill" else 600)
                if got_op == "error":
                    raise UsageError(f"{label}: a benchmark worker failed: {payload}")
                latencies.frombytes(payload)
            wall = time.perf_counter() - t0
            cpu_after = _cpu_by_name(processes)
            after = _journal_counters(control)
            n = len(latencies)
            fsyncs, records = after[0] - before[0], after[1] - before[1]
            cpu = after[2] - before[2] if after[2] is not None and before[2] is not None \
                else None
            out[key] = {"ops": n, "seconds": wall, "ops_per_s": n / wall if wall > 0 else None,
                       "p50_ms": percentile(list(latencies), 50) * 1000,
                       "p99_ms": percentile(list(latencies), 99) * 1000,
                       "fsyncs_per_op": fsyncs / n if n else 0.0,
                       "records_per_op": records / n if n else 0.0,
                       "records_per_fsync": records / fsyncs if fsyncs else 0.0,
                       # server CPU per op: what the rate would be with a core of its own
                       "server_cpu_us": cpu / n * 1e6 if cpu is not None and n else None,
                       # every process's share: where a machine's cores went per op
                       "cpu_us": {name: (cpu_after[name] - cpu_before[name]) / n * 1e6
                                  for name in processes} if n else {}}
    finally:
        for w in workers:
            w.join(timeout=0 if sys.exc_info()[0] else 30)
            if w.is_alive():
                w.terminate()
    return out


def _first_error(results) -> str | None:
    try:
        while True:
            op, payload = results.get(timeout=1)
            if op == "error":
                return payload
    except Exception:   # queue.Empty
        return None


def _posix_rows(rec: _Recorder) -> dict:
    out = {}
    for op, lat in rec.latencies.items():
        wall = rec.wall.get(op, 0.0)
        if lat and wall > 0:
            out[op] = {"ops": len(lat), "ops_per_s": len(lat) / wall,
                       "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000}
    return out


# --------------------------------------------------------------------------- command

def run_meta_bench(cmd: Command) -> int:
    a = cmd.args
    if a.clients < 1 or a.ops < 1 or a.processes < 1:
        raise UsageError("--clients, --ops and --processes must be at least 1")
    try:
        a.prefill = [int(n) for n in a.prefill.split(",")] if a.prefill else []
    except ValueError:
        raise UsageError(f"--prefill takes file counts separated by commas, got "
                         f"{a.prefill!r}") from None
    if any(n <= 0 for n in a.prefill) or a.prefill != sorted(set(a.prefill)):
        raise UsageError("--prefill counts must be positive and increasing")
    unknown = [op for op in a.op if op not in META_OPS]
    if unknown:
        raise UsageError(f"unknown op {unknown[0]!r}; ops are {', '.join(META_OPS)}")
    needs = {"getFileInfo": "create", "open": "create", "rename": "create", "delete": "rename"}
    for op in a.op:
        if op in needs and needs[op] not in a.op:
            raise UsageError(f"op {op} needs {needs[op]} before it (it uses its files)")
    a.op = [op for op in META_OPS if op in a.op]
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C: private servers and workers are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if not a.cluster and (a.ha or a.compare) and (a.rounds < 1 or a.rounds % 2 == 0):
        # two codes or modes measured in rounds: the table shows each one's median round
        raise UsageError(f"--rounds {a.rounds}: an odd number of rounds, so one is the median")
    status = StatusLine(enabled=not a.quiet)
    home = baseline_dir(a.home)
    results: dict = {}
    layout = "contended (one folder)" if a.contended else "disjoint (one folder per client)"
    status(f"bench meta: {a.clients} clients x {a.ops} ops per op, {layout}")
    if a.cluster:
        results["cluster"] = run_on_server(cmd.meta_address, a, status, "cluster")
        modes = ["cluster"]
    elif a.ha:
        # the same workload without and with the replicated log, in the same run
        from .ha import private_ha_cluster
        modes = ["none", "etcd"]
        engine = _engine_cpus(a.engine_cpus)
        if engine:
            # the clients and the (active) metadata server of both runs on the other CPUs
            os.sched_setaffinity(0, os.sched_getaffinity(0) - engine)
            status(f"etcd and the standby on CPUs {sorted(engine)}, the active and the "
                   f"clients on {sorted(os.sched_getaffinity(0))}")
        # rounds alternate the two modes, so a slow spell of the machine lands on both
        runs: dict[str, list] = {"none": [], "etcd": []}
        for r in range(a.rounds):
            tag = f" (round {r + 1}/{a.rounds})" if a.rounds > 1 else ""
            with private_meta_server(home, "fine", status) as server:
                runs["none"].append(run_on_server(server.address, a, status, "none" + tag,
                                                  {"active": [server.pid]}))
            with private_ha_cluster(home, status, engine_cpus=engine) as cluster:
                active = cluster.active()
                runs["etcd"].append(run_on_server(cluster.address(active), a, status,
                                                  "etcd" + tag, cluster.processes(active)))
        rows_measured = list(runs["none"][0])
        ha_ratios = {op: [e[op]["ops_per_s"] / n[op]["ops_per_s"]
                          for n, e in zip(runs["none"], runs["etcd"])] for op in rows_measured}
        for mode in modes:       # each row's median round of the mode stands for it
            results[mode] = _median_rounds(runs[mode])
    elif a.compare:
        lock = a.lock[0]
        with other_tree(a.compare, home, status) as (tree, name):
            modes = [name, "this"]
            trees = {name: tree, "this": SOURCE_TREE}
            # rounds alternate which code goes first, so a slow spell lands on both
            runs: dict[str, list] = {mode: [] for mode in modes}
            for r in range(a.rounds):
                tag = f" (round {r + 1}/{a.rounds})" if a.rounds > 1 else ""
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    with private_meta_server(home, lock, status, trees[mode]) as server:
                        runs[mode].append(run_on_server(server.address, a, status,
                                                        mode + tag, {"meta": [server.pid]}))
        compare_ratios = {op: [t[op]["ops_per_s"] / b[op]["ops_per_s"]
                               for b, t in zip(runs[name], runs["this"])]
                          for op in runs["this"][0]}
        for mode in modes:
            results[mode] = _median_rounds(runs[mode])
    else:
        modes = list(dict.fromkeys(a.lock))
        for lock in modes:
            with private_meta_server(home, lock, status) as server:
                results[lock] = run_on_server(server.address, a, status, lock)
    lrec = _Recorder()
    if not a.no_local:
        a.ops_list = a.op
        with tempfile.TemporaryDirectory(dir=home, prefix=".bench-meta-local-") as local:
            _posix_meta(local, a, lrec, status, "local disk", ops=a.op)
        results["local"] = _posix_rows(lrec)
    if a.moosefs:
        peer = MooseFSPeer(a.moosefs_script, status)
        try:
            peer.ensure_up()
            mrec = _Recorder()
            _posix_meta(peer.mount, a, mrec, status, "MooseFS", ops=a.op)
            results["moosefs"] = _posix_rows(mrec)
        finally:
            peer.stop_if_ours()
    if a.json:
        if a.ha:
            results["etcd_per_none_by_round"] = ha_ratios
        if a.compare:
            results["this_per_other_by_round"] = compare_ratios
        cmd.out(json.dumps({"benchmark": "meta", "clients": a.clients, "ops": a.ops,
                            "processes": a.processes, "contended": a.contended,
                            "prefill": a.prefill,
                            "connections": a.connections,
                            "results": results}, indent=2))
        return 0
    headers = ["op"]
    for mode in modes:
        headers += [f"{mode} ops/s", "p50 ms", "p99 ms", "fsyncs/op", "server µs/op"]
    if "fine" in modes and "global" in modes:
        headers.append("fine/global")
    if "etcd" in modes:
        headers.append("etcd/none")
    if a.compare:
        headers += [f"this/{modes[0]}", "CPU this/other"]
    for peer in ("local", "moosefs"):
        if peer in results:
            headers += [f"{'local disk' if peer == 'local' else 'MooseFS'} ops/s",
                        f"{modes[0]}/{'local' if peer == 'local' else 'MooseFS'}"]
    table = []
    rows = list(a.op)
    for total in a.prefill:
        rows += [f"prefill to {total}"] + [f"{op} @{total}" for op in a.op]
    for op in rows:
        row = [op]
        for mode in modes:
            r = results[mode].get(op)
            row += [f"{r['ops_per_s']:.0f}", f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                    f"{r['fsyncs_per_op']:.3f}" if op.split()[0] in MUTATIONS else "-",
                    "-" if r.get("server_cpu_us") is None else f"{r['server_cpu_us']:.0f}"]
        if "fine" in modes and "global" in modes:
            row.append(f"{results['fine'][op]['ops_per_s'] / results['global'][op]['ops_per_s']:.2f}")
        if "etcd" in modes:
            row.append(f"{statistics.median(ha_ratios[op]):.2f}")
        if a.compare:
            cpu_other, cpu_this = (results[m][op].get("server_cpu_us") for m in modes)
            row += [f"{statistics.median(compare_ratios[op]):.2f}",
                    f"{cpu_this / cpu_other:.2f}" if cpu_this and cpu_other else "-"]
        for peer in ("local", "moosefs"):
            if peer in results:
                other = results[peer].get(op.split()[0])
                mine = results[modes[0]][op]["ops_per_s"]
                row += [f"{other['ops_per_s']:.0f}", f"{mine / other['ops_per_s']:.3f}"] \
                    if other else ["-", "-"]
        table.append(row)
    cmd.out(f"bench meta: {a.clients} clients in {min(a.processes, a.clients)} processes x "
            f"{a.ops} ops each, {layout}, {a.connections} connections")
    for line in format_table(headers, table):
        cmd.out(line)
    if a.ha and a.rounds > 1:
        cmd.out("etcd/none by round (the table: each mode's median round, the median "
                "ratio):")
        for op in a.op:
            cmd.out(f"  {op:<12} " + " ".join(f"{x:.2f}" for x in ha_ratios[op]))
    if a.compare and a.rounds > 1:
        cmd.out(f"this/{modes[0]} ops/s by round (the table: each code's median round, the "
                f"median ratio):")
        for op in a.op:
            cmd.out(f"  {op:<12} " + " ".join(f"{x:.2f}" for x in compare_ratios[op]))
    if a.ha:
        # on one machine the roles share its cores: where they went decides the ratio
        cmd.out("CPU µs per op by process (this machine's cores):")
        for op in a.op:
            for mode in modes:
                spent = results[mode][op].get("cpu_us") or {}
                cmd.out(f"  {op:<12} {mode:<5} " + ", ".join(
                    f"{name} {us:.0f}" for name, us in spent.items())
                    + f"; total {sum(spent.values()):.0f}")
    for mode in modes:
        for total in a.prefill:
            cmd.out(f"{mode}: with {total} more files / on the empty namespace: " + ", ".join(
                _growth(op, results[mode][op], results[mode][f"{op} @{total}"])
                for op in a.op))
    return 0


def _engine_cpus(text: str | None) -> set[int] | None:
    """``--engine-cpus 1`` or ``2,3``: CPUs of this machine, leaving at least one."""
    if not text:
        return None
    try:
        cpus = {int(c) for c in text.split(",") if c.strip()}
    except ValueError:
        raise UsageError(f"--engine-cpus {text!r}: expected CPU numbers like 1 or 2,3") from None
    mine = os.sched_getaffinity(0)
    if not cpus or not cpus < mine:
        raise UsageError(f"--engine-cpus {text!r}: must name some of this process's CPUs "
                         f"{sorted(mine)} and leave at least one")
    return cpus


def _growth(op: str, empty: dict, filled: dict) -> str:
    """One op's rate ratio (filled / empty) and, when known, that of its server CPU per op
    inverted (empty / filled: what the rate ratio is on a machine with a core to spare)."""
    text = f"{op} ops/s {filled['ops_per_s'] / empty['ops_per_s']:.2f}"
    if empty.get("server_cpu_us") and filled.get("server_cpu_us"):
        text += f" (by server CPU per op {empty['server_cpu_us'] / filled['server_cpu_us']:.2f})"
    return text


def register(bsub, common, shared) -> None:
    q = bsub.add_parser("meta", parents=[common],
                        help="metadata ops/s, latency, fsyncs per op; fine vs global lock",
                        description="NNThroughputBenchmark-style metadata benchmark over real "
                                    "RPC. By default on private metadata servers, one per "
                                    "--lock mode, side by side; --cluster for the running one.")
    q.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    q.add_argument("--processes", type=int, default=min(4, os.cpu_count() or 1),
                   help="worker processes the clients are spread over (default: "
                        "min(4, cores))")
    q.add_argument("--ops", type=int, default=500,
                   help="ops per client per op type (default 500)")
    q.add_argument("--op", action="append", default=None, metavar="OP",
                   help=f"run only these ops (repeatable; {', '.join(META_OPS)})")
    q.add_argument("--prefill", default="", metavar="N[,N...]",
                   help="after the ops, fill the namespace up to N more files (create + "
                        "complete by the same clients, 10 000 per folder) and run the ops "
                        "again, for each N: how the rates hold up as the namespace grows "
                        "(ratios to the empty namespace printed)")
    q.add_argument("--contended", action="store_true", help="all clients in one folder")
    q.add_argument("--connections", choices=("shared", "own"), default="shared",
                   help="shared (default): the clients of one worker process share one RPC "
                        "connection, as Hadoop IPC and NNThroughputBenchmark do; own: one "
                        "connection per client")
    q.add_argument("--lock", action="append", choices=LOCK_MODES, default=None,
                   help="lock modes of the private servers (default: fine and global)")
    q.add_argument("--cluster", action="store_true",
                   help="measure the running cluster (--meta) instead of private servers")
    q.add_argument("--ha", action="store_true",
                   help="compare ha = none with ha = etcd (a private cluster of 3 etcd "
                        "members, an active and a standby metadata server), fine locks")
    q.add_argument("--engine-cpus", default=None, metavar="LIST",
                   help="with --ha: run etcd and the standby on these CPUs and everything "
                        "else (clients, the active, the ha = none server) on the others, as "
                        "a deployment keeps etcd off the active's machine (e.g. 1)")
    q.add_argument("--compare", default=None, metavar="REV|DIR",
                   help="compare this code with another: a git revision of this checkout "
                        "(checked out for the run) or a folder holding a leasefs source "
                        "tree; private servers of both, the first --lock mode (default "
                        "fine), rounds alternating; prints this/other ops/s and server "
                        "CPU per op")
    q.add_argument("--rounds", type=int, default=1,
                   help="with --ha or --compare: measure both this many times, alternating "
                        "(an odd number; the table shows each one's median round and the "
                        "median of the rounds' ratios)")
    q.add_argument("--no-local", action="store_true", help="skip the local-disk baseline")
    q.add_argument("--home", default=None,
                   help="folder for the private servers and the local-disk baseline "
                        "(default: the cluster home)")
    shared(q)
    q.set_defaults(func=_defaults_then_run)


def _defaults_then_run(cmd: Command) -> int:
    a = cmd.args
    a.op = a.op or list(META_OPS)
    a.lock = a.lock or (["fine"] if a.compare else list(LOCK_MODES))
    if a.compare and (a.cluster or a.ha):
        raise UsageError("--compare compares private servers: not with --cluster or --ha")
    return run_meta_bench(cmd)
