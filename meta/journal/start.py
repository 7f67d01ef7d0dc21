"""What a start does with a journal folder, given the namespace store's applied txid (pure).

Why it exists: the metadata server at start and ``leasefs meta --check-journal`` must reach
the SAME verdict on a folder, so both ask ``decide`` and print ``StartPlan.lines()``.

The namespace store (LevelDB) holds its applied txid next to the data it applied, in one
write. A journal record is applied only after its fsync, so normally the store is at or
behind the journal's end. A journal can still end before the store when its disk lost the
tail (a torn-tail cut then removes records the store already applied). The store's state is
authoritative then: the missing records cannot be re-written (their content is gone), and
they are not needed to rebuild anything.

``decide(journal, applied)``:

1. No store txid known (an offline check without the store): only the journal is judged.
2. The store has applied txids the journal does not hold (``applied > last``): record
   ``last+1..applied`` as lost from the journal (a marker file keeps the txid chain whole),
   replay nothing, continue at ``applied + 1``; the start logs a WARNING naming the txids.
3. The store needs records the journal no longer holds (``applied + 1 < first``, or a lost
   range recorded earlier lies after ``applied``): refuse to start, name the txids.
4. Otherwise replay ``applied+1..last`` and continue at ``last + 1``.

Concurrency contract: pure functions over frozen dataclasses; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JournalSpan:
    """What verifying a journal folder found, as if a torn tail were already cut."""

    first: int                          # oldest txid held (last + 1 when none)
    last: int                           # newest txid held (or the counter an empty folder keeps)
    lost: tuple[tuple[int, int], ...]   # ranges recorded earlier as lost from the journal


@dataclass(frozen=True)
class StartPlan:
    applied: int | None      # the store's applied txid (None: not known)
    replay_from: int         # first txid to replay (replay_from > replay_to: nothing)
    replay_to: int
    next_txid: int           # the txid the new in-progress segment starts at
    bridge: tuple[int, int] | None = None    # txids to record as lost (store has them)
    refusal: str | None = None               # why the start must not go on

    def lines(self) -> list[str]:
        """What the start will do, one finding per line (for the log and the offline check)."""
        if self.refusal is not None:
            return [self.refusal]
        if self.applied is None:
            return ["namespace store not read: cannot say which records a start replays"]
        out = []
        if self.bridge is not None:
            first, last = self.bridge
            out.append(f"the namespace store has applied txid {self.applied} but txids "
                       f"{first}..{last} are not in the journal (its tail was lost); the store "
                       f"keeps their effects: recording them as lost from the journal and "
                       f"continuing at txid {self.next_txid}")
        if self.replay_to >= self.replay_from:
            out.append(f"replays txids {self.replay_from}..{self.replay_to} into the "
                       f"namespace store (applied txid {self.applied})")
        elif self.bridge is None:
            out.append(f"nothing to replay (namespace store at txid {self.applied})")
        return out


def decide(journal: JournalSpan, applied: int | None) -> StartPlan:
    """The start's plan; see the module docstring for the steps."""
    if applied is None:                                                   # 1
        return StartPlan(None, journal.last + 1, journal.last, journal.last + 1)
    if applied > journal.last:                                            # 2
        return StartPlan(applied, applied + 1, applied, applied + 1,
                         bridge=(journal.last + 1, applied))
    if applied + 1 < journal.first:                                       # 3
        return _refuse(applied, journal, f"txids {applied + 1}..{journal.first - 1} are needed "
                       f"but no longer in the journal (oldest segment starts at {journal.first})")
    for first, last in journal.lost:
        if last > applied:
            return _refuse(applied, journal, f"txids {max(first, applied + 1)}..{last} are "
                           f"needed but were recorded as lost from the journal")
    return StartPlan(applied, applied + 1, journal.last, journal.last + 1)   # 4


def _refuse(applied: int, journal: JournalSpan, why: str) -> StartPlan:
    return StartPlan(applied, applied + 1, journal.last, journal.last + 1,
                     refusal=f"cannot start: the namespace store has applied txid {applied}; "
                             f"{why}")
