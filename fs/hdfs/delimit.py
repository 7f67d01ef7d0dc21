"""Protobuf's varint-delimited messages, the unit both of HDFS's protocols are made of
(Hadoop IPC frames hold them; data-transfer ops, responses and acks are them).

Concurrency contract: pure.
"""

from __future__ import annotations


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def delimited(*messages) -> bytes:
    """Each message (a protobuf message or its bytes) with its varint length in front."""
    out = []
    for message in messages:
        raw = message if isinstance(message, (bytes, bytearray)) else message.SerializeToString()
        out += (varint(len(raw)), raw)
    return b"".join(out)
