"""Folder quotas (HDFS DirectoryWithQuotaFeature): the name quota (folders + files at and
below a folder) and the space quota (bytes × replication) of a folder, their checks in the
planners and the usage the appliers keep.

Design. A folder with a quota carries it in its inode (``quota``: ``ns``/``ds`` limits, -1
for none, and ``ns_used``/``ds_used``, its usage; see ``keys.py``). Only quota folders
store usage; the appliers add every change of names or space to each quota folder on the
parent chain of what changed (``charge_usage``), so replay rebuilds the usage exactly and a
namespace without quotas (the ``quota_dirs`` counter is 0) never walks a chain. A file's
space is ``file_charge``: its length × replication, its last block counted at the full
preferred block size while it is not COMPLETE (HDFS counts a block being written so).
What the appliers cannot walk in bounded work (a detached big subtree, a moved subtree) is
measured by the planner (``subtree_usage``, as HDFS does on delete and rename) and carried
in the record as ``usage: [names, space]``.

Checks happen in the planners, before a record exists, so a refused op changes nothing;
they raise ``NSQuotaExceeded`` / ``DSQuotaExceeded`` (errno EDQUOT) with HDFS's wording.
Truncate, fsync, close and block commits only lower usage and are not checked.

A measured usage stays true until its record is applied because of the path locks: every
record that changes a file's space (writer calls, lease recovery, pipeline updates) holds
that file's path, which a delete, rename or quota setting of a folder above it holds in
write mode.

``QuotaPlanner`` is a part of ``meta.namespace.namespace.Namespace`` over its view; the other
planners call ``check_quota`` and the usage measures, and ``RenamePlanner`` brackets the
moves of one RENAMES with ``begin_pending``/``end_pending``. Concurrency contract: that of
the planners and appliers: trio thread only, no awaits; planners only read.
"""

from __future__ import annotations

from fs import paths
from fs.errors import DSQuotaExceeded, InvalidArgument, NSQuotaExceeded

from ..schema import keys
from ..journal.ops_namespace import SetQuota
from ..schema.inode import DIR, FILE, Inode, Quota
from .args import is_int
from ..journal.charge import file_charge
from .view import NamespaceView

NO_QUOTA = -1
MAX_QUOTA = (1 << 63) - 1
_PREFIXES = ("", "K", "M", "G", "T", "P", "E")


def byte_desc(n: int) -> str:
    """HDFS ``StringUtils.byteDesc``: ``1048576`` -> ``1 MB``, ``1572864`` -> ``1.50 MB``."""
    step = 0
    while step + 1 < len(_PREFIXES) and abs(n) >= 1024 ** (step + 1):
        step += 1
    unit = 1024 ** step
    if n % unit == 0:
        return f"{n // unit} {_PREFIXES[step]}B"
    return f"{n / unit:.2f} {_PREFIXES[step]}B"


def check_quota_value(value, what: str) -> int:
    if not is_int(value) or not (value == NO_QUOTA or 0 < value <= MAX_QUOTA):
        raise InvalidArgument(f"{what}: a quota must be a positive integer (or -1 to clear), "
                              f"got {value!r:.40}")
    return value


