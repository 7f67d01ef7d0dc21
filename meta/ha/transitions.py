"""The HA role state machine of one metadata server: the events that move its role (the
HDFS HAServiceState names and ``HAStatus``, the wire record of a role, are in
``fs/hastatus.py``), ONE transition table and ``next_role``, which raises on a move the
table does not have.

Why it exists: which calls a server takes, whether it appends to the replicated log or tails
it, and whether block servers obey its commands all follow from its role; every change of
role asks this table first (``meta/ha.py`` does the I/O).

States (``ha = none``: a server is ACTIVE from start to stop, epoch 0):

* INITIALIZING: replaying its own journal, not yet following the log.
* STANDBY: follows the replicated log (applies every entry as it is committed) and
  campaigns for the leader key; refuses client calls with ``StandbyError``.
* OBSERVER: follows the log like a standby, never campaigns, serves read calls to clients
  that ask for them (read-your-writes through the txid a client has seen).
* TAKING_OVER: won the election; reads the log to its end before serving, so it starts from
  everything its predecessor got acknowledged.
* ACTIVE: appends every journal batch to the log fenced by its epoch; the only role whose
  block-server commands are obeyed.
* STOPPED: the server leaves this run: shut down, or its term ended (fenced, lease lost or
  no longer sure to be held, resigned). A deposed active never goes back to following in
  the same run: requests it had planned may have left traces in memory, so it starts again
  from its store and the log (``run_meta_server`` restarts it in place, on the same ports)
  and follows as a standby.

Concurrency contract: pure and immutable (no I/O, no shared mutable state).
"""

from __future__ import annotations

import enum

from fs.errors import InvalidArgument
from fs.hastatus import Role


class RoleEvent(str, enum.Enum):
    """What moves a role, named after the HDFS HAServiceProtocol/ZKFC calls that do it."""

    START_STANDBY = "transitionToStandby"     # journal replayed: follow the log
    START_OBSERVER = "transitionToObserver"   # journal replayed: follow the log, serve reads
    START_ACTIVE = "startActiveServices"      # ha = none: active from the start
    ELECTED = "becomeActive"                  # won the leader key
    CAUGHT_UP = "catchupDone"                 # read the log to its end: serve
    DEPOSED = "fenced"                        # term lost (lease expired, Fenced append)
    RESIGN = "gracefulFailover"               # haadmin -failover: give the term away
    STOP = "stop"


R, E = Role, RoleEvent

#: (role before, event) -> role after. Pairs that are missing are refused by ``next_role``.
TRANSITIONS: dict[tuple[Role, RoleEvent], Role] = {
    (R.INITIALIZING, E.START_STANDBY): R.STANDBY,
    (R.INITIALIZING, E.START_OBSERVER): R.OBSERVER,
    (R.INITIALIZING, E.START_ACTIVE): R.ACTIVE,
    (R.STANDBY, E.ELECTED): R.TAKING_OVER,
    (R.TAKING_OVER, E.CAUGHT_UP): R.ACTIVE,
    (R.TAKING_OVER, E.DEPOSED): R.STOPPED,
    (R.ACTIVE, E.DEPOSED): R.STOPPED,
    (R.ACTIVE, E.RESIGN): R.STOPPED,
    **{(role, E.STOP): R.STOPPED for role in Role},
}
del R, E

#: roles that follow the replicated log
FOLLOWING = frozenset({Role.STANDBY, Role.OBSERVER, Role.TAKING_OVER})


def next_role(role: Role, event: RoleEvent) -> Role:
    """The role after ``event``; ``InvalidArgument`` if the table has no such transition."""
    try:
        return TRANSITIONS[(role, event)]
    except KeyError:
        raise InvalidArgument(f"{event.value} is not allowed in role {role.value}") from None
