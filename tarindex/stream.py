"""TarStream: an iterable dataset over unindexed shards (local, ``-``, ``pipe:``, HTTP, fsspec).

The same parser as the index builder (:func:`tarindex.tar.iter_tar` over the
chunks of a :mod:`tarindex.sources` source, zstd decompressed on the way; a
local plain tar is read with ``pread``), the same grouping
(:func:`tarindex.grouping.iter_samples`) and the same decoders as
:class:`tarindex.TarDataset`. Importing this module imports torch where it is installed (:mod:`tarindex._iterable`);
it works without it.
"""

from __future__ import annotations

import copy
import operator
import os
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from . import _args
from ._codecs import of_head
from ._iterable import IterableDataset
from ._localreads import block_chunks, slow_storage
from ._process import FORK
from ._split import (
    AFTER,
    ONE,
    SKIP,
    WHOLE,
    EpochRun,
    Slot,
    deal_rest,
    run_state,
    shard_order,
    shards_for_slot,
    stream_key,
    worker_info,
    worker_slot,
)
from ._state import SharedEpoch, pending_state, reader_state, reader_states
from .access.codecs import Indexed
from .access.open import OpenOptions, open_random
from .access.reader import RandomReader
from .collate import batched, collate
from .compression import ArchiveEnd, looks_like_shard, sniff_file
from .decode import DecodeMode, Decoder, Image, failure
from .errors import (
    CorruptArchiveError,
    DecodeError,
    OptionError,
    OptionTypeError,
    StateError,
    StreamWarning,
    TarIndexError,
    counted,
    shown,
)
from .grouping import fused, iter_samples
from .identity import check_shard, check_source
from .index.reader import IndexReader
from .naming import ShardRef, check_commands, shard_name
from .options import SourceOptions
from .scan import archive
from .shards import INDEX_SUFFIX, expand_shards
from .sources import FileSource, open_source
from .tables import ShardInfo
from .tar import DirectArchive

__all__ = ["DEFAULT_SHUFFLE", "Handler", "TarStream"]  # public (tarindex.TarStream); the rest serves the package

Sample = dict[str, Any]
Handler = Literal["raise", "warn", "skip_shard"] | Callable[[Exception], bool]
_HANDLERS = ("raise", "warn", "skip_shard")

DEFAULT_SHUFFLE = 1000
"""Samples in the shuffle buffer of ``shuffle=True``: the default buffer of webdataset's ``shuffle()``."""


def buffer_size(shuffle: object) -> int:
    """The sample shuffle buffer that ``shuffle`` asks for: ``True`` is :data:`DEFAULT_SHUFFLE`, ``False`` 0,
    an integer itself.

    Raises:
        OptionTypeError: neither a bool nor an integer (``"100"``, ``100.0``, ``None``).
        OptionError: a negative integer.
    """
    if shuffle is True or shuffle is False:
        return DEFAULT_SHUFFLE if shuffle else 0
    try:
        size = operator.index(shuffle)  # type: ignore[arg-type]  # any integer type (numpy's too); refused below otherwise
    except TypeError as exc:
        raise OptionTypeError(f"shuffle must be a buffer size (int) or True/False, not {type(shuffle).__name__} {shuffle!r}") from exc
    if size < 0:
        raise OptionError(f"shuffle must be >= 0 (a buffer size) or True/False, not {size}")
    return size


def _shard_list(urls: Any, allow_commands: bool) -> tuple[list[str], list[int] | None, list[ShardInfo] | None, str | None]:
    """Shard names, and when ``urls`` is an index (checked by its recorded kinds: a command only when
    ``allow_commands``), each shard's first global sample number and index entry, and the index's path."""
    reader: IndexReader | None = None
    if isinstance(urls, IndexReader):
        reader = urls
    elif isinstance(urls, (str, os.PathLike)):
        p = os.fspath(urls)
        if p.endswith(INDEX_SUFFIX) or (os.path.isfile(p) and not looks_like_shard(sniff_file(p))):  # by content: .tgz too
            reader = IndexReader(os.path.abspath(p))
    if reader is None:  # paths made absolute now: a later os.chdir (Hydra) does not move the stream
        return [os.path.abspath(u) if ShardRef.of(u).local else u for u in expand_shards(urls)], None, None, None
    try:
        check_commands(reader.path, reader.shards, allow_commands)
        names = [shard_name(reader.path, info) for info in reader.shards]
        starts = [int(x) for x in reader.shard_starts().tolist()]
        infos = list(reader.shards)
    finally:
        if reader is not urls:
            reader.close()
    return names, starts, infos, str(reader.path)


