"""A ``ProcessCluster`` spread over hosts (``tools.testbed.hosts.HostSet``): the metadata server on
host ``meta``, block server i on host ``s<i>``, clients on hosts ``c0``, ``c1``, ...

    with host_cluster(tmp_path, n_storage=4, clients=2) as hc:
        hc.leasefs("c0", "put", local, "/f")        # the CLI, run on host c0
        hc.hosts.cut_both("s1", "meta")             # faults: tools.testbed.hosts
        hc.cluster.kill_storage(2)                  # the ProcessCluster underneath

Tests call ``require_hosts()`` first (it skips with the reason when namespaces cannot be
built: not root, no ``ip netns``) and are marked ``slow`` like every ``ProcessCluster`` test.

Names come from the checkout's folder name (``default_tag``) and the subnet is one nothing
routes yet (``tools.testbed.hosts.free_subnet``), so two checkouts running their tests at once on
one machine use distinct namespaces and subnets.

Clients away from the metadata host authenticate with a delegation token of the test's
user, fetched once on the metadata host through its local socket (which exists only in that
host's network namespace); ``token_file`` names it, ``env(host)``/``config()`` use it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from fs.client import authentication
from fs.rpc import RpcClient
from harness import REPO, ProcessCluster, make_test_config, mounted, wait_cluster_ready
from tools.testbed.hosts import HostSet, unavailable_reason

META = "meta"


def require_hosts() -> None:
    """Skip the calling test, with the reason, where hosts cannot be built."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"multi-host test needs network namespaces: {reason}")


def default_tag() -> str:
    """This checkout's tag (its folder's name, in the 7 characters a tag may hold)."""
    return (re.sub(r"[^a-z0-9]", "", REPO.name.lower()) or "lfs")[:7]


def storage_host(i: int) -> str:
    return f"s{i}"


@dataclass(frozen=True)
class Placement:
    """Where ``ProcessCluster`` runs each server: ``meta`` on host ``meta``, ``storage<i>``
    on host ``s<i>``, each bound to its host's address unless ``binds`` names another
    (e.g. ``{"storage3": "0.0.0.0"}``)."""
    hosts: HostSet
    binds: dict = field(default_factory=dict)

    def host_of(self, process: str) -> str:
        return META if process == "meta" else storage_host(int(process[len("storage"):]))

    def bind_host(self, process: str) -> str:
        return self.binds.get(process) or self.hosts.address(self.host_of(process))

    def command(self, process: str, argv: list[str]) -> list[str]:
        return self.hosts.command(self.host_of(process), argv)


class HostCluster:
    """A started ``ProcessCluster`` on ``hosts`` and the token its clients use."""

    def __init__(self, hosts: HostSet, cluster: ProcessCluster, token_file: Path):
        self.hosts = hosts
        self.cluster = cluster
        self.token_file = token_file

    @property
    def meta_address(self) -> str:
        return self.cluster.meta_address

    def env(self, host: str) -> dict:
        """Environment of a CLI or script run on ``host`` (any host, the metadata one
        included): the cluster's address and the token."""
        return {**self.cluster.env, "LEASEFS_TOKEN_FILE": str(self.token_file)}

    def config(self, **overrides):
        """A client's settings in the test process (the root namespace reaches every host)."""
        return make_test_config(token_file=str(self.token_file), **overrides)

    def leasefs(self, host: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        """``leasefs ARGS`` run on ``host`` as a user there runs it (text output captured)."""
        return self.hosts.run(host, [sys.executable, "-m", "tools", *map(str, args)],
                              env=self.env(host), capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """A process on ``host`` with the client environment (stopped at teardown)."""
        return self.hosts.popen(host, argv, env=self.env(host), cwd=REPO, **kwargs)

    def mount(self, host: str, name: str, *extra: str):
        """``with hc.mount(host, name) as m``: a FUSE mount (``harness.Mount``) run on
        ``host``, at ``m.mp`` here as well (only the network namespace differs); stopped
        cleanly at the end (``harness.mounted``)."""
        return contextmanager(mounted)(self.cluster, name, *extra, env=self.env(host),
                                       launcher=partial(self.hosts.command, host))

    def report(self) -> dict:
        """The metadata server's ``report``, asked from the test process."""
        async def ask():
            config = self.config()
            async with RpcClient(self.meta_address, "hostkit-probe", retry_seconds=5.0,
                                 timeout=5.0, **authentication(config, self.meta_address)) as rpc:
                return await rpc.call("report", {})
        return trio.run(ask)

    def wait_ready(self, n_live: int | None = None, timeout: float = 60.0) -> dict:
        n = self.cluster.n_storage if n_live is None else n_live
        return trio.run(wait_cluster_ready, self.meta_address, n, timeout, self.config())


def _fetch_token(hosts: HostSet, cluster: ProcessCluster, path: Path) -> None:
    """A delegation token of this user, fetched on the metadata host over its local socket
    (named explicitly: the default is only tried for a loopback address)."""
    port = cluster.meta_address.rsplit(":", 1)[1]
    deadline = time.monotonic() + 30
    while True:
        done = hosts.run(META, [sys.executable, "-m", "tools", "token", "fetch", str(path),
                                "--meta", cluster.meta_address,
                                "--set", f"meta_socket=@leasefs-meta-{port}"],
                         env=cluster.env, capture_output=True, text=True, timeout=60, cwd=REPO)
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"token fetch on the metadata host failed:\n{done.stderr}")
        time.sleep(0.2)


@contextmanager
def host_cluster(base, n_storage: int = 4, clients: int = 2, settings: dict | None = None,
                 tag: str | None = None, subnet: str | None = None, wait: bool = True,
                 binds: dict | None = None, storage: bool = True):
    """Hosts ``meta``, ``s0``.. and ``c0``.. with the servers started (all block servers
    live unless ``wait`` is False; none started when ``storage`` is False: the test starts
    them with ``hc.cluster.start_storage(i)``; ``binds``: ``Placement.binds``); everything
    stopped and removed on exit."""
    tag = tag or default_tag()
    names = [META, *map(storage_host, range(n_storage)), *(f"c{i}" for i in range(clients))]
    with HostSet(tag, names, subnet) as hosts:
        cluster = ProcessCluster(base, n_storage, settings, placement=Placement(hosts, binds or {}))
        try:
            cluster.start_meta()
            for i in range(n_storage if storage else 0):
                cluster.start_storage(i)
            token = Path(base) / "client.token"
            _fetch_token(hosts, cluster, token)
            hc = HostCluster(hosts, cluster, token)
            if wait and storage:
                hc.wait_ready()
            yield hc
        finally:
            cluster.stop()
