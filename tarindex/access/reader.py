"""The random-read seam: what every reader of a shard's tar bytes offers, and the local one."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .._localbatch import NOWAIT, read_ranges
from ..options import DEFAULT_COALESCE_GAP, DEFAULT_MAX_IN_FLIGHT

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


@runtime_checkable
class RandomReader(Protocol):
    """Random reads of a shard's tar bytes (decompressed where the shard is compressed).

    Implemented by :class:`LocalReader`, the zstd readers (:func:`tarindex.zstd_random.zstd_reader`),
    :class:`tarindex.gzip_random.GzipShardReader`, :class:`tarindex.sources.RangeReader` (HTTP),
    :class:`tarindex.objstore.ObjectReader` and :class:`~tarindex.objstore.FsspecReader` (object stores, the
    hub, fsspec) and :class:`tarindex._blockcache.CachedReader`; ``tests/test_readers.py`` runs each through
    the same cases. ``read_many`` is each kind's batch path: a local file's is :func:`tarindex._localbatch.read_ranges`,
    remote readers' :func:`tarindex.objstore.read_many`, the decompressing readers' one ``read_at`` per range
    (:class:`tarindex._ranges.ReadsEach`).
    """

    @property
    def size(self) -> int:
        """The tar bytes' length (-1: unknown, a server that did not say)."""
        ...

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer only at the end)."""
        ...

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``[read_at(offset, size) for offset, size in ranges]``, read as a batch (in any order, together where
        the reader can); the same bytes and the same errors as :meth:`read_at`."""
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

    __slots__ = ("_fd", "_modes", "mtime_ns", "size")

    def __init__(self, fd: int, size: int, mtime_ns: int = 0) -> None:
        self._fd = fd
        self.size = size
        self.mtime_ns = mtime_ns
        """The file's modification time at open (0: not asked)."""
        self._modes = [NOWAIT]  # how the file's batches read (tarindex._localbatch), learned by the first ones

    def read_at(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The ranges as ``TarDataset.__getitems__`` reads a local batch (:func:`tarindex._localbatch.read_ranges`:
        neighbours merged, the page cache's at once, the rest by the read pool).

        Raises:
            OSError: a read failed (the first range's error that did).
        """
        got = read_ranges(
            [(self._fd, 0, offset, size) for offset, size in ranges],
            self._modes,
            max_in_flight=DEFAULT_MAX_IN_FLIGHT,
            coalesce_gap=DEFAULT_COALESCE_GAP,
        )
        out: list[bytes] = []
        for data in got:
            if isinstance(data, OSError):
                raise data
            out.append(data)
        return out

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
