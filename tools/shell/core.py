"""The ``hdfs dfs``-style shell commands of ``leasefs``: ls, stat, cat, put, get, cp, mv, rm,
mkdir, touch, du, df, setrep, chmod, chown, tail, report, safemode.

Why: people (and scripts) reach the cluster through these first, so each command behaves the
way its coreutils/``hdfs dfs`` namesake does, talks to the cluster only through the public
``fs.client.Client``, and reports failures as one line per failed path (``tools.common``).
Paths typed by users go through ``fs.paths.normalize_user_path`` (``//``, ``.``, ``..``,
relative paths resolved against ``/``).

Concurrency contract: synchronous, the CLI's main thread; one client per process.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from fs import paths
from fs.errors import (DirectoryNotEmpty, FileExists, FileNotFound, InvalidArgument,
                       IsDirectory, LeaseFSError, NotDirectory, PermissionDenied)

from ..common import Command, command_parser
from ..formatting import (STAT_FORMAT_HELP, UsageError, format_checkpoint, format_table,
                          human_size, ls_long_lines, parse_mode, parse_mode_change, parse_owner,
                          parse_size, split_file_url, stat_format, status_fields)
from ..progress import Progress, wanted
from . import transfer

log = logging.getLogger(__name__)

ITEM_ERRORS = (LeaseFSError, OSError)
PRESERVE_HELP = ("preserve times, owner, group and permission (changing the owner needs the "
                 "superuser)")


def user_path(text: str) -> str:
    """A path as typed (relative = from ``/``) in canonical form, or ``InvalidPath``."""
    return paths.normalize_user_path(text)


def walk(client, path: str):
    """``(path, status)`` of everything below ``path``, depth first, sorted by name."""
    for st in client.iter_status(path):
        child = paths.join(path, st.name)
        yield child, st
        if st.type == "dir":
            yield from walk(client, child)


def _item_path(exc, default):
    if getattr(exc, "item_path", None):
        return exc.item_path
    if isinstance(exc, OSError) and not isinstance(exc, LeaseFSError) and exc.filename:
        return str(exc.filename)
    return default


# --------------------------------------------------------------------------- ls, stat

def cmd_ls(cmd: Command):
    a = cmd.args
    targets = a.paths or ["/"]
    client = cmd.client
    for index, raw in enumerate(targets):
        try:
            path = user_path(raw)
            st = client.get_file_status(path)
            if st.type == "dir" and not a.directory:
                if a.recursive:
                    entries = [(p, s) for p, s in walk(client, path)]
                else:
                    entries = [(paths.join(path, s.name), s) for s in client.iter_status(path)]
                    if len(targets) > 1:
                        cmd.out(("\n" if index else "") + f"{path}:")
                show_full = a.recursive
            else:
                entries, show_full = [(path, st)], True
            entries = sort_entries(entries, by_time=a.by_time, by_size=a.by_size,
                                   reverse=a.reverse, atime=a.atime)
            names = {id(s): (p if show_full else s.name) for p, s in entries}
            statuses = [s for _, s in entries]
            if a.long:
                for line in ls_long_lines(statuses, human=a.human, atime=a.atime,
                                          name_of=lambda s: names[id(s)]):
                    cmd.out(line)
            else:
                for s in statuses:
                    cmd.out(names[id(s)])
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def sort_entries(entries, *, by_time=False, by_size=False, reverse=False, atime=False):
    """``ls`` order as ``hdfs dfs -ls``: by name, or newest first (``-t``; ``-u`` uses the
    access time), or largest first (``-S``); ``-r`` reverses whichever applies."""
    if by_time:
        field = "atime_ns" if atime else "mtime_ns"
        # ties keep name order, so the output does not depend on the server's listing order
        entries = sorted(entries, key=lambda e: (-(getattr(e[1], field) or 0), e[0]))
    elif by_size:
        entries = sorted(entries, key=lambda e: (-(e[1].length or 0), e[0]))
    return list(reversed(entries)) if reverse else list(entries)


def cmd_stat(cmd: Command):
    a = cmd.args
    targets, fmt = list(a.paths), a.format
    if fmt is None and len(targets) > 1 and "%" in targets[0]:  # HDFS: stat FORMAT PATH...
        fmt = targets.pop(0)
    for index, raw in enumerate(targets):
        try:
            st = cmd.client.get_file_status(user_path(raw))
            if fmt is not None:
                cmd.out(stat_format(fmt, st))
                continue
            if index:
                cmd.out()
            rows = status_fields(st)
            width = max(len(k) for k, _ in rows)
            for key, text in rows:
                cmd.out(f"{key + ':':<{width + 1}} {text}")
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


# --------------------------------------------------------------------------- cat, tail

def _stdout_binary():
    return getattr(sys.stdout, "buffer", sys.stdout)


def cmd_cat(cmd: Command):
    out = _stdout_binary()
    for raw in cmd.args.paths:
        try:
            path = user_path(raw)
            st = cmd.client.get_file_status(path)
            if st.type == "dir":
                raise IsDirectory(f"{path}: is a directory")
            with cmd.client.open(path) as reader:
                transfer.pump(reader, out)
            out.flush()
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_tail(cmd: Command):
    a = cmd.args
    out = _stdout_binary()
    raw = a.path
    try:
        count = parse_size(a.bytes)
        path = user_path(raw)
        st = cmd.client.get_file_status(path)
        if st.type == "dir":
            raise IsDirectory(f"{path}: is a directory")
        with cmd.client.open(path) as reader:
            length = reader.length
            reader.seek(max(0, length - count))
            transfer.pump(reader, out)
        out.flush()
        try:
            while a.follow:  # until Ctrl-C, which is the normal way to end `tail -f`
                time.sleep(a.interval)
                with cmd.client.open(path) as reader:
                    if reader.length > length:
                        reader.seek(length)
                        transfer.pump(reader, out)
                        out.flush()
                    length = max(length, reader.length)
        except KeyboardInterrupt:
            return
    except ITEM_ERRORS as exc:
        cmd.fail(raw, exc)


# --------------------------------------------------------------------------- copies

def copy_items(cmd: Command, sources, dst_side, dst: str, dst_display: str):
    """Copy every ``(side, path, display)`` source to ``dst`` (into it when it is a dir)."""
    a = cmd.args
    overwrite = bool(getattr(a, "force", False))
    options = {"replication": getattr(a, "replication", None),
               "block_size": parse_size(a.block_size) if getattr(a, "block_size", None) else None}
    try:
        dst_entry = dst_side.stat(dst)
    except ITEM_ERRORS as exc:
        cmd.fail(dst_display, exc)
        return
    # a trailing slash means "into this directory", as with cp(1): never create a file there
    if dst_display.endswith("/") and dst_display.rstrip("/") and \
            (dst_entry is None or dst_entry.kind != "dir"):
        cmd.fail(dst_display, (FileNotFound if dst_entry is None else NotDirectory)(
            "no such directory" if dst_entry is None else "not a directory"))
        return
    if len(sources) > 1 and (dst_entry is None or dst_entry.kind != "dir"):
        what = "does not exist" if dst_entry is None else "is not a directory"
        cmd.fail(dst_display, NotDirectory(
            f"{what}; copying several sources needs an existing directory as target"))
        return
    planned = []
    for side, src, display in sources:
        try:
            target = transfer.target_for(side, src, dst_side, dst, dst_entry)
            planned.append((side, display, transfer.plan(side, src, dst_side, target,
                                                         overwrite=overwrite)))
        except ITEM_ERRORS as exc:
            cmd.fail(_item_path(exc, display), exc)
    total = sum(step.size for _, _, steps in planned for step in steps)
    with Progress(total, cmd.name, enabled=wanted(total, getattr(a, "progress", False))) as bar:
        for side, display, steps in planned:
            try:
                transfer.run_steps(steps, side, dst_side, overwrite=overwrite, progress=bar,
                                   options=options, preserve=bool(getattr(a, "preserve", False)))
                if getattr(a, "verify", False):
                    from .checksum import verify_steps
                    verify_steps(steps, side, dst_side)
            except ITEM_ERRORS as exc:
                cmd.fail(_item_path(exc, display), exc)


def _local(text: str) -> str:
    is_url, path = split_file_url(text)
    return path


def cmd_put(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs LOCAL... DST (at least one source and a destination)")
    *srcs, dst_raw = a.args
    cluster = transfer.ClusterSide(cmd.client)
    local = transfer.LocalSide()
    try:
        dst = user_path(dst_raw)
    except ITEM_ERRORS as exc:
        cmd.fail(dst_raw, exc)
        return
    if "-" in srcs:
        if len(srcs) > 1:
            raise UsageError("'-' (stdin) must be the only source")
        _put_stdin(cmd, cluster, dst)
        return
    copy_items(cmd, [(local, _local(s), s) for s in srcs], cluster, dst, dst_raw)


def _put_stdin(cmd: Command, cluster, dst: str):
    try:
        entry = cluster.stat(dst)
        if entry is not None and entry.kind == "dir":
            raise IsDirectory(f"{dst}: is a directory; name the file to write stdin to")
        if entry is not None and not cmd.args.force:
            raise FileExists(f"{dst}: file exists (use -f to overwrite)")
        tmp = transfer.tmp_name(cluster, dst)
        try:
            with cmd.client.create(tmp, overwrite=True) as writer:
                transfer.pump(getattr(sys.stdin, "buffer", sys.stdin), writer)
            cmd.client.rename(tmp, dst, overwrite=cmd.args.force)
        except BaseException:
            cluster.remove_quietly(tmp)
            raise
    except ITEM_ERRORS as exc:
        cmd.fail(dst, exc)


def cmd_get(cmd: Command):
    a = cmd.args
    if len(a.args) == 1:
        srcs, dst = a.args, "."
    else:
        *srcs, dst = a.args
    dst = _local(dst)
    sources = cluster_sources(cmd, srcs)
    if sources:
        copy_items(cmd, sources, transfer.LocalSide(), dst, a.args[-1] if len(a.args) > 1 else dst)


def cluster_sources(cmd: Command, srcs) -> list:
    """``(side, path, as typed)`` of cluster paths to copy from; a bad one is reported and
    left out."""
    cluster = transfer.ClusterSide(cmd.client)
    sources = []
    for raw in srcs:
        try:
            sources.append((cluster, user_path(raw), raw))
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)
    return sources


def cmd_cp(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs SRC... DST")
    *srcs, dst_raw = a.args
    local = transfer.LocalSide()
    cluster = None

    def side_and_path(text):
        nonlocal cluster
        is_local, path = split_file_url(text)
        if is_local:
            return local, path
        if cluster is None:
            cluster = transfer.ClusterSide(cmd.client)
        return cluster, user_path(path)

    try:
        dst_side, dst = side_and_path(dst_raw)
    except ITEM_ERRORS as exc:
        cmd.fail(dst_raw, exc)
        return
    sources = []
    for raw in srcs:
        try:
            side, path = side_and_path(raw)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)
            continue
        if side.local and dst_side.local:
            raise UsageError(f"{raw} and {dst_raw} are both local; use cp(1) for that")
        sources.append((side, path, raw))
    if sources:
        copy_items(cmd, sources, dst_side, dst, dst_raw)


# --------------------------------------------------------------------------- namespace

def cmd_mv(cmd: Command):
    a = cmd.args
    if len(a.args) < 2:
        raise UsageError("needs SRC... DST")
    *srcs, dst_raw = a.args
    for raw in a.args:
        if split_file_url(raw)[0]:
            raise UsageError(f"mv works inside the cluster; for {raw} use cp and rm")
    client = cmd.client
    try:
        dst = user_path(dst_raw)
        try:
            dst_st = client.get_file_status(dst)
        except FileNotFound:
            dst_st = None
        into = dst_st is not None and dst_st.type == "dir"
        if len(srcs) > 1 and not into:
            what = "does not exist" if dst_st is None else "is not a directory"
            raise NotDirectory(f"{dst}: {what}; moving several sources needs a directory target")
    except ITEM_ERRORS as exc:
        cmd.fail(dst_raw, exc)
        return
    for raw in srcs:
        try:
            src = user_path(raw)
            if src == "/":
                raise InvalidArgument("/: cannot move the root")
            target = paths.join(dst, paths.basename(src)) if into else dst
            if target == src:
                continue
            client.rename(src, target, overwrite=a.force)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_rm(cmd: Command):
    """HDFS ``rm``: into the caller's trash when the cluster keeps one (``trash_interval``),
    unless ``-skipTrash`` or the path is in a trash already."""
    a = cmd.args
    client = cmd.client
    use_trash = client.trash_interval > 0 and not a.skip_trash
    for raw in a.paths:
        try:
            path = user_path(raw)
            if use_trash:
                st = client.get_file_status(path)
                if st.type == "dir" and not a.recursive:
                    raise IsDirectory("is a directory (use -r to remove it and everything in it)")
                try:
                    moved = client.move_to_trash(path)
                except (InvalidArgument, PermissionDenied) as exc:
                    raise type(exc)(f"cannot move to the trash: {exc}; use -skipTrash to "
                                    f"delete at once") from None
                if moved is not None:
                    cmd.out(f"Moved: '{path}' to trash at: {moved}")
                    continue
            client.delete(path, recursive=a.recursive)
        except FileNotFound as exc:
            if not a.force:
                cmd.fail(raw, exc)
        except DirectoryNotEmpty:
            cmd.fail(raw, DirectoryNotEmpty(
                "directory not empty (use -r to delete it and everything in it)"))
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_expunge(cmd: Command):
    done = cmd.client.expunge(immediate=cmd.args.immediate)
    if done["checkpoint"]:
        cmd.out(f"Created trash checkpoint: {done['checkpoint']}")
    for name in done["deleted"]:
        cmd.out(f"Deleted trash checkpoint: {name}")


def require_parent_dir(client, path: str, hint: str) -> None:
    parent = paths.parent(path)
    try:
        st = client.get_file_status(parent)
    except FileNotFound:
        raise FileNotFound(f"{path}: parent directory {parent} does not exist{hint}") from None
    if st.type != "dir":
        raise NotDirectory(f"{path}: parent {parent} is not a directory")


def cmd_mkdir(cmd: Command):
    a = cmd.args
    permission = parse_mode(a.mode) if a.mode else 0o755
    for raw in a.paths:
        try:
            path = user_path(raw)
            if not a.parents:
                if cmd.client.exists(path):
                    raise FileExists(f"{path}: file exists")
                require_parent_dir(cmd.client, path, " (use -p to create parents)")
            else:
                try:
                    st = cmd.client.get_file_status(path)
                except FileNotFound:
                    st = None
                if st is not None and st.type != "dir":
                    raise FileExists(f"{path}: exists and is not a directory")
            cmd.client.mkdirs(path, permission=permission)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_touch(cmd: Command):
    for raw in cmd.args.paths:
        try:
            path = user_path(raw)
            try:
                cmd.client.get_file_status(path)
            except FileNotFound:
                require_parent_dir(cmd.client, path, "")
                with cmd.client.create(path, overwrite=False):
                    pass
                continue
            now = time.time_ns()
            cmd.client.set_times(path, mtime_ns=now, atime_ns=now)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def targets(cmd: Command, path: str, recursive: bool):
    """``(path, status)`` of ``path`` and, with ``recursive``, of everything below it."""
    st = cmd.client.get_file_status(path)
    yield path, st
    if recursive and st.type == "dir":
        yield from walk(cmd.client, path)


def cmd_chmod(cmd: Command):
    a = cmd.args
    change = parse_mode_change(a.mode)
    for raw in a.paths:
        try:
            for path, st in targets(cmd, user_path(raw), a.recursive):
                if st.type == "symlink":  # HDFS: a link has no permission of its own
                    continue
                mode = change.apply(st.mode, st.type == "dir")
                if mode != st.mode & 0o7777 or change.octal is not None:
                    cmd.client.set_permission(path, mode)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_chown(cmd: Command):
    a = cmd.args
    owner, group = parse_owner(a.owner)
    for raw in a.paths:
        try:
            for path, _ in targets(cmd, user_path(raw), a.recursive):
                cmd.client.set_owner(path, owner=owner, group=group)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def cmd_setrep(cmd: Command):
    a = cmd.args
    try:
        replication = int(a.replication)
        if replication < 1:
            raise ValueError
    except ValueError:
        raise UsageError(f"invalid replication {a.replication!r}: expected a positive integer") from None
    for raw in a.paths:
        try:
            path = user_path(raw)
            st = cmd.client.get_file_status(path)
            files = [path] if st.type == "file" else \
                [p for p, s in walk(cmd.client, path) if s.type == "file"]
            for file_path in files:
                cmd.client.set_replication(file_path, replication)
                cmd.out(f"Replication {replication} set: {file_path}")
            if a.wait:
                from .replwait import wait_replication
                for file_path in files:
                    wait_replication(cmd, file_path, replication, timeout=a.timeout)
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


# --------------------------------------------------------------------------- usage

DU_HEADER = ("SIZE", "DISK_SPACE_CONSUMED_WITH_ALL_REPLICAS", "FULL_PATH_NAME")


def cmd_du(cmd: Command):
    a = cmd.args
    size = human_size if a.human else str
    if a.header:
        cmd.out("  ".join(DU_HEADER))
    for raw in a.paths or ["/"]:
        try:
            path = user_path(raw)
            st = cmd.client.get_file_status(path)
            if a.summary or st.type != "dir":
                items = [(path, st)]
            else:
                items = [(paths.join(path, s.name), s) for s in cmd.client.iter_status(path)]
            rows = []
            for item_path, item in items:
                if item.type == "dir":
                    summary = cmd.client.content_summary(item_path)
                    length, consumed = summary["length"], summary["space_consumed"]
                else:
                    length = item.length
                    consumed = item.length * max(item.replication, 1)
                rows.append((size(length), size(consumed), item_path))
            # columns as hdfs dfs -du: left-aligned, two spaces apart (under -v's header)
            w0 = max([len(r[0]) for r in rows] + [len(DU_HEADER[0]) if a.header else 0])
            w1 = max([len(r[1]) for r in rows] + [len(DU_HEADER[1]) if a.header else 0])
            for r in rows:
                cmd.out(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}")
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)


def _percent(part, whole) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "0%"


def cmd_df(cmd: Command):
    for raw in cmd.args.paths:  # every PATH is on the one cluster: one line for all of them
        try:
            cmd.client.get_file_status(user_path(raw))
        except ITEM_ERRORS as exc:
            cmd.fail(raw, exc)
    if cmd.args.paths and cmd.status:
        return
    r = cmd.client.report()
    size = human_size if cmd.args.human else str
    for line in format_table(
            ["Filesystem", "Size", "Used", "Available", "Use%"],
            [[f"leasefs://{cmd.meta_address}", size(r["capacity"]), size(r["used"]),
              size(r["remaining"]), _percent(r["used"], r["capacity"])]]):
        cmd.out(line)


def format_report(r: dict, meta_address: str) -> list[str]:
    """``hdfs dfsadmin -report`` style text of ``Client.report()``."""

    def sized(n):
        return f"{n} ({human_size(n)})" if n >= 1024 else str(n)
    sm = r.get("safemode") or {}
    lines = [
        f"Metadata server: {meta_address}",
        f"Configured capacity: {sized(r['capacity'])}",
        f"Used: {sized(r['used'])} ({_percent(r['used'], r['capacity'])})",
        f"Remaining: {sized(r['remaining'])}",
        f"Files: {r.get('files', 0)}",
        f"Blocks: {r.get('blocks', 0)}",
        f"Under-replicated blocks: {r.get('under_replicated', 0)}",
        f"Corrupt blocks: {r.get('corrupt', 0)}",
        f"Missing blocks: {r.get('missing', 0)}",
        f"Blocks pending deletion: {r.get('pending_deletion', 0)}",
        f"Blocks queued for replication: {(r.get('replication') or {}).get('queued', 0)}"
        f" ({(r.get('replication') or {}).get('pending', 0)} copies under way)",
        f"Decommissioning / decommissioned block servers: {r.get('decommissioning', 0)} / "
        f"{r.get('decommissioned', 0)}",
        f"Safe mode: {'ON' if sm.get('on') else 'OFF'}"
        + (f" ({_safemode_reason(sm)})" if sm.get("on") and _safemode_reason(sm) else ""),
        f"Last checkpoint: {format_checkpoint(r.get('checkpoint'))}",
        f"HA: {format_ha(r.get('ha'))}",
        "",
    ]
    for title, nodes in (("Live block servers", r.get("live_nodes", [])),
                         ("Dead block servers", r.get("dead_nodes", []))):
        lines.append(f"{title} ({len(nodes)}):")
        if nodes:
            rows = [[n.get("node_id", "?"), n.get("address", "?"), human_size(n.get("capacity", 0)),
                     human_size(n.get("used", 0)), human_size(n.get("remaining", 0)),
                     n.get("blocks", 0), f"{n.get('last_heartbeat_age', 0):.1f}s"]
                    for n in nodes]
            lines.extend("  " + line for line in format_table(
                ["node", "address", "capacity", "used", "remaining", "blocks", "heartbeat"],
                rows, align="<<>>>>>"))
            for n in nodes:
                if n.get("clock_warning"):
                    skew = float(n.get("clock_skew", 0))
                    lines.append(f"  warning: {n.get('node_id', '?')}'s clock is "
                                 f"{abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} "
                                 f"the metadata server's: synchronize the clocks (NTP)")
        lines.append("")
    return lines[:-1]


def format_ha(ha: dict | None) -> str:
    """The answering server's HA role (``report``'s ``ha``, a ``fs.hastatus.HAStatus``)."""
    if not ha or ha.get("mode", "none") == "none":
        return "none (one metadata server)"
    return (f"{ha.get('role')} (node {ha.get('node_id') or '?'}, epoch {ha.get('epoch', 0)}, "
            f"applied txid {ha.get('applied_txid', 0)}, lag {float(ha.get('lag', 0)):.3f}s)")


def cmd_report(cmd: Command):
    r = cmd.client.report()
    if cmd.args.json:
        cmd.out(json.dumps(r, indent=2, sort_keys=True, default=str))
        return
    for line in format_report(r, cmd.meta_address):
        cmd.out(line)


def _safemode_reason(state: dict) -> str:
    """The server's explanation without a repeated "Safe mode is ON." opening."""
    reason = " ".join(str(state.get("reason") or "").split())
    if reason.lower().startswith("safe mode is on"):
        reason = reason[len("safe mode is on"):].lstrip(" .:;")
    if not reason and state.get("manual"):
        reason = "entered manually"
    return reason


