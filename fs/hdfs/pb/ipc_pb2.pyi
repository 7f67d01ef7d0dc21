from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RpcKindProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RPC_BUILTIN: _ClassVar[RpcKindProto]
    RPC_WRITABLE: _ClassVar[RpcKindProto]
    RPC_PROTOCOL_BUFFER: _ClassVar[RpcKindProto]
RPC_BUILTIN: RpcKindProto
RPC_WRITABLE: RpcKindProto
RPC_PROTOCOL_BUFFER: RpcKindProto

class RPCTraceInfoProto(_message.Message):
    __slots__ = ("traceId", "parentId", "spanContext")
    TRACEID_FIELD_NUMBER: _ClassVar[int]
    PARENTID_FIELD_NUMBER: _ClassVar[int]
    SPANCONTEXT_FIELD_NUMBER: _ClassVar[int]
    traceId: int
    parentId: int
    spanContext: bytes
    def __init__(self, traceId: _Optional[int] = ..., parentId: _Optional[int] = ..., spanContext: _Optional[bytes] = ...) -> None: ...

class RPCCallerContextProto(_message.Message):
    __slots__ = ("context", "signature")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    context: str
    signature: bytes
    def __init__(self, context: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class RpcRequestHeaderProto(_message.Message):
    __slots__ = ("rpcKind", "rpcOp", "callId", "clientId", "retryCount", "traceInfo", "callerContext", "stateId")
    class OperationProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RPC_FINAL_PACKET: _ClassVar[RpcRequestHeaderProto.OperationProto]
        RPC_CONTINUATION_PACKET: _ClassVar[RpcRequestHeaderProto.OperationProto]
        RPC_CLOSE_CONNECTION: _ClassVar[RpcRequestHeaderProto.OperationProto]
    RPC_FINAL_PACKET: RpcRequestHeaderProto.OperationProto
    RPC_CONTINUATION_PACKET: RpcRequestHeaderProto.OperationProto
    RPC_CLOSE_CONNECTION: RpcRequestHeaderProto.OperationProto
    RPCKIND_FIELD_NUMBER: _ClassVar[int]
    RPCOP_FIELD_NUMBER: _ClassVar[int]
    CALLID_FIELD_NUMBER: _ClassVar[int]
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    RETRYCOUNT_FIELD_NUMBER: _ClassVar[int]
    TRACEINFO_FIELD_NUMBER: _ClassVar[int]
    CALLERCONTEXT_FIELD_NUMBER: _ClassVar[int]
    STATEID_FIELD_NUMBER: _ClassVar[int]
    rpcKind: RpcKindProto
    rpcOp: RpcRequestHeaderProto.OperationProto
    callId: int
    clientId: bytes
    retryCount: int
    traceInfo: RPCTraceInfoProto
    callerContext: RPCCallerContextProto
    stateId: int
    def __init__(self, rpcKind: _Optional[_Union[RpcKindProto, str]] = ..., rpcOp: _Optional[_Union[RpcRequestHeaderProto.OperationProto, str]] = ..., callId: _Optional[int] = ..., clientId: _Optional[bytes] = ..., retryCount: _Optional[int] = ..., traceInfo: _Optional[_Union[RPCTraceInfoProto, _Mapping]] = ..., callerContext: _Optional[_Union[RPCCallerContextProto, _Mapping]] = ..., stateId: _Optional[int] = ...) -> None: ...

class RpcResponseHeaderProto(_message.Message):
    __slots__ = ("callId", "status", "serverIpcVersionNum", "exceptionClassName", "errorMsg", "errorDetail", "clientId", "retryCount", "stateId")
    class RpcStatusProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SUCCESS: _ClassVar[RpcResponseHeaderProto.RpcStatusProto]
        ERROR: _ClassVar[RpcResponseHeaderProto.RpcStatusProto]
        FATAL: _ClassVar[RpcResponseHeaderProto.RpcStatusProto]
    SUCCESS: RpcResponseHeaderProto.RpcStatusProto
    ERROR: RpcResponseHeaderProto.RpcStatusProto
    FATAL: RpcResponseHeaderProto.RpcStatusProto
    class RpcErrorCodeProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ERROR_APPLICATION: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        ERROR_NO_SUCH_METHOD: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        ERROR_NO_SUCH_PROTOCOL: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        ERROR_RPC_SERVER: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        ERROR_SERIALIZING_RESPONSE: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        ERROR_RPC_VERSION_MISMATCH: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_UNKNOWN: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_UNSUPPORTED_SERIALIZATION: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_INVALID_RPC_HEADER: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_DESERIALIZING_REQUEST: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_VERSION_MISMATCH: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
        FATAL_UNAUTHORIZED: _ClassVar[RpcResponseHeaderProto.RpcErrorCodeProto]
    ERROR_APPLICATION: RpcResponseHeaderProto.RpcErrorCodeProto
    ERROR_NO_SUCH_METHOD: RpcResponseHeaderProto.RpcErrorCodeProto
    ERROR_NO_SUCH_PROTOCOL: RpcResponseHeaderProto.RpcErrorCodeProto
    ERROR_RPC_SERVER: RpcResponseHeaderProto.RpcErrorCodeProto
    ERROR_SERIALIZING_RESPONSE: RpcResponseHeaderProto.RpcErrorCodeProto
    ERROR_RPC_VERSION_MISMATCH: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_UNKNOWN: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_UNSUPPORTED_SERIALIZATION: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_INVALID_RPC_HEADER: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_DESERIALIZING_REQUEST: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_VERSION_MISMATCH: RpcResponseHeaderProto.RpcErrorCodeProto
    FATAL_UNAUTHORIZED: RpcResponseHeaderProto.RpcErrorCodeProto
    CALLID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SERVERIPCVERSIONNUM_FIELD_NUMBER: _ClassVar[int]
    EXCEPTIONCLASSNAME_FIELD_NUMBER: _ClassVar[int]
    ERRORMSG_FIELD_NUMBER: _ClassVar[int]
    ERRORDETAIL_FIELD_NUMBER: _ClassVar[int]
    CLIENTID_FIELD_NUMBER: _ClassVar[int]
    RETRYCOUNT_FIELD_NUMBER: _ClassVar[int]
    STATEID_FIELD_NUMBER: _ClassVar[int]
    callId: int
    status: RpcResponseHeaderProto.RpcStatusProto
    serverIpcVersionNum: int
    exceptionClassName: str
    errorMsg: str
    errorDetail: RpcResponseHeaderProto.RpcErrorCodeProto
    clientId: bytes
    retryCount: int
    stateId: int
    def __init__(self, callId: _Optional[int] = ..., status: _Optional[_Union[RpcResponseHeaderProto.RpcStatusProto, str]] = ..., serverIpcVersionNum: _Optional[int] = ..., exceptionClassName: _Optional[str] = ..., errorMsg: _Optional[str] = ..., errorDetail: _Optional[_Union[RpcResponseHeaderProto.RpcErrorCodeProto, str]] = ..., clientId: _Optional[bytes] = ..., retryCount: _Optional[int] = ..., stateId: _Optional[int] = ...) -> None: ...

class UserInformationProto(_message.Message):
    __slots__ = ("effectiveUser", "realUser")
    EFFECTIVEUSER_FIELD_NUMBER: _ClassVar[int]
    REALUSER_FIELD_NUMBER: _ClassVar[int]
    effectiveUser: str
    realUser: str
    def __init__(self, effectiveUser: _Optional[str] = ..., realUser: _Optional[str] = ...) -> None: ...

class IpcConnectionContextProto(_message.Message):
    __slots__ = ("userInfo", "protocol")
    USERINFO_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    userInfo: UserInformationProto
    protocol: str
    def __init__(self, userInfo: _Optional[_Union[UserInformationProto, _Mapping]] = ..., protocol: _Optional[str] = ...) -> None: ...

class RequestHeaderProto(_message.Message):
    __slots__ = ("methodName", "declaringClassProtocolName", "clientProtocolVersion")
    METHODNAME_FIELD_NUMBER: _ClassVar[int]
    DECLARINGCLASSPROTOCOLNAME_FIELD_NUMBER: _ClassVar[int]
    CLIENTPROTOCOLVERSION_FIELD_NUMBER: _ClassVar[int]
    methodName: str
    declaringClassProtocolName: str
    clientProtocolVersion: int
    def __init__(self, methodName: _Optional[str] = ..., declaringClassProtocolName: _Optional[str] = ..., clientProtocolVersion: _Optional[int] = ...) -> None: ...

class RpcSaslProto(_message.Message):
    __slots__ = ("version", "state", "token", "auths")
    class SaslState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SUCCESS: _ClassVar[RpcSaslProto.SaslState]
        NEGOTIATE: _ClassVar[RpcSaslProto.SaslState]
        INITIATE: _ClassVar[RpcSaslProto.SaslState]
        CHALLENGE: _ClassVar[RpcSaslProto.SaslState]
        RESPONSE: _ClassVar[RpcSaslProto.SaslState]
        WRAP: _ClassVar[RpcSaslProto.SaslState]
    SUCCESS: RpcSaslProto.SaslState
    NEGOTIATE: RpcSaslProto.SaslState
    INITIATE: RpcSaslProto.SaslState
    CHALLENGE: RpcSaslProto.SaslState
    RESPONSE: RpcSaslProto.SaslState
    WRAP: RpcSaslProto.SaslState
    class SaslAuth(_message.Message):
        __slots__ = ("method", "mechanism", "protocol", "serverId", "challenge")
        METHOD_FIELD_NUMBER: _ClassVar[int]
        MECHANISM_FIELD_NUMBER: _ClassVar[int]
        PROTOCOL_FIELD_NUMBER: _ClassVar[int]
        SERVERID_FIELD_NUMBER: _ClassVar[int]
        CHALLENGE_FIELD_NUMBER: _ClassVar[int]
        method: str
        mechanism: str
        protocol: str
        serverId: str
        challenge: bytes
        def __init__(self, method: _Optional[str] = ..., mechanism: _Optional[str] = ..., protocol: _Optional[str] = ..., serverId: _Optional[str] = ..., challenge: _Optional[bytes] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AUTHS_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: RpcSaslProto.SaslState
    token: bytes
    auths: _containers.RepeatedCompositeFieldContainer[RpcSaslProto.SaslAuth]
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[RpcSaslProto.SaslState, str]] = ..., token: _Optional[bytes] = ..., auths: _Optional[_Iterable[_Union[RpcSaslProto.SaslAuth, _Mapping]]] = ...) -> None: ...
