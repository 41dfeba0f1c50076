"""The random-read seam: what every reader of a shard's tar bytes offers, and the local one."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


@runtime_checkable
class RandomReader(Protocol):
    """Random reads of a shard's tar bytes (decompressed where the shard is compressed).

    Implemented by :class:`LocalReader`, the zstd readers (:func:`tarindex.zstd_random.zstd_reader`),
    :class:`tarindex.gzip_random.GzipShardReader`, :class:`tarindex.sources.RangeReader` (HTTP),
    :class:`tarindex.objstore.ObjectReader` and :class:`~tarindex.objstore.FsspecReader` (object stores, the
    hub, fsspec) and :class:`tarindex._blockcache.CachedReader`; ``tests/test_readers.py`` runs each through
    the same cases.
    """

    @property
    def size(self) -> int:
        """The tar bytes' length (-1: unknown, a server that did not say)."""
        ...

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer only at the end)."""
        ...

    def fileno(self) -> int | None:
        """A descriptor whose positional reads give these same bytes (a plain local shard), else ``None``:
        the C reader then reads it with ``pread`` without a call."""
        ...

    def close(self) -> None:
        """Release the reader's descriptor or connections."""
        ...


class LocalReader:
    """``os.pread`` of a local descriptor of ``size`` bytes, which it owns from here on.

    Args:
        fd: the open descriptor (a plain shard, or a decompressed copy in the zstd cache).
        size: the file's size in bytes.
    """

    __slots__ = ("_fd", "mtime_ns", "size")

    def __init__(self, fd: int, size: int, mtime_ns: int = 0) -> None:
        self._fd = fd
        self.size = size
        self.mtime_ns = mtime_ns
        """The file's modification time at open (0: not asked)."""

    def read_at(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def fileno(self) -> int:
        return self._fd

    def detach(self) -> int:
        """The descriptor, no longer owned by this reader (its new owner closes it)."""
        fd, self._fd = self._fd, -1
        return fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __repr__(self) -> str:
        return f"LocalReader(fd={self._fd}, size={self.size})"
