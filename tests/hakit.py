"""An HA cluster for tests: a real 3-member etcd, metadata servers (``ha = etcd``) and block
servers as real ``python -m tools`` processes on loopback.

``HACluster(tmp_path, n_meta=2, observers=0, n_storage=3)``: ``meta0``..``meta<n-1>`` start
as standbys (the first to campaign becomes active), then the observers; every process gets
the whole list of metadata addresses (``meta_address``), so clients and block servers move
between them on their own. The metadata servers share one cluster key file (block servers
authenticate to each). Processes and etcd members are stopped by their own pids.

``cuttable=True``: every metadata server reaches each etcd member through proxies of its
own, and everyone else (clients, block servers, the other metadata servers) reaches it
through one more (``tools.testbed.cutproxy``); ``cut(name)`` silences them all at once, a network
partition of that server that kills nothing and resets no connection
(``cut_from_etcd(name)``: only its ways to etcd, the other servers keep theirs); ``heal(name)``
ends it. ``address(name)`` is then the proxied address; ``direct(name)`` the server's own port.

``hdfs=True``: every metadata server answers Hadoop's client on a port of its own too
(``hdfs_address(name)``); ``hdfs_conf()`` are the client settings of a nameservice
``leasefs`` naming them all (Hadoop's configured failover proxy provider).
"""

from __future__ import annotations

import math
import random
import signal
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from etcd_cluster import EtcdCluster
from fs.client import AsyncClient
from fs.config import Config
from fs.errors import sole_exception
from fs.rpcclient import call_each
from fs.rpcclient import PROBE_PAUSE, PROBE_SHARE, RpcClient
from harness import ProcessCluster, free_port, wait_cluster_ready, wait_stopped
from tools.bench.ha import split_failover
from tools.testbed.cutproxy import Partitions

#: election timeout of the tests' metadata servers (the etcd lease TTL)
ELECTION_TIMEOUT = 2.0
#: etcd (3.4) revokes an expired lease at its lessor's next sweep, one every 500 ms: the
#: leader key goes up to that long after the lease's TTL ran out
ETCD_EXPIRY_SWEEP = 0.5
#: a campaigning standby's poll for the leader key (``HALog.poll``)
CAMPAIGN_POLL = 0.1
#: a create and close through the new active (two journal batches through etcd: ~5 ms on a
#: quiet machine, up to ~0.2 s measured at load 12 on 2 cores)
FIRST_CREATE = 0.3


def election_bound(election_timeout: float) -> float:
    """Seconds from a kill, freeze or cut of the active to its successor's election win
    (``ha_status``'s ``elected_at``), at worst: the lease's TTL (its last keepalive reached
    etcd before the fault), etcd's expiry sweep, one campaign poll."""
    return election_timeout + ETCD_EXPIRY_SWEEP + CAMPAIGN_POLL


def successor_bound(election_timeout: float, connecting: bool = False) -> float:
    """Seconds from the successor serving as active (``active_at``) to a client's first
    create through it, at worst: the pause between two probes of a silent server or two
    cycles of a list whose other server said standby (``silence`` × ``PROBE_PAUSE``), a
    probe's wait for a server that does not answer (× ``PROBE_SHARE``), the create.
    ``connecting``: a new client may be in a connect to the cut-off server when the
    successor takes over, which gives up after ``silence``."""
    silence = Config().replace(ha_election_timeout=election_timeout).rpc_silence
    return (silence * (PROBE_PAUSE + PROBE_SHARE + (1 if connecting else 0)) + FIRST_CREATE)


