"""Patching a FINALIZED replica in place under a new generation stamp, at the store level on
real files: ranges in the middle, at chunk edges, growing a partial last block; retries,
refusals (nothing changed), a corrupt chunk the patch would keep part of; the redo file at
every crash point followed by a restart of the store; failures while rewriting (rolled
forward, or the replica dropped); readers and the block scanner across a patch; the
directory scan and the start-up scan leaving redo files alone or resolving them; the deferred
flush (two fsyncs on the acknowledged path, the rest by the flusher), several pending redo
files rolled forward in order at a restart that lost the in-place writes, a torn last one,
and every structural change flushing or removing pending redo files first."""

from __future__ import annotations

import os
import socket

import pytest
import trio
import trio.testing

from fs.config import Config
from fs.datatransfer import verify_checksums
from fs.errors import (ChecksumError, InvalidArgument, ReplicaChanged, ReplicaNotFound,
                       StaleGenerationStamp)
from storage import patching
from storage.dirscan import DirectoryScanner
from storage.layout import meta_name
from storage.patching import PatchJob, Recovery, Step, check_ranges, patch_files
from storage.replica_states import ReplicaEvent, ReplicaState, next_state
from storage.replicas import ReplicaStore
from storage.scanner import BlockScanner

from test_replicas import BPC, finalized, open_store

pytestmark = pytest.mark.timeout(60)

BLOCK = 1 << 20      # max_length (the file's block size) in these tests
OLD = 1000           # old stamp
NEW = 1001           # new stamp


def payload(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed * 7 + (i >> 9)) % 251 for i in range(n))


def model_after(old: bytes, ranges) -> bytes:
    out = bytearray(old)
    for offset, data in ranges:
        if offset + len(data) > len(out):
            out.extend(b"\0" * (offset + len(data) - len(out)))
        out[offset:offset + len(data)] = data
    return bytes(out)


def folder_files(replica) -> list[str]:
    return sorted(os.listdir(os.path.dirname(replica.data_path)))


def snapshot(replica) -> tuple[bytes, bytes, list[str]]:
    with open(replica.data_path, "rb") as d, open(replica.meta_path, "rb") as m:
        return d.read(), m.read(), folder_files(replica)


async def read_whole(store: ReplicaStore, block_id: int, gs: int) -> bytes:
    """The replica's bytes read through a reader, every chunk verified against its sum."""
    reader = await store.open_reader(block_id, gs)
    try:
        if reader.visible_length == 0:
            return b""
        data, sums = await store.run_io(reader.read, 0, reader.visible_length)
    finally:
        await store.close_reader(reader)
    verify_checksums(data, sums, reader.bytes_per_checksum, f"blk_{block_id}")
    return data


def files_consistent(replica, expected: bytes) -> None:
    """The files on disk hold ``expected`` with checksums that all verify."""
    with open(replica.data_path, "rb") as d, open(replica.meta_path, "rb") as m:
        data, meta = d.read(), m.read()
    assert data == expected
    verify_checksums(data, meta[7:], BPC, replica.name)


def scanner(store: ReplicaStore, reported: list, lost: list) -> BlockScanner:
    config = Config.load(env={}, scanner_bytes_per_second=1 << 40)

    async def report(bad):
        reported.extend(bad)

    async def on_lost(block_id, gs, reason):
        lost.append((block_id, gs, reason))
        return False

    return BlockScanner(config, store, report, on_lost)


# --------------------------------------------------------------------------- pure parts


def test_state_table_has_the_patch_event_on_finalized_only():
    assert next_state(ReplicaState.FINALIZED, ReplicaEvent.PATCH) is ReplicaState.FINALIZED
    for state in (ReplicaState.RBW, ReplicaState.RWR, ReplicaState.RUR, ReplicaState.TEMPORARY,
                  None):
        with pytest.raises(InvalidArgument):
            next_state(state, ReplicaEvent.PATCH)


@pytest.mark.parametrize("ranges,words", [
    ([], "no ranges"),
    ([(0, b"")], "empty"),
    ([(-1, b"x")], "empty or starts before 0"),
    ([(10, b"xx"), (11, b"y")], "overlaps"),
    ([(20, b"x"), (10, b"y")], "out of order"),
    ([(1001, b"x")], "hole"),
    ([(999, b"x" * (BLOCK - 998))], "block size"),
])
def test_check_ranges_refuses_naming_the_block_and_range(ranges, words):
    with pytest.raises(InvalidArgument) as info:
        check_ranges("blk_7_3", ranges, 1000, BLOCK)
    assert words in info.value.message and "blk_7_3" in info.value.message


