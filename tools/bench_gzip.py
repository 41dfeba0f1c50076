"""gzip shards (``--only gzip`` of tools/bench.py): indexing vs ``gzip -dc``, random ``ds.read`` through
seek points vs plain tar, ``tarindex compress`` output and the naive read (decompress from the start of the
shard for each sample), and the seek-point spacing table (index bytes vs samples/s).
"""

from __future__ import annotations

import os
import random
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import tarindex
from tarindex import gzip_random

Row = tuple[str, float, str]


def _gz_copies(paths: list[str], out: Path) -> list[str]:
    """Each shard as ``gzip -6`` output (one member, as ``tar czf`` writes), made once."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for p in paths:
        gz = out / (Path(p).name + ".gz")
        if not gz.exists():
            with open(gz, "wb") as f:
                subprocess.run(["gzip", "-6", "-c", p], stdout=f, check=True)
        files.append(str(gz))
    return files


def _best(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best-of-``repeat`` seconds of each function, the functions run alternately."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def _reads(index: Path, order: list[int]) -> float:
    ds = tarindex.TarDataset(index)
    ds.read(order[0])
    read = ds.read
    t = time.perf_counter()
    for i in order:
        read(i)
    t = time.perf_counter() - t
    ds.close()
    return t


def _naive(gz: str, offset: int, size: int) -> bytes:
    """A sample read by decompressing the shard from its start (what a reader without seek points does)."""
    d = zlib.decompressobj(31)
    out = bytearray()
    with open(gz, "rb") as f:
        while len(out) < offset + size:
            out += d.decompress(f.read(1 << 20))
    return bytes(out[offset : offset + size])


def bench_gzip(paths: list[str], name: str, work: Path) -> list[Row]:
    from bench import _zstd_copies

    from tarindex.scan import scan_shard

    rows: list[Row] = []
    gz = _gz_copies(paths, work / f"gzip-{name}")
    raw = sum(os.path.getsize(p) for p in paths)

    def gunzip() -> None:
        for g in gz:
            subprocess.run(["gzip", "-dc", g], stdout=subprocess.DEVNULL, check=True)

    best = _best({"gzip": gunzip, "scan": lambda: [scan_shard(g) for g in gz]}, 3)
    rows.append((f"{name}: gzip -dc > /dev/null (MB of tar/s)", raw / best["gzip"] / 1e6, "physical limit (one core)"))
    rows.append((
        f"{name}: index .tar.gz with seek points, one process (MB of tar/s)",
        raw / best["scan"] / 1e6,
        f"{best['gzip'] / best['scan']:.2f}x gzip -dc (target >= 0.8x)",
    ))

    _, framed = _zstd_copies(paths, work / f"zstd-{name}")
    ix = {k: work / f"gzip-{name}-{k}.tarindex" for k in ("plain", "gzip", "zstd")}
    tarindex.build_index(paths, index=ix["plain"])
    tarindex.build_index(gz, index=ix["gzip"])
    tarindex.build_index(framed, index=ix["zstd"])
    ds = tarindex.TarDataset(ix["plain"])
    n = ds.index.n_samples
    order = list(range(n))
    random.Random(0).shuffle(order)
    order = order[:1000]
    t = {k: min(_reads(v, order) for _ in range(2)) for k, v in ix.items()}
    rows.append((f"{name}: plain tar, ds.read random order (samples/s)", len(order) / t["plain"], "baseline"))
    rows.append((f"{name}: tarindex compress (zstd), ds.read random order (samples/s)", len(order) / t["zstd"], f"{t['plain'] / t['zstd']:.2f}x plain tar"))
    rows.append((
        f"{name}: .tar.gz, seek points every {gzip_random.SPACING >> 10} KiB, ds.read random order (samples/s)",
        len(order) / t["gzip"],
        f"{t['plain'] / t['gzip']:.3f}x plain tar; {1e3 * t['gzip'] / len(order):.2f} ms per sample",
    ))
    from tarindex.index.reader import IndexReader

    table0 = IndexReader(ix["gzip"]).shard_table(0)
    picks = random.Random(3).sample(range(table0.n_samples), min(20, table0.n_samples))
    gds = tarindex.TarDataset(ix["gzip"])

    def naive() -> None:
        for j in picks:
            _naive(gz[0], int(table0.sample_offset[j]), int(table0.sample_size[j]))

    def points() -> None:
        for j in picks:
            gds.read(j)

    pair = _best({"naive": naive, "points": points}, 2)  # the same 20 samples of shard 0, alternately
    rows.append((
        f"{name}: .tar.gz, naive read from the shard start (samples/s)",
        len(picks) / pair["naive"],
        f"seek points {pair['naive'] / pair['points']:.0f}x faster on the same samples (target >= 50x); "
        f"shard {os.path.getsize(paths[0]) >> 20} MiB of tar",
    ))

    sub = gz[:1]
    tar_size = os.path.getsize(paths[0])
    default = gzip_random.SPACING
    for spacing in (256 << 10, 512 << 10, 1 << 20, 4 << 20):
        gzip_random.SPACING = spacing
        try:
            sx = work / f"gzip-{name}-sp{spacing}.tarindex"
            tarindex.build_index(sub, index=sx)
        finally:
            gzip_random.SPACING = default
        table = IndexReader(sx).gzip_points(0) or b""
        m = tarindex.TarDataset(sx).index.n_samples
        so = list(range(m))
        random.Random(1).shuffle(so)
        so = so[:500]
        ts = min(_reads(sx, so) for _ in range(2))
        rows.append((
            f"{name}: seek points every {spacing >> 10} KiB: samples/s | index bytes per MB of tar",
            len(so) / ts,
            f"{len(table) / (tar_size / 1e6):,.0f} B/MB ({100 * len(table) / tar_size:.2f}% of the tar, {len(gzip_random.SeekPoints(table, 'b'))} points)",
        ))
    return rows
