"""Shards in object storage: listing, build, random reads and batches against moto's S3 server (and the fault proxy)."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _servers import AzureServer, FaultProxy, HTTPServer, S3Server

import tarindex
from conftest import make_shard_set
from tarindex import TarDataset, build_index
from tarindex._ranges import coalesce
from tarindex.errors import ShardNotFoundError, SourceError, StaleIndexError
from tarindex.objstore import glob_urls, read_many
from tarindex.options import SourceOptions
from tarindex.shards import expand_shards

_PREFIXES = itertools.count()


def _oracle(paths: list[Path]) -> list[dict[str, bytes]]:
    """Every sample of the shards, in order, by tarfile: ``{ext: bytes}`` with ``__key__``."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with tarfile.open(path) as tf:
            for m in tf:
                key, _, ext = m.name.partition(".")
                if not out or out[-1]["__key__"] != key or out[-1]["__shard__"] != path:
                    out.append({"__key__": key, "__shard__": path})
                out[-1][ext] = tf.extractfile(m).read()  # type: ignore[union-attr]
    return out


def _same(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return got["__key__"] == want["__key__"] and all(bytes(got[k]) == v for k, v in want.items() if not k.startswith("__"))


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The standard AWS environment pointing at the moto server (what obstore and s3fs read)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


def _client(s3: S3Server) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


@pytest.fixture
def bucket_set(s3_env: S3Server, tmp_path: Path) -> Iterator[tuple[str, list[Path]]]:
    """Four shards of 12 samples uploaded under a fresh prefix; yields the ``s3://`` prefix and the local copies."""
    paths = make_shard_set(tmp_path / "data", 4, 12)
    prefix = f"set{next(_PREFIXES)}-{os.getpid()}"
    client = _client(s3_env)
    for p in paths:
        client.upload_file(str(p), s3_env.bucket, f"{prefix}/{p.name}")
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}/notes.txt", Body=b"not a shard")
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}/deeper/train-000009.tar", Body=b"")
    yield f"s3://{s3_env.bucket}/{prefix}", paths


def test_glob_lists_the_bucket_in_order(bucket_set: tuple[str, list[Path]]) -> None:
    url, paths = bucket_set
    names = [f"{url}/{p.name}" for p in paths]
    assert glob_urls(f"{url}/train-*.tar") == names  # not deeper/: * stops at /
    assert expand_shards(f"{url}/train-00000[13].tar::{url}/train-{{000000..000000}}.tar") == [names[1], names[3], names[0]]
    assert glob_urls(f"{url}/**.tar") == [f"{url}/deeper/train-000009.tar", *names]  # sorted by name
    with pytest.raises(ShardNotFoundError, match=rf"{url}/val-\*.tar: no shard matches this pattern"):
        expand_shards(f"{url}/val-*.tar")


def test_build_and_read_at_random(bucket_set: tuple[str, list[Path]], tmp_path: Path) -> None:
    url, paths = bucket_set
    report = build_index(f"{url}/train-*.tar", index=tmp_path / "s3.tarindex", workers=2)
    assert report.scanned == [f"{url}/{p.name}" for p in paths]
    ds = TarDataset(tmp_path / "s3.tarindex")
    assert all(info.etag and info.etag.startswith('"') for info in ds.index.shards)
    want = _oracle(paths)
    assert len(ds) == len(want)
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for i in order[:10]:
        assert _same(ds[i], want[i])
    batch = ds.__getitems__(order)
    assert all(_same(got, want[i]) for got, i in zip(batch, order))
    assert ds.__getitems__([5, 5, 0]) == [ds[5], ds[5], ds[0]]


