"""The op headers and error responses of the block server's data-transfer ops: typed field
checks, the block reference, a write's downstream ``targets`` and ``bytes_per_checksum``,
the error response (and the refusal of a connection over the limits).

Why a module of its own: the pipeline write (``storage.transfer``) and the one-shot
small-block write (``storage.oneshot``) check the same fields the same way, and a peer's bad
header must get the same clear ``ProtocolError`` from both.

Concurrency contract: pure functions, no I/O.
"""

from __future__ import annotations

from fs.config import Config
from fs.errors import InvalidArgument, LeaseFSError, ProtocolError, ServerBusy
from fs.rpc import parse_address

from .layout import check_bytes_per_checksum

#: op headers and responses are small maps; anything bigger is garbage
HEADER_MAX_FRAME = 1 << 20
#: longest downstream list a WRITE_BLOCK header may carry
MAX_TARGETS = 32


def field(header: dict, key: str, kind: type, op: str, default=...):
    """``header[key]`` of type ``kind`` (a bool is not an int here), or ProtocolError."""
    value = header.get(key, default)
    if value is ...:
        raise ProtocolError(f"{op} header lacks {key!r}")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{op} header field {key!r} has the wrong type: {value!r:.80}")
    return value


def block_ref(header: dict, op: str) -> tuple[int, int]:
    block = field(header, "block", dict, op)
    block_id, gs = block.get("id"), block.get("gs")
    if not isinstance(block_id, int) or isinstance(block_id, bool) or not isinstance(gs, int) \
            or isinstance(gs, bool) or gs < 0:
        raise ProtocolError(f"{op}: block must be {{id: int, gs: int >= 0}}, got {block!r:.120}")
    return block_id, gs


def write_targets(header: dict, op: str) -> list[str]:
    """The downstream ``targets`` of a write, each a valid ``host:port``."""
    targets = field(header, "targets", list, op, [])
    if len(targets) > MAX_TARGETS or not all(isinstance(t, str) for t in targets):
        raise ProtocolError(f"{op} targets must be at most {MAX_TARGETS} \"host:port\" "
                            f"strings, got {targets!r:.200}")
    for target in targets:
        parse_address(target)
    return targets


def bytes_per_checksum(header: dict, block_id: int, op: str, config: Config) -> int:
    bpc = field(header, "bytes_per_checksum", int, op, config.bytes_per_checksum)
    try:
        check_bytes_per_checksum(bpc)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{op} blk_{block_id}: {exc.message}") from None
    return bpc


def error_response(exc: LeaseFSError, **extra) -> dict:
    """The message names the error type too, for peers that only print the message."""
    return {"status": "ERROR", "message": f"{type(exc).__name__}: {exc}",
            "error": exc.to_wire(), **extra}


def refusal_response(why: str, kind=ServerBusy) -> dict:
    """The response a refused data-transfer connection gets instead of its op's: ``kind``
    is ``ServerBusy`` for the connection limits, ``TlsError`` for a peer without TLS at a
    TLS port."""
    prefix = "connection refused: " if kind is ServerBusy else ""
    return error_response(kind(f"{prefix}{why}"), first_bad_link="")
