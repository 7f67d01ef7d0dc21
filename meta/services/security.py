"""The metadata server's security service: the keys it proves and checks identities with,
who may act for whom, and the delegation tokens.

Why it exists: one object owns what identity rests on, so the front ends (client, block
server, user authentication) ask it instead of each holding keys:

- ``node_key``: the cluster key block servers and the other metadata servers prove they
  hold (``fs.nodeauth``); None with ``security = simple``, where every peer is believed.
- ``block_keys``: the ``KeyRing`` block access tokens are made with (``fs.blocktoken``),
  handed to block servers wrapped with the cluster key (``block_keys_for``).
  ``run_meta_server`` (``meta/serverrun.py``) installs both under ``security = secure``.
- ``proxy_rules``: who may act for whom (``ProxyRules``, HDFS ``hadoop.proxyuser.*``).
- the delegation tokens (``tokens``: seq → ``fs.delegation.TokenState``): rebuilt from the
  namespace at start (``load_tokens``) and kept by ``token_stored``/``token_cancelled``,
  which the token ops (``meta/journal/ops_tokens.py``) call through the ``MemoryState``. Issue, renewal,
  cancellation and the removal of expired tokens are journal records.

The RPC side (sessions, challenges, who the caller of a call is) is the front end
``meta/protocols/user_auth.py``; it decides who asks, this service what they get.

Constructor: the namespace's read view (the tokens and their counter at start), the journal (the token
records), the config (token lifetimes, ``proxy_users``), the superuser (may act for anyone
and cancel any token) and the wall clock (token and key times).

Concurrency contract: the metadata server's one trio thread. The token counter moves before
the issuing record's await, so concurrent issues never share a sequence number; the token
table changes only when a record is applied. ``ProxyRules`` is pure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fs import blocktoken, delegation
from fs.blocktoken import KeyRing
from fs.delegation import TokenId, TokenState
from fs.errors import AuthenticationFailed, InvalidArgument, PermissionDenied

from ..schema import keys
from ..namespace.namespace import check_name
from ..journal.ops_tokens import CancelDelegationToken, DelegationToken, RenewDelegationToken

log = logging.getLogger(__name__)

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


class Security:
    """The cluster key, the block keys, the proxy rules and the delegation tokens."""

    def __init__(self, *, view, journal, config, superuser: str, wall_ns):
        self.view = view
        self.journal = journal
        self.config = config
        self.superuser = superuser
        self.wall_ns = wall_ns
        # the cluster key block servers prove they hold (security = secure; set by
        # run_meta_server), None: simple, every peer is believed
        self.node_key: bytes | None = None
        # block keys tokens are made with (security = secure; set by run_meta_server)
        self.block_keys: KeyRing | None = None
        self.proxy_rules = ProxyRules.parse(config.proxy_users, superuser)
        self.tokens: dict[int, TokenState] = {}     # delegation tokens: seq → TokenState
        self._next_token = 1

    @property
    def secure(self) -> bool:
        """Whether identities are proven (``security = secure``: a cluster key is installed)."""
        return self.node_key is not None

    # ================================================================== block tokens
    def block_token(self, block_id: int, gs: int, user: str, mode: str) -> dict | None:
        """A block access token for ``mode`` on block ``block_id`` at stamp ``gs``
        (``fs.blocktoken``), or None in security = simple."""
        if self.block_keys is None:
            return None
        return self.block_keys.token(block_id, gs, user, mode, self.wall_ns() / 1e9)

    def block_keys_for(self, version) -> dict | None:
        """The block keys a block server should hold (rolled first if due), wrapped with the
        cluster key, or None when it already holds version ``version``."""
        ring = self.block_keys
        if ring is None:
            return None
        ring.roll_if_due(self.wall_ns() / 1e9)
        if version == ring.version:
            return None
        return {"version": ring.version,
                "keys": [blocktoken.wrap(self.node_key, k) for k in ring.keys()]}

    # ================================================================== token state
    def load_tokens(self) -> None:
        """Rebuild the token table and counter from the namespace (start, new active)."""
        self.tokens = {}
        for wire in self.view.delegation_tokens():
            state = TokenState.from_wire(wire)
            self.tokens[state.token.seq] = state
        self._next_token = max(self.view.counters.get(keys.NEXT_TOKEN, 1), self._next_token)

    def token_stored(self, wire: dict) -> None:
        """An applied issue or renewal: the token's state as stored (``TokenState`` wire
        form) goes into the table (``MemoryState``)."""
        state = TokenState.from_wire(wire)
        self.tokens[state.token.seq] = state

    def token_cancelled(self, seq: int) -> None:
        """An applied cancellation: token ``seq`` leaves the table (``MemoryState``)."""
        self.tokens.pop(seq, None)

    # ================================================================== tokens
    def token_master(self, what: str) -> bytes:
        """The key token passwords derive from; ``InvalidArgument`` under security = simple."""
        if self.node_key is None:
            raise InvalidArgument(f"{what}: delegation tokens need security = secure")
        return delegation.master_key(self.node_key)

    def live_token(self, wire, what: str) -> tuple[TokenState, bytes]:
        """The token ``wire`` names, live, with its password; ``AuthenticationFailed``
        saying why not (the log says too; the token's password never appears)."""
        master = self.token_master(what)
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

    async def issue_token(self, what: str, master: bytes, owner: str, renewer,
                          to: str) -> dict:
        """Issue and journal a new token of ``owner`` (``to``: whom for, in the log):
        ``{id, password, expiry}``."""
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

    async def renew_token(self, state: TokenState, caller: str, what: str) -> float:
        """HDFS renewDelegationToken of the live token ``state``: only its renewer; the new
        expiry, journaled."""
        if caller != state.token.renewer:
            raise PermissionDenied(f"{what}: {caller} is not the renewer of "
                                   f"{state.token.describe()} ({state.token.renewer} is)")
        wall = self.wall_ns() / 1e9
        expiry = min(state.token.max_date,
                     round(wall + self.config.delegation_token_renew_interval, 3))
        await self.journal.log(RenewDelegationToken(seq=state.token.seq, expiry=expiry))
        return expiry

    async def cancel_token(self, state: TokenState, caller: str, what: str) -> bool:
        """HDFS cancelDelegationToken of the live token ``state``: its owner or renewer (or
        the superuser); journaled."""
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


__all__ = ["Security", "ProxyRules"]
