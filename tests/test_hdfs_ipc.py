"""Hadoop IPC on the metadata server's HDFS port (``fs.hdfs.ipc_server``, ClientProtocol's
reads in ``meta.protocols.hdfs.reads``): driven by the project's own IPC client
(``fs.hdfs.ipc.IpcClient``) and raw bytes against a real metadata server process, then by
Hadoop's own FsShell from PySpark's jars on files the leasefs Python client wrote.

Hostile input (a bad preamble, another IPC version, garbage protobuf, an oversized length,
a peer that stalls mid-frame) gets the answer Hadoop's protocol has for it, and the server
serves the next connection; calls on one connection are answered as each finishes.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import trio

from fs import errors
from fs.hdfs import exceptions
from fs.hdfs.ipc import (IpcClient, Preamble, RemoteError, frame, next_delimited,
                         parse, preamble)
from fs.hdfs.ipc_server import Claim
from fs.hdfs.sasl import Authenticated
from fs.hdfs.pb import ipc_pb2 as ipc
from fs.hdfs.pb import namenode_reads_pb2 as pb
from hadoopkit import fs_shell, requires_java, write_conf
from harness import ProcessCluster, free_port, wait_until
from meta.protocols.hdfs.identity import HdfsIdentity

H = ipc.RpcResponseHeaderProto
DATA = bytes(range(256)) * 800          # 204800 bytes: a block, not inline
WIDE = 1001                             # one more than a listing page
FRAME_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A metadata server under simple security with its HDFS port, one block server; a
    tree written by the leasefs Python client."""
    c = ProcessCluster(tmp_path_factory.mktemp("hdfs-ipc"), n_storage=1, settings={
        "security": "simple", "meta_hdfs_port": free_port(), "block_size": 1 << 20,
        "frame_timeout": FRAME_TIMEOUT})
    c.start()
    try:
        with c.client() as client:
            client.mkdirs("/d/sub")
            client.write_file("/d/f", DATA)
            client.write_file("/d/sub/small", b"tiny")
            client.mkdirs("/private", permission=0o700)
            client.write_file("/private/x", b"secret")
            client.set_quota("/d", ns_quota=100)
            client.create_symlink("/d/f", "/link")
            client.write_file("/open/unreadable", b"z" * 5000)
            client.set_permission("/open/unreadable", 0o600)
            for i in range(WIDE):
                client.mkdirs(f"/wide/d{i:04d}")
            # a tree whose content summary takes many of the server's time slices
            for branch in range(4):
                client.mkdirs(f"/deep/b{branch}/" + "/".join(["a"] * 3500))
        yield c
    finally:
        c.stop()


def hdfs_address(cluster) -> tuple[str, int]:
    return "127.0.0.1", cluster.settings["meta_hdfs_port"]


async def raw_exchange(cluster, data: bytes, *, wait: float = 10.0) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    stream = await trio.open_tcp_stream(*hdfs_address(cluster))
    got = bytearray()
    async with stream:
        await stream.send_all(data)
        with trio.fail_after(wait):
            while chunk := await stream.receive_some(65536):
                got += chunk
    return bytes(got)


def answers(raw: bytes) -> list[tuple[ipc.RpcResponseHeaderProto, bytes]]:
    """The frames of a server's byte stream: (answer header, body)."""
    out, pos = [], 0
    while pos < len(raw):
        (length,) = struct.unpack(">i", raw[pos:pos + 4])
        payload = raw[pos + 4:pos + 4 + length]
        assert len(payload) == length, "a frame cut short"
        header_raw, at = next_delimited(payload, 0)
        body = bytes(next_delimited(payload, at)[0]) if at < len(payload) else b""
        out.append((parse(H, header_raw, "answer header"), body))
        pos += 4 + length
    return out


def context(user: str, client_id: bytes = b"c" * 16) -> bytes:
    header = ipc.RpcRequestHeaderProto(rpcKind=ipc.RPC_PROTOCOL_BUFFER, callId=-3,
                                       clientId=client_id)
    body = ipc.IpcConnectionContextProto(protocol=exceptions_protocol())
    body.userInfo.effectiveUser = user
    return frame(header, body)


