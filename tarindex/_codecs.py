"""The codec registry: every way a shard's tar bytes may be stored (plain, zstd, gzip), one row each.

A row names the codec (as :func:`tarindex.compression.detect` names it and as an index entry records it in
``ShardInfo.compression``), gives its stream walk (the decompression of a shard's bytes read in order, which
streaming, building and rewriting use) and says what the index keeps of it (a frame table, seek points).
Modules above this layer attach their per-codec step to the rows: the index scan of a local file
(:data:`tarindex.scan.LOCAL_SCANS`) and the random reader (:data:`tarindex.access.codecs.CODECS`); a test
checks that every row has both. No other module compares codec names: it asks this table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .compression import ArchiveEnd, codec_of, detect
from .gzip import decompress_gzip
from .gzip_random import decompress_indexed
from .zstd import decompress_frames

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Frames = list[tuple[int, int, int, int]]
Walk = Callable[[Iterable[Any], str, "Frames | None", "list[bytes] | None", "ArchiveEnd | None"], Iterator[bytes]]
"""``(compressed chunks, shard name, frames, points, end)`` -> the tar bytes; ``frames`` collects a zstd
stream's frame table, ``points`` a gzip stream's seek points, ``end`` (set once the tar has ended) bounds
what is decompressed after it (see :class:`tarindex.compression.ArchiveEnd`)."""


@dataclass(frozen=True, slots=True, eq=False)
class Codec:
    """One row of the registry (a row is its own identity: rows key tables of per-codec steps)."""

    name: Literal["tar", "zstd", "gzip"]
    """What :func:`tarindex.compression.detect` names it."""
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

    @property
    def compressed(self) -> bool:
        """Whether the stored bytes are not the tar itself."""
        return self.walk is not None


def _zstd_walk(chunks: Iterable[Any], path: str, frames: Frames | None, points: list[bytes] | None, end: ArchiveEnd | None) -> Iterator[bytes]:
    return decompress_frames(chunks, path, frames, end=end)


def _gzip_walk(chunks: Iterable[Any], path: str, frames: Frames | None, points: list[bytes] | None, end: ArchiveEnd | None) -> Iterator[bytes]:
    return decompress_gzip(chunks, path, end=end) if points is None else decompress_indexed(chunks, path, points, end=end)


TAR = Codec("tar", None, None)
ZSTD = Codec("zstd", "zstd", _zstd_walk, frame_table=True)
GZIP = Codec("gzip", "gzip", _gzip_walk, one_pass=True)

CODECS: tuple[Codec, ...] = (TAR, ZSTD, GZIP)
"""The registry: every codec a shard may be stored in."""

_BY_NAME: dict[str, Codec] = {c.name: c for c in CODECS}
BY_ENTRY: dict[str | None, Codec] = {c.compression: c for c in CODECS}
"""The row of what an index entry records (``ShardInfo.compression``); a value no row has is not a key."""


def of_head(head: bytes, path: str) -> Codec:
    """The codec of a shard that starts with ``head`` (:data:`tarindex.compression.HEAD_BYTES` of it).

    Raises:
        UnsupportedCompressionError: bzip2, xz, lzma, lzip, lz4 or Unix compress, naming the conversion command.
    """
    return _BY_NAME[codec_of(head, path)]


def of_name(name: str) -> Codec | None:
    """The row of a codec as :func:`tarindex.compression.detect` names it, or ``None`` (a format not read)."""
    return _BY_NAME.get(name)


def sniffed(head: bytes) -> Codec:
    """The codec of a stream's first bytes, never raising: a format not read is taken for a plain tar (whose
    walk then names what is wrong)."""
    return _BY_NAME.get(detect(head), TAR)

