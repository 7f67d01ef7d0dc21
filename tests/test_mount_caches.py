"""What the mount lets the kernel cache, and that it stays correct: cached misses
(negative entries), pages kept across opens of an unchanged file, and the directory
attributes a change answers with (served for the getattr the kernel sends after every
change in a directory). Two mount processes of one cluster are two clients.

Skipped (with the reason) when pyfuse3, /dev/fuse or fusermount3 is missing.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import ProcessCluster, errno_of, mounted, poll_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountcaches")
    with ProcessCluster(base, n_storage=2, settings={"replication": 2}) as c:
        yield c


@pytest.fixture(scope="module")
def slow_misses(cluster):
    """A mount whose kernel caches names, misses and attributes for 30 s: long enough to
    see a miss held, and so that no expired entry or attribute makes the kernel fetch a
    changed file's attributes: only the mount (its open, and the refresh after a release)
    can make it drop the pages it kept."""
    yield from mounted(cluster, "slowmiss", "--set", "mount_negative_timeout=30",
                        "--attr-timeout", "30", "--entry-timeout", "30")


@pytest.fixture(scope="module")
def other(cluster):
    yield from mounted(cluster, "other")




def test_a_cached_miss_holds_for_its_timeout_and_yields_to_this_mounts_creates(
        slow_misses, other):
    d = "misses"
    os.mkdir(slow_misses.mp / d)
    here, there = slow_misses.mp / d, other.mp / d
    assert poll_until(there.exists)

    # another client's create stays unseen while the miss is cached (30 s here) ...
    assert errno_of(os.stat, here / "theirs") == errno.ENOENT
    (there / "theirs").write_bytes(b"from the other mount")
    assert errno_of(os.stat, here / "theirs") == errno.ENOENT
    # ... and shows up on a mount with the default (1 s) timeout once it ran out
    assert errno_of(os.stat, there / "mine") == errno.ENOENT
    assert errno_of(os.stat, there / "dir") == errno.ENOENT

    # a name this mount creates replaces its own cached miss at once
    for name in ("mine", "dir", "link", "moved"):
        assert errno_of(os.stat, here / name) == errno.ENOENT
    (here / "mine").write_bytes(b"created here")
    os.mkdir(here / "dir")
    os.symlink("mine", here / "link")
    (here / "src").write_bytes(b"renamed here")
    os.rename(here / "src", here / "moved")
    assert (here / "mine").read_bytes() == b"created here"
    assert os.path.isdir(here / "dir")
    assert os.readlink(here / "link") == "mine"
    assert (here / "moved").read_bytes() == b"renamed here"

    assert poll_until(lambda: (there / "mine").exists() and (there / "dir").is_dir())
    assert (there / "mine").read_bytes() == b"created here"


def test_a_folder_made_here_answers_names_not_made_here_as_missing_for_the_miss_timeout(
        cluster, slow_misses, other):
    """A folder this mount made is empty as of its mkdir: for the miss timeout (30 s on
    this mount) a name not made in it through this mount is answered missing without a
    call, even one another client made meanwhile and this mount never looked up, the same
    bound as any cached miss; what this mount makes there is found at once, and once it
    removes or renames something there it asks the server again."""
    d = "made-here"
    os.mkdir(slow_misses.mp / d)
    here, there = slow_misses.mp / d, other.mp / d
    assert poll_until(there.exists)
    (there / "theirs").write_bytes(b"from the other mount")
    with cluster.client() as client:
        assert poll_until(lambda: client.is_file_closed(f"/{d}/theirs"))
    assert errno_of(os.stat, here / "theirs") == errno.ENOENT   # never looked up before
    (here / "mine").write_bytes(b"made here")
    os.mkdir(here / "sub")
    os.symlink("mine", here / "link")
    assert (here / "mine").read_bytes() == b"made here"
    assert os.path.isdir(here / "sub") and os.readlink(here / "link") == "mine"
    # an exclusive create of a name answered missing here is still refused by the server
    assert errno_of(os.open, here / "theirs", os.O_WRONLY | os.O_CREAT | os.O_EXCL) \
        == errno.EEXIST
    (there / "late").write_bytes(b"late")
    os.unlink(here / "link")   # a name went: the folder is no longer known
    assert (here / "late").read_bytes() == b"late"
    # a folder the other mount made is not known empty here: its names are looked up
    os.mkdir(there / "made-there")
    (there / "made-there" / "x").write_bytes(b"x")
    assert poll_until(lambda: (here / "made-there" / "x").exists())


def test_open_creat_of_a_name_cached_missing_opens_the_file_another_client_made(
        cluster, slow_misses, other):
    """The kernel trusts its cached miss and sends CREATE for a name another client has
    created meanwhile: without O_EXCL that is an open of the existing file (appending,
    truncating as asked), with O_EXCL EEXIST, as on a local filesystem."""
    d = "creat-after-miss"
    os.mkdir(other.mp / d)
    here, there = slow_misses.mp / d, other.mp / d
    assert poll_until((slow_misses.mp / d).exists)
    for name in ("appended", "truncated", "exclusive"):
        assert errno_of(os.stat, here / name) == errno.ENOENT   # cached as missing
        (there / name).write_bytes(b"theirs\n")
    with cluster.client() as client:   # the other mount's release completes them (its lease)
        for name in ("appended", "truncated", "exclusive"):
            assert poll_until(lambda: client.is_file_closed(f"/{d}/{name}"))
    fd = os.open(here / "appended", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"ours\n")
    os.close(fd)
    fd = os.open(here / "truncated", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"replaced\n")
    os.close(fd)
    assert errno_of(os.open, here / "exclusive", os.O_WRONLY | os.O_CREAT | os.O_EXCL) \
        == errno.EEXIST
    assert poll_until(lambda: (there / "appended").read_bytes() == b"theirs\nours\n")
    assert poll_until(lambda: (there / "truncated").read_bytes() == b"replaced\n")
    assert (there / "exclusive").read_bytes() == b"theirs\n"


def test_reopening_an_unchanged_file_keeps_pages_a_changed_one_does_not(
        cluster, slow_misses, other):
    here, there = slow_misses.mp / "kept", other.mp / "kept"
    with cluster.client() as client:
        def closed() -> bool:   # the release after close(2) completes the file a moment later
            return client.exists("/kept") and client.is_file_closed("/kept")

        here.write_bytes(b"A" * 5000)
        assert poll_until(closed)
        for _ in range(3):   # the second and third opens keep the kernel's pages
            assert here.read_bytes() == b"A" * 5000
        assert there.read_bytes() == b"A" * 5000

        with open(there, "r+b") as fh:   # rewritten in place: same inode, same length
            fh.write(b"B" * 5000)
        assert poll_until(closed)
        assert here.read_bytes() == b"B" * 5000

        with open(here, "ab") as fh:     # a change through this mount
            fh.write(b"C" * 10)
        assert poll_until(closed)
        assert here.read_bytes() == b"B" * 5000 + b"C" * 10
        os.truncate(here, 100)
        assert here.read_bytes() == b"B" * 100
        assert poll_until(lambda: there.stat().st_size == 100)
        assert there.read_bytes() == b"B" * 100


def test_directory_attributes_after_each_change_match_the_cluster(cluster, other):
    root = other.mp / "attrs"
    os.mkdir(root)
    with cluster.client() as client:
        def same(rel: str) -> None:
            st = os.stat(other.mp / rel)
            status = client.get_file_status("/" + rel)
            assert (st.st_mtime_ns, st.st_nlink) == (status.mtime_ns, 2 + status.subdirs), rel

        for i in range(3):
            os.mkdir(root / f"d{i}")
            same("attrs")
        assert os.stat(root).st_nlink == 5
        (root / "f").write_bytes(b"x")      # a create between two answered changes
        same("attrs")
        os.symlink("f", root / "l")
        same("attrs")
        os.rename(root / "d0", root / "d1" / "d0")
        same("attrs")
        same("attrs/d1")
        assert os.stat(root).st_nlink == 4 and os.stat(root / "d1").st_nlink == 3
        os.rmdir(root / "d1" / "d0")
        same("attrs/d1")
        os.unlink(root / "l")
        same("attrs")
        os.chmod(root / "d2", 0o700)
        assert os.stat(root / "d2").st_mode & 0o777 == 0o700
        same("attrs")


def test_a_replaced_symlink_reads_its_new_target(cluster, slow_misses, other):
    """readlink answers from the target seen at lookup (a symlink's target never changes;
    a new link is a new inode), so a link another client replaced reads the new target as
    soon as this mount's kernel looks the name up again."""
    os.symlink("first", other.mp / "link")
    assert os.readlink(other.mp / "link") == "first"
    assert poll_until(lambda: os.path.lexists(slow_misses.mp / "link"))
    assert os.readlink(slow_misses.mp / "link") == "first"
    with cluster.client() as client:
        client.unlink("/link")
        client.symlink("second", "/link")
    assert poll_until(lambda: os.readlink(other.mp / "link") == "second")
    os.unlink(other.mp / "link")


