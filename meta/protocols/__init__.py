"""Protocol front ends: the client, namespace, block server, admin and user-authentication RPC
handlers of the metadata server.
"""
