"""Writes inside a file's content through a real mount go to the block servers as patches
(PROTOCOL.md "Patches"): random writes, holes, growing and shrinking truncates and fsyncs
on one mount, with a second mount (another client) reading the whole file after each
fsync, always equal to a local model; the fsyncs that only changed bytes inside the file
were patches (counted on the metadata server), a shrink sent the file whole."""

from __future__ import annotations

import os
import random
import re
import shutil
import urllib.request

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import ProcessCluster, mounted  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
KiB = 1 << 10
BLOCK = 256 * KiB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("mountpatches")
    with ProcessCluster(base, n_storage=3, settings={"block_size": BLOCK},
                        meta_http=True) as c:
        yield c


@pytest.fixture(scope="module")
def one(cluster):
    yield from mounted(cluster, "one")


@pytest.fixture(scope="module")
def two(cluster):
    yield from mounted(cluster, "two")


def meta_calls(cluster: ProcessCluster, method: str) -> float:
    """Calls of ``method`` the metadata server answered (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.meta_http_port}/metrics",
                                timeout=30) as page:
        text = page.read().decode()
    found = re.search(rf'^leasefs_meta_rpc_calls_total\{{method="{method}",outcome="ok"\}} '
                      rf'(\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def read_from(mount, name: str) -> bytes:
    with open(mount.mp / name, "rb") as f:
        return f.read()


@pytest.mark.parametrize("seed", [1, 2])
def test_random_writes_and_truncates_read_back_on_another_mount(cluster, one, two, seed):
    rng = random.Random(seed)
    name = f"fsx-{seed}"
    model = bytearray(rng.randbytes(600 * KiB))   # three blocks, the last one partial
    with open(one.mp / name, "wb") as f:
        f.write(model)
    patches_before = meta_calls(cluster, "patch_done")
    log: list[str] = []
    fd = os.open(one.mp / name, os.O_RDWR)
    try:
        for step in range(240):
            roll = rng.random()
            if roll < 0.7:
                offset = rng.randrange(0, len(model) + 8 * KiB)
                data = rng.randbytes(rng.randrange(1, 24 * KiB))
                os.pwrite(fd, data, offset)
                if offset > len(model):   # a hole reads as zeros
                    model.extend(bytes(offset - len(model)))
                model[offset:offset + len(data)] = data
                log.append(f"pwrite {offset} {len(data)}")
            elif roll < 0.78:
                size = rng.randrange(len(model) // 2, len(model) + 40 * KiB)
                os.ftruncate(fd, size)
                model = model[:size] + bytearray(max(0, size - len(model)))
                log.append(f"truncate {size}")
            else:
                os.fsync(fd)
                log.append("fsync")
                got = read_from(two, name)
                assert got == bytes(model), (f"after {log[-12:]}: the other mount reads "
                                             f"{len(got)} bytes, the model has {len(model)}")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert read_from(two, name) == bytes(model), log[-12:]
    assert read_from(one, name) == bytes(model), log[-12:]
    assert os.stat(two.mp / name).st_size == len(model)
    # most fsyncs changed bytes inside the file only: they went as patches
    assert meta_calls(cluster, "patch_done") - patches_before >= 10


def test_a_database_on_the_mount_is_patched_not_sent_whole(cluster, one, two):
    """sqlite3's transactions on one mount, on a database past the size kept inline on
    the metadata server: each commit's fsync of the database is a patch; the other mount
    reads a database whose integrity_check is ok with every row."""
    import sqlite3
    db = sqlite3.connect(one.mp / "db.sqlite", isolation_level=None)
    try:
        db.execute("CREATE TABLE blob (b BLOB)")
        db.execute("INSERT INTO blob VALUES (?)", (random.Random(3).randbytes(300 * KiB),))
        patches_before = meta_calls(cluster, "patch_done")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
        for tx in range(30):
            db.execute("BEGIN")
            db.executemany("INSERT INTO t VALUES (?, ?)",
                           [(tx * 100 + i, f"row {tx}-{i} " * 8) for i in range(100)])
            db.execute("COMMIT")
    finally:
        db.close()
    other = sqlite3.connect(f"file:{two.mp / 'db.sqlite'}?mode=ro", uri=True)
    try:
        assert other.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert other.execute("SELECT count(*) FROM t").fetchone()[0] == 3000
    finally:
        other.close()
    # every commit: a patch of the database (its small journals are kept inline, whole)
    assert meta_calls(cluster, "patch_done") - patches_before >= 30


def test_growth_past_the_last_block_adds_blocks_after_the_patches(cluster, one, two):
    """A file of one partial block written inside (a patch) and far past its end: the
    last block is patched up to the block size, the rest goes on as new blocks, and the
    file is held for patches again (a later write inside is a patch too)."""
    model = bytearray(random.Random(4).randbytes(200 * KiB))
    with open(one.mp / "grow", "wb") as f:
        f.write(model)
    patches, blocks = meta_calls(cluster, "patch_done"), meta_calls(cluster, "add_block")
    fd = os.open(one.mp / "grow", os.O_RDWR)
    try:
        os.pwrite(fd, b"inside", 100)
        tail = random.Random(5).randbytes(50 * KiB)
        os.pwrite(fd, tail, 700 * KiB)        # a hole from 200 KiB, then 50 KiB
        os.fsync(fd)
        model[100:106] = b"inside"
        model.extend(bytes(700 * KiB - len(model)))
        model.extend(tail)
        assert read_from(two, "grow") == bytes(model)
        assert meta_calls(cluster, "patch_done") - patches >= 1
        assert meta_calls(cluster, "add_block") - blocks == 2   # blocks 2 and 3 of 256 KiB
        os.pwrite(fd, b"again", 300 * KiB)
        os.fsync(fd)
        model[300 * KiB:300 * KiB + 5] = b"again"
        assert read_from(two, "grow") == bytes(model)
        assert meta_calls(cluster, "add_block") - blocks == 2   # a patch, no new block
    finally:
        os.close(fd)
    assert read_from(two, "grow") == bytes(model)


def test_a_kept_copy_is_not_read_after_another_mount_changed_the_file(cluster, one, two):
    """The staging copy a patched file keeps after its writer's close serves reads on this
    mount; an open after another mount changed the file reads the new content
    (close-to-open), not the kept copy."""
    name = "kept"
    first = random.Random(6).randbytes(300 * KiB)
    (one.mp / name).write_bytes(first)
    reader = os.open(one.mp / name, os.O_RDONLY)     # keeps the open file alive here
    try:
        fd = os.open(one.mp / name, os.O_RDWR)
        os.pwrite(fd, b"one", 1000)                  # a patch: staged, then kept
        os.close(fd)                                  # the last writer: completed
        mine = bytearray(first)
        mine[1000:1003] = b"one"
        assert read_from(one, name) == bytes(mine)
        assert read_from(two, name) == bytes(mine)
        fd = os.open(two.mp / name, os.O_RDWR)       # the other mount patches it
        os.pwrite(fd, b"two", 2000)
        os.close(fd)
        mine[2000:2003] = b"two"
        assert read_from(one, name) == bytes(mine)   # a new open here: the new content
    finally:
        os.close(reader)
