"""Repair on real processes: re-replication after a block server dies, corrupt/stale replicas,
the block scanner, replicas whose files are gone or cut (dropped on a read or by the directory
scan) and replica files unknown to a block server, setReplication up and down, decommission
under reads, fsck.

Every test starts a ``ProcessCluster`` (real ``python -m tools`` processes, real sockets, real
LevelDB and replica files) with short heartbeat/dead/replication intervals.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio

sys.path.insert(0, os.path.dirname(__file__))
from harness import ProcessCluster, leasefs, storage_index  # noqa: E402

from fs.rpc import RpcClient  # noqa: E402

pytestmark = pytest.mark.timeout(120)

BLOCK = 64 * 1024
SETTINGS = {"block_size": BLOCK, "min_block_size": 4096, "replication_interval": 0.2,
            "replication_pending_timeout": 5.0, "dead_node_interval": 2.0,
            "scanner_period": 3600.0, "scanner_bytes_per_second": 200 << 20}


def payload(seed: int, size: int) -> bytes:
    return bytes((seed * 7 + i * 13 + (i >> 9)) & 0xFF for i in range(size))


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r:.800}")


def rpc(cluster, method: str, **args):
    async def call():
        async with RpcClient(cluster.meta_address, "test-repair", retry_seconds=5.0,
                             timeout=20.0) as client:
            return await client.call(method, args)
    return trio.run(call)


def fsck(cluster, path="/", **kw) -> dict:
    return rpc(cluster, "fsck", path=path, **kw)


def block_nodes(client, path) -> list[list[str]]:
    """Per block: the addresses the metadata server hands to readers."""
    located = client.get_block_locations(path)
    return [[loc["address"] for loc in b["locations"]] for b in located["blocks"]]


def all_replicated(client, paths, n) -> bool:
    return all(len(nodes) == n for p in paths for nodes in block_nodes(client, p))


def replica_files(cluster, i: int, block_id: int) -> tuple[Path, Path]:
    root = cluster.storage_dir(i)
    data = [p for p in root.rglob(f"blk_{block_id}") if "finalized" in str(p)]
    meta = [p for p in root.rglob(f"blk_{block_id}_*.meta") if "finalized" in str(p)]
    assert data and meta, f"no finalized replica of block {block_id} in {root}"
    return data[0], meta[0]


# --------------------------------------------------------------------------- (a)

@pytest.mark.slow
@pytest.mark.cluster(n_storage=4, settings=SETTINGS)
def test_dead_block_server_is_re_replicated_and_excess_removed_on_return(process_cluster):
    with process_cluster.client() as client:
        files = {f"/a/f{i}": payload(i, 3 * BLOCK + 1000 * i) for i in range(3)}
        for path, data in files.items():
            client.write_file(path, data, replication=3)
        # the victim holds a replica of at least one block
        victim_addr = block_nodes(client, "/a/f0")[0][0]
        victim = storage_index(process_cluster, victim_addr)
        process_cluster.kill_storage(victim)
        killed = time.monotonic()

        def healed():
            nodes = [n for p in files for n in block_nodes(client, p)]
            return all(len(ns) == 3 and victim_addr not in ns for ns in nodes)
        wait_until(healed, 30, "3 good replicas again without the dead node")
        repair_seconds = time.monotonic() - killed
        print(f"\nre-replication after kill -9 took {repair_seconds:.2f}s "
              f"(dead interval {SETTINGS['dead_node_interval']}s)")
        report = client.report()
        assert [n["address"] for n in report["dead_nodes"]] == [victim_addr]
        assert report["under_replicated"] == 0 and report["missing"] == 0
        for path, data in files.items():
            assert client.read_file(path) == data

        # make one of the victim's replicas stale: append while it is dead
        with client.append("/a/f0") as out:
            out.write(b"tail")
        files["/a/f0"] += b"tail"
        process_cluster.start_storage(victim)
        wait_until(lambda: len(client.report()["live_nodes"]) == 4, 20, "victim back")
        seen_victim = []

        def settled():
            counts = []
            for p in files:
                blocks = block_nodes(client, p)
                counts += [len(ns) for ns in blocks]
                if p == "/a/f0" and victim_addr in blocks[-1]:
                    seen_victim.append(blocks[-1])
            return all(c == 3 for c in counts) and client.report()["pending_deletion"] == 0
        wait_until(settled, 30, "excess replicas deleted")
        # the last block of f0 got a new stamp: the victim's copy of it is stale and was
        # never handed out
        last_id = client.get_block_locations("/a/f0")["blocks"][-1]["block"]["id"]
        assert not seen_victim, f"stale replica of block {last_id} listed: {seen_victim}"
        for path, data in files.items():
            assert client.read_file(path) == data
        assert fsck(process_cluster)["status"] == "HEALTHY"


# --------------------------------------------------------------------------- (b)

@pytest.mark.slow
def test_garbage_truncated_and_deleted_replicas_are_found_and_repaired(tmp_path):
    settings = {**SETTINGS, "scanner_period": 0.5}
    with ProcessCluster(tmp_path, n_storage=4, settings=settings) as cluster:
        with cluster.client() as client:
            files = {f"/b/f{i}": payload(10 + i, 2 * BLOCK + 333) for i in range(3)}
            for path, data in files.items():
                client.write_file(path, data, replication=3)
            damaged = []   # (block id, storage index, how)
            for path, how in zip(files, ("garbage", "truncate", "delete")):
                located = client.get_block_locations(path)["blocks"][0]
                block_id = located["block"]["id"]
                idx = storage_index(cluster, located["locations"][0]["address"])
                data_file, meta_file = replica_files(cluster, idx, block_id)
                if how == "garbage":
                    size = data_file.stat().st_size
                    data_file.write_bytes(os.urandom(size))
                elif how == "truncate":
                    with open(data_file, "r+b") as fh:
                        fh.truncate(100)
                else:
                    data_file.unlink()
                    meta_file.unlink()
                damaged.append((block_id, located["locations"][0]["node_id"], how))
            # every file reads correctly whatever replica the reader picks
            for path, data in files.items():
                assert client.read_file(path) == data

            named = set()
            meta_log = cluster.base / "logs" / "meta.log"

            def garbage_named():
                # a truncated or deleted replica is not corrupt but lost: its block server
                # drops it (see the tests below); garbage is a checksum matter. fsck names
                # the corrupt replica only until the repair replaces it, which can come
                # within a second of the report: the server's log keeps the report
                for f in fsck(cluster)["files"]:
                    for b in f["blocks"]:
                        for bad in b["corrupt_replicas"]:
                            named.add((b["id"], bad["node_id"]))
                log = meta_log.read_text(errors="replace")
                return all((bid, node) in named
                           or f"replica of block {bid} on {node} reported corrupt" in log
                           for bid, node, how in damaged if how == "garbage")
            wait_until(garbage_named, 20, "the replica with garbage named corrupt")

            def locations(bid):
                return [n for p in files for b in client.get_block_locations(p)["blocks"]
                        if b["block"]["id"] == bid for n in b["locations"]]

            def repaired():
                # fsck is healthy too while a truncated or deleted replica is not found
                # lost yet (its server's scanner has not come to it): repaired once every
                # damaged block also has three replicas again
                r = fsck(cluster)
                return (r["status"] == "HEALTHY" and r["totals"]["corrupt_replicas"] == 0
                        and r["totals"]["under_replicated_blocks"] == 0
                        and all(len(locations(bid)) == 3 for bid, _, _ in damaged) and r)
            result = wait_until(repaired, 30, "fsck healthy after repair")
            assert result["totals"]["healthy_blocks"] == result["totals"]["blocks"] == 9
            for path, data in files.items():
                assert client.read_file(path) == data


# --------------------------------------------------------------------------- lost replicas

def damage(cluster, client, path: str, how: str):
    """Delete or cut (to 100 bytes) the replica files of the first block of ``path`` on the
    node that a reader opened now tries first; returns (block id, storage index, that
    reader: an open stream, the caller closes it)."""
    reader = client.open(path)
    block = reader.blocks[0]
    idx = storage_index(cluster, block.locations[0]["address"])
    data_file, meta_file = replica_files(cluster, idx, block.id)
    if how == "delete":
        data_file.unlink()
        meta_file.unlink()
    else:
        with open(data_file, "r+b") as fh:
            fh.truncate(100)
    return block.id, idx, reader


def scheduled_copies(client) -> int:
    return client.report()["replication"]["scheduled_total"]


def wait_restored(cluster, client, files: dict, damaged: dict, before: int, started: float):
    """The metadata server noticed the loss (a copy was scheduled; full block reports are
    600 s apart), then every block is HEALTHY with 3 replicas, the damaged node holding a
    fresh complete copy again (3 nodes: it is the only target)."""
    wait_until(lambda: scheduled_copies(client) >= before + len(damaged), 20,
               "copies of the lost replicas scheduled")
    noticed = time.monotonic() - started

    def healthy():
        r = fsck(cluster, "/lost")
        return (r["status"] == "HEALTHY" and r["totals"]["under_replicated_blocks"] == 0
                and all(b["live"] == 3 for f in r["files"] for b in f["blocks"]) and r)
    wait_until(healthy, 30, "fsck HEALTHY with 3 replicas of every block")
    for path, (block_id, idx) in damaged.items():
        data_file, _meta = replica_files(cluster, idx, block_id)
        want = files[path][:BLOCK]
        wait_until(lambda: data_file.exists() and data_file.read_bytes() == want, 20,
                   f"a fresh copy of block {block_id} on storage{idx}")
    for path, data in files.items():
        assert client.read_file(path) == data
    return noticed


def write_and_damage(cluster, client, seed: int, extra: int):
    """``/lost/delete`` and ``/lost/truncate`` written with 3 replicas, then one replica of
    each damaged that way behind the block server's back; returns (files, damaged, copies
    scheduled before the damage, per file an open reader that tries the damaged replica
    first)."""
    files = {f"/lost/{how}": payload(seed + i, BLOCK + extra)
             for i, how in enumerate(("delete", "truncate"))}
    for path, data in files.items():
        client.write_file(path, data, replication=3)
    before = scheduled_copies(client)
    damaged, readers = {}, {}
    for path in files:
        block_id, idx, readers[path] = damage(cluster, client, path, path.rsplit("/", 1)[1])
        damaged[path] = (block_id, idx)
    return files, damaged, before, readers


SETTINGS_LOST = {**SETTINGS, "directory_scan_interval": 3600.0, "block_report_interval": 600.0}


@pytest.mark.slow
@pytest.mark.cluster(n_storage=3, settings=SETTINGS_LOST)
def test_replica_deleted_or_cut_behind_the_map_is_dropped_and_reported_when_read(process_cluster):
    with process_cluster.client() as client:
        files, damaged, before, readers = write_and_damage(process_cluster, client, 40, 500)
        started = time.monotonic()
        for path, data in files.items():   # the reader falls back to another replica
            with readers[path] as reader:
                assert reader.read() == data
        noticed = wait_restored(process_cluster, client, files, damaged, before, started)
        print(f"\nlost replicas noticed {noticed:.2f}s after the reads")
        # what was left of the cut replica was moved aside, never served again
        block_id, idx = damaged["/lost/truncate"]
        aside = process_cluster.storage_dir(idx) / "corrupt" / f"blk_{block_id}"
        assert aside.exists() and aside.stat().st_size == 100


@pytest.mark.slow
def test_fsck_shows_a_replica_lost_under_a_reader_as_under_replicated_at_once(tmp_path):
    # no replication passes: the block stays under-replicated for fsck to show
    settings = {**SETTINGS_LOST, "replication_interval": 3600.0}
    with ProcessCluster(tmp_path, n_storage=3, settings=settings) as cluster:
        with cluster.client() as client:
            data = payload(45, BLOCK + 100)
            client.write_file("/lost/f", data, replication=3)
            assert fsck(cluster, "/lost")["status"] == "HEALTHY"
            block_id, idx, reader = damage(cluster, client, "/lost/f", "delete")
            victim_port = cluster.ports[f"storage{idx}"]
            with reader:
                assert reader.read() == data
            started = time.monotonic()

            def shown():
                r = fsck(cluster, "/lost", locations=True)
                (block,) = [b for f in r["files"] for b in f["blocks"] if b["id"] == block_id]
                ports = {int(loc["address"].rsplit(":", 1)[1]) for loc in block["locations"]}
                return (block["status"] == "UNDER_REPLICATED" and block["live"] == 2
                        and r["totals"]["under_replicated_blocks"] == 1
                        and victim_port not in ports and r)
            # the full block report is 600 s away: only the block server's own report can
            # have told the metadata server
            wait_until(shown, 20, "fsck UNDER_REPLICATED without the damaged node")
            print(f"\nfsck showed the lost replica {time.monotonic() - started:.2f}s after "
                  f"the read")
            proc = leasefs(cluster, "fsck", "/lost")
            assert f"blk_{block_id}_" in proc.stdout, proc.stdout
            assert "UNDER_REPLICATED live=2/3" in proc.stdout, proc.stdout
            assert client.read_file("/lost/f") == data


@pytest.mark.slow
def test_directory_scan_drops_replicas_whose_files_are_gone_or_cut_without_a_read(tmp_path):
    settings = {**SETTINGS_LOST, "directory_scan_interval": 1.0}
    with ProcessCluster(tmp_path, n_storage=3, settings=settings) as cluster:
        with cluster.client() as client:
            files, damaged, before, readers = write_and_damage(cluster, client, 50, 300)
            for reader in readers.values():   # nothing is read: the scan finds the damage
                reader.close()
            wait_restored(cluster, client, files, damaged, before, time.monotonic())


@pytest.mark.slow
def test_directory_scan_adds_replica_files_the_map_does_not_know(tmp_path):
    # no replication passes: the extra replica is neither deleted as excess nor copied
    settings = {**SETTINGS_LOST, "directory_scan_interval": 1.0, "replication_interval": 3600.0,
                "inline_max": 0}   # a small file's replicas are under test
    with ProcessCluster(tmp_path, n_storage=3, settings=settings) as cluster:
        with cluster.client() as client:
            data = payload(60, BLOCK // 2)
            client.write_file("/found/f", data, replication=2)
            located = client.get_block_locations("/found/f")["blocks"][0]
            block_id = located["block"]["id"]
            holders = {storage_index(cluster, loc["address"]) for loc in located["locations"]}
            (other,) = set(range(3)) - holders
            data_file, meta_file = replica_files(cluster, min(holders), block_id)
            bucket = cluster.storage_dir(other) / data_file.parent.relative_to(
                cluster.storage_dir(min(holders)))
            bucket.mkdir(parents=True, exist_ok=True)
            for src in (meta_file, data_file):   # each file appears whole (rename)
                tmp = cluster.storage_dir(other) / (src.name + ".copying")
                tmp.write_bytes(src.read_bytes())
                os.replace(tmp, bucket / src.name)
            wait_until(lambda: other in {storage_index(cluster, a)
                                         for a in block_nodes(client, "/found/f")[0]}, 20,
                       f"storage{other} listed as a holder of block {block_id}")
            r = fsck(cluster, "/found", locations=True)
            assert [b["live"] for f in r["files"] for b in f["blocks"]] == [3]
            assert client.read_file("/found/f") == data


# --------------------------------------------------------------------------- (c)

@pytest.mark.slow
@pytest.mark.cluster(n_storage=2, settings=SETTINGS)
def test_only_replica_corrupt_read_fails_clearly_and_fsck_exits_1(process_cluster):
    with process_cluster.client() as client:
        data = payload(3, BLOCK + 500)
        client.write_file("/c/one", data, replication=1)
        client.write_file("/c/fine", b"x" * 1000, replication=2)
        located = client.get_block_locations("/c/one")["blocks"][0]
        block_id = located["block"]["id"]
        idx = storage_index(process_cluster, located["locations"][0]["address"])
        data_file, _ = replica_files(process_cluster, idx, block_id)
        raw = bytearray(data_file.read_bytes())
        raw[10] ^= 0xFF
        data_file.write_bytes(bytes(raw))
        with pytest.raises(Exception) as info:
            client.read_file("/c/one")
        message = str(info.value)
        assert "checksum" in message.lower() and str(block_id) in message, message
        r = wait_until(lambda: (f := fsck(process_cluster))["status"] == "CORRUPT" and f, 10,
                       "fsck CORRUPT")
        assert r["totals"]["corrupt_blocks"] == 1
        bad = [b for f in r["files"] for b in f["blocks"] if b["status"] == "CORRUPT"]
        assert [b["id"] for b in bad] == [block_id]
        proc = leasefs(process_cluster, "fsck", "/c")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"blk_{block_id}" in proc.stdout and "CORRUPT" in proc.stdout
        # the located block is flagged, the server keeps serving everything else
        assert client.get_block_locations("/c/one")["blocks"][0]["corrupt"] is True
        assert client.read_file("/c/fine") == b"x" * 1000
        assert leasefs(process_cluster, "fsck", "/c/fine").returncode == 0
        assert client.report()["corrupt"] >= 1


# --------------------------------------------------------------------------- read order

def read_ops(cluster, i: int) -> float:
    """READ_BLOCK ops block server ``i`` served successfully, from its /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{cluster.storage_http_port(i)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "leasefs_storage_ops_total"
               and s.labels == {"op": "READ_BLOCK", "result": "ok"})


