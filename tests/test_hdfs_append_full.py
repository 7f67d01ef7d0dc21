"""Appends to files whose last block is exactly full, and to an empty file with no block:
HDFS's append answers no block to go on with, so Hadoop's writer asks for its first new
block with no ``previous`` (``NamespacePlanner.check_previous``); leasefs's own client names
the full last block instead. Both kinds of writer, one after the other, byte-exact through
both kinds of reader.

Real metadata and block server processes, one py4j JVM for the module's FsShell commands.
"""

from __future__ import annotations

import random

import pytest

from hadoopkit import requires_java
# ``shell``: that module's FsShell JVM fixture; ``cluster``: the inline append tests' (block
# servers and metadata server as real processes, 1 MiB blocks, replication 2)
from test_hdfs_fsshell import ok, shell  # noqa: F401
from test_hdfs_inline_append import checksums, cluster, leasefs_append, read  # noqa: F401, F811

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, requires_java]

RNG = random.Random(3537)


def block_lengths(cluster, path: str) -> list[int]:
    with cluster.client() as client:
        return [int(b["block"]["num_bytes"])
                for b in client.get_block_locations(path)["blocks"]]


def test_appends_to_files_ending_on_a_block_boundary(cluster, shell, tmp_path):
    """Files of exactly one and two blocks written by a leasefs client and by FsShell
    (``-put`` at ``dfs.blocksize`` = the cluster's block size) and an empty file from
    ``-touchz``: FsShell's ``-appendToFile`` starts a new block after the full one, a
    leasefs client's append goes on from there; the other order too (a leasefs client's
    append to a full file, then FsShell's). ``-cat``, a leasefs read and both checksums
    agree with the bytes written."""
    block = cluster.settings["block_size"]
    one, two = RNG.randbytes(block), RNG.randbytes(2 * block)
    with cluster.client() as client:
        client.mkdirs("/af")
        client.write_file("/af/py1", one)
        client.write_file("/af/py2", two)
        client.write_file("/af/py1-leasefs-first", one)
    for name, data in (("java1", one), ("java2", two)):
        local = tmp_path / name
        local.write_bytes(data)
        ok(shell.run("-put", str(local), f"/af/{name}"))
    ok(shell.run("-touchz", "/af/empty"))
    old = {"/af/py1": one, "/af/py2": two, "/af/java1": one, "/af/java2": two,
           "/af/empty": b""}
    for path, data in old.items():
        assert block_lengths(cluster, path) == [block] * (len(data) // block), path

    more = tmp_path / "more"
    more.write_bytes(RNG.randbytes(5000))
    then = b"then a leasefs client's append\n"
    want = {}
    for path, data in old.items():
        ok(shell.run("-appendToFile", str(more), path))
        leasefs_append(cluster, path, then)
        want[path] = data + more.read_bytes() + then
        assert block_lengths(cluster, path) == \
            [block] * (len(data) // block) + [5000 + len(then)], path

    # leasefs's own writer first (it names the full block as ``previous``), then Java's
    leasefs_append(cluster, "/af/py1-leasefs-first", then)
    ok(shell.run("-appendToFile", str(more), "/af/py1-leasefs-first"))
    want["/af/py1-leasefs-first"] = one + then + more.read_bytes()

    for path, content in want.items():
        assert ok(shell.run("-cat", path)).encode("latin-1") == content, path
        assert read(cluster, path) == content, path
    checksums(cluster, shell, want)