def exceptions_protocol() -> str:
    return "org.apache.hadoop.hdfs.protocol.ClientProtocol"


def call_frame(call_id: int, method: str, request, client_id: bytes = b"c" * 16) -> bytes:
    header = ipc.RpcRequestHeaderProto(rpcKind=ipc.RPC_PROTOCOL_BUFFER, callId=call_id,
                                       clientId=client_id, retryCount=0)
    method_header = ipc.RequestHeaderProto(methodName=method,
                                           declaringClassProtocolName=exceptions_protocol(),
                                           clientProtocolVersion=1)
    return frame(header, method_header, request)


async def file_info(client: IpcClient, path: str):
    return (await client.call("getFileInfo", pb.GetFileInfoRequestProto(src=path),
                              pb.GetFileInfoResponseProto))


async def serves_on(cluster) -> None:
    """A new connection is served (after whatever the previous one did)."""
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root")
        assert (await file_info(client, "/d/f")).fs.length == len(DATA)
        await client.aclose()


# --------------------------------------------------------------------------- units


def test_every_leasefs_error_has_a_java_class_and_the_named_ones_are_hdfs_own():
    table = exceptions.table()
    assert set(table) == set(errors.error_classes())
    assert table["FileNotFound"] == "java.io.FileNotFoundException"
    assert table["StandbyError"] == "org.apache.hadoop.ipc.StandbyException"
    assert table["SafeMode"] == "org.apache.hadoop.hdfs.server.namenode.SafeModeException"
    assert table["TryAgain"] == "org.apache.hadoop.ipc.RetriableException"
    assert table["PermissionDenied"] == "org.apache.hadoop.security.AccessControlException"
    assert table["NSQuotaExceeded"] == \
        "org.apache.hadoop.hdfs.protocol.NSQuotaExceededException"
    assert table["InternalError"] == "java.io.IOException"
    assert table["ChecksumError"] == "java.io.IOException"


def test_framing_refuses_lengths_past_the_frame():
    assert Preamble.parse(preamble()) == Preamble(b"hrpc", 9, 0, 0)
    whole = frame(ipc.RpcSaslProto(state=ipc.RpcSaslProto.NEGOTIATE))[4:]
    message, end = next_delimited(whole, 0)
    assert end == len(whole) and parse(ipc.RpcSaslProto, message, "x").state == 1
    with pytest.raises(errors.ProtocolError, match="runs past its frame"):
        next_delimited(whole[:-1], 0)
    with pytest.raises(errors.ProtocolError, match="not a varint"):
        next_delimited(b"\xff" * 11, 0)
    with pytest.raises(errors.ProtocolError, match="not a valid RpcSaslProto"):
        parse(ipc.RpcSaslProto, b"", "x")   # its required state missing


def secure_identity(opened, tokens):
    return HdfsIdentity(secure=lambda: True, open_session=lambda *args: opened.append(args),
                        act_as=None, owner_of=lambda peer, local: 0,
                        token_session=lambda session, owner: tokens.append(owner),
                        token_lookup=lambda identifier: (b"pw", "alice"))


def test_secure_mode_refuses_a_remote_peer_and_names_the_kernel_s_user_on_loopback():
    opened, tokens = [], []
    identity = secure_identity(opened, tokens)
    remote = Claim(user="alice", real_user=None, protocol=exceptions_protocol(),
                   peer="10.9.8.7:4000", peer_address=("10.9.8.7", 4000),
                   local_address=("10.9.8.1", 9000))
    assert identity.simple_refusal(remote.peer_address) is not None
    assert identity.token_negotiation(remote.peer_address) is not None
    with pytest.raises(errors.AuthenticationFailed, match="delegation token"):
        identity.open_session({}, remote)
    assert not opened and not tokens
    local = Claim(user="alice", real_user="mallory", protocol=exceptions_protocol(),
                  peer="127.0.0.1:4000", peer_address=("127.0.0.1", 4000),
                  local_address=("127.0.0.1", 9000))
    identity.open_session({}, local)
    (_, user, _, credentials, _), = opened
    assert (user, credentials.uid) == ("alice", 0)   # the kernel's uid, not realUser


