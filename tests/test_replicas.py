"""Replica store tests: the pure state table and packet-range rule, and the store on real
files (write / rewrite / read snapshots, finalize, the start-up scan and its repairs, the
used-bytes counter, deleting a replica while a write is in flight)."""

from __future__ import annotations

import os
import random
import threading

import pytest
import trio
import trio.testing

from fs.datatransfer import chunk_checksums, crc32c, verify_checksums
from fs.errors import (InvalidArgument, ProtocolError, ReplicaAlreadyExists, ReplicaNotFound,
                       StaleGenerationStamp)
from storage.replicas import (TRANSITIONS, Replica, ReplicaEvent, ReplicaState, ReplicaStore,
                              WriterClosed, check_packet_range, encode_meta_header,
                              finalized_subdir, next_state)

pytestmark = pytest.mark.timeout(30)

BPC = 512
S, E = ReplicaState, ReplicaEvent


# --------------------------------------------------------------------------- pure parts


def test_state_table_follows_hdfs_transitions():
    assert next_state(None, E.CREATE_RBW) is S.RBW
    assert next_state(S.RBW, E.FINALIZE) is S.FINALIZED
    assert next_state(S.RBW, E.RESTART) is S.RWR
    assert next_state(S.FINALIZED, E.RESTART) is S.FINALIZED
    assert next_state(S.TEMPORARY, E.RESTART) is None
    assert next_state(S.RWR, E.INIT_RECOVERY) is S.RUR
    assert next_state(S.RUR, E.UPDATE_UNDER_RECOVERY) is S.FINALIZED
    for state in ReplicaState:
        assert next_state(state, E.INVALIDATE) is None
    # everything else is refused with a message naming the event and the state
    for state, event in [(S.FINALIZED, E.FINALIZE), (S.RWR, E.FINALIZE), (S.RBW, E.CREATE_RBW),
                         (None, E.FINALIZE), (S.FINALIZED, E.RECOVER_RBW), (S.RWR, E.APPEND)]:
        assert (state, event) not in TRANSITIONS
        with pytest.raises(InvalidArgument) as info:
            next_state(state, event)
        assert event.value in info.value.message
    # a replica can only be created from nothing
    assert {s for (s, e) in TRANSITIONS if e in (E.CREATE_RBW, E.CREATE_TEMPORARY)} == {None}


@pytest.mark.parametrize("received,offset,length", [
    (0, 0, 100), (512, 512, 10), (700, 512, 188), (700, 512, 1000), (1024, 1024, 0),
    (700, 700, 0)])
def test_packet_range_accepts_appends_and_partial_chunk_rewrites(received, offset, length):
    check_packet_range(received, offset, length, BPC)


@pytest.mark.parametrize("received,offset,length,words", [
    (700, 100, 10, "multiple"),          # not chunk aligned
    (700, 0, 1000, "before the last chunk boundary"),
    (512, 1024, 10, "gap"),
    (700, 512, 100, "ends before"),      # would shrink the replica
])
def test_packet_range_refuses_overlaps_gaps_and_shrinking(received, offset, length, words):
    with pytest.raises(ProtocolError) as info:
        check_packet_range(received, offset, length, BPC)
    assert words in info.value.message


def test_finalized_buckets_stay_small():
    dirs = {finalized_subdir(block_id) for block_id in range(1 << 20, (1 << 20) + 200_000)}
    assert len(dirs) <= 32 * 32
    assert finalized_subdir(-5) == os.path.join("subdir31", "subdir31")


# --------------------------------------------------------------------------- store on disk


async def open_store(path) -> ReplicaStore:
    store = ReplicaStore(str(path), disk_io_threads=2)
    await store.open()
    return store


async def write_all(store, replica, data, step=BPC * 3):
    for pos in range(0, len(data), step):
        piece = data[pos:pos + step]
        await store.write_packet(replica, pos, piece, chunk_checksums(piece, BPC))
        replica.set_visible(pos + len(piece), chunk_checksums(piece, BPC)[-4:])


