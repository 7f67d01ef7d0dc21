"""What the FUSE mount must show everyday tools, on a real process cluster and real mount
processes: shell tools round trip, 10 000 random O_RDWR operations across remounts, editor
saves and ``>>`` logs, leases held by a mount and recovered after kill -9, POSIX errors
including EACCES for another user, unmount with files open for write, and an unreachable
metadata server answered with EIO within the configured time.

Mountpoints live in world-searchable temp folders and are mounted with ``allow_other`` so
that a process running as ``nobody`` reaches them: its EACCES then comes from the mode bits
(``default_permissions``), not from FUSE refusing other users outright.
"""

from __future__ import annotations

import errno
import grp
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import Mount, ProcessCluster, errno_of, poll_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
NOBODY = 65534
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountacc")
    with ProcessCluster(base, n_storage=2, settings={"replication": 2, "block_size": 4 * MiB}) as c:
        yield c


@pytest.fixture(scope="module")
def mount(cluster):
    m = Mount(cluster, "main").start()
    try:
        yield m
    finally:
        try:
            if m.proc is not None:
                m.stop()
        finally:
            m.cleanup()


@pytest.fixture
def extra_mounts(cluster):
    made: list[Mount] = []

    def make(name: str, *extra: str) -> Mount:
        m = Mount(cluster, name, *extra)
        made.append(m)
        return m

    yield make
    for m in made:
        m.cleanup()


def _cli(cluster, *args, timeout=120, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "tools", *args], env=cluster.env, cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, result.stderr
    return result



def _diff(a: Path, b: Path) -> None:
    result = subprocess.run(["diff", "-r", "--no-dereference", str(a), str(b)],
                            capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------ 1. shell round trip

def _source_tree(root: Path) -> None:
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "zero").write_bytes(b"")
    (root / "a" / "notes.txt").write_text("hello leasefs\n" * 100)
    (root / "a" / "b" / "c" / "deep.bin").write_bytes(random.Random(2).randbytes(300_001))
    for i in range(40):
        (root / "a" / "b" / f"small-{i:02d}").write_bytes(random.Random(i).randbytes(i * 997))
    with open(root / "a" / "big.bin", "wb") as fh:   # 200 MiB, incompressible
        for _ in range(25):
            fh.write(os.urandom(8 * MiB))
    os.symlink("a/notes.txt", root / "link-to-file")
    os.symlink("a/b", root / "link-to-dir")
    os.symlink("does/not/exist", root / "dangling")
    os.chmod(root / "a" / "notes.txt", 0o640)


def test_shell_round_trip_cp_tar_rsync(mount, tmp_path):
    src = tmp_path / "src"
    _source_tree(src)
    rt = mount.mp / "roundtrip"
    rt.mkdir()

    subprocess.run(["cp", "-r", str(src), str(rt / "cp")], check=True)
    _diff(src, rt / "cp")
    assert os.path.getsize(rt / "cp" / "a" / "big.bin") == 200 * MiB
    assert os.readlink(rt / "cp" / "dangling") == "does/not/exist"
    assert _sha(rt / "cp" / "a" / "big.bin") == _sha(src / "a" / "big.bin")

    # tar c from the mount, tar x into the mount, and an archive stored on the mount
    subprocess.run(["tar", "-C", str(rt), "-cf", str(tmp_path / "out.tar"), "cp"], check=True)
    (rt / "untar").mkdir()
    subprocess.run(["tar", "-C", str(rt / "untar"), "-xf", str(tmp_path / "out.tar")],
                   check=True)
    _diff(src, rt / "untar" / "cp")
    subprocess.run(["tar", "-C", str(src), "-cf", str(rt / "archive.tar"), "."], check=True)
    (tmp_path / "back").mkdir()
    subprocess.run(["tar", "-C", str(tmp_path / "back"), "-xf", str(rt / "archive.tar")],
                   check=True)
    _diff(src, tmp_path / "back")

    # rsync -a twice: the second run finds nothing to transfer
    first = subprocess.run(["rsync", "-a", "--stats", f"{src}/", str(rt / "rs")],
                           check=True, capture_output=True, text=True)
    assert "Number of regular files transferred: 44" in first.stdout, first.stdout
    _diff(src, rt / "rs")
    assert os.stat(rt / "rs" / "a" / "notes.txt").st_mode & 0o777 == 0o640
    assert os.stat(rt / "rs" / "a" / "big.bin").st_mtime_ns == \
        os.stat(src / "a" / "big.bin").st_mtime_ns
    second = subprocess.run(["rsync", "-a", "--stats", "-i", f"{src}/", str(rt / "rs")],
                            check=True, capture_output=True, text=True)
    assert "Number of regular files transferred: 0" in second.stdout, second.stdout
    itemized = [line for line in second.stdout.splitlines() if line and line[0] in "<>ch."
                and not line.startswith(("Number", "Total", "File", "Literal", "Matched",
                                         "sent", "total"))]
    assert itemized == [], itemized
    shutil.rmtree(rt)
    assert not rt.exists()


