"""The edit journal with real metadata server processes: kill -9 under load and a journal
that lost its tail, a full metadata disk, checkpoints counted across restarts and
save-namespace. Real processes, real LevelDB, real journal files."""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager

import msgpack
import pytest
import trio

from fs import errors
from fs.client import AsyncClient
from harness import ProcessCluster, leasefs, make_test_config, poll_until, store_problems
from meta.schema import keys
from meta.journal.files import RECORD_HEADER
from meta.journal.kv import PlyvelStore
from tools.formatting import human_size

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def journal_dir(cluster: ProcessCluster):
    return cluster.meta_dir() / "journal"


def inprogress_segment(cluster: ProcessCluster):
    names = [n for n in os.listdir(journal_dir(cluster)) if n.startswith("edits_inprogress_")]
    assert len(names) == 1, names
    return journal_dir(cluster) / names[0]


def store_applied(cluster: ProcessCluster) -> int:
    store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
    try:
        return int(keys.read_counter(store, keys.APPLIED_TXID))
    finally:
        store.close()


def cut_inside_record(segment, txid: int) -> None:
    """Truncate ``segment`` a few bytes before the end of record ``txid`` (a lost tail)."""
    data = segment.read_bytes()
    pos = 0
    while pos < len(data):
        length, _crc = RECORD_HEADER.unpack_from(data, pos)
        end = pos + RECORD_HEADER.size + length
        if msgpack.unpackb(data[pos + RECORD_HEADER.size:end])[0] == txid:
            with open(segment, "r+b") as fh:
                fh.truncate(end - 5)
            return
        pos = end
    raise AssertionError(f"record {txid} not in {segment}")


async def mkdir_load(address: str, workers: int, on_ack, stop: trio.Event) -> None:
    """``workers`` clients making directories until ``stop``; ``on_ack(path)`` per success."""
    async def worker(k: int):
        async with AsyncClient(address, config=make_test_config()) as client:
            i = 0
            while not stop.is_set():
                path = f"/load/w{k}/d{i}"
                await client.mkdirs(path)
                on_ack(path)
                i += 1

    async with trio.open_nursery() as nursery:
        for k in range(workers):
            nursery.start_soon(worker, k)
        await stop.wait()
        nursery.cancel_scope.cancel()


async def all_exist(address: str, wanted) -> list[str]:
    async with AsyncClient(address, config=make_test_config()) as client:
        return [p for p in wanted if not await client.exists(p)]


# ------------------------------------------------------------------------------ lost tail
def test_kill9_then_lost_journal_tail_starts_from_the_store_and_check_agrees(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=0)
    cluster.start()
    acked: list[str] = []
    try:
        async def load_then_kill():
            stop = trio.Event()

            def ack(path):
                acked.append(path)
                if len(acked) == 300:
                    cluster.kill_meta()      # kill -9 while the other workers are mid-call
                    stop.set()
            with trio.fail_after(120):
                await mkdir_load(cluster.meta_address, 4, ack, stop)

        trio.run(load_then_kill)
        # the disk lost the journal's last few bytes, down into the last record the store
        # applied (its write was fsynced before it was applied)
        applied = store_applied(cluster)
        cut_inside_record(inprogress_segment(cluster), applied)

        # the offline check (store present) says what the start will do
        before = leasefs(cluster, "meta", "--check-journal", str(cluster.meta_dir()))
        assert before.returncode == 0, before.stderr
        found = re.search(r"txids (\d+)\.\.(\d+) are not in the journal", before.stdout)
        assert found, before.stdout
        lost = (int(found.group(1)), int(found.group(2)))
        assert lost == (applied, applied)

        cluster.start_meta()
        cluster.wait_ready(0)
        log_text = (tmp_path / "logs" / "meta.log").read_text()
        assert re.search(rf"WARNING .*txids {lost[0]}\.\.{lost[1]} .*not in the journal",
                         log_text), log_text[-3000:]
        assert trio.run(all_exist, cluster.meta_address, acked) == []
        cluster.kill_meta(sig=15)
        assert store_problems(cluster) == []

        # a second start needs no recovery and the check agrees with it
        cluster.start_meta()
        cluster.wait_ready(0)
        assert trio.run(all_exist, cluster.meta_address, acked[:20]) == []
        cluster.kill_meta(sig=15)
        after = leasefs(cluster, "meta", "--check-journal", str(cluster.meta_dir()))
        assert after.returncode == 0, after.stderr
        assert f"txids {lost[0]}..{lost[1]}: lost from the journal" in after.stdout, after.stdout
        assert "OK" in after.stdout
    finally:
        cluster.stop()