def check_failover_parts(parts: list[dict], rounds: int, election_timeout: float,
                         connecting: bool = False, log: str = "") -> None:
    """Each round's failover as the successor records it (``bench ha``'s ``*_parts``,
    ``tools.bench.ha.split_failover``): its election within the lease's TTL and etcd's
    expiry sweep of the fault, and the clients' first create within what leasefs adds once
    it serves (``successor_bound``; ``connecting``: for ``client_new``, a client started at
    a cut). Not the sum: CPU starvation stretches etcd's part at load, and the sum then
    hides whose it is. ``log``: the run's progress lines, shown with a failure."""
    assert len(parts) == rounds and all(parts), (parts, log)
    print("failover parts (s):", [{k: round(v, 3) for k, v in p.items()} for p in parts])
    for part in parts:
        assert part["election"] <= election_bound(election_timeout), (parts, log)
        assert part["takeover"] + part["client"] <= successor_bound(election_timeout), \
            (parts, log)
        if "client_new" in part:
            assert part["takeover"] + part["client_new"] <= successor_bound(
                election_timeout, connecting), (parts, log)


def call(address: str, method: str, **args):
    """One call to the metadata server at ``address`` only, not retried: what it answers,
    or the error it raised."""
    async def once():
        async with RpcClient(address, "test-ha", retry_seconds=0) as rpc:
            return await rpc.call(method, args)
    try:
        return trio.run(once)
    except BaseExceptionGroup as group:
        raise sole_exception(group) from None


def ha_status(address: str, timeout: float = 2.0) -> dict | None:
    """The server's ``ha_status`` answer, or None when it does not answer."""
    return trio.run(partial(call_each, [address], timeout=timeout))[address][0]


