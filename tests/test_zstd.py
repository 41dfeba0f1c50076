"""zstd shards: detection, indexing, frame tables, seek tables, random access, errors.

Every compressed shard is made by a real tool (the ``zstd`` and ``pzstd`` CLIs,
the ``zstandard`` package, ``tarindex compress``); every sample's bytes are
compared with what ``tarfile`` extracts from the tar that ``zstd -d`` gives back.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import tarindex
from conftest import make_shard_set, py_tar, require_c_extension, tarfile_members, use_pure_python
from tarindex.cli.main import main
from tarindex.errors import CorruptArchiveError, CorruptFrameError, RandomAccessError, StaleIndexError
from tarindex.grouping import split_key
from tarindex.index.reader import IndexReader
from tarindex.scan import scan_shard
from tarindex.shard_writer import compress_shard
from tarindex.zstd import frame_array, is_zstd, iter_decompressed
from tarindex.zstd_random import DEFAULT_CACHE_BYTES, SEED_BYTES, FrameCache, ZstdShardReader, frame_cache, zstd_reader

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("pzstd") is None, reason="zstd CLI")
# .ci/run installs Debian's zstd package (zstd and pzstd), so in CI this never skips.

SEEKABLE_MAGIC = 0x8F92EAB1


def zstd_cli(src: Path, dst: Path, *args: str) -> Path:
    subprocess.run(["zstd", "-q", "-f", *args, str(src), "-o", str(dst)], check=True)
    return dst


def pzstd_cli(src: Path, dst: Path) -> Path:
    subprocess.run(["pzstd", "-q", "-f", "-1", "-p", "2", str(src), "-o", str(dst)], check=True)
    return dst


def zstd_decompress(src: Path, dst: Path) -> Path:
    subprocess.run(["zstd", "-q", "-d", "-f", str(src), "-o", str(dst)], check=True)
    return dst


def big_tar(path: Path, n: int = 1500, seed: int = 0) -> Path:
    """A ~5 MB tar: samples of 0.5-3 KB, partly compressible, so pzstd -1 makes several 2 MiB frames."""
    rng = np.random.default_rng(seed)
    specs = []
    for i in range(n):
        noise = rng.integers(0, 255, int(rng.integers(300, 2000)), dtype=np.uint8).tobytes()
        specs += [(f"k{i:05d}.bin", noise + bytes(int(rng.integers(0, 1000)))), (f"k{i:05d}.cls", str(i).encode())]
    return py_tar(path, specs, tarfile.GNU_FORMAT, dirs=False)


def expected_samples(tar: Path) -> dict[str, dict[str, bytes]]:
    """The oracle: samples by key from tarfile's extraction."""
    out: dict[str, dict[str, bytes]] = {}
    for name, data in tarfile_members(tar):
        split = split_key(name)
        if split is not None:
            out.setdefault(split[0], {})[split[1]] = data
    return out


def check_dataset(ds: tarindex.TarDataset, oracle: dict[str, dict[str, bytes]], order: list[int] | None = None) -> int:
    order = list(range(len(ds))) if order is None else order
    for i in order:
        s = ds[i]
        want = oracle[s["__key__"]]
        assert {k: v for k, v in s.items() if not k.startswith("__")} == want, s["__key__"]
    return len(order)


def random_order(n: int) -> list[int]:
    order = list(range(n))
    random.Random(1).shuffle(order)
    return order


