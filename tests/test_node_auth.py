"""Block servers prove they hold the cluster key (``security = secure``, the default): the
block-server protocol refuses everyone else.

Real metadata server and real block servers, in-process on loopback; the attackers are plain
RPC clients on the same port. What must hold: a block server with the key registers and
works; without it (no authentication, a wrong key, a proof recorded on another connection,
a challenge answered twice, a node acting for another) every block-server call is refused
with ``AuthenticationFailed`` and nothing changes (no fake live node, no report); a reader
may report a bad replica only of a file it may read; a metadata server that cannot prove
the key back is not obeyed.
"""

from __future__ import annotations

import os

import pytest
import trio

from harness import inprocess_cluster, recover_until_closed, wait_until

from fs import nodeauth
from fs.errors import AuthenticationFailed, PermissionDenied
from fs.rpc import RpcClient
from storage.server import run_block_server

pytestmark = pytest.mark.timeout(120)

NODE_CALLS = [
    ("register_storage", {"node_id": "evil", "address": "127.0.0.1:1", "capacity": 1 << 40,
                          "used": 0, "remaining": 1 << 40}),
    ("heartbeat", {"node_id": "evil"}),
    ("block_report", {"node_id": "evil", "blocks": []}),
    ("block_received_and_deleted", {"node_id": "evil", "received": [], "deleted": []}),
    ("commit_block_synchronization", {"block": {"id": 1, "gs": 1}, "recovery_id": 2,
                                      "new_length": 0}),
]


async def live_nodes(client) -> list[str]:
    report = await client.report()
    return sorted(n["node_id"] for n in report["live_nodes"])


@pytest.mark.cluster(n_storage=1)
async def test_only_block_servers_with_the_cluster_key_are_taken(cluster):
    key = nodeauth.load_key(str(cluster.meta_dir / "cluster.key"))
    assert os.stat(cluster.meta_dir / "cluster.key").st_mode & 0o077 == 0
    async with cluster.client() as c:
        before = await live_nodes(c)
        assert len(before) == 1                  # the real one authenticated
        await c.write_file("/f", b"x" * 100_000)
        assert await c.read_file("/f") == b"x" * 100_000

        # a plain client: every block-server call refused, nothing changes
        async with RpcClient(cluster.meta_address, "attacker") as rpc:
            for method, args in NODE_CALLS:
                with pytest.raises(AuthenticationFailed, match="authenticated block"):
                    await rpc.call(method, args)
        assert await live_nodes(c) == before

        # a wrong key, a replayed proof, a challenge answered twice, another node
        wrong = os.urandom(nodeauth.KEY_BYTES)
        async with RpcClient(cluster.meta_address, "attacker") as rpc:
            nonce = await rpc.call("node_challenge")
            mine = os.urandom(nodeauth.NONCE_BYTES)
            with pytest.raises(AuthenticationFailed, match="refused"):
                await rpc.call("node_authenticate", {
                    "node_id": "evil", "client_nonce": mine,
                    "proof": nodeauth.node_proof(wrong, nonce, mine, "evil")})
            with pytest.raises(AuthenticationFailed):
                await rpc.call(*NODE_CALLS[0])
            # what a real node sent on another connection, with that challenge
            recorded = nodeauth.node_proof(key, nonce, mine, "evil")
        async with RpcClient(cluster.meta_address, "attacker") as rpc:
            await rpc.call("node_challenge")    # a new challenge, not the recorded one
            with pytest.raises(AuthenticationFailed, match="refused"):
                await rpc.call("node_authenticate", {
                    "node_id": "evil", "client_nonce": mine, "proof": recorded})
            with pytest.raises(AuthenticationFailed, match="refused"):
                await rpc.call("node_authenticate", {
                    "node_id": "evil", "client_nonce": mine, "proof": recorded})
        async with RpcClient(cluster.meta_address, "node-a") as rpc:
            nonce = await rpc.call("node_challenge")
            answer = await rpc.call("node_authenticate", {
                "node_id": "node-a", "client_nonce": mine,
                "proof": nodeauth.node_proof(key, nonce, mine, "node-a")})
            assert nodeauth.same(answer, nodeauth.meta_proof(key, nonce, mine,
                                                             "node-a"))
            with pytest.raises(AuthenticationFailed, match="not node-b"):
                await rpc.call("heartbeat", {"node_id": "node-b"})
            with pytest.raises(AuthenticationFailed, match="refused"):
                await rpc.call("node_authenticate", {   # its challenge is used up
                    "node_id": "node-a", "client_nonce": mine,
                    "proof": nodeauth.node_proof(key, nonce, mine, "node-a")})
        assert await live_nodes(c) == before


