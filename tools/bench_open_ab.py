"""A/B of two checkouts on TarDataset's three read costs: warm ``ds[i]``, warm ``__getitems__`` and a shard's open.

Run: python tools/bench_open_ab.py A_TREE B_TREE INDEX [INDEX ...] [--rounds 7]

Each round starts one process per tree, A then B (B then A in odd rounds), each over the same index: 20,000
random samples read once to warm, then the best of 3 passes of each measure: ``item`` (``ds[i]`` of those
samples, ns a sample), ``getitems`` (40 batches of 256 of them, ns a sample), and ``open`` (5 fresh datasets
each reading the first sample of every shard: the open path, identity check and first read; ns a shard). The
table gives per index and measure the median of each tree and the median over rounds of B/A (a loaded machine
slows both processes of a round alike). The C lane; the trees must be built (``setup.py build_ext --inplace``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MEASURES = ("item", "getitems", "open")
CHILD = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
import tarindex
index = sys.argv[2]
ds = tarindex.TarDataset(index)
rng = random.Random(1)
order = [rng.randrange(len(ds)) for _ in range(20000)]
starts = ds.index.shard_starts().tolist()
firsts = [int(a) for a, b in zip(starts[:-1], starts[1:]) if b > a]
for i in order:
    ds[i]
def best(run, passes=3):
    times = []
    for _ in range(passes):
        t0 = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - t0)
    return min(times)
batches = [order[k : k + 256] for k in range(0, 256 * 40, 256)]
def opens():
    for _ in range(5):
        fresh = tarindex.TarDataset(index)
        for i in firsts:
            fresh[i]
        fresh.close()
print(json.dumps({
    "item": best(lambda: [ds[i] for i in order]) / len(order),
    "getitems": best(lambda: [ds.__getitems__(b) for b in batches]) / (256 * 40),
    "open": best(opens) / (5 * len(firsts)),
}))
"""


def _run(tree: str, index: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1")
    env.pop("TARINDEX_PURE_PYTHON", None)
    got = subprocess.run([sys.executable, "-c", CHILD, tree, index], env=env, capture_output=True, text=True, check=True)
    out: dict[str, float] = json.loads(got.stdout)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("indexes", nargs="+")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; A {args.a}; B {args.b}")
    print("| index | measure | A ns | B ns | B/A (median of rounds) | min | max |\n|---|---|---|---|---|---|---|")
    for index in args.indexes:
        runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        for r in range(args.rounds):
            pairs = [("A", args.a), ("B", args.b)]
            for name, tree in pairs if r % 2 == 0 else pairs[::-1]:
                runs[name].append(_run(tree, index))
        for m in MEASURES:
            quotients = [b[m] / a[m] for a, b in zip(runs["A"], runs["B"])]
            a_ns, b_ns = (statistics.median(x[m] for x in runs[k]) for k in ("A", "B"))
            print(
                f"| {os.path.basename(index)} | {m} | {a_ns:,.0f} | {b_ns:,.0f} | {statistics.median(quotients):.3f} "
                f"| {min(quotients):.3f} | {max(quotients):.3f} |"
            )


if __name__ == "__main__":
    main()
