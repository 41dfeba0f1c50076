"""The typed C boundary: the optional C extension (``tarindex._speedups``: _speedups.c, _tarscan.c,
_zstdread.c, _resample.c) as :class:`Speedups`, or ``None``. One place decides.

Each fast path it provides has a pure-Python reference beside it, used when the extension is not built
or ``TARINDEX_PURE_PYTHON`` is set in the environment. ``_speedups.pyi`` declares the module and its types,
once (``tests/test_native.py`` checks it against the compiled module); :class:`Speedups` is what Python
needs from the module, in those types. The extension imports no Python module: the error classes it raises
are handed to it here, once (``init``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .errors import IndexFormatError

if TYPE_CHECKING:  # the C types as _speedups.pyi declares them
    from ._speedups import FrameCache, Packer, Reader, ZstdReader

__all__ = ["SPEEDUPS", "ReaderConfig", "Speedups"]


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


class Speedups(Protocol):
    """What Python needs from the extension module: its types (as constructors) and functions."""

    @property
    def Reader(self) -> Callable[..., Reader]: ...  # the C type's name
    @property
    def Packer(self) -> Callable[..., Packer]: ...
    @property
    def FrameCache(self) -> Callable[[int], FrameCache]: ...
    @property
    def ZstdReader(self) -> Callable[..., ZstdReader]: ...

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
