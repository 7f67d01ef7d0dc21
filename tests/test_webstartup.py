"""The metadata server's pages answer while it starts: the start-up progress (phase, journal
records replayed of how many) until it runs, then the pages themselves. A real server on a
real journal that has to be replayed, a real HTTP server, step by step."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import trio

from fs.rpc import CallContext
from fs.web import serve_app
from harness import inprocess_cluster, make_test_config
from meta.journal.kv import PlyvelStore
from meta.server import MetaServer
from meta.web.app import make_app
from meta.web.startup import StartupGate

DIRS = 1500


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_pages_show_the_journal_replay_until_the_server_runs(tmp_path):
    async def build():
        async with inprocess_cluster(tmp_path / "a", n_storage=0) as cluster:
            async with cluster.client() as client:
                for i in range(DIRS):
                    await client.mkdirs(f"/d{i // 100}/e{i}")

    trio.run(build)
    # a new store with the old journal: every record is replayed at start
    shutil.copytree(tmp_path / "a" / "meta" / "journal", tmp_path / "b" / "journal")
    config = make_test_config()

    async def main():
        kv = PlyvelStore(str(tmp_path / "b" / "db"))
        server = MetaServer(config, kv, str(tmp_path / "b" / "journal"))
        try:
            async with trio.open_nursery() as nursery:
                _, port = await nursery.start(
                    serve_app, StartupGate(make_app(server), server), "127.0.0.1", 0)

                async def get(path):
                    return await trio.to_thread.run_sync(_get, port, path)

                status, body = await get("/api/v1/startup")
                assert status == 200 and json.loads(body)["phase"] == "OPENING_JOURNAL"
                steps = server.recover_steps()
                next(steps)                    # journal opened, one chunk applied
                status, body = await get("/api/v1/startup")
                progress = json.loads(body)
                assert progress["phase"] == "REPLAYING_JOURNAL"
                assert progress["applied_txid"] == 0
                assert progress["to_replay"] >= DIRS and progress["last_txid"] >= DIRS
                assert 0 < progress["replayed"] < progress["to_replay"]
                status, body = await get("/")
                assert status == 503 and b"is starting" in body
                assert f"{progress['replayed']} of {progress['to_replay']}".encode() in body
                status, body = await get("/report")
                assert status == 503 and json.loads(body)["phase"] == "REPLAYING_JOURNAL"
                for _ in steps:
                    pass
                assert server.startup.replayed == progress["to_replay"]
                await nursery.start(server.journal.run)
                await server.start()
                status, body = await get("/api/v1/startup")
                done = json.loads(body)
                assert done["phase"] == "RUNNING"
                assert set(done["durations"]) == {"OPENING_JOURNAL", "REPLAYING_JOURNAL",
                                                  "LOADING_MEMORY"}
                status, body = await get("/report")
                report = json.loads(body)
                assert status == 200 and report["directories"] == DIRS + DIRS // 100 + 1
                info = await server.namespace_protocol.rpc_get_file_info(CallContext("t", "t"),
                                                                         path="/d3/e399")
                assert info["type"] == "dir"
                nursery.cancel_scope.cancel()
        finally:
            kv.close()

    trio.run(main)
