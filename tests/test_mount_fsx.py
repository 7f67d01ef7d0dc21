"""fsx on a real mount (``fsxkit``): random reads, writes, memory-mapped reads and writes,
truncates, fsyncs and reopens of one file, each read checked against the model, the
writes inside the file going to the block servers as patches. With two mounts, the second
(another client) reads the whole file after every fsync. The same operations on a file of
the local disk end byte-identical to the mount's file.

The number of operations per run is ``LEASEFS_FSX_OPS`` (default 1500: the suite's size;
the soak of docs/TESTING.md runs 100 000)."""

from __future__ import annotations

import os
import shutil

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from fsxkit import Fsx  # noqa: E402
from harness import ProcessCluster, mounted  # noqa: E402

OPS = int(os.environ.get("LEASEFS_FSX_OPS", "1500"))
KiB = 1 << 10
BLOCK = 256 * KiB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(600, OPS // 20))]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("fsx")
    with ProcessCluster(base, n_storage=3, settings={"block_size": BLOCK}) as c:
        yield c


@pytest.fixture(scope="module")
def one(cluster):
    yield from mounted(cluster, "one")


@pytest.fixture(scope="module")
def two(cluster):
    yield from mounted(cluster, "two")


def run_fsx(path, reader, seed: int, **how) -> tuple[bytes, dict]:
    fsx = Fsx(path, reader=reader, seed=seed, max_len=4 * BLOCK + 3 * KiB, **how)
    try:
        counts = fsx.run(OPS, progress_every=30.0)
    finally:
        fsx.close()
    return bytes(fsx.model), counts


def test_fsx_with_mmap_through_two_mounts(one, two, tmp_path):
    model, counts = run_fsx(one.mp / "fsx-two", two.mp / "fsx-two", 11)
    assert all(counts[name] > 0 for name in ("mapwrite", "mapread", "truncate", "fsync"))
    local, _ = run_fsx(tmp_path / "local", None, 11)
    assert local == model
    assert (tmp_path / "local").read_bytes() == model
    assert (two.mp / "fsx-two").read_bytes() == model


def test_fsx_with_mmap_on_one_mount(one, tmp_path):
    model, _ = run_fsx(one.mp / "fsx-one", None, 12)
    local, _ = run_fsx(tmp_path / "local", None, 12)
    assert local == model
    assert (one.mp / "fsx-one").read_bytes() == model
