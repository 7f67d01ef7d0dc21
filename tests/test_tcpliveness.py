"""``fs.tcpliveness`` on real loopback sockets: every watched connection gets keepalive with
the configured timeout, and a peer whose process does not read (its window closed, its
kernel answering every probe) is never cut, however long it stays so. The cut of a silent
host is tested across hosts in ``test_host_faults`` (loopback always acknowledges)."""

from __future__ import annotations

import socket
import struct

import pytest
import trio

from fs import tcpliveness
from fs.framing import FramedStream


@pytest.fixture
def liveness():
    """Sets the process's timeout for a test, puts the default back after it."""
    before = tcpliveness.timeout()
    yield tcpliveness.configure
    tcpliveness.configure(before)


def _info(*, retransmits=0, probes=0, unacked=0, last_ack_recv=0) -> bytes:
    return struct.pack("=8B13I", 1, 0, retransmits, probes, 0, 0, 0, 0,
                       200000, 0, 1448, 1448, unacked, 0, 0, 0, 0,
                       0, 0, 0, last_ack_recv)


def test_keepalive_plan_fails_an_idle_connection_after_about_the_timeout():
    for seconds in (1, 2, 3, 4, 10):
        idle, interval, count = tcpliveness.keepalive_plan(seconds)
        assert idle >= 1 and interval >= 1 and count >= 1
        assert seconds <= idle + interval * count <= seconds + 1


def test_silence_is_unanswered_data_or_probes_for_the_whole_timeout():
    assert tcpliveness.silent(_info(retransmits=3, unacked=2, last_ack_recv=3000), 3)
    assert tcpliveness.silent(_info(probes=2, last_ack_recv=5000), 3)
    # acknowledged lately, nothing retransmitted, or a window probe answered: alive
    assert not tcpliveness.silent(_info(retransmits=3, unacked=2, last_ack_recv=2900), 3)
    assert not tcpliveness.silent(_info(unacked=2, last_ack_recv=9000), 3)
    assert not tcpliveness.silent(_info(probes=1, last_ack_recv=9000), 3)
    assert not tcpliveness.silent(_info(last_ack_recv=60000), 3)


def test_one_sample_of_a_probe_just_sent_is_not_a_host_gone():
    """Measured on loopback under load (a live peer that does not read): a window probe
    left unanswered (the peer's kernel rate-limits those answers), then, the instant the
    next probe is sent, TCP_INFO reads two probes unanswered and no ack for 1.3 s. One
    sample is ``silent``; the watcher's verdict needs the check before to be waiting too,
    and no ack in between."""
    unanswered = _info(probes=1, last_ack_recv=1200)
    just_sent = _info(probes=2, last_ack_recv=1312)
    answered = _info(probes=0, last_ack_recv=3)
    assert tcpliveness.silent(just_sent, 1)
    assert not tcpliveness.gone(unanswered, just_sent, 1)
    assert not tcpliveness.gone(just_sent, answered, 1)
    assert not tcpliveness.gone(None, just_sent, 1)      # the first check of a connection
    # a host gone: probes (or retransmissions) unanswered at both checks, no ack since
    assert tcpliveness.gone(_info(probes=2, last_ack_recv=900),
                            _info(probes=3, last_ack_recv=1030), 1)
    assert tcpliveness.gone(_info(retransmits=2, unacked=3, last_ack_recv=880),
                            _info(retransmits=3, unacked=3, last_ack_recv=1005), 1)
    # an acknowledgement between the two checks: not the same silence
    assert not tcpliveness.gone(_info(probes=2, last_ack_recv=1500),
                                _info(probes=2, last_ack_recv=1100), 1)


async def _pair():
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listener.accept()
    await listener.aclose()
    return client, server


async def test_watched_connection_gets_keepalive_of_the_timeout(liveness):
    await _keepalive_of_the_timeout(liveness)


async def _keepalive_of_the_timeout(liveness):
    liveness(3)
    client, server = await _pair()
    tcpliveness.watch(client)
    sock = client.socket
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)) == \
        tcpliveness.keepalive_plan(3)
    liveness(0)     # off: a connection made now is left as the kernel makes it
    other, other_server = await _pair()
    tcpliveness.watch(other)
    assert other.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    for stream in (client, server, other, other_server):
        await stream.aclose()


async def test_a_peer_that_does_not_read_is_not_cut(liveness):
    """The peer's window closes and stays closed for three timeouts: the sender waits
    (its send blocked, no error), the watcher leaves it, and every byte arrives once the
    peer reads again."""
    await _peer_that_does_not_read(liveness)


async def _peer_that_does_not_read(liveness):
    liveness(1)
    client, server = await _pair()
    tcpliveness.watch(client)
    framed = FramedStream(client)
    payload = bytes(range(256)) * (64 * 1024)     # 16 MiB: more than the buffers hold
    sent = trio.Event()

    async def send():
        await framed.send_all(payload)
        sent.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        # fixed-sleep: a slow but live peer for three timeouts is never judged lost;
        # the kernel's view over real time is what is tested, at every watcher interval
        end, earlier = trio.current_time() + 3 * tcpliveness.timeout(), None
        while trio.current_time() < end:
            await trio.sleep(tcpliveness.timeout() / 8)
            info = client.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            assert not tcpliveness.gone(earlier, info, tcpliveness.timeout()), (earlier, info)
            earlier = info
        assert not sent.is_set()
        assert tcpliveness.lost(client) is None
        got = bytearray()
        while len(got) < len(payload):
            got += await server.receive_some(1 << 20)
        await sent.wait()
    assert got == payload
    await client.aclose()
    await server.aclose()
