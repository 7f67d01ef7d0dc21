"""``leasefs bench partition``: how long service stops when a server goes silent (a network
partition) against when it dies (kill -9), measured on hosts of their own.

Why: a killed server's peers learn of it at once (refused connections, reset streams), a
partitioned one's only by their timeouts; what a client waits in each case is a figure of
the product (the time to the first successful write after the fault), and the ratio
partition/kill says how much of it is waiting out timeouts. Timings, so measured here, not
asserted in tests.

The deployment (``tools.testbed.hosts.HostSet``: network namespaces on a private bridge, one
address each; root, iproute2 and nsenter needed): host ``etcd`` with 3 etcd members,
``meta0`` and ``meta1`` (ha = etcd, default settings, ``security = simple``: the clients'
hosts hold no token), block servers ``s0``..``s3``, and a client host ``client`` whose
client processes (agents: this module run with ``--agent``, printing what they do as JSON
lines with ``time.monotonic()`` times, one clock for every process of the machine) do the
writes and reads. A partition is ``HostSet.isolate``: everything the victim's host sends
to any other host and everything sent to it vanishes, without an error (the root namespace,
where this command runs, still reaches it: its probes are not part of the cut). A kill is
SIGKILL of the victim's process; after each round the victim is healed or restarted and
the cluster waited for (one active, the other standby having caught up; every block
server heartbeating). Rounds alternate partition and kill (``--rounds`` of each). Times
count from the moment the fault is wholly in place (the process reaped; every route of the
cut in), so what ends after it cannot have been served by the victim; whether the first
write through was already in flight at that moment is reported too:

1. ``active``: the HA active. A steady client creates, writes (1 KiB, kept in the
   namespace) and closes a new file every ``--interval`` s through both servers' addresses;
   at the fault a fresh client (a new one, the victim first in its address list, as a
   client configured before the failover finds it) does the same once. Figures: from the
   fault to the end of the first such write of each client that ends after it; and, in
   partition rounds, whether the cut-off active still said ``active`` then and when it
   stopped saying so (watched for ``2 x election timeout + 5`` s).
2. ``pipeline``: the middle block server of a write pipeline (replication 3, a 4th server
   to replace it). The writer writes 8 KiB and hflushes every ``--interval`` s into a file
   it starts anew before each round; figure: from the fault to the end of the first
   acknowledged hflush that ends after it.
3. ``replica``: the replica holder a reader that opened the file (``--read-size``, one block)
   before the fault will try first (not one it could not reach in an earlier round).
   Figure: from the fault to the end of the whole read, its bytes checked.

A round that does not get its write or read through in ``--round-timeout`` s is said to
have timed out (a lower bound), and the bench goes on. At the end each agent checks that
every write it was acknowledged is there, byte for byte (no acknowledged byte lost).

Concurrency contract: a CLI process; the main thread drives the rounds, one thread per
agent reads its output lines. Processes are started on their hosts through the
``HostSet`` and stopped by their own pids; the hosts are removed at exit, also on an error
or Ctrl-C. Progress lines on stderr, results on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from ..cluster import etcd
from ..common import Command, SOURCE_TREE, load_config
from ..formatting import UsageError, format_table, human_size, parse_settings, parse_size
from ..progress import StatusLine
from .base import baseline_dir, percentile
from .ha import PrivateHACluster, signal_and_wait

SCENARIOS = {"active": "HA active", "pipeline": "block server mid-pipeline",
             "replica": "reader's first replica"}
#: what each scenario measures, as the table names it: (key of the round, label)
MEASURES = {"active": (("seconds", "steady client write"), ("fresh_seconds",
                                                              "fresh client write")),
            "pipeline": (("seconds", "next hflush acknowledged"),),
            "replica": (("seconds", "whole read of the file"),)}
FAULTS = ("partition", "kill")
STORAGE = ("s0", "s1", "s2", "s3")
HOST_NAMES = ("etcd", "meta0", "meta1", *STORAGE, "client")
SMALL = b"x" * 1024
CHUNK = 8 << 10
ETCD_FIRST_PORT = 2379
#: seconds an agent gives one file's check (and the writer its last close) at the end
VERIFY_LIMIT = 60.0
META_PORT = 8020      # the servers' default ports: on hosts of their own, nothing else
STORAGE_PORT = 9866   # holds them


def chunk(path: str, i: int, size: int = CHUNK) -> bytes:
    """The ``i``-th chunk of a file written by an agent: says where it belongs, so a
    chunk lost, doubled or misplaced shows when the file is checked."""
    head = f"{path}:{i:010d}:".encode()
    return (head * (size // len(head) + 1))[:size]


def content(path: str, size: int) -> bytes:
    return b"".join(chunk(path, i) for i in range(-(-size // CHUNK)))[:size]


# --------------------------------------------------------------------------- agents
def _agent_config(settings: dict):
    from fs.config import Config
    return Config.load(env={}, **settings)


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


async def _commands(send_channel) -> None:
    """Each line of stdin, parsed, into ``send_channel``; EOF ends it (the bench left)."""
    import trio

    stream = trio.lowlevel.FdStream(os.dup(0))
    buf = b""
    async with send_channel:
        while True:
            data = await stream.receive_some(4096)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    await send_channel.send(json.loads(line))


async def _write_small(client, path: str) -> None:
    out = await client.create(path)
    await out.write(SMALL)
    await out.close()


async def _create_agent(args, config) -> None:
    """Role ``create``: the steady client's loop; ``fresh`` commands start a fresh client."""
    import trio

    from fs.client import AsyncClient
    from fs.errors import LeaseFSError

    base = f"{args.dir}/create"
    acked: list[str] = []

    async with AsyncClient(args.meta, config=config, client_name="bench-partition-steady") \
            as client:
        await client.mkdirs(base)

        async def steady():
            n = 0
            while True:
                n += 1
                path = f"{base}/s{n}"
                began = time.monotonic()
                try:
                    await _write_small(client, path)
                except LeaseFSError as exc:
                    _emit(ev="error", client="steady", t=time.monotonic(), error=str(exc))
                else:
                    acked.append(path)
                    _emit(ev="ok", client="steady", began=began, end=time.monotonic())
                await trio.sleep(args.interval)

        async def fresh(k: int, order: str, limit: float):
            path = f"{base}/fresh{k}"
            began = time.monotonic()
            error = f"no write through in {limit:g} s"
            with trio.move_on_after(limit):
                try:
                    async with AsyncClient(order, config=config,
                                           client_name=f"bench-partition-fresh-{k}") as c:
                        await _write_small(c, path)
                except (LeaseFSError, OSError) as exc:
                    error = str(exc) or type(exc).__name__
                else:
                    acked.append(path)
                    _emit(ev="ok", client="fresh", id=k, began=began, end=time.monotonic())
                    return
            _emit(ev="failed", client="fresh", id=k, t=time.monotonic(), error=error)

        send, receive = trio.open_memory_channel(16)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_commands, send)
            nursery.start_soon(steady)
            _emit(ev="ready")
            async for cmd in receive:
                if cmd["cmd"] == "fresh":
                    nursery.start_soon(fresh, cmd["id"], cmd["order"], cmd["limit"])
                elif cmd["cmd"] == "verify":
                    nursery.cancel_scope.cancel()
                    break
            else:
                nursery.cancel_scope.cancel()
        listed = {status.path.rsplit("/", 1)[-1]: status.length
                  for status in await client.list_status(base)}
        lost = [p for p in acked if listed.get(p.rsplit("/", 1)[-1]) != len(SMALL)]
        _emit(ev="verified", files=len(acked), bytes=len(acked) * len(SMALL),
              lost=lost[:20], lost_count=len(lost))


