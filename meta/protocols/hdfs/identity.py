"""Who a Hadoop client on the metadata server's HDFS port is (``fs.hdfs.ipc_server``'s
``Identity`` policy), decided by the same session hooks as a msgpack connection's
(``MetaServer.open_session``, ``act_as``), so the rules are the same:

* ``security = simple``: the connection context's ``effectiveUser`` is believed (HDFS
  simple authentication). A ``realUser`` acting for it goes through the acting-for rules
  (believed too under simple). Groups are the system's groups of the user, as HDFS
  resolves them on the NameNode.
* ``security = secure``: only a client on this host is taken, and the kernel names it: the
  uid owning the client's end of the TCP connection (``fs.localserver.connection_owner``)
  is the connection's real user, handed to the session hook as the local socket's peer
  credentials are. A claimed ``effectiveUser`` that differs is refused unless that user
  may act for it (the superuser, ``proxy_users``). A client on another host proves who it
  is with a leasefs delegation token over SASL (TOKEN, DIGEST-MD5: ``fs.hdfs.sasl``; the
  token file Hadoop's client reads is ``leasefs token fetch --hadoop``): the connection is
  the token's owner, as a msgpack connection that authenticated with the token is; a
  context that claims anyone else is refused (a token impersonates no one).

Concurrency contract: the metadata server's trio thread (the kernel's table is read
there, as the local socket's check does); no state of its own.
"""

from __future__ import annotations

import logging
import pwd
from typing import Callable

from fs import localserver
from fs.errors import AuthenticationFailed, LeaseFSError
from fs.frames import brief
from fs.hdfs.ipc_server import Claim, Identity
from fs.hdfs.sasl import SaslNegotiation, SaslRefused
from fs.rpcbase import (ANONYMOUS_USER, PeerCredentials, check_identity, is_loopback_host,
                        os_groups)

log = logging.getLogger(__name__)

REMOTE_REFUSED = ("security = secure: a Hadoop client on another host must prove who it is "
                  "with a leasefs delegation token (fetch one with `leasefs token fetch FILE "
                  "--hadoop` on the metadata server's host and point HADOOP_TOKEN_FILE_"
                  "LOCATION at FILE); on this host the kernel names the user owning the "
                  "client's socket")


class HdfsIdentity(Identity):
    """``open_session(session, user, groups, credentials, peer)`` and
    ``act_as(session, {"user", "groups"})``: the metadata server's session hooks;
    ``token_session(session, owner)``: the session of a connection a delegation token
    proved; ``token_lookup``: ``fs.hdfs.sasl``'s lookup of a token's password and owner;
    ``secure()``: whether identities are proven (asked per connection: the server's keys
    are installed after it is built)."""

    def __init__(self, *, secure: Callable[[], bool], open_session, act_as, token_session,
                 token_lookup, owner_of=localserver.connection_owner):
        self._secure = secure
        self._open_session = open_session
        self._act_as = act_as
        self._token_session = token_session
        self._token_lookup = token_lookup
        self._owner_of = owner_of

    def token_negotiation(self, peer_address: tuple) -> SaslNegotiation | None:
        return SaslNegotiation(self._token_lookup) if self._secure() else None

    def simple_refusal(self, peer_address: tuple) -> str | None:
        if self._secure() and not is_loopback_host(str(peer_address[0])):
            return REMOTE_REFUSED
        return None

    def open_session(self, session: dict, claim: Claim) -> None:
        try:
            user, _ = check_identity(claim.user or ANONYMOUS_USER, [],
                                     "connection context: effectiveUser")
            if claim.real_user is not None:
                check_identity(claim.real_user, [], "connection context: realUser")
        except LeaseFSError as exc:
            raise AuthenticationFailed(exc.message) from None
        if claim.authenticated is not None:
            try:
                claim.authenticated.check_claim(claim.user, claim.real_user)
            except SaslRefused as exc:
                raise AuthenticationFailed(str(exc)) from None
            self._token_session(session, claim.authenticated.user)
            log.info("HDFS connection from %s authenticated as %s with a delegation token",
                     claim.peer, claim.authenticated.user)
            return
        if self._secure():
            self._kernel_session(session, claim, user)
            return
        real = claim.real_user or user
        self._open_session(session, real, os_groups(real), None, claim.peer)
        if real != user:
            try:
                user, _ = self._act_as(session, {"user": user, "groups": []})
            except LeaseFSError as exc:
                raise AuthenticationFailed(exc.message) from None
            session.update(user=user, groups=os_groups(user))

    def _kernel_session(self, session: dict, claim: Claim, user: str) -> None:
        if self.simple_refusal(claim.peer_address) is not None:
            log.warning("HDFS connection from %s refused: not on this host (security = "
                        "secure)", claim.peer)
            raise AuthenticationFailed(REMOTE_REFUSED)
        uid = self._owner_of(claim.peer_address, claim.local_address)
        if uid is None:
            raise AuthenticationFailed(
                f"security = secure: the kernel names no owner of the connection from "
                f"{claim.peer} (not a socket of this host's network namespace): refused")
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        credentials = PeerCredentials(pid=0, uid=uid, gid=gid)
        if claim.real_user is not None and claim.real_user != user:
            log.info("HDFS connection from %s: realUser %s ignored: the kernel names the "
                     "real user", claim.peer, brief(claim.real_user, 80))
        self._open_session(session, user, os_groups(user), credentials, claim.peer)
