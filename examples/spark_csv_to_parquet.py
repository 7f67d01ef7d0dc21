"""Example job: read CSV from leasefs with Spark, aggregate, write parquet back to leasefs,
then read the result with pandas through fsspec.

    python examples/spark_csv_to_parquet.py leasefs://127.0.0.1:8020/demo

Writes ``<base>/sales.csv`` (a small sample, if missing), reads it with the ``leasefs``
Spark data source, sums the amounts per city, writes ``<base>/by_city`` as parquet (commit
protocol: ``_SUCCESS`` appears last) and reads that folder with
``pandas.read_parquet("leasefs://...")`` (the fsspec filesystem of ``fsspec_leasefs``).
"""

import os
import sys


def main(base: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pandas as pd
    from pyspark.sql import SparkSession

    from spark_connector import LeaseFSDataSource

    from spark_connector.location import client_for, parse_location
    location = parse_location(base)
    client = client_for(location.meta)          # the public fs.Client
    if not client.exists(f"{location.path}/sales.csv"):
        rows = ["city,amount,note"] + [
            f'{city},{amount},"{note}"' for city, amount, note in
            [("Lyon", 12.5, "first, with comma"), ("Oslo", 3.0, 'quoted "word"'),
             ("Lyon", 7.5, "multi\nline"), ("Kyoto", 40.0, "ünïcode")]]
        client.write_file(f"{location.path}/sales.csv", ("\n".join(rows) + "\n").encode())

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.dataSource.register(LeaseFSDataSource)
    sales = (spark.read.format("leasefs").option("format", "csv").option("header", "true")
             .schema("city string, amount double, note string").load(f"{base}/sales.csv"))
    by_city = sales.groupBy("city").sum("amount").withColumnRenamed("sum(amount)", "total")
    by_city.write.format("leasefs").option("format", "parquet").mode("overwrite") \
        .save(f"{base}/by_city")
    spark.stop()

    # pandas → fsspec → fsspec_leasefs (the "leasefs" protocol)
    result = pd.read_parquet(location.url() + "/by_city")
    result = result.sort_values("city").reset_index(drop=True)
    print(result.to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "leasefs:///demo")