async def _write_agent(args, config) -> None:
    """Role ``write``: write and hflush a chunk every ``interval`` s; ``roll`` closes the
    file and starts another, whose pipeline is announced once its bytes outgrew
    ``inline_max`` (before, an hflush keeps them in the namespace)."""
    import trio

    from fs.client import AsyncClient
    from fs.errors import LeaseFSError

    base = f"{args.dir}/write"
    files: dict[str, int] = {}     # path -> bytes acknowledged (hflushed)
    wanted = {"roll": False, "stop": False}

    async with AsyncClient(args.meta, config=config, client_name="bench-partition-writer") \
            as client:
        await client.mkdirs(base)

        async def writer():
            k = 0
            stream = None
            announce = False
            while not wanted["stop"]:
                if stream is not None and wanted["roll"]:
                    try:
                        await stream.close()
                    except LeaseFSError as exc:
                        _emit(ev="error", t=time.monotonic(), error=f"close: {exc}")
                    stream = None
                if stream is None:
                    wanted["roll"] = False
                    k += 1
                    path = f"{base}/w{k}"
                    try:
                        stream = await client.create(path, replication=3)
                    except LeaseFSError as exc:
                        _emit(ev="error", t=time.monotonic(), error=f"create: {exc}")
                        await trio.sleep(args.interval)
                        continue
                    files[path] = 0
                    announce = True
                began = time.monotonic()
                try:
                    await stream.write(chunk(path, files[path] // CHUNK))
                    await stream.hflush()
                except LeaseFSError as exc:
                    # this stream is done for: the next write goes to a new file
                    _emit(ev="error", t=time.monotonic(), error=str(exc))
                    stream.abort(exc)
                    stream = None
                    continue
                files[path] += CHUNK
                _emit(ev="ack", began=began, end=time.monotonic())
                # past inline_max the bytes are in a block's pipeline, not the namespace
                if announce and files[path] > config.inline_max:
                    announce = False
                    located = await client.get_block_locations(path)
                    nodes = [n["address"] for n in located["blocks"][-1]["locations"]]
                    _emit(ev="pipeline", path=path, nodes=nodes)
                await trio.sleep(args.interval)
            if stream is not None:
                await stream.close()
            stopped.set()

        stopped = trio.Event()
        send, receive = trio.open_memory_channel(16)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_commands, send)
            nursery.start_soon(writer)
            _emit(ev="ready")
            async for cmd in receive:
                if cmd["cmd"] == "roll":
                    wanted["roll"] = True
                elif cmd["cmd"] == "verify":
                    break
            wanted["stop"] = True
            with trio.move_on_after(VERIFY_LIMIT):
                await stopped.wait()
            nursery.cancel_scope.cancel()
        lost = []
        for path, size in files.items():
            got = None
            with trio.move_on_after(VERIFY_LIMIT):
                try:
                    got = await client.read_file(path)
                except LeaseFSError as exc:
                    lost.append(f"{path}: {size} bytes acknowledged, unreadable: {exc}")
                    continue
            if got is None:
                lost.append(f"{path}: {size} bytes acknowledged, not read in "
                            f"{VERIFY_LIMIT:g} s")
            elif got[:size] != content(path, size):
                lost.append(f"{path}: {size} bytes acknowledged, {len(got)} read"
                            + (", content differs" if len(got) >= size else ""))
        _emit(ev="verified", files=len(files), bytes=sum(files.values()), lost=lost[:20],
              lost_count=len(lost))


async def _read_agent(args, config) -> None:
    """Role ``read``: write the file to read (once); ``open`` opens it and says where
    its block is read first; ``read`` reads it whole and checks the bytes."""
    import trio

    from fs.client import AsyncClient
    from fs.errors import LeaseFSError

    path = f"{args.dir}/read/file"
    want = content(path, args.size)
    async with AsyncClient(args.meta, config=config, client_name="bench-partition-reader") \
            as client:
        out = await client.create(path, replication=3, overwrite=True)
        await out.write(want)
        await out.close()
        send, receive = trio.open_memory_channel(16)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_commands, send)
            _emit(ev="ready")
            stream = None
            async for cmd in receive:
                if cmd["cmd"] == "open":
                    stream = await client.open(path)
                    # the replica it tries first: not one it could not reach in an
                    # earlier round (the client avoids those for data_avoid_interval)
                    first = client.avoided.first(stream.blocks[0].locations)
                    _emit(ev="opened", first=first["address"])
                elif cmd["cmd"] == "read":
                    began = time.monotonic()
                    error = f"not read in {cmd['limit']:g} s"
                    with trio.move_on_after(cmd["limit"]):
                        try:
                            got = await stream.read()
                        except (LeaseFSError, OSError) as exc:
                            error = str(exc) or type(exc).__name__
                        else:
                            error = "" if got == want else \
                                f"{len(got)} bytes read of {len(want)}, or other bytes"
                    await stream.close()
                    _emit(ev="read", began=began, end=time.monotonic(), error=error)
                elif cmd["cmd"] == "verify":
                    break
            nursery.cancel_scope.cancel()
        got = await client.read_file(path)
        _emit(ev="verified", files=1, bytes=len(want), lost_count=int(got != want),
              lost=[] if got == want else [f"{path}: the bytes differ"])


