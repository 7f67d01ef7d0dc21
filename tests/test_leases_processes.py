"""Lease scenarios on real processes: a writer process killed with SIGKILL, and a metadata
server killed with SIGKILL twice while files are open. The cluster runs as separate
``python -m tools`` processes with short lease limits (soft 1 s, hard 3 s)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from fs import errors
from fs.client import Client
from harness import ProcessCluster, make_test_config, poll_until, wait_stopped
from test_ha import node_status

LEASES = {"lease_soft_limit": 1.0, "lease_hard_limit": 3.0, "lease_monitor_period": 0.2,
          "block_recovery_retry": 3.0}

WRITER = r"""
import sys, time
from fs.client import Client
from fs.config import Config
meta, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = Client(meta, config=Config.load(env={}, min_block_size=4096))
out = client.create(path, replication=3, block_size=64 * 1024)
out.write(bytes(i % 251 for i in range(size)))
out.flush()                      # hflush: every byte acknowledged by all three replicas
print("flushed", flush=True)
time.sleep(3600)                 # renews until killed
"""


@pytest.fixture
def cluster(tmp_path, request):
    settings = {**LEASES, **getattr(request, "param", {})}
    c = ProcessCluster(tmp_path / "cluster", n_storage=3, settings=settings)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def start_writer(cluster, path: str, size: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, cluster.meta_address, path, str(size)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cluster.env_base())
    line = proc.stdout.readline()
    assert line.strip() == "flushed", proc.stderr.read()
    return proc


def expected_bytes(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def assert_replicas_identical(cluster, client, path: str, data: bytes):
    """Every replica file of every block equals its slice of ``data``."""
    located = client.get_block_locations(path)
    assert located["length"] == len(data)
    for lb in located["blocks"]:
        want = data[lb["offset"]:lb["offset"] + lb["block"]["num_bytes"]]
        copies = [p for i in range(cluster.n_storage)
                  for p in cluster.storage_dir(i).rglob(f"blk_{lb['block']['id']}") if p.is_file()]
        assert len(copies) >= 1
        for copy in copies:
            if "finalized" in str(copy):
                assert copy.read_bytes() == want, copy


@pytest.mark.slow
def test_killed_writer_lease_is_recovered_by_the_next_creator(cluster):
    """Scenario 2 on processes: A (a real process) hflushes N bytes and is killed -9. B's
    create without overwrite is refused while A's lease is young (naming the holder) or while
    recovery runs, then fails with FileExists; /f holds exactly A's N bytes on every replica."""
    size = 150_000            # 2 full 64 KiB blocks + a partial last block
    writer = start_writer(cluster, "/f", size)
    writer.kill()
    writer.wait()
    with Client(cluster.meta_address, config=make_test_config()) as b:
        seen = []
        deadline = time.monotonic() + 30
        while True:
            try:
                b.create("/f").close()
                raise AssertionError("create of an open file succeeded")
            except errors.AlreadyBeingCreated as exc:
                seen.append("busy")
                assert "leasefs-client-" in str(exc)      # names A
            except errors.RecoveryInProgress:
                seen.append("recovering")
            except errors.FileExists:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        assert seen and seen[0] == "busy", seen
        assert b.get_file_status("/f").length == size
        assert b.read_file("/f") == expected_bytes(size)
        assert_replicas_identical(cluster, b, "/f", expected_bytes(size))


@pytest.mark.slow
def test_server_closes_a_dead_writers_file_after_the_hard_limit(cluster):
    """Scenario 3 on processes: nobody calls; after the hard limit the metadata server itself
    recovers the killed writer's file and closes it with the flushed length."""
    size = 100_000
    writer = start_writer(cluster, "/g", size)
    writer.kill()
    writer.wait()
    with Client(cluster.meta_address, config=make_test_config()) as observer:
        deadline = time.monotonic() + 30
        while observer.get_file_status("/g").under_construction:
            assert time.monotonic() < deadline, observer.list_open_files()
            time.sleep(0.2)
        assert observer.get_file_status("/g").length == size
        assert observer.read_file("/g") == expected_bytes(size)
        assert observer.list_open_files() == []


