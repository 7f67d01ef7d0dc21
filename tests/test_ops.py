"""The journal op registry (``meta.journal.ops``): every op's wire form is exactly what the planners
journal, so records already on disk replay unchanged and records re-encoded from their typed
op (as a standby fed the edit log will) are byte-identical; unknown and malformed records are
refused naming their txid. Pure, in memory, fast."""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import msgpack
import pytest

from fs.delegation import TokenId, TokenState
from fs.errors import InternalError
from fs.framing import packb
from fs.retry_cache import CallKey
from meta.namespace.invariants import check_namespace, check_record
from meta.journal.files import Record
from meta.journal.kv import MemoryStore
from meta.namespace.namespace import Defaults, Namespace
from meta.blocks import blocks as bm
from meta.schema import keys
from meta.journal.ops import (ABSENT, OPS, LAZY_OPS, RPC_CALL, RPC_KEPT, Effect, MalformedRecord,
                              decode, to_wire)
from meta.journal.ops_blocks import Close
from meta.journal.ops_dirleases import DirLeaseGrant, DirLeaseRefill, DirLeaseRelease
from meta.journal.ops_locks import LockHolder, LockHolderGone
from meta.leases.dirleases import StoredLease
from meta.journal.ops_namespace import Mkdir
from meta.server import MetaServer
from harness import make_test_config


class Driver:
    """Plans and applies records through a namespace, keeping each record's bytes as the
    journal writes them (``Journal.log_many``: ``packb([txid, op, args])``)."""

    def __init__(self):
        self.ns = Namespace(MemoryStore(), Defaults(delete_chunk=3, min_block_size=4096,
                                                    block_size=4096))
        self.wire: list[tuple[Record, bytes]] = []
        self.now = 1000

    def log(self, plan) -> Record:
        assert plan is not None
        op, args = to_wire(plan)
        txid = len(self.wire) + 1
        body = packb([txid, op, args])
        record = Record(txid, op, msgpack.unpackb(body, raw=False, strict_map_key=False)[2])
        assert check_record(self.ns.kv, record) == [], (op, args)
        self.ns.apply([record])
        self.wire.append((record, body))
        return record

    def tick(self) -> int:
        self.now += 1
        return self.now


