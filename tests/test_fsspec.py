"""The fsspec filesystem (``fsspec_leasefs``) against a real process cluster.

One ``ProcessCluster`` (2 block servers, replication 2, 256 KiB blocks so small files span
blocks) serves the whole module. Three layers:
- fsspec's own reusable suite (``fsspec.tests.abstract``: copy, get, put, open, pipe),
  wired to leasefs through the fixtures below;
- unit behaviour of the adapter (URLs, listing shapes, streams, rename, delete, errors);
- pandas and pyarrow reading and writing through it.
"""

from __future__ import annotations

import contextlib

import errno
import pickle
import posixpath
import time
import uuid

import fsspec
import pytest
from fsspec.tests.abstract import (AbstractCopyTests, AbstractFixtures, AbstractGetTests,
                                   AbstractOpenTests, AbstractPipeTests, AbstractPutTests)

from fsspec_leasefs import LeaseFSFileSystem
from harness import ProcessCluster

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

BLOCK = 256 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("fsspec-cluster"), n_storage=2,
                        settings={"replication": 2, "block_size": BLOCK}) as c:
        yield c


@pytest.fixture(scope="module")
def lfs(cluster):
    fs_ = fsspec.filesystem("leasefs", host="127.0.0.1",
                            port=int(cluster.meta_address.rsplit(":", 1)[1]))
    yield fs_
    fs_.close()


@pytest.fixture
def base(lfs):
    """A fresh folder per test."""
    path = f"/unit/{uuid.uuid4().hex[:10]}"
    lfs.makedirs(path)
    return path


def url(cluster, path: str) -> str:
    return f"leasefs://{cluster.meta_address}{path}"


# ============================================================================ fsspec's suite


class LeaseFSFixtures(AbstractFixtures):
    """Wires fsspec's abstract tests to the module's cluster. leasefs supports empty
    directories, so the default ``supports_empty_directories`` (True) stands and no test is
    skipped."""

    @pytest.fixture
    def fs(self, lfs):
        return lfs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, lfs):
        path = f"/abstract/{uuid.uuid4().hex[:10]}"
        lfs.makedirs(path)
        yield path
        lfs.rm(path, recursive=True)


class TestLeaseFSCopy(AbstractCopyTests, LeaseFSFixtures):
    pass


class TestLeaseFSGet(AbstractGetTests, LeaseFSFixtures):
    pass


class TestLeaseFSPut(AbstractPutTests, LeaseFSFixtures):
    pass


class TestLeaseFSOpen(AbstractOpenTests, LeaseFSFixtures):
    pass


class TestLeaseFSPipe(AbstractPipeTests, LeaseFSFixtures):
    pass


# ============================================================================ URLs, instances


def test_url_forms_and_instance_cache(cluster, lfs, monkeypatch):
    host, port = cluster.meta_address.rsplit(":", 1)
    assert LeaseFSFileSystem._strip_protocol(f"leasefs://{host}:{port}/a/b/") == "/a/b"
    assert LeaseFSFileSystem._strip_protocol("leasefs:///a//b") == "/a/b"
    assert LeaseFSFileSystem._strip_protocol("leasefs://h:1") == "/"
    assert LeaseFSFileSystem._strip_protocol("rel/x") == "/rel/x"
    assert LeaseFSFileSystem._get_kwargs_from_urls(f"leasefs://{host}:{port}/x") == \
        {"host": host, "port": int(port)}
    assert LeaseFSFileSystem._get_kwargs_from_urls("leasefs:///x") == {}

    fs_, path = fsspec.core.url_to_fs(url(cluster, "/some/file"))
    assert fs_ is lfs                          # cached per address (and thread)
    assert path == "/some/file"
    assert fs_.unstrip_protocol(path) == url(cluster, "/some/file")
    assert fsspec.get_filesystem_class("leasefs") is LeaseFSFileSystem

    lfs.pipe_file("/urls/default", b"via default cluster")
    monkeypatch.setenv("LEASEFS_META", cluster.meta_address)
    default_fs, path = fsspec.core.url_to_fs("leasefs:///urls/default")
    try:
        assert default_fs.meta_address == cluster.meta_address
        assert default_fs.cat_file(path) == b"via default cluster"
        with fsspec.open("leasefs:///urls/default", "rt") as fh:
            assert fh.read() == "via default cluster"
    finally:
        default_fs.close()

    clone = pickle.loads(pickle.dumps(lfs))    # travels to other processes by its arguments
    assert clone.meta_address == lfs.meta_address
    assert clone.cat_file("/urls/default") == b"via default cluster"


