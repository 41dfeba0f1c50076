"""What the read check costs (``tools/bench.py --only readcheck``): every read checks its members' tar headers
against the index record (tarindex._readcheck, the C reader's ``headers_agree``); here the same reads with the
check on and off, alternated in one process per lane.

For each set, one process per lane (C; Python with ``TARINDEX_PURE_PYTHON=1``) opens the index, warms it with
one pass over two lists of random samples, then makes ``pairs`` passes over them in stretches of 512 samples,
the check on and off in turn from one stretch to the next (the other way round in odd passes): in a stretch, a
``ds[i]`` loop over 512 of the first list, then ``ds.__getitems__`` in batches of 64 over 512 of the other (no
sample read twice in a row, so neither finds the other's bytes in the CPU's caches). Each pass gives one quotient, the time a
sample with the check over the time without it; the figure is their median: the check's cost in units of
the same read without it, measured over the same seconds (a drift of the machine's speed slows both alike).
The switch is for this measurement only: ``_speedups._readcheck(False)`` in C, and
``tarindex.dataset.check_sample`` replaced by a function that checks nothing in Python (also the C reader's
Python fallback).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

Row = tuple[str, float, str]

CHILD = r"""
import json, sys, time
import numpy as np
import tarindex, tarindex.dataset as dataset
from tarindex._native import SPEEDUPS

index, reads, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = tarindex.TarDataset(index)
rng = np.random.default_rng(0)
picks, batched = rng.integers(0, len(ds), reads).tolist(), rng.integers(0, len(ds), reads).tolist()
CHUNK = 512  # reads per stretch of one setting: on and off take turns every 512 reads (8 batches of 64)
chunks = [(picks[k : k + CHUNK], batched[k : k + CHUNK]) for k in range(0, reads, CHUNK)]
check = dataset.check_sample

def switch(on):
    if SPEEDUPS is not None:
        SPEEDUPS._readcheck(on)
    dataset.check_sample = check if on else (lambda *args: None)

def one_pass(flip):
    spent = {True: [0.0, 0.0], False: [0.0, 0.0]}
    count = {True: 0, False: 0}
    for c, (chunk, other) in enumerate(chunks):
        on = (c + flip) % 2 == 0
        switch(on)
        t0 = time.perf_counter()
        for i in chunk:
            ds[i]
        t1 = time.perf_counter()
        for k in range(0, len(other), 64):
            ds.__getitems__(other[k : k + 64])
        spent[on][0] += t1 - t0
        spent[on][1] += time.perf_counter() - t1
        count[on] += len(chunk)
    return [[t / count[on] for t in spent[on]] for on in (True, False)]

for i in picks + batched:  # warm: files open, pages cached
    ds[i]
got = {True: [], False: []}
for p in range(pairs):
    on, off = one_pass(p % 2)
    got[True].append(on)
    got[False].append(off)
switch(True)
print(json.dumps([got[True], got[False]]))
"""


def _lane(index: Path, pure: bool, reads: int, pairs: int) -> tuple[list[list[float]], list[list[float]]]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("TARINDEX_PURE_PYTHON", None)
    if pure:
        env["TARINDEX_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, str(index), str(reads), str(pairs)], env=env, capture_output=True, text=True, check=True)
    on, off = json.loads(out.stdout.strip().splitlines()[-1])
    return on, off


def bench_readcheck(indexes: dict[str, Path], pairs: int = 15) -> list[Row]:
    """Rows per set and lane: the check's cost for ``ds[i]`` and ``__getitems__``, on / off."""
    rows: list[Row] = []
    for name, index in indexes.items():
        for lane in ("C", "Python"):
            reads = (4_000 if name.startswith("jpeg") else 20_000) // (4 if lane == "Python" else 1)
            on, off = _lane(index, lane == "Python", reads, pairs)
            for k, what in enumerate(("ds[i]", "__getitems__")):
                quotient = statistics.median(a[k] / b[k] for a, b in zip(on, off))
                on_ns = statistics.median(a[k] for a in on) * 1e9
                off_ns = statistics.median(b[k] for b in off) * 1e9
                rows.append((f"{name}, {lane}: {what} with the read check / without (median of {pairs} pairs)", quotient,
                             f"+{(quotient - 1) * 100:.1f}%; {on_ns:,.0f} ns / {off_ns:,.0f} ns a sample; load average {os.getloadavg()[0]:.1f}"))  # fmt: skip
    return rows


def main() -> None:
    rows = bench_readcheck({Path(p).name.split(".")[0]: Path(p) for p in sys.argv[1:]})
    print("| measurement | value | ratio |\n|---|---|---|")
    for label, value, ratio in rows:
        print(f"| {label} | {value:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
