"""Network faults across hosts (``hostkit``): a FUSE mount's host isolated during ``tar -xf``,
asymmetric cuts (one direction only) between the metadata server, a block server and a
client, and silent hosts met by TCP liveness (``fs.tcpliveness``: a pipeline's middle node and
a reader's replica cut off, against a stopped middle node that must be waited for). Each test
checks that no acknowledged (closed) byte is lost and prints the time until service resumed.

A one-way cut breaks TCP both ways: what the cut side sends vanishes, the other side's
segments arrive but their acknowledgements do not come back, and a new connection never
completes its handshake. So a block server whose metadata server cannot answer it is, to
that server, a block server that fell silent, and a client that cannot reach one block
server meets a connect that times out.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from fs.client import Client
from fs.config import Config
from harness import poll_until
from hostkit import REPO, host_cluster, require_hosts
from test_hosts import node_in, read_on, until

MiB = 1 << 20
MOUNT_BOUND = 6.0
# what a loaded two-core machine may add to a bound (process wake-ups, the kernel's round trip)
MARGIN = 6.0
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _fuse_reason() -> str | None:
    if importlib.util.find_spec("pyfuse3") is None:
        return "pyfuse3 is not installed"
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "/dev/fuse or fusermount3 is not available"
    return None


def _source_tree(root, n_small: int = 300) -> dict[str, bytes]:
    """Files for the tarball (name -> bytes): small ones with a few 1-4 MiB ones among them,
    so the cut may land inside a large one."""
    rng = random.Random(33)
    files = {}
    for i in range(n_small):
        files[f"t/d{i % 7}/small{i:03d}.txt"] = rng.randbytes(rng.randrange(1, 8192))
        if i % 60 == 30:
            files[f"t/big{i:03d}.bin"] = rng.randbytes(rng.randrange(1 * MiB, 4 * MiB))
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


class Tar:
    """``tar -xvf`` run in the background, each verbose line (printed as tar starts a
    member) and each error line kept with the time it arrived."""

    def __init__(self, archive, into):
        # line-buffered, so a line arrives as tar prints it (before it extracts the member)
        self.proc = subprocess.Popen(["stdbuf", "-oL", "-eL", "tar", "-xvf", str(archive)],
                                     cwd=into, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.errors: list[tuple[float, str]] = []
        self.threads = [threading.Thread(target=self._read, args=(s, k), daemon=True)
                        for s, k in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, stream, kind: str) -> None:
        for line in stream:
            with self.lock:
                if kind == "out":
                    self.started.append(line.strip())
                else:
                    self.errors.append((time.monotonic(), line.strip()))

    def progress(self) -> list[str]:
        with self.lock:
            return list(self.started)

    def first_error(self) -> tuple[float, str] | None:
        with self.lock:
            return self.errors[0] if self.errors else None

    def eio(self) -> bool:
        with self.lock:
            return any("Input/output error" in line for _, line in self.errors)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for t in self.threads:
            t.join(10)


def _serves(mp, n: int) -> bool:
    """Whether the mount lists, writes (a new file, closed) and reads back."""
    try:
        (mp / f"after-heal-{n}.txt").write_text(f"written after the heal {n}\n")
        os.listdir(mp)
        return (mp / f"after-heal-{n}.txt").read_text() == f"written after the heal {n}\n"
    except OSError:
        return False


def test_mount_isolated_during_tar_extract(tmp_path):
    """A FUSE mount on host c0 extracts a tarball; midway c0 is isolated (silently, both
    ways): tar meets EIO within mount_meta_timeout + margin, the mount process stays alive
    and serves again (list, write, read) after the heal; every member tar had finished
    before the cut reads back byte-identical through a mount on c1, and no file there is
    silently corrupt (each is the source or a prefix of it, and a partial one is the member
    being written at the cut or one tar reported)."""
    require_hosts()
    if reason := _fuse_reason():
        pytest.skip(reason)
    src = tmp_path / "src"
    files = _source_tree(src)
    archive = tmp_path / "tree.tar"
    with tarfile.open(archive, "w") as tar:     # in this order: large ones among small ones
        for name in files:
            tar.add(src / name, arcname=name)
    total = len(files)
    # cut as tar starts the large member in the middle: the cut lands in it or just after
    trigger = next(name for i, name in enumerate(files) if i >= total // 2 and "big" in name)

    with host_cluster(tmp_path / "c", n_storage=4, clients=2) as hc, \
            Client(hc.meta_address, config=hc.config()) as probe, \
            hc.mount("c0", "c0", "--set", f"mount_meta_timeout={MOUNT_BOUND:g}") as m0:
        tar = Tar(archive, m0.mp)
        try:
            assert poll_until(lambda: trigger in tar.progress(), 120), \
                f"tar stalled before the cut: {tar.progress()[-3:]} {tar.errors}"
            before = tar.progress()
            hc.hosts.isolate("c0")
            cut = time.monotonic()
            # an EIO that comes partway through a write(2) the kernel split may show as a
            # short count first ("Wrote only N of M bytes"): the next call says EIO
            assert poll_until(lambda: tar.eio() or tar.proc.poll() is not None,
                              2 * (MOUNT_BOUND + MARGIN) + 30)
            first = tar.first_error()
            assert first is not None, f"tar ended without an error: rc {tar.proc.returncode}"
            print(f"cut -> tar's first error: {first[0] - cut:.1f} s ({first[1]})")
            assert tar.eio(), f"no EIO: {tar.errors}"
            assert "Input/output error" in first[1] or "Wrote only" in first[1], first[1]
            assert first[0] - cut <= MOUNT_BOUND + MARGIN, f"error after {first[0] - cut:.1f} s"
        finally:
            tar.stop()   # it would go on member by member, each failing after the bound
        errors = "\n".join(line for _, line in tar.errors)
        assert m0.proc.poll() is None, "the mount died"

        hc.hosts.heal()
        healed = time.monotonic()
        count = iter(range(10**6))
        until(lambda: _serves(m0.mp, next(count)), 60, "mount serves again (since the heal)",
              healed)
        assert m0.proc.poll() is None

        # the file being written at the cut (tar killed: closed by the mount, or recovered)
        def all_closed():
            open_files = probe.list_open_files("/")
            for f in open_files:
                probe.recover_lease(f["path"])
            return not open_files
        until(all_closed, 60, "every file closed", healed)

        finished = {name for name in before[:-1] if not name.endswith("/")}
        assert finished and len(finished) >= total // 2 - 10
        in_flight = before[-1]
        with hc.mount("c1", "c1") as m1:
            for name in finished:
                assert (m1.mp / name).read_bytes() == files[name], name
            partial = []
            for name, data in files.items():
                path = m1.mp / name
                if name in finished or not path.exists():
                    continue
                got = path.read_bytes()
                if got != data:
                    assert data.startswith(got), f"{name}: not a prefix of the source"
                    assert name == in_flight or name in errors, \
                        f"{name}: partial ({len(got)} of {len(data)} bytes), not reported"
                    partial.append(f"{name} ({len(got)} of {len(data)} bytes)")
        print(f"{len(finished)} finished members identical on c1; partial: {partial or 'none'}")


def _replica_hosts(client, path: str) -> list[set[str]]:
    return [{loc["address"].rsplit(":", 1)[0] for loc in lb["locations"]}
            for lb in client.get_block_locations(path)["blocks"]]


def test_metadata_server_cannot_reach_a_block_server(tmp_path):
    """The metadata server's packets to block server s0 vanish, s0's still arrive: its
    heartbeats get no answer (nor TCP acknowledgement), so its connection fails after
    tcp_liveness_timeout and a reconnect gets no handshake: the metadata
    server hears at most the one heartbeat in flight and marks it dead after
    dead_node_interval; it is not kept alive for placement by half-arrived heartbeats. Writes at replication 3 from a
    client go on all along (client and s0 still reach each other); files written once s0
    is dead have no replica on it; after the heal s0 is live again and every file reads
    back byte-identical on another client host. (On the heal the stalled heartbeat gets
    through on the same connection; the metadata server asks s0 to register again.)"""
    require_hosts()
    block = 256 * 1024
    with host_cluster(tmp_path, n_storage=4, clients=2) as hc, \
            Client(hc.meta_address, config=hc.config()) as probe:
        s0 = hc.hosts.address("s0")
        s0_id = next(n["node_id"] for n in hc.report()["live_nodes"]
                     if n["address"].startswith(s0 + ":"))
        data = {}

        def put(name: str) -> float:
            data[name] = os.urandom(3 * block + 1000)
            (tmp_path / name).write_bytes(data[name])
            started = time.monotonic()
            done = hc.leasefs("c0", "put", "--replication", "3", "--block-size", "256K",
                              tmp_path / name, f"/{name}")
            assert done.returncode == 0, done.stderr
            return time.monotonic() - started

        put("before")
        hc.hosts.cut("meta", "s0")
        cut = time.monotonic()
        took = put("during")           # placed while s0 may still look live
        print(f"put at replication 3 right after the cut: {took:.1f} s")
        dead_after = hc.cluster.settings["dead_node_interval"]
        until(lambda: node_in(hc, "dead_nodes", s0_id), dead_after + MARGIN + 10,
              "s0 marked dead", cut)
        took = put("dead")
        print(f"put at replication 3 with s0 dead: {took:.1f} s")
        assert all(s0 not in hosts and len(hosts) == 3
                   for hosts in _replica_hosts(probe, "/dead")), _replica_hosts(probe, "/dead")
        until(lambda: all(len(h) == 3 and s0 not in h
                          for name in data for h in _replica_hosts(probe, f"/{name}")),
              60, "3 live replicas of every block, none on s0", cut)

        hc.hosts.heal()
        healed = time.monotonic()
        until(lambda: node_in(hc, "live_nodes", s0_id), 30, "s0 live again (since the heal)",
              healed)
        took = put("healed")
        print(f"put after the heal: {took:.1f} s")
        for name, expect in data.items():
            assert read_on(hc, "c1", f"/{name}", tmp_path) == expect, name


def test_client_cannot_reach_one_block_server(tmp_path):
    """Client host c0's packets to block server s1 vanish (the metadata server, the other
    block servers and the other client reach s1). A put at replication 3 from c0 succeeds:
    a pipeline s1 heads is given up after a connect that timed out, naming s1, and set up
    without it (a pipeline where s1 is not first works: c0 talks to the first node only);
    every block has three replicas. A read on c0 of a file with a replica of every block on
    s1 succeeds byte-identical, leaving s1 for another replica: about one
    data_connect_timeout in all, as the client then avoids s1 for the following blocks.
    Both files have 48 blocks, so s1 heads some block's list but once in 10**6 runs."""
    require_hosts()
    block, n_blocks = 64 * 1024, 48
    connect = Config().data_connect_timeout     # the CLI's (the client's default)
    with host_cluster(tmp_path, n_storage=4, clients=2) as hc, \
            Client(hc.meta_address, config=hc.config()) as probe:
        s1 = hc.hosts.address("s1")
        everywhere = os.urandom(n_blocks * block)
        (tmp_path / "everywhere").write_bytes(everywhere)
        done = hc.leasefs("c1", "put", "--replication", "4", "--block-size", "64K",
                          tmp_path / "everywhere", "/everywhere")
        assert done.returncode == 0, done.stderr

        hc.hosts.cut("c0", "s1")
        data = os.urandom(n_blocks * block - 1000)
        (tmp_path / "in.bin").write_bytes(data)
        started = time.monotonic()
        done = hc.leasefs("c0", "--log-level", "info", "put", "--replication", "3",
                          "--block-size", "64K", tmp_path / "in.bin", "/f")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        print(f"put of {n_blocks} blocks at replication 3 from c0, s1 unreachable: {took:.1f} s")
        assert f"failed at {s1}:" in done.stderr and "cannot connect" in done.stderr, \
            f"the writer does not name s1:\n{done.stderr}"
        placed = _replica_hosts(probe, "/f")
        assert len(placed) == n_blocks and all(len(h) == 3 for h in placed), placed

        started = time.monotonic()
        local = tmp_path / "got-everywhere"
        got = hc.leasefs("c0", "--log-level", "info", "get", "/everywhere", local)
        took = time.monotonic() - started
        assert got.returncode == 0, got.stderr
        print(f"read on c0 of {n_blocks} blocks, each with a replica on s1: {took:.1f} s")
        assert s1 in got.stderr, f"the reader never tried s1:\n{got.stderr}"
        assert local.read_bytes() == everywhere
        assert took <= connect + MARGIN, f"read took {took:.1f} s:\n{got.stderr}"
        assert read_on(hc, "c1", "/f", tmp_path) == data


