"""The LeaseManager: who may write which file, as a pure state machine.

Why it exists: HDFS's single-writer rule. A client (holder, e.g. ``leasefs-client-<uuid>``)
holds ONE lease covering every file it has open; renewing it renews them all. Other clients
may take a file over only after the soft limit, the server itself after the hard limit.

Pure: no I/O, no clock (every call that needs time takes ``now``), no awaits, so the rules
are unit-tested without sleeping. The server journals what must survive a restart (the
``uc`` field of the inode); leases themselves are rebuilt from the under-construction inodes
at start with fresh timers (``rebuild``), exactly as HDFS does.

Structures: ``leases: holder → Lease{holder, last_update, files}``, ``sorted_leases`` (a
``SortedKeyList`` by ``(last_update, holder)``, oldest first, so expiry queries only look at
the head), ``lease_by_ino: ino → holder``. Keyed by inode id, so rename needs no change.

The rule checks raise the HDFS errors with HDFS wording (``check_writer``,
``check_create``). ``recover_lease_internal`` is HDFS ``recoverLeaseInternal`` (create,
append, truncate and the forced ``recover_lease``); ``release_decision`` is the decision
half of ``internalReleaseLease`` by the states of the file's last blocks;
``hard_expired_files`` is one bounded pass of the lease monitor, oldest lease first;
``choose_primary`` picks the block-recovery primary (freshest heartbeat among the holders
that are not stale and were not yet primary of this recovery); ``recovery_due`` says when
a recovery is retried: after ``block_recovery_retry``, or as soon as its primary went stale
(it died after its last heartbeat and will never pick the command up).
The server performs what these decide (journal records, block recovery commands).

Concurrency contract: called only from the metadata server's trio thread; every method is
atomic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedKeyList

from fs.errors import AlreadyBeingCreated, FileNotFound, LeaseExpired, RecoveryInProgress

from ..blocks.blocks import BlockState
from ..blocks.datanodes import is_stale

#: the holder the server uses when it takes over a lease itself (hard-limit recovery)
INTERNAL_HOLDER = "leasefs-meta"
#: a block server silent for this many heartbeat intervals is stale (HDFS: a 30 s stale
#: interval with 3 s heartbeats): never chosen as a block-recovery primary while a fresh
#: holder exists, and a recovery whose primary went stale is retried at once
STALE_HEARTBEATS = 10


@dataclass
class Lease:
    holder: str
    last_update: float
    files: set[int] = field(default_factory=set)


class LeaseManager:
    def __init__(self, soft_limit: float = 60.0, hard_limit: float = 1200.0):
        self.soft_limit = soft_limit
        self.hard_limit = hard_limit
        self.leases: dict[str, Lease] = {}
        self.sorted_leases = SortedKeyList(key=lambda lease: (lease.last_update, lease.holder))
        self.lease_by_ino: dict[int, str] = {}

    # ------------------------------------------------------------------ state changes
    def add(self, holder: str, ino: int, now: float) -> Lease:
        """``holder`` opened ``ino`` for writing (create/append); renews the holder's lease."""
        previous = self.lease_by_ino.get(ino)
        if previous is not None and previous != holder:
            self.remove_file(ino)
        lease = self.leases.get(holder)
        if lease is None:
            lease = Lease(holder, now)
            self.leases[holder] = lease
        else:
            self.sorted_leases.remove(lease)
            lease.last_update = now
        lease.files.add(ino)
        self.sorted_leases.add(lease)
        self.lease_by_ino[ino] = holder
        return lease

    def renew(self, holder: str, now: float) -> bool:
        """Renew every file of ``holder``; False if it holds no lease (nothing open)."""
        lease = self.leases.get(holder)
        if lease is None:
            return False
        self.sorted_leases.remove(lease)
        lease.last_update = now
        self.sorted_leases.add(lease)
        return True

    def renew_all(self, now: float) -> int:
        """Renew every lease from ``now`` (a server that begins to serve: its holders had
        no server to renew with while it was down or starting); how many there are."""
        holders = list(self.leases)
        for holder in holders:
            self.renew(holder, now)
        return len(holders)

    def remove_file(self, ino: int) -> str | None:
        """The file was closed, deleted or overwritten; a lease with no files is dropped."""
        holder = self.lease_by_ino.pop(ino, None)
        if holder is None:
            return None
        lease = self.leases[holder]
        lease.files.discard(ino)
        if not lease.files:
            self.sorted_leases.remove(lease)
            del self.leases[holder]
        return holder

    def reassign(self, ino: int, new_holder: str, now: float) -> None:
        """Lease recovery hands the file to another holder (REASSIGN_LEASE)."""
        self.remove_file(ino)
        self.add(new_holder, ino, now)

    def rebuild(self, under_construction: dict[int, str], now: float) -> None:
        """Start state after a restart: every UC inode's holder, with a fresh timer."""
        self.leases.clear()
        self.sorted_leases.clear()
        self.lease_by_ino.clear()
        for ino, holder in under_construction.items():
            self.add(holder, ino, now)

    # ------------------------------------------------------------------ queries
    def holder_of(self, ino: int) -> str | None:
        return self.lease_by_ino.get(ino)

    def lease_of(self, holder: str) -> Lease | None:
        return self.leases.get(holder)

    def soft_expired(self, holder: str, now: float) -> bool:
        lease = self.leases.get(holder)
        return lease is not None and now - lease.last_update > self.soft_limit

    def expired_soft(self, now: float) -> list[Lease]:
        """Leases past the soft limit, oldest first."""
        return self._older_than(now - self.soft_limit)

    def expired_hard(self, now: float) -> list[Lease]:
        """Leases past the hard limit, oldest first (the monitor recovers these)."""
        return self._older_than(now - self.hard_limit)

    def _older_than(self, cutoff: float) -> list[Lease]:
        out = []
        for lease in self.sorted_leases:
            if lease.last_update >= cutoff:
                break
            out.append(lease)
        return out

    def __len__(self) -> int:
        return len(self.leases)

    def open_files(self) -> int:
        return len(self.lease_by_ino)

    # ------------------------------------------------------------------ HDFS rule checks
    @staticmethod
    def check_writer(path: str, exists: bool, uc_holder: str | None, caller: str) -> None:
        """addBlock/complete/fsync/abandonBlock: only the lease holder of an open file."""
        if not exists:
            raise FileNotFound(f"{path}: file does not exist (deleted or overwritten while open "
                               f"for writing by {caller})")
        if uc_holder is None:
            raise LeaseExpired(f"No lease on {path}: the file is not open for writing "
                               f"({caller} holds no lease on it)")
        if uc_holder != caller:
            raise LeaseExpired(f"No lease on {path}: lease mismatch: {caller} is not the lease "
                               f"owner; the file is open for writing by {uc_holder}")

    @staticmethod
    def check_create_conflict(path: str, uc_holder: str, caller: str) -> None:
        """create on a file under construction without overwrite, while the lease is alive."""
        if uc_holder == caller:
            raise AlreadyBeingCreated(f"failed to create {path} for {caller}: {caller} is "
                                      f"already the current lease holder")
        raise AlreadyBeingCreated(f"failed to create {path} for {caller}: the file is "
                                  f"currently owned by {uc_holder}")

    def recover_lease_internal(self, op: str, path: str, uc_holder: str, caller: str,
                               now: float, *, force: bool = False,
                               last_under_recovery: bool = False) -> str:
        """HDFS ``recoverLeaseInternal`` for a file under construction by ``uc_holder``.

        ``op`` names the caller's operation (create/append/truncate/recover_lease) for the
        messages. Not forced: the caller already holding the lease → AlreadyBeingCreated
        ("is already the current lease holder"); another holder within the soft limit →
        AlreadyBeingCreated ("currently owned by") or RecoveryInProgress when the last block
        is already under recovery. Otherwise (forced, or past the soft limit) returns
        ``"release"``: the server runs internal lease release, which either closes the file
        or starts block recovery."""
        if force:
            return "release"
        if last_under_recovery:
            raise RecoveryInProgress(f"failed to {op} {path} for {caller}: lease recovery "
                                     f"is in progress (holder {uc_holder}); try again later")
        if uc_holder == caller:
            raise AlreadyBeingCreated(f"failed to {op} {path} for {caller}: {caller} is "
                                      f"already the current lease holder")
        lease = self.leases.get(uc_holder)
        if lease is not None and now - lease.last_update <= self.soft_limit:
            raise AlreadyBeingCreated(f"failed to {op} {path} for {caller}: the file is "
                                      f"currently owned by {uc_holder}")
        return "release"

    def hard_expired_files(self, now: float, limit: int) -> list[tuple[str, int]]:
        """One monitor pass: ``(holder, ino)`` of hard-expired leases, oldest lease first,
        at most ``limit`` files (HDFS bounds the work of one ``checkLeases`` pass)."""
        cutoff = now - self.hard_limit
        out: list[tuple[str, int]] = []
        for lease in self.sorted_leases:
            if lease.last_update >= cutoff or len(out) >= limit:
                break
            for ino in sorted(lease.files):
                if len(out) >= limit:
                    break
                out.append((lease.holder, ino))
        return out

    def create_decision(self, path: str, uc_holder: str, caller: str, now: float) -> str:
        """create/append on a file already under construction, without overwrite.

        Raises ``AlreadyBeingCreated`` while the holder's lease is alive (or when the
        caller already holds it); returns ``"release"`` when the holder is past the soft
        limit, so the server must run internal lease release before trying again."""
        lease = self.leases.get(uc_holder)
        if uc_holder == caller or (lease is not None
                                   and now - lease.last_update <= self.soft_limit):
            self.check_create_conflict(path, uc_holder, caller)
        return "release"


