"""Users cannot be impersonated (security = secure): local clients are who the kernel says,
TCP clients need a delegation token, only proxy users act for others.

Real servers on loopback; the "other user" is a real process running as ``nobody`` (a
stdlib-only script under the system's python3, which nobody can run: the project's
interpreter may sit under /root). It speaks the wire protocol with frames this test encodes.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import trio

from fs import delegation, errors
from fs.client import AsyncClient
from fs.delegation import TokenFile, TokenId
from fs.framing import LENGTH, FramedStream, encode_frame, unpackb
from fs.hdfs import tokenfile
from fs.rpc import ACTING_FOR, parse_address

from harness import inprocess_cluster, make_test_config

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"

# connects to the abstract socket argv[1], sends stdin, prints the hex of argv[2] frames back
_LOCAL_PEER = r"""
import socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(20)
sock.connect(b"\0" + sys.argv[1].encode())
sock.sendall(sys.stdin.buffer.read())
want, data, got = int(sys.argv[2]), b"", 0
while got < want:
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
    got, at = 0, 0
    while len(data) >= at + 4:
        n = struct.unpack(">I", data[at:at + 4])[0]
        if len(data) < at + 4 + n:
            break
        at += 4 + n
        got += 1
print(data.hex())
"""


def _frames(raw: bytes) -> list:
    out, at = [], 0
    while at + LENGTH.size <= len(raw):
        (n,) = LENGTH.unpack_from(raw, at)
        out.append(unpackb(raw[at + LENGTH.size:at + LENGTH.size + n]))
        at += LENGTH.size + n
    return out


async def as_nobody(address: str, hello: dict, requests: list, replies: int) -> list:
    """The frames the metadata server sends back to a process of user nobody that says
    ``hello`` and sends ``requests`` on the server's local socket."""
    port = parse_address(address)[1]
    payload = encode_frame(hello) + b"".join(encode_frame(r) for r in requests)
    run = functools.partial(
        subprocess.run, [SYSTEM_PYTHON, "-c", _LOCAL_PEER, f"leasefs-meta-{port}",
                         str(replies)],
        input=payload, user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True,
        timeout=60, cwd="/")
    result = await trio.to_thread.run_sync(run)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    # replies come in the order calls finish: by call id (a connection's error first)
    return sorted(_frames(bytes.fromhex(result.stdout.decode().strip())),
                  key=lambda reply: -1 if reply[0] is None else reply[0])


def hello(user: str | None = None, groups=()) -> dict:
    out = {"hello": "leasefs", "version": 1, "client_id": "probe"}
    if user is not None:
        out.update(user=user, groups=list(groups))
    return out


async def raw_tcp(address: str, first: dict, requests: list) -> list:
    """A plain TCP peer: its hello, its requests, one answer each (or the connection's
    error)."""
    host, port = parse_address(address)
    stream = FramedStream(await trio.open_tcp_stream(host, port))
    answers = []
    try:
        await stream.send_frame(first)
        for request in requests:
            await stream.send_frame(request)
            with trio.fail_after(10):
                answers.append(await stream.receive_frame())
    finally:
        await stream.aclose()
    return answers


def remote_config(cluster, token_path: str | None):
    """A client's settings as on another machine: no local socket, maybe a token."""
    return cluster.config.replace(meta_socket="", token_file=token_path or "")


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root (to run a process as nobody) and the system python3")


