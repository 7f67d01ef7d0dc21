"""``leasefs checksum PATH...`` (``hdfs dfs -checksum`` with COMPOSITE_CRC) and the
``--verify`` of ``get``/``cp``: content checksums that do not depend on block or chunk size,
so a copy can be compared with its source wherever each lives.

Why a module of its own: the checksum is computed on the block servers (``fs.checksum``);
here it is only printed (``PATH<TAB>COMPOSITE-CRC32C<TAB>hex``, as HDFS prints it) or
compared. ``file:`` paths are checksummed locally by streaming their bytes through crc32c.

``LEASEFS_TEST_CORRUPT_COPY=1`` is a TEST-ONLY hook: ``--verify`` flips the first byte of
each copy before comparing, as if the copy had been damaged on its way; the mismatch must be
reported. Never set it outside tests.

Concurrency contract: synchronous, the CLI's main thread, through the sync ``Client``.
"""

from __future__ import annotations

import logging
import os

from fs.checksum import local_file_checksum
from fs.errors import ChecksumError, LeaseFSError
from fs.paths import normalize_user_path

from ..common import Command, command_parser
from ..formatting import split_file_url
from .transfer import item_error

log = logging.getLogger(__name__)

CORRUPT_COPY_ENV = "LEASEFS_TEST_CORRUPT_COPY"


def side_checksum(side, path: str) -> dict:
    """The checksum of ``path`` on a copy side (``transfer.py`` LocalSide/ClusterSide)."""
    if side.local:
        return local_file_checksum(path)
    return side.client.get_file_checksum(path)


def _corrupt_for_test(side, path: str) -> None:
    log.warning("TEST HOOK %s: flipping the first byte of %s", CORRUPT_COPY_ENV, path)
    if side.local:
        with open(path, "r+b") as f:
            first = f.read(1)
            if first:
                f.seek(0)
                f.write(bytes([first[0] ^ 0xFF]))
        return
    data = side.client.read_file(path)
    if data:
        side.client.write_file(path, bytes([data[0] ^ 0xFF]) + data[1:], overwrite=True)


def verify_steps(steps, src_side, dst_side) -> None:
    """After ``transfer.run_steps``: every copied file's checksum must equal its source's;
    the first that does not raises ``ChecksumError`` naming the copy."""
    for step in steps:
        if step.kind != "file":
            continue
        if os.environ.get(CORRUPT_COPY_ENV):
            _corrupt_for_test(dst_side, step.dst)
        want = side_checksum(src_side, step.src)
        got = side_checksum(dst_side, step.dst)
        if (want["crc"], want["length"]) != (got["crc"], got["length"]):
            raise item_error(ChecksumError, step.dst,
                             f"checksum mismatch after copying {step.src}: source "
                             f"{want['algorithm']} {want['crc']} ({want['length']} bytes), "
                             f"copy {got['crc']} ({got['length']} bytes)")
        log.debug("%s: verified %s %s", step.dst, got["algorithm"], got["crc"])


def cmd_checksum(cmd: Command):
    for raw in cmd.args.paths:
        try:
            is_local, path = split_file_url(raw)
            if is_local:
                result = local_file_checksum(path)
                block_size = os.stat(path).st_blksize if cmd.args.block_size else None
            else:
                path = normalize_user_path(path)
                result = cmd.client.get_file_checksum(path)
                block_size = (cmd.client.get_file_status(path).block_size
                              if cmd.args.block_size else None)
        except (LeaseFSError, OSError) as exc:
            cmd.fail(raw, exc)
            continue
        line = f"{raw}\t{result['algorithm']}\t{result['crc']}"
        cmd.out(line if block_size is None else f"{line}\tBlockSize={block_size}")


def register(sub, common) -> None:
    p = command_parser(sub, "checksum", common,
                "content checksums (COMPOSITE-CRC32C) that do not depend on block size",
                description="leasefs checksum PATH...\n"
                            "Prints PATH<TAB>COMPOSITE-CRC32C<TAB>crc per file: the CRC32C of its\n"
                            "content, combined on the block servers from stored chunk CRCs (no\n"
                            "data moves). Equal content, equal checksum, whatever the block and\n"
                            "chunk sizes; file:LOCAL paths are checksummed locally to compare.\n"
                            "-v adds <TAB>BlockSize=N, as hdfs dfs -checksum -v.",
                usage="leasefs checksum [options] PATH...")
    p.add_argument("-v", dest="block_size", action="store_true",
                   help="also each file's block size")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_checksum)
