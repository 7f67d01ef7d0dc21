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
import re
import struct
from dataclasses import dataclass

import pytest
import trio

from fs.datatransfer import crc32c
from fs.hdfs import datatransfer as hdt
from fs.hdfs.datatransfer import Stage
from fs.hdfs.pb import datatransfer_pb2 as dt
from hadoopkit import HadoopJvm, fs_shell, requires_java, write_conf
from harness import ProcessCluster, free_port, leasefs, poll_until
from test_hdfs_datatransfer import _answer, _raw, first_block, hdfs_address

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, requires_java]

BLOCK = 1 << 20
DATA = random.Random(85).randbytes(2 * BLOCK + 300_001)     # three blocks, a partial chunk
SMALL = b"kept inline in the namespace\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("fsshell"), n_storage=2, settings={
            "security": "simple", "meta_hdfs_port": free_port(), "block_size": BLOCK,
            "min_block_size": 4096, "trash_interval": 60}) as running:
        with running.client() as client:
            client.mkdirs("/ck")
            client.write_file("/ck/py512", DATA, bytes_per_checksum=512)
            client.write_file("/ck/py512-again", DATA, bytes_per_checksum=512)
            client.write_file("/ck/py4096", DATA, bytes_per_checksum=4096)
            client.write_file("/ck/small", SMALL)
            # leasefs's default chunk, 4096, past inline_max, two replicas
            client.write_file("/sh/py4096", DATA[:70_000], replication=2)
        yield running


@dataclass(frozen=True)
class Ran:
    code: int
    out: str      # bytes as latin-1: .encode("latin-1") gives them back
    err: str


class Shell:
    """FsShell instances in one JVM (py4j): ``run`` is ``hdfs dfs ARGS`` with its exit code
    and what it printed."""

    def __init__(self, gateway, address: str):
        self.gateway = gateway
        self.jvm = gateway.jvm
        self.address = address
        self.shell = self.make()
        self.file_system = self.jvm.org.apache.hadoop.fs.FileSystem.get(
            self.jvm.java.net.URI(f"hdfs://{address}"), self.conf())

    def path(self, name: str):
        return self.jvm.org.apache.hadoop.fs.Path(name)

    def conf(self, **settings):
        """The client's configuration: ``settings`` get a FileSystem of their own (the
        cached one keeps the configuration it was first made with)."""
        conf = self.jvm.org.apache.hadoop.conf.Configuration()
        conf.set("fs.defaultFS", f"hdfs://{self.address}")
        conf.set("dfs.blocksize", str(BLOCK))
        for key, value in settings.items():
            conf.set(key, str(value))
        if settings:
            conf.set("fs.hdfs.impl.disable.cache", "true")
        return conf

    def make(self, **settings):
        """An FsShell whose client has ``settings``."""
        return self.jvm.org.apache.hadoop.fs.FsShell(self.conf(**settings))

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
        # latin-1: a byte per character, so binary output (-cat, -tail) round-trips
        return Ran(code, out.toString("ISO-8859-1"), err.toString("UTF-8"))


@pytest.fixture(scope="module")
def shell(cluster):
    with HadoopJvm(heap="256m") as held:   # stopped with the module, not the session
        yield Shell(held.gateway, address(cluster))


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


def replica_contents(cluster, path: str) -> list[bytes]:
    """Each replica of ``path``'s first block as its block server sends it, every chunk's
    stored CRC checked."""
    async def main():
        block, token, locations = await first_block(cluster, path)
        out = []
        for location in locations:
            async with await hdt.DataTransferClient.connect(hdfs_address(location)) as c:
                got = await c.read_block(block, 0, block.numBytes, token=token)
            assert got.response.status == hdt.Status.SUCCESS, got.response.message
            assert got.response.readOpChecksumInfo.checksum.bytesPerChecksum == 4096
            out.append(got.data)
        return out
    return trio.run(main)


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


