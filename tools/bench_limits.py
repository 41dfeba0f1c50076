"""Peak memory of one large member streamed from a compressed shard (``TarStream``).

Run: ``python tools/bench_limits.py [--dir bench-data] [--size-mib 1024] [--trees A,B] [--repeat 2]``
(``tools/bench.py --only member`` runs it with the defaults). Two shards are made once under
``--dir``/work/member: one member of ``--size-mib`` MiB of zeros in a ``.tar.zst`` (one zstd frame,
streamed) and a ``.tar.gz`` (zlib level 1). Each measurement is a fresh process (``TARINDEX_PURE_PYTHON``
set or not) that imports tarindex and torch, raises the expansion-ratio bound (zeros compress ~1,000x
with gzip, ~30,000x with zstd), then streams the shard: the peak RSS above the RSS before streaming
(``ru_maxrss``, MiB) and the seconds. ``--trees``: source trees (each with its extension built) measured
alternately, for before/after figures from one run. ``--small``: instead, samples/s of ``TarStream``
(``read_ahead=0``) over the first 4 shards of the 1 KB set (``--dir``/small), plain and as one zstd frame
each, per tree: the cost of the bound checks where members are small.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import zstandard

Row = tuple[str, float, str]

_CHILD = """
import resource, sys, time
import tarindex, tarindex.stream
from tarindex.compression import Limits, set_limits
set_limits(Limits(max_ratio=1e12))
path, size = sys.argv[1], int(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
got = [len(s["bin"]) for s in tarindex.TarStream([path])]
seconds = time.perf_counter() - t
assert got == [size], got
print(before // 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, f"{seconds:.2f}")
"""


_SMALL_CHILD = """
import glob, os, sys, time
import tarindex, tarindex.stream
import zstandard
paths, zdir = sys.argv[1:5], sys.argv[5]
zpaths = []
for p in paths:
    z = os.path.join(zdir, os.path.basename(p) + ".zst")
    if not os.path.exists(z):
        with open(p, "rb") as f, open(z + ".tmp", "wb") as out:
            out.write(zstandard.ZstdCompressor(level=1).compress(f.read()))
        os.rename(z + ".tmp", z)
    zpaths.append(z)
rates = []
for ps in (paths, zpaths):
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        n = sum(1 for _ in tarindex.TarStream(ps, read_ahead=0))
        best = min(best, time.perf_counter() - t)
    rates.append(n / best)
print(*rates)
"""


def bench_small(data: Path, work: Path, trees: list[str], repeat: int = 5) -> list[Row]:
    """Samples/s of TarStream over 4 shards of 1 KB samples, plain and zstd, per tree (best of ``repeat``
    processes, the trees alternating; each process best of 3 passes)."""
    paths = [str(p) for p in sorted((data / "small").glob("small-*.tar"))[:4]]
    zdir = work / "small-zst"
    zdir.mkdir(parents=True, exist_ok=True)
    best = {tree: [0.0, 0.0] for tree in trees}
    for _ in range(repeat):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, "-c", _SMALL_CHILD, *paths, str(zdir)], env=env, cwd=tree,
                                 capture_output=True, text=True, check=True).stdout.split()
            best[tree] = [max(b, float(x)) for b, x in zip(best[tree], out)]
    base = best[trees[0]]
    rows: list[Row] = []
    for tree in trees:
        for k, kind in enumerate(("plain", "zstd")):
            label = f"TarStream, 4 shards of 1 KB samples, {kind}, {os.path.basename(tree.rstrip('/'))} (samples/s)"
            rows.append((label, best[tree][k], f"{best[tree][k] / base[k]:.2f}x {os.path.basename(trees[0].rstrip('/'))}"))
    return rows


def _write_shard(path: Path, size: int) -> Path:
    """A tar of one member ``big.bin`` of ``size`` zero bytes, compressed by the suffix (streamed: never in memory)."""
    if path.exists():
        return path
    header = tarfile.TarInfo("big.bin")
    header.size = size
    tar_head = header.tobuf(tarfile.GNU_FORMAT)
    tar_tail = bytes(-size % 512 + 1024)
    if path.suffix == ".zst":
        compress = zstandard.ZstdCompressor(level=1).compressobj()
        write, flush = compress.compress, compress.flush
    else:
        deflate = zlib.compressobj(1, zlib.DEFLATED, 31)
        write, flush = deflate.compress, deflate.flush
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(write(tar_head))
        block = bytes(1 << 20)
        for _ in range(size >> 20):
            f.write(write(block))
        f.write(write(bytes(size & ((1 << 20) - 1)) + tar_tail))
        f.write(flush())
    tmp.rename(path)
    return path


def _measure(tree: str, shard: Path, size: int, pure: bool) -> tuple[int, float]:
    """Peak RSS above the start of streaming (MiB) and seconds, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": tree}
    env.pop("TARINDEX_PURE_PYTHON", None)
    if pure:
        env["TARINDEX_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", _CHILD, str(shard), str(size)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[1]) - int(out[0]), float(out[2])


def bench_member(work: Path, size_mib: int = 1024, trees: list[str] | None = None, repeat: int = 2) -> list[Row]:
    """Peak RSS above the start (MiB) of streaming one ``size_mib`` member of zeros, per codec, lane and tree
    (best of ``repeat``, the trees alternating); the ratio is to the member's size."""
    trees = trees or [str(Path(__file__).resolve().parent.parent)]
    size = size_mib << 20
    root = work / "member"
    root.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for suffix in (".tar.zst", ".tar.gz"):
        shard = _write_shard(root / f"zeros-{size_mib}m{suffix}", size)
        for pure in (False, True):
            best = {tree: (float("inf"), float("inf")) for tree in trees}
            for _ in range(repeat):
                for tree in trees:
                    rss, seconds = _measure(tree, shard, size, pure)
                    best[tree] = (min(best[tree][0], rss), min(best[tree][1], seconds))
            for tree in trees:
                rss, seconds = best[tree]
                lane = "Python" if pure else "C"
                label = f"TarStream, one {size_mib} MiB member, {suffix}, {lane} lane, {os.path.basename(tree.rstrip('/'))}: peak RSS above start (MiB)"
                rows.append((label, rss, f"{rss / size_mib:.2f}x the member, {seconds:.1f} s"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--trees", default=None, help="comma-separated source trees to compare (default: this one)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="TarStream over 1 KB samples instead (see above)")
    args = ap.parse_args()
    work = args.dir / "work"
    trees = args.trees.split(",") if args.trees else None
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| measurement | value | ratio |\n|---|---|---|")
    if args.small:
        rows = bench_small(args.dir, work, trees or [str(Path(__file__).resolve().parent.parent)], args.repeat)
    else:
        rows = bench_member(work, args.size_mib, trees, args.repeat)
    for label, value, ratio in rows:
        print(f"| {label} | {value:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