@pytest.mark.cluster(n_storage=0)
async def test_local_clients_are_the_user_the_kernel_names(cluster):
    """Over the local socket the kernel's uid decides: a process of nobody that states
    ``root`` (or the supergroup) is refused or stays nobody; acting for another user needs
    a proxy user; root (the superuser, who runs the metadata server) may act for others."""
    async with cluster.client() as root:
        await root.mkdirs("/pub", permission=0o777)
        await root.mkdirs("/private", permission=0o700)
        address = cluster.meta_address
        # nobody as itself: its calls are nobody's
        [r1, r2] = await as_nobody(address, hello("nobody", ["nogroup"]), [
            [1, "mkdirs", {"path": "/pub/by-nobody"}],
            [2, "mkdirs", {"path": "/private/x"}]], 2)
        assert r1[:2] == [1, True], r1
        assert r2[1] is False and r2[2]["type"] == "PermissionDenied"
        assert "user=nobody" in r2[2]["message"]
        assert (await root.get_file_status("/pub/by-nobody")).owner == "nobody"
        # nobody claiming root at the hello: the connection is refused
        [refusal] = await as_nobody(address, hello("root", ["root"]), [
            [1, "mkdirs", {"path": "/private/y"}]], 1)
        assert refusal[:2] == [None, False]
        assert refusal[2]["type"] == "AuthenticationFailed"
        assert "user nobody may not act as root" in refusal[2]["message"]
        # nobody stating the supergroup as its own group: groups come from the system
        [r] = await as_nobody(address, hello("nobody", ["supergroup"]), [
            [1, "safemode", {"action": "enter"}]], 1)
        assert r[1] is False and r[2]["type"] == "PermissionDenied", r
        # a request acting for root, from nobody (not a proxy user)
        [r] = await as_nobody(address, hello("nobody"), [
            [1, "mkdirs", {"path": "/private/z"}, {"user": "root", "groups": ["root"]}]
        ], 1)
        assert r[1] is False and r[2]["type"] == "PermissionDenied"
        assert "user nobody may not act for root" in r[2]["message"]
        assert not await root.exists("/private/y")
        assert not await root.exists("/private/z")
        assert not (await root.safemode("get"))["on"]
        # root, the superuser, acts for nobody: nobody's permissions apply
        token = ACTING_FOR.set({"user": "nobody", "groups": ["nogroup"]})
        try:
            with pytest.raises(errors.PermissionDenied, match="user=nobody"):
                await root.mkdirs("/private/w")
            await root.mkdirs("/pub/acted")
        finally:
            ACTING_FOR.reset(token)
        assert (await root.get_file_status("/pub/acted")).owner == "nobody"
        assert not await root.exists("/private/w")


@pytest.mark.cluster(n_storage=0, proxy_users="nobody=daemon")
async def test_a_proxy_user_acts_only_for_the_users_it_is_given(cluster):
    """``proxy_users = nobody=daemon``: nobody may act for daemon (whose permissions then
    apply), not for root or anyone else."""
    async with cluster.client() as root:
        await root.mkdirs("/pub", permission=0o777)
        address = cluster.meta_address
        replies = await as_nobody(address, hello("nobody"), [
            [1, "mkdirs", {"path": "/pub/for-daemon"}, {"user": "daemon"}],
            [2, "mkdirs", {"path": "/pub/for-root"}, {"user": "root"}],
            [3, "mkdirs", {"path": "/pub/for-bin"}, {"user": "bin"}]], 3)
        by_id = {r[0]: r for r in replies}
        assert by_id[1][1] is True, by_id[1]
        for call in (2, 3):
            assert by_id[call][1] is False
            assert by_id[call][2]["type"] == "PermissionDenied"
            assert "may not act for" in by_id[call][2]["message"]
        assert (await root.get_file_status("/pub/for-daemon")).owner == "daemon"
        assert not await root.exists("/pub/for-root")
        assert not await root.exists("/pub/for-bin")


@pytest.mark.cluster(n_storage=0)
async def test_tcp_connections_do_nothing_before_they_authenticate(cluster):
    """A peer that only reaches the TCP port, whatever it states, is refused every call but
    the two authentications: no namespace call, no report, no safe mode, no block-server
    call, no token."""
    async with cluster.client() as root:
        await root.mkdirs("/private", permission=0o700)
        answers = await raw_tcp(cluster.meta_address, hello("root", ["supergroup"]), [
            [1, "mkdirs", {"path": "/private/x"}],
            [2, "get_file_info", {"path": "/private"}],
            [3, "report", {}],
            [4, "safemode", {"action": "enter"}],
            [5, "get_delegation_token", {}],
            [6, "register_storage", {"node_id": "fake", "address": "127.0.0.1:1"}],
            [7, "heartbeat", {"node_id": "fake"}]])
        for call_id, ok, error in answers:
            assert not ok and error["type"] == "AuthenticationRequired", (call_id, error)
            assert "has not authenticated" in error["message"]
        [(call_id, ok, nonce)] = await raw_tcp(cluster.meta_address, hello("root"),
                                               [[1, "token_challenge", {}]])
        assert ok and isinstance(nonce, bytes) and len(nonce) == 32
        # the same client without a token, as on another machine
        with pytest.raises(errors.AuthenticationRequired):
            async with AsyncClient(cluster.meta_address,
                                   config=remote_config(cluster, None)) as remote:
                await remote.list_status("/")
        assert not await root.exists("/private/x")
        assert not (await root.safemode("get"))["on"]
        assert (await root.report())["live_nodes"] == []