def test_checksum_of_a_file_kept_inline_is_that_of_the_same_bytes_in_a_block(cluster, shell,
                                                                          tmp_path):
    """A small file the Python client wrote lives in the namespace; the metadata server
    answers BLOCK_CHECKSUM for it as a block server would for the same bytes at 512-byte
    chunks: COMPOSITE_CRC is ``leasefs checksum``'s, MD5MD5CRC that of a Java -put copy."""
    small = DATA[:3000]
    with cluster.client() as client:
        client.write_file("/ck/inline", small)
        assert client.get_block_locations("/ck/inline").get("inline") == small
    local = tmp_path / "small"
    local.write_bytes(small)
    assert shell.run("-put", str(local), "/ck/inline-java").code == 0   # a real block
    composite = shell.make(**{"dfs.checksum.combine.mode": "COMPOSITE_CRC"})
    mine = leasefs(cluster, "checksum", "/ck/inline")
    assert mine.returncode == 0, mine.stderr
    assert checksum_line(shell.run("-checksum", "/ck/inline", shell=composite), "/ck/inline") \
        == ("COMPOSITE-CRC32C", mine.stdout.split("\t")[2].strip())
    assert checksum_line(shell.run("-checksum", "/ck/inline"), "/ck/inline") == \
        checksum_line(shell.run("-checksum", "/ck/inline-java"), "/ck/inline-java")


def ok(ran: Ran) -> str:
    assert ran.code == 0 and not ran.err.strip(), ran
    return ran.out


def fails(ran: Ran, message: str, code: int = 1) -> None:
    """Exit ``code`` and HDFS's one-line message on stderr, nothing on stdout."""
    assert (ran.code, ran.err.strip(), ran.out) == (code, message, ""), ran


