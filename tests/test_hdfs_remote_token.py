"""A Hadoop client on another host under ``security = secure``: it proves who it is with a
leasefs delegation token over SASL (TOKEN, DIGEST-MD5) on the metadata server's real HDFS
port, and is then the token's owner; without a token, or with a forged one, it is refused.

"Another host" is this host's own non-loopback address: the metadata server binds every
address and the client connects to that one, so the kernel does not vouch for it (only a
loopback peer is named by the kernel).
"""

from __future__ import annotations

import os
import socket

import pytest

from fs.hdfs import tokenfile
from hadoopkit import fs_shell, requires_java, write_conf
from harness import ProcessCluster, free_port, leasefs

pytestmark = [requires_java, pytest.mark.slow]


def outward_address() -> str | None:
    """This host's address on its default route (no packet is sent), None without one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.123", 9))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if outward_address() is None:
        pytest.skip("no non-loopback address on this host")
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-token"), n_storage=1, settings={
            "security": "secure", "bind_host": "0.0.0.0", "meta_hdfs_port": free_port(),
            "replication": 1}) as running:
        yield running


def test_a_remote_client_is_the_owner_of_its_token_and_none_without_one(cluster, tmp_path):
    address = f"{outward_address()}:{cluster.settings['meta_hdfs_port']}"
    token = tmp_path / "hadoop.token"
    fetched = leasefs(cluster, "token", "fetch", token, "--hadoop", "--hdfs-address", address)
    assert fetched.returncode == 0, fetched.stderr
    conf = write_conf(tmp_path / "conf", {"ipc.client.connect.max.retries": "0"})
    # the token's owner is the kernel's user of the fetch (root here); the client claims
    # to be someone else: the token decides, not the claim
    with_token = {"HADOOP_TOKEN_FILE_LOCATION": str(token)}
    made = fs_shell(address, "-touchz", "/by-token", conf=conf, user="mallory", env=with_token)
    assert made.returncode == 0, made.stderr.decode(errors="replace")
    listed = fs_shell(address, "-ls", "/", conf=conf, user="mallory", env=with_token)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.decode().splitlines() if x.endswith("/by-token"))
    assert line.split()[2] == "root", line

    refused = fs_shell(address, "-ls", "/", conf=conf, user="root")
    assert refused.returncode != 0
    assert "delegation token" in refused.stderr.decode(errors="replace")

    creds = tokenfile.Credentials.load(str(token))
    [(alias, real)] = creds.tokens.items()
    forged_path = tmp_path / "forged.token"
    forged = tokenfile.delegation_token(tokenfile.decode_identifier(real.identifier),
                                        bytes(len(real.password)), real.service)
    tokenfile.Credentials({alias: forged}).save(str(forged_path))
    os.chmod(forged_path, 0o600)
    bad = fs_shell(address, "-ls", "/", conf=conf, user="root",
                   env={"HADOOP_TOKEN_FILE_LOCATION": str(forged_path)})
    assert bad.returncode != 0
    assert "DIGEST-MD5" in bad.stderr.decode(errors="replace"), bad.stderr
