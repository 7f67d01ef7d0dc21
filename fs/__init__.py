"""leasefs shared core and client.

``from fs import Client, AsyncClient`` — the public client. ``fs.errors`` is the error family,
``fs.paths`` the path rules, ``fs.config`` the settings, ``fs.rpc`` (with
``fs.rpcclient``/``fs.rpcserver``)/``fs.framing``/``fs.datatransfer`` the wire protocols
(docs/PROTOCOL.md).
"""

from . import errors
from .errors import LeaseFSError

__all__ = ["AsyncClient", "Client", "LeaseFSError", "errors"]


def __getattr__(name):  # lazy: servers import fs.errors without pulling in the client
    if name in ("AsyncClient", "Client"):
        from . import client
        return getattr(client, name)
    raise AttributeError(name)
