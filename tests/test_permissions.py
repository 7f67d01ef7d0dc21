"""Permission enforcement on the metadata server (HDFS FSPermissionChecker semantics).

The table test drives every checked operation through real clients (``AsyncClient`` with an
explicit ``user=``/``groups=``) against one in-process cluster: each case builds its own
subtree as the superuser, runs the operation as a caller who must be refused (EACCES, a
message naming user, access and path, and nothing changed: same listing, same journal txid)
and then as a caller who must be let through. Further tests: superuser by supergroup and by
configured name, permissions disabled, owners of new inodes, the hello's identity (missing,
invalid), and pure unit tests of ``meta.namespace.permissions``.

The tests run as root, the metadata server's process user, so the default client is the
superuser, as in every other test file.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

import pytest
import trio

from fs import errors
from fs.framing import FramedStream
from fs.rpc import RpcClient, parse_address
from harness import inprocess_cluster
from meta.namespace import permissions as P
from meta.schema.inode import Inode

pytestmark = pytest.mark.timeout(120)

ALICE = ("alice", ["alice", "staff"])
BOB = ("bob", ["bob", "staff"])
EVE = ("eve", ["eve"])
ADMIN = ("admin", ["admin", "supergroup"])     # a superuser by group
FAST = dict(replication=1, block_size=64 << 10, bytes_per_checksum=512, packet_size=4096)


# ============================================================================ helpers
async def build(root, base: str, tree) -> None:
    """``tree``: ``(relative path, "d"|"f", mode, owner, group)``, parents first; files
    hold b"data"."""
    await root.mkdirs(base)
    for rel, kind, mode, owner, group in tree:
        path = f"{base}/{rel}"
        if kind == "d":
            await root.mkdirs(path)
        else:
            await root.write_file(path, b"data")
        await root.set_permission(path, mode)
        await root.set_owner(path, owner, group)


async def snapshot(root) -> tuple:
    """Everything observable about the namespace, as the superuser sees it."""
    out = []

    async def walk(path):
        for st in await root.list_status(path):
            out.append((st.path, st.type, st.mode, st.owner, st.group, st.length,
                        st.replication, st.mtime_ns, st.atime_ns, st.ctime_ns, st.children,
                        st.under_construction, st.symlink))
            if st.is_dir:
                await walk(st.path)
    await walk("/")
    report = await root.report()
    return tuple(out), report["journal"]["last_txid"], report["safemode"]["on"]


async def _read(c, path):
    assert await c.read_file(path) == b"data"


async def _create(c, path, **kw):
    stream = await c.create(path, **kw)
    await stream.write(b"new")
    await stream.close()


async def _append(c, path):
    stream = await c.append(path)
    await stream.write(b"more")
    await stream.close()


async def _safemode(c):
    await c.safemode("enter")
    await c.safemode("leave")


async def _gone(root, path):
    assert not await root.exists(path)


async def _owner_is(root, path, owner, group):
    st = await root.get_file_status(path)
    assert (st.owner, st.group) == (owner, group)


async def _mode_is(root, path, mode):
    assert (await root.get_file_status(path)).mode == mode


@dataclass
class Case:
    name: str
    tree: list
    op: object                    # (client, base) -> awaitable
    denied: tuple                 # identity refused
    expect: tuple                 # substrings of the message ("{b}" = the case's base)
    allowed: tuple = ALICE        # identity let through
    after: object = None          # (root client, base) -> awaitable check of the effect
    denied_op: object = None      # what the refused caller tries, when not ``op``
    denied_groups: list | None = None   # the refused caller's groups, when not its usual


D755 = ("d", "d", 0o755, "alice", "staff")
PRIV = ("p", "d", 0o700, "alice", "staff")

CASES = [
    # --- reads
    Case("getFileInfo traverses", [PRIV, ("p/f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.get_file_status(f"{b}/p/f"), EVE,
         ("access=EXECUTE", 'inode="{b}/p":alice:staff:drwx------')),
    Case("exists traverses", [PRIV, ("p/f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.exists(f"{b}/p/f"), EVE, ("access=EXECUTE", 'inode="{b}/p"')),
    Case("listStatus of a dir needs READ_EXECUTE", [("d", "d", 0o711, "alice", "staff")],
         lambda c, b: c.list_status(f"{b}/d"), EVE,
         ("access=READ_EXECUTE", 'inode="{b}/d":alice:staff:drwx--x--x')),
    Case("listStatus of a file only traverses",
         [("d", "d", 0o711, "alice", "staff"), ("d/f", "f", 0o600, "alice", "staff"),
          PRIV, ("p/f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.list_status(f"{b}/d/f"), EVE, ("access=EXECUTE", 'inode="{b}/p"'),
         allowed=EVE, denied_op=lambda c, b: c.list_status(f"{b}/p/f")),
    Case("content summary needs READ_EXECUTE on every dir",
         [D755, ("d/s", "d", 0o700, "alice", "staff"), ("d/s/f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.content_summary(f"{b}/d"), EVE,
         ("access=READ_EXECUTE", 'inode="{b}/d/s"')),
    Case("open needs READ", [("f", "f", 0o640, "alice", "staff")],
         lambda c, b: _read(c, f"{b}/f"), EVE,
         ("access=READ", 'inode="{b}/f":alice:staff:-rw-r-----'), allowed=BOB),
    Case("getBlockLocations needs READ", [("f", "f", 0o600, "alice", "staff")],
         lambda c, b: c.get_block_locations(f"{b}/f"), BOB, ("access=READ", 'inode="{b}/f"')),
    # --- creating
    Case("create needs WRITE on the parent", [D755],
         lambda c, b: _create(c, f"{b}/d/new"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _owner_is(r, f"{b}/d/new", "alice", "staff")),
    Case("create with missing parents: WRITE on the nearest ancestor", [D755],
         lambda c, b: _create(c, f"{b}/d/x/y/new"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _owner_is(r, f"{b}/d/x/y", "alice", "staff")),
    Case("create overwrite needs WRITE on the file",
         [("d", "d", 0o777, "alice", "staff"), ("d/f", "f", 0o644, "alice", "staff")],
         lambda c, b: _create(c, f"{b}/d/f", overwrite=True), BOB,
         ("access=WRITE", 'inode="{b}/d/f":alice:staff:-rw-r--r--')),
    Case("mkdirs needs WRITE on the nearest ancestor", [D755],
         lambda c, b: c.mkdirs(f"{b}/d/x/y"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _owner_is(r, f"{b}/d/x", "alice", "staff")),
    Case("mkdirs of an existing dir only traverses",
         [PRIV, ("p/d", "d", 0o700, "alice", "staff"), ("q", "d", 0o700, "alice", "staff")],
         lambda c, b: c.mkdirs(f"{b}/q"), EVE, ("access=EXECUTE", 'inode="{b}/p"'),
         allowed=BOB, denied_op=lambda c, b: c.mkdirs(f"{b}/p/d")),
    Case("symlink needs WRITE on the parent", [D755],
         lambda c, b: c.create_symlink("/elsewhere", f"{b}/d/l"), EVE,
         ("access=WRITE", 'inode="{b}/d"')),
    # --- writing existing files
    Case("append needs WRITE", [("f", "f", 0o644, "alice", "staff")],
         lambda c, b: _append(c, f"{b}/f"), EVE, ("access=WRITE", 'inode="{b}/f"')),
    Case("truncate needs WRITE", [("f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.truncate(f"{b}/f", 0), BOB, ("access=WRITE", 'inode="{b}/f"')),
    Case("recoverLease needs WRITE", [("f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.recover_lease(f"{b}/f"), EVE, ("access=WRITE", 'inode="{b}/f"')),
    Case("setReplication needs WRITE", [("f", "f", 0o664, "alice", "staff")],
         lambda c, b: c.set_replication(f"{b}/f", 2), EVE, ("access=WRITE", 'inode="{b}/f"'),
         allowed=BOB),
    Case("setTimes needs the owner or WRITE", [("f", "f", 0o664, "alice", "staff")],
         lambda c, b: c.set_times(f"{b}/f", mtime_ns=5, atime_ns=6), EVE,
         ("access=WRITE", 'inode="{b}/f"'), allowed=BOB),
    Case("setTimes by the owner of a read-only file (touch)", [("f", "f", 0o444, "alice", "staff")],
         lambda c, b: c.set_times(f"{b}/f", mtime_ns=5, atime_ns=6), BOB,
         ("access=WRITE", 'inode="{b}/f":alice:staff:-r--r--r--')),
    # --- deleting and renaming
    Case("delete needs WRITE on the parent", [D755, ("d/f", "f", 0o666, "eve", "eve")],
         lambda c, b: c.delete(f"{b}/d/f"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _gone(r, f"{b}/d/f")),
    Case("recursive delete needs ALL on every non-empty dir",
         [("d", "d", 0o777, "alice", "staff"), ("d/s", "d", 0o755, "alice", "staff"),
          ("d/s/f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.delete(f"{b}/d/s", recursive=True), BOB,
         ("access=ALL", 'inode="{b}/d/s":alice:staff:drwxr-xr-x'),
         after=lambda r, b: _gone(r, f"{b}/d/s")),
    Case("rename needs WRITE on the source parent",
         [D755, ("d/f", "f", 0o644, "alice", "staff"), ("t", "d", 0o777, "alice", "staff")],
         lambda c, b: c.rename(f"{b}/d/f", f"{b}/t/f"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _gone(r, f"{b}/d/f")),
    Case("rename needs WRITE on the destination parent",
         [("s", "d", 0o777, "alice", "staff"), ("s/f", "f", 0o644, "eve", "eve"), D755],
         lambda c, b: c.rename(f"{b}/s/f", f"{b}/d/f"), EVE, ("access=WRITE", 'inode="{b}/d"'),
         after=lambda r, b: _gone(r, f"{b}/s/f")),
    Case("sticky bit: delete only by the entry's or the dir's owner",
         [("t", "d", 0o1777, "bob", "staff"), ("t/f", "f", 0o666, "alice", "staff")],
         lambda c, b: c.delete(f"{b}/t/f"), EVE,
         ("Permission denied by sticky bit", 'path="{b}/t/f":alice:staff:-rw-rw-rw-',
          'parent="{b}/t":bob:staff:drwxrwxrwt'),
         after=lambda r, b: _gone(r, f"{b}/t/f")),
    Case("sticky bit: the directory's owner may delete",
         [("t", "d", 0o1777, "bob", "staff"), ("t/f", "f", 0o666, "alice", "staff")],
         lambda c, b: c.delete(f"{b}/t/f"), EVE, ("sticky bit",), allowed=BOB,
         after=lambda r, b: _gone(r, f"{b}/t/f")),
    Case("sticky bit: rename out of a sticky dir",
         [("t", "d", 0o1777, "bob", "staff"), ("t/f", "f", 0o666, "alice", "staff")],
         lambda c, b: c.rename(f"{b}/t/f", f"{b}/t/g"), EVE, ("sticky bit", 'path="{b}/t/f"')),
    Case("sticky bit: overwriting a destination is deleting it",
         [("s", "d", 0o777, "alice", "staff"), ("s/f", "f", 0o666, "eve", "eve"),
          ("t", "d", 0o1777, "bob", "staff"), ("t/g", "f", 0o666, "alice", "staff")],
         lambda c, b: c.rename(f"{b}/s/f", f"{b}/t/g", overwrite=True), EVE,
         ("sticky bit", 'path="{b}/t/g"'), after=lambda r, b: _gone(r, f"{b}/s/f")),
    # --- owners and modes
    Case("setPermission needs the owner", [("f", "f", 0o666, "alice", "staff")],
         lambda c, b: c.set_permission(f"{b}/f", 0o600), BOB,
         ("is not the owner", 'inode="{b}/f":alice:staff:-rw-rw-rw-')),
    Case("a writer may clear setuid/setgid (what POSIX does at a non-owner's write)",
         [("f", "f", 0o6770, "alice", "staff")],
         lambda c, b: c.set_permission(f"{b}/f", 0o770), EVE,
         ("access=WRITE", 'inode="{b}/f"'), allowed=BOB,
         after=lambda r, b: _mode_is(r, f"{b}/f", 0o770)),
    Case("any other change of a setuid file's mode stays the owner's",
         [("f", "f", 0o6770, "alice", "staff")],
         lambda c, b: c.set_permission(f"{b}/f", 0o2771), BOB, ("is not the owner",),
         allowed=ALICE, after=lambda r, b: _mode_is(r, f"{b}/f", 0o2771)),
    Case("a folder's setgid stays the owner's", [("d", "d", 0o2777, "alice", "staff")],
         lambda c, b: c.set_permission(f"{b}/d", 0o777), BOB, ("is not the owner",),
         allowed=ALICE),
    Case("chown to another user needs the superuser", [("f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.set_owner(f"{b}/f", "bob"), ALICE,
         ("is not a superuser", '"{b}/f"', "to bob"), allowed=ADMIN,
         after=lambda r, b: _owner_is(r, f"{b}/f", "bob", "staff")),
    Case("chown by a non-owner", [("f", "f", 0o644, "alice", "staff")],
         lambda c, b: c.set_owner(f"{b}/f", None, "staff"), BOB,
         ("is not the owner", 'inode="{b}/f"')),
    Case("chgrp needs membership of the new group", [("f", "f", 0o644, "alice", "alice")],
         lambda c, b: c.set_owner(f"{b}/f", None, "staff"), ALICE,
         ("does not belong to group staff", '"{b}/f"'), allowed=ALICE,
         denied_groups=["alice"],
         after=lambda r, b: _owner_is(r, f"{b}/f", "alice", "staff")),
    Case("a non-superuser cannot create for another owner", [("d", "d", 0o777, "alice", "staff")],
         lambda c, b: _create(c, f"{b}/d/f", owner="alice"), EVE,
         ('cannot create "{b}/d/f" owned by alice',), allowed=ADMIN,
         after=lambda r, b: _owner_is(r, f"{b}/d/f", "alice", "staff")),
    Case("a non-superuser cannot create with a foreign group",
         [("d", "d", 0o777, "alice", "staff")],
         lambda c, b: c.mkdirs(f"{b}/d/x", owner=None, group="staff"), EVE,
         ("does not belong to group staff", '"{b}/d/x"'),
         after=lambda r, b: _owner_is(r, f"{b}/d/x", "alice", "staff")),
    # --- admin
    Case("safemode enter/leave needs the superuser", [],
         lambda c, b: _safemode(c), ALICE, ("Superuser privilege is required", "safemode enter"),
         allowed=ADMIN),
]


@pytest.mark.cluster(n_storage=1, **FAST)
async def test_every_operation_allowed_and_denied(cluster):
    """The table: each operation refused with EACCES and an HDFS-shaped message, leaving the
    namespace and the journal untouched, then allowed for the right caller."""
    async with cluster.client() as root:
        for i, case in enumerate(CASES):
            base = f"/c{i}"
            await build(root, base, case.tree)
            user, groups = case.denied
            async with cluster.client(user=user,
                                      groups=case.denied_groups or groups) as denied:
                before = await snapshot(root)
                with pytest.raises(errors.PermissionDenied) as info:
                    await (case.denied_op or case.op)(denied, base)
                assert await snapshot(root) == before, case.name
            message = str(info.value)
            assert info.value.errno == errno.EACCES, case.name
            # HDFS: "user=alice, access=..." or "Access denied for user alice."
            assert re.search(rf"user[= ]{user}\b", message), (case.name, message)
            for part in case.expect:
                assert part.format(b=base) in message, (case.name, part, message)
            user, groups = case.allowed
            async with cluster.client(user=user, groups=groups) as allowed:
                await case.op(allowed, base)
            if case.after is not None:
                await case.after(root, base)


@pytest.mark.cluster(n_storage=1, **FAST)
async def test_superuser_by_group_and_disabled_checks_and_new_owners(cluster):
    """A member of the supergroup passes every check; new inodes belong to the caller with the
    parent's group; ``mkdirs -p`` parents too."""
    async with cluster.client() as root, \
            cluster.client(user=ADMIN[0], groups=ADMIN[1]) as admin, \
            cluster.client(user=EVE[0], groups=EVE[1]) as eve, \
            cluster.client(user=ALICE[0], groups=ALICE[1]) as alice:
        await build(root, "/home", [("alice", "d", 0o700, "alice", "staff"),
                                    ("alice/f", "f", 0o600, "alice", "staff")])
        # root dir of a new namespace: the server's user and the supergroup
        st = await root.get_file_status("/")
        assert (st.owner, st.group, st.mode) == ("root", "supergroup", 0o755)
        # eve is refused everywhere in alice's home; the supergroup member is not
        with pytest.raises(errors.PermissionDenied):
            await eve.read_file("/home/alice/f")
        assert await admin.read_file("/home/alice/f") == b"data"
        await admin.set_owner("/home/alice/f", "eve", "eve")
        await admin.delete("/home/alice", recursive=True)
        # owners of new inodes: the caller, the parent's group (not the caller's)
        await root.mkdirs("/home/alice")
        await root.set_owner("/home/alice", "alice", "staff")
        await alice.mkdirs("/home/alice/a/b/c", permission=0o750)
        await _create(alice, "/home/alice/a/b/c/f")
        for path, mode in (("/home/alice/a", 0o750 | 0o300), ("/home/alice/a/b/c", 0o750),
                           ("/home/alice/a/b/c/f", 0o644)):
            st = await root.get_file_status(path)
            assert (st.owner, st.group, st.mode) == ("alice", "staff", mode), path
        # a group the caller belongs to may be named explicitly
        await _create(alice, "/home/alice/g", group="alice")
        await _owner_is(root, "/home/alice/g", "alice", "alice")
        # the superuser may create for others (what the FUSE mount does)
        await root.mkdirs("/home/bob", owner="bob", group="bob")
        await _owner_is(root, "/home/bob", "bob", "bob")


