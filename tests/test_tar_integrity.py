"""The walk verifies before it trusts: checksums before fields, sizes before use, numbers read as GNU tar
reads them, extension headers merged as tarfile merges them; every failure a named error with shard
and offset, the same in C and in Python, through every cursor."""

from __future__ import annotations

import io
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from _tarmut import (
    WAYS,
    archive,
    extension,
    fix_checksum,
    header,
    impl,
    member,
    outcomes,
    pax_record,
    run,
    set_field,
    tarfile_view,
)

import tarindex
from conftest import require_c_extension
from tarindex.tar import BLOCK, MAX_MEMBER_SIZE, iter_tar

GOOD = [member(b"a.txt", b"alpha" * 30), member(b"a.cls", b"1"), member(b"b.txt", b"beta"), member(b"b.cls", b"2")]


def _errors(got: dict[tuple[str, str], Any], where: str, match: str, offset: int | None = None) -> None:
    """Every way failed with a named CorruptArchiveError naming the shard, matching ``match``; C == Python."""
    for (which, way), result in got.items():
        assert isinstance(result, tuple) and result[0] == "error", (which, way, result)
        _, kind, message, at = result
        assert kind == "CorruptArchiveError", (which, way, result)
        assert message.startswith(where + ": ") and f"at offset {at}" in message, (which, way, message)
        assert re.search(match, message), (which, way, message)
        if offset is not None:
            assert at == offset, (which, way, message)
    for way in WAYS:
        assert got["c", way] == got["python", way], way


def _same(got: dict[tuple[str, str], Any], members: list[tuple[str, bytes]]) -> None:
    """Every way read exactly ``members`` (names and bytes); C == Python."""
    for (which, way), result in got.items():
        assert not (isinstance(result, tuple) and result[0] == "error"), (which, way, result)
        if way.startswith("members-"):
            assert result == members, (which, way)
    for way in WAYS:
        assert got["c", way] == got["python", way], way


def test_size_used_only_after_the_checksum(tmp_path: Path) -> None:
    """A damaged base-256 size in a header whose checksum is wrong: a checksum error, not an overflow."""
    buf = bytearray(archive(*GOOD))
    at = len(GOOD[0])
    set_field(buf, at, 124, b"\x80" + b"\xff" * 11, fix=False)  # checksum not fixed
    got = outcomes(bytes(buf), tmp_path / "cks.tar")
    _errors(got, str(tmp_path / "cks.tar"), r"bad header checksum", at)


@pytest.mark.parametrize(
    ("field", "match"),
    [
        (b"\x80" + b"\xff" * 11, r"bad size field"),  # 2**88 - 1: out of range
        (b"\xff" * 12, r"bad size field"),  # negative base-256
        (b"\xc0" + bytes(11), r"bad size field"),  # no valid base-256 lead byte
        (b"+0000000005\x00", r"bad size field"),
        (b"-0000000001\x00", r"bad size field"),
        (b"00000_00005\x00", r"bad size field"),
        (b"0000000008\x00\x00", r"bad size field"),  # not an octal digit
        (b" " * 12, r"bad size field"),  # blanks only: GNU tar refuses them
        (b"\x80" + (1 << 40).to_bytes(11, "big"), r"member data needs 1099511627776 bytes|over max_member_size"),
        (b"77777777777\x00", r"member data needs 8589934591 bytes|over max_member_size"),
        (b"777777777777", r"member data needs 68719476735 bytes|over max_member_size"),  # 12 digits, no terminator
    ],
)
def test_bad_or_huge_size_is_a_named_error(tmp_path: Path, field: bytes, match: str) -> None:
    buf = bytearray(archive(*GOOD))
    at = len(GOOD[0]) + len(GOOD[1])
    set_field(buf, at, 124, field)
    path = tmp_path / "size.tar"
    _errors(outcomes(bytes(buf), path, max_member_size=1 << 30), str(path), match, at)


@pytest.mark.parametrize("field", [b"  000000005\x00", b"000000005 \x00\x00", b"\x00  00000005 ", b"5\x00" + bytes(10), b"00000000005 "])
def test_octal_fields_as_gnu_tar_reads_them(tmp_path: Path, field: bytes) -> None:
    """Leading blanks (and one leading NUL), NUL or blank terminators: the size is 5."""
    buf = archive(bytes(header(b"x.bin", 5, size_field=field)) + b"12345" + bytes(BLOCK - 5))
    _same(outcomes(buf, tmp_path / "octal.tar"), [("x.bin", b"12345")])


