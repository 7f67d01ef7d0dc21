"""Start-up progress of the metadata server (HDFS ``StartupProgress``): which phase it is in
and how far the journal replay has come, for the web pages while nothing else answers.

Phases (one transition table; ``next_phase`` refuses any other move):

1. ``OPENING_JOURNAL``: the store is made durable, the journal folder scanned and verified.
2. ``REPLAYING_JOURNAL``: records after the store's applied txid are applied, chunk by
   chunk (``replayed`` of ``to_replay``).
3. ``LOADING_MEMORY``: the blocks map, leases and tokens are rebuilt from the namespace.
4. ``RUNNING``: the RPC ports answer (safe mode, if on, is reported on its own).

Concurrency contract: pure; times (wall seconds) are passed in. A ``StartupProgress``
belongs to the metadata server's trio thread.
"""

from __future__ import annotations

import enum

from fs.errors import InternalError


class Phase(enum.Enum):
    OPENING_JOURNAL = "OPENING_JOURNAL"
    REPLAYING_JOURNAL = "REPLAYING_JOURNAL"
    LOADING_MEMORY = "LOADING_MEMORY"
    RUNNING = "RUNNING"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING_JOURNAL: frozenset({Phase.REPLAYING_JOURNAL}),
    Phase.REPLAYING_JOURNAL: frozenset({Phase.LOADING_MEMORY}),
    Phase.LOADING_MEMORY: frozenset({Phase.RUNNING}),
    Phase.RUNNING: frozenset(),
}


def next_phase(current: Phase, wanted: Phase) -> Phase:
    if wanted not in TRANSITIONS[current]:
        raise InternalError(f"start-up: no move from {current.value} to {wanted.value}")
    return wanted


class StartupProgress:
    def __init__(self, now: float):
        self.phase = Phase.OPENING_JOURNAL
        self.started = now
        self.phase_started = now
        self.applied_txid = 0       # what the store had applied before the replay
        self.last_txid = 0          # the journal's last record
        self.replayed = 0
        self.durations: dict[str, float] = {}

    def move(self, phase: Phase, now: float) -> None:
        left = self.phase
        self.phase = next_phase(self.phase, phase)
        self.durations[left.value] = now - self.phase_started
        self.phase_started = now

    def replaying(self, applied_txid: int, last_txid: int, now: float) -> None:
        self.applied_txid, self.last_txid = applied_txid, last_txid
        self.move(Phase.REPLAYING_JOURNAL, now)

    @property
    def to_replay(self) -> int:
        return max(0, self.last_txid - self.applied_txid)

    @property
    def running(self) -> bool:
        return self.phase is Phase.RUNNING

    def as_dict(self, now: float) -> dict:
        return {"phase": self.phase.value, "started": self.started,
                "seconds": round(now - self.started, 3),
                "phase_seconds": round(now - self.phase_started, 3),
                "applied_txid": self.applied_txid, "last_txid": self.last_txid,
                "replayed": self.replayed, "to_replay": self.to_replay,
                "durations": {k: round(v, 3) for k, v in self.durations.items()}}


__all__ = ["Phase", "TRANSITIONS", "next_phase", "StartupProgress"]
