"""Block access tokens on writes and copies (``security = secure``, the default; HDFS
``AccessMode`` WRITE and COPY): a block server writes, reopens, cuts or copies a replica only
for the holder of a token the metadata server made for that block, that stamp and that use.

Real metadata server and real block servers, in-process on loopback; the attacker is a plain
socket on a block server's data port, holding whatever real tokens an ordinary client can
get from the metadata server. What must hold, for every write and copy op (WRITE_BLOCK
stages CREATE, APPEND, STREAMING_RECOVERY, TRANSFER_RBW, TRANSFER_FINALIZED;
WRITE_BLOCK_ONESHOT; TRANSFER_BLOCK): no token, a forged or changed one, one for another
block or another stamp, one for another use (a read token for a write, a copy token for a
write) and an expired one are each refused with an ``InvalidToken`` answer naming the op and
the block, and no replica file changes; the same op with the right token is served. A
refused recovery or copy does not stop a running writer. Writes, appends, pipeline recovery
with a replacement node (after the writer's token expired) and re-replication after a node
died lose nothing, in secure mode and in simple mode (no tokens at all).
"""

from __future__ import annotations

import os
import random
import time

import pytest
import trio

from harness import inprocess_cluster

from fs.datatransfer import (FLAG_LAST, PIPELINE_SETUP_APPEND, PIPELINE_SETUP_CREATE,
                             PIPELINE_SETUP_STREAMING_RECOVERY, TRANSFER_BLOCK,
                             TRANSFER_FINALIZED, TRANSFER_RBW, WRITE_BLOCK, WRITE_BLOCK_ONESHOT,
                             chunk_checksums, encode_packet_header, op_header)
from fs.framing import FramedStream, encode_frame
from fs.rpc import parse_address

pytestmark = pytest.mark.timeout(120)

BPC = 512
LIFETIME = 3.0   # seconds a token lives here (long enough for a loaded machine's round trips)
# packets of 64 KiB: a file of a few of them goes through a pipeline, not in one message
SETTINGS = dict(inline_max=0, bytes_per_checksum=BPC, packet_size=64 << 10,
                block_token_lifetime=LIFETIME)
DATA = random.Random(7).randbytes(3000)   # one partial block, a partial last chunk too

WRITES = ("create", "append", "recovery", "oneshot")
COPIES = ("transfer_rbw", "transfer_finalized", "transfer_block")


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


async def ask(address: str, header: dict, packet: bytes = b"") -> dict:
    """Send an op header (and what follows it at once), answer the first response frame."""
    host, port = parse_address(address)
    framed = FramedStream(await trio.open_tcp_stream(host, port), 1 << 20)
    try:
        with trio.fail_after(20):
            await framed.send_all(encode_frame(header) + packet)
            return await framed.receive_frame()
    finally:
        await framed.aclose()


def replica_files(cluster) -> dict[str, bytes]:
    """Every replica file (data and meta, any state) of every block server, as on disk."""
    return {str(p): p.read_bytes() for folder in cluster.storage_dirs
            for p in sorted(folder.rglob("blk_*")) if p.is_file()}


async def copy_token(client, path: str, block_id: int, gs: int) -> dict:
    """What a writer replacing a pipeline node gets: a copy token for its block at ``gs``."""
    answer = await client.rpc.call("get_additional_datanode", {
        "path": path, "block": {"id": block_id, "gs": gs, "num_bytes": 0},
        "client_name": client.client_name})
    return answer["token"]


