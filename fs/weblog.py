"""The recent log lines a server shows on its web pages: a ``logging.Handler`` that keeps
the last N records in a ring.

Why it exists: an operator looking at a page wants the last few hundred lines without a
shell on the machine (HDFS's ``/logs``). The log lines of every server are already written
never to carry a secret (cluster key, block keys, token passwords; tests check it), so the
ring keeps them as they are.

Concurrency contract: ``emit`` may be called from any thread (the journal's sync thread,
worker threads); a ``deque`` with ``maxlen`` appends atomically, and ``lines`` copies it
before reading, so the trio thread reads without a lock and never blocks.
"""

from __future__ import annotations

import collections
import logging
import time

RECENT_LINES = 500
MAX_LINE_CHARS = 2000     # one runaway message must not fill the page


class RecentLogHandler(logging.Handler):
    """Keeps the last ``capacity`` records (INFO and above) as small dicts."""

    def __init__(self, capacity: int = RECENT_LINES, level: int = logging.INFO):
        super().__init__(level)
        self.records: collections.deque = collections.deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:   # a bad format string must not break the caller's logging
            message = str(record.msg)
        if record.exc_info and record.levelno >= logging.ERROR:
            # the exception's type and text, not the traceback (locals' repr stays out)
            message += f" [{record.exc_info[0].__name__}: {record.exc_info[1]}]"
        self.records.append({"time": record.created, "level": record.levelname,
                             "levelno": record.levelno, "logger": record.name,
                             "message": message[:MAX_LINE_CHARS]})

    def lines(self, min_level: int = logging.NOTSET, limit: int | None = None) -> list[dict]:
        """The kept records at ``min_level`` or above, newest last, each with ``when`` (UTC
        ISO time)."""
        out = [dict(r, when=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["time"])))
               for r in list(self.records) if r["levelno"] >= min_level]
        return out[-limit:] if limit else out


_installed: RecentLogHandler | None = None


def install(capacity: int = RECENT_LINES) -> RecentLogHandler:
    """The process's ring on the root logger, added once (several servers of one process,
    as in tests, share it)."""
    global _installed
    if _installed is None:
        _installed = RecentLogHandler(capacity)
        logging.getLogger().addHandler(_installed)
    return _installed


__all__ = ["RecentLogHandler", "install", "RECENT_LINES"]