# ============================================================================ listing, info


def test_ls_and_info_shapes(lfs, base):
    lfs.pipe_file(f"{base}/f.bin", b"x" * 1000)
    lfs.makedirs(f"{base}/sub")
    for i in range(3):
        lfs.pipe_file(f"{base}/sub/n{i}", b"y")

    entries = lfs.ls(base)
    assert [e["name"] for e in entries] == [f"{base}/f.bin", f"{base}/sub"]
    f_info, d_info = entries
    assert f_info["type"] == "file" and f_info["size"] == 1000
    assert d_info["type"] == "directory" and d_info["size"] == 0
    assert f_info["replication"] == 2 and f_info["block_size"] == BLOCK
    assert f_info["mode"] == 0o644 and d_info["mode"] == 0o755
    assert f_info["owner"] and f_info["group"]
    assert abs(f_info["mtime"] - time.time()) < 60
    assert lfs.ls(base, detail=False) == [f"{base}/f.bin", f"{base}/sub"]
    assert lfs.ls(f"{base}/f.bin", detail=False) == [f"{base}/f.bin"]   # a file lists itself
    assert lfs.info(f"{base}/f.bin") == f_info
    assert lfs.info("/")["type"] == "directory"
    assert lfs.isfile(f"{base}/f.bin") and not lfs.isdir(f"{base}/f.bin")
    assert lfs.isdir(f"{base}/sub") and lfs.exists(f"{base}/sub/n0")
    assert not lfs.exists(f"{base}/missing") and not lfs.exists(f"{base}/f.bin/below")
    assert sorted(lfs.find(base)) == [f"{base}/f.bin"] + [f"{base}/sub/n{i}" for i in range(3)]
    assert lfs.glob(f"{base}/sub/n[01]") == [f"{base}/sub/n0", f"{base}/sub/n1"]
    assert lfs.du(base) == 1003
    assert lfs.du(base, total=False) == {f"{base}/f.bin": 1000,
                                         **{f"{base}/sub/n{i}": 1 for i in range(3)}}


def test_paged_listing(lfs, base):
    """More entries than one ``list_status`` page (1000) come back complete and sorted."""
    names = [f"e{i:04d}" for i in range(1100)]
    for name in names:
        lfs.makedirs(f"{base}/{name}")
    assert lfs.ls(base, detail=False) == [f"{base}/{n}" for n in names]


# ============================================================================ streams


