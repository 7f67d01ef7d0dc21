"""leasefs for Spark: the Python Data Source ``leasefs`` (``LeaseFSDataSource``).

Register it once per session, then use ``format("leasefs")``::

    from spark_connector import LeaseFSDataSource
    spark.dataSource.register(LeaseFSDataSource)

See ``datasource.py`` for the options, ``commit.py`` for the write commit protocol and
``formats.py`` for the formats and ``splits.py`` for how large files are split.
"""

from .datasource import LeaseFSDataSource

__all__ = ["LeaseFSDataSource"]
