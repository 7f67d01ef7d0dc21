"""Servers' data folders are their user's alone, whatever the umask (real processes).

The cluster lives under a folder every user may walk (0755), as a home folder often is:
only the data folders' own modes keep another local user (a real process of ``nobody``)
out of the replica files, the journal and the LevelDB store.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import ProcessCluster

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (to run a process as nobody)")]


@pytest.fixture
def open_base():
    """A folder others may walk into (pytest's own are 0700, which would hide the defect)."""
    base = Path(tempfile.mkdtemp(prefix="leasefs-datafolder-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)   # the usual one: the servers inherit it
    yield
    os.umask(old)


def not_private(folder: Path) -> list[str]:
    """Every folder under ``folder`` (itself too) not 0700 and every file not 0600."""
    out = []
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if stat.S_IMODE(info.st_mode) != want:
            out.append(f"{path} {stat.S_IMODE(info.st_mode):04o}")
    return out


def test_written_data_is_owner_only_and_hidden_from_other_users(open_base, umask_022):
    secret = b"secret bytes of a 0600 file\n"
    with ProcessCluster(open_base, n_storage=1, settings={"replication": 1}) as cluster:
        with cluster.client() as client:
            client.mkdirs("/private", permission=0o700)
            client.write_file("/private/big", secret * 10_000)   # past inline: replicas
            client.write_file("/private/small", secret)          # inline: in the journal
            client.set_permission("/private/big", 0o600)
        replicas = [p for p in (cluster.storage_dir(0) / "finalized").rglob("blk_*")
                    if not p.name.endswith(".meta")]
        assert replicas
        for folder in (cluster.meta_dir(), cluster.storage_dir(0)):
            assert not_private(folder) == []
        for path in (replicas[0], next((cluster.meta_dir() / "journal").iterdir())):
            read = subprocess.run([*AS_NOBODY, "cat", str(path)], capture_output=True,
                                  timeout=30)
            assert read.returncode != 0 and b"Permission denied" in read.stderr, path
            assert secret not in read.stdout


@pytest.mark.parametrize("role", ["meta", "storage"])
def test_server_refuses_a_data_folder_others_can_read(open_base, umask_022, role):
    data = open_base / role
    data.mkdir()
    os.chmod(data, 0o755)
    extra = ["--meta", "127.0.0.1:1"] if role == "storage" else ["--http-port", "0"]
    run = subprocess.run([sys.executable, "-m", "tools", role, "--data", str(data),
                          "--port", "0", "--set", "security=simple", *extra],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert f"{data} is open to other users (mode 0755)" in run.stderr
    assert f"chmod 700 {data}" in run.stderr
    assert "Traceback" not in run.stderr
    # the operator's folder is left as it was, nothing written into it
    assert stat.S_IMODE(data.stat().st_mode) == 0o755 and list(data.iterdir()) == []
