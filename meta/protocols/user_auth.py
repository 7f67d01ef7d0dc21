"""Who a client is (security = secure): the metadata server's side of user authentication,
proxy users and delegation tokens.

Why it exists: identity was whatever a client stated (HDFS simple authentication). Under
``security = "secure"`` a connection's user is decided here, never taken from the hello:

1. **Local socket** (``meta_socket``): the kernel names the connecting process's uid
   (``SO_PEERCRED``); its user name is the connection's user and its groups are the
   system's groups of that user. A hello naming someone else is refused, unless the real
   user may act for them (step 3).
2. **TCP**: the connection has no user until it authenticates: a client with a delegation
   token (``token_challenge`` + ``token_authenticate``, ``fs.delegation``), a block server
   with the cluster key (``node_challenge`` + ``node_authenticate``, ``fs.nodeauth``; that
   gives a node, no user). Every other call before that is refused
   (``AuthenticationRequired``), so a peer that only reaches the port can do nothing.
3. **Proxy users** (HDFS ``hadoop.proxyuser.*``): a request may carry the identity it acts
   for (a FUSE mount acts for the uid the kernel gives each request). Only the superuser
   and the users ``proxy_users`` names may, each for the users listed. The groups are the
   system's groups of the user acted for (as HDFS resolves them on the NameNode), except
   that the superuser's statement is taken as given (a mount run by it passes the groups
   the kernel's caller has; the superuser may do everything anyway).
4. **Delegation tokens**: fetched by a user identified by step 1 (a token is not fetched with
   a token, as in HDFS), or by a user of a block server's host whom that block server
   vouches for (``vouched_delegation_token`` on its authenticated connection; the kernel
   names the user on the block server's local socket, ``storage.vouch``; refused while
   ``storage_vouches_users`` is false); renewed by its renewer, cancelled by its owner or
   renewer; issue,
   renewal, cancellation and the removal of expired tokens are journal records
   (``DELEGATION_TOKEN``, ``RENEW_DELEGATION_TOKEN``, ``CANCEL_DELEGATION_TOKEN``).

The superuser is the user running the metadata server (or ``superuser``) and the members of
``supergroup``, as in HDFS.

``AuthProtocol`` is the front end of all this: the ``Dispatcher`` session hooks
(``open_session``, ``act_as``, ``authenticated``, ``admits_unauthenticated``, which
``MetaServer`` delegates to it) and the token calls as ``rpc_<method>``. It is constructed
with the security service (``meta/services/security.py``: the keys, the proxy rules and the tokens,
which it asks and never holds), the superuser (its stated groups are taken as given; an
in-process call acts as it) and ``storage_vouches_users``. Concurrency contract: the
metadata server's one trio thread; it keeps no state of its own (a connection's identity
lives in its session).
"""

from __future__ import annotations

import logging

from fs import delegation, nodeauth
from fs.errors import AuthenticationFailed, InvalidArgument, PermissionDenied
from fs.frames import brief
from fs.rpc import UNAUTHENTICATED, local_groups, os_groups, user_name

from ..namespace.namespace import check_name

log = logging.getLogger(__name__)

# calls a connection may make before it has a user: the two authentications, and the
# block-server protocol on a connection that authenticated as a node
AUTHENTICATION_METHODS = frozenset({"node_challenge", "node_authenticate", "token_challenge",
                                    "token_authenticate"})
NODE_METHODS = frozenset({"register_storage", "heartbeat", "block_report",
                          "block_received_and_deleted", "commit_block_synchronization",
                          "report_bad_blocks",
                          # a block server vouching for a user of its host (token fetch there)
                          "vouched_delegation_token",
                          # a metadata server bootstrapping from this one's image
                          # (``meta.ha.bootstrap``) proves the cluster key the same way
                          "image_read"})