def test_a_file_written_here_answers_getattr_itself_for_the_attribute_timeout(cluster, other):
    """While this mount writes a file under its lease, the kernel's getattr (before a
    chown, after writes) is answered from what the mount knows, size included; a change
    another client makes meanwhile (a chmod) shows once the attribute timeout (1 s) has
    passed, as a cached attribute would."""
    import time

    path = other.mp / "written_here"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"x" * 5000)
        os.fchown(fd, os.getuid(), os.getgid())   # a no-op chown asks for attributes first
        st = os.fstat(fd)
        assert st.st_size == 5000 and st.st_mode & 0o777 == 0o644
        with cluster.client() as client:
            client.set_permission("/written_here", 0o600)
        # fixed-sleep: the mount's cached mode lapses on the real clock in another process
        time.sleep(1.5)
        os.write(fd, b"y" * 100)
        st = os.fstat(fd)
        assert st.st_size == 5100 and st.st_mode & 0o777 == 0o600
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 5000 + b"y" * 100


def test_a_folder_listing_answers_a_stat_walk_and_never_hides_a_change(cluster, other):
    """Stat walks (a stat of every file of a folder, ``git status``) are answered from one
    listing of the folder after a few lookups; still: a name another client just made is
    found at once (names the listing does not hold are asked for), this mount's own
    changes (write, chmod, truncate, rename, unlink) show at once, and another client's
    delete or chmod shows within the name and attribute timeout (1 s) as for any cached
    name."""
    d = "walk"
    folder = other.mp / d
    with cluster.client() as client:
        client.mkdirs(f"/{d}")   # not made here: no "made here, empty" knowledge
        for i in range(40):
            client.write_file(f"/{d}/f{i:02d}", b"x" * i)
        for _ in range(3):   # the walk: the listing is fetched during the first round
            assert [os.stat(folder / f"f{i:02d}").st_size for i in range(40)] == list(range(40))
            client.write_file(f"/{d}/new", b"brand new")          # another client's create
            assert (folder / "new").read_bytes() == b"brand new"  # found: never a stale miss
            client.delete(f"/{d}/new")
            assert poll_until(lambda: not (folder / "new").exists(), timeout=5)

        # this mount's own changes show at once
        (folder / "f01").write_bytes(b"rewritten here")
        assert os.stat(folder / "f01").st_size == 14
        os.chmod(folder / "f02", 0o600)
        assert os.stat(folder / "f02").st_mode & 0o777 == 0o600
        os.truncate(folder / "f03", 1000)
        assert os.stat(folder / "f03").st_size == 1000
        os.rename(folder / "f04", folder / "g04")
        assert not (folder / "f04").exists() and os.stat(folder / "g04").st_size == 4
        os.unlink(folder / "f05")
        assert not (folder / "f05").exists()

        # another client's changes show within the timeouts
        assert os.stat(folder / "f06").st_size == 6
        client.delete(f"/{d}/f06")
        client.set_permission(f"/{d}/f07", 0o640)
        assert poll_until(lambda: not (folder / "f06").exists(), timeout=5)
        assert poll_until(lambda: os.stat(folder / "f07").st_mode & 0o777 == 0o640, timeout=5)
    shutil.rmtree(folder)


