"""Edit journal: round trips across restarts, group commit, torn tails, corruption, roll and
purge, offline check, and the I/O-error path. Real files in tmp_path, real worker threads."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import trio
import trio.testing

from fs.errors import InternalError, InvalidArgument, NoSpace
from meta.journal.journal import Journal
from meta.journal.files import (RECORD_HEADER, JournalError, Record, check_journal, encode_record,
                                finalized_name, inprogress_name)
from meta.journal.ops_blocks import Close
from meta.journal.ops_namespace import Mkdir


class Applied:
    """The ``apply`` callback: remembers every batch it was handed."""

    def __init__(self) -> None:
        self.batches: list[list[Record]] = []

    def __call__(self, records: list[Record]) -> None:
        self.batches.append(list(records))

    @property
    def records(self) -> list[Record]:
        return [r for batch in self.batches for r in batch]


def file_listing(directory) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


async def log_all(journal: Journal, ops: list[tuple[str, dict]]) -> list[int]:
    """Run the syncer, log ``ops`` one after the other, close; returns their txids."""
    txids = []
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for op, args in ops:
            txids.append(await journal.log(op, args))
        await journal.aclose()
        nursery.cancel_scope.cancel()
    return txids


async def session(directory, ops, **kwargs) -> tuple[Journal, Applied, list[int]]:
    applied = Applied()
    journal = Journal(str(directory), applied, **kwargs)
    journal.open()
    txids = await log_all(journal, ops)
    return journal, applied, txids


def reopen(directory, store_applied=None, **kwargs) -> Journal:
    journal = Journal(str(directory), Applied(), **kwargs)
    journal.open(store_applied)
    return journal


def reopen_copy(directory) -> Journal:
    """The journal folder as a second process sees it now (a copy: opening finalizes)."""
    copy = directory.parent / (directory.name + "-copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(directory, copy)
    return reopen(copy)


async def restart(directory) -> None:
    """Open and close once: finalizes the in-progress segment, leaves an empty new one."""
    journal = reopen(directory)
    await journal.aclose()


def mkdir_ops(start: int, count: int) -> list[tuple[str, dict]]:
    return [("MKDIR", {"path": f"/d{i}", "perm": 0o755, "blob": bytes([i % 256])})
            for i in range(start, start + count)]


async def rolled_journal(directory, count: int) -> Journal:
    """A closed journal (keep_segments=0) whose ``count`` records are in one rolled segment."""
    journal = Journal(str(directory), Applied(), keep_segments=0)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for op, args in mkdir_ops(0, count):
            await journal.log(op, args)
        await journal.roll()
        nursery.cancel_scope.cancel()
    await journal.aclose()
    return journal


def only_segment(directory) -> str:
    names = [n for n in os.listdir(directory) if n.startswith("edits_")
             and not n.startswith("edits_inprogress_")]
    assert len(names) == 1, names
    return names[0]


# ------------------------------------------------------------------------------ round trip
async def test_append_replay_round_trip_across_restarts(tmp_path):
    _, applied, txids = await session(tmp_path, mkdir_ops(0, 5))
    assert txids == [1, 2, 3, 4, 5]
    assert [r.txid for r in applied.records] == [1, 2, 3, 4, 5]
    assert applied.records[2] == Record(3, "MKDIR", {"path": "/d2", "perm": 0o755, "blob": b"\x02"})

    journal = reopen(tmp_path)
    assert journal.last_txid == 5
    replayed = list(journal.replay(0))
    assert replayed == applied.records          # apply saw exactly what replay decodes
    assert [r.txid for r in journal.replay(3)] == [4, 5]
    assert list(journal.replay(5)) == []
    # the recovered in-progress segment was finalized; a new empty one waits at txid 6
    assert sorted(os.listdir(tmp_path)) == [finalized_name(1, 5), inprogress_name(6)]

    txids2 = await log_all(journal, mkdir_ops(5, 3))
    assert txids2 == [6, 7, 8]
    journal = reopen(tmp_path)
    assert journal.last_txid == 8
    assert [r.args["path"] for r in journal.replay(0)] == [f"/d{i}" for i in range(8)]
    assert [(s.first, s.last, s.in_progress) for s in journal.segments()] == [
        (1, 5, False), (6, 8, False), (9, 8, True)]


async def test_args_are_normalised_like_replay_and_bad_args_refused(tmp_path):
    applied = Applied()
    journal = Journal(str(tmp_path), applied, max_record=200)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await journal.log("RENAME", {"src": "/a", "pair": (1, 2), 7: "int key"})
        with pytest.raises(InvalidArgument, match="cannot be encoded"):
            await journal.log("MKDIR", {"path": object()})
        with pytest.raises(InvalidArgument, match="over the 200-byte limit"):
            await journal.log("MKDIR", {"path": "/x" * 200})
        assert await journal.log("MKDIR", {"path": "/b"}) == 2   # refused ones used no txid
        await journal.aclose()
        nursery.cancel_scope.cancel()
    assert applied.records[0].args == {"src": "/a", "pair": [1, 2], 7: "int key"}
    assert list(reopen(tmp_path).replay(0)) == applied.records


def test_empty_directory_and_replay_bounds(tmp_path):
    journal = reopen(tmp_path / "new")
    assert journal.last_txid == 0
    assert list(journal.replay(0)) == []
    with pytest.raises(JournalError, match="applied txid 3"):
        journal.replay(3)


# ------------------------------------------------------------------------------ group commit
async def test_group_commit_batches_concurrent_logs(tmp_path):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    results: dict[int, int] = {}

    async def one(i):
        results[i] = await journal.log("MKDIR", {"path": f"/p{i}"})

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        async with trio.open_nursery() as writers:
            for i in range(50):
                writers.start_soon(one, i)
        await journal.aclose()
        nursery.cancel_scope.cancel()
    assert sorted(results.values()) == list(range(1, 51))
    assert journal.stats.records == 50
    assert journal.stats.fsyncs < 10, journal.stats
    assert len(applied.batches) == journal.stats.fsyncs
    # apply saw every record exactly once, in txid order, each caller's own record
    assert [r.txid for r in applied.records] == list(range(1, 51))
    by_txid = {r.txid: r.args["path"] for r in applied.records}
    assert all(by_txid[txid] == f"/p{i}" for i, txid in results.items())
    assert journal.stats.bytes == os.path.getsize(tmp_path / inprogress_name(1))


async def test_log_many_writes_its_records_in_one_batch_or_refuses_them_all(tmp_path):
    """``log_many``: consecutive txids, one fsync, one apply call with all of them; a record
    that cannot be encoded refuses the whole list before any txid is used."""
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        assert await journal.log("MKDIR", {"path": "/a"}) == 1
        fsyncs = journal.stats.fsyncs
        assert await journal.log_many([("ADD", {"path": "/a/f"}),
                                       ("ADD_BLOCK", {"path": "/a/f"})]) == [2, 3]
        assert journal.stats.fsyncs == fsyncs + 1
        assert [r.txid for r in applied.batches[-1]] == [2, 3]
        with pytest.raises(InvalidArgument, match="cannot be encoded"):
            await journal.log_many([("ADD", {"path": "/a/g"}), ("X", {"bad": object()})])
        assert await journal.log("MKDIR", {"path": "/b"}) == 4
        await journal.aclose()
        nursery.cancel_scope.cancel()
    assert [(r.txid, r.op) for r in reopen(tmp_path).replay(0)] == [
        (1, "MKDIR"), (2, "ADD"), (3, "ADD_BLOCK"), (4, "MKDIR")]


async def test_a_typed_op_is_journaled_as_its_wire_pair(tmp_path):
    """``log``/``log_many`` take typed ops: the segment holds the same bytes as when the
    op's ``(name, args)`` pair is logged, and replay gives that pair back."""
    ops = [Mkdir(dirs=[{"parent": 1, "name": "a", "ino": 2}], time=5),
           Close(ino=2, last=None, time=6, mode=0o600)]
    as_pairs = [op.to_wire() for op in ops]
    await session(tmp_path / "pairs", as_pairs)
    await session(tmp_path / "ops", [(op, None) for op in ops])
    assert file_listing(tmp_path / "ops") == file_listing(tmp_path / "pairs")
    assert [(r.op, r.args) for r in reopen(tmp_path / "ops").replay(0)] == as_pairs


