"""``leasefs bench apps [--path DIR ...] [--moosefs]``: real applications timed on any folders
— a local disk, the leasefs FUSE mount, a MooseFS mount — in one run, as seconds with ratios to
the first path.

Why: what people do on a mounted filesystem is unpack, commit, run a small database and
delete trees; those tools issue one call at a time, so their speed is the sum of per-call
latencies that ``bench fuse``'s rates only hint at. Steps per path, each timed as wall time
of the real program:

- ``tar``: ``tar -xf`` of a seeded synthetic source tree (sourcetree.py; ``--entries``
  archive members, default 4,729) from a local temp archive built once per run (plain
  ``tar -xf``: run as root it also sets every entry's owner, as any root extraction does);
- ``git``: ``git init -q; git add -A; git commit -q`` in the extracted tree, with identity
  given by ``-c``, no hooks, no signing, and no system/global config so a user's settings do
  not change the figure. ``core.fsync`` stays at git's shipped default; automatic gc and
  maintenance are off so no background repack races the next step;
- ``sqlite``: ``--rows`` inserts into an indexed table in ``--transactions`` transactions
  through Python's sqlite3 module (the same SQLite library as the CLI; no extra package),
  with SQLite's defaults: rollback journal (``journal_mode=DELETE``) and ``synchronous=FULL``;
- ``sqlite-wal``: the same inserts into another database with ``journal_mode=WAL`` (a
  write-ahead log, and its shared memory file mmapped by SQLite);
- ``rm``: ``rm -rf`` of the tree (its ``.git`` included).

Nothing broken can look fast: after ``tar`` and ``git`` (untimed) every extracted entry is
compared with the generated one (count, kind, executable bit, size and CRC32C, link target),
the committed tree id must equal the one computed from the generated content, the database
must pass ``PRAGMA integrity_check`` and hold exactly the rows inserted (count and CRC32C of
every row), and the tree must be gone after ``rm -rf``. The file content is checked after
``git`` so that ``git add`` reads the tree as a real unpack-then-commit does, not after a
verification pass has warmed the caches.

Path selection, labels, work folders, cleanup on errors, Ctrl-C and SIGTERM, and ratios are
``bench fuse``'s (fuse.py). ``--rounds N`` runs every path N times, the order of the paths
reversed every other round, and shows each step's median; before each path the run waits
for a quiet machine (``base.wait_quiet``): a peer still deleting what its ``rm -rf``
removed would otherwise be timed as part of the next path (``--settle``: how long at most).

Concurrency contract: a CLI process running one program at a time on its main thread, one
path at a time. Progress lines go to stderr, results to stdout.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass

import crc32c

from ..common import Command
from ..formatting import UsageError, format_table
from ..progress import StatusLine
from . import sourcetree
from .base import BenchFailed, size_label, wait_quiet
from .fuse import (WORK_PREFIX, Target, add_path_options, finish_targets, fmt_figure,
                        ratios, remove_tree, run_on_targets, sigterm_as_interrupt,
                        targets_from_args)

STEPS = ("tar", "git", "sqlite", "sqlite-wal", "rm")
STEP_LABELS = {"tar": "tar -xf", "git": "git init+add+commit", "sqlite": "sqlite3 inserts",
               "sqlite-wal": "sqlite3 inserts, WAL", "rm": "rm -rf", "total": "total"}
TREE_SEED = 20240601
ROW_SEED = 4729
PROGRAMS = ("tar", "git", "rm")
GIT_CONFIG = {"user.name": "leasefs bench", "user.email": "bench@leasefs.invalid",
              "commit.gpgSign": "false", "core.hooksPath": os.devnull,
              "init.defaultBranch": "main", "gc.auto": "0", "maintenance.auto": "false",
              "advice.detachedHead": "false"}


@dataclass(frozen=True)
class Params:
    entries: int
    rows: int
    transactions: int
    seed: int
    rounds: int = 1
    settle: float = 60.0


@dataclass(frozen=True)
class Workload:
    """What every path gets: the archive, what it must extract to, the rows to insert."""
    tree: sourcetree.SourceTree
    archive: str
    archive_bytes: int
    manifest: dict
    digest: str
    git_tree: str
    rows: tuple
    rows_crc: int


# --------------------------------------------------------------------------- the workload

def make_rows(n: int, seed: int = ROW_SEED) -> tuple:
    """``n`` rows (id, name, size, body): fixed by ``seed``, text of 20-200 bytes."""
    rng = random.Random(seed)
    words = sourcetree.FILE_WORDS
    return tuple((i + 1, f"{rng.choice(words)}-{rng.choice(words)}-{i:06d}",
                  rng.randrange(1 << 31),
                  " ".join(rng.choice(words) for _ in range(rng.randint(3, 30))))
                 for i in range(n))


def rows_crc(rows) -> int:
    crc = 0
    for row in rows:
        crc = crc32c.crc32c("|".join(map(str, row)).encode() + b"\n", crc)
    return crc


def prepare(params: Params, folder: str) -> Workload:
    tree = sourcetree.generate(params.entries, params.seed)
    archive = os.path.join(folder, "tree.tar")
    size = sourcetree.write_tar(tree, archive)
    expected = sourcetree.manifest(tree)
    rows = make_rows(params.rows)
    return Workload(tree=tree, archive=archive, archive_bytes=size, manifest=expected,
                    digest=sourcetree.manifest_digest(expected),
                    git_tree=sourcetree.git_tree_id(tree), rows=rows, rows_crc=rows_crc(rows))


# --------------------------------------------------------------------------- steps

def _run(name: str, argv: list[str], cwd: str, env=None) -> float:
    """Seconds ``argv`` took; ``BenchFailed`` naming it with its last output line if it
    failed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        lines = proc.stdout.strip().splitlines()
        raise BenchFailed(f"{name} failed (exit {proc.returncode}): "
                          f"{lines[-1] if lines else 'no output'}")
    return seconds


