"""Journal ops: the one place that says what each op of the edit log means.

Why it exists: an op's meaning used to be spread over three string switches (the store
appliers, the server's memory updates, the replay checker); standby and observer metadata
servers replaying the edit log must run exactly the code the active runs, so each op is now
one frozen dataclass (``meta.journal.ops_namespace``, ``ops_blocks``, ``ops_tokens``,
``ops_dirleases``)
with, in one place:

* its typed fields and wire form: planners build the op (its constructor refuses a missing
  or unknown field before anything is written) and the journal takes it; ``to_wire()`` /
  ``to_args()`` give the record's dict (fields in declaration order, optional keys left out
  when ABSENT), byte for byte what the planners journaled as plain dicts before, so
  journals and checkpoints on disk replay unchanged; ``from_args(dict)`` reads it back;
* ``apply(txn, counters) -> Effect | None``: its store changes (``meta.journal.ops_store``; used by
  ``Namespace.apply``, live and at replay), and what of them the server's memory must
  follow: an ``Effect`` (blocks that left the namespace, files no longer under
  construction, the root of a detached subtree), or the op's own subclass of it declared
  beside the op when its ``apply_memory`` needs more (None: nothing, ``NO_EFFECT``);
  in memory only, never written;
* ``apply_memory(state, effect, now)``: the in-memory structures of the server
  (``MemoryState``: the blocks map, leases, lease recovery, tokens, directory leases)
  after the store write, given the effect its own ``apply`` returned;
* ``check(view)``: the planner's preconditions re-checked at serial replay
  (``meta.namespace.invariants.check_record``);
* ``rpc_call()``: the retry-cached call the record was written for (``RPC_CALL``), which
  every server applying it notes in its retry cache, with ``rpc_kept()`` (``RPC_KEPT``):
  what the record kept of that call's answer for a retry.

This module holds the base class, the wire helpers and the registry table the family
modules register their classes in (``@register``); ``meta.journal.ops`` loads every family
and is the way in (``OPS``, ``decode(record)``, ``LAZY_OPS``).

Concurrency contract: ops are immutable values; ``apply`` and ``apply_memory`` run on the
trio thread, synchronously (no awaits), inside the journal's apply of one batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fs.errors import InternalError
from fs.retry_cache import CallKey

if TYPE_CHECKING:
    from ..blocks.blocks import BlocksMap
    from ..leases.dirleases import InoRange
    from ..leases.leases import LeaseManager


# the key the journal adds to the last record a retry-cached call logs:
# ``[client_id, call_id, method]`` (``fs.retry_cache.CallKey``); no op has a field of that
# name, so it travels in ``Op.extra`` and re-encodes byte for byte
RPC_CALL = "rpc"
# the key the journal adds next to it (travelling in ``extra`` the same way) when the call's
# answer holds something the namespace will not (the status of an inode it removed): what
# a retry needs to answer as the first call did. Its value is ``meta.services.retry_answers``' to
# make and read; only calls that have such a part carry it, other records stay as they were
RPC_KEPT = "rpc_kept"
_RPC_KEYS = (RPC_CALL, RPC_KEPT)


class _Absent:
    """A key that is not in the record (optional keys; older records)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


def given(value, default=None):
    """``value``, or ``default`` when its key was not in the record (``dict.get``)."""
    return default if value is ABSENT else value


