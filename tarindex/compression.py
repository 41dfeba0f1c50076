"""The bounds every decompression of a shard honours (zstd and gzip, streaming and indexing): the expansion
ratio (:class:`Limits`, :class:`Budget`) and what is decompressed after the tar ends (:class:`ArchiveEnd`).

Which codec a shard's bytes are in is the codec registry's answer (:mod:`tarindex._codecs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DecompressionLimitError

__all__ = ["Limits", "limits", "set_limits"]  # public: the bounds of every decompression (docs/compression.md)

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

    def bound(self, compressed: int) -> int:
        """The most bytes ``compressed`` bytes may decompress to (what a :class:`Budget` allows a whole stream)."""
        return max(self.ratio_floor, int(self.max_ratio * compressed))


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
