"""Checking an index against its shards: :func:`verify_index` (the CLI's ``tarindex verify`` calls it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._readcheck import shown_pair
from .access import open as opening
from .access.codecs import Indexed
from .errors import StaleIndexError, counted, shown
from .index.reader import IndexReader
from .naming import check_commands, shard_name
from .scan import scan_shard
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
    """Whether every shard was rescanned and every record compared with what the rescan found."""

    def __str__(self) -> str:
        return f"{self.path}: {counted(len(self.shards), 'shard')} ok" + (" (deep)" if self.deep else "")


def verify_index(
    path: str | os.PathLike[str],
    *,
    deep: bool = False,
    allow_commands: bool = False,
    progress: Callable[[int, int], None] | None = None,
    shards: Sequence[int] | None = None,
) -> VerifyReport:
    """Check that every shard of an index is unchanged since it was indexed.

    Each shard's size and content fingerprint (its size and first and last bytes) are compared with the
    index; a shard indexed from a URL is read once, sequentially. ``deep=True`` also rescans every shard
    and compares every record of the index with what the rescan found: each sample's offset, size and key,
    each member's extension, offset and size (the first difference is named), the sample count and the
    zstd frame table. The shards are named as :class:`~tarindex.TarDataset`
    names them (:func:`tarindex.naming.shard_name`) and checked by the same rule
    (:mod:`tarindex.identity`), with the fingerprint compared always.

    Args:
        path: the index file.
        deep: rescan every shard and compare every record with it.
        allow_commands: run the ``pipe:`` commands the index names as shards (trusted indexes only).
        progress: called as ``progress(1, nbytes)`` as each shard is checked: ``nbytes`` the bytes
            read in full (the shard's size, with ``deep`` or for a URL; 0 for a fingerprint).
        shards: check only these shards (numbers in the index, in this order); default every shard.

    Returns:
        What was checked.

    Raises:
        IndexNotFoundError: no index at ``path``.
        IndexFormatError: ``path`` is not a tarindex index.
        ShardNotFoundError: a local shard named by the index is missing.
        CommandNotAllowedError: a shard is a command and ``allow_commands`` is false.
        StaleIndexError: a shard changed since it was indexed (size, fingerprint or, with ``deep``, a record:
            the message names the sample, its offset and what differs, shard vs index).
        CorruptArchiveError: a rescanned shard is not a valid archive.
        SourceError: a URL shard could not be read.
    """
    index = IndexReader(path)
    numbers = range(len(index.shards)) if shards is None else shards
    infos = [index.shards[i] for i in numbers]
    check_commands(index.path, infos, allow_commands)
    checked = []
    for i, info in zip(numbers, infos):
        shard = shard_name(index.path, info)
        table: ShardTable | None
        if info.kind != "file":
            table = _check_url(shard, info)
        else:
            opening.open_checked(shard, Indexed(index, i), _FINGERPRINT).close()  # size and fingerprint
            table = scan_shard(shard, allow_missing_end=True)[1] if deep else None  # size and fingerprint matched: see _check_url
        if deep and table is not None:
            differs = _first_difference(table, index.shard_table(i), int(index.shard_starts()[i]))
            if differs is not None:
                raise StaleIndexError(shard, f"a rescan differs from the index: {differs}")
        checked.append(shard)
        if progress is not None:
            progress(1, info.size if table is not None else 0)
    return VerifyReport(index.path, tuple(checked), deep)


_FINGERPRINT = opening.OpenOptions(check="fingerprint")


def _check_url(url: str, info: ShardInfo) -> ShardTable:
    """Size and fingerprint of a shard indexed from a URL or command: one sequential read, which also gives its tables."""
    new, table = scan_shard(url, allow_missing_end=True)  # a shard built with allow_missing_end; a cut one changes size
    if new.size != info.size:
        raise StaleIndexError(url, f"size {info.size} -> {new.size}")
    if new.fingerprint != info.fingerprint:
        raise StaleIndexError(url, "content fingerprint differs")
    return table


def _first_difference(new: ShardTable, old: ShardTable, first: int) -> str | None:
    """Where a rescan's tables (``new``) and the index's records of the shard (``old``, its samples numbered from
    ``first``) first differ, record by record: each sample's offset, size and key, then each member's extension,
    offset and size; then the sample count and the zstd frame table. ``None`` when every record agrees."""
    n = min(new.n_samples, old.n_samples)
    counts = new.sample_nmembers[:n].astype(np.int64), old.sample_nmembers[:n].astype(np.int64)
    bad = (new.sample_offset[:n] != old.sample_offset[:n]) | (new.sample_size[:n] != old.sample_size[:n]) | (counts[0] != counts[1])
    upto = int(np.argmax(bad)) if bad.any() else n  # samples before this one have the same member counts
    ends = np.cumsum(counts[1][:upto])
    m = int(ends[-1]) if upto else 0
    new_ext = np.array(new.exts, dtype=object)[new.member_ext[:m].astype(np.int64)] if m else np.array([], dtype=object)
    old_ext = np.array(old.exts, dtype=object)[old.member_ext[:m].astype(np.int64)] if m else np.array([], dtype=object)
    members = (new.member_offset[:m] != old.member_offset[:m]) | (new.member_size[:m] != old.member_size[:m]) | (new_ext != old_ext)
    if members.any():
        upto = int(np.searchsorted(ends, int(np.argmax(members)), side="right"))
    s = next((j for j in range(upto) if new.keys[j] != old.keys[j]), upto)
    if s < n:
        where = f"sample {first + s} ({shown(old.keys[s])}) at offset {int(old.sample_offset[s])}"
        for what, column in (("offset", "sample_offset"), ("size", "sample_size")):
            a, b = int(getattr(new, column)[s]), int(getattr(old, column)[s])
            if a != b:
                return f"{where}: {what} {a} in the shard, {b} in the index"
        if new.keys[s] != old.keys[s]:
            got, want = shown_pair(new.keys[s], old.keys[s])
            return f"{where}: key {got} in the shard, {want} in the index"
        lo = int(ends[s - 1]) if s else 0
        for k in range(max(int(counts[0][s]), int(counts[1][s]))):
            got, want = _member(new, lo, k, int(counts[0][s])), _member(old, lo, k, int(counts[1][s]))
            if got != want:
                return f"{where}: member {k + 1}: {got} in the shard, {want} in the index"
    if new.n_samples != old.n_samples:
        return f"{counted(new.n_samples, 'sample')} in the shard, {old.n_samples} in the index"
    if not _same_frames(new.frames, old.frames):
        return "the zstd frame table differs"
    return None


def _member(table: ShardTable, lo: int, k: int, count: int) -> str:
    """Member ``k`` of the sample whose members start at ``lo``, as a difference names it."""
    if k >= count:
        return "no member"
    j = lo + k
    return f"{table.exts[int(table.member_ext[j])]!r} of {int(table.member_size[j])} bytes at +{int(table.member_offset[j])}"


def _same_frames(frames: np.ndarray | None, old: np.ndarray | None) -> bool:
    """Whether two zstd frame tables (or their absence) agree: random reads go through the indexed one."""
    if frames is None or old is None:
        return frames is None and old is None
    return frames.shape == old.shape and bool((frames == old).all())
