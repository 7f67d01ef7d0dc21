"""Block servers with several metadata servers (HA, the block-server side): real metadata
servers and real block servers in one trio run.

Two real metadata servers serve copies of one namespace (the second's data folder is a copy
of the first's, as a standby that followed the log would hold); HA switching is not part of
this, so each server's role and epoch are set by the test through ``MetaServer.ha`` (the
controller's slot) with ``SetRole``, which only answers ``role`` and ``status()``. Shown:

* every block server registers and reports to both: both blocks maps fill;
* a server that is not active hands out no commands, though it queues them;
* commands of a reply saying standby, or saying active in an epoch older than the newest
  active seen, are dropped (the replica survives) and counted; the active's are obeyed;
* calls that are not reports (``report_bad_blocks`` here) go to the active server only,
  move on when it answers ``StandbyError``, and fail after a short wait when no server is
  active (stand-in metadata servers: the real ones never answer ``StandbyError`` yet);
* after ``became_active`` no INVALIDATE goes to a block server before its fresh full report
  (asked for in the next heartbeat reply), then it does, also for a node registering for
  the first time after the takeover.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest

from harness import free_port, inprocess_cluster, make_test_config

from fs.client import AsyncClient
from fs.errors import ServerUnavailable, StandbyError
from fs.rpc import CallContext, Dispatcher, RpcClient, format_address, serve_rpc, serve_tcp
from fs.hastatus import HAStatus, Role
from meta.journal.kv import PlyvelStore
from meta.server import MetaServer
from storage.server import BlockServer

pytestmark = pytest.mark.timeout(120)

SETTINGS = {"security": "simple", "meta_socket": "", "storage_http_port": -1, "inline_max": 0}
CTX = CallContext(client_id="test", peer="127.0.0.1:1")


class SetRole:
    """Stands in for the HA controller in ``MetaServer.ha``: the role the server acts on
    (``is_active``), the status it sends (``claims``, normally the same role) and whether
    an active can vouch for its term (``sure``: its etcd lease is surely still held)."""

    def __init__(self, role: Role, epoch: int, node_id: str, claims: Role | None = None):
        self.role, self.epoch, self.node_id, self.claims = role, epoch, node_id, claims
        self.sure = True

    def sure_of_term(self) -> bool:
        return self.sure

    def status(self) -> HAStatus:
        return HAStatus(role=self.claims or self.role, epoch=self.epoch,
                        node_id=self.node_id, mode="test")

    def refusal(self) -> str:
        return f"metadata server {self.node_id} is {self.role.value} (epoch {self.epoch})"


@asynccontextmanager
async def meta_server(folder: Path, config, ha: SetRole):
    """A real MetaServer on ``folder`` serving RPC on a free port; yields (server, address)."""
    kv = PlyvelStore(str(folder / "db"))
    server = MetaServer(config, kv, str(folder / "journal"))
    server.ha = ha
    server.recover()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.journal.run)
            await server.start()
            nursery.start_soon(server.monitors.run_monitors)
            bound = await nursery.start(partial(
                serve_tcp, lambda stream, peer: serve_rpc(stream, server, peer=peer),
                "127.0.0.1", free_port(), name=f"metadata server {ha.node_id}"))
            yield server, format_address(bound)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await server.journal.aclose()
        kv.close()


async def start_block_server(nursery, config, data_dir: Path, meta_address: str) -> BlockServer:
    server = BlockServer(config, str(data_dir), meta_address=meta_address)
    await nursery.start(partial(server.run, "127.0.0.1", free_port()))
    return server


async def wait_for(predicate, what: str, timeout: float = 15.0) -> None:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_heartbeats(nodes, n: int, actor: int | None = None) -> None:
    """Until every block server sent ``n`` more heartbeats (to the metadata server at
    ``actor`` in its list, or to each) and read their replies: a command that was not
    carried out by then was not handed out, or was dropped."""
    def sent():
        return [x.heartbeats_sent for node in nodes for i, x in enumerate(node.heartbeat.actors)
                if actor is None or i == actor]
    before = sent()
    await wait_for(lambda: all(now >= was + n for now, was in zip(sent(), before)),
                   f"{n} more heartbeats from every block server")


def replicas_on(meta: MetaServer, block_id: int) -> int:
    info = meta.blocks.get(block_id)
    return 0 if info is None else len(info.replicas)


def held(nodes: list[BlockServer], block_id: int) -> list[bool]:
    return [block_id in node.store.replicas for node in nodes]


def dropped_from(node: BlockServer, address: str) -> int:
    return sum(a.dropped_commands for a in node.heartbeat.actors if a.address == address)


async def write_files(tmp_path: Path, config, names) -> dict[str, int]:
    """Files of one block on 3 block servers, written through a plain cluster (ha = none);
    returns path -> block id. The cluster is stopped after."""
    ids = {}
    async with inprocess_cluster(tmp_path, n_storage=3, **SETTINGS) as cluster:
        async with AsyncClient(cluster.meta_address, config=config) as client:
            for name in names:
                await client.write_file(name, name.encode() * 100, replication=3)
                located = await client.get_block_locations(name)
                ids[name] = located["blocks"][0]["block"]["id"]
    return ids


def fetch(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return answer.read().decode()


async def heartbeat(rpc: RpcClient, node_id: str) -> dict:
    return await rpc.call("heartbeat", {"node_id": node_id, "capacity": 1 << 40, "used": 0,
                                        "remaining": 1 << 40})


async def test_block_servers_report_to_every_server_and_obey_only_the_newest_active(tmp_path):
    config = make_test_config(**SETTINGS)

    async def main():
        names = ["/f1", "/f2", "/f3", "/f4"]
        ids = await write_files(tmp_path, config, names)
        # the standby's folder: a copy of the namespace, as if it had followed the log
        shutil.copytree(tmp_path / "meta", tmp_path / "meta-b")
        ha_a = SetRole(Role.ACTIVE, 2, "a")
        ha_b = SetRole(Role.STANDBY, 2, "b")
        async with meta_server(tmp_path / "meta", config, ha_a) as (a, addr_a), \
                meta_server(tmp_path / "meta-b", config, ha_b) as (b, addr_b), \
                trio.open_nursery() as nursery:
            nodes = [await start_block_server(nursery, config, tmp_path / f"storage{i}",
                                              f"{addr_a},{addr_b}") for i in range(3)]
            # 1. registered with both, and both blocks maps hold every replica
            await wait_for(lambda: all(r == 3 for m in (a, b) for r in
                                       (replicas_on(m, i) for i in ids.values())),
                           "both blocks maps to list 3 replicas of every block")
            await wait_for(lambda: not a.safemode.on and not b.safemode.on, "safe mode off")
            # a server lists a node's replicas before the node has read its answers
            await wait_for(lambda: all(x.registered for n in nodes for x in n.heartbeat.actors)
                           and all(n.heartbeat.full_reports_sent >= 2 for n in nodes),
                           "every block server's registration and report to both to finish")
            for node in nodes:
                assert [x.registered for x in node.heartbeat.actors] == [True, True]
                assert node.heartbeat.active_epoch == 2
                assert node.heartbeat.full_reports_sent >= 2   # one to each server
            assert len(a.datanodes.live_nodes()) == len(b.datanodes.live_nodes()) == 3

            # 2. a standby queues the deletion but hands out nothing
            await b.namespace_protocol.rpc_delete(CTX, "/f1")
            await wait_for(lambda: b.datanodes.invalidate_queued() == 3,
                           "the standby to queue 3 deletions of /f1's block")
            await wait_heartbeats(nodes, 10, actor=1)
            assert b.datanodes.invalidate_queued() == 3   # none handed out
            assert all(held(nodes, ids["/f1"]))
            assert sum(dropped_from(n, addr_b) for n in nodes) == 0

            # 3. a reply that says standby is not obeyed even when it carries commands
            ha_b.role, ha_b.claims = Role.ACTIVE, Role.STANDBY
            await wait_for(lambda: all(dropped_from(n, addr_b) >= 1 for n in nodes),
                           "every block server to drop the INVALIDATE of a 'standby'")
            assert b.datanodes.invalidate_queued() == 0   # handed out, and dropped
            await wait_heartbeats(nodes, 5)
            assert all(held(nodes, ids["/f1"]))

            # 4. an active of an older epoch is not obeyed either; the newest active is
            ha_b.epoch, ha_b.claims = 1, None
            await b.namespace_protocol.rpc_delete(CTX, "/f2")
            before = [dropped_from(n, addr_b) for n in nodes]
            await a.namespace_protocol.rpc_delete(CTX, "/f3")
            await wait_for(lambda: not any(held(nodes, ids["/f3"])),
                           "the active's INVALIDATE of /f3's replicas to be carried out")
            await wait_for(lambda: b.datanodes.invalidate_queued() == 0
                           and all(dropped_from(n, addr_b) > c for n, c in zip(nodes, before)),
                           "the INVALIDATE of the epoch-1 'active' to be handed out, and dropped")
            await wait_heartbeats(nodes, 5)
            assert all(held(nodes, ids["/f1"])) and all(held(nodes, ids["/f2"]))
            assert all(n.heartbeat.active_epoch == 2 for n in nodes)
            scraped = generate_latest(nodes[0].metrics_registry).decode()
            assert f'leasefs_storage_dropped_commands_total{{meta_server="{addr_b}"}}' \
                in scraped
            assert (f'leasefs_storage_commands_total{{meta_server="{addr_b}",outcome="dropped",'
                    f'type="INVALIDATE"}}') in scraped
            assert all(n.heartbeat.actors[1].commands["obeyed", "INVALIDATE"] == 0
                       for n in nodes)
            assert all(n.heartbeat.actors[0].commands["obeyed", "INVALIDATE"] >= 1
                       for n in nodes)
            assert "leasefs_storage_active_epoch 2.0" in scraped

            # 5. b takes over in epoch 3: its queued deletions go out after the fresh full
            # reports its heartbeats ask for, and a's (epoch 2) commands are now dropped
            reports_to_b = [n.heartbeat.actors[1].full_reports_sent for n in nodes]
            ha_b.epoch = 3
            b.became_active()
            assert all(b.datanodes.invalidation_postponed(n.store.node_id) for n in nodes)
            await wait_for(lambda: not any(held(nodes, ids["/f1"]) + held(nodes, ids["/f2"])),
                           "the new active's deletions of /f1 and /f2 to be carried out")
            assert all(n.heartbeat.actors[1].full_reports_sent > c
                       for n, c in zip(nodes, reports_to_b))
            assert not any(b.datanodes.invalidation_postponed(n.store.node_id) for n in nodes)
            assert all(n.heartbeat.active_epoch == 3 for n in nodes)
            before = [dropped_from(n, addr_a) for n in nodes]
            await a.namespace_protocol.rpc_delete(CTX, "/f4")
            await wait_for(lambda: all(dropped_from(n, addr_a) > c
                                       for n, c in zip(nodes, before)),
                           "the INVALIDATE of the deposed epoch-2 active to be dropped")
            await wait_heartbeats(nodes, 5)
            assert all(held(nodes, ids["/f4"]))
            nursery.cancel_scope.cancel()

    await main()


async def test_no_invalidate_after_takeover_before_a_fresh_full_report(tmp_path):
    """The server side, driven over RPC by a stand-in block server: a replica of no file
    is kept waiting by a standby (its log may not have caught up) and never deleted; a new
    active deletes it only after the node's full report that came after
    ``became_active``."""
    config = make_test_config(**SETTINGS)

    async def main():
        ha = SetRole(Role.STANDBY, 1, "b")
        async with meta_server(tmp_path / "meta", config, ha) as (server, address):
            async with RpcClient(address, "raw-nodes") as rpc:
                async def register(node_id, port):
                    reply = await rpc.call("register_storage", {
                        "node_id": node_id, "address": f"127.0.0.1:{port}",
                        "capacity": 1 << 40, "used": 0, "remaining": 1 << 40})
                    assert reply["ha"]["role"] == ha.status().role.value
                    assert reply["ha"]["epoch"] == ha.epoch

                async def report(node_id, block_id):
                    await rpc.call("block_report", {"node_id": node_id,
                                                    "blocks": [[block_id, 1, 10, "FINALIZED"]]})

                await register("n1", 9001)
                await report("n1", 999001)   # of no file: to be deleted
                await wait_for(lambda: not server.safemode.on, "safe mode off")
                reply = await heartbeat(rpc, "n1")
                assert reply["commands"] == [] and reply["ha"]["role"] == "standby"
                assert "full_report" not in reply
                # a follower takes a replica it does not know for one its log has not
                # explained yet: it waits, and nothing is queued for deletion
                assert server.datanodes.invalidate_queued() == 0
                assert len(server.reports.pending) == 1
                # what changes the active's decisions is refused: the caller moves on
                with pytest.raises(StandbyError, match="standby"):
                    # (at once: a client retries StandbyError within its budget)
                    await rpc.call("report_bad_blocks", {"blocks": [
                        {"block": {"id": 999001, "gs": 1}, "node_id": "n1"}]},
                        retry_seconds=0)

                ha.role, ha.epoch = Role.ACTIVE, 2
                server.became_active()
                reply = await heartbeat(rpc, "n1")
                assert reply["full_report"] is True and reply["commands"] == []
                assert reply["ha"] == {**reply["ha"], "role": "active", "epoch": 2}
                reply = await heartbeat(rpc, "n1")   # asked once; still nothing to delete
                assert "full_report" not in reply and reply["commands"] == []

                # a node registering for the first time after the takeover waits too
                await register("n2", 9002)
                await rpc.call("block_received_and_deleted", {
                    "node_id": "n2", "received": [[999002, 1, 10, "FINALIZED"]]})
                reply = await heartbeat(rpc, "n2")
                assert reply["commands"] == []

                for node_id, block_id in (("n1", 999001), ("n2", 999002)):
                    await report(node_id, block_id)
                    reply = await heartbeat(rpc, node_id)
                    assert reply["commands"] == [{"type": "INVALIDATE",
                                                  "blocks": [{"id": block_id, "gs": 1,
                                                              "num_bytes": 10}]}], reply

    await main()


async def test_an_active_unsure_of_its_term_hands_out_no_commands(tmp_path):
    """An active past the time it can vouch for its term (frozen or starved beyond its
    lease, its fence not run yet) answers heartbeats without commands: a block server that
    has not heard of a successor would obey them. The deletion stays queued, and goes out
    once the server is sure again (as when a keepalive was answered in time)."""
    config = make_test_config(**SETTINGS)

    async def main():
        ha = SetRole(Role.ACTIVE, 2, "a")
        async with meta_server(tmp_path / "meta", config, ha) as (server, address):
            async with RpcClient(address, "raw-nodes") as rpc:
                await rpc.call("register_storage", {
                    "node_id": "n1", "address": "127.0.0.1:9001",
                    "capacity": 1 << 40, "used": 0, "remaining": 1 << 40})
                await rpc.call("block_report", {"node_id": "n1",
                                                "blocks": [[999001, 1, 10, "FINALIZED"]]})
                await wait_for(lambda: not server.safemode.on, "safe mode off")
                # a replica of no file: the active queues its deletion
                await wait_for(lambda: server.datanodes.invalidate_queued() == 1,
                               "the deletion of the replica of no file to be queued")
                ha.sure = False
                reply = await heartbeat(rpc, "n1")
                assert reply["commands"] == [] and "block_keys" not in reply, reply
                assert server.datanodes.invalidate_queued() == 1
                ha.sure = True
                reply = await heartbeat(rpc, "n1")
                assert reply["commands"] == [{"type": "INVALIDATE", "blocks": [
                    {"id": 999001, "gs": 1, "num_bytes": 10}]}], reply

    await main()


class RoleMeta(Dispatcher):
    """A stand-in metadata server that says the role and epoch the test sets, takes every
    report, and answers ``report_bad_blocks`` with ``StandbyError`` while ``refuse``."""

    def __init__(self, role: Role, epoch: int, node_id: str):
        super().__init__()
        self.ha = SetRole(role, epoch, node_id)
        self.refuse = False
        self.bad_reports: list = []
        self.refused = 0

    def _status(self) -> dict:
        return self.ha.status().to_wire()

    async def rpc_register_storage(self, ctx, node_id, address, capacity, used, remaining,
                                   http_port=0, wall_time=None):
        return {"namespace_id": 7, "ha": self._status()}

    async def rpc_heartbeat(self, ctx, node_id, capacity, used, remaining, xceivers=0,
                            wall_time=None):
        return {"reregister": False, "commands": [], "ha": self._status()}

    async def rpc_block_report(self, ctx, node_id, blocks, report_id=None, chunk=0, last=True):
        return True

    async def rpc_block_received_and_deleted(self, ctx, node_id, received, deleted):
        return True

    async def rpc_report_bad_blocks(self, ctx, blocks):
        if self.refuse:
            self.refused += 1
            raise StandbyError(f"metadata server {self.ha.node_id} is not active")
        self.bad_reports.append(blocks)
        return True


async def start_role_meta(nursery, role: Role, epoch: int, node_id: str):
    meta = RoleMeta(role, epoch, node_id)
    bound = await nursery.start(partial(
        serve_tcp, lambda stream, peer: serve_rpc(stream, meta, peer=peer), "127.0.0.1", 0))
    return meta, format_address(bound)


async def test_calls_that_are_not_reports_go_to_the_active_server(tmp_path):
    config = make_test_config(**{**SETTINGS, "heartbeat_interval": 0.05,
                                 "storage_http_port": 0})
    bad = [({"id": 5, "gs": 1, "num_bytes": 3}, "checksum mismatch")]

    async def main():
        async with trio.open_nursery() as nursery:
            x, addr_x = await start_role_meta(nursery, Role.ACTIVE, 5, "x")
            y, addr_y = await start_role_meta(nursery, Role.STANDBY, 5, "y")
            node = await start_block_server(nursery, config, tmp_path / "dn", f"{addr_y},{addr_x}")
            await wait_for(lambda: [a.registered for a in node.heartbeat.actors] == [True, True]
                           and [a.obeyed for a in node.heartbeat.actors] == [False, True],
                           "registration with both, x known active")
            await node.heartbeat.report_bad_replicas(bad)
            assert len(x.bad_reports) == 1 and y.bad_reports == []
            # the block server's page lists both servers with their roles
            page = await trio.to_thread.run_sync(fetch, node.http_bound[1], "/")
            assert 'id="meta-servers"' in page and addr_x in page and "standby" in page
            status = json.loads(await trio.to_thread.run_sync(
                fetch, node.http_bound[1], "/api/v1/status"))
            assert [(m["address"], m["role"], m["obeyed"]) for m in status["meta_servers"]] \
                == [(addr_y, "standby", False), (addr_x, "active", True)]

            # x lost its term but does not say so in its heartbeats yet; y takes over in
            # epoch 6 a little later: the call moves on to y
            x.refuse = True

            async def takeover():
                # fixed-sleep: y takes over a little later, while the call retries on x:
                # the delay is the scenario, not a wait for it
                await trio.sleep(0.2)
                y.ha.role, y.ha.epoch = Role.ACTIVE, 6
            nursery.start_soon(takeover)
            await node.heartbeat.report_bad_replicas(bad)
            assert x.refused >= 1 and len(y.bad_reports) == 1
            assert node.heartbeat.active_epoch == 6

            # nobody active: a short wait, then an error naming the servers
            y.ha.role = Role.STANDBY
            await wait_for(lambda: not node.heartbeat.active_actors(), "no active server")
            with pytest.raises(ServerUnavailable, match="no active metadata server"):
                await node.heartbeat.report_bad_replicas(bad)
            nursery.cancel_scope.cancel()

    await main()


async def test_a_report_begun_before_the_takeover_does_not_count():
    """``DatanodeManager.start_epoch`` with the real ``BlockReports``: deletions handed out
    in the earlier term are queued again, and only a full report whose first chunk came
    after the takeover lets them go out."""
    from meta.blocks.blocks import BlocksMap
    from meta.blocks.datanodes import DatanodeManager
    from meta.blocks.reports import BlockReports

    async def main():
        datanodes = DatanodeManager(dead_interval=60, invalidate_limit=100)
        reports = BlockReports(BlocksMap(), datanodes, lambda: None)
        datanodes.register("n1", "127.0.0.1:9001", 1, 0, 1)
        await reports.full_report("n1", [(7, 1, 10, "FINALIZED")])   # of no file
        assert [r["id"] for r in datanodes.take_invalidate("n1")] == [7]   # handed out

        await reports.full_report("n1", [(8, 1, 10, "FINALIZED")], "r1", 0, last=False)
        assert datanodes.start_epoch() == 1
        assert datanodes.invalidation_postponed("n1")
        assert datanodes.invalidate_queued() == 2   # 8, and the earlier term's send of 7
        assert datanodes.full_report_wanted("n1") and not datanodes.full_report_wanted("n1")
        await reports.full_report("n1", [(7, 1, 10, "FINALIZED")], "r1", 1, last=True)
        assert datanodes.invalidation_postponed("n1")   # begun before the takeover
        assert datanodes.take_invalidate("n1") == []

        await reports.full_report("n1", [(7, 1, 10, "FINALIZED"), (8, 1, 10, "FINALIZED")])
        assert not datanodes.invalidation_postponed("n1")
        assert sorted(r["id"] for r in datanodes.take_invalidate("n1")) == [7, 8]

    await main()


async def test_a_block_server_process_registers_with_every_server_of_its_list(tmp_path):
    """The real command line (``python -m storage.server --meta A,B``) in its own process:
    it registers and reports to both servers, and obeys only the active one's epoch."""
    config = make_test_config(**SETTINGS)

    async def main():
        async with meta_server(tmp_path / "a", config,
                               SetRole(Role.ACTIVE, 4, "a")) as (a, addr_a), \
                meta_server(tmp_path / "b", config,
                            SetRole(Role.STANDBY, 4, "b")) as (b, addr_b):
            log_path = tmp_path / "dn.log"
            with open(log_path, "wb") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "storage.server", "--data", str(tmp_path / "dn"),
                     "--meta", f"{addr_a},{addr_b}", "--port", "0",
                     "--set", "security=simple", "--set", "storage_http_port=-1",
                     "--set", "heartbeat_interval=0.1"],
                    cwd=Path(__file__).resolve().parents[1], stdout=log_file,
                    stderr=subprocess.STDOUT)
            try:
                await wait_for(lambda: len(a.datanodes.live_nodes()) == 1
                               and len(b.datanodes.live_nodes()) == 1,
                               "the block server process to register with both servers", 30)
                node_id = a.datanodes.live_nodes()[0].node_id
                assert b.datanodes.live(node_id) is not None
                # a server counts the node live at registration; the node says so in its log
                # only after its first full block report, a moment later
                said = (f"registered with metadata server {addr_a}",
                        f"registered with metadata server {addr_b}", "is active in epoch 4")
                await wait_for(lambda: all(s in log_path.read_text() for s in said),
                               f"the block server's log to say {said}", 30)
            finally:
                proc.terminate()   # only the process this test started
                await trio.to_thread.run_sync(proc.wait, 30)

    await main()


