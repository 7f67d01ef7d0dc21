"""Planning of ``rename`` (HDFS rename2, with overwrite) and ``rename_many`` (several moves
in one RENAMES record, visible at once: a job commit).

Why it exists: a rename reads two paths and, for ``rename_many``, the interplay of many
moves planned against one state (a move may free the destination of a later one); that
validation is a job of its own. ``RenamePlanner`` is a part of
``meta.namespace.namespace.Namespace``: it reads through the ``NamespaceView``, checks the
destination's parent with ``NamespacePlanner.check_parent_dir``, the quotas with the
``QuotaPlanner`` and asks ``ReclaimPlanner.needs_detach`` about an overwritten subtree.

Purity / concurrency contract: never writes the store or any state; raises a
``LeaseFSError`` naming the paths, or returns the record. Under the caller's path locks,
trio thread, no awaits.
"""

from __future__ import annotations

from fs import paths
from fs.errors import DirectoryNotEmpty, FileExists, FileNotFound, InvalidArgument, \
    IsDirectory, NotDirectory

from .args import MAX_RENAMES, check_bool
from .plan import NamespacePlanner
from .quota import QuotaPlanner
from .reclaim import ReclaimPlanner
from .view import NamespaceView
from ..journal.ops_namespace import Rename, Renames
from ..schema.inode import DIR


