"""Namespace changes answered before their fsync (``sync_metadata`` off, the mount's default):
a kill -9 of the metadata server loses none of them, fsync(2) of a folder or a file through
the mount and ``sync_metadata()`` make them durable, and a block deletion they cause reaches
the block servers only once they are durable.

The server runs with ``journal_sync_delay`` of a minute, so nothing the background fsync
would do happens during a test: what is durable is exactly what the calls under test made
durable. Real metadata server and block server processes, real LevelDB, real FUSE mounts.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

import pytest
import trio

from fs.client import AsyncClient
from harness import Mount, ProcessCluster, make_test_config, poll_until, store_problems
from meta.journal.journal import Journal
from test_ha import node_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LATE = {"journal_sync_delay": 60.0}
KiB = 1 << 10


needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="/dev/fuse or fusermount3 is not available")


@contextmanager
def late_cluster_and_mount(tmp_path, name: str):
    """A one-block-server cluster whose background fsync never comes (``LATE``) and one
    mount of it; both stopped afterwards whatever happened."""
    pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
    cluster = ProcessCluster(tmp_path, n_storage=1, settings=LATE)
    cluster.start()
    mount = Mount(cluster, name)
    try:
        yield cluster, mount.start()
    finally:
        mount.cleanup()
        cluster.stop()


def fsync_path(path, flags: int = 0) -> None:
    """fsync(2) of ``path`` opened read-only (``flags`` added)."""
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def journal_state(cluster: ProcessCluster) -> dict:
    with cluster.client() as client:
        return client.report()["journal"]


def lazy_config(**extra):
    return make_test_config(sync_metadata=False, **extra)


@pytest.mark.cluster(n_storage=1, settings=LATE)
def test_changes_answered_before_their_fsync_survive_a_kill9(tmp_path, process_cluster):
    """Clients without sync_metadata make folders, small files (kept inline), renames and
    deletes; the server is killed (-9) right after the last answer, with none of it fsynced:
    after the restart every answered change is there (the journal was written before the
    answer), and the store is consistent."""
    before = journal_state(process_cluster)
    expected_files: dict[str, bytes] = {}
    expected_gone: list[str] = []

    async def load():
        async with trio.open_nursery() as nursery:
            for k in range(3):
                nursery.start_soon(worker, k)

    async def worker(k: int):
        async with AsyncClient(process_cluster.meta_address, config=lazy_config()) as client:
            for i in range(60):
                base = f"/w{k}/d{i}"
                await client.mkdirs(base)
                data = os.urandom(100 + i)
                await client.write_file(f"{base}/f", data)
                await client.rename(f"{base}/f", f"{base}/g")
                expected_files[f"{base}/g"] = data
                if i % 3 == 0:
                    await client.mkdirs(f"{base}/gone")
                    await client.delete(f"{base}/gone")
                    expected_gone.append(f"{base}/gone")

    trio.run(load)
    state = journal_state(process_cluster)
    # the calls were answered before any fsync of theirs (the report itself is a read)
    assert state["durable_txid"] == before["durable_txid"] < state["last_txid"], state
    process_cluster.kill_meta()
    # in the journal itself, not only in LevelDB (whose unsynced log survives a process
    # kill as well, but not a machine crash, and is not what a restart replays)
    copy = tmp_path / "journal-copy"
    shutil.copytree(process_cluster.meta_dir() / "journal", copy)
    journal = Journal(str(copy), lambda records: None)
    journal.open()
    assert journal.last_txid == state["last_txid"]
    assert store_problems(process_cluster) == []
    process_cluster.start_meta()
    process_cluster.wait_ready(1)

    async def check():
        async with AsyncClient(process_cluster.meta_address, config=make_test_config()) as client:
            wrong = [p for p, data in expected_files.items()
                     if await client.read_file(p) != data]
            back = [p for p in expected_gone if await client.exists(p)]
        return wrong, back

    wrong, back = trio.run(check)
    assert wrong == [] and back == []
    assert len(expected_files) == 180


@pytest.mark.cluster(n_storage=1, settings={**LATE, "replication": 1, "inline_max": 0})
def test_a_deletion_reaches_block_servers_only_once_it_is_durable(process_cluster):
    """A file with blocks deleted by a client without sync_metadata: its replicas stay on
    the block server (many heartbeats) until the delete is durable, then go."""
    def replica_files():
        return [p for p in process_cluster.storage_dir(0).rglob("blk_*") if p.is_file()]

    async def write_and_delete():
        async with AsyncClient(process_cluster.meta_address, config=lazy_config()) as client:
            await client.write_file("/big", os.urandom(300 * KiB))
            assert replica_files()
            await client.delete("/big")
            assert not await client.exists("/big")

    port = process_cluster.storage_http_port(0)

    def heartbeats() -> int:
        return node_status(port)["meta_servers"][0]["heartbeats_sent"]

    trio.run(write_and_delete)
    beats = heartbeats()   # twenty heartbeats, each of which could have carried the deletion
    assert poll_until(lambda: heartbeats() >= beats + 20, 30)
    assert replica_files(), "a replica was deleted before the delete was durable"
    with process_cluster.client() as client:
        assert client.report()["pending_deletion"] >= 1
        client.sync_metadata()
    assert poll_until(lambda: not replica_files(), timeout=20), \
        "the replicas were not deleted once the delete was durable"


@needs_fuse
def test_fsync_through_the_mount_makes_the_namespace_durable(tmp_path):
    """The mount answers mkdir, create, close (inline), rename before the metadata server's
    fsync; fsync(2) of the folder, or of a file opened for reading after its close, waits
    for it, as on a local filesystem."""
    with late_cluster_and_mount(tmp_path, "sync") as (cluster, mount):
        before = journal_state(cluster)["durable_txid"]
        folder = mount.mp / "d"
        folder.mkdir()
        (folder / "a").write_bytes(b"hello")
        os.rename(folder / "a", folder / "b")
        state = journal_state(cluster)
        assert state["durable_txid"] == before < state["last_txid"], state
        fsync_path(folder, os.O_DIRECTORY)
        state = journal_state(cluster)
        assert state["durable_txid"] == state["last_txid"], state

        # answered before anything was durable (under the folder's lease the create and
        # its content may still be queued in the mount, not even journaled yet)
        durable = state["durable_txid"]
        (folder / "c").write_bytes(b"world")
        state = journal_state(cluster)
        assert state["durable_txid"] == durable, state
        fsync_path(folder / "c")
        state = journal_state(cluster)
        assert state["durable_txid"] == state["last_txid"] > durable, state

        # and what was made durable is what a restart after kill -9 shows
        (folder / "lazy").mkdir()
        mount.stop()
        cluster.kill_meta()
        cluster.start_meta()
        cluster.wait_ready(1)
        with cluster.client() as client:
            assert client.read_file("/d/b") == b"hello"
            assert client.read_file("/d/c") == b"world"
            assert client.exists("/d/lazy")   # written before the kill: kept too


@needs_fuse
def test_what_the_mount_answered_survives_a_kill9_of_the_metadata_server(tmp_path):
    """Small files, folders, renames and deletes through a mount (each answered before its
    fsync), then kill -9 of the metadata server with nothing fsynced: after its restart
    the same mount (it reconnects) and another client see exactly what was answered."""
    with late_cluster_and_mount(tmp_path, "kill9") as (cluster, mount):
        before = journal_state(cluster)["durable_txid"]
        expected: dict[str, bytes] = {}
        for d in range(5):
            folder = mount.mp / f"d{d}"
            folder.mkdir()
            for i in range(20):
                data = os.urandom(50 + 97 * i)
                (folder / f"tmp{i}").write_bytes(data)
                os.rename(folder / f"tmp{i}", folder / f"f{i}")
                expected[f"d{d}/f{i}"] = data
            os.unlink(folder / "f0")
            del expected[f"d{d}/f0"]
        os.rename(mount.mp / "d4", mount.mp / "moved")
        expected = {k.replace("d4/", "moved/"): v for k, v in expected.items()}
        state = journal_state(cluster)
        assert state["durable_txid"] == before < state["last_txid"], state
        cluster.kill_meta()
        cluster.start_meta()
        cluster.wait_ready(1)

        def tree(root):
            return {str(p.relative_to(root)): p.read_bytes()
                    for p in sorted(root.rglob("*")) if p.is_file()}

        assert poll_until(lambda: tree(mount.mp) == expected, timeout=30), \
            sorted(set(tree(mount.mp)) ^ set(expected))[:5]
        with cluster.client() as client:
            for rel, data in expected.items():
                assert client.read_file("/" + rel) == data
            assert not client.exists("/d4")
        mount.stop()
