"""leasefs spark_connector package."""
