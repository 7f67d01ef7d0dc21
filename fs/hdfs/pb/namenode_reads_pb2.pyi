from fs.hdfs.pb import hdfs_pb2 as _hdfs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DatanodeReportTypeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALL: _ClassVar[DatanodeReportTypeProto]
    LIVE: _ClassVar[DatanodeReportTypeProto]
    DEAD: _ClassVar[DatanodeReportTypeProto]
    DECOMMISSIONING: _ClassVar[DatanodeReportTypeProto]
    ENTERING_MAINTENANCE: _ClassVar[DatanodeReportTypeProto]
    IN_MAINTENANCE: _ClassVar[DatanodeReportTypeProto]

class HAServiceStateProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INITIALIZING: _ClassVar[HAServiceStateProto]
    ACTIVE: _ClassVar[HAServiceStateProto]
    STANDBY: _ClassVar[HAServiceStateProto]
    OBSERVER: _ClassVar[HAServiceStateProto]
ALL: DatanodeReportTypeProto
LIVE: DatanodeReportTypeProto
DEAD: DatanodeReportTypeProto
DECOMMISSIONING: DatanodeReportTypeProto
ENTERING_MAINTENANCE: DatanodeReportTypeProto
IN_MAINTENANCE: DatanodeReportTypeProto
INITIALIZING: HAServiceStateProto
ACTIVE: HAServiceStateProto
STANDBY: HAServiceStateProto
OBSERVER: HAServiceStateProto

class GetFileInfoRequestProto(_message.Message):
    __slots__ = ("src",)
    SRC_FIELD_NUMBER: _ClassVar[int]
    src: str
    def __init__(self, src: _Optional[str] = ...) -> None: ...

class GetFileInfoResponseProto(_message.Message):
    __slots__ = ("fs",)
    FS_FIELD_NUMBER: _ClassVar[int]
    fs: _hdfs_pb2.HdfsFileStatusProto
    def __init__(self, fs: _Optional[_Union[_hdfs_pb2.HdfsFileStatusProto, _Mapping]] = ...) -> None: ...

class GetFileLinkInfoRequestProto(_message.Message):
    __slots__ = ("src",)
    SRC_FIELD_NUMBER: _ClassVar[int]
    src: str
    def __init__(self, src: _Optional[str] = ...) -> None: ...

class GetFileLinkInfoResponseProto(_message.Message):
    __slots__ = ("fs",)
    FS_FIELD_NUMBER: _ClassVar[int]
    fs: _hdfs_pb2.HdfsFileStatusProto
    def __init__(self, fs: _Optional[_Union[_hdfs_pb2.HdfsFileStatusProto, _Mapping]] = ...) -> None: ...

