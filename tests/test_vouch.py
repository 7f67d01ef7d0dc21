"""``leasefs token fetch`` on a block server's host: the block server's local socket names
the caller (the kernel), the block server vouches for that user to the metadata server over
its authenticated connection (``storage.vouch``, ``vouched_delegation_token``), and the
token is that user's. Around it: a client cannot vouch for anyone, a squatter on the socket
name is refused by the client's holder check, vouching turned off and a metadata server that
cannot be reached are clear refusals."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import trio

from fs.client import Client
from fs.delegation import TokenFile
from fs.errors import AuthenticationFailed, AuthenticationRequired, sole_exception
from fs.rpc import RpcClient
from harness import REPO, ProcessCluster
from hostkit import host_cluster, require_hosts

pytestmark = [pytest.mark.slow]

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _need_setpriv() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (to run a client as nobody)")


@pytest.fixture
def nobody_dir():
    """A folder user nobody may write (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="lfs-vouch-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEASEFS_")}
    return {**env, "PYTHONPATH": str(REPO), "LEASEFS_HOME": str(home), **extra}


def _leasefs(*args) -> list[str]:
    return [sys.executable, "-m", "tools", *map(str, args)]


def test_a_user_of_a_block_server_host_fetches_a_token_there(tmp_path, nobody_dir):
    """nobody, on the block server's host (another network namespace than the metadata
    server's), fetches a token there; the token is nobody's and works from a client host.
    A client with a token, or with none, cannot call the vouching method itself."""
    require_hosts()
    _need_setpriv()
    with host_cluster(tmp_path, n_storage=1, clients=1) as hc:
        port = hc.cluster.ports["storage0"]
        token = nobody_dir / "nobody.token"
        fetched = hc.hosts.run("s0", [*AS_NOBODY, *_leasefs(
            "--meta", hc.meta_address, "--set", f"storage_port={port}", "token", "fetch",
            token)], env=_env(nobody_dir), cwd=REPO, capture_output=True, text=True,
            timeout=60)
        assert fetched.returncode == 0 and "Fetched" in fetched.stdout, fetched.stderr
        printed = subprocess.run(_leasefs("token", "print", "--json", token),
                                 env=_env(nobody_dir), cwd=REPO, capture_output=True,
                                 text=True, timeout=60)
        assert '"owner": "nobody"' in printed.stdout, printed

        with Client(hc.meta_address, config=hc.config()) as root:
            root.mkdirs("/pub", permission=0o777)
        made = hc.hosts.run("c0", [*AS_NOBODY, *_leasefs(
            "--meta", hc.meta_address, "mkdir", "/pub/by-nobody")],
            env=_env(nobody_dir, LEASEFS_TOKEN_FILE=str(token)), cwd=REPO,
            capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        with Client(hc.meta_address, config=hc.config()) as root:
            assert root.get_file_status("/pub/by-nobody").owner == "nobody"
        log = (hc.cluster.base / "logs" / "meta.log").read_text()
        assert "vouches for nobody" in log, log[-2000:]

        def vouch_over_tcp(token):
            async def call():
                async with RpcClient(hc.meta_address, "not-a-block-server",
                                     retry_seconds=5.0, timeout=10.0, local_socket=None,
                                     token=token) as rpc:
                    return await rpc.call("vouched_delegation_token", {"user": "root"})
            try:
                return trio.run(call)
            except BaseExceptionGroup as group:   # the RPC client's nursery wraps it
                raise sole_exception(group) from None

        # a client with root's token, and one with none: neither is a block server
        with pytest.raises(AuthenticationFailed, match="only an authenticated block server"):
            vouch_over_tcp(TokenFile.load(str(hc.token_file)))
        with pytest.raises(AuthenticationRequired, match="has not authenticated"):
            vouch_over_tcp(None)


_SQUATTER = textwrap.dedent("""\
    import socket, sys
    name, done = sys.argv[1], sys.argv[2]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(b"\\0" + name.encode())
    sock.listen(1)
    print("ready", flush=True)
    conn, _ = sock.accept()
    got = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        got += chunk
    open(done, "w").write(str(len(got)))
    """)

_LISTENER = textwrap.dedent("""\
    import socket, sys, time
    sock = socket.socket()
    sock.bind(("0.0.0.0", int(sys.argv[1])))
    sock.listen(1)
    print("ready", flush=True)
    time.sleep(120)
    """)


def test_a_squatter_on_the_block_server_socket_is_refused(tmp_path, nobody_dir):
    """On a host without a block server, the fetch says so; once root listens on the data
    port and nobody holds the socket's name, the client refuses that holder and sends it
    nothing."""
    require_hosts()
    _need_setpriv()
    with host_cluster(tmp_path, n_storage=0, clients=1, storage=False) as hc:
        port = 9866
        env = _env(tmp_path / "home")

        def fetch():
            return hc.hosts.run("c0", _leasefs(
                "--meta", hc.meta_address, "--set", f"storage_port={port}", "token", "fetch",
                tmp_path / "t"), env=env, cwd=REPO, capture_output=True, text=True,
                timeout=60)

        alone = fetch()
        assert alone.returncode == 1 and "Traceback" not in alone.stderr, alone.stderr
        assert "no block server either" in alone.stderr and \
            "@leasefs-storage-9866" in alone.stderr, alone.stderr

        listener = hc.hosts.popen("c0", [sys.executable, "-c", _LISTENER, str(port)],
                                  stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "ready"
        done = nobody_dir / "received"
        squatter = hc.hosts.popen("c0", [*AS_NOBODY, sys.executable, "-c", _SQUATTER,
                                         f"leasefs-storage-{port}", str(done)],
                                  stdout=subprocess.PIPE, text=True)
        assert squatter.stdout.readline().strip() == "ready"
        refused = fetch()
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert "held by uid 65534 (nobody)" in refused.stderr and \
            "block server" in refused.stderr and "storage_socket" in refused.stderr, \
            refused.stderr
        squatter.wait(30)
        assert done.read_text() == "0"     # not even a hello
        assert not (tmp_path / "t").exists()


def test_vouching_turned_off_and_an_unreachable_metadata_server(tmp_path, nobody_dir):
    """With ``storage_vouches_users = false`` the metadata server refuses, and the fetch
    says why; a block server cut from its metadata server says that."""
    _need_setpriv()
    with ProcessCluster(tmp_path, n_storage=1,
                        settings={"storage_vouches_users": "false", "rpc_retry_seconds": 2.0,
                                  "rpc_timeout": 10.0}) as cluster:
        port = cluster.ports["storage0"]

        def fetch():
            # no metadata server socket here: the block server is the way
            return subprocess.run([*AS_NOBODY, *_leasefs(
                "--meta", cluster.meta_address, "--set", "meta_socket=", "--set",
                f"storage_port={port}", "token", "fetch", nobody_dir / "t")],
                env=_env(nobody_dir), cwd=REPO, capture_output=True, text=True, timeout=90)

        off = fetch()
        assert off.returncode == 1 and "Traceback" not in off.stderr, off.stderr
        assert "storage_vouches_users = false" in off.stderr, off.stderr
        log = (cluster.base / "logs" / "meta.log").read_text()
        assert "vouched for nobody: refused" in log, log[-2000:]

        cluster.kill_meta()
        started = time.monotonic()
        gone = fetch()
        assert gone.returncode == 1 and "Traceback" not in gone.stderr, gone.stderr
        assert "block server could not reach the metadata server" in gone.stderr, gone.stderr
        assert time.monotonic() - started < 60
        assert not (nobody_dir / "t").exists()
