from fs.hdfs.pb import hdfs_pb2 as _hdfs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[Status]
    ERROR: _ClassVar[Status]
    ERROR_CHECKSUM: _ClassVar[Status]
    ERROR_INVALID: _ClassVar[Status]
    ERROR_EXISTS: _ClassVar[Status]
    ERROR_ACCESS_TOKEN: _ClassVar[Status]
    CHECKSUM_OK: _ClassVar[Status]
    ERROR_UNSUPPORTED: _ClassVar[Status]
    OOB_RESTART: _ClassVar[Status]
    IN_PROGRESS: _ClassVar[Status]

class BlockChecksumTypeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MD5CRC: _ClassVar[BlockChecksumTypeProto]
    COMPOSITE_CRC: _ClassVar[BlockChecksumTypeProto]
SUCCESS: Status
ERROR: Status
ERROR_CHECKSUM: Status
ERROR_INVALID: Status
ERROR_EXISTS: Status
ERROR_ACCESS_TOKEN: Status
CHECKSUM_OK: Status
ERROR_UNSUPPORTED: Status
OOB_RESTART: Status
IN_PROGRESS: Status
MD5CRC: BlockChecksumTypeProto
COMPOSITE_CRC: BlockChecksumTypeProto

class BaseHeaderProto(_message.Message):
    __slots__ = ("block", "token")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.ExtendedBlockProto
    token: _hdfs_pb2.TokenProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., token: _Optional[_Union[_hdfs_pb2.TokenProto, _Mapping]] = ...) -> None: ...

class ClientOperationHeaderProto(_message.Message):
    __slots__ = ("baseHeader", "clientName")
    BASEHEADER_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    baseHeader: BaseHeaderProto
    clientName: str
    def __init__(self, baseHeader: _Optional[_Union[BaseHeaderProto, _Mapping]] = ..., clientName: _Optional[str] = ...) -> None: ...

class CachingStrategyProto(_message.Message):
    __slots__ = ("dropBehind", "readahead")
    DROPBEHIND_FIELD_NUMBER: _ClassVar[int]
    READAHEAD_FIELD_NUMBER: _ClassVar[int]
    dropBehind: bool
    readahead: int
    def __init__(self, dropBehind: _Optional[bool] = ..., readahead: _Optional[int] = ...) -> None: ...

class ChecksumProto(_message.Message):
    __slots__ = ("type", "bytesPerChecksum")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BYTESPERCHECKSUM_FIELD_NUMBER: _ClassVar[int]
    type: _hdfs_pb2.ChecksumTypeProto
    bytesPerChecksum: int
    def __init__(self, type: _Optional[_Union[_hdfs_pb2.ChecksumTypeProto, str]] = ..., bytesPerChecksum: _Optional[int] = ...) -> None: ...

class OpReadBlockProto(_message.Message):
    __slots__ = ("header", "offset", "len", "sendChecksums", "cachingStrategy")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEN_FIELD_NUMBER: _ClassVar[int]
    SENDCHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    CACHINGSTRATEGY_FIELD_NUMBER: _ClassVar[int]
    header: ClientOperationHeaderProto
    offset: int
    len: int
    sendChecksums: bool
    cachingStrategy: CachingStrategyProto
    def __init__(self, header: _Optional[_Union[ClientOperationHeaderProto, _Mapping]] = ..., offset: _Optional[int] = ..., len: _Optional[int] = ..., sendChecksums: _Optional[bool] = ..., cachingStrategy: _Optional[_Union[CachingStrategyProto, _Mapping]] = ...) -> None: ...

