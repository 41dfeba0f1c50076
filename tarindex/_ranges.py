"""Byte ranges of a random reader: neighbours merged into one read (:func:`coalesce`), and the batch read every
reader without a batch path of its own has (:class:`ReadsEach`: one ``read_at`` per range)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


class ReadAt(Protocol):
    """Anything with ``read_at(offset, size)`` and ``close()``: a compressed shard read at random, under the
    zstd and gzip readers (the full seam is :class:`tarindex.access.reader.RandomReader`)."""

    def read_at(self, offset: int, size: int) -> bytes: ...

    def close(self) -> None: ...


def coalesce(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int, list[int]]]:
    """Merge ``(offset, size)`` ranges of one object whose gap is at most ``gap`` bytes.

    Returns ``(start, end, members)`` per request, ``members`` the indices into ``ranges`` it serves;
    requests in offset order. Overlapping and repeated ranges share a request.
    """
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    out: list[tuple[int, int, list[int]]] = []
    for k in order:
        offset, size = ranges[k]
        if out and offset - out[-1][1] <= gap:
            start, end, members = out[-1]
            out[-1] = (start, max(end, offset + size), [*members, k])
        else:
            out.append((offset, offset + size, [k]))
    return out


class ReadsEach:
    """``read_many`` as one ``read_at`` per range, in order: the readers whose reads are decompressions (zstd,
    gzip), where the work is the frames or the inflate, not the number of calls."""

    __slots__ = ()

    if TYPE_CHECKING:

        def read_at(self, offset: int, size: int) -> bytes: ...

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """``[read_at(offset, size) for offset, size in ranges]``.

        Raises:
            Whatever :meth:`read_at` raises, for the first range that fails.
        """
        return [self.read_at(offset, size) for offset, size in ranges]
