"""RPC over framed msgpack: many calls in flight per connection, errors as exceptions.

Wire (see docs/PROTOCOL.md): the client's first frame is a hello
``{"hello": "leasefs", "version": 1, "client_id": str, "user": str, "groups": [str],
"sync_metadata": bool}`` (``user``/``groups``: the caller's identity, HDFS simple
authentication; a hello without ``user`` is user ``nobody`` without groups;
``sync_metadata`` false: the connection's namespace changes are answered once journaled
without waiting for the fsync, see PROTOCOL.md; absent = true); then requests
``[call_id, method, args]`` and replies ``[call_id, ok, result_or_error]`` in any order.
A request may add ``acting_for`` (a map, or null) and then the client's ``state_id`` (the
newest server state it has seen: an observer metadata server serves the call only once it
has applied that much); a hello with ``"state_id": true`` gets replies with the server's
state id as a 4th element (HDFS-12943's RPC header state id).
``call_id`` is unique per ``client_id`` for the client's lifetime (not per connection), so a
call retried on a new connection after a lost reply carries the same ``(client_id, call_id)``
and the server's ``RetryCache`` answers it instead of applying it twice.

Transport: ``fs.framing.FrameChannel`` on both sides — every complete frame a read
brings is handled at once, frames sent in one scheduler round leave in one write, no task
switch per frame; a frame sent while other calls of the connection are in flight waits
for the flusher even when it is the round's first (``defer``), a lone call's leaves at once. So one connection shared by many callers (``fs.client.meta_connection``,
Hadoop IPC's model) carries batches, and a server answers a batch of reads with one write.

The two sides live in their own modules (one job per module, as HDFS separates its IPC
client and server): ``fs.rpcclient`` (``RpcClient``, ``StateAlignment``) and
``fs.rpcserver`` (``Dispatcher``, ``serve_rpc``, ``serve_tcp``, ``serve_local``,
``rpc_refusal``), both built on ``fs.rpcbase`` (what they share: the protocol constants,
addresses and address lists, identity checks and names, local socket names and peer
credentials, ``CallContext`` and ``ACTING_FOR``). This module is the one name callers
import: it re-exports the shared pieces and gives the names of the two sides, loaded on
first use, so ``from fs.rpc import RpcClient, serve_rpc`` works. It needs no trio.

Concurrency contract: see ``fs.rpcbase``, ``fs.rpcclient`` and ``fs.rpcserver``.
"""

from __future__ import annotations

from .rpcbase import (  # noqa: F401  (re-exported: callers import them from fs.rpc)
    ACTING_FOR, ANONYMOUS_USER, MAX_GROUP_NAME, MAX_GROUPS, MAX_HELLO_FRAME, MAX_IDENTITY_BYTES,
    MAX_USER_NAME, PROTOCOL_VERSION, UNAUTHENTICATED, CallContext, PeerCredentials,
    check_identity, current_groups, current_user, format_address, format_address_list,
    group_name, hello, is_default_local_socket, is_loopback_host, local_groups,
    local_socket_address, local_socket_name, normalize_address_list, os_groups, parse_address,
    parse_address_list, user_name)


# --------------------------------------------------------------------------- the two sides
# Loaded on first use of one of their names: fs.rpcclient and fs.rpcserver take the shared
# pieces above from here, and both need trio, which a process making one blocking call
# (``fs.blockingrpc``) never imports; a client process never needs the server side.
_CLIENT_SIDE = ("RetryPolicy", "RpcClient", "StateAlignment")


def __getattr__(name: str):
    """A name of the client side (``fs.rpcclient``) or the server side (``fs.rpcserver``:
    ``serve_rpc``, ``Dispatcher``, ...)."""
    if name in _CLIENT_SIDE:
        from . import rpcclient
        return getattr(rpcclient, name)
    if not name.startswith("__"):
        from . import rpcserver
        if hasattr(rpcserver, name):
            return getattr(rpcserver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # shared
    "ACTING_FOR", "ANONYMOUS_USER", "MAX_GROUPS", "MAX_GROUP_NAME", "MAX_HELLO_FRAME",
    "MAX_IDENTITY_BYTES", "MAX_USER_NAME", "PROTOCOL_VERSION", "UNAUTHENTICATED",
    "CallContext", "PeerCredentials", "check_identity", "current_groups",
    "current_user", "format_address", "format_address_list", "group_name", "is_loopback_host",
    "is_default_local_socket", "local_groups", "local_socket_address", "local_socket_name",
    "normalize_address_list", "os_groups",
    "parse_address", "parse_address_list", "user_name",
    # client (fs.rpcclient)
    "RetryPolicy", "RpcClient", "StateAlignment",
    # server (fs.rpcserver)
    "LOCAL_PEER_PREFIX", "TLS_REFUSAL_TIMEOUT", "Dispatcher", "RetryCache", "check_version",
    "rpc_refusal", "serve_local", "serve_rpc", "serve_tcp",
]
