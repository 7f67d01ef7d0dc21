"""The one-call namespace changes a mount makes (``mkdir``, ``symlink``, ``unlink``,
``rmdir``, ``move``, the ``want_status`` answers of the set_* calls, and the block
locations handed out with a file's status), against a real in-process cluster, plus the
HDFS calls they extend, which must answer as before (``true``) for other callers.
"""

from __future__ import annotations

import errno

import pytest

from fs import errors
from harness import inprocess_cluster

pytestmark = pytest.mark.timeout(120)

SMALL = dict(block_size=64 << 10, bytes_per_checksum=512, packet_size=4096)


def _errno(exc_info) -> int:
    return exc_info.value.errno


@pytest.mark.cluster(n_storage=1, replication=1, **SMALL)
async def test_posix_changes_refuse_server_side_and_answer_statuses(cluster):
    async with cluster.client() as c:
        made = await c.mkdir("/d", 0o750)
        assert made.status.is_dir and made.status.mode == 0o750
        assert made.status.path == "/d"
        assert made.parent.path == "/" and made.parent.subdirs == 1
        with pytest.raises(errors.FileExists) as info:
            await c.mkdir("/d")                       # mkdirs would say true
        assert _errno(info) == errno.EEXIST
        with pytest.raises(errors.FileNotFound):
            await c.mkdir("/no/such")                 # mkdirs would create /no
        assert not await c.exists("/no")
        await c.write_file("/d/f", b"data")
        with pytest.raises(errors.NotDirectory) as info:
            await c.mkdir("/d/f/x")
        assert _errno(info) == errno.ENOTDIR

        with pytest.raises(errors.DirectoryNotEmpty) as info:
            await c.rmdir("/d")
        assert _errno(info) == errno.ENOTEMPTY
        with pytest.raises(errors.NotDirectory):
            await c.rmdir("/d/f")
        with pytest.raises(errors.IsDirectory) as info:
            await c.unlink("/d")
        assert _errno(info) == errno.EISDIR
        # as a lease holder's batched unlink and rmdir ask (no status): the same refusals
        with pytest.raises(errors.IsDirectory):
            await c.rpc.call("delete", {"path": "/d", "expect": "nondir"})
        with pytest.raises(errors.NotDirectory):
            await c.rpc.call("delete", {"path": "/d/f", "expect": "dir"})
        with pytest.raises(errors.FileNotFound):
            await c.rpc.call("delete", {"path": "/d/none", "expect": "nondir"})
        assert await c.exists("/d/f")                 # refusals changed nothing

        link = await c.symlink("f", "/d/l")
        assert link.status.is_symlink and link.status.symlink == "f"
        assert link.parent.path == "/d" and link.parent.children == 2

        await c.write_file("/d/g", b"other")
        g = await c.get_file_status("/d/g")
        moved = await c.move("/d/f", "/d/g", overwrite=True)
        assert moved.status.path == "/d/g" and moved.status.length == 4
        assert moved.replaced.ino == g.ino and moved.replaced.length == 5
        assert moved.parent.path == "/d" and moved.src_parent.path == "/d"
        moved = await c.move("/d/g", "/h")
        assert moved.replaced is None and moved.parent.path == "/"
        assert moved.src_parent.path == "/d"

        gone = await c.unlink("/h")
        assert gone.status.ino == moved.status.ino and gone.status.is_file
        assert not await c.exists("/h")
        await c.unlink("/d/l")
        gone = await c.rmdir("/d")
        assert gone.status.ino == made.status.ino
        assert gone.parent.path == "/" and gone.parent.subdirs == 0

        # the HDFS calls answer as they always did
        assert await c.mkdirs("/a/b/c") is True
        assert await c.mkdirs("/a/b/c") is True
        assert await c.rename("/a/b/c", "/a/c") is True
        assert await c.delete("/a", recursive=True) is True


