"""Block recovery and append on the block server: the pure length decision (the whole table
of docs/PROTOCOL.md §4), INIT_REPLICA_RECOVERY / UPDATE_REPLICA_UNDER_RECOVERY on real replica
files, the RECOVER_BLOCK worker end to end through real block servers and a recording fake
metadata server (commit_block_synchronization), and WRITE_BLOCK PIPELINE_SETUP_APPEND through
a two-node pipeline."""

from __future__ import annotations

import pytest
import trio

from fs.datatransfer import PIPELINE_SETUP_APPEND, block_dict, chunk_checksums
from fs.errors import InvalidArgument, ProtocolError, ReplicaNotFound, StaleGenerationStamp
from fs.rpc import format_address, serve_rpc, serve_tcp
from storage.recovery import (INIT_REPLICA_RECOVERY, UPDATE_REPLICA_UNDER_RECOVERY, Decision,
                              ReplicaRecoveryInfo, call_recovery_op, decide)
from storage.replicas import ReplicaState, ReplicaStore
from test_storage import (BPC, FakeMeta, Node, connect, data_packets, expected_meta,
                          make_config, open_write, read_block, replica_paths, stream_packets,
                          wait_for, write_block)

pytestmark = pytest.mark.timeout(60)

FIN, RBW, RWR = ReplicaState.FINALIZED, ReplicaState.RBW, ReplicaState.RWR
DATA = bytes(range(256)) * 40   # 10240 bytes, distinct per offset


# --------------------------------------------------------------------------- pure decision


def info(node, state, length, gs=1):
    return ReplicaRecoveryInfo(node, length, gs, state)


def nodes_of(decision: Decision) -> list[str]:
    return sorted(p.node_id for p in decision.participants)


@pytest.mark.parametrize("replicas,new_length,length,participants,delete", [
    # FIN+FIN: the finalized length, both take part
    ([info("a", FIN, 3000), info("b", FIN, 3000)], None, 3000, ["a", "b"], False),
    # FIN+RBW of the same length: both
    ([info("a", FIN, 3000), info("b", RBW, 3000)], None, 3000, ["a", "b"], False),
    # FIN+RBW of a different length (longer or shorter): only the finalized one
    ([info("a", FIN, 3000), info("b", RBW, 2000)], None, 3000, ["a"], False),
    ([info("a", FIN, 3000), info("b", RBW, 4000)], None, 3000, ["a"], False),
    # FIN+RWR: an RWR never takes part next to a finalized replica, even of equal length
    ([info("a", FIN, 3000), info("b", RWR, 3000)], None, 3000, ["a"], False),
    # RBW+RBW: the minimum, both cut to it
    ([info("a", RBW, 3000), info("b", RBW, 2100), info("c", RBW, 2500)], None, 2100,
     ["a", "b", "c"], False),
    # RBW+RWR: RBW wins even when shorter or longer than the RWR
    ([info("a", RBW, 3000), info("b", RWR, 1000)], None, 3000, ["a"], False),
    ([info("a", RBW, 1000), info("b", RWR, 3000)], None, 1000, ["a"], False),
    # RWR+RWR: the minimum
    ([info("a", RWR, 3000), info("b", RWR, 2000)], None, 2000, ["a", "b"], False),
    # all empty: the block is dropped
    ([info("a", RBW, 0), info("b", RBW, 0)], None, 0, [], True),
    ([info("a", RWR, 0)], None, 0, [], True),
    # an empty RBW next to longer RWRs still decides 0: RBW beats RWR
    ([info("a", RBW, 0), info("b", RWR, 500)], None, 0, [], True),
    # a finalized empty replica keeps the (empty) block
    ([info("a", FIN, 0), info("b", RBW, 0)], None, 0, ["a", "b"], False),
    # truncate: new_length overrides, every replica long enough takes part, whatever state
    ([info("a", FIN, 3000), info("b", RBW, 1500), info("c", RWR, 1000)], 1200, 1200,
     ["a", "b"], False),
    ([info("a", FIN, 3000), info("b", FIN, 3000)], 1, 1, ["a", "b"], False),
])
def test_length_decision_table(replicas, new_length, length, participants, delete):
    decision = decide(replicas, new_length)
    assert decision.length == length
    assert nodes_of(decision) == participants
    assert decision.delete_block is delete


