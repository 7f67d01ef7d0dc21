"""What every namespace call may be given: limits, the configured defaults and
the argument checks the planners and the RPC handlers share.

Why it exists: the checks are the first half of every ``plan_<op>`` and of every handler
that takes client values, so they live apart from both and from the store.

Purity / concurrency contract: pure functions and constants, no I/O, no state; safe from
any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from fs.errors import InvalidArgument

MAX_OWNER_LEN = 256
MAX_TARGET_BYTES = 4096      # PATH_MAX: the kernel refuses longer symlink targets itself
MAX_LIST_LIMIT = 10_000
MAX_RENAMES = 10_000          # moves in one rename_many (one journal record)


@dataclass
class Defaults:
    """What a namespace needs from the configuration."""

    block_size: int = 128 << 20
    replication: int = 3
    max_replication: int = 32
    bytes_per_checksum: int = 4096
    min_block_size: int = 1 << 20          # HDFS dfs.namenode.fs-limits.min-block-size
    max_blocks_per_file: int = 1_048_576   # HDFS dfs.namenode.fs-limits.max-blocks-per-file
    delete_chunk: int = 2000               # entries one DELETE/RECLAIM record may remove
    inline_max: int = 64 << 10             # bytes of a file kept in the namespace at most
    owner: str = "leasefs"
    group: str = "supergroup"

    @classmethod
    def from_config(cls, config) -> "Defaults":
        return cls(block_size=config.block_size, replication=config.replication,
                   max_replication=config.max_replication,
                   bytes_per_checksum=config.bytes_per_checksum,
                   min_block_size=config.min_block_size,
                   max_blocks_per_file=config.max_blocks_per_file,
                   delete_chunk=config.delete_chunk, inline_max=config.inline_max)


# ---------------------------------------------------------------------------- arg checks
def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value, what: str, *, low: int | None = None, high: int | None = None) -> int:
    if not is_int(value):
        raise InvalidArgument(f"{what} must be an integer, got {value!r:.60}")
    if low is not None and value < low:
        raise InvalidArgument(f"{what} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise InvalidArgument(f"{what} must be at most {high}, got {value}")
    return value


def check_ino(ino, path: str) -> int | None:
    """An optional inode id argument: None (or 0) means "address by path"."""
    if ino is None or ino == 0:
        return None
    return check_int(ino, f"{path}: ino", low=1)


def check_bool(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be true or false, got {value!r:.60}")
    return value


def check_name(value, what: str, *, optional: bool = False) -> str | None:
    """Client names, owners, groups: short printable strings."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r:.60}")
    if len(value) > MAX_OWNER_LEN or "\0" in value:
        raise InvalidArgument(f"{what} {value[:60]!r}: too long or contains NUL")
    return value


def check_mode(value, what: str) -> int:
    return check_int(value, what, low=0, high=0o7777)


def check_block_ref(value, what: str) -> dict:
    """``{"id", "gs"?, "num_bytes"}`` from a client."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a block map {{id, gs, num_bytes}}, got {value!r:.80}")
    check_int(value.get("id"), f"{what}.id", low=0)
    if value.get("gs") is not None:
        check_int(value.get("gs"), f"{what}.gs", low=0)
    check_int(value.get("num_bytes"), f"{what}.num_bytes", low=0)
    return value