async def test_permissions_disabled_and_superuser_by_name(tmp_path):
    """``permissions_enabled = false``: nothing is checked, owners still the caller. A
    configured ``superuser`` replaces the process user (root then is an ordinary user)."""
    async with inprocess_cluster(tmp_path / "off", n_storage=0,
                                 permissions_enabled=False) as cluster:
        async with cluster.client() as root, \
                cluster.client(user=EVE[0], groups=EVE[1]) as eve:
            await build(root, "/h", [PRIV, ("p/x", "d", 0o700, "alice", "staff")])
            assert [s.name for s in await eve.list_status("/h/p")] == ["x"]
            await eve.mkdirs("/h/p/x/mine")
            await _owner_is(root, "/h/p/x/mine", "eve", "staff")   # caller, parent's group
            await eve.mkdirs("/h/p/theirs", owner="bob", group="wheel")
            await _owner_is(root, "/h/p/theirs", "bob", "wheel")
            await eve.set_permission("/h/p", 0o777)
            await eve.set_owner("/h/p", "eve", "eve")
            await eve.delete("/h/p", recursive=True)
            assert (await eve.safemode("enter"))["on"]
            assert not (await eve.safemode("leave"))["on"]
    # root is an ordinary user here: it may act as "hdfs" only as a configured proxy
    async with inprocess_cluster(tmp_path / "named", n_storage=0, superuser="hdfs",
                                 proxy_users="root=*") as cluster:
        async with cluster.client() as root, \
                cluster.client(user="hdfs", groups=["hadoop"]) as hdfs:
            await _owner_is(hdfs, "/", "hdfs", "supergroup")
            with pytest.raises(errors.PermissionDenied, match='user=root, access=WRITE, '
                                                              'inode="/":hdfs:supergroup'):
                await root.mkdirs("/x")
            with pytest.raises(errors.PermissionDenied, match="Superuser privilege"):
                await root.safemode("enter")
            await hdfs.mkdirs("/x", permission=0o700)
            await hdfs.set_owner("/x", "alice", "staff")
            await hdfs.mkdirs("/x/y")                       # the superuser passes
            assert [s.name for s in await hdfs.list_status("/x")] == ["y"]
            with pytest.raises(errors.PermissionDenied, match='inode="/x"'):
                await root.list_status("/x")