async def test_rbw_read_snapshot_uses_acked_checksum_while_last_chunk_is_rewritten(tmp_path):
    data = random.Random(1).randbytes(2000)

    store = await open_store(tmp_path)
    replica = await store.create_rbw(5, 1, BPC)
    await store.write_packet(replica, 0, data[:700], chunk_checksums(data[:700], BPC))
    replica.set_visible(700, chunk_checksums(data[:700], BPC)[-4:])
    # the writer already rewrote the partial chunk for a longer flush, not yet acked
    await store.write_packet(replica, 512, data[512:1000], chunk_checksums(data[512:1000], BPC))
    assert replica.num_bytes == 1000 and replica.visible_length == 700
    reader = await store.open_reader(5, 1)
    try:
        assert reader.visible_length == 700
        got, sums = await store.run_io(reader.read, 0, 700)
        assert got == data[:700]
        verify_checksums(got, sums, BPC)         # the on-disk sum would not match
        on_disk = (tmp_path / "rbw" / "blk_5_1.meta").read_bytes()[7:]
        assert on_disk[4:8] != sums[4:8]
    finally:
        await store.close_reader(reader)
    store.close()


async def test_create_finalize_invalidate_and_generation_stamps(tmp_path):
    data = random.Random(2).randbytes(3333)

    store = await open_store(tmp_path)
    replica = await store.create_rbw(9, 4, BPC)
    with pytest.raises(ReplicaAlreadyExists):
        await store.create_rbw(9, 4, BPC)
    with pytest.raises(InvalidArgument):
        await store.create_rbw(10, 1, 3)          # absurd bytes_per_checksum
    await write_all(store, replica, data)
    await store.finalize(replica)
    assert replica.state is S.FINALIZED
    base = tmp_path / "finalized" / finalized_subdir(9)
    assert (base / "blk_9").read_bytes() == data
    assert (base / "blk_9_4.meta").read_bytes() == (encode_meta_header(BPC)
                                                    + chunk_checksums(data, BPC))
    with pytest.raises(ReplicaNotFound):          # finalized replicas take no more data
        await store.write_packet(replica, 3072, b"x", chunk_checksums(b"x", BPC))
    with pytest.raises(StaleGenerationStamp):
        store.readable(9, 5)
    assert store.block_report() == [[9, 4, len(data), "FINALIZED"]]
    assert store.used_bytes() == len(data) + 7 + 4 * 7
    assert not await store.invalidate(9, 3)        # replica is newer than the command
    assert (base / "blk_9").exists()
    assert await store.invalidate(9, 4)
    assert not (base / "blk_9").exists() and not (base / "blk_9_4.meta").exists()
    assert store.get(9) is None and store.block_report() == []
    assert await store.invalidate(9, 4)            # already gone: still "not held"
    store.close()


async def test_scan_repairs_crash_leftovers_and_quarantines_inconsistent_finalized(tmp_path):
    data = random.Random(3).randbytes(4000)

    store = await open_store(tmp_path)
    node_id = store.node_id
    for block_id in (1, 2, 3):
        replica = await store.create_rbw(block_id, 1, BPC)
        await write_all(store, replica, data)
        await store.finalize(replica)
    store.close()

    fin = lambda i: tmp_path / "finalized" / finalized_subdir(i)
    # blk_1: data shorter than its checksums say -> quarantined, not reported
    with open(fin(1) / "blk_1", "r+b") as fh:
        fh.truncate(1000)
    # blk_2: a finalize cut between its two renames (meta moved, data still in rbw/)
    os.replace(fin(2) / "blk_2", tmp_path / "rbw" / "blk_2")
    # blk_3: an older meta file left by a generation stamp bump
    (fin(3) / "blk_3_0.meta").write_bytes(b"old")
    # an rbw meta without data, an rbw data file without meta
    (tmp_path / "rbw" / "blk_8_1.meta").write_bytes(encode_meta_header(BPC))
    (tmp_path / "rbw" / "blk_9").write_bytes(b"no checksums")

    store = await open_store(tmp_path)
    assert store.node_id == node_id
    assert sorted(store.block_report()) == [[2, 1, 4000, "FINALIZED"],
                                            [3, 1, 4000, "FINALIZED"]]
    assert sorted(os.listdir(tmp_path / "corrupt")) == ["blk_1", "blk_1_1.meta"]
    assert (fin(2) / "blk_2").read_bytes() == data
    assert not (fin(3) / "blk_3_0.meta").exists()
    assert sorted(os.listdir(tmp_path / "rbw")) == []
    store.close()


