"""Every file reads through hdfs://: small files kept inline in the namespace (one synthetic
block the metadata server's own HDFS port serves, ``meta.protocols.hdfs.inline``) and files
still being written (``lastBlock`` + the block servers' ``getReplicaVisibleLength``,
``storage.hdfs.datanode_ipc``), under simple and secure; both HDFS ports tell Hadoop IPC
from data transfer by the first bytes (``fs.hdfs.sniff``).

Real metadata and block server processes, a real FUSE mount, and Hadoop's own client
from PySpark's jars (one py4j JVM per module for the FileSystem API, FsShell for ``-cat``
and ``-tail``).
"""

from __future__ import annotations

import os
import random
import time
import types

import pytest
import trio

from harness import ProcessCluster, free_port, mounted
from hadoopkit import HadoopJvm, fs_shell, jars, requires_java, write_conf

from fs import blocktoken
from fs.client import AsyncClient
from fs.errors import AuthenticationFailed
from fs.hdfs import convert, tokens
from fs.hdfs import datatransfer as hdt
from fs.hdfs.ipc import IpcClient, RemoteError
from fs.hdfs.pb import client_datanode_pb2 as cdp
from fs.hdfs.pb import datatransfer_pb2 as dt
from fs.hdfs.pb import hdfs_pb2 as pb
from fs.hdfs.pb import namenode_reads_pb2 as rp
from fs.hdfs.ipc_server import Claim
from fs.hdfs.sasl import SaslRefused
from storage.hdfs.datanode_ipc import CLIENT_DATANODE_PROTOCOL, DatanodeIdentity

pytestmark = pytest.mark.timeout(300)
slow = pytest.mark.slow   # every test but the identity's starts server processes

RNG = random.Random(3535)
SMALL = {name: RNG.randbytes(n) for name, n in
         (("one", 1), ("chunk", 512), ("odd", 5000), ("max", 64 << 10))}
BIG = RNG.randbytes(300_000)          # more than inline_max: a real block
IDLE = 3.0


def _cluster(tmp_path_factory, security: str):
    c = ProcessCluster(tmp_path_factory.mktemp(f"hdfs-open-{security}"), n_storage=1, settings={
        "security": security, "meta_hdfs_port": free_port(), "storage_hdfs_port": 0,
        "replication": 1, "block_size": 1 << 20, "auth_timeout": IDLE,
        "idle_timeout": IDLE})
    c.start()
    return c


@pytest.fixture(scope="module", params=["simple", "secure"])
def cluster(request, tmp_path_factory):
    c = _cluster(tmp_path_factory, request.param)
    try:
        yield c
    finally:
        c.stop()


def address(cluster) -> str:
    return f"127.0.0.1:{cluster.settings['meta_hdfs_port']}"


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    # the client drops an idle IPC connection before the servers do (their idle_timeout
    # is IDLE here), as its default 10 s does against their default 60 s: else a call may
    # go out on a connection the server is closing
    return write_conf(tmp_path_factory.mktemp("hadoop-conf"),
                      {"ipc.client.connection.maxidletime": int(IDLE * 1000 / 3)})


@pytest.fixture(scope="module")
def jvm(conf):
    """Hadoop's client in one JVM for the module (py4j, as PySpark drives it)."""
    if jars() is None:
        pytest.skip("needs pyspark's Hadoop client jars")
    os.environ.setdefault("HADOOP_USER_NAME", "root")
    with HadoopJvm(heap="384m", conf=conf) as held:   # stopped with the module
        yield held.jvm


class JavaFs:
    """``org.apache.hadoop.fs.FileSystem`` of one cluster, a new instance per test."""

    def __init__(self, jvm, cluster):
        self.j = jvm
        conf = jvm.org.apache.hadoop.conf.Configuration()
        self.fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(
            jvm.java.net.URI(f"hdfs://{address(cluster)}"), conf)

    def path(self, p: str):
        return self.j.org.apache.hadoop.fs.Path(p)

    def read(self, p: str) -> bytes:
        stream = self.fs.open(self.path(p))
        try:
            return bytes(stream.readAllBytes())
        finally:
            stream.close()

    def close(self):
        self.fs.close()


@pytest.fixture
def java(jvm, cluster):
    fs = JavaFs(jvm, cluster)
    yield fs
    fs.close()