@pytest.mark.cluster(n_storage=1)
async def test_a_block_server_with_another_key_is_never_registered(tmp_path, cluster, caplog):
    other = tmp_path / "other.key"
    nodeauth.ensure_key(str(other))
    config = cluster.config.replace(cluster_key_file=str(other))
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_block_server(
            config, str(tmp_path / "impostor"), meta_address=cluster.meta_address,
            host="127.0.0.1", port=0, task_status=task_status))
        # until the impostor's registration failed (it goes on trying with backoff)
        assert await wait_until(lambda: any(
            r.name == "storage.heartbeat" and "retrying with backoff" in r.getMessage()
            for r in caplog.records), timeout=30)
        async with cluster.client() as c:
            assert len(await live_nodes(c)) == 1
        nursery.cancel_scope.cancel()


@pytest.mark.cluster(n_storage=2, replication=2)
async def test_a_reader_reports_bad_replicas_only_of_files_it_may_read(cluster):
    async with cluster.client() as owner:
        await owner.write_file("/open.bin", b"o" * 100_000)
        await owner.write_file("/secret.bin", b"s" * 100_000)
        await owner.set_permission("/secret.bin", 0o600)
        located = {p: (await owner.get_block_locations(p))["blocks"][0]
                   for p in ("/open.bin", "/secret.bin")}
    async with cluster.client(user="mallory", groups=["mallory"]) as other:
        secret = located["/secret.bin"]
        with pytest.raises(PermissionDenied):
            await other.rpc.call("report_bad_blocks", {"blocks": [{
                "block": secret["block"],
                "node_id": secret["locations"][0]["node_id"]}]})
        opened = located["/open.bin"]
        assert await other.rpc.call("report_bad_blocks", {"blocks": [{
            "block": opened["block"], "node_id": opened["locations"][0]["node_id"]}]})
    async with cluster.client() as owner:   # fsck is the superuser's
        fsck = await owner.rpc.call("fsck", {"path": "/secret.bin"})
        assert fsck["totals"]["corrupt_replicas"] == 0


async def test_a_block_server_does_not_obey_a_server_that_cannot_prove_the_key(tmp_path):
    """The last step of the exchange, driven by a stand-in for the server's two answers:
    a wrong or missing proof back is refused before any other call goes out."""
    from fs.config import Config
    from storage.heartbeat import HeartbeatService

    key = os.urandom(nodeauth.KEY_BYTES)

    class Store:
        node_id = "node-a"

    service = HeartbeatService(Config(), Store(), "127.0.0.1:1", key=key)

    for answer in (os.urandom(32), None, b""):
        async def call(method, args, answer=answer):
            return os.urandom(32) if method == "node_challenge" else answer
        with pytest.raises(AuthenticationFailed, match="did not prove"):
            await service.authenticate(call)
    sent = {}

    async def honest(method, args):
        if method == "node_challenge":
            sent["nonce"] = os.urandom(32)
            return sent["nonce"]
        return nodeauth.meta_proof(key, sent["nonce"], args["client_nonce"], "node-a")
    await service.authenticate(honest)


