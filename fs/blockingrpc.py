"""Namespace reads over one blocking connection, without trio: what a one-shot command
(``leasefs ls``, ``stat``, ``test``) asks of a metadata server on this machine.

Why: importing trio costs a command line process about 100 ms, half of what ``leasefs
ls /`` took, and a command that makes two or three reads needs none of what trio brings
(calls in flight together, retries, failover, lease renewal, data streams). This client
speaks the same wire (``fs.frames``, ``fs.rpc.hello``) over the server's local socket, one
call at a time, and hands everything else to the full client:

1. Only a server of this machine, reached through its local socket (whose holder is
   checked to be that server, ``fs.localserver``), with one address (no HA list) and no
   observer reads. Otherwise ``BlockingReads`` never connects and every call goes to the
   full client.
2. The socket opens on the first read; a read that meets a lost, silent or busy
   connection, or an answer that asks to try again, is made again by the full client,
   which retries and fails over as always. Reads change nothing, so a second try is safe.
3. Any method it does not offer is the full client's (``__getattr__``), so a command may
   use it wherever it would use ``fs.client.Client``.

Concurrency contract: one thread; the calls block the caller for at most ``rpc_timeout``
per read on the blocking path.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

from . import errors, localserver, paths
from .config import Config
from .errors import LeaseFSError, ProtocolError, SafeMode, ServerUnavailable, TryAgain
from .frames import LENGTH, encode_frame, too_large, unpackb
from .rpc import (check_identity, current_groups, current_user, hello,
                  local_socket_name, parse_address_list)
from .status import LIST_PAGE, FileStatus, iter_pages

#: answers after which the full client's retries take over
_HAND_OVER = (ServerUnavailable, TryAgain, SafeMode, ProtocolError, OSError, EOFError)


class BlockingRpc:
    """One connection to a metadata server's local socket; ``call`` sends a request and
    waits for its reply (errors as the exceptions of ``fs.errors``)."""

    def __init__(self, sock: socket.socket, *, user: str, groups, max_frame: int,
                 server: str = "metadata server"):
        self._sock = sock
        self._server = server      # who answers there, as errors name it
        self._max_frame = max_frame
        self._buf = bytearray()
        self._next_id = 0
        sock.sendall(encode_frame(hello(f"leasefs-client-{os.urandom(16).hex()}", user,
                                        groups)))

    @classmethod
    def open_local(cls, meta_address: str, config: Config) -> "BlockingRpc | None":
        """A connection to the one metadata server of ``meta_address`` through its local
        socket; None when there is none to use (step 1), or it does not answer at once."""
        addresses = parse_address_list(meta_address)
        if len(addresses) != 1 or config.observer_reads or not config.meta_socket:
            return None
        address = addresses[0]
        name = local_socket_name(config.meta_socket, address)
        if name is None:
            return None
        try:
            sock = localserver.connect(name, address)
        except ServerUnavailable:
            # no server behind the socket's holder yet: the full client waits and retries
            # as for any server still starting
            return None
        if sock is None:   # no server there, or its backlog is full: the full client's
            return None
        try:
            return cls.over(sock, config)
        except OSError:    # gone meanwhile: the full client's too
            return None

    @classmethod
    def over(cls, sock: socket.socket, config: Config,
             server: str = "metadata server") -> "BlockingRpc":
        """The connection ``sock`` (a checked local socket: ``fs.localserver.connect``) to
        ``server``, as the calling process's user, with ``rpc_timeout`` per reply."""
        try:
            sock.settimeout(config.rpc_timeout)
            user, groups = check_identity(current_user(), current_groups(), "client identity")
            return cls(sock, user=user, groups=groups, max_frame=config.max_frame,
                       server=server)
        except BaseException:
            sock.close()
            raise

    def call(self, method: str, args: dict):
        self._next_id += 1
        call_id = self._next_id
        self._sock.sendall(encode_frame([call_id, method, args]))
        while True:
            reply = self._receive_frame()
            if not (isinstance(reply, list) and 3 <= len(reply) <= 4):
                raise ProtocolError(f"malformed reply from server: {reply!r:.120}")
            if reply[0] == call_id:
                break
            if reply[0] is None and not reply[1]:   # the server refused the connection
                raise errors.from_wire(reply[2])
        if reply[1]:
            return reply[2]
        raise errors.from_wire(reply[2])

    def _receive_frame(self):
        need = LENGTH.size
        while len(self._buf) < need:
            self._fill()
        (length,) = LENGTH.unpack_from(self._buf)
        if length > self._max_frame:
            raise too_large(length, self._max_frame)
        need += length
        while len(self._buf) < need:
            self._fill()
        body = bytes(self._buf[LENGTH.size:need])
        del self._buf[:need]
        return unpackb(body)

    def _fill(self) -> None:
        try:
            chunk = self._sock.recv(1 << 16)
        except socket.timeout:
            raise ServerUnavailable(f"the {self._server} did not answer in time") from None
        if not chunk:
            raise EOFError(f"the {self._server} closed the connection")
        self._buf += chunk

    def close(self) -> None:
        self._sock.close()


