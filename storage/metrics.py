"""A block server's Prometheus metrics (``leasefs_storage_*``), served at ``/metrics`` by
``storage/web.py`` from ``BlockServer.metrics_registry``.

Why it exists: what operators watch on an HDFS DataNode (bytes read and written, ops and
their latency, checksum errors, pipeline recoveries, replicas, copies) in Prometheus's
text format.

Where the numbers come from: ``observe_op`` is ``DataTransferServer.op_observer``, called
once per data-transfer connection (one op each); the byte, checksum, recovery, copy and
token counts are ``DataTransferServer.stats``, the heartbeat service's (with the commands
it obeyed and dropped, per metadata server and type) and the block scanner's own counters, and the replicas by
state are counted from the store, all read at scrape time.

Concurrency contract: everything runs on the block server's trio thread; nothing awaits.
"""

from __future__ import annotations

import collections

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fs.datatransfer import (BLOCK_LENGTH, READ_BLOCK, TRANSFER_BLOCK, WRITE_BLOCK,
                             WRITE_BLOCK_ONESHOT)
from fs.metrics import Counters, Histograms, register

from .hdfs.xfer import METRIC_OPS as HDFS_OPS
from .recovery import INIT_REPLICA_RECOVERY, UPDATE_REPLICA_UNDER_RECOVERY
from .replica_states import ReplicaState

PREFIX = "leasefs_storage_"
OPS = frozenset({WRITE_BLOCK, WRITE_BLOCK_ONESHOT, READ_BLOCK, BLOCK_LENGTH, TRANSFER_BLOCK,
                 INIT_REPLICA_RECOVERY, UPDATE_REPLICA_UNDER_RECOVERY}) | HDFS_OPS
UNKNOWN_OP = "unknown"   # a peer's name that is no op: one series, not one per name


class StorageMetrics:
    """The metrics of one ``BlockServer``; registers itself in its ``metrics_registry``."""

    def __init__(self, server):
        self.server = server
        self.ops = Counters(PREFIX + "ops", "Data-transfer ops served, by op and result "
                            "(ok, peer_gone, disk_error or the error's type)", ("op", "result"))
        self.duration = Histograms(PREFIX + "op_duration_seconds", "Time a data-transfer op "
                                   "held its connection, by op", ("op",))
        register(server.metrics_registry, self.collect)

    def observe_op(self, op, result: str, seconds: float) -> None:
        if type(op) is not str or op not in OPS:
            op = UNKNOWN_OP
        self.ops.inc((op, result))
        self.duration.observe((op,), seconds)

    def collect(self):
        server = self.server
        stats = server.transfer.stats

        def counter(name, doc, value):
            return CounterMetricFamily(PREFIX + name, doc, value=value)

        yield self.ops.collect()
        yield self.duration.collect()
        yield counter("read_bytes", "Block data sent to readers", stats.bytes_read)
        yield counter("written_bytes", "Block data written to local replicas",
                      stats.bytes_written)
        yield counter("checksum_errors", "Received packets whose data did not match its "
                      "checksums", stats.checksum_errors)
        yield counter("pipeline_recoveries", "Write pipelines set up again here by a "
                      "writer's pipeline recovery (stage PIPELINE_SETUP_STREAMING_RECOVERY)",
                      stats.streaming_recoveries)
        yield counter("recovery_copies", "Replicas copied to a replacement block server "
                      "for a writer's pipeline recovery (TRANSFER_BLOCK)", stats.copies_sent)
        yield counter("token_refusals", "Ops refused for their block access token",
                      stats.token_refusals)
        heartbeat = server.heartbeat
        transfers = CounterMetricFamily(PREFIX + "replications", "Replicas copied to other "
                                        "block servers on the metadata server's command, by "
                                        "result", labels=["result"])
        transfers.add_metric(["ok"], heartbeat.transfers_done)
        transfers.add_metric(["failed"], heartbeat.transfers_failed)
        yield transfers
        dropped = CounterMetricFamily(PREFIX + "dropped_commands", "Commands (and block key "
                                      "sets) dropped because the metadata server sending "
                                      "them was not the newest active one, by server",
                                      labels=["meta_server"])
        for actor in heartbeat.actors:
            dropped.add_metric([actor.address], actor.dropped_commands)
        yield dropped
        commands = CounterMetricFamily(PREFIX + "commands", "Commands (and block key sets) "
                                       "of register and heartbeat replies, by metadata "
                                       "server, type (INVALIDATE, TRANSFER, RECOVER_BLOCK, "
                                       "block_keys, other) and outcome (obeyed, or dropped: "
                                       "the server was not the newest active one)",
                                       labels=["meta_server", "type", "outcome"])
        for actor in heartbeat.actors:
            for (outcome, kind), count in sorted(actor.commands.items()):
                commands.add_metric([actor.address, kind, outcome], count)
        yield commands
        yield GaugeMetricFamily(PREFIX + "active_epoch", "Newest epoch of a metadata server "
                                "claiming the active role (0: ha = none)",
                                value=heartbeat.active_epoch)
        yield counter("scanner_bad_replicas", "Replicas the block scanner found corrupt or "
                      "unreadable", server.scanner.bad_found)
        states = collections.Counter(r.state for r in server.store.replicas.values())
        replicas = GaugeMetricFamily(PREFIX + "replicas", "Replicas by state",
                                     labels=["state"])
        for state in ReplicaState:
            replicas.add_metric([state.value], states.get(state, 0))
        yield replicas
        yield GaugeMetricFamily(PREFIX + "used_bytes", "Bytes the replicas take on disk",
                                value=server.store.used_bytes())
        yield GaugeMetricFamily(PREFIX + "active_ops", "Data-transfer ops in progress",
                                value=server.transfer.active_ops)


__all__ = ["StorageMetrics", "PREFIX", "OPS"]
