"""leasefs metadata server (the HDFS NameNode role).

``serverrun.run_meta_server`` is the entry point (``server.MetaServer`` the server). The
subpackages are its parts, bottom-up (each imports only those before it): ``schema`` (the
store's key schema), ``blocks`` (blocks map, block servers, reports, replication queues,
safe mode), ``leases`` (the lease manager), ``journal`` (edit log, typed journal ops,
checkpoints, KV store), ``namespace`` (inode namespace, planners, journal apply, path locks,
permissions, invariants), ``services`` (located blocks, redundancy, lease recovery, retried
calls' answers, security, monitors) and beside them ``ha`` (role, replicated log on etcd,
bootstrap), then the front ends ``protocols`` (RPC) and ``web`` (web pages, JSON, metrics).
"""
