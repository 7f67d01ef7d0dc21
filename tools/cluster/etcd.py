"""A small etcd cluster on loopback for metadata HA (``ha = etcd``): ``leasefs cluster up
--ha`` and the tests start their members with it.

Why it exists: the replicated edit log (``meta/halog.py``) needs a 3-member etcd; an
operator trying HA on one machine should not have to write etcd's dozen flags by hand, and
the launcher and the tests should start it the same way. Each member is ``/usr/bin/etcd``
(Debian ``etcd-server``) with:

* loopback client and peer URLs on given ports, or free ones below the kernel's ephemeral
  range (``free_port``): never 2379/2380, where Debian's own ``etcd.service`` may run, and
  never a number a reconnecting client may hold as its source port when the member restarts;
* its data in ``<base>/<name>``, its output in ``<logs>/<name>.log``, its pid in
  ``<run>/<name>.pid``;
* heartbeat 50 ms and election timeout 500 ms (loopback round trips are microseconds: a
  lost raft leader is replaced in about a second, instead of etcd's WAN-safe defaults);
* ``--quota-backend-bytes`` 2 GiB (etcd's own ceiling for a safe backend) and periodic
  auto-compaction of revisions older than an hour, so the backend does not grow with every
  log entry ever appended;
* ``GOMAXPROCS`` of the machine's CPUs shared out over the members started together (at
  least 1), unless the environment sets it: the members of one machine share its cores, and
  a Go runtime that believes it owns all of them spins idle threads looking for work. On 2
  cores this cut etcd's CPU per replicated append by about a quarter.

Members are stopped by their own pids only, after ``is_etcd`` checked ``/proc/<pid>``
still shows our etcd for that data folder (a recycled pid is never signalled).

Concurrency contract: synchronous; called from the main thread of a short-lived CLI process
or a test. Nothing here is shared between threads.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass

ETCD = "/usr/bin/etcd"
HEARTBEAT_MS = 50
ELECTION_MS = 500
QUOTA_BACKEND_BYTES = 2 * 1024 ** 3
AUTO_COMPACTION = ("periodic", "1h")


class EtcdError(Exception):
    """An etcd member did not start or become healthy; the message names it and its log
    (``log_path``, for the caller to show its last lines)."""

    def __init__(self, message: str, log_path: str | None = None):
        super().__init__(message)
        self.log_path = log_path


def free_port(low: int = 10000) -> int:
    """A free TCP port on loopback BELOW the kernel's ephemeral range (see the module
    docstring): probed by binding it, so another process may still take it before use.

    Probed, not held: a caller that picks several ports before it starts anything (etcd
    members, HA metadata servers) could be handed one number twice, so this process never
    hands a number out again until half the range has been."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            high = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    if len(_handed_out) > (high - low) // 2:
        _handed_out.clear()
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise EtcdError(f"no free port found between {low} and {high}")


_handed_out: set[int] = set()


@dataclass
class Member:
    """One etcd member of the cluster (what ``cluster.json`` records of it)."""

    name: str
    client_port: int
    peer_port: int
    data_dir: str
    log_file: str
    pid: int | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Member":
        return cls(name=d["name"], client_port=int(d["client_port"]),
                   peer_port=int(d["peer_port"]), data_dir=d["data_dir"],
                   log_file=d["log_file"], pid=d.get("pid"))


def plan(base: str, logs: str, n: int = 3, first_port: int = 0,
         prefix: str = "etcd") -> list[Member]:
    """``n`` members with data under ``base``: client ports ``first_port + i`` and peer
    ports ``first_port + n + i``, or free ones with ``first_port`` 0."""
    members = []
    for i in range(n):
        if first_port:
            client, peer = first_port + i, first_port + n + i
        else:
            client, peer = free_port(), free_port()
        name = f"{prefix}{i}"
        members.append(Member(name, client, peer, os.path.join(base, name),
                              os.path.join(logs, f"{name}.log")))
    return members


def endpoints(members: list[Member]) -> str:
    """The comma-separated client URLs (the ``ha_etcd_endpoints`` setting)."""
    return ",".join(m.client_url for m in members)