def test_a_connection_sasl_proved_is_the_token_s_owner_and_claims_no_one_else():
    opened, tokens = [], []
    identity = secure_identity(opened, tokens)
    proved = Authenticated(user="alice", identifier=b"id")
    claim = dict(real_user=None, protocol=exceptions_protocol(), peer="10.9.8.7:4000",
                 peer_address=("10.9.8.7", 4000), local_address=("10.9.8.1", 9000),
                 authenticated=proved)
    identity.open_session({}, Claim(user="", **claim))      # Hadoop's client names no one
    identity.open_session({}, Claim(user="alice", **claim))
    assert tokens == ["alice", "alice"] and not opened
    with pytest.raises(errors.AuthenticationFailed, match="doesn't match"):
        identity.open_session({}, Claim(user="root", **claim))
    assert tokens == ["alice", "alice"]


# --------------------------------------------------------------------------- IPC, real server


@pytest.mark.slow
async def test_reads_answer_as_hdfs_does(cluster):
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root")
        status = (await file_info(client, "/d/f")).fs
        assert (status.fileType, status.path, status.length, status.permission.perm,
                status.owner, status.blocksize) == (2, b"", len(DATA), 0o644, "root", 1 << 20)
        missing = await file_info(client, "/d/none")
        assert not missing.HasField("fs")   # the client raises FileNotFound itself
        assert not (await file_info(client, "/d/f/under")).HasField("fs")

        listing = await client.call("getListing", pb.GetListingRequestProto(
            src="/d", startAfter=b"", needLocation=True), pb.GetListingResponseProto)
        entries = {e.path: e for e in listing.dirList.partialListing}
        assert sorted(entries) == [b"f", b"sub"] and listing.dirList.remainingEntries == 0
        located = entries[b"f"].locations
        assert located.fileLength == len(DATA) and len(located.blocks) == 1
        assert located.blocks[0].b.poolId.startswith("BP-")
        assert located.isLastBlockComplete and not located.underConstruction
        assert not entries[b"sub"].HasField("locations")
        alone = await client.call("getListing", pb.GetListingRequestProto(
            src="/d/f", startAfter=b"", needLocation=False), pb.GetListingResponseProto)
        assert [(e.path, e.length) for e in alone.dirList.partialListing] == [(b"", len(DATA))]
        gone = await client.call("getListing", pb.GetListingRequestProto(
            src="/none", startAfter=b"", needLocation=False), pb.GetListingResponseProto)
        assert not gone.HasField("dirList")

        # pages of a folder larger than one: by the last name of the page before
        names, after = [], b""
        while True:
            page = (await client.call("getListing", pb.GetListingRequestProto(
                src="/wide", startAfter=after, needLocation=False),
                pb.GetListingResponseProto)).dirList
            names += [e.path for e in page.partialListing]
            if not page.remainingEntries:
                break
            after = names[-1]
        assert names == [f"d{i:04d}".encode() for i in range(WIDE)]

        link = await client.call("getFileLinkInfo", pb.GetFileLinkInfoRequestProto(
            src="/link"), pb.GetFileLinkInfoResponseProto)
        assert (link.fs.fileType, link.fs.symlink) == (3, b"/d/f")
        assert (await client.call("getLinkTarget", pb.GetLinkTargetRequestProto(
            path="/link"), pb.GetLinkTargetResponseProto)).targetPath == "/d/f"

        blocks = (await client.call("getBlockLocations", pb.GetBlockLocationsRequestProto(
            src="/d/f", offset=0, length=10), pb.GetBlockLocationsResponseProto)).locations
        assert blocks.fileLength == len(DATA) and blocks.blocks[0].b.numBytes == len(DATA)

        defaults = (await client.call("getServerDefaults", pb.GetServerDefaultsRequestProto(),
                                      pb.GetServerDefaultsResponseProto)).serverDefaults
        assert (defaults.blockSize, defaults.bytesPerChecksum, defaults.writePacketSize,
                defaults.checksumType, defaults.trashInterval) == \
            (1 << 20, 512, 65536, 2, 1440)

        summary = (await client.call("getContentSummary", pb.GetContentSummaryRequestProto(
            path="/d"), pb.GetContentSummaryResponseProto)).summary
        assert (summary.length, summary.fileCount, summary.directoryCount, summary.quota,
                summary.spaceQuota) == (len(DATA) + 4, 2, 2, 100, (1 << 64) - 1)
        usage = (await client.call("getQuotaUsage", pb.GetQuotaUsageRequestProto(path="/d"),
                                   pb.GetQuotaUsageResponseProto)).usage
        assert (usage.fileAndDirectoryCount, usage.quota) == (4, 100)
        assert (await client.call("getPreferredBlockSize", pb.GetPreferredBlockSizeRequestProto(
            filename="/d/f"), pb.GetPreferredBlockSizeResponseProto)).bsize == 1 << 20
        stats = await client.call("getFsStats", pb.GetFsStatusRequestProto(),
                                  pb.GetFsStatsResponseProto)
        assert stats.capacity > 0 and stats.used >= len(DATA)
        nodes = (await client.call("getDatanodeReport", pb.GetDatanodeReportRequestProto(
            type=pb.LIVE), pb.GetDatanodeReportResponseProto)).di
        assert len(nodes) == 1 and nodes[0].capacity > 0

        with pytest.raises(RemoteError) as caught:
            await client.call("getBlockLocations", pb.GetBlockLocationsRequestProto(
                src="/d/none", offset=0, length=1), pb.GetBlockLocationsResponseProto)
        assert caught.value.class_name == "java.io.FileNotFoundException"
        assert "/d/none" in caught.value.message and not caught.value.fatal
        await client.aclose()

        # the context's user is who the calls run as (simple: believed)
        alice = await IpcClient.connect(*hdfs_address(cluster), nursery, user="alice")
        with pytest.raises(RemoteError) as caught:
            await file_info(alice, "/private/x")
        assert caught.value.class_name == "org.apache.hadoop.security.AccessControlException"
        assert "alice" in caught.value.message
        assert (await file_info(alice, "/d/f")).fs.length == len(DATA)
        # a file alice may list but not read: listed, without locations
        listed = (await alice.call("getListing", pb.GetListingRequestProto(
            src="/open", startAfter=b"", needLocation=True),
            pb.GetListingResponseProto)).dirList.partialListing
        assert [(e.path, e.length, e.HasField("locations")) for e in listed] == \
            [(b"unreadable", 5000, False)]
        await alice.aclose()


