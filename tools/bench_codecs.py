"""Focused codec benchmarks: random ``ds.read`` over compressed shards (samples/s, best of N).

Run: ``python tools/bench_codecs.py zstd [--no-cache] [--repeat N]`` (A/B: run it with
``PYTHONPATH`` pointing at each tree, alternately); ``padding``: ``TarStream`` and ``scan_shard`` over a
tar of 100 samples followed by 8 GiB of zeros in one zstd frame (263 KB). Data is generated once under ``--dir``:
20,000 samples of a 1 KB ``.bin`` (partly compressible) and a ``.cls``, as a plain tar and its
``tarindex compress`` output.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tarfile
import time
from pathlib import Path

import numpy as np

import tarindex


def small_tar(root: Path, n: int = 20_000) -> Path:
    tar = root / "small.tar"
    if not tar.exists():
        rng = np.random.default_rng(0)
        with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(n):
                for ext, data in (("bin", rng.integers(0, 60, 1000, dtype=np.uint8).tobytes()), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"k{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return tar


def random_reads(shard: Path, repeat: int) -> tuple[float, int]:
    """Best samples/s of ``repeat`` passes of ``ds.read`` in a fixed random order."""
    index = shard.with_name(f"{shard.name}-{os.getpid()}.tarindex")
    tarindex.build_index([shard], index=index, workers=1)
    try:
        ds = tarindex.TarDataset(index)
        order = list(range(len(ds)))
        random.Random(1).shuffle(order)
        best = 0.0
        for _ in range(repeat):
            t = time.perf_counter()
            for i in order:
                ds.read(i)
            best = max(best, len(order) / (time.perf_counter() - t))
        ds.close()
        return best, len(order)
    finally:
        index.unlink(missing_ok=True)


def padded_shard(root: Path) -> Path:
    """100 small samples, then 8 GiB of zeros after the end-of-archive marker, as one zstd frame."""
    out = root / "pad8g.tar.zst"
    if not out.exists():
        import zstandard

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(100):
                data = f"x{i}".encode() * 300
                info = tarfile.TarInfo(f"s{i:03d}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        cobj = zstandard.ZstdCompressor(level=1).compressobj()
        with open(out, "wb") as f:
            f.write(cobj.compress(buf.getvalue()))
            zeros = bytes(1 << 20)
            for _ in range(8 << 10):
                f.write(cobj.compress(zeros))
            f.write(cobj.flush())
    return out


def padding(root: Path, repeat: int) -> None:
    import tarindex.stream  # torch's import, outside the timing
    from tarindex.scan import scan_shard

    shard = padded_shard(root)
    for _ in range(repeat):
        t = time.perf_counter()
        n = sum(1 for _ in tarindex.TarStream([str(shard)]))
        streamed = time.perf_counter() - t
        t = time.perf_counter()
        scan_shard(str(shard))
        print(f"padding: TarStream {n} samples {streamed:.2f} s; scan_shard (build) {time.perf_counter() - t:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codec", choices=["zstd", "plain", "padding"])
    parser.add_argument("--dir", default="bench-data/codecs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cache", action="store_true", help="frame cache off: every read decompresses")
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.codec == "padding":
        padding(root, args.repeat)
        return
    tar = small_tar(root)
    if args.codec == "zstd":
        from tarindex.shard_writer import compress_shard

        shard = root / "small.tar.zst"
        if not shard.exists():
            compress_shard(tar, shard)
        if args.no_cache:
            try:
                from tarindex.zstd_random import frame_cache
            except ImportError:  # a tree before the split, for A/B runs
                from tarindex.zstd import frame_cache  # type: ignore[attr-defined,no-redef]

            frame_cache().max_bytes = 0
    else:
        shard = tar
    rate, n = random_reads(shard, args.repeat)
    print(f"{args.codec}{' (no frame cache)' if args.no_cache else ''}: random ds.read {rate:,.0f} samples/s "
          f"(best of {args.repeat}, {n} samples)")


if __name__ == "__main__":
    main()
