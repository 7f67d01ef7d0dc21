"""docs/DEPLOY.md works as written: its ``# on: HOST`` blocks run, in order, each on its
host, a network namespace of its own on a private bridge (root; skipped where ``ip netns``
is unavailable). Each host gets a folder of its own standing for its ``/etc/leasefs``,
``/var/lib/leasefs``, ``/tmp``, ``/mnt/lfs``; ``systemctl enable --now UNIT`` runs the
ExecStart of ``deploy/systemd/UNIT.service`` (``systemctl restart etcd``: etcd with
``/etc/default/etcd``), ``scp HOST:FILE DEST`` copies from that host's folder, and ``chown``
does nothing (there is no ``leasefs`` user here). Everything else is the doc's text.

Also here: a client on the metadata server's host that names the server by its address
(not 127.0.0.1) is known by the kernel (the local socket), so is one on a block server's
host (its block server vouches for it), where one on a client host is told what to do."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "DEPLOY.md"
NS = "lfs-deploy"      # every namespace, bridge and veth made here starts with it

#: the doc's host names → (namespace suffix, address)
HOSTS = {"meta": ("m", "10.0.0.10"), "meta1": ("m", "10.0.0.10"), "meta2": ("m2", "10.0.0.20"),
         "s1": ("s1", "10.0.0.11"), "s2": ("s2", "10.0.0.12"), "s3": ("s3", "10.0.0.13"),
         "client": ("c", "10.0.0.40"), "etcd1": ("e1", "10.0.0.31"),
         "etcd2": ("e2", "10.0.0.32"), "etcd3": ("e3", "10.0.0.33")}
#: the paths of a host that live in its own folder here
HOST_PATHS = ("/etc/leasefs", "/etc/default", "/var/lib/leasefs", "/var/lib/etcd", "/tmp/",
              "/mnt/lfs")
#: those paths where the text names them (not inside a longer path)
HOST_PATH = r"(?<![\w/.-])(" + "|".join(re.escape(p) for p in HOST_PATHS) + ")"


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "no ip or nsenter"
    probe = f"{NS}-probe{os.getpid() % 10000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


pytestmark = [pytest.mark.slow]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def blocks(part: str) -> list[tuple[list[str], str]]:
    """``(hosts, script)`` of each ``# on: HOST...`` block of the doc's section ``part``
    (a heading's opening, e.g. "## 1.")."""
    text = DOC.read_text()
    start = text.index(part)
    following = text.find("\n## ", start + 1)
    section = text[start:following if following >= 0 else len(text)]
    out = []
    for body in re.findall(r"```sh\n(.*?)```", section, re.S):
        first, _, rest = body.partition("\n")
        found = re.match(r"# on: (.+)", first)
        if found:
            out.append((found.group(1).split(), rest))
    return out


FAKE_SYSTEMCTL = r'''#!PYTHON
"""systemctl enable --now UNIT / restart etcd, as the deploy test plays it."""
import os, re, subprocess, sys
root, repo, pids = os.environ["LFS_ROOT"], os.environ["LFS_REPO"], os.environ["LFS_PIDS"]
unit = sys.argv[-1]
subprocess.run([os.environ["LFS_LOCALIZE"]], check=True)
def local(text):
    text = re.sub(os.environ["LFS_PATHS"], lambda m: m.group(0) if text.startswith(
        root, m.start()) else root + m.group(0), text)
    return text.replace("/opt/leasefs/bin/leasefs", os.environ["LFS_LEASEFS"])
env = dict(os.environ)
if unit == "etcd":
    for line in open(root + "/etc/default/etcd"):
        key, _, value = line.strip().partition("=")
        if key:
            env[key] = local(value)
    commands, start = [], ["/usr/bin/etcd"]
else:
    name, _, instance = unit.partition("@")
    text = open(f"{repo}/deploy/systemd/{name}{'@' if instance else ''}.service").read()
    if instance:
        text = text.replace("%f", "/" + instance.replace("-", "/"))
    text = local(text)
    lines = [l.split("=", 1)[1] for l in text.splitlines() if l.startswith("ExecStart")]
    commands, start = [l.split() for l in lines[:-1]], lines[-1].split()
for argv in commands:
    subprocess.run(argv, check=True)
log = open(f"{root}/{unit}.log", "ab")
proc = subprocess.Popen(start, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=env, start_new_session=True)
with open(f"{pids}/{os.path.basename(root)}-{unit}.pid", "w") as fh:
    fh.write(str(proc.pid))
'''

LOCALIZE = r'''#!PYTHON
"""The host's settings files name its paths as the doc does: make them this host's folder's."""
import glob, os, re
root = os.environ["LFS_ROOT"]
for name in glob.glob(f"{root}/etc/leasefs/*.toml"):
    text = open(name).read()
    mine = re.sub(os.environ["LFS_PATHS"], lambda m: m.group(0) if text.startswith(
        root, m.start()) else root + m.group(0), text)
    if mine != text:
        with open(name, "w") as fh:
            fh.write(mine)
'''

FAKE_SCP = r'''#!/bin/bash
# scp HOST:PATH DEST: PATH in HOST's folder (the doc's text names this host's)
set -eu
src="${1#*:}"; host="${1%%:*}"
src="${src#"$LFS_ROOT"}"
cp "$LFS_BASE/$host$src" "$2"
'''


class Hosts:
    """The doc's hosts as network namespaces on one bridge (in a namespace of its own, so
    nothing of it shows in the machine's own network), each with its own folder."""

    def __init__(self, base: Path, names: list[str]):
        self.base = base
        self.names = names
        self.bin = base / "bin"
        self.pids = base / "pids"
        self.bin.mkdir(parents=True)
        self.pids.mkdir()
        self.made: list[str] = []
        (self.bin / "localize").write_text(LOCALIZE.replace("PYTHON", sys.executable))
        (self.bin / "leasefs").write_text(
            f"#!/bin/sh\n{self.bin}/localize && exec {sys.executable} -m tools \"$@\"\n")
        (self.bin / "systemctl").write_text(FAKE_SYSTEMCTL.replace("PYTHON", sys.executable))
        (self.bin / "scp").write_text(FAKE_SCP)
        (self.bin / "chown").write_text("#!/bin/sh\nexit 0\n")
        for tool in self.bin.iterdir():
            tool.chmod(0o755)

    def __enter__(self):
        switch = f"{NS}-sw"
        sh("ip", "netns", "add", switch)
        self.made.append(switch)
        sh("ip", "-n", switch, "link", "add", f"{NS}-br", "type", "bridge")
        sh("ip", "-n", switch, "link", "set", f"{NS}-br", "up")
        for name in dict.fromkeys(HOSTS[n][0] for n in self.names):
            address = next(a for s, a in HOSTS.values() if s == name)
            ns, veth = f"{NS}-{name}", f"{NS}-{name}"
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}b")
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "link", "set", f"{veth}b", "netns", switch)
            sh("ip", "-n", switch, "link", "set", f"{veth}b", "master", f"{NS}-br", "up")
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for name in self.names:
            for path in HOST_PATHS:
                (self.base / name / path.strip("/")).mkdir(parents=True, exist_ok=True)
        return self

    def root(self, name: str) -> Path:
        return self.base / name

    def run(self, name: str, script: str, timeout: float = 180.0) -> str:
        """``script`` run by bash on host ``name`` (its namespace; cwd: the checkout)."""
        root = str(self.root(name))
        script = re.sub(HOST_PATH, lambda m: root + m.group(0), script)
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
               "LFS_ROOT": root, "LFS_BASE": str(self.base), "LFS_REPO": str(REPO),
               "LFS_PIDS": str(self.pids), "LFS_PATHS": HOST_PATH,
               "LFS_LEASEFS": str(self.bin / "leasefs"),
               "LFS_LOCALIZE": str(self.bin / "localize"), "PYTHONUNBUFFERED": "1"}
        for key in ("LEASEFS_META", "LEASEFS_CONFIG", "LEASEFS_TOKEN_FILE", "LEASEFS_HOME"):
            env.pop(key, None)
        env["LEASEFS_HOME"] = f"{root}/home"
        done = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{NS}-{HOSTS[name][0]}", "bash", "-euo",
             "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=timeout)
        assert done.returncode == 0, (f"on {name}:\n{script}\nexit {done.returncode}\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n"
                                      f"{self.logs(name)}")
        return done.stdout

    def logs(self, name: str) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                         for log in self.root(name).glob("*.log"))

    def follow(self, part: str) -> dict[str, str]:
        """Run the doc's blocks of ``part``; each host's output of its last block."""
        out = {}
        for hosts, script in blocks(part):
            for name in hosts:
                out[name] = self.run(name, script)
        return out

    def __exit__(self, *exc):
        for pidfile in self.pids.glob("*.pid"):
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + 20
        for pidfile in self.pids.glob("*.pid"):
            pid = int(pidfile.read_text())
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in self.names:
            mnt = self.root(name) / "mnt" / "lfs"
            if os.path.ismount(mnt) or mnt.exists() and not os.access(mnt, os.R_OK):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def usable():
    why = _usable()
    if why:
        pytest.skip(why)


