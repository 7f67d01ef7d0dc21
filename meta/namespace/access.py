"""Who a caller is and what it may do to a path: the permission checks every front end
makes before it plans a change (HDFS FSPermissionChecker, called through FSDirectory).

Why it exists: the rules themselves are pure (``permissions.PermissionChecker``); this
service binds them to the namespace (the inode chain of a path) and to the call's
identity (``ctx.user``/``ctx.groups`` from the RPC hello), so each handler says only what
access it needs. A denied call raises ``PermissionDenied`` before anything is planned or
journaled.

Concurrency contract: synchronous reads of the namespace on the trio thread, except
``check_subtree``, which yields by ``TimeSlice`` while the caller's path locks keep the
subtree still.
"""

from __future__ import annotations

from ..schema.inode import DIR
from .args import check_name
from .permissions import WRITE, Caller, PermissionChecker, clears_only_setid
from .view import NamespaceView
from .timeslice import TimeSlice


class Access:
    def __init__(self, view: NamespaceView, permissions: PermissionChecker, superuser: str):
        self.view = view
        self.permissions = permissions
        self.superuser = superuser

    def caller_of(self, ctx) -> Caller:
        """The caller's identity; an in-process caller (``ctx.user`` None) acts as the
        server's own user."""
        user = getattr(ctx, "user", None)
        if user is None:
            return self.permissions.caller(self.superuser)
        return self.permissions.caller(user, getattr(ctx, "groups", ()))

    def checked_caller(self, ctx) -> Caller | None:
        """The caller when permission checks apply to it; None (no walk needed) for the
        superuser or with permissions disabled."""
        caller = self.caller_of(ctx)
        return caller if self.permissions.applies_to(caller) else None

    def token_user(self, ctx) -> str:
        """Whom a block access token is made out to (the server's user in-process)."""
        return getattr(ctx, "user", None) or self.superuser

    def inode_chain(self, parts) -> list[dict]:
        """Inodes of the root and the existing leading components of ``parts``."""
        return [inode for _, inode in self.view.walk(parts, strict=False)]

    def check_access(self, ctx, parts, **needs) -> None:
        """``PermissionChecker.check_path`` for the caller of ``ctx`` on ``parts``."""
        caller = self.checked_caller(ctx)
        if caller is not None:
            self.permissions.check_path(caller, parts, self.inode_chain(parts), **needs)

    def check_set_mode(self, ctx, parts, mode) -> None:
        """chmod's check: the owner (or the superuser); or, for a change that only clears a
        regular file's setuid/setgid bits, a user who may write it (what POSIX does at a
        non-owner's write: the FUSE kernel sends it as a mode change by the writer)."""
        caller = self.checked_caller(ctx)
        if caller is None:
            return
        chain = self.inode_chain(parts)
        if len(chain) == len(parts) + 1 and clears_only_setid(chain[-1], mode):
            self.permissions.check_path(caller, parts, chain, access=WRITE)
        else:
            self.permissions.check_path(caller, parts, chain, owner=True)

    async def check_subtree(self, caller: Caller, parts, access: int, *,
                            ignore_empty_dir: bool = False) -> None:
        """HDFS subAccess: ``access`` on every directory of the subtree at ``parts``."""
        found = self.view.walk(parts, strict=False)
        if len(found) != len(parts) + 1 or found[-1][1].type != DIR:
            return
        walk = TimeSlice()
        for ino, node in self.view.iter_subtree(*found[-1]):
            self.permissions.check_sub_access(
                caller, node, access, lambda: self.view.path_of(ino) or f"<inode {ino}>",
                ignore_empty_dir=ignore_empty_dir)
            await walk.tick()

    def new_owner(self, ctx, what: str, canonical: str, owner, group) -> tuple[str, str | None]:
        """Owner and group of a new inode (``PermissionChecker.new_owner``)."""
        owner = check_name(owner, f"{what}: owner", optional=True)
        group = check_name(group, f"{what}: group", optional=True)
        return self.permissions.new_owner(self.caller_of(ctx), canonical, owner, group)
