"""Wire encryption (``tls = "on"``): RPC and data transfer over TLS on real servers and
loopback sockets, what the wire carries, and the clear errors of every mismatch (plaintext
client at a TLS port, TLS client at a plaintext port, a CA the server's certificate is not
from), with the servers serving others all along.

In-process clusters (real metadata server and block servers on real sockets) for the wire
checks; ``ProcessCluster`` and ``leasefs cluster up`` for the multi-block pipeline with a
recovery, a replacement node and re-replication, and the zero-set-up path.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
import trio

from fs import tls as tlsmod
from fs.client import AsyncClient, Client
from fs.errors import TlsError, sole_exception
from fs.framing import LENGTH, encode_frame, unpackb
from fs.reader import Block, BlockReader
from fs.rpc import RpcClient
from harness import LOG_WATCH, ProcessCluster, inprocess_cluster
from tools.cluster.processes import is_ours

KiB = 1 << 10
MiB = 1 << 20


class RecordingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` that keeps every byte it forwards,
    both ways: what anyone on the path would see."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.seen = bytearray()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]

        async def pump(source, sink):
            try:
                while chunk := await source.receive_some(1 << 16):
                    self.seen += chunk
                    await sink.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await sink.aclose()

        async def relay(downstream):
            upstream = await trio.open_tcp_stream(*self.target)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, downstream, upstream)
                nursery.start_soon(pump, upstream, downstream)

        async with trio.open_nursery() as nursery:
            task_status.started(f"127.0.0.1:{port}")
            await trio.serve_listeners(relay, listeners, handler_nursery=nursery)


async def read_via(address: str, located: dict, client: AsyncClient) -> bytes:
    """A whole block read with READ_BLOCK from ``address`` (a proxy), as a reader does."""
    block = Block.from_wire(located)
    reader = await BlockReader.connect(block, {"address": address, "node_id": "proxy"}, 0,
                                       block.num_bytes, timeout=10, connect_timeout=10, max_frame=MiB,
                                       tls=client.tls)
    parts = []
    try:
        while chunk := await reader.read(MiB):
            parts.append(chunk)
    finally:
        await reader.aclose()
    return b"".join(parts)


@pytest.mark.parametrize("tls", ["on", "off"])
async def test_no_plaintext_on_the_wire_with_tls(tmp_path, tls):
    """With tls on, a marker written and read through RPC (a small file's bytes travel in
    its complete and get_block_locations) and through READ_BLOCK never shows on the wire;
    with tls off (the control) the same proxy sees it, so the check can see it at all."""
    marker = b"leasefs-plaintext-marker-" + secrets.token_hex(8).encode()
    small = marker * 8
    big = marker * (200 * KiB // len(marker))
    async with inprocess_cluster(tmp_path, 1, tls=tls, replication=1) as cluster:
        async with trio.open_nursery() as nursery:
            rpc_proxy = RecordingProxy(cluster.meta_address)
            data_proxy = RecordingProxy(cluster.storage_address(0))
            rpc_address = await nursery.start(rpc_proxy.run)
            data_address = await nursery.start(data_proxy.run)
            # as a client elsewhere: TCP (through the proxy) with a delegation token
            remote = await cluster.remote_config()
            async with AsyncClient(rpc_address, config=remote) as client:
                async with await client.create("/small") as out:
                    await out.write(small)
                async with await client.open("/small") as inp:
                    assert await inp.read() == small
                async with await client.create("/big", replication=1) as out:
                    await out.write(big)
                located = (await client.rpc.call(
                    "get_block_locations", {"path": "/big"}))["blocks"][0]
                assert await read_via(data_address, located, client) == big
            nursery.cancel_scope.cancel()
    assert rpc_proxy.seen and data_proxy.seen
    if tls == "on":
        assert marker not in rpc_proxy.seen and marker not in data_proxy.seen
        # every connection opened with a TLS handshake record
        assert rpc_proxy.seen[0] == tlsmod.HANDSHAKE_BYTE
    else:
        assert marker in rpc_proxy.seen and marker in data_proxy.seen


async def _plain_exchange(address: str, frame) -> object:
    """Send one frame over a raw TCP connection; the one frame answered (before the close)."""
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(encode_frame(frame))
        data = bytearray()
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    (length,) = LENGTH.unpack_from(data)
    return unpackb(bytes(data[4:4 + length]))


@pytest.mark.cluster(n_storage=1, tls="on", replication=1)
async def test_plaintext_and_wrong_ca_clients_get_clear_errors_and_servers_go_on(tmp_path,
                                                                                cluster):
    async with cluster.client() as good:
        async with await good.create("/f") as out:
            await out.write(b"x" * 100_000)

    # a raw plaintext connection: the metadata port answers only with a TLS error frame
    answer = await _plain_exchange(cluster.meta_address, {
        "hello": "leasefs", "version": 1, "client_id": "plain", "user": "u", "groups": []})
    assert answer[:2] == [None, False] and answer[2]["type"] == "TlsError"
    assert "speaks TLS only" in answer[2]["message"]
    # and the data port the same in its own protocol
    answer = await _plain_exchange(cluster.storage_address(0), {
        "op": "BLOCK_LENGTH", "version": 1, "block": {"id": 1, "gs": 1}})
    assert answer["status"] == "ERROR" and answer["error"]["type"] == "TlsError"

    # a client elsewhere (TCP, a token) without TLS: TlsError at once, not 10 s of retries
    remote = await cluster.remote_config()
    started = trio.current_time()
    with pytest.raises(TlsError, match="speaks TLS only"):
        async with AsyncClient(cluster.meta_address, config=remote.replace(tls="off")):
            pass
    assert trio.current_time() - started < 5

    # a client trusting another CA: refused by its own verification, named as such
    other_ca = tlsmod.ensure_ca(tmp_path / "other")
    started = trio.current_time()
    with pytest.raises(TlsError, match="certificate is not trusted"):
        async with AsyncClient(cluster.meta_address, config=remote.replace(
                tls_ca_file=other_ca)):
            pass
    assert trio.current_time() - started < 5

    # bytes that start like a TLS record but are not a handshake: closed, logged
    host, port = cluster.meta_address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"\x16\x03\x01\x00\x05hello" + b"\0" * 64)
        with trio.fail_after(10):
            while await stream.receive_some(65536):
                pass

    # a connection that says nothing does not hold up the others
    silent = await trio.open_tcp_stream(host, int(port))
    async with silent, cluster.client() as good:
        async with await good.open("/f") as inp:
            assert await inp.read() == b"x" * 100_000
        assert (await good.rpc.call("report", {}))["live_nodes"]


async def test_tls_client_at_a_plaintext_server_gets_a_clear_error(tmp_path):
    ca = tlsmod.ensure_ca(tmp_path / "ca")
    async with inprocess_cluster(tmp_path / "plain", 1) as cluster:
        config = (await cluster.remote_config()).replace(tls="on", tls_ca_file=ca)
        with pytest.raises(TlsError, match="does not speak TLS"):
            async with AsyncClient(cluster.meta_address, config=config):
                pass
        # the data port: a TLS reader at a plaintext block server
        async with cluster.client() as plain:
            async with await plain.create("/f") as out:
                await out.write(b"y" * 100_000)
            located = (await plain.rpc.call("get_block_locations", {"path": "/f"}))["blocks"][0]
            plain.tls = tlsmod.client(config)
            with pytest.raises(TlsError, match="does not speak TLS"):
                await read_via(cluster.storage_address(0), located, plain)
            plain.tls = None
            async with await plain.open("/f") as inp:   # and it serves on
                assert await inp.read() == b"y" * 100_000


@pytest.mark.cluster(n_storage=1, tls="on")
async def test_raw_rpc_client_sees_tls_error_not_retries(cluster):
    started = trio.current_time()
    with pytest.raises(BaseException) as info:
        async with RpcClient(cluster.meta_address, "plain", retry_seconds=20,
                             local_socket=None) as rpc:
            await rpc.call("report", {})
    assert isinstance(sole_exception(info.value), TlsError)
    assert trio.current_time() - started < 5


def test_ca_and_certificates_are_private_and_cover_this_host(tmp_path):
    ca = tlsmod.ensure_ca(tmp_path / "meta")
    assert tlsmod.ensure_ca(tmp_path / "meta") == ca          # made once
    settings = tlsmod.block_server_settings(tmp_path / "meta", tmp_path / "s0",
                                            tlsmod.default_hosts("10.1.2.3"))
    for path in (tlsmod.ca_paths(tmp_path / "meta")[1], settings["tls_key_file"]):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    out = subprocess.run(["openssl", "x509", "-in", settings["tls_cert_file"], "-noout",
                          "-ext", "subjectAltName"], capture_output=True, text=True)
    if out.returncode == 0:
        for name in ("127.0.0.1", "localhost", socket.gethostname(), "10.1.2.3"):
            assert name in out.stdout
    # reissued only when needed
    again = tlsmod.block_server_settings(tmp_path / "meta", tmp_path / "s0",
                                         tlsmod.default_hosts("10.1.2.3"))
    assert os.path.getmtime(again["tls_cert_file"]) == \
        os.path.getmtime(settings["tls_cert_file"])
    os.chmod(settings["tls_key_file"], 0o644)
    with pytest.raises(TlsError, match="readable by others"):
        tlsmod.server_context(settings["tls_cert_file"], settings["tls_key_file"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tls_cluster_multi_block_pipeline_recovery_and_repair(tmp_path):
    """Real processes with tls on, 4 block servers: 8 MiB in 1 MiB blocks at replication 3
    through 3-node pipelines; the middle node of the live pipeline is killed after an hflush,
    so the writer recovers the pipeline and (policy always) has a survivor copy the block
    to a replacement (TRANSFER_RBW between block servers); the file reads back exactly, also
    with the CLI; re-replication (TRANSFER between block servers) restores 3 replicas."""
    data = os.urandom(8 * MiB)
    with ProcessCluster(tmp_path, n_storage=4,
                        settings={"tls": "on", "replication_interval": 0.5,
                                  "packet_size": 128 * KiB}) as cluster:
        config = cluster.config().replace(packet_size=128 * KiB, write_window_packets=8,
                                          replace_datanode_on_failure="always")
        assert config.tls == "on"
        ports = {cluster.ports[f"storage{i}"]: i for i in range(4)}
        with Client(cluster.meta_address, config=config) as c:
            out = c.create("/big", replication=3, block_size=1 * MiB)
            killed = None
            for pos in range(0, len(data), 256 * KiB):
                out.write(data[pos:pos + 256 * KiB])
                if killed is None and pos >= 3 * MiB + 256 * KiB:
                    out.flush()
                    last = c.get_block_locations("/big")["blocks"][-1]
                    pipeline = [loc["address"] for loc in last["locations"]]
                    assert len(pipeline) == 3
                    killed = pipeline[1]
                    cluster.kill_storage(ports[int(killed.rsplit(":", 1)[1])], signal.SIGKILL)
            out.close()
            assert out._stream.recoveries >= 1 and out._stream.replacements == 1
            with c.open("/big") as f:
                assert f.read() == data
            deadline = time.monotonic() + 90
            while True:
                blocks = c.get_block_locations("/big")["blocks"]
                short = [b["block"]["id"] for b in blocks
                         if len({loc["address"] for loc in b["locations"]} - {killed}) < 3
                         or any(loc["address"] == killed for loc in b["locations"])]
                if not short:
                    break
                assert time.monotonic() < deadline, f"still under-replicated: {short}"
                time.sleep(0.25)
            assert len(blocks) == 8
        # the shell tools with the cluster's TLS settings in their environment
        cat = subprocess.run([sys.executable, "-m", "tools", "cat", "/big"], env=cluster.env,
                             capture_output=True, timeout=120)
        assert cat.returncode == 0 and cat.stdout == data, cat.stderr


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    LOG_WATCH.watch(home / "logs")
    yield home
    try:
        state = json.loads((home / "cluster.json").read_text())
    except (OSError, ValueError):
        return
    entries = [("meta", state["meta"].get("pid"))] + [
        (f"storage{i}", s.get("pid")) for i, s in enumerate(state["storage"])]
    for name, pid in entries:
        if pid and is_ours(pid, "meta" if name == "meta" else "storage", str(home / name)):
            os.kill(pid, signal.SIGKILL)


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cluster_up_with_tls_needs_no_set_up(home, tmp_path):
    """``leasefs cluster up --set tls=on`` makes the CA and every certificate; the shell
    tools find the cluster and its CA by themselves; a client told the wrong CA gets one
    line naming the cause, no traceback."""
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    up = _cli("cluster", "up", "--storage", "3", "--port", "0", "--storage-port", "0",
              "--http-port", "0", "--timeout", "90", "--set", "tls=on",
              "--set", "heartbeat_interval=0.2", "--set", "safemode_extension=0", env=env)
    assert up.returncode == 0, up.stderr + up.stdout
    state = json.loads((home / "cluster.json").read_text())
    assert state["tls_ca_file"] == str(home / "meta" / "tls" / "ca.crt")
    assert stat.S_IMODE(os.stat(home / "meta" / "tls" / "ca.key").st_mode) == 0o600
    for i in range(3):
        assert stat.S_IMODE(os.stat(home / f"storage{i}" / "tls" / "storage.key").st_mode) \
            == 0o600
    local = tmp_path / "local.bin"
    local.write_bytes(os.urandom(3 * MiB + 17))
    put = _cli("put", local, "/x.bin", env=env)
    assert put.returncode == 0, put.stderr
    got = subprocess.run([sys.executable, "-m", "tools", "cat", "/x.bin"], env=env,
                         capture_output=True, timeout=120)
    assert got.returncode == 0 and got.stdout == local.read_bytes(), got.stderr
    status = _cli("cluster", "status", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    # as a client elsewhere: TCP with a delegation token, a wrong CA or no TLS at all
    token = tmp_path / "remote.token"
    fetched = _cli("token", "fetch", token, env=env)
    assert fetched.returncode == 0, fetched.stderr
    remote = ["--set", "meta_socket=", "--set", f"token_file={token}"]
    assert _cli("ls", "/", *remote, env=env).stdout == "x.bin\n"
    wrong = tlsmod.ensure_ca(tmp_path / "wrong")
    bad = _cli("ls", "/", *remote, "--set", f"tls_ca_file={wrong}", env=env)
    assert bad.returncode == 1 and "certificate is not trusted" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    plain = _cli("ls", "/", *remote, "--set", "tls=off", env=env)
    assert plain.returncode == 1 and "speaks TLS only" in plain.stderr, plain.stderr
    down = _cli("cluster", "down", env=env)
    assert down.returncode == 0, down.stderr
