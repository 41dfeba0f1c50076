"""Random reads of an index by two source trees, in alternated processes (A/B in the same run).

Run: python tools/bench_reads.py --trees A,B --index BIG.tarindex [--small SMALL.tarindex] [--rounds 10] [--lane c|python]

Each round runs one process per tree (the order alternates) that reports: open + first sample of
``--index`` (ms; private and file-backed resident memory added, MB), warm ``ds.read`` over 50,000
random samples of the first 1,000 (ns a read, best of 3 by CPU time), the same on ``--small`` (the
1M-vs-1k ratio of docs/performance.md), warm ``get(key)`` (us), the first read of every record block
(us a block) and the memory added by reading them all. Prints the median and best of each per tree
and the ratio of the medians. A tree is a source checkout with its extension built in place; the
processes start in a temporary directory, so the tree named is the one imported.
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
import json, sys, time
import numpy as np
import tarindex, tarindex.dataset

def mem():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["RssAnon"].split()[0]) / 1024, int(fields["RssFile"].split()[0]) / 1024

def best(f, reps=3):
    out = float("inf")
    for _ in range(reps):
        t = time.process_time(); f(); out = min(out, time.process_time() - t)
    return out

big, small = sys.argv[1], sys.argv[2]
m0 = mem()
t = time.perf_counter(); ds = tarindex.TarDataset(big); ds[len(ds) - 1]; t_open = time.perf_counter() - t
m1 = mem()
blocks = range(0, len(ds), ds.index.meta["block_samples"])
m2 = mem()
t = time.perf_counter()
for b in blocks: ds[b]
first = (time.perf_counter() - t) / len(blocks)
m3 = mem()
order = np.random.default_rng(0).integers(0, 1000, 50_000).tolist()
ref = tarindex.TarDataset(small)
for i in order: ds.read(i); ref.read(i)
read_big = best(lambda: [ds.read(i) for i in order]) / len(order)
read_small = best(lambda: [ref.read(i) for i in order]) / len(order)
keys = [ds[i]["__key__"] for i in np.random.default_rng(1).integers(0, len(ds), 2000).tolist()]
get = best(lambda: [ds.get(k) for k in keys]) / len(keys)
print(json.dumps({
    "open + first sample (ms)": t_open * 1e3, "  private MB added": m1[0] - m0[0], "  file-backed MB added": m1[1] - m0[1],
    "warm read, big index (ns)": read_big * 1e9, "warm read, small index (ns)": read_small * 1e9,
    "  big / small": read_big / read_small, "get(key) (us)": get * 1e6, "first read of a block (us)": first * 1e6,
    "every block read: private MB added": m3[0] - m2[0], "every block read: file-backed MB added": m3[1] - m2[1],
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", required=True, help="A,B: two source trees, each built in place")
    ap.add_argument("--index", required=True, help="the index read (e.g. 1M samples)")
    ap.add_argument("--small", help="an index of the same shards read over the same ranges (default: --index)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lane", choices=("c", "python"), default="c")
    args = ap.parse_args()
    trees = args.trees.split(",")
    results: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
                env.pop("TARINDEX_PURE_PYTHON", None)
                if args.lane == "python":
                    env["TARINDEX_PURE_PYTHON"] = "1"
                cmd = [sys.executable, "-c", CHILD, os.path.abspath(args.index), os.path.abspath(args.small or args.index)]
                out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=True)
                results[tree].append(json.loads(out.stdout))
    a, b = trees
    print(f"| {args.lane} lane, {args.rounds} rounds | {a}: median (best) | {b}: median (best) | {b} / {a} (medians) |")
    print("|---|---|---|---|")
    for metric in results[a][0]:
        x, y = ([row[metric] for row in results[t]] for t in trees)
        mx, my = statistics.median(x), statistics.median(y)
        ratio = f"{my / mx:.3f}" if mx else "-"
        print(f"| {metric} | {mx:.3g} ({min(x):.3g}) | {my:.3g} ({min(y):.3g}) | {ratio} |")


if __name__ == "__main__":
    main()