def test_redo_round_trips_and_a_torn_one_is_refused():
    redo = patching.Redo(7, 3, 4, BPC, 1500,
                         (patching.ChunkRun(512, b"a" * 600, b"\1\2\3\4" * 2),))
    raw = patching.encode_redo(redo)
    assert patching.decode_redo(raw) == redo
    for cut in (1, 5, len(raw) // 2, len(raw) - 1):
        with pytest.raises(ValueError):
            patching.decode_redo(raw[:cut])
    flipped = bytearray(raw)
    flipped[40] ^= 1
    with pytest.raises(ValueError):
        patching.decode_redo(bytes(flipped))


# --------------------------------------------------------------------------- patches


@pytest.mark.parametrize("ranges", [
    [(1024, payload(512, 1))],                                   # one whole chunk
    [(1000, payload(100, 2))],                                   # inside, across a boundary
    [(5, payload(3, 3))],                                        # inside one chunk
    [(0, payload(1, 4)), (511, payload(2, 5)), (2000, payload(9, 6))],   # several, edges
    [(100, payload(300, 7)), (400, payload(10, 8))],             # two ranges, one chunk
    [(2560, payload(100, 9))],                                   # the partial last chunk
    [(0, payload(2660, 10))],                                    # everything
])
async def test_patch_rewrites_touched_chunks_whole_under_the_new_stamp(tmp_path, ranges):
    store = await open_store(tmp_path)
    old = payload(5 * BPC + 100, 0)
    replica = await finalized(store, 5, OLD, old)
    old_meta = replica.meta_path
    expected = model_after(old, ranges)
    patched = await store.patch_finalized(5, OLD, NEW, ranges, BLOCK)
    assert patched is replica and store.get(5) is replica
    assert replica.gs == NEW and replica.state is ReplicaState.FINALIZED
    assert replica.num_bytes == len(expected) == replica.visible_length
    assert os.path.basename(replica.meta_path) == meta_name(5, NEW)
    assert not os.path.exists(old_meta)
    # acknowledged with its redo file pending; the flusher's pass makes it durable and
    # removes it
    redo = os.path.join(os.path.dirname(replica.data_path), patching.patch_name(5, NEW))
    assert replica.pending_redos == [redo] and os.path.exists(redo)
    assert store.pending_patches() == 1
    files_consistent(replica, expected)
    assert await store.flush_pending() == 1
    assert replica.pending_redos == [] and store.pending_patches() == 0
    assert not any(name.endswith(".patch") for name in folder_files(replica))
    files_consistent(replica, expected)
    assert await read_whole(store, 5, NEW) == expected
    assert store.used_bytes() == os.path.getsize(replica.data_path) + \
        os.path.getsize(replica.meta_path)
    # the restarted store finds it at the new stamp
    store.close()
    store = await open_store(tmp_path)
    assert store.get(5).gs == NEW and store.get(5).num_bytes == len(expected)
    assert await read_whole(store, 5, NEW) == expected
    store.close()


async def test_patch_grows_a_partial_last_block_up_to_max_length(tmp_path):
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 7, 0)
    replica = await finalized(store, 9, OLD, old)
    max_length = 8 * BPC + 3
    ranges = [(100, payload(5, 1)), (3 * BPC, payload(max_length - 3 * BPC, 2))]
    await store.patch_finalized(9, OLD, NEW, ranges, max_length)
    expected = model_after(old, ranges)
    assert len(expected) == max_length == replica.num_bytes
    files_consistent(replica, expected)
    # growing from the very end of the replica, then one byte past max_length is refused
    ranges = [(max_length - 1, b"z")]
    await store.patch_finalized(9, NEW, NEW + 1, ranges, max_length)
    before = snapshot(replica)
    with pytest.raises(InvalidArgument) as info:
        await store.patch_finalized(9, NEW + 1, NEW + 2, [(max_length, b"q")], max_length)
    assert "block size" in info.value.message
    assert snapshot(replica) == before and replica.gs == NEW + 1
    store.close()


async def test_a_retry_at_the_new_stamp_is_a_no_op(tmp_path):
    store = await open_store(tmp_path)
    old = payload(2 * BPC, 0)
    replica = await finalized(store, 3, OLD, old)
    ranges = [(10, payload(20, 1))]
    await store.patch_finalized(3, OLD, NEW, ranges, BLOCK)
    before = snapshot(replica)
    again = await store.patch_finalized(3, OLD, NEW, [(0, b"other bytes")], BLOCK)
    assert again is replica and replica.gs == NEW and snapshot(replica) == before
    store.close()


