"""The random readers of the codec registry (:mod:`tarindex._codecs`): for each way a shard's tar bytes are
stored (plain, zstd, gzip), how its random reader is made over the compressed shard's bytes.

:data:`RANDOM` is the table (a registry row -> its random reader); :func:`codec` answers "which codec is this shard?" from its index entry
(``ShardInfo.compression``) or, for a shard read without an index, from its first bytes. Adding a codec is
a row in :mod:`tarindex._codecs`, its random reader here (its reader module beside
:mod:`tarindex.zstd_random` and :mod:`tarindex.gzip_random`), and its name in :func:`tarindex._codecs.detect`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np

from .._codecs import BY_ENTRY, GZIP, TAR, ZSTD, Codec, detect, of_name
from .._filecache import FileCache
from ..compression import limits
from ..errors import CorruptFrameError, IndexFormatError, RandomAccessError
from ..gzip import random_access_refused
from ..gzip_random import GzipShardReader, SeekPoints
from ..shards import is_fingerprint
from ..tables import ShardInfo
from ..zstd import MAP_SLICE, decompress_frames, random_access, seek_table_frames
from ..zstd_random import zstd_reader
from .reader import LocalReader, RandomReader

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


class IndexTables(Protocol):
    """What a codec's reader needs from the index beside the shard's entry (an :class:`tarindex.index.reader.IndexReader`)."""

    @property
    def path(self) -> os.PathLike[str]: ...

    @property
    def shards(self) -> Sequence[ShardInfo]: ...

    def frame_table(self, shard: int) -> np.ndarray | None: ...

    def gzip_points(self, shard: int) -> bytes | memoryview | None: ...


@dataclass(frozen=True, slots=True)
class Indexed:
    """An indexed shard: its index and number; its entry is read from the index when first asked for."""

    index: IndexTables
    """The index that holds the shard (its frame table and seek points, its path for errors)."""
    shard: int
    """The shard's number in the index."""

    @property
    def info(self) -> ShardInfo:
        """The shard's index entry (its record block decoded on first use, by the index)."""
        return self.index.shards[self.shard]


@dataclass(frozen=True, slots=True)
class ZstdCache:
    """The opt-in local cache of decompressed zstd shards (``TarDataset(zstd_cache_dir=...)``)."""

    directory: str | None = None
    """Where decompressed copies are kept; ``None``: no cache (a shard of large frames is refused)."""
    max_bytes: int = 16 << 30
    """The cache's bound in bytes (least recently used copies deleted)."""


Wrap = Callable[[str, RandomReader, "Indexed | None", ZstdCache], RandomReader]
"""A codec's random reader of the tar bytes, made over the compressed shard's reader, which it takes (closed on
failure by the caller): ``(name, raw, indexed, zstd cache)``."""


def fix_command(path: str) -> str:
    """The command that rewrites ``path`` with sample-aligned frames."""
    return f"tarindex compress {path} {path}"


def _plain(name: str, raw: RandomReader, indexed: Indexed | None, cache: ZstdCache) -> RandomReader:
    return raw


def _zstd(name: str, raw: RandomReader, indexed: Indexed | None, cache: ZstdCache) -> RandomReader:
    """Through the index's frame table (checked entry), or the shard's own seek table without an index.

    Raises:
        IndexFormatError: the index has no frame table for the shard.
        RandomAccessError: the shard's frames are too large to decompress per sample (and no cache), or,
            without an index, it has no seek table of several frames.
        CorruptArchiveError: the cached copy does not decompress to the indexed size.
    """
    if indexed is None:
        frames = seek_table_frames(raw.read_at, raw.size, name)
        if frames is None or len(frames) < 2 or not random_access(frames):
            raise RandomAccessError(name, "no seek table of sample-sized zstd frames: read from the start")
        return _zstd_reader(name, raw, frames)
    frames = indexed.index.frame_table(indexed.shard)
    if frames is None:
        raise IndexFormatError(f"{name}: the index has no zstd frame table for this shard; rebuild the index")
    if indexed.info.random_access:  # a read decompresses one frame, within the bound the index reader checked
        return _zstd_reader(name, raw, frames)
    _check_expansion(indexed, frames)
    largest = int(frames[:, 3].max())
    directory = cache.directory
    if directory is None or raw.fileno() is None:
        raise RandomAccessError(
            name,
            f"{len(frames)} zstd frame(s), the largest {largest} bytes uncompressed: random access would "
            f"decompress that much per sample. Rewrite the shard with sample-aligned frames "
            f"('{fix_command(name)}') and rebuild the index, or opt in to a local cache of decompressed "
            f"shards with TarDataset(..., zstd_cache_dir=DIR)",
        )
    reader = _cached_copy(name, raw, indexed.info, frames, cache, directory)
    raw.close()
    return reader


