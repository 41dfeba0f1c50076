"""Shards on storage with latency: today's read paths through a FUSE mount that waits 1 ms per read, each
beside what the same mount allows in the same run, and random samples from a cold local disk.

Run: python tools/bench.py --dir bench-data --sets small --only latency   (or this file: --dir, --delay, --rounds)

The 1 KB set's first 4 shards (``small``), mounted read-only by ``tests/_latencyfs.py`` in a process of its
own at ``<dir>/work/latency-mnt`` (page cache and the kernel's 128 KiB readahead: requests of up to 128
KiB; the streaming rows again with ``direct_io``: no cache, requests of the reader's size). Every pass
starts cold: the shards' pages are dropped (``posix_fadvise(DONTNEED)``) on the mount, or on the local disk
for the DataLoader rows. The cases of a row group alternate, pass by pass, for ``rounds`` rounds (5); each
figure is the best pass. The physical limit is the same ranges read by threads with a bare ``os.pread``
(64 for samples, 8 reading 1 MiB blocks for a whole shard), through the same mount.

Rows: ``ds[i]`` loop and one thread's bare ``pread`` loop (1/latency); ``ds.__getitems__(256 random)``
against 64 threads; ``TarStream`` of one shard against 8 threads reading 1 MiB blocks and a plain
``read(1 MiB)`` loop; ``tarindex build`` of one shard (the CLI, and ``build_index(workers=1)`` in this
process) against ``cat``; cold local disk: ``DataLoader(batch_size=256, num_workers=2)`` of random samples,
one process's ``__getitems__`` and 64 threads' ``pread`` of the same samples; how far the mount overlaps
64 threads' 4 KiB reads at 1 ms and 10 ms (its own ceiling: the CPU of a FUSE round trip and a Python
callback, some 5,000-10,000 reads/s on 2 cores). The FUSE reads a pass made and their mean size are in
the ratio column (what the later read paths change).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tarindex

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _latencyfs import LatencyMount, drop_cache, mount  # the test suite's harness

Row = tuple[str, float, str]
BATCH = 256
THREADS = 64
BLOCK = 1 << 20
BLOCK_THREADS = 8


def _identity(batch: list[object]) -> list[object]:
    return batch


class _Pass:
    """One timed pass of a case: seconds, and what reached the mount (reads, bytes)."""

    def __init__(self, mnt: LatencyMount | None, cold: list[str]) -> None:
        self.mnt, self.cold = mnt, cold

    def __call__(self, fn: Callable[[], object]) -> tuple[float, int, int]:
        drop_cache(self.cold)
        if self.mnt is not None:
            self.mnt.reset_stats()
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        if self.mnt is None:
            return elapsed, 0, 0
        stats = self.mnt.stats()
        return elapsed, stats.reads, stats.read_bytes


def _best(cases: dict[str, Callable[[], object]], timed: _Pass, rounds: int) -> dict[str, tuple[float, int, int]]:
    """Each case's best pass; the cases alternate in every round."""
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(rounds):
        for label, fn in cases.items():
            got = timed(fn)
            if label not in best or got[0] < best[label][0]:
                best[label] = got
    return best


def _reads(got: tuple[float, int, int]) -> str:
    _, reads, nbytes = got
    return f"{reads:,} FUSE reads, {nbytes / max(reads, 1) / 1024:,.1f} KiB each" if reads else "no FUSE read"


def _sample_ranges(ds: tarindex.TarDataset, order: list[int], fds: list[int]) -> list[tuple[int, int, int]]:
    rec = ds.index.decode()
    shard, offset, size = rec.shard.tolist(), rec.offset.tolist(), rec.size.tolist()
    return [(fds[shard[i]], size[i], offset[i]) for i in order]


def _threaded_preads(pool: ThreadPoolExecutor, ranges: list[tuple[int, int, int]], threads: int) -> None:
    pread = os.pread

    def run(part: list[tuple[int, int, int]]) -> None:
        for fd, size, off in part:
            pread(fd, size, off)

    list(pool.map(run, [ranges[k::threads] for k in range(threads)]))


