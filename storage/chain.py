"""One message down a chain of block servers: an op's header and its whole payload handed to
the next node in one send (the one-shot small-block write, ``storage.oneshot``, and the
patch of a finalized block, ``storage.patch``).

Why a module of its own: both ops forward before they work on their own copy, so the nodes'
disk work overlaps, and both answer a downstream that cannot be reached the same way (ERROR
at its index); the pipeline write (``storage.transfer``) streams packets instead.

Concurrency contract: called from the task serving the upstream connection, on the trio
thread; the downstream connection it returns is the caller's to read and close.
"""

from __future__ import annotations

import logging

import trio

from fs import tls as tlsmod
from fs.dataconn import failure_cause, open_data_connection
from fs.errors import LeaseFSError
from fs.framing import FramedStream, encode_frame

from .opheader import HEADER_MAX_FRAME

log = logging.getLogger(__name__)


async def forward(config, op: str, header: dict, targets: list[str], payload: bytes,
                  name: str) -> FramedStream | None:
    """``header`` (with ``targets[1:]``) and ``payload`` to ``targets[0]`` in one send; None
    when it cannot be reached or the send fails (logged naming ``op`` and the block
    ``name``: the caller answers ERROR at its index)."""
    try:
        downstream = await open_data_connection(targets[0], config.data_connect_timeout,
                                                HEADER_MAX_FRAME, tlsmod.client(config))
    except LeaseFSError as exc:   # unreachable, or TLS refused
        log.warning("%s %s: downstream: %s", op, name, exc)
        return None
    try:
        with trio.fail_after(config.data_timeout):
            await downstream.send_all(encode_frame({**header, "targets": targets[1:]})
                                      + payload)
    except (LeaseFSError, trio.TooSlowError) as exc:
        log.warning("%s %s: forwarding to the downstream %s failed: %s", op, name, targets[0],
                    failure_cause(exc, config.data_timeout))
        with trio.CancelScope(shield=True):
            await downstream.aclose()
        return None
    return downstream