def argv(member: Member, members: list[Member], token: str) -> list[str]:
    """The command line of one member (``initial-cluster-state new``: a member with data
    already in its folder ignores the initial-cluster flags and rejoins with its data)."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    return [ETCD, "--name", member.name, "--data-dir", member.data_dir,
            "--listen-client-urls", member.client_url,
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", token,
            "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
            "--quota-backend-bytes", str(QUOTA_BACKEND_BYTES),
            "--auto-compaction-mode", AUTO_COMPACTION[0],
            "--auto-compaction-retention", AUTO_COMPACTION[1]]


def new_token() -> str:
    return f"leasefs-{uuid.uuid4().hex[:12]}"


def environment(members: list[Member], cpus: set[int] | None = None) -> dict[str, str]:
    """The environment of a member started with ``members`` on the CPUs ``cpus`` (all of
    this process's when None): this one's, with GOMAXPROCS shared out (module docstring)."""
    env = dict(os.environ)
    if "GOMAXPROCS" not in env:
        cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
        env["GOMAXPROCS"] = str(max(1, cores // max(1, len(members))))
    return env


def spawn(member: Member, members: list[Member], token: str,
          pid_file: str | None = None, cpus: set[int] | None = None) -> subprocess.Popen:
    """Start one member detached (own session: a Ctrl-C of the launcher does not reach
    it), appending to its log; records the pid in ``member`` and ``pid_file``."""
    if not os.access(ETCD, os.X_OK):
        raise EtcdError(f"{ETCD} not found: install the Debian package etcd-server "
                        f"(apt-get install etcd-server)")
    os.makedirs(os.path.dirname(member.log_file), exist_ok=True)
    os.makedirs(os.path.dirname(member.data_dir) or ".", exist_ok=True)
    with open(member.log_file, "ab") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting etcd {member.name}\n"
                  .encode())
        log.flush()
        proc = subprocess.Popen(argv(member, members, token), stdout=log,
                                env=environment(members, cpus),
                                preexec_fn=None if cpus is None else
                                (lambda: os.sched_setaffinity(0, cpus)),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    member.pid = proc.pid
    if pid_file:
        os.makedirs(os.path.dirname(pid_file), exist_ok=True)
        with open(pid_file, "w") as fh:
            fh.write(f"{proc.pid}\n")
    return proc


def healthy(url: str, timeout: float = 1.0) -> bool:
    """Does the member at ``url`` answer ``/health`` with health true (it has a quorum)?"""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as answer:
            return json.load(answer).get("health") == "true"
    except (OSError, ValueError):
        return False


def log_tail(path: str, chars: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def wait_healthy(members: list[Member], procs: dict, timeout: float = 30.0,
                 progress=None) -> None:
    """Until every member is healthy; ``EtcdError`` naming the member and its log when one
    exits or the time is up. ``procs``: name -> Popen of the members started by us (an
    exit is noticed at once); ``progress(n_healthy, n)`` is told of each change."""
    deadline = time.monotonic() + timeout
    seen = -1
    while True:
        ok = [healthy(m.client_url) for m in members]
        if sum(ok) != seen:
            seen = sum(ok)
            if progress:
                progress(seen, len(members))
        if all(ok):
            return
        for m in members:
            proc = procs.get(m.name)
            if proc is not None and proc.poll() is not None:
                raise EtcdError(f"etcd member {m.name} exited with status {proc.returncode} "
                                f"while starting; see {m.log_file}", m.log_file)
        if time.monotonic() > deadline:
            sick = [m for m, good in zip(members, ok) if not good]
            raise EtcdError(f"etcd member(s) {', '.join(m.name for m in sick)} not healthy "
                            f"after {timeout:g} s; see {', '.join(m.log_file for m in sick)}",
                            sick[0].log_file)
        time.sleep(0.1)


def is_etcd(pid: int | None, data_dir: str) -> bool:
    """Is ``pid`` a live (not zombie) etcd serving ``data_dir``?"""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        if stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X"):
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except (OSError, ValueError, IndexError):
        return False
    if not args or os.path.basename(args[0]) != "etcd":
        return False
    try:
        data = args[args.index("--data-dir") + 1]
    except (ValueError, IndexError):
        return False
    return os.path.abspath(data) == os.path.abspath(data_dir)


def stop(members: list[Member], timeout: float = 10.0) -> list[Member]:
    """SIGTERM every member that ``is_etcd``, SIGKILL those still there after ``timeout``
    (a member without a quorum may linger in its graceful stop); the members signalled."""
    victims = [m for m in members if is_etcd(m.pid, m.data_dir)]
    for m in victims:
        _signal(m.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    remaining = list(victims)
    while remaining and time.monotonic() < deadline:
        remaining = [m for m in remaining if is_etcd(m.pid, m.data_dir)]
        if remaining:
            time.sleep(0.05)
    for m in remaining:
        _signal(m.pid, signal.SIGKILL)
    return victims


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


__all__ = ["ETCD", "EtcdError", "Member", "plan", "endpoints", "argv", "spawn", "healthy",
           "wait_healthy", "is_etcd", "stop", "free_port", "new_token"]
