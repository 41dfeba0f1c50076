"""Benchmarks, side by side with the physical limit, as ratios in one run.

Run: python tools/bench.py [--dir bench-data] [--sets jpeg,small]
Sampler benchmarks (ShardSampler vs DistributedSampler): python tools/bench.py --sampler [--sets sampler]
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


def _evict(paths: list[str]) -> None:
    """Drop the shards' pages from the page cache (this process's files only; nothing global)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_sampler_order(index: str | Path, name: str, *, world: int = 2) -> list[tuple[str, float, str]]:
    """TarDataset read throughput of rank 0 in ShardSampler order vs DistributedSampler order, same data.

    Takes any index (plain tar today; point it at an index of zstd shards to compare frame-cache locality).
    Warm: page cache holds the shards. Cold: the shards' pages are evicted (posix_fadvise) before each pass.
    """
    from torch.utils.data import DistributedSampler

    ds = tarindex.TarDataset(index)
    orders = {
        "DistributedSampler": list(DistributedSampler(ds, num_replicas=world, rank=0, shuffle=True, seed=0)),
        "ShardSampler": list(tarindex.ShardSampler(ds, world, 0, seed=0)),
        "ShardSampler(block_samples=16)": list(tarindex.ShardSampler(ds, world, 0, seed=0, block_samples=16)),
        "index order (sequential: the locality limit)": list(tarindex.ShardSampler(ds, world, 0, shuffle=False)),
    }
    read = ds.read
    rows: list[tuple[str, float, str]] = []
    for cache in ("warm", "cold"):
        if cache == "warm":
            [read(i) for i in range(len(ds))]  # fill the page cache
        best = dict.fromkeys(orders, float("inf"))
        for _ in range(5 if cache == "warm" else 2):  # rounds over all orders: load drift hits each alike
            for label, order in orders.items():
                if cache == "cold":
                    ds.close()
                    _evict(ds.urls)
                best[label] = min(best[label], timed(lambda order=order: [read(i) for i in order]))
        rate = {label: len(order) / best[label] for label, order in orders.items()}
        base = rate["DistributedSampler"]
        rows.append((f"{name}: rank 0 of {world}, DistributedSampler, {cache} (samples/s)", base, "peer"))
        for label in list(orders)[1:]:
            ratio = f"{rate[label] / base:.2f}x DistributedSampler"
            rows.append((f"{name}: rank 0 of {world}, {label}, {cache} (samples/s)", rate[label], ratio))
    return rows


class _Synthetic:
    """Lengths only: what ShardSampler needs from a dataset."""

    def __init__(self, n_shards: int, per_shard: int) -> None:
        self.shard_sizes = np.full(n_shards, per_shard, dtype=np.int64)


def _scale_case(case: str, n_shards: int, per_shard: int, world: int, conn) -> None:  # type: ignore[no-untyped-def]
    """Child process: (seconds, peak RSS growth in MiB) of one case, after imports and the dataset exist."""
    import torch
    from torch.utils.data import DistributedSampler

    def hwm() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))

    if case == "peer":
        peer = torch.utils.data.TensorDataset(torch.empty(n_shards * per_shard, 0))
    else:
        data = _Synthetic(n_shards, per_shard)
    base = hwm()
    t0 = time.perf_counter()
    if case == "start":  # construct, choose the epoch, first index
        s = tarindex.ShardSampler(data, world, world - 1, seed=1)
        s.set_epoch(3)
        next(iter(s))
    elif case == "million":
        it = iter(tarindex.ShardSampler(data, world, 1, seed=1))
        for _ in range(1_000_000):
            next(it)
    else:
        d = DistributedSampler(peer, num_replicas=world, rank=world - 1, seed=1)
        d.set_epoch(3)
        next(iter(d))
    conn.send((time.perf_counter() - t0, (hwm() - base) / 1024))


def _in_child(*args: object) -> tuple[float, float]:
    """Run ``_scale_case`` in a fresh (spawned) process so peaks don't mix and no lock is inherited."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_scale_case, args=(*args, send))
    proc.start()
    result = recv.recv()
    proc.join()
    return result  # type: ignore[no-any-return]


def bench_sampler_scale(
    n_shards: int = 500_000, per_shard: int = 10_000, *, world: int = 8
) -> list[tuple[str, float, str]]:
    """Start of epoch and memory on a synthetic 5e9-sample dataset; DistributedSampler at 1e7 as the peer."""
    n = n_shards * per_shard
    t_start, mem = _in_child("start", n_shards, per_shard, world)
    t_million, _ = _in_child("million", n_shards, per_shard, world)
    peer_n = 10_000_000
    t_peer, mem_peer = _in_child("peer", peer_n, 1, world)
    label = f"{n / 1e9:g}e9 samples, {n_shards:,} shards, rank {world - 1} of {world}"
    return [
        (f"ShardSampler {label}: start of epoch (s)", t_start, "target < 1 s"),
        (f"ShardSampler {label}: peak memory (MiB)", mem, "target < 100 MB"),
        (f"ShardSampler {label}: indices/s (first 1M)", 1e6 / t_million, ""),
        (
            f"DistributedSampler {peer_n:.0e} samples: start of epoch (s)",
            t_peer,
            f"5e9 samples (linear): ~{t_peer * n / peer_n:,.0f} s",
        ),
        (
            f"DistributedSampler {peer_n:.0e} samples: peak memory (MiB)",
            mem_peer,
            f"5e9 samples (linear): ~{mem_peer * n / peer_n / 1024:,.0f} GiB",
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--sets", default="jpeg,small")
    ap.add_argument("--sampler", action="store_true", help="ShardSampler vs DistributedSampler benchmarks instead")
    args = ap.parse_args()
    specs = {"jpeg": (20, 1000, (20_000, 120_000)), "small": (20, 10_000, (800, 1200))}
    specs["sampler"] = (40, 500, (4_000, 16_000))  # quick set for the sampler benchmarks
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| measurement | value | ratio |\n|---|---|---|")
    for name in args.sets.split(","):
        n_shards, per, size = specs[name]
        paths = make_set(args.dir / name, name, n_shards, per, size)
        if args.sampler:
            index = tarindex.build_index(paths, index=Path(paths[0]).with_name(f"{name}.tarindex")).path
        for label, value, ratio in bench_sampler_order(index, name) if args.sampler else bench_set(paths, name):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if args.sampler:
        for label, value, ratio in bench_sampler_scale():
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
