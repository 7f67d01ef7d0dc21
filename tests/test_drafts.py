"""``mount.drafts.Draft`` against ``AsyncOutputStream``: the same sequence of writes,
publishes, syncs, flushes and closes on a draft and on a stream of a file each makes the
same metadata calls in the same order with the same arguments (a recording ``meta_via``
in front of the client's own), leaves the same content, and answers the same errors; a
draft promoted to a stream (past the inline limit, an hflush, too many inline stores)
goes on as the stream would have. Also: the client's renewer tracks a draft while it is
open and ``aclose`` closes it.

Real metadata server and block server, in-process on loopback (``harness``).
"""

from __future__ import annotations

import random

import pytest
import trio

from harness import inprocess_cluster

from fs.errors import AlreadyBeingCreated, InvalidArgument, LeaseFSError, ServerUnavailable
from fs.writer import INLINE_SYNCS
from mount.drafts import Draft

KiB = 1 << 10
SETTINGS = dict(inline_max=8 * KiB, block_size=64 * KiB, packet_size=16 * KiB,
                bytes_per_checksum=512, replication=1)

pytestmark = pytest.mark.timeout(120)


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def normal(value, names: dict):
    """A call's arguments with what differs between two files (path, inode, client,
    block ids and stamps) replaced by placeholders."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("path", "ino", "client_name"):
                out[key] = key.upper()
            elif key in ("id", "gs", "block_id"):
                out[key] = names.setdefault((key, item), f"{key}{len(names)}")
            else:
                out[key] = normal(item, names)
        return out
    if isinstance(value, (list, tuple)):
        return [normal(v, names) for v in value]
    return value


async def run(client, path: str, make, ops, seed: int, *, via=None, queue=False):
    """``ops`` on the writer ``make`` gives for a new file ``path``; the calls it made,
    what each op answered, and the content read back. ``queue``: the calls may also be
    taken at once (``meta_via.now``, as a lease's queue takes them) and made after the
    op, as the queue's sender would."""
    created = await client.create(path)
    status = created.created_status
    created.abort(LeaseFSError("replaced by the writer under test"))   # made no call
    writer = make(client, path, status)
    calls, names = [], {}

    async def record(method, args, **kwargs):
        calls.append((method, normal(args, names)))
        if via is not None:
            return await via(method, args, **kwargs)
        return await client.call_meta(method, args, **kwargs)

    queued = []

    def now(method, args):
        calls.append((method, normal(args, names)))
        queued.append((method, args))
        return True

    if queue:
        record.now = now
    writer.meta_via = record
    answers = []
    for n, (op, *arg) in enumerate(ops):
        try:
            if op == "write":
                got = await writer.write(payload(arg[0], seed * 100 + n))
            elif op == "close":
                got = await writer.close(**(arg[0] if arg else {}))
            elif op == "abort":
                got = writer.abort(LeaseFSError("gone"))
            else:
                got = await getattr(writer, op)()
        except LeaseFSError as exc:
            got = (type(exc).__name__, str(exc).replace(path, "PATH"))
        for method, args in queued:   # the queue's sender
            assert await client.call_meta(method, args)
        queued.clear()
        answers.append((op, got, writer.pos))
    content = None
    if writer.closed and not writer.complete_pending:
        try:
            content = await client.read_file(path)
        except LeaseFSError as exc:
            content = type(exc).__name__
    return calls, answers, content


def draft(client, path, status):
    return Draft(client, path, status)


def stream(client, path, status):
    return client.new_output(path, status)


SEQUENCES = {
    "small, published twice, closed with times": [
        ("write", 100), ("write", 200), ("publish",), ("write", 50), ("publish",),
        ("publish",), ("close", {"mtime_ns": 10**18, "atime_ns": 10**18 + 5,
                                 "permission": 0o600})],
    "empty": [("publish",), ("hsync",), ("hflush",), ("close",)],
    "empty, written nothing": [("write", 0), ("publish",), ("close",)],
    "hsync past the inline stores": [("hsync",)] + [("write", 10), ("hsync",)] * (
        INLINE_SYNCS + 1) + [("close",)],
    "publish past the inline stores": [("write", 10), ("publish",)] * (INLINE_SYNCS + 2)
    + [("close",)],
    "published inline, then past the limit": [
        ("write", 3000), ("publish",), ("write", 7000), ("publish",), ("write", 100),
        ("close",)],
    "published inline, past a packet": [
        ("write", 100), ("publish",), ("write", 20000), ("write", 50), ("close",)],
    "hflush": [("write", 5000), ("hflush",), ("write", 10), ("publish",), ("close",)],
    "exactly the limit": [("write", 8 * KiB), ("publish",), ("close",)],
    "one byte past the limit": [("write", 8 * KiB), ("write", 1), ("close",)],
    "fsynced then rewritten": [("write", 500), ("hsync",), ("rewrite",)],
    "closed twice, written after": [("write", 5), ("close",), ("close",), ("write", 1),
                                    ("publish",)],
    "aborted": [("write", 5), ("publish",), ("abort",), ("write", 1), ("hsync",),
                ("close",), ("close",)],
}


@pytest.mark.parametrize("queue", [False, True], ids=["calls", "queued"])
@pytest.mark.parametrize("name", sorted(SEQUENCES))
async def test_a_draft_makes_the_calls_a_stream_makes(tmp_path, name, queue):
    """``queued``: the draft's calls are taken at once where the lease's queue would take
    them (``now``), and are still the stream's."""
    ops = SEQUENCES[name]
    async with inprocess_cluster(tmp_path, n_storage=1, **SETTINGS) as cluster:
        async with cluster.client() as c:
            want = await run(c, "/stream", stream, ops, seed=1)
            got = await run(c, "/draft", draft, ops, seed=1, queue=queue)
    answers = [(op, getattr(a, "pos", a) if op == "rewrite" else a, pos)
               for op, a, pos in got[1]]
    wanted = [(op, getattr(a, "pos", a) if op == "rewrite" else a, pos)
              for op, a, pos in want[1]]
    assert got[0] == want[0]          # the calls, in order, with their arguments
    assert answers == wanted          # what each op answered, and the position after it
    assert got[2] == want[2]          # the content read back


async def test_a_close_the_server_missed_is_completed_later_as_a_streams(tmp_path):
    """The metadata server unreachable at the close's complete: ``complete_pending``, the
    close raised ``ServerUnavailable``; ``retry_complete`` sends the same complete (with
    the content and the times of the last close) and the file is whole."""
    ops = [("write", 700), ("publish",), ("close", {"mtime_ns": 10**18}),
           ("close", {"mtime_ns": 2 * 10**18})]
    async with inprocess_cluster(tmp_path, n_storage=1, **SETTINGS) as cluster:
        async with cluster.client() as c:
            results = {}
            for label, make in (("stream", stream), ("draft", draft)):
                down = True
                path = f"/{label}"

                async def via(method, args, **kwargs):
                    if method == "complete" and down:
                        raise ServerUnavailable("metadata server down")
                    return await c.call_meta(method, args, **kwargs)

                calls, answers, _ = await run(c, path, make, ops, seed=2, via=via)
                writers = [w for w in c.open_output_streams if w.path == path]
                assert writers == []
                results[label] = (calls, answers)
            assert results["draft"] == results["stream"]
            assert results["draft"][1][2][1][0] == "ServerUnavailable"


async def test_retry_complete_of_a_draft(tmp_path):
    async with inprocess_cluster(tmp_path, n_storage=1, **SETTINGS) as cluster:
        async with cluster.client() as c:
            created = await c.create("/f")
            created.abort(LeaseFSError("replaced"))
            d = Draft(c, "/f", created.created_status)
            down = True

            async def via(method, args, **kwargs):
                if method == "complete" and down:
                    raise ServerUnavailable("metadata server down")
                return await c.call_meta(method, args, **kwargs)

            d.meta_via = via
            await d.write(b"kept")
            with pytest.raises(ServerUnavailable):
                await d.close(mtime_ns=10**18)
            assert d.complete_pending
            with pytest.raises(ServerUnavailable):
                await d.retry_complete()
            down = False
            await d.retry_complete()
            assert not d.complete_pending
            with pytest.raises(InvalidArgument):
                await d.retry_complete()
            assert await c.read_file("/f") == b"kept"
            assert (await c.get_file_status("/f")).mtime_ns == 10**18


async def test_the_client_renews_while_a_draft_is_open_and_closes_it(tmp_path):
    """A draft is one of the client's outputs: the renewer keeps its lease past the soft
    limit (another client's create is refused, not a recovery), a promoted draft's stream
    takes its place, and the client's aclose completes both."""
    async with inprocess_cluster(tmp_path, n_storage=1, **SETTINGS, lease_soft_limit=1.0,
                                 lease_hard_limit=30.0) as cluster:
        async with cluster.client() as c, cluster.client() as other:
            d = Draft(c, "/open", (await _created(c, "/open")).created_status)
            assert c.open_output_streams == [d]
            await d.write(b"x" * 100)
            # fixed-sleep: real time past the soft limit, in which renewals must keep the
            # lease: the server's clock is real
            await trio.sleep(2.5)
            with pytest.raises(AlreadyBeingCreated):
                await other.create("/open")
            big = Draft(c, "/big", (await _created(c, "/big")).created_status)
            await big.write(b"y" * (9 * KiB))        # past the inline limit: a stream
            assert big.promoted
            outputs = c.open_output_streams
            assert d in outputs and big not in outputs and len(outputs) == 2
            await c.aclose()
            assert c.open_output_streams == []
            assert await other.read_file("/open") == b"x" * 100
            assert await other.read_file("/big") == b"y" * (9 * KiB)
            for path in ("/open", "/big"):
                assert not (await other.get_file_status(path)).under_construction


async def _created(c, path):
    """A file created by ``c`` (under its lease), its stream given up without a call: the
    writer under test takes it on."""
    created = await c.create(path)
    created.abort(LeaseFSError("replaced by the writer under test"))
    return created