async def test_refusals_change_nothing(tmp_path):
    store = await open_store(tmp_path)
    old = payload(2 * BPC + 10, 0)
    replica = await finalized(store, 4, OLD, old)
    before = snapshot(replica)
    with pytest.raises(StaleGenerationStamp) as info:       # neither stamp
        await store.patch_finalized(4, OLD - 1, NEW, [(0, b"x")], BLOCK)
    assert str(OLD - 1) in info.value.message and str(NEW) in info.value.message
    with pytest.raises(InvalidArgument):                     # new stamp not above
        await store.patch_finalized(4, OLD, OLD, [(0, b"x")], BLOCK)
    with pytest.raises(InvalidArgument) as info:             # a hole
        await store.patch_finalized(4, OLD, NEW, [(len(old) + 1, b"x")], BLOCK)
    assert "hole" in info.value.message
    with pytest.raises(InvalidArgument):                     # past max_length
        await store.patch_finalized(4, OLD, NEW, [(0, b"x" * 600)], 512)
    with pytest.raises(ReplicaNotFound):                     # no replica
        await store.patch_finalized(44, OLD, NEW, [(0, b"x")], BLOCK)
    assert snapshot(replica) == before and replica.gs == OLD
    # not finalized: an RBW replica
    rbw = await store.create_rbw(6, OLD, BPC)
    with pytest.raises(ReplicaNotFound) as info:
        await store.patch_finalized(6, OLD, NEW, [(0, b"x")], BLOCK)
    assert "not finalized" in info.value.message
    await store.release_writer(rbw)
    # deleted before the patch
    await store.delete(replica)
    with pytest.raises(ReplicaNotFound):
        await store.patch_finalized(4, OLD, NEW, [(0, b"x")], BLOCK)
    store.close()


async def test_a_patch_that_waits_for_a_delete_fails_with_replica_not_found(tmp_path):
    store = await open_store(tmp_path)
    replica = await finalized(store, 12, OLD, payload(BPC, 0))
    outcome = []

    async def patch():
        try:
            await store.patch_finalized(12, OLD, NEW, [(0, b"x")], BLOCK)
            outcome.append("patched")
        except ReplicaNotFound:
            outcome.append("not found")

    async with trio.open_nursery() as nursery:
        await replica.lock.acquire()   # as a delete holds it while it removes the files
        nursery.start_soon(patch)
        await trio.testing.wait_all_tasks_blocked()
        # what a delete does to the map while the patch waits for the lock
        store._untrack(replica)
        replica.removed = True
        replica.lock.release()
    assert outcome == ["not found"] and replica.gs == OLD
    store.close()


async def test_a_corrupt_chunk_the_patch_would_keep_part_of_refuses_it(tmp_path):
    store = await open_store(tmp_path)
    old = payload(4 * BPC, 0)
    replica = await finalized(store, 8, OLD, old)
    with open(replica.data_path, "r+b") as fh:   # rot in chunk 1
        fh.seek(BPC + 3)
        fh.write(b"\xff")
    before = snapshot(replica)
    with pytest.raises(ChecksumError) as info:
        await store.patch_finalized(8, OLD, NEW, [(BPC + 100, b"new")], BLOCK)
    assert "corrupt" in info.value.message
    assert snapshot(replica) == before and replica.gs == OLD
    # a range that touches only healthy chunks goes through (the rot stays for the scanner)
    await store.patch_finalized(8, OLD, NEW, [(3 * BPC + 1, b"ok")], BLOCK)
    assert replica.gs == NEW
    store.close()


# --------------------------------------------------------------------------- crash points


def job_for(replica, ranges) -> PatchJob:
    new_length = check_ranges(replica.name, ranges, replica.num_bytes, BLOCK)
    return PatchJob(replica.block_id, replica.gs, NEW, replica.bytes_per_checksum,
                    replica.data_path, replica.meta_path, replica.num_bytes, new_length, ranges)


RANGES = [(700, payload(900, 1)), (3 * BPC + 100, payload(BPC * 2, 2))]   # the 2nd grows it