async def test_log_returns_only_after_apply(tmp_path):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(3):
            txid = await journal.log("MKDIR", {"path": f"/{i}"})
            assert applied.records[-1].txid == txid
            assert journal.last_txid == txid
        nursery.cancel_scope.cancel()
    await journal.aclose()


async def test_cancelled_caller_record_still_written_and_applied(tmp_path):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    outcome = {}

    async def cancelled_writer():
        with trio.CancelScope() as scope:
            scope.cancel()                    # cancelled before its wait even starts
            await journal.log("MKDIR", {"path": "/cancelled"})
        outcome["cancelled"] = scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        await cancelled_writer()          # queued, caller gone before the syncer runs
        nursery.start_soon(journal.run)
        assert await journal.log("MKDIR", {"path": "/after"}) == 2
        await journal.aclose()
        nursery.cancel_scope.cancel()
    assert outcome["cancelled"] is True
    assert [r.args["path"] for r in applied.records] == ["/cancelled", "/after"]
    assert [r.args["path"] for r in reopen(tmp_path).replay(0)] == ["/cancelled", "/after"]


async def test_aclose_flushes_queued_records_without_syncer(tmp_path):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    txids = []

    async def waiter(i):
        txids.append(await journal.log("MKDIR", {"i": i}))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(waiter, i)
        await trio.testing.wait_all_tasks_blocked()
        assert applied.records == []     # no syncer running: nothing durable yet
        await journal.aclose()
    assert sorted(txids) == [1, 2, 3]
    with pytest.raises(InternalError, match="not open"):
        await journal.log("MKDIR", {})
    assert journal.stats.fsyncs == 1
    assert reopen(tmp_path).last_txid == 3


