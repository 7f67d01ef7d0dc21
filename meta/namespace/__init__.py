"""The namespace: inodes and paths over the KV store, the planners that turn a call into
journal ops, the apply of those ops, quotas, permissions, path locks and the offline
invariants check.
"""
