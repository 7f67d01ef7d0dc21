"""Hadoop IPC's SASL negotiation, server side, for the one method leasefs offers: TOKEN
(a delegation token, ``fs.hdfs.tokenfile``) over DIGEST-MD5 (RFC 2831, qop ``auth`` only:
Hadoop's default ``hadoop.rpc.protection = authentication``, no security layer).

The exchange (``RpcSaslProto`` bodies of frames whose header has callId -33)::

    client NEGOTIATE            -> server NEGOTIATE auths=[{TOKEN, DIGEST-MD5, protocol "",
                                   serverId "default", challenge}]
    client INITIATE auths=[the chosen auth without its challenge], token=digest response
                                -> server SUCCESS token="rspauth=..."   (the client checks it)

(a client that ignores the piggy-backed challenge sends INITIATE without a token: it gets
CHALLENGE with the same challenge and answers RESPONSE.) Under security = simple the server
answers NEGOTIATE with SUCCESS and the client switches to simple, as Hadoop's server does.

DIGEST-MD5 as Hadoop's TOKEN method uses it: username = base64(token identifier), password
= base64(token password), realm "default", digest-uri "/default" (protocol "" + "/" +
serverId). The nonce is fresh per connection and good for one response, with nonce-count 1:
a response recorded on another connection, or replayed on this one, is refused.

Concurrency contract: pure (no I/O); one ``SaslNegotiation`` per connection, not shared.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Callable

from ..errors import AuthenticationFailed, LeaseFSError
from .pb.ipc_pb2 import RpcSaslProto

REALM = "default"
PROTOCOL = ""
SERVER_ID = "default"
METHOD = "TOKEN"
MECHANISM = "DIGEST-MD5"
CALL_ID = -33                 # the header callId of every SASL frame, both ways
FAILED_CALL_ID = -1           # the header callId of the refusal (status FATAL)
MAX_RESPONSE = 4096           # RFC 2831 2.1.2: a digest-response is under 4096 bytes

# Java class names the refusal carries (Hadoop's client rebuilds or reports them)
INVALID_TOKEN = "org.apache.hadoop.security.token.SecretManager$InvalidToken"
SASL_EXCEPTION = "javax.security.sasl.SaslException"
ACCESS_CONTROL = "org.apache.hadoop.security.AccessControlException"

Lookup = Callable[[bytes], "tuple[bytes, str]"]


class SaslRefused(AuthenticationFailed):
    """The peer did not authenticate. Answer with an RpcResponseHeaderProto{callId
    ``FAILED_CALL_ID``, status FATAL, errorDetail FATAL_UNAUTHORIZED, exceptionClassName
    ``java_class``, errorMsg ``str(exc)``} and close the connection."""

    def __init__(self, message: str, java_class: str = SASL_EXCEPTION):
        super().__init__(message)
        self.java_class = java_class


# ====================================================================== DIGEST-MD5
def _h(data: bytes) -> bytes:
    return hashlib.md5(data).digest()


def _hex_h(data: bytes) -> bytes:
    return hashlib.md5(data).hexdigest().encode()


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_directives(data: bytes, what: str) -> dict[str, str]:
    """RFC 2831 ``name=value`` pairs (values a token or a quoted-string), comma separated,
    blanks around; a name given twice or a malformed list is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslRefused(f"{what}: not UTF-8") from None
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        eq = text.find("=", i)
        if eq < 0:
            raise SaslRefused(f"{what}: {text[i:i + 20]!r} is not name=value")
        name = text[i:eq].strip().lower()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == '"':
            i += 1
            chars = []
            while True:
                if i >= n:
                    raise SaslRefused(f"{what}: unterminated quoted value of {name}")
                c = text[i]
                if c == "\\" and i + 1 < n:
                    chars.append(text[i + 1])
                    i += 2
                    continue
                if c == '"':
                    i += 1
                    break
                chars.append(c)
                i += 1
            value = "".join(chars)
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] != ",":
                raise SaslRefused(f"{what}: text after the quoted value of {name}")
        else:
            end = text.find(",", i)
            end = n if end < 0 else end
            value = text[i:end].strip()
            i = end
        if not name or name in out:
            raise SaslRefused(f"{what}: directive {name!r} empty or given twice")
        out[name] = value
    return out


def _response_value(a1_hash_hex: bytes, nonce: str, nc: str, cnonce: str, qop: str,
                    a2: bytes) -> str:
    return _hex_h(a1_hash_hex + b":" + ":".join((nonce, nc, cnonce, qop)).encode() + b":"
                  + _hex_h(a2)).decode()


def digest_a1(username: str, realm: str, password: str, nonce: str, cnonce: str,
              authzid: str | None = None) -> bytes:
    """HEX(H(A1)) of RFC 2831 2.1.2.1 (charset utf-8)."""
    a1 = (_h(f"{username}:{realm}:{password}".encode("utf-8")) + b":"
          + f"{nonce}:{cnonce}".encode("utf-8"))
    if authzid is not None:
        a1 += b":" + authzid.encode("utf-8")
    return _hex_h(a1)


