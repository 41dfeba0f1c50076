"""gzip shards: streamed, indexed by content and read at random through seek points, made by GNU
``tar czf``, ``pigz``, ``tarfile`` (``w:gz``), webdataset's writer and concatenated members (as
``bgzip`` writes); every sample compared with what ``tarfile`` extracts; damaged deflate named by shard
and compressed offset; a replaced shard is stale.
"""

from __future__ import annotations

import dataclasses
import gzip as gzip_module
import multiprocessing
import os
import random
import shutil
import subprocess
import tarfile
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _servers import HTTPServer
from click.testing import CliRunner
from test_zstd import expected_samples

import tarindex
from conftest import file_specs, gnu_tar, make_shard_set, py_tar, write_tree
from tarindex import gzip_random
from tarindex.cli.main import main
from tarindex.errors import CorruptDeflateError, IndexFormatError, RandomAccessError, StaleIndexError
from tarindex.gzip import decompress_gzip
from tarindex.gzip_random import SeekPoints
from tarindex.index.format import GZIP_PREFIX
from tarindex.index.pages import numbered, seal, unseal
from tarindex.index.reader import IndexReader
from tarindex.index.writer import IndexWriter
from tarindex.scan import scan_shard


def _gnu_czf(tar: Path, src: Path, out: Path) -> Path:
    names = [n for n, _ in file_specs("gnu")]
    subprocess.run(["tar", "--format=gnu", "--no-recursion", "-C", str(src), "-czf", str(out), *names], check=True)
    return out


def _pigz(tar: Path, src: Path, out: Path) -> Path:
    if shutil.which("pigz") is None:
        pytest.skip("pigz is not installed")  # .ci/run installs it
    with open(out, "wb") as f:
        subprocess.run(["pigz", "-c", "-p", "2", "-b", "32", str(tar)], stdout=f, check=True)
    return out


