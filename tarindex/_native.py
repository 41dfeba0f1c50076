"""The typed C boundary: the optional C extension (``tarindex._speedups``: _speedups.c, _tarscan.c,
_zstdread.c, _resample.c) as :class:`Speedups`, or ``None``. One place decides.

Each fast path it provides has a pure-Python reference beside it, used when the extension is not built
or ``TARINDEX_PURE_PYTHON`` is set in the environment. The ``Protocol`` classes below say what Python
needs from each C type; ``_speedups.pyi`` declares the module itself, and ``tests/test_native.py`` checks
both against the compiled module. The extension imports no Python module: the error classes it raises
are handed to it here, once (``init``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import IndexFormatError

__all__ = ["SPEEDUPS", "FrameCacheC", "PackerC", "ReaderC", "ReaderConfig", "Speedups", "ZstdReaderC"]


@dataclass(frozen=True, slots=True)
class ReaderConfig:
    """What the C ``Reader`` is made from (``Reader(config)``; it reads each field once, at construction)."""

    blocks: Any
    """The index's record blocks: ``blocks(b)`` is block ``b``'s payload (index/records.py)."""
    block_samples: int
    """Samples per record block."""
    n_samples: int
    """Samples of the index."""
    exts: tuple[str, ...]
    """The index's extensions, by number."""
    names: list[str | None]
    """Shard names, ``None`` until resolved (a read of such a shard goes to ``fallback``, which resolves it)."""
    handles: Any
    """The :class:`tarindex.access.handles.HandleTable`: tables ``fds``, ``handles``, ``busy``; ``open``, ``reap``."""
    fallback: Callable[[int], dict[str, Any]]
    """The Python read of one sample: every read the C reader does not accept goes there."""
    error: type[BaseException]
    """The error of a short read (``CorruptArchiveError``)."""
    fork: list[int]
    """:data:`tarindex._process.FORK`: a reader made in another generation hands its reads to ``fallback``."""
    runs: tuple[bytes, bytes] | None = None
    """A view's runs (``view.View.runs()``); ``None``: every sample of the index."""
    guard: Any = None
    """The index's ``BlockSource``: ``check()``, ``check_seconds``, ``check_every``, per-shard ``bounds``."""


class ReaderC(Protocol):
    """``Reader``: one sample's members, read with one ``pread`` (reference: ``TarDataset._read_py``)."""

    def read(self, i: int, /) -> dict[str, Any]: ...
    def read_batch(self, indices: Sequence[int], max_in_flight: int, coalesce_gap: int, /) -> list[dict[str, Any]]: ...


class PackerC(Protocol):
    """``Packer``: the fused walk of plain tar headers and webdataset grouping (reference: ``grouping.TablePacker``)."""

    def scan(self, buf: Any, pos: int, base: int, limit: int = ..., max_member: int = ..., /) -> tuple[int, int, int]: ...
    def scan_file(
        self, fd: int, offset: int, size: int, limit: int, buf: Any, pos: int, max_member: int = ..., /
    ) -> tuple[int, int, int]: ...
    def scan_fd(
        self, fd: int, timeout_ms: int, remaining: int, limit: int, buf: Any, pos: int, base: int, max_member: int = ..., /
    ) -> tuple[int, bytes, int, int, int, int, bool]: ...
    def add(self, name: str, header_offset: int, offset: int, size: int, data: bytes = ..., /) -> None: ...
    def take(self) -> tuple[list[int], list[dict[str, Any]]]: ...
    def finish(self) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray, list[str], list[str]]: ...
    # (in sample-dict mode finish() returns None: those samples come through take())


class FrameCacheC(Protocol):
    """``FrameCache``: this process's ring of decompressed zstd frames (reference: ``zstd_random.FrameCache``)."""

    max_bytes: int

    @property
    def limit(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def decompressed(self) -> int: ...
    def clear(self) -> None: ...
    def __len__(self) -> int: ...


class ZstdReaderC(Protocol):
    """``ZstdReader``: random reads of a zstd shard through its frame table (reference: ``zstd_random.ZstdShardReader``)."""

    @property
    def fd(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def size(self) -> int: ...
    def fileno(self) -> None: ...
    def read_at(self, offset: int, size: int, /) -> bytes: ...
    def close(self) -> None: ...


class Speedups(Protocol):
    """What Python needs from the extension module: its types (as constructors) and functions."""

    @property
    def Reader(self) -> Callable[..., ReaderC]: ...  # the C type's name
    @property
    def Packer(self) -> Callable[..., PackerC]: ...
    @property
    def FrameCache(self) -> Callable[[int], FrameCacheC]: ...
    @property
    def ZstdReader(self) -> Callable[..., ZstdReaderC]: ...

    def scan_headers(
        self, buf: Any, pos: int, base: int, with_data: bool, limit: int, /
    ) -> tuple[list[tuple[str, int, int, int, bytes | None]], int, int, int]: ...
    def _libzstd(self, on: bool = ..., /) -> bool: ...
    def resample(
        self, src: Any, out: Any, box: tuple[float, float, float, float], filter: int, planar: bool, vertical_first: bool, /
    ) -> None: ...
    def _readcheck(self, on: bool = ..., /) -> bool: ...
    def dali_lines(self, keys: list[bytes], exts: list[bytes], nmembers: Any, member_ext: Any, offsets: Any, sizes: Any, /) -> bytes: ...
    def init(self, *, index_format_error: type[Exception]) -> None: ...


def _load() -> Speedups | None:
    if os.environ.get("TARINDEX_PURE_PYTHON"):
        return None
    try:
        from . import _speedups
    except ImportError:  # not compiled here (or a host it refuses: big-endian)
        return None
    _speedups.init(index_format_error=IndexFormatError)
    return _speedups


SPEEDUPS: Speedups | None = _load()