@pytest.fixture(params=["libzstd", "python-zstandard", "python"])
def zstd_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The C reader decompressing with the system's libzstd or through python-zstandard, or the Python reader
    (the reference: python-zstandard, the Python frame cache)."""
    if request.param == "python":
        use_pure_python(monkeypatch)
        yield "python"
        return
    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    was = SPEEDUPS._libzstd()
    if request.param == "libzstd" and not was:
        pytest.skip("libzstd.so.1 is not installed here")
    SPEEDUPS._libzstd(request.param == "libzstd")
    try:
        yield request.param
    finally:
        SPEEDUPS._libzstd(was)


# -- compressed shards from every tool ------------------------------------------


def _by_zstd_cli(tar: Path, out: Path) -> Path:
    return zstd_cli(tar, out)


def _by_pzstd(tar: Path, out: Path) -> Path:
    return pzstd_cli(tar, out)


def _by_zstandard(tar: Path, out: Path) -> Path:
    out.write_bytes(zstandard.ZstdCompressor(level=3).compress(tar.read_bytes()))
    return out


def _by_zstandard_frames(tar: Path, out: Path) -> Path:
    """Frames of 100,000 bytes (not sample-aligned), a skippable frame before each, checksums on."""
    data = tar.read_bytes()
    cctx = zstandard.ZstdCompressor(level=1, write_checksum=True)
    parts = []
    for i in range(0, len(data), 100_000):
        parts.append((0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc")
        parts.append(cctx.compress(data[i : i + 100_000]))
    out.write_bytes(b"".join(parts))
    return out


def _by_compress(tar: Path, out: Path) -> Path:
    compress_shard(tar, out)
    return out


TOOLS = {
    "zstd-cli": _by_zstd_cli,
    "pzstd": _by_pzstd,
    "zstandard": _by_zstandard,
    "zstandard-frames": _by_zstandard_frames,
    "tarindex-compress": _by_compress,
}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return big_tar(tmp_path_factory.mktemp("big") / "big.tar")


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_sample_matches_tarfile(tool: str, big: Path, tmp_path: Path) -> None:
    shard = TOOLS[tool](big, tmp_path / "big.tar.zst")
    restored = zstd_decompress(shard, tmp_path / "restored.tar")  # the oracle comes from zstd -d
    assert restored.read_bytes() == big.read_bytes()
    report = tarindex.build_index([shard], index=tmp_path / "x.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    oracle = expected_samples(restored)
    assert len(ds) == len(oracle)
    assert check_dataset(ds, oracle, random_order(len(ds))) == len(oracle)
    info = ds.index.shards[0]
    assert info.compression == "zstd" and info.random_access
    frames = ds.index.frame_table(0)
    assert frames is not None
    assert int(frames[-1, 2] + frames[-1, 3]) == big.stat().st_size
    size = big.stat().st_size
    expected_frames = {"zstd-cli": 1, "zstandard": 1, "pzstd": -(-size // (2 << 20)), "zstandard-frames": -(-size // 100_000)}
    if tool in expected_frames:
        assert len(frames) == expected_frames[tool]
    else:
        assert len(frames) > 50


def test_tables_equal_plain_tar(big: Path, tmp_path: Path) -> None:
    _, plain = scan_shard(str(big))
    for tool in TOOLS:
        _, table = scan_shard(str(TOOLS[tool](big, tmp_path / f"{tool}.tar.zst")))
        assert table.keys == plain.keys
        for col in ("sample_offset", "sample_size", "member_offset", "member_size"):
            assert (getattr(table, col) == getattr(plain, col)).all(), (tool, col)


def test_detection_by_content_not_name(big: Path, tmp_path: Path) -> None:
    disguised = zstd_cli(big, tmp_path / "looks-plain.tar")
    plain = tmp_path / "looks-compressed.tar.zst"
    shutil.copy(big, plain)
    assert is_zstd(disguised.read_bytes()[:4]) and not is_zstd(plain.read_bytes()[:4])
    report = tarindex.build_index([disguised, plain], index=tmp_path / "x.tarindex", workers=1)
    ix = IndexReader(report.path)
    assert [s.compression for s in ix.shards] == ["zstd", None]
    assert ix.frame_table(0) is not None and ix.frame_table(1) is None


def test_mixed_plain_and_zstd_index(tmp_path: Path) -> None:
    plain = make_shard_set(tmp_path / "d", n_shards=4, per=30)
    mixed = [plain[0], zstd_cli(plain[1], tmp_path / "d" / "one.tar.zst")]
    mixed += [pzstd_cli(plain[2], tmp_path / "d" / "two.tar.zst"), _by_compress(plain[3], tmp_path / "d" / "three.tar.zst")]
    report = tarindex.build_index(mixed, index=tmp_path / "mixed.tarindex", workers=2)
    ds = tarindex.TarDataset(report.path)
    oracle: dict[str, dict[str, bytes]] = {}
    for p in plain:
        oracle.update(expected_samples(p))
    assert len(ds) == 120
    check_dataset(ds, oracle, random_order(len(ds)))
    assert [s.compression for s in ds.index.shards] == [None, "zstd", "zstd", "zstd"]
    assert ds.get("s03i029")["txt"] == b"text 3 29"


def test_streamed_build_records_frame_table(big: Path, tmp_path: Path) -> None:
    """A zstd shard indexed from a pipe gets the same tables and frame table as the local file."""
    shard = _by_compress(big, tmp_path / "p.tar.zst")
    local = tarindex.build_index([shard], index=tmp_path / "local.tarindex", workers=1)
    piped = tarindex.build_index([f"pipe:cat {shard}"], index=tmp_path / "piped.tarindex", workers=1)
    a, b = IndexReader(local.path), IndexReader(piped.path)
    assert b.shards[0].compression == "zstd" and b.shards[0].random_access
    assert np.array_equal(a.frame_table(0), b.frame_table(0))
    assert np.array_equal(a.decode().offset, b.decode().offset)
    assert b.shards[0].fingerprint == a.shards[0].fingerprint


def test_incremental_build_and_merge_keep_frame_tables(big: Path, tmp_path: Path) -> None:
    shard = _by_compress(big, tmp_path / "a.tar.zst")
    other = make_shard_set(tmp_path / "o", n_shards=1, per=5)[0]
    first = tarindex.build_index([shard], index=tmp_path / "a.tarindex")
    frames = IndexReader(first.path).frame_table(0)
    again = tarindex.build_index([shard, other], index=tmp_path / "a.tarindex")
    assert again.reused == [str(shard)]
    ix = IndexReader(again.path)
    assert np.array_equal(ix.frame_table(0), frames) and ix.frame_table(1) is None
    part = tarindex.build_index([other], index=tmp_path / "b.tarindex")
    alone = tarindex.build_index([shard], index=tmp_path / "c.tarindex")
    merged = tarindex.merge_indexes([part.path, alone.path], tmp_path / "m.tarindex")
    mx = IndexReader(merged)
    assert mx.frame_table(0) is None and np.array_equal(mx.frame_table(1), frames)
    assert mx.shards[1].compression == "zstd"
    check_dataset(tarindex.TarDataset(merged), {**expected_samples(big), **expected_samples(other)})


# -- the writer's output: round trip, sample-aligned frames, seek table -----------


def independent_seek_table(data: bytes) -> list[tuple[int, int]]:
    """Read a seek table following the seekable format's description, nothing from tarindex."""
    footer = data[-9:]
    assert int.from_bytes(footer[5:9], "little") == SEEKABLE_MAGIC
    n = int.from_bytes(footer[0:4], "little")
    descriptor = footer[4]
    entry = 12 if descriptor & 0x80 else 8
    assert descriptor & 0x7C == 0
    size = n * entry + 9
    frame = data[-(size + 8) :]
    assert int.from_bytes(frame[0:4], "little") == 0x184D2A5E
    assert int.from_bytes(frame[4:8], "little") == size
    return [
        (int.from_bytes(frame[8 + k * entry : 12 + k * entry], "little"), int.from_bytes(frame[12 + k * entry : 16 + k * entry], "little"))
        for k in range(n)
    ]


