"""Compression of shards, detected by content: which codec reads a shard, a named refusal for the
formats tarindex does not read, and the bounds every decompression honours.

A shard's first bytes say what it is, whatever its name: a zstd frame (data or skippable), a gzip
member, or a tar header. bzip2, xz, lzma (LZMA-alone), lzip, lz4 (skippable frames first too) and
Unix ``compress`` are recognised too, and refused with an
:class:`~tarindex.errors.UnsupportedCompressionError` naming the file, the format and the command
that converts it, never "not a tar archive", "not a zstd frame" or "bad header checksum".
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from .errors import DecompressionLimitError, UnsupportedCompressionError

__all__ = ["Limits", "limits", "set_limits"]  # public: the bounds of every decompression (docs/compression.md)

Codec = Literal["tar", "zstd", "gzip", "bzip2", "xz", "lzma", "lzip", "lz4", "compress"]
"""What a shard's first bytes say it is (``"tar"``: no compression recognised)."""

HEAD_BYTES = 512
"""Bytes of a shard's start that :func:`detect` and :func:`looks_like_shard` look at."""

_ZSTD = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE = 0xFFFFFFF0, 0x184D2A50  # zstd's skippable frames, which are lz4's too
_LZ4_FRAME = b"\x04\x22\x4d\x18"
_MAGICS: tuple[tuple[bytes, Codec], ...] = (
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


def detect(head: bytes) -> Codec:
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


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that every decompression of a shard honours (zstd and gzip, streaming and indexing).

    A stream whose output passes ``ratio_floor`` bytes and exceeds ``max_ratio`` times the
    compressed bytes read so far raises :class:`~tarindex.errors.DecompressionLimitError`; after
    the end-of-archive marker at most ``padding`` more bytes are decompressed (what proves the rest
    is padding costs no more than that; the compressed rest is read, not decompressed).
    """

    max_ratio: float = 1024.0
    """Most decompressed bytes per compressed byte over a stream (zstd reaches ~32,000 on zeros)."""
    ratio_floor: int = 64 << 20
    """Output below which the ratio is not checked (small, very compressible shards are fine)."""
    padding: int = 1 << 20
    """Decompressed bytes past the end-of-archive marker that are still decompressed."""


_LIMITS = Limits()


def limits() -> Limits:
    """The bounds in force (see :class:`Limits`)."""
    return _LIMITS


def set_limits(value: Limits) -> Limits:
    """Set the bounds for this process (new decompressions use them); returns the previous ones."""
    global _LIMITS
    previous, _LIMITS = _LIMITS, value
    return previous


class ArchiveEnd:
    """Shared by a tar walk and the decompressor that feeds it (possibly in another thread).

    The walk calls :meth:`set` once it has seen the end-of-archive marker; the decompressor then
    decompresses at most :attr:`Limits.padding` more bytes and passes over the rest of the
    compressed input without decompressing it (``skipped`` says it did).
    """

    __slots__ = ("partial", "reached", "skipped")

    def __init__(self) -> None:
        self.reached = False
        self.skipped = False
        self.partial = False
        """Whether the decompressor stopped inside a frame (its table row then holds what was decompressed)."""

    def set(self) -> None:
        """The tar stream has ended: what follows is padding."""
        self.reached = True


class Budget:
    """The bounds of one decompression: the expansion ratio, and the padding after the end of the archive.

    Args:
        path: the shard (used in errors).
        end: the walk's :class:`ArchiveEnd`, if it reports one.
    """

    __slots__ = ("_after_end", "_limits", "end", "out", "path")

    def __init__(self, path: str, end: ArchiveEnd | None = None) -> None:
        self.path = path
        self.end = end
        self.out = 0
        self._limits = limits()
        self._after_end = -1

    def spend(self, n: int, compressed: int) -> None:
        """Account ``n`` more decompressed bytes; ``compressed``: compressed bytes read so far.

        Raises:
            DecompressionLimitError: the output exceeds the expansion ratio.
        """
        self.out += n
        lim = self._limits
        if self.end is not None and self.end.reached:  # past the end of the archive: bounded by the padding
            return
        if self.out > lim.ratio_floor and self.out > lim.max_ratio * max(compressed, 1):
            raise DecompressionLimitError(
                self.path,
                compressed,
                f"decompresses to more than {lim.max_ratio:g} times its compressed size ({self.out} bytes from "
                f"{compressed}): a decompression bomb, or a shard that needs a larger bound "
                f"(tarindex.compression.set_limits(Limits(max_ratio=...)))",
            )

    def padding_done(self) -> bool:
        """Whether the end of the archive was reached and the padding after it has been decompressed."""
        end = self.end
        if end is None or not end.reached:
            return False
        if self._after_end < 0:
            self._after_end = self.out
        if self.out - self._after_end < self._limits.padding:
            return False
        end.skipped = True
        return True
