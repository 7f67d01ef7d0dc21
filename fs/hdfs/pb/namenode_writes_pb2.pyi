from fs.hdfs.pb import hdfs_pb2 as _hdfs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateFlagProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CREATE: _ClassVar[CreateFlagProto]
    OVERWRITE: _ClassVar[CreateFlagProto]
    APPEND: _ClassVar[CreateFlagProto]
    LAZY_PERSIST: _ClassVar[CreateFlagProto]
    NEW_BLOCK: _ClassVar[CreateFlagProto]
    SHOULD_REPLICATE: _ClassVar[CreateFlagProto]

class OpenFilesTypeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALL_OPEN_FILES: _ClassVar[OpenFilesTypeProto]
    BLOCKING_DECOMMISSION: _ClassVar[OpenFilesTypeProto]
CREATE: CreateFlagProto
OVERWRITE: CreateFlagProto
APPEND: CreateFlagProto
LAZY_PERSIST: CreateFlagProto
NEW_BLOCK: CreateFlagProto
SHOULD_REPLICATE: CreateFlagProto
ALL_OPEN_FILES: OpenFilesTypeProto
BLOCKING_DECOMMISSION: OpenFilesTypeProto

class MkdirsRequestProto(_message.Message):
    __slots__ = ("src", "masked", "createParent")
    SRC_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CREATEPARENT_FIELD_NUMBER: _ClassVar[int]
    src: str
    masked: _hdfs_pb2.FsPermissionProto
    createParent: bool
    def __init__(self, src: _Optional[str] = ..., masked: _Optional[_Union[_hdfs_pb2.FsPermissionProto, _Mapping]] = ..., createParent: _Optional[bool] = ...) -> None: ...

class MkdirsResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class DeleteRequestProto(_message.Message):
    __slots__ = ("src", "recursive")
    SRC_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    src: str
    recursive: bool
    def __init__(self, src: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class DeleteResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class RenameRequestProto(_message.Message):
    __slots__ = ("src", "dst")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class RenameResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class Rename2RequestProto(_message.Message):
    __slots__ = ("src", "dst", "overwriteDest", "moveToTrash")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    OVERWRITEDEST_FIELD_NUMBER: _ClassVar[int]
    MOVETOTRASH_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    overwriteDest: bool
    moveToTrash: bool
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., overwriteDest: _Optional[bool] = ..., moveToTrash: _Optional[bool] = ...) -> None: ...

class Rename2ResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetPermissionRequestProto(_message.Message):
    __slots__ = ("src", "permission")
    SRC_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    src: str
    permission: _hdfs_pb2.FsPermissionProto
    def __init__(self, src: _Optional[str] = ..., permission: _Optional[_Union[_hdfs_pb2.FsPermissionProto, _Mapping]] = ...) -> None: ...

class SetPermissionResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetOwnerRequestProto(_message.Message):
    __slots__ = ("src", "username", "groupname")
    SRC_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    GROUPNAME_FIELD_NUMBER: _ClassVar[int]
    src: str
    username: str
    groupname: str
    def __init__(self, src: _Optional[str] = ..., username: _Optional[str] = ..., groupname: _Optional[str] = ...) -> None: ...

class SetOwnerResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetTimesRequestProto(_message.Message):
    __slots__ = ("src", "mtime", "atime")
    SRC_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    src: str
    mtime: int
    atime: int
    def __init__(self, src: _Optional[str] = ..., mtime: _Optional[int] = ..., atime: _Optional[int] = ...) -> None: ...

class SetTimesResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetReplicationRequestProto(_message.Message):
    __slots__ = ("src", "replication")
    SRC_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    src: str
    replication: int
    def __init__(self, src: _Optional[str] = ..., replication: _Optional[int] = ...) -> None: ...

class SetReplicationResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class RenewLeaseRequestProto(_message.Message):
    __slots__ = ("clientName",)
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    clientName: str
    def __init__(self, clientName: _Optional[str] = ...) -> None: ...

class RenewLeaseResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecoverLeaseRequestProto(_message.Message):
    __slots__ = ("src", "clientName")
    SRC_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    src: str
    clientName: str
    def __init__(self, src: _Optional[str] = ..., clientName: _Optional[str] = ...) -> None: ...

class RecoverLeaseResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class IsFileClosedRequestProto(_message.Message):
    __slots__ = ("src",)
    SRC_FIELD_NUMBER: _ClassVar[int]
    src: str
    def __init__(self, src: _Optional[str] = ...) -> None: ...

class IsFileClosedResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class CreateRequestProto(_message.Message):
    __slots__ = ("src", "masked", "clientName", "createFlag", "createParent", "replication", "blockSize")
    SRC_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    CREATEFLAG_FIELD_NUMBER: _ClassVar[int]
    CREATEPARENT_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    BLOCKSIZE_FIELD_NUMBER: _ClassVar[int]
    src: str
    masked: _hdfs_pb2.FsPermissionProto
    clientName: str
    createFlag: int
    createParent: bool
    replication: int
    blockSize: int
    def __init__(self, src: _Optional[str] = ..., masked: _Optional[_Union[_hdfs_pb2.FsPermissionProto, _Mapping]] = ..., clientName: _Optional[str] = ..., createFlag: _Optional[int] = ..., createParent: _Optional[bool] = ..., replication: _Optional[int] = ..., blockSize: _Optional[int] = ...) -> None: ...