# ------------------------------------------------------------------------------ torn tails
async def test_torn_tail_truncated_mid_record_is_cut(tmp_path, caplog):
    await session(tmp_path, mkdir_ops(0, 4))               # crash-like: inprogress_1 holds 1..4
    inprog = tmp_path / inprogress_name(1)
    inprog.write_bytes(inprog.read_bytes()[:-5])     # record 4 loses its last 5 bytes
    cut = len(encode_record(4, *mkdir_ops(3, 1)[0])) - 5
    with caplog.at_level(logging.WARNING, logger="meta.journal"):
        journal = reopen(tmp_path)
    assert journal.last_txid == 3
    assert any("torn tail" in m and inprogress_name(1) in m and f": {cut} bytes" in m
               for m in caplog.messages), caplog.messages
    assert sorted(os.listdir(tmp_path)) == [finalized_name(1, 3), inprogress_name(4)]

    txids = await log_all(journal, mkdir_ops(100, 2))
    assert txids == [4, 5]
    assert [r.txid for r in reopen(tmp_path).replay(0)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("garbage", [b"\x00" * 4096, b"\x00\x00\x00\x10garbage!", b"\xff" * 3,
                                     b"\x00\x00\x00\x05\x00\x00\x00\x00abcde"])
async def test_torn_tail_garbage_or_zero_fill_at_end_is_cut(tmp_path, caplog, garbage):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()

    async def crash_after_three():    # no aclose, no roll: the in-progress segment stays
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            for op, args in mkdir_ops(0, 3):
                await journal.log(op, args)
            nursery.cancel_scope.cancel()

    await crash_after_three()
    os.close(journal._fd)  # the crashed process's descriptor
    inprog = tmp_path / inprogress_name(1)
    good_size = inprog.stat().st_size
    with open(inprog, "ab") as fh:
        fh.write(garbage)
    with caplog.at_level(logging.WARNING, logger="meta.journal"):
        journal = reopen(tmp_path)
    assert journal.last_txid == 3
    assert any(f"offset {good_size}: {len(garbage)} bytes" in m for m in caplog.messages), caplog.messages
    assert (tmp_path / finalized_name(1, 3)).stat().st_size == good_size
    assert await log_all(journal, mkdir_ops(3, 1)) == [4]
    assert [r.txid for r in reopen(tmp_path).replay(0)] == [1, 2, 3, 4]


async def test_torn_first_record_leaves_empty_segment_and_keeps_txid(tmp_path):
    await session(tmp_path, mkdir_ops(0, 2))
    await restart(tmp_path)                               # edits_1-2 + inprogress_3 (empty)
    inprog = tmp_path / inprogress_name(3)
    inprog.write_bytes(encode_record(3, "MKDIR", {"path": "/torn"})[:9])
    journal = reopen(tmp_path)
    assert journal.last_txid == 2
    assert sorted(os.listdir(tmp_path)) == [finalized_name(1, 2), inprogress_name(3)]
    assert await log_all(journal, mkdir_ops(2, 1)) == [3]


@pytest.mark.parametrize("empty_segment", [False, True])
async def test_store_ahead_of_a_lost_tail_is_bridged_and_the_check_agrees(tmp_path, caplog,
                                                                     empty_segment):
    await session(tmp_path, mkdir_ops(0, 5))               # inprogress_1 holds 1..5
    if empty_segment:
        await restart(tmp_path)                            # edits_1-5 + inprogress_6 (empty)
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)
        await session(tmp_path, [])                        # a folder that only keeps the counter
        assert check_journal(str(tmp_path))[-1] == "OK: no records (last txid 0)"
        applied, lost = 5, "1..5"
    else:
        inprog = tmp_path / inprogress_name(1)
        inprog.write_bytes(inprog.read_bytes()[:-3])   # record 5 lost its tail
        applied, lost = 7, "5..7"                    # the store applied 5..7 before the loss
    before = file_listing(tmp_path)
    text = "\n".join(check_journal(str(tmp_path), store_applied=applied))
    assert f"txids {lost} are not in the journal" in text, text
    assert f"continuing at txid {applied + 1}" in text
    assert file_listing(tmp_path) == before

    with caplog.at_level(logging.WARNING, logger="meta.journal"):
        journal = reopen(tmp_path, store_applied=applied)
    assert any(f"txids {lost} are not in the journal" in m for m in caplog.messages)
    assert journal.last_txid == applied and list(journal.replay(applied)) == []
    assert await log_all(journal, mkdir_ops(50, 2)) == [applied + 1, applied + 2]
    # the chain is whole again: a plain restart, replay after the store, the check
    journal = reopen(tmp_path, store_applied=applied + 2)
    assert [r.txid for r in journal.replay(applied)] == [applied + 1, applied + 2]
    with pytest.raises(JournalError, match="recorded as lost"):
        list(journal.replay(int(lost.split("..")[0]) - 1))
    text = "\n".join(check_journal(str(tmp_path), store_applied=applied + 2))
    assert f"txids {lost}: lost from the journal" in text and "nothing to replay" in text


