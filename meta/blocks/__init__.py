"""Blocks and block servers as state: the blocks map and block states, block servers, block
reports, the replication queues and safe mode (the redundancy work that acts on them is in
``meta.services``).
"""
