"""POSIX behaviour of the FUSE mount that needs real mounts: two mount processes of one
process cluster are two clients (each its own lease holder). Covers what tools like rsync
do (times set on a closed temp file just before its rename), one client's ``O_TRUNC``
against another client's lease, deep trees, link counts, per-file settings of the mount,
growing truncates, and who holds a file's lease: the open file until its last writer's
release (not a flush of a descriptor's copy, not a reader), also after a failed close or
a non-owner's write to a setuid file.

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

from harness import (REPO, Mount, ProcessCluster, errno_of, mounted,  # noqa: E402
                     poll_until)

MiB = 1 << 20
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountclients")
    settings = {"replication": 2, "block_size": MiB, "max_blocks_per_file": 24}  # files <= 24 MiB
    with ProcessCluster(base, n_storage=2, settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def one(cluster):
    yield from mounted(cluster, "one")


@pytest.fixture(scope="module")
def two(cluster):
    yield from mounted(cluster, "two")




# ------------------------------------------------------------------ times before a rename

def test_times_set_on_a_closed_temp_file_survive_its_rename(cluster, one, tmp_path):
    """rsync's pattern for every file: write a temp file, close it, set its mode and times,
    rename it. The mount completes the file after the close (asynchronous release) while
    those calls run; the times set in between must be what the file keeps, under its new
    name, so a second ``rsync -a`` finds nothing to transfer."""
    src = tmp_path / "src"
    src.mkdir()
    base_ns = 1_600_000_000 * 10**9
    count = 200
    wanted = {}
    for i in range(count):
        f = src / f"f{i:03d}"
        f.write_bytes(os.urandom(100 + 37 * i))
        os.utime(f, ns=(base_ns, base_ns + i * 10**9))
        wanted[f.name] = base_ns + i * 10**9
    first = subprocess.run(["rsync", "-a", "--stats", f"{src}/", str(one.mp / "rsynced")],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert f"Number of regular files transferred: {count}" in first.stdout, first.stdout

    def server_times():
        with cluster.client() as client:
            entries = client.list_status("/rsynced")
        if any(e.under_construction for e in entries):
            return None
        return {e.name: e.mtime_ns for e in entries}

    # every release has completed its file (nothing under construction) and set its times
    # again afterwards; a lost update never comes back, so the wait is bounded
    got = poll_until(lambda: (t := server_times()) == wanted and t) or server_times()
    assert got == wanted
    second = subprocess.run(["rsync", "-a", "--stats", f"{src}/", str(one.mp / "rsynced")],
                            capture_output=True, text=True, timeout=300)
    assert "Number of regular files transferred: 0" in second.stdout, second.stdout
    assert "release of inode" not in one.log.read_text(errors="replace"), one.log_text()


# ------------------------------------------------------------------ small files close whole

def test_a_small_file_is_readable_when_close_returns_and_complete_at_release(cluster, one,
                                                                             two):
    """create, write, close (cp, tar, git): the close(2) publishes every byte (another
    client reads them when it returns), and the release that follows completes the file:
    kept in the namespace up to inline_max, past it in one block (a file closed empty has
    none). A flush is not a release: closing a copy of the descriptor (dup, fork + exec)
    keeps the file open under the lease, and the next write appends."""
    with cluster.client() as client:
        inline_max = client.config.inline_max   # the server's, as every client takes it
        for i, size in enumerate([1, 997, 4096, 30_000, inline_max, inline_max + 1, 200_000]):
            data = os.urandom(size)
            (one.mp / f"small{i}").write_bytes(data)
            assert client.read_file(f"/small{i}") == data
            assert (two.mp / f"small{i}").read_bytes() == data
            assert poll_until(lambda: client.is_file_closed(f"/small{i}"))
            located = client.get_block_locations(f"/small{i}")
            if size <= inline_max:   # no block: the complete carried the bytes
                assert located["blocks"] == [] and bytes(located["inline"]) == data
            else:                    # one block, every byte
                assert [b["block"]["num_bytes"] for b in located["blocks"]] == [size]
        # a file closed empty: closed, no block
        (one.mp / "touched").touch()
        assert poll_until(lambda: client.is_file_closed("/touched"))
        assert client.get_block_locations("/touched")["blocks"] == []
        assert (two.mp / "touched").stat().st_size == 0
        fd = os.open(one.mp / "inherited", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"parent ")
            os.close(os.dup(fd))
            assert client.read_file("/inherited") == b"parent "
            assert not client.is_file_closed("/inherited")   # still under our lease
            os.write(fd, b"and child")
        finally:
            os.close(fd)
        assert poll_until(lambda: client.is_file_closed("/inherited"))
        assert client.read_file("/inherited") == b"parent and child"
        located = client.get_block_locations("/inherited")   # still small: inline
        assert located["blocks"] == [] and bytes(located["inline"]) == b"parent and child"
    assert (two.mp / "inherited").read_bytes() == b"parent and child"


def test_tar_attributes_set_while_writing_hold_here_and_reach_the_cluster(cluster, one, two):
    """tar's calls for each file: create, write, futimens, fchown, fchmod, close. Times and
    mode of a file being written are kept by the mount (the completion would replace the
    times) and answered at once; fsync and the close set them on the cluster, where they
    stay after the completion. A chown to the owner it has changes nothing; to another
    owner it does."""
    stamp = 1_500_000_000 * 10**9
    fd = os.open(one.mp / "tarred", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"x" * 5000)
        os.utime(fd, ns=(stamp + 7, stamp))
        os.fchown(fd, os.getuid(), os.getgid())
        os.fchmod(fd, 0o644)
        st = os.fstat(fd)
        assert (st.st_mtime_ns, st.st_atime_ns, st.st_mode & 0o777) == (stamp, stamp + 7, 0o644)
        assert os.stat(one.mp / "tarred").st_mtime_ns == stamp
        os.fsync(fd)
        with cluster.client() as client:
            status = client.get_file_status("/tarred")
            assert (status.mtime_ns, status.mode) == (stamp, 0o644)
        os.fchmod(fd, 0o640)
        assert os.fstat(fd).st_mode & 0o777 == 0o640
        os.fchown(fd, 4321, -1)
        assert os.fstat(fd).st_uid == 4321
    finally:
        os.close(fd)
    with cluster.client() as client:
        # fsynced, so on the block servers before its close: completed at release
        assert poll_until(lambda: client.is_file_closed("/tarred"))
        status = client.get_file_status("/tarred")
        assert (status.mtime_ns, status.atime_ns, status.mode) == (stamp, stamp + 7, 0o640)
        assert client.read_file("/tarred") == b"x" * 5000
    st = os.stat(two.mp / "tarred")
    assert (st.st_mtime_ns, st.st_uid, st.st_size) == (stamp, 4321, 5000)


# ------------------------------------------------------------------ O_TRUNC against a lease

def test_truncating_open_of_a_file_another_mount_writes_is_ebusy(cluster, one, two):
    """The lease protects its writer: another client's O_TRUNC open (or truncate(2)) of
    the file is refused with EBUSY, as its append and read-write opens are, and the
    writer's fsynced bytes, later writes, fsync and close all stand."""
    fd = os.open(one.mp / "leased.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"first line\n")
        os.fsync(fd)
        target = two.mp / "leased.log"
        assert errno_of(os.open, target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) == errno.EBUSY
        assert errno_of(os.open, target, os.O_RDWR | os.O_TRUNC) == errno.EBUSY
        assert errno_of(os.truncate, target, 0) == errno.EBUSY
        assert errno_of(os.truncate, target, 4) == errno.EBUSY
        with open(target, "rb") as fh:   # readers are welcome
            assert fh.read() == b"first line\n"
        os.write(fd, b"second line\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    want = b"first line\nsecond line\n"
    with cluster.client() as client:
        assert client.read_file("/leased.log") == want
        assert poll_until(lambda: client.is_file_closed("/leased.log"))
    # once the writer closed it, the other mount may truncate it as usual
    with open(two.mp / "leased.log", "wb") as fh:
        fh.write(b"new")
    with cluster.client() as client:
        assert client.read_file("/leased.log") == b"new"


def test_a_staged_file_stays_leased_to_its_writer(cluster, one, two):
    """A random write moves a file to the mount's local staging file; its writer keeps the
    lease all along (fsync uploads it under the lease), so another client's open for
    writing is EBUSY until the writer closes it, and nothing replaces that client's file."""
    (one.mp / "contended.bin").write_bytes(b"0123456789")
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed("/contended.bin"))
    other = two.mp / "contended.bin"
    fd = os.open(one.mp / "contended.bin", os.O_RDWR)
    try:
        os.pwrite(fd, b"AB", 2)                    # not at the end: staged in mount one
        assert errno_of(os.open, other, os.O_WRONLY | os.O_APPEND) == errno.EBUSY
        os.fsync(fd)                               # uploaded, still leased
        with cluster.client() as client:
            assert client.read_file("/contended.bin") == b"01AB456789"
        assert errno_of(os.open, other, os.O_WRONLY | os.O_APPEND) == errno.EBUSY
        assert errno_of(os.open, other, os.O_WRONLY | os.O_TRUNC) == errno.EBUSY
        os.pwrite(fd, b"CD", 4)
    finally:
        os.close(fd)
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed("/contended.bin"))
        assert client.read_file("/contended.bin") == b"01ABCD6789"
    with open(other, "ab") as fh:                  # free once its writer closed it
        fh.write(b"-two")
    with cluster.client() as client:
        assert client.read_file("/contended.bin") == b"01ABCD6789-two"