# ------------------------------------------------------------------------------ full disk
@contextmanager
def small_tmpfs(path, size: str):
    """A tmpfs of ``size`` mounted on ``path`` in a data folder (a real ENOSPC once it is
    full)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)   # a server's: its user's
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(path)], check=True)
    try:
        yield lambda new_size: subprocess.run(
            ["mount", "-o", f"remount,size={new_size}", str(path)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


class Outcomes:
    """What each mkdir's caller was told: ``ok``, an error reply, or nothing certain."""

    def __init__(self):
        self.ok: list[str] = []
        self.refused: dict[str, str] = {}     # the server answered with an error
        self.unknown: list[str] = []          # the connection was lost: either outcome

    async def load(self, address: str, workers: int, enough, tag: str = "full") -> None:
        """``workers`` clients making directories (long names) until ``enough(self)``."""
        done = trio.Event()

        async def worker(k: int):
            config = make_test_config(rpc_retry_seconds=2.0)
            async with AsyncClient(address, config=config) as client:
                i = 0
                while not done.is_set():
                    path = f"/{tag}/w{k}/{'x' * 150}{i}"
                    i += 1
                    try:
                        await client.mkdirs(path)
                        self.ok.append(path)
                    except errors.ServerUnavailable:
                        self.unknown.append(path)
                    except errors.LeaseFSError as exc:
                        self.refused[path] = f"{type(exc).__name__}: {exc}"
                    if enough(self):
                        done.set()

        with trio.fail_after(150):
            async with trio.open_nursery() as nursery:
                for k in range(workers):
                    nursery.start_soon(worker, k)

    def check_after_restart(self, address: str) -> None:
        async def check():
            async with AsyncClient(address, config=make_test_config()) as client:
                lost = [p for p in self.ok if not await client.exists(p)]
                kept = [p for p in self.refused if await client.exists(p)]
            return lost, kept
        lost, kept = trio.run(check)
        assert lost == [], f"acknowledged but gone after the restart: {lost[:5]}"
        assert kept == [], f"answered with an error but present after the restart: " \
                           f"{[(p, self.refused[p]) for p in kept[:3]]}"


def restart_and_check(cluster: ProcessCluster, out: Outcomes) -> None:
    """Start the stopped metadata server; every success is there, every error reply is
    not, and the store is consistent."""
    cluster.start_meta()
    cluster.wait_ready(0)
    out.check_after_restart(cluster.meta_address)
    cluster.kill_meta(sig=15)
    assert store_problems(cluster) == []


@pytest.mark.allow_log_errors(r"journal write failed", reason="the journal's disk is full")
def test_full_journal_disk_fails_only_undurable_calls_and_recovers_when_space_returns(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=0)
    with small_tmpfs(journal_dir(cluster), "192k") as resize:
        cluster.start()
        try:
            out = Outcomes()
            trio.run(out.load, cluster.meta_address, 6, lambda o: len(o.refused) >= 30)
            assert out.ok and not out.unknown
            assert all("NoSpace" in why and "did not happen" in why
                       for why in out.refused.values()), list(out.refused.values())[:3]

            resize("64m")             # space is back: the running server writes again
            ok, refused = len(out.ok), len(out.refused)
            trio.run(out.load, cluster.meta_address, 1,
                     lambda o: len(o.ok) + len(o.refused) > ok + refused, "again")
            assert len(out.ok) == ok + 1 and out.ok[-1].startswith("/again/"), \
                list(out.refused.values())[-1:]
            cluster.kill_meta(sig=15)
            restart_and_check(cluster, out)
        finally:
            cluster.stop()


@pytest.mark.allow_log_errors(r"applying txids", r"the metadata server stops",
                              r"metadata server failed", r"No space|IO error|Traceback",
                              reason="the store's disk is full: the server stops")
