"""The metadata server's HDFS front end: Hadoop IPC's ``ClientProtocol`` calls translated to
the same service calls the msgpack protocol makes (``MetaServer.dispatch``: HA role, retry
cache and permissions as for every other client)."""