async def crashed_store(tmp_path, stop_after: Step | None, *, tear_redo: int = 0,
                        half_apply: bool = False):
    """A store whose replica blk_2 was being patched when the "crash" hit (the hop stopped
    after ``stop_after``), closed and reopened; its old and patched contents."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    replica = await finalized(store, 2, OLD, old)
    job = job_for(replica, RANGES)
    if half_apply:   # the crash hit in the middle of step 2: the first run's bytes only
        patch_files(job, replica, stop_after=Step.REDO)
        with open(job.redo_path, "rb") as fh:
            redo = patching.decode_redo(fh.read())
        with open(job.data_path, "r+b") as fh:
            fh.seek(redo.runs[0].offset)
            fh.write(redo.runs[0].data[:300])
    else:
        patch_files(job, replica, stop_after=stop_after)
    if tear_redo:
        with open(job.redo_path, "r+b") as fh:
            fh.truncate(os.path.getsize(job.redo_path) - tear_redo)
    store.close()
    return await open_store(tmp_path), old, model_after(old, RANGES)


async def test_a_torn_redo_file_is_removed_and_the_old_version_stays(tmp_path):
    store, old, _new = await crashed_store(tmp_path, Step.REDO, tear_redo=3)
    replica = store.get(2)
    assert replica.gs == OLD and await read_whole(store, 2, OLD) == old
    assert store.last_scan.patches[0][1] == Recovery.TORN.value
    assert not any(n.endswith(".patch") for n in folder_files(replica))
    store.close()


@pytest.mark.parametrize("stop_after,half_apply", [(Step.REDO, False), (None, True),
                                                   (Step.APPLY, False)])
async def test_a_whole_redo_with_the_old_meta_is_rolled_forward(tmp_path, stop_after,
                                                                half_apply):
    store, _old, new = await crashed_store(tmp_path, stop_after, half_apply=half_apply)
    replica = store.get(2)
    assert store.last_scan.patches[0][1] == Recovery.ROLLED_FORWARD.value
    assert replica.gs == NEW and replica.num_bytes == len(new)
    assert await read_whole(store, 2, NEW) == new
    files_consistent(replica, new)
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW)])
    reported, lost = [], []
    assert await scanner(store, reported, lost).scan_all() == 0 and not reported and not lost
    store.close()


async def test_a_redo_left_after_the_rename_is_applied_again(tmp_path):
    # the rename is not fsynced before the flush: it may reach the disk without the
    # in-place writes before it, so the redo file is applied even under the new name
    store, _old, new = await crashed_store(tmp_path, Step.COMMIT)
    replica = store.get(2)
    assert store.last_scan.patches[0][1] == Recovery.ROLLED_FORWARD.value
    assert replica.gs == NEW and await read_whole(store, 2, NEW) == new
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW)])
    store.close()


async def test_a_redo_without_its_replica_is_removed_and_never_taken_for_one(tmp_path):
    store = await open_store(tmp_path)
    replica = await finalized(store, 2, OLD, payload(BPC, 0))
    job = job_for(replica, [(0, b"abc")])
    patch_files(job, replica, stop_after=Step.REDO)
    # the directory scan neither adopts nor quarantines a redo file
    summary = await DirectoryScanner(Config.load(env={}), store, None).scan_once()
    assert summary.lost == () and summary.adopted == () and os.path.exists(job.redo_path)
    await store.delete(replica)
    store.close()
    store = await open_store(tmp_path)
    assert store.get(2) is None and not os.path.exists(job.redo_path)
    assert store.last_scan.patches[0][1] == Recovery.OBSOLETE.value
    assert not store.last_scan.quarantined
    store.close()


# --------------------------------------------------------------------------- failures


@pytest.mark.allow_log_errors(r"failed while rewriting", reason="the test fails the rename")
async def test_a_failed_commit_is_rolled_forward_in_place(tmp_path, monkeypatch):
    store = await open_store(tmp_path)
    old = payload(2 * BPC, 0)
    replica = await finalized(store, 2, OLD, old)
    real, calls = patching._commit, []

    def failing_once(old_meta, new_meta):
        calls.append(old_meta)
        if len(calls) == 1:
            raise OSError(5, "injected rename failure")
        real(old_meta, new_meta)

    monkeypatch.setattr(patching, "_commit", failing_once)
    await store.patch_finalized(2, OLD, NEW, [(3, b"xyz")], BLOCK)
    assert len(calls) == 2 and replica.gs == NEW
    files_consistent(replica, model_after(old, [(3, b"xyz")]))
    store.close()


async def test_a_failure_before_the_apply_keeps_the_old_version(tmp_path, monkeypatch):
    store = await open_store(tmp_path)
    old = payload(2 * BPC, 0)
    replica = await finalized(store, 2, OLD, old)
    before = snapshot(replica)

    def no_space(path, raw):
        with open(path, "wb") as fh:
            fh.write(raw[:10])
        raise OSError(28, "injected: no space left")

    monkeypatch.setattr(patching, "_write_redo", no_space)
    with pytest.raises(OSError):
        await store.patch_finalized(2, OLD, NEW, [(3, b"xyz")], BLOCK)
    assert store.get(2) is replica and replica.gs == OLD and snapshot(replica) == before
    store.close()


@pytest.mark.allow_log_errors(r"failed while rewriting|could not be rolled forward",
                              reason="the test breaks the disk")
async def test_a_patch_that_cannot_be_rolled_forward_drops_the_replica(tmp_path, monkeypatch):
    store = await open_store(tmp_path)
    replica = await finalized(store, 2, OLD, payload(2 * BPC, 0))

    def half_then_fail(data_path, meta_path, redo):
        with open(data_path, "r+b") as fh:   # new bytes, old checksums: a mix
            fh.write(redo.runs[0].data[:5])
        raise OSError(5, "injected: the disk went bad")

    monkeypatch.setattr(patching, "apply_runs", half_then_fail)
    with pytest.raises(OSError):
        await store.patch_finalized(2, OLD, NEW, [(0, b"xyz")], BLOCK)
    assert store.get(2) is None and replica.removed and store.used_bytes() == 0
    corrupt = sorted(os.listdir(tmp_path / "corrupt"))
    assert "blk_2" in corrupt and meta_name(2, OLD) in corrupt
    store.close()


# --------------------------------------------------------------------------- readers


async def test_a_reader_opened_before_a_patch_fails_and_one_opened_after_reads_it(tmp_path):
    store = await open_store(tmp_path)
    old = payload(4 * BPC, 0)
    await finalized(store, 2, OLD, old)
    before = await store.open_reader(2, OLD)
    data, _ = await store.run_io(before.read, 0, BPC)
    assert data == old[:BPC]
    ranges = [(BPC, payload(BPC, 5))]
    await store.patch_finalized(2, OLD, NEW, ranges, BLOCK)
    with pytest.raises(ReplicaChanged) as info:
        await store.run_io(before.read, BPC, BPC)
    assert "new version" in info.value.message and info.value.retriable
    with pytest.raises(ReplicaChanged):
        await store.run_io(before.read_sums, 0, BPC)
    a, b = socket.socketpair()
    try:
        with pytest.raises(ReplicaChanged):   # sendfile: refused before a byte is sent
            await store.run_io(before.send_data, a.fileno(), 0, BPC)
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1)
    finally:
        a.close()
        b.close()
    await store.close_reader(before)
    assert await read_whole(store, 2, NEW) == model_after(old, ranges)
    store.close()


async def test_short_circuit_files_are_refused_while_a_patch_runs(tmp_path):
    store = await open_store(tmp_path)
    replica = await finalized(store, 2, OLD, payload(BPC, 0))
    assert store.finalized_files(2, OLD)[2] == OLD
    replica.patching = True
    with pytest.raises(ReplicaNotFound) as info:
        store.finalized_files(2, OLD)
    assert "patched" in info.value.message
    replica.patching = False
    store.close()


async def test_the_scanner_does_not_report_a_replica_patched_while_it_scans(tmp_path):
    store = await open_store(tmp_path)
    old = payload(600 * 1024, 0)   # three scanner pieces
    replica = await finalized(store, 2, OLD, old)
    reported, lost = [], []
    scan = scanner(store, reported, lost)
    # the scanner sees the replica grow and change under it: the patch runs between two of
    # its reads (its worker-thread hops go through this wrapper)
    real_run_io = store.run_io
    patched = []

    async def run_io(fn, *args):
        if getattr(fn, "__name__", "") == "read" and not patched:
            patched.append(True)
            result = await real_run_io(fn, *args)
            await store.patch_finalized(2, OLD, NEW, [(len(old) - 10, payload(4000, 3))],
                                        BLOCK)
            return result
        return await real_run_io(fn, *args)

    store.run_io = run_io
    assert await scan.scan_one(2, OLD, len(old)) is None
    assert await scan.scan_all() == 0 and not reported and not lost and patched
    # and the scanner does report a rotten replica (so the above could fail)
    store.run_io = real_run_io
    with open(replica.data_path, "r+b") as fh:
        fh.seek(5)
        fh.write(b"\x00\x01")
    assert await scan.scan_all() == 1 and reported
    store.close()


# --------------------------------------------------------------------------- deferred flush


def fsync_counter(monkeypatch) -> list[str]:
    """Every fsync from now on, as the path of what was fsynced (worker threads too)."""
    real, seen = os.fsync, []

    def counting(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return seen


def redo_files(replica) -> list[str]:
    return [n for n in folder_files(replica) if n.endswith(".patch")]


STEPS = [
    [(10, payload(700, 11))],
    [(3 * BPC - 5, payload(BPC + 900, 12))],                 # grows it
    [(0, payload(3, 13)), (600, payload(1500, 14))],
    [(5 * BPC - 1, payload(2 * BPC + 1, 15))],               # grows it again
    [(BPC, payload(BPC, 16)), (7 * BPC - 3, payload(9, 17))],
]


async def patched_five_times(store):
    """blk_2 made at stamp OLD and patched five times (OLD+1 .. OLD+5) without a flush; its
    versions (index 0 is the original)."""
    old = payload(3 * BPC + 200, 0)
    await finalized(store, 2, OLD, old)
    return await patched_five_times_on(store, old)


async def patched_five_times_on(store, old: bytes):
    """The finalized blk_2 at stamp OLD holding ``old`` patched five times, no flush."""
    replica = store.get(2)
    versions = [old]
    for i, ranges in enumerate(STEPS):
        await store.patch_finalized(2, OLD + i, OLD + i + 1, ranges, BLOCK)
        versions.append(model_after(versions[-1], ranges))
    assert replica.gs == OLD + 5 and len(replica.pending_redos) == 5
    assert len(redo_files(replica)) == 5
    return replica, versions


async def test_the_acknowledged_path_fsyncs_the_redo_file_and_its_folder_only(tmp_path,
                                                                            monkeypatch):
    store = await open_store(tmp_path)
    old = payload(4 * BPC, 0)
    replica = await finalized(store, 2, OLD, old)
    folder = os.path.dirname(replica.data_path)
    redo = os.path.join(folder, patching.patch_name(2, NEW))
    seen = fsync_counter(monkeypatch)
    await store.patch_finalized(2, OLD, NEW, [(100, payload(BPC * 2, 1))], BLOCK)
    assert seen == [redo, folder]
    # the flusher's pass does the rest: data, meta, folder; then the redo file goes
    seen.clear()
    assert await store.flush_pending() == 1
    assert seen == [replica.data_path, replica.meta_path, folder]
    assert redo_files(replica) == [] and replica.pending_redos == []
    seen.clear()
    assert await store.flush_pending() == 0 and seen == []   # nothing pending: no fsync
    files_consistent(replica, model_after(old, [(100, payload(BPC * 2, 1))]))
    store.close()


async def test_the_patch_flusher_task_flushes_within_its_period(tmp_path):
    store = await open_store(tmp_path)
    replica = await finalized(store, 2, OLD, payload(2 * BPC, 0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run_patch_flusher, 0.05)
        await store.patch_finalized(2, OLD, NEW, [(5, b"abc")], BLOCK)
        assert len(redo_files(replica)) == 1
        with trio.fail_after(5):
            while store.pending_patches():
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert redo_files(replica) == []
    store.close()


@pytest.mark.parametrize("lost", [None, "writes", "writes_and_renames", "writes_half_renamed"])
async def test_a_restart_rolls_every_pending_patch_forward_in_order(tmp_path, lost):
    """Five patches acknowledged, none flushed, then a crash: the restart applies the five
    redo files in order. ``lost``: what the crash lost besides the page cache's flush: the
    in-place writes (data and meta files back at their content before the first patch),
    those and the renames too (meta back at the first name), or the renames up to the
    third patch."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    replica = await finalized(store, 2, OLD, old)
    with open(replica.data_path, "rb") as d, open(replica.meta_path, "rb") as m:
        before_data, before_meta = d.read(), m.read()
    replica, versions = await patched_five_times_on(store, old)
    assert len(redo_files(replica)) == 5
    folder = os.path.dirname(replica.data_path)
    store.close()   # a crash: no flush
    if lost is not None:
        meta_gs = {"writes": OLD + 5, "writes_and_renames": OLD,
                   "writes_half_renamed": OLD + 3}[lost]
        os.unlink(replica.meta_path)
        with open(replica.data_path, "wb") as d:
            d.write(before_data)
        with open(os.path.join(folder, meta_name(2, meta_gs)), "wb") as m:
            m.write(before_meta)
    store = await open_store(tmp_path)
    replica = store.get(2)
    assert [o for _p, o in store.last_scan.patches] == [Recovery.ROLLED_FORWARD.value] * 5
    assert replica.gs == OLD + 5 and replica.num_bytes == len(versions[-1])
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, OLD + 5)])
    files_consistent(replica, versions[-1])
    assert await read_whole(store, 2, OLD + 5) == versions[-1]
    store.close()


