"""Every read checks its members' tar headers against the index record (issue 31 item 3).

A shard rewritten in place (two samples of one size trading places, a same-length name or size fix, the
fingerprinted head and tail unchanged, the mtime changed or restored) and an index whose records were
edited and written with valid checksums are a ``StaleIndexError`` naming the shard and the offset, in the C
reader and the Python reader alike, never another sample's bytes. Unchanged shards of every writer read
exactly as ``tarfile`` extracts them. ``verify --deep`` names the first record that differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _servers import HTTPServer
from click.testing import CliRunner
from test_zstd import check_dataset, expected_samples

from conftest import LONG_DIR, PY_FORMATS, file_specs, gnu_tar, py_tar, wds_write, write_tree
from tarindex import StaleIndexError, TarDataset, build_index, verify_index
from tarindex._readcheck import shown_pair
from tarindex.cli.main import main
from tarindex.dataset import TarDataset as _Dataset
from tarindex.errors import shown
from tarindex.index.writer import IndexWriter
from tarindex.scan import scan_shard
from tarindex.shard_writer import compress_shard
from tarindex.tables import ShardTable

N = 120  # samples of 2.5 KiB: the middle lies outside the fingerprinted first and last 64 KiB
MIDDLE = 60
WRITERS = ["gnu-tar-gnu", "gnu-tar-pax", "gnu-tar-ustar", "tarfile", "webdataset", "long-gnu-tar", "long-tarfile-pax"]
"""GNU tar in its three formats, tarfile (GNU format), webdataset's TarWriter (a PAX header per member), and
keys under a 121-character directory (GNU ``L`` headers; PAX ``path`` records)."""


def _caption(i: int) -> bytes:
    return (b"caption of sample %06d. " % i).ljust(700, b"x")  # every sample the same size


def _specs(n: int, prefix: str = "") -> list[tuple[str, bytes]]:
    specs = []
    for i in range(n):
        specs += [(f"{prefix}{i:06d}.cls", b"%d" % (i % 10)), (f"{prefix}{i:06d}.txt", _caption(i))]
    return specs


def _shard(writer: str, root: Path, n: int = N) -> Path:
    """A shard of ``n`` two-member samples of one size, made by ``writer``."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{writer}.tar"
    prefix = LONG_DIR + "/" if writer.startswith("long-") else ""
    specs = _specs(n, prefix)
    if "gnu-tar" in writer:
        src = root / "src"
        write_tree(src, specs)
        fmt = {"gnu-tar-pax": "pax", "gnu-tar-ustar": "ustar"}.get(writer, "gnu")
        return gnu_tar(src, out, fmt, [name for name, _ in specs])
    if writer == "webdataset":
        samples = [{"__key__": f"{i:06d}", "cls": b"%d" % (i % 10), "txt": _caption(i)} for i in range(n)]
        return wds_write(out, samples)
    fmt = tarfile.PAX_FORMAT if writer == "long-tarfile-pax" else tarfile.GNU_FORMAT
    with tarfile.open(out, "w", format=fmt) as tf:
        for name, data in specs:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    return out


def _built(shard: Path) -> TarDataset:
    return TarDataset(build_index([str(shard)], index=shard.with_suffix(".tarindex"), workers=1).path, verify="fingerprint")