async def test_store_needing_purged_records_is_refused_by_start_and_check_alike(tmp_path):
    journal = await rolled_journal(tmp_path, 4)
    journal.purge(4)
    before = file_listing(tmp_path)
    with pytest.raises(JournalError, match="applied txid 2; txids 3..4 are needed"):
        check_journal(str(tmp_path), store_applied=2)
    with pytest.raises(JournalError, match="applied txid 2; txids 3..4 are needed"):
        reopen(tmp_path, store_applied=2)
    assert file_listing(tmp_path) == before


async def test_start_skips_segments_the_store_applied_and_the_check_warns_about_them(tmp_path):
    await session(tmp_path, mkdir_ops(0, 3))               # edits_1-3
    await session(tmp_path, mkdir_ops(3, 2))
    await restart(tmp_path)                                # edits_4-5, inprogress_6 empty
    (tmp_path / finalized_name(1, 3)).write_bytes(b"\x00" * 8)
    with pytest.raises(JournalError, match=finalized_name(1, 3)):
        check_journal(str(tmp_path), store_applied=2)   # a start would replay txid 3
    before = file_listing(tmp_path)
    text = "\n".join(check_journal(str(tmp_path), store_applied=3))
    assert f"WARNING: journal segment {tmp_path / finalized_name(1, 3)}: bad record at " \
           f"offset 0" in text and "a replay from before txid 4 would fail" in text, text
    assert "next start: replays txids 4..5" in text
    assert file_listing(tmp_path) == before
    journal = reopen(tmp_path, store_applied=3)      # the start agrees: it does not read it
    assert [r.txid for r in journal.replay(3)] == [4, 5]
    await journal.aclose()


# ------------------------------------------------------------------------------ corruption
async def test_bad_record_in_middle_of_inprogress_is_hard_error(tmp_path):
    await session(tmp_path, mkdir_ops(0, 6))               # inprogress_1 holds 1..6
    inprog = tmp_path / inprogress_name(1)
    data = bytearray(inprog.read_bytes())
    first_len = len(encode_record(1, "MKDIR", {"path": "/d0", "perm": 0o755, "blob": b"\x00"}))
    data[first_len + 12] ^= 0x40                    # inside the body of record 2
    inprog.write_bytes(bytes(data))
    before = file_listing(tmp_path)
    with pytest.raises(JournalError) as info:
        reopen(tmp_path)
    msg = str(info.value)
    assert inprogress_name(1) in msg and f"offset {first_len}" in msg and "CRC" in msg, msg
    assert info.value.offset == first_len
    assert file_listing(tmp_path) == before         # nothing cut, nothing renamed


async def test_flipped_byte_in_finalized_segment_is_hard_error(tmp_path):
    await session(tmp_path, mkdir_ops(0, 3))
    await session(tmp_path, mkdir_ops(3, 3))               # edits_1-3, edits_4-6
    seg = tmp_path / finalized_name(1, 3)
    data = bytearray(seg.read_bytes())
    data[10] ^= 0x01                                 # body of the very first record
    seg.write_bytes(bytes(data))
    with pytest.raises(JournalError, match=rf"{finalized_name(1, 3)}.*offset 0"):
        reopen(tmp_path)
    with pytest.raises(JournalError, match=rf"{finalized_name(1, 3)}.*offset 0"):
        check_journal(str(tmp_path))


async def test_truncated_finalized_segment_is_hard_error(tmp_path):
    await session(tmp_path, mkdir_ops(0, 3))
    await session(tmp_path, mkdir_ops(3, 1))
    seg = tmp_path / finalized_name(1, 3)
    seg.write_bytes(seg.read_bytes()[:-2])
    with pytest.raises(JournalError, match=rf"{finalized_name(1, 3)}: bad record at offset \d+: short"):
        reopen(tmp_path)


async def test_txid_gap_between_segments_is_hard_error(tmp_path):
    await session(tmp_path, mkdir_ops(0, 2))               # edits_1-2
    await session(tmp_path, mkdir_ops(2, 2))               # edits_3-4
    await session(tmp_path, mkdir_ops(4, 2))
    await restart(tmp_path)                                # edits_5-6
    (tmp_path / finalized_name(3, 4)).unlink()
    before = file_listing(tmp_path)
    with pytest.raises(JournalError) as info:
        reopen(tmp_path)
    msg = str(info.value)
    assert file_listing(tmp_path) == before
    assert finalized_name(5, 6) in msg and "offset 0" in msg and "gap" in msg, msg
    assert finalized_name(1, 2) in msg


