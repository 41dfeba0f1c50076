"""The archives of other projects' tar test suites, made here, for tests/test_corpus.py.

No file of another repository is copied: each case mirrors one archive of Go's ``archive/tar``
testdata, libarchive's test suite or ratarmount's tests (CPython's own ``testtar.tar`` and
``recursion.tar`` are read from the running interpreter by the test), with the same structure and
the same oddity, made with GNU tar (each format), Python's ``tarfile`` or hand-crafted bytes. Where
the original's members have names without an extension (which join no sample), the copy here names
them as samples (``key.ext``), so that the oddity reaches the samples; the comment on each case says
what it mirrors.

A case expects either :mod:`tarfile`'s samples (``expect=None``: its regular members grouped by
webdataset's rules, GNU sparse members left out, ``sparse`` of them, each skipped with a logged
warning) or a named error (:class:`Error`).
"""

from __future__ import annotations

import functools
import io
import lzma
import os
import subprocess
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _tarmut import archive, extension, fix_checksum, header, member, pax_record

from tarindex.errors import CorruptArchiveError, DuplicateMemberError, TarIndexError, UnsupportedCompressionError

BLOCK = 512


@dataclass(frozen=True)
class Error:
    """A named error: its class and a pattern its message matches (after the path)."""

    cls: type[TarIndexError]
    pattern: str


@dataclass(frozen=True)
class Case:
    name: str
    origin: str
    """The archive of another project's suite that this case mirrors."""
    make: Callable[[Path], bytes]
    """The archive's bytes (given a fresh working directory)."""
    expect: Error | None = None
    """``None``: tarfile's samples; else the error every entry point raises."""
    sparse: int = 0
    """GNU sparse members the walk skips (each with a logged warning)."""
    allow_missing_end: bool = False
    """Read with ``allow_missing_end=True``."""


CASES: dict[str, Case] = {}


def case(
    name: str, origin: str, *, expect: Error | None = None, sparse: int = 0, allow_missing_end: bool = False
) -> Callable[[Callable[[Path], bytes]], Callable[[Path], bytes]]:
    def register(make: Callable[[Path], bytes]) -> Callable[[Path], bytes]:
        assert name not in CASES, name
        CASES[name] = Case(name, origin, make, expect, sparse, allow_missing_end)
        return make

    return register


# -- makers ------------------------------------------------------------------------


def gnu_tar(work: Path, fmt: str, files: list[tuple[str, bytes | None]], *options: str, names: list[str] | None = None) -> bytes:
    """GNU tar's archive (``--format=fmt``) of ``files`` (``None``: a directory), written in ``work/src``."""
    src = work / "src"
    for name, data in files:
        p = src / name
        if data is None:
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    out = work / "out.tar"
    listed = names if names is not None else [n for n, _ in files]
    subprocess.run(["tar", f"--format={fmt}", "--no-recursion", *options, "-C", str(src), "-cf", str(out), *listed], check=True, capture_output=True)
    return out.read_bytes()


def holes(path: Path, size: int, pieces: list[tuple[int, bytes]]) -> None:
    """A file of ``size`` bytes with real holes (the file system's), ``pieces`` of data written at their offsets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in pieces:
            f.seek(offset)
            f.write(data)
    if os.stat(path).st_blocks * 512 >= size:  # GNU tar would store it whole: the case would not be what it says
        raise RuntimeError(f"{path}: this file system made no holes; the sparse cases need one that does")


def sparse_tar(work: Path, options: list[str], sparse: dict[str, tuple[int, list[tuple[int, bytes]]]], after: list[tuple[str, bytes]]) -> bytes:
    """GNU tar ``-S`` over files with holes (``sparse``: name -> (size, pieces)), then regular ``after`` files."""
    src = work / "src"
    for name, (size, pieces) in sparse.items():
        holes(src / name, size, pieces)
    for name, data in after:
        (src / name).write_bytes(data)
    out = work / "out.tar"
    names = [*sparse, *(n for n, _ in after)]
    subprocess.run(["tar", *options, "-S", "--no-recursion", "-C", str(src), "-cf", str(out), *names], check=True, capture_output=True)
    buf = out.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:  # the writer did make sparse members
        assert sum(m.issparse() for m in tf) == len(sparse), [(m.name, m.issparse()) for m in tf]
    return buf


def py_tar(fmt: int, members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """tarfile's archive of ``members`` (with data where given)."""
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=fmt, encoding="utf-8") as tf:
        for m in members:
            ti, data = m if isinstance(m, tuple) else (m, None)
            if data is not None:
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return bio.getvalue()