def _members(shard: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(shard) as tf:
        return {m.name: m for m in tf if m.isreg()}


def _rechecksum(data: bytearray, header: int) -> None:
    """Write the header block at ``header`` its checksum again (as a tool editing a tar in place does)."""
    block = data[header : header + 512]
    total = sum(block[:148]) + 8 * 32 + sum(block[156:])
    data[header + 148 : header + 156] = b"%06o\x00 " % total


def _in_place(shard: Path, edit: Callable[[bytearray], None], restore_mtime: bool) -> None:
    """Rewrite ``shard``'s bytes in place (same size), its mtime changed, or restored as it was."""
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    edit(data)
    assert len(data) == st.st_size
    with open(shard, "r+b") as f:
        f.write(data)
    if restore_mtime:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _swap(ds: TarDataset, a: int, b: int) -> Callable[[bytearray], None]:
    """An edit that makes samples ``a`` and ``b`` (of one size) trade places."""
    _, off_a, size, _, _ = ds.index.record(a)
    _, off_b, size_b, _, _ = ds.index.record(b)
    assert size == size_b

    def edit(data: bytearray) -> None:
        data[off_a : off_a + size], data[off_b : off_b + size] = data[off_b : off_b + size], data[off_a : off_a + size]

    return edit


def _no_other_bytes(ds: TarDataset, i: int, shard: Path, offset: int) -> StaleIndexError:
    """``ds[i]`` (and ``ds.read(i)``) raise ``StaleIndexError`` naming the shard and the offset; the error."""
    for read in (ds.__getitem__, ds.read):
        with pytest.raises(StaleIndexError, match=rf"^{re.escape(str(shard))}: shard changed since it was indexed \(.*at offset {offset}\b") as info:
            read(i)
        assert info.value.path == str(shard)
    return info.value


class _Fallbacks:
    """Counts the reads the C reader hands to the Python path (a wrapper: the reads themselves are the real ones)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = _Dataset._read_py

        def counted(ds: TarDataset, i: int) -> dict[str, object]:
            self.count += 1
            return real(ds, i)

        monkeypatch.setattr(_Dataset, "_read_py", counted)


# -- unchanged shards read as tarfile extracts them -------------------------------------------------------
@pytest.mark.parametrize("writer", WRITERS)
def test_every_writer_reads_as_tarfile_extracts(writer: str, impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard = _shard(writer, tmp_path / "d", n=40)
    fallbacks = _Fallbacks(monkeypatch)
    ds = _built(shard)
    oracle = expected_samples(shard)
    assert len(ds) == len(oracle) == 40
    check_dataset(ds, oracle)
    fallbacks.count = 0
    assert check_dataset(ds, oracle, list(range(39, -1, -1))) == 40
    if impl == "c":  # the C reader's own header check takes every writer's headers (no read handed to Python)
        assert fallbacks.count == 0


def _awkward_shards(tmp_path: Path) -> list[Path]:
    """The conftest shards: directories and links, unicode and long names, a 70 KB member (read straight
    into its bytes), an empty member, several dots; by GNU tar (3 formats), tarfile (3 formats), webdataset."""
    shards = []
    for fmt in ("gnu", "pax", "ustar"):
        specs = file_specs(fmt)
        src = tmp_path / f"src-{fmt}"
        write_tree(src, specs)
        names: list[str] = []
        for name, _ in specs:
            parent = name.rsplit("/", 1)[0] if "/" in name else None
            if parent and parent not in names:
                names.append(parent)
            names.append(name)
        shards.append(gnu_tar(src, tmp_path / f"gnu-{fmt}.tar", fmt, names))
        shards.append(py_tar(tmp_path / f"py-{fmt}.tar", specs, PY_FORMATS[fmt]))
    samples = [{"__key__": f"s{i:04d}", "txt": f"text {i}", "cls": i % 5, "seg.bin": os.urandom(i * 3700)} for i in range(20)]
    shards.append(wds_write(tmp_path / "wds.tar", samples))
    return shards


def test_awkward_shards_of_every_writer_read_as_tarfile_extracts(impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fallbacks = _Fallbacks(monkeypatch)
    for shard in _awkward_shards(tmp_path):
        ds = TarDataset(build_index([str(shard)], index=shard.with_suffix(".tarindex"), workers=1).path)
        oracle = expected_samples(shard)
        assert check_dataset(ds, oracle) == len(oracle) == len(ds), shard
        fallbacks.count = 0
        check_dataset(ds, oracle)
        if impl == "c":
            assert fallbacks.count == 0, shard


def test_members_between_a_samples_members_read_as_tarfile_extracts(impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory, a symbolic link and a file without a key between two members of one sample lie inside its
    byte range: the check walks past them as the build did (the C reader hands the file without a key to the
    Python check, which takes it as the build's grouping does)."""
    shard = tmp_path / "between.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, kind, data in [
            ("a.txt", tarfile.REGTYPE, b"first"),
            ("somedir", tarfile.DIRTYPE, b""),
            ("a.cls", tarfile.REGTYPE, b"1"),
            ("link", tarfile.SYMTYPE, b""),
            ("README", tarfile.REGTYPE, b"no key: not part of any sample" * 20),
            ("a.json", tarfile.REGTYPE, b"{}"),
            ("b.txt", tarfile.REGTYPE, b"second"),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind == tarfile.SYMTYPE:
                info.linkname = "a.txt"
            tf.addfile(info, io.BytesIO(data) if data else None)
    fallbacks = _Fallbacks(monkeypatch)
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == 2
    assert ds[0]["json"] == b"{}" and ds.index.record(0)[3][2][1] > 2048  # the range holds the members between
    fallbacks.count = 0
    ds[0]
    if impl == "c":
        assert fallbacks.count == 1  # README: judged by the Python check


def _edge_shard(root: Path, name_len: int) -> Path:
    """A tarfile shard of 12 samples whose member names are ``name_len`` bytes long (a key, ".txt" / ".cls")."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"names-{name_len}.tar"
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(12):
            key = "k" * (name_len - 10) + f"{i:06d}"
            for ext, data in (("cls", b"%d" % i), ("txt", _caption(i))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000
                tf.addfile(info, io.BytesIO(data))
    return out


def _edits(shard: Path) -> list[Callable[[bytearray], None]]:
    """Edits of a PAX-per-member shard that the common-shape check must see: a checksum one off in a member's own
    header and in its PAX header, a member renamed to another key of the same length, a size field changed and
    a name made a byte longer (their checksums written again), a PAX record whose key ends in "path" (the records must be parsed: the
    C header step reads it, as the Python check would)."""
    members = _members(shard)
    own = {i: members[f"{i:06d}.txt"].offset_data - 512 for i in range(12)}
    pax = {i: members[f"{i:06d}.txt"].offset for i in range(12)}

    def checksum(at: int) -> Callable[[bytearray], None]:
        def edit(data: bytearray) -> None:
            data[at + 148 : at + 156] = b"%06o\x00 " % (int(data[at + 148 : at + 154], 8) + 1)

        return edit

    def rename(data: bytearray) -> None:
        data[own[5] : own[5] + 6] = b"000099"
        _rechecksum(data, own[5])

    def resize(data: bytearray) -> None:
        data[own[6] + 124 : own[6] + 136] = b"%011o\x00" % (len(_caption(6)) - 1)
        _rechecksum(data, own[6])

    def lengthen(data: bytearray) -> None:
        data[own[8] + len(b"000008.txt")] = ord("x")  # the NUL after the name: "000008.txtx" now
        _rechecksum(data, own[8])

    def pax_path(data: bytearray) -> None:
        records = data.find(b"mtime=", pax[7] + 512, pax[7] + 1024)
        assert records > 0
        data[records : records + 5] = b"xpath"  # "mtime=" becomes "xpath=": a record the C step must parse

    return [checksum(own[3]), checksum(pax[4]), rename, resize, lengthen, pax_path]


def _bodies(impl: str) -> list[str | None]:
    """The C check's bodies this CPU has (``_speedups._plain_body``), or ``[None]`` in the Python lane."""
    if impl != "c":
        return [None]
    from tarindex._native import SPEEDUPS

    assert SPEEDUPS is not None
    bodies: list[str | None] = [body for body in ("avx512", "avx2", "base") if SPEEDUPS._plain_body(body)]
    SPEEDUPS._plain_body(None)
    return bodies


@contextlib.contextmanager
def _body(name: str | None) -> Iterator[None]:
    """The C check's body ``name`` in use (None: the CPU's best), the CPU's best again after."""
    from tarindex._native import SPEEDUPS

    if SPEEDUPS is not None and name is not None:
        assert SPEEDUPS._plain_body(name)
    try:
        yield
    finally:
        if SPEEDUPS is not None:
            SPEEDUPS._plain_body(None)


def _decisions(ds: TarDataset, handed: list[int]) -> list[tuple[object, ...]]:
    """Each sample's read: the indexes handed to the Python check by it, and what it gave (the bytes or the error)."""
    out: list[tuple[object, ...]] = []
    for i in range(len(ds)):
        del handed[:]
        try:
            got: object = sorted(ds[i].items())
        except StaleIndexError as error:
            got = str(error)
        out.append((tuple(handed), got))
    return out


def test_every_body_of_the_c_check_decides_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C check's bodies for the common shape (_tarcore.c: AVX-512BW, AVX2, SSE2; the CPU's best is picked at
    the first read) take and leave the same reads, and each read gives the same bytes or error: shards of every
    writer, names whose bytes and NUL fill 63 to 65 bytes (the AVX-512 compare takes up to 64) or the whole
    100-byte field, and edits of webdataset's and GNU tar's PAX-per-member shards."""
    from conftest import require_c_extension

    require_c_extension()
    bodies = _bodies("c")
    handed: list[int] = []
    real = _Dataset._read_py

    def recorded(ds: TarDataset, i: int) -> dict[str, object]:
        handed.append(i)
        return real(ds, i)

    monkeypatch.setattr(_Dataset, "_read_py", recorded)
    shards = [_shard(writer, tmp_path / writer, n=12) for writer in WRITERS]
    shards += [_edge_shard(tmp_path / "edges", n) for n in (62, 63, 64, 65, 99, 100)]
    indexes = [_built(shard).index_path for shard in shards]
    for writer in ("webdataset", "gnu-tar-pax"):
        for k, edit in enumerate(_edits(_shard(writer, tmp_path / f"{writer}-edits", n=12))):
            shard = _shard(writer, tmp_path / f"{writer}-edit{k}", n=12)
            indexes.append(_built(shard).index_path)
            _in_place(shard, edit, restore_mtime=True)
    decided = {}
    for body in bodies:
        with _body(body):
            decided[body] = [_decisions(TarDataset(index), handed) for index in indexes]
    first = decided[bodies[0]]
    for body in bodies[1:]:
        assert decided[body] == first, body
    handed = [sum(bool(h) for h, _ in reads) for reads in first]
    stale = [sum(isinstance(got, str) for _, got in reads) for reads in first]
    plain = len(WRITERS) + 6
    assert handed[:plain] == stale[:plain] == [0] * plain  # unchanged shards: every read the C check's own
    assert handed[plain:] == stale[plain:] == [1, 1, 1, 1, 1, 0] * 2  # each edit but the record: one read stale


# -- a shard rewritten in place --------------------------------------------------------------------------
@pytest.mark.parametrize("restore_mtime", [False, True], ids=["mtime-changed", "mtime-restored"])
@pytest.mark.parametrize("writer", WRITERS)
def test_swapped_samples_are_stale_never_other_bytes(writer: str, restore_mtime: bool, impl: str, tmp_path: Path) -> None:
    shard = _shard(writer, tmp_path / "d")
    ds = _built(shard)
    key = ds[MIDDLE]["__key__"]
    got, want = shown_pair(key[:-2] + "61", key)  # keys under a long directory: shown from where they differ
    offset, after = ds.index.record(MIDDLE)[1], ds.index.record(MIDDLE + 1)[1]
    _in_place(shard, _swap(ds, MIDDLE, MIDDLE + 1), restore_mtime)
    for verify in ("stat", "fingerprint"):  # the identity rule accepts the shard: the head and tail are the same
        ds = TarDataset(ds.index_path, verify=verify)
        assert ds[0]["txt"] == _caption(0) and ds[N - 1]["txt"] == _caption(N - 1)
        error = _no_other_bytes(ds, MIDDLE, shard, offset)
        assert f"the shard has key {got} there, the index {want}" in str(error)
        _no_other_bytes(ds, MIDDLE + 1, shard, after)
    differs = f"sample {MIDDLE} ({shown(key)}) at offset {offset}: key {got} in the shard, {want} in the index"
    with pytest.raises(StaleIndexError, match=rf"{re.escape(str(shard))}: .*a rescan differs from the index: {re.escape(differs)}"):
        verify_index(ds.index_path, deep=True)


def _rename(shard: Path, old: str, new: str) -> Callable[[bytearray], None]:
    """An edit that renames member ``old`` to ``new`` (same length) wherever its name is written: its header's
    name field or a PAX ``path`` / GNU long-name record; the headers' checksums written again."""
    assert len(old) == len(new)
    info = _members(shard)[old]

    def edit(data: bytearray) -> None:
        raw_old, raw_new = old.encode(), new.encode()
        tail = raw_old[-90:]  # the ustar name field holds the tail of a name its prefix does not
        at = data.find(tail, info.offset, info.offset_data)
        while at >= 0:
            data[at : at + len(tail)] = raw_new[-90:]
            at = data.find(tail, at + 1, info.offset_data)
        for header in range(info.offset, info.offset_data, 512):
            if data[header + 257 : header + 262] == b"ustar":
                _rechecksum(data, header)

    return edit