def test_decision_errors_and_inconsistent_finalized_lengths():
    with pytest.raises(ReplicaNotFound):
        decide([])
    with pytest.raises(InvalidArgument, match="no replica holds 5000"):
        decide([info("a", RBW, 3000)], new_length=5000)
    # finalized replicas that disagree: the longest wins, the shorter one is left out
    decision = decide([info("a", FIN, 2000), info("b", FIN, 3000), info("c", RBW, 3000)])
    assert (decision.length, nodes_of(decision)) == (3000, ["b", "c"])
    # states as strings (from the wire) work too
    assert decide([ReplicaRecoveryInfo("a", 7, 1, "RWR")]).length == 7


# --------------------------------------------------------------------------- store level


async def open_store(path) -> ReplicaStore:
    store = ReplicaStore(str(path), disk_io_threads=2)
    await store.open()
    return store


async def rbw_with(store: ReplicaStore, block_id: int, gs: int, data: bytes):
    replica = await store.create_rbw(block_id, gs, BPC)
    for pos in range(0, len(data), 1024):
        piece = data[pos:pos + 1024]
        await store.write_packet(replica, pos, piece, chunk_checksums(piece, BPC))
        replica.set_visible(pos + len(piece), None)
    return replica


async def test_init_and_update_on_real_files_cut_the_last_chunk_and_survive_restart(tmp_path):
    store = await open_store(tmp_path)
    replica = await rbw_with(store, 7, 3, DATA[:3000])
    # stale stamps are refused: block newer than the replica, recovery id not newer
    with pytest.raises(StaleGenerationStamp, match="older than"):
        await store.init_replica_recovery(7, 4, 10)
    with pytest.raises(StaleGenerationStamp, match="not older than recovery id 3"):
        await store.init_replica_recovery(7, 3, 3)
    with pytest.raises(ReplicaNotFound):
        await store.init_replica_recovery(8, 3, 10)
    got = await store.init_replica_recovery(7, 3, 10)
    assert got is replica and replica.state is ReplicaState.RUR
    assert replica.original_state is RBW and replica.num_bytes == 3000
    assert replica.writer is None
    # RUR is reported as what it was, so a full report does not drop it
    assert store.block_report() == [[7, 3, 3000, "RBW"]]
    # an older or equal recovery id is stale; a newer one takes over
    with pytest.raises(StaleGenerationStamp, match="stale"):
        await store.init_replica_recovery(7, 3, 9)
    await store.init_replica_recovery(7, 3, 11)
    with pytest.raises(StaleGenerationStamp):
        await store.update_replica_under_recovery(7, 10, 2000)
    with pytest.raises(InvalidArgument, match="cannot set length 3001"):
        await store.update_replica_under_recovery(7, 11, 3001)
    # readers cannot use a replica under recovery
    with pytest.raises(ReplicaNotFound):
        store.readable(7, 3)
    await store.update_replica_under_recovery(7, 11, 2100)   # mid chunk: 2100 % 512 = 52
    assert (replica.state, replica.gs, replica.num_bytes) == (FIN, 11, 2100)
    store.close()
    data_path = tmp_path / "finalized" / replica.data_path.split("/finalized/")[1]
    assert data_path.read_bytes() == DATA[:2100]
    meta_path = data_path.parent / "blk_7_11.meta"
    assert meta_path.read_bytes() == expected_meta(DATA[:2100])
    assert not list((tmp_path / "rbw").iterdir())
    assert not (data_path.parent / "blk_7_3.meta").exists()
    # after a restart the scan finds it finalized with the recovery id as its stamp
    again = await open_store(tmp_path)
    assert again.block_report() == [[7, 11, 2100, "FINALIZED"]]
    again.close()


