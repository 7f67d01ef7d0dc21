"""leasefs across hosts: network namespaces on a private bridge (``tools.hosts``), servers
and clients each on its own host (``hostkit``), faults by routes into nothing and links
taken down."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hostkit import require_hosts
from tools.hosts import HostSet

_LISTEN = """
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""


def _connects(hosts: HostSet, src: str, dst: str, port: int) -> str:
    """``ok``, or the error of a TCP connect from host ``src`` to ``dst``."""
    done = hosts.run(src, [sys.executable, "-c", "import socket, sys; socket.create_connection("
                           "(sys.argv[1], int(sys.argv[2])), timeout=1)",
                           hosts.address(dst), str(port)], capture_output=True, text=True)
    return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def test_host_faults_cut_one_direction_and_heal(tmp_path):
    """Each fault stops exactly the traffic it names, silently (a timeout, as across a real
    partition), and heal restores all of it; a stale set of the same tag is removed."""
    require_hosts()
    from hostkit import default_subnet, default_tag
    tag = default_tag()
    port = 9999
    stale = HostSet(tag, ["x"], default_subnet(tag)).__enter__()   # as a killed run leaves it
    leftover = stale.popen("x", ["sleep", "600"])
    with HostSet(tag, ["a", "b", "c"], default_subnet(tag)) as hosts:
        assert leftover.wait(10) is not None      # the killed run's process is gone
        for name in "abc":
            proc = hosts.popen(name, [sys.executable, "-c", _LISTEN, str(port)],
                               stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "listening"
        assert _connects(hosts, "a", "b", port) == "ok"
        hosts.cut("a", "b")
        assert "timed out" in _connects(hosts, "a", "b", port)
        assert _connects(hosts, "a", "c", port) == "ok"
        assert _connects(hosts, "c", "b", port) == "ok"
        hosts.link_down("c")
        assert "timed out" in _connects(hosts, "b", "c", port)
        hosts.heal()
        assert _connects(hosts, "a", "b", port) == "ok"
        assert _connects(hosts, "b", "c", port) == "ok"
        netns = hosts["a"].netns
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netns not in listed and stale["x"].netns not in listed
