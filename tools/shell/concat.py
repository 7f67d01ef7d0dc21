"""``leasefs concat TARGET SRC...``: HDFS ``hdfs dfs -concat``: the blocks of the sources
move, in order, to the end of the target without copying a byte; the sources are deleted.

Why a module of its own: one command with its own preconditions (all files in one folder,
full blocks but the last source's last, the same block size; the server checks them).

Concurrency contract: synchronous, the CLI's main thread; one ``concat`` call.
"""

from __future__ import annotations

from ..common import Command, command_parser


def cmd_concat(cmd: Command) -> int:
    cmd.client.concat(cmd.args.target, list(cmd.args.srcs))
    return 0


def register(sub, common) -> None:
    p = command_parser(sub, "concat", common, "append the blocks of SRC... to TARGET without copying "
                "and delete the sources (HDFS concat; same folder, full blocks but the last "
                "source's last, same block size)")
    p.add_argument("target", metavar="TARGET")
    p.add_argument("srcs", metavar="SRC", nargs="+")
    p.set_defaults(func=cmd_concat)