def test_full_store_disk_stops_the_server_without_error_replies(tmp_path):
    cluster = ProcessCluster(tmp_path, n_storage=0)
    with small_tmpfs(cluster.meta_dir() / "db", "512k") as resize:
        cluster.start()
        try:
            out = Outcomes()
            trio.run(out.load, cluster.meta_address, 6, lambda o: bool(o.unknown or o.refused))
            # the store write failed after the journal made the batch durable: the server
            # stopped (fail-stop) and answered nobody of that batch with an error
            assert cluster.procs["meta"].wait(30) == 1
            assert out.refused == {}, list(out.refused.items())[:3]
            assert "the metadata server stops" in cluster.log_tail("meta", 200)
            # the offline check and a start agree, and say what to free where
            db = cluster.meta_dir() / "db"
            check = leasefs(cluster, "meta", "--check-journal", str(cluster.meta_dir()))
            start = leasefs(cluster, "meta", "--data", str(cluster.meta_dir()), "--port", "0",
                            "--http-port", "0")
            assert check.returncode == 1 and start.returncode == 1, (check, start)
            why = re.search(r"cannot start: not enough free space on the file system of "
                            rf"{re.escape(str(db))}: 0\.\d MiB free, a start needs about "
                            r"\d+\.\d MiB \(LevelDB rewrites .*\); free at least \d+\.\d MiB "
                            r"there", check.stderr)
            assert why, check.stderr
            assert why.group(0) in start.stderr and "Traceback" not in start.stderr, start.stderr
            resize("64m")
            restart_and_check(cluster, out)
        finally:
            cluster.stop()


# ------------------------------------------------------------------------------ checkpoints
def make_dirs(cluster: ProcessCluster, prefix: str, n: int) -> None:
    with cluster.client() as client:
        for i in range(n):
            client.mkdirs(f"/{prefix}/d{i}")


def report(cluster: ProcessCluster) -> dict:
    with cluster.client() as client:
        return client.report()


def restart_meta(cluster: ProcessCluster) -> None:
    cluster.kill_meta(sig=15)
    cluster.start_meta()
    cluster.wait_ready(0)


def journal_bytes(cluster: ProcessCluster) -> int:
    return sum(os.path.getsize(journal_dir(cluster) / name)
               for name in os.listdir(journal_dir(cluster)))


def wait_checkpoint(cluster: ProcessCluster, after_txid: int, timeout: float = 30.0) -> dict:
    """The report's checkpoint once one newer than ``after_txid`` was taken."""
    async def run():
        async with AsyncClient(cluster.meta_address, config=make_test_config()) as client:
            with trio.fail_after(timeout):
                while True:
                    checkpoint = (await client.report())["checkpoint"]
                    if checkpoint["txid"] > after_txid:
                        return checkpoint
                    await trio.sleep(0.1)
    return trio.run(run)


@pytest.mark.cluster(n_storage=0, settings={"checkpoint_txns": 100, "checkpoint_period": 3600})
def test_checkpoint_trigger_counts_transactions_across_restarts(process_cluster):
    make_dirs(process_cluster, "a", 60)                  # FORMAT + 60: under the 100
    restart_meta(process_cluster)
    now = report(process_cluster)
    assert now["checkpoint"] == {"txid": 0, "time_ns": 0,
                                 "txns_since": now["journal"]["last_txid"],
                                 "journal_bytes_since": journal_bytes(process_cluster)}
    make_dirs(process_cluster, "b", 60)                  # 121 since the start of time: due
    first = wait_checkpoint(process_cluster, 0)
    assert first["txid"] >= 100 and first["time_ns"] > 0

    restart_meta(process_cluster)                        # the checkpoint is remembered
    remembered = report(process_cluster)["checkpoint"]
    assert (remembered["txid"], remembered["time_ns"]) == (first["txid"], first["time_ns"])
    make_dirs(process_cluster, "c", 50)
    restart_meta(process_cluster)
    make_dirs(process_cluster, "d", 55)                  # 105 since the first checkpoint
    second = wait_checkpoint(process_cluster, first["txid"])
    assert second["txid"] - first["txid"] >= 100


