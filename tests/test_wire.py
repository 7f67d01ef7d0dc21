"""The shared core: frames, RPC, retry cache, error family, path rules, settings."""

from __future__ import annotations

import errno
import random
import struct

import msgpack
import pytest
import trio
import trio.testing

from harness import wait_until

from fs import datatransfer, errors, paths
from fs.config import Config, describe, find_meta_address
from fs.framing import LENGTH, FrameChannel, FramedStream, encode_frame
from fs.rpc import (Dispatcher, RetryCache, RpcClient, parse_address, serve_rpc, serve_tcp)


# --------------------------------------------------------------------------- errors


def test_every_error_round_trips_with_class_and_errno():
    for name, cls in errors.error_classes().items():
        exc = cls(f"/some/path: {name}")
        back = errors.from_wire(msgpack.unpackb(msgpack.packb(exc.to_wire())))
        assert type(back) is cls
        assert back.errno == cls.errno and back.message == f"/some/path: {name}"


def test_unknown_or_junk_error_objects_become_base_errors():
    back = errors.from_wire({"type": "FromTheFuture", "errno": 99, "message": "m"})
    assert type(back) is errors.LeaseFSError and back.errno == 99 and "m" in str(back)
    assert isinstance(errors.from_wire("junk"), errors.ProtocolError)


def test_errnos_match_posix_meanings():
    assert errors.FileNotFound.errno == errno.ENOENT
    assert errors.FileExists.errno == errno.EEXIST
    assert errors.DirectoryNotEmpty.errno == errno.ENOTEMPTY
    assert errors.AlreadyBeingCreated.errno == errno.EBUSY
    assert errors.SafeMode.retriable and not errors.FileNotFound.retriable


# --------------------------------------------------------------------------- framing


def _pair():
    left, right = trio.testing.memory_stream_pair()
    return FramedStream(left, max_frame=1024), FramedStream(right, max_frame=1024)


async def test_frames_round_trip_and_oversize_is_refused_unread():
    a, b = _pair()
    await a.send_frame({"k": [1, b"\x00bytes", "str"]})
    assert await b.receive_frame() == {"k": [1, b"\x00bytes", "str"]}
    await a.send_all(struct.pack(">I", 1 << 31))
    with pytest.raises(errors.FrameTooLarge, match="exceeds the maximum of 1024"):
        await b.receive_frame()


