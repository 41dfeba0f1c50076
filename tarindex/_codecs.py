"""The codec registry: every way a shard's tar bytes may be stored (plain, zstd, gzip), one row each, and the
detection by content that picks the row.

A shard's first bytes say what it is, whatever its name: a zstd frame (data or skippable), a gzip
member, or a tar header. bzip2, xz, lzma (LZMA-alone), lzip, lz4 (skippable frames first too) and
Unix ``compress`` are recognised too, and refused with an
:class:`~tarindex.errors.UnsupportedCompressionError` naming the file, the format and the command
that converts it, never "not a tar archive", "not a zstd frame" or "bad header checksum". A single
file is a shard or an index by its content too (:func:`looks_like_shard`, :func:`looks_like_index`).

A row names the codec (as :func:`detect` names it and as an index entry records it in
``ShardInfo.compression``), gives its stream walk (the decompression of a shard's bytes read in order, which
streaming, building and rewriting use) and says what the index keeps of it (a frame table, seek points).
Modules above this layer attach their per-codec step to the rows: the index scan of a local file
(:data:`tarindex.scan.LOCAL_SCANS`) and the random reader (:data:`tarindex.access.codecs.RANDOM`); a test
checks that every row has both. No other module compares codec names: it asks this table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .compression import ArchiveEnd
from .errors import UnsupportedCompressionError

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Format = Literal["tar", "zstd", "gzip", "bzip2", "xz", "lzma", "lzip", "lz4", "compress"]
"""What a shard's first bytes say it is (``"tar"``: no compression recognised)."""

HEAD_BYTES = 512
"""Bytes of a shard's start that :func:`detect` and :func:`looks_like_shard` look at."""

_ZSTD = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE = 0xFFFFFFF0, 0x184D2A50  # zstd's skippable frames, which are lz4's too
_LZ4_FRAME = b"\x04\x22\x4d\x18"
_MAGICS: tuple[tuple[bytes, Format], ...] = (
    (b"\x1f\x8b\x08", "gzip"),  # RFC 1952, deflate
    (b"\xfd7zXZ\x00", "xz"),
    (b"LZIP", "lzip"),
    (_LZ4_FRAME, "lz4"),  # lz4 frame format
    (b"\x02\x21\x4c\x18", "lz4"),  # lz4 legacy format
    (b"\x1f\x9d", "compress"),
)
_UNSUPPORTED: dict[str, tuple[str, str, tuple[str, ...]]] = {  # format: (name, decompressing command, suffixes)
    "bzip2": ("bzip2", "bzip2 -dc", (".tar.bz2", ".tbz2", ".tbz", ".bz2")),
    "xz": ("xz", "xz -dc", (".tar.xz", ".txz", ".xz")),
    "lzma": ("LZMA-alone (.lzma)", "xz -dc", (".tar.lzma", ".tlz", ".lzma")),
    "lzip": ("lzip", "lzip -dc", (".tar.lz", ".tlz", ".lz")),
    "lz4": ("lz4", "lz4 -dc", (".tar.lz4", ".lz4")),
    "compress": ("Unix compress (.Z)", "gzip -dc", (".tar.Z", ".taZ", ".Z")),
}
# LZMA-alone (.lzma) has no magic: its header is a properties byte (at most (4 * 5 + 4) * 9 + 8), the
# dictionary size (2**n or 3 * 2**(n-1) bytes as LZMA Utils and xz write it, 4 KiB to 512 MiB, or a
# whole number of MiB where xz lowered it to fit in memory) and the uncompressed size (2**64 - 1:
# unknown). A tar header never looks like that: its name is NUL-terminated and NUL-padded, so the
# four bytes after a first name byte are never such a size (libarchive's bidder reads it the same way).
_LZMA_PROPERTIES_MAX = (4 * 5 + 4) * 9 + 8
_LZMA_DICTIONARIES = frozenset([1 << n for n in range(12, 30)] + [3 << n for n in range(11, 28)])
_LZMA_SIZE_MAX = 1 << 40  # a known uncompressed size above 1 TiB: not taken for an LZMA-alone header


def _lzma_alone(head: bytes) -> bool:
    """Whether ``head`` (at least 5 bytes) starts an LZMA-alone stream (see above)."""
    if len(head) < 5 or head[0] > _LZMA_PROPERTIES_MAX:
        return False
    dictionary = int.from_bytes(head[1:5], "little")
    if dictionary not in _LZMA_DICTIONARIES and not (3 << 20 <= dictionary <= 63 << 20 and dictionary % (1 << 20) == 0):
        return False
    size = int.from_bytes(head[5:13], "little") if len(head) >= 13 else -1
    return size < _LZMA_SIZE_MAX or size == (1 << 64) - 1