async def _write(cluster, path: str, data: bytes) -> None:
    async with AsyncClient(cluster.meta_address, config=cluster.config()) as client:
        await client.write_file(path, data, overwrite=True)


async def _meta_ipc(cluster, nursery, **kwargs) -> IpcClient:
    return await IpcClient.connect("127.0.0.1", cluster.settings["meta_hdfs_port"], nursery,
                                   user="root", **kwargs)


async def _locations(cluster, path: str) -> pb.LocatedBlocksProto:
    async with trio.open_nursery() as nursery:
        client = await _meta_ipc(cluster, nursery)
        answer = await client.call("getBlockLocations", rp.GetBlockLocationsRequestProto(
            src=path, offset=0, length=1 << 40), rp.GetBlockLocationsResponseProto)
        nursery.cancel_scope.cancel()
    return answer.locations


def _node_address(node: pb.DatanodeInfoProto) -> str:
    return f"{node.id.ipAddr}:{node.id.xferPort}"


# --------------------------------------------------------------------------- inline files


@slow
@requires_java
def test_inline_files_read_through_hdfs_byte_for_byte(cluster, java, conf):
    """Files kept inline, written by the Python client and through a FUSE mount, read by
    Hadoop's client (open, pread, located listing, FsShell -cat) exactly as written."""
    with cluster.client() as client:
        client.mkdirs("/inline")
        for name, data in SMALL.items():
            client.write_file(f"/inline/{name}", data)
        client.write_file("/inline/empty", b"")
        assert "inline" in client.get_block_locations("/inline/odd")
    mount = mounted(cluster, "hdfs-open")
    m = next(mount)
    try:
        via_mount = RNG.randbytes(20_000)
        (m.mp / "inline" / "mounted").write_bytes(via_mount)
    finally:
        next(mount, None)
    expected = {**SMALL, "empty": b"", "mounted": via_mount}

    for name, data in expected.items():
        assert java.read(f"/inline/{name}") == data, name
    # pread in the middle of a chunk, across chunks
    stream = java.fs.open(java.path("/inline/odd"))
    try:
        buf = java.j.java.nio.ByteBuffer.allocate(1500)
        assert stream.read(777, buf) == 1500
        assert bytes(buf.array()) == SMALL["odd"][777:2277]
    finally:
        stream.close()
    # Spark's listing: every inline file has its one block, on the metadata server
    listing = java.fs.listLocatedStatus(java.path("/inline"))
    seen = {}
    while listing.hasNext():
        status = listing.next()
        locations = list(status.getBlockLocations())
        seen[status.getPath().getName()] = [(b.getOffset(), b.getLength(), list(b.getHosts()))
                                            for b in locations]
    for name, data in expected.items():
        assert seen[name] == ([(0, len(data), ["127.0.0.1"])] if data else []), name

    names = sorted(expected)
    proc = fs_shell(address(cluster), "-cat", *[f"/inline/{n}" for n in names], conf=conf,
                    user="root")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout == b"".join(expected[n] for n in names)


@slow
def test_a_stale_inline_block_is_refused_and_the_new_content_read(cluster):
    """The synthetic block's stamp is the content's digest: a READ_BLOCK of the stamp
    fetched before the content changed (an append in place, the same inode) is refused
    with ERROR_ACCESS_TOKEN (Hadoop's client then fetches the locations again), and the
    new locations read the new content; a block of a file replaced or grown past
    inline_max is refused likewise."""
    old = b"a" * 3000

    async def main():
        await _write(cluster, "/stale", old)
        block = (await _locations(cluster, "/stale")).blocks[0]
        node = _node_address(block.locs[0])
        async with AsyncClient(cluster.meta_address, config=cluster.config()) as client:
            out = await client.append("/stale")
            await out.write(b"b" * 100)
            await out.close()
        async with await hdt.DataTransferClient.connect(node) as c:
            got = await c.read_block(block.b, 0, 3000, token=block.blockToken)
            assert got.response.status == hdt.Status.ERROR_ACCESS_TOKEN
            assert "stale: the file's content changed" in got.response.message
            assert not got.data
        after = (await _locations(cluster, "/stale")).blocks[0]
        assert after.b.blockId == block.b.blockId
        assert after.b.generationStamp != block.b.generationStamp
        async with await hdt.DataTransferClient.connect(node) as c:
            got = await c.read_block(after.b, 0, 3100, token=after.blockToken)
            assert got.data == old + b"b" * 100
        for replacement in (b"c" * 3100, BIG):   # a new inode; then no inline file at all
            await _write(cluster, "/stale", replacement)
            async with await hdt.DataTransferClient.connect(node) as c:
                got = await c.read_block(after.b, 0, 3100, token=after.blockToken)
            assert got.response.status == hdt.Status.ERROR_ACCESS_TOKEN
            assert "is no longer a file kept inline" in got.response.message
        located = await _locations(cluster, "/stale")
        assert convert.inline_ino(located.blocks[0].b.blockId) is None
    trio.run(main)