def _tarfile_gz(tar: Path, src: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name, _ in file_specs("pax"):
            tf.add(src / name, arcname=name, recursive=False)
    return out


def _members(tar: Path, src: Path, out: Path) -> Path:
    """Many gzip members of 20 KB of the tar each, concatenated (what bgzip and ``cat a.gz b.gz`` make)."""
    data = tar.read_bytes()
    out.write_bytes(b"".join(gzip_module.compress(data[i : i + 20_000]) for i in range(0, len(data), 20_000)))
    return out


def _webdataset(tar: Path, src: Path, out: Path) -> Path:
    import webdataset as wds

    with wds.TarWriter(str(out)) as w:  # a name ending in .gz: gzip
        for i in range(30):
            w.write({"__key__": f"w{i:03d}", "txt": f"text {i}", "bin": os.urandom(i * 101)})
    return out


MAKERS = {"tar-czf": _gnu_czf, "pigz": _pigz, "tarfile-w:gz": _tarfile_gz, "members": _members, "webdataset": _webdataset}


@pytest.fixture
def made(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """(gzip shard, the plain tar it decompresses to, per ``gzip -dc``)."""
    src = tmp_path / "src"
    write_tree(src, file_specs("gnu"))
    tar = gnu_tar(src, tmp_path / "plain.tar", "gnu", [n for n, _ in file_specs("gnu")])
    shard = MAKERS[request.param](tar, src, tmp_path / "x.tar.gz")
    plain = tmp_path / "restored.tar"
    with open(plain, "wb") as f:
        subprocess.run(["gzip", "-dc", str(shard)], stdout=f, check=True)
    return shard, plain


@pytest.mark.parametrize("made", list(MAKERS), indirect=True)
def test_stream_and_build_equal_tarfile(made: tuple[Path, Path], tmp_path: Path) -> None:
    shard, plain = made
    oracle = expected_samples(plain)
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in tarindex.TarStream([str(shard)])}
    assert got == oracle
    info, table = scan_shard(str(shard))
    _, plain_table = scan_shard(str(plain))
    assert info.compression == "gzip" and info.random_access and table.gzip_points is not None
    assert table.keys == plain_table.keys and (table.sample_offset == plain_table.sample_offset).all()
    assert (table.member_size == plain_table.member_size).all()
    disguised = tmp_path / "looks-plain.tar"  # by content, not by name
    shutil.copy(shard, disguised)
    assert scan_shard(str(disguised))[1].keys == table.keys


def _assert_random_reads(index: Path, oracle: dict[str, dict[str, bytes]], seed: int = 0) -> None:
    """Every sample, in a random order, equals what tarfile extracts from the decompressed tar."""
    ds = tarindex.TarDataset(index)
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    got = {}
    for i in order:
        s = ds[i]
        got[s["__key__"]] = {k: v for k, v in s.items() if not k.startswith("__")}
    assert got == oracle


@pytest.mark.parametrize("spacing", [gzip_random.SPACING, 4096])
@pytest.mark.parametrize("made", list(MAKERS), indirect=True)
def test_random_reads_equal_tarfile(made: tuple[Path, Path], spacing: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard, plain = made
    monkeypatch.setattr(gzip_random, "SPACING", spacing)
    index = tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1).path
    points = SeekPoints(IndexReader(index).gzip_points(0) or b"", "test")
    assert points.decompressed[0] == 0 and (len(points) > 1) == (spacing == 4096)
    _assert_random_reads(index, expected_samples(plain))


def _big(tmp_path: Path) -> tuple[Path, dict[str, dict[str, bytes]]]:
    """A 6 MB tar of compressible samples (text of random words), and what tarfile extracts from it."""
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghij", k=rng.randrange(2, 9))) for _ in range(500)]
    specs = [(f"s{i:04d}.txt", b" ".join(rng.choices(words, k=rng.randrange(100, 3000)))) for i in range(800)]
    tar = py_tar(tmp_path / "big.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    return tar, expected_samples(tar)


def _big_gz(tmp_path: Path) -> tuple[Path, Path, dict[str, dict[str, bytes]]]:
    """The large tar as ``gzip -c`` writes it (one member), its index, what tarfile extracts."""
    tar, oracle = _big(tmp_path)
    shard = tmp_path / "big.tar.gz"
    with open(shard, "wb") as f:
        subprocess.run(["gzip", "-c", str(tar)], stdout=f, check=True)
    return shard, tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1).path, oracle


@pytest.mark.parametrize("tool", ["gzip", "pigz-i", "members"])
def test_random_reads_of_a_large_shard_through_many_points(tool: str, tmp_path: Path) -> None:
    tar, oracle = _big(tmp_path)
    shard = tmp_path / "big.tar.gz"
    if tool == "members":  # 100 KB members, as bgzip and cat a.gz b.gz make
        data = tar.read_bytes()
        shard.write_bytes(b"".join(gzip_module.compress(data[i : i + 100_000]) for i in range(0, len(data), 100_000)))
    else:
        cmd = ["gzip", "-c", str(tar)] if tool == "gzip" else ["pigz", "-i", "-b", "64", "-c", str(tar)]
        with open(shard, "wb") as f:
            subprocess.run(cmd, stdout=f, check=True)
    index = tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1).path
    points = SeekPoints(IndexReader(index).gzip_points(0) or b"", "test")
    assert len(points) >= 5
    if tool != "members":  # points inside a member: a bit offset and a window (a member's start needs neither)
        assert any(points.bits) and all(points.windows[1:])
    _assert_random_reads(index, oracle, seed=1)


def test_random_reads_over_http(http_server: HTTPServer, tmp_path: Path) -> None:
    tar, oracle = _big(tmp_path)
    www = http_server.root / "gz"
    www.mkdir(exist_ok=True)
    shard = www / "big.tar.gz"
    with open(shard, "wb") as f:
        subprocess.run(["gzip", "-c", str(tar)], stdout=f, check=True)
    index = tarindex.build_index([http_server.url(shard)], index=tmp_path / "u.tarindex", workers=1).path
    assert IndexReader(index).shards[0].random_access
    _assert_random_reads(index, oracle, seed=2)


