"""``setrep -w``: wait until every block of a file has exactly the replication asked for,
as ``hdfs dfs -setrep -w`` does, by polling the file's block locations.

Why polling: the metadata server copies or trims replicas in the background and has no
"tell me when done" call; the located blocks are what a reader would get, so they are the
honest measure. The wait is bounded (``--timeout``) and shows progress on stderr.

Concurrency contract: synchronous, the CLI's main thread; one ``get_block_locations`` call
per poll through the command's client.
"""

from __future__ import annotations

import errno as _errno
import time

from fs.errors import LeaseFSError

POLL_SECONDS = 0.5


class ReplicationTimeout(LeaseFSError):
    """The blocks did not reach the replication within the bounded wait."""

    errno = _errno.ETIMEDOUT


def short_blocks(located: dict, replication: int) -> int:
    """How many blocks of a ``get_block_locations`` answer do not have ``replication``
    replicas (inline files have no blocks: always done)."""
    return sum(1 for b in located.get("blocks", [])
               if len(b.get("locations") or []) != replication)


def wait_replication(cmd, path: str, replication: int, *, timeout: float) -> None:
    """Block until every block of ``path`` has ``replication`` replicas; dots on stderr."""
    print(f"Waiting for {path} ...", end="", file=cmd.stderr, flush=True)
    deadline = time.monotonic() + timeout
    while True:
        located = cmd.client.get_block_locations(path)
        left = short_blocks(located, replication)
        if not left:
            print(" done", file=cmd.stderr, flush=True)
            return
        if time.monotonic() > deadline:
            print(file=cmd.stderr, flush=True)
            raise ReplicationTimeout(
                f"{left} of {len(located['blocks'])} block(s) still without {replication} "
                f"replicas after {timeout:g} s")
        print(".", end="", file=cmd.stderr, flush=True)
        time.sleep(POLL_SECONDS)