@slow
@requires_java
def test_java_reads_the_new_content_of_a_file_rewritten_after_open(cluster, java):
    """Hadoop's client opened the file (its locations fetched), then the file is
    rewritten: the read gets the new content whole, never the old one or a mix."""
    with cluster.client() as client:
        client.write_file("/rewritten", b"1" * 4000)
    stream = java.fs.open(java.path("/rewritten"))
    try:
        with cluster.client() as client:
            client.write_file("/rewritten", b"2" * 4000, overwrite=True)
        assert bytes(stream.readAllBytes()) == b"2" * 4000
    finally:
        stream.close()


@slow
def test_secure_inline_reads_need_the_block_token(cluster):
    if cluster.settings["security"] != "secure":
        pytest.skip("block tokens are handed out under security = secure")
    with cluster.client() as client:
        client.write_file("/tokened", b"t" * 100)
        client.write_file("/other", b"o" * 100)

    async def main():
        block = (await _locations(cluster, "/tokened")).blocks[0]
        other = (await _locations(cluster, "/other")).blocks[0]
        assert block.blockToken.identifier, "secure hands out a token with the block"
        forged = pb.TokenProto(identifier=block.blockToken.identifier,
                               password=b"x" * len(block.blockToken.password),
                               kind=tokens.KIND, service="")
        node = _node_address(block.locs[0])
        for bad in (None, other.blockToken, forged):
            async with await hdt.DataTransferClient.connect(node) as c:
                got = await c.read_block(block.b, 0, 100, token=bad)
            assert got.response.status == hdt.Status.ERROR_ACCESS_TOKEN, bad
            assert not got.data
        async with await hdt.DataTransferClient.connect(node) as c:
            assert (await c.read_block(block.b, 0, 100, token=block.blockToken)).data == \
                b"t" * 100
    trio.run(main)


# --------------------------------------------------------------------------- open files


@slow
@requires_java
def test_java_reads_exactly_what_a_python_writer_hflushed(cluster, java, conf):
    """A Python writer's hflush is what Hadoop's client sees of the open file, small
    (kept inline while open) or past inline_max (the block being written: its visible
    length from the block server's getReplicaVisibleLength), and more after the next."""
    with cluster.client() as client:
        small = client.create("/open/small")
        big = client.create("/open/big")
        try:
            small.write(b"first ")
            small.hflush()
            big.write(BIG)
            big.hflush()
            assert java.read("/open/small") == b"first "
            assert java.read("/open/big") == BIG
            located = client.get_block_locations("/open/big")
            assert located["under_construction"] and not located["last_block_complete"]

            small.write(b"second")
            small.hflush()
            big.write(b"tail" * 100)
            big.hflush()
            assert java.read("/open/small") == b"first second"
            assert java.read("/open/big") == BIG + b"tail" * 100
            # past the first block (1 MiB here): a complete block, then the one being written
            multi = client.create("/open/multi")
            try:
                data = RNG.randbytes((1 << 20) + 123_456)
                multi.write(data)
                multi.hflush()
                assert java.read("/open/multi") == data
            finally:
                multi.close()
            # -tail starts 1 KB before the length the metadata server knows (an hsync
            # records it; an hflush, as HDFS's later ones, does not) and reads what is visible
            big.write(b"end")
            big.hsync()
            proc = fs_shell(address(cluster), "-tail", "/open/big", conf=conf, user="root")
            assert proc.returncode == 0, proc.stderr.decode()[-2000:]
            assert proc.stdout == (BIG + b"tail" * 100 + b"end")[-1024:]
        finally:
            small.close()
            big.close()
    assert java.read("/open/big") == BIG + b"tail" * 100 + b"end"


