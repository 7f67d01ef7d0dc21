"""Hadoop's FsShell ``-appendToFile`` to files kept inline in the namespace
(``meta.protocols.hdfs.inline_append``): the metadata server makes the inline bytes the
file's first block, Hadoop's writer continues it; a kill -9 of the metadata server in the
middle leaves the old content.

Real metadata and block server processes under security = secure (block tokens on the
metadata server's own write), one py4j JVM for the module's FsShell commands.
"""

from __future__ import annotations

import os
import random
import signal
import threading

import pytest
import trio

from fs.client import AsyncClient
from fs.datatransfer import crc32c
from hadoopkit import jars, requires_java
from harness import ProcessCluster, free_port, leasefs, poll_until
from test_hdfs_fsshell import Ran, Shell, checksum_line, replica_contents

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, requires_java]

RNG = random.Random(3536)
INLINE_MAX = 64 << 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # block servers are stopped (SIGSTOP) for a while in the kill test: not declared dead
    # meanwhile; the metadata server's write to them waits for them, not for a timeout
    with ProcessCluster(tmp_path_factory.mktemp("inline-append"), n_storage=2, settings={
            "meta_hdfs_port": free_port(), "replication": 2, "block_size": 1 << 20,
            "inline_max": INLINE_MAX, "dead_node_interval": 60.0,
            "data_timeout": 60.0}) as running:
        yield running


@pytest.fixture(scope="module")
def shell(cluster):
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

    port = launch_gateway(classpath=f"{jars()}/*", die_on_exit=True,
                          javaopts=["-Xmx256m", "-XX:TieredStopAtLevel=1",
                                    "-DHADOOP_USER_NAME=root"])
    gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
    try:
        yield Shell(gateway, f"127.0.0.1:{cluster.settings['meta_hdfs_port']}")
    finally:
        gateway.shutdown()


def ok(ran: Ran) -> str:
    assert ran.code == 0 and not ran.err.strip(), ran
    return ran.out


def write(cluster, path: str, data: bytes) -> None:
    with cluster.client() as client:
        client.write_file(path, data)
        assert client.get_block_locations(path).get("inline") == (data or None), path


def read(cluster, path: str) -> bytes:
    with cluster.client() as client:
        return client.read_file(path)


def leasefs_append(cluster, path: str, data: bytes) -> None:
    async def main():
        async with AsyncClient(cluster.meta_address, config=cluster.config()) as client:
            out = await client.append(path)
            await out.write(data)
            await out.close()
    trio.run(main)


def composite(shell, path: str) -> str:
    mode = shell.make(**{"dfs.checksum.combine.mode": "COMPOSITE_CRC"})
    algorithm, value = checksum_line(shell.run("-checksum", path, shell=mode), path)
    assert algorithm == "COMPOSITE-CRC32C"
    return value


def test_appends_to_inline_files_continue_their_bytes(cluster, shell, tmp_path):
    """Small (odd length), empty and exactly ``inline_max`` files a leasefs client wrote,
    appended to by FsShell: ``-cat`` and a leasefs read give the old bytes then the new,
    both replicas hold them, ``leasefs checksum`` is FsShell's; a second Java append and a
    leasefs client's append after it go on from there."""
    old = {"/ia/small": RNG.randbytes(3001), "/ia/empty": b"",
           "/ia/max": RNG.randbytes(INLINE_MAX)}
    for path, data in old.items():
        write(cluster, path, data)
    more = tmp_path / "more"
    more.write_bytes(RNG.randbytes(5000))
    for path in old:
        ok(shell.run("-appendToFile", str(more), path))
    want = {path: data + more.read_bytes() for path, data in old.items()}
    for path, content in want.items():
        assert ok(shell.run("-cat", path)).encode("latin-1") == content, path
        assert read(cluster, path) == content, path
        if old[path]:   # (the empty file's block is the Java client's own, at 512)
            assert replica_contents(cluster, path) == [content, content], path
        mine = leasefs(cluster, "checksum", path)
        assert mine.returncode == 0, mine.stderr
        assert mine.stdout.split("\t")[1:] == ["COMPOSITE-CRC32C", f"{crc32c(content):08x}\n"]
        assert composite(shell, path) == f"{crc32c(content):08x}", path

    # a second Java append, then a leasefs client's
    tail = tmp_path / "tail"
    tail.write_bytes(b"second java append\n")
    ok(shell.run("-appendToFile", str(tail), "/ia/small"))
    leasefs_append(cluster, "/ia/small", b"then leasefs\n")
    content = want["/ia/small"] + tail.read_bytes() + b"then leasefs\n"
    assert ok(shell.run("-cat", "/ia/small")).encode("latin-1") == content
    assert read(cluster, "/ia/small") == content
    assert composite(shell, "/ia/small") == f"{crc32c(content):08x}"


def test_kill_9_of_the_metadata_server_mid_move_keeps_the_old_bytes(cluster, shell, tmp_path):
    """The block servers stopped, the metadata server is killed while its write of the
    inline bytes as the first block waits on them (the append and the block journaled,
    the length not): after its restart the file reads its old bytes, through the Java
    client and leasefs's; lease recovery closes it with the same bytes, and a Java append
    then goes on from them."""
    old = RNG.randbytes(2500)
    write(cluster, "/ik/small", old)
    more = tmp_path / "more"
    more.write_bytes(b"after the restart\n")
    stopped = [cluster.pid(f"storage{i}") for i in range(cluster.n_storage)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    ran: list[Ran] = []
    appender = threading.Thread(
        target=lambda: ran.append(shell.run("-appendToFile", str(more), "/ik/small")))
    try:
        appender.start()
        with cluster.client() as client:
            def block_allocated():
                files = client.list_open_files("/ik")
                return bool(files) and files[0]["last_block_state"] is not None
            assert poll_until(block_allocated, timeout=30)
            cluster.kill_meta()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    appender.join(60)
    assert not appender.is_alive()
    assert ran and ran[0].code != 0, ran      # the Java client lost its call
    cluster.start_meta()
    cluster.wait_ready()
    with cluster.client() as client:
        assert client.get_file_status("/ik/small").under_construction
        assert client.read_file("/ik/small") == old
    assert ok(shell.run("-cat", "/ik/small")).encode("latin-1") == old
    with cluster.client() as client:
        assert poll_until(lambda: client.recover_lease("/ik/small"), timeout=30)
        assert client.read_file("/ik/small") == old
    ok(shell.run("-appendToFile", str(more), "/ik/small"))
    assert ok(shell.run("-cat", "/ik/small")).encode("latin-1") == old + more.read_bytes()
    assert read(cluster, "/ik/small") == old + more.read_bytes()