async def test_recovery_ops_between_block_servers_must_be_signed_with_the_cluster_key(tmp_path):
    """INIT_REPLICA_RECOVERY stops a replica's writer and UPDATE_REPLICA_UNDER_RECOVERY cuts
    it: sent to a block server's data port by anyone but a block server of the cluster
    (unsigned, signed with another key, changed after signing, or replayed after the
    window) they are refused and the replica keeps its bytes; lease recovery between the
    real block servers (signed) still works."""
    import time

    from fs.datatransfer import op_header
    from fs.errors import PipelineError
    from storage.recovery import (INIT_REPLICA_RECOVERY, UPDATE_REPLICA_UNDER_RECOVERY,
                                  call_recovery_op)

    data = os.urandom(100_000)

    async with inprocess_cluster(tmp_path, n_storage=3) as cluster:
        key = nodeauth.load_key(str(cluster.meta_dir / "cluster.key"))
        async with cluster.client() as c, cluster.client() as other:
            await c.write_file("/kept", data, replication=3)
            located = (await c.get_block_locations("/kept"))["blocks"][0]
            block, target = located["block"], located["locations"][0]["address"]
            ref = {"id": block["id"], "gs": block["gs"]}
            attacks = [
                op_header(INIT_REPLICA_RECOVERY, block=ref, recovery_id=block["gs"] + 50),
                nodeauth.sign_op(os.urandom(32), op_header(
                    INIT_REPLICA_RECOVERY, block=ref, recovery_id=block["gs"] + 50),
                    time.time()),
                {**nodeauth.sign_op(key, op_header(
                    UPDATE_REPLICA_UNDER_RECOVERY, block=ref, recovery_id=block["gs"] + 50,
                    new_length=len(data)), time.time()), "new_length": 1},
                nodeauth.sign_op(key, op_header(
                    UPDATE_REPLICA_UNDER_RECOVERY, block=ref, recovery_id=block["gs"] + 50,
                    new_length=1), time.time() - 3600),
            ]
            for header in attacks:
                with pytest.raises(AuthenticationFailed):
                    await call_recovery_op(target, header, 10)
            assert await other.read_file("/kept") == data

            # the real thing: a writer dies, lease recovery runs signed ops between nodes
            out = await c.create("/recovered", replication=3)
            await out.write(data)
            await out.hflush()
            out.abort(PipelineError("writer died"))
            await recover_until_closed(other, "/recovered", timeout=60)
            assert await other.read_file("/recovered") == data


async def test_block_servers_serve_reads_only_with_a_valid_block_access_token(tmp_path):
    """security = secure: READ_BLOCK (and BLOCK_LENGTH) need the metadata server's token,
    which it hands only to callers that may read the file. Without one, with one forged,
    changed, made for another block, with an unknown key or expired, a block server refuses
    with InvalidToken; a reader whose token expired gets fresh ones by itself, also across
    rolled block keys."""
    import time

    from fs.errors import InvalidToken
    from fs.reader import Block, BlockReader

    secret, shared = os.urandom(100_000), os.urandom(70_000)

    async def read_raw(located: dict, token="keep") -> bytes:
        wire = dict(located) if token == "keep" else {**located, "token": token}
        block = Block.from_wire(wire)
        reader = await BlockReader.connect(block, block.locations[0], 0, block.num_bytes,
                                           timeout=10, connect_timeout=10,
                                           max_frame=1 << 22)
        try:
            return await reader.read(block.num_bytes)
        finally:
            await reader.aclose()

    async with inprocess_cluster(tmp_path, n_storage=2, replication=2,
                                 block_token_lifetime=3.0,
                                 block_key_interval=2.0) as cluster:
        async with cluster.client() as owner, \
                cluster.client(user="mallory", groups=["mallory"]) as mallory:
            await owner.write_file("/secret.bin", secret)
            await owner.set_permission("/secret.bin", 0o600)
            await owner.write_file("/shared.bin", shared)
            mine = (await owner.get_block_locations("/secret.bin"))["blocks"][0]
            theirs = (await mallory.get_block_locations("/shared.bin"))["blocks"][0]
            assert await read_raw(mine) == secret[:len(await read_raw(mine))]
            with pytest.raises(PermissionDenied):
                await mallory.get_block_locations("/secret.bin")
            token = theirs["token"]
            attacks = {
                "no block access token": None,
                "is for block": token,                                    # another block
                "signature does not match": {**mine["token"], "mode": "rw",
                                             "expiry": time.time() + 3600},
                "does not have": {**mine["token"], "key": 12345},
            }
            for why, forged in attacks.items():
                with pytest.raises(InvalidToken, match=why):
                    await read_raw({**mine, "locations": mine["locations"]}, forged)
            # fixed-sleep: the token's lifetime is over on the real wall clock
            await trio.sleep(3.5)
            with pytest.raises(InvalidToken, match="expired|does not have"):
                await read_raw(mine)

            # a reader holding expired tokens, across key rolls: fresh ones by itself
            async with await owner.open("/shared.bin") as stream:
                assert await stream.read(1000) == shared[:1000]
                for round_ in range(4):   # past the lifetime: refetched
                    # fixed-sleep: each round outlives a token on the real wall clock
                    await trio.sleep(1.2)
                    assert await stream.pread(0, len(shared)) == shared
            assert await mallory.read_file("/shared.bin") == shared


