"""leasefs across hosts: network namespaces on a private bridge (``tools.testbed.hosts``), servers
and clients each on its own host (``hostkit``), faults by routes into nothing and links
taken down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial

import pytest

from fs.client import Client
from harness import poll_until
from hostkit import default_tag, host_cluster, require_hosts, storage_host
from tools.testbed.hosts import HostSet

_LISTEN = """
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


def _connects(hosts: HostSet, src: str, dst: str, port: int) -> str:
    """``ok``, or the error of a TCP connect from host ``src`` to ``dst``."""
    done = hosts.run(src, [sys.executable, "-c", "import socket, sys; socket.create_connection("
                           "(sys.argv[1], int(sys.argv[2])), timeout=1)",
                           hosts.address(dst), str(port)], capture_output=True, text=True)
    return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_host_faults_cut_one_direction_and_heal(tmp_path, request):
    """Each fault stops exactly the traffic it names, silently (a timeout, as across a real
    partition), and heal restores all of it; a stale set of the same tag is removed."""
    require_hosts()
    tag = default_tag()
    port = 9999
    stale = HostSet(tag, ["x"]).__enter__()   # as a killed run leaves it
    leftover = stale.popen("x", ["sh", "-c", "echo in; exec sleep 600"],
                           stdout=subprocess.PIPE, text=True)
    request.addfinalizer(partial(_stop, leftover))
    # inside its namespace, as a killed run's processes are, before the new set is entered:
    # nsenter joins it a moment after it starts, and one joining after the new set has
    # looked for the namespace's processes (``ip netns pids``) lives on in it
    assert leftover.stdout.readline().strip() == "in"
    with HostSet(tag, ["a", "b", "c"]) as hosts:
        assert leftover.wait(10) is not None      # the killed run's process is gone
        for name in "abc":
            proc = hosts.popen(name, [sys.executable, "-c", _LISTEN, str(port)],
                               stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "listening"
        assert _connects(hosts, "a", "b", port) == "ok"
        hosts.cut("a", "b")
        assert "timed out" in _connects(hosts, "a", "b", port)
        assert _connects(hosts, "a", "c", port) == "ok"
        assert _connects(hosts, "c", "b", port) == "ok"
        hosts.link_down("c")
        assert "timed out" in _connects(hosts, "b", "c", port)
        hosts.heal()
        assert _connects(hosts, "a", "b", port) == "ok"
        assert _connects(hosts, "b", "c", port) == "ok"
        netns = hosts["a"].netns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netns not in listed and stale["x"].netns not in listed


def _ready(started: float, what: str) -> None:
    print(f"{what}: {time.monotonic() - started:.1f} s")


def until(check, timeout: float, what: str, since: float) -> None:
    """Until ``check()`` holds (failing after ``timeout`` s); prints the time ``what`` took
    since ``since``."""
    assert poll_until(check, timeout), f"not {what} after {timeout} s"
    _ready(since, f"{what} after")


def read_on(hc, host: str, path: str, tmp_path) -> bytes:
    """``path``'s bytes as ``leasefs get`` on ``host`` reads them."""
    local = tmp_path / f"got-{host}-{path.strip('/').replace('/', '-')}"
    got = hc.leasefs(host, "get", path, local)
    assert got.returncode == 0, got.stderr
    return local.read_bytes()


@pytest.mark.slow
def test_cluster_across_hosts_serves_every_host(tmp_path):
    """One metadata server, four block servers (one bound to 0.0.0.0) and two clients, each
    on its own host: a put at replication 3 from one client host reads back byte-identical
    on the other, and the report lists four live block servers, each at its own host's
    address (the one bound to every address advertises its route's source address); a
    FUSE mount on a client host reads the file and writes one the other host reads."""
    require_hosts()
    started = time.monotonic()
    with host_cluster(tmp_path, n_storage=4, clients=2,
                      binds={"storage3": "0.0.0.0"}) as hc:
        _ready(started, "four block servers live on their hosts after")
        data = os.urandom(700_000)
        (tmp_path / "in.bin").write_bytes(data)
        put = hc.leasefs("c0", "put", "--replication", "3", "--block-size", "256K",
                         tmp_path / "in.bin", "/f")
        assert put.returncode == 0, put.stderr
        assert read_on(hc, "c1", "/f", tmp_path) == data

        report = hc.leasefs("c1", "dfsadmin", "-report")
        assert report.returncode == 0, report.stderr
        assert "Live block servers (4):" in report.stdout, report.stdout
        for i in range(4):
            address = f"{hc.hosts.address(storage_host(i))}:{hc.cluster.ports[f'storage{i}']}"
            assert address in report.stdout, report.stdout
        with Client(hc.meta_address, config=hc.config()) as client:
            blocks = client.get_block_locations("/f")["blocks"]
        storage_hosts = {hc.hosts.address(storage_host(i)) for i in range(4)}
        assert len(blocks) == 3
        for lb in blocks:
            hosts = [loc["address"].rsplit(":", 1)[0] for loc in lb["locations"]]
            assert len(set(hosts)) == 3 and set(hosts) <= storage_hosts, lb

        with hc.mount("c1", "c1") as mount:      # a FUSE mount on a client host
            assert (mount.mp / "f").read_bytes() == data
            (mount.mp / "g").write_text("written through the mount on c1\n" * 100)
        got = hc.leasefs("c0", "cat", "/g")
        assert got.returncode == 0, got.stderr
        assert got.stdout == "written through the mount on c1\n" * 100


@pytest.mark.slow
@pytest.mark.allow_log_errors(r"block server failed: .*loopback",
                              reason="the block server advertising loopback is refused")
def test_loopback_address_from_another_host_is_refused(tmp_path):
    """A block server on another host that advertises 127.0.0.1 is refused at registration
    with an error naming the cause and the fix, and stops (exit 1) instead of looking
    alive; the metadata server never lists it."""
    require_hosts()
    with host_cluster(tmp_path, n_storage=1, clients=0, storage=False,
                      settings={"advertise_host": "127.0.0.1"}) as hc:
        try:
            hc.cluster.start_storage(0)
        except RuntimeError:
            pass   # it may stop before the harness has read its address
        proc = hc.cluster.procs["storage0"]
        assert proc.wait(30) == 1, hc.cluster.log_tail("storage0")
        log = hc.cluster.log_tail("storage0")
        assert "advertises 127.0.0.1:" in log and "a loopback address" in log, log
        assert "--host" in log and "advertise_host" in log, log
        assert hc.report()["live_nodes"] == []


# A writer on a client host, driven line by line on stdin: "write N" writes and hflushes N
# more bytes (pattern: byte i is i % 251) and answers "acked TOTAL"; "close" closes and
# answers "closed". Any error is answered "error TYPE: MESSAGE" and the writer exits.
WRITER = r"""
import logging, sys
from fs.client import Client
from fs.config import Config
path, block_size = sys.argv[1], int(sys.argv[2])
total = 0
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
try:
    client = Client(config=Config.load(min_block_size=4096))
    out = client.create(path, replication=3, block_size=block_size)
    print("open", flush=True)
    for line in sys.stdin:
        verb, *arg = line.split()
        if verb == "write":
            n = int(arg[0])
            out.write(bytes((total + i) % 251 for i in range(n)))
            out.flush()                    # hflush: acknowledged by the whole pipeline
            total += n
            print("acked", total, flush=True)
        elif verb == "close":
            out.close()
            print("closed", flush=True)
            break
except Exception as exc:
    print(f"error {type(exc).__name__}: {exc}", flush=True)
"""


def pattern(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


class Writer:
    """``WRITER`` on a host of ``hc``."""

    def __init__(self, hc, host: str, path: str, block_size: int):
        # its log among the servers' (watched: an ERROR there fails the test)
        with open(hc.cluster.base / "logs" / f"writer-{host}.log", "ab") as log:
            self.proc = hc.popen(host, [sys.executable, "-c", WRITER, path, str(block_size)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=log, text=True)
        assert self.answer() == "open"

    def answer(self) -> str:
        line = self.proc.stdout.readline().strip()
        assert line, f"writer exited with {self.proc.wait(10)}"
        return line

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def write(self, n: int) -> int:
        answer = self.ask(f"write {n}")
        assert answer.startswith("acked "), answer
        return int(answer.split()[1])


def node_in(hc, kind: str, node_id: str) -> bool:
    """Whether the report lists block server ``node_id`` among ``kind`` (live/dead_nodes)."""
    return any(n["node_id"] == node_id for n in hc.report()[kind])


def live_replicas(client, path: str) -> list[int]:
    """The number of live replicas of each block of ``path``."""
    return [len(lb["locations"]) for lb in client.get_block_locations(path)["blocks"]]


@pytest.mark.slow
def test_block_server_cut_from_metadata_server_mid_write(tmp_path):
    """A block server of the write's pipeline is cut from the metadata server (both ways,
    silently) while the write goes on: the write completes with every acknowledged byte, the
    metadata server marks the node dead and copies its blocks elsewhere (replication 3 on
    the three others), and after the heal the node is live again and the file still holds
    exactly the written bytes, read on another client host."""
    require_hosts()
    block = 256 * 1024
    with host_cluster(tmp_path, n_storage=4, clients=2) as hc, \
            Client(hc.meta_address, config=hc.config()) as probe:
        writer = Writer(hc, "c0", "/f", block)
        acked = writer.write(100_000)
        pipeline = probe.get_block_locations("/f")["blocks"][-1]["locations"]
        victim = next(i for i in range(4)
                      if any(loc["address"].startswith(hc.hosts.address(storage_host(i)) + ":")
                             for loc in pipeline))
        victim_id = next(n["node_id"] for n in hc.report()["live_nodes"]
                         if n["address"].startswith(hc.hosts.address(storage_host(victim)) + ":"))
        hc.hosts.cut_both(storage_host(victim), "meta")
        cut = time.monotonic()
        for _ in range(6):                  # on into new blocks while the node is cut off
            acked = writer.write(100_000)
        assert writer.ask("close") == "closed"
        _ready(cut, "write closed after the cut")
        assert probe.get_file_status("/f").length == acked

        until(lambda: node_in(hc, "dead_nodes", victim_id), 30, "cut block server marked dead",
              cut)
        until(lambda: set(live_replicas(probe, "/f")) == {3}, 60,
              "replication 3 restored", cut)

        hc.hosts.heal()
        healed = time.monotonic()
        until(lambda: node_in(hc, "live_nodes", victim_id), 30,
              "block server live again (since the heal)", healed)
        # its replicas of the blocks written while it was cut off are excess now: deleted
        until(lambda: set(live_replicas(probe, "/f")) == {3}, 30,
              "excess replicas deleted (since the heal)", healed)
        assert read_on(hc, "c1", "/f", tmp_path) == pattern(acked)


LEASES = {"lease_soft_limit": 1.0, "lease_hard_limit": 3.0, "lease_monitor_period": 0.2,
          "block_recovery_retry": 3.0}


@pytest.mark.slow
@pytest.mark.allow_log_errors(
    r"fs\.renewer: lease of .* lost: aborted",
    reason="the cut lasts about the client's hard limit (3 s from its last renewal): whether "
           "its renewer gives up before the heal, or its next call hears LeaseExpired from "
           "the server, depends on the timing; both end in LeaseExpired")
def test_writer_cut_off_past_its_lease_limits(tmp_path):
    """A writer's host is cut from every other host (silently, both ways) with its file
    open, past the lease's hard limit: the metadata server recovers the lease and closes the
    file with exactly the bytes hflushed before the cut; after the heal the old writer's
    next call fails with LeaseExpired and nothing it sends changes the file."""
    require_hosts()
    with host_cluster(tmp_path, n_storage=4, clients=2, settings=LEASES) as hc, \
            Client(hc.meta_address, config=hc.config()) as probe:
        writer = Writer(hc, "c0", "/g", 256 * 1024)
        acked = writer.write(150_000)
        acked = writer.write(150_000)
        hc.hosts.isolate("c0")
        cut = time.monotonic()
        until(lambda: not probe.get_file_status("/g").under_construction, 60,
              "lease recovered and file closed", cut)
        assert probe.get_file_status("/g").length == acked

        hc.hosts.heal()
        answer = writer.ask("write 1000")
        assert answer.startswith("error LeaseExpired: "), answer
        print(f"old writer's next call after the heal: {answer[:200]}")
        assert writer.proc.wait(30) == 0
        assert probe.get_file_status("/g").length == acked
        assert read_on(hc, "c1", "/g", tmp_path) == pattern(acked)
