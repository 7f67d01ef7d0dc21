"""Is there room on disk for the metadata server to start? One answer for the start and for
``leasefs meta --check-journal``, which must agree.

Why: when the store's disk fills, the running server stops (fail-stop: every acknowledged
change is in the journal). A start then writes before it can serve: opening LevelDB turns
its write-ahead logs (``db/*.log``) into tables, the replay applies what the store had not,
and the journal opens a new in-progress segment. Without room, LevelDB's open fails with
an ``IO error`` that names neither what to free nor how much, while an offline check that
cannot open the store judged the journal alone and said OK.

``shortages(data_dir)``: for each file system the start writes to (``db/`` and
``journal/`` may be apart), what it needs (the write-ahead logs' size plus ``STORE_HEADROOM``
for the replay of the records written but not applied and LevelDB's manifest; and
``JOURNAL_HEADROOM`` for the new segment) against what is free to this user; a ``Shortage``
for each one short of room. ``open_store`` is how both open the store: that check first,
then LevelDB's open, whose own ENOSPC (the estimate fell short: a big unapplied batch) is
told the same way.

Concurrency contract: blocking ``stat``/``statvfs`` calls; run before the server serves (or
offline), never on a serving trio thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fs.errors import NoSpace

from .journal.kv import PlyvelStore

STORE_HEADROOM = 256 << 10    # the replayed batch, LevelDB's manifest and new log
JOURNAL_HEADROOM = 64 << 10   # the new in-progress segment's first records


@dataclass(frozen=True)
class Shortage:
    folder: str       # a folder on the file system that lacks room
    needed: int       # bytes a start writes there (about)
    free: int         # bytes free there to this user
    why: str          # what the start writes there

    def message(self) -> str:
        return (f"cannot start: not enough free space on the file system of {self.folder}: "
                f"{_mib(self.free)} free, a start needs about {_mib(self.needed)} ({self.why}); "
                f"free at least {_mib(self.needed - self.free)} there (nothing is lost: every "
                f"acknowledged change is in the journal)")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _free(folder: str) -> int:
    st = os.statvfs(folder)
    # root may also use the blocks a file system keeps back for it
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _log_bytes(db: str) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(db)
                   if e.name.endswith(".log") and e.is_file())
    except FileNotFoundError:
        return 0


def shortages(data_dir: str) -> list[Shortage]:
    """What a start of the metadata server on ``data_dir`` lacks room for (none: it fits)."""
    db, journal = os.path.join(data_dir, "db"), os.path.join(data_dir, "journal")
    logs = _log_bytes(db)
    wants: dict[int, list] = {}     # file system (st_dev) -> [folder, bytes, reasons]
    for folder, needed, why in (
            (db, logs + STORE_HEADROOM, f"LevelDB rewrites its {_mib(logs)} of write-ahead "
                                        f"log as tables and applies the replayed records"),
            (journal, JOURNAL_HEADROOM, "a new journal segment")):
        where = folder if os.path.isdir(folder) else data_dir
        entry = wants.setdefault(os.stat(where).st_dev, [where, 0, []])
        entry[1] += needed
        entry[2].append(why)
    out = []
    for folder, needed, whys in wants.values():
        free = _free(folder)
        if free < needed:
            out.append(Shortage(folder, needed, free, "; ".join(whys)))
    return out


def open_store(data_dir: str, *, create: bool = True) -> PlyvelStore:
    """The namespace store of ``data_dir``, opened as a start opens it; ``NoSpace`` saying
    what to free when the start lacks room (checked first, or found by LevelDB's open)."""
    import plyvel

    short = shortages(data_dir)
    if short:
        raise NoSpace("; ".join(s.message() for s in short))
    db = os.path.join(data_dir, "db")
    try:
        return PlyvelStore(db, create=create)
    except plyvel.IOError as exc:
        if "No space left" not in str(exc):
            raise
        raise NoSpace(f"cannot start: not enough free space on the file system of {db}: "
                      f"{_mib(_free(db))} free, and LevelDB's open needed more ({exc}); free "
                      f"some space there (nothing is lost: every acknowledged change is in "
                      f"the journal)") from None


__all__ = ["STORE_HEADROOM", "JOURNAL_HEADROOM", "Shortage", "shortages", "open_store"]