@pytest.mark.parametrize("value", ["-512", " 5", "+5", "5_0", "-1", "5 ", "0x10", "", "99999999999999999999", "\u0665"])  # the last: an Arabic-Indic five
def test_pax_size_is_decimal_digits_only(tmp_path: Path, value: str) -> None:
    """A PAX size that is not decimal digits (GNU tar: "Malformed extended header") names the x header;
    size=-512 no longer walks backwards (it used to loop for ever)."""
    buf = archive(GOOD[0], extension(b"x", pax_record("size", value)), member(b"c.bin", bytes(70_000)), *GOOD[1:])
    path = tmp_path / "pax.tar"
    started = time.monotonic()
    _errors(outcomes(buf, path), str(path), r"bad PAX size|over max_member_size|member data needs", len(GOOD[0]))
    assert time.monotonic() - started < 30


def test_global_pax_size_malformed(tmp_path: Path) -> None:
    """A global ``size= 5`` used to turn the next member into 5 zero bytes and lose the one after."""
    buf = archive(extension(b"g", pax_record("size", " 5")), member(b"000001.bin", bytes(70_000)), *GOOD)
    path = tmp_path / "gsize.tar"
    _errors(outcomes(buf, path), str(path), r"bad PAX size")


@pytest.mark.parametrize(
    "payload",
    [
        b"5 a=1\n",  # length 5, record is 6 bytes
        b"30 path=x\n",  # length past the data
        b"x7 a=1\n",
        b" 7 a=1\n",
        b"+7 a=1\n",
        b"7 a-1\n\n",  # no '='
        b"6 =1\n\n",  # empty key
        b"7 a=12\x00",  # no newline at the record's end
        b"0 \n",
        b"garbage",
    ],
)
def test_bad_pax_record_names_shard_and_offset(tmp_path: Path, payload: bytes) -> None:
    buf = archive(GOOD[0], extension(b"x", payload), *GOOD[1:])
    path = tmp_path / "rec.tar"
    _errors(outcomes(buf, path), str(path), r"malformed PAX extended header record", len(GOOD[0]))


def test_pax_records_applied_and_ignored(tmp_path: Path) -> None:
    """path and size applied, every other record (mtime as a float, linkpath, unknown keys) ignored; NUL padding."""
    pax = pax_record("mtime", "1700000000.25") + pax_record("path", "long/" + "n" * 150 + ".txt")
    pax += pax_record("linkpath", "z") + pax_record("SCHILY.xattr.user.k", b"\xff\x00v") + pax_record("size", "7") + b"\x00" * 3
    buf = archive(extension(b"x", pax), bytes(header(b"short.txt", 0)) + b"seven!!" + bytes(BLOCK - 7), *GOOD)
    expected = [("long/" + "n" * 150 + ".txt", b"seven!!"), ("a.txt", b"alpha" * 30), ("a.cls", b"1"), ("b.txt", b"beta"), ("b.cls", b"2")]
    assert tarfile_view(buf) == expected
    _same(outcomes(buf, tmp_path / "pax.tar"), expected)


@pytest.mark.parametrize(
    "parts",
    [
        ("x:path=first.txt", "x:path=second.txt"),
        ("L:gnu-long.txt", "x:path=pax.txt"),
        ("x:path=pax.txt", "L:gnu-long.txt"),
        ("g:mtime=2.5", "x:path=pax.txt"),
        ("g:comment=c", "L:gnu-long.txt"),
        ("x:size=3", "x:path=p.txt"),
        ("L:one.txt", "L:two.txt"),
        ("K:target", "x:path=k.txt"),
    ],
)
def test_consecutive_extension_headers_merge_as_tarfile_merges(tmp_path: Path, parts: tuple[str, ...]) -> None:
    exts = []
    for part in parts:
        typ, _, rec = part.partition(":")
        if typ in "xg":
            key, _, value = rec.partition("=")
            exts.append(extension(typ.encode(), pax_record(key, value)))
        else:
            exts.append(extension(typ.encode(), rec.encode() + b"\x00"))
    buf = archive(GOOD[0], *exts, member(b"plain.txt", b"abc"), member(b"after.txt", b"after"))
    expected = tarfile_view(buf)
    assert expected is not None
    got = outcomes(buf, tmp_path / "merge.tar")
    _same(got, expected)
    table = got["python", "table-file"]
    assert table["sample_offset"][1] == len(GOOD[0]) or parts[0].startswith("g")  # the member starts at its first header


def test_global_pax_path_applies_to_every_following_member(tmp_path: Path) -> None:
    buf = archive(GOOD[0], extension(b"g", pax_record("path", "g.txt")), member(b"x.txt", b"x"), member(b"y.txt", b"y"))
    expected = [("a.txt", b"alpha" * 30), ("g.txt", b"x"), ("g.txt", b"y")]
    assert tarfile_view(buf) == expected
    got = outcomes(buf, tmp_path / "g.tar", ways=("members-buffer", "members-chunks", "members-file"))
    for key, result in got.items():
        assert result == expected, key


