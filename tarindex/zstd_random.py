"""Random reads of zstd shards through their frame tables, and the per-process cache of decompressed frames.

:class:`ZstdShardReader` (the Python reference) and the C extension's ``ZstdReader`` read any
decompressed byte range of an indexed zstd shard: the frames that hold it are read from the shard
(``pread`` on a local descriptor, or ``read_at`` of any random-read handle, such as
:class:`tarindex.sources.RangeReader` for a shard indexed from a URL), checked against the frame
table, decompressed whole (checksum verified) and sliced. Neither maps the shard: a shard that
shrinks under a reader is a :class:`~tarindex.errors.CorruptFrameError`, never a ``SIGBUS``.
"""

from __future__ import annotations

import array
import bisect
import functools
import itertools
import os
from collections import OrderedDict
from typing import Any

import numpy as np
import zstandard

from . import _native
from ._process import FORK
from ._ranges import ReadAt, ReadsEach
from .errors import CorruptFrameError
from .zstd import decompress_frame

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


SEED_BYTES = 4 << 20
"""A frame cache's first length; it grows towards ``max_bytes`` by half the bytes its hits serve."""


class FrameCache:
    """Decompressed frames, bounded in bytes, least recently used dropped first; one per process (see :func:`frame_cache`).

    Holding a frame costs fresh memory, whose page faults can cost more than
    decompressing the frame again, so the bound in force (``limit``) starts at
    :data:`SEED_BYTES` and grows by half the bytes that hits serve, up to
    ``max_bytes``: the cache grows only as fast as it pays for itself.
    ``decompressed`` counts the bytes that readers decompressed through it
    (their admission test, see :meth:`ZstdShardReader.frame`).
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self.limit = min(max_bytes, SEED_BYTES)
        self.hit_bytes = 0
        self.bytes = 0
        self.decompressed = 0
        self._items: OrderedDict[tuple[Any, int], bytes] = OrderedDict()

    @property
    def max_bytes(self) -> int:
        """The bound (0: keep nothing); setting another value empties the cache."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        if value < 0:
            raise ValueError("max_bytes must be >= 0")
        if value != self._max_bytes:
            self.clear()
            self._max_bytes = value
            self.limit = min(value, SEED_BYTES)
            self.hit_bytes = 0

    def get(self, key: tuple[Any, int]) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
            self.hit_bytes += len(data)
            self.limit = max(self.limit, min(self._max_bytes, SEED_BYTES + self.hit_bytes // 2))
        return data

    def put(self, key: tuple[Any, int], data: bytes) -> None:
        if not data or len(data) > self.limit:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= len(old)
        self._items[key] = data
        self.bytes += len(data)
        while self.bytes > self.limit:
            _, dropped = self._items.popitem(last=False)
            self.bytes -= len(dropped)

    def clear(self) -> None:
        """Drop every frame."""
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)


_CACHE: Any = None
_CACHE_OF: tuple[int, Any] = (-1, None)  # the fork generation and the backend the cache was made in
DEFAULT_CACHE_BYTES = 64 << 20


def frame_cache() -> Any:
    """This process's cache of decompressed frames (64 MiB; set ``.max_bytes`` to change, 0 turns it off).

    With the C extension, a ``_speedups.FrameCache``: one ring of ``max_bytes``
    allocated at first use, oldest frames dropped first (see docs/zstd.md);
    without it, a :class:`FrameCache`. Both have ``max_bytes``, ``limit`` (the
    bound in force, growing from :data:`SEED_BYTES` as hits pay for it),
    ``bytes``, ``decompressed``, ``clear()`` and ``len()``.
    """
    global _CACHE, _CACHE_OF
    speedups = _native.SPEEDUPS
    if _CACHE is None or (FORK[0], speedups) != _CACHE_OF:  # a forked child starts with an empty cache
        _CACHE = (speedups.FrameCache if speedups is not None else FrameCache)(DEFAULT_CACHE_BYTES)
        _CACHE_OF = (FORK[0], speedups)
    return _CACHE


_pread = os.pread
_bisect_right = bisect.bisect_right
_REMOTE_KEYS = itertools.count()  # cache keys of readers over handles (no device and inode to name them)


class ZstdShardReader(ReadsEach):
    """``read_at(offset, size)`` over a zstd shard's decompressed bytes, through its frame table.

    Reads and decompresses only the frames that overlap the range, each whole
    (its checksum verified before any byte of it is returned). The frame
    decompressed last is remembered (consecutive samples of one frame: one
    decompression); other frames come from the per-process
    :func:`frame_cache`, which keeps a frame only when it was decompressed
    before, recently enough that a cache of its current ``limit`` holding
    every decompressed frame would still have it (a frame read whole for one
    range, such as a one-sample frame, is never kept). The C extension's ``ZstdReader`` does the same (see
    :func:`zstd_reader`).

    Args:
        path: the shard (used in errors).
        source: the compressed shard: an open file descriptor (read with ``pread``) or a handle
            with ``read_at`` (a URL's :class:`~tarindex.sources.RangeReader`); the reader owns it.
        frames: the shard's ``(n, 4)`` frame table.
    """

    def __init__(self, path: str, source: int | ReadAt, frames: np.ndarray) -> None:
        self.path = str(path)
        self._c_off = frames[:, 0].tolist()
        self._c_size = frames[:, 1].tolist()
        self._d_off = frames[:, 2].tolist()
        self._d_size = frames[:, 3].tolist()
        self.size = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0
        """The decompressed size in bytes (the frame table's end)."""
        self._source: ReadAt | None = None
        self._key: tuple[Any, ...]
        if isinstance(source, int):
            self.fd = source
            st = os.fstat(source)
            self._key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        else:
            self.fd = -1
            self._source = source
            self._key = ("handle", next(_REMOTE_KEYS))
        self._dctxs = [zstandard.ZstdDecompressor()]  # one per concurrent call: decompress lets other threads run
        self._seen = array.array("Q", bytes(8 * len(self._c_off)))  # per frame: the cache's clock after its last decompression
        self._last_k = -1
        self._last = b""

    def _compressed(self, c_off: int, c_size: int) -> bytes:
        """The compressed bytes of one frame, all of them.

        Raises:
            CorruptFrameError: the shard ends before the frame does (truncated since indexing).
        """
        if self._source is not None:
            raw = self._source.read_at(c_off, c_size)
        elif self.fd >= 0:
            raw = _pread(self.fd, c_size, c_off)
        else:
            raise ValueError("read from a closed zstd shard reader")
        if len(raw) != c_size:
            raise CorruptFrameError(
                self.path, c_off, f"truncated zstd frame ({len(raw)} of {c_size} bytes; the shard is shorter than indexed)"
            )
        return raw

    def frame(self, k: int, *, keep: bool = True) -> bytes:
        """Decompressed frame ``k`` (from the cache, or read and decompressed; cached if ``keep``).

        Raises:
            CorruptFrameError: the frame is truncated or corrupt, or decompresses
                to another size than the frame table says.
        """
        if k == self._last_k:
            return self._last
        cache: FrameCache = _CACHE if (FORK[0], _native.SPEEDUPS) == _CACHE_OF and _CACHE is not None else frame_cache()
        key = (self._key, k)
        data = cache.get(key)
        if data is not None:
            return data
        c_off, c_size, d_size = self._c_off[k], self._c_size[k], self._d_size[k]
        raw = self._compressed(c_off, c_size)
        dctxs = self._dctxs
        dctx = dctxs.pop() if dctxs else zstandard.ZstdDecompressor()
        try:
            data = decompress_frame(dctx, raw, d_size, self.path, c_off)
        finally:
            dctxs.append(dctx)
        self._last_k, self._last = k, data
        prev, before = self._seen[k], cache.decompressed
        cache.decompressed = self._seen[k] = before + d_size
        if keep and prev and before - prev + d_size <= cache.limit:  # reused, recently: worth keeping
            cache.put(key, data)
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` decompressed bytes from ``offset`` (fewer only at the end of the shard).

        Raises:
            CorruptFrameError: see :meth:`frame`.
        """
        d_off = self._d_off
        k = _bisect_right(d_off, offset) - 1
        if k < 0 or size <= 0:
            return b""
        start = offset - d_off[k]
        end = start + size
        whole = start == 0 and end >= self._d_size[k]  # a frame that holds just this range is not kept
        data = self.frame(k, keep=not whole)
        if end <= len(data):
            return data if whole and end == len(data) else data[start:end]
        parts = [data[start:]]
        need = size - len(parts[0])
        while need > 0 and k + 1 < len(d_off):
            k += 1
            data = self.frame(k)
            parts.append(data[:need])
            need -= len(parts[-1])
        return b"".join(parts)

    def fileno(self) -> None:
        """``None``: no descriptor's positional reads give these bytes (:class:`tarindex.access.reader.RandomReader`)."""
        return None

    def close(self) -> None:
        """Close the shard file or handle."""
        self._last_k, self._last = -1, b""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        source, self._source = self._source, None
        if source is not None:
            source.close()


def zstd_reader(path: str, source: int | ReadAt, frames: np.ndarray) -> Any:
    """A reader with ``read_at(offset, size)``, ``close()`` and ``fd`` over a zstd shard; takes ownership of ``source``.

    ``source`` is the compressed shard: an ``int`` descriptor or any handle with ``read_at``. The
    C extension's ``ZstdReader`` (same behaviour, errors included) when it is built, else
    :class:`ZstdShardReader`; both use :func:`frame_cache`.
    """
    speedups = _native.SPEEDUPS
    if speedups is None:
        return ZstdShardReader(path, source, frames)
    try:
        table = np.ascontiguousarray(frames, np.uint64)
        return _with_read_many(speedups.ZstdReader)(
            str(path), source, table, zstandard.ZstdDecompressor, CorruptFrameError, zstandard.ZstdError, frame_cache()
        )
    except BaseException:
        if isinstance(source, int):
            os.close(source)
        else:
            source.close()
        raise


@functools.cache
def _with_read_many(c_type: type) -> type:
    """The C extension's ``ZstdReader`` with :meth:`~tarindex._ranges.ReadsEach.read_many` (the C reader of
    ``ds[i]`` reads an instance of it directly, as one of the C type)."""
    doc = "A zstd shard's C reader (:func:`zstd_reader`) with ``read_many``."
    return type("ZstdReader", (c_type, ReadsEach), {"__slots__": (), "__module__": __name__, "__doc__": doc})
