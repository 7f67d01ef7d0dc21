"""The ONE place where leasefs errors become FUSE errnos.

Why: pyfuse3 turns a ``FUSEError(errno)`` raised by a handler into the errno the calling
process sees, but ANY other exception escaping a handler ends ``pyfuse3.main`` and so the
whole mount. Every handler of ``mount.operations`` is therefore wrapped by ``fuse_op``
(which also makes its calls act for the request's caller, ``mount.callers``):
``ServerUnavailable`` (metadata server unreachable or silent past the mount's
``mount_meta_timeout``) → ``EIO``, other ``LeaseFSError`` → its ``errno``, ``OSError`` (local staging files) → its errno, anything
else (a bug) → logged with its traceback and reported as ``EIO``. Cancellation passes through.

Concurrency contract: pure functions; no state.
"""

from __future__ import annotations

import errno as _errno
import functools
import logging

import pyfuse3
import trio

from fs.errors import LeaseFSError, ServerUnavailable
from fs.rpc import ACTING_FOR

from .callers import request_identity

log = logging.getLogger(__name__)


def to_fuse_error(exc: BaseException) -> pyfuse3.FUSEError:
    """The ``FUSEError`` a caller of the mount sees for ``exc``."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, ServerUnavailable):   # incl. RPC timeouts: the cluster is away
        return pyfuse3.FUSEError(_errno.EIO)
    if isinstance(exc, LeaseFSError):
        return pyfuse3.FUSEError(exc.errno or _errno.EIO)
    if isinstance(exc, OSError):
        return pyfuse3.FUSEError(exc.errno or _errno.EIO)
    return pyfuse3.FUSEError(_errno.EIO)


def fuse_op(fn):
    """Wrap an async ``Operations`` handler so only ``FUSEError`` ever leaves it."""

    @functools.wraps(fn)
    async def handler(*args, **kwargs):
        # the calls made for this request act for its caller (mount.callers)
        acting = ACTING_FOR.set(request_identity(args, kwargs))
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except trio.Cancelled:
            raise
        except LeaseFSError as exc:
            log.debug("%s: %s (errno %s)", fn.__name__, exc, exc.errno)
            raise to_fuse_error(exc) from None
        except OSError as exc:
            log.warning("%s: local error: %s", fn.__name__, exc)
            raise to_fuse_error(exc) from None
        except Exception:  # a bug: keep the mount alive, tell the caller EIO
            log.exception("%s failed unexpectedly", fn.__name__)
            raise pyfuse3.FUSEError(_errno.EIO) from None
        finally:
            ACTING_FOR.reset(acting)

    return handler


def fuse_error(code: int) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(code)
