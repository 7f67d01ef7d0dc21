"""The ``leasefs`` shell tools: parsing/formatting rules, then every command run as a real
``python -m tools`` subprocess against a real cluster of subprocesses (``ProcessCluster``).

What is checked is what a user sees: stdout text, the one-line error on stderr, exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fs.client import FileStatus
from tools import formatting as F
from tools.common import error_line
from fs.errors import DirectoryNotEmpty, FileNotFound

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- pure rules

def _status(**kw) -> FileStatus:
    base = dict(name="f", path="/f", ino=5, type="file", mode=0o644, owner="alice",
                group="staff", mtime_ns=1_700_000_000 * 10**9, atime_ns=1_700_000_000 * 10**9,
                ctime_ns=0, length=0, replication=3, block_size=128 << 20, symlink=None,
                under_construction=False, children=0)
    base.update(kw)
    return FileStatus(**base)


def test_mode_string_matches_ls():
    assert F.mode_string("dir", 0o755) == "drwxr-xr-x"
    assert F.mode_string("file", 0o640) == "-rw-r-----"
    assert F.mode_string("file", 0o000) == "----------"
    assert F.mode_string("dir", 0o1777) == "drwxrwxrwt"
    assert F.mode_string("dir", 0o1770) == "drwxrwx--T"
    assert F.mode_string("symlink", 0o777) == "lrwxrwxrwx"
    assert F.mode_string("file", 0o4755) == "-rwsr-xr-x"


def test_sizes_human_and_parsed():
    assert F.human_size(0) == "0"
    assert F.human_size(1023) == "1023"
    assert F.human_size(1024) == "1 K"
    assert F.human_size(1536) == "1.5 K"
    assert F.human_size(256 << 20) == "256 M"
    assert F.human_size(3 * (1 << 30) + (1 << 29)) == "3.5 G"
    assert F.parse_size("4096") == 4096
    assert F.parse_size("64K") == 64 << 10
    assert F.parse_size("256m") == 256 << 20
    assert F.parse_size("1GiB") == 1 << 30
    assert F.parse_size("1.5M") == 3 << 19
    for bad in ("", "M", "12Q", "-1", "1 2"):
        with pytest.raises(F.UsageError):
            F.parse_size(bad)


def test_modes_owners_settings_urls_parse_or_refuse():
    assert F.parse_mode("755") == 0o755
    assert F.parse_mode("0644") == 0o644
    assert F.parse_mode("1777") == 0o1777
    assert F.parse_mode("u+x") == 0o777   # symbolic: from a=rwx (tests/test_shell_hdfs.py)
    for bad in ("9z", "888", "u+z", "", "07777"):
        with pytest.raises(F.UsageError, match="invalid mode"):
            F.parse_mode(bad)
    assert F.parse_owner("bob") == ("bob", None)
    assert F.parse_owner("bob:dev") == ("bob", "dev")
    assert F.parse_owner(":dev") == (None, "dev")
    assert F.parse_owner("bob:") == ("bob", None)
    for bad in (":", "", "bo b", "a:b c"):
        with pytest.raises(F.UsageError):
            F.parse_owner(bad)
    assert F.parse_settings(["heartbeat_interval=0.2", "rpc-retry-seconds=1"]) == \
        {"heartbeat_interval": "0.2", "rpc_retry_seconds": "1"}
    with pytest.raises(F.UsageError, match="KEY=VALUE"):
        F.parse_settings(["oops"])
    assert F.split_file_url("file:///abs/x") == (True, "/abs/x")
    assert F.split_file_url("file:rel/x") == (True, "rel/x")
    assert F.split_file_url("/cluster/x") == (False, "/cluster/x")
    with pytest.raises(F.UsageError):
        F.split_file_url("file://host/x")


def test_ls_long_lines_are_aligned_columns():
    entries = [
        _status(name="dir", type="dir", mode=0o755, length=0, replication=0),
        _status(name="big.bin", length=123456789, replication=3),
        _status(name="s", length=7, replication=1, owner="bob", group="g"),
        _status(name="ln", type="symlink", mode=0o777, symlink="/target"),
    ]
    lines = F.ls_long_lines(entries)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(1_700_000_000))
    assert lines[0] == f"drwxr-xr-x - alice staff         0 {when} dir"
    assert lines[1] == f"-rw-r--r-- 3 alice staff 123456789 {when} big.bin"
    assert lines[2] == f"-rw-r--r-- 1 bob   g             7 {when} s"
    assert lines[3].startswith("lrwxrwxrwx") and lines[3].endswith("ln -> /target")
    human = F.ls_long_lines(entries[1:2], human=True)
    assert human == [f"-rw-r--r-- 3 alice staff 117.7 M {when} big.bin"]
    assert F.ls_long_lines([]) == []


def test_stat_format_codes_and_fields():
    st = _status(name="a.txt", path="/d/a.txt", length=2048, mode=0o600, ino=42)
    out = F.stat_format("%n|%N|%F|%a|%A|%u:%g|%b|%r|%o|%i|%Y|%%", st)
    assert out == "a.txt|/d/a.txt|regular file|600|-rw-------|alice:staff|2048|3|134217728|42|" \
                  "1700000000000|%"
    with pytest.raises(F.UsageError, match="unknown code"):
        F.stat_format("%q", st)
    fields = dict(F.status_fields(st))
    assert fields["mode"] == "0600 (-rw-------)"
    assert fields["length"] == "2048 (2 K)"
    assert fields["ino"] == "42" and fields["path"] == "/d/a.txt"
    assert "children" not in fields and "symlink" not in fields


def test_table_and_error_line():
    lines = F.format_table(["name", "n"], [["a", 1], ["long-name", 22]])
    assert lines == ["name        n", "---------  --", "a           1", "long-name  22"]
    assert error_line("cat", "/x", FileNotFound("/x: no such file or directory")) == \
        "leasefs cat: /x: no such file or directory"
    assert error_line("rm", "/d", DirectoryNotEmpty("directory not empty")) == \
        "leasefs rm: /d: directory not empty"
    assert error_line("put", None, FileNotFoundError(2, "No such file or directory", "l.txt")) \
        == "leasefs put: l.txt: No such file or directory"


def _subcommands(parser, prefix=()):
    """Every command path of the parser (``("cluster", "up")``, ...), from argparse itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias
                    continue
                seen.add(id(sub))
                yield (*prefix, name)
                yield from _subcommands(sub, (*prefix, name))


