"""``leasefs bench packets``: what block servers spend taking an HDFS write stream, without
any client cost: one trio task sends pre-built data-transfer packets (built before the
clock starts) through a ``--replication`` pipeline of the cluster's block servers, block
after block, with Hadoop's window of 80 packets in flight, and reads the acks.

Two shapes alternate in ``--repeat`` rounds, on the same servers: Hadoop's client's
(64 KiB packets of 512-byte chunks) and large packets of the same protocol (1 MiB, 512-byte
chunks); the difference is the per-packet cost. Figures: MB/s, and the block servers' CPU
seconds per GiB per node (from ``/proc``), when the cluster is the embedded one of this
machine (its ``cluster.json`` names their pids); else MB/s only.

Why: Hadoop's writer is CPU-bound on a small machine, so its throughput follows the
servers' CPU per byte; this isolates that from the JVM's own (``bench hdfs`` measures the
whole). The written files are checked (length, one replica read back) and removed.

Concurrency contract: a CLI process; one ``trio.run``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import trio

from fs.datatransfer import chunk_checksums

from ..formatting import UsageError, format_table, parse_size
from ..progress import StatusLine
from .base import BenchFailed, MB, add_output_options, embedded_state, mbps, payload, size_label

#: Hadoop's client's packet payload (64 KiB less the room for the header) and window
HADOOP_PACKET = 64512
LARGE_PACKET = 1 << 20
WINDOW = 80
BYTES_PER_CHECKSUM = 512


def _server_pids(meta: str) -> list[int] | None:
    """The block servers' pids of the embedded cluster whose metadata server is ``meta``."""
    state = embedded_state(meta) or {}
    pids = [s.get("pid") for s in state.get("storage") or []]
    return pids if pids and all(isinstance(p, int) and os.path.exists(f"/proc/{p}")
                                for p in pids) else None


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _packets(block: bytes, step: int) -> tuple[list[bytes], bytes]:
    """The block's packets as sent (header, CRCs, data), and its empty last packet."""
    from fs.hdfs import datatransfer as hdt
    out = []
    for seqno, pos in enumerate(range(0, len(block), step)):
        data = block[pos:pos + step]
        out.append(b"".join(hdt.encode_packet(pos, seqno, data,
                                               chunk_checksums(data, BYTES_PER_CHECKSUM))))
    return out, b"".join(hdt.encode_packet(len(block), len(out), b"", b"", last=True))


async def _write_block(client, path: str, replication: int, packets: list[bytes],
                       last: bytes, size: int) -> None:
    from fs.hdfs import convert, tokens
    from fs.hdfs import datatransfer as hdt
    from fs.hdfs.pb import datatransfer_pb2 as dt
    from fs.hdfs.pb import hdfs_pb2 as pb
    # the namespace calls themselves: the bench writes the data with its own packets
    answer = await client.rpc.call("create", {
        "path": path, "client_name": client.client_name, "overwrite": True,
        "create_parent": True, "replication": replication, "block_size": size,
        "first_block": True})
    status, located = answer["status"], answer["first_block"]
    locations = located["locations"]
    if len(locations) < replication:
        raise BenchFailed(f"{path}: {len(locations)} block servers for replication "
                          f"{replication}")
    first = locations[0]
    block = pb.ExtendedBlockProto(poolId="BP-1", blockId=located["block"]["id"],
                                  generationStamp=located["block"]["gs"], numBytes=0)
    request = dt.OpWriteBlockProto(
        header=hdt.op_header(block, tokens.to_proto(located.get("token")), client.client_name),
        targets=[convert.datanode(loc) for loc in locations[1:]],
        stage=hdt.Stage.PIPELINE_SETUP_CREATE, pipelineSize=len(locations),
        minBytesRcvd=0, maxBytesRcvd=0, latestGenerationStamp=0,
        requestedChecksum=dt.ChecksumProto(type=hdt.CRC32C,
                                           bytesPerChecksum=BYTES_PER_CHECKSUM))
    address = f"{first['address'].rsplit(':', 1)[0]}:{first['hdfs_port']}"
    conn = await hdt.DataTransferClient.connect(address)
    try:
        await conn.framed.send_all(hdt.encode_op(hdt.WRITE_BLOCK, request))
        reply = await hdt.receive_delimited(conn.framed, dt.BlockOpResponseProto)
        if reply.status != hdt.Status.SUCCESS:
            raise BenchFailed(f"{path}: WRITE_BLOCK refused: {reply.message}")
        window = trio.Semaphore(WINDOW)
        data_acked = trio.Event()

        async def acks() -> None:
            for expected in range(len(packets) + 1):
                seqno, statuses = await hdt.receive_ack(conn.framed)
                if seqno != expected or any(s != hdt.Status.SUCCESS for s in statuses):
                    raise BenchFailed(f"{path}: ack {seqno} {statuses}, expected "
                                      f"{expected} all SUCCESS")
                window.release()
                if expected == len(packets) - 1:
                    data_acked.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acks)
            for packet in packets:
                await window.acquire()
                await conn.framed.send_all(packet)
            await data_acked.wait()   # Hadoop's client sends the last packet after the rest
            await window.acquire()
            await conn.framed.send_all(last)
    finally:
        await conn.aclose()
    await client.rpc.call("complete", {"path": path, "client_name": client.client_name,
                                       "ino": status["ino"],
                                       "last": {**located["block"], "num_bytes": size}})


