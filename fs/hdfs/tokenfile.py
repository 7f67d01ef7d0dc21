"""A leasefs delegation token as Hadoop's client carries it: the identifier in HDFS's
``DelegationTokenIdentifier`` layout, and the token storage file Hadoop reads from
``HADOOP_TOKEN_FILE_LOCATION`` (``Credentials``, Writable format).

Identifier (every field Writable, ``fs.hdfs.writable``): version byte 0, Text owner, Text
renewer, Text realUser (always empty: leasefs tokens are not issued to proxies), vlong
issueDate ms, vlong maxDate ms, vint sequenceNumber, vint masterKeyId (always 0: the
password comes from the cluster key, ``fs.delegation``). Hadoop's tools decode it
(``Token.decodeIdentifier()``, ``hdfs fetchdt --print``); the metadata server decodes it
back to the ``fs.delegation.TokenId`` whose password it recomputes. The metadata server
issues tokens at whole milliseconds (``issued``/``max_date`` rounded to 3 decimals), so
seconds → ms → seconds gives back the very float the password was computed over; a token
not at whole milliseconds, or an identifier not in exactly this canonical form, is refused
rather than mapped to a neighbour.

Storage file: ``HDTS``, format byte 0 (Writable, what Hadoop 3.5 writes by default), vint
token count, each (Text alias, vint+identifier, vint+password, Text kind, Text service),
vint secret count, each (Text alias, vint+bytes).

Concurrency contract: pure except ``save``/``load`` (blocking file I/O: the command line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..delegation import TokenId, save_secret
from ..errors import AuthenticationFailed, InvalidArgument
from . import writable

KIND = "HDFS_DELEGATION_TOKEN"
MAGIC = b"HDTS"
FORMAT_WRITABLE = 0
IDENTIFIER_VERSION = 0
MAX_FILE = 16 << 20      # a token file is a few hundred bytes; refuse anything absurd
MAX_IDENTIFIER = 1 << 16


def _ms(seconds: float, name: str, token: TokenId) -> int:
    ms = round(seconds * 1000)
    if ms / 1000 != seconds:
        raise InvalidArgument(f"{token.describe()}: {name} {seconds!r} is not a whole "
                              f"millisecond (HDFS identifiers carry milliseconds)")
    return ms


def encode_identifier(token: TokenId) -> bytes:
    """``token`` as HDFS's DelegationTokenIdentifier bytes."""
    return (bytes([IDENTIFIER_VERSION]) + writable.text(token.owner)
            + writable.text(token.renewer) + writable.text("")
            + writable.vlong(_ms(token.issued, "issued", token))
            + writable.vlong(_ms(token.max_date, "max_date", token))
            + writable.vint(token.seq) + writable.vint(0))


def decode_identifier(data: bytes) -> TokenId:
    """The leasefs token an HDFS delegation token identifier names; ``InvalidArgument``
    for anything but the exact form ``encode_identifier`` writes."""
    what = "HDFS delegation token identifier"
    if len(data) > MAX_IDENTIFIER:
        raise InvalidArgument(f"{what}: {len(data)} bytes")
    r = writable.Reader(data, what)
    version = r.byte()
    if version != IDENTIFIER_VERSION:
        r.fail(f"unknown version {version}")
    owner, renewer, real_user = r.text(), r.text(), r.text()
    issued, max_date, seq, key_id = r.vlong(), r.vlong(), r.vint(), r.vint()
    r.end()
    if real_user or key_id:
        r.fail("not a leasefs token (it names a real user or a master key)")
    token = TokenId(seq, owner, renewer, issued / 1000, max_date / 1000)
    if encode_identifier(token) != bytes(data):
        r.fail("not in canonical form")
    return token


@dataclass(frozen=True)
class HadoopToken:
    """One ``org.apache.hadoop.security.token.Token``."""

    identifier: bytes
    password: bytes
    kind: str
    service: str

    def encode(self) -> bytes:
        return (writable.blob(self.identifier) + writable.blob(self.password)
                + writable.text(self.kind) + writable.text(self.service))


def delegation_token(token: TokenId, password: bytes, service: str) -> HadoopToken:
    """A leasefs delegation token for the HDFS server at ``service`` ("ip:port", what
    Hadoop's client looks its token up by)."""
    return HadoopToken(encode_identifier(token), bytes(password), KIND, service)


@dataclass(frozen=True)
class Credentials:
    """Hadoop's token storage: tokens and secret keys by alias."""

    tokens: dict[str, HadoopToken] = field(default_factory=dict)
    secrets: dict[str, bytes] = field(default_factory=dict)

    def encode(self) -> bytes:
        out = [MAGIC, bytes([FORMAT_WRITABLE]), writable.vint(len(self.tokens))]
        for alias, token in self.tokens.items():
            out += [writable.text(alias), token.encode()]
        out.append(writable.vint(len(self.secrets)))
        for alias, secret in self.secrets.items():
            out += [writable.text(alias), writable.blob(secret)]
        return b"".join(out)

    @classmethod
    def decode(cls, data: bytes, what: str = "Hadoop token file") -> "Credentials":
        if data[:4] != MAGIC:
            raise InvalidArgument(f"{what}: no {MAGIC.decode()} header (not a Hadoop token "
                                  f"file)")
        r = writable.Reader(data, what)
        r.take(4)
        version = r.byte()
        if version != FORMAT_WRITABLE:
            r.fail(f"format {version} (only the Writable format 0 is read)")
        tokens = {}
        for _ in range(r.count()):
            alias = r.text()
            tokens[alias] = HadoopToken(r.blob(MAX_FILE), r.blob(MAX_FILE), r.text(),
                                        r.text())
        secrets = {}
        for _ in range(r.count()):
            alias = r.text()
            secrets[alias] = r.blob(MAX_FILE)
        r.end()
        return cls(tokens, secrets)

    def save(self, path: str) -> None:
        """Written whole, mode 0600 from the start: it holds passwords."""
        save_secret(path, self.encode())

    @classmethod
    def load(cls, path: str) -> "Credentials":
        """``AuthenticationFailed`` naming the file and the cause when it cannot be used."""
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_FILE + 1)
        except OSError as exc:
            raise AuthenticationFailed(f"token file {path}: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE:
            raise AuthenticationFailed(f"token file {path}: over {MAX_FILE} bytes")
        try:
            return cls.decode(data, f"token file {path}")
        except InvalidArgument as exc:
            raise AuthenticationFailed(str(exc)) from None


def token_lookup(live_token):
    """The ``lookup`` of ``fs.hdfs.sasl.SaslNegotiation`` for the metadata server:
    ``live_token(wire, what) -> (state, password)`` is its check of a token it issued
    (``AuthenticationFailed`` for an unknown, expired or cancelled one); the lookup takes
    an HDFS identifier and gives ``(password, owner)``."""
    def lookup(identifier: bytes) -> tuple[bytes, str]:
        token = decode_identifier(identifier)
        _state, password = live_token(token.to_wire(), "HDFS SASL")
        return password, token.owner
    return lookup


def is_hadoop_token_file(head: bytes) -> bool:
    return head[:4] == MAGIC


__all__ = ["KIND", "HadoopToken", "Credentials", "encode_identifier", "decode_identifier",
           "delegation_token", "token_lookup", "is_hadoop_token_file"]
