"""Folder quotas (HDFS name and space quotas) against real servers on loopback: every check
refuses with HDFS's wording and changes nothing, clearing works, only the superuser sets
them, and the stored usage stays exact (a randomized run checked against a recount, across
a restart of the metadata server, with ``check_namespace``)."""

from __future__ import annotations

import errno
import random

import pytest

from fs.errors import DSQuotaExceeded, NSQuotaExceeded, PermissionDenied, QuotaExceeded
from harness import inprocess_cluster, namespace_problems, recover_until_closed

KiB = 1024
BS = 64 * KiB
# small inline files and small delete records, so both paths are met
SETTINGS = dict(replication=1, block_size=BS, inline_max=1024, delete_chunk=6)
EVE = ("eve", ["eve"])


async def tree(c, path="/") -> dict:
    """Every path below ``path`` with its type, length and replication."""
    out = {}
    for st in await c.list_status(path):
        child = (path.rstrip("/") + "/" + st.name)
        out[child] = (st.type, st.length, st.replication)
        if st.type == "dir":
            out.update(await tree(c, child))
    return out


async def recount(c, path) -> tuple[int, int]:
    """Names and space at and below ``path`` by a full walk (closed files only)."""
    entries = await tree(c, path)
    names = 1 + len(entries)
    space = sum(length * rep for kind, length, rep in entries.values() if kind == "file")
    return names, space


async def usage(c, path) -> tuple[int, int]:
    s = await c.content_summary(path)
    return s["ns_used"], s["ds_used"]


@pytest.mark.cluster(n_storage=1, **SETTINGS)
async def test_name_quota_refuses_create_mkdirs_rename(cluster):
    async with cluster.client() as c:
        await c.mkdirs("/q/a")
        await c.mkdirs("/out/d/e")
        await c.set_quota("/q", ns_quota=3)
        s = await c.content_summary("/q")
        assert (s["ns_quota"], s["ns_used"], s["ds_quota"]) == (3, 2, -1)
        await c.write_file("/q/f", b"x" * 10)
        before = await tree(c)
        message = ("The NameSpace quota (directories and files) of directory /q is "
                   "exceeded: quota=3 file count=4")
        for op in (lambda: c.mkdirs("/q/b"), lambda: c.write_file("/q/g", b"y"),
                   lambda: c.mkdirs("/q/a/x/y"), lambda: c.rename("/out/d", "/q/d"),
                   lambda: c.create_symlink("/out", "/q/l")):
            with pytest.raises(NSQuotaExceeded) as info:
                await op()
            assert info.value.errno == errno.EDQUOT
            assert info.value.message.startswith(message[:-1])
        assert await tree(c) == before
        with pytest.raises(NSQuotaExceeded, match="file count=4$"):
            await c.mkdirs("/q/b")
        # moves that land together are checked together
        await c.mkdirs("/out/m1")
        await c.mkdirs("/out/m2")
        await c.rename("/q/f", "/out/f")
        with pytest.raises(NSQuotaExceeded, match="file count=4$"):
            await c.rename_many([("/out/m1", "/q/m1"), ("/out/m2", "/q/m2")])
        assert await usage(c, "/q") == (2, 0)
        await c.rename("/out/f", "/q/f")
        # a rename inside the quota folder moves nothing out of it
        await c.rename("/q/f", "/q/a/f")
        await c.set_quota("/q", ns_quota=-1)
        assert (await c.content_summary("/q"))["ns_quota"] == -1
        await c.rename("/out/d", "/q/d")
        await c.mkdirs("/q/b")


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_space_quota_refuses_add_block_setrep_append(cluster):
    async with cluster.client() as c:
        await c.mkdirs("/s")
        await c.set_quota("/s", ds_quota=2 * BS)
        await c.write_file("/s/f", b"a" * (BS + 36 * KiB))   # 2 blocks, 100 KiB
        assert await usage(c, "/s") == (2, 100 * KiB)
        before = await tree(c)
        # a new block reserves a whole block: 100 KiB + 64 KiB > 128 KiB
        with pytest.raises(DSQuotaExceeded) as info:
            await c.write_file("/s/g", b"b" * (4 * KiB))
        assert info.value.errno == errno.EDQUOT
        assert info.value.message.endswith(   # the writer names its file first
            "The DiskSpace quota of /s is exceeded: quota = 131072 B = 128 KB but "
            "diskspace consumed = 167936 B = 164 KB")
        await c.delete("/s/g")   # created, then refused its first block (as HDFS)
        with pytest.raises(DSQuotaExceeded, match="consumed = 204800 B = 200 KB"):
            await c.set_replication("/s/f", 2)
        assert await tree(c) == before
        await c.set_quota("/s", ds_quota=110 * KiB)
        # append reopens the 36 KiB last block at its full 64 KiB: +28 KiB
        with pytest.raises(DSQuotaExceeded, match="consumed = 131072 B = 128 KB"):
            async with await c.append("/s/f") as out:
                await out.write(b"c")
        assert await tree(c) == before
        assert await usage(c, "/s") == (2, 100 * KiB)
        # truncate inside a block makes it be written again: it counts whole
        with pytest.raises(DSQuotaExceeded, match="consumed = 131072 B = 128 KB"):
            await c.truncate("/s/f", 90 * KiB)
        # a small file kept inline is checked at its close
        await c.set_quota("/s", ds_quota=100 * KiB + 50)
        with pytest.raises(DSQuotaExceeded, match="consumed = 102500 B = 100.10 KB"):
            await c.write_file("/s/tiny", b"t" * 100)
        await c.delete("/s/tiny")
        assert await tree(c) == before
        assert await usage(c, "/s") == (2, 100 * KiB)
        await c.set_quota("/s", ds_quota=-1)
        s = await c.content_summary("/s")
        assert (s["ns_quota"], s["ds_quota"]) == (-1, -1)
        await c.set_replication("/s/f", 2)
        async with await c.append("/s/f") as out:
            await out.write(b"c")


