"""Journaling a planned change: the one call every front end and service makes to turn a
plan (a typed op, ``meta.journal.ops``) into an applied, durable record.

Why it exists: whether a caller waits for the fsync depends on the op (``LAZY_OPS``:
namespace-only records a client without ``sync_metadata`` is answered for once they are
written) and on the client; the rule lives here once instead of at every call site.

Concurrency contract: trio thread; ``log_plan``/``log_plans`` await the journal's group
commit (``Journal.log``/``log_many``), ``sync`` its fsync of what was written.
"""

from __future__ import annotations

from .journal import Journal
from .ops import LAZY_OPS, op_name


class Edits:
    def __init__(self, journal: Journal):
        self.journal = journal

    async def log_plan(self, plan, *, durable: bool = True, kept=None) -> int | None:
        """Journal a plan and wait until it is applied and durable; ``durable=False`` (a
        client without ``sync_metadata``): applied and written, when its op is in
        ``LAZY_OPS``. ``kept``: what a retry of the running retry-cached call needs of its
        answer (``Journal.log_many``). A None plan (nothing to change) journals nothing."""
        if plan is None:
            return None
        return await self.journal.log(plan, durable=durable or op_name(plan) not in LAZY_OPS,
                                      kept=kept)

    async def log_plans(self, plans, *, durable: bool = True) -> list[int]:
        """Journal several plans in one batch (one fsync), applied in order; the txids of
        those that are not None (none: nothing is journaled)."""
        plans = [plan for plan in plans if plan is not None]
        if not plans:   # nothing to change: no batch to wait for
            return []
        return await self.journal.log_many(plans, durable=durable or any(
            op_name(plan) not in LAZY_OPS for plan in plans))

    async def sync(self) -> int:
        """Wait until every record journaled so far is durable (what lazily journaled
        changes of a batch need before a caller that wants them durable is answered)."""
        return await self.journal.sync()
