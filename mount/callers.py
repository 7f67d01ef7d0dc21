"""Who a FUSE request is for: the identity the mount's calls carry while it serves one.

Why it exists: the metadata server checks permissions for the user who makes a call. The
kernel names each request's caller (``ctx.uid``/``ctx.gid``); the mount's calls for it say
so (``fs.rpc.ACTING_FOR``), and the metadata server takes that only from a proxy user (the
superuser, who usually runs the mount, or one named in ``proxy_users``). So what a user may
do through the mount is what that user may do through any client, checked in one place.
Requests the kernel sends without a caller (read, write, flush, release, readdir) act for
the user who opened the handle they name: their permission was checked at that open.

Groups: the caller's gid first, then the system's groups of its user (the kernel does not
pass supplementary groups), as the metadata server would resolve them.

Concurrency contract: pure apart from a memo of identities (uid, gid → identity), which the
mount's trio thread alone fills; name lookups are the system's (``/etc/passwd``), memoized
in ``fs.rpc``.
"""

from __future__ import annotations

import functools

from fs.rpc import MAX_GROUPS, group_name, os_groups, user_name


@functools.lru_cache(maxsize=1024)
def identity(uid: int, gid: int) -> dict:
    """The ``acting_for`` map of a caller: ``{"user", "groups"}``."""
    user = user_name(uid)
    groups = list(dict.fromkeys([group_name(gid), *os_groups(user)]))[:MAX_GROUPS]
    return {"user": user, "groups": groups}


def new_owner(ctx) -> tuple[str | None, str | None]:
    """Owner and group for a new inode: the calling process's uid/gid (as names when the
    system knows them). ``None`` without a context (the server picks)."""
    if ctx is None:
        return None, None
    return user_name(ctx.uid), group_name(ctx.gid)


def request_identity(args, kwargs) -> dict | None:
    """The identity of a handler's request (``args[0]`` is the ``Operations``): from its
    ``ctx`` (a pyfuse3 ``RequestContext``, the last argument of the handlers that get one);
    for a handler without one that names a file or directory handle (``args[1]``), the
    identity that opened the handle (``Operations.handle_identity``); else None."""
    ctx = kwargs.get("ctx")
    if ctx is None and args:
        ctx = args[-1]
    uid = getattr(ctx, "uid", None)
    if uid is not None:
        return identity(uid, ctx.gid)
    if len(args) > 1 and type(args[1]) is int:
        of_handle = getattr(args[0], "handle_identity", None)
        if of_handle is not None:
            return of_handle(args[1])
    return None