def count_entries(root: str) -> int:
    """Entries under ``root``, itself included (readdir only, no file reads)."""
    if not os.path.lexists(root):
        return 0
    n = 1
    for _, dirs, files in os.walk(root):
        n += len(dirs) + len(files)
    return n


def step_tar(work: Workload, dest: str) -> dict:
    seconds = _run("tar -xf", ["tar", "-xf", work.archive], cwd=dest)
    found = count_entries(os.path.join(dest, sourcetree.TOP))
    if found != len(work.manifest):
        raise BenchFailed(f"tar -xf: {found} entries extracted, the archive has "
                          f"{len(work.manifest)}")
    return {"seconds": seconds, "entries": found}


def verify_tree(work: Workload, dest: str) -> None:
    """Every entry's kind, mode bit, size, CRC32C or link target as generated."""
    found = sourcetree.read_manifest(dest, ignore=(".git",))
    problem = sourcetree.compare(work.manifest, found)
    if problem:
        raise BenchFailed(f"tar -xf extracted a tree that differs from the archive: {problem}")


def git_env() -> dict:
    """The environment without any GIT_* variable, user or system config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
                "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C",
                "GIT_AUTHOR_DATE": f"@{sourcetree.MTIME} +0000",
                "GIT_COMMITTER_DATE": f"@{sourcetree.MTIME} +0000"})
    return env


def step_git(work: Workload, repo: str) -> dict:
    env = git_env()
    git = ["git"] + [arg for key, value in GIT_CONFIG.items() for arg in ("-c", f"{key}={value}")]
    out = {}
    for name, args in (("init", ["init", "-q"]), ("add", ["add", "-A"]),
                       ("commit", ["commit", "-q", "--no-verify", "-m", "bench apps"])):
        out[f"{name}_seconds"] = _run(f"git {name}", git + args, cwd=repo, env=env)
    out = {"seconds": sum(out.values()), **out}
    proc = subprocess.run(git + ["rev-parse", "HEAD^{tree}"], cwd=repo, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    got = proc.stdout.strip()
    if proc.returncode != 0 or got != work.git_tree:
        raise BenchFailed(f"git committed tree {got or '(none)'}, expected {work.git_tree}: "
                          f"git read back something other than what was extracted")
    return out


def step_sqlite(work: Workload, db: str, transactions: int, journal: str = "delete") -> dict:
    """The inserts in ``transactions`` transactions, with sqlite's ``journal`` mode
    (``delete``: the default rollback journal; ``wal``: a write-ahead log and its shared
    memory file, mmapped)."""
    rows = work.rows
    start = time.perf_counter()
    con = sqlite3.connect(db, isolation_level=None)  # we say BEGIN/COMMIT ourselves
    try:
        mode = con.execute(f"PRAGMA journal_mode={journal}").fetchone()[0]
        if mode != journal:
            raise BenchFailed(f"sqlite3: journal_mode {journal} refused ({mode})")
        con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                    "size INTEGER NOT NULL, body TEXT NOT NULL)")
        con.execute("CREATE INDEX items_name ON items (name)")
        for t in range(transactions):
            batch = rows[t * len(rows) // transactions:(t + 1) * len(rows) // transactions]
            con.execute("BEGIN")
            con.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", batch)
            con.execute("COMMIT")
    finally:
        con.close()
    seconds = time.perf_counter() - start
    check = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        integrity = check.execute("PRAGMA integrity_check").fetchone()[0]
        got = check.execute("SELECT id, name, size, body FROM items ORDER BY id").fetchall()
    finally:
        check.close()
    if integrity != "ok":
        raise BenchFailed(f"sqlite3: integrity_check says {integrity!r}")
    if len(got) != len(rows) or rows_crc(got) != work.rows_crc:
        raise BenchFailed(f"sqlite3: the database holds {len(got)} rows (CRC32C "
                          f"{rows_crc(got):08x}), {len(rows)} were inserted "
                          f"(CRC32C {work.rows_crc:08x})")
    return {"seconds": seconds, "rows": len(rows), "transactions": transactions}


def step_rm(tree_root: str) -> dict:
    entries = count_entries(tree_root)
    seconds = _run("rm -rf", ["rm", "-rf", "--", tree_root], cwd=os.path.dirname(tree_root))
    if os.path.lexists(tree_root):
        raise BenchFailed(f"rm -rf: {tree_root} still exists afterwards")
    return {"seconds": seconds, "entries": entries}


def bench_path(folder: str, params: Params, work: Workload, status, label: str) -> dict:
    """All steps in the work folder ``folder``; returns step -> figures."""
    results = {}
    tree_root = os.path.join(folder, sourcetree.TOP)
    status(f"{label}: tar -xf of {len(work.manifest)} entries ...")
    results["tar"] = step_tar(work, folder)
    status(f"{label}: tar -xf {fmt_figure(results['tar']['seconds'])} s")
    status(f"{label}: git init + add -A + commit ...")
    results["git"] = step_git(work, tree_root)
    status(f"{label}: git {fmt_figure(results['git']['seconds'])} s; verifying the tree ...")
    verify_tree(work, folder)
    status(f"{label}: tree and commit ok")
    status(f"{label}: sqlite3 {params.rows} inserts in {params.transactions} transactions ...")
    results["sqlite"] = step_sqlite(work, os.path.join(folder, "bench.db"), params.transactions)
    status(f"{label}: sqlite3 {fmt_figure(results['sqlite']['seconds'])} s (integrity ok)")
    status(f"{label}: sqlite3, WAL, {params.rows} inserts in {params.transactions} "
           f"transactions ...")
    results["sqlite-wal"] = step_sqlite(work, os.path.join(folder, "wal.db"),
                                        params.transactions, journal="wal")
    status(f"{label}: sqlite3, WAL {fmt_figure(results['sqlite-wal']['seconds'])} s "
           f"(integrity ok)")
    status(f"{label}: rm -rf of the tree ...")
    results["rm"] = step_rm(tree_root)
    status(f"{label}: rm -rf {fmt_figure(results['rm']['seconds'])} s "
           f"({results['rm']['entries']} entries)")
    results["total"] = {"seconds": sum(results[s]["seconds"] for s in STEPS)}
    return results


# --------------------------------------------------------------------------- command

def _params(a) -> Params:
    if a.entries < 10:
        raise UsageError("--entries must be at least 10")
    if a.rows < 1 or not 1 <= a.transactions <= a.rows:
        raise UsageError("--rows must be at least 1 and --transactions between 1 and --rows")
    for program in PROGRAMS:
        if shutil.which(program) is None:
            raise UsageError(f"{program} not found on the PATH (install it: apt-get install "
                             f"{program})")
    if a.rounds < 1 or a.settle < 0:
        raise UsageError("--rounds must be at least 1 and --settle at least 0")
    return Params(entries=a.entries, rows=a.rows, transactions=a.transactions, seed=a.seed,
                  rounds=a.rounds, settle=a.settle)


def run_apps_bench(cmd: Command) -> int:
    a = cmd.args
    params = _params(a)
    status = StatusLine(enabled=not a.quiet)
    targets, peer = targets_from_args(a, status)
    home = None
    work = None
    with sigterm_as_interrupt():
        try:
            targets = finish_targets(targets, peer, a.baseline)
            home = tempfile.mkdtemp(prefix=WORK_PREFIX + "apps-")
            status(f"building the source tree: {params.entries} entries, seed {params.seed} ...")
            work = prepare(params, home)
            status(f"  {work.tree.files} files, {work.tree.dirs} folders, {work.tree.links} "
                   f"symlinks, {size_label(work.tree.total)}; archive {work.archive}")
            rounds = run_rounds(cmd, targets, params, work, status)
        finally:
            if home:
                remove_tree(home)
            if peer:
                peer.stop_if_ours()
    _print_results(cmd, params, work, targets, rounds)
    return cmd.status


def run_rounds(cmd: Command, targets: list[Target], params: Params, work: Workload,
               status) -> dict:
    """Every path ``params.rounds`` times, the order reversed every other round, each after
    a wait for a quiet machine; each target's ``results`` become the median of its rounds.
    Returns label -> the rounds' results."""
    rounds: dict[str, list] = {t.label: [] for t in targets}

    def one(t: Target, label: str) -> dict:
        if params.settle > 0:
            wait_quiet(status, params.settle)
        results = bench_path(t.work, params, work, status, label)
        rounds[t.label].append(results)
        return results

    for r in range(params.rounds):
        order = [t for t in (targets if r % 2 == 0 else targets[::-1]) if not t.error]
        tag = f" (round {r + 1}/{params.rounds})" if params.rounds > 1 else ""
        run_on_targets(cmd, order, lambda t: one(t, t.label + tag),
                       (OSError, BenchFailed, sqlite3.Error, subprocess.SubprocessError))
    for t in targets:
        if rounds[t.label] and not t.error:
            t.results = median_results(rounds[t.label])
    return rounds