# A client gives its files up after failing to renew for the hard limit (HDFS's renewer
# does too), and a restart on a busy machine can keep the server away for about 4 s: the
# 3 s limit of this module's other tests would test the machine's speed, not the restart.
@pytest.mark.slow
@pytest.mark.parametrize("cluster", [{"lease_hard_limit": 30.0}], indirect=True)
def test_writers_survive_two_metadata_server_kills(cluster):
    """Scenario 6 on processes: files open (one renamed while open, with its parent); the
    metadata server is killed -9 and restarted twice; the writers keep writing and close, and
    every byte is there."""
    config = make_test_config(rpc_retry_seconds=30.0)
    with Client(cluster.meta_address, config=config) as client:
        client.mkdirs("/d1")
        streams = {p: client.create(p, replication=3, block_size=64 * 1024)
                   for p in ("/d1/a", "/b")}
        written = {p: bytearray() for p in streams}

        def write_some(tag: int):
            for p, out in streams.items():
                chunk = os.urandom(40_000) + bytes([tag])
                out.write(chunk)
                out.flush()
                written[p] += chunk

        write_some(1)
        client.rename("/d1", "/d2")             # the open file's parent moves...
        client.rename("/d2/a", "/d2/a2")         # ...and the open file itself
        for kill in range(2):
            cluster.kill_meta(signal.SIGKILL)
            cluster.start_meta()
            write_some(10 + kill)                # rides over the restart (RPC retries)
        for out in streams.values():
            out.close()
        assert client.read_file("/d2/a2") == bytes(written["/d1/a"])
        assert client.read_file("/b") == bytes(written["/b"])
        assert client.list_open_files() == []


@pytest.mark.slow
def test_a_late_complete_after_another_client_recovered_the_file_is_refused(cluster):
    """A's block servers finalized the last block, A's ``complete`` is held back; B recovers
    the lease (the last block gets a new stamp and the file closes). A's late ``complete``
    with the old stamp is no retry of a close that happened: it gets the lease error naming
    the file, and the file keeps what the recovery decided."""
    data = expected_bytes(3000)
    with Client(cluster.meta_address, config=make_test_config()) as a, \
            Client(cluster.meta_address, config=make_test_config()) as b:
        out = a.create("/late", replication=3, block_size=64 * 1024)
        out.write(data)
        stream = out._stream
        a._call(stream._end_block)          # LAST acked: every replica is FINALIZED
        last = dict(stream._previous)
        deadline = time.monotonic() + 30
        while not b.recover_lease("/late"):
            assert time.monotonic() < deadline, b.list_open_files()
            time.sleep(0.1)
        recovered = b.get_block_locations("/late")["blocks"][-1]["block"]
        assert recovered["gs"] > last["gs"]
        with pytest.raises(errors.LeaseExpired) as info:
            a._call(a._async.rpc.call, "complete", {
                "path": "/late", "client_name": a.client_name, "ino": stream.ino,
                "last": last})
        assert "/late" in str(info.value) and "not open for writing" in str(info.value)
        assert b.read_file("/late") == data
        assert b.list_open_files() == []


@pytest.mark.slow
def test_a_writer_whose_file_was_taken_over_gets_the_lease_error(cluster):
    """A writes and hflushes; B recovers the lease (block recovery stops A's pipeline on the
    block servers and closes the file). A's next write fails with the lease error naming
    the file, not with a refused pipeline recovery."""
    data = expected_bytes(5000)
    with Client(cluster.meta_address, config=make_test_config()) as a, \
            Client(cluster.meta_address, config=make_test_config()) as b:
        out = a.create("/t", replication=3, block_size=64 * 1024)
        out.write(data)
        out.flush()
        deadline = time.monotonic() + 30
        while not b.recover_lease("/t"):
            assert time.monotonic() < deadline, b.list_open_files()
            time.sleep(0.1)
        with pytest.raises(errors.LeaseExpired) as info:
            out.write(b"x" * 2000)
            out.flush()
        message = str(info.value)
        assert message.startswith("No lease on /t: the file is not open for writing"), message
        assert b.read_file("/t") == data


