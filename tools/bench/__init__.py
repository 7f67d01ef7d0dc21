"""The benchmarks (``leasefs bench KIND``, parser in ``command``): ``data`` (write, read),
``meta`` (metadata ops/s), ``fuse`` with ``calls`` and ``apps`` with ``sourcetree`` (POSIX
workloads on any folders), ``spark`` with ``sparkfloor``, ``hdfs`` (Hadoop's client against
leasefs's), ``packets`` (block servers taking an HDFS write stream), ``ha`` (failover on a
private HA cluster), ``partition`` (partitions against kills on hosts of ``tools.testbed``)
and ``cli`` (start-up). ``base`` holds what they share. Every figure comes with a same-run
baseline.
"""
