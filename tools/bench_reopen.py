"""Random reads over more shards than stay open: each read reopens a shard (issue 15's 100,000-shard index).

Run: python tools/bench_reopen.py INDEX [--tree /path/to/other/checkout] [--reads 20000]
The index's shards must exist (tools/bench_index.py writes such an index). Every shard of the order is
opened once first; the timed pass reads the same samples again with the default 64 open shards.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("index", type=Path)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent), help="the checkout whose tarindex is measured")
    ap.add_argument("--reads", type=int, default=20_000)
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    import tarindex

    ds = tarindex.TarDataset(args.index)  # max_open_files: the default (64)
    rng = random.Random(0)
    order = [rng.randrange(len(ds)) for _ in range(args.reads)]
    for i in order:
        ds.read(i)
    t0 = time.perf_counter()
    for i in order:
        ds.read(i)
    dt = (time.perf_counter() - t0) / len(order)
    shards = len(ds.index.shards)
    print(f"{tarindex.__file__}: random ds.read over {shards:,} shards, {ds.max_open_files} open: {dt * 1e6:.1f} us a read ({1 / dt:,.0f}/s)")


if __name__ == "__main__":
    main()