AGENTS = {"create": _create_agent, "write": _write_agent, "read": _read_agent}


def agent_main(argv: list[str]) -> int:
    import trio

    p = argparse.ArgumentParser(prog="python -m tools.bench.partition --agent")
    p.add_argument("--agent", choices=sorted(AGENTS), required=True)
    p.add_argument("--meta", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--interval", type=float, default=0.02)
    p.add_argument("--size", type=int, default=0)
    p.add_argument("--settings", default="{}", help="client settings, JSON")
    args = p.parse_args(argv)
    config = _agent_config(json.loads(args.settings))
    trio.run(AGENTS[args.agent], args, config)
    return 0


class Agent:
    """One agent process on a host: commands in, events (JSON lines) out; a thread keeps
    every event in ``events`` as it comes."""

    def __init__(self, deployment: "Deployment", role: str, extra: list[str]):
        d = deployment
        self.role = role
        self.log_path = os.path.join(d.folder, f"agent-{role}.log")
        argv = [sys.executable, "-m", "tools.bench.partition", "--agent", role,
                "--meta", d.meta_addresses, "--dir", d.dir, "--interval", str(d.interval),
                "--settings", json.dumps(d.settings), *extra]
        with open(self.log_path, "ab") as log:
            self.proc = d.hosts.popen("client", argv, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=log, env=d.env,
                                      cwd=SOURCE_TREE, start_new_session=True)
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._record = open(os.path.join(d.folder, f"agent-{role}.events"), "a")
        threading.Thread(target=self._read, daemon=True, name=f"agent-{role}").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"ev": "junk", "line": line.decode(errors="replace")}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
            self._record.write(line.decode(errors="replace"))
            self._record.flush()
        self._record.close()
        with self._cond:
            self.events.append({"ev": "exit"})
            self._cond.notify_all()

    def send(self, **command) -> None:
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def wait(self, match, since: int, deadline: float) -> dict | None:
        """The first event from index ``since`` on that ``match``es, or None at
        ``deadline`` (monotonic); an agent that exited is an error."""
        i = since
        with self._cond:
            while True:
                while i < len(self.events):
                    event = self.events[i]
                    i += 1
                    if event["ev"] == "exit":
                        raise UsageError(f"the {self.role} agent exited "
                                         f"({self.proc.poll()}); see {self.log_path}")
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def since(self, start: int) -> list[dict]:
        with self._cond:
            return list(self.events[start:])

    def verify(self, timeout: float = 300.0) -> dict:
        mark = self.mark()
        self.send(cmd="verify")
        event = self.wait(lambda e: e["ev"] == "verified", mark, time.monotonic() + timeout)
        if event is None:
            raise UsageError(f"the {self.role} agent did not check its files in {timeout:g} "
                             f"s; see {self.log_path}")
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return event


