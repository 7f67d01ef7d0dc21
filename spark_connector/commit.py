"""The commit protocol of ``df.write.format("leasefs")`` (Hadoop FileOutputCommitter, shaped
for Spark's Python data source API) and the per-batch commit of the streaming sink.

Why: Spark runs write tasks in worker processes, may fail or abort them, and then calls
``commit(messages)`` or ``abort(messages)`` once in a driver-side Python process. Readers must
never see a task's partial output, and a rerun of a failed job must give exactly one copy.

Layout under the target folder ``T``::

    T/_temporary/<job>/<attempt>/part-<partition>-<job>-c000.<ext>  a task attempt's file
                                                  (leased while written, then closed)
    T/_temporary/<job>/<attempt>/k=v/.../part-...-c000.<ext>   partitionBy: per folder
    T/_temporary/<job>/_publish/k=v/...                        partitioned: assembled tree
    T/_temporary/<job>/_trash/...                              overwrite: the old files
    T/_SUCCESS                                                 written last by commit
    T/_batches/<batch id>                                      streaming: batch committed

- Task (``write_task_file``): creates its file under its own attempt folder, so two attempts
  of one partition never share a name; the lease is held while writing; on an exception the
  file is given up and the attempt folder removed. The commit message names the files.
- Job commit (``commit_job``): ONE ``rename_many`` call (one journal record on the
  metadata server, so a reader sees all of it or none of it) that, for overwrite, first
  moves every visible entry of ``T`` into the job's ``_trash``, then moves exactly the
  files the messages name into ``T`` and a ``_SUCCESS`` written beforehand in the job
  folder; then ``_temporary/<job>`` (trash included) is removed. Files of attempts that no
  message names (a retried or speculative attempt) are never published.
- Abort (``abort_job``): removes ``_temporary/<job>``. A task still running at that moment
  may recreate its attempt folder; ``cleanup_stale`` (run when every write job starts)
  removes job folders whose newest entry is older than ``staleStagingSeconds`` (default
  3600) and whose open files (if any) belong to writers that stopped renewing their lease
  for that long (a killed task).
- Partitioned jobs (``_publishing_moves``): the named files are first assembled into one
  tree under the job folder (invisible), which then merges into ``T`` in the same single
  ``rename_many``: a partition folder ``T`` lacks moves in whole, one it has is merged into,
  and with dynamic overwrite a written folder replaces the old one (moved to the trash).
- Streaming (``commit_batch``): files get names derived from the batch id and partition;
  they and the batch marker ``_batches/<id>`` move in one ``rename_many`` whose marker move
  refuses an existing marker, so a replayed batch id never duplicates output. The sink's
  job folder (``stream-*``) is created by its tasks and removed after every batch
  (``end_batch``), so a stopped query leaves nothing; an empty ``stream-*`` folder of
  another query is removed by the next job start at once (``cleanup_stale``).

Publishing is atomic (unlike Hadoop's FileOutputCommitter, whose job commit renames file by
file): a concurrent lister of ``T`` sees the old set or the new set, never a mix, never a
file still being written or one that a failed attempt wrote. The listing of old entries for
overwrite is taken just before the call: a file another writer adds to ``T`` in between is
kept.

Concurrency contract: blocking code on one ``fs.Client``; the task side runs in many worker
processes at once, each on its own attempt folder; the job side runs once per job.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
import uuid
from dataclasses import dataclass

from fs.errors import FileExists, FileNotFound, InvalidArgument, LeaseFSError, NotDirectory

from .location import is_hidden

log = logging.getLogger(__name__)

TEMPORARY = "_temporary"
SUCCESS = "_SUCCESS"
BATCHES = "_batches"
TRASH = "_trash"
DEFAULT_STALE_SECONDS = 3600.0
STREAM_PREFIX = "stream-"
PUBLISH = "_publish"
MAX_MOVES = 10000          # rename_many takes at most this many moves


@dataclass
class StagedFile:
    staged: str            # full path under _temporary
    final_name: str        # name inside the target folder
    rows: int = 0
    partition: int = 0
    counter: int = 0       # partitioned writes: the task's n-th file of one partition folder


@dataclass
class JobPaths:
    target: str
    job: str

    @property
    def temporary(self) -> str:
        return posixpath.join(self.target, TEMPORARY)

    @property
    def job_dir(self) -> str:
        return posixpath.join(self.target, TEMPORARY, self.job)

    def attempt_dir(self, attempt: str) -> str:
        return posixpath.join(self.job_dir, attempt)


def new_job_id() -> str:
    return str(uuid.uuid4())         # as Spark's: part-00000-<uuid>-c000.<ext>


def _delete_quietly(client, path: str) -> bool:
    try:
        return client.delete(path, recursive=True)
    except (FileNotFound, NotDirectory):
        return False


def open_task_file(client, paths: JobPaths, attempt: str, name: str):
    """Create ``attempt``'s file ``name`` (a relative path: partitioned writes put it in its
    ``k=v`` folders) under the lease of this process; returns ``(staged path, stream)``.
    Refused when the job folder is gone (the job was aborted), except for a streaming
    sink (``stream-*``), whose tasks create it: the sink removes it after every batch."""
    if not paths.job.startswith(STREAM_PREFIX):
        try:
            client.get_file_status(paths.job_dir)
        except FileNotFound:
            raise LeaseFSError(f"{paths.job_dir}: the write job was aborted") from None
    staged = posixpath.join(paths.attempt_dir(attempt), name)
    return staged, client.create(staged, overwrite=True)


def close_task_file(client, staged: str, stream, name: str, rows: int, *,
                    keep_empty: bool = False) -> StagedFile | None:
    """Close a task file; one without rows is removed (no message names it) unless
    ``keep_empty`` (the schema-only file of a write without rows)."""
    stream.close()
    if not rows and not keep_empty:
        _delete_quietly(client, staged)
        return None
    return StagedFile(staged, name, rows)


def give_up_attempt(client, paths: JobPaths, attempt: str, streams=()) -> None:
    """A failed task: give up its open files and remove its attempt folder."""
    attempt_dir = paths.attempt_dir(attempt)
    try:
        for stream in streams:
            try:
                stream.abort()
            except LeaseFSError as exc:
                log.warning("%s: could not give up a file: %s", attempt_dir, exc)
    finally:
        try:
            _delete_quietly(client, attempt_dir)
        except LeaseFSError as exc:
            log.warning("%s: could not remove the failed attempt: %s", attempt_dir, exc)


def write_task_file(client, paths: JobPaths, attempt: str, name: str,
                    write_body, *, keep_empty: bool = False) -> StagedFile | None:
    """Create ``attempt``'s file ``name``, let ``write_body(stream)`` fill it (returns the row
    count), close it (``keep_empty``: even without rows). An exception gives the file up
    and removes the attempt folder."""
    staged, stream = open_task_file(client, paths, attempt, name)
    try:
        rows = write_body(stream)
    except BaseException:
        give_up_attempt(client, paths, attempt, [stream])
        raise
    done = close_task_file(client, staged, stream, name, rows, keep_empty=keep_empty)
    if done is None:
        _remove_if_empty(client, paths.attempt_dir(attempt))
    return done


def start_job(client, paths: JobPaths, stale_seconds: float, *,
              create: bool = True) -> None:
    """Called on the driver before any task: clean stale staging, create the job folder
    (``create=False``: a streaming sink, whose tasks create it)."""
    cleanup_stale(client, paths.target, stale_seconds, keep=paths.job)
    if create:
        client.mkdirs(paths.job_dir)


def _subtree(client, path: str) -> tuple[int, bool]:
    """Newest mtime (ns) in a subtree, and whether it holds any file."""
    newest, has_files = 0, False
    stack = [path]
    while stack:
        for st in client.iter_status(stack.pop()):
            newest = max(newest, st.mtime_ns)
            if st.is_dir:
                stack.append(st.path)
            else:
                has_files = True
    return newest, has_files


def _live_writer(client, path: str, stale_seconds: float) -> bool:
    """Is a file below ``path`` open by a writer whose lease was renewed recently? (A
    killed task's lease stops being renewed; a live one is renewed every soft limit / 2.)"""
    try:
        open_files = client.list_open_files(path)
    except LeaseFSError:
        return False
    return any(float(f.get("last_renewal_age") or 0) < stale_seconds for f in open_files)


def cleanup_stale(client, target: str, stale_seconds: float, keep: str | None = None) -> list[str]:
    """Remove ``target/_temporary/<job>`` folders of jobs that are over, then
    ``_temporary`` itself when empty. A job is over when:

    1. nothing in its folder is newer than ``stale_seconds`` and no file in it is open by a
       writer that renewed its lease within that time (a killed job), or
    2. it is a streaming sink's folder (``stream-*``) with no file in it at all: a running
       sink's folder holds its batch's files from the first task's create until the batch
       commit removes the folder, so an empty one belongs to a query that stopped.

    A batch job's folder is created empty before its tasks start, so rule 2 is for stream
    folders only. Returns the removed folders."""
    temporary = posixpath.join(target, TEMPORARY)
    try:
        jobs = client.list_status(temporary)
    except (FileNotFound, NotDirectory):
        return []
    removed = []
    now_ns = time.time_ns()
    for job in jobs:
        if job.name == keep:
            continue
        newest, has_files = _subtree(client, job.path) if job.is_dir else (0, True)
        newest = max(job.mtime_ns, newest)
        idle_stream = job.name.startswith(STREAM_PREFIX) and not has_files
        if not idle_stream and (now_ns - newest < stale_seconds * 1e9
                                or _live_writer(client, job.path, stale_seconds)):
            continue
        if idle_stream and _live_writer(client, job.path, stale_seconds):
            continue
        if _delete_quietly(client, job.path):
            log.info("removed stale staging folder %s", job.path)
            removed.append(job.path)
    _remove_if_empty(client, temporary)
    return removed


def _remove_if_empty(client, path: str) -> None:
    try:
        if not client.list_status(path):
            client.delete(path)
    except LeaseFSError:
        pass   # a concurrent job created something inside, or it is gone already


def _staged(messages) -> list[StagedFile]:
    out = []
    for m in messages or []:
        for f in getattr(m, "files", None) or []:
            out.append(f)
    return out


def _assemble(client, root: str, files: list[StagedFile]) -> None:
    """Move partitioned task files into ``root/<k=v/...>/<name>`` (still under
    ``_temporary``, so invisible; several calls are fine): one tree the publishing step can
    move by whole folders."""
    for folder in sorted({posixpath.dirname(f.final_name) for f in files}):
        client.mkdirs(posixpath.join(root, folder))
    moves = [(f.staged, posixpath.join(root, f.final_name), True) for f in files]
    for i in range(0, len(moves), MAX_MOVES):
        client.rename_many(moves[i:i + MAX_MOVES])


def _merge_moves(client, src: str, dst: str, rel: str, replace: set, trash: str, moves: list,
                 emptied: bool = False) -> None:
    """Append the moves that put the tree ``src`` into ``dst``: a folder ``dst`` lacks moves
    whole; one it has is merged into, unless its relative path is in ``replace`` (dynamic
    overwrite), then the old one moves to ``trash`` and the new one in, in the same call.
    ``emptied``: every entry of ``dst`` moves to the trash earlier in the call."""
    existing = {} if emptied else {st.name: st for st in _list_or_empty(client, dst)}
    for entry in client.list_status(src):
        rel_name = posixpath.join(rel, entry.name) if rel else entry.name
        target = posixpath.join(dst, entry.name)
        old = existing.get(entry.name)
        if old is not None and entry.is_dir and old.is_dir and rel_name not in replace:
            _merge_moves(client, entry.path, target, rel_name, replace, trash, moves)
            continue
        if old is not None and (old.is_dir or entry.is_dir):
            moves.append((old.path, posixpath.join(trash, f"{len(moves)}-{entry.name}")))
        moves.append((entry.path, target, not entry.is_dir))


def _list_or_empty(client, path: str) -> list:
    try:
        return client.list_status(path)
    except (FileNotFound, NotDirectory):
        return []


def _publishing_moves(client, paths: JobPaths, files: list[StagedFile], moves: list, *,
                      publish: str = PUBLISH, dynamic: bool = False,
                      emptied: bool = False) -> list[str]:
    """Append the moves of ``files`` into the target to ``moves``; returns the published
    paths. Files named ``k=v/.../name`` (partitioned writes) are first assembled into one
    tree under the job folder (``_assemble``), which then merges into the target by whole
    folders (``_merge_moves``): a new partition folder appears with all its files in the
    same step. ``dynamic``: the partition folders written replace the old ones."""
    published = []
    flat = sorted((f for f in files if "/" not in f.final_name), key=lambda f: f.final_name)
    for f in flat:
        final = posixpath.join(paths.target, f.final_name)
        moves.append((f.staged, final, True))
        published.append(final)
    nested = [f for f in files if "/" in f.final_name]
    if nested:
        root = posixpath.join(paths.job_dir, publish)
        _assemble(client, root, nested)
        replace = {posixpath.dirname(f.final_name) for f in nested} if dynamic else set()
        trash = posixpath.join(paths.job_dir, TRASH)
        if replace:
            client.mkdirs(trash)
        _merge_moves(client, root, paths.target, "", replace, trash, moves, emptied)
        published += sorted(posixpath.join(paths.target, f.final_name) for f in nested)
    if len(moves) > MAX_MOVES:
        raise InvalidArgument(f"{paths.target}: the commit of job {paths.job} needs "
                              f"{len(moves)} moves, more than one atomic step takes "
                              f"({MAX_MOVES}); write fewer files per job")
    return published


def commit_job(client, paths: JobPaths, messages, overwrite: bool, *,
               dynamic: bool = False) -> list[str]:
    """Publish exactly the files the commit messages name, ``_SUCCESS`` with them, as ONE
    ``rename_many`` (overwrite: the old entries move into the job's trash in the same
    step; ``dynamic``: only the partition folders written are replaced). Returns the
    published paths."""
    files = _staged(messages)
    client.mkdirs(paths.target)
    moves = []
    static = overwrite and not dynamic
    if static:
        trash = posixpath.join(paths.job_dir, TRASH)
        client.mkdirs(trash)
        for st in client.list_status(paths.target):
            if st.name == TEMPORARY:
                continue
            if is_hidden(st.name) and st.name not in (SUCCESS, BATCHES):
                continue
            moves.append((st.path, posixpath.join(trash, st.name)))
    published = _publishing_moves(client, paths, files, moves, dynamic=overwrite and dynamic,
                                  emptied=static)
    summary = {"job": paths.job,
               "files": [posixpath.relpath(p, paths.target) for p in published],
               "rows": sum(f.rows for f in files), "time_ns": time.time_ns()}
    staged_success = posixpath.join(paths.job_dir, SUCCESS)
    client.write_file(staged_success, json.dumps(summary).encode(), overwrite=True)
    moves.append((staged_success, posixpath.join(paths.target, SUCCESS), True))
    client.rename_many(moves)
    _delete_quietly(client, paths.job_dir)
    _remove_if_empty(client, paths.temporary)
    log.info("job %s committed %d files into %s", paths.job, len(published), paths.target)
    return published


def abort_job(client, paths: JobPaths) -> None:
    """Remove the job's staging folder (running tasks' leftovers: ``cleanup_stale``)."""
    _delete_quietly(client, paths.job_dir)
    _remove_if_empty(client, paths.temporary)
    log.info("job %s aborted, staging removed from %s", paths.job, paths.target)


def batch_marker(target: str, batch_id: int) -> str:
    return posixpath.join(target, BATCHES, str(int(batch_id)))


def commit_batch(client, paths: JobPaths, messages, batch_id: int) -> list[str]:
    """Streaming sink: publish one micro-batch once, whatever the replays. The files and
    the batch marker move in ONE ``rename_many``; the marker's move refuses an existing
    marker, so a replayed batch id publishes nothing."""
    files = _staged(messages)
    marker = batch_marker(paths.target, batch_id)
    if client.exists(marker):
        log.info("batch %d already committed in %s: replay ignored", batch_id, paths.target)
        end_batch(client, paths)
        return []
    moves: list = []
    published = _publishing_moves(client, paths, files, moves,
                                  publish=f"{PUBLISH}-{int(batch_id)}")
    staged_marker = posixpath.join(paths.job_dir, f"{BATCHES}-{int(batch_id)}")
    client.write_file(staged_marker, json.dumps({"files": [posixpath.relpath(p, paths.target)
                                                           for p in published]}).encode(),
                      overwrite=True)
    client.mkdirs(posixpath.dirname(marker))
    moves.append((staged_marker, marker, False))
    try:
        client.rename_many(moves)
    except FileExists:
        log.info("batch %d was committed concurrently in %s: replay ignored", batch_id,
                 paths.target)
        published = []
    end_batch(client, paths)
    return published


def end_batch(client, paths: JobPaths) -> None:
    """After a streaming batch's commit or abort: remove the sink's job folder (its tasks
    recreate it for the next batch) and ``_temporary`` when empty, so a query that stops
    leaves no staging behind."""
    _delete_quietly(client, paths.job_dir)
    _remove_if_empty(client, paths.temporary)
