"""HDFS ClientProtocol's mutating calls (``meta.protocols.hdfs.writes.NamenodeWrites``),
driven with protobuf requests as the Hadoop IPC server hands them over, against a real
in-process cluster: the translator calls ``MetaServer.dispatch`` with a ``CallContext``
built as the IPC server builds it (HDFS clientId as hex, callId, the connection's user)."""

from __future__ import annotations

import inspect
import itertools
import os

import pytest
import trio

from fs import errors
from fs.datatransfer import chunk_checksums
from fs.hdfs import convert
from fs.hdfs.pb import hdfs_pb2 as hpb
from fs.hdfs.pb import namenode_writes_pb2 as pb
from fs.pipeline import write_oneshot
from fs.rpcbase import CallContext, current_user
from harness import inprocess_cluster
from meta import serverrun
from meta.protocols.hdfs.writes import NamenodeWrites

pytestmark = pytest.mark.timeout(120)

SMALL = dict(block_size=64 << 10, bytes_per_checksum=512, packet_size=4096,
             min_block_size=4096)
PERM = hpb.FsPermissionProto


class Hdfs:
    """One HDFS connection's view: a clientId, increasing callIds, the translator."""

    def __init__(self, cluster, server):
        self.cluster = cluster
        self.server = server
        self.writes = next(t for t in server.hdfs_translators if isinstance(t, NamenodeWrites))
        self.client_id = os.urandom(16).hex()
        self.call_ids = itertools.count()

    def ctx(self, call_id=None, user=None) -> CallContext:
        return CallContext(client_id=self.client_id, peer="127.0.0.1:40000",
                           call_id=next(self.call_ids) if call_id is None else call_id,
                           user=user or current_user(), groups=() if user else ("supergroup",),
                           sync_metadata=True)

    async def __call__(self, method, call_id=None, user=None, **fields):
        request_class, response_class = NamenodeWrites.CALLS[method]
        request = request_class(**fields)
        # what the IPC server does: the request as read off the wire
        request = request_class.FromString(request.SerializeToString())
        answer = await getattr(self.writes, method)(self.ctx(call_id, user), request)
        assert isinstance(answer, response_class)
        # every required field is set (the IPC server serializes it)
        return response_class.FromString(answer.SerializeToString())

    async def leasefs(self, method, **args):
        return await self.server.dispatch(self.ctx(), method, args)

    async def exists(self, path) -> bool:
        try:
            await self.leasefs("get_file_info", path=path)
        except errors.FileNotFound:
            return False
        return True


