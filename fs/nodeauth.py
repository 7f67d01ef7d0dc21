"""Block servers and the metadata server prove to each other that they hold the cluster key
(``security = "secure"``); the key never travels.

The exchange, on each RPC connection a block server opens to the metadata server, before
any other call of it:

1. ``node_challenge``: the metadata server answers a fresh random ``server_nonce``, kept
   for this connection only and usable once.
2. ``node_authenticate(node_id, client_nonce, proof)`` with
   ``proof = HMAC-SHA256(key, NODE_LABEL | server_nonce | client_nonce | node_id)``.
3. The metadata server recomputes it; on a match the connection belongs to ``node_id``
   (block-server calls on it are taken for that node only) and it answers
   ``HMAC-SHA256(key, META_LABEL | client_nonce | server_nonce | node_id)``.
4. The block server checks that answer, so a server without the key cannot command it.

A proof is bound to both nonces and to the node id: one recorded on another connection, or
made for another node, is worth nothing. HDFS gets the same from Kerberos service
principals; a shared cluster key needs no KDC.

Block recovery's ops between block servers (INIT_REPLICA_RECOVERY, which stops a replica's
writer, and UPDATE_REPLICA_UNDER_RECOVERY, which cuts it) carry a MAC by the same key over
the whole op header and the time it was issued (``sign_op``/``check_op``): anyone else
reaching a block server's data port could otherwise stop writes and cut replicas.

The key file holds 32 random bytes as 64 hex digits, mode 0600; the metadata server creates
it when missing (``ensure_key``), block servers only read a copy (``load_key``).

Concurrency contract: pure functions and blocking file reads at start-up; no state.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

from .datafolder import make_private_folder
from .errors import AuthenticationFailed, InvalidArgument
from .frames import packb

KEY_BYTES = 32
NONCE_BYTES = 32
NODE_LABEL = b"leasefs node auth v1\0"
META_LABEL = b"leasefs meta auth v1\0"
OP_LABEL = b"leasefs node op v1\0"
OP_WINDOW = 300.0   # seconds a signed op stays valid (clocks of the block servers may differ)


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts`` under ``key`` (every MAC of the cluster's secrets)."""
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def node_proof(key: bytes, server_nonce: bytes, client_nonce: bytes, node_id: str) -> bytes:
    """What a block server answers to a challenge."""
    return mac(key, NODE_LABEL, server_nonce, client_nonce, node_id.encode())


def meta_proof(key: bytes, server_nonce: bytes, client_nonce: bytes, node_id: str) -> bytes:
    """What the metadata server answers to a block server's proof."""
    return mac(key, META_LABEL, client_nonce, server_nonce, node_id.encode())


async def authenticate(call, key: bytes, node_id: str, address: str) -> None:
    """The node's side of steps 1-3 on a new connection to the metadata server at
    ``address``: ``call(method, args)`` is the connection's; prove we hold the cluster key,
    and check that the server does too (else it could command us, or hand us its state).
    ``AuthenticationFailed`` otherwise."""
    server_nonce = await call("node_challenge", {})
    if not isinstance(server_nonce, bytes):
        raise AuthenticationFailed(f"metadata server {address} sent no "
                                   f"challenge (is it in security = simple?)")
    client_nonce = new_nonce()
    answer = await call("node_authenticate", {
        "node_id": node_id, "client_nonce": client_nonce,
        "proof": node_proof(key, server_nonce, client_nonce, node_id)})
    if not same(answer, meta_proof(key, server_nonce, client_nonce, node_id)):
        raise AuthenticationFailed(f"metadata server {address} did not prove "
                                   f"that it holds the cluster key")


def same(a, b) -> bool:
    """Constant-time equality of two proofs (anything not bytes never matches)."""
    return isinstance(a, (bytes, bytearray)) and isinstance(b, (bytes, bytearray)) \
        and hmac.compare_digest(bytes(a), bytes(b))


def sign_op(key: bytes, header: dict, now: float) -> dict:
    """``header`` (a data-transfer op one block server sends another: the block-recovery
    ops) with ``issued`` (wall seconds) and ``mac`` over all of it."""
    signed = {**header, "issued": round(now, 3)}
    return {**signed, "mac": mac(key, OP_LABEL, _canonical(signed))}


def check_op(key: bytes, header: dict, now: float, what: str) -> None:
    """``AuthenticationFailed`` unless ``header`` carries a MAC by the cluster key made
    within ``OP_WINDOW`` seconds of ``now`` (a recorded op is refused once that passed,
    and before that it repeats what it did: the recovery ops are idempotent per recovery
    id)."""
    shown, issued = header.get("mac"), header.get("issued")
    if not isinstance(issued, (int, float)) or isinstance(issued, bool):
        raise AuthenticationFailed(f"{what}: not signed by a block server of this cluster "
                                   f"(security = secure)")
    body = {k: v for k, v in header.items() if k != "mac"}
    if not same(shown, mac(key, OP_LABEL, _canonical(body))):
        raise AuthenticationFailed(f"{what}: signature does not match (not made with this "
                                   f"cluster's key, or the op was changed)")
    if abs(now - issued) > OP_WINDOW:
        raise AuthenticationFailed(f"{what}: signed {now - issued:.0f} s ago, outside the "
                                   f"{OP_WINDOW:g} s window (replayed, or clocks apart)")


def _canonical(header: dict) -> bytes:
    return packb(sorted(header.items()))


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def load_key(path: str) -> bytes:
    """The cluster key from ``path``; ``AuthenticationFailed`` naming the file and what is
    wrong with it (missing, readable by others, not 64 hex digits)."""
    if not path:
        raise InvalidArgument("security = secure needs the cluster key: set cluster_key_file "
                              "to a copy of the metadata server's <data>/cluster.key (mode "
                              "0600), or security = simple on a trusted network")
    try:
        info = os.stat(path)
        with open(path, "rb") as fh:
            text = fh.read(4 * KEY_BYTES)
    except OSError as exc:
        raise AuthenticationFailed(f"cluster key {path}: {exc.strerror or exc}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthenticationFailed(f"cluster key {path}: readable by others "
                                   f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 600 it")
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise AuthenticationFailed(f"cluster key {path}: not {2 * KEY_BYTES} hex digits")
    return key


def ensure_key(path: str) -> bytes:
    """The cluster key at ``path``, created (mode 0600, written whole or not at all) when
    the file does not exist."""
    if not os.path.exists(path):
        make_private_folder(os.path.dirname(path) or ".")   # by default the metadata server's
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES).hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)   # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return load_key(path)


def key_path(configured: str, meta_data_dir) -> str:
    """Where the key is: ``configured`` (the ``cluster_key_file`` setting), else the
    metadata server's data folder ``meta_data_dir``, where it makes the key."""
    return configured or os.path.join(meta_data_dir, "cluster.key")


__all__ = ["KEY_BYTES", "authenticate", "mac", "node_proof", "meta_proof", "same", "sign_op", "check_op",
           "new_nonce", "load_key", "ensure_key", "key_path"]
