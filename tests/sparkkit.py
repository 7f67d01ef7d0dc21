"""What every Spark test module shares: one process cluster and one ``local[2]``
SparkSession per module, with the ``leasefs`` data source registered, and ``url``.

Each module keeps its own module-scoped fixtures (``yield from`` these) so its cluster gets
its own folder name; Spark's Python workers run in other processes and reach the cluster
over TCP like any client.
"""

from __future__ import annotations

import logging
import os
import sys

from harness import ProcessCluster


def run_cluster(tmp_path_factory, name: str):
    """A one-block-server cluster (replication 1) for the module, stopped afterwards."""
    c = ProcessCluster(tmp_path_factory.mktemp(name), n_storage=1, settings={"replication": 1})
    c.start()
    yield c
    c.stop()


def run_client(cluster):
    c = cluster.client()
    yield c
    c.close()


def run_spark(app: str):
    """A local[2] session in UTC whose Python workers use this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_connector import LeaseFSDataSource
    session = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LeaseFSDataSource)
    yield session
    session.stop()
    # py4j logs "Closing down clientserver connection" from a finalizer at interpreter exit,
    # after pytest closed the captured streams ("--- Logging error ---" noise in CI logs)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def url(cluster, path: str) -> str:
    return f"leasefs://{cluster.meta_address}{path}"