@pytest.mark.cluster(n_storage=1, replication=1, **SMALL)
async def test_set_calls_answer_the_new_status_when_asked(cluster):
    async with cluster.client() as c:
        await c.write_file("/f", b"x")
        assert await c.set_permission("/f", 0o600) is None
        status = await c.set_permission("/f", 0o640, want_status=True)
        assert status.mode == 0o640 and status.path == "/f"
        status = await c.set_times("/f", mtime_ns=10**18, want_status=True)
        assert status.mtime_ns == 10**18
        status = await c.set_times("/f", atime_ns=5, ino=status.ino, want_status=True)
        assert status.atime_ns == 5 and status.mtime_ns == 10**18
        status = await c.set_owner("/f", group="staff", want_status=True)
        assert status.group == "staff"
        # create answers its parent's status after the create when asked
        await c.mkdirs("/d")
        before = await c.get_file_status("/d")
        out = await c.create("/d/new", want_parent=True)
        parent = out.created_parent
        assert parent.path == "/d" and parent.is_dir
        assert parent.mtime_ns >= before.mtime_ns
        assert parent == await c.get_file_status("/d")
        await out.close()
        plain = await c.create("/d/plain")
        assert plain.created_parent is None and plain.created_status["ino"]
        await plain.close()


@pytest.mark.cluster(n_storage=1, replication=1, **SMALL)
async def test_a_setgid_folder_gives_new_entries_its_group_and_new_folders_the_bit(cluster):
    """POSIX/BSD: in a setgid folder the group a creator asks for (a mount asks for the
    caller's) gives way to the folder's, and new folders keep the bit, parents made on the
    way included; elsewhere the group asked for stays, and none asked is the parent's."""
    async with cluster.client() as c:
        await c.mkdirs("/sg", 0o2775, group="staff")
        await c.mkdirs("/plain", 0o775, group="staff")
        await c.write_file("/sg/f", b"x", group="eve")
        await c.mkdir("/sg/sub", 0o755, group="eve")
        await c.mkdirs("/sg/a/b", 0o700, group="eve")
        await c.write_file("/sg/m/n/f", b"x", group="eve")    # parents made
        await c.symlink("f", "/sg/l", group="eve")
        for path, mode in (("/sg/f", 0o644), ("/sg/sub", 0o2755), ("/sg/a", 0o2700),
                           ("/sg/a/b", 0o2700), ("/sg/m", 0o2755), ("/sg/m/n", 0o2755),
                           ("/sg/m/n/f", 0o644)):
            status = await c.get_file_status(path)
            assert (status.group, status.mode) == ("staff", mode), (path, status)
        assert (await c.get_file_status("/sg/l")).group == "staff"
        await c.write_file("/plain/f", b"x", group="eve")
        await c.mkdir("/plain/sub", 0o755, group="eve")
        await c.mkdir("/plain/inherit", 0o755)
        for path, group, mode in (("/plain/f", "eve", 0o644),
                                  ("/plain/sub", "eve", 0o755),
                                  ("/plain/inherit", "staff", 0o755)):
            status = await c.get_file_status(path)
            assert (status.group, status.mode) == (group, mode), (path, status)


async def test_status_carries_block_locations_an_open_uses(tmp_path):
    data = bytes(range(256)) * 700   # 175 KiB: three blocks of 64 KiB

    async with inprocess_cluster(tmp_path, n_storage=2, replication=2, **SMALL) as cluster:
        async with cluster.client() as c:
            await c.write_file("/f", data)
            await c.mkdirs("/d")
            plain = await c.get_file_status("/f")
            assert plain.locations is None
            status = await c.get_file_status("/f", locations=True)
            assert status.locations["length"] == len(data)
            assert len(status.locations["blocks"]) == 3
            # the same answer as get_block_locations, but for the tokens' issue times
            # (each call makes its own, expiring a lifetime after it) and the order of
            # the replicas (a new one at each call, so that reads spread)
            def untokened(located):
                return {**located, "blocks": [
                    {**{k: v for k, v in b.items() if k != "token"},
                     "locations": sorted(b["locations"], key=lambda n: n["node_id"])}
                    for b in located["blocks"]]}
            assert [b["token"]["id"] for b in status.locations["blocks"]] == \
                [b["block"]["id"] for b in status.locations["blocks"]]
            assert untokened(status.locations) == \
                untokened(await c.get_block_locations("/f"))
            assert (await c.get_file_status("/d", locations=True)).locations is None
            async with await c.open("/f", located=status.locations) as stream:
                assert stream.length == len(data)
                assert await stream.read() == data
                assert await stream.pread(70_000, 10) == data[70_000:70_010]