class GetLinkTargetRequestProto(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetLinkTargetResponseProto(_message.Message):
    __slots__ = ("targetPath",)
    TARGETPATH_FIELD_NUMBER: _ClassVar[int]
    targetPath: str
    def __init__(self, targetPath: _Optional[str] = ...) -> None: ...

class GetListingRequestProto(_message.Message):
    __slots__ = ("src", "startAfter", "needLocation")
    SRC_FIELD_NUMBER: _ClassVar[int]
    STARTAFTER_FIELD_NUMBER: _ClassVar[int]
    NEEDLOCATION_FIELD_NUMBER: _ClassVar[int]
    src: str
    startAfter: bytes
    needLocation: bool
    def __init__(self, src: _Optional[str] = ..., startAfter: _Optional[bytes] = ..., needLocation: _Optional[bool] = ...) -> None: ...

class GetListingResponseProto(_message.Message):
    __slots__ = ("dirList",)
    DIRLIST_FIELD_NUMBER: _ClassVar[int]
    dirList: _hdfs_pb2.DirectoryListingProto
    def __init__(self, dirList: _Optional[_Union[_hdfs_pb2.DirectoryListingProto, _Mapping]] = ...) -> None: ...

class GetBlockLocationsRequestProto(_message.Message):
    __slots__ = ("src", "offset", "length")
    SRC_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    src: str
    offset: int
    length: int
    def __init__(self, src: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class GetBlockLocationsResponseProto(_message.Message):
    __slots__ = ("locations",)
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    locations: _hdfs_pb2.LocatedBlocksProto
    def __init__(self, locations: _Optional[_Union[_hdfs_pb2.LocatedBlocksProto, _Mapping]] = ...) -> None: ...

class GetServerDefaultsRequestProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerDefaultsResponseProto(_message.Message):
    __slots__ = ("serverDefaults",)
    SERVERDEFAULTS_FIELD_NUMBER: _ClassVar[int]
    serverDefaults: _hdfs_pb2.FsServerDefaultsProto
    def __init__(self, serverDefaults: _Optional[_Union[_hdfs_pb2.FsServerDefaultsProto, _Mapping]] = ...) -> None: ...

class GetFsStatusRequestProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetFsStatsResponseProto(_message.Message):
    __slots__ = ("capacity", "used", "remaining", "under_replicated", "corrupt_blocks", "missing_blocks", "pending_deletion_blocks")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PENDING_DELETION_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    remaining: int
    under_replicated: int
    corrupt_blocks: int
    missing_blocks: int
    pending_deletion_blocks: int
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., remaining: _Optional[int] = ..., under_replicated: _Optional[int] = ..., corrupt_blocks: _Optional[int] = ..., missing_blocks: _Optional[int] = ..., pending_deletion_blocks: _Optional[int] = ...) -> None: ...

class GetContentSummaryRequestProto(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetContentSummaryResponseProto(_message.Message):
    __slots__ = ("summary",)
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    summary: _hdfs_pb2.ContentSummaryProto
    def __init__(self, summary: _Optional[_Union[_hdfs_pb2.ContentSummaryProto, _Mapping]] = ...) -> None: ...

class QuotaUsageProto(_message.Message):
    __slots__ = ("fileAndDirectoryCount", "quota", "spaceConsumed", "spaceQuota")
    FILEANDDIRECTORYCOUNT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    SPACECONSUMED_FIELD_NUMBER: _ClassVar[int]
    SPACEQUOTA_FIELD_NUMBER: _ClassVar[int]
    fileAndDirectoryCount: int
    quota: int
    spaceConsumed: int
    spaceQuota: int
    def __init__(self, fileAndDirectoryCount: _Optional[int] = ..., quota: _Optional[int] = ..., spaceConsumed: _Optional[int] = ..., spaceQuota: _Optional[int] = ...) -> None: ...

class GetQuotaUsageRequestProto(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class GetQuotaUsageResponseProto(_message.Message):
    __slots__ = ("usage",)
    USAGE_FIELD_NUMBER: _ClassVar[int]
    usage: QuotaUsageProto
    def __init__(self, usage: _Optional[_Union[QuotaUsageProto, _Mapping]] = ...) -> None: ...

class GetPreferredBlockSizeRequestProto(_message.Message):
    __slots__ = ("filename",)
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    filename: str
    def __init__(self, filename: _Optional[str] = ...) -> None: ...

class GetPreferredBlockSizeResponseProto(_message.Message):
    __slots__ = ("bsize",)
    BSIZE_FIELD_NUMBER: _ClassVar[int]
    bsize: int
    def __init__(self, bsize: _Optional[int] = ...) -> None: ...

class GetDatanodeReportRequestProto(_message.Message):
    __slots__ = ("type",)
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: DatanodeReportTypeProto
    def __init__(self, type: _Optional[_Union[DatanodeReportTypeProto, str]] = ...) -> None: ...

class GetDatanodeReportResponseProto(_message.Message):
    __slots__ = ("di",)
    DI_FIELD_NUMBER: _ClassVar[int]
    di: _containers.RepeatedCompositeFieldContainer[_hdfs_pb2.DatanodeInfoProto]
    def __init__(self, di: _Optional[_Iterable[_Union[_hdfs_pb2.DatanodeInfoProto, _Mapping]]] = ...) -> None: ...

class HAServiceStateRequestProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HAServiceStateResponseProto(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: HAServiceStateProto
    def __init__(self, state: _Optional[_Union[HAServiceStateProto, str]] = ...) -> None: ...

class MsyncRequestProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MsyncResponseProto(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
