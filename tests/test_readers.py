"""The RandomReader contract (tarindex.access.reader): every reader ``open_random`` hands out (local file, HTTP,
object store, hub, fsspec, zstd, gzip, block-cached) through the same cases, on both backends, against the tar bytes
tarfile wrote."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from _servers import HTTPServer, S3Server
from test_hub import repo  # noqa: F401  # the fixture: a repository on the local Hub server
from test_objstore import _client, s3_env  # noqa: F401  # the fixture: moto's S3 in the standard environment

from conftest import make_shard_set
from tarindex import build_index
from tarindex.access import open as opening
from tarindex.access.codecs import Indexed
from tarindex.access.reader import RandomReader
from tarindex.index.reader import IndexReader
from tarindex.options import SourceOptions
from tarindex.shard_writer import compress_shard

pytestmark = pytest.mark.usefixtures("impl")  # every reader on both backends

KINDS = ["local", "zstd", "gzip", "http", "s3", "s3-cached", "hub", "fsspec"]


def _opened(name: str, index: Path, options: SourceOptions | None = None) -> tuple[RandomReader, IndexReader]:
    reader = IndexReader(index)
    opts = opening.OpenOptions(options or SourceOptions())
    return opening.open_random(name, Indexed(reader, 0), opts), reader


@pytest.fixture(params=KINDS)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, RandomReader, bytes]]:
    """``(kind, reader, the tar bytes it reads)``: a shard indexed and opened as TarDataset opens it."""
    kind: str = request.param
    (plain,) = make_shard_set(tmp_path / "src", n_shards=1, per=9)
    want = plain.read_bytes()
    name: str
    options = None
    if kind == "local":
        name = str(plain)
    elif kind == "zstd":
        name = str(tmp_path / "s.tar.zst")
        compress_shard(plain, name, frame_size=2048)
    elif kind == "gzip":
        name = str(tmp_path / "s.tar.gz")
        with open(name, "wb") as out:
            subprocess.run(["gzip", "-c", str(plain)], check=True, stdout=out)
    elif kind == "http":
        server: HTTPServer = request.getfixturevalue("http_server")
        served = server.root / f"readers-{tmp_path.name}.tar"
        served.write_bytes(want)
        name = server.url(served)
    elif kind in ("s3", "s3-cached"):
        s3: S3Server = request.getfixturevalue("s3_env")
        key = f"readers/{tmp_path.name}.tar"
        _client(s3).put_object(Bucket=s3.bucket, Key=key, Body=want)
        name = f"s3://{s3.bucket}/{key}"
        if kind == "s3-cached":
            options = SourceOptions(cache_dir=str(tmp_path / "blocks"))
    elif kind == "fsspec":  # any other protocol: fsspec's in-memory file system, read through FsspecReader
        name = f"memory://readers/{tmp_path.name}.tar"
        fsspec.filesystem("memory").pipe(name, want)
        request.addfinalizer(lambda: fsspec.filesystem("memory").rm(name))
    else:
        url, paths = request.getfixturevalue("repo")
        name = f"{url}/data/{paths[0].name}"
        want = paths[0].read_bytes()
    index = build_index([name], index=tmp_path / "x.tarindex", workers=1).path
    reader, ix = _opened(name, index, options)
    try:
        yield kind, reader, want
    finally:
        reader.close()
        ix.close()


def test_reads_give_the_tar_bytes(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    assert isinstance(reader, RandomReader)
    assert reader.read_at(0, len(want)) == want
    for offset, size in ((0, 1), (511, 2), (1000, 3000), (len(want) - 700, 700)):
        assert reader.read_at(offset, size) == want[offset : offset + size], (kind, offset, size)


def test_a_read_past_the_end_is_short_and_an_empty_one_is_empty(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    assert reader.read_at(len(want) - 10, 100) == want[-10:], kind
    assert reader.read_at(len(want) + 512, 100) == b"", kind
    assert reader.read_at(100, 0) == b"", kind


def test_size_and_fileno(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    assert reader.size in (len(want), -1), kind  # -1: not known (gzip: the decompressed length is not recorded)
    assert (reader.size == -1) == (kind == "gzip")
    fd = reader.fileno()
    assert (fd is not None) == (kind == "local")  # only a plain local shard's descriptor reads the tar bytes
    if fd is not None:
        assert os.pread(fd, 2048, 1024) == want[1024:3072]


def test_threads_read_the_same_reader(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    spans = [((k * 977) % (len(want) - 600), 600) for k in range(64)]
    got: dict[int, bytes] = {}

    def work(first: int) -> None:
        for k in range(first, len(spans), 4):
            offset, size = spans[k]
            got[k] = reader.read_at(offset, size)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[k] == want[o : o + n] for k, (o, n) in enumerate(spans)), kind


def test_close_twice_is_harmless(case: tuple[str, RandomReader, bytes]) -> None:
    _, reader, _ = case
    reader.close()
    reader.close()


def test_read_many_of_no_range_is_empty(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, _ = case
    assert reader.read_many([]) == [], kind


def test_read_many_gives_each_range_in_the_order_asked(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    one = [(1000, 3000)]
    assert reader.read_many(one) == [want[1000:4000]], kind
    unordered = [(len(want) - 700, 700), (0, 1), (4096, 512), (511, 2), (2048, 100)]
    assert reader.read_many(unordered) == [want[o : o + n] for o, n in unordered], kind
    overlapping = [(1000, 3000), (1500, 100), (1000, 3000), (3990, 20), (0, 0)]
    assert reader.read_many(overlapping) == [want[o : o + n] for o, n in overlapping], kind


def test_read_many_past_the_end_reads_as_read_at(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    ranges = [(len(want) - 10, 100), (len(want) + 512, 100), (100, 10)]
    got = reader.read_many(ranges)
    assert got == [reader.read_at(o, n) for o, n in ranges] == [want[-10:], b"", want[100:110]], kind


def test_read_many_of_many_ranges_reads_them_all(case: tuple[str, RandomReader, bytes]) -> None:
    kind, reader, want = case
    spans = [((k * 7919) % (len(want) - 600), 1 + k % 600) for k in range(200)]
    assert reader.read_many(spans) == [want[o : o + n] for o, n in spans], kind
