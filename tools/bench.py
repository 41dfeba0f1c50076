"""Benchmarks, side by side with the physical limit, as ratios in one run.

Run: python tools/bench.py [--dir bench-data] [--sets jpeg,small]
Results go to stdout as a markdown table; record them in docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import tarfile
import time
from pathlib import Path

import numpy as np

import tarindex


def make_set(root: Path, name: str, n_shards: int, per_shard: int, size_range: tuple[int, int]) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for s in range(n_shards):
        p = root / f"{name}-{s:06d}.tar"
        paths.append(str(p))
        if p.exists():
            continue
        with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(per_shard):
                key = f"{s:03d}{i:06d}"
                main_ext = "jpg" if name == "jpeg" else "bin"
                members = {
                    main_ext: rng.integers(0, 255, int(rng.integers(*size_range)), dtype=np.uint8).tobytes(),
                    "cls": str(i % 1000).encode(),
                    "json": json.dumps({"i": i}).encode(),
                }
                for ext, data in members.items():
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    return paths


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_set(paths: list[str], name: str) -> list[tuple[str, float, str]]:
    rows: list[tuple[str, float, str]] = []
    index = Path(paths[0]).with_name(f"{name}.tarindex")
    index.unlink(missing_ok=True)
    t_build = timed(lambda: tarindex.build_index(paths, index=index))

    def tarfile_scan() -> None:
        for p in paths:
            with tarfile.open(p) as tf:
                for _ in tf:
                    pass

    t_tarfile = timed(tarfile_scan)
    rows.append((f"{name}: build index (s)", t_build, f"{t_tarfile / t_build:.1f}x faster than tarfile scan ({t_tarfile:.2f} s)"))

    ds = tarindex.TarDataset(index)
    n = len(ds)
    order = list(range(n))
    random.Random(0).shuffle(order)
    ix = ds.index
    s_shard, s_off, s_size = ix.column("sample_shard"), ix.column("sample_offset"), ix.column("sample_size")
    fds = [os.open(ds.urls[k], os.O_RDONLY) for k in range(len(ds.urls))]
    ranges = [(fds[s_shard[i]], s_size[i], s_off[i]) for i in order]
    pread = os.pread

    def pread_loop() -> None:
        for fd, size, off in ranges:
            pread(fd, size, off)

    t_pread = min(timed(pread_loop) for _ in range(3))
    read = ds.read
    t_ds = min(timed(lambda: [read(i) for i in order]) for _ in range(3))
    rows.append((f"{name}: bare os.pread loop (samples/s)", n / t_pread, "physical limit"))
    rows.append((f"{name}: TarDataset random access (samples/s)", n / t_ds, f"{t_pread / t_ds:.2f}x the pread loop"))
    for fd in fds:
        os.close(fd)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--sets", default="jpeg,small")
    args = ap.parse_args()
    specs = {"jpeg": (20, 1000, (20_000, 120_000)), "small": (20, 10_000, (800, 1200))}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| measurement | value | ratio |\n|---|---|---|")
    for name in args.sets.split(","):
        n_shards, per, size = specs[name]
        paths = make_set(args.dir / name, name, n_shards, per, size)
        for label, value, ratio in bench_set(paths, name):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
