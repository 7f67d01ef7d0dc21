"""``touchz`` (create a zero-length file), ``chgrp [-R]`` and ``rmdir`` (delete empty
folders), as their ``hdfs dfs`` namesakes.

Why not ``touch``/``chown``: ``touchz`` refuses a file that already has data (HDFS: "Not a
zero-length file") instead of updating its times, ``chgrp GROUP`` is ``chown :GROUP``
under the name scripts use, and ``rmdir`` deletes only an empty folder (at once, as HDFS: an
empty folder has nothing for the trash to keep).

Concurrency contract: synchronous, the CLI's main thread; one client per process.
"""

from __future__ import annotations

from fs.errors import (DirectoryNotEmpty, FileExists, FileNotFound, InvalidArgument,
                       IsDirectory, LeaseFSError, NotDirectory)

from ..common import Command, command_parser
from ..formatting import parse_owner
from .core import require_parent_dir, targets, user_path

ITEM_ERRORS = (LeaseFSError, OSError)


def cmd_touchz(cmd: Command):
    for raw in cmd.args.paths:
        try:
            path = user_path(raw)
            try:
                st = cmd.client.get_file_status(path)
            except FileNotFound:
                require_parent_dir(cmd.client, path, "")
                with cmd.client.create(path, overwrite=False):
                    pass
                continue
            if st.type == "dir":
                raise IsDirectory("Is a directory")
            if st.length:
                raise FileExists("Not a zero-length file")
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_chgrp(cmd: Command):
    a = cmd.args
    _, group = parse_owner(":" + a.group)
    for raw in a.paths:
        try:
            for path, _ in targets(cmd, user_path(raw), a.recursive):
                cmd.client.set_owner(path, group=group)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_rmdir(cmd: Command):
    for raw in cmd.args.paths:
        try:
            path = user_path(raw)
            if path == "/":
                raise InvalidArgument("cannot remove the root")
            if cmd.client.get_file_status(path).type != "dir":
                raise NotDirectory("is not a directory")
            cmd.client.delete(path, recursive=False)
        except DirectoryNotEmpty:
            if not cmd.args.ignore_non_empty:
                cmd.fail(raw, DirectoryNotEmpty("directory is not empty"))
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def register(sub, common) -> None:
    p = command_parser(sub, "touchz", common, "create zero-length files",
                description="leasefs touchz PATH...: create empty files; an existing empty "
                            "file is fine, one with data is an error (as hdfs dfs -touchz).\n\n"
                            "example:\n  leasefs touchz /jobs/run1/_SUCCESS")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_touchz)

    p = command_parser(sub, "chgrp", common, "change the group of files and directories",
                description="leasefs chgrp [-R] GROUP PATH...\n\nexamples:\n"
                            "  leasefs chgrp staff /shared\n  leasefs chgrp -R eng /projects/x")
    p.add_argument("-R", dest="recursive", action="store_true", help="also everything below")
    p.add_argument("group", metavar="GROUP")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_chgrp)

    p = command_parser(sub, "rmdir", common, "delete empty directories",
                description="leasefs rmdir [--ignore-fail-on-non-empty] DIR...: delete each "
                            "DIR when it is empty (as hdfs dfs -rmdir;\nleasefs rm -r deletes "
                            "a folder with everything in it).\n\nexample:\n"
                            "  leasefs rmdir /jobs/run1/tmp")
    p.add_argument("--ignore-fail-on-non-empty", dest="ignore_non_empty", action="store_true",
                   help="a folder that is not empty is left alone without an error")
    p.add_argument("paths", nargs="+", metavar="DIR")
    p.set_defaults(func=cmd_rmdir)
