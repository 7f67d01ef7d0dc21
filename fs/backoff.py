"""The one retry delay policy of every retry loop: exponential backoff with jitter.

``Backoff(first, factor, cap, jitter)``: the ceiling of attempt ``n`` (0 for the wait after
the first failure) is ``min(cap, first * factor ** n)``; the wait is that ceiling less a
random share of it, ``ceiling * (1 - jitter * u)`` with ``u`` uniform in [0, 1).
``jitter = 1`` is "full jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter"):
a wait anywhere in (0, ceiling]. ``jitter = 0.5`` is its "equal jitter": (ceiling / 2,
ceiling]. ``jitter = 0`` is the plain backoff. A wait is never 0 while ``first`` is not.

Which loop takes which: full jitter where nothing counts the tries and the retry goes on
until the server answers (a block server's heartbeats and reports: the most clients of
one server); equal jitter where a loop gives up after a count of attempts and must keep at
least half of its patience (add_block, complete, location refreshes), where it retries
within a short budget (``RpcClient.call``: never a spin of near-zero waits, and a server
taking over gets at most about 4/3 of the tries plain doubling gave it, not twice), and
where the wait is fixed (``factor = 1``) and its rate should stay about the same.

Why this family rather than the blog's "decorrelated jitter": both spread the clients that
failed together (a failover: every client loses the old active at once and would otherwise
retry the new one in lockstep) about equally well in the blog's figures, but decorrelated
jitter draws each wait from the previous one, so a loop would carry that state, and the
wait of attempt ``n`` would not be a pure function of ``n`` that a test can pin down.

Loops keep their own bounds (a deadline such as ``rpc_retry_seconds``, or a count of
attempts); this only says how long to wait between two attempts.

Concurrency contract: ``Backoff`` is immutable; ``delay`` is pure given ``rng``. ``sleep``
runs on the trio thread and is cancelled like any ``trio.sleep``. The default random source
is shared by every loop (``random.Random.random`` is atomic under the GIL: a wait, not a
secret, so no need for ``secrets``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import trio

# the random source of loops that do not bring their own (tests pass a seeded one)
_RNG = random.Random()


@dataclass(frozen=True)
class Backoff:
    first: float            # ceiling of the first wait, seconds
    factor: float = 2.0     # each next ceiling is this times the one before
    cap: float = 1.0        # no ceiling above this, seconds
    jitter: float = 1.0     # share of the ceiling drawn at random: 1 full, 0.5 equal, 0 none

    def __post_init__(self):
        if not (0 <= self.first <= self.cap and self.factor >= 1 and 0 <= self.jitter <= 1):
            raise ValueError(f"backoff needs 0 <= first <= cap, factor >= 1 and "
                             f"0 <= jitter <= 1, not {self!r}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (0-based)."""
        try:
            return min(self.cap, self.first * self.factor ** max(0, attempt))
        except OverflowError:   # a loop that has retried for ever: the cap long since
            return self.cap

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait after failed attempt ``attempt``: above ``(1 - jitter) * ceiling``, up to
        ``ceiling`` (seconds), drawn from ``rng`` (the module's own when None)."""
        ceiling = self.ceiling(attempt)
        return ceiling * (1.0 - self.jitter * (rng or _RNG).random())

    async def sleep(self, attempt: int, rng: random.Random | None = None,
                    most: float | None = None) -> float:
        """Sleep ``delay(attempt, rng)``, no longer than ``most`` when given; the time slept."""
        wait = self.delay(attempt, rng)
        if most is not None:
            wait = max(0.0, min(wait, most))
        await trio.sleep(wait)
        return wait


__all__ = ["Backoff"]
