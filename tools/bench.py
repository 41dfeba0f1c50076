"""Benchmarks, side by side with the peers and the physical limit, as ratios in one run.

Run: python tools/bench.py [--dir bench-data] [--sets jpeg,small] [--only build,access,loader,open,stream,resume,mix,zstd,sampler,sampler_zstd,scale]
``--sets jpeg-ustar,jpeg-wds,jpeg-posix,jpeg-gnu``: the first shards of a set as they are and rewritten by
webdataset's TarWriter, GNU tar --format=posix and GNU tar with long names (``WRITERS``).
Every part but ``remote``, ``member`` and ``batches`` runs by default; ``--only`` picks some (``loader``: images/s into a
training batch, the PIL baseline, webdataset, wids and ``tarindex.decode.Image`` at 1 and 2 DataLoader workers on two
generated JPEG sets, tools/bench_loader.py, with a chart in docs/loader.png; ``walk``: the tar walk alone, TarStream and
index tables, in one process; ``--only walk --trees A,B``: the walk of two source trees over each cursor, alternated
processes, tools/bench_walk.py; ``--only remote``: random access over loopback nginx with 20 ms added per
request, tools/bench_remote.py; ``--only member``: peak memory of one 1 GiB member streamed from a
.tar.zst and a .tar.gz, tools/bench_limits.py; ``--only batches``: the walk's batch size against two streams
read one after the other, alternated and mixed, and over nginx; ``--only gzip``: .tar.gz shards through seek points on the first 2
shards, or ``--zstd-shards N``, tools/bench_gzip.py, not by default; ``--only latency --sets small``: the small set's
first 4 shards through a FUSE mount with 1 ms per read, each path beside the physical limit, and random
samples from a cold local disk, tools/bench_latency.py, not by default; ``--only pack``: making shards,
tools/bench_pack.py, not by default; ``--only export --sets ''``: ``tarindex export --dali``/``--wids`` of a
1M-sample index beside ``cp`` of its output, tools/bench_export.py, not by default; ``--only readcheck --sets
small,small-wds,small-posix,jpeg``: the cost of each read's header check, on / off alternated in one process per
lane, tools/bench_readcheck.py, not by default). ``--only stream,quick``: the streaming benchmark over
4 shards per set; ``--zstd-shards N``: the zstd benchmarks (zstd, sampler_zstd) on the first N shards;
``--sets sampler``: a quick set. ``--only scale --sets ''``: indexes of ``--sizes`` samples written in
``--parts`` parts and merged, an index of ``--many-shards`` shards opened (tools/bench_index.py), the
sampler at 5e9 samples.
Data is generated on first use (real JPEGs of 20-120 KB with .cls and .json; 1 KB samples).
Results go to stdout as a markdown table; record them in docs/performance.md (one current table per workload),
then ``--chart docs/performance.png`` redraws the page's chart from its tables (tools/bench_chart.py).
Needs the ``bench`` extra (webdataset, wids, mfusepy, matplotlib): ``pip install -c constraints.txt -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import resource
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

import tarindex
from tarindex.index.merge import placed
from tarindex.index.writer import IndexWriter
from tarindex.tables import ShardInfo, ShardTable

Row = tuple[str, float, str]
ZSTD_SHARDS: list[int | None] = [None]  # --zstd-shards
SPECS = {
    "jpeg": (20, 1000, (20_000, 120_000)),
    "small": (20, 10_000, (800, 1200)),
    "sampler": (40, 500, (4_000, 16_000)),  # a quick set for the sampler benchmarks
}
WRITERS = {
    "ustar": "the set's own shards (tarfile, short names: plain ustar headers only)",
    "wds": "webdataset.TarWriter defaults: a PAX header before every member (float mtime)",
    "posix": "GNU tar --format=posix: a PAX header before every member",
    "gnu": "GNU tar default format, names under a 120-character directory: a GNU 'L' header before every member",
}
"""Sets made of another set's samples by another writer: ``--sets jpeg-wds,small-posix``, ... (the first
``VARIANT_SHARDS`` shards of the set; compare with the same shards as written by tarfile: ``--sets jpeg``)."""
VARIANT_SHARDS = 4


# -- data ------------------------------------------------------------------------------


def _jpeg(rng: np.random.Generator, noise: np.ndarray, target: int) -> bytes:
    from PIL import Image

    side = int((target / 0.7) ** 0.5)  # noise at quality 80 costs about 0.7 bytes per pixel
    y, x = (int(v) for v in rng.integers(0, noise.shape[0] - side, 2))
    out = io.BytesIO()
    Image.fromarray(noise[y : y + side, x : x + side]).save(out, "JPEG", quality=80)
    return out.getvalue()


def make_set(
    root: Path, name: str, n_shards: int, per_shard: int, size_range: tuple[int, int],
    main: Callable[[np.random.Generator], tuple[str, bytes]] | None = None,
) -> list[str]:
    """Shards of ``per_shard`` samples (main member + ``.cls`` + ``.json``), made once and reused; ``main``:
    the main member from a generator seeded by the shard number (else noise JPEGs or random bytes)."""
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
        own = np.random.default_rng(s)
        with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tf:
            for i in range(per_shard):
                if main is not None:
                    main_member = main(own)
                else:
                    size = int(rng.integers(*size_range))
                    main_member = ("jpg", _jpeg(rng, noise, size)) if name == "jpeg" else ("bin", rng.integers(0, 255, size, dtype=np.uint8).tobytes())
                members = dict([main_member, ("cls", str(i % 1000).encode()), ("json", json.dumps({"i": i}).encode())])
                for ext, data in members.items():
                    ti = tarfile.TarInfo(f"{s:03d}{i:06d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        tmp.rename(p)
    return paths


def make_variant(root: Path, base: list[str], name: str, writer: str) -> list[str]:
    """The first ``VARIANT_SHARDS`` shards of ``base`` rewritten by ``writer`` (see ``WRITERS``), made once."""
    import shutil
    import subprocess
    import tempfile

    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for src in base[:VARIANT_SHARDS]:
        p = root / Path(src).name.replace(name.split("-")[0], name)
        paths.append(str(p))
        if p.exists():
            continue
        tmp = p.with_suffix(".tmp")
        with tarfile.open(src) as tf:
            members = [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]  # type: ignore[union-attr]
        if writer == "ustar":
            shutil.copyfile(src, tmp)
        elif writer == "wds":
            import webdataset as wds

            with wds.TarWriter(str(tmp)) as out:
                sample: dict[str, object] = {}
                for member, data in members:
                    key, ext = member.split(".", 1)
                    if sample and sample["__key__"] != key:
                        out.write(sample)
                        sample = {}
                    sample.setdefault("__key__", key)
                    sample[ext] = data
                out.write(sample)
        else:
            tree = Path(tempfile.mkdtemp(dir=root))
            prefix = "d" * 120 + "/" if writer == "gnu" else ""
            for member, data in members:
                (tree / prefix).mkdir(parents=True, exist_ok=True)
                (tree / (prefix + member)).write_bytes(data)
            names = [prefix + m for m, _ in members]
            fmt = ["--format=posix"] if writer == "posix" else []
            subprocess.run(["tar", *fmt, "--no-recursion", "-C", str(tree), "-cf", str(tmp), *names], check=True)
            shutil.rmtree(tree)
        tmp.rename(p)
    return paths


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _rss_mb() -> tuple[float, float]:
    """(private, file-backed) resident memory in MB."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value = line.split(":")
                found[key] = int(value.split()[0]) / 1024
    return found["RssAnon"], found["RssFile"]