def test_compress_round_trip_and_seek_table(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.tar.zst"
    result = CliRunner().invoke(main, ["compress", str(big), str(out), "--level", "5", "--frame-size", "50000"])
    assert result.exit_code == 0, result.output
    assert zstd_decompress(out, tmp_path / "back.tar").read_bytes() == big.read_bytes()
    data = out.read_bytes()
    table = independent_seek_table(data)
    # each entry is one zstd frame, in order, and the frames plus the seek table make up the file
    pos = d_total = 0
    for c_size, d_size in table:
        assert data[pos : pos + 4] == b"\x28\xb5\x2f\xfd"
        assert len(zstandard.ZstdDecompressor().decompress(data[pos : pos + c_size])) == d_size
        pos += c_size
        d_total += d_size
    assert d_total == big.stat().st_size
    assert pos + 8 + len(table) * 8 + 9 == len(data)
    # frames start on sample boundaries, and hold at least 50,000 bytes (but the last)
    _, plain = scan_shard(str(big))
    starts = set(plain.sample_offset.tolist()) | {0}
    d_offsets = np.cumsum([0] + [d for _, d in table])[:-1]
    assert set(d_offsets.tolist()) <= starts
    assert all(d >= 50_000 for _, d in table[:-1])
    # the index's frame table is the seek table
    frames = scan_shard(str(out))[1].frames
    assert frames is not None
    assert [(int(c), int(d)) for c, d in frames[:, [1, 3]]] == table


def test_seekable_file_from_another_writer(big: Path, tmp_path: Path) -> None:
    """Frames of 65,536 bytes cut anywhere (samples span frames), seek table written by the test."""
    data = big.read_bytes()
    cctx = zstandard.ZstdCompressor(level=1)
    frames = [cctx.compress(data[i : i + 65536]) for i in range(0, len(data), 65536)]
    entries = b"".join(len(f).to_bytes(4, "little") + min(65536, len(data) - k * 65536).to_bytes(4, "little") for k, f in enumerate(frames))
    footer = len(frames).to_bytes(4, "little") + b"\x00" + SEEKABLE_MAGIC.to_bytes(4, "little")
    seek = (0x184D2A5E).to_bytes(4, "little") + (len(entries) + 9).to_bytes(4, "little") + entries + footer
    shard = tmp_path / "s.tar.zst"
    shard.write_bytes(b"".join(frames) + seek)
    report = tarindex.build_index([shard], index=tmp_path / "s.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    assert len(ds.index.frame_table(0)) == len(frames)
    check_dataset(ds, expected_samples(big), random_order(len(ds)))


def test_seek_table_that_disagrees(big: Path, tmp_path: Path) -> None:
    shard = _by_compress(big, tmp_path / "s.tar.zst")
    data = bytearray(shard.read_bytes())
    table = independent_seek_table(bytes(data))
    n = len(table)
    entry_at = len(data) - 9 - n * 8 + 3 * 8 + 4  # frame 3's decompressed size
    data[entry_at : entry_at + 4] = (table[3][1] + 512).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    frame3 = sum(c for c, _ in table[:3])
    with pytest.raises(CorruptFrameError, match=rf"s\.tar\.zst: seek table disagrees with frame 3 .* at offset {frame3}$") as err:
        scan_shard(str(shard))
    assert err.value.offset == frame3


def test_seek_table_with_shifted_compressed_sizes(big: Path, tmp_path: Path) -> None:
    """Entries 3 and 4 keep their sum but move the boundary: frame 3 then holds bytes of frame 4."""
    shard = _by_compress(big, tmp_path / "s.tar.zst")
    data = bytearray(shard.read_bytes())
    table = independent_seek_table(bytes(data))
    at = len(data) - 9 - len(table) * 8 + 3 * 8
    data[at : at + 4] = (table[3][0] + 10).to_bytes(4, "little")
    data[at + 8 : at + 12] = (table[4][0] - 10).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    frame3 = sum(c for c, _ in table[:3])
    with pytest.raises(CorruptFrameError, match=rf"seek table disagrees with frame 3 .* at offset {frame3}$"):
        scan_shard(str(shard))


# -- streaming decompression ---------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 3, 4096, 1 << 20])
def test_iter_decompressed_any_chunking(piece: int, tmp_path: Path) -> None:
    small = big_tar(tmp_path / "small.tar", n=40)
    data = _by_zstandard_frames(small, tmp_path / "f.zst").read_bytes() + pzstd_cli(small, tmp_path / "p.zst").read_bytes()
    chunks = (data[i : i + piece] for i in range(0, len(data), piece))
    assert b"".join(iter_decompressed(chunks, "f.zst")) == small.read_bytes() * 2


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(
        st.tuples(st.binary(max_size=3000), st.integers(1, 19), st.booleans(), st.booleans(), st.integers(0, 40)),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(0, 20_000), max_size=8),
)
def test_frame_walk_property(frames: list[tuple[bytes, int, bool, bool, int]], cuts: list[int]) -> None:
    """Any frames (levels, checksums, content sizes, skippable frames between) cut anywhere: same bytes, exact table."""
    stream = b""
    expected = []
    d_off = 0
    for data, level, checksum, content_size, skip in frames:
        if skip:
            stream += (0x184D2A50 + skip % 16).to_bytes(4, "little") + skip.to_bytes(4, "little") + bytes(skip)
        frame = zstandard.ZstdCompressor(level=level, write_checksum=checksum, write_content_size=content_size).compress(data)
        expected.append((len(stream), len(frame), d_off, len(data)))
        stream += frame
        d_off += len(data)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in zip(points, points[1:])]
    rows: list[tuple[int, int, int, int]] = []
    from tarindex.zstd import decompress_frames

    assert b"".join(decompress_frames(chunks, "p.zst", rows)) == b"".join(f[0] for f in frames)
    assert rows == expected