class OpWriteBlockProto(_message.Message):
    __slots__ = ("header", "targets", "source", "stage", "pipelineSize", "minBytesRcvd", "maxBytesRcvd", "latestGenerationStamp", "requestedChecksum", "cachingStrategy", "storageType", "targetStorageTypes", "allowLazyPersist", "pinning", "targetPinnings", "storageId", "targetStorageIds")
    class BlockConstructionStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PIPELINE_SETUP_APPEND: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        PIPELINE_SETUP_APPEND_RECOVERY: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        DATA_STREAMING: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        PIPELINE_SETUP_STREAMING_RECOVERY: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        PIPELINE_CLOSE: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        PIPELINE_CLOSE_RECOVERY: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        PIPELINE_SETUP_CREATE: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        TRANSFER_RBW: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
        TRANSFER_FINALIZED: _ClassVar[OpWriteBlockProto.BlockConstructionStage]
    PIPELINE_SETUP_APPEND: OpWriteBlockProto.BlockConstructionStage
    PIPELINE_SETUP_APPEND_RECOVERY: OpWriteBlockProto.BlockConstructionStage
    DATA_STREAMING: OpWriteBlockProto.BlockConstructionStage
    PIPELINE_SETUP_STREAMING_RECOVERY: OpWriteBlockProto.BlockConstructionStage
    PIPELINE_CLOSE: OpWriteBlockProto.BlockConstructionStage
    PIPELINE_CLOSE_RECOVERY: OpWriteBlockProto.BlockConstructionStage
    PIPELINE_SETUP_CREATE: OpWriteBlockProto.BlockConstructionStage
    TRANSFER_RBW: OpWriteBlockProto.BlockConstructionStage
    TRANSFER_FINALIZED: OpWriteBlockProto.BlockConstructionStage
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PIPELINESIZE_FIELD_NUMBER: _ClassVar[int]
    MINBYTESRCVD_FIELD_NUMBER: _ClassVar[int]
    MAXBYTESRCVD_FIELD_NUMBER: _ClassVar[int]
    LATESTGENERATIONSTAMP_FIELD_NUMBER: _ClassVar[int]
    REQUESTEDCHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CACHINGSTRATEGY_FIELD_NUMBER: _ClassVar[int]
    STORAGETYPE_FIELD_NUMBER: _ClassVar[int]
    TARGETSTORAGETYPES_FIELD_NUMBER: _ClassVar[int]
    ALLOWLAZYPERSIST_FIELD_NUMBER: _ClassVar[int]
    PINNING_FIELD_NUMBER: _ClassVar[int]
    TARGETPINNINGS_FIELD_NUMBER: _ClassVar[int]
    STORAGEID_FIELD_NUMBER: _ClassVar[int]
    TARGETSTORAGEIDS_FIELD_NUMBER: _ClassVar[int]
    header: ClientOperationHeaderProto
    targets: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    source: _hdfs_pb2.DatanodeInfoProto
    stage: OpWriteBlockProto.BlockConstructionStage
    pipelineSize: int
    minBytesRcvd: int
    maxBytesRcvd: int
    latestGenerationStamp: int
    requestedChecksum: ChecksumProto
    cachingStrategy: CachingStrategyProto
    storageType: _hdfs_pb2.StorageTypeProto
    targetStorageTypes: _containers.RepeatedScalarFieldContainer[_hdfs_pb2.StorageTypeProto]
    allowLazyPersist: bool
    pinning: bool
    targetPinnings: _containers.RepeatedScalarFieldContainer[bool]
    storageId: str
    targetStorageIds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[ClientOperationHeaderProto, _Mapping]] = ..., targets: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ..., source: _Optional[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]] = ..., stage: _Optional[_Union[OpWriteBlockProto.BlockConstructionStage, str]] = ..., pipelineSize: _Optional[int] = ..., minBytesRcvd: _Optional[int] = ..., maxBytesRcvd: _Optional[int] = ..., latestGenerationStamp: _Optional[int] = ..., requestedChecksum: _Optional[_Union[ChecksumProto, _Mapping]] = ..., cachingStrategy: _Optional[_Union[CachingStrategyProto, _Mapping]] = ..., storageType: _Optional[_Union[_hdfs_pb2.StorageTypeProto, str]] = ..., targetStorageTypes: _Optional[_Iterable[_Union[_hdfs_pb2.StorageTypeProto, str]]] = ..., allowLazyPersist: _Optional[bool] = ..., pinning: _Optional[bool] = ..., targetPinnings: _Optional[_Iterable[bool]] = ..., storageId: _Optional[str] = ..., targetStorageIds: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadOpChecksumInfoProto(_message.Message):
    __slots__ = ("checksum", "chunkOffset")
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CHUNKOFFSET_FIELD_NUMBER: _ClassVar[int]
    checksum: ChecksumProto
    chunkOffset: int
    def __init__(self, checksum: _Optional[_Union[ChecksumProto, _Mapping]] = ..., chunkOffset: _Optional[int] = ...) -> None: ...