@pytest.mark.cluster(n_storage=0, delegation_token_renew_interval=4.0)
async def test_delegation_tokens_fetch_use_renew_cancel_expire_and_survive_restarts(
        tmp_path, cluster):
    """nobody fetches a token on the local socket; a TCP client with it is nobody (and only
    that); forged, altered, replayed, cancelled and expired tokens are refused; renewal is
    the renewer's; a token and its cancellation outlive a restart of the metadata server."""
    address = cluster.meta_address
    async with cluster.client() as root:
        await root.mkdirs("/pub", permission=0o777)
        await root.mkdirs("/private", permission=0o700)
    [(_, ok, got)] = await as_nobody(address, hello("nobody"), [
        [1, "get_delegation_token", {}]], 1)
    assert ok, got
    token = TokenFile(TokenId.from_wire(got["id"]), bytes(got["password"]), address)
    assert (token.token.owner, token.token.renewer) == ("nobody", "nobody")
    path = str(tmp_path / "nobody.token")
    token.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600

    # with the token over TCP: nobody, whatever the hello states
    async with AsyncClient(address, config=remote_config(cluster, path),
                           user="root", groups=["supergroup"]) as remote:
        await remote.mkdirs("/pub/remote")
        with pytest.raises(errors.PermissionDenied, match="user=nobody"):
            await remote.mkdirs("/private/remote")
        with pytest.raises(errors.PermissionDenied):
            await remote.safemode("enter")
        # a token does not fetch another (as in HDFS)
        with pytest.raises(errors.AuthenticationFailed, match="local socket"):
            await remote.rpc.call("get_delegation_token", {})
    async with cluster.client() as root:
        assert (await root.get_file_status("/pub/remote")).owner == "nobody"

    async def refused(bad: TokenFile, match: str):
        bad_path = str(tmp_path / "bad.token")
        bad.save(bad_path)
        with pytest.raises(errors.AuthenticationFailed, match=match):
            async with AsyncClient(address, config=remote_config(
                    cluster, bad_path)) as remote:
                await remote.list_status("/")

    # forged password; identifier altered to another owner with the same password
    await refused(TokenFile(token.token, b"\x01" * 32, address), "wrong proof")
    await refused(TokenFile(TokenId(token.token.seq, "root", "root", token.token.issued,
                                    token.token.max_date), token.secret, address),
                  "not known")
    await refused(TokenFile(TokenId(99, "nobody", "nobody", token.token.issued,
                                    token.token.max_date), token.secret, address),
                  "not known")

    # a proof recorded on one connection is worth nothing on another
    host, port = parse_address(address)
    first = FramedStream(await trio.open_tcp_stream(host, port))
    await first.send_frame(hello())
    await first.send_frame([1, "token_challenge", {}])
    [_, _, nonce] = await first.receive_frame()
    client_nonce = b"c" * 32
    proof = delegation.client_proof(token.secret, nonce, client_nonce)
    auth = [2, "token_authenticate", {"token": token.token.to_wire(),
                                      "client_nonce": client_nonce, "proof": proof}]
    await first.send_frame(auth)
    [_, ok, _] = await first.receive_frame()
    assert ok
    await first.aclose()
    replay = await raw_tcp(address, hello(), [[1, "token_challenge", {}], auth,
                                              [3, "list_status", {"path": "/"}]])
    assert replay[1][1] is False and replay[1][2]["type"] == "AuthenticationFailed"
    assert replay[2][2]["type"] == "AuthenticationRequired"

    # renewal: only the renewer (nobody); root is refused
    async with cluster.client() as root:
        with pytest.raises(errors.PermissionDenied, match="not the renewer"):
            await root.rpc.call("renew_delegation_token", {"token": token.token.to_wire()})
    [(_, ok, expiry)] = await as_nobody(address, hello("nobody"), [
        [1, "renew_delegation_token", {"token": token.token.to_wire()}]], 1)
    assert ok and expiry > token.token.issued

    # the token outlives a restart of the metadata server
    await cluster.stop_meta()
    await cluster.start_meta()
    async with AsyncClient(address, config=remote_config(cluster, path)) as remote:
        assert [s.name for s in await remote.list_status("/pub")] == ["remote"]

    # cancelled by its owner: refused at once and after a restart
    [(_, ok, _)] = await as_nobody(address, hello("nobody"), [
        [1, "cancel_delegation_token", {"token": token.token.to_wire()}]], 1)
    assert ok
    await refused(token, "not known")
    await cluster.stop_meta()
    await cluster.start_meta()
    await refused(token, "not known")

    # expiry: a fresh token unrenewed past its 4 s renew interval
    [(_, ok, got)] = await as_nobody(address, hello("nobody"), [
        [1, "get_delegation_token", {}]], 1)
    second = TokenFile(TokenId.from_wire(got["id"]), bytes(got["password"]), address)
    second_path = str(tmp_path / "second.token")
    second.save(second_path)
    async with AsyncClient(address, config=remote_config(cluster, second_path)) as remote:
        await remote.list_status("/")
    # fixed-sleep: until the token's wall-clock expiry passed (checked on the real clock)
    await trio.sleep(max(0.0, got["expiry"] - time.time()) + 0.5)
    await refused(second, "expired")