def test_txid_out_of_sequence_inside_segment_is_hard_error(tmp_path):
    records = encode_record(1, "MKDIR", {}) + encode_record(3, "MKDIR", {})
    (tmp_path / finalized_name(1, 2)).write_bytes(records)
    offset = len(encode_record(1, "MKDIR", {}))
    with pytest.raises(JournalError, match=rf"offset {offset} has txid 3, expected 2"):
        reopen(tmp_path)


# ------------------------------------------------------------------------------ roll + purge
async def test_roll_and_purge_keep_newest_segments(tmp_path):
    journal = Journal(str(tmp_path), Applied(), keep_segments=2)
    journal.open()

    async def main():
        ranges = []
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            for round_ in range(5):
                for i in range(3):
                    await journal.log("MKDIR", {"path": f"/r{round_}/{i}"})
                ranges.append(await journal.roll())
            assert await journal.roll() == (16, 15)      # empty segment is not rolled
            await journal.log("MKDIR", {"path": "/tail"})
            nursery.cancel_scope.cancel()
        await journal.aclose()
        return ranges

    ranges = await main()
    assert ranges == [(1, 3), (4, 6), (7, 9), (10, 12), (13, 15)]
    assert [s.name for s in journal.segments()][:5] == [finalized_name(a, b) for a, b in ranges]

    assert journal.purge(4) == [finalized_name(1, 3)]   # 4..6 holds txids > 4: kept
    removed = journal.purge(15)                          # newest 2 always kept
    assert removed == [finalized_name(4, 6), finalized_name(7, 9)]
    assert sorted(os.listdir(tmp_path)) == [finalized_name(10, 12), finalized_name(13, 15),
                                           inprogress_name(16)]
    assert journal.purge(100) == []

    journal = reopen(tmp_path)
    assert journal.last_txid == 16
    assert [r.txid for r in journal.replay(9)] == list(range(10, 17))
    with pytest.raises(JournalError, match="no longer in the journal"):
        journal.replay(5)


async def test_purge_everything_keeps_txid_counter(tmp_path):
    journal = await rolled_journal(tmp_path, 4)
    assert journal.purge(4) == [finalized_name(1, 4)]
    journal = reopen(tmp_path, keep_segments=0)
    assert journal.last_txid == 4
    assert list(journal.replay(4)) == []
    assert await log_all(journal, mkdir_ops(4, 1)) == [5]


# ------------------------------------------------------------------------------ offline check
async def test_check_journal_reports_and_never_modifies(tmp_path):
    await session(tmp_path, mkdir_ops(0, 3))               # edits_1-3
    await session(tmp_path, mkdir_ops(3, 2))
    await restart(tmp_path)                                # edits_4-5, inprogress_6 empty
    inprog = tmp_path / inprogress_name(6)
    inprog.write_bytes(encode_record(6, "MKDIR", {"p": 1}) + b"\x00\x00\x00\x40half")
    before = file_listing(tmp_path)
    lines = check_journal(str(tmp_path))
    text = "\n".join(lines)
    assert f"{finalized_name(1, 3)}: finalized, txids 1..3, 3 records" in text
    assert f"{finalized_name(4, 5)}: finalized, txids 4..5, 2 records" in text
    assert f"{inprogress_name(6)}: in progress, txids 6..6, 1 records" in text
    size6 = len(encode_record(6, "MKDIR", {"p": 1}))
    assert f"torn tail at offset {size6}: 8 bytes" in text
    assert "OK: 6 records, txids 1..6" in text
    assert file_listing(tmp_path) == before

    (tmp_path / finalized_name(4, 5)).write_bytes(b"\x00" * 8)
    before = file_listing(tmp_path)
    with pytest.raises(JournalError, match=rf"{finalized_name(4, 5)}.*offset 0"):
        check_journal(str(tmp_path))
    assert file_listing(tmp_path) == before
    with pytest.raises(JournalError, match="not a directory"):
        check_journal(str(tmp_path / "missing"))


