"""Opening indexed shards for random reads: the handle kinds and the checks made at open.

A handle is an ``int`` descriptor (a plain local shard, or a decompressed copy of a zstd shard in
an opt-in cache) or an object with ``read_at(offset, size)`` (:class:`tarindex.zstd_random.ZstdShardReader`
or the C ``ZstdReader``; :class:`tarindex.sources.RangeReader` for URL shards).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CorruptFrameError, IndexFormatError, RandomAccessError, StaleIndexError
from .index.format import ShardInfo
from .sources import RangeReader
from .zstd import MAP_SLICE, decompress_frames
from .zstd_random import ReadAt, zstd_reader

__all__ = ["close_handle", "fix_command", "open_url", "open_zstd_shard"]


def fix_command(path: str) -> str:
    """The command that rewrites ``path`` with sample-aligned frames."""
    return f"tarindex compress {path} {path}"


def open_url(url: str, info: ShardInfo, frames: np.ndarray | None = None) -> Any:
    """A ranged reader for a URL shard, checked against its index entry (size; mtime when both know one).

    A zstd shard (``info.compression``) is read through its frame table over the ranged reads
    (:func:`open_zstd_shard`): the reader hands out decompressed tar bytes, never compressed ones.

    Raises:
        StaleIndexError: the server's size or Last-Modified differs from the index.
        IndexFormatError: a zstd shard without a frame table in the index.
        RandomAccessError: a zstd shard of large frames (no local cache of decompressed URL shards).
    """
    reader = RangeReader(url)
    if reader.size >= 0 and reader.size != info.size:
        reader.close()
        raise StaleIndexError(url, f"size {info.size} -> {reader.size}")
    if reader.mtime_ns and info.mtime_ns and reader.mtime_ns != info.mtime_ns:
        reader.close()
        raise StaleIndexError(url, f"mtime {info.mtime_ns} -> {reader.mtime_ns}")
    if info.compression == "zstd":
        return open_zstd_shard(url, reader, info, frames)
    return reader


def close_handle(handle: Any) -> None:
    if type(handle) is int:
        os.close(handle)
    else:
        handle.close()


def open_zstd_shard(
    path: str,
    fd: int | ReadAt,
    info: ShardInfo,
    frames: np.ndarray | None,
    *,
    cache_dir: str | None = None,
    cache_bytes: int = 16 << 30,
) -> Any:
    """A handle for random reads of an indexed zstd shard: a :class:`ZstdShardReader`, or the
    ``int`` descriptor of a decompressed copy in ``cache_dir`` for a shard whose frames are too
    large to decompress per sample. Takes ownership of ``fd`` (a local descriptor, or any handle
    with ``read_at``, such as a URL's :class:`RangeReader`; only a local shard has a cached copy).

    Raises:
        IndexFormatError: the index has no frame table for the shard.
        RandomAccessError: the shard is one large frame and no ``cache_dir`` was given.
        CorruptArchiveError: the shard is corrupt or does not decompress to the indexed size.
    """
    if frames is None:
        close_handle(fd)
        raise IndexFormatError(f"{path}: the index has no zstd frame table for this shard; rebuild the index")
    if info.random_access:
        return zstd_reader(path, fd, frames)
    largest = int(frames[:, 3].max())
    if cache_dir is None or not isinstance(fd, int):
        close_handle(fd)
        raise RandomAccessError(
            path,
            f"{len(frames)} zstd frame(s), the largest {largest} bytes uncompressed: random access would "
            f"decompress that much per sample. Rewrite the shard with sample-aligned frames "
            f"('{fix_command(path)}') and rebuild the index, or opt in to a local cache of decompressed "
            f"shards with TarDataset(..., zstd_cache_dir=DIR)",
        )
    try:
        return _cached_copy(path, fd, info, frames, cache_dir, cache_bytes)
    finally:
        os.close(fd)


def _cached_copy(path: str, fd: int, info: ShardInfo, frames: np.ndarray, cache_dir: str, cache_bytes: int) -> int:
    """The descriptor of ``cache_dir/<fingerprint>.tar``, decompressing the shard there first if needed."""
    total = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0
    if total > cache_bytes:
        raise RandomAccessError(path, f"decompressed size {total} exceeds zstd_cache_bytes={cache_bytes}")
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{info.fingerprint}-{info.size}.tar"
    try:
        out = os.open(target, os.O_RDONLY)
    except FileNotFoundError:
        pass
    else:
        if os.fstat(out).st_size == total:
            os.utime(target)  # most recently used
            return out
        os.close(out)
    _evict(root, cache_bytes - total)
    tmp = root / f".{target.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            pieces = iter(lambda: os.read(fd, MAP_SLICE // 4), b"")
            os.lseek(fd, 0, os.SEEK_SET)
            for chunk in decompress_frames(pieces, path):
                f.write(chunk[: total - f.tell()])
                if f.tell() >= total:  # the indexed frames are written: what follows is padding
                    break
            written = f.tell()
        if written != total:
            raise CorruptFrameError(path, 0, f"decompresses to {written} bytes, the index says {total}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return os.open(target, os.O_RDONLY)


def _evict(root: Path, budget: int) -> None:
    """Delete least recently used ``*.tar`` files in ``root`` until they total at most ``budget`` bytes."""
    entries = []
    for p in root.glob("*.tar"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime_ns, st.st_size, p))
    used = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
        if used <= budget:
            break
        p.unlink(missing_ok=True)
        used -= size
