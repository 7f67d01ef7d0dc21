"""Directory leases through real mounts (docs/design/dirleases.md): a mount that holds a
folder's lease answers unlink, rmdir and rename there at once and sends them afterwards;
another mount, the CLI client and a restarted metadata server must see exactly what a
local filesystem would have, and a mount killed mid-way leaves a prefix of its operations.

Two mount processes of one process cluster are two clients. Skipped (with the reason)
when pyfuse3, /dev/fuse or fusermount3 is missing.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import (Mount, ProcessCluster, mounted, poll_until,  # noqa: E402
                     store_problems)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# a recall a dead mount never answers ends after this (the kill tests wait for it)
SETTINGS = {"replication": 1, "dir_lease_recall_limit": 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("dirleasemount"), n_storage=1,
                        settings=SETTINGS, meta_http=True) as c:
        yield c


@pytest.fixture(scope="module")
def a(cluster):
    yield from mounted(cluster, "a")


@pytest.fixture(scope="module")
def b(cluster):
    yield from mounted(cluster, "b")


def tree(root: Path) -> dict[str, str | None]:
    """Every path below ``root``: a file's content, None for a folder (readdir walks)."""
    out: dict[str, str | None] = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for name in dirs:
            out[os.path.normpath(os.path.join(rel, name))] = None
        for name in files:
            out[os.path.normpath(os.path.join(rel, name))] = \
                Path(folder, name).read_text()
    return out


def outcome(fn, *args) -> int:
    """0, or the errno ``fn(*args)`` failed with."""
    try:
        fn(*args)
        return 0
    except OSError as exc:
        return exc.errno


# ------------------------------------------------------------------ a sequential model

class Script:
    """Random namespace operations in a small tree, each applied to a mount and to a local
    folder (the model) with the same outcome required."""

    def __init__(self, seed: int, local: Path, remote: Path):
        self.rng = random.Random(seed)
        self.local, self.remote = local, remote
        self.made = 0

    def names(self, kind: str | None = None) -> list[str]:
        found = []
        for folder, dirs, files in os.walk(self.local):
            rel = os.path.relpath(folder, self.local)
            pick = dirs if kind == "dir" else files if kind == "file" else dirs + files
            found += [os.path.normpath(os.path.join(rel, n)) for n in pick]
        return sorted(found)

    def folders(self) -> list[str]:
        return ["."] + self.names("dir")

    def step(self) -> str:
        rng = self.rng
        kind = rng.choice(["unlink", "unlink", "rmdir", "rename", "rename", "rename_dir",
                           "create", "mkdir", "missing"])
        files, dirs = self.names("file"), self.names("dir")
        if kind == "unlink" and files:
            target = rng.choice(files + dirs[:1])   # now and then a folder: EISDIR
            return self.both(f"unlink {target}", os.unlink, target)
        if kind == "rmdir" and dirs:
            target = rng.choice(dirs + files[:1])   # a non-empty one: ENOTEMPTY
            return self.both(f"rmdir {target}", os.rmdir, target)
        if kind == "rename" and files:
            src = rng.choice(files)
            folder = rng.choice(self.folders())
            dst = os.path.normpath(os.path.join(
                folder, rng.choice([os.path.basename(n) for n in files] + [f"n{self.made}"])))
            self.made += 1
            return self.both(f"rename {src} {dst}", os.rename, src, dst)
        if kind == "rename_dir" and dirs:
            src = rng.choice(dirs)
            folder = os.path.dirname(src) or "."
            dst = os.path.normpath(os.path.join(folder, rng.choice(
                [os.path.basename(d) for d in dirs] + [f"m{self.made}"])))
            self.made += 1
            return self.both(f"rename {src} {dst}", os.rename, src, dst)
        if kind == "missing":
            return self.both("unlink nothing", os.unlink, "nothing-here")
        folder = rng.choice(self.folders())
        name = os.path.normpath(os.path.join(folder, f"{kind[0]}{self.made}"))
        self.made += 1
        if kind == "mkdir":
            return self.both(f"mkdir {name}", os.mkdir, name)
        return self.both(f"create {name}", lambda p: Path(p).write_text(p), name)

    def both(self, what: str, fn, *rel) -> str:
        want = outcome(fn, *(str(self.local / r) for r in rel))
        got = outcome(fn, *(str(self.remote / r) for r in rel))
        assert got == want, (f"{what}: the mount answered {errno.errorcode.get(got, got)}, a "
                             f"local filesystem {errno.errorcode.get(want, want)}")
        return what


def model_contents(local: Path, root_in_mount: str) -> dict[str, str | None]:
    """The model's tree, files holding what ``create`` wrote through the mount (their
    path in the mount at their creation, which a rename keeps)."""
    out = {}
    for rel, content in tree(local).items():
        out[rel] = None if content is None else content.replace(str(local), root_in_mount)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_changes_on_one_mount_are_what_the_other_lists(cluster, a, b, tmp_path, seed):
    """Seeded random unlinks, rmdirs, renames (files across folders, folders in theirs),
    creates and mkdirs on mount A, every outcome (errno) compared with a local folder's;
    every few steps mount B and the CLI client list the whole tree and must find the
    model's, contents included: B's listings recall A's leases, which must have sent every
    change first. Then A's own view, and the same after A is gone."""
    local = tmp_path / "model"
    local.mkdir()
    remote = a.mp / f"model{seed}"
    remote.mkdir()
    for i in range(4):
        for where in (local, remote):
            (where / f"d{i}").mkdir()
            for j in range(6):
                (where / f"d{i}" / f"f{j}").write_text(str(where / f"d{i}" / f"f{j}"))
    script = Script(seed, local, remote)
    done = []
    for step in range(160):
        done.append(script.step())
        if step % 8 == 7:
            want = model_contents(local, str(remote))
            assert tree(b.mp / f"model{seed}") == want, done[-8:]
    want = model_contents(local, str(remote))
    assert tree(remote) == want
    with cluster.client() as cli:
        listed = {}
        for status in walk(cli, f"/model{seed}"):
            rel = os.path.relpath(status.path, f"/model{seed}")
            listed[rel] = None if status.is_dir else cli.read_file(status.path).decode()
    assert listed == want


def walk(cli, top: str):
    """Every status below ``top`` through the CLI client (listings, depth first)."""
    for status in cli.list_status(top):
        yield status
        if status.is_dir:
            yield from walk(cli, status.path)