@pytest.mark.cluster(n_storage=1, **SETTINGS)
async def test_only_the_superuser_sets_quotas(cluster):
    async with cluster.client() as root:
        await root.mkdirs("/home/eve")
        await root.set_owner("/home/eve", "eve", "eve")
        async with cluster.client(user=EVE[0], groups=EVE[1]) as eve:
            for kw in (dict(ns_quota=5), dict(ds_quota=-1)):
                with pytest.raises(PermissionDenied):
                    await eve.set_quota("/home/eve", **kw)
        assert (await root.content_summary("/home/eve"))["ns_quota"] == -1
        await root.set_quota("/home/eve", ns_quota=5, ds_quota=1 << 30)
        s = await root.content_summary("/home/eve")
        assert (s["ns_quota"], s["ds_quota"]) == (5, 1 << 30)


@pytest.mark.parametrize("seed", [1, 2])
async def test_usage_stays_exact_randomized(tmp_path, seed):
    """Random ops in and between two quota folders (nested ones too) and outside; the
    stored usage must equal a recount, also after a restart, and the store must pass
    ``check_namespace``."""
    rng = random.Random(seed)
    quota_dirs = ["/A", "/B", "/A/n"]
    fixed = quota_dirs + ["/out"]

    async def check(c):
        for q in quota_dirs:
            assert await usage(c, q) == await recount(c, q), q

    async with inprocess_cluster(tmp_path, 3, **SETTINGS) as cluster:
        async with cluster.client() as c:
            for d in ("/A/n", "/B", "/out"):
                await c.mkdirs(d)
            await c.write_file("/A/n/before", b"z" * 5000)
            await c.set_quota("/A", ns_quota=60, ds_quota=40 * BS)
            await c.set_quota("/B", ns_quota=40)
            await c.set_quota("/A/n", ds_quota=8 * BS)
            # a subtree past delete_chunk is detached, not removed in its record: its
            # usage must leave the quota folders at once all the same
            for i in range(8):
                await c.write_file(f"/A/n/big/{i}", b"v" * 2000, replication=2)
            await check(c)
            await c.delete("/A/n/big", recursive=True)
            await check(c)
            refused = 0
            for step in range(120):
                everything = await tree(c)
                dirs = [p for p, (kind, _, _) in everything.items() if kind == "dir"]
                files = [p for p, (kind, _, _) in everything.items() if kind == "file"]
                op = rng.choice(["mkdir", "write", "write", "delete", "rename", "rename",
                                 "setrep"])
                name = f"x{step}"
                try:
                    if op == "mkdir":
                        await c.mkdirs(f"{rng.choice(dirs)}/{name}/{rng.choice('ab')}")
                    elif op == "write":
                        size = rng.choice([0, 100, 3000, BS + 7, 2 * BS + 1])
                        path = f"{rng.choice(dirs)}/{name}"
                        await c.write_file(path, b"w" * size,
                                           replication=rng.randint(1, 3))
                    elif op == "delete":
                        victims = [p for p in everything if p not in fixed]
                        if victims:
                            await c.delete(rng.choice(victims), recursive=True)
                    elif op == "rename":
                        movable = [p for p in everything if p not in fixed]
                        if movable:
                            src = rng.choice(movable)
                            dst = rng.choice(dirs)
                            if not (dst + "/").startswith(src + "/"):
                                await c.rename(src, f"{dst}/{name}")
                    elif op == "setrep" and files:
                        await c.set_replication(rng.choice(files), rng.randint(1, 3))
                except QuotaExceeded:
                    refused += 1
                    # a write refused a block leaves its file open, as in HDFS, its
                    # last block counted whole: recovery closes it at its real length
                    if op == "write" and await c.exists(path):
                        await recover_until_closed(c, path)
                if step % 30 == 29:
                    await check(c)
            await check(c)
            assert refused > 0   # the quotas were met, not just carried along
            summaries = {q: await c.content_summary(q) for q in quota_dirs}
        await cluster.stop_meta()
        assert namespace_problems(cluster.meta_dir) == []
        await cluster.start_meta()
        await cluster.wait_ready(3)
        async with cluster.client() as c:
            await check(c)
            assert {q: await c.content_summary(q) for q in quota_dirs} == summaries