@pytest.mark.parametrize("writer", ["gnu-tar-gnu", "webdataset", "long-gnu-tar", "long-tarfile-pax"])
@pytest.mark.parametrize("change", ["key", "extension"])
def test_same_length_rename_is_stale(writer: str, change: str, impl: str, tmp_path: Path) -> None:
    shard = _shard(writer, tmp_path / "d")
    ds = _built(shard)
    record = ds.index.record(MIDDLE)
    old = next(name for name in _members(shard) if name.endswith(f"{MIDDLE:06d}.txt"))
    new = old.replace(f"{MIDDLE:06d}.txt", f"{MIDDLE + 9:06d}.txt" if change == "key" else f"{MIDDLE:06d}.log")
    _in_place(shard, _rename(shard, old, new), restore_mtime=True)
    assert _members(shard)[new].size == 700  # tarfile reads the edited shard
    ds = TarDataset(ds.index_path)
    error = _no_other_bytes(ds, MIDDLE, shard, record[1])
    assert "member 2: the shard has " in str(error) or "the shard has key" in str(error)
    with pytest.raises(StaleIndexError, match=rf"a rescan differs from the index: sample {MIDDLE} "):
        verify_index(ds.index_path, deep=True)


def test_a_name_differing_only_in_case_of_its_extension_is_the_same_member(impl: str, tmp_path: Path) -> None:
    """The index lower-cases extensions: ``000060.TXT`` is the member ``000060.txt`` was, by webdataset's rules."""
    shard = _shard("gnu-tar-gnu", tmp_path / "d")
    ds = _built(shard)
    _in_place(shard, _rename(shard, f"{MIDDLE:06d}.txt", f"{MIDDLE:06d}.TXT"), restore_mtime=True)
    ds = TarDataset(ds.index_path)
    assert ds[MIDDLE]["txt"] == _caption(MIDDLE)
    verify_index(ds.index_path, deep=True)


