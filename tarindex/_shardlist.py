"""The shards a :class:`tarindex.TarStream` reads, fixed when the stream is made.

Either shard names (a list, a brace pattern, a glob; local paths made absolute, so that a later
``os.chdir`` does not move the stream), or an index (a path or an :class:`~tarindex.IndexReader`; a single
file is an index or a shard by its content, whatever its name): then its shards, named as
:class:`tarindex.TarDataset` names them (a ``command`` shard only when allowed), with each shard's first
global sample number (``__index__``) and index entry (the identity check before its first sample).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .index.reader import IndexReader
from .naming import ShardRef, check_commands, shard_name
from .shards import expand_shards, given_index
from .tables import ShardInfo

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__


@dataclass(frozen=True, slots=True)
class ShardList:
    """A stream's shards."""

    names: list[str]
    """The shard names, in the order the epochs deal them."""
    refs: list[ShardRef]
    """What each name means (:class:`~tarindex.naming.ShardRef`), read once here, not per shard walked."""
    starts: list[int] | None = None
    """Streaming an index: each shard's first global sample number; else ``None``."""
    infos: list[ShardInfo] | None = None
    """Streaming an index: each shard's entry; else ``None``."""
    index: str | None = None
    """Streaming an index: its path (reopened per process for frame tables and seek points); else ``None``."""


def shard_list(urls: Any, allow_commands: bool) -> ShardList:
    """The shards ``urls`` names: shard names, or an index (checked by its recorded kinds: a command only
    when ``allow_commands``).

    Raises:
        ShardNotFoundError: a local shard or pattern matches nothing.
        CommandNotAllowedError: the index names a command shard and ``allow_commands`` is false.
        IndexFormatError: an index's shard entry is damaged or leaves the index's directory.
    """
    reader: IndexReader | None = None
    if isinstance(urls, IndexReader):
        reader = urls
    elif isinstance(urls, (str, os.PathLike)):
        given = given_index(urls)  # by content (a .tgz shard is a shard) and name (a damaged x.tar too)
        if given is not None:
            reader = IndexReader(given)
    if reader is None:  # paths made absolute now: a later os.chdir (Hydra) does not move the stream
        refs = [ShardRef.of(u) for u in expand_shards(urls)]
        return _listed([ShardRef.of(os.path.abspath(r.name)) if r.local else r for r in refs])
    try:
        check_commands(reader.path, reader.shards, allow_commands)
        refs = [ShardRef.of(shard_name(reader.path, info)) for info in reader.shards]
        infos = list(reader.shards)
        starts = [int(x) for x in reader.checked_starts(range(len(infos)), [info.n_samples for info in infos]).tolist()]
    finally:
        if reader is not urls:
            reader.close()
    return _listed(refs, starts, infos, str(reader.path))


def _listed(refs: list[ShardRef], starts: list[int] | None = None, infos: list[ShardInfo] | None = None, index: str | None = None) -> ShardList:
    return ShardList([r.name for r in refs], refs, starts, infos, index)
