"""``plan_concat``: HDFS ``concat TARGET SRC...``: the blocks of the sources move to the end
of the target, in order, without copying a byte; the sources are deleted; all of it in one
CONCAT record.

HDFS's preconditions (FSDirConcatOp), kept: at least one source; the target and every
source are closed, non-empty files (no inline data: their bytes must be in blocks) in the
same folder; no source twice and none the target; every source has the target's block
size; every block is full except the last source's last (a read finds a byte's block by
``offset // block_size``). The sources take the target's replication (quota charged for
the difference, as HDFS); the names quota gains the sources' count.

Why it exists: one more planner, apart from ``plan`` (which is near its size limit).
``ConcatPlanner`` is a part of ``meta.namespace.namespace.Namespace``; the applier is
``meta.journal.ops_namespace.Concat``. Concurrency contract: that of the planners: reads only,
under the caller's write locks on the target and the sources; trio thread, no awaits.
"""

from __future__ import annotations

from fs import paths
from fs.errors import InvalidArgument

from ..schema.inode import FILE, Inode
from ..journal.charge import file_charge
from .quota import QuotaPlanner
from .view import NamespaceView
from ..journal.ops_namespace import Concat

MAX_CONCAT_SOURCES = 1000


class ConcatPlanner:
    """``plan_concat``, deciding from ``view`` with the space quota check of ``quota``."""

    def __init__(self, view: NamespaceView, quota: QuotaPlanner):
        self._view = view
        self._quota = quota

    def _concat_file(self, what: str, path: str, inode: Inode, role: str) -> None:
        if inode.type != FILE:
            raise InvalidArgument(f"{what}: {role} {path} is not a file")
        if inode.uc:
            raise InvalidArgument(f"{what}: {role} {path} is under construction")
        if not inode.length or inode.inline is not None or not inode.nblocks:
            raise InvalidArgument(f"{what}: {role} {path} is empty or its data is not in "
                                  f"blocks")

    def _full_blocks(self, what: str, path: str, ino: int, inode: Inode) -> None:
        bs = inode.block_size
        if inode.length != inode.nblocks * bs:
            last = self._view.tail_blocks(ino, inode, 1)[-1]
            raise InvalidArgument(f"{what}: the last block in {path} is not full; last block "
                                  f"size = {last['num_bytes']}, preferred block size = {bs}")

    def plan_concat(self, target, srcs, *, now_ns: int) -> Concat:
        t_parts = paths.split(target)
        t_path = paths.join_parts(t_parts)
        what = f"concat {t_path}"
        if not isinstance(srcs, (list, tuple)) or not srcs:
            raise InvalidArgument(f"{what}: no source files")
        if len(srcs) > MAX_CONCAT_SOURCES:
            raise InvalidArgument(f"{what}: more than {MAX_CONCAT_SOURCES} source files")
        _, t_ino, t_inode, t_found = self._view.resolve(t_path)
        self._concat_file(what, t_path, t_inode, "target")
        self._full_blocks(what, t_path, t_ino, t_inode)
        parent = t_found[-2][0]
        rep = t_inode.replication or 1
        seen = {t_ino}
        sources = []
        extra_space = 0
        for i, src in enumerate(srcs):
            s_parts = paths.split(src)
            s_path = paths.join_parts(s_parts)
            _, s_ino, s_inode, s_found = self._view.resolve(s_path)
            if s_ino == t_ino:
                raise InvalidArgument(f"{what}: the src file {s_path} is the same with the "
                                      f"target file")
            if s_ino in seen:
                raise InvalidArgument(f"{what}: the src file {s_path} is given twice")
            seen.add(s_ino)
            if s_found[-2][0] != parent:
                raise InvalidArgument(f"{what}: all sources must be in the same directory "
                                      f"as the target; {s_path} is not")
            self._concat_file(what, s_path, s_inode, "source")
            if s_inode.block_size != t_inode.block_size:
                raise InvalidArgument(
                    f"{what}: source file {s_path} has preferred block size "
                    f"{s_inode.block_size} which is different from the target file's "
                    f"preferred block size {t_inode.block_size}")
            if i != len(srcs) - 1:
                self._full_blocks(what, s_path, s_ino, s_inode)
            extra_space += s_inode.length * rep - file_charge(self._view.read, s_ino,
                                                                 s_inode)
            sources.append({"ino": s_ino, "name": s_parts[-1]})
        self._quota.check_quota(parent, 0, extra_space)
        return Concat(target=t_ino, parent=parent, srcs=sources, time=now_ns)
