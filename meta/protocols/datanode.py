"""The metadata server's block-server protocol (HDFS ``DatanodeProtocol``): register_storage,
heartbeat, block_report, block_received_and_deleted, commit_block_synchronization and
report_bad_blocks (PROTOCOL.md §2, §4).

Why it exists: one role per module. HDFS keeps the calls of DataNodes apart from those of
clients (``client.py``) and administrators (``admin.py``). The handlers check the caller
and the arguments; block reports are applied by ``meta/blocks/reports.py``
(``BlockReports``), the node table is ``meta/blocks/datanodes.py``. report_bad_blocks is here because
it is a replica-state report (HDFS has it in both protocols; readers and block servers send it).

``DatanodeProtocol`` is a front end: it translates each call into calls of the services'
public API and keeps no state of its own but a connection's authentication (its session).
Its constructor takes what it calls, by name: the namespace (``ns``), the blocks map and the
report applier (``blocks``, ``reports``), the node table (``datanodes``), ``safemode``, the
``journal`` (commit_block_synchronization's record), the HA ``role_view``, ``security``
(cluster key, block keys and tokens), ``recovery`` (running block recoveries and the
RECOVER commands a heartbeat reply carries), ``redundancy`` (its TRANSFER commands),
``locking`` and ``access`` (a block recovery's file lock, a reader's permission), the
clock-skew limits, the wall clock (``wall_ns``), and the server's ``node_dead`` (a
re-registration displaces a node) and ``update_safemode``.

HA: register and heartbeat replies carry ``"ha"`` (``HAStatus.to_wire``: role, epoch, ...) so
a block server obeys only the newest active server. A server that is not active
(``is_active`` false: standby, observer, taking over) still takes registrations, heartbeats
and every report, so its blocks map is warm when it takes over, but its replies carry no
commands and no block keys, and it refuses ``commit_block_synchronization`` and
``report_bad_blocks`` with ``StandbyError`` (they change what the active decides; the caller
moves on to the active server). After a takeover (``MetaServer.became_active``) a node gets no
INVALIDATE until its fresh full report, which its next heartbeat reply asks for with
``"full_report": true`` (``DatanodeManager.start_epoch``).

Concurrency contract: called only on the metadata server's trio thread, each call its own
task; a handler awaits only the journal, a file lock (commit_block_synchronization) and the
bounded steps ``BlockReports`` cuts a big block report into.
"""

from __future__ import annotations

import logging
import math

from fs import nodeauth, paths
from fs.blocktoken import COPY as COPY_TOKEN
from fs.errors import (AuthenticationFailed, ClockSkew, InvalidArgument, PermissionDenied,
                       RegistrationRefused, StaleGenerationStamp, StandbyError)
from fs.rpc import LOCAL_PEER_PREFIX, format_address, is_loopback_host, parse_address

from ..blocks import blocks as bm
from ..namespace.namespace import check_bool, check_int, check_name
from ..namespace.permissions import READ
from ..blocks.reports import parse_entries

log = logging.getLogger(__name__)


def _skew_text(skew: float) -> str:
    return f"{abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the metadata server's"


