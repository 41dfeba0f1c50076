"""Iterating a ``TarStream`` in two checkouts, A/B: the cost of a change on the streaming path.

Run: python tools/bench_stream_ab.py A_TREE B_TREE SHARD [SHARD ...] [--rounds 9] [--lanes c,python]

Each round starts one process per tree, A then B (B then A in odd rounds); each process iterates
``TarStream(shards)`` once to warm the page cache and the imports, then three times alternated with three
bare reads of the same files (``os.pread`` of 1 MiB blocks: the physical limit of a walk that must see every
byte). Its figure is best stream / best read: the streaming path's cost in units of reading the bytes, which a
loaded machine slows alike. The table gives per tree the median over rounds of that ratio and of samples/s,
and B/A of the ratios (median of the per-round quotients).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
import tarindex
shards = sys.argv[1:]

def read():
    for path in shards:
        fd = os.open(path, os.O_RDONLY)
        try:
            off = 0
            while data := os.pread(fd, 1 << 20, off):
                off += len(data)
        finally:
            os.close(fd)

def stream():
    n = 0
    for _ in tarindex.TarStream(shards):
        n += 1
    return n

n = stream()
best_stream = best_read = float("inf")
for _ in range(3):
    t = time.perf_counter(); stream(); best_stream = min(best_stream, time.perf_counter() - t)
    t = time.perf_counter(); read(); best_read = min(best_read, time.perf_counter() - t)
print(json.dumps([best_stream / best_read, n / best_stream]))
"""


def _run(tree: str, shards: list[str], pure: bool) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1")
    env.pop("TARINDEX_PURE_PYTHON", None)
    if pure:
        env["TARINDEX_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, *shards], env=env, check=True, capture_output=True, text=True, cwd=tree)
    ratio, rate = json.loads(out.stdout.strip().splitlines()[-1])
    return float(ratio), float(rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("shards", nargs="+")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--lanes", default="c")
    args = parser.parse_args()
    for lane in args.lanes.split(","):
        pure = lane == "python"
        got: dict[str, list[tuple[float, float]]] = {args.a: [], args.b: []}
        for r in range(args.rounds):
            for tree in (args.a, args.b) if r % 2 == 0 else (args.b, args.a):
                got[tree].append(_run(tree, args.shards, pure))
        quotients = [b[0] / a[0] for a, b in zip(got[args.a], got[args.b])]
        print(f"lane {lane}, {args.rounds} rounds, {len(args.shards)} shards")
        for name, tree in (("A", args.a), ("B", args.b)):
            ratios, rates = [x[0] for x in got[tree]], [x[1] for x in got[tree]]
            print(f"  {name} {tree}: stream/read {statistics.median(ratios):.3f}, {statistics.median(rates):,.0f} samples/s")
        print(f"  B/A (median of per-round quotients): {statistics.median(quotients):.3f}")


if __name__ == "__main__":
    main()
