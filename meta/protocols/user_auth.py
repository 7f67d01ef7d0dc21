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

``AuthProtocol`` is a mixin: ``MetaServer`` composes it and owns the state (``tokens``: seq
→ ``TokenState``, rebuilt from the namespace at start and kept by ``apply_token_effect``).
Concurrency contract: that of ``MetaServer`` (its one trio thread); ``ProxyRules`` is pure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fs import delegation, nodeauth
from fs.delegation import TokenId, TokenState
from fs.errors import AuthenticationFailed, InvalidArgument, PermissionDenied
from fs.frames import brief
from fs.rpc import UNAUTHENTICATED, local_groups, os_groups, user_name

from ..journal import keys
from ..namespace.namespace import check_name
from ..journal.ops_tokens import CancelDelegationToken, DelegationToken, RenewDelegationToken

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
ANY = "*"


@dataclass(frozen=True)
class ProxyRules:
    """Who may act for whom: ``proxy_users`` = ``NAME=USER|USER,NAME2=*``, plus the
    superuser for anyone."""

    superuser: str
    rules: tuple[tuple[str, frozenset[str]], ...] = ()

    @classmethod
    def parse(cls, text: str, superuser: str) -> "ProxyRules":
        rules = []
        for entry in filter(None, (e.strip() for e in (text or "").split(","))):
            name, sep, targets = entry.partition("=")
            names = frozenset(filter(None, (t.strip() for t in targets.split("|"))))
            if not sep or not name.strip() or not names:
                raise InvalidArgument(f"proxy_users: {entry!r} is not NAME=USER|USER or "
                                      f"NAME=*")
            rules.append((name.strip(), names))
        return cls(superuser, tuple(rules))

    def may_act_for(self, real: str, target: str) -> bool:
        if real == target or real == self.superuser:
            return True
        return any(name == real and (ANY in targets or target in targets)
                   for name, targets in self.rules)