async def test_finalized_replica_recovery_keeps_it_in_place_with_a_new_stamp(tmp_path):
    store = await open_store(tmp_path)
    replica = await rbw_with(store, 9, 2, DATA[:1500])
    await store.finalize(replica)
    await store.init_replica_recovery(9, 2, 5)
    assert replica.original_state is FIN
    with pytest.raises(InvalidArgument):   # a recovering replica cannot be appended to
        await store.reopen_for_append(9, 6, 1500)
    await store.update_replica_under_recovery(9, 5, 1500)
    assert (replica.state, replica.gs) == (FIN, 5)
    reader = await store.open_reader(9, 5)
    try:
        data, sums = await store.run_io(reader.read, 0, 1500)
    finally:
        await store.close_reader(reader)
    assert data == DATA[:1500] and sums == chunk_checksums(DATA[:1500], BPC)
    store.close()


# --------------------------------------------------------------------------- end to end


class RecoveryMeta(FakeMeta):
    """FakeMeta that also records commit_block_synchronization (optionally refusing it)."""

    def __init__(self):
        super().__init__()
        self.commits: list[dict] = []
        self.refuse_commit = False

    async def rpc_commit_block_synchronization(self, ctx, block, recovery_id, new_length,
                                               close_file, delete_block, new_targets):
        args = dict(block=block, recovery_id=recovery_id, new_length=new_length,
                    close_file=close_file, delete_block=delete_block, new_targets=new_targets)
        self.calls.append(("commit_block_synchronization", args))
        if self.refuse_commit:
            raise StaleGenerationStamp(f"recovery id {recovery_id} is stale")
        self.commits.append(args)
        return True


async def start_recovery_cluster(nursery, tmp_path, n: int):
    config = make_config()
    meta = RecoveryMeta()
    bound = await nursery.start(
        serve_tcp, lambda stream, peer: serve_rpc(stream, meta, peer=peer), "127.0.0.1", 0)
    meta_address = format_address(bound)
    nodes = [await Node(nursery, config, tmp_path / f"dn{i}", meta_address).start()
             for i in range(n)]
    await wait_for(lambda: all(node.server.heartbeat.registered for node in nodes))
    return meta, nodes


def recover_command(block_id, gs, recovery_id, nodes, new_length=None):
    return {"type": "RECOVER_BLOCK", "block": block_dict(block_id, gs),
            "recovery_id": recovery_id, "new_length": new_length,
            "targets": [{"node_id": n.node_id, "address": n.address} for n in nodes]}


async def run_recovery(meta: RecoveryMeta, primary: Node, command: dict, timeout=10.0):
    """Queue the command for the primary's next heartbeat and wait until its worker ends."""
    worker = primary.server.heartbeat.recovery
    before = len(worker.finished)
    meta.commands.setdefault(primary.node_id, []).append(command)
    await wait_for(lambda: len(worker.finished) > before, timeout, "the recovery to end")
    return worker.finished[-1]


async def test_recover_fin_and_shorter_rbw_commits_the_finalized_length(tmp_path):
    """FIN+RBW of different lengths; the primary is the RBW holder (left out itself)."""
    async with trio.open_nursery() as nursery:
        meta, (fin, rbw) = await start_recovery_cluster(nursery, tmp_path, 2)
        await write_block(fin.address, 21, 1, DATA[:3000])
        await write_block(rbw.address, 21, 1, DATA[:2000], last=False)
        await wait_for(lambda: rbw.store.get(21).writer is None)
        outcome = await run_recovery(meta, rbw, recover_command(21, 1, 5, [fin, rbw]))
        assert outcome == (21, 5, "committed")
        assert meta.commits == [{"block": {"id": 21, "gs": 1}, "recovery_id": 5,
                                 "new_length": 3000, "close_file": True,
                                 "delete_block": False, "new_targets": [fin.node_id]}]
        # the finalized replica got the recovery id; the RBW one stays under recovery
        response, data, _ = await read_block(fin.address, 21, 5)
        assert data == DATA[:3000]
        assert [21, 5, 3000, "FINALIZED"] in meta.received(fin.node_id)
        assert rbw.store.get(21).state is ReplicaState.RUR
        data_path, meta_path = replica_paths(fin, 21, 5)
        assert meta_path.read_bytes() == expected_meta(DATA[:3000])
        nursery.cancel_scope.cancel()