def median_results(runs: list[dict]) -> dict:
    """step -> figures: each figure the median of the runs'."""
    return {step: {key: statistics.median(run[step][key] for run in runs)
                   for key in figures}
            for step, figures in runs[0].items()}


def _print_results(cmd: Command, params: Params, work: Workload, targets: list[Target],
                   rounds: dict) -> None:
    base = targets[0]
    for t in targets:
        t.ratios = ratios(t.results, base.results) if t is not base else {}
    tree = work.tree
    if cmd.args.json:
        cmd.out(json.dumps({
            "benchmark": "apps",
            "params": {"entries": params.entries, "rows": params.rows,
                       "transactions": params.transactions, "seed": params.seed,
                       "rounds": params.rounds},
            "tree": {"entries": len(tree.entries), "files": tree.files, "dirs": tree.dirs,
                     "symlinks": tree.links, "bytes": tree.total,
                     "archive_bytes": work.archive_bytes, "checksum": work.digest,
                     "git_tree": work.git_tree},
            "baseline": base.label,
            "paths": [{"label": t.label, "path": t.path, "fstype": t.fstype,
                       "baseline": t is base, "error": t.error, "results": t.results,
                       "ratios": t.ratios, "rounds": rounds.get(t.label, [])}
                      for t in targets],
        }, indent=2))
        return
    if all(t.error for t in targets):
        return
    cmd.out(f"bench apps: tar -xf / git / rm -rf of {len(tree.entries)} entries ({tree.files} "
            f"files, {tree.dirs} folders, {tree.links} symlinks, {size_label(tree.total)}); "
            f"sqlite3 {params.rows} inserts in {params.transactions} transactions")
    width = max(len(t.label) for t in targets)
    for t in targets:
        where = f"{t.label:<{width}}" + (f"  {t.path}" if t.path != t.label else "")
        note = " (baseline)" if t is base else ""
        note += f"  FAILED: {t.error}" if t.error else ""
        cmd.out(f"  {where}  [{t.fstype}]{note}")
    others = targets[1:]
    headers = ["step", "metric", *(t.label for t in targets),
               *(f"{t.label} ratio" for t in others)]
    rows = []
    for step in (*STEPS, "total"):
        row = [STEP_LABELS[step], "s"]
        row += [fmt_figure(t.results.get(step, {}).get("seconds")) for t in targets]
        row += [fmt_figure(t.ratios.get(step, {}).get("seconds")) for t in others]
        rows.append(row)
    for line in format_table(headers, rows, align="<<" + ">" * (len(headers) - 2)):
        cmd.out(line)
    if others:
        cmd.out(f"ratio = seconds / the baseline's ({base.label}): above 1 is slower")
    if params.rounds > 1:
        cmd.out(f"each figure: the median of {params.rounds} rounds; the rounds' seconds "
                f"(the paths' order reversed every other round):")
        for t in targets:
            for step in (*STEPS, "total"):
                figures = " ".join(fmt_figure(run[step]["seconds"])
                                   for run in rounds.get(t.label, []))
                cmd.out(f"  {t.label:<{width}}  {STEP_LABELS[step]:<19}  {figures}")


