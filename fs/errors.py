"""The one errno-carrying exception family of leasefs.

Every error that crosses a process boundary is a ``LeaseFSError`` subclass. On the wire it
travels as ``{"type": class name, "errno": n, "message": text}`` and ``from_wire`` rebuilds
the same class on the other side, so a client catches ``FileNotFound`` exactly as the
server raised it. The FUSE mount turns ``err.errno`` into ``FUSEError`` in one place; the
CLI prints ``err.message`` (which names the path and the cause) and exits non-zero.

Unknown type names (a newer server) come back as the base class with the errno kept.
"""

from __future__ import annotations

import errno as _errno


class LeaseFSError(Exception):
    """Base of every leasefs error; ``errno`` is what the kernel / shell would see."""

    errno: int = _errno.EIO
    #: True when the same call may simply be tried again later (safe mode, recovery, ...).
    retriable: bool = False

    def __init__(self, message: str = "", *, errno: int | None = None):
        super().__init__(message)
        self.message = message
        if errno is not None:
            self.errno = errno

    def __str__(self) -> str:  # the message already names path and cause
        return self.message or self.__class__.__name__

    def to_wire(self) -> dict:
        return {"type": type(self).__name__, "errno": self.errno, "message": self.message}


class FileNotFound(LeaseFSError):
    """The path (or an ancestor) does not exist."""
    errno = _errno.ENOENT


class FileExists(LeaseFSError):
    """The path already exists."""
    errno = _errno.EEXIST


class NotDirectory(LeaseFSError):
    """A path component is not a directory."""
    errno = _errno.ENOTDIR


class IsDirectory(LeaseFSError):
    """A file operation was aimed at a directory."""
    errno = _errno.EISDIR


class DirectoryNotEmpty(LeaseFSError):
    """Non-recursive delete of a non-empty directory."""
    errno = _errno.ENOTEMPTY


class PermissionDenied(LeaseFSError):
    """The caller may not do this."""
    errno = _errno.EACCES


class InvalidPath(LeaseFSError):
    """Malformed path: empty component, '..', NUL, not absolute."""
    errno = _errno.EINVAL


class NameTooLong(LeaseFSError):
    """A path component or the whole path is too long."""
    errno = _errno.ENAMETOOLONG


class InvalidArgument(LeaseFSError):
    """An argument has the wrong type or value."""
    errno = _errno.EINVAL


class NotSupported(LeaseFSError):
    """The operation is not supported."""
    errno = _errno.EOPNOTSUPP


class NoSpace(LeaseFSError):
    """No block server can take the data."""
    errno = _errno.ENOSPC


class FileTooLarge(LeaseFSError):
    """A file would grow past the largest size it may have (``max_blocks_per_file`` blocks
    of its block size)."""
    errno = _errno.EFBIG


class QuotaExceeded(LeaseFSError):
    """A configured limit was exceeded."""
    errno = _errno.EDQUOT


class NSQuotaExceeded(QuotaExceeded):
    """A folder's name quota (folders + files) would be exceeded (HDFS
    NSQuotaExceededException)."""


class DSQuotaExceeded(QuotaExceeded):
    """A folder's space quota (bytes × replication) would be exceeded (HDFS
    DSQuotaExceededException)."""


class AlreadyBeingCreated(LeaseFSError):
    """The file is open for writing by a lease holder."""
    errno = _errno.EBUSY


class RecoveryInProgress(LeaseFSError):
    """Lease recovery runs on the file; try again later."""
    errno = _errno.EAGAIN
    retriable = True


class AnswerLost(LeaseFSError):
    """A retried call changed the namespace before the metadata server failed over or
    restarted, but its answer cannot be rebuilt (a truncated file changed since; what a
    status answer shows is gone since) and running it again is not safe. Retriable as an operation:
    not with the same call id (that meets the same entry), but as a new call after a look at
    the namespace."""
    errno = _errno.EAGAIN
    retriable = True


class TryAgain(LeaseFSError):
    """The namespace kept changing under a request (its path moved while it waited for
    its locks); the same call may succeed when sent again (HDFS RetriableException)."""
    errno = _errno.EAGAIN
    retriable = True


class LeaseExpired(LeaseFSError):
    """The caller no longer holds the lease on the file."""
    errno = _errno.EBADF


class NotReplicatedYet(LeaseFSError):
    """The previous block is not yet minimally replicated."""
    errno = _errno.EAGAIN
    retriable = True


class StaleGenerationStamp(LeaseFSError):
    """A replica or request carries an outdated generation stamp."""
    errno = _errno.ESTALE


class ReplicaChanged(StaleGenerationStamp):
    """A replica became a new version (a patch under a new generation stamp) while a read
    of it was streaming: the bytes already read are of the old version, the rest would be
    of the new one. Read it again (from its new stamp)."""
    retriable = True