def test_same_block_size_change_is_stale(impl: str, tmp_path: Path) -> None:
    """A caption made shorter within its blocks (the header's size field and checksum written again): the
    index's size would hand out stale bytes after the new end."""
    shard = _shard("tarfile", tmp_path / "d")
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]
    info = _members(shard)[f"{MIDDLE:06d}.txt"]

    def edit(data: bytearray) -> None:
        data[info.offset + 124 : info.offset + 136] = b"%011o\x00" % 650
        data[info.offset_data + 650 : info.offset_data + 700] = bytes(50)
        _rechecksum(data, info.offset)

    _in_place(shard, edit, restore_mtime=True)
    assert _members(shard)[f"{MIDDLE:06d}.txt"].size == 650
    ds = TarDataset(ds.index_path)
    error = _no_other_bytes(ds, MIDDLE, shard, offset)
    assert f"member 2: the shard has '{MIDDLE:06d}.txt' of 650 bytes at offset {info.offset_data}, the index '{MIDDLE:06d}.txt' of 700 bytes" in str(error)
    with pytest.raises(StaleIndexError, match=rf"sample {MIDDLE} \('{MIDDLE:06d}'\) at offset {offset}: member 2: 'txt' of 650 bytes at \+1536 in the shard, 'txt' of 700 bytes at \+1536 in the index"):
        verify_index(ds.index_path, deep=True)


def _pax_shard(root: Path, records: Callable[[str, int], dict[str, str]]) -> Path:
    """A shard of ``N`` samples written by tarfile in PAX format, each member's PAX header holding ``records(name,
    size)`` beside its ustar header (which holds the same name and size)."""
    root.mkdir(parents=True, exist_ok=True)
    shard = root / "pax.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in _specs(N):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            info.pax_headers = records(name, len(data))
            tf.addfile(info, io.BytesIO(data))
    return shard


def _pax_edit(shard: Path, name: str, old: bytes, new: bytes) -> Callable[[bytearray], None]:
    """An edit of member ``name``'s PAX records only (same length; PAX data has no checksum): the ustar header keeps
    saying what the index says."""
    assert len(old) == len(new)
    info = _members(shard)[name]

    def edit(data: bytearray) -> None:
        at = data.find(old, info.offset, info.offset_data)
        assert at > info.offset + 512  # in the PAX records, after the PAX header
        data[at : at + len(old)] = new

    return edit


