"""The trash (HDFS fs.trash.interval): ``leasefs rm`` moves into /user/NAME/.Trash/Current,
``-skipTrash`` and paths already in a trash delete at once, ``expunge`` checkpoints and
deletes expired checkpoints, the metadata server's emptier does the same by itself, and the
client API keeps deleting. Real servers on loopback, the real command line."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import trio

from fs import trash
from fs.rpc import current_user
from harness import inprocess_cluster


def _cli(env, *args):
    return subprocess.run([sys.executable, "-m", "tools", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_checkpoint_names_and_expiry():
    now = 1_790_000_000.0
    name = trash.checkpoint_name(now)
    assert len(name) == 12 and trash.checkpoint_time(name) == now
    assert trash.checkpoint_time("Current") is None
    assert trash.checkpoint_time("991399999999") is None
    old, new = trash.checkpoint_name(now - 7200), trash.checkpoint_name(now - 60)
    assert trash.expired([old, new, "Current", "x"], now, 3600) == [old]
    assert trash.in_trash("/user/a/.Trash/Current/x") and not trash.in_trash("/user/a/x")
    assert trash.contains_trash("/user", "a") and trash.contains_trash("/user/a", "a")
    assert not trash.contains_trash("/user/b", "a")


async def test_rm_moves_into_the_trash_and_expunge_and_skip_trash_delete(tmp_path):
    me = current_user()

    async with inprocess_cluster(tmp_path, n_storage=1, replication=1) as cluster:
        env = {**os.environ, "LEASEFS_META": cluster.meta_address}

        async def cli(*args):
            return await trio.to_thread.run_sync(functools.partial(_cli, env, *args))

        async with cluster.client() as c:
            await c.write_file("/data/a.txt", b"first")
            await c.mkdirs("/data/dir/sub")
            await c.write_file("/data/dir/sub/b.txt", b"b")
            current = f"/user/{me}/.Trash/Current"
            r = await cli("rm", "/data/a.txt")
            assert r.returncode == 0, r.stderr
            assert r.stdout == f"Moved: '/data/a.txt' to trash at: {current}/data/a.txt\n"
            assert not await c.exists("/data/a.txt")
            assert await c.read_file(f"{current}/data/a.txt") == b"first"
            assert (await c.get_file_status(f"/user/{me}/.Trash")).mode == 0o700
            # the same name again: the second gets the time appended
            await c.write_file("/data/a.txt", b"second")
            r = await cli("rm", "/data/a.txt")
            assert r.returncode == 0, r.stderr
            moved = r.stdout.strip().rsplit(" ", 1)[1]
            assert moved.startswith(f"{current}/data/a.txt") and moved != \
                f"{current}/data/a.txt"
            assert await c.read_file(moved) == b"second"
            # a folder needs -r, as a delete does
            r = await cli("rm", "/data/dir")
            assert r.returncode == 1 and "use -r" in r.stderr
            r = await cli("rm", "-r", "/data/dir")
            assert r.returncode == 0 and await c.exists(f"{current}/data/dir/sub/b.txt")
            # removing the trash itself, or a folder holding it: refused, nothing moved
            r = await cli("rm", "-r", f"/user/{me}")
            assert r.returncode == 1 and "contains the trash" in r.stderr \
                and "-skipTrash" in r.stderr and "Traceback" not in r.stderr
            # a path in the trash is deleted at once
            r = await cli("rm", moved)
            assert r.returncode == 0 and r.stdout == "" and not await c.exists(moved)
            # -skipTrash deletes
            await c.write_file("/data/c.txt", b"c")
            r = await cli("rm", "-skipTrash", "/data/c.txt")
            assert r.returncode == 0 and r.stdout == ""
            assert not await c.exists("/data/c.txt")
            assert not await c.exists(f"{current}/data/c.txt")
            # the client API deletes (as HDFS's FileSystem.delete)
            await c.write_file("/data/d.txt", b"d")
            await c.delete("/data/d.txt")
            assert not await c.exists(f"{current}/data/d.txt")
            # expunge: a checkpoint now, nothing old enough to delete yet
            r = await cli("expunge")
            assert r.returncode == 0 and r.stdout.startswith("Created trash checkpoint: ")
            name = r.stdout.split(": ", 1)[1].split()[0]
            assert [s.name for s in await c.list_status(f"/user/{me}/.Trash")] == [name]
            assert await c.read_file(f"/user/{me}/.Trash/{name}/data/a.txt") == b"first"
            r = await cli("expunge", "-immediate")
            assert r.returncode == 0 and f"Deleted trash checkpoint: {name}" in r.stdout
            assert await c.list_status(f"/user/{me}/.Trash") == []


async def test_trash_off_deletes_and_the_emptier_removes_expired_checkpoints(tmp_path):
    """``trash_interval = 0``: rm deletes. A short interval: the metadata server turns
    Current into a checkpoint and deletes it once it is older than the interval."""
    me = current_user()

    async with inprocess_cluster(tmp_path / "off", n_storage=0, trash_interval=0) as cluster:
        env = {**os.environ, "LEASEFS_META": cluster.meta_address}
        async with cluster.client() as c:
            await c.mkdirs("/x")
            r = await trio.to_thread.run_sync(functools.partial(_cli, env, "rm", "-r", "/x"))
            assert r.returncode == 0 and r.stdout == "" and not await c.exists("/x")
            assert not await c.exists("/user")
    # 3 s of trash, a checkpoint every 1.2 s (the emptier runs at most once a second)
    async with inprocess_cluster(tmp_path / "short", n_storage=0, trash_interval=0.05,
                                 trash_checkpoint_interval=0.02) as cluster:
        async with cluster.client() as c:
            await c.mkdirs("/y/z")
            moved = await c.move_to_trash("/y")
            assert moved == f"/user/{me}/.Trash/Current/y"
            seen_checkpoint = False
            with trio.fail_after(30):
                while True:
                    names = [s.name for s in await c.list_status(f"/user/{me}/.Trash")]
                    if any(trash.checkpoint_time(n) for n in names):
                        seen_checkpoint = True
                    if seen_checkpoint and not names:
                        break
                    await trio.sleep(0.2)
            assert not await c.exists("/y")


@pytest.mark.parametrize("path", ["/", "/user"])
@pytest.mark.cluster(n_storage=0)
async def test_the_root_and_folders_holding_a_trash_are_refused(cluster, path):
    async with cluster.client() as c:
        await c.mkdirs("/user")
        from fs.errors import InvalidArgument
        with pytest.raises(InvalidArgument):
            await c.move_to_trash(path)
        assert await c.exists("/user")


@pytest.mark.slow
def test_deletes_through_the_mount_stay_deletes(tmp_path):
    """As fuse-dfs: rm through the mount deletes (a program unlinking a temporary file must
    not fill its owner's trash), with the trash on."""
    pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
    from harness import Mount, ProcessCluster

    with ProcessCluster(tmp_path, n_storage=1, settings={"replication": 1}) as cluster:
        mount = Mount(cluster, "trash")
        try:
            mp = mount.start().mp
            (mp / "d").mkdir()
            (mp / "d" / "f.txt").write_text("x")
            (mp / "d" / "f.txt").unlink()
            (mp / "d").rmdir()
            with cluster.client() as c:
                assert c.trash_interval > 0
                assert not c.exists("/d")
                assert not c.exists("/user")
        finally:
            mount.cleanup()