async def test_hello_identity_missing_or_invalid(tmp_path):
    """A hello without ``user`` (an older client) is ``nobody``; a malformed identity ends
    that connection with a ProtocolError while the server keeps serving others; clients
    refuse to state a malformed identity."""
    async def raw_call(address, hello, method, args):
        host, port = parse_address(address)
        stream = FramedStream(await trio.open_tcp_stream(host, port))
        try:
            await stream.send_frame(hello)
            await stream.send_frame([1, method, args])
            return await stream.receive_frame()
        finally:
            await stream.aclose()

    # the hello's identity is believed only with security = simple (see test_user_auth)
    async with inprocess_cluster(tmp_path, n_storage=0, security="simple") as cluster:
        async with cluster.client() as root:
            await root.mkdirs("/open")
            await root.mkdirs("/closed", permission=0o700)
            old = {"hello": "leasefs", "version": 1, "client_id": "old-client"}
            call_id, ok, value = await raw_call(cluster.meta_address, old, "get_file_info",
                                                {"path": "/open"})
            assert ok and value["path"] == "/open"
            call_id, ok, value = await raw_call(cluster.meta_address, old, "mkdirs",
                                                {"path": "/closed/x"})
            assert not ok and value["type"] == "PermissionDenied"
            assert 'user=nobody, access=EXECUTE, inode="/closed"' in value["message"]
            for bad in ({"user": "x" * 300}, {"user": "a\nb"}, {"user": 7},
                        {"user": "ok", "groups": ["g"] * 65}, {"user": "ok", "groups": "g"}):
                call_id, ok, value = await raw_call(cluster.meta_address, {**old, **bad},
                                                    "get_file_info", {"path": "/"})
                assert (call_id, ok, value["type"]) == (None, False, "ProtocolError"), bad
            assert not await root.exists("/closed/x")
            assert (await root.get_file_status("/closed")).mode == 0o700
            # the identity travels on every connection of a client
            async with RpcClient(cluster.meta_address, "probe", user="carol",
                                 groups=["carol"]) as rpc:
                with pytest.raises(errors.PermissionDenied, match="user=carol"):
                    await rpc.call("list_status", {"path": "/closed"})
            # the largest identity the bounds allow fits in the hello frame
            big_groups = [f"{i:02d}" + "g" * 62 for i in range(64)]
            async with RpcClient(cluster.meta_address, "probe", user="u" * 256,
                                 groups=big_groups) as rpc:
                assert (await rpc.call("get_file_info", {"path": "/open"}))["path"] == "/open"
                with pytest.raises(errors.PermissionDenied, match="user=u{256}, access"):
                    await rpc.call("list_status", {"path": "/closed"})
        for user, groups in (("", None), ("x" * 257, None), ("ok", ["g"] * 65),
                             ("ok", ["bad\0group"]), ("ok", ["g" * 65]),
                             # more than 6144 UTF-8 bytes in all
                             ("ü" * 256, [f"{i:02d}" + "ü" * 62 for i in range(64)])):
            with pytest.raises(errors.InvalidArgument):
                RpcClient(cluster.meta_address, "probe", user=user, groups=groups)
            with pytest.raises(errors.InvalidArgument):
                cluster.client(user=user, groups=groups)