def _pipeline_nodes(client, path: str) -> list[str]:
    """Addresses of the last block's pipeline, first node first."""
    return [n["address"] for n in client.get_block_locations(path)["blocks"][-1]["locations"]]


def _storage_host(hc, address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return next(name for name in hc.hosts.hosts if hc.hosts.address(name) == host)


def test_silent_pipeline_middle_node_fails_over(tmp_path):
    """The middle block server of a write pipeline is cut off silently (its host isolated:
    no reset, no refusal, its kernel acknowledges nothing). The first node's connection to
    it fails for want of TCP acknowledgements after tcp_liveness_timeout, not after
    data_timeout: it blames the middle node in its ack, the writer recovers the pipeline
    without it (the 4th block server replacing it) and the next hflush is acknowledged
    within the liveness timeout plus margin; every acknowledged byte reads back."""
    require_hosts()
    defaults = Config()
    liveness, data_timeout = defaults.tcp_liveness_timeout, defaults.data_timeout
    with host_cluster(tmp_path, n_storage=4, clients=0) as hc, \
            Client(hc.meta_address, config=hc.config()) as client:
        assert hc.cluster.config().data_timeout == data_timeout    # not shortened by the test
        out = client.create("/f", replication=3)
        written = bytearray()

        def step() -> None:
            data = os.urandom(64 * 1024)
            out.write(data)
            out.hflush()
            written.extend(data)

        step()
        step()          # past inline_max: the bytes are in a block's pipeline
        nodes = _pipeline_nodes(client, "/f")
        assert len(nodes) == 3, nodes
        middle = _storage_host(hc, nodes[1])
        hc.hosts.isolate(middle)
        cut = time.monotonic()
        step()
        took = time.monotonic() - cut
        print(f"hflush acknowledged {took:.1f} s after the middle node {middle} was cut off "
              f"(tcp_liveness_timeout {liveness:g} s, data_timeout {data_timeout:g} s)")
        for _ in range(3):
            step()
        out.close()
        assert nodes[1] not in _pipeline_nodes(client, "/f")
        assert client.open("/f").read() == bytes(written)
        first_log = hc.cluster.log_tail(f"storage{_storage_host(hc, nodes[0])[1:]}", 400)
        assert f"peer unreachable (no TCP acknowledgement for {liveness:g} s)" in first_log, \
            first_log
        assert took <= liveness + 2 * MARGIN < data_timeout, \
            f"the writer waited {took:.1f} s for a pipeline without the silent node"


def _window_closed(hc, host: str, peer: str) -> bool:
    """Whether ``host``'s connection to ``peer`` (host:port) has bytes it may not send for
    want of receive window, none in flight: the peer's kernel is answering, its process
    not reading (``ss``: notsent without unacked)."""
    done = hc.hosts.run(host, ["ss", "-tinH", "dst", peer], capture_output=True, text=True)
    text = " ".join(done.stdout.split())
    return "notsent:" in text and "unacked:" not in text


def test_stopped_pipeline_node_is_waited_for(tmp_path):
    """The middle block server's process is stopped (SIGSTOP: its kernel still acknowledges
    and answers window probes) while a large write streams through it, until the first
    node's connection to it has a closed receive window with data waiting; it stays stopped
    three tcp_liveness_timeouts longer (less than data_timeout), then goes on. A slow
    process is not a dead host: the pipeline keeps all three nodes (no recovery), the write
    completes and reads back."""
    require_hosts()
    liveness = Config().tcp_liveness_timeout
    with host_cluster(tmp_path, n_storage=3, clients=0) as hc, \
            Client(hc.meta_address, config=hc.config(write_window_packets=64)) as client:
        out = client.create("/g", replication=3)
        head = os.urandom(128 * 1024)
        out.write(head)
        out.hflush()
        nodes = _pipeline_nodes(client, "/g")
        first, middle = _storage_host(hc, nodes[0]), _storage_host(hc, nodes[1])
        pid = hc.cluster.pid(f"storage{middle[1:]}")
        body = os.urandom(48 * MiB)
        failure = []

        def write() -> None:
            try:
                out.write(body)
                out.hflush()
            except Exception as exc:   # reported by the test thread
                failure.append(exc)

        os.kill(pid, signal.SIGSTOP)
        writer = threading.Thread(target=write, daemon=True)
        try:
            writer.start()
            assert poll_until(lambda: _window_closed(hc, first, nodes[1]), 60), \
                f"{first}'s connection to the stopped {middle} never had its window closed"
            closed = time.monotonic()
            writer.join(3 * liveness)
            assert writer.is_alive() and not failure, failure
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"{middle} stopped for {time.monotonic() - closed:.1f} s with its window closed")
        writer.join(120)
        assert not writer.is_alive() and not failure, failure
        out.close()
        assert client._async.pipeline_recoveries == 0
        assert set(_pipeline_nodes(client, "/g")) == set(nodes)
        assert client.open("/g").read() == head + body


