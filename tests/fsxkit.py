"""fsx (the file system exerciser of xfstests, rewritten small): random reads, writes,
memory-mapped reads and writes, growing and shrinking truncates, fsyncs and reopens of one
file, each checked against an in-memory model of what the file must hold.

Why it exists: the mount keeps a file's content in three places (the kernel's page cache,
the staging copy, the block servers' replicas, the last two changed by patches), and only
a long random run finds the order of operations where they disagree. With ``reader`` (the
same file seen through a second mount: another client), every fsync is followed by a read
of the whole file there, which must equal the model: what an fsync acknowledged is what
another client opening the file reads (close-to-open).

A mismatch raises ``FsxMismatch`` naming the operation, the first differing offset and
the last operations done (the log a developer replays).

Concurrency contract: one thread; the caller owns the file while the run lasts.
"""

from __future__ import annotations

import mmap
import os
import random
import time
from collections import deque
from pathlib import Path

PAGE = mmap.ALLOCATIONGRANULARITY

#: how often each operation is chosen (weights)
WEIGHTS = {"read": 20, "write": 30, "mapread": 10, "mapwrite": 12, "truncate": 8,
           "fsync": 12, "reopen": 3}


class FsxMismatch(AssertionError):
    """What the file returned is not what the model holds."""


def first_difference(got: bytes, want: bytes) -> int:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return min(len(got), len(want))


class Fsx:
    """One fsx run over ``path`` (created or emptied here), with ``reader`` the same file
    through another mount (or None). ``max_len`` bounds the file's length, ``max_op`` one
    write's; ``mmap_ops`` False leaves out the memory-mapped operations."""

    def __init__(self, path: Path, *, reader: Path | None = None, seed: int = 1,
                 max_len: int = 1 << 20, max_op: int = 64 << 10, mmap_ops: bool = True):
        self.path = Path(path)
        self.reader = Path(reader) if reader is not None else None
        self.rng = random.Random(seed)
        self.max_len = max_len
        self.max_op = max_op
        ops = dict(WEIGHTS)
        if not mmap_ops:
            ops.pop("mapread")
            ops.pop("mapwrite")
        self._names = list(ops)
        self._weights = list(ops.values())
        self.model = bytearray()
        self.log: deque[str] = deque(maxlen=40)
        self.counts: dict[str, int] = {name: 0 for name in ops}
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def run(self, ops: int, *, progress_every: float = 0.0) -> dict[str, int]:
        """``ops`` random operations, then an fsync and a full check on both mounts.
        Prints a progress line every ``progress_every`` seconds (0: never). Returns how
        many of each operation ran."""
        last = time.monotonic()
        for n in range(ops):
            name = self.rng.choices(self._names, self._weights)[0]
            getattr(self, "_" + name)()
            self.counts[name] += 1
            if progress_every and time.monotonic() - last >= progress_every:
                last = time.monotonic()
                print(f"fsx {self.path.name}: {n + 1}/{ops} operations, file "
                      f"{len(self.model)} bytes", flush=True)
        self._fsync()
        self._check_whole(self.path, "final read")
        return dict(self.counts)

    # the operations -------------------------------------------------------------------

    def _span(self, within: int) -> tuple[int, int]:
        offset = self.rng.randrange(0, max(within, 1))
        size = self.rng.randrange(1, self.max_op + 1)
        return offset, max(0, min(size, within - offset))

    def _read(self) -> None:
        if not self.model:
            return
        offset, size = self._span(len(self.model))
        got = os.pread(self.fd, size, offset)
        self._compare(got, bytes(self.model[offset:offset + size]), f"read {offset} {size}",
                      offset)

    def _write(self) -> None:
        offset = self.rng.randrange(0, self.max_len)
        size = min(self.rng.randrange(1, self.max_op + 1), self.max_len - offset)
        data = self.rng.randbytes(size)
        self.log.append(f"write {offset} {size} (length {len(self.model)})")
        written = os.pwrite(self.fd, data, offset)
        if written != size:
            raise FsxMismatch(f"write {offset} {size}: only {written} bytes written")
        self._model_write(offset, data)

    def _mapread(self) -> None:
        if not self.model:
            return
        offset, size = self._span(len(self.model))
        if size == 0:
            return
        start = offset - offset % PAGE
        with mmap.mmap(self.fd, offset + size - start, mmap.MAP_SHARED, mmap.PROT_READ,
                       offset=start) as m:
            got = m[offset - start:offset - start + size]
        self._compare(got, bytes(self.model[offset:offset + size]),
                      f"mapread {offset} {size}", offset)

    def _mapwrite(self) -> None:
        """A write through a shared mapping: the file first grows to hold it (a mapping
        cannot reach past the end), then msync(MS_SYNC) sends the dirty pages."""
        offset = self.rng.randrange(0, self.max_len)
        size = min(self.rng.randrange(1, self.max_op + 1), self.max_len - offset)
        if offset + size > len(self.model):
            self.log.append(f"truncate {offset + size} (for a mapwrite)")
            os.ftruncate(self.fd, offset + size)
            self.model.extend(bytes(offset + size - len(self.model)))
        data = self.rng.randbytes(size)
        self.log.append(f"mapwrite {offset} {size}")
        start = offset - offset % PAGE
        with mmap.mmap(self.fd, offset + size - start, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE, offset=start) as m:
            m[offset - start:offset - start + size] = data
            m.flush()
        self._model_write(offset, data)

    def _truncate(self) -> None:
        size = self.rng.randrange(0, self.max_len + 1)
        self.log.append(f"truncate {size} (length {len(self.model)})")
        os.ftruncate(self.fd, size)
        if size <= len(self.model):
            del self.model[size:]
        else:
            self.model.extend(bytes(size - len(self.model)))

    def _fsync(self) -> None:
        self.log.append(f"fsync (length {len(self.model)})")
        os.fsync(self.fd)
        size = os.fstat(self.fd).st_size
        if size != len(self.model):
            raise FsxMismatch(f"after fsync the file has {size} bytes, the model "
                              f"{len(self.model)}; last operations:\n" + "\n".join(self.log))
        if self.reader is not None:
            self._check_whole(self.reader, "read on the other mount after fsync")

    def _reopen(self) -> None:
        self.log.append("close, open")
        os.close(self.fd)
        self.fd = -1
        self._check_whole(self.path, "read after close")
        self.fd = os.open(self.path, os.O_RDWR)

    # the model ------------------------------------------------------------------------

    def _model_write(self, offset: int, data: bytes) -> None:
        if offset > len(self.model):   # a hole reads as zeros
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset:offset + len(data)] = data

    def _check_whole(self, path: Path, what: str) -> None:
        with open(path, "rb") as f:
            got = f.read()
        self._compare(got, bytes(self.model), f"{what} of {path}", 0)

    def _compare(self, got: bytes, want: bytes, what: str, base: int) -> None:
        if got == want:
            return
        at = first_difference(got, want)
        raise FsxMismatch(
            f"{what}: {len(got)} bytes, {len(want)} expected, first difference at file "
            f"offset {base + at} (got {got[at:at + 8].hex() or '-'}, want "
            f"{want[at:at + 8].hex() or '-'}); last operations:\n" + "\n".join(self.log))
