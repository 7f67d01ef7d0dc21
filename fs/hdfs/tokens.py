"""A leasefs block access token (``fs.blocktoken``) in the envelope HDFS's client carries
from the metadata server's located blocks to the block servers' data-transfer ops
(``TokenProto``): the client never looks inside, it only passes it on.

``identifier`` is the token's fields (msgpack, the order ``fs.blocktoken`` signs),
``password`` its MAC, ``kind`` HDFS's block-token kind. Simple mode hands out no token: an
empty ``TokenProto`` (every field is required on the wire, all may be empty).

Concurrency contract: pure.
"""

from __future__ import annotations

from ..errors import InvalidToken
from ..frames import packb, unpackb
from .pb.hdfs_pb2 import TokenProto

KIND = "HDFS_BLOCK_TOKEN"
_FIELDS = ("key", "id", "gs", "user", "mode", "expiry")


def to_proto(token: dict | None) -> TokenProto:
    if token is None:
        return TokenProto(identifier=b"", password=b"", kind="", service="")
    return TokenProto(identifier=packb([token[k] for k in _FIELDS]), password=token["mac"],
                      kind=KIND, service="")


def fields_of(identifier: bytes) -> dict:
    """A leasefs block token's fields (no ``mac``) from its HDFS identifier;
    ``InvalidToken`` for anything else."""
    try:
        fields = unpackb(identifier)
    except Exception:
        fields = None
    if not isinstance(fields, list) or len(fields) != len(_FIELDS):
        raise InvalidToken("not a leasefs block token identifier")
    return dict(zip(_FIELDS, fields))


def from_proto(proto: TokenProto) -> dict | None:
    """The leasefs token inside ``proto``; None for an empty one; ``InvalidToken`` for one
    that is not a leasefs block token (``fs.blocktoken.check`` then judges the rest)."""
    if not proto.identifier and not proto.password:
        return None
    try:
        if proto.kind != KIND:
            raise InvalidToken("another kind")
        token = fields_of(proto.identifier)
    except InvalidToken:
        raise InvalidToken(f"not a leasefs block token (kind {proto.kind[:40]!r})") from None
    token["mac"] = bytes(proto.password)
    return token
