"""The shard-access wing (tarindex.access): one path opens a shard for random reads, one registry names its codec."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _servers import S3Server
from test_hub import repo  # noqa: F401  # the fixture: a repository on the local Hub server
from test_objstore import _client, s3_env  # noqa: F401  # the fixture: moto's S3 in the standard environment

from conftest import make_shard_set, tarfile_members
from tarindex import TarDataset, TarStream, build_index, verify_index
from tarindex.access import open as opening
from tarindex.access.codecs import RANDOM, Indexed, codec
from tarindex.access.reader import LocalReader, RandomReader
from tarindex.errors import RandomAccessError, ShardNotFoundError
from tarindex.index.reader import IndexReader
from tarindex.options import SourceOptions
from tarindex.shard_writer import compress_shard

pytestmark = pytest.mark.usefixtures("impl")  # every test on both backends


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every shard opened through the one path (``open_checked``, which ``open_random`` calls), by name."""
    names: list[str] = []
    real: Callable[..., RandomReader] = opening.open_checked

    def spy(name: str, *args: Any, **kwargs: Any) -> RandomReader:
        names.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(opening, "open_checked", spy)
    return names


def test_dataset_stream_and_verify_open_shards_through_the_one_path(tmp_path: Path, opened: list[str]) -> None:
    paths = make_shard_set(tmp_path, n_shards=2, per=6)
    index = build_index([str(p) for p in paths], index=tmp_path / "x.tarindex").path
    ds = TarDataset(index)
    assert ds[7]["__url__"] == ds.urls[1] and ds[8]["__url__"] == ds.urls[1]
    assert opened == [ds.urls[1]]  # the dataset's first read of shard 1; the second one uses the open handle
    opened.clear()

    stream = TarStream(index)
    it = iter(stream)
    head = [next(it) for _ in range(8)]
    resumed = TarStream(index)
    resumed.load_state_dict(stream.state_dict())
    rest = list(resumed)
    assert [s["__key__"] for s in head + rest] == [s["__key__"] for s in TarStream(index)]
    assert opened == [ds.urls[1]]  # resumed mid-shard 1 by random reads
    opened.clear()

    verify_index(index)
    assert opened == [ds.urls[0], ds.urls[1]]


def test_ds_i_opens_a_shard_with_no_call_back_up_a_layer(tmp_path: Path, impl: str) -> None:
    """The handle table opens a shard through the :class:`~tarindex.access.open.IndexOpener` the dataset gave
    it, never through a call back into ``dataset``; the C reader reads the shard's first sample itself."""
    paths = make_shard_set(tmp_path, n_shards=2, per=6)
    ds = TarDataset(build_index([str(p) for p in paths], index=tmp_path / "x.tarindex").path)
    assert ds[0]["__key__"] == "s00i000"
    callers: list[tuple[str, str]] = []  # open_random's caller, and who called that
    modules: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        modules.add(frame.f_globals.get("__name__", ""))
        if frame.f_code.co_name == "open_random" and frame.f_back is not None and frame.f_back.f_back is not None:
            callers.append((frame.f_back.f_code.co_qualname, frame.f_back.f_back.f_globals["__name__"]))

    sys.setprofile(profile)
    try:
        sample = ds[7]  # shard 1's first read: its open
    finally:
        sys.setprofile(None)
    assert sample["__key__"] == "s01i001" and sample["__url__"] == ds.urls[1]
    assert callers == [("IndexOpener.__call__", "tarindex.access.handles")]
    assert ("tarindex.dataset" in modules) == (impl == "python")  # the Python reader is dataset's; the C one is not


def test_a_zstd_and_a_gzip_shard_read_at_random_give_the_tar_bytes(tmp_path: Path) -> None:
    (plain,) = make_shard_set(tmp_path, n_shards=1, per=5)
    zst = tmp_path / "z.tar.zst"
    compress_shard(plain, zst, frame_size=1024)  # sample-aligned frames: read at random
    gz = tmp_path / "g.tar.gz"
    with gz.open("wb") as out:
        subprocess.run(["gzip", "-c", str(plain)], check=True, stdout=out)
    index = build_index([str(zst), str(gz)], index=tmp_path / "x.tarindex").path
    want = plain.read_bytes()
    reader = IndexReader(index)
    try:
        assert [info.compression for info in reader.shards] == ["zstd", "gzip"]
        for shard in range(2):
            name = str(tmp_path / reader.shards[shard].path)
            got = opening.open_random(name, Indexed(reader, shard), opening.OpenOptions())
            assert got.fileno() is None  # no descriptor reads the decompressed bytes
            try:
                assert got.read_at(0, len(want)) == want
                assert got.read_at(1000, 700) == want[1000:1700]
            finally:
                got.close()
    finally:
        reader.close()


