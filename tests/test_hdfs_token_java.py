"""Hadoop's own classes (PySpark's jars) against fs.hdfs.tokenfile and fs.hdfs.sasl: the
token storage file read and written by ``Credentials``, the identifier decoded by
``DelegationTokenIdentifier``, the token selected by service as the IPC client selects
it, Java's DIGEST-MD5 client with Hadoop's callback handler, and FsShell with
``HADOOP_TOKEN_FILE_LOCATION`` negotiating SASL with a stand-in IPC endpoint."""

from __future__ import annotations

import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from fs import delegation
from fs.delegation import TokenId
from fs.hdfs import sasl, tokenfile
from fs.hdfs.ipc import frame, next_delimited
from fs.hdfs.pb.ipc_pb2 import (IpcConnectionContextProto, RequestHeaderProto,
                                RpcRequestHeaderProto, RpcResponseHeaderProto, RpcSaslProto)

sys.path.insert(0, str(Path(__file__).parent))
from hadoopkit import fs_shell, requires_java, write_conf  # noqa: E402

pytestmark = requires_java

MASTER = delegation.master_key(b"j" * 32)
TOKEN = TokenId(5, "alice", "bob", 1732870000.123, 1733474800.456)
PASSWORD = delegation.password(MASTER, TOKEN)
SERVICE = "127.0.0.1:9000"


def lookup(identifier: bytes):
    token = tokenfile.decode_identifier(identifier)
    return delegation.password(MASTER, token), token.owner


@pytest.fixture(scope="module")
def spark():
    from sparkkit import run_spark
    yield from run_spark("hdfs-token-java")


@pytest.fixture(scope="module")
def token_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "alice.hdts"
    tokenfile.Credentials({SERVICE: tokenfile.delegation_token(TOKEN, PASSWORD, SERVICE)}
                          ).save(str(path))
    return path


def java_token(spark, path: Path):
    jvm = spark._jvm
    creds = jvm.org.apache.hadoop.security.Credentials.readTokenStorageFile(
        jvm.java.io.File(str(path)), jvm.org.apache.hadoop.conf.Configuration())
    assert (creds.numberOfTokens(), creds.numberOfSecretKeys()) == (1, 0)
    return creds, creds.getAllTokens().toArray()[0]


def test_hadoop_reads_the_token_file_and_decodes_the_identifier(spark, token_path):
    jvm = spark._jvm
    creds, token = java_token(spark, token_path)
    assert (token.getKind().toString(), token.getService().toString()) == (
        "HDFS_DELEGATION_TOKEN", SERVICE)
    assert bytes(token.getIdentifier()) == tokenfile.encode_identifier(TOKEN)
    assert bytes(token.getPassword()) == PASSWORD
    ident = token.decodeIdentifier()
    assert ident.getClass().getName() == \
        "org.apache.hadoop.hdfs.security.token.delegation.DelegationTokenIdentifier"
    assert (ident.getOwner().toString(), ident.getRenewer().toString(),
            ident.getRealUser().toString()) == ("alice", "bob", "")
    assert (ident.getIssueDate(), ident.getMaxDate(), ident.getSequenceNumber(),
            ident.getMasterKeyId()) == (1732870000123, 1733474800456, 5, 0)
    assert ident.getUser().getShortUserName() == "alice"
    # the IPC client's choice: kind HDFS_DELEGATION_TOKEN and service = ip:port of the server
    # (SecurityUtil.buildTokenService cannot be reached by py4j here: its reflection trips
    # on a class the shaded jar leaves out; FsShell below shows the service matches)
    service = jvm.org.apache.hadoop.io.Text(SERVICE)
    selector = jvm.org.apache.hadoop.hdfs.security.token.delegation.DelegationTokenSelector()
    chosen = selector.selectToken(service, creds.getAllTokens())
    assert chosen is not None and chosen.equals(token)