def test_changed_and_deleted_objects(bucket_set: tuple[str, list[Path]], s3_env: S3Server, tmp_path: Path) -> None:
    url, paths = bucket_set
    build_index(f"{url}/train-*.tar", index=tmp_path / "s3.tarindex", workers=1)
    key = url.split("/", 3)[3]
    client = _client(s3_env)
    same_size = bytearray(paths[1].read_bytes())
    same_size[600] ^= 1  # same size, new content: only the ETag tells
    client.put_object(Bucket=s3_env.bucket, Key=f"{key}/{paths[1].name}", Body=bytes(same_size))
    client.delete_object(Bucket=s3_env.bucket, Key=f"{key}/{paths[2].name}")
    ds = TarDataset(tmp_path / "s3.tarindex")
    per = 12
    assert _same(ds[0], _oracle(paths)[0])
    with pytest.raises(StaleIndexError, match=rf"{url}/{paths[1].name}: shard changed since it was indexed \(the object's ETag"):
        ds[per + 1]
    with pytest.raises(StaleIndexError):
        ds.__getitems__([0, per + 2])
    with pytest.raises(ShardNotFoundError, match=rf"{url}/{paths[2].name}: no such shard"):
        ds.__getitems__([2 * per, 0])


def test_missing_credentials_is_one_line(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_REGION": "us-east-1", "PYTHONPATH": str(Path(tarindex.__file__).parent.parent)}
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", "from tarindex.cli.main import main; main()", "build", f"s3://{s3_server.bucket}/nocreds/*.tar", "-o", str(tmp_path / "x.tarindex")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no credentials for this store" in lines[0], out.stderr
    assert time.monotonic() - start < 20


def test_refused_endpoint_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    import obstore.store  # noqa: F401  # imported before the clock starts: the import is not what is timed

    start = time.monotonic()
    with pytest.raises(SourceError, match=r"^s3://b/x-\*.tar: connection refused"):
        glob_urls("s3://b/x-*.tar", storage_options={"endpoint_url": "http://127.0.0.1:9"})
    assert time.monotonic() - start < 2  # retried, the default backoff waits U(0, 0.5) + U(0, 1) + ... s: < 2 s with p < 0.01


def test_stream_over_s3(bucket_set: tuple[str, list[Path]]) -> None:
    url, paths = bucket_set
    got = list(tarindex.TarStream(f"{url}/train-*.tar"))
    want = _oracle(paths)
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("fault", ["drop_mid_body", "stall", "fail_503"])
def test_batches_under_faults(
    bucket_set: tuple[str, list[Path]], s3_env: S3Server, fault_proxy: Callable[..., FaultProxy], tmp_path: Path, fault: str
) -> None:
    url, paths = bucket_set
    build_index(f"{url}/train-*.tar", index=tmp_path / "s3.tarindex", workers=1)
    proxy = fault_proxy(int(s3_env.endpoint.rsplit(":", 1)[1]), stall_s=1.5)
    options = SourceOptions(storage_options={"endpoint_url": proxy.endpoint}, backoff=0.01, timeout=1.0, coalesce_gap=0)
    ds = TarDataset(tmp_path / "s3.tarindex", options=options)
    want = _oracle(paths)
    order = list(range(len(ds)))
    random.Random(2).shuffle(order)
    setattr(proxy, fault, 4)
    batch = ds.__getitems__(order[:24])
    assert all(_same(got, want[i]) for got, i in zip(batch, order))
    assert getattr(proxy, fault) == 0  # each fault was met and recovered from
    tight = TarDataset(tmp_path / "s3.tarindex", options=options.with_(retries=1))
    setattr(proxy, fault, 10_000)
    with pytest.raises(SourceError, match=rf"{url}/train-\d+\.tar: bytes \d+-\d+: read failed after 1 retries"):
        tight.__getitems__(order[:4])


def test_coalescing_plan() -> None:
    assert coalesce([(100, 10), (0, 10), (15, 5), (200, 1)], gap=5) == [(0, 20, [1, 2]), (100, 110, [0]), (200, 201, [3])]
    assert coalesce([(0, 10), (5, 10), (0, 10)], gap=0) == [(0, 15, [0, 2, 1])]  # by offset, stable


def test_batch_over_http_coalesces_neighbours(
    http_server: HTTPServer, fault_proxy: Callable[..., FaultProxy], shard_set: Callable[..., list[Path]], tmp_path: Path
) -> None:
    paths = shard_set(2, 30, name="www-batch")
    for p in paths:
        (http_server.root / f"batch-{tmp_path.name}-{p.name}").write_bytes(p.read_bytes())
    proxy = fault_proxy(http_server.port)
    urls = [proxy.url(f"batch-{tmp_path.name}-{p.name}") for p in paths]
    build_index(urls, index=tmp_path / "http.tarindex", workers=1)
    want = _oracle(paths)
    ds = TarDataset(tmp_path / "http.tarindex")
    ds[0], ds[30]  # opened: one probe each
    before = proxy.requests
    got = ds.__getitems__(list(range(10, 20)))  # ten neighbours: one request
    assert all(_same(g, want[i]) for g, i in zip(got, range(10, 20)))
    assert proxy.requests - before == 1
    apart = TarDataset(tmp_path / "http.tarindex", options=SourceOptions(coalesce_gap=-1))
    apart[0], apart[30]
    before = proxy.requests
    apart.__getitems__(list(range(10, 20)))
    assert proxy.requests - before == 10


def test_read_many_orders_results(http_server: HTTPServer, tmp_path: Path) -> None:
    data = os.urandom(100_000)
    name = f"many-{tmp_path.name}.bin"
    (http_server.root / name).write_bytes(data)
    from tarindex.sources import RangeReader

    reader = RangeReader(http_server.url(name))
    wanted = [(reader, o, n) for o, n in [(90_000, 10), (0, 5), (50, 100), (99_990, 50), (10, 10)]]
    assert read_many(wanted, SourceOptions(coalesce_gap=1000)) == [data[90_000:90_010], data[:5], data[50:150], data[99_990:], data[10:20]]
    reader.close()


def _read_in_child(ds: TarDataset, indices: list[int]) -> tuple[list[str], list[str]]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [s["__key__"] for s in ds.__getitems__(indices)] + [ds[indices[0]]["__key__"]]
    return keys, [str(w.message) for w in caught]


def test_forked_after_obstore_reads_through_fsspec(bucket_set: tuple[str, list[Path]], tmp_path: Path) -> None:
    """obstore's runtime does not survive fork: a forked worker must still read (through fsspec), never hang."""
    import multiprocessing

    url, _ = bucket_set
    build_index(f"{url}/train-*.tar", index=tmp_path / "s3.tarindex", workers=1)
    ds = TarDataset(tmp_path / "s3.tarindex")
    assert ds[0]["__key__"] == "s00i000"  # obstore used in this process
    with multiprocessing.get_context("fork").Pool(1) as pool:
        keys, messages = pool.apply_async(_read_in_child, (ds, [13, 40, 2])).get(timeout=60)
    assert keys == ["s01i001", "s03i004", "s00i002", "s01i001"]
    assert messages and "forked after its parent used obstore" in messages[0]


def _fill_cache(root: str, bound: int, worker: int) -> None:
    from tarindex._blockcache import BlockCache

    cache = BlockCache(root, bound)
    for k in range(200):
        name = BlockCache.name("shard", (k * 7 + worker) % 150, 1000)
        data = bytes([k % 256]) * 1000
        got = cache.get(name, 1000)
        assert got is None or len(got) == 1000
        cache.put(name, data)


def test_block_cache_two_processes_keep_the_bound(tmp_path: Path) -> None:
    import multiprocessing

    from tarindex._blockcache import BlockCache

    bound = 40_000
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fill_cache, args=(str(tmp_path), bound, w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = BlockCache(tmp_path, bound)
    assert 0 < cache.used() <= bound
    entries = cache.files.entries()
    assert all(size == 1000 for _, size, _ in entries)  # no torn entry: each written whole, renamed
    assert not [p for p in cache.files.dir.iterdir() if p.name.startswith(".") and p.name not in (".lock", ".usage", ".tarindex-cache")]


def test_block_cache_serves_the_second_epoch(
    http_server: HTTPServer, fault_proxy: Callable[..., FaultProxy], shard_set: Callable[..., list[Path]], tmp_path: Path
) -> None:
    paths = shard_set(2, 20, name="www-cache")
    for p in paths:
        (http_server.root / f"cache-{tmp_path.name}-{p.name}").write_bytes(p.read_bytes())
    proxy = fault_proxy(http_server.port)
    urls = [proxy.url(f"cache-{tmp_path.name}-{p.name}") for p in paths]
    build_index(urls, index=tmp_path / "http.tarindex", workers=1)
    want = _oracle(paths)
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 20, coalesce_gap=-1)
    order = list(range(40))
    random.Random(3).shuffle(order)
    first = TarDataset(tmp_path / "http.tarindex", options=options)
    assert all(_same(g, want[i]) for g, i in zip(first.__getitems__(order), order))
    second = TarDataset(tmp_path / "http.tarindex", options=options)  # another process would see the same
    second[0], second[20]  # opened: one probe each
    before = proxy.requests
    assert all(_same(g, want[i]) for g, i in zip(second.__getitems__(order), order))
    assert _same(second[7], want[7])
    assert proxy.requests == before  # every range came from the cache


def test_any_fsspec_protocol_builds_and_reads_at_random(shard_set: Callable[..., list[Path]], tmp_path: Path) -> None:
    """The path of hf:// and every other fsspec protocol, on fsspec's in-memory filesystem."""
    import fsspec

    paths = shard_set(3, 8, name="mem")
    fs = fsspec.filesystem("memory")
    root = f"memory://tarindex-{tmp_path.name}"
    for p in paths:
        fs.pipe(f"{root}/{p.name}", p.read_bytes())
    fs.pipe(f"{root}/other.txt", b"x")
    assert expand_shards(f"{root}/train-*.tar") == [f"{root}/{p.name}" for p in paths]
    build_index(f"{root}/train-*.tar", index=tmp_path / "mem.tarindex", workers=1)
    ds = TarDataset(tmp_path / "mem.tarindex")
    want = _oracle(paths)
    order = list(range(len(ds)))
    random.Random(4).shuffle(order)
    assert all(_same(g, want[i]) for g, i in zip(ds.__getitems__(order), order))
    assert _same(ds[5], want[5])
    fs.pipe(f"{root}/{paths[2].name}", paths[2].read_bytes() + b"\0" * 512)  # grown: another size
    with pytest.raises(StaleIndexError, match=rf"{root}/{paths[2].name}: shard changed since it was indexed \(size"):
        TarDataset(tmp_path / "mem.tarindex")[17]


_LOADER_SCRIPT = """
import sys, warnings
import torch
from tarindex import TarDataset
from tarindex.errors import TarIndexWarning
warnings.filterwarnings("error", category=TarIndexWarning)  # inherited by forked workers
ds = TarDataset(sys.argv[1])  # no read in this process: workers forked from it use obstore
loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, collate_fn=lambda b: [s["__key__"] for s in b])
print(",".join(k for batch in loader for k in batch))
"""


def test_dataloader_workers_read_s3_through_obstore(bucket_set: tuple[str, list[Path]], tmp_path: Path) -> None:
    url, paths = bucket_set
    build_index(f"{url}/train-*.tar", index=tmp_path / "s3.tarindex", workers=1)
    env = {**os.environ, "PYTHONPATH": str(Path(tarindex.__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-c", _LOADER_SCRIPT, str(tmp_path / "s3.tarindex")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().split(",") == [w["__key__"] for w in _oracle(paths)]


@pytest.fixture
def azure_env(azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch) -> AzureServer:
    """The standard environment pointing obstore at Azurite (the emulator's account and key are Azurite's)."""
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azure_server.endpoint)
    return azure_server


def test_azure_blob_build_read_changed_deleted(azure_env: AzureServer, tmp_path: Path) -> None:
    """``az://`` against Azurite: build by glob, random ``ds[i]`` and a batch equal tarfile's bytes, a
    rewritten blob (same size) is a StaleIndexError, a deleted one a ShardNotFoundError."""
    import obstore
    from obstore.store import from_url

    paths = make_shard_set(tmp_path / "data", 3, 10)
    prefix = f"az{next(_PREFIXES)}-{os.getpid()}"
    store = from_url(f"az://{azure_env.container}")
    for p in paths:
        obstore.put(store, f"{prefix}/{p.name}", p.read_bytes())
    obstore.put(store, f"{prefix}/notes.txt", b"not a shard")
    url = f"az://{azure_env.container}/{prefix}"
    report = build_index(f"{url}/train-*.tar", index=tmp_path / "az.tarindex", workers=2)
    assert report.scanned == [f"{url}/{p.name}" for p in paths]
    ds = TarDataset(tmp_path / "az.tarindex")
    assert all(info.etag for info in ds.index.shards)
    want = _oracle(paths)
    order = list(range(len(ds)))
    random.Random(4).shuffle(order)
    assert all(_same(ds[i], want[i]) for i in order[:8])
    assert all(_same(got, want[i]) for got, i in zip(ds.__getitems__(order), order))
    same_size = bytearray(paths[1].read_bytes())
    same_size[600] ^= 1
    obstore.put(store, f"{prefix}/{paths[1].name}", bytes(same_size))
    obstore.delete(store, f"{prefix}/{paths[2].name}")
    fresh = TarDataset(tmp_path / "az.tarindex")
    with pytest.raises(StaleIndexError, match=rf"{url}/{paths[1].name}: shard changed since it was indexed"):
        fresh[12]
    with pytest.raises(ShardNotFoundError, match=rf"{url}/{paths[2].name}: no such shard"):
        fresh.__getitems__([25, 0])


def test_build_with_the_endpoint_only_in_storage_options(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS_ENDPOINT_URL: the endpoint and credentials come from ``storage_options`` (API and CLI), for the
    listing, the scans in worker processes and the reads; none of it is stored in the index."""
    paths = make_shard_set(tmp_path / "data", 3, 6)
    prefix = f"opts{next(_PREFIXES)}-{os.getpid()}"
    client = _client(s3_server)
    for p in paths:
        client.upload_file(str(p), s3_server.bucket, f"{prefix}/{p.name}")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    url = f"s3://{s3_server.bucket}/{prefix}"
    store = {"endpoint_url": s3_server.endpoint, "key": "testing", "secret": "testing"}
    index = tmp_path / "opts.tarindex"
    report = build_index(f"{url}/train-*.tar", index=index, workers=2, storage_options=store)
    assert report.scanned == [f"{url}/{p.name}" for p in paths]
    ds = TarDataset(index, storage_options=store)
    want = _oracle(paths)
    assert len(ds) == len(want) and all(_same(ds[i], want[i]) for i in range(len(ds)))
    assert s3_server.endpoint.encode() not in index.read_bytes() and b"testing" not in index.read_bytes()
    from click.testing import CliRunner

    from tarindex.cli.main import main

    out = CliRunner().invoke(main, ["build", f"{url}/train-*.tar", "-o", str(tmp_path / "cli.tarindex"), "-q", "-w", "1",
                                    "--storage-option", f"endpoint_url={s3_server.endpoint}", "--storage-option", "key=testing",
                                    "--storage-option", "secret=testing"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert len(TarDataset(tmp_path / "cli.tarindex", storage_options=store)) == len(want)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # a fresh process: no client made earlier
    proc = subprocess.run([sys.executable, "-m", "tarindex.cli.main", "build", f"{url}/train-*.tar", "-o", str(tmp_path / "none.tarindex"), "-q"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("tarindex: error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
