"""The block server's HDFS front end: DataTransferProtocol (reads, the write pipeline) over
the same replicas, checksums and generation stamps as leasefs's own data transfer."""
