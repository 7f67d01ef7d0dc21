"""The suite's own rules (tests/conftest.py, tests/harness.py): a logged error fails the test
that caused it; a test that starts server processes is marked slow. Small test files run in
a pytest subprocess with this conftest, and their outcomes are read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import log_findings

TESTS = Path(__file__).resolve().parent


def run_pytest(tmp_path: Path, source: str) -> tuple[dict, str]:
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rA", "test_inner.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    outcomes = {}
    for line in proc.stdout.splitlines():
        for word in ("PASSED", "FAILED", "ERROR"):
            if line.startswith(word + " "):
                name = line.split()[1].split("::")[-1]
                outcomes.setdefault(name, set()).add(word)
    return outcomes, proc.stdout


INNER = '''
import logging, pytest
from harness import LOG_WATCH

log = logging.getLogger("meta.server")

def test_clean():
    log.info("all fine")
    log.warning("a warning without a traceback is fine")

def test_error_record_fails():
    log.error("handler crashed on %s", "/x")

def test_warning_with_traceback_fails():
    try:
        raise ValueError("boom")
    except ValueError:
        log.warning("lost", exc_info=True)

@pytest.mark.allow_log_errors(r"handler crashed on /y", reason="the test provokes it")
def test_allowed_by_marker():
    log.error("handler crashed on %s", "/y")

@pytest.mark.allow_log_errors(r"handler crashed on /y", reason="not this one")
def test_marker_allows_only_its_pattern():
    log.error("handler crashed on %s", "/z")

def test_allowed_by_fixture(allow_log_errors):
    allow_log_errors(r"crashed on /w")
    log.error("handler crashed on %s", "/w")

def test_server_log_file_error_fails(tmp_path):
    LOG_WATCH.watch(tmp_path)
    (tmp_path / "meta.log").write_text(
        "2026-01-01 00:00:00,000 INFO meta.server: up\\n"
        "2026-01-01 00:00:01,000 ERROR meta.server: journal sync failed\\n")

def test_server_log_file_traceback_fails(tmp_path):
    LOG_WATCH.watch(tmp_path)
    (tmp_path / "storage0.log").write_text(
        "Traceback (most recent call last):\\n  File \\"x\\", line 1\\nKeyError: 'k'\\n")

@pytest.fixture
def noisy_teardown():
    yield
    log.error("stopping went wrong")

def test_error_in_teardown_fails_the_teardown(noisy_teardown):
    pass

def test_process_cluster_unmarked(tmp_path):
    from harness import ProcessCluster
    ProcessCluster(tmp_path)

@pytest.mark.slow
def test_process_cluster_marked_slow(tmp_path):
    from harness import ProcessCluster
    ProcessCluster(tmp_path)  # constructing it starts nothing yet
'''


def test_logged_errors_fail_the_test_unless_declared(tmp_path):
    outcomes, out = run_pytest(tmp_path, INNER)
    assert outcomes["test_clean"] == {"PASSED"}, out
    assert outcomes["test_error_record_fails"] == {"FAILED"}, out
    assert "handler crashed on /x" in out
    assert outcomes["test_warning_with_traceback_fails"] == {"FAILED"}, out
    assert "Traceback: ValueError: boom" in out
    assert outcomes["test_allowed_by_marker"] == {"PASSED"}, out
    assert outcomes["test_marker_allows_only_its_pattern"] == {"FAILED"}, out
    assert outcomes["test_allowed_by_fixture"] == {"PASSED"}, out
    assert outcomes["test_server_log_file_error_fails"] == {"FAILED"}, out
    assert "meta.log: 2026-01-01 00:00:01,000 ERROR meta.server: journal sync failed" in out
    assert outcomes["test_server_log_file_traceback_fails"] == {"FAILED"}, out
    assert "storage0.log: Traceback: KeyError: 'k'" in out
    assert outcomes["test_error_in_teardown_fails_the_teardown"] == {"PASSED", "ERROR"}, out
    assert outcomes["test_process_cluster_unmarked"] == {"FAILED"}, out
    assert "test_process_cluster_unmarked starts server processes (ProcessCluster): " \
           "mark it @pytest.mark.slow" in out
    assert outcomes["test_process_cluster_marked_slow"] == {"PASSED"}, out


def test_server_log_findings_join_a_traceback_to_its_log_line():
    lines = [
        "2026-11-23 03:00:00,000 INFO meta.server: hello",
        "2026-11-23 03:00:00,001 ERROR meta.server: handler failed",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        '    raise ValueError("bad")',
        "ValueError: bad",
        "2026-11-23 03:00:00,002 WARNING fs.rpc: lost",
        "  + Exception Group Traceback (most recent call last):",
        "  | ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)",
        "  +-+---------------- 1 ----------------",
        "    | Traceback (most recent call last):",
        "    |     raise",
        "    | fs.errors.NotDirectory: /f/x: /f is not a directory",
        "    +------------------------------------",
        "2026-11-23 03:00:00,003 INFO meta.server: fine",
    ]
    assert log_findings(lines) == [
        "2026-11-23 03:00:00,001 ERROR meta.server: handler failed | Traceback: ValueError: bad",
        "2026-11-23 03:00:00,002 WARNING fs.rpc: lost | Traceback: "
        "fs.errors.NotDirectory: /f/x: /f is not a directory",
    ]
