"""Readers under network faults, on real processes: a replica holder the reader cannot
connect to is given up after ``data_connect_timeout`` and remembered as bad, so later blocks
do not wait on it again; a holder that goes silent in the middle of a read is given up after
``data_timeout`` and the read goes on from the next replica at the same offset. Every switch
is logged with the replica's address, the block and a non-empty cause.

"Cannot connect" on loopback: the killed block server's port is taken by a listening socket
whose accept queue is full and never drained, where Linux drops further SYNs, so a connect
hangs as it does towards a host that is cut off. "Silent": SIGSTOP of the block server.
"""

from __future__ import annotations

import logging
import os
import random
import re
import select
import signal
import socket
import time

import pytest

from fs.client import Client
from harness import ProcessCluster, make_test_config

KiB = 1 << 10
MiB = 1 << 20
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 4.0
BLOCK = 256 * KiB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def cluster_settings(**extra) -> dict:
    # a stopped server stays listed (and first where the stream's locations put it)
    return dict(dead_node_interval=600.0, data_connect_timeout=CONNECT_TIMEOUT,
                data_timeout=READ_TIMEOUT, **extra)


def client_for(cluster: ProcessCluster) -> Client:
    return Client(cluster.meta_address, config=make_test_config(
        data_connect_timeout=CONNECT_TIMEOUT, data_timeout=READ_TIMEOUT))


