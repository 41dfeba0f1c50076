"""Warm random ``ds.read`` of two checkouts, A/B: the cost of a change on the read path.

Run: python tools/bench_ab.py A_TREE B_TREE INDEX [INDEX ...] [--rounds 9] [--reads 50000] [--lanes c,python]

Each round starts one process per tree, A then B (B then A in odd rounds); each process opens the index and
runs ``bench_index._warm_reads`` over random samples of the whole index: one pass that opens and warms, then
3 passes of ``ds.read`` alternated with 3 of a bare ``os.pread`` loop over the same byte ranges through the
same descriptors. Its figure is best ``ds.read`` / best ``pread``: the read path's cost in units of the system
call it makes, which a loaded machine slows alike. The table gives per tree the median over
rounds of that ratio and of ns per read, and B/A of the ratios (median of the per-round quotients).
``--lanes python`` runs the trees with ``TARINDEX_PURE_PYTHON=1`` (a fifth of the reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TOOLS = str(Path(__file__).resolve().parent)
CHILD = r"""
import json, sys
sys.path.append(sys.argv[3])
from bench_index import _warm_reads  # imports tarindex from the tree after --tree
import tarindex
ds = tarindex.TarDataset(sys.argv[1])
print(json.dumps(_warm_reads(ds, 10**9, int(sys.argv[2]))[:2]))
"""


def _run(tree: str, index: str, reads: int, pure: bool) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1")
    env.pop("TARINDEX_PURE_PYTHON", None)
    if pure:
        env["TARINDEX_PURE_PYTHON"] = "1"
    command = [sys.executable, "-c", CHILD, index, str(reads), TOOLS, "--tree", tree]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    read_us, pread_us = json.loads(out.stdout)
    return read_us * 1e3, read_us / pread_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("indexes", nargs="+")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reads", type=int, default=50_000)
    ap.add_argument("--lanes", default="c,python")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; A {args.a}; B {args.b}")
    print("| index, lane | A read ns | A read/pread | B read ns | B read/pread | B/A (ratio) |\n|---|---|---|---|---|---|")
    for index in args.indexes:
        for lane in args.lanes.split(","):
            pure = lane == "python"
            reads = args.reads // 5 if pure else args.reads
            got: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
            for r in range(args.rounds):
                for which in ("a", "b") if r % 2 == 0 else ("b", "a"):
                    got[which].append(_run(getattr(args, which), index, reads, pure))
            med = {k: (statistics.median(g for g, _ in v), statistics.median(q for _, q in v)) for k, v in got.items()}
            quotient = statistics.median(b[1] / a[1] for a, b in zip(got["a"], got["b"]))
            print(f"| {os.path.basename(index)}, {lane} | {med['a'][0]:,.0f} | {med['a'][1]:.2f} | {med['b'][0]:,.0f} | {med['b'][1]:.2f} | {quotient:.3f} |", flush=True)


if __name__ == "__main__":
    main()