def test_a_miss_the_mount_keeps_never_decides_a_create_or_a_rename(cluster, other):
    """A name looked up missing here is answered missing by the mount itself for the
    negative timeout (the kernel asks again before every O_EXCL create, link and rename);
    what follows is still decided by the server: another client's file meanwhile makes
    O_EXCL fail with EEXIST and is what a rename replaces; this mount's own create shows
    at once."""
    d = "kept-misses"
    here = other.mp / d
    with cluster.client() as client:
        client.mkdirs(f"/{d}")
        assert errno_of(os.stat, here / "theirs") == errno.ENOENT
        client.write_file(f"/{d}/theirs", b"made elsewhere")
        assert errno_of(os.open, here / "theirs", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                        0o644) == errno.EEXIST
        (here / "mine").write_bytes(b"made here")
        os.rename(here / "mine", here / "theirs")
        assert client.read_file(f"/{d}/theirs") == b"made here"
        assert (here / "theirs").read_bytes() == b"made here"

        assert errno_of(os.stat, here / "later") == errno.ENOENT
        os.mkdir(here / "later")                 # this mount's own change: seen at once
        assert (here / "later").is_dir()
        assert errno_of(os.stat, here / "gone") == errno.ENOENT
        client.write_file(f"/{d}/gone", b"x")
        assert poll_until(lambda: (here / "gone").exists(), timeout=5)
    shutil.rmtree(here)
