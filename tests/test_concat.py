"""HDFS concat against real servers on loopback: the sources' blocks become the target's
(same block ids, no byte copied), the sources go, in one record that survives a restart;
HDFS's preconditions refuse and change nothing; quotas are charged."""

from __future__ import annotations

import pytest

from fs.errors import DSQuotaExceeded, FileNotFound, InvalidArgument
from harness import namespace_problems

KiB = 1024
BS = 64 * KiB
SETTINGS = dict(replication=1, block_size=BS, inline_max=1024)


async def block_ids(c, path) -> list[int]:
    located = await c.get_block_locations(path)
    blocks = located["blocks"] if isinstance(located, dict) else located
    return [b["block"]["id"] if "block" in b else b["id"] for b in blocks]


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_concat_moves_blocks_and_survives_restart(cluster):
    async with cluster.client() as c:
        a, b, last = b"a" * (2 * BS), b"b" * BS, b"c" * 1000 + b"d" * 5000
        await c.write_file("/d/t", a)
        await c.write_file("/d/s1", b)
        await c.write_file("/d/s2", last)
        ids = await block_ids(c, "/d/t") + await block_ids(c, "/d/s1") + \
            await block_ids(c, "/d/s2")
        await c.set_quota("/d", ns_quota=10, ds_quota=1 << 30)
        await c.concat("/d/t", ["/d/s1", "/d/s2"])
        assert await c.read_file("/d/t") == a + b + last
        assert await block_ids(c, "/d/t") == ids   # moved, not copied
        for gone in ("/d/s1", "/d/s2"):
            assert not await c.exists(gone)
        s = await c.content_summary("/d")
        assert (s["ns_used"], s["ds_used"]) == (2, len(a + b + last))
    await cluster.stop_meta()
    assert namespace_problems(cluster.meta_dir) == []
    await cluster.start_meta()
    await cluster.wait_ready(2)
    async with cluster.client() as c:
        assert await c.read_file("/d/t") == a + b + last
        assert await block_ids(c, "/d/t") == ids


@pytest.mark.cluster(n_storage=2, **SETTINGS)
async def test_concat_preconditions_and_quota(cluster):
    async with cluster.client() as c:
        await c.write_file("/d/t", b"t" * BS)
        await c.write_file("/d/part", b"p" * (BS + 10))
        await c.write_file("/d/full", b"f" * BS)
        await c.write_file("/d/small", b"s" * 10)      # inline: not in blocks
        await c.write_file("/d/other_bs", b"o" * 8192, block_size=4096)
        await c.write_file("/e/x", b"x" * BS)
        await c.write_file("/d/rep2", b"r" * BS, replication=2)
        before = {p: await c.read_file(p) for p in
                  ("/d/t", "/d/part", "/d/full", "/d/small", "/d/other_bs", "/e/x")}
        cases = [
            (["/d/part", "/d/full"], "last block in /d/part is not full"),
            (["/e/x"], "same directory"),
            (["/d/t"], "same with the target"),
            (["/d/full", "/d/full"], "given twice"),
            (["/d/small"], "not in blocks"),
            (["/d/other_bs"], "preferred block size 4096"),
            ([], "srcs must be a non-empty list"),
        ]
        for srcs, text in cases:
            with pytest.raises(InvalidArgument, match=text):
                await c.concat("/d/t", srcs)
        with pytest.raises(FileNotFound):
            await c.concat("/d/t", ["/d/nothing"])
        out = await c.create("/d/open")
        await out.write(b"o" * BS)
        with pytest.raises(InvalidArgument, match="under construction"):
            await c.concat("/d/t", ["/d/open"])
        await out.close()
        for path, data in before.items():
            assert await c.read_file(path) == data
        # a source written once joins a target of replication 2: its space doubles
        await c.set_replication("/d/t", 2)
        used = (await c.content_summary("/d"))["ds_used"]
        await c.set_quota("/d", ds_quota=used + BS - 1)
        with pytest.raises(DSQuotaExceeded):
            await c.concat("/d/t", ["/d/full"])
        await c.set_quota("/d", ds_quota=used + 2 * BS + 10)
        await c.concat("/d/t", ["/d/full", "/d/part"])
        assert await c.read_file("/d/t") == b"t" * BS + b"f" * BS + b"p" * (BS + 10)
        s = await c.content_summary("/d")
        assert s["ds_used"] == s["space_consumed"]
