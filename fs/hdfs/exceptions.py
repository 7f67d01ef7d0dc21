"""leasefs's errors (``fs.errors``) as the Java exception classes Hadoop's client knows.

Hadoop's client rebuilds an exception of the class an IPC error answer names when that
class is listed for the call and loadable; otherwise it raises a ``RemoteException``
carrying the name and the message. Either way the name decides what the client does:
``StandbyException`` moves a failover proxy to the next server, ``RetriableException`` and
``SafeModeException`` are retried, ``NotReplicatedYetException`` makes addBlock back off,
``FileNotFoundException`` is what ``-test -e`` and ``-ls`` report. The message is leasefs's
own (it names the path and the cause).

Concurrency contract: pure.
"""

from __future__ import annotations

from .. import errors

IO_EXCEPTION = "java.io.IOException"
NO_SUCH_METHOD = "org.apache.hadoop.ipc.RpcNoSuchMethodException"
NO_SUCH_PROTOCOL = "org.apache.hadoop.ipc.RpcNoSuchProtocolException"
SERVER_EXCEPTION = "org.apache.hadoop.ipc.RpcServerException"
VERSION_MISMATCH = "org.apache.hadoop.ipc.RPC$VersionMismatch"
ACCESS_CONTROL = "org.apache.hadoop.security.AccessControlException"

# most specific first: a subclass not named here takes its nearest named base's class
_JAVA_CLASSES: tuple[tuple[type[errors.LeaseFSError], str], ...] = (
    (errors.FileNotFound, "java.io.FileNotFoundException"),
    # HDFS answers a read of a folder "Path is not a file" with FileNotFoundException
    (errors.IsDirectory, "java.io.FileNotFoundException"),
    (errors.FileExists, "org.apache.hadoop.fs.FileAlreadyExistsException"),
    (errors.AlreadyBeingCreated, "org.apache.hadoop.hdfs.protocol.AlreadyBeingCreatedException"),
    (errors.RecoveryInProgress, "org.apache.hadoop.hdfs.protocol.RecoveryInProgressException"),
    (errors.LeaseExpired, "org.apache.hadoop.hdfs.server.namenode.LeaseExpiredException"),
    (errors.SafeMode, "org.apache.hadoop.hdfs.server.namenode.SafeModeException"),
    (errors.PermissionDenied, ACCESS_CONTROL),
    (errors.AuthenticationFailed, ACCESS_CONTROL),
    (errors.InvalidToken, "org.apache.hadoop.security.token.SecretManager$InvalidToken"),
    (errors.NotDirectory, "org.apache.hadoop.fs.ParentNotDirectoryException"),
    (errors.DirectoryNotEmpty, "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException"),
    (errors.InvalidPath, "org.apache.hadoop.fs.InvalidPathException"),
    (errors.NameTooLong, "org.apache.hadoop.fs.InvalidPathException"),
    (errors.NSQuotaExceeded, "org.apache.hadoop.hdfs.protocol.NSQuotaExceededException"),
    (errors.DSQuotaExceeded, "org.apache.hadoop.hdfs.protocol.DSQuotaExceededException"),
    (errors.QuotaExceeded, "org.apache.hadoop.hdfs.protocol.QuotaExceededException"),
    (errors.NotReplicatedYet, "org.apache.hadoop.hdfs.server.namenode.NotReplicatedYetException"),
    (errors.TryAgain, "org.apache.hadoop.ipc.RetriableException"),
    (errors.AnswerLost, "org.apache.hadoop.ipc.RetriableException"),
    (errors.StandbyError, "org.apache.hadoop.ipc.StandbyException"),
    (errors.UnknownMethod, NO_SUCH_METHOD),
    (errors.NotSupported, "java.lang.UnsupportedOperationException"),
    (errors.InvalidArgument, "org.apache.hadoop.HadoopIllegalArgumentException"),
)


def java_class(exc: BaseException) -> str:
    """The Java exception class name Hadoop's client is told for ``exc``."""
    for cls, name in _JAVA_CLASSES:
        if isinstance(exc, cls):
            return name
    return IO_EXCEPTION


def table() -> dict[str, str]:
    """leasefs error class name -> Java class name, for every leasefs error (docs, tests)."""
    return {name: java_class(cls("")) for name, cls in errors.error_classes().items()}
