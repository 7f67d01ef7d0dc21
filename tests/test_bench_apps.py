"""``leasefs bench apps`` and ``bench fuse --phase calls``: run as real ``python -m tools``
subprocesses with tiny sizes on real local folders (and once on a real leasefs mount), plus
the checks that must fail when a filesystem hands back something other than what was written.

What is checked is what a user sees: the table and its ratio columns, ``--json``, the one-line
errors, that no work folder or temp archive is left behind — and that a corrupted extraction,
commit or database is reported as a failure, never as a figure.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness import Mount, ProcessCluster, ctrl_c_reaches_it, poll_until
from tools.bench import apps as A
from tools.bench import calls as C
from tools.bench import fuse as B
from tools.bench import sourcetree as S
from tools.bench.base import BenchFailed

REPO = Path(__file__).resolve().parent.parent
TINY = ["--entries", "60", "--rows", "200", "--transactions", "4", "--settle", "0"]
STEP_ROWS = ["tar -xf", "git init+add+commit", "sqlite3 inserts", "sqlite3 inserts, WAL",
             "rm -rf", "total"]

pytestmark = pytest.mark.timeout(120)


def _env(tmp_path: Path, **extra) -> dict:
    home, tmpdir = tmp_path / "home", tmp_path / "tmpdir"
    home.mkdir(exist_ok=True)
    tmpdir.mkdir(exist_ok=True)
    return {**os.environ, "LEASEFS_HOME": str(home), "LEASEFS_META": "127.0.0.1:1",
            "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO), **extra}


def bench(tmp_path: Path, kind: str, *args, timeout=100, **env):
    return subprocess.run([sys.executable, "-m", "tools", "bench", kind, *map(str, args)],
                          env=_env(tmp_path, **env), capture_output=True, timeout=timeout,
                          cwd=str(tmp_path))


def _folders(tmp_path: Path, n: int = 2) -> list[Path]:
    out = []
    for i in range(n):
        d = tmp_path / f"fs{i}"
        d.mkdir()
        out.append(d)
    return out


def _assert_nothing_left(*folders: Path) -> None:
    for folder in folders:
        assert sorted(os.listdir(folder)) == [], (folder, os.listdir(folder))


def _check_apps_json(doc: dict, labels: list[str]) -> None:
    assert doc["benchmark"] == "apps" and doc["baseline"] == labels[0]
    assert doc["params"] == {"entries": 60, "rows": 200, "transactions": 4,
                             "seed": A.TREE_SEED, "rounds": 1}
    tree = doc["tree"]
    assert tree["entries"] == 60 == tree["files"] + tree["dirs"] + tree["symlinks"]
    assert tree["symlinks"] >= 1 and tree["dirs"] >= 2 and len(tree["git_tree"]) == 40
    assert [p["label"] for p in doc["paths"]] == labels
    base = doc["paths"][0]
    assert base["baseline"] and base["ratios"] == {}
    for entry in doc["paths"]:
        assert entry["error"] is None, entry
        r = entry["results"]
        assert set(r) == {*A.STEPS, "total"}
        assert r["tar"]["entries"] == 60
        assert r["sqlite"]["rows"] == 200 and r["sqlite"]["transactions"] == 4
        assert r["rm"]["entries"] > 60  # the tree and the .git that git added
        for step in A.STEPS:
            assert r[step]["seconds"] > 0
        assert r["git"]["seconds"] == pytest.approx(
            sum(r["git"][f"{k}_seconds"] for k in ("init", "add", "commit")))
        assert r["total"]["seconds"] == pytest.approx(sum(r[s]["seconds"] for s in A.STEPS))
    for other in doc["paths"][1:]:
        assert set(other["ratios"]) == {*A.STEPS, "total"}
        assert other["ratios"]["tar"]["seconds"] == pytest.approx(
            other["results"]["tar"]["seconds"] / base["results"]["tar"]["seconds"])
        assert "entries" not in other["ratios"]["tar"]   # counts are not ratios


# --------------------------------------------------------------------------- bench apps

@pytest.mark.slow
def test_apps_table_has_every_step_for_both_paths_with_ratios(tmp_path):
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "apps", "--path", a, "--path", b, *TINY)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    for folder in (a, b):
        for text in ("tar -xf of 60 entries ...", "git init + add -A + commit ...",
                     "tree and commit ok", "sqlite3 200 inserts in 4 transactions ...",
                     "sqlite3, WAL, 200 inserts in 4 transactions ...",
                     "rm -rf of the tree ...", "rm -rf "):
            assert f"{folder}: {text}" in err, (text, err)
        assert f"{folder}: sqlite3 " in err and "s (integrity ok)" in err, err
    out = proc.stdout.decode().splitlines()
    assert out[0].startswith("bench apps: tar -xf / git / rm -rf of 60 entries")
    header = next(i for i, line in enumerate(out) if line.startswith("step"))
    assert out[header].split() == ["step", "metric", str(a), str(b), str(b), "ratio"]
    assert "(baseline)" in out[header - 2]
    rows = out[header + 2:header + 2 + len(STEP_ROWS)]
    for label, line in zip(STEP_ROWS, rows):
        assert line.startswith(label), (label, line)
        cells = line[len(label):].split()
        assert cells[0] == "s" and len(cells) == 4, line
        assert all(float(x) > 0 for x in cells[1:]), line
    assert out[header + 2 + len(STEP_ROWS)].startswith("ratio = seconds / the baseline's")
    _assert_nothing_left(a, b, tmp_path / "tmpdir")


@pytest.mark.slow
def test_apps_json_shape(tmp_path):
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "apps", "--path", a, "--path", b, *TINY, "--json", "--quiet",
                 "--baseline", b)   # the second path is the one the ratios divide by
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().strip() == ""
    _check_apps_json(json.loads(proc.stdout), [str(b), str(a)])
    _assert_nothing_left(a, b, tmp_path / "tmpdir")


@pytest.mark.slow
def test_apps_rounds_alternate_the_order_and_show_medians(tmp_path):
    """--rounds 3: every path three times, the second round in the reverse order; the
    table's figure is the median of the three, and each round's figure is listed."""
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "apps", "--path", a, "--path", b, *TINY, "--rounds", "3",
                 "--json")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    starts = [line.split("] ", 1)[1].split(": tar -xf of")[0]
              for line in err.splitlines() if ": tar -xf of 60 entries" in line]
    assert starts == [f"{a} (round 1/3)", f"{b} (round 1/3)", f"{b} (round 2/3)",
                      f"{a} (round 2/3)", f"{a} (round 3/3)", f"{b} (round 3/3)"], err
    report = json.loads(proc.stdout)
    assert report["params"]["rounds"] == 3
    for path in report["paths"]:
        assert len(path["rounds"]) == 3
        for step in ("tar", "git", "sqlite", "sqlite-wal", "rm", "total"):
            figures = sorted(r[step]["seconds"] for r in path["rounds"])
            assert path["results"][step]["seconds"] == figures[1], (step, path)
    _assert_nothing_left(a, b, tmp_path / "tmpdir")


@pytest.mark.slow
def test_apps_on_the_floor_filesystem_and_it_is_unmounted_after(tmp_path):
    """--floor: the in-memory pyfuse3 filesystem is mounted for the run, passes every
    step's checks (the extracted tree, the commit, the database) as a real filesystem
    must, shows as its own column and is gone afterwards (unmounted, its folder
    removed)."""
    (a,) = _folders(tmp_path, 1)
    proc = bench(tmp_path, "apps", "--path", a, "--floor", *TINY, "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr.decode()
    report = json.loads(proc.stdout)
    floor = next(p for p in report["paths"] if p["label"] == "floor")
    assert floor["fstype"] == "fuse.floor" and floor["error"] is None, floor
    assert floor["results"]["rm"]["entries"] > 60
    assert not os.path.exists(floor["path"])
    with open("/proc/self/mounts") as mounts:
        assert floor["path"] not in mounts.read()


def test_the_floor_filesystem_answers_as_posix_does(tmp_path):
    """What tar, git and rm ask of it, with a local filesystem's answers: names,
    renames over files and folders, non-empty folders, symlinks, sizes, modes, times."""
    from tools.bench.fusefloor import FloorMount
    floor = FloorMount(lambda text: None)
    root = Path(floor.start())
    try:
        for top in (root, tmp_path / "local"):
            top.mkdir(exist_ok=True)
            (top / "d").mkdir()
            (top / "d" / "f").write_bytes(b"x" * 5000)
            os.chmod(top / "d" / "f", 0o640)
            os.utime(top / "d" / "f", ns=(1_000_000_000, 2_000_000_000))
            os.symlink("d/f", top / "link")
            (top / "g").write_bytes(b"gone")
            os.rename(top / "g", top / "d" / "f2")
            (top / "e").mkdir()
            os.rename(top / "e", top / "d" / "e")
        for top in (root, tmp_path / "local"):
            found = {}
            for folder, dirs, files in os.walk(top):
                for name in dirs + files:
                    path = Path(folder, name)
                    st = os.lstat(path)
                    found[str(path.relative_to(top))] = (
                        st.st_mode, st.st_size if not os.path.isdir(path) else 0,
                        st.st_mtime_ns if name == "f" else 0,
                        os.readlink(path) if os.path.islink(path) else None)
            if top == root:
                on_floor = found
        assert on_floor == found
        for call, args, code in ((os.rmdir, (root / "d",), "ENOTEMPTY"),
                                 (os.unlink, (root / "d",), "EISDIR"),
                                 (os.rmdir, (root / "link",), "ENOTDIR"),
                                 (os.mkdir, (root / "d",), "EEXIST"),
                                 (os.rename, (root / "d", root / "d" / "e" / "x"), "EINVAL"),
                                 (os.link, (root / "d" / "f", root / "h"), "EPERM")):
            with pytest.raises(OSError) as caught:
                call(*args)
            assert errno.errorcode[caught.value.errno] == code, (call, args)
        shutil.rmtree(root / "d")
        assert sorted(os.listdir(root)) == ["link"]
    finally:
        floor.stop()
    assert not root.exists()


@pytest.mark.slow
def test_apps_errors_are_one_line(tmp_path):
    (good,) = _folders(tmp_path, 1)
    missing = tmp_path / "nope"
    proc = bench(tmp_path, "apps", "--path", good, "--path", missing, *TINY)
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [
        f"leasefs bench apps: {missing}: no such file or directory"]
    assert proc.stdout == b""
    _assert_nothing_left(good, tmp_path / "tmpdir")
    proc = bench(tmp_path, "apps", "--path", good, *TINY, "--baseline", "MooseFS")
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"leasefs bench apps: --baseline MooseFS: not one of the paths benchmarked ({good})"]
    _assert_nothing_left(good, tmp_path / "tmpdir")
    # a PATH without git: refused before anything is written
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("tar", "rm"):
        os.symlink(shutil.which(program), bin_dir / program)
    proc = bench(tmp_path, "apps", "--path", good, *TINY, PATH=str(bin_dir))
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        "leasefs bench apps: git not found on the PATH (install it: apt-get install git)"]
    _assert_nothing_left(good, tmp_path / "tmpdir")


@pytest.mark.slow
def test_apps_ctrl_c_removes_the_work_folder_and_archive(tmp_path):
    (a,) = _folders(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-m", "tools", "bench", "apps", "--path", str(a),
                             "--entries", "40", "--rows", "100000", "--transactions", "100000",
                             "--settle", "0"],
                            env=_env(tmp_path), cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    try:
        for line in proc.stderr:   # wait until it is inserting, one fsync'd transaction a row
            if "inserts in 100000 transactions ..." in line:
                break
        assert poll_until(lambda: any(name.startswith(B.WORK_PREFIX) for name in os.listdir(a)),
                          10)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 130, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted" in rest
    _assert_nothing_left(a, tmp_path / "tmpdir")


@pytest.mark.slow
def test_apps_on_a_leasefs_mount(tmp_path):
    """The same run on a real mount (baseline: a local folder) gives the same JSON shape."""
    pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
    (local,) = _folders(tmp_path, 1)
    with ProcessCluster(tmp_path / "cluster", n_storage=1, settings={"replication": 1}) as c:
        mount = Mount(c, "apps")
        try:
            mp = mount.start().mp
            proc = bench(tmp_path, "apps", "--path", local, "--path", mp, *TINY, "--json",
                         "--quiet")
            assert proc.returncode == 0, proc.stderr.decode()
            doc = json.loads(proc.stdout)
            _check_apps_json(doc, [str(local), str(mp)])
            assert doc["paths"][1]["fstype"] == "fuse.leasefs"
            _assert_nothing_left(local, mp, tmp_path / "tmpdir")
            mount.stop()
        finally:
            mount.cleanup()


# --------------------------------------------------------------------------- verification

@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> A.Workload:
    return A.prepare(A.Params(entries=80, rows=50, transactions=5, seed=7),
                     str(tmp_path_factory.mktemp("archive")))


def test_source_tree_is_deterministic_and_shaped_like_source():
    one, two = S.generate(500, 3), S.generate(500, 3)
    assert one == two and S.generate(500, 4) != one
    assert len(one.entries) == 500 and one.dirs == 45 and one.links == 2
    sizes = [len(e.data) for e in one.entries if e.kind == "f"]
    assert min(sizes) >= S.MIN_FILE and max(sizes) <= S.TAIL_MAX
    assert sorted(sizes)[len(sizes) // 2] < S.SMALL_MAX
    seen = set()
    for e in one.entries:   # every folder comes before what it holds
        assert e.rel == S.TOP or os.path.dirname(e.rel) in seen, e.rel
        seen.add(e.rel)


@pytest.mark.slow
def test_extraction_check_catches_changed_content_mode_and_links(tmp_path, workload):
    A.step_tar(workload, str(tmp_path))
    A.verify_tree(workload, str(tmp_path))                 # as extracted: passes
    files = sorted(e.rel for e in workload.tree.entries if e.kind == "f" and e.mode == 0o644)
    victim = tmp_path / files[3]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01                            # one bit, same size
    victim.write_bytes(bytes(data))
    with pytest.raises(BenchFailed, match=f"1 with wrong content.*{files[3]}"):
        A.verify_tree(workload, str(tmp_path))
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    os.chmod(victim, 0o755)                                  # the executable bit changed
    with pytest.raises(BenchFailed, match="1 with wrong content, type, mode"):
        A.verify_tree(workload, str(tmp_path))
    os.chmod(victim, 0o644)
    link = next(e for e in workload.tree.entries if e.kind == "l")
    os.unlink(tmp_path / link.rel)
    with pytest.raises(BenchFailed, match=f"1 missing \\(e.g. {link.rel}\\)"):
        A.verify_tree(workload, str(tmp_path))
    os.symlink("elsewhere", tmp_path / link.rel)            # a wrong link target
    with pytest.raises(BenchFailed, match="1 with wrong content"):
        A.verify_tree(workload, str(tmp_path))


@pytest.mark.slow
def test_tar_step_counts_entries(tmp_path, workload):
    (tmp_path / S.TOP).mkdir()
    (tmp_path / S.TOP / "stray").write_bytes(b"left over")  # one entry too many
    with pytest.raises(BenchFailed, match=r"tar -xf: 81 entries extracted, the archive has 80"):
        A.step_tar(workload, str(tmp_path))


@pytest.mark.slow
def test_git_step_checks_the_committed_tree(tmp_path, workload):
    A.step_tar(workload, str(tmp_path))
    repo = tmp_path / S.TOP
    first = next(e.rel for e in workload.tree.entries if e.kind == "f")
    (tmp_path / first).write_bytes(b"not what the archive holds\n")
    with pytest.raises(BenchFailed, match=f"expected {workload.git_tree}"):
        A.step_git(workload, str(repo))
    shutil.rmtree(repo)
    A.step_tar(workload, str(tmp_path))                     # intact: the ids agree
    result = A.step_git(workload, str(repo))
    assert result["seconds"] > 0 and (repo / ".git").is_dir()
    assert A.step_rm(str(repo))["entries"] > len(workload.manifest)
    assert not repo.exists()


@pytest.mark.slow
def test_sqlite_step_checks_the_rows(tmp_path, workload):
    result = A.step_sqlite(workload, str(tmp_path / "ok.db"), 5)
    assert result == {"seconds": result["seconds"], "rows": 50, "transactions": 5}
    wal = A.step_sqlite(workload, str(tmp_path / "wal.db"), 5, journal="wal")
    assert wal["rows"] == 50
    con = sqlite3.connect(tmp_path / "wal.db")   # WAL mode is kept in the database itself
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()
    rows = list(workload.rows)
    rows[17] = (rows[17][0], rows[17][1], rows[17][2] + 1, rows[17][3])
    changed = dataclasses.replace(workload, rows=tuple(rows))  # stored != expected
    with pytest.raises(BenchFailed, match="the database holds 50 rows"):
        A.step_sqlite(changed, str(tmp_path / "bad.db"), 5)


# --------------------------------------------------------------------------- bench fuse calls

@pytest.mark.slow
def test_fuse_calls_phase_table_and_json(tmp_path):
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "fuse", "--path", a, "--path", b, "--phase", "calls",
                 "--calls", "20")
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode().splitlines()
    assert out[0] == "bench fuse: single calls on 20 files of 4 KiB"
    header = next(i for i, line in enumerate(out) if line.startswith("phase"))
    rows = [line for line in out[header + 2:] if line.startswith("calls ")]
    labels = [c.label.format(size="4 KiB") for c in C.CALLS]
    assert len(rows) == 2 * len(labels)
    for i, line in enumerate(rows):
        assert f" {labels[i // 2]} {('p50', 'p99')[i % 2]} ms " in line, line
        assert len(line.split()[-3:]) == 3 and all(float(x) > 0 for x in line.split()[-3:])
    assert not any(line.startswith(("seq-", "create", "cp-r")) for line in out)

    proc = bench(tmp_path, "fuse", "--path", a, "--path", b, "--phase", "calls",
                 "--phase", "stat", "--calls", "20", "--files", "10", "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert doc["params"]["phases"] == ["stat", "calls"]
    for entry in doc["paths"]:
        calls = entry["results"]["calls"]
        assert calls["calls"] == 20
        assert set(calls) == {"calls", "seconds", *C.result_keys()}
        for c in C.CALLS:
            assert 0 < calls[f"{c.key}_p50_ms"] <= calls[f"{c.key}_p99_ms"]
        assert set(entry["results"]) == {"create", "stat", "calls"}  # stat needs create
    ratio = doc["paths"][1]["ratios"]["calls"]
    assert "calls" not in ratio and ratio["stat_p50_ms"] == pytest.approx(
        doc["paths"][1]["results"]["calls"]["stat_p50_ms"]
        / doc["paths"][0]["results"]["calls"]["stat_p50_ms"])
    _assert_nothing_left(a, b)


def test_calls_fail_on_a_folder_that_does_not_behave(tmp_path):
    (tmp_path / "stranger").write_bytes(b"")   # an entry the calls did not make
    with pytest.raises(BenchFailed, match="lists 6 entries, expected the 5 renamed files"):
        C.measure_calls(str(tmp_path), 5, 4096)
    (tmp_path / "stranger").unlink()
    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    result = C.measure_calls(str(tmp_path), 5, 4096)
    assert result["calls"] == 5 and os.listdir(tmp_path) == []
