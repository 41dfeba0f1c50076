"""zstd shards: detection by content and streaming decompression.

Detection looks at the first bytes, never at the file name: a zstd frame
starts with ``28 B5 2F FD``; a skippable frame (``pzstd`` puts one before
every frame) with ``5? 2A 4D 18``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import zstandard

from .errors import CorruptArchiveError

__all__ = ["ZSTD_MAGIC", "is_zstd", "iter_decompressed"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SKIPPABLE_MASK = 0xFFFFFFF0
_SKIPPABLE_MAGIC = 0x184D2A50
_OUT_CHUNK = 4 << 20


def is_zstd(head: bytes) -> bool:
    """Whether ``head`` (the first 4 or more bytes of a file) starts a zstd stream."""
    if head[:4] == ZSTD_MAGIC:
        return True
    return len(head) >= 4 and int.from_bytes(head[:4], "little") & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC


def iter_decompressed(chunks: Iterable[bytes], path: str) -> Iterator[bytes]:
    """Decompress a zstd stream given as chunks, frame after frame (skippable frames ignored).

    Raises:
        CorruptArchiveError: the data is not valid zstd, or the input ends inside a frame;
            the offset is the compressed offset of the frame at fault.
    """
    dctx = zstandard.ZstdDecompressor()
    obj = dctx.decompressobj()
    frame_start = 0  # compressed offset of the frame being decompressed
    fed = 0  # compressed bytes given to the current frame's decompressor
    try:
        for chunk in chunks:
            data = chunk
            while data:
                out = obj.decompress(data)
                if out:
                    yield out
                if not obj.eof:
                    fed += len(data)
                    break
                rest = obj.unused_data
                frame_start += fed + len(data) - len(rest)
                fed = 0
                obj = dctx.decompressobj()
                data = rest
    except zstandard.ZstdError as exc:
        raise CorruptArchiveError(path, frame_start, f"corrupt zstd frame ({exc})") from exc
    if fed:
        raise CorruptArchiveError(path, frame_start, "truncated zstd stream: the input ends inside a frame")