def test_codecs_are_one_table_and_an_unindexed_shard_is_read_by_its_first_bytes(tmp_path: Path) -> None:
    assert [c.name for c in RANDOM] == ["tar", "zstd", "gzip"]
    (plain,) = make_shard_set(tmp_path, n_shards=1, per=3)
    reader = opening.open_random(str(plain), None, opening.OpenOptions())
    try:
        assert isinstance(reader, LocalReader) and isinstance(reader, RandomReader)
        assert reader.fileno() is not None and reader.size == plain.stat().st_size
        assert codec(None, reader).name == "tar"
        names = [n for n, _ in tarfile_members(plain)]
        assert names and reader.read_at(0, 100).rstrip(b"\0").decode() == names[0]
        assert reader.read_at(0, plain.stat().st_size + 10) == plain.read_bytes()
    finally:
        reader.close()
    gz = tmp_path / "g.tar.gz"
    with gz.open("wb") as out:
        subprocess.run(["gzip", "-c", str(plain)], check=True, stdout=out)
    with pytest.raises(RandomAccessError, match=r"g\.tar\.gz.*seek points"):
        opening.open_random(str(gz), None, opening.OpenOptions())
    with pytest.raises(RandomAccessError, match="command"):
        opening.open_random("pipe:cat x", None, opening.OpenOptions())
    with pytest.raises(ShardNotFoundError, match="missing"):
        opening.open_random(str(tmp_path / "none.tar"), None, opening.OpenOptions())


@pytest.mark.parametrize("store", ["s3", "hub"])
def test_a_stream_of_remote_shards_resumes_mid_shard_by_random_reads(
    store: str, request: pytest.FixtureRequest, tmp_path: Path, opened: list[str]
) -> None:
    """Streaming an index of object-store or hub shards, a resumed shard is entered at its saved offset by
    ranged reads (open_random), as TarDataset reads it, not read again from byte 0."""
    if store == "s3":
        s3: S3Server = request.getfixturevalue("s3_env")
        paths = make_shard_set(tmp_path / "src", n_shards=2, per=8)
        names = []
        for p in paths:
            key = f"access/{tmp_path.name}/{p.name}"
            _client(s3).put_object(Bucket=s3.bucket, Key=key, Body=p.read_bytes())
            names.append(f"s3://{s3.bucket}/{key}")
    else:
        url, paths = request.getfixturevalue("repo")
        names = [f"{url}/data/{p.name}" for p in paths[:2]]
    index = build_index(names, index=tmp_path / "x.tarindex", workers=1).path
    full = [s["__key__"] for s in TarStream(index)]
    assert len(full) == 2 * len(set(full[: len(full) // 2]))
    stream = TarStream(index)
    it = iter(stream)
    head = [next(it)["__key__"] for _ in range(len(full) // 2 + 3)]  # 3 samples into the second shard
    opened.clear()
    resumed = TarStream(index)
    resumed.load_state_dict(stream.state_dict())
    assert head + [s["__key__"] for s in resumed] == full
    assert opened == [names[1]]  # the second shard, entered by random reads at its saved offset


def test_a_stream_takes_source_options_and_the_old_keywords_override_them() -> None:
    given = SourceOptions(retries=1, timeout=5.0, storage_options={"anon": True}, headers={"X-A": "1"})
    stream = TarStream(["http://127.0.0.1:9/a.tar"], options=given, retries=3, block_size=1 << 16)
    assert stream.options == SourceOptions(
        block_size=1 << 16, retries=3, timeout=5.0, storage_options={"anon": True}, headers={"X-A": "1"}
    )
    assert TarStream(["s3://b/a.tar"], storage_options={"k": 1}).options.storage_options == {"k": 1}
    assert TarStream(["http://127.0.0.1:9/a.tar"]).options == SourceOptions()
