"""A real 3-member etcd cluster on loopback for tests (``/usr/bin/etcd``, Debian etcd-server).

Each member listens on free ports from ``harness.free_port`` (10000 up to the kernel's
ephemeral range, so never 2379/2380: Debian's package enables a system ``etcd.service`` on
those, and we keep clear of it rather than stop it), keeps its data under the test's
``tmp_path`` and is stopped by its own pid. The command line and the health check are the
product's (``tools/cluster/etcd.py``, which ``leasefs cluster up --ha`` uses): short
heartbeat/election settings (50/500 ms) make a lost leader re-elected in about a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

from harness import free_port, wait_stopped
from tools.cluster import etcd as etcdmod

ETCD = etcdmod.ETCD


class EtcdCluster:
    def __init__(self, base: Path, size: int = 3):
        self.base = base
        self.names = [f"m{i}" for i in range(size)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self.token = f"leasefs-test-{uuid.uuid4().hex[:8]}"
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, object] = {}

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.client_ports]

    def members(self) -> list[etcdmod.Member]:
        return [etcdmod.Member(name, self.client_ports[i], self.peer_ports[i],
                               str(self.base / f"etcd-{name}"),
                               str(self.base / f"etcd-{name}.log"))
                for i, name in enumerate(self.names)]

    def start(self, timeout: float = 30.0) -> "EtcdCluster":
        for i in range(len(self.names)):
            self._spawn(i)
        return self.wait_healthy(timeout)

    def _spawn(self, i: int) -> None:
        members = self.members()
        if i not in self.logs:
            self.logs[i] = open(members[i].log_file, "ab")
        self.procs[i] = subprocess.Popen(
            etcdmod.argv(members[i], members, self.token),
            env=etcdmod.environment(members), stdout=self.logs[i], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def restart(self, i: int) -> None:
        """Start member ``i`` again on its data (after ``kill9``): it rejoins the cluster."""
        if self.procs[i].poll() is None:
            raise RuntimeError(f"etcd {self.names[i]} is still running")
        self._spawn(i)

    def wait_healthy(self, timeout: float = 30.0) -> "EtcdCluster":
        deadline = time.monotonic() + timeout
        while not all(self.healthy(i) for i in self.procs):
            for i, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"etcd {self.names[i]} exited {proc.returncode}: "
                                       f"{self.log_tail(i)}")
            if time.monotonic() > deadline:
                raise RuntimeError("etcd cluster not healthy in time: "
                                   + " | ".join(self.log_tail(i) for i in self.procs))
            time.sleep(0.1)
        return self

    def healthy(self, i: int) -> bool:
        return etcdmod.healthy(self.endpoints[i])

    def status(self, i: int) -> dict:
        """``/v3/maintenance/status`` of member ``i`` (its ``leader`` is the raft leader's id,
        ``header.member_id`` its own)."""
        req = urllib.request.Request(f"{self.endpoints[i]}/v3/maintenance/status", data=b"{}",
                                     method="POST")
        with urllib.request.urlopen(req, timeout=3) as answer:
            return json.load(answer)

    def raft_leader(self) -> int:
        """Index of the member that is the raft leader now."""
        for i in self.procs:
            if self.procs[i].poll() is None:
                try:
                    st = self.status(i)
                except OSError:
                    continue
                if st.get("leader") == st["header"]["member_id"]:
                    return i
        raise RuntimeError("no raft leader")

    def pause(self) -> None:
        """SIGSTOP every member: an etcd outage, no member answers until ``resume``.
        Leases keep ageing meanwhile: one whose TTL runs out in the pause expires at the
        resume. Returns once every member is stopped."""
        running = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in running:
            os.kill(proc.pid, signal.SIGSTOP)
        for proc in running:
            wait_stopped(proc.pid)

    def resume(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)

    def kill9(self, i: int) -> None:
        proc = self.procs[i]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for i, proc in self.procs.items():
            if proc.poll() is None:
                proc.terminate()
        for i, proc in self.procs.items():
            try:
                proc.wait(2)    # a member without quorum may linger in its graceful stop
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            self.logs[i].close()

    def log_tail(self, i: int) -> str:
        return (self.base / f"etcd-{self.names[i]}.log").read_text(errors="replace")[-2000:]
