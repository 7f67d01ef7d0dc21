"""leasefs block server (HDFS DataNode role).

``storage.server.run_block_server`` is the entry point; ``replicas`` holds the replica store
(``replica_states`` its pure state table, ``replica_records`` the replica records and their
open files, ``layout`` the data folder layout and meta file format, ``startup_scan`` the scan
that rebuilds the map at start), ``transfer`` the data-transfer server (WRITE_BLOCK pipeline,
READ_BLOCK, BLOCK_LENGTH, the recovery ops, append), ``heartbeat`` the register/heartbeat/
report/command loop (one per metadata server, commands only from the active one), ``recovery``
the block recovery worker (RECOVER_BLOCK) and its pure length decision.
"""