class BlockOpResponseProto(_message.Message):
    __slots__ = ("status", "firstBadLink", "checksumResponse", "readOpChecksumInfo", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FIRSTBADLINK_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMRESPONSE_FIELD_NUMBER: _ClassVar[int]
    READOPCHECKSUMINFO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: Status
    firstBadLink: str
    checksumResponse: OpBlockChecksumResponseProto
    readOpChecksumInfo: ReadOpChecksumInfoProto
    message: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., firstBadLink: _Optional[str] = ..., checksumResponse: _Optional[_Union[OpBlockChecksumResponseProto, _Mapping]] = ..., readOpChecksumInfo: _Optional[_Union[ReadOpChecksumInfoProto, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class ClientReadStatusProto(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    def __init__(self, status: _Optional[_Union[Status, str]] = ...) -> None: ...

class PipelineAckProto(_message.Message):
    __slots__ = ("seqno", "reply", "downstreamAckTimeNanos", "flag")
    SEQNO_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAMACKTIMENANOS_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    seqno: int
    reply: _containers.RepeatedScalarFieldContainer[Status]
    downstreamAckTimeNanos: int
    flag: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seqno: _Optional[int] = ..., reply: _Optional[_Iterable[_Union[Status, str]]] = ..., downstreamAckTimeNanos: _Optional[int] = ..., flag: _Optional[_Iterable[int]] = ...) -> None: ...

class PacketHeaderProto(_message.Message):
    __slots__ = ("offsetInBlock", "seqno", "lastPacketInBlock", "dataLen", "syncBlock")
    OFFSETINBLOCK_FIELD_NUMBER: _ClassVar[int]
    SEQNO_FIELD_NUMBER: _ClassVar[int]
    LASTPACKETINBLOCK_FIELD_NUMBER: _ClassVar[int]
    DATALEN_FIELD_NUMBER: _ClassVar[int]
    SYNCBLOCK_FIELD_NUMBER: _ClassVar[int]
    offsetInBlock: int
    seqno: int
    lastPacketInBlock: bool
    dataLen: int
    syncBlock: bool
    def __init__(self, offsetInBlock: _Optional[int] = ..., seqno: _Optional[int] = ..., lastPacketInBlock: _Optional[bool] = ..., dataLen: _Optional[int] = ..., syncBlock: _Optional[bool] = ...) -> None: ...

class DataTransferEncryptorMessageProto(_message.Message):
    __slots__ = ("status", "message")
    class DataTransferEncryptorStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SUCCESS: _ClassVar[DataTransferEncryptorMessageProto.DataTransferEncryptorStatus]
        ERROR_UNKNOWN_KEY: _ClassVar[DataTransferEncryptorMessageProto.DataTransferEncryptorStatus]
        ERROR: _ClassVar[DataTransferEncryptorMessageProto.DataTransferEncryptorStatus]
    SUCCESS: DataTransferEncryptorMessageProto.DataTransferEncryptorStatus
    ERROR_UNKNOWN_KEY: DataTransferEncryptorMessageProto.DataTransferEncryptorStatus
    ERROR: DataTransferEncryptorMessageProto.DataTransferEncryptorStatus
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: DataTransferEncryptorMessageProto.DataTransferEncryptorStatus
    message: str
    def __init__(self, status: _Optional[_Union[DataTransferEncryptorMessageProto.DataTransferEncryptorStatus, str]] = ..., message: _Optional[str] = ...) -> None: ...

class BlockChecksumOptionsProto(_message.Message):
    __slots__ = ("blockChecksumType", "stripeLength")
    BLOCKCHECKSUMTYPE_FIELD_NUMBER: _ClassVar[int]
    STRIPELENGTH_FIELD_NUMBER: _ClassVar[int]
    blockChecksumType: BlockChecksumTypeProto
    stripeLength: int
    def __init__(self, blockChecksumType: _Optional[_Union[BlockChecksumTypeProto, str]] = ..., stripeLength: _Optional[int] = ...) -> None: ...

class OpBlockChecksumProto(_message.Message):
    __slots__ = ("header", "blockChecksumOptions")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BLOCKCHECKSUMOPTIONS_FIELD_NUMBER: _ClassVar[int]
    header: BaseHeaderProto
    blockChecksumOptions: BlockChecksumOptionsProto
    def __init__(self, header: _Optional[_Union[BaseHeaderProto, _Mapping]] = ..., blockChecksumOptions: _Optional[_Union[BlockChecksumOptionsProto, _Mapping]] = ...) -> None: ...

class OpBlockChecksumResponseProto(_message.Message):
    __slots__ = ("bytesPerCrc", "crcPerBlock", "blockChecksum", "crcType", "blockChecksumOptions")
    BYTESPERCRC_FIELD_NUMBER: _ClassVar[int]
    CRCPERBLOCK_FIELD_NUMBER: _ClassVar[int]
    BLOCKCHECKSUM_FIELD_NUMBER: _ClassVar[int]
    CRCTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCKCHECKSUMOPTIONS_FIELD_NUMBER: _ClassVar[int]
    bytesPerCrc: int
    crcPerBlock: int
    blockChecksum: bytes
    crcType: _hdfs_pb2.ChecksumTypeProto
    blockChecksumOptions: BlockChecksumOptionsProto
    def __init__(self, bytesPerCrc: _Optional[int] = ..., crcPerBlock: _Optional[int] = ..., blockChecksum: _Optional[bytes] = ..., crcType: _Optional[_Union[_hdfs_pb2.ChecksumTypeProto, str]] = ..., blockChecksumOptions: _Optional[_Union[BlockChecksumOptionsProto, _Mapping]] = ...) -> None: ...

class OpTransferBlockProto(_message.Message):
    __slots__ = ("header", "targets", "targetStorageTypes", "targetStorageIds")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TARGETSTORAGETYPES_FIELD_NUMBER: _ClassVar[int]
    TARGETSTORAGEIDS_FIELD_NUMBER: _ClassVar[int]
    header: ClientOperationHeaderProto
    targets: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    targetStorageTypes: _containers.RepeatedScalarFieldContainer[_hdfs_pb2.StorageTypeProto]
    targetStorageIds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[ClientOperationHeaderProto, _Mapping]] = ..., targets: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ..., targetStorageTypes: _Optional[_Iterable[_Union[_hdfs_pb2.StorageTypeProto, str]]] = ..., targetStorageIds: _Optional[_Iterable[str]] = ...) -> None: ...
