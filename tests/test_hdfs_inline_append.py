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
from hadoopkit import requires_java
from harness import ProcessCluster, free_port, leasefs, poll_until
# ``shell``: that module's FsShell JVM fixture, here on this module's ``cluster``
from test_hdfs_fsshell import Ran, checksum_line, ok, replica_contents, shell  # noqa: F401

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


def checksums(cluster, shell, contents: dict[str, bytes]) -> None:
    """``leasefs checksum`` of each path is the CRC32C of its content, and so is FsShell's
    ``-checksum`` in COMPOSITE_CRC mode."""
    mine = leasefs(cluster, "checksum", *contents)
    assert mine.returncode == 0, mine.stderr
    lines = mine.stdout.splitlines()
    assert len(lines) == len(contents), mine.stdout
    mode = shell.make(**{"dfs.checksum.combine.mode": "COMPOSITE_CRC"})
    for line, (path, content) in zip(lines, contents.items()):
        want = ("COMPOSITE-CRC32C", f"{crc32c(content):08x}")
        assert line.split("\t") == [path, *want], path
        assert checksum_line(shell.run("-checksum", path, shell=mode), path) == want, path


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
    checksums(cluster, shell, want)

    # a second Java append, then a leasefs client's
    tail = tmp_path / "tail"
    tail.write_bytes(b"second java append\n")
    ok(shell.run("-appendToFile", str(tail), "/ia/small"))
    leasefs_append(cluster, "/ia/small", b"then leasefs\n")
    content = want["/ia/small"] + tail.read_bytes() + b"then leasefs\n"
    assert ok(shell.run("-cat", "/ia/small")).encode("latin-1") == content
    assert read(cluster, "/ia/small") == content
    checksums(cluster, shell, {"/ia/small": content})


def append_killed_mid_move(cluster, path: str, *args: str, shell_run) -> list[Ran]:
    """``-appendToFile ARGS`` in a thread while the block servers are stopped; the
    metadata server killed -9 once the append and the first block are journaled (its
    write of the inline bytes waits on the stopped block servers, which go on after the
    kill: their replicas may hold the bytes), then started again. Returns the shell's
    ``Ran`` once the thread ends (a list, empty if it never did)."""
    stopped = [cluster.pid(f"storage{i}") for i in range(cluster.n_storage)]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    ran: list[Ran] = []
    appender = threading.Thread(target=lambda: ran.append(shell_run("-appendToFile", *args)))
    try:
        appender.start()
        with cluster.client() as client:
            def block_allocated():
                files = client.list_open_files(path)
                return bool(files) and files[0]["last_block_state"] is not None
            assert poll_until(block_allocated, timeout=30)
            cluster.kill_meta()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    cluster.start_meta()
    cluster.wait_ready()
    appender.join(60)
    assert not appender.is_alive()
    return ran


def test_kill_9_of_the_metadata_server_mid_move_keeps_the_old_bytes(cluster, shell, tmp_path):
    """The metadata server killed while it writes the inline bytes as the first block
    (the append and the block journaled, the length not): the Java client's call fails,
    and after the restart the file reads its old bytes, through the Java client and
    leasefs's; lease recovery closes it with the same bytes, and a Java append then goes
    on from them."""
    old = RNG.randbytes(2500)
    write(cluster, "/ik/small", old)
    more = tmp_path / "more"
    more.write_bytes(b"after the restart\n")
    ran = append_killed_mid_move(cluster, "/ik/small", str(more), "/ik/small",
                                 shell_run=shell.run)
    assert ran and ran[0].code != 0, ran      # the Java client lost its call
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


def test_a_java_retry_after_the_kill_finishes_the_append(cluster, shell, tmp_path):
    """The same kill, with Hadoop's client retrying calls across the restart
    (``dfs.client.retry.policy.enabled``, as CLIENTS.md advises for a lone metadata
    server): the retried append is answered from the journal with the first block the
    killed run left, which the replicas may already hold: it is dropped for a new one,
    and the append finishes with old then new bytes on both replicas. (A retry during
    the restart's safe mode is refused with SafeModeException, which the client retries.)"""
    old = RNG.randbytes(4000)
    write(cluster, "/ir/small", old)
    more = tmp_path / "more"
    more.write_bytes(b"appended across the restart\n")
    retrying = shell.make(**{"dfs.client.retry.policy.enabled": "true",
                             "dfs.client.retry.policy.spec": "200,100",
                             "ipc.client.connect.max.retries": 50,
                             "ipc.client.connect.retry.interval": 100})
    ran = append_killed_mid_move(cluster, "/ir/small", str(more), "/ir/small",
                                 shell_run=lambda *a: shell.run(*a, shell=retrying))
    assert ran and ran[0].code == 0, ran
    content = old + more.read_bytes()
    # (the module's shell would meet its connection to the killed server first: it
    # retries nothing)
    assert ok(shell.run("-cat", "/ir/small", shell=retrying)).encode("latin-1") == content
    assert read(cluster, "/ir/small") == content
    # the retry may come before both block servers are back: the block then gets its
    # second replica by re-replication
    assert poll_until(lambda: replica_contents(cluster, "/ir/small") == [content, content],
                      timeout=30)
