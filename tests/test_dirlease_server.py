"""Directory write leases on a running metadata server (docs/design/dirleases.md): grants
and releases are journaled and come back after a restart with their epochs, the RPCs
answer and refuse as PROTOCOL.md says, an epoch that ended is refused for ever, and
another client's access to a leased directory recalls the lease and waits for it."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import trio
import trio.testing

from fs.client import Client
from fs import dirops
from fs.errors import (FileNotFound, InvalidArgument, LeaseExpired, NotDirectory,
                       PermissionDenied)
from harness import ProcessCluster, make_test_config
from meta.journal.files import Record
from meta.journal.kv import MemoryStore, PlyvelStore
from meta.journal.ops_dirleases import DirLeaseGrant, DirLeaseRefill, DirLeaseRelease
from meta.leases.dirleases import NO_INOS, InoRange, StoredLease
from meta.schema import keys
from meta.namespace.namespace import Namespace
from meta.server import MetaServer
from meta.services.dir_leases import MAX_RESERVED_INOS, access_paths
from test_meta_server import inprocess_meta


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
    assert table.lease_of(ino).epoch == 5
    assert server.ns.view.dir_leases() == [StoredLease(ino, holder, 5)]
    server.rebuild_memory()
    assert table.lease_of(ino).epoch == 5


def test_a_grants_reserved_inodes_are_journaled_and_next_ino_moves_past_them(tmp_path):
    """DIR_LEASE_GRANT with ``first_ino``/``inos``, as a successor replays it: the lease
    key keeps the range, the stored next_ino moves past it (and the allocator with it),
    the table and a rebuild have it; a release ends such a lease; a grant of none writes
    the record as it was before reservations existed."""
    server = MetaServer(make_test_config(), MemoryStore(), str(tmp_path / "replica"))
    server._apply([Record(1, *server.ns.planner.plan_format(7, 1).to_wire())])
    server._apply([Record(2, *server.ns.planner.plan_mkdirs("/d", now_ns=2).to_wire())])
    server._apply([Record(3, *server.ns.planner.plan_mkdirs("/e", now_ns=3).to_wire())])
    d, e = (server.ns.view.get_file_info(p)["ino"] for p in ("/d", "/e"))
    first = server.ns.view.counters[keys.NEXT_INO]
    grant = DirLeaseGrant(ino=d, holder="h", first_ino=first, inos=100)
    assert grant.to_wire()[1] == {"ino": d, "holder": "h", "first_ino": first, "inos": 100}
    server._apply([Record(4, *grant.to_wire())])
    assert server.ns.view.counters[keys.NEXT_INO] == first + 100
    assert server.ns.ids.allocate_ino() == first + 100
    assert server.dir_leases.lease_of(d).inos == InoRange(first, 100)
    plain = DirLeaseGrant(ino=e, holder="h")
    assert plain.to_wire()[1] == {"ino": e, "holder": "h"} and plain.reserved == NO_INOS
    server._apply([Record(5, *plain.to_wire())])
    assert server.ns.view.dir_leases() == [StoredLease(d, "h", 4, InoRange(first, 100)),
                                           StoredLease(e, "h", 5)]
    server.rebuild_memory()
    assert server.dir_leases.lease_of(d).inos == InoRange(first, 100)
    assert server.dir_leases.lease_of(e).inos == NO_INOS
    server._apply([Record(6, *DirLeaseRelease(ino=d, holder="h", epoch=4).to_wire())])
    assert server.dir_leases.lease_of(d) is None
    assert server.ns.view.dir_leases() == [StoredLease(e, "h", 5)]
    # the ids stay spent: the counter never goes back
    assert server.ns.view.counters[keys.NEXT_INO] == first + 100


def test_a_refill_record_as_a_successor_replays_it(tmp_path):
    """DIR_LEASE_REFILL: the lease key gets the new range and keeps the one it had as
    ``earlier``, the one before goes; the stored next_ino moves past it; a rebuild has
    both ranges; a refill of a lease that ended meanwhile changes no lease (its ids stay
    spent)."""
    server = MetaServer(make_test_config(), MemoryStore(), str(tmp_path / "replica"))
    server._apply([Record(1, *server.ns.planner.plan_format(7, 1).to_wire())])
    server._apply([Record(2, *server.ns.planner.plan_mkdirs("/d", now_ns=2).to_wire())])
    d = server.ns.view.get_file_info("/d")["ino"]
    first = server.ns.view.counters[keys.NEXT_INO]
    server._apply([Record(3, *DirLeaseGrant(ino=d, holder="h", first_ino=first,
                                            inos=10).to_wire())])
    server._apply([Record(4, *DirLeaseRefill(ino=d, holder="h", epoch=3,
                                             first_ino=first + 10, inos=20).to_wire())])
    lease = server.dir_leases.lease_of(d)
    assert (lease.inos, lease.earlier) == (InoRange(first + 10, 20), InoRange(first, 10))
    server._apply([Record(5, *DirLeaseRefill(ino=d, holder="h", epoch=3,
                                             first_ino=first + 30, inos=5).to_wire())])
    assert server.ns.view.dir_leases() == [
        StoredLease(d, "h", 3, InoRange(first + 30, 5), InoRange(first + 10, 20))]
    assert server.ns.view.counters[keys.NEXT_INO] == first + 35
    server.rebuild_memory()
    lease = server.dir_leases.lease_of(d)
    assert lease.range_of(first + 12) == InoRange(first + 10, 20)
    assert lease.range_of(first + 1) is None
    server._apply([Record(6, *DirLeaseRelease(ino=d, holder="h", epoch=3).to_wire())])
    server._apply([Record(7, *DirLeaseRefill(ino=d, holder="h", epoch=3,
                                             first_ino=first + 35, inos=5).to_wire())])
    assert server.dir_leases.lease_of(d) is None and server.ns.view.dir_leases() == []
    assert server.ns.view.counters[keys.NEXT_INO] == first + 40


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
            assert events == [{"path": "/d", "epoch": epoch, "ino": a.get_file_status("/d").ino,
                               "kind": "recall"}]
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
def test_calls_that_reach_a_whole_tree_recall_the_leases_below_it(tmp_path):
    """A summary, a quota and a recursive delete of /t from B each recall A's lease on
    /t/x/y below it and wait: the summary counts the file A made there under its lease, a
    grant after the quota reserves no ids, and the delete removes A's file too. B's
    summary of a folder beside it and A's own summary of /t do not wait."""
    with ProcessCluster(tmp_path, n_storage=0,
                        settings={"dir_lease_recall_limit": 60.0}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/t/x/y")
            a.mkdirs("/beside/z")

            def recalled(grant, call):
                waiting = Background(call)
                events = a.dir_lease_events(wait=20)
                assert [(e["path"], e["epoch"], e["kind"]) for e in events] == \
                    [("/t/x/y", grant["epoch"], "recall")]
                assert not waiting.done.is_set()
                return waiting

            grant = a.dir_lease_acquire("/t/x/y", want_inos=4)
            assert grant["inos"][1] == 4
            assert b.content_summary("/beside")["directory_count"] == 2   # no wait
            assert a.content_summary("/t")["file_count"] == 0   # its own: no wait
            summary = recalled(grant, lambda: b.content_summary("/t"))
            at = time.time_ns()
            ino = reserved(grant)[0]
            assert a.dir_batch([create(grant, "f", ino, at),
                                write(grant, "f", ino, b"made", True, at)])["done"] == 2
            assert a.dir_lease_release("/t/x/y", grant["epoch"]) is True
            counted = summary.wait(20)
            assert (counted["file_count"], counted["length"]) == (1, 4)

            grant = a.dir_lease_acquire("/t/x/y", want_inos=4)
            assert grant["inos"][1] == 4
            quota = recalled(grant, lambda: b.set_quota("/t", ns_quota=100))
            assert a.dir_lease_release("/t/x/y", grant["epoch"]) is True
            quota.wait(20)
            grant = a.dir_lease_acquire("/t/x/y", want_inos=4)
            assert grant["epoch"] and grant["inos"][1] == 0   # under a quota now

            removal = recalled(grant, lambda: b.delete("/t", recursive=True))
            assert a.dir_lease_release("/t/x/y", grant["epoch"]) is True
            assert removal.wait(20) is True
            with pytest.raises(FileNotFound):
                a.get_file_status("/t/x/y/f")
            assert names(b.list_status("/")) == ["beside"]


@pytest.mark.slow
def test_a_silent_holder_loses_the_lease_after_the_recall_limit(tmp_path):
    with ProcessCluster(tmp_path, n_storage=0,
                        settings={"dir_lease_recall_limit": 1.5}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d/sub")
            a.mkdirs("/e")
            epoch = a.dir_lease_acquire("/d")["epoch"]
            other = a.dir_lease_acquire("/e")["epoch"]
            started = time.monotonic()
            assert b.get_file_status("/d/sub").is_dir   # a stat through /d waits too
            assert time.monotonic() - started >= 1.5
            with pytest.raises(LeaseExpired, match=f"/d: .*epoch {epoch}"):
                a.dir_lease_release("/d", epoch)
            # the holder that left a recall unanswered lost its other leases with it: an
            # access to /e does not wait out a recall of its own
            started = time.monotonic()
            assert names(b.list_status("/e")) == []
            assert time.monotonic() - started < 1.0
            with pytest.raises(LeaseExpired, match=f"/e: .*epoch {other}"):
                a.dir_lease_release("/e", other)
            # the holder is told of both ends, again at each poll until it acknowledges
            # them (a poll's answer its call gave up on is not lost)
            ended = sorted((e["path"], e["epoch"], e["kind"])
                           for e in a.dir_lease_events(wait=0.2, ack=[]))
            assert ended == [("/d", epoch, "ended"), ("/e", other, "ended")]
            again = a.dir_lease_events(wait=0.2, ack=[[epoch, "ended"], [epoch, "recall"]])
            assert [(e["path"], e["kind"]) for e in again] == [("/e", "ended")]
            assert a.dir_lease_events(wait=0.2, ack=[[other, "ended"]]) == []
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


# ------------------------------------------------------------------ batches

def ino_of(grant: dict) -> dict[str, int]:
    return {e["name"]: e["ino"] for e in grant["entries"]}


@pytest.mark.slow
def test_a_batch_applies_in_order_and_a_resend_is_skipped(tmp_path):
    """``dir_batch``: unlink, rename inside and across held folders and rmdir of an empty
    held folder (its lease ends with it) in one call, stamped with the holder's times;
    the same batch sent again (a lost answer) skips every change; a change under a lease
    that ended stops the batch there; a change the server refuses is reported by index
    and the rest goes on; malformed batches are refused whole."""
    # a recall a (which polls nothing) never answers ends after this
    with ProcessCluster(tmp_path, n_storage=0,
                        settings={"dir_lease_recall_limit": 1.5}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d/sub")
            a.mkdirs("/e")
            for name in ("x", "y", "z"):
                a.write_file(f"/d/{name}", name.encode())
            a.write_file("/d/sub/q", b"q")
            d, e, sub = (a.dir_lease_acquire(p) for p in ("/d", "/e", "/d/sub"))
            D, E, S = (g["attrs"]["ino"] for g in (d, e, sub))
            at = time.time_ns() - 10**9   # a second ago: the folders must show this time
            ops = [dirops.Unlink(D, d["epoch"], "x", ino_of(d)["x"], at),
                   dirops.Rename(D, d["epoch"], "y", ino_of(d)["y"], D, d["epoch"], "z",
                                 ino_of(d)["z"], at),
                   dirops.Rename(D, d["epoch"], "z", ino_of(d)["y"], E, e["epoch"], "w", 0,
                                 at),
                   dirops.Unlink(S, sub["epoch"], "q", ino_of(sub)["q"], at),
                   dirops.Rmdir(D, d["epoch"], "sub", S, sub["epoch"], at)]
            assert a.dir_batch(ops) == {"done": 5, "skipped": 0, "failed": [], "ended": None}
            assert a.dir_batch(ops) == {"done": 5, "skipped": 5, "failed": [], "ended": None}
            # the lease on the removed folder ended with it
            with pytest.raises(LeaseExpired, match=f"epoch {sub['epoch']}"):
                a.dir_lease_release("/d/sub", sub["epoch"])
            assert a.dir_batch([dirops.Release(E, e["epoch"])])["done"] == 1
            assert a.dir_lease_release("/d", d["epoch"]) is True
            assert names(b.list_status("/d")) == []
            assert names(b.list_status("/e")) == ["w"]
            assert b.read_file("/e/w") == b"y"
            assert b.get_file_status("/d").mtime_ns == at
            assert b.get_file_status("/e").mtime_ns == at
            # under a lease that ended: refused from there on, the server unchanged
            a.write_file("/d/v", b"v")
            d2 = a.dir_lease_acquire("/d")
            answer = a.dir_batch([dirops.Unlink(D, d2["epoch"], "v", ino_of(d2)["v"], at),
                                  dirops.Unlink(D, d["epoch"], "v", ino_of(d2)["v"], at)])
            assert answer["done"] == 2 and answer["skipped"] == 1   # the name is gone: applied
            a.write_file("/d/u", b"u")
            u = a.get_file_status("/d/u").ino
            answer = a.dir_batch([dirops.Unlink(D, d["epoch"], "u", u, at)])
            assert answer["done"] == 0 and answer["ended"]["type"] == "LeaseExpired"
            assert f"epoch {d['epoch']}" in answer["ended"]["message"]
            assert names(b.list_status("/d")) == ["u"]   # recalls d2: a answers nothing...
            # ... so that lease ended (the recall limit) and its epoch is refused as well
            answer = a.dir_batch([dirops.Unlink(D, d2["epoch"], "u", u, at)])
            assert answer["ended"] is not None and names(b.list_status("/d")) == ["u"]
            # a refused change is reported and the next one applied
            a.mkdirs("/f/full/x")
            a.write_file("/f/gone", b"g")
            f = a.dir_lease_acquire("/f")
            F = f["attrs"]["ino"]
            answer = a.dir_batch([
                dirops.Rmdir(F, f["epoch"], "full", ino_of(f)["full"], 1, at),
                dirops.Unlink(F, f["epoch"], "gone", ino_of(f)["gone"], at)])
            assert answer["done"] == 2 and answer["failed"][0]["index"] == 0
            assert answer["failed"][0]["error"]["type"] == "DirectoryNotEmpty"
            for bad, why in (([{"op": "mkfifo"}], "unknown change"),
                             ([{"op": "unlink", "dir": F}], "missing"),
                             ([{"op": "unlink", "dir": F, "epoch": f["epoch"], "name": "a/b",
                                "ino": 3, "time": 0}], "one path component"),
                             ("nope", "must be a list")):
                with pytest.raises(InvalidArgument, match=why):
                    a.dir_batch(bad)
            assert names(a.list_status("/f")) == ["full"]
            # mkdir with its lease: granted at once (the call does not wait for itself),
            # the new folder empty and held, a batch goes under it
            made = a.mkdir("/f/new", lease=True)
            assert made.lease["epoch"] and made.lease["entries"] == []
            assert made.lease["attrs"]["ino"] == made.status.ino
            a.write_file("/f/new/k", b"k")
            k = a.get_file_status("/f/new/k").ino
            assert a.dir_batch([dirops.Unlink(made.status.ino, made.lease["epoch"], "k", k,
                                              at)])["done"] == 1
            assert a.mkdir("/f/plain").lease is None
            with pytest.raises(InvalidArgument, match="dir_lease needs exclusive"):
                raw_call(cluster, "mkdirs", path="/f/y", dir_lease=a.client_name)


def ctx(client: str):
    """An in-process call's context, as the connection of ``client`` ("name#id") gives."""
    from fs.rpc import CallContext
    return CallContext(client_id=client, peer="127.0.0.1:5000", call_id=None)


@contextlib.asynccontextmanager
async def calls_behind_a_lock(server, parts: list[str]):
    """Calls run as tasks while ``parts`` stays write-locked (until the block ends):
    yields ``start(name, client, method, args)``, which starts one and returns once every
    task is blocked, and the dict each answer lands in by name."""
    from meta.namespace.locks import LOCK_WRITE, lock_set

    results: dict = {}
    async with trio.open_nursery() as nursery:
        async with server.locking.mutation("test", lock_set(parts, LOCK_WRITE)):
            async def start(name, client, method, args):
                async def run():
                    results[name] = await server.dispatch(ctx(client), method, args)
                nursery.start_soon(run)
                await trio.testing.wait_all_tasks_blocked()
            yield start, results


def test_a_grant_waits_for_a_change_already_past_its_access_check(tmp_path):
    """The grant's snapshot must hold every change that passed its access check before
    the grant: a rename into /d held up by another path's lock (after its check, before
    it locks /d) finishes before the grant answers, and the grant lists its result."""
    async def main():
        async with inprocess_meta(tmp_path) as server:
            await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/d"})
            await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/a/y"})
            async with calls_behind_a_lock(server, ["a", "y"]) as (start, results):
                await start("rename", "c#2", "rename", {"src": "/a/y", "dst": "/d/x"})
                assert "rename" not in results
                await start("grant", "h#3", "dir_lease_acquire",
                            {"path": "/d", "client_name": "h"})
                assert "grant" not in results, "granted before the rename in flight"
            assert results["rename"] is True
            assert [e["name"] for e in results["grant"]["entries"]] == ["x"]

    trio.run(main)


def test_a_grant_does_not_wait_for_a_holders_batched_change(tmp_path):
    """A holder's batched change changes only folders it holds, never one being granted:
    the grant of /d answers while h's rename inside its /p is held up by a lock (a grant
    waiting for it would be refused after GRANT_DRAIN_WAIT), and the rename then lands."""
    async def main():
        async with inprocess_meta(tmp_path) as server:
            await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/d"})
            await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/p/a"})
            grant = await server.dispatch(ctx("h#2"), "dir_lease_acquire",
                                          {"path": "/p", "client_name": "h"})
            folder, epoch = grant["attrs"]["ino"], grant["epoch"]
            moved = next(e["ino"] for e in grant["entries"] if e["name"] == "a")
            move = dirops.Rename(folder, epoch, "a", moved, folder, epoch, "b", 0,
                                 time.time_ns())
            async with calls_behind_a_lock(server, ["p", "a"]) as (start, results):
                await start("batch", "h#2", "dir_batch",
                            {"client_name": "h", "ops": [move.to_wire()]})
                assert "batch" not in results
                granted = await server.dispatch(ctx("c#3"), "dir_lease_acquire",
                                                {"path": "/d", "client_name": "c"})
                assert granted["epoch"] is not None, granted.get("reason")
                assert "batch" not in results, "the rename was not held up"
            assert results["batch"]["done"] == 1 and not results["batch"]["failed"]
            listed = await server.dispatch(ctx("h#2"), "list_status", {"path": "/p"})
            assert [e["name"] for e in listed["entries"]] == ["b"]

    trio.run(main)


def test_a_grant_takes_the_folders_below_along(tmp_path):
    """``below``: the grant also leases folders below the one asked for, nearest first,
    up to the count asked: not one another client holds (nor anything below it). Each
    answers its folder's entries under an epoch of its own, and a batch goes under it."""
    async def main():
        async with inprocess_meta(tmp_path) as server:
            for folder in ("/t/a/x", "/t/a/y", "/t/b/w", "/t/c/z"):
                await server.dispatch(ctx("setup#1"), "mkdirs", {"path": folder})
            other = await server.dispatch(ctx("o#3"), "dir_lease_acquire",
                                          {"path": "/t/b", "client_name": "o"})
            grant = await server.dispatch(ctx("h#2"), "dir_lease_acquire",
                                          {"path": "/t", "client_name": "h", "below": 3})
            below = {sub["path"]: sub for sub in grant["below"]}
            assert list(below) == ["/t/a", "/t/c", "/t/a/x"]
            assert [e["name"] for e in below["/t/a"]["entries"]] == ["x", "y"]
            epochs = [grant["epoch"]] + [sub["epoch"] for sub in grant["below"]]
            assert len(set(epochs)) == 4 and all(epochs)
            table = server.dir_lease_service.table
            for path, sub in below.items():
                lease = table.lease_of(sub["attrs"]["ino"])
                assert (lease.holder, lease.epoch) == ("h", sub["epoch"]), path
            assert table.lease_of(other["attrs"]["ino"]).holder == "o"
            w = next(e for e in other["entries"] if e["name"] == "w")
            z = next(e for e in below["/t/c"]["entries"] if e["name"] == "z")
            assert table.lease_of(w["ino"]) is None and table.lease_of(z["ino"]) is None
            a = below["/t/a"]
            x = next(e["ino"] for e in a["entries"] if e["name"] == "x")
            folder = a["attrs"]["ino"]
            move = dirops.Rename(folder, a["epoch"], "x", x, folder, a["epoch"], "x2", 0,
                                 time.time_ns())
            done = await server.dispatch(ctx("h#2"), "dir_batch",
                                         {"client_name": "h", "ops": [move.to_wire()]})
            assert done["done"] == 1 and not done["failed"]
            listed = await server.dispatch(ctx("h#2"), "list_status", {"path": "/t/a"})
            assert [e["name"] for e in listed["entries"]] == ["x2", "y"]
            # asked without it: no "below" in the answer
            await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/u"})
            plain = await server.dispatch(ctx("p#4"), "dir_lease_acquire",
                                          {"path": "/u", "client_name": "p"})
            assert plain["epoch"] and "below" not in plain

    trio.run(main)


def raw_call(cluster: ProcessCluster, method: str, **args):
    """One call of ``method`` with exactly ``args`` (what the client library would not
    send)."""
    from fs.errors import sole_exception
    from fs.rpc import RpcClient

    async def once():
        async with RpcClient(cluster.meta_address, "raw-test", retry_seconds=5,
                             timeout=20) as rpc:
            return await rpc.call(method, args)
    try:
        return trio.run(once)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


# ------------------------------------------------------------------ creates and small files

def create(grant: dict, name: str, ino: int, at: int, permission: int = 0o640):
    return dirops.Create(grant["attrs"]["ino"], grant["epoch"], name, ino, permission, None,
                         None, None, None, at)


def write(grant: dict, name: str, ino: int, data: bytes, close: bool, at: int, *,
          mtime_ns=None, permission=None):
    return dirops.Write(grant["attrs"]["ino"], grant["epoch"], name, ino, data, close,
                        mtime_ns, None, permission, at)


def reserved(grant: dict) -> range:
    first, count = grant["inos"]
    return range(first, first + count)


@pytest.mark.slow
def test_a_grant_reserves_inode_ids_for_its_holder(tmp_path):
    """``want_inos``: each grant answers its own range of inode ids, disjoint from every
    other grant's and from what creates get; a holder asking again gets its range back;
    at most MAX_RESERVED_INOS; none at or under a folder with a quota; bad values are
    refused naming the argument."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            for path in ("/d", "/e", "/f", "/g", "/q/sub", "/s/sub"):
                a.mkdirs(path)
            a.set_quota("/q", ns_quota=1000)
            a.set_quota("/s", ds_quota=1 << 30)
            d = a.dir_lease_acquire("/d", want_inos=10)
            e = a.dir_lease_acquire("/e", want_inos=5)
            assert d["inos"][1] == 10 and e["inos"][1] == 5 and d["inos"][0] > 0
            assert not set(reserved(d)) & set(reserved(e))
            again = a.dir_lease_acquire("/d", want_inos=99)
            assert again["epoch"] == d["epoch"] and again["inos"] == d["inos"]
            assert a.dir_lease_acquire("/f", want_inos=10**9)["inos"][1] == MAX_RESERVED_INOS
            assert a.dir_lease_acquire("/g")["inos"] == [0, 0]   # none asked for
            # a quota at or above: the grant is made, without ids
            for path in ("/q", "/q/sub", "/s/sub"):
                grant = a.dir_lease_acquire(path, want_inos=10)
                assert grant["epoch"] and grant["inos"][1] == 0, path
            made = a.mkdir("/e/new", lease=True, want_inos=4)
            assert made.lease["inos"][1] == 4
            assert not set(reserved(made.lease)) & (set(reserved(d)) | set(reserved(e)))
            b.mkdirs("/other")
            b.write_file("/other/x", b"x")
            x = b.get_file_status("/other/x").ino
            assert x not in reserved(d) and x not in reserved(e) \
                and x not in reserved(made.lease)
            for bad in (-1, "3", True, 1.5):
                with pytest.raises(InvalidArgument, match="dir_lease_acquire /g: want_inos"):
                    raw_call(cluster, "dir_lease_acquire", path="/g",
                             client_name=a.client_name, want_inos=bad)
            with pytest.raises(InvalidArgument, match="mkdirs /e/z: dir_lease_inos"):
                raw_call(cluster, "mkdirs", path="/e/z", dir_lease_inos=-1)
            with pytest.raises(InvalidArgument, match="dir_lease_inos needs dir_lease"):
                raw_call(cluster, "mkdirs", path="/e/z", dir_lease_inos=3)
            assert a.dir_lease_acquire("/e")["entries"][0]["name"] == "new"   # no /e/z


@pytest.mark.slow
def test_creates_and_small_files_through_a_batch(tmp_path):
    """``dir_batch`` create and write: a file made under a reserved inode id with its
    content, as ``create`` and ``complete(data=...)`` make it (owner, group, mode, the
    holder's times), readable by another client; an id outside the range fails by index
    and the batch goes on; a resend changes nothing and fails nothing; a flush then a
    close; an empty file; a create then an unlink; a name that exists; a created file
    stays the holder's open file; malformed records refuse the batch whole."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d")
            a.write_file("/d/plain", b"p", permission=0o640)
            d = a.dir_lease_acquire("/d", want_inos=16)
            ids = reserved(d)
            at = time.time_ns() - 10**9   # a second ago: the files and /d show this time
            ops = [create(d, "f", ids[0], at),
                   write(d, "f", ids[0], b"hello", True, at),
                   create(d, "stray", ids[-1] + 1, at),          # not reserved
                   create(d, "g", ids[1], at, permission=0o600),
                   write(d, "g", ids[1], b"v1", False, at),
                   write(d, "g", ids[1], b"v2", True, at, mtime_ns=at - 5, permission=0o644),
                   create(d, "empty", ids[2], at),
                   write(d, "empty", ids[2], b"", True, at),
                   create(d, "gone", ids[3], at),
                   dirops.Unlink(d["attrs"]["ino"], d["epoch"], "gone", ids[3], at),
                   create(d, "plain", ids[4], at),               # the name exists
                   create(d, "open", ids[5], at)]
            answer = a.dir_batch(ops)
            assert answer["done"] == len(ops) and answer["ended"] is None
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (2, "InvalidArgument"), (10, "FileExists")]
            stray = answer["failed"][0]["error"]["message"]
            assert f"/d/stray: inode {ids[-1] + 1} is not one the lease" in stray
            assert f"reserved: {ids[0]} to {ids[-1]}" in stray
            # sent again (its answer lost): the creates of files that exist are skipped
            # (f, g, empty, open), and so are the writes to closed files: g's flush, and
            # the closes of files that hold their content; "gone" is made and removed
            # again (nothing tells it was made), the same refusals as before
            again = a.dir_batch(ops)
            assert again["ended"] is None and again["skipped"] == 8
            assert [f["index"] for f in again["failed"]] == [2, 10]
            # the created file no close came for is the holder's open file
            opened = [f for f in b.list_open_files("/") if f["path"] == "/d/open"]
            assert [(f["ino"], f["holder"]) for f in opened] == [(ids[5], a.client_name)]
            assert raw_call(cluster, "complete", path="/d/open", client_name=a.client_name,
                            ino=ids[5], data=b"later") is True
            a.dir_lease_release("/d", d["epoch"])

            plain = b.get_file_status("/d/plain")
            f = b.get_file_status("/d/f")
            assert (f.ino, f.length, f.mode, f.owner, f.group, f.under_construction) == \
                (ids[0], 5, 0o640, plain.owner, plain.group, False)
            assert f.mtime_ns == at and b.get_file_status("/d").mtime_ns == at
            assert b.read_file("/d/f") == b"hello"
            g = b.get_file_status("/d/g")
            assert (g.ino, g.mode, g.mtime_ns) == (ids[1], 0o644, at - 5)
            assert b.read_file("/d/g") == b"v2"
            empty = b.get_file_status("/d/empty")
            assert (empty.ino, empty.length, empty.under_construction) == (ids[2], 0, False)
            assert b.read_file("/d/empty") == b""
            assert b.read_file("/d/open") == b"later" and b.read_file("/d/plain") == b"p"
            assert names(b.list_status("/d")) == ["empty", "f", "g", "open", "plain"]

            # a flush, then a close in a later batch
            d = a.dir_lease_acquire("/d", want_inos=4)
            ids = reserved(d)
            assert a.dir_batch([create(d, "h", ids[0], at),
                                write(d, "h", ids[0], b"first", False, at)])["failed"] == []
            h = a.get_file_status("/d/h")   # the holder's own access: no recall
            assert (h.length, h.under_construction) == (5, True)
            assert a.read_file("/d/h") == b"first"
            answer = a.dir_batch([write(d, "h", ids[0], b"second", True, at)])
            assert answer["failed"] == [] and answer["done"] == 1
            # a late flush of a closed file (a resend) is skipped
            assert a.dir_batch([write(d, "h", ids[0], b"first", False, at)])["skipped"] == 1
            # a rename after the create: a resend skips the create of the moved file
            D = d["attrs"]["ino"]
            moved = [create(d, "m", ids[1], at), write(d, "m", ids[1], b"m", True, at),
                     dirops.Rename(D, d["epoch"], "m", ids[1], D, d["epoch"], "m2", 0, at)]
            assert a.dir_batch(moved)["failed"] == []
            assert a.dir_batch(moved) == {"done": 3, "skipped": 3, "failed": [],
                                          "ended": None}
            # malformed: refused whole, nothing applied
            good = create(d, "never", ids[2], at).to_wire()
            for bad, why in (({**good, "perm": 0o20000}, "create perm"),
                             ({**good, "owner": 7}, "create owner"),
                             ({**good, "replication": 0}, "create replication"),
                             ({**good, "extra": 1}, "unknown fields"),
                             ({k: v for k, v in good.items() if k != "group"}, "missing group"),
                             ({**write(d, "h", ids[0], b"x", True, at).to_wire(), "data": "x"},
                              "write data must be bytes"),
                             ({**write(d, "h", ids[0], b"x", True, at).to_wire(), "close": 1},
                              "write close must be a boolean"),
                             (write(d, "h", ids[0], b"", False, at).to_wire(),
                              "write of no data must close")):
                with pytest.raises(InvalidArgument, match=why):
                    a.dir_batch([good, bad])
            assert names(a.list_status("/d")) == ["empty", "f", "g", "h", "m2", "open",
                                                  "plain"]
            a.dir_lease_release("/d", d["epoch"])
            # resent after the lease ended: still skipped, not stopped; a close with other
            # content is no resend, and its lease has ended
            assert a.dir_batch(moved) == {"done": 3, "skipped": 3, "failed": [],
                                          "ended": None}
            answer = a.dir_batch([write(d, "h", ids[0], b"other", True, at)])
            assert answer["done"] == 0 and answer["ended"]["type"] == "LeaseExpired"
            assert b.read_file("/d/h") == b"second" and b.read_file("/d/m2") == b"m"


@pytest.mark.slow
def test_reserved_inode_ids_survive_a_restart(tmp_path):
    """After a restart the holder's lease keeps its range: a plain create never gets an id
    in it (the stored next_ino is past it), and the holder's create under a reserved id
    still works."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a:
            a.mkdirs("/d")
            d = a.dir_lease_acquire("/d", want_inos=8)
            ids = reserved(d)
            restart_meta(cluster)
            kept = a.dir_lease_acquire("/d")
            assert (kept["epoch"], kept["inos"]) == (d["epoch"], d["inos"])
            a.write_file("/x", b"x")
            assert a.get_file_status("/x").ino > ids[-1]
            at = time.time_ns()
            answer = a.dir_batch([create(d, "f", ids[3], at),
                                  write(d, "f", ids[3], b"kept", True, at)])
            assert answer == {"done": 2, "skipped": 0, "failed": [], "ended": None}
            assert a.get_file_status("/d/f").ino == ids[3]
        cluster.stop()
        store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
        try:
            assert Namespace(store).view.counters[keys.NEXT_INO] > ids[-1]
        finally:
            store.close()


@pytest.mark.slow
def test_a_refill_gives_a_held_lease_more_ids_once_and_they_survive_a_restart(tmp_path):
    """``dir_batch`` refill: fresh ids answered with the batch, disjoint from what anyone
    else gets; the range in use stays usable after it, the one before it goes at the next
    refill; a resend (its answer lost) refills nothing again and answers the same range;
    the refilled ranges come back after a restart (the stored next_ino is past them); none
    under a quota; malformed refills refuse the batch."""
    def refill(grant, after, count=8):
        return dirops.Refill(grant["attrs"]["ino"], grant["epoch"], after, count)

    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d")
            a.mkdirs("/q/sub")
            a.set_quota("/q", ns_quota=1000)
            d = a.dir_lease_acquire("/d", want_inos=4)
            first = reserved(d)
            at = time.time_ns()
            ask = [create(d, "f0", first[0], at), refill(d, first.start)]
            answer = a.dir_batch(ask)
            assert answer["failed"] == [] and answer["done"] == 2
            [(index, (start, count))] = [(g["index"], g["inos"]) for g in answer["inos"]]
            assert index == 1 and count == 8
            second = range(start, start + count)
            assert not set(second) & set(first)
            # sent again: nothing refilled twice, the same range answered
            again = a.dir_batch(ask)
            assert again["skipped"] == 2 and again["inos"] == [{"index": 1,
                                                                 "inos": [start, 8]}]
            b.write_file("/x", b"x")
            assert b.get_file_status("/x").ino not in second
            # both ranges serve creates; a folder made here may take a part of the new one
            D = d["attrs"]["ino"]
            ops = [create(d, "f1", first[1], at), create(d, "g0", second[0], at),
                   dirops.Mkdir(D, d["epoch"], "sub", second[1], 0o755, None, None,
                                second[4], 4, at)]
            assert a.dir_batch(ops)["failed"] == []
            restart_meta(cluster)
            assert a.dir_batch([create(d, "f2", first[2], at),
                                create(d, "g2", second[2], at)])["failed"] == []
            # a second refill: the first range goes, the second stays
            answer = a.dir_batch([refill(d, second.start)])
            [granted] = answer["inos"]
            third = range(granted["inos"][0], granted["inos"][0] + 8)
            assert not set(third) & (set(first) | set(second))
            answer = a.dir_batch([create(d, "f3", first[3], at),
                                  create(d, "g3", second[3], at),
                                  create(d, "h0", third[0], at)])
            assert [f["index"] for f in answer["failed"]] == [0]
            assert f"reserved: {second[0]} to {second[-1]}, {third[0]} to {third[-1]}" \
                in answer["failed"][0]["error"]["message"]
            assert sorted(e["name"] for e in a.dir_lease_acquire("/d")["entries"]) == [
                "f0", "f1", "f2", "g0", "g2", "g3", "h0", "sub"]
            # under a quota: none
            q = a.dir_lease_acquire("/q/sub", want_inos=4)
            answer = a.dir_batch([refill(q, 1)])
            assert answer["inos"] == [{"index": 0, "inos": [0, 0]}]
            for bad, why in (({**refill(d, 1).to_wire(), "inos": 0}, "refill inos"),
                             ({**refill(d, 1).to_wire(), "after": "x"}, "refill after")):
                with pytest.raises(InvalidArgument, match=why):
                    a.dir_batch([bad])
        cluster.stop()
        store = PlyvelStore(str(cluster.meta_dir() / "db"), create=False)
        try:
            assert Namespace(store).view.counters[keys.NEXT_INO] > third[-1]
        finally:
            store.close()


@pytest.mark.slow
def test_a_create_and_its_close_in_one_batch_run_as_one(tmp_path):
    """A create followed by the write that closes the same file runs as one: the file is
    complete with its content, times and mode at once; when the content is refused (more
    than ``inline_max``) neither is applied and both are reported by index; a close that
    follows another file's create is not joined to it."""
    with ProcessCluster(tmp_path, n_storage=0, settings={"inline_max": 1024}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/w")
            d = a.dir_lease_acquire("/w", want_inos=8)
            ids = reserved(d)
            at = time.time_ns() - 10**9
            ops = [create(d, "whole", ids[0], at),
                   write(d, "whole", ids[0], b"w" * 100, True, at + 7, mtime_ns=at - 9,
                         permission=0o600),
                   create(d, "huge", ids[1], at),
                   write(d, "huge", ids[1], b"h" * 2000, True, at),
                   create(d, "x", ids[2], at),
                   create(d, "y", ids[3], at),
                   write(d, "x", ids[2], b"xx", True, at)]
            answer = a.dir_batch(ops)
            assert answer["done"] == len(ops) and answer["ended"] is None
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (2, "InvalidArgument"), (3, "InvalidArgument")]
            assert "2000 bytes of inline data" in answer["failed"][0]["error"]["message"]
            a.dir_lease_release("/w", d["epoch"])
            whole = b.get_file_status("/w/whole")
            assert (whole.ino, whole.length, whole.mode, whole.mtime_ns,
                    whole.under_construction) == (ids[0], 100, 0o600, at - 9, False)
            assert b.read_file("/w/whole") == b"w" * 100
            assert b.read_file("/w/x") == b"xx"
            assert b.get_file_status("/w/y").under_construction
            assert names(b.list_status("/w")) == ["whole", "x", "y"]
            assert not [f for f in b.list_open_files("/") if f["path"] == "/w/whole"]


@pytest.mark.slow
def test_a_batch_lands_as_its_changes_one_by_one_would(tmp_path):
    """A batch's creates, unlinks and attribute changes are planned in runs (one lock pass,
    one journal batch), yet land as if applied one at a time: a name unlinked and made
    again, a file changed after its create, a mode change then a create, a resend (every
    change skipped, nothing changes), and a lease that ended mid-batch (what came before
    it is applied, nothing after)."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/r")
            a.mkdirs("/s")
            d = a.dir_lease_acquire("/r", want_inos=16)
            ids = reserved(d)
            at = time.time_ns() - 10**9
            unlink = lambda name, ino: dirops.Unlink(d["attrs"]["ino"], d["epoch"], name, ino,
                                                     at)
            ops = [create(d, "a", ids[0], at), write(d, "a", ids[0], b"1", True, at),
                   create(d, "b", ids[1], at), write(d, "b", ids[1], b"b", True, at),
                   unlink("a", ids[0]),
                   create(d, "a", ids[2], at), write(d, "a", ids[2], b"2", True, at),
                   set_attr(d, "b", ids[1], at, mtime_ns=at - 5),
                   create(d, "c", ids[3], at), write(d, "c", ids[3], b"c", True, at),
                   set_attr(d, "c", ids[3], at, permission=0o600),
                   set_attr(d, "r-less", 10**9, at, mtime_ns=at),   # no such entry
                   create(d, "e", ids[4], at), write(d, "e", ids[4], b"e", True, at),
                   unlink("b", ids[1]),
                   create(d, "b", ids[5], at), write(d, "b", ids[5], b"B", True, at)]
            answer = a.dir_batch(ops)
            assert (answer["done"], answer["skipped"], answer["ended"]) == (len(ops), 1, None)
            assert answer["failed"] == []   # the missing entry's change counts as resent
            # sent again (its answer lost): the namespace stays as it is
            again = a.dir_batch(ops)
            assert (again["done"], again["ended"]) == (len(ops), None)
            a.dir_lease_release("/r", d["epoch"])
            assert {s.name: (s.ino, s.mode, b.read_file(f"/r/{s.name}"))
                    for s in b.list_status("/r")} == {
                "a": (ids[2], 0o640, b"2"), "b": (ids[5], 0o640, b"B"),
                "c": (ids[3], 0o600, b"c"), "e": (ids[4], 0o640, b"e")}
            assert b.get_file_status("/r/b").mtime_ns != at - 5   # set on the unlinked one
            # a lease that ended mid-batch: the run before it lands, nothing after it
            d = a.dir_lease_acquire("/r", want_inos=16)
            gone = a.dir_lease_acquire("/s")
            a.dir_lease_release("/s", gone["epoch"])
            ids = reserved(d)
            ops = [create(d, "f", ids[0], at), write(d, "f", ids[0], b"f", True, at),
                   create(d, "g", ids[1], at), write(d, "g", ids[1], b"g", True, at),
                   create(gone, "h", 10**9, at),
                   create(d, "i", ids[2], at), write(d, "i", ids[2], b"i", True, at)]
            answer = a.dir_batch(ops)
            assert (answer["done"], answer["failed"]) == (4, [])
            assert answer["ended"]["type"] == "LeaseExpired"
            a.dir_lease_release("/r", d["epoch"])
            assert names(b.list_status("/r")) == ["a", "b", "c", "e", "f", "g"]
            assert names(b.list_status("/s")) == []


@pytest.mark.slow
def test_renames_in_a_batch_land_as_one_by_one(tmp_path):
    """Files written under a temporary name and renamed (git's objects), in one batch:
    the renames join the runs and land as one change at a time would, each file under
    its final name with its content and the rename's time as its ctime; a rename chain,
    a rename into another held folder, a folder renamed (not in a run: its paths move),
    a rename onto a name taken (refused by its index, as the call refuses it) and a
    resend of the whole batch (nothing changes)."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/r/sub")
            a.mkdirs("/s")
            sub = b.get_file_status("/r/sub").ino
            d = a.dir_lease_acquire("/r", want_inos=16)
            e = a.dir_lease_acquire("/s", want_inos=16)
            ids = reserved(d)
            at = time.time_ns() - 10**9

            def move(name, ino, dst_name, to=d, replaced=0, when=at):
                return dirops.Rename(d["attrs"]["ino"], d["epoch"], name, ino,
                                     to["attrs"]["ino"], to["epoch"], dst_name, replaced,
                                     when)

            ops = [create(d, "tmp1", ids[0], at), write(d, "tmp1", ids[0], b"1", True, at),
                   move("tmp1", ids[0], "obj1", when=at + 1),
                   create(d, "tmp2", ids[1], at), write(d, "tmp2", ids[1], b"2", True, at),
                   move("tmp2", ids[1], "obj2", when=at + 2),
                   move("obj1", ids[0], "obj1b", when=at + 3),
                   move("obj2", ids[1], "moved", to=e, when=at + 4),
                   move("sub", sub, "sub2", when=at + 5),
                   create(d, "tmp3", ids[2], at), write(d, "tmp3", ids[2], b"3", True, at),
                   move("tmp3", ids[2], "obj1b", when=at + 6),        # taken: refused
                   move("tmp3", ids[2], "obj3", when=at + 7)]
            answer = a.dir_batch(ops)
            assert answer["done"] == len(ops) and answer["ended"] is None, answer
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (11, "FileExists")], answer["failed"]
            again = a.dir_batch(ops)
            assert (again["done"], again["ended"]) == (len(ops), None)
            a.dir_lease_release("/r", d["epoch"])
            a.dir_lease_release("/s", e["epoch"])
            assert names(b.list_status("/r")) == ["obj1b", "obj3", "sub2"]
            assert names(b.list_status("/s")) == ["moved"]
            assert [b.read_file(p) for p in ("/r/obj1b", "/s/moved", "/r/obj3")] == [
                b"1", b"2", b"3"]
            assert [b.get_file_status(p).ctime_ns for p in ("/r/obj1b", "/s/moved",
                                                             "/r/obj3")] == [
                at + 3, at + 4, at + 7]
            assert b.get_file_status("/r/sub2").ino == sub


@pytest.mark.slow
def test_creates_closed_in_a_later_batch_and_refills_land_as_one_by_one(tmp_path):
    """What a mount sends when a file's close comes after another file's create (creates
    alone, closes of files created in earlier batches or earlier in the same one, a
    refill among them) is planned in runs and lands as one change at a time would: each
    file with its content, mode and times, none left open; a close refused (more than
    ``inline_max``; a file already closed with other content) is reported by its index
    with its call's error and the rest goes on; the refill's ids are answered and
    usable."""
    with ProcessCluster(tmp_path, n_storage=0, settings={"inline_max": 1024}) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/r")
            d = a.dir_lease_acquire("/r", want_inos=8)
            ids = reserved(d)
            at = time.time_ns() - 10**9
            refill = dirops.Refill(d["attrs"]["ino"], d["epoch"], ids.start, 16)
            first = [create(d, "a", ids[0], at), create(d, "b", ids[1], at), refill,
                     write(d, "a", ids[0], b"A", True, at, mtime_ns=at - 7),
                     create(d, "c", ids[2], at), create(d, "big", ids[3], at),
                     create(d, "twice", ids[4], at)]
            answer = a.dir_batch(first)
            assert (answer["done"], answer["failed"], answer["ended"]) == (len(first), [], None)
            [granted] = answer["inos"]
            assert granted["index"] == 2 and granted["inos"][1] == 16
            more = range(granted["inos"][0], granted["inos"][0] + 16)
            second = [write(d, "b", ids[1], b"B", True, at, permission=0o600),
                      write(d, "big", ids[3], b"x" * 2000, True, at),
                      create(d, "n", more[0], at),
                      write(d, "c", ids[2], b"C", True, at),
                      write(d, "twice", ids[4], b"1", True, at),
                      write(d, "n", more[0], b"N", True, at),
                      write(d, "twice", ids[4], b"2", True, at)]
            answer = a.dir_batch(second)
            assert answer["done"] == len(second) and answer["ended"] is None
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (1, "InvalidArgument"), (6, "LeaseExpired")], answer["failed"]
            assert "inline_max" in answer["failed"][0]["error"]["message"]
            a.dir_lease_release("/r", d["epoch"])
            got = {s.name: (s.ino, s.mode, s.under_construction) for s in b.list_status("/r")}
            assert got == {"a": (ids[0], 0o640, False), "b": (ids[1], 0o600, False),
                           "c": (ids[2], 0o640, False), "big": (ids[3], 0o640, True),
                           "n": (more[0], 0o640, False), "twice": (ids[4], 0o640, False)}
            assert [b.read_file(f"/r/{n}") for n in ("a", "b", "c", "n", "twice")] == [
                b"A", b"B", b"C", b"N", b"1"]
            assert b.get_file_status("/r/a").mtime_ns == at - 7
            assert b.get_file_status("/r/b").mtime_ns == at


def alice() -> "CallContext":
    """A call of alice's, as holder h's connection makes it."""
    from fs.rpc import CallContext

    return CallContext(client_id="h#2", peer="127.0.0.1:5000", user="alice",
                       groups=("alice",), sync_metadata=False)


async def alices_folders(server) -> None:
    """/p/sub/deep, each folder alice's."""
    await server.dispatch(ctx("setup#1"), "mkdirs", {"path": "/p/sub/deep"})
    for path in ("/p", "/p/sub", "/p/sub/deep"):
        await server.dispatch(ctx("setup#1"), "set_owner",
                              {"path": path, "owner": "alice", "group": "alice"})


def test_a_mode_change_in_a_batch_decides_the_checks_of_the_changes_after_it(tmp_path):
    """Alice's batch takes the search permission of her folder /p/sub away, then creates a
    file in /p/sub/deep and unlinks one in /p/sub: both are refused as the calls one after
    the other would be, though a batch's changes are planned together."""

    async def main():
        async with inprocess_meta(tmp_path) as server:
            await alices_folders(server)
            await server.dispatch(alice(), "create", {"path": "/p/sub/old", "client_name": "h"})
            await server.dispatch(alice(), "complete", {"path": "/p/sub/old",
                                                      "client_name": "h"})
            grant = await server.dispatch(alice(), "dir_lease_acquire",
                                          {"path": "/p", "client_name": "h", "below": 2})
            sub, deep = grant["below"]
            old = next(e["ino"] for e in sub["entries"] if e["name"] == "old")
            first = deep["inos"][0]
            at = time.time_ns()
            ops = [set_attr(grant, "sub", sub["attrs"]["ino"], at, permission=0o600),
                   create(deep, "x", first, at), write(deep, "x", first, b"x", True, at),
                   dirops.Unlink(sub["attrs"]["ino"], sub["epoch"], "old", old, at)]
            answer = await server.dispatch(alice(), "dir_batch",
                                           {"client_name": "h",
                                            "ops": [op.to_wire() for op in ops]})
            assert answer["done"] == 4
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (1, "PermissionDenied"), (2, "PermissionDenied"), (3, "PermissionDenied")]
            for path, entries in (("/p/sub", ["deep", "old"]), ("/p/sub/deep", [])):
                listed = await server.dispatch(ctx("h#3"), "list_status", {"path": path})
                assert [e["name"] for e in listed["entries"]] == entries

    trio.run(main)