def read_ahead_for(url: str, read_ahead: int | None) -> int | None:
    """The read-ahead a shard gets: ``read_ahead`` if given; else 0 for a local file read in a
    DataLoader worker (the workers already use the cores), else ``None`` (the source's default, 8)."""
    if read_ahead is None and ShardRef.of(url).local and worker_info() is not None:
        return 0
    return read_ahead


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


_TAR_BLOCK = 512


class _Raw:
    """A sample read but not yet decoded, with where it is (for the error of a batch that decodes it)."""

    __slots__ = ("offset", "sample", "url")

    def __init__(self, url: str, offset: int, sample: Sample) -> None:
        self.url, self.offset, self.sample = url, offset, sample


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


class TarStream(IterableDataset):  # type: ignore[type-arg]
    """Stream samples from tar shards, once each per epoch, split over ranks and DataLoader workers.

    Yields the sample dicts of :class:`tarindex.TarDataset`: ``__key__``,
    ``__url__`` (the shard name), one entry per extension (``bytes`` or
    decoded), and ``__index__`` (the global sample number) when streaming from
    an index. Without ``shuffle``, samples come in archive order, shard after shard.

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
            or :class:`~tarindex.IndexReader` whose shards are streamed. A single
            file is an index or a shard by its content, whatever its name.
        decode: as for :class:`~tarindex.TarDataset`.
        decoders: as for :class:`~tarindex.TarDataset`.
        transform: as for :class:`~tarindex.TarDataset`.
        allow_pickle: as for :class:`~tarindex.TarDataset`.
        shuffle: size of the sample shuffle buffer (0 or ``False``: no sample shuffling; ``True``:
            :data:`DEFAULT_SHUFFLE` = 1,000 samples, webdataset's default buffer).
        shuffle_shards: shuffle the shard order each epoch; default: when there is a shuffle buffer.
        seed: with the epoch, rank and worker, fixes every random choice.
        epoch_size: samples per rank per epoch, at least 1 (see above); ``None`` streams each shard once.
        handler: what a bad shard or sample does: ``"raise"`` (default);
            ``"warn"``: warn and go on with the next sample (decode errors) or the
            next shard (unreadable or corrupt shard); ``"skip_shard"``: warn and
            skip the rest of the shard; or a function of the exception that
            returns ``True`` to go on as ``"warn"`` does (webdataset's handlers).
        max_errors: with a handler that goes on, this many errors in a row (no
            good sample between them, in one worker) raise the last one; ``None``: no limit.
        rank: overrides ``torch.distributed`` / ``RANK``.
        world_size: overrides ``torch.distributed`` / ``WORLD_SIZE``.
        options: how shards are read (:class:`~tarindex.options.SourceOptions`: block size, retries,
            timeouts, headers, storage options), as ``TarDataset`` and ``build_index`` take them.
        block_size: overrides ``options.block_size`` (bytes per read).
        retries: overrides ``options.retries`` (network retries without progress).
        backoff: overrides ``options.backoff`` (first backoff in seconds, doubled each time).
        timeout: overrides ``options.timeout`` (socket timeout in seconds).
        storage_options: overrides ``options.storage_options`` (object stores, fsspec; docs/remote.md).
        headers: overrides ``options.headers`` (extra HTTP(S) request headers, e.g. ``{"Authorization": "Bearer ..."}``).
        read_ahead: blocks a reader thread keeps ready ahead of the parser (0: read in the
            parser's thread), for sources read in blocks. Default: 8 for network sources; for
            local zstd files 8 in the main process and 0 in DataLoader workers, where the workers
            already use the cores (measured: with the cores busy, the thread costs a third of the
            throughput). Plain local tars, plain HTTP, pipes and standard input are read by the C
            walk itself (descriptor to member bytes, no thread) when the extension is built.
        allow_commands: run the ``pipe:`` commands an index names as shards. Off by default: an
            index is data, and opening one runs nothing (names you pass yourself always run).
        max_member_size: the largest member accepted, in bytes, from any shard: a header that
            claims more is a :class:`~tarindex.errors.CorruptArchiveError` naming the shard, the
            member and its offset, raised before anything is allocated for it. ``None`` (default):
            8 GiB (:data:`tarindex.tar.MAX_MEMBER_SIZE`) for shards of unknown length (pipes,
            HTTP, zstd and gzip shards), and a local plain tar's own size.
        allow_missing_end: accept shards that end without the end-of-archive marker (written by tools
            that omit it). Off by default: such a shard is a :class:`~tarindex.errors.CorruptArchiveError`,
            since a shard cut at a member boundary looks the same.

    Raises:
        ShardNotFoundError: a local shard or pattern matches nothing.
        CommandNotAllowedError: the index names a command shard and ``allow_commands`` is false.
        IndexFormatError: an index's shard entry is damaged or leaves the index's directory.
        OptionError: a bad ``shuffle`` (negative), ``epoch_size`` (below 1), ``max_errors`` or ``max_member_size``
            value; :class:`~tarindex.errors.OptionTypeError` for a ``shuffle`` that is not an integer or bool
            (``"100"``), a ``shuffle_shards`` that is not a bool or ``None``, ``urls`` that are not shard names
            or an index (a :class:`~tarindex.TarDataset`: the message says to pass its index path), ``decoders``
            that is not a mapping of extension to function (``["jpg"]``).
        ValueError: a bad ``handler``.
        StaleIndexError: (when iterating) streaming from an index, a shard's size or
            modification time differs from the index's (its ``__index__`` numbers would be wrong).
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | IndexReader,
        *,
        decode: DecodeMode | Image | None = None,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        allow_pickle: bool = False,
        shuffle: int | bool = 0,
        shuffle_shards: bool | None = None,
        seed: int = 0,
        epoch_size: int | None = None,
        handler: Handler = "raise",
        rank: int | None = None,
        world_size: int | None = None,
        options: SourceOptions | None = None,
        block_size: int | None = None,
        retries: int | None = None,
        backoff: float | None = None,
        timeout: float | None = None,
        storage_options: Mapping[str, Any] | None = None,
        read_ahead: int | None = None,
        allow_commands: bool = False,
        headers: Mapping[str, str] | None = None,
        max_errors: int | None = None,
        max_member_size: int | None = None,
        allow_missing_end: bool = False,
    ) -> None:
        super().__init__()
        if not callable(handler) and handler not in _HANDLERS:
            raise ValueError(f"handler must be one of {_HANDLERS} or a function, not {handler!r}")
        size = buffer_size(shuffle)
        _args.shard_names(urls, "urls", call="TarStream", also=(IndexReader,))
        decoders = _args.decoders(decoders)
        if shuffle_shards is not None and not isinstance(shuffle_shards, bool):
            raise OptionTypeError(f"shuffle_shards must be True, False or None, not {type(shuffle_shards).__name__} {shuffle_shards!r}")
        epoch_size = _args.count(epoch_size, "epoch_size", means="samples per rank per epoch", none="each shard once")
        self.urls, self._starts, self._infos, self._index = _shard_list(urls, allow_commands)
        self.decoder = Decoder(decode, decoders=decoders, allow_pickle=allow_pickle) if (decode or decoders or allow_pickle) else None
        self.transform = transform
        self.shuffle_size = size
        self.shuffle_shards = size > 0 if shuffle_shards is None else shuffle_shards
        self.seed = seed
        self._epoch = SharedEpoch(0)
        self.epoch_size = epoch_size
        self.handler = handler
        if max_errors is not None and max_errors < 1:
            raise OptionError(f"max_errors must be >= 1, not {max_errors}")
        self.max_errors = max_errors
        if max_member_size is not None and max_member_size < 0:
            raise OptionError(f"max_member_size must be >= 0, not {max_member_size}")
        self.max_member_size = max_member_size
        self.allow_missing_end = allow_missing_end
        self._errors = 0  # errors handled in a row, in this process
        self.rank = rank
        self.world_size = world_size
        self.options = SourceOptions.given(options, storage_options=storage_options, headers=headers).with_(
            block_size=block_size, retries=retries, backoff=backoff, timeout=timeout
        )
        self.read_ahead = read_ahead
        self.batching: tuple[int, Callable[[list[Any]], Any] | None, bool] | None = None
        self._pending: list[dict[str, Any]] | None = None  # loaded states, used by the next iteration of their epoch
        self._run: EpochRun | None = None  # the current iteration's run (its state is state_dict())
        self._run_slot: Slot | None = None
        self._run_epoch = 0
        self._readers: dict[int, RandomReader | None] = {}  # per process: random readers of shards read from a position
        self._index_reader: IndexReader | None = None  # per process: the index streamed, for its frame tables and seek points
        self._readers_fork = 0
        self._defer = False  # this iteration decodes in batches (_decoded_batches), not sample by sample

    # -- webdataset's fluent stages: ds.shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(fn).batched(64) --
    def shuffle(self, size: int | bool = True) -> TarStream:
        """A copy with a sample shuffle buffer of ``size`` (and shard shuffling), as ``shuffle=size`` gives
        (``True``, the default: :data:`DEFAULT_SHUFFLE` samples).

        Raises:
            OptionTypeError: ``size`` is not an integer or bool.
            OptionError: ``size`` is negative.
        """
        out = copy.copy(self)
        out.shuffle_size = buffer_size(size)
        out.shuffle_shards = out.shuffle_size > 0
        return out

    def decode(
        self,
        mode: DecodeMode | Image | None = "pil",
        *,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        allow_pickle: bool | None = None,
    ) -> TarStream:
        """A copy that decodes images as ``mode`` says (webdataset's image specs with webdataset's meanings,
        ``"numpy"``, or a :class:`tarindex.decode.Image`), keeping the decoders given before: the
        constructor's or an earlier stage's ``decoders=`` (updated by ``decoders`` here) and
        ``allow_pickle`` (unless given here).

        Decoding runs before ``transform`` and every ``map``/``to_tuple`` stage, whatever the call order;
        with ``batched`` and an ``Image`` of a fixed size, it runs per batch (see :meth:`batched`).

        Raises:
            ValueError: an unknown ``mode``, or ``"torch"`` (ambiguous: the message says what to write).
        """
        old = self.decoder
        kept = dict(old.custom) if old is not None else {}
        kept.update(decoders or {})
        pickle = (old.allow_pickle if old is not None else False) if allow_pickle is None else allow_pickle
        out = copy.copy(self)
        out.decoder = Decoder(mode, decoders=kept, allow_pickle=pickle)
        out.decoder.set_epoch(self.epoch)
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

        With a :class:`tarindex.decode.Image` decoder of a fixed size, samples travel through the
        shuffle buffer as bytes and each batch is decoded together: its images in a thread pool into
        one ``uint8`` array per member, then the other members, ``transform`` and the ``map`` stages
        sample by sample; the default collation hands the array on without a copy. A sample the
        ``handler`` skips then leaves its batch one shorter.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        out = copy.copy(self)
        out.batching = (batch_size, collation_fn, partial)
        return out

    # -- one shard ----------------------------------------------------------------
    def _raw(self, shard: int) -> Iterator[tuple[int, Sample]]:
        """``(sample offset, raw sample)`` for one shard, in archive order."""
        url = self.urls[shard]
        index = self._starts[shard] if self._starts is not None else None
        source = open_source(url, options=self.options, read_ahead=read_ahead_for(url, self.read_ahead))
        try:
            if self._infos is not None:  # from an index: its sample numbers hold only for the indexed shard
                if isinstance(source, FileSource):
                    check_shard(url, source.fileno(), self._infos[shard])
                else:
                    check_source(url, self._infos[shard], source.size, source.mtime_ns)
            fd = source.fileno() if isinstance(source, FileSource) and source.size is not None else -1
            slow = fd >= 0 and slow_storage(fd)  # NFS, FUSE, ...: blocks read ahead (_localreads)
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

    def _handle(self, exc: Exception) -> bool:
        """Apply the handler: ``False`` to raise, ``True`` to go on (a warning was issued).

        ``max_errors`` errors in a row (no good sample between them) raise the last one.
        """
        handler = self.handler
        if handler == "raise":
            return False
        self._errors += 1
        if self.max_errors is not None and self._errors >= self.max_errors:
            return False
        if callable(handler):
            return bool(handler(exc))
        sample_only = handler == "warn" and isinstance(exc, DecodeError)
        skipped = "skipping the sample" if sample_only else "skipping the rest of the shard"
        warnings.warn(f"{exc}; {skipped} ({self._errors} in a row)", StreamWarning, stacklevel=3)
        return True

    def shard_samples(self, shard: int) -> Iterator[Any]:
        """Samples of one shard (decoded, transformed), with the error handler applied.

        Raises:
            TarIndexError: with ``handler="raise"``: ``CorruptArchiveError``,
                ``SourceError``, ``ShardNotFoundError`` or ``DecodeError``, each
                naming the shard and the byte offset.
        """
        for _, _, sample in self._samples(shard, enumerate(self._raw(shard)), defer=False):
            if sample is not SKIP:
                yield sample

    def _samples(
        self, shard: int, numbered: Iterator[tuple[int, tuple[int, Sample]]], *, defer: bool | None = None
    ) -> Iterator[tuple[int, int, Any]]:
        """``(offset, ordinal, sample)`` for raw ``(ordinal, (offset, sample))`` of ``shard`` (what
        ``enumerate`` makes of :meth:`_raw`): decoded and transformed, with the handler applied (a
        skipped sample comes as ``SKIP``, so that positions still advance). ``defer`` (default: this
        iteration's choice): raw samples as ``_Raw``, decoded per batch by :meth:`_decoded_batches`."""
        defer = self._defer if defer is None else defer
        decoder, transform = (None, None) if defer else (self.decoder, self.transform)
        url = self.urls[shard]
        try:
            for ordinal, (offset, sample) in numbered:
                if defer:
                    yield offset, ordinal, _Raw(url, offset, sample)
                    continue
                if decoder is not None or transform is not None:
                    try:
                        if decoder is not None:
                            sample = decoder(sample)
                        if transform is not None:
                            sample = transform(sample)
                    except Exception as exc:
                        err = DecodeError(url, offset, f"sample {shown(str(sample.get('__key__')))}: {failure(exc)}")
                        if not self._handle(err):
                            raise err from exc
                        yield offset, ordinal, SKIP
                        if self.handler == "skip_shard":
                            return
                        continue
                if self._errors:
                    self._errors = 0
                yield offset, ordinal, sample
        except StateError:
            raise
        except (TarIndexError, OSError) as exc:
            if isinstance(exc, DecodeError) or not self._handle(exc):
                raise

    def _decoded_batches(self, batches: Iterator[list[_Raw]], collation_fn: Callable[[list[Any]], Any] | None) -> Iterator[Any]:
        """Batches of raw samples decoded together (``Decoder.decode_batch``: images in a thread pool, into
        one array), transformed sample by sample, with the handler applied (a skipped sample is left out)."""
        decoder, transform = self.decoder, self.transform
        for items in batches:
            samples = [it.sample for it in items]
            errors = decoder.decode_batch(samples) if decoder is not None else [None] * len(samples)
            out = []
            for it, sample, exc in zip(items, samples, errors):
                if exc is None and transform is not None:
                    try:
                        sample = transform(sample)
                    except Exception as err:
                        exc = err
                if exc is not None:
                    error = DecodeError(it.url, it.offset, f"sample {shown(str(it.sample.get('__key__')))}: {failure(exc)}")
                    if not self._handle(error):
                        raise error from exc
                    continue
                self._errors = 0
                out.append(sample)
            if out:
                yield collation_fn(out) if collation_fn is not None else out

    # -- positions: reading from a sample on, reading one sample again ------------------------
    def _random(self, shard: int) -> RandomReader | None:
        """A random reader of a shard's tar bytes (:func:`tarindex.access.open.open_random`: with an index, checked
        against its entry, wherever ``TarDataset`` reads at random; without one, a local file or an ``http(s)://``
        URL, plain or zstd with a seek table), else ``None`` (pipes, standard input, a codec or source without
        random access: read from the start). Kept per process while the epoch runs."""
        if self._readers_fork != FORK[0]:
            self._readers, self._readers_fork, self._index_reader = {}, FORK[0], None
        if shard in self._readers:
            return self._readers[shard]
        reader: RandomReader | None
        try:
            reader = open_random(self.urls[shard], self._indexed(shard), self._open_options())
        except (TarIndexError, OSError):  # no random access, no Range support, unreachable: read from the start (errors come there)
            reader = None
        if len(self._readers) >= 8:
            old = self._readers.pop(next(iter(self._readers)))
            if old is not None:
                old.close()
        self._readers[shard] = reader
        return reader

    def _indexed(self, shard: int) -> Indexed | None:
        """Shard ``shard`` of the index streamed (opened once per process), or ``None`` without one."""
        if self._index is None:
            return None
        if self._index_reader is None:
            self._index_reader = IndexReader(self._index)
        return Indexed(self._index_reader, shard)

    def _open_options(self) -> OpenOptions:
        return OpenOptions(self.options)

    def _close_readers(self) -> None:
        readers, self._readers = self._readers, {}
        index, self._index_reader = self._index_reader, None
        if self._readers_fork == FORK[0]:
            for reader in readers.values():
                if reader is not None:
                    reader.close()
            if index is not None:
                index.close()

    def _raw_at(self, shard: int, offset: int, ordinal: int, mode: int) -> Iterator[tuple[int, Sample]]:
        """Raw ``(offset, sample)`` pairs from the sample at ``offset`` (the shard's ``ordinal``-th) on:
        read with ``read_at`` from there when the shard allows it, else from the start, skipping.
        ``AFTER`` leaves that sample out, ``ONE`` yields it only.

        Raises:
            StateError: the shard has no sample ``ordinal`` at ``offset`` (it changed since the state was saved).
        """
        url = self.urls[shard]
        first_index = self._starts[shard] if self._starts is not None else None
        reader = self._random(shard)
        numbered: Iterator[tuple[int, tuple[int, Sample]]]
        if reader is not None:
            index = None if first_index is None else first_index + ordinal
            block = self.options.block_size
            chunks = _chunks_at(reader, offset, block)
            walk = iter_samples(chunks, url, index=index, max_member_size=self.max_member_size, allow_missing_end=self.allow_missing_end)
            numbered = enumerate(((offset + off, sample) for off, sample in walk), ordinal)
        else:
            numbered = ((k, pair) for k, pair in enumerate(self._raw(shard)) if k >= ordinal)
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
                yield off, sample
                if mode == ONE:
                    return
        except CorruptArchiveError as exc:
            if found or reader is None:
                raise
            raise StateError(
                f"{url}: no sample {ordinal} at offset {offset}, where the saved state says it is (not a tar header there): "
                "the shard changed since the state was saved"
            ) from exc

    def _read_item(self, shard: int, offset: int, ordinal: int, mode: int) -> Iterator[tuple[int, int, Any]]:
        if mode == WHOLE:
            return self._samples(shard, enumerate(self._raw(shard)))
        return self._samples(shard, enumerate(self._raw_at(shard, offset, ordinal, mode), ordinal + (mode == AFTER)))

    def _pick(self, shard: int, wanted: list[tuple[int, int]]) -> Iterator[tuple[int, int, Any]]:
        """The samples at ``wanted`` ``(offset, ordinal)`` positions of ``shard``, in ordinal order:
        one read each where the shard allows, else one pass from the start."""
        if self._random(shard) is not None:
            for offset, ordinal in wanted:
                yield from self._read_item(shard, offset, ordinal, ONE)
            return
        want = dict((ordinal, offset) for offset, ordinal in wanted)
        last = max(want)

        def wanted_only() -> Iterator[tuple[int, tuple[int, Sample]]]:
            for k, (off, sample) in enumerate(self._raw(shard)):
                if k in want:
                    if off != want[k]:
                        raise StateError(
                            f"{self.urls[shard]}: sample {k} is at offset {off}, the saved state says {want[k]}: "
                            "the shard changed since the state was saved"
                        )
                    yield k, (off, sample)
                if k >= last:
                    return

        yield from self._samples(shard, wanted_only())

    # -- an epoch -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch (shared with DataLoader workers, persistent ones too)."""
        return self._epoch.value

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.value = epoch
        if self.decoder is not None:  # random image crops are drawn per epoch
            self.decoder.set_epoch(epoch)

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

    def _new_run(self, slot: Slot, epoch: int, *, resumed: bool = False) -> EpochRun:
        shards = self.shards_for(slot, epoch)

        def empty() -> Exception:
            names = ", ".join(self.urls[s] for s in shards[:3])
            return TarIndexError(f"{names}: no samples to fill epoch_size={self.epoch_size}")

        return EpochRun(
            self._read_item,
            self._pick,
            lambda shard: self._random(shard) is not None,
            own=shards,
            shuffle=self.shuffle_size,
            key=stream_key("tarindex-samples", self.seed, epoch, slot.rank, slot.worker, *(("resumed",) if resumed else ())),
            quota=self._quota(slot),
            empty=empty,
        )

    def _run_for(self, slot: Slot, epoch: int) -> EpochRun:
        """This slot's run of ``epoch``: fresh, or continued from the loaded states of that epoch (checked
        when loaded: :meth:`_checked_states`)."""
        states = [st for st in self._pending or () if st["epoch"] == epoch]
        if not states:
            return self._new_run(slot, epoch)
        layouts = {(st["slot"][1], st["slot"][3]) for st in states}
        if layouts == {(slot.world_size, slot.num_workers)}:
            mine = [st for st in states if (st["slot"][0], st["slot"][2]) == (slot.rank, slot.worker)]
            if len(mine) != 1:
                raise StateError(
                    f"TarStream states for {counted(slot.world_size, 'rank')} x {counted(slot.num_workers, 'worker')} have "
                    f"{len(mine)} for rank {slot.rank} worker {slot.worker} (expected 1)"
                )
            run = self._new_run(slot, epoch)
            run.restore(self._position(mine[0]))
            return run
        old = sorted(states, key=lambda st: (st["slot"][0], st["slot"][2]))
        world, workers = old[0]["slot"][1], old[0]["slot"][3]
        have = [(st["slot"][0], st["slot"][2]) for st in old]
        if len(old) != world * workers or have != [(r, w) for r in range(world) for w in range(workers)]:
            raise StateError(
                f"TarStream states cover readers {have[:8]}{'...' if len(have) > 8 else ''} of {counted(world, 'rank')} x "
                f"{counted(workers, 'worker')}: resuming on another number of ranks or workers needs the state of every "
                "reader of the interrupted epoch (tarindex.stream_states)"
            )
        runs = []
        for st in old:
            r = self._new_run(Slot(st["slot"][0], world, st["slot"][2], workers), epoch)
            r.restore(self._position(st))
            runs.append(r)
        run = self._new_run(slot, epoch, resumed=True)
        run.queue, run.quota = deal_rest(runs, slot.index, slot.count)
        return run

    def _position(self, state: Mapping[str, Any]) -> Any:
        """A state's position (:func:`tarindex._split.run_state`: every field checked)."""
        return run_state(state, n_shards=len(self.urls), shuffle=self.shuffle_size)

    def _config(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "shuffle": self.shuffle_size,
            "shuffle_shards": self.shuffle_shards,
            "shards": len(self.urls),
            "names": zlib.crc32("\n".join(os.path.basename(u.rstrip("/")) for u in self.urls).encode()),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this reader (rank and DataLoader worker) is in the epoch, as plain values.

        Holds the epoch, the reader's slot, the work left (shard order position and the byte offset
        reached in the shard being read), the shuffle buffer as sample positions (a few KB) and the
        count of random draws: loading it (:meth:`load_state_dict`) continues with exactly the
        samples an uninterrupted epoch would have yielded after the last one delivered.
        ``StatefulDataLoader`` calls it in each worker; without workers, call it between samples.
        """
        slot = self.slot()
        run = self._run if self._run is not None and (self._run_slot, self._run_epoch) == (slot, self.epoch) else None
        if run is None:
            pending = pending_state(self._pending, self.epoch, slot)
            if pending is not None:
                return pending
            run = self._new_run(slot, self.epoch)
        return reader_state("TarStream", self._config(), self.epoch, slot, run.state())

    def load_state_dict(self, state_dict: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from saved states on the next iteration of their epoch (which this selects).

        ``state_dict`` is one reader's state (what ``StatefulDataLoader`` hands each worker), or
        every reader's states (a list, or :func:`tarindex.stream_states` of a DataLoader
        checkpoint): with the saved ranks and workers each continues exactly where it stopped;
        with others, what the saved readers had left is dealt to the new ones, each remaining
        sample exactly once (another order).

        Raises:
            StateError: a malformed state, or one of another stream (shards, seed, shuffle).
        """
        self._load(*self._checked_states(state_dict))

    def _load(self, states: list[dict[str, Any]], epoch: int) -> None:
        """Take states :meth:`_checked_states` checked, for the next iteration of ``epoch``."""
        self._pending = states
        self._run = None
        self.epoch = epoch

    def _checked_states(self, state_dict: Any) -> tuple[list[dict[str, Any]], int]:
        """The TarStream states in ``state_dict`` and their epoch, each field checked against this stream
        (configuration, slot, epoch, position: :func:`tarindex._split.run_state`) before anything changes.

        Raises:
            StateError: the first field that is missing, of the wrong type or out of range, states of
                several epochs or layouts, two states of one reader.
        """
        layouts, readers = set(), set()

        def check(st: Mapping[str, Any], slot: tuple[int, int, int, int]) -> None:
            rank, world, worker, workers = slot
            self._position(st)
            layouts.add((world, workers))
            if (rank, worker) in readers:
                raise StateError(f"two TarStream states of rank {rank} worker {worker}")
            readers.add((rank, worker))

        states, epoch = reader_states(state_dict, "TarStream", self._config(), check)
        if len(layouts) != 1:
            raise StateError(f"TarStream states of several layouts (ranks, workers): {sorted(layouts)}")
        return states, epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch: it reseeds the shard order and the shuffle buffer (call before each epoch).

        The value is shared with DataLoader workers, persistent ones included: each reads it when
        an iteration starts. A loaded state holds for its own epoch only.
        """
        self.epoch = epoch

    def __len__(self) -> int:
        """Samples per rank per epoch; defined only with ``epoch_size`` and without ``batched``."""
        if self.epoch_size is None:
            raise TypeError("TarStream has no length without epoch_size (shards are not indexed)")
        if self.batching is not None:  # each worker's last batch may be short: the count depends on the workers
            raise TypeError("a batched TarStream has no length: batches per rank depend on the DataLoader's workers")
        return self.epoch_size

    def __iter__(self) -> Iterator[Any]:
        stream = self._start()
        try:
            yield from stream
        finally:
            self._close_readers()

    def _start(self) -> Iterator[Any]:
        """Start this reader's epoch now and return its samples as a plain iterator: what iterating the
        stream yields, one generator fewer per sample, for a consumer that calls :meth:`_close_readers`
        itself when it is done (:func:`tarindex.mix` pulls its sources this way)."""
        slot = self.slot()
        epoch = self.epoch
        if len(self.urls) < slot.count and slot.index == 0 and not self._pending:
            idle = slot.count - len(self.urls)
            if self.epoch_size is not None:
                policy = "it reads one shard again" if idle == 1 else "each reads one shard again"
            else:
                policy = "it yields nothing" if idle == 1 else "they yield nothing"
            warnings.warn(
                f"{counted(len(self.urls), 'shard')} for {counted(slot.world_size, 'rank')} x {counted(slot.num_workers, 'worker')}: "
                f"{counted(idle, 'reader')} {'has no shard of its' if idle == 1 else 'have no shard of their'} own, {policy}",
                StreamWarning,
                stacklevel=3,  # the caller of next() on __iter__
            )
        if self.decoder is not None:
            self.decoder.set_epoch(epoch)
        self._defer = self.batching is not None and self.decoder is not None and self.decoder.batches
        run = self._run_for(slot, epoch)
        self._pending = None
        self._run, self._run_slot, self._run_epoch = run, slot, epoch
        stream: Iterator[Any] = iter(run)
        if self.batching is not None:
            size, collation_fn, partial = self.batching
            if self._defer:
                stream = self._decoded_batches(batched(stream, size, None, partial=partial), collation_fn)
            else:
                stream = batched(stream, size, collation_fn, partial=partial)
        return stream

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"], state["_readers_fork"], state["_run"] = {}, 0, None  # handles stay in their process
        return state

    def __repr__(self) -> str:
        return f"TarStream({counted(len(self.urls), 'shard')}, shuffle={self.shuffle_size}, epoch={self.epoch})"