@pytest.mark.parametrize("op", WRITES + COPIES)
@pytest.mark.cluster(n_storage=3, **SETTINGS)
async def test_a_write_or_copy_without_the_right_token_is_refused_and_changes_nothing(cluster, op):
    """Block ``f`` of file /f is FINALIZED on two block servers (stamp ``old``); a writer
    appended to /f (the metadata server gave the block stamp ``new`` and a write token for
    it, the block servers were not touched). Writes name ``new`` (each would replace, reopen
    or cut the FINALIZED replica), copies name ``old`` (each would create a replica on the
    third server, or have a holder send one there). Every wrong token is refused with an
    answer naming the op, the block and why; no replica file changes; the right token is
    served (so the op was one that would have changed them)."""
    async with cluster.client() as owner, cluster.client() as writer:
        await owner.write_file("/f", DATA, replication=2)
        located = (await owner.get_block_locations("/f"))["blocks"][0]
        fid, old = located["block"]["id"], located["block"]["gs"]
        holders = [loc["address"] for loc in located["locations"]]
        spare = next(a for a in map(cluster.storage_address, range(3))
                     if a not in holders)
        read_old = located["token"]
        # real tokens of another block: its first block's write token, a copy token
        other = (await writer.rpc.call("create", {
            "path": "/other", "client_name": writer.client_name,
            "first_block": True}))["first_block"]
        write_other = other["token"]
        copy_other = await copy_token(writer, "/other", other["block"]["id"],
                                      other["block"]["gs"])
        # the writer reopens /f: a write token for the new stamp, a read token of it
        last = (await writer.rpc.call("append", {
            "path": "/f", "client_name": writer.client_name}))["last_block"]
        new, write_new = last["block"]["gs"], last["token"]
        read_new = (await owner.get_block_locations("/f"))["blocks"][0]["token"]
        # a write token of the same block for yet another stamp (a recovery's)
        write_later = (await writer.rpc.call("update_block_for_pipeline", {
            "block": last["block"], "client_name": writer.client_name}))["token"]
        copy_old = await copy_token(writer, "/f", fid, old)
        copy_new = await copy_token(writer, "/f", fid, new)
        assert {t["mode"] for t in (write_new, write_later, write_other)} == {"w"}
        assert {t["mode"] for t in (copy_old, copy_new, copy_other)} == {"c"}
        assert read_old["mode"] == read_new["mode"] == "r"

        def request(stamp: int) -> tuple[str, dict, bytes, str]:
            """(address, header, what follows it, op name in the answer)"""
            ref = {"id": fid, "gs": stamp}
            common = dict(block=ref, targets=[], client="attacker",
                          bytes_per_checksum=BPC)
            if op in ("create", "append", "recovery"):
                stage = {"create": PIPELINE_SETUP_CREATE,
                         "append": PIPELINE_SETUP_APPEND,
                         "recovery": PIPELINE_SETUP_STREAMING_RECOVERY}[op]
                header = op_header(WRITE_BLOCK, stage=stage, **common)
                if op != "create":
                    header["min_bytes"] = len(DATA)
                return holders[0], header, b"", f"{WRITE_BLOCK} {stage}"
            if op == "oneshot":
                evil = b"evil" * 100
                packet = (encode_packet_header(0, 0, len(evil), FLAG_LAST)
                          + chunk_checksums(evil, BPC) + evil)
                return (holders[0], op_header(WRITE_BLOCK_ONESHOT, **common), packet,
                        WRITE_BLOCK_ONESHOT)
            if op == "transfer_block":
                return holders[0], op_header(
                    TRANSFER_BLOCK, block={**ref, "num_bytes": len(DATA)},
                    targets=[spare], stage=TRANSFER_RBW, client="attacker"), b"", \
                    TRANSFER_BLOCK
            stage = TRANSFER_RBW if op == "transfer_rbw" else TRANSFER_FINALIZED
            return (spare, op_header(WRITE_BLOCK, stage=stage, **common), b"",
                    f"{WRITE_BLOCK} {stage}")

        if op in WRITES:
            stamp, mode, good = new, "w", write_new
            wrong = {"is for block": write_other, f"is for block {fid} stamp":
                     write_later, "is a read token": read_new,
                     "is a copy token": copy_new}
        else:
            stamp, mode, good = old, "c", copy_old
            wrong = {"is for block": copy_other, f"is for block {fid} stamp":
                     copy_new, "is a read token": read_old}
        attacks = [
            ("no block access token", None),
            ("signature does not match", {**good, "mac": os.urandom(32)}),
            # another block's real token, relabelled as this block's
            ("signature does not match", {**wrong["is for block"], "id": fid,
                                          "gs": stamp}),
            # a read token turned into this use, a longer life
            ("signature does not match", {**read_old, "gs": stamp, "mode": mode,
                                          "expiry": time.time() + 3600}),
            ("which this block server does not have", {**good, "key": 12345}),
            *wrong.items(),
        ]
        before = replica_files(cluster)
        spare_dir = str(cluster.storage_dirs[
            [cluster.storage_address(i) for i in range(3)].index(spare)])
        assert before and not any(p.startswith(spare_dir) for p in before)

        async def refused(why: str, token) -> None:
            address, header, packet, name = request(stamp)
            if token is not None:
                header["token"] = token
            response = await ask(address, header, packet)
            assert response["status"] == "ERROR", (why, response)
            assert response["error"]["type"] == "InvalidToken", (why, response)
            message = response["error"]["message"]
            assert message.startswith(f"{name} of block {fid} stamp {stamp}: "), \
                (why, message)
            assert why in message, (why, message)

        for why, token in attacks:
            await refused(why, token)
        # the right token, once it expired
        # fixed-sleep: until the token's wall-clock expiry passed; the block server
        # checks it against the real clock (no clock to inject there)
        await trio.sleep(max(0.0, good["expiry"] - time.time()) + 0.3)
        await refused("block access token expired", good)
        assert replica_files(cluster) == before

        # the same op with a fresh right token is served, and changes the replicas
        if op in WRITES:
            fresh = await writer.rpc.call("update_block_for_pipeline", {
                "block": last["block"], "client_name": writer.client_name})
            stamp, good = fresh["block"]["gs"], fresh["token"]
        else:
            good = await copy_token(writer, "/f", fid, old)
        address, header, packet, _ = request(stamp)
        response = await ask(address, {**header, "token": good}, packet)
        assert response["status"] == "SUCCESS", response
        with trio.fail_after(10):
            while replica_files(cluster) == before:
                await trio.sleep(0.05)


