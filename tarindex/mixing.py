"""Weighted mixing of several :class:`~tarindex.TarStream` sources: :func:`mix` and :class:`Mix`.

(The module is ``mixing``, not ``mix``: importing a submodule ``mix`` would make ``tarindex.mix`` the
module instead of the function.)

Each sample comes from source ``k`` with probability ``weights[k]`` (among the sources still
running), drawn from a counter-based random stream of ``(seed, epoch, rank, worker)``: the same
sequence on every run, and a resumed run continues at its draw without replaying the ones before.
Every source splits over ranks and DataLoader workers as it does alone, so a mix does too. The
state (``state_dict()``) is the mix's draws and yields plus each source's own state. Importing this
module imports torch where it is installed (:mod:`tarindex._iterable`); it works without it.
"""

from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from . import _args
from ._epochs import Draws, SharedEpoch, Slot, stream_key, worker_quota
from ._iterable import IterableDataset
from ._state import check_draws, flag, flags, integer, integers, pending_state, reader_state, reader_states
from .errors import OptionError, OptionTypeError, StateError, TarIndexError, counted
from .stream import TarStream

__all__: list[str] = []  # internal: tarindex.mix and tarindex.Mix are the public names

StopRule = Literal["first", "all", "never"]
_STOPS = ("first", "all", "never")


def mix(
    sources: Sequence[TarStream],
    weights: Sequence[float] | None = None,
    *,
    seed: int = 0,
    stop: StopRule = "first",
    epoch_size: int | None = None,
) -> Mix:
    """Mix ``sources``: each sample from source ``k`` with probability ``weights[k]`` (default: equal).

    Args:
        sources: the streams to mix (each with its own shards, shuffle, decoding, stages).
        weights: relative weights, one per source, non-negative, not all zero.
        seed: fixes the draws (with the epoch, rank and worker).
        stop: ``"first"``: the epoch ends when any source runs out; ``"all"``: a source that runs
            out leaves the draw (the others' weights renormalised) until all have; ``"never"``: a
            source that runs out starts its epoch again (small sources repeat); it needs ``epoch_size``.
        epoch_size: samples per rank per epoch (split over its DataLoader workers, as
            :class:`~tarindex.TarStream`'s), ``None``: as ``stop`` says.

    Raises:
        ValueError: no sources, a weight count that differs from the sources', a negative weight,
            weights that are all zero, a bad ``stop``.
        OptionError: ``epoch_size`` below 1, or ``None`` with ``stop="never"`` (:class:`~tarindex.errors.OptionTypeError`:
            not an integer; a source that is not a :class:`~tarindex.TarStream`).
    """
    return Mix(sources, weights, seed=seed, stop=stop, epoch_size=epoch_size)


