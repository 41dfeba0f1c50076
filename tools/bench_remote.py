"""Remote random access for tools/bench.py ``--only remote``: nginx on loopback, a delaying relay in front.

The shard set is served by nginx; an asyncio relay adds a fixed delay per request (20 ms: an object
store's latency) and counts requests and body bytes. The same objects are read as ``http://`` URLs
(tarindex's RangeReader, threads) and as ``s3://`` URLs (obstore; nginx answers the S3 GET path,
ranges and ``If-Match``), with ``__getitems__`` batches of 256 in random and in ``ShardSampler`` order,
beside local random access and wids (which downloads a shard before its first sample).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tarindex
from tarindex.index.reader import IndexReader
from tarindex.index.writer import IndexWriter
from tarindex.options import SourceOptions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _servers import start_nginx, stop

Row = tuple[str, float, str]
BATCH = 256
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))  # alternated rounds of the loopback A/B


class DelayRelay:
    """An HTTP/1.1 relay on 127.0.0.1 that waits ``delay`` seconds before relaying each request.

    Counts requests and response body bytes. Runs in a process of its own: a relay in the client's
    process would take the client's GIL for every request it relays, and the network a store's latency
    stands for costs the client nothing.
    """

    def __init__(self, upstream_port: int, delay: float) -> None:
        ctx = mp.get_context("spawn")
        self._requests = ctx.Value("q", 0, lock=False)
        self._bytes = ctx.Value("q", 0, lock=False)
        recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_relay, args=(upstream_port, delay, self._requests, self._bytes, send), daemon=True)
        self._proc.start()
        self.port: int = recv.recv()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> tuple[int, int]:
        return self._requests.value, self._bytes.value

    def close(self) -> None:
        self._proc.terminate()
        self._proc.join()


def _relay(upstream_port: int, delay: float, requests: Any, body_bytes: Any, conn: Any) -> None:
    """The relay's process: serve until terminated."""

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                requests.value += 1
                if delay:
                    await asyncio.sleep(delay)
                up_w.write(head)
                await up_w.drain()
                rhead = await up_r.readuntil(b"\r\n\r\n")
                length = 0
                for line in rhead.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                writer.write(rhead)
                left = 0 if head.startswith(b"HEAD ") else length
                body_bytes.value += left
                while left:
                    chunk = await up_r.read(min(left, 1 << 20))
                    if not chunk:
                        raise ConnectionError("upstream closed")
                    writer.write(chunk)
                    left -= len(chunk)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_w.close()

    async def serve() -> None:
        server = await asyncio.start_server(client, "127.0.0.1", 0, backlog=1024)
        conn.send(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def _url_index(source: Path, out: Path, name_of: Callable[[int], str]) -> Path:
    """A copy of ``source`` whose shard ``i`` is the URL ``name_of(i)`` (same tables, sizes and ETags)."""
    reader = IndexReader(source)
    with IndexWriter(out) as writer:
        for i, info in enumerate(reader.shards):
            seconds = info.mtime_ns // 1_000_000_000  # HTTP dates have whole seconds; nginx's ETag form
            url_info = dataclasses.replace(
                info, path=name_of(i), kind="url", mtime_ns=seconds * 1_000_000_000, etag=f'"{seconds:x}-{info.size:x}"'
            )
            writer.add(url_info, reader.shard_table(i))
    reader.close()
    return out


def _batches(order: list[int]) -> list[list[int]]:
    return [order[k : k + BATCH] for k in range(0, len(order) - BATCH + 1, BATCH)]


def _rate(ds: tarindex.TarDataset, batches: list[list[int]], seconds: float = 4.0) -> float:
    """Samples/s of ``__getitems__`` over ``batches`` (as many as fit in about ``seconds``), best of two passes."""
    ds.__getitems__(batches[0][:4])  # shards opened, connections made
    best = 0.0
    for _ in range(2):
        done, start = 0, time.perf_counter()
        for batch in batches:
            ds.__getitems__(batch)
            done += len(batch)
            if time.perf_counter() - start > seconds:
                break
        best = max(best, done / (time.perf_counter() - start))
    return best


def _sample_bytes(ds: tarindex.TarDataset, indices: list[int]) -> int:
    rec = ds.index.decode()
    sizes = rec.size.tolist()
    return sum(sizes[i] for i in indices)


def bench_remote(paths: list[str], name: str, work: Path, index: Path) -> list[Row]:
    """Remote random access over loopback nginx, with and without 20 ms added per request."""
    root = Path(tempfile.mkdtemp(prefix="bench-www-", dir=work))
    (root / "bench").mkdir()
    (root / "bench" / name).symlink_to(Path(paths[0]).resolve().parent)
    started = start_nginx(root, Path(tempfile.mkdtemp(prefix="bench-nginx-", dir=work)))
    if started is None:
        return [(f"{name}: remote (nginx did not start)", 0.0, "skipped")]
    proc, port = started
    rows: list[Row] = []
    try:
        rows += _bench(paths, name, work, index, port)
    finally:
        stop(proc)
    return rows


def _bench(paths: list[str], name: str, work: Path, index: Path, port: int) -> list[Row]:
    rows: list[Row] = []
    names = [Path(p).name for p in paths]
    local = tarindex.TarDataset(index)
    n = len(local)
    order = list(range(n))
    random.Random(0).shuffle(order)
    rand = _batches(order)
    sampler = tarindex.ShardSampler(local, num_replicas=1, rank=0, seed=0, block_samples=16)
    sampled = _batches(list(sampler))
    local.__getitems__(rand[0])
    t_local = _rate(local, rand)
    rows.append((f"{name}: local files, __getitems__ of {BATCH}, random (samples/s)", t_local, "baseline"))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_REGION", "us-east-1")
    # nginx without delay: the ceiling of the client
    plain = _url_index(index, work / f"{name}-http.tarindex", lambda i: f"http://127.0.0.1:{port}/bench/{name}/{names[i]}")
    rows += _loopback_ab(local, plain, rand, order, name)
    rows.append(_curl_ceiling([f"http://127.0.0.1:{port}/bench/{name}/{nm}" for nm in names], n, rows))
    first = _first_sample(plain, {})
    rows.append((f"{name}: http:// loopback nginx, time to first sample, cold process (s)", first, "one ranged request after the index opens"))
    w = _wids_first(f"http://127.0.0.1:{port}/bench/{name}/{names[0]}", local.shard_sizes[0], work)
    if w is not None:
        rows.append((f"{name}: wids, loopback nginx, time to first sample (s)", w, f"{w / first:.1f}x tarindex's; downloads the whole shard first"))
    relay = DelayRelay(port, 0.020)
    for scheme in ("http", "s3"):
        if scheme == "http":
            url_of: Callable[[int], str] = lambda i: f"{relay.endpoint}/bench/{name}/{names[i]}"  # noqa: E731
            store: dict[str, object] = {}
        else:
            url_of = lambda i: f"s3://bench/{name}/{names[i]}"  # noqa: E731
            store = {"endpoint_url": relay.endpoint}
        delayed = _url_index(index, work / f"{name}-{scheme}-delayed.tarindex", url_of)
        for inflight in (32, 64, 128):
            ds = tarindex.TarDataset(delayed, options=SourceOptions(max_in_flight=inflight, storage_options=store))
            rate = _rate(ds, rand, 3.0)
            rows.append((f"{name}: {scheme}:// +20 ms/request, __getitems__ of {BATCH}, random, {inflight} in flight (samples/s)", rate, "target >= 1,500 (1 KB), >= 1,000 (JPEG)"))
        for gap in (0, 4 << 10, 64 << 10):
            ds = tarindex.TarDataset(delayed, options=SourceOptions(max_in_flight=64, coalesce_gap=gap, storage_options=store))
            ds.__getitems__(rand[0][:4])
            for label, batches in (("random", rand[:4]), ("ShardSampler(block_samples=16)", sampled[:4])):
                r0, b0 = relay.counts()
                for batch in batches:
                    ds.__getitems__(batch)
                r1, b1 = relay.counts()
                asked = sum(len(b) for b in batches)
                wanted = sum(_sample_bytes(ds, b) for b in batches)
                rows.append((f"{name}: {scheme}:// gap {gap >> 10} KiB, {label}: requests per sample", (r1 - r0) / asked, f"bytes fetched {(b1 - b0) / wanted:.2f}x sample bytes; targets <= 0.3 (ShardSampler), <= 1.2x bytes (random)"))
        first = _first_sample(delayed, store)
        rows.append((f"{name}: {scheme}:// +20 ms, time to first sample, cold process (s)", first, "one ranged request after the index opens"))
    w = _wids_first(f"{relay.endpoint}/bench/{name}/{names[0]}", local.shard_sizes[0], work)
    if w is not None:
        rows.append((f"{name}: wids +20 ms, time to first sample (s)", w, "downloads the whole shard first"))
    relay.close()
    return rows


def _curl_ceiling(urls: list[str], n: int, rows: list[Row]) -> Row:
    """The network's ceiling on this machine: curl reading every shard whole from the same server (one
    connection at a time, no per-request cost), as samples/s, against local random ``ds[i]``."""
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        for url in urls:
            subprocess.run(["curl", "-sf", "-o", "/dev/null", url], check=True)
        best = min(best, time.perf_counter() - t0)
    local = next(v for label, v, _ in rows if "local files, ds[i]" in label)
    name = rows[0][0].split(":")[0]
    return (f"{name}: curl of every shard whole, loopback nginx (samples/s equivalent)", n / best,
            f"{n / best / local:.2f}x local ds[i]: the loopback network's ceiling here")


def _single_rate(ds: tarindex.TarDataset, order: list[int], seconds: float) -> float:
    """Samples/s of ``ds[i]`` in ``order`` for about ``seconds``."""
    done, start = 0, time.perf_counter()
    for i in order:
        ds[i]
        done += 1
        if not done % 64 and time.perf_counter() - start > seconds:
            break
    return done / (time.perf_counter() - start)


def _loopback_ab(local: tarindex.TarDataset, plain: Path, rand: list[list[int]], order: list[int], name: str) -> list[Row]:
    """Random access over loopback nginx without delay: http.client (A) and the raw socket path (B), then
    local files, alternated in one process, best of ``ROUNDS`` each (``ds[i]`` and ``__getitems__``)."""
    from tarindex import _http

    sides: dict[str, tarindex.TarDataset] = {}
    for label, raw in (("http.client", False), ("raw sockets", True)):
        _http._RAW, saved = raw, _http._RAW  # read when a shard's reader opens: open them all now
        try:
            ds = sides[label] = tarindex.TarDataset(plain)
            for batch in rand[:2]:
                ds.__getitems__(batch)
        finally:
            _http._RAW = saved
    sides["local files"] = local
    best: dict[tuple[str, str], float] = {}
    for _ in range(ROUNDS):
        for label, ds in sides.items():
            for kind in ("ds[i]", "__getitems__"):
                rate = _single_rate(ds, order, 1.5) if kind == "ds[i]" else _rate(ds, rand, 1.5)
                best[label, kind] = max(best.get((label, kind), 0.0), rate)
    rows: list[Row] = []
    for kind in ("ds[i]", "__getitems__"):
        base = best["local files", kind]
        rows.append((f"{name}: local files, {kind}, random (samples/s)", base, "baseline"))
        for label in ("http.client", "raw sockets"):
            rate = best[label, kind]
            rows.append((f"{name}: http:// loopback nginx, {label}, {kind}, random (samples/s)", rate, f"{rate / base:.2f}x local; target >= 0.5x (JPEG)"))
    return rows


def _first_sample(index: Path, store: dict[str, object]) -> float:
    import subprocess

    code = (
        "import time; t = time.perf_counter(); import tarindex; from tarindex.options import SourceOptions; "
        f"ds = tarindex.TarDataset({str(index)!r}, options=SourceOptions(storage_options={store!r})); ds[12345 % len(ds)]; "
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _wids_first(url: str, nsamples: int, work: Path) -> float | None:
    """Time to wids' first sample in a cold process (its import included, as :func:`_first_sample` includes ours)."""
    import subprocess

    try:
        import wids  # noqa: F401  # installed?
    except ImportError:
        return None
    cache = tempfile.mkdtemp(prefix="bench-wids-", dir=work)
    code = (
        "import time; t = time.perf_counter(); import wids; "
        f"ds = wids.ShardListDataset([{{'url': {url!r}, 'nsamples': {nsamples}}}], cache_dir={cache!r}, transformations=[]); "
        f"ds[{nsamples // 2}]; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])
