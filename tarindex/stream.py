"""TarStream: an iterable dataset over unindexed shards (local, ``-``, ``pipe:``, HTTP, fsspec).

The same parser as the index builder (:func:`tarindex.tar.iter_tar` over the
chunks of a :mod:`tarindex.sources` source, zstd decompressed on the way; a
local plain tar is read with ``pread``), the same grouping
(:func:`tarindex.grouping.iter_samples`) and the same decoders as
:class:`tarindex.TarDataset`. Importing this module imports torch.
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import torch.utils.data

from ._split import Slot, buffer_shuffle, shard_order, shards_for_slot, worker_slot
from .collate import batched, collate
from .decode import DecodeMode, Decoder
from .errors import DecodeError, StreamWarning, TarIndexError, shown
from .grouping import fused, iter_samples
from .index.reader import IndexReader
from .opener import check_commands, shard_name
from .scan import archive
from .shards import INDEX_SUFFIX, expand_shards
from .sources import DEFAULT_BLOCK_SIZE, FileSource, is_url, open_source
from .tar import Stream
from .zstd import is_zstd

__all__ = ["Handler", "TarStream"]  # public (tarindex.TarStream); the rest serves the package

Sample = dict[str, Any]
Handler = Literal["raise", "warn", "skip_shard"] | Callable[[Exception], bool]
_HANDLERS = ("raise", "warn", "skip_shard")


def _shard_list(urls: Any, allow_commands: bool) -> tuple[list[str], list[int] | None]:
    """Shard names, and each shard's first global sample number when ``urls`` is an index (checked by its
    recorded kinds: a command only when ``allow_commands``)."""
    reader: IndexReader | None = None
    if isinstance(urls, IndexReader):
        reader = urls
    elif isinstance(urls, (str, os.PathLike)):
        p = os.fspath(urls)
        if p.endswith(INDEX_SUFFIX) or (os.path.isfile(p) and not p.endswith((".tar", ".tar.zst", ".tzst"))):
            reader = IndexReader(p)
    if reader is None:
        return expand_shards(urls), None
    try:
        check_commands(reader.path, reader.shards, allow_commands)
        names = [shard_name(reader.path, info) for info in reader.shards]
        starts = [int(x) for x in reader.array("shard_start").tolist()]
    finally:
        if reader is not urls:
            reader.close()
    return names, starts


def read_ahead_for(url: str, read_ahead: int | None) -> int | None:
    """The read-ahead a shard gets: ``read_ahead`` if given; else 0 for a local file read in a
    DataLoader worker (the workers already use the cores), else ``None`` (the source's default, 8)."""
    if read_ahead is None and not is_url(url) and torch.utils.data.get_worker_info() is not None:
        return 0
    return read_ahead


class _Chain:
    """``second(first(x))``; picklable when both are (DataLoader workers)."""

    def __init__(self, first: Callable[[Any], Any], second: Callable[[Any], Any]) -> None:
        self.first, self.second = first, second

    def __call__(self, sample: Any) -> Any:
        return self.second(self.first(sample))


class _ToTuple:
    """webdataset's ``to_tuple``: one value per field, a field's keys separated by ``;``."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = [f.split(";") for f in fields]

    def __call__(self, sample: Sample) -> tuple[Any, ...]:
        out = []
        for keys in self.fields:
            for k in keys:
                if k in sample:
                    out.append(sample[k])
                    break
            else:
                raise KeyError(f"none of {keys} in {sorted(sample)}")
        return tuple(out)


class _MapTuple:
    """webdataset's ``map_tuple``: one function per field of a tuple sample (``None`` keeps the field)."""

    def __init__(self, fns: tuple[Callable[[Any], Any] | None, ...]) -> None:
        self.fns = fns

    def __call__(self, sample: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(sample) != len(self.fns):
            raise ValueError(f"map_tuple has {len(self.fns)} functions for a sample of {len(sample)} fields")
        return tuple(x if f is None else f(x) for f, x in zip(self.fns, sample))


class TarStream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Stream samples from tar shards, once each per epoch, split over ranks and DataLoader workers.

    Yields the sample dicts of :class:`tarindex.TarDataset`: ``__key__``,
    ``__url__`` (the shard name), one entry per extension (``bytes`` or
    decoded), and ``__index__`` (the global sample number) when streaming from
    an index. Not shuffled, samples come in archive order, shard after shard.

    Splitting: the epoch's shard list is dealt ``shards[rank::world_size]``,
    then ``[worker::num_workers]``, so each shard is read by one worker of one
    rank. With fewer shards than ``world_size * num_workers`` some workers
    have nothing to read (a :class:`~tarindex.errors.StreamWarning` says so)
    unless ``epoch_size`` is set. ``epoch_size=N`` makes every rank yield
    exactly ``N`` samples per epoch (split over its workers), reading its
    shards again when they hold fewer and stopping early when they hold more:
    set it for DDP, where ranks must take the same number of steps.

    Args:
        urls: shard names (list, brace pattern, glob; local paths, ``-``,
            ``pipe:COMMAND``, ``http(s)://``, fsspec URLs), or an index file
            or :class:`~tarindex.IndexReader` whose shards are streamed.
        decode: as for :class:`~tarindex.TarDataset`.
        decoders: as for :class:`~tarindex.TarDataset`.
        transform: as for :class:`~tarindex.TarDataset`.
        allow_pickle: as for :class:`~tarindex.TarDataset`.
        shuffle: size of the sample shuffle buffer (0: no sample shuffling).
        shuffle_shards: shuffle the shard order each epoch; default ``shuffle > 0``.
        seed: with the epoch, rank and worker, fixes every random choice.
        epoch_size: samples per rank per epoch (see above); ``None`` streams each shard once.
        handler: what a bad shard or sample does: ``"raise"`` (default);
            ``"warn"``: warn and go on with the next sample (decode errors) or the
            next shard (unreadable or corrupt shard); ``"skip_shard"``: warn and
            skip the rest of the shard; or a function of the exception that
            returns ``True`` to go on as ``"warn"`` does (webdataset's handlers).
        rank: overrides ``torch.distributed`` / ``RANK``.
        world_size: overrides ``torch.distributed`` / ``WORLD_SIZE``.
        block_size: bytes per read.
        retries: network retries without progress.
        backoff: first backoff in seconds (doubled each time).
        timeout: socket timeout in seconds.
        storage_options: client options of object stores and fsspec filesystems (docs/remote.md).
        headers: extra HTTP(S) request headers (e.g. ``{"Authorization": "Bearer ..."}``).
        read_ahead: blocks a reader thread keeps ready ahead of the parser (0: read in the
            parser's thread), for sources read in blocks. Default: 8 for network sources; for
            local zstd files 8 in the main process and 0 in DataLoader workers, where the workers
            already use the cores (measured: with the cores busy, the thread costs a third of the
            throughput). Plain local tars, plain HTTP, pipes and standard input are read by the C
            walk itself (descriptor to member bytes, no thread) when the extension is built.
        allow_commands: run the ``pipe:`` commands an index names as shards. Off by default: an
            index is data, and opening one runs nothing (names you pass yourself always run).

    Raises:
        ShardNotFoundError: a local shard or pattern matches nothing.
        CommandNotAllowedError: the index names a command shard and ``allow_commands`` is false.
        IndexFormatError: an index's shard entry is damaged or leaves the index's directory.
        ValueError: a bad option value.
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | IndexReader,
        *,
        decode: DecodeMode | None = None,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        allow_pickle: bool = False,
        shuffle: int = 0,
        shuffle_shards: bool | None = None,
        seed: int = 0,
        epoch_size: int | None = None,
        handler: Handler = "raise",
        rank: int | None = None,
        world_size: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 60.0,
        storage_options: Mapping[str, Any] | None = None,
        read_ahead: int | None = None,
        allow_commands: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if not callable(handler) and handler not in _HANDLERS:
            raise ValueError(f"handler must be one of {_HANDLERS} or a function, not {handler!r}")
        if shuffle < 0:
            raise ValueError(f"shuffle must be >= 0, not {shuffle}")
        if epoch_size is not None and epoch_size < 0:
            raise ValueError(f"epoch_size must be >= 0, not {epoch_size}")
        self.urls, self._starts = _shard_list(urls, allow_commands)
        self.decoder = Decoder(decode, decoders=decoders, allow_pickle=allow_pickle) if (decode or decoders or allow_pickle) else None
        self.transform = transform
        self.shuffle_size = shuffle
        self.shuffle_shards = shuffle > 0 if shuffle_shards is None else shuffle_shards
        self.seed = seed
        self.epoch = 0
        self.epoch_size = epoch_size
        self.handler = handler
        self.rank = rank
        self.world_size = world_size
        self._source_options: dict[str, Any] = {
            "block_size": block_size,
            "retries": retries,
            "backoff": backoff,
            "timeout": timeout,
            "storage_options": dict(storage_options or {}),
            "headers": dict(headers or {}),
        }
        self.read_ahead = read_ahead
        self.batching: tuple[int, Callable[[list[Any]], Any] | None, bool] | None = None

    # -- webdataset's fluent stages: ds.shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(fn).batched(64) --
    def shuffle(self, size: int) -> TarStream:
        """A copy with a sample shuffle buffer of ``size`` (and shard shuffling), as ``shuffle=size`` gives."""
        out = copy.copy(self)
        out.shuffle_size = size
        out.shuffle_shards = size > 0
        return out

    def decode(self, mode: DecodeMode | None = "pil", **options: Any) -> TarStream:
        """A copy that decodes as ``TarDataset(decode=mode, decoders=..., allow_pickle=...)`` does.

        Decoding runs before ``transform`` and every ``map``/``to_tuple`` stage, whatever the call order.
        """
        out = copy.copy(self)
        out.decoder = Decoder(mode, **options)
        return out

    def map(self, fn: Callable[[Any], Any]) -> TarStream:
        """A copy that applies ``fn`` to each sample after the stages before it."""
        out = copy.copy(self)
        out.transform = fn if self.transform is None else _Chain(self.transform, fn)
        return out

    def to_tuple(self, *keys: str) -> TarStream:
        """A copy that yields tuples, as webdataset's ``to_tuple``: ``"jpg;png"`` takes the first present.

        A sample without any of a field's keys is a ``DecodeError`` (then the ``handler`` decides).
        """
        if len(keys) == 1 and " " in keys[0]:
            keys = tuple(keys[0].split())
        return self.map(_ToTuple(keys))

    def map_tuple(self, *fns: Callable[[Any], Any] | None) -> TarStream:
        """A copy that applies one function per field of tuple samples (after ``to_tuple``), as
        webdataset's ``map_tuple``; ``None`` keeps a field as it is."""
        return self.map(_MapTuple(fns))

    def batched(
        self, batch_size: int, collation_fn: Callable[[list[Any]], Any] | None = collate, *, partial: bool = True
    ) -> TarStream:
        """A copy that yields batches of ``batch_size`` samples, made by ``collation_fn`` (default
        :func:`tarindex.collate.collate`, as webdataset's: scalars to numpy arrays, tensors and arrays
        stacked, anything else in lists; ``None``: plain lists), as webdataset's ``batched``.

        Batches are made in each DataLoader worker after the shuffle buffer and ``epoch_size``; the
        last batch of a worker is shorter unless ``partial=False`` drops it. Use it with
        ``DataLoader(stream, batch_size=None, num_workers=N)``: one message per batch between processes
        instead of one per sample.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        out = copy.copy(self)
        out.batching = (batch_size, collation_fn, partial)
        return out

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: it reseeds the shard order and the shuffle buffer (call before each epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Samples per rank per epoch; defined only with ``epoch_size`` and without ``batched``."""
        if self.epoch_size is None:
            raise TypeError("TarStream has no length without epoch_size (shards are not indexed)")
        if self.batching is not None:  # each worker's last batch may be short: the count depends on the workers
            raise TypeError("a batched TarStream has no length: batches per rank depend on the DataLoader's workers")
        return self.epoch_size

    # -- one shard ----------------------------------------------------------------
    def _raw(self, shard: int) -> Iterator[tuple[int, Sample]]:
        """``(sample offset, raw sample)`` for one shard, in archive order."""
        url = self.urls[shard]
        index = self._starts[shard] if self._starts is not None else None
        source = open_source(url, **self._source_options, read_ahead=read_ahead_for(url, self.read_ahead))
        try:
            fd = source.fileno() if isinstance(source, FileSource) and source.size is not None and fused() else -1
            if fd >= 0 and not is_zstd(os.pread(fd, 4, 0)):  # a local tar: the C walk reads it, one copy, no thread
                yield from iter_samples(fd, url, index=index)
                return
            first = b""
            if source.walks_direct and fused():  # HTTP, pipes: the C walk reads the socket or pipe itself
                while len(first) < 4 and (more := source.read(64 << 10)):
                    first += more
                if not is_zstd(first[:4]):
                    yield from iter_samples(Stream(source, first), url, index=index)
                    while source.read(source.block_size):  # to the end: the body's length is checked there
                        pass
                    return
            raw = archive(source, first=first)
            yield from iter_samples(raw, url, index=index)
            for _ in raw:  # to the end: a pipe's exit status and an HTTP body's length are checked there
                pass
        finally:
            source.close()

    def _handle(self, exc: Exception) -> bool:
        """Apply the handler: ``False`` to raise, ``True`` to go on (a warning was issued)."""
        handler = self.handler
        if handler == "raise":
            return False
        if callable(handler):
            return bool(handler(exc))
        sample_only = handler == "warn" and isinstance(exc, DecodeError)
        skipped = "skipping the sample" if sample_only else "skipping the rest of the shard"
        warnings.warn(f"{exc}; {skipped}", StreamWarning, stacklevel=3)
        return True

    def shard_samples(self, shard: int) -> Iterator[Any]:
        """Samples of one shard (decoded, transformed), with the error handler applied.

        Raises:
            TarIndexError: with ``handler="raise"``: ``CorruptArchiveError``,
                ``SourceError``, ``ShardNotFoundError`` or ``DecodeError``, each
                naming the shard and the byte offset.
        """
        decoder, transform = self.decoder, self.transform
        url = self.urls[shard]
        try:
            for offset, sample in self._raw(shard):
                if decoder is not None or transform is not None:
                    try:
                        if decoder is not None:
                            sample = decoder(sample)
                        if transform is not None:
                            sample = transform(sample)
                    except Exception as exc:
                        err = DecodeError(url, offset, f"sample {shown(str(sample.get('__key__')))}: {type(exc).__name__}: {exc}")
                        if not self._handle(err):
                            raise err from exc
                        if self.handler == "skip_shard":
                            return
                        continue
                yield sample
        except (TarIndexError, OSError) as exc:
            if isinstance(exc, DecodeError) or not self._handle(exc):
                raise

    # -- an epoch -----------------------------------------------------------------
    def slot(self) -> Slot:
        """This process's reader slot (rank, world size, worker, workers)."""
        return worker_slot(self.rank, self.world_size)

    def shards_for(self, slot: Slot, epoch: int | None = None) -> list[int]:
        """The shard numbers ``slot`` reads in ``epoch`` (default: the current one), in reading order."""
        order = shard_order(
            len(self.urls), seed=self.seed, epoch=self.epoch if epoch is None else epoch, shuffle=self.shuffle_shards
        )
        return shards_for_slot(order, slot, fill=self.epoch_size is not None)

    def _quota(self, slot: Slot) -> int | None:
        if self.epoch_size is None:
            return None
        base, extra = divmod(self.epoch_size, slot.num_workers)
        return base + (slot.worker < extra)

    def _passes(self, shards: list[int]) -> Iterator[Any]:
        """Each shard once; with ``epoch_size``, again and again until the quota stops the caller."""
        while True:
            got = False
            for shard in shards:
                for sample in self.shard_samples(shard):
                    got = True
                    yield sample
            if self.epoch_size is None:
                return
            if not got:
                names = ", ".join(self.urls[s] for s in shards[:3])
                raise TarIndexError(f"{names}: no samples to fill epoch_size={self.epoch_size}")

    def __iter__(self) -> Iterator[Any]:
        slot = self.slot()
        epoch = self.epoch
        if len(self.urls) < slot.count and slot.index == 0:
            policy = "each reads one shard again" if self.epoch_size is not None else "they yield nothing"
            warnings.warn(
                f"{len(self.urls)} shards for {slot.world_size} ranks x {slot.num_workers} workers: "
                f"{slot.count - len(self.urls)} readers have no shard of their own, {policy}",
                StreamWarning,
                stacklevel=2,
            )
        shards = self.shards_for(slot, epoch)
        quota = self._quota(slot)
        if not shards or quota == 0:
            return
        stream: Iterator[Any] = self._passes(shards)
        if self.shuffle_size > 0:
            rng = random.Random(f"tarindex-samples-{self.seed}-{epoch}-{slot.rank}-{slot.worker}")
            stream = buffer_shuffle(stream, self.shuffle_size, rng)
        if quota is not None:
            stream = itertools.islice(stream, quota)
        if self.batching is not None:
            size, collation_fn, partial = self.batching
            stream = batched(stream, size, collation_fn, partial=partial)
        yield from stream

    def __repr__(self) -> str:
        return f"TarStream({len(self.urls)} shards, shuffle={self.shuffle_size}, epoch={self.epoch})"
