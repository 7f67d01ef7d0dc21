"""Is the process behind a metadata server's local socket that server? The client's check,
made before it sends anything on the socket. (A block server's local socket, where it
vouches for its host's users, ``storage.vouch``, is checked the same way against its data
port.)

Why it exists: a local socket's name (Linux's abstract namespace, or a path in a folder others
may write) can be taken by any local user before the metadata server binds it; a client that
trusted whatever answers there would hand that user its files and believe its answers. The
client already trusts one thing: the address it was given, whose TCP port the server holds.
So the holder of the socket (the kernel's ``SO_PEERCRED`` of the connected socket: the uid
that bound it) must be the user whose socket listens on that port (``/proc/net/tcp``,
``tcp6``). Nothing there yet (a server starting binds its local socket first, one stopping
may close its port first) is a state to wait out; another user's is an impostor.

Concurrency contract: ``check`` runs in the client's trio thread (it reads /proc, no disk;
its cache of the kernel's table is that thread's); a host name that is not an address is
resolved with ``resolve`` in a worker thread.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import stat
import time
from dataclasses import dataclass

from .errors import AuthenticationFailed, ServerUnavailable
from .rpcbase import (PeerCredentials, format_address, is_default_local_socket,
                      local_socket_address)

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """A TCP socket listening on this host (a row of /proc/net/tcp or tcp6)."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    uid: int


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # /proc prints each 32-bit word of the address in the host's (little-endian) order
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(port: int) -> list[Listener]:
    """The TCP sockets listening on ``port`` on this host."""
    out = []
    for fields in _rows():
        if fields[3] != _LISTEN:
            continue
        address, listening = _endpoint(fields[1])
        if listening == port:
            out.append(Listener(address, port, int(fields[7])))
    return out


def _rows():
    """The rows of the kernel's TCP tables, split into fields."""
    for table in _TABLES:
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except FileNotFoundError:   # no IPv6 here
            continue
        for row in rows:
            fields = row.split()
            if len(fields) >= 8:
                yield fields


def _endpoint(text: str) -> tuple:
    host, _, hex_port = text.partition(":")
    return _address(host), int(hex_port, 16)


def _plain(address):
    """An IPv4 address seen through a dual-stack socket (::ffff:a.b.c.d) as IPv4."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def connection_owner(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the socket at the other end of a TCP connection this host accepted
    (``peer``: its address, ``local``: this end's), when that end is a socket of this host
    (a loopback client); None when the kernel lists no such socket here."""
    want_peer = (_plain(ipaddress.ip_address(peer[0].split("%")[0])), peer[1])
    want_local = (_plain(ipaddress.ip_address(local[0].split("%")[0])), local[1])
    for fields in _rows():
        if fields[3] == _LISTEN:
            continue
        here_end, there_end = _endpoint(fields[1]), _endpoint(fields[2])
        if (_plain(here_end[0]), here_end[1]) == want_peer and \
                (_plain(there_end[0]), there_end[1]) == want_local:
            return int(fields[7])
    return None


def addresses(host: str) -> frozenset | None:
    """The IP addresses ``host`` names without a lookup (a literal address), else None."""
    try:
        return frozenset({ipaddress.ip_address(host)})
    except ValueError:
        return None


def resolve(host: str) -> frozenset:
    """The IP addresses of ``host`` (a name lookup: call it in a worker thread)."""
    try:
        return frozenset(ipaddress.ip_address(info[4][0].split("%")[0])
                         for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP))
    except OSError:
        return frozenset()