async def test_a_follower_keeps_replicas_the_log_has_not_explained_yet():
    """A standby hears of a replica before the log entry of its block: it must wait for the
    log, not take it for a replica of no file (which would be deleted after a takeover)."""
    from meta.blocks.blocks import UNDER_CONSTRUCTION, BlockInfo, BlocksMap
    from meta.blocks.datanodes import DatanodeManager
    from meta.blocks.reports import BlockReports

    async def main():
        following = [True]
        blocks = BlocksMap()
        datanodes = DatanodeManager(dead_interval=60, invalidate_limit=100)
        reports = BlockReports(blocks, datanodes, lambda: None, following=lambda: following[0])
        datanodes.register("n1", "127.0.0.1:9001", 1, 0, 1)
        reports.incremental("n1", [(21, 1001, 10, "RBW")], [])          # block not known yet
        report = await reports.full_report("n1", [(21, 1001, 10, "RBW"),
                                                  (22, 1002, 10, "FINALIZED")])
        assert report.pending == 2 and report.doomed == 0
        assert datanodes.invalidate_queued() == 0 and reports.retry_pending() == 0
        blocks.add(BlockInfo(21, 5, 0, 1001, 0, UNDER_CONSTRUCTION, 3))   # the log catches up
        assert reports.retry_pending() == 1
        assert blocks.get(21).location_nodes() == ["n1"]
        blocks.add(BlockInfo(22, 6, 0, 1000, 0, UNDER_CONSTRUCTION, 3))   # an older stamp
        assert reports.retry_pending() == 0 and len(reports.pending) == 1
        # the active would invalidate a replica of no file at once; a new active drops
        # what still waits and leaves it to the fresh full reports
        following[0] = False
        assert reports.drop_pending() == 1
        reports.incremental("n1", [(23, 1003, 10, "FINALIZED")], [])
        assert datanodes.invalidate_queued() == 1

    await main()