def test_every_subcommand_help_exits_0_without_traceback(capsys):
    from tools.cli import build_parser, main

    commands = list(_subcommands(build_parser()))
    assert ("stat",) in commands and ("cluster", "up") in commands and len(commands) > 30
    for command in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([*command, "--help"])
        out, err = capsys.readouterr()
        assert exit_info.value.code in (0, None), (command, err)
        assert "Traceback" not in out + err, (command, err)
        assert out.startswith("usage: leasefs " + " ".join(command)), (command, out[:200])


def test_command_table_is_what_the_modules_register():
    """``--help`` and the choice of module to import come from ``tools.cli.COMMANDS``: each
    command there is registered by the module it names, with that one-line help."""
    import importlib

    from tools.cli import COMMANDS, Parser, common_options

    found = {}
    common = common_options()
    for module in dict.fromkeys(m for m, _ in COMMANDS.values()):
        sub = Parser(prog="leasefs").add_subparsers(dest="command")
        importlib.import_module(f"tools.{module}").register(sub, common)
        helps = {a.dest: " ".join((a.help or "").split()) for a in sub._choices_actions}
        found.update({name: (module, helps[name]) for name in sub.choices})
    stale = {name: found.get(name) for name in found.keys() | COMMANDS.keys()
             if found.get(name) != COMMANDS.get(name)}
    assert not stale, f"tools/cli.py COMMANDS differs from the modules; make these entries: {stale}"


def _imported_by(*args, env=None, tmp_path) -> set[str]:
    """The modules a ``python -m tools ARGS`` process has imported when it exits (what
    ``python -X importtime`` shows, including the modules ``importlib`` loads)."""
    out = tmp_path / "modules.json"
    code = ("import atexit, json, runpy, sys\n"
            f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps(list(sys.modules))))\n"
            f"sys.argv = ['leasefs', *{list(args)!r}]\n"
            "runpy.run_module('tools', run_name='__main__', alter_sys=True)\n")
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    return set(json.loads(out.read_text()))


def test_start_up_imports_only_what_the_command_needs(tmp_path):
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path), "LEASEFS_META": "127.0.0.1:1"}
    # the command packages: none is imported unless its command runs
    heavy = {"trio", "msgpack", "crc32c", "fs.client", "fs.rpc", "tools.admin", "tools.bench",
             "tools.cluster", "tools.shell", "tools.shell.core", "importlib.metadata"}
    shell = {"tools.shell", "tools.shell.core"}

    def servers(modules):   # nothing of the servers, the mount or the Spark source, ever
        return {m for m in modules if m.split(".")[0] in ("meta", "storage", "mount",
                                                          "spark_connector", "pyspark")}

    for args, own in ((["--help"], set()), (["ls", "--help"], shell),
                      (["dfs", "-help", "du"], shell), (["commands", "--help"], set())):
        loaded = _imported_by(*args, env=env, tmp_path=tmp_path)
        assert "tools.cli" in loaded and own <= loaded, args
        assert not loaded & (heavy - own), (args, loaded & (heavy - own))
        assert not servers(loaded), (args, servers(loaded))
    # a namespace call needs the RPC client, never the data path or other commands' modules
    loaded = _imported_by("ls", "/", env=env, tmp_path=tmp_path)
    assert {"tools.shell.core", "fs.client", "trio"} <= loaded
    assert not loaded & {"crc32c", "fs.streams", "fs.dataconn", "fs.checksum", "fs.rpcserver",
                         "tomllib", "tools.admin", "tools.bench", "tools.cluster"}, loaded
    assert not servers(loaded), servers(loaded)


# --------------------------------------------------------------------------- subprocess runs

def leasefs(*args, env=None, input=None, timeout=60, cwd=None):
    """Run ``python -m tools ARGS`` and return the CompletedProcess (bytes)."""
    return subprocess.run([sys.executable, "-m", "tools", *map(str, args)], env=env,
                          input=input, capture_output=True, timeout=timeout, cwd=cwd)


