"""What both sides of the leasefs RPC share: the protocol constants and the hello, the
identity checks and names, addresses and address lists, local socket names and the peer
credentials the kernel gives, ``CallContext`` and ``ACTING_FOR``.

Why it exists: the ground floor of the RPC. ``fs.rpcclient`` and ``fs.rpcserver`` (and the
transports under them: ``fs.localserver``, ``fs.tls``) build on it and on nothing above it;
``fs.rpc`` is the one name callers import, which re-exports these pieces and the two sides.
It needs no trio.

Concurrency contract: no state but memoized name lookups (``functools.lru_cache``, safe from
any thread) and ``ACTING_FOR`` (a context variable: each task sees its own).
"""

from __future__ import annotations

import contextvars
import functools
import grp
import ipaddress
import logging
import os
import pwd
import socket
import struct
from dataclasses import dataclass, field

from .config import DEFAULT_LOCAL_SOCKET
from .errors import InvalidArgument
from .frames import brief

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
# the first frame of a connection, read before we know the peer: room for a client id and
# an identity of at most MAX_IDENTITY_BYTES
MAX_HELLO_FRAME = 8192
MAX_USER_NAME = 256        # characters of the user name in the hello
MAX_GROUP_NAME = 64        # characters of one group name (Linux allows 32)
MAX_GROUPS = 64            # group names in the hello
MAX_IDENTITY_BYTES = 6144  # UTF-8 bytes of user + group names together
ANONYMOUS_USER = "nobody"  # the user of a hello without one (an older client)
# the identity of a connection that has not authenticated yet (security = secure, over TCP):
# not printable, so no hello or act-as can name it; the dispatcher admits only the calls
# that authenticate (``Dispatcher.admits_unauthenticated``)
UNAUTHENTICATED = "\0unauthenticated"
# a call's effective identity when the connection's user acts for another (a FUSE mount for
# the kernel's caller): set around the calls, the request carries it (``RpcClient.call``)
ACTING_FOR: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "leasefs_acting_for", default=None)


def hello(client_id: str, user: str, groups, *, sync_metadata: bool = True,
          state_id: bool = False) -> dict:
    """A client's first frame (the module docstring has its fields)."""
    frame = {"hello": "leasefs", "version": PROTOCOL_VERSION, "client_id": client_id,
             "user": user, "groups": list(groups), "sync_metadata": sync_metadata}
    if state_id:
        frame["state_id"] = True
    return frame


def _name_ok(value, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def check_identity(user, groups, where: str = "hello") -> tuple[str, tuple[str, ...]]:
    """A user name and group names as the hello carries them: printable, non-empty, at most
    ``MAX_USER_NAME`` / ``MAX_GROUP_NAME`` characters, at most ``MAX_GROUPS`` groups and
    ``MAX_IDENTITY_BYTES`` in all; else InvalidArgument."""
    if not _name_ok(user, MAX_USER_NAME):
        raise InvalidArgument(f"{where}: user must be a printable name of 1..{MAX_USER_NAME} "
                              f"characters, got {brief(user, 80)}")
    if not isinstance(groups, (list, tuple)) or len(groups) > MAX_GROUPS:
        raise InvalidArgument(f"{where}: groups must be a list of at most {MAX_GROUPS} names, "
                              f"got {brief(groups, 80)}")
    for group in groups:
        if not _name_ok(group, MAX_GROUP_NAME):
            raise InvalidArgument(f"{where}: group names must be printable, 1..{MAX_GROUP_NAME} "
                                  f"characters, got {brief(group, 80)}")
    size = sum(len(name.encode("utf-8", "surrogatepass")) for name in (user, *groups))
    if size > MAX_IDENTITY_BYTES:
        raise InvalidArgument(f"{where}: user and group names take {size} bytes, more than "
                              f"{MAX_IDENTITY_BYTES}")
    return user, tuple(dict.fromkeys(groups))


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The name of ``uid`` (the number as text when it has none); memoized, so a name the
    system gives a uid later is seen only once the entry is evicted."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@functools.lru_cache(maxsize=256)
def group_name(gid: int) -> str:
    """The name of ``gid`` (the number as text when it has none); memoized like
    ``user_name``."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def current_user() -> str:
    """The calling process's (effective) user name; the uid as text if it has no name."""
    return user_name(os.geteuid())


def current_groups() -> list[str]:
    """The calling process's group names: its effective gid first, then its supplementary
    groups (a gid without a name as text); names the hello cannot carry are left out, and
    at most ``MAX_GROUPS`` / ``MAX_IDENTITY_BYTES`` are kept."""
    out: list[str] = []
    budget = MAX_IDENTITY_BYTES - MAX_USER_NAME * 4
    for name in dict.fromkeys(group_name(gid) for gid in [os.getegid(), *os.getgroups()]):
        size = len(name.encode("utf-8", "surrogatepass"))
        if not _name_ok(name, MAX_GROUP_NAME) or size > budget:
            log.debug("group %r left out of the RPC identity (too long or unprintable)", name)
            continue
        if len(out) == MAX_GROUPS:
            break
        out.append(name)
        budget -= size
    return out


@functools.lru_cache(maxsize=256)
def os_groups(user: str) -> tuple[str, ...]:
    """The group names the system gives ``user`` (primary first); empty for a user it does
    not know. Memoized like ``user_name``."""
    try:
        entry = pwd.getpwnam(user)
        gids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, OSError):
        return ()
    names = dict.fromkeys(group_name(gid) for gid in [entry.pw_gid, *gids])
    return tuple(n for n in names if _name_ok(n, MAX_GROUP_NAME))[:MAX_GROUPS]


