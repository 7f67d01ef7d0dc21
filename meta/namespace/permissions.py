"""HDFS-style permission checks (``FSPermissionChecker``) for the metadata server.

Why it exists: inodes carry ``mode``, ``owner`` and ``group``, and the metadata server is
the only place that can enforce them for every client (the FUSE mount's
``default_permissions`` protects one kernel, not the cluster). Identity is HDFS "simple"
authentication: the client states its user and groups in its RPC hello (``fs/rpc.py``).

What is checked, in HDFS's order (``FSPermissionChecker.checkPermission``), for a path of
``n`` components whose inode chain ``chain`` (root first, only the existing leading
components; ``NamespaceView.walk(strict=False)``) the server resolved:

1. traverse: EXECUTE on every directory up to the nearest existing ancestor of the last
   component (a non-directory on the way is not a permission matter: the namespace refuses
   the path with ``NotDirectory``, so the checks stop there);
2. sticky bit: when the parent is written (``parent`` includes WRITE) and the last component
   exists, a sticky parent lets only the entry's owner or the parent's owner through;
3. ``ancestor`` access on the nearest existing ancestor (create, mkdirs, symlink, rename
   destination), ``parent`` access on the parent, ``access`` on the inode itself;
4. ``owner``: the caller must own the inode (setPermission, setOwner); ``owner_or``: the
   caller owns the inode or has that access to it (setTimes: POSIX lets the owner of a
   read-only file ``touch`` it, and anyone who may write it). One exception to ``owner``
   (``clears_only_setid``): a mode change of a regular file that only clears its setuid
   and/or setgid bits needs WRITE instead, since POSIX clears them at a non-owner's write
   and a FUSE kernel sends that as a mode change by the writer.

Subtree access (recursive delete, content summary) is checked node by node by the caller
with ``check_sub_access`` because walking a subtree reads the store. Classes are exclusive
as in HDFS and POSIX: the owner is judged by the owner bits only, a group member by the
group bits only. The superuser (the configured name, else the metadata server's process
user, or any member of the supergroup) passes everything; with permissions disabled
nothing is checked.

Messages keep HDFS's shape, e.g.
``Permission denied: user=alice, access=WRITE, inode="/a/b":bob:staff:drwxr-xr-x``.

Concurrency contract: pure functions and immutable values; no I/O, no clock, no awaits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fs import paths
from fs.errors import PermissionDenied

from ..schema.inode import DIR, FILE, Inode

log = logging.getLogger(__name__)

# FsAction bits (the same as the rwx bits of one class)
NONE = 0
EXECUTE = 1
WRITE = 2
WRITE_EXECUTE = 3
READ = 4
READ_EXECUTE = 5
READ_WRITE = 6
ALL = 7
ACTION_NAMES = {NONE: "NONE", EXECUTE: "EXECUTE", WRITE: "WRITE",
                WRITE_EXECUTE: "WRITE_EXECUTE", READ: "READ", READ_EXECUTE: "READ_EXECUTE",
                READ_WRITE: "READ_WRITE", ALL: "ALL"}
STICKY = 0o1000
SETID = 0o6000   # setuid, setgid


@dataclass(frozen=True)
class Caller:
    """Who calls, as the checker sees it."""

    user: str
    groups: frozenset[str]
    superuser: bool


def mode_string(mode: int, kind: str) -> str:
    """``drwxr-xr-x`` / ``-rw-r--r--`` of an inode's mode and kind; the sticky bit shows as
    ``t`` (``T`` without x)."""
    out = ["d" if kind == DIR else "-"]
    for shift in (6, 3, 0):
        bits = (mode >> shift) & 7
        out += ["r" if bits & 4 else "-", "w" if bits & 2 else "-", "x" if bits & 1 else "-"]
    if mode & STICKY:
        out[-1] = "t" if mode & 1 else "T"
    return "".join(out)


def describe(path: str, inode: Inode) -> str:
    """``"/a/b":owner:group:drwxr-xr-x`` as in HDFS messages."""
    return f'"{path}":{inode.owner}:{inode.group}:{mode_string(inode.mode, inode.type)}'


def clears_only_setid(inode: Inode, mode) -> bool:
    """Is ``mode`` the regular file ``inode``'s mode with some of its setuid/setgid bits
    cleared and nothing else changed (what a write by a non-owner does)?"""
    if inode.type != FILE or type(mode) is not int:
        return False
    current = (inode.mode or 0)
    cleared = current & ~mode
    return mode != current and not mode & ~current and not cleared & ~SETID


def permits(caller: Caller, inode: Inode, access: int) -> bool:
    """Do the inode's mode bits grant ``access`` to the caller (superuser not considered)?"""
    mode = (inode.mode or 0)
    if caller.user == inode.owner:
        bits = (mode >> 6) & 7
    elif inode.group in caller.groups:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & access == access