def info(name: str, typ: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = typ
    ti.mtime = 1_700_000_000
    for key, value in fields.items():
        setattr(ti, key, value)
    return ti


def gnu_header(name: bytes, size: int, typ: bytes = b"0") -> bytearray:
    """An old GNU header (magic ``"ustar  \\0"``: no ustar prefix, atime and ctime there instead)."""
    h = header(name, size, typ)
    h[257:265] = b"ustar  \x00"
    fix_checksum(h, 0)
    return h


def octal(n: int, width: int) -> bytes:
    """``n`` as octal digits and a NUL in ``width`` bytes, or GNU base-256 where the digits do not fit."""
    return b"%0*o\x00" % (width - 1, n) if n < 8 ** (width - 1) else base256(n, width)


def base256(n: int, width: int) -> bytes:
    return b"\x80" + n.to_bytes(width - 1, "big")


def old_gnu_sparse(name: bytes, realsize: int, segments: list[tuple[int, int]], data: bytes, *, number: Callable[[int, int], bytes] = octal) -> bytes:
    """An old GNU sparse member (type ``S``) as GNU tar writes it: 4 entries in the header, the rest in
    extension blocks of 21 entries (each block's byte 504 says whether another follows), then the stored data."""
    h = gnu_header(name, len(data), b"S")
    head, rest = segments[:4], segments[4:]
    for i, (offset, size) in enumerate(head):
        h[386 + 24 * i : 386 + 24 * i + 24] = number(offset, 12) + number(size, 12)
    h[482] = 1 if rest else 0
    h[483:495] = number(realsize, 12)
    fix_checksum(h, 0)
    blocks = b""
    while rest:
        block = bytearray(BLOCK)
        chunk, rest = rest[:21], rest[21:]
        for i, (offset, size) in enumerate(chunk):
            block[24 * i : 24 * i + 24] = number(offset, 12) + number(size, 12)
        block[504] = 1 if rest else 0
        blocks += bytes(block)
    return bytes(h) + blocks + data + bytes(-len(data) % BLOCK)


def lz4_frame(data: bytes) -> bytes:
    """``data`` as the lz4 command compresses it."""
    return subprocess.run(["lz4", "-q", "-c"], input=data, capture_output=True, check=True).stdout


def lzip_member(data: bytes) -> bytes:
    """``data`` as one lzip member: ``LZIP``, version 1, the dictionary size, an LZMA stream with its end
    marker (lc=3, lp=0, pb=2), then CRC-32, data size and member size (what ``lzip`` writes)."""
    raw = lzma.compress(data, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA1, "dict_size": 1 << 16, "lc": 3, "lp": 0, "pb": 2}])
    body = b"LZIP\x01" + bytes([16]) + raw  # dictionary 2**16
    return body + zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(8, "little") + (len(body) + 20).to_bytes(8, "little")


def small_tar() -> bytes:
    return py_tar(tarfile.GNU_FORMAT, [(info("000.txt"), b"a sample"), (info("000.cls"), b"1"), (info("001.txt"), b"another")])


# -- Go's archive/tar testdata ------------------------------------------------------


@case("go-gnu", "Go archive/tar testdata/gnu.tar: two files, GNU format (GNU tar)")
def _(work: Path) -> bytes:
    return gnu_tar(work, "gnu", [("small.txt", b"Kilts"), ("small2.txt", b"Google.com\n")])


@case("go-v7", "Go testdata/v7.tar: the same in v7 format (no magic, type NUL)")
def _(work: Path) -> bytes:
    return gnu_tar(work, "v7", [("small.txt", b"Kilts"), ("small2.txt", b"Google.com\n")])


@case("go-star", "Go testdata/star.tar: star's ustar variant (atime and ctime after an empty prefix, 'tar' at byte 508)")
def _(work: Path) -> bytes:
    parts = []
    for name, data in ((b"small.txt", b"Kilts"), (b"small2.txt", b"Google.com\n")):
        h = header(name, len(data))
        h[476:488] = octal(1244592783, 12)
        h[488:500] = octal(1244592783, 12)
        h[508:512] = b"tar\x00"
        fix_checksum(h, 0)
        parts.append(bytes(h) + data + bytes(-len(data) % BLOCK))
    return archive(*parts)


@case("go-ustar-prefix", "Go testdata/ustar.tar and ustar.issue12594.tar: a long name split into ustar prefix and name (GNU tar)")
def _(work: Path) -> bytes:
    deep = "/".join(["longname"] * 15)  # 134 characters: prefix and name
    return gnu_tar(work, "ustar", [(deep, None), (f"{deep}/000.txt", b"in the prefix"), (f"{deep}/000.cls", b"7")])


