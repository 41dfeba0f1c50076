"""Random reads of zstd shards over any random-read handle: URL shards through their frame tables,
shards truncated under an open reader, both backends (C ``ZstdReader`` and the Python reference).

Shards are made by ``tarindex compress`` and ``pzstd``, served by nginx, and every sample is compared
with what ``tarfile`` extracts from the plain tar.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from _servers import HTTPServer
from click.testing import CliRunner
from test_zstd import big_tar, check_dataset, expected_samples, pzstd_cli, random_order

import tarindex
import tarindex.dataset
import tarindex.zstd_random
from tarindex.cli.main import main
from tarindex.errors import CorruptFrameError, StaleIndexError
from tarindex.shard_writer import compress_shard

pytestmark = pytest.mark.skipif(shutil.which("pzstd") is None, reason="zstd CLI")  # .ci/run installs it


@pytest.fixture(scope="module")
def small_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 KB samples: every frame of ``tarindex compress`` holds many samples."""
    return big_tar(tmp_path_factory.mktemp("small") / "small.tar", n=600, seed=3)


@pytest.mark.parametrize("tool", ["compress", "pzstd"])
def test_zstd_shard_indexed_from_url_reads_exact_bytes(
    tool: str, impl: str, http_server: HTTPServer, small_tar: Path, tmp_path: Path
) -> None:
    """Issue 12.1: a zstd shard indexed by URL is read through its frame table over ranged reads."""
    www = http_server.root / f"z-{tool}-{impl}"
    www.mkdir()
    shard = www / "x.tar.zst"
    if tool == "compress":
        compress_shard(small_tar, shard)
    else:
        pzstd_cli(small_tar, shard)
    url = http_server.url(shard)
    index = tmp_path / "x.tarindex"
    result = CliRunner().invoke(main, ["build", url, "-o", str(index)])
    assert result.exit_code == 0, result.output
    ds = tarindex.TarDataset(index)
    assert ds.index.shards[0].compression == "zstd"
    oracle = expected_samples(small_tar)
    assert len(ds) == len(oracle)
    assert check_dataset(ds, oracle, random_order(len(ds))) == len(oracle)
    (handle,) = [h for h in ds._opener.handles if h is not None]
    assert handle.fd == -1  # read over HTTP, not from a local file
    result = CliRunner().invoke(main, ["get", str(index), "k00417", "--ext", "cls"])
    assert result.exit_code == 0 and result.stdout_bytes == b"417"
    ds.close()


def test_url_zstd_shard_changed_on_server_is_stale(http_server: HTTPServer, small_tar: Path, tmp_path: Path) -> None:
    www = http_server.root / "z-stale"
    www.mkdir()
    shard = www / "s.tar.zst"
    compress_shard(small_tar, shard)
    index = tmp_path / "s.tarindex"
    tarindex.build_index([http_server.url(shard)], index=index, workers=1)
    with open(shard, "ab") as f:
        f.write(b"\0" * 100)
    with pytest.raises(StaleIndexError, match=r"s\.tar\.zst: .*size"):
        tarindex.TarDataset(index)[0]


def test_verify_deep_compares_frame_tables(small_tar: Path, tmp_path: Path) -> None:
    """A rescan whose frame table differs from the index's is a mismatch, even when the tar tables agree."""
    shard = tmp_path / "v.tar.zst"
    compress_shard(small_tar, shard)
    index = tmp_path / "v.tarindex"
    tarindex.build_index([shard], index=index, workers=1)
    from tarindex.index.reader import IndexReader
    from tarindex.scan import scan_shard
    from tarindex.verify import _first_difference

    old = IndexReader(index).shard_table(0)
    _, same = scan_shard(str(shard))
    assert _first_difference(same, old, 0) is None
    pzstd_cli(small_tar, tmp_path / "other.tar.zst")
    _, other = scan_shard(str(tmp_path / "other.tar.zst"))  # the same tar, other frames
    assert _first_difference(other, old, 0) == "the zstd frame table differs"


@pytest.mark.parametrize("cut", ["mid-shard", "to-zero"])
def test_zstd_shard_truncated_while_open(cut: str, impl: str, small_tar: Path, tmp_path: Path) -> None:
    """Issue 11: a shard truncated in place under an open reader is an error, never a SIGBUS."""
    shard = tmp_path / "t.tar.zst"
    compress_shard(small_tar, shard)
    index = tmp_path / "t.tarindex"
    tarindex.build_index([shard], index=index, workers=1)
    ds = tarindex.TarDataset(index)
    oracle = expected_samples(small_tar)
    check_dataset(ds, oracle, [0])  # the shard is open, its reader made
    size = shard.stat().st_size
    os.truncate(shard, size // 3 if cut == "mid-shard" else 0)  # in place: the same inode, the open descriptor
    tarindex.zstd_random.frame_cache().clear()
    with pytest.raises((CorruptFrameError, StaleIndexError), match=r"t\.tar\.zst: "):
        for i in range(len(ds) - 1, 0, -1):  # from the end: frames beyond the new size
            ds[i]
    ds.close()


def test_reader_over_a_handle_closes_it(small_tar: Path, tmp_path: Path, impl: str) -> None:
    shard = tmp_path / "h.tar.zst"
    compress_shard(small_tar, shard)
    report = tarindex.build_index([shard], index=tmp_path / "h.tarindex", workers=1)
    frames = tarindex.IndexReader(report.path).frame_table(0)
    assert frames is not None

    class Handle:
        closed = 0
        reads = 0

        def __init__(self) -> None:
            self.fd = os.open(shard, os.O_RDONLY)

        def read_at(self, offset: int, size: int) -> bytes:
            Handle.reads += 1
            return os.pread(self.fd, size, offset)

        def close(self) -> None:
            Handle.closed += 1
            os.close(self.fd)

    reader = tarindex.zstd_random.zstd_reader(str(shard), Handle(), frames)
    plain = small_tar.read_bytes()
    for off, size in ((0, 512), (1000, 70_000), (len(plain) - 3000, 10_000)):
        assert reader.read_at(off, size) == plain[off : off + size]
    assert Handle.reads >= 3
    reader.close()
    assert Handle.closed == 1