@pytest.mark.slow
async def test_calls_on_one_connection_are_answered_as_each_finishes(cluster):
    """A content summary of a big tree runs over many time slices; calls sent after it in
    the same write are answered while it runs, then it is, each to its call id."""
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root")
        calls = [client.call_frame("getContentSummary",
                                   pb.GetContentSummaryRequestProto(path="/deep"))]
        calls += [client.call_frame("getFileInfo", pb.GetFileInfoRequestProto(
            src="/d/f" if i % 2 else "/d/sub")) for i in range(6)]
        waiting = {call_id: client.expect(call_id) for call_id, _ in calls}
        done = []

        async def answer(call_id, receive):
            done.append((call_id, await client.answer(call_id, receive)))

        async with trio.open_nursery() as answers_come:
            for call_id, receive in waiting.items():
                answers_come.start_soon(answer, call_id, receive)
            await client.send(b"".join(data for _, data in calls))
        slow_id = calls[0][0]
        assert [call_id for call_id, _ in done][-1] == slow_id
        summary = client.response("x", done[-1][1], pb.GetContentSummaryResponseProto).summary
        assert summary.directoryCount == 1 + 4 * 3501
        kinds = {call_id: client.response("x", got, pb.GetFileInfoResponseProto).fs.fileType
                 for call_id, got in done[:-1]}
        assert kinds == {call_id: 2 if i % 2 else 1 for i, (call_id, _) in enumerate(calls[1:])}
        await client.aclose()