def test_what_hadoop_writes_is_what_we_write(spark, token_path, tmp_path):
    """Hadoop writes the same bytes for the same token, and we read what it writes."""
    _, token = java_token(spark, token_path)
    jvm = spark._jvm
    creds = jvm.org.apache.hadoop.security.Credentials()
    creds.addToken(jvm.org.apache.hadoop.io.Text(SERVICE), token)
    creds.addSecretKey(jvm.org.apache.hadoop.io.Text("k"), bytearray(b"shh"))
    out = tmp_path / "java.hdts"
    conf = jvm.org.apache.hadoop.conf.Configuration()
    creds.writeTokenStorageFile(jvm.org.apache.hadoop.fs.Path(f"file://{out}"), conf)
    ours = tokenfile.Credentials.load(str(token_path))
    theirs = tokenfile.Credentials.load(str(out))
    assert theirs == tokenfile.Credentials(ours.tokens, {"k": b"shh"})
    assert tokenfile.Credentials(theirs.tokens).encode() == token_path.read_bytes()


def java_digest_client(spark, token):
    """Java's DIGEST-MD5 client as Hadoop's SaslRpcClient makes it for a TOKEN auth (the
    callback handler is Hadoop's own, package-private: reached by reflection)."""
    jvm, gateway = spark._jvm, spark._sc._gateway
    cls = jvm.java.lang.Class.forName(
        "org.apache.hadoop.security.SaslRpcClient$SaslClientCallbackHandler")
    ctor = cls.getConstructors()[0]
    ctor.setAccessible(True)
    args = gateway.new_array(jvm.java.lang.Object, 1)
    args[0] = token
    mechanisms = gateway.new_array(jvm.java.lang.String, 1)
    mechanisms[0] = "DIGEST-MD5"
    props = jvm.java.util.HashMap()
    props.put("javax.security.sasl.qop", "auth")
    return jvm.javax.security.sasl.Sasl.createSaslClient(
        mechanisms, None, "", "default", props, ctor.newInstance(args))


def run_java_client(spark, token) -> tuple[sasl.SaslNegotiation, object, RpcSaslProto]:
    neg = sasl.SaslNegotiation(lookup)
    offer = neg.step(RpcSaslProto(state=RpcSaslProto.NEGOTIATE))
    client = java_digest_client(spark, token)
    auth = RpcSaslProto.SaslAuth()
    auth.CopyFrom(offer.auths[0])
    auth.ClearField("challenge")
    response = bytes(client.evaluateChallenge(bytearray(offer.auths[0].challenge)))
    return neg, client, RpcSaslProto(state=RpcSaslProto.INITIATE, auths=[auth],
                                     token=response)


def test_javas_digest_client_authenticates_and_checks_rspauth(spark, token_path):
    _, token = java_token(spark, token_path)
    neg, client, initiate = run_java_client(spark, token)
    answer = neg.step(initiate)
    assert answer.state == RpcSaslProto.SUCCESS
    assert neg.authenticated.user == "alice"
    # Java checks the server's rspauth (it throws on a wrong one) and completes
    assert client.evaluateChallenge(bytearray(answer.token)) is None
    assert client.isComplete()


def test_javas_digest_client_rejects_a_server_without_the_password(spark, token_path):
    _, token = java_token(spark, token_path)
    neg, client, initiate = run_java_client(spark, token)
    neg.step(initiate)
    from py4j.protocol import Py4JJavaError
    with pytest.raises(Py4JJavaError, match="SaslException"):
        client.evaluateChallenge(bytearray(b"rspauth=" + b"0" * 32))


def test_javas_digest_client_with_a_forged_password_is_refused(spark, token_path):
    jvm = spark._jvm
    _, token = java_token(spark, token_path)
    forged = jvm.org.apache.hadoop.security.token.Token(
        token.getIdentifier(), bytearray(b"\0" * 32), token.getKind(), token.getService())
    neg, _, initiate = run_java_client(spark, forged)
    with pytest.raises(sasl.SaslRefused, match="wrong response") as exc:
        neg.step(initiate)
    assert exc.value.java_class == sasl.INVALID_TOKEN


# ------------------------------------------------ FsShell against a stand-in IPC endpoint
def _answer(sock, header: RpcResponseHeaderProto, *body) -> None:
    sock.sendall(frame(header, *body))


