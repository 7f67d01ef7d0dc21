"""A follower behind the replicated log (the entries it needs were purged after a checkpoint)
bootstraps itself from the active's image (``meta/ha/bootstrap.py``), with a real etcd and
real metadata server processes: it keeps its old store and journal aside, catches up, holds
the active's namespace, and serves all of it after a failover."""

from __future__ import annotations

import time

import pytest
import trio

from fs.errors import InvalidArgument, TryAgain
from fs.rpc import RpcClient
from hakit import HACluster, call
from meta.schema import keys
from meta.ha.bootstrap import STAGING, Gap, ImageSource, behind, install, sources
from meta.journal.journal import Journal
from meta.journal.files import inprogress_name
from meta.journal.kv import PlyvelStore



def namespace(address: str) -> dict[str, tuple]:
    """path -> what a client sees of it (type, permission, owner, length, times), every
    path under the root."""
    async def walk():
        out = {}
        async with RpcClient(address, "test-ha-bootstrap-walk", retry_seconds=0) as rpc:
            todo = ["/"]
            while todo:
                path = todo.pop()
                after = ""
                while True:
                    page = await rpc.call("list_status", {"path": path, "start_after": after})
                    for entry in page["entries"]:
                        child = path.rstrip("/") + "/" + entry["name"]
                        info = await rpc.call("get_file_info", {"path": child})
                        out[child] = tuple(sorted((k, repr(v)) for k, v in info.items()
                                                  if k != "locations"))
                        if entry["type"] == "dir":
                            todo.append(child)
                        after = entry["name"]
                    if not page["has_more"]:
                        break
        return out
    return trio.run(walk)


def first_log_txid(cluster) -> int:
    from meta.ha.log import HALog

    async def first():
        async with HALog.open(cluster.etcd.endpoints, cluster.settings["ha_prefix"]) as log:
            return (await log.read())[0].txid
    return trio.run(first)


def checkpoint(address: str) -> int:
    call(address, "safemode", action="enter")
    saved = call(address, "save_namespace")
    call(address, "safemode", action="leave")
    return saved["txid"]


def applied(cluster, name: str) -> int:
    status = cluster.statuses()[name]
    return status["applied_txid"] if status else -1


@pytest.mark.slow
def test_a_standby_behind_the_purged_log_bootstraps_from_the_active(tmp_path):
    cluster = HACluster(tmp_path, n_meta=2, n_storage=0, settings={"ha_log_retain": 5})
    try:
        cluster.start()
        active, standby = cluster.active_and_standby()
        a = cluster.address(active)
        for i in range(20):
            call(a, "mkdirs", path=f"/p/{i}")
        deadline = time.monotonic() + 10
        while applied(cluster, standby) < applied(cluster, active):
            assert time.monotonic() < deadline, cluster.statuses()
            time.sleep(0.05)
        behind = applied(cluster, standby)
        cluster.kill(standby)

        # mutations of every kind, and checkpoints that purge the log past the standby
        for i in range(20, 60):
            call(a, "mkdirs", path=f"/p/{i}")
        for i in range(10):
            call(a, "create", path=f"/f/{i}", client_name="test", replication=1)
            call(a, "complete", path=f"/f/{i}", client_name="test")
        call(a, "rename", src="/p/3", dst="/f/moved")
        call(a, "delete", path="/p/4", recursive=True)
        checkpoint(a)
        for i in range(60, 80):
            call(a, "mkdirs", path=f"/q/{i}")
        checkpoint(a)
        first = first_log_txid(cluster)
        assert first > behind + 1, (first, behind)

        # it starts, finds the log continuing after a gap, and bootstraps by itself
        cluster.start_one(standby)
        cluster.wait_role(standby, "standby", timeout=30)
        for i in range(80, 90):      # it follows the log after the image
            call(a, "mkdirs", path=f"/r/{i}")
        deadline = time.monotonic() + 20
        while applied(cluster, standby) < applied(cluster, active):
            assert time.monotonic() < deadline, cluster.statuses()
            time.sleep(0.05)

        text = (cluster.base / "logs" / f"{standby}.log").read_text(errors="replace")
        assert f"applied up to {behind}" in text and f"continues at txid {first}" in text, \
            text[-3000:]
        assert "bootstrapped from" in text, text[-3000:]
        aside = sorted(cluster.meta_dir(standby).glob("before-bootstrap-*"))
        assert len(aside) == 1 and (aside[0] / "db").is_dir() and \
            (aside[0] / "journal").is_dir(), aside
        assert str(aside[0]) in text

        # a failover to it: it serves everything the active had
        expected = namespace(a)
        assert "/f/moved" in expected and "/p/4" not in expected and "/r/89" in expected
        call(a, "ha_failover")
        assert cluster.wait_active(timeout=20, besides=active) == standby
        assert namespace(cluster.address(standby)) == expected
        call(cluster.address(standby), "mkdirs", path="/after")
        assert call(cluster.address(standby), "get_file_info", path="/after")["type"] == "dir"
    finally:
        cluster.stop()


