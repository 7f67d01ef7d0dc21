"""HDFS's data-transfer protocol on the block servers' HDFS ports (``storage.hdfs.xfer``):
real metadata server and block server processes, driven by ``fs.hdfs.datatransfer``'s
client the way Hadoop's client drives them, on files and blocks leasefs's own client made.

What must hold: READ_BLOCK serves the replica's bytes with its stored checksums from the
chunk boundary at or below the offset, several ops on one kept-alive connection, a reader
that aborts is normal; WRITE_BLOCK through a 3-node pipeline makes replicas leasefs's own
reader reads byte for byte and the metadata server knows complete at once; a bad checksum
is ERROR_CHECKSUM; hostile input gets a clear error and the server serves on; under
security = secure a read without a valid block token is refused.
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
import urllib.request

import pytest
import trio

from harness import ProcessCluster, storage_index, wait_until
from hadoopkit import HadoopJvm, requires_java

from fs.client import AsyncClient
from fs.errors import ProtocolError
from fs.framing import FramedStream
from fs.hdfs import convert, tokens
from fs.hdfs import datatransfer as hdt
from fs.hdfs.pb import datatransfer_pb2 as dt
from fs.hdfs.pb import hdfs_pb2 as pb

pytestmark = pytest.mark.timeout(240)
slow = pytest.mark.slow   # every test but the codec's starts server processes

SETTINGS = dict(inline_max=0, idle_timeout=3.0)
SIZE = 9 * 1024 * 1024 + 12345      # three read packets and a partial last chunk
DATA = random.Random(35).randbytes(SIZE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-xfer"), n_storage=3,
                        settings=SETTINGS) as running:
        trio.run(_write_file, running, "/read/f", DATA)
        trio.run(_write_file, running, "/read/other", DATA[:5000])
        yield running


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("offset, seqno, last, data_len", [
    (0, 0, False, 65536), (123_456_789_012, -1, True, 0), (1 << 40, 1 << 33, False, 16 << 20)])
def test_the_struct_packet_header_is_protobufs_encoding(offset, seqno, last, data_len, sync):
    reference = dt.PacketHeaderProto(offsetInBlock=offset, seqno=seqno,
                                     lastPacketInBlock=last, dataLen=data_len)
    if sync:
        reference.syncBlock = True
    raw = hdt.encode_packet_header(offset, seqno, last, data_len, sync)
    assert raw == reference.SerializeToString()
    assert len(raw) == (27 if sync else 25)
    assert hdt.parse_packet_header(raw) == (offset, seqno, last, data_len, sync)
    # another valid encoding of the same header (syncBlock = false sent explicitly, fields
    # in another order) is read through protobuf
    other = dt.PacketHeaderProto(dataLen=data_len, offsetInBlock=offset, seqno=seqno,
                                 lastPacketInBlock=last, syncBlock=sync)
    odd = other.SerializeToString()[::-1]   # garbage of the same length: refused clearly
    assert hdt.parse_packet_header(other.SerializeToString()) == (offset, seqno, last,
                                                                  data_len, sync)
    with pytest.raises(ProtocolError, match="malformed PacketHeaderProto"):
        hdt.parse_packet_header(odd + b"\xff")


@pytest.mark.parametrize("seqno, statuses", [(0, [0]), (-1, [0, 0, 0]), (1 << 40, [0, 2]),
                                             (7, [])])
def test_the_hand_made_ack_is_protobufs_encoding(seqno, statuses):
    reference = dt.PipelineAckProto(seqno=seqno, reply=statuses)
    assert hdt.encode_ack(seqno, statuses) == hdt.delimited(reference)


class _Bytes(trio.abc.Stream):
    """A stream that hands out ``data`` in pieces of ``step`` bytes."""

    def __init__(self, data: bytes, step: int):
        self.data, self.step = data, step

    async def receive_some(self, max_bytes=None):
        out, self.data = self.data[:self.step], self.data[self.step:]
        return out

    async def send_all(self, data):
        raise AssertionError("nothing is sent")

    async def wait_send_all_might_not_block(self):
        pass

    async def aclose(self):
        pass


@pytest.mark.parametrize("step", [1, 3, 1 << 20])
def test_acks_are_read_alike_whole_or_in_pieces_and_in_any_encoding(step):
    """Acks in the hand-made form, with a Java node's extra fields (flags, ack time), and
    a truncated one: the same answer as protobuf's, whether
    the ack arrived whole (taken at once) or in pieces."""
    acks = [dt.PipelineAckProto(seqno=seqno, reply=statuses, **extra) for seqno, statuses, extra
            in [(5, [0, 0, 0], {}), (-1, [0], {}), ((1 << 62) + 3, [0, 2], {}),
                (9, [0, 0], {"flag": [0, 0], "downstreamAckTimeNanos": 12345})]]
    raw = b"".join(hdt.delimited(ack) for ack in acks)

    async def main():
        framed = FramedStream(_Bytes(raw + b"\x05\x08\x02", step))
        for ack in acks:
            assert await hdt.receive_ack(framed) == (ack.seqno, list(ack.reply))
        with pytest.raises(EOFError):
            await hdt.receive_ack(framed)
    trio.run(main)


def client_of(cluster) -> AsyncClient:
    return AsyncClient(cluster.meta_address, config=cluster.config())


async def _write_file(cluster, path: str, data: bytes) -> None:
    async with client_of(cluster) as client:
        await client.write_file(path, data)


def hdfs_address(location: dict) -> str:
    host = location["address"].rsplit(":", 1)[0]
    return f"{host}:{location['hdfs_port']}"


async def first_block(cluster, path: str) -> tuple[pb.ExtendedBlockProto, pb.TokenProto, list]:
    async with client_of(cluster) as client:
        answer = await client.get_block_locations(path)
    located = answer["blocks"][0]
    block = located["block"]
    return (pb.ExtendedBlockProto(poolId="BP-1", blockId=block["id"],
                                  generationStamp=block["gs"], numBytes=block["num_bytes"]),
            tokens.to_proto(located.get("token")), located["locations"])


@slow
def test_locations_name_the_hdfs_and_http_ports(cluster):
    async def main():
        _, _, locations = await first_block(cluster, "/read/f")
        assert len(locations) == 3
        for location in locations:
            assert isinstance(location["hdfs_port"], int) and location["hdfs_port"] > 0
            assert isinstance(location["http_port"], int)
            assert location["hdfs_port"] != int(location["address"].rsplit(":", 1)[1])
            node = convert.datanode(location)
            assert node.id.xferPort == location["hdfs_port"]
    trio.run(main)


@slow
def test_read_block_ranges_on_one_kept_alive_connection(cluster):
    async def main():
        block, token, locations = await first_block(cluster, "/read/f")
        async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
            # offset mid-chunk, length across chunks
            got = await c.read_block(block, 5000, 300_000, token=token)
            assert got.response.status == hdt.Status.SUCCESS
            info = got.response.readOpChecksumInfo
            bpc = info.checksum.bytesPerChecksum
            assert info.checksum.type == hdt.CRC32C and bpc == cluster.config().bytes_per_checksum
            assert info.chunkOffset == 5000 - 5000 % bpc
            assert got.data == DATA[5000:305_000]
            # the whole block, in large packets (sent from the replica file), on the same
            # socket
            whole = await c.read_block(block, 0, SIZE, token=token)
            assert whole.data == DATA
            assert whole.packets == 3
            # a range of several packets from mid-block, without checksums
            middle = await c.read_block(block, 4097, 5 << 20, token=token, send_checksums=False)
            assert middle.data == DATA[4097:4097 + (5 << 20)] and middle.packets == 2
            # the last partial chunk alone
            tail = await c.read_block(block, SIZE - 10, 10, token=token)
            assert tail.data == DATA[-10:]
            # without checksums
            bare = await c.read_block(block, 100, 1000, token=token, send_checksums=False)
            assert bare.response.readOpChecksumInfo.checksum.type == hdt.NULL
            assert bare.data == DATA[100:1100]
            # past the end: a clear error, then the connection is closed
            past = await c.read_block(block, SIZE - 10, 11, token=token)
            assert past.response.status == hdt.Status.ERROR
            assert "past the end" in past.response.message
        # the block server's metrics count the ops under their own name
        ops = await trio.to_thread.run_sync(hdfs_ops, locations[0])
        assert ops.get(("HDFS_READ_BLOCK", "ok"), 0) >= 4
        assert ops.get(("HDFS_READ_BLOCK", "InvalidArgument"), 0) >= 1
    trio.run(main)


def hdfs_ops(location: dict) -> dict:
    """(op, result) -> count of the HDFS ops on the /metrics page of ``location``'s node."""
    from prometheus_client.parser import text_string_to_metric_families

    host = location["address"].rsplit(":", 1)[0]
    url = f"http://{host}:{location['http_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.labels["op"], s.labels["result"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "leasefs_storage_ops_total" and s.labels["op"].startswith("HDFS_")}


