"""A leasefs block token survives the trip through HDFS's ``TokenProto`` envelope byte for
byte, and what comes out is still checked by ``fs.blocktoken``: a changed field or MAC is
refused, a foreign token kind is not mistaken for ours."""

import pytest

from fs import blocktoken
from fs.errors import InvalidToken
from fs.hdfs import tokens
from fs.hdfs.pb.hdfs_pb2 import TokenProto

KEY = blocktoken.BlockKey(3, bytes(range(32)), 1e12)


def wire(token):
    return TokenProto.FromString(tokens.to_proto(token).SerializeToString())


def test_a_token_round_trips_and_still_checks():
    token = blocktoken.issue(KEY, 7, 9, "alice", "r", 2e9)
    back = tokens.from_proto(wire(token))
    assert back == token
    blocktoken.check({3: KEY.secret}, back, 7, 9, "r", 1e9, "read")


def test_simple_mode_sends_an_empty_token_and_reads_none():
    assert tokens.from_proto(wire(None)) is None


def test_a_changed_token_is_refused():
    token = blocktoken.issue(KEY, 7, 9, "alice", "r", 2e9)
    proto = tokens.to_proto(token)
    forged = TokenProto(identifier=tokens.to_proto({**token, "user": "root"}).identifier,
                        password=proto.password, kind=proto.kind, service="")
    with pytest.raises(InvalidToken):
        blocktoken.check({3: KEY.secret}, tokens.from_proto(forged), 7, 9, "r", 1e9, "read")
    with pytest.raises(InvalidToken):
        tokens.from_proto(TokenProto(identifier=b"\x01", password=b"x", kind="HDFS_BLOCK_TOKEN",
                                     service=""))
    with pytest.raises(InvalidToken):
        tokens.from_proto(TokenProto(identifier=proto.identifier, password=proto.password,
                                     kind="HDFS_DELEGATION_TOKEN", service=""))
