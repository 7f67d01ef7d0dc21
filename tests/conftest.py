"""Shared pytest setup: logging that shows server logs on failure, the harness on sys.path,
and the rule that a logged error fails the test that caused it.

The rule (as S3QL's test suite checks its logs): a log record of level ERROR or above, or
any record carrying a traceback, emitted in this process during a test (in-process servers
and clients), and an ERROR/CRITICAL line or a traceback written to a watched server log
file (``harness.LOG_WATCH``: every ``ProcessCluster``'s logs) fails that test. A test that
expects such errors says so, with the regular expressions (``re.search``) of the findings it
allows and why:

    @pytest.mark.allow_log_errors(r"block server .* failed", reason="the test kills it")

or, when the pattern is only known while the test runs, the ``allow_log_errors`` fixture:
``allow_log_errors(r"...")``. Records from setup and the test body fail the test itself;
those written during teardown (a cluster stopping) fail its teardown.

A test that starts real server processes (``harness.ProcessCluster``) must be marked
``slow``; the harness refuses to start them otherwise.

Async tests: ``async def test_...`` runs in its own ``trio.run`` with its async fixtures
(pytest-trio, ``trio_mode = true`` in pyproject.toml). A test that takes pytest-trio's
``autojump_clock`` fixture runs on trio's ``MockClock(autojump_threshold=0)``: sleeps and
timeouts pass in virtual time as soon as every task waits; ``mock_clock`` is a MockClock that
moves only when the test jumps it.

Clusters: the ``cluster`` fixture is an in-process cluster (``harness.inprocess_cluster``: a
metadata server and block servers in the test's own trio run, ready), for async tests; the
``process_cluster`` fixture a started ``harness.ProcessCluster`` (a ``slow`` test's), stopped
after the test. ``@pytest.mark.cluster(**arguments)`` on the test, its class or its module
(``pytestmark``) passes the arguments of those constructors, the nearest mark winning per key:
``@pytest.mark.cluster(n_storage=1, replication=1)`` (settings as keywords) for ``cluster``,
``@pytest.mark.cluster(n_storage=0, settings={...})`` for ``process_cluster``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fs.errors import sole_exception  # noqa: E402
import harness  # noqa: E402
from harness import LOG_WATCH, ProcessCluster, inprocess_cluster  # noqa: E402

logging.basicConfig(level=logging.INFO,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")

_ALLOWED = pytest.StashKey[list]()


class _ErrorRecords(logging.Handler):
    """Keeps the text of every ERROR+ record and every record with a traceback."""

    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not record.exc_info:
            return
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
        except Exception:  # a bad format string is a finding too
            text = f"{record.levelname} {record.name}: {record.msg!r} (unformattable)"
        if record.exc_info and record.exc_info[1] is not None:
            exc = sole_exception(record.exc_info[1])
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            text += f" | Traceback: {last}"
        self.found.append(text)

    def take(self) -> list[str]:
        found, self.found = self.found, []
        return found


_RECORDS = _ErrorRecords()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster(**arguments): the arguments of the cluster or process_cluster "
        "fixture's cluster (harness.inprocess_cluster, harness.ProcessCluster)")
    config.addinivalue_line(
        "markers", "allow_log_errors(*patterns, reason): logged errors (ERROR records, server "
        "log ERROR lines, tracebacks) matching one of the regular expressions are expected")
    logging.getLogger().addHandler(_RECORDS)


def pytest_unconfigure(config):
    logging.getLogger().removeHandler(_RECORDS)


def _allowed_patterns(item) -> list[str]:
    patterns = list(item.stash.get(_ALLOWED, []))
    for marker in item.iter_markers("allow_log_errors"):
        if not marker.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: allow_log_errors needs reason=...")
        patterns += marker.args
    return patterns


def _unexpected(item) -> list[str]:
    found = _RECORDS.take() + LOG_WATCH.scan()
    patterns = _allowed_patterns(item)
    return [text for text in found if not any(re.search(p, text) for p in patterns)]


def _complaint(item, found: list[str], when: str) -> str:
    shown = "\n  ".join(text[:500] for text in found[:20])
    more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
    return (f"{len(found)} logged error(s)/traceback(s) {when} {item.name}; fix the cause, or "
            f"declare them with @pytest.mark.allow_log_errors(pattern, reason=...):\n  "
            f"{shown}{more}")


@pytest.fixture
def allow_log_errors(request):
    """``allow_log_errors(pattern, ...)``: allow matching findings for the rest of this test."""
    def allow(*patterns: str) -> None:
        request.node.stash.setdefault(_ALLOWED, []).extend(patterns)
    return allow


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _RECORDS.take()  # what earlier tests' leftovers logged between tests is not this test's
    LOG_WATCH.scan()
    harness.RUNNING_TEST = (item.nodeid, item.get_closest_marker("slow") is not None)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    try:
        result = yield
    except BaseException:  # a failed test keeps its own failure; its logs are in the report
        _RECORDS.take()
        LOG_WATCH.scan()
        raise
    found = _unexpected(item)
    if found:
        pytest.fail(_complaint(item, found, "during"), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        result = yield
    finally:
        harness.RUNNING_TEST = None
        harness.release_ports()
    found = _unexpected(item)
    if found:
        pytest.fail(_complaint(item, found, "while tearing down"), pytrace=False)
    return result


def _cluster_arguments(request) -> dict:
    """The keywords of every ``cluster`` mark on the test, its class and module; the nearest
    wins."""
    arguments: dict = {}
    for marker in reversed(list(request.node.iter_markers("cluster"))):
        if marker.args:
            raise pytest.UsageError(f"{request.node.nodeid}: cluster(...) takes keywords only")
        arguments.update(marker.kwargs)
    return arguments


@pytest.fixture
async def cluster(tmp_path, request):
    """An in-process cluster in ``tmp_path``, ready (every block server registered)."""
    async with inprocess_cluster(tmp_path, **_cluster_arguments(request)) as running:
        yield running


@pytest.fixture
def process_cluster(tmp_path, request):
    """A ``ProcessCluster`` in ``tmp_path``, started and ready; stopped after the test."""
    with ProcessCluster(tmp_path, **_cluster_arguments(request)) as running:
        yield running


@pytest.fixture(autouse=True)
def _umask_kept():
    """A test that changes the process's umask (a server command run in-process) would hand
    it to every process later tests start: it fails here, where it happened."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the test left the process umask at {after:04o} (was {before:04o})"