async def test_recover_rbw_rbw_stops_a_live_writer_and_cuts_both_to_the_minimum(tmp_path):
    async with trio.open_nursery() as nursery:
        meta, (a, b) = await start_recovery_cluster(nursery, tmp_path, 2)
        await write_block(b.address, 22, 1, DATA[:2100], last=False)
        # a's writer is alive: its pipeline is open, 3000 bytes acknowledged
        framed, response = await open_write(a.address, 22, 1)
        assert response["status"] == "SUCCESS"
        acks = await stream_packets(framed, data_packets(DATA[:3000], last=False))
        assert len(acks) == len(data_packets(DATA[:3000], last=False))
        assert a.store.get(22).writer_scope is not None
        outcome = await run_recovery(meta, a, recover_command(22, 1, 7, [a, b]))
        assert outcome == (22, 7, "committed")
        commit = meta.commits[-1]
        assert commit["new_length"] == 2100
        assert sorted(commit["new_targets"]) == sorted([a.node_id, b.node_id])
        # the old writer was stopped: the block server closed its connection
        with trio.fail_after(5):
            try:
                assert await framed.stream.receive_some(1 << 16) == b""
            except (trio.BrokenResourceError, OSError):
                pass   # a reset connection is as closed as an ended one
        await framed.aclose()
        # both replicas identical: same bytes, the cut chunk's checksum recomputed
        for node in (a, b):
            response, data, _ = await read_block(node.address, 22, 7)
            assert data == DATA[:2100], node.address
            data_path, meta_path = replica_paths(node, 22, 7)
            assert data_path.read_bytes() == DATA[:2100]
            assert meta_path.read_bytes() == expected_meta(DATA[:2100])
            assert [22, 7, 2100, "FINALIZED"] in meta.received(node.node_id)
        # a stale recovery id (a superseded recovery) is refused on every holder
        outcome = await run_recovery(meta, b, recover_command(22, 1, 6, [a, b]))
        assert outcome == (22, 6, "failed") and len(meta.commits) == 1
        nursery.cancel_scope.cancel()