class HACluster(ProcessCluster):
    def __init__(self, base_dir, n_meta: int = 2, observers: int = 0, n_storage: int = 3,
                 settings: dict | None = None, election_timeout: float = ELECTION_TIMEOUT,
                 cuttable: bool = False, hdfs: bool = False):
        base = Path(base_dir)
        self.etcd = EtcdCluster((base / "etcd"))
        self.names = [f"meta{i}" for i in range(n_meta + observers)]
        self.observers = set(self.names[n_meta:])
        super().__init__(base, n_storage, {
            "ha": "etcd", "ha_prefix": f"/leasefs/test-{free_port()}",
            "ha_election_timeout": election_timeout,
            "cluster_key_file": str(base / "cluster.key"), **(settings or {})})
        self.meta_ports = {name: free_port() for name in self.names}
        self.hdfs_ports = {name: free_port() if hdfs else 0 for name in self.names}
        self.cuttable = cuttable
        self.cuts: Partitions | None = None    # made at start, once etcd's ports are known
        self.meta_address = ",".join(self.address(name) for name in self.names)

    def direct(self, name: str) -> str:
        """The metadata server's own RPC address (past its proxy, when cuttable)."""
        return f"127.0.0.1:{self.meta_ports[name]}"

    def address(self, name: str) -> str:
        """Where clients reach the metadata server ``name``."""
        return self.cuts.address(name) if self.cuts else self.direct(name)

    def hdfs_address(self, name: str) -> str:
        """Where Hadoop's client reaches the metadata server ``name`` (``hdfs=True``)."""
        return f"127.0.0.1:{self.hdfs_ports[name]}"

    def hdfs_conf(self, names: list[str] | None = None, nameservice: str = "leasefs") -> dict:
        """Hadoop client settings for ``hdfs://<nameservice>/``: the metadata servers
        ``names`` (default all, in order) behind the configured failover proxy provider."""
        names = names or self.names
        ns = nameservice
        return {"dfs.nameservices": ns, f"dfs.ha.namenodes.{ns}": ",".join(names),
                **{f"dfs.namenode.rpc-address.{ns}.{n}": self.hdfs_address(n) for n in names},
                f"dfs.client.failover.proxy.provider.{ns}":
                    "org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider"}

    def _set_args(self, name: str | None = None) -> list[str]:
        if self.cuts is None or name not in self.names:
            return super()._set_args(name)
        return [*super()._set_args(name), "--set",
                f"ha_etcd_endpoints={self.cuts.etcd_endpoints(name)}"]

    def cut(self, name: str) -> None:
        """Partition ``name`` from etcd and from everyone else, silently."""
        self.cuts.cut(name)

    def cut_from_etcd(self, name: str) -> None:
        """Partition ``name`` from etcd only, silently; the others keep theirs."""
        self.cuts.cut_from_etcd(name)

    def heal(self, name: str) -> None:
        self.cuts.heal(name)

    def config(self):
        """A client's settings for this cluster: its election timeout too, from which a
        client derives how long a silent server may keep its calls (``rpc_silence``)."""
        return super().config().replace(
            ha_election_timeout=self.settings["ha_election_timeout"])

    def meta_dir(self, name: str = "meta0") -> Path:
        return self.base / name

    # -- lifecycle
    def start(self, wait: bool = True):
        (self.base / "etcd").mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        self.settings["ha_etcd_endpoints"] = ",".join(self.etcd.endpoints)
        if self.cuttable:
            self.cuts = Partitions({name: self.direct(name) for name in self.names},
                                   self.etcd.endpoints)
            self.meta_address = ",".join(self.address(name) for name in self.names)
        for name in self.names:
            self.start_one(name)
            if name == self.names[0]:
                self.wait_role(name, "active", timeout=30)
        for i in range(self.n_storage):
            self.start_storage(i)
        if wait:
            self.wait_ready()
        return self

    def start_one(self, name: str) -> None:
        self.ports[name] = self.meta_ports[name]
        role = ["--set", "ha_role=observer"] if name in self.observers else []
        # the other servers' addresses: where a follower behind the log finds an image
        self._spawn(name, ["meta", "--data", str(self.meta_dir(name)), "--http-port", "0",
                           "--set", f"ha_node_id={name}", "--set",
                           f"meta_address={self.meta_address}", *role,
                           "--hdfs-port", str(self.hdfs_ports[name])])

    def start_storage(self, i: int):
        self._spawn(f"storage{i}", ["storage", "--data", str(self.storage_dir(i)),
                                    "--meta", self.meta_address])

    def wait_ready(self, n_live: int | None = None, timeout: float = 60.0) -> dict:
        n = self.n_storage if n_live is None else n_live
        active = self.wait_active(timeout)
        return trio.run(wait_cluster_ready, self.address(active), n, timeout, self.config())

    def stop(self):
        try:
            super().stop()
        finally:
            self.etcd.stop()
            if self.cuts is not None:
                self.cuts.close()

    # -- roles
    def statuses(self) -> dict[str, dict | None]:
        return {name: ha_status(self.address(name)) for name in self.names}

    def active(self) -> str | None:
        for name, status in self.statuses().items():
            if status and status["role"] == "active":
                return name
        return None

    def wait_role(self, name: str, role, timeout: float = 20.0) -> dict:
        """Until ``name`` reports ``role`` (or one of a tuple of roles)."""
        roles = (role,) if isinstance(role, str) else tuple(role)
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            status = ha_status(self.address(name))
            if status and status["role"] in roles:
                return status
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.log_tail(name)}")
            time.sleep(0.05)
        raise TimeoutError(f"{name} is not {role} after {timeout} s (last {status}):\n"
                           f"{self.log_tail(name)}")

    def wait_active(self, timeout: float = 20.0, besides: str | None = None) -> str:
        """The name of the active server (not ``besides``) once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.names:
                if name == besides:
                    continue
                status = ha_status(self.address(name), timeout=0.5)
                if status and status["role"] == "active":
                    return name
            time.sleep(0.05)
        raise TimeoutError(f"no active metadata server after {timeout} s: {self.statuses()}")

    def active_and_standby(self, timeout: float = 20.0) -> tuple[str, str]:
        """(active, standby) of a two-server cluster once both have their roles."""
        active = self.wait_active(timeout)
        standby = next(n for n in self.names if n != active)
        self.wait_role(standby, "standby", timeout)
        return active, standby

    def kill_meta(self, name: str = None, sig=signal.SIGKILL):
        self.kill(name or self.active(), sig)

    def pause(self, name: str) -> None:
        """SIGSTOP ``name`` (a metadata or block server); returns once it is stopped."""
        self.procs[name].send_signal(signal.SIGSTOP)
        wait_stopped(self.procs[name].pid)

    def resume(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)


#: what ``writes_through``'s client started after the failure writes
LATE_PATH = "/late"


@dataclass
class WritesThrough:
    """What ``writes_through`` saw: ``acked`` path → (data, monotonic time acknowledged);
    ``failures`` of the writers; ``failed_at``/``failed_wall``, the monotonic and wall
    clock time of the failure; ``first``/``late``: seconds from it to the first write
    acknowledged after it, and to the first write of a client started after it."""
    acked: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    failed_at: float = 0.0
    failed_wall: float = 0.0
    first: float = 0.0
    late: float = 0.0

    def lost(self, cluster: "HACluster") -> list[str]:
        """The acknowledged paths that do not read back as written."""
        with cluster.client() as client:
            return [p for p, (data, _) in self.acked.items() if client.read_file(p) != data]

    def parts(self, successor: dict) -> dict[str, float]:
        """The failover cut at the successor's election and take-over (its ``ha_status``),
        as ``bench ha`` cuts its rounds (``split_failover``; for ``check_failover_parts``):
        ``client`` ends at the writers' first write acknowledged after the election (one
        acknowledged before it was the old active's, its reply already on the way),
        ``client_new`` at the late client's; ``{}`` when the successor won no term since
        the failure."""
        elected = successor.get("elected_at")
        if elected is None:
            return {}
        since = self.failed_at + elected - self.failed_wall
        first = min((at for path, (_, at) in self.acked.items()
                     if path != LATE_PATH and at > since), default=math.inf)
        return split_failover(successor, self.failed_wall, first - self.failed_at, self.late)


def writes_through(cluster: "HACluster", fail, election: float, *, writers: int = 4,
                   watch=None, hold: float = 0.0) -> WritesThrough:
    """``writers`` clients write small files through ``cluster.meta_address``; once each
    has a few acknowledged, at a random moment of the active's keepalive cycle, ``fail()``
    runs (in a thread: SIGSTOP, a cut), then a new client writes one file. Returns once
    both the writers and it got through and ``hold`` s (at least 0.5) have passed since the
    failure; ``watch(seen, stop)``, if given, runs from the failure until then."""
    config = cluster.config()
    seen = WritesThrough()

    async def writer(i: int, stop: trio.Event) -> None:
        async with AsyncClient(cluster.meta_address, config=config,
                               client_name=f"writer-{i}") as client:
            n = 0
            while not stop.is_set():
                n += 1
                path, data = f"/load/w{i}/{n}", f"{i}:{n}:".encode() * 512
                try:
                    await client.write_file(path, data)
                except Exception as exc:   # noqa: BLE001 - the test lists them
                    seen.failures.append(f"{path}: {exc!r}")
                    continue
                seen.acked[path] = (data, time.monotonic())

    def fail_stamped() -> tuple[float, float]:
        """``fail()``, then the monotonic and wall clock: taken in its own thread, as the
        thread's return may wait a while for the busy trio thread"""
        fail()
        return time.monotonic(), time.time()

    async def main() -> None:
        stop = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(writers):
                    nursery.start_soon(writer, i, stop)
                while len(seen.acked) < 5 * writers:
                    await trio.sleep(0.01)
                # fixed-sleep: the failure lands at a random point of the writes: chaos timing
                await trio.sleep(random.uniform(0, election / 3))
                at, seen.failed_wall = await trio.to_thread.run_sync(fail_stamped)
                seen.failed_at = at
                if watch is not None:
                    nursery.start_soon(watch, seen, stop)
                async with AsyncClient(cluster.meta_address, config=config,
                                       client_name="late") as late:
                    await late.write_file(LATE_PATH, b"after the failure")
                seen.late = time.monotonic() - at
                seen.acked[LATE_PATH] = (b"after the failure", at + seen.late)
                while not any(t > at for _, t in seen.acked.values()):
                    await trio.sleep(0.01)
                seen.first = min(t for _, t in seen.acked.values() if t > at) - at
                # fixed-sleep: the writers go on through the new active for the rest of
                # the hold time
                await trio.sleep(max(0.5, hold - (time.monotonic() - at)))
                stop.set()

    trio.run(main)
    return seen
