"""Leases: the single-writer lease manager and the release/recovery of an expired lease's
files.
"""