class CreateResponseProto(_message.Message):
    __slots__ = ("fs",)
    FS_FIELD_NUMBER: _ClassVar[int]
    fs: _hdfs_pb2.HdfsFileStatusProto
    def __init__(self, fs: _Optional[_Union[_hdfs_pb2.HdfsFileStatusProto, _Mapping]] = ...) -> None: ...

class AddBlockRequestProto(_message.Message):
    __slots__ = ("src", "clientName", "previous", "excludeNodes", "fileId")
    SRC_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDENODES_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    src: str
    clientName: str
    previous: _hdfs_pb2.ExtendedBlockProto
    excludeNodes: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    fileId: int
    def __init__(self, src: _Optional[str] = ..., clientName: _Optional[str] = ..., previous: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., excludeNodes: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ..., fileId: _Optional[int] = ...) -> None: ...

class AddBlockResponseProto(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.LocatedBlockProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.LocatedBlockProto, _Mapping]] = ...) -> None: ...

class CompleteRequestProto(_message.Message):
    __slots__ = ("src", "clientName", "last", "fileId")
    SRC_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    src: str
    clientName: str
    last: _hdfs_pb2.ExtendedBlockProto
    fileId: int
    def __init__(self, src: _Optional[str] = ..., clientName: _Optional[str] = ..., last: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., fileId: _Optional[int] = ...) -> None: ...

class CompleteResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class AbandonBlockRequestProto(_message.Message):
    __slots__ = ("b", "src", "holder", "fileId")
    B_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    b: _hdfs_pb2.ExtendedBlockProto
    src: str
    holder: str
    fileId: int
    def __init__(self, b: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., src: _Optional[str] = ..., holder: _Optional[str] = ..., fileId: _Optional[int] = ...) -> None: ...

class AbandonBlockResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FsyncRequestProto(_message.Message):
    __slots__ = ("src", "client", "lastBlockLength", "fileId")
    SRC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_NUMBER: _ClassVar[int]
    LASTBLOCKLENGTH_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    src: str
    client: str
    lastBlockLength: int
    fileId: int
    def __init__(self, src: _Optional[str] = ..., client: _Optional[str] = ..., lastBlockLength: _Optional[int] = ..., fileId: _Optional[int] = ...) -> None: ...

class FsyncResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAdditionalDatanodeRequestProto(_message.Message):
    __slots__ = ("src", "blk", "existings", "excludes", "numAdditionalNodes", "clientName", "existingStorageUuids", "fileId")
    SRC_FIELD_NUMBER: _ClassVar[int]
    BLK_FIELD_NUMBER: _ClassVar[int]
    EXISTINGS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDES_FIELD_NUMBER: _ClassVar[int]
    NUMADDITIONALNODES_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    EXISTINGSTORAGEUUIDS_FIELD_NUMBER: _ClassVar[int]
    FILEID_FIELD_NUMBER: _ClassVar[int]
    src: str
    blk: _hdfs_pb2.ExtendedBlockProto
    existings: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    excludes: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    numAdditionalNodes: int
    clientName: str
    existingStorageUuids: _containers.RepeatedScalarFieldContainer[str]
    fileId: int
    def __init__(self, src: _Optional[str] = ..., blk: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., existings: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ..., excludes: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ..., numAdditionalNodes: _Optional[int] = ..., clientName: _Optional[str] = ..., existingStorageUuids: _Optional[_Iterable[str]] = ..., fileId: _Optional[int] = ...) -> None: ...

class GetAdditionalDatanodeResponseProto(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.LocatedBlockProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.LocatedBlockProto, _Mapping]] = ...) -> None: ...

class UpdateBlockForPipelineRequestProto(_message.Message):
    __slots__ = ("block", "clientName")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.ExtendedBlockProto
    clientName: str
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., clientName: _Optional[str] = ...) -> None: ...

class UpdateBlockForPipelineResponseProto(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.LocatedBlockProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.LocatedBlockProto, _Mapping]] = ...) -> None: ...

class UpdatePipelineRequestProto(_message.Message):
    __slots__ = ("clientName", "oldBlock", "newBlock", "newNodes", "storageIDs")
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    OLDBLOCK_FIELD_NUMBER: _ClassVar[int]
    NEWBLOCK_FIELD_NUMBER: _ClassVar[int]
    NEWNODES_FIELD_NUMBER: _ClassVar[int]
    STORAGEIDS_FIELD_NUMBER: _ClassVar[int]
    clientName: str
    oldBlock: _hdfs_pb2.ExtendedBlockProto
    newBlock: _hdfs_pb2.ExtendedBlockProto
    newNodes: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeIDProto]
    storageIDs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, clientName: _Optional[str] = ..., oldBlock: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., newBlock: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., newNodes: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeIDProto, _Mapping]]] = ..., storageIDs: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdatePipelineResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AppendRequestProto(_message.Message):
    __slots__ = ("src", "clientName", "flag")
    SRC_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    src: str
    clientName: str
    flag: int
    def __init__(self, src: _Optional[str] = ..., clientName: _Optional[str] = ..., flag: _Optional[int] = ...) -> None: ...