def check_ok(proc):
    assert proc.returncode == 0, (proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout.decode()


def check_fails(proc, *fragments, status=1):
    """Exit ``status`` and exactly one stderr line (no traceback) containing ``fragments``."""
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == status, (proc.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_usage_errors_exit_2_without_a_cluster(tmp_path):
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path), "LEASEFS_META": "127.0.0.1:1"}
    check_fails(leasefs("ls", "--bogus", env=env), "leasefs ls:", "--bogus", status=2)
    check_fails(leasefs("chmod", "8x", "/a", env=env), "leasefs chmod:", "invalid mode", status=2)
    check_fails(leasefs("chown", "a b", "/a", env=env), "leasefs chown:", "invalid owner", status=2)
    check_fails(leasefs("setrep", "zero", "/a", env=env), "leasefs setrep:", "replication",
                status=2)
    check_fails(leasefs("ls", "--set", "no_such_setting=1", "/", env=env), "no_such_setting",
                status=2)
    check_fails(leasefs("cp", "file:a", "file:b", env=env), "both local", status=2)
    check_fails(leasefs("cluster", env=env), "leasefs cluster", status=2)


def test_unreachable_cluster_is_one_clean_line(tmp_path):
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
    env.pop("LEASEFS_META", None)
    started = time.monotonic()
    proc = leasefs("ls", "--meta", "127.0.0.1:1", "--set", "rpc_retry_seconds=1", "/a", "/b",
                   env=env)
    line = check_fails(proc, "leasefs ls:", "127.0.0.1:1")
    assert "cluster" in line  # points at the likely cause
    assert time.monotonic() - started < 20  # one retry budget, not one per path


def test_stopped_cluster_is_said_at_once(tmp_path):
    """Nothing listens at the address (a stopped cluster): one line at once, not a silent
    wait of rpc_retry_seconds (30 s by default)."""
    import socket

    with socket.socket() as probe:   # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "LEASEFS_HOME": str(tmp_path), "LEASEFS_META": f"127.0.0.1:{port}"}
    for args in (["ls", "/"], ["fsck", "/"], ["dfsadmin", "-report"]):
        started = time.monotonic()
        proc = leasefs(*args, env=env)
        took = time.monotonic() - started
        check_fails(proc, f"leasefs {args[0]}", f"cannot reach 127.0.0.1:{port}: nothing listens",
                    "leasefs cluster status")
        assert took < 8, (args, took)   # a process start, not a retry budget
    started = time.monotonic()
    proc = leasefs("ls", "--meta", f"127.0.0.1:{port},127.0.0.1:{port + 1}", "/", env=env)
    check_fails(proc, f"cannot reach any of 127.0.0.1:{port},127.0.0.1:{port + 1}: nothing "
                      "listens there")
    assert time.monotonic() - started < 8


