"""``leasefs token fetch|renew|cancel|print``: delegation tokens (HDFS ``hdfs fetchdt``) for
clients the metadata server cannot identify by their kernel credentials, e.g. a job on
another machine: fetch on the metadata server's host (its local socket names the user), copy
the file (it is a secret: mode 0600), point ``token_file`` (or ``LEASEFS_TOKEN_FILE``) at it
there.

Concurrency contract: runs on the main thread of a short-lived process.
"""

from __future__ import annotations

import json
import time

from fs.delegation import TokenFile, TokenId

from ..common import Command
from .maintenance import _rpc


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def cmd_token(cmd: Command):
    args = cmd.args
    if args.action == "fetch":
        r = _rpc(cmd, "get_delegation_token", {"renewer": args.renewer})
        token = TokenFile(TokenId.from_wire(r["id"]), bytes(r["password"]), cmd.meta_address)
        token.save(args.file)
        cmd.out(f"Fetched {token.token.describe()} (renewer {token.token.renewer}) into "
                f"{args.file}; valid until {_when(r['expiry'])} unless renewed, at most "
                f"until {_when(token.token.max_date)}")
        return 0
    token = TokenFile.load(args.file)
    if args.action == "print":
        t = token.token
        if args.json:
            cmd.out(json.dumps({**t.to_wire(), "service": token.service}, indent=2))
        else:
            cmd.out(f"{t.describe()}: renewer {t.renewer}, service {token.service}, issued "
                    f"{_when(t.issued)}, max date {_when(t.max_date)}")
        return 0
    if args.action == "renew":
        expiry = _rpc(cmd, "renew_delegation_token", {"token": token.token.to_wire()})
        cmd.out(f"Renewed {token.token.describe()} until {_when(expiry)}")
        return 0
    _rpc(cmd, "cancel_delegation_token", {"token": token.token.to_wire()})
    cmd.out(f"Cancelled {token.token.describe()}")
    return 0


def register(sub, common) -> None:
    from ..common import command_parser

    p = command_parser(sub, "token", common, "delegation tokens for clients on other machines "
                "(HDFS fetchdt): fetch, renew, cancel, print",
                description="leasefs token fetch FILE [--renewer USER]\n"
                            "leasefs token renew|cancel|print FILE\n\n"
                            "fetch: a new token of the calling user (identified by the "
                            "metadata server's local socket),\nwritten to FILE (mode 0600; it "
                            "is a secret). A client elsewhere uses it with\n"
                            "--set token_file=FILE or LEASEFS_TOKEN_FILE=FILE. renew: only its "
                            "renewer (default its owner);\ncancel: its owner or renewer; "
                            "both take effect at once, also across restarts.\n\n"
                            "example:\n  leasefs token fetch /tmp/alice.token\n"
                            "  scp /tmp/alice.token elsewhere: && ssh elsewhere "
                            "LEASEFS_TOKEN_FILE=alice.token leasefs --meta meta:8020 ls /",
                usage="leasefs token {fetch,renew,cancel,print} FILE [options]")
    p.add_argument("action", choices=["fetch", "renew", "cancel", "print"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--renewer", default=None, metavar="USER",
                   help="fetch: the user who may renew it (default: you)")
    p.add_argument("--json", action="store_true", help="print: machine-readable output")
    p.set_defaults(func=cmd_token)