def _samples(ds: tarindex.TarDataset, mnt: LatencyMount, urls: list[str], rounds: int, n_items: int, n_batches: int) -> list[Row]:
    """ds[i] and __getitems__ through the mount, beside bare preads of the same ranges."""
    rng = random.Random(0)
    n = len(ds)
    items = [rng.randrange(n) for _ in range(n_items)]
    batches = [[rng.randrange(n) for _ in range(BATCH)] for _ in range(n_batches)]
    fds = [os.open(u, os.O_RDONLY) for u in urls]
    pool = ThreadPoolExecutor(THREADS)
    try:
        item_ranges = _sample_ranges(ds, items, fds)
        batch_ranges = [_sample_ranges(ds, b, fds) for b in batches]
        getitem = ds.__getitem__
        getitem(0)  # the dataset opens its shards here, as the pread loops' were opened above
        pread = os.pread

        def item_loop() -> None:
            for i in items:
                getitem(i)

        def pread_loop() -> None:
            for fd, size, off in item_ranges:
                pread(fd, size, off)

        def getitems() -> None:
            for b in batches:
                ds.__getitems__(b)

        def threaded() -> None:
            for r in batch_ranges:  # batch after batch, as a loader asks them
                _threaded_preads(pool, r, THREADS)

        timed = _Pass(mnt, urls)
        best = _best({"item": item_loop, "pread": pread_loop, "getitems": getitems, "threads": threaded}, timed, rounds)
    finally:
        pool.shutdown()
        for fd in fds:
            os.close(fd)
    rate = {k: (n_items if k in ("item", "pread") else n_batches * BATCH) / v[0] for k, v in best.items()}
    return [
        ("ds[i] loop, random (samples/s)", rate["item"], f"{rate['item'] / rate['pread']:.2f}x one thread's bare pread loop; {_reads(best['item'])}"),
        ("bare os.pread loop, one thread, same kind of ranges (samples/s)", rate["pread"], f"1/latency; {_reads(best['pread'])}"),
        (f"ds.__getitems__({BATCH} random) (samples/s)", rate["getitems"],
         f"{rate['getitems'] / rate['threads']:.2f}x {THREADS} threads, {rate['getitems'] / rate['item']:.2f}x ds[i]; {_reads(best['getitems'])}"),
        (f"same ranges, {THREADS} threads' bare os.pread (samples/s)", rate["threads"],
         f"physical limit through the mount: {rate['threads'] / rate['pread']:.1f}x one thread; {_reads(best['threads'])}"),
    ]


