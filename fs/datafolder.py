"""A server's data folder is its owner's alone (HDFS: ``dfs.datanode.data.dir.perm`` 700).

Why: replica files, the edit journal (inline small files, every name) and the LevelDB store
hold what the namespace's permissions guard; readable by every local user, a 0600 file's
bytes could be read straight off the disk. So:

* a server process creates everything with umask 077 (``private_umask``): LevelDB makes its
  own files and takes no mode, so the process's umask is the only way to reach them;
* the files a server writes itself are opened 0600 (``FILE_MODE``) and its folders made 0700
  (``FOLDER_MODE``), so a server run inside another process (tests) is private too;
* a start refuses a data folder that exists with any group or other bit set, naming the
  fix (``chmod 700 DIR``); nothing below a 0700 folder is reachable by other users, so the
  top folder is the one checked (as HDFS does), and a server never changes a mode the
  operator chose.

Concurrency contract: plain functions on the file system, called before a server serves.
"""

from __future__ import annotations

import os
import stat

from .errors import LeaseFSError, NotDirectory

FOLDER_MODE = 0o700
FILE_MODE = 0o600
SERVER_UMASK = 0o077


class OpenDataFolder(LeaseFSError):
    """A server's data folder other users may read or enter."""


def private_umask() -> int:
    """Files and folders this process creates from now on are its user's alone (a server
    process's first step). Returns the umask it replaced, for a caller that gives it back
    (a one-off command run inside another program)."""
    return os.umask(SERVER_UMASK)


def make_private_folder(path: str) -> None:
    """``path`` and each missing folder above it made mode 0700 whatever the umask (a
    server's store or journal may make its data folder); existing ones are left as they
    are."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        make_private_folder(parent)
    try:
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        return
    os.chmod(path, FOLDER_MODE)   # mkdir's mode went through the umask


def open_data_folder(path: str, what: str) -> None:
    """Create the data folder ``path`` (``what``: whose, for the message) 0700, or check an
    existing one: ``OpenDataFolder`` when a group or other permission bit is set."""
    make_private_folder(path)
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotDirectory(f"{what} {path}: not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise OpenDataFolder(f"{what} {path} is open to other users (mode {mode:04o}), who "
                             f"could read its files; make it its owner's alone: "
                             f"chmod 700 {path}")


__all__ = ["FOLDER_MODE", "FILE_MODE", "SERVER_UMASK", "OpenDataFolder", "private_umask",
           "make_private_folder", "open_data_folder"]