async def test_a_refused_recovery_or_copy_does_not_stop_a_running_writer(tmp_path):
    """A STREAMING_RECOVERY or a TRANSFER_BLOCK without a token, sent to the nodes of a
    pipeline being written, would stop its writer there (recovery stops the old pipeline,
    a copy stops it before reading): refused first, the writer never notices."""
    first, more = payload(3000, 1), payload(5000, 2)

    async with inprocess_cluster(tmp_path, n_storage=3, **SETTINGS) as cluster:
        async with cluster.client() as c:
            out = await c.create("/open", replication=2)
            await out.write(first)
            await out.hflush()
            located = (await c.get_block_locations("/open"))["blocks"][0]
            ref = {"id": located["block"]["id"], "gs": located["block"]["gs"]}
            nodes = [loc["address"] for loc in located["locations"]]
            spare = next(a for a in map(cluster.storage_address, range(3))
                         if a not in nodes)
            for address in nodes:
                recovery = op_header(WRITE_BLOCK, block={**ref, "gs": ref["gs"] + 1},
                                     targets=[], stage=PIPELINE_SETUP_STREAMING_RECOVERY,
                                     client="attacker", bytes_per_checksum=BPC,
                                     min_bytes=0)
                copy = op_header(TRANSFER_BLOCK, block={**ref, "num_bytes": len(first)},
                                 targets=[spare], stage=TRANSFER_RBW, client="attacker")
                for header in (recovery, copy):
                    response = await ask(address, header)
                    assert response["error"]["type"] == "InvalidToken", response
                    assert "no block access token" in response["message"]
            await out.write(more)
            await out.close()
            assert out.recoveries == 0
            assert await c.read_file("/open") == first + more


async def test_write_and_copy_tokens_go_only_to_the_writer_of_the_block(tmp_path):
    """Only the lease holder gets a block's write token for a new stamp or its copy token,
    a copy token only for the last block under construction at a stamp it has had, and
    no caller naming no lease gets one."""
    from fs.errors import LeaseExpired, StaleGenerationStamp

    async with inprocess_cluster(tmp_path, n_storage=3, **SETTINGS) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            await c.write_file("/closed", DATA, replication=2)
            closed = (await c.get_block_locations("/closed"))["blocks"][0]["block"]
            out = await c.create("/open", replication=2)
            await out.write(DATA)
            await out.hflush()
            block = (await c.get_block_locations("/open"))["blocks"][0]["block"]
            ref = {"id": block["id"], "gs": block["gs"], "num_bytes": 0}
            with pytest.raises(LeaseExpired):
                await other.rpc.call("update_block_for_pipeline", {
                    "block": ref, "client_name": other.client_name})
            with pytest.raises(LeaseExpired):
                await other.rpc.call("get_additional_datanode", {
                    "path": "/open", "block": ref, "client_name": other.client_name})
            anonymous = await other.rpc.call("get_additional_datanode", {
                "path": "/open", "block": ref})
            assert "token" not in anonymous and anonymous["locations"]
            with pytest.raises(StaleGenerationStamp, match="has stamp"):
                await copy_token(c, "/open", block["id"], block["gs"] + 1)
            with pytest.raises(StaleGenerationStamp, match="not the last block"):
                await copy_token(c, "/open", closed["id"], closed["gs"])
            token = await copy_token(c, "/open", block["id"], block["gs"])
            assert (token["id"], token["gs"], token["mode"]) == (block["id"], block["gs"],
                                                                 "c")
            await out.close()
            with pytest.raises(LeaseExpired):
                await copy_token(c, "/open", block["id"], block["gs"])


