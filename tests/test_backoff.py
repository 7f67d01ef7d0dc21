"""The retry delay policy every retry loop uses (``fs.backoff.Backoff``): exponential
ceilings up to a cap, a random share of each wait (jitter) drawn from an injectable source,
so clients that fail together (a failover) do not retry together."""

from __future__ import annotations

import functools
import random

import pytest
import trio
import trio.testing

from fs.backoff import Backoff


def test_ceilings_double_from_the_first_up_to_the_cap_and_never_overflow():
    policy = Backoff(first=0.05, factor=2, cap=1.0, jitter=0.0)
    assert [policy.delay(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay(100_000) == 1.0     # 2 ** 100000 overflows a float: the cap
    uncapped = Backoff(first=0.05, factor=2, cap=float("inf"), jitter=0.0)
    assert uncapped.delay(9) == pytest.approx(25.6)
    assert Backoff(first=0.5, factor=1, cap=0.5, jitter=0.0).delay(50) == 0.5


@pytest.mark.parametrize("jitter", [1.0, 0.5])
def test_every_wait_lies_between_its_floor_and_its_ceiling(jitter):
    policy = Backoff(first=0.05, factor=2, cap=1.0, jitter=jitter)
    rng = random.Random(1)
    for attempt in range(12):
        ceiling = policy.ceiling(attempt)
        waits = [policy.delay(attempt, rng) for _ in range(500)]
        assert all((1 - jitter) * ceiling < w <= ceiling for w in waits)
        assert max(waits) <= 1.0


def test_full_jitter_spreads_clients_that_failed_together_over_the_whole_interval():
    """A hundred clients at the same attempt: their waits cover [0, ceiling) evenly (each
    tenth of it holds some), not one instant; with jitter 0 they would all wait the same."""
    policy = Backoff(first=0.05, factor=2, cap=1.0, jitter=1.0)
    rng = random.Random(2)
    waits = [policy.delay(6, rng) for _ in range(100)]
    assert len(set(waits)) == 100
    assert {int(w * 10) for w in waits} == set(range(10))
    assert 0.35 < sum(waits) / len(waits) < 0.65
    assert len({Backoff(0.05, 2, 1.0, jitter=0.0).delay(6, rng) for _ in range(100)}) == 1


def test_a_wait_is_never_zero():
    """Full jitter still waits: even the draw u = 0.999... leaves a wait above 0, so no
    loop spins."""

    class Highest(random.Random):
        def random(self):
            return 1.0 - 2 ** -53

    policy = Backoff(first=0.05, factor=2, cap=1.0, jitter=1.0)
    assert 0 < policy.delay(0, Highest()) < 1e-15
    assert all(policy.delay(n, random.Random(n)) > 0 for n in range(1000))


def test_the_same_seed_gives_the_same_waits():
    policy = Backoff(first=0.05, factor=2, cap=1.0)
    first = [policy.delay(n, random.Random(42)) for n in range(10)]
    again = [policy.delay(n, random.Random(42)) for n in range(10)]
    other = [policy.delay(n, random.Random(43)) for n in range(10)]
    assert first == again and first != other


@pytest.mark.parametrize("bad", [dict(first=-1), dict(first=2, cap=1), dict(factor=0.5),
                                 dict(jitter=1.5), dict(jitter=-0.1)])
def test_a_policy_out_of_bounds_is_refused(bad):
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(**{"first": 0.05, "cap": 1.0, **bad})


async def test_sleep_waits_the_drawn_delay_bounded_by_most(autojump_clock):
    policy = Backoff(first=0.4, factor=2, cap=10.0)

    start = trio.current_time()
    slept = await policy.sleep(2, random.Random(5))
    assert slept == policy.delay(2, random.Random(5))
    assert trio.current_time() - start == pytest.approx(slept)
    assert await policy.sleep(5, random.Random(5), most=0.25) <= 0.25


async def test_clients_that_lost_their_server_retry_spread_out_not_in_step():
    """Sixteen real RPC clients whose calls all fail at once (a server that hangs up on
    every connection, on loopback) come back on their own schedules: the time from each
    one's first try to its seventh is what its own backoff drew (each client's random
    source is seeded), and these differ by most of a second between the quickest and the
    slowest client. Without jitter every client waits 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1 s
    and they reconnect together, as after a failover: a spread of only the scheduling's
    noise, a few hundredths of a second here. Each client is stopped at its seventh try
    rather than by a retry budget, so a slow machine makes no client run out of time
    before it."""
    from fs.errors import ServerUnavailable
    from fs.framing import FramedStream
    from fs.rpcclient import RETRY_BACKOFF, RpcClient

    tries: dict[str, list[float]] = {}
    drawn = {}
    seventh: dict[str, trio.Event] = {}
    for i in range(16):
        rng = random.Random(i)
        drawn[f"client-{i}"] = sum(RETRY_BACKOFF.delay(n, rng) for n in range(6))
        seventh[f"client-{i}"] = trio.Event()

    async def hang_up(stream):
        framed = FramedStream(stream)
        try:
            with trio.fail_after(5):
                hello = await framed.receive_frame()
            name = hello["client_id"].split("#")[0]   # the client adds a unique suffix
            tries.setdefault(name, []).append(trio.current_time())
            if len(tries[name]) == 7:
                seventh[name].set()
        finally:
            await stream.aclose()

    async def client(port: int, i: int):
        async with RpcClient(f"127.0.0.1:{port}", f"client-{i}", timeout=5,
                             retry_seconds=60.0, local_socket=None,
                             rng=random.Random(i)) as rpc:
            async with trio.open_nursery() as calls:
                async def call():
                    try:
                        await rpc.call("ping")
                    except ServerUnavailable as exc:
                        raise AssertionError(f"client-{i} gave up before its seventh "
                                             f"try: {exc}") from None
                    raise AssertionError(f"client-{i}: a server that hangs up answered")
                calls.start_soon(call)
                await seventh[f"client-{i}"].wait()
                calls.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as clients:
            for i in range(16):
                clients.start_soon(client, port, i)
        nursery.cancel_scope.cancel()
    assert sorted(tries) == sorted(drawn)
    waited = {name: times[6] - times[0] for name, times in tries.items()}
    # each waited what it drew, plus six tries' worth of connecting
    assert all(drawn[n] - 0.01 < waited[n] < drawn[n] + 1.0 for n in drawn), (drawn, waited)
    expected = max(drawn.values()) - min(drawn.values())
    assert expected > 0.5    # what these seeds draw: the check below can fail
    assert max(waited.values()) - min(waited.values()) > expected / 2, (drawn, waited)