class SynDropper:
    """A listening socket on ``address`` with a full accept queue that is never drained:
    Linux drops the SYNs of further connects, which hang until the caller gives up."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(self.target)
        self.listener.listen(0)
        # the first connect fills the queue of length 0; any more that complete are kept too
        self.queued = [socket.create_connection(self.target, timeout=10)]
        while not self._hangs():
            pass

    def _hangs(self) -> bool:
        """Connect once more: True (and nothing kept) if the connect hangs."""
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(self.target)
        _, writable, _ = select.select([], [sock], [], 1.0)
        if writable:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            self.queued.append(sock)
            assert len(self.queued) < 16, "the accept queue does not fill up"
            return False
        sock.close()
        return True

    def close(self) -> None:
        for sock in self.queued:
            sock.close()
        self.listener.close()


def storage_name(cluster: ProcessCluster, address: str) -> str:
    port = int(address.rsplit(":", 1)[1])
    for name, p in cluster.ports.items():
        if name.startswith("storage") and p == port:
            return name
    raise AssertionError(f"no block server at {address}")


def switches(caplog, address: str) -> list[str]:
    """The logged moves away from the replica at ``address``."""
    return [r.getMessage() for r in caplog.records
            if r.name == "fs.reader" and address in r.getMessage()
            and "trying another replica" in r.getMessage()]


def test_unreachable_first_replica_is_given_up_once(tmp_path, caplog):
    """Six blocks, replication 3; the holder listed first for the most blocks (two at least)
    cannot be connected to: the sequential read and a second client's preads come back
    byte-identical, each client waiting for it once (one logged switch naming the replica,
    the block and the timeout), not once per block."""
    data = payload(6 * BLOCK)
    with ProcessCluster(tmp_path, n_storage=3, settings=cluster_settings()) as cluster:
        with client_for(cluster) as writer:
            with writer.create("/f", replication=3, block_size=BLOCK) as out:
                out.write(data)
        reading, preading = client_for(cluster), client_for(cluster)
        try:
            stream = reading.open("/f")
            firsts = [b.locations[0]["address"] for b in stream.blocks]
            cut = max(set(firsts), key=firsts.count)
            assert firsts.count(cut) >= 2
            # each open orders replicas anew: the pread stream too lists it first twice
            for _ in range(100):
                pstream = preading.open("/f")
                if [b.locations[0]["address"] for b in pstream.blocks].count(cut) >= 2:
                    break
                pstream.close()
            else:
                raise AssertionError(f"no open listed {cut} first for two blocks")
            cluster.kill(storage_name(cluster, cut))
            dropper = SynDropper(cut)
            try:
                caplog.set_level(logging.INFO, logger="fs.reader")
                t0 = time.monotonic()
                got = stream.read()
                elapsed = time.monotonic() - t0
                print(f"sequential read of {len(data)} bytes, {firsts.count(cut)} blocks listing "
                      f"the unreachable replica first: {elapsed:.2f} s "
                      f"(connect timeout {CONNECT_TIMEOUT:g} s)")
                assert got == data
                moves = switches(caplog, cut)
                assert len(moves) == 1, moves
                assert re.search(rf"block \d+ .*{re.escape(cut)}.*timed out after "
                                 rf"{CONNECT_TIMEOUT:g} s", moves[0]), moves[0]
                assert elapsed < 2 * CONNECT_TIMEOUT

                caplog.clear()
                t0 = time.monotonic()
                got = b"".join(pstream.pread(off, 100 * KiB)
                               for off in range(0, len(data), 100 * KiB))
                elapsed = time.monotonic() - t0
                print(f"preads of 100 KiB over the same file (another client): {elapsed:.2f} s")
                assert got == data
                assert len(switches(caplog, cut)) == 1, switches(caplog, cut)
            finally:
                dropper.close()
        finally:
            reading.close()
            preading.close()


def test_replica_silent_mid_read_is_left_at_the_same_offset(tmp_path, caplog):
    """The block server serving a read is stopped (SIGSTOP) after the first bytes: the read
    goes on from another replica after the read timeout, byte-identical, and the switch is
    logged with the replica, the block and "timed out after N s"."""
    # well past what the kernel's socket buffers take in before the stop (~3 MiB seen)
    size = 24 * MiB
    data = payload(size, seed=1)
    with ProcessCluster(tmp_path, n_storage=3, settings=cluster_settings()) as cluster:
        with client_for(cluster) as c:
            with c.create("/g", replication=3, block_size=size) as out:
                out.write(data)
            stream = c.open("/g")
            serving = stream.blocks[0].locations[0]["address"]
            head = stream.read(64 * KiB)
            name = storage_name(cluster, serving)
            os.kill(cluster.pid(name), signal.SIGSTOP)
            try:
                caplog.set_level(logging.INFO, logger="fs.reader")
                t0 = time.monotonic()
                rest = stream.read()
                elapsed = time.monotonic() - t0
            finally:
                os.kill(cluster.pid(name), signal.SIGCONT)
            print(f"read of the remaining {len(rest)} bytes after SIGSTOP of the serving "
                  f"replica: {elapsed:.2f} s (read timeout {READ_TIMEOUT:g} s)")
            assert head + rest == data
            moves = switches(caplog, serving)
            assert len(moves) == 1, moves
            assert re.search(rf"block \d+ .*{re.escape(serving)}.*timed out after "
                             rf"{READ_TIMEOUT:g} s", moves[0]), moves[0]


def test_figure_read_with_an_unreachable_holder(tmp_path):
    """The issue's figure: a file read whole with the default timeouts, once with every
    holder reachable and once (same cluster, same run) with the holder listed first for the
    most blocks cut off. Size: ``LEASEFS_FAULT_READ_MIB`` (default 24; the issue read 200)
    in blocks of a quarter of it at most 128 MiB. Prints the figures; asserts only the
    bytes."""
    size = int(os.environ.get("LEASEFS_FAULT_READ_MIB", "24")) * MiB
    block = min(128 * MiB, max(MiB, size // 4 // MiB * MiB))
    data = payload(size, seed=2)
    with ProcessCluster(tmp_path, n_storage=3, settings={"dead_node_interval": 600.0}) as cluster:
        with cluster.client() as c:
            with c.create("/big", replication=3, block_size=block) as out:
                for i in range(0, size, 8 * MiB):
                    out.write(data[i:i + 8 * MiB])
        with cluster.client() as c:
            t0 = time.monotonic()
            with c.open("/big") as stream:
                assert stream.read() == data
            healthy = time.monotonic() - t0
        with cluster.client() as c:
            stream = c.open("/big")
            firsts = [b.locations[0]["address"] for b in stream.blocks]
            cut = max(set(firsts), key=firsts.count)
            cluster.kill(storage_name(cluster, cut))
            dropper = SynDropper(cut)
            try:
                t0 = time.monotonic()
                got = stream.read()
                faulty = time.monotonic() - t0
            finally:
                dropper.close()
                stream.close()
        print(f"\nread of {size // MiB} MiB in {len(firsts)} blocks of {block // MiB} MiB: "
              f"{healthy:.2f} s with every holder reachable, {faulty:.2f} s with the holder "
              f"listed first for {firsts.count(cut)} of them unreachable")
        assert got == data


def test_writer_names_an_unreachable_pipeline_node_and_the_cause(tmp_path, caplog):
    """Pipeline setup meets a block server that cannot be connected to, whether the client
    connects to it (first node) or a block server does (downstream): the writer's log line
    names it and says "timed out after N s" (the same data_connect_timeout), and the file
    is written whole without it."""
    data = payload(2 * MiB, seed=3)
    # heartbeats slow enough that the cut server is not stale (placed last) while we write
    settings = cluster_settings(heartbeat_interval=3.0)
    with ProcessCluster(tmp_path, n_storage=4, settings=settings) as cluster:
        cut = f"127.0.0.1:{cluster.ports['storage3']}"
        cluster.kill("storage3")
        dropper = SynDropper(cut)
        try:
            caplog.set_level(logging.INFO, logger="fs.writer")
            with client_for(cluster) as c:
                for i in range(20):     # the node is in three of four pipelines
                    with c.create(f"/w{i}", replication=3) as out:
                        out.write(data)
                    lines = [r.getMessage() for r in caplog.records
                             if r.name == "fs.writer" and cut in r.getMessage()]
                    if lines:
                        break
                assert lines, f"no pipeline used {cut}"
                assert re.search(rf"{re.escape(cut)}.*timed out after {CONNECT_TIMEOUT:g} s",
                                 lines[0]), lines
                with c.open(f"/w{i}") as stream:
                    assert stream.read() == data
        finally:
            dropper.close()