def test_damaged_deflate_is_named_on_random_reads(tmp_path: Path) -> None:
    shard, index, _ = _big_gz(tmp_path)
    points = SeekPoints(IndexReader(index).gzip_points(0) or b"", "test")
    # The code tables of the block at the third point, past the bytes the point's check covers: inflate
    # finds them invalid. (Damage inside coded data can still decode; only a member's CRC-32, which
    # streaming and ``tarindex verify --deep`` check, sees it.)
    at = points.compressed[2] + 40
    data = bytearray(shard.read_bytes())
    data[at : at + 16] = b"\xff" * 16
    st = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: the damage is found by reading
    ds = tarindex.TarDataset(index)
    with pytest.raises(CorruptDeflateError, match=r"big\.tar\.gz: corrupt deflate data \(.*\) at offset (\d+)$") as info:
        for i in range(len(ds)):
            ds[i]
    assert at <= info.value.offset <= at + 16
    first = ds[0]  # samples before the damage still read
    assert first["__key__"] == "s0000"


def test_replaced_shard_is_stale(tmp_path: Path) -> None:
    shard, index, _ = _big_gz(tmp_path)
    points = SeekPoints(IndexReader(index).gzip_points(0) or b"", "test")
    st = shard.stat()
    # Another shard of the same size and ends, written over it with the same mtime (touch -r): the
    # bytes at a seek point differ from those the table was made from.
    data = bytearray(shard.read_bytes())
    k = 3
    data[points.compressed[k] : points.compressed[k] + 32] = bytes(reversed(data[points.compressed[k] : points.compressed[k] + 32]))
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = tarindex.TarDataset(index)
    offsets = IndexReader(index).shard_table(0).sample_offset
    after = next(i for i, o in enumerate(offsets) if o >= points.decompressed[k])  # read from point k
    with pytest.raises(StaleIndexError, match=rf"big\.tar\.gz: shard changed since it was indexed \(compressed bytes at seek point {k} "):
        ds[after]
    # A replacement of another size: the identity rule says so at open.
    shard.write_bytes(bytes(data[:-100]))
    with pytest.raises(StaleIndexError, match=r"big\.tar\.gz: shard changed since it was indexed \(size"):
        tarindex.TarDataset(index)[0]


def test_index_without_seek_points_is_refused_with_the_conversion_command(tmp_path: Path) -> None:
    (plain,) = make_shard_set(tmp_path / "d", n_shards=1, per=5)
    shard = tmp_path / "d" / "g.tar.gz"
    shard.write_bytes(gzip_module.compress(plain.read_bytes()))
    info, table = scan_shard(str(shard))
    table.gzip_points = None  # as an index written before seek points existed holds it
    with IndexWriter(tmp_path / "d" / "g.tarindex") as w:
        w.add(dataclasses.replace(info, path="g.tar.gz"), table)
    ds = tarindex.TarDataset(tmp_path / "d" / "g.tarindex")
    with pytest.raises(RandomAccessError, match=r"g\.tar\.gz: the index holds no gzip seek points .*tarindex compress"):
        ds[0]
    zst = tmp_path / "d" / "g.tar.zst"
    result = CliRunner().invoke(main, ["compress", str(shard), str(zst)])  # compress accepts gzip input
    assert result.exit_code == 0, result.output
    ds = tarindex.TarDataset(tarindex.build_index([zst], index=tmp_path / "z.tarindex", workers=1).path)
    oracle = expected_samples(plain)
    assert {ds[i]["__key__"]: ds[i]["bin"] for i in range(len(ds))} == {k: v["bin"] for k, v in oracle.items()}


def test_stream_of_a_single_gzip_file_is_not_taken_for_an_index(tmp_path: Path) -> None:
    (plain,) = make_shard_set(tmp_path / "d", n_shards=1, per=5)
    shard = tmp_path / "d" / "one.tgz"
    shard.write_bytes(gzip_module.compress(plain.read_bytes()))
    assert len(list(tarindex.TarStream(str(shard)))) == 5


