"""Store-level micro-benchmark of a patch's acknowledged path: ``ReplicaStore.
patch_finalized`` with 107 page-sized (4 KiB, aligned) ranges into a 2.5 MB finalized
replica with bytes_per_checksum 4096, on three replicas in three data folders of one disk at
once (a database transaction on a mount: one patch per replica), each code tree in its own
child process, the trees alternating round by round, medians.

Why it exists: it compares the patch path of two code trees (e.g. before and after a change
to ``storage/patching.py``) on the same machine in the same minutes, so load from anything
else running falls on both alike. The patch flusher runs beside the patches where the tree
has one (as in a block server).

Usage: ``python tools/bench/patchstore.py [--rounds 5] [--patches 30] [--replicas 3]
[--dir /tmp] NAME=CODE_ROOT ...`` (each CODE_ROOT holds ``storage/`` and ``fs/``).

Concurrency contract: none; one child at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, random, sys, time
import trio
from fs.datatransfer import chunk_checksums
from storage.replicas import ReplicaStore

BPC = 4096
SIZE = 2_500_000
RANGES, PAGE = 107, 4096

async def main(root, n_patches, n_replicas):
    rng = random.Random(7)
    stores = []
    for i in range(n_replicas):
        store = ReplicaStore(os.path.join(root, f"d{i}"), disk_io_threads=4)
        await store.open()
        data = rng.randbytes(SIZE)
        await store.create_finalized(1, 1, BPC, data, chunk_checksums(data, BPC))
        stores.append(store)
    pages = SIZE // PAGE
    times = []
    async with trio.open_nursery() as nursery:
        for store in stores:
            if hasattr(store, "run_patch_flusher"):
                nursery.start_soon(store.run_patch_flusher)
        for k in range(n_patches):
            picked = sorted(rng.sample(range(pages), RANGES))
            ranges = [(p * PAGE, rng.randbytes(PAGE)) for p in picked]
            start = time.perf_counter()
            async with trio.open_nursery() as each:
                for store in stores:
                    each.start_soon(store.patch_finalized, 1, 1 + k, 2 + k, ranges, 1 << 27)
            times.append(time.perf_counter() - start)
            await trio.sleep(0.02)   # the next transaction's other work
        nursery.cancel_scope.cancel()
    for store in stores:
        store.close()
    print(json.dumps(times))

trio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
"""


def run_child(code_root: str, folder: str, patches: int, replicas: int) -> list[float]:
    with tempfile.TemporaryDirectory(dir=folder) as root:
        env = {**os.environ, "PYTHONPATH": code_root, "PYTHONDONTWRITEBYTECODE": "1"}
        out = subprocess.run([sys.executable, "-c", CHILD, root, str(patches), str(replicas)],
                             env=env, cwd=root, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=CODE_ROOT")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--patches", type=int, default=30)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="disk to run on")
    args = parser.parse_args(argv)
    trees = [tree.split("=", 1) for tree in args.trees]
    results: dict[str, list[float]] = {name: [] for name, _ in trees}
    for round_ in range(args.rounds):
        order = trees if round_ % 2 == 0 else trees[::-1]
        for name, root in order:
            times = run_child(root, args.dir, args.patches, args.replicas)
            results[name] += times
            print(f"round {round_ + 1} {name}: median {statistics.median(times) * 1e3:.2f} ms "
                  f"per patch of {args.replicas} replicas", flush=True)
    for name, times in results.items():
        qs = statistics.quantiles(times, n=10)
        print(f"{name}: median {statistics.median(times) * 1e3:.2f} ms, p10 {qs[0] * 1e3:.2f}, "
              f"p90 {qs[-1] * 1e3:.2f} ({len(times)} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
