"""``leasefs find PATH... [-name GLOB | -iname GLOB] [-type f|d]``: print the full path of
everything below the given paths that matches, as ``hdfs dfs -find ... -print``.

Why client side: the listing calls already page through directories, so a walk costs no
new server call; names are matched with shell globs (``fnmatch``) on the last component.

Concurrency contract: synchronous, the CLI's main thread; a walk of listing calls through
the command's client (a tree changing meanwhile is seen as each directory is listed).
"""

from __future__ import annotations

import fnmatch

from fs import paths

from ..common import Command, command_parser
from .core import ITEM_ERRORS, user_path, walk


def matches(path: str, st, *, name=None, iname=None, kind=None) -> bool:
    base = paths.basename(path) or "/"
    if name is not None and not fnmatch.fnmatchcase(base, name):
        return False
    if iname is not None and not fnmatch.fnmatchcase(base.lower(), iname.lower()):
        return False
    if kind == "f" and st.type != "file":
        return False
    if kind == "d" and st.type != "dir":
        return False
    return True


def cmd_find(cmd: Command):
    a = cmd.args
    for raw in a.paths or ["/"]:
        try:
            top = user_path(raw)
            st = cmd.client.get_file_status(top)
            found = [(top, st)]
            if st.type == "dir":
                found += list(walk(cmd.client, top))
            for path, item in found:
                if matches(path, item, name=a.name, iname=a.iname, kind=a.type):
                    cmd.out(path)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def register(sub, common) -> None:
    p = command_parser(sub, "find", common, "find files and directories by name or type",
                description="leasefs find PATH... [-name GLOB] [-iname GLOB] [-type f|d]\n"
                            "Prints the full path of every match below each PATH (itself "
                            "included), as hdfs dfs -find.\n\nexamples:\n"
                            "  leasefs find /logs -name '*.gz'\n"
                            "  leasefs find /data -iname 'part-*' -type f",
                usage="leasefs find [options] PATH... [-name GLOB] [-iname GLOB] [-type f|d]")
    p.add_argument("-name", dest="name", default=None, metavar="GLOB",
                   help="the last component matches GLOB (case sensitive)")
    p.add_argument("-iname", dest="iname", default=None, metavar="GLOB",
                   help="the last component matches GLOB (case insensitive)")
    p.add_argument("-type", dest="type", choices=["f", "d"], default=None,
                   help="f: files only, d: directories only")
    p.add_argument("-print", action="store_true", help="print the matches (the default)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="default /")
    p.set_defaults(func=cmd_find)
