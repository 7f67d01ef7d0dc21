"""Delegation tokens (HDFS ``DelegationTokenIdentifier`` and
``AbstractDelegationTokenSecretManager``): how a client that cannot be identified by the
kernel (another machine, a Spark executor elsewhere) proves who it is.

A token is an identifier ``{seq, owner, renewer, issued, max_date}`` and a password
``HMAC-SHA256(master, TOKEN_LABEL | msgpack(identifier))``; ``master`` is derived from the
cluster key, so only the metadata server can make or check a password and nothing secret
is stored. What a token may still do is state, journaled by the metadata server: the
token's current ``expiry`` (``issued`` + ``delegation_token_renew_interval``, moved on by
each renewal, never past ``max_date``) and whether it exists at all (cancelled or expired
tokens are removed). So a token is:

1. fetched by a user the metadata server identified otherwise (a local client, by its
   kernel credentials): ``get_delegation_token(renewer)``; the user's token file (mode
   0600) keeps identifier, password and the metadata server's address;
2. used on a new connection: ``token_challenge`` gives a fresh server nonce, then
   ``token_authenticate(identifier, client_nonce, proof)`` with ``proof =
   client_proof(password, server_nonce, client_nonce)``; the server recomputes the password,
   checks the token is live and answers ``server_proof(...)``, which the client checks
   (a server without the cluster key cannot pass itself off). The password never travels;
   a proof recorded on one connection is worth nothing on another (its nonce is gone);
3. renewed by its renewer before ``expiry`` and cancelled by its owner or renewer
   (``leasefs token renew/cancel``); both take effect at once and survive restarts.

Concurrency contract: pure functions and dataclasses; file reads and writes are blocking
(the command line and start-up only).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import AuthenticationFailed, InvalidArgument
from .frames import packb
from .nodeauth import mac

TOKEN_LABEL = b"leasefs delegation token v1\0"
MASTER_LABEL = b"leasefs delegation master v1\0"
CLIENT_LABEL = b"leasefs token auth client v1\0"
SERVER_LABEL = b"leasefs token auth server v1\0"
FILE_KIND = "leasefs-delegation-token"


@dataclass(frozen=True)
class TokenId:
    """What a token says; its wire form is ``to_wire()``."""

    seq: int
    owner: str
    renewer: str
    issued: float       # wall seconds
    max_date: float     # wall seconds: no renewal goes past it

    def to_wire(self) -> dict:
        return {"seq": self.seq, "owner": self.owner, "renewer": self.renewer,
                "issued": self.issued, "max_date": self.max_date}

    @classmethod
    def from_wire(cls, wire, what: str = "delegation token") -> "TokenId":
        try:
            token = cls(wire["seq"], wire["owner"], wire["renewer"], wire["issued"],
                        wire["max_date"])
        except (KeyError, TypeError):
            raise InvalidArgument(f"{what}: malformed token identifier") from None
        if not (type(token.seq) is int and isinstance(token.owner, str)
                and isinstance(token.renewer, str)
                and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                        for t in (token.issued, token.max_date))):
            raise InvalidArgument(f"{what}: malformed token identifier")
        return token

    def describe(self) -> str:
        return f"token {self.seq} of {self.owner}"


@dataclass(frozen=True)
class TokenState:
    """A live token as the metadata server keeps it (its ``T`` key)."""

    token: TokenId
    expiry: float       # wall seconds: authentication fails after it unless renewed

    def to_wire(self) -> dict:
        return {**self.token.to_wire(), "expiry": self.expiry}

    @classmethod
    def from_wire(cls, wire) -> "TokenState":
        return cls(TokenId.from_wire(wire), wire["expiry"])


def master_key(cluster_key: bytes) -> bytes:
    return mac(cluster_key, MASTER_LABEL)


def password(master: bytes, token: TokenId) -> bytes:
    return mac(master, TOKEN_LABEL, packb(list(token.to_wire().values())))


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return mac(secret, CLIENT_LABEL, server_nonce, client_nonce)


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return mac(secret, SERVER_LABEL, client_nonce, server_nonce)


def save_secret(path: str, body: bytes) -> None:
    """``body`` written whole to ``path`` (temporary file + rename), mode 0600 from the
    start: a token file holds a password."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True)
class TokenFile:
    """A fetched token as its owner keeps it: identifier, password, and the metadata
    server (``service``, HOST:PORT) it is good for."""

    token: TokenId
    secret: bytes
    service: str

    def save(self, path: str) -> None:
        """Written whole (temporary file + rename), mode 0600 from the start."""
        body = json.dumps({"kind": FILE_KIND, "service": self.service,
                           "id": self.token.to_wire(), "password": self.secret.hex()},
                          indent=1) + "\n"
        save_secret(path, body.encode())

    @classmethod
    def load(cls, path: str) -> "TokenFile":
        """``AuthenticationFailed`` naming the file and the cause when it cannot be used."""
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise AuthenticationFailed(f"token file {path}: {exc.strerror or exc}") from None
        except ValueError:
            raise AuthenticationFailed(f"token file {path}: not a token file (JSON)") from None
        if not isinstance(data, dict) or data.get("kind") != FILE_KIND:
            raise AuthenticationFailed(f"token file {path}: not a leasefs delegation token")
        try:
            secret = bytes.fromhex(data["password"])
            return cls(TokenId.from_wire(data["id"], f"token file {path}"), secret,
                       str(data["service"]))
        except (KeyError, TypeError, ValueError, InvalidArgument) as exc:
            raise AuthenticationFailed(f"token file {path}: malformed ({exc})") from None


__all__ = ["TokenId", "TokenState", "TokenFile", "master_key", "password", "client_proof",
           "server_proof", "save_secret"]