@slow
def test_a_reader_that_aborts_mid_stream_leaves_the_server_serving(cluster):
    async def main():
        block, token, locations = await first_block(cluster, "/read/f")
        address = hdfs_address(locations[0])
        before = await trio.to_thread.run_sync(hdfs_ops, locations[0])
        async with await hdt.DataTransferClient.connect(address) as c:
            part = await c.read_block(block, 0, SIZE, token=token, abort_after=1)
            assert part.packets == 1

        def reads(ops: dict) -> int:
            return sum(n for (op, _), n in ops.items() if op == "HDFS_READ_BLOCK")

        async def aborted_read_ended() -> bool:
            return reads(await trio.to_thread.run_sync(hdfs_ops, locations[0])) > reads(before)

        assert await wait_until(aborted_read_ended)
        # the reader going away is not the disk's fault: the replica stays
        after = await trio.to_thread.run_sync(hdfs_ops, locations[0])
        assert after.get(("HDFS_READ_BLOCK", "disk_error"), 0) == 0
        assert len((await first_block(cluster, "/read/f"))[2]) == 3
        async with await hdt.DataTransferClient.connect(address) as c:
            assert (await c.read_block(block, 0, 4096, token=token)).data == DATA[:4096]
            # fixed-sleep: the kept-alive connection must take another op after it stood
            # idle for a while (a pooled socket's life in Hadoop's client); idleness is
            # the point, there is no event to wait for
            await trio.sleep(1.0)
            assert (await c.read_block(block, 4096, 10, token=token)).data == DATA[4096:4106]
    trio.run(main)


