"""Leases, lease recovery, append and truncate end to end: the HDFS lease
scenarios a user relies on (takeover after the soft limit, recovery after the hard limit).

A real in-process cluster (metadata server on LevelDB, three block servers, real sockets and
replica files) with short limits: soft 1 s, hard 3 s, monitor every 0.2 s. A writer that
"stops renewing" is a real client whose renew period is an hour (``lease_renew_period``), so
its lease ages exactly like a crashed client's while its pipeline stays up.

The CLI commands (``recover-lease``, ``leases``, ``truncate``, ``append``) run through
``tools.cli.main`` on a worker thread, against the same in-process cluster.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys

import pytest
import trio

from fs import errors
from fs.client import AsyncClient
from fs.rpc import current_user
from harness import inprocess_cluster, recover_until_closed, wait_until

KiB = 1 << 10
BPC = 512
PACKET = 4 * KiB
BLOCK = 64 * KiB
LIMITS = dict(block_size=BLOCK, bytes_per_checksum=BPC, packet_size=PACKET,
              write_window_packets=4, lease_soft_limit=1.0, lease_hard_limit=3.0,
              lease_monitor_period=0.2, block_recovery_retry=2.0)

pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster(**LIMITS)]


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 7_919 + n).randbytes(n)


def silent_client(cluster, **kwargs) -> AsyncClient:
    """A client that never renews on its own: its lease ages like a dead client's."""
    return AsyncClient(cluster.meta_address,
                       config=cluster.config.replace(lease_renew_period=3600.0), **kwargs)


