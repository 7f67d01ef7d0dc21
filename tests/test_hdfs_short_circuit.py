"""HDFS's legacy short-circuit reads against leasefs block servers: Hadoop's client on the
same host asks a block server where a finalized replica's files are
(``getBlockLocalPathInfo``, ``storage.hdfs.datanode_ipc``) and reads them itself, checking
the CRC32Cs of the meta file. Real metadata and block server processes (security =
secure), Hadoop's client from PySpark's jars in a JVM of its own (``hadoopkit``), the
servers' own metrics to tell a short-circuit read from one over data transfer.
"""

from __future__ import annotations

import itertools
import os
import random
import types

import pytest
import trio
from hadoopkit import HadoopJvm, java_read, requires_java
from test_hdfs_datatransfer import hdfs_ops

from fs import blocktoken
from fs.errors import InvalidToken, PermissionDenied, ReplicaNotFound
from fs.hdfs import tokens
from fs.hdfs.ipc import IpcClient, RemoteError
from fs.hdfs.pb import client_datanode_pb2 as cdp
from fs.hdfs.pb import hdfs_pb2 as pb
from harness import ProcessCluster, free_port, poll_until
from storage.hdfs.datanode_ipc import CLIENT_DATANODE_PROTOCOL, ClientDatanode
from storage.layout import META_HEADER, decode_meta_header

pytestmark = pytest.mark.timeout(300)
slow = pytest.mark.slow   # every test but the translator's starts server processes

BLOCK = 1 << 20
DATA = random.Random(4141).randbytes(2 * BLOCK + BLOCK // 3 + 77)
_contexts = itertools.count()


def short_circuit() -> dict:
    """The Java client's settings for legacy short-circuit reads, in a client context of
    its own: Hadoop turns these reads off for a whole context after one failed attempt."""
    return {"dfs.client.read.shortcircuit": "true",
            "dfs.client.use.legacy.blockreader.local": "true",
            "dfs.client.context": f"short-circuit-{next(_contexts)}",
            "dfs.blocksize": BLOCK, "dfs.client.retry.window.base": 50}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-sc"), n_storage=3, settings={
            "security": "secure", "meta_hdfs_port": free_port(), "storage_hdfs_port": 0,
            "replication": 3, "block_size": BLOCK}) as running:
        yield running


@pytest.fixture(scope="module")
def jvm():
    with HadoopJvm() as running:
        yield running


def uri(cluster) -> str:
    return f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}/"


def client(cluster):
    from fs.client import Client
    return Client(cluster.meta_address, config=cluster.config())


def java_pread(jvm, fs, path: str, offset: int, length: int) -> bytes:
    stream = fs.open(jvm.path(path))
    try:
        buf = jvm.jvm.java.nio.ByteBuffer.allocate(length)
        stream.readFully(offset, buf)
        return bytes(buf.array())
    finally:
        stream.close()


def served(locations: list[dict]) -> dict:
    """op -> count of successful HDFS ops over the block servers of ``locations``."""
    total: dict[str, float] = {}
    for location in locations:
        for (op, result), n in hdfs_ops(location).items():
            if result == "ok":
                total[op] = total.get(op, 0) + n
    return total


