"""``leasefs token fetch|renew|cancel|print``: delegation tokens (HDFS ``hdfs fetchdt``) for
clients the metadata server cannot identify by their kernel credentials, e.g. a job on
another machine: fetch where the kernel names the user — the metadata server's host (its
local socket) or a block server's host (the block server's local socket, where it vouches
for the user: ``storage.vouch``) —, copy the file (it is a secret: mode 0600), point
``token_file`` (or ``LEASEFS_TOKEN_FILE``) at it there.

Concurrency contract: runs on the main thread of a short-lived process.
"""

from __future__ import annotations

import json
import socket
import time

from fs import localserver
from fs.blockingrpc import BlockingRpc
from fs.delegation import TokenFile, TokenId
from fs.errors import (AuthenticationFailed, AuthenticationRequired, InvalidArgument,
                       ServerUnavailable)
from fs.hdfs import tokenfile
from fs.rpc import local_socket_name, parse_address, parse_address_list

from ..common import Command
from .maintenance import _rpc


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _meta_here(cmd: Command) -> bool:
    """Does a metadata server of ``meta_address`` answer at its local socket here? (One
    whose socket fails the holder check counts: the RPC client reports that.)"""
    for address in parse_address_list(cmd.meta_address):
        name = local_socket_name(cmd.config.meta_socket, address)
        if name is None:
            continue
        try:
            sock = localserver.connect(name, address)
        except (ServerUnavailable, AuthenticationFailed):
            return True
        if sock is not None:
            sock.close()
            return True
    return False


def _storage_socket(cmd: Command) -> tuple[str | None, tuple[str, int]]:
    """The local socket of this host's block server (``storage_socket`` of its data port
    ``storage_port``) and the address errors name it by."""
    config = cmd.config
    port = config.storage_port
    return (local_socket_name(config.storage_socket, ("", port)),
            (config.advertise_host or config.bind_host, port))


def _vouched(cmd: Command, renewer) -> dict | None:
    """A token of the calling user from this host's block server, which vouches for its
    host's users; None when no block server answers at its local socket here."""
    name, address = _storage_socket(cmd)
    if name is None:
        return None
    # every socket listening on the data port is this host's (the kernel's table is this
    # network namespace's): the block server's user is the one that listens there
    found = localserver.listeners(address[1])
    if found:   # errors name the address it listens on
        address = (str(found[0].address), address[1])
    sock = localserver.connect(name, address,
                               frozenset(listener.address for listener in found),
                               server="block server", setting="storage_socket")
    if sock is None:
        return None
    rpc = BlockingRpc.over(sock, cmd.config, server=f"block server on port {address[1]}")
    try:
        return rpc.call("get_delegation_token", {"renewer": renewer})
    except EOFError as exc:
        raise ServerUnavailable(f"token fetch through local socket {name}: {exc}") from None
    finally:
        rpc.close()


def _fetch(cmd: Command, renewer) -> dict:
    """``get_delegation_token`` where the kernel can name the caller: the metadata server's
    local socket, else this host's block server's."""
    if _meta_here(cmd):
        return _rpc(cmd, "get_delegation_token", {"renewer": renewer})
    answer = _vouched(cmd, renewer)
    if answer is not None:
        return answer
    try:   # the metadata server says why not (no security, unreachable, ...)
        return _rpc(cmd, "get_delegation_token", {"renewer": renewer})
    except AuthenticationRequired:
        name, address = _storage_socket(cmd)
        raise AuthenticationRequired(
            f"token fetch: no metadata server of {cmd.meta_address} on this host (its local "
            f"socket) and no block server either (nothing at local socket "
            f"{name or '(storage_socket is empty)'} of data port {address[1]}): run it on the "
            f"metadata server's host or on a block server's host (--set storage_port=N for "
            f"a block server on another port than {address[1]})") from None


# the metadata server's HDFS port when the configuration names none
DEFAULT_HDFS_PORT = 9000


