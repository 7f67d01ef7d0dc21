"""The trash (HDFS ``TrashPolicyDefault``): what ``leasefs rm`` does instead of deleting.

A removed path moves to ``/user/<name>/.Trash/Current/<its original path>``, where it can be
moved back; a name taken there gets the time in milliseconds appended (as HDFS does). At each
checkpoint interval ``Current`` is renamed to a checkpoint named after the time
(``yyMMddHHmmss``, UTC), and checkpoints older than ``trash_interval`` are deleted: by the
metadata server's emptier (``meta/services/monitors.py``, every ``trash_checkpoint_interval``) and by
``leasefs expunge``. Paths already in a trash are deleted at once, and a path that contains
its user's trash is refused (it cannot move into itself). The client API's ``delete`` stays
a delete, and so do deletes through the FUSE mount, as HDFS's shell is the only one to use
its trash.

Concurrency contract: the pure functions need nothing; ``move_to_trash`` and ``expunge`` are
coroutines of the caller's ``AsyncClient`` (its trio thread), and ``empty`` takes the
metadata server's own calls.
"""

from __future__ import annotations

import calendar
import time

from . import paths
from .errors import FileExists, FileNotFound, InvalidArgument, LeaseFSError

TRASH = ".Trash"
CURRENT = "Current"
CHECKPOINT_FORMAT = "%y%m%d%H%M%S"
CHECKPOINT_DIGITS = 12


def trash_root(user: str) -> str:
    return paths.join_parts(["user", user, TRASH])


def in_trash(path: str) -> bool:
    """Whether ``path`` is inside some user's trash (``/user/<name>/.Trash/...``)."""
    parts = paths.split(path)
    return len(parts) >= 3 and parts[0] == "user" and parts[2] == TRASH


def contains_trash(path: str, user: str) -> bool:
    """Whether deleting ``path`` would delete ``user``'s trash (an ancestor or the trash)."""
    root = paths.split(trash_root(user))
    parts = paths.split(path)
    return root[:len(parts)] == parts


def checkpoint_name(now: float) -> str:
    return time.strftime(CHECKPOINT_FORMAT, time.gmtime(now))


def checkpoint_time(name: str) -> float | None:
    """The time a checkpoint was made (None: not a checkpoint's name)."""
    if len(name) != CHECKPOINT_DIGITS or not name.isdigit():
        return None
    try:
        return float(calendar.timegm(time.strptime(name, CHECKPOINT_FORMAT)))
    except ValueError:
        return None


def expired(names, now: float, interval_seconds: float) -> list[str]:
    """The checkpoints among ``names`` made more than ``interval_seconds`` before ``now``."""
    out = []
    for name in names:
        made = checkpoint_time(name)
        if made is not None and now - made >= interval_seconds:
            out.append(name)
    return out


async def move_to_trash(client, path: str, now: float | None = None) -> str | None:
    """Move ``path`` into the caller's trash; its path there, or None when ``path`` is
    already in a trash (the caller deletes it then). ``InvalidArgument`` for a path that
    contains the trash; other errors (a missing path, no permission to make the trash) as
    the calls raise them."""
    path = paths.validate(path)
    if path == paths.ROOT:
        raise InvalidArgument("cannot move the root folder to the trash")
    if in_trash(path):
        return None
    if contains_trash(path, client.user):
        raise InvalidArgument(f"cannot move {path} to the trash, as it contains the trash "
                              f"({trash_root(client.user)})")
    await client.get_file_status(path)        # a missing path: FileNotFound, nothing made
    target = paths.join_parts([*paths.split(trash_root(client.user)), CURRENT,
                               *paths.split(path)])
    # the trash folders are the user's alone (HDFS: 0700)
    await client.mkdirs(paths.parent(target), permission=0o700)
    try:
        await client.rename(path, target)
    except FileExists:
        now = time.time() if now is None else now
        target = f"{target}{int(now * 1000)}"
        await client.rename(path, target)
    return target


async def checkpoint(client, root: str, now: float) -> str | None:
    """Rename ``root/Current`` to a checkpoint named after ``now``; its name, or None when
    there is no Current. ``client``: anything with ``rename(src, dst)`` (an
    ``AsyncClient``, or the emptier's server calls)."""
    name = checkpoint_name(now)
    try:
        await client.rename(paths.join(root, CURRENT), paths.join(root, name))
    except FileNotFound:
        return None
    except FileExists:       # one made this second already: add to it next time
        return None
    return name


async def expunge(client, interval_seconds: float, *, immediate: bool = False,
                  now: float | None = None) -> dict:
    """HDFS ``-expunge`` of the caller's trash: checkpoint ``Current``, delete checkpoints
    older than ``interval_seconds`` (all of the trash with ``immediate``)."""
    now = time.time() if now is None else now
    root = trash_root(client.user)
    if not await client.exists(root):
        return {"checkpoint": None, "deleted": []}
    made = await checkpoint(client, root, now)
    names = [st.name for st in await client.list_status(root)]
    gone = names if immediate else expired(names, now, interval_seconds)
    for name in gone:
        try:
            await client.delete(paths.join(root, name), recursive=True)
        except FileNotFound:
            pass
    return {"checkpoint": made, "deleted": gone}


async def empty(server_calls, interval_seconds: float, now: float, log) -> int:
    """The metadata server's emptier pass over every user's trash (HDFS ``Trash.Emptier``):
    checkpoint each ``Current``, delete expired checkpoints. ``server_calls`` has ``exists``,
    ``list``, ``rename``, ``delete`` (the server's own handlers, as the superuser). Returns
    the checkpoints deleted."""
    deleted = 0
    if not await server_calls.exists("/user"):
        return 0
    for user in await server_calls.list("/user"):
        root = trash_root(user)
        try:
            if not await server_calls.exists(root):
                continue
            await checkpoint(server_calls, root, now)
            for name in expired(await server_calls.list(root), now, interval_seconds):
                await server_calls.delete(paths.join(root, name))
                deleted += 1
        except LeaseFSError as exc:
            log.warning("trash of %s: %s", user, exc)
    return deleted


__all__ = ["TRASH", "CURRENT", "trash_root", "in_trash", "contains_trash", "checkpoint_name",
           "checkpoint_time", "expired", "move_to_trash", "checkpoint", "expunge", "empty"]