@slow
@requires_java
def test_a_python_reader_sees_what_a_java_writer_hflushed(cluster, java):
    out = java.fs.create(java.path("/open/java"))
    try:
        out.write(bytearray(BIG[:70_000]))
        out.hflush()
        with cluster.client() as client:
            assert client.read_file("/open/java") == BIG[:70_000]
            out.write(bytearray(BIG[70_000:100_000]))
            out.hflush()
            assert client.read_file("/open/java") == BIG[:100_000]
    finally:
        out.close()
    with cluster.client() as client:
        assert client.read_file("/open/java") == BIG[:100_000]


@slow
def test_located_blocks_of_an_open_file_are_as_hdfs_tells_them(cluster):
    """fileLength counts the complete blocks, lastBlock is the block being written, and
    the block server's IPC answers its visible length (SASL NEGOTIATE on loopback goes on
    simple, as Hadoop's client does when its user carries the block token)."""
    with cluster.client() as client:
        out = client.create("/open/located")
        try:
            out.write(BIG[:200_000])
            out.hflush()
            trio.run(_check_open_located, cluster)
        finally:
            out.close()


async def _check_open_located(cluster):
    located = await _locations(cluster, "/open/located")
    assert located.underConstruction and not located.isLastBlockComplete
    assert located.fileLength == 0
    last = located.lastBlock
    assert last.offset == 0 and last.b.blockId == located.blocks[-1].b.blockId
    node = last.locs[0]
    assert node.id.ipcPort == node.id.xferPort > 0
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(node.id.ipAddr, node.id.ipcPort, nursery,
                                         user=f"blk_{last.b.blockId}_{last.b.generationStamp}",
                                         sasl=True, protocol=CLIENT_DATANODE_PROTOCOL)
        answer = await client.call("getReplicaVisibleLength",
                                   cdp.GetReplicaVisibleLengthRequestProto(block=last.b),
                                   cdp.GetReplicaVisibleLengthResponseProto)
        assert answer.length == 200_000
        missing = pb.ExtendedBlockProto(poolId="x", blockId=last.b.blockId + 10_000,
                                        generationStamp=1)
        with pytest.raises(RemoteError, match="no readable replica"):
            await client.call("getReplicaVisibleLength",
                              cdp.GetReplicaVisibleLengthRequestProto(block=missing),
                              cdp.GetReplicaVisibleLengthResponseProto)
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- hostile input


async def _raw(addr: str, data: bytes, *, wait: float = 20.0) -> tuple[bytes, float]:
    """Send ``data``, read until the server closes: (bytes, seconds it took)."""
    host, port = addr.rsplit(":", 1)
    started = time.monotonic()
    stream = await trio.open_tcp_stream(host, int(port))
    got = b""
    async with stream:
        await stream.send_all(data)
        with trio.fail_after(wait):
            while chunk := await stream.receive_some(65536):
                got += chunk
    return got, time.monotonic() - started


