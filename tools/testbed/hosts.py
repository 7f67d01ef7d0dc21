"""Hosts on one machine: network namespaces on a private bridge, with network faults.

``HostSet`` builds N "hosts", each a network namespace ``lfs-<tag>-<name>`` holding one end
of a veth pair (``eth0``, its own address in ``subnet``) whose other end is a port of the
bridge ``lfs-<tag>-br``. The bridge itself holds the subnet's first address, so the calling
process (in the root namespace) reaches every host; hosts reach each other over the bridge.

A command runs "on" a host through ``nsenter --net=...``: only the network namespace
changes, so FUSE mounts made there are visible everywhere (``ip netns exec`` would give the
command a mount namespace of its own). The command's process is the ``Popen``'s (nsenter
execs it), so it can be signalled by pid.

Faults, all undone by ``heal``: ``cut(src, dst)`` drops what ``src`` sends to ``dst``, in
one direction, so asymmetric cuts are possible. It is a route for ``dst`` in ``src``'s
namespace into ``void``, a link whose peer is down (and ARP off): packets vanish silently,
so a connect times out and an established connection hears nothing, as across a real
partition (a ``blackhole`` route would instead fail a local connect at once with EINVAL,
and this kernel has no dummy links). ``isolate`` cuts a host from every other one both
ways; ``link_down`` takes the bridge side of a host's link down (its packets vanish, its
own routes stay, as when a cable is pulled).

Needs: root, iproute2 (``ip netns``, bridge and veth links) and util-linux ``nsenter``;
``unavailable_reason()`` says which is missing. No netem, iptables or nft is used.

Concurrency contract: one ``HostSet`` per tag at a time; sets used at the same time need
distinct tags and distinct subnets (the bridge's address adds a route for the subnet to the
root namespace): the default subnet, ``free_subnet(tag)``, is one nothing routes yet. Entering a set first removes whatever a killed run with the same
tag left (namespaces, links, and the processes still inside those namespaces); leaving it
(also on an exception or KeyboardInterrupt) stops the processes it started and removes
everything it made. Methods are not thread-safe.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
# interface names hold at most 15 characters: "lfs-" + tag + "-" + "v" + two digits
_TAG = re.compile(r"^[a-z0-9]{1,7}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")


class HostsError(RuntimeError):
    """A namespace, link or route could not be made or changed."""


@dataclass(frozen=True)
class Host:
    name: str
    netns: str       # namespace name (under /var/run/netns)
    address: str     # its IPv4 address on the bridge
    veth: str        # the bridge side of its link, in the root namespace


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable_reason() -> str | None:
    """Why hosts cannot be built here (not root, no ``ip netns``, no ``nsenter``, no
    bridge/veth support), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"lfsprobe{os.getpid() % 10**6}"
    try:
        done = _ip("netns", "add", probe, check=False)
        if done.returncode != 0:
            return f"ip netns is unavailable: {done.stderr.strip()}"
        done = _ip("link", "add", probe, "type", "veth", "peer", "name", "eth0",
                   "netns", probe, check=False)
        if done.returncode != 0:
            return f"veth links are unavailable: {done.stderr.strip()}"
        done = _ip("link", "add", probe + "b", "type", "bridge", check=False)
        if done.returncode != 0:
            return f"bridges are unavailable: {done.stderr.strip()}"
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return f"ip failed: {exc}"
    finally:
        _ip("link", "del", probe + "b", check=False)
        _ip("link", "del", probe, check=False)
        _ip("netns", "del", probe, check=False)


def hosts_available() -> bool:
    return unavailable_reason() is None


def free_subnet(tag: str) -> str:
    """A /24 in 10.77.0.0-10.78.255.255 for ``tag``: the one its name picks (the same from
    run to run), or the next one the root namespace does not route already (another tag's
    set, a real network)."""
    bridge = f"lfs-{tag}-br"
    routed = []
    for line in _ip("-o", "-4", "route", "show").stdout.splitlines():
        words = line.split()
        if words and words[0] != "default" and f"dev {bridge}" not in line:
            routed.append(ipaddress.ip_network(words[0], strict=False))
    first = zlib.crc32(tag.encode()) % 512
    for n in range(first, first + 512):
        candidate = ipaddress.ip_network(f"10.{77 + n % 512 // 256}.{n % 256}.0/24")
        if not any(candidate.overlaps(net) for net in routed):
            return str(candidate)
    raise HostsError("no free /24 left in 10.77.0.0/15")


