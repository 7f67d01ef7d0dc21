"""What the chaos tests share: the ledger of what the cluster must hold, and the workload
threads (writers, readers, a mover) that run against a real process cluster while servers
are killed. Every thread records only what was acknowledged; a call that failed may or may
not have happened, so the mover looks before it writes its ledger."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter

from fs import errors

KiB = 1 << 10


class Ledger:
    """Acknowledged files (path -> sha256), folders, counts and error lines."""

    def __init__(self):
        self.lock = threading.Lock()
        self.files: dict[str, str] = {}
        self.folders: set[str] = set()
        self.counts: Counter = Counter()
        self.errors: list[str] = []

    def bump(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def failed(self, key: str, line: str) -> None:
        with self.lock:
            self.counts[key] += 1
            self.errors.append(line)

    def pick(self, rng: random.Random) -> tuple[str, str] | None:
        with self.lock:
            if not self.files:
                return None
            path = rng.choice(sorted(self.files))
            return path, self.files[path]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def writer(cluster, ledger: Ledger, stop: threading.Event, k: int, *, max_bytes: int,
           chunk: int = 64 * KiB) -> None:
    """New files of random sizes under ``/chaos/w<k>``, written ``chunk`` bytes a call."""
    rng = random.Random(1000 + k)
    with cluster.client() as client:
        n = 0
        while not stop.is_set():
            path = f"/chaos/w{k}/f{n:05d}"
            n += 1
            data = rng.randbytes(rng.randrange(1, max_bytes))
            try:
                with client.create(path, replication=3, overwrite=True) as out:
                    for i in range(0, len(data), chunk):
                        out.write(data[i:i + chunk])
            except errors.LeaseFSError as exc:
                ledger.failed("write_failures", f"write {path}: {exc}")
                continue
            with ledger.lock:
                ledger.files[path] = sha(data)
                ledger.counts["writes"] += 1


def reader(cluster, ledger: Ledger, stop: threading.Event, k: int) -> None:
    """Reads acknowledged files back; a file that is still in the ledger must match."""
    rng = random.Random(2000 + k)
    with cluster.client() as client:
        while not stop.is_set():
            picked = ledger.pick(rng)
            if picked is None:
                time.sleep(0.05)
                continue
            path, digest = picked
            try:
                data = client.read_file(path)
            except errors.FileNotFound:
                continue   # renamed or deleted meanwhile
            except errors.LeaseFSError as exc:
                ledger.failed("read_failures", f"read {path}: {exc}")
                continue
            ledger.bump("reads")
            with ledger.lock:
                still = ledger.files.get(path)
            if still == digest and sha(data) != digest:
                ledger.failed("mismatches", f"MISMATCH {path}")


def mover(cluster, ledger: Ledger, stop: threading.Event, pause: float = 0.1) -> None:
    """Renames (60 %) or deletes acknowledged files; a file is out of the ledger while it
    moves, so readers skip it. A move that failed is looked for: it may have happened."""
    rng = random.Random(3000)
    with cluster.client() as client:
        client.mkdirs("/chaos/moved")
        n = 0
        while not stop.is_set():
            time.sleep(pause)
            picked = ledger.pick(rng)
            if picked is None:
                continue
            path, digest = picked
            with ledger.lock:
                if ledger.files.get(path) != digest:
                    continue
                del ledger.files[path]
            dst = None
            try:
                if rng.random() < 0.6:
                    dst = f"/chaos/moved/m{n:05d}"
                    n += 1
                    client.rename(path, dst)
                    with ledger.lock:
                        ledger.files[dst] = digest
                        ledger.counts["renames"] += 1
                else:
                    client.delete(path)
                    ledger.bump("deletes")
            except errors.LeaseFSError as exc:
                ledger.failed("move_failures", f"move {path}: {exc}")
                for where in (path, dst):
                    if where is not None and _exists(client, where):
                        with ledger.lock:
                            ledger.files[where] = digest


def _exists(client, path: str) -> bool:
    try:
        return client.exists(path)
    except errors.LeaseFSError:
        return False
