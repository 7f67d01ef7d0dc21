"""Directory write leases on a running metadata server (docs/design/dirleases.md): grants
and releases are journaled and come back after a restart with their epochs, the RPCs
answer and refuse as PROTOCOL.md says, an epoch that ended is refused for ever, and
another client's access to a leased directory recalls the lease and waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from fs.client import Client
from fs.errors import FileNotFound, LeaseExpired, NotDirectory, PermissionDenied
from harness import ProcessCluster, make_test_config
from meta.journal.files import Record
from meta.journal.kv import MemoryStore
from meta.journal.ops_dirleases import DirLeaseGrant, DirLeaseRelease
from meta.server import MetaServer
from meta.services.dir_leases import access_paths


def restart_meta(cluster: ProcessCluster) -> None:
    cluster.kill_meta(sig=15)
    cluster.start_meta()
    cluster.wait_ready(0)


@pytest.mark.slow
def test_grants_survive_a_restart_with_their_epochs_and_releases_stay_released(tmp_path):
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d")
            a.mkdirs("/e")
            kept = a.dir_lease_acquire("/d")
            given_back = a.dir_lease_acquire("/e")
            assert kept["epoch"] and given_back["epoch"] > kept["epoch"]
            assert a.dir_lease_release("/e", given_back["epoch"]) is True
            restart_meta(cluster)
            # a holder asking again gets the lease it holds: the same epoch, from the journal
            assert a.dir_lease_acquire("/d")["epoch"] == kept["epoch"]
            with pytest.raises(LeaseExpired, match=r"/e: .*epoch %d" % given_back["epoch"]):
                a.dir_lease_release("/e", given_back["epoch"])
            again = b.dir_lease_acquire("/e")
            assert again["epoch"] > given_back["epoch"]
            restart_meta(cluster)
            assert a.dir_lease_release("/d", kept["epoch"]) is True
            assert b.dir_lease_release("/e", again["epoch"]) is True
            restart_meta(cluster)
            assert b.dir_lease_acquire("/d")["epoch"] > again["epoch"]


@pytest.mark.slow
def test_an_old_epoch_is_refused_after_the_directory_is_leased_again(tmp_path):
    """The same holder's earlier epoch, and another holder's, are refused by the server
    and by the table rebuilt from the journal (``check``, what a batch will be checked
    by)."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a:
            a.mkdirs("/d")
            first = a.dir_lease_acquire("/d")["epoch"]
            a.dir_lease_release("/d", first)
            second = a.dir_lease_acquire("/d")["epoch"]
            assert second > first
            with pytest.raises(LeaseExpired, match=f"/d: the directory lease \\(epoch {first}\\)"):
                a.dir_lease_release("/d", first)
            restart_meta(cluster)
            with pytest.raises(LeaseExpired, match=f"epoch {first}"):
                a.dir_lease_release("/d", first)
            holder = a.client_name
        cluster.stop()
    # the records as a successor replays them: the table it rebuilds checks epochs alike
    server = MetaServer(make_test_config(), MemoryStore(), str(tmp_path / "replica"))
    table = server.dir_leases
    server._apply([Record(1, *server.ns.planner.plan_format(7, 1).to_wire())])
    server._apply([Record(2, *server.ns.planner.plan_mkdirs("/d", now_ns=2).to_wire())])
    ino = server.ns.view.get_file_info("/d")["ino"]
    server._apply([Record(3, *DirLeaseGrant(ino=ino, holder=holder).to_wire())])
    server._apply([Record(4, *DirLeaseRelease(ino=ino, holder=holder, epoch=3).to_wire())])
    server._apply([Record(5, *DirLeaseGrant(ino=ino, holder=holder).to_wire())])
    assert table.check(ino, holder, 5, "/d").epoch == 5
    with pytest.raises(LeaseExpired, match=r"/d: .*epoch 3.*its lease is now epoch 5"):
        table.check(ino, holder, 3, "/d")
    # a release of the ended epoch (an expiry racing the re-grant) changes nothing
    server._apply([Record(6, *DirLeaseRelease(ino=ino, holder=holder, epoch=3).to_wire())])
    assert table.lease_of(ino).epoch == 5 and server.ns.view.dir_leases() == [(ino, holder, 5)]
    server.rebuild_memory()
    assert table.lease_of(ino).epoch == 5


