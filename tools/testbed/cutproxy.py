"""A TCP proxy on loopback that can go silent: a network partition without root.

Why it exists: a partition is not a crash. The cut-off process keeps running, its TCP
connections are neither reset nor closed, and whatever it sends simply never arrives
(this kernel has no netem, iptables or nft to drop packets). ``leasefs bench ha
--partition`` and the HA tests put one ``CutProxy`` in front of each address a process is
to be cut from (an etcd member, a metadata server's RPC port) and ``cut()`` them all at
once.

While cut, the proxy forwards nothing either way and reads nothing more from its sockets
(so the senders' buffers fill as over a dead link), and a new connection is never
answered: the proxy stops accepting and fills its listeners' queues (backlog 0 and a few
connections of its own), so the kernel drops a new TCP handshake as a dead link would,
and a connect hangs until the caller's own timeout. ``heal()`` lets the held bytes
through, in order, like TCP retransmission after a link comes back, and accepts again.

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


#: the listeners' queue while forwarding
BACKLOG = 64
#: connections of its own a cut proxy queues at most to fill a listener's queue
FILL = 4


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
        self._fillers: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", port), backlog=BACKLOG)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        listeners = [(self._listener, self.target)]
        if meta:
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            local.bind(local_socket_address(local_socket_name(DEFAULT_LOCAL_SOCKET,
                                                              self.address)))
            local.listen(BACKLOG)
            listeners.append((local, local_socket_address(
                local_socket_name(DEFAULT_LOCAL_SOCKET, target))))
        self._listeners = listeners
        # each acceptor's: it waits for the heal and accepts nothing meanwhile
        self._parked = [threading.Event() for _ in listeners]
        for (listener, upstream), parked in zip(listeners, self._parked):
            self._keep(listener)
            threading.Thread(target=self._accept, args=(listener, upstream, parked),
                             daemon=True, name=f"cutproxy-{self.port}").start()

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    def cut(self) -> None:
        """Silence everything at once; returns once new connections can no longer get
        through (the listeners' queues are full)."""
        with self._lock:
            if not self._open.is_set():
                return
            self._open.clear()
            for listener, _ in self._listeners:
                listener.listen(0)
            self._fill()
        # an acceptor blocked in accept() takes one of those before it parks until the
        # heal: once each has parked, fill again
        for parked in self._parked:
            parked.wait(1.0)
        with self._lock:
            if not self._open.is_set():
                self._fill()

    def _fill(self) -> None:
        for listener, _ in self._listeners:
            for _ in range(FILL):
                filler = socket.socket(listener.family, socket.SOCK_STREAM)
                filler.setblocking(False)
                try:
                    filler.connect(listener.getsockname())
                except (BlockingIOError, InterruptedError):
                    pass     # TCP: the handshake is under way or dropped: full
                except OSError:
                    filler.close()
                    break
                self._fillers.append(filler)

    def heal(self) -> None:
        with self._lock:
            for listener, _ in self._listeners:
                listener.listen(BACKLOG)
            fillers, self._fillers = self._fillers, []
            self._open.set()
        for filler in fillers:   # the proxy sees them closed and forgets them
            filler.close()

    def close(self) -> None:
        """Stop listening and close every connection (both sides see it closed)."""
        self._closed = True
        self._open.set()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
            sockets += self._fillers
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _keep(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _accept(self, listener: socket.socket, target, parked: threading.Event) -> None:
        while not self._closed:
            if not self._open.is_set():   # while cut, connections stay in the full queue
                parked.set()
                self._open.wait()
                parked.clear()
                continue
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
                try:
                    data = source.recv(1 << 16)
                except OSError:
                    data = b""
                # received (or closed) just as the cut came: held until the heal, as a
                # FIN or a reset over a dead link would be
                self._open.wait()
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (sink, source):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Partitions:
    """The proxies that can cut each metadata server of an HA cluster off: ``names``' ways
    in (clients, block servers and other servers reach ``addresses[name]`` through the
    first proxy, which holds the local socket too) and ways out to each etcd member
    (``etcd_endpoints(name)`` is the server's ``ha_etcd_endpoints``)."""

    def __init__(self, addresses: dict[str, str], etcd_endpoints: list[str]):
        self.proxies = {name: [CutProxy(address, meta=True)]
                        + [CutProxy(e.removeprefix("http://")) for e in etcd_endpoints]
                        for name, address in addresses.items()}

    def address(self, name: str) -> str:
        """Where the others reach the server ``name``."""
        return self.proxies[name][0].address

    def etcd_endpoints(self, name: str) -> str:
        """The server's ``ha_etcd_endpoints``, through its own proxies."""
        return ",".join(f"http://{p.address}" for p in self.proxies[name][1:])

    def cut(self, name: str) -> None:
        """Partition ``name`` from etcd and from everyone else, silently."""
        for proxy in self.proxies[name]:
            proxy.cut()

    def cut_from_etcd(self, name: str) -> None:
        """Partition ``name`` from etcd only: clients and block servers still reach it."""
        for proxy in self.proxies[name][1:]:
            proxy.cut()

    def heal(self, name: str) -> None:
        for proxy in self.proxies[name]:
            proxy.heal()

    def close(self) -> None:
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.close()