def test_extension_header_then_the_end(tmp_path: Path) -> None:
    buf = archive(GOOD[0], extension(b"x", pax_record("path", "p.txt")))
    path = tmp_path / "dangling.tar"
    _errors(outcomes(buf, path), str(path), r"extension header without a following member", len(GOOD[0]))


def test_old_style_directory_is_not_a_member(tmp_path: Path) -> None:
    """Type NUL with a name ending in '/' is a directory (GNU tar and tarfile agree)."""
    buf = archive(member(b"dir/", b"", typ=b"\x00"), member(b"x.txt", b"x", typ=b"\x00"))
    assert tarfile_view(buf) == [("x.txt", b"x")]
    _same(outcomes(buf, tmp_path / "olddir.tar"), [("x.txt", b"x")])


def test_huge_member_on_a_pipe_is_refused_before_allocation(tmp_path: Path) -> None:
    """A pipe has no length: a header claiming 7 GiB with little data is a truncation, read as it arrives
    (never 7 GiB allocated up front); over ``max_member_size`` it is refused at the header."""
    head = header(b"huge.bin", 7 << 30)
    buf = GOOD[0] + bytes(head) + bytes(300_000)
    path = tmp_path / "huge.tar"
    got = outcomes(buf, path, ways=("samples-pipe", "samples-sized", "samples-chunks", "members-chunks", "samples-file"))
    for (which, way), result in got.items():
        assert result[:2] == ("error", "CorruptArchiveError") and "huge.tar" in result[2], (which, way, result)
        assert result[3] == len(GOOD[0]) and "needs 7516192768 bytes" in result[2], (which, way, result)
    got = outcomes(buf, path, ways=("samples-pipe", "samples-sized", "samples-chunks", "members-chunks"), max_member_size=1 << 20)
    for (which, way), result in got.items():
        assert "over max_member_size (1048576 bytes)" in result[2] and result[3] == len(GOOD[0]), (which, way, result)
    assert MAX_MEMBER_SIZE == 8 << 30