# -- build -----------------------------------------------------------------------------


def tarfile_scan(paths: list[str]) -> None:
    """The peer: every member header of every shard, by tarfile."""
    for p in paths:
        with tarfile.open(p) as tf:
            for _ in tf:
                pass


def bench_build(paths: list[str], name: str, index: Path) -> list[Row]:
    def build() -> None:
        index.unlink(missing_ok=True)
        tarindex.build_index(paths, index=index)

    def rebuild() -> None:  # the same shards, none changed: the index stands
        tarindex.build_index(paths, index=index)

    def build_here() -> None:  # one process: the scan and the write without a pool's start-up
        index.unlink(missing_ok=True)
        tarindex.build_index(paths, index=index, workers=1)

    t_tarfile = timed(lambda: tarfile_scan(paths), 3)
    t_build = timed(build, 5)
    t_here = timed(build_here, 5)
    t_rebuild = timed(rebuild, 3)
    ratio = f"{t_tarfile / t_build:.1f}x faster than a tarfile scan ({t_tarfile:.2f} s); target >= 10x"
    unchanged = f"{t_rebuild / t_build:.1%} of a fresh build, {t_rebuild / len(paths) * 1e6:,.0f} us per shard; target: a stat per shard"
    return [
        (f"{name}: build index, default workers (ms)", t_build * 1e3, ratio),
        (f"{name}: build index, one process (ms)", t_here * 1e3, f"{t_tarfile / t_here:.1f}x faster than a tarfile scan in one process"),
        (f"{name}: rebuild, nothing changed (s)", t_rebuild, unchanged),
    ]


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
    rec = ix.decode()
    s_shard, s_off, s_size = rec.shard.tolist(), rec.offset.tolist(), rec.size.tolist()
    fds = [os.open(u, os.O_RDONLY) for u in ds.urls]
    ranges = [(fds[s_shard[i]], s_size[i], s_off[i]) for i in order]
    pread = os.pread

    def pread_loop() -> None:
        for fd, size, off in ranges:
            pread(fd, size, off)

    ds.read(order[0])  # the dataset opens its files here, as the pread loop's were opened above
    read, getitem = ds.read, ds.__getitem__

    def read_loop() -> None:
        for i in order:
            read(i)

    def item_loop() -> None:
        for i in order:
            getitem(i)

    t_pread = timed(pread_loop, 3)
    t_read = timed(read_loop, 3)
    t_item = timed(item_loop, 3)
    for fd in fds:
        os.close(fd)
    rows = [
        (f"{name}: bare os.pread loop, random order (samples/s)", n / t_pread, "physical limit"),
        (f"{name}: TarDataset.read, random order (samples/s)", n / t_read, f"{t_pread / t_read:.2f}x the pread loop; target >= 0.8x"),
        (f"{name}: TarDataset[i], random order (samples/s)", n / t_item, f"{t_pread / t_item:.2f}x the pread loop"),
    ]
    try:
        w = _wids(ds)
    except Exception as exc:  # a peer's failure on this set is a finding, not the end of the run
        rows.append((f"{name}: wids.ShardListDataset fails on this set", 0.0, f"{type(exc).__name__}: {exc}"[:120]))
        w = None
    if w is not None:
        sub = order[: min(n, 50_000)]
        def wids_loop() -> None:
            for i in sub:
                w(i)

        t_w = timed(wids_loop) * n / len(sub)
        rows.append((f"{name}: wids.ShardListDataset, all shards open (samples/s)", n / t_w, f"TarDataset.read is {t_w / t_read:.1f}x wids; target >= 5x"))
    return rows


# -- DataLoader scaling --------------------------------------------------------------------


def _train_view(sample: dict) -> dict:
    """What a training step keeps: a 128x128 centre crop of the image tensor and the label."""
    img = sample["jpg"]
    _, h, w = img.shape
    top, left = (h - 128) // 2, (w - 128) // 2
    return {"image": img[:, top : top + 128, left : left + 128], "label": sample["cls"]}