class QuotaPlanner:
    """Quota checks, usage measurement and ``plan_set_quota``, reading through ``view``."""

    def __init__(self, view: NamespaceView):
        self._view = view
        # a RENAMES being planned: quota folder -> [names, space] its earlier moves add
        self._pending_usage: dict[int, list[int]] | None = None

    def begin_pending(self) -> None:
        """The moves of one RENAMES are planned from here on: each one's quota check counts
        the usage the earlier ones move (``pend_usage``)."""
        self._pending_usage = {}

    def end_pending(self) -> None:
        """That RENAMES is planned (or refused): checks count the stored usage only."""
        self._pending_usage = None

    def pend_usage(self, src_parent: int, dst_parent: int, usage) -> None:
        """A planned move of ``usage`` from under ``src_parent`` to under ``dst_parent``."""
        for parent, sign in ((src_parent, -1), (dst_parent, 1)):
            for ino, _ in self.quota_chain(parent):
                pending = self._pending_usage.setdefault(ino, [0, 0])
                pending[0] += sign * usage[0]
                pending[1] += sign * usage[1]

    def quotas_exist(self) -> bool:
        return bool(self._view.counters.get(keys.QUOTA_DIRS, 0))

    def quota_chain(self, ino: int) -> list[tuple[int, dict]]:
        """The quota folders at and above ``ino`` (nearest first)."""
        chain = []
        if not self.quotas_exist():
            return chain
        for _ in range(10_000):
            inode = self._view.get_inode(ino) if ino else None
            if inode is None:
                break
            if inode.quota is not None:
                chain.append((ino, inode))
            ino = (inode.parent or 0)
        return chain

    def subtree_usage(self, ino: int, inode: Inode) -> tuple[int, int]:
        """(names, space) at and under ``ino``; a quota folder below answers from its usage."""
        names = space = 0
        stack = [(ino, inode)]
        get = self._view.read
        while stack:
            cur, node = stack.pop()
            quota = node.quota
            if quota is not None:
                names += quota.ns_used
                space += quota.ds_used
                continue
            names += 1
            if node.type == FILE:
                space += file_charge(get, cur, node)
            elif node.type == DIR and node.children != 0:
                for _, child in self._view.children(cur):
                    child_inode = self._view.get_inode(child)
                    if child_inode is not None:
                        stack.append((child, child_inode))
        return names, space

    def check_quota(self, parent: int, names: int, space: int, *,
                    exclude: frozenset = frozenset()) -> None:
        """Refuse adding ``names`` names and ``space`` bytes under folder ``parent`` when a
        quota folder above it (not in ``exclude``) would go over its quota."""
        if names <= 0 and space <= 0:
            return
        pending = self._pending_usage or {}
        for ino, inode in self.quota_chain(parent):
            if ino in exclude:
                continue
            q = inode.quota
            if ino in pending:
                q = q.charged(*pending[ino])
            if names > 0 and q.ns >= 0 and q.ns_used + names > q.ns:
                raise NSQuotaExceeded(
                    f"The NameSpace quota (directories and files) of directory "
                    f"{self._view.path_of(ino)} is exceeded: quota={q.ns} "
                    f"file count={q.ns_used + names}")
            if space > 0 and q.ds >= 0 and q.ds_used + space > q.ds:
                used = q.ds_used + space
                raise DSQuotaExceeded(
                    f"The DiskSpace quota of {self._view.path_of(ino)} is exceeded: quota = "
                    f"{q.ds} B = {byte_desc(q.ds)} but diskspace consumed = "
                    f"{used} B = {byte_desc(used)}")

    def moved_usage(self, ino: int, inode: Inode, src_parent: int,
                    dst_parent: int) -> tuple[list[int] | None, frozenset]:
        """For a rename: the moved subtree's ``[names, space]`` when a quota folder is on
        either side (else None), and the quota folders the two sides share."""
        src = self.quota_chain(src_parent)
        dst = self.quota_chain(dst_parent)
        if not src and not dst:
            return None, frozenset()
        return list(self.subtree_usage(ino, inode)), frozenset(i for i, _ in src) & \
            frozenset(i for i, _ in dst)

    def detached_usage(self, parent: int, ino: int, inode: Inode, detach: bool) -> list | None:
        """What a detached subtree held, for the quota folders above it (a subtree removed
        in its record is measured by the applier itself)."""
        if not detach or not self.quota_chain(parent):
            return None
        return list(self.subtree_usage(ino, inode))

    def plan_set_quota(self, path, ns_quota=None, ds_quota=None, *,
                       now_ns: int):
        """Set (or with -1 clear) a folder's name and/or space quota; None leaves one as it
        is (HDFS setQuota(path, nsQuota, dsQuota) with QUOTA_DONT_SET). A ``SetQuota`` op,
        or None when nothing changes."""
        parts, ino, inode, _ = self._view.resolve(path)
        canonical = paths.join_parts(parts)
        if inode.type != DIR:
            raise InvalidArgument(f"setQuota {canonical}: quotas can only be set on a "
                                  f"directory")
        old = inode.quota or Quota(NO_QUOTA, NO_QUOTA, 0, 0)
        ns = old.ns if ns_quota is None else check_quota_value(ns_quota,
                                                               f"setQuota {canonical}")
        ds = old.ds if ds_quota is None else check_quota_value(ds_quota,
                                                               f"setSpaceQuota {canonical}")
        if ns == old.ns and ds == old.ds:
            return None
        usage = None
        if inode.quota is None and (ns != NO_QUOTA or ds != NO_QUOTA):
            usage = list(self.subtree_usage(ino, inode))
        return SetQuota(ino=ino, ns=ns, ds=ds, usage=usage, time=now_ns)
