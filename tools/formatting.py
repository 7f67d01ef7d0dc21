"""Pure text helpers of the ``leasefs`` command line: parsing what people type (modes, owners,
sizes, ``--set`` pairs, ``file:`` URLs) and laying out what they read (``ls -l`` columns, mode
strings, human sizes, tables, ``stat --format``).

Why a module of its own: every shell command and the benchmark share these rules, and keeping
them free of I/O, clocks (times are passed in) and the client lets the tests check the exact
text without a cluster.

Concurrency contract: none needed — plain functions on plain values.
"""

from __future__ import annotations

import re
import stat as _stat
import time

__all__ = [
    "UsageError", "mode_string", "human_size", "parse_size", "parse_mode", "parse_mode_change",
    "ModeChange", "parse_owner",
    "parse_settings", "split_file_url", "format_time", "ls_long_lines", "format_table",
    "stat_format", "STAT_FORMAT_HELP", "status_fields",
]


class UsageError(Exception):
    """The command line itself is wrong (exit status 2), as opposed to a failed operation."""


# --------------------------------------------------------------------------- sizes

_UNITS = ["K", "M", "G", "T", "P", "E"]
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?b?)\s*$", re.IGNORECASE)


def human_size(n: int) -> str:
    """``hdfs dfs -h`` style: bytes below 1 KiB as a plain number, else one decimal + unit."""
    n = int(n)
    if abs(n) < 1024:
        return str(n)
    value = float(n)
    for unit in _UNITS:
        value /= 1024.0
        if abs(value) < 1024 or unit == _UNITS[-1]:
            text = f"{value:.1f}"
            if text.endswith(".0"):
                text = text[:-2]
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``"256M"``, ``"1g"``, ``"4KiB"``, ``"1000"`` → bytes (binary units: HDFS habit)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise UsageError(f"bad size {text!r} (examples: 4096, 64K, 256M, 1G)")
    number, unit = float(match.group(1)), match.group(2).upper()
    factor = 1 << (10 * (_UNITS.index(unit) + 1)) if unit else 1
    return int(number * factor)


# --------------------------------------------------------------------------- modes, owners

def mode_string(kind: str, mode: int) -> str:
    """``("dir", 0o755)`` → ``"drwxr-xr-x"``; sticky/setuid bits shown as ``ls`` does."""
    prefix = {"dir": "d", "symlink": "l"}.get(kind, "-")
    chars = []
    for shift, special, special_char in ((6, _stat.S_ISUID, "s"), (3, _stat.S_ISGID, "s"),
                                         (0, _stat.S_ISVTX, "t")):
        bits = (mode >> shift) & 7
        r = "r" if bits & 4 else "-"
        w = "w" if bits & 2 else "-"
        x = "x" if bits & 1 else "-"
        if mode & special:
            x = special_char if bits & 1 else special_char.upper()
        chars.append(r + w + x)
    return prefix + "".join(chars)


_MODE_RE = re.compile(r"^[0-7]{1,4}$")
_CLAUSE_RE = re.compile(r"^([ugoa]*)((?:[-+=](?:[rwxXt]*|[ugo]))+)$")
_ACTION_RE = re.compile(r"([-+=])([ugo]|[rwxXt]*)")
_WHO_BITS = {"u": 0o4700, "g": 0o2070, "o": 0o1007}   # each with its special bit, as chmod(1)
_MODE_HELP = "expected octal digits (755, 0644, 1777) or symbolic clauses (u+x,g-w,o=r, a+X, +t)"


class ModeChange:
    """A parsed ``chmod`` mode: octal (sets every bit) or symbolic clauses applied in order.

    ``apply(mode, is_dir)`` gives the new mode. As HDFS (and unlike coreutils), a clause
    without ``ugoa`` applies to all and no umask is consulted: the cluster has no umask of
    the caller's shell. ``X`` adds execute to directories and to files that already have an
    execute bit; ``t`` is the sticky bit (only for ``o``/``a``/no who).
    """

    def __init__(self, text: str, octal: int | None, clauses: list):
        self.text, self.octal, self.clauses = text, octal, clauses

    def apply(self, mode: int, is_dir: bool = False) -> int:
        if self.octal is not None:
            return self.octal
        mode &= 0o7777
        for who, actions in self.clauses:
            affected = 0
            for w in who or "a":
                affected |= 0o7777 if w == "a" else _WHO_BITS[w]
            for op, perms in actions:
                value = 0
                if perms in ("u", "g", "o"):   # copy another class's bits (g=u)
                    shift = {"u": 6, "g": 3, "o": 0}[perms]
                    bits = (mode >> shift) & 7
                    value = bits << 6 | bits << 3 | bits
                else:
                    for ch in perms:
                        if ch == "r":
                            value |= 0o444
                        elif ch == "w":
                            value |= 0o222
                        elif ch == "x" or (ch == "X" and (is_dir or mode & 0o111)):
                            value |= 0o111
                        elif ch == "t":
                            value |= 0o1000
                value &= affected
                if op == "+":
                    mode |= value
                elif op == "-":
                    mode &= ~value
                else:
                    mode = (mode & ~affected) | value
        return mode & 0o7777


