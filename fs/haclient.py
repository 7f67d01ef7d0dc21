"""Asking metadata servers directly, one call each, whatever their HA role: what
``haadmin``, observer discovery (``fs.observer``), ``RpcClient``'s probe for the active
while its server is silent, the HA benchmark and the tests use to learn each server's role
(``ha_status``) or to make one server resign (``ha_failover``).

Why it exists: a normal client call goes to whichever server of the list serves it
(``fs.rpcclient.RpcClient`` moves on at ``StandbyError``); these calls must reach THE
server named, answer or not, within a bound.

Concurrency contract: ``call_each`` runs in the caller's trio thread; its calls run at once,
each with its own connection.
"""

from __future__ import annotations

import trio

from .config import DEFAULT_LOCAL_SOCKET
from .errors import LeaseFSError, sole_exception
from .rpc import RpcClient, format_address, parse_address, parse_address_list
from .rpcclient import _local_sockets


async def call_each(addresses, method: str = "ha_status", args: dict | None = None, *,
                    timeout: float = 2.0, name: str = "leasefs-ha-probe",
                    local_socket: str | list[str | None] | None = DEFAULT_LOCAL_SOCKET,
                    **rpc_args) -> dict[str, tuple[object, BaseException | None]]:
    """``method(**args)`` on every server of ``addresses`` (a list, or a comma-separated
    string) at once, without retries: ``"host:port"`` → ``(answer, None)``, or ``(None,
    why)`` when it did not answer within ``timeout`` s or refused. ``local_socket``: the
    ``meta_socket`` setting, filled in per address as an ``RpcClient`` of the whole list
    does, or a list of each address's socket name already filled in (None: TCP);
    ``rpc_args``: more ``RpcClient`` arguments (TLS, authentication, max frame)."""
    if isinstance(addresses, str):
        addresses = parse_address_list(addresses)
    texts = [a if isinstance(a, str) else format_address(a) for a in addresses]
    if not isinstance(local_socket, list):
        local_socket = _local_sockets(local_socket, [parse_address(a) for a in texts])
    sockets = dict(zip(texts, local_socket))
    out: dict[str, tuple] = {}

    async def one(address: str) -> None:
        try:
            async with RpcClient(address, name, timeout=timeout, retry_seconds=0,
                                 connect_timeout=timeout, local_socket=sockets[address],
                                 **rpc_args) as rpc:
                with trio.fail_after(timeout):
                    out[address] = (await rpc.call(method, args or {}, retry_seconds=0), None)
        except BaseException as raised:   # trio wraps errors crossing the client's nursery
            exc = sole_exception(raised)
            if not isinstance(exc, (LeaseFSError, OSError, trio.TooSlowError)):
                raise
            out[address] = (None, exc)

    async with trio.open_nursery() as nursery:
        for address in texts:
            nursery.start_soon(one, address)
    return {address: out[address] for address in texts}   # in the order given