def test_iter_decompressed_bounds_output_pieces(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # 64 MiB of zeros: a few KB compressed
    sizes = [len(p) for p in iter_decompressed([data], "zeros.zst")]
    assert sum(sizes) == 64 << 20 and max(sizes) <= 32 << 20


# -- errors ------------------------------------------------------------------------


def test_corrupt_frame_at_build_names_offset(big: Path, tmp_path: Path) -> None:
    shard = _by_compress(big, tmp_path / "c.tar.zst")
    table = independent_seek_table(shard.read_bytes())
    frame5 = sum(c for c, _ in table[:5])
    data = bytearray(shard.read_bytes())
    data[frame5 + table[5][0] // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptFrameError, match=rf"c\.tar\.zst: corrupt zstd frame .* at offset {frame5}$"):
        scan_shard(str(shard))
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(tmp_path / "c.tarindex")])
    assert result.exit_code == 1
    assert f"at offset {frame5}" in result.output and "Traceback" not in result.output


def test_corrupt_frame_at_read_names_offset_and_returns_nothing(big: Path, tmp_path: Path, zstd_backend: str) -> None:
    shard = _by_compress(big, tmp_path / "c.tar.zst")
    report = tarindex.build_index([shard], index=tmp_path / "c.tarindex", workers=1)
    frames = IndexReader(report.path).frame_table(0)
    st = shard.stat()
    k = 7
    c_off, c_size, d_off, _ = (int(x) for x in frames[k])
    with open(shard, "r+b") as f:  # same size, same mtime: the index cannot tell
        f.seek(c_off + c_size // 2)
        byte = f.read(1)
        f.seek(c_off + c_size // 2)
        f.write(bytes([byte[0] ^ 0x55]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = tarindex.TarDataset(report.path)
    offsets = ds.index.decode().offset
    inside = int(np.searchsorted(offsets, d_off))
    ds[0]  # other frames still read
    with pytest.raises(CorruptFrameError, match=rf"c\.tar\.zst: corrupt zstd frame .* at offset {c_off}$"):
        ds[inside]


def test_truncated_file(big: Path, tmp_path: Path) -> None:
    for tool in ("zstd-cli", "tarindex-compress"):
        shard = TOOLS[tool](big, tmp_path / f"{tool}.tar.zst")
        data = shard.read_bytes()
        cut = data[: len(data) * 2 // 3] if tool == "zstd-cli" else data[: len(data) - 2000]
        shard.write_bytes(cut)
        with pytest.raises(CorruptFrameError, match=r"\.tar\.zst: truncated zstd frame .* at offset \d+$") as err:
            scan_shard(str(shard))
        if tool == "zstd-cli":
            assert err.value.offset == 0
    with pytest.raises(CorruptFrameError, match="truncated zstd frame"):
        list(iter_decompressed([data[:-3]], "x.zst"))


def test_garbage_after_frames(big: Path, tmp_path: Path) -> None:
    shard = zstd_cli(big, tmp_path / "g.tar.zst")
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"this is not zstd")
    with pytest.raises(CorruptFrameError, match=rf"not a zstd frame \(magic 74686973\) at offset {size}$"):
        scan_shard(str(shard))


def test_zstd_of_something_that_is_not_tar(tmp_path: Path) -> None:
    shard = tmp_path / "n.tar.zst"
    shard.write_bytes(zstandard.ZstdCompressor().compress(b"just text, " * 1000))
    with pytest.raises(CorruptArchiveError, match=r"n\.tar\.zst: bad header checksum .* \(in the decompressed tar\) at offset 0$") as err:
        scan_shard(str(shard))
    assert not isinstance(err.value, CorruptFrameError)


def test_stale_zstd_shard(big: Path, tmp_path: Path) -> None:
    shard = _by_compress(big, tmp_path / "s.tar.zst")
    report = tarindex.build_index([shard], index=tmp_path / "s.tarindex", workers=1)
    _by_compress(big, shard)  # rewritten: new mtime, the same bytes (accepted: an identical copy)
    assert tarindex.TarDataset(report.path)[0]["__key__"]
    data = bytearray(shard.read_bytes())
    data[100] ^= 1  # same size, other bytes
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(1, 1))
    with pytest.raises(StaleIndexError, match=r"s\.tar\.zst: shard changed since it was indexed"):
        tarindex.TarDataset(report.path)[0]


# -- shards made of one large frame ------------------------------------------------


@pytest.fixture(scope="module")
def one_frame(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 20 MB tar (over the 16 MiB random-access limit) and its single-frame ``zstd -1`` shard."""
    root = tmp_path_factory.mktemp("one")
    specs = [(f"x{i:04d}.txt", f"sample {i} ".encode() * 2000) for i in range(1000)]
    tar = py_tar(root / "one.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    return tar, zstd_cli(tar, root / "one.tar.zst", "-1")


def test_single_frame_shard_needs_opt_in(one_frame: tuple[Path, Path], tmp_path: Path) -> None:
    tar, shard = one_frame
    index = tmp_path / "one.tarindex"
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(index), "-q"])
    assert result.exit_code == 0
    assert f"warning: {shard}: zstd frames too large for random access" in result.output
    assert f"tarindex compress {shard} {shard}" in result.output
    info = CliRunner().invoke(main, ["info", str(index)])
    assert "zstd shards:    1 (1 too coarse for random access; see docs/zstd.md)" in info.output
    ds = tarindex.TarDataset(index)
    assert not ds.index.shards[0].random_access
    with pytest.raises(RandomAccessError, match=r"one\.tar\.zst: 1 zstd frame\(s\).*tarindex compress .*zstd_cache_dir="):
        ds[5]
    cache = tmp_path / "cache"
    ds = tarindex.TarDataset(index, zstd_cache_dir=cache, zstd_cache_bytes=64 << 20)
    check_dataset(ds, expected_samples(tar), random_order(len(ds))[:200])
    assert [p.name for p in cache.iterdir()] == ["tarindex-zstd"]
    entries = sorted(p.name for p in (cache / "tarindex-zstd").iterdir())
    assert entries == [".lock", ".tarindex-cache", f"{ds.index.shards[0].fingerprint}-{shard.stat().st_size}.tar"]
    small = tarindex.TarDataset(index, zstd_cache_dir=tmp_path / "c2", zstd_cache_bytes=1 << 20)
    with pytest.raises(RandomAccessError, match="exceeds zstd_cache_bytes"):
        small[0]


def test_recompress_in_place_fixes_it(one_frame: tuple[Path, Path], tmp_path: Path) -> None:
    tar, original = one_frame
    shard = shutil.copy(original, tmp_path / "one.tar.zst")
    result = CliRunner().invoke(main, ["compress", str(shard), str(shard)])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["one.tar.zst"]  # no temporary left
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(tmp_path / "one.tarindex"), "-q"])
    assert result.exit_code == 0 and "warning" not in result.output
    ds = tarindex.TarDataset(tmp_path / "one.tarindex")
    assert ds.index.shards[0].random_access
    check_dataset(ds, expected_samples(tar), random_order(len(ds))[:200])


def test_frame_cache_is_bounded_in_bytes() -> None:
    cache = FrameCache(250)
    for k in range(5):
        cache.put(("f", k), bytes(100))
    assert cache.bytes == 200 and cache.get(("f", 4)) is not None and cache.get(("f", 2)) is None
    cache.get(("f", 3))
    cache.put(("f", 5), bytes(100))
    assert cache.get(("f", 3)) is not None and cache.get(("f", 4)) is None
    cache.put(("f", 6), bytes(1000))  # larger than the bound: not kept
    assert cache.get(("f", 6)) is None


def _framed(big: Path, tmp_path: Path) -> tuple[tarindex.TarDataset, np.ndarray, np.ndarray]:
    """A dataset over ``tarindex compress`` output, its frame table and each sample's frame."""
    shard = _by_compress(big, tmp_path / "r.tar.zst")
    report = tarindex.build_index([shard], index=tmp_path / "r.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    frames = ds.index.frame_table(0)
    assert frames is not None
    frame_of = np.searchsorted(frames[:, 2], ds.index.decode().offset, side="right") - 1
    return ds, frames, frame_of


def _cache_types() -> list[type]:
    from tarindex._native import SPEEDUPS

    return [FrameCache] + ([SPEEDUPS.FrameCache] if SPEEDUPS is not None else [])


@pytest.mark.parametrize("cache_type", _cache_types(), ids=lambda t: t.__module__)
def test_frame_cache_bounds(cache_type: type) -> None:
    cache = cache_type(1000)
    assert (cache.max_bytes, cache.limit, cache.bytes, cache.decompressed, len(cache)) == (1000, 1000, 0, 0, 0)
    cache.max_bytes = 100 << 20
    assert cache.limit == SEED_BYTES  # grows from here as hits pay for it
    cache.max_bytes = 0
    assert cache.limit == 0
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        cache.max_bytes = -1
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0


def test_random_access_reads_only_needed_frames(big: Path, tmp_path: Path) -> None:
    ds, frames, frame_of = _framed(big, tmp_path)
    cache = frame_cache()
    before = cache.decompressed
    i = len(ds) // 2
    ds[i]
    assert cache.decompressed - before == int(frames[frame_of[i], 3])  # one frame, decompressed once


def test_frame_cache_keeps_only_reused_frames(big: Path, tmp_path: Path, zstd_backend: str) -> None:
    ds, frames, frame_of = _framed(big, tmp_path)
    cache = frame_cache()
    cache.clear()
    first = {int(k): i for i, k in reversed(list(enumerate(frame_of.tolist())))}  # a sample of each frame
    a, b = first[10], first[20]
    ds[a]
    ds[b]  # the reader now remembers frame 20
    assert len(cache) == 0  # read once: not kept
    start = cache.decompressed
    ds[a]  # decompressed again, recently: kept
    assert len(cache) == 1 and cache.decompressed - start == int(frames[10, 3])
    ds[b]
    start = cache.decompressed
    ds[a]  # a hit: nothing decompressed
    assert cache.decompressed == start
    check_dataset(ds, expected_samples(big), [a, b, a])


def test_block_reads_decompress_each_frame_once_without_cache(big: Path, tmp_path: Path) -> None:
    ds, frames, _ = _framed(big, tmp_path)
    cache = frame_cache()
    cache.max_bytes = 0
    try:
        start = cache.decompressed
        assert check_dataset(ds, expected_samples(big)) == len(ds)  # file order: runs of samples per frame
        assert cache.decompressed - start == int(frames[:, 3].sum())
    finally:
        cache.max_bytes = DEFAULT_CACHE_BYTES


def test_frame_cache_grows_as_hits_pay_and_wraps(big: Path, tmp_path: Path, zstd_backend: str) -> None:
    ds, frames, frame_of = _framed(big, tmp_path)
    cache = frame_cache()
    oracle = expected_samples(big)
    cache.max_bytes = 5 * int(frames[:, 3].max())  # a few frames: the ring wraps and drops frames all the time
    try:
        assert cache.limit == cache.max_bytes
        order = random_order(len(ds))[:300] * 3
        assert check_dataset(ds, oracle, order) == len(order)
        assert 0 < cache.bytes <= cache.max_bytes
        cache.max_bytes = 1 << 30
        assert cache.limit == SEED_BYTES and len(cache) == 0  # a new bound starts over
        few = [i for i in range(len(ds)) if frame_of[i] < 8]
        held = 0
        for _ in range(40):
            check_dataset(ds, oracle, random_order(len(few)))  # indexes of the first frames' samples
            held = cache.limit
        assert SEED_BYTES < held <= cache.max_bytes  # hits paid for a longer ring
    finally:
        cache.max_bytes = DEFAULT_CACHE_BYTES


def _frames_file(path: Path, data: bytes, *, content_size: bool) -> np.ndarray:
    """``data`` as zstd frames of 700-1300 bytes (not aligned to anything), written to ``path``; the frame table."""
    cctx = zstandard.ZstdCompressor(write_checksum=True, write_content_size=content_size)
    rng = random.Random(5)
    rows, out, d = [], bytearray(), 0
    while d < len(data):
        piece = data[d : d + rng.randint(700, 1300)]
        comp = cctx.compress(piece)
        rows.append((len(out), len(comp), d, len(piece)))
        out += comp
        d += len(piece)
    path.write_bytes(bytes(out))
    return frame_array(rows)


@pytest.mark.parametrize("content_size", [True, False])
@pytest.mark.parametrize("cache_bytes", [0, 4000, DEFAULT_CACHE_BYTES])
def test_read_at_any_range(tmp_path: Path, content_size: bool, cache_bytes: int, zstd_backend: str) -> None:
    data = np.random.default_rng(3).integers(0, 6, 60_000, dtype=np.uint8).tobytes()
    path = tmp_path / "f.zst"
    frames = _frames_file(path, data, content_size=content_size)
    cache = frame_cache()
    cache.max_bytes = cache_bytes
    reader = zstd_reader(str(path), os.open(path, os.O_RDONLY), frames)
    try:
        rng = random.Random(7)
        for _ in range(3000):
            off, size = rng.randrange(len(data) + 50), rng.choice([1, 50, 900, 2500, 7000])
            assert reader.read_at(off, size) == data[off : off + size], (off, size)
        assert reader.read_at(0, len(data)) == data and reader.read_at(5, 0) == b"" and reader.read_at(len(data), 10) == b""
        assert cache.bytes <= cache_bytes
    finally:
        reader.close()
        cache.max_bytes = DEFAULT_CACHE_BYTES
    assert reader.fd == -1


def test_reader_errors_name_the_frame(tmp_path: Path, zstd_backend: str) -> None:
    data = bytes(range(256)) * 40
    path = tmp_path / "e.zst"
    frames = _frames_file(path, data, content_size=True)
    c_off, c_size, d_off, _ = (int(x) for x in frames[3])
    longer = frames.copy()
    longer[-1, 1] += 100  # the table says the last frame runs past the end of the file
    wrong = frames.copy()
    wrong[3, 3] += 1  # the frame header disagrees
    for table, k, what in ((longer, len(frames) - 1, r"truncated zstd frame \(\d+ of \d+ bytes; the shard is shorter than indexed\)"), (wrong, 3, r"zstd frame header disagrees with the index \(\d+ bytes\)")):
        reader = zstd_reader(str(path), os.open(path, os.O_RDONLY), table)
        with pytest.raises(CorruptFrameError, match=rf"e\.zst: {what} at offset {int(table[k, 0])}$"):
            reader.read_at(int(table[k, 2]), 10)
        reader.close()
    damaged = bytearray(path.read_bytes())
    damaged[c_off + c_size - 6] ^= 0x10  # inside the checksum or the last block
    path.write_bytes(bytes(damaged))
    frame_cache().clear()
    reader = zstd_reader(str(path), os.open(path, os.O_RDONLY), frames)
    with pytest.raises(CorruptFrameError, match=rf"e\.zst: corrupt zstd frame .* at offset {c_off}$") as err:
        reader.read_at(d_off, 10)  # the damage is after these 10 bytes: nothing of the frame is returned
    assert isinstance(err.value.__cause__, zstandard.ZstdError)
    assert reader.read_at(0, 10) == data[:10]  # other frames still read
    reader.close()


def test_threads_read_one_shard_at_once(tmp_path: Path, zstd_backend: str) -> None:
    """decompress lets other threads run: concurrent reads of one shard must not share a decompression context."""
    data = np.random.default_rng(1).integers(0, 20, 2_000_000, dtype=np.uint8).tobytes()
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    rows, out = [], bytearray()
    for d in range(0, len(data), 200_000):  # large frames: each decompression takes a while
        comp = cctx.compress(data[d : d + 200_000])
        rows.append((len(out), len(comp), d, len(data[d : d + 200_000])))
        out += comp
    path = tmp_path / "t.zst"
    path.write_bytes(bytes(out))
    cache = frame_cache()
    cache.max_bytes = 0
    reader = zstd_reader(str(path), os.open(path, os.O_RDONLY), frame_array(rows))
    problems: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(100):
            off = rng.randrange(len(data) - 5000)
            try:
                if reader.read_at(off, 5000) != data[off : off + 5000]:
                    problems.append(f"wrong bytes at {off}")
            except Exception as exc:  # a shared context reports corruption
                problems.append(repr(exc))

    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        reader.close()
        cache.max_bytes = DEFAULT_CACHE_BYTES
    assert problems == []


def test_c_reader_is_used_when_built(big: Path, tmp_path: Path) -> None:
    require_c_extension()
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    ds, _, _ = _framed(big, tmp_path)
    ds[0]
    (handle,) = [h for h in ds._opener.handles if h is not None]
    assert isinstance(handle, SPEEDUPS.ZstdReader) and not isinstance(handle, ZstdShardReader)  # with read_many
    assert type(frame_cache()) is SPEEDUPS.FrameCache
    assert SPEEDUPS._libzstd()  # libzstd.so.1 comes with Debian's zstd package, which .ci/run installs


def test_dataloader_workers_read_zstd_shards(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    plain = make_shard_set(tmp_path / "d", n_shards=3, per=20)
    shards = [_by_compress(p, tmp_path / "d" / f"z{k}.tar.zst") for k, p in enumerate(plain)]
    report = tarindex.build_index(shards, index=tmp_path / "z.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    ds[0]  # the parent has open readers and a warm frame cache before the workers fork
    order = random_order(len(ds))
    got = {s["__key__"]: s["bin"] for s in DataLoader(ds, sampler=order, num_workers=2, batch_size=None)}
    oracle: dict[str, dict[str, bytes]] = {}
    for p in plain:
        oracle.update(expected_samples(p))
    assert got == {k: v["bin"] for k, v in oracle.items()}


def test_both_read_paths_on_zstd(impl: str, big: Path, tmp_path: Path) -> None:
    """The C read path calls the zstd reader's read_at and slices members itself; the Python path is the reference."""
    shard = _by_compress(big, tmp_path / "c.tar.zst")
    plain = shutil.copy(big, tmp_path / "p.tar")
    report = tarindex.build_index([shard, plain], index=tmp_path / "c.tarindex", workers=1)
    ds = tarindex.TarDataset(report.path)
    order = random_order(len(ds))
    got = [ds.read(i) for i in order]
    assert (ds._fast is not None) == (impl == "c")
    assert got == [ds._read_py(i) for i in order]
    check_dataset(ds, expected_samples(big), order[:300])
    ds.close()  # the C reader lets go of its handles too
    assert ds.read(5) == ds._read_py(5)


def test_get_cli_on_zstd(big: Path, tmp_path: Path) -> None:
    shard = _by_compress(big, tmp_path / "g.tar.zst")
    tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1)
    result = CliRunner().invoke(main, ["get", str(tmp_path / "g.tarindex"), "k01234", "--ext", "cls"])
    assert result.exit_code == 0 and result.stdout_bytes == b"1234"




# -- frames that lie (issue 19.1) and a mutation fuzzer --------------------------------


def _fcs_field(frame: bytes | bytearray) -> tuple[int, int]:
    """Where a frame header's content-size field lies: (position, length)."""
    d = frame[4]
    single = (d >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[d & 3]
    return pos, ((1 if single else 0), 2, 4, 8)[d >> 6]


def _lying_frames(tmp_path: Path, n: int = 20) -> tuple[Path, list[tuple[int, int]], bytes]:
    """A tar of ``n`` samples of ~70 KB, one zstd frame per sample (content size 4 bytes in each header)."""
    rng = np.random.default_rng(5)
    specs = [(f"s{i:03d}.bin", rng.integers(0, 40, 70_000, dtype=np.uint8).tobytes()) for i in range(n)]
    tar = py_tar(tmp_path / "lie.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    data = tar.read_bytes()
    cctx = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=True)
    bounds = [0, *(512 + i * (512 + 70_144) for i in range(1, n)), len(data)]
    frames, out = [], bytearray()
    for a, b in itertools.pairwise(bounds):
        comp = cctx.compress(data[a:b])
        frames.append((len(out), len(comp)))
        out += comp
    return tar, frames, bytes(out)


@pytest.mark.parametrize("declared", [0, 1, "smaller", "larger"])
def test_frame_header_that_disagrees_with_its_data(declared: int | str, tmp_path: Path) -> None:
    """Issue 19.1: a content size of 0 (or any other wrong size) is CorruptFrameError in build and TarStream."""
    _, frames, data = _lying_frames(tmp_path)
    off, _ = frames[7]
    pos, length = _fcs_field(data[off:])
    assert length == 4
    true = int.from_bytes(data[off + pos : off + pos + 4], "little")
    value = {0: 0, 1: 1, "smaller": true - 1, "larger": true + 1}[declared]
    lied = bytearray(data)
    lied[off + pos : off + pos + 4] = value.to_bytes(4, "little")
    shard = tmp_path / "lie.tar.zst"
    shard.write_bytes(bytes(lied))
    with pytest.raises(CorruptFrameError, match=rf"lie\.tar\.zst: corrupt zstd frame .* at offset {off}$"):
        scan_shard(str(shard))
    with pytest.raises(CorruptFrameError, match=rf"lie\.tar\.zst: corrupt zstd frame .* at offset {off}$"):
        list(tarindex.TarStream([str(shard)]))
    with pytest.raises(CorruptFrameError, match=rf"at offset {off}$"):
        list(iter_decompressed([bytes(lied)], "x.zst"))


def test_compress_output_with_a_zero_size_header(big: Path, tmp_path: Path) -> None:
    """The seek table agrees with nothing a lying header says: build and stream both refuse the frame."""
    shard = _by_compress(big, tmp_path / "c.tar.zst")
    rows: list[tuple[int, int, int, int]] = []
    list(iter_decompressed([shard.read_bytes()], str(shard), frames=rows))
    data = bytearray(shard.read_bytes())
    for c_off, _, _, _ in rows:  # the first frame with a 2-byte field can't say 0; find a 4-byte one
        pos, length = _fcs_field(data[c_off:])
        if length == 4:
            data[c_off + pos : c_off + pos + 4] = bytes(4)
            break
    else:  # frames under 64 KiB: say 0 through the 1-byte field of a single-segment header
        c_off = rows[1][0]
        pos, length = _fcs_field(data[c_off:])
        data[c_off + pos : c_off + pos + length] = (256).to_bytes(length, "little")  # 2-byte field: 0 + 256
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptFrameError, match=rf"at offset {c_off}$"):
        scan_shard(str(shard))
    with pytest.raises(CorruptFrameError, match=rf"at offset {c_off}$"):
        list(tarindex.TarStream([str(shard)]))


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except CorruptArchiveError as exc:  # CorruptFrameError included: a named error with path and offset
        assert exc.path and exc.offset >= 0
        return type(exc).__name__, None


def test_zstd_mutation_fuzzer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded mutations of a ``tarindex compress`` shard: build, stream and random reads (C and Python)
    each give exactly the original bytes or a named error, and the two readers agree."""
    from tarindex import zstd_random

    specs = [(f"m{i:03d}.{ext}", bytes(np.random.default_rng(i).integers(0, 30, 3000 if ext == "bin" else 5, dtype=np.uint8)))
             for i in range(60) for ext in ("bin", "cls")]
    tar = py_tar(tmp_path / "m.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    original = tmp_path / "m.tar.zst"
    compress_shard(tar, original, frame_size=4)
    oracle = expected_samples(tar)
    plain = tar.read_bytes()
    _, table = scan_shard(str(original))
    frames = table.frames
    assert frames is not None and len(frames) > 10
    pristine = original.read_bytes()
    shard = tmp_path / "fuzz.tar.zst"
    rng = random.Random(19)
    outcomes: dict[str, int] = {}
    for case in range(150):
        data = bytearray(pristine)
        kind = case % 5
        if kind == 0:  # flip bits
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a random byte
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:  # truncate
            del data[rng.randrange(1, len(data)) :]
        elif kind == 3:  # a header's content size
            c_off = int(frames[rng.randrange(len(frames)), 0])
            pos, length = _fcs_field(data[c_off:])
            data[c_off + pos : c_off + pos + length] = bytes(length) if rng.random() < 0.5 else rng.randbytes(length)
        else:  # a run of bytes overwritten
            at = rng.randrange(len(data))
            data[at : at + rng.randint(2, 40)] = rng.randbytes(rng.randint(2, 40))
        shard.write_bytes(bytes(data))
        name, scanned = _outcome(lambda: scan_shard(str(shard))[1])
        if scanned is not None:  # indexed: exactly the original tables
            assert scanned.keys == table.keys and (scanned.sample_offset == table.sample_offset).all(), case
        streamed = _outcome(lambda: {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
                                     for s in tarindex.TarStream([str(shard)])})[1]
        if streamed is not None:
            assert streamed == oracle, case
        results = []
        for backend in ("c", "python"):
            if backend == "c" and tarindex._native.SPEEDUPS is None:
                continue
            with monkeypatch.context() as patch:
                if backend == "python":
                    use_pure_python(patch)
                zstd_random.frame_cache().clear()
                reader = zstd_reader(str(shard), os.open(shard, os.O_RDONLY), frames)
                assert isinstance(reader, ZstdShardReader) == (backend == "python")
                got = []
                for k in range(len(frames)):
                    d_off, d_size = int(frames[k, 2]), int(frames[k, 3])
                    outcome = _outcome(functools.partial(reader.read_at, d_off, d_size))
                    if outcome[1] is not None:
                        assert outcome[1] == plain[d_off : d_off + d_size], (case, k)
                    got.append(outcome[0])
                reader.close()
            zstd_random._CACHE = None
            results.append(got)
        assert all(r == results[0] for r in results), case  # C and Python agree frame by frame
        outcomes[name] = outcomes.get(name, 0) + 1
    assert outcomes.get("CorruptFrameError", 0) > 50  # the mutations mostly hit frames
