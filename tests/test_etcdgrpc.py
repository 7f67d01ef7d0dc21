"""meta/ha/etcdgrpc.py: etcd's native gRPC API with the messages of meta/ha/etcdpb.

Against a REAL 3-member etcd (tests/etcd_cluster.py): answers read the same as the JSON
gateway's (an independent view of etcd), a message larger than etcd's flow-control windows
goes through, an error status comes back as an answer, a lease keepalive is one exchange
on its stream. Against hostile servers on loopback: a closed connection, a frame over the
size we allowed, a GOAWAY that did not take the request, an answer that never comes, a
malformed message: each a ``TransportError`` saying whether etcd may have seen the
request, never a hang or a crash. The committed generated code is what protoc makes of
the committed schema.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import signal
import struct
import urllib.request
import uuid

import hpack
import pytest
import trio

from etcd_cluster import ETCD, EtcdCluster
from fs import tcpliveness
from meta.ha import etcdgrpc
from meta.ha.etcdgrpc import TransportError
from meta.ha.etcdpb import rpc_pb2 as pb
from meta.ha.log import compare_create, op_put, op_range

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    if not os.path.exists(ETCD):
        pytest.skip(f"{ETCD} is not installed (Debian package etcd-server)")
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start()
    yield cluster
    cluster.stop()


def gateway(endpoint: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as answer:
        return json.load(answer)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def call(endpoint: str, message, timeout: float = 5.0, method=etcdgrpc.TXN):
    channel = etcdgrpc.Channel()
    try:
        return await channel.call(endpoint, method, message, timeout)
    finally:
        await channel.aclose()


def txn(compare=(), success=(), failure=()) -> pb.TxnRequest:
    return pb.TxnRequest(compare=compare, success=success, failure=failure)


def watch_request(key: bytes, range_end: bytes, start_revision: int) -> pb.WatchRequest:
    return pb.WatchRequest(create_request=pb.WatchCreateRequest(
        key=key, range_end=range_end, start_revision=start_revision,
        filters=[pb.WatchCreateRequest.NODELETE]))


def test_a_txn_answers_as_the_gateway_reads(etcd):
    endpoint = etcd.endpoints[0]
    key, other = f"/t/{uuid.uuid4().hex}".encode(), f"/t/{uuid.uuid4().hex}".encode()
    value = bytes(range(256)) * 3

    async def main():
        put = txn([compare_create(key, 0)], [op_put(key, value)])
        code, _, first = await call(endpoint, put)
        assert code == 0
        assert first.succeeded is True
        # the same compare again fails, and the failure branch reads both keys
        again = txn([compare_create(key, 0)], [op_put(key, b"never")],
                    [op_range(key), op_range(other)])
        code, _, second = await call(endpoint, again)
        assert code == 0
        return first, second

    first, second = trio.run(main)
    read = gateway(endpoint, "/v3/kv/range", {"key": b64(key)})
    assert str(first.header.revision) == read["kvs"][0]["create_revision"]
    assert not second.succeeded
    kv = second.responses[0].response_range.kvs[0]
    assert b64(kv.key) == read["kvs"][0]["key"]
    assert b64(kv.value) == read["kvs"][0]["value"]
    for field in ("create_revision", "mod_revision", "version"):
        assert str(getattr(kv, field)) == read["kvs"][0][field], field
    assert kv.value == value
    assert list(second.responses[1].response_range.kvs) == []


def test_a_message_larger_than_the_windows_goes_through(etcd):
    """1 MiB: more than etcd's 64 KiB initial stream and connection windows and its 16 KiB
    frames, so the call waits for its WINDOW_UPDATEs."""
    endpoint = etcd.endpoints[1]
    key = f"/t/{uuid.uuid4().hex}".encode()
    value = os.urandom(1 << 20)
    code, _, answer = trio.run(call, endpoint, txn(success=[op_put(key, value)]))
    assert code == 0 and answer.succeeded
    read = gateway(endpoint, "/v3/kv/range", {"key": b64(key)})
    assert base64.b64decode(read["kvs"][0]["value"]) == value


def test_an_error_status_is_an_answer_naming_it(etcd):
    key = f"/t/{uuid.uuid4().hex}".encode()
    code, message, answer = trio.run(call, etcd.endpoints[2], txn(
        success=[op_put(key, b"a"), op_put(key, b"b")]))
    assert code == 3 and "duplicate key" in message and answer is None, (code, message)


def test_a_lease_keepalive_is_one_exchange_on_its_stream(etcd):
    """LeaseKeepAlive is a bidirectional stream in etcd's API: one request with our side
    closed gets one answer and the stream's end, and the connection serves the next call;
    a lease that is gone answers TTL 0."""
    endpoint = etcd.endpoints[0]

    async def main():
        channel = etcdgrpc.Channel()
        try:
            _, _, grant = await channel.call(endpoint, etcdgrpc.LEASE_GRANT,
                                             pb.LeaseGrantRequest(TTL=30), 5)
            answers = []
            for _ in range(3):
                code, _, kept = await channel.call(endpoint, etcdgrpc.LEASE_KEEPALIVE,
                                                   pb.LeaseKeepAliveRequest(ID=grant.ID), 5)
                answers.append((code, kept.ID, kept.TTL))
            idle = channel.idle(endpoint)
            await channel.call(endpoint, etcdgrpc.LEASE_REVOKE,
                               pb.LeaseRevokeRequest(ID=grant.ID), 5)
            _, _, gone = await channel.call(endpoint, etcdgrpc.LEASE_KEEPALIVE,
                                            pb.LeaseKeepAliveRequest(ID=grant.ID), 5)
            return grant, answers, idle, gone
        finally:
            await channel.aclose()

    grant, answers, idle, gone = trio.run(main)
    assert grant.ID != 0 and grant.TTL == 30
    assert answers == [(0, grant.ID, 30)] * 3
    assert idle == 1
    assert gone.TTL == 0


def test_many_calls_share_one_connection(etcd):
    endpoint = etcd.endpoints[0]
    prefix = f"/t/{uuid.uuid4().hex}/".encode()

    async def main():
        channel = etcdgrpc.Channel()
        try:
            for i in range(300):
                code, _, _ = await channel.call(endpoint, etcdgrpc.TXN, txn(
                    success=[op_put(prefix + str(i).encode(), b"%d" % i)]), 5)
                assert code == 0
            return channel.idle(endpoint)
        finally:
            await channel.aclose()

    assert trio.run(main) == 1
    read = gateway(endpoint, "/v3/kv/range", {"key": b64(prefix), "count_only": True,
                                              "range_end": b64(prefix[:-1] + b"0")})
    assert read["count"] == "300"


def test_a_watch_sees_puts_only_and_ends_when_its_member_loses_the_leader(tmp_path):
    """The stream asks for etcd's require-leader: when 2 of 3 members stop, the third ends
    the watch instead of leaving it open and silent."""
    if not os.path.exists(ETCD):
        pytest.skip(f"{ETCD} is not installed (Debian package etcd-server)")
    cluster = EtcdCluster(tmp_path).start()
    prefix = b"/w/"
    lone = (cluster.raft_leader() + 1) % 3

    async def main():
        seen, ended = [], []
        channel = etcdgrpc.Channel()

        async def follow():
            request = watch_request(prefix, b"/w0", 1)
            try:
                async for message in channel.watch(cluster.endpoints[lone], etcdgrpc.WATCH,
                                                   request, 5):
                    for event in message.events:
                        seen.append((event.EventType.Name(event.type), event.kv.key))
            except TransportError as exc:
                ended.append((trio.current_time(), str(exc)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            for i in range(3):
                await trio.to_thread.run_sync(gateway, cluster.endpoints[0], "/v3/kv/put",
                                              {"key": b64(prefix + b"%d" % i), "value": "eA=="})
            await trio.to_thread.run_sync(gateway, cluster.endpoints[0], "/v3/kv/deleterange",
                                          {"key": b64(prefix + b"0")})
            with trio.fail_after(10):
                while len(seen) < 3:
                    await trio.sleep(0.05)
            stopped = trio.current_time()
            for i in range(3):
                if i != lone:
                    os.kill(cluster.procs[i].pid, signal.SIGSTOP)
            with trio.fail_after(15):
                while not ended:
                    await trio.sleep(0.05)
        await channel.aclose()
        return seen, ended[0][0] - stopped, ended[0][1]

    try:
        seen, after, why = trio.run(main)
    finally:
        cluster.resume()
        cluster.stop()
    assert seen == [("PUT", b"/w/0"), ("PUT", b"/w/1"), ("PUT", b"/w/2")]
    assert "leader" in why, why
    assert after < 15


def test_a_long_watch_gives_etcd_its_window_back(etcd, monkeypatch):
    """With a 256 KiB window instead of the largest, 4 MiB of watched puts arrive only if
    the stream hands the window back as it takes data in."""
    monkeypatch.setattr(etcdgrpc, "MAX_WINDOW", 256 << 10)
    monkeypatch.setattr(etcdgrpc, "REPLENISH", 64 << 10)
    prefix = f"/big/{uuid.uuid4().hex}/".encode()
    value = os.urandom(64 << 10)

    async def main():
        got = 0
        channel = etcdgrpc.Channel()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                async def put_all():
                    for i in range(64):
                        await trio.to_thread.run_sync(gateway, etcd.endpoints[0], "/v3/kv/put",
                                                      {"key": b64(prefix + b"%02d" % i),
                                                       "value": b64(value)})
                nursery.start_soon(put_all)
                request = watch_request(prefix, prefix[:-1] + b"0", 1)
                async for message in channel.watch(etcd.endpoints[1], etcdgrpc.WATCH,
                                                   request, 5):
                    for event in message.events:
                        assert event.kv.value == value
                        got += 1
                    if got == 64:
                        break
        await channel.aclose()
        return got

    assert trio.run(main) == 64


def test_a_malformed_answer_is_a_transport_error():
    """The bytes of a message that do not parse as the method's answer: an error that says
    etcd saw the request, not a crash and not a wrong answer."""
    async def malformed(stream):
        headers = hpack.Encoder()
        body = b"\xff" * 11
        await stream.send_all(
            frame(1, 0x4, 1, headers.encode([(":status", "200")]))
            + frame(0, 0, 1, b"\x00" + struct.pack(">I", len(body)) + body)
            + frame(1, 0x5, 1, headers.encode([("grpc-status", "0")])))
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError, match="malformed answer") as err:
        hostile(malformed)
    assert err.value.sent


# ---- hostile servers -------------------------------------------------------------------------

def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) \
        + struct.pack(">I", stream) + payload


async def serve_once(behaviour, task_status=trio.TASK_STATUS_IGNORED):
    """A server on loopback that reads the client's preface and first request, then acts."""
    async def handler(stream):
        data = b""
        with trio.move_on_after(5):
            while data.count(b"application/grpc") < 1 or len(data) < 100:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
        await behaviour(stream)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