# ------------------------------------------------------------------ recalls

def test_another_mount_writing_into_a_held_folder_sees_the_holders_changes(a, b):
    """A unlinks and renames in d (it holds d's lease); B then creates a file there and
    lists: its create recalls the lease first, so B's listing has A's changes and A's
    listing has B's file."""
    d = a.mp / "held"
    d.mkdir()
    for name in ("x", "y", "z"):
        (d / name).write_text(name)
    os.unlink(d / "x")
    os.rename(d / "y", d / "w")
    (b.mp / "held" / "new").write_text("from b")
    assert sorted(os.listdir(b.mp / "held")) == ["new", "w", "z"]
    assert sorted(os.listdir(d)) == ["new", "w", "z"]
    assert (d / "new").read_text() == "from b"
    assert (b.mp / "held" / "w").read_text() == "y"


def test_rm_rf_on_one_mount_while_the_other_lists(a, b):
    """B lists the tree's folders over and over while A removes it (rm -rf): a listing
    never shows a name that was not there, and once rm returned B lists nothing."""
    top = a.mp / "doomed"
    names = {f"d{i}": {f"f{j}" for j in range(40)} for i in range(8)}
    for folder, files in names.items():
        (top / folder).mkdir(parents=True)
        for f in files:
            (top / folder / f).write_text(f)
    stop = threading.Event()
    seen: list[tuple[str, list[str]]] = []
    errors: list[BaseException] = []

    def lister():
        try:
            while not stop.is_set():
                for folder in names:
                    try:
                        seen.append((folder, os.listdir(b.mp / "doomed" / folder)))
                    except FileNotFoundError:
                        pass
        except BaseException as exc:   # reported below
            errors.append(exc)

    thread = threading.Thread(target=lister)
    thread.start()
    try:
        # B is listing when the removal starts (else a quick rm -rf may end before B's
        # first listing is answered, and the check below would check nothing)
        assert poll_until(lambda: seen or errors, timeout=60)
        removal = subprocess.run(["rm", "-rf", str(top)], capture_output=True, text=True)
    finally:
        stop.set()
        thread.join(60)
    assert removal.returncode == 0, removal.stderr[-2000:]
    assert not errors, errors
    for folder, listed in seen:
        assert set(listed) <= names[folder], (folder, listed)
    # (a stat on B may answer from its kernel's cache for a second, as with any change
    # by another client; a listing asks the server)
    assert "doomed" not in os.listdir(b.mp)


def meta_calls(cluster: ProcessCluster, method: str) -> float:
    """Calls of ``method`` the metadata server answered (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.meta_http_port}/metrics",
                                timeout=30) as page:
        text = page.read().decode()
    found = re.search(rf'^leasefs_meta_rpc_calls_total\{{method="{method}",outcome="ok"\}} '
                      rf'(\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_rm_rf_takes_the_folders_leases_a_few_grants_at_a_time(cluster, a, b):
    """rm -rf on A of a tree of 64 folders the CLI made: a grant takes the folders below
    along, so A asks for leases a few times, not once for each folder; the tree is gone
    for B too."""
    with cluster.client() as cli:
        for i in range(7):
            for j in range(8):
                cli.mkdirs(f"/wide/d{i}/e{j}")
                cli.write_file(f"/wide/d{i}/e{j}/f", b"f")
    before = meta_calls(cluster, "dir_lease_acquire")
    removal = subprocess.run(["rm", "-rf", str(a.mp / "wide")], capture_output=True,
                             text=True)
    assert removal.returncode == 0, removal.stderr[-2000:]
    asked = meta_calls(cluster, "dir_lease_acquire") - before
    assert 1 <= asked <= 8, f"{asked:g} lease requests for the tree's 64 folders"
    assert not (a.mp / "wide").exists()
    assert "wide" not in os.listdir(b.mp)


def test_changes_are_answered_while_the_metadata_server_is_stopped(tmp_path):
    """The observable difference of a held lease: with the metadata server stopped
    (SIGSTOP), unlink, rename, rmdir and mkdir in a folder the mount holds return at once
    (and a small file made in a folder made so), a listing waits for the server; after
    SIGCONT the server has them. A mount with ``-o sync_namespace`` waits for the server
    at every change."""
    # the leases stay usable while the server is stopped for well over the test's steps
    settings = {**SETTINGS, "dir_lease_recall_limit": 30}
    with ProcessCluster(tmp_path, n_storage=1, settings=settings) as cluster:
        leased = Mount(cluster, "leased").start()
        sync = Mount(cluster, "sync", "-o", "sync_namespace").start()
        try:
            for m in (leased, sync):
                (m.mp / m.name).mkdir()
                for n in range(4):
                    (m.mp / m.name / f"f{n}").write_text("x")
            with cluster.client() as cli:   # released: the lease answers lookups of them
                assert poll_until(lambda: all(cli.is_file_closed(f"/{m.name}/f{n}")
                                              for m in (leased, sync) for n in range(4)))
            for m in (leased, sync):
                os.unlink(m.mp / m.name / "f0")   # the first change takes the lease
            # made in a held folder: its lease comes with it, and it is known empty
            (leased.mp / "leased" / "sub").mkdir()
            meta = cluster.pid("meta")
            os.kill(meta, signal.SIGSTOP)
            try:
                os.unlink(leased.mp / "leased" / "f1")
                os.rename(leased.mp / "leased" / "f2", leased.mp / "leased" / "g2")
                os.rmdir(leased.mp / "leased" / "sub")
                (leased.mp / "leased" / "made").mkdir()
                (leased.mp / "leased" / "made" / "deeper").mkdir()
                (leased.mp / "leased" / "made" / "f").write_text("made here")
                waiter = threading.Thread(target=os.unlink, args=(sync.mp / "sync" / "f1",))
                waiter.start()
                waiter.join(1.0)
                assert waiter.is_alive(), "an unlink on the sync_namespace mount returned " \
                                          "while the metadata server was stopped"
                listing = []
                lister = threading.Thread(
                    target=lambda: listing.extend(os.listdir(leased.mp / "leased")))
                lister.start()
                lister.join(0.5)
                assert lister.is_alive(), "a listing was answered without the server"
            finally:
                os.kill(meta, signal.SIGCONT)
            waiter.join(30)
            lister.join(30)
            assert sorted(listing) == ["f3", "g2", "made"]
            with cluster.client() as cli:
                assert sorted(s.name for s in cli.list_status("/leased")) == \
                    ["f3", "g2", "made"]
                assert sorted(s.name for s in cli.list_status("/leased/made")) == \
                    ["deeper", "f"]
                assert cli.read_file("/leased/made/f") == b"made here"
                assert sorted(s.name for s in cli.list_status("/sync")) == ["f2", "f3"]
        finally:
            for m in (leased, sync):
                m.stop()
                m.cleanup()


# ------------------------------------------------------------------ crashes

REMOVER = r"""
import os, sys
top, log = sys.argv[1], sys.argv[2]
with open(log, "w") as out:
    for folder in sorted(os.listdir(top)):
        for name in sorted(os.listdir(os.path.join(top, folder))):
            path = os.path.join(top, folder, name)
            if name.endswith("0"):
                os.rename(path, path + "-moved")
                out.write(f"rename {folder}/{name} {folder}/{name}-moved\n")
            else:
                os.unlink(path)
                out.write(f"unlink {folder}/{name}\n")
            out.flush()
        os.rename(os.path.join(top, folder), os.path.join(top, folder + "-done"))
        out.write(f"rename {folder} {folder}-done\n")
        out.flush()
