"""Client-side failover of ``fs.rpc.RpcClient`` over a list of metadata server addresses
(HA: active, standbys, observers), against real RPC servers on loopback sockets.

Each server is a small ``Dispatcher`` whose role the test switches: a standby answers
every call with ``StandbyError`` and carries nothing out, as a standby metadata server
does; the active carries calls out through a ``RetryCache`` like the metadata server's and
counts how often it carried out each ``(client_id, call_id)``. "Down" servers are ports
nothing listens on (refused) or a listener that closes every connection at once (closed).
The end of the module runs the real metadata server and the shell with an address list.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import trio

from fs import errors
from fs.client import AsyncClient, authentication
from fs.retry_cache import RetryCache
from fs.rpc import (Dispatcher, RpcClient, format_address, normalize_address_list,
                    parse_address_list, serve_rpc, serve_tcp)
from harness import free_port, wait_until

pytestmark = pytest.mark.timeout(120)


class RoleServer(Dispatcher):
    """An RPC server whose HA role the test sets: "active" carries calls out, "standby"
    answers ``StandbyError`` without carrying anything out."""

    retry_cached = frozenset({"bump"})

    def __init__(self, name: str, role: str = "active", epoch: int = 1):
        super().__init__(RetryCache())
        self.name, self.role, self.epoch = name, role, epoch
        self.frozen = False         # SIGSTOPped: takes calls, answers none
        self.probed = 0             # ha_status calls answered
        self.carried: collections.Counter = collections.Counter()  # (client, call) → runs
        self.connections = 0
        self.lose_next_reply = False
        self.streams: dict[str, trio.SocketStream] = {}
        self.address: str | None = None

    async def dispatch(self, ctx, method, args):
        if self.frozen:
            await trio.sleep_forever()
        if self.role == "standby" and method != "ha_status":
            raise errors.StandbyError(f"{self.name} is standby")
        return await super().dispatch(ctx, method, args)

    async def rpc_ha_status(self, ctx):
        self.probed += 1
        return {"role": self.role, "epoch": self.epoch}

    async def rpc_slow(self, ctx, seconds):
        await trio.sleep(seconds)   # fixed-sleep: the call's simulated duration
        return self.name

    async def rpc_bump(self, ctx):
        self.carried[(ctx.client_id, ctx.call_id)] += 1
        if self.lose_next_reply:    # carried out, then the connection dies before the reply
            self.lose_next_reply = False
            self.streams[ctx.peer].socket.shutdown(socket.SHUT_RDWR)
        return self.name

    async def rpc_whoami(self, ctx):
        return self.name

    def runs(self) -> int:
        return sum(self.carried.values())


async def start(nursery, server: RoleServer) -> str:
    async def handler(stream, peer):
        server.connections += 1
        server.streams[peer] = stream
        await serve_rpc(stream, server, peer=peer)

    bound = await nursery.start(serve_tcp, handler, "127.0.0.1", 0)
    server.address = format_address(bound)
    return server.address


async def active_and_standby(nursery, epoch: int) -> tuple[RoleServer, RoleServer, str]:
    """Servers "a" (active) and "b" (standby) in ``epoch``, and their address list."""
    a, b = RoleServer("a", epoch=epoch), RoleServer("b", "standby", epoch=epoch)
    return a, b, f"{await start(nursery, a)},{await start(nursery, b)}"


async def start_closer(nursery) -> tuple[str, list]:
    """A listener that accepts and closes every connection at once: a dead server whose
    port still answers. Returns its address and the list of accepts."""
    accepted = []

    async def handler(stream):
        accepted.append(1)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, handler, listeners)
    return format_address(listeners[0].socket.getsockname()[:2]), accepted


def nothing_at() -> str:
    """An address that refuses connections."""
    return f"127.0.0.1:{free_port()}"


def moves(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "fs.rpc" and "; trying " in r.getMessage()]


def test_address_lists_parse_and_name_a_bad_entry():
    assert parse_address_list("127.0.0.1:8020") == [("127.0.0.1", 8020)]
    assert parse_address_list(" a:1, b:2 ,a:1") == [("a", 1), ("b", 2)]
    assert parse_address_list(["a:1", ("b", 2)]) == [("a", 1), ("b", 2)]
    assert parse_address_list(("a", 1)) == [("a", 1)]
    assert normalize_address_list("[::1]:9,a:1") == "[::1]:9,a:1"
    for bad, named in [("a:1,nonsense", "'nonsense'"), ("a:1,b:x", "'x' is not a number"),
                       ("a:1,,b:2", "empty entry"), ("a:1,b:70000", "'b:70000'"),
                       ("", "empty entry")]:
        with pytest.raises(errors.InvalidArgument, match=named):
            parse_address_list(bad)
    with pytest.raises(errors.InvalidArgument, match="bad entry.*'meta.example'"):
        RpcClient("127.0.0.1:8020,meta.example", "bad")
    with pytest.raises(errors.InvalidArgument, match="'nonsense'"):
        AsyncClient("127.0.0.1:8020,nonsense")


def test_urls_and_options_carry_a_list():
    from fsspec_leasefs import LeaseFSFileSystem
    from spark_connector.location import parse_location

    assert LeaseFSFileSystem._get_kwargs_from_urls("leasefs://a:1,b:2/x") == \
        {"meta_address": "a:1,b:2"}
    assert LeaseFSFileSystem._strip_protocol("leasefs://a:1,b:2/x/y") == "/x/y"
    assert parse_location("leasefs://a:1, b:2/x/").meta == "a:1,b:2"
    assert parse_location("/x", "a:1,b:2") == parse_location("leasefs://a:1,b:2/x")
    with pytest.raises(errors.InvalidArgument, match="'b:two'"):
        parse_location("leasefs://a:1,b:two/x")
    from mount.runner import mount_options
    assert "fsname=leasefs:a:1+b:2" in mount_options([], "a:1,b:2")


def test_each_address_has_its_own_local_socket():
    rpc = RpcClient("127.0.0.1:8020,127.0.0.1:8021,10.0.0.1:8022", "sockets")
    # another address's default one is used only where that address is this host's
    # (fs.localserver.here, checked at connect)
    assert rpc._local_sockets == ["@leasefs-meta-8020", "@leasefs-meta-8021",
                                  "@leasefs-meta-8022"]
    # servers on two hosts with one port: each host's own socket tells them apart
    assert RpcClient("10.0.0.1:8020,10.0.0.2:8020", "x")._local_sockets == \
        ["@leasefs-meta-8020", "@leasefs-meta-8020"]
    # a name without {port} cannot tell the servers apart: TCP for all of them
    assert RpcClient("127.0.0.1:1,127.0.0.1:2", "x", local_socket="/run/m.sock")._local_sockets \
        == [None, None]
    assert RpcClient("127.0.0.1:1", "x", local_socket="/run/m.sock").local_socket == "/run/m.sock"
    from fs.config import Config
    how = authentication(Config(meta_socket="/run/m-{port}.sock"), "h:1,h:2")
    assert RpcClient("h:1,h:2", "x", **how)._local_sockets == ["/run/m-1.sock", "/run/m-2.sock"]


async def test_a_list_of_down_standby_active_reaches_the_active_and_stays_there(caplog):
    caplog.set_level(logging.INFO, logger="fs.rpc")

    async with trio.open_nursery() as nursery:
        closer, accepted = await start_closer(nursery)
        standby = RoleServer("standby", "standby")
        active = RoleServer("active")
        addresses = [nothing_at(), closer, await start(nursery, standby),
                     await start(nursery, active)]
        async with RpcClient(",".join(addresses), "c", retry_seconds=5) as rpc:
            assert rpc.addresses == parse_address_list(addresses)
            assert await rpc.call("bump") == "active"
            assert format_address(rpc.address) == active.address
            assert active.runs() == 1 and standby.runs() == 0
            assert len(accepted) == 1 and standby.connections == 1
            assert len(moves(caplog)) == 3, moves(caplog)    # once per move
            # sticky: later calls go straight to the active, nobody else is probed
            for _ in range(5):
                assert await rpc.call("whoami") == "active"
            assert len(accepted) == 1 and standby.connections == 1
            assert active.connections == 1 and len(moves(caplog)) == 3
        nursery.cancel_scope.cancel()


async def test_calls_move_when_the_active_becomes_standby(caplog):
    caplog.set_level(logging.INFO, logger="fs.rpc")

    async with trio.open_nursery() as nursery:
        a, b = RoleServer("a"), RoleServer("b", "standby")
        addresses = f"{await start(nursery, a)},{await start(nursery, b)}"
        async with RpcClient(addresses, "c", retry_seconds=5) as rpc:
            assert await rpc.call("bump") == "a"
            # failover: a steps down, b takes over; many calls at once move together
            a.role, b.role = "standby", "active"
            results = []

            async def one():
                results.append(await rpc.call("bump"))
            async with trio.open_nursery() as calls:
                for _ in range(20):
                    calls.start_soon(one)
            assert results == ["b"] * 20
            assert format_address(rpc.address) == b.address
            assert a.runs() == 1 and b.runs() == 20
            assert all(n == 1 for n in (a.carried + b.carried).values())
            assert len(moves(caplog)) == 1, moves(caplog)
            assert "is standby" in moves(caplog)[0] and b.address in moves(caplog)[0]
            # and back again
            a.role, b.role = "active", "standby"
            assert await rpc.call("bump") == "a"
            # a standby-only list waits out the budget, then says so naming both
            a.role = "standby"
            begun = time.monotonic()
            with pytest.raises(errors.StandbyError, match="no metadata server of") as got:
                await rpc.call("bump", retry_seconds=0.5)
            assert 0.3 < time.monotonic() - begun < 3
            assert a.address in str(got.value) and b.address in str(got.value)
            assert a.runs() == 2 and b.runs() == 20
        nursery.cancel_scope.cancel()


async def test_calls_waiting_on_a_silent_server_move_to_the_one_that_says_it_is_active(caplog):
    """The active freezes (it takes calls, answers none, its connection stays open) and
    the standby takes over: the calls waiting on the frozen one, and a client that starts
    after the freeze, are carried out by the new active within a few ``silence`` periods,
    each once."""
    caplog.set_level(logging.INFO, logger="fs.rpc")
    silence = 0.3

    async with trio.open_nursery() as nursery:
        a, b, addresses = await active_and_standby(nursery, epoch=1)
        async with RpcClient(addresses, "c", retry_seconds=30, silence=silence) as rpc:
            assert await rpc.call("bump") == "a"
            a.frozen = True
            frozen_at = time.monotonic()
            results = []

            async def one():
                results.append((await rpc.call("bump"), time.monotonic() - frozen_at))
            async with trio.open_nursery() as calls:
                for _ in range(5):
                    calls.start_soon(one)
                # nobody else claims the role yet: the calls wait, probes go on
                assert await wait_until(lambda: b.probed >= 2, timeout=10), b.probed
                assert not results, results
                b.role, b.epoch = "active", 2
                took_over = time.monotonic() - frozen_at
            assert [name for name, _ in results] == ["b"] * 5
            assert max(t for _, t in results) - took_over < 2 * silence, results
            assert a.runs() == 1 and b.runs() == 5
            assert all(n == 1 for n in (a.carried + b.carried).values())
            said = [m for m in (r.getMessage() for r in caplog.records)
                    if "said nothing" in m]
            assert len(said) == 1 and f"{b.address} says it is active (epoch 2)" in said[0]
        # a client started while a is frozen, a first in its list
        begun = time.monotonic()
        async with RpcClient(addresses, "late", retry_seconds=30, silence=silence) as rpc:
            assert await rpc.call("bump") == "b"
        assert time.monotonic() - begun < 3 * silence
        nursery.cancel_scope.cancel()


async def test_a_slow_live_active_is_not_left_while_no_other_claims_a_newer_term(caplog):
    """A call the live active takes long over (a big listing) is not abandoned: the probe
    finds the other server standby, or claiming the role in an older term than the one
    the active itself reports (a deposed active that has not noticed yet)."""
    caplog.set_level(logging.INFO, logger="fs.rpc")
    silence = 0.2

    async with trio.open_nursery() as nursery:
        a, b, addresses = await active_and_standby(nursery, epoch=3)
        async with RpcClient(addresses, "c", retry_seconds=30, silence=silence) as rpc:
            assert await rpc.call("slow", {"seconds": 6 * silence}) == "a"
            probes = b.probed
            assert probes >= 2, probes
            # only a probe that reached the live active shows b's claim stale
            b.role, b.epoch = "active", 2
            assert await rpc.call("slow", {"seconds": 6 * silence}) == "a"
            assert b.probed > probes and format_address(rpc.address) == a.address
            assert b.runs() == 0
        assert not [r for r in caplog.records if "said nothing" in r.getMessage()]
        nursery.cancel_scope.cancel()


async def test_a_lost_reply_is_carried_out_once_when_the_retry_lands_on_the_same_server():
    async with trio.open_nursery() as nursery:
        a, b = RoleServer("a"), RoleServer("b", "standby")
        addresses = f"{await start(nursery, a)},{await start(nursery, b)}"
        async with RpcClient(addresses, "c", retry_seconds=5) as rpc:
            a.lose_next_reply = True
            # a carries it out and dies before replying; the client moves to b (standby),
            # then back to a, whose retry cache answers the same call id
            assert await rpc.call("bump") == "a"
            assert a.runs() == 1 and list(a.carried.values()) == [1]
            assert a.connections == 2 and b.connections == 1
        nursery.cancel_scope.cancel()


async def test_the_whole_list_down_is_server_unavailable_naming_every_address():
    async with trio.open_nursery() as nursery:
        closer, accepted = await start_closer(nursery)
        addresses = [nothing_at(), closer]
        async with RpcClient(",".join(addresses), "c", retry_seconds=0.6) as rpc:
            begun = time.monotonic()
            with pytest.raises(errors.ServerUnavailable) as got:
                await rpc.call("whoami")
            took = time.monotonic() - begun
        assert 0.3 < took < 3, took
        message = str(got.value)
        assert all(address in message for address in addresses), message
        assert "cannot reach" in message and "closed the connection" in message
        # cycles wait the backoff between them, they do not spin
        assert 2 <= len(accepted) < 10, len(accepted)
        nursery.cancel_scope.cancel()


def test_read_your_writes_txid_only_grows():
    rpc = RpcClient("127.0.0.1:1", "txid")
    assert rpc.last_seen_txid == 0
    for txid in (5, 3, None, True, "9", 7):
        rpc.note_txid(txid)
    assert rpc.last_seen_txid == 7


# --------------------------------------------------------------------------- real server


@pytest.mark.cluster(n_storage=1, replication=1)
async def test_the_real_metadata_server_behind_a_dead_address(tmp_path, cluster):
    listed = f"{nothing_at()},{cluster.meta_address}"
    async with AsyncClient(listed, config=cluster.config) as client:
        assert client.meta_address == listed
        assert format_address(client.rpc.address) == cluster.meta_address
        await client.mkdirs("/ha")
        await client.write_file("/ha/file", b"failover")
        stream = await client.create("/ha/streamed")
        await stream.write(b"x" * 10000)
        await stream.close()
        assert await client.read_file("/ha/file") == b"failover"
        assert await client.read_file("/ha/streamed") == b"x" * 10000
    # fsspec, through the URL and through LEASEFS_META
    import fsspec

    def through_fsspec():
        lfs, path = fsspec.core.url_to_fs(f"leasefs://{listed}/ha/file")
        try:
            with lfs.open(path, "rb") as fh:
                return fh.read()
        finally:
            lfs.close()
    assert await trio.to_thread.run_sync(through_fsspec) == b"failover"
    env = {**os.environ, "LEASEFS_META": listed,
           "LEASEFS_HOME": str(tmp_path / "home")}
    proc = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "tools", "ls", "/ha"], env=env,
        capture_output=True, timeout=60))
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.decode().split() == ["file", "streamed"]
    bad = {**env, "LEASEFS_META": f"{cluster.meta_address},nonsense"}
    proc = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "tools", "ls", "/ha"], env=bad,
        capture_output=True, timeout=60))
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode != 0 and "'nonsense'" in err and "Traceback" not in err, err