# --------------------------------------------------------------------------- parser

def register(bsub, common) -> None:
    """The ``apps`` subcommand under ``leasefs bench``."""
    q = bsub.add_parser("apps", parents=[common],
                        help="real applications (tar, git, sqlite3, rm -rf) on any folders",
                        description="tar -xf of a synthetic source tree, git init + add + "
                                    "commit of it, sqlite3 inserts in transactions and rm -rf, "
                                    "timed in each --path and checked; the first path is the "
                                    "baseline of the ratio columns.")
    add_path_options(q)
    q.add_argument("--entries", type=int, default=4729,
                   help="members of the tar archive: files, folders, symlinks (default 4729)")
    q.add_argument("--rows", type=int, default=20000, help="sqlite3 inserts (default 20000)")
    q.add_argument("--transactions", type=int, default=200,
                   help="sqlite3 transactions the inserts are spread over (default 200)")
    q.add_argument("--seed", type=int, default=TREE_SEED,
                   help="seed of the generated source tree")
    q.add_argument("--rounds", type=int, default=1,
                   help="run every path this many times, the order reversed every other "
                        "round, and show each step's median (default 1)")
    q.add_argument("--settle", type=float, default=60.0, metavar="SECONDS",
                   help="before each path wait up to this long for a quiet machine "
                        "(default 60; 0: no wait)")
    q.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=run_apps_bench)
