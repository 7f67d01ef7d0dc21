"""A database on the mount under faults, with its writes going as patches: sqlite3
commits transactions through one mount while a block server is killed with SIGKILL and
started again every couple of seconds, then the mount itself is killed. Every transaction
whose COMMIT returned is in the database another mount opens after the first mount's
lease lapsed, and the database passes integrity_check: no acknowledged byte lost, no
replica that missed a patch handed to a reader, every block at one complete version.

The suite's run kills a block server 8 times; ``LEASEFS_SQLITE_TX`` (the soak of
docs/TESTING.md: 10 000) makes it go on killing until that many transactions were
acknowledged."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
    pytest.skip("/dev/fuse or fusermount3 is not available", allow_module_level=True)

from harness import Mount, ProcessCluster, poll_until  # noqa: E402

TX = int(os.environ.get("LEASEFS_SQLITE_TX", "0"))
#: how long the kills may go on: 2 minutes, or a generous time for TX transactions
KILLING = max(120.0, TX * 0.4)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600 + KILLING)]

WRITER = r"""
import random, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
db.execute("CREATE TABLE IF NOT EXISTS blob (b BLOB)")
db.execute("INSERT INTO blob VALUES (?)", (random.Random(1).randbytes(200 << 10),))
db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, tx INTEGER, body TEXT)")
tx = 0
while True:
    db.execute("BEGIN")
    db.executemany("INSERT INTO t VALUES (?, ?, ?)",
                   [(tx * 50 + i, tx, f"{tx}-{i} " * 12) for i in range(50)])
    db.execute("COMMIT")
    print(tx, flush=True)   # acknowledged: COMMIT returned after its fsyncs
    tx += 1
"""


def test_sqlite_commits_survive_block_server_kills_and_a_mount_kill(tmp_path):
    settings = {"lease_soft_limit": 1.0, "lease_hard_limit": 4.0,
                "lease_monitor_period": 0.2}
    with ProcessCluster(tmp_path, n_storage=3, settings=settings) as cluster:
        writer_mount = Mount(cluster, "writer").start()
        reader_mount = None
        try:
            db = writer_mount.mp / "db.sqlite"
            child = subprocess.Popen([sys.executable, "-c", WRITER, str(db)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
            os.set_blocking(child.stdout.fileno(), False)
            acked = -1
            lines = ""

            def drain():
                nonlocal acked, lines
                try:
                    lines += child.stdout.read() or ""
                except (BlockingIOError, TypeError):
                    pass
                done, _, lines = lines.rpartition("\n")
                for line in done.split("\n"):
                    if line.strip():
                        acked = int(line)

            started = time.monotonic()
            victim = 0
            kills = 0
            while (kills < 8 or acked < TX) and time.monotonic() - started < KILLING:
                time.sleep(2.0)
                drain()
                assert child.poll() is None, child.stderr.read()
                cluster.kill_storage(victim)
                time.sleep(0.8)
                cluster.start_storage(victim)
                cluster.wait_ready()
                kills += 1
                victim = (victim + 1) % 3
                if TX and kills % 20 == 0:
                    print(f"{kills} kills, {acked + 1} transactions acknowledged", flush=True)
            drain()
            # the mount dies in the middle of whatever the writer was doing
            writer_mount.kill()
            child.kill()
            child.wait(30)
            drain()
            assert kills >= 8 and acked >= max(20, TX - 1), (kills, acked)

            # the mount's lease lapses (hard limit) and recovery closes its files
            with cluster.client() as c:
                assert poll_until(lambda: c.is_file_closed("/db.sqlite"), 60)
                if c.exists("/db.sqlite-journal"):
                    assert poll_until(lambda: c.is_file_closed("/db.sqlite-journal"), 60)
            reader_mount = Mount(cluster, "reader").start()
            import sqlite3
            other = sqlite3.connect(reader_mount.mp / "db.sqlite", timeout=60)
            try:   # read-write: a hot journal left by the killed writer is rolled back
                assert other.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                last = other.execute("SELECT max(tx) FROM t").fetchone()[0]
                count = other.execute("SELECT count(*) FROM t").fetchone()[0]
            finally:
                other.close()
            # every acknowledged transaction is there, whole (one more may have landed)
            assert last is not None and last >= acked, (last, acked)
            assert count == (last + 1) * 50, (count, last)
        finally:
            if reader_mount is not None:
                reader_mount.cleanup()
            writer_mount.cleanup()