@pytest.mark.parametrize("security", ["secure", "simple"])
async def test_writes_appends_recoveries_and_re_replication_lose_nothing(tmp_path, security):
    """Four block servers, replication 3. Written, appended to; a file whose first block
    came with its create and was written after that block's token expired; a pipeline that
    outlived its token, then lost a node it shares with the first file (recovery with a
    replacement: a new stamp and token, a copy token for the TRANSFER_BLOCK); then the dead
    node's replicas are copied again (TRANSFER commands with copy tokens). Everything reads
    back; the copy is a real replica on the fourth server's disk. ``simple``: no token
    anywhere, all of it works the same."""
    a, a_more = payload(200_000, 3), payload(7_000, 4)
    late = {"/late-small": payload(4_000, 5), "/late-big": payload(300_000, 8)}
    b1, b2 = payload(60_000, 6), payload(90_000, 7)

    async with inprocess_cluster(tmp_path, n_storage=4, security=security, replication=3,
                                 **SETTINGS) as cluster:
        addresses = [cluster.storage_address(i) for i in range(4)]
        async with cluster.client() as c:
            await c.write_file("/a", a)
            out = await c.append("/a")
            await out.write(a_more)
            await out.close()
            located = (await c.get_block_locations("/a"))["blocks"][0]
            assert ("token" in located) == (security == "secure")
            holders_a = {loc["address"] for loc in located["locations"]}

            # one block in one message (WRITE_BLOCK_ONESHOT), one through a pipeline
            outs = {path: await c.create(path, first_block=True) for path in late}
            # fixed-sleep: the first blocks' tokens expire on the real wall clock
            await trio.sleep(LIFETIME + 0.5)
            for path, out in outs.items():
                await out.write(late[path])
                await out.close()
                assert not out._failed_nodes       # no node was blamed for it

            out = await c.create("/b")
            await out.write(b1)
            await out.hflush()
            # fixed-sleep: the pipeline's token expires on the real wall clock
            await trio.sleep(LIFETIME + 0.5)
            pipeline = [n["address"] for n in out._pipeline.nodes]
            victim = next(x for x in pipeline if x in holders_a)
            await cluster.stop_storage(addresses.index(victim))
            await out.write(b2)
            await out.close()
            assert out.recoveries >= 1 and out.replacements == 1

            assert await c.read_file("/a") == a + a_more
            for path, data in late.items():
                assert await c.read_file(path) == data
            assert await c.read_file("/b") == b1 + b2

            # the dead node's replica of /a is copied to the one server that lacks it
            spare = next(x for x in addresses if x not in holders_a)
            with trio.fail_after(60):
                while True:
                    now = (await c.get_block_locations("/a"))["blocks"][0]
                    where = {loc["address"] for loc in now["locations"]}
                    if spare in where and victim not in where:
                        break
                    await trio.sleep(0.2)
            folder = cluster.storage_dirs[addresses.index(spare)] / "finalized"
            copies = [p for p in folder.rglob(f"blk_{now['block']['id']}") if p.is_file()]
            assert [p.read_bytes() for p in copies] == [a + a_more]
            assert await c.read_file("/a") == a + a_more


def test_shared_key_rings_agree_without_talking_and_roll_together():
    """HA: two metadata servers with the same cluster key make tokens the other's keys
    accept, from the first moment and across a roll; another cluster key does not."""
    from fs.blocktoken import KeyRing, check
    from fs.errors import InvalidToken

    cluster_key = os.urandom(32)
    now = 1_800_000_123.0
    a = KeyRing(600.0, 300.0, now, shared=cluster_key)
    b = KeyRing(600.0, 300.0, now + 5.0, shared=cluster_key)
    assert a.version == b.version and [k.secret for k in a.keys()] == \
        [k.secret for k in b.keys()]
    token = a.token(7, 1001, "alice", "r", now)
    check({k.key_id: k.secret for k in b.keys()}, token, 7, 1001, "r", now + 1, "test")
    later = now + 650.0
    assert a.roll_if_due(later) and b.roll_if_due(later)
    assert a.version == b.version and a.current == b.current
    check({k.key_id: k.secret for k in b.keys()}, token, 7, 1001, "r", now + 2, "test")
    other = KeyRing(600.0, 300.0, now, shared=os.urandom(32))
    with pytest.raises(InvalidToken):
        check({k.key_id: k.secret for k in other.keys()}, token, 7, 1001, "r", now + 1, "test")


