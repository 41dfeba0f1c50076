"""Types of the optional C extension (tarindex/_speedups.c, _tarscan.c, _zstdread.c)."""

from collections.abc import Callable
from typing import Any

class Reader:
    def __init__(
        self,
        record_offset: memoryview,
        records: memoryview,
        stride: int,  # record i at i * stride; 0: at record_offset[i]
        n: int,
        exts: tuple[str, ...],
        urls: tuple[str, ...],
        opener: Any,  # tarindex.opener.ShardOpener: tables fds, handles, busy; open(shard), reap()
        fallback: Callable[[int], dict[str, Any]],
        error: Callable[[str, int, str], BaseException],
        fork: list[int],  # tarindex._process.FORK: a reader made in another generation hands reads to fallback
    ) -> None: ...
    def read(self, i: int) -> dict[str, Any]: ...

def scan_headers(
    buf: Any, pos: int, base: int, with_data: bool, limit: int
) -> tuple[list[tuple[str, int, int, int, bytes | None]], int, int, int]: ...
class Packer:
    """Tables mode: ``Packer(sample_key, duplicate)``; sample-dict mode: ``Packer(sample_key, duplicate, url, index)``."""

    def __init__(
        self,
        sample_key: Callable[[str], tuple[str, str] | None],
        duplicate: Callable[[int, str, str, str], BaseException],
        url: str = ...,
        index: int | None = ...,
    ) -> None: ...
    def scan(self, buf: Any, pos: int, base: int, limit: int = ..., /) -> tuple[int, int, int]: ...
    def scan_file(self, fd: int, offset: int, size: int, limit: int, buf: Any, pos: int, /) -> tuple[int, int, int]: ...
    def add(self, name: str, header_offset: int, offset: int, size: int, data: bytes = ..., /) -> None: ...
    def take(self) -> list[tuple[int, dict[str, Any]]]: ...
    def finish(
        self,
    ) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray, list[str], list[str]] | None: ...
