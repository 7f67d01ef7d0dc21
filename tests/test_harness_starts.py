"""A cluster start that fails names its cause, and leaves no server running.

The harness starts servers as real processes whose stdout and stderr go to a log; when one
exits before reporting its address, the failure must say why: the port it could not bind
(which one of a block server's three, and from which setting), or, when the process wrote
nothing at all, its exit status and command. A failed start stops the servers that had
started (``__exit__`` does not run when ``__enter__`` raises).
"""

from __future__ import annotations

import socket
import sys

import pytest

from harness import PortTaken, ProcessCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class _Silent:
    """A placement that runs block server 0 as ``script`` (by default a process exiting 1
    without a word, as one whose writes to its log failed would look); the others as
    given."""

    def __init__(self, script: str = "import sys; sys.exit(1)"):
        self.script = script

    def command(self, name: str, argv: list[str]) -> list[str]:
        if name == "storage0":
            return [sys.executable, "-c", self.script]
        return argv

    def bind_host(self, name: str) -> str:
        return "127.0.0.1"


def _stopped(cluster: ProcessCluster) -> list[str]:
    """The servers of ``cluster`` still running."""
    return [name for name, proc in cluster.procs.items() if proc.poll() is None]


@pytest.mark.allow_log_errors(r"block server failed: Address already in use",
                              reason="the test takes the block server's HDFS port")
def test_a_taken_hdfs_port_is_named_with_its_setting_and_nothing_is_left_running(tmp_path):
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cluster = ProcessCluster(tmp_path, n_storage=1, settings={
            "security": "simple", "storage_hdfs_port": port})
        with pytest.raises(RuntimeError) as failed:
            with cluster:
                pass
    text = str(failed.value)
    # not its --port: moving that (PortTaken's retry) cannot help
    assert not isinstance(failed.value, PortTaken), text
    assert f"127.0.0.1:{port} (storage_hdfs_port" in text, text
    assert _stopped(cluster) == [], text


def test_a_server_that_exits_without_a_word_is_named_with_status_log_and_command(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=1, settings={"security": "simple"},
                             placement=_Silent())
    with pytest.raises(RuntimeError) as failed:
        with cluster:
            pass
    text = str(failed.value)
    log = tmp_path / "logs" / "storage0.log"
    assert f"storage0 exited with status 1 before writing anything to {log}" in text, text
    assert "sys.exit(1)" in text, text      # the command it ran
    assert _stopped(cluster) == [], text


def test_a_server_whose_log_vanished_is_named_with_why_it_could_not_be_read(tmp_path):
    logs = tmp_path / "logs"
    cluster = ProcessCluster(tmp_path, n_storage=1, settings={"security": "simple"},
                             placement=_Silent(f"import shutil, sys; shutil.rmtree({str(logs)!r}); "
                                               f"sys.exit(1)"))
    with pytest.raises(RuntimeError) as failed:
        with cluster:
            pass
    text = str(failed.value)
    assert "storage0 exited with status 1" in text, text
    assert f"its log {logs / 'storage0.log'} could not be read" in text, text
    assert "No such file or directory" in text, text
    assert _stopped(cluster) == [], text