def test_fsshell_commands_answer_as_hdfs(cluster, shell, tmp_path):
    local = tmp_path / "local"
    local.write_bytes(DATA[:5000])
    more = tmp_path / "more"
    more.write_bytes(b"appended\n")
    run = shell.run

    # -mkdir: -p makes parents and takes an existing folder; without it, HDFS's messages
    ok(run("-mkdir", "-p", "/sh/a/b/c"))
    ok(run("-mkdir", "-p", "/sh/a/b"))
    fails(run("-mkdir", "/sh/a"), "mkdir: `/sh/a': File exists")
    # (the client names the missing parent by its URI itself, as against HDFS)
    fails(run("-mkdir", "/sh/none/x"),
          f"mkdir: `hdfs://{shell.address}/sh/none': No such file or directory")

    # -put: an existing target is refused unless -f
    ok(run("-put", str(local), "/sh/f"))
    fails(run("-put", str(more), "/sh/f"), "put: `/sh/f': File exists")
    assert run("-test", "-e", "/sh/f") == Ran(0, "", "")
    ok(run("-put", "-f", str(more), "/sh/f"))
    assert ok(run("-cat", "/sh/f")) == "appended\n"
    ok(run("-put", "-f", str(local), "/sh/f"))

    # -get: the bytes back; an existing local target is refused
    got = tmp_path / "got"
    ok(run("-get", "/sh/f", str(got)))
    assert got.read_bytes() == DATA[:5000]
    fails(run("-get", "/sh/f", str(got)), f"get: `{got}': File exists")

    # -cp, -mv
    ok(run("-cp", "/sh/f", "/sh/copy"))
    fails(run("-cp", "/sh/f", "/sh/copy"), "cp: `/sh/copy': File exists")
    ok(run("-mv", "/sh/copy", "/sh/a/moved"))
    fails(run("-mv", "/sh/f", "/sh/a/moved"), "mv: `/sh/a/moved': File exists")
    fails(run("-mv", "/sh/missing", "/sh/x"), "mv: `/sh/missing': No such file or directory")
    assert run("-test", "-e", "/sh/copy").code == 1
    ok(run("-get", "/sh/a/moved", str(tmp_path / "moved")))
    assert (tmp_path / "moved").read_bytes() == DATA[:5000]

    # -ls and -rm of a missing path, -rm of a folder without -r
    fails(run("-ls", "/sh/missing"), "ls: `/sh/missing': No such file or directory")
    fails(run("-rm", "/sh/missing"), "rm: `/sh/missing': No such file or directory")
    fails(run("-rm", "/sh/a"), "rm: `/sh/a': Is a directory")
    assert ok(run("-rm", "-f", "/sh/missing")) == ""

    # -chmod, -chown, -chgrp, -setrep as -stat shows them
    ok(run("-chmod", "640", "/sh/f"))
    ok(run("-chown", "alice:staff", "/sh/f"))
    ok(run("-chgrp", "wheel", "/sh/f"))
    assert ok(run("-setrep", "2", "/sh/f")) == "Replication 2 set: /sh/f\n"
    assert ok(run("-stat", "%a %u %g %r %b", "/sh/f")) == "640 alice wheel 2 5000\n"
    ok(run("-chmod", "-R", "g+w", "/sh/a"))
    assert ok(run("-stat", "%a", "/sh/a/b")) == "775\n"

    # -touchz, -test -z / -e
    ok(run("-touchz", "/sh/empty"))
    assert run("-test", "-z", "/sh/empty") == Ran(0, "", "")
    assert run("-test", "-z", "/sh/f") == Ran(1, "", "")
    assert run("-test", "-e", "/sh/missing") == Ran(1, "", "")
    assert run("-test", "-d", "/sh/a") == Ran(0, "", "")
    fails(run("-touchz", "/sh/f"), "touchz: `/sh/f': Not a zero-length file")

    # -appendToFile, -tail of a closed file, -truncate
    # (Hadoop's client first fills the replica's partial last chunk: a packet that is not
    # chunk-aligned; the second append crosses chunks after that)
    ok(run("-appendToFile", str(more), "/sh/f"))
    bulk = tmp_path / "bulk"
    bulk.write_bytes(DATA[-3000:])
    ok(run("-appendToFile", str(bulk), "/sh/f"))
    content = DATA[:5000] + b"appended\n" + DATA[-3000:]
    assert ok(run("-tail", "/sh/f")).encode("latin-1") == content[-1024:]
    assert ok(run("-cat", "/sh/f")).encode("latin-1") == content
    # a Java append to a replica leasefs wrote at 4096: re-chunked by every pipeline node
    ok(run("-appendToFile", str(bulk), "/sh/py4096"))
    ok(run("-appendToFile", str(more), "/sh/py4096"))
    grown = DATA[:70_000] + DATA[-3000:] + b"appended\n"
    assert ok(run("-cat", "/sh/py4096")).encode("latin-1") == grown
    proc = leasefs(cluster, "checksum", "/sh/py4096")
    assert proc.stdout.split("\t")[1:] == ["COMPOSITE-CRC32C", f"{crc32c(grown):08x}\n"]
    assert replica_contents(cluster, "/sh/py4096") == [grown, grown]
    proc = leasefs(cluster, "checksum", "/sh/f")     # the stored chunk CRCs are right
    assert proc.stdout.split("\t")[1:] == ["COMPOSITE-CRC32C", f"{crc32c(content):08x}\n"]
    out = ok(run("-truncate", "-w", "100", "/sh/f"))
    assert "Truncated /sh/f to length: 100" in out, out
    assert ok(run("-cat", "/sh/f")).encode("latin-1") == DATA[:100]

    # -rm -r goes into the trash (the server's trashInterval: Hadoop's client moves it
    # itself), where leasefs rm puts things too; -skipTrash deletes
    trash = "/user/root/.Trash/Current"
    ok(run("-mkdir", "-p", "/sh/t1/in", "/sh/t2/in"))
    assert run("-rm", "-r", "/sh/t1") == Ran(0, "", "")   # Hadoop logs its "Moved:" line
    assert run("-test", "-d", f"{trash}/sh/t1/in").code == 0
    proc = leasefs(cluster, "rm", "-r", "/sh/t2")
    assert (proc.returncode, proc.stdout) == (
        0, f"Moved: '/sh/t2' to trash at: {trash}/sh/t2\n"), proc.stderr
    assert run("-test", "-d", f"{trash}/sh/t2/in").code == 0
    # a name taken in the trash: both append the time in milliseconds
    ok(run("-mkdir", "-p", "/sh/t1/again", "/sh/t2/again"))
    ok(run("-rm", "-r", "/sh/t2"))
    assert leasefs(cluster, "rm", "-r", "/sh/t1").returncode == 0
    listed = ok(run("-ls", "-R", trash))
    for name in ("t1", "t2"):
        assert re.search(rf" {trash}/sh/{name}\d{{13}}/again$", listed, re.M), listed
    assert ok(run("-rm", "-skipTrash", "/sh/empty")) == "Deleted /sh/empty\n"
    assert run("-test", "-e", f"{trash}/sh/empty").code == 1

    # -count -q with the quotas leasefs set
    for verb, args in (("set-quota", ("10",)), ("set-space-quota", ("1m",))):
        proc = leasefs(cluster, verb, *args, "/sh/a")
        assert proc.returncode == 0, proc.stderr
    fields = ok(run("-count", "-q", "/sh/a")).split()
    # QUOTA REM_QUOTA SPACE_QUOTA REM_SPACE_QUOTA DIRS FILES BYTES PATH
    # (the folder counts itself, in DIRS and against its name quota)
    # (-cp wrote it at Hadoop's default replication, 3)
    assert fields == ["10", "6", "1048576", str(1048576 - 5000 * 3), "3", "1", "5000", "/sh/a"]