def test_one_metadata_server_recipe(usable, tmp_path):
    """Part 1 on five hosts: the metadata server, three block servers, a client with the
    mount; then who is known where."""
    names = ["meta", "s1", "s2", "s3", "client"]
    with Hosts(tmp_path, names) as hosts:
        out = hosts.follow("## 1.")
        # the client's put went through three block servers on three hosts and reads back
        # through the mount
        assert out["client"].rstrip().endswith((REPO / "deploy" / "client.toml").read_text()
                                                .rstrip()), out["client"]
        report = hosts.run("meta", "leasefs --config /etc/leasefs/meta.toml report")
        for address in ("10.0.0.11:9866", "10.0.0.12:9866", "10.0.0.13:9866"):
            assert address in report, report
        stat = hosts.run("client", "LEASEFS_CONFIG=/etc/leasefs/client.toml "
                         "LEASEFS_TOKEN_FILE=/tmp/alice.token leasefs stat '%r' /client.toml")
        assert stat.strip() == "3", stat

        # on the metadata server's host, its address (not 127.0.0.1) reaches the local
        # socket: the kernel names the user, no token needed
        fetched = hosts.run("meta", "leasefs --meta 10.0.0.10:8020 token fetch /tmp/t2 && "
                            "leasefs --meta 10.0.0.10:8020 ls /")
        assert "Fetched" in fetched and "client.toml" in fetched, fetched
        # on a block server's host its block server vouches for the user (the doc's fetch
        # on s1 named its settings; the defaults find it too), on a client host nobody is
        # known without a token: the refusals say what to do
        def on(host: str, *args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["nsenter", f"--net=/var/run/netns/{NS}-{host}", sys.executable, "-m",
                 "tools", "--meta", "10.0.0.10:8020", *args], cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                timeout=60)

        vouched = on("s1", "token", "fetch", str(tmp_path / "t3"))
        assert vouched.returncode == 0 and "Fetched" in vouched.stdout, vouched.stderr
        refused = on("c", "token", "fetch", str(tmp_path / "t4"))
        assert refused.returncode == 1, refused
        assert "no block server either" in refused.stderr, refused.stderr
        refused = on("c", "ls", "/")
        assert refused.returncode == 1, refused
        assert "has not authenticated" in refused.stderr and "leasefs token fetch FILE` on " \
            "the metadata server's host or a block server's host" in refused.stderr, \
            refused.stderr
        assert "Traceback" not in refused.stderr


