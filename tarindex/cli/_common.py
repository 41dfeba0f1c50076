"""Helpers shared by CLI commands."""

from __future__ import annotations

from pathlib import Path

from ..index.reader import IndexReader
from ..shards import INDEX_SUFFIX, default_index_path, expand_shards


def open_index(spec: str) -> IndexReader:
    """An index given as its file, or as the shards it sits beside."""
    p = Path(spec)
    if p.suffix == INDEX_SUFFIX or (p.is_file() and not spec.endswith((".tar", ".tar.zst"))):
        return IndexReader(p)
    return IndexReader(default_index_path(expand_shards(spec)))


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