def _stream(shard: str, mnt: LatencyMount, rounds: int, work: Path, with_build: bool) -> list[Row]:
    """TarStream (and build) of one shard through the mount, beside 8 threads reading 1 MiB blocks, a plain
    read(1 MiB) loop and cat."""
    size = os.path.getsize(shard)
    mb = size / 1e6
    pool = ThreadPoolExecutor(BLOCK_THREADS)
    index = work / "latency-build.tarindex"

    def stream() -> None:
        for _ in tarindex.TarStream([shard]):
            pass

    def blocks() -> None:
        fd = os.open(shard, os.O_RDONLY)
        try:
            offs = list(range(0, size, BLOCK))
            list(pool.map(lambda part: [os.pread(fd, BLOCK, o) for o in part], [offs[k::BLOCK_THREADS] for k in range(BLOCK_THREADS)]))
        finally:
            os.close(fd)

    def read_loop() -> None:
        with open(shard, "rb", buffering=0) as f:
            while f.read(BLOCK):
                pass

    def cli_build() -> None:
        index.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-c", "from tarindex.cli.main import main; main()", "build", "-q", "-w", "1", "-o", str(index), shard], check=True)

    def build_here() -> None:
        index.unlink(missing_ok=True)
        tarindex.build_index([shard], index=index, workers=1)

    def cat() -> None:
        subprocess.run(["cat", shard], stdout=subprocess.DEVNULL, check=True)

    cases: dict[str, Callable[[], object]] = {"stream": stream, "blocks": blocks, "read": read_loop}
    if with_build:
        cases.update({"cli": cli_build, "here": build_here, "cat": cat})
    try:
        best = _best(cases, _Pass(mnt, [shard]), rounds)
    finally:
        pool.shutdown()
        index.unlink(missing_ok=True)
    rate = {k: mb / v[0] for k, v in best.items()}
    how = "direct_io" if mnt.direct_io else "page cache"
    rows = [
        (f"{how}: TarStream of one shard (MB/s)", rate["stream"], f"{rate['stream'] / rate['blocks']:.3f}x {BLOCK_THREADS} threads' 1 MiB blocks; {_reads(best['stream'])}"),
        (f"{how}: {BLOCK_THREADS} threads reading the shard in 1 MiB blocks (MB/s)", rate["blocks"], f"physical limit; {_reads(best['blocks'])}"),
        (f"{how}: plain read(1 MiB) loop (MB/s)", rate["read"], f"{rate['read'] / rate['blocks']:.3f}x {BLOCK_THREADS} threads; {_reads(best['read'])}"),
    ]
    if with_build:
        rows += [
            (f"{how}: tarindex build -w 1 of one {mb:.0f} MB shard, CLI (s)", best["cli"][0],
             f"{best['cat'][0] / best['cli'][0]:.3f}x cat, {best['blocks'][0] / best['cli'][0]:.3f}x {BLOCK_THREADS} threads; {_reads(best['cli'])}"),
            (f"{how}: build_index(workers=1) of the shard, in this process (s)", best["here"][0],
             f"{best['cat'][0] / best['here'][0]:.3f}x cat, {best['blocks'][0] / best['here'][0]:.3f}x {BLOCK_THREADS} threads; {_reads(best['here'])}"),
            (f"{how}: cat of the shard (s)", best["cat"][0], f"{mb / best['cat'][0]:,.0f} MB/s; {_reads(best['cat'])}"),
        ]
    return rows


def _cold_disk(paths: list[str], work: Path, rounds: int, n_batches: int) -> list[Row]:
    """Random samples from the local disk with the shards' pages dropped before each pass."""
    import torch.utils.data

    ds = tarindex.TarDataset(tarindex.build_index(paths, index=work / "latency-local.tarindex").path)
    rng = random.Random(1)
    batches = [[rng.randrange(len(ds)) for _ in range(BATCH)] for _ in range(n_batches)]
    fds = [os.open(u, os.O_RDONLY) for u in paths]
    pool = ThreadPoolExecutor(THREADS)
    ranges = [_sample_ranges(ds, b, fds) for b in batches]

    def loader() -> None:
        got = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=2, collate_fn=_identity)
        if sum(len(b) for b in got) != n_batches * BATCH:
            raise RuntimeError("DataLoader lost samples")

    def getitems() -> None:
        for b in batches:
            ds.__getitems__(b)

    def threaded() -> None:
        for r in ranges:
            _threaded_preads(pool, r, THREADS)

    try:
        ds[0]
        best = _best({"loader": loader, "getitems": getitems, "threads": threaded}, _Pass(None, paths), rounds)
    finally:
        pool.shutdown()
        for fd in fds:
            os.close(fd)
    rate = {k: n_batches * BATCH / v[0] for k, v in best.items()}
    return [
        (f"cold local disk: DataLoader(batch_size={BATCH}, num_workers=2), random (samples/s)", rate["loader"],
         f"{rate['loader'] / rate['threads']:.3f}x {THREADS} threads' pread; {rate['loader'] / rate['getitems']:.2f}x one process"),
        (f"cold local disk: ds.__getitems__({BATCH} random), one process (samples/s)", rate["getitems"], f"{rate['getitems'] / rate['threads']:.3f}x {THREADS} threads' pread"),
        (f"cold local disk: same ranges, {THREADS} threads' bare os.pread (samples/s)", rate["threads"], "physical limit"),
    ]