@dataclass(frozen=True)
class PeerCredentials:
    """Who is at the other end of a local (Unix domain) connection, as the kernel says
    (``SO_PEERCRED``: the process's ids when it connected)."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock) -> "PeerCredentials":
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        return cls(*_CRED.unpack(raw))


_CRED = struct.Struct("3i")


def local_groups(user: str, credentials: PeerCredentials) -> tuple[str, ...]:
    """The groups of ``user`` on a local connection whose kernel credentials are
    ``credentials``: the system's groups of that user; for the connection's own user
    without an entry in the system, the connecting process's gid."""
    return os_groups(user) or ((str(credentials.gid),)
                               if user == user_name(credentials.uid) else ())


def local_socket_address(name: str) -> str | bytes:
    """A ``meta_socket`` name as ``bind``/``connect`` take it: ``@name`` is Linux's abstract
    namespace (no file, nothing stale after a crash), anything else a filesystem path."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def local_socket_name(template: str, address) -> str | None:
    """The ``meta_socket`` setting for the metadata server at ``address``: ``{port}`` filled
    in; None when empty. A client tries the default one for any address, but uses it for a
    server on another than a loopback address only when that address is this host's own
    and its port is held here (``fs.localserver.here``): another machine's server has no
    socket here, and a same-named one would be another cluster's."""
    if not template:
        return None
    return template.replace("{port}", str(parse_address(address)[1]))


def is_default_local_socket(name: str, address) -> bool:
    """Is ``name`` the default ``meta_socket`` of the server at ``address``, and that
    server not on a loopback address (then a client checks the address is this host's)?"""
    host, port = parse_address(address)
    return name == DEFAULT_LOCAL_SOCKET.replace("{port}", str(port)) and \
        not is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); False for any other name."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # a dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``; clear error on junk."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        return str(text[0]), int(text[1])
    host, sep, port = str(text).rpartition(":")
    if not sep:
        if default_port is None:
            raise InvalidArgument(f"address {text!r} is not HOST:PORT")
        return str(text), default_port
    try:
        port_no = int(port)
    except ValueError:
        raise InvalidArgument(f"address {text!r}: port {port!r} is not a number") from None
    if not 0 <= port_no < 65536:
        raise InvalidArgument(f"address {text!r}: port out of range")
    return host.strip("[]") or "127.0.0.1", port_no


def parse_address_list(text, default_port: int | None = None) -> list[tuple[str, int]]:
    """A server list as ``meta_address`` may give it: ``"h1:p1,h2:p2"``, a list of such
    entries (or of ``(host, port)``), or one address → ``[(host, port), ...]`` in order,
    duplicates dropped (HDFS's ConfiguredFailoverProxyProvider). InvalidArgument names
    the bad entry; an empty list is one too."""
    if isinstance(text, tuple) and len(text) == 2 and not isinstance(text[0], (tuple, list)):
        entries = [text]
    elif isinstance(text, (list, tuple)):
        entries = list(text)
    else:
        entries = str(text).split(",")
    out: list[tuple[str, int]] = []
    for entry in entries:
        if isinstance(entry, str):
            entry = entry.strip()
            if not entry:
                raise InvalidArgument(f"server list {text!r} has an empty entry")
        try:
            address = parse_address(entry, default_port)
        except (InvalidArgument, TypeError, ValueError) as exc:
            why = exc.message if isinstance(exc, InvalidArgument) else f"{entry!r} is not HOST:PORT"
            raise InvalidArgument(f"server list {text!r}: bad entry: {why}") from None
        if address not in out:
            out.append(address)
    if not out:
        raise InvalidArgument(f"server list {text!r} names no server")
    return out


def format_address_list(addresses) -> str:
    """``[(host, port), ...]`` → ``"h1:p1,h2:p2"``, the form ``parse_address_list`` reads."""
    return ",".join(format_address(a) for a in addresses)


def normalize_address_list(text) -> str:
    """``text`` checked and written canonically (one ``host:port`` or a comma list), so two
    spellings of one server list compare equal; InvalidArgument names a bad entry."""
    return format_address_list(parse_address_list(text))


def format_address(addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class CallContext:
    """Who is calling: the hello's client id, the peer address, the call id, and the
    identity the hello stated (``user``, ``groups``). ``user`` None marks an in-process
    caller (the server's own code, tests driving handlers directly): it acts as the
    server's process user. Calls from the wire always carry a user (``nobody`` at least)."""

    client_id: str
    peer: str
    call_id: object = None
    extra: dict = field(default_factory=dict)
    user: str | None = None
    groups: tuple[str, ...] = ()
    sync_metadata: bool = True   # namespace changes answered only once durable
    # what the connection established about its peer, shared by all its calls (a block
    # server's authenticated node id, see fs.nodeauth)
    session: dict = field(default_factory=dict)
    # ``time.perf_counter()`` when the request was read, set only while a ``call_observer``
    # watches (0: not measured, or run at once in the reader)
    received: float = 0.0
    # the newest server state (journal txid) the client has seen: a read served by an
    # observer must reflect at least that (read-your-writes, HDFS-12943); 0 = none
    state_id: int = 0