# ------------------------------------------------------------------ 2. random I/O

def _random_ops(rng: random.Random, rfd: int, lfd: int, count: int, label: str) -> None:
    for i in range(count):
        op = rng.random()
        size = os.fstat(lfd).st_size
        if op < 0.50:
            off = rng.randrange(0, size + 20_000)
            data = rng.randbytes(rng.randrange(1, 12_000))
            assert os.pwrite(rfd, data, off) == os.pwrite(lfd, data, off)
        elif op < 0.88:
            off = rng.randrange(0, size + 100)
            n = rng.randrange(1, 30_000)
            assert os.pread(rfd, n, off) == os.pread(lfd, n, off), f"{label} op {i}: read"
        elif op < 0.97:
            # truncate down and up
            new = rng.randrange(0, size // 2 + 1) if rng.random() < 0.5 else \
                rng.randrange(size, size + 50_000)
            os.ftruncate(lfd, new)
            os.ftruncate(rfd, new)
        else:
            os.fsync(rfd)
        assert os.fstat(rfd).st_size == os.fstat(lfd).st_size, f"{label} op {i}: size"


def test_random_io_10000_ops_survives_remount(cluster, extra_mounts, tmp_path):
    m = extra_mounts("rand").start()
    rng = random.Random(20261121)
    local = tmp_path / "ref.bin"
    initial = rng.randbytes(300_000)
    local.write_bytes(initial)
    (m.mp / "random.bin").write_bytes(initial)
    for label, count in (("before remount", 6000), ("after remount", 4000)):
        lfd = os.open(local, os.O_RDWR)
        rfd = os.open(m.mp / "random.bin", os.O_RDWR)
        try:
            _random_ops(rng, rfd, lfd, count, label)
        finally:
            os.close(lfd)
            os.close(rfd)
        expected = local.read_bytes()
        assert (m.mp / "random.bin").read_bytes() == expected
        m.stop()          # unmount, remount: the content comes from the cluster
        m.start()
        assert (m.mp / "random.bin").read_bytes() == expected, label
        with cluster.client() as client:
            assert client.read_file("/random.bin") == expected
    m.stop()


# ------------------------------------------------------------------ 3. editors and logs

def test_editor_save_and_append_log(mount):
    d = mount.mp / "edit"
    d.mkdir()
    target = d / "notes.txt"
    target.write_text("version 0\n")
    os.chmod(target, 0o640)
    old_reader = os.open(target, os.O_RDONLY)
    try:
        for v in range(1, 6):
            # what vim/emacs/most IDEs do: write a temp file, fsync, rename over the original
            tmp = d / f".notes.txt.{v}.swp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, f"version {v}\n".encode() * 1000)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o640)
            os.rename(tmp, target)
            assert target.read_text() == f"version {v}\n" * 1000
            assert sorted(os.listdir(d)) == ["notes.txt"]
        # the descriptor opened before the first save still reads the original content
        assert os.pread(old_reader, 100, 0) == b"version 0\n"
    finally:
        os.close(old_reader)
    assert os.stat(target).st_mode & 0o777 == 0o640

    log = d / "app.log"
    for i in range(25):   # `>>` from 25 sequential processes
        subprocess.run(["sh", "-c", f"echo 'line {i}' >> '{log}'"], check=True)
    assert log.read_text() == "".join(f"line {i}\n" for i in range(25))
    subprocess.run(["sh", "-c", f"seq 1 3 >> '{log}' && echo done >> '{log}'"], check=True)
    assert log.read_text().endswith("line 24\n1\n2\n3\ndone\n")


# ------------------------------------------------------------------ 4. leases

def test_mount_holds_lease_and_recover_lease_after_kill(cluster, mount, extra_mounts):
    other = extra_mounts("holder").start()
    path = "/leased.bin"
    synced = os.urandom(3 * MiB + 123)
    fd = os.open(other.mp / "leased.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, synced)
    os.fsync(fd)                      # hsync: these bytes are durable
    os.write(fd, b"tail not synced")

    leases = json.loads(_cli(cluster, "leases", "--json").stdout)
    held = [e for e in leases if e["path"] == path]
    assert held and held[0]["holder"].startswith("leasefs-mount-"), leases
    assert held[0]["holder"].endswith(f"-{other.proc.pid}"), leases
    table = _cli(cluster, "leases").stdout
    assert path in table and f"-{other.proc.pid}" in table

    # a second writer elsewhere is refused while the holder lives
    assert errno_of(os.open, mount.mp / "leased.bin", os.O_WRONLY | os.O_APPEND) == errno.EBUSY
    assert "leased.bin" in mount.log.read_text() and "leasefs-mount-" in mount.log.read_text()

    other.kill()                      # kill -9 of the mount process
    try:
        os.close(fd)
    except OSError:
        pass
    result = _cli(cluster, "recover-lease", path, "--retries", "60", "--interval", "0.5")
    assert result.returncode == 0, result.stderr
    with cluster.client() as client:
        assert client.is_file_closed(path)
        data = client.read_file(path)
    assert data[:len(synced)] == synced and len(data) >= len(synced)
    assert not [e for e in json.loads(_cli(cluster, "leases", "--json").stdout)
                if e["path"] == path]

    # another mount writes it now
    with open(mount.mp / "leased.bin", "ab") as fh:
        fh.write(b"appended by another mount")
    assert (mount.mp / "leased.bin").read_bytes() == data + b"appended by another mount"


# ------------------------------------------------------------------ 5. POSIX errors

def _as_nobody(script: str, *args: str) -> subprocess.CompletedProcess:
    """``sh -c script`` as user/group nobody (a system shell: nobody cannot reach the
    project's interpreter under /root)."""
    return subprocess.run(["/bin/sh", "-c", script, "sh", *args], user=NOBODY, group=NOBODY,
                          extra_groups=[], capture_output=True, text=True, timeout=60,
                          cwd="/")


def test_posix_errors_and_open_file_semantics(mount):
    d = mount.mp / "posix"
    d.mkdir()
    # unlink of an open file: still readable and writable through its descriptor
    f = d / "open-unlinked"
    f.write_bytes(b"abc" * 1000)
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        assert not f.exists()
        assert os.pread(fd, 9, 0) == b"abcabcabc"
        os.pwrite(fd, b"XYZ", 3)
        assert os.pread(fd, 9, 0) == b"abcXYZabc"
        os.fsync(fd)
    finally:
        os.close(fd)
    assert not f.exists()
    # rename over an open file: the old descriptor keeps the old content
    (d / "target").write_bytes(b"old content")
    (d / "new").write_bytes(b"new content")
    fd = os.open(d / "target", os.O_RDONLY)
    try:
        os.rename(d / "new", d / "target")
        assert (d / "target").read_bytes() == b"new content"
        assert os.pread(fd, 100, 0) == b"old content"
    finally:
        os.close(fd)
    # the classic errnos
    (d / "sub").mkdir()
    (d / "sub" / "x").write_text("x")
    assert errno_of(os.rmdir, d / "sub") == errno.ENOTEMPTY
    assert errno_of(os.mkdir, d / "sub") == errno.EEXIST
    assert errno_of(os.open, d / "missing", os.O_RDONLY) == errno.ENOENT
    fd = os.open(d / "target", os.O_RDONLY)
    try:
        assert errno_of(os.write, fd, b"nope") == errno.EBADF
    finally:
        os.close(fd)
    assert errno_of(os.mkfifo, d / "fifo") in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)
    assert (d / "target").read_bytes() == b"new content"

    # another user: a 0600 file of root is refused, a 0644 one is readable, a new file in a
    # 0777 folder belongs to the caller
    (d / "secret").write_text("root only")
    os.chmod(d / "secret", 0o600)
    (d / "public").write_text("for all\n")
    os.chmod(d / "public", 0o644)
    (d / "shared").mkdir()
    os.chmod(d / "shared", 0o777)
    result = _as_nobody(
        'cat "$1/secret" || echo "refused: read"\n'
        'cat "$1/public"\n'
        '(echo x >> "$1/public") 2>/dev/null || echo "refused: write"\n'
        'echo "by nobody" > "$1/shared/mine"\n', str(d))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["refused: read", "for all", "refused: write"], \
        result.stdout
    assert "Permission denied" in result.stderr, result.stderr
    st = os.stat(d / "shared" / "mine")
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    assert (d / "shared" / "mine").read_text() == "by nobody\n"
    assert (d / "secret").read_text() == "root only"


# run as nobody (setpriv, no groups) in a 0777 folder of root's that holds root's files ro
# (0644) and rw (0666) and a setgid folder sg (root:daemon, 2777); step prints "what: ok"
# or the error the tool printed
_STEP = r"""
cd "$1" || exit 9
err=$(mktemp)
trap 'rm -f "$err"' EXIT
step() { what=$1; shift
         if "$@" 2>"$err"; then echo "$what: ok"; else echo "$what: $(sed 's/.*: //' "$err")"; fi; }
"""


def _as_nobody_in(folder: Path, script: str) -> list[str]:
    """Lay out the folder at ``folder`` as root, run ``script`` there as nobody."""
    folder.mkdir()
    os.chmod(folder, 0o777)
    for name, mode in (("ro", 0o644), ("rw", 0o666)):
        (folder / name).write_text(name)
        os.chmod(folder / name, mode)
    (folder / "sg").mkdir()
    os.chown(folder / "sg", 0, grp.getgrnam("daemon").gr_gid)
    os.chmod(folder / "sg", 0o2777)
    result = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                             "--clear-groups", "/bin/sh", "-c", "umask 022\n" + _STEP + script,
                             "sh", str(folder)],
                            capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _on_mount_and_ext4(mount, name: str, script: str) -> tuple[list[str], list[str]]:
    """``script``'s lines on the mount, and on a local folder (ext4 under /tmp)."""
    local = Path(tempfile.mkdtemp(prefix="leasefs-local-", dir="/tmp"))
    try:
        os.chmod(local, 0o755)
        on_disk = _as_nobody_in(local / name, script)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return _as_nobody_in(mount.mp / name, script), on_disk


