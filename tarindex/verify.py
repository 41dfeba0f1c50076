"""Checking an index against its shards: :func:`verify_index` (the CLI's ``tarindex verify`` calls it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ShardNotFoundError, StaleIndexError
from .index.format import ShardInfo, ShardTable
from .index.reader import IndexReader
from .scan import scan_shard
from .shards import fingerprint
from .sources import is_url

__all__ = ["VerifyReport", "verify_index"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify_index` checked; every check passed (the first that fails raises)."""

    path: Path
    """The index file."""
    shards: tuple[str, ...]
    """The shards checked, in index order: local paths as opened, URLs as indexed."""
    deep: bool
    """Whether every shard was rescanned and its tables compared with the index's."""

    def __str__(self) -> str:
        return f"{self.path}: {len(self.shards)} shards ok" + (" (deep)" if self.deep else "")


def verify_index(path: str | os.PathLike[str], *, deep: bool = False) -> VerifyReport:
    """Check that every shard of an index is unchanged since it was indexed.

    Each shard's size and content fingerprint (its size and first and last bytes) are compared with the
    index; a shard indexed from a URL is read once, sequentially. ``deep=True`` also rescans every shard
    and compares its offset tables with the index's.

    Args:
        path: the index file.
        deep: rescan every shard and compare its tables.

    Returns:
        What was checked.

    Raises:
        IndexNotFoundError: no index at ``path``.
        IndexFormatError: ``path`` is not a tarindex index.
        ShardNotFoundError: a local shard named by the index is missing.
        StaleIndexError: a shard changed since it was indexed (size, fingerprint or, with ``deep``, tables).
        CorruptArchiveError: a rescanned shard is not a valid archive.
        SourceError: a URL shard could not be read.
    """
    index = IndexReader(path)
    checked = []
    for i, info in enumerate(index.shards):
        table: ShardTable | None
        if is_url(info.path):
            shard, table = info.path, _check_url(info)
        else:
            shard = str(index.shard_path(i))
            _check_file(shard, info, index.path)
            table = scan_shard(shard)[1] if deep else None
        if deep and not _same_tables(table, index.shard_table(i)):
            raise StaleIndexError(shard, "rescan gives different offset tables")
        checked.append(shard)
    return VerifyReport(index.path, tuple(checked), deep)


def _check_url(info: ShardInfo) -> ShardTable:
    """Size and fingerprint of a shard indexed from a URL: one sequential read, which also gives its tables."""
    new, table = scan_shard(info.path)
    _check_identity(info.path, info, new.size, new.fingerprint)
    return table


def _check_file(path: str, info: ShardInfo, index: Path) -> None:
    """Size and fingerprint of a local shard."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ShardNotFoundError(f"{path}: shard named by {index} is missing") from None
    try:
        size = os.fstat(fd).st_size
        _check_identity(path, info, size, fingerprint(fd, size) if size == info.size else "")
    finally:
        os.close(fd)


def _check_identity(path: str, info: ShardInfo, size: int, content: str) -> None:
    """The shard is the indexed one: same size, same content fingerprint."""
    if size != info.size:
        raise StaleIndexError(path, f"size {info.size} -> {size}")
    if content != info.fingerprint:
        raise StaleIndexError(path, "content fingerprint differs")


def _same_tables(table: ShardTable | None, old: ShardTable) -> bool:
    """A rescan's tables are the index's: keys, sample and member ranges, extensions, zstd frames."""
    return table is not None and bool(
        table.keys == old.keys
        and (table.sample_offset == old.sample_offset).all()
        and (table.sample_size == old.sample_size).all()
        and (table.member_offset == old.member_offset).all()
        and (table.member_size == old.member_size).all()
        and [table.exts[e] for e in table.member_ext] == [old.exts[e] for e in old.member_ext]
        and _same_frames(table.frames, old.frames)
    )


def _same_frames(frames: np.ndarray | None, old: np.ndarray | None) -> bool:
    """Whether two zstd frame tables (or their absence) agree: random reads go through the indexed one."""
    if frames is None or old is None:
        return frames is None and old is None
    return frames.shape == old.shape and bool((frames == old).all())