async def test_a_reader_rides_a_metadata_server_restart_with_its_new_block_keys(tmp_path):
    """A restarted metadata server makes new block keys, which its block servers get with
    their registration answer (before their block reports, so before any token made with
    them can name them): the open stream's tokens then name a key no block server keeps,
    and the stream fetches fresh ones by itself."""
    data = os.urandom(150_000)

    async with inprocess_cluster(tmp_path, n_storage=2, replication=2,
                                 heartbeat_interval=1.0) as cluster:
        async with cluster.client() as c:
            await c.write_file("/kept.bin", data)
            stream = await c.open("/kept.bin")
            assert await stream.pread(0, 100) == data[:100]
            await cluster.stop_meta()
            await cluster.start_meta()
            await cluster.wait_ready(2)   # registered again: the old keys are gone
            assert await stream.pread(0, len(data)) == data
            assert await c.read_file("/kept.bin") == data
            await stream.close()


async def test_no_secret_shows_on_the_status_page_or_in_the_logs(tmp_path, caplog):
    """The cluster key and a delegation token's password never appear on any web page or
    JSON endpoint of the metadata server and of a block server, nor in any log line of
    servers that authenticated, handed out tokens and served reads."""
    import json
    import logging
    import urllib.error
    import urllib.request
    from functools import partial

    from harness import free_port, make_test_config
    from meta.serverrun import run_meta_server

    caplog.set_level(logging.DEBUG)
    config = make_test_config(replication=1)
    http_port = free_port()

    async def main():
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(partial(
                run_meta_server, config, str(tmp_path / "meta"), port=0, http_port=http_port))
            meta = f"{host}:{port}"
            await nursery.start(lambda task_status: run_block_server(
                config.replace(cluster_key_file=str(tmp_path / "meta" / "cluster.key")),
                str(tmp_path / "dn"), meta_address=meta, host="127.0.0.1", port=0,
                task_status=task_status))
            from fs.client import AsyncClient
            async with AsyncClient(meta, config=config) as c:
                with trio.fail_after(30):
                    while not (await c.report())["live_nodes"]:
                        await trio.sleep(0.05)
                await c.write_file("/f", os.urandom(100_000))
                await c.read_file("/f")
                got = await c.rpc.call("get_delegation_token", {})
            # a client elsewhere authenticating with that delegation token
            from fs.delegation import TokenFile, TokenId
            token = TokenFile(TokenId.from_wire(got["id"]), bytes(got["password"]), meta)
            token.save(str(tmp_path / "t.token"))
            async with AsyncClient(meta, config=config.replace(
                    meta_socket="", token_file=str(tmp_path / "t.token"))) as remote:
                await remote.read_file("/f")
            def fetch(url):
                try:
                    return urllib.request.urlopen(url, timeout=10).read()
                except urllib.error.HTTPError as err:   # a 4xx page is a page too
                    return err.read()
            base = f"http://127.0.0.1:{http_port}"
            urls = [base + p for p in (
                "/report", "/", "/datanodes", "/openfiles", "/explorer?path=/",
                "/explorer?path=/f", "/download?path=/f", "/fsck?path=/", "/logs?level=DEBUG",
                "/api/v1/report", "/api/v1/overview", "/api/v1/datanodes",
                "/api/v1/openfiles", "/api/v1/explorer?path=/f", "/api/v1/fsck?path=/",
                "/api/v1/logs?level=DEBUG", "/metrics", "/explorer?path=/nope")]
            nodes = json.loads(await trio.to_thread.run_sync(fetch, base + "/api/v1/datanodes"))
            for node in nodes["nodes"]:   # each block server's own page
                urls += [node["web_url"], node["web_url"] + "api/v1/status",
                         node["web_url"] + "metrics"]
            assert len(urls) == 21
            page = b"\n".join([await trio.to_thread.run_sync(fetch, url) for url in urls])
            nursery.cancel_scope.cancel()
        return page, token.secret

    page, password = await main()
    key = nodeauth.load_key(str(tmp_path / "meta" / "cluster.key"))
    secrets_ = [key, key.hex().encode(), password, password.hex().encode()]
    logged = "\n".join(r.getMessage() for r in caplog.records).encode()
    assert b"live_nodes" in page and "authenticated from" in logged.decode()
    assert "authenticated from" in logged.decode() and "with token 1 of" in logged.decode()
    for secret in secrets_:
        assert secret not in page and secret not in logged