def _own(address) -> bool:
    """Is ``address`` one of this host's (in this network namespace)? Binding it tells."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(address), 0))
    except OSError:
        return False
    return True


def here(wanted, port: int) -> bool:
    """Does a server of this host listen on ``port`` at one of the addresses ``wanted``
    (the IP addresses of the host it was named by), itself or bound to every address?"""
    found = _listeners_now(port)
    if any(listener.address in wanted for listener in found):
        return True
    return any(listener.address.is_unspecified for listener in found) and \
        any(_own(address) for address in wanted)


# port -> (monotonic expiry, the uids listening on it by address): many clients of one
# process reconnecting at once (a server restart) read the kernel's table once
_seen: dict[int, tuple[float, list[Listener]]] = {}
_KEEP_SECONDS = 1.0


def _listeners_now(port: int) -> list[Listener]:
    now = time.monotonic()
    kept = _seen.get(port)
    if kept is not None and kept[0] > now:
        return kept[1]
    found = listeners(port)
    if found:                   # nothing listening: look again next time (a server starting)
        if len(_seen) > 64:
            _seen.clear()
        _seen[port] = (now + _KEEP_SECONDS, found)
    return found


def private_path(path: str, uid: int) -> bool:
    """Could only ``uid`` or root have made the socket file ``path``? It is ``uid``'s, its
    folder is root's or ``uid``'s and nobody else may write there, and no folder above it
    lets anyone else replace that folder (owned by root or ``uid``, and not writable by
    others unless sticky). Then its holder is the metadata server even where the server's
    TCP port cannot be seen: a client in another network namespace of this machine (a
    container the socket's folder is shared into)."""
    try:
        if os.lstat(path).st_uid != uid:
            return False
        folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        first = True
        while True:
            info = os.stat(folder)
            if info.st_uid not in (0, uid):
                return False
            others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if others_write and (first or not info.st_mode & stat.S_ISVTX):
                return False
            parent = os.path.dirname(folder)
            if parent == folder:
                return True
            folder, first = parent, False
    except OSError:
        return False


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def holder(name: str) -> str | None:
    """Who holds the local socket ``name`` (for a server that could not bind it): "uid N
    (user), pid P", or None if nobody answers there."""

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)     # a Unix socket connects at once or not at all
        try:
            sock.connect(local_socket_address(name))
        except OSError:
            return None
        held = PeerCredentials.of(sock)
    return f"{_who(held.uid)}, pid {held.pid}"


def connect(name: str, address: tuple[str, int], wanted=None, *,
            server: str = "metadata server", setting: str = "meta_socket"
            ) -> socket.socket | None:
    """A blocking connection to the local socket ``name`` of the ``server`` at ``address``,
    its holder checked (``verify``; ``wanted``: default the addresses of ``address``'s
    host, looked up only once something answers) before anything is sent; None when
    nothing answers there (no such server on this host, or its backlog is full) or it is
    another host's server's. Raises as ``check`` does."""

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect(local_socket_address(name))   # at once or not at all
        if wanted is None:
            wanted = addresses(address[0])
            if wanted is None:
                wanted = resolve(address[0])
        if not verify(sock, name, address, wanted, server=server, setting=setting):
            sock.close()
            return None
    except OSError:
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def verify(sock: socket.socket, name: str, address: tuple[str, int], wanted, *,
           server: str = "metadata server", setting: str = "meta_socket") -> bool:
    """``check`` as a client makes it, which tries the default socket name for a server at
    any address: False (use TCP, send nothing here) when ``name`` is that default and the
    server at ``address`` is not on this host, so the socket is another server's."""

    if is_default_local_socket(name, address) and not here(wanted, address[1]):
        return False
    check(sock, name, address, wanted, server=server, setting=setting)
    return True


def check(sock: socket.socket, name: str, address: tuple[str, int], wanted, *,
          server: str = "metadata server", setting: str = "meta_socket") -> None:
    """Return if the process that holds the local socket ``name`` (connected as ``sock``)
    runs as the user whose socket listens on ``address``'s TCP port (``wanted``: the IP
    addresses of its host): the ``server`` (a metadata server, or a block server whose
    data port that is; ``setting`` names the socket's setting). ``AuthenticationFailed`` if
    another user's does; ``ServerUnavailable`` if none listens there (yet). It reads a
    kernel table, no disk: quick enough for the caller's thread, which must send its hello
    promptly."""

    holder = PeerCredentials.of(sock)
    port = address[1]
    held = {listener.uid for listener in _listeners_now(port)
            if listener.address in wanted or listener.address.is_unspecified}
    where = format_address(address)
    if held == {holder.uid}:
        return
    if not held and not name.startswith("@") and private_path(name, holder.uid):
        return   # the server of another network namespace (a container): see private_path
    if not held:
        raise ServerUnavailable(
            f"local socket {name}: held by {_who(holder.uid)} (pid {holder.pid}), but "
            f"nothing listens on {where}: not the {server} there (still starting, or "
            f"another user took the socket's name); nothing was sent to it")
    raise AuthenticationFailed(
        f"local socket {name}: held by {_who(holder.uid)} (pid {holder.pid}), but the "
        f"{server} at {where} runs as {', '.join(_who(u) for u in sorted(held))}: "
        f"another user took the socket's name; nothing was sent to it (stop that process, "
        f"or set {setting} to a path in a folder only the server's user may write)")