# ------------------------------------------------------------------ internalReleaseLease
#: what internal lease release does, by the states of the file's last blocks
CLOSE = "close"                      # every block COMPLETE (or none): close now
DROP_LAST_AND_CLOSE = "drop_last"    # last block UC, no replica and 0 bytes: drop it, close
RECOVER = "recover"                  # last block needs block recovery (new recovery id)
WAIT = "wait"                        # committed blocks wait for their replicas


def release_decision(blocks: list[tuple[str, int, int]], min_replication: int) -> str:
    """HDFS ``internalReleaseLease``: ``blocks`` are the file's last (at most two) blocks
    as ``(state, num_bytes, replica_count)``, oldest first. A COMMITTED last block closes
    when minimally replicated (the close completes it); a COMMITTED penultimate block that is
    not waits; an UNDER_CONSTRUCTION/UNDER_RECOVERY last block with data (or with replicas)
    needs block recovery."""
    if not blocks:
        return CLOSE
    *earlier, (state, num_bytes, replicas) = blocks
    for e_state, _, e_replicas in earlier:
        if e_state != BlockState.COMPLETE and e_replicas < min_replication:
            return WAIT
    if state == BlockState.COMPLETE:
        return CLOSE
    if state == BlockState.COMMITTED:
        return CLOSE if replicas >= min_replication else WAIT
    if state == BlockState.UNDER_CONSTRUCTION and num_bytes == 0 and replicas == 0:
        return DROP_LAST_AND_CLOSE
    return RECOVER


