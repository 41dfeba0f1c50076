"""Demo job: make a small multi-modal shard set, index it, read at random, stream, summarise.

Run: python tools/demo.py [--dir demo-data]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def make_shards(root: Path, n_shards: int = 4, per_shard: int = 50) -> str:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(n_shards):
        with tarfile.open(root / f"demo-{s:06d}.tar", "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(per_shard):
                key = f"{s:02d}{i:04d}"
                img = Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8))
                jpg = io.BytesIO()
                img.save(jpg, "JPEG")
                npy = io.BytesIO()
                np.save(npy, rng.standard_normal(8).astype(np.float32))
                members = {
                    "jpg": jpg.getvalue(),
                    "cls": str(i % 10).encode(),
                    "json": json.dumps({"shard": s, "i": i}).encode(),
                    "txt": f"sample {key}".encode(),
                    "npy": npy.getvalue(),
                }
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return str(root / f"demo-{{000000..{n_shards - 1:06d}}}.tar")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="demo-data", type=Path)
    args = ap.parse_args()
    pattern = make_shards(args.dir)
    print(f"shards: {pattern}")
    subprocess.run([sys.executable, "-m", "tarindex.cli.main", "build", pattern, "--quiet"], check=True)
    subprocess.run([sys.executable, "-m", "tarindex.cli.main", "info", pattern], check=True)

    import torch

    import tarindex

    ds = tarindex.TarDataset(pattern, decode="torchrgb8")
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    t0 = time.perf_counter()
    labels = [ds[i]["cls"] for i in order]
    dt = time.perf_counter() - t0
    first = ds[order[0]]
    print(f"random access: {len(order)} samples in {dt * 1e3:.1f} ms; sample {first['__key__']}: "
          f"jpg {tuple(first['jpg'].shape)} {first['jpg'].dtype}, cls {first['cls']}, json {first['json']}, "
          f"npy {first['npy'].shape}")
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, sampler=sampler, num_workers=2, batch_size=None)
    seen = [s["__index__"] for s in loader]
    print(f"DataLoader(num_workers=2) rank 0 of 2: {len(seen)} samples, {len(set(seen))} distinct")
    sharded = tarindex.ShardSampler(ds, num_replicas=2, rank=1, seed=0, chunk_shards=1)
    print(f"ShardSampler rank 1 of 2: {len(list(sharded))} indices, shards touched first: "
          f"{sorted({ds[i]['__url__'][-10:-4] for i in list(sharded)[:10]})}")
    stream = tarindex.TarStream(pattern, decode="torchrgb8", shuffle=50, seed=0)
    t0 = time.perf_counter()
    streamed = [s["__key__"] for s in torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)]
    dt = time.perf_counter() - t0
    print(f"TarStream (no index, 2 workers, shuffle buffer 50): {len(streamed)} samples in {dt * 1e3:.0f} ms; "
          f"label histogram {np.bincount(labels).tolist()}")
    ok = sorted(streamed) == sorted(ds.index.key(i) for i in range(len(ds))) and len(set(order)) == len(ds)
    print("summary: ok" if ok else "summary: MISMATCH")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
