"""``leasefs count [-q] [-u] [-e] [-h] [-v] PATH...``: directories, files and bytes below each
path in ``hdfs dfs -count``'s columns (``-q`` adds the quota columns first, ``-u`` shows only
them, ``-e`` adds the erasure coding policy: always ``Replicated`` here).

Why the server's ``content_summary``: it counts a subtree in one call instead of a listing
per directory. Quotas: the summary's ``ns_quota``/``ds_quota`` (-1 or absent = none) are
read when present, else the columns say ``none``/``inf`` as HDFS does without a quota.

Concurrency contract: synchronous, the CLI's main thread; one summary call per path.
"""

from __future__ import annotations

from ..common import Command, command_parser
from ..formatting import human_size
from .core import ITEM_ERRORS, user_path

QUOTA_FORMAT = "%12s %15s "           # QUOTA REM_QUOTA, as HDFS ContentSummary
SPACE_QUOTA_FORMAT = "%15s %15s "     # SPACE_QUOTA REM_SPACE_QUOTA
SUMMARY_FORMAT = "%12s %12s %18s "    # DIR_COUNT FILE_COUNT CONTENT_SIZE
EC_POLICY_FORMAT = "%20s "             # ERASURECODING_POLICY
#: the policy of every leasefs file, as HDFS names a replicated (not erasure coded) one
REPLICATED = "Replicated"


def header(quotas: bool, *, usage: bool = False, policy: bool = False) -> str:
    text = ""
    if quotas or usage:
        text = QUOTA_FORMAT % ("QUOTA", "REM_QUOTA") + \
            SPACE_QUOTA_FORMAT % ("SPACE_QUOTA", "REM_SPACE_QUOTA")
    if not usage:
        text += SUMMARY_FORMAT % ("DIR_COUNT", "FILE_COUNT", "CONTENT_SIZE")
    if policy:
        text += EC_POLICY_FORMAT % "ERASURECODING_POLICY"
    return text + "PATHNAME"


def count_line(summary: dict, path: str, *, quotas: bool = False, human: bool = False,
               usage: bool = False, policy: bool = False) -> str:
    """One ``hdfs dfs -count`` line of a ``content_summary`` answer; ``usage``: only the
    quota columns (``-u``), ``policy``: the erasure coding policy column (``-e``)."""
    size = human_size if human else str
    dirs, files = summary.get("directory_count", 0), summary.get("file_count", 0)
    text = ""
    if quotas or usage:
        ns = summary.get("ns_quota", -1)
        ds = summary.get("ds_quota", -1)
        ns = -1 if ns is None else ns
        ds = -1 if ds is None else ds
        text = QUOTA_FORMAT % (("none", "inf") if ns < 0 else (ns, ns - dirs - files))
        consumed = summary.get("space_consumed", 0)
        text += SPACE_QUOTA_FORMAT % (("none", "inf") if ds < 0
                                      else (size(ds), size(ds - consumed)))
    if not usage:
        text += SUMMARY_FORMAT % (dirs, files, size(summary.get("length", 0)))
    if policy:
        text += EC_POLICY_FORMAT % REPLICATED
    return text + path


def cmd_count(cmd: Command):
    a = cmd.args
    if a.header:
        cmd.out(header(a.quotas, usage=a.usage, policy=a.policy))
    for raw in a.paths:
        try:
            path = user_path(raw)
            cmd.out(count_line(cmd.client.content_summary(path), path, quotas=a.quotas,
                               human=a.human, usage=a.usage, policy=a.policy))
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def register(sub, common) -> None:
    p = command_parser(sub, "count", common, "count directories, files and bytes below paths",
                description="leasefs count [-q] [-u] [-e] [-h] [-v] PATH...\n"
                            "Columns as hdfs dfs -count: DIR_COUNT FILE_COUNT CONTENT_SIZE "
                            "PATHNAME;\n-q first adds QUOTA REM_QUOTA SPACE_QUOTA "
                            "REM_SPACE_QUOTA (none/inf without a quota),\n-u shows those "
                            "instead of the counts, -e adds ERASURECODING_POLICY (always\n"
                            "Replicated: leasefs replicates every file).\n\nexamples:\n"
                            "  leasefs count -v /data\n  leasefs count -q -h /user/*")
    p.add_argument("-q", dest="quotas", action="store_true", help="also the quota columns")
    p.add_argument("-u", dest="usage", action="store_true",
                   help="only the quota columns (quota and its use)")
    p.add_argument("-e", dest="policy", action="store_true",
                   help="also the erasure coding policy (Replicated)")
    p.add_argument("-h", dest="human", action="store_true", help="human-readable sizes")
    p.add_argument("-v", dest="header", action="store_true", help="print a header line")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_count)