class InvalidToken(LeaseFSError):
    """A block access token was refused."""
    errno = _errno.EACCES


class AuthenticationFailed(LeaseFSError):
    """A peer did not prove who it is (a block server without the cluster key, a call of
    the block-server protocol on a connection that did not authenticate)."""
    errno = _errno.EACCES


class AuthenticationRequired(AuthenticationFailed):
    """A call on a connection that has not authenticated yet (security = secure)."""


class ClockSkew(LeaseFSError):
    """A block server's wall clock differs from the metadata server's by more than
    ``clock_skew_max``: its registration is refused until the hosts' clocks agree (tokens
    and leases use wall time)."""
    errno = _errno.EINVAL


class TlsError(LeaseFSError):
    """TLS could not be set up with a peer (tls = on): its certificate is not trusted, one
    side speaks TLS and the other does not, a certificate or key file is missing or bad.
    Not retried: trying again meets the same setting."""
    errno = _errno.EPROTO


class RegistrationRefused(LeaseFSError):
    """The metadata server refused a block server's registration for a fault of the block
    server's settings (an address its peers cannot reach): registering again meets the same
    refusal, so the block server stops (HDFS DisallowedDatanodeException)."""
    errno = _errno.EADDRNOTAVAIL


class SafeMode(LeaseFSError):
    """The metadata server is in safe mode: reads only."""
    errno = _errno.EROFS
    retriable = True


class StandbyError(LeaseFSError):
    """The metadata server is not the active one (standby, observer for a call it does not
    serve, or it just lost its term): the call was NOT carried out; send it to another
    metadata server of the list (HDFS StandbyException)."""
    errno = _errno.EAGAIN
    retriable = True


class ChecksumError(LeaseFSError):
    """Data does not match its CRC32C checksum."""
    errno = _errno.EIO


class PipelineError(LeaseFSError):
    """A write pipeline failed (setup refused, a node acked with an error, a node vanished)."""
    errno = _errno.EIO


class ReplicaNotFound(LeaseFSError):
    """The block server has no such replica."""
    errno = _errno.ENOENT


class ReplicaAlreadyExists(LeaseFSError):
    """The block server already has the replica."""
    errno = _errno.EEXIST


class BlockMissing(LeaseFSError):
    """No readable replica of a block is left."""
    errno = _errno.EIO


class ProtocolError(LeaseFSError):
    """The peer sent something that is not leasefs protocol."""
    errno = _errno.EPROTO


class FrameTooLarge(ProtocolError):
    """A frame is larger than the configured maximum."""
    errno = _errno.EMSGSIZE


class UnknownMethod(LeaseFSError):
    """The server has no such RPC method."""
    errno = _errno.ENOSYS


class ServerUnavailable(LeaseFSError):
    """The server cannot be reached or the connection broke."""
    errno = _errno.EIO
    retriable = True


class StreamStalled(ServerUnavailable):
    """An output stream's operation made no progress for the client's
    ``data_stall_timeout``: its block servers (or the metadata server it waited for) are
    silent. The stream is failed; a mount answers EIO."""


class NothingListens(ServerUnavailable):
    """A connection to a loopback address was refused: no server listens there. On this
    machine a refusal is an answer (the port is closed), not a lost packet."""
    errno = _errno.ECONNREFUSED
    retriable = True   # across a server's restart it is; callers that know better stop


class ServerBusy(ServerUnavailable):
    """The server refused the connection: it holds as many as it allows (from this peer or
    in all)."""
    errno = _errno.EAGAIN
    retriable = True


class RpcTimeout(ServerUnavailable):
    """No reply in time."""
    errno = _errno.ETIMEDOUT
    retriable = True


class InternalError(LeaseFSError):
    """A bug on the server; see its log."""
    errno = _errno.EIO


_BY_NAME = {cls.__name__: cls for cls in list(globals().values())
            if isinstance(cls, type) and issubclass(cls, LeaseFSError)}


def from_wire(obj) -> LeaseFSError:
    """Rebuild an exception sent as ``{"type", "errno", "message"}``; tolerant of junk."""
    if not isinstance(obj, dict):
        return ProtocolError(f"malformed error object from server: {obj!r:.200}")
    name = obj.get("type")
    message = obj.get("message") if isinstance(obj.get("message"), str) else ""
    code = obj.get("errno") if isinstance(obj.get("errno"), int) else None
    cls = _BY_NAME.get(name)
    if cls is None:
        return LeaseFSError(f"{name}: {message}", errno=code)
    return cls(message)


def error_classes() -> dict[str, type[LeaseFSError]]:
    """All error classes by name (for docs and tests)."""
    return dict(_BY_NAME)


def sole_exception(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (trio wraps errors
    that cross a nursery); anything else is returned unchanged."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
