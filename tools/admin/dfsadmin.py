"""``leasefs dfsadmin -VERB ...``: HDFS's ``hdfs dfsadmin`` verbs, each running what the
matching leasefs command does: ``-report`` (``report``), ``-safemode get|enter|leave|wait``
(``safemode``), ``-saveNamespace`` (``save-namespace``), ``-refreshNodes`` (``decommission
--status``: leasefs keeps no include/exclude host files, a node is retired by name with
``leasefs decommission HOST:PORT``), ``-printTopology`` (the block servers by rack, from
``report``), ``-listOpenFiles [-path PATH]`` (``leases``) and the quota verbs
(``set-quota``, ``clr-quota``, ``set-space-quota``, ``clr-space-quota``).

Why a dispatcher of its own: scripts and habits written for HDFS type these; leasefs's own
commands stay the place where each thing is done, and this module only maps the HDFS
spelling onto them (importing each only when its verb runs).

Concurrency contract: synchronous, the CLI's main thread; whatever the command it runs does.
"""

from __future__ import annotations

import argparse

from ..common import Command, command_parser
from ..formatting import UsageError
from .quotas import parse_count, parse_size

#: HDFS's rack of a node without a topology script: leasefs has no racks
DEFAULT_RACK = "/default-rack"
ADMIN_STATES = {"NORMAL": "In Service", "DECOMMISSION_IN_PROGRESS": "Decommission In Progress",
                "DECOMMISSIONED": "Decommissioned"}
QUOTA_VERBS = ("setQuota", "clrQuota", "setSpaceQuota", "clrSpaceQuota")


def topology_lines(report: dict) -> list[str]:
    """``hdfs dfsadmin -printTopology`` text of a ``report``: every block server under the
    one rack, with its node id and admin state (dead ones said so)."""
    nodes = [(n, "") for n in report.get("live_nodes", [])] + \
        [(n, ", dead") for n in report.get("dead_nodes", [])]
    lines = [f"Rack: {DEFAULT_RACK}"]
    for node, dead in sorted(nodes, key=lambda item: item[0].get("address", "")):
        state = ADMIN_STATES.get(node.get("admin"), node.get("admin") or "In Service")
        lines.append(f"   {node.get('address', '?')} ({node.get('node_id', '?')}) {state}{dead}")
    return lines + [""]


def _print_topology(cmd: Command):
    for line in topology_lines(cmd.client.report()):
        cmd.out(line)


def cmd_dfsadmin(cmd: Command):
    a = cmd.args
    verb = a.verb
    if verb in QUOTA_VERBS:
        from .quotas import cmd_quota

        if not a.paths:
            raise UsageError(f"-{verb} needs at least one PATH")
        a.action = verb
        return cmd_quota(cmd)
    if a.paths:
        raise UsageError(f"-{verb} takes no PATH (got {' '.join(a.paths)})")
    if verb == "report":
        from ..shell.core import cmd_report
        a.json = False
        return cmd_report(cmd)
    if verb == "safemode":
        from ..shell.core import cmd_safemode
        a.action = a.value
        return cmd_safemode(cmd)
    if verb == "saveNamespace":
        from .maintenance import cmd_save_namespace
        a.json = False
        return cmd_save_namespace(cmd)
    if verb == "refreshNodes":
        from .maintenance import cmd_decommission
        a.node, a.status, a.stop, a.json = None, True, False, False
        return cmd_decommission(cmd)
    if verb == "printTopology":
        return _print_topology(cmd)
    from ..shell.leases import cmd_leases   # listOpenFiles
    a.json = False
    return cmd_leases(cmd)


class _StoreVerb(argparse.Action):
    """``-VERB [VALUE]``: records the verb in ``verb`` and its value (if any) in ``value``."""

    def __init__(self, option_strings, dest, verb, **kwargs):
        self.verb = verb
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.verb = self.verb
        namespace.value = values if self.nargs != 0 else None


def register(sub, common) -> None:
    p = command_parser(
        sub, "dfsadmin", common,
        "HDFS dfsadmin: -report, -safemode, -saveNamespace, -refreshNodes, -printTopology, "
        "-listOpenFiles and the quota verbs, each running its leasefs command",
        description="leasefs dfsadmin -VERB [ARGS]: HDFS's dfsadmin verbs, each running the "
                    "leasefs command named:\n"
                    "  -report                           leasefs report\n"
                    "  -safemode get|enter|leave|wait    leasefs safemode ACTION\n"
                    "  -saveNamespace                    leasefs save-namespace\n"
                    "  -refreshNodes                     leasefs decommission --status "
                    "(leasefs keeps no\n"
                    "                                    host files: 'leasefs decommission "
                    "HOST:PORT' retires one)\n"
                    "  -printTopology                    the block servers (one rack, "
                    f"{DEFAULT_RACK})\n"
                    "  -listOpenFiles [-path PATH]       leasefs leases [PATH]\n"
                    "  -setQuota N PATH...               leasefs set-quota N PATH...\n"
                    "  -clrQuota PATH...                 leasefs clr-quota PATH...\n"
                    "  -setSpaceQuota N[k|m|g|t] PATH... leasefs set-space-quota N PATH...\n"
                    "  -clrSpaceQuota PATH...            leasefs clr-space-quota PATH...\n"
                    "Quotas and save-namespace need the superuser.\n\nexamples:\n"
                    "  leasefs dfsadmin -report\n  leasefs dfsadmin -safemode wait\n"
                    "  leasefs dfsadmin -setSpaceQuota 10g /user/alice")
    g = p.add_mutually_exclusive_group(required=True)

    def verb(name, **kw):
        g.add_argument(f"-{name}", dest="verb", action=_StoreVerb, verb=name, **kw)

    verb("report", nargs=0, help="the cluster report (leasefs report)")
    verb("safemode", metavar="ACTION", choices=["get", "enter", "leave", "wait"],
         help="get, enter, leave or wait for safe mode (leasefs safemode)")
    verb("saveNamespace", nargs=0, help="take a checkpoint now (leasefs save-namespace)")
    verb("refreshNodes", nargs=0,
         help="where decommissions stand (leasefs decommission --status)")
    verb("printTopology", nargs=0, help="the block servers by rack")
    verb("listOpenFiles", nargs=0, help="files open for writing (leasefs leases)")
    verb("setQuota", type=parse_count, metavar="N",
         help="at most N names (folders + files, the folder included) below PATH")
    verb("clrQuota", nargs=0, help="remove the name quota")
    verb("setSpaceQuota", type=parse_size, metavar="N",
         help="at most N bytes × replication below PATH (suffix k, m, g, t)")
    verb("clrSpaceQuota", nargs=0, help="remove the space quota")
    p.add_argument("-path", dest="path", default=None, metavar="PATH",
                   help="-listOpenFiles: only below PATH (default /)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="-safemode wait: seconds to wait (default 300)")
    p.add_argument("paths", metavar="PATH", nargs="*", help="the quota verbs' folders")
    p.set_defaults(func=cmd_dfsadmin, value=None)
