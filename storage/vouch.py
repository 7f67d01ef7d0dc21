"""A block server's local socket (``storage_socket``), where it vouches for the users of
its host: ``leasefs token fetch FILE`` on a block server's host gets a delegation token of
the calling user without a trip to the metadata server's host.

Why it exists: under ``security = secure`` a TCP connection to the metadata server is
nobody until it shows a token, and only a local socket lets the kernel name a user
(``SO_PEERCRED``). The metadata server has one on its own host; a block server has one on
its host, and its connection to the metadata server has proven the cluster key
(``fs.nodeauth``). So the block server names the caller exactly as the metadata server's
local socket does (the uid's user name, the system's groups of that user:
``fs.rpc.local_groups``) and asks, over that connection, ``vouched_delegation_token(user,
renewer)``; the metadata server issues the token to that user (unless
``storage_vouches_users`` is false) and logs which block server vouched for whom.

The trust argument: whoever is root on a block server's host (or its service user) reads
the cluster key, from which every token's password derives; vouching gives such a host no
power it lacks, and gives each other user of the host a token of their own name only.

Only ``get_delegation_token`` is served here, nothing else: a client checks the socket's
holder first (``fs.localserver.check`` against the uid on the block server's data port).

Concurrency contract: everything runs in the block server's trio thread; each connection
is its own task of ``serve_local``; the call goes to the active metadata server through
``HeartbeatService.call_active``.
"""

from __future__ import annotations

import logging

import trio

from fs.config import Config
from fs.errors import AuthenticationFailed, ServerUnavailable
from fs.limits import ConnectionLimits
from fs.rpc import (Dispatcher, local_groups, local_socket_name, rpc_refusal, serve_local,
                    serve_rpc, user_name)

log = logging.getLogger(__name__)


class VouchDispatcher(Dispatcher):
    """The one call of a block server's local socket, for the user the kernel names."""

    def __init__(self, heartbeat):
        super().__init__()
        self.heartbeat = heartbeat

    def open_session(self, session, user, groups, credentials, peer) -> None:
        real = user_name(credentials.uid)
        if user != real:   # no proxy users here: a token only of one's own name
            log.warning("vouch socket: %s (%s) claimed to be %s: refused", real, peer,
                        user[:80])
            raise AuthenticationFailed(f"user {real} may not act as {user[:80]} here (the "
                                       f"kernel says this connection is {real}'s)")
        session.update(user=real, groups=local_groups(real, credentials))

    async def rpc_get_delegation_token(self, ctx, renewer=None):
        """A new delegation token of the caller, from the active metadata server."""
        log.info("vouching for %s (%s) at the metadata server", ctx.user, ctx.peer)
        try:
            return await self.heartbeat.call_active(
                "vouched_delegation_token", {"user": ctx.user, "renewer": renewer})
        except ServerUnavailable as exc:
            raise ServerUnavailable(f"this host's block server could not reach the metadata "
                                    f"server: {exc}") from None


async def serve_vouch(config: Config, heartbeat, port: int,
                      task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``storage_socket`` of the block server on data port ``port`` until cancelled.
    A name another process holds is logged as an error and not served: the block server
    stores and serves data without it (clients then refuse that holder)."""
    name = local_socket_name(config.storage_socket, ("", port))
    if name is None:
        task_status.started(None)
        return
    dispatcher = VouchDispatcher(heartbeat)

    async def handler(stream, peer, credentials):
        try:
            await serve_rpc(stream, dispatcher, max_frame=64 * 1024, peer=peer,
                            frame_timeout=config.frame_timeout,
                            idle_timeout=config.idle_timeout, credentials=credentials)
        except ServerUnavailable:
            pass

    try:
        await serve_local(handler, name, server="block server (vouch)",
                          limits=ConnectionLimits.from_config(config), refusal=rpc_refusal,
                          task_status=task_status)
    except ServerUnavailable as exc:
        log.error("%s: token fetch on this host will not work", exc)
        task_status.started(None)


__all__ = ["VouchDispatcher", "serve_vouch"]