@pytest.fixture(scope="module")
def simple_cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("hdfs-xfer-simple"), n_storage=1,
                        settings={**SETTINGS, "security": "simple"}) as running:
        trio.run(_write_file, running, "/f", DATA[:100_000])
        yield running


@slow
def test_simple_mode_ignores_tokens_and_names_a_wrong_block_or_stamp(simple_cluster):
    async def main():
        block, token, locations = await first_block(simple_cluster, "/f")
        assert not token.identifier
        address = hdfs_address(locations[0])
        async with await hdt.DataTransferClient.connect(address) as c:
            assert (await c.read_block(block, 10, 20)).data == DATA[10:30]
        unknown = pb.ExtendedBlockProto(poolId="BP-1", blockId=block.blockId + 10**9,
                                        generationStamp=block.generationStamp)
        newer = pb.ExtendedBlockProto(poolId="BP-1", blockId=block.blockId,
                                      generationStamp=block.generationStamp + 5)
        for wrong, says in ((unknown, "no readable replica"), (newer, "older than")):
            async with await hdt.DataTransferClient.connect(address) as c:
                got = await c.read_block(wrong, 0, 10)
            assert got.response.status == hdt.Status.ERROR
            assert says in got.response.message and f"blk_{wrong.blockId}" in \
                got.response.message
    trio.run(main)


async def _create_with_block(client, path: str, replication: int = 3) -> tuple[dict, dict]:
    answer = await client._call("create", path=path, client_name=client.client_name,
                                overwrite=False, create_parent=True, replication=replication,
                                first_block=True)
    return answer["status"], answer["first_block"]


def _block_proto(located: dict, num_bytes: int = 0) -> pb.ExtendedBlockProto:
    return pb.ExtendedBlockProto(poolId="BP-1", blockId=located["block"]["id"],
                                 generationStamp=located["block"]["gs"], numBytes=num_bytes)


