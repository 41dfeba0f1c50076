"""Walking one shard of a :class:`tarindex.TarStream`: its raw samples, from wherever the epoch asks.

One call, :meth:`ShardWalker.walk_shard`, with three strategies behind it, chosen by the work item's mode
(:mod:`tarindex._epochs`):

- ``WHOLE``, the sequential walk: the shard opened as a sequential source (:func:`tarindex.sources.open_source`)
  and walked by the tar parser (:func:`tarindex.grouping.iter_samples`): a local plain tar's descriptor (read
  with ``pread``; in blocks read ahead on network or FUSE storage), or a plain HTTP body, a pipe or standard
  input read by the C walk itself (:class:`tarindex.tar.DirectArchive`), else the source's chunks through the
  codec registry's stream walk (:func:`tarindex.scan.archive`). Streaming an index, the shard is first checked
  against its entry (its sample numbers hold only for the indexed bytes).
- ``AFTER``, resuming mid-shard: the shard entered at a saved sample's byte offset through a random reader
  (:func:`tarindex.access.open.open_random`, as :class:`tarindex.TarDataset` opens shards), read in growing blocks
  from there; a shard without random access (pipes, standard input, a codec or source that has none) is walked
  from its start and the samples before the position are skipped.
- ``ONE``, the index-driven pick: the samples at saved positions (a restored shuffle buffer), one random read
  each, or one pass from the start.

Each yields ``(ordinal, (offset, sample))``: the sample's number in the shard, the byte offset of its first
header in the tar and the raw sample dict. A saved position that no longer holds its sample is a
:class:`~tarindex.errors.StateError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._codecs import of_head
from ._epochs import AFTER, ONE, WHOLE, worker_info
from ._localreads import block_chunks, slow_device
from ._process import FORK
from ._shardlist import ShardList
from .access.codecs import Indexed
from .access.open import OpenOptions, open_random
from .access.reader import RandomReader
from .compression import ArchiveEnd
from .errors import CorruptArchiveError, StateError, TarIndexError
from .grouping import fused, iter_samples
from .identity import check_shard, check_source
from .index.reader import IndexReader
from .naming import ShardRef
from .options import SourceOptions
from .scan import archive
from .sources import FileSource, open_source
from .tar import DirectArchive

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Sample = dict[str, Any]
Numbered = Iterator[tuple[int, tuple[int, Sample]]]
"""``(ordinal, (offset, sample))`` of one shard."""

_TAR_BLOCK = 512
_READERS = 8
"""Random readers kept open per process (the shards entered at a position most recently)."""


def read_ahead_for(ref: ShardRef, read_ahead: int | None) -> int | None:
    """The read-ahead a shard gets: ``read_ahead`` if given; else 0 for a local file read in a
    DataLoader worker (the workers already use the cores), else ``None`` (the source's default, 8)."""
    if read_ahead is None and ref.kind == "file" and worker_info() is not None:
        return 0
    return read_ahead


@dataclass(eq=False)
class ShardWalker:
    """Walks the shards of one stream (see the module docstring).

    Keeps, per process, the random readers of the shards it entered at a position (the last
    :data:`_READERS`) and the index streamed (for frame tables and seek points); a copy or a pickle
    starts with none.
    """

    shards: ShardList
    """The stream's shards."""
    options: SourceOptions
    """How shards are read."""
    read_ahead: int | None = None
    """Blocks a reader thread keeps ready (see :func:`read_ahead_for`)."""
    max_member_size: int | None = None
    """The largest member accepted (``None``: the walk's default)."""
    allow_missing_end: bool = False
    """Accept shards without the end-of-archive marker."""
    _readers: dict[int, RandomReader | None] = field(default_factory=dict, init=False, repr=False)
    _fork: int = field(default=0, init=False, repr=False)
    _index: IndexReader | None = field(default=None, init=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"], state["_fork"], state["_index"] = {}, 0, None  # handles stay in their process
        return state

    def walk_shard(self, shard: int, mode: int = WHOLE, at: Sequence[tuple[int, int]] = ()) -> Numbered:
        """The raw samples of shard number ``shard``: all of them (``WHOLE``), those after the sample at
        ``at[0]`` (``AFTER``), or those at the ``at`` positions (``ONE``), each position ``(offset, ordinal)``.

        Raises:
            StateError: (when iterating) a position does not hold its sample (the shard changed since
                the state was saved).
            TarIndexError: what reading the shard raises (``CorruptArchiveError``, ``SourceError``, ...).
        """
        if mode == WHOLE:
            return enumerate(self._sequential(shard))
        if mode == AFTER:
            ((offset, ordinal),) = at
            return self._from(shard, offset, ordinal, AFTER)
        return self._picked(shard, at)

    def seekable(self, shard: int) -> bool:
        """Whether the samples of ``shard`` are read one by one (a random reader), else in a pass from its start."""
        return self._random(shard) is not None

    def close(self) -> None:
        """Close this process's random readers and index (those of another process are left to it)."""
        readers, self._readers = self._readers, {}
        index, self._index = self._index, None
        if self._fork == FORK[0]:
            for reader in readers.values():
                if reader is not None:
                    reader.close()
            if index is not None:
                index.close()

    # -- the sequential walk ------------------------------------------------------------
    def _sequential(self, shard: int) -> Iterator[tuple[int, Sample]]:
        """``(sample offset, raw sample)`` for one shard, in archive order."""
        shards = self.shards
        ref = shards.refs[shard]
        url = ref.name
        index = shards.starts[shard] if shards.starts is not None else None
        source = open_source(ref, options=self.options, read_ahead=read_ahead_for(ref, self.read_ahead))
        try:
            if shards.infos is not None:  # from an index: its sample numbers hold only for the indexed shard
                if isinstance(source, FileSource):
                    check_shard(url, source.fileno(), shards.infos[shard])
                else:
                    check_source(url, shards.infos[shard], source.size, source.mtime_ns)
            fd, slow = -1, False
            if isinstance(source, FileSource) and source.size is not None:
                fd = source.fileno()
                slow = slow_device(source.device)  # NFS, FUSE, ...: blocks read ahead (_localreads; asked once per device)
            if (fused() or slow) and fd >= 0 and not of_head(os.pread(fd, 6, 0), url).compressed:  # a local tar: the C walk reads it, one copy, no thread
                walked = block_chunks(fd, source.size or 0, block=source.block_size) if slow else fd
                yield from iter_samples(walked, url, index=index, max_member_size=self.max_member_size, allow_missing_end=self.allow_missing_end)
                return
            first = b""
            if source.walks_direct and fused():  # HTTP, pipes: the C walk reads the socket or pipe itself
                while len(first) < 6 and (more := source.read(64 << 10)):
                    first += more
                if not of_head(first[:6], url).compressed:
                    yield from iter_samples(
                        DirectArchive(source, first), url, index=index, max_member_size=self.max_member_size, allow_missing_end=self.allow_missing_end
                    )
                    while source.read(source.block_size):  # to the end: the body's length is checked there
                        pass
                    return
            end = ArchiveEnd()
            raw = archive(source, first=first, end=end)
            yield from iter_samples(raw, url, index=index, max_member_size=self.max_member_size, allow_missing_end=self.allow_missing_end)
            end.set()  # what follows the tar is read, but decompressed only as far as Limits.padding
            for _ in raw:  # to the end: a pipe's exit status and an HTTP body's length are checked there
                pass
        finally:
            source.close()

    # -- from a position: resuming mid-shard, one sample again ---------------------------
    def _from(self, shard: int, offset: int, ordinal: int, mode: int) -> Numbered:
        """The raw samples from the sample at ``offset`` (the shard's ``ordinal``-th) on: read with ``read_at``
        from there when the shard allows it, else from the start, skipping. ``AFTER`` leaves that sample out,
        ``ONE`` yields it only.

        Raises:
            StateError: the shard has no sample ``ordinal`` at ``offset`` (it changed since the state was saved).
        """
        shards = self.shards
        url = shards.names[shard]
        reader = self._random(shard)
        numbered: Numbered
        if reader is not None:
            index = None if shards.starts is None else shards.starts[shard] + ordinal
            chunks = _chunks_at(reader, offset, self.options.block_size)
            walk = iter_samples(chunks, url, index=index, max_member_size=self.max_member_size, allow_missing_end=self.allow_missing_end)
            numbered = enumerate(((offset + off, sample) for off, sample in walk), ordinal)
        else:
            numbered = ((k, pair) for k, pair in enumerate(self._sequential(shard)) if k >= ordinal)
        found = False
        try:
            for k, (off, sample) in numbered:
                if k == ordinal:
                    if off != offset:
                        raise StateError(
                            f"{url}: sample {ordinal} is at offset {off}, the saved state says {offset}: "
                            "the shard changed since the state was saved"
                        )
                    found = True
                    if mode == AFTER:
                        continue
                yield k, (off, sample)
                if mode == ONE:
                    return
        except CorruptArchiveError as exc:
            if found or reader is None:
                raise
            raise StateError(
                f"{url}: no sample {ordinal} at offset {offset}, where the saved state says it is (not a tar header there): "
                "the shard changed since the state was saved"
            ) from exc

    def _picked(self, shard: int, wanted: Sequence[tuple[int, int]]) -> Numbered:
        """The samples at ``wanted`` ``(offset, ordinal)`` positions of ``shard``, in ordinal order: one read
        each where the shard allows, else one pass from the start."""
        if self.seekable(shard):
            for offset, ordinal in wanted:
                yield from self._from(shard, offset, ordinal, ONE)
            return
        want = dict((ordinal, offset) for offset, ordinal in wanted)
        last = max(want)
        for k, (off, sample) in enumerate(self._sequential(shard)):
            if k in want:
                if off != want[k]:
                    raise StateError(
                        f"{self.shards.names[shard]}: sample {k} is at offset {off}, the saved state says {want[k]}: "
                        "the shard changed since the state was saved"
                    )
                yield k, (off, sample)
            if k >= last:
                return

    def _random(self, shard: int) -> RandomReader | None:
        """A random reader of a shard's tar bytes (:func:`tarindex.access.open.open_random`: with an index, checked
        against its entry, wherever ``TarDataset`` reads at random; without one, a local file or an ``http(s)://``
        URL, plain or zstd with a seek table), else ``None`` (pipes, standard input, a codec or source without
        random access: read from the start). Kept per process while the epoch runs."""
        if self._fork != FORK[0]:
            self._readers, self._fork, self._index = {}, FORK[0], None
        if shard in self._readers:
            return self._readers[shard]
        reader: RandomReader | None
        try:
            reader = open_random(self.shards.names[shard], self._indexed(shard), OpenOptions(self.options))
        except (TarIndexError, OSError):  # no random access, no Range support, unreachable: read from the start (errors come there)
            reader = None
        if len(self._readers) >= _READERS:
            old = self._readers.pop(next(iter(self._readers)))
            if old is not None:
                old.close()
        self._readers[shard] = reader
        return reader

    def _indexed(self, shard: int) -> Indexed | None:
        """Shard ``shard`` of the index streamed (opened once per process), or ``None`` without one."""
        if self.shards.index is None:
            return None
        if self._index is None:
            self._index = IndexReader(self.shards.index)
        return Indexed(self._index, shard)


def _chunks_at(reader: RandomReader, offset: int, block_size: int) -> Iterator[bytes]:
    """The bytes of ``reader`` from ``offset`` to its end (its size, or an empty read when it does not know it),
    in reads growing from 256 KiB to ``block_size`` (one sample read again costs one small read).

    A read that fails on damaged data (a corrupt zstd frame or deflate block) is asked again in halves, down to
    one tar block, and every byte before the damage is handed out as one last chunk before the error (which
    names where the damage is), as a stream from the start would hand them out.
    """
    n = 256 << 10
    size = reader.size
    while size < 0 or offset < size:
        want = n if size < 0 else min(n, size - offset)
        try:
            data = reader.read_at(offset, want)
        except CorruptArchiveError:
            good = _before_damage(reader, offset, want)
            if good:
                yield good
            raise
        if not data:
            return
        offset += len(data)
        n = min(2 * n, max(block_size, 256 << 10))
        yield data


def _before_damage(reader: RandomReader, offset: int, size: int) -> bytes:
    """The bytes from ``offset`` that read without error, of the ``size`` whose read failed: found by halves."""
    good: list[bytes] = []
    while size > _TAR_BLOCK:
        size //= 2
        try:
            data = reader.read_at(offset, size)
        except CorruptArchiveError:
            continue
        good.append(data)
        offset += len(data)
    return b"".join(good)
