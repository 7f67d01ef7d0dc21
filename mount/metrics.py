"""A FUSE mount's Prometheus metrics (``leasefs_mount_*``), served at ``/metrics`` by
``mount/web.py`` on ``mount_metrics_port``.

Why it exists: what the applications on a mount asked of it (operations by type and
result, their latency, bytes read and written through it) and what its writers went
through (pipeline recoveries) are only known in the mount process.

Where the numbers come from: ``mount.errors.fuse_op``, which wraps every handler, calls
``observe_op`` once per FUSE request and adds the bytes of ``read``/``write`` answers; the
pipeline recoveries are the client's count (``AsyncClient.pipeline_recoveries``), read at
scrape time.

Concurrency contract: everything runs on the mount's trio thread; nothing awaits.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

from fs.metrics import Counters, Histograms, new_registry, register

PREFIX = "leasefs_mount_"


class MountMetrics:
    """The metrics of one mount (its own registry)."""

    def __init__(self, client):
        self.client = client
        self.registry = new_registry()
        self.ops = Counters(PREFIX + "fuse_ops", "FUSE requests answered, by operation and "
                            "result (ok or the errno's name)", ("op", "result"))
        self.duration = Histograms(PREFIX + "fuse_op_duration_seconds", "Time from a FUSE "
                                   "request's handler start to its answer, by operation",
                                   ("op",))
        self.read_bytes = 0
        self.written_bytes = 0
        register(self.registry, self.collect)

    def observe_op(self, op: str, result: str, seconds: float) -> None:
        self.ops.inc((op, result))
        self.duration.observe((op,), seconds)

    def collect(self):
        yield self.ops.collect()
        yield self.duration.collect()
        yield CounterMetricFamily(PREFIX + "read_bytes", "Bytes read through the mount",
                                  value=self.read_bytes)
        yield CounterMetricFamily(PREFIX + "written_bytes", "Bytes written through the mount",
                                  value=self.written_bytes)
        yield CounterMetricFamily(PREFIX + "pipeline_recoveries", "Pipeline recoveries the "
                                  "mount's writers went through",
                                  value=self.client.pipeline_recoveries)


__all__ = ["MountMetrics", "PREFIX"]
