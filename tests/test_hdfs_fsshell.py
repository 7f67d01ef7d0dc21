"""Hadoop's own FsShell (``hdfs dfs``, from PySpark's jars) against a real leasefs cluster:
file checksums through the block servers' BLOCK_CHECKSUM (``storage.hdfs.xfer``) in both of
Hadoop's combine modes, and the shell's commands with the output, messages and exit codes
HDFS gives.

One JVM serves the module: FsShell instances driven through py4j, each command's stdout and
stderr captured (``Shell.run``); one command line through ``hadoopkit.fs_shell`` checks the
``-D`` form the docs show. A JVM start costs ~2 s of CPU.
"""

from __future__ import annotations

import hashlib
import random
import struct
from dataclasses import dataclass

import pytest

from fs.datatransfer import crc32c
from hadoopkit import fs_shell, jars, requires_java, write_conf
from harness import ProcessCluster, free_port, leasefs

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, requires_java]

BLOCK = 1 << 20
DATA = random.Random(85).randbytes(2 * BLOCK + 300_001)     # three blocks, a partial chunk
SMALL = b"kept inline in the namespace\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("fsshell"), n_storage=1, settings={
            "security": "simple", "meta_hdfs_port": free_port(), "block_size": BLOCK,
            "min_block_size": 4096, "trash_interval": 60}) as running:
        with running.client() as client:
            client.mkdirs("/ck")
            client.write_file("/ck/py512", DATA, bytes_per_checksum=512)
            client.write_file("/ck/py512-again", DATA, bytes_per_checksum=512)
            client.write_file("/ck/py4096", DATA, bytes_per_checksum=4096)
            client.write_file("/ck/small", SMALL)
        yield running


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


class Shell:
    """FsShell instances in one JVM (py4j): ``run`` is ``hdfs dfs ARGS`` with its exit code
    and what it printed."""

    def __init__(self, gateway, address: str):
        self.gateway = gateway
        self.jvm = gateway.jvm
        self.address = address
        self.shell = self.make()

    def make(self, **settings):
        """An FsShell whose client has ``settings`` (a FileSystem of its own: the cached one
        keeps the configuration it was made with)."""
        conf = self.jvm.org.apache.hadoop.conf.Configuration()
        conf.set("fs.defaultFS", f"hdfs://{self.address}")
        conf.set("dfs.blocksize", str(BLOCK))
        for key, value in settings.items():
            conf.set(key, str(value))
        if settings:
            conf.set("fs.hdfs.impl.disable.cache", "true")
        return self.jvm.org.apache.hadoop.fs.FsShell(conf)

    def run(self, *args: str, shell=None) -> Ran:
        j = self.jvm
        system = j.java.lang.System
        out, err = j.java.io.ByteArrayOutputStream(), j.java.io.ByteArrayOutputStream()
        old_out, old_err = system.out, system.err
        system.setOut(j.java.io.PrintStream(out, True, "UTF-8"))
        system.setErr(j.java.io.PrintStream(err, True, "UTF-8"))
        try:
            argv = self.gateway.new_array(j.java.lang.String, len(args))
            for i, arg in enumerate(args):
                argv[i] = arg
            code = (shell or self.shell).run(argv)
        finally:
            system.setOut(old_out)
            system.setErr(old_err)
        return Ran(code, out.toString("UTF-8"), err.toString("UTF-8"))


@pytest.fixture(scope="module")
def shell(cluster):
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

    port = launch_gateway(classpath=f"{jars()}/*", die_on_exit=True,
                          javaopts=["-Xmx256m", "-XX:TieredStopAtLevel=1",
                                    "-DHADOOP_USER_NAME=root"])
    gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
    try:
        yield Shell(gateway, address(cluster))
    finally:
        gateway.shutdown()


def address(cluster) -> str:
    return f"127.0.0.1:{cluster.settings['meta_hdfs_port']}"


def md5_of_md5_of_crcs(data: bytes, block: int, bpc: int) -> bytes:
    """HDFS's MD5MD5CRC, computed here from the bytes: per block the MD5 of its chunk CRC32Cs
    (big-endian), then the MD5 of those as Hadoop's client digests them: its whole buffer
    (a DataOutputBuffer from 32 bytes, doubled as it fills), zeros past the block MD5s."""
    per_block = b""
    for start in range(0, len(data), block):
        piece = data[start:start + block]
        crcs = [crc32c(piece[i:i + bpc]) for i in range(0, len(piece), bpc)]
        per_block += hashlib.md5(struct.pack(f">{len(crcs)}I", *crcs)).digest()
    capacity = 32
    while capacity < len(per_block):
        capacity *= 2
    return hashlib.md5(per_block.ljust(capacity, b"\0")).digest()


def checksum_line(ran: Ran, path: str) -> tuple[str, str]:
    assert ran.code == 0, ran
    name, algorithm, value = ran.out.strip().split("\t")
    assert name.endswith(path), ran.out
    return algorithm, value


def test_checksum_equals_leasefs_checksum_and_hdfs_md5_of_crcs(cluster, shell, tmp_path):
    local = tmp_path / "data"
    local.write_bytes(DATA)
    assert shell.run("-put", str(local), "/ck/java").code == 0   # 512-byte chunks, 1 MiB blocks
    want = f"{crc32c(DATA):08x}"
    composite = shell.make(**{"dfs.checksum.combine.mode": "COMPOSITE_CRC"})
    for path in ("/ck/py512", "/ck/py4096", "/ck/java"):
        mine = leasefs(cluster, "checksum", path)
        assert mine.returncode == 0, mine.stderr
        assert mine.stdout.split("\t")[1:] == ["COMPOSITE-CRC32C", f"{want}\n"]
        assert checksum_line(shell.run("-checksum", path, shell=composite), path) == (
            "COMPOSITE-CRC32C", want)

    # MD5MD5CRC depends on the chunking: equal for equal content and chunking only
    md5 = {path: checksum_line(shell.run("-checksum", path), path)
           for path in ("/ck/py512", "/ck/py512-again", "/ck/java", "/ck/py4096")}
    crcs_per_block = BLOCK // 512
    assert md5["/ck/py512"] == md5["/ck/py512-again"] == md5["/ck/java"] == (
        f"MD5-of-{crcs_per_block}MD5-of-512CRC32C",
        (struct.pack(">iq", 512, crcs_per_block) + md5_of_md5_of_crcs(DATA, BLOCK, 512)).hex())
    assert md5["/ck/py4096"] == (
        f"MD5-of-{BLOCK // 4096}MD5-of-4096CRC32C",
        (struct.pack(">iq", 4096, BLOCK // 4096)
         + md5_of_md5_of_crcs(DATA, BLOCK, 4096)).hex())

    # the command line the docs show: -D before the command
    conf = write_conf(tmp_path / "conf")
    proc = fs_shell(address(cluster), "-D", "dfs.checksum.combine.mode=COMPOSITE_CRC",
                    "-checksum", "/ck/py4096", conf=conf, user="root")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().split("\t")[1:] == ["COMPOSITE-CRC32C", f"{want}\n"]
