"""What every Spark test module shares: one process cluster and one ``local[2]``
SparkSession per module, with the ``leasefs`` data source registered, ``url``, and the
comparison with Spark's own sources (``same``: the same files in a local folder, read by
Spark's source, and in leasefs, read by ours).

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


def rows(df):
    return sorted(repr(tuple(r)) for r in df.collect())     # repr: NaN equals NaN


def put(client, local, folder: str, files: dict) -> str:
    """The same files in a local folder and in leasefs ``folder``; returns the local one."""
    local_dir = local / folder.strip("/").replace("/", "_")
    for name, data in files.items():
        path = local_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        client.write_file(f"{folder}/{name}", data, overwrite=True)
    return str(local_dir)


def ours(spark, cluster, fmt, folder, options=None, schema=None):
    reader = spark.read.format("leasefs").option("format", fmt)
    if schema:
        reader = reader.schema(schema)
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    return reader.load(url(cluster, folder))


def theirs(spark, fmt, local_dir, options=None, schema=None):
    reader = spark.read.format(fmt)
    if schema:
        reader = reader.schema(schema)
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    return reader.load(local_dir)


def same(spark, cluster, client, tmp_path, fmt, folder, files, options=None, schema=None):
    """Spark's source on a local copy and ours on leasefs give the same schema and rows."""
    local = put(client, tmp_path, folder, files)
    expected = theirs(spark, fmt, local, options, schema)
    got = ours(spark, cluster, fmt, folder, options, schema)
    assert got.schema.simpleString() == expected.schema.simpleString(), \
        (got.schema.simpleString(), expected.schema.simpleString())
    assert rows(got) == rows(expected)
    return rows(got)


def copy_out(client, folder, local_dir) -> list[str]:
    """The data files (not ``_SUCCESS``, not hidden) of leasefs ``folder`` copied into a
    local folder, for Spark's own source to read; returns their names."""
    os.makedirs(local_dir, exist_ok=True)
    names = [s.name for s in client.list_status(folder) if not s.name.startswith(("_", "."))]
    for name in names:
        with open(os.path.join(local_dir, name), "wb") as f:
            f.write(client.read_file(f"{folder}/{name}"))
    return names


def leftovers(client, root: str) -> list[str]:
    """Names under ``root`` a committed job must not leave: ``_temporary``, staging."""
    found = []
    for entry in client.list_status(root):
        if entry.name.startswith(("_temporary", ".spark-staging")):
            found.append(f"{root}/{entry.name}")
        elif entry.type == "dir":
            found += leftovers(client, f"{root}/{entry.name}")
    return found
