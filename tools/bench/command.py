"""``leasefs bench KIND``: the parser of the benchmarks; each kind's module adds its own
subcommand and is imported when the ``bench`` command runs.

Concurrency contract: runs on the main thread of a short-lived process.
"""

from __future__ import annotations

from . import apps, cli, data, fuse, ha, hdfs, meta, packets, partition, spark
from .base import add_output_options


def register(sub, common) -> None:
    p = sub.add_parser("bench", help="benchmarks: write, read, meta (cluster), fuse and apps "
                                     "(any folder), cli (start-up), ha and partition (private "
                                     "clusters), hdfs (Hadoop's client vs leasefs's), packets "
                                     "(block servers' cost of an HDFS write stream)",
                       description="Benchmarks with same-run baselines (local disk, loopback "
                                   "TCP) and an optional MooseFS peer.")
    bsub = p.add_subparsers(
        dest="kind", metavar="{write,read,meta,fuse,apps,spark,hdfs,packets,ha,partition,cli}")
    bsub.required = True

    def shared(q):
        add_output_options(q)
        q.add_argument("--moosefs", action="store_true",
                       help="also run on the MooseFS peer (mounted at $MFS_BASE/mnt)")
        q.add_argument("--moosefs-script", default=None, metavar="PATH",
                       help="moosefs-up.sh to start the peer (default ../shared/peers/)")

    data.register(bsub, common, shared)
    meta.register(bsub, common, shared)
    fuse.register(bsub, common)
    apps.register(bsub, common)
    spark.register(bsub, common)
    ha.register(bsub, common, shared)
    partition.register(bsub, common)
    cli.register(bsub, common)
    hdfs.register(bsub, common)
    packets.register(bsub, common)
