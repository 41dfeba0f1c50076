"""The optional C extension (``tarindex._speedups``: _speedups.c, _tarscan.c, _zstdread.c), or ``None``: one place decides.

Each fast path it provides has a pure-Python reference beside it, used when the
extension is not built or ``TARINDEX_PURE_PYTHON`` is set in the environment.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["SPEEDUPS"]


def _load() -> ModuleType | None:
    if os.environ.get("TARINDEX_PURE_PYTHON"):
        return None
    try:
        from . import _speedups
    except ImportError:  # not compiled here
        return None
    return _speedups


SPEEDUPS: ModuleType | None = _load()