@pytest.mark.slow
def test_reads_of_a_block_spread_over_its_replicas_and_find_a_rotten_one(tmp_path):
    """Readers of one block are handed its replicas in a random order (equal distance: all
    on this host), so every replica serves reads, and a flipped byte on a replica no one
    used to read first is found and reported by a reader within a few reads, while every
    read returns the right bytes."""
    settings = {**SETTINGS, "inline_max": 0, "replication_interval": 3600.0}
    reads = 30
    with ProcessCluster(tmp_path, n_storage=3, settings=settings) as cluster:
        with cluster.client() as client:
            data = payload(60, 20_000)
            client.write_file("/spread/f", data, replication=3)
            before = [read_ops(cluster, i) for i in range(3)]
            for _ in range(reads):
                assert client.read_file("/spread/f") == data

            def served():
                counts = [read_ops(cluster, i) - before[i] for i in range(3)]
                return sum(counts) >= reads and counts
            counts = wait_until(served, 20, f"{reads} READ_BLOCK ops counted")
            print(f"\nREAD_BLOCK ops per block server for {reads} reads: {counts}")
            assert all(c >= 1 for c in counts), counts

            located = client.get_block_locations("/spread/f")["blocks"][0]
            block_id, rotten = located["block"]["id"], located["locations"][1]
            data_file, _ = replica_files(cluster, storage_index(cluster, rotten["address"]),
                                         block_id)
            raw = bytearray(data_file.read_bytes())
            raw[4321] ^= 0xFF
            data_file.write_bytes(bytes(raw))

            def still_handed_out() -> bool:
                return rotten["node_id"] in [
                    loc["node_id"] for loc in
                    client.get_block_locations("/spread/f")["blocks"][0]["locations"]]
            needed = 0
            while still_handed_out():   # each read is a fresh order; 1/3 try the rotten one
                needed += 1
                assert needed <= 40, "no reader came across the rotten replica"
                assert client.read_file("/spread/f") == data
            print(f"rotten replica reported after {needed} read(s)")
            corrupt = {(b["id"], bad["node_id"]) for f in fsck(cluster, "/spread")["files"]
                       for b in f["blocks"] for bad in b["corrupt_replicas"]}
            assert (block_id, rotten["node_id"]) in corrupt, corrupt
            assert client.read_file("/spread/f") == data


