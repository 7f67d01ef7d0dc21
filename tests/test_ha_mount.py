"""The FUSE mount and a Spark job ride through a metadata failover (ha = etcd, real
processes): an open writer keeps its lease and its file is whole, the mount answers
again within the failover time, an rm, rmdir and mv whose replies the failover lost
succeed, and a Spark write job started before a kill -9 of the active finishes with
every row."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import msgpack
import pytest
import trio

from fs.config import DEFAULT_LOCAL_SOCKET
from fs.errors import FileNotFound, sole_exception
from fs.rpc import RpcClient, local_socket_address, local_socket_name
from harness import Mount, free_port, poll_until
from hakit import HACluster, ha_status

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
                        # fixed-sleep: paces the writes, so that the kill falls between them
                        time.sleep(0.05)
                    os.fsync(fh.fileno())
            except BaseException as exc:   # reported below
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        # fixed-sleep: the writer writes through the active for a while before the kill
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


def test_spark_write_job_rides_through_a_kill9_of_the_active(ha):
    """A Spark job writing parquet through ``leasefs://<every metadata server>/...`` while
    the active is killed: the job finishes and every row is there once."""
    from sparkkit import run_spark, url

    spark_gen = run_spark("ha-failover")
    spark = next(spark_gen)
    try:
        target = url(ha, "/spark/out")

        def slow(batches):   # runs in a Python worker: the job lasts a few seconds
            for batch in batches:
                # fixed-sleep: a slow UDF: the job must last across the failover
                time.sleep(0.4)
                yield batch

        df = spark.range(0, 200_000, numPartitions=16).selectExpr(
            "id", "repeat('x', 40) as pad")
        df = df.mapInArrow(slow, df.schema)
        killed: list = []

        def killer() -> None:
            # Spark's job runs on the test's thread (its data sources are registered there)
            with ha.client() as client:
                deadline = time.monotonic() + 120
                while not client.exists("/spark/out/_temporary"):
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.05)
            active = ha.wait_active()
            ha.kill_meta(active)
            killed.append(time.monotonic())

        watcher = threading.Thread(target=killer)
        watcher.start()
        df.write.format("leasefs").mode("overwrite").save(target)
        finished = time.monotonic()
        watcher.join(60)
        assert killed, "the job never started writing"
        assert finished > killed[0] + 1.0, "the job ended before the failover"
        back = spark.read.format("leasefs").load(target)
        assert back.count() == 200_000
        assert back.selectExpr("sum(id)").first()[0] == sum(range(200_000))
    finally:
        try:
            next(spark_gen)
        except StopIteration:
            pass


class ReplyDropper:
    """A proxy on the local socket of a made-up port in front of one metadata server: a
    mount given ``127.0.0.1:<port>`` tries that socket first (the proxy holds the TCP port
    too, as a server does). It forwards every frame;
    once ``drop`` is set it swallows the server's replies to ``delete`` and ``rename``
    calls, as a failover that takes the active down after it carried them out loses them
    (other replies pass: the kernel looks a rename's destination up first). Once the
    server is gone it closes its clients' connections (and refuses new ones), so they
    move to the next server."""

    LOST = ("delete", "rename")

    def __init__(self, upstream: str):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.upstream = local_socket_address(local_socket_name(DEFAULT_LOCAL_SOCKET, upstream))
        self.drop = threading.Event()
        self.dropped: list[str] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(local_socket_address(
            local_socket_name(DEFAULT_LOCAL_SOCKET, self.address)))
        self.listener.listen(16)
        # clients trust a local socket only when its holder also holds the TCP port it is
        # named after (fs.localserver): this one does, and closes what comes by TCP
        self.tcp = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._close_tcp, daemon=True).start()

    def _close_tcp(self) -> None:
        while True:
            try:
                client, _ = self.tcp.accept()
            except OSError:   # closed
                return
            client.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:   # closed
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.upstream)
            except OSError:
                client.close()
                server.close()
                continue
            lost: dict = {}   # call id -> method, of this connection's calls to lose
            threading.Thread(target=self._pump, args=(client, server, lost, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, lost, True),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, lost: dict, replies: bool) -> None:
        """Whole frames (a 4-byte length, then msgpack) from ``src`` to ``dst``: requests
        ``[call_id, method, ...]``, replies ``[call_id, ok, ...]``."""
        buffer = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buffer += data
                while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4], "big"):
                    end = 4 + int.from_bytes(buffer[:4], "big")
                    frame, buffer = buffer[:end], buffer[end:]
                    body = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
                    if isinstance(body, list) and len(body) >= 2:
                        if not replies and self.drop.is_set() and body[1] in self.LOST:
                            lost[body[0]] = body[1]
                        if replies and body[0] in lost:
                            self.dropped.append(lost.pop(body[0]))
                            continue
                    dst.sendall(frame)
        except OSError:
            pass
        for sock in (src, dst):   # one side gone: both
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        self.tcp.close()


async def _rpc(address: str, method: str, **args):
    async with RpcClient(address, "ha-mount-test", retry_seconds=5, timeout=20) as rpc:
        return await rpc.call(method, args)


def rpc(address: str, method: str, **args):
    try:
        return trio.run(lambda: _rpc(address, method, **args))
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


def test_rm_rmdir_and_mv_whose_replies_a_failover_lost_succeed(tmp_path):
    """The mount's unlink, rmdir and rename over a file are carried out by the active,
    whose replies never reach the mount; the active is killed, and the mount's retries
    (same call ids) to the server that took over get the first answers: the status of
    what each removed, which the mount acts on. The user's rm, rmdir and mv succeed."""
    ha = HACluster(tmp_path, n_meta=2, n_storage=0)
    dropper = None
    mount = None
    try:
        ha.start()
        active, standby = ha.active_and_standby()
        direct = ha.address(active)
        for folder in ("/t/u", "/t/e/dir", "/t/o"):
            rpc(direct, "mkdirs", path=folder)
        for path in ("/t/u/file", "/t/o/x", "/t/o/y"):
            rpc(direct, "create", path=path, client_name="setup")
            rpc(direct, "complete", path=path, client_name="setup", data=path.encode())
        dropper = ReplyDropper(direct)
        # each change a call of its own (no directory leases): the calls are what is tested
        mount = Mount(ha, "lost-replies", "--meta", f"{dropper.address},{ha.address(standby)}",
                      "--set", "mount_entry_timeout=60", "--set", "mount_attr_timeout=60",
                      "-o", "sync_namespace")
        mount.start()
        top = mount.mp / "t"
        # the kernel knows every name now: the calls below need no lookup first
        names = [top / "u" / "file", top / "e" / "dir", top / "o" / "x", top / "o" / "y"]
        assert all(path.exists() for path in names)

        dropper.drop.set()
        errors: list[BaseException] = []

        def run(fn, *args) -> None:
            try:
                fn(*args)
            except BaseException as exc:   # reported below
                errors.append(exc)

        calls = [threading.Thread(target=run, args=(os.unlink, names[0])),
                 threading.Thread(target=run, args=(os.rmdir, names[1])),
                 threading.Thread(target=run, args=(os.rename, names[2], names[3]))]
        for thread in calls:
            thread.start()

        def carried_out() -> bool:
            for path in ("/t/u/file", "/t/e/dir", "/t/o/x"):
                try:
                    rpc(direct, "get_file_info", path=path)
                    return False
                except FileNotFound:
                    pass
            return True

        assert poll_until(carried_out), "the active never carried the calls out"
        applied = ha_status(direct)["applied_txid"]
        assert poll_until(lambda: ha_status(ha.address(standby))["applied_txid"] >= applied)
        assert poll_until(lambda: len(dropper.dropped) == 3)
        assert sorted(dropper.dropped) == ["delete", "delete", "rename"]
        assert all(thread.is_alive() for thread in calls)   # no reply reached the mount
        ha.kill_meta(active)
        assert ha.wait_active(timeout=30, besides=active) == standby
        for thread in calls:
            thread.join(60)
        assert not any(thread.is_alive() for thread in calls)
        assert errors == [], errors
        assert sorted(os.listdir(top / "u")) == sorted(os.listdir(top / "e")) == []
        assert os.listdir(top / "o") == ["y"]
        assert (top / "o" / "y").read_bytes() == b"/t/o/x"
        listing = rpc(ha.address(standby), "list_status", path="/t/o")
        assert [e["name"] for e in listing["entries"]] == ["y"]
        mount.stop()
    finally:
        if mount is not None:
            mount.cleanup()
        if dropper is not None:
            dropper.close()
        ha.stop()


def test_directory_leases_ride_through_a_kill9_of_the_active(tmp_path):
    """A mount holds a folder's lease (journaled grant, replicated) and has unlinked and
    renamed there, fsync'ed; the active is killed. The successor rebuilt the lease from the
    log: the mount goes on changing the folder under it, its queued changes reach the new
    active, and another client then sees every change, the fsync'ed ones and the later."""
    ha = HACluster(tmp_path, n_meta=2, n_storage=0)
    mount = None
    try:
        ha.start()
        mount = Mount(ha, "leases")
        mount.start()
        d = mount.mp / "held"
        d.mkdir()
        for n in range(8):
            (d / f"f{n}").write_text(str(n))
        os.unlink(d / "f0")                     # takes the lease
        os.rename(d / "f1", d / "g1")
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)                        # durable (replicated) from here
        finally:
            os.close(fd)
        active = ha.wait_active()
        ha.kill_meta(active)
        ha.wait_active(besides=active)
        os.unlink(d / "f2")                     # under the same lease, on the successor
        os.rename(d / "f3", d / "g3")
        assert sorted(os.listdir(d)) == ["f4", "f5", "f6", "f7", "g1", "g3"]
        with ha_client(ha) as cli:
            assert sorted(s.name for s in cli.list_status("/held")) == \
                ["f4", "f5", "f6", "f7", "g1", "g3"]
            assert cli.read_file("/held/g3") == b"3"
        mount.stop()
    finally:
        if mount is not None:
            mount.cleanup()
        ha.stop()


def ha_client(ha: HACluster):
    """A CLI client of the HA cluster: every metadata server in its list."""
    from fs.client import Client

    return Client(",".join(ha.address(n) for n in ha.statuses()), config=ha.config())
