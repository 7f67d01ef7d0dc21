"""Observer reads for clients (HDFS-12943's ObserverReadProxyProvider): with
``observer_reads`` on and a list of metadata servers, a client sends its reads
(``OBSERVER_READS``) to an observer and everything else to the active.

Why: the active metadata server is one Python process; reads are most of a namespace's
calls (``stat``, listings, block locations) and an observer can answer them from the same
log without the active spending a cycle on them.

Consistency: read-your-writes. Both of the client's connections share one
``fs.rpc.StateAlignment``: every reply carries the server's applied journal txid, every call
carries the newest one the client has seen, and an observer serves a read only once it has
applied that much (``meta.ha.controller.HAController.wait_applied``). A client that must also see other
clients' writes calls ``msync`` first (the active's txid). An observer that is behind for
longer than ``ha_observer_wait``, down, or no longer an observer answers ``StandbyError`` or
cannot be reached: the read goes to the active, and the failures are counted.

Concurrency contract: used from the client's trio thread; ``ObserverReads.call`` may run in
many tasks at once (the two ``RpcClient``s take concurrent calls).
"""

from __future__ import annotations

import logging

from .errors import ServerUnavailable, StandbyError
from .rpcclient import call_each
from .rpc import RpcClient

log = logging.getLogger(__name__)

#: the reads an observer serves (the metadata server's ``OBSERVER_METHODS``)
OBSERVER_READS = frozenset({"get_file_info", "exists", "list_status", "get_block_locations",
                            "content_summary"})


async def find_observers(addresses: str, *, timeout: float = 2.0, **rpc_args) -> list[str]:
    """The addresses of the list whose server says it is an observer (``ha_status``)."""
    answers = await call_each(addresses, "ha_status", timeout=timeout,
                              name="leasefs-observer-probe", **rpc_args)
    return sorted(address for address, (status, _) in answers.items()
                  if isinstance(status, dict) and status.get("role") == "observer")


class ObserverReads:
    """Routes one client's calls: ``OBSERVER_READS`` to ``observers`` (an ``RpcClient`` of
    the observer addresses), the rest and every read an observer cannot serve to
    ``active``."""

    def __init__(self, active: RpcClient, observers: RpcClient):
        self.active = active
        self.observers = observers
        self.served = 0       # reads an observer answered
        self.fallbacks = 0    # reads that went to the active after all

    async def call(self, method: str, args: dict):
        if method in OBSERVER_READS:
            try:
                answer = await self.observers.call(method, args, retry_seconds=0)
            except (StandbyError, ServerUnavailable) as exc:
                self.fallbacks += 1
                log.debug("%s: observer cannot serve it (%s); asking the active", method, exc)
            else:
                self.served += 1
                return answer
        return await self.active.call(method, args)
