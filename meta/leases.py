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
``check_create``); ``create_decision`` tells the server when a soft-expired lease must be
released first (``internal_release_lease`` in the server; block recovery is issue 3).

Concurrency contract: called only from the metadata server's trio thread; every method is
atomic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sortedcontainers import SortedKeyList

from fs.errors import AlreadyBeingCreated, FileNotFound, LeaseExpired

#: the holder the server uses when it takes over a lease itself (hard-limit recovery)
INTERNAL_HOLDER = "leasefs-meta"


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
            raise LeaseExpired(f"{path}: lease mismatch: the file is not open for writing")
        if uc_holder != caller:
            raise LeaseExpired(f"{path}: lease mismatch: {caller} is not the lease owner; "
                               f"the file is open for writing by {uc_holder}")

    @staticmethod
    def check_create_conflict(path: str, uc_holder: str, caller: str) -> None:
        """create on a file under construction without overwrite, while the lease is alive."""
        if uc_holder == caller:
            raise AlreadyBeingCreated(f"failed to create {path} for {caller}: {caller} is "
                                      f"already the current lease holder")
        raise AlreadyBeingCreated(f"failed to create {path} for {caller}: the file is "
                                  f"currently owned by {uc_holder}")

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