def parse_mode_change(text: str) -> ModeChange:
    """``755`` / ``u+x,g-w,o=r`` / ``a+X`` / ``+t`` / ``=`` → ``ModeChange``; else a usage
    error (raised before any file is touched)."""
    if not isinstance(text, str) or not text:
        raise UsageError(f"invalid mode {text!r}: {_MODE_HELP}")
    if _MODE_RE.match(text):
        return ModeChange(text, int(text, 8), [])
    clauses = []
    for clause in text.split(","):
        match = _CLAUSE_RE.match(clause)
        if not match:
            raise UsageError(f"invalid mode {text!r}: {_MODE_HELP}")
        clauses.append((match.group(1), _ACTION_RE.findall(match.group(2))))
    return ModeChange(text, None, clauses)


def parse_mode(text: str, *, base: int = 0o777, is_dir: bool = True) -> int:
    """A permission as a number: octal as is, symbolic applied to ``base`` (``mkdir -m``
    starts from ``a=rwx``, as mkdir(1))."""
    return parse_mode_change(text).apply(base, is_dir)


_NAME_RE = re.compile(r"^[A-Za-z0-9_.@$-][A-Za-z0-9_.@$\\-]*$")


def parse_owner(text: str) -> tuple[str | None, str | None]:
    """``OWNER[:GROUP]`` → ``(owner, group)``; ``:GROUP`` changes only the group."""
    owner, sep, group = str(text).partition(":")
    owner = owner or None
    group = (group or None) if sep else None
    if owner is None and group is None:
        raise UsageError(f"invalid owner {text!r}: expected OWNER, OWNER:GROUP or :GROUP")
    for name in (owner, group):
        if name is not None and not _NAME_RE.match(name):
            raise UsageError(f"invalid owner {text!r}: {name!r} is not a valid user or group name")
    return owner, group


def parse_settings(pairs) -> dict[str, str]:
    """``["heartbeat_interval=0.2", ...]`` (from ``--set``) → dict; Config checks the names."""
    settings: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: expected KEY=VALUE")
        settings[key] = value.strip()
    return settings


def split_file_url(text: str) -> tuple[bool, str]:
    """``file:///abs`` / ``file:rel`` → ``(True, local path)``; anything else → ``(False, text)``."""
    if text.startswith("file://"):
        rest = text[len("file://"):]
        if not rest.startswith("/"):
            raise UsageError(f"{text!r}: file:// URLs need an absolute path (file:///abs/path) "
                             "or use file:relative/path")
        return True, rest
    if text.startswith("file:"):
        rest = text[len("file:"):]
        if not rest:
            raise UsageError(f"{text!r}: empty local path")
        return True, rest
    return False, text


# --------------------------------------------------------------------------- time

def format_time(ns: int | None, *, seconds: bool = False) -> str:
    """Nanoseconds since the epoch → local ``YYYY-MM-DD HH:MM`` (``hdfs dfs -ls`` style)."""
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M",
                         time.localtime(ns / 1e9))


def format_checkpoint(c: dict | None) -> str:
    """One line for a ``{txid, time_ns, txns_since, journal_bytes_since}`` checkpoint entry
    (``report`` too): what the journal holds since is what the next start may verify."""
    if not c:
        return "never"
    size = human_size(c.get("journal_bytes_since", 0))
    since = (f"{c.get('txns_since', 0)} transactions, {size}{'B' if size[-1].isalpha() else ' B'}"
             f" of journal since")
    if not c.get("time_ns"):
        return f"never ({since})"
    return f"txid {c['txid']} at {format_time(c['time_ns'], seconds=True)} ({since})"


# --------------------------------------------------------------------------- ls -l, tables

