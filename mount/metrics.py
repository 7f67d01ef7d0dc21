"""A FUSE mount's Prometheus metrics (``leasefs_mount_*``), served at ``/metrics`` by
``mount/web.py`` on ``mount_metrics_port``.

Why it exists: what the applications on a mount asked of it (operations by type and
result, their latency, bytes read and written through it) and what its writers went
through (pipeline recoveries) are only known in the mount process.

Where the numbers come from: ``mount.errors.fuse_op``, which wraps every handler, calls
``observe_op`` once per FUSE request and adds the bytes of ``read``/``write`` answers; the
pipeline recoveries are the client's count (``AsyncClient.pipeline_recoveries``), and the
directory leases' figures (changes answered ahead of the server, batches, lost, pending,
leases held) the ``DirLeaseHolder``'s, read at scrape time.

Concurrency contract: everything runs on the mount's trio thread; nothing awaits.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fs.metrics import Counters, Histograms, new_registry, register

PREFIX = "leasefs_mount_"


class MountMetrics:
    """The metrics of one mount (its own registry)."""

    def __init__(self, client, leases=None):
        self.client = client
        self.leases = leases   # the mount's DirLeaseHolder: its changes made ahead
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
        if self.leases is not None:
            leases = self.leases
            yield CounterMetricFamily(PREFIX + "dir_lease_changes", "Namespace changes "
                                      "answered under a directory lease, before the "
                                      "metadata server applied them",
                                      value=leases.local_changes)
            yield CounterMetricFamily(PREFIX + "dir_lease_batches", "dir_batch calls that "
                                      "sent them", value=leases.batches)
            yield CounterMetricFamily(PREFIX + "dir_lease_lost", "Changes answered here that "
                                      "the metadata server refused or that a lease ending "
                                      "under the mount lost (each is logged)",
                                      value=leases.lost)
            yield CounterMetricFamily(PREFIX + "dir_lease_refused", "Directory lease "
                                      "grants the metadata server refused (too many entries, "
                                      "another holder, calls in flight): changes there were "
                                      "calls", value=leases.refused)
            yield GaugeMetricFamily(PREFIX + "dir_lease_pending", "Changes answered here "
                                    "and not yet applied by the metadata server",
                                    value=leases.pending)
            yield GaugeMetricFamily(PREFIX + "dir_leases_held", "Directory leases held",
                                    value=leases.held_count)


__all__ = ["MountMetrics", "PREFIX"]
