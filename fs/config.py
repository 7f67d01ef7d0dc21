"""Every setting of leasefs in one place, with its default and why.

Precedence: built-in default < TOML file (``--config FILE`` or ``LEASEFS_CONFIG``) < environment
variable ``LEASEFS_<NAME>`` (upper-case setting name) < explicit overrides (command-line flags,
test fixtures). The settings table of docs/SETTINGS.md is generated from ``describe()``.

Times are seconds (float), sizes bytes (int). Tests shrink the times.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields

from .errors import InvalidArgument

DEFAULT_LOCAL_SOCKET = "@leasefs-meta-{port}"   # the meta_socket setting's default
DEFAULT_STORAGE_SOCKET = "@leasefs-storage-{port}"   # the storage_socket setting's default

KiB = 1 << 10
MiB = 1 << 20


def _s(default, doc):
    return field(default=default, metadata={"doc": doc})


@dataclass
class Config:
    # --- addresses
    meta_address: str = _s("127.0.0.1:8020", "metadata server RPC address clients connect "
                           "to; with HA a comma-separated list of every metadata server "
                           "(clients move on at StandbyError or a lost connection)")
    meta_http_port: int = _s(9870, "metadata server status page port (0 = off)")
    meta_hdfs_port: int = _s(9000, "metadata server port for Hadoop's own client (hdfs://"
                             "HOST:PORT, Hadoop IPC; 9000 as in Hadoop's single-node guide, "
                             "8020 being leasefs's RPC; 0 = off)")
    bind_host: str = _s("127.0.0.1", "address servers bind to")
    advertise_host: str = _s("", "address block servers advertise (default: the bound "
                             "address; bound to 0.0.0.0 or ::, this host's address on its "
                             "route to the metadata server)")
    storage_port: int = _s(9866, "block server data-transfer port (0 = any free port)")
    storage_http_port: int = _s(0, "block server web page and /metrics port (0 = any free "
                                "port, reported to the metadata server; -1 = off; HDFS 9864)")
    storage_hdfs_port: int = _s(0, "block server HDFS data-transfer port, for Hadoop's client "
                                "(0 = any free port, reported to the metadata server; -1 = "
                                "off; HDFS 9866)")
    storage_short_circuit: bool = _s(True, "answer getBlockLocalPathInfo on the HDFS port: "
                                     "Hadoop's client on this host may read finalized "
                                     "replica files itself (legacy short-circuit reads) when "
                                     "the OS lets it open them")
    # --- blocks and data transfer
    block_size: int = _s(128 * MiB, "default block size of new files")
    min_block_size: int = _s(1 * MiB, "smallest block size a file may be created with "
                             "(HDFS dfs.namenode.fs-limits.min-block-size)")
    max_blocks_per_file: int = _s(1_048_576, "most blocks one file may have "
                                  "(HDFS dfs.namenode.fs-limits.max-blocks-per-file)")
    replication: int = _s(3, "default replication of new files")
    min_replication: int = _s(1, "finalized replicas a block needs to be COMPLETE")
    max_replication: int = _s(32, "largest replication a file may ask for")
    bytes_per_checksum: int = _s(4096, "bytes covered by one CRC32C (chosen by measurement, docs/FIGURES.md)")
    packet_size: int = _s(1 * MiB, "payload bytes per write-pipeline packet (chosen by measurement)")
    write_window_packets: int = _s(16, "unacknowledged packets a writer may have in flight")
    # --- RPC
    max_frame: int = _s(64 * MiB, "largest RPC frame accepted; larger frames are refused unread")
    rpc_timeout: float = _s(60.0, "seconds a client waits for one RPC reply")
    rpc_retry_seconds: float = _s(30.0, "seconds a client keeps retrying a call over lost connections")
    data_timeout: float = _s(60.0, "seconds a data-transfer read or ack may stall before the peer is failed")
    data_ack_timeout_step: float = _s(5.0, "seconds added to data_timeout per pipeline node "
                                      "below the waiter when it waits for a packet's ack "
                                      "(HDFS READ_TIMEOUT_EXTENSION): the node right above a "
                                      "silent one times out first and names it")
    tcp_liveness_timeout: float = _s(3.0, "seconds a peer's host may acknowledge nothing at "
                                     "the TCP level (data or keepalive probes unanswered) "
                                     "before a connection to it fails as 'peer unreachable', "
                                     "on every TCP connection leasefs opens or accepts: a "
                                     "partitioned or powered-off host fails over this soon, "
                                     "while a slow or stopped process, whose kernel still "
                                     "answers, is waited for up to data_timeout/rpc_timeout. "
                                     "3 s is about four unanswered retransmissions; a whole "
                                     "number of seconds for idle connections (keepalive); "
                                     "0 = off (docs/design/datapath.md 'TCP liveness')")
    data_connect_timeout: float = _s(5.0, "seconds to open a data connection to a block server "
                                     "(TCP connect and TLS handshake) before it counts as "
                                     "unreachable: readers try the next replica, pipeline "
                                     "setup names it the bad node")
    data_avoid_interval: float = _s(60.0, "seconds a client tries a block server it could not "
                                    "reach (connect or read timed out, connection refused or "
                                    "broken) after every other replica of a block")
    data_stall_timeout: float = _s(0.0, "seconds an output stream's write, flush, sync or close "
                                   "(and a mount's read) may go without progress before it "
                                   "fails (0 = off; a mount uses mount_meta_timeout)")
    frame_timeout: float = _s(60.0, "seconds an RPC request frame may take to arrive whole "
                              "after its first bytes; a slower peer is disconnected with an "
                              "error")
    idle_timeout: float = _s(60.0, "seconds a server keeps a connection nothing happens on "
                             "(metadata server: no call running, nothing received; clients "
                             "reconnect by themselves; block server: until its op header "
                             "has arrived)")
    max_connections: int = _s(1000, "connections one server (metadata or block server) keeps "
                              "open at once; more are refused (0 = no limit; the metadata "
                              "server counts its local socket's apart, with the same limits "
                              "per uid)")
    max_unauthenticated_connections: int = _s(
        100, "TCP connections the metadata server keeps open at once that have not "
        "authenticated yet (security = secure), counted apart from max_connections: peers "
        "that never authenticate cannot fill the count of those that did (0 = no limit)")
    auth_timeout: float = _s(10.0, "seconds a TCP connection to the metadata server has to "
                             "authenticate (security = secure: a delegation token or the "
                             "cluster key) before it is closed, whatever it calls meanwhile")
    max_connections_per_peer: int = _s(256, "connections one server keeps open from one peer "
                                       "address; more are refused (0 = no limit)")
    rpc_buffer_limit: int = _s(256 * MiB, "bytes of request frames larger than 64 KiB the "
                               "metadata server buffers across all connections; a frame that "
                               "does not fit waits until others are read (at least max_frame)")
    data_buffer_limit: int = _s(256 * MiB, "bytes of packet data a block server holds across all "
                                "write connections (being received or waiting for the disk); "
                                "a packet that does not fit waits before it is read")
    complete_retries: int = _s(10, "times close() asks complete() before giving up (backoff doubles)")
    replace_datanode_on_failure: str = _s(
        "default", "pipeline recovery: when to add a replacement block server for a failed one "
        "(never, default or always; HDFS dfs.client.block.write.replace-datanode-on-failure."
        "policy: default = replication >= 3 and half or more of the nodes gone, or the block "
        "was hflushed/appended)")
    replace_datanode_best_effort: bool = _s(
        False, "pipeline recovery: when no replacement can be found or copied to, go on with "
        "the remaining nodes instead of failing the write; a metadata server with it on "
        "turns it on for its clients (the embedded cluster does with 3 block servers or fewer)")
    pipeline_recovery_retries: int = _s(5, "pipeline recoveries one block may go through "
                                        "before the write fails")
    # --- metadata server
    safemode_threshold: float = _s(0.999, "fraction of complete blocks reported before leaving safe mode")
    safemode_extension: float = _s(30.0, "seconds safe mode lasts after the threshold is reached")
    safemode_min_storage: int = _s(1, "live block servers required before leaving start-up safe "
                                   "mode (0: none while the namespace has no blocks; one "
                                   "once it has)")
    checkpoint_period: float = _s(3600.0, "seconds since the last checkpoint (persisted, so across "
                                  "restarts) that trigger one (LevelDB sync + segment roll + purge)")
    checkpoint_txns: int = _s(1_000_000, "transactions since the last checkpoint's txid (persisted) "
                              "that trigger one early")
    checkpoint_journal_bytes: int = _s(64 * MiB, "journal bytes written since the last "
                                       "checkpoint that trigger one early (a record may carry "
                                       "a small file's data: transactions alone let the journal "
                                       "grow to gigabytes); 0 = no such trigger")
    journal_sync_delay: float = _s(0.005, "seconds the metadata server may wait to fsync "
                                   "namespace changes it answered before their fsync (clients "
                                   "without sync_metadata, e.g. mounts), so that those of that "
                                   "moment share one fsync; a machine crash can lose this much")
    ha: str = _s("none", "metadata high availability: none (one metadata server) or etcd "
                 "(active + standby + observers; the edit log replicated on etcd, election "
                 "and fencing by etcd's leader key: docs/design/ha.md)")
    ha_etcd_endpoints: str = _s("http://127.0.0.1:2379", "ha = etcd: comma-separated client "
                                "URLs of the etcd members")
    ha_prefix: str = _s("/leasefs/default", "ha = etcd: the key prefix of this namespace's "
                        "leader key and log in etcd")
    ha_node_id: str = _s("", "ha = etcd: this metadata server's name in the election "
                         "(default: its RPC address)")
    ha_role: str = _s("standby", "ha = etcd: what a metadata server starts as: standby "
                      "(campaigns, becomes active when it wins) or observer (never "
                      "campaigns, serves reads)")
    ha_election_timeout: float = _s(3.0, "ha = etcd: seconds without keepalive after which "
                                    "the active's term ends (etcd lease TTL) and a standby "
                                    "takes over")
    ha_observer_wait: float = _s(1.0, "ha = etcd: seconds an observer lets a read wait for "
                                 "the journal txid its client has seen before sending it to "
                                 "the active (StandbyError)")
    observer_reads: bool = _s(False, "ha = etcd: a client with a list of metadata servers "
                              "sends its reads (stat, listings, block locations) to an "
                              "observer, with read-your-writes consistency, and the rest to "
                              "the active")
    ha_log_retain: int = _s(1_000_000, "ha = etcd: journal txids the replicated log keeps "
                            "behind the active's last checkpoint (older entries are deleted "
                            "after each checkpoint; a follower further behind bootstraps "
                            "itself from another server's namespace image)")
    journal_keep_segments: int = _s(0, "finalized journal segments a checkpoint keeps besides "
                                    "what follows it (0: none; the namespace store is the only "
                                    "image, so no start replays them; a restart's retry cache "
                                    "reads them when they are recent)")
    namespace_lock: str = _s("fine", "metadata server locking: fine (per-path read/write locks, "
                             "HDFS-17366; disjoint mutations share journal fsyncs) or global "
                             "(one namespace write lock per mutation, held to its fsync; for "
                             "comparison)")
    namespace_cache_entries: int = _s(1_000_000, "decoded inodes and directory entries the "
                                      "metadata server keeps in memory (0 = none)")
    gc_full_collect_interval: float = _s(600.0, "seconds between the metadata server's full "
                                         "garbage collections of its long-lived objects (in "
                                         "between, survivors of a collection are frozen: short "
                                         "pauses); 0 = CPython's default collector")
    retry_cache_expiry: float = _s(600.0, "seconds a mutating call's reply is kept for retries")
    retry_cache_entries: int = _s(200_000, "mutating calls' replies the retry cache keeps at "
                                  "most (a restart reads this many of the journal's newest "
                                  "records back into it)")
    retry_cache_look_back_delay: float = _s(0.0, "seconds a start waits before it reads the "
                                            "journal back into the retry cache (tests: calls "
                                            "that arrive while it has not finished)")
    invalidate_limit: int = _s(1000, "replica deletions handed to one block server per heartbeat")
    delete_chunk: int = _s(2000, "inodes + blocks one delete record removes; a bigger subtree is "
                           "detached at once and reclaimed in the background in records of "
                           "at most this size (HDFS incremental block deletion)")
    security: str = _s("secure", "secure: users are who the kernel (local socket) or a "
                       "delegation token says, block servers prove they hold the cluster key, "
                       "and read, write or copy a replica only for the metadata server's "
                       "block access token; simple: anyone who reaches the port is believed, "
                       "as HDFS simple authentication (tests, trusted networks)")
    cluster_key_file: str = _s("", "the cluster key (32 random bytes as 64 hex digits, mode "
                               "0600): the metadata server creates <data>/cluster.key when "
                               "missing and uses it by default; block servers need this set to "
                               "a copy of it (leasefs cluster up does that)")
    meta_socket: str = _s(DEFAULT_LOCAL_SOCKET, "the metadata server's local socket, where "
                          "the kernel tells it who each client is (SO_PEERCRED): @NAME is "
                          "Linux's abstract namespace, else a file path; {port} is its RPC "
                          "port. Clients try it before TCP: the default one for a metadata "
                          "server on a loopback address, one set explicitly always; empty = "
                          "none")
    storage_socket: str = _s(DEFAULT_STORAGE_SOCKET, "a block server's local socket "
                             "(security = secure), where it vouches for its host's users "
                             "(SO_PEERCRED) so that `leasefs token fetch` works there: "
                             "@NAME or a file path as meta_socket; {port} is its data port "
                             "(storage_port); empty = none")
    storage_vouches_users: bool = _s(True, "metadata server: issue delegation tokens to the "
                                     "users an authenticated block server vouches for (its "
                                     "host's local users, named by the kernel); false: token "
                                     "fetch only on the metadata server's host")
    token_file: str = _s("", "a delegation token file (leasefs token fetch) a client "
                         "authenticates with over TCP, e.g. from another machine (HDFS "
                         "HADOOP_TOKEN_FILE_LOCATION)")
    proxy_users: str = _s("", "users that may act for others (a FUSE mount acts for each "
                          "caller the kernel names): 'NAME=USER|USER,NAME2=*' (HDFS "
                          "hadoop.proxyuser.NAME.users); the superuser always may")
    delegation_token_renew_interval: float = _s(
        86400.0, "seconds a delegation token lives unless renewed (HDFS "
        "dfs.namenode.delegation.token.renew-interval)")
    delegation_token_max_lifetime: float = _s(
        7 * 86400.0, "seconds after its issue no renewal extends a delegation token past "
        "(HDFS dfs.namenode.delegation.token.max-lifetime)")
    tls: str = _s("off", "on: RPC and data transfer run over TLS (1.2 at least, 1.3 preferred); "
                  "servers serve only TLS, clients verify the server's certificate against "
                  "tls_ca_file and the address they connect to; off: plaintext, as HDFS by "
                  "default (measured cost in docs/OPERATIONS.md, \"Security\")")
    tls_ca_file: str = _s("", "CA certificate clients and block servers verify servers "
                          "with (default for the metadata server: <data>/tls/ca.crt, which it "
                          "creates; leasefs cluster up sets it for its block servers, and "
                          "clients that find the cluster through its cluster.json use it)")
    tls_cert_file: str = _s("", "this server's certificate (PEM, chain first to last); the "
                            "metadata server issues <data>/tls/meta.crt from its CA when "
                            "unset, leasefs cluster up issues one per block server")
    tls_key_file: str = _s("", "private key of tls_cert_file (PEM, mode 0600)")
    block_key_interval: float = _s(36000.0, "seconds between two block keys of the metadata "
                                   "server (HDFS dfs.block.access.key.update.interval)")
    block_token_lifetime: float = _s(36000.0, "seconds a block access token stays valid "
                                     "(HDFS dfs.block.access.token.lifetime); readers "
                                     "and writers get fresh ones on their own")
    trash_interval: float = _s(1440.0, "minutes a path removed with leasefs rm stays in its "
                               "owner's trash (/user/NAME/.Trash) before the metadata server "
                               "deletes it (HDFS fs.trash.interval); 0 = rm deletes at once. "
                               "The client API and the mount always delete")
    trash_checkpoint_interval: float = _s(0.0, "minutes between the metadata server's trash "
                                          "checkpoints (HDFS fs.trash.checkpoint.interval); "
                                          "0 = trash_interval")
    permissions_enabled: bool = _s(True, "check mode bits, owners and the superuser on every "
                                   "namespace operation (HDFS dfs.permissions.enabled)")
    superuser: str = _s("", "user allowed everything (default: the user running the metadata "
                        "server, as in HDFS)")
    supergroup: str = _s("supergroup", "members of this group are superusers too "
                         "(HDFS dfs.permissions.superusergroup)")
    inline_max: int = _s(64 * KiB, "a file of at most this many bytes, closed before any of "
                         "it was flushed, is kept in the namespace instead of a block "
                         "(one metadata call, no block server; 0: always blocks)")
    # --- leases
    lease_soft_limit: float = _s(60.0, "seconds after which another client may recover a lease")
    lease_hard_limit: float = _s(1200.0, "seconds after which the server recovers a lease itself")
    lock_grace: float = _s(20.0, "seconds a restarted (or newly active) metadata server waits "
                           "for the clients that held file locks to reclaim them before it "
                           "grants new ones (it stops waiting once all of them did)")
    lease_monitor_period: float = _s(2.0, "seconds between lease monitor passes")
    dir_lease_max_entries: int = _s(4096, "a directory with more entries than this is not "
                                    "leased to a mount (the lease's answer lists them all); "
                                    "at most 10000")
    dir_lease_recall_limit: float = _s(10.0, "seconds a directory lease's holder has to "
                                       "give the lease back once recalled (each batch it "
                                       "sends while recalled restarts the count); then it "
                                       "loses the lease and the waiting clients go on")
    block_recovery_retry: float = _s(90.0, "seconds before a stalled block recovery is retried "
                                     "(sooner when its primary stops heartbeating)")
    # --- block servers
    heartbeat_interval: float = _s(3.0, "seconds between block server heartbeats")
    clock_skew_warn: float = _s(5.0, "seconds a block server's wall clock may differ from the "
                                "metadata server's (seen in its heartbeats) before a warning "
                                "(log, report, web page, metrics); tokens and leases use "
                                "wall time, so hosts need synchronized clocks (NTP)")
    clock_skew_max: float = _s(30.0, "seconds of clock difference above which the metadata "
                               "server refuses a block server's registration (HBase "
                               "hbase.master.maxclockskew); 0 = never refuse")
    dead_node_interval: float = _s(630.0, "seconds of silence after which a block server is dead")
    block_report_interval: float = _s(21600.0, "seconds between full block reports")
    block_report_chunk: int = _s(50_000, "replicas per block_report call; a full report of more "
                                 "is sent as several chunks of one report id")
    disk_io_threads: int = _s(8, "worker threads a block server uses for disk I/O")
    sync_on_close: bool = _s(False, "fsync a replica's files (and their folders) when its "
                             "block is finalized (HDFS dfs.datanode.synconclose, off by "
                             "default as there: hsync/fsync(2) makes data durable)")
    # --- repair (replication monitor, block scanner)
    replication_interval: float = _s(3.0, "seconds between replication monitor passes "
                                     "(copies scheduled, surplus replicas deleted)")
    replication_max_streams: int = _s(2, "replica copies one block server may be sending at "
                                      "once (HDFS maxReplicationStreams)")
    replication_pending_timeout: float = _s(300.0, "seconds a scheduled replica copy may take "
                                            "before it is scheduled again elsewhere")
    scanner_bytes_per_second: int = _s(1 * MiB, "bytes per second a block server's scanner "
                                       "reads to verify finalized replicas")
    scanner_period: float = _s(1_814_400.0, "seconds between two scans of all finalized "
                               "replicas of a block server (HDFS: 3 weeks)")
    directory_scan_interval: float = _s(21600.0, "seconds between two reconciliations of a "
                                        "block server's replica map with its data folder: "
                                        "replicas whose files are gone or cut are dropped and "
                                        "reported, unknown ones added (HDFS dfs.datanode."
                                        "directoryscan.interval: 6 h; 0 = off)")
    # --- client
    lease_renew_period: float = _s(0.0, "client lease renewal period (0 = soft limit / 2)")
    sync_metadata: bool = _s(True, "a client's namespace changes (mkdir, create, close, "
                             "rename, delete, chmod, ...) return once the metadata server "
                             "has fsynced them (HDFS); false: once journaled to its page "
                             "cache (a crash of the server process loses nothing, a machine "
                             "crash at most the fsync that follows at once) and hsync or "
                             "sync_metadata() makes them durable")
    # --- FUSE mount
    mount_entry_timeout: float = _s(1.0, "seconds the kernel caches names of a mount "
                                    "(other clients' creates/deletes show up after this)")
    mount_attr_timeout: float = _s(1.0, "seconds the kernel caches attributes of a mount")
    mount_negative_timeout: float = _s(1.0, "seconds the kernel caches that a name does not "
                                       "exist, and for which a folder the mount made answers "
                                       "names it did not make there as missing without asking "
                                       "(another client's create shows up after this; "
                                       "0 = misses are not cached)")
    mount_sync_metadata: bool = _s(False, "sync_metadata of a mount: false, as a local "
                                   "filesystem, namespace changes are durable at fsync(2) of "
                                   "a file or folder (or within one journal fsync, ~ms)")
    mount_dir_leases: bool = _s(True, "a mount takes directory write leases and answers "
                                "unlink, rmdir and rename in the folders it holds at once, "
                                "sending them to the metadata server afterwards, in order "
                                "(durable at fsync(2) and unmount); false (or mount option "
                                "-o sync_namespace): every namespace change waits for the "
                                "metadata server")
    mount_meta_timeout: float = _s(15.0, "seconds a mount request waits for an unreachable "
                                   "metadata server, and a write, flush or fsync for block "
                                   "servers that acknowledge nothing, before failing with EIO "
                                   "(never a hung shell)")
    mount_cache_dir: str = _s("", "folder for a mount's staging files of random writes "
                              "(default: $TMPDIR/leasefs-mount-cache)")
    mount_cache_limit: int = _s(8 << 30, "bytes of staging files one mount may hold; a random "
                                "write past it fails with ENOSPC")
    mount_readahead: int = _s(8 * MiB, "kernel readahead window of a mount (set through the "
                              "mount's bdi read_ahead_kb when running as root)")
    mount_metrics_port: int = _s(-1, "port of a mount's Prometheus /metrics page on bind_host "
                                 "(-1 = off, 0 = any free port; the URL is logged)")

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | None = None, env: dict | None = None, **overrides) -> "Config":
        return cls().replace(**cls.chosen(path, env, **overrides))

    @classmethod
    def chosen(cls, path: str | None = None, env: dict | None = None, **overrides) -> dict:
        """The settings given explicitly (file < environment < overrides), as given: what
        ``load`` applies over the defaults. A client keeps these per-file choices (block
        size, replication, checksum chunk) over the server's defaults."""
        env = os.environ if env is None else env
        values: dict = {}
        path = path or env.get("LEASEFS_CONFIG")
        if path:
            import tomllib   # only with a config file: a start without one never loads it

            try:
                with open(path, "rb") as fh:
                    data = tomllib.load(fh)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise InvalidArgument(f"config file {path}: {exc}") from None
            data = data.get("leasefs", data)
            for key, value in data.items():
                values[cls._check_name(key, f"config file {path}")] = value
        for f in fields(cls):
            raw = env.get("LEASEFS_" + f.name.upper())
            if f.name == "meta_address":  # LEASEFS_META is the documented short form
                raw = env.get("LEASEFS_META") or raw
            if raw is not None:
                values[f.name] = raw
        for key, value in overrides.items():
            if value is not None:
                values[cls._check_name(key, "override")] = value
        return values

    @classmethod
    def _check_name(cls, key: str, where: str) -> str:
        names = {f.name for f in fields(cls)}
        if key not in names:
            raise InvalidArgument(f"{where}: unknown setting {key!r}")
        return key

    def replace(self, **values) -> "Config":
        typed = {}
        values = dict(values)
        for key, allowed in CHOICES.items():   # any case and spacing, stored canonical
            if key in values and values[key] is not None:
                choice = str(values[key]).strip().lower()
                # an on/off choice also takes TOML booleans and the usual spellings
                choice = ON_OFF.get(choice, choice) if "on" in allowed else choice
                if choice not in allowed:
                    raise InvalidArgument(f"setting {key}: {values[key]!r} is not one of "
                                          f"{', '.join(allowed)}")
                values[key] = choice
        types = {f.name: type(f.default) for f in fields(self)}
        for key, value in values.items():
            kind = types[self._check_name(key, "setting")]
            try:
                if kind is bool and isinstance(value, str):
                    typed[key] = value.lower() in ("1", "true", "yes", "on")
                else:
                    typed[key] = kind(value)
            except (TypeError, ValueError):
                raise InvalidArgument(f"setting {key}: {value!r} is not a {kind.__name__}") from None
        return dataclasses.replace(self, **typed)

    @property
    def renew_period(self) -> float:
        return self.lease_renew_period or self.lease_soft_limit / 2

    @property
    def rpc_silence(self) -> float:
        """Seconds a metadata server of an HA list may leave a client's calls without any
        reply before the client asks the list which server is active (``RpcClient``): the
        active's keepalive interval, a third of the election timeout, so that a frozen
        active's clients find its successor about when it takes over."""
        return self.ha_election_timeout / 3