def hostile(behaviour, timeout: float = 2.0):
    async def main():
        outcome: list = []
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_once, behaviour)
            try:
                with trio.fail_after(timeout + 5):
                    outcome.append(await call(f"http://127.0.0.1:{port}", txn(), timeout))
            except TransportError as exc:
                outcome.append(exc)
            nursery.cancel_scope.cancel()
        if isinstance(outcome[0], TransportError):
            raise outcome[0]
        return outcome[0]
    return trio.run(main)


def test_a_closed_connection_may_have_been_seen():
    async def close(stream):
        await stream.aclose()
    with pytest.raises(TransportError) as err:
        hostile(close)
    assert err.value.sent


def test_an_oversized_frame_is_refused():
    async def big(stream):
        await stream.send_all(struct.pack(">I", 1 << 20)[1:] + bytes((0, 0)) + b"\0\0\0\1")
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError, match="frame"):
        hostile(big)


def test_a_goaway_below_our_stream_was_not_seen():
    async def goaway(stream):
        await stream.send_all(frame(7, 0, 0, struct.pack(">II", 0, 0)))
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError) as err:
        hostile(goaway)
    assert not err.value.sent


def test_silence_ends_at_the_timeout():
    async def silent(stream):
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError, match="no answer within"):
        hostile(silent, timeout=0.5)