def every_op() -> Driver:
    """One namespace history that journals every op of the registry (some in two forms)."""
    d = Driver()
    ns = d.ns
    d.log(ns.planner.plan_format(42, d.tick()))
    d.log(ns.planner.plan_mkdirs("/a/b", now_ns=d.tick()))
    d.log(ns.planner.plan_symlink("/a", "/a/link", now_ns=d.tick()))
    d.log(ns.quota.plan_set_quota("/a", 100, 1 << 40, now_ns=d.tick()))
    add = d.log(ns.planner.plan_create("/a/f", holder="w1", client_machine="m", replication=2,
                               block_size=4096, now_ns=d.tick()))
    f = add.args["ino"]
    d.log(ns.planner.plan_add_block(f, [], ns.ids.allocate_block_id(), ns.ids.next_genstamp(), None,
                            ["n1", "n2"], d.tick()))
    blocks = ns.view.blocks_of(f)
    d.log(ns.planner.plan_fsync("/a/f", f, blocks, 100))
    d.log(ns.planner.plan_commit(f, ns.view.blocks_of(f)[-1], 4096))
    d.log(ns.planner.plan_add_block(f, ns.view.blocks_of(f), ns.ids.allocate_block_id(), ns.ids.next_genstamp(),
                            {"num_bytes": 4096}, ["n1"], d.tick()))
    d.log(ns.planner.plan_abandon("/a/f", f, ns.view.blocks_of(f), ns.view.blocks_of(f)[-1]))
    d.log(ns.planner.plan_add_block(f, ns.view.blocks_of(f), ns.ids.allocate_block_id(), ns.ids.next_genstamp(),
                            None, ["n1"], d.tick()))
    last = ns.view.blocks_of(f)[-1]
    d.log(ns.planner.plan_close(f, last, 10, d.tick(),
                        ns.planner.close_attrs("/a/f", 5, None, 0o600)))
    d.log(ns.planner.plan_set_replication("/a/f", 3, now_ns=d.tick()))
    d.log(ns.planner.plan_set_permission("/a/f", 0o640, now_ns=d.tick()))
    d.log(ns.planner.plan_set_owner("/a/f", "u", None, now_ns=d.tick()))
    d.log(ns.planner.plan_set_times("/a/f", 7, None, now_ns=d.tick()))
    inode = ns.view.get_inode(f)
    d.log(ns.planner.plan_truncate("/a/f", f, inode, 4100, holder="w2", now_ns=d.tick()))
    block = ns.view.blocks_of(f)[-1]
    d.log(ns.planner.plan_commit_block_sync(f, block, ns.ids.next_genstamp(), 4, delete=False,
                                    close=True, now_ns=d.tick(), targets=["n1"]))
    d.log(ns.planner.plan_append(f, ns.view.get_inode(f), holder="w3", new_gs=ns.ids.next_genstamp(),
                         now_ns=d.tick()))
    d.log(ns.planner.plan_set_genstamp())
    d.log(ns.planner.plan_reassign_lease(f, "leasefs-meta"))
    d.log(ns.planner.plan_close(f, ns.view.blocks_of(f)[-1], 4, d.tick()))
    small = d.log(ns.planner.plan_create("/a/s", holder="w1", block_size=4096, now_ns=d.tick()))
    d.log(ns.planner.plan_inline(small.args["ino"], b"abc"))
    d.log(ns.planner.plan_close(small.args["ino"], None, None, d.tick(), data=b"abcd"))
    d.log(ns.planner.plan_rewrite(f, ns.view.get_inode(f), now_ns=d.tick()))
    d.log(ns.planner.plan_create("/a/s", holder="w4", overwrite=True, block_size=4096,
                         now_ns=d.tick()))
    for name in ("c1", "c2"):
        c = d.log(ns.planner.plan_create(f"/a/{name}", holder="w", block_size=4096,
                                 now_ns=d.tick())).args["ino"]
        d.log(ns.planner.plan_add_block(c, [], ns.ids.allocate_block_id(), ns.ids.next_genstamp(), None,
                                ["n1"], d.tick()))
        d.log(ns.planner.plan_close(c, ns.view.blocks_of(c)[-1], 4096, d.tick()))
    d.log(ns.concat.plan_concat("/a/c1", ["/a/c2"], now_ns=d.tick()))
    d.log(ns.renames.plan_rename("/a/c1", "/a/b/c", now_ns=d.tick()))
    d.log(ns.renames.plan_rename_many([["/a/b/c", "/a/c3"], ["/a/link", "/a/l2"]], now_ns=d.tick()))
    d.log(ns.planner.plan_mkdirs("/big/x/y/z", now_ns=d.tick()))
    assert d.log(ns.planner.plan_delete("/big", recursive=True, now_ns=d.tick())).args["detach"]
    while (plan := ns.reclaim.plan_reclaim()) is not None:
        d.log(plan)
    d.log(ns.planner.plan_delete("/a/c3", now_ns=d.tick()))
    token = TokenState(TokenId(1, "alice", "bob", 10.5, 99.0), 20.25).to_wire()
    d.log(("DELEGATION_TOKEN", token))
    d.log(("RENEW_DELEGATION_TOKEN", {"seq": 1, "expiry": 30.0}))
    d.log(("CANCEL_DELEGATION_TOKEN", {"seq": 1}))
    a = ns.view.resolve("/a")[1]
    grant = d.log(DirLeaseGrant(ino=a, holder="m1"))
    d.log(DirLeaseRelease(ino=a, holder="m1", epoch=grant.txid))
    d.log(DirLeaseGrant(ino=a, holder="m2"))   # stays
    # a grant reserving inode ids, and a holder's batched create under one of them
    first = ns.ids.allocate_inos(4)
    d.log(DirLeaseGrant(ino=ns.view.resolve("/a/b")[1], holder="m3", first_ino=first, inos=4))
    d.log(ns.planner.plan_create("/a/b/r", holder="m3", block_size=4096, now_ns=d.tick(),
                                 chosen_ino=first + 2))   # the store ends with two leases
    # lock holders: one that goes, one that stays
    d.log(LockHolder(client="m1", time=d.tick()))
    d.log(LockHolder(client="m2", time=d.tick()))
    d.log(LockHolderGone(client="m1"))
    assert ns.view.lock_holders() == ["m2"]
    # the lease reserving ids gets more (a refill)
    more = ns.ids.allocate_inos(8)
    d.log(DirLeaseRefill(ino=ns.view.resolve("/a/b")[1], holder="m3", epoch=48,
                         first_ino=more, inos=8))
    # a file opened for patches (no block reopened): one patch committed, one dropped
    p = d.log(ns.planner.plan_create("/a/p", holder="w5", block_size=4096,
                                     now_ns=d.tick())).args["ino"]
    d.log(ns.planner.plan_add_block(p, [], ns.ids.allocate_block_id(), ns.ids.next_genstamp(),
                                    None, ["n1", "n2"], d.tick()))
    d.log(ns.planner.plan_close(p, ns.view.blocks_of(p)[-1], 1000, d.tick()))
    d.log(ns.planner.plan_append(p, ns.view.get_inode(p), holder="w5", new_gs=None,
                                 now_ns=d.tick()))
    begin = d.log(ns.planner.plan_patch_begin(p, ns.view.blocks_of(p)[0]))
    d.log(ns.planner.plan_patch_block("/a/p", p, ns.view.get_inode(p), ns.view.blocks_of(p)[0],
                                      begin.args["gs"], 2000, ["n1"], last=True,
                                      now_ns=d.tick()))
    again = d.log(ns.planner.plan_patch_begin(p, ns.view.blocks_of(p)[0]))
    d.log(ns.planner.plan_patch_drop(p, ns.view.blocks_of(p)[0], again.args["gs"]))
    assert check_namespace(ns.kv) == []
    return d