@pytest.mark.slow
def test_recovery_moves_on_when_its_primary_died_after_its_last_heartbeat(tmp_path):
    """The holder with the freshest heartbeat is killed -9 the moment lease recovery starts
    (the other two are paused a moment, so it is the freshest and becomes the primary). The
    metadata server does not wait ``block_recovery_retry`` (90 s) for a primary that will
    never heartbeat again: once it is stale the recovery is retried with another holder and
    the file closes with every flushed byte."""
    settings = {**LEASES, "block_recovery_retry": 90.0, "dead_node_interval": 120.0}
    with ProcessCluster(tmp_path / "cluster", n_storage=3, settings=settings) as cluster:
        size = 10_000
        writer = start_writer(cluster, "/p", size)
        writer.kill()
        writer.wait()
        others = [cluster.procs[f"storage{i}"] for i in (1, 2)]
        port = cluster.storage_http_port(0)

        def heartbeats() -> int:
            return node_status(port)["meta_servers"][0]["heartbeats_sent"]
        with Client(cluster.meta_address, config=make_test_config()) as b:
            for proc in others:
                proc.send_signal(signal.SIGSTOP)
            try:
                for proc in others:
                    wait_stopped(proc.pid)
                beats = heartbeats()   # two more from storage0: its heartbeat is the freshest
                assert poll_until(lambda: heartbeats() >= beats + 2, 20)
                cluster.kill_storage(0, signal.SIGKILL)
                assert b.recover_lease("/p") is False
            finally:
                for proc in others:
                    proc.send_signal(signal.SIGCONT)
            started = time.monotonic()
            while not b.recover_lease("/p"):
                assert time.monotonic() - started < 20, (b.list_open_files(),
                                                         cluster.log_tail("meta"))
                time.sleep(0.1)
            assert b.read_file("/p") == expected_bytes(size)


@pytest.mark.slow
def test_a_taken_over_writer_is_told_the_new_holder_while_recovery_runs(tmp_path):
    """While B's lease recovery of A's file is still running (the block servers are paused,
    so it cannot finish), A's pipeline recovery call gets the lease error naming the file
    and B, not the block's UNDER_RECOVERY state."""
    settings = {**LEASES, "dead_node_interval": 120.0}
    with ProcessCluster(tmp_path / "cluster", n_storage=3, settings=settings) as cluster:
        with Client(cluster.meta_address, config=make_test_config()) as a, \
                Client(cluster.meta_address, config=make_test_config()) as b:
            out = a.create("/w", replication=3, block_size=64 * 1024)
            out.write(expected_bytes(4000))
            out.flush()
            block = b.get_block_locations("/w")["blocks"][-1]["block"]
            storage = [cluster.procs[f"storage{i}"] for i in range(3)]
            for proc in storage:
                proc.send_signal(signal.SIGSTOP)
            try:
                assert b.recover_lease("/w") is False
                with pytest.raises(errors.LeaseExpired) as info:
                    a._call(a._async.rpc.call, "update_block_for_pipeline",
                            {"block": block, "client_name": a.client_name})
            finally:
                for proc in storage:
                    proc.send_signal(signal.SIGCONT)
            message = str(info.value)
            assert message.startswith("No lease on /w") and b.client_name in message, message
            out.abort()
            deadline = time.monotonic() + 30
            while not b.recover_lease("/w"):
                assert time.monotonic() < deadline, b.list_open_files()
                time.sleep(0.1)
            assert b.read_file("/w") == expected_bytes(4000)


@pytest.mark.slow
# the file stays open across the metadata server's restart, and the 3 s hard limit of the
# other tests is shorter than a restart plus the first renewal can take on a loaded machine
@pytest.mark.parametrize("cluster", [{"lease_hard_limit": 60.0}], indirect=True)
def test_a_failed_lease_renewal_names_its_cause(cluster, caplog):
    """A renewal that gets no answer (the metadata server stopped) and one that no server of
    the list serves (killed, the other address dead) are logged with their cause: neither
    "failed ()" nor "within 0 s"."""
    from harness import free_port, poll_until

    caplog.set_level(logging.WARNING, logger="fs.renewer")
    config = make_test_config(lease_renew_period=0.3)

    def warned(text: str) -> str:
        def find():
            return next((r.getMessage() for r in caplog.records
                         if "lease renewal" in r.getMessage() and text in r.getMessage()), None)
        return poll_until(find, timeout=20.0)

    with Client(f"{cluster.meta_address},127.0.0.1:{free_port()}", config=config) as client:
        out = client.create("/renewing", replication=1)
        out.write(b"x")
        pid = cluster.pid("meta")
        os.kill(pid, signal.SIGSTOP)
        try:
            message = warned("no answer within 0.3 s")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "()" not in message
        cluster.kill_meta(signal.SIGKILL)
        message = warned("asked once each")
        assert "within 0 s" not in message and "cannot reach" in message, message
        cluster.start_meta()
        out.close()
