"""Block access tokens (HDFS ``BlockTokenIdentifier`` and ``BlockTokenSecretManager``):
what lets a block server serve a block to a reader without asking the metadata server.

A token is ``{key, id, gs, user, mode, expiry, mac}``: ``mac`` = HMAC-SHA256 over the other
fields under block key ``key``. Modes (HDFS ``AccessMode``): ``r`` (READ) with every located
block the metadata server hands a caller it has checked may read the file; ``w`` (WRITE)
with every block it hands a writer to write (``add_block``, ``create``'s first block,
``append``'s last block, ``update_block_for_pipeline``'s new stamp); ``c`` (COPY) for a copy
between block servers (a TRANSFER command, ``get_additional_datanode``'s answer to a writer
replacing a pipeline node). Each expires ``block_token_lifetime`` after it was made. A block
server checks it on every op that reads, writes or copies a replica: the key is one it was
given, the MAC matches, the block and stamp are those the op names, the mode allows the op,
and it has not expired. Without a token, anyone who reaches a block server could read any
block by naming its id, overwrite or cut a replica, or have it copied anywhere.

Block keys (``KeyRing``, on the metadata server): random 32-byte secrets with ids. The ring
holds the key tokens are made with (current), the one made next (handed to block servers a
whole interval before it is used, so a block server always knows it in time) and the one
before (still valid for the tokens it made). It rolls every ``block_key_interval`` seconds;
a key is forgotten once every token it made has expired. With metadata HA the keys are
derived from the cluster key instead (``KeyRing(shared=...)``), so every metadata server
holds the same ring and a new active's tokens are good at once. Block servers get the keys with
their registration and heartbeat replies, over their authenticated connection, each secret
wrapped with the cluster key (``wrap``: AES key wrap, RFC 3394), never in the clear.

Concurrency contract: pure; ``now`` (wall seconds) is passed in. A ``KeyRing`` belongs to the
metadata server's trio thread.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap

from .errors import InvalidToken
from .frames import packb
from .nodeauth import KEY_BYTES, mac, same

READ = "r"      # READ_BLOCK, BLOCK_LENGTH
WRITE = "w"     # WRITE_BLOCK stages CREATE, APPEND, STREAMING_RECOVERY; WRITE_BLOCK_ONESHOT
COPY = "c"      # TRANSFER_BLOCK; WRITE_BLOCK stages TRANSFER_RBW, TRANSFER_FINALIZED
_NAMES = {READ: "read", WRITE: "write", COPY: "copy"}
TOKEN_LABEL = b"leasefs block token v1\0"
WRAP_LABEL = b"leasefs block key wrap v1\0"      # form 1 (XOR pad): read, no longer sent
WRAP2_LABEL = b"leasefs block key wrap v2\0"
WRAP_VERSION = 2
SHARED_LABEL = b"leasefs shared block key v1\0"


@dataclass(frozen=True)
class BlockKey:
    key_id: int
    secret: bytes
    expires: float      # wall seconds after which no token made with it is valid


def _fields(token: dict) -> bytes:
    return packb([token["key"], token["id"], token["gs"], token["user"], token["mode"],
                  token["expiry"]])


def issue(key: BlockKey, block_id: int, gs: int, user: str, mode: str, expiry: float) -> dict:
    token = {"key": key.key_id, "id": block_id, "gs": gs, "user": user, "mode": mode,
             "expiry": round(expiry, 3)}
    token["mac"] = mac(key.secret, TOKEN_LABEL, _fields(token))
    return token


def check(keys: dict[int, bytes], token, block_id: int, gs: int, mode: str, now: float,
          what: str) -> None:
    """``InvalidToken`` saying why, unless ``token`` lets ``mode`` on block ``block_id`` at
    stamp ``gs`` now. ``keys``: the block keys this block server was given."""
    if not isinstance(token, dict):
        raise InvalidToken(f"{what}: no block access token (security = secure)")
    try:
        secret = keys.get(token["key"])
        body = _fields(token)
        shown = token["mac"]
    except (KeyError, TypeError, ValueError):
        raise InvalidToken(f"{what}: malformed block access token") from None
    if secret is None:
        raise InvalidToken(f"{what}: block access token made with key {token['key']!r:.20}, "
                           f"which this block server does not have (expired or forged)")
    if not same(shown, mac(secret, TOKEN_LABEL, body)):
        raise InvalidToken(f"{what}: block access token signature does not match (forged or "
                           f"changed)")
    if token["id"] != block_id or token["gs"] != gs:
        raise InvalidToken(f"{what}: block access token is for block {token['id']} stamp "
                           f"{token['gs']}, not block {block_id} stamp {gs}")
    if mode not in str(token["mode"]):
        shown_mode = _NAMES.get(str(token["mode"]), repr(token["mode"])[:10])
        raise InvalidToken(f"{what}: block access token is a {shown_mode} token, not a "
                           f"{_NAMES[mode]} token (mode {mode!r})")
    if not isinstance(token["expiry"], (int, float)) or token["expiry"] < now:
        raise InvalidToken(f"{what}: block access token expired")


def password(keys: dict[int, bytes], token: dict, now: float, what: str) -> bytes:
    """The MAC a genuine ``token`` (its fields, without ``mac``) carries: what a holder
    proves it knows in a challenge-response (HDFS's SASL with a block token) instead of
    showing it; ``InvalidToken`` for a token of an unknown key or one expired."""
    try:
        secret = keys.get(token["key"])
        body = _fields(token)
    except (KeyError, TypeError, ValueError):
        raise InvalidToken(f"{what}: malformed block access token") from None
    if secret is None:
        raise InvalidToken(f"{what}: block access token made with key {token['key']!r:.20}, "
                           f"which this server does not have (expired or forged)")
    if not isinstance(token["expiry"], (int, float)) or token["expiry"] < now:
        raise InvalidToken(f"{what}: block access token expired")
    return mac(secret, TOKEN_LABEL, body)


def wrap(cluster_key: bytes, key: BlockKey) -> dict:
    """A block key as it travels to block servers (form 2): the secret under AES key wrap
    (RFC 3394) with a key-encryption key derived from the cluster key, the key's id and its
    expiry (HKDF), so a changed id, expiry or wrapped secret does not unwrap."""
    return {"v": WRAP_VERSION, "id": key.key_id, "expires": key.expires,
            "wrapped": aes_key_wrap(_kek(cluster_key, key.key_id, key.expires), key.secret)}


def unwrap(cluster_key: bytes, wire: dict) -> BlockKey:
    """The block key a metadata server sent; ``InvalidToken`` saying why for one that is
    malformed, tampered with or wrapped with another cluster key. Reads form 2 and the form
    before it (no ``v``: the secret XORed with an HMAC pad), which metadata servers of an
    earlier release still send during a rolling restart."""
    if not isinstance(wire, dict):
        raise InvalidToken("malformed block key")
    version = wire.get("v", 1)
    if version == 1:
        pad = mac(cluster_key, WRAP_LABEL, packb([wire["id"], wire["expires"]]))
        secret = bytes(wire["secret"])
        if len(secret) != KEY_BYTES:
            raise InvalidToken("block key of the wrong size")
        return BlockKey(wire["id"], bytes(a ^ b for a, b in zip(secret, pad)), wire["expires"])
    if version != WRAP_VERSION:
        raise InvalidToken(f"block key {wire.get('id')!r:.20} in wrap form {version!r:.10}, "
                           f"which this block server does not read (it reads 1 and 2)")
    wrapped = wire["wrapped"]
    if not isinstance(wrapped, (bytes, bytearray)) or len(wrapped) != KEY_BYTES + 8:
        raise InvalidToken(f"block key {wire['id']!r:.20}: wrapped secret of the wrong size")
    try:
        secret = aes_key_unwrap(_kek(cluster_key, wire["id"], wire["expires"]), bytes(wrapped))
    except InvalidUnwrap:
        raise InvalidToken(f"block key {wire['id']!r:.20} does not unwrap with this cluster "
                           f"key (changed on the way, or another cluster's key)") from None
    return BlockKey(wire["id"], secret, wire["expires"])


def _kek(cluster_key: bytes, key_id, expires) -> bytes:
    """The key-encryption key of one block key: bound to its id and expiry."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=WRAP2_LABEL + packb([key_id, expires])).derive(cluster_key)


class KeyRing:
    """The metadata server's block keys: ``previous``, ``current`` (tokens are made with it)
    and ``next`` (already at the block servers); ``version`` changes at every roll.

    ``shared``: with metadata HA every metadata server must make tokens the block servers
    accept the moment it becomes active, so the keys are not random but derived from the
    cluster key the servers share: the key of interval ``p`` (wall time // ``interval``) is
    ``HMAC(cluster key, label + p)`` with id and version ``p``. Every server then holds the
    same ring at the same time, with no exchange between them; the keys stay as secret as
    the cluster key itself."""

    def __init__(self, interval: float, lifetime: float, now: float,
                 shared: bytes | None = None):
        self.interval = interval
        self.lifetime = lifetime
        self.shared = shared
        self._ids = int.from_bytes(secrets.token_bytes(3), "big") << 8   # apart across restarts
        self.previous: BlockKey | None = None
        if shared is not None:
            self._derive(int(now // interval))
            return
        self.current = self._new(now)
        self.next = self._new(now + interval)
        self.rolled_at = now
        self.version = 1

    def _new(self, start: float) -> BlockKey:
        self._ids += 1
        # valid for the interval it makes tokens in, plus the lifetime of the last one
        return BlockKey(self._ids, secrets.token_bytes(KEY_BYTES),
                        start + 2 * self.interval + self.lifetime)

    def _shared_key(self, period: int) -> BlockKey:
        return BlockKey(period, mac(self.shared, SHARED_LABEL, str(period).encode()),
                        (period + 2) * self.interval + self.lifetime)

    def _derive(self, period: int) -> None:
        self.previous = self._shared_key(period - 1)
        self.current = self._shared_key(period)
        self.next = self._shared_key(period + 1)
        self.rolled_at = period * self.interval
        self.version = period

    def roll_if_due(self, now: float) -> bool:
        if now - self.rolled_at < self.interval:
            return False
        if self.shared is not None:
            self._derive(int(now // self.interval))
            return True
        self.previous, self.current = self.current, self.next
        self.next = self._new(now + self.interval)
        self.rolled_at = now
        self.version += 1
        return True

    def token(self, block_id: int, gs: int, user: str, mode: str, now: float) -> dict:
        self.roll_if_due(now)
        return issue(self.current, block_id, gs, user, mode, now + self.lifetime)

    def keys(self) -> list[BlockKey]:
        return [k for k in (self.previous, self.current, self.next) if k is not None]


__all__ = ["READ", "WRITE", "COPY", "BlockKey", "issue", "check", "password", "wrap", "unwrap",
           "KeyRing"]