class AuthProtocol:
    """The ``Dispatcher`` identity hooks and the token calls, as ``rpc_<method>``."""

    def __init__(self, *, security, superuser: str, vouches_users: bool):
        self.security = security
        self.superuser = superuser
        self.vouches_users = vouches_users

    # ================================================================== identity hooks
    def open_session(self, session, user, groups, credentials, peer) -> None:
        """The connection's identity from its hello (``Dispatcher.open_session``)."""
        if not self.security.secure:       # simple: believe the hello
            session.update(user=user, groups=groups, real_user=user, auth="simple")
            return
        if credentials is None:            # TCP: nobody until it authenticates
            session.update(user=UNAUTHENTICATED, groups=(), real_user=None, auth=None)
            return
        real = user_name(credentials.uid)
        if user != real and not self.security.proxy_rules.may_act_for(real, user):
            log.warning("local connection %s: user %s claimed to be %s: refused", peer, real,
                        brief(user, 80))
            raise AuthenticationFailed(f"user {real} may not act as {user[:80]} (the "
                                       f"kernel says this connection is {real}'s; proxy "
                                       f"users: the superuser and proxy_users)")
        if real != self.superuser:
            groups = local_groups(user, credentials)
        session.update(user=user, groups=tuple(groups), real_user=real, auth="local")

    def token_session(self, session, owner: str) -> None:
        """The identity of a connection a delegation token of ``owner`` proved (here or
        over HDFS's SASL): the owner, its groups as this host resolves them."""
        session.update(user=owner, groups=os_groups(owner), real_user=owner, auth="token")

    def act_as(self, session, user, groups):
        """The identity one request acts for: ``user``/``groups`` as it states them (checked
        by ``Dispatcher.act_as``) if this connection's user may act for that user."""
        if not self.security.secure:
            return user, groups
        real = session.get("real_user")
        if real is None:
            raise AuthenticationFailed("acting_for: this connection has not authenticated")
        if not self.security.proxy_rules.may_act_for(real, user):
            raise PermissionDenied(f"user {real} may not act for {user} (proxy users: the "
                                   f"superuser and proxy_users)")
        return user, (groups if real == self.superuser else os_groups(user))

    def authenticated(self, session) -> bool:
        """Whether the connection proved who it is (``Dispatcher.authenticated``)."""
        # a block server's connection proves a node, not a user
        return session.get("user") is not UNAUTHENTICATED or session.get("node") is not None

    def admits_unauthenticated(self, ctx, method) -> bool:
        """The calls a connection makes before it has a user (``Dispatcher`` hook)."""
        return method in AUTHENTICATION_METHODS or (
            method in NODE_METHODS and ctx.session.get("node") is not None)

    def _user_caller(self, ctx, what: str) -> str:
        """The user of a call that needs one identified by the kernel (or in-process)."""
        if getattr(ctx, "user", None) is None:
            return self.superuser
        if self.security.secure and ctx.session.get("auth") != "local":
            raise AuthenticationFailed(f"{what}: only a user the metadata server identified "
                                       f"by its local socket may do this (not with a "
                                       f"token, as in HDFS)")
        return ctx.user

    # ================================================================== token calls
    async def rpc_token_challenge(self, ctx):
        """Step 2 of ``fs.delegation``: a fresh nonce for this connection, usable once."""
        nonce = nodeauth.new_nonce()
        ctx.session["token_challenge"] = nonce
        return nonce

    async def rpc_token_authenticate(self, ctx, token, client_nonce, proof):
        what = "token_authenticate"
        challenge = ctx.session.pop("token_challenge", None)
        try:
            state, secret = self.security.live_token(token, what)
        except (AuthenticationFailed, InvalidArgument) as exc:
            log.warning("token authentication from %s refused: %s", ctx.peer, exc)
            raise
        if not (challenge is not None and isinstance(client_nonce, bytes)
                and len(client_nonce) == nodeauth.NONCE_BYTES
                and nodeauth.same(proof, delegation.client_proof(secret, challenge,
                                                                 client_nonce))):
            log.warning("token authentication from %s as %s refused: wrong proof", ctx.peer,
                        state.token.describe())
            raise AuthenticationFailed(f"{what}: wrong proof for {state.token.describe()} "
                                       f"(not its password, or no fresh challenge on this "
                                       f"connection)")
        owner = state.token.owner
        self.token_session(ctx.session, owner)
        log.info("%s authenticated from %s with %s", owner, ctx.peer, state.token.describe())
        return delegation.server_proof(secret, challenge, client_nonce)

    async def rpc_get_delegation_token(self, ctx, renewer=None):
        """A new token for the caller (HDFS getDelegationToken): ``{id, password}``."""
        what = "get_delegation_token"
        master = self.security.token_master(what)
        owner = self._user_caller(ctx, what)
        return await self.security.issue_token(what, master, owner, renewer, ctx.peer)

    async def rpc_vouched_delegation_token(self, ctx, user, renewer=None):
        """A new token for ``user``, whom the block server of this connection vouches for
        (a user of its host, named there by the kernel: ``storage.vouch``). Only a
        connection that proved the cluster key may ask, and only while
        ``storage_vouches_users``: whoever holds the key could mint any token anyway."""
        what = "vouched_delegation_token"
        master = self.security.token_master(what)
        node = ctx.session.get("node")
        if node is None:
            log.warning("%s from %s refused: not an authenticated block server", what,
                        ctx.peer)
            raise AuthenticationFailed(f"{what}: only an authenticated block server may "
                                       f"vouch for a user (this connection did not prove "
                                       f"it holds the cluster key)")
        user = check_name(user, f"{what}: user")
        if not self.vouches_users:
            log.warning("%s: block server %s vouched for %s: refused (storage_vouches_users "
                        "= false)", what, node, user)
            raise PermissionDenied(f"{what}: this metadata server does not issue tokens to "
                                   f"users a block server vouches for (storage_vouches_users "
                                   f"= false): fetch the token on the metadata server's "
                                   f"host and copy it here")
        log.info("block server %s (%s) vouches for %s", node, ctx.peer, user)
        return await self.security.issue_token(what, master, user, renewer,
                                               f"{user} vouched for by block server {node}")

    async def rpc_renew_delegation_token(self, ctx, token):
        """HDFS renewDelegationToken: only the renewer; the new expiry."""
        what = "renew_delegation_token"
        state, _ = self.security.live_token(token, what)
        caller = self._user_caller(ctx, what)
        return await self.security.renew_token(state, caller, what)

    async def rpc_cancel_delegation_token(self, ctx, token):
        """HDFS cancelDelegationToken: its owner or renewer (or the superuser)."""
        what = "cancel_delegation_token"
        state, _ = self.security.live_token(token, what)
        caller = self._user_caller(ctx, what)
        return await self.security.cancel_token(state, caller, what)


__all__ = ["AuthProtocol", "AUTHENTICATION_METHODS", "NODE_METHODS"]
