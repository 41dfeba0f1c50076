"""The one path that opens a shard for random reads: :func:`open_random` (``TarDataset`` through its
handle table's :class:`IndexOpener`, ``TarStream``'s positions, ``verify`` through :func:`open_checked`).

:func:`open_checked` opens the shard's stored bytes and checks them against its index entry (the
identity rule of :mod:`tarindex.identity` for a local file; size, ETag and mtime for a URL);
:func:`open_random` adds the codec's reader from the registry (:mod:`tarindex.access.codecs`), so that
what it returns reads tar bytes, never compressed ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import RandomAccessError, ShardNotFoundError
from ..identity import Check, Checked, check_shard, open_shard
from ..naming import ShardRef
from ..objstore import open_reader
from ..options import SourceOptions
from ..sources import RangeReader
from .codecs import RANDOM, Indexed, IndexTables, ZstdCache, codec
from .reader import LocalReader, RandomReader

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


@dataclass(frozen=True, slots=True)
class OpenOptions:
    """How shards are opened for random reads (one record for every caller)."""

    source: SourceOptions = field(default_factory=SourceOptions)
    """Remote reads: retries, timeouts, headers, storage options, the block cache."""
    check: Check = "stat"
    """The identity check of a local shard at open (:data:`tarindex.identity.Check`)."""
    zstd_cache: ZstdCache = field(default_factory=ZstdCache)
    """The opt-in cache of decompressed zstd shards of large frames."""


@dataclass(frozen=True, slots=True)
class IndexOpener:
    """How a handle table opens shard ``i`` of an index (:class:`tarindex.access.handles.HandleTable`'s
    ``open_handle``): :func:`open_random` of the shard's name, checked against its index entry."""

    names: Sequence[str]
    """Each shard's name (:class:`tarindex.naming.ShardNames`: a name is resolved from its record here, when
    its shard is first opened)."""
    index: IndexTables
    """The index that holds the shards."""
    options: OpenOptions
    """How the shards are opened."""
    checked: Checked | None = None
    """The process's memory of the plain local shards that passed the identity check (:class:`Checked`)."""

    def __call__(self, shard: int) -> RandomReader:
        """Shard ``shard``'s random reader. Raises as :func:`open_random`; ``IndexFormatError`` for a damaged name."""
        return open_random(self.names[shard], Indexed(self.index, shard), self.options, checked=self.checked)


def open_random(
    name: str, indexed: Indexed | None, options: OpenOptions, *, checked: Checked | None = None
) -> RandomReader:
    """A random reader of the tar bytes of shard ``name``: checked against its index entry (``indexed``), or
    for a shard read without an index, a local file or an ``http(s)://`` URL of a codec that allows it.

    ``checked`` (a process's memory of plain local shards that passed the check) lets a shard reopened
    after its descriptor was evicted skip its index record (:class:`tarindex.identity.Checked`).

    Raises:
        StaleIndexError: the shard is not the indexed one (size, mtime and fingerprint; ETag for URLs).
        ShardNotFoundError: the shard is missing.
        SourceError: a remote shard cannot be read.
        RandomAccessError: a command's output, an unindexed shard of another kind or codec, a gzip shard
            without seek points, a zstd shard of large frames without a cache.
        IndexFormatError: a damaged frame table or seek points.
    """
    if indexed is not None and checked is not None:
        again = checked.reopen(name, indexed.shard)  # a plain local shard checked before, unchanged since
        if again is not None:
            return LocalReader(*again)
    raw = open_checked(name, indexed, options)
    try:
        row = codec(indexed, raw)
        if checked is not None and indexed is not None and not row.compressed and isinstance(raw, LocalReader):
            checked.remember(indexed.shard, raw.size, raw.mtime_ns)
        return RANDOM[row](name, raw, indexed, options.zstd_cache)
    except BaseException:
        raw.close()
        raise


def open_checked(name: str, indexed: Indexed | None, options: OpenOptions) -> RandomReader:
    """The stored (maybe compressed) bytes of shard ``name`` for random reads, checked against its index
    entry when it has one. Raises as :func:`open_random`."""
    info = indexed.info if indexed is not None else None  # the entry, decoded once here
    kind = info.kind if info is not None else ShardRef.of(name).stored  # a name's look matters only without an index
    if kind == "command":  # never run from here: a command's output has no random access
        raise RandomAccessError(
            name,
            "a command's output cannot be read at random; stream the index with TarStream(..., allow_commands=True)",
        )
    if kind == "url":
        if info is None:
            if not ShardRef.of(name).ranged:
                raise RandomAccessError(name, "a URL read without an index: read from the start")
            return RangeReader(name, options.source)
        reader: RandomReader = open_reader(
            name, size=info.size, etag=info.etag, mtime_ns=info.mtime_ns, options=options.source
        )
        return reader
    try:
        fd, st = open_shard(name)
    except FileNotFoundError as exc:
        where = f" named by {indexed.index.path}" if indexed is not None else ""
        raise ShardNotFoundError(f"{name}: shard{where} is missing") from exc
    local = LocalReader(fd, st.st_size)
    try:
        local.mtime_ns = st.st_mtime_ns if info is None else check_shard(name, fd, info, check=options.check, st=st)
    except BaseException:
        local.close()
        raise
    return local