def test_write_then_read_multi_block(lfs, base):
    data = bytes(range(256)) * (3 * BLOCK // 256 + 77)      # 3+ blocks
    path = f"{base}/big"
    with lfs.open(path, "wb", block_size=100_000) as fh:
        for i in range(0, len(data), 70_000):
            fh.write(data[i:i + 70_000])
    assert lfs.size(path) == len(data)
    assert lfs.cat_file(path) == data
    with lfs.open(path, "rb", block_size=50_000) as fh:
        assert fh.size == len(data)
        assert fh.read(10) == data[:10]
        fh.seek(BLOCK - 5)                                   # across a block boundary
        assert fh.read(10) == data[BLOCK - 5:BLOCK + 5]
        fh.seek(-7, 2)
        assert fh.read() == data[-7:]
        fh.seek(3)
        assert fh.read() == data[3:]                         # sequential, streamed
    with lfs.open(path, "rb", cache_type="none") as fh:      # every read a ranged fetch
        fh.seek(2 * BLOCK + 1)
        assert fh.read(BLOCK) == data[2 * BLOCK + 1:3 * BLOCK + 1]
    # text mode and readline go through the same file object
    lfs.pipe_file(f"{base}/t.txt", "α\nβ\n".encode())
    with lfs.open(f"{base}/t.txt", "r", encoding="utf-8") as fh:
        assert fh.readlines() == ["α\n", "β\n"]


def test_write_holds_the_lease_until_close(cluster, lfs, base):
    path = f"{base}/open"
    fh = lfs.open(path, "wb")
    fh.write(b"abc")
    assert lfs.info(path)["under_construction"] is True    # created at open time, leased
    other = LeaseFSFileSystem(cluster.meta_address, skip_instance_cache=True)
    try:
        with pytest.raises(OSError) as err:                  # another lease holder is refused
            other.open(path, "ab")
        assert err.value.errno == errno.EBUSY and path in str(err.value)
    finally:
        other.close()
    fh.close()
    assert lfs.info(path)["under_construction"] is False
    assert lfs.cat_file(path) == b"abc"


def test_append(lfs, base):
    path = f"{base}/log"
    with lfs.open(path, "ab") as fh:                         # creates a missing file
        fh.write(b"one\n")
    with lfs.open(path, "ab") as fh:
        assert fh.tell() == 4
        fh.write(b"two\n" * 100_000)                         # crosses blocks
    with lfs.open(path, "ab") as fh:
        fh.write(b"end")
    assert lfs.cat_file(path) == b"one\n" + b"two\n" * 100_000 + b"end"


def test_ranged_cat_pipe_and_exclusive(lfs, base):
    path = f"{base}/r"
    data = b"0123456789" * 60_000
    lfs.pipe_file(path, data)
    assert lfs.cat_file(path, start=5, end=15) == data[5:15]
    assert lfs.cat_file(path, start=BLOCK - 3, end=BLOCK + 3) == data[BLOCK - 3:BLOCK + 3]
    assert lfs.cat_file(path, start=-4) == data[-4:]
    assert lfs.cat_file(path, start=2, end=-2) == data[2:-2]
    assert lfs.cat_file(path, start=10, end=5) == b""
    assert lfs.cat_file(path, end=10**9) == data
    assert lfs.cat_ranges([path, path], [0, 100], [3, 104]) == [data[:3], data[100:104]]
    assert lfs.head(path, 4) == data[:4] and lfs.tail(path, 4) == data[-4:]
    with pytest.raises(FileExistsError, match="r"):
        lfs.pipe_file(path, b"x", mode="create")
    with pytest.raises(FileExistsError):
        lfs.open(path, "xb")
    assert lfs.cat_file(path) == data
    lfs.pipe({f"{base}/p1": b"a", f"{base}/p2": b"b"})
    assert lfs.cat([f"{base}/p1", f"{base}/p2"]) == {f"{base}/p1": b"a", f"{base}/p2": b"b"}


def test_transaction_commits_or_discards(lfs, base):
    with lfs.transaction:
        with lfs.open(f"{base}/tx", "wb") as fh:
            fh.write(b"committed")
        assert not lfs.exists(f"{base}/tx")                 # invisible until commit
    assert lfs.cat_file(f"{base}/tx") == b"committed"
    with pytest.raises(RuntimeError):
        with lfs.transaction:
            with lfs.open(f"{base}/tx2", "wb") as fh:
                fh.write(b"discarded")
            raise RuntimeError("job failed")
    assert not lfs.exists(f"{base}/tx2")
    assert lfs.ls(base, detail=False) == [f"{base}/tx"]     # no temporary file left over
    fh = lfs.open(f"{base}/gone", "wb")
    fh.write(b"x")
    fh.discard()
    assert not lfs.exists(f"{base}/gone")


def test_every_write_call_in_a_transaction_is_deferred_like_open_wb(lfs, base, tmp_path):
    local = tmp_path / "local.bin"
    local.write_bytes(b"from disk")
    lfs.pipe_file(f"{base}/old", b"old contents")
    lfs.pipe_file(f"{base}/src", b"copy me")
    writes = {  # each call, and what the file holds once committed
        "pipe_file": (lambda: lfs.pipe_file(f"{base}/piped", b"piped"), "piped", b"piped"),
        "pipe": (lambda: lfs.pipe({f"{base}/multi": b"multi"}), "multi", b"multi"),
        "put_file": (lambda: lfs.put_file(str(local), f"{base}/put"), "put", b"from disk"),
        "touch": (lambda: lfs.touch(f"{base}/touched"), "touched", b""),
        "cp_file": (lambda: lfs.cp_file(f"{base}/src", f"{base}/copied"), "copied", b"copy me"),
        "overwrite": (lambda: lfs.pipe_file(f"{base}/old", b"new"), "old", b"new"),
    }
    before = {"old": b"old contents"}
    for commit in (False, True):
        with pytest.raises(RuntimeError) if not commit else contextlib.nullcontext():
            with lfs.transaction:
                for what, (call, name, _) in writes.items():
                    call()
                    # not visible (or not changed) before the commit
                    assert lfs.exists(f"{base}/{name}") == (name in before), what
                    if name in before:
                        assert lfs.cat_file(f"{base}/{name}") == before[name]
                if not commit:
                    raise RuntimeError("roll back")
        names = sorted(lfs.ls(base, detail=False))
        if not commit:  # rolled back: nothing new, nothing changed, no temporary files
            assert names == [f"{base}/old", f"{base}/src"]
            assert lfs.cat_file(f"{base}/old") == b"old contents"
    for _, name, data in writes.values():
        assert lfs.cat_file(f"{base}/{name}") == data, name
    assert len(names) == len(writes) + 1  # + src; no temporary file left over


def test_a_failed_write_in_a_transaction_is_not_committed(lfs, base):
    with lfs.transaction:
        lfs.pipe_file(f"{base}/kept", b"kept")
        with pytest.raises(OSError):  # reading /proc/self/mem at offset 0 fails with EIO
            lfs.put_file("/proc/self/mem", f"{base}/broken")
    assert lfs.ls(base, detail=False) == [f"{base}/kept"]


# ============================================================================ namespace


def test_mv_is_a_rename(lfs, base):
    lfs.pipe_file(f"{base}/a", b"payload")
    ino = lfs.info(f"{base}/a")["ino"]
    lfs.mv(f"{base}/a", f"{base}/b")
    assert lfs.info(f"{base}/b")["ino"] == ino and not lfs.exists(f"{base}/a")
    lfs.makedirs(f"{base}/dir/deep")
    lfs.pipe_file(f"{base}/dir/deep/f", b"z")
    dir_ino = lfs.info(f"{base}/dir")["ino"]
    file_ino = lfs.info(f"{base}/dir/deep/f")["ino"]
    lfs.mv(f"{base}/dir", f"{base}/moved", recursive=True)   # one rename, whole tree
    assert lfs.info(f"{base}/moved")["ino"] == dir_ino
    assert lfs.info(f"{base}/moved/deep/f")["ino"] == file_ino
    lfs.makedirs(f"{base}/into")
    lfs.mv(f"{base}/b", f"{base}/into")                      # into an existing directory
    assert lfs.info(f"{base}/into/b")["ino"] == ino
    lfs.pipe_file(f"{base}/c", b"replacement")
    lfs.rename(f"{base}/c", f"{base}/into/b")                # replaces a file
    assert lfs.cat_file(f"{base}/into/b") == b"replacement"
    lfs.pipe_file(f"{base}/g1", b"1")
    lfs.pipe_file(f"{base}/g2", b"2")
    lfs.mv(f"{base}/g*", f"{base}/globbed")
    assert lfs.ls(f"{base}/globbed", detail=False) == [f"{base}/globbed/g1",
                                                        f"{base}/globbed/g2"]
    with pytest.raises(FileNotFoundError, match="missing"):
        lfs.mv(f"{base}/missing", f"{base}/x")
    with pytest.raises(FileNotFoundError):
        lfs.mv(f"{base}/into/b", f"{base}/no/such/parent")


def test_cp_file_copies_inside_the_cluster(lfs, base):
    data = b"q" * (BLOCK + 123)
    lfs.pipe_file(f"{base}/src", data)
    lfs.cp_file(f"{base}/src", f"{base}/dst")
    assert lfs.cat_file(f"{base}/dst") == data
    assert lfs.info(f"{base}/dst")["ino"] != lfs.info(f"{base}/src")["ino"]
    lfs.copy(f"{base}/src", f"{base}/tree/copy")
    assert lfs.cat_file(f"{base}/tree/copy") == data


def test_rm_and_dirs(lfs, base):
    lfs.makedirs(f"{base}/t/a/b")
    lfs.pipe_file(f"{base}/t/a/b/f", b"1")
    lfs.pipe_file(f"{base}/t/top", b"2")
    with pytest.raises(IsADirectoryError):
        lfs.rm(f"{base}/t")
    with pytest.raises(OSError) as err:
        lfs.rmdir(f"{base}/t")
    assert err.value.errno == errno.ENOTEMPTY
    with pytest.raises(NotADirectoryError):
        lfs.rmdir(f"{base}/t/top")
    lfs.rm(f"{base}/t", recursive=True, maxdepth=1)          # only what lies within depth 1
    assert lfs.find(f"{base}/t", withdirs=True) == [f"{base}/t", f"{base}/t/a", f"{base}/t/a/b",
                                                    f"{base}/t/a/b/f"]
    lfs.rm(f"{base}/t", recursive=True)
    assert not lfs.exists(f"{base}/t")
    lfs.mkdir(f"{base}/e")
    with pytest.raises(FileExistsError):
        lfs.mkdir(f"{base}/e")
    with pytest.raises(FileNotFoundError):
        lfs.mkdir(f"{base}/x/y", create_parents=False)
    with pytest.raises(FileExistsError):
        lfs.makedirs(f"{base}/e")
    lfs.makedirs(f"{base}/e", exist_ok=True)
    lfs.rmdir(f"{base}/e")
    assert not lfs.exists(f"{base}/e")
    lfs.pipe({f"{base}/k1": b"", f"{base}/k2": b"", f"{base}/k3": b""})
    lfs.rm([f"{base}/k1", f"{base}/k2"])
    lfs.rm(f"{base}/k*")
    assert lfs.ls(base) == []
    with pytest.raises(FileNotFoundError):
        lfs.rm(f"{base}/k1")


def test_touch_times_and_checksum(lfs, base):
    path = f"{base}/touched"
    lfs.touch(path)
    assert lfs.cat_file(path) == b""
    lfs.pipe_file(path, b"content")
    before = lfs.modified(path)
    checksum = lfs.checksum(path)
    assert lfs.checksum(path) == checksum                    # stable while unchanged
    time.sleep(0.02)   # fixed-sleep: the wall clock moves on, so the new mtime is later
    lfs.touch(path, truncate=False)                          # keeps content, new mtime
    assert lfs.cat_file(path) == b"content"
    assert lfs.modified(path) > before
    assert lfs.checksum(path) != checksum
    assert lfs.modified(path).tzinfo is not None and lfs.created(path).tzinfo is not None
    lfs.touch(path)                                          # truncate=True recreates
    assert lfs.cat_file(path) == b""
    lfs.touch(f"{base}/new", truncate=False)
    assert lfs.isfile(f"{base}/new")


def test_put_and_get_files(lfs, base, tmp_path):
    local = tmp_path / "in.bin"
    data = bytes(range(256)) * 2000
    local.write_bytes(data)
    lfs.put_file(str(local), f"{base}/up/in.bin")
    assert lfs.cat_file(f"{base}/up/in.bin") == data
    with pytest.raises(FileExistsError):
        lfs.put_file(str(local), f"{base}/up/in.bin", mode="create")
    lfs.get_file(f"{base}/up/in.bin", str(tmp_path / "out.bin"))
    assert (tmp_path / "out.bin").read_bytes() == data
    lfs.get(f"{base}/up", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "in.bin").read_bytes() == data


def test_errors_are_builtin_with_the_path(cluster, lfs, base):
    missing = f"{base}/nothing/here"
    for call in (lambda: lfs.info(missing), lambda: lfs.open(missing),
                 lambda: lfs.cat_file(missing), lambda: lfs.ls(missing),
                 lambda: lfs.rm(missing), lambda: lfs.get_file(missing, "/tmp/x")):
        with pytest.raises(FileNotFoundError) as err:
            call()
        assert missing in str(err.value) and err.value.errno == errno.ENOENT
    lfs.pipe_file(f"{base}/file", b"1")
    lfs.makedirs(f"{base}/dir")
    with pytest.raises(IsADirectoryError, match=f"{base}/dir"):
        lfs.open(f"{base}/dir")
    with pytest.raises(IsADirectoryError):
        lfs.open(f"{base}/dir", "wb")
    with pytest.raises(NotADirectoryError, match=f"{base}/file"):
        lfs.info(f"{base}/file/below")
    with pytest.raises(NotADirectoryError):
        lfs.pipe_file(f"{base}/file/below", b"x")
    with pytest.raises(FileExistsError):
        lfs.makedirs(f"{base}/file", exist_ok=True)           # a file is in the way
    lfs.client.set_permission(base, 0o755)
    eve = LeaseFSFileSystem(cluster.meta_address, user="eve", groups=["eve"])
    try:
        with pytest.raises(PermissionError, match=base):
            eve.pipe_file(f"{base}/by-eve", b"x")
        with pytest.raises(PermissionError):
            eve.rm(f"{base}/file")
        assert eve.cat_file(f"{base}/file") == b"1"           # reading is allowed
    finally:
        eve.close()
    assert not lfs.exists(f"{base}/by-eve") and lfs.exists(f"{base}/file")


# ============================================================================ pandas, pyarrow


def test_pandas_csv_round_trip(cluster, lfs, base):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"id": range(5000), "name": [f"n,\"{i}\"\nx" for i in range(5000)],
                       "value": [i / 7 for i in range(5000)]})
    target = url(cluster, f"{base}/frame.csv")
    df.to_csv(target, index=False)
    assert lfs.size(f"{base}/frame.csv") > 50_000
    back = pd.read_csv(target)
    pd.testing.assert_frame_equal(back, df)


