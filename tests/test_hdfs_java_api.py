"""Hadoop's ``FileSystem`` API (``DistributedFileSystem`` from PySpark's jars, driven through
py4j in one JVM) against leasefs, side by side with leasefs's own Python client on the same
namespace: files cross both ways byte for byte, leases bind both worlds, and the client-side
rules HDFS users rely on (paged listings, pread, rename's two forms) hold.

``java_fs(spark, cluster)`` is a new ``FileSystem`` instance: its own HDFS client name, so
its own lease holder, as a second JVM process would be.
"""

from __future__ import annotations

import os

import pytest
from py4j.protocol import Py4JJavaError

from fs.errors import AlreadyBeingCreated, LeaseFSError
from hadoopkit import requires_java
from harness import ProcessCluster, free_port
import sparkkit

pytestmark = [requires_java, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("hdfs-java"), n_storage=2,
                       settings={"replication": 2, "meta_hdfs_port": free_port(),
                                 "block_size": 1 << 20, "min_block_size": 1 << 20})
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    yield from sparkkit.run_client(cluster)


@pytest.fixture(scope="module")
def spark(cluster):
    yield from sparkkit.run_spark("leasefs-hdfs-java")


def java_fs(spark, cluster):
    jvm = spark._jvm
    uri = jvm.java.net.URI(f"hdfs://127.0.0.1:{cluster.settings['meta_hdfs_port']}/")
    return jvm.org.apache.hadoop.fs.FileSystem.newInstance(uri, spark._jsc.hadoopConfiguration())


def jpath(spark, path):
    return spark._jvm.org.apache.hadoop.fs.Path(path)


def java_error(exc: Py4JJavaError) -> str:
    """The Java exception's class name (a RemoteException's: the server's class)."""
    e = exc.java_exception
    name = e.getClass().getName()
    if name == "org.apache.hadoop.ipc.RemoteException":
        return e.getClassName()
    return name


def read_all(spark, fs, path) -> bytes:
    stream = fs.open(jpath(spark, path))
    try:   # a byte[] a Java call returns comes back as Python bytes
        return bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def pread(spark, stream, position: int, length: int) -> bytes:
    """A positional read, as parquet's footer and column reads do (into a ByteBuffer:
    py4j passes a byte[] by value, so a Java method cannot fill one of ours)."""
    buf = spark._jvm.java.nio.ByteBuffer.allocate(length)
    stream.readFully(position, buf)
    return bytes(buf.array())


def test_bytes_cross_both_ways(spark, cluster, client):
    data = os.urandom(3 * (1 << 20) + 12345)   # four blocks of 1 MiB
    client.write_file("/x/from-python", data)
    fs = java_fs(spark, cluster)
    try:
        assert read_all(spark, fs, "/x/from-python") == data
        out = fs.create(jpath(spark, "/x/from-java"))
        out.write(bytearray(data))
        out.close()
        assert client.read_file("/x/from-java") == data
        # pread and seek, as parquet's footer and column reads do
        stream = fs.open(jpath(spark, "/x/from-python"))
        for at in (0, 100, (1 << 20) - 100, 2 * (1 << 20) - 100, len(data) - 5000):
            assert pread(spark, stream, at, 5000) == data[at:at + 5000]
        stream.close()
    finally:
        fs.close()


def test_a_java_writer_holds_the_lease_against_python_and_hflush_is_visible(spark, cluster,
                                                                             client):
    fs = java_fs(spark, cluster)
    try:
        out = fs.create(jpath(spark, "/lease/j"))
        out.write(bytearray(b"a" * 1000))
        out.hflush()
        with client.open("/lease/j") as f:
            assert f.read() == b"a" * 1000
        with pytest.raises(AlreadyBeingCreated):
            client.append("/lease/j")
        out.close()
        with client.append("/lease/j") as w:
            w.write(b"b")
        assert client.read_file("/lease/j") == b"a" * 1000 + b"b"
    finally:
        fs.close()


def test_a_python_writer_holds_the_lease_against_java_and_java_recovers_it(spark, cluster,
                                                                           client):
    w = client.create("/lease/p")
    w.write(b"x" * 5000)
    w.hflush()
    fs = java_fs(spark, cluster)
    try:
        with pytest.raises(Py4JJavaError) as err:
            fs.append(jpath(spark, "/lease/p"))
        assert java_error(err.value).endswith("AlreadyBeingCreatedException")
        recovered = False
        for _ in range(200):
            if fs.recoverLease(jpath(spark, "/lease/p")):
                recovered = True
                break
            spark._jvm.java.lang.Thread.sleep(100)   # fixed-sleep: the JVM's own poll, as HBase does
        assert recovered
        assert fs.isFileClosed(jpath(spark, "/lease/p"))
        assert read_all(spark, fs, "/lease/p") == b"x" * 5000
    finally:
        fs.close()
        try:
            w.close()
        except LeaseFSError:
            pass   # its lease went to the recovery, as it must


def test_listing_pages_and_renames(spark, cluster, client):
    client.mkdirs("/many")
    for i in range(2500):
        client.write_file(f"/many/f{i:05d}", b"")
    fs = java_fs(spark, cluster)
    try:
        names = sorted(s.getPath().getName() for s in fs.listStatus(jpath(spark, "/many")))
        assert names == [f"f{i:05d}" for i in range(2500)]
        # the old rename: into an existing folder; false (no exception) for a missing source
        client.mkdirs("/into")
        assert fs.rename(jpath(spark, "/many/f00000"), jpath(spark, "/into"))
        assert client.exists("/into/f00000")
        assert not fs.rename(jpath(spark, "/many/missing"), jpath(spark, "/into/y"))
        assert not fs.rename(jpath(spark, "/many/f00001"), jpath(spark, "/many/f00002"))
    finally:
        fs.close()