class HostSet:
    """N hosts on a private bridge (see the module docstring); a context manager."""

    def __init__(self, tag: str, names: list[str], subnet: str | None = None):
        """``subnet``: a private IPv4 network for the bridge and the hosts (default:
        ``free_subnet(tag)``)."""
        if not _TAG.match(tag):
            raise ValueError(f"tag {tag!r}: 1 to 7 lowercase letters or digits "
                             "(interface names hold 15 characters)")
        bad = [n for n in names if not _NAME.match(n)]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"host names must be distinct [a-z0-9_-] words: {names}")
        net = ipaddress.ip_network(subnet or free_subnet(tag))
        if net.version != 4 or not net.is_private or net.num_addresses < len(names) + 3:
            raise ValueError(f"subnet {subnet}: a private IPv4 subnet with room for "
                             f"{len(names)} hosts and the bridge")
        self.tag = tag
        self.prefix = f"lfs-{tag}-"
        self.net = net
        self.bridge = self.prefix + "br"
        addresses = list(net.hosts())
        self.bridge_address = str(addresses[0])
        self.hosts: dict[str, Host] = {
            name: Host(name, self.prefix + name, str(addresses[i + 1]), f"{self.prefix}v{i}")
            for i, name in enumerate(names)}
        self._procs: list[subprocess.Popen] = []
        self._cuts: set[tuple[str, str]] = set()
        self._down: set[str] = set()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def address(self, name: str) -> str:
        return self.hosts[name].address

    # -- lifecycle
    def __enter__(self) -> "HostSet":
        self.remove_stale()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _build(self) -> None:
        plen = self.net.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/{plen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
            _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("addr", "add", f"{host.address}/{plen}", "dev", "eth0", netns=host.netns)
            _ip("link", "set", "eth0", "up", netns=host.netns)
            # the sink of cuts: what is routed into it goes nowhere, without an error
            _ip("link", "add", "void", "type", "veth", "peer", "name", "voidpeer",
                netns=host.netns)
            _ip("link", "set", "void", "arp", "off", "up", netns=host.netns)

    def remove_stale(self) -> None:
        """Remove every namespace and link of this tag (a killed run's), first stopping
        the processes still inside those namespaces."""
        names = NETNS_DIR.glob(self.prefix + "*") if NETNS_DIR.is_dir() else []
        for path in names:
            _stop_pids(_ip("netns", "pids", path.name, check=False).stdout.split())
            _ip("netns", "del", path.name, check=False)
        for link in _links():
            if link.startswith(self.prefix):
                _ip("link", "del", link, check=False)

    def teardown(self) -> None:
        """Stop the processes started here, then remove the namespaces and links."""
        for proc in self._procs:
            if proc.poll() is None:
                _stop_pids([str(proc.pid)])
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        self._procs.clear()
        self.remove_stale()
        self._cuts.clear()
        self._down.clear()

    # -- running commands
    def command(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run on host ``name`` (network namespace only; mounts stay shared)."""
        return ["nsenter", f"--net={NETNS_DIR / self.hosts[name].netns}", "--", *argv]

    def popen(self, name: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``name``; it is stopped when the set is torn down."""
        proc = subprocess.Popen(self.command(name, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, name: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``argv`` on host ``name``."""
        return subprocess.run(self.command(name, argv), **kwargs)

    # -- faults
    def cut(self, src: str, dst: str) -> None:
        """Drop every packet ``src`` sends to ``dst`` (one direction)."""
        if (src, dst) not in self._cuts:
            _ip("route", "add", f"{self.hosts[dst].address}/32", "dev", "void",
                netns=self.hosts[src].netns)
            self._cuts.add((src, dst))

    def uncut(self, src: str, dst: str) -> None:
        if (src, dst) in self._cuts:
            _ip("route", "del", f"{self.hosts[dst].address}/32", "dev", "void",
                netns=self.hosts[src].netns)
            self._cuts.discard((src, dst))

    def cut_both(self, a: str, b: str) -> None:
        self.cut(a, b)
        self.cut(b, a)

    def isolate(self, name: str) -> None:
        """Cut ``name`` from every other host, both ways (the root namespace still
        reaches it: probes of the test keep working)."""
        for other in self.hosts:
            if other != name:
                self.cut_both(name, other)

    def link_down(self, name: str) -> None:
        """Take the bridge side of ``name``'s link down: everything it sends or is sent
        vanishes, the root namespace's included."""
        _ip("link", "set", self.hosts[name].veth, "down")
        self._down.add(name)

    def link_up(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].veth, "up")
        self._down.discard(name)

    def heal(self) -> None:
        """Undo every cut and bring every link up."""
        for src, dst in list(self._cuts):
            self.uncut(src, dst)
        for name in list(self._down):
            self.link_up(name)


def _links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    # "12: lfs-x-v0@if3: <...>": the name, without the peer suffix
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _stop_pids(pids: list[str]) -> None:
    """SIGKILL each pid (processes of this set's namespaces, by id)."""
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