def test_a_trailers_only_error_and_garbage_headers():
    encoder = hpack.Encoder()
    block = encoder.encode([(":status", "200"), ("grpc-status", "14"),
                            ("grpc-message", "etcdserver: no leader")])

    async def unavailable(stream):
        # a SETTINGS and a PING first: both are acknowledged, the call goes on
        await stream.send_all(frame(4, 0, 0, struct.pack(">HI", 4, 1 << 20))
                              + frame(6, 0, 0, b"12345678")
                              + frame(1, 0x5, 1, block))
        await trio.sleep_forever()   # holds the connection open, answers nothing
    assert hostile(unavailable) == (14, "etcdserver: no leader", None)

    async def garbage(stream):
        await stream.send_all(frame(1, 0x5, 1, b"\xff\xff\xff\xff"))
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError, match="bad headers"):
        hostile(garbage)

    async def no_status(stream):
        await stream.send_all(frame(1, 0x5, 1, hpack.Encoder().encode([(":status", "200")])))
        await trio.sleep_forever()   # holds the connection open, answers nothing
    with pytest.raises(TransportError, match="without a grpc-status"):
        hostile(no_status)


def test_every_etcd_connection_is_under_tcp_liveness(etcd, monkeypatch):
    """The calls' kept-alive connections and a watch's own connection all get the kernel
    keepalive of ``tcp_liveness_timeout`` (``fs.tcpliveness``): a silent etcd host is
    noticed on every path to it."""
    opened = []
    real_open = trio.open_tcp_stream

    async def recording_open(*args, **kwargs):
        stream = await real_open(*args, **kwargs)
        opened.append(stream)
        return stream
    monkeypatch.setattr(trio, "open_tcp_stream", recording_open)
    idle, interval, count = tcpliveness.keepalive_plan(tcpliveness.timeout())

    async def main():
        channel = etcdgrpc.Channel()
        seen = []
        try:
            await channel.call(etcd.endpoints[0], etcdgrpc.LEASE_GRANT,
                               pb.LeaseGrantRequest(TTL=5), 5)
            async for message in channel.watch(etcd.endpoints[1], etcdgrpc.WATCH,
                                               watch_request(b"/live/", b"/live0", 0), 5):
                assert message.created
                for stream in opened:
                    sock = stream.socket
                    seen.append((sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
                                 sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                                 sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                                 sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)))
                break
        finally:
            await channel.aclose()
        return seen

    assert trio.run(main) == [(True, idle, interval, count)] * 2
