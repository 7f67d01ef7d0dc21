from fs.hdfs.pb import hdfs_pb2 as _hdfs_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetReplicaVisibleLengthRequestProto(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.ExtendedBlockProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ...) -> None: ...

class GetReplicaVisibleLengthResponseProto(_message.Message):
    __slots__ = ("length",)
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    length: int
    def __init__(self, length: _Optional[int] = ...) -> None: ...

class GetBlockLocalPathInfoRequestProto(_message.Message):
    __slots__ = ("block", "token")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.ExtendedBlockProto
    token: _hdfs_pb2.TokenProto
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., token: _Optional[_Union[_hdfs_pb2.TokenProto, _Mapping]] = ...) -> None: ...

class GetBlockLocalPathInfoResponseProto(_message.Message):
    __slots__ = ("block", "localPath", "localMetaPath")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    LOCALPATH_FIELD_NUMBER: _ClassVar[int]
    LOCALMETAPATH_FIELD_NUMBER: _ClassVar[int]
    block: _hdfs_pb2.ExtendedBlockProto
    localPath: str
    localMetaPath: str
    def __init__(self, block: _Optional[_Union[_hdfs_pb2.ExtendedBlockProto, _Mapping]] = ..., localPath: _Optional[str] = ..., localMetaPath: _Optional[str] = ...) -> None: ...
