"""This server's HA role as the other services see it: whether it is active, its status for
replies and reports. The role itself is decided by the controller (``meta.ha.controller``,
with ha = etcd) through the table in ``meta.ha.transitions``; without HA there is no controller and
the server is active from start to stop.

Why it exists: the block-server front end, the monitors, the admin report and the dispatch
gate all ask "am I active?"; they hold this view instead of the server, and the controller
is installed once the server runs (``run_meta_server``).

Concurrency contract: trio thread; reads only.
"""

from __future__ import annotations

from typing import Callable

from fs.hastatus import HAStatus, Role



class RoleView:
    """``applied_txid()``: the namespace's applied txid (the status of a server without
    HA)."""

    def __init__(self, applied_txid: Callable[[], int]):
        self.controller = None    # ``HAController`` with ha = etcd, set when the server runs
        self._applied_txid = applied_txid

    def status(self) -> HAStatus:
        """This server's role, epoch, applied txid and lag (``fs.hastatus``)."""
        if self.controller is None:
            return HAStatus(applied_txid=self._applied_txid())
        return self.controller.status()

    @property
    def is_active(self) -> bool:
        """Only the active server mutates, hands out block-server commands, runs monitors."""
        return self.controller is None or self.controller.role is Role.ACTIVE

    @property
    def may_command(self) -> bool:
        """Whether block servers may be handed commands and block keys: active, and sure
        of its term (``sure_of_term``). An active that stalled past its lease answers a
        heartbeat it had already read before its fence runs; a block server that has not
        heard of the successor yet would obey it (nothing else fences commands)."""
        return self.controller is None or (self.controller.role is Role.ACTIVE
                                           and self.controller.sure_of_term())
