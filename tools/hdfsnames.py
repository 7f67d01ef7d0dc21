"""The command line as an HDFS user types it: ``leasefs dfs -ls /`` and ``leasefs fs -ls /``
(the ``hdfs dfs`` / ``hadoop fs`` prefix), HDFS's verb names (``appendToFile``), full URIs
(``leasefs://HOST:PORT/path``, as ``hdfs://nn:8020/path``), and for an HDFS name that leasefs
spells otherwise (``recoverLease``, ``listOpenFiles``, ``lsr``) one line saying which
leasefs command does it.

Why a rewrite of the words before parsing: the commands themselves already take HDFS's
single-dash options; only the first words differ, and rewriting them keeps one parser per
command instead of a second HDFS-shaped one.

Concurrency contract: none — pure functions of the argument list.
"""

from __future__ import annotations

from .formatting import UsageError

#: options shared by every command that take a value (tools.cli.common_options)
VALUE_OPTIONS = ("--meta", "--config", "--set", "--log-level")

#: ``hdfs dfs -VERB``s that leasefs runs under another name, same operands
RUN_AS = {"appendToFile": "append"}

#: HDFS names leasefs does not take, and what to type instead
ADVICE = {
    "lsr": "leasefs ls -R PATH",
    "dus": "leasefs du -s PATH",
    "rmr": "leasefs rm -r PATH",
    "recoverLease": "leasefs recover-lease PATH (hdfs debug recoverLease)",
    "listOpenFiles": "leasefs leases [PATH] (or leasefs dfsadmin -listOpenFiles)",
    "saveNamespace": "leasefs save-namespace (or leasefs dfsadmin -saveNamespace)",
    "refreshNodes": "leasefs decommission HOST:PORT (or leasefs dfsadmin -refreshNodes)",
    "printTopology": "leasefs dfsadmin -printTopology",
    "setQuota": "leasefs set-quota N PATH...",
    "clrQuota": "leasefs clr-quota PATH...",
    "setSpaceQuota": "leasefs set-space-quota N PATH...",
    "clrSpaceQuota": "leasefs clr-space-quota PATH...",
    "namenode": "leasefs meta DATA_DIR (or leasefs cluster up)",
    "datanode": "leasefs storage DATA_DIR (or leasefs cluster up)",
    "fetchdt": "leasefs token fetch FILE",
    "getconf": "leasefs settings",
    "version": "leasefs --version",
    "usage": "leasefs COMMAND --help",
    "help": "leasefs --help, or leasefs COMMAND --help",
}
_NO_ACL = "leasefs has no ACLs: permissions are the mode bits (leasefs chmod, chown, stat)"
_NO_XATTR = "leasefs has no extended attributes"
_NO_SNAPSHOT = "leasefs has no snapshots (copy with leasefs cp, or use the trash: leasefs rm)"
#: HDFS verbs with no counterpart, and why
MISSING = {
    "getfacl": _NO_ACL, "setfacl": _NO_ACL,
    "getfattr": _NO_XATTR, "setfattr": _NO_XATTR,
    "createSnapshot": _NO_SNAPSHOT, "deleteSnapshot": _NO_SNAPSHOT,
    "renameSnapshot": _NO_SNAPSHOT, "lsSnapshottableDir": _NO_SNAPSHOT,
    "snapshotDiff": _NO_SNAPSHOT,
}


def command_index(argv: list[str]) -> int | None:
    """Where the command word is: the first word that is neither an option shared by every
    command nor such an option's value; None when there is none."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in VALUE_OPTIONS:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return i
    return None


def _verb(word: str, prefix: str) -> str:
    """The leasefs command for ``hdfs dfs``'s ``-VERB`` (given after ``leasefs PREFIX``)."""
    if not word.startswith("-") or word in ("-", "--"):
        raise UsageError(f"'{PREFIX_USAGE.format(prefix=prefix)}': expected an HDFS verb "
                         f"such as -ls after '{prefix}', got '{word}'")
    return word.lstrip("-")


PREFIX_USAGE = "leasefs {prefix} -VERB [options] ARGS"


def translate(argv: list[str], commands) -> list[str]:
    """``argv`` with HDFS's forms turned into leasefs's: the ``dfs``/``fs`` prefix dropped
    and its ``-VERB`` made the command word, HDFS names leasefs runs under another name
    replaced. ``UsageError`` names the leasefs command for an HDFS name it does not take."""
    index = command_index(argv)
    if index is None:
        return argv
    argv = list(argv)
    prefix = None
    if argv[index] in ("dfs", "fs"):
        prefix = argv.pop(index)
        if index >= len(argv):
            raise UsageError(f"usage: {PREFIX_USAGE.format(prefix=prefix)} (as hdfs dfs)")
        verb = _verb(argv[index], prefix)
        if verb in ("help", "usage"):
            topic = argv[index + 1].lstrip("-") if index + 1 < len(argv) else None
            argv[index:] = [RUN_AS.get(topic, topic), "--help"] if topic else ["--help"]
            return argv
        argv[index] = verb
    word = argv[index]
    if word in RUN_AS:
        argv[index] = RUN_AS[word]
    elif word not in commands:
        said = f"-{word}" if prefix else word
        if word in MISSING:
            raise UsageError(f"HDFS's {said} has no leasefs counterpart: {MISSING[word]}")
        if word in ADVICE:
            raise UsageError(f"'{said}' is an HDFS name; in leasefs: {ADVICE[word]}")
        if prefix:
            raise UsageError(f"unknown HDFS verb -{word} (see 'leasefs --help')")
    return argv


SCHEME = "leasefs://"


def cluster_uris(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` with every ``leasefs://AUTHORITY/path`` made ``/path``, and the one
    authority they name (None when none does; ``leasefs:///path`` names none). Two URIs
    naming different servers, or an ``hdfs://`` one, are a ``UsageError``."""
    out, authority = [], None
    for word in argv:
        if word.startswith("hdfs://"):
            raise UsageError(f"{word}: an hdfs:// URI names an HDFS cluster; leasefs takes "
                             f"{SCHEME}HOST:PORT/PATH or a plain /PATH")
        if not word.startswith(SCHEME):
            out.append(word)
            continue
        named, slash, path = word[len(SCHEME):].partition("/")
        if named:
            if authority is not None and named != authority:
                raise UsageError(f"{word}: names {named}, another argument names {authority}; "
                                 f"one command talks to one cluster")
            authority = named
        out.append(slash + path or "/")
    return out, authority


def check_authority(authority: str, configured: str | None) -> str:
    """The metadata server a URI's ``authority`` names, when it is (one of) the
    ``configured`` address(es) or nothing is configured; else ``UsageError``."""
    from fs.errors import InvalidArgument
    from fs.rpc import parse_address_list

    try:
        named = parse_address_list(authority)
        if configured is None or set(named) <= set(parse_address_list(configured)):
            return configured or authority
    except InvalidArgument as exc:
        raise UsageError(f"{SCHEME}{authority}: {exc}") from None
    raise UsageError(f"{SCHEME}{authority} names another cluster than the one configured "
                     f"({configured}); give --meta {authority} to talk to that one")
