"""The tar header parser against Python's tarfile, on real archives."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tarindex
from conftest import PY_FORMATS, tarfile_members
from tarindex.tar import BLOCK, iter_members, iter_tar


@pytest.fixture(autouse=True)
def walk_path(impl: str) -> str:
    """Every parser test runs with the C walk of plain headers and with the Python walker alone."""
    return impl


def test_c_walk_covers_extension_headers_and_stops_at_the_rest(walk_path: str) -> None:
    from tarindex._speedups import scan_headers

    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("a.txt", "b" * 120 + ".txt", "c.txt"):  # the long name needs a GNU 'L' header
            ti = tarfile.TarInfo(name)
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"abc"))
    buf = bio.getvalue()
    got, after, last_at, last_size = scan_headers(buf, 0, 100, True, 1000)
    assert [e[:4] for e in got] == [("a.txt", 100, 612, 3), ("b" * 120 + ".txt", 1124, 2660, 3), ("c.txt", 3172, 3684, 3)]
    assert [e[4] for e in got] == [b"abc"] * 3 and (last_at, last_size) == (3072, 3)
    assert buf[after : after + BLOCK] == bytes(BLOCK)  # stopped at the end-of-archive marker, for the Python walker
    assert scan_headers(buf, 1024, 0, True, 1000)[0][0][:2] == ("b" * 120 + ".txt", 1024)  # the member starts at its 'L' header
    assert scan_headers(buf[:2100], 1024, 0, False, 1000)[1] == 1024  # its headers do not fit: the Python walker's
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tf:
        ti = tarfile.TarInfo("x.txt")
        tf.addfile(ti, io.BytesIO(b""))
    assert scan_headers(pax.getvalue(), 0, 0, True, 1000)[:2] == ([], 0)  # a global PAX header: the Python walker's
    assert [e[0] for e in iter_tar((buf,), "x.tar")] == ["a.txt", "b" * 120 + ".txt", "c.txt"]


def _scan(path: Path) -> list[tuple[str, bytes]]:
    buf = path.read_bytes()
    return [(m.name, buf[m.offset : m.offset + m.size]) for m in iter_members(buf, str(path))]


def test_gnu_tar_members_equal_tarfile(gnu_tar_shard: Path) -> None:
    got = _scan(gnu_tar_shard)
    assert got == tarfile_members(gnu_tar_shard)
    names = [n for n, _ in got]
    assert any(len(n) > 100 for n in names)
    assert any("样本" in n for n in names)
    assert "link.txt" not in names and "sub/dir" not in names


def test_python_tarfile_members_equal_tarfile(py_tar_shard: Path) -> None:
    got = _scan(py_tar_shard)
    assert got == tarfile_members(py_tar_shard)
    names = [n for n, _ in got]
    assert "somedir" not in names and "somelink.txt" not in names
    assert ("sample002.empty", b"") in got


def test_webdataset_shard_members_equal_tarfile(wds_shard: Path) -> None:
    assert _scan(wds_shard) == tarfile_members(wds_shard)


def test_member_offsets_and_end(py_tar_shard: Path) -> None:
    buf = py_tar_shard.read_bytes()
    for m in iter_members(buf, str(py_tar_shard)):
        assert m.header_offset % BLOCK == 0 and m.offset % BLOCK == 0
        assert m.header_offset < m.offset
        assert m.end % BLOCK == 0 and m.end >= m.offset + m.size


_names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x2FFF, blacklist_characters="/\\\x7f"),
    min_size=1,
    max_size=150,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    members=st.lists(st.tuples(_names, st.binary(max_size=2000)), min_size=0, max_size=8, unique_by=lambda t: t[0]),
    fmt=st.sampled_from(["gnu", "pax"]),
)
def test_property_offsets_read_back(members: list[tuple[str, bytes]], fmt: str) -> None:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=PY_FORMATS[fmt], encoding="utf-8") as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf = bio.getvalue()
    scanned = list(iter_members(buf, "prop.tar"))
    bio.seek(0)
    with tarfile.open(fileobj=bio, encoding="utf-8") as tf:
        expected = [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]
    assert [(m.name, buf[m.offset : m.offset + m.size]) for m in scanned] == expected


def _simple_tar(path: Path) -> bytes:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(3):
            data = os.urandom(700)
            ti = tarfile.TarInfo(f"k{i}.bin")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path.read_bytes()


def _expect_corrupt(buf: bytes, path: str, offset: int | None = None) -> tarindex.CorruptArchiveError:
    pattern = re.escape(path) + r".* at offset \d+"
    with pytest.raises(tarindex.CorruptArchiveError, match=pattern) as info:
        list(iter_members(buf, path))
    err = info.value
    assert err.path == path
    assert f"at offset {err.offset}" in str(err)
    if offset is not None:
        assert err.offset == offset
    return err


def test_truncated_data(tmp_path: Path) -> None:
    buf = _simple_tar(tmp_path / "t.tar")
    # the third member's header is at 2 * (512 + 1024); cut inside its data
    third = 2 * (BLOCK + 2 * BLOCK)
    _expect_corrupt(buf[: third + BLOCK + 100], str(tmp_path / "t.tar"), offset=third)


def test_truncated_header(tmp_path: Path) -> None:
    buf = _simple_tar(tmp_path / "t.tar")
    _expect_corrupt(buf[: 3 * BLOCK + 10], "t.tar", offset=3 * BLOCK)


def test_truncated_no_end_marker(tmp_path: Path) -> None:
    buf = _simple_tar(tmp_path / "t.tar")
    n = 3 * 3 * BLOCK
    _expect_corrupt(buf[:n], "t.tar", offset=n)


def test_zero_byte_file() -> None:
    _expect_corrupt(b"", "empty.tar", offset=0)


def test_random_garbage() -> None:
    import random

    rng = random.Random(1234)
    garbage = bytes(rng.randrange(1, 256) for _ in range(4096))
    _expect_corrupt(garbage, "garbage.tar", offset=0)


def test_corrupted_header_checksum(tmp_path: Path) -> None:
    buf = bytearray(_simple_tar(tmp_path / "t.tar"))
    second = BLOCK + 2 * BLOCK
    buf[second + 10] ^= 0x01  # a name byte of the second header; checksum no longer matches
    err = _expect_corrupt(bytes(buf), "t.tar", offset=second)
    assert "checksum" in str(err)


def test_corrupted_first_header_checksum(tmp_path: Path) -> None:
    buf = bytearray(_simple_tar(tmp_path / "t.tar"))
    buf[0] ^= 0x20
    _expect_corrupt(bytes(buf), "t.tar", offset=0)


def test_directories_and_symlinks_skipped(tmp_path: Path) -> None:
    p = tmp_path / "mixed.tar"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, typ in (("adir", tarfile.DIRTYPE), ("alink.txt", tarfile.SYMTYPE), ("hard.txt", tarfile.LNKTYPE)):
            ti = tarfile.TarInfo(name)
            ti.type = typ
            ti.linkname = "real.txt" if typ != tarfile.DIRTYPE else ""
            tf.addfile(ti)
        ti = tarfile.TarInfo("real.txt")
        ti.size = 4
        tf.addfile(ti, io.BytesIO(b"real"))
    assert _scan(p) == [("real.txt", b"real")]


def test_checksum_error_message_is_one_line() -> None:
    block = bytearray(os.urandom(BLOCK))
    block[0] = 1  # not a zero block
    block[148:156] = b"\n\x0b\x1c\xff\x85ab\x0c"  # line breaks of every kind in the checksum field
    err = _expect_corrupt(bytes(block) + bytes(2 * BLOCK), "lines.tar", offset=0)
    assert len(str(err).splitlines()) == 1
    assert str(err).isprintable()


def _chunked(buf: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(buf) + 1) for c in cuts})
    edges = [0, *points, len(buf)]
    return [buf[a:b] for a, b in zip(edges, edges[1:])]  # empty pieces included on purpose


@settings(max_examples=40, deadline=None)
@given(
    members=st.lists(st.tuples(_names, st.binary(max_size=3000)), min_size=0, max_size=6, unique_by=lambda t: t[0]),
    fmt=st.sampled_from(["gnu", "pax", "ustar"]),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12),
)
def test_property_chunked_stream_equals_whole_buffer(members: list[tuple[str, bytes]], fmt: str, cuts: list[int]) -> None:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=PY_FORMATS[fmt], encoding="utf-8") as tf:
        for name, data in members:
            if fmt == "ustar" and len(name.encode()) > 99:
                continue
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf = bio.getvalue()
    whole = list(iter_tar((buf,), "whole.tar"))
    streamed = list(iter_tar(_chunked(buf, cuts), "stream.tar", with_data=True))
    assert [e[:4] for e in streamed] == [e[:4] for e in whole]
    assert [e[4] for e in streamed] == [buf[e[2] : e[2] + e[3]] for e in whole]
    assert all(e[4] is None for e in whole)


def test_stream_many_members_crosses_checksum_batches() -> None:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(2500):
            data = str(i).encode() * (i % 7)
            ti = tarfile.TarInfo(f"{i:05d}.txt")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf = bio.getvalue()
    got = list(iter_tar(_chunked(buf, list(range(0, len(buf), 4096 + 17))), "many.tar", with_data=True))
    assert [(e[0], e[4]) for e in got] == tarfile_members_from_bytes(buf)


def tarfile_members_from_bytes(buf: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg()]


@pytest.mark.parametrize("cut", [1, BLOCK - 1, BLOCK + 5, 3 * BLOCK])
def test_stream_that_ends_early_is_an_error(tmp_path: Path, cut: int) -> None:
    buf = _simple_tar(tmp_path / "t.tar")
    short = buf[: 3 * 3 * BLOCK - cut]  # ends inside the three members
    with pytest.raises(tarindex.CorruptArchiveError, match=r"s\.tar: truncated .* at offset \d+"):
        list(iter_tar(_chunked(short, [700, 1500]), "s.tar", with_data=True))


def test_bad_checksum_stops_the_walk_at_that_header() -> None:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(1500):
            ti = tarfile.TarInfo(f"{i:05d}.txt")
            tf.addfile(ti, io.BytesIO(b""))
    buf = bytearray(bio.getvalue())
    bad = 1200 * BLOCK
    buf[bad + 3] ^= 0x04
    seen: list[str] = []
    with pytest.raises(tarindex.CorruptArchiveError, match="checksum") as info:
        for e in iter_tar((bytes(buf),), "b.tar"):
            seen.append(e[0])
    assert info.value.offset == bad
    assert seen == [f"{i:05d}.txt" for i in range(1200)]  # each header verified before it is used
