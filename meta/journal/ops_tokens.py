"""Delegation token ops of the journal: DELEGATION_TOKEN, RENEW_DELEGATION_TOKEN,
CANCEL_DELEGATION_TOKEN.

Why it exists: the namespace keeps what each live token may still do, so renewals and
cancellations survive restarts as HDFS's edit log keeps them (``meta.services.security`` plans
them; the server's token table follows them through ``Security.token_stored`` and
``token_cancelled``). Reach them through ``meta.journal.ops.OPS`` / ``decode``.

Concurrency contract: immutable values; ``apply``/``apply_memory`` run on the trio thread
inside one batch's apply, no awaits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import keys
from .opbase import Effect, Op, register


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenEffect(Effect):
    """An issue's or renewal's: the token's state as now stored (``TokenState`` wire
    form), None when a renewal found no token to renew."""
    token: dict | None = None


@register
class DelegationToken(Op):
    """A token issued: its identifier and expiry (``fs.delegation.TokenState`` wire form),
    stored as is under its ``seq``."""
    NAME = "DELEGATION_TOKEN"
    seq: int
    owner: str
    renewer: str
    issued: float
    max_date: float
    expiry: float

    def apply(self, txn, counters):
        state = self.to_args()
        txn.put(keys.token_key(self.seq), state)
        counters[keys.NEXT_TOKEN] = max(counters.get(keys.NEXT_TOKEN, 1), self.seq + 1)
        return TokenEffect(token=state)

    def apply_memory(self, state, effect: TokenEffect, now):
        state.security.token_stored(effect.token)


@register
class RenewDelegationToken(Op):
    NAME = "RENEW_DELEGATION_TOKEN"
    seq: int
    expiry: float

    def apply(self, txn, counters):
        state = txn.get(keys.token_key(self.seq))
        if state is None:
            return TokenEffect()
        state = {**state, "expiry": self.expiry}
        txn.put(keys.token_key(self.seq), state)
        return TokenEffect(token=state)

    def apply_memory(self, state, effect: TokenEffect, now):
        if effect.token is not None:
            state.security.token_stored(effect.token)


@register
class CancelDelegationToken(Op):
    NAME = "CANCEL_DELEGATION_TOKEN"
    seq: int

    def apply(self, txn, counters):
        txn.delete(keys.token_key(self.seq))

    def apply_memory(self, state, effect, now):
        state.security.token_cancelled(self.seq)
