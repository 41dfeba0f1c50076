"""Helpers shared by CLI commands."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..index.reader import IndexReader


def open_index(spec: str) -> IndexReader:
    """An index given as its file, or as the shards it sits beside (imported on use: ``--help`` stays light)."""
    from ..index.reader import IndexReader
    from ..shards import resolve_index

    return IndexReader(resolve_index(spec))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_SIZE = re.compile(r"([0-9]+)\s*([KMGTP]?)(?:I?B)?", re.IGNORECASE)
_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50}


def parse_size(text: str) -> int:
    """Bytes from ``1048576``, ``64M``, ``64MiB``, ``2G``, ``2GB`` (units are powers of 1024, as ``ls -h`` shows them).

    Raises:
        ValueError: not a whole number with an optional unit.
    """
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size: expected a number of bytes with an optional unit K, M, G, T (powers of 1024), e.g. 64M")
    return int(m.group(1)) << _UNITS[m.group(2).upper()]