class Mix(IterableDataset):  # type: ignore[type-arg]
    """The iterable :func:`mix` returns (see there); ``set_epoch``, ``state_dict``, ``load_state_dict``."""

    def __init__(
        self,
        sources: Sequence[TarStream],
        weights: Sequence[float] | None = None,
        *,
        seed: int = 0,
        stop: StopRule = "first",
        epoch_size: int | None = None,
    ) -> None:
        super().__init__()
        if not sources:
            raise ValueError("mix needs at least one source")
        for k, source in enumerate(sources):
            if not isinstance(source, TarStream):
                raise OptionTypeError(
                    f"mix: source {k} is a path, not a TarStream; to mix shards by name, wrap them: "
                    f"tarindex.TarStream({os.fspath(source)!r})"
                    if isinstance(source, (str, os.PathLike))
                    else f"mix: source {k} must be a TarStream, not {_args.given(source)}"
                )
        w = [1.0] * len(sources) if weights is None else [float(x) for x in weights]
        if len(w) != len(sources):
            raise ValueError(f"{counted(len(w), 'weight')} for {counted(len(sources), 'source')}")
        if any(not x >= 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"weights must be >= 0 and not all 0, got {w}")
        if stop not in _STOPS:
            raise ValueError(f"stop must be one of {_STOPS}, not {stop!r}")
        epoch_size = _args.count(epoch_size, "epoch_size", means="samples per rank per epoch", none="as stop says")
        if stop == "never" and epoch_size is None:
            raise OptionError(
                "mix: stop='never' needs epoch_size (samples per rank per epoch): without it the mix never ends, "
                "and no epoch, DataLoader pass or resume point does either; to train by steps, pass "
                "epoch_size = steps per epoch x batch size (as MixSampler's num_samples)"
            )
        self.sources = list(sources)
        self.weights = w
        self.seed = seed
        self.stop: StopRule = stop
        self.epoch_size = epoch_size
        self._epoch = SharedEpoch(0)
        self._pending: list[dict[str, Any]] | None = None
        self._run: _MixRun | None = None
        self._run_key: tuple[Slot, int] | None = None

    @property
    def epoch(self) -> int:
        """The epoch (shared with DataLoader workers, persistent ones too)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the mix and of every source."""
        self._epoch.value = epoch
        for source in self.sources:
            source.set_epoch(epoch)

    def __len__(self) -> int:
        if self.epoch_size is None:
            raise TypeError("a mix has no length without epoch_size")
        return self.epoch_size

    def slot(self) -> Slot:
        """This process's reader slot (the first source's)."""
        return self.sources[0].slot()

    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "weights": self.weights, "stop": self.stop, "sources": len(self.sources)}

    def _new_run(self, slot: Slot, epoch: int, *, resumed: bool = False) -> _MixRun:
        quota = worker_quota(self.epoch_size, slot)
        key = stream_key("tarindex-mix", self.seed, epoch, slot.rank, slot.worker, *(("resumed",) if resumed else ()))
        return _MixRun(key, len(self.sources), quota)

    def _run_for(self, slot: Slot, epoch: int) -> _MixRun:
        states = [st for st in self._pending or () if st["epoch"] == epoch]
        if not states:
            return self._new_run(slot, epoch)
        same = [st for st in states if tuple(st["slot"]) == (slot.rank, slot.world_size, slot.worker, slot.num_workers)]
        if len(same) == 1:
            run = self._new_run(slot, epoch)
            run.restore(same[0], self.weights, self.stop)
            return run
        # another layout: the sources deal what they had left; the draws start afresh, the quota left is split
        run = self._new_run(slot, epoch, resumed=True)
        if self.epoch_size is not None:
            left = sum(max(0, int(st["quota"]) - int(st["yielded"])) for st in states if st["quota"] is not None)
            base, extra = divmod(left, slot.count)
            run.quota = base + (slot.index < extra)
        return run

    def state_dict(self) -> dict[str, Any]:
        """This reader's position: the mix's draws and yields, and each source's state (see
        :meth:`tarindex.TarStream.state_dict`)."""
        slot = self.slot()
        run = self._run if self._run is not None and self._run_key == (slot, self.epoch) else None
        if run is None:
            pending = pending_state(self._pending, self.epoch, slot)
            if pending is not None:
                return pending
            run = self._new_run(slot, self.epoch)
        return {
            **reader_state("Mix", self._config(), self.epoch, slot, run.state()),
            "sources": [s.state_dict() for s in self.sources],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from saved states on the next iteration of their epoch: one reader's (what
        ``StatefulDataLoader`` hands each worker) or every reader's (another layout: each source
        deals what it had left, each remaining sample once).

        Raises:
            StateError: a malformed state, or one of another mix (seed, weights, stop, sources).
        """

        def check(st: Mapping[str, Any], slot: tuple[int, int, int, int]) -> None:
            _MixRun.check(st, self.weights, self.stop)
            if not isinstance(st.get("sources"), list) or len(st["sources"]) != len(self.sources):
                raise StateError(f"malformed Mix state: {_count(st.get('sources'))} source states for {counted(len(self.sources), 'source')}")

        states, epoch = reader_states(state_dict, "Mix", self._config(), check)
        loaded = [source._checked_states([st["sources"][k] for st in states]) for k, source in enumerate(self.sources)]
        for source, (theirs, epoch) in zip(self.sources, loaded):  # every state checked: now nothing can fail
            source._load(theirs, epoch)
        self._pending = states
        self._run = None
        self._epoch.value = epoch

    def __iter__(self) -> Iterator[Any]:
        slot, epoch = self.slot(), self.epoch
        run = self._run_for(slot, epoch)
        self._pending = None
        self._run, self._run_key = run, (slot, epoch)
        return run.iterate(self.sources, self.weights, self.stop)  # no generator of ours between the sources and the caller

    def __repr__(self) -> str:
        return f"Mix({counted(len(self.sources), 'source')}, weights={self.weights}, stop={self.stop!r}, epoch={self.epoch})"


class _MixRun:
    """One reader's mix of an epoch: which source each draw picks, as plain data.

    The draws come 4,096 at a time; the samples of a block of draws are pulled in C (``map(next, ...)``
    over the chosen sources' iterators, chained), so the mix adds no Python per sample. The position
    inside a block is the block's iterator's: :meth:`state` reads it.
    """

    def __init__(self, key: int, n: int, quota: int | None) -> None:
        self.key = key
        self.quota = quota
        self.step = 0  # draws made before the current block
        self.yielded = 0  # samples yielded before the current block
        self.active = [True] * n
        self.rounds = [0] * n
        self.done = False
        self._block: Iterator[Any] | None = None  # the current block's iterators (one per draw, then one empty)
        self._size = 0  # draws in the current block

    def _pulled(self) -> int:
        """Draws of the current block whose samples were pulled."""
        if self._block is None:
            return 0
        return min(self._size, self._size + 1 - operator.length_hint(self._block))

    def state(self) -> dict[str, Any]:
        pulled = self._pulled()
        return {
            "step": self.step + pulled,
            "yielded": self.yielded + pulled,
            "quota": self.quota,
            "active": list(self.active),
            "rounds": list(self.rounds),
            "done": self.done,
        }

    @staticmethod
    def check(state: Mapping[str, Any], weights: list[float], stop: StopRule) -> tuple[int, int, int | None, list[bool], list[int], bool]:
        """A mix reader's position in ``state``, every field checked against the mix: ``step`` and ``yielded``
        (draws and samples: no more samples than draws, nor than the quota) within ``[0, 2**62]``,
        ``active`` and ``rounds`` one per source (sources leave the draw only with ``stop="all"``, start
        again only with ``"never"``, and a run not done has a source left to draw with a weight), ``done``
        a bool.

        Raises:
            StateError: naming the first field that is missing, of the wrong type or out of range.
        """
        n = len(weights)
        step, yielded = integer(state, "step", "Mix"), integer(state, "yielded", "Mix")
        quota = None if state.get("quota", 0) is None else integer(state, "quota", "Mix")
        active, rounds, done = flags(state, "active", "Mix", n), integers(state, "rounds", "Mix", n), flag(state, "done", "Mix")
        check_draws("Mix", step, yielded, ("its quota", quota), active, weights, stop=stop, done=done, rounds=rounds)
        return step, yielded, quota, active, rounds, done

    def restore(self, state: Mapping[str, Any], weights: list[float], stop: StopRule) -> None:
        """Continue from ``state``'s position (:meth:`check`)."""
        self.step, self.yielded, self.quota, self.active, self.rounds, self.done = self.check(state, weights, stop)

    def iterate(self, sources: list[TarStream], weights: list[float], stop: StopRule) -> Iterator[Any]:
        """The samples: draw ``k`` yields the next sample of source ``k`` (one draw at a time, as
        :func:`tarindex._epochs.pick` defines them; a source that runs out as ``stop`` says)."""
        return itertools.chain.from_iterable(self._blocks(sources, weights, stop))

    def _blocks(self, sources: list[TarStream], weights: list[float], stop: StopRule) -> Iterator[Iterable[Any]]:
        """Iterables of samples, chained by :meth:`iterate`: a block of draws pulled in C until a
        source runs out; a source's first sample of its next round (``"never"``) on its own."""
        iterators = np.empty(len(sources), dtype=object)  # each source's epoch iterator (no generator of the source's between)
        for k, source in enumerate(sources):
            iterators[k] = source._start()
        try:
            yield from self._draw(sources, weights, stop, iterators)
        finally:  # the end, or the mix's iterator dropped: keep the position, let go of the sources
            pulled = self._pulled()
            self.step += pulled
            self.yielded += pulled
            self._block = None  # (it holds the sources' iterators: their files close as they go)
            for source in sources:
                source._close_readers()

    def _draw(self, sources: list[TarStream], weights: list[float], stop: StopRule, iterators: Any) -> Iterator[Iterable[Any]]:
        """:meth:`_blocks` over the sources' started iterators."""
        draws = Draws(self.key)
        quota = self.quota
        while not self.done:
            cumulative = list(itertools.accumulate(w if a else 0.0 for w, a in zip(weights, self.active)))
            left = _BLOCK if quota is None else min(_BLOCK, quota - self.yielded)
            if cumulative[-1] <= 0 or left <= 0:
                break
            picks = draws.picks(self.step, left, cumulative)
            while len(picks):  # the block's draws, while the sources stay
                chosen = iterators[picks].tolist()
                chosen.append(_EMPTY)  # reached only when every draw got its sample
                self._block, self._size = iter(chosen), len(picks)
                yield map(next, self._block)  # a source that runs out ends the map early
                pulled = len(picks) + 1 - operator.length_hint(self._block)
                self._block = None
                if pulled > len(picks):
                    self.step += len(picks)
                    self.yielded += len(picks)
                    break
                k = int(picks[pulled - 1])  # this draw's source ran out
                self.step += pulled
                self.yielded += pulled - 1
                if stop == "first":
                    self.done = True
                    return
                if stop == "all":
                    self.active[k] = False
                    sources[k]._close_readers()
                    break  # new draws from the next step, among the sources left
                self.rounds[k] += 1  # "never": the source's epoch again
                sources[k]._close_readers()
                iterators[k] = sources[k]._start()
                sample = next(iterators[k], _END)
                if sample is _END:
                    raise TarIndexError(f"mix: source {k} ({sources[k]!r}) has no samples to repeat")
                self.yielded += 1
                yield (sample,)
                picks = picks[pulled:]
        self.done = True


def _count(value: object) -> int | str:
    return len(value) if isinstance(value, (list, tuple)) else type(value).__name__


_BLOCK = 4096
"""Draws made at once."""
_EMPTY: Iterator[Any] = iter(())
_END: Any = object()