def _safemode_line(state: dict) -> str:
    if not state.get("on"):
        return "Safe mode is OFF"
    reason = _safemode_reason(state)
    return "Safe mode is ON" + (f" ({reason})" if reason else "")


def cmd_safemode(cmd: Command):
    a = cmd.args
    if a.action == "wait":
        deadline = time.monotonic() + a.timeout
        while True:
            state = cmd.client.safemode("get")
            if not state.get("on"):
                break
            if time.monotonic() > deadline:
                cmd.error(f"leasefs safemode: still on after {a.timeout:g} s: "
                          f"{state.get('reason') or 'no reason given'}")
                return
            time.sleep(0.5)
    else:
        state = cmd.client.safemode(a.action)
    cmd.out(_safemode_line(state))


# --------------------------------------------------------------------------- parsers

def register(sub, common) -> None:
    """Add every shell command to the ``leasefs`` subcommand parser."""
    p = command_parser(sub, "ls", common, "list directories (-l long format, -R recursive)")
    p.add_argument("-l", dest="long", action="store_true", help="long format: mode, replication, "
                   "owner, group, size, mtime, name")
    p.add_argument("-R", dest="recursive", action="store_true", help="list subdirectories recursively")
    p.add_argument("-h", dest="human", action="store_true", help="human-readable sizes")
    p.add_argument("-d", dest="directory", action="store_true", help="list directories themselves")
    p.add_argument("-t", dest="by_time", action="store_true",
                   help="sort by modification time, newest first")
    p.add_argument("-S", dest="by_size", action="store_true", help="sort by size, largest first")
    p.add_argument("-r", dest="reverse", action="store_true", help="reverse the sort order")
    p.add_argument("-u", dest="atime", action="store_true",
                   help="show (and with -t sort by) the access time instead of the modification "
                        "time")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.set_defaults(func=cmd_ls)

    p = command_parser(sub, "stat", common, "show every field of a file or directory status",
                description="leasefs stat [--format FORMAT] PATH...  or, as hdfs dfs -stat, "
                            "leasefs stat FORMAT PATH...\n(a first argument with a % code is "
                            "the format)\n\nexamples:\n  leasefs stat /data/f\n"
                            "  leasefs stat \"%n %b %r\" /data/f",
                usage="leasefs stat [options] [FORMAT] PATH...")
    # argparse %-formats help texts, and this one is made of % codes
    p.add_argument("--format", "-c", default=None, help=STAT_FORMAT_HELP.replace("%", "%%"))
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_stat)

    p = command_parser(sub, "cat", common, "write files to stdout")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_cat)

    copy_help = ("-f overwrites existing files; directories are copied recursively; "
                 "a progress bar shows on a terminal for large copies (--progress forces it)")
    p = command_parser(sub, "put", common, "copy local files or directories into the cluster",
                description="leasefs put LOCAL... DST  ('-' as LOCAL reads stdin)\n" + copy_help,
                usage="leasefs put [options] LOCAL... DST")
    p.add_argument("-f", dest="force", action="store_true", help="overwrite existing files")
    p.add_argument("-p", dest="preserve", action="store_true", help=PRESERVE_HELP)
    p.add_argument("--progress", action="store_true", help="always show a progress bar")
    p.add_argument("--replication", type=int, default=None, help="replication of new files")
    p.add_argument("--block-size", default=None, help="block size of new files (e.g. 64M)")
    p.add_argument("args", nargs="+", metavar="PATH", help="LOCAL... DST")
    p.set_defaults(func=cmd_put)

    p = command_parser(sub, "get", common, "copy cluster files or directories to the local disk",
                description="leasefs get SRC... LOCALDST  (LOCALDST defaults to .)\n" + copy_help,
                usage="leasefs get [options] SRC... [LOCALDST]")
    p.add_argument("-f", dest="force", action="store_true", help="overwrite existing files")
    p.add_argument("-p", dest="preserve", action="store_true", help=PRESERVE_HELP)
    p.add_argument("--progress", action="store_true", help="always show a progress bar")
    p.add_argument("args", nargs="+", metavar="PATH", help="SRC... [LOCALDST] (default .)")
    p.add_argument("--verify", "-checksum", dest="verify", action="store_true",
                   help="compare each copy's checksum with its source's afterwards")
    p.set_defaults(func=cmd_get)

    p = command_parser(sub, "cp", common, "copy within the cluster, or to/from file: URLs",
                description="leasefs cp SRC... DST\nCluster paths are plain (/a/b); local ones "
                            "are written file:///abs/path or file:relative/path.\n" + copy_help,
                usage="leasefs cp [options] SRC... DST")
    p.add_argument("-f", dest="force", action="store_true", help="overwrite existing files")
    p.add_argument("-p", dest="preserve", action="store_true", help=PRESERVE_HELP)
    p.add_argument("--progress", action="store_true", help="always show a progress bar")
    p.add_argument("--replication", type=int, default=None, help="replication of new files")
    p.add_argument("--block-size", default=None, help="block size of new files (e.g. 64M)")
    p.add_argument("args", nargs="+", metavar="PATH", help="SRC... DST")
    p.add_argument("--verify", "-checksum", dest="verify", action="store_true",
                   help="compare each copy's checksum with its source's afterwards")
    p.set_defaults(func=cmd_cp)

    p = command_parser(sub, "mv", common, "rename or move into a directory",
                description="leasefs mv SRC... DST  (into DST when it is a directory)",
                usage="leasefs mv [options] SRC... DST")
    p.add_argument("-f", dest="force", action="store_true",
                   help="replace an existing target file (or empty directory)")
    p.add_argument("args", nargs="+", metavar="PATH", help="SRC... DST")
    p.set_defaults(func=cmd_mv)

    p = command_parser(sub, "rm", common, "delete files and directories")
    p.add_argument("-r", "-R", dest="recursive", action="store_true", help="delete directories "
                   "and their contents")
    p.add_argument("-f", dest="force", action="store_true", help="ignore missing paths")
    p.add_argument("-skipTrash", "--skip-trash", dest="skip_trash", action="store_true",
                   help="delete at once instead of moving into /user/NAME/.Trash")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_rm)

    p = command_parser(sub, "expunge", common, "empty the trash: checkpoint it and delete "
                "checkpoints older than the cluster's trash_interval (hdfs dfs -expunge)",
                description="leasefs expunge [-immediate]\nThe caller's /user/NAME/.Trash/Current "
                            "becomes a checkpoint; checkpoints older than trash_interval\n"
                            "minutes are deleted (-immediate: all of the trash now). The "
                            "metadata server does the same\nby itself every "
                            "trash_checkpoint_interval.\n\nexample:\n  leasefs rm -r /data/old"
                            "   # moved to /user/$USER/.Trash/Current/data/old\n"
                            "  leasefs expunge -immediate")
    p.add_argument("-immediate", "--immediate", dest="immediate", action="store_true",
                   help="delete everything in the trash now")
    p.set_defaults(func=cmd_expunge)

    p = command_parser(sub, "mkdir", common, "create directories")
    p.add_argument("-p", dest="parents", action="store_true", help="create missing parents, "
                   "no error if it exists")
    p.add_argument("-m", dest="mode", default=None, help="permission: octal or symbolic from a=rwx (default 755)")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_mkdir)

    p = command_parser(sub, "touch", common, "create empty files or set their times to now")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_touch)

    p = command_parser(sub, "du", common, "space used by files and directories",
                description="leasefs du [-s] [-h] [-v] [-x] PATH...\nColumns as hdfs dfs -du: "
                            "SIZE DISK_SPACE_CONSUMED_WITH_ALL_REPLICAS FULL_PATH_NAME")
    p.add_argument("-s", dest="summary", action="store_true", help="one total per argument")
    p.add_argument("-h", dest="human", action="store_true", help="human-readable sizes")
    p.add_argument("-v", dest="header", action="store_true", help="print a header line")
    p.add_argument("-x", dest="no_snapshots", action="store_true",
                   help="exclude snapshots (hdfs dfs -du -x): leasefs has none, so the same")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.set_defaults(func=cmd_du)

    p = command_parser(sub, "df", common, "cluster capacity and usage",
                description="leasefs df [-h] [PATH...]: the cluster's capacity and usage (every "
                            "PATH is on that one cluster;\na missing PATH is an error)")
    p.add_argument("-h", dest="human", action="store_true", help="human-readable sizes")
    p.add_argument("paths", nargs="*", metavar="PATH")
    p.set_defaults(func=cmd_df)

    p = command_parser(sub, "setrep", common, "change the replication of files (all files below a "
                "directory)")
    p.add_argument("-R", dest="recursive", action="store_true",
                   help="accepted for hdfs compatibility; directories are always recursive")
    p.add_argument("-w", dest="wait", action="store_true",
                   help="wait until every block has N replicas (progress on stderr)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds -w waits per file before failing (default 600)")
    p.add_argument("replication", metavar="N")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_setrep)

    p = command_parser(sub, "chmod", common, "change permissions (octal or symbolic MODE)",
                description="change permissions (octal or symbolic MODE)\n\nexamples:\n"
                            "  leasefs chmod 750 /data\n"
                            "  leasefs chmod -R u+rwX,g+rX,o= /data   # X: dirs and executables\n"
                            "  leasefs chmod +t /tmp                  # sticky bit\n"
                            "A clause without u/g/o/a applies to all (no umask), as HDFS.")
    p.add_argument("-R", dest="recursive", action="store_true", help="also everything below")
    p.add_argument("mode", metavar="MODE")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_chmod)

    p = command_parser(sub, "chown", common, "change owner and/or group (OWNER[:GROUP] or :GROUP)")
    p.add_argument("-R", dest="recursive", action="store_true", help="also everything below")
    p.add_argument("owner", metavar="OWNER[:GROUP]")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.set_defaults(func=cmd_chown)

    p = command_parser(sub, "tail", common, "the last bytes of a file (default 1K)")
    p.add_argument("-c", dest="bytes", default="1024", help="bytes to show (e.g. 100, 4K)")
    p.add_argument("-f", dest="follow", action="store_true", help="keep printing appended data")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between -f polls")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(func=cmd_tail)

    p = command_parser(sub, "report", common, "cluster report: capacity, blocks, block servers")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)

    p = command_parser(sub, "safemode", common, "get, enter, leave or wait for safe mode")
    p.add_argument("action", choices=["get", "enter", "leave", "wait"])
    p.add_argument("--timeout", type=float, default=300.0, help="seconds 'wait' waits")
    p.set_defaults(func=cmd_safemode)
