"""The HA vocabulary every process shares: the role names of a metadata server (HDFS
HAServiceState) and ``HAStatus``, the frozen record of a server's role as heartbeat and
register replies, ``report``, ``ha_status``, the web pages and ``haadmin`` carry it.

Why on the ground floor: block servers obey commands only from a server whose status says
active with the newest epoch, clients and tools print it, and the metadata server sends it;
so it is wire vocabulary, not the metadata server's own. How a role changes (the events and
the one transition table) is the metadata server's: ``meta/ha/transitions.py``.

Concurrency contract: pure and immutable (no I/O, no shared mutable state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fs.errors import InvalidArgument


class Role(str, enum.Enum):
    """HDFS HAServiceState names (plus TAKING_OVER, HDFS's transition to active)."""

    INITIALIZING = "initializing"
    STANDBY = "standby"
    OBSERVER = "observer"
    TAKING_OVER = "taking_over"
    ACTIVE = "active"
    STOPPED = "stopped"


@dataclass(frozen=True)
class HAStatus:
    """One metadata server's HA state as it travels on the wire (heartbeat and register
    replies, ``report``, ``ha_status``): ``role``; ``epoch``, the term it holds or last saw
    (0 with ``ha = none``; block servers obey only the newest); ``applied_txid``; ``lag``,
    seconds the follower's applied state is behind the newest log entry it has seen (0 for
    the active); ``node_id``; ``mode`` ("none" or "etcd")."""

    role: Role = Role.ACTIVE
    epoch: int = 0
    applied_txid: int = 0
    lag: float = 0.0
    node_id: str = ""
    mode: str = "none"

    def to_wire(self) -> dict:
        return {"role": self.role.value, "epoch": self.epoch, "applied_txid": self.applied_txid,
                "lag": round(self.lag, 6), "node_id": self.node_id, "mode": self.mode}

    @classmethod
    def from_wire(cls, wire) -> "HAStatus":
        """The status a peer sent; absent (an older server, ``ha = none``) = active, epoch 0.
        ``InvalidArgument`` for a malformed one."""
        if wire is None:
            return cls()
        try:
            return cls(role=Role(wire["role"]), epoch=int(wire.get("epoch", 0)),
                       applied_txid=int(wire.get("applied_txid", 0)),
                       lag=float(wire.get("lag", 0.0)), node_id=str(wire.get("node_id", "")),
                       mode=str(wire.get("mode", "none")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgument(f"malformed HA status {wire!r}: {exc}") from None
