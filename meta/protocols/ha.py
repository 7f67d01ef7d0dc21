"""The metadata server's HA calls (PROTOCOL.md §2, "HA"): ``msync``, ``ha_status``,
``ha_failover`` and ``image_read`` (a follower's bootstrap from another server's image).

Why it exists: one role per module. These calls ask about or act on the server's HA role and
its store as a whole, not on a path or a block server; ``haadmin``, the failover client and
the bootstrap of a follower behind the purged log (``meta/ha/bootstrap.py``) send them.

``HAProtocol`` is a front end: it translates each call into calls of the services' public
API and keeps no state. Its constructor takes what it calls, by name: the HA ``role_view``
(status, and the controller with ha = etcd), the namespace's read ``view`` (its applied txid), the
open ``images`` (``ImageSource``) and the ``kv`` store they are taken of, ``permissions`` and
``access`` (superuser checks), and ``max_frame`` (an image page fits in a frame).

Concurrency contract: called only on the metadata server's trio thread, each call its own
task; only ``ha_failover`` awaits (the controller's resignation).
"""

from __future__ import annotations

from fs.errors import InvalidArgument, StandbyError

from ..ha.bootstrap import CHUNK_BYTES
from ..journal.kv import PlyvelStore
from ..namespace.namespace import check_int


class HAProtocol:
    """Handlers of the HA calls, as ``rpc_<method>(ctx, **args)``; every role serves them
    (``ANY_ROLE_METHODS``) but ``msync``, which only the active answers."""

    def __init__(self, *, role_view, view, images, kv, permissions, access, max_frame: int):
        self.role_view = role_view
        self.view = view
        self.images = images
        self.kv = kv
        self.permissions = permissions
        self.access = access
        self.max_frame = max_frame

    async def rpc_msync(self, ctx):
        """HDFS msync: the active's state id, so that the caller's next reads on an
        observer see everything acknowledged before this call (its reply carries it)."""
        return {"state_id": self.view.applied_txid}

    async def rpc_ha_status(self, ctx, reset_lag=False):
        """This server's role, epoch, applied txid and lag (``fs.hastatus.HAStatus``), with
        ``lag_stats`` (count, p50, p99, max seconds of the recent lag samples of a
        follower), ``elected_at``/``active_at`` (wall clock of its last election win and of
        when it served as active after it); ``reset_lag``: start a new sample window (a
        benchmark's measurement)."""
        answer = self.role_view.status().to_wire()
        ha = self.role_view.controller
        if ha is not None:
            answer["lag_stats"] = ha.lag_stats()
            answer.update(ha.takeover_times())
            if reset_lag:
                ha.reset_lag_stats()
        return answer

    async def rpc_ha_failover(self, ctx):
        """``haadmin -failover``: the active gives its term away (superuser only)."""
        self.permissions.check_superuser(self.access.caller_of(ctx), "haadmin -failover")
        ha = self.role_view.controller
        if ha is None:
            raise StandbyError("ha = none: there is no other metadata server to fail over to")
        return await ha.resign()

    async def rpc_image_read(self, ctx, min_txid=0, session=None, after=None):
        """A page of a consistent image of the namespace store (``meta.ha.bootstrap``): the
        first call (no ``session``) opens one at this server's applied txid, at least
        ``min_txid``; the next ones pass ``session`` and the last key read (``after``).
        Only for the cluster's servers (a connection that proved the cluster key) or the
        superuser: the image is everything, permissions included."""
        if ctx.session.get("node") is None:
            self.permissions.check_superuser(self.access.caller_of(ctx), "image_read")
        check_int(min_txid, "image_read: min_txid", low=0)
        if session is not None and not isinstance(session, str):
            raise InvalidArgument("image_read: session must be a string")
        if after is not None and not isinstance(after, bytes):
            raise InvalidArgument("image_read: after must be bytes")
        if not isinstance(self.kv, PlyvelStore):
            raise InvalidArgument("image_read: this server's store takes no snapshots")
        return self.images.read(self.kv, self.view.applied_txid, min_txid=min_txid,
                                session=session, after=after,
                                max_bytes=max(1, min(CHUNK_BYTES, self.max_frame // 4)))