def test_touch_needs_ownership_or_write_permission_as_on_a_local_disk(mount):
    """utimensat as POSIX has it (pjdfstest utimensat/06): the owner of a read-only file may
    touch it and set its times; another user needs write permission for "now" and may never
    set explicit times. The same steps on a local folder answer the same."""
    got, on_disk = _on_mount_and_ext4(mount, "times", r"""
echo mine > mine && chmod 0444 mine
step "owner touch 0444" touch mine
step "owner sets times 0444" touch -d @1000000000 mine
stat -c "mine mtime %Y" mine
step "other touch ro" touch ro
step "other sets times ro" touch -d @1000000000 ro
step "writer touch rw" touch rw
step "writer sets times rw" touch -d @1000000000 rw
""")
    assert got == [
        "owner touch 0444: ok",
        "owner sets times 0444: ok",
        "mine mtime 1000000000",
        "other touch ro: Permission denied",
        "other sets times ro: Permission denied",
        "writer touch rw: ok",
        "writer sets times rw: Operation not permitted",
    ], got
    assert got == on_disk, (got, on_disk)


def test_setgid_folder_gives_its_group_and_bit_as_on_a_local_disk(mount):
    """POSIX/BSD setgid folders: a file and folders made in one by a user of another group
    take the folder's group, and new folders keep the bit (mkdir -p: every level)."""
    got, on_disk = _on_mount_and_ext4(mount, "setgid", r"""
echo f > sg/file && mkdir sg/sub && mkdir -p sg/a/b
stat -c "%n %G %A" sg/file sg/sub sg/a sg/a/b
""")
    assert got == ["sg/file daemon -rw-r--r--", "sg/sub daemon drwxr-sr-x",
                   "sg/a daemon drwxr-sr-x", "sg/a/b daemon drwxr-sr-x"], got
    assert got == on_disk, (got, on_disk)