def _after_skippable(head: bytes) -> bytes:
    """What follows the skippable frames that start ``head`` (the next frame's magic, if ``head`` reaches it)."""
    at = 0
    while len(head) >= at + 8 and (int.from_bytes(head[at : at + 4], "little") & _SKIPPABLE_MASK) == _SKIPPABLE:
        at += 8 + int.from_bytes(head[at + 4 : at + 8], "little")
    return head[at : at + 4]


def detect(head: bytes) -> Format:
    """The codec of a stream that starts with ``head`` (at least 6 bytes for every format to be seen;
    an lz4 stream that starts with skippable frames is seen when ``head`` reaches its first frame,
    :data:`HEAD_BYTES` as shards are read, else it is taken for zstd)."""
    if len(head) >= 4:
        magic = int.from_bytes(head[:4], "little")
        if magic == _ZSTD:
            return "zstd"
        if (magic & _SKIPPABLE_MASK) == _SKIPPABLE:
            return "lz4" if _after_skippable(head) == _LZ4_FRAME else "zstd"
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[3:4] != b"0":
        return "bzip2"
    for magic_bytes, codec in _MAGICS:
        if head.startswith(magic_bytes):
            return codec
    if _lzma_alone(head):
        return "lzma"
    return "tar"


def codec_of(head: bytes, path: str) -> Literal["tar", "zstd", "gzip"]:
    """The codec that reads a shard starting with ``head``: ``"tar"`` (none), ``"zstd"`` or ``"gzip"``.

    Raises:
        UnsupportedCompressionError: bzip2, xz, lzma, lzip, lz4 or Unix compress, naming the conversion command.
    """
    codec = detect(head)
    if codec in ("tar", "zstd", "gzip"):
        return codec
    name, command, suffixes = _UNSUPPORTED[codec]
    stem = path
    for suffix in suffixes:
        if path.endswith(suffix):
            stem = path[: -len(suffix)]
            break
    raise UnsupportedCompressionError(
        path,
        f"{name}-compressed, which tarindex does not read; convert it to a plain tar "
        f"('{command} {path} > {stem}.tar') or to a zstd shard read at random "
        f"('{command} {path} > {stem}.tar && tarindex compress {stem}.tar {stem}.tar.zst')",
    )


_LMDB_MAGIC = (0xBEEFC0DE).to_bytes(4, "little")  # an LMDB file's first meta page (an index), at byte 16
_TAR_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148))  # mode, uid, gid, size, mtime
_TAR_NUMBER = re.compile(rb"[0-7 \x00]*\Z")


def looks_like_shard(head: bytes) -> bool:
    """Whether ``head`` starts a shard, not an index: compressed in any recognised format, a tar header
    (ustar magic or a checksum that matches), an empty tar (a zero block, what ``tar cf x.tar
    --files-from /dev/null`` writes), or a damaged or cut tar header (its numeric fields octal, no
    LMDB meta page): the tar walk then names what is wrong with it, rather than the index reader."""
    if detect(head) != "tar":
        return True
    if head[16:20] == _LMDB_MAGIC:
        return False
    if len(head) >= 512:
        if head[257:262] == b"ustar" or not any(head[:512]):
            return True
        try:  # an old-style (v7) header: its checksum field matches its bytes
            stored = int(head[148:156].split(b"\x00", 1)[0].strip() or b"-1", 8)
        except ValueError:
            stored = -1
        if stored == sum(head[:148]) + 256 + sum(head[156:512]):
            return True
    return len(head) >= 148 and head.find(b"\x00", 0, 100) > 0 and all(
        _TAR_NUMBER.match(head, a, b) and any(head[a:b]) for a, b in _TAR_NUMBERS
    )


def looks_like_index(head: bytes) -> bool:
    """Whether ``head`` starts an LMDB file (the container of a tarindex index), which no shard is."""
    return head[16:20] == _LMDB_MAGIC and not looks_like_shard(head)


def sniff_file(path: str | os.PathLike[str]) -> bytes:
    """The first :data:`HEAD_BYTES` of a local file (fewer if it is shorter)."""
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES)