@pytest.mark.parametrize("size", [300 << 10, 3 * MiB // 2])
def test_a_journal_written_synced_rewritten_in_place_and_deleted(cluster, one, two, size):
    """A database's rollback journal, per transaction: create, write (past inline_max, so
    through a pipeline), fsync, rewrite its header in place, fsync, more pages, fsync,
    close, delete. The in-place write moves it to the mount's staging file, from the bytes
    the mount kept of its stream (up to 1 MiB) or read back from the cluster (bigger); each
    fsync uploads it under the lease the writer never lets go. Another mount reads exactly
    the fsynced content each time and cannot open it for writing meanwhile."""
    journal, other = one.mp / f"db-{size}-journal", two.mp / f"db-{size}-journal"
    name = f"/db-{size}-journal"
    body = os.urandom(size)
    fd = os.open(journal, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
        with cluster.client() as client:
            assert client.read_file(name) == body
        os.pwrite(fd, b"HEADER!!", 0)
        expected = b"HEADER!!" + body[8:]
        assert os.pread(fd, 64, 0) == expected[:64]
        os.fsync(fd)
        with cluster.client() as client:
            assert client.read_file(name) == expected
        assert errno_of(os.open, other, os.O_WRONLY | os.O_APPEND) == errno.EBUSY
        pages = os.urandom(200 << 10)
        os.pwrite(fd, pages, size - 4096)              # over the end: the file grows
        expected = expected[:size - 4096] + pages
        os.fsync(fd)
        with cluster.client() as client:
            assert client.read_file(name) == expected
        assert os.pread(fd, len(expected) + 10, 0) == expected
    finally:
        os.close(fd)
    assert other.read_bytes() == expected
    os.unlink(journal)
    with cluster.client() as client:
        assert not client.exists(name)
    assert "release of inode" not in one.log_text()


# ------------------------------------------------------------------ deep trees

def test_deep_tree_past_path_max_through_relative_paths(cluster, one):
    """PATH_MAX (4096) limits one system call's argument, not a tree: a shell that cd's
    down level by level builds a 7000-character path; the namespace allows 8000 characters
    (HDFS) and refuses more with ENAMETOOLONG. Names stay at most 255 bytes."""
    name = "d" * 199
    levels = 35                           # 35 * 200 = 7000 characters
    script = (f"cd {one.mp} && mkdir deep && cd deep && "
              f"for i in $(seq {levels}); do mkdir {name} && cd -P {name} || exit 1; done && "
              "echo 'at the bottom' > file && cat file && ls")
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "at the bottom\nfile\n"
    bottom = "/deep" + ("/" + name) * levels
    assert len(bottom) == 7005
    with cluster.client() as client:
        assert client.read_file(bottom + "/file") == b"at the bottom\n"

    # walk down with directory descriptors and go on to the limit
    fds = [os.open(one.mp / "deep", os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for _ in range(levels):
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        assert os.listdir(fds[-1]) == ["file"]
        for _ in range(4):                 # 7805 characters
            os.mkdir(name, dir_fd=fds[-1])
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        used = len(bottom) + 4 * 200
        assert errno_of(os.mkdir, "x" * (8000 - used), dir_fd=fds[-1]) == errno.ENAMETOOLONG
        os.mkdir("x" * (8000 - used - 1), dir_fd=fds[-1])     # exactly 8000 characters
        assert errno_of(os.open, "f" * 255, os.O_WRONLY | os.O_CREAT, 0o644,
                         dir_fd=fds[-1]) == errno.ENAMETOOLONG
        assert errno_of(os.mkdir, "n" * 256, dir_fd=fds[0]) == errno.ENAMETOOLONG
    finally:
        for fd in fds:
            os.close(fd)
    with cluster.client() as client:
        deepest = bottom + ("/" + name) * 4 + "/" + "x" * (8000 - used - 1)
        assert len(deepest) == 8000
        assert client.get_file_status(deepest).is_dir
    subprocess.run(["rm", "-rf", str(one.mp / "deep")], check=True, timeout=120)
    assert not (one.mp / "deep").exists()


# ------------------------------------------------------------------ link counts

def test_link_counts_of_directories_and_unlinked_open_files(cluster, one, two):
    """A directory has 2 + (its subdirectories) links, as on ext4 (find's leaf
    optimisation and pjdfstest rely on it); a file unlinked while open has 0."""
    d = one.mp / "links"
    d.mkdir()
    assert os.stat(d).st_nlink == 2
    (d / "a").mkdir()
    (d / "b").mkdir()
    (d / "b" / "inner").mkdir()
    (d / "file").write_bytes(b"x")
    assert os.stat(d).st_nlink == 4
    assert os.stat(d / "b").st_nlink == 3
    assert os.stat(d / "file").st_nlink == 1
    (d / "other").mkdir()
    assert os.stat(d).st_nlink == 5
    os.rename(d / "b", d / "other" / "b")             # across directories
    assert (os.stat(d).st_nlink, os.stat(d / "other").st_nlink) == (4, 3)
    os.rmdir(d / "a")
    assert os.stat(d).st_nlink == 3
    # another client sees the same counts
    assert os.stat(two.mp / "links").st_nlink == 3
    assert os.stat(two.mp / "links" / "other").st_nlink == 3
    subprocess.run(["rm", "-rf", str(d / "other")], check=True, timeout=60)
    assert os.stat(d).st_nlink == 2

    fd = os.open(d / "file", os.O_RDWR)
    try:
        os.unlink(d / "file")
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 10, 0) == b"x"
    finally:
        os.close(fd)


# ------------------------------------------------------------------ per-file settings

def _replica_chunk(cluster, block_id: int) -> set[int]:
    """bytes_per_checksum in the meta headers of ``block_id``'s replicas on disk."""
    from storage.replicas import META_HEADER, decode_meta_header

    found = set()
    for i in range(cluster.n_storage):
        for meta in cluster.storage_dir(i).rglob(f"blk_{block_id}_*.meta"):
            with open(meta, "rb") as fh:
                found.add(decode_meta_header(fh.read(META_HEADER.size)))
    return found


def test_block_size_replication_and_checksum_chunk_set_for_the_mount_apply(cluster, one):
    m = Mount(cluster, "chooser", "--set", f"block_size={2 * MiB}", "--set", "replication=1",
              "--set", "bytes_per_checksum=512")
    try:
        m.start()
        data = os.urandom(5 * MiB + 77)
        (m.mp / "chosen.bin").write_bytes(data)
        (one.mp / "defaults.bin").write_bytes(b"d" * 1000)
        assert (m.mp / "chosen.bin").read_bytes() == data
        with cluster.client() as client:
            chosen = client.get_file_status("/chosen.bin")
            assert (chosen.block_size, chosen.replication) == (2 * MiB, 1)
            located = client.get_block_locations("/chosen.bin")["blocks"]
            assert [b["block"]["num_bytes"] for b in located] == [2 * MiB, 2 * MiB, MiB + 77]
            assert all(len(b["locations"]) == 1 for b in located)
            assert _replica_chunk(cluster, located[0]["block"]["id"]) == {512}
            assert client.read_file("/chosen.bin") == data
            default = client.get_file_status("/defaults.bin")
            assert (default.block_size, default.replication) == (MiB, 2)
        m.stop()
    finally:
        m.cleanup()


def test_mount_refuses_a_checksum_chunk_its_block_size_cannot_hold(cluster, tmp_path):
    mp = tmp_path / "mp"
    mp.mkdir()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tools", "mount", str(mp), "--set", f"block_size={2 * MiB}",
             "--set", "bytes_per_checksum=3000"],
            env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        if os.path.ismount(mp):
            subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True)
    assert result.returncode == 1
    assert "bytes_per_checksum 3000" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.ismount(mp)


# ------------------------------------------------------------------ growing truncates

def test_growing_truncate_streams_zeros_instead_of_staging(cluster):
    """truncate/ftruncate to a larger size append zeros through the pipeline: a size past
    the mount's staging cache (1 MiB here) works; past the largest file (24 blocks of
    1 MiB in this cluster) it is EFBIG and the file keeps its content."""
    m = Mount(cluster, "grower", "--set", f"mount_cache_limit={MiB}")
    try:
        m.start()
        f = m.mp / "grown.bin"
        f.write_bytes(b"head")
        os.truncate(f, 5 * MiB)                                   # by path, file closed
        assert os.stat(f).st_size == 5 * MiB
        with cluster.client() as client:
            assert client.read_file("/grown.bin") == b"head" + bytes(5 * MiB - 4)
        fd = os.open(f, os.O_RDWR)
        try:
            os.ftruncate(fd, 9 * MiB)                             # by handle, open for write
            assert os.fstat(fd).st_size == 9 * MiB
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, b"tail")
        finally:
            os.close(fd)
        with cluster.client() as client:
            data = client.read_file("/grown.bin")
        assert (len(data), data[:4], data[-4:]) == (9 * MiB + 4, b"head", b"tail")
        assert data[4:-4] == bytes(9 * MiB - 4)
        subprocess.run(["truncate", "-s", "16M", str(f)], check=True, timeout=120)
        assert os.stat(f).st_size == 16 * MiB

        assert errno_of(os.truncate, f, 24 * MiB + 1) == errno.EFBIG
        result = subprocess.run(["truncate", "-s", "1G", str(f)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode != 0 and "too large" in result.stderr.lower(), result.stderr
        assert os.stat(f).st_size == 16 * MiB
        with cluster.client() as client:   # (the last release completes it asynchronously)
            assert poll_until(lambda: client.is_file_closed("/grown.bin"))
            assert client.get_file_status("/grown.bin").length == 16 * MiB
        m.stop()
    finally:
        m.cleanup()


def test_truncate_of_a_file_open_here_uses_its_current_length(cluster, one):
    """A file open read-only here and appended to by another client meanwhile: truncate(2)
    to a size between the length seen at open and the real one shortens it."""
    f = one.mp / "appended-elsewhere.txt"
    f.write_bytes(b"0123456789")
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed("/appended-elsewhere.txt"))
    fd = os.open(f, os.O_RDONLY)
    try:
        with cluster.client() as client:
            out = client.append("/appended-elsewhere.txt")
            out.write(b"abcdefghij")
            out.close()
        os.truncate(f, 15)
        with cluster.client() as client:
            assert client.read_file("/appended-elsewhere.txt") == b"0123456789abcde"
    finally:
        os.close(fd)


# ------------------------------------------------------------------ a flush is not a release
# The lease and the open file's state belong to the open file until its last writing
# descriptor closes. A FUSE FLUSH (every close(2), also of a copy a child inherited or a
# dup) publishes what was written but never completes the file; the RELEASE of the last
# writer does, even while read-only descriptors stay open on the writer's mount. A close
# that fails never leaves the file under construction. ``nobody`` writes with setpriv.

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

@pytest.mark.parametrize("mode", [0o4777, 0o2777, 0o6777], ids=oct)
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


def test_a_file_another_mount_appended_to_is_read_whole_at_the_next_open(one, two):
    """Close-to-open across mounts: one's kernel has the file's size from a stat; two
    appends and closes; one's next open and read, within the kernel's attribute time,
    get the whole new content (not the length one's kernel had cached)."""
    path = one.mp / "c2o-append"
    path.write_bytes(b"first " * 100)
    for _ in range(3):
        before = path.read_bytes()
        assert os.stat(path).st_size == len(before)
        with open(two.mp / "c2o-append", "ab") as f:
            f.write(b"more " * 50)
        assert path.read_bytes() == before + b"more " * 50


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