# ------------------------------------------------------------------ the parts, in-process
def test_behind_and_sources():
    assert behind(10, 11) is None and behind(10, 5) is None
    assert behind(10, 40) == Gap(10, 40) and Gap(10, 40).needed == 39
    assert sources("meta0", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1", "127.0.0.1:2") == \
        ["127.0.0.1:1"]
    assert sources("127.0.0.1:3", "127.0.0.1:1", None) == ["127.0.0.1:3", "127.0.0.1:1"]


def _store(path, txid: int, n: int) -> PlyvelStore:
    kv = PlyvelStore(str(path))
    kv.write(puts=[(b"k%05d" % i, b"v" * 100) for i in range(n)] +
             [(keys.meta_key(keys.APPLIED_TXID), keys.pack(txid))])
    return kv


def test_an_image_is_one_snapshot_read_in_bounded_pages(tmp_path):
    kv = _store(tmp_path / "db", 7, 50)
    source = ImageSource()
    try:
        with pytest.raises(TryAgain, match="applied up to txid 7.*txid 8"):
            source.read(kv, 7, min_txid=8)
        page = source.read(kv, 7, min_txid=7, max_bytes=1000)
        # written after the image was opened: not in it
        kv.write(puts=[(b"k00000", b"changed"), (b"zz", b"new"),
                       (keys.meta_key(keys.APPLIED_TXID), keys.pack(8))])
        got, pages = dict(), 0
        while True:
            pages += 1
            assert sum(len(k) + len(v) for k, v in page["items"]) <= 1000
            got.update((k, v) for k, v in page["items"])
            if page["done"]:
                break
            page = source.read(kv, 8, session=page["session"], after=page["items"][-1][0],
                               max_bytes=1000)
        assert page["txid"] == 7 and pages > 5
        assert got[b"k00000"] == b"v" * 100 and b"zz" not in got and len(got) == 51
        with pytest.raises(InvalidArgument, match="not open"):   # released after its end
            source.read(kv, 8, session=page["session"], after=b"k")
    finally:
        source.close()
        kv.close()


async def test_install_keeps_the_old_state_and_the_journal_continues_after_the_image(tmp_path):
    data = tmp_path / "data"
    old = _store(data / "db", 3, 2)
    old.close()
    (data / "journal").mkdir()
    (data / "journal" / "keep-me").write_text("old")
    _store(data / STAGING, 41, 5).close()
    aside = install(str(data), str(data / STAGING), 3, 41, 0.0)
    assert (tmp_path / "data" / aside).name == "before-bootstrap-3-19700101T000000Z"
    assert (data / aside / "journal" / "keep-me").read_text() == "old"
    assert keys.read_counter(_reopen(data / aside / "db"), keys.APPLIED_TXID) == 3
    kv = PlyvelStore(str(data / "db"))
    try:
        assert keys.read_counter(kv, keys.APPLIED_TXID) == 41
        journal = Journal(str(data / "journal"), lambda records: None)
        journal.open(store_applied=41)
        # no lost-tail marker: the journal simply starts after the image
        assert journal.last_txid == 41 and list(journal.replay(41)) == []
        assert [p.name for p in (data / "journal").iterdir()] == [inprogress_name(42)], \
            list((data / "journal").iterdir())
        await journal.aclose()
    finally:
        kv.close()


def _reopen(path):
    kv = PlyvelStore(str(path))
    out = {keys.meta_key(keys.APPLIED_TXID): kv.get(keys.meta_key(keys.APPLIED_TXID))}
    kv.close()

    class View:
        def get(self, key):
            return out.get(key)
    return View()