async def _run(meta: str, config, a, block: bytes, shapes, pids, status) -> dict:
    from fs.client import AsyncClient
    results: dict[str, dict] = {name: {"seconds": [], "cpu": []} for name, _ in shapes}
    folder = a.dir.rstrip("/") + f"/packets-{os.getpid()}"
    async with AsyncClient(meta, config=config) as client:
        for name, (packets, last) in shapes:   # warm-up: connections, code paths
            await _write_block(client, f"{folder}/warm-{name}", a.replication, packets,
                               last, len(block))
        for round_ in range(a.repeat):
            order = shapes if round_ % 2 == 0 else shapes[::-1]
            for name, (packets, last) in order:
                status(f"round {round_ + 1}/{a.repeat}: {name}")
                cpu = _cpu_seconds(pids) if pids else None
                started = time.perf_counter()
                for n in range(a.blocks):
                    await _write_block(client, f"{folder}/{name}-{n}", a.replication, packets,
                                       last, len(block))
                results[name]["seconds"].append(time.perf_counter() - started)
                if pids:
                    results[name]["cpu"].append(_cpu_seconds(pids) - cpu)
        name = shapes[0][0]
        got = await client.read_file(f"{folder}/{name}-0")
        if got != block:
            raise BenchFailed(f"{folder}/{name}-0 read back {len(got)} bytes that differ "
                              f"from the {len(block)} written")
        if not a.keep:
            await client.delete(folder, recursive=True)
    return results


def run_packets_bench(cmd) -> int:
    a = cmd.args
    size = parse_size(a.block_size)
    if size < LARGE_PACKET or a.blocks < 1 or a.repeat < 1 or a.replication < 1:
        raise UsageError("--block-size must be at least 1M; --blocks, --repeat and "
                         "--replication must be positive")
    status = StatusLine(enabled=not a.quiet)
    meta = cmd.meta_address
    pids = _server_pids(meta)
    block = payload(size)
    status("building the packets")
    shapes = [("hadoop_64k", _packets(block, HADOOP_PACKET)),
              ("large_1m", _packets(block, LARGE_PACKET))]
    try:
        results = trio.run(_run, meta, cmd.config, a, block, shapes, pids, status)
    except BenchFailed as exc:
        raise UsageError(f"bench packets: {exc}") from None
    written = size * a.blocks
    gib = written / (1 << 30)
    summary = {}
    for name, r in results.items():
        seconds = statistics.median(r["seconds"])
        summary[name] = {
            "median_s": seconds, "mb_s": mbps(written, seconds), "all_s": r["seconds"],
            "cpu_s_per_gib_node": (statistics.median(r["cpu"]) / gib / a.replication
                                   if r["cpu"] else None)}
    if a.json:
        cmd.out(json.dumps({"block_size": size, "blocks": a.blocks, "repeat": a.repeat,
                            "replication": a.replication, "results": summary}, indent=2))
        return 0
    cmd.out(f"leasefs bench packets: {a.blocks} × {size_label(size)} per round, replication "
            f"{a.replication}, median of {a.repeat} rounds; MB = {MB} bytes")
    rows = []
    for name, label in (("hadoop_64k", "64 KiB packets (Hadoop's client)"),
                        ("large_1m", "1 MiB packets")):
        r = summary[name]
        cpu = r["cpu_s_per_gib_node"]
        rows.append([label, f"{r['median_s']:.2f}", f"{r['mb_s']:.0f}",
                     "n/a" if cpu is None else f"{cpu:.2f}"])
    for line in format_table(["packets", "s", "MB/s", "server CPU s/GiB/node"], rows,
                             align="<>>>"):
        cmd.out(line)
    if pids is None:
        cmd.out("(server CPU: only for this machine's embedded cluster)")
    return 0


def register(bsub, common) -> None:
    q = bsub.add_parser("packets", parents=[common],
                        help="block servers' cost of an HDFS write stream, no client cost",
                        description="Pre-built HDFS data-transfer packets (Hadoop's 64 KiB, "
                                    "and 1 MiB) sent block after block through a pipeline of "
                                    "block servers, alternating rounds: MB/s and the block "
                                    "servers' CPU per GiB per node (embedded cluster).")
    add_output_options(q)
    q.add_argument("--block-size", default="128M",
                   help="bytes per block, each a file of one block (default 128M)")
    q.add_argument("--blocks", type=int, default=4, help="blocks per round (default 4)")
    q.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    q.add_argument("--replication", type=int, default=3, help="pipeline length (default 3)")
    q.set_defaults(func=run_packets_bench)