def ls_long_lines(statuses, *, human: bool = False, atime: bool = False,
                  name_of=lambda st: st.name) -> list[str]:
    """``ls -l`` lines: mode, replication (``-`` for dirs), owner, group, size, mtime (the
    access time with ``atime``, as ``ls -u``), name.

    Columns are aligned over the whole listing, numbers right-aligned, names left.
    """
    rows = []
    for st in statuses:
        kind = st.type
        name = name_of(st)
        if kind == "symlink" and st.symlink:
            name = f"{name} -> {st.symlink}"
        rows.append([
            mode_string(kind, st.mode),
            str(st.replication) if kind == "file" else "-",
            st.owner or "-",
            st.group or "-",
            human_size(st.length) if human else str(st.length),
            format_time(st.atime_ns if atime else st.mtime_ns),
            name,
        ])
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = []
    for r in rows:
        lines.append(f"{r[0]:<{widths[0]}} {r[1]:>{widths[1]}} {r[2]:<{widths[2]}} "
                     f"{r[3]:<{widths[3]}} {r[4]:>{widths[4]}} {r[5]} {r[6]}")
    return lines


def format_table(headers, rows, *, align=None) -> list[str]:
    """Plain text table; ``align`` is a string of ``<``/``>`` per column (default: text left,
    everything else right)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    n = len(headers)
    if align is None:
        align = "<" + ">" * (n - 1)
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    out = []
    for index, r in enumerate(cells):
        out.append("  ".join(f"{r[i]:{align[i]}{widths[i]}}" for i in range(n)).rstrip())
        if index == 0:
            out.append("  ".join("-" * widths[i] for i in range(n)))
    return out


# --------------------------------------------------------------------------- stat

_STATUS_FIELDS = ("path", "name", "type", "ino", "mode", "owner", "group", "length",
                  "replication", "block_size", "mtime_ns", "atime_ns", "ctime_ns", "symlink",
                  "under_construction", "children")


def status_fields(st) -> list[tuple[str, str]]:
    """Every field of a ``FileStatus`` as ``(label, text)`` for ``leasefs stat``."""
    out = []
    for name in _STATUS_FIELDS:
        value = getattr(st, name, None)
        if name == "mode":
            text = f"{value:04o} ({mode_string(st.type, value)})"
        elif name.endswith("_ns"):
            text = f"{value} ({format_time(value, seconds=True)})" if value else "-"
        elif name == "symlink" and not value:
            continue
        elif name == "children" and st.type != "dir":
            continue
        elif name == "length":
            text = f"{value} ({human_size(value)})" if value and value >= 1024 else str(value)
        else:
            text = "-" if value is None else str(value)
        out.append((name, text))
    return out


STAT_FORMAT_HELP = ("%n name, %N path, %F type, %a octal mode, %A mode string, %u owner, "
                    "%g group, %b length, %o block size, %r replication, %i inode, "
                    "%y mtime, %Y mtime ms, %x atime, %X atime ms, %% percent sign")


def stat_format(fmt: str, st) -> str:
    """``hdfs dfs -stat`` style ``%`` codes (see ``STAT_FORMAT_HELP``); ``\\n``/``\\t`` honoured."""
    kind_names = {"dir": "directory", "file": "regular file", "symlink": "symlink"}
    codes = {
        "n": lambda: st.name or "/",
        "N": lambda: st.path,
        "F": lambda: kind_names.get(st.type, st.type),
        "a": lambda: f"{st.mode:o}",
        "A": lambda: mode_string(st.type, st.mode),
        "u": lambda: st.owner,
        "g": lambda: st.group,
        "b": lambda: str(st.length),
        "o": lambda: str(st.block_size),
        "r": lambda: str(st.replication),
        "i": lambda: str(st.ino),
        "y": lambda: format_time(st.mtime_ns, seconds=True),
        "Y": lambda: str(st.mtime_ns // 1_000_000),
        "x": lambda: format_time(st.atime_ns, seconds=True),
        "X": lambda: str(st.atime_ns // 1_000_000),
        "%": lambda: "%",
    }
    fmt = fmt.replace("\\n", "\n").replace("\\t", "\t")
    out = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "%" and i + 1 < len(fmt):
            code = fmt[i + 1]
            if code not in codes:
                raise UsageError(f"--format: unknown code %{code} ({STAT_FORMAT_HELP})")
            out.append(codes[code]())
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)