def test_dask_reads_csv_and_writes_parquet(cluster, lfs, base):
    """dask.dataframe on ``leasefs://`` URLs: a glob of CSV files in, partitioned parquet
    out (dask's own writer, through fsspec), read back by dask and by pandas."""
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    import dask
    for i in range(3):
        part = pd.DataFrame({"id": range(i * 1000, (i + 1) * 1000),
                             "group": [f"g{j % 4}" for j in range(1000)],
                             "value": [j / 3 for j in range(1000)]})
        part.to_csv(url(cluster, f"{base}/in/part-{i}.csv"), index=False)
    with dask.config.set(scheduler="threads"):
        frame = dd.read_csv(url(cluster, f"{base}/in/*.csv"))
        assert frame.npartitions >= 3
        totals = frame.groupby("group")["value"].sum().compute().sort_index()
        frame.to_parquet(url(cluster, f"{base}/out"), write_index=False)
        back = dd.read_parquet(url(cluster, f"{base}/out")).compute()
    expected = pd.concat(pd.read_csv(url(cluster, f"{base}/in/part-{i}.csv")) for i in range(3))
    assert sorted(back["id"]) == list(range(3000))
    want = expected.groupby("group")["value"].sum().sort_index()
    assert list(totals.index.astype(str)) == list(want.index)
    assert totals.to_numpy() == pytest.approx(want.to_numpy())
    assert len(lfs.glob(f"{base}/out/*.parquet")) >= 3
    with_pandas = pd.read_parquet(url(cluster, f"{base}/out"))
    assert len(with_pandas) == 3000