def digest_response(a1_hex: bytes, nonce: str, nc: str, cnonce: str, qop: str,
                    digest_uri: str) -> str:
    """The client's ``response`` value (qop auth)."""
    return _response_value(a1_hex, nonce, nc, cnonce, qop,
                           b"AUTHENTICATE:" + digest_uri.encode("utf-8"))


def digest_rspauth(a1_hex: bytes, nonce: str, nc: str, cnonce: str, qop: str,
                   digest_uri: str) -> str:
    """The server's ``rspauth`` value (qop auth)."""
    return _response_value(a1_hex, nonce, nc, cnonce, qop, b":" + digest_uri.encode("utf-8"))


@dataclass(frozen=True)
class Authenticated:
    """Who a connection proved to be: the token's ``user`` and its identifier."""

    user: str
    identifier: bytes

    def check_claim(self, effective_user: str | None, real_user: str | None = None) -> None:
        """The connection context (IpcConnectionContextProto.userInfo) names the token's
        user or nobody (Hadoop's client sends none after TOKEN auth: the connection says
        who it is); a token proves one user, it impersonates no one."""
        if (effective_user and effective_user != self.user) or (
                real_user and real_user != self.user):
            claim = effective_user + (f" (via {real_user})" if real_user else "")
            raise SaslRefused(f"Authenticated user ({self.user}) doesn't match what the "
                              f"client claims to be ({claim})", ACCESS_CONTROL)


class DigestServer:
    """One DIGEST-MD5 authentication, server side: ``challenge()`` then one
    ``respond(response)`` (RFC 2831 steps 1 to 3)."""

    def __init__(self, lookup: Lookup, realm: str = REALM,
                 digest_uri: str = f"{PROTOCOL}/{SERVER_ID}", nonce: str | None = None):
        self.lookup = lookup
        self.realm = realm
        self.digest_uri = digest_uri
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(24)).decode()
        self.used = False

    def challenge(self) -> bytes:
        return (f"realm={_quote(self.realm)},nonce={_quote(self.nonce)},qop=\"auth\","
                f"charset=utf-8,algorithm=md5-sess").encode()

    def respond(self, response: bytes) -> tuple[bytes, Authenticated]:
        """The ``rspauth`` answer and who the client is; ``SaslRefused`` saying why not."""
        if self.used:
            raise SaslRefused("DIGEST-MD5: this nonce was already answered (replay)")
        self.used = True
        if len(response) > MAX_RESPONSE:
            raise SaslRefused(f"DIGEST-MD5: response of {len(response)} bytes (limit "
                              f"{MAX_RESPONSE})")
        d = parse_directives(response, "DIGEST-MD5 response")
        for name in ("username", "nonce", "cnonce", "nc", "digest-uri", "response"):
            if not d.get(name):
                raise SaslRefused(f"DIGEST-MD5: response without {name}")
        if d.get("charset", "utf-8").lower() != "utf-8":
            raise SaslRefused(f"DIGEST-MD5: charset {d['charset']!r} (utf-8 only)")
        qop = d.get("qop", "auth")
        if qop != "auth":
            raise SaslRefused(f"DIGEST-MD5: qop {qop!r} refused: leasefs offers only 'auth' "
                              f"(hadoop.rpc.protection = authentication; no integrity or "
                              f"privacy layer)")
        if d.get("realm", "") != self.realm:
            raise SaslRefused(f"DIGEST-MD5: realm {d.get('realm', '')!r}, expected "
                              f"{self.realm!r}")
        if not hmac.compare_digest(d["nonce"].encode(), self.nonce.encode()):
            raise SaslRefused("DIGEST-MD5: response for another nonce (not this "
                              "connection's challenge)")
        if d["nc"] != "00000001":
            raise SaslRefused(f"DIGEST-MD5: nonce-count {d['nc']!r} (one response per nonce: "
                              f"00000001)")
        if d["digest-uri"].lower() != self.digest_uri.lower():
            raise SaslRefused(f"DIGEST-MD5: digest-uri {d['digest-uri']!r}, expected "
                              f"{self.digest_uri!r}")
        authzid = d.get("authzid")
        if authzid is not None and authzid != d["username"]:
            raise SaslRefused("DIGEST-MD5: the authorization id must be the token's own "
                              "identifier", ACCESS_CONTROL)
        try:
            identifier = base64.b64decode(d["username"], validate=True)
        except (binascii.Error, ValueError):
            raise SaslRefused("DIGEST-MD5: username is not a base64 token identifier",
                              INVALID_TOKEN) from None
        try:
            password, user = self.lookup(identifier)
        except LeaseFSError as exc:
            raise SaslRefused(f"token refused: {exc}", INVALID_TOKEN) from None
        a1 = digest_a1(d["username"], self.realm, base64.b64encode(password).decode(),
                       self.nonce, d["cnonce"], authzid)
        expected = digest_response(a1, self.nonce, d["nc"], d["cnonce"], qop,
                                   d["digest-uri"])
        if not hmac.compare_digest(expected.encode(), d["response"].lower().encode()):
            raise SaslRefused("DIGEST-MD5: wrong response (the token's password does not "
                              "match: forged or altered token)", INVALID_TOKEN)
        rspauth = digest_rspauth(a1, self.nonce, d["nc"], d["cnonce"], qop, d["digest-uri"])
        return f"rspauth={rspauth}".encode(), Authenticated(user, identifier)