@pytest.mark.parametrize("record", ["path", "size"])
def test_a_pax_record_that_renames_or_resizes_is_read_not_skipped(record: str, impl: str, tmp_path: Path) -> None:
    """A PAX header of times only is passed over without parsing its records (webdataset's TarWriter, GNU tar
    --format=posix); one holding ``path=`` or ``size=`` is read: edited there, with the ustar header unchanged,
    the member is renamed or resized as tarfile reads it, and the read is stale."""
    shard = _pax_shard(tmp_path / "d", lambda name, size: {"mtime": "1700000000.25", record: name if record == "path" else str(size)})
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == N
    offset = ds.index.record(MIDDLE)[1]
    name = f"{MIDDLE:06d}.txt"
    if record == "path":
        edit, now = _pax_edit(shard, name, b"path=" + name.encode(), b"path=" + f"{MIDDLE + 900:06d}.txt".encode()), f"{MIDDLE + 900:06d}.txt"
    else:
        edit, now = _pax_edit(shard, name, b"size=700", b"size=699"), name
    _in_place(shard, edit, restore_mtime=True)
    members = _members(shard)
    assert members[now].size == (700 if record == "path" else 699)  # what tarfile reads now
    ds = TarDataset(ds.index_path)
    error = _no_other_bytes(ds, MIDDLE, shard, offset)
    moved = "member 2: the shard has '000060.txt' of 699 bytes" if record == "size" else "member 2: the shard has no member"  # 000960.txt: another key
    assert moved in str(error)
    assert ds[MIDDLE - 1]["txt"] == _caption(MIDDLE - 1)  # the samples beside it read as before


def test_other_spellings_of_valid_fields_read_as_before(impl: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checksum of seven digits and a NUL, a size with leading blanks: what GNU tar reads is the same header
    (the C reader's field compare leaves them to its header step, which takes them too)."""
    shard = _shard("tarfile", tmp_path / "d")
    fallbacks = _Fallbacks(monkeypatch)
    ds = _built(shard)
    info = _members(shard)[f"{MIDDLE:06d}.txt"]

    def edit(data: bytearray) -> None:
        data[info.offset + 124 : info.offset + 136] = b"   %08o " % 700
        total = sum(data[info.offset : info.offset + 148]) + 8 * 32 + sum(data[info.offset + 156 : info.offset + 512])
        data[info.offset + 148 : info.offset + 156] = b"%07o\x00" % total

    _in_place(shard, edit, restore_mtime=True)
    assert _members(shard)[f"{MIDDLE:06d}.txt"].size == 700
    ds = TarDataset(ds.index_path)
    fallbacks.count = 0
    assert ds[MIDDLE]["txt"] == _caption(MIDDLE)
    if impl == "c":
        assert fallbacks.count == 0  # the shard's first read included: the C reader's open resolves its name


def test_a_damaged_header_is_stale(impl: str, tmp_path: Path) -> None:
    """One flipped bit in a member's header (its checksum no longer holds): the read names the header's offset."""
    shard = _shard("tarfile", tmp_path / "d")
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]

    def edit(data: bytearray) -> None:
        data[offset + 1024 + 100] ^= 1  # the mode field of the second member's header (after the first's data block)

    _in_place(shard, edit, restore_mtime=True)
    error = _no_other_bytes(TarDataset(ds.index_path), MIDDLE, shard, offset)
    assert "bad header checksum" in str(error) and f"at offset {offset + 1024}" in str(error)


@pytest.mark.parametrize(("writer", "header"), [("tarfile", "own"), ("webdataset", "own"), ("webdataset", "pax")])
@pytest.mark.parametrize("delta", [1, -1])
def test_a_checksum_off_by_one_is_stale(writer: str, header: str, delta: int, impl: str, tmp_path: Path) -> None:
    """A checksum field in the common spelling (six octal digits, a NUL, a space) one off the header's sum, in a
    member's own header or in the PAX header before it (webdataset's): the fast paths compare the digits' value
    with the sum."""
    shard = _shard(writer, tmp_path / "d")
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]
    info = _members(shard)[f"{MIDDLE:06d}.txt"]
    at = info.offset_data - 512 if header == "own" else info.offset  # tarfile's offset: the member's first header

    def edit(data: bytearray) -> None:
        assert data[at + 156 : at + 157] == (b"0" if header == "own" else b"x")
        field = bytes(data[at + 148 : at + 156])
        assert re.fullmatch(rb"[0-7]{6}\x00 ", field)
        data[at + 148 : at + 156] = b"%06o\x00 " % (int(field[:6], 8) + delta)

    _in_place(shard, edit, restore_mtime=True)
    error = _no_other_bytes(TarDataset(ds.index_path), MIDDLE, shard, offset)
    assert "bad header checksum" in str(error) and f"at offset {at}" in str(error)


def test_a_header_summing_to_its_checksum_plus_65521_is_stale(impl: str, tmp_path: Path) -> None:
    """Bytes of 128 and over added to a member's header until its sum is its checksum + 65521 (what adler32's low
    half, taken mod 65521, cannot tell apart): the checksum does not hold, and the read says so."""
    shard = _shard("tarfile", tmp_path / "d")
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]
    at = _members(shard)[f"{MIDDLE:06d}.txt"].offset

    def edit(data: bytearray) -> None:
        more = 65521
        for k in [*range(157, 257), *range(329, 345), *range(346, 512)]:  # link name, device numbers, the rest (no ustar prefix)
            step = min(255 - data[at + k], more)
            data[at + k] += step
            more -= step
        assert more == 0 and not bytes(data[at : at + 512]).isascii()

    _in_place(shard, edit, restore_mtime=True)
    error = _no_other_bytes(TarDataset(ds.index_path), MIDDLE, shard, offset)
    assert "bad header checksum" in str(error) and f"at offset {at}" in str(error)