def test_pyarrow_parquet_and_dataset(lfs, base):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    pfs = pafs.PyFileSystem(pafs.FSSpecHandler(lfs))
    table = pa.table({"k": [i % 3 for i in range(30_000)], "v": list(range(30_000)),
                      "s": [f"row {i}" for i in range(30_000)]})
    pq.write_table(table, f"{base}/one.parquet", filesystem=pfs, row_group_size=10_000)
    assert pq.read_table(f"{base}/one.parquet", filesystem=pfs).equals(table)
    pq.write_table(table.slice(0, 100), f"{base}/pq/part-0.parquet", filesystem=pfs)
    pq.write_table(table.slice(100, 200), f"{base}/pq/part-1.parquet", filesystem=pfs)
    lfs.pipe_file(f"{base}/pq/_SUCCESS", b"")
    dataset = ds.dataset(f"{base}/pq", format="parquet", filesystem=pfs)
    got = dataset.to_table().sort_by("v")
    assert got.equals(table.slice(0, 300))
    assert dataset.to_table(filter=ds.field("k") == 1).num_rows == 100
    ds.write_dataset(table, f"{base}/parted", format="parquet", filesystem=pfs,
                     partitioning=["k"], partitioning_flavor="hive")
    assert sorted(lfs.ls(f"{base}/parted", detail=False)) == [
        f"{base}/parted/k={i}" for i in range(3)]
    back = ds.dataset(f"{base}/parted", format="parquet", filesystem=pfs,
                      partitioning="hive").to_table()
    assert back.num_rows == 30_000 and sorted(back.column("v").to_pylist()) == list(range(30_000))


def test_a_file_collected_inside_a_trio_run_closes_without_error(lfs):
    """fsspec files close in ``__del__``; when the garbage collector runs that inside a trio
    run (any program using trio), the close must not try to block on the client's thread."""
    import gc
    import sys

    import trio

    lfs.pipe_file("/gc-close/x", b"hello" * 1000)
    holder = [lfs.open("/gc-close/x", "rb")]
    assert holder[0].read(10) == b"hellohello"
    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: seen.append(unraisable.exc_value)
    try:
        async def main():
            holder.clear()
            gc.collect()
            # fixed-sleep: room for a close the collection might have scheduled; that it
            # raises nothing is a non-event
            await trio.sleep(0.2)

        trio.run(main)
    finally:
        sys.unraisablehook = previous
    assert seen == []
    assert lfs.cat_file("/gc-close/x") == b"hello" * 1000