@case("go-pax", "Go testdata/pax.tar: a name longer than 100 bytes and a symlink with a long target, in PAX records (tarfile)")
def _(work: Path) -> bytes:
    long = "a/" + "".join(str(i) for i in range(1, 101))
    return py_tar(tarfile.PAX_FORMAT, [(info(f"{long}.txt"), b"long"), info("a/b", tarfile.SYMTYPE, linkname=long), (info("a/c.txt"), b"after")])


@case("go-pax-records", "Go testdata/pax-records.tar: PAX records nobody reads (GOLANG.pkg, comment, a long uname)")
def _(work: Path) -> bytes:
    ti = info("file.txt", pax_headers={"GOLANG.pkg": "tar", "comment": "Hello, 世界", "uname": "long" * 10})
    return py_tar(tarfile.PAX_FORMAT, [(ti, b"records")])


@case("go-pax-global-records", "Go testdata/pax-global-records.tar: a global path, then a global header clearing it (path='': the "
      "later members are named '', as tarfile and GNU tar read it)")  # fmt: skip
def _(work: Path) -> bytes:
    return archive(
        extension(b"g", pax_record("path", "global1.txt") + pax_record("mtime", "1500000000.0")), member(b"file1.txt", b"1"),
        extension(b"x", pax_record("path", "file2.txt")), member(b"file2.txt", b"2"),
        extension(b"g", pax_record("path", "")), member(b"file3.txt", b"3"),
        extension(b"x", pax_record("mtime", "1400000000")), member(b"file4.txt", b"4"),
    )  # fmt: skip


@case("go-pax-multi-hdrs", "Go testdata/pax-multi-hdrs.tar: two PAX headers before one member (the first path wins, as in tarfile)")
def _(work: Path) -> bytes:
    first = extension(b"x", pax_record("path", "PAX1/PAX1/long-path-name.txt"))
    second = extension(b"x", pax_record("path", "PAX2/PAX2/long-path-name.txt") + pax_record("linkpath", "PAX4/PAX4/link"))
    return archive(first, second, member(b"bar.txt", b"data"))


@case("go-gnu-multi-hdrs", "Go testdata/gnu-multi-hdrs.tar: two GNU long names and two long link names before one member")
def _(work: Path) -> bytes:
    return archive(
        extension(b"L", b"GNU1/GNU1/long-path-name.txt\x00"), extension(b"L", b"GNU2/GNU2/long-path-name.txt\x00"),
        extension(b"K", b"GNU3/GNU3/long-linkpath-name\x00"), extension(b"K", b"GNU4/GNU4/long-linkpath-name\x00"),
        member(b"bar.txt", b"data"),
    )  # fmt: skip


@case("go-gnu-long-nul", "Go testdata/gnu-long-nul.tar: a GNU long name with bytes after its NUL (the name ends at the NUL)")
def _(work: Path) -> bytes:
    return archive(extension(b"L", b"0123456789.txt\x00junk after the name"), member(b"placeholder", b"x"))


@case("go-xattrs", "Go testdata/xattrs.tar: SCHILY.xattr records (one value ends in a NUL)")
def _(work: Path) -> bytes:
    x = {"SCHILY.xattr.user.key": "value", "SCHILY.xattr.security.selinux": "unconfined_u:object_r:default_t:s0\x00"}
    return py_tar(tarfile.PAX_FORMAT, [(info("small.txt", pax_headers=x), b"Kilts"), (info("small2.txt", pax_headers=x), b"Google.com\n")])


@case("go-nil-uid", "Go testdata/nil-uid.tar (golang.org/issue/5290): uid and gid fields all NUL")
def _(work: Path) -> bytes:
    h = header(b"P1050238.JPG.log", 14)
    h[108:124] = bytes(16)
    fix_checksum(h, 0)
    return archive(bytes(h) + b"14 bytes here." + bytes(BLOCK - 14))