@slow
@requires_java
def test_java_reads_finalized_replicas_from_their_files(cluster, jvm):
    """A file of three blocks written by leasefs's own client reads byte for byte through
    Hadoop's client with short-circuit reads on (whole, and positional reads across block
    boundaries), and no block server sent a byte of it over data transfer: each block's
    files were named once (getBlockLocalPathInfo) and read by the client itself."""
    with client(cluster) as c:
        c.write_file("/sc/f", DATA, replication=3)
        nodes = c.get_block_locations("/sc/f")["blocks"][0]["locations"]
    assert len(nodes) == 3
    before = served(nodes)
    fs = jvm.fs(uri(cluster), short_circuit())
    try:
        assert java_read(jvm, fs, "/sc/f") == DATA
        for offset, length in ((0, 8), (BLOCK - 100, 300), (2 * BLOCK - 5, BLOCK // 4),
                               (len(DATA) - 77, 77)):
            assert java_pread(jvm, fs, "/sc/f", offset, length) == \
                DATA[offset:offset + length]
    finally:
        fs.close()
    after = served(nodes)
    named = after.get("HDFS_getBlockLocalPathInfo", 0) - before.get(
        "HDFS_getBlockLocalPathInfo", 0)
    assert named >= 3, (before, after)
    assert after.get("HDFS_READ_BLOCK", 0) == before.get("HDFS_READ_BLOCK", 0), (before, after)


@slow
@requires_java
def test_a_corrupt_replica_file_is_caught_by_the_short_circuit_reader(cluster, jvm):
    """Bytes flipped in one replica file: the Java client reading the files itself checks
    the meta file's CRC32Cs, so every read returns the right bytes; a reader that meets the
    bad replica reports it and the metadata server replaces it."""
    from hakit import call

    from harness import flip_finalized_byte
    data = DATA[:BLOCK // 2]
    meta_log = cluster.base / "logs" / "meta.log"
    with client(cluster) as c:
        c.write_file("/sc/rot", data, replication=3)
        located = c.get_block_locations("/sc/rot")["blocks"][0]
        block_id, bad = located["block"]["id"], located["locations"][0]["node_id"]
        flip_finalized_byte(cluster, located["locations"][0], block_id, 1000)
        before = served(located["locations"])

        def reported() -> bool:
            return f"replica of block {block_id} on {bad} reported corrupt" in \
                meta_log.read_text(errors="replace")

        fs = jvm.fs(uri(cluster), short_circuit())
        try:
            # locations come shuffled with each open: within a few reads one meets the bad
            # replica first (the odds of 30 misses are 2/3**30)
            for _ in range(30):
                assert java_read(jvm, fs, "/sc/rot") == data
                if reported():
                    break
        finally:
            fs.close()
        assert reported(), f"the corrupt replica on {bad} was not reported"
        assert served(located["locations"]).get("HDFS_READ_BLOCK", 0) == \
            before.get("HDFS_READ_BLOCK", 0)

        def replaced():
            found = call(cluster.meta_address, "fsck", path="/sc/rot")
            return found["status"] == "HEALTHY" and found["totals"]["corrupt_replicas"] == 0
        assert poll_until(replaced, timeout=60), call(cluster.meta_address, "fsck",
                                                      path="/sc/rot")


@slow
@requires_java
def test_a_replica_restamped_after_its_files_were_named_reads_anew(cluster, jvm):
    """The Java client keeps a block's file names; an append gives the block a new
    generation stamp (a new meta file): the next read finds the named meta file gone,
    falls back to data transfer and returns the appended content, never the old one."""
    first, more = DATA[:300_000], DATA[300_000:400_000]
    with client(cluster) as c:
        c.write_file("/sc/grow", first, replication=3)
        fs = jvm.fs(uri(cluster), short_circuit())
        try:
            assert java_read(jvm, fs, "/sc/grow") == first
            with c.append("/sc/grow") as out:
                out.write(more)
            assert java_read(jvm, fs, "/sc/grow") == first + more
            assert java_pread(jvm, fs, "/sc/grow", 299_990, 20) == (first + more)[299_990:300_010]
        finally:
            fs.close()


async def _local_path_info(cluster, path: str, *, token: bool = True, last: bool = False):
    from fs.client import AsyncClient
    async with AsyncClient(cluster.meta_address, config=cluster.config()) as c:
        answer = await c.get_block_locations(path)
    located = answer["blocks"][-1] if last else answer["blocks"][0]
    block = located["block"]
    proto = pb.ExtendedBlockProto(poolId="BP-1", blockId=block["id"],
                                  generationStamp=block["gs"], numBytes=block["num_bytes"])
    location = located["locations"][0]
    request = cdp.GetBlockLocalPathInfoRequestProto(block=proto)
    request.token.CopyFrom(tokens.to_proto(located.get("token")) if token
                           else pb.TokenProto(identifier=b"", password=b"", kind="", service=""))
    async with trio.open_nursery() as nursery:
        ipc = await IpcClient.connect(location["address"].rsplit(":", 1)[0],
                                      location["hdfs_port"], nursery,
                                      user=f"blk_{block['id']}_{block['gs']}", sasl=True,
                                      protocol=CLIENT_DATANODE_PROTOCOL)
        try:
            answer = await ipc.call("getBlockLocalPathInfo", request,
                                    cdp.GetBlockLocalPathInfoResponseProto)
        except RemoteError as exc:
            answer = exc
        nursery.cancel_scope.cancel()
    if isinstance(answer, RemoteError):
        raise answer
    return answer


@slow
def test_local_path_info_names_the_finalized_files_and_refuses_the_rest(cluster):
    """The answer names the replica's data file and its meta file (HDFS's header: version
    1, CRC32C, bytes per checksum); without the block's read token, or for a replica still
    being written, the answer is a refusal that names the cause."""
    with client(cluster) as c:
        c.write_file("/sc/named", DATA[:100_000], replication=3)
    answer = trio.run(_local_path_info, cluster, "/sc/named")
    with open(answer.localPath, "rb") as fh:
        assert fh.read() == DATA[:100_000]
    with open(answer.localMetaPath, "rb") as fh:
        assert decode_meta_header(fh.read(META_HEADER.size)) == \
            cluster.config().bytes_per_checksum
    assert answer.localMetaPath.endswith(f"_{answer.block.generationStamp}.meta")

    with pytest.raises(RemoteError, match="token"):
        trio.run(lambda: _local_path_info(cluster, "/sc/named", token=False))

    with client(cluster) as c:
        out = c.create("/sc/open", replication=3)
        try:
            out.write(DATA[:100_000])
            out.flush()   # hflush: the RBW replica has the bytes
            with pytest.raises(RemoteError, match="RBW, not finalized"):
                trio.run(lambda: _local_path_info(cluster, "/sc/open", last=True))
        finally:
            out.close()


def test_the_translator_names_files_only_to_a_client_on_this_host_and_when_on():
    """A session from another host, or a block server with ``storage_short_circuit``
    off, is refused before any token or replica is looked at; a token is checked before
    the replica (security = secure); the answer names the store's files of a finalized
    replica at the replica's own stamp, and the store's refusal of any other passes on."""
    checked = []
    state = {"finalized": True}

    def finalized_files(block_id, gs):
        if not state["finalized"]:
            raise ReplicaNotFound(f"blk_{block_id} is RBW, not finalized")
        return "/d", "/m", gs + 1

    def transfer(on: bool):
        def check_token(header, block_id, gs, op, mode):
            checked.append((block_id, gs, mode))
            if header["token"] is None:
                raise InvalidToken("no token")
        return types.SimpleNamespace(
            config=types.SimpleNamespace(storage_short_circuit=on), check_token=check_token,
            node_key=b"k" * 32,
            stats=types.SimpleNamespace(token_refusals=0),
            store=types.SimpleNamespace(finalized_files=finalized_files))

    def call(translator, session, token=None):
        request = cdp.GetBlockLocalPathInfoRequestProto(
            block=pb.ExtendedBlockProto(poolId="p", blockId=9, generationStamp=5))
        if token is not None:
            request.token.CopyFrom(token)
        ctx = types.SimpleNamespace(session=session)
        return trio.run(translator.getBlockLocalPathInfo, ctx, request)

    with pytest.raises(PermissionDenied, match="storage_short_circuit"):
        call(ClientDatanode(transfer(False)), {"peer_address": ("127.0.0.1", 1)})
    with pytest.raises(PermissionDenied, match="on this host"):
        call(ClientDatanode(transfer(True)), {"peer_address": ("10.1.2.3", 1)})
    assert checked == []
    with pytest.raises(InvalidToken):
        call(ClientDatanode(transfer(True)), {"peer_address": ("127.0.0.1", 1)})
    assert checked == [(9, 5, blocktoken.READ)]
    key = blocktoken.BlockKey(7, b"s" * 32, 1e12)
    token = tokens.to_proto(blocktoken.issue(key, 9, 5, "alice", blocktoken.READ, 1e12))
    answer = call(ClientDatanode(transfer(True)), {"peer_address": ("127.0.0.1", 1)}, token)
    assert (answer.localPath, answer.localMetaPath, answer.block.generationStamp) == \
        ("/d", "/m", 6)
    state["finalized"] = False
    with pytest.raises(ReplicaNotFound, match="RBW, not finalized"):
        call(ClientDatanode(transfer(True)), {"peer_address": ("127.0.0.1", 1)}, token)


@slow
@requires_java
def test_files_kept_inline_are_read_short_circuit_too(cluster, jvm):
    """A small file kept inline in the namespace has no replica: the metadata server writes
    its content out as replica files and names them, so short-circuit reads stay on for
    the client (a refusal would turn them off for its whole context). A rewrite gives the
    file a new content and the client reads the new bytes, never the old files."""
    small, other = DATA[:3000], DATA[5000:9000]
    with client(cluster) as c:
        c.write_file("/sc/inline-small", small)
        assert c.get_block_locations("/sc/inline-small").get("inline") == small
        c.write_file("/sc/after-inline", DATA, replication=3)
        nodes = c.get_block_locations("/sc/after-inline")["blocks"][0]["locations"]
    before = served(nodes)
    fs = jvm.fs(uri(cluster), short_circuit())
    try:
        assert java_read(jvm, fs, "/sc/inline-small") == small
        assert java_pread(jvm, fs, "/sc/inline-small", 1000, 50) == small[1000:1050]
        assert java_read(jvm, fs, "/sc/after-inline") == DATA
        assert served(nodes).get("HDFS_READ_BLOCK", 0) == before.get("HDFS_READ_BLOCK", 0)
        with client(cluster) as c:
            c.write_file("/sc/inline-small", other, overwrite=True)
        assert java_read(jvm, fs, "/sc/inline-small") == other
        assert java_read(jvm, fs, "/sc/after-inline") == DATA
        assert served(nodes).get("HDFS_READ_BLOCK", 0) == before.get("HDFS_READ_BLOCK", 0)
    finally:
        fs.close()
    written = list((cluster.meta_dir() / "hdfs-local").glob("blk_*"))
    assert len(written) == 4, written   # two contents, a data and a meta file each


def test_inline_contents_are_written_once_named_and_evicted_oldest_first(tmp_path):
    """The metadata server's side without a cluster: each content is written once as a
    data file and a meta file of HDFS's layout (its CRC32Cs), named again from memory,
    and beyond ``max_files`` the least recently named go; a remote client or a server
    without a folder is refused."""
    from fs.datatransfer import chunk_checksums
    from meta.protocols.hdfs.inline_local import InlineLocalFiles

    contents = {(1, 11): b"a" * 1500, (2, 22): b"b" * 10, (3, 33): b"c" * 700}
    asked = []

    async def content(header, op, peer):
        asked.append((header.block.blockId, header.block.generationStamp))
        return contents[(header.block.blockId, header.block.generationStamp)]

    local = {"peer_address": ("127.0.0.1", 5)}
    files = InlineLocalFiles(types.SimpleNamespace(content=content), str(tmp_path / "l"),
                             max_files=2)

    def name(block_id, stamp, session=local, on=files):
        request = cdp.GetBlockLocalPathInfoRequestProto(
            block=pb.ExtendedBlockProto(poolId="p", blockId=block_id, generationStamp=stamp))
        return trio.run(on.getBlockLocalPathInfo,
                        types.SimpleNamespace(session=session, peer="p"), request)

    first = name(1, 11)
    with open(first.localPath, "rb") as fh:
        assert fh.read() == contents[(1, 11)]
    with open(first.localMetaPath, "rb") as fh:
        meta = fh.read()
    assert decode_meta_header(meta[:META_HEADER.size]) == 512
    assert meta[META_HEADER.size:] == chunk_checksums(contents[(1, 11)], 512)
    mtime = os.stat(first.localPath).st_mtime_ns
    assert name(1, 11).localPath == first.localPath and os.stat(
        first.localPath).st_mtime_ns == mtime
    name(2, 22)
    name(1, 11)                      # named again: now the most recent
    name(3, 33)                      # a third content: the least recent (2, 22) goes
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == [
        "blk_1_11", "blk_1_11.meta", "blk_3_33", "blk_3_33.meta"]
    assert asked == [(1, 11), (1, 11), (2, 22), (1, 11), (3, 33)]
    with pytest.raises(PermissionDenied, match="on this host"):
        name(1, 11, {"peer_address": ("10.1.2.3", 5)})
    with pytest.raises(PermissionDenied, match="names no local files"):
        name(1, 11, on=InlineLocalFiles(types.SimpleNamespace(content=content), None))