async def test_recover_rbw_and_rwr_after_restart_takes_the_rbw_and_survives_a_refused_commit(
        tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, (a, b) = await start_recovery_cluster(nursery, tmp_path, 2)
            await write_block(a.address, 23, 1, DATA[:2500], last=False)
            await write_block(b.address, 23, 1, DATA[:4000], last=False)
            await b.stop()
            await b.start()                     # b's replica comes back RWR
            await wait_for(lambda: b.server.heartbeat.registered)
            assert b.store.get(23).state is RWR
            # the metadata server refuses the first commit (superseded): the worker gives up
            meta.refuse_commit = True
            outcome = await run_recovery(meta, b, recover_command(23, 1, 8, [a, b]))
            assert outcome == (23, 8, "failed")
            meta.refuse_commit = False
            # the retry with a new id (another primary) finds the replicas in RUR/FINALIZED
            outcome = await run_recovery(meta, b, recover_command(23, 1, 9, [a, b]))
            assert outcome == (23, 9, "committed")
            commit = meta.commits[-1]
            assert (commit["new_length"], commit["new_targets"]) == (2500, [a.node_id])
            response, data, _ = await read_block(a.address, 23, 9)
            assert data == DATA[:2500]
            assert b.store.get(23).state is ReplicaState.RUR
            assert b.store.get(23).original_state is RWR
            nursery.cancel_scope.cancel()

    await main()


async def test_truncate_recovery_cuts_finalized_replicas_mid_chunk(tmp_path):
    """RECOVER_BLOCK with new_length (mid-block truncate): every long-enough replica is cut."""
    async with trio.open_nursery() as nursery:
        meta, (a, b, c) = await start_recovery_cluster(nursery, tmp_path, 3)
        await write_block(a.address, 25, 4, DATA[:3000], targets=[b.address])
        await write_block(c.address, 25, 4, DATA[:1000], last=False)   # too short
        outcome = await run_recovery(meta, b, recover_command(25, 4, 12, [a, b, c],
                                                              new_length=1234))
        assert outcome == (25, 12, "committed")
        commit = meta.commits[-1]
        assert commit["new_length"] == 1234 and not commit["delete_block"]
        assert sorted(commit["new_targets"]) == sorted([a.node_id, b.node_id])
        for node in (a, b):
            data_path, meta_path = replica_paths(node, 25, 12)
            assert data_path.read_bytes() == DATA[:1234]
            assert meta_path.read_bytes() == expected_meta(DATA[:1234])
        nursery.cancel_scope.cancel()


async def test_all_empty_replicas_drop_the_block_without_updates(tmp_path):
    async with trio.open_nursery() as nursery:
        meta, (a, b) = await start_recovery_cluster(nursery, tmp_path, 2)
        for node in (a, b):
            framed, response = await open_write(node.address, 26, 1)
            assert response["status"] == "SUCCESS"
            await framed.aclose()
        await wait_for(lambda: all(n.store.get(26) is not None
                                   and n.store.get(26).writer is None for n in (a, b)))
        outcome = await run_recovery(meta, a, recover_command(26, 1, 3, [a, b]))
        assert outcome == (26, 3, "committed")
        assert meta.commits[-1] == {"block": {"id": 26, "gs": 1}, "recovery_id": 3,
                                    "new_length": 0, "close_file": True,
                                    "delete_block": True, "new_targets": []}
        nursery.cancel_scope.cancel()


async def test_recovery_ops_over_the_wire_refuse_bad_input(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            meta, (a,) = await start_recovery_cluster(nursery, tmp_path, 1)
            await write_block(a.address, 24, 3, DATA[:1000])
            with pytest.raises(ReplicaNotFound):
                await call_recovery_op(a.address, {"op": INIT_REPLICA_RECOVERY,
                                                   "block": {"id": 99, "gs": 1},
                                                   "recovery_id": 5}, 5)
            with pytest.raises(StaleGenerationStamp):   # update without init
                await call_recovery_op(a.address, {"op": UPDATE_REPLICA_UNDER_RECOVERY,
                                                   "block": {"id": 24, "gs": 3},
                                                   "recovery_id": 5, "new_length": 10}, 5)
            with pytest.raises(ProtocolError):
                await call_recovery_op(a.address, {"op": INIT_REPLICA_RECOVERY,
                                                   "block": {"id": 24, "gs": 3}}, 5)
            replica = await call_recovery_op(a.address, {"op": INIT_REPLICA_RECOVERY,
                                                         "block": {"id": 24, "gs": 3},
                                                         "recovery_id": 5}, 5)
            assert replica == {"id": 24, "gs": 3, "num_bytes": 1000, "state": "FINALIZED"}
            # a malformed command is logged and ignored; the server keeps serving
            worker = a.server.heartbeat.recovery
            assert await worker.recover({"type": "RECOVER_BLOCK", "block": 5}) is False
            response, data, _ = await read_block(a.address, 24, 3)
            assert response["status"] == "ERROR"   # under recovery: not readable
            replica = await call_recovery_op(a.address, {"op": UPDATE_REPLICA_UNDER_RECOVERY,
                                                         "block": {"id": 24, "gs": 3},
                                                         "recovery_id": 5, "new_length": 1000},
                                             5)
            assert replica == {"id": 24, "gs": 5, "num_bytes": 1000, "state": "FINALIZED"}
            response, data, _ = await read_block(a.address, 24, 5)
            assert data == DATA[:1000]
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- append


async def open_append(address, block_id, gs, min_bytes, targets=(), bpc=BPC):
    framed = await connect(address)
    header = {"op": "WRITE_BLOCK", "block": block_dict(block_id, gs, min_bytes),
              "targets": list(targets), "stage": PIPELINE_SETUP_APPEND,
              "client": "test-client", "min_bytes": min_bytes}
    if bpc is not None:
        header["bytes_per_checksum"] = bpc
    await framed.send_frame(header)
    return framed, await framed.receive_frame()


async def test_append_through_a_two_node_pipeline_reopens_and_extends_both_replicas(tmp_path):
    async with trio.open_nursery() as nursery:
        meta, (a, b) = await start_recovery_cluster(nursery, tmp_path, 2)
        first, total = 1300, 5000      # 1300 % 512 = 276: a partial last chunk
        acks = await write_block(a.address, 31, 1, DATA[:first], targets=[b.address])
        assert all(statuses == [0, 0] for _seq, statuses in acks)
        # refused: more bytes than the replica holds, a stamp that is not newer
        framed, response = await open_append(a.address, 31, 2, first + 1, [b.address])
        assert response["status"] == "ERROR" and "fewer than the 1301" in response["message"]
        await framed.aclose()
        framed, response = await open_append(a.address, 31, 1, first, [b.address])
        assert response["status"] == "ERROR"
        assert response["error"]["type"] == "StaleGenerationStamp"
        await framed.aclose()
        framed, response = await open_append(a.address, 31, 2, first, [b.address],
                                             bpc=1024)
        assert response["status"] == "ERROR" and "bytes_per_checksum 512" in \
            response["message"]
        await framed.aclose()
        assert a.store.get(31).state is FIN and b.store.get(31).state is FIN
        # the real append: the first packet repeats the partial chunk from 1024
        framed, response = await open_append(a.address, 31, 2, first, [b.address])
        assert response["status"] == "SUCCESS", response
        for node in (a, b):
            replica = node.store.get(31)
            assert (replica.state, replica.gs, replica.visible_length) == (RBW, 2, first)
        # readers see exactly the old bytes at the new stamp while the append runs
        response, data, _ = await read_block(b.address, 31, 2)
        assert data == DATA[:first]
        # while the append runs, each node reports its reopened replica (RBW, new stamp)
        for node in (a, b):
            await wait_for(lambda: [31, 2, first, "RBW"] in meta.received(node.node_id))
        start = first - first % BPC
        acks = await stream_packets(framed, data_packets(DATA[start:total], base=start))
        await framed.aclose()
        assert acks and all(statuses == [0, 0] for _seq, statuses in acks)
        for node in (a, b):
            data_path, meta_path = replica_paths(node, 31, 2)
            assert data_path.read_bytes() == DATA[:total]
            assert meta_path.read_bytes() == expected_meta(DATA[:total])
            assert not replica_paths(node, 31, 1)[1].exists()
            assert not list((node.data_dir / "rbw").iterdir())
            await wait_for(lambda: [31, 2, total, "FINALIZED"] in meta.received(node.node_id))
        nursery.cancel_scope.cancel()


async def test_append_to_a_missing_replica_is_refused_and_nothing_changes(tmp_path):
    async with trio.open_nursery() as nursery:
        meta, (a,) = await start_recovery_cluster(nursery, tmp_path, 1)
        framed, response = await open_append(a.address, 77, 2, 0)
        assert response["status"] == "ERROR"
        assert response["error"]["type"] == "ReplicaNotFound"
        await framed.aclose()
        framed, response = await open_append(a.address, 77, 2, -1)
        assert response["status"] == "ERROR" and "negative" in response["message"]
        await framed.aclose()
        assert a.store.get(77) is None
        nursery.cancel_scope.cancel()


async def test_restart_after_append_keeps_the_reopened_replica(tmp_path):
    """A reopened replica is an RBW under the new stamp: after a restart it is RWR there."""
    async with trio.open_nursery() as nursery:
        meta, (a,) = await start_recovery_cluster(nursery, tmp_path, 1)
        await write_block(a.address, 41, 1, DATA[:700])
        framed, response = await open_append(a.address, 41, 2, 700, bpc=None)
        assert response["status"] == "SUCCESS"
        acks = await stream_packets(framed, data_packets(DATA[512:1800], base=512,
                                                         last=False))
        assert acks
        await framed.aclose()
        await wait_for(lambda: a.store.get(41).writer is None)
        await a.stop()
        await a.start()
        replica = a.store.get(41)
        assert (replica.state, replica.gs, replica.num_bytes) == (RWR, 2, 1800)
        response, data, _ = await read_block(a.address, 41, 2)
        assert data == DATA[:1800]
        nursery.cancel_scope.cancel()