# ====================================================================== negotiation
def token_auth() -> RpcSaslProto.SaslAuth:
    """The one auth leasefs offers, as the client must echo it in INITIATE."""
    return RpcSaslProto.SaslAuth(method=METHOD, mechanism=MECHANISM, protocol=PROTOCOL,
                                 serverId=SERVER_ID)


class Phase(enum.Enum):
    START = "start"             # nothing received yet
    OFFERED = "offered"         # NEGOTIATE answered with the challenge
    CHALLENGED = "challenged"   # an empty INITIATE got the challenge again
    DONE = "done"               # authenticated (or switched to simple)
    FAILED = "failed"


class SaslNegotiation:
    """The server side of one connection's SASL: feed each received ``RpcSaslProto`` to
    ``step``; it returns the ``RpcSaslProto`` to send (header callId ``CALL_ID``, status
    SUCCESS) or raises ``SaslRefused``. ``authenticated`` is set once ``done``.
    ``lookup`` None = security simple (NEGOTIATE → SUCCESS, the client goes simple)."""

    def __init__(self, lookup: Lookup | None, nonce: str | None = None):
        self.digest = DigestServer(lookup, nonce=nonce) if lookup is not None else None
        self.phase = Phase.START
        self.authenticated: Authenticated | None = None

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def step(self, message: RpcSaslProto) -> RpcSaslProto:
        handler = _TRANSITIONS.get((self.phase, message.state))
        if handler is None:
            failed_in = self.phase
            self.phase = Phase.FAILED
            state = RpcSaslProto.SaslState.Name(message.state)
            if failed_in is Phase.DONE:
                raise SaslRefused("SASL negotiation is already complete")
            raise SaslRefused(f"SASL {state} not expected now ({failed_in.value})")
        try:
            return handler(self, message)
        except SaslRefused:
            self.phase = Phase.FAILED
            raise

    def answer_negotiate(self, message: RpcSaslProto) -> RpcSaslProto:
        if self.digest is None:
            self.phase = Phase.DONE
            return RpcSaslProto(state=RpcSaslProto.SUCCESS)
        self.phase = Phase.OFFERED
        auth = token_auth()
        auth.challenge = self.digest.challenge()
        return RpcSaslProto(state=RpcSaslProto.NEGOTIATE, auths=[auth])

    def answer_initiate(self, message: RpcSaslProto) -> RpcSaslProto:
        if len(message.auths) != 1:
            raise SaslRefused("Client mechanism is malformed (INITIATE names "
                              f"{len(message.auths)} auths, not 1)")
        chosen, ours = message.auths[0], token_auth()
        # values, not field presence: a client may leave the empty protocol unset
        if (chosen.method, chosen.mechanism, chosen.protocol, chosen.serverId) != (
                ours.method, ours.mechanism, ours.protocol, ours.serverId):
            raise SaslRefused(f"{chosen.method[:40]} authentication ({chosen.mechanism[:40]}) "
                              f"is not enabled.  Available:[{METHOD}]", ACCESS_CONTROL)
        if not message.token:
            self.phase = Phase.CHALLENGED
            return RpcSaslProto(state=RpcSaslProto.CHALLENGE, token=self.digest.challenge())
        return self.answer_response(message)

    def answer_response(self, message: RpcSaslProto) -> RpcSaslProto:
        if not message.token:
            raise SaslRefused("Client did not send a token")
        rspauth, self.authenticated = self.digest.respond(message.token)
        self.phase = Phase.DONE
        return RpcSaslProto(state=RpcSaslProto.SUCCESS, token=rspauth)


_TRANSITIONS = {
    (Phase.START, RpcSaslProto.NEGOTIATE): SaslNegotiation.answer_negotiate,
    (Phase.OFFERED, RpcSaslProto.INITIATE): SaslNegotiation.answer_initiate,
    (Phase.CHALLENGED, RpcSaslProto.RESPONSE): SaslNegotiation.answer_response,
}


__all__ = ["SaslNegotiation", "SaslRefused", "Authenticated", "DigestServer", "Phase",
           "CALL_ID", "FAILED_CALL_ID", "token_auth", "parse_directives", "digest_a1",
           "digest_response", "digest_rspauth"]
