"""The metadata server's and block servers' web pages and JSON endpoints, in process:
every page renders, each JSON endpoint has its schema version, bad input gets a clear 4xx,
the viewer sees only what ``dr.who`` (secure) or ``user.name`` (simple) may, downloads
stream the file's bytes. The browser test (real Chromium) is ``test_webui.py``."""

from __future__ import annotations

import getpass
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from contextlib import asynccontextmanager
from functools import partial

import trio

from harness import free_port, make_test_config
from fs.client import AsyncClient
from meta.serverrun import run_meta_server
from storage.server import run_block_server

PAGES = ["/", "/datanodes", "/openfiles", "/explorer?path=/", "/fsck?path=/", "/logs"]
APIS = ["/api/v1/overview", "/api/v1/datanodes", "/api/v1/openfiles",
        "/api/v1/explorer?path=/", "/api/v1/fsck?path=/", "/api/v1/logs", "/api/v1/report",
        "/report"]


@asynccontextmanager
async def web_cluster(tmp_path, n_storage: int = 2, **overrides):
    """A metadata server with its web pages and ``n_storage`` block servers with theirs;
    yields (client config, meta address, web base URL)."""
    config = make_test_config(replication=min(2, n_storage), **overrides)
    http_port = free_port()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(partial(
            run_meta_server, config, str(tmp_path / "meta"), port=0, http_port=http_port))
        meta = f"{host}:{port}"
        for i in range(n_storage):
            await nursery.start(partial(
                run_block_server,
                config.replace(cluster_key_file=str(tmp_path / "meta" / "cluster.key")),
                str(tmp_path / f"dn{i}"), meta_address=meta, host="127.0.0.1", port=0))
        async with AsyncClient(meta, config=config) as c:
            with trio.fail_after(30):
                while len((await c.report())["live_nodes"]) < n_storage:
                    await trio.sleep(0.05)
        try:
            yield config, meta, f"http://127.0.0.1:{http_port}"
        finally:
            nursery.cancel_scope.cancel()


async def get(url: str) -> tuple[int, bytes, dict]:
    """(status, body, headers) of a GET, in a worker thread (urllib blocks)."""
    def fetch():
        try:
            with urllib.request.urlopen(url, timeout=20) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read(), dict(err.headers)
    return await trio.to_thread.run_sync(fetch)


def q(path: str) -> str:
    return urllib.parse.quote(path, safe="")


async def test_every_page_and_endpoint(tmp_path):
    data = os.urandom(300_000)

    async with web_cluster(tmp_path, security="simple") as (config, meta, base):
        async with AsyncClient(meta, config=config) as c:
            await c.mkdirs("/data/sub")
            await c.write_file("/data/big.bin", data)
            writer = await c.create("/data/open.txt")
            await writer.write(b"being written")
            for page in PAGES:
                status, body, headers = await get(base + page)
                assert status == 200, (page, body[:300])
                assert headers["content-type"].startswith("text/html")
                assert b"<nav>" in body and b"Traceback" not in body
            for api in APIS:
                status, body, _ = await get(base + api)
                assert status == 200, (api, body[:300])
                assert json.loads(body)["schema_version"] == 1, api
            over = json.loads((await get(base + "/api/v1/overview"))[1])
            assert over["files"] >= 2 and over["live_nodes"] == 2
            assert over["journal"]["last_txid"] > 0
            nodes = json.loads((await get(base + "/api/v1/datanodes"))[1])["nodes"]
            assert [n["state"] for n in nodes] == ["live", "live"]
            for node in nodes:   # each block server's own page, linked from ours
                status, body, _ = await get(node["web_url"])
                assert status == 200 and b"Replicas by state" in body
                status, body, _ = await get(node["web_url"] + "api/v1/status")
                st = json.loads(body)
                assert st["schema_version"] == 1 and st["volumes"][0]["capacity"] > 0
                assert "FINALIZED" in st["replicas_by_state"]
            opened = json.loads((await get(base + "/api/v1/openfiles"))[1])["files"]
            assert [f["path"] for f in opened] == ["/data/open.txt"]
            assert opened[0]["holder"] and opened[0]["hard_expires_in"] > 0
            folder = json.loads((await get(base + "/api/v1/explorer?path=/data"))[1])
            assert folder["kind"] == "folder"
            assert {e["name"] for e in folder["entries"]} == {"big.bin", "open.txt", "sub"}
            details = json.loads((await get(base + "/api/v1/explorer?path=/data/big.bin"))[1])
            assert details["kind"] == "file" and details["blocks"]
            block = details["blocks"][0]
            assert block["gs"] > 0 and len(block["locations"]) == 2
            status, body, _ = await get(base + "/explorer?path=/data/big.bin")
            assert f"blk_{block['id']}".encode() in body and b"Download" in body
            # a patch under way shows beside the block's stamp (its new version's stamp)
            patched = await c.open_for_patch("/data/big.bin")
            pending = await c.call_meta("patch_block", {
                "path": "/data/big.bin", "client_name": c.client_name, "ino": patched.ino,
                "block": {"id": block["id"], "gs": block["gs"]}})
            details = json.loads((await get(base + "/api/v1/explorer?path=/data/big.bin"))[1])
            assert details["blocks"][0]["patch_gs"] == pending["block"]["gs"]
            status, body, _ = await get(base + "/explorer?path=/data/big.bin")
            assert f"patch to {pending['block']['gs']} under way".encode() in body
            await writer.hflush()   # the other open file's block is listed without a patch
            status, body, _ = await get(base + "/fsck?path=/data")
            assert status == 200, body[:300]
            assert f"_{block['gs']} (patch to {pending['block']['gs']} under way)".encode() \
                in body
            await patched.close()   # the patch reached no replica: dropped at the close
            details = json.loads((await get(base + "/api/v1/explorer?path=/data/big.bin"))[1])
            assert details["blocks"][0]["patch_gs"] is None
            assert details["blocks"][0]["gs"] == block["gs"]
            status, body, headers = await get(base + "/download?path=/data/big.bin")
            assert status == 200 and body == data
            assert "big.bin" in headers["content-disposition"]
            logs = json.loads((await get(base + "/api/v1/logs"))[1])["lines"]
            assert any("registered" in line["message"] for line in logs)
            await writer.close()