class DatanodeProtocol:
    """Handlers of HDFS DatanodeProtocol calls, as ``rpc_<method>(ctx, **args)``.

    Under ``security = secure`` (``node_key`` set) every call of this protocol needs a
    connection a block server authenticated with ``node_challenge`` + ``node_authenticate``
    (``fs.nodeauth``), and one naming a node acts for that node only; ``report_bad_blocks``
    also takes a reader's report of a block of a file it may read. Callers in the server's
    own process (``ctx.user`` None) pass."""

    def __init__(self, *, ns, blocks, reports, datanodes, safemode, journal, role_view,
                 security, recovery, redundancy, locking, access, clock_skew_warn: float,
                 clock_skew_max: float, wall_ns, node_dead, update_safemode):
        self.ns = ns
        self.blocks = blocks
        self.reports = reports
        self.datanodes = datanodes
        self.safemode = safemode
        self.journal = journal
        self.role_view = role_view
        self.security = security
        self.recovery = recovery
        self.redundancy = redundancy
        self.locking = locking
        self.access = access
        self.clock_skew_warn = clock_skew_warn   # seconds: a node past it is warned about
        self.clock_skew_max = clock_skew_max     # seconds: one past it may not register
        self.wall_ns = wall_ns
        self.node_dead = node_dead
        self.update_safemode = update_safemode

    # ================================================================== authentication
    async def rpc_node_challenge(self, ctx):
        """Step 1 of ``fs.nodeauth``: a fresh nonce, for this connection and one answer."""
        nonce = nodeauth.new_nonce()
        ctx.session["challenge"] = nonce
        return nonce

    async def rpc_node_authenticate(self, ctx, node_id, client_nonce, proof):
        """Steps 2-3 of ``fs.nodeauth``: a block server's proof of the cluster key; on a
        match the connection belongs to ``node_id`` and the answer proves the key back."""
        check_name(node_id, "node_authenticate: node_id")
        challenge = ctx.session.pop("challenge", None)
        key = self.security.node_key
        if key is None:
            raise AuthenticationFailed("node_authenticate: this metadata server runs with "
                                       "security = simple (no cluster key)")
        if not (challenge is not None and isinstance(client_nonce, bytes)
                and len(client_nonce) == nodeauth.NONCE_BYTES
                and nodeauth.same(proof, nodeauth.node_proof(key, challenge, client_nonce,
                                                             node_id))):
            log.warning("block server authentication from %s as %r refused: %s", ctx.peer,
                        node_id[:80], "no challenge on this connection" if challenge is None
                        else "wrong proof (not the cluster key, or not for this challenge)")
            raise AuthenticationFailed(f"block server {node_id[:80]!r} from {ctx.peer}: "
                                       f"authentication refused (wrong cluster key, or no "
                                       f"fresh challenge on this connection)")
        ctx.session["node"] = node_id
        log.info("block server %s authenticated from %s", node_id, ctx.peer)
        return nodeauth.meta_proof(key, challenge, client_nonce, node_id)

    def _secured(self, ctx) -> bool:
        """Whether this call is checked (security = secure, a caller from the wire)."""
        return self.security.secure and getattr(ctx, "user", None) is not None

    def _node_caller(self, ctx, what: str, node_id=None) -> str | None:
        """The block server this connection authenticated as (None without security);
        ``AuthenticationFailed`` when it did not, or acts for another node."""
        if not self._secured(ctx):
            return None
        node = ctx.session.get("node")
        if node is None:
            raise AuthenticationFailed(f"{what}: only an authenticated block server may call "
                                       f"this (security = secure; this connection did not "
                                       f"prove it holds the cluster key)")
        if node_id is not None and node_id != node:
            raise AuthenticationFailed(f"{what}: this connection authenticated as block "
                                       f"server {node}, not {str(node_id)[:80]}")
        return node

    # ================================================================== block server RPCs
    @staticmethod
    def _check_usage(capacity, used, remaining) -> None:
        for name, value in (("capacity", capacity), ("used", used), ("remaining", remaining)):
            check_int(value, name, low=0)

    def _require_active(self, what: str) -> None:
        """``StandbyError`` unless this server is the active one."""
        if not self.role_view.is_active:
            status = self.role_view.status()
            raise StandbyError(f"{what}: metadata server {status.node_id or '(no id)'} is "
                               f"{status.role.value} (epoch {status.epoch}), not active; "
                               f"send it to the active metadata server")

    def _registered(self, ctx, node_id, what: str):
        check_name(node_id, f"{what}: node_id")
        self._node_caller(ctx, what, node_id)
        node = self.datanodes.live(node_id)
        if node is None:
            raise InvalidArgument(f"{what}: block server {node_id} is not registered "
                                  f"(register_storage first)")
        return node

    @staticmethod
    def _check_reachable(ctx, node_id: str, host: str, address: str) -> None:
        """Refuse a loopback address from a block server that connected from another host:
        clients and other block servers would reach themselves, not it (and every such
        node would look like the same one)."""
        peer = getattr(ctx, "peer", None) or "?"
        if peer == "?" or peer.startswith(LOCAL_PEER_PREFIX):
            return
        peer_host = parse_address(peer)[0]
        if is_loopback_host(host) and not is_loopback_host(peer_host):
            log.warning("block server %s from %s refused: it advertises %s, a loopback "
                        "address", node_id, peer, address)
            raise RegistrationRefused(
                f"register_storage: block server {node_id} connected from {peer_host} but "
                f"advertises {address}, a loopback address no other host reaches; start it "
                f"with --host set to its host's address (or 0.0.0.0), or set advertise_host")

    def _clock_skew(self, node_id, wall_time, what: str) -> float | None:
        """The node's wall clock minus ours (``wall_time``: its clock when it sent the
        call), or None when it did not say."""
        if wall_time is None:
            return None
        if not isinstance(wall_time, (int, float)) or isinstance(wall_time, bool) \
                or not math.isfinite(wall_time):
            raise InvalidArgument(f"{what}: wall_time must be seconds since the epoch")
        return wall_time - self.wall_ns() / 1e9

    def _note_clock(self, node, skew: float | None) -> None:
        """Keep the node's clock skew; log when it leaves ``clock_skew_warn`` and when it
        is back (not at every heartbeat)."""
        if skew is None:
            return
        limit = self.clock_skew_warn
        warned = self.datanodes.note_clock_skew(node.node_id, skew, limit)
        if warned is True:
            log.warning("block server %s at %s: its clock is %s (more than clock_skew_warn = "
                        "%g s): synchronize the hosts' clocks (NTP); tokens and leases use "
                        "wall time", node.node_id, node.address, _skew_text(skew), limit)
        elif warned is False:
            log.info("block server %s: its clock is back within %g s of ours (%s)",
                     node.node_id, limit, _skew_text(skew))

    async def rpc_register_storage(self, ctx, node_id, address, capacity=0, used=0, remaining=0,
                                   http_port=None, wall_time=None, hdfs_port=None):
        """``http_port``: the port of the node's own web page (on its address's host), so
        the metadata server's pages can link to it; None when it serves none.
        ``hdfs_port``: its HDFS data-transfer port (Hadoop's client), None when none.
        ``wall_time``: the node's clock (a skew past ``clock_skew_max`` is refused)."""
        check_name(node_id, "register_storage: node_id")
        self._node_caller(ctx, "register_storage", node_id)
        if not isinstance(address, str):
            raise InvalidArgument("register_storage: address must be 'host:port'")
        host, port = parse_address(address)
        if port == 0:
            raise InvalidArgument(f"register_storage: address {address!r} has no port")
        self._check_reachable(ctx, node_id, host, address)
        self._check_usage(capacity, used, remaining)
        if http_port is not None:
            check_int(http_port, "register_storage: http_port", low=1, high=65535)
        if hdfs_port is not None:
            check_int(hdfs_port, "register_storage: hdfs_port", low=1, high=65535)
        skew = self._clock_skew(node_id, wall_time, "register_storage")
        limit = self.clock_skew_max
        if skew is not None and limit > 0 and abs(skew) > limit:
            log.warning("block server %s at %s refused: its clock is %s (more than "
                        "clock_skew_max = %g s)", node_id, address, _skew_text(skew), limit)
            raise ClockSkew(f"register_storage: block server {node_id} at {address}: its "
                            f"clock is {_skew_text(skew)} (more than clock_skew_max = "
                            f"{limit:g} s); synchronize the hosts' clocks (NTP, chrony) and "
                            f"it registers by itself")
        node, fresh, displaced = self.datanodes.register(node_id, format_address((host, port)),
                                                         capacity, used, remaining, http_port,
                                                         hdfs_port)
        for other in displaced:
            self.node_dead(other)
        self._note_clock(node, skew)
        if self.reports.abandon(node_id):
            log.info("block server %s registered again: its unfinished block report is "
                     "abandoned", node_id)
        log.info("block server %s registered at %s%s", node_id, node.address,
                 "" if fresh else " (again)")
        self.update_safemode()
        answer = {"namespace_id": self.ns.view.namespace_id, "ha": self.role_view.status().to_wire()}
        keys = self.security.block_keys_for(None) if self.role_view.may_command else None
        if keys is not None:   # the block keys its readers' tokens are checked with
            answer["block_keys"] = keys
        return answer

    async def rpc_heartbeat(self, ctx, node_id, capacity=0, used=0, remaining=0, xceivers=0,
                            block_keys_version=None, wall_time=None):
        check_name(node_id, "heartbeat: node_id")
        self._node_caller(ctx, "heartbeat", node_id)
        self._check_usage(capacity, used, remaining)
        skew = self._clock_skew(node_id, wall_time, "heartbeat")
        node = self.datanodes.heartbeat(node_id, capacity, used, remaining,
                                        xceivers if isinstance(xceivers, int) else 0)
        if node is None:
            return {"reregister": True, "commands": []}
        # a live node whose clock drifts is warned about, not dropped: its replicas stay
        self._note_clock(node, skew)
        commands = []
        # not active, or no longer sure of its term: no commands at all (the block server
        # would drop them anyway, once it knows of the successor); the queues keep them
        active = self.role_view.may_command
        if active and not self.safemode.on:   # no deletions before the namespace is whole
            # only deletions decided on a durable namespace (see datanodes.py), and none
            # before the node's first full report after a takeover
            refs = self.datanodes.take_invalidate(node_id, self.journal.durable_txid)
            if refs:
                commands.append({"type": "INVALIDATE", "blocks": refs})
            for command in self.redundancy.take_transfer_commands(node_id):
                # the copy token the node shows its targets (made now: fresh when it leaves)
                block = command["block"]
                token = self.security.block_token(block["id"], block["gs"], node_id, COPY_TOKEN)
                commands.append(command if token is None else {**command, "token": token})
        if active:
            commands.extend(self.recovery.take_recover_commands(node_id))
        answer = {"reregister": False, "commands": commands, "ha": self.role_view.status().to_wire()}
        if self.datanodes.full_report_wanted(node_id):   # the first heartbeat after takeover
            answer["full_report"] = True
        keys = self.security.block_keys_for(block_keys_version) if active else None
        if keys is not None:   # rolled (or never sent): the node gets them all again
            answer["block_keys"] = keys
        return answer

    async def rpc_commit_block_synchronization(self, ctx, block, recovery_id, new_length,
                                               close_file=True, delete_block=False,
                                               new_targets=()):
        """The primary finished block recovery (PROTOCOL.md §4)."""
        self._node_caller(ctx, "commit_block_synchronization")
        self._require_active("commit_block_synchronization")
        if not isinstance(block, dict):
            raise InvalidArgument(f"commit_block_synchronization: block must be {{id, gs}}, "
                                  f"got {block!r:.80}")
        block_id = check_int(block.get("id"), "commit_block_synchronization: block.id", low=0)
        check_int(recovery_id, "commit_block_synchronization: recovery_id", low=0)
        check_int(new_length, "commit_block_synchronization: new_length", low=0)
        check_bool(close_file, "commit_block_synchronization: close_file")
        check_bool(delete_block, "commit_block_synchronization: delete_block")
        if not isinstance(new_targets, (list, tuple)) or not all(
                isinstance(n, str) for n in new_targets):
            raise InvalidArgument("commit_block_synchronization: new_targets must be a list "
                                  "of node ids")
        what = f"commit_block_synchronization of block {block_id}"
        rec = self.recovery.running(block_id)
        if rec is None:
            info = self.blocks.get(block_id)
            if info is not None and info.gs == recovery_id and info.state in (bm.COMMITTED,
                                                                              bm.COMPLETE):
                return True   # a retry of a commit that already happened
            raise StaleGenerationStamp(f"{what}: no block recovery of it is running (recovery "
                                       f"id {recovery_id} is stale or the file is gone)")
        if recovery_id != rec.recovery_id:
            raise StaleGenerationStamp(f"{what}: recovery id {recovery_id} was superseded by "
                                       f"{rec.recovery_id}")
        path = self.ns.view.path_of(rec.ino)
        if path is None:
            self.recovery.forget_recovery(block_id)
            raise StaleGenerationStamp(f"{what}: the file was deleted")
        async with self.locking.file_lock(what, path, rec.ino) as current:
            if self.recovery.running(block_id) is not rec:
                raise StaleGenerationStamp(f"{what}: recovery id {recovery_id} was superseded")
            inode = self.ns.view.get_inode(rec.ino)
            tail = self.ns.view.tail_blocks(rec.ino, inode, 1) if inode else []
            if not tail or tail[-1]["id"] != block_id:
                self.recovery.forget_recovery(block_id)
                raise StaleGenerationStamp(f"{what}: it is no longer the last block of {current}")
            if not delete_block:
                self.ns.planner.check_block_length(current, inode, new_length)
            wall = self.wall_ns()
            await self.journal.log(self.ns.planner.plan_commit_block_sync(
                rec.ino, tail[-1], recovery_id, 0 if delete_block else new_length,
                delete=delete_block, close=close_file, now_ns=wall, targets=list(new_targets)))
            log.info("block recovery of %s block %d committed: gs %d, length %d%s%s", current,
                     block_id, recovery_id, new_length, ", block dropped" if delete_block else "",
                     ", file closed" if close_file else "")
            return True

    async def rpc_block_report(self, ctx, node_id, blocks, report_id=None, chunk=0, last=True):
        self._registered(ctx, node_id, "block_report")
        if report_id is not None:
            check_name(report_id, "block_report: report_id")
            check_int(chunk, "block_report: chunk", low=0)
            check_bool(last, "block_report: last")
        entries = await self.reports.parse_entries_stepwise(blocks, "block_report: blocks")
        await self.reports.full_report(node_id, entries, report_id, chunk, last)
        return True

    async def rpc_block_received_and_deleted(self, ctx, node_id, received=(), deleted=()):
        node = self._registered(ctx, node_id, "block_received_and_deleted")
        entries = parse_entries(list(received), "block_received_and_deleted: received")
        if not isinstance(deleted, (list, tuple)) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in deleted):
            raise InvalidArgument("block_received_and_deleted: deleted must be a list of ids")
        self.reports.incremental(node.node_id, entries, list(deleted))
        return True

    async def rpc_report_bad_blocks(self, ctx, blocks):
        if not isinstance(blocks, list):
            raise InvalidArgument("report_bad_blocks: blocks must be a list of {block, node_id}")
        self._require_active("report_bad_blocks")
        reader = self._secured(ctx) and ctx.session.get("node") is None
        for item in blocks:
            if not (isinstance(item, dict) and isinstance(item.get("node_id"), str)
                    and isinstance(item.get("block"), dict)):
                raise InvalidArgument(f"report_bad_blocks: bad entry {item!r:.80}")
            block_id = check_int(item["block"].get("id"), "report_bad_blocks: block.id", low=0)
            if reader:   # a client: only blocks of files it may read (it read them)
                self._check_reader_of(ctx, block_id)
            if self.blocks.mark_bad(item["node_id"], block_id):
                log.warning("replica of block %d on %s reported corrupt by %s", block_id,
                            item["node_id"], ctx.client_id)
                for node_id, ref in self.blocks.excess_corrupt(block_id):
                    self.datanodes.add_invalidate(node_id, ref)
        return True

    def _check_reader_of(self, ctx, block_id: int) -> None:
        """A client reporting a bad replica must be allowed to read the block's file."""
        info = self.blocks.get(block_id)
        path = self.ns.view.path_of(info.ino) if info is not None else None
        if path is None:
            raise PermissionDenied(f"report_bad_blocks: block {block_id} belongs to no file "
                                   f"this caller may read")
        self.access.check_access(ctx, paths.split(path), access=READ)