def test_default_identity_is_the_process_user():
    import grp
    import os
    import pwd

    from fs.rpc import current_groups, current_user

    assert current_user() == pwd.getpwuid(os.geteuid()).pw_name
    names = current_groups()
    assert names[0] == grp.getgrgid(os.getegid()).gr_name
    assert set(names) >= {grp.getgrgid(g).gr_name for g in os.getgroups()}
    rpc = RpcClient("127.0.0.1:1", "probe")
    assert (rpc.user, rpc.groups) == (current_user(), names)


# ============================================================================ pure checker
def inode(kind="dir", mode=0o755, owner="alice", group="staff", children=1):
    return Inode(kind, mode, owner, group, mtime=1, atime=1, ctime=1, parent=1, name="x",
                 children=children)


CHECKER = P.PermissionChecker(superuser="hdfs", supergroup="supergroup")
ALICE_C = CHECKER.caller("alice", ["alice", "staff"])
BOB_C = CHECKER.caller("bob", ["bob", "staff"])
EVE_C = CHECKER.caller("eve", ["eve"])


def denied(fn, *args, **kwargs) -> str:
    with pytest.raises(errors.PermissionDenied) as info:
        fn(*args, **kwargs)
    assert info.value.errno == errno.EACCES
    return str(info.value)