def _read_past_a_cut(hc, script: str, path: str, **env) -> tuple[float, str]:
    """Run ``script`` on host c0 (``env``: settings on top of the client environment): it
    prints the replica that matters, waits for a line, reads ``path`` and prints the
    seconds its read took and the bytes' sha256. That replica's host is isolated before
    the line is sent."""
    reader = hc.hosts.popen("c0", [sys.executable, "-c", script, path],
                            env={**hc.env("c0"), **env}, cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        replica = reader.stdout.readline().strip()
        assert replica, "the reader printed no replica"
        hc.hosts.isolate(_storage_host(hc, replica))
        reader.stdin.write("go\n")
        reader.stdin.flush()
        took, digest = reader.stdout.readline().split()
        assert reader.wait(60) == 0
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    return float(took), digest


_SLOW_READER = r"""
import hashlib, sys, time
from fs.client import Client
with Client() as client:
    f = client.open(sys.argv[1])
    head = f.read(1 << 20)
    print(f._stream._seq.reader.node["address"], flush=True)   # the replica it streams from
    sys.stdin.readline()
    began = time.monotonic()
    rest = f.read()
    print(time.monotonic() - began, hashlib.sha256(head + rest).hexdigest(), flush=True)
"""


_FIRST_REPLICA_READER = r"""
import hashlib, sys, time
from fs.client import Client
with Client() as client:
    f = client.open(sys.argv[1])
    print(f._stream.blocks[0].locations[0]["address"], flush=True)   # the replica it tries first
    sys.stdin.readline()
    began = time.monotonic()
    data = f.read()
    print(time.monotonic() - began, hashlib.sha256(data).hexdigest(), flush=True)
"""


def test_reader_does_not_wait_out_the_connect_timeout_on_a_host_that_is_cut_off(tmp_path):
    """The host of the replica a reader tries first is cut off before the reader connects.
    A TCP connect is answered by the peer's kernel however busy its process is, so the
    unanswered handshake costs tcp_liveness_timeout, not data_connect_timeout (set long
    here, 10 s, so that the two cannot be confused), and the read goes on from the next
    replica: the whole file, byte-identical."""
    require_hosts()
    liveness = Config().tcp_liveness_timeout
    connect_timeout = 10.0
    data = os.urandom(8 * MiB)
    with host_cluster(tmp_path, n_storage=3, clients=1) as hc, \
            Client(hc.meta_address, config=hc.config()) as client:
        with client.create("/f", replication=3) as out:
            out.write(data)
        took, digest = _read_past_a_cut(hc, _FIRST_REPLICA_READER, "/f",
                                        LEASEFS_DATA_CONNECT_TIMEOUT=str(connect_timeout))
        print(f"read with its first replica's host cut off: {took:.1f} s "
              f"(tcp_liveness_timeout {liveness:g} s, data_connect_timeout {connect_timeout:g} s)")
        assert digest == hashlib.sha256(data).hexdigest()
        assert took < liveness + 4 < connect_timeout, \
            f"the reader waited {took:.1f} s to connect to the cut-off replica"


def test_reader_leaves_a_replica_whose_host_goes_silent(tmp_path):
    """A reader on host c0 streams a one-block file from a replica; that replica's host is
    isolated mid-read (silently). The reader's connection fails for want of TCP
    acknowledgements after tcp_liveness_timeout, not data_timeout, and the read goes on
    from another replica at the same offset: the whole file, byte-identical."""
    require_hosts()
    defaults = Config()
    liveness, data_timeout = defaults.tcp_liveness_timeout, defaults.data_timeout
    data = os.urandom(32 * MiB)
    with host_cluster(tmp_path, n_storage=3, clients=1) as hc, \
            Client(hc.meta_address, config=hc.config()) as client:
        with client.create("/r", replication=3, block_size=64 * MiB) as out:
            out.write(data)
        took, digest = _read_past_a_cut(hc, _SLOW_READER, "/r")
        print(f"rest of the read after its replica's host was cut off: {took:.1f} s "
              f"(tcp_liveness_timeout {liveness:g} s, data_timeout {data_timeout:g} s)")
        assert digest == hashlib.sha256(data).hexdigest()
        assert took <= liveness + 2 * MARGIN < data_timeout, \
            f"the reader waited {took:.1f} s on the silent replica"