def test_ha_recipe_with_tls(usable, tmp_path):
    """Part 2 on nine hosts: three etcd members, two metadata servers, three block servers
    and a client, TLS between them; then the active one is stopped and the client carries
    on with the other."""
    if not os.path.exists("/usr/bin/etcd"):
        pytest.skip("no /usr/bin/etcd (Debian etcd-server)")
    names = ["etcd1", "etcd2", "etcd3", "meta1", "meta2", "s1", "s2", "s3", "client"]
    with Hosts(tmp_path, names) as hosts:
        out = hosts.follow("## 2.")
        assert re.search(r"10\.0\.0\.10:8020.*active", out["client"]), out["client"]
        assert re.search(r"10\.0\.0\.20:8020.*standby", out["client"]), out["client"]
        os.killpg(int((hosts.pids / "meta1-leasefs-meta.pid").read_text()), signal.SIGKILL)
        again = hosts.run("client", textwrap.dedent("""\
            export LEASEFS_CONFIG=/etc/leasefs/client.toml LEASEFS_TOKEN_FILE=/tmp/alice.token
            leasefs put deploy/storage-ha.toml /after-failover.toml
            leasefs cat /after-failover.toml
            leasefs cat /client.toml"""))
        assert (REPO / "deploy" / "storage-ha.toml").read_text() in again, again
        assert (REPO / "deploy" / "client-ha.toml").read_text() in again, again


def test_a_local_socket_at_a_path_reaches_another_network_namespace(usable, tmp_path):
    """A container on the metadata server's machine (another network namespace, which
    neither sees the abstract socket nor the server's TCP port) shares the folder of a
    ``meta_socket`` path: the kernel names its users there too, token fetch included."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    socket_setting = f"meta_socket={run}/meta-{{port}}.sock"
    made = []
    server = None
    try:
        for ns in (f"{NS}-ca", f"{NS}-cb"):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        for key in ("LEASEFS_META", "LEASEFS_CONFIG", "LEASEFS_TOKEN_FILE"):
            env.pop(key, None)
        address_file = tmp_path / "meta.addr"
        with open(tmp_path / "meta.log", "ab") as log:
            server = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{NS}-ca", sys.executable, "-m", "tools",
                 "meta", "--data", str(tmp_path / "meta"), "--host", "127.0.0.1", "--port",
                 "8020", "--http-port", "0", "--address-file", str(address_file),
                 "--set", socket_setting], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 30
        while not address_file.exists():
            assert server.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "meta.log").read_text()
            time.sleep(0.05)
        done = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{NS}-cb", sys.executable, "-m", "tools",
             "--meta", "127.0.0.1:8020", "--set", socket_setting, "token", "fetch",
             str(tmp_path / "container.token")], cwd=REPO, env=env, capture_output=True,
            text=True, timeout=60)
        assert done.returncode == 0 and "Fetched" in done.stdout, done.stderr
        # the abstract socket and TCP are not there: without the path, nobody
        refused = subprocess.run(
            ["nsenter", f"--net=/var/run/netns/{NS}-cb", sys.executable, "-m", "tools",
             "--meta", "127.0.0.1:8020", "--set", "rpc_retry_seconds=1", "ls", "/"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_the_systemd_units_verify(tmp_path):
    """``systemd-analyze verify`` finds nothing to say about the units (their executable
    put where this machine has one)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze")
    units = []
    for unit in (REPO / "deploy" / "systemd").glob("*.service"):
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/opt/leasefs/bin/leasefs", sys.executable))
        units.append(str(copy))
    assert len(units) == 3
    done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