def bench_loader(index: Path, name: str, samples: int = 6000) -> list[Row]:
    """DataLoader scaling on a training-style pipeline: decode JPEG to a tensor, crop, batch of 32."""
    import torch

    ds = tarindex.TarDataset(index, decode="torchrgb8", transform=_train_view)
    sub = list(range(len(ds)))
    random.Random(1).shuffle(sub)
    sub = sub[:samples]

    def run(workers: int, batch_size: int | None) -> float:
        loader = torch.utils.data.DataLoader(ds, sampler=sub, batch_size=batch_size, num_workers=workers)
        t0 = time.perf_counter()
        count = sum(len(b["label"]) if batch_size else 1 for b in loader)
        if count != len(sub):
            raise RuntimeError(f"DataLoader gave {count} samples, not {len(sub)}")
        return time.perf_counter() - t0

    rows: list[Row] = []
    for batch in (32, None):
        t1 = min(run(0, batch) for _ in range(2))
        t2 = min(run(2, batch) for _ in range(2))
        what = f"batch_size={batch}"
        target = "; target >= 1.6x" if batch else " (each sample crosses the process boundary alone)"
        rows.append((f"{name}: decode + crop, {what}, one process (samples/s)", len(sub) / t1, ""))
        rows.append((f"{name}: decode + crop, {what}, DataLoader(num_workers=2) (samples/s)", len(sub) / t2, f"{t1 / t2:.2f}x one process{target}"))
    return rows


# -- index size scaling ----------------------------------------------------------------------


def _scaled_index(source: tarindex.TarDataset, out: Path, n_samples: int) -> Path:
    """An index of ``n_samples`` samples whose records cycle over the first 1,000 samples of shard 0 (keys
    included: a read checks the members' names against its record).

    Every scaled index reads the same 1,000 byte ranges, so only the index's size differs between them.
    """
    if out.exists():
        return out
    table = source.index.shard_table(0)
    per = int(table.sample_nmembers[0])  # every bench sample has the same members
    base = min(table.n_samples, 1_000)
    table = ShardTable(
        table.sample_offset[:base],
        table.sample_size[:base],
        table.sample_nmembers[:base],
        table.member_ext[: base * per],
        table.member_offset[: base * per],
        table.member_size[: base * per],
        table.keys[:base],
        table.exts,
    )
    reps = -(-n_samples // base)
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
        (table.keys * reps)[:n_samples],
        table.exts,
    )
    info = source.index.shards[0]
    path = os.path.relpath(source.urls[0], out.parent)
    with IndexWriter(out) as w:
        w.add(placed(ShardInfo(path, info.size, info.mtime_ns, info.fingerprint, n_samples, n_members), path, "file"), scaled)  # outside its directory
    return out


def _read_all(read: Callable[[int], object], order: list[int]) -> None:
    for i in order:
        read(i)


def bench_open(ds: tarindex.TarDataset, name: str, work: Path) -> list[Row]:
    rows: list[Row] = []
    costs = {}
    for n in (1_000, 1_000_000):
        path = _scaled_index(ds, work / f"{name}-scaled1k-{n}.tarindex", n)
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        big = tarindex.TarDataset(path)
        big[n - 1]
        t_open = time.perf_counter() - t0
        anon, mapped = (after - before for after, before in zip(_rss_mb(), rss0))
        order = np.random.default_rng(0).integers(0, n, 50_000).tolist()
        costs[n] = timed(lambda big=big, order=order: _read_all(big.read, order), 3) / len(order)
        rows.append((f"{name}: open a {n:,}-sample index + first sample (ms)", t_open * 1e3, f"+{anon:.1f} MB private memory, +{mapped:.1f} MB of the index file mapped; target < 50 ms, < 30 MB"))
        big.close()
    rows.append((f"{name}: TarDataset.read cost, 1M vs 1k-sample index (us)", costs[1_000_000] * 1e6, f"{costs[1_000_000] / costs[1_000]:.2f}x the 1k index ({costs[1_000] * 1e6:.2f} us)"))
    return rows


# -- streaming ---------------------------------------------------------------------------------


def _stream_pass(urls: list[str]) -> int:
    return sum(1 for _ in tarindex.TarStream(urls))


