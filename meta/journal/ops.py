"""Every journal op, registered: the way in to the ops of the edit log (``OPS``: op name →
class, ``decode(record)``, ``LAZY_OPS``).

Why it exists: the families (``ops_namespace``, ``ops_blocks``, ``ops_tokens``,
``ops_dirleases``, ``ops_locks``) build on ``opbase`` (the base class, the wire helpers,
``register``); this module loads all of them, so that a reader of a record finds every op
registered, and re-exports the base names its callers use. Nothing below it imports it.

Concurrency contract: that of ``opbase``: ops are immutable values.
"""

from __future__ import annotations

from fs.errors import InternalError

# imported for their ops' registration
from . import ops_blocks, ops_dirleases, ops_locks, ops_namespace, ops_tokens  # noqa: F401
from .opbase import (  # noqa: F401  (re-exported: the ops' callers import them from here)
    ABSENT, NO_EFFECT, OPS, RPC_CALL, RPC_KEPT, Effect, MalformedRecord, MemoryState, Op, given,
    op_name, register, to_wire)


def decode(record) -> Op:
    """The typed op of a journal record (``record.txid``, ``.op``, ``.args``)."""
    cls = OPS.get(record.op)
    if cls is None:
        raise InternalError(f"journal txid {record.txid}: unknown op {record.op!r}")
    try:
        return cls.from_args(record.args)
    except MalformedRecord as exc:
        raise MalformedRecord(f"journal txid {record.txid}: {exc}") from None
    except (TypeError, AttributeError) as exc:   # args that are not a dict
        raise MalformedRecord(f"journal txid {record.txid}: {record.op} record: {exc}") from None


# namespace-only ops: a client without ``sync_metadata`` is answered once they are written
LAZY_OPS = frozenset(name for name, cls in OPS.items() if cls.lazy)