class AppendResponseProto(_message.Message):
    __slots__ = ("block", "stat")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    STAT_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.LocatedBlockProto
    stat: _hdfs_pb2.HdfsFileStatusProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.LocatedBlockProto, _Mapping]] = ..., stat: _Optional[_Union[_hdfs_pb2.HdfsFileStatusProto, _Mapping]] = ...) -> None: ...

class TruncateRequestProto(_message.Message):
    __slots__ = ("src", "newLength", "clientName")
    SRC_FIELD_NUMBER: _ClassVar[int]
    NEWLENGTH_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    src: str
    newLength: int
    clientName: str
    def __init__(self, src: _Optional[str] = ..., newLength: _Optional[int] = ..., clientName: _Optional[str] = ...) -> None: ...

class TruncateResponseProto(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: bool
    def __init__(self, result: _Optional[bool] = ...) -> None: ...

class ConcatRequestProto(_message.Message):
    __slots__ = ("trg", "srcs")
    TRG_FIELD_NUMBER: _ClassVar[int]
    SRCS_FIELD_NUMBER: _ClassVar[int]
    trg: str
    srcs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trg: _Optional[str] = ..., srcs: _Optional[_Iterable[str]] = ...) -> None: ...

class ConcatResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateSymlinkRequestProto(_message.Message):
    __slots__ = ("target", "link", "dirPerm", "createParent")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    DIRPERM_FIELD_NUMBER: _ClassVar[int]
    CREATEPARENT_FIELD_NUMBER: _ClassVar[int]
    target: str
    link: str
    dirPerm: _hdfs_pb2.FsPermissionProto
    createParent: bool
    def __init__(self, target: _Optional[str] = ..., link: _Optional[str] = ..., dirPerm: _Optional[_Union[_hdfs_pb2.FsPermissionProto, _Mapping]] = ..., createParent: _Optional[bool] = ...) -> None: ...

class CreateSymlinkResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetQuotaRequestProto(_message.Message):
    __slots__ = ("path", "namespaceQuota", "storagespaceQuota", "storageType")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAMESPACEQUOTA_FIELD_NUMBER: _ClassVar[int]
    STORAGESPACEQUOTA_FIELD_NUMBER: _ClassVar[int]
    STORAGETYPE_FIELD_NUMBER: _ClassVar[int]
    path: str
    namespaceQuota: int
    storagespaceQuota: int
    storageType: _hdfs_pb2.StorageTypeProto
    def __init__(self, path: _Optional[str] = ..., namespaceQuota: _Optional[int] = ..., storagespaceQuota: _Optional[int] = ..., storageType: _Optional[_Union[_hdfs_pb2.StorageTypeProto, str]] = ...) -> None: ...

class SetQuotaResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListOpenFilesRequestProto(_message.Message):
    __slots__ = ("id", "types", "path")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    id: int
    types: _containers.RepeatedScalarFieldContainer[OpenFilesTypeProto]
    path: str
    def __init__(self, id: _Optional[int] = ..., types: _Optional[_Iterable[_Union[OpenFilesTypeProto, str]]] = ..., path: _Optional[str] = ...) -> None: ...

class OpenFilesBatchResponseProto(_message.Message):
    __slots__ = ("id", "path", "clientName", "clientMachine")
    ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CLIENTNAME_FIELD_NUMBER: _ClassVar[int]
    CLIENTMACHINE_FIELD_NUMBER: _ClassVar[int]
    id: int
    path: str
    clientName: str
    clientMachine: str
    def __init__(self, id: _Optional[int] = ..., path: _Optional[str] = ..., clientName: _Optional[str] = ..., clientMachine: _Optional[str] = ...) -> None: ...

class ListOpenFilesResponseProto(_message.Message):
    __slots__ = ("entries", "hasMore", "types")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HASMORE_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[OpenFilesBatchResponseProto]
    hasMore: bool
    types: _containers.RepeatedScalarFieldContainer[OpenFilesTypeProto]
    def __init__(self, entries: _Optional[_Iterable[_Union[OpenFilesBatchResponseProto, _Mapping]]] = ..., hasMore: _Optional[bool] = ..., types: _Optional[_Iterable[_Union[OpenFilesTypeProto, str]]] = ...) -> None: ...

class ReportBadBlocksRequestProto(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.LocatedBlockProto]
    def __init__(self, blocks: _Optional[_Iterable[_Union[_hdfs_pb2.LocatedBlockProto, _Mapping]]] = ...) -> None: ...

class ReportBadBlocksResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