class AuthProtocol:
    """The ``Dispatcher`` identity hooks and the token calls, as ``rpc_<method>``."""

    # ================================================================== identity hooks
    def open_session(self, session, user, groups, credentials, peer) -> None:
        if self.node_key is None:          # simple: believe the hello
            session.update(user=user, groups=groups, real_user=user, auth="simple")
            return
        if credentials is None:            # TCP: nobody until it authenticates
            session.update(user=UNAUTHENTICATED, groups=(), real_user=None, auth=None)
            return
        real = user_name(credentials.uid)
        if user != real and not self.proxy_rules.may_act_for(real, user):
            log.warning("local connection %s: user %s claimed to be %s: refused", peer, real,
                        brief(user, 80))
            raise AuthenticationFailed(f"user {real} may not act as {user[:80]} (the "
                                       f"kernel says this connection is {real}'s; proxy "
                                       f"users: the superuser and proxy_users)")
        if real != self.superuser:
            groups = local_groups(user, credentials)
        session.update(user=user, groups=tuple(groups), real_user=real, auth="local")

    def act_as(self, session, acting):
        user, groups = super().act_as(session, acting)
        if self.node_key is None:
            return user, groups
        real = session.get("real_user")
        if real is None:
            raise AuthenticationFailed("acting_for: this connection has not authenticated")
        if not self.proxy_rules.may_act_for(real, user):
            raise PermissionDenied(f"user {real} may not act for {user} (proxy users: the "
                                   f"superuser and proxy_users)")
        return user, (groups if real == self.superuser else os_groups(user))

    def authenticated(self, session) -> bool:
        # a block server's connection proves a node, not a user
        return session.get("user") is not UNAUTHENTICATED or session.get("node") is not None

    def admits_unauthenticated(self, ctx, method) -> bool:
        return method in AUTHENTICATION_METHODS or (
            method in NODE_METHODS and ctx.session.get("node") is not None)

    # ================================================================== token state
    def load_tokens(self) -> None:
        self.tokens = {}
        for wire in self.ns.delegation_tokens():
            state = TokenState.from_wire(wire)
            self.tokens[state.token.seq] = state
        self._next_token = max(self.ns.counters.get(keys.NEXT_TOKEN, 1), self._next_token)

    def apply_token_effect(self, op: str, effect: dict) -> None:
        if "token" in effect:
            state = TokenState.from_wire(effect["token"])
            self.tokens[state.token.seq] = state
        elif op == "CANCEL_DELEGATION_TOKEN":
            self.tokens.pop(effect.get("seq"), None)

    def _token_master(self, what: str) -> bytes:
        if self.node_key is None:
            raise InvalidArgument(f"{what}: delegation tokens need security = secure")
        return delegation.master_key(self.node_key)

    def _live_token(self, wire, what: str) -> tuple[TokenState, bytes]:
        """The token ``wire`` names, live, with its password; ``AuthenticationFailed``
        saying why not (the log says too; the token's password never appears)."""
        master = self._token_master(what)
        token = TokenId.from_wire(wire, what)
        state = self.tokens.get(token.seq)
        wall = self.wall_ns() / 1e9
        if state is None or state.token != token:
            raise AuthenticationFailed(f"{what}: {token.describe()} is not known (cancelled, "
                                       f"expired and removed, or never issued here)")
        if state.expiry < wall:
            raise AuthenticationFailed(f"{what}: {token.describe()} expired "
                                       f"{wall - state.expiry:.0f} s ago (renew it before "
                                       f"its expiry)")
        return state, delegation.password(master, token)

    def _user_caller(self, ctx, what: str) -> str:
        """The user of a call that needs one identified by the kernel (or in-process)."""
        if getattr(ctx, "user", None) is None:
            return self.superuser
        if self.node_key is not None and ctx.session.get("auth") != "local":
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
            state, secret = self._live_token(token, what)
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
        ctx.session.update(user=owner, groups=os_groups(owner), real_user=owner, auth="token")
        log.info("%s authenticated from %s with %s", owner, ctx.peer, state.token.describe())
        return delegation.server_proof(secret, challenge, client_nonce)

    async def rpc_get_delegation_token(self, ctx, renewer=None):
        """A new token for the caller (HDFS getDelegationToken): ``{id, password}``."""
        what = "get_delegation_token"
        master = self._token_master(what)
        owner = self._user_caller(ctx, what)
        return await self._issue_token(what, master, owner, renewer, ctx.peer)

    async def rpc_vouched_delegation_token(self, ctx, user, renewer=None):
        """A new token for ``user``, whom the block server of this connection vouches for
        (a user of its host, named there by the kernel: ``storage.vouch``). Only a
        connection that proved the cluster key may ask, and only while
        ``storage_vouches_users``: whoever holds the key could mint any token anyway."""
        what = "vouched_delegation_token"
        master = self._token_master(what)
        node = ctx.session.get("node")
        if node is None:
            log.warning("%s from %s refused: not an authenticated block server", what,
                        ctx.peer)
            raise AuthenticationFailed(f"{what}: only an authenticated block server may "
                                       f"vouch for a user (this connection did not prove "
                                       f"it holds the cluster key)")
        user = check_name(user, f"{what}: user")
        if not self.config.storage_vouches_users:
            log.warning("%s: block server %s vouched for %s: refused (storage_vouches_users "
                        "= false)", what, node, user)
            raise PermissionDenied(f"{what}: this metadata server does not issue tokens to "
                                   f"users a block server vouches for (storage_vouches_users "
                                   f"= false): fetch the token on the metadata server's "
                                   f"host and copy it here")
        log.info("block server %s (%s) vouches for %s", node, ctx.peer, user)
        return await self._issue_token(what, master, user, renewer,
                                       f"{user} vouched for by block server {node}")

    async def _issue_token(self, what: str, master: bytes, owner: str, renewer,
                           to: str) -> dict:
        """Issue and journal a new token of ``owner``: ``{id, password, expiry}``."""
        renewer = owner if renewer is None else check_name(renewer, f"{what}: renewer")
        wall = self.wall_ns() / 1e9
        seq = self._next_token
        self._next_token += 1
        token = TokenId(seq, owner, renewer, round(wall, 3),
                        round(wall + self.config.delegation_token_max_lifetime, 3))
        expiry = min(token.max_date, round(wall + self.config.delegation_token_renew_interval,
                                           3))
        await self.journal.log(DelegationToken(**TokenState(token, expiry).to_wire()))
        log.info("issued %s (renewer %s) to %s", token.describe(), renewer, to)
        return {"id": token.to_wire(), "password": delegation.password(master, token),
                "expiry": expiry}

    async def rpc_renew_delegation_token(self, ctx, token):
        """HDFS renewDelegationToken: only the renewer; the new expiry."""
        what = "renew_delegation_token"
        state, _ = self._live_token(token, what)
        caller = self._user_caller(ctx, what)
        if caller != state.token.renewer:
            raise PermissionDenied(f"{what}: {caller} is not the renewer of "
                                   f"{state.token.describe()} ({state.token.renewer} is)")
        wall = self.wall_ns() / 1e9
        expiry = min(state.token.max_date,
                     round(wall + self.config.delegation_token_renew_interval, 3))
        await self.journal.log(RenewDelegationToken(seq=state.token.seq, expiry=expiry))
        return expiry

    async def rpc_cancel_delegation_token(self, ctx, token):
        """HDFS cancelDelegationToken: its owner or renewer (or the superuser)."""
        what = "cancel_delegation_token"
        state, _ = self._live_token(token, what)
        caller = self._user_caller(ctx, what)
        if caller not in (state.token.owner, state.token.renewer, self.superuser):
            raise PermissionDenied(f"{what}: {caller} may not cancel {state.token.describe()} "
                                   f"(its owner, its renewer or the superuser may)")
        await self.journal.log(CancelDelegationToken(seq=state.token.seq))
        log.info("%s cancelled %s", caller, state.token.describe())
        return True

    async def remove_expired_tokens(self) -> int:
        """HDFS ExpiredTokenRemover: journal the removal of tokens past their expiry."""
        wall = self.wall_ns() / 1e9
        gone = [seq for seq, state in self.tokens.items() if state.expiry < wall]
        if gone:
            await self.journal.log_many([CancelDelegationToken(seq=seq) for seq in gone])
        return len(gone)


__all__ = ["AuthProtocol", "ProxyRules", "AUTHENTICATION_METHODS", "NODE_METHODS"]
