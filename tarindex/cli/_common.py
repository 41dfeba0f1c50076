"""Helpers shared by CLI commands."""

from __future__ import annotations

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