# --------------------------------------------------------------------------- (d)

@pytest.mark.slow
@pytest.mark.cluster(n_storage=3, settings=SETTINGS)
def test_set_replication_down_and_up(process_cluster):
    with process_cluster.client() as client:
        data = payload(4, 3 * BLOCK)
        client.write_file("/d/f", data, replication=3)
        assert all_replicated(client, ["/d/f"], 3)
        client.set_replication("/d/f", 1)
        wait_until(lambda: all_replicated(client, ["/d/f"], 1)
                   and client.report()["pending_deletion"] == 0, 20, "1 replica")
        used = wait_until(lambda: sum(1 for i in range(3) for p in
                                      process_cluster.storage_dir(i).rglob("blk_*")
                                      if not p.name.endswith(".meta")
                                      and "finalized" in str(p)) == 3 or None,
                          20, "replica files deleted on disk")
        assert used
        assert client.read_file("/d/f") == data
        client.set_replication("/d/f", 3)
        wait_until(lambda: all_replicated(client, ["/d/f"], 3), 20, "3 replicas again")
        assert client.read_file("/d/f") == data
        assert fsck(process_cluster, "/d")["totals"]["healthy_blocks"] == 3


# --------------------------------------------------------------------------- (e)

@pytest.mark.slow
@pytest.mark.cluster(n_storage=4, settings=SETTINGS)
def test_decommission_under_reads(process_cluster):
    with process_cluster.client() as client:
        files = {f"/e/f{i}": payload(20 + i, 2 * BLOCK + 7) for i in range(4)}
        for path, data in files.items():
            client.write_file(path, data, replication=2)
        target_addr = block_nodes(client, "/e/f0")[0][0]
        proc = leasefs(process_cluster, "decommission", target_addr)
        assert proc.returncode == 0, proc.stderr
        assert "DECOMMISSION" in proc.stdout
        reads = 0
        deadline = time.monotonic() + 30
        while True:   # reads keep working while the replicas move
            for path, data in files.items():
                assert client.read_file(path) == data
                reads += 1
            status = json.loads(leasefs(process_cluster, "decommission", target_addr, "--status",
                                        "--json").stdout)
            if status["admin"] == "DECOMMISSIONED":
                break
            assert time.monotonic() < deadline, status
        assert reads >= len(files)
        # every block has 2 replicas on nodes in service
        for path in files:
            for nodes in block_nodes(client, path):
                in_service = [n for n in nodes if n != target_addr]
                assert len(in_service) >= 2, (path, nodes)
        # no new block goes to the decommissioned node
        client.write_file("/e/new", payload(99, 3 * BLOCK), replication=3)
        for nodes in block_nodes(client, "/e/new"):
            assert target_addr not in nodes
        report = client.report()
        assert report["decommissioned"] == 1
        proc = leasefs(process_cluster, "fsck", "/e")
        assert proc.returncode == 0, proc.stdout