class RenamePlanner:
    """``plan_rename`` and ``plan_rename_many``, deciding from ``view``, with the quota
    checks of ``quota`` and the detach decisions of ``reclaim``."""

    def __init__(self, view: NamespaceView, quota: QuotaPlanner, reclaim: ReclaimPlanner):
        self._view = view
        self._quota = quota
        self._reclaim = reclaim

    def plan_rename(self, src, dst, overwrite=False, *, now_ns: int) -> Rename | None:
        src_parts, dst_parts = paths.split(src), paths.split(dst)
        check_bool(overwrite, f"rename {paths.join_parts(src_parts)} to "
                              f"{paths.join_parts(dst_parts)}: overwrite")
        return self._plan_one_rename(src_parts, dst_parts, overwrite, now_ns)

    def _plan_one_rename(self, src_parts, dst_parts, overwrite: bool, now_ns: int,
                         vacated=frozenset()) -> Rename | None:
        """The RENAME of one move; ``vacated`` holds paths an earlier move of the same
        RENAMES record takes away (a destination there is free by then)."""
        s, d = paths.join_parts(src_parts), paths.join_parts(dst_parts)
        what = f"rename {s} to {d}"
        if not src_parts:
            raise InvalidArgument(f"{what}: cannot rename the root directory")
        _, ino, inode, src_found = self._view.resolve(s)
        if s == d:
            return None
        if not dst_parts:
            raise InvalidArgument(f"{what}: cannot rename onto the root directory")
        if paths.is_ancestor(s, d):
            raise InvalidArgument(f"{what}: cannot move a directory into itself")
        dst_found = self._view.walk(dst_parts, d)
        overwrite_ino = None
        detach = False
        if len(dst_found) == len(dst_parts) + 1 and d in vacated:
            dst_parent = dst_found[-2][0]
        elif len(dst_found) == len(dst_parts) + 1:
            dst_ino, dst_inode = dst_found[-1]
            if not overwrite:
                raise FileExists(f"{what}: destination exists")
            if inode.type == DIR and dst_inode.type != DIR:
                raise NotDirectory(f"{what}: cannot overwrite non-directory {d} with a directory")
            if inode.type != DIR and dst_inode.type == DIR:
                raise IsDirectory(f"{what}: cannot overwrite directory {d} with a non-directory")
            if dst_inode.type == DIR and (dst_inode.children or 0):
                raise DirectoryNotEmpty(f"{what}: destination directory is not empty")
            overwrite_ino = dst_ino
            detach = self._reclaim.needs_detach(dst_ino, dst_inode)
            dst_parent = dst_found[-2][0]
        else:
            if len(dst_found) < len(dst_parts):
                raise FileNotFound(f"{what}: destination parent "
                                   f"{paths.join_parts(dst_parts[:-1])} does not exist")
            NamespacePlanner.check_parent_dir(d, dst_found)
            dst_parent = dst_found[-1][0]
        src_parent = src_found[-2][0]
        usage, shared = self._quota.moved_usage(ino, inode, src_parent, dst_parent)
        if usage:   # quota folders above both sides keep their usage: HDFS skips them too
            self._quota.check_quota(dst_parent, usage[0], usage[1], exclude=shared)
        overwritten = None if overwrite_ino is None else \
            self._quota.detached_usage(dst_parent, overwrite_ino, dst_found[-1][1], detach)
        return Rename(src_parent=src_parent, src_name=src_parts[-1], dst_parent=dst_parent,
                      dst_name=dst_parts[-1], ino=ino, overwrite=overwrite_ino, detach=detach,
                      time=now_ns, usage=usage, overwritten_usage=overwritten)

    @staticmethod
    def check_moves(moves, overwrite=False) -> list[tuple[list[str], list[str], bool]]:
        """Validate the shape of a ``rename_many`` request: a list of ``[src, dst]`` or
        ``[src, dst, overwrite]``; returns (src parts, dst parts, overwrite) triples."""
        check_bool(overwrite, "rename_many: overwrite")
        if not isinstance(moves, (list, tuple)) or not moves:
            raise InvalidArgument("rename_many: moves must be a non-empty list of [src, dst]")
        if len(moves) > MAX_RENAMES:
            raise InvalidArgument(f"rename_many: {len(moves)} moves, at most {MAX_RENAMES} "
                                  "in one call")
        out = []
        for i, move in enumerate(moves):
            if (not isinstance(move, (list, tuple)) or len(move) not in (2, 3)
                    or not all(isinstance(p, str) for p in move[:2])):
                raise InvalidArgument(f"rename_many: move {i} must be [src, dst] or "
                                      "[src, dst, overwrite]")
            own = overwrite if len(move) == 2 else check_bool(
                move[2], f"rename_many: move {i} overwrite")
            out.append((paths.split(move[0]), paths.split(move[1]), own))
        return out

    def plan_rename_many(self, moves, overwrite=False, *, now_ns: int) -> Renames | None:
        """One RENAMES record applying every move in order, so the set becomes visible at
        once (a job commit). Moves may free a destination for a later move (old output into
        a trash folder, new output in its place); what would make planning against the
        current state wrong is refused: a path given twice as source or as destination, a
        moved path or a destination above another path of the request, a destination that
        a later move takes away."""
        triples = self.check_moves(moves, overwrite)
        sources = [paths.join_parts(s) for s, _, _ in triples]
        targets = [paths.join_parts(d) for _, d, _ in triples]
        for kind, names in (("source", sources), ("destination", targets)):
            seen = set()
            for name in names:
                if name in seen:
                    raise InvalidArgument(f"rename_many: {name} is a {kind} twice")
                seen.add(name)
        source_set, target_set = set(sources), set(targets)
        for name in sources + targets:
            parts = paths.split(name)
            for depth in range(1, len(parts)):
                above = paths.join_parts(parts[:depth])
                if above in source_set:
                    raise InvalidArgument(f"rename_many: {above} is moved and {name} is "
                                          "below it")
                if above in target_set:   # planned against the inode the move replaces
                    raise InvalidArgument(f"rename_many: {above} is a destination and "
                                          f"{name} is below it")
        vacated: set[str] = set()
        planned = []
        # the moves land together: each one's quota check counts the earlier ones' usage
        self._quota.begin_pending()
        try:
            for (src_parts, dst_parts, own), s, d in zip(triples, sources, targets):
                if d in source_set and d not in vacated:
                    raise InvalidArgument(f"rename_many: {d} is a destination before it is "
                                          f"moved")
                one = self._plan_one_rename(src_parts, dst_parts, own, now_ns,
                                            frozenset(vacated))
                vacated.add(s)
                if one is not None:
                    planned.append(one)
                    if one.usage:
                        self._quota.pend_usage(one.src_parent, one.dst_parent, one.usage)
        finally:
            self._quota.end_pending()
        if not planned:
            return None
        return Renames(renames=tuple(planned), time=now_ns)