async def wait_closed(client, path: str, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not await client.is_file_closed(path):
            await trio.sleep(0.1)


def replica_bytes(cluster, block_id: int) -> list[bytes]:
    """The data file of every replica of ``block_id`` on every block server."""
    out = []
    for folder in cluster.storage_dirs:
        out += [p.read_bytes() for p in folder.rglob(f"blk_{block_id}") if p.is_file()]
    return out


async def last_block(client, path: str) -> dict:
    locs = await client.get_block_locations(path)
    return locs["blocks"][-1]


async def assert_replicas_hold(cluster, client, path: str, data: bytes) -> None:
    """The file reads back as ``data`` and every replica of its last block holds its tail."""
    assert await client.read_file(path) == data
    lb = await last_block(client, path)
    tail = data[lb["offset"]:]
    with trio.fail_after(10):
        while True:
            copies = replica_bytes(cluster, lb["block"]["id"])
            if len(copies) >= len(lb["locations"]) and all(c == tail for c in copies):
                break
            await trio.sleep(0.1)
    assert len(copies) >= 1


async def run_cli(*argv: str) -> tuple[int, str, str]:
    """``leasefs ARGV`` in this process on a worker thread: (status, stdout, stderr)."""
    from tools.cli import main

    def call():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
        return status, out.getvalue(), err.getvalue()
    return await trio.to_thread.run_sync(call)


# --------------------------------------------------------------------------- (1) overwrite


async def test_1_create_conflict_names_holder_and_overwrite_takes_the_file(cluster):
    async with cluster.client() as a, cluster.client() as b:
        out = await a.create("/f")
        await out.write(b"A" * 3000)
        await out.hflush()
        with pytest.raises(errors.AlreadyBeingCreated) as info:
            await b.create("/f")
        assert a.client_name in str(info.value) and "/f" in str(info.value)
        await b.write_file("/f", b"B" * 1234, overwrite=True)
        with pytest.raises(errors.FileNotFound):
            await out.close()
        assert await b.read_file("/f") == b"B" * 1234
        assert a.open_output_streams == []
        st = await b.get_file_status("/f")
        assert not st.under_construction and st.length == 1234


async def test_writer_whose_replicas_are_deleted_gets_the_error_and_servers_only_warn(tmp_path,
                                                                                      monkeypatch):
    """The metadata server's INVALIDATE deletes replicas under a live pipeline (another client
    deleted or overwrote the file): the writer's next packet, and a last packet whose replica
    goes just before it is finalized, are refused with a warning on the block servers, not an
    ERROR (the conftest fails a test on one); the writer's close fails with the file's error."""
    from storage.replicas import ReplicaStore

    finalize = ReplicaStore.finalize
    raced = []

    async def finalize_after_invalidate(store, replica):
        # the INVALIDATE lands between the last packet's write and its finalize
        if replica.block_id == 2 and await store.invalidate(replica.block_id, replica.gs):
            raced.append(replica.name)
        await finalize(store, replica)

    monkeypatch.setattr(ReplicaStore, "finalize", finalize_after_invalidate)

    async with inprocess_cluster(tmp_path, **LIMITS) as cluster:
        async with cluster.client() as a, cluster.client() as b:
            out = await a.create("/gone")
            await out.write(b"A" * 3000)
            await out.hflush()
            assert await b.delete("/gone")
            with trio.fail_after(20):
                while any(p for d in cluster.storage_dirs for p in d.rglob("blk_*")):
                    await trio.sleep(0.05)
            await out.write(b"B" * 3000)
            with pytest.raises(errors.FileNotFound):
                await out.close()
            assert a.open_output_streams == []

            out = await a.create("/raced")
            await out.write(b"C" * 3000)
            # a pipeline (a block held whole at close would go in one shot, which
            # creates and finalizes its replica in one step: nothing to race with)
            await out.hflush()
            with pytest.raises(errors.LeaseFSError) as info:
                await out.close()
            assert "/raced" in str(info.value)
            assert raced


# --------------------------------------------------------------------------- (2) soft limit


async def test_2_soft_expired_lease_is_recovered_by_the_next_creator(cluster):
    async with silent_client(cluster) as a, cluster.client() as b:
        data = payload(BLOCK + 5000, seed=2)
        out = await a.create("/soft")
        await out.write(data)
        await out.hflush()
        await out.write(b"never flushed")  # stays in A's buffer
        # the soft limit counts from A's last renewal: writing the first block may take
        # longer than it on a loaded machine
        await a._renew_lease()
        with pytest.raises(errors.AlreadyBeingCreated) as info:
            await b.create("/soft")
        assert a.client_name in str(info.value)
        seen = []   # b asks until the soft limit passes and the server recovers the file
        with trio.fail_after(20):
            while True:
                try:
                    await b.create("/soft")
                except (errors.AlreadyBeingCreated, errors.RecoveryInProgress) as exc:
                    seen.append(type(exc))
                    await trio.sleep(0.2)
                    continue
                except errors.FileExists:
                    break
                raise AssertionError("create of a file that exists succeeded")
        while seen and seen[0] is errors.AlreadyBeingCreated:   # within the soft limit
            seen.pop(0)
        assert seen and seen[0] is errors.RecoveryInProgress
        st = await b.get_file_status("/soft")
        assert not st.under_construction and st.length == len(data)
        await assert_replicas_hold(cluster, b, "/soft", data)
        with pytest.raises(errors.LeaseFSError):
            await out.close()


# --------------------------------------------------------------------------- (3) hard limit


async def test_3_hard_expired_lease_is_recovered_by_the_server(cluster):
    async with silent_client(cluster) as a, cluster.client() as b:
        data = payload(7000, seed=3)
        out = await a.create("/hard")
        await out.write(data)
        await out.hflush()
        start = trio.current_time()
        await wait_closed(b, "/hard", timeout=30)
        assert trio.current_time() - start >= LIMITS["lease_hard_limit"] - 0.5
        st = await b.get_file_status("/hard")
        assert st.length == len(data)
        await assert_replicas_hold(cluster, b, "/hard", data)
        with pytest.raises(errors.LeaseFSError):
            await out.write(b"more")
            await out.hflush()
            await out.close()
        assert await b.read_file("/hard") == data


# --------------------------------------------------------------------------- (4) recoverLease


async def test_4_recover_lease_on_a_live_writer(cluster):
    async with cluster.client() as a, cluster.client() as b:
        data = payload(BLOCK // 2 + 77, seed=4)
        out = await a.create("/live")
        await out.write(data)
        await out.hflush()
        answers = await recover_until_closed(b, "/live")
        assert answers[0] is False and answers[-1] is True
        assert await b.recover_lease("/live") is True     # closed: True at once
        st = await b.get_file_status("/live")
        assert not st.under_construction and st.length == len(data)
        await assert_replicas_hold(cluster, b, "/live", data)
        with pytest.raises(errors.LeaseFSError):
            await out.write(b"late")
            await out.hflush()
            await out.close()
        assert await b.read_file("/live") == data


async def test_4_recover_lease_keeps_hflushed_bytes_whose_reports_are_late(tmp_path, monkeypatch):
    """hflushed bytes are acknowledged by every pipeline node, but the nodes' reports of the
    replica may still be on the way (never sent here): recover_lease must ask the pipeline's
    nodes (block recovery) instead of dropping a block it thinks empty. A block allocated
    by a writer that died before its first packet is dropped that way too: every node
    answers it has no replica."""
    from storage.heartbeat import HeartbeatService

    block_received = HeartbeatService.block_received

    def late_receiving_reports(service, block_id, gs, num_bytes, state):
        if state == "RBW":
            return None   # the "receiving" report has not arrived yet
        return block_received(service, block_id, gs, num_bytes, state)

    monkeypatch.setattr(HeartbeatService, "block_received", late_receiving_reports)

    async with inprocess_cluster(tmp_path, **LIMITS) as cluster:
        async with cluster.client() as a, cluster.client() as b:
            data = payload(3000, seed=44)
            out = await a.create("/late")
            await out.write(data)
            await out.hflush()
            answers = await recover_until_closed(b, "/late")
            assert answers[0] is False
            assert await b.read_file("/late") == data

            st = await a.create("/never")
            await a.rpc.call("add_block", {"path": "/never", "client_name": a.client_name,
                                           "ino": st.ino, "previous": None})
            answers = await recover_until_closed(b, "/never")
            assert answers[0] is False and answers[-1] is True
            status = await b.get_file_status("/never")
            assert not status.under_construction and status.length == 0
            assert (await b.get_block_locations("/never"))["blocks"] == []


async def test_complete_waits_on_the_server_for_the_first_replica_report(tmp_path, monkeypatch):
    """The block servers ack the LAST packet before their reports reach the metadata
    server (delayed 0.3 s here): the writer's one ``complete`` call waits for the first
    report on the server and succeeds, no client-side retry; a report that does not come
    within the server's wait gets False (and the client's backoff)."""
    from meta.protocols.client import COMPLETE_REPORT_WAIT
    from storage.heartbeat import HeartbeatService

    block_received = HeartbeatService.block_received
    delay = {"FINALIZED": 0.3}

    def late_finalized_reports(service, block_id, gs, num_bytes, state):
        if state in delay:
            async def later():
                # fixed-sleep: the simulated lateness of the block server's report
                await trio.sleep(delay[state])
                block_received(service, block_id, gs, num_bytes, state)
            service._nursery.start_soon(later)
            return None
        return block_received(service, block_id, gs, num_bytes, state)

    monkeypatch.setattr(HeartbeatService, "block_received", late_finalized_reports)

    async with inprocess_cluster(tmp_path, **LIMITS, inline_max=0) as cluster:
        async with cluster.client() as a:
            calls = []
            call = a.rpc.call

            async def counting(method, args, **kw):
                result = await call(method, args, **kw)
                if method == "complete":
                    calls.append(result)
                return result

            a.rpc.call = counting
            out = await a.create("/waited")
            await out.write(b"w" * 3000)
            await out.close()
            assert calls == [True]
            assert (await a.get_file_status("/waited")).length == 3000

            delay["FINALIZED"] = COMPLETE_REPORT_WAIT + 0.3
            calls.clear()
            out = await a.create("/retried")
            await out.write(b"r" * 3000)
            await out.close()
            assert calls[0] is False and calls[-1] is True


async def test_4_recover_lease_cli_and_holder_itself(cluster):
    meta = ["--meta", cluster.meta_address]
    async with cluster.client() as a:
        out = await a.create("/cli-open")
        await out.write(b"z" * 1500)
        await out.hflush()
        status, stdout, stderr = await run_cli("recover-lease", "/cli-open",
                                               "--retries", "30", "--interval", "0.3",
                                               *meta)
        assert status == 0, stderr
        assert stdout.strip() == "recover-lease succeeded on /cli-open"
        assert (await a.get_file_status("/cli-open")).length == 1500
        # the holder itself may recover its own file
        own = await a.create("/own")
        await own.write(b"q" * 600)
        await own.hflush()
        await recover_until_closed(a, "/own")
        assert await a.read_file("/own") == b"q" * 600
        # a closed file: True at once; a missing one: one-line error, exit 1
        status, stdout, _ = await run_cli("recover-lease", "/own", *meta)
        assert status == 0 and "succeeded on /own" in stdout
        status, _, stderr = await run_cli("recover-lease", "/nope", *meta)
        assert status == 1 and stderr.startswith("leasefs recover-lease: /nope: ")


# --------------------------------------------------------------------------- (5) rename


async def test_5_rename_of_open_file_and_parent_keeps_one_lease(cluster):
    meta = ["--meta", cluster.meta_address]
    async with cluster.client() as a, cluster.client() as b:
        data = payload(BLOCK + 999, seed=5)
        out = await a.create("/d/f")
        await out.write(data[:3000])
        await out.hflush()
        await b.rename("/d/f", "/d/g")
        await b.rename("/d", "/e")
        [entry] = await b.list_open_files("/")
        assert entry["path"] == "/e/g" and entry["holder"] == a.client_name
        status, stdout, _ = await run_cli("leases", *meta)
        assert status == 0 and "/e/g" in stdout and a.client_name in stdout
        # fixed-sleep: real time past the soft limit, in which renewals must keep the
        # lease: the server's clock is real (an in-process cluster does real I/O)
        await trio.sleep(LIMITS["lease_soft_limit"] * 2)
        with pytest.raises(errors.AlreadyBeingCreated):
            await b.create("/e/g")
        await out.write(data[3000:])
        await out.close()
        assert await b.read_file("/e/g") == data
        assert await b.list_open_files("/") == []
        status, stdout, _ = await run_cli("leases", *meta)
        assert status == 0 and "no files open" in stdout


# --------------------------------------------------------------------------- (6) restarts


async def test_6_writers_survive_two_metadata_server_restarts(tmp_path):
    # the restarted server starts its leases' clocks when it loads them, before it listens:
    # on a busy machine that gap passed LIMITS' 1 s soft limit, and b's create then began a
    # recovery of a live writer's file; nothing here waits for a lease to expire
    limits = {**LIMITS, "lease_soft_limit": 10.0, "lease_hard_limit": 30.0}

    async with inprocess_cluster(tmp_path, **limits) as cluster:
        async with cluster.client() as a, cluster.client() as b:
            one, two = payload(2 * BLOCK + 10, seed=61), payload(BLOCK + 4000, seed=62)
            s1, s2 = await a.create("/r/one"), await a.create("/r/two")
            await s1.write(one[:1000])
            await s2.write(two[:1000])
            await s1.hflush()
            await s2.hflush()
            for restart in range(2):
                await cluster.stop_meta()
                await cluster.start_meta()
                await cluster.wait_ready()
                if restart == 0:
                    await b.rename("/r/one", "/r/one-moved")
                # leases were rebuilt: another client is still refused
                with pytest.raises(errors.AlreadyBeingCreated):
                    await b.create("/r/two")
                lo = 1000 + restart * (BLOCK // 2)
                await s1.write(one[lo:lo + BLOCK // 2])
                await s2.write(two[lo:lo + BLOCK // 2])
                await s1.hflush()
                await s2.hflush()
            await s1.write(one[1000 + BLOCK:])
            await s2.write(two[1000 + BLOCK:])
            await s1.close()
            await s2.close()
            assert await b.read_file("/r/one-moved") == one
            assert await b.read_file("/r/two") == two


# --------------------------------------------------------------------------- (7) lengths


async def test_7_recovery_of_an_empty_last_block_drops_it(cluster):
    """All replicas empty: the block is dropped and the file closes with the earlier data."""
    async with cluster.client() as a, cluster.client() as b:
        data = payload(BLOCK, seed=71)
        out = await a.create("/empty-tail")
        await out.write(data)          # one full block, finished
        await out.write(b"x")          # opens the next block's pipeline, unsent
        assert out.blocks_written == 1
        out.abort(errors.PipelineError("/empty-tail: writer crashed (test)"))
        await recover_until_closed(b, "/empty-tail")
        st = await b.get_file_status("/empty-tail")
        assert st.length == BLOCK
        locs = await b.get_block_locations("/empty-tail")
        assert len(locs["blocks"]) == 1
        assert await b.read_file("/empty-tail") == data


async def test_7_recovery_of_finalized_replicas_keeps_their_length(cluster):
    """FIN+FIN+FIN (the block ended but the file was never completed): that length."""
    async with cluster.client() as a, cluster.client() as b:
        data = payload(BLOCK + BLOCK, seed=72)
        out = await a.create("/fin")
        await out.write(data)          # two full blocks: both finalized, no complete
        assert out.blocks_written == 2
        out.abort(errors.PipelineError("/fin: writer crashed (test)"))
        await recover_until_closed(b, "/fin")
        assert (await b.get_file_status("/fin")).length == len(data)
        await assert_replicas_hold(cluster, b, "/fin", data)


async def test_7_recovery_of_rbw_replicas_after_a_crash(cluster):
    """RBW+RBW+RBW of one length (hflushed, writer gone): that length on every replica."""
    async with cluster.client() as a, cluster.client() as b:
        data = payload(BLOCK + 3333, seed=73)
        out = await a.create("/rbw")
        await out.write(data)
        await out.hflush()
        out.abort(errors.PipelineError("/rbw: writer crashed (test)"))
        await recover_until_closed(b, "/rbw")
        assert (await b.get_file_status("/rbw")).length == len(data)
        await assert_replicas_hold(cluster, b, "/rbw", data)


# --------------------------------------------------------------------------- (8) truncate


async def test_8_truncate_on_a_boundary_and_mid_block(cluster):
    async with cluster.client() as a, cluster.client() as b:
        data = payload(2 * BLOCK + 5000, seed=8)
        await a.write_file("/t", data)
        assert await a.truncate("/t", len(data)) is True      # same length
        assert await a.truncate("/t", 2 * BLOCK) is True      # block boundary
        st = await a.get_file_status("/t")
        assert not st.under_construction and st.length == 2 * BLOCK
        assert await b.read_file("/t") == data[:2 * BLOCK]
        assert await a.truncate("/t", BLOCK + 1000) is False  # mid-block
        await wait_closed(b, "/t")
        assert (await b.get_file_status("/t")).length == BLOCK + 1000
        await assert_replicas_hold(cluster, b, "/t", data[:BLOCK + 1000])
        # errors: beyond EOF, a directory, a file open for writing
        with pytest.raises(errors.InvalidArgument):
            await a.truncate("/t", BLOCK + 1001)
        await a.mkdirs("/dir")
        with pytest.raises(errors.IsDirectory):
            await a.truncate("/dir", 0)
        with pytest.raises(errors.FileNotFound):
            await a.truncate("/missing", 0)
        out = await a.create("/open")
        await out.write(b"abc")
        await out.hflush()
        with pytest.raises(errors.AlreadyBeingCreated):
            await b.truncate("/open", 1)
        await out.close()
        assert await b.truncate("/open", 0) is True
        assert await b.read_file("/open") == b""


async def test_8_truncate_cli(cluster):
    meta = ["--meta", cluster.meta_address]
    async with cluster.client() as c:
        data = payload(BLOCK + 700, seed=81)
        await c.write_file("/cli-t", data)
        status, stdout, stderr = await run_cli("truncate", "-w", "300", "/cli-t", *meta)
        assert status == 0, stderr
        assert "Truncated /cli-t to length: 300" in stdout
        assert await c.read_file("/cli-t") == data[:300]
        status, _, stderr = await run_cli("truncate", "5000", "/cli-t", *meta)
        assert status == 1 and stderr.startswith("leasefs truncate: /cli-t: ")
        status, _, stderr = await run_cli("truncate", "-1", "/cli-t", *meta)
        assert status == 2


# --------------------------------------------------------------------------- (9) hflush


async def test_9_reader_sees_exactly_the_hflushed_bytes(cluster):
    async with cluster.client() as a, cluster.client() as b:
        source = payload(BLOCK + 2 * PACKET + 123, seed=9)
        expected = bytearray()
        out = await a.create("/visible")
        previous = 0
        for cut in (100, 513, PACKET * 3 + 1, BLOCK - 10, BLOCK + 1, len(source)):
            await out.write(source[previous:cut])
            await out.hflush()
            expected += source[previous:cut]
            previous = cut
            await out.write(b"#" * 10)       # written, not flushed: invisible
            async with await b.open("/visible") as s:
                assert s.length == len(expected)
                assert await s.read() == bytes(expected)
            expected += b"#" * 10            # the next hflush publishes it
        await out.close()
        assert await b.read_file("/visible") == bytes(expected)


# --------------------------------------------------------------------------- (10) renewer


@pytest.mark.allow_log_errors(r"lease of leasefs-client-\w+ lost: aborted 1 open file",
                                reason="the test makes the server refuse renewals past the hard limit")
async def test_10_renewals_refused_past_the_hard_limit_abort_the_writer(cluster):
    async with cluster.client() as a:
        await a.write_file("/before", b"kept")
        out = await a.create("/doomed")
        await out.write(b"d" * 2000)
        await out.hflush()
        await cluster.stop_meta()
        # the renewer fails past the hard limit and gives the file up
        assert await wait_until(lambda: not a._renewer.open_streams, timeout=30)
        await cluster.start_meta()
        await cluster.wait_ready()
        with pytest.raises(errors.LeaseExpired) as info:
            await out.write(b"more")
            await out.hflush()
        message = str(info.value)
        assert "/doomed" in message and "could not be renewed" in message
        assert a.open_output_streams == []
        assert await a.read_file("/before") == b"kept"
        await a.write_file("/after", b"new file")
        assert await a.read_file("/after") == b"new file"


# --------------------------------------------------------------------------- append


async def test_append_partial_full_and_empty_last_blocks(cluster):
    async with cluster.client() as a, cluster.client() as b:
        cases = {"/ap/partial": payload(BLOCK + 1000, seed=11),     # mid-chunk tail
                 "/ap/aligned": payload(BLOCK + 2 * BPC, seed=12),  # chunk-aligned
                 "/ap/full": payload(BLOCK, seed=13),               # full last block
                 "/ap/empty": b""}
        for path, data in cases.items():
            await a.write_file(path, data)
            extra = payload(BLOCK // 2 + 17, seed=len(path))
            out = await a.append(path)
            assert out.pos == len(data)
            with pytest.raises(errors.AlreadyBeingCreated):
                await b.append(path)
            await out.write(extra[:100])
            await out.hflush()
            assert await b.read_file(path) == data + extra[:100]
            await out.write(extra[100:])
            await out.close()
            assert await b.read_file(path) == data + extra
            await assert_replicas_hold(cluster, b, path, data + extra)
        # append twice more, and with nothing written
        out = await a.append("/ap/partial")
        await out.close()
        base = cases["/ap/partial"] + payload(BLOCK // 2 + 17, seed=len("/ap/partial"))
        assert await b.read_file("/ap/partial") == base
        with pytest.raises(errors.FileNotFound):
            await a.append("/ap/missing")
        with pytest.raises(errors.IsDirectory):
            await a.append("/ap")


async def test_append_cli_creates_then_appends(tmp_path, cluster):
    meta = ["--meta", cluster.meta_address]
    first, second = tmp_path / "one.txt", tmp_path / "two.txt"
    first.write_bytes(b"hello ")
    second.write_bytes(b"world\n")
    status, _, stderr = await run_cli("append", str(first), "/logs/app.log", *meta)
    assert status == 0, stderr
    status, _, stderr = await run_cli("append", str(second), str(first),
                                      "/logs/app.log", *meta)
    assert status == 0, stderr
    async with cluster.client() as c:
        assert await c.read_file("/logs/app.log") == b"hello world\nhello "
    status, _, stderr = await run_cli("append", str(tmp_path / "nope"),
                                      "/logs/app.log", *meta)
    assert status == 1 and "nope" in stderr
    async with cluster.client() as c:
        assert await c.read_file("/logs/app.log") == b"hello world\nhello "


async def test_leases_cli_lists_open_files_with_holder_machine_age_and_block_state(cluster):
    meta = ["--meta", cluster.meta_address]
    async with silent_client(cluster) as a:
        one = await a.create("/w/one")
        await one.write(b"1" * 700)
        await one.hflush()
        two = await a.create("/other/two")     # no block yet
        # fixed-sleep: the leases' age must grow measurably (asserted below); the
        # server's clock is real
        await trio.sleep(0.5)
        status, stdout, stderr = await run_cli("leases", *meta)
        assert status == 0, stderr
        lines = stdout.splitlines()
        assert lines[0].split()[:2] == ["PATH", "HOLDER"]
        rows = {line.split()[0]: line.split() for line in lines[2:]}
        assert set(rows) == {"/w/one", "/other/two"}
        path, holder, machine, age, state = rows["/w/one"]
        # the client came over the local socket: the kernel named its process
        assert holder == a.client_name
        assert machine == f"local:{current_user()}:{os.getpid()}"
        assert 0.4 <= float(age) < 5.0
        assert state == "UNDER_CONSTRUCTION"
        assert rows["/other/two"][4] == "-"
        status, stdout, _ = await run_cli("leases", "/w", "--json", *meta)
        [entry] = json.loads(stdout)
        assert entry["path"] == "/w/one" and entry["holder"] == a.client_name
        await one.close()
        await two.close()
        status, stdout, _ = await run_cli("leases", "/w", *meta)
        assert status == 0 and stdout.strip() == "no files open for writing below /w"


async def test_append_cli_reads_stdin(cluster, monkeypatch):
    meta = ["--meta", cluster.meta_address]
    async with cluster.client() as c:
        await c.write_file("/stdin.log", b"x" * 1000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin\n")))
    status, _, stderr = await run_cli("append", "-", "/stdin.log", *meta)
    assert status == 0, stderr
    async with cluster.client() as c:
        assert await c.read_file("/stdin.log") == b"x" * 1000 + b"from stdin\n"
    status, _, stderr = await run_cli("append", "-", "-", "/stdin.log", *meta)
    assert status == 2