# --------------------------------------------------------------------------- pure state

def test_replication_queues_priorities_pending_and_excess():
    from meta.blocks import replication as rq

    assert rq.priority(3, 0, 3) is None
    assert rq.priority(1, 0, 3) == rq.HIGHEST
    assert rq.priority(0, 2, 2) == rq.HIGHEST          # only on decommissioning nodes
    assert rq.priority(0, 0, 3) == rq.NO_SOURCE        # nothing to copy from
    assert rq.priority(2, 0, 10) == rq.VERY_UNDER
    assert rq.priority(2, 0, 3) == rq.UNDER
    assert rq.choose_excess([("a", 50, False), ("b", 10, False), ("c", 99, True)], 2) == ["c", "b"]

    q = rq.ReplicationQueues(pending_timeout=10.0, max_streams=1)
    q.update(7, rq.UNDER)
    q.update(8, rq.HIGHEST)
    q.update(9, rq.NO_SOURCE)
    assert q.in_order() == [8, 7] and q.queued() == 3
    q.add_pending(8, "n1", ["n2", "n3"], now=100.0)
    assert not q.has_stream("n1") and q.pending_targets(8) == ["n2", "n3"]
    assert q.target_done(8, "n2") is False and q.pending_targets(8) == ["n3"]
    assert q.target_done(8, "n3") is True and q.has_stream("n1")
    q.add_pending(7, "n1", ["n4"], now=100.0)
    assert q.timed_out(109.0) == []
    late = q.timed_out(110.0)
    assert [p.block_id for p in late] == [7] and q.has_stream("n1") and not q.pending
    q.add_excess(7, ["n2"])
    assert q.excess_of(7, ["n1", "n2"]) == {"n2"}
    assert q.excess_of(7, ["n1"]) == set() and 7 not in q.excess   # deleted: forgotten
    q.remove(7)
    assert q.in_order() == [8]
    # a dead node: copies from it, and copies still waiting for it as a target, are dropped
    # at once (rescheduled by the next pass), not after the pending timeout
    q.add_pending(5, "n1", ["n2"], now=200.0)
    q.add_pending(6, "n3", ["n4", "n5"], now=200.0)
    q.add_pending(4, "n6", ["n7"], now=200.0)
    assert q.target_done(6, "n4") is False
    assert sorted(q.forget_node("n5")) == [6] and sorted(q.pending) == [4, 5]
    assert q.forget_node("n1") == [5] and list(q.pending) == [4]