@pytest.mark.parametrize("damage", ["flip", "truncate", "crc", "garbage"])
def test_damaged_gzip_is_named_with_its_compressed_offset(damage: str, tmp_path: Path) -> None:
    specs = [(f"s{i:03d}.bin", os.urandom(3000)) for i in range(50)]
    tar = py_tar(tmp_path / "p.tar", specs, tarfile.GNU_FORMAT, dirs=False)
    first = gzip_module.compress(tar.read_bytes()[:60_000])
    second = bytearray(gzip_module.compress(tar.read_bytes()[60_000:]))
    if damage == "flip":
        second[len(second) // 2] ^= 0xFF
    elif damage == "truncate":
        del second[len(second) // 2 :]
    elif damage == "crc":
        second[-6] ^= 0x01  # the CRC-32 of the second member
    else:
        second += b"not gzip"
    shard = tmp_path / "d.tar.gz"
    shard.write_bytes(first + bytes(second))
    at = len(first) + (len(second) - 8 if damage == "garbage" else 0)
    expected = rf"d\.tar\.gz: .*gzip.* at offset {at}$"
    with pytest.raises(CorruptDeflateError, match=expected):
        scan_shard(str(shard))
    with pytest.raises(CorruptDeflateError, match=expected):
        list(tarindex.TarStream([str(shard)]))


def test_trailing_zeros_after_the_members_are_padding(tmp_path: Path) -> None:
    data = b"".join(bytes([i]) * 1000 for i in range(50))
    stream = gzip_module.compress(data) + bytes(4096)
    assert b"".join(decompress_gzip([stream[i : i + 777] for i in range(0, len(stream), 777)], "z.gz")) == data


def test_merged_index_keeps_the_seek_points(tmp_path: Path) -> None:
    tar, oracle = _big(tmp_path)
    parts = []
    for name, tool in (("a", ["gzip", "-c"]), ("b", ["pigz", "-i", "-c"])):
        shard = tmp_path / f"{name}.tar.gz"
        with open(shard, "wb") as f:
            subprocess.run([*tool, str(tar)], stdout=f, check=True)
        parts.append(tarindex.build_index([shard], index=tmp_path / f"{name}.tarindex", workers=1).path)
    merged = tarindex.merge_indexes(parts, tmp_path / "all.tarindex")
    reader = IndexReader(merged)
    assert reader.gzip_points(0) == IndexReader(parts[0]).gzip_points(0)
    assert reader.gzip_points(1) == IndexReader(parts[1]).gzip_points(0)
    ds = tarindex.TarDataset(merged)
    for i in random.Random(4).sample(range(len(ds)), 200):
        s = ds[i]
        expected = oracle[s["__key__"]]
        assert {k: v for k, v in s.items() if not k.startswith("__")} == expected


_FORKED: tarindex.TarDataset | None = None


def _forked_read(i: int) -> tuple[str, bytes]:
    assert _FORKED is not None
    s = _FORKED[i]
    return s["__key__"], s["txt"]


def test_reads_in_forked_workers(tmp_path: Path) -> None:
    """The parent has read (its shard open, a seek point checked): forked children read on their own."""
    global _FORKED
    _, index, oracle = _big_gz(tmp_path)
    _FORKED = tarindex.TarDataset(index)
    try:
        _FORKED[len(_FORKED) // 2]
        order = random.Random(5).sample(range(len(_FORKED)), 120)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map(_forked_read, order, chunksize=10)
    finally:
        _FORKED = None
    assert got and all(oracle[k]["txt"] == v for k, v in got)


def test_rebuild_with_nothing_changed_keeps_the_seek_points(tmp_path: Path) -> None:
    shard, index, oracle = _big_gz(tmp_path)
    first = IndexReader(index).gzip_points(0)
    report = tarindex.build_index([shard], index=tmp_path / "g.tarindex", workers=1)
    assert report.reused and not report.scanned
    assert IndexReader(report.path).gzip_points(0) == first is not None
    _assert_random_reads(report.path, oracle, seed=6)


@pytest.mark.parametrize("spill", [False, True])
def test_gzip_and_zstd_shards_in_one_index(spill: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seek points and frame tables side by side, held in memory or spilled to disk while building."""
    from tarindex.index import writer

    if spill:
        monkeypatch.setattr(writer, "_SPILL_FRAMES", 1)
    shard, _, oracle = _big_gz(tmp_path)
    zst = tmp_path / "big.tar.zst"
    result = CliRunner().invoke(main, ["compress", str(shard), str(zst), "-q"])
    assert result.exit_code == 0, result.output
    second = tmp_path / "again.tar.gz"
    shutil.copy(shard, second)
    index = tarindex.build_index([shard, zst, second], index=tmp_path / "mixed.tarindex", workers=1).path
    reader = IndexReader(index)
    assert reader.gzip_points(0) == reader.gzip_points(2) is not None and reader.gzip_points(1) is None
    assert reader.frame_table(1) is not None and reader.frame_table(0) is None
    ds = tarindex.TarDataset(index)
    assert len(ds) == 3 * len(oracle)
    for i in random.Random(8).sample(range(len(ds)), 150):
        s = ds[i]
        assert {k: v for k, v in s.items() if not k.startswith("__")} == oracle[s["__key__"]]


Row = list[Any]  # a seek point as the table stores it: [compressed, decompressed, bits, check, stored window]


def _crafted(index: Path, edit: Callable[[list[Row]], object], count: int | None = None) -> Path:
    """A copy of ``index`` (beside it, so its shard names hold) whose shard 0's seek points went through
    ``edit`` (and claim ``count`` points, if given) and were sealed again under their key: a crafted
    table, its checksum right."""
    import lmdb

    out = index.with_name("crafted.tarindex")
    out.write_bytes(index.read_bytes())
    key = numbered(GZIP_PREFIX, 0)
    env = lmdb.open(str(out), subdir=False, lock=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        p = SeekPoints(unseal(txn.get(key), key, "test"), "test")
        rows = [[c, d, b, chk, w] for c, d, b, chk, w in zip(p.compressed, p.decompressed, p.bits, p.check, p.windows)]
        edit(rows)
        table = gzip_random._encode([(c, d, b, chk, w) for c, d, b, chk, w in rows])
        if count is not None:
            table = table[:8] + count.to_bytes(4, "little") + table[12:]
        txn.put(key, seal(key, table))
    env.close()
    return out


def _bomb(size: int) -> bytes:
    """``size`` zero bytes, zlib-compressed a MiB at a time (never held whole)."""
    z = zlib.compressobj(9)
    return b"".join(z.compress(bytes(1 << 20)) for _ in range(size >> 20)) + z.flush()


def _set(k: int, field: int, value: object) -> Callable[[list[Row]], object]:
    return lambda rows: rows[k].__setitem__(field, value)


K = 3  # the point the crafted fields are at (the large shard has a dozen, each with a window and a bit offset)
AT = rf"crafted\.tarindex: the gzip seek points of .*big\.tar\.gz are damaged at point {K} of \d+: "

CRAFTED_AT_OPEN = {
    "bits 9": (_set(K, 2, 9), AT + r"9 bits of the byte before the block \(expected 0-7\); rebuild the index$"),
    "offset past the shard": (_set(K, 0, 1 << 62), AT + rf"compressed offset {1 << 62} \(expected below the shard's \d+ bytes\)"),
    "offsets out of order": (
        lambda rows: rows[K].__setitem__(0, rows[K - 1][0]),
        AT + r"compressed offset (\d+), decompressed offset \d+ after \1, \d+ \(expected a larger compressed offset",
    ),
    "decompressed offset past deflate's ratio": (_set(K, 1, 1 << 60), AT + rf"compressed offset \d+, decompressed offset {1 << 60} after"),
    "decompressed offset going back": (_set(K, 1, 5), AT + r"compressed offset \d+, decompressed offset 5 after"),
    "a stored window too long to be 32 KiB": (
        lambda rows: rows[K].__setitem__(4, _bomb(64 << 20)),  # 64 MiB of zeros: 64 KB stored
        AT + r"a stored window of \d+ bytes \(expected at most 32791\)",
    ),
    "first point not at 0": (
        _set(0, 1, 7),
        r"crafted\.tarindex: the gzip seek points of .*big\.tar\.gz are damaged at point 0 of \d+: decompressed offset 7 \(expected 0\)",
    ),
    "more points than bytes": (
        lambda rows: None,  # (and a count of 2**32 - 1)
        r"crafted\.tarindex: the gzip seek points of .*big\.tar\.gz are damaged \(\d+ bytes for 4294967295 points\)",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED_AT_OPEN))
def test_crafted_seek_point_fields_are_refused_at_open(case: str, impl: str, tmp_path: Path) -> None:
    """Each field of a crafted table (checksum recomputed) is checked against the table and the shard before
    any is used: one ``IndexFormatError`` naming the index, the shard and the point, expected and got, in
    both lanes (before: a bare ``ValueError`` for 9 bits, ``MemoryError``/``OverflowError`` for an offset
    past the shard, a decompression bomb read whole)."""
    _, index, _ = _big_gz(tmp_path)
    edit, message = CRAFTED_AT_OPEN[case]
    ds = tarindex.TarDataset(_crafted(index, edit, 2**32 - 1 if case == "more points than bytes" else None))
    with pytest.raises(IndexFormatError, match=message):
        ds[len(ds) - 1]


CRAFTED_AT_READ: dict[str, tuple[Callable[[], bytes], str]] = {
    "a zlib bomb": (lambda: _bomb(32 << 20)[:32_000], r"its window is not one zlib stream of at most 32768 bytes"),  # 32 KB stored: 31 MB
    "garbage": (lambda: os.urandom(2000), r"its window is not zlib data \(Error -3 while decompressing data"),
    "one byte over 32 KiB": (lambda: zlib.compress(os.urandom(32769)), r"its window is not one zlib stream of at most 32768 bytes"),
    "bytes after the stream": (lambda: zlib.compress(b"w" * 1000) + b"junk", r"4 bytes after its window's zlib stream"),
}


@pytest.mark.parametrize("case", list(CRAFTED_AT_READ))
def test_crafted_windows_are_refused_within_32_kib(case: str, impl: str, tmp_path: Path) -> None:
    """A window is decompressed to 32 KiB at most, and must be one whole zlib stream: a bomb, garbage, a
    window one byte too long or followed by junk are one ``IndexFormatError`` naming the point, and the
    read allocates no more than a few MiB (before: 31 MB per read for this bomb, wrong bytes after it,
    a bare ``zlib.error`` for garbage). Reads from the other points still give tarfile's bytes."""
    _, index, oracle = _big_gz(tmp_path)
    window, message = CRAFTED_AT_READ[case]
    crafted = _crafted(index, _set(K, 4, window()))
    points = SeekPoints(IndexReader(crafted).gzip_points(0) or b"", "test")
    offsets = IndexReader(crafted).shard_table(0).sample_offset
    at_k = next(i for i, o in enumerate(offsets) if o >= points.decompressed[K] and o + 4096 < points.decompressed[K + 1])
    ds = tarindex.TarDataset(crafted)
    tracemalloc.start()
    try:
        with pytest.raises(IndexFormatError, match=AT + message):
            ds[at_k]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    first = ds[0]
    assert {k: v for k, v in first.items() if not k.startswith("__")} == oracle[first["__key__"]]


def test_leading_empty_members_give_points_at_one_offset(impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty gzip members before the data (``gzip < /dev/null`` concatenated) give several points at
    decompressed offset 0: a table the checks accept, read as tarfile reads the tar."""
    tar, oracle = _big(tmp_path)
    shard = tmp_path / "lead.tar.gz"
    shard.write_bytes(gzip_module.compress(b"") * 2 + gzip_module.compress(tar.read_bytes()))
    index = tarindex.build_index([shard], index=tmp_path / "lead.tarindex", workers=1).path
    points = SeekPoints(IndexReader(index).gzip_points(0) or b"", "test", size=shard.stat().st_size)
    assert points.decompressed[:3] == [0, 0, 0] and len(points) > 3
    _assert_random_reads(index, oracle, seed=5)