@pytest.mark.slow
def test_acquire_answers_the_directory_and_refuses_clearly(tmp_path):
    settings = {"dir_lease_max_entries": 2}
    with ProcessCluster(tmp_path, n_storage=0, settings=settings) as cluster:
        with cluster.client() as a:
            a.mkdirs("/d/sub")
            a.write_file("/d/f", b"x")
            a.mkdirs("/big/1")
            a.mkdirs("/big/2")
            a.mkdirs("/big/3")
            a.mkdirs("/e")
            a.set_permission("/e", 0o755)
            grant = a.dir_lease_acquire("/d")
            assert grant["attrs"]["path"] == "/d" and grant["attrs"]["type"] == "dir"
            assert sorted(e["name"] for e in grant["entries"]) == ["f", "sub"]
            refused = a.dir_lease_acquire("/big")
            assert refused["epoch"] is None
            assert "/big: not leased: 3 entries, more than dir_lease_max_entries (2)" \
                in refused["reason"]
            with pytest.raises(NotDirectory, match="/d/f"):
                a.dir_lease_acquire("/d/f")
            with pytest.raises(FileNotFound, match="/nope"):
                a.dir_lease_acquire("/nope")
            with pytest.raises(LeaseExpired, match="/d: .*epoch 999999"):
                a.dir_lease_release("/d", 999999)
            other = Client(cluster.meta_address, config=cluster.config(), user="mallory")
            with other:
                with pytest.raises(PermissionDenied, match="mallory"):
                    other.dir_lease_acquire("/e")
            # events: a poll with nothing to say answers [] once its wait is over
            started = time.monotonic()
            assert a.dir_lease_events(wait=0.3) == []
            assert time.monotonic() - started >= 0.3
            # the server answered every mistake and still serves
            assert a.dir_lease_release("/d", grant["epoch"]) is True


class Background:
    """``fn()`` on a thread: its answer (or error), and whether it is done yet."""

    def __init__(self, fn):
        self.result = self.error = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            self.error = exc
        finally:
            self.done.set()

    def wait(self, timeout: float):
        assert self.done.wait(timeout), "the call did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def names(statuses) -> list[str]:
    return sorted(s.name for s in statuses)


@pytest.mark.slow
def test_another_clients_listing_waits_until_the_holder_gives_the_lease_back(tmp_path):
    """B's listing of /d recalls A's lease and waits; A hears the recall through its
    events poll, changes /d (its own access never waits) and gives the lease back; B then
    sees A's change. B's calls on an unrelated directory meanwhile are not held up."""
    with ProcessCluster(tmp_path, n_storage=0,
                        settings={"dir_lease_recall_limit": 60.0}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d")
            a.mkdirs("/other/x")
            epoch = a.dir_lease_acquire("/d")["epoch"]
            listing = Background(lambda: b.list_status("/d"))
            events = a.dir_lease_events(wait=20)
            assert events == [{"path": "/d", "epoch": epoch}]
            assert not listing.done.is_set()
            # the same client's call on another directory goes through at once
            started = time.monotonic()
            assert names(b.list_status("/other")) == ["x"]
            assert b.get_file_status("/other/x").is_dir
            assert time.monotonic() - started < 5
            assert not listing.done.is_set()
            a.mkdirs("/d/made-while-held")
            assert not listing.done.is_set()
            assert a.dir_lease_release("/d", epoch) is True
            assert names(listing.wait(20)) == ["made-while-held"]
            # nobody holds /d now: B's accesses proceed, and its own lease is granted
            assert b.dir_lease_acquire("/d")["epoch"] > epoch


@pytest.mark.slow
def test_a_silent_holder_loses_the_lease_after_the_recall_limit(tmp_path):
    with ProcessCluster(tmp_path, n_storage=0,
                        settings={"dir_lease_recall_limit": 1.5}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d/sub")
            epoch = a.dir_lease_acquire("/d")["epoch"]
            started = time.monotonic()
            assert b.get_file_status("/d/sub").is_dir   # a stat through /d waits too
            assert time.monotonic() - started >= 1.5
            with pytest.raises(LeaseExpired, match=f"/d: .*epoch {epoch}"):
                a.dir_lease_release("/d", epoch)
            # the end was journaled: after a restart nobody holds /d
            restart_meta(cluster)
            started = time.monotonic()
            assert names(b.list_status("/d")) == ["sub"]
            assert time.monotonic() - started < 1.5


@pytest.mark.slow
def test_a_holder_whose_client_lease_ends_loses_its_directory_leases(tmp_path):
    """A holder that stops calling (no renew_lease, no events poll) loses its leases at
    the hard limit, by the lease monitor, before any recall would have ended them."""
    settings = {"lease_hard_limit": 2.0, "lease_soft_limit": 1.0,
                "dir_lease_recall_limit": 60.0}
    with ProcessCluster(tmp_path, n_storage=0, settings=settings) as cluster:
        with cluster.client() as b:
            with cluster.client() as a:
                a.mkdirs("/d")
                epoch = a.dir_lease_acquire("/d")["epoch"]
            started = time.monotonic()
            assert names(b.list_status("/d")) == []
            assert time.monotonic() - started < 30
            grant = b.dir_lease_acquire("/d")
            assert grant["epoch"] > epoch


def test_the_paths_a_call_accesses_are_read_from_its_arguments():
    assert access_paths("list_status", {"path": "/d", "limit": 5}) == ["/d"]
    assert access_paths("rename", {"src": "/a", "dst": "/b/c"}) == ["/a", "/b/c"]
    assert access_paths("rename_many", {"moves": [["/a", "/b"], ["/c", "/d", True]]}) == \
        ["/a", "/b", "/c", "/d"]
    assert access_paths("concat", {"target": "/t", "srcs": ["/s1", "/s2"]}) == \
        ["/t", "/s1", "/s2"]
    # not namespace paths, or not paths at all: the handler refuses what it must
    assert access_paths("add_block", {"path": "/f"}) == []
    assert access_paths("get_file_info", {"path": 7}) == []
    assert access_paths("get_file_info", ["/d"]) == []
