"""The ONE place where leasefs errors become FUSE errnos.

Why: pyfuse3 turns a ``FUSEError(errno)`` raised by a handler into the errno the calling
process sees, but ANY other exception escaping a handler ends ``pyfuse3.main`` and so the
whole mount. Every handler of ``mount.operations`` is therefore wrapped by ``fuse_op``
(which also makes its calls act for the request's caller, ``mount.callers``):
``ServerUnavailable`` (metadata server unreachable or silent past the mount's
``mount_meta_timeout``, block servers silent as long: ``StreamStalled``) and
``LeaseExpired`` (the mount lost a file's lease) → ``EIO``, other ``LeaseFSError`` → its
``errno``, ``OSError`` (local staging files) → its errno, anything else (a bug) → logged
with its traceback and reported as ``EIO``. Cancellation passes through.
``fuse_op`` also counts each request in the mount's metrics (``LeaseFS.metrics``, a
``mount.metrics.MountMetrics``): its operation, result (ok or the errno's name), latency,
and the bytes of ``read``/``write`` answers.

Concurrency contract: pure functions; no state of their own (the metrics are the
handler's object's, on its trio thread).
"""

from __future__ import annotations

import errno as _errno
import functools
import logging
import time

import pyfuse3
import trio

from fs.errors import LeaseExpired, LeaseFSError, ServerUnavailable
from fs.rpc import ACTING_FOR

from .callers import request_identity

log = logging.getLogger(__name__)


def to_fuse_error(exc: BaseException) -> pyfuse3.FUSEError:
    """The ``FUSEError`` a caller of the mount sees for ``exc``."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, (ServerUnavailable, LeaseExpired)):
        # the cluster is away (RPC timeouts, silent block servers), or the file's lease
        # was lost: its content may lack what was written (EBADF would say the
        # descriptor is wrong, which it is not)
        return pyfuse3.FUSEError(_errno.EIO)
    if isinstance(exc, LeaseFSError):
        return pyfuse3.FUSEError(exc.errno or _errno.EIO)
    if isinstance(exc, OSError):
        return pyfuse3.FUSEError(exc.errno or _errno.EIO)
    return pyfuse3.FUSEError(_errno.EIO)


#: the operations that move a file's content
DATA_OPS = frozenset({"read", "write", "fsync", "flush", "release"})


def fuse_op(fn):
    """Wrap an async ``Operations`` handler so only ``FUSEError`` ever leaves it."""
    op = fn.__name__
    reads, writes = op == "read", op == "write"
    # a failure of moving data is never an answer the application expects (unlike ENOENT
    # from a lookup): its cause goes to the log whatever the errno
    data_op = op in DATA_OPS

    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        # the calls made for this request act for its caller (mount.callers)
        acting = ACTING_FOR.set(request_identity(args, kwargs))
        metrics = getattr(args[0], "metrics", None) if args else None
        started = time.perf_counter()
        result = "ok"
        try:
            value = await fn(*args, **kwargs)
            if metrics is not None:
                if reads:
                    metrics.read_bytes += len(value)
                elif writes:
                    metrics.written_bytes += value
            return value
        except pyfuse3.FUSEError as exc:
            result = _errno_name(exc.errno)
            raise
        except trio.Cancelled:
            result = "cancelled"
            raise
        except LeaseFSError as exc:
            error = to_fuse_error(exc)
            result = _errno_name(error.errno)
            # an answer the application expects (ENOENT, EEXIST...) is no news; an EIO, or
            # any failure to move data, is all it learns of a failure: the cause is logged
            (log.warning if data_op or error.errno == _errno.EIO else log.debug)(
                "%s: %s (%s)", op, exc, result)
            raise error from None
        except OSError as exc:
            log.warning("%s: local error: %s", op, exc)
            error = to_fuse_error(exc)
            result = _errno_name(error.errno)
            raise error from None
        except Exception:  # a bug: keep the mount alive, tell the caller EIO
            result = "EIO"
            log.exception("%s failed unexpectedly", op)
            raise pyfuse3.FUSEError(_errno.EIO) from None
        finally:
            ACTING_FOR.reset(acting)
            if metrics is not None:
                metrics.observe_op(op, result, time.perf_counter() - started)

    return handler


def _errno_name(code) -> str:
    return _errno.errorcode.get(code, "errno_other")


def fuse_error(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)
