"""Reading option values: Spark lower-cases option keys, and flags are strings.

Concurrency contract: pure.
"""

from __future__ import annotations


def option(options, name: str, default=None):
    """An option by its lower-cased name (Spark lower-cases keys), or ``default``."""
    value = options.get(name.lower()) if options is not None else None
    return default if value is None else value


def flag(options, name: str, default: bool) -> bool:
    value = option(options, name)
    if value is None:
        return default
    return str(value).strip().lower() in ("true", "1", "yes")
