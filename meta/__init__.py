"""leasefs metadata server (the HDFS NameNode role).

``serverrun.run_meta_server`` is the entry point (``server.MetaServer`` the server); ``namespace`` (inode namespace + journal
apply), ``keys`` (LevelDB key schema), ``locks`` (path locks), ``leases``, ``blocks``,
``datanodes``, ``safemode`` (pure state machines), ``journal`` (edit log), ``kv`` (store),
``invariants`` (offline consistency check), ``web`` (web pages, JSON, metrics).
"""
