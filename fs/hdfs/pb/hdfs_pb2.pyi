from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorageTypeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISK: _ClassVar[StorageTypeProto]
    SSD: _ClassVar[StorageTypeProto]
    ARCHIVE: _ClassVar[StorageTypeProto]
    RAM_DISK: _ClassVar[StorageTypeProto]

class ChecksumTypeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_NULL: _ClassVar[ChecksumTypeProto]
    CHECKSUM_CRC32: _ClassVar[ChecksumTypeProto]
    CHECKSUM_CRC32C: _ClassVar[ChecksumTypeProto]
DISK: StorageTypeProto
SSD: StorageTypeProto
ARCHIVE: StorageTypeProto
RAM_DISK: StorageTypeProto
CHECKSUM_NULL: ChecksumTypeProto
CHECKSUM_CRC32: ChecksumTypeProto
CHECKSUM_CRC32C: ChecksumTypeProto

class TokenProto(_message.Message):
    __slots__ = ("identifier", "password", "kind", "service")
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    identifier: bytes
    password: bytes
    kind: str
    service: str
    def __init__(self, identifier: _Optional[bytes] = ..., password: _Optional[bytes] = ..., kind: _Optional[str] = ..., service: _Optional[str] = ...) -> None: ...

class ExtendedBlockProto(_message.Message):
    __slots__ = ("poolId", "blockId", "generationStamp", "numBytes")
    POOLID_FIELD_NUMBER: _ClassVar[int]
    BLOCKID_FIELD_NUMBER: _ClassVar[int]
    GENERATIONSTAMP_FIELD_NUMBER: _ClassVar[int]
    NUMBYTES_FIELD_NUMBER: _ClassVar[int]
    poolId: str
    blockId: int
    generationStamp: int
    numBytes: int
    def __init__(self, poolId: _Optional[str] = ..., blockId: _Optional[int] = ..., generationStamp: _Optional[int] = ..., numBytes: _Optional[int] = ...) -> None: ...

class DatanodeIDProto(_message.Message):
    __slots__ = ("ipAddr", "hostName", "datanodeUuid", "xferPort", "infoPort", "ipcPort")
    IPADDR_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DATANODEUUID_FIELD_NUMBER: _ClassVar[int]
    XFERPORT_FIELD_NUMBER: _ClassVar[int]
    INFOPORT_FIELD_NUMBER: _ClassVar[int]
    IPCPORT_FIELD_NUMBER: _ClassVar[int]
    ipAddr: str
    hostName: str
    datanodeUuid: str
    xferPort: int
    infoPort: int
    ipcPort: int
    def __init__(self, ipAddr: _Optional[str] = ..., hostName: _Optional[str] = ..., datanodeUuid: _Optional[str] = ..., xferPort: _Optional[int] = ..., infoPort: _Optional[int] = ..., ipcPort: _Optional[int] = ...) -> None: ...

class DatanodeInfoProto(_message.Message):
    __slots__ = ("id", "capacity", "dfsUsed", "remaining", "blockPoolUsed", "lastUpdate", "xceiverCount", "location", "nonDfsUsed", "adminState", "lastUpdateMonotonic")
    class AdminState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NORMAL: _ClassVar[DatanodeInfoProto.AdminState]
        DECOMMISSION_INPROGRESS: _ClassVar[DatanodeInfoProto.AdminState]
        DECOMMISSIONED: _ClassVar[DatanodeInfoProto.AdminState]
    NORMAL: DatanodeInfoProto.AdminState
    DECOMMISSION_INPROGRESS: DatanodeInfoProto.AdminState
    DECOMMISSIONED: DatanodeInfoProto.AdminState
    ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DFSUSED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    BLOCKPOOLUSED_FIELD_NUMBER: _ClassVar[int]
    LASTUPDATE_FIELD_NUMBER: _ClassVar[int]
    XCEIVERCOUNT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    NONDFSUSED_FIELD_NUMBER: _ClassVar[int]
    ADMINSTATE_FIELD_NUMBER: _ClassVar[int]
    LASTUPDATEMONOTONIC_FIELD_NUMBER: _ClassVar[int]
    id: DatanodeIDProto
    capacity: int
    dfsUsed: int
    remaining: int
    blockPoolUsed: int
    lastUpdate: int
    xceiverCount: int
    location: str
    nonDfsUsed: int
    adminState: DatanodeInfoProto.AdminState
    lastUpdateMonotonic: int
    def __init__(self, id: _Optional[_Union[DatanodeIDProto, _Mapping]] = ..., capacity: _Optional[int] = ..., dfsUsed: _Optional[int] = ..., remaining: _Optional[int] = ..., blockPoolUsed: _Optional[int] = ..., lastUpdate: _Optional[int] = ..., xceiverCount: _Optional[int] = ..., location: _Optional[str] = ..., nonDfsUsed: _Optional[int] = ..., adminState: _Optional[_Union[DatanodeInfoProto.AdminState, str]] = ..., lastUpdateMonotonic: _Optional[int] = ...) -> None: ...

