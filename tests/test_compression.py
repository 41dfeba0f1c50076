"""Compression by content: refusals with the conversion command, decompression bombs, and padding
after the end-of-archive marker that costs no decompression.

Shards are made by the real tools (``bzip2``, ``xz``, ``lz4``, ``zstd``) or by Python's ``tarfile``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

import tarindex
from conftest import py_tar, tarfile_members
from tarindex.cli.main import main
from tarindex.compression import ArchiveEnd, Limits, codec_of, detect, limits, looks_like_shard, set_limits
from tarindex.errors import DecompressionLimitError, UnsupportedCompressionError
from tarindex.scan import scan_shard
from tarindex.zstd import decompress_frames


@pytest.fixture
def shard_tar(tmp_path: Path) -> Path:
    specs = [(f"s{i:03d}.{ext}", f"{ext} {i} ".encode() * 50) for i in range(40) for ext in ("txt", "cls")]
    return py_tar(tmp_path / "plain.tar", specs, tarfile.GNU_FORMAT, dirs=False)


def _tool(tool: str, src: Path, dst: Path) -> Path:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")  # .ci/run installs bzip2, xz-utils and lz4
    with open(dst, "wb") as out:
        subprocess.run([tool, "-c", str(src)], stdout=out, check=True)
    return dst


@pytest.mark.parametrize(
    ("tool", "suffix", "name", "command"),
    [
        ("bzip2", ".tar.bz2", "bzip2", "bzip2 -dc"),
        ("xz", ".tar.xz", "xz", "xz -dc"),
        ("lz4", ".tar.lz4", "lz4", "lz4 -dc"),
    ],
)
def test_unsupported_compression_is_named_with_its_conversion(
    tool: str, suffix: str, name: str, command: str, shard_tar: Path, tmp_path: Path
) -> None:
    shard = _tool(tool, shard_tar, tmp_path / f"x{suffix}")
    disguised = tmp_path / "looks-plain.tar"  # by content, whatever the name
    shutil.copy(shard, disguised)
    stem = str(tmp_path / "x")
    expected = (
        rf"x{suffix}: {name}-compressed, which tarindex does not read; convert it to a plain tar "
        rf"\('{command} .*x{suffix} > .*x\.tar'\) or to a zstd shard"
    )
    with pytest.raises(UnsupportedCompressionError, match=expected) as err:
        scan_shard(str(shard))
    assert f"tarindex compress {stem}.tar {stem}.tar.zst" in str(err.value)
    with pytest.raises(UnsupportedCompressionError, match=rf"looks-plain\.tar: {name}-compressed"):
        scan_shard(str(disguised))
    with pytest.raises(UnsupportedCompressionError, match=expected):
        list(tarindex.TarStream([str(shard)]))
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(tmp_path / "x.tarindex")])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and f"{name}-compressed" in result.output
    assert "checksum" not in result.output and "not a tar" not in result.output


def test_detection_by_magic() -> None:
    assert detect(b"\x28\xb5\x2f\xfd\x00\x00") == "zstd"
    assert detect(b"\x50\x2a\x4d\x18\x00\x00") == "zstd"  # a skippable frame first (pzstd)
    assert detect(b"\x1f\x8b\x08\x00\x00\x00") == "gzip"
    assert detect(b"BZh91AY&SY") == "bzip2" and detect(b"BZh0") == "tar"
    assert detect(b"\xfd7zXZ\x00") == "xz"
    assert detect(b"\x04\x22\x4d\x18\x64\x40") == "lz4"
    assert detect(b"\x1f\x9d\x90") == "compress"
    assert detect(b"abc") == "tar" and detect(b"") == "tar"
    assert codec_of(b"\x1f\x8b\x08\x00", "a.tgz") == "gzip"
    with pytest.raises(UnsupportedCompressionError, match=r"a\.tar\.Z: Unix compress \(\.Z\)-compressed"):
        codec_of(b"\x1f\x9d\x90", "a.tar.Z")


def test_looks_like_shard(shard_tar: Path, tmp_path: Path) -> None:
    assert looks_like_shard(shard_tar.read_bytes()[:512])
    assert looks_like_shard(b"\x1f\x8b\x08" + bytes(509))
    index = tarindex.build_index([shard_tar], index=tmp_path / "i.tarindex", workers=1).path
    assert not looks_like_shard(Path(index).read_bytes()[:512])
    assert not looks_like_shard(b"just text\n" * 60)


# -- bombs and padding (issue 19.2) ---------------------------------------------------


def _zeros_zst(out: Path, head: bytes, zeros: int, *, tail: bytes = b"") -> Path:
    """``head`` + ``zeros`` zero bytes + ``tail`` as one zstd frame (streamed: never all in memory)."""
    cobj = zstandard.ZstdCompressor(level=1).compressobj()
    with open(out, "wb") as f:
        f.write(cobj.compress(head))
        block = bytes(1 << 20)
        for _ in range(zeros >> 20):
            f.write(cobj.compress(block))
        f.write(cobj.compress(bytes(zeros & ((1 << 20) - 1)) + tail))
        f.write(cobj.flush())
    return out


@pytest.fixture
def small_limits() -> Iterator[Limits]:
    previous = set_limits(Limits(max_ratio=100, ratio_floor=1 << 20, padding=64 << 10))
    yield limits()
    set_limits(previous)


def test_expansion_ratio_is_a_named_error(tmp_path: Path, small_limits: Limits) -> None:
    header = tarfile.TarInfo("bomb.bin")
    header.size = 32 << 20
    shard = _zeros_zst(tmp_path / "bomb.tar.zst", header.tobuf(tarfile.GNU_FORMAT), 32 << 20)
    assert shard.stat().st_size < 10_000
    what = r"bomb\.tar\.zst: decompresses to more than 100 times its compressed size \(\d+ bytes from \d+\)"
    with pytest.raises(DecompressionLimitError, match=what):
        scan_shard(str(shard))
    with pytest.raises(DecompressionLimitError, match=what):
        list(tarindex.TarStream([str(shard)]))
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(tmp_path / "b.tarindex")])
    assert result.exit_code == 1 and "decompression bomb" in result.output


def test_bomb_stops_early_with_default_limits(tmp_path: Path) -> None:
    """A 1 GiB member of zeros in ~40 KB: the default bound (1024x past 64 MiB) stops it; peak memory stays small."""
    header = tarfile.TarInfo("big.bin")
    header.size = 1 << 30
    shard = _zeros_zst(tmp_path / "gib.tar.zst", header.tobuf(tarfile.GNU_FORMAT), 1 << 30)
    script = textwrap.dedent(f"""
        import resource, sys, tarindex
        from tarindex.errors import DecompressionLimitError
        try:
            list(tarindex.TarStream([{str(shard)!r}]))
        except DecompressionLimitError as exc:
            print("limit", exc.offset)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}).stdout.split()
    assert out[0] == "limit"
    assert int(out[-1]) < 600, f"peak RSS {out[-1]} MiB"  # was 2.3 GB; the import of torch alone is ~300 MiB


