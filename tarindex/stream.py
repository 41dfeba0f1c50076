"""TarStream: an iterable dataset over unindexed shards (local, ``-``, ``pipe:``, HTTP, fsspec).

The same parser as the index builder, the same grouping and the same decoders as
:class:`tarindex.TarDataset`. This module is the facade: the constructor's checks and the public methods.
The concepts behind it have a module each: the shards it reads (:mod:`tarindex._shardlist`), walking one
shard (:mod:`tarindex._shardwalk`: the sequential walk, resuming mid-shard, the index-driven pick), the stages
after the walk and the error handler (:mod:`tarindex._stages`), epochs, slots and resuming
(:mod:`tarindex._epochs`, the state protocol in :mod:`tarindex._state`). Importing this module imports torch
where it is installed (:mod:`tarindex._iterable`); it works without it.
"""

from __future__ import annotations

import copy
import os
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _args
from ._epochs import (
    ONE,
    SKIP,
    EpochRun,
    RunState,
    SharedEpoch,
    Slot,
    checked_states,
    idle_readers,
    run_for,
    run_state,
    shard_order,
    shards_for_slot,
    stream_key,
    worker_quota,
    worker_slot,
)
from ._iterable import IterableDataset
from ._shardlist import shard_list
from ._shardwalk import Numbered, ShardWalker
from ._stages import (
    DEFAULT_SHUFFLE,
    Chain,
    Handler,
    Handling,
    MapTuple,
    Raw,
    ToTuple,
    buffer_size,
    check_handler,
    check_max_errors,
    decoded_batches,
)
from ._state import pending_state, reader_state
from .collate import batched, collate
from .decode import DecodeMode, Decoder, Image, failure
from .errors import DecodeError, OptionError, OptionTypeError, StateError, StreamWarning, TarIndexError, counted, shown
from .index.reader import IndexReader
from .options import SourceAliases, SourceOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_SHUFFLE", "Handler", "TarStream"]  # public (tarindex.TarStream); the rest serves the package