"""


def kill_mount_while(m: Mount, worker: subprocess.Popen, progressed, what: str) -> None:
    """kill -9 of mount ``m`` once ``progressed()`` while ``worker`` works through it (the
    worker's next call then fails and it ends)."""
    try:
        assert poll_until(progressed, 120), f"{what} stalled"
        m.proc.kill()
        m.proc.wait(30)
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
        m.proc = None
        m.cleanup()


def apply_ops(start: set[str], ops: list[str]) -> set[str]:
    """The tree (relative paths) after ``ops`` (``unlink P``, ``rename S D``) from
    ``start``; a folder rename moves what is below it."""
    current = set(start)
    for op in ops:
        kind, *args = op.split()
        if kind == "unlink":
            current.remove(args[0])
        else:
            src, dst = args
            moved = {p for p in current if p == src or p.startswith(src + "/")}
            current -= moved
            current |= {dst + p[len(src):] for p in moved}
    return current


def test_a_mount_killed_mid_removal_leaves_a_prefix_of_its_operations(tmp_path):
    """kill -9 of a mount while a script unlinks and renames through it (each operation
    logged once it returned): the server's namespace equals the starting tree after the
    first k operations for some k (no operation applied out of order, none half-done), and
    the store's invariants hold."""
    with ProcessCluster(tmp_path, n_storage=1, settings=SETTINGS) as cluster:
        with cluster.client() as cli:
            for i in range(10):
                for j in range(60):
                    cli.write_file(f"/tree/d{i}/f{j}", b"x")
        start = {f"d{i}" for i in range(10)} | {
            f"d{i}/f{j}" for i in range(10) for j in range(60)}
        m = Mount(cluster, "victim").start()
        log = tmp_path / "ops.log"
        script = subprocess.Popen([sys.executable, "-c", REMOVER, str(m.mp / "tree"), str(log)])
        kill_mount_while(m, script, lambda: log.exists() and
                         log.read_text().count("\n") >= 250, "the script")
        ops = log.read_text().splitlines()
        with cluster.client() as cli:
            found = set()
            for status in walk(cli, "/tree"):
                found.add(os.path.relpath(status.path, "/tree"))
        prefixes = [k for k in range(len(ops) + 2)
                    if k <= len(ops) and apply_ops(start, ops[:k]) == found]
        assert prefixes, (f"the server's tree is no prefix of the {len(ops)} operations "
                          f"logged: {len(found)} paths")
        assert prefixes[-1] >= 1
        cluster.stop()
        assert store_problems(cluster) == []


def test_changes_survive_a_metadata_server_restart(tmp_path):
    """Changes made under a lease and fsync'ed before kill -9 of the metadata server are
    there after its restart; changes made while it was down (the lease is still held:
    grants are journaled) are sent once it is back; another client then sees both."""
    with ProcessCluster(tmp_path, n_storage=1, settings=SETTINGS) as cluster:
        m = Mount(cluster, "holder").start()
        try:
            d = m.mp / "kept"
            d.mkdir()
            for n in range(6):
                (d / f"f{n}").write_text(str(n))
            os.unlink(d / "f0")
            os.rename(d / "f1", d / "g1")
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)   # durable from here
            finally:
                os.close(fd)
            cluster.kill_meta()
            os.unlink(d / "f2")   # decided under the lease, queued while the server is down
            cluster.start_meta()
            cluster.wait_ready()
            with cluster.client() as cli:
                names = sorted(s.name for s in cli.list_status("/kept"))
            assert names == ["f3", "f4", "f5", "g1"]
            assert sorted(os.listdir(d)) == names
            assert (d / "g1").read_text() == "1"
        finally:
            m.stop()
            m.cleanup()


# ------------------------------------------------------------------ files open here

@pytest.fixture(scope="module")
def uncached(cluster):
    """A mount whose kernel caches nothing: every lookup and getattr reaches the mount,
    which answers what it can from the leases it holds."""
    yield from mounted(cluster, "uncached", "--set", "mount_entry_timeout=0",
                       "--set", "mount_attr_timeout=0", "--set", "mount_negative_timeout=0")