def test_every_op_round_trips_to_the_bytes_the_planner_journals():
    d = every_op()
    assert {record.op for record, _ in d.wire} == set(OPS)
    for record, body in d.wire:
        op = decode(record)
        assert type(op) is OPS[record.op] and op.NAME == record.op
        assert packb([record.txid, record.op, op.to_args()]) == body, record.op
        assert type(op).from_args(op.to_args()) == op


def test_every_op_is_journaled_as_the_recorded_bytes():
    """The planners' records are the bytes recorded before they built typed ops (so the
    journal and checkpoint formats are unchanged)."""
    golden = pathlib.Path(__file__).parent / "golden" / "every_op_records.txt"
    expected = [line.split() for line in golden.read_text().splitlines()
                if not line.startswith("#")]
    got = [[str(record.txid), record.op, body.hex()] for record, body in every_op().wire]
    assert [e[:2] for e in expected] == [g[:2] for g in got]
    for want, have in zip(expected, got):
        assert have == want, want[:2]


def test_an_op_with_a_missing_or_misspelled_field_is_refused_when_built():
    """Planners build ops: a wrong field fails at the constructor, before the journal."""
    with pytest.raises(TypeError, match="'time'"):
        Mkdir(dirs=[])
    with pytest.raises(TypeError, match="'mtim'"):
        Close(ino=2, last=None, time=1, mtim=3)
    assert Close(ino=2, time=1).to_wire() == ("CLOSE", {"ino": 2, "time": 1})


def test_every_op_keeps_the_retry_cache_key_byte_for_byte():
    """The journal adds ``rpc`` (the retry-cached call) after a record's own keys, and for
    some calls ``rpc_kept`` (what a retry needs of the answer): every op keeps them in
    ``extra``, re-encodes to the same bytes and names the call and what it kept; records
    without them name none."""
    key = CallKey("client#0123456789abcdef", 17, "create")
    for record, _ in every_op().wire:
        assert decode(record).rpc_call() is None and decode(record).rpc_kept() is None
        for kept in ({}, {RPC_KEPT: [42, "file", None]}):
            body = packb([record.txid, record.op,
                          {**record.args, RPC_CALL: key.to_wire(), **kept}])
            tagged = Record(record.txid, record.op,
                            msgpack.unpackb(body, raw=False, strict_map_key=False)[2])
            op = decode(tagged)
            assert op.rpc_call() == key, record.op
            assert op.rpc_kept() == kept.get(RPC_KEPT), record.op
            assert packb([record.txid, record.op, op.to_args()]) == body, record.op


def test_replaying_the_decoded_records_rebuilds_the_same_store():
    """A replica fed the re-encoded records ends with exactly the same store."""
    d = every_op()
    replica = Namespace(MemoryStore(), d.ns.defaults)
    for record, _ in d.wire:
        args = msgpack.unpackb(packb(decode(record).to_args()), raw=False,
                               strict_map_key=False)
        replica.apply([Record(record.txid, record.op, args)])
    assert dict(replica.kv.scan(b"")) == dict(d.ns.kv.scan(b""))