async def test_rbw_scan_keeps_checksummed_prefix_and_truncates_meta(tmp_path):
    data = random.Random(4).randbytes(5 * BPC)

    store = await open_store(tmp_path)
    replica = await store.create_rbw(7, 2, BPC)
    await write_all(store, replica, data[:3 * BPC + 50], step=BPC * 10)
    store.close()
    # crash during the next packet: its checksums reached the disk, its data did not
    with open(tmp_path / "rbw" / "blk_7_2.meta", "r+b") as fh:
        fh.seek(7 + 3 * 4)
        fh.write(chunk_checksums(data[3 * BPC:5 * BPC], BPC))
    store = await open_store(tmp_path)
    replica = store.get(7)
    assert replica.state is S.RWR
    # chunk 3 on disk holds 50 bytes but its stored checksum covers 512: cut to 3 chunks
    assert replica.num_bytes == 3 * BPC
    assert store.last_scan.rbw_trimmed == [(7, 3 * BPC + 50, 3 * BPC)]
    assert (tmp_path / "rbw" / "blk_7").read_bytes() == data[:3 * BPC]
    meta = (tmp_path / "rbw" / "blk_7_2.meta").read_bytes()
    assert meta == encode_meta_header(BPC) + chunk_checksums(data[:3 * BPC], BPC)
    assert crc32c(data[:BPC]).to_bytes(4, "big") == meta[7:11]
    store.close()


async def test_folder_lock_refuses_a_second_server(tmp_path):
    first = await open_store(tmp_path)
    with pytest.raises(InvalidArgument) as info:
        await open_store(tmp_path)
    assert "in use" in info.value.message
    first.close()
    (await open_store(tmp_path)).close()


# --------------------------------------------------------------------------- used bytes


def files_size(root) -> int:
    """Bytes of every file under rbw/, finalized/ and tmp/ (the replicas' data and meta)."""
    total = 0
    for folder in ("rbw", "finalized", "tmp"):
        for dirpath, _dirs, files in os.walk(root / folder):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


async def test_used_bytes_is_a_running_counter_equal_to_the_replica_files(tmp_path, monkeypatch):
    rng = random.Random(5)
    data = rng.randbytes(2000)

    store = await open_store(tmp_path)
    assert store.used_bytes() == 0
    for block_id in range(1, 6):                       # finalized, sizes 0..5000
        replica = await store.create_rbw(block_id, 1, BPC)
        await write_all(store, replica, rng.randbytes(rng.randrange(0, 5000)))
        await store.finalize(replica)
    rbw = await store.create_rbw(10, 1, BPC)           # RBW with a partial-chunk rewrite
    await store.write_packet(rbw, 0, data[:700], chunk_checksums(data[:700], BPC))
    await store.write_packet(rbw, 512, data[512:1900], chunk_checksums(data[512:1900], BPC))
    empty = await store.create_rbw(11, 1, BPC)         # empty RBW: just a meta header
    assert store.used_bytes() == files_size(tmp_path)
    assert await store.invalidate(2, 1)                # delete a finalized replica
    await store.delete(empty)                          # ... and an RBW one
    await store.delete(empty)                          # twice: no double count
    replacement = await store.create_rbw(3, 5, BPC)    # newer GS replaces blk_3
    await store.write_packet(replacement, 0, data[:1234], chunk_checksums(data[:1234], BPC))
    with pytest.raises(ReplicaAlreadyExists):          # refused creates change nothing
        await store.create_rbw(3, 5, BPC)
    with pytest.raises(InvalidArgument):
        await store.create_rbw(12, 1, 16)
    used = store.used_bytes()
    assert used == files_size(tmp_path) > 0
    with monkeypatch.context() as m:                   # read, not recomputed per call
        m.setattr(Replica, "disk_bytes", lambda self: pytest.fail("used_bytes walked"))
        assert store.used_bytes() == used
    store.close()

    with open(tmp_path / "rbw" / "blk_10", "ab") as fh:
        fh.write(b"torn tail")                           # cut by the scan at restart
    store = await open_store(tmp_path)
    assert store.last_scan.rbw_trimmed == [(10, 1900 + 9, 1900)]
    assert store.used_bytes() == files_size(tmp_path) == used
    store.close()


