"""Index scale benchmark: indexes of 1M, 10M (and 100M) samples written directly from synthetic shard tables.

Run: python tools/bench_index.py [--dir bench-data] [--sizes 1e6,1e7,1e8] [--parts 10]
     python tools/bench_index.py --many-shards 500000 [--tree /path/to/other/checkout]
(also ``tools/bench.py --only scale``). Every shard of a size is a hard link to one real tar of
1,000 one-member samples, so samples can be read; keys are unique (``SSSSSSiiii``). Per size:
index bytes per sample; writing the parts and merging them (seconds, peak RSS of the process);
cold open + first ``ds[i]`` (index pages read, by ``mincore`` after ``POSIX_FADV_DONTNEED``);
warm ``ds[i]`` against a 1,000-sample index over the same byte ranges; cold and warm ``get(key)``;
``ShardSampler`` start of epoch. Each measurement runs in a fresh process.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import multiprocessing as mp
import os
import random
import resource
import shutil
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

# --tree: measure another checkout's tarindex with the same code (an A/B)
sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else str(Path(__file__).resolve().parent.parent))

import tarindex
from tarindex.index.writer import IndexWriter
from tarindex.scan import scan_shard
from tarindex.tables import ShardInfo, ShardTable

_TREE = str(Path(tarindex.__file__).resolve().parent.parent)
PER_SHARD = 1_000
Row = tuple[str, float, str]


def _base_shard(root: Path) -> Path:
    path = root / "base.tar"
    if not path.exists():
        rng = random.Random(0)
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(PER_SHARD):
                data = bytes(rng.randrange(256) for _ in range(rng.randint(800, 1200)))
                info = tarfile.TarInfo(f"{i:06d}.bin")
                info.size = len(data)
                tf.addfile(info, BytesIO(data))
    return path


LINKS_PER_FILE = 60_000  # under ext4's 65,000 links per inode


def _origin(base: Path, s: int) -> Path:
    """The file shard ``s`` is a hard link to: ``base`` or, past ``LINKS_PER_FILE`` links, an identical copy
    with the same mtime (so one shard record describes every shard)."""
    k = s // LINKS_PER_FILE
    if k == 0:
        return base
    copy = base.with_name(f"base-{k}.tar")
    if not copy.exists():
        shutil.copy2(base, copy)
    return copy


def _links(root: Path, base: Path, n_shards: int) -> None:
    for s in range(n_shards):
        link = root / f"s{s:06d}.tar"
        if not link.exists():
            os.link(_origin(base, s), link)


def _renamed(base: Path, shard: Path, s: int, samples: Any = None) -> None:
    """Make ``shard`` (shard ``s``) a file of ``base``'s size and mtime holding ``base``'s samples (those in
    ``samples``, default all; the rest a hole, never read) with shard ``s``'s keys (``SSSSSSiiii``) as their
    members' names: a read checks the names against the index, which a hard link of ``base`` under these keys
    fails. Headers and data stay where they were, so one shard record still describes it."""
    raw = base.read_bytes()
    shard.unlink(missing_ok=True)
    with tarfile.open(base) as tf, open(shard, "wb") as out:
        out.truncate(len(raw))
        for i, member in enumerate(tf):
            if samples is not None and i not in samples:
                continue
            h = member.offset
            data = bytearray(raw[h : member.offset_data + member.size])
            data[:100] = f"{s:06d}{i:04d}.bin".encode().ljust(100, b"\x00")
            data[148:156] = b" " * 8
            data[148:156] = b"%06o\x00 " % sum(data[:512])
            out.seek(h)
            out.write(data)
    st = base.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _write_part(root: Path, out: Path, first: int, n_shards: int, part: tuple[int, int] | None, conn: Any) -> None:
    info, table = scan_shard(str(_base_shard(root)))
    t0 = time.perf_counter()
    with IndexWriter(out, part=part) as w:
        for s in range(first, first + n_shards):
            keys = [f"{s:06d}{i:04d}" for i in range(table.n_samples)]
            shard = ShardInfo(f"s{s:06d}.tar", info.size, info.mtime_ns, info.fingerprint, info.n_samples, info.n_members)
            cols = (table.sample_offset, table.sample_size, table.sample_nmembers, table.member_ext, table.member_offset)
            w.add(shard, ShardTable(*cols, table.member_size, keys, table.exts))
    conn.send((time.perf_counter() - t0, _hwm_mb()))


def _merge(parts: list[Path], out: Path, conn: Any) -> None:
    t0 = time.perf_counter()
    tarindex.merge_indexes(parts, out)
    conn.send((time.perf_counter() - t0, _hwm_mb()))


def _rebuild(root: Path, index: Path, n_shards: int, conn: Any) -> None:
    """``build_index`` over every shard of the index after one of them changed: an incremental rebuild."""
    t0 = time.perf_counter()
    report = tarindex.build_index([str(root / f"s{s:06d}.tar") for s in range(n_shards)], index=index, workers=1)
    conn.send((time.perf_counter() - t0, _hwm_mb(), len(report.scanned), len(report.reused)))


def _incremental(root: Path, index: Path, n_shards: int) -> tuple[float, float, int, int]:
    """Replace the middle shard's link by a copy with other bytes in its first member and a new mtime (only
    it is rescanned), rebuild, restore."""
    shard = root / f"s{n_shards // 2:06d}.tar"
    copy = shard.with_suffix(".copy")
    shutil.copyfile(shard, copy)
    with open(copy, "r+b") as f:  # the first member's data: the fingerprint (first and last 64 KiB) sees it
        f.seek(600)
        byte = f.read(1)
        f.seek(600)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.replace(copy, shard)
    os.utime(shard, ns=(time.time_ns(), time.time_ns()))
    try:
        return _child(_rebuild, root, index, n_shards)  # type: ignore[no-any-return]
    finally:
        shard.unlink()
        os.link(_origin(root / "base.tar", n_shards // 2), shard)


def _resident(path: Path) -> int:
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        buf = (ctypes.c_char * size).from_buffer(m)
        vec = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), size, vec)
        del buf
        m.close()
    return sum(b & 1 for b in vec.raw)


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def _cold(index: Path, n: int, conn: Any) -> None:
    """Cold open + first sample, cold get, warm gets, sampler start; in a fresh process."""
    i, key = n * 2 // 3 + 17, f"{(n // 3) // PER_SHARD:06d}{(n // 3) % PER_SHARD:04d}"
    dataset_type = tarindex.TarDataset  # the module imported before the clock starts: the index's cost is timed
    _evict(index)
    before = _resident(index)
    t0 = time.perf_counter()
    ds = dataset_type(index)
    ds[i]
    t_open = time.perf_counter() - t0
    pages_open = _resident(index) - before
    _evict(index)
    before = _resident(index)
    t0 = time.perf_counter()
    ds.index.lookup(key)
    t_get_cold = time.perf_counter() - t0
    pages_get = _resident(index) - before
    # Another key, its sample's record block read first: the pages its lookup adds are the key table's (the
    # B-tree path and the bucket). Pages this process has mapped stay cached, so no eviction here: these are unread.
    other = n // 5 + 3
    ds.index.record(other)
    before = _resident(index)
    ds.index.lookup(f"{other // PER_SHARD:06d}{other % PER_SHARD:04d}")
    pages_table = _resident(index) - before
    shards = np.random.default_rng(1).integers(0, n // PER_SHARD, 20_000).tolist()
    keys = [f"{s:06d}{k:04d}" for s, k in zip(shards, np.random.default_rng(2).integers(0, PER_SHARD, 20_000).tolist())]
    t0 = time.perf_counter()
    for k in keys:
        ds.index.lookup(k)
    t_get = (time.perf_counter() - t0) / len(keys)
    t0 = time.perf_counter()
    sampler = tarindex.ShardSampler(ds, 8, 7, seed=1)
    sampler.set_epoch(3)
    next(iter(sampler))
    t_sampler = time.perf_counter() - t0
    conn.send(
        {"open_ms": t_open * 1e3, "open_kb": pages_open * mmap.PAGESIZE / 1024, "get_cold_ms": t_get_cold * 1e3,
         "get_cold_pages": pages_get, "get_table_pages": pages_table, "get_us": t_get * 1e6, "sampler_s": t_sampler}
    )  # fmt: skip


def _values(index: Path) -> dict[str, tuple[int, int]]:
    """Values and their bytes by key prefix (``b/`` records, ``k/`` key table, ``s/`` shard records, ...):
    what the file holds beyond them is LMDB's pages (B-tree, the unused end of overflow pages)."""
    import lmdb

    found: dict[str, tuple[int, int]] = {}
    env = lmdb.open(str(index), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        for key, value in txn.cursor():
            prefix = bytes(key[:2]).decode("latin-1")
            count, total = found.get(prefix, (0, 0))
            found[prefix] = (count + 1, total + len(value))
    env.close()
    return found


def _child(fn: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=fn, args=(*args, send))
    proc.start()
    result = recv.recv()
    proc.join()
    return result


def _open_limit() -> int:
    """Raise this process's open-file limit as far as allowed; the limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _warm_order(n: int, n_open: int, reads: int = 200_000) -> tuple[list[int], np.ndarray]:
    """The samples :func:`_warm_reads` reads (random samples of ``n_open`` shards spread over an index of ``n``
    samples: every ``step``-th shard) and their shards."""
    n_shards = -(-n // PER_SHARD)
    step = -(-n_shards // min(n_open, n_shards))
    rng = np.random.default_rng(0)
    shards = rng.integers(0, -(-n_shards // step), reads) * step
    return np.minimum(shards * PER_SHARD + rng.integers(0, PER_SHARD, reads), n - 1).tolist(), shards


def _warm_counts(n: int, counts: list[int]) -> list[int]:
    """The counts of shards open that :func:`_warm` measures: fewer where the file limit says so."""
    return sorted({min(c, _open_limit() - 1024, -(-n // PER_SHARD)) for c in counts})


def _warm_reads(ds: Any, n_open: int, reads: int = 200_000) -> tuple[float, float, int]:
    """Warm ``ds.read`` of random samples of ``n_open`` shards spread over the whole index (every ``step``-th
    shard), and a bare ``os.pread`` loop over the same byte ranges through the same descriptors (the physical
    limit with that many files open): best of 3 alternating passes each, after one pass that opens and warms.
    Returns (read us, pread us, shards open)."""
    order, shards = _warm_order(len(ds), n_open, reads)
    read = ds.read
    for j in order:
        read(j)
    fds = ds._opener.fds  # the dataset's own descriptors: the same open files, no second set
    ranges = []
    for j in order:
        shard, offset, size = ds.index.record(j)[:3]
        ranges.append((fds[shard], size, offset))
    pread = os.pread
    best_read = best_pread = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for j in order:
            read(j)
        best_read = min(best_read, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for fd, size, offset in ranges:
            pread(fd, size, offset)
        best_pread = min(best_pread, time.perf_counter() - t0)
    return best_read / reads * 1e6, best_pread / reads * 1e6, len(set(shards.tolist()))


def _warm(index: Path, counts: list[int], conn: Any) -> None:
    """Warm reads of ``index`` with each count of shards open (fewer where the file limit says so); in a fresh process."""
    got = []
    for count in _warm_counts(len(tarindex.IndexReader(index)), counts):
        ds = tarindex.TarDataset(index, max_open_files=count + 1)
        got.append(_warm_reads(ds, count))
        ds.close()
    conn.send(got)


def bench_warm(root: Path, index: Path, label: str) -> list[Row]:
    """Warm ``ds[i]`` of ``index`` against the 1,000-sample index of the same shard, each beside a bare pread
    loop over the same byte ranges and descriptors: 64 shards open (the default ``max_open_files``), 1,000, and
    as many as the file limit allows."""
    ((ref, ref_pread, _),) = _child(_warm, root / "one.tarindex", [1])
    rows: list[Row] = [("warm ds[i], 1,000-sample index (us)", ref, f"bare pread of the same ranges {ref_pread:.2f} us")]
    counts = [64, 1_000, 10**9]
    n = len(tarindex.IndexReader(index))
    wanted: dict[int, set[int]] = {}
    for count in _warm_counts(n, counts):
        for j in _warm_order(n, count)[0]:
            wanted.setdefault(j // PER_SHARD, set()).add(j % PER_SHARD)
    base = root / "base.tar"
    for s, samples in wanted.items():  # the samples read, under their keys (the other shards stay hard links)
        _renamed(base, root / f"s{s:06d}.tar", s, samples)
    try:
        measured = _child(_warm, index, counts)
    finally:
        for s in wanted:
            (root / f"s{s:06d}.tar").unlink()
            os.link(_origin(base, s), root / f"s{s:06d}.tar")
    for read_us, pread_us, n_open in measured:
        rows.append((f"{label}: warm ds[i], samples of {n_open:,} shards open (us)", read_us,
                     f"{read_us / ref:.2f}x the 1,000-sample index (target <= 1.5x); bare pread of the same ranges and "
                     f"descriptors {pread_us:.2f} us; ds[i] - pread {read_us - pread_us:.2f} us vs {ref - ref_pread:.2f} "
                     f"at 1,000 samples"))  # fmt: skip
    return rows


def _small_index(root: Path) -> None:
    """The 1,000-sample index of one shard: the reference the large ones are compared with."""
    index = root / "one.tarindex"
    if not index.exists():
        tarindex.build_index([str(root / "s000000.tar")], index=index, workers=1)


def bench_index_scale(work: Path, sizes: list[int], n_parts: int, incremental: bool = False) -> list[Row]:
    root = work / "index-scale"
    root.mkdir(parents=True, exist_ok=True)
    base = _base_shard(root)
    rows: list[Row] = []
    _links(root, base, 1)
    _small_index(root)
    for n in sizes:
        n_shards = n // PER_SHARD
        _links(root, base, n_shards)
        per_part = -(-n_shards // n_parts)
        parts, t_write, rss_write = [], 0.0, 0.0
        for k in range(n_parts):
            part = root / f"scale-{n}.part-{k + 1:03d}-of-{n_parts}.tarindex"
            first = k * per_part
            t, rss = _child(_write_part, root, part, first, min(per_part, n_shards - first), (k + 1, n_parts))
            t_write, rss_write = t_write + t, max(rss_write, rss)
            parts.append(part)
        index = root / f"scale-{n}.tarindex"
        t_merge, rss_merge = _child(_merge, parts, index)
        for part in parts:
            part.unlink()
        label = f"{n / 1e6:g}M samples, {n_shards:,} shards"
        size = index.stat().st_size
        rows += [
            (f"{label}: index bytes per sample", size / n, f"{size / 2**20:,.1f} MiB; 5e9 samples: {size / n * 5e9 / 2**30:,.0f} GiB"),
            (f"{label}: of which values (B/sample)", sum(b for _, b in _values(index).values()) / n,
             "; ".join(f"{p}: {b / n:.2f} in {c:,}" for p, (c, b) in sorted(_values(index).items()))),
            (f"{label}: write {n_parts} parts (s, total)", t_write, f"peak RSS {rss_write:,.0f} MB per part"),
            (f"{label}: merge {n_parts} parts (s)", t_merge, f"peak RSS {rss_merge:,.0f} MB; target < 1 GB"),
        ]
        for row in rows:
            print(f"| {row[0]} | {row[1]:,.2f} | {row[2]} |", flush=True)
        del rows[:]
        read = root / f"s{(n * 2 // 3 + 17) // PER_SHARD:06d}.tar"  # the shard of _cold's first ds[i]
        _renamed(base, read, (n * 2 // 3 + 17) // PER_SHARD)
        try:
            cold = _child(_cold, index, n)
        finally:
            read.unlink()
            os.link(_origin(base, (n * 2 // 3 + 17) // PER_SHARD), read)
        rows += [
            (f"{label}: cold open + first ds[i] (ms)", cold["open_ms"], f"{cold['open_kb']:,.0f} KiB of the index read; target <= 1 MB, < 20 ms"),
            (f"{label}: cold get(key) (ms)", cold["get_cold_ms"], f"{cold['get_cold_pages']} pages of the index read, {cold['get_table_pages']} of them for the key table "
             "(B-tree path and bucket: another key's lookup, its record block read first); target <= 2"),
            (f"{label}: warm get(key) (us)", cold["get_us"], ""),
            (f"{label}: ShardSampler start of epoch (s)", cold["sampler_s"], "rank 7 of 8"),
        ]
        rows += bench_warm(root, index, label)
        if incremental:
            t, rss, scanned, reused = _incremental(root, index, n_shards)
            rows.append((f"{label}: incremental rebuild, one shard changed (s)", t,
                         f"peak RSS {rss:,.0f} MB (target < 1 GB); {scanned} scanned, {reused:,} reused"))
        for row in rows:
            print(f"| {row[0]} | {row[1]:,.2f} | {row[2]} |", flush=True)
        del rows[:]
        index.unlink()
    return rows


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _write_many(root: Path, out: Path, n_shards: int, conn: Any) -> None:
    """An index of ``n_shards`` shards of 2 samples each (records of one real tar's first two samples)."""
    info, table = scan_shard(str(_base_shard(root)))
    two = ShardTable(table.sample_offset[:2], table.sample_size[:2], table.sample_nmembers[:2], table.member_ext[:2],
                     table.member_offset[:2], table.member_size[:2], table.keys[:2], table.exts)  # fmt: skip
    t0 = time.perf_counter()
    with IndexWriter(out) as w:
        for s in range(n_shards):
            two.keys = [f"{s:06d}0000", f"{s:06d}0001"]
            w.add(ShardInfo(f"s{s:06d}.tar", info.size, info.mtime_ns, info.fingerprint, 2, 2), two)
    conn.send((time.perf_counter() - t0, _hwm_mb()))


def _open_many(index: Path, i: int, conn: Any) -> None:
    """Cold open + ds[i] of a many-shard index: time, memory added, index pages read; in a fresh process."""
    import lmdb  # noqa: F401 - imported before the baseline, as a dataset does
    import numpy  # noqa: F401

    dataset = tarindex.TarDataset  # its module imported before the clock starts
    _evict(index)
    before, rss = _resident(index), _rss_mb()
    t0 = time.perf_counter()
    ds = dataset(index)
    t_open = time.perf_counter() - t0
    ds[i]
    t_first = time.perf_counter() - t0
    conn.send({"open_ms": t_open * 1e3, "first_ms": t_first * 1e3, "rss_mb": _rss_mb() - rss,
               "read_kb": (_resident(index) - before) * mmap.PAGESIZE / 1024})  # fmt: skip


def bench_many_shards(work: Path, n_shards: int) -> list[Row]:
    """Opening an index of ``n_shards`` shards (issue 19.3: 500,000 shards took 17 s and 527 MB)."""
    root = work / "index-scale"
    root.mkdir(parents=True, exist_ok=True)
    _links(root, _base_shard(root), 1)
    index = root / f"shards-{n_shards}.tarindex"
    t_write, rss_write = _child(_write_many, root, index, n_shards)
    i = 2 * (n_shards // 2)  # the first sample of the middle shard
    _renamed(root / "base.tar", root / f"s{n_shards // 2:06d}.tar", n_shards // 2)
    try:
        got = _child(_open_many, index, i)
    finally:
        os.unlink(root / f"s{n_shards // 2:06d}.tar")
    size = index.stat().st_size
    index.unlink()
    label = f"{n_shards:,} shards of 2 samples"
    return [
        (f"{label}: write the index (s)", t_write, f"peak RSS {rss_write:,.0f} MB; {size / 2**20:,.1f} MiB"),
        (f"{label}: cold open (ms)", got["open_ms"], ""),
        (f"{label}: cold open + first ds[i] (ms)", got["first_ms"], f"{got['read_kb']:,.0f} KiB of the index read"),
        (f"{label}: memory added by open + first ds[i] (MB)", got["rss_mb"], "VmRSS after - before"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default="bench-data", type=Path)
    ap.add_argument("--sizes", default="1e6,1e7")
    ap.add_argument("--parts", type=int, default=10)
    ap.add_argument("--incremental", action="store_true", help="also rebuild each index after one shard changed")
    ap.add_argument("--many-shards", type=int, default=0, help="instead: open an index of this many shards")
    ap.add_argument("--warm", type=Path, help="instead: warm ds[i] of this index (made by an earlier run, kept)")
    ap.add_argument("--tree", default=_TREE, help="the checkout whose tarindex is measured (default: this one)")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}; tarindex from {tarindex.__file__}")
    print("| measurement | value | note |\n|---|---|---|")
    if args.warm:
        root = args.dir / "work" / "index-scale"
        _small_index(root)
        rows = bench_warm(root, args.warm, args.warm.name)
    elif args.many_shards:
        rows = bench_many_shards(args.dir / "work", args.many_shards)
    else:
        rows = bench_index_scale(args.dir / "work", sizes, args.parts, args.incremental)
    for label, value, note in rows:
        print(f"| {label} | {value:,.2f} | {note} |", flush=True)


if __name__ == "__main__":
    main()
