"""``leasefs bench ha``: how long a metadata failover takes as a client sees it, and how far
a standby trails the active (ha = etcd).

Why: failover speed is a figure of the product (kill -9 of the active → the first create a
client gets through; ``haadmin -failover`` → the same), as is the standby's lag under load;
both are timings, so they are measured here, not asserted in tests.

On a private HA cluster of its own (``private_ha_cluster``: 3 etcd members on loopback from
``tools.cluster.etcd``, two metadata servers that campaign, ``leasefs meta`` processes in a fresh
folder; no block servers: a create and close of an empty file is metadata only):

1. Kill rounds (``--rounds``, default 30): a client creates and closes a new empty file
   every ``--interval`` s (default 10 ms) through the address list of both servers; the
   active is killed with SIGKILL; the time from the kill to the end of the first create
   that succeeds after it is the round's figure; the killed server is started again and
   waited for as a caught-up standby before the next round.
2. Freeze rounds (``--freeze``, default 10): the same with SIGSTOP instead of the kill
   (a long pause, a stuck disk: the frozen server keeps its connections open and answers
   nothing); from the stop to the end of the first create that succeeds after it. The
   frozen server gets SIGCONT once that create is through (or after ``--freeze-seconds``,
   default 30, if none is) and is waited for as a caught-up standby.
3. Partition rounds (``--partition``, default 10): every server reaches each etcd member,
   and every client reaches every server, through proxies that can go silent
   (``tools.testbed.cutproxy``); the active's are cut at once (nothing killed, no connection
   reset, a connect to it hangs): from the cut to the end of the first create of the
   running client (a call in flight or about to be), and to the end of the first create
   of a client started at the cut. The cut is healed once both are through (or after
   ``--freeze-seconds``) and the old active waited for as a caught-up standby. Kill
   rounds time a client started at the kill too, for comparison.
4. Graceful rounds (``--graceful``, default 10): the same with ``ha_failover`` (``haadmin
   -failover``) instead of the kill: from the call to the end of the first create begun
   after its answer (from then on the old active refuses every call, so that create is
   the new active's).
5. Lag (``--lag-seconds``, default 10, at ``--rate`` mutations/s, default 500): one client
   makes folders at that pace on the active; the standby's lag samples (the time from the
   active's append to its own apply, per log entry) give p50/p99/max.

Concurrency contract: a CLI process; the client runs in one ``trio.run`` per phase; server
processes are started, killed and stopped by their own pids only. Progress lines on stderr,
results on stdout.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import trio

from fs.errors import LeaseFSError
from fs.rpcbase import format_address
from fs.rpcclient import call_each

from ..cluster.processes import process_state
from ..common import Command, SOURCE_TREE
from ..formatting import UsageError, format_table
from ..progress import StatusLine
from .base import baseline_dir, percentile


def signal_and_wait(proc: subprocess.Popen | None, sig=signal.SIGKILL) -> None:
    """Send ``sig`` to a running ``proc`` and wait for its exit (SIGKILL after 30 s)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PrivateHACluster:
    """etcd members and metadata server processes of one private HA cluster."""

    def __init__(self, folder: str, members, n_meta: int, settings: dict, status,
                 engine_cpus: set[int] | None = None, cuttable: bool = False):
        from ..cluster import etcd
        from ..testbed.cutproxy import Partitions

        self.folder = folder
        self.members = members
        self.status = status
        self.names = [f"meta{i}" for i in range(n_meta)]
        self.ports = {name: etcd.free_port() for name in self.names}
        self.procs: dict[str, subprocess.Popen] = {}
        # CPUs of the replication engine's side: etcd and every server but the first
        self.engine_cpus = engine_cpus
        # no block servers (metadata calls only): never held in start-up safe mode
        self.settings = {"ha": "etcd", "ha_etcd_endpoints": etcd.endpoints(members),
                         "ha_prefix": f"/leasefs/bench-{os.getpid()}",
                         "safemode_min_storage": 0, **settings}
        # cuttable: the proxies that partition each server (clients reach it through them)
        self.cuts = Partitions({name: self.address(name) for name in self.names},
                               [m.client_url for m in members]) if cuttable else None

    def address(self, name: str) -> str:
        """The server's own address (the benchmark's probes go there)."""
        return f"127.0.0.1:{self.ports[name]}"

    def client_address(self, name: str) -> str:
        """Where the clients reach the server (through its proxy when cuttable)."""
        return self.cuts.address(name) if self.cuts else self.address(name)

    @property
    def addresses(self) -> str:
        """The clients' list."""
        return ",".join(self.client_address(n) for n in self.names)

    def start(self, name: str) -> None:
        cmd = [sys.executable, "-m", "tools", "meta", "--data",
               os.path.join(self.folder, name), "--host", self.address(name).rsplit(":", 1)[0],
               "--port", str(self.ports[name]), "--http-port", "0", "--hdfs-port", "0",
               "--log-level", "WARNING",
               "--set", f"ha_node_id={name}"]
        settings = dict(self.settings)
        if self.cuts:
            settings["ha_etcd_endpoints"] = self.cuts.etcd_endpoints(name)
        for key, value in settings.items():
            cmd += ["--set", f"{key}={value}"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (SOURCE_TREE, os.environ.get("PYTHONPATH")) if p))
        cpus = self.engine_cpus if name != self.names[0] else None
        with open(os.path.join(self.folder, f"{name}.log"), "ab") as log:
            self.procs[name] = self.popen(
                name, cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=SOURCE_TREE, start_new_session=True,
                preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)))

    def processes(self, active: str) -> dict[str, list[int]]:
        """Pids by role, for the benchmark's CPU accounting: the active, the other
        metadata servers, the etcd members."""
        return {"active": [self.procs[active].pid],
                "standby": [p.pid for n, p in self.procs.items() if n != active],
                "etcd": [m.pid for m in self.members if m.pid is not None]}

    def popen(self, name: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start server ``name``'s process (here; a subclass may place it elsewhere)."""
        return subprocess.Popen(cmd, **kwargs)

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        signal_and_wait(self.procs.get(name), sig)

    def status_of(self, name: str) -> dict | None:
        return trio.run(ha_status, self.address(name))

    def wait(self, name: str, role: str, timeout: float = 60.0,
             applied: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answer = self.status_of(name)
            if answer and answer["role"] == role and answer["applied_txid"] >= applied:
                return answer
            self._check_running(name)
            time.sleep(0.05)
        raise UsageError(f"metadata server {name} is not {role} after {timeout:g} s; see "
                         f"{os.path.join(self.folder, name + '.log')}")

    def _check_running(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise UsageError(f"metadata server {name} exited ({proc.returncode}); see "
                             f"{os.path.join(self.folder, name + '.log')}")

    def settled(self, applied: int = 0, timeout: float = 60.0) -> str:
        """The active server, once one says active and every other one standby having
        applied ``applied`` (a server woken from a freeze says active until it notices
        that its term is over)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            roles = {name: self.status_of(name) for name in self.names}
            active = [n for n, answer in roles.items() if answer and answer["role"] == "active"]
            if len(active) == 1 and all(
                    answer and answer["role"] == "standby" and answer["applied_txid"] >= applied
                    for n, answer in roles.items() if n != active[0]):
                return active[0]
            for name in self.names:
                self._check_running(name)
            time.sleep(0.05)
        raise UsageError(f"the metadata servers did not settle (one active, the others "
                         f"standby) in {timeout:g} s; see the logs in {self.folder}")

    def active(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.names:
                answer = self.status_of(name)
                if answer and answer["role"] == "active":
                    return name
            time.sleep(0.05)
        raise UsageError(f"no active metadata server after {timeout:g} s; see the logs in "
                         f"{self.folder}")


async def ha_status(address: str, reset_lag: bool = False) -> dict | None:
    """The server's ``ha_status`` answer, or None when it does not answer."""
    answers = await call_each([address], "ha_status", {"reset_lag": reset_lag},
                              name="bench-ha-probe")
    return answers[address][0]


@contextmanager
def private_ha_cluster(home: str, status, n_meta: int = 2, settings: dict | None = None,
                       engine_cpus: set[int] | None = None, cuttable: bool = False):
    """3 etcd members and ``n_meta`` metadata servers in a fresh folder under ``home``;
    yields a ``PrivateHACluster`` with an active server (the first); everything stopped at
    exit. ``engine_cpus``: the CPUs etcd and the other servers run on (the machines of the
    replication engine, as a deployment puts etcd apart from the active)."""
    from ..cluster import etcd

    folder = tempfile.mkdtemp(prefix=".bench-ha-", dir=home)
    members = etcd.plan(os.path.join(folder, "etcd"), os.path.join(folder, "logs"))
    procs = {}
    cluster = None
    try:
        status(f"starting 3 etcd members in {folder}")
        token = etcd.new_token()
        for member in members:
            procs[member.name] = etcd.spawn(member, members, token, cpus=engine_cpus)
        etcd.wait_healthy(members, procs)
        cluster = PrivateHACluster(folder, members, n_meta, settings or {}, status,
                                   engine_cpus, cuttable)
        for name in cluster.names:
            status(f"starting metadata server {name} (ha = etcd)")
            cluster.start(name)
            if name == cluster.names[0]:
                cluster.wait(name, "active")
        for name in cluster.names[1:]:
            cluster.wait(name, "standby")
        yield cluster
    finally:
        if cluster is not None:
            for name in cluster.names:
                cluster.kill(name, signal.SIGTERM)
            if cluster.cuts:
                cluster.cuts.close()
        etcd.stop(members)
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the phases
def _client_config(election_timeout: float):
    from fs.config import Config

    return Config.load(env={}, rpc_retry_seconds=60.0, rpc_timeout=30.0,
                       ha_election_timeout=election_timeout)


async def _first_create(address: str, election_timeout: float) -> float:
    """A new client's first create and close: the monotonic time it ended."""
    from fs.client import AsyncClient

    async with AsyncClient(address, config=_client_config(election_timeout),
                           client_name="bench-ha-new") as client:
        out = await client.create(f"/bench-ha-new-{os.getpid()}-{time.monotonic_ns()}")
        await out.close()
        return time.monotonic()


async def _creator(address: str, interval: float, done: list, stop: trio.Event,
                   election_timeout: float) -> None:
    """Create and close empty files one after another; ``done`` gets ``(start, end,
    server)`` of each that succeeded: its monotonic times and the address (as in
    ``address``) of the server that answered its close."""
    from fs.client import AsyncClient

    config = _client_config(election_timeout)
    async with AsyncClient(address, config=config, client_name="bench-ha") as client:
        base = f"/bench-ha-{os.getpid()}"
        await client.mkdirs(base)
        n = 0
        while not stop.is_set():
            n += 1
            began = time.monotonic()
            try:
                out = await client.create(f"{base}/f{n}")
                await out.close()
                done.append((began, time.monotonic(), format_address(client.rpc.address)))
            except LeaseFSError:
                pass
            await trio.sleep(interval)


#: the failures a round can inflict on the active, as the results and the table name them
FAILURES = {"kill": "kill -9 of the active", "kill_new": "kill -9: a client started then",
            "freeze": "SIGSTOP of the active",
            "partition": "partition of the active",
            "partition_new": "partition: a client started then",
            "graceful": "haadmin -failover"}


#: the parts of a failover as the successor records them (``ha_status``'s wall clocks):
#: from the failure to its election win (etcd's lease expiry and the campaign), from the win
#: to serving as active (the log read to its end, the activation), from then to the end of
#: the client's first create through it (``client_new``: of a client started at the failure)
COMPONENTS = ("election", "takeover", "client", "client_new")


def split_failover(successor: dict, failed_at: float, seconds: float,
                   fresh: float | None = None) -> dict[str, float]:
    """A round's ``seconds`` (from the failure at wall clock ``failed_at`` to the first
    create's end) cut at the successor's ``elected_at``/``active_at``, and ``client_new``,
    the same last part of ``fresh`` (the round's figure for a client started at the
    failure); ``{}`` when the successor does not say (it won its term before this round, or
    an older server)."""
    elected, active = successor.get("elected_at"), successor.get("active_at")
    if elected is None or active is None or elected < failed_at:
        return {}
    parts = {"election": elected - failed_at, "takeover": active - elected,
             "client": failed_at + seconds - active}
    if fresh is not None:
        parts["client_new"] = failed_at + fresh - active
    return parts


def _failover_rounds(cluster: PrivateHACluster, rounds: int, mode: str, interval: float,
                     status, freeze_seconds: float = 30.0) -> dict[str, list[float]]:
    """Seconds from the failure (``FAILURES``) to the first create after it: ``{mode:
    figures}``, and for kill and partition rounds ``{mode + "_new": figures}`` of a client
    started at the failure."""
    figures: list[float] = []
    fresh: list[float] = []
    parts: list[dict[str, float]] = []
    graceful = mode == "graceful"
    election_timeout = cluster.settings["ha_election_timeout"]

    async def through_since(started: float, limit: float = math.inf,
                            not_by: str | None = None) -> bool:
        """Until a create that succeeded ends after ``started`` (a moment when the old
        active can no longer have answered it) and, with ``not_by``, was answered by
        another server (a frozen server's last reply can still be read after it stopped);
        False after ``limit``."""
        with trio.move_on_after(limit):
            while not (done and done[-1][1] > started and done[-1][2] != not_by):
                await trio.sleep(0.002)
            return True
        return False

    async def fresh_client(started: float, new: trio.Event) -> None:
        try:
            fresh.append(await _first_create(cluster.addresses, election_timeout) - started)
        except LeaseFSError as exc:
            status(f"a client started at the failure got no create through: {exc}")
            fresh.append(math.inf)
        finally:
            new.set()

    async def main():
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_creator, cluster.addresses, interval, done, stop,
                               election_timeout)
            while not done:
                await trio.sleep(0.01)
            # one active and the others standby (each round ends so too): a server that
            # lost its term early (etcd settling after its start) can still say active
            active = await trio.to_thread.run_sync(cluster.settled)
            for k in range(rounds):
                before = await ha_status(cluster.address(active))
                # at a random moment of the active's keepalive cycle (TTL/3)
                await trio.sleep(random.uniform(0, election_timeout / 3))
                started, started_wall = time.monotonic(), time.time()
                if graceful:
                    from fs.rpc import RpcClient
                    async with RpcClient(cluster.address(active), "bench-ha-admin") as rpc:
                        await rpc.call("ha_failover", {})
                    # from its answer on the old active refuses every call: the first
                    # create begun after it is served by the new one
                    since = time.monotonic()
                    while not (done and done[-1][0] > since):
                        await trio.sleep(0.002)
                elif mode == "freeze":
                    proc = cluster.procs[active]
                    proc.send_signal(signal.SIGSTOP)
                    try:
                        while process_state(proc.pid) not in ("T", "t"):
                            await trio.sleep(0.001)
                        stopped = time.monotonic()
                        if not await through_since(stopped, freeze_seconds,
                                                   cluster.client_address(active)):
                            status(f"no create in {freeze_seconds:g} s of freeze: SIGCONT")
                    finally:
                        proc.send_signal(signal.SIGCONT)
                    await through_since(stopped)
                elif mode == "partition":
                    cluster.cuts.cut(active)
                    started, started_wall = time.monotonic(), time.time()
                    new = trio.Event()
                    nursery.start_soon(fresh_client, started, new)
                    with trio.move_on_after(freeze_seconds):
                        await through_since(started)
                        await new.wait()
                    if not new.is_set() or not done[-1][1] > started:
                        status(f"not through in {freeze_seconds:g} s of partition: healed")
                    cluster.cuts.heal(active)
                    await through_since(started)
                    await new.wait()
                else:
                    new = trio.Event()
                    await trio.to_thread.run_sync(cluster.kill, active)   # waits for the exit
                    after = time.monotonic()
                    nursery.start_soon(fresh_client, started, new)
                    await through_since(after)
                    await new.wait()
                # the server that won the term the failure opened (not the failed one,
                # which a woken freeze or a healed cut may still show as active)
                won = [a for a in [await ha_status(cluster.address(n))
                                   for n in cluster.names if n != active]
                       if a and a.get("elected_at", 0) >= started_wall]
                if mode in ("kill", "partition"):
                    # the first create that ended after the failure (more ended while the
                    # new client got through); after a kill, once the server was gone; after
                    # a cut, once the successor won (a reply of the old active's could still
                    # be on its way through the proxy when it was cut)
                    since = after if mode == "kill" else started
                    if won:
                        since = max(since, started + won[0]["elected_at"] - started_wall)
                    figures.append(next(end for _, end, _ in done if end > since) - started)
                else:
                    figures.append(done[-1][1] - started)
                parts.append(split_failover(won[0], started_wall, figures[-1],
                                            fresh[-1] if fresh else None) if won else {})
                extra = f", a client started then {fresh[-1]:.2f} s" \
                    if mode in ("kill", "partition") else ""
                extra += "".join(f", {part} {parts[-1][part]:.2f} s" for part in COMPONENTS
                                 if part in parts[-1])
                if not won:
                    extra += ", and no other server won a term after the failure"
                status(f"{FAILURES[mode]} round {k + 1}/{rounds}: first create after "
                       f"{figures[-1]:.2f} s{extra}")
                if mode == "kill":
                    await trio.to_thread.run_sync(cluster.start, active)
                active = await trio.to_thread.run_sync(cluster.settled,
                                                       before["applied_txid"])
            stop.set()

    done: list[tuple[float, float, str]] = []
    trio.run(main)
    return {mode: figures, **({f"{mode}_new": fresh} if fresh else {}),
            f"{mode}_parts": parts}


def _lag(cluster: PrivateHACluster, seconds: float, rate: float, status) -> dict:
    """The standby's lag samples while one client makes ``rate`` folders a second."""
    active = cluster.active()
    standby = next(n for n in cluster.names if n != active)

    async def main():
        from fs.client import AsyncClient

        await ha_status(cluster.address(standby), reset_lag=True)
        async with AsyncClient(cluster.address(active), client_name="bench-ha-lag") as client:
            base = f"/bench-ha-lag-{os.getpid()}"
            await client.mkdirs(base)
            start = trio.current_time()
            n = 0
            async with trio.open_nursery() as nursery:
                while trio.current_time() - start < seconds:
                    n += 1
                    nursery.start_soon(client.mkdirs, f"{base}/d{n}")
                    await trio.sleep_until(start + n / rate)
            made = n
        await trio.sleep(0.5)
        answer = await ha_status(cluster.address(standby))
        return made, answer

    made, answer = trio.run(main)
    stats = answer.get("lag_stats", {}) if answer else {}
    status(f"lag at {rate:g} mutations/s for {seconds:g} s: {made} mkdirs, "
           f"p99 {stats.get('p99', 0) * 1e3:.1f} ms")
    return {"mutations": made, "rate": rate, "seconds": seconds, **stats}


def run_ha_bench(cmd: Command) -> int:
    a = cmd.args
    if (a.rounds < 0 or a.freeze < 0 or a.graceful < 0 or a.partition < 0 or a.rate <= 0
            or a.lag_seconds < 0 or a.freeze_seconds <= 0):
        raise UsageError("--rounds/--freeze/--partition/--graceful/--lag-seconds must be "
                         ">= 0, --rate and --freeze-seconds > 0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    status = StatusLine(enabled=not a.quiet)
    home = baseline_dir(a.home)
    results: dict = {}
    settings = {"ha_election_timeout": a.election_timeout}
    with private_ha_cluster(home, status, settings=settings,
                            cuttable=a.partition > 0) as cluster:
        for mode, rounds in (("kill", a.rounds), ("freeze", a.freeze),
                             ("partition", a.partition), ("graceful", a.graceful)):
            if rounds:
                results.update(_failover_rounds(cluster, rounds, mode, a.interval, status,
                                                a.freeze_seconds))
        if a.lag_seconds:
            results["lag"] = _lag(cluster, a.lag_seconds, a.rate, status)
    if a.json:
        cmd.out(json.dumps({"benchmark": "ha", "election_timeout": a.election_timeout,
                            "results": results}, indent=2))
        return 0
    rows = []
    for kind, label in FAILURES.items():
        figures = results.get(kind)
        if figures:
            rows.append([label, str(len(figures)), f"{percentile(figures, 50):.2f}",
                         f"{percentile(figures, 90):.2f}", f"{max(figures):.2f}"])
    cmd.out(f"bench ha: ha = etcd, election timeout {a.election_timeout:g} s; seconds from "
            f"the failure to the first create a client gets through")
    for line in format_table(["failover", "rounds", "p50 s", "p90 s", "max s"], rows):
        cmd.out(line)
    split = []
    for kind, label in FAILURES.items():
        parts = [p for p in results.get(f"{kind}_parts", []) if p]
        if parts:
            split.append([label, str(len(parts)), *(
                f"{percentile([p[c] for p in parts], 50):.2f} / {max(p[c] for p in parts):.2f}"
                if all(c in p for p in parts) else "-" for c in COMPONENTS)])
    if split:
        cmd.out("where the time goes, p50 / max s: election (the failure to the successor's "
                "win: etcd's lease expiry, the campaign), take-over (the win to serving as "
                "active), client (from then to the first create; client new: of a client "
                "started at the failure)")
        for line in format_table(["failover", "rounds", "election", "take-over", "client",
                                  "client new"], split):
            cmd.out(line)
    lag = results.get("lag")
    if lag:
        cmd.out(f"standby lag at {lag['rate']:g} mutations/s for {lag['seconds']:g} s "
                f"({lag['mutations']} mkdirs, {lag.get('count', 0)} log entries): p50 "
                f"{lag.get('p50', 0) * 1e3:.1f} ms, p99 {lag.get('p99', 0) * 1e3:.1f} ms, max "
                f"{lag.get('max', 0) * 1e3:.1f} ms")
    return 0


def register(bsub, common, shared) -> None:
    q = bsub.add_parser("ha", parents=[common],
                        help="metadata failover time (kill -9, SIGSTOP, partition, haadmin "
                             "-failover) and "
                             "standby lag on a private ha = etcd cluster",
                        description="Failover as a client sees it and the standby's lag, on "
                                    "a private cluster of 3 etcd members and 2 metadata "
                                    "servers.")
    q.add_argument("--rounds", type=int, default=30, help="kill -9 rounds (default 30)")
    q.add_argument("--freeze", type=int, default=10,
                   help="SIGSTOP rounds (default 10)")
    q.add_argument("--freeze-seconds", type=float, default=30.0,
                   help="longest freeze of a SIGSTOP round or cut of a partition round: "
                        "ended after it even if no create got through (default 30)")
    q.add_argument("--partition", type=int, default=10,
                   help="rounds of a silent network partition of the active from etcd and "
                        "its clients, through loopback proxies (default 10)")
    q.add_argument("--graceful", type=int, default=10,
                   help="haadmin -failover rounds (default 10)")
    q.add_argument("--interval", type=float, default=0.01,
                   help="seconds between two creates of the client (default 0.01)")
    q.add_argument("--lag-seconds", type=float, default=10.0,
                   help="seconds of the lag measurement (default 10; 0 = skip)")
    q.add_argument("--rate", type=float, default=500.0,
                   help="mutations per second during the lag measurement (default 500)")
    q.add_argument("--election-timeout", type=float, default=3.0,
                   help="ha_election_timeout of the private servers (default 3, the "
                        "setting's default)")
    q.add_argument("--home", default=None,
                   help="folder for the private cluster (default: the cluster home)")
    shared(q)
    q.set_defaults(func=run_ha_bench)