def test_mode_strings_and_exclusive_classes():
    assert P.mode_string(0o755, "dir") == "drwxr-xr-x"
    assert P.mode_string(0o640, "file") == "-rw-r-----"
    assert P.mode_string(0o1777, "dir") == "drwxrwxrwt"
    assert P.mode_string(0o1770, "dir") == "drwxrwx--T"
    # the owner is judged by the owner bits only, a group member by the group bits only
    node = inode("file", 0o077)
    assert not P.permits(ALICE_C, node, P.READ)
    assert P.permits(BOB_C, node, P.READ_WRITE) and P.permits(EVE_C, node, P.ALL)
    node = inode("file", 0o704)
    assert P.permits(ALICE_C, node, P.ALL)
    assert not P.permits(BOB_C, node, P.READ) and P.permits(EVE_C, node, P.READ)
    assert not P.permits(EVE_C, node, P.READ_WRITE)


def test_check_path_traverse_ancestor_parent_access_owner():
    root = inode(mode=0o755, owner="hdfs", group="supergroup")
    a = inode(mode=0o711)
    b = inode(mode=0o750)
    f = inode("file", 0o640)
    parts = ["a", "b", "f"]
    CHECKER.check_path(BOB_C, parts, [root, a, b, f], access=P.READ)
    assert denied(CHECKER.check_path, EVE_C, parts, [root, a, b, f]) == (
        'Permission denied: user=eve, access=EXECUTE, inode="/a/b":alice:staff:drwxr-x---')
    assert 'access=WRITE, inode="/a/b/f"' in denied(
        CHECKER.check_path, BOB_C, parts, [root, a, b, f], access=P.WRITE)
    # missing components: the nearest existing ancestor is checked
    msg = denied(CHECKER.check_path, BOB_C, ["a", "b", "x", "y"], [root, a, b], ancestor=P.WRITE)
    assert 'access=WRITE, inode="/a/b"' in msg
    CHECKER.check_path(ALICE_C, ["a", "b", "x", "y"], [root, a, b], ancestor=P.WRITE,
                       parent=P.WRITE, access=P.WRITE)   # parent and inode missing: skipped
    # root path: only the inode itself
    assert 'inode="/":hdfs:supergroup' in denied(CHECKER.check_path, ALICE_C, [], [root],
                                                  access=P.WRITE)
    assert "is not the owner" in denied(CHECKER.check_path, BOB_C, parts, [root, a, b, f],
                                        owner=True)
    CHECKER.check_path(ALICE_C, parts, [root, a, b, f], owner=True, parent=P.WRITE)
    # setTimes: the owner whatever the mode bits, anyone else by them
    CHECKER.check_path(ALICE_C, parts, [root, a, b, inode("file", 0o444)], owner_or=P.WRITE)
    CHECKER.check_path(BOB_C, parts, [root, a, b, inode("file", 0o464)], owner_or=P.WRITE)
    assert 'access=WRITE, inode="/a/b/f"' in denied(
        CHECKER.check_path, BOB_C, parts, [root, a, b, f], owner_or=P.WRITE)
    # a non-directory on the way is the namespace's NotDirectory, not a permission matter
    CHECKER.check_path(EVE_C, ["a", "f", "x"], [root, a, inode("file", 0o000)],
                       ancestor=P.WRITE)
    with pytest.raises(ValueError):
        CHECKER.check_path(EVE_C, ["a"], [root, a, b])


