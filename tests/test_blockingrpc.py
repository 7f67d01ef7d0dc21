"""The blocking one-shot reads (``fs.blockingrpc``) against a real metadata server process:
the command line's reads need no trio, and whatever goes wrong on the blocking connection
is carried on by the full client, with nothing lost or listed twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

from fs.blockingrpc import BlockingReads, BlockingRpc
from fs.client import Client
from fs.errors import FileNotFound
from harness import ProcessCluster


@pytest.fixture
def cluster(tmp_path):
    c = ProcessCluster(tmp_path, n_storage=0).start()
    try:
        yield c
    finally:
        c.stop()


def _reads(cluster) -> BlockingReads:
    config = cluster.config()
    return BlockingReads(cluster.meta_address, config,
                         lambda: Client(cluster.meta_address, config=config))


def test_a_listing_goes_on_through_the_full_client_when_the_server_restarts(cluster):
    names = [f"d{i:05d}" for i in range(2300)]        # three pages of a listing
    with cluster.client() as client:
        for name in names:
            client.mkdirs(f"/big/{name}")
    reads = _reads(cluster)
    try:
        assert reads.get_file_status("/big").children == len(names)
        with pytest.raises(FileNotFound):
            reads.get_file_status("/big/nope")
        assert not reads.exists("/big/nope") and reads.exists("/big/d00000")
        assert reads.blocking_reads == 4 and reads.handed_over == 0
        seen = []
        for entry in reads.iter_status("/big"):
            seen.append(entry.name)
            if len(seen) == 1:          # the first page came over the blocking connection
                cluster.kill_meta()
                cluster.start_meta()
        assert seen == names
        assert reads.handed_over == 1 and reads.blocking_reads == 5
        # from now on the full client answers everything, reads too
        assert reads.get_file_status("/big/d02299").name == "d02299"
        assert reads.blocking_reads == 5
        assert reads.report()["safemode"] is not None      # a method of the full client
    finally:
        reads.close()


def test_no_blocking_connection_where_the_full_client_must_decide(cluster):
    config = cluster.config()
    port = cluster.meta_address.rsplit(":", 1)[1]
    # an HA list (failover), observer reads, no local socket: the full client's job
    assert BlockingRpc.open_local(f"{cluster.meta_address},127.0.0.1:1", config) is None
    assert BlockingRpc.open_local(cluster.meta_address,
                                  config.replace(observer_reads=True)) is None
    assert BlockingRpc.open_local(cluster.meta_address, config.replace(meta_socket="")) is None
    # nothing listens there: the full client says so
    assert BlockingRpc.open_local("127.0.0.1:1", config) is None
    rpc = BlockingRpc.open_local(f"localhost:{port}", config)
    assert rpc is not None
    try:
        assert rpc.call("get_file_info", {"path": "/"})["type"] == "dir"
    finally:
        rpc.close()


def test_reads_on_the_command_line_import_no_trio(cluster, tmp_path):
    """``ls``, ``ls -l``, ``stat`` and ``test -d`` of a server of this machine run without
    trio or the full client; ``put`` needs them and gets them."""
    env = cluster.env
    subprocess.run([sys.executable, "-m", "tools", "mkdir", "-p", "/cli/x"], env=env,
                   check=True, capture_output=True, timeout=60)
    out = tmp_path / "modules.json"
    for args in (["ls", "/"], ["ls", "-l", "-R", "/cli"], ["stat", "/cli/x"],
                 ["test", "-d", "/cli/x"], ["put", "-", "/cli/f"]):
        code = ("import atexit, json, runpy, sys\n"
                f"atexit.register(lambda: open({str(out)!r}, 'w').write("
                "json.dumps(list(sys.modules))))\n"
                f"sys.argv = ['leasefs', *{args!r}]\n"
                "runpy.run_module('tools', run_name='__main__', alter_sys=True)\n")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              input=b"data\n", timeout=60)
        assert proc.returncode == 0, (args, proc.stderr.decode())
        loaded = set(json.loads(out.read_text()))
        heavy = {"trio", "fs.client", "fs.rpcclient"} & loaded
        if args[0] == "put":
            assert heavy == {"trio", "fs.client", "fs.rpcclient"}
        else:
            assert heavy == set(), (args, heavy)
        if args[:2] == ["ls", "-l"]:
            lines = proc.stdout.decode().splitlines()
            assert lines[0].startswith("drwxr-xr-x") and lines[0].endswith("/cli/x"), lines
