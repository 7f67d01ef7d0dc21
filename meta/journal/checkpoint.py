"""Checkpoints of the metadata server (HDFS: the periodic checkpoint and ``saveNamespace``).

Why it exists: the namespace store (LevelDB) is our image and is written without fsync; the
journal is what makes mutations durable. A checkpoint makes the store durable up to its
applied txid, rolls the journal and purges the segments no longer needed, so the journal
(and the start-up that verifies it) stays bounded. The trigger must survive restarts: the
last checkpoint's txid and wall time are persisted in the store by the checkpoint's own
durable write (``record``), and ``due`` counts from them, not from the process start.

``due(last, applied, now_ns, started_ns, period, txns, journal_bytes, max_bytes)``:

1. nothing applied since the last checkpoint: not due;
2. ``applied - last.txid >= txns``: due (counted across restarts);
3. ``journal_bytes >= max_bytes`` (the journal's segments after the last checkpoint, as
   on disk, so across restarts too; ``max_bytes`` 0: never): due. A record may carry up to
   64 KiB of a small file's data: by transactions alone a journal reached 221 MB without
   a checkpoint;
4. ``now - last.time >= period`` (never checkpointed: since this process started): due.

The checkpoint itself (``Monitors.checkpoint``, under the global write lock): roll the
journal, one synced store write of the new ``CheckpointInfo`` (which makes every earlier
store write durable too), then purge every finalized segment up to its txid (but the newest
``journal_keep_segments``, default 0): the journal then holds only what follows the
checkpoint. Nothing else needs the older records: the store is the only image (no start
can replay from an earlier checkpoint), followers (ha = etcd) read the replicated log or
install an image, never these files. What is lost is the retry cache's look back after a
restart (``Journal.recent``) past the checkpoint: as HDFS, whose restart rebuilds its cache
only from the edits after the image it loads.
``save_namespace`` (HDFS ``dfsadmin -saveNamespace``) is the same checkpoint on demand,
allowed only in safe mode, where no mutation runs.

Concurrency contract: pure functions and a frozen dataclass; ``load`` reads the store (sync,
trio thread, at start).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import keys

NANOS = 1_000_000_000


@dataclass(frozen=True)
class CheckpointInfo:
    txid: int = 0       # the store was durable up to this txid
    time_ns: int = 0    # wall clock of the checkpoint; 0 = never

    def as_dict(self, applied: int, journal_bytes: int) -> dict:
        """The ``report`` entry: the checkpoint, the transactions and journal bytes since."""
        return {"txid": self.txid, "time_ns": self.time_ns, "txns_since": applied - self.txid,
                "journal_bytes_since": journal_bytes}


def load(kv) -> CheckpointInfo:
    """The last checkpoint recorded in the store (``CheckpointInfo()`` when none)."""
    return CheckpointInfo(int(keys.read_counter(kv, keys.CHECKPOINT_TXID)),
                          int(keys.read_counter(kv, keys.CHECKPOINT_TIME)))


def record(info: CheckpointInfo) -> list[tuple[bytes, bytes]]:
    """The puts of the checkpoint's synced store write."""
    return [(keys.meta_key(keys.CHECKPOINT_TXID), keys.pack(info.txid)),
            (keys.meta_key(keys.CHECKPOINT_TIME), keys.pack(info.time_ns))]


def due(last: CheckpointInfo, applied: int, now_ns: int, started_ns: int, *,
        period: float, txns: int, journal_bytes: int = 0, max_bytes: int = 0) -> bool:
    """Whether a scheduled checkpoint is due; see the module docstring for the steps."""
    if applied <= last.txid:                                     # 1
        return False
    if applied - last.txid >= txns:                              # 2
        return True
    if max_bytes > 0 and journal_bytes >= max_bytes:             # 3
        return True
    since = last.time_ns or started_ns                           # 4
    return now_ns - since >= period * NANOS