def test_every_op_updates_the_servers_memory_from_its_typed_effect(tmp_path, caplog):
    """Every op's store apply returns a frozen ``Effect`` record, and its memory apply
    reads only that record's fields and its own: a metadata server applying every op
    logs no failed memory update, and after each record its blocks map, leases, token
    table and directory lease table are what the store holds."""
    d = every_op()
    ns = d.ns   # and an ADD_BLOCK that commits its previous block itself
    f = d.log(ns.planner.plan_create("/w", holder="w5", block_size=4096, now_ns=d.tick())).args["ino"]
    for previous in (None, {"num_bytes": 4096}):
        d.log(ns.planner.plan_add_block(f, ns.view.blocks_of(f), ns.ids.allocate_block_id(),
                                ns.ids.next_genstamp(), previous, ["n1"], d.tick()))
    replica = Namespace(MemoryStore(), d.ns.defaults)
    for record, _ in d.wire:
        [effect] = replica.apply([record])
        assert isinstance(effect, Effect), record.op
        with pytest.raises(dataclasses.FrozenInstanceError):
            effect.orphan = 1
    server = MetaServer(make_test_config(), MemoryStore(), str(tmp_path / "journal"))
    seen_blocks = seen_tokens = seen_dir_leases = 0
    for record, _ in d.wire:
        with caplog.at_level(logging.ERROR):
            server._apply([record])
        stored = {}
        for key, raw in server.ns.kv.scan(keys.BLOCK):
            block = keys.unpack(raw)
            stored[block["id"]] = (*keys.parse_block_key(key), block["gs"], block["num_bytes"],
                                   block["state"] == bm.UNDER_CONSTRUCTION)
        # a block the store has complete stays committed in memory until reported
        held = {block_id: (info.ino, info.index, info.gs, info.num_bytes,
                           info.state == bm.UNDER_CONSTRUCTION)
                for block_id, info in server.blocks.blocks.items()}
        assert held == stored, record.op
        for block_id, (ino, *_) in stored.items():
            assert server.blocks.get(block_id).replication == \
                server.ns.view.get_inode(ino).replication, record.op
        seen_blocks += len(stored)
        open_files = server.ns.view.under_construction()
        assert {ino: server.leases.holder_of(ino) for ino in open_files} == open_files
        assert server.leases.open_files() == len(open_files), record.op
        tokens = sorted(server.security.tokens.items())
        assert [state.to_wire() for _, state in tokens] == server.ns.view.delegation_tokens()
        seen_tokens += len(tokens)
        held = [StoredLease(lease.ino, lease.holder, lease.epoch, lease.inos, lease.earlier)
                for lease in (server.dir_leases.lease_of(stored.ino)
                              for stored in server.ns.view.dir_leases()) if lease]
        assert held == server.ns.view.dir_leases() and \
            len(server.dir_leases) == len(held), record.op
        seen_dir_leases += len(held)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert seen_blocks and seen_tokens == 2   # after the issue and the renewal
    # one after the first grant, one after the second, two from the third on (its record,
    # the create under its reserved ids, the three lock holders, the refill, the three
    # added above and the eight of the file patched)
    assert seen_dir_leases == 1 + 1 + 2 * 17


def test_optional_keys_stay_absent_and_unknown_keys_are_kept():
    """Older records without an optional key, and keys this code does not know, come back
    exactly as they were."""
    old = {"ino": 5, "last": None, "time": 9}
    op = Close.from_args(old)
    assert op.mtime is ABSENT and op.to_args() == old
    newer = {"ino": 5, "last": None, "time": 9, "future": [1]}
    assert list(Close.from_args(newer).to_args().items()) == list(newer.items())


def test_unknown_and_malformed_records_name_their_txid():
    with pytest.raises(InternalError, match=r"txid 7: unknown op 'NOPE'"):
        decode(Record(7, "NOPE", {}))
    with pytest.raises(MalformedRecord, match=r"txid 8: .*MKDIR.*'time'"):
        decode(Record(8, "MKDIR", {"dirs": []}))
    ns = Namespace(MemoryStore())
    with pytest.raises(InternalError, match=r"txid 3: unknown op 'NOPE'"):
        ns.apply([Record(3, "NOPE", {})])
    ns.apply([Record(1, *ns.planner.plan_format(1, 1).to_wire())])
    assert check_record(ns.kv, Record(9, "MKDIR", {"dirs": []})) == [
        "txid 9 MKDIR: malformed record: MKDIR record without 'time'"]
    assert check_record(ns.kv, Record(9, "NOPE", {})) == []   # unknown ops are not checked


def test_lazy_ops_are_the_namespace_only_ones():
    # directory lease grants and releases are as lazy as the holder's changes they cover
    assert LAZY_OPS == {"MKDIR", "ADD", "SYMLINK", "CLOSE", "DELETE", "RENAME", "RENAMES",
                        "SET_PERMISSIONS", "SET_OWNER", "TIMES", "FSYNC", "INLINE",
                        "DIR_LEASE_GRANT", "DIR_LEASE_REFILL", "DIR_LEASE_RELEASE",
                        "LOCK_HOLDER_GONE"}