def test_what_is_retried_is_said_on_stderr(tmp_path):
    """A server that takes connections and drops them is retried (that is transient): the
    command says so at once on stderr, then fails with one line when the budget is out."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def drop_all():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=drop_all, daemon=True).start()
    try:
        env = {**os.environ, "LEASEFS_HOME": str(tmp_path)}
        proc = leasefs("ls", "--meta", f"127.0.0.1:{port}", "--set", "rpc_retry_seconds=2",
                       "/", env=env)
    finally:
        listener.close()
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr.decode(), lines
    # each cause once (closed, or reset mid-hello), then the one line the command ends with
    notices, last = lines[:-1], lines[-1]
    assert notices and len(notices) == len(set(notices)) <= 3, lines
    assert all(line.startswith("leasefs ls: ") and f"127.0.0.1:{port}" in line and
               line.endswith(" s") and "; retrying for up to " in line for line in notices), lines
    assert last.startswith("leasefs ls: ") and "retrying" not in last, lines


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from harness import ProcessCluster

    base = tmp_path_factory.mktemp("cli-cluster")
    c = ProcessCluster(base, n_storage=3, settings={"block_size": 1 << 20}).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def env(cluster):
    return cluster.env


@pytest.mark.slow
def test_mkdir_ls_and_ls_long(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/cli/ls/sub/deeper", env=env))
    check_ok(leasefs("put", "-", "/cli/ls/hello.txt", env=env, input=b"hello world\n"))
    assert check_ok(leasefs("ls", "/cli/ls", env=env)).splitlines() == ["hello.txt", "sub"]
    long = check_ok(leasefs("ls", "-l", "/cli/ls", env=env)).splitlines()
    assert len(long) == 2
    assert re.match(r"^-rw-r--r-- \d+ \S+ \S+ +12 \d{4}-\d\d-\d\d \d\d:\d\d hello\.txt$", long[0]), long
    assert re.match(r"^drwxr-xr-x - \S+ \S+ +0 \d{4}-\d\d-\d\d \d\d:\d\d sub$", long[1]), long
    assert long[0].index(" 12 ") < long[0].index("hello") and len(long[0].split()[4]) == 2
    rec = check_ok(leasefs("ls", "-R", "/cli/ls", env=env)).splitlines()
    assert rec == ["/cli/ls/hello.txt", "/cli/ls/sub", "/cli/ls/sub/deeper"]
    # a file argument lists itself; relative and sloppy paths are normalised
    assert check_ok(leasefs("ls", "cli//ls/./sub/../hello.txt", env=env)).strip() == \
        "/cli/ls/hello.txt"
    check_fails(leasefs("ls", "/cli/nope", env=env), "leasefs ls: /cli/nope:")
    # mkdir without -p: missing parent and existing target are errors
    check_fails(leasefs("mkdir", "/cli/ls/a/b", env=env), "leasefs mkdir: /cli/ls/a/b:", "-p")
    check_fails(leasefs("mkdir", "/cli/ls/sub", env=env), "leasefs mkdir: /cli/ls/sub:", "exists")
    check_ok(leasefs("mkdir", "/cli/ls/a", env=env))
    check_fails(leasefs("mkdir", "-p", "/cli/ls/hello.txt/x", env=env), "leasefs mkdir:")


@pytest.mark.slow
def test_stat_cat_tail_touch(cluster, env):
    check_ok(leasefs("put", "-", "/cli/st/data.txt", env=env, input=b"0123456789" * 10))
    out = check_ok(leasefs("stat", "/cli/st/data.txt", env=env))
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["type"].strip() == "file"
    assert fields["length"].strip() == "100"
    assert fields["path"].strip() == "/cli/st/data.txt"
    assert fields["mode"].strip() == "0644 (-rw-r--r--)"
    for name in ("ino", "owner", "group", "replication", "block_size", "mtime_ns", "atime_ns"):
        assert name in fields
    assert check_ok(leasefs("stat", "--format", "%n %b %F %a", "/cli/st/data.txt", env=env)) \
        == "data.txt 100 regular file 644\n"
    assert check_ok(leasefs("cat", "/cli/st/data.txt", "/cli/st/data.txt", env=env)) == \
        "0123456789" * 20
    assert check_ok(leasefs("tail", "-c", "15", "/cli/st/data.txt", env=env)) == "567890123456789"
    check_fails(leasefs("cat", "/cli/st/missing", env=env), "leasefs cat: /cli/st/missing:")
    check_fails(leasefs("cat", "/cli/st", env=env), "leasefs cat: /cli/st:", "directory")
    check_fails(leasefs("tail", "/cli/st/missing", env=env), "leasefs tail: /cli/st/missing:")
    # touch: creates an empty file, then moves mtime forward
    check_ok(leasefs("touch", "/cli/st/empty", env=env))
    before = int(check_ok(leasefs("stat", "--format", "%Y %b", "/cli/st/empty", env=env)).split()[0])
    time.sleep(0.05)   # fixed-sleep: the wall clock moves on, so the new mtime is later
    check_ok(leasefs("touch", "/cli/st/empty", env=env))
    after, length = check_ok(leasefs("stat", "--format", "%Y %b", "/cli/st/empty", env=env)).split()
    assert int(after) > before and length == "0"
    check_fails(leasefs("touch", "/cli/st/no/such/dir/f", env=env), "leasefs touch:")


def _tree(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = None
        for name in filenames:
            data = (Path(dirpath) / name).read_bytes()
            out[os.path.join(rel, name)] = hashlib.sha256(data).hexdigest()
    return out


@pytest.mark.slow
def test_put_get_tree_round_trip_byte_identical(cluster, env, tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "empty-dir").mkdir()
    (src / "top.txt").write_bytes(b"top\n")
    (src / "a" / "zero").write_bytes(b"")
    (src / "a" / "b" / "big.bin").write_bytes(os.urandom(2_500_000))  # > 2 blocks of 1 MiB
    (src / "a" / "b" / "exact").write_bytes(os.urandom(1 << 20))
    check_ok(leasefs("mkdir", "-p", "/cli/rt", env=env))
    check_ok(leasefs("put", src, "/cli/rt", env=env))
    listing = check_ok(leasefs("ls", "-R", "/cli/rt/src", env=env)).splitlines()
    assert "/cli/rt/src/a/b/big.bin" in listing and "/cli/rt/src/empty-dir" in listing
    assert not any("_COPYING_" in line for line in listing)
    dst = tmp_path / "back"
    dst.mkdir()
    check_ok(leasefs("get", "/cli/rt/src", dst, env=env))
    assert _tree(dst / "src") == _tree(src)
    # again without -f: clash reported, nothing overwritten; with -f it works
    check_fails(leasefs("put", src / "top.txt", "/cli/rt/src", env=env),
                "leasefs put: /cli/rt/src/top.txt:", "exists")
    (src / "top.txt").write_bytes(b"changed\n")
    check_ok(leasefs("put", "-f", src / "top.txt", "/cli/rt/src/top.txt", env=env))
    assert check_ok(leasefs("cat", "/cli/rt/src/top.txt", env=env)) == "changed\n"
    check_fails(leasefs("get", "/cli/rt/src/top.txt", dst / "src", env=env),
                "leasefs get:", "exists")
    check_ok(leasefs("get", "-f", "/cli/rt/src/top.txt", dst / "src", env=env))
    assert (dst / "src" / "top.txt").read_bytes() == b"changed\n"
    check_fails(leasefs("put", tmp_path / "no-such-file", "/cli/rt", env=env), "leasefs put:",
                "no-such-file")
    # the target's folder must exist (on either side)
    check_fails(leasefs("put", src / "top.txt", "/cli/rt/nope/top.txt", env=env),
                "leasefs put: /cli/rt/nope/top.txt:", "parent directory /cli/rt/nope")
    check_fails(leasefs("get", "/cli/rt/src/top.txt", tmp_path / "nope" / "x", env=env),
                "leasefs get:", "parent directory")
    check_fails(leasefs("ls", "/cli/rt/nope", env=env), "leasefs ls: /cli/rt/nope:")
    # several sources need a directory target
    check_fails(leasefs("put", src / "top.txt", src / "a", "/cli/rt/src/top.txt", env=env),
                "leasefs put: /cli/rt/src/top.txt:", "directory")
    # a trailing slash means "into this directory": never a file of that name
    check_fails(leasefs("put", src / "top.txt", "/cli/rt/newdir/", env=env),
                "leasefs put: /cli/rt/newdir/:", "no such directory")
    check_fails(leasefs("ls", "/cli/rt/newdir", env=env), "no such file")
    check_fails(leasefs("put", src / "top.txt", "/cli/rt/src/top.txt/", env=env),
                "leasefs put: /cli/rt/src/top.txt/:", "not a directory")
    check_fails(leasefs("get", "/cli/rt/src/top.txt", f"{tmp_path}/nodir/", env=env),
                "leasefs get:", "no such directory")
    assert not (tmp_path / "nodir").exists()


@pytest.mark.slow
def test_cp_mv_rm(cluster, env, tmp_path):
    check_ok(leasefs("mkdir", "-p", "/cli/cp/dir", env=env))
    check_ok(leasefs("put", "-", "/cli/cp/one", env=env, input=b"one"))
    # cluster -> cluster, file and directory
    check_ok(leasefs("cp", "/cli/cp/one", "/cli/cp/dir", env=env))
    check_ok(leasefs("cp", "/cli/cp/dir", "/cli/cp/dir2", env=env))
    assert check_ok(leasefs("cat", "/cli/cp/dir2/one", env=env)) == "one"
    check_fails(leasefs("cp", "/cli/cp/dir", "/cli/cp/dir/inside", env=env), "into itself")
    # local <-> cluster with file: URLs
    local = tmp_path / "l.txt"
    local.write_bytes(b"local bytes")
    check_ok(leasefs("cp", f"file://{local}", "/cli/cp/from-local", env=env))
    assert check_ok(leasefs("cat", "/cli/cp/from-local", env=env)) == "local bytes"
    check_ok(leasefs("cp", "/cli/cp/one", "file:copied.txt", env=env, cwd=tmp_path))
    assert (tmp_path / "copied.txt").read_bytes() == b"one"
    # mv: rename, into a directory, several sources
    check_ok(leasefs("mv", "/cli/cp/from-local", "/cli/cp/renamed", env=env))
    check_ok(leasefs("mkdir", "/cli/cp/moved", env=env))
    check_ok(leasefs("mv", "/cli/cp/renamed", "/cli/cp/one", "/cli/cp/moved", env=env))
    assert check_ok(leasefs("ls", "/cli/cp/moved", env=env)).split() == ["one", "renamed"]
    check_fails(leasefs("mv", "/cli/cp/moved/one", "/cli/cp/dir", env=env),
                "leasefs mv: /cli/cp/moved/one:")  # dir/one exists and no -f
    check_fails(leasefs("mv", "/cli/cp/nothing", "/cli/cp/x", env=env), "leasefs mv: /cli/cp/nothing:")
    # rm: non-empty dir needs -r; -f ignores missing; missing without -f fails
    check_fails(leasefs("rm", "/cli/cp/dir2", env=env), "leasefs rm: /cli/cp/dir2:", "-r")
    check_ok(leasefs("rm", "-r", "/cli/cp/dir2", env=env))
    check_fails(leasefs("rm", "/cli/cp/dir2", env=env), "leasefs rm: /cli/cp/dir2:")
    check_ok(leasefs("rm", "-f", "/cli/cp/dir2", env=env))
    assert check_ok(leasefs("ls", "/cli/cp", env=env)).split() == ["dir", "moved"]


# Every path-taking command against a path of the wrong kind: (argv, the path the error line
# names, its cause). M: missing; F: a file; D: a directory; L/LD/LN: a local file/dir/nothing.
WRONG_PATHS = [
    # a missing path
    ("ls {M}", "{M}", "no such file or directory"),
    ("stat {M}", "{M}", "no such file or directory"),
    ("cat {M}", "{M}", "no such file or directory"),
    ("tail {M}", "{M}", "no such file or directory"),
    ("du {M}", "{M}", "no such file or directory"),
    ("rm {M}", "{M}", "no such file or directory"),
    ("chmod 644 {M}", "{M}", "no such file or directory"),
    ("chown bob {M}", "{M}", "no such file or directory"),
    ("setrep 2 {M}", "{M}", "no such file or directory"),
    ("truncate 0 {M}", "{M}", "no such file or directory"),
    ("recover-lease {M}", "{M}", "no such file or directory"),
    ("leases {M}", "{M}", "no such file or directory"),
    ("fsck {M}", "{M}", "no such file or directory"),
    ("fsck {MR}", "{MR}", "no such file or directory"),  # relative: said once, as typed
    ("decommission nosuch:1", "nosuch:1", "no such block server"),
    ("get {M} {LD}", "{M}", "no such file or directory"),
    ("cp {M} {D}/x", "{M}", "no such file or directory"),
    ("mv {M} {D}/x", "{M}", "no such file or directory"),
    ("touch {M}/x", "{M}/x", "parent directory {M} does not exist"),
    ("mkdir {M}/x", "{M}/x", "parent directory {M} does not exist"),
    ("put {L} {M}/x", "{M}/x", "parent directory {M} does not exist"),
    ("put {LN} {D}/x", "{LN}", "no such file or directory"),
    ("append {LN} {F}", "{LN}", "no such file or directory"),
    ("mount {LN}", "{LN}", "no such file or directory"),
    ("umount {LN}", "{LN}", "no such file or directory"),
    ("bench fuse --path {LN}", "{LN}", "no such file or directory"),
    ("meta --check-journal {LN}", "{LN}", "no such file or directory"),
    ("settings --update-readme {LN}", "{LN}", "no such file or directory"),
    # a file where a directory is expected
    ("ls {F}/x", "{F}/x", "not a directory"),
    ("stat {F}/x", "{F}/x", "not a directory"),
    ("cat {F}/x", "{F}/x", "not a directory"),
    ("tail {F}/x", "{F}/x", "not a directory"),
    ("du {F}/x", "{F}/x", "not a directory"),
    ("rm {F}/x", "{F}/x", "not a directory"),
    ("chmod 644 {F}/x", "{F}/x", "not a directory"),
    ("chown bob {F}/x", "{F}/x", "not a directory"),
    ("setrep 2 {F}/x", "{F}/x", "not a directory"),
    ("truncate 0 {F}/x", "{F}/x", "not a directory"),
    ("recover-lease {F}/x", "{F}/x", "not a directory"),
    ("leases {F}/x", "{F}/x", "not a directory"),
    ("fsck {F}/x", "{F}/x", "not a directory"),
    ("mkdir {F}/sub", "{F}/sub", "not a directory"),
    ("mkdir -p {F}/sub", "{F}/sub", "not a directory"),
    ("touch {F}/x", "{F}/x", "not a directory"),
    ("put {L} {F}/", "{F}/", "not a directory"),
    ("put {L} {F}/x", "{F}/x", "not a directory"),
    ("append {L} {F}/x", "{F}/x", "not a directory"),
    ("cp {F} {F}/x", "{F}/x", "not a directory"),
    ("mv {F} {F}/x", "{F}/x", "not a directory"),
    ("get {F}/x {LD}", "{F}/x", "not a directory"),
    ("get {F} {L}/x", "{L}/x", "not a directory"),
    ("mount {L}", "{L}", "not a directory"),
    ("bench fuse --path {L}", "{L}", "not a directory"),
    ("cluster status --home {L}", "{L}", "not a directory"),
    # a directory where a file is expected
    ("cat {D}", "{D}", "is a directory"),
    ("tail {D}", "{D}", "is a directory"),
    ("truncate 0 {D}", "{D}", "directory"),
    ("append {L} {D}", "{D}", "is a directory"),
    ("recover-lease {D}", "{D}", "is a directory"),
    ("get {D} {L}", "{L}", "exists and is not a directory"),
    ("cp {D} {F}", "{F}", "exists and is not a directory"),
    ("put {LD} {F}", "{F}", "exists and is not a directory"),
    ("mv {D} {F}", "{D}", "exists"),
]


@pytest.mark.slow
def test_wrong_kind_of_path_is_one_line_naming_command_path_and_cause(cluster, tmp_path,
                                                                       monkeypatch, capsys):
    from tools.cli import main

    monkeypatch.setenv("LEASEFS_META", cluster.meta_address)
    monkeypatch.setenv("LEASEFS_HOME", str(cluster.base / "home"))
    names = {"M": "/cli/wrong/missing", "MR": "cli/wrong/missing", "F": "/cli/wrong/file", "D": "/cli/wrong/dir",
             "L": str(tmp_path / "local.txt"), "LD": str(tmp_path / "localdir"),
             "LN": str(tmp_path / "nothing")}
    (tmp_path / "local.txt").write_bytes(b"local")
    (tmp_path / "localdir").mkdir()
    assert main(["mkdir", "-p", names["D"]]) == 0
    assert main(["put", names["L"], names["F"]]) == 0
    capsys.readouterr()
    problems = []
    for argv, path, cause in WRONG_PATHS:
        argv, path, cause = (text.format(**names) for text in (argv, path, cause))
        words = argv.split()
        status = main(words)
        out, err = capsys.readouterr()
        lines = err.splitlines()
        command = " ".join(words[:2]) if words[0] in ("bench", "cluster") else words[0]
        if words[:2] == ["meta", "--check-journal"]:
            command = "meta --check-journal"
        prefix = f"leasefs {command}: {path}: "
        said_already = (f"{command}: ", f"{path}: ", f"/{path}: ")  # the cause repeating them
        if (status != 1 or len(lines) != 1 or not lines[0].startswith(prefix)
                or cause.lower() not in lines[0].lower() or "Traceback" in err
                or lines[0][len(prefix):].startswith(said_already)
                or "internal error" in err or out):
            problems.append(f"{argv!r}: status {status}, stderr {err!r}, stdout {out[:100]!r}")
    assert not problems, "\n".join(problems)
    # nothing was created by the failed commands
    assert main(["ls", "-R", "/cli/wrong"]) == 0
    assert capsys.readouterr().out.split() == [names["D"], names["F"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.txt", "localdir"]


@pytest.mark.slow
def test_chmod_chown_setrep_du_df_report_safemode(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/cli/attr/sub", env=env))
    check_ok(leasefs("put", "-", "/cli/attr/sub/f", env=env, input=b"x" * 3000))
    check_ok(leasefs("chmod", "-R", "700", "/cli/attr", env=env))
    assert check_ok(leasefs("stat", "--format", "%a", "/cli/attr/sub/f", env=env)) == "700\n"
    assert check_ok(leasefs("stat", "--format", "%A", "/cli/attr", env=env)) == "drwx------\n"
    check_fails(leasefs("chmod", "755", "/cli/attr/none", env=env), "leasefs chmod: /cli/attr/none:")
    check_ok(leasefs("chown", "-R", "carol:eng", "/cli/attr", env=env))
    assert check_ok(leasefs("stat", "--format", "%u %g", "/cli/attr/sub/f", env=env)) == "carol eng\n"
    check_ok(leasefs("chown", ":ops", "/cli/attr/sub/f", env=env))
    assert check_ok(leasefs("stat", "--format", "%u %g", "/cli/attr/sub/f", env=env)) == "carol ops\n"
    out = check_ok(leasefs("setrep", "2", "/cli/attr", env=env))
    assert out.strip() == "Replication 2 set: /cli/attr/sub/f"
    assert check_ok(leasefs("stat", "--format", "%r", "/cli/attr/sub/f", env=env)) == "2\n"
    du = check_ok(leasefs("du", "-s", "/cli/attr", env=env)).split()
    assert du == ["3000", "6000", "/cli/attr"]
    du_h = check_ok(leasefs("du", "/cli/attr", env=env)).split()
    assert du_h == ["3000", "6000", "/cli/attr/sub"]
    df = check_ok(leasefs("df", "-h", env=env)).splitlines()
    assert df[0].split() == ["Filesystem", "Size", "Used", "Available", "Use%"]
    assert df[2].startswith(f"leasefs://{cluster.meta_address}")
    report = check_ok(leasefs("report", env=env))
    assert "Live block servers (3):" in report and "Safe mode: OFF" in report
    assert check_ok(leasefs("safemode", "get", env=env)).strip() == "Safe mode is OFF"
    assert check_ok(leasefs("safemode", "enter", env=env)).startswith("Safe mode is ON")
    try:
        # safe mode is retried (said at once on stderr), then the one failure line
        proc = leasefs("mkdir", "--set", "rpc_retry_seconds=2", "/cli/attr/blocked", env=env)
        notice, last = proc.stderr.decode().splitlines()
        assert proc.returncode == 1 and "safe mode" in notice, (notice, last)
        assert notice.startswith("leasefs mkdir: ") and "; retrying for up to " in notice
        assert last.startswith("leasefs mkdir: /cli/attr/blocked:") and "safe mode" in last
    finally:
        assert check_ok(leasefs("safemode", "leave", env=env)).strip() == "Safe mode is OFF"
    check_ok(leasefs("mkdir", "/cli/attr/blocked", env=env))


@pytest.mark.slow
def test_bench_runs_against_the_cluster(cluster, env):
    out = check_ok(leasefs("bench", "write", "--size", "3M", "--replication", "1,2", "--json",
                           "--quiet", env=env))
    result = json.loads(out)
    names = [row["name"] for row in result["results"]]
    assert names == ["leasefs write r=1", "leasefs write r=2", "local disk write+fsync",
                     "loopback TCP"]
    assert result["size"] == 3 << 20
    assert all(row["mbps"] > 0 and row["seconds"] > 0 for row in result["results"])
    disk = result["results"][2]
    assert set(disk["ratios"]) == {"leasefs write r=1", "leasefs write r=2"}
    text = check_ok(leasefs("bench", "read", "--size", "2M", "--replication", "1", env=env))
    assert "leasefs read r=1" in text and "local disk read" in text and "loopback TCP" in text
    meta = json.loads(check_ok(leasefs("bench", "meta", "--cluster", "--clients", "3",
                                       "--processes", "2", "--ops", "4", "--json", "--quiet",
                                       env=env)))
    ops = meta["results"]["cluster"]
    assert list(ops) == ["create", "mkdirs", "getFileInfo", "open", "listStatus", "rename",
                         "delete"]
    assert all(v["ops"] == 12 and v["ops_per_s"] > 0 and v["p99_ms"] >= v["p50_ms"] > 0
               for v in ops.values())
    # create = create + complete: two journal records per op, sharing fsyncs at best
    assert ops["create"]["records_per_op"] == 2 and 0 < ops["create"]["fsyncs_per_op"] <= 2
    assert ops["getFileInfo"]["fsyncs_per_op"] == 0
    contended = json.loads(check_ok(leasefs("bench", "meta", "--cluster", "--clients", "2",
                                            "--ops", "3", "--contended", "--json", "--quiet",
                                            env=env)))
    assert contended["contended"] and contended["results"]["cluster"]["delete"]["ops"] == 6
    # default: private fine and global servers side by side, the ratio printed
    text = check_ok(leasefs("bench", "meta", "--clients", "2", "--ops", "3", "--op", "create",
                            "--op", "getFileInfo", "--no-local", "--quiet", env=env))
    assert "fine ops/s" in text and "global ops/s" in text and "fine/global" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:]}
    assert set(rows) == {"create", "getFileInfo"}
    check_fails(leasefs("bench", "meta", "--op", "rename", "--quiet", env=env),
                "rename needs create", status=2)
    # --compare: another version of the code (a revision checked out for the run, or a
    # source folder) beside this one, rounds alternating
    against = json.loads(check_ok(leasefs(
        "bench", "meta", "--clients", "2", "--ops", "3", "--op", "create", "--compare", "HEAD",
        "--rounds", "3", "--no-local", "--json", "--quiet", env=env, timeout=300)))
    (other, this), ratios = [k for k in against["results"] if k != "this_per_other_by_round"], \
        against["results"]["this_per_other_by_round"]
    assert this == "this" and len(other) >= 7   # the short commit id
    assert against["results"][other]["create"]["ops"] == against["results"]["this"][
        "create"]["ops"] == 6
    assert len(ratios["create"]) == 3 and all(r > 0 for r in ratios["create"])
    text = check_ok(leasefs("bench", "meta", "--clients", "2", "--ops", "3", "--op", "create",
                            "--compare", REPO, "--no-local", "--quiet", env=env, timeout=300))
    assert f"this/{REPO.name}" in text and "CPU this/other" in text
    check_fails(leasefs("bench", "meta", "--compare", "no-such-revision", "--quiet", env=env),
                "--compare no-such-revision: git rev-parse", status=2)
    check_fails(leasefs("bench", "meta", "--compare", "HEAD", "--rounds", "2", "--quiet",
                        env=env), "an odd number", status=2)
    # --prefill: the ops again after filling the namespace, with the server's CPU per op
    grown = json.loads(check_ok(leasefs("bench", "meta", "--cluster", "--clients", "2",
                                        "--ops", "2", "--op", "create", "--prefill", "3,7",
                                        "--json", "--quiet", env=env)))
    ops = grown["results"]["cluster"]
    assert list(ops) == ["create", "prefill to 3", "create @3", "prefill to 7", "create @7"]
    assert [ops[k]["ops"] for k in ops] == [4, 3, 4, 4, 4]
    assert all(v["server_cpu_us"] > 0 and v["records_per_op"] == 2 for v in ops.values())
    check_fails(leasefs("bench", "meta", "--prefill", "5,3", "--quiet", env=env),
                "increasing", status=2)
    # bench files are cleaned up
    check_fails(leasefs("ls", "/.leasefs-bench/x", env=env), "leasefs ls:")
    assert check_ok(leasefs("ls", "/.leasefs-bench", env=env)).strip() == ""


@pytest.mark.slow
def test_bench_cli_times_help_and_ls(cluster, env, tmp_path):
    out = json.loads(check_ok(leasefs("bench", "cli", "--runs", "2", "--json", "--quiet",
                                      "--compare", REPO, env=env, timeout=180)))
    rows = {(r["tree"], r["case"]): r for r in out["results"]}
    assert set(rows) == {(t, c) for t in ("this", "compare") for c in ("--help", "ls /")}
    assert all(0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in rows.values())
    text = check_ok(leasefs("bench", "cli", "--runs", "1", "--quiet", env=env, timeout=120))
    assert "leasefs ls /" in text and "median of 1 runs" in text
    check_fails(leasefs("bench", "cli", "--compare", tmp_path, env=env), "not a leasefs source",
                status=2)


@pytest.mark.slow
def test_bench_moosefs_missing_script_is_clean(cluster, env, tmp_path):
    env = {**env, "MFS_BASE": str(tmp_path / "no-peer")}
    check_fails(leasefs("bench", "meta", "--clients", "1", "--ops", "1", "--moosefs",
                        "--moosefs-script", tmp_path / "none.sh", "--quiet", env=env),
                "none.sh", "not found", status=2)


@pytest.mark.slow
def test_check_journal_reports_ok_and_corruption(cluster, env, tmp_path):
    import shutil
    # records after the first one: a bad first record then is corruption, not a torn tail
    check_ok(leasefs("mkdir", "-p", "/check-journal/a", "/check-journal/b", env=env))
    journal = tmp_path / "copy" / "journal"
    shutil.copytree(cluster.meta_dir() / "journal", journal)
    ok = leasefs("meta", "--check-journal", tmp_path / "copy")
    out = check_ok(ok)
    assert re.search(r"^OK: \d+ records, txids 1\.\.\d+$", out, re.M), out
    segment = sorted(journal.iterdir())[0]
    data = bytearray(segment.read_bytes())
    data[12] ^= 0xFF  # inside the first record's body: a bad record followed by good ones
    segment.write_bytes(bytes(data))
    line = check_fails(leasefs("meta", "--check-journal", journal), "CORRUPT", segment.name)
    assert "offset" in line


def test_design_index_links_every_design_page():
    """docs/DESIGN.md is the index of docs/design/: every page it links exists and every
    page there is linked (a page nobody can reach from the index is lost)."""
    index = (REPO / "docs" / "DESIGN.md").read_text()
    linked = set(re.findall(r"\(design/([a-z]+\.md)\)", index))
    present = {p.name for p in (REPO / "docs" / "design").glob("*.md")}
    assert linked == present, (linked, present)


def test_readme_starts_with_make_and_has_current_settings_table():
    from tools.docgen import replace_table

    readme = (REPO / "README.md").read_text()
    head = readme.splitlines()[:6]
    assert any(line.startswith("make up") for line in head)
    assert any(line.startswith("make test") for line in head)
    # the README is a first page: everything else is one link away in docs/, and every
    # page it links exists
    assert len(readme.splitlines()) < 150
    for page in re.findall(r"\(docs/([A-Z]+\.md)\)", readme):
        assert (REPO / "docs" / page).is_file(), page
    for page in ("CLUSTER", "DEPLOY", "MOUNT", "SHELL", "CLIENTS", "OPERATIONS", "SETTINGS",
                 "FIGURES", "DESIGN", "PROTOCOL", "TESTING"):
        assert f"(docs/{page}.md)" in readme, page
    settings = (REPO / "docs" / "SETTINGS.md").read_text()
    assert replace_table(settings) == settings, \
        "settings table is stale: run 'leasefs settings --update docs/SETTINGS.md'"
    assert "## Measured figures" in (REPO / "docs" / "FIGURES.md").read_text()