async def test_bad_input_is_a_clear_4xx(tmp_path):
    async with web_cluster(tmp_path, n_storage=1, security="simple") as (config, meta, base):
        async with AsyncClient(meta, config=config) as c:
            await c.mkdirs("/d")
        cases = [("/explorer?path=/nope", 404), ("/api/v1/explorer?path=/nope", 404),
                 ("/explorer?path=relative", 400), ("/download?path=/d", 400),
                 ("/download", 400), ("/download?path=/nope", 404),
                 ("/fsck?path=/nope", 404), ("/logs?level=LOUD", 400),
                 ("/explorer?path=/" + "a" * 300, 400),
                 ("/explorer?path=/" + "a/" * 5000, 400),
                 ("/explorer?user.name=" + q("bad\nname"), 400)]
        for url, code in cases:
            status, body, headers = await get(base + url)
            assert status == code, (url, status, body[:300])
            assert b"Traceback" not in body and b"Internal" not in body
            if "/api/" in url:
                assert json.loads(body)["error"]
            else:
                assert b"error-message" in body


async def test_viewer_sees_only_what_it_may(tmp_path):
    """secure: the viewer is dr.who (no groups) whatever user.name says; simple: user.name
    acts as that user."""
    async with web_cluster(tmp_path, n_storage=1) as (config, meta, base):   # secure
        async with AsyncClient(meta, config=config) as c:
            await c.mkdirs("/public")
            await c.write_file("/public/f", b"for everyone")
            await c.mkdirs("/private")
            await c.write_file("/private/secret-name", b"not for dr.who")
            await c.set_permission("/private", 0o700)
            await c.set_permission("/public/f", 0o644)
            w = await c.create("/private/open-hidden")
            await w.write(b"x")
            # the server's own user (the superuser) named in user.name changes nothing
            for who in ("", "&user.name=" + getpass.getuser()):
                status, body, _ = await get(base + "/explorer?path=/private" + who)
                assert status == 403 and b"secret-name" not in body
            status, body, _ = await get(base + "/api/v1/explorer?path=/public")
            assert status == 200 and json.loads(body)["viewer"] == "dr.who"
            assert (await get(base + "/download?path=/public/f"))[1] == b"for everyone"
            assert (await get(base + "/download?path=/private/secret-name"))[0] == 403
            assert (await get(base + "/fsck?path=/"))[0] == 403
            opened = json.loads((await get(base + "/api/v1/openfiles"))[1])
            assert opened["files"] == [] and opened["hidden"] == 1
            for page in PAGES + APIS:
                status, body, _ = await get(base + page)
                assert b"secret-name" not in body and b"open-hidden" not in body, page
            await w.close()


async def test_user_name_acts_as_that_user_in_simple_mode(tmp_path):
    async with web_cluster(tmp_path, n_storage=1, security="simple") as (config, meta, base):
        async with AsyncClient(meta, config=config) as c:
            await c.mkdirs("/home/bob")
            await c.write_file("/home/bob/notes", b"bob's")
            await c.set_owner("/home/bob", "bob", None)
            await c.set_owner("/home/bob/notes", "bob", None)
            await c.set_permission("/home/bob", 0o700)
            await c.set_permission("/home/bob/notes", 0o600)
        assert (await get(base + "/explorer?path=/home/bob"))[0] == 403
        status, body, _ = await get(base + "/explorer?path=/home/bob&user.name=bob")
        assert status == 200 and b"notes" in body
        # links on bob's page keep him bob
        assert b"user.name=bob" in body
        got = await get(base + "/download?path=/home/bob/notes&user.name=bob")
        assert got[:2] == (200, b"bob's")
        assert (await get(base + "/download?path=/home/bob/notes&user.name=eve"))[0] == 403


async def test_every_answer_forbids_framing_and_logs_are_the_admins(tmp_path):
    """Every answer of both servers' web ports (pages, JSON, style sheet, errors) says it
    may not be framed and loads nothing foreign; under secure the unauthenticated viewer
    may not read the recent log lines (naming the superuser changes nothing)."""
    async with web_cluster(tmp_path, n_storage=1) as (config, meta, base):   # secure
        nodes = json.loads((await get(base + "/api/v1/datanodes"))[1])["nodes"]
        node = nodes[0]["web_url"]
        urls = [base + p for p in PAGES + APIS + ["/static/style.css", "/metrics",
                                                  "/explorer?path=/nope", "/no-such"]]
        urls += [node, node + "api/v1/status", node + "metrics", node + "nope"]
        for url in urls:
            _, _, headers = await get(url)
            headers = {k.lower(): v for k, v in headers.items()}
            assert headers.get("x-frame-options") == "DENY", url
            policy = headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy, url
        for page in ("/logs", "/api/v1/logs", "/logs?level=DEBUG",
                     "/logs?user.name=" + getpass.getuser()):
            status, body, _ = await get(base + page)
            assert status == 403, (page, body[:300])
            assert b"registered" not in body and b"Superuser privilege" in body