# --------------------------------------------------------------------------- fd close race


async def test_delete_waits_for_a_write_in_flight_and_no_write_reaches_a_reused_fd(tmp_path,
                                                                           monkeypatch):
    """A write blocked inside pwrite (its fd numbers already taken) while the replica is
    deleted: the close must wait for it, so a replica created meanwhile cannot get the same
    fd numbers and receive the write; after the delete every write fails cleanly."""
    first = b"a" * BPC
    racing = b"R" * BPC

    store = ReplicaStore(str(tmp_path), disk_io_threads=4)
    await store.open()
    a = await store.create_rbw(1, 1, BPC)
    await store.write_packet(a, 0, first, chunk_checksums(first, BPC))
    writer = a.writer
    a_fds = (writer.data_fd, writer.meta_fd)
    entered, proceed = threading.Event(), threading.Event()
    real_pwrite, real_pwritev = os.pwrite, os.pwritev

    def gate(fd):
        if fd == a_fds[0] and not entered.is_set():
            entered.set()
            proceed.wait(10)

    def gated_pwrite(fd, data, offset):
        gate(fd)
        return real_pwrite(fd, data, offset)

    def gated_pwritev(fd, buffers, offset):   # packets are written in runs
        gate(fd)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwrite", gated_pwrite)
    monkeypatch.setattr(os, "pwritev", gated_pwritev)
    deleted = trio.Event()
    outcome = []

    async def racing_write():
        try:
            await store.write_packet(a, BPC, racing, chunk_checksums(racing, BPC))
            outcome.append("written")
        except ReplicaNotFound:
            outcome.append("refused")

    async def delete():
        await store.delete(a)
        deleted.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(racing_write)
            assert await trio.to_thread.run_sync(entered.wait, 5)
            nursery.start_soon(delete)
            with trio.move_on_after(0.3):
                await deleted.wait()
            assert not deleted.is_set(), "the files were closed under a write in flight"
            b = await store.create_rbw(2, 1, BPC)      # may not reuse a's fd numbers
            proceed.set()
            await deleted.wait()
    assert outcome == ["written"]     # the write in flight finished into a's own file
    assert (tmp_path / "rbw" / "blk_2").read_bytes() == b""
    assert not (tmp_path / "rbw" / "blk_1").exists() and store.get(1) is None
    # every later write on the deleted replica fails cleanly, without touching an fd
    with pytest.raises(ReplicaNotFound):
        await store.write_packet(a, 2 * BPC, racing, chunk_checksums(racing, BPC))
    with pytest.raises(ReplicaNotFound):
        await store.sync(a)
    with pytest.raises(WriterClosed):
        writer.write(2 * BPC, racing, chunk_checksums(racing, BPC))
    assert writer.data_fd == writer.meta_fd == -1
    await store.write_packet(b, 0, first, chunk_checksums(first, BPC))
    assert (tmp_path / "rbw" / "blk_2").read_bytes() == first
    store.close()


