"""The mount's directory lease holder on its own (``mount/dirleases.py``): what it decides
locally under a grant, with the grant's answer as the server gives it (the mount tests in
tests/test_dirlease_mount.py run it against real servers)."""

from __future__ import annotations

import trio

from fs import dirops
from mount.dirleases import DirLeaseHolder

FOLDER, FILE, SUB = 10, 11, 12


def status(ino: int, name: str, kind: str, mode: int) -> dict:
    """A status in its wire form (``FileStatus.from_wire`` reads it)."""
    return {"name": name, "path": f"/d/{name}" if name else "/d", "ino": ino, "type": kind,
            "mode": mode, "owner": "root", "group": "root", "mtime_ns": 1, "atime_ns": 1,
            "ctime_ns": 1, "length": 0, "replication": 1, "block_size": 1 << 20}


def grant(epoch: int, **extra) -> dict:
    return {"epoch": epoch, "attrs": status(FOLDER, "", "dir", 0o755),
            "entries": [status(FILE, "f", "file", 0o644), status(SUB, "sub", "dir", 0o755)],
            "inos": [0, 0], **extra}


def holder() -> DirLeaseHolder:
    paths = {FOLDER: "/d", FILE: "/d/f", SUB: "/d/sub"}
    return DirLeaseHolder(object(), paths.get, lambda ino: False)


def test_attributes_are_set_locally_only_when_the_grant_says_its_server_applies_them():
    """A grant listing ``setattr`` among its ``changes``: chmod and utimens of a closed
    file are answered from the lease and queued as one change, a chown to the same owner
    changes nothing, a chown to another owner is left to a call. A grant from a server
    that does not list it (an older one, which would refuse the whole batch): nothing is
    decided locally."""
    async def main():
        old = holder()
        old.adopt(FOLDER, grant(5))
        assert old.set_attrs(FILE, mode=0o600) is None
        assert old.pending == 0

        new = holder()
        new.adopt(FOLDER, grant(6, changes=list(dirops.KINDS)))
        after = new.set_attrs(FILE, mode=0o600, mtime_ns=7)
        assert (after.mode, after.mtime_ns, after.atime_ns) == (0o600, 7, 1)
        assert after.ctime_ns > 1
        assert new.pending == 1
        assert new.set_attrs(FILE, owner="root", group="root").mode == 0o600
        assert new.pending == 1
        assert new.set_attrs(FILE, owner="alice") is None
        assert new.set_attrs(SUB, mode=0o700) is None   # a folder not held here
        queued = new._queue[0]
        assert isinstance(queued, dirops.SetAttr)
        assert (queued.dir, queued.epoch, queued.name, queued.ino, queued.permission,
                queued.owner, queued.mtime_ns) == (FOLDER, 6, "f", FILE, 0o600, None, 7)
        assert dirops.from_wire(queued.to_wire()) == queued

    trio.run(main)
