"""Checking an index against its shards: :func:`verify_index` (the CLI's ``tarindex verify`` calls it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ShardNotFoundError, StaleIndexError
from .identity import check_shard
from .index.reader import IndexReader
from .opener import check_commands, shard_name
from .scan import scan_shard
from .sources import open_regular
from .tables import ShardInfo, ShardTable

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


def verify_index(path: str | os.PathLike[str], *, deep: bool = False, allow_commands: bool = False) -> VerifyReport:
    """Check that every shard of an index is unchanged since it was indexed.

    Each shard's size and content fingerprint (its size and first and last bytes) are compared with the
    index; a shard indexed from a URL is read once, sequentially. ``deep=True`` also rescans every shard
    and compares its offset tables with the index's. The shards are named as :class:`~tarindex.TarDataset`
    names them (:func:`tarindex.opener.shard_name`) and checked by the same rule
    (:mod:`tarindex.identity`), with the fingerprint compared always.

    Args:
        path: the index file.
        deep: rescan every shard and compare its tables.
        allow_commands: run the ``pipe:`` commands the index names as shards (trusted indexes only).

    Returns:
        What was checked.

    Raises:
        IndexNotFoundError: no index at ``path``.
        IndexFormatError: ``path`` is not a tarindex index.
        ShardNotFoundError: a local shard named by the index is missing.
        CommandNotAllowedError: a shard is a command and ``allow_commands`` is false.
        StaleIndexError: a shard changed since it was indexed (size, fingerprint or, with ``deep``, tables).
        CorruptArchiveError: a rescanned shard is not a valid archive.
        SourceError: a URL shard could not be read.
    """
    index = IndexReader(path)
    check_commands(index.path, index.shards, allow_commands)
    names = [shard_name(index.path, info) for info in index.shards]
    checked = []
    for i, (shard, info) in enumerate(zip(names, index.shards)):
        table: ShardTable | None
        if info.kind != "file":
            table = _check_url(shard, info)
        else:
            _check_file(shard, info, index.path)
            table = scan_shard(shard, allow_missing_end=True)[1] if deep else None  # size and fingerprint matched: see _check_url
        if deep and not _same_tables(table, index.shard_table(i)):
            raise StaleIndexError(shard, "rescan gives different offset tables")
        checked.append(shard)
    return VerifyReport(index.path, tuple(checked), deep)


def _check_url(url: str, info: ShardInfo) -> ShardTable:
    """Size and fingerprint of a shard indexed from a URL or command: one sequential read, which also gives its tables."""
    new, table = scan_shard(url, allow_missing_end=True)  # a shard built with allow_missing_end; a cut one changes size
    if new.size != info.size:
        raise StaleIndexError(url, f"size {info.size} -> {new.size}")
    if new.fingerprint != info.fingerprint:
        raise StaleIndexError(url, "content fingerprint differs")
    return table


def _check_file(path: str, info: ShardInfo, index: Path) -> None:
    """Size and fingerprint of a local shard."""
    try:
        fd, st = open_regular(path)  # a FIFO in a shard's place is refused, not waited on
    except FileNotFoundError:
        raise ShardNotFoundError(f"{path}: shard named by {index} is missing") from None
    try:
        check_shard(path, fd, info, check="fingerprint", st=st)
    finally:
        os.close(fd)


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