@pytest.mark.parametrize("hold", [False, True])
def test_padding_after_the_end_marker_is_not_decompressed(hold: bool, shard_tar: Path) -> None:
    """After ``end.set()`` at most ``padding`` more bytes come out; the rest is walked, not decompressed.

    With ``hold`` (streaming), up to 32 MiB of a frame are held back until verified, so they come out too.
    """
    previous = set_limits(Limits(padding=64 << 10))
    try:
        data = shard_tar.read_bytes()
        frame = zstandard.ZstdCompressor(level=1).compress(data + bytes(512 << 20))  # 512 MiB of padding
        pieces = [frame[i : i + 4096] for i in range(0, len(frame), 4096)]
        end = ArchiveEnd()
        out = 0
        t = time.perf_counter()
        for piece in decompress_frames(pieces, "p.tar.zst", hold=hold, end=end):
            out += len(piece)
            if out >= len(data):
                end.set()
        assert end.skipped and end.partial
        held = (32 << 20) if hold else 0
        piece = 1 << 20  # output pieces of a large frame: the end is seen after the first, the bound after a second
        assert len(data) <= out <= held + 2 * piece + (64 << 10)
        assert time.perf_counter() - t < 2.0  # decompressing 512 MiB takes longer on this machine
    finally:
        set_limits(previous)


@pytest.mark.parametrize("frames", ["one", "many"])
def test_shard_with_gigabytes_of_zeros_after_the_end(frames: str, shard_tar: Path, tmp_path: Path) -> None:
    """Stream and build read a valid tar followed by 2 GiB of zeros; only the padding is decompressed."""
    data = shard_tar.read_bytes()
    shard = tmp_path / "padded.tar.zst"
    if frames == "one":
        _zeros_zst(shard, data, 2 << 30)
    else:  # the tar in sample-aligned frames (tarindex compress), then 1 MiB frames of zeros
        tarindex.compress_shard(shard_tar, shard)
        body = shard.read_bytes()
        cctx = zstandard.ZstdCompressor(level=1)
        zeros = cctx.compress(bytes(1 << 20))
        with open(shard, "wb") as f:
            f.write(tarindex_zstd_frames(body))  # without the seek table, which would not list the zeros
            for _ in range(2048):
                f.write(zeros)
    oracle = dict(tarfile_members(shard_tar))
    t = time.perf_counter()
    got = {s["__key__"]: s for s in tarindex.TarStream([str(shard)])}
    assert len(got) == 40 and got["s007"]["txt"] == oracle["s007.txt"]
    info, table = scan_shard(str(shard))
    assert table.n_samples == 40
    if frames == "many":
        assert info.random_access
        index = tarindex.build_index([shard], index=tmp_path / "p.tarindex", workers=1).path
        ds = tarindex.TarDataset(index)
        assert ds[7]["txt"] == oracle["s007.txt"] and ds[39]["cls"] == oracle["s039.cls"]
    else:
        assert not info.random_access  # the walk stopped inside the frame: its row is not whole
    assert time.perf_counter() - t < 20  # decompressing 2 GiB twice took ~10 s here before


def tarindex_zstd_frames(body: bytes) -> bytes:
    """The data frames of a ``tarindex compress`` file, without its trailing seek table."""
    rows: list[tuple[int, int, int, int]] = []
    for _ in decompress_frames([body], "x", rows):
        pass
    last = rows[-1]
    return body[: last[0] + last[1]]