@pytest.mark.cluster(n_storage=0, settings={"journal_keep_segments": 1})
def test_save_namespace_needs_safe_mode_purges_old_segments_and_shows_in_report(process_cluster):
    make_dirs(process_cluster, "a", 20)
    refused = leasefs(process_cluster, "save-namespace")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "leasefs save-namespace: save namespace: safe mode must be ON to save the "
        "namespace (leasefs safemode enter), as HDFS requires"]
    assert "Last checkpoint: never" in leasefs(process_cluster, "report").stdout

    for prefix in ("b", "c", "d"):
        make_dirs(process_cluster, prefix, 10)
        assert leasefs(process_cluster, "safemode", "enter").returncode == 0
        saved = leasefs(process_cluster, "save-namespace")
        assert saved.returncode == 0, saved.stderr
        assert leasefs(process_cluster, "safemode", "leave").returncode == 0
    txid = report(process_cluster)["journal"]["last_txid"]
    assert f"Save namespace successful: checkpoint txid {txid} at " in saved.stdout
    assert "purged 1 journal segment(s)" in saved.stdout
    assert f"Last checkpoint: txid {txid} at " in leasefs(process_cluster, "report").stdout

    # only the newest finalized segment is left; a start opens and replays just that
    segments = sorted(os.listdir(journal_dir(process_cluster)))
    first_kept = int(segments[0].split("_")[1].split("-")[0])
    assert len(segments) == 2 and segments[1].startswith("edits_inprogress_"), segments
    assert first_kept > 1
    make_dirs(process_cluster, "e", 5)
    process_cluster.kill_meta()                          # kill -9: the tail is in the journal only
    process_cluster.start_meta()
    process_cluster.wait_ready(0)
    log_text = process_cluster.log_tail("meta", 400)
    # the kept segment and the recovered in-progress one: nothing older is read
    assert f"opened: 2 finalized segments, last txid {txid + 5}" in log_text, log_text
    assert trio.run(all_exist, process_cluster.meta_address, ["/e/d4", "/a/d0"]) == []
    check = leasefs(process_cluster, "meta", "--check-journal", str(journal_dir(process_cluster)))
    assert check.returncode == 0 and f"txids {first_kept}.." in check.stdout, check.stdout


@pytest.mark.cluster(n_storage=0)
def test_one_save_namespace_leaves_only_what_follows_it_and_report_shows_the_size(process_cluster):
    """Default settings: after writes (and a kill -9 restart that finalized a segment), one
    save-namespace leaves the journal folder holding only the new, empty in-progress segment;
    the report then counts the journal written since, as on disk."""
    make_dirs(process_cluster, "a", 30)
    process_cluster.kill_meta()
    process_cluster.start_meta()
    process_cluster.wait_ready(0)
    make_dirs(process_cluster, "b", 30)
    assert len(os.listdir(journal_dir(process_cluster))) == 2      # finalized + in progress
    assert leasefs(process_cluster, "safemode", "enter").returncode == 0
    saved = leasefs(process_cluster, "save-namespace")
    assert saved.returncode == 0, saved.stderr
    assert "purged 2 journal segment(s)" in saved.stdout, saved.stdout
    assert leasefs(process_cluster, "safemode", "leave").returncode == 0
    txid = report(process_cluster)["journal"]["last_txid"]
    assert os.listdir(journal_dir(process_cluster)) == [f"edits_inprogress_{txid + 1:019d}"]
    assert journal_bytes(process_cluster) == 0
    assert report(process_cluster)["checkpoint"]["journal_bytes_since"] == 0

    make_dirs(process_cluster, "c", 10)
    on_disk = journal_bytes(process_cluster)
    assert on_disk > 0
    assert report(process_cluster)["checkpoint"]["journal_bytes_since"] == on_disk
    text = leasefs(process_cluster, "report").stdout
    size = human_size(on_disk)
    size += "B" if size[-1].isalpha() else " B"
    assert re.search(rf"Last checkpoint: txid {txid} at .* \(10 transactions, {size} "
                     rf"of journal since\)", text), text


@pytest.mark.cluster(n_storage=0, settings={"checkpoint_journal_bytes": 8192,
                                            "checkpoint_txns": 1_000_000,
                                            "checkpoint_period": 3600})
