"""High availability (ha = etcd): the role state machine and its controller, the replicated
edit log on etcd, its gRPC client and etcd's messages (``etcdpb``, generated from a schema),
and bootstrapping a standby from an image.
"""
