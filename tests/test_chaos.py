"""Chaos under block-server deaths: writers, readers, renames and deletes run against a real process
cluster while a loop kills -9 and restarts random block servers, one at a time (so never all
holders of a replication-3 block at once). At the end every file whose close was acknowledged
reads back exactly, and fsck is healthy once repair has run.

Bounded in time: ``LEASEFS_CHAOS_SECONDS`` (default 60) of chaos, then at most 90 s of repair.
The counts are printed (``-s`` shows them) for the closing notes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fs import errors
from harness import ProcessCluster

REPO = Path(__file__).resolve().parents[1]
KiB = 1 << 10
CHAOS_SECONDS = float(os.environ.get("LEASEFS_CHAOS_SECONDS", "60"))
pytestmark = [pytest.mark.timeout(int(CHAOS_SECONDS) + 300), pytest.mark.slow]


class Ledger:
    """What the cluster must hold: path -> sha256 of every acknowledged file."""

    def __init__(self):
        self.lock = threading.Lock()
        self.files: dict[str, str] = {}
        self.counts = {"writes": 0, "write_failures": 0, "reads": 0, "read_failures": 0,
                       "mismatches": 0, "renames": 0, "deletes": 0, "kills": 0}
        self.errors: list[str] = []

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def pick(self, rng: random.Random) -> tuple[str, str] | None:
        with self.lock:
            if not self.files:
                return None
            path = rng.choice(sorted(self.files))
            return path, self.files[path]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _writer(cluster, ledger: Ledger, stop: threading.Event, k: int) -> None:
    rng = random.Random(1000 + k)
    with cluster.client() as client:
        n = 0
        while not stop.is_set():
            path = f"/chaos/w{k}/f{n:05d}"
            n += 1
            data = rng.randbytes(rng.randrange(1, 1200 * KiB))
            try:
                with client.create(path, replication=3) as out:
                    for i in range(0, len(data), 64 * KiB):
                        out.write(data[i:i + 64 * KiB])
            except errors.LeaseFSError as exc:
                ledger.bump("write_failures")
                ledger.errors.append(f"write {path}: {exc}")
                continue
            with ledger.lock:
                ledger.files[path] = _sha(data)
                ledger.counts["writes"] += 1


def _reader(cluster, ledger: Ledger, stop: threading.Event, k: int) -> None:
    rng = random.Random(2000 + k)
    with cluster.client() as client:
        while not stop.is_set():
            picked = ledger.pick(rng)
            if picked is None:
                time.sleep(0.05)
                continue
            path, digest = picked
            try:
                data = client.read_file(path)
            except errors.FileNotFound:
                continue   # renamed or deleted meanwhile
            except errors.LeaseFSError as exc:
                ledger.bump("read_failures")
                ledger.errors.append(f"read {path}: {exc}")
                continue
            ledger.bump("reads")
            with ledger.lock:
                still = ledger.files.get(path)
            if still == digest and _sha(data) != digest:
                ledger.bump("mismatches")
                ledger.errors.append(f"MISMATCH {path}")


def _mover(cluster, ledger: Ledger, stop: threading.Event) -> None:
    rng = random.Random(3000)
    with cluster.client() as client:
        client.mkdirs("/chaos/moved")
        n = 0
        while not stop.is_set():
            time.sleep(0.1)
            picked = ledger.pick(rng)
            if picked is None:
                continue
            path, digest = picked
            with ledger.lock:   # take it out while it moves, so readers skip it
                if ledger.files.get(path) != digest:
                    continue
                del ledger.files[path]
            try:
                if rng.random() < 0.6:
                    dst = f"/chaos/moved/m{n:05d}"
                    n += 1
                    client.rename(path, dst)
                    with ledger.lock:
                        ledger.files[dst] = digest
                        ledger.counts["renames"] += 1
                else:
                    client.delete(path)
                    ledger.bump("deletes")
            except errors.LeaseFSError as exc:
                with ledger.lock:
                    ledger.files[path] = digest   # nothing happened
                ledger.errors.append(f"move {path}: {exc}")


def _fsck(cluster) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "tools", "fsck", "/", "--json"],
                            env=cluster.env, cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_chaos_kills_and_restarts_block_servers(tmp_path):
    n_storage = 5
    cluster = ProcessCluster(tmp_path, n_storage=n_storage,
                             settings={"replication": 3, "block_size": 256 * KiB})
    with cluster:
        with cluster.client() as client:
            client.mkdirs("/chaos")
        ledger = Ledger()
        stop = threading.Event()
        threads = [threading.Thread(target=_writer, args=(cluster, ledger, stop, k))
                   for k in range(3)]
        threads += [threading.Thread(target=_reader, args=(cluster, ledger, stop, k))
                    for k in range(2)]
        threads.append(threading.Thread(target=_mover, args=(cluster, ledger, stop)))
        for t in threads:
            t.start()
        rng = random.Random(4000)
        deadline = time.monotonic() + CHAOS_SECONDS
        try:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(1.0, 3.0))
                victim = rng.randrange(n_storage)
                cluster.kill_storage(victim)
                ledger.bump("kills")
                time.sleep(rng.uniform(0.5, 2.5))
                cluster.start_storage(victim)   # back before the next one dies
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        cluster.wait_ready()
        # repair: fsck healthy within 90 s
        repair_started = time.monotonic()
        while True:
            code, text = _fsck(cluster)
            if code == 0:
                break
            assert time.monotonic() - repair_started < 90, text[-3000:]
            time.sleep(1.0)
        repair_seconds = time.monotonic() - repair_started
        with cluster.client() as client:
            for path, digest in sorted(ledger.files.items()):
                assert _sha(client.read_file(path)) == digest, path
        summary = dict(ledger.counts, files_verified=len(ledger.files),
                       repair_seconds=round(repair_seconds, 1), chaos_seconds=CHAOS_SECONDS)
        print("CHAOS", json.dumps(summary))
        assert ledger.counts["mismatches"] == 0, ledger.errors[-20:]
        assert ledger.counts["kills"] >= 3 and ledger.counts["writes"] > 10, summary
        # acknowledged writes are what matters; failed writes must stay rare
        assert ledger.counts["write_failures"] <= max(3, ledger.counts["writes"] // 10), \
            (summary, ledger.errors[-20:])