class LocatedBlockProto(_message.Message):
    __slots__ = ("b", "offset", "locs", "corrupt", "blockToken", "isCached", "storageTypes", "storageIDs")
    B_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOCS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    BLOCKTOKEN_FIELD_NUMBER: _ClassVar[int]
    ISCACHED_FIELD_NUMBER: _ClassVar[int]
    STORAGETYPES_FIELD_NUMBER: _ClassVar[int]
    STORAGEIDS_FIELD_NUMBER: _ClassVar[int]
    b: ExtendedBlockProto
    offset: int
    locs: _containers.RepeatedCompositeFieldContainer[DatanodeInfoProto]
    corrupt: bool
    blockToken: TokenProto
    isCached: _containers.RepeatedScalarFieldContainer[bool]
    storageTypes: _containers.RepeatedScalarFieldContainer[StorageTypeProto]
    storageIDs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, b: _Optional[_Union[ExtendedBlockProto, _Mapping]] = ..., offset: _Optional[int] = ..., locs: _Optional[_Iterable[_Union[DatanodeInfoProto, _Mapping]]] = ..., corrupt: _Optional[bool] = ..., blockToken: _Optional[_Union[TokenProto, _Mapping]] = ..., isCached: _Optional[_Iterable[bool]] = ..., storageTypes: _Optional[_Iterable[_Union[StorageTypeProto, str]]] = ..., storageIDs: _Optional[_Iterable[str]] = ...) -> None: ...

class LocatedBlocksProto(_message.Message):
    __slots__ = ("fileLength", "blocks", "underConstruction", "lastBlock", "isLastBlockComplete")
    FILELENGTH_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UNDERCONSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    LASTBLOCK_FIELD_NUMBER: _ClassVar[int]
    ISLASTBLOCKCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    fileLength: int
    blocks: _containers.RepeatedCompositeFieldContainer[LocatedBlockProto]
    underConstruction: bool
    lastBlock: LocatedBlockProto
    isLastBlockComplete: bool
    def __init__(self, fileLength: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[LocatedBlockProto, _Mapping]]] = ..., underConstruction: _Optional[bool] = ..., lastBlock: _Optional[_Union[LocatedBlockProto, _Mapping]] = ..., isLastBlockComplete: _Optional[bool] = ...) -> None: ...

class FsPermissionProto(_message.Message):
    __slots__ = ("perm",)
    PERM_FIELD_NUMBER: _ClassVar[int]
    perm: int
    def __init__(self, perm: _Optional[int] = ...) -> None: ...