def test_sticky_bit_superuser_and_disabled():
    tmp = inode(mode=0o1777, owner="bob")
    f = inode("file", 0o666, owner="alice")
    root = inode(owner="hdfs")
    msg = denied(CHECKER.check_path, EVE_C, ["tmp", "f"], [root, tmp, f], parent=P.WRITE)
    assert msg.startswith("Permission denied by sticky bit: user=eve, ")
    for caller in (ALICE_C, BOB_C):          # the entry's owner, the directory's owner
        CHECKER.check_path(caller, ["tmp", "f"], [root, tmp, f], parent=P.WRITE)
    CHECKER.check_path(EVE_C, ["tmp", "g"], [root, tmp], parent=P.WRITE)   # a new name
    for caller in (CHECKER.caller("hdfs"), CHECKER.caller("x", ["supergroup"])):
        assert caller.superuser
        CHECKER.check_path(caller, ["tmp", "f"], [root, tmp, inode("file", 0)],
                           parent=P.WRITE, access=P.ALL, owner=True)
        CHECKER.check_superuser(caller, "safemode enter")
    assert "Superuser privilege is required (safemode enter)" in denied(
        CHECKER.check_superuser, EVE_C, "safemode enter")
    off = P.PermissionChecker(superuser="hdfs", supergroup="supergroup", enabled=False)
    off.check_path(EVE_C, ["tmp", "f"], [root, inode(mode=0), f], parent=P.WRITE, owner=True)
    off.check_superuser(EVE_C, "safemode enter")
    assert off.new_owner(EVE_C, "/x", "bob", "wheel") == ("bob", "wheel")


