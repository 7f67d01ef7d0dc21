"""``leasefs bench cli [--runs N] [--compare TREE]``: how long the command line takes to
answer — ``leasefs --help`` and ``leasefs ls /`` against the cluster it finds — as the wall
time of whole processes (interpreter start, imports, parsing, the call, exit), median of N.

Why whole processes: what a person or a script waits for is the process, and most of it is
start-up (imports), which no in-process timer sees. The CPU time (user + system) of each
process is shown too: on a busy machine wall time mostly measures the queue for a core,
CPU time much less so. ``--compare TREE`` runs the same commands
from another source tree (e.g. an older checkout) with its own ``PYTHONPATH``, alternating
with this one run by run, so that both see the same load on a shared machine.

Concurrency contract: a CLI process that runs the measured processes one at a time.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from ..common import Command, SOURCE_TREE
from ..formatting import UsageError, format_table

#: what is measured: a name and the ``leasefs`` arguments
CASES = (("--help", ["--help"]), ("ls /", ["ls", "/"]))


def _tree_env(tree: str) -> dict:
    """The environment that makes ``python -m tools`` run from ``tree``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(args: list[str], tree: str, env: dict, meta: str | None) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one ``python -m tools ARGS`` process run from ``tree``
    (its working folder too: ``python -m`` looks there first); a failed one is an error."""
    argv = [sys.executable, "-m", "tools", *args]
    if meta:
        argv += ["--meta", meta]
    cpu = _children_cpu()
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=120)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise UsageError(f"'leasefs {' '.join(args)}' failed ({proc.returncode}): "
                         f"{proc.stderr.decode(errors='replace').strip()[-300:]}")
    return took, _children_cpu() - cpu


def cmd_bench_cli(cmd: Command) -> int:
    a = cmd.args
    if a.runs < 1:
        raise UsageError("--runs must be at least 1")
    if a.compare and not os.path.isdir(os.path.join(a.compare, "tools")):
        raise UsageError(f"--compare {a.compare}: not a leasefs source tree (no tools/ in it)")
    meta = getattr(a, "meta", None)
    trees = [("this", SOURCE_TREE)] + ([("compare", os.path.abspath(a.compare))]
                                     if a.compare else [])
    envs = {name: _tree_env(tree) for name, tree in trees}
    times = {(name, case): [] for name, _ in trees for case, _ in CASES}
    cpus = {key: [] for key in times}
    for run in range(a.runs):
        # alternate which tree goes first, so neither always meets a warmer cache
        order = trees if run % 2 == 0 else trees[::-1]
        for case, args in CASES:
            for name, tree in order:
                wall, cpu = run_once(args, tree, envs[name], meta)
                times[(name, case)].append(wall)
                cpus[(name, case)].append(cpu)
        if not a.quiet:
            print(f"bench cli: run {run + 1}/{a.runs}", file=sys.stderr, flush=True)
    medians = {key: statistics.median(v) for key, v in times.items()}
    cpu = {key: statistics.median(v) for key, v in cpus.items()}
    if a.json:
        cmd.out(json.dumps({"runs": a.runs, "compare": a.compare, "results": [
            {"tree": name, "case": case, "median_s": medians[(name, case)],
             "min_s": min(times[(name, case)]), "max_s": max(times[(name, case)]),
             "cpu_median_s": cpu[(name, case)]}
            for name, _ in trees for case, _ in CASES]}, indent=2))
        return 0
    headers = ["command"] + [f"{name} {what} ms" for name, _ in trees
                             for what in ("wall", "cpu")] + \
        (["this/compare wall", "cpu"] if a.compare else [])
    rows = []
    for case, _ in CASES:
        row = [f"leasefs {case}"] + [f"{figures[(name, case)] * 1000:.0f}" for name, _ in trees
                                     for figures in (medians, cpu)]
        if a.compare:
            row += [f"{figures[('this', case)] / figures[('compare', case)]:.2f}"
                    for figures in (medians, cpu)]
        rows.append(row)
    cmd.out(f"leasefs bench cli: wall and CPU time of whole processes, median of {a.runs} runs"
            + (f"; compare = {a.compare}" if a.compare else ""))
    for line in format_table(headers, rows, align="<" + ">" * (len(headers) - 1)):
        cmd.out(line)
    return 0


def register(bsub, common) -> None:
    q = bsub.add_parser("cli", parents=[common],
                        help="start-up: wall time of 'leasefs --help' and 'leasefs ls /'",
                        description="Wall time of whole 'python -m tools' processes: "
                                    "'leasefs --help' and 'leasefs ls /' against the cluster "
                                    "found (--meta, LEASEFS_META, the embedded cluster), "
                                    "median of --runs. --compare TREE alternates them run by "
                                    "run with another source tree's.\n\nexample:\n"
                                    "  git archive HEAD~5 | tar -x -C /tmp/old && "
                                    "leasefs bench cli --runs 21 --compare /tmp/old")
    q.add_argument("--runs", type=int, default=11, help="runs of each command (default 11)")
    q.add_argument("--compare", default=None, metavar="TREE",
                   help="another leasefs source tree to time the same way, alternating")
    q.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=cmd_bench_cli)
