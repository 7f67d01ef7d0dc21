"""Services that combine the state below them (blocks, leases, journal, namespace):
where clients find blocks, redundancy work, lease recovery, the answers of retried
calls, security and delegation tokens, the background monitors, the GC policy and the
start-up progress. The front ends (``protocols``, ``web``) and the server call them.
"""
