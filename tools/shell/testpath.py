"""``leasefs test -e|-d|-f|-s|-z|-w|-r PATH``: answer a question about a path with the exit
status only (0 yes, 1 no), as ``hdfs dfs -test``.

Why a module of its own: unlike every other shell command, "no" is not an error here — a
missing path is a silent 1 — while a real failure (unreachable cluster, permission denied
on the way) still prints its one line.

``-r``/``-w`` compare the path's mode bits with the client's user and groups as the
metadata server does (meta/permissions.permits; the server has no access-check call): the
owner's bits for the owner, else the group's bits for a member, else the others' bits. The
superuser (and a server with permission checks off) can do more than this answer says.

Concurrency contract: synchronous, the CLI's main thread; one status call.
"""

from __future__ import annotations

from fs.errors import FileNotFound, LeaseFSError

from ..common import Command, command_parser
from .core import user_path

READ, WRITE = 4, 2


def permits(user: str, groups, st, access: int) -> bool:
    """Do ``st``'s mode bits grant ``access`` to ``user`` in ``groups``?"""
    if user == st.owner:
        bits = (st.mode >> 6) & 7
    elif st.group in set(groups):
        bits = (st.mode >> 3) & 7
    else:
        bits = st.mode & 7
    return bits & access == access


def answer(flag: str, st, user: str = "", groups=()) -> bool:
    if flag == "e":
        return True
    if flag == "d":
        return st.type == "dir"
    if flag == "f":
        return st.type == "file"
    if flag == "s":
        return (st.length or 0) > 0
    if flag == "z":
        return (st.length or 0) == 0
    return permits(user, groups, st, READ if flag == "r" else WRITE)


def cmd_test(cmd: Command):
    a = cmd.args
    try:
        st = cmd.client.get_file_status(user_path(a.path))
    except FileNotFound:
        return 1
    except (LeaseFSError, OSError) as exc:
        cmd.fail(a.path, exc)
        return 1
    user, groups = "", ()
    if a.flag in ("r", "w"):
        user, groups = cmd.client.user, cmd.client.groups
    return 0 if answer(a.flag, st, user, groups) else 1


def register(sub, common) -> None:
    p = command_parser(sub, "test", common, "answer a question about a path with the exit status",
                description="leasefs test -e|-d|-f|-s|-z|-w|-r PATH: exit 0 when true, 1 when "
                            "false (or the path is missing), no output, as hdfs dfs -test.\n\n"
                            "  -e exists    -d is a directory   -f is a file\n"
                            "  -s has a length > 0    -z has length 0\n"
                            "  -r / -w  the caller's user or groups may read / write it "
                            "(mode bits)\n\nexamples:\n"
                            "  leasefs test -d /data && echo directory\n"
                            "  leasefs test -e /data/part-0 || leasefs put part-0 /data/")
    g = p.add_mutually_exclusive_group(required=True)
    for flag, text in (("e", "exists"), ("d", "is a directory"), ("f", "is a file"),
                       ("s", "length > 0"), ("z", "length is 0"), ("r", "readable by the caller"),
                       ("w", "writable by the caller")):
        g.add_argument(f"-{flag}", dest="flag", action="store_const", const=flag, help=text)
    p.add_argument("path", metavar="PATH")
    p.set_defaults(func=cmd_test)