async def test_a_torn_last_redo_ends_at_the_last_whole_version(tmp_path):
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    replica = await finalized(store, 2, OLD, old)
    with open(replica.data_path, "rb") as d, open(replica.meta_path, "rb") as m:
        before_data, before_meta = d.read(), m.read()
    versions = [old]
    for i, ranges in enumerate(STEPS[:3]):
        await store.patch_finalized(2, OLD + i, OLD + i + 1, ranges, BLOCK)
        versions.append(model_after(versions[-1], ranges))
    # the fourth patch's redo file is being written when the crash hits
    job = PatchJob(2, OLD + 3, OLD + 4, BPC, replica.data_path, replica.meta_path,
                   replica.num_bytes, check_ranges(replica.name, STEPS[3], replica.num_bytes,
                                                   BLOCK), STEPS[3])
    patch_files(job, replica, stop_after=Step.REDO)
    with open(job.redo_path, "r+b") as fh:
        fh.truncate(os.path.getsize(job.redo_path) // 2)
    store.close()
    # and the in-place writes of the three acknowledged ones never reached the disk
    os.unlink(replica.meta_path)
    with open(replica.data_path, "wb") as d:
        d.write(before_data)
    with open(os.path.join(os.path.dirname(replica.data_path), meta_name(2, OLD + 3)),
              "wb") as m:
        m.write(before_meta)
    store = await open_store(tmp_path)
    replica = store.get(2)
    outcomes = dict(store.last_scan.patches)
    assert outcomes.pop(job.redo_path) == Recovery.TORN.value
    assert sorted(outcomes.values()) == [Recovery.ROLLED_FORWARD.value] * 3
    assert replica.gs == OLD + 3 and redo_files(replica) == []
    files_consistent(replica, versions[3])
    store.close()


async def test_a_delete_with_pending_redos_removes_them_too(tmp_path):
    store = await open_store(tmp_path)
    replica, _versions = await patched_five_times(store)
    folder = os.path.dirname(replica.data_path)
    assert await store.invalidate(2, OLD + 5)
    assert not [n for n in os.listdir(folder) if n.startswith("blk_2")]
    assert store.pending_patches() == 0 and await store.flush_pending() == 0
    store.close()


async def test_an_append_reopen_flushes_pending_redos_first(tmp_path, monkeypatch):
    store = await open_store(tmp_path)
    replica, versions = await patched_five_times(store)
    folder = os.path.dirname(replica.data_path)
    seen = fsync_counter(monkeypatch)
    await store.reopen_for_append(2, OLD + 10, len(versions[-1]))
    assert seen[:3] == [os.path.join(folder, "blk_2"),
                        os.path.join(folder, meta_name(2, OLD + 5)), folder]
    assert not [n for n in os.listdir(folder) if n.startswith("blk_2")]
    assert replica.state is ReplicaState.RBW and store.pending_patches() == 0
    files_consistent(replica, versions[-1])
    await store.release_writer(replica)
    store.close()
    store = await open_store(tmp_path)   # no redo file comes back to roll anything forward
    assert store.last_scan.patches == [] and store.get(2).gs == OLD + 10
    files_consistent(store.get(2), versions[-1])
    store.close()


async def test_block_recovery_flushes_pending_redos_at_init(tmp_path):
    store = await open_store(tmp_path)
    replica, versions = await patched_five_times(store)
    await store.init_replica_recovery(2, OLD + 5, OLD + 20)
    assert redo_files(replica) == [] and store.pending_patches() == 0
    await store.update_replica_under_recovery(2, OLD + 20, len(versions[-1]) - 7)
    assert replica.gs == OLD + 20
    files_consistent(replica, versions[-1][:-7])
    store.close()


async def test_a_lost_replica_takes_its_pending_redos_to_corrupt(tmp_path):
    store = await open_store(tmp_path)
    replica, _versions = await patched_five_times(store)
    folder = os.path.dirname(replica.data_path)
    os.truncate(replica.data_path, 100)   # cut behind the map's back
    assert await store.drop_if_lost(2, OLD + 5) is not None
    assert not [n for n in os.listdir(folder) if n.startswith("blk_2")]
    corrupt = os.listdir(tmp_path / "corrupt")
    assert len([n for n in corrupt if n.endswith(".patch")]) == 5
    assert store.pending_patches() == 0
    store.close()


async def test_redo_files_back_from_before_a_later_change_are_removed(tmp_path):
    """A flush's unlinks are not fsynced: after a crash a redo file may come back although
    the replica moved on since (here: block recovery stamped it anew and cut it)."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC, 0)
    replica = await finalized(store, 2, OLD, old)
    await store.patch_finalized(2, OLD, NEW, [(5, b"abc")], BLOCK)
    redo = replica.pending_redos[0]
    with open(redo, "rb") as fh:
        raw = fh.read()
    await store.init_replica_recovery(2, NEW, OLD + 50)
    await store.update_replica_under_recovery(2, OLD + 50, 100)
    store.close()
    with open(redo, "wb") as fh:
        fh.write(raw)
    store = await open_store(tmp_path)
    assert store.last_scan.patches == [(redo, Recovery.DONE.value)]
    assert store.get(2).gs == OLD + 50 and not os.path.exists(redo)
    files_consistent(store.get(2), model_after(old, [(5, b"abc")])[:100])
    store.close()


async def test_redo_files_that_do_not_link_to_the_replica_quarantine_it(tmp_path):
    """A redo file of the chain lost (only disk corruption does that) and the meta file at
    the first stamp: the newer patches' in-place writes may be in the files under the old
    name, so the replica is not served."""
    store = await open_store(tmp_path)
    replica, _versions = await patched_five_times(store)
    folder = os.path.dirname(replica.data_path)
    store.close()
    os.unlink(os.path.join(folder, patching.patch_name(2, OLD + 2)))
    os.replace(replica.meta_path, os.path.join(folder, meta_name(2, OLD)))
    store = await open_store(tmp_path)
    assert store.get(2) is None
    assert sorted(o for _p, o in store.last_scan.patches) == [Recovery.BROKEN.value] * 4
    assert not [n for n in os.listdir(folder) if n.startswith("blk_2")]
    store.close()


# --------------------------------------------------------------------------- short-circuit


def chunks_verify(data: bytes, meta: bytes) -> bool:
    try:
        verify_checksums(data, meta[7:], BPC, "read")
        return True
    except ChecksumError:
        return False


async def test_a_replica_named_to_a_short_circuit_reader_is_patched_in_copies(tmp_path):
    """The files of a replica named to a short-circuit reader (who reads them without the
    block server) are not rewritten in place: a reader that opened them before the patch
    reads the old version whole, checksums and all; the replica's names then hold the new
    version (no copy left over), the old stamp's meta name is gone (a reader with the old
    names falls back to data transfer), and a replica never named is patched in place."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    replica = await finalized(store, 2, OLD, old)
    data_path, meta_path, gs = store.finalized_files(2, OLD)
    assert gs == OLD
    data_fd, meta_fd = os.open(data_path, os.O_RDONLY), os.open(meta_path, os.O_RDONLY)
    try:
        await store.patch_finalized(2, OLD, NEW, RANGES, BLOCK)
        new = model_after(old, RANGES)
        got = os.pread(data_fd, 1 << 20, 0), os.pread(meta_fd, 1 << 20, 0)
        assert got[0] == old and chunks_verify(*got)
    finally:
        os.close(data_fd)
        os.close(meta_fd)
    replica = store.get(2)
    assert replica.gs == NEW and replica.data_path == data_path
    files_consistent(replica, new)
    assert not os.path.exists(meta_path)
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW),
                                            patching.patch_name(2, NEW)])
    assert await read_whole(store, 2, NEW) == new
    assert await store.flush_pending() == 1
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW)])
    # never named: in place, the same inode
    other = await finalized(store, 3, OLD, old)
    inode = os.stat(other.data_path).st_ino
    await store.patch_finalized(3, OLD, NEW, RANGES, BLOCK)
    assert os.stat(other.data_path).st_ino == inode
    files_consistent(store.get(3), new)
    store.close()