def choose_primary(candidates: list[tuple[str, float]], tried: frozenset[str] = frozenset(), *,
                   now: float | None = None, stale_after: float | None = None) -> str | None:
    """The block-recovery primary among ``(node_id, last_heartbeat)`` of live replica
    holders: the freshest heartbeat among those not in ``tried`` (the primaries earlier
    attempts of this recovery chose), as HDFS ``initializeBlockRecovery`` skips replicas
    already chosen as primary; when every candidate was tried, the freshest of all (a new
    round). Heartbeats arriving between attempts do not bring a tried primary back before
    the others had their turn. With ``now`` and ``stale_after`` only holders heard from
    within ``stale_after`` are candidates (all of them when none is). None when there is
    none."""
    if now is not None and stale_after is not None:
        candidates = [c for c in candidates if not is_stale(c[1], now, stale_after)] \
            or candidates
    if not candidates:
        return None
    untried = [c for c in candidates if c[0] not in tried] or candidates
    return min(untried, key=lambda c: (-c[1], c[0]))[0]


def recovery_due(*, started: float, now: float, retry_after: float,
                 primary_heartbeat: float | None, stale_after: float) -> bool:
    """Is a running block recovery (commanded at ``started``) to be retried with a new id
    and the next primary? After ``retry_after`` without a commit; or once it ran for
    ``stale_after`` and its primary (``primary_heartbeat``: its last heartbeat, None when
    there is no primary) has been silent for longer than ``stale_after``: a primary that
    died after its last heartbeat never picks the command up."""
    age = now - started
    if age >= retry_after:
        return True
    return (primary_heartbeat is not None and age >= stale_after
            and is_stale(primary_heartbeat, now, stale_after))
