"""The client's end of a data-transfer connection to a block server: open one, close it
without raising, turn an error response into the exception of ``fs.errors`` it stands for,
name a node in messages.

Why a module of its own: the write pipeline (``fs/pipeline.py``), the output stream
(``fs/writer.py``) and the input stream (``fs/reader.py``) all open data connections the same
way and count the same transport failures (``IO_ERRORS``) as a replica's or node's failure;
this is the one copy they share.

Concurrency contract: stateless async helpers that run in the caller's task on the client's
trio thread; ``close_quietly`` is shielded from cancellation, so a cancelled caller still
closes its connection.
"""

from __future__ import annotations

import trio

from . import errors
from .errors import LeaseFSError, ServerUnavailable
from .framing import FramedStream
from .rpc import parse_address
from .tls import connect_tcp

#: first wait of the add_block / complete backoff loops and of an input stream's location
#: refreshes (doubles every retry)
FIRST_BACKOFF = 0.05
# transport-level failures of a data connection
IO_ERRORS = (LeaseFSError, EOFError, OSError, trio.TooSlowError, trio.BrokenResourceError,
             trio.ClosedResourceError)


def node_name(node: dict) -> str:
    return f"{node.get('address', '?')} ({node.get('node_id', '?')})"


async def open_data_connection(address: str, timeout: float, max_frame: int,
                               tls=None) -> FramedStream:
    """A framed data connection to the block server at ``address``; with ``tls``
    (``fs.tls.ClientTls``) over TLS, its certificate verified (``TlsError`` if not)."""
    host, port = parse_address(address)
    try:
        with trio.fail_after(timeout):
            stream = await connect_tcp(host, port, tls)
    except (OSError, trio.TooSlowError) as exc:
        raise ServerUnavailable(f"cannot connect to block server {address}: "
                                f"{exc or 'connect timed out'}") from None
    return FramedStream(stream, max_frame)


async def close_quietly(framed: FramedStream | None) -> None:
    if framed is None:
        return
    with trio.CancelScope(shield=True):
        try:
            await framed.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def response_error(resp, what: str) -> LeaseFSError:
    """The exception a data-transfer error response stands for."""
    if isinstance(resp, dict) and isinstance(resp.get("error"), dict):
        exc = errors.from_wire(resp["error"])
        exc.message = f"{what}: {exc.message}"
        return exc
    message = resp.get("message") if isinstance(resp, dict) else None
    return LeaseFSError(f"{what}: {message or f'unexpected response {resp!r:.200}'}")
