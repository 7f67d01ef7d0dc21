"""One HDFS port for two protocols: a connection's first bytes tell Hadoop IPC (its
preamble starts ``hrpc``) from a data-transfer op (``00 1C``, version 28, then the op code;
a SASL data-transfer handshake starts ``DE AD BE EF``). Hadoop's client connects to a
node's IPC port and its data-transfer port separately and never mixes them on one
connection, so the first two bytes decide the whole connection.

``sniff`` reads them and hands back the kind and a stream that yields them again
(``Rewound``), so the protocol's own reader sees the connection from its first byte.

Concurrency contract: one trio task per connection.
"""

from __future__ import annotations

import trio

IPC = "ipc"
DATA_TRANSFER = "data-transfer"
SNIFF_BYTES = 2
_RECEIVE = 65536


class Rewound(trio.abc.Stream):
    """``stream`` with ``head`` put back in front of what it receives next."""

    def __init__(self, stream: trio.abc.Stream, head: bytes):
        self.stream = stream
        self._head = head

    @property
    def socket(self):
        return self.stream.socket

    async def receive_some(self, max_bytes=None) -> bytes:
        if self._head:
            n = len(self._head) if max_bytes is None else max(1, max_bytes)
            out, self._head = self._head[:n], self._head[n:]
            return out
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


def describe(head: bytes) -> str:
    return f"{head[:16]!r} (neither Hadoop IPC's 'hrpc' nor data-transfer version 28's 00 1c)"


async def sniff(stream: trio.abc.Stream, timeout: float) -> tuple[str | None, bytes, Rewound]:
    """``(kind, head, stream)``: ``kind`` is ``IPC``, ``DATA_TRANSFER`` or None (the first
    bytes are neither, or fewer than two came within ``timeout`` seconds); ``head`` holds
    what was received (at least the first two bytes), which the stream yields again."""
    head = b""
    with trio.move_on_after(timeout):
        while len(head) < SNIFF_BYTES:
            try:
                # whatever came (put back whole): a peer that is closed on after its
                # bytes were all read gets a FIN, not a reset
                chunk = await stream.receive_some(_RECEIVE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                chunk = b""
            if not chunk:
                break
            head += chunk
    return kind_of(head), head, Rewound(stream, head)


def kind_of(head: bytes) -> str | None:
    if len(head) < SNIFF_BYTES:
        return None
    head = head[:SNIFF_BYTES]
    if head == b"hr":
        return IPC
    # another data-transfer version is answered by the data-transfer side, which names it
    if head[:1] == b"\x00" or head == b"\xde\xad":
        return DATA_TRANSFER
    return None