@pytest.mark.slow
async def test_preamble_and_handshake_faults_get_hadoop_s_answers_and_the_server_serves_on(
        cluster):
    # not Hadoop IPC at all: closed without a word
    assert await raw_exchange(cluster, b"GET / HTTP/1.1\r\n\r\n") == b""
    await serves_on(cluster)

    # another IPC version: a FATAL VERSION_MISMATCH answer, then closed
    (header, _), = answers(await raw_exchange(cluster, preamble(version=7)))
    assert (header.status, header.errorDetail) == (H.FATAL, H.FATAL_VERSION_MISMATCH)
    assert "version 9 cannot communicate with client version 7" in header.errorMsg
    await serves_on(cluster)

    # SASL under simple: NEGOTIATE answered SUCCESS, then the connection goes on simple;
    # a ping (-4) is read and not answered, the call after it is
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root",
                                         sasl=True)
        await client.ping()
        assert (await file_info(client, "/d/f")).fs.length == len(DATA)
        await client.aclose()

    # a first frame that is not the connection context: FATAL, closed
    (header, _), = answers(await raw_exchange(
        cluster, preamble() + call_frame(0, "getFileInfo", pb.GetFileInfoRequestProto(src="/"))))
    assert (header.status, header.errorDetail) == (H.FATAL, H.FATAL_INVALID_RPC_HEADER)
    await serves_on(cluster)


@pytest.mark.slow
async def test_bad_calls_get_error_answers_and_the_connection_serves_on(cluster):
    async with trio.open_nursery() as nursery:
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root")
        with pytest.raises(RemoteError) as caught:
            await client.call("noSuchCall", pb.GetFileInfoRequestProto(src="/"),
                              pb.GetFileInfoResponseProto)
        assert (caught.value.class_name, caught.value.detail) == \
            ("org.apache.hadoop.ipc.RpcNoSuchMethodException", H.ERROR_NO_SUCH_METHOD)
        assert not caught.value.fatal

        # garbage where the request belongs, then a request missing a required field
        header = client.header(41)
        method = ipc.RequestHeaderProto(methodName="getFileInfo",
                                        declaringClassProtocolName=exceptions_protocol(),
                                        clientProtocolVersion=1)
        for call_id, body in ((41, b"\xff\xfe\x01garbage"), (42, b"")):
            header.callId = call_id
            answer, _ = await client.call_raw(call_id, frame(header, method, body))
            assert (answer.status, answer.errorDetail) == (H.ERROR, H.ERROR_RPC_SERVER)
            assert "GetFileInfoRequestProto" in answer.errorMsg
        # a method header that is garbage
        header.callId = 43
        answer, _ = await client.call_raw(43, frame(header, b"\x0a\xff\xff\xff"))
        assert answer.status == H.ERROR
        assert (await file_info(client, "/d/f")).fs.length == len(DATA)
        await client.aclose()


@pytest.mark.slow
async def test_oversized_frames_and_stalled_peers_end_their_connection_only(cluster):
    opening = preamble() + context("root")
    # a length past the frame limit: FATAL and closed, nothing allocated for it
    (header, _), = answers(await raw_exchange(cluster, opening + struct.pack(">i", 1 << 30)))
    assert header.status == H.FATAL and "larger than the maximum" in header.errorMsg
    (header, _), = answers(await raw_exchange(cluster, opening + struct.pack(">i", -5)))
    assert header.status == H.FATAL and "negative" in header.errorMsg
    await serves_on(cluster)

    # a call header that is garbage: FATAL
    (header, _), = answers(await raw_exchange(cluster, opening + struct.pack(">i", 3) +
                                              b"\x02\xff\xff"))
    assert (header.status, header.errorDetail) == (H.FATAL, H.FATAL_INVALID_RPC_HEADER)

    # half a frame, then silence: closed once the frame timeout passes
    whole = call_frame(0, "getFileInfo", pb.GetFileInfoRequestProto(src="/d/f"))
    started = trio.current_time()
    assert await raw_exchange(cluster, opening + whole[:len(whole) // 2]) == b""
    assert FRAME_TIMEOUT <= trio.current_time() - started < FRAME_TIMEOUT + 8
    await serves_on(cluster)


@pytest.mark.slow
def test_a_taken_hdfs_port_stops_the_start_with_the_setting_named(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tools", "meta", "--data", str(tmp_path / "meta"),
             "--port", "0", "--hdfs-port", str(port), "--set", "security=simple"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "LEASEFS_HOME": str(tmp_path / "home")})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"leasefs meta: Address already in use: 127.0.0.1:{port} (meta_hdfs_port, the port "
        f"for Hadoop's client; 0 = off)")


