"""``leasefs bench hdfs``: MB/s of a sequential write and read of one ``--size`` file with
Hadoop's own client (FsShell ``-put`` and ``-cat`` from PySpark's jars, over the metadata
server's HDFS port and the block servers' data-transfer ports) next to leasefs's own CLI
(``leasefs put`` / ``leasefs cat``) on the same cluster, in the same run, with the ratio.

Why whole processes: that is what a user runs. A JVM takes a second or more to start
(more on a busy machine) and a Python CLI a fraction of one, so each round also times a
process that does almost nothing (FsShell ``-test -d /``, ``leasefs ls``): the rates are
given both raw and with that start-up subtracted ("net"), and the Java/Python ratio of
both. A third client is Hadoop's in one JVM that stays up (as in a Spark driver or
executor), driven over py4j and warmed by one untimed write and read: its rate has no
start-up or just-in-time compilation in it, which is the Java client's own speed.
``--repeat`` rounds alternate which client goes first; medians are reported.
Output goes to ``/dev/null``; the sizes of both files are checked at the end (a short
file is a failure, never a figure).

Concurrency contract: a CLI process running the measured processes one at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from xml.sax.saxutils import escape

from fs.rpc import parse_address

from ..common import Command, SOURCE_TREE
from ..formatting import UsageError, format_table, parse_size
from ..progress import StatusLine
from .base import BenchFailed, MB, add_output_options, embedded_state, mbps, payload, size_label


def hadoop_jars() -> Path | None:
    """PySpark's jar folder (Hadoop's client ships in it), or None."""
    try:
        import pyspark
    except ImportError:
        return None
    folder = Path(pyspark.__file__).parent / "jars"
    return folder if any(folder.glob("hadoop-client-api-*.jar")) else None


def hadoop_conf(folder: Path, settings: dict | None = None) -> Path:
    """A Hadoop configuration folder holding ``core-site.xml`` (FsShell refuses to start
    without one) and ``hdfs-site.xml``, both with ``settings`` (the client reads both)."""
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(f"<property><name>{escape(k)}</name><value>{escape(str(v))}</value>"
                   f"</property>\n" for k, v in (settings or {}).items())
    text = f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'
    for name in ("core-site.xml", "hdfs-site.xml"):
        (folder / name).write_text(text)
    return folder


class Runner:
    """Runs and times the two clients' processes."""

    def __init__(self, hdfs: str, meta: str, conf: Path, jars: Path):
        self.java = ["java", "-Xmx1g", "-cp", f"{conf}{os.pathsep}{jars}/*",
                     "org.apache.hadoop.fs.FsShell", "-fs", f"hdfs://{hdfs}"]
        self.leasefs = [sys.executable, "-m", "tools", "--meta", meta]
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = SOURCE_TREE + os.pathsep + self.env.get("PYTHONPATH", "")

    def _run(self, argv: list[str], what: str, stdout=subprocess.DEVNULL) -> tuple[float, bytes]:
        started = time.perf_counter()
        proc = subprocess.run(argv, env=self.env, cwd=SOURCE_TREE, stdout=stdout,
                              stderr=subprocess.PIPE, timeout=3600)
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise BenchFailed(f"{what} failed ({proc.returncode}): "
                              f"{proc.stderr.decode(errors='replace').strip()[-400:]}")
        return took, proc.stdout or b""

    def java_run(self, *args: str, what: str, stdout=subprocess.DEVNULL):
        return self._run([*self.java, *args], f"FsShell {what}", stdout)

    def leasefs_run(self, *args: str, what: str):
        return self._run([*self.leasefs, *args], f"leasefs {what}")


@contextmanager
def _java_errors(what: str):
    """A failure inside the JVM as ``BenchFailed`` naming the Java exception."""
    from py4j.protocol import Py4JError, Py4JJavaError
    try:
        yield
    except Py4JJavaError as exc:
        try:
            cause = exc.java_exception.toString()
        except Py4JError:
            cause = "the JVM went away"
        raise BenchFailed(f"Hadoop's client, {what}: {cause}") from None
    except Py4JError as exc:
        raise BenchFailed(f"Hadoop's client, {what}: {exc}") from None


def recorded_hdfs_address(meta: str) -> str | None:
    """``HOST:PORT`` of the HDFS port the embedded cluster recorded, when ``meta`` is its
    metadata server."""
    state = embedded_state(meta) or {}
    return ((state.get("meta") or {}).get("hdfs_address") or "").removeprefix(
        "hdfs://") or None


