"""The edit journal with real metadata server processes: kill -9 under load and a journal
that lost its tail, a full metadata disk, checkpoints counted across restarts and
save-namespace. Real processes, real LevelDB, real journal files."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import msgpack
import pytest
import trio

from fs.client import AsyncClient
from harness import ProcessCluster, make_test_config
from meta import keys
from meta.invariants import check_namespace
from meta.journal import RECORD_HEADER
from meta.kv import PlyvelStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def leasefs(cluster: ProcessCluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", *args], env=cluster.env,
                          capture_output=True, text=True, timeout=60)


def journal_dir(cluster: ProcessCluster):
    return cluster.meta_dir() / "journal"


def inprogress_segment(cluster: ProcessCluster):
    names = [n for n in os.listdir(journal_dir(cluster)) if n.startswith("edits_inprogress_")]
    assert len(names) == 1, names
    return journal_dir(cluster) / names[0]


def store_applied(cluster: ProcessCluster) -> int:
    store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
    try:
        return int(keys.read_counter(store, keys.APPLIED_TXID))
    finally:
        store.close()


def cut_inside_record(segment, txid: int) -> None:
    """Truncate ``segment`` a few bytes before the end of record ``txid`` (a lost tail)."""
    data = segment.read_bytes()
    pos = 0
    while pos < len(data):
        length, _crc = RECORD_HEADER.unpack_from(data, pos)
        end = pos + RECORD_HEADER.size + length
        if msgpack.unpackb(data[pos + RECORD_HEADER.size:end])[0] == txid:
            with open(segment, "r+b") as fh:
                fh.truncate(end - 5)
            return
        pos = end
    raise AssertionError(f"record {txid} not in {segment}")


def store_problems(cluster: ProcessCluster) -> list[str]:
    store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
    try:
        return check_namespace(store)
    finally:
        store.close()


async def mkdir_load(address: str, workers: int, on_ack, stop: trio.Event) -> None:
    """``workers`` clients making directories until ``stop``; ``on_ack(path)`` per success."""
    async def worker(k: int):
        async with AsyncClient(address, config=make_test_config()) as client:
            i = 0
            while not stop.is_set():
                path = f"/load/w{k}/d{i}"
                await client.mkdirs(path)
                on_ack(path)
                i += 1

    async with trio.open_nursery() as nursery:
        for k in range(workers):
            nursery.start_soon(worker, k)
        await stop.wait()
        nursery.cancel_scope.cancel()


async def all_exist(address: str, wanted) -> list[str]:
    async with AsyncClient(address, config=make_test_config()) as client:
        return [p for p in wanted if not await client.exists(p)]


# ------------------------------------------------------------------------------ lost tail
def test_kill9_then_lost_journal_tail_starts_from_the_store_and_check_agrees(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=0)
    cluster.start()
    acked: list[str] = []
    try:
        async def load_then_kill():
            stop = trio.Event()

            def ack(path):
                acked.append(path)
                if len(acked) == 300:
                    cluster.kill_meta()      # kill -9 while the other workers are mid-call
                    stop.set()
            with trio.fail_after(120):
                await mkdir_load(cluster.meta_address, 4, ack, stop)

        trio.run(load_then_kill)
        # the disk lost the journal's last few bytes, down into the last record the store
        # applied (its write was fsynced before it was applied)
        applied = store_applied(cluster)
        cut_inside_record(inprogress_segment(cluster), applied)

        # the offline check (store present) says what the start will do
        before = leasefs(cluster, "meta", "--check-journal", str(cluster.meta_dir()))
        assert before.returncode == 0, before.stderr
        found = re.search(r"txids (\d+)\.\.(\d+) are not in the journal", before.stdout)
        assert found, before.stdout
        lost = (int(found.group(1)), int(found.group(2)))
        assert lost == (applied, applied)

        cluster.start_meta()
        cluster.wait_ready(0)
        log_text = (tmp_path / "logs" / "meta.log").read_text()
        assert re.search(rf"WARNING .*txids {lost[0]}\.\.{lost[1]} .*not in the journal",
                         log_text), log_text[-3000:]
        assert trio.run(all_exist, cluster.meta_address, acked) == []
        cluster.kill_meta(sig=15)
        assert store_problems(cluster) == []

        # a second start needs no recovery and the check agrees with it
        cluster.start_meta()
        cluster.wait_ready(0)
        assert trio.run(all_exist, cluster.meta_address, acked[:20]) == []
        cluster.kill_meta(sig=15)
        after = leasefs(cluster, "meta", "--check-journal", str(cluster.meta_dir()))
        assert after.returncode == 0, after.stderr
        assert f"txids {lost[0]}..{lost[1]}: lost from the journal" in after.stdout, after.stdout
        assert "OK" in after.stdout
    finally:
        cluster.stop()