Sample = dict[str, Any]


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

    Keyword Args:
        block_size (int | None): overrides ``options.block_size`` (bytes per read).
        retries (int | None): overrides ``options.retries`` (network retries without progress).
        backoff (float | None): overrides ``options.backoff`` (first backoff in seconds, doubled each time).
        timeout (float | None): overrides ``options.timeout`` (socket timeout in seconds).
        storage_options (Mapping[str, Any] | None): overrides ``options.storage_options`` (object stores, fsspec; docs/remote.md).
        headers (Mapping[str, str] | None): overrides ``options.headers`` (extra HTTP(S) request headers, e.g. ``{"Authorization": "Bearer ..."}``).

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
        read_ahead: int | None = None,
        allow_commands: bool = False,
        max_errors: int | None = None,
        max_member_size: int | None = None,
        allow_missing_end: bool = False,
        **aliases: Unpack[SourceAliases],
    ) -> None:
        super().__init__()
        self.options = SourceOptions.given(options, call="TarStream", **aliases)  # an unknown keyword first, as Python's own check
        check_handler(handler)
        size = buffer_size(shuffle)
        _args.shard_names(urls, "urls", call="TarStream", also=(IndexReader,))
        decoders = _args.decoders(decoders)
        if shuffle_shards is not None and not isinstance(shuffle_shards, bool):
            raise OptionTypeError(f"shuffle_shards must be True, False or None, not {type(shuffle_shards).__name__} {shuffle_shards!r}")
        epoch_size = _args.count(epoch_size, "epoch_size", means="samples per rank per epoch", none="each shard once")
        shards = shard_list(urls, allow_commands)
        self.urls = shards.names
        self.decoder = Decoder(decode, decoders=decoders, allow_pickle=allow_pickle) if (decode or decoders or allow_pickle) else None
        self.transform = transform
        self.shuffle_size = size
        self.shuffle_shards = size > 0 if shuffle_shards is None else shuffle_shards
        self.seed = seed
        self._epoch = SharedEpoch(0)
        self.epoch_size = epoch_size
        check_max_errors(max_errors)
        if max_member_size is not None and max_member_size < 0:
            raise OptionError(f"max_member_size must be >= 0, not {max_member_size}")
        self._handling = Handling(handler, max_errors)
        self.rank = rank
        self.world_size = world_size
        self._walker = ShardWalker(
            shards, self.options, read_ahead=read_ahead, max_member_size=max_member_size, allow_missing_end=allow_missing_end
        )
        self.batching: tuple[int, Callable[[list[Any]], Any] | None, bool] | None = None
        self._pending: list[dict[str, Any]] | None = None  # loaded states, used by the next iteration of their epoch
        self._run: EpochRun | None = None  # the current iteration's run (its state is state_dict())
        self._run_slot: Slot | None = None
        self._run_epoch = 0
        self._defer = False  # this iteration decodes in batches (decoded_batches), not sample by sample

    def _copy(self) -> TarStream:
        """A copy for a stage: the same settings, its own handler count and random readers."""
        out = copy.copy(self)
        out._handling = copy.copy(self._handling)
        out._walker = copy.copy(self._walker)
        return out

    # -- webdataset's fluent stages: ds.shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(fn).batched(64) --
    def shuffle(self, size: int | bool = True) -> TarStream:
        """A copy with a sample shuffle buffer of ``size`` (and shard shuffling), as ``shuffle=size`` gives
        (``True``, the default: :data:`DEFAULT_SHUFFLE` samples).

        Raises:
            OptionTypeError: ``size`` is not an integer or bool.
            OptionError: ``size`` is negative.
        """
        out = self._copy()
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
        out = self._copy()
        out.decoder = Decoder(mode, decoders=kept, allow_pickle=pickle)
        out.decoder.set_epoch(self.epoch)
        return out

    def map(self, fn: Callable[[Any], Any]) -> TarStream:
        """A copy that applies ``fn`` to each sample after the stages before it."""
        out = self._copy()
        out.transform = fn if self.transform is None else Chain(self.transform, fn)
        return out

    def to_tuple(self, *keys: str) -> TarStream:
        """A copy that yields tuples, as webdataset's ``to_tuple``: ``"jpg;png"`` takes the first present.

        A sample without any of a field's keys is a ``DecodeError`` (then the ``handler`` decides).
        """
        if len(keys) == 1 and " " in keys[0]:
            keys = tuple(keys[0].split())
        return self.map(ToTuple(keys))

    def map_tuple(self, *fns: Callable[[Any], Any] | None) -> TarStream:
        """A copy that applies one function per field of tuple samples (after ``to_tuple``), as
        webdataset's ``map_tuple``; ``None`` keeps a field as it is."""
        return self.map(MapTuple(fns))

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
        out = self._copy()
        out.batching = (batch_size, collation_fn, partial)
        return out

    # -- one shard's samples: walked, decoded, the handler applied ----------------------------------------
    def shard_samples(self, shard: int) -> Iterator[Any]:
        """Samples of one shard (decoded, transformed), with the error handler applied.

        Raises:
            TarIndexError: with ``handler="raise"``: ``CorruptArchiveError``,
                ``SourceError``, ``ShardNotFoundError`` or ``DecodeError``, each
                naming the shard and the byte offset.
        """
        for _, _, sample in self._samples(shard, self._walker.walk_shard(shard), defer=False):
            if sample is not SKIP:
                yield sample

    def _read(self, shard: int, offset: int, ordinal: int, mode: int) -> Iterator[tuple[int, int, Any]]:
        """``EpochRun``'s read: the samples of a ``WHOLE`` or ``AFTER`` work item."""
        return self._samples(shard, self._walker.walk_shard(shard, mode, ((offset, ordinal),)))

    def _pick(self, shard: int, wanted: list[tuple[int, int]]) -> Iterator[tuple[int, int, Any]]:
        """``EpochRun``'s pick: the samples at ``wanted`` ``(offset, ordinal)`` positions of ``shard``, in
        ordinal order (one read each where the shard allows: an error the handler passes over skips that sample
        only; else one pass from the start)."""
        walker = self._walker
        if walker.seekable(shard):
            for at in wanted:
                yield from self._samples(shard, walker.walk_shard(shard, ONE, (at,)))
            return
        yield from self._samples(shard, walker.walk_shard(shard, ONE, wanted))

    def _samples(self, shard: int, numbered: Numbered, *, defer: bool | None = None) -> Iterator[tuple[int, int, Any]]:
        """``(offset, ordinal, sample)`` for raw ``(ordinal, (offset, sample))`` of ``shard`` (what the walk
        yields): decoded and transformed, with the handler applied (a skipped sample comes as ``SKIP``, so
        that positions still advance). ``defer`` (default: this iteration's choice): raw samples as ``Raw``,
        decoded per batch by :func:`tarindex._stages.decoded_batches`."""
        defer = self._defer if defer is None else defer
        decoder, transform = (None, None) if defer else (self.decoder, self.transform)
        handling = self._handling
        url = self.urls[shard]
        try:
            for ordinal, (offset, sample) in numbered:
                if defer:
                    yield offset, ordinal, Raw(url, offset, sample)
                    continue
                if decoder is not None or transform is not None:
                    try:
                        if decoder is not None:
                            sample = decoder(sample)
                        if transform is not None:
                            sample = transform(sample)
                    except Exception as exc:
                        err = DecodeError(url, offset, f"sample {shown(str(sample.get('__key__')))}: {failure(exc)}")
                        if not handling.goes_on(err):
                            raise err from exc
                        yield offset, ordinal, SKIP
                        if handling.handler == "skip_shard":
                            return
                        continue
                if handling.in_a_row:
                    handling.in_a_row = 0
                yield offset, ordinal, sample
        except StateError:
            raise
        except (TarIndexError, OSError) as exc:
            if isinstance(exc, DecodeError) or not handling.goes_on(exc):
                raise

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

    def _new_run(self, slot: Slot, epoch: int, resumed: bool = False) -> EpochRun:
        shards = self.shards_for(slot, epoch)

        def empty() -> Exception:
            names = ", ".join(self.urls[s] for s in shards[:3])
            return TarIndexError(f"{names}: no samples to fill epoch_size={self.epoch_size}")

        return EpochRun(
            self._read,
            self._pick,
            self._walker.seekable,
            own=shards,
            shuffle=self.shuffle_size,
            key=stream_key("tarindex-samples", self.seed, epoch, slot.rank, slot.worker, *(("resumed",) if resumed else ())),
            quota=worker_quota(self.epoch_size, slot),
            empty=empty,
        )

    def _run_for(self, slot: Slot, epoch: int) -> EpochRun:
        """This slot's run of ``epoch``: fresh, or continued from the loaded states of that epoch."""
        states = [st for st in self._pending or () if st["epoch"] == epoch]
        return run_for(states, slot, lambda s, resumed: self._new_run(s, epoch, resumed), self._position)

    def _position(self, state: Mapping[str, Any]) -> RunState:
        """A state's position (:func:`tarindex._epochs.run_state`: every field checked)."""
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
        """The TarStream states in ``state_dict`` and their epoch, each checked against this stream
        (:func:`tarindex._epochs.checked_states`) before anything changes.

        Raises:
            StateError: the first field that is missing, of the wrong type or out of range, states of
                several epochs or layouts, two states of one reader.
        """
        return checked_states(state_dict, self._config(), self._position)

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
        idle = None if self._pending else idle_readers(len(self.urls), slot, fill=self.epoch_size is not None)
        if idle is not None:
            warnings.warn(idle, StreamWarning, stacklevel=3)  # the caller of next() on __iter__
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
                raws = batched(stream, size, None, partial=partial)
                stream = decoded_batches(raws, self.decoder, self.transform, collation_fn, self._handling)
            else:
                stream = batched(stream, size, collation_fn, partial=partial)
        return stream

    def _close_readers(self) -> None:
        """Close this process's random readers (the walk's)."""
        self._walker.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_run"] = None  # the run's callbacks are this object's; the walker drops its handles itself
        return state

    def __repr__(self) -> str:
        return f"TarStream({counted(len(self.urls), 'shard')}, shuffle={self.shuffle_size}, epoch={self.epoch})"