class BlockingReads:
    """``fs.client.Client``'s namespace reads over a ``BlockingRpc`` where one can be
    opened (module docstring), the full client (made by ``full()`` when first needed) for
    everything else."""

    def __init__(self, meta_address: str, config: Config, full: Callable[[], object]):
        self._meta_address = meta_address
        self._config = config
        self._make_full = full
        self._full = None
        self._rpc: BlockingRpc | None = None
        self._tried = False
        #: reads answered over the blocking connection (errors too), and reads it handed
        #: over
        self.blocking_reads = 0
        self.handed_over = 0

    def _blocking(self) -> BlockingRpc | None:
        if self._full is not None:      # one connection is enough once the full one exists
            return None
        if not self._tried:
            self._tried = True
            self._rpc = BlockingRpc.open_local(self._meta_address, self._config)
        return self._rpc

    @property
    def full(self):
        if self._full is None:
            self._full = self._make_full()
        return self._full

    def _read(self, method: str, args: dict):
        """The answer of one read on the blocking connection; ``None`` as the first element
        when the full client must make it instead."""
        rpc = self._blocking()
        if rpc is not None:
            try:
                answer = rpc.call(method, args)
            except _HAND_OVER:
                self._drop()
                self.handed_over += 1
            except LeaseFSError:    # the server's answer: an error
                self.blocking_reads += 1
                raise
            else:
                self.blocking_reads += 1
                return True, answer
        return None, None

    def _drop(self) -> None:
        rpc, self._rpc = self._rpc, None
        if rpc is not None:
            rpc.close()

    def get_file_status(self, path: str, *, locations: bool = False) -> FileStatus:
        if not locations:
            done, answer = self._read("get_file_info", {"path": paths.validate(path)})
            if done:
                return FileStatus.from_wire(answer)
        return self.full.get_file_status(path, locations=locations)

    def exists(self, path: str) -> bool:
        try:
            self.get_file_status(path)
        except (errors.FileNotFound, errors.NotDirectory):
            return False
        return True

    def list_page(self, path: str, start_after: str = "",
                  limit: int | None = None) -> tuple[list[FileStatus], bool]:
        """One page of a directory's entries after ``start_after``, and whether more follow;
        from the full client when the blocking connection cannot answer it."""
        done, page = self._read("list_status", {"path": paths.validate(path),
                                                "start_after": start_after,
                                                "limit": limit or LIST_PAGE})
        if not done:
            return self.full.list_page(path, start_after, limit)
        return [FileStatus.from_wire(e) for e in page["entries"]], bool(page.get("has_more"))

    def iter_status(self, path: str):
        """Entries of a directory sorted by name, page by page (a file yields itself)."""
        return iter_pages(self.list_page, path)

    def list_status(self, path: str) -> list[FileStatus]:
        return list(self.iter_status(path))

    def close(self) -> None:
        self._drop()
        full, self._full = self._full, None
        if full is not None:
            full.close()

    def __getattr__(self, name: str):
        # anything else is the full client's (only reached for names not defined here)
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)