CHOICES = {"namespace_lock": ("fine", "global"), "ha": ("none", "etcd"),
           "ha_role": ("standby", "observer"), "security": ("secure", "simple"),
           "tls": ("off", "on"),
           "replace_datanode_on_failure": ("never", "default", "always")}


ON_OFF = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


def describe() -> list[tuple[str, object, str]]:
    """``(name, default, doc)`` for every setting, for docs/SETTINGS.md and ``--help``."""
    return [(f.name, f.default, f.metadata.get("doc", "")) for f in fields(Config)]


def default_home(env: dict | None = None) -> str:
    """Where ``leasefs cluster up`` keeps data and its state file (``LEASEFS_HOME``)."""
    env = os.environ if env is None else env
    return env.get("LEASEFS_HOME") or os.path.join(os.path.expanduser("~"), ".leasefs")


def cluster_client_settings(explicit: str | None = None, env: dict | None = None) -> dict:
    """What a client needs besides the address to talk to the embedded cluster it finds
    through ``<home>/cluster.json`` (only then: an address given by ``--meta`` or
    ``LEASEFS_META`` names another cluster): ``tls`` and ``tls_ca_file`` when that cluster
    runs with TLS. Applied under the settings the caller chose itself."""
    import json

    env = os.environ if env is None else env
    if explicit or env.get("LEASEFS_META"):
        return {}
    try:
        with open(os.path.join(default_home(env), "cluster.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict) or not state.get("meta_address") \
            or not state.get("tls_ca_file"):
        return {}
    return {"tls": "on", "tls_ca_file": state["tls_ca_file"]}


def find_meta_address(explicit: str | None = None, env: dict | None = None,
                      config_file: str | None = None) -> str:
    """The metadata server to talk to: ``--meta`` flag > ``LEASEFS_META`` > the running
    embedded cluster's state file (``<home>/cluster.json``) > config file (``config_file``,
    i.e. ``--config``, else ``LEASEFS_CONFIG``) > 127.0.0.1:8020.
    Any of them may be an HA list, ``"h1:p1,h2:p2"``: returned as given, checked where it is
    parsed (``fs.rpc.parse_address_list``, which names a bad entry)."""
    import json

    env = os.environ if env is None else env
    if explicit:
        return explicit
    if env.get("LEASEFS_META"):
        return env["LEASEFS_META"]
    try:
        with open(os.path.join(default_home(env), "cluster.json")) as fh:
            address = json.load(fh).get("meta_address")
        if address:
            return address
    except (OSError, ValueError):
        pass
    return Config.load(config_file, env=env).meta_address