def bench_stream(paths: list[str], name: str, work: Path, max_shards: int | None = None) -> list[Row]:
    """TarStream from the page cache, a pipe and loopback nginx, beside webdataset and ``cat``."""
    import shutil
    import subprocess
    import tempfile

    paths = paths[:max_shards] if max_shards else paths
    total_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    n = _stream_pass(paths)  # also warms the page cache
    t_cat = timed(lambda: subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True), 3)
    t_local = timed(lambda: _stream_pass(paths), 3)
    rows: list[Row] = [(f"{name}: cat shards > /dev/null (MB/s)", total_mb / t_cat, "physical limit (page cache)")]
    t_wds = None
    try:
        import webdataset as wds

        t_wds = timed(lambda: sum(1 for _ in wds.WebDataset(paths, shardshuffle=False)), 1)
        rows.append((f"{name}: webdataset.WebDataset raw iteration (samples/s)", n / t_wds, "peer"))
    except ImportError:
        pass
    vs_wds = f"{t_wds / t_local:.1f}x webdataset (target >= 5x); " if t_wds else ""
    rows.append(
        (f"{name}: TarStream local files (samples/s)", n / t_local, f"{vs_wds}{total_mb / t_local:,.0f} MB/s")
    )
    rows.append(
        (f"{name}: TarStream local files (MB/s)", total_mb / t_local, f"{t_cat / t_local:.2f}x cat (target >= 0.5x)")
    )
    import torch.utils.data

    def loader_pass() -> int:
        loader = torch.utils.data.DataLoader(tarindex.TarStream(paths), batch_size=None, num_workers=2)
        return sum(1 for _ in loader)

    t_loader = timed(loader_pass, 2)
    rows.append(
        (f"{name}: TarStream, DataLoader(num_workers=2) (samples/s)", n / t_loader, f"{t_local / t_loader:.2f}x one process")
    )

    def loader_batched_pass() -> int:  # one message per 64 samples between the processes
        loader = torch.utils.data.DataLoader(tarindex.TarStream(paths).batched(64), batch_size=None, num_workers=2)
        return sum(len(b["__key__"]) for b in loader)

    t_batched = timed(loader_batched_pass, 2)
    rows.append(
        (f"{name}: TarStream.batched(64), DataLoader(num_workers=2) (samples/s)", n / t_batched,
         f"{t_local / t_batched:.2f}x one process, {t_loader / t_batched:.1f}x one message per sample")
    )
    t_pipe = timed(lambda: _stream_pass([f"pipe:cat {p}" for p in paths]), 2)
    rows.append((f"{name}: TarStream pipe:cat (MB/s)", total_mb / t_pipe, f"{t_local / t_pipe:.2f}x local files"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _servers import start_nginx, stop  # the test suite's nginx launcher (a foreground child process)

    root = Path(paths[0]).parent.resolve()
    started = start_nginx(root, Path(tempfile.mkdtemp(dir=work)))
    if started is None:
        rows.append((f"{name}: TarStream over HTTP", float("nan"), "nginx did not start"))
        return rows
    proc, port = started
    try:
        urls = [f"http://127.0.0.1:{port}/{Path(p).name}" for p in paths]
        t_http = float("inf")
        for _ in range(3):  # alternating with local passes: the ratio is not a drift of the machine's speed
            t_http = min(t_http, timed(lambda: _stream_pass(urls)))
            t_local = min(t_local, timed(lambda: _stream_pass(paths)))
        rows.append(
            (f"{name}: TarStream over HTTP, loopback nginx (MB/s)", total_mb / t_http,
             f"{t_local / t_http:.2f}x local files (best of 6, {total_mb / t_local:,.0f} MB/s; target >= 0.5x)")
        )
        if shutil.which("curl"):
            t_curl = timed(lambda: [subprocess.run(["curl", "-s", "-o", "/dev/null", u], check=True) for u in urls], 2)
            rows.append((f"{name}: curl over HTTP, loopback nginx (MB/s)", total_mb / t_curl, "network limit"))
    finally:
        stop(proc)
    return rows


# -- resume ------------------------------------------------------------------------------------


def bench_resume(paths: list[str], name: str, work: Path) -> list[Row]:
    """TarStream resumed at 10/50/90% of an epoch (shuffle=1000): time to the first resumed sample and
    the state's size, for the set's shards locally and over loopback nginx, plain and as zstd (``tarindex
    compress``: frames and a seek table; and one frame per shard, as the zstd CLI writes: no frame table)."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _servers import start_nginx, stop  # the test suite's nginx launcher

    single, framed = _zstd_copies(paths, work / f"zstd-{name}")
    n = _stream_pass(paths)
    kw = {"shuffle": 1000, "seed": 0}
    rows: list[Row] = []

    def first_sample(stream: tarindex.TarStream) -> float:
        """Milliseconds from ``iter()`` to the first sample."""
        t0 = time.perf_counter()
        next(iter(stream))
        return (time.perf_counter() - t0) * 1000

    local = {"local": paths, "local zstd (tarindex compress)": framed, "local zstd (one frame per shard)": single}
    root = Path(os.path.commonpath([Path(p).resolve() for p in paths + framed]))
    started = start_nginx(root, Path(tempfile.mkdtemp(dir=work)))
    sources = dict(local)
    if started is not None:
        for where, files in (("HTTP, loopback nginx", paths), ("HTTP zstd (tarindex compress)", framed)):
            sources[where] = [f"http://127.0.0.1:{started[1]}/{Path(p).resolve().relative_to(root)}" for p in files]
    try:
        for where, urls in sources.items():
            rows.append((f"{name}: TarStream(shuffle=1000) {where}, epoch start: first sample (ms)",
                         min(first_sample(tarindex.TarStream(urls, **kw)) for _ in range(3)), "fills the buffer: 1,000 samples"))
            for frac in (0.1, 0.5, 0.9):  # as far into the epoch, and as far into the shard being read
                stream = tarindex.TarStream(urls, **kw)
                it = iter(stream)
                for _ in range(int(n * frac + n / len(paths) * frac)):
                    next(it)
                state = json.dumps(stream.state_dict())
                del it
                best = float("inf")
                for _ in range(3):
                    resumed = tarindex.TarStream(urls, **kw)
                    resumed.load_state_dict(json.loads(state))
                    best = min(best, first_sample(resumed))
                rows.append((f"{name}: {where}, resumed at {frac:.0%} (and {frac:.0%} into a shard): first sample (ms)", best,
                             f"state {len(state):,} bytes (JSON), target <= 200 ms, independent of the position"))
    finally:
        if started is not None:
            stop(started[0])
    return rows


# -- mix -----------------------------------------------------------------------------------


def bench_mix(paths: list[str], name: str, repeat: int = 7) -> list[Row]:
    """``mix()`` of two TarStreams (half the shards each) beside the same two streams read one after the
    other (the sources' own rate), one stream of all the shards, and the two streams alternated by
    ``map(next, cycle(...))`` (interleaving with no mixing code); samples per second, best of
    ``repeat``, the cases alternating in one process."""
    import itertools

    half = len(paths) // 2
    a, b = paths[:half], paths[half:]
    cases: dict[str, Callable[[], Iterator[object]]] = {
        "the two sources one after the other": lambda: itertools.chain(tarindex.TarStream(a), tarindex.TarStream(b)),
        "mix() of the two, equal weights, stop='all'": lambda: iter(tarindex.mix([tarindex.TarStream(a), tarindex.TarStream(b)], stop="all")),
        "one TarStream of all the shards": lambda: iter(tarindex.TarStream(a + b)),
        "the two alternated, map(next, cycle(...))": lambda: map(next, itertools.cycle([iter(tarindex.TarStream(a)), iter(tarindex.TarStream(b))])),
    }
    best = dict.fromkeys(cases, 0.0)
    for _ in range(repeat):
        for label, make in cases.items():
            t0 = time.perf_counter()
            count = sum(1 for _ in make())
            best[label] = max(best[label], count / (time.perf_counter() - t0))
    own = best["the two sources one after the other"]
    return [(f"{name}: {label} (samples/s)", rate, f"{rate / own:.3f}x the sources' own rate") for label, rate in best.items()]


def bench_batch_bytes(paths: list[str], name: str, work: Path, repeat: int = 5, sizes_mib: tuple[float, ...] = (0.5, 1, 2, 4, 16, 64)) -> list[Row]:
    """The member data the C walk takes per call reading a file or socket itself (``tarindex.tar._DIRECT_BATCH_BYTES``) against two TarStreams
    (half the shards each) read one after the other, alternated by ``map(next, cycle(...))``, and
    ``mix()``ed; samples per second, best of ``repeat``, every size and case alternating in one process,
    with the minor page faults of the worst pass (glibc returning heap pages and taking them back).
    Then one TarStream over loopback nginx at each size (the socket walk takes the same batches)."""
    import itertools
    import sys
    import tempfile

    import tarindex.tar

    half = len(paths) // 2
    a, b = paths[:half], paths[half:]
    cases: dict[str, Callable[[], Iterator[object]]] = {
        "one after the other": lambda: itertools.chain(tarindex.TarStream(a), tarindex.TarStream(b)),
        "alternated": lambda: map(next, itertools.cycle([iter(tarindex.TarStream(a)), iter(tarindex.TarStream(b))])),
        "mix()": lambda: iter(tarindex.mix([tarindex.TarStream(a), tarindex.TarStream(b)], stop="all")),
    }
    saved = tarindex.tar._DIRECT_BATCH_BYTES
    best: dict[tuple[float, str], float] = {}
    faults: dict[tuple[float, str], int] = {}
    try:
        _stream_pass(paths)  # the page cache, torch's import
        for _ in range(repeat):
            for mib in sizes_mib:
                tarindex.tar._DIRECT_BATCH_BYTES = int(mib * (1 << 20))
                for label, make in cases.items():
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.perf_counter()
                    count = sum(1 for _ in make())
                    rate = count / (time.perf_counter() - t0)
                    best[mib, label] = max(best.get((mib, label), 0.0), rate)
                    faults[mib, label] = max(faults.get((mib, label), 0), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        rows: list[Row] = []
        for (mib, label), rate in best.items():
            own = best[mib, "one after the other"]
            rows.append((f"{name}: walk batches of {mib:g} MiB, two TarStreams {label} (samples/s)", rate,
                         f"{rate / own:.3f}x one after the other; up to {faults[mib, label]:,} minor page faults a pass"))
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from _servers import start_nginx, stop  # the test suite's nginx launcher (a foreground child process)

        started = start_nginx(Path(paths[0]).parent.resolve(), Path(tempfile.mkdtemp(dir=work)))
        if started is None:
            return [*rows, (f"{name}: walk batches over HTTP", float("nan"), "nginx did not start")]
        proc, port = started
        try:
            urls = [f"http://127.0.0.1:{port}/{Path(p).name}" for p in paths]
            http: dict[float, float] = {}
            for _ in range(repeat):
                for mib in (1, 16):
                    tarindex.tar._DIRECT_BATCH_BYTES = mib << 20
                    t0 = time.perf_counter()
                    count = _stream_pass(urls)
                    http[mib] = max(http.get(mib, 0.0), count / (time.perf_counter() - t0))
            rows += [(f"{name}: walk batches of {mib} MiB, one TarStream over loopback nginx (samples/s)", rate,
                      f"{rate / http[16]:.3f}x 16 MiB batches") for mib, rate in http.items()]
        finally:
            stop(proc)
        return rows
    finally:
        tarindex.tar._DIRECT_BATCH_BYTES = saved


def bench_walk(paths: list[str], name: str, repeat: int = 3) -> list[Row]:
    """The tar walk alone, in one process: ``TarStream`` over local files beside ``cat``, and the index
    tables of every shard (``scan_shard``) beside a ``tarfile`` scan; best of ``repeat``, alternating."""
    import subprocess

    from tarindex.scan import scan_shard

    _ = tarindex.TarStream  # imports torch before anything is timed

    def scan() -> None:
        for p in paths:
            scan_shard(p)

    total_mb = sum(os.path.getsize(p) for p in paths) / 1e6
    best = {"cat": float("inf"), "stream": float("inf"), "scan": float("inf"), "tarfile": float("inf")}
    for _ in range(repeat):
        best["cat"] = min(best["cat"], timed(lambda: subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)))
        best["stream"] = min(best["stream"], timed(lambda: _stream_pass(paths)))
        best["scan"] = min(best["scan"], timed(scan))
        best["tarfile"] = min(best["tarfile"], timed(lambda: tarfile_scan(paths)))
    return [
        (f"{name}: TarStream local files, walk only (MB/s)", total_mb / best["stream"], f"{best['cat'] / best['stream']:.2f}x cat ({total_mb / best['cat']:,.0f} MB/s)"),
        (f"{name}: index tables of every shard, one process (s)", best["scan"], f"{best['tarfile'] / best['scan']:.1f}x faster than a tarfile scan ({best['tarfile']:.2f} s)"),
    ]


# -- zstd shards ------------------------------------------------------------------------------


def _zstd_copies(paths: list[str], out: Path, frame_size: int | None = None) -> tuple[list[str], list[str]]:
    """Each shard as one zstd -3 frame (the CLI's default) and as ``tarindex compress`` output, made once."""
    import subprocess

    from tarindex.shard_writer import DEFAULT_FRAME_SIZE, compress_shard

    out.mkdir(parents=True, exist_ok=True)
    fs = frame_size or DEFAULT_FRAME_SIZE
    single, framed = [], []
    for p in paths:
        one = out / (Path(p).name + ".one.zst")
        if not one.exists():
            subprocess.run(["zstd", "-q", "-3", "-f", p, "-o", str(one)], check=True)
        ours = out / (Path(p).name + f".f{fs}.zst")
        if not ours.exists():
            compress_shard(p, ours, frame_size=fs)
        single.append(str(one))
        framed.append(str(ours))
    return single, framed


def _zstd_d(paths: list[str]) -> None:
    import subprocess

    for p in paths:
        subprocess.run(["zstd", "-q", "-d", "-c", p], stdout=subprocess.DEVNULL, check=True)


def _random_reads(index: Path, order: list[int], cache_bytes: int | None) -> float:
    """Seconds for one pass of ``ds.read`` over ``order`` (frame cache of ``cache_bytes``; ``None``: default)."""
    from tarindex.zstd_random import DEFAULT_CACHE_BYTES, frame_cache

    ds = tarindex.TarDataset(index)
    ds.read(0)
    cache = frame_cache()
    cache.clear()
    cache.max_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
    read = ds.read
    t = timed(lambda: _read_all(read, order))
    cache.max_bytes = DEFAULT_CACHE_BYTES
    cache.clear()
    ds.close()
    return t


def bench_zstd(paths: list[str], name: str, work: Path, frame_table: bool) -> list[Row]:
    """Indexing zstd shards vs ``zstd -d``; random access vs plain tar; size vs one frame; frame-size table."""
    from tarindex.scan import scan_shard
    from tarindex.shard_writer import DEFAULT_FRAME_SIZE

    rows: list[Row] = []
    zdir = work / f"zstd-{name}"
    single, framed = _zstd_copies(paths, zdir)
    raw = sum(os.path.getsize(p) for p in paths)
    t_plain_scan = timed(lambda: [scan_shard(p) for p in paths], 3)
    rows.append((f"{name}: index the plain tar shards, one process (MB/s)", raw / t_plain_scan / 1e6, "the parser's own rate: a ceiling for zstd indexing"))
    for label, files in (("one frame (zstd -3)", single), (f"tarindex compress, {DEFAULT_FRAME_SIZE >> 10} KiB frames", framed)):
        t_cli = timed(lambda files=files: _zstd_d(files), 3)
        t_scan = timed(lambda files=files: [scan_shard(f) for f in files], 3)
        rows.append((f"{name}: zstd -d -c > /dev/null, {label} (MB/s)", raw / t_cli / 1e6, "physical limit (one core)"))
        rows.append((f"{name}: index zstd shards, {label}, one process (MB/s)", raw / t_scan / 1e6, f"{t_cli / t_scan:.2f}x zstd -d (target >= 0.8x); {t_plain_scan / t_scan:.2f}x plain-tar indexing"))
    size_one = sum(os.path.getsize(p) for p in single)
    size_ours = sum(os.path.getsize(p) for p in framed)
    rows.append((f"{name}: tarindex compress size vs one frame (%)", 100 * (size_ours / size_one - 1), f"{size_ours / raw:.3f} of the tar; one frame {size_one / raw:.3f}; target <= 5% (JPEG set)"))

    plain_ix, ours_ix = work / f"zstd-{name}-plain.tarindex", work / f"zstd-{name}-ours.tarindex"
    tarindex.build_index(paths, index=plain_ix)
    tarindex.build_index(framed, index=ours_ix)
    n = tarindex.TarDataset(plain_ix).index.n_samples
    order = list(range(n))
    random.Random(0).shuffle(order)
    order = order[: min(n, 100_000)]
    t_plain = min(_random_reads(plain_ix, order, None) for _ in range(2))
    t_off = min(_random_reads(ours_ix, order, 0) for _ in range(2))
    t_lru = _random_reads(ours_ix, order, None)
    rows.append((f"{name}: plain tar TarDataset.read, random order (samples/s)", len(order) / t_plain, "baseline"))
    rows.append((f"{name}: zstd shards, frame cache off (samples/s)", len(order) / t_off, f"{t_plain / t_off:.2f}x plain tar; target >= 0.5x"))
    rows.append((f"{name}: zstd shards, default 64 MiB frame cache (samples/s)", len(order) / t_lru, f"{t_plain / t_lru:.2f}x plain tar; data {raw >> 20} MiB"))
    if frame_table:
        sub = paths[:2]
        sub_raw = sum(os.path.getsize(p) for p in sub)
        one_size = sum(os.path.getsize(p) for p in single[:2])
        sub_ix = work / f"zstd-{name}-sub-plain.tarindex"
        tarindex.build_index(sub, index=sub_ix)
        m = tarindex.TarDataset(sub_ix).index.n_samples
        sub_order = list(range(m))
        random.Random(2).shuffle(sub_order)
        sub_order = sub_order[:50_000]
        t_sub_plain = min(_random_reads(sub_ix, sub_order, None) for _ in range(2))
        for fs in (1, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 1 << 20):  # 1: one sample per frame
            _, files = _zstd_copies(sub, zdir, fs)
            size = sum(os.path.getsize(p) for p in files)
            ix = work / f"zstd-{name}-fs{fs}.tarindex"
            tarindex.build_index(files, index=ix)
            t = min(_random_reads(ix, sub_order, 0) for _ in range(2))
            rows.append((
                f"{name}: frame size {fs >> 10 if fs > 1 else 0} KiB{' (one sample per frame)' if fs == 1 else ''}: size vs one frame (%) | random access vs plain",
                100 * (size / one_size - 1),
                f"{t_sub_plain / t:.2f}x plain tar ({len(sub_order) / t:,.0f} samples/s, cache off); {size / sub_raw:.3f} of the tar",
            ))
    return rows


# -- main ------------------------------------------------------------------------------------


def run_set(name: str, paths: list[str], only: set[str], work: Path) -> Iterator[Row]:
    if "latency" in only:  # not by default: a FUSE mount with 1 ms per read, cold passes (tools/bench_latency.py)
        if name == "small":
            from bench_latency import bench_latency

            yield from bench_latency(paths[:4], name, work)
        if only == {"latency"}:
            return
    index = work / f"{name}.tarindex"
    if "build" in only:
        yield from bench_build(paths, name, index)
    else:  # incremental: nothing rewritten when the index is current, rebuilt when its format is older
        tarindex.build_index(paths, index=index)
    ds = tarindex.TarDataset(index)
    if "access" in only:
        yield from bench_access(ds, name)
    if "loader" in only and name == "jpeg":  # DataLoader scaling (issue 2); images/s into a batch: main()
        yield from bench_loader(index, name)
    if "open" in only and name == "small":
        yield from bench_open(ds, name, work)
    if "sampler" in only:
        yield from bench_sampler_order(index, name)
    if "sampler_zstd" in only:
        yield from bench_sampler_zstd(paths[: ZSTD_SHARDS[0]], name, work)
    if "walk" in only:
        yield from bench_walk(paths, name)
    if "stream" in only:
        yield from bench_stream(paths, name, work, 4 if "quick" in only else None)
    if "resume" in only and name == "jpeg":
        yield from bench_resume(paths, name, work)
    if "mix" in only:
        yield from bench_mix(paths, name)
    if "readcheck" in only:  # not by default: each read's header check on and off, alternated in one process per lane
        from bench_readcheck import bench_readcheck

        yield from bench_readcheck({name: index})
    if "batches" in only:  # not by default: a sweep of the walk's batch size (tarindex.tar._DIRECT_BATCH_BYTES)
        yield from bench_batch_bytes(paths, name, work)
    if "zstd" in only:
        yield from bench_zstd(paths[: ZSTD_SHARDS[0]], name, work, frame_table=name == "small")
    if "gzip" in only:
        from bench_gzip import bench_gzip

        yield from bench_gzip(paths[: ZSTD_SHARDS[0] or 2], name, work)
    if "remote" in only:  # not by default: it starts nginx and a delaying relay
        from bench_remote import bench_remote

        yield from bench_remote(paths, name, work, index)


# -- samplers ---------------------------------------------------------------------------


def _evict(paths: list[str]) -> None:
    """Drop the shards' pages from the page cache (these files only; nothing global): the harness's ``drop_cache``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _latencyfs import drop_cache

    drop_cache(paths)


def bench_sampler_order(index: str | Path, name: str, *, world: int = 2) -> list[tuple[str, float, str]]:
    """TarDataset read throughput of rank 0 in ShardSampler order vs DistributedSampler order, same data.

    Takes any index, plain tar or zstd (see ``bench_sampler_zstd``). Warm: page cache holds the shards.
    Cold: the shards' pages are evicted (posix_fadvise) before each pass. The zstd frame cache (default
    size) is emptied before every pass, so each order starts from nothing.
    """
    from torch.utils.data import DistributedSampler

    from tarindex.zstd_random import frame_cache

    ds = tarindex.TarDataset(index)
    orders = {
        "DistributedSampler": list(DistributedSampler(ds, num_replicas=world, rank=0, shuffle=True, seed=0)),
        "ShardSampler": list(tarindex.ShardSampler(ds, world, 0, seed=0)),
        "ShardSampler(block_samples=1)": list(tarindex.ShardSampler(ds, world, 0, seed=0, block_samples=1)),
        "ShardSampler(chunk_shards=1)": list(tarindex.ShardSampler(ds, world, 0, seed=0, chunk_shards=1)),
        "ShardSampler(block_samples=16)": list(tarindex.ShardSampler(ds, world, 0, seed=0, block_samples=16)),
        "index order (sequential: the locality limit)": list(tarindex.ShardSampler(ds, world, 0, shuffle=False)),
    }
    read = ds.read
    rows: list[tuple[str, float, str]] = []
    for cache in ("warm", "cold"):
        if cache == "warm":
            _read_all(read, list(range(len(ds))))  # fill the page cache
        best = dict.fromkeys(orders, float("inf"))
        for _ in range(5 if cache == "warm" else 2):  # rounds over all orders: load drift hits each alike
            for label, order in orders.items():
                if cache == "cold":
                    ds.close()
                    _evict(ds.urls)
                frame_cache().clear()
                best[label] = min(best[label], timed(lambda order=order: _read_all(read, order)))
        rate = {label: len(order) / best[label] for label, order in orders.items()}
        base = rate["DistributedSampler"]
        rows.append((f"{name}: rank 0 of {world}, DistributedSampler, {cache} (samples/s)", base, "peer"))
        for label in list(orders)[1:]:
            ratio = f"{rate[label] / base:.2f}x DistributedSampler"
            rows.append((f"{name}: rank 0 of {world}, {label}, {cache} (samples/s)", rate[label], ratio))
    return rows


def bench_sampler_zstd(paths: list[str], name: str, work: Path, frame_size: int = 32 << 10) -> list[Row]:
    """``bench_sampler_order`` on ``tarindex compress`` copies of the shards, with several samples per frame."""
    from tarindex.shard_writer import compress_shard

    zdir = work / f"zstd-{name}"
    zdir.mkdir(parents=True, exist_ok=True)
    framed = []
    for p in paths:
        out = zdir / (Path(p).name + f".f{frame_size}.zst")  # the naming of _zstd_copies: files are shared
        if not out.exists():
            compress_shard(p, out, frame_size=frame_size)
        framed.append(str(out))
    index = tarindex.build_index(framed, index=work / f"zstd-{name}-f{frame_size}.tarindex").path
    ds = tarindex.TarDataset(index)
    frames = sum(len(t) for k in range(len(ds.urls)) if (t := ds.index.frame_table(k)) is not None)
    per_frame = len(ds) / frames
    rows: list[Row] = [(f"{name}.zst ({frame_size >> 10} KiB frames): samples per frame", per_frame, f"{frames:,} frames")]
    return rows + bench_sampler_order(index, f"{name}.zst")


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
    ap.add_argument("--only", default="build,access,loader,open,walk,stream,resume,mix,zstd,sampler,sampler_zstd,scale")
    ap.add_argument("--zstd-shards", type=int, default=None, help="zstd benchmark on the first N shards (quick check)")
    ap.add_argument("--sizes", default="1e6,1e7", help="scale: index sizes in samples (tools/bench_index.py; 1e8: 100,000 shards)")
    ap.add_argument("--parts", type=int, default=10, help="scale: parts written, then merged, per size")
    ap.add_argument("--many-shards", type=int, default=500_000, help="scale: shards of the index whose open is timed (0: none)")
    ap.add_argument("--trees", default="", help="walk: two source trees A,B (each built in place), compared in alternated processes (tools/bench_walk.py)")
    ap.add_argument("--rounds", type=int, default=10, help="walk --trees: passes per walk and tree, asked in turn (best of); pack: rounds of each contender (3 is plenty)")
    ap.add_argument("--chart", type=Path, default=None, metavar="PNG", help="draw docs/performance.md's ratios into PNG (tools/bench_chart.py; matplotlib) and run nothing else")
    args = ap.parse_args()
    if args.chart is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_chart import main as chart

        sys.exit(chart(args.chart))
    ZSTD_SHARDS[0] = args.zstd_shards
    only = set(args.only.split(","))
    work = args.dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}; peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
    print("| measurement | value | ratio |\n|---|---|---|")
    trees = [t for t in args.trees.split(",") if t]
    walk_sets: dict[str, list[str]] = {}
    for name in filter(None, args.sets.split(",")):  # --sets '': only what needs no set (scale)
        base_name, _, writer = name.partition("-")
        n_shards, per, size = SPECS[base_name]
        paths = make_set(args.dir / base_name, base_name, VARIANT_SHARDS if writer else n_shards, per, size)
        if writer:
            print(f"{name}: {WRITERS[writer]}; {VARIANT_SHARDS} shards of the {base_name} set")
            paths = make_variant(args.dir / name, paths, name, writer)
        if trees and only == {"walk"}:
            walk_sets[name] = paths
            continue
        for label, value, ratio in run_set(name, paths, only, work):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if walk_sets:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_walk import compare

        for label, value, ratio in compare(trees, walk_sets, args.rounds):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if "scale" in only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_index import bench_index_scale, bench_many_shards

        sizes = [int(float(s)) for s in args.sizes.split(",") if s]
        rows = bench_index_scale(work, sizes, args.parts) + (bench_many_shards(work, args.many_shards) if args.many_shards else [])
        for label, value, ratio in [*rows, *bench_sampler_scale()]:
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if "loader" in only:  # images/s into a batch: its own generated sets (tools/bench_loader.py), a chart when matplotlib is installed
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_loader import bench_loader as bench_images

        chart = Path(__file__).resolve().parent.parent / "docs" / "loader.png"
        for label, value, ratio in bench_images(args.dir, work, chart=chart):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if "pack" in only:  # not by default: making shards, beside tar -cf, litdata and Mosaic (tools/bench_pack.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_pack import bench_pack

        jpeg = make_set(args.dir / "jpeg", "jpeg", *SPECS["jpeg"])
        small = make_set(args.dir / "small", "small", *SPECS["small"])
        tarindex.build_index(jpeg, index=work / "jpeg.tarindex")
        ds = tarindex.TarDataset(work / "jpeg.tarindex")
        scaled = _scaled_index(ds, work / "jpeg-scaled1k-placed-1000000.tarindex", 1_000_000)
        for label, value, ratio in bench_pack(jpeg, small, work / "jpeg.tarindex", scaled, work, args.rounds):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if "export" in only:  # not by default: tarindex export --dali / --wids of a 1M-sample index, beside cp (tools/bench_export.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_export import bench_export

        small = make_set(args.dir / "small", "small", *SPECS["small"])
        if not (work / "small.tarindex").exists():
            tarindex.build_index(small, index=work / "small.tarindex")
        scaled = _scaled_index(tarindex.TarDataset(work / "small.tarindex"), work / "small-scaled1k-placed-1000000.tarindex", 1_000_000)
        for label, value, ratio in bench_export(scaled, work):
            print(f"| {label} | {value:,.2f} | {ratio} |", flush=True)
    if "member" in only:  # not by default: it writes two 1 GiB-member shards once and starts 8 processes
        from bench_limits import bench_member

        for label, value, ratio in bench_member(work):
            print(f"| {label} | {value:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