def test_files_open_here_keep_their_content_through_unlink_and_rename(cluster, uncached):
    """Under a held lease: an unlinked file open here keeps its content for its handles,
    a rename over a file open here too; a file written here after the grant shows its new
    size at the next lookup (the lease's snapshot of it is stale, the server is asked)."""
    d = uncached.mp / "open-here"
    d.mkdir()
    for name in ("a", "b", "c", "lock"):
        (d / name).write_text(name * 10)
    os.unlink(d / "lock")   # the lease is held from here
    with open(d / "a") as reader:
        os.unlink(d / "a")
        assert reader.read() == "a" * 10
    with open(d / "b") as reader:
        os.rename(d / "c", d / "b")
        assert reader.read() == "b" * 10
    assert (d / "b").read_text() == "c" * 10
    with open(d / "grow", "w") as fh:
        fh.write("x" * 100)
    (d / "b").write_text("longer " * 20)
    assert os.stat(d / "grow").st_size == 100
    assert os.stat(d / "b").st_size == 140
    os.chmod(d / "grow", 0o600)
    assert os.stat(d / "grow").st_mode & 0o777 == 0o600
    # files closed just before a grant, and renamed under it: every lookup (none cached)
    # is answered with the size written
    e = uncached.mp / "fresh-grant"
    e.mkdir()
    (e / "other").write_text("o")
    for n in range(5):
        (e / f"w{n}").write_text("z" * (10 + n))
        os.unlink(e / "other") if n == 0 else os.rename(e / f"w{n - 1}", e / f"v{n - 1}")
        assert os.stat(e / f"w{n}").st_size == 10 + n
    with cluster.client() as cli:
        assert sorted(s.name for s in cli.list_status("/open-here")) == ["b", "grow"]
        assert cli.get_file_status("/open-here/b").length == 140
        assert cli.get_file_status("/open-here/grow").mode == 0o600


