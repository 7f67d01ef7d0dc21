"""Cluster-wide flock(2) and fcntl locks through real mounts: two mount processes of one
process cluster are two clients; a lock taken through one is seen through the other
(EWOULDBLOCK, a blocked F_SETLKW, F_GETLK naming the holder), goes at unlock, close and
when a killed mount's lease ends, and sqlite on both mounts of one database keeps it
whole.

Skipped (with the reason) when pyfuse3 lacks the lock handlers (``make install`` builds
it with deploy/pyfuse3-locks.patch), or /dev/fuse or fusermount3 is missing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not getattr(pyfuse3, "LOCK_HANDLERS", False):
    pytest.skip("pyfuse3 without the lock handlers (make install builds it with "
                "deploy/pyfuse3-locks.patch)", allow_module_level=True)
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import Mount, ProcessCluster, mounted, poll_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HARD_LIMIT = 3.0
LOCK_GRACE = 5.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountlocks")
    # a short lease: a killed mount's locks end within seconds
    settings = {"replication": 1, "lease_soft_limit": 1.0, "lease_hard_limit": HARD_LIMIT,
                "lease_monitor_period": 0.2, "lock_grace": LOCK_GRACE}
    with ProcessCluster(base, n_storage=1, settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def one(cluster):
    yield from mounted(cluster, "one")


@pytest.fixture(scope="module")
def two(cluster):
    yield from mounted(cluster, "two")


def flock_errno(path, op) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, op)
        return 0
    except OSError as exc:
        return exc.errno
    finally:
        os.close(fd)


class Holder:
    """A child process that takes a lock through a mount and keeps it until told (or
    killed): locks belong to processes, and the test's own must not be the holder."""

    def __init__(self, path, how: str):
        code = textwrap.dedent(f"""
            import fcntl, os, struct, sys
            fd = os.open({str(path)!r}, os.O_RDWR)
            {how}
            print("locked", flush=True)
            sys.stdin.readline()
            os.close(fd)
            print("closed", flush=True)
        """)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def close(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed"
        assert self.proc.wait(30) == 0

    def kill(self):
        self.proc.kill()
        self.proc.wait(30)


def test_flock_on_one_mount_blocks_the_other_until_unlock_and_close(one, two):
    (one.mp / "flocked").write_bytes(b"x")
    holder = Holder(one.mp / "flocked", "fcntl.flock(fd, fcntl.LOCK_EX)")
    try:
        assert flock_errno(two.mp / "flocked", fcntl.LOCK_EX | fcntl.LOCK_NB) == errno.EWOULDBLOCK
        assert flock_errno(two.mp / "flocked", fcntl.LOCK_SH | fcntl.LOCK_NB) == errno.EWOULDBLOCK
        # a blocking flock on the other mount waits for the close
        started = time.monotonic()
        waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os
            fd = os.open({str(two.mp / 'flocked')!r}, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("got it", flush=True)
        """)], stdout=subprocess.PIPE, text=True)
        # fixed-sleep: a blocked lock shows only as no progress; 1 s of it while the
        # holder keeps the lock
        time.sleep(1.0)
        assert waiter.poll() is None
        holder.close()
        assert waiter.communicate(timeout=30)[0].strip() == "got it"
        assert time.monotonic() - started >= 1.0
    finally:
        holder.kill()
    # shared locks share across mounts; an exclusive one waits for both
    a = os.open(one.mp / "flocked", os.O_RDONLY)
    b = os.open(two.mp / "flocked", os.O_RDONLY)
    try:
        fcntl.flock(a, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(b, fcntl.LOCK_SH | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(a, fcntl.LOCK_UN)
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)          # converted
        assert flock_errno(one.mp / "flocked", fcntl.LOCK_SH | fcntl.LOCK_NB) == errno.EWOULDBLOCK
    finally:
        os.close(a)
        os.close(b)
    # b's close released it (asynchronously, at the release of its open file)
    assert poll_until(lambda: flock_errno(one.mp / "flocked", fcntl.LOCK_EX | fcntl.LOCK_NB) == 0)


def getlk(fd, kind, start, length):
    """F_GETLK: (l_type, l_start, l_len, l_pid) of the lock in the way, l_type F_UNLCK if
    none."""
    packed = struct.pack("hhqqi", kind, os.SEEK_SET, start, length, 0)
    out = fcntl.fcntl(fd, fcntl.F_GETLK, packed)
    l_type, _whence, l_start, l_len, l_pid = struct.unpack("hhqqi", out)
    return l_type, l_start, l_len, l_pid


def test_fcntl_ranges_conflict_across_mounts_and_getlk_names_the_holder(one, two):
    (one.mp / "ranges").write_bytes(b"0" * 100)
    holder = Holder(one.mp / "ranges", "fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)")   # [0, 10)
    fd = os.open(two.mp / "ranges", os.O_RDWR)
    try:
        with pytest.raises(OSError) as info:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 5)      # [5, 15)
        assert info.value.errno in (errno.EAGAIN, errno.EACCES)
        with pytest.raises(OSError):
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 9)       # a reader too
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)         # [10, 20): free
        assert getlk(fd, fcntl.F_WRLCK, 0, 5) == (fcntl.F_WRLCK, 0, 10, holder.proc.pid)
        assert getlk(fd, fcntl.F_RDLCK, 20, 0)[0] == fcntl.F_UNLCK
        # the holder's range is taken once it unlocks (its close, here)
        holder.close()
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)            # all of it
        other = os.open(one.mp / "ranges", os.O_RDONLY)
        try:
            assert getlk(other, fcntl.F_RDLCK, 50, 1)[0] == fcntl.F_WRLCK
        finally:
            os.close(other)
    finally:
        holder.kill()
        os.close(fd)   # its close ends the test's locks: the other mount sees them go
    fd = os.open(one.mp / "ranges", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
    finally:
        os.close(fd)


def test_a_blocked_setlkw_goes_on_when_the_other_mount_unlocks(one, two):
    (one.mp / "waited").write_bytes(b"w")
    holder = Holder(one.mp / "waited", "fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)")
    try:
        waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os
            fd = os.open({str(two.mp / 'waited')!r}, os.O_RDWR)
            fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
            print("got it", flush=True)
        """)], stdout=subprocess.PIPE, text=True)
        # fixed-sleep: F_SETLKW blocked shows only as no progress; 1.5 s of it (more than
        # one of the mount's bounded waits) while the holder keeps the lock
        time.sleep(1.5)
        assert waiter.poll() is None
        holder.close()
        assert waiter.communicate(timeout=30)[0].strip() == "got it"
    finally:
        holder.kill()


