"""High availability (ha = etcd): the role controller, the replicated edit log on etcd and its
gRPC/HTTP clients, and bootstrapping a standby from an image.
"""
