"""Warm random reads of a dataset made from some shards of an index (a view) against the whole index.

Run: python tools/bench_view.py [--dir bench-data] [--rounds 10] [--tree OTHER_CHECKOUT] [--max-open-files N]

The ``small`` set's 20 shards are linked into a temporary directory (the data set is not written to) and
indexed there. In one process, passes of 50,000 warm random ``ds.read`` over the whole index, a view of 10
neighbouring shards (one run of index samples: one addition a read) and a view of 10 shards named out of
order (10 runs: a bisection a read) alternate, ``--rounds`` times: best and median samples/s of each.
``--tree`` then alternates processes of this checkout and the other one over the whole index (A/B, same
machine, same minute): the cost of the view machinery for a dataset without a view. ``--max-open-files 2``
makes nearly every read reopen its shard (the path the process-wide bound on open files adds to).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ONE = """
import random, sys, time
sys.path.insert(0, sys.argv[1])
import tarindex
ds = tarindex.TarDataset(sys.argv[2], max_open_files=int(sys.argv[3]))
order = list(range(len(ds)))
random.Random(0).shuffle(order)
order = order[:50_000]
read = ds.read
for i in order:
    read(i)
out = []
for _ in range(5):
    t = time.perf_counter()
    for i in order:
        read(i)
    out.append(len(order) / (time.perf_counter() - t))
print(" ".join(f"{x:.0f}" for x in out))
"""


def _views(index_dir: Path, rounds: int, max_open: int) -> None:
    import tarindex

    scattered = "019,002,011,007,016,000,013,004,009,018"
    sets = {
        "whole index (20 shards)": tarindex.TarDataset(index_dir / "small.tarindex", max_open_files=max_open),
        "view of 10 neighbouring shards": tarindex.TarDataset(str(index_dir / "small-{000005..000014}.tar"), max_open_files=max_open),
        "view of 10 shards out of order": tarindex.TarDataset(
            str(index_dir / ("small-{" + ",".join(f"000{k}" for k in scattered.split(",")) + "}.tar")), max_open_files=max_open
        ),
    }
    orders = {}
    for name, ds in sets.items():
        order = list(range(len(ds)))
        random.Random(0).shuffle(order)
        orders[name] = order[:50_000]
        for i in orders[name]:  # warm: page cache, record blocks, descriptors
            ds.read(i)
    times: dict[str, list[float]] = {name: [] for name in sets}
    for _ in range(rounds):
        for name, ds in sets.items():
            read, order = ds.read, orders[name]
            started = time.perf_counter()
            for i in order:
                read(i)
            times[name].append(time.perf_counter() - started)
    lane = "Python" if os.environ.get("TARINDEX_PURE_PYTHON") else "C"
    for name, ts in times.items():
        n = len(orders[name])
        print(f"{lane} reader, {name}: best {n / min(ts):,.0f}/s, median {n / statistics.median(ts):,.0f}/s")


def _trees(index: Path, tree: str, rounds: int, max_open: int) -> None:
    here = str(Path(__file__).resolve().parent.parent)
    got: dict[str, list[float]] = {tree: [], here: []}
    for _ in range(rounds):
        for t in (tree, here):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            out = subprocess.run([sys.executable, "-c", _ONE, t, str(index), str(max_open)], env=env, capture_output=True, text=True, check=True)
            got[t] += [float(x) for x in out.stdout.split()]
    for t, xs in got.items():
        print(f"whole index, {t}: best {max(xs):,.0f}/s, median {statistics.median(xs):,.0f}/s over {len(xs)} passes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", default="bench-data", help="the benchmark data (its 'small' set is read)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tree", help="another checkout: alternate its processes with this one's over the whole index")
    parser.add_argument("--max-open-files", type=int, default=64)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import tarindex

    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        work = Path(tmp)
        for shard in sorted((Path(args.dir) / "small").glob("small-*.tar")):
            (work / shard.name).symlink_to(shard.resolve())
        tarindex.build_index(str(work / "small-*.tar"), index=work / "small.tarindex")
        _views(work, args.rounds, args.max_open_files)
        if args.tree:
            _trees(work / "small.tarindex", args.tree, args.rounds, args.max_open_files)


if __name__ == "__main__":
    main()
