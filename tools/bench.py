"""Benchmarks, side by side with the peers and the physical limit, as ratios in one run.

Run: python tools/bench.py [--dir bench-data] [--sets jpeg,small] [--only build,access,loader,open]
Data is generated on first use (real JPEGs of 20-120 KB with .cls and .json; 1 KB samples).
Results go to stdout as a markdown table; record them in docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import resource
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

import tarindex
from tarindex.index.format import ShardInfo, ShardTable
from tarindex.index.writer import IndexWriter

Row = tuple[str, float, str]
SPECS = {"jpeg": (20, 1000, (20_000, 120_000)), "small": (20, 10_000, (800, 1200))}


# -- data ------------------------------------------------------------------------------


def _jpeg(rng: np.random.Generator, noise: np.ndarray, target: int) -> bytes:
    from PIL import Image

    side = int((target / 0.7) ** 0.5)  # noise at quality 80 costs about 0.7 bytes per pixel
    y, x = (int(v) for v in rng.integers(0, noise.shape[0] - side, 2))
    out = io.BytesIO()
    Image.fromarray(noise[y : y + side, x : x + side]).save(out, "JPEG", quality=80)
    return out.getvalue()


def make_set(root: Path, name: str, n_shards: int, per_shard: int, size_range: tuple[int, int]) -> list[str]:
    """Shards of ``per_shard`` samples (main member + ``.cls`` + ``.json``), made once and reused."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 255, (600, 600, 3), dtype=np.uint8)
    paths = []
    for s in range(n_shards):
        p = root / f"{name}-{s:06d}.tar"
        paths.append(str(p))
        if p.exists():
            continue
        tmp = p.with_suffix(".tmp")
        with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(per_shard):
                size = int(rng.integers(*size_range))
                if name == "jpeg":
                    main = ("jpg", _jpeg(rng, noise, size))
                else:
                    main = ("bin", rng.integers(0, 255, size, dtype=np.uint8).tobytes())
                members = dict([main, ("cls", str(i % 1000).encode()), ("json", json.dumps({"i": i}).encode())])
                for ext, data in members.items():
                    ti = tarfile.TarInfo(f"{s:03d}{i:06d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        tmp.rename(p)
    return paths


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- build -----------------------------------------------------------------------------


def bench_build(paths: list[str], name: str, index: Path) -> list[Row]:
    def tarfile_scan() -> None:
        for p in paths:
            with tarfile.open(p) as tf:
                for _ in tf:
                    pass

    def build() -> None:
        index.unlink(missing_ok=True)
        tarindex.build_index(paths, index=index)

    t_tarfile = timed(tarfile_scan, 2)
    t_build = timed(build, 2)
    ratio = f"{t_tarfile / t_build:.1f}x faster than a tarfile scan ({t_tarfile:.2f} s); target >= 10x"
    return [(f"{name}: build index, default workers (s)", t_build, ratio)]


# -- random access -----------------------------------------------------------------------


def _wids(ds: tarindex.TarDataset) -> Callable[[int], object] | None:
    try:
        import wids
    except ImportError:
        return None
    shards = [{"url": u, "nsamples": n} for u, n in zip(ds.urls, ds.shard_sizes)]
    # every shard kept open, no copy into a cache: wids at its fastest
    w = wids.ShardListDataset(shards, localname=lambda url: url, lru_size=len(shards), transformations=[])
    start = 0
    for n in ds.shard_sizes:  # open (and let wids index) every shard before timing
        w[start]
        start += n
    return w.__getitem__


def bench_access(ds: tarindex.TarDataset, name: str) -> list[Row]:
    n = len(ds)
    order = list(range(n))
    random.Random(0).shuffle(order)
    ix = ds.index
    s_shard, s_off, s_size = ix.column("sample_shard"), ix.column("sample_offset"), ix.column("sample_size")
    fds = [os.open(u, os.O_RDONLY) for u in ds.urls]
    ranges = [(fds[s_shard[i]], s_size[i], s_off[i]) for i in order]
    pread = os.pread

    def pread_loop() -> None:
        for fd, size, off in ranges:
            pread(fd, size, off)

    read, getitem = ds.read, ds.__getitem__
    t_pread = timed(pread_loop, 3)
    t_read = timed(lambda: [read(i) for i in order], 3)
    t_item = timed(lambda: [getitem(i) for i in order], 3)
    for fd in fds:
        os.close(fd)
    rows = [
        (f"{name}: bare os.pread loop, random order (samples/s)", n / t_pread, "physical limit"),
        (f"{name}: TarDataset.read, random order (samples/s)", n / t_read, f"{t_pread / t_read:.2f}x the pread loop; target >= 0.8x"),
        (f"{name}: TarDataset[i], random order (samples/s)", n / t_item, f"{t_pread / t_item:.2f}x the pread loop"),
    ]
    w = _wids(ds)
    if w is not None:
        sub = order[: min(n, 50_000)]
        t_w = timed(lambda: [w(i) for i in sub]) * n / len(sub)
        rows.append((f"{name}: wids.ShardListDataset, all shards open (samples/s)", n / t_w, f"TarDataset.read is {t_w / t_read:.1f}x wids; target >= 5x"))
    return rows


# -- DataLoader scaling --------------------------------------------------------------------


def bench_loader(index: Path, name: str, samples: int = 6000) -> list[Row]:
    import torch

    ds = tarindex.TarDataset(index, decode="torch")
    sub = list(range(len(ds)))
    random.Random(1).shuffle(sub)
    sub = sub[:samples]

    def run(workers: int) -> float:
        loader = torch.utils.data.DataLoader(ds, sampler=sub, batch_size=None, num_workers=workers)
        t0 = time.perf_counter()
        count = sum(1 for _ in loader)
        assert count == len(sub)
        return time.perf_counter() - t0

    t1 = min(run(0) for _ in range(2))
    t2 = min(run(2) for _ in range(2))
    return [
        (f"{name}: ds[i] decode='torch', one process (samples/s)", len(sub) / t1, ""),
        (f"{name}: DataLoader(num_workers=2), decode='torch' (samples/s)", len(sub) / t2, f"{t1 / t2:.2f}x one process; target >= 1.6x"),
    ]


# -- index size scaling ----------------------------------------------------------------------


def _scaled_index(source: tarindex.TarDataset, out: Path, n_samples: int) -> Path:
    """An index of ``n_samples`` samples whose byte ranges cycle over the real samples of shard 0."""
    if out.exists():
        return out
    table = source.index.shard_table(0)
    reps = -(-n_samples // table.n_samples)
    per = int(table.sample_nmembers[0])  # every bench sample has the same members
    n_members = n_samples * per

    def tile(a: np.ndarray, count: int) -> np.ndarray:
        return np.tile(a, reps)[:count]

    scaled = ShardTable(
        tile(table.sample_offset, n_samples),
        tile(table.sample_size, n_samples),
        tile(table.sample_nmembers, n_samples),
        tile(table.member_ext, n_members),
        tile(table.member_offset, n_members),
        tile(table.member_size, n_members),
        [f"k{i:09d}" for i in range(n_samples)],
        table.exts,
    )
    info = source.index.shards[0]
    path = os.path.relpath(source.urls[0], out.parent)
    with IndexWriter(out) as w:
        w.add(ShardInfo(path, info.size, info.mtime_ns, info.fingerprint, n_samples, n_members), scaled)
    return out


def bench_open(ds: tarindex.TarDataset, name: str, work: Path) -> list[Row]:
    rows: list[Row] = []
    costs = {}
    for n in (1_000, 1_000_000):
        path = _scaled_index(ds, work / f"{name}-scaled-{n}.tarindex", n)
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        big = tarindex.TarDataset(path)
        big[n - 1]
        t_open = time.perf_counter() - t0
        rss = _rss_mb() - rss0
        order = np.random.default_rng(0).integers(0, n, 50_000).tolist()
        read = big.read
        costs[n] = timed(lambda: [read(i) for i in order], 3) / len(order)
        rows.append((f"{name}: open a {n:,}-sample index + first sample (ms)", t_open * 1e3, f"+{rss:.1f} MB RSS; target < 50 ms, < 30 MB"))
        big.close()
    rows.append((f"{name}: TarDataset.read cost, 1M vs 1k-sample index (us)", costs[1_000_000] * 1e6, f"{costs[1_000_000] / costs[1_000]:.2f}x the 1k index ({costs[1_000] * 1e6:.2f} us)"))
    return rows


# -- main ------------------------------------------------------------------------------------


def run_set(name: str, paths: list[str], only: set[str], work: Path) -> Iterator[Row]:
    index = work / f"{name}.tarindex"
    if "build" in only or not index.exists():
        rows = bench_build(paths, name, index)
        if "build" in only:
            yield from rows
    ds = tarindex.TarDataset(index)
    if "access" in only:
        yield from bench_access(ds, name)
    if "loader" in only and name == "jpeg":
        yield from bench_loader(index, name)
    if "open" in only and name == "small":
        yield from bench_open(ds, name, work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--sets", default="jpeg,small")
    ap.add_argument("--only", default="build,access,loader,open")
    args = ap.parse_args()
    only = set(args.only.split(","))
    work = args.dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}; peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
    print("| measurement | value | ratio |\n|---|---|---|")
    for name in args.sets.split(","):
        n_shards, per, size = SPECS[name]
        paths = make_set(args.dir / name, name, n_shards, per, size)
        for label, value, ratio in run_set(name, paths, only, work):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
