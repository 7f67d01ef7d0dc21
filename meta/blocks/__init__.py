"""Blocks and block servers: the blocks map and block states, block servers, block reports,
replication queues and redundancy work, and safe mode.
"""