def test_a_pax_header_one_byte_off_a_valid_one_read_before_is_stale(impl: str, tmp_path: Path) -> None:
    """PAX headers byte for byte the same (tarfile's, records of one length), one of them changed in a byte its
    checksum field does not follow, read after one of the others: the Python check, which sums a PAX header the
    same as one it found valid no more, sums this one, and the read says its checksum does not hold."""
    shard = tmp_path / "d" / "pax.tar"
    shard.parent.mkdir(parents=True)
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in _specs(N):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.pax_headers = len(data), 1_700_000_000, {"comment": "one length"}
            tf.addfile(info, io.BytesIO(data))
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]
    members = _members(shard)
    at, before = members[f"{MIDDLE:06d}.txt"].offset, members[f"{MIDDLE - 1:06d}.txt"].offset

    def edit(data: bytearray) -> None:
        assert data[at + 156] == ord("x") and data[at : at + 512] == data[before : before + 512]
        assert data[at + 4] == ord("@")  # "././@PaxHeader"
        data[at + 4] = ord("A")

    _in_place(shard, edit, restore_mtime=True)
    fresh = TarDataset(ds.index_path)
    assert fresh[MIDDLE - 1]["txt"] == _caption(MIDDLE - 1)  # its PAX header, unchanged, found valid first
    error = _no_other_bytes(fresh, MIDDLE, shard, offset)
    assert "bad header checksum" in str(error) and f"at offset {at}" in str(error)


@pytest.mark.parametrize("layout", ["decoy", "alone", "first"])
@pytest.mark.parametrize("pad", [0, 3, 9, 14, 15, 16, 17, 18, 19, 40, 44, 45, 46, 47, 48, 49, 50, 51, 60, 61, 96, 108, 109, 110, 111, 112, 113, 114, 115, 116])
def test_a_path_record_anywhere_in_the_pax_records_is_read(pad: int, layout: str, impl: str, tmp_path: Path) -> None:
    """``path=`` after a record of ``pad`` bytes of value (the key and its ``=`` on either side of each 16-, 32- and
    64-byte step of the C search: SSE2, AVX2, AVX-512BW, in records of up to 128 bytes and longer ones), alone or
    after a decoy inside the other record's value, or first, before that record: the records are parsed, the
    member reads as tarfile extracts it, and the path changed there (the ustar header as before) is stale, with
    every body of the C check."""
    comment = "c" * pad + (" path=x ." if layout == "decoy" else "")
    if layout == "first":
        shard = _pax_shard(tmp_path / "d", lambda name, size: {"path": name, "comment": comment})
    else:
        shard = _pax_shard(tmp_path / "d", lambda name, size: {"comment": comment, "path": name})
    ds = _built(shard)
    for body in _bodies(impl):
        with _body(body):
            assert check_dataset(TarDataset(ds.index_path), expected_samples(shard)) == N
    offset = ds.index.record(MIDDLE)[1]
    name = f"{MIDDLE:06d}.txt"
    old = b" path=" + name.encode() + b"\n"  # the record's, not the comment's
    _in_place(shard, _pax_edit(shard, name, old, b" path=" + f"{MIDDLE + 900:06d}.txt\n".encode()), restore_mtime=True)
    assert _members(shard)[f"{MIDDLE + 900:06d}.txt"].size == 700
    for body in _bodies(impl):
        with _body(body):
            ds = TarDataset(ds.index_path)
            assert "member 2: the shard has no member" in str(_no_other_bytes(ds, MIDDLE, shard, offset))
            assert ds[MIDDLE + 1]["txt"] == _caption(MIDDLE + 1)


@pytest.mark.parametrize("pad", [0, 1, 15, 16, 17, 47, 48, 49, 50, 51, 52, 53, 63, 64, 65, 111, 112, 113, 114, 115])
def test_a_gnu_sparse_record_anywhere_in_the_pax_records_is_read(pad: int, impl: str, tmp_path: Path) -> None:
    """A record's key turned into ``GNU.sparse.name`` (a sparse member, which tarindex skips, renamed as tarfile
    reads it) after a record of ``pad`` bytes of value: its ``G`` and ``N`` on either side of each 16-, 32- and
    64-byte step of the C search. The records are parsed and the read is stale, with every body of the C check."""
    shard = _pax_shard(tmp_path / "d", lambda name, size: {"comment": "c" * pad, "XNU.sparse.name": name})
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == N
    offset = ds.index.record(MIDDLE)[1]
    name = f"{MIDDLE:06d}.txt"
    old = b"XNU.sparse.name=" + name.encode()
    _in_place(shard, _pax_edit(shard, name, old, b"GNU.sparse.name=" + f"{MIDDLE + 900:06d}.txt".encode()), restore_mtime=True)
    assert _members(shard)[f"{MIDDLE + 900:06d}.txt"].size == 700  # what tarfile reads now
    for body in _bodies(impl):
        with _body(body):
            ds = TarDataset(ds.index_path)
            assert "member 2: the shard has no member" in str(_no_other_bytes(ds, MIDDLE, shard, offset))
            assert ds[MIDDLE + 1]["txt"] == _caption(MIDDLE + 1)