# --------------------------------------------------------------------------- Hadoop's FsShell


@requires_java
@pytest.mark.slow
def test_fsshell_reads_what_the_python_client_wrote(cluster, tmp_path):
    conf = write_conf(tmp_path / "conf")
    address = "%s:%d" % hdfs_address(cluster)

    def shell(*args):
        proc = fs_shell(address, *args, conf=conf, user="root")
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    code, out, err = shell("-ls", "-R", "/d")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert [(r[0], r[2], r[4], r[-1]) for r in rows] == [
        ("-rw-r--r--", "root", str(len(DATA)), "/d/f"),
        ("drwxr-xr-x", "root", "0", "/d/sub"),
        ("-rw-r--r--", "root", "4", "/d/sub/small")]

    code, out, err = shell("-stat", "%n %b %F %o %u %g", "/d/f", "/d/none")
    assert code == 1
    assert out.splitlines() == [f"f {len(DATA)} regular file {1 << 20} root supergroup"]
    assert "`/d/none': No such file or directory" in err

    assert shell("-test", "-d", "/d")[0] == 0
    assert shell("-test", "-f", "/d")[0] == 1
    assert shell("-test", "-e", "/d/none")[0] == 1

    code, out, err = shell("-du", "-s", "/d")
    assert code == 0, err
    assert out.split() == [str(len(DATA) + 4), str(3 * (len(DATA) + 4)), "/d"]

    code, out, err = shell("-count", "-q", "/d")
    assert code == 0, err
    assert out.split() == ["100", "96", "none", "inf", "2", "2", str(len(DATA) + 4), "/d"]

    code, out, err = shell("-df", "/")
    assert code == 0, err
    assert out.splitlines()[1].split()[0] == f"hdfs://{address}"


# --------------------------------------------------------------------------- secure, loopback

# runs as another user, with the system's Python (no project code): sends stdin's bytes on a
# new connection and copies what comes back to stdout until the server closes it or
# argv[3] answer frames came
_RELAY = """
import socket, struct, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
sock.sendall(sys.stdin.buffer.read())
got, want = b"", int(sys.argv[3])
def frames(data):
    n = pos = 0
    while pos + 4 <= len(data):
        pos += 4 + struct.unpack(">i", data[pos:pos + 4])[0]
        n += pos <= len(data)
    return n
while frames(got) < want:
    chunk = sock.recv(65536)
    if not chunk:
        break
    got += chunk
sys.stdout.buffer.write(got)
"""
NOBODY = 65534


def as_nobody(cluster, data: bytes, frames: int) -> list:
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", _RELAY, *map(str, hdfs_address(cluster)), str(frames)],
        input=data, capture_output=True, timeout=60, user=NOBODY, group=NOBODY,
        extra_groups=[], cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()
    return answers(proc.stdout)


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("hdfs-ipc-secure"), n_storage=0, settings={
        "security": "secure", "meta_hdfs_port": free_port()})
    c.start()
    try:
        with c.client() as client:
            client.mkdirs("/private", permission=0o700)
            client.write_file("/private/x", b"secret")
        yield c
    finally:
        c.stop()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="runs a client as another user: needs root and a system python3")
