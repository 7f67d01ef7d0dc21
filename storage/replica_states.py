"""The replica state machine of a block server: HDFS ``ReplicaState`` names, the events that
move a replica (named after the HDFS FsDataset methods that do it), ONE transition table and
``next_state``, which raises on a move the table does not have.

Why it exists: every mutation of a replica (``storage/replicas.py``) asks this table first,
so which moves are legal can be read in one place, apart from the file work that carries them
out.

Concurrency contract: pure and immutable (no I/O, no shared mutable state): safe to call from
the trio thread or a worker thread.
"""

from __future__ import annotations

import enum

from fs.errors import InvalidArgument


class ReplicaState(str, enum.Enum):
    """HDFS ReplicaState names."""

    FINALIZED = "FINALIZED"   # complete, immutable, in finalized/
    RBW = "RBW"               # replica being written by a live pipeline, in rbw/
    RWR = "RWR"               # replica waiting to be recovered: an RBW found at restart
    RUR = "RUR"               # replica under (lease) recovery
    TEMPORARY = "TEMPORARY"   # incoming copy (replication / pipeline recovery), in tmp/


class ReplicaEvent(str, enum.Enum):
    """What happens to a replica, named after the HDFS FsDataset methods that do it."""

    CREATE_RBW = "createRbw"                        # WRITE_BLOCK PIPELINE_SETUP_CREATE
    CREATE_TEMPORARY = "createTemporary"            # TRANSFER target
    FINALIZE = "finalizeReplica"                    # LAST packet acknowledged downstream
    RESTART = "addToReplicasMap"                    # found by the scan at start
    RECOVER_RBW = "recoverRbw"                      # pipeline recovery of a live writer
    APPEND = "append"                               # reopen a finalized replica
    CONVERT_TEMPORARY_TO_RBW = "convertTemporaryToRbw"
    INIT_RECOVERY = "initReplicaRecovery"           # lease recovery, primary asks
    UPDATE_UNDER_RECOVERY = "updateReplicaUnderRecovery"
    INVALIDATE = "invalidate"                       # metadata server's INVALIDATE command
    MISSING = "invalidateMissingBlock"              # its files are gone or cut: dropped
    CHECK_AND_UPDATE = "checkAndUpdate"             # directory scan found unknown files
    PATCH = "patchReplica"                          # PATCH_BLOCK: new bytes, new stamp


S, E = ReplicaState, ReplicaEvent

#: (state before or None for "no replica", event) -> state after (None = replica gone).
#: Pairs that are missing are refused by ``next_state``.
TRANSITIONS: dict[tuple[ReplicaState | None, ReplicaEvent], ReplicaState | None] = {
    (None, E.CREATE_RBW): S.RBW,
    (None, E.CREATE_TEMPORARY): S.TEMPORARY,
    (S.RBW, E.FINALIZE): S.FINALIZED,
    (S.TEMPORARY, E.FINALIZE): S.FINALIZED,
    (S.RBW, E.RESTART): S.RWR,
    (S.RWR, E.RESTART): S.RWR,
    (S.RUR, E.RESTART): S.RWR,          # RUR is not persisted: its rbw/ files come back RWR
    (S.FINALIZED, E.RESTART): S.FINALIZED,
    (S.TEMPORARY, E.RESTART): None,     # half-copied temporaries are removed
    (S.RBW, E.RECOVER_RBW): S.RBW,
    (S.FINALIZED, E.APPEND): S.RBW,
    (S.FINALIZED, E.PATCH): S.FINALIZED,   # rewritten in place under a new stamp
    (S.TEMPORARY, E.CONVERT_TEMPORARY_TO_RBW): S.RBW,
    (S.RBW, E.INIT_RECOVERY): S.RUR,
    (S.RWR, E.INIT_RECOVERY): S.RUR,
    (S.FINALIZED, E.INIT_RECOVERY): S.RUR,
    (S.RUR, E.INIT_RECOVERY): S.RUR,    # a newer recovery id takes over
    (S.RUR, E.UPDATE_UNDER_RECOVERY): S.FINALIZED,
    **{(state, E.INVALIDATE): None for state in ReplicaState},
    # only replicas nobody writes: an RBW/RUR/TEMPORARY replica's files are in flux
    (S.FINALIZED, E.MISSING): None,
    (S.RWR, E.MISSING): None,
    (None, E.CHECK_AND_UPDATE): S.FINALIZED,
}
del S, E


def next_state(state: ReplicaState | None, event: ReplicaEvent) -> ReplicaState | None:
    """The state after ``event``; ``InvalidArgument`` if the table has no such transition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        where = "no replica" if state is None else f"a {state.value} replica"
        raise InvalidArgument(f"{event.value} is not allowed on {where}") from None
