"""HDFS's own wire protocols (Hadoop IPC, ClientNamenodeProtocol, DataTransferProtocol), so
that Hadoop's client (``hdfs://``, FsShell, Spark) reads and writes leasefs: the schema
(``pb/``) and the codecs both servers' front ends use. Wire vocabulary only: no server
state."""