async def test_report_entries_from_a_snapshot_show_the_replicas_as_they_are_now(tmp_path):
    """A full report is built piecewise from ``report_snapshot``: a replica deleted after
    the snapshot is left out, one finalized after it is reported FINALIZED, one created
    after it is not in it (its incremental report follows the full report)."""
    data = random.Random(5).randbytes(1500)

    store = await open_store(tmp_path)
    finalized = await store.create_rbw(1, 1, BPC)
    await write_all(store, finalized, data)
    await store.finalize(finalized)
    doomed = await store.create_rbw(2, 1, BPC)
    await write_all(store, doomed, data[:600])
    await store.finalize(doomed)
    growing = await store.create_rbw(3, 1, BPC)
    await write_all(store, growing, data[:1000])
    snapshot = store.report_snapshot()
    assert sorted(store.report_entries(snapshot)) == [
        [1, 1, 1500, "FINALIZED"], [2, 1, 600, "FINALIZED"], [3, 1, 1000, "RBW"]]
    assert await store.invalidate(2, 1)
    await store.finalize(growing)
    later = await store.create_rbw(4, 1, BPC)
    await write_all(store, later, data[:10])
    assert sorted(store.report_entries(snapshot)) == [
        [1, 1, 1500, "FINALIZED"], [3, 1, 1000, "FINALIZED"]]
    assert sorted(store.block_report()) == [
        [1, 1, 1500, "FINALIZED"], [3, 1, 1000, "FINALIZED"], [4, 1, 10, "RBW"]]
    await store.release_writer(later)
    store.close()


async def finalized(store, block_id: int, gs: int, data: bytes):
    replica = await store.create_rbw(block_id, gs, BPC)
    await write_all(store, replica, data)
    await store.finalize(replica)
    return replica


async def test_drop_if_lost_drops_only_idle_replicas_whose_files_are_gone_or_cut(tmp_path):
    store = await open_store(tmp_path)
    fine = await finalized(store, 1, 7, b"a" * 3000)
    gone = await finalized(store, 2, 7, b"b" * 3000)
    writing = await store.create_rbw(3, 7, BPC)
    await write_all(store, writing, b"c" * 1000)
    assert next_state(S.FINALIZED, E.MISSING) is None
    assert (S.RBW, E.MISSING) not in TRANSITIONS and (S.RUR, E.MISSING) not in TRANSITIONS
    assert await store.drop_if_lost(1, 7) is None and store.get(1) is fine
    os.unlink(gone.data_path)
    assert await store.drop_if_lost(2, 6) is None        # another replica than asked
    used = store.used_bytes()
    reason = await store.drop_if_lost(2, 7)
    assert "data file" in reason and "gone" in reason, reason
    assert store.get(2) is None and gone.removed
    assert store.used_bytes() == used - gone.disk_bytes()
    assert os.listdir(tmp_path / "corrupt") == ["blk_2_7.meta"]
    # a replica being written is the pipeline's business, whatever its files look like
    os.unlink(writing.data_path)
    assert await store.drop_if_lost(3, 7) is None and store.get(3) is writing
    store.close()


async def test_directory_scan_never_adopts_files_of_a_replica_being_deleted(tmp_path):
    from storage.dirscan import list_finalized_files

    store = await open_store(tmp_path)
    replica = await finalized(store, 5, 2, b"x" * 2000)
    bucket = str(tmp_path / "finalized")
    (files,) = await store.run_io(list_finalized_files, bucket)
    async with trio.open_nursery() as nursery:
        async with replica.lock:   # the delete leaves the map, then waits to unlink
            nursery.start_soon(store.delete, replica)
            await trio.testing.wait_all_tasks_blocked()
            assert store.get(5) is None and os.path.exists(files.data_path)
            assert await store.adopt_finalized(files.block_id, files.gs, files.data_path,
                                               files.meta_path) is None
    assert store.get(5) is None and not os.path.exists(files.data_path)
    store.close()
