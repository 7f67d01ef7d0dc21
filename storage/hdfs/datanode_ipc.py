"""The block server's answer to Hadoop's ``ClientDatanodeProtocol`` (Hadoop IPC, served by
``fs.hdfs.ipc_server`` on the HDFS data-transfer port, told apart by its first bytes:
``fs.hdfs.sniff``):

* ``getReplicaVisibleLength``, which Hadoop's client asks a replica's block server when it
  opens a file whose last block is still being written, to learn how much of it a reader
  may see (the bytes every pipeline node acknowledged: what an hflush made visible).
* ``getBlockLocalPathInfo``: HDFS's legacy short-circuit read. A client on this host
  (``dfs.client.read.shortcircuit`` and ``dfs.client.use.legacy.blockreader.local``) asks
  where a finalized replica's data and meta files are and reads them itself, checking the
  CRC32Cs in the meta file, which is HDFS's own layout (``storage.layout``). Why: a read
  then costs a file read instead of a round trip through this process, which is what
  lets Spark on ``hdfs://`` answer small reads (footers, column chunks) as fast as from
  local disk. The files stay private to this server's OS user: another user's client
  fails to open them and falls back to data transfer (Hadoop then stops trying
  short-circuit for that client's context). Hadoop's client never asks for a file under
  construction; a replica that is not finalized here is refused all the same, as its
  last chunk's checksum may still change. ``storage_short_circuit = false`` refuses
  every such call.

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
from fs.hdfs.ipc import CLIENT_DATANODE_PROTOCOL
from fs.hdfs.ipc_server import Claim, Identity, on_this_host
from fs.hdfs.pb import client_datanode_pb2 as pb
from fs.hdfs.sasl import SaslNegotiation, SaslRefused
from fs.rpcbase import is_loopback_host

REMOTE_REFUSED = ("security = secure: a Hadoop client on another host must show the block's "
                  "access token (SASL TOKEN) to ask this block server about a replica")


def check_token(transfer, token, block_id: int, gs: int, op: str, mode: str) -> None:
    """security = secure: ``token`` (a ``TokenProto`` an HDFS op or call carries, or None)
    must be a leasefs block token for this block, stamp and mode, checked by ``transfer``
    as the leasefs port checks its own; under simple, tokens are ignored."""
    if transfer.node_key is None:
        return
    try:
        fields = tokens.from_proto(token) if token is not None else None
    except InvalidToken:
        transfer.stats.token_refusals += 1
        raise
    transfer.check_token({"token": fields}, block_id, gs, op, mode)


class ClientDatanode:
    """The translator (``fs.hdfs.ipc_server``) over a ``storage.transfer.
    DataTransferServer``."""

    PROTOCOL = CLIENT_DATANODE_PROTOCOL
    CALLS = {"getReplicaVisibleLength": (pb.GetReplicaVisibleLengthRequestProto,
                                         pb.GetReplicaVisibleLengthResponseProto),
             "getBlockLocalPathInfo": (pb.GetBlockLocalPathInfoRequestProto,
                                       pb.GetBlockLocalPathInfoResponseProto)}

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

    async def getBlockLocalPathInfo(self, ctx, request):
        block = request.block
        what = f"getBlockLocalPathInfo blk_{block.blockId}"
        if not self.transfer.config.storage_short_circuit:
            raise PermissionDenied(f"{what}: short-circuit reads are off on this block "
                                   f"server (storage_short_circuit)")
        if not on_this_host(ctx.session):
            raise PermissionDenied(f"{what}: a replica's local files are only named to a "
                                   f"client on this host")
        check_token(self.transfer, request.token if request.HasField("token") else None,
                    block.blockId, block.generationStamp, "getBlockLocalPathInfo",
                    blocktoken.READ)
        data_path, meta_path, gs = self.transfer.store.finalized_files(block.blockId,
                                                                       block.generationStamp)
        answer = pb.GetBlockLocalPathInfoResponseProto(localPath=data_path,
                                                       localMetaPath=meta_path)
        answer.block.CopyFrom(block)
        answer.block.generationStamp = gs
        return answer


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