def _overlap(shard: str, mnt: LatencyMount, rounds: int, threads: int = THREADS, per_thread: int = 10) -> list[Row]:
    """4 KiB reads at random offsets, one thread beside ``threads`` threads: how far the mount overlaps them."""
    size = os.path.getsize(shard)
    rng = random.Random(2)
    fd = os.open(shard, os.O_RDONLY)
    ranges = [(fd, 4096, rng.randrange(size >> 12) << 12) for _ in range(threads * per_thread)]
    pool = ThreadPoolExecutor(threads)

    def one() -> None:
        for fd_, n, off in ranges[: threads * per_thread // 8]:
            os.pread(fd_, n, off)

    try:
        best = _best({"one": one, "many": lambda: _threaded_preads(pool, ranges, threads)}, _Pass(mnt, []), rounds)
    finally:
        pool.shutdown()
        os.close(fd)
    one_rate, many_rate = len(ranges) // 8 / best["one"][0], len(ranges) / best["many"][0]
    ms = f"{mnt.delay * 1e3:g} ms, direct_io"
    return [
        (f"{ms}: 4 KiB preads, one thread (reads/s)", one_rate, _reads(best["one"])),
        (f"{ms}: 4 KiB preads, {threads} threads (reads/s)", many_rate, f"{many_rate / one_rate:.1f}x one thread; {_reads(best['many'])}"),
    ]


def _mountpoint(work: Path, name: str) -> Path:
    """A fixed mount point: the index built through it stands for the next run (a stat per shard)."""
    mnt = work / name
    mnt.mkdir(parents=True, exist_ok=True)
    return mnt


def bench_latency(paths: list[str], name: str, work: Path, *, delay: float = 0.001, rounds: int = 5) -> list[Row]:
    """The rows of this module's docstring for ``paths`` (the 1 KB set's first 4 shards)."""
    src = Path(paths[0]).resolve().parent
    _ = tarindex.TarStream  # torch's import, before anything is timed
    rows: list[Row] = []
    label = f"{name}, {len(paths)} shards, {delay * 1e3:g} ms per read"
    with mount(src, _mountpoint(work, "latency-mnt"), delay=delay) as mnt:
        urls = mnt.paths(paths)
        ds = tarindex.TarDataset(tarindex.build_index(urls, index=work / f"latency-{name}.tarindex").path)
        rows += [(f"{label}: {what}", v, r) for what, v, r in _samples(ds, mnt, urls, rounds, n_items=1000, n_batches=4)]
        rows += [(f"{label}: {what}", v, r) for what, v, r in _stream(urls[0], mnt, rounds, work, with_build=True)]
        ds.close()
    with mount(src, _mountpoint(work, "latency-mnt-direct"), delay=delay, direct_io=True) as mnt:
        rows += [(f"{label}: {what}", v, r) for what, v, r in _stream(mnt.paths(paths)[0], mnt, rounds, work, with_build=False)]
        rows += [(f"{name}: {what}", v, r) for what, v, r in _overlap(mnt.paths(paths)[0], mnt, rounds)]
    with mount(src, _mountpoint(work, "latency-mnt-direct"), delay=10 * delay, direct_io=True) as mnt:
        rows += [(f"{name}: {what}", v, r) for what, v, r in _overlap(mnt.paths(paths)[0], mnt, rounds)]
    rows += [(f"{name}, {len(paths)} shards: {what}", v, r) for what, v, r in _cold_disk(paths, work, rounds, n_batches=16)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="bench-data", type=Path, help="bench.py's data directory (the small set is made there on first use)")
    ap.add_argument("--delay", type=float, default=0.001, help="seconds per read (default 0.001)")
    ap.add_argument("--rounds", type=int, default=5, help="passes of each case, alternated (the best counts)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import SPECS, make_set

    n_shards, per, size = SPECS["small"]
    paths = make_set(args.dir / "small", "small", n_shards, per, size)[:4]
    work = args.dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    print("| measurement | value | ratio |\n|---|---|---|")
    for label, value, ratio in bench_latency(paths, "small", work, delay=args.delay, rounds=args.rounds):
        print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