@pytest.mark.parametrize("pad", [480, 2000])
def test_a_path_record_after_the_first_block_of_pax_records_is_read(pad: int, impl: str, tmp_path: Path) -> None:
    """PAX records of more than one block (a long comment, then ``path=`` near or past the first block's end):
    the member reads as tarfile extracts it, and the path changed there (the ustar header as before) is stale."""
    shard = _pax_shard(tmp_path / "d", lambda name, size: {"comment": "c" * pad, "path": name})
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == N
    offset = ds.index.record(MIDDLE)[1]
    name = f"{MIDDLE:06d}.txt"
    old = b" path=" + name.encode() + b"\n"
    _in_place(shard, _pax_edit(shard, name, old, b" path=" + f"{MIDDLE + 900:06d}.txt\n".encode()), restore_mtime=True)
    assert _members(shard)[f"{MIDDLE + 900:06d}.txt"].size == 700
    ds = TarDataset(ds.index_path)
    assert "member 2: the shard has no member" in str(_no_other_bytes(ds, MIDDLE, shard, offset))


@pytest.mark.parametrize("records", [{"comment": "path= size= GNU.sparse"}, {"comment": "x" * 60 + "GNU.sparse"}, {"GNU.sparseness": "1"}])
def test_pax_records_that_only_look_like_a_rename_read_as_tarfile_extracts(records: dict[str, str], impl: str, tmp_path: Path) -> None:
    """Bytes that look like ``path=``, ``size=`` or ``GNU.sparse`` in a record that sets neither: the records are
    parsed (the search is conservative) and every sample reads as tarfile extracts it."""
    shard = _pax_shard(tmp_path / "d", lambda name, size: dict(records))
    assert check_dataset(_built(shard), expected_samples(shard)) == N


def test_a_long_extension_reads_and_its_rename_is_stale(impl: str, tmp_path: Path) -> None:
    """An extension longer than the C reader keeps per extension (30 bytes) is compared by name: it reads as
    tarfile extracts it, and its last letter changed (the checksum written again) is stale."""
    ext = "annotation" * 4
    shard = tmp_path / "long-ext.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in _specs(N):
            info = tarfile.TarInfo(name.replace(".txt", f".{ext}"))
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == N
    offset = ds.index.record(MIDDLE)[1]
    _in_place(shard, _rename(shard, f"{MIDDLE:06d}.{ext}", f"{MIDDLE:06d}.{ext[:-1]}x"), restore_mtime=True)
    _no_other_bytes(TarDataset(ds.index_path), MIDDLE, shard, offset)


def test_large_samples_read_into_their_members_are_checked(impl: str, tmp_path: Path) -> None:
    """Samples over 64 KiB are read straight into their members' bytes (the headers into a buffer of their own)."""
    shard = tmp_path / "big.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(8):
            for name, data in [(f"{i:03d}.jpg", bytes([i]) * 90_000), (f"{i:03d}.cls", b"%d" % i)]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    ds = _built(shard)
    assert check_dataset(ds, expected_samples(shard)) == 8
    offset = ds.index.record(4)[1]
    _in_place(shard, _swap(ds, 4, 5), restore_mtime=True)
    ds = TarDataset(ds.index_path)
    _no_other_bytes(ds, 4, shard, offset)
    assert ds[3]["jpg"] == bytes([3]) * 90_000 and ds[6]["jpg"] == bytes([6]) * 90_000


def test_on_error_skip_raises_for_a_stale_sample(impl: str, tmp_path: Path) -> None:
    """``on_error="skip"`` skips damaged samples; a sample that is not the one indexed always raises."""
    shard = _shard("webdataset", tmp_path / "d")
    ds = _built(shard)
    _in_place(shard, _swap(ds, MIDDLE, MIDDLE + 1), restore_mtime=True)
    ds = TarDataset(ds.index_path, on_error="skip")
    assert ds[MIDDLE - 1]["txt"] == _caption(MIDDLE - 1)
    with pytest.raises(StaleIndexError, match=f"at offset {ds.index.record(MIDDLE)[1]}"):
        ds[MIDDLE]


# -- an index edited with valid checksums -----------------------------------------------------------------
def _edited_index(shard: Path, out: Path, edit: Callable[[ShardTable], None]) -> TarDataset:
    """An index of ``shard`` whose records ``edit`` changed before writing (every checksum valid)."""
    info, table = scan_shard(str(shard))
    edit(table)
    with IndexWriter(out) as w:
        w.add(dataclasses.replace(info, path=shard.name), table)
    return TarDataset(out)