def test_a_mount_killed_mid_tar_leaves_a_prefix_of_the_archive(tmp_path):
    """kill -9 of a mount while tar -xf extracts through it: the server holds the
    archive's first k members for some k (the one being extracted at the kill may be
    there too, partly written), each earlier file with its whole content; the store's
    invariants hold."""
    from tools.bench import sourcetree

    tree = sourcetree.generate(1500, 7)
    archive = tmp_path / "tree.tar"
    sourcetree.write_tar(tree, str(archive))
    order = [e.rel for e in tree.entries]
    content = {e.rel: e.data for e in tree.entries if e.kind == "f"}
    with ProcessCluster(tmp_path / "c", n_storage=1, settings=SETTINGS) as cluster:
        m = Mount(cluster, "tar").start()
        (m.mp / "x").mkdir()
        tar = subprocess.Popen(["tar", "-xf", str(archive)], cwd=m.mp / "x",
                               stderr=subprocess.DEVNULL)
        top = m.mp / "x" / order[0]
        kill_mount_while(m, tar, lambda: top.exists() and sum(
            len(f) + len(d) for _, d, f in os.walk(top)) >= len(order) // 2, "tar")
        with cluster.client() as cli:
            found = {os.path.relpath(s.path, "/x") for s in walk(cli, "/x")} | {order[0]}
            k = max(i for i, rel in enumerate(order) if rel in found) + 1
            missing = [rel for rel in order[:k - 1] if rel not in found]
            assert not missing, f"members before the last one found are missing: {missing[:5]}"
            assert found <= set(order[:k]), sorted(found - set(order[:k]))[:5]
            assert len(order) // 2 <= k < len(order)
            for rel in order[:k - 2]:
                if rel in content:
                    assert cli.read_file("/x/" + rel) == content[rel], rel
        cluster.stop()
        assert store_problems(cluster) == []


def test_a_lease_the_mount_did_not_know_of_is_given_back_at_its_recall(tmp_path):
    """A grant whose answer never reached the mount (here: asked for in the mount's name
    by another process) is still the mount's: a recall of it makes the mount give it back
    at once, instead of the caller waiting for the recall to expire."""
    from fs.client import Client
    from mount.runner import mount_client_name

    with ProcessCluster(tmp_path, n_storage=1,
                       settings={**SETTINGS, "dir_lease_recall_limit": 60}) as cluster:
        m = Mount(cluster, "forgetful").start()
        try:
            (m.mp / "d").mkdir()
            (m.mp / "d" / "f").write_text("f")
            # on the server before the impostor, which as the same client recalls nothing
            fd = os.open(m.mp / "d", os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            holder = mount_client_name(str(m.mp)).rsplit("-", 1)[0] + f"-{m.proc.pid}"
            with Client(cluster.meta_address, config=cluster.config(),
                        client_name=holder) as impostor:
                assert impostor.dir_lease_acquire("/d")["epoch"]
            with cluster.client() as cli:
                assert [s.name for s in cli.list_status("/d")] == ["f"]
            assert "recall went unanswered" not in (cluster.base / "logs" / "meta.log") \
                .read_text(errors="replace")
        finally:
            m.stop()
            m.cleanup()


def test_a_recall_reaches_a_mount_whose_call_timeout_is_shorter_than_the_servers_poll(
        tmp_path):
    """A mount whose call timeout (``mount_meta_timeout``) is shorter than the longest poll
    the server holds: each recall still reaches it at once and is answered, so another
    client's change in a folder the mount held waits for no recall limit, and the mount
    sees it. (A poll that outlived its call took the recall with it: the other client
    then waited out the limit, and the mount, never told, kept answering from the lease.)"""
    with ProcessCluster(tmp_path, n_storage=1,
                        settings={**SETTINGS, "dir_lease_recall_limit": 60}) as cluster:
        m = Mount(cluster, "short", "--set", "mount_meta_timeout=2").start()
        try:
            (m.mp / "d").mkdir()
            for n in range(3):
                (m.mp / "d" / f"f{n}").write_text("f")   # the folder is held here
                # fixed-sleep: past the call timeout, as an idle holder's poll outlives it
                time.sleep(3)
                started = time.monotonic()
                with cluster.client() as cli:
                    cli.mkdirs(f"/d/made{n}")
                assert time.monotonic() - started < 10
                assert (m.mp / "d" / f"made{n}").is_dir()
            assert sorted(os.listdir(m.mp / "d")) == sorted(
                [f"f{n}" for n in range(3)] + [f"made{n}" for n in range(3)])
        finally:
            m.stop()
            m.cleanup()


# ------------------------------------------------------------------ files created here

def make_files(top: Path) -> None:
    """The same creates, on a mount and on a local folder: an empty file, a small one,
    one past the inline limit (its blocks need its create on the server first), times
    and mode set before the close (as tar does), one renamed while open, one unlinked
    while open, and an O_EXCL create of an existing name."""
    (top / "empty").touch()
    (top / "small").write_bytes(b"s" * 1000)
    (top / "big").write_bytes(bytes(range(256)) * 1000)   # 256,000 bytes
    fd = os.open(top / "tarred", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"member")
    os.utime(fd, ns=(10**17, 10**17))
    os.fchmod(fd, 0o640)
    os.close(fd)
    with open(top / "moving", "wb") as fh:
        fh.write(b"moved while open")
        os.rename(top / "moving", top / "moved")
        fh.write(b", then written")
    with open(top / "doomed", "wb") as fh:
        fh.write(b"gone")
        os.unlink(top / "doomed")
        fh.write(b" before its close")
    try:
        os.close(os.open(top / "small", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        (top / "excl").write_text("EEXIST")
    for n in range(20):
        (top / f"n{n}").write_text(str(n) * n)


def facts_of(top: Path) -> dict:
    out = {}
    for name in sorted(os.listdir(top)):
        st = os.stat(top / name)
        out[name] = {"data": (top / name).read_bytes(), "size": st.st_size,
                     "mode": oct(st.st_mode & 0o7777),
                     "mtime": st.st_mtime_ns if name == "tarred" else None}
    return out


def agree_with_local(a: Mount, b: Mount, tmp_path: Path, name: str, make, facts,
                     prepare=None):
    """``make`` run on a local folder and on folder ``name`` of mount A, which holds it
    (its first change took the lease: what ``make`` does there is decided here): what A
    shows at once, what B shows (its access recalls A's leases) and what A shows again
    from the server all equal the local outcome, which is returned. ``prepare`` runs on
    both first, before the lease."""
    local = tmp_path / name
    local.mkdir()
    top = a.mp / name
    top.mkdir()
    if prepare is not None:
        prepare(local)
        prepare(top)
    (top / "lease").write_text("x")
    os.unlink(top / "lease")   # held from here
    make(local)
    make(top)
    want = facts(local)
    assert facts(top) == want                     # answered here, maybe queued
    assert facts(b.mp / name) == want             # B's access recalls A's lease
    assert facts(top) == want                     # A again, from the server now
    return want


def test_files_created_here_are_what_a_local_filesystem_has(cluster, a, b, tmp_path):
    """Files created in a folder held here are decided here (an inode the grant reserved)
    and sent afterwards with their content: what the creating mount shows at once, what
    it shows after its lease was recalled, what another mount and the CLI client read,
    all equal a local folder's outcome of the same calls; owner and group are the ones a
    create call gives."""
    want = agree_with_local(a, b, tmp_path, "created", make_files, facts_of)
    with cluster.client() as cli:
        for status in cli.list_status("/created"):
            assert cli.read_file(status.path) == want[status.name]["data"], status.name
            assert not status.under_construction, status.name
            assert status.owner == "root" and status.group == "root", status


def set_attributes(top: Path) -> None:
    """tar's order: each file's mode and times right after its close, a folder's mode at
    its mkdir and its times at the end; a chown to who made it; files of the folder held
    from before, made here and closed, and a folder made here."""
    for n in range(5):
        (top / f"f{n}").write_bytes(b"x" * n)
        os.chown(top / f"f{n}", 0, 0)
        os.chmod(top / f"f{n}", 0o600 | n)
        os.utime(top / f"f{n}", ns=(10**17 + n, 2 * 10**17 + n))
    (top / "sub").mkdir()
    os.chmod(top / "sub", 0o750)
    (top / "sub" / "inner").write_text("i")
    os.utime(top / "sub" / "inner", ns=(10**17, 4 * 10**17))
    os.utime(top / "sub", ns=(10**17, 3 * 10**17))
    os.chmod(top / "old", 0o444)
    os.utime(top / "old", ns=(5 * 10**17, 6 * 10**17))


def walked(top: Path, fact) -> dict:
    """``fact(path, its stat, whether it is a folder)`` of every entry below ``top``, by
    its path relative to ``top``."""
    out = {}
    for where, folders, files in os.walk(top):
        for name in folders + files:
            path = Path(where) / name
            out[str(path.relative_to(top))] = fact(path, os.stat(path), name in folders)
    return out


def attributes_of(top: Path) -> dict:
    return walked(top, lambda path, st, folder: (
        oct(st.st_mode), st.st_mtime_ns, None if folder else st.st_size, st.st_uid,
        st.st_gid))


def test_attributes_set_here_are_what_a_local_filesystem_has(cluster, a, b, tmp_path):
    """chmod, chown and utimens of entries of a folder held here are decided here and
    queued: what the mount shows at once, what another mount shows (its access recalls
    the lease), what the CLI client reads and what the mount shows again from the server
    all equal a local folder's outcome of the same calls."""
    want = agree_with_local(a, b, tmp_path, "attrs", set_attributes, attributes_of,
                            prepare=lambda top: (top / "old").write_text("o"))
    with cluster.client() as cli:
        for name, (mode, mtime, _, _, _) in want.items():
            status = cli.get_file_status(f"/attrs/{name}")
            assert (oct(status.mode), status.mtime_ns) == (oct(int(mode, 8) & 0o7777),
                                                           mtime), name


def test_a_created_files_group_follows_a_setgid_folder(cluster, a, b):
    """In a setgid folder a new file takes the folder's group (the server's rule), and the
    mount that decided the create locally says so before and after the server has it."""
    top = a.mp / "sgid"
    top.mkdir()
    os.chown(top, 0, 1)
    os.chmod(top, 0o2775)
    (top / "first").write_text("1")
    os.unlink(top / "first")
    (top / "f").write_text("f")
    assert os.stat(top / "f").st_gid == 1
    assert os.stat(b.mp / "sgid" / "f").st_gid == 1
    assert os.stat(top / "f").st_gid == 1


def make_folders(top: Path) -> None:
    """Folders made in a held folder, as a tree being extracted makes them: nested ones,
    files in them, one removed again, one renamed, one made in a setgid folder, and a
    mkdir of a name that exists."""
    (top / "x").mkdir(0o750)
    (top / "x" / "y").mkdir(0o700)
    (top / "x" / "y" / "z").mkdir()
    (top / "x" / "y" / "z" / "f").write_text("deep")
    (top / "x" / "g").write_text("g")
    (top / "gone").mkdir()
    (top / "gone").rmdir()
    (top / "old").mkdir()
    (top / "old" / "in").write_text("moved along")
    os.rename(top / "old", top / "new")
    (top / "s").mkdir()
    os.chown(top / "s", 0, 1)
    os.chmod(top / "s", 0o2775)
    (top / "s" / "t").mkdir(0o755)
    try:
        (top / "x").mkdir()
    except FileExistsError:
        (top / "x" / "eexist").write_text("EEXIST")
    for n in range(12):
        (top / "many" / str(n)).mkdir(parents=True)


def folders_of(top: Path) -> dict:
    return walked(top, lambda path, st, folder: (
        oct(st.st_mode), st.st_uid, st.st_gid, None if folder else path.read_text()))


def test_folders_made_here_are_what_a_local_filesystem_has(cluster, a, b, tmp_path):
    """Folders made in a folder held here are decided here (an inode the grant reserved,
    their own lease along) and sent afterwards: what the mount shows at once, what
    another mount shows (its access recalls the leases), what the mount shows again from
    the server, and the CLI client's listing all equal a local folder's outcome."""
    agree_with_local(a, b, tmp_path, "folders", make_folders, folders_of)
    with cluster.client() as cli:
        assert cli.get_file_status("/folders/s/t").group == \
            cli.get_file_status("/folders/s").group
        assert sorted(s.name for s in cli.list_status("/folders")) == \
            ["many", "new", "s", "x"]


def test_a_folder_made_here_is_listed_with_the_times_its_changes_gave_it(cluster, a):
    """A folder made and changed here is held here with its parent: a listing of the
    parent (readdirplus hands the kernel every entry's attributes) shows the folder's
    times as the changes in it set them, as a stat and the server do (tar compares a
    folder's stat before and after reading it: "file changed as we read it")."""
    top = a.mp / "listed"
    top.mkdir()
    (top / "lease").write_text("x")
    os.unlink(top / "lease")   # held from here
    (top / "c").mkdir()
    made = os.stat(top / "c").st_mtime_ns
    (top / "c" / "f").write_bytes(b"f" * 100)
    changed = os.stat(top / "c").st_mtime_ns
    assert changed > made
    listed = {entry.name: entry.stat(follow_symlinks=False).st_mtime_ns
              for entry in os.scandir(top)}
    assert listed == {"c": changed}
    assert os.stat(top / "c").st_mtime_ns == changed
    with cluster.client() as cli:
        assert cli.get_file_status("/listed/c").mtime_ns == changed


def test_a_file_closed_on_one_mount_is_read_whole_on_the_other(a, b):
    """close-to-open across mounts: each file A creates and closes in a folder it holds
    is read whole by B right after (B's open recalls A's lease, which sends the create
    and the content first)."""
    top = a.mp / "c2o"
    top.mkdir()
    for n in range(30):
        data = os.urandom(n * 997)
        (top / f"f{n}").write_bytes(data)
        assert (b.mp / "c2o" / f"f{n}").read_bytes() == data, n


def test_small_files_made_here_are_read_back_without_a_call(cluster, a, b):
    """Files A makes and closes in a folder it holds are read back on A from what it
    kept (the metadata server answers no status or block lookup for them), whole, at
    any offset, and after a chmod; a file rewritten here is read with its new content, and
    once B's access took the lease and B rewrote one, A reads what the server has."""
    top = a.mp / "back"
    top.mkdir()
    made = {f"f{n}": os.urandom(n * 1013) for n in range(20)}
    for name, data in made.items():
        (top / name).write_bytes(data)
    os.chmod(top / "f3", 0o600)
    before = (meta_calls(cluster, "get_file_info"), meta_calls(cluster, "get_block_locations"))
    for name, data in made.items():
        assert (top / name).read_bytes() == data, name
        with open(top / name, "rb") as f:
            f.seek(len(data) // 2)
            assert f.read() == data[len(data) // 2:], name
    after = (meta_calls(cluster, "get_file_info"), meta_calls(cluster, "get_block_locations"))
    assert after == before, f"calls for files made here: {before} -> {after}"
    (top / "f5").write_bytes(b"again")
    assert (top / "f5").read_bytes() == b"again"
    with open(top / "f6", "r+b") as f:   # changed in place: read back as it is now
        f.seek(3)
        f.write(b"XY")
    assert (top / "f6").read_bytes() == made["f6"][:3] + b"XY" + made["f6"][5:]
    assert (b.mp / "back" / "f7").read_bytes() == made["f7"]
    other = os.urandom(len(made["f7"]))   # the same length: A's kernel may keep the size
    (b.mp / "back" / "f7").write_bytes(other)
    assert (top / "f7").read_bytes() == other


def test_files_renamed_here_are_still_known_to_the_lease(cluster, a, b):
    """Files written under a temporary name and renamed, as git writes each object: A
    answers their status and the folder's listing from its lease (no status or listing
    call), with the ctime the rename gave them, which is the server's once B's access
    took the lease."""
    top = a.mp / "objects"
    top.mkdir()
    made = {}
    for n in range(24):
        tmp = top / f"tmp_obj_{n}"
        tmp.write_bytes(os.urandom(100 + n))
        os.chmod(tmp, 0o444)
        made[f"{n:02x}{'ab' * 19}"] = tmp.read_bytes()
        os.rename(tmp, top / f"{n:02x}{'ab' * 19}")
    before = (meta_calls(cluster, "get_file_info"), meta_calls(cluster, "list_status"))
    assert sorted(os.listdir(top)) == sorted(made)
    seen = {name: os.stat(top / name) for name in made}
    for name, data in made.items():
        assert (top / name).read_bytes() == data
    after = (meta_calls(cluster, "get_file_info"), meta_calls(cluster, "list_status"))
    assert after == before, f"calls for files renamed here: {before} -> {after}"
    for name in made:
        there = os.stat(b.mp / "objects" / name)
        here = seen[name]
        assert (there.st_ctime_ns, there.st_mtime_ns, there.st_size, there.st_mode) == (
            here.st_ctime_ns, here.st_mtime_ns, here.st_size, here.st_mode), name


def test_a_big_file_made_here_is_known_to_the_lease_after_its_close(cluster, a, b):
    """A file past ``inline_max`` made here is written through blocks and closed by a
    call; the lease then learns its status, so the folder is still listed and the file
    statted from the lease (as rm -rf and git walk a tree with a few big files), with
    what the server has."""
    top = a.mp / "big"
    top.mkdir()
    (top / "small").write_bytes(b"s" * 100)
    data = os.urandom(200_000)
    (top / "large").write_bytes(data)

    def calls():
        return meta_calls(cluster, "get_file_info"), meta_calls(cluster, "list_status")

    def listed_from_the_lease():
        before = calls()
        return sorted(os.listdir(top)) == ["large", "small"] and calls() == before

    # the kernel releases the file after close(2) returned: the close, and the status
    # call that teaches the lease, follow it
    assert poll_until(listed_from_the_lease, timeout=10), calls()
    before = calls()
    here = os.stat(top / "large")
    assert calls() == before
    assert here.st_size == len(data)
    there = os.stat(b.mp / "big" / "large")
    assert (there.st_size, there.st_mtime_ns, there.st_ctime_ns, there.st_mode) == (
        here.st_size, here.st_mtime_ns, here.st_ctime_ns, here.st_mode)
    assert (b.mp / "big" / "large").read_bytes() == data


def test_a_file_closed_and_at_once_removed_or_replaced_goes_under_the_lease(cluster, a, b):
    """close(2) returns before the kernel's release of the file is through (the release
    publishes it: its blocks, its close), so a program that closes a file and at once
    unlinks it (sqlite's rollback journal) or renames another over it (an editor's save, git's
    lock file) finds it still open here; the change waits for that release and is then
    decided under the folder's lease, with no call of its own; B sees the end state."""
    top = a.mp / "closing"
    top.mkdir()
    (top / "warm").write_bytes(b"w")   # the folder's lease taken
    kept = os.urandom(150_000)

    def changes():
        return meta_calls(cluster, "delete"), meta_calls(cluster, "rename")

    before = changes()
    for i in range(5):
        journal = top / f"db-journal{i}"
        with open(journal, "wb") as out:   # past inline_max: blocks, a stream, a close
            out.write(os.urandom(150_000))
            out.flush()
            os.fsync(out.fileno())
        os.unlink(journal)
        with open(top / "saved.tmp", "wb") as out:
            out.write(kept[::-1])
        with open(top / "saved", "wb") as out:   # closed just before it is replaced
            out.write(kept)
        os.rename(top / "saved.tmp", top / "saved")
    assert changes() == before
    assert sorted(os.listdir(top)) == ["saved", "warm"]
    assert (top / "saved").read_bytes() == kept[::-1]
    assert sorted(os.listdir(b.mp / "closing")) == ["saved", "warm"]
    assert (b.mp / "closing" / "saved").read_bytes() == kept[::-1]


def test_many_creates_in_one_folder_are_all_decided_under_its_lease(cluster, a, b):
    """More creates in a folder, and in folders made under it, than a grant reserves
    inodes for: the leases ask for more ahead (refills), so none of them is a call, and
    every file is there with its content. (The module's short recall limit also checks
    that the lease stays usable from its grant on: a poll sent before it, waiting as long
    as the default limit allows, is asked again with the lease's shorter wait.)"""
    from mount.dirleases import INOS_PER_GRANT

    top = a.mp / "many"
    top.mkdir()
    (top / "sub").mkdir()
    count = 2 * INOS_PER_GRANT + 50
    calls = meta_calls(cluster, "create"), meta_calls(cluster, "mkdirs")
    for n in range(count):
        (top / f"f{n}").write_text(str(n))
        if n % 3 == 0:
            (top / "sub" / f"s{n}").write_text(str(-n))
        if n % 400 == 0:   # folders made here take a part of the range in use
            (top / f"d{n}").mkdir()
            (top / f"d{n}" / "x").write_text(str(n))
    assert (meta_calls(cluster, "create"), meta_calls(cluster, "mkdirs")) == calls
    folders = [f"d{n}" for n in range(0, count, 400)]
    assert sorted(os.listdir(b.mp / "many")) == sorted(
        [f"f{n}" for n in range(count)] + ["sub"] + folders)
    assert len(os.listdir(b.mp / "many" / "sub")) == len(range(0, count, 3))
    for n in range(0, count, 97):
        assert (b.mp / "many" / f"f{n}").read_text() == str(n)
    for n in range(0, count, 3 * 97):
        assert (b.mp / "many" / "sub" / f"s{n}").read_text() == str(-n)
    for name in folders:
        assert (b.mp / "many" / name / "x").read_text() == name[1:]


def test_fsync_makes_files_created_here_durable_before_a_kill(tmp_path):
    """fsync(2) of a file created under a lease (one with nothing written too), and of
    its folder after others were closed: after kill -9 of the mount the server has each
    of them with its content."""
    with ProcessCluster(tmp_path, n_storage=1, settings=SETTINGS) as cluster:
        m = Mount(cluster, "dur").start()
        try:
            d = m.mp / "dur"
            d.mkdir()
            (d / "seed").write_text("s")
            os.unlink(d / "seed")
            for n in range(10):
                (d / f"closed{n}").write_text(f"closed {n}")
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fd = os.open(d / "synced", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(fd, b"synced while open")
            os.fsync(fd)
            empty = os.open(d / "empty", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.fsync(empty)   # nothing written: the create alone is made durable
            m.proc.kill()
            m.proc.wait(30)
            for one in (fd, empty):
                with pytest.raises(OSError):   # its mount is gone
                    os.close(one)
        finally:
            m.proc = None
            m.cleanup()
        with cluster.client() as cli:
            for n in range(10):
                assert cli.read_file(f"/dur/closed{n}") == f"closed {n}".encode()
            assert cli.read_file("/dur/synced") == b"synced while open"
            assert cli.get_file_status("/dur/empty").length == 0


def test_a_database_created_in_a_held_folder_takes_its_locks(a, b):
    """sqlite creates its database in a folder held here (the create is queued) and locks
    it at once: the lock waits for the create to reach the server, every transaction
    commits, and another mount reads every row."""
    import sqlite3

    top = a.mp / "db"
    top.mkdir()
    (top / "x").write_text("x")
    os.unlink(top / "x")   # held from here
    con = sqlite3.connect(top / "rows.db", isolation_level=None)
    con.execute("create table t (k integer primary key, v text)")
    for tx in range(20):
        con.execute("begin")
        for i in range(50):
            con.execute("insert into t(v) values (?)", (f"{tx}-{i}",))
        con.execute("commit")
    assert con.execute("pragma integrity_check").fetchone() == ("ok",)
    con.close()
    other = sqlite3.connect(f"file:{b.mp / 'db' / 'rows.db'}?mode=ro", uri=True)
    try:
        assert other.execute("select count(*) from t").fetchone() == (1000,)
    finally:
        other.close()


# ------------------------------------------------------------------ drafts (mount.drafts)

INLINE_MAX = 64 << 10   # the cluster's inline_max (the default)


def held_folder(m: Mount, name: str) -> Path:
    """A new folder on mount ``m`` whose lease ``m`` holds (its first changes took it)."""
    top = m.mp / name
    top.mkdir()
    (top / "lease").write_text("x")
    os.unlink(top / "lease")
    return top


def read_by_cli(cluster: ProcessCluster, path: str) -> tuple[bytes, bool]:
    """What the CLI client reads of ``path``, and whether it is still under construction."""
    with cluster.client() as cli:
        return cli.read_file(path), cli.get_file_status(path).under_construction


def test_a_file_published_inline_then_grown_past_the_limit_is_read_whole(cluster, a, b):
    """A file created here is written in pieces; the close of a dup (FUSE flush) publishes
    its first bytes inline, then it grows past inline_max (its bytes go to a block from
    there) and is closed: another mount and the CLI read exactly what was written, and the
    same after several inline publishes and past a block server packet of writes."""
    top = held_folder(a, "grown")
    cases = {"once": (1000, 1, INLINE_MAX + 5000), "often": (10, 6, 3 * INLINE_MAX),
             "at the limit": (INLINE_MAX, 1, 1)}
    wrote = {}
    for name, (first, publishes, then) in cases.items():
        data = bytearray()
        fd = os.open(top / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for _ in range(publishes):
                piece = os.urandom(first)
                os.write(fd, piece)
                data += piece
                os.close(os.dup(fd))   # a flush: the content so far is published
            rest = os.urandom(then)
            for at in range(0, len(rest), 7000):   # in pieces, as cp writes
                os.write(fd, rest[at:at + 7000])
            data += rest
        finally:
            os.close(fd)
        wrote[name] = bytes(data)
    for name, data in wrote.items():
        assert (b.mp / "grown" / name).read_bytes() == data, name
        assert read_by_cli(cluster, f"/grown/{name}") == (data, False), name
        assert (top / name).read_bytes() == data, name


def test_a_draft_promoted_while_another_descriptor_stays_open(cluster, a, b):
    """A file created here grows past inline_max while another descriptor of it stays
    open (its writer's close then does not end the file's open state here): what each
    mount reads, during and after, is every byte written."""
    top = held_folder(a, "twofds")
    data = os.urandom(INLINE_MAX + 12345)
    fd = os.open(top / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    other = os.open(top / "f", os.O_RDONLY)
    try:
        os.write(fd, data[:100])
        os.write(fd, data[100:])   # past the limit: the file takes a stream here
        os.close(fd)
        fd = None
        assert os.pread(other, len(data) + 10, 0) == data
        assert (b.mp / "twofds" / "f").read_bytes() == data
    finally:
        if fd is not None:
            os.close(fd)
        os.close(other)
    assert read_by_cli(cluster, "/twofds/f") == (data, False)
    assert (top / "f").read_bytes() == data


def test_a_file_created_here_rewritten_in_place_ends_with_its_content(cluster, a, b):
    """A write elsewhere than the end moves a file created here to a staging file (its
    bytes still held in memory, or published inline first); its upload starts the file
    over under the same lease: the content read afterwards is what was written, for a
    small file, one published before, one fsynced before and one past inline_max."""
    top = held_folder(a, "inplace")
    want = {}
    for name, size, before in (("small", 1000, None), ("published", 3000, "flush"),
                               ("synced", 3000, "fsync"), ("big", INLINE_MAX + 999, None)):
        data = bytearray(os.urandom(size))
        fd = os.open(top / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            if before == "flush":
                os.close(os.dup(fd))
            elif before == "fsync":
                os.fsync(fd)
            os.pwrite(fd, b"XY", 10)   # elsewhere than the end: staged
            data[10:12] = b"XY"
            os.write(fd, b"tail")      # at the descriptor's offset: the end
            data += b"tail"
            os.close(os.dup(fd))       # the staged content uploaded, the lease kept
            os.pwrite(fd, b"Z", 0)
            data[0:1] = b"Z"
        finally:
            os.close(fd)
        want[name] = bytes(data)
    for name, data in want.items():
        assert (top / name).read_bytes() == data, name
        assert (b.mp / "inplace" / name).read_bytes() == data, name
        assert read_by_cli(cluster, f"/inplace/{name}") == (data, False), name


def test_empty_files_created_here_are_closed_empty(cluster, a, b):
    """Empty files created here (touch, an fsynced one, one flushed twice) are complete and
    empty for another mount and the CLI."""
    top = held_folder(a, "empties")
    (top / "touched").touch()
    fd = os.open(top / "synced", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.fsync(fd)
    os.close(os.dup(fd))
    os.close(fd)
    fd = os.open(top / "flushed", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(os.dup(fd))
    os.close(os.dup(fd))
    os.close(fd)
    for name in ("touched", "synced", "flushed"):
        assert (b.mp / "empties" / name).read_bytes() == b"", name
        assert os.stat(b.mp / "empties" / name).st_size == 0
        assert read_by_cli(cluster, f"/empties/{name}") == (b"", False), name
    assert oct(os.stat(b.mp / "empties" / "synced").st_mode & 0o777) == oct(0o600)


def test_fsynced_drafts_survive_a_kill_of_the_mount(tmp_path):
    """fsync(2) of files created here and still open, written and fsynced once, and more
    times than a file's content is stored inline (it takes a block then): after kill -9
    of the mount the server has each with what was fsynced."""
    with ProcessCluster(tmp_path, n_storage=1, settings=SETTINGS) as cluster:
        m = Mount(cluster, "kill").start()
        fds = []
        try:
            d = held_folder(m, "k")
            fd = os.open(d / "once", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            fds.append(fd)
            os.write(fd, b"synced once")
            os.fsync(fd)
            os.write(fd, b" and then lost")
            fd = os.open(d / "often", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            fds.append(fd)
            for n in range(8):
                os.write(fd, f"line {n}\n".encode())
                os.fsync(fd)
            m.proc.kill()
            m.proc.wait(30)
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass   # its mount is gone
            m.proc = None
            m.cleanup()
        with cluster.client() as cli:
            assert cli.read_file("/k/once") == b"synced once"
            assert cli.read_file("/k/often") == b"".join(f"line {n}\n".encode()
                                                         for n in range(8))