Frames = list[tuple[int, int, int, int]]
Walk = Callable[[Iterable[Any], str, "Frames | None", "list[bytes] | None", "ArchiveEnd | None"], Iterator[bytes]]
"""``(compressed chunks, shard name, frames, points, end)`` -> the tar bytes; ``frames`` collects a zstd
stream's frame table, ``points`` a gzip stream's seek points, ``end`` (set once the tar has ended) bounds
what is decompressed after it (see :class:`tarindex.compression.ArchiveEnd`)."""


@dataclass(frozen=True, slots=True, eq=False)
class Codec:
    """One row of the registry (a row is its own identity: rows key tables of per-codec steps)."""

    name: Literal["tar", "zstd", "gzip"]
    """What :func:`detect` names it."""
    compression: str | None
    """What an index entry records (``ShardInfo.compression``): ``None`` for a plain tar."""
    walk: Walk | None
    """The stream walk: the tar bytes of the shard's compressed chunks; ``None``: the chunks are the tar
    (the C walk may then read the file, socket or pipe itself)."""
    frame_table: bool = False
    """Whether the index keeps the shard's frame table (``ShardTable.frames``)."""
    one_pass: bool = False
    """Whether many samples of one shard are read in one pass over it rather than one by one (each
    random read would decompress from a seek point)."""
    suffixes: tuple[str, ...] = ()
    """The name endings of shards in this codec (lower case): a glob's match with one is a shard, unread; what
    ``tarindex compress`` replaces in an output name; what ``pack`` writes by."""

    compressed: bool = field(init=False)
    """Whether the stored bytes are not the tar itself (a field, so that asking it runs no code)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compressed", self.walk is not None)


# A codec's module is imported when its walk first runs: detection (below the index reader, the CLI's `info`,
# pattern expansion) stays free of numpy and zstandard.


def _zstd_walk(chunks: Iterable[Any], path: str, frames: Frames | None, points: list[bytes] | None, end: ArchiveEnd | None) -> Iterator[bytes]:
    from .zstd import decompress_frames

    return decompress_frames(chunks, path, frames, end=end)


def _gzip_walk(chunks: Iterable[Any], path: str, frames: Frames | None, points: list[bytes] | None, end: ArchiveEnd | None) -> Iterator[bytes]:
    from .gzip import decompress_gzip
    from .gzip_random import decompress_indexed

    return decompress_gzip(chunks, path, end=end) if points is None else decompress_indexed(chunks, path, points, end=end)


TAR = Codec("tar", None, None, suffixes=(".tar",))
ZSTD = Codec("zstd", "zstd", _zstd_walk, frame_table=True, suffixes=(".tar.zst", ".tar.zstd", ".tzst"))
GZIP = Codec("gzip", "gzip", _gzip_walk, one_pass=True, suffixes=(".tar.gz", ".tgz"))

CODECS: tuple[Codec, ...] = (TAR, ZSTD, GZIP)
"""The registry: every codec a shard may be stored in."""

_BY_NAME: dict[str, Codec] = {c.name: c for c in CODECS}
SUFFIXES: tuple[str, ...] = tuple(s for c in CODECS for s in c.suffixes)
"""Every row's name endings."""
BY_ENTRY: dict[str | None, Codec] = {c.compression: c for c in CODECS}
"""The row of what an index entry records (``ShardInfo.compression``); a value no row has is not a key."""


def of_head(head: bytes, path: str) -> Codec:
    """The codec of a shard that starts with ``head`` (:data:`HEAD_BYTES` of it).

    Raises:
        UnsupportedCompressionError: bzip2, xz, lzma, lzip, lz4 or Unix compress, naming the conversion command.
    """
    return _BY_NAME[codec_of(head, path)]


def stores_tar(compression: str | None) -> bool:
    """Whether an index entry recording ``compression`` (``ShardInfo.compression``) stores its tar as is (its row
    is not compressed), so that its records are offsets into the stored bytes; ``False`` for a value no row has."""
    row = BY_ENTRY.get(compression)
    return row is not None and not row.compressed


def of_suffix(name: str) -> Codec | None:
    """The row whose suffix ``name`` ends with (case ignored), or ``None``; a name says what its writer should
    write, never what a shard is (that is its first bytes, :func:`of_head`)."""
    lower = name.lower()
    return next((c for c in CODECS if lower.endswith(c.suffixes)), None)


def of_name(name: str) -> Codec | None:
    """The row of a codec as :func:`detect` names it, or ``None`` (a format not read)."""
    return _BY_NAME.get(name)


def sniffed(head: bytes) -> Codec:
    """The codec of a stream's first bytes, never raising: a format not read is taken for a plain tar (whose
    walk then names what is wrong)."""
    return _BY_NAME.get(detect(head), TAR)

