"""Archives other tools write and read (issue 31, items 5 and 15): GNU sparse members with extension
blocks, links and devices whose headers carry a size, PAX records with an empty value and no newline,
archives without the end-of-archive marker, a single shard told from an index by its content, and the
CLI's one-line errors. Every walk is run every way (members, tables and sample dicts over a buffer,
chunks, a file and a pipe) in C and in Python (:func:`_tarmut.outcomes`), which must agree.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard
from _corpus import end_of_members, old_gnu_sparse, sparse_tar
from _tarmut import ALL_WAYS, WAYS, archive, extension, fix_checksum, header, member, outcomes, pax_record, tarfile_view
from click.testing import CliRunner

from tarindex import TarDataset, TarStream, build_index, verify_index
from tarindex.cli.main import main
from tarindex.errors import CorruptArchiveError, IndexFormatError, IndexNotFoundError, StaleIndexError
from tarindex.tar import BLOCK, iter_tar

GOOD = [member(b"a.txt", b"alpha" * 30), member(b"a.cls", b"1"), member(b"b.txt", b"beta"), member(b"b.cls", b"2")]
GOOD_MEMBERS = [("a.txt", b"alpha" * 30), ("a.cls", b"1"), ("b.txt", b"beta"), ("b.cls", b"2")]


def _is_error(result: Any) -> bool:
    return isinstance(result, tuple) and result[:1] == ("error",)


def _read(got: dict[tuple[str, str], Any], members: list[tuple[str, bytes]]) -> None:
    """Every way read ``members`` exactly, and the same samples and tables in C and Python."""
    for (which, way), result in got.items():
        assert not _is_error(result), (which, way, result)
        if way.startswith("members-"):
            assert result == members, (which, way)
    for way in {w for _, w in got}:
        assert got["c", way] == got["python", way], way


def _failed(got: dict[tuple[str, str], Any], path: Path, match: str, offset: int) -> None:
    """Every way raised a CorruptArchiveError naming the shard and ``offset``, the same in C and Python."""
    for (which, way), result in got.items():
        assert _is_error(result) and result[1] == "CorruptArchiveError", (which, way, result)
        assert result[2].startswith(f"{path}: ") and re.search(match, result[2]) and result[3] == offset, (which, way, result)
    for way in {w for _, w in got}:
        assert got["c", way] == got["python", way], way


# -- GNU sparse members (issue 31.5) --------------------------------------------------


def _sparse(name: bytes, pieces: int) -> bytes:
    """An old GNU sparse member of ``pieces`` one-byte pieces: 4 in the header, the rest in extension blocks."""
    return old_gnu_sparse(name, 2 * pieces, [(2 * i + 1, 1) for i in range(pieces)], b"S" * pieces)


@pytest.mark.parametrize("pieces", [3, 5, 25, 26, 200])  # no extension block, 1, 1 full, 2, 10
def test_old_gnu_sparse_member_and_its_extension_blocks_are_skipped(pieces: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The walk passes the extension blocks (21 entries each, the flag at byte 504 saying another follows)
    and the member's stored data, and goes on: before, the blocks were taken for its data and the walk
    ended (no samples, exit 0) or failed ("bad header checksum") on what followed."""
    sparse = _sparse(b"a.sparse", pieces)
    extension_blocks = max(0, -(-(pieces - 4) // 21))
    assert len(sparse) == BLOCK * (1 + extension_blocks) + -(-pieces // BLOCK) * BLOCK
    buf = archive(GOOD[0], sparse, *GOOD[1:])  # in the middle of sample 'a': the sample keeps its other members
    path = tmp_path / "sparse.tar"
    caplog.set_level(logging.WARNING, logger="tarindex.tar")
    got = outcomes(buf, path, ALL_WAYS)
    _read(got, GOOD_MEMBERS)
    assert [s for _, s in got["c", "samples-file"]] == [
        {"__key__": "a", "__url__": str(path), "txt": b"alpha" * 30, "cls": b"1"},
        {"__key__": "b", "__url__": str(path), "txt": b"beta", "cls": b"2"},
    ]
    warnings = [r.getMessage() for r in caplog.records if "sparse" in r.getMessage()]
    assert warnings == [f"{path}: skipping GNU sparse member 'a.sparse' at offset {len(GOOD[0])}"] * len(ALL_WAYS) * 2  # every way, C and Python
    with tarfile.open(path) as tf:  # tarfile reads the same structure: the sparse member, then the rest
        assert [(m.name, m.issparse()) for m in tf] == [("a.txt", False), ("a.sparse", True), ("a.cls", False), ("b.txt", False), ("b.cls", False)]


def test_gnu_tar_sparse_members_then_samples(tmp_path: Path) -> None:
    """GNU tar -S --format=oldgnu over files with more than 4 holes (an extension block each), in every way."""
    pieces = [(i * 65536, b"D" * 1000) for i in range(30)]
    buf = sparse_tar(tmp_path / "w", ["--format=oldgnu"], {"x.sparse": (30 * 65536, pieces), "y.sparse": (1 << 20, pieces[:6])}, [("c.txt", b"after")])
    assert buf[482] == 1  # the first member's header says extension blocks follow
    got = outcomes(archive(*GOOD, buf[: end_of_members(buf)]), tmp_path / "gnu.tar", ALL_WAYS)
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        tail = [(m.name, tf.extractfile(m).read()) for m in tf if m.isreg() and not m.issparse()]  # type: ignore[union-attr]
    _read(got, GOOD_MEMBERS + tail)


@pytest.mark.parametrize("version", ["0.0", "0.1", "1.0"])
def test_pax_sparse_members_are_skipped(version: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PAX sparse formats (GNU.sparse.* records; 1.0 keeps its map in the data): skipped by their stored
    size, with a warning naming the real name (GNU.sparse.name in 1.0), the walk goes on."""
    buf = sparse_tar(tmp_path / "w", ["--format=posix", f"--sparse-version={version}"], {"big.sparse": (1 << 22, [(0, b"x" * 5000), (3 << 20, b"y")])}, [("c.txt", b"after")])
    path = tmp_path / "pax.tar"
    caplog.set_level(logging.WARNING, logger="tarindex.tar")
    _read(outcomes(buf, path, ALL_WAYS), [("c.txt", b"after")])
    warnings = [r.getMessage() for r in caplog.records if "sparse" in r.getMessage()]
    assert warnings == [f"{path}: skipping GNU sparse member 'big.sparse' at offset 0"] * len(ALL_WAYS) * 2  # every way, C and Python


def test_sparse_extension_blocks_cut_short(tmp_path: Path) -> None:
    sparse = _sparse(b"a.sparse", 60)  # 3 extension blocks
    for cut, match in ((BLOCK * 2 + 100, "the input ends inside a GNU sparse member's extension blocks"), (BLOCK * 4 + 10, "member data needs 60 bytes")):
        path = tmp_path / f"cut{cut}.tar"
        _failed(outcomes(GOOD[0] + sparse[:cut], path, ALL_WAYS), path, match, len(GOOD[0]))


# -- headers without data (issue 31.15) -----------------------------------------------


def test_links_devices_directories_and_fifos_with_a_size_have_no_data(tmp_path: Path) -> None:
    """A hard link whose header carries its target's size (as some writers make it), and every other type
    without data, with a size field: their data is absent, as tarfile and Go's archive/tar read them."""
    parts = [GOOD[0]]
    for typ in b"123456":
        h = header(b"x%c.txt" % typ, 321, bytes([typ]))
        parts.append(bytes(h))  # no data follows
    parts.append(bytes(header(b"olddir/", 1000, b"\x00")))  # an old-style directory
    parts.append(extension(b"x", pax_record("size", "700")) + bytes(header(b"paxlink.txt", 0, b"1")))  # a PAX size on a link: no data either
    buf = archive(*parts, *GOOD[1:])
    assert tarfile_view(buf) == GOOD_MEMBERS
    _read(outcomes(buf, tmp_path / "links.tar", ALL_WAYS), GOOD_MEMBERS)
    from tarindex._speedups import scan_headers  # the C step takes them itself, to the end-of-archive marker

    got, after, _, _ = scan_headers(buf, 0, 0, True, 1000)
    assert [e[0] for e in got] == [m for m, _ in GOOD_MEMBERS] and buf[after : after + BLOCK] == bytes(BLOCK)


def test_a_huge_size_on_a_link_is_no_member(tmp_path: Path) -> None:
    """A link's size is not its data: a terabyte on a hard link's header allocates and skips nothing."""
    huge = header(b"link.txt", 0, b"1", size_field=b"\x80" + (1 << 40).to_bytes(11, "big"))  # base-256: 1 TiB
    buf = archive(GOOD[0], bytes(huge), bytes(header(b"x.txt", 0o77777777777, b"2")), *GOOD[1:])  # and the largest octal size
    _read(outcomes(buf, tmp_path / "huge-link.tar", ALL_WAYS), GOOD_MEMBERS)


# -- PAX records (issue 31.15) --------------------------------------------------------


def test_pax_record_with_an_empty_value_and_no_newline(tmp_path: Path) -> None:
    """``"4 x="``: the record's length ends it right after '=' (libarchive's test_read_pax_empty_val_no_nl):
    an empty value, as tarfile reads it; an empty path names the member ''."""
    buf = archive(extension(b"x", b"4 x=" + pax_record("comment", "after it")), member(b"a.txt", b"alpha" * 30), *GOOD[1:])
    assert tarfile_view(buf) == GOOD_MEMBERS
    _read(outcomes(buf, tmp_path / "empty-value.tar", ALL_WAYS), GOOD_MEMBERS)
    from tarindex._speedups import scan_headers  # the C step reads it too: no hand-over to the Python walker

    assert [e[0] for e in scan_headers(buf, 0, 0, True, 1000)[0]] == [m for m, _ in GOOD_MEMBERS]
    named = archive(extension(b"x", b"7 path="), member(b"gone.txt", b"x"), *GOOD)
    assert tarfile_view(named) == [("", b"x"), *GOOD_MEMBERS]
    _read(outcomes(named, tmp_path / "empty-path.tar", ALL_WAYS), [("", b"x"), *GOOD_MEMBERS])


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"7 size=", r"bad PAX size '' \(expected decimal digits\)"),  # an empty size: no size at all
        (b"8 path=a", "malformed PAX extended header record at byte 0"),  # a value without its newline
        (b"4 x=\n", "malformed PAX extended header record at byte 4"),  # a newline past the record's length: no record
    ],
)
def test_other_pax_records_without_their_newline_stay_errors(payload: bytes, match: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.tar"
    _failed(outcomes(archive(GOOD[0], extension(b"x", payload), *GOOD[1:]), path, ALL_WAYS), path, match, len(GOOD[0]))


# -- the end-of-archive marker (issue 31.15) --------------------------------------------


def test_missing_end_marker_is_an_error_naming_the_opt_in(tmp_path: Path) -> None:
    """Input that ends where a header would start: an error by default (a shard cut at a member boundary
    looks the same), naming ``allow_missing_end``."""
    buf = b"".join(GOOD)
    path = tmp_path / "noend.tar"
    _failed(outcomes(buf, path, ALL_WAYS), path, r"no end-of-archive marker \(to read an archive written without one: allow_missing_end=True, --allow-missing-end\)", len(buf))


def test_allow_missing_end_reads_it_every_way(tmp_path: Path) -> None:
    buf = b"".join(GOOD)
    got = outcomes(buf, tmp_path / "noend.tar", ALL_WAYS, allow_missing_end=True)
    _read(got, GOOD_MEMBERS)
    assert got["c", "samples-file"] == outcomes(archive(*GOOD), tmp_path / "noend.tar", ("samples-file",))["c", "samples-file"]


DANGLING = extension(b"x", pax_record("path", "p.txt"))


@pytest.mark.parametrize(
    ("tail", "match", "at"),
    [
        (DANGLING, r"truncated archive: no end-of-archive marker at offset", len(DANGLING)),  # an extension header, then nothing
        (b"\x01" * 300, r"truncated header \(300 of 512 bytes\)", 0),  # cut inside a header
        (bytes(header(b"c.txt", 5)), r"member data needs 5 bytes", 0),  # cut before a member's data
    ],
)
def test_allow_missing_end_still_refuses_what_is_cut(tail: bytes, match: str, at: int, tmp_path: Path) -> None:
    path = tmp_path / "cut.tar"
    head = b"".join(GOOD)
    _failed(outcomes(head + tail, path, ALL_WAYS, allow_missing_end=True), path, match, len(head) + at)


def test_allow_missing_end_keeps_an_empty_file_an_error(tmp_path: Path) -> None:
    path = tmp_path / "zero.tar"
    _failed(outcomes(b"", path, WAYS, allow_missing_end=True), path, "empty file, not a tar archive", 0)


def test_allow_missing_end_through_build_stream_cli_and_verify(impl: str, tmp_path: Path) -> None:
    """The opt-in at every entry point, for plain, zstd and gzip shards; ``verify --deep`` of the index
    it made passes (the shard's size and fingerprint were checked first)."""
    raw = b"".join(GOOD)
    plain = tmp_path / "a.tar"
    plain.write_bytes(raw)
    zst = tmp_path / "b.tar.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    gz = tmp_path / "c.tar.gz"
    co = zlib.compressobj(wbits=31)
    gz.write_bytes(co.compress(raw) + co.flush())
    shards = [plain, zst, gz]
    expected = [{"__key__": k, "txt": t, "cls": c} for k, t, c in (("a", b"alpha" * 30, b"1"), ("b", b"beta", b"2"))] * 3
    for shard in shards:
        with pytest.raises(CorruptArchiveError, match=rf"^{re.escape(str(shard))}: truncated archive: no end-of-archive marker .*allow_missing_end=True"):
            build_index([shard], index=tmp_path / "x.tarindex", workers=1)
        with pytest.raises(CorruptArchiveError, match="no end-of-archive marker"):
            list(TarStream([str(shard)]))
    index = build_index(shards, index=tmp_path / "x.tarindex", workers=1, allow_missing_end=True).path
    ds = TarDataset(index)
    plain_samples = [{k: v for k, v in ds[i].items() if k not in ("__url__", "__index__")} for i in range(len(ds))]
    assert plain_samples == expected
    assert [{k: v for k, v in s.items() if k != "__url__"} for s in TarStream([str(s) for s in shards], allow_missing_end=True)] == expected
    assert len(list(TarStream([f"pipe:cat {plain}"], allow_missing_end=True))) == 2
    assert verify_index(index, deep=True).deep
    runner = CliRunner()
    result = runner.invoke(main, ["build", str(plain), "-o", str(tmp_path / "cli.tarindex")])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1 and "--allow-missing-end" in result.stderr
    result = runner.invoke(main, ["build", str(plain), "-o", str(tmp_path / "cli.tarindex"), "--allow-missing-end", "-q"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["verify", "--deep", str(tmp_path / "cli.tarindex")])
    assert result.exit_code == 0, result.output


def test_verify_deep_still_sees_a_shard_cut_at_a_member_boundary(tmp_path: Path) -> None:
    """An index built from a whole shard, the shard then cut after its first sample: a change (size and
    fingerprint), not an archive read to where it stops."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(archive(*GOOD))
    index = build_index([shard], index=tmp_path / "x.tarindex", workers=1).path
    shard.write_bytes(b"".join(GOOD[:2]))
    with pytest.raises(StaleIndexError, match="shard changed since it was indexed"):
        verify_index(index, deep=True)


# -- one file: a shard or an index, by its content (issue 31.15) -------------------------


def test_an_empty_tar_is_a_shard_of_no_samples(impl: str, tmp_path: Path) -> None:
    """``tar cf x.tar --files-from /dev/null`` (10 KiB of zeros) is a valid archive, not an index that fails
    to open ("not an LMDB file"), for TarStream and the CLI alike."""
    empty = tmp_path / "x.tar"
    subprocess.run(["tar", "cf", str(empty), "--files-from", "/dev/null"], check=True)
    assert empty.read_bytes() == bytes(10240)
    assert list(TarStream(empty)) == []
    assert list(TarStream(str(empty))) == []
    index = build_index([empty], index=tmp_path / "x.tarindex", workers=1).path
    assert len(TarDataset(index)) == 0 and list(TarStream(index)) == []


@pytest.mark.parametrize(
    ("damage", "match"),
    [("checksum", r"bad header checksum \(expected \d+, got \d+\); not a tar archive or corrupt at offset 0"), ("cut", r"truncated header \(300 of 512 bytes\) at offset 0")],
)
def test_a_damaged_single_shard_is_named_as_a_tar(damage: str, match: str, impl: str, tmp_path: Path) -> None:
    """A v7 shard (no magic: told by its checksum) whose first header is damaged or cut is read as the
    shard it is, and the walk names the problem, where it was taken for an index ("not an LMDB file")."""
    first = header(b"a.txt", 150)
    first[257:265] = bytes(8)
    fix_checksum(first, 0)
    good = archive(bytes(first) + GOOD[0][BLOCK:], *GOOD[1:])
    bad = good[:10] + b"X" + good[11:] if damage == "checksum" else good[:300]
    shard = tmp_path / "x.tar"
    shard.write_bytes(bad)
    with pytest.raises(CorruptArchiveError, match=rf"^{re.escape(str(shard))}: {match}"):
        list(TarStream(shard))
    with pytest.raises(IndexNotFoundError, match="no index beside these shards"):  # TarDataset: a shard given, its index is missing
        TarDataset(shard)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("x.tar", b"", r"empty file, not a tar archive at offset 0"),
        ("x.tar", b"hello world\n", r"truncated header \(12 of 512 bytes\) at offset 0"),
        ("x.tar", bytes(range(256)) * 16, r"bad header checksum \(expected \d+, got .*\); not a tar archive or corrupt at offset 0"),
        ("x.tar.zst", b"hello\n", r"truncated header \(6 of 512 bytes\) at offset 0"),
    ],
)
def test_a_garbled_file_with_a_shard_name_is_named_as_a_tar(name: str, content: bytes, match: str, impl: str, tmp_path: Path) -> None:
    """An empty, text or garbage file named as a shard (``x.tar``) is not an LMDB file either: TarStream reads
    it as the shard its name says and the walk names the problem, where it was taken for an index ("not a
    tarindex index (not an LMDB file: 0 bytes)")."""
    shard = tmp_path / name
    shard.write_bytes(content)
    for given in (shard, str(shard)):
        with pytest.raises(CorruptArchiveError, match=rf"^{re.escape(str(shard))}: {match}"):
            list(TarStream(given))
    with pytest.raises(IndexNotFoundError, match="no index beside these shards"):
        TarDataset(shard)


def test_an_index_and_junk_stay_what_they_were(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    shard.write_bytes(archive(*GOOD))
    index = build_index([shard], index=tmp_path / "a.idx", workers=1).path  # an index by content, whatever its name
    assert [s["__key__"] for s in TarStream(index)] == ["a", "b"]
    junk = tmp_path / "notes.bin"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(IndexFormatError, match="not a tarindex index"):
        TarStream(junk)


# -- one-line CLI errors (issue 31.15) ---------------------------------------------------


def test_compress_a_directory_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["compress", str(tmp_path), str(tmp_path / "out.tar.zst")])
    assert result.exit_code == 1, result.output
    example = tmp_path / "*.tar"
    assert result.stderr.strip() == f"tarindex: error: {tmp_path}: is a directory, not a shard; name its shards, for example '{example}'"
    assert not list(tmp_path.iterdir())  # nothing written


def test_get_output_into_a_missing_directory(tmp_path: Path) -> None:
    """``get -o missing/dir/x`` is refused (a mistyped directory; exit 2, naming it and ``-p``), made with ``-p``
    (as build -o, merge -o and compress do); an output that cannot be written is one line, exit 1."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(archive(*GOOD))
    index = build_index([shard], index=tmp_path / "a.tarindex", workers=1).path
    out = tmp_path / "missing" / "dir" / "x"
    result = CliRunner().invoke(main, ["get", str(index), "a", "--ext", "txt", "-o", str(out)])
    assert result.exit_code == 2 and not (tmp_path / "missing").exists()
    assert f"Error: {out}: directory '{out.parent}' does not exist; create it, or pass -p (--parents) to have it made" in result.stderr
    result = CliRunner().invoke(main, ["get", str(index), "a", "--ext", "txt", "-o", str(out), "-p"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == b"alpha" * 30
    blocked = tmp_path / "a.tar" / "x"  # under a file: no directory can be made there
    result = CliRunner().invoke(main, ["get", str(index), "a", "--ext", "txt", "-o", str(blocked), "-p"])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"tarindex: error: {blocked}: cannot write (") and len(result.stderr.strip().splitlines()) == 1
    assert shard.read_bytes() == archive(*GOOD)


def test_iter_tar_reads_the_hard_link_archive_of_libarchive(tmp_path: Path) -> None:
    """libarchive's test_compat_tar_hardlink_1 shape: a v7 hard link with its target's size as the last header,
    no end-of-archive marker. The link's size is no data; the missing marker needs the opt-in."""
    data = b"x" * 321
    reg, link = header(b"READMf.txt", 321, b"\x00"), header(b"README.txt", 321, b"1")
    buf = bytes(reg) + data + bytes(BLOCK - 321) + bytes(link)
    assert [(e[0], e[4]) for e in iter_tar((buf,), "h.tar", with_data=True, allow_missing_end=True)] == [("READMf.txt", data)]
    with pytest.raises(CorruptArchiveError, match="no end-of-archive marker"):
        list(iter_tar((buf,), "h.tar"))