class HdfsFileStatusProto(_message.Message):
    __slots__ = ("fileType", "path", "length", "permission", "owner", "group", "modification_time", "access_time", "symlink", "block_replication", "blocksize", "locations", "fileId", "childrenNum", "storagePolicy", "flags")
    class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        IS_DIR: _ClassVar[HdfsFileStatusProto.FileType]
        IS_FILE: _ClassVar[HdfsFileStatusProto.FileType]
        IS_SYMLINK: _ClassVar[HdfsFileStatusProto.FileType]
    IS_DIR: HdfsFileStatusProto.FileType
    IS_FILE: HdfsFileStatusProto.FileType
    IS_SYMLINK: HdfsFileStatusProto.FileType
    FILETYPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MODIFICATION_TIME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_TIME_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_FIELD_NUMBER: _ClassVar[int]
    BLOCK_REPLICATION_FIELD_NUMBER: _ClassVar[int]
    BLOCKSIZE_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    CHILDRENNUM_FIELD_NUMBER: _ClassVar[int]
    STORAGEPOLICY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    fileType: HdfsFileStatusProto.FileType
    path: bytes
    length: int
    permission: FsPermissionProto
    owner: str
    group: str
    modification_time: int
    access_time: int
    symlink: bytes
    block_replication: int
    blocksize: int
    locations: LocatedBlocksProto
    fileId: int
    childrenNum: int
    storagePolicy: int
    flags: int
    def __init__(self, fileType: _Optional[_Union[HdfsFileStatusProto.FileType, str]] = ..., path: _Optional[bytes] = ..., length: _Optional[int] = ..., permission: _Optional[_Union[FsPermissionProto, _Mapping]] = ..., owner: _Optional[str] = ..., group: _Optional[str] = ..., modification_time: _Optional[int] = ..., access_time: _Optional[int] = ..., symlink: _Optional[bytes] = ..., block_replication: _Optional[int] = ..., blocksize: _Optional[int] = ..., locations: _Optional[_Union[LocatedBlocksProto, _Mapping]] = ..., fileId: _Optional[int] = ..., childrenNum: _Optional[int] = ..., storagePolicy: _Optional[int] = ..., flags: _Optional[int] = ...) -> None: ...

class DirectoryListingProto(_message.Message):
    __slots__ = ("partialListing", "remainingEntries")
    PARTIALLISTING_FIELD_NUMBER: _ClassVar[int]
    REMAININGENTRIES_FIELD_NUMBER: _ClassVar[int]
    partialListing: _containers.RepeatedCompositeFieldContainer[HdfsFileStatusProto]
    remainingEntries: int
    def __init__(self, partialListing: _Optional[_Iterable[_Union[HdfsFileStatusProto, _Mapping]]] = ..., remainingEntries: _Optional[int] = ...) -> None: ...

class FsServerDefaultsProto(_message.Message):
    __slots__ = ("blockSize", "bytesPerChecksum", "writePacketSize", "replication", "fileBufferSize", "encryptDataTransfer", "trashInterval", "checksumType", "policyId")
    BLOCKSIZE_FIELD_NUMBER: _ClassVar[int]
    BYTESPERCHECKSUM_FIELD_NUMBER: _ClassVar[int]
    WRITEPACKETSIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    FILEBUFFERSIZE_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTDATATRANSFER_FIELD_NUMBER: _ClassVar[int]
    TRASHINTERVAL_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMTYPE_FIELD_NUMBER: _ClassVar[int]
    POLICYID_FIELD_NUMBER: _ClassVar[int]
    blockSize: int
    bytesPerChecksum: int
    writePacketSize: int
    replication: int
    fileBufferSize: int
    encryptDataTransfer: bool
    trashInterval: int
    checksumType: ChecksumTypeProto
    policyId: int
    def __init__(self, blockSize: _Optional[int] = ..., bytesPerChecksum: _Optional[int] = ..., writePacketSize: _Optional[int] = ..., replication: _Optional[int] = ..., fileBufferSize: _Optional[int] = ..., encryptDataTransfer: _Optional[bool] = ..., trashInterval: _Optional[int] = ..., checksumType: _Optional[_Union[ChecksumTypeProto, str]] = ..., policyId: _Optional[int] = ...) -> None: ...

class ContentSummaryProto(_message.Message):
    __slots__ = ("length", "fileCount", "directoryCount", "quota", "spaceConsumed", "spaceQuota")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FILECOUNT_FIELD_NUMBER: _ClassVar[int]
    DIRECTORYCOUNT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    SPACECONSUMED_FIELD_NUMBER: _ClassVar[int]
    SPACEQUOTA_FIELD_NUMBER: _ClassVar[int]
    length: int
    fileCount: int
    directoryCount: int
    quota: int
    spaceConsumed: int
    spaceQuota: int
    def __init__(self, length: _Optional[int] = ..., fileCount: _Optional[int] = ..., directoryCount: _Optional[int] = ..., quota: _Optional[int] = ..., spaceConsumed: _Optional[int] = ..., spaceQuota: _Optional[int] = ...) -> None: ...