def _check_expansion(indexed: Indexed, frames: np.ndarray) -> None:
    """A shard decompressed whole (to the cache) must stay within the expansion its scan allowed.

    Raises:
        IndexFormatError: the frame table's total exceeds :meth:`tarindex.compression.Limits.bound` of the
            shard's size (a crafted table: the scan refuses such a shard).
    """
    size = indexed.info.size
    total, bound = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0, limits().bound(size)
    if total > bound:
        raise IndexFormatError(
            f"{os.fspath(indexed.index.path)}: the frame table of shard {indexed.shard} is damaged ({total} bytes "
            f"decompressed from {size}, more than the {bound} the scan allows); rebuild the index"
        )


def _zstd_reader(name: str, raw: RandomReader, frames: np.ndarray) -> RandomReader:
    """The zstd reader (C or Python) over ``raw``: a local shard's descriptor is read with ``pread`` by it."""
    source = raw.detach() if isinstance(raw, LocalReader) else raw
    reader: RandomReader = zstd_reader(name, source, frames)
    return reader


def _gzip(name: str, raw: RandomReader, indexed: Indexed | None, cache: ZstdCache) -> RandomReader:
    """Through the index's seek points.

    Raises:
        RandomAccessError: no index, or it holds no seek points for the shard (indexed before they existed).
        IndexFormatError: the seek-point table is damaged or crafted (:class:`~tarindex.gzip_random.SeekPoints`).
    """
    points = indexed.index.gzip_points(indexed.shard) if indexed is not None else None
    if indexed is None or points is None:
        raise random_access_refused(name)
    where = f"{os.fspath(indexed.index.path)}: the gzip seek points of {name}"
    return GzipShardReader(name, raw, SeekPoints(points, where, size=indexed.info.size))


RANDOM: dict[Codec, Wrap] = {TAR: _plain, ZSTD: _zstd, GZIP: _gzip}
"""The random reader of every row of the codec registry (:data:`tarindex._codecs.CODECS`, in its order)."""


def codec(indexed: Indexed | None, raw: RandomReader) -> Codec:
    """The registry's row of a shard: its index entry's, or (no index) its first bytes'; its random reader is
    ``RANDOM[row]``.

    Raises:
        IndexFormatError: the entry records a compression the registry does not know.
        RandomAccessError: without an index, bytes of no codec in the registry (xz, bzip2, not a tar).
    """
    if indexed is not None:
        row = BY_ENTRY.get(indexed.info.compression)
        if row is None:
            raise IndexFormatError(
                f"{indexed.index.path}: shard {indexed.info.path!r} records compression {indexed.info.compression!r}"
            )
        return row
    name = detect(raw.read_at(0, 6)) if raw.size != 0 else TAR.name
    found = of_name(name)
    if found is None:
        raise RandomAccessError("shard", f"{name} data: read from the start")
    return found


ZSTD_CACHE_ENTRY = r"[0-9a-f]{32}-[0-9]+\.tar"
"""Entries of the decompressed-shard cache: ``<fingerprint>-<compressed size>.tar``."""


def _cached_copy(
    path: str, raw: RandomReader, info: ShardInfo, frames: np.ndarray, cache: ZstdCache, directory: str
) -> LocalReader:
    """The shard's decompressed copy in the cache, decompressing it first if needed.

    Raises:
        RandomAccessError: the decompressed size exceeds the cache's bound.
        IndexFormatError: the index's fingerprint or size of the shard is damaged.
        CorruptFrameError: the shard does not decompress to the indexed size.
    """
    total = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0
    if total > cache.max_bytes:
        raise RandomAccessError(path, f"decompressed size {total} exceeds zstd_cache_bytes={cache.max_bytes}")
    if not is_fingerprint(info.fingerprint) or type(info.size) is not int or info.size < 0:
        raise IndexFormatError(
            f"{path}: the index's fingerprint {info.fingerprint!r} or size {info.size!r} is damaged; rebuild the index"
        )
    files = FileCache(directory, "zstd", ZSTD_CACHE_ENTRY, cache.max_bytes)
    name = f"{info.fingerprint}-{info.size}.tar"
    found = files.open(name, total)
    if found is None:

        def fill(f: BinaryIO) -> None:
            step = MAP_SLICE // 4
            pieces = (raw.read_at(at, step) for at in range(0, raw.size, step))
            for chunk in decompress_frames(pieces, path):
                f.write(chunk[: total - f.tell()])
                if f.tell() >= total:  # the indexed frames are written: what follows is padding
                    break
            if f.tell() != total:
                raise CorruptFrameError(path, 0, f"decompresses to {f.tell()} bytes, the index says {total}")

        found = files.add(name, total, fill)
    return LocalReader(found, total)
