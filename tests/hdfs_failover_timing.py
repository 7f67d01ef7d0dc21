"""Where a kill -9 of the active metadata server costs a Spark job's writers their time (the
figures of docs/CLIENTS.md, "hdfs:// and HA"). Not a test: a measurement, run by hand::

    PYTHONPATH=$PWD:$PWD/tests python tests/hdfs_failover_timing.py FOLDER \
        [--set dfs.client.failover.sleep.max.millis=1000 ...]

The job of ``test_hdfs_spark_faults.py`` on the same two-server HA cluster and with its
Hadoop client settings (``--set`` overrides them): once without a fault (Spark's first job
in a JVM loads and compiles its classes), then again with a kill -9 of the active once
the first part file appears. Hadoop's ``RetryInvocationHandler`` (each failover and the
sleep before it) and ``ProtobufRpcEngine2`` (each call answered) log at DEBUG to
``FOLDER/java.log``; the servers log the election and the take-over. Prints the kill's
moment, the successor's election, take-over and the block server's re-registration, and
for each writer thread its first failover, its first call answered afterwards and the
failover sleeps between.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
from pathlib import Path

import sparkkit
import test_hdfs_spark_faults as job
from hakit import HACluster

LOG4J = """rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss,SSS}} %p %c{{1}} [%t]: %m%n
logger.retry.name = org.apache.hadoop.io.retry
logger.retry.level = debug
logger.pb.name = org.apache.hadoop.ipc.ProtobufRpcEngine2
logger.pb.level = debug
"""
SERVER_EVENTS = {"leads with epoch": "elected", "is active with epoch": "active",
                 "asks for a full block report": "block server re-registered"}


def wall(day: str, clock: str) -> float:
    return datetime.datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S,%f").timestamp()


def server_events(logs: Path, killed: float) -> dict[str, float]:
    """Seconds from the kill to each of ``SERVER_EVENTS``' first line after it."""
    found: dict[str, float] = {}
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            for text, name in SERVER_EVENTS.items():
                if text in line and name not in found:
                    day, clock = line.split()[:2]
                    if (at := wall(day, clock)) > killed:
                        found[name] = at - killed
    return found


def writers(java_log: Path, killed: float) -> dict[str, dict]:
    """Per thread that failed over after the kill: its first failover, its first call
    answered after it and the failover sleeps in between (seconds from the kill)."""
    day = datetime.datetime.fromtimestamp(killed).strftime("%Y-%m-%d")
    threads: dict[str, dict] = {}
    for line in java_log.read_text(errors="replace").splitlines():
        m = re.match(r"(\S+) \w+ (\w+) \[([^\]]+)\]: (.*)", line)
        if not m or (at := wall(day, m[1]) - killed) < 0:
            continue
        logger, thread, text = m[2], m[3], m[4]
        if logger == "RetryInvocationHandler" and "Trying to failover" in text:
            seen = threads.setdefault(thread, {"failed": at, "sleeps": []})
            if "answered" not in seen:
                sleep = re.search(r"sleeping for (\d+)ms", text)
                seen["sleeps"].append(int(sleep[1]) if sleep else 0)
        elif (logger == "ProtobufRpcEngine2" and text.startswith("Call: ")
              and thread in threads and "answered" not in threads[thread]):
            threads[thread]["answered"], threads[thread]["call"] = at, text
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    folder = args.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    java_log = folder / "java.log"
    (folder / "log4j2.properties").write_text(LOG4J.format(log=java_log))
    os.environ["PYSPARK_SUBMIT_ARGS"] = (f'--driver-java-options "-Dlog4j2.configurationFile='
                                         f'file:{folder / "log4j2.properties"}" pyspark-shell')
    settings = {**job.FAILING_OVER, **dict(s.split("=", 1) for s in args.set)}
    session = sparkkit.run_spark("hdfs-failover-timing")
    spark = next(session)
    with HACluster(folder / "ha", n_meta=2, n_storage=1, hdfs=True, settings={
            "inline_max": 0, "replication": 1, "block_size": job.BLOCK}) as cluster:
        active, standby = cluster.active_and_standby()
        job.configure(spark, {**settings, **cluster.hdfs_conf([active, standby],
                                                              nameservice="leasefs-ha")})
        with cluster.client() as client:
            warm = job.Job(spark, "hdfs://leasefs-ha/no-fault").wait()
            faulty = job.Job(spark, "hdfs://leasefs-ha/ha-job")
            job.until_writing(client, faulty, "/ha-job")
            killed = time.time()
            cluster.kill_meta(active)
            seconds = faulty.wait()
            job.check_every_row(spark, client, "/ha-job", "hdfs://leasefs-ha/ha-job")
    events = server_events(folder / "ha" / "logs", killed)
    print(f"settings: {settings}")
    print(f"the job without a fault (the JVM's first) {warm:.2f} s; with the kill "
          f"{seconds:.2f} s, every row")
    print("after the kill: " + ", ".join(f"{name} {at:.3f} s" for name, at in events.items()))
    served = events.get("active", 0.0)
    for thread, seen in sorted(writers(java_log, killed).items()):
        answered = (f"first call answered {seen['answered']:.3f} s ({seen['call']}), "
                    f"{seen['answered'] - served:.3f} s after the successor served"
                    if "answered" in seen else "no call answered")
        print(f"  {thread}: first failover {seen['failed']:.3f} s, {answered}; failover "
              f"sleeps (ms) {seen['sleeps']}")
    for _ in session:     # stops the session
        pass


if __name__ == "__main__":
    sys.exit(main())