# ------------------------------------------------------------------ 6. unmount with open files

_WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, bytes(range(256)) * 4096 * 3)         # 3 MiB, no fsync
print("written", flush=True)
line = sys.stdin.readline()
if line.startswith("more"):
    os.write(fd, b"more" * 1000)
    os.close(fd)
    print("closed", flush=True)
time.sleep(3600)
"""


def _writer(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")
    assert proc.stdout.readline().strip() == "written"
    return proc


def test_unmount_with_files_open_for_write(cluster, extra_mounts):
    first = bytes(range(256)) * 4096 * 3
    # (a) plain umount refuses a busy mount with a hint; --force publishes and exits
    m = extra_mounts("force").start()
    writer = _writer(m.mp / "forced.bin")
    try:
        result = _cli(cluster, "umount", str(m.mp), check=False)
        assert result.returncode == 1 and "busy" in result.stderr and "--force" in result.stderr
        assert result.stderr.count("\n") == 1
        assert os.path.ismount(m.mp)
        _cli(cluster, "umount", "--force", str(m.mp))
        assert not os.path.ismount(m.mp)
        assert m.proc.wait(30) == 0, m.log_text()
        m.proc = None
    finally:
        writer.kill()
        writer.wait()
    with cluster.client() as client:
        assert client.is_file_closed("/forced.bin")
        assert client.read_file("/forced.bin") == first
    assert not [e for e in json.loads(_cli(cluster, "leases", "--json").stdout)
                if e["path"] == "/forced.bin"]

    # (b) lazy: detached at once, the writer goes on, its close publishes, the mount exits
    m = extra_mounts("lazy").start()
    writer = _writer(m.mp / "lazy.bin")
    try:
        _cli(cluster, "umount", "--lazy", str(m.mp))
        assert not os.path.ismount(m.mp)
        writer.stdin.write("more\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "closed"
    finally:
        writer.kill()
        writer.wait()
    assert m.proc.wait(60) == 0, m.log_text()
    m.proc = None
    with cluster.client() as client:
        assert client.is_file_closed("/lazy.bin")
        assert client.read_file("/lazy.bin") == first + b"more" * 1000


# ------------------------------------------------------------------ bench on the mount

def test_bench_fuse_runs_on_the_mount(cluster, mount, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    result = _cli(cluster, "bench", "fuse", "--path", str(local), "--path", str(mount.mp),
                  "--size", "8M", "--files", "20", "--tree-files", "40", "--json",
                  timeout=300)
    report = json.loads(result.stdout)
    text = json.dumps(report)
    assert str(mount.mp) in text and "cp-r" in text and "seq-read" in text
    assert not [n for n in os.listdir(mount.mp) if n.startswith(".leasefs-bench")]


# ------------------------------------------------------------------ 7. metadata server away

def test_unreachable_meta_gives_eio_in_bounded_time_and_recovers(cluster, extra_mounts):
    m = extra_mounts("outage", "--set", "mount_meta_timeout=2").start()
    (m.mp / "before.txt").write_text("before")
    # a folder another client made: the mount holds no lease there (one it holds would
    # answer its misses and listing from the lease, the server down or not)
    with cluster.client() as client:
        client.mkdirs("/elsewhere")
    cluster.kill_meta()
    try:
        for i in range(3):
            started = time.monotonic()
            assert errno_of(os.stat, m.mp / "elsewhere" / f"not-cached-{i}") == errno.EIO
            assert time.monotonic() - started < 10
        started = time.monotonic()
        assert errno_of(os.listdir, m.mp / "elsewhere") == errno.EIO
        assert time.monotonic() - started < 10
    finally:
        cluster.start_meta()
        cluster.wait_ready()
    deadline = time.monotonic() + 60
    while True:   # recovers by itself once the server is back (and out of safe mode)
        try:
            (m.mp / "after.txt").write_text("after")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert sorted(n for n in os.listdir(m.mp) if n.endswith(".txt")) >= ["after.txt",
                                                                          "before.txt"]
    # written just before the outage: close(2) returned once the cluster had its bytes;
    # the release's completion, cut off by the outage, is done in the background once
    # the server is back
    deadline = time.monotonic() + 30
    while (m.mp / "before.txt").read_text() != "before":
        assert time.monotonic() < deadline, m.log_text()
        time.sleep(0.2)
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed("/before.txt"), 30), m.log_text()
    m.stop()
