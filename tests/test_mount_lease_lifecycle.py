"""Who holds a file's lease through the mount, on real mounts: the lease and the open
file's state belong to the open file until its last writing descriptor closes. A FUSE
FLUSH (every ``close(2)``, also of a copy a child inherited or a ``dup``) publishes what was
written but never completes the file; a RELEASE of the last writer does, even while
read-only descriptors of the file stay open on the writer's mount. A close that fails never
leaves the file under construction. Two mount processes of one process cluster are two
clients (each its own lease holder); ``nobody`` writes through the mount with ``setpriv``.

Skipped (with the reason) when pyfuse3, /dev/fuse or fusermount3 is missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import ProcessCluster, errno_of, mounted, poll_until  # noqa: E402

MiB = 1 << 20
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountlease")
    settings = {"replication": 2, "block_size": MiB}
    with ProcessCluster(base, n_storage=2, settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def one(cluster):
    yield from mounted(cluster, "one")


@pytest.fixture(scope="module")
def two(cluster):
    yield from mounted(cluster, "two")


def refused_to_other_writers(mount, name: str) -> None:
    """Every way another client could write ``name`` gets EBUSY: the file is leased."""
    target = mount.mp / name
    assert errno_of(os.open, target, os.O_WRONLY | os.O_TRUNC) == errno.EBUSY
    assert errno_of(os.open, target, os.O_WRONLY | os.O_APPEND) == errno.EBUSY
    assert errno_of(os.truncate, target, 0) == errno.EBUSY


def closed_with(cluster, path: str, want: bytes) -> None:
    """Once its last writer is released the file is complete, holding ``want``."""
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed(path)), client.list_open_files()
        assert client.read_file(path) == want


# ------------------------------------------------------------------ a flush is not a release

def test_a_shell_child_closing_its_copy_keeps_the_writers_lease(cluster, one, two):
    """``exec 3>>log`` then any command: the child inherits descriptor 3 and closes it when
    it exits. The shell's descriptor still writes the file: the other mount's ``>`` is
    refused (EBUSY), and the next ``>&3`` lands after the first line."""
    script = (f"exec 3>>{one.mp}/shell.log\n"
              "echo a1 >&3\n"
              "/bin/true\n"
              "sleep 1.5\n"
              f"echo b > {two.mp}/shell.log && echo REPLACED\n"
              "echo a2 >&3\n"
              "exec 3>&-\n")
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert "REPLACED" not in run.stdout, run.stderr
    assert "Device or resource busy" in run.stderr, run.stderr
    closed_with(cluster, "/shell.log", b"a1\na2\n")
    assert (two.mp / "shell.log").read_bytes() == b"a1\na2\n"


@pytest.mark.parametrize("size,fsync", [(3, False), (40_000, True), (100_000, False),
                                        (300_000, True)])
@pytest.mark.parametrize("closer", ["dup", "subprocess"])
def test_closing_a_copy_of_the_descriptor_keeps_the_lease(cluster, one, two, size, fsync,
                                                          closer):
    """A dup closed, or a Python child that inherited the descriptor exiting, FLUSHes the
    file but does not release it: small and inline (at most 64 KiB) files, flushed or not,
    and larger ones stay under construction under the writer's lease, readable with every
    byte written so far; the writer's next write appends."""
    name = f"copy-{closer}-{size}-{int(fsync)}"
    first, second = os.urandom(size), os.urandom(1000)
    fd = os.open(one.mp / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, first)
        if fsync:
            os.fsync(fd)
        if closer == "dup":
            os.close(os.dup(fd))
        else:
            subprocess.run([sys.executable, "-c", "pass"], pass_fds=(fd,), check=True)
        with cluster.client() as client:
            assert not client.is_file_closed(f"/{name}")
            assert client.read_file(f"/{name}") == first   # the flush published it
        refused_to_other_writers(two, name)
        os.write(fd, second)
    finally:
        os.close(fd)
    closed_with(cluster, f"/{name}", first + second)


# ------------------------------------------------------------------ a reader does not hold it

def test_a_reader_on_the_writers_mount_does_not_keep_the_lease(cluster, one, two):
    """``tail -f`` on the writer's mount: when the writer closes, the file is complete and
    published although the reader's descriptor stays open; the other mount sees its length
    and may append to it."""
    data = os.urandom(5000)
    writer = os.open(one.mp / "tailed.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    reader = os.open(one.mp / "tailed.log", os.O_RDONLY)
    try:
        os.write(writer, data)
        assert os.read(reader, 100) == data[:100]
        os.close(writer)
        closed_with(cluster, "/tailed.log", data)
        assert os.stat(two.mp / "tailed.log").st_size == len(data)
        with open(two.mp / "tailed.log", "ab") as fh:
            fh.write(b"from two")
        rest = b""
        while chunk := os.read(reader, 1 << 16):
            rest += chunk
        assert rest == data[100:] + b"from two"   # tail -f goes on
    finally:
        os.close(reader)
    closed_with(cluster, "/tailed.log", data + b"from two")


# ------------------------------------------------------------------ setuid files, failed closes

@pytest.mark.parametrize("mode", [0o4777, 0o2777, 0o6777])
def test_a_non_owners_write_clears_setuid_and_setgid_and_is_kept(cluster, one, two, mode):
    """POSIX: a write by a user who is not the owner clears setuid and setgid (the kernel
    asks with a mode change as the writer, pjdfstest chmod/12). The write and the close
    succeed, the bits are gone, and the file is complete (nothing left leased)."""
    name = f"setid-{mode:o}"
    path = one.mp / name
    path.write_bytes(b"")
    os.chmod(path, mode)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    run = subprocess.run([*AS_NOBODY, "sh", "-c", f"printf hello >> {path}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    closed_with(cluster, f"/{name}", b"hello")
    with cluster.client() as client:
        assert client.get_file_status(f"/{name}").mode == 0o777
    st = os.stat(two.mp / name)
    assert (st.st_size, stat.S_IMODE(st.st_mode)) == (5, 0o777)
    with open(two.mp / name, "ab") as fh:   # nobody's lease is left behind
        fh.write(b" again")
    closed_with(cluster, f"/{name}", b"hello again")


def test_a_failed_close_leaves_nothing_under_construction(cluster, one, two):
    """A close whose data the cluster refuses (the folder's space quota) reports the error
    to ``close(2)``, and the file is not left leased to the mount: it is closed with what the
    cluster holds, and another mount may write it."""
    with cluster.client() as client:
        client.mkdirs("/tight")
        client.set_quota("/tight", ds_quota=100)
    fd = os.open(one.mp / "tight" / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"x" * 1000)
    assert errno_of(os.close, fd) == errno.EDQUOT
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed("/tight/f")), \
            client.list_open_files()
        client.set_quota("/tight", ds_quota=-1)
    with open(two.mp / "tight" / "f", "wb") as fh:
        fh.write(b"fits now")
    closed_with(cluster, "/tight/f", b"fits now")