async def test_secure_loopback_clients_are_the_user_owning_their_socket(secure_cluster):
    cluster = secure_cluster
    opening = preamble()
    probes = (call_frame(0, "getFileInfo", pb.GetFileInfoRequestProto(src="/private/x")) +
              call_frame(1, "getFileInfo", pb.GetFileInfoRequestProto(src="/")))
    # the kernel says nobody: claiming root is refused before any call
    (header, _), = as_nobody(cluster, opening + context("root") + probes, 2)
    assert (header.status, header.errorDetail) == (H.FATAL, H.FATAL_UNAUTHORIZED)
    assert header.exceptionClassName == "org.apache.hadoop.security.AccessControlException"
    assert "nobody may not act as root" in header.errorMsg
    # as itself it is served, as nobody: root's private folder is closed to it
    got = {h.callId: (h, body) for h, body in
           as_nobody(cluster, opening + context("nobody") + probes, 2)}
    denied, root = got[0][0], got[1]
    assert (denied.status, denied.exceptionClassName) == \
        (H.ERROR, "org.apache.hadoop.security.AccessControlException")
    assert root[0].status == H.SUCCESS
    assert parse(pb.GetFileInfoResponseProto, root[1], "x").fs.fileType == 1

    async with trio.open_nursery() as nursery:
        # root (the superuser) may act for another user, who then is that user
        alice = await IpcClient.connect(*hdfs_address(cluster), nursery, user="alice")
        with pytest.raises(RemoteError) as caught:
            await file_info(alice, "/private/x")
        assert caught.value.class_name.endswith("AccessControlException")
        await alice.aclose()
        client = await IpcClient.connect(*hdfs_address(cluster), nursery, user="root",
                                         sasl=True)   # on loopback simple may follow SASL
        assert (await file_info(client, "/private/x")).fs.length == 6
        await client.aclose()


@requires_java
@pytest.mark.slow
def test_fsshell_on_loopback_under_secure_needs_no_set_up(secure_cluster, tmp_path):
    """Hadoop's client as it comes (simple, no token) on the metadata server's host: the
    kernel names its user (root here, the superuser, who may act for the name
    HADOOP_USER_NAME gives)."""
    conf = write_conf(tmp_path / "conf")
    address = "%s:%d" % hdfs_address(secure_cluster)
    proc = fs_shell(address, "-ls", "/private", conf=conf)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().split()[-1] == "/private/x"
    proc = fs_shell(address, "-ls", "/private", conf=conf, user="nobody")
    assert proc.returncode == 1
    assert "Permission denied: user=nobody" in proc.stderr.decode()


# --------------------------------------------------------------------------- the generic server


class _Held:
    """A translator whose ``hold`` calls wait for the test's word; ``echo`` answers at once."""

    PROTOCOL = exceptions_protocol()
    CALLS = {"hold": (pb.GetFileInfoRequestProto, pb.GetFileInfoResponseProto),
             "echo": (pb.GetFileInfoRequestProto, pb.GetFileInfoResponseProto)}

    def __init__(self):
        self.release = trio.Event()
        self.holding = 0

    async def hold(self, ctx, request):
        self.holding += 1
        await self.release.wait()
        return pb.GetFileInfoResponseProto()

    async def echo(self, ctx, request):
        return pb.GetFileInfoResponseProto(fs=dict(
            fileType=1, path=ctx.user.encode(), length=ctx.call_id, permission={"perm": 0},
            owner=ctx.client_id, group="", modification_time=0, access_time=0))


async def _serving(nursery, server) -> tuple[str, int]:
    from fs.rpc import serve_tcp
    return await nursery.start(serve_tcp, server.serve, "127.0.0.1", 0)