@slow
def test_write_block_through_a_three_node_pipeline(cluster):
    data = random.Random(80).randbytes(700_001)

    async def main():
        async with client_of(cluster) as client:
            status, located = await _create_with_block(client, "/write/f")
            locations = located["locations"]
            assert len(locations) == 3
            targets = [convert.datanode(loc) for loc in locations[1:]]
            block = _block_proto(located)
            async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
                result = await c.write_block(block, data, targets=targets,
                                             token=tokens.to_proto(located.get("token")),
                                             sync_seqnos={3}, heartbeat=True)
            assert result.response.status == hdt.Status.SUCCESS, result.response
            seqnos = [seqno for seqno, _ in result.acks]
            packets = -(-len(data) // 64512)
            assert seqnos == [-1, *range(packets + 1)]
            assert all(statuses == [hdt.Status.SUCCESS] * 3 for _, statuses in result.acks)
            # the last ack came after the replicas were reported: complete answers true
            # at its first call
            started = time.monotonic()
            done = await client._call("complete", path="/write/f",
                                      client_name=client.client_name, ino=status["ino"],
                                      last={**located["block"], "num_bytes": len(data)})
            assert done is True and time.monotonic() - started < 1.0
            assert await client.read_file("/write/f") == data
            answer = await client.get_block_locations("/write/f")
            assert answer["length"] == len(data)
            assert len(answer["blocks"][0]["locations"]) == 3
            # each replica kept the writer's 512-byte chunks and its CRCs
            read_token = tokens.to_proto(answer["blocks"][0].get("token"))
            block.numBytes = len(data)
            for location in answer["blocks"][0]["locations"]:
                async with await hdt.DataTransferClient.connect(hdfs_address(location)) as c:
                    got = await c.read_block(block, 1000, len(data) - 1000, token=read_token)
                assert got.response.readOpChecksumInfo.checksum.bytesPerChecksum == 512
                assert got.data == data[1000:]
    trio.run(main)


async def _recover_two_and_complete(client, path: str, status: dict, located: dict,
                                    nodes: list[dict], data: bytes, kept: int) -> int:
    """A writer's pipeline recovery onto ``nodes`` (two): a new stamp, a STREAMING_RECOVERY
    setup keeping ``kept`` bytes, the rest of ``data`` through both, ``update_pipeline``,
    ``complete``. Returns the new stamp."""
    fresh = await client._call("update_block_for_pipeline", block=located["block"],
                               client_name=client.client_name)
    new_gs = fresh["block"]["gs"]
    async with await hdt.DataTransferClient.connect(hdfs_address(nodes[0])) as c:
        result = await c.write_block(
            _block_proto(located), data[kept:], start=kept, new_gs=new_gs,
            stage=hdt.Stage.PIPELINE_SETUP_STREAMING_RECOVERY,
            targets=[convert.datanode(nodes[1])], token=tokens.to_proto(fresh.get("token")))
    assert result.response.status == hdt.Status.SUCCESS, result.response
    assert all(statuses == [hdt.Status.SUCCESS] * 2 for _, statuses in result.acks)
    new_block = {"id": located["block"]["id"], "gs": new_gs, "num_bytes": len(data)}
    assert await client._call("update_pipeline", client_name=client.client_name,
                              old_block=located["block"], new_block=new_block,
                              new_nodes=[node["node_id"] for node in nodes])
    assert await client._call("complete", path=path, client_name=client.client_name,
                              ino=status["ino"], last=new_block) is True
    return new_gs


@slow
def test_streaming_recovery_drops_a_node_and_keeps_the_acknowledged_bytes(cluster):
    data = random.Random(82).randbytes(5 * 64512 + 999)
    kept = 3 * 64512      # acknowledged by every node before the pipeline broke

    async def main():
        async with client_of(cluster) as client:
            status, located = await _create_with_block(client, "/write/recovered")
            locations = located["locations"]
            first = hdfs_address(locations[0])
            async with await hdt.DataTransferClient.connect(first) as c:
                result = await c.write_block(
                    _block_proto(located), data[:kept], finish=False,
                    targets=[convert.datanode(loc) for loc in locations[1:]],
                    token=tokens.to_proto(located.get("token")))
            assert [seqno for seqno, _ in result.acks] == [0, 1, 2]
            # the writer recovers without the last node: a new stamp, the same replicas
            new_gs = await _recover_two_and_complete(client, "/write/recovered", status,
                                                     located, locations[:2], data, kept)
            assert new_gs > located["block"]["gs"]
            assert await client.read_file("/write/recovered") == data
            answer = await client.get_block_locations("/write/recovered")
            assert answer["blocks"][0]["block"]["gs"] == new_gs
            assert {loc["node_id"] for loc in answer["blocks"][0]["locations"]} >= \
                {loc["node_id"] for loc in locations[:2]}
    trio.run(main)


@slow
def test_close_recovery_restamps_finalized_replicas(cluster):
    """A close whose last ack was lost: the replicas are FINALIZED already; the writer's
    PIPELINE_CLOSE_RECOVERY under a new stamp sends only the last packet again."""
    data = random.Random(83).randbytes(100_000)

    async def main():
        async with client_of(cluster) as client:
            status, located = await _create_with_block(client, "/write/closed")
            locations = located["locations"]
            first = hdfs_address(locations[0])
            targets = [convert.datanode(loc) for loc in locations[1:]]
            async with await hdt.DataTransferClient.connect(first) as c:
                result = await c.write_block(_block_proto(located), data, targets=targets,
                                             token=tokens.to_proto(located.get("token")))
            assert all(statuses == [hdt.Status.SUCCESS] * 3 for _, statuses in result.acks)
            fresh = await client._call("update_block_for_pipeline", block=located["block"],
                                       client_name=client.client_name)
            new_gs = fresh["block"]["gs"]
            async with await hdt.DataTransferClient.connect(first) as c:
                result = await c.write_block(
                    _block_proto(located), b"", start=len(data), new_gs=new_gs,
                    stage=hdt.Stage.PIPELINE_CLOSE_RECOVERY, targets=targets,
                    token=tokens.to_proto(fresh.get("token")))
            assert result.response.status == hdt.Status.SUCCESS, result.response
            assert result.acks == [(0, [hdt.Status.SUCCESS] * 3)]
            new_block = {"id": located["block"]["id"], "gs": new_gs, "num_bytes": len(data)}
            assert await client._call("update_pipeline", client_name=client.client_name,
                                      old_block=located["block"], new_block=new_block,
                                      new_nodes=[loc["node_id"] for loc in locations])
            assert await client._call("complete", path="/write/closed",
                                      client_name=client.client_name, ino=status["ino"],
                                      last=new_block) is True
            assert await client.read_file("/write/closed") == data
            block = _block_proto(located, len(data))
            block.generationStamp = new_gs
            answer = await client.get_block_locations("/write/closed")
            token = tokens.to_proto(answer["blocks"][0].get("token"))
            for location in locations:   # every replica carries the new stamp
                async with await hdt.DataTransferClient.connect(hdfs_address(location)) as c:
                    assert (await c.read_block(block, 0, len(data), token=token)).data == data
    trio.run(main)


@slow
def test_a_replica_written_over_hdfs_is_re_replicated_as_leasefs_own(cluster):
    """Raise the replication of a file two HDFS-written replicas hold: the metadata server
    has a block server copy one (leasefs's own copy, at the replica's 512-byte chunks) to
    the third node, which then serves it over HDFS too."""
    data = random.Random(84).randbytes(300_000)

    async def main():
        async with client_of(cluster) as client:
            status, located = await _create_with_block(client, "/write/setrep", replication=2)
            locations = located["locations"]
            assert len(locations) == 2
            async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
                result = await c.write_block(_block_proto(located), data,
                                             targets=[convert.datanode(locations[1])],
                                             token=tokens.to_proto(located.get("token")))
            assert result.acks[-1][1] == [hdt.Status.SUCCESS] * 2
            last = {**located["block"], "num_bytes": len(data)}
            assert await client._call("complete", path="/write/setrep",
                                      client_name=client.client_name, ino=status["ino"],
                                      last=last) is True
            await client.set_replication("/write/setrep", 3)

            async def three():
                answer = await client.get_block_locations("/write/setrep")
                return answer if len(answer["blocks"][0]["locations"]) == 3 else None
            answer = await wait_until(three, timeout=30)
            assert answer, "the third replica was not made"
            new = [loc for loc in answer["blocks"][0]["locations"]
                   if loc["node_id"] not in {n["node_id"] for n in locations}]
            block = _block_proto(located, len(data))
            token = tokens.to_proto(answer["blocks"][0].get("token"))
            async with await hdt.DataTransferClient.connect(hdfs_address(new[0])) as c:
                got = await c.read_block(block, 0, len(data), token=token)
            assert got.response.readOpChecksumInfo.checksum.bytesPerChecksum == 512
            assert got.data == data
    trio.run(main)


@slow
def test_a_bad_checksum_is_error_checksum_and_the_server_serves_on(cluster):
    data = random.Random(81).randbytes(200_000)

    async def main():
        async with client_of(cluster) as client:
            _, located = await _create_with_block(client, "/write/bad")
            locations = located["locations"]
            targets = [convert.datanode(loc) for loc in locations[1:]]
            async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
                result = await c.write_block(_block_proto(located), data, targets=targets,
                                             token=tokens.to_proto(located.get("token")),
                                             corrupt_seqno=1)
            assert result.response.status == hdt.Status.SUCCESS
            assert result.acks[0] == (0, [hdt.Status.SUCCESS] * 3)
            assert result.acks[-1] == (1, [hdt.Status.ERROR_CHECKSUM])
        block, token, locs = await first_block(cluster, "/read/f")
        async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
            assert (await c.read_block(block, 0, 100, token=token)).data == DATA[:100]
    trio.run(main)


@slow
def test_a_failed_downstream_names_the_first_bad_link(cluster):
    async def main():
        async with client_of(cluster) as client:
            _, located = await _create_with_block(client, "/write/badlink")
            locations = located["locations"]
            dead = convert.datanode(locations[1])
            with socket.socket() as probe:   # a port nothing listens on
                probe.bind(("127.0.0.1", 0))
                dead.id.xferPort = probe.getsockname()[1]
            async with await hdt.DataTransferClient.connect(hdfs_address(locations[0])) as c:
                result = await c.write_block(_block_proto(located), b"x" * 1000,
                                             targets=[dead],
                                             token=tokens.to_proto(located.get("token")))
            assert result.response.status == hdt.Status.ERROR
            assert result.response.firstBadLink == f"127.0.0.1:{dead.id.xferPort}"
    trio.run(main)


def _replica_files(cluster, location: dict, block_id: int) -> list:
    """The files of ``block_id``'s replica in the data folder of the block server at
    ``location``."""
    folder = cluster.storage_dir(storage_index(cluster, location["address"]))
    return sorted(folder.rglob(f"blk_{block_id}*"))


@slow
def test_a_failed_setup_keeps_its_empty_replica_for_the_writers_recovery(cluster):
    """A WRITE_BLOCK whose downstream is unreachable keeps the new, empty RBW replica (as
    HDFS does): the writer's recovery with a replacement has it copied (TRANSFER_BLOCK of 0
    bytes) and writes the block on through both; a replica a failed setup left behind goes
    once the writer abandons its block."""
    data = random.Random(86).randbytes(200_000)

    async def failed_setup(located: dict) -> None:
        dead = convert.datanode(located["locations"][2])
        with socket.socket() as probe:   # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            dead.id.xferPort = probe.getsockname()[1]
        first = hdfs_address(located["locations"][0])
        async with await hdt.DataTransferClient.connect(first) as c:
            result = await c.write_block(_block_proto(located), b"", targets=[dead],
                                         token=tokens.to_proto(located.get("token")))
        assert result.response.status == hdt.Status.ERROR
        assert result.response.firstBadLink == f"127.0.0.1:{dead.id.xferPort}"

    async def main():
        async with client_of(cluster) as client:
            status, located = await _create_with_block(client, "/write/kept-empty")
            first, second = located["locations"][:2]
            await failed_setup(located)
            # the writer keeps the first node, takes a replacement for the third and has
            # the first copy it the zero bytes every node acknowledged
            extra = await client._call(
                "get_additional_datanode", path="/write/kept-empty", ino=status["ino"],
                block=located["block"], existing=[first["node_id"]],
                excluded=[located["locations"][2]["node_id"]], num=1,
                client_name=client.client_name)
            assert [n["node_id"] for n in extra["locations"]] == [second["node_id"]]
            transfer = dt.OpTransferBlockProto(
                header=hdt.op_header(_block_proto(located), tokens.to_proto(extra["token"]),
                                     "leasefs-test"),
                targets=[convert.datanode(second)])
            answer = _answer(await _raw(hdfs_address(first),
                                        hdt.encode_op(hdt.TRANSFER_BLOCK, transfer),
                                        then_close=True))
            assert answer.status == hdt.Status.SUCCESS, answer.message
            # then the recovered pipeline through both writes the block
            await _recover_two_and_complete(client, "/write/kept-empty", status, located,
                                            [first, second], data, 0)
            assert await client.read_file("/write/kept-empty") == data

            # a failed setup answered by abandonBlock: the empty replica does not stay
            status, located = await _create_with_block(client, "/write/abandoned")
            await failed_setup(located)
            block_id = located["block"]["id"]
            assert _replica_files(cluster, located["locations"][0], block_id)
            await client._call("abandon_block", path="/write/abandoned",
                               client_name=client.client_name, ino=status["ino"],
                               block=located["block"])
            assert await wait_until(lambda: not _replica_files(
                cluster, located["locations"][0], block_id), timeout=30)
    trio.run(main)


async def _raw(address: str, data: bytes, then_close: bool = False) -> bytes:
    """Send ``data``, answer everything the server sends until it closes."""
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(data)
        if then_close:
            await stream.send_eof()
        out = b""
        with trio.fail_after(20):
            while chunk := await stream.receive_some(65536):
                out += chunk
        return out


def _answer(raw: bytes, cls=dt.BlockOpResponseProto):
    n, i = 0, 0
    shift = 0
    while True:
        byte = raw[i]
        n |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            break
    message = cls()
    message.ParseFromString(raw[i:i + n])
    return message


@slow
def test_hostile_input_gets_a_clear_error_and_the_server_serves_on(cluster):
    async def main():
        block, token, locations = await first_block(cluster, "/read/f")
        address = hdfs_address(locations[0])
        read = dt.OpReadBlockProto(header=hdt.op_header(block, token, "t"), offset=0, len=10)
        # another protocol version
        answer = _answer(await _raw(address, b"\x00\x1b\x51" + hdt.delimited(read)))
        assert answer.status == hdt.Status.ERROR and "version 27" in answer.message
        # an op this server does not serve
        answer = _answer(await _raw(address, b"\x00\x1c\x57" + hdt.delimited(read)))
        assert answer.status == hdt.Status.ERROR_UNSUPPORTED
        assert "REQUEST_SHORT_CIRCUIT_FDS" in answer.message
        # garbage where the request should be, and a request too long to hold
        answer = _answer(await _raw(address, b"\x00\x1c\x51\x05\xff\xff\xff\xff\xff"))
        assert answer.status == hdt.Status.ERROR and "malformed OpReadBlockProto" in answer.message
        answer = _answer(await _raw(address, b"\x00\x1c\x51\xff\xff\xff\xff\x0f"))
        assert answer.status == hdt.Status.ERROR and "more than" in answer.message
        # SASL: refused with a message in SASL's own answer
        answer = _answer(await _raw(address, b"\xde\xad\xbe\xef\x00"),
                         dt.DataTransferEncryptorMessageProto)
        assert answer.status == dt.DataTransferEncryptorMessageProto.ERROR
        assert "SASL" in answer.message
        # a slow peer (half an op header) is dropped after idle_timeout
        started = time.monotonic()
        assert await _raw(address, b"\x00") == b""
        assert time.monotonic() - started >= SETTINGS["idle_timeout"] - 0.5
        # a write whose packet claims more than 16 MiB: an ERROR ack, nothing allocated
        async with client_of(cluster) as client:
            _, located = await _create_with_block(client, "/write/huge")
        write = dt.OpWriteBlockProto(
            header=hdt.op_header(_block_proto(located), tokens.to_proto(located.get("token")),
                                 "t"),
            stage=hdt.Stage.PIPELINE_SETUP_CREATE, pipelineSize=1, minBytesRcvd=0,
            maxBytesRcvd=0, latestGenerationStamp=0,
            requestedChecksum=dt.ChecksumProto(type=hdt.CRC32C, bytesPerChecksum=512))
        huge = hdt.PACKET_PREFIX.pack(1 << 30, 25) + hdt.encode_packet_header(0, 0, False, 1 << 29)
        raw = await _raw(hdfs_address(located["locations"][0]),
                         hdt.encode_op(hdt.WRITE_BLOCK, write) + huge)
        answer = _answer(raw)
        assert answer.status == hdt.Status.SUCCESS
        rest = raw[len(hdt.delimited(answer)):]
        ack = _answer(rest, dt.PipelineAckProto)
        assert list(ack.reply) == [hdt.Status.ERROR]
        # and the server still serves
        async with await hdt.DataTransferClient.connect(address) as c:
            assert (await c.read_block(block, 0, 100, token=token)).data == DATA[:100]
    trio.run(main)


@slow
def test_secure_mode_refuses_a_read_without_a_valid_token(cluster):
    async def main():
        block, token, locations = await first_block(cluster, "/read/f")
        assert token.identifier, "security = secure hands out block tokens"
        _, other_token, _ = await first_block(cluster, "/read/other")
        address = hdfs_address(locations[0])
        forged = pb.TokenProto(identifier=token.identifier, password=b"x" * len(token.password),
                               kind=token.kind, service="")
        for bad in (None, other_token, forged):
            async with await hdt.DataTransferClient.connect(address) as c:
                got = await c.read_block(block, 0, 10, token=bad)
            assert got.response.status == hdt.Status.ERROR_ACCESS_TOKEN, bad
            assert f"{block.blockId}" in got.response.message
    trio.run(main)


@pytest.fixture(scope="module")
def jvm():
    """Hadoop's own client classes in one JVM for the module (py4j, as PySpark drives it)."""
    with HadoopJvm(heap="256m") as held:   # stopped with the module, not the session
        yield held.gateway


def _java_socket(jvm, address: str):
    host, port = address.rsplit(":", 1)
    return jvm.java.nio.channels.SocketChannel.open(
        jvm.java.net.InetSocketAddress(host, int(port))).socket()


@slow
@requires_java
def test_hadoops_own_block_reader_reads_on_one_pooled_socket(simple_cluster, jvm):
    """Hadoop's BlockReaderRemote (what DFSInputStream reads with) checks every chunk's
    CRC, the chunk offset and the last packet, sends its read status and puts the socket
    back in its PeerCache, which the next two reads take it from."""
    j = jvm.jvm
    data = DATA[:100_000]

    async def locate():
        return await first_block(simple_cluster, "/f")
    block, _, locations = trio.run(locate)
    address = hdfs_address(locations[0])
    host, port = address.rsplit(":", 1)
    hadoop = j.org.apache.hadoop
    extended = hadoop.hdfs.protocol.ExtendedBlock("BP-1", block.blockId, block.numBytes,
                                                  block.generationStamp)
    node = hadoop.hdfs.protocol.DatanodeID(host, host, "node-0", int(port), 0, 0, 0)
    cache = hadoop.hdfs.PeerCache(16, 10_000)
    peer = hadoop.hdfs.net.NioInetPeer(_java_socket(j, address))
    for offset, length in ((5000, 30_000), (0, len(data)), (len(data) - 10, 10)):
        if peer is None:
            peer = cache.get(node, False)
            assert peer is not None, "the socket went back to Hadoop's peer cache"
        reader = hadoop.hdfs.client.impl.BlockReaderRemote.newBlockReader(
            "/f", extended, hadoop.security.token.Token(), offset, length, True, "java-test",
            peer, node, cache, hadoop.hdfs.server.datanode.CachingStrategy.newDefaultStrategy(),
            0, hadoop.conf.Configuration(False))
        # py4j passes byte arrays by value: the reader fills a ByteBuffer instead
        buf = j.java.nio.ByteBuffer.allocate(length)
        while buf.hasRemaining():
            assert reader.read(buf) > 0
        reader.close()
        peer = None
        md5 = j.java.security.MessageDigest.getInstance("MD5")
        md5.update(buf.flip())
        assert bytes(md5.digest()) == hashlib.md5(data[offset:offset + length]).digest()


@slow
@requires_java
def test_hadoops_own_sender_writes_a_pipeline_and_reads_its_acks(simple_cluster, jvm):
    """The op as Hadoop's Sender encodes it (all pipeline nodes given, the first dropped on
    the wire), its PacketHeader, and its PipelineAck reading our acks."""
    j = jvm.jvm
    hadoop = j.org.apache.hadoop
    data = random.Random(86).randbytes(200_000)

    async def create():
        async with client_of(simple_cluster) as client:
            status, located = await _create_with_block(client, "/java/w")
            return client.client_name, status, located
    holder, status, located = trio.run(create)
    locations = located["locations"]
    address = hdfs_address(locations[0])
    sock = _java_socket(j, address)
    out = j.java.io.DataOutputStream(j.java.io.BufferedOutputStream(sock.getOutputStream()))
    into = j.java.io.DataInputStream(sock.getInputStream())
    nodes = jvm.new_array(hadoop.hdfs.protocol.DatanodeInfo, 1)
    host, port = address.rsplit(":", 1)
    nodes[0] = hadoop.hdfs.protocol.DatanodeInfo.DatanodeInfoBuilder().setNodeID(
        hadoop.hdfs.protocol.DatanodeID(host, host, "node-0", int(port), 0, 0, 0)).build()
    disk = hadoop.fs.StorageType.DISK
    types = jvm.new_array(hadoop.fs.StorageType, 1)
    types[0] = disk
    ids = jvm.new_array(j.java.lang.String, 1)
    ids[0] = "DS-0"
    checksum = hadoop.util.DataChecksum.newDataChecksum(hadoop.util.DataChecksum.Type.CRC32C,
                                                        512)
    block = hadoop.hdfs.protocol.ExtendedBlock("BP-1", located["block"]["id"], 0,
                                               located["block"]["gs"])
    hadoop.hdfs.protocol.datatransfer.Sender(out).writeBlock(
        block, disk, hadoop.security.token.Token(), "java-test", nodes, types, None,
        hadoop.hdfs.protocol.datatransfer.BlockConstructionStage.PIPELINE_SETUP_CREATE, 1,
        0, 0, 0, checksum, hadoop.hdfs.server.datanode.CachingStrategy.newDefaultStrategy(),
        False, False, None, "DS-0", ids)
    out.flush()
    proto = hadoop.hdfs.protocol.proto.DataTransferProtos.BlockOpResponseProto
    answer = proto.parseFrom(hadoop.hdfs.protocolPB.PBHelperClient.vintPrefixed(into))
    assert answer.getStatus().toString() == "SUCCESS"
    header = hadoop.hdfs.protocol.datatransfer.PacketHeader
    step, seqno = 64512, 0
    for pos in range(0, len(data), step):
        chunk = data[pos:pos + step]
        sums = hdt.chunk_checksums(chunk, 512)
        header(4 + len(sums) + len(chunk), pos, seqno, False, len(chunk), seqno == 1).write(out)
        out.write(sums + chunk)
        seqno += 1
    header(4, len(data), seqno, True, 0, False).write(out)
    out.flush()
    for expected in range(seqno + 1):
        ack = hadoop.hdfs.protocol.datatransfer.PipelineAck()
        ack.readFields(into)
        assert ack.getSeqno() == expected and ack.isSuccess() and ack.getNumOfReplies() == 1
    sock.close()

    async def finish():
        async with client_of(simple_cluster) as client:
            last = {**located["block"], "num_bytes": len(data)}
            assert await client._call("complete", path="/java/w", client_name=holder,
                                      ino=status["ino"], last=last) is True
            assert await client.read_file("/java/w") == data
    trio.run(finish)


@slow
def test_secure_mode_refuses_a_write_without_a_valid_token(cluster):
    async def main():
        async with client_of(cluster) as client:
            _, located = await _create_with_block(client, "/write/tokenless")
            _, read_token, _ = await first_block(cluster, "/read/f")
        address = hdfs_address(located["locations"][0])
        for bad in (None, read_token):   # none, and one for another block and use
            async with await hdt.DataTransferClient.connect(address) as c:
                result = await c.write_block(_block_proto(located), b"x" * 1000, token=bad)
            assert result.response.status == hdt.Status.ERROR_ACCESS_TOKEN
            assert not result.acks
        # the refused ops created nothing: the writer's own token still creates the replica
        async with await hdt.DataTransferClient.connect(address) as c:
            result = await c.write_block(_block_proto(located), b"x" * 1000,
                                         token=tokens.to_proto(located.get("token")))
        assert result.acks[-1] == (1, [hdt.Status.SUCCESS])
    trio.run(main)
