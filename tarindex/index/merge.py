"""Merge indexes: parts of one build (``--part K/N``) or any indexes, streamed shard by shard.

Memory is bounded by the largest shard, not by the parts: each shard's tables are cut
out of its part and written into the new index's record blocks at once, and each part is
closed (its map's pages released) once its shards are written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import TarIndexError
from ..naming import ShardKind, ShardRef
from ..tables import ShardInfo
from .reader import IndexReader
from .writer import IndexWriter

__all__: list[str] = []  # internal: tarindex.build.merge_indexes is the public merge


def relative_path(shard: str, index_dir: Path) -> str:
    """How an index in ``index_dir`` names ``shard``: a file relative to it (absolute on another drive), others as given."""
    if not ShardRef.of(shard).local:
        return shard
    absolute = os.path.abspath(shard)
    try:
        return os.path.relpath(absolute, index_dir)
    except ValueError:  # another drive
        return absolute


def _ordered(readers: list[IndexReader]) -> list[IndexReader]:
    """Parts of one build in their recorded K order; other indexes in the order given.

    Raises:
        TarIndexError: parts of different builds, a part missing or given twice, or parts mixed with whole indexes.
    """
    parts = [r.part for r in readers]
    if all(p is None for p in parts):
        return readers
    if any(p is None for p in parts):
        whole = next(r for r in readers if r.part is None)
        raise TarIndexError(f"{whole.path}: not a part (built without --part); merge parts of one build, or whole indexes")
    counts = {p[1] for p in parts if p is not None}
    if len(counts) > 1:
        raise TarIndexError(f"parts of different splits ({', '.join(f'of {n}' for n in sorted(counts))}); merge the parts of one build")
    n = counts.pop()
    by_k: dict[int, IndexReader] = {}
    for r in readers:
        k = r.part[0] if r.part else 0
        if k in by_k:
            raise TarIndexError(f"{r.path}: part {k}/{n} is given twice (also {by_k[k].path})")
        by_k[k] = r
    missing = [k for k in range(1, n + 1) if k not in by_k]
    if missing:
        raise TarIndexError(f"part {missing[0]}/{n} is missing ({len(by_k)} of {n} parts given)")
    return [by_k[k] for k in range(1, n + 1)]


def placed(info: ShardInfo, path: str, kind: ShardKind) -> ShardInfo:
    """``info`` under its path relative to the index, with the kind of name it was given as (names are data)."""
    norm = os.path.normpath(path)
    outside = kind == "file" and (os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir)
    return dataclasses.replace(info, path=path, kind=kind, outside=outside)


def merge(
    parts: Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    shard_name: Callable[[Path, ShardInfo], str],
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Combine indexes into one (see :func:`tarindex.build.merge_indexes`); ``shard_name(index, info)`` is the name
    a shard of an index opens by (checked against its recorded kind); ``progress(shards, nbytes)`` is called
    as each shard is written (``(1, 0)``) and as each part is done (``(0, its file size)``).

    Raises:
        IndexNotFoundError, IndexFormatError: a part is missing or not an index.
        TarIndexError: two parts name the same shard; a part of a split is missing or given twice.
    """
    out = Path(output)
    out_dir = out.absolute().parent
    readers = _ordered([IndexReader(p) for p in parts])
    seen: dict[str, Path] = {}
    try:
        with IndexWriter(out) as writer:
            for reader in readers:
                for i, info in enumerate(reader.shards):
                    name = shard_name(reader.path, info)
                    path = relative_path(name, out_dir) if info.kind == "file" else name
                    if path in seen:
                        raise TarIndexError(f"{reader.path}: shard {path} is already in {seen[path]}")
                    seen[path] = reader.path
                    writer.add_columns(
                        placed(info, path, info.kind), reader.shard_columns(i), reader.exts, reader.frame_table(i), reader.gzip_points(i)
                    )
                    if progress is not None:
                        progress(1, 0)
                reader.close()  # its pages leave this process's memory: one part is mapped at a time
                if progress is not None:
                    progress(0, reader.path.stat().st_size)
    finally:
        for reader in readers:
            reader.close()
    return out
