"""Build and merge indexes: parallel, incremental, atomic."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from .errors import IndexFormatError, IndexNotFoundError, ShardNotFoundError, TarIndexError
from .identity import current_info
from .index.format import ShardInfo, ShardTable
from .index.reader import IndexReader
from .index.writer import IndexWriter
from .objstore import is_object_url
from .opener import shard_name
from .scan import scan_shard
from .shards import INDEX_SUFFIX, ShardKind, default_index_path, expand_shards, shard_kind
from .sources import is_url

__all__ = ["BuildReport", "build_index", "merge_indexes"]

Progress = Callable[[int], None]


class BuildReport:
    """What a build did: the index path and which shards were scanned or reused."""

    def __init__(self, path: Path, scanned: list[str], reused: list[str]) -> None:
        self.path = path
        self.scanned = scanned
        self.reused = reused

    def __repr__(self) -> str:
        return f"BuildReport({str(self.path)!r}, scanned={len(self.scanned)}, reused={len(self.reused)})"


def _relative(shard: str, index_dir: Path) -> str:
    if shard_kind(shard) != "file":
        return shard
    absolute = os.path.abspath(shard)
    try:
        return os.path.relpath(absolute, index_dir)
    except ValueError:  # another drive
        return absolute


def _reusable(previous: Path) -> dict[str, tuple[IndexReader, int]]:
    """Shards of an existing index by relative path; empty if there is none or it is unreadable."""
    try:
        reader = IndexReader(previous)
    except (IndexNotFoundError, IndexFormatError):
        return {}
    return {info.path: (reader, i) for i, info in enumerate(reader.shards)}




def _slice(shards: list[str], part: tuple[int, int]) -> list[str]:
    k, n = part
    if not 1 <= k <= n:
        raise ValueError(f"part {k}/{n}: K must be between 1 and N")
    return shards[(k - 1) * len(shards) // n : k * len(shards) // n]


def _scan_all(shards: list[str], workers: int, progress: Progress | None) -> dict[str, tuple[ShardInfo, ShardTable]]:
    results: dict[str, tuple[ShardInfo, ShardTable]] = {}
    if workers <= 1 or len(shards) <= 1:
        for s in shards:
            results[s] = scan_shard(s)
            if progress:
                progress(1)
        return results
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    pool: Executor
    if any(is_object_url(s) for s in shards):  # network-bound; and obstore's runtime does not survive fork
        pool = ThreadPoolExecutor(max_workers=min(workers, len(shards)), thread_name_prefix="tarindex-scan")
    else:
        pool = ProcessPoolExecutor(max_workers=min(workers, len(shards)), mp_context=ctx)
    with pool:
        for s, result in zip(shards, pool.map(scan_shard, shards, chunksize=1)):
            results[s] = result
            if progress:
                progress(1)
    return results


def build_index(
    shards: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    index: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    part: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> BuildReport:
    """Index tar shards into one LMDB index file.

    Incremental: shards whose size and mtime match an existing index at the
    same path are reused, not rescanned. Atomic: the new index replaces the
    old one only when complete.

    Args:
        shards: paths, globs or brace patterns (``'data/train-{000..099}.tar'``).
        index: where to write the index; default beside the shards (see
            :func:`tarindex.shards.default_index_path`).
        workers: processes that scan shards; default ``os.cpu_count()``.
        part: ``(K, N)`` to index only the K-th of N contiguous slices of the
            shard list (1-based), for builds spread over machines; combine the
            parts with :func:`merge_indexes`.
        progress: called with the number of shards done since the last call.

    Raises:
        ShardNotFoundError: a shard does not exist.
        CorruptArchiveError: a shard is not a valid tar archive.
    """
    paths = expand_shards(shards)
    if not paths:
        raise ShardNotFoundError("no shards given")
    if index is not None:
        out = Path(index)
    elif any(is_url(p) for p in paths):
        raise TarIndexError(f"{next(p for p in paths if is_url(p))}: URL shards need an index path (index=..., or -o)")
    else:
        out = default_index_path(paths)
        if part is not None:
            out = out.with_name(out.name[: -len(INDEX_SUFFIX)] + f".part-{part[0]}-of-{part[1]}{INDEX_SUFFIX}")
    if part is not None:
        paths = _slice(paths, part)
    index_dir = out.absolute().parent
    rel = [_relative(s, index_dir) for s in paths]
    if len(set(rel)) != len(rel):
        raise TarIndexError("the same shard is named twice")
    previous = _reusable(out)
    kept = {s: current_info(s, previous[r][0].shards[previous[r][1]]) for s, r in zip(paths, rel) if r in previous}
    todo = [s for s in paths if kept.get(s) is None]
    if progress and len(todo) < len(paths):
        progress(len(paths) - len(todo))
    scanned = _scan_all(todo, workers or os.cpu_count() or 1, progress)
    with IndexWriter(out) as writer:
        for s, r in zip(paths, rel):
            if s in scanned:
                info, table = scanned[s]
                writer.add(_with_path(info, r, shard_kind(s)), table)
            else:
                reader, i = previous[r]
                writer.add(kept[s] or reader.shards[i], reader.shard_table(i))
    for reader in {id(r): r for r, _ in previous.values()}.values():
        reader.close()
    return BuildReport(out, [s for s in paths if s in scanned], [s for s in paths if s not in scanned])


def _with_path(info: ShardInfo, path: str, kind: ShardKind) -> ShardInfo:
    """``info`` under its path relative to the index, with the kind of name it was given as (names are data)."""
    norm = os.path.normpath(path)
    outside = kind == "file" and (os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir)
    return dataclasses.replace(info, path=path, kind=kind, outside=outside)


def merge_indexes(parts: Iterable[str | os.PathLike[str]], output: str | os.PathLike[str]) -> Path:
    """Combine indexes (for example ``--part`` builds) into one, shards in the order given.

    Raises:
        IndexNotFoundError, IndexFormatError: a part is missing or not an index.
        TarIndexError: two parts name the same shard.
    """
    out = Path(output)
    out_dir = out.absolute().parent
    readers = [IndexReader(p) for p in parts]
    seen: set[str] = set()
    with IndexWriter(out) as writer:
        for reader in readers:
            for i, info in enumerate(reader.shards):
                name = shard_name(reader.path, info)
                path = _relative(name, out_dir) if info.kind == "file" else name
                if path in seen:
                    raise TarIndexError(f"{reader.path}: shard {path} is already in another part")
                seen.add(path)
                writer.add(_with_path(info, path, info.kind), reader.shard_table(i))
    for reader in readers:
        reader.close()
    return out
