"""A TCP proxy on loopback that can go silent: a network partition without root.

Why it exists: a partition is not a crash. The cut-off process keeps running, its TCP
connections are neither reset nor closed, and whatever it sends simply never arrives
(this kernel has no netem, iptables or nft to drop packets). ``leasefs bench ha
--partition`` and the HA tests put one ``CutProxy`` in front of each address a process is
to be cut from (an etcd member, a metadata server's RPC port) and ``cut()`` them all at
once.

While cut, the proxy forwards nothing either way and reads nothing more from its sockets
(so the senders' buffers fill as over a dead link); it still accepts new connections, as
the kernel's backlog would, but does not connect them upstream: a connect succeeds and
then nothing answers. ``heal()`` lets the held bytes through, in order, like TCP
retransmission after a link comes back, and connects the held connections.

In front of a metadata server (``meta=True``) it also holds the local socket named after
its own port and forwards it to the server's (``meta_socket``): a client on this machine
that is given the proxy's address goes there first, as it would to a server (it trusts the
socket because the same user holds the TCP port it is named after), and needs no token.

Concurrency contract: threads of its own (one acceptor, two pumps per connection), all
daemons; ``cut``/``heal``/``close`` may be called from any thread.
"""

from __future__ import annotations

import socket
import threading

from fs.config import DEFAULT_LOCAL_SOCKET
from fs.rpc import local_socket_address, local_socket_name


class CutProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (``"host:port"``) until ``cut()``."""

    def __init__(self, target: str, port: int = 0, *, meta: bool = False):
        host, _, port_text = target.rpartition(":")
        self.target = (host.strip("[]"), int(port_text))
        self._open = threading.Event()      # set: forwarding
        self._open.set()
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        listeners = [(self._listener, self.target)]
        if meta:
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            local.bind(local_socket_address(local_socket_name(DEFAULT_LOCAL_SOCKET,
                                                              self.address)))
            local.listen(64)
            listeners.append((local, local_socket_address(
                local_socket_name(DEFAULT_LOCAL_SOCKET, target))))
        for listener, upstream in listeners:
            self._keep(listener)
            threading.Thread(target=self._accept, args=(listener, upstream), daemon=True,
                             name=f"cutproxy-{self.port}").start()

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        """Stop listening and close every connection (both sides see it closed)."""
        self._closed = True
        self._open.set()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _keep(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _accept(self, listener: socket.socket, target) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._keep(client)
            threading.Thread(target=self._relay, args=(client, target), daemon=True).start()

    def _relay(self, client: socket.socket, target) -> None:
        self._open.wait()           # a connection made during the cut waits for the heal
        try:
            if isinstance(target, tuple):
                upstream = socket.create_connection(target, timeout=5)
            else:
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.settimeout(5)
                upstream.connect(target)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._keep(upstream)
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                self._open.wait()
                data = source.recv(1 << 16)
                if not data:
                    break
                self._open.wait()   # received just as the cut came: held until the heal
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (sink, source):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
