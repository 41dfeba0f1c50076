"""Compression by content: refusals with the conversion command, decompression bombs, and padding
after the end-of-archive marker that costs no decompression.

Shards are made by the real tools (``bzip2``, ``xz``, ``lz4``, ``zstd``) or by Python's ``tarfile``.
"""

from __future__ import annotations

import os
import re
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
from _corpus import lzip_member
from click.testing import CliRunner

import tarindex
from conftest import py_tar, tarfile_members
from tarindex._codecs import codec_of, detect, looks_like_shard
from tarindex.cli.main import main
from tarindex.compression import ArchiveEnd, Limits, limits, set_limits
from tarindex.errors import CorruptArchiveError, DecompressionLimitError, UnsupportedCompressionError
from tarindex.scan import scan_shard
from tarindex.zstd import decompress_frames


@pytest.fixture
def shard_tar(tmp_path: Path) -> Path:
    specs = [(f"s{i:03d}.{ext}", f"{ext} {i} ".encode() * 50) for i in range(40) for ext in ("txt", "cls")]
    return py_tar(tmp_path / "plain.tar", specs, tarfile.GNU_FORMAT, dirs=False)


def _tool(tool: str, src: Path, dst: Path) -> Path:
    if tool == "lzip":  # no lzip on the machine: a member made here, which xz (5.4 and later) must decompress
        dst.write_bytes(lzip_member(src.read_bytes()))
        assert subprocess.run(["xz", "-dc", "--format=lzip", str(dst)], capture_output=True, check=True).stdout == src.read_bytes()
        return dst
    command = {"lzma": ["xz", "--format=lzma"], "lz4-skippable": ["lz4"]}.get(tool, [tool])
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed")  # .ci/run installs bzip2, xz-utils and lz4
    with open(dst, "wb") as out:
        if tool == "lz4-skippable":  # two skippable frames first (the magic zstd's skippable frames share)
            out.write((0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc" + (0x184D2A5F).to_bytes(4, "little") + bytes(4))
            out.flush()
        subprocess.run([*command, "-c", str(src)], stdout=out, check=True)
    return dst


@pytest.mark.parametrize(
    ("tool", "suffix", "name", "command"),
    [
        ("bzip2", ".tar.bz2", "bzip2", "bzip2 -dc"),
        ("xz", ".tar.xz", "xz", "xz -dc"),
        ("lz4", ".tar.lz4", "lz4", "lz4 -dc"),
        ("lzma", ".tar.lzma", "LZMA-alone (.lzma)", "xz -dc"),
        ("lzip", ".tar.lz", "lzip", "lzip -dc"),
        ("lz4-skippable", ".tar.lz4", "lz4", "lz4 -dc"),
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
        rf"x{re.escape(suffix)}: {re.escape(name)}-compressed, which tarindex does not read; convert it to a plain tar "
        rf"\('{command} .*x{suffix} > .*x\.tar'\) or to a zstd shard"
    )
    with pytest.raises(UnsupportedCompressionError, match=expected) as err:
        scan_shard(str(shard))
    assert f"tarindex compress {stem}.tar {stem}.tar.zst" in str(err.value)
    with pytest.raises(UnsupportedCompressionError, match=rf"looks-plain\.tar: {re.escape(name)}-compressed"):
        scan_shard(str(disguised))
    with pytest.raises(UnsupportedCompressionError, match=expected):
        list(tarindex.TarStream([str(shard)]))
    result = CliRunner().invoke(main, ["build", str(shard), "-o", str(tmp_path / "x.tarindex")])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and f"{name}-compressed" in result.output
    assert "checksum" not in result.output and "not a tar" not in result.output and "zstd frame" not in result.output


def test_detection_by_magic() -> None:
    assert detect(b"\x28\xb5\x2f\xfd\x00\x00") == "zstd"
    assert detect(b"\x50\x2a\x4d\x18\x00\x00") == "zstd"  # a skippable frame first (pzstd)
    assert detect(b"\x1f\x8b\x08\x00\x00\x00") == "gzip"
    assert detect(b"BZh91AY&SY") == "bzip2" and detect(b"BZh0") == "tar"
    assert detect(b"\xfd7zXZ\x00") == "xz"
    assert detect(b"\x04\x22\x4d\x18\x64\x40") == "lz4"
    assert detect(b"\x1f\x9d\x90") == "compress"
    assert detect(b"LZIP\x01\x0c") == "lzip"
    assert detect(b"\x5d\x00\x00\x80\x00" + b"\xff" * 8) == "lzma"  # LZMA-alone: properties, 8 MiB dictionary, size unknown
    assert detect(b"\x5d\x00\x10\x00\x00" + (7168).to_bytes(8, "little")) == "lzma"  # 4 KiB dictionary, a known size
    assert detect(b"\x5d\x00\x00\x30\x00" + b"\xff" * 8) == "lzma"  # 3 MiB: lowered by xz to fit in memory
    assert detect(b"\x5d\x00\x00\x80\x00" + b"\x00" * 7 + b"\x01") == "tar"  # a 'size' of 2**56: not LZMA-alone
    assert detect(b"\x5d\x01\x00\x80\x00") == "tar" and detect(b"\xe1\x00\x00\x80\x00") == "tar"
    skippable = (0x184D2A50).to_bytes(4, "little") + (2).to_bytes(4, "little") + b"xy"
    assert detect(skippable + b"\x04\x22\x4d\x18") == "lz4" and detect(skippable + b"\x28\xb5\x2f\xfd") == "zstd"
    assert detect(skippable) == "zstd"  # the next frame not in sight: zstd's decoder names what it finds
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
    assert not looks_like_shard(os.urandom(512)) and not looks_like_shard(b"")  # junk, nothing: an index, whose reader says it is none
    assert looks_like_shard(bytes(512))  # an empty tar (tar cf x.tar --files-from /dev/null): a shard of no samples
    assert looks_like_shard(b"LZIP\x01\x0c" + bytes(100))
    v7 = bytearray(shard_tar.read_bytes()[:512])
    v7[257:265] = bytes(8)  # no magic
    v7[0] ^= 1  # and its checksum no longer matches: a damaged tar header, for the walk to name
    assert looks_like_shard(bytes(v7)) and looks_like_shard(bytes(v7[:300]))  # whole, or cut short
    assert not looks_like_shard(bytes(v7[:100]))  # too little to tell: an index


def test_no_tar_header_is_taken_for_lzma() -> None:
    """LZMA-alone has no magic: a tar header's first bytes never look like its header (a name is
    NUL-terminated and NUL-padded), whatever the name."""
    names = [bytes([a]) for a in range(1, 256)] + [bytes([a, b]) for a in range(1, 256, 7) for b in range(1, 256)]
    names += [bytes([0x5D, b, c, d]) for b in (1, 0x10, 0x80, 0xFF) for c in (1, 0x10, 0x80) for d in (1, 0x80)]
    for name in names:
        head = bytearray(512)
        head[: len(name)] = name
        assert detect(bytes(head)) == "tar", name


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



# -- max_member_size, and large members assembled once (issue 19.2) ---------------------------------

_BOUND_WHAT = r"member 'big\.bin' of 2097152 bytes is over max_member_size \(1048576 bytes\); to accept it, raise max_member_size="


def _big_member_tar(path: Path, size: int = 2 << 20) -> Path:
    """Two small samples, then ``big.bin`` of ``size`` bytes (its header at offset 2048, after two members of 1024 bytes)."""
    return py_tar(path, [("a.txt", b"a"), ("b.txt", b"b"), ("big.bin", bytes(size))], tarfile.GNU_FORMAT, dirs=False)


def _compressed(src: Path, suffix: str) -> Path:
    data = src.read_bytes()
    out = src.with_name(src.name + suffix)
    out.write_bytes(zstandard.ZstdCompressor(level=1).compress(data) if suffix == ".zst" else gzip_bytes(data))
    return out


def gzip_bytes(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, compresslevel=1)


def test_max_member_size_in_every_walk(tmp_path: Path) -> None:
    """Buffer, chunks, file and pipe walks, members, tables and samples, C and Python: a member over the bound is
    refused at its header, naming the shard, the member and the header's offset; at the bound exactly it is read."""
    from _tarmut import outcomes

    buf = _big_member_tar(tmp_path / "src.tar").read_bytes()
    path = tmp_path / "big.tar"
    got = outcomes(buf, path, max_member_size=1 << 20)
    assert len(got) == 18
    for (which, way), result in got.items():
        assert result[:2] == ("error", "CorruptArchiveError"), (which, way, result)
        assert re.search(re.escape(str(path)) + ": " + _BOUND_WHAT + r".* at offset 2048$", result[2]), (which, way, result)
        assert result[3] == 2048, (which, way, result)
    fine = outcomes(buf, path, max_member_size=2 << 20)
    assert not any(isinstance(result, tuple) and result[0] == "error" for result in fine.values()), fine
    assert fine["c", "samples-pipe"] == fine["python", "samples-file"]


@pytest.mark.parametrize("kind", ["file", "pipe", "http", "zst", "gz"])
def test_tarstream_max_member_size(kind: str, impl: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """TarStream(max_member_size=) over a local tar, a pipe, HTTP (nginx: a stream of known length), a .tar.zst and
    a .tar.gz: the samples before the member, then the named error at its header; with the bound at the member's
    size, every sample."""
    if kind == "http":
        server = request.getfixturevalue("http_server")
        (server.root / tmp_path.name).mkdir()
        src = _big_member_tar(server.root / tmp_path.name / "big.tar")
    else:
        src = _big_member_tar(tmp_path / "big.tar")
    shard = str(src) if kind in ("file", "pipe", "http") else str(_compressed(src, "." + kind))
    url = {"pipe": f"pipe:cat {shard}", "http": server.url(src) if kind == "http" else ""}.get(kind, shard)
    seen = []
    with pytest.raises(CorruptArchiveError, match=re.escape(url) + ": " + _BOUND_WHAT + r".* at offset 2048$"):
        for sample in tarindex.TarStream([url], max_member_size=1 << 20):
            seen.append(sample["__key__"])
    assert seen == ["a"]  # "b" is complete only once the next member is accepted
    got = list(tarindex.TarStream([url], max_member_size=2 << 20))
    assert [s["__key__"] for s in got] == ["a", "b", "big"] and got[2]["bin"] == bytes(2 << 20)
    with pytest.raises(ValueError, match="max_member_size must be >= 0"):
        tarindex.TarStream([url], max_member_size=-1)


@pytest.mark.parametrize("kind", ["zst", "gz", "pipe"])
def test_declared_terabyte_member_is_refused_before_allocation(kind: str, impl: str, tmp_path: Path) -> None:
    """A header claiming 2**40 bytes (no machine allocates that) over a stream of unknown length: the default bound
    (8 GiB) refuses it at once; with the bound raised past it, the data is gathered as it arrives, and the stream's
    end is a truncation error, never a MemoryError."""
    head = tarfile.TarInfo("huge.bin")
    head.size = 1 << 40
    src = tmp_path / "huge.tar"
    src.write_bytes(py_tar(tmp_path / "a.tar", [("a.txt", b"a")], tarfile.GNU_FORMAT, dirs=False).read_bytes()[:1024]
                    + head.tobuf(tarfile.GNU_FORMAT) + bytes(3 << 20))
    shard = str(src) if kind == "pipe" else str(_compressed(src, "." + kind))
    url = f"pipe:cat {shard}" if kind == "pipe" else shard
    t = time.perf_counter()
    with pytest.raises(CorruptArchiveError, match=r"member 'huge\.bin' of 1099511627776 bytes is over max_member_size \(8589934592 bytes\)"):
        list(tarindex.TarStream([url]))
    with pytest.raises(CorruptArchiveError, match=r"over max_member_size \(1048576 bytes\).* at offset 1024$"):
        list(tarindex.TarStream([url], max_member_size=1 << 20))
    with pytest.raises(CorruptArchiveError, match=r"truncated archive: member data needs 1099511627776 bytes"):
        list(tarindex.TarStream([url], max_member_size=1 << 41))
    if kind != "pipe":
        with pytest.raises(CorruptArchiveError, match=r"huge\.bin' of 1099511627776 bytes is over max_member_size \(8589934592"):
            scan_shard(shard)
    assert time.perf_counter() - t < 10


def test_build_max_member_size(tmp_path: Path) -> None:
    """build_index(max_member_size=) and `tarindex build --max-member-size`: the named error, one line, exit 1;
    shards reused from an existing index are checked from their tables; a bad size is a usage error."""
    src = _big_member_tar(tmp_path / "big.tar")
    zst = _compressed(src, ".zst")
    index = tmp_path / "big.tarindex"
    for shard in (src, zst):
        with pytest.raises(CorruptArchiveError, match=re.escape(str(shard)) + ": " + _BOUND_WHAT):
            tarindex.build_index([shard], index=index, workers=1, max_member_size=1 << 20)
        result = CliRunner().invoke(main, ["build", str(shard), "-o", str(index), "--max-member-size", "1M"])
        assert result.exit_code == 1, result.output
        assert result.output.count("\n") == 1 and re.search(_BOUND_WHAT, result.output), result.output
    assert not index.exists()
    assert CliRunner().invoke(main, ["build", str(src), "-o", str(index), "--max-member-size", "2MiB", "-q"]).exit_code == 0
    with pytest.raises(CorruptArchiveError, match=re.escape(str(src)) + r": member 'big\.bin' of 2097152 bytes \(data\) is over max_member_size \(1048576"):
        tarindex.build_index([src], index=index, max_member_size=1 << 20)  # unchanged: the index's own table is checked
    with pytest.raises(CorruptArchiveError, match=r"at offset 2560$"):  # its data's offset; reused beside a new shard: checked too
        tarindex.build_index([src, zst], index=index, workers=1, max_member_size=1 << 20)
    result = CliRunner().invoke(main, ["build", str(src), "-o", str(index), "--max-member-size", "64X"])
    assert result.exit_code == 2 and "'64X' is not a size" in result.output


def test_parse_size() -> None:
    from tarindex.cli._common import parse_size

    assert [parse_size(s) for s in ("1048576", "64M", "64MiB", "2G", "2gb", " 3k ", "1T")] == [
        1 << 20, 64 << 20, 64 << 20, 2 << 30, 2 << 30, 3 << 10, 1 << 40]
    for bad in ("", "1.5G", "-1", "M", "12 apples"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size(bad)


@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz"])
def test_large_member_costs_one_copy(suffix: str, impl: str, tmp_path: Path) -> None:
    """A 256 MiB member of a zstd or gzip stream is assembled in one buffer as it arrives: peak RSS above the start
    of streaming stays under 1.25x the member (pieces plus a joined copy made it 2x)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    try:
        from bench_limits import _measure, _write_shard
    finally:
        sys.path.pop(0)
    size = 256 << 20
    shard = _write_shard(tmp_path / f"zeros{suffix}", size)
    rss, _ = _measure(os.getcwd(), shard, size, pure=impl == "python")
    assert rss < 1.25 * (size >> 20), f"peak RSS {rss} MiB above the start for a {size >> 20} MiB member"