@pytest.mark.parametrize("compression", [None, "zstd", "gzip"])
def test_an_edited_record_is_stale_never_other_bytes(compression: str | None, impl: str, tmp_path: Path) -> None:
    plain = _shard("tarfile", tmp_path / "d")
    shard = plain
    if compression == "zstd":
        shard = tmp_path / "d" / "s.tar.zst"
        compress_shard(plain, shard, frame_size=16 << 10)
    elif compression == "gzip":
        shard = tmp_path / "d" / "s.tar.gz"
        shard.write_bytes(gzip.compress(plain.read_bytes()))
    k = MIDDLE

    def pointed_at_the_next(table: ShardTable) -> None:
        table.sample_offset[k] = table.sample_offset[k + 1]  # sample k's record now names sample k+1's bytes

    ds = _edited_index(shard, tmp_path / "d" / "next.tarindex", pointed_at_the_next)
    offset = ds.index.record(k)[1]
    assert ds.index.shards[0].compression == compression
    assert ds[k - 1]["txt"] == _caption(k - 1) and ds[k + 1]["txt"] == _caption(k + 1)
    error = _no_other_bytes(ds, k, shard, offset)
    assert f"the shard has key '{k + 1:06d}' there, the index '{k:06d}'" in str(error)
    with pytest.raises(StaleIndexError, match=rf"sample {k} \('{k:06d}'\) at offset {offset}: offset {offset - 2560} in the shard, {offset} in the index"):
        verify_index(ds.index_path, deep=True)

    def shorter_member(table: ShardTable) -> None:
        table.member_size[2 * k + 1] -= 10  # the caption of sample k: 690 bytes, within its blocks

    ds = _edited_index(shard, tmp_path / "d" / "size.tarindex", shorter_member)
    offset = ds.index.record(k)[1]
    error = _no_other_bytes(ds, k, shard, offset)
    assert f"member 2: the shard has '{k:06d}.txt' of 700 bytes" in str(error) and "the index '" in str(error) and "of 690 bytes" in str(error)
    with pytest.raises(StaleIndexError, match=rf"sample {k} \('{k:06d}'\) at offset \d+: member 2: 'txt' of 700 bytes at \+1536 in the shard, 'txt' of 690 bytes at \+1536 in the index"):
        verify_index(ds.index_path, deep=True)


def test_a_member_offset_with_no_room_for_its_header_is_stale(impl: str, tmp_path: Path) -> None:
    """A record edited so a member's data starts where its header is (no room for a header after the previous
    member's data): the fast paths look nowhere outside the range and the read names the difference."""
    shard = _shard("tarfile", tmp_path / "d")
    k = MIDDLE

    def no_room(table: ShardTable) -> None:
        table.member_offset[2 * k + 1] -= 512  # the caption's data where its header is

    ds = _edited_index(shard, tmp_path / "d" / "room.tarindex", no_room)
    offset = ds.index.record(k)[1]
    assert ds[k - 1]["txt"] == _caption(k - 1)
    error = _no_other_bytes(ds, k, shard, offset)
    assert f"member 2: the shard has '{k:06d}.txt' of 700 bytes at offset {offset + 1536}" in str(error)


def test_an_edited_key_is_stale(impl: str, tmp_path: Path) -> None:
    shard = _shard("gnu-tar-pax", tmp_path / "d")

    def renamed(table: ShardTable) -> None:
        table.keys[MIDDLE] = f"{MIDDLE + 50:06d}"

    ds = _edited_index(shard, tmp_path / "d" / "key.tarindex", renamed)
    error = _no_other_bytes(ds, MIDDLE, shard, ds.index.record(MIDDLE)[1])
    assert f"the shard has key '{MIDDLE:06d}' there, the index '{MIDDLE + 50:06d}'" in str(error)


# -- batches over URL shards ------------------------------------------------------------------------------
def test_remote_batches_are_checked(impl: str, http_server: HTTPServer, tmp_path: Path) -> None:
    www = http_server.root / f"readcheck-{impl}"
    shard = _shard("webdataset", www)
    index = build_index([http_server.url(shard)], index=tmp_path / "u.tarindex", workers=1).path
    ds = TarDataset(index)
    assert [s["txt"] for s in ds.__getitems__([MIDDLE + 1, 3, MIDDLE])] == [_caption(MIDDLE + 1), _caption(3), _caption(MIDDLE)]
    offset = ds.index.record(MIDDLE)[1]
    _in_place(shard, _swap(ds, MIDDLE, MIDDLE + 1), restore_mtime=True)  # same size and mtime: the same ETag
    ds = TarDataset(index)
    assert ds.__getitems__([3])[0]["txt"] == _caption(3)
    with pytest.raises(StaleIndexError, match=rf"{re.escape(http_server.url(shard))}: shard changed since it was indexed \(sample '{MIDDLE:06d}' at offset {offset}: "):
        ds.__getitems__([3, MIDDLE])
    with pytest.raises(StaleIndexError, match=f"at offset {offset}: "):
        ds[MIDDLE]


def test_cli_get_refuses_a_stale_sample(tmp_path: Path) -> None:
    shard = _shard("gnu-tar-ustar", tmp_path / "d")
    ds = _built(shard)
    offset = ds.index.record(MIDDLE)[1]
    _in_place(shard, _swap(ds, MIDDLE, MIDDLE + 1), restore_mtime=True)
    result = CliRunner().invoke(main, ["get", str(ds.index_path), f"{MIDDLE:06d}", "--ext", "txt"])
    assert result.exit_code == 1 and result.stdout_bytes == b""
    assert re.fullmatch(rf"tarindex: error: {re.escape(str(shard))}: shard changed since it was indexed \(sample '{MIDDLE:06d}' at offset {offset}: .*\); rebuild the index\n", result.output)
    result = CliRunner().invoke(main, ["verify", "--deep", str(ds.index_path)])
    assert result.exit_code == 1 and f"sample {MIDDLE} ('{MIDDLE:06d}') at offset {offset}: key" in result.output
