"""The metadata server's Prometheus metrics (``leasefs_meta_*``), served at ``/metrics``
by ``meta/web/app.py`` from ``MetaServer.metrics_registry``.

Why it exists: what operators watch on an HDFS NameNode (RPC rates and latencies per
method, queue time, edit log sync time and batch size, the block and lease counts that
``report`` shows) in Prometheus's text format.

Where the numbers come from:

* per call: ``observe_call`` is ``fs.rpc.Dispatcher.call_observer``, called by
  ``serve_rpc`` once per call (calls by method and outcome, latency by method, queue time);
* per journal sync: ``observe_sync`` is ``Journal.sync_observer`` (fsync latency, records
  made durable by it);
* everything else is a gauge read from the server's state at scrape time (``_state``):
  nothing is kept up to date per operation for it;
* metadata HA (``leasefs_ha_*``, every server, ``ha = none`` too): the role (one series per
  role, 1 for the server's own), the epoch and the applied txid from
  ``role_view.status()``; the follower lag histogram takes, at each scrape, the samples
  the HA controller added to its
  ``lag_samples`` since the last one (counted by its ``entries_applied``: a follower past
  its catch-up samples every entry it applies), so its counts only grow.

Concurrency contract: everything runs on the metadata server's trio thread (the hooks are
called there, scrapes are served there); nothing awaits.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from fs.hastatus import Role
from fs.metrics import BATCH_BUCKETS, Counters, Histograms, register

PREFIX = "leasefs_meta_"
HA_PREFIX = "leasefs_ha_"
#: follower lag: from a millisecond on loopback to the election timeout and beyond
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0, 60.0)
UNKNOWN_METHOD = "unknown"   # a peer's name that is no method: one series, not one per name


class MetaMetrics:
    """The metrics of one ``MetaServer``; registers itself in its ``metrics_registry``."""

    def __init__(self, server):
        self.server = server
        # the msgpack calls, and Hadoop's on the HDFS port as hdfs.<methodName>
        self._methods = frozenset(server.methods()) | {
            f"hdfs.{method}" for translator in server.hdfs_translators
            for method in translator.CALLS}
        self.calls = Counters(PREFIX + "rpc_calls", "RPC calls answered, by method and "
                              "outcome (ok or the error's type)", ("method", "outcome"))
        self.duration = Histograms(PREFIX + "rpc_duration_seconds", "Time from the start "
                                   "of an RPC call's handler to its reply, by method",
                                   ("method",))
        self.queue = Histograms(PREFIX + "rpc_queue_seconds", "Time an RPC call waited for "
                                "a slot and a worker of its connection before it ran "
                                "(reads answered in the reader do not wait)")
        self.sync_duration = Histograms(PREFIX + "journal_sync_duration_seconds",
                                        "Journal fsync time (with the batch's write)")
        self.sync_records = Histograms(PREFIX + "journal_sync_records", "Journal records "
                                       "made durable by one fsync (group commit batch size)",
                                       buckets=BATCH_BUCKETS)
        self.ha_lag = Histograms(HA_PREFIX + "lag_seconds", "Seconds from the active's "
                                 "append of a replicated log entry to its apply on this "
                                 "follower (standby or observer)", buckets=LAG_BUCKETS)
        self._ha_seen = (None, 0)   # (controller, its entries_applied) at the last scrape
        register(server.metrics_registry, self.collect)

    def observe_call(self, method, outcome: str, queued: float, seconds: float) -> None:
        if type(method) is not str or method not in self._methods:
            method = UNKNOWN_METHOD
        values = self.calls.values
        key = (method, outcome)
        values[key] = values.get(key, 0) + 1
        self.duration.observe((method,), seconds)
        if queued:
            self.queue.observe((), queued)

    def observe_sync(self, seconds: float, records: int) -> None:
        self.sync_duration.observe((), seconds)
        self.sync_records.observe((), records)

    def collect(self):
        yield self.calls.collect()
        yield self.duration.collect()
        yield self.queue.collect()
        yield self.sync_duration.collect()
        yield self.sync_records.collect()
        yield from self._state()
        yield from self._ha()

    def _ha(self):
        status = self.server.role_view.status()
        role = GaugeMetricFamily(HA_PREFIX + "role", "1 for this metadata server's HA role "
                                 "(active, standby, observer, ...), 0 for the others",
                                 labels=["role"])
        for r in Role:
            role.add_metric([r.value], 1 if status.role is r else 0)
        yield role
        yield GaugeMetricFamily(HA_PREFIX + "epoch", "The HA term this server holds or last "
                                "saw (0 with ha = none)", value=status.epoch)
        yield GaugeMetricFamily(HA_PREFIX + "applied_txid", "Last journal transaction id "
                                "applied to this server's namespace", value=status.applied_txid)
        self._take_lag_samples()
        yield self.ha_lag.collect()

    def _take_lag_samples(self) -> None:
        ha = getattr(self.server, "ha", None)
        samples = getattr(ha, "lag_samples", None)
        if samples is None:
            return
        applied = getattr(ha, "entries_applied", 0)
        seen_ha, seen = self._ha_seen
        if seen_ha is not ha:
            seen = 0
        new = min(len(samples), max(0, applied - seen))
        for value in list(samples)[len(samples) - new:]:
            self.ha_lag.observe((), value)
        self._ha_seen = (ha, applied)

    def _state(self):
        s = self.server

        def gauge(name, doc, value=None, labels=(), rows=()):
            family = GaugeMetricFamily(PREFIX + name, doc, value=value,
                                       labels=labels or None)
            for row_labels, row_value in rows:
                family.add_metric(row_labels, row_value)
            return family

        yield gauge("leases", "Lease holders (clients writing files)", len(s.leases))
        yield gauge("files_under_construction", "Files open for writing (leased)",
                    s.leases.open_files())
        yield gauge("blocks", "Blocks by state", labels=["state"],
                    rows=[((state,), n) for state, n in s.blocks.state_counts().items()])
        counts = s.blocks.counts()
        yield gauge("blocks_under_replicated", "Complete blocks with fewer good replicas "
                    "than their replication", counts["under_replicated"])
        yield gauge("blocks_corrupt", "Blocks with at least one corrupt replica",
                    counts["corrupt"])
        yield gauge("blocks_missing", "Complete blocks without any good replica",
                    counts["missing"])
        yield gauge("replicas_pending_deletion", "Replicas to delete, sent or not, not yet "
                    "reported deleted", s.datanodes.pending_deletion())
        yield gauge("invalidate_queue_length", "Replica deletions decided and not yet sent "
                    "to their block servers", s.datanodes.invalidate_queued())
        replication = s.redundancy.replication_stats()
        yield gauge("replication_queue_length", "Blocks waiting for re-replication",
                    replication["queued"])
        yield gauge("replication_pending", "Re-replications scheduled and not yet "
                    "confirmed", replication["pending"])
        yield gauge("block_servers", "Block servers by liveness", labels=["state"],
                    rows=[(("live",), len(s.datanodes.live_nodes())),
                          (("dead",), len(s.datanodes.dead_nodes()))])
        yield gauge("block_server_clock_skew_seconds", "Largest difference between a live "
                    "block server's wall clock and this server's (seen in heartbeats)",
                    max((abs(n.clock_skew) for n in s.datanodes.live_nodes()), default=0.0))
        yield gauge("safe_mode", "1 while the server is in safe mode",
                    1 if s.safemode.on else 0)
        yield gauge("journal_last_txid", "Last journal transaction id written",
                    s.journal.last_txid)
        yield gauge("journal_durable_txid", "Last journal transaction id known durable",
                    s.journal.durable_txid)
        yield gauge("files", "Files in the namespace", s.ns.view.file_count())
        yield gauge("directories", "Directories in the namespace", s.ns.view.dir_count())
        yield gauge("delegation_tokens", "Live delegation tokens", len(s.security.tokens))


__all__ = ["MetaMetrics", "PREFIX", "HA_PREFIX"]