class WarmJvm:
    """Hadoop's ``FileSystem`` in one long-lived JVM (py4j, as PySpark drives its own), at
    ``replication``: ``put`` copies a local file in, ``cat`` reads a file to nothing, each
    in one call (4 MiB buffers), so the time is the Java client's and not py4j's."""

    def __init__(self, hdfs: str, conf: Path, jars: Path, replication: int):
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        port, self.proc = launch_gateway(
            classpath=f"{conf}{os.pathsep}{jars}/*", javaopts=["-Xmx1g"], die_on_exit=True,
            return_proc=True, redirect_stdout=subprocess.DEVNULL,
            redirect_stderr=subprocess.DEVNULL)
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
        jvm = self.jvm = self.gateway.jvm
        with _java_errors(f"connecting to hdfs://{hdfs}"):
            settings = jvm.org.apache.hadoop.conf.Configuration()
            settings.set("dfs.replication", str(replication))
            self.fs = jvm.org.apache.hadoop.fs.FileSystem.get(
                jvm.java.net.URI(f"hdfs://{hdfs}"), settings)

    def put(self, local: str, path: str) -> float:
        with _java_errors(f"write of {path}"):
            jvm = self.jvm
            started = time.perf_counter()
            jvm.org.apache.hadoop.io.IOUtils.copyBytes(
                jvm.java.io.FileInputStream(local),
                self.fs.create(jvm.org.apache.hadoop.fs.Path(path), True), 4 << 20, True)
            return time.perf_counter() - started

    def cat(self, path: str) -> float:
        with _java_errors(f"read of {path}"):
            jvm = self.jvm
            started = time.perf_counter()
            jvm.org.apache.hadoop.io.IOUtils.copyBytes(
                self.fs.open(jvm.org.apache.hadoop.fs.Path(path)),
                jvm.java.io.OutputStream.nullOutputStream(), 4 << 20, True)
            return time.perf_counter() - started

    def close(self) -> None:
        try:
            self.fs.close()
            self.gateway.shutdown()
        except Exception:   # noqa: BLE001 - a JVM that died answers nothing
            pass
        self.proc.kill()
        self.proc.wait()


def _local_file(folder: str, size: int) -> str:
    path = os.path.join(folder, "source")
    chunk = payload()
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(chunk[:left])
            left -= len(chunk)
    return path