def test_a_folders_times_set_after_changes_in_it_are_its_times_and_a_mode_change_guards_only_below_it(
        tmp_path):
    """In one batch: files made in /p/sub, then /p/sub's times set (tar sets a folder's
    times after its entries), a mode change of /p/sub that takes alice's search away,
    then a file made in /p beside it and one in /p/sub/deep: /p/sub keeps the times set
    after its entries, the file beside it is made, the one below is refused, as the
    calls one after the other would do."""

    async def main():
        async with inprocess_meta(tmp_path) as server:
            await alices_folders(server)
            grant = await server.dispatch(alice(), "dir_lease_acquire",
                                          {"path": "/p", "client_name": "h", "below": 2,
                                           "want_inos": 8})
            sub, deep = grant["below"]
            SUB = sub["attrs"]["ino"]
            mine, ids, low = reserved(grant), reserved(sub), reserved(deep)
            at = time.time_ns() - 10**9
            ops = [create(sub, "a", ids[0], at), write(sub, "a", ids[0], b"a", True, at),
                   create(sub, "b", ids[1], at + 1),
                   set_attr(grant, "sub", SUB, at + 2, mtime_ns=at - 50),
                   set_attr(grant, "sub", SUB, at + 3, permission=0o600),
                   create(grant, "beside", mine[0], at + 4),
                   write(grant, "beside", mine[0], b"s", True, at + 4),
                   create(deep, "below", low[0], at + 5)]
            answer = await server.dispatch(alice(), "dir_batch",
                                           {"client_name": "h",
                                            "ops": [op.to_wire() for op in ops]})
            assert answer["done"] == len(ops)
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (7, "PermissionDenied")]
            listed = await server.dispatch(ctx("h#3"), "list_status", {"path": "/p"})
            got = {e["name"]: e for e in listed["entries"]}
            assert sorted(got) == ["beside", "sub"]
            assert (got["sub"]["mtime_ns"], got["sub"]["mode"]) == (at - 50, 0o600)
            assert got["beside"]["length"] == 1
            for path, entries in (("/p/sub", ["a", "b", "deep"]), ("/p/sub/deep", [])):
                listed = await server.dispatch(ctx("h#3"), "list_status", {"path": path})
                assert [e["name"] for e in listed["entries"]] == entries

    trio.run(main)


