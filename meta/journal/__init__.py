"""Durability: the edit journal (segments, start plan), the typed journal ops and their store
view, checkpoints, the KV store and its key schema, and the answers rebuilt for retried
calls.
"""
