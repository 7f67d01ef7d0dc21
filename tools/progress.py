"""Progress display for long copies and benchmarks, always on stderr.

Why: a 10 GB ``put`` that prints nothing for minutes looks hung, but progress bars must never
pollute stdout (``leasefs cat``/``get -`` pipes) nor logs of scripted runs. So a bar appears
only when stderr is a terminal and the copy is large, or when ``--progress`` asks for it;
otherwise ``Progress`` is a no-op with the same interface.

Concurrency contract: used from one thread at a time (the CLI's main thread).
"""

from __future__ import annotations

import sys
import time

LARGE_COPY = 32 << 20  # bytes: below this a bar only flickers


def wanted(total_bytes: int, forced: bool = False, stream=None) -> bool:
    """Show a bar? ``--progress`` forces it; else only for large copies on a terminal."""
    if forced:
        return True
    stream = stream or sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and total_bytes >= LARGE_COPY


class Progress:
    """A byte-counting tqdm bar on stderr, or nothing when ``enabled`` is false."""

    def __init__(self, total: int, desc: str, *, enabled: bool, stream=None):
        self.count = 0
        self._bar = None
        if enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True,
                             unit_divisor=1024, file=stream or sys.stderr, leave=False,
                             dynamic_ncols=True, mininterval=0.2)

    def update(self, n: int) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class StatusLine:
    """Plain progress lines for long phases (benchmarks): one line per event, timestamped
    relative to the start, on stderr, so they read well both on a terminal and in CI logs."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.start:7.1f}s] {text}", file=self.stream, flush=True)
