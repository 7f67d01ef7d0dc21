"""``leasefs cluster up|status|down``: the embedded cluster as real detached processes in a
temporary home, found by the shell tools through ``LEASEFS_HOME`` with no flags."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import trio

from harness import LOG_WATCH
from tools.cluster.processes import is_ours, mounted_fuse, process_state

FAST = ["--set", "heartbeat_interval=0.1", "--set", "dead_node_interval=3",
        "--set", "safemode_extension=0", "--set", "lease_monitor_period=0.2"]


def leasefs(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def recorded_pids(home) -> dict:
    state = json.loads((home / "cluster.json").read_text())
    pids = {"meta": state["meta"]["pid"]}
    for i, entry in enumerate(state["storage"]):
        pids[f"storage{i}"] = entry["pid"]
    return pids


def hdfs_root_is_a_folder(port: int) -> bool:
    """getFileInfo("/") over Hadoop IPC on ``port`` (the kernel names this test's user)."""
    from fs.hdfs.ipc import IpcClient
    from fs.hdfs.pb import namenode_reads_pb2 as pb

    async def ask():
        async with trio.open_nursery() as nursery:
            client = await IpcClient.connect("127.0.0.1", port, nursery, user="root")
            try:
                answer = await client.call("getFileInfo", pb.GetFileInfoRequestProto(src="/"),
                                           pb.GetFileInfoResponseProto)
            finally:
                await client.aclose()
            return answer.fs.fileType == answer.fs.IS_DIR
    return trio.run(ask)


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    LOG_WATCH.watch(home / "logs")  # the servers' logs: an error there fails the test
    yield home
    # never leak servers, whatever the test did
    try:
        pids = recorded_pids(home)
    except (OSError, ValueError, KeyError):
        return
    for name, pid in pids.items():
        data = home / ("meta" if name == "meta" else name)
        if pid and is_ours(pid, "meta" if name == "meta" else "storage", str(data)):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_up_idempotent_status_shell_restart_down(home):
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    # started with --home from a shell whose own home is elsewhere: the hint it prints must
    # find this cluster from that shell
    elsewhere = {**env, "HOME": str(home.parent / "elsewhere")}
    del elsewhere["LEASEFS_HOME"]
    up = leasefs("cluster", "up", "--home", home, "--storage", "2", "--port", "0",
                 "--storage-port", "0", "--timeout", "60", *FAST, env=elsewhere)
    assert up.returncode == 0, up.stderr + up.stdout
    assert "is up at 127.0.0.1:" in up.stdout
    hint = next(line for line in up.stdout.splitlines() if "try:" in line)
    assert f"try: LEASEFS_HOME={home} leasefs ls -l /" in hint, hint
    hinted = {**elsewhere, "LEASEFS_HOME": hint.split("LEASEFS_HOME=", 1)[1].split()[0]}
    assert leasefs("ls", "-l", "/", env=hinted).returncode == 0
    state = json.loads((home / "cluster.json").read_text())
    address = state["meta_address"]
    assert address in up.stdout and state["meta"]["port"] != 8020
    pids = recorded_pids(home)
    assert len(pids) == 3 and all(alive(p) for p in pids.values())
    assert (home / "run" / "meta.pid").read_text().strip() == str(pids["meta"])
    for name in ("meta", "storage0", "storage1"):
        assert (home / "logs" / f"{name}.log").stat().st_size > 0
        assert (home / name).is_dir()
    assert state["settings"]["replication"] == 2  # default min(3, storage)

    again = leasefs("cluster", "up", *FAST, env=env)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stdout
    assert recorded_pids(home) == pids

    status = leasefs("cluster", "status", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert address in status.stdout and "live block servers: 2" in status.stdout
    assert status.stdout.count("running") == 3
    # Hadoop's client: a free port with --port 0, named by up, status and cluster.json,
    # and a Hadoop IPC call there is answered
    hdfs = state["meta"]["hdfs_address"]
    assert hdfs.startswith("hdfs://127.0.0.1:") and hdfs in up.stdout and hdfs in status.stdout
    assert json.loads(leasefs("cluster", "status", "--json", env=env).stdout)[
        "hdfs_address"] == hdfs
    assert hdfs_root_is_a_folder(int(hdfs.rsplit(":", 1)[1]))

    # shell tools find the cluster through <home>/cluster.json with no flags at all
    assert leasefs("mkdir", "-p", "/from-home/x", env=env).returncode == 0
    ls = leasefs("ls", "/from-home", env=env)
    assert ls.returncode == 0 and ls.stdout.split() == ["x"], ls.stderr

    # half-dead: a block server dies; status says so, up restarts exactly that one
    os.kill(pids["storage1"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pids["storage1"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    degraded = leasefs("cluster", "status", env=env)
    assert degraded.returncode == 1 and "stopped" in degraded.stdout, degraded.stdout
    fix = leasefs("cluster", "up", "--timeout", "60", env=env)
    assert fix.returncode == 0, fix.stderr + fix.stdout
    assert "restarted: storage1" in fix.stdout
    new_pids = recorded_pids(home)
    assert new_pids["meta"] == pids["meta"] and new_pids["storage0"] == pids["storage0"]
    assert new_pids["storage1"] != pids["storage1"] and alive(new_pids["storage1"])
    assert json.loads((home / "cluster.json").read_text())["meta_address"] == address
    assert leasefs("ls", "/from-home", env=env).stdout.split() == ["x"]
    assert json.loads((home / "cluster.json").read_text())["meta"]["hdfs_address"] == hdfs

    # a bystander process is never touched by down
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        down = leasefs("cluster", "down", env=env)
        assert down.returncode == 0, down.stderr
        for name, pid in new_pids.items():
            assert f"{name} (pid {pid})" in down.stdout
        deadline = time.monotonic() + 10
        while any(alive(p) for p in new_pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in new_pids.values())
        assert bystander.poll() is None
        assert not (home / "run" / "meta.pid").exists()
        assert (home / "meta").is_dir()  # data kept
        stopped = leasefs("cluster", "status", env=env)
        assert stopped.returncode == 3 and "down" in stopped.stdout

        # a recorded pid that now belongs to someone else (pid reuse) is left alone
        state = json.loads((home / "cluster.json").read_text())
        state["meta"]["pid"] = bystander.pid
        (home / "cluster.json").write_text(json.dumps(state))
        again = leasefs("cluster", "down", env=env)
        assert again.returncode == 0
        assert "left alone" in again.stderr and bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.slow
@pytest.mark.allow_log_errors(r"metadata server failed: Address already in use",
                              reason="the test holds the metadata server's port")
def test_startup_failure_points_at_log_and_mounts_nothing(home):
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    with socket.socket() as taken:  # the metadata port is in use: the server cannot start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bad = leasefs("cluster", "up", "--storage", "1", "--port", port, "--storage-port", "0",
                      "--mount", home / "mnt", "--timeout", "30", *FAST, env=env)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert not mounted_fuse(str(home / "mnt"))
    first = [line for line in bad.stderr.splitlines() if line.startswith("leasefs cluster up: meta")]
    assert first and str(home / "logs" / "meta.log") in first[0], bad.stderr
    assert "Traceback" not in first[0]
    assert leasefs("cluster", "down", env=env).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("role", ["meta", "storage"])
def test_server_writes_address_file_and_exits_0_on_sigterm(tmp_path, role):
    addr = tmp_path / "run" / f"{role}.addr"
    argv = [sys.executable, "-m", "tools", role, "--data", str(tmp_path / "data"), "--port", "0",
            "--address-file", str(addr), *FAST]
    if role == "storage":   # no metadata server: it keeps retrying, still serves
        argv += ["--meta", "127.0.0.1:1", "--set", "security=simple"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not addr.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        host, port = addr.read_text().strip().rsplit(":", 1)
        assert host == "127.0.0.1"
        with socket.create_connection((host, int(port)), timeout=5):
            pass  # it really listens there
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stdout.read()
        assert not addr.exists()  # a stopped server's address is not left behind
        assert not list(addr.parent.glob("*.tmp"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine")
def test_up_with_mount_serves_files_and_down_unmounts(home, tmp_path):
    """`cluster up --mount DIR` (what `make up` does with ./mnt): files written through the
    mount are in the cluster; a second `up` keeps the mount; `down` unmounts, then stops."""
    pytest.importorskip("pyfuse3")
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    mnt = tmp_path / "mnt"
    try:
        up = leasefs("cluster", "up", "--storage", "2", "--port", "0", "--storage-port", "0",
                     "--mount", mnt, "--timeout", "60", *FAST, env=env)
        assert up.returncode == 0, up.stderr + up.stdout
        assert f"mounted at {mnt}" in up.stdout and mounted_fuse(str(mnt))
        (mnt / "notes").mkdir()
        (mnt / "notes" / "hello.txt").write_bytes(b"through the mount\n")
        cat = leasefs("cat", "/notes/hello.txt", env=env)
        assert cat.returncode == 0 and cat.stdout == "through the mount\n", cat.stderr
        again = leasefs("cluster", "up", *FAST, env=env)
        assert again.returncode == 0 and "(already)" in again.stdout, again.stdout + again.stderr
        down = leasefs("cluster", "down", env=env)
        assert down.returncode == 0 and f"unmounted {mnt}" in down.stdout, down.stdout + down.stderr
        assert not mounted_fuse(str(mnt))
    finally:
        if mounted_fuse(str(mnt)):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        leasefs("cluster", "down", env=env)


@pytest.mark.slow
def test_embedded_cluster_append_goes_on_after_a_replica_holder_dies(home, tmp_path):
    """Three block servers have no spare for a failed pipeline node, so the embedded cluster
    tells its clients to go on with the survivors (best effort): an append after the death of
    a block server holding the last block goes on, and the file is closed afterwards."""
    env = {**os.environ, "LEASEFS_HOME": str(home)}
    env.pop("LEASEFS_META", None)
    up = leasefs("cluster", "up", "--storage", "3", "--port", "0", "--storage-port", "0",
                 "--timeout", "60", *FAST, env=env)
    assert up.returncode == 0, up.stderr + up.stdout
    state = json.loads((home / "cluster.json").read_text())
    assert state["settings"]["replace_datanode_best_effort"] is True
    first = tmp_path / "first"
    first.write_bytes(b"a" * 100_000)
    assert leasefs("put", first, "/log", env=env).returncode == 0
    fsck = leasefs("fsck", "/log", "--locations", "--json", env=env)
    assert fsck.returncode == 0, fsck.stderr
    block = json.loads(fsck.stdout)["files"][0]["blocks"][-1]
    assert len(block["locations"]) == 3
    victim_port = int(block["locations"][1]["address"].rsplit(":", 1)[1])
    victims = [entry["pid"] for entry in state["storage"] if entry.get("port") == victim_port]
    assert len(victims) == 1, (victim_port, state["storage"])
    os.kill(victims[0], signal.SIGKILL)

    more = tmp_path / "more"
    more.write_bytes(b"b" * 50_000)
    append = leasefs("append", more, "/log", env=env)
    assert append.returncode == 0, append.stderr
    cat = subprocess.run([sys.executable, "-m", "tools", "cat", "/log"], env=env,
                         capture_output=True, timeout=120)
    assert cat.returncode == 0 and cat.stdout == b"a" * 100_000 + b"b" * 50_000
    leases = leasefs("leases", "--json", env=env)
    assert leases.returncode == 0 and json.loads(leases.stdout) == [], leases.stdout


@pytest.mark.slow
def test_a_block_server_without_the_cluster_key_does_not_start(tmp_path):
    """security = secure (the default): a block server started without the cluster key, or
    with a key file others may read, exits at once with one line naming what to set."""
    base = [sys.executable, "-m", "tools", "storage", "--data", str(tmp_path / "data"),
            "--port", "0", "--meta", "127.0.0.1:1", *FAST]
    loose = tmp_path / "loose.key"
    loose.write_text("ab" * 32 + "\n")
    loose.chmod(0o644)
    for extra, wanted in (([], "set cluster_key_file"),
                          (["--set", f"cluster_key_file={tmp_path / 'none.key'}"],
                           "No such file"),
                          (["--set", f"cluster_key_file={loose}"], "readable by others")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("leasefs storage:")]
        assert len(lines) == 1 and wanted in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
