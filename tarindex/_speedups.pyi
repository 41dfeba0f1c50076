"""Types of the optional C extension (tarindex/_speedups.c, _batchio.c, _tarscan.c, _zstdread.c, _resample.c).

Checked against the compiled module by tests/test_native.py (every name, and the number of arguments of
every function and method); tarindex._native types the loaded module with these classes.
"""

from collections.abc import Callable, Sequence
from typing import Any

def init(*, index_format_error: type[Exception]) -> None:
    """The error classes the extension raises, handed in once (tarindex._native does)."""

def scan_headers(
    buf: Any, pos: int, base: int, with_data: bool, limit: int, /
) -> tuple[list[tuple[str, int, int, int, bytes | None]], int, int, int]: ...
def _libzstd(on: bool = ..., /) -> bool: ...
def resample(
    src: Any,  # uint8, C-contiguous, (H, W, C) or (H, W), 1 to 4 bands
    out: Any,  # uint8, C-contiguous, writable: (OH, OW, C), or (C, OH, OW) with planar
    box: tuple[float, float, float, float],  # (left, top, right, bottom) in src, as PIL's resize box
    filter: int,  # PIL.Image.Resampling: 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming
    planar: bool,
    vertical_first: bool,  # the pass order of the PIL compared with (tarindex._image._vertical_first)
    /,
) -> None: ...
def _readcheck(on: bool = ..., /) -> bool: ...
def _plain_body(name: str | None, /) -> bool: ...
def dali_lines(keys: list[bytes], exts: list[bytes], nmembers: Any, member_ext: Any, offsets: Any, sizes: Any, /) -> bytes:
    """DALI index lines, one per sample (int64 counts, uint16 extension numbers, uint64 offsets and sizes)."""

BLOCK_HEAD: int  # a record block's header (index/records.py HEADER.size)
READER_MAX_MEMBERS: int  # members of a sample the C reader reads; a sample with more goes to the Python path
TAR_BLOCK: int  # tarindex.tar.BLOCK
TAR_MAX_SIZE: int  # tarindex.tar.MAX_MEMBER_SIZE
TAR_WINDOW_LARGE: int  # tarindex.tar._WINDOW
TAR_WINDOW_SMALL: int  # tarindex.tar._SMALL_WINDOW

class Reader:
    def __init__(self, config: Any, /) -> None: ...  # a tarindex._native.ReaderConfig
    def read(self, i: int, /) -> dict[str, Any]: ...
    def read_batch(self, indices: Sequence[int], max_in_flight: int, coalesce_gap: int, /) -> list[dict[str, Any]]: ...

class Packer:
    """Tables mode: ``Packer(sample_key, duplicate)``; sample-dict mode: ``Packer(sample_key, duplicate, url, index)``."""

    def __init__(
        self,
        sample_key: Callable[[str], tuple[str, str] | None],
        duplicate: Callable[[int, str, str, str], BaseException],
        url: str = ...,
        index: int | None = ...,
        /,
    ) -> None: ...
    def scan(self, buf: Any, pos: int, base: int, limit: int = ..., max_member: int = ..., /) -> tuple[int, int, int]: ...
    def scan_file(
        self, fd: int, offset: int, size: int, limit: int, buf: Any, pos: int, max_member: int = ..., /
    ) -> tuple[int, int, int]: ...
    def scan_fd(
        self, fd: int, timeout_ms: int, remaining: int, limit: int, buf: Any, pos: int, base: int, max_member: int = ..., /
    ) -> tuple[int, bytes, int, int, int, int, bool]: ...
    def add(self, name: str, header_offset: int, offset: int, size: int, data: bytes = ..., /) -> None: ...
    def take(self) -> tuple[list[int], list[dict[str, Any]]]: ...
    def finish(
        self,
    ) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray, list[str], list[str]]: ...  # sample-dict mode: None (its samples come through take())

class FrameCache:
    max_bytes: int
    def __init__(self, max_bytes: int) -> None: ...
    @property
    def limit(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def decompressed(self) -> int: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...

class ZstdReader:
    def __init__(
        self,
        path: str,
        source: int | Any,  # a descriptor, or a handle with read_at(offset, size)
        frames: Any,  # uint64[n, 4]: compressed offset and size, decompressed offset and size
        decompressor: Callable[[], Any],  # zstandard.ZstdDecompressor
        error: type[BaseException],  # CorruptFrameError
        zstd_error: type[BaseException],  # zstandard.ZstdError
        cache: FrameCache,
    ) -> None: ...
    @property
    def fd(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    def fileno(self) -> None: ...
    def read_at(self, offset: int, size: int, /) -> bytes: ...
    def close(self) -> None: ...
