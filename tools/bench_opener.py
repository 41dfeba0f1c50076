"""Random ``TarDataset.read`` over small samples (1 KB + 1 B members, 8 plain shards of 4,000), best of N passes
of 200,000 reads; prints samples/s. ``python tools/bench_opener.py [N] [--dir DIR]`` (data made on first use).

Recorded in docs/performance.md ("ShardOpener"); with ``valgrind --tool=callgrind`` and N=1 (and 20,000 reads:
``--reads 20000``) it gives the instruction counts of ``Reader_read``.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import time

import numpy as np

import tarindex

parser = argparse.ArgumentParser()
parser.add_argument("passes", type=int, nargs="?", default=5)
parser.add_argument("--dir", default="/tmp/tarindex-bench-opener")
parser.add_argument("--reads", type=int, default=200_000)
args = parser.parse_args()
root = args.dir
if not os.path.exists(root + "/done"):
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(8):
        with tarfile.open(f"{root}/b-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(4000):
                for ext, n in (("bin", 1000), ("cls", 1)):
                    ti = tarfile.TarInfo(f"k{s:02d}{i:05d}.{ext}")
                    ti.size = n
                    tf.addfile(ti, io.BytesIO(rng.bytes(n)))
    with open(root + "/done", "w"):
        pass
idx = root + "/b.tarindex"
if not os.path.exists(idx):
    tarindex.build_index(root + "/b-*.tar", index=idx, workers=1)
ds = tarindex.TarDataset(idx)
order = np.random.default_rng(1).integers(0, len(ds), args.reads).tolist()
read = ds.read
read(0)
best = 0.0
for _ in range(args.passes):
    t = time.perf_counter()
    for i in order:
        read(i)
    best = max(best, len(order) / (time.perf_counter() - t))
print(f"{best:,.0f}")
