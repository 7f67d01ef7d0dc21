"""Networks to break, for benchmarks and tests: ``hosts`` (network namespaces on a private
bridge, with partitions by blackhole routes; needs root) and ``cutproxy`` (a loopback TCP
proxy that goes silent: a partition without root).
"""