def test_large_member_on_a_pipe_grows_as_it_arrives(tmp_path: Path) -> None:
    """A 33 MiB member over a pipe of unknown length (its bytes grown twice as the data arrives), of declared
    length and from a file; the archive cut inside a member's padding and inside the large member's data:
    the same samples, or the same named error, in C and Python (one way at a time: little memory held)."""
    big = bytes(range(256)) * ((33 << 20) // 256) + b"tail!"
    buf = GOOD[0] + member(b"a.bin", big) + member(b"b.txt", b"x" * 700) + bytes(1024)
    path = tmp_path / "big.tar"
    cuts = ((len(buf) - 1024 - 100, len(GOOD[0]) + BLOCK + len(big) + 507), (len(GOOD[0]) + BLOCK + (20 << 20), len(GOOD[0])))
    for which in ("c", "python"):
        with impl(which):
            for way in ("samples-pipe", "samples-sized", "samples-file"):
                path.write_bytes(buf)
                samples = [sorted((k, v) for k, v in s.items() if not k.startswith("__")) for _, s in run(way, buf, path)]
                assert samples == [[("bin", big), ("txt", b"alpha" * 30)], [("txt", b"x" * 700)]], (which, way)
                del samples
                for cut, at in cuts:  # inside b.txt's padding, inside a.bin's data
                    path.write_bytes(buf[:cut])
                    result = run(way, buf[:cut], path)
                    assert result[:2] == ("error", "CorruptArchiveError"), (which, way, cut)
                    assert result[3] == at and "truncated archive" in result[2], (which, way, result)


def test_sink_without_scan_gets_every_member(tmp_path: Path) -> None:
    """A user sink with only ``add`` gets every member, with the C extension built or not."""
    from tarindex.tar import index_tar, index_tar_file

    class Collect:
        def __init__(self) -> None:
            self.names: list[str] = []

        def add(self, name: str, header_offset: int, offset: int, size: int, /) -> None:
            self.names.append(name)

    buf = archive(*GOOD)
    (tmp_path / "s.tar").write_bytes(buf)
    for which in ("c", "python"):
        with impl(which):
            sink = Collect()
            index_tar((buf,), "s.tar", sink)
            assert sink.names == ["a.txt", "a.cls", "b.txt", "b.cls"], which
            sink = Collect()
            with open(tmp_path / "s.tar", "rb") as f:
                index_tar_file(f.fileno(), "s.tar", sink)
            assert sink.names == ["a.txt", "a.cls", "b.txt", "b.cls"], which


def test_skip_shard_catches_every_walk_error(tmp_path: Path) -> None:
    """``handler="skip_shard"`` skips a shard with a damaged size (used to be a bare OverflowError)."""
    pytest.importorskip("torch")
    from tarindex import TarStream

    bad = bytearray(archive(*GOOD))
    set_field(bad, len(GOOD[0]), 124, b"\x80" + b"\xff" * 11)
    (tmp_path / "0.tar").write_bytes(bytes(bad))
    pax = archive(extension(b"x", pax_record("size", "-512")), *GOOD)
    (tmp_path / "1.tar").write_bytes(pax)
    (tmp_path / "2.tar").write_bytes(archive(*GOOD))
    urls = [str(tmp_path / f"{i}.tar") for i in range(3)] + [f"pipe:cat {tmp_path / '0.tar'}"]
    for which in ("c", "python"):
        with impl(which), pytest.warns(tarindex.StreamWarning):
            keys = [s["__key__"] for s in TarStream(urls, handler="skip_shard")]
        assert keys == ["a", "b"], which  # 2.tar; 0.tar fails inside its first sample, 1.tar at its first header


def test_checksum_field_read_as_octal(tmp_path: Path) -> None:
    """A checksum written with leading blanks or a NUL-only terminator is accepted (as GNU tar does)."""
    buf = bytearray(archive(*GOOD))
    total = sum(buf[:148]) + 256 + sum(buf[156:512])
    buf[148:156] = b" %06o\x00" % total
    _same(outcomes(bytes(buf), tmp_path / "ck.tar"), [("a.txt", b"alpha" * 30), ("a.cls", b"1"), ("b.txt", b"beta"), ("b.cls", b"2")])
    buf[148:156] = b"+%06o\x00" % total
    path = tmp_path / "ck2.tar"
    _errors(outcomes(bytes(buf), path), str(path), r"bad header checksum", 0)


def test_c_core_matches_reference_on_tarfile_formats(tmp_path: Path) -> None:
    """Sanity: every way reads tarfile's PAX, GNU and ustar archives exactly."""
    require_c_extension()
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT):
        bio = io.BytesIO()
        with tarfile.open(fileobj=bio, mode="w", format=fmt) as tf:
            for i in range(5):
                ti = tarfile.TarInfo(f"{'d' * 80}/{i:03d}.bin" if fmt != tarfile.USTAR_FORMAT else f"{i:03d}.bin")
                data = bytes([i]) * (i * 300)
                ti.size = len(data)
                ti.mtime = 1.5  # a float: tarfile writes a PAX header in PAX format
                tf.addfile(ti, io.BytesIO(data))
        buf = bio.getvalue()
        expected = tarfile_view(buf)
        assert expected is not None
        _same(outcomes(buf, tmp_path / f"f{fmt}.tar"), expected)
        assert [(e[0], e[4]) for e in iter_tar((buf,), "x", with_data=True)] == expected


def test_fix_checksum_helper_is_right() -> None:
    buf = bytearray(archive(*GOOD))
    buf[148:156] = b"0000000\x00"
    fix_checksum(buf, 0)
    with tarfile.open(fileobj=io.BytesIO(bytes(buf))) as tf:
        assert tf.getnames()[0] == "a.txt"


def test_c_core_reads_pax_and_gnu_shards_itself(tmp_path: Path, wds_shard: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards with a PAX header per member (webdataset's TarWriter, tarfile's PAX format) and GNU long
    names are walked by the C core: the Python walker verifies no header of theirs."""
    require_c_extension()
    import os

    import tarindex.tar
    from tarindex.grouping import iter_samples
    from tarindex.scan import table_from_chunks, table_from_file

    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(20):
            ti = tarfile.TarInfo(f"{'long' * 40}/{i:04d}.bin")
            ti.size = i * 100
            tf.addfile(ti, io.BytesIO(bytes(i * 100)))
    gnu = tmp_path / "gnu.tar"
    gnu.write_bytes(bio.getvalue())
    calls = []
    real = tarindex.tar._verified
    monkeypatch.setattr(tarindex.tar, "_verified", lambda *a: calls.append(a[2]) or real(*a))
    for shard in (wds_shard, gnu):
        assert (b"PaxHeader" if shard == wds_shard else b"././@LongLink") in shard.read_bytes()
        fd = os.open(shard, os.O_RDONLY)
        try:
            samples = list(iter_samples(fd, str(shard)))
            table = table_from_file(fd, str(shard))
        finally:
            os.close(fd)
        buf = shard.read_bytes()
        assert table_from_chunks((buf,), str(shard)).keys == table.keys == [s["__key__"] for _, s in samples]
        assert calls == [], (shard, calls)  # not one header went through the Python walker
        with impl("python"):
            assert list(iter_samples([buf], str(shard))) == samples
        assert calls, shard  # the reference did walk it in Python
        calls.clear()