def test_truncate_w_returns_once_the_file_is_cut_and_closed(cluster, shell, tmp_path):
    """As HDFS, a truncate inside a block answers false and the file keeps its old length
    until block recovery commits the new one, closing the file: ``-truncate -w`` (which
    polls the length) returns only then, so an append right after it, Java's or a leasefs
    client's, finds the file closed. Without -w, HDFS's message; on a block boundary the
    truncate answers true and nothing waits."""
    size = BLOCK + 70_000                  # a full block and a partial one, two replicas
    with cluster.client() as client:
        for name in ("java", "cli", "py", "bare", "edge"):
            client.write_file(f"/tr/{name}", DATA[:size], replication=2)
    more = tmp_path / "more"
    more.write_bytes(b"after the cut\n")
    run = shell.run

    cut = BLOCK + 1000                     # inside the second block
    assert ok(run("-truncate", "-w", str(cut), "/tr/java")) == (
        f"Waiting for /tr/java ...\nTruncated /tr/java to length: {cut}\n")
    ok(run("-appendToFile", str(more), "/tr/java"))
    with cluster.client() as client:
        assert client.read_file("/tr/java") == DATA[:cut] + b"after the cut\n"

    # the truncate in a JVM of its own (the command line), the append in the next one
    proc = fs_shell(address(cluster), "-truncate", "-w", str(cut), "/tr/cli",
                    conf=write_conf(tmp_path / "conf"), user="root")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().endswith(f"Truncated /tr/cli to length: {cut}\n")
    ok(run("-appendToFile", str(more), "/tr/cli"))
    with cluster.client() as client:
        assert client.read_file("/tr/cli") == DATA[:cut] + b"after the cut\n"

    # inside the first block: the second goes, the first is cut; then a leasefs append
    assert ok(run("-truncate", "-w", "5000", "/tr/py")) == (
        "Waiting for /tr/py ...\nTruncated /tr/py to length: 5000\n")
    with cluster.client() as client:
        with client.append("/tr/py") as out:
            out.write(b"!")
        assert client.read_file("/tr/py") == DATA[:5000] + b"!"

    assert ok(run("-truncate", "3000", "/tr/bare")) == (
        "Truncating /tr/bare to length: 3000. Wait for block recovery to complete before "
        "further updating this file.\n")
    assert poll_until(lambda: shell.file_system.isFileClosed(shell.path("/tr/bare")),
                      timeout=30)
    assert shell.file_system.getFileStatus(shell.path("/tr/bare")).getLen() == 3000

    assert ok(run("-truncate", "-w", str(BLOCK), "/tr/edge")) == (
        f"Truncated /tr/edge to length: {BLOCK}\n")
    with cluster.client() as client:
        assert client.read_file("/tr/edge") == DATA[:BLOCK]
        assert client.read_file("/tr/bare") == DATA[:3000]