class MalformedRecord(InternalError):
    """A record whose args do not fit its op (a missing key)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """What an applied record changed that the server's memory follows (``MetaServer._apply``
    for every op; an op's ``apply_memory`` for its own subclass's fields)."""

    removed_blocks: tuple[int, ...] = ()   # block ids that left the namespace
    removed_uc: tuple[int, ...] = ()       # files no longer under construction (lease ends)
    orphan: int | None = None              # root of a subtree detached for the reclaimer


NO_EFFECT = Effect()   # what an ``apply`` returning None changed for memory: nothing


class RecoveryState(Protocol):
    """What the ops use of lease recovery (``meta.services.lease_recovery.LeaseRecovery``, which
    imports the namespace and so cannot be named here without an import circle)."""

    def forget_recovery(self, block_id: int) -> None: ...

    def lease_ended(self, ino: int) -> None: ...


class TokenTable(Protocol):
    """What the token ops use of ``meta.services.security.Security`` (named by a protocol for the
    same reason)."""

    def token_stored(self, wire: dict) -> None: ...

    def token_cancelled(self, seq: int) -> None: ...


class DirLeaseState(Protocol):
    """What the directory lease ops use of ``meta.services.dir_leases.DirLeases`` (named
    by a protocol for the same reason)."""

    def lease_granted(self, ino: int, holder: str, epoch: int, inos: InoRange) -> None: ...

    def lease_ended(self, ino: int, epoch: int) -> None: ...


@dataclass(frozen=True, slots=True)
class MemoryState:
    """What ``Op.apply_memory`` may use of the metadata server: its services, named."""

    blocks: BlocksMap
    leases: LeaseManager
    recovery: RecoveryState   # block recoveries running, leases ending
    security: TokenTable      # the delegation token table
    dir_leases: DirLeaseState  # the directory write leases and their waiters


class CheckView(Protocol):
    """What ``Op.check`` may use of the replay checker (``invariants.RecordCheck``)."""

    formatted: bool

    def problem(self, text: str) -> None: ...

    def get(self, key: bytes): ...

    def inode(self, ino): ...

    def entry(self, parent, name): ...

    def linked(self, ino: int) -> bool: ...

    def new_dirs(self, dirs) -> set: ...

    def new_entry(self, parent, name, ino, made, overwrite=None) -> None: ...

    def rename(self, one) -> None: ...

    def open_file(self, ino, *, linked: bool) -> dict | None: ...


@dataclass(frozen=True)
class Op:
    """One journal op. Fields are the record's args in wire order (subclasses are made
    dataclasses by ``register``); a field defaulting to ``ABSENT`` is optional (left out
    of ``to_args`` when it was not in the record). Keys this code does not know are kept
    in ``extra`` (put back after the others) and otherwise ignored."""

    NAME: ClassVar[str] = ""
    needs_format: ClassVar[bool] = True       # refused before FORMAT
    charges_file_space: ClassVar[bool] = False   # changes the space of file ``ino`` (quotas)
    lazy: ClassVar[bool] = False              # namespace only: may be answered before fsync

    # ------------------------------------------------------------------ wire form
    _names: ClassVar[tuple[str, ...]] = ()       # wire keys in order (set by ``register``)
    _required: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_args(cls, args: dict) -> Op:
        values = {}
        for name in cls._names:
            if name in args:
                values[name] = args[name]
            elif name in cls._required:
                raise MalformedRecord(f"{cls.NAME} record without {name!r}")
        if len(values) != len(args):
            values["extra"] = tuple((k, v) for k, v in args.items() if k not in cls._names)
        # what the frozen dataclass ``__init__`` would do, without its setattr per field
        # (every applied record is decoded here): the fields it leaves out read their
        # defaults from the class, as ``register`` makes them (no field has a factory)
        op = object.__new__(cls)
        op.__dict__.update(values)
        return op

    def to_wire(self) -> tuple[str, dict]:
        """The record as the journal writes it: ``(op name, args)``."""
        return self.NAME, self.to_args()

    def to_args(self) -> dict:
        args = {}
        for name in self._names:
            value = getattr(self, name)
            if value is not ABSENT:
                args[name] = value
        args.update(self.extra)
        return args

    def rpc_call(self) -> CallKey | None:
        """The retry-cached call this record was written for (its ``RPC_CALL`` key, kept
        in ``extra``), or None: records of monitors and uncached calls carry none."""
        for name, value in self.extra:
            if name == RPC_CALL:
                return CallKey.from_wire(value)
        return None

    def rpc_kept(self):
        """What the record kept of its call's answer for a retry (``RPC_KEPT``), or None:
        most calls need nothing, and records written before it existed have none."""
        for name, value in self.extra:
            if name == RPC_KEPT:
                return value
        return None

    # ------------------------------------------------------------------ meaning
    def apply(self, txn, counters: dict) -> Effect | None:
        """The store changes (``txn``: the batch view, ``counters``: the batch's); None
        when memory has nothing to follow. An op whose ``apply_memory`` reads its own
        ``Effect`` subclass returns one on every path."""
        raise NotImplementedError

    def apply_memory(self, state: MemoryState, effect: Effect, now: float) -> None:
        """The server's memory after the store write (default: nothing of its own)."""

    def check(self, view: CheckView) -> None:
        """The planner's preconditions at serial replay (default: none)."""


OPS: dict[str, type[Op]] = {}   # op name -> class: the only way to an op


def register(cls):
    """Class decorator: make ``cls`` a frozen dataclass op named ``cls.NAME``, registered.
    Fields are keyword-only, so optional and required ones may alternate as the wire order
    wants; ``extra`` is added after the op's own fields."""
    cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}), "extra": "tuple"}
    cls.extra = ()
    cls = dataclass(frozen=True, kw_only=True)(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name != "extra"]
    cls._names = tuple(f.name for f in fields)
    for name in _RPC_KEYS:
        if name in cls._names:
            raise InternalError(f"journal op {cls.NAME}: {name!r} is the retry cache's key")
    cls._required = frozenset(f.name for f in fields if f.default is not ABSENT)
    if any(f.default_factory is not dataclasses.MISSING for f in fields) or \
            hasattr(cls, "__post_init__"):
        # ``from_args`` fills the instance's dict directly: nothing may need ``__init__``
        raise InternalError(f"journal op {cls.NAME}: no default factory or __post_init__")
    if cls.NAME in OPS:
        raise InternalError(f"journal op {cls.NAME} registered twice")
    OPS[cls.NAME] = cls
    return cls


def to_wire(record: Op | tuple[str, dict]) -> tuple[str, dict]:
    """``(op name, args)`` of a typed op, or of a ``(name, args)`` pair as it stands (the
    journal's own tests write pairs of no registered op)."""
    return record.to_wire() if isinstance(record, Op) else record


def op_name(record: Op | tuple[str, dict]) -> str:
    return record.NAME if isinstance(record, Op) else record[0]