async def test_calls_in_flight_and_request_bytes_are_bounded_per_server():
    from fs.hdfs.ipc_server import IpcServer
    from fs.limits import ByteBudget

    held = _Held()
    budget = ByteBudget(4096)
    server = IpcServer([held], max_calls=2, budget=budget, frame_timeout=30)
    async with trio.open_nursery() as nursery:
        address = await _serving(nursery, server)
        client = await IpcClient.connect(*address, nursery, user="ann")
        answered = []

        async def call(method, src="/", label=None):
            await client.call(method, pb.GetFileInfoRequestProto(src=src),
                              pb.GetFileInfoResponseProto)
            answered.append(label or method)

        for _ in range(2):
            nursery.start_soon(call, "hold")
        assert await wait_until(lambda: held.holding == 2)
        nursery.start_soon(call, "echo")
        # two calls run: the reader waits for one to end, so the third is not read
        await trio.sleep(0.2)   # fixed-sleep: an absence (no answer) has no event to wait for
        assert answered == [] and held.holding == 2
        held.release.set()
        assert await wait_until(lambda: len(answered) == 3)
        assert sorted(answered) == ["echo", "hold", "hold"]

        # a frame larger than the server's whole budget is refused unread (FATAL)
        with pytest.raises(RemoteError) as caught:
            await client.call("echo", pb.GetFileInfoRequestProto(src="/" + "x" * 5000),
                              pb.GetFileInfoResponseProto)
        assert caught.value.fatal and "request buffer" in caught.value.message
        assert budget.used == 0

        # the call context: the connection's user, the call id, the client id in hex
        other = await IpcClient.connect(*address, nursery, user="bob",
                                        client_id=bytes(range(16)))
        echoed = (await other.call("echo", pb.GetFileInfoRequestProto(src="/"),
                                   pb.GetFileInfoResponseProto)).fs
        assert (echoed.path, echoed.length, echoed.owner) == \
            (b"bob", 0, bytes(range(16)).hex())
        await other.aclose()
        nursery.cancel_scope.cancel()


async def test_an_answer_the_socket_cannot_take_at_once_keeps_its_order():
    """An answer larger than the socket's buffers goes out partly at once and the rest when
    the peer reads; an answer finished meanwhile waits behind it, whole."""
    from fs.hdfs.ipc_server import IpcServer

    class Big(_Held):
        CALLS = {**_Held.CALLS, "big": (pb.GetFileInfoRequestProto, pb.GetFileInfoResponseProto)}

        async def big(self, ctx, request):
            return pb.GetFileInfoResponseProto(fs=dict(
                fileType=1, path=b"x" * (8 << 20), length=0, permission={"perm": 0},
                owner="", group="", modification_time=0, access_time=0))

    translator = Big()
    server = IpcServer([translator])
    async with trio.open_nursery() as nursery:
        address = await _serving(nursery, server)
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            request = pb.GetFileInfoRequestProto(src="/")
            await stream.send_all(preamble() + context("ann") + call_frame(1, "big", request)
                                  + call_frame(2, "hold", request))
            assert await wait_until(lambda: translator.holding == 1)
            with trio.fail_after(30):
                raw = await stream.receive_some(4)   # the big answer is on its way ...
                # fixed-sleep: ... and the server's socket fills while the peer reads no
                # more; there is no event to wait for
                await trio.sleep(0.3)
                translator.release.set()             # the second answer is ready now
                while not (_whole(raw) and len(answers(raw)) == 2):
                    raw += await stream.receive_some(1 << 20)
        got = answers(raw)
        assert [header.callId for header, _ in got] == [1, 2]
        assert pb.GetFileInfoResponseProto.FromString(got[0][1]).fs.path == b"x" * (8 << 20)
        nursery.cancel_scope.cancel()


def _whole(raw: bytes) -> bool:
    """``raw`` ends at a frame boundary."""
    pos = 0
    while pos + 4 <= len(raw):
        pos += 4 + struct.unpack(">i", raw[pos:pos + 4])[0]
    return pos == len(raw)


async def test_an_idle_connection_is_closed_and_the_client_told_nothing():
    from fs.hdfs.ipc_server import IpcServer

    server = IpcServer([_Held()], idle_timeout=0.3)
    async with trio.open_nursery() as nursery:
        address = await _serving(nursery, server)
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(preamble() + context("ann"))
            with trio.fail_after(10):
                assert await stream.receive_some(100) == b""
        nursery.cancel_scope.cancel()
