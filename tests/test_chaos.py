"""Chaos under block-server deaths: writers, readers, renames and deletes run against a real process
cluster while a loop kills -9 and restarts random block servers, one at a time (so never all
holders of a replication-3 block at once). At the end every file whose close was acknowledged
reads back exactly, and fsck is healthy once repair has run.

Bounded in time: ``LEASEFS_CHAOS_SECONDS`` (default 60) of chaos, then at most 90 s of repair.
The counts are printed (``-s`` shows them) for the closing notes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chaoskit import KiB, Ledger, mover, reader, sha, writer
from harness import ProcessCluster

REPO = Path(__file__).resolve().parents[1]
CHAOS_SECONDS = float(os.environ.get("LEASEFS_CHAOS_SECONDS", "60"))
pytestmark = [pytest.mark.timeout(int(CHAOS_SECONDS) + 300), pytest.mark.slow]


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
        threads = [threading.Thread(target=writer, args=(cluster, ledger, stop, k),
                                    kwargs={"max_bytes": 1200 * KiB}) for k in range(3)]
        threads += [threading.Thread(target=reader, args=(cluster, ledger, stop, k))
                    for k in range(2)]
        threads.append(threading.Thread(target=mover, args=(cluster, ledger, stop)))
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
                assert sha(client.read_file(path)) == digest, path
        summary = dict(ledger.counts, files_verified=len(ledger.files),
                       repair_seconds=round(repair_seconds, 1), chaos_seconds=CHAOS_SECONDS)
        print("CHAOS", json.dumps(summary))
        assert ledger.counts["mismatches"] == 0, ledger.errors[-20:]
        assert ledger.counts["kills"] >= 3 and ledger.counts["writes"] > 10, summary
        # acknowledged writes are what matters; failed writes must stay rare
        assert ledger.counts["write_failures"] <= max(3, ledger.counts["writes"] // 10), \
            (summary, ledger.errors[-20:])
