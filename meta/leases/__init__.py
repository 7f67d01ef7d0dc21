"""Leases: the single-writer lease manager and its pure release/recovery decisions (the
recovery that acts on them is ``meta.services.lease_recovery``).
"""
