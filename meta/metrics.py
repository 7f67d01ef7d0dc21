"""The metadata server's Prometheus metrics (``leasefs_meta_*``), served at ``/metrics``
by ``meta/web.py`` from ``MetaServer.metrics_registry``.

Why it exists: what operators watch on an HDFS NameNode (RPC rates and latencies per
method, queue time, edit log sync time and batch size, the block and lease counts that
``report`` shows) in Prometheus's text format.

Where the numbers come from:

* per call: ``observe_call`` is ``fs.rpc.Dispatcher.call_observer``, called by
  ``serve_rpc`` once per call (calls by method and outcome, latency by method, queue time);
* per journal sync: ``observe_sync`` is ``Journal.sync_observer`` (fsync latency, records
  made durable by it);
* everything else is a gauge read from the server's state at scrape time (``_state``):
  nothing is kept up to date per operation for it.

Concurrency contract: everything runs on the metadata server's trio thread (the hooks are
called there, scrapes are served there); nothing awaits.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from fs.metrics import BATCH_BUCKETS, Counters, Histograms, register

PREFIX = "leasefs_meta_"
UNKNOWN_METHOD = "unknown"   # a peer's name that is no method: one series, not one per name


class MetaMetrics:
    """The metrics of one ``MetaServer``; registers itself in its ``metrics_registry``."""

    def __init__(self, server):
        self.server = server
        self._methods = frozenset(server.methods())
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
        replication = s.replication.stats()
        yield gauge("replication_queue_length", "Blocks waiting for re-replication",
                    replication["queued"])
        yield gauge("replication_pending", "Re-replications scheduled and not yet "
                    "confirmed", replication["pending"])
        yield gauge("block_servers", "Block servers by liveness", labels=["state"],
                    rows=[(("live",), len(s.datanodes.live_nodes())),
                          (("dead",), len(s.datanodes.dead_nodes()))])
        yield gauge("safe_mode", "1 while the server is in safe mode",
                    1 if s.safemode.on else 0)
        yield gauge("journal_last_txid", "Last journal transaction id written",
                    s.journal.last_txid)
        yield gauge("journal_durable_txid", "Last journal transaction id known durable",
                    s.journal.durable_txid)
        yield gauge("files", "Files in the namespace", s.ns.file_count())
        yield gauge("directories", "Directories in the namespace", s.ns.dir_count())
        yield gauge("delegation_tokens", "Live delegation tokens", len(s.tokens))


__all__ = ["MetaMetrics", "PREFIX"]