def _hdfs_service(cmd: Command, address: str | None) -> str:
    """The token's ``service`` for Hadoop's client: the HDFS address of the metadata
    server (``--hdfs-address``, else its host at ``meta_hdfs_port``) as "ip:port", the form
    Hadoop looks a token up by (hadoop.security.token.service.use_ip, its default)."""
    if address:
        host, port = parse_address(address)
    else:
        host = parse_address_list(cmd.meta_address)[0][0]
        port = getattr(cmd.config, "meta_hdfs_port", DEFAULT_HDFS_PORT)
    try:
        ip = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise InvalidArgument(f"token fetch --hadoop: cannot resolve {host}: {exc}") from None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _load(path: str) -> TokenFile:
    """A token file in either format: leasefs's (JSON) or Hadoop's (``--hadoop``)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        head = b""     # TokenFile.load names the file and the cause
    if not tokenfile.is_hadoop_token_file(head):
        return TokenFile.load(path)
    found = [t for t in tokenfile.Credentials.load(path).tokens.values()
             if t.kind == tokenfile.KIND]
    if len(found) != 1:
        raise AuthenticationFailed(f"token file {path}: {len(found)} HDFS delegation tokens "
                                   f"(1 expected)")
    try:
        token = tokenfile.decode_identifier(found[0].identifier)
    except InvalidArgument as exc:
        raise AuthenticationFailed(f"token file {path}: {exc}") from None
    return TokenFile(token, found[0].password, found[0].service)


def cmd_token(cmd: Command):
    args = cmd.args
    if args.action == "fetch":
        r = _fetch(cmd, args.renewer)
        token = TokenFile(TokenId.from_wire(r["id"]), bytes(r["password"]), cmd.meta_address)
        if args.hadoop:
            service = _hdfs_service(cmd, args.hdfs_address)
            hadoop = tokenfile.delegation_token(token.token, token.secret, service)
            tokenfile.Credentials({service: hadoop}).save(args.file)
            form = f"Hadoop's format, for hdfs://{service}"
        else:
            token.save(args.file)
            form = "leasefs's format"
        cmd.out(f"Fetched {token.token.describe()} (renewer {token.token.renewer}) into "
                f"{args.file} ({form}); valid until {_when(r['expiry'])} unless renewed, at "
                f"most until {_when(token.token.max_date)}")
        return 0
    token = _load(args.file)
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
                            "fetch: a new token of the calling user, written to FILE (mode "
                            "0600; it is a secret),\non the metadata server's host (its local "
                            "socket names you) or a block server's host\n(the block server "
                            "of storage_port vouches for you; --set storage_port=N for "
                            "another).\nA client elsewhere uses it with\n"
                            "--set token_file=FILE or LEASEFS_TOKEN_FILE=FILE. renew: only its "
                            "renewer (default its owner);\ncancel: its owner or renewer; "
                            "both take effect at once, also across restarts.\n\n"
                            "fetch --hadoop: FILE in Hadoop's format, for Java clients "
                            "(Spark, FsShell) through hdfs://:\n"
                            "HADOOP_TOKEN_FILE_LOCATION=FILE.\n\n"
                            "example:\n  leasefs token fetch /tmp/alice.token\n"
                            "  scp /tmp/alice.token elsewhere: && ssh elsewhere "
                            "LEASEFS_TOKEN_FILE=alice.token leasefs --meta meta:8020 ls /\n"
                            "  leasefs token fetch --hadoop /tmp/alice.hdts",
                usage="leasefs token {fetch,renew,cancel,print} FILE [--hadoop] [options]")
    p.add_argument("action", choices=["fetch", "renew", "cancel", "print"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--renewer", default=None, metavar="USER",
                   help="fetch: the user who may renew it (default: you)")
    p.add_argument("--hadoop", action="store_true",
                   help="fetch: write FILE in Hadoop's token file format, for Java clients "
                        "(HADOOP_TOKEN_FILE_LOCATION=FILE); renew/cancel/print read both")
    p.add_argument("--hdfs-address", default=None, metavar="HOST:PORT",
                   help="fetch --hadoop: the metadata server's HDFS address the Java client "
                        "connects to (default: its host, port meta_hdfs_port)")
    p.add_argument("--json", action="store_true", help="print: machine-readable output")
    p.set_defaults(func=cmd_token)