def test_block_keys_travel_wrapped_and_a_v1_wire_form_still_unwraps():
    """Form 2 (AES key wrap under a key derived from the cluster key) carries no secret in
    the clear and unwraps to the same key; a form-1 wire dict (the XOR pad a metadata server
    of the earlier release sends during a rolling restart) still unwraps."""
    import hashlib
    import hmac

    from fs.blocktoken import WRAP_LABEL, BlockKey, unwrap, wrap
    from fs.frames import packb

    cluster_key = os.urandom(32)
    key = BlockKey(4242, os.urandom(32), 1_800_000_900.5)
    wire = wrap(cluster_key, key)
    assert wire["v"] == 2 and "secret" not in wire and key.secret not in wire["wrapped"]
    assert unwrap(cluster_key, wire) == key
    pad = hmac.new(cluster_key, WRAP_LABEL + packb([key.key_id, key.expires]),
                   hashlib.sha256).digest()
    v1 = {"id": key.key_id, "expires": key.expires,
          "secret": bytes(a ^ b for a, b in zip(key.secret, pad))}
    assert unwrap(cluster_key, v1) == key


@pytest.mark.parametrize("change", ["wrapped", "id", "expires", "cluster key", "short",
                                    "version"])
def test_a_tampered_wrapped_block_key_is_refused(change):
    """A wrapped block key changed on the way (a bit of the wrapped secret, its id or its
    expiry), wrapped with another cluster's key, cut short or in an unknown form does not
    unwrap: ``InvalidToken`` saying why, never a key an attacker chose."""
    from fs.blocktoken import BlockKey, unwrap, wrap
    from fs.errors import InvalidToken

    cluster_key = os.urandom(32)
    wire = wrap(cluster_key, BlockKey(7, os.urandom(32), 1_800_000_000.0))
    if change == "wrapped":
        flipped = bytearray(wire["wrapped"])
        flipped[13] ^= 0x01
        wire["wrapped"] = bytes(flipped)
    elif change == "id":
        wire["id"] = 8
    elif change == "expires":
        wire["expires"] += 3600
    elif change == "cluster key":
        cluster_key = os.urandom(32)
    elif change == "short":
        wire["wrapped"] = wire["wrapped"][:-8]
    else:
        wire["v"] = 3
    match = {"short": "wrong size", "version": "wrap form 3"}.get(change, "does not unwrap")
    with pytest.raises(InvalidToken, match=match):
        unwrap(cluster_key, wire)


def test_a_block_server_refuses_tampered_block_keys_and_keeps_the_ones_it_holds(caplog):
    """A block server handed block keys of which one does not unwrap logs the refusal and
    keeps the keys (and version) it holds; the same keys untampered are taken."""
    import logging

    from harness import make_test_config

    from fs.blocktoken import KeyRing, wrap
    from storage.heartbeat import HeartbeatService

    cluster_key = os.urandom(32)
    service = HeartbeatService(make_test_config(), None, "127.0.0.1:1", key=cluster_key)
    taken = []
    service.on_block_keys = taken.append
    ring = KeyRing(600.0, 300.0, 1_800_000_000.0)
    good = {"version": ring.version, "keys": [wrap(cluster_key, k) for k in ring.keys()]}
    bad = {"version": ring.version + 1, "keys": [dict(w) for w in good["keys"]]}
    bad["keys"][-1]["wrapped"] = bytes(reversed(bad["keys"][-1]["wrapped"]))
    caplog.set_level(logging.WARNING, logger="storage.heartbeat")
    service.take_block_keys(good, "meta:1")
    service.take_block_keys(bad, "meta:1")
    assert taken == [{k.key_id: k.secret for k in ring.keys()}]
    assert service.block_keys_version == ring.version
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()] == [
        f"block keys from meta:1 refused (keeping the ones held): block key "
        f"{ring.next.key_id} does not unwrap with this cluster key (changed on the way, or "
        f"another cluster's key)"]