# --------------------------------------------------------------------------- deployment
@dataclass
class Round:
    """One round of a scenario, as the JSON reports it; ``seconds`` None = timed out."""

    scenario: str
    fault: str
    victim: str
    seconds: float | None = None
    fresh_seconds: float | None = None    # active: the fresh client's write
    applied_seconds: float = 0.0          # how long putting the fault in place took
    in_flight: bool | None = None         # the first write through began before the fault
    still_active: bool | None = None      # active, partition: the cut-off one said so
    stepped_down_seconds: float | None = None
    recovered_seconds: float = 0.0        # from healing/restarting to the cluster whole
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Deployment:
    """The hosts and every server process on them (module docstring)."""

    def __init__(self, hosts, folder: str, args, status):
        self.hosts = hosts
        self.folder = folder
        self.status = status
        self.interval = args.interval
        self.dir = f"/bench-partition-{os.getpid()}"
        # every server's and client's (clients on their own hosts hold no token)
        self.settings = {"security": "simple", **parse_settings(getattr(args, "set", None))}
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (SOURCE_TREE, os.environ.get("PYTHONPATH")) if p))
        self.env.pop("LEASEFS_META", None)
        self.env["LEASEFS_HOME"] = os.path.join(folder, "home")
        self.storage: dict[str, subprocess.Popen] = {}
        self.members = []
        self.cluster = None

    @property
    def meta_addresses(self) -> str:
        return self.cluster.addresses

    def election_timeout(self) -> float:
        return _agent_config(self.settings).ha_election_timeout

    def heartbeat_interval(self) -> float:
        return _agent_config(self.settings).heartbeat_interval

    # -- start and stop
    def start(self) -> None:
        address = self.hosts.address("etcd")
        self.members = [HostMember(**m.to_dict(), host=address) for m in etcd.plan(
            os.path.join(self.folder, "etcd"), os.path.join(self.folder, "logs"),
            first_port=ETCD_FIRST_PORT)]
        self.status(f"starting 3 etcd members on host etcd ({address}) in {self.folder}")
        token = etcd.new_token()
        procs = {m.name: self._spawn_etcd(m, token) for m in self.members}
        etcd.wait_healthy(self.members, procs)
        self.cluster = HostedHACluster(
            self.hosts, self.folder, self.members, 2,
            {"cluster_key_file": os.path.join(self.folder, "cluster.key"), **self.settings},
            self.status)
        # where a standby behind the log finds an image: the other servers
        self.cluster.settings["meta_address"] = self.cluster.addresses
        for name in self.cluster.names:
            self.status(f"starting metadata server {name} on {self.cluster.address(name)}")
            self.cluster.start(name)
            first = name == self.cluster.names[0]
            self.cluster.wait(name, "active" if first else "standby", 90)
        for name in STORAGE:
            self.status(f"starting block server {name} on {self.storage_address(name)}")
            self.start_storage(name)
        for name in STORAGE:
            self.wait_storage(name, 90)

    def _spawn_etcd(self, member, token: str) -> subprocess.Popen:
        os.makedirs(os.path.dirname(member.log_file), exist_ok=True)
        with open(member.log_file, "ab") as log:
            proc = self.hosts.popen("etcd", etcd.argv(member, self.members, token),
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=etcd.environment(self.members),
                                    start_new_session=True)
        member.pid = proc.pid
        return proc

    def stop(self) -> None:
        if self.cluster is not None:
            for name in self.cluster.names:
                self.cluster.kill(name, signal.SIGTERM)
        for name in list(self.storage):
            self.kill(name, signal.SIGTERM)
        etcd.stop(self.members)

    def storage_address(self, name: str) -> str:
        return f"{self.hosts.address(name)}:{STORAGE_PORT}"

    def host_of(self, address: str) -> str:
        return next(n for n in STORAGE if self.storage_address(n) == address)

    def start_storage(self, name: str) -> None:
        host = self.hosts.address(name)
        cmd = [sys.executable, "-m", "tools", "storage", "--data",
               os.path.join(self.folder, name), "--host", host, "--port", str(STORAGE_PORT),
               "--meta", self.meta_addresses, "--log-level", "WARNING",
               "--set", f"advertise_host={host}",
               "--set", f"cluster_key_file={os.path.join(self.folder, 'cluster.key')}"]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        with open(os.path.join(self.folder, f"{name}.log"), "ab") as log:
            self.storage[name] = self.hosts.popen(
                name, cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=SOURCE_TREE, start_new_session=True)

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        if name in self.storage:
            signal_and_wait(self.storage[name], sig)
        else:
            self.cluster.kill(name, sig)

    def restart(self, name: str) -> None:
        if name in self.storage:
            self.start_storage(name)
        else:
            self.cluster.start(name)

    def wait_storage(self, name: str, timeout: float, since: float | None = None) -> None:
        """Until the active has had a heartbeat of block server ``name`` after ``since``
        (monotonic; None: in the last interval) and safe mode is off."""
        from ..cluster.processes import report_or_none

        address = self.storage_address(name)
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            proc = self.storage[name]
            if proc.poll() is not None:
                raise UsageError(f"block server {name} exited ({proc.returncode}); see "
                                 f"{os.path.join(self.folder, name + '.log')}")
            asked = time.monotonic()
            fresh = asked - since if since is not None else self.heartbeat_interval() + 0.5
            report, error = report_or_none(self.cluster.address(self.cluster.active()), 2.0)
            if report is None:
                last = f"the active does not answer ({error})"
            else:
                node = next((n for n in report["live_nodes"] if n["address"] == address), None)
                if report["safemode"]["on"]:
                    last = "safe mode is on"
                elif node is None:
                    last = "not live"
                elif node["last_heartbeat_age"] <= fresh:
                    return
                else:
                    last = f"last heartbeat {node['last_heartbeat_age']:g} s ago"
            time.sleep(0.2)
        raise UsageError(f"block server {name} is not back after {timeout:g} s ({last}); "
                         f"see {os.path.join(self.folder, name + '.log')}")