def test_an_unaligned_append_packet_must_fill_the_last_chunk_with_a_good_crc(cluster):
    """The only packet that may start inside a chunk is the one filling the replica's
    partial last chunk: a longer one is refused (ERROR), one whose CRC is wrong is
    ERROR_CHECKSUM (not re-covered by a CRC of the block server's making), also when the
    replica's chunk is not the writer's, and the block server serves the next append."""
    head = DATA[:70_000]           # past inline_max; 70000 = 136 chunks of 512 + 368
    # (name, replica's chunk, bytes, corrupt packet): the writer's chunk is 512
    cases = (("long", 512, b"x" * 1000, None), ("bad", 512, b"y" * 100, 0),
             ("good", 512, b"z" * 144, None), ("bad4096", 4096, b"y" * 100, 0),
             ("good4096", 4096, b"z" * 144, None))
    with cluster.client() as client:
        for name, bpc, _, _ in cases:
            client.write_file(f"/al/{name}", head, bytes_per_checksum=bpc, replication=1)

    async def main():
        answers = []
        for name, _, data, corrupt in cases:
            block, token, locations = await first_block(cluster, f"/al/{name}")
            async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
                got = await c.write_block(
                    block, data, token=token, stage=Stage.PIPELINE_SETUP_APPEND,
                    start=len(head), new_gs=block.generationStamp + 1, corrupt_seqno=corrupt)
            answers.append((got.response.status, got.acks[0][1] if got.acks else None))
        return answers

    assert trio.run(main) == [(hdt.Status.SUCCESS, [hdt.Status.ERROR]),
                              (hdt.Status.SUCCESS, [hdt.Status.ERROR_CHECKSUM]),
                              (hdt.Status.SUCCESS, [hdt.Status.SUCCESS]),
                              (hdt.Status.SUCCESS, [hdt.Status.ERROR_CHECKSUM]),
                              (hdt.Status.SUCCESS, [hdt.Status.SUCCESS])]


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("fsshell-secure"), n_storage=1, settings={
            "block_size": BLOCK, "min_block_size": 4096, "inline_max": 0}) as running:
        with running.client() as client:
            client.write_file("/f", DATA[:300_001], bytes_per_checksum=512)
        yield running


def test_block_checksum_on_the_wire_and_its_refusals(secure_cluster):
    """BLOCK_CHECKSUM as Hadoop's Sender sends it, under security = secure: both modes over
    the whole block and over a prefix ending inside a chunk; no token, a length past the
    replica and garbage get an error answer naming the cause, and the server serves on."""
    data = DATA[:300_001]

    async def main():
        block, token, locations = await first_block(secure_cluster, "/f")
        address = hdfs_address(locations[0])

        async def ask(mode=dt.MD5CRC, length=len(data), with_token=True):
            header = dt.BaseHeaderProto(block=block)
            header.block.numBytes = length
            if with_token:
                header.token.CopyFrom(token)
            request = dt.OpBlockChecksumProto(
                header=header, blockChecksumOptions=dt.BlockChecksumOptionsProto(
                    blockChecksumType=mode))
            raw = await _raw(address, hdt.encode_op(hdt.BLOCK_CHECKSUM, request),
                             then_close=True)
            return _answer(raw)

        md5, composite, prefix = (await ask(), await ask(dt.COMPOSITE_CRC),
                                  await ask(dt.COMPOSITE_CRC, length=1000))
        no_token, too_long = await ask(with_token=False), await ask(length=len(data) + 1)
        garbage = _answer(await _raw(address, b"\x00\x1c\x55\x05\xff\xff\xff\xff\xff"))
        again = await ask(dt.COMPOSITE_CRC)
        return md5, composite, prefix, no_token, too_long, garbage, again

    md5, composite, prefix, no_token, too_long, garbage, again = trio.run(main)
    crcs = [crc32c(data[i:i + 512]) for i in range(0, len(data), 512)]
    assert md5.status == hdt.Status.SUCCESS
    sums = md5.checksumResponse
    assert (sums.bytesPerCrc, sums.crcPerBlock, sums.crcType, sums.blockChecksum,
            sums.blockChecksumOptions.blockChecksumType) == (
        512, len(crcs), hdt.CRC32C, hashlib.md5(struct.pack(f">{len(crcs)}I", *crcs)).digest(),
        dt.MD5CRC)
    for answer, content in ((composite, data), (prefix, data[:1000]), (again, data)):
        assert answer.status == hdt.Status.SUCCESS, answer.message
        assert answer.checksumResponse.blockChecksum == crc32c(content).to_bytes(4, "big")
        assert answer.checksumResponse.blockChecksumOptions.blockChecksumType == dt.COMPOSITE_CRC
    assert no_token.status == hdt.Status.ERROR_ACCESS_TOKEN and "token" in no_token.message
    assert too_long.status == hdt.Status.ERROR
    assert f"{len(data) + 1} bytes asked, only {len(data)} visible" in too_long.message
    assert garbage.status == hdt.Status.ERROR
    assert "malformed OpBlockChecksumProto" in garbage.message