async def test_truncated_and_garbage_frames_are_protocol_errors():
    a, b = _pair()
    await a.send_all(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")  # 0xc1 is never valid
    with pytest.raises(errors.ProtocolError, match="not valid msgpack"):
        await b.receive_frame()
    await a.send_all(struct.pack(">I", 10) + b"abc")
    await a.aclose()
    with pytest.raises(errors.ProtocolError, match="inside a frame"):
        await b.receive_frame()


async def test_receive_exactly_across_many_small_chunks():
    a, b = _pair()
    payload = bytes(range(256)) * 10000
    async with trio.open_nursery() as nursery:
        async def sender():
            for i in range(0, len(payload), 777):
                await a.send_all(payload[i:i + 777])
        nursery.start_soon(sender)
        assert await b.receive_exactly(len(payload)) == payload


@pytest.mark.parametrize("bpc", [512, 4096, 516, 6])
def test_whole_packet_checksum_check_agrees_with_chunk_by_chunk(bpc):
    """``checksums_match`` checks all of a packet's chunk CRCs with whole-buffer calls: it
    must accept exactly what the chunk-by-chunk comparison accepts, for full and partial last
    chunks, and catch every flipped bit of the data or of the sums."""
    rng = random.Random(bpc)
    for n in (0, 1, bpc - 1, bpc, 3 * bpc + 7, 65024, 65024 + 100):
        data = rng.randbytes(n)
        sums = datatransfer.chunk_checksums(data, bpc)
        assert datatransfer.checksums_match(data, sums, bpc)
        datatransfer.verify_checksums(data, sums, bpc)
        for _ in range(8 if n else 0):
            bad = bytearray(data)
            pos = rng.randrange(n)
            bad[pos] ^= 1 << rng.randrange(8)
            assert not datatransfer.checksums_match(bytes(bad), sums, bpc)
            with pytest.raises(errors.ChecksumError, match=f"at offset {pos - pos % bpc}"):
                datatransfer.verify_checksums(bytes(bad), sums, bpc)
            bad_sums = bytearray(sums)
            bad_sums[rng.randrange(len(sums))] ^= 1 << rng.randrange(8)
            assert not datatransfer.checksums_match(data, bytes(bad_sums), bpc)
            # two chunks swapped with their sums unchanged: each chunk is checked in place
            if n >= 2 * bpc and data[:bpc] != data[bpc:2 * bpc]:
                swapped = data[bpc:2 * bpc] + data[:bpc] + data[2 * bpc:]
                assert not datatransfer.checksums_match(swapped, sums, bpc)
    with pytest.raises(errors.ChecksumError, match="wrong length"):
        datatransfer.verify_checksums(b"x" * bpc, datatransfer.chunk_checksums(
            b"x" * (2 * bpc), bpc), bpc)


async def test_packets_and_acks_round_trip_and_checksums_catch_flips():
    a, b = _pair()
    data = bytes(range(256)) * 40  # 10240 bytes, 3 chunks of 4096
    sums = datatransfer.chunk_checksums(data, 4096)
    assert len(sums) == 12
    await datatransfer.send_packet(a, 7, 8192, data, sums, datatransfer.FLAG_SYNC)
    pkt = await datatransfer.receive_packet(b, 4096)
    assert (pkt.seqno, pkt.offset, pkt.data, pkt.sync, pkt.last) == (7, 8192, data, True, False)
    datatransfer.verify_checksums(pkt.data, pkt.sums, 4096)
    bad = bytearray(data)
    bad[5000] ^= 1
    with pytest.raises(errors.ChecksumError, match="at offset 12288"):
        datatransfer.verify_checksums(bad, sums, 4096, base_offset=8192)
    await datatransfer.send_ack(a, 7, [0, 0, 2])
    assert await datatransfer.receive_ack(b) == (7, [0, 0, 2])
    await a.send_all(datatransfer.encode_packet_header(1, 0, 1 << 30, 0))
    with pytest.raises(errors.ProtocolError, match="claims"):
        await datatransfer.receive_packet(b, 4096)


# --------------------------------------------------------------------------- RPC


class Echo(Dispatcher):
    retry_cached = frozenset({"bump"})

    def __init__(self):
        super().__init__()
        self.bumps = 0

    async def rpc_echo(self, ctx, value):
        return value

    async def rpc_sleep(self, ctx, seconds):
        await trio.sleep(seconds)   # fixed-sleep: the call's simulated duration
        return seconds

    async def rpc_missing(self, ctx, path):
        raise errors.FileNotFound(f"{path}: no such file or directory")

    async def rpc_bug(self, ctx):
        raise ZeroDivisionError("oops")

    async def rpc_blob(self, ctx, size):
        return b"x" * size

    async def rpc_bump(self, ctx):
        self.bumps += 1
        await trio.sleep(0.05)   # fixed-sleep: simulated work, so that calls overlap
        return self.bumps


async def _serve(nursery, dispatcher):
    return await nursery.start(serve_tcp, lambda s, p: serve_rpc(s, dispatcher, peer=p),
                               "127.0.0.1", 0)


@pytest.mark.allow_log_errors(r"RPC 'bug' from .* failed \| Traceback: ZeroDivisionError: oops",
                                reason="the test's handler raises to check the error reaches the caller")
async def test_rpc_many_calls_in_flight_and_errors_rebuilt():
    async with trio.open_nursery() as nursery:
        addr = await _serve(nursery, Echo())
        async with RpcClient(addr, "c1") as rpc:
            with trio.fail_after(3):  # 50 calls of 0.5 s on one connection: concurrent
                async with trio.open_nursery() as calls:
                    for _ in range(50):
                        calls.start_soon(rpc.call, "sleep", {"seconds": 0.5})
            with pytest.raises(errors.FileNotFound, match="/a/b: no such file"):
                await rpc.call("missing", {"path": "/a/b"})
            with pytest.raises(errors.InternalError, match="ZeroDivisionError"):
                await rpc.call("bug")
            with pytest.raises(errors.UnknownMethod):
                await rpc.call("nope")
            with pytest.raises(errors.InvalidArgument, match="unexpected keyword|got an unexpected"):
                await rpc.call("echo", {"value": 1, "extra": 2})
            assert await rpc.call("echo", {"value": {"still": "serving"}}) == {"still": "serving"}
        nursery.cancel_scope.cancel()


async def test_retry_cache_applies_a_retried_call_once():
    async def main():
        server = Echo()
        async with trio.open_nursery() as nursery:
            addr = await _serve(nursery, server)
            # the same (client, call id) on two connections at once (a retry racing the
            # original on a new connection), and once more afterwards: applied once, same
            # answer every time
            async with RpcClient(addr, "c1") as rpc, RpcClient(addr, "c1") as retry:
                retry.client_id = rpc.client_id        # the same client, a second connection
                results = []

                async def call(client):
                    results.append(await client.call_once("bump", {}, 42, 5))
                async with trio.open_nursery() as n2:
                    n2.start_soon(call, rpc)
                    n2.start_soon(call, retry)
                assert results == [1, 1]
                await rpc._conn.channel.aclose()          # reconnect, then retry again
                # the client's reader saw the closed channel
                assert await wait_until(lambda: not rpc.connected, timeout=10)
                assert await rpc.call_once("bump", {}, 42, 5) == 1
                assert server.bumps == 1
            # two clients that merely share a name (and count call ids from 1 alike) are
            # never answered from each other's cache entries
            async with RpcClient(addr, "same-name") as one, RpcClient(addr, "same-name") as two:
                assert one.client_id != two.client_id
                assert await one.call_once("bump", {}, 7, 5) == 2
                assert await two.call_once("bump", {}, 7, 5) == 3
            nursery.cancel_scope.cancel()

    await main()


async def test_retry_cache_expires_entries_and_reruns_failed_calls():
    now = [0.0]
    cache = RetryCache(expiry=10, max_entries=50, clock=lambda: now[0])
    calls = []

    async def failing():
        calls.append(1)
        raise errors.SafeMode("/x: in safe mode")

    for _ in range(2):
        with pytest.raises(errors.SafeMode):
            await cache.run(("c", 1), failing)
    assert len(calls) == 2                     # a failure is not cached: the retry re-runs
    assert await cache.run(("c", 1), lambda: _value(5)) == 5
    assert await cache.run(("c", 1), failing) == 5   # a success is answered from the cache
    for i in range(20):
        await cache.run(("c", 100 + i), lambda: trio.sleep(0))
    assert len(cache) == 21
    now[0] = 100                               # everything so far has expired
    await cache.run(("c", 500), lambda: trio.sleep(0))
    assert len(cache) == 1 and ("c", 1) not in cache._entries
    for i in range(80):                        # over max_entries: the oldest go
        await cache.run(("c", 1000 + i), lambda: trio.sleep(0))
    assert len(cache) == 50 and ("c", 1079) in cache._entries
    assert ("c", 1000) not in cache._entries


async def test_retry_cache_held_calls_wait_for_the_notes_of_the_look_back():
    """While held (a restart's look back), ``run`` waits; a call noted before the release
    is then rebuilt, not run a second time."""
    cache = RetryCache(expiry=10)
    ran = []

    async def first_run():
        ran.append("run")
        return "ran again"

    async def rebuild(kept):
        return ("rebuilt", kept)

    cache.hold()
    got = []

    async def retry():
        got.append(await cache.run(("c", 1, "create"), first_run, rebuild))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(retry)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and ran == []
        cache.note_all([(("c", 1, "create"), "kept")])
        cache.release()
    assert got == [("rebuilt", "kept")] and ran == []


async def test_retry_cache_duplicate_waits_for_the_running_call():
    """A duplicate arriving while the first call runs waits for it: a success is answered
    from the cache (the call ran once), a failure lets the duplicate run it again."""
    cache = RetryCache(expiry=10)
    release = trio.Event()
    calls = []

    async def slow(result):
        calls.append(result)
        await release.wait()
        if isinstance(result, Exception):
            raise result
        return result

    got = []

    async def call(key, result):
        try:
            got.append(await cache.run(key, lambda: slow(result)))
        except errors.SafeMode as exc:
            got.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, ("c", 1), 7)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, ("c", 1), 8)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert got == [7, 7] and calls == [7]
    release2 = trio.Event()

    async def failing_then(result):
        calls.append(result)
        await release2.wait()
        if result == "fail":
            raise errors.SafeMode("/x: in safe mode")
        return result

    got.clear()

    async def first():
        with pytest.raises(errors.SafeMode):
            await cache.run(("c", 2), lambda: failing_then("fail"))
        got.append("failed")

    async def duplicate():
        got.append(await cache.run(("c", 2), lambda: failing_then("ok")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(duplicate)
        await trio.testing.wait_all_tasks_blocked()
        release2.set()
    assert got == ["failed", "ok"] and calls[-2:] == ["fail", "ok"]


async def _value(v):
    return v


async def test_rpc_client_reconnects_after_server_restart():
    first = trio.CancelScope()

    async def first_server(task_status=trio.TASK_STATUS_IGNORED):
        with first:   # a scope around nursery.start would not reach the started task
            await serve_tcp(lambda s, p: serve_rpc(s, Echo(), peer=p), "127.0.0.1", 0,
                            task_status=task_status)

    async with trio.open_nursery() as outer:
        addr = await outer.start(first_server)
        async with RpcClient(addr, "c1", retry_seconds=5) as rpc:
            assert await rpc.call("echo", {"value": 1}) == 1
            first.cancel()
            # the cancelled server closed the connection
            assert await wait_until(lambda: not rpc.connected, timeout=10)

            async def restart_later():
                await trio.sleep(0.3)   # fixed-sleep: the outage the client retries across
                await outer.start(serve_tcp, lambda s, p: serve_rpc(s, Echo(), peer=p),
                                  "127.0.0.1", addr[1])
            outer.start_soon(restart_later)
            assert await rpc.call("echo", {"value": 2}) == 2
        outer.cancel_scope.cancel()


async def test_rpc_client_gives_up_with_a_clear_error():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    async with RpcClient(f"127.0.0.1:{port}", "c1", retry_seconds=0.3) as rpc:
        with pytest.raises(errors.ServerUnavailable, match=f"cannot reach 127.0.0.1:{port}"):
            await rpc.call("echo", {"value": 1})


async def test_server_survives_garbage_connections():
    async with trio.open_nursery() as nursery:
        addr = await _serve(nursery, Echo())
        for garbage in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x03abc", b"GET / HTTP/1.0\r\n\r\n",
                        encode_frame({"hello": "nope"}), encode_frame([1, 2, 3])):
            stream = await trio.open_tcp_stream(*addr)
            await stream.send_all(garbage)
            framed = FramedStream(stream)
            with trio.fail_after(5):
                try:
                    reply = await framed.receive_frame()
                    assert reply[1] is False
                    assert reply[2]["type"] in ("FrameTooLarge", "ProtocolError")
                except (EOFError, errors.ServerUnavailable):
                    pass
            await stream.aclose()
        async with RpcClient(addr, "ok") as rpc:
            assert await rpc.call("echo", {"value": "alive"}) == "alive"
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- paths, config


@pytest.mark.parametrize("bad", ["", "a/b", "/a//b", "//", "/a/./b", "/a/../b", "/..",
                                 "/a\0b", 123, None])
def test_invalid_paths(bad):
    with pytest.raises(errors.InvalidPath):
        paths.split(bad)


def test_path_limits_and_canonical_forms():
    assert paths.split("/") == []
    assert paths.validate("/a/b/") == "/a/b"
    assert paths.split("/a/b c/ü") == ["a", "b c", "ü"]
    paths.split("/" + "x" * 255)
    with pytest.raises(errors.NameTooLong):
        paths.split("/" + "x" * 256)
    with pytest.raises(errors.NameTooLong):
        paths.split("/" + "é" * 128)  # 256 UTF-8 bytes
    deep = ("/" + "x" * 199) * 40     # 8000 characters: HDFS's longest path
    assert len(paths.split(deep)) == 40
    with pytest.raises(errors.NameTooLong):
        paths.split(deep + "/y")
    assert paths.normalize_user_path("b/../c//d/", cwd="/a") == "/a/c/d"
    assert paths.join("/", "x") == "/x" and paths.parent("/a/b") == "/a"
    assert paths.is_ancestor("/a", "/a/b") and not paths.is_ancestor("/a", "/ab")


def test_config_precedence_and_types(tmp_path):
    conf = tmp_path / "leasefs.toml"
    conf.write_text('replication = 2\nblock_size = 1048576\n')
    env = {"LEASEFS_REPLICATION": "1", "LEASEFS_HEARTBEAT_INTERVAL": "0.5"}
    c = Config.load(str(conf), env=env, heartbeat_interval=0.25)
    assert (c.replication, c.block_size, c.heartbeat_interval) == (1, 1 << 20, 0.25)
    with pytest.raises(errors.InvalidArgument, match="unknown setting 'nope'"):
        Config.load(env={}, nope=1)
    with pytest.raises(errors.InvalidArgument, match="not a int"):
        Config.load(env={"LEASEFS_REPLICATION": "three"})
    assert all(doc for _, _, doc in describe())


def test_meta_address_discovery(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"LEASEFS_HOME": str(home)}
    assert find_meta_address(env=env) == "127.0.0.1:8020"
    (home / "cluster.json").write_text('{"meta_address": "127.0.0.1:4242"}')
    assert find_meta_address(env=env) == "127.0.0.1:4242"
    assert find_meta_address(env={**env, "LEASEFS_META": "h:1"}) == "h:1"
    assert find_meta_address("x:2", env=env) == "x:2"
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(errors.InvalidArgument):
        parse_address("host:notaport")


def test_frames_that_explode_when_decoded_are_refused():
    from fs.framing import unpackb

    # 4 M empty arrays in 4 MiB: would be ~4 M Python lists; refused while decoding
    bomb = b"\xdd" + struct.pack(">I", 4 << 20) + b"\x90" * (4 << 20)
    with pytest.raises(errors.ProtocolError, match="nests more than"):
        unpackb(bomb)
    # a real block report of 100k entries decodes fine
    report = [[i, 1001, 4 << 20, "FINALIZED"] for i in range(100_000)]
    assert unpackb(msgpack.packb(report)) == report


async def test_oversized_hello_is_refused_before_anything_else():
    async with trio.open_nursery() as nursery:
        addr = await _serve(nursery, Echo())
        stream = await trio.open_tcp_stream(*addr)
        framed = FramedStream(stream)
        await framed.send_frame({"hello": "leasefs", "client_id": "x" * 10_000})
        with trio.fail_after(5):
            reply = await framed.receive_frame()
        assert reply[2]["type"] == "FrameTooLarge"
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_one_call_timing_out_does_not_fail_the_others():
    async with trio.open_nursery() as nursery:
        addr = await _serve(nursery, Echo())
        async with RpcClient(addr, "c1") as rpc:
            outcome = {}

            async def slow():
                outcome["slow"] = await rpc.call("sleep", {"seconds": 1.0}, timeout=10)

            async def impatient():
                # fixed-sleep: sends this call after the slow one, whose deadline is
                # earlier; the server double marks no call as started
                await trio.sleep(0.05)
                start = trio.current_time()
                with pytest.raises(errors.RpcTimeout, match="within 0.2 s"):
                    await rpc.call("sleep", {"seconds": 5.0}, timeout=0.2)
                assert trio.current_time() - start < 1.0    # on time, not at the 10 s
                outcome["impatient"] = "timed out alone"
            async with trio.open_nursery() as calls:
                calls.start_soon(slow)
                calls.start_soon(impatient)
            assert outcome == {"slow": 1.0, "impatient": "timed out alone"}
        nursery.cancel_scope.cancel()


class Gauge(Dispatcher):
    def __init__(self):
        super().__init__()
        self.running = self.peak = 0

    async def rpc_work(self, ctx):
        self.running += 1
        self.peak = max(self.peak, self.running)
        await trio.sleep(0.05)   # fixed-sleep: simulated work, so that calls overlap
        self.running -= 1
        return True


async def test_calls_in_flight_per_connection_are_bounded():
    gauge = Gauge()
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(
            serve_tcp, lambda s, p: serve_rpc(s, gauge, peer=p, max_concurrent_calls=3),
            "127.0.0.1", 0)
        async with RpcClient(addr, "c1") as rpc:
            async with trio.open_nursery() as calls:
                for _ in range(20):
                    calls.start_soon(rpc.call, "work")
        assert gauge.peak == 3
        nursery.cancel_scope.cancel()


class Starting(Dispatcher):
    """In safe mode for its first two calls, like a metadata server that just restarted."""

    retry_cached = frozenset({"create"})

    def __init__(self):
        super().__init__()
        self.attempts = 0

    async def rpc_create(self, ctx, path):
        self.attempts += 1
        if self.attempts <= 2:
            raise errors.SafeMode(f"create {path}: safe mode is ON")
        return path


async def test_retriable_server_errors_are_retried_with_the_same_call_and_rerun():
    async def main():
        server = Starting()
        async with trio.open_nursery() as nursery:
            addr = await _serve(nursery, server)
            async with RpcClient(addr, "plain", retry_seconds=5) as rpc:
                with pytest.raises(errors.SafeMode):      # not opted in: the caller sees it
                    await rpc.call("create", {"path": "/a"})
            async with RpcClient(addr, "patient", retry_seconds=5,
                                 retry_errors=(errors.SafeMode,)) as rpc:
                assert await rpc.call("create", {"path": "/a"}) == "/a"
            assert server.attempts == 3      # the failed attempt was not answered from cache
            nursery.cancel_scope.cancel()

    await main()


# --------------------------------------------------------------------------- FrameChannel


async def _stream_pair(kind: str):
    """Two connected streams: a real loopback TCP pair (the socket path of FrameChannel) or
    trio's in-memory pair (the generic path)."""
    if kind == "memory":
        return trio.testing.memory_stream_pair()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return client, server


@pytest.mark.parametrize("kind", ["tcp", "memory"])
async def test_frame_channel_hands_over_every_whole_frame_and_errors_after_the_good_ones(kind):
    left, right = await _stream_pair(kind)
    async with trio.open_nursery() as nursery:
        channel = FrameChannel(right, nursery, max_frame=1024)
        # three frames in one write arrive as one batch
        await left.send_all(encode_frame({"a": 1}) + encode_frame([2]) + encode_frame("3"))
        with trio.fail_after(5):
            assert await channel.receive_batch() == [{"a": 1}, [2], "3"]
        # a frame split over two writes waits for its end
        frame = encode_frame("x" * 500)
        await left.send_all(frame[:100])
        with trio.move_on_after(0.2) as scope:
            await channel.receive_batch()
        assert scope.cancelled_caught
        await left.send_all(frame[100:] + encode_frame(4))
        with trio.fail_after(5):
            got = await channel.receive_batch()
            while len(got) < 2:
                got += await channel.receive_batch()
        assert got == ["x" * 500, 4]
        # frames before a bad body are delivered, the error comes with the next receive
        await left.send_all(encode_frame(5) + LENGTH.pack(3) + b"\xc1\xc1\xc1")
        with trio.fail_after(5):
            assert await channel.receive_batch() == [5]
            with pytest.raises(errors.ProtocolError, match="not valid msgpack"):
                await channel.receive_batch()
        # a bad body alone is refused and consumed: the frame after it still arrives
        await left.send_all(LENGTH.pack(2) + b"\xc1\xc1" + encode_frame(7))
        with trio.fail_after(5):
            with pytest.raises(errors.ProtocolError, match="not valid msgpack"):
                await channel.receive_batch()
            assert await channel.receive_batch() == [7]
        # an oversized length is refused before its body is read
        await left.send_all(encode_frame(6) + LENGTH.pack(1 << 20))
        with trio.fail_after(5):
            assert await channel.receive_batch() == [6]
            with pytest.raises(errors.FrameTooLarge, match="exceeds the maximum of 1024"):
                await channel.receive_batch()
        await channel.aclose()
        await left.aclose()


@pytest.mark.parametrize("kind", ["tcp", "memory"])
async def test_frames_sent_in_one_scheduler_round_leave_in_one_write(kind):
    left, right = await _stream_pair(kind)
    async with trio.open_nursery() as nursery:
        sender = FrameChannel(left, nursery)
        receiver = FrameChannel(right, nursery)
        for i in range(100):              # no checkpoint in between: one round
            sender.send_nowait({"n": i, "pad": "y" * 50})
        got = []
        with trio.fail_after(5):
            while len(got) < 100:
                got += await receiver.receive_batch()
        assert [g["n"] for g in got] == list(range(100))     # whole frames, in order
        # the first frame goes out at once, the other 99 together (a socket may take a
        # big write in pieces, but not 99 of them)
        assert sender.stats.frames_out == 100
        assert sender.stats.writes <= 4, sender.stats
        # a lone frame later is written at once, not held back
        sender.send_nowait("alone")
        with trio.fail_after(5):
            assert await receiver.receive_batch() == ["alone"]
        await sender.aclose()
        with pytest.raises(errors.ServerUnavailable):
            sender.send_nowait("after close")
        await receiver.aclose()


async def test_a_peer_that_reads_no_replies_is_cut_off_and_others_are_served(caplog):
    def cut_off() -> bool:
        return any("has not read a reply" in r.getMessage() for r in caplog.records)

    async with trio.open_nursery() as nursery:
        addr = await nursery.start(
            serve_tcp, lambda s, p: serve_rpc(s, Echo(), peer=p, send_timeout=0.5),
            "127.0.0.1", 0)
        stream = await trio.open_tcp_stream(*addr)
        requests = encode_frame({"hello": "leasefs", "version": 1,
                                 "client_id": "greedy"})
        requests += b"".join(encode_frame([i, "blob", {"size": 256 << 10}])
                             for i in range(1, 201))
        await stream.send_all(requests)       # 50 MiB of replies asked for, none read
        # the server gives up once a reply has waited send_timeout (on a busy machine
        # making the replies that fill the socket's buffers can take longer than that)
        with trio.fail_after(30):
            while not cut_off():
                await trio.sleep(0.05)
        async with RpcClient(addr, "polite") as rpc:   # and still serves others
            with trio.fail_after(5):
                assert await rpc.call("echo", {"value": "fine"}) == "fine"
        received = 0
        with trio.fail_after(10):
            try:
                while chunk := await stream.receive_some(1 << 20):
                    received += len(chunk)
            except trio.BrokenResourceError:
                pass                          # reset: also a closed connection
        assert received < 200 * (256 << 10)   # cut off, not every reply delivered
        await stream.aclose()
        nursery.cancel_scope.cancel()
