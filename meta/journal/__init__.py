"""Durability: the edit journal (segments, start plan), journaling a plan, the typed journal
ops and their store view, a file's quota charge, checkpoints and the KV store (its key
schema is ``meta.schema``).
"""
