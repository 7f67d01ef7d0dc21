"""The ``hdfs dfs`` parity commands of ``leasefs`` (test, find, count, head, text, getmerge,
touchz, chgrp, symbolic chmod, the copy/move names, ls sorting, setrep -w, fsck -files, the
generated command list of docs/SHELL.md): pure rules first, then each command run as a real
``python -m tools`` subprocess against a real cluster of subprocesses.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import os
from pathlib import Path

import pytest

from test_cli import check_fails, check_ok, leasefs
from tools import formatting as F

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- pure rules

@pytest.mark.parametrize("text, mode, is_dir, expected", [
    ("755", 0o600, False, 0o755),
    ("1777", 0o755, True, 0o1777),
    ("u+x", 0o644, False, 0o744),
    ("g-w", 0o664, False, 0o644),
    ("o=r", 0o777, False, 0o774),
    ("u+x,g-w,o=r", 0o666, False, 0o744),
    ("a+X", 0o644, False, 0o644),      # a file without any execute bit stays so
    ("a+X", 0o744, False, 0o755),      # ... but gets it everywhere when one is set
    ("a+X", 0o644, True, 0o755),       # a directory always gets it
    ("+t", 0o777, True, 0o1777),
    ("o-t", 0o1777, True, 0o777),
    ("u+t", 0o755, True, 0o755),       # the sticky bit belongs to "others"
    ("=", 0o755, False, 0o000),
    ("a=", 0o1777, True, 0o000),
    ("go=", 0o755, False, 0o700),
    ("+x", 0o644, False, 0o755),       # no who: all, and no umask (as HDFS)
    ("u=rwx,g=rx,o=", 0, True, 0o750),
    ("g=u", 0o640, False, 0o660),
    ("u+x-w", 0o644, False, 0o544),
    ("ug+rw,o-rwx", 0o007, False, 0o660),
])
def test_symbolic_and_octal_modes(text, mode, is_dir, expected):
    assert F.parse_mode_change(text).apply(mode, is_dir) == expected


@pytest.mark.parametrize("bad", ["", "9", "888", "07777", "u+z", "x+r", "u+x,", ",u+x", "u",
                                 "u+s", "rwx", "u=g+x" + "q"])
def test_invalid_modes_are_usage_errors(bad):
    with pytest.raises(F.UsageError, match="invalid mode"):
        F.parse_mode_change(bad)


def test_parse_mode_for_mkdir_starts_from_a_rwx():
    assert F.parse_mode("750") == 0o750
    assert F.parse_mode("go-w") == 0o755
    assert F.parse_mode("u=rwx,go=") == 0o700


def test_count_columns_are_hdfs_ones():
    from tools.shell.count import count_line, header

    summary = {"directory_count": 3, "file_count": 2, "length": 3000, "space_consumed": 9000}
    assert header(False) == "   DIR_COUNT   FILE_COUNT       CONTENT_SIZE PATHNAME"
    assert count_line(summary, "/d") == "           3            2               3000 /d"
    assert header(True) == ("       QUOTA       REM_QUOTA     SPACE_QUOTA REM_SPACE_QUOTA "
                            "   DIR_COUNT   FILE_COUNT       CONTENT_SIZE PATHNAME")
    assert count_line(summary, "/d", quotas=True) == (
        "        none             inf            none             inf "
        "           3            2               3000 /d")
    with_quota = {**summary, "ns_quota": 10, "ds_quota": 1 << 20}
    assert count_line(with_quota, "/d", quotas=True, human=True) == (
        "          10               5             1 M        1015.2 K "
        "           3            2              2.9 K /d")
    assert count_line({**summary, "ns_quota": -1, "ds_quota": -1}, "/d", quotas=True) == \
        count_line(summary, "/d", quotas=True)


def test_ls_sort_orders():
    from test_cli import _status
    from tools.shell.core import sort_entries

    a = ("/a", _status(name="a", length=5, mtime_ns=3, atime_ns=9))
    b = ("/b", _status(name="b", length=50, mtime_ns=1, atime_ns=7))
    c = ("/c", _status(name="c", length=1, mtime_ns=2, atime_ns=8))
    names = lambda es: [p for p, _ in es]  # noqa: E731
    assert names(sort_entries([a, b, c], by_time=True)) == ["/a", "/c", "/b"]
    c_read = ("/c", _status(name="c", length=1, mtime_ns=2, atime_ns=99))
    assert names(sort_entries([a, b, c_read], by_time=True, atime=True)) == ["/c", "/a", "/b"]
    assert names(sort_entries([a, b, c], by_size=True)) == ["/b", "/a", "/c"]
    assert names(sort_entries([a, b, c], by_size=True, reverse=True)) == ["/c", "/a", "/b"]
    assert names(sort_entries([c, a, b], reverse=True)) == ["/b", "/a", "/c"]


def test_test_flags_answer_from_status_and_mode_bits():
    from test_cli import _status
    from tools.shell.testpath import answer

    f = _status(owner="alice", group="staff", mode=0o640, length=0)
    assert answer("e", f) and answer("f", f) and not answer("d", f)
    assert answer("z", f) and not answer("s", f)
    assert answer("w", f, "alice", []) and answer("r", f, "bob", ["staff"])
    assert not answer("w", f, "bob", ["staff"]) and not answer("r", f, "eve", ["other"])


def test_docs_command_list_is_current():
    from tools.cmddoc import command_rows, replace_block

    readme = (REPO / "docs" / "SHELL.md").read_text()
    assert replace_block(readme) == readme, \
        "command list is stale: run 'leasefs commands --update docs/SHELL.md'"
    names = [name for name, _ in command_rows()]
    for name in ("test", "find", "count", "getmerge", "touchz", "chgrp", "moveToLocal", "ls"):
        assert f"| `leasefs {name}` |" in readme
        assert name in names


# --------------------------------------------------------------------------- subprocess runs

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from harness import ProcessCluster

    base = tmp_path_factory.mktemp("shell-hdfs-cluster")
    c = ProcessCluster(base, n_storage=3, settings={"block_size": 1 << 20}).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def env(cluster):
    return cluster.env


@pytest.mark.slow
def test_test_command_exit_status_only(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/t/d", env=env))
    check_ok(leasefs("put", "-", "/t/full", env=env, input=b"abc"))
    check_ok(leasefs("touchz", "/t/empty", env=env))
    cases = [("-e", "/t/d", 0), ("-e", "/t/none", 1), ("-d", "/t/d", 0), ("-d", "/t/full", 1),
             ("-f", "/t/full", 0), ("-f", "/t/d", 1), ("-s", "/t/full", 0), ("-s", "/t/empty", 1),
             ("-z", "/t/empty", 0), ("-z", "/t/full", 1), ("-r", "/t/full", 0),
             ("-w", "/t/full", 0), ("-d", "/t/none", 1)]
    for flag, path, status in cases:
        proc = leasefs("test", flag, path, env=env)
        assert (proc.returncode, proc.stdout, proc.stderr) == (status, b"", b""), (flag, path)
    check_ok(leasefs("chmod", "444", "/t/full", env=env))
    assert leasefs("test", "-w", "/t/full", env=env).returncode == 1
    assert leasefs("test", "-r", "/t/full", env=env).returncode == 0
    check_fails(leasefs("test", "/t/full", env=env), "leasefs test:", status=2)
    check_fails(leasefs("test", "-e", "-d", "/t/full", env=env), "leasefs test:", status=2)


@pytest.mark.slow
def test_find_prints_full_paths(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/f/a/logs", "/f/b", env=env))
    for name in ("/f/a/x.log", "/f/a/logs/y.LOG", "/f/b/z.txt"):
        check_ok(leasefs("touchz", name, env=env))
    assert check_ok(leasefs("find", "/f", "-name", "*.log", env=env)).splitlines() == \
        ["/f/a/x.log"]
    assert check_ok(leasefs("find", "/f", "-iname", "*.log", env=env)).splitlines() == \
        ["/f/a/logs/y.LOG", "/f/a/x.log"]
    assert check_ok(leasefs("find", "/f", "-type", "d", env=env)).splitlines() == \
        ["/f", "/f/a", "/f/a/logs", "/f/b"]
    assert check_ok(leasefs("find", "/f/b", "/f/a/logs", "-type", "f", env=env)).splitlines() \
        == ["/f/b/z.txt", "/f/a/logs/y.LOG"]
    proc = leasefs("find", "/f/none", "/f/b", "-name", "z*", env=env)
    check_fails(proc, "leasefs find: /f/none:")
    assert proc.stdout.decode().splitlines() == ["/f/b/z.txt"]
    check_fails(leasefs("find", "/f", "-type", "x", env=env), "leasefs find:", status=2)


@pytest.mark.slow
def test_count_and_quota_columns(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/c/sub", env=env))
    check_ok(leasefs("put", "-", "/c/sub/f", env=env, input=b"x" * 3000))
    check_ok(leasefs("put", "-", "/c/g", env=env, input=b"y" * 100))
    out = check_ok(leasefs("count", "-v", "/c", "/c/g", env=env)).splitlines()
    assert out == ["   DIR_COUNT   FILE_COUNT       CONTENT_SIZE PATHNAME",
                   "           2            2               3100 /c",
                   "           0            1                100 /c/g"]
    out = check_ok(leasefs("count", "-q", "-h", "/c", env=env)).splitlines()
    assert out == ["        none             inf            none             inf "
                   "           2            2                3 K /c"]
    proc = leasefs("count", "/c/none", "/c", env=env)
    check_fails(proc, "leasefs count: /c/none:")
    assert len(proc.stdout.decode().splitlines()) == 1


@pytest.mark.slow
def test_head_text_getmerge(cluster, env, tmp_path):
    data = bytes(range(256)) * 20
    check_ok(leasefs("mkdir", "-p", "/r/parts", env=env))
    check_ok(leasefs("put", "-", "/r/big", env=env, input=data))
    assert leasefs("head", "/r/big", env=env).stdout == data[:1024]
    check_fails(leasefs("head", "/r/parts", env=env), "leasefs head: /r/parts:", "directory")
    check_fails(leasefs("head", "/r/none", env=env), "leasefs head: /r/none:")
    text = b"line one\nline two\n" * 50
    check_ok(leasefs("put", "-", "/r/t.gz", env=env, input=gzip.compress(text)))
    check_ok(leasefs("put", "-", "/r/t.bz2", env=env, input=bz2.compress(text)))
    check_ok(leasefs("put", "-", "/r/t.txt", env=env, input=text))
    assert leasefs("text", "/r/t.gz", "/r/t.bz2", "/r/t.txt", env=env).stdout == text * 3
    check_ok(leasefs("put", "-", "/r/bad.gz", env=env, input=b"not gzip at all"))
    check_fails(leasefs("text", "/r/bad.gz", env=env), "leasefs text: /r/bad.gz:")
    check_ok(leasefs("put", "-", "/r/t.zst", env=env, input=b"\x28\xb5\x2f\xfd"))
    if importlib.util.find_spec("zstandard") is None:
        check_fails(leasefs("text", "/r/t.zst", env=env), "leasefs text: /r/t.zst:", "zstandard")
    for name, body in (("b", b"BB"), ("a", b"AA"), ("c", b"")):
        check_ok(leasefs("put", "-", f"/r/parts/{name}", env=env, input=body))
    check_ok(leasefs("mkdir", "/r/parts/subdir", env=env))
    dst = tmp_path / "merged"
    check_ok(leasefs("getmerge", "/r/parts", dst, env=env))
    assert dst.read_bytes() == b"AABB"
    check_ok(leasefs("getmerge", "-nl", "/r/parts", "/r/t.txt", dst, env=env))
    assert dst.read_bytes() == b"AA\nBB\n\n" + text + b"\n"
    check_ok(leasefs("getmerge", "-nl", "--skip-empty-file", "/r/parts", dst, env=env))
    assert dst.read_bytes() == b"AA\nBB\n"
    check_fails(leasefs("getmerge", "/r/none", dst, env=env), "leasefs getmerge: /r/none:")
    check_fails(leasefs("getmerge", "/r/parts", env=env), "leasefs getmerge:", status=2)


@pytest.mark.slow
def test_touchz_chgrp_symbolic_chmod(cluster, env):
    check_ok(leasefs("mkdir", "-p", "/a/d/sub", env=env))
    check_ok(leasefs("touchz", "/a/d/e", env=env))
    check_ok(leasefs("touchz", "/a/d/e", env=env))   # already empty: fine, as HDFS
    check_ok(leasefs("put", "-", "/a/d/full", env=env, input=b"data"))
    check_fails(leasefs("touchz", "/a/d/full", env=env), "leasefs touchz: /a/d/full:",
                "Not a zero-length file")
    check_fails(leasefs("touchz", "/a/d", env=env), "leasefs touchz: /a/d:", "directory")
    check_fails(leasefs("touchz", "/a/none/x", env=env), "leasefs touchz: /a/none/x:")
    check_ok(leasefs("chgrp", "-R", "eng", "/a/d", env=env))
    for path in ("/a/d", "/a/d/sub", "/a/d/e"):
        assert check_ok(leasefs("stat", "-c", "%g", path, env=env)) == "eng\n"
    check_ok(leasefs("chgrp", "ops", "/a/d/e", env=env))
    assert check_ok(leasefs("stat", "-c", "%g", "/a/d/e", env=env)) == "ops\n"
    assert check_ok(leasefs("stat", "-c", "%g", "/a/d", env=env)) == "eng\n"
    check_fails(leasefs("chgrp", "eng", "/a/none", env=env), "leasefs chgrp: /a/none:")
    check_fails(leasefs("chgrp", "bad name", "/a/d", env=env), "leasefs chgrp:", status=2)
    check_ok(leasefs("chmod", "-R", "644", "/a/d", env=env))
    check_ok(leasefs("chmod", "-R", "u+rwX,g-r,o=", "/a/d", env=env))
    assert check_ok(leasefs("stat", "-c", "%a", "/a/d/sub", env=env)) == "700\n"
    assert check_ok(leasefs("stat", "-c", "%a", "/a/d/e", env=env)) == "600\n"
    check_ok(leasefs("chmod", "+t,go+rx", "/a/d", env=env))
    assert check_ok(leasefs("stat", "-c", "%A", "/a/d", env=env)) == "drwxr-xr-t\n"
    check_fails(leasefs("chmod", "u+q", "/a/d", env=env), "leasefs chmod:", "invalid mode",
                status=2)


@pytest.mark.slow
def test_copy_and_move_names(cluster, env, tmp_path):
    src = tmp_path / "up.txt"
    src.write_bytes(b"hello")
    check_ok(leasefs("mkdir", "/m", env=env))
    check_ok(leasefs("copyFromLocal", src, "/m/", env=env))
    assert src.exists()
    check_ok(leasefs("moveFromLocal", src, "/m/moved.txt", env=env))
    assert not src.exists()
    assert check_ok(leasefs("cat", "/m/moved.txt", env=env)) == "hello"
    check_ok(leasefs("copyToLocal", "/m/up.txt", tmp_path / "back.txt", env=env))
    assert (tmp_path / "back.txt").read_bytes() == b"hello"
    check_ok(leasefs("moveToLocal", "/m/moved.txt", tmp_path / "down.txt", env=env))
    assert (tmp_path / "down.txt").read_bytes() == b"hello"
    assert leasefs("test", "-e", "/m/moved.txt", env=env).returncode == 1
    # a failed copy keeps its source
    check_fails(leasefs("moveToLocal", "/m/up.txt", tmp_path / "back.txt", env=env),
                "leasefs moveToLocal:")
    assert leasefs("test", "-e", "/m/up.txt", env=env).returncode == 0
    check_fails(leasefs("moveFromLocal", tmp_path / "none", "/m/", env=env),
                "leasefs moveFromLocal:", "none")


@pytest.mark.slow
def test_ls_sorting_flags(cluster, env):
    import time
    check_ok(leasefs("mkdir", "/l", env=env))
    for name, size in (("old", 10), ("mid", 300), ("new", 20)):
        check_ok(leasefs("put", "-", f"/l/{name}", env=env, input=b"z" * size))
        # fixed-sleep: the files need distinct modification times on the wall clock
        time.sleep(0.05)
    assert check_ok(leasefs("ls", "/l", env=env)).split() == ["mid", "new", "old"]
    assert check_ok(leasefs("ls", "-t", "/l", env=env)).split() == ["new", "mid", "old"]
    assert check_ok(leasefs("ls", "-t", "-r", "/l", env=env)).split() == ["old", "mid", "new"]
    assert check_ok(leasefs("ls", "-S", "/l", env=env)).split() == ["mid", "new", "old"]
    assert check_ok(leasefs("ls", "-S", "-r", "/l", env=env)).split() == ["old", "new", "mid"]
    check_ok(leasefs("touch", "/l/old", env=env))   # atime and mtime now
    assert check_ok(leasefs("ls", "-t", "-u", "/l", env=env)).split()[0] == "old"
    long_u = check_ok(leasefs("ls", "-l", "-u", "/l/old", env=env))
    assert long_u.split()[-1] == "/l/old"


@pytest.mark.slow
def test_setrep_wait_and_fsck_files_blocks_locations(cluster, env):
    check_ok(leasefs("mkdir", "/s", env=env))
    data = b"q" * (1 << 20) + b"tail"   # two blocks at a 1 MiB block size
    check_ok(leasefs("put", "--replication", "1", "-", "/s/f", env=env, input=data))
    proc = leasefs("setrep", "-w", "3", "/s/f", env=env, timeout=120)
    assert check_ok(proc) == "Replication 3 set: /s/f\n"
    err = proc.stderr.decode()
    assert err.startswith("Waiting for /s/f ...") and err.rstrip().endswith("done")
    out = check_ok(leasefs("fsck", "/s", "-files", "-blocks", "-locations", env=env))
    lines = out.splitlines()
    assert lines[0] == f"/s/f {len(data)} bytes, replicated: replication=3, 2 block(s):  OK"
    assert lines[1].startswith("0. blk_") and f"len={1 << 20} Live_repl=3  [" in lines[1]
    assert lines[1].count("DatanodeInfoWithStorage[127.0.0.1:") == 3
    assert lines[2].startswith("1. blk_") and "len=4 Live_repl=3" in lines[2]
    assert "The filesystem under path '/s' is HEALTHY" in out
    files_only = check_ok(leasefs("fsck", "/s", "-files", env=env)).splitlines()
    assert files_only[0] == lines[0] and not files_only[1].startswith("0.")
    proc = leasefs("setrep", "-w", "--timeout", "0.1", "5", "/s/f", env=env, timeout=60)
    err = proc.stderr.decode().splitlines()   # the progress line, then the one error line
    assert proc.returncode == 1 and len(err) == 2 and err[0].startswith("Waiting for /s/f")
    assert err[1] == "leasefs setrep: /s/f: 2 of 2 block(s) still without 5 replicas after 0.1 s"
    check_fails(leasefs("fsck", "/s/none", "-files", env=env), "leasefs fsck: /s/none:")


def test_commands_update_readme_rewrites_a_stale_block(tmp_path):
    from tools.cmddoc import BEGIN, END

    readme = tmp_path / "R.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold\n{END}\nprose\n")
    proc = leasefs("commands", "--update-readme", readme)
    assert proc.returncode == 0 and b"updated" in proc.stdout
    text = readme.read_text()
    assert "| `leasefs getmerge` |" in text and "\nold\n" not in text and text.endswith("prose\n")
    assert b"already current" in leasefs("commands", "--update-readme", readme).stdout
    (tmp_path / "plain.md").write_text("no markers\n")
    check_fails(leasefs("commands", "--update-readme", tmp_path / "plain.md"), "no '")
    assert os.path.exists(readme)


def test_getmerge_sources_are_files_in_name_order_whatever_the_listing_order():
    from types import SimpleNamespace

    from test_cli import _status
    from tools.shell.read import merge_sources

    listing = [_status(name="b"), _status(name="sub", type="dir"), _status(name="a")]
    client = SimpleNamespace(get_file_status=lambda p: _status(type="dir" if p == "/d" else "file"),
                             iter_status=lambda p: iter(listing))
    cmd = SimpleNamespace(client=client)
    assert merge_sources(cmd, "/d") == ["/d/a", "/d/b"]
    assert merge_sources(cmd, "/d/a") == ["/d/a"]


# --------------------------------------------------------------------------- as HDFS users type it

@pytest.mark.slow
def test_dfs_fs_prefix_and_hdfs_verb_names(cluster, env, tmp_path):
    check_ok(leasefs("mkdir", "-p", "/h/sub", env=env))
    check_ok(leasefs("put", "-", "/h/f", env=env, input=b"x" * 3000))
    plain = check_ok(leasefs("ls", "-l", "/h", env=env))
    assert check_ok(leasefs("dfs", "-ls", "-l", "/h", env=env)) == plain
    assert check_ok(leasefs("fs", "-ls", "-l", "/h", env=env)) == plain
    assert check_ok(leasefs("dfs", "-du", "-s", "-h", "/h", env=env)).split() == \
        ["2.9", "K", "8.8", "K", "/h"]
    local = tmp_path / "more.txt"
    local.write_bytes(b"one\n")
    check_ok(leasefs("appendToFile", local, "/h/log", env=env))      # created when missing
    check_ok(leasefs("dfs", "-appendToFile", "-", "/h/log", env=env, input=b"two\n"))
    assert check_ok(leasefs("dfs", "-cat", "/h/log", env=env)) == "one\ntwo\n"
    assert check_ok(leasefs("--version", env=env)).startswith("leasefs ")
    assert check_ok(leasefs("dfs", "-help", "ls", env=env)).startswith("usage: leasefs ls")
    # what leasefs has under another name is named; what it lacks is said
    check_fails(leasefs("recoverLease", "/h/f", env=env), "recoverLease",
                "leasefs recover-lease PATH", status=2)
    check_fails(leasefs("dfs", "-lsr", "/h", env=env), "leasefs ls -R", status=2)
    check_fails(leasefs("dfs", "-getfacl", "/h", env=env), "-getfacl", "no ACLs", status=2)
    check_fails(leasefs("dfs", "-createSnapshot", "/h", env=env), "no snapshots", status=2)
    check_fails(leasefs("dfs", "-nosuchverb", "/h", env=env), "unknown HDFS verb -nosuchverb",
                status=2)
    check_fails(leasefs("dfs", env=env), "leasefs dfs -VERB", status=2)


@pytest.mark.slow
def test_single_dash_options_as_hdfs_spells_them(cluster, env, tmp_path):
    check_ok(leasefs("mkdir", "-p", "/o/d/e", env=env))
    check_ok(leasefs("put", "-", "/o/d/f", env=env, input=b"hello\n"))
    # stat: HDFS's order, the format first
    assert check_ok(leasefs("stat", "%n %b %r %F", "/o/d/f", "/o/d", env=env)) == \
        "f 6 3 regular file\nd 0 0 directory\n"
    assert check_ok(leasefs("dfs", "-stat", "%a|%u", "/o/d/f", env=env)).count("|") == 1
    # du -v: HDFS's header and left-aligned columns
    assert check_ok(leasefs("du", "-v", "/o/d", env=env)).splitlines() == [
        "SIZE  DISK_SPACE_CONSUMED_WITH_ALL_REPLICAS  FULL_PATH_NAME",
        "0     0                                      /o/d/e",
        "6     18                                     /o/d/f"]
    assert check_ok(leasefs("du", "-s", "-x", "/o", env=env)) == "6  18  /o\n"
    # count -u (quota columns only), -e (the policy column, every file replicated)
    assert check_ok(leasefs("count", "-u", "-v", "/o", env=env)).splitlines() == [
        "       QUOTA       REM_QUOTA     SPACE_QUOTA REM_SPACE_QUOTA PATHNAME",
        "        none             inf            none             inf /o"]
    assert check_ok(leasefs("count", "-e", "-v", "/o", env=env)).splitlines() == [
        "   DIR_COUNT   FILE_COUNT       CONTENT_SIZE ERASURECODING_POLICY PATHNAME",
        "           3            1                  6           Replicated /o"]
    # checksum -v: the block size after the checksum
    plain = check_ok(leasefs("checksum", "/o/d/f", env=env)).rstrip("\n")
    assert check_ok(leasefs("dfs", "-checksum", "-v", "/o/d/f", env=env)) == \
        f"{plain}\tBlockSize={1 << 20}\n"
    # df PATH: the cluster's line; a missing PATH is an error
    df = check_ok(leasefs("df", "/o", env=env)).splitlines()
    assert df[0].split() == ["Filesystem", "Size", "Used", "Available", "Use%"]
    assert df[2].startswith(f"leasefs://{cluster.meta_address} ")
    check_fails(leasefs("df", "/o/none", env=env), "leasefs df: /o/none:")
    # fsck -openforwrite and -list-corruptfileblocks
    out = check_ok(leasefs("fsck", "/o", "-openforwrite", env=env))
    assert out.rstrip().endswith("The filesystem under path '/o' is HEALTHY")
    assert check_ok(leasefs("fsck", "/o", "-list-corruptfileblocks", env=env)) == \
        "The filesystem under path '/o' has no CORRUPT files\n"
    # rmdir: only empty folders, as hdfs dfs -rmdir
    check_ok(leasefs("rmdir", "/o/d/e", env=env))
    assert leasefs("test", "-e", "/o/d/e", env=env).returncode == 1
    check_fails(leasefs("rmdir", "/o/d", env=env), "leasefs rmdir: /o/d:", "not empty")
    check_fails(leasefs("dfs", "-rmdir", "/o/d/f", env=env), "leasefs rmdir: /o/d/f:",
                "not a directory")
    check_ok(leasefs("rmdir", "--ignore-fail-on-non-empty", "/o/d", env=env))
    assert leasefs("test", "-d", "/o/d", env=env).returncode == 0


def test_corrupt_file_blocks_lines():
    from tools.admin.maintenance import corrupt_file_blocks

    answer = {"path": "/x", "files": [
        {"path": "/x/a", "blocks": [{"id": 7, "gs": 1001, "status": "HEALTHY"},
                                    {"id": 8, "gs": 1002, "status": "CORRUPT"}]},
        {"path": "/x/b", "blocks": [{"id": 9, "gs": 1003, "status": "MISSING"}]},
        {"path": "/x/c", "blocks": [{"id": 10, "gs": 1004, "status": "UNDER_REPLICATED"}]}]}
    assert corrupt_file_blocks(answer) == [
        "The list of corrupt files under path '/x' are:", "blk_8_1002\t/x/a", "blk_9_1003\t/x/b",
        "The filesystem under path '/x' has 2 CORRUPT files"]


@pytest.mark.slow
def test_full_uris_name_the_cluster(cluster, env, tmp_path):
    check_ok(leasefs("mkdir", "-p", "/u/a", env=env))
    address = cluster.meta_address
    assert check_ok(leasefs("ls", f"leasefs://{address}/u", env=env)) == "a\n"
    assert check_ok(leasefs("ls", "leasefs:///u", env=env)) == "a\n"
    check_ok(leasefs("dfs", "-mkdir", f"leasefs://{address}/u/b", env=env))
    assert check_ok(leasefs("ls", "/u", env=env)).split() == ["a", "b"]
    # another cluster than the configured one is refused, naming both
    check_fails(leasefs("ls", "leasefs://127.0.0.1:1/u", env=env),
                "leasefs://127.0.0.1:1", "another cluster", address, status=2)
    check_fails(leasefs("ls", "hdfs://nn:8020/u", env=env), "hdfs://", status=2)
    # nothing configured: the URI's authority is the metadata server
    bare = {k: v for k, v in env.items() if k != "LEASEFS_META"}
    bare["LEASEFS_HOME"] = str(tmp_path / "no-cluster-here")
    assert check_ok(leasefs("ls", f"leasefs://{address}/u", env=bare)).split() == ["a", "b"]


@pytest.mark.slow
def test_put_cp_get_p_preserve_times_owner_mode(cluster, env, tmp_path):
    src = tmp_path / "tree"
    (src / "in").mkdir(parents=True)
    (src / "in" / "x").write_bytes(b"data")
    os.chmod(src / "in" / "x", 0o640)
    os.chmod(src / "in", 0o750)
    old = 1_500_000_000
    for path in (src / "in" / "x", src / "in", src):
        os.utime(path, (old, old))
    check_ok(leasefs("mkdir", "/p", env=env))
    check_ok(leasefs("put", "-p", src, "/p/t", env=env))
    fmt = "%a %Y %u"
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    for path, mode in (("/p/t/in/x", "640"), ("/p/t/in", "750")):
        assert check_ok(leasefs("stat", fmt, path, env=env)) == f"{mode} {old * 1000} {me}\n"
    check_ok(leasefs("put", src / "in" / "x", "/p/plain", env=env))   # without -p: now, 644
    assert check_ok(leasefs("stat", "%a", "/p/plain", env=env)) == "644\n"
    check_ok(leasefs("cp", "-p", "/p/t/in/x", "/p/copy", env=env))
    assert check_ok(leasefs("stat", fmt, "/p/copy", env=env)) == f"640 {old * 1000} {me}\n"
    back = tmp_path / "back"
    check_ok(leasefs("get", "-p", "/p/t", back, env=env))
    st = os.stat(back / "in" / "x")
    assert (st.st_mode & 0o7777, int(st.st_mtime)) == (0o640, old)
    assert (os.stat(back / "in").st_mode & 0o7777, int(os.stat(back / "in").st_mtime)) == \
        (0o750, old)
    check_ok(leasefs("copyFromLocal", "-p", src / "in" / "x", "/p/cfl", env=env))
    assert check_ok(leasefs("stat", "%a", "/p/cfl", env=env)) == "640\n"


@pytest.mark.slow
def test_dfsadmin_verbs_run_their_leasefs_commands(cluster, env):
    report = check_ok(leasefs("dfsadmin", "-report", env=env))
    labels = lambda text: [line.split(":")[0] for line in text.splitlines()]  # noqa: E731
    assert labels(report) == labels(check_ok(leasefs("report", env=env)))   # numbers move
    assert "Live block servers (3):" in report
    topology = check_ok(leasefs("dfsadmin", "-printTopology", env=env)).splitlines()
    assert topology[0] == "Rack: /default-rack" and len(topology) == 5 and topology[-1] == ""
    assert all(line.startswith("   127.0.0.1:") and line.endswith(") In Service")
               for line in topology[1:4])
    assert check_ok(leasefs("dfsadmin", "-safemode", "get", env=env)) == "Safe mode is OFF\n"
    assert check_ok(leasefs("dfsadmin", "-safemode", "enter", env=env)).startswith(
        "Safe mode is ON")
    try:
        saved = check_ok(leasefs("dfsadmin", "-saveNamespace", env=env))
        assert saved.startswith("Save namespace successful: checkpoint txid ")
    finally:
        assert check_ok(leasefs("dfsadmin", "-safemode", "leave", env=env)) == \
            "Safe mode is OFF\n"
    assert check_ok(leasefs("dfsadmin", "-safemode", "wait", env=env)) == "Safe mode is OFF\n"
    assert check_ok(leasefs("dfsadmin", "-refreshNodes", env=env)) == \
        check_ok(leasefs("decommission", "--status", env=env))
    check_ok(leasefs("mkdir", "-p", "/lo", env=env))
    assert check_ok(leasefs("dfsadmin", "-listOpenFiles", "-path", "/lo", env=env)) == \
        "no files open for writing below /lo\n"
    check_fails(leasefs("dfsadmin", "-report", "/x", env=env), "takes no PATH", status=2)
    check_fails(leasefs("dfsadmin", "-setQuota", "5", env=env), "needs at least one PATH",
                status=2)
    check_fails(leasefs("dfsadmin", "-safemode", "sideways", env=env), "invalid choice",
                status=2)