@pytest.mark.parametrize("stop_after", [Step.APPLY, Step.NEW_META, Step.OLD_META_GONE])
async def test_a_patch_in_copies_cut_short_by_a_crash_is_rolled_forward(tmp_path, stop_after):
    """A crash at each point of a patch made in copies: the copies written, the new meta
    name beside the old one, the old one unlinked before the data swap. The restart ends
    at the new version with only the replica's two files (copies and the old meta gone)."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    replica = await finalized(store, 2, OLD, old)
    job = job_for(replica, RANGES)
    job.copy = True
    patch_files(job, replica, stop_after=stop_after)
    folder = os.path.dirname(replica.data_path)
    left = set(os.listdir(folder))
    assert {Step.APPLY: {"blk_2.cow", meta_name(2, NEW) + ".cow", meta_name(2, OLD)},
            Step.NEW_META: {"blk_2.cow", meta_name(2, NEW), meta_name(2, OLD)},
            Step.OLD_META_GONE: {"blk_2.cow", meta_name(2, NEW)}}[stop_after] <= left
    store.close()
    store = await open_store(tmp_path)
    replica = store.get(2)
    new = model_after(old, RANGES)
    assert store.last_scan.patches[0][1] == Recovery.ROLLED_FORWARD.value
    assert replica.gs == NEW and replica.num_bytes == len(new)
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW)])
    files_consistent(replica, new)
    assert await read_whole(store, 2, NEW) == new
    store.close()


@pytest.mark.allow_log_errors(r"failed while rewriting", reason="the test fails the swap")
async def test_a_patch_in_copies_that_fails_midway_is_rolled_forward(tmp_path, monkeypatch):
    """The data swap of a patch made in copies fails: the patch is made whole from the
    redo in place, the copies removed, the meta file at the new name only."""
    store = await open_store(tmp_path)
    old = payload(3 * BPC + 200, 0)
    await finalized(store, 2, OLD, old)
    store.finalized_files(2, OLD)
    real_replace = os.replace

    def failing(src, dst, *a, **k):
        if str(src).endswith("blk_2.cow"):
            raise OSError(5, "injected: the swap failed")
        return real_replace(src, dst, *a, **k)
    monkeypatch.setattr(patching.os, "replace", failing)
    await store.patch_finalized(2, OLD, NEW, RANGES, BLOCK)
    monkeypatch.setattr(patching.os, "replace", real_replace)
    replica = store.get(2)
    new = model_after(old, RANGES)
    assert replica.gs == NEW
    files_consistent(replica, new)
    assert folder_files(replica) == sorted(["blk_2", meta_name(2, NEW),
                                            patching.patch_name(2, NEW)])
    store.close()
