"""Two daemonized mounts stacked on one folder: each command and each exit acts on the mount
the path resolves to now (the topmost), never on the other one; a daemonized mount logs to a
default file it names when it starts."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import ProcessCluster, leasefs, poll_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("fusermount3") is None, reason="no FUSE")]


@pytest.fixture
def cluster(tmp_path):
    c = ProcessCluster(tmp_path / "cluster", n_storage=1, settings={"replication": 1})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def mount(cluster, mp: Path) -> int:
    """``leasefs mount MP`` (daemonized, no --log-file): the new mount process's pid."""
    before = set(pids_of(cluster, mp))
    result = leasefs(cluster, "mount", mp)
    assert result.returncode == 0, result.stderr
    found = re.search(r"\(log: (\S+)\)", result.stdout)
    assert found and Path(found.group(1)).is_file(), result.stdout
    assert found.group(1).startswith(str(cluster.base / "home" / "logs")), result.stdout
    new = poll_until(lambda: set(pids_of(cluster, mp)) - before, timeout=10)
    assert len(new) == 1, (new, result.stdout)
    return new.pop()


def pids_of(cluster, mp: Path) -> list[int]:
    """The mount processes registered for ``mp``."""
    out = []
    for line in (cluster.base / "home" / "mounts").glob("*.pid"):
        pid, _, rest = line.read_text().partition(" ")
        if rest.strip().endswith(str(mp)) and os.path.exists(f"/proc/{pid}"):
            out.append(int(pid))
    return out


def exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_stacked_mounts_each_stop_only_their_own(cluster):
    mp = Path(tempfile.mkdtemp(prefix="leasefs-stacked-"))
    held = None
    try:
        # the lower one is told to stop (SIGTERM): the upper one serves on
        lower = mount(cluster, mp)
        upper = mount(cluster, mp)
        os.kill(lower, signal.SIGTERM)
        assert poll_until(lambda: exited(lower), timeout=30)
        (mp / "still").write_bytes(b"served by the upper mount")
        assert (mp / "still").read_bytes() == b"served by the upper mount"
        assert leasefs(cluster, "umount", mp).returncode == 0
        assert poll_until(lambda: exited(upper), timeout=30)
        subprocess.run(["umount", "-l", str(mp)], capture_output=True)  # the lower's remains

        # the upper one detached lazily (a file still open on it): --force stops the mount
        # the folder shows now, the lower one; the detached one ends at the last close
        lower = mount(cluster, mp)
        upper = mount(cluster, mp)
        held = open(mp / "open-on-upper", "wb")
        held.write(b"x")
        assert leasefs(cluster, "umount", "--lazy", mp).returncode == 0
        result = leasefs(cluster, "umount", "--force", mp)
        assert result.returncode == 0, result.stderr
        assert poll_until(lambda: exited(lower), timeout=30)
        assert not exited(upper)
        assert not os.path.ismount(mp)
        held.close()
        held = None
        assert poll_until(lambda: exited(upper), timeout=30)
        assert leasefs(cluster, "cat", "/open-on-upper").stdout == "x"
    finally:
        if held is not None:
            held.close()
        for pid in pids_of(cluster, mp):
            os.kill(pid, signal.SIGKILL)
        for _ in range(3):
            subprocess.run(["umount", "-l", str(mp)], capture_output=True)
        shutil.rmtree(mp, ignore_errors=True)