@pytest.fixture
async def hdfs(tmp_path, monkeypatch, request):
    """``Hdfs`` on an in-process cluster; settings of its own by indirect parameter."""
    servers = []

    class Recorded(serverrun.MetaServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            servers.append(self)

    monkeypatch.setattr(serverrun, "MetaServer", Recorded)
    settings = {**SMALL, **getattr(request, "param", {})}
    async with inprocess_cluster(tmp_path, n_storage=3, replication=1, **settings) as cluster:
        yield Hdfs(cluster, servers[-1])


def test_every_call_named_has_its_method_and_messages():
    """What the IPC server reads off the class: ``CALLS`` names a coroutine method per call
    and its request/response classes."""
    assert NamenodeWrites.PROTOCOL == "org.apache.hadoop.hdfs.protocol.ClientProtocol"
    assert len(NamenodeWrites.CALLS) == 26
    for name, (request, response) in NamenodeWrites.CALLS.items():
        assert inspect.iscoroutinefunction(getattr(NamenodeWrites, name)), name
        assert request.DESCRIPTOR.name.lower() == f"{name}RequestProto".lower()
        assert response.DESCRIPTOR.name.lower() == f"{name}ResponseProto".lower()


async def _touch(hdfs, path, data=b""):
    async with hdfs.cluster.client() as c:
        await c.write_file(path, data)


async def test_old_rename_answers_as_hdfs_case_by_case(hdfs):
    """``rename`` (FileOutputCommitter's): every row of HDFS's table."""
    await hdfs("mkdirs", src="/a/d/sub", masked=PERM(perm=0o755), createParent=True)
    await hdfs("mkdirs", src="/b", masked=PERM(perm=0o755), createParent=True)
    for name in ("/a/f", "/a/g", "/b/g", "/a/d/x"):
        await _touch(hdfs, name, name.encode())

    async def rename(src, dst):
        return (await hdfs("rename", src=src, dst=dst)).result

    assert await rename("/a/f", "/a/f2") is True                 # plain move
    assert await hdfs.exists("/a/f2") and not await hdfs.exists("/a/f")
    assert await rename("/a/f2", "/b") is True                    # into a directory
    assert await hdfs.exists("/b/f2")
    assert await rename("/a/d", "/b") is True                     # a directory into one
    assert await hdfs.exists("/b/d/sub") and await hdfs.exists("/b/d/x")
    assert await rename("/a/missing", "/a/y") is False            # missing source
    assert await rename("/a/g", "/nowhere/y") is False            # missing destination parent
    assert await rename("/a/g", "/b/g") is False                  # existing destination file
    assert await rename("/a/g", "/b") is False                    # /b/g exists: false
    assert (await hdfs.leasefs("get_file_info", path="/a/g"))["length"] == 4
    assert await rename("/a/g", "/a/g") is True                   # itself
    assert await rename("/b/g", "/b") is True                     # into its own folder: itself
    assert await rename("/b/d", "/b/d/sub") is False              # into itself
    assert await rename("/b/d", "/b/d") is False                  # /b/d/d: into itself
    assert await rename("/", "/c") is False                       # the root
    assert await rename("/a/missing", "/a/missing") is False      # missing, even as itself
    assert await rename("/b/f2", "/") is True                     # into the root
    assert await hdfs.exists("/f2")
    with pytest.raises(errors.NotDirectory):                     # a file as parent
        await rename("/a/g", "/f2/y")

    # rename2: exceptions, OVERWRITE
    with pytest.raises(errors.FileExists):
        await hdfs("rename2", src="/a/g", dst="/b/g", overwriteDest=False)
    await hdfs("rename2", src="/a/g", dst="/b/g", overwriteDest=True)
    assert (await hdfs.leasefs("get_file_info", path="/b/g"))["length"] == 4
    with pytest.raises(errors.FileExists):
        await hdfs("rename2", src="/b/g", dst="/b/g", overwriteDest=True)
    with pytest.raises(errors.FileNotFound):
        await hdfs("rename2", src="/a/g", dst="/a/g", overwriteDest=False)
    with pytest.raises(errors.FileNotFound):
        await hdfs("rename2", src="/a/g", dst="/b/h", overwriteDest=False)
    with pytest.raises(errors.FileExists):                       # never into a directory
        await hdfs("rename2", src="/b/g", dst="/b/d", overwriteDest=False)


async def test_namespace_calls_answer_results_where_hdfs_does(hdfs):
    mk = dict(masked=PERM(perm=0o750), createParent=True)
    assert (await hdfs("mkdirs", src="/m/n", **mk)).result is True
    assert (await hdfs("mkdirs", src="/m/n", **mk)).result is True      # exists: true
    assert (await hdfs.leasefs("get_file_info", path="/m/n"))["mode"] & 0o777 == 0o750
    with pytest.raises(errors.FileNotFound):
        await hdfs("mkdirs", src="/p/q", masked=PERM(perm=0o755), createParent=False)
    await _touch(hdfs, "/m/f", b"12345")
    with pytest.raises(errors.FileExists):
        await hdfs("mkdirs", src="/m/f", **mk)

    assert (await hdfs("delete", src="/nothing", recursive=True)).result is False
    with pytest.raises(errors.DirectoryNotEmpty):
        await hdfs("delete", src="/m", recursive=False)
    assert (await hdfs("delete", src="/", recursive=True)).result is False
    with pytest.raises(errors.DirectoryNotEmpty):
        await hdfs("delete", src="/", recursive=False)

    await hdfs("setPermission", src="/m/f", permission=PERM(perm=0o600))
    await hdfs("setOwner", src="/m/f", username="alice", groupname="staff")
    await hdfs("setOwner", src="/m/f", groupname="crew")                # user unchanged
    await hdfs("setTimes", src="/m/f", mtime=1_700_000_000_123, atime=(1 << 64) - 1)
    status = await hdfs.leasefs("get_file_info", path="/m/f")
    assert status["mode"] & 0o777 == 0o600
    assert (status["owner"], status["group"]) == ("alice", "crew")
    assert status["mtime_ns"] == 1_700_000_000_123_000_000
    atime = status["atime_ns"]
    await hdfs("setTimes", src="/m/f", mtime=(1 << 64) - 1, atime=1_600_000_000_000)
    status = await hdfs.leasefs("get_file_info", path="/m/f")
    assert status["mtime_ns"] == 1_700_000_000_123_000_000
    assert status["atime_ns"] == 1_600_000_000_000_000_000 != atime

    assert (await hdfs("setReplication", src="/m/f", replication=2)).result is True
    assert (await hdfs.leasefs("get_file_info", path="/m/f"))["replication"] == 2
    assert (await hdfs("setReplication", src="/m/n", replication=2)).result is False
    assert (await hdfs("setReplication", src="/m/none", replication=2)).result is False

    await hdfs("setQuota", path="/m", namespaceQuota=100, storagespaceQuota=(1 << 63) - 1)
    summary = await hdfs.leasefs("content_summary", path="/m")
    assert summary["ns_quota"] == 100 and summary["ds_quota"] == -1
    await hdfs("setQuota", path="/m", namespaceQuota=(1 << 64) - 1,
               storagespaceQuota=(1 << 63) - 1)
    assert (await hdfs.leasefs("content_summary", path="/m"))["ns_quota"] == -1
    with pytest.raises(errors.NotSupported):
        await hdfs("setQuota", path="/m", namespaceQuota=5, storagespaceQuota=5,
                   storageType=hpb.SSD)

    head, tail = os.urandom(2 * 65536), os.urandom(70_000)   # kept in blocks, not inline
    await _touch(hdfs, "/m/t", head)
    await _touch(hdfs, "/m/s", tail)
    await hdfs("concat", trg="/m/t", srcs=["/m/s"])
    assert not await hdfs.exists("/m/s")
    async with hdfs.cluster.client() as c:
        assert await c.read_file("/m/t") == head + tail
    await hdfs("createSymlink", target="/m/f", link="/m/l", dirPerm=PERM(perm=0o755),
               createParent=False)
    assert (await hdfs.leasefs("get_file_info", path="/m/l"))["symlink"] == "/m/f"

    assert (await hdfs("isFileClosed", src="/m/f")).result is True
    with pytest.raises(errors.FileNotFound):
        await hdfs("isFileClosed", src="/m/n")
    with pytest.raises(errors.FileNotFound):
        await hdfs("isFileClosed", src="/m/none")

    # the connection's user is the caller: permissions apply as to msgpack clients
    with pytest.raises(errors.PermissionDenied):
        await hdfs("setPermission", user="mallory", src="/m/f", permission=PERM(perm=0o777))
    with pytest.raises(errors.PermissionDenied):
        await hdfs("delete", user="mallory", src="/m", recursive=True)
    # bad values get leasefs's clear errors, naming the path
    create = dict(src="/m/bad", clientName="DFSClient_X", createFlag=pb.CREATE,
                  masked=PERM(perm=0o644), createParent=False)
    with pytest.raises(errors.InvalidArgument, match="/m/bad"):
        await hdfs("create", replication=0, blockSize=64 << 10, **create)
    with pytest.raises(errors.InvalidArgument, match="/m/bad"):
        await hdfs("create", replication=1, blockSize=1000, **create)
    assert not await hdfs.exists("/m/bad")
    for path in ("", "relative/x", "/a\0b", "/" + "x" * 300):
        with pytest.raises((errors.InvalidPath, errors.NameTooLong)):
            await hdfs("mkdirs", src=path, **mk)
    with pytest.raises(errors.LeaseFSError, match="/m/f"):   # no such open file
        await hdfs("addBlock", src="/m/f", clientName="DFSClient_X", fileId=(1 << 64) - 1)

    assert (await hdfs("delete", src="/m", recursive=True)).result is True
    assert not await hdfs.exists("/m")


async def _write_block(hdfs, path, client_name, ino, data):
    """The bytes of the block the writer's last addBlock handed out, written to its
    replicas as a block server's pipeline would (leasefs's own data transfer: the HDFS
    one is the block servers' part): the same addBlock again answers the same block."""
    previous = None
    blocks = (await hdfs.leasefs("get_block_locations", path=path))["blocks"]
    if len(blocks) > 1:
        previous = blocks[-2]["block"]
    located = await hdfs.leasefs("add_block", path=path, client_name=client_name, ino=ino,
                                 previous=previous)
    await write_oneshot(path=path, located=located, client_name=client_name,
                        bytes_per_checksum=512, data=data, sums=chunk_checksums(data, 512),
                        timeout=10, connect_timeout=10, max_frame=1 << 20)
    return located


async def test_create_write_complete_leases_and_retries(hdfs):
    pool = convert.pool_id(hdfs.server.ns.view.namespace_id)
    create = dict(masked=PERM(perm=0o640), createParent=True, replication=1,
                  blockSize=64 << 10)
    made = await hdfs("create", call_id=1000, src="/w/part-0", clientName="DFSClient_A",
                      createFlag=pb.CREATE, **create)
    assert made.fs.fileType == hpb.HdfsFileStatusProto.IS_FILE and made.fs.fileId > 0
    assert made.fs.permission.perm == 0o640 and made.fs.blocksize == 64 << 10
    again = await hdfs("create", call_id=1000, src="/w/part-0", clientName="DFSClient_A",
                       createFlag=pb.CREATE, **create)               # a retry: same answer
    assert again.fs.fileId == made.fs.fileId
    with pytest.raises(errors.AlreadyBeingCreated):                   # a new call
        await hdfs("create", src="/w/part-0", clientName="DFSClient_B",
                   createFlag=pb.CREATE, **create)
    with pytest.raises(errors.AlreadyBeingCreated):
        await hdfs("append", src="/w/part-0", clientName="DFSClient_B", flag=pb.APPEND)
    with pytest.raises(errors.FileNotFound):
        await hdfs("create", src="/w/none", clientName="DFSClient_A",
                   createFlag=pb.OVERWRITE, **create)
    for flags in (pb.CREATE, pb.CREATE | pb.OVERWRITE):   # HDFS: "already exists as a directory"
        with pytest.raises(errors.FileExists, match="directory"):
            await hdfs("create", src="/w", clientName="DFSClient_A", createFlag=flags, **create)
    for method, fields in (("append", {"flag": pb.APPEND}), ("truncate", {"newLength": 0}),
                           ("recoverLease", {})):   # HDFS: "not a file"
        with pytest.raises(errors.FileNotFound, match="not a file"):
            await hdfs(method, src="/w", clientName="DFSClient_B", **fields)
    await hdfs("renewLease", clientName="DFSClient_A")
    assert (await hdfs("isFileClosed", src="/w/part-0")).result is False

    ino = made.fs.fileId
    first = await hdfs("addBlock", src="/w/part-0", clientName="DFSClient_A", fileId=ino)
    block = first.block
    assert block.b.poolId == pool and block.b.generationStamp > 0 and block.offset == 0
    # the block servers serve HDFS data transfer only once they announce its port: until
    # then no location is named, and each named one carries a storage id
    assert len(block.storageIDs) == len(block.locs)
    data = os.urandom(70_000)
    located = await _write_block(hdfs, "/w/part-0", "DFSClient_A", ino, data[:65536])
    assert located["block"]["id"] == block.b.blockId
    previous = hpb.ExtendedBlockProto(poolId=pool, blockId=block.b.blockId,
                                      generationStamp=block.b.generationStamp,
                                      numBytes=65536)
    second = await hdfs("addBlock", src="/w/part-0", clientName="DFSClient_A", fileId=ino,
                        previous=previous)
    assert second.block.offset == 65536 and second.block.b.blockId != block.b.blockId
    # a pipeline that cannot be set up: the block goes, a new one comes
    abandoned = second.block.b
    await hdfs("abandonBlock", b=abandoned, src="/w/part-0", holder="DFSClient_A", fileId=ino)
    second = await hdfs("addBlock", src="/w/part-0", clientName="DFSClient_A", fileId=ino,
                        previous=previous)
    assert second.block.b.blockId != abandoned.blockId
    await _write_block(hdfs, "/w/part-0", "DFSClient_A", ino, data[65536:])
    await hdfs("fsync", src="/w/part-0", client="DFSClient_A", fileId=ino,
               lastBlockLength=len(data) - 65536)
    last = hpb.ExtendedBlockProto(poolId=pool, blockId=second.block.b.blockId,
                                  generationStamp=second.block.b.generationStamp,
                                  numBytes=len(data) - 65536)
    done = await hdfs("complete", call_id=2000, src="/w/part-0", clientName="DFSClient_A",
                      last=last, fileId=ino)
    assert done.result is True                              # at the first answer
    assert (await hdfs("complete", call_id=2000, src="/w/part-0", clientName="DFSClient_A",
                       last=last, fileId=ino)).result is True
    assert (await hdfs("isFileClosed", src="/w/part-0")).result is True
    async with hdfs.cluster.client() as c:
        assert await c.read_file("/w/part-0") == data

    # an empty file: complete without a block
    empty = await hdfs("create", src="/w/_SUCCESS", clientName="DFSClient_A",
                       createFlag=pb.CREATE | pb.OVERWRITE, **create)
    assert (await hdfs("complete", src="/w/_SUCCESS", clientName="DFSClient_A",
                       fileId=empty.fs.fileId)).result is True
    with pytest.raises(errors.FileExists):
        await hdfs("create", src="/w/_SUCCESS", clientName="DFSClient_A",
                   createFlag=pb.CREATE, **create)
    replaced = await hdfs("create", src="/w/_SUCCESS", clientName="DFSClient_A",
                          createFlag=pb.CREATE | pb.OVERWRITE, **create)
    assert replaced.fs.fileId != empty.fs.fileId

    # another holder takes over a file whose writer went quiet
    assert (await hdfs("recoverLease", src="/w/_SUCCESS", clientName="DFSClient_B")).result
    with pytest.raises(errors.LeaseExpired):
        await hdfs("addBlock", src="/w/_SUCCESS", clientName="DFSClient_A",
                   fileId=replaced.fs.fileId)
    assert (await hdfs("recoverLease", src="/w/part-0", clientName="DFSClient_B")).result

    # retries answered from the retry cache, not run again
    assert (await hdfs("delete", call_id=3000, src="/w/_SUCCESS", recursive=False)).result
    assert (await hdfs("delete", call_id=3000, src="/w/_SUCCESS", recursive=False)).result
    assert (await hdfs("rename", call_id=3001, src="/w/part-0", dst="/w/part-1")).result
    assert (await hdfs("rename", call_id=3001, src="/w/part-0", dst="/w/part-1")).result
    assert not (await hdfs("rename", src="/w/part-0", dst="/w/part-1")).result


async def test_append_pipeline_recovery_truncate_and_open_files(hdfs):
    pool = convert.pool_id(hdfs.server.ns.view.namespace_id)
    data = os.urandom(100_000)                 # a full block and a partial one
    async with hdfs.cluster.client() as c:
        await c.write_file("/f", data)
        await c.write_file("/g", data)
        await c.write_file("/tiny", b"kept inline")
    opened = await hdfs("append", src="/f", clientName="DFSClient_J", flag=pb.APPEND)
    assert opened.stat.length == len(data) and opened.stat.fileId > 0
    assert opened.HasField("block") and opened.block.offset == 65536
    assert opened.block.b.numBytes == len(data) - 65536 and opened.block.b.poolId == pool

    listed = await hdfs("listOpenFiles", id=0, types=[pb.ALL_OPEN_FILES], path="/")
    assert [(e.path, e.clientName) for e in listed.entries] == [("/f", "DFSClient_J")]
    assert listed.entries[0].id == opened.stat.fileId and not listed.hasMore
    later = await hdfs("listOpenFiles", id=opened.stat.fileId, types=[pb.ALL_OPEN_FILES])
    assert not later.entries

    # pipeline recovery of the appended block: a new stamp, a spare, the new pipeline
    fresh = await hdfs("updateBlockForPipeline", block=opened.block.b, clientName="DFSClient_J")
    assert fresh.block.b.blockId == opened.block.b.blockId
    assert fresh.block.b.generationStamp > opened.block.b.generationStamp
    located = (await hdfs.leasefs("get_block_locations", path="/f"))["blocks"][-1]
    nodes = [loc["node_id"] for loc in located["locations"]]
    existing = [hpb.DatanodeInfoProto(id=hpb.DatanodeIDProto(
        ipAddr="127.0.0.1", hostName="127.0.0.1", datanodeUuid=n, xferPort=1, infoPort=0,
        ipcPort=0)) for n in nodes]
    spare = await hdfs("getAdditionalDatanode", src="/f", blk=opened.block.b,
                       existings=existing, excludes=[], numAdditionalNodes=1,
                       clientName="DFSClient_J", existingStorageUuids=[f"DS-{n}" for n in nodes],
                       fileId=opened.stat.fileId)
    # the pipeline's nodes first, then the spare (named once block servers announce an
    # HDFS data port; the storage ids line up with the nodes either way)
    got = [loc.id.datanodeUuid for loc in spare.block.locs]
    assert got[:len(nodes)] == nodes and len(spare.block.storageIDs) == len(got)
    assert not set(got[len(nodes):]) & set(nodes)
    new_block = hpb.ExtendedBlockProto(poolId=pool, blockId=fresh.block.b.blockId,
                                       generationStamp=fresh.block.b.generationStamp,
                                       numBytes=opened.block.b.numBytes)
    await hdfs("updatePipeline", clientName="DFSClient_J", oldBlock=opened.block.b,
               newBlock=new_block, newNodes=[e.id for e in existing],
               storageIDs=[f"DS-{n}" for n in nodes])
    blocks = (await hdfs.leasefs("get_block_locations", path="/f"))["blocks"]
    assert blocks[-1]["block"]["gs"] == fresh.block.b.generationStamp
    # (no replica has the new stamp here: the block servers' pipeline is not driven)

    # truncate on a block boundary is done at once; inside a block it recovers the block
    assert (await hdfs("truncate", src="/g", newLength=65536,
                       clientName="DFSClient_J")).result is True
    assert (await hdfs.leasefs("get_file_info", path="/g"))["length"] == 65536
    assert (await hdfs("truncate", src="/g", newLength=1000,
                       clientName="DFSClient_J")).result is False
    assert (await hdfs("isFileClosed", src="/g")).result is False



@pytest.mark.parametrize("hdfs", [{}, {"tls": "on"}], indirect=True)
async def test_append_to_an_inline_file_answers_its_bytes_as_the_first_block(hdfs):
    """The inline bytes become the file's first block (on a block server, over TLS when
    on, the inline copy gone), answered as the partly full last block, open for the Java
    client; a retry of the same call gets the same block, written once."""
    async with hdfs.cluster.client() as c:
        await c.write_file("/tiny", b"kept inline")
        assert (await c.get_block_locations("/tiny")).get("inline") == b"kept inline"
    opened = await hdfs("append", call_id=7000, src="/tiny", clientName="DFSClient_J",
                        flag=pb.APPEND)
    assert (opened.stat.length, opened.block.offset, opened.block.b.numBytes) == (11, 0, 11)
    assert len(opened.block.locs) == 1 and opened.block.b.generationStamp > 0
    located = await hdfs.leasefs("get_block_locations", path="/tiny")
    assert "inline" not in located and located["under_construction"]
    block = located["last"]["block"] if located.get("last") else located["blocks"][0]["block"]
    assert (block["id"], block["num_bytes"]) == (opened.block.b.blockId, 11)
    again = await hdfs("append", call_id=7000, src="/tiny", clientName="DFSClient_J",
                       flag=pb.APPEND)
    assert again.block.b == opened.block.b
    async with hdfs.cluster.client() as c:
        assert await c.read_file("/tiny") == b"kept inline"
        with pytest.raises(errors.AlreadyBeingCreated):   # the Java client holds it
            await c.append("/tiny")
    # the Java client's own close of what it got (nothing more written)
    assert (await hdfs("complete", src="/tiny", clientName="DFSClient_J",
                       last=opened.block.b, fileId=opened.stat.fileId)).result
    async with hdfs.cluster.client() as c:
        assert await c.read_file("/tiny") == b"kept inline"
        assert (await hdfs.leasefs("get_file_info", path="/tiny"))["length"] == 11


@pytest.mark.parametrize("hdfs", [{"dead_node_interval": 60.0}], indirect=True)
async def test_a_failed_move_into_a_block_leaves_the_inline_file_as_it_was(hdfs):
    """No block server takes the block (all stopped, not yet declared dead): the file is
    closed again with its inline bytes and times, its lease released, and the Java client
    told why; a leasefs client then appends as before."""
    async with hdfs.cluster.client() as c:
        await c.write_file("/tiny", b"kept inline")
        before = await hdfs.leasefs("get_file_info", path="/tiny")
    for i in range(len(hdfs.cluster.storage)):
        await hdfs.cluster.stop_storage(i)
    with pytest.raises(errors.PipelineError, match="append to /tiny: could not write its 11 "
                                                   "inline bytes as its first block after 3"):
        await hdfs("append", src="/tiny", clientName="DFSClient_J", flag=pb.APPEND)
    async with hdfs.cluster.client() as c:
        after = await hdfs.leasefs("get_file_info", path="/tiny")
        assert not after["under_construction"]
        assert (after["length"], after["mtime_ns"]) == (11, before["mtime_ns"])
        assert (await c.get_block_locations("/tiny")).get("inline") == b"kept inline"
        assert await c.read_file("/tiny") == b"kept inline"
        out = await c.append("/tiny")          # no lease left behind
        await out.write(b"!")
        await out.close()
        assert await c.read_file("/tiny") == b"kept inline!"


async def test_an_inline_file_filling_its_whole_block_is_refused_and_left_as_it_was(hdfs):
    """Inline bytes that fill the file's block (64 KiB blocks, ``inline_max`` 64 KiB; a
    ``complete(data)`` leasefs's writer never sends, as it sends a full block): Hadoop's
    writer would follow with a new block, which is not taken; refused before anything is
    written, the file closed again as it was."""
    full = os.urandom(64 << 10)
    await hdfs.leasefs("create", path="/full", client_name="py")
    assert await hdfs.leasefs("complete", path="/full", client_name="py", data=full)
    async with hdfs.cluster.client() as c:
        assert (await c.get_block_locations("/full")).get("inline") == full
    with pytest.raises(errors.NotSupported, match="fill a whole block"):
        await hdfs("append", src="/full", clientName="DFSClient_J", flag=pb.APPEND)
    async with hdfs.cluster.client() as c:
        assert (await c.get_block_locations("/full")).get("inline") == full
        assert await c.is_file_closed("/full")


SOFT_LIMIT = 1.0


@pytest.mark.parametrize("hdfs", [{"lease_soft_limit": SOFT_LIMIT}], indirect=True)
async def test_renew_lease_keeps_the_file_and_its_expiry_lets_another_holder_in(hdfs):
    """The HDFS clientName is the lease holder: renewals keep other holders out past the
    soft limit; without them the next holder's append recovers the lease and goes on."""
    create = dict(masked=PERM(perm=0o644), createParent=True, replication=1,
                  blockSize=64 << 10, createFlag=pb.CREATE)
    made = await hdfs("create", src="/l", clientName="DFSClient_A", **create)
    for _ in range(6):                                   # 1.5 soft limits, renewed
        # fixed-sleep: the lease's age on the server's clock is what is tested
        await trio.sleep(SOFT_LIMIT / 4)
        await hdfs("renewLease", clientName="DFSClient_A")
    with pytest.raises(errors.AlreadyBeingCreated):
        await hdfs("create", src="/l", clientName="DFSClient_B", **create)
    with pytest.raises(errors.AlreadyBeingCreated):
        await hdfs("append", src="/l", clientName="DFSClient_B", flag=pb.APPEND)

    # fixed-sleep: A stopped renewing; its lease must outlive the soft limit
    await trio.sleep(SOFT_LIMIT * 1.3)
    taken = await hdfs("append", src="/l", clientName="DFSClient_B", flag=pb.APPEND)
    assert taken.stat.fileId == made.fs.fileId and not taken.HasField("block")
    listed = await hdfs("listOpenFiles", id=0, types=[pb.ALL_OPEN_FILES])
    assert [(e.path, e.clientName) for e in listed.entries] == [("/l", "DFSClient_B")]
    with pytest.raises(errors.LeaseExpired):
        await hdfs("addBlock", src="/l", clientName="DFSClient_A", fileId=made.fs.fileId)
    assert (await hdfs("complete", src="/l", clientName="DFSClient_B",
                       fileId=made.fs.fileId)).result is True