def test_journal_bytes_since_the_last_checkpoint_trigger_one(process_cluster):
    """With a low journal-size threshold (and the transaction and time thresholds far off),
    writes alone trigger checkpoints, each leaving only what follows it."""
    make_dirs(process_cluster, "a", 20)
    assert report(process_cluster)["checkpoint"]["time_ns"] == 0   # under 8 KiB so far
    make_dirs(process_cluster, "b", 150)                             # ~100 bytes a record
    first = wait_checkpoint(process_cluster, 0)
    assert first["txid"] > 20
    make_dirs(process_cluster, "c", 150)
    assert wait_checkpoint(process_cluster, first["txid"])["txid"] > first["txid"]

    # the checkpoint monitor looks once a second: a further checkpoint may start after
    # any report (the writes of "c" can leave more than 8 KiB after the second one), so
    # wait for the state where the bytes since the last checkpoint are under the
    # threshold, and check it: only the in-progress segment after it is left
    def settled():
        last = report(process_cluster)["checkpoint"]
        names = os.listdir(journal_dir(process_cluster))
        if last["journal_bytes_since"] < 8192 \
                and names == [f"edits_inprogress_{last['txid'] + 1:019d}"] \
                and journal_bytes(process_cluster) == last["journal_bytes_since"]:
            return last
        return None

    last = poll_until(settled, timeout=30.0)
    assert last, (report(process_cluster)["checkpoint"], os.listdir(journal_dir(process_cluster)),
                  journal_bytes(process_cluster))
    assert last["txid"] > first["txid"]
    assert trio.run(all_exist, process_cluster.meta_address, ["/a/d0", "/c/d149"]) == []


def create_as_w(cluster: ProcessCluster, i: int):
    """Create /r/f<i> as client "w" with call id i: the same identity a retry sends."""
    from test_ha_retry import send

    return send(cluster.meta_address, "create", {"path": f"/r/f{i}", "client_name": "w",
                                                 "create_parent": True, "want_status": True}, i)


@pytest.mark.cluster(n_storage=0, settings={"retry_cache_entries": 40})
def test_a_start_after_kill9_reads_back_only_what_the_retry_cache_keeps(process_cluster):
    """The retry cache keeps 40 calls: after 200 retry-cached creates and kill -9, the start
    reads back the journal's newest 40 records (not 200), and a create among them retried
    with its identity gets its first answer; one older than the look back is run again
    (and fails: the cache no longer knows it)."""
    async def creates():
        return [await create_as_w(process_cluster, i) for i in range(1, 201)]

    first = trio.run(creates)
    process_cluster.kill_meta()
    process_cluster.start_meta()
    process_cluster.wait_ready(0)
    noted = "retry cache: 40 calls noted from the journal's 40 most recent records"
    # the look back runs in the background: the retries below wait for it anyway
    assert poll_until(lambda: noted in process_cluster.log_tail("meta", 200)), \
        process_cluster.log_tail("meta", 200)

    async def retries():
        newest = await create_as_w(process_cluster, 200)
        with pytest.raises(errors.AlreadyBeingCreated):   # run again: the file is open
            await create_as_w(process_cluster, 1)
        return newest

    assert trio.run(retries) == first[-1]


def test_after_kill9_reads_are_answered_during_the_look_back_and_retries_wait_for_it(tmp_path):
    """The server answers once its replay is done and reads the journal back into the retry
    cache in the background (held back 5 s here by ``retry_cache_look_back_delay``): a
    read is answered before the look back has finished, and a create from before the
    kill -9, retried with its identity meanwhile, waits for it and gets its first answer
    instead of a second run (which would fail: the file is open)."""
    from test_ha_retry import plain

    cluster = ProcessCluster(tmp_path, n_storage=0)
    cluster.start()
    try:
        async def creates():
            return [await create_as_w(cluster, i) for i in range(1, 21)]

        first = trio.run(creates)
        cluster.kill_meta()
        cluster.settings["retry_cache_look_back_delay"] = 5.0
        cluster.start_meta()
        cluster.wait_ready(0)
        # the 20 creates and the namespace's format record
        noted = "retry cache: 20 calls noted from the journal's 21 most recent records"

        async def during_the_look_back():
            info = await plain(cluster.meta_address, "get_file_info", path="/r/f20")
            looked_back_before_read = noted in cluster.log_tail("meta", 200)
            retried = await create_as_w(cluster, 20)
            return info, looked_back_before_read, retried, noted in cluster.log_tail("meta", 200)

        info, looked_back_before_read, retried, looked_back_before_retry = \
            trio.run(during_the_look_back)
        assert info is not None and not looked_back_before_read
        assert looked_back_before_retry
        assert retried == first[-1]
    finally:
        cluster.stop()
