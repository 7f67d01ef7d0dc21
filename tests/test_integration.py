"""The core's acceptance tests (write, read, leases, failures), on real processes: a
metadata server and three block servers started through the real CLI (``python -m tools``),
real LevelDB, real replica files.

Each test states the behaviour it proves in its docstring.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from fs import errors
from harness import ProcessCluster

MiB = 1 << 20


@pytest.fixture
def cluster(tmp_path):
    c = ProcessCluster(tmp_path / "cluster", n_storage=3)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def replica_files(storage_dir, block_id: int) -> list:
    """Data files of a block's replicas under one block server's folder."""
    return [p for p in storage_dir.rglob(f"blk_{block_id}") if p.is_file()]


def all_block_files(storage_dir) -> list:
    return [p for p in storage_dir.rglob("blk_*") if p.is_file() and not p.name.endswith(".meta")]


def cli(cluster, *args, check=True, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "tools", *args], env=cluster.env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"leasefs {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def tree(client, path="/") -> dict:
    """The whole namespace under ``path`` as {path: (type, length)}."""
    out = {}
    for st in client.list_status(path):
        out[st.path] = (st.type, st.length if st.is_file else None)
        if st.is_dir:
            out.update(tree(client, st.path))
    return out


# --------------------------------------------------------------------------- 1


@pytest.mark.slow
def test_300mib_file_three_replicas_byte_identical(cluster, tmp_path):
    """A 300 MiB file written with replication 3 and 4 MiB blocks reads back byte-identical,
    every replica file on every block server equals its slice of the file, and ``ls -l``
    shows the size."""
    size = 300 * MiB
    local = tmp_path / "big.bin"
    rng = random.Random(7)
    digest = hashlib.sha256()
    with open(local, "wb") as fh:
        for _ in range(size // MiB):
            chunk = rng.randbytes(MiB)
            digest.update(chunk)
            fh.write(chunk)

    with cluster.client() as client:
        with client.create("/data/big.bin", replication=3, block_size=4 * MiB) as out, \
                open(local, "rb") as src:
            while chunk := src.read(8 * MiB):
                out.write(chunk)

        back = hashlib.sha256()
        with client.open("/data/big.bin") as stream:
            while chunk := stream.read(8 * MiB):
                back.update(chunk)
        assert back.hexdigest() == digest.hexdigest()

        located = client.get_block_locations("/data/big.bin")
        blocks = located["blocks"]
        assert len(blocks) == size // (4 * MiB)
        assert located["length"] == size

    with open(local, "rb") as src:
        for lb in blocks:
            src.seek(lb["offset"])
            expected = src.read(lb["block"]["num_bytes"])
            assert len(lb["locations"]) == 3
            copies = [f for i in range(3)
                      for f in replica_files(cluster.storage_dir(i), lb["block"]["id"])]
            assert len(copies) == 3, f"block {lb['block']['id']}: replicas {copies}"
            for path in copies:
                assert path.read_bytes() == expected, f"replica {path} differs"

    listing = cli(cluster, "ls", "-l", "/data").stdout
    line = next(ln for ln in listing.splitlines() if ln.rstrip().endswith("big.bin"))
    assert str(size) in line.split()


# --------------------------------------------------------------------------- 2


class Worker(threading.Thread):
    """Random mkdir/create/rename/delete in its own folder, remembering what was acknowledged.

    ``expected`` is the state implied by acknowledged operations; ``uncertain`` holds the
    paths touched by the one operation in flight when the server died (either outcome is
    allowed there)."""

    def __init__(self, client, index, stop):
        super().__init__(daemon=True)
        self.client = client
        self.root = f"/w{index}"
        self.rng = random.Random(index)
        self.stop_event = stop
        self.expected: dict[str, str] = {}
        self.uncertain: dict[str, tuple] = {}
        self.acked = 0
        self.failure = None
        self.counter = 0

    def fresh(self, parent):
        self.counter += 1
        return f"{parent}/n{self.counter}"

    def dirs(self):
        return [self.root] + [p for p, t in self.expected.items() if t == "dir"]

    def step(self):
        op = self.rng.choice(["mkdir", "create", "create", "rename", "delete"])
        files = [p for p, t in self.expected.items() if t == "file"]
        if op == "mkdir" or (op in ("rename", "delete") and not files):
            path = self.fresh(self.rng.choice(self.dirs()))
            self.uncertain = {path: (None, "dir")}
            self.client.mkdirs(path)
            self.expected[path] = "dir"
        elif op == "create":
            path = self.fresh(self.rng.choice(self.dirs()))
            self.uncertain = {path: (None, "file")}
            with self.client.create(path, replication=1) as out:
                out.write(path.encode())
            self.expected[path] = "file"
        elif op == "rename":
            src = self.rng.choice(files)
            dst = self.fresh(self.rng.choice(self.dirs()))
            self.uncertain = {src: ("file", None), dst: (None, "file")}
            self.client.rename(src, dst)
            del self.expected[src]
            self.expected[dst] = "file"
        else:
            path = self.rng.choice(files)
            self.uncertain = {path: ("file", None)}
            self.client.delete(path)
            del self.expected[path]
        self.uncertain = {}
        self.acked += 1

    def run(self):
        try:
            self.client.mkdirs(self.root)
            self.expected[self.root] = "dir"
            while not self.stop_event.is_set():
                self.step()
        except errors.LeaseFSError as exc:  # the server died under us: expected
            self.failure = exc


@pytest.mark.slow
def test_meta_kill9_under_concurrent_mutations_loses_nothing_acknowledged(tmp_path):
    """kill -9 of the metadata server while 8 clients mkdir/create/rename/delete: after the
    restart every acknowledged mutation is there and the namespace invariants hold."""
    from fs.client import Client
    from harness import make_test_config

    cluster = ProcessCluster(tmp_path / "cluster", n_storage=3,
                             settings={"rpc_retry_seconds": 1.0})
    cluster.start()
    try:
        config = make_test_config(rpc_retry_seconds=1.0, complete_retries=3)
        clients = [Client(cluster.meta_address, config=config) for _ in range(8)]
        stop = threading.Event()
        workers = [Worker(c, i, stop) for i, c in enumerate(clients)]
        for w in workers:
            w.start()
        # fixed-sleep: the workload runs for a while before the kill: chaos timing, not a wait
        time.sleep(4)
        cluster.kill_meta(signal.SIGKILL)
        stop.set()
        for w in workers:
            w.join(60)
            assert not w.is_alive()
        total = sum(w.acked for w in workers)
        assert total > 50, f"only {total} mutations acknowledged before the kill"
        for c in clients:
            c.close()

        cluster.start_meta()
        cluster.wait_ready()
        with cluster.client() as client:
            actual = {p: t for p, (t, _) in tree(client).items()}
        for w in workers:
            mine = {p: t for p, t in actual.items() if p == w.root or p.startswith(w.root + "/")}
            for path, kind in w.expected.items():
                if path in w.uncertain:
                    assert mine.get(path) in w.uncertain[path], path
                else:
                    assert mine.get(path) == kind, f"acknowledged {kind} {path} lost"
            extra = set(mine) - set(w.expected) - set(w.uncertain)
            assert not extra, f"paths nobody acknowledged: {sorted(extra)[:10]}"
    finally:
        cluster.stop()

    from meta.namespace.invariants import check_namespace
    from meta.journal.kv import PlyvelStore

    store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
    try:
        problems = check_namespace(store)
    finally:
        store.close()
    assert problems == []


# --------------------------------------------------------------------------- 3


@pytest.mark.slow
def test_block_server_kill9_restart_rescans_and_serves(cluster):
    """kill -9 of a block server: reads keep working from the other replicas; after restart
    it rescans its folder, reports its replicas, and alone can serve every file."""
    files = {f"/r/f{i}": os.urandom(300_000 + i * 70_001) for i in range(6)}
    with cluster.client() as client:
        for path, data in files.items():
            with client.create(path, replication=3, block_size=256 * 1024) as out:
                out.write(data)
        n_blocks = sum(len(client.get_block_locations(p)["blocks"]) for p in files)

        before = len(all_block_files(cluster.storage_dir(1)))
        assert before == n_blocks
        cluster.kill_storage(1)
        for path, data in files.items():
            assert client.read_file(path) == data

        cluster.start_storage(1)
        deadline = time.monotonic() + 30
        while True:
            report = client.report()
            node = [n for n in report["live_nodes"]
                    if n["address"].endswith(f":{cluster.ports['storage1']}")]
            if node and node[0]["blocks"] == n_blocks:
                break
            assert time.monotonic() < deadline, f"storage1 did not report: {report}"
            time.sleep(0.1)

        cluster.kill_storage(0)
        cluster.kill_storage(2)
        for path, data in files.items():
            assert client.read_file(path) == data


# --------------------------------------------------------------------------- 4


@pytest.mark.slow
def test_delete_directory_forgets_at_once_and_frees_replicas(cluster):
    """Deleting a 50-file directory removes it from the namespace before the call returns;
    the block files vanish from every block server within a few heartbeats."""
    with cluster.client() as client:
        for i in range(50):
            with client.create(f"/doomed/f{i:02d}", replication=3) as out:
                out.write(os.urandom(70_000 + i))   # past inline_max: in blocks
        ids = {lb["block"]["id"] for i in range(50)
               for lb in client.get_block_locations(f"/doomed/f{i:02d}")["blocks"]}
        assert len(ids) == 50
        on_disk = [f for i in range(3) for b in ids
                   for f in replica_files(cluster.storage_dir(i), b)]
        assert len(on_disk) == 150

        assert client.delete("/doomed", recursive=True)
        with pytest.raises(errors.FileNotFound):
            client.get_file_status("/doomed")
        with pytest.raises(errors.FileNotFound):
            client.get_file_status("/doomed/f00")
        assert all(st.name != "doomed" for st in client.list_status("/"))

    deadline = time.monotonic() + 10  # heartbeats every 0.1 s
    while any(p.exists() for p in on_disk):
        assert time.monotonic() < deadline, [str(p) for p in on_disk if p.exists()][:5]
        time.sleep(0.1)


# --------------------------------------------------------------------------- 5


def raw_connect(address):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def raw_connect_local(meta_address):
    """A connection to the metadata server's local socket (a local user: the kernel names
    it, so calls get past authentication to the checks of their input)."""
    port = int(meta_address.rsplit(":", 1)[1])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(f"\0leasefs-meta-{port}".encode())
    return sock


def recv_frame(sock):
    head = b""
    while len(head) < 4:
        part = sock.recv(4 - len(head))
        if not part:
            return None
        head += part
    (length,) = struct.unpack(">I", head)
    body = b""
    while len(body) < length:
        part = sock.recv(length - len(body))
        if not part:
            return None
        body += part
    return msgpack.unpackb(body, raw=False)


def frame(obj) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def hello():
    return frame({"hello": "leasefs", "version": 1, "client_id": "attacker"})


@pytest.mark.slow
def test_bad_input_gets_clear_errors_and_changes_nothing(cluster):
    """Oversized frames, random bytes, wrongly shaped bodies, unknown methods and malformed
    paths each get a clear error; the servers keep serving; the namespace is unchanged."""
    with cluster.client() as client:
        client.mkdirs("/keep/sub")
        client.write_file("/keep/a.txt", b"precious")
        before = tree(client)

        # a frame claiming 4 GiB: refused unread with FrameTooLarge, connection closed
        with raw_connect(cluster.meta_address) as s:
            s.sendall(hello() + b"\xff\xff\xff\xff" + b"x" * 100)
            reply = recv_frame(s)
            assert reply[1] is False and reply[2]["type"] == "FrameTooLarge"
            assert "exceeds the maximum" in reply[2]["message"]

        # random bytes (not even a hello)
        with raw_connect(cluster.meta_address) as s:
            s.sendall(b"\x00\x00\x00\x10" + os.urandom(16))
            reply = recv_frame(s)
            assert reply is None or reply[2]["type"] in ("ProtocolError",)

        # wrongly shaped requests on one connection: each answered, connection survives
        with raw_connect_local(cluster.meta_address) as s:
            s.sendall(hello())
            s.sendall(frame({"not": "a list"}))
            assert recv_frame(s)[2]["type"] == "ProtocolError"
            s.sendall(frame([1, "no_such_method", {}]))
            r = recv_frame(s)
            assert r[0] == 1 and r[2]["type"] == "UnknownMethod"
            s.sendall(frame([2, "mkdirs", ["not", "a", "map"]]))
            assert recv_frame(s)[2]["type"] == "InvalidArgument"
            s.sendall(frame([3, "mkdirs", {"path": 12345}]))
            assert recv_frame(s)[2]["type"] == "InvalidPath"
            s.sendall(frame([4, "mkdirs", {"bogus_argument": "/x"}]))
            assert recv_frame(s)[2]["type"] == "InvalidArgument"
            s.sendall(frame([5, "get_file_info", {"path": "/keep"}]))
            r = recv_frame(s)
            assert r[0] == 5 and r[1] is True and r[2]["type"] == "dir"

        bad_paths = ["/keep//x", "/keep/../etc", "/keep/./x", "/keep/a\0b", "relative/path",
                     "/" + "n" * 256, "/keep/" + "é" * 200, ""]
        for bad in bad_paths:
            for call in (lambda p: client.mkdirs(p),
                         lambda p: client.create(p).close(),
                         lambda p: client.rename("/keep/a.txt", p),
                         lambda p: client.delete(p, recursive=True)):
                with pytest.raises((errors.InvalidPath, errors.NameTooLong)) as info:
                    call(bad)
                assert info.value.errno in (22, 36)

        # garbage to a block server's data port
        data_address = f"127.0.0.1:{cluster.ports['storage0']}"
        with raw_connect(data_address) as s:
            s.sendall(b"\xff\xff\xff\xff")
            reply = recv_frame(s)
            assert reply is None or "status" in reply or reply[1] is False
        with raw_connect(data_address) as s:
            s.sendall(frame({"op": "NO_SUCH_OP"}))
            reply = recv_frame(s)
            assert reply["status"] == "ERROR" and "NO_SUCH_OP" in reply["message"]

        assert tree(client) == before
        assert client.read_file("/keep/a.txt") == b"precious"
        report = client.report()
        assert len(report["live_nodes"]) == 3
