"""The block server's answer to Hadoop's ``ClientDatanodeProtocol`` (Hadoop IPC, served by
``fs.hdfs.ipc_server`` on the HDFS data-transfer port, told apart by its first bytes:
``fs.hdfs.sniff``): ``getReplicaVisibleLength``, which Hadoop's client asks a replica's
block server when it opens a file whose last block is still being written, to learn how
much of it a reader may see (the bytes every pipeline node acknowledged: what an hflush
made visible).

Identity: the client names its connection after the block (``blk_<id>_<stamp>``) and
carries the located block's token.

* ``security = simple``: believed, as HDFS's simple mode does (the client's SASL
  NEGOTIATE is answered SUCCESS: it goes on simple).
* ``security = secure``: a client on this host is taken (the kernel vouches that it is a
  local process; the length is what any reader of the file may stat); a client on another
  host must prove it holds the block's read token: SASL TOKEN over DIGEST-MD5
  (``fs.hdfs.sasl``) with the token's identifier as user name and its MAC as password,
  checked with this block server's block keys, and may then ask about that block only.

Concurrency contract: the block server's trio thread; no state but the constructor's.
"""

from __future__ import annotations

import time

from fs import blocktoken
from fs.errors import AuthenticationFailed, InvalidToken, PermissionDenied
from fs.hdfs import tokens
from fs.hdfs.ipc_server import Claim, Identity
from fs.hdfs.pb import client_datanode_pb2 as pb
from fs.hdfs.sasl import SaslNegotiation, SaslRefused
from fs.rpcbase import is_loopback_host

CLIENT_DATANODE_PROTOCOL = "org.apache.hadoop.hdfs.protocol.ClientDatanodeProtocol"

REMOTE_REFUSED = ("security = secure: a Hadoop client on another host must show the block's "
                  "access token (SASL TOKEN) to ask this block server about a replica")


class ClientDatanode:
    """The translator (``fs.hdfs.ipc_server``) over a ``storage.transfer.
    DataTransferServer``."""

    PROTOCOL = CLIENT_DATANODE_PROTOCOL
    CALLS = {"getReplicaVisibleLength": (pb.GetReplicaVisibleLengthRequestProto,
                                         pb.GetReplicaVisibleLengthResponseProto)}

    def __init__(self, transfer):
        self.transfer = transfer

    async def getReplicaVisibleLength(self, ctx, request):
        block = request.block
        proven = (ctx.session or {}).get("block_token")
        if proven is not None and proven["id"] != block.blockId:
            raise PermissionDenied(f"getReplicaVisibleLength blk_{block.blockId}: the "
                                   f"connection proved a token of blk_{proven['id']}, not "
                                   f"this block")
        replica = self.transfer.store.readable(block.blockId, block.generationStamp)
        return pb.GetReplicaVisibleLengthResponseProto(length=replica.readable_length)


class DatanodeIdentity(Identity):
    """Who a client on the block server's IPC is (see the module docstring); ``transfer``
    holds the block keys (``node_key`` None: security = simple)."""

    def __init__(self, transfer):
        self.transfer = transfer

    def _secure(self) -> bool:
        return self.transfer.node_key is not None

    def simple_refusal(self, peer_address: tuple) -> str | None:
        if self._secure() and not is_loopback_host(str(peer_address[0])):
            return REMOTE_REFUSED
        return None

    def token_negotiation(self, peer_address: tuple) -> SaslNegotiation | None:
        return SaslNegotiation(self.lookup) if self._secure() else None

    def lookup(self, identifier: bytes) -> tuple[bytes, str]:
        """``fs.hdfs.sasl``'s lookup: a block read token's MAC and ``blk_<id>_<stamp>``."""
        try:
            token = tokens.fields_of(identifier)
            if blocktoken.READ not in str(token["mode"]):
                raise InvalidToken("not a read token")
            password = blocktoken.password(self.transfer.block_keys, token, time.time(),
                                           "ClientDatanodeProtocol")
        except InvalidToken as exc:
            raise SaslRefused(f"block access token refused: {exc}",
                              "org.apache.hadoop.security.token.SecretManager$InvalidToken"
                              ) from None
        return password, f"blk_{token['id']}_{token['gs']}"

    def open_session(self, session: dict, claim: Claim) -> None:
        if claim.authenticated is not None:
            try:
                claim.authenticated.check_claim(claim.user, claim.real_user)
            except SaslRefused as exc:
                raise AuthenticationFailed(str(exc)) from None
            session["user"] = claim.authenticated.user
            session["groups"] = ()
            session["block_token"] = tokens.fields_of(claim.authenticated.identifier)
            return
        if self.simple_refusal(claim.peer_address) is not None:
            raise AuthenticationFailed(REMOTE_REFUSED)
        super().open_session(session, claim)