def test_a_killed_mounts_locks_go_when_its_lease_ends(cluster, two):
    doomed = Mount(cluster, "doomed").start()
    try:
        (doomed.mp / "orphan").write_bytes(b"o")
        holder = Holder(doomed.mp / "orphan",
                        "fcntl.flock(fd, fcntl.LOCK_EX); fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)")
        assert flock_errno(two.mp / "orphan", fcntl.LOCK_EX | fcntl.LOCK_NB) == errno.EWOULDBLOCK
        # the holder lives on; only its mount dies, and with it the lease renewals
        doomed.kill()
        started = time.monotonic()
        assert poll_until(lambda: flock_errno(two.mp / "orphan",
                                              fcntl.LOCK_EX | fcntl.LOCK_NB) == 0, timeout=60)
        assert time.monotonic() - started >= HARD_LIMIT - 1.0   # not before the lease ended
        fd = os.open(two.mp / "orphan", os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
        finally:
            os.close(fd)
        holder.kill()
    finally:
        doomed.cleanup()


def test_a_file_made_here_keeps_what_was_written_after_an_unlock_ended_its_stream(one, two):
    """A database's pattern on a file created under its folder's lease: an unlock ends
    the file's stream (its content is published for the next lock holder) while the
    file stays open, and what is written under the next lock goes by calls. Once closed,
    both mounts see all of it: the mount's lease on the folder must not answer for the
    file from the empty close at the unlock."""
    folder = one.mp / "between-locks"
    folder.mkdir()
    path = folder / "db"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH, 0, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
        fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
        os.pwrite(fd, b"p" * 8192, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
    finally:
        os.close(fd)
    for seen in (path, two.mp / "between-locks" / "db"):
        fd = os.open(seen, os.O_RDONLY)
        try:
            assert os.fstat(fd).st_size == 8192, seen
            assert os.read(fd, 16384) == b"p" * 8192, seen
        finally:
            os.close(fd)


SQLITE_WORKER = textwrap.dedent("""
    import sqlite3, sys
    path, who, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    db = sqlite3.connect(path, timeout=120, isolation_level=None)
    for i in range(count):
        db.execute("BEGIN IMMEDIATE")
        n = db.execute("SELECT COUNT(*) FROM t").fetchone()[0]
        db.execute("INSERT INTO t (who, i, seen, pad) VALUES (?, ?, ?, ?)",
                   (who, i, n, who * 200))
        db.execute("COMMIT")
    db.close()
    print("done", flush=True)
""")


def test_sqlite_on_two_mounts_of_one_database_stays_whole(one, two):
    path_one, path_two = one.mp / "shared.db", two.mp / "shared.db"
    db = __import__("sqlite3").connect(path_one)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, who TEXT, i INTEGER, seen INTEGER, "
               "pad TEXT)")
    db.commit()
    db.close()
    count = 300
    workers = [subprocess.Popen([sys.executable, "-c", SQLITE_WORKER, str(path), who,
                                 str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
               for path, who in ((path_one, "a"), (path_two, "b"))]
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=540)
            assert worker.returncode == 0 and out.strip() == "done", err[-3000:]
    finally:   # a failed worker leaves the other one: it must not keep the mount busy
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for path in (path_one, path_two):
        db = __import__("sqlite3").connect(path)
        try:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            rows = db.execute("SELECT who, i, seen FROM t ORDER BY id").fetchall()
        finally:
            db.close()
        assert sorted((w, i) for w, i, _ in rows) == sorted(
            [("a", i) for i in range(count)] + [("b", i) for i in range(count)])
        # every transaction saw all the ones before it: none was lost or overwritten
        assert [seen for _, _, seen in rows] == list(range(2 * count))


def test_a_waiter_killed_while_blocked_is_not_held_by_the_lock(one, two):
    """A signal ends a blocked F_SETLKW: the mount sees the kernel's interrupt between its
    bounded waits and answers EINTR, so a killed waiter exits while the lock is still
    held elsewhere (and never gets it later)."""
    (one.mp / "contended").write_bytes(b"c")
    holder = Holder(one.mp / "contended", "fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)")
    try:
        waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os
            fd = os.open({str(two.mp / 'contended')!r}, os.O_RDWR)
            print("waiting", flush=True)
            fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
            print("got it", flush=True)
        """)], stdout=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "waiting"
        # fixed-sleep: the lock request must be in the mount (blocked) when the kill comes
        time.sleep(0.5)
        waiter.kill()
        assert waiter.wait(timeout=15) == -9   # not stuck until the holder lets go
        assert waiter.stdout.read() == ""
        fd = os.open(two.mp / "contended", os.O_RDWR)
        try:
            with pytest.raises(OSError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
            holder.close()
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
        finally:
            os.close(fd)
    finally:
        holder.kill()


def test_a_lock_held_through_a_metadata_server_restart_stays_held(cluster, one, two):
    """The metadata server's lock table does not survive a restart, its holders do: the
    mount that held a lock gives it back to the restarted server (within a second or
    so), and until the holders on record did, nobody gets a new lock. So the other mount
    still finds the file locked, until the holder lets go."""
    (one.mp / "kept").write_bytes(b"k")
    holder = Holder(one.mp / "kept",
                    "fcntl.flock(fd, fcntl.LOCK_EX); fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)")
    try:
        assert flock_errno(two.mp / "kept", fcntl.LOCK_EX | fcntl.LOCK_NB) == errno.EWOULDBLOCK
        cluster.kill_meta(sig=15)
        cluster.start_meta()
        cluster.wait_ready(1)
        assert flock_errno(two.mp / "kept", fcntl.LOCK_EX | fcntl.LOCK_NB) == errno.EWOULDBLOCK
        fd = os.open(two.mp / "kept", os.O_RDWR)
        try:
            with pytest.raises(OSError) as raised:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
            assert raised.value.errno in (errno.EAGAIN, errno.EACCES)
        finally:
            os.close(fd)
        holder.close()
        assert poll_until(lambda: flock_errno(two.mp / "kept",
                                              fcntl.LOCK_EX | fcntl.LOCK_NB) == 0, timeout=30)
    finally:
        holder.kill()