def test_sub_access_owner_rules_and_new_owner():
    paths_asked = []

    def path_of():
        paths_asked.append(1)
        return "/d/s"
    CHECKER.check_sub_access(BOB_C, inode(mode=0o700, children=0), P.ALL, path_of,
                             ignore_empty_dir=True)
    CHECKER.check_sub_access(BOB_C, inode("file", 0o000), P.ALL, path_of)
    CHECKER.check_sub_access(ALICE_C, inode(mode=0o700), P.ALL, path_of)
    assert paths_asked == []
    assert 'access=ALL, inode="/d/s"' in denied(CHECKER.check_sub_access, BOB_C,
                                                 inode(mode=0o750), P.ALL, path_of)
    assert 'access=READ_EXECUTE' in denied(CHECKER.check_sub_access, EVE_C,
                                           inode(mode=0o750, children=0), P.READ_EXECUTE, path_of)
    CHECKER.check_set_owner(ALICE_C, "/f", "alice", "staff")     # self, own group
    assert "cannot change the owner" in denied(CHECKER.check_set_owner, ALICE_C, "/f", "bob", None)
    assert "does not belong to group eve" in denied(CHECKER.check_set_owner, ALICE_C, "/f",
                                                    None, "eve")
    assert CHECKER.new_owner(ALICE_C, "/f", None, None) == ("alice", None)
    assert CHECKER.new_owner(ALICE_C, "/f", "alice", "staff") == ("alice", "staff")
    assert CHECKER.new_owner(CHECKER.caller("hdfs"), "/f", "bob", "g") == ("bob", "g")
    assert "owned by bob" in denied(CHECKER.new_owner, ALICE_C, "/f", "bob", None)
    assert "does not belong to group eve" in denied(CHECKER.new_owner, ALICE_C, "/f", None, "eve")
