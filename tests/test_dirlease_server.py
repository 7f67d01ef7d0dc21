"""Directory write leases on a running metadata server (docs/design/dirleases.md): grants
and releases are journaled and come back after a restart with their epochs, the RPCs
answer and refuse as PROTOCOL.md says, and an epoch that ended is refused for ever."""

from __future__ import annotations

import time

import pytest

from fs.client import Client
from fs.errors import FileNotFound, LeaseExpired, NotDirectory, PermissionDenied
from harness import ProcessCluster, make_test_config
from meta.journal.files import Record
from meta.journal.kv import MemoryStore
from meta.journal.ops_dirleases import DirLeaseGrant, DirLeaseRelease
from meta.server import MetaServer

pytestmark = pytest.mark.slow


def restart_meta(cluster: ProcessCluster) -> None:
    cluster.kill_meta(sig=15)
    cluster.start_meta()
    cluster.wait_ready(0)


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
            assert b.dir_lease_acquire("/d")["epoch"] is None
            with pytest.raises(LeaseExpired, match=r"/e: .*epoch %d" % given_back["epoch"]):
                a.dir_lease_release("/e", given_back["epoch"])
            again = b.dir_lease_acquire("/e")
            assert again["epoch"] > given_back["epoch"]
            restart_meta(cluster)
            assert a.dir_lease_release("/d", kept["epoch"]) is True
            assert b.dir_lease_release("/e", again["epoch"]) is True
            restart_meta(cluster)
            assert b.dir_lease_acquire("/d")["epoch"] > again["epoch"]


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


def test_acquire_answers_the_directory_and_refuses_clearly(tmp_path):
    settings = {"dir_lease_max_entries": 2}
    with ProcessCluster(tmp_path, n_storage=0, settings=settings) as cluster:
        with cluster.client() as a:
            a.mkdirs("/d/sub")
            a.write_file("/d/f", b"x")
            a.mkdirs("/big/1")
            a.mkdirs("/big/2")
            a.mkdirs("/big/3")
            a.set_permission("/d", 0o755)
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
                    other.dir_lease_acquire("/d")
            # events: a poll with nothing to say answers [] once its wait is over
            started = time.monotonic()
            assert a.dir_lease_events(wait=0.3) == []
            assert time.monotonic() - started >= 0.3
            # the server answered every mistake and still serves
            assert a.dir_lease_release("/d", grant["epoch"]) is True
