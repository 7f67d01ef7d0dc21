"""The FUSE mount end to end: a real cluster (``ProcessCluster``), the mount as a real
``python -m tools mount --foreground`` process, and ordinary POSIX calls / coreutils on it.

Skipped (with the reason) when pyfuse3, /dev/fuse or fusermount3 is missing.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import REPO, ProcessCluster, errno_of, poll_until, wait_mounted  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _unmount(mp: Path) -> None:
    if os.path.ismount(mp):
        if subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mp)], capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountcluster")
    with ProcessCluster(base, n_storage=2, settings={"replication": 2, "block_size": 1 << 20}) as c:
        yield c


@pytest.fixture(scope="module")
def mounted(cluster):
    mp = cluster.base / "mnt"
    mp.mkdir()
    log = cluster.base / "logs" / "mount.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tools", "mount", "--foreground", str(mp),
             "--cache-dir", str(cluster.base / "cache"), "--log-level", "INFO"],
            env=cluster.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        wait_mounted(mp, proc, log)
        yield mp
    finally:
        _unmount(mp)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]



@pytest.mark.slow
def test_copy_tree_and_diff(mounted, tmp_path):
    src = tmp_path / "tree"
    (src / "a" / "b" / "c").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "zero").write_bytes(b"")
    (src / "a" / "small.txt").write_text("hello leasefs\n")
    (src / "a" / "b" / "big.bin").write_bytes(random.Random(1).randbytes(3 * (1 << 20) + 12345))
    (src / "a" / "b" / "c" / "deep").write_bytes(b"x" * 5000)
    os.symlink("a/small.txt", src / "link")
    subprocess.run(["cp", "-r", str(src), str(mounted / "tree")], check=True)
    result = subprocess.run(["diff", "-r", "--no-dereference", str(src), str(mounted / "tree")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert os.readlink(mounted / "tree" / "link") == "a/small.txt"
    assert (mounted / "tree" / "link").read_text() == "hello leasefs\n"
    assert os.path.getsize(mounted / "tree" / "zero") == 0
    assert sorted(os.listdir(mounted / "tree")) == ["a", "empty", "link", "zero"]


@pytest.mark.slow
def test_namespace_errors(mounted):
    d = mounted / "errs"
    os.mkdir(d)
    assert errno_of(os.mkdir, d) == errno.EEXIST
    (d / "f").write_text("data")
    assert errno_of(os.rmdir, d) == errno.ENOTEMPTY
    assert errno_of(os.rmdir, d / "f") == errno.ENOTDIR
    assert errno_of(os.unlink, d / "missing") == errno.ENOENT
    assert errno_of(os.rmdir, d / "missing") == errno.ENOENT
    assert errno_of(os.rename, d / "missing", d / "other") == errno.ENOENT
    assert errno_of(os.mkdir, d / "no" / "such") == errno.ENOENT
    assert errno_of(os.link, d / "f", d / "hard") == errno.EPERM
    os.mkdir(d / "sub")
    (d / "sub" / "x").write_text("x")
    os.mkdir(d / "target")
    (d / "target" / "y").write_text("y")
    assert errno_of(os.rename, d / "sub", d / "target") == errno.ENOTEMPTY
    # nothing changed by the failures
    assert sorted(os.listdir(d)) == ["f", "sub", "target"]
    os.unlink(d / "f")
    assert errno_of(os.stat, d / "f") == errno.ENOENT


@pytest.mark.slow
def test_rename_replace_and_moved_directory_paths(mounted):
    d = mounted / "ren"
    os.makedirs(d / "dir" / "inner")
    (d / "dir" / "inner" / "f").write_text("one")
    (d / "g").write_text("two")
    fd = os.open(d / "dir" / "inner" / "f", os.O_RDONLY)
    try:
        os.rename(d / "dir", d / "moved")
        assert (d / "moved" / "inner" / "f").read_text() == "one"
        assert os.pread(fd, 10, 0) == b"one"     # an open file follows its directory
        os.rename(d / "g", d / "moved" / "inner" / "f")  # replace an existing file
    finally:
        os.close(fd)
    assert (d / "moved" / "inner" / "f").read_text() == "two"
    assert not (d / "g").exists()
    assert sorted(os.listdir(d)) == ["moved"]


@pytest.mark.slow
def test_append_truncate_and_attributes(mounted, cluster):
    f = mounted / "attrs.txt"
    f.write_bytes(b"0123456789")
    with open(f, "ab") as fh:
        fh.write(b"abc")
    assert f.read_bytes() == b"0123456789abc"
    os.truncate(f, 4)
    assert f.read_bytes() == b"0123"
    os.truncate(f, 6)
    assert f.read_bytes() == b"0123\0\0"
    with open(f, "r+b") as fh:      # O_RDWR without O_TRUNC, overwrite in the middle
        fh.seek(2)
        fh.write(b"XY")
    assert f.read_bytes() == b"01XY\0\0"
    os.chmod(f, 0o600)
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(f)
    assert stat_mode(st) == 0o600
    assert st.st_mtime_ns == 2_000_000_000
    with cluster.client() as client:
        status = client.get_file_status("/attrs.txt")
        assert status.mode == 0o600 and status.mtime_ns == 2_000_000_000
        assert client.read_file("/attrs.txt") == b"01XY\0\0"
    with open(f, "wb") as fh:       # O_TRUNC over existing content
        fh.write(b"new")
    assert f.read_bytes() == b"new"


def stat_mode(st) -> int:
    return st.st_mode & 0o7777


@pytest.mark.slow
def test_open_size_is_immediate_and_unlinked_file_stays_readable(mounted):
    f = mounted / "live.bin"
    with open(f, "wb") as fh:
        fh.write(b"a" * 10000)
        fh.flush()
        assert os.stat(f).st_size == 10000
        fh.write(b"b" * 5)
        fh.flush()
        assert os.fstat(fh.fileno()).st_size == 10005
    fd = os.open(f, os.O_RDONLY)
    try:
        os.unlink(f)
        assert not f.exists()
        assert os.pread(fd, 10005, 0) == b"a" * 10000 + b"b" * 5
    finally:
        os.close(fd)


@pytest.mark.slow
def test_quota_gives_edquot(mounted, cluster):
    d = mounted / "quota"
    os.mkdir(d)
    os.mkdir(d / "a")
    with cluster.client() as client:
        client.set_quota("/quota", ns_quota=2, ds_quota=-1)
    assert errno_of(os.mkdir, d / "b") == errno.EDQUOT
    assert errno_of(lambda: open(d / "f", "wb").close()) == errno.EDQUOT
    assert sorted(os.listdir(d)) == ["a"]
    with cluster.client() as client:
        client.set_quota("/quota", ns_quota=-1)
    os.mkdir(d / "b")


@pytest.mark.slow
def test_a_subfolder_mount_shows_the_folder_and_df_its_quotas(mounted, cluster):
    """``mount --subdir /proj`` (MooseFS -S): the folder's content at the top, files made
    there land in it, and ``df`` (statvfs) shows its space and name quotas and what is left
    of them, as bytes x replication."""
    from harness import Mount

    with cluster.client() as client:
        client.mkdirs("/proj/inner")
        client.write_file("/proj/inner/a.bin", b"a" * 1000)
        client.set_quota("/proj", ns_quota=100, ds_quota=64 << 20)
    sub = Mount(cluster, "subdir", "--subdir", "/proj")
    try:
        mp = sub.start().mp
        assert sorted(os.listdir(mp)) == ["inner"]
        assert (mp / "inner" / "a.bin").read_bytes() == b"a" * 1000
        (mp / "new.txt").write_bytes(b"b" * 5000)
        with cluster.client() as client:
            assert client.read_file("/proj/new.txt") == b"b" * 5000
            assert not client.exists("/new.txt")
            used = client.content_summary("/proj")
        st = os.statvfs(mp)
        assert st.f_blocks * st.f_frsize == 64 << 20
        assert st.f_bavail * st.f_frsize == pytest.approx((64 << 20) - used["ds_used"],
                                                          abs=st.f_frsize)
        assert (st.f_files, st.f_ffree) == (100, 100 - used["ns_used"])
        df = subprocess.run(["df", "-B1", str(mp)], capture_output=True, text=True)
        assert df.returncode == 0 and str(64 << 20) in df.stdout, df.stdout
        # the whole-cluster mount still shows the cluster
        assert os.statvfs(mounted).f_blocks * os.statvfs(mounted).f_frsize > 64 << 20
    finally:
        sub.cleanup()


@pytest.mark.slow
def test_statfs_reports_cluster_capacity(mounted, cluster):
    st = os.statvfs(mounted)
    with cluster.client() as client:
        capacity = client.report()["capacity"]
    assert st.f_blocks * st.f_frsize == pytest.approx(capacity, rel=0.01, abs=1 << 17)
    assert st.f_bavail > 0
    # an answer is reused for the attribute timeout (rm -rf asks per directory), not longer
    os.mkdir(mounted / "statfs-counted")
    for i in range(3):
        (mounted / "statfs-counted" / f"f{i}").write_bytes(b"x")
    assert poll_until(lambda: os.statvfs(mounted).f_files >= st.f_files + 4)


@pytest.mark.slow
def test_daemonized_mount_and_umount_command(cluster):
    mp = cluster.base / "mnt-daemon"
    mp.mkdir()
    try:
        result = subprocess.run([sys.executable, "-m", "tools", "mount", str(mp)],
                                env=cluster.env, cwd=REPO, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(mp)        # the command returned only once the mount works
        (mp / "via-daemon").write_text("ok")
        assert (mp / "via-daemon").read_text() == "ok"
        result = subprocess.run([sys.executable, "-m", "tools", "umount", str(mp)],
                                env=cluster.env, cwd=REPO, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        assert not os.path.ismount(mp)
    finally:
        _unmount(mp)
    with cluster.client() as client:
        assert client.read_file("/via-daemon") == b"ok"


@pytest.mark.slow
def test_mount_bad_mountpoint_is_one_line(cluster, tmp_path):
    result = subprocess.run([sys.executable, "-m", "tools", "mount", str(tmp_path / "nope")],
                            env=cluster.env, cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"leasefs mount: {tmp_path / 'nope'}: no such file or directory\n"
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_readdir_pages_past_one_listing_page(mounted, cluster):
    names = [f"d{i:05d}" for i in range(1205)]   # more than one list_status page (1000)
    with cluster.client() as client:
        for name in names:
            client.mkdirs(f"/many/{name}")
    assert sorted(os.listdir(mounted / "many")) == names
    with os.scandir(mounted / "many") as it:
        assert sum(1 for e in it if e.is_dir(follow_symlinks=False)) == len(names)
    with cluster.client() as client:   # every opendir lists afresh: another client's change
        client.mkdirs("/many/zlast")
        client.delete("/many/d00000")
    assert sorted(os.listdir(mounted / "many")) == names[1:] + ["zlast"]


@pytest.mark.allow_log_errors(r"buggy failed unexpectedly \| Traceback: KeyError: 'a bug'",
                              reason="the test's handler has a bug on purpose")
async def test_error_mapping_is_one_place_and_bugs_become_eio():
    from fs.errors import DirectoryNotEmpty, FileNotFound, SafeMode
    from mount.errors import fuse_op, to_fuse_error

    assert to_fuse_error(FileNotFound("/x: missing")).errno == errno.ENOENT
    assert to_fuse_error(DirectoryNotEmpty("/d")).errno == errno.ENOTEMPTY
    assert to_fuse_error(SafeMode("ro")).errno == errno.EROFS
    assert to_fuse_error(PermissionError(errno.EACCES, "no")).errno == errno.EACCES
    assert to_fuse_error(ValueError("bug")).errno == errno.EIO

    @fuse_op
    async def buggy():
        raise KeyError("a bug")

    @fuse_op
    async def missing():
        raise FileNotFound("/gone: no such file")

    with pytest.raises(pyfuse3.FUSEError) as info:
        await buggy()
    assert info.value.errno == errno.EIO
    with pytest.raises(pyfuse3.FUSEError) as info:
        await missing()
    assert info.value.errno == errno.ENOENT


@pytest.mark.slow
def test_append_lands_at_the_real_end_despite_a_cached_size(mounted, cluster):
    f = mounted / "grow.log"
    f.write_bytes(b"a" * 100)
    assert os.stat(f).st_size == 100          # the kernel now caches size 100 for ~1 s
    with cluster.client() as client:          # another client appends meanwhile
        deadline = time.monotonic() + 10      # (once the mount's release completed it)
        while not client.is_file_closed("/grow.log"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        stream = client.append("/grow.log")
        stream.write(b"b" * 50)
        stream.close()
    with open(f, "ab") as fh:                 # O_APPEND: the kernel's offset is stale (100)
        fh.write(b"c" * 10)
    with cluster.client() as client:
        assert client.read_file("/grow.log") == b"a" * 100 + b"b" * 50 + b"c" * 10
    # fixed-sleep: the mount's attribute cache lapses on the real clock in another process
    time.sleep(1.2)
    assert f.read_bytes() == b"a" * 100 + b"b" * 50 + b"c" * 10


def test_open_file_modes_move_only_as_the_table_says():
    from fs.errors import InternalError
    from mount.openfiles import FileEvent as E
    from mount.openfiles import FileMode as M
    from mount.openfiles import OpenFile, next_state

    of = OpenFile(7, 0, 0o644)
    assert of.mode is M.CLEAN
    for event, mode in [(E.APPEND, M.STREAM), (E.COMPLETE, M.CLEAN), (E.STAGE, M.STAGING),
                        (E.DISCARD, M.CLEAN), (E.CREATE, M.STREAM)]:
        of.move(event)
        assert of.mode is mode
    with pytest.raises(InternalError, match="append is not allowed in mode stream"):
        of.move(E.APPEND)         # one stream per open file
    assert of.mode is M.STREAM    # a refused move changes nothing
    of.move(E.STAGE)              # staged; the stream stays on as the lease keeper
    assert of.mode is M.STAGING
    for event in (E.CREATE, E.DISCARD):
        with pytest.raises(InternalError):
            next_state(M.STREAM, event)
    for event in (E.COMPLETE, E.APPEND, E.STAGE):
        with pytest.raises(InternalError):
            next_state(M.STAGING, event)


def test_a_stream_copy_is_kept_only_from_offset_0_within_its_bounds():
    """The copy of a stream's bytes that lets a file be staged without a read back: only
    for a stream begun here at offset 0, up to SHADOW_MAX per file and the mount's budget
    for all files; every byte is given back when the file leaves STREAM or is forgotten."""
    from types import SimpleNamespace

    from mount.openfiles import SHADOW_MAX, CopyBudget, OpenFile
    from mount.openfiles import FileEvent as E

    copies = CopyBudget(limit=SHADOW_MAX + 100)
    a, b = OpenFile(1, 0, 0o644, copies=copies), OpenFile(2, 0, 0o644, copies=copies)
    a.move(E.CREATE)
    a.stream = SimpleNamespace(pos=0)
    for chunk in (b"x" * 4096, b"y" * 10):
        a.stream_took(chunk)
        a.stream.pos += len(chunk)
    assert a.shadow_content() == b"x" * 4096 + b"y" * 10 and copies.used == 4106
    a.stream.pos += 1                      # a byte the copy missed: no copy is answered
    assert a.shadow_content() is None
    b.move(E.CREATE)
    b.stream = SimpleNamespace(pos=0)
    b.stream_took(b"z" * (SHADOW_MAX - 4000))   # past what is left of the budget
    assert b.shadow is None and copies.used == 4106
    a.move(E.COMPLETE)
    assert a.shadow is None and copies.used == 0
    b.move(E.COMPLETE)
    b.move(E.APPEND)                       # an append continues bytes it never saw
    assert b.shadow is None
    b.move(E.COMPLETE)
    b.move(E.CREATE)
    b.stream = SimpleNamespace(pos=0)
    b.stream_took(b"w" * SHADOW_MAX)
    assert copies.used == SHADOW_MAX
    b.stream_took(b"w")                    # past SHADOW_MAX for one file
    assert b.shadow is None and copies.used == 0
    c = OpenFile(3, 0, 0o644)              # no budget (a file only truncated): no copy
    c.move(E.CREATE)
    c.stream_took(b"q")
    assert c.shadow is None


@pytest.mark.allow_log_errors(r"fuse_read\(\): fuse_reply_\* failed with Invalid argument",
                              reason="the test logs a failed reply that stays an error")
def test_a_reply_the_kernel_no_longer_waits_for_is_not_an_error(caplog):
    """pyfuse3 logs ERROR when the kernel refuses a reply with ENOENT (caller interrupted, or
    an unmount right after a close racing the asynchronous release): the mount logs it as
    INFO; any other failed reply stays an ERROR."""
    import logging

    from mount.runner import LateReplyFilter

    log = logging.getLogger("pyfuse3")
    filt = LateReplyFilter()
    log.addFilter(filt)
    try:
        with caplog.at_level(logging.INFO, logger="pyfuse3"):
            log.error("fuse_release(): fuse_reply_* failed with %s", os.strerror(errno.ENOENT))
            late = caplog.records[-1]
            assert late.levelno == logging.INFO and "no longer waits" in late.getMessage()
            caplog.clear()
            log.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.EINVAL))
            other = caplog.records[-1]
            assert other.levelno == logging.ERROR
    finally:
        log.removeFilter(filt)