def set_attr(grant: dict, name: str, ino: int, at: int, *, permission=None, owner=None,
             group=None, mtime_ns=None, atime_ns=None):
    return dirops.SetAttr(grant["attrs"]["ino"], grant["epoch"], name, ino, permission, owner,
                          group, mtime_ns, atime_ns, at)


@pytest.mark.slow
def test_attribute_changes_through_a_batch(tmp_path):
    """``dir_batch`` setattr: an entry's mode, owner and group, times, set as the calls set
    them (a file and a folder), its ctime the holder's time; a name that no longer holds
    the inode was changed since (a resend): skipped; what the holder's user may not do
    fails by index, checked as the call checks it, and the batch goes on; malformed
    records refuse the batch whole."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d/sub")
            a.write_file("/d/f", b"f", permission=0o640)
            a.write_file("/d/moved", b"m")
            a.mkdirs("/m")
            a.set_owner("/m", "mallory", None)
            mallorys = Client(cluster.meta_address, config=cluster.config(), user="mallory")
            with mallorys:
                mallorys.write_file("/m/hers", b"h", permission=0o644)
                m = mallorys.dir_lease_acquire("/m")
                hers = mallorys.get_file_status("/m/hers").ino
                # mallory owns /m/hers: chmod is hers to do, a new owner is not
                answer = mallorys.dir_batch([
                    set_attr(m, "hers", hers, time.time_ns(), owner="root"),
                    set_attr(m, "hers", hers, time.time_ns(), permission=0o600)])
                assert [(x["index"], x["error"]["type"]) for x in answer["failed"]] == [
                    (0, "PermissionDenied")]
                assert answer["done"] == 2
                mallorys.dir_lease_release("/m", m["epoch"])
            assert b.get_file_status("/m/hers").mode == 0o600
            d = a.dir_lease_acquire("/d")
            assert d["changes"] == list(dirops.KINDS) and "setattr" in d["changes"]
            ino = ino_of(d)
            at = time.time_ns() - 10**9
            ops = [set_attr(d, "f", ino["f"], at, permission=0o604, owner="alice",
                            group="staff", mtime_ns=10**17, atime_ns=2 * 10**17),
                   set_attr(d, "sub", ino["sub"], at, permission=0o1750, mtime_ns=3 * 10**17),
                   set_attr(d, "moved", ino["moved"], at, atime_ns=5)]
            assert a.dir_batch(ops) == {"done": 3, "skipped": 0, "failed": [], "ended": None}
            a.rename("/d/moved", "/d/moved2")   # the holder's own call: no recall
            again = a.dir_batch(ops)
            assert again["failed"] == [] and again["skipped"] == 1   # "moved" is gone
            good = ops[0].to_wire()
            for bad, why in (({**good, "perm": 0o20000}, "setattr perm"),
                             ({**good, "owner": 7}, "setattr owner"),
                             ({**good, "mtime": -1}, "setattr mtime"),
                             ({**good, "perm": None, "owner": None, "group": None,
                               "mtime": None, "atime": None}, "setattr must set")):
                with pytest.raises(InvalidArgument, match=why):
                    a.dir_batch([good, bad])
            a.dir_lease_release("/d", d["epoch"])
            f = b.get_file_status("/d/f")
            assert (f.mode, f.owner, f.group, f.mtime_ns, f.atime_ns, f.ctime_ns) == (
                0o604, "alice", "staff", 10**17, 2 * 10**17, at)
            sub = b.get_file_status("/d/sub")
            assert (sub.mode, sub.mtime_ns, sub.ctime_ns) == (0o1750, 3 * 10**17, at)
            assert b.get_file_status("/d/moved2").atime_ns == 5


@pytest.mark.slow
def test_folders_made_through_a_batch_come_with_their_lease(tmp_path):
    """``dir_batch`` mkdir: a folder made under a reserved inode id, as ``mkdirs`` makes
    it (mode, owner, group, the holder's time), and the holder's lease on it under the
    epoch it named (``child_epoch``), with the part of the range it handed: files are made
    in it in the same batch, and after a restart the lease is still there. An id or a
    range outside the lease's fails by index; a resend changes nothing."""
    with ProcessCluster(tmp_path, n_storage=0) as cluster:
        with cluster.client() as a, cluster.client() as b:
            a.mkdirs("/d")
            d = a.dir_lease_acquire("/d", want_inos=32)
            ids = reserved(d)
            at = time.time_ns() - 10**9
            top, epoch = d["attrs"]["ino"], d["epoch"]
            sub = ids[0]
            sub_grant = {"attrs": {"ino": sub}, "epoch": dirops.child_epoch(sub)}
            ops = [dirops.Mkdir(top, epoch, "sub", sub, 0o750, None, None, ids[1], 8, at),
                   create(sub_grant, "f", ids[1], at),
                   write(sub_grant, "f", ids[1], b"in sub", True, at),
                   dirops.Mkdir(sub, dirops.child_epoch(sub), "deeper", ids[2], 0o700,
                                None, None, 0, 0, at),
                   dirops.Mkdir(top, epoch, "stray", ids[-1] + 1, 0o755, None, None, 0, 0,
                                at),
                   dirops.Mkdir(top, epoch, "wide", ids[10], 0o755, None, None, ids[20],
                                40, at),
                   dirops.Mkdir(top, epoch, "sub", ids[12], 0o755, None, None, 0, 0, at),
                   # fresh ids for the new folder's lease, reserved by the server
                   dirops.Mkdir(top, epoch, "fresh", ids[13], 0o755, None, None, 0, 100,
                                at)]
            answer = a.dir_batch(ops)
            assert answer["done"] == len(ops) and answer["ended"] is None
            assert [(f["index"], f["error"]["type"]) for f in answer["failed"]] == [
                (4, "InvalidArgument"), (5, "InvalidArgument"), (6, "FileExists")]
            [granted] = answer["inos"]
            first, count = granted["inos"]
            assert granted["index"] == 7 and count == 100 and first > ids[-1]
            again = a.dir_batch(ops)
            assert again["ended"] is None and again["skipped"] == 5
            assert [f["index"] for f in again["failed"]] == [4, 5, 6]
            assert again["inos"] == answer["inos"]   # the same ids for a resend
            fresh = {"attrs": {"ino": ids[13]}, "epoch": dirops.child_epoch(ids[13])}
            assert a.dir_batch([create(fresh, "x", first, at),
                                write(fresh, "x", first, b"x", True, at)])["failed"] == []
            # the holder holds the new folders' leases under the epochs it named (asking
            # again answers the lease it holds), also after a restart
            assert a.dir_lease_acquire("/d/sub/deeper")["epoch"] == dirops.child_epoch(ids[2])
            restart_meta(cluster)
            again = a.dir_lease_acquire("/d/sub")
            assert (again["epoch"], again["inos"]) == (dirops.child_epoch(sub), [ids[1], 8])
            assert a.dir_batch([dirops.Release(ids[2], dirops.child_epoch(ids[2])),
                                dirops.Release(ids[13], dirops.child_epoch(ids[13])),
                                dirops.Release(sub, dirops.child_epoch(sub))])["skipped"] == 0
            assert a.dir_lease_release("/d", epoch) is True
            made = b.get_file_status("/d/sub")
            assert (made.ino, made.mode, made.is_dir, made.mtime_ns) == (sub, 0o750, True, at)
            assert (made.owner, made.group) == (b.get_file_status("/d").owner,
                                                b.get_file_status("/d").group)
            assert b.get_file_status("/d/sub/deeper").ino == ids[2]
            assert b.read_file("/d/sub/f") == b"in sub"
            assert names(b.list_status("/d")) == ["fresh", "sub"]
            assert names(b.list_status("/d/sub")) == ["deeper", "f"]
            assert b.read_file("/d/fresh/x") == b"x"