#: distinct (user, groups) identities ``PermissionChecker.caller`` remembers
CALLERS_KEPT = 1024


class PermissionChecker:
    """The checks of one metadata server (its superuser, supergroup, on/off switch)."""

    def __init__(self, *, superuser: str, supergroup: str, enabled: bool = True):
        self.superuser = superuser
        self.supergroup = supergroup
        self.enabled = enabled
        # callers by (user, groups): every RPC asks, and a frozen Caller cost more to build
        # than many a handler's own work; a connection's identity repeats call after call
        self._callers: dict[tuple, Caller] = {}

    def caller(self, user: str, groups: Sequence[str] = ()) -> Caller:
        key = (user, groups)
        try:
            known = self._callers.get(key)
        except TypeError:   # groups given as a list: not remembered
            key, known = None, None
        if known is not None:
            return known
        frozen = frozenset(groups)
        known = Caller(user, frozen, user == self.superuser or self.supergroup in frozen)
        if key is not None:
            if len(self._callers) >= CALLERS_KEPT:
                self._callers.clear()
            self._callers[key] = known
        return known

    def applies_to(self, caller: Caller) -> bool:
        """False when nothing is checked for this caller (checks off, or the superuser)."""
        return self.enabled and not caller.superuser

    # ------------------------------------------------------------------ single checks
    def check_access(self, caller: Caller, path: str, inode: Inode, access: int) -> None:
        if access and self.applies_to(caller) and not permits(caller, inode, access):
            raise PermissionDenied(f"Permission denied: user={caller.user}, "
                                   f"access={ACTION_NAMES[access]}, inode={describe(path, inode)}")

    def check_owner(self, caller: Caller, path: str, inode: Inode) -> None:
        if self.applies_to(caller) and caller.user != inode.owner:
            raise PermissionDenied(f"Permission denied: user={caller.user} is not the owner "
                                   f"of inode={describe(path, inode)}")

    def check_sticky(self, caller: Caller, parent_path: str, parent: Inode, path: str,
                     inode: Inode) -> None:
        """In a sticky directory only the entry's owner or the directory's owner may
        remove or rename the entry."""
        if not self.applies_to(caller) or not (parent.mode or 0) & STICKY:
            return
        if caller.user in (parent.owner, inode.owner):
            return
        raise PermissionDenied(f"Permission denied by sticky bit: user={caller.user}, "
                               f"path={describe(path, inode)}, "
                               f"parent={describe(parent_path, parent)}")

    def check_superuser(self, caller: Caller, what: str) -> None:
        if self.applies_to(caller):
            raise PermissionDenied(f"Access denied for user {caller.user}. Superuser "
                                   f"privilege is required ({what})")

    def check_sub_access(self, caller: Caller, inode: Inode, access: int,
                         path_of: Callable[[], str], *, ignore_empty_dir: bool = False) -> None:
        """One node of a subtree walk (HDFS ``checkSubAccess``): directories only; with
        ``ignore_empty_dir`` (delete) an empty directory is not checked. ``path_of`` names
        the node, called only for the message."""
        if inode.type != DIR or not self.applies_to(caller):
            return
        if ignore_empty_dir and not (inode.children or 0):
            return
        if not permits(caller, inode, access):
            self.check_access(caller, path_of(), inode, access)

    # ------------------------------------------------------------------ a path
    def check_path(self, caller: Caller, parts: Sequence[str], chain: Sequence[dict], *,
                   ancestor: int = NONE, parent: int = NONE, access: int = NONE,
                   owner: bool = False, owner_or: int = NONE) -> None:
        """HDFS ``checkPermission`` on a resolved path; see the module docstring.

        ``parts``: the path's components; ``chain``: inodes of the root and of the existing
        leading components (at most ``len(parts) + 1``)."""
        if not self.applies_to(caller):
            return
        n = len(parts) + 1                       # inodes of the full path, root included
        if not chain or len(chain) > n:
            raise ValueError(f"inode chain of {len(chain)} for a path of {n - 1} components")
        exists = len(chain) == n
        ancestor_index = min(len(chain), n - 1) - 1   # nearest existing, before the last
        for i in range(ancestor_index + 1):
            if chain[i].type != DIR:
                return   # not a directory: the namespace refuses the path (NotDirectory)
            self.check_access(caller, paths.join_parts(parts[:i]), chain[i], EXECUTE)
        if n > 1 and exists and parent & WRITE:
            self.check_sticky(caller, paths.join_parts(parts[:-1]), chain[n - 2],
                              paths.join_parts(parts), chain[n - 1])
        if n > 1 and ancestor and ancestor_index >= 0:
            self.check_access(caller, paths.join_parts(parts[:ancestor_index]),
                              chain[ancestor_index], ancestor)
        if n > 1 and parent and len(chain) >= n - 1:
            self.check_access(caller, paths.join_parts(parts[:-1]), chain[n - 2], parent)
        if exists and access:
            self.check_access(caller, paths.join_parts(parts), chain[n - 1], access)
        if exists and owner:
            self.check_owner(caller, paths.join_parts(parts), chain[n - 1])
        if exists and owner_or and caller.user != chain[n - 1].owner:
            self.check_access(caller, paths.join_parts(parts), chain[n - 1], owner_or)

    # ------------------------------------------------------------------ owners
    def check_set_owner(self, caller: Caller, path: str, owner: str | None,
                        group: str | None) -> None:
        """setOwner after the owner check: a new owner needs the superuser (an owner naming
        themselves changes nothing); a new group needs membership (HDFS)."""
        if not self.applies_to(caller):
            return
        if owner is not None and owner != caller.user:
            raise PermissionDenied(f"Permission denied: user={caller.user} is not a superuser "
                                   f"and cannot change the owner of \"{path}\" to {owner}")
        if group is not None and group not in caller.groups:
            raise PermissionDenied(f"Permission denied: user={caller.user} does not belong "
                                   f"to group {group} (cannot set it on \"{path}\")")

    def new_owner(self, caller: Caller, path: str, owner: str | None,
                  group: str | None) -> tuple[str, str | None]:
        """Owner and group of a new inode: the caller and (``None``) the parent's group,
        unless explicit ones are passed; a non-superuser may pass only themselves and
        groups they belong to. With checks off, explicit values are taken as given."""
        if self.applies_to(caller):
            if owner is not None and owner != caller.user:
                raise PermissionDenied(f"Permission denied: user={caller.user} cannot create "
                                       f"\"{path}\" owned by {owner} (only the superuser may)")
            if group is not None and group not in caller.groups:
                raise PermissionDenied(f"Permission denied: user={caller.user} does not "
                                       f"belong to group {group} (cannot create \"{path}\" "
                                       f"with it)")
        return (owner if owner is not None else caller.user), group