def run_hdfs_bench(cmd: Command) -> int:
    a = cmd.args
    size = parse_size(a.size)
    if size <= 0 or a.repeat < 1 or a.replication < 1:
        raise UsageError("--size, --repeat and --replication must be positive")
    jars = hadoop_jars()
    if shutil.which("java") is None or jars is None:
        raise UsageError("bench hdfs needs java on PATH and pyspark's Hadoop client jars "
                         "(pip install pyspark)")
    meta = cmd.meta_address
    hdfs = a.hdfs or recorded_hdfs_address(meta) or \
        f"{parse_address(meta.split(',')[0])[0]}:{cmd.config.meta_hdfs_port}"
    status = StatusLine(enabled=not a.quiet)
    folder = a.dir.rstrip("/") + f"/hdfs-{os.getpid()}"
    java_file, py_file, jvm_file = f"{folder}/java", f"{folder}/python", f"{folder}/jvm"
    work = tempfile.mkdtemp(prefix="leasefs-bench-hdfs-")
    warm = None
    try:
        conf = hadoop_conf(Path(work) / "conf", {})
        runner = Runner(hdfs, meta, conf, jars)
        status(f"writing a {size_label(size)} local file")
        local = _local_file(work, size)
        runner.leasefs_run("mkdir", "-p", folder, what=f"mkdir -p {folder}")
        status("starting a JVM with Hadoop's client and warming it up")
        warm = WarmJvm(hdfs, conf, jars, a.replication)
        warm.put(local, jvm_file)
        warm.cat(jvm_file)
        times: dict[str, list[float]] = {k: [] for k in (
            "java_start", "java_put", "java_cat", "py_start", "py_put", "py_cat",
            "jvm_put", "jvm_cat")}
        rep = str(a.replication)
        java_start = ("java_start",
                      lambda: runner.java_run("-test", "-d", "/", what="-test -d /")[0])
        py_start = ("py_start", lambda: runner.leasefs_run("ls", folder, what="ls")[0])
        # each operation right after a start-up alone: both see about the same load
        java_steps = (
            java_start,
            ("java_put", lambda: runner.java_run("-D", f"dfs.replication={rep}", "-put", "-f",
                                                 local, java_file, what="-put")[0]),
            java_start,
            ("java_cat", lambda: runner.java_run("-cat", java_file, what="-cat")[0]),
            ("jvm_put", lambda: warm.put(local, jvm_file)),
            ("jvm_cat", lambda: warm.cat(jvm_file)))
        py_steps = (
            py_start,
            ("py_put", lambda: runner.leasefs_run("put", "-f", "--replication", rep, local,
                                                  py_file, what="put")[0]),
            py_start,
            ("py_cat", lambda: runner.leasefs_run("cat", py_file, what="cat")[0]))
        for round_ in range(a.repeat):
            order = (java_steps, py_steps) if round_ % 2 == 0 else (py_steps, java_steps)
            for steps in order:
                for key, step in steps:
                    status(f"round {round_ + 1}/{a.repeat}: {key}")
                    times[key].append(step())
        _, listing = runner.java_run("-stat", "%b", java_file, py_file, jvm_file,
                                     what="-stat", stdout=subprocess.PIPE)
        sizes = [int(x) for x in listing.split()]
        if sizes != [size, size, size]:
            raise BenchFailed(f"files of {sizes} bytes written, {size} expected")
        if not a.keep:
            runner.leasefs_run("rm", "-r", folder, what=f"rm -r {folder}")
    except BenchFailed as exc:
        raise UsageError(f"bench hdfs: {exc}") from None
    finally:
        if warm is not None:
            warm.close()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    med["jvm_start"] = 0.0
    results = {}
    for op in ("put", "cat"):
        for side, start in (("java", "java_start"), ("py", "py_start"), ("jvm", "jvm_start")):
            wall = med[f"{side}_{op}"]
            net = wall - med[start]
            results[f"{side}_{op}"] = {
                "median_s": wall, "start_s": med[start], "mb_s": mbps(size, wall),
                # None: the start-up alone took as long (a machine too busy to tell)
                "net_mb_s": mbps(size, net) if net > 0.05 * wall else None,
                "all_s": times[f"{side}_{op}"]}
    ratios = {}
    for op in ("put", "cat"):
        java, py = results[f"java_{op}"], results[f"py_{op}"]
        ratios[op] = (java["net_mb_s"] / py["net_mb_s"] if java["net_mb_s"] and py["net_mb_s"]
                      else None)
        ratios[f"{op}_raw"] = java["mb_s"] / py["mb_s"]
        # the warm JVM against leasefs's CLI net of its start: each client's own speed
        ratios[f"{op}_warm"] = (results[f"jvm_{op}"]["mb_s"] / py["net_mb_s"]
                                if py["net_mb_s"] else None)
    if a.json:
        cmd.out(json.dumps({"size": size, "replication": a.replication, "repeat": a.repeat,
                            "hdfs": hdfs, "results": results, "java_over_python": ratios},
                           indent=2))
        return 0
    cmd.out(f"leasefs bench hdfs: {size_label(size)}, replication {a.replication}, median of "
            f"{a.repeat} rounds; hdfs://{hdfs}; MB = {MB} bytes")
    headers = ["operation", "client", "wall s", "start s", "MB/s", "net MB/s",
               "Java/Python", "net"]
    rows = []
    for op, label in (("put", "write (-put / put)"), ("cat", "read (-cat / cat)")):
        for side, name in (("java", "Hadoop FsShell"), ("jvm", "Hadoop, warm JVM"),
                           ("py", "leasefs CLI")):
            r = results[f"{side}_{op}"]
            net = ratios[op if side == "java" else op + "_warm"]
            rows.append([label, name, f"{r['median_s']:.2f}", f"{r['start_s']:.2f}",
                         f"{r['mb_s']:.0f}",
                         "n/a" if r["net_mb_s"] is None else f"{r['net_mb_s']:.0f}",
                         f"{ratios[op + '_raw']:.2f}" if side == "java" else "",
                         ("n/a" if net is None else f"{net:.2f}") if side != "py" else ""])
    for line in format_table(headers, rows, align="<<" + ">" * (len(headers) - 2)):
        cmd.out(line)
    return 0


def register(bsub, common) -> None:
    q = bsub.add_parser("hdfs", parents=[common],
                        help="Hadoop's client (FsShell -put/-cat) vs leasefs put/cat: MB/s",
                        description="A sequential write and read of one --size file with "
                                    "Hadoop's own client (FsShell from PySpark's jars, "
                                    "hdfs://) and with leasefs's CLI on the same cluster, "
                                    "alternating --repeat rounds; MB/s raw and net of process "
                                    "start-up, and the Java/Python ratio; also Hadoop's "
                                    "client in a warm JVM (no start-up, as in Spark).")
    add_output_options(q)
    q.add_argument("--size", default="1G", help="bytes of the file (default 1G)")
    q.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    q.add_argument("--replication", type=int, default=3, help="replication (default 3)")
    q.add_argument("--hdfs", metavar="HOST:PORT", default=None,
                   help="the metadata server's HDFS port (default: the embedded "
                        "cluster's, or its host and port meta_hdfs_port)")
    q.set_defaults(func=run_hdfs_bench)
