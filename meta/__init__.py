"""leasefs metadata server (the HDFS NameNode role).

``serverrun.run_meta_server`` is the entry point (``server.MetaServer`` the server). The
subpackages are its parts: ``namespace`` (inode namespace, planners, journal apply, path
locks, permissions, invariants), ``journal`` (edit log, typed journal ops, checkpoints, KV
store and key schema), ``ha`` (role controller, replicated log on etcd, bootstrap),
``blocks`` (blocks map, block servers, reports, replication, safe mode), ``leases``,
``protocols`` (RPC front ends) and ``web`` (web pages, JSON, metrics).
"""