@case("go-pax-bad-hdr-file", "Go testdata/pax-bad-hdr-file.tar: a PAX record that does not end with a newline",
      expect=Error(CorruptArchiveError, "malformed PAX extended header record at byte 0 of its data at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return archive(extension(b"x", b"16 path=foo.txt "), member(b"foo.txt", b"x"))


@case("go-pax-bad-mtime-file", "Go testdata/pax-bad-mtime-file.tar: an mtime record that is not a number (tarindex reads no mtime)")
def _(work: Path) -> bytes:
    return archive(extension(b"x", pax_record("mtime", "1350244992.02396010-8")), member(b"foo.txt", b"x"))


@case("go-pax-pos-size-file", "Go testdata/pax-pos-size-file.tar: the member's size in a PAX record, not in its header")
def _(work: Path) -> bytes:
    data = bytes(range(256)) * 3 + b"x" * 231  # 999 bytes
    h = header(b"foo.bin", 0)
    return archive(extension(b"x", pax_record("size", "999")), bytes(h) + data + bytes(-len(data) % BLOCK))


@case("go-neg-size", "Go testdata/neg-size.tar: a negative base-256 size", expect=Error(CorruptArchiveError, r"bad size field .* at offset 0"))
def _(work: Path) -> bytes:
    return archive(bytes(header(b"neg.txt", 0, size_field=b"\xff" * 11 + b"\xf0")))


@case("go-issue11169", "Go testdata/issue11169.tar: a PAX record longer than its header's data",
      expect=Error(CorruptArchiveError, "malformed PAX extended header record at byte 0 of its data at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return archive(extension(b"x", b"40 path=x.txt\n"), member(b"x.txt", b"x"))


@case("go-issue12435", "Go testdata/issue12435.tar: an old GNU sparse member whose map contradicts its sizes (its stored data is skipped)", sparse=1)
def _(work: Path) -> bytes:
    return archive(old_gnu_sparse(b"bad.sparse", 10, [(1 << 40, 5), (0, 1 << 30)], b"hello"), member(b"after.txt", b"still read"))


@case("go-sparse-formats", "Go testdata/sparse-formats.tar: old GNU sparse with 5 extension blocks (100 one-byte pieces), "
      "PAX sparse 0.0, 0.1 and 1.0 (GNU tar), then a plain member", sparse=4)  # fmt: skip
def _(work: Path) -> bytes:
    pieces = [(2 * i + 1, 1) for i in range(100)]  # "\0G\0o..." as in Go's file: every other byte a hole
    gnu = old_gnu_sparse(b"sparse-gnu", 200, pieces, b"Go" * 50)
    posix = []
    for version in ("0.0", "0.1", "1.0"):
        buf = sparse_tar(work / version, ["--format=posix", f"--sparse-version={version}"], {f"sparse-posix-{version}": (1 << 20, [(0, b"G" * 512), (600_000, b"o" * 512)])}, [])
        posix.append(buf[: end_of_members(buf)])
    return archive(member(b"begin.txt", b"begin\n"), gnu, *posix, member(b"end.txt", b"end\n"))


def end_of_members(buf: bytes) -> int:
    """Where the end-of-archive marker of a valid archive starts."""
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        tf.getmembers()
        return tf.offset


@case("go-gnu-incremental", "Go testdata/gnu-incremental.tar: tar --incremental -S (a dumpdir 'D' member with data, "
      "atime and ctime where ustar has its prefix, a sparse member)", sparse=1)  # fmt: skip
def _(work: Path) -> bytes:
    src = work / "src"
    (src / "test2").mkdir(parents=True)
    (src / "test2" / "foo.txt").write_bytes(b"f" * 64)
    holes(src / "test2" / "sparse.bin", 1 << 20, [(700_000, b"data")])
    out = work / "out.tar"
    subprocess.run(["tar", "--incremental", "-S", "-C", str(src), "-cf", str(out), "test2"], check=True, capture_output=True)
    return out.read_bytes()


@case("go-gnu-nil-sparse-data", "Go testdata/gnu-nil-sparse-data.tar and -hole.tar: sparse members of holes only", sparse=2)
def _(work: Path) -> bytes:
    return sparse_tar(work, ["--format=gnu"], {"nil-a.bin": (1000, []), "nil-b.bin": (1 << 20, [])}, [("after.txt", b"after")])


@case("go-gnu-sparse-big", "Go testdata/gnu-sparse-big.tar: an old GNU sparse member of 60 GB, its numbers in base-256", sparse=1)
def _(work: Path) -> bytes:
    pieces = [(i * 10_000_000_000, 1024) for i in range(6)]
    return archive(old_gnu_sparse(b"gnu-sparse", 60_000_000_000, pieces, b"x" * 6 * 1024, number=base256), member(b"after.txt", b"after"))


@case("go-pax-sparse-big", "Go testdata/pax-sparse-big.tar: a PAX sparse 1.0 member of 60 GB (GNU tar)", sparse=1)
def _(work: Path) -> bytes:
    return sparse_tar(work, ["--format=posix", "--sparse-version=1.0"], {"pax-sparse.bin": (60_000_000_000, [(59_999_999_000, b"end")])}, [("after.txt", b"after")])


@case("go-hardlink", "Go testdata/hardlink.tar: a file and a hard link to it (GNU tar)")
def _(work: Path) -> bytes:
    src = work / "src"
    src.mkdir()
    (src / "file.txt").write_bytes(b"Slartibartfast\n")
    os.link(src / "file.txt", src / "hard.txt")
    out = work / "out.tar"
    subprocess.run(["tar", "--format=gnu", "-C", str(src), "-cf", str(out), "file.txt", "hard.txt"], check=True, capture_output=True)
    return out.read_bytes()


@case("go-hdr-only", "Go testdata/hdr-only.tar: links, devices, directories and FIFOs whose size field is not 0, without data")
def _(work: Path) -> bytes:
    parts = [member(b"000.txt", b"before")]
    for typ in b"123456":
        parts.append(bytes(header(b"hdr-only-%c.txt" % typ, 512, bytes([typ]))))  # size 512, no data follows
    parts.append(bytes(header(b"old-style-dir/", 512, b"\x00")))  # a v7 directory: also no data
    parts.append(member(b"001.txt", b"after"))
    return archive(*parts)


@case("go-trailing-slash", "Go testdata/trailing-slash.tar: a long directory name ending in '/', in a PAX record")
def _(work: Path) -> bytes:
    d = "/".join(["123456789"] * 30) + "/"
    return py_tar(tarfile.PAX_FORMAT, [info(d, tarfile.DIRTYPE), (info(d + "000.txt"), b"inside")])


@case("go-ustar-file-devs", "Go testdata/ustar-file-devs.tar: a regular file whose device numbers are set")
def _(work: Path) -> bytes:
    h = header(b"file.txt", 0)
    h[329:337] = octal(1, 8)
    h[337:345] = octal(1, 8)
    fix_checksum(h, 0)
    return archive(bytes(h))


@case("go-writer-big", "Go testdata/writer-big.tar: the header of a large member (16 GiB there, 4 GiB here) and nothing after it",
      expect=Error(CorruptArchiveError, r"truncated archive: member data needs 4294967296 bytes, input ends at \d+ at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return bytes(header(b"tmp/4gig.txt", 4 << 30)) + bytes(2 * BLOCK)


@case("go-invalid-go17", "Go testdata/invalid-go17.tar: a uid in base-256 and a name split into prefix and name")
def _(work: Path) -> bytes:
    h = header(b"foo.txt", 3)
    h[345:345 + 99] = b"a" * 99
    h[108:116] = base256(0o10000000, 8)
    fix_checksum(h, 0)
    return archive(bytes(h) + b"abc" + bytes(BLOCK - 3))


@case("go-gnu-utf8", "Go testdata/gnu-utf8.tar and gnu-not-utf8.tar: UTF-8 names and names that are not UTF-8 (GNU long names)")
def _(work: Path) -> bytes:
    utf8 = ("☺☻☹" * 40 + ".txt").encode()
    latin1 = b"hi\x80\x81\x82\x83bye.txt"
    return archive(extension(b"L", utf8 + b"\x00"), member(b"placeholder", b"smiley"), member(latin1, b"latin-1"))


@case("go-file-and-dir", "Go testdata/file-and-dir.tar: a file, then a directory")
def _(work: Path) -> bytes:
    return gnu_tar(work, "ustar", [("small.txt", b"Kilts"), ("dir", None)])


@case("go-pax-nul-path", "Go testdata/pax-nul-path.tar: a PAX path with a NUL inside (taken as it is, as by tarfile)")
def _(work: Path) -> bytes:
    return archive(extension(b"x", pax_record("path", b"foo\x00bar.txt")), member(b"placeholder", b"x"))


@case("go-pax-nul-xattrs", "Go testdata/pax-nul-xattrs.tar: a NUL inside a PAX record's key (a record tarindex does not read)")
def _(work: Path) -> bytes:
    return archive(extension(b"x", pax_record("SCHILY.xattr.user.nul\x00key", "value")), member(b"small.txt", b"Kilts"))


# -- libarchive's test suite -------------------------------------------------------


def _hardlink_without_end() -> bytes:
    data = b"x" * 321
    reg = header(b"xmcd-3.3.2/docs_d/READMf.txt", 321, b"\x00")
    link = header(b"xmcd-3.3.2/README.txt", 321, b"1")  # a hard link whose header carries its target's size ...
    link[157 : 157 + 28] = b"xmcd-3.3.2/docs_d/READMf.txt"
    for h in (reg, link):
        h[257:265] = bytes(8)  # v7 headers
        fix_checksum(h, 0)
    return bytes(reg) + data + bytes(-len(data) % BLOCK) + bytes(link)  # ... at the archive's end, no end-of-archive marker


@case("la-tar-hardlink-1", "libarchive test_compat_tar_hardlink_1.tar: v7, a hard link with a size as the last header, no end-of-archive marker",
      expect=Error(CorruptArchiveError, r"truncated archive: no end-of-archive marker \(.*allow_missing_end=True.*\) at offset 1536"))  # fmt: skip
def _(work: Path) -> bytes:
    return _hardlink_without_end()


@case("la-tar-hardlink-1-allowed", "libarchive test_compat_tar_hardlink_1.tar, read with allow_missing_end=True", allow_missing_end=True)
def _(work: Path) -> bytes:
    return _hardlink_without_end()


@case("la-pax-empty-val-no-nl", "libarchive test_read_pax_empty_val_no_nl.tar: a PAX record '4 x=' (empty value, no newline)")
def _(work: Path) -> bytes:
    return archive(extension(b"x", b"4 x="), member(b"empty.txt", b""), member(b"next.txt", b"next"))


def _gtar_sparse(work: Path, options: list[str]) -> bytes:
    big = [(i * 131072, b"sparse" * 100) for i in range(24)]  # 24 pieces: the header's 4 and an extension block
    return sparse_tar(work, options, {"sparse.bin": (3 << 20, big), "sparse2.bin": (99000001, [(0, b"a"), (98_999_999, b"zz")])}, [("non-sparse.txt", b"")])


for _name, _origin, _options in (
    ("la-gtar-sparse-1-17", "test_read_format_gtar_sparse_1_17.tar (and 1_13): old GNU sparse, more than 4 holes", ["--format=oldgnu"]),
    ("la-gtar-sparse-posix00", "test_read_format_gtar_sparse_1_17_posix00.tar: PAX sparse 0.0", ["--format=posix", "--sparse-version=0.0"]),
    ("la-gtar-sparse-posix01", "test_read_format_gtar_sparse_1_17_posix01.tar: PAX sparse 0.1", ["--format=posix", "--sparse-version=0.1"]),
    ("la-gtar-sparse-posix10", "test_read_format_gtar_sparse_1_17_posix10.tar: PAX sparse 1.0", ["--format=posix", "--sparse-version=1.0"]),
):
    case(_name, f"libarchive {_origin} (GNU tar)", sparse=2)(functools.partial(_gtar_sparse, options=_options))


@case("la-tar-concatenated", "libarchive test_read_format_tar_concatenated.tar: two archives one after the other (read to the first end marker, as tarfile)")
def _(work: Path) -> bytes:
    return small_tar() + py_tar(tarfile.GNU_FORMAT, [(info("002.txt"), b"second archive")])


@case("la-tar-empty-filename", "libarchive test_read_format_tar_empty_filename.tar: a member with an empty name")
def _(work: Path) -> bytes:
    return archive(member(b"", b"nameless"), member(b"000.txt", b"named"))


@case("la-tar-empty-with-gnulabel", "libarchive test_read_format_tar_empty_with_gnulabel.tar: a GNU volume label and nothing else (GNU tar -V)")
def _(work: Path) -> bytes:
    out = work / "out.tar"
    subprocess.run(["tar", "--format=gnu", "-V", "my-label", "-cf", str(out), "--files-from", "/dev/null"], check=True, capture_output=True)
    return out.read_bytes()


@case("la-tar-invalid-pax-size", "libarchive test_read_format_tar_invalid_pax_size.tar: a PAX size that is not a number",
      expect=Error(CorruptArchiveError, r"bad PAX size '12a' \(expected decimal digits\) at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return archive(extension(b"x", pax_record("size", "12a")), member(b"x.txt", b"x"))


@case("la-tar-pax-g-large", "libarchive test_read_format_tar_pax_g_large.tar: a global PAX header claiming 4 GiB",
      expect=Error(CorruptArchiveError, r"truncated archive: (member|extension header) data needs 4294967296 bytes.* at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return archive(bytes(header(b"PaxHeader/x", 1 << 32, b"g")))


@case("la-tar-V-negative-size", "libarchive test_read_format_tar_V_negative_size.tar: a volume label with a negative size",
      expect=Error(CorruptArchiveError, r"bad size field .* at offset 0"))  # fmt: skip
def _(work: Path) -> bytes:
    return archive(bytes(header(b"label", 0, b"V", size_field=b"\xff" + bytes(6) + b" " + bytes(4))))


@case("la-compat-lzma", "libarchive test_compat_lzma_1.tlz: a tar in LZMA-alone (xz --format=lzma)",
      expect=Error(UnsupportedCompressionError, r"LZMA-alone \(\.lzma\)-compressed, which tarindex does not read; convert it to a plain tar \('xz -dc "))  # fmt: skip
def _(work: Path) -> bytes:
    return subprocess.run(["xz", "--format=lzma", "-c"], input=small_tar(), capture_output=True, check=True).stdout


@case("la-compat-lzip", "libarchive test_compat_lzip_1.tlz: a tar in lzip",
      expect=Error(UnsupportedCompressionError, r"lzip-compressed, which tarindex does not read; convert it to a plain tar \('lzip -dc "))  # fmt: skip
def _(work: Path) -> bytes:
    return lzip_member(small_tar())


@case("la-compat-lz4-skippable", "libarchive test_compat_lz4_skippable_frames_B4.tar.lz4: lz4 after two skippable frames (the magic zstd's skippable frames share)",
      expect=Error(UnsupportedCompressionError, r"lz4-compressed, which tarindex does not read; convert it to a plain tar \('lz4 -dc "))  # fmt: skip
def _(work: Path) -> bytes:
    skippable = (0x184D2A50).to_bytes(4, "little") + bytes(4) + (0x184D2A51).to_bytes(4, "little") + (10).to_bytes(4, "little") + bytes(range(10))
    return skippable + lz4_frame(small_tar())


@case("la-tar-pax-sun-holesdata", "libarchive test_read_format_tar_pax_sun_holesdata.tar: Solaris' SUN.holesdata record (not a GNU sparse member: read whole, as tarfile)")
def _(work: Path) -> bytes:
    return archive(extension(b"x", pax_record("SUN.holesdata", " 0 512 1024 512")), member(b"hole.bin", b"\x01" * 1536))


# -- ratarmount's tests ------------------------------------------------------------


def _ratarmount_sparse(work: Path, options: list[str]) -> bytes:
    return sparse_tar(work, options, {"sparse-512B": (512, []), "sparse-513B": (513, []), "sparse-1MiB": (1 << 20, [(1 << 19, b"middle")])}, [("after.txt", b"after the sparse members")])


for _name, _options in (
    ("gnu", ["--format=gnu"]),
    ("pax-0.0", ["--format=pax", "--sparse-version=0.0"]),
    ("pax-0.1", ["--format=pax", "--sparse-version=0.1"]),
    ("pax-1.0", ["--format=pax", "--sparse-version=1.0"]),
):
    case(f"rm-sparse-{_name}", f"ratarmount tests/sparse.{_name.replace('pax-', 'pax.sparse-')}.tar (GNU tar)", sparse=3)(
        functools.partial(_ratarmount_sparse, options=_options)
    )


@case("rm-incremental-backup", "ratarmount tests/incremental-backup.level.0.tar and .level.1.tar: GNU tar --listed-incremental (dumpdirs, "
      "atime and ctime where ustar has its prefix)")  # fmt: skip
def _(work: Path) -> bytes:
    src = work / "src"
    (src / "foo").mkdir(parents=True)
    (src / "root-file.txt").write_bytes(b"root")
    for i in range(3):
        (src / "foo" / f"{i}.txt").write_bytes(b"%d" % i * (i + 3))
    snar = work / "backup.snar"
    level0, level1 = work / "0.tar", work / "1.tar"
    subprocess.run(["tar", "--listed-incremental", str(snar), "-C", str(src), "-cf", str(level0), "."], check=True, capture_output=True)
    os.rename(src / "foo" / "2.txt", src / "foo" / "moved.txt")
    (src / "foo" / "1.txt").write_bytes(b"changed")
    subprocess.run(["tar", "--listed-incremental", str(snar), "-C", str(src), "-cf", str(level1), "."], check=True, capture_output=True)
    return level0.read_bytes()[: end_of_members(level0.read_bytes())] + level1.read_bytes()


@case("rm-absolute-file-incremental", "ratarmount tests/absolute-file-incremental.tar: an absolute name in an incremental archive")
def _(work: Path) -> bytes:
    (work / "abs").mkdir()
    (work / "abs" / "foo.txt").write_bytes(b"foo\n")
    out = work / "out.tar"
    subprocess.run(["tar", "--incremental", "-P", "-cf", str(out), str(work / "abs" / "foo.txt")], check=True, capture_output=True)
    return out.read_bytes()


@case("rm-concatenated", "ratarmount tests/concatenated.tar: tar --concatenate (the first end marker removed: both archives read)")
def _(work: Path) -> bytes:
    first, second = work / "a.tar", work / "b.tar"
    first.write_bytes(gnu_tar(work / "a", "gnu", [("foo/fighter.txt", b"first")]))
    second.write_bytes(gnu_tar(work / "b", "gnu", [("foo/fighter2.txt", b"second")]))
    subprocess.run(["tar", "--concatenate", "-f", str(first), str(second)], check=True, capture_output=True)
    return first.read_bytes()


@case("rm-truncated", "ratarmount tests/truncated.tar: cut inside a member's data",
      expect=Error(CorruptArchiveError, r"truncated archive: member data needs 6 bytes, input ends at 1539 at offset 1024"))  # fmt: skip
def _(work: Path) -> bytes:
    return gnu_tar(work, "gnu", [("foo", None), ("foo/fighter", None), ("foo/fighter/ufo.txt", b"iriya\n")])[:1539]


@case("rm-updated-file", "ratarmount tests/updated-file.tar: the same name appended again (tar -r): one sample, one extension twice",
      expect=Error(DuplicateMemberError, r"duplicate extension 'txt' in sample 'foo/fighter/ufo' \(member 'foo/fighter/ufo.txt'\) at offset 1024"))  # fmt: skip
def _(work: Path) -> bytes:
    src = work / "src"
    (src / "foo" / "fighter").mkdir(parents=True)
    out = work / "out.tar"
    for content in (b"iriya\n", b"summer\n"):
        (src / "foo" / "fighter" / "ufo.txt").write_bytes(content)
        subprocess.run(["tar", "--format=gnu", "-C", str(src), "-rf", str(out), "foo/fighter/ufo.txt"], check=True, capture_output=True)
    return out.read_bytes()


@case("rm-links", "ratarmount tests/file-existing-as-non-link-and-link.tar, two-self-links.tar, single-self-link.tar: links to themselves and to files")
def _(work: Path) -> bytes:
    return py_tar(
        tarfile.GNU_FORMAT,
        [(info("foo/fighter/ufo.txt"), b"iriya\n"), info("foo/fighter/ufo.txt", tarfile.SYMTYPE, linkname="ufo.txt"),
         info("self.txt", tarfile.SYMTYPE, linkname="self.txt"), info("bar.txt", tarfile.LNKTYPE, linkname="bar.txt"),
         (info("bar.cls"), b"1")],
    )  # fmt: skip


@case("rm-denormal-paths", "ratarmount tests/denormal-paths.tar: names with '..', '.' and '//'")
def _(work: Path) -> bytes:
    return py_tar(tarfile.GNU_FORMAT, [(info("root/../ufo.txt"), b"iriya\n"), (info("root/./bar.txt"), b"bar\n"), (info("././foo.txt"), b"foo\n"), (info("a//b.txt"), b"b")])


@case("rm-denormal-paths-tarfile", "ratarmount tests/denormal-paths-tarfile.tar: a header that claims data the writer left out (the next header follows)",
      expect=Error(CorruptArchiveError, "bad header checksum .* at offset 2048"))  # fmt: skip
def _(work: Path) -> bytes:
    record = extension(b"x", pax_record("mtime", "1667762472.6118383"))
    return archive(record, bytes(header(b"folder/../ufo.txt", 6)), record, member(b"../root/bar.txt", b"bar\n"))


@case("rm-empty", "ratarmount tests/empty.tar: tar cf empty.tar --files-from /dev/null (10 KiB of zeros)")
def _(work: Path) -> bytes:
    out = work / "out.tar"
    subprocess.run(["tar", "cf", str(out), "--files-from", "/dev/null"], check=True, capture_output=True)
    return out.read_bytes()


@case("empty-one-block", "an empty archive of one zero block (the end-of-archive marker's first block only)")
def _(work: Path) -> bytes:
    return bytes(BLOCK)


@case("rm-nested-tar", "ratarmount tests/nested-tar.tar: a tar as a sample's member")
def _(work: Path) -> bytes:
    return py_tar(tarfile.GNU_FORMAT, [(info("foo/lighter.tar"), small_tar()), (info("foo/lighter.txt"), b"beside it")])


@case("rm-special-char", "ratarmount tests/special-char.tar and nested-special-char.tar: Latin-1 names (not UTF-8)")
def _(work: Path) -> bytes:
    return archive(member("Ördner-mìt-dämlicher-Ködierüng/Datei-mit-dämlicher-Kodierung.txt".encode("latin-1"), b"iriya\n"))