class HostedHACluster(PrivateHACluster):
    """A private HA cluster with each metadata server on the host of its name, on the
    default port (as a deployment has it)."""

    def __init__(self, hosts, *args):
        self.hosts = hosts
        super().__init__(*args)
        self.ports = dict.fromkeys(self.names, META_PORT)

    def address(self, name: str) -> str:
        return f"{self.hosts.address(name)}:{self.ports[name]}"

    def popen(self, name: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        return self.hosts.popen(name, cmd, **kwargs)


@dataclass
class HostMember(etcd.Member):
    """An etcd member on a host's address instead of loopback."""

    host: str = "127.0.0.1"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


# --------------------------------------------------------------------------- rounds
class Rounds:
    """Runs the rounds of the scenarios on one deployment."""

    def __init__(self, d: Deployment, args, status):
        self.d = d
        self.hosts = d.hosts
        self.timeout = args.round_timeout
        self.settle = args.settle_timeout
        self.status = status
        self.read_size = args.read_size
        self.fresh_id = 0     # names each fresh client, so a late answer is not taken

    # -- faults
    def fault(self, kind: str, victim: str) -> tuple[float, float]:
        """Put the fault in place: ``(t0, seconds it took)``, where ``t0`` is the moment
        it is wholly in place (the process gone; every route of the cut in), from which the
        figures count: what ends after it cannot have been served by the victim."""
        started = time.monotonic()
        if kind == "kill":
            self.d.kill(victim)     # waits for the exit
        else:
            self.hosts.isolate(victim)
        t0 = time.monotonic()
        return t0, t0 - started

    def undo(self, kind: str, victim: str) -> None:
        if kind == "kill":
            self.d.restart(victim)
        else:
            self.hosts.heal()

    def _say(self, r: Round, k: int, n: int) -> None:
        def s(v):
            return "timed out" if v is None else f"{v:.2f} s"
        extra = f", fresh client {s(r.fresh_seconds)}" if r.scenario == "active" else ""
        self.status(f"{r.scenario} round {k}/{n}: {r.fault} of {r.victim}: {s(r.seconds)}"
                    f"{extra}" + (f" ({'; '.join(r.errors)[:200]})" if r.errors else ""))

    def run(self, scenario: str, rounds: int) -> tuple[list[Round], dict]:
        runner = {"active": self._active, "pipeline": self._pipeline,
                  "replica": self._replica}[scenario]
        role = {"active": "create", "pipeline": "write", "replica": "read"}[scenario]
        extra = ["--size", str(self.read_size)] if role == "read" else []
        agent = Agent(self.d, role, extra)
        out: list[Round] = []
        try:
            if agent.wait(lambda e: e["ev"] == "ready", 0, time.monotonic() + 120) is None:
                raise UsageError(f"the {role} agent is not ready after 120 s; see "
                                 f"{agent.log_path}")
            kinds = [FAULTS[i % 2] for i in range(2 * rounds)]
            for k, kind in enumerate(kinds, 1):
                r = runner(agent, kind)
                out.append(r)
                self._say(r, k, len(kinds))
            verified = agent.verify()
        finally:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
        return out, verified

    def _deadline(self, started: float) -> float:
        return started + self.timeout

    def _steady_ok(self, agent: Agent, after: float, since: int, deadline: float):
        return agent.wait(lambda e: e["ev"] == "ok" and e["client"] == "steady"
                          and e["end"] > after, since, deadline)

    def _errors(self, agent: Agent, since: int) -> list[str]:
        return [e["error"] for e in agent.since(since) if e["ev"] in ("error", "failed")]

    def _active(self, agent: Agent, kind: str) -> Round:
        c = self.d.cluster
        election = self.d.election_timeout()
        victim = c.active()
        other = next(n for n in c.names if n != victim)
        before = c.status_of(victim)
        # the steady client goes, and the fault falls at a random moment of the active's
        # keepalive cycle (a third of the election timeout)
        if self._steady_ok(agent, time.monotonic(), agent.mark(),
                           time.monotonic() + self.settle) is None:
            raise UsageError("the steady client gets no write through before the round")
        time.sleep(random.uniform(0, election / 3))
        r = Round("active", kind, victim)
        mark = agent.mark()
        t0, r.applied_seconds = self.fault(kind, victim)
        deadline = self._deadline(t0)
        self.fresh_id += 1
        rid = self.fresh_id
        agent.send(cmd="fresh", id=rid, order=f"{c.address(victim)},{c.address(other)}",
                   limit=self.timeout)
        steady = self._steady_ok(agent, t0, mark, deadline)
        if steady is not None:
            r.seconds = steady["end"] - t0
            r.in_flight = steady["began"] < t0
        fresh = agent.wait(lambda e: e.get("client") == "fresh" and e["id"] == rid, mark,
                           deadline + 5)
        if fresh is not None and fresh["ev"] == "ok":
            r.fresh_seconds = fresh["end"] - t0
        if kind == "partition":
            answer = c.status_of(victim)
            r.still_active = bool(answer and answer["role"] == "active")
            watch = t0 + 2 * election + 5
            while time.monotonic() < watch:
                answer = c.status_of(victim)
                if not (answer and answer["role"] == "active"):
                    r.stepped_down_seconds = time.monotonic() - t0
                    break
                time.sleep(0.1)
        r.errors = self._errors(agent, mark)
        undone = time.monotonic()
        self.undo(kind, victim)
        try:
            c.settled(before["applied_txid"], timeout=self.settle)
        except UsageError as exc:
            # a server that does not come back by itself is restarted, and said so
            r.notes.append(f"did not settle after the {kind}: {exc}; {victim} restarted")
            c.kill(victim)
            c.start(victim)
            c.settled(before["applied_txid"], timeout=self.settle)
        r.recovered_seconds = time.monotonic() - undone
        return r

    def _pipeline(self, agent: Agent, kind: str) -> Round:
        mark = agent.mark()
        agent.send(cmd="roll")
        announced = agent.wait(lambda e: e["ev"] == "pipeline", mark,
                               time.monotonic() + self.settle)
        if announced is None:
            raise UsageError(f"the writer announced no new pipeline in {self.settle:g} s; "
                             f"see {agent.log_path}")
        nodes = announced["nodes"]
        if len(nodes) < 3:
            raise UsageError(f"the writer's pipeline has {len(nodes)} nodes, not 3: {nodes}")
        victim = self.d.host_of(nodes[1])
        # anywhere in the writer's write-hflush-sleep cycle
        time.sleep(random.uniform(0, 0.2))
        r = Round("pipeline", kind, victim)
        mark = agent.mark()
        t0, r.applied_seconds = self.fault(kind, victim)
        ack = agent.wait(lambda e: e["ev"] == "ack" and e["end"] > t0, mark,
                         self._deadline(t0))
        if ack is not None:
            r.seconds = ack["end"] - t0
            r.in_flight = ack["began"] < t0
        r.errors = self._errors(agent, mark)
        undone = time.monotonic()
        self.undo(kind, victim)
        self.d.wait_storage(victim, self.settle, since=undone)
        r.recovered_seconds = time.monotonic() - undone
        return r

    def _replica(self, agent: Agent, kind: str) -> Round:
        mark = agent.mark()
        agent.send(cmd="open")
        opened = agent.wait(lambda e: e["ev"] == "opened", mark, time.monotonic() + self.settle)
        if opened is None:
            raise UsageError(f"the reader did not open its file in {self.settle:g} s; see "
                             f"{agent.log_path}")
        victim = self.d.host_of(opened["first"])
        r = Round("replica", kind, victim)
        mark = agent.mark()
        t0, r.applied_seconds = self.fault(kind, victim)
        agent.send(cmd="read", limit=self.timeout)
        done = agent.wait(lambda e: e["ev"] == "read", mark, self._deadline(t0) + 5)
        if done is not None and not done["error"]:
            r.seconds = done["end"] - t0
        elif done is not None:
            r.errors.append(done["error"])
        undone = time.monotonic()
        self.undo(kind, victim)
        self.d.wait_storage(victim, self.settle, since=undone)
        r.recovered_seconds = time.monotonic() - undone
        return r


# --------------------------------------------------------------------------- results
def summary(rounds: list[Round], timeout: float) -> dict:
    """Per measure of each scenario and fault kind: rounds, timeouts, p50 and max (None
    when that many rounds timed out), and the ratio of the p50s partition/kill."""
    out: dict = {}
    for scenario, measures in MEASURES.items():
        mine = [r for r in rounds if r.scenario == scenario]
        if not mine:
            continue
        for key, label in measures:
            row: dict = {"scenario": scenario, "measure": key, "label": label}
            for kind in FAULTS:
                values = [getattr(r, key) for r in mine if r.fault == kind]
                figures = [math.inf if v is None else v for v in values]
                p50 = percentile(figures, 50) if figures else None
                top = max(figures) if figures else None
                row[kind] = {"rounds": len(values),
                             "timed_out": sum(v is None for v in values),
                             "p50": None if p50 in (None, math.inf) else p50,
                             "max": None if top in (None, math.inf) else top}
            k, p = row["kill"]["p50"], row["partition"]["p50"]
            row["ratio"] = (p / k) if (k and p is not None) else None
            # a partition that timed out: the ratio is at least this
            row["ratio_at_least"] = (timeout / k) if (k and p is None
                                                     and row["partition"]["rounds"]) else None
            out[f"{scenario}.{key}"] = row
    return out


def table_lines(results: dict) -> list[str]:
    """The plain table of ``results`` (what ``--json`` prints), with its heading lines."""
    timeout = results["round_timeout"]

    def fig(cell: dict, what: str) -> str:
        if not cell["rounds"]:
            return "-"
        value = cell[what]
        return f">{timeout:g}" if value is None else f"{value:.2f}"

    rows = []
    for row in results["summary"].values():
        ratio = (f"{row['ratio']:.1f}" if row["ratio"] is not None else
                 f">{row['ratio_at_least']:.1f}" if row["ratio_at_least"] else "-")
        rows.append([SCENARIOS[row["scenario"]], row["label"],
                     fig(row["kill"], "p50"), fig(row["kill"], "max"),
                     fig(row["partition"], "p50"), fig(row["partition"], "max"),
                     f"{row['partition']['timed_out']}/{row['partition']['rounds']}", ratio])
    lines = [f"bench partition: {results['hosts']} hosts (network namespaces on a private "
             f"bridge), ha = etcd, election timeout {results['election_timeout']:g} s, "
             f"{results['rounds_per_fault']} round(s) of each fault; seconds from the fault to the "
             f"first write (the read) that gets through; round timeout {timeout:g} s"]
    lines += format_table(["fault of", "measured", "kill p50", "kill max", "partition p50",
                           "partition max", "timed out", "partition/kill"], rows,
                          align="<<" + ">" * 6)
    for scenario in ("active", "pipeline"):
        mine = [r for r in results["rounds"] if r["scenario"] == scenario]
        if mine:
            lines.append(f"{SCENARIOS[scenario]}: the first write through was in flight at "
                         f"the fault in {sum(bool(r['in_flight']) for r in mine)} of "
                         f"{len(mine)} round(s)")
    cut = [r for r in results["rounds"] if r["scenario"] == "active"
           and r["fault"] == "partition"]
    if cut:
        said = sum(bool(r["still_active"]) for r in cut)
        down = [r["stepped_down_seconds"] for r in cut if r["stepped_down_seconds"] is not None]
        watch = 2 * results["election_timeout"] + 5
        lines.append(f"cut-off active still said 'active' after the round's writes: {said} "
                     f"of {len(cut)} round(s); stopped saying so while cut off: "
                     + (", ".join(f"{s:.1f} s" for s in down) if down else "never")
                     + (f" (watched {watch:g} s)" if len(down) < len(cut) else ""))
    for r in results["rounds"]:
        for note in r["notes"]:
            lines.append(f"note: {r['scenario']} {r['fault']} of {r['victim']}: {note}")
    v = results["verified"]
    lost = sum(x["lost_count"] for x in v.values())
    lines.append(("no acknowledged byte lost: " if not lost else f"LOST: {lost} file(s) of ")
                 + ", ".join(f"{name} {x['files']} file(s) {human_size(x['bytes'])}"
                             for name, x in v.items()))
    for x in v.values():
        lines += [f"  lost: {text}" for text in x["lost"]]
    return lines


def run_partition_bench(cmd: Command) -> int:
    from ..testbed import hosts as hostsmod

    a = cmd.args
    if a.rounds < 1 or a.round_timeout <= 0 or a.settle_timeout <= 0 or a.interval <= 0:
        raise UsageError("--rounds must be at least 1; --round-timeout, --settle-timeout and "
                         "--interval above 0")
    read_size = parse_size(a.read_size)
    if not 0 < read_size <= 64 << 20:
        raise UsageError("--read-size: above 0 and at most 64M (one block)")
    a.read_size = read_size
    load_config(a)   # a bad --set or --config is said now, before any host is built
    scenarios = list(dict.fromkeys(a.scenario or SCENARIOS))
    reason = hostsmod.unavailable_reason()
    if reason:
        raise UsageError(f"cannot build hosts here: {reason}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    status = StatusLine(enabled=not a.quiet)
    home = baseline_dir(a.home)
    folder = tempfile.mkdtemp(prefix=".bench-partition-", dir=home)
    tag = f"fb{os.getpid() % 100000}"
    rounds: list[Round] = []
    verified: dict = {}
    try:
        with hostsmod.HostSet(tag, list(HOST_NAMES), a.subnet) as hosts:
            status(f"{len(HOST_NAMES)} hosts on {hosts.net}: "
                   + ", ".join(f"{n} {hosts.address(n)}" for n in HOST_NAMES))
            d = Deployment(hosts, folder, a, status)
            try:
                d.start()
                runner = Rounds(d, a, status)
                for scenario in scenarios:
                    done, verified[scenario] = runner.run(scenario, a.rounds)
                    rounds += done
            finally:
                d.stop()
            election = d.election_timeout()
    finally:
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
    results = {"benchmark": "partition", "hosts": len(HOST_NAMES), "rounds_per_fault": a.rounds,
               "round_timeout": a.round_timeout, "election_timeout": election,
               "settings": parse_settings(getattr(a, "set", None)),
               "summary": summary(rounds, a.round_timeout), "verified": verified,
               "rounds": [asdict(r) for r in rounds]}
    if a.json:
        cmd.out(json.dumps(results, indent=2))
    else:
        for line in table_lines(results):
            cmd.out(line)
    lost = sum(x["lost_count"] for x in verified.values())
    return 1 if lost else 0


def register(bsub, common) -> None:
    q = bsub.add_parser("partition", parents=[common],
                        help="time to the first write after a silent partition of a server "
                             "against kill -9 of it, on hosts of their own (root)",
                        description="On network namespaces of a private bridge (root): "
                                    "3 etcd members, 2 metadata servers (ha = etcd), 4 block "
                                    "servers and a client host. In alternating rounds the HA "
                                    "active, the middle block server of a write pipeline and "
                                    "a reader's first replica holder are cut off silently or "
                                    "killed; measured: the seconds from the fault to the first "
                                    "write (read) that gets through. --set KEY=VALUE "
                                    "settings go to every server and client.")
    q.add_argument("--rounds", type=int, default=2,
                   help="rounds of each fault (partition, kill) per scenario (default 2)")
    q.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                   help="only this scenario (repeatable; default all: active, pipeline, "
                        "replica)")
    q.add_argument("--round-timeout", type=float, default=75.0,
                   help="seconds a round waits for its write or read before it is said to "
                        "have timed out (default 75)")
    q.add_argument("--settle-timeout", type=float, default=90.0,
                   help="seconds to wait for the cluster to be whole again after a round "
                        "(default 90)")
    q.add_argument("--interval", type=float, default=0.02,
                   help="seconds between two writes of a steady client (default 0.02)")
    q.add_argument("--read-size", default="8M",
                   help="size of the file the replica scenario reads (default 8M)")
    q.add_argument("--subnet", default=None,
                   help="private IPv4 subnet of the hosts (default: a /24 of 10.77.0.0/15 "
                        "that nothing routes yet)")
    q.add_argument("--home", default=None,
                   help="folder for the servers' data (default: the cluster home)")
    q.add_argument("--keep", action="store_true", help="keep the servers' data and logs")
    q.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    q.add_argument("--quiet", action="store_true", help="no progress lines")
    q.set_defaults(func=run_partition_bench)


if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