def _read_exact(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"peer closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def serve_one_connection(listener, seen: dict) -> None:
    """Hadoop IPC as far as SASL and the connection context, then every call is answered
    with an error naming the authenticated user (FsShell prints it)."""
    conn, _ = listener.accept()
    conn.settimeout(60)
    neg = sasl.SaslNegotiation(lookup)
    try:
        seen["preamble"] = _read_exact(conn, 7)
        while True:
            (n,) = struct.unpack(">I", _read_exact(conn, 4))
            payload = _read_exact(conn, n)
            raw, pos = next_delimited(payload, 0)
            header = RpcRequestHeaderProto.FromString(raw)
            body, pos = next_delimited(payload, pos)
            if header.callId == sasl.CALL_ID:
                message = RpcSaslProto.FromString(body)
                seen.setdefault("sasl", []).append(message)
                try:
                    reply = neg.step(message)
                except sasl.SaslRefused as exc:
                    _answer(conn, RpcResponseHeaderProto(
                        callId=sasl.FAILED_CALL_ID & 0xFFFFFFFF, status=2, errorDetail=15,
                        exceptionClassName=exc.java_class, errorMsg=str(exc)))
                    return
                seen.setdefault("replies", []).append(reply)
                _answer(conn, RpcResponseHeaderProto(callId=sasl.CALL_ID & 0xFFFFFFFF,
                                                     status=0), reply)
            elif header.callId == -3:
                context = IpcConnectionContextProto.FromString(body)
                seen["context"] = context
                neg.authenticated.check_claim(context.userInfo.effectiveUser,
                                              context.userInfo.realUser)
            else:
                seen["method"] = RequestHeaderProto.FromString(body).methodName
                _answer(conn, RpcResponseHeaderProto(
                    callId=header.callId, status=1, errorDetail=1, clientId=header.clientId,
                    retryCount=header.retryCount,
                    exceptionClassName="org.apache.hadoop.security.AccessControlException",
                    errorMsg=f"stand-in: authenticated as {neg.authenticated.user}"))
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


def fsshell_ls(tmp_path, password: bytes) -> tuple[dict, str]:
    """FsShell -ls / with a token file holding ``password`` against the stand-in: what the
    stand-in saw and FsShell's stderr."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(90)
    service = f"127.0.0.1:{listener.getsockname()[1]}"
    path = tmp_path / "fsshell.hdts"
    tokenfile.Credentials({service: tokenfile.delegation_token(TOKEN, password, service)}
                          ).save(str(path))
    seen: dict = {}
    server = threading.Thread(target=serve_one_connection, args=(listener, seen), daemon=True)
    server.start()
    try:
        r = fs_shell(service, "-ls", "/", conf=write_conf(tmp_path / "conf", {
            "ipc.client.connect.max.retries": "0"}),
            env={"HADOOP_TOKEN_FILE_LOCATION": str(path)}, user="root")
    finally:
        server.join(90)
        listener.close()
    assert r.returncode != 0
    return seen, r.stderr.decode(errors="replace")


def test_fsshell_with_hadoop_token_file_location_runs_token_sasl(tmp_path):
    seen, stderr = fsshell_ls(tmp_path, PASSWORD)
    assert seen["preamble"] == b"hrpc\x09\x00\xdf"      # SASL, because the UGI has a token
    states = [m.state for m in seen["sasl"]]
    assert states == [RpcSaslProto.NEGOTIATE, RpcSaslProto.INITIATE], seen["sasl"]
    initiate = seen["sasl"][1]
    assert not initiate.auths[0].HasField("challenge")
    assert [m.state for m in seen["replies"]] == [RpcSaslProto.NEGOTIATE, RpcSaslProto.SUCCESS]
    # with a token the connection itself says who the user is: no user in the context
    assert not seen["context"].userInfo.effectiveUser
    assert seen["method"] == "getFileInfo"
    assert "stand-in: authenticated as alice" in stderr, stderr


def test_fsshell_with_a_forged_token_gets_the_refusal(tmp_path):
    seen, stderr = fsshell_ls(tmp_path, b"\0" * 32)
    assert [m.state for m in seen["sasl"]] == [RpcSaslProto.NEGOTIATE, RpcSaslProto.INITIATE]
    assert "context" not in seen and "method" not in seen
    assert "ls: DIGEST-MD5: wrong response" in stderr, stderr