@pytest.mark.cluster(n_storage=0)
async def test_token_command_line(tmp_path, cluster):
    """``leasefs token fetch/print/renew/cancel`` against a running metadata server, and a
    client elsewhere (no local socket) using the file."""
    env = {**os.environ, "LEASEFS_META": cluster.meta_address}

    def leasefs(*args, extra_env=None):
        return subprocess.run([sys.executable, "-m", "tools", *args],
                              env={**env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=60)

    async def run(*args, extra_env=None):
        return await trio.to_thread.run_sync(
            functools.partial(leasefs, *args, extra_env=extra_env))

    path = str(tmp_path / "cli.token")
    r = await run("token", "fetch", path)
    assert r.returncode == 0 and "Fetched token" in r.stdout, r.stderr
    r = await run("token", "print", path)
    assert "renewer root" in r.stdout
    remote = {"LEASEFS_TOKEN_FILE": path, "LEASEFS_META_SOCKET": ""}
    r = await run("mkdir", "/made-remotely", extra_env=remote)
    assert r.returncode == 0, r.stderr
    r = await run("ls", "/", extra_env={"LEASEFS_META_SOCKET": ""})
    assert r.returncode == 1 and "has not authenticated" in r.stderr
    assert "Traceback" not in r.stderr
    r = await run("token", "renew", path)
    assert r.returncode == 0 and "Renewed" in r.stdout, r.stderr
    r = await run("token", "cancel", path)
    assert r.returncode == 0 and "Cancelled" in r.stdout, r.stderr
    r = await run("ls", "/", extra_env=remote)
    assert r.returncode == 1 and "not known" in r.stderr and "Traceback" not in r.stderr
    r = await run("token", "print", str(tmp_path / "missing.token"))
    assert r.returncode == 1 and "missing.token" in r.stderr


@pytest.mark.cluster(n_storage=0)
async def test_token_fetch_in_hadoops_format(tmp_path, cluster):
    """``leasefs token fetch --hadoop``: Hadoop's token file for the metadata server's HDFS
    address, whose identifier maps back to the very token the server issued (renew and
    cancel with that file find it)."""
    env = {**os.environ, "LEASEFS_META": cluster.meta_address}

    def leasefs(*args):
        return subprocess.run([sys.executable, "-m", "tools", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    async def run(*args):
        return await trio.to_thread.run_sync(functools.partial(leasefs, *args))

    path = str(tmp_path / "hadoop.token")
    r = await run("token", "fetch", path, "--hadoop", "--hdfs-address", "localhost:9123")
    assert r.returncode == 0 and "for hdfs://127.0.0.1:9123" in r.stdout, r.stderr
    assert os.stat(path).st_mode & 0o777 == 0o600
    [(alias, token)] = tokenfile.Credentials.load(path).tokens.items()
    assert (alias, token.kind, token.service) == (
        "127.0.0.1:9123", "HDFS_DELEGATION_TOKEN", "127.0.0.1:9123")
    decoded = tokenfile.decode_identifier(token.identifier)
    assert (decoded.owner, decoded.renewer) == ("root", "root") and len(token.password) == 32
    r = await run("token", "print", path, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["seq"] == decoded.seq, r.stderr
    r = await run("token", "renew", path)
    assert r.returncode == 0 and "Renewed" in r.stdout, r.stderr
    r = await run("token", "cancel", path)
    assert r.returncode == 0 and f"Cancelled token {decoded.seq}" in r.stdout, r.stderr
    r = await run("token", "renew", path)
    assert r.returncode == 1 and "not known" in r.stderr and "Traceback" not in r.stderr
    r = await run("token", "fetch", str(tmp_path / "x"), "--hadoop", "--hdfs-address",
                  "no-such-host.invalid:9000")
    assert r.returncode == 1 and "cannot resolve no-such-host.invalid" in r.stderr
    assert "Traceback" not in r.stderr and not os.path.exists(tmp_path / "x")
    (tmp_path / "garbage").write_bytes(b"HDTS\0\x05")
    r = await run("token", "print", str(tmp_path / "garbage"))
    assert r.returncode == 1 and "garbage" in r.stderr and "Traceback" not in r.stderr


def _sh_as(uid: int, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", script, "sh", *args], user=uid, group=uid,
                          extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/")


@pytest.mark.slow
def test_a_mount_acts_for_each_caller_only_as_a_proxy_user(tmp_path):
    """A mount run by root, where root is not the superuser (``hdfs`` is) and may act only
    for hdfs and nobody: nobody works through it as nobody; daemon (uid 1), whom the kernel
    lets into the world-writable folder, is refused by the metadata server, because root
    may not act for daemon; root itself works as root."""
    pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed")
    from harness import Mount, ProcessCluster
    from fs.client import Client

    with ProcessCluster(tmp_path, n_storage=1, settings={
            "replication": 1, "superuser": "hdfs", "proxy_users": "root=hdfs|nobody"}) as cluster:
        with Client(cluster.meta_address, config=make_test_config(), user="hdfs") as hdfs:
            hdfs.mkdirs("/pub", permission=0o777)
        mount = Mount(cluster, "proxy")
        try:
            mp = mount.start().mp
            r = _sh_as(NOBODY, 'mkdir "$1/pub/n" && echo hi > "$1/pub/n/f" && cat "$1/pub/n/f"',
                       str(mp))
            assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
            r = _sh_as(1, 'mkdir "$1/pub/d"', str(mp))
            assert r.returncode != 0 and "Permission denied" in r.stderr, (r.stdout, r.stderr)
            (mp / "pub" / "r").mkdir()
            with cluster.client() as root:
                assert root.get_file_status("/pub/n").owner == "nobody"
                assert root.get_file_status("/pub/n/f").owner == "nobody"
                assert root.get_file_status("/pub/r").owner == "root"
                assert not root.exists("/pub/d")
        finally:
            mount.cleanup()


def test_which_clients_try_the_local_socket():
    """The default socket for any address (used for one not on loopback only where that
    address is this host's: ``fs.localserver.here``); one set explicitly for any address;
    none when empty."""
    from fs.config import DEFAULT_LOCAL_SOCKET
    from fs.rpc import is_default_local_socket, local_socket_name

    assert local_socket_name(DEFAULT_LOCAL_SOCKET, "127.0.0.1:8020") == "@leasefs-meta-8020"
    assert local_socket_name(DEFAULT_LOCAL_SOCKET, "localhost:9") == "@leasefs-meta-9"
    assert local_socket_name(DEFAULT_LOCAL_SOCKET, "[::1]:7") == "@leasefs-meta-7"
    assert local_socket_name(DEFAULT_LOCAL_SOCKET, "10.1.2.3:8020") == "@leasefs-meta-8020"
    assert is_default_local_socket("@leasefs-meta-8020", "10.1.2.3:8020")
    assert not is_default_local_socket("@leasefs-meta-8020", "127.0.0.1:8020")
    assert local_socket_name("/run/lfs-{port}.sock", "meta.example:8020") == \
        "/run/lfs-8020.sock"
    assert not is_default_local_socket("/run/lfs-8020.sock", "meta.example:8020")
    assert local_socket_name("", "127.0.0.1:8020") is None


async def test_a_local_socket_at_a_file_path(tmp_path):
    """``meta_socket`` as a file path: made connectable by every local user (the kernel
    says who each is), used by clients that set it, removed when the server stops."""
    import shutil
    import stat
    import tempfile
    from pathlib import Path

    # a folder nobody can reach (pytest's own are root's, mode 0700)
    folder = Path(tempfile.mkdtemp(prefix="leasefs-sock-"))
    os.chmod(folder, 0o755)
    path = folder / "meta.sock"

    async def main():
        async with inprocess_cluster(tmp_path / "c", n_storage=0,
                                     meta_socket=str(path)) as cluster:
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
            async with cluster.client() as root:
                await root.mkdirs("/pub", permission=0o777)
                assert root.rpc.local_socket == str(path) and root.rpc.connected
            # a process of nobody through the file: nobody
            script = _LOCAL_PEER.replace('b"\\0" + sys.argv[1].encode()', "sys.argv[1]")
            payload = encode_frame(hello("nobody")) + encode_frame(
                [1, "mkdirs", {"path": "/pub/via-file"}])
            result = await trio.to_thread.run_sync(functools.partial(
                subprocess.run, [SYSTEM_PYTHON, "-c", script, str(path), "1"], input=payload,
                user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, timeout=60,
                cwd="/"))
            assert result.returncode == 0, result.stderr.decode(errors="replace")
            [reply] = _frames(bytes.fromhex(result.stdout.decode().strip()))
            assert reply[:2] == [1, True], reply
            async with cluster.client() as root:
                assert (await root.get_file_status("/pub/via-file")).owner == "nobody"
        assert not path.exists()

    try:
        await main()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.cluster(n_storage=1, replication=1)
async def test_fsck_and_open_files_are_the_superusers(cluster):
    """A local user who may not list root's 0700 folder learns none of its names from
    ``fsck`` (with block locations) or the list of open files: both are the superuser's,
    as in HDFS; root still gets both."""
    async with cluster.client() as root:
        await root.mkdirs("/private", permission=0o700)
        await root.write_file("/private/secret-name", b"x" * 100_000)
        writer = await root.create("/private/open-hidden")
        await writer.write(b"y")
        replies = await as_nobody(cluster.meta_address, hello("nobody"), [
            [1, "fsck", {"path": "/", "locations": True, "openforwrite": True}],
            [2, "fsck", {"path": "/private/secret-name"}],
            [3, "list_open_files", {"path": "/"}]], 3)
        for reply in replies:
            assert reply[1] is False and reply[2]["type"] == "PermissionDenied", reply
            assert "Superuser privilege is required" in reply[2]["message"]
        # (the second call named the file itself)
        assert "secret-name" not in repr([replies[0], replies[2]])
        assert "open-hidden" not in repr(replies)
        # the superuser's view is whole
        assert [e["path"] for e in await root.list_open_files()] == [
            "/private/open-hidden"]
        await writer.close()


# binds the abstract socket argv[1] as whoever runs it, answers each connection with a
# reply a naive client would take for the server's, prints what each one sent it
_SQUATTER = r"""
import socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(b"\0" + sys.argv[1].encode())
sock.listen(16)
print("listening", flush=True)
fake = bytes.fromhex(sys.argv[2])
while True:
    conn, _ = sock.accept()
    conn.settimeout(5)
    try:
        conn.sendall(fake)
    except OSError:
        pass
    got = b""
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    conn.close()
    print("connection", len(got), flush=True)
"""


class Squatter:
    """A process of user nobody holding the abstract local socket ``name``; ``received()``
    after ``stop()``: the byte count each connection sent it."""

    def __init__(self, name: str):
        fake = encode_frame([1, True, {"type": "dir"}]).hex()
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", _SQUATTER, name.lstrip("@"), fake],
                                     stdout=subprocess.PIPE, user=NOBODY, group=NOBODY,
                                     extra_groups=[], cwd="/")
        assert self.proc.stdout.readline() == b"listening\n"
        self.output = b""

    def stop(self) -> list[int]:
        self.proc.terminate()
        self.output = self.proc.communicate(timeout=30)[0]
        return [int(line.split()[1]) for line in self.output.decode().splitlines()]


async def test_a_squatter_on_the_local_socket_gets_nothing_and_is_named(tmp_path):
    """Another user (nobody) holds the abstract name ``@leasefs-meta-<port>`` of a running
    metadata server (whose own local socket is a file): root's clients with the default
    ``meta_socket`` (the API, one with a token file, the CLI's ls and put) refuse it at once with
    an error naming the socket and who holds it, and send it nothing, not even a hello."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="leasefs-sock-"))

    async def main():
        async with inprocess_cluster(tmp_path, n_storage=0,
                                     meta_socket=str(folder / "meta.sock")) as cluster:
            from fs.config import DEFAULT_LOCAL_SOCKET
            port = parse_address(cluster.meta_address)[1]
            name = f"@leasefs-meta-{port}"
            local = cluster.config.replace(meta_socket=DEFAULT_LOCAL_SOCKET)
            token = (await cluster.remote_config()).replace(meta_socket=DEFAULT_LOCAL_SOCKET)
            (tmp_path / "data").write_bytes(b"root's secret bytes\n")
            squatter = await trio.to_thread.run_sync(Squatter, name)
            try:
                for config in (local, token):
                    started = trio.current_time()
                    with pytest.raises(errors.AuthenticationFailed) as raised:
                        async with AsyncClient(cluster.meta_address, config=config) as client:
                            await client.list_status("/")
                    assert trio.current_time() - started < 5   # not retried
                    message = str(raised.value)
                    assert name in message and "uid 65534 (nobody)" in message, message
                    assert "uid 0 (root)" in message and "nothing was sent" in message
                env = {**os.environ, "LEASEFS_META": cluster.meta_address}
                env.pop("LEASEFS_META_SOCKET", None)     # the default one
                # the CLI's reads (a blocking connection, fs.blockingrpc) and its put
                for args in (["ls", "/"], ["put", str(tmp_path / "data"), "/data"]):
                    run = await trio.to_thread.run_sync(functools.partial(
                        subprocess.run, [sys.executable, "-m", "tools", *args],
                        env=env, capture_output=True, timeout=60))
                    assert run.returncode != 0
                    err = run.stderr.decode()
                    assert name in err and "nobody" in err and "Traceback" not in err, err
            finally:
                received = await trio.to_thread.run_sync(squatter.stop)
            assert received and all(n == 0 for n in received), received
            async with cluster.client() as client:     # nothing was put
                with pytest.raises(errors.FileNotFound):
                    await client.get_file_status("/data")

    try:
        await main()
    finally:
        folder.rmdir()


async def test_a_squatted_local_socket_name_stops_the_server_and_its_clients_loudly(tmp_path):
    """While nobody's process holds the name, the metadata server refuses to start and says
    who holds it; a client finds no server at the address behind the socket and says so
    (retried, as for a server still starting), sending it nothing."""
    from harness import free_port
    from meta.serverrun import run_meta_server
    from fs.rpc import RpcClient

    port = free_port()
    name = f"@leasefs-meta-{port}"
    squatter = Squatter(name)
    try:
        async def main():
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(
                        run_meta_server, make_test_config(), str(tmp_path / "meta"),
                        port=port))
            except BaseException as raised:   # trio wraps it crossing the nursery
                exc = errors.sole_exception(raised)
            else:
                raise AssertionError("the metadata server started")
            assert isinstance(exc, errors.ServerUnavailable), exc
            message = str(exc)
            assert name in message and "held by uid 65534 (nobody)" in message, message
            async with RpcClient(f"127.0.0.1:{port}", "victim", retry_seconds=0.5) as rpc:
                with pytest.raises(errors.ServerUnavailable) as raised:
                    await rpc.call("get_file_info", {"path": "/"})
            message = str(raised.value)
            assert name in message and "nothing listens on 127.0.0.1:" in message, message

        await main()
    finally:
        received = squatter.stop()
    assert received and all(n == 0 for n in received), received


def test_a_socket_path_is_private_only_where_nobody_else_could_have_made_it(tmp_path):
    """``fs.localserver.private_path``: a socket file of the uid, in a folder nobody else
    may write (ancestors: not writable by others, or sticky like /tmp)."""
    import socket as socketmod

    from fs.localserver import private_path

    def bound(folder, mode):
        folder.mkdir()
        folder.chmod(mode)
        sock = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
        sock.bind(str(folder / "meta.sock"))
        return sock

    tmp_path.chmod(0o755)
    kept = [bound(tmp_path / "private", 0o755), bound(tmp_path / "open", 0o777),
            bound(tmp_path / "sticky", 0o1777)]
    try:
        assert private_path(str(tmp_path / "private" / "meta.sock"), os.getuid())
        assert not private_path(str(tmp_path / "private" / "meta.sock"), os.getuid() + 1)
        assert not private_path(str(tmp_path / "open" / "meta.sock"), os.getuid())
        assert not private_path(str(tmp_path / "sticky" / "meta.sock"), os.getuid())
        assert not private_path(str(tmp_path / "missing.sock"), os.getuid())
        (tmp_path / "private").chmod(0o775)
        assert not private_path(str(tmp_path / "private" / "meta.sock"), os.getuid())
    finally:
        for sock in kept:
            sock.close()
