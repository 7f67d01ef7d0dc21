"""Chaos under metadata HA (ha = etcd): writers, folder makers, renames and deletes run
against a real process cluster (3 etcd members, an active and a standby metadata server,
an observer, 3 block servers) while a loop kills with SIGKILL and restarts, one at a time,
the active, the standby, the observer and etcd members.

At the end: every file whose close was acknowledged reads back exactly; every folder whose
mkdirs was acknowledged is there; every metadata server has applied the same txid; and each
server's namespace store is equal to a serial replay of the replicated log into a fresh
store (every record valid against the ones before it, ``check_record``).

Bounded: ``LEASEFS_HA_CHAOS_ROUNDS`` kill rounds (default 50). The counts are printed
(``-s`` shows them) for the closing notes.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest
import trio

from chaoskit import KiB, Ledger, mover, sha, writer
from fs import errors
from hakit import HACluster
ROUNDS = int(os.environ.get("LEASEFS_HA_CHAOS_ROUNDS", "50"))
pytestmark = [pytest.mark.timeout(ROUNDS * 20 + 300), pytest.mark.slow]


def _folders(cluster, ledger: Ledger, stop: threading.Event) -> None:
    with cluster.client() as client:
        n = 0
        while not stop.is_set():
            path = f"/chaos/d/{n // 100}/{n}"
            n += 1
            try:
                client.mkdirs(path)
            except errors.LeaseFSError as exc:
                ledger.failed("mkdir_failures", f"mkdirs {path}: {exc}")
                continue
            with ledger.lock:
                ledger.folders.add(path)
                ledger.counts["mkdirs"] += 1
            time.sleep(0.01)


def _kill_round(cluster: HACluster, ledger: Ledger, rng: random.Random, k: int) -> None:
    kind = ("active", "standby", "observer", "etcd")[k % 4] if k < 8 else \
        rng.choice(("active", "active", "standby", "observer", "etcd"))
    if kind == "etcd":
        i = rng.randrange(len(cluster.etcd.names))
        cluster.etcd.kill9(i)
        # fixed-sleep: chaos pacing: how long the etcd member stays dead
        time.sleep(rng.uniform(0.2, 1.5))
        cluster.etcd.restart(i)
        cluster.etcd.wait_healthy()
    else:
        statuses = cluster.statuses()
        wanted = {"active": "active", "standby": "standby", "observer": "observer"}[kind]
        names = [n for n, s in statuses.items() if s and s["role"] == wanted]
        if not names:
            return
        victim = names[0]
        cluster.kill(victim)
        # fixed-sleep: chaos pacing: how long the server stays dead
        time.sleep(rng.uniform(0.2, 1.5))
        cluster.start_one(victim)
        if victim in cluster.observers:
            cluster.wait_role(victim, "observer", timeout=30)
        else:
            # back before its old lease expired, the killed active may win the next term
            # itself; either way one server is active and the other follows
            cluster.wait_active(timeout=30)
            cluster.wait_role(victim, ("standby", "active"), timeout=30)
    ledger.bump(f"kills {kind}")


def _store_items(kv) -> dict[bytes, bytes]:
    # ``\x00`` keys are the store's own; the checkpoint keys are each server's own
    return {k: v for k, v in kv.scan(b"") if not k.startswith(b"\x00")
            and not k.startswith(b"Mcheckpoint_")}


def _replay_log(cluster: HACluster, folder) -> tuple[dict, list[str], int]:
    """A fresh store fed every record of the replicated log, serially."""
    from meta.ha.controller import unpack_entry
    from meta.ha.log import HALog
    from meta.namespace.invariants import check_record
    from meta.journal.files import decode_batch
    from meta.journal.kv import PlyvelStore
    from meta.namespace.namespace import Namespace

    async def entries():
        async with HALog.open(cluster.etcd.endpoints, cluster.settings["ha_prefix"]) as log:
            return await log.read(1)

    replay = PlyvelStore(str(folder))
    try:
        ns = Namespace(replay)
        problems: list[str] = []
        last = 0
        for entry in trio.run(entries):
            _wall, data = unpack_entry(entry.payload)
            for record in decode_batch(data, 64 << 20):
                assert record.txid == last + 1, (record.txid, last)
                last = record.txid
                problems += check_record(replay, record)
                ns.apply([record])
        return _store_items(replay), problems, last
    finally:
        replay.close()


def test_ha_chaos(tmp_path):
    from meta.journal.kv import PlyvelStore

    cluster = HACluster(tmp_path, n_meta=2, observers=1, n_storage=3,
                        settings={"replication": 3, "block_size": 256 * KiB})
    ledger = Ledger()
    try:
        cluster.start()
        with cluster.client() as client:
            client.mkdirs("/chaos")
        stop = threading.Event()
        threads = [threading.Thread(target=writer, args=(cluster, ledger, stop, k),
                                    kwargs={"max_bytes": 300 * KiB}) for k in range(2)]
        threads.append(threading.Thread(target=_folders, args=(cluster, ledger, stop)))
        threads.append(threading.Thread(target=mover, args=(cluster, ledger, stop, 0.05)))
        for t in threads:
            t.start()
        rng = random.Random(4000)
        started = time.monotonic()
        try:
            for k in range(ROUNDS):
                # fixed-sleep: chaos pacing between kill rounds
                time.sleep(rng.uniform(0.3, 1.0))
                _kill_round(cluster, ledger, rng, k)
        finally:
            stop.set()
            for t in threads:
                t.join(180)
        chaos_seconds = time.monotonic() - started
        cluster.wait_ready()
        # everything acknowledged is there
        with cluster.client() as client:
            for path, digest in sorted(ledger.files.items()):
                assert sha(client.read_file(path)) == digest, path
            for path in sorted(ledger.folders):
                assert client.get_file_status(path).is_dir, path
        # every server has applied the same txid, then its store equals the log's replay
        deadline = time.monotonic() + 30
        while len({s["applied_txid"] for s in cluster.statuses().values() if s}) != 1 \
                or None in cluster.statuses().values():
            assert time.monotonic() < deadline, cluster.statuses()
            time.sleep(0.1)
        applied = next(iter(cluster.statuses().values()))["applied_txid"]
        for name in cluster.names:
            cluster.kill(name, sig=15)
        expected, problems, last = _replay_log(cluster, tmp_path / "replay")
        assert problems == [], problems[:20]
        assert last == applied, (last, applied)
        for name in cluster.names:
            kv = PlyvelStore(str(cluster.meta_dir(name) / "db"))
            try:
                assert _store_items(kv) == expected, name
            finally:
                kv.close()
        kills = {kind: ledger.counts[f"kills {kind}"]
                 for kind in ("active", "standby", "observer", "etcd")}
        summary = dict(ledger.counts, rounds=ROUNDS,
                       files_verified=len(ledger.files), folders_verified=len(ledger.folders),
                       txids=applied, chaos_seconds=round(chaos_seconds, 1))
        print("HA CHAOS", json.dumps(summary))
        assert sum(kills.values()) >= ROUNDS - 3, summary
        assert all(kills.values()), summary
        assert ledger.counts["writes"] > 20 and ledger.counts["mkdirs"] > 100, summary
        # acknowledged writes are what matters; failed ones must stay rare
        assert ledger.counts["write_failures"] <= max(5, ledger.counts["writes"] // 5), \
            (summary, ledger.errors[-20:])
    finally:
        cluster.stop()
