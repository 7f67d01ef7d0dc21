"""``leasefs bench fuse``: run as a real ``python -m tools`` subprocess on real local folders
(tiny sizes), plus the phase functions that must fail loudly on wrong data.

What is checked is what a user sees: the table and its ratio columns, ``--json``, the one-line
error and exit status of a bad path, and that no work folder is left behind, also after Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ctrl_c_reaches_it, poll_until
from tools.bench import fuse as B

REPO = Path(__file__).resolve().parent.parent
TINY = ["--size", "4M", "--files", "30", "--tree-files", "60", "--calls", "20"]
PHASE_ROWS = [("seq-write", "MB/s"), ("seq-read", "MB/s"),
              ("create", "ops/s"), ("create", "p50 ms"), ("create", "p99 ms"),
              ("stat", "ops/s"), ("stat", "p50 ms"), ("stat", "p99 ms"),
              ("unlink", "ops/s"), ("unlink", "p50 ms"), ("unlink", "p99 ms"),
              ("cp-r", "files/s"), ("cp-r", "MB/s")]

pytestmark = pytest.mark.timeout(60)


def _env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    tmpdir = tmp_path / "tmpdir"   # where the cp -r source tree is built
    home.mkdir(exist_ok=True)
    tmpdir.mkdir(exist_ok=True)
    env = {**os.environ, "LEASEFS_HOME": str(home), "LEASEFS_META": "127.0.0.1:1",
           "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO)}
    return env


def bench(tmp_path: Path, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tools", "bench", "fuse", *map(str, args)],
                          env=_env(tmp_path), capture_output=True, timeout=timeout,
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


# --------------------------------------------------------------------------- CLI runs

@pytest.mark.slow
def test_table_has_every_phase_for_both_paths_with_ratios(tmp_path):
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "--path", a, "--path", b, *TINY)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    out = proc.stdout.decode().splitlines()
    # progress on stderr, one line per phase and path
    for phase in ("seq-write", "seq-read", "create", "stat", "unlink", "cp-r"):
        assert f"{a}: {phase}" in err and f"{b}: {phase}" in err, (phase, err)
    assert "checksum ok" in err
    header = next(i for i, line in enumerate(out) if line.startswith("phase"))
    assert f"{b} ratio" in out[header]
    assert f"{a}  [" in "\n".join(out[:header]) and "(baseline)" in out[header - 2]
    rows = [line.split() for line in out[header + 2:header + 2 + len(PHASE_ROWS)]]
    assert len(rows) == len(PHASE_ROWS)
    for (phase, unit), cells in zip(PHASE_ROWS, rows):
        n_unit = len(unit.split())
        assert cells[0] == phase and cells[1:1 + n_unit] == unit.split(), cells
        figures = [float(x) for x in cells[1 + n_unit:]]
        assert len(figures) == 3, cells  # path a, path b, ratio b/a
        assert all(f > 0 for f in figures), cells
    assert any(line.startswith("ratio = ") for line in out[header:])
    _assert_nothing_left(a, b, tmp_path / "tmpdir")


@pytest.mark.slow
def test_json_results_and_ratios(tmp_path):
    a, b = _folders(tmp_path)
    proc = bench(tmp_path, "--path", a, "--path", b, *TINY, "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().strip() == ""
    doc = json.loads(proc.stdout)
    assert doc["benchmark"] == "fuse" and doc["baseline"] == str(a)
    assert doc["params"] == {"size": 4 << 20, "io_size": 1 << 20, "files": 30,
                             "file_size": 4096, "tree_files": 60, "calls": 20,
                             "phases": list(B.DEFAULT_PHASES)}
    assert doc["tree"]["files"] == 60 and 60 << 10 <= doc["tree"]["bytes"] <= 60 * (64 << 10)
    base, other = doc["paths"]
    assert [base["path"], other["path"]] == [str(a), str(b)]
    assert base["baseline"] and not other["baseline"] and base["ratios"] == {}
    for entry in (base, other):
        assert entry["error"] is None
        r = entry["results"]
        assert set(r) == set(B.DEFAULT_PHASES)
        for phase in ("seq-write", "seq-read"):
            assert r[phase]["bytes"] == 4 << 20 and r[phase]["mbps"] > 0
        for phase in B.OP_PHASES:
            assert r[phase]["ops"] == 30
            assert r[phase]["ops_per_s"] > 0 and 0 < r[phase]["p50_ms"] <= r[phase]["p99_ms"]
        assert r["cp-r"]["files"] == 60 and r["cp-r"]["files_per_s"] > 0
        assert r["cp-r"]["bytes"] == doc["tree"]["bytes"] and r["cp-r"]["mbps"] > 0
    ratio = other["ratios"]["seq-read"]["mbps"]
    expected = other["results"]["seq-read"]["mbps"] / base["results"]["seq-read"]["mbps"]
    assert ratio == pytest.approx(expected)
    assert set(other["ratios"]["stat"]) == {"seconds", "ops_per_s", "p50_ms", "p99_ms"}
    _assert_nothing_left(a, b, tmp_path / "tmpdir")


@pytest.mark.slow
def test_default_is_a_local_folder_by_the_cluster_home(tmp_path):
    """No --path and no mount: one column, the folder holding LEASEFS_HOME, no ratios."""
    proc = bench(tmp_path, *TINY, "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert [(p["label"], p["path"]) for p in doc["paths"]] == [("local", str(tmp_path / "home"))]
    _assert_nothing_left(tmp_path / "home", tmp_path / "tmpdir")


@pytest.mark.slow
def test_bad_path_is_one_line_and_exit_1(tmp_path):
    (good,) = _folders(tmp_path, 1)
    missing = tmp_path / "nope"
    proc = bench(tmp_path, "--path", good, "--path", missing, *TINY)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert err.splitlines() == [f"leasefs bench fuse: {missing}: no such file or directory"]
    assert proc.stdout == b""
    _assert_nothing_left(good, tmp_path / "tmpdir")   # refused before writing anything
    plain_file = tmp_path / "plain"
    plain_file.write_bytes(b"x")
    proc = bench(tmp_path, "--path", plain_file)
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [f"leasefs bench fuse: {plain_file}: "
                                                 "not a directory"]


@pytest.mark.slow
def test_ctrl_c_removes_the_work_folders(tmp_path):
    (a,) = _folders(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-m", "tools", "bench", "fuse", "--path", str(a),
                             "--size", "1M", "--files", "2000000", "--tree-files", "20"],
                            env=_env(tmp_path), cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    try:
        for line in proc.stderr:   # wait until it is creating the small files
            if ": create " in line:
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


# --------------------------------------------------------------------------- phase functions

@pytest.mark.slow
def test_read_verification_fails_when_the_content_changes(tmp_path):
    path = str(tmp_path / "seq.bin")
    size, io = 3 * 65536 + 100, 65536
    result, crc = B.seq_write(path, size, io)
    assert result["bytes"] == size and result["mbps"] > 0
    assert B.seq_read(path, size, io, crc)["bytes"] == size      # unchanged: passes
    original = Path(path).read_bytes()

    fd = os.open(path, os.O_WRONLY)                               # one byte flipped
    os.pwrite(fd, bytes([original[size // 2] ^ 0xFF]), size // 2)
    os.close(fd)
    with pytest.raises(B.BenchFailed, match="CRC32C"):
        B.seq_read(path, size, io, crc)

    # two whole chunks swapped: same bytes but at the wrong offsets (chunk index stamps)
    chunks = [original[i:i + io] for i in range(0, size, io)]
    chunks[0], chunks[1] = chunks[1], chunks[0]
    Path(path).write_bytes(b"".join(chunks))
    with pytest.raises(B.BenchFailed, match="CRC32C"):
        B.seq_read(path, size, io, crc)

    Path(path).write_bytes(original[:-1])                         # one byte short
    with pytest.raises(B.BenchFailed, match=f"read back {size - 1} bytes of the {size}"):
        B.seq_read(path, size, io, crc)


@pytest.mark.slow
def test_cp_tree_is_deterministic_and_the_copy_is_checked(tmp_path):
    one = B.build_tree(str(tmp_path / "one"), 250)
    two = B.build_tree(str(tmp_path / "two"), 250)
    assert one.sizes == two.sizes and one.dirs == 3 and one.files == 250
    assert all(B.TREE_MIN_FILE <= s <= B.TREE_MAX_FILE for s in one.sizes.values())
    assert B.tree_sizes(one.root) == one.sizes
    assert len({os.path.dirname(rel) for rel in one.sizes}) == 3
    result = B.copy_tree(one, str(tmp_path / "copy"))
    assert result["files"] == 250 and result["bytes"] == one.total
    assert not (tmp_path / "copy").exists()           # removed after the check
    victim = os.path.join(one.root, sorted(one.sizes)[7])
    os.unlink(victim)                                  # the source no longer matches
    with pytest.raises(B.BenchFailed, match="1 missing"):
        B.copy_tree(one, str(tmp_path / "copy2"))


def test_ratios_divide_by_the_baseline():
    base = {"seq-write": {"bytes": 10, "mbps": 200.0, "seconds": 1.0},
            "stat": {"ops": 5, "ops_per_s": 1000.0, "p50_ms": 0.5, "p99_ms": 0.0}}
    mine = {"seq-write": {"bytes": 10, "mbps": 50.0, "seconds": 4.0},
            "stat": {"ops": 5, "ops_per_s": 250.0, "p50_ms": 2.0, "p99_ms": 1.0}}
    r = B.ratios(mine, base)
    assert r["seq-write"] == {"mbps": 0.25, "seconds": 4.0}
    assert r["stat"] == {"ops_per_s": 0.25, "p50_ms": 4.0, "p99_ms": None}


def test_patch_phase_writes_inside_files_and_checks_them(tmp_path, monkeypatch):
    """``--phase patch``: random page writes and a 1 MiB write in the middle of a big
    file, each fsynced, read back; smaller files here than the bench's."""
    monkeypatch.setattr(B, "PATCH_FILE", 1 << 20)
    monkeypatch.setattr(B, "PATCH_BIG", 8 << 20)
    monkeypatch.setattr(B, "PATCH_OPS", 20)
    result = B.patch_writes(str(tmp_path))
    assert result["ops"] == 20
    assert 0 < result["pwrite4k_fsync_p50_ms"] <= result["pwrite4k_fsync_p99_ms"]
    assert result["mid1m_fsync_ms"] > 0
    assert os.listdir(tmp_path) == []
    assert "patch" in B.PHASES and "patch" not in B.DEFAULT_PHASES