# ------------------------------------------------------------------------------ I/O errors
@pytest.mark.allow_log_errors(r"journal write failed", reason="the test fills the disk")
async def test_failed_write_is_cut_back_so_failed_callers_are_not_durable(tmp_path, monkeypatch,
                                                                     caplog):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    real_write = os.write
    disk_full = True
    errors: list[Exception] = []

    def short_write(fd, data):     # a disk that takes half a batch, then is full
        if disk_full and len(data) > 8:
            return real_write(fd, bytes(data[:len(data) // 2]))
        if disk_full:
            raise OSError(28, "No space left on device (injected)")
        return real_write(fd, data)

    async def writer(i):
        try:
            await journal.log("MKDIR", {"path": f"/{i}"})
        except NoSpace as exc:
            errors.append(exc)

    async def main():
        nonlocal disk_full
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            assert await journal.log("MKDIR", {"path": "/ok"}) == 1
            monkeypatch.setattr(os, "write", short_write)
            async with trio.open_nursery() as writers:
                for i in range(5):
                    writers.start_soon(writer, i)
            disk_full = False            # space is back: the journal writes again
            assert await journal.log("MKDIR", {"path": "/later"}) == 2
            nursery.cancel_scope.cancel()
        await journal.aclose()

    with caplog.at_level(logging.ERROR, logger="meta.journal"):
        await main()
    monkeypatch.setattr(os, "write", real_write)
    assert len(errors) == 5 and all(e.errno == 28 for e in errors)
    assert all("journal write failed" in str(e) and "did not happen" in str(e) for e in errors)
    assert [(r.txid, r.args["path"]) for r in applied.records] == [(1, "/ok"), (2, "/later")]
    assert [(r.txid, r.args["path"]) for r in reopen(tmp_path).replay(0)] == \
        [(1, "/ok"), (2, "/later")]


@pytest.mark.allow_log_errors(r"journal write failed", r"the metadata server stops",
                              reason="the test breaks fsync")
async def test_write_whose_cut_back_fails_stops_without_answering(tmp_path, monkeypatch, caplog):
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    answered: list[str] = []

    def broken_fsync(fd):
        raise OSError(5, "Input/output error (injected)")

    async def writer(i):
        try:
            await journal.log("MKDIR", {"path": f"/{i}"})
            answered.append("ok")
        except InternalError as exc:
            answered.append(str(exc))

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            assert await journal.log("MKDIR", {"path": "/ok"}) == 1
            monkeypatch.setattr(os, "fsync", broken_fsync)
            for i in range(5):
                nursery.start_soon(writer, i)

    with caplog.at_level(logging.ERROR, logger="meta.journal"):
        with pytest.raises(BaseExceptionGroup) as group:
            await main()
    monkeypatch.undo()
    assert group.group_contains(JournalError, match="whether those records are durable is unknown")
    assert answered == []                                 # fate unknown: nobody was answered
    assert [r.txid for r in applied.records] == [1]       # nothing undurable was applied
    await assert_unanswered(journal.log, "MKDIR", {"path": "/later"})
    assert any("the metadata server stops" in m for m in caplog.messages)
    await journal.aclose()


@pytest.mark.allow_log_errors(r"applying txids", r"the metadata server stops",
                              reason="the test's apply raises")
async def test_apply_error_stops_without_answering_and_the_records_replay(tmp_path, caplog):
    seen = []
    answered = []

    def apply(records):
        seen.extend(r.txid for r in records)
        if any(r.args.get("boom") for r in records):
            raise RuntimeError("namespace bug")

    journal = Journal(str(tmp_path), apply)
    journal.open()

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            assert await journal.log("MKDIR", {"path": "/fine"}) == 1
            answered.append(await journal.log("MKDIR", {"boom": True}))

    with caplog.at_level(logging.ERROR, logger="meta.journal"):
        with pytest.raises(BaseExceptionGroup) as group:
            await main()
    await journal.aclose()
    assert group.group_contains(JournalError, match="applying txids 2..2 failed.*namespace bug")
    assert seen == [1, 2] and answered == []
    assert [r.txid for r in reopen(tmp_path).replay(0)] == [1, 2]   # durable: replays


# ------------------------------------------------------------------ written, then durable

async def test_a_written_log_returns_before_its_fsync_and_sync_makes_it_durable(tmp_path):
    """``durable=False``: answered once written and applied; the fsync waits for
    ``sync_delay`` (here a minute) unless ``sync()`` asks for it, which it then does at once."""
    applied = Applied()
    journal = Journal(str(tmp_path), applied, sync_delay=60.0)
    journal.open()
    seen = {}

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        fsyncs = journal.stats.fsyncs
        txids = [await journal.log(op, args, durable=False) for op, args in mkdir_ops(0, 3)]
        seen["txids"] = txids
        seen["applied"] = [r.txid for r in applied.records]
        seen["durable"] = journal.durable_txid
        seen["fsyncs"] = journal.stats.fsyncs - fsyncs
        # written to the segment: a new process (a restart after kill -9) reads them
        seen["on_disk"] = [r.txid for r in reopen_copy(tmp_path).replay(0)]
        with trio.fail_after(10):      # not the minute of sync_delay
            seen["synced"] = await journal.sync()
        seen["durable_after"] = journal.durable_txid
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert seen["txids"] == [1, 2, 3] and seen["applied"] == [1, 2, 3]
    assert seen["durable"] == 0 and seen["fsyncs"] == 0
    assert seen["on_disk"] == [1, 2, 3]
    assert seen["synced"] == 3 and seen["durable_after"] == 3


async def test_the_background_fsync_follows_within_the_delay(tmp_path):
    durable_seen = []
    journal = Journal(str(tmp_path), Applied(), sync_delay=0.01)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for op, args in mkdir_ops(0, 5):
            await journal.log(op, args, durable=False)
        with trio.fail_after(10):   # no sync() and no close: the background fsync
            while journal.durable_txid < 5:
                durable_seen.append(journal.durable_txid)
                await trio.sleep(0.005)
        durable_seen.append(journal.durable_txid)
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert durable_seen and durable_seen[-1] == 5 and durable_seen == sorted(durable_seen)
    # the five calls came one after the other within the delay: far fewer fsyncs than records
    assert journal.stats.fsyncs < 5, journal.stats


async def test_a_durable_log_makes_the_written_ones_before_it_durable(tmp_path):
    journal = Journal(str(tmp_path), Applied(), sync_delay=60.0)
    journal.open()
    seen = {}

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for op, args in mkdir_ops(0, 3):
            await journal.log(op, args, durable=False)
        seen["before"] = journal.durable_txid
        seen["txid"] = await journal.log("MKDIR", {"path": "/sync"})
        seen["after"] = journal.durable_txid
        nursery.cancel_scope.cancel()
    await journal.aclose()
    assert seen == {"before": 0, "txid": 4, "after": 4}


async def test_roll_and_close_make_written_records_durable(tmp_path):
    journal = Journal(str(tmp_path), Applied(), sync_delay=60.0, keep_segments=5)
    journal.open()
    seen = {}

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for op, args in mkdir_ops(0, 2):
            await journal.log(op, args, durable=False)
        seen["rolled"] = await journal.roll()
        seen["after_roll"] = journal.durable_txid
        await journal.log("MKDIR", {"path": "/late"}, durable=False)
        seen["before_close"] = journal.durable_txid
        nursery.cancel_scope.cancel()
    await journal.aclose()
    seen["after_close"] = journal.durable_txid
    assert seen == {"rolled": (1, 2), "after_roll": 2, "before_close": 2, "after_close": 3}
    assert [r.txid for r in reopen(tmp_path).replay(0)] == [1, 2, 3]


async def assert_unanswered(call, *args) -> None:
    """After a fail-stop a call is never answered (neither success nor an error reply that
    would be final for its client): it waits until the stopping server cancels it."""
    with trio.move_on_after(0.3) as scope:
        await call(*args)
    assert scope.cancelled_caught, f"{call.__name__} returned after the journal stopped"


@pytest.mark.allow_log_errors(r"journal fsync of .* failed", r"the metadata server stops",
                              reason="the test breaks fsync")
async def test_a_failed_background_fsync_stops_the_journal(tmp_path, monkeypatch, caplog):
    """Written records were answered: when their fsync fails the server must stop (HDFS
    terminates when it cannot sync a required journal), and nothing is answered after."""
    journal = Journal(str(tmp_path), Applied(), sync_delay=0.0)
    journal.open()
    answered = []

    def broken_fsync(fd):
        raise OSError(5, "Input/output error (injected)")

    async def main():
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(journal.run)
                monkeypatch.setattr(os, "fsync", broken_fsync)
                answered.append(await journal.log("MKDIR", {"path": "/a"}, durable=False))
                await trio.sleep_forever()

    with caplog.at_level(logging.ERROR, logger="meta.journal"):
        with pytest.raises(BaseExceptionGroup) as group:
            await main()
    monkeypatch.undo()
    assert group.group_contains(JournalError, match="txids up to 1 were acknowledged")
    assert answered == [1]
    await assert_unanswered(journal.log, "MKDIR", {"path": "/later"})
    await assert_unanswered(journal.sync)


async def test_replicated_batches_grow_under_load_and_a_lone_caller_never_waits(
        tmp_path, autojump_clock):
    """With a replicator (ha = etcd) the syncer lets a batch smaller than the previous one
    grow, up to ``GATHER_SHARE`` of it or ``gather`` times the previous append's duration,
    whichever comes first; after a one-record batch it sends at once. Virtual time: the
    replicated path writes on the trio thread and leaves the worker thread idle."""
    applied = Applied()
    journal = Journal(str(tmp_path), applied)
    journal.open()
    appends: list[tuple[float, int]] = []

    async def replicator(records, chunks):
        appends.append((trio.current_time(), len(records)))
        await trio.sleep(0.010)

    journal.replicator = replicator
    journal.gather = 0.5
    returned: dict[str, float] = {}

    async def caller(name: str, at: float, start: float):
        await trio.sleep_until(start + at)
        await journal.log("MKDIR", {"path": f"/{name}"})
        returned[name] = trio.current_time() - start

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await journal.log_many([("MKDIR", {"path": f"/a{i}"}) for i in range(8)])
        # 6 callers 1 ms apart after a batch of 8: one batch once 6 (3/4 of 8) wait
        start = trio.current_time()
        async with trio.open_nursery() as callers:
            for i in range(6):
                callers.start_soon(caller, f"b{i}", 0.001 * (i + 1), start)
        # 3 callers after a batch of 6 (4 wanted): sent when 5 ms (half of 10) are up
        start = trio.current_time()
        async with trio.open_nursery() as callers:
            for i in range(3):
                callers.start_soon(caller, f"c{i}", 0.001 * (i + 1), start)
        # one caller at a time: the first waits out the 5 ms (after a batch of 3 it
        # wants 2), then every call costs the append alone
        for i in range(4):
            start = trio.current_time()
            await caller(f"d{i}", 0.0, start)
        await journal.aclose()
        nursery.cancel_scope.cancel()
    assert [n for _, n in appends] == [8, 6, 3, 1, 1, 1, 1], appends
    assert all(returned[f"b{i}"] == pytest.approx(0.016) for i in range(6)), returned
    assert all(returned[f"c{i}"] == pytest.approx(0.016) for i in range(3)), returned
    assert returned["d0"] == pytest.approx(0.015), returned
    assert [returned[f"d{i}"] for i in (1, 2, 3)] == [pytest.approx(0.010)] * 3, returned
    assert [r.txid for r in applied.records] == list(range(1, 22))


# ------------------------------------------------------------------------------ recent records
async def test_recent_decodes_only_the_records_asked_for(tmp_path, monkeypatch):
    """The retry cache's look back at start: of 3 segments (2000 + 3000 records + the
    recovered in-progress tail of 500) ``recent`` decodes only the newest ``limit`` records,
    stepping over the older ones by their headers (a flipped byte in a skipped record's body
    does not matter); a record it cannot read ends the look back, keeping the newer ones."""
    journal = Journal(str(tmp_path), Applied(), keep_segments=0)
    journal.open()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for count in (2000, 3000, 500):
            for start in range(0, count, 500):
                await journal.log_many(mkdir_ops(start, 500))
            if count != 500:
                await journal.roll()
        nursery.cancel_scope.cancel()
    middle = tmp_path / finalized_name(2001, 5000)
    data = bytearray(middle.read_bytes())
    data[RECORD_HEADER.size + 5] ^= 0xFF     # inside the body of txid 2001's record
    middle.write_bytes(bytes(data))

    import meta.journal.files as journal_files
    decoded = []
    real_decode = journal_files._decode_body

    def counting(body):
        decoded.append(1)
        return real_decode(body)

    journal = reopen(tmp_path, 5500, keep_segments=0)   # the store has applied them all
    monkeypatch.setattr(journal_files, "_decode_body", counting)
    for limit, first in ((300, 5201), (500, 5001), (1200, 4301), (3000, 2501)):
        decoded.clear()
        records = list(journal.recent(0, limit))
        # newest segment first, each in txid order
        assert [r.txid for r in records] == [t for lo, hi in ((5001, 5500), (2001, 5000),
                                                               (1, 2000))
                                              for t in range(max(lo, first), hi + 1)], limit
        assert len(decoded) == limit
    # reaching the damaged record: the look back stops there, the newest records are kept
    assert [r.txid for r in journal.recent(0, 5500)] == list(range(5001, 5501))


async def test_start_steps_over_the_applied_records_of_the_inprogress_segment(tmp_path,
                                                                            monkeypatch):
    """After a crash the in-progress segment holds 1..200 and the store applied 150: the
    start decodes only what it replays (a flipped byte in an applied record's body is not
    even seen; the offline check still reports it), and a damaged header among the applied
    records (the step-over would land wrong) makes it verify everything: corruption, and
    nothing cut."""
    await session(tmp_path, mkdir_ops(0, 200))
    inprog = tmp_path / inprogress_name(1)
    clean = inprog.read_bytes()
    fifth = sum(len(encode_record(i + 1, *op)) for i, op in enumerate(mkdir_ops(0, 4)))
    data = bytearray(clean)
    data[fifth + 12] ^= 0xFF                     # inside txid 5's body
    inprog.write_bytes(bytes(data))

    import meta.journal.files as journal_files
    decoded = []
    real_decode = journal_files._decode_body
    monkeypatch.setattr(journal_files, "_decode_body",
                        lambda body: decoded.append(1) or real_decode(body))
    text = "\n".join(check_journal(str(tmp_path), store_applied=150))
    assert "WARNING" in text and "offset" in text and "txids 1..150" in text, text
    decoded.clear()
    journal = reopen(tmp_path, store_applied=150)
    assert journal.last_txid == 200
    assert [r.txid for r in journal.replay(150)] == list(range(151, 201))
    assert len(decoded) <= 2 * 50 + 1            # the verify, then the replay, of 151..200
    await journal.aclose()

    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    await session(tmp_path, mkdir_ops(0, 200))
    data = bytearray(inprog.read_bytes())
    data[fifth:fifth + 4] = (1 << 20).to_bytes(4, "big")   # txid 5's length, far too long
    inprog.write_bytes(bytes(data))
    before = file_listing(tmp_path)
    with pytest.raises(JournalError, match="corruption in the middle"):
        reopen(tmp_path, store_applied=150)
    assert file_listing(tmp_path) == before