def _answer(raw: bytes) -> dt.BlockOpResponseProto:
    n, i, shift = 0, 0, 0
    while True:
        n |= (raw[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not raw[i - 1] & 0x80:
            break
    return dt.BlockOpResponseProto.FromString(raw[i:i + n])


@slow
def test_hostile_input_on_the_sniffing_ports(cluster):
    """Neither preamble, half a preamble, garbage after a data-transfer version, an op
    the metadata server does not serve, a block that is not an inline file's: a clear
    error where the protocol has one, the connection closed, and both ports serve on."""
    with cluster.client() as client:
        client.write_file("/hostile/small", b"s" * 700)
        client.write_file("/hostile/big", BIG)

    async def main():
        meta = address(cluster)
        big = (await _locations(cluster, "/hostile/big")).blocks[0]
        storage = _node_address(big.locs[0])
        for port in (meta, storage):
            got, _ = await _raw(port, b"GET / HTTP/1.1\r\n\r\n")
            assert got == b"", port                     # neither: closed without a word
            got, took = await _raw(port, b"h")         # half a preamble: dropped in time
            assert got == b"" and IDLE - 0.5 <= took < IDLE + 10, (port, took)
            got, _ = await _raw(port, b"\x00\x1c\x51\x05\xff\xff\xff\xff\xff")
            answer = _answer(got)
            assert answer.status == hdt.Status.ERROR
            assert "malformed OpReadBlockProto" in answer.message, port
            got, _ = await _raw(port, b"\x00\x1b\x51\x00")
            assert "version 27" in _answer(got).message
        got, _ = await _raw(meta, hdt.encode_op(hdt.WRITE_BLOCK, dt.OpWriteBlockProto(
            header=hdt.op_header(big.b, big.blockToken, "t"), stage=0, pipelineSize=1,
            minBytesRcvd=0, maxBytesRcvd=0, latestGenerationStamp=0,
            requestedChecksum=dt.ChecksumProto(type=hdt.CRC32C, bytesPerChecksum=512))))
        answer = _answer(got)
        assert answer.status == hdt.Status.ERROR_UNSUPPORTED
        assert "READ_BLOCK and BLOCK_CHECKSUM only" in answer.message
        got, _ = await _raw(meta, hdt.encode_op(hdt.READ_BLOCK, dt.OpReadBlockProto(
            header=hdt.op_header(big.b, big.blockToken, "t"), offset=0, len=10)))
        answer = _answer(got)
        assert answer.status == hdt.Status.ERROR
        assert "not a block of this metadata server" in answer.message
        # both serve on: IPC and data transfer
        small = (await _locations(cluster, "/hostile/small")).blocks[0]
        async with await hdt.DataTransferClient.connect(_node_address(small.locs[0])) as c:
            assert (await c.read_block(small.b, 0, 700, token=small.blockToken)).data == \
                b"s" * 700
            assert (await c.read_block(small.b, 100, 5, token=small.blockToken)).data == \
                b"s" * 5
        async with await hdt.DataTransferClient.connect(storage) as c:
            assert (await c.read_block(big.b, 0, 1000, token=big.blockToken)).data == BIG[:1000]
    trio.run(main)


# --------------------------------------------------------------------------- block server IPC identity


def _identity(keys: dict):
    """The block server's IPC identity over the block keys it holds (security = secure:
    a cluster key is installed)."""
    return DatanodeIdentity(types.SimpleNamespace(node_key=b"k" * 32, block_keys=keys))


def _claim(peer_host: str, authenticated=None, user="") -> Claim:
    return Claim(user=user, real_user=None, protocol=CLIENT_DATANODE_PROTOCOL,
                 peer=f"{peer_host}:1", peer_address=(peer_host, 1),
                 local_address=("10.0.0.1", 2), authenticated=authenticated)


@pytest.mark.parametrize("mode, expired, forged, match", [
    (blocktoken.READ, False, False, None),
    (blocktoken.WRITE, False, False, "not a read token"),
    (blocktoken.READ, True, False, "expired"),
    (blocktoken.READ, False, True, "response does not match|password"),
])
def test_secure_block_server_ipc_takes_a_remote_client_by_its_block_token(mode, expired,
                                                                          forged, match):
    """A client on another host proves it holds the block's read token (SASL TOKEN,
    DIGEST-MD5 with the token's identifier and MAC), and its session names that block;
    a write token, an expired one or a wrong MAC is refused; without SASL it is refused,
    while a client on this host is taken."""
    from test_hdfs_sasl import client_response, initiate, negotiate

    key = blocktoken.BlockKey(7, b"s" * 32, time.time() + 3600)
    token = blocktoken.issue(key, 1234, 1001, "alice", mode,
                             time.time() + (-5 if expired else 600))
    proto = tokens.to_proto(token)
    identity = _identity({key.key_id: key.secret})
    remote = ("10.1.2.3", 1)
    assert identity.simple_refusal(remote) is not None
    assert identity.simple_refusal(("127.0.0.1", 1)) is None
    with pytest.raises(AuthenticationFailed, match="block's access token"):
        identity.open_session({}, _claim("10.1.2.3"))
    session = {}
    identity.open_session(session, _claim("127.0.0.1", user="blk_1234_1001"))
    assert session["user"] == "blk_1234_1001" and "block_token" not in session

    negotiation = identity.token_negotiation(remote)
    challenge = negotiate(negotiation)
    password = b"x" * 32 if forged else proto.password
    response, _ = client_response(challenge, proto.identifier, password)
    if match is not None:
        with pytest.raises(SaslRefused, match=match):
            negotiation.step(initiate(response))
        return
    answer = negotiation.step(initiate(response))
    assert negotiation.done and answer.token.startswith(b"rspauth=")
    session = {}
    identity.open_session(session, _claim("10.1.2.3", negotiation.authenticated))
    assert session["user"] == "blk_1234_1001"
    assert session["block_token"]["id"] == 1234