def test_cli_forms_call_set_quota(capsys):
    """``dfsadmin -setQuota/...`` and the plain commands make the same calls; a refused path
    is one stderr line and exit 1, the other paths still go."""
    from tools.cli import build_parser
    from tools.common import UsageError
    from tools.common import Command

    class Stub:
        def __init__(self):
            self.calls = []

        def set_quota(self, path, **quota):
            if path == "/denied":
                raise PermissionDenied("Access denied for user eve. Superuser privilege is "
                                       "required")
            self.calls.append((path, quota))

    def run_cli(*argv):
        args = build_parser().parse_args(list(argv))
        cmd = Command(argv[0], args)
        cmd._client = stub = Stub()
        return args.func(cmd), stub.calls

    assert run_cli("dfsadmin", "-setQuota", "10", "/a", "/b") == (
        0, [("/a", {"ns_quota": 10}), ("/b", {"ns_quota": 10})])
    assert run_cli("dfsadmin", "-clrQuota", "/a")[1] == [("/a", {"ns_quota": -1})]
    assert run_cli("dfsadmin", "-setSpaceQuota", "1.5m", "/a")[1] == [
        ("/a", {"ds_quota": 3 << 19})]
    assert run_cli("dfsadmin", "-clrSpaceQuota", "/a")[1] == [("/a", {"ds_quota": -1})]
    assert run_cli("set-space-quota", "10g", "/a")[1] == [("/a", {"ds_quota": 10 << 30})]
    assert run_cli("clr-quota", "/a")[1] == [("/a", {"ns_quota": -1})]
    status, calls = run_cli("set-quota", "3", "/denied", "/ok")
    assert status == 1 and calls == [("/ok", {"ns_quota": 3})]
    assert "setQuota: Access denied" in capsys.readouterr().err
    for bad in (("dfsadmin", "-setQuota", "0", "/a"), ("set-space-quota", "lots", "/a"),
                ("dfsadmin", "/a")):
        with pytest.raises((SystemExit, UsageError)):
            build_parser().parse_args(list(bad))
