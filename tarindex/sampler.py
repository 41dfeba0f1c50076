"""ShardSampler: a distributed, shard-local, resumable sampler in O(shards) memory.

The order of one epoch is a *stream*: a bijection from stream positions
``[0, N)`` to sample numbers, computed position by position from the seed:

1. shards are permuted (numpy, seeded from ``(seed, epoch)``);
2. consecutive permuted shards form windows of ``chunk_shards`` shards; the
   samples of a window occupy a contiguous range of stream positions;
3. inside a window, positions are permuted: a numpy permutation of the
   window's size when it has at most ``2**20`` samples (8 MB at most), else a
   keyed Feistel network over the window's size (cycle walking), so memory
   never grows with the number of samples. With ``block_samples`` > 1 the
   window's runs of that many consecutive samples are permuted instead, each
   run kept in order (the window's last, partial run stays at its end).

The stream is dealt to ranks in contiguous blocks (rank ``r`` gets positions
``[r*L, (r+1)*L)``), so each rank reads a few windows, one after the other, and
at any moment touches at most ``chunk_shards`` shards. Padding and
``drop_last`` follow ``DistributedSampler``: padding repeats the first samples
of the stream, ``drop_last`` drops the tail; every rank gets ``L`` samples.

Resumption: a state records the epoch, the *plan* (the stream intervals this
pass deals out; the whole stream unless the pass was itself resumed with
another world size), the world size and how many samples each rank consumed.
Resuming with the same world size continues each rank's block where it
stopped; with another world size the unconsumed parts of all old blocks become
the new plan, dealt to the new ranks the same way. See ``docs/sampling.md``.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from . import _args
from ._epochs import Draws, pick, stream_key
from ._state import (
    EPOCHS,
    MAX_READERS,
    check_config,
    check_draws,
    check_header,
    flag,
    flags,
    header,
    integer,
    integers,
    required,
    saved_config,
)
from .errors import SamplerStateError, StateError, counted

__all__ = ["MixSampler", "ShardSampler", "ShardSized"]

_BLOCK = 8192  # stream positions mapped per vectorised step
_TABLE_MAX = 1 << 20  # windows up to this size get an exact numpy permutation; larger ones a Feistel network
_ROUNDS = 8  # Feistel rounds (Luby-Rackoff needs 4 with ideal round functions; 8 for margin)
_U64 = 2**64
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser constants
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

Plan = tuple[tuple[int, int], ...]


class ShardSized(Protocol):
    """Anything with samples per shard (``TarDataset``, or a synthetic object)."""

    @property
    def shard_sizes(self) -> Sequence[int] | npt.NDArray[np.integer[Any]]:
        """Samples per shard, in order; sample numbers run shard after shard."""
        ...


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser on an array (wrapping arithmetic, no warnings for arrays)."""
    z = z ^ (z >> _S30)
    z = z * _M1
    z = z ^ (z >> _S27)
    z = z * _M2
    return z ^ (z >> _S31)


class _Feistel:
    """A keyed bijection of ``[0, n)`` (balanced Feistel network plus cycle walking)."""

    __slots__ = ("_half", "_keys", "_mask", "n")

    def __init__(self, n: int, keys: npt.NDArray[np.uint64]) -> None:
        self.n = n
        half = max(1, math.ceil(max(1, (n - 1).bit_length()) / 2))
        self._half = np.uint64(half)
        self._mask = np.uint64((1 << half) - 1)
        self._keys = keys

    def _once(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (_mix(right ^ k) & self._mask)
        return (left << self._half) | right

    def __call__(self, j: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        if self.n <= 1:
            return j
        out = self._once(j)
        n = np.uint64(self.n)
        out_of_range = np.flatnonzero(out >= n)
        while out_of_range.size:  # cycle walking: the domain is < 4n, so few steps
            out[out_of_range] = self._once(out[out_of_range])
            out_of_range = out_of_range[out[out_of_range] >= n]
        return out


class _EpochOrder:
    """The stream of one epoch: O(shards) arrays, samples computed on demand."""

    def __init__(
        self,
        sizes: npt.NDArray[np.int64],
        starts: npt.NDArray[np.int64],
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        chunk_shards: int,
        block_samples: int,
    ) -> None:
        self.seed, self.epoch, self.shuffle, self.chunk = seed, epoch, shuffle, chunk_shards
        self.block = block_samples
        self.starts = starts
        n_shards = len(sizes)
        if shuffle:
            self.perm = np.random.default_rng([seed % _U64, epoch % _U64, 0]).permutation(n_shards)
        else:
            self.perm = np.arange(n_shards)
        self.pcum = np.zeros(n_shards + 1, dtype=np.int64)
        np.cumsum(sizes[self.perm], out=self.pcum[1:])
        self.win_bounds = self.pcum[np.r_[0:n_shards:chunk_shards, n_shards]]
        self._window: tuple[int, _Feistel | npt.NDArray[np.int64]] | None = None

    def _window_perm(self, w: int, size: int) -> _Feistel | npt.NDArray[np.int64]:
        """Window ``w``'s permutation of ``[0, size)``: a table if small, else a Feistel network."""
        if self._window is None or self._window[0] != w:
            seq = np.random.SeedSequence([self.seed % _U64, self.epoch % _U64, 1, w])
            perm: _Feistel | npt.NDArray[np.int64]
            if size <= _TABLE_MAX:
                perm = np.random.default_rng(seq).permutation(size)
            else:
                perm = _Feistel(size, seq.generate_state(_ROUNDS, np.uint64).astype(np.uint64))
            self._window = (w, perm)
        return self._window[1]

    def samples(self, a: int, b: int) -> Iterator[npt.NDArray[np.int64]]:
        """Sample numbers at stream positions ``[a, b)``, in arrays of at most ``_BLOCK``."""
        if not self.shuffle:
            for lo in range(a, b, _BLOCK):
                yield np.arange(lo, min(b, lo + _BLOCK), dtype=np.int64)
            return
        bounds, chunk = self.win_bounds, self.chunk
        w = int(np.searchsorted(bounds, a, side="right")) - 1
        while a < b:
            base, end = int(bounds[w]), int(bounds[w + 1])
            if end <= a:  # empty window
                w += 1
                continue
            stop = min(b, end)
            shards = self.perm[w * chunk : (w + 1) * chunk]
            cum = self.pcum[w * chunk : w * chunk + len(shards) + 1] - base
            units = (end - base) // self.block  # runs of block samples; a partial last run stays in place
            perm = self._window_perm(w, units)
            for lo in range(a, stop, _BLOCK):
                hi = min(stop, lo + _BLOCK)
                j = np.arange(lo - base, hi - base, dtype=np.int64)
                if self.block == 1:
                    j = _apply(perm, j)
                else:
                    full = np.flatnonzero(j < units * self.block)
                    run, within = np.divmod(j[full], self.block)
                    j[full] = _apply(perm, run) * self.block + within
                t = np.searchsorted(cum, j, side="right") - 1
                yield self.starts[shards[t]] + (j - cum[t])
            a = stop
            w += 1


def _apply(perm: _Feistel | npt.NDArray[np.int64], x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    if isinstance(perm, _Feistel):
        return perm(x.astype(np.uint64)).astype(np.int64)
    return perm[x]


def _plan_to_stream(plan: Plan, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """Stream intervals behind plan positions ``[lo, hi)`` (``hi`` <= the plan's total)."""
    pos = 0
    for a, b in plan:
        n = b - a
        s, e = max(lo, pos), min(hi, pos + n)
        if s < e:
            yield a + s - pos, a + e - pos
        pos += n
        if pos >= hi:
            return


def _merge(intervals: Iterator[tuple[int, int]]) -> Plan:
    out: list[tuple[int, int]] = []
    for a, b in intervals:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif a < b:
            out.append((a, b))
    return tuple(out)


def _shown(counts: list[int]) -> str:
    """Counts for an error message: the first few of many."""
    return str(counts) if len(counts) <= 8 else f"{counts[:8]}... ({len(counts)} counts)"


def _default_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """World size and rank from ``torch.distributed`` (imported here, lazily)."""
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: a single process, unless a launcher says otherwise
        dist = None  # type: ignore[assignment]
    if dist is not None and dist.is_available() and dist.is_initialized():
        world, me = dist.get_world_size(), dist.get_rank()
    elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            "ShardSampler: WORLD_SIZE > 1 but torch.distributed is not initialised; "
            "call init_process_group() first or pass num_replicas and rank"
        )
    else:
        world, me = 1, 0
    return (world if num_replicas is None else num_replicas), (me if rank is None else rank)


class ShardSampler:
    """Distributed sampler that keeps reads local to a few shards, in O(shards) memory.

    The ``DistributedSampler`` interface (``__iter__``, ``__len__``,
    ``set_epoch``) plus ``state_dict`` / ``load_state_dict`` for mid-epoch
    resumption. Works as ``DataLoader(ds, sampler=...)`` (it needs no torch
    itself; torch is imported only to read the default rank and world size).

    Args:
        dataset: anything with ``shard_sizes`` (``TarDataset``, or a synthetic
            object with a numpy array of sizes).
        num_replicas: world size; default ``torch.distributed``'s, or 1 when it
            is not initialised.
        rank: this process's rank; default ``torch.distributed``'s, or 0.
        shuffle: permute shards and samples within windows; ``False`` gives
            index order, dealt in contiguous blocks.
        seed: the same on every rank.
        drop_last: drop the stream's tail so it divides evenly, instead of
            padding with the stream's first samples.
        chunk_shards: shards per shuffle window (the number of shards a rank
            reads at once).
        block_samples: shuffle runs of this many consecutive samples instead
            of single samples (each run read in order): about the samples per
            zstd frame makes every frame decompress once per epoch, whatever
            the frame cache holds. Default (``None``): the dataset's
            ``samples_per_frame`` when it has one (``TarDataset``: 1 for plain
            tar, the mean samples per frame of its zstd shards), else 1.
        elastic: deal the stream by position instead of in blocks: rank ``r``
            takes stream positions ``r, r + world, r + 2 * world, ...``, so step
            ``j`` of a job (``world`` ranks x ``B`` samples) covers stream
            positions ``[j * world * B, (j + 1) * world * B)`` whatever the world
            size: the same global sequence on any number of ranks and workers
            (keep ``world * B`` constant), and a state resumes on another world
            size at the same global position. The cost: every rank reads from
            every shard of the current window (see ``docs/sampling.md``).

    Raises:
        ValueError: bad rank, world size, chunk or block size, or a negative
            shard size.
        RuntimeError: ``WORLD_SIZE`` > 1 but ``torch.distributed`` is not
            initialised, and ``num_replicas`` / ``rank`` were not given.
    """

    def __init__(
        self,
        dataset: ShardSized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        chunk_shards: int = 4,
        block_samples: int | None = None,
        elastic: bool = False,
    ) -> None:
        _args.map_style(dataset, call="ShardSampler")
        if block_samples is None:
            block_samples = max(1, int(getattr(dataset, "samples_per_frame", 1)))
        if num_replicas is None or rank is None:
            num_replicas, rank = _default_world(num_replicas, rank)
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas - 1}], got {rank}")
        if chunk_shards < 1:
            raise ValueError(f"chunk_shards must be >= 1, got {chunk_shards}")
        if block_samples < 1:
            raise ValueError(f"block_samples must be >= 1, got {block_samples}")
        sizes = np.asarray(dataset.shard_sizes, dtype=np.int64).reshape(-1)
        if sizes.size and int(sizes.min()) < 0:
            raise ValueError(f"shard sizes must be >= 0, got {int(sizes.min())} for shard {int(sizes.argmin())}")
        self.sizes = sizes
        self.starts = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1], out=self.starts[1:])
        self.total_samples = int(sizes.sum())
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.chunk_shards = chunk_shards
        self.block_samples = block_samples
        self.elastic = elastic
        self.epoch = 0
        self._plan: Plan = ((0, self.total_samples),) if self.total_samples else ()
        self._offset = 0  # samples of this rank's block consumed before this pass
        self._yielded = 0  # samples handed out by the current pass
        self._order: _EpochOrder | None = None

    # -- dealing ------------------------------------------------------------------
    @staticmethod
    def _block_len(plan_total: int, world: int, drop_last: bool) -> int:
        return plan_total // world if drop_last else -(-plan_total // world)

    @property
    def _plan_total(self) -> int:
        return sum(b - a for a, b in self._plan)

    @property
    def num_samples(self) -> int:
        """Samples per rank in a whole pass of the current plan (as ``DistributedSampler.num_samples``)."""
        return self._block_len(self._plan_total, self.num_replicas, self.drop_last)

    def __len__(self) -> int:
        if self.elastic:  # from the global position reached, an equal share per rank
            return self._block_len(max(0, self.total_samples - self._offset), self.num_replicas, self.drop_last)
        return self.num_samples - self._offset

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the order); a resumed position is kept only for its own epoch."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._plan = ((0, self.total_samples),) if self.total_samples else ()
            self._offset = 0
        self._yielded = 0

    def rewind(self) -> None:
        """Start the current epoch again from its first sample (the whole stream; a loaded position is dropped)."""
        self._plan = ((0, self.total_samples),) if self.total_samples else ()
        self._offset = 0
        self._yielded = 0

    def _epoch_order(self) -> _EpochOrder:
        if self._order is None or (self._order.epoch, self._order.seed) != (self.epoch, self.seed):  # cache per epoch
            self._order = _EpochOrder(
                self.sizes,
                self.starts,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
                chunk_shards=self.chunk_shards,
                block_samples=self.block_samples,
            )
        return self._order

    def _stream_ranges(self, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Stream intervals behind block positions ``[lo, hi)``, padding wrapped as DistributedSampler does."""
        total = self._plan_total
        yield from _plan_to_stream(self._plan, lo, min(hi, total))
        p = max(lo, total) - total
        while total and p < hi - total:  # padding: position total + p repeats position p % total
            q = p % total
            run = min(hi - total - p, total - q)
            yield from _plan_to_stream(self._plan, q, q + run)
            p += run

    def __iter__(self) -> Iterator[int]:
        order = self._epoch_order()
        length = self.num_samples
        self._yielded = 0
        if self.elastic:
            yield from self._elastic(order)
            return
        start = self.rank * length
        for a, b in self._stream_ranges(start + self._offset, start + length):
            for chunk in order.samples(a, b):
                for i in chunk.tolist():
                    self._yielded += 1
                    yield i

    def _elastic(self, order: _EpochOrder) -> Iterator[int]:
        """Stream positions ``offset + rank + k * world`` for ``k < len(self)`` (past the end: padding, as
        in block dealing), ``offset`` being the global position the pass starts at."""
        world, start = self.num_replicas, self._offset
        pos = start
        for a, b in self._stream_ranges(start, start + len(self) * world):
            for chunk in order.samples(a, b):
                mine = chunk[(self.rank - (pos - start)) % world :: world]
                pos += len(chunk)
                for i in mine.tolist():
                    self._yielded += 1
                    yield i

    # -- resumption -----------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        """What defines the stream and the dataset; a state must match it to be loaded."""
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "chunk_shards": self.chunk_shards,
            "block_samples": self.block_samples,
            "drop_last": self.drop_last,
            "total_samples": self.total_samples,
            "num_shards": len(self.sizes),
            "elastic": self.elastic,
        }

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """How far this rank got in the epoch, as a JSON-serialisable dict.

        Args:
            consumed: samples of the current pass the training loop has used.
                Default: the samples this sampler has handed out, which runs
                ahead of the loop by the DataLoader's prefetch (see
                ``docs/sampling.md``); pass the loop's own count to be exact.

        Raises:
            ValueError: ``consumed`` is negative or more than this pass holds.
        """
        done = self._yielded if consumed is None else consumed
        if not 0 <= done <= len(self):
            raise ValueError(f"consumed must be in [0, {len(self)}], got {done}")
        if self.elastic:  # ranks in lockstep: every position below this one was handed out to some rank
            done *= self.num_replicas
        return {
            **header("ShardSampler", self._config(), inline=True),
            "epoch": self.epoch,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "plan": [[a, b] for a, b in self._plan],
            "consumed": self._offset + done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the epoch recorded in ``state`` with the next unseen samples.

        With the state's world size, each rank continues its own block (load
        any rank's state when all ranks consumed the same count, as in lockstep
        training; ``state["consumed"]`` may also be a list, one count per old
        rank). With another world size, the unconsumed rest of every old
        block is dealt afresh to the new ranks. The position holds until
        ``set_epoch`` selects another epoch.

        Raises:
            SamplerStateError: the state is malformed (every field is checked before anything changes:
                its type and range, the plan against the dataset, at most 2**20 old ranks) or was made for
                another dataset, seed, shuffle, window or block size.
        """
        self._apply(*self._checked(state))

    def _checked(self, state: Any) -> tuple[int, int, bool, Plan, list[int]]:
        """``state``'s epoch, old world size and ``drop_last``, plan and consumed counts, every field checked.

        Raises:
            SamplerStateError: naming the first field that is missing, of the wrong type or out of range.
        """
        kind = "ShardSampler"
        try:
            theirs = saved_config(state, kind, inline=True)
            epoch = integer(state, "epoch", kind, *EPOCHS)
            old_world = integer(state, "num_replicas", kind, 1, MAX_READERS)
            old_drop_last = flag(state, "drop_last", kind)
            free = ("drop_last",) if old_world != self.num_replicas or self.elastic else ()  # the new dealing may choose its own
            check_config(theirs, kind, self._config(), unchecked=free, older={"elastic": False})  # no "elastic": an older state
            consumed = required(state, "consumed", kind)
            if isinstance(consumed, (list, tuple)):
                counts = integers(state, "consumed", kind, old_world)
            else:
                counts = [integer(state, "consumed", kind)] * old_world  # (at most MAX_READERS)
            plan = self._checked_plan(required(state, "plan", kind))
        except SamplerStateError:
            raise
        except StateError as exc:
            raise SamplerStateError(str(exc)) from exc
        if self.elastic:  # one global position, whatever the world sizes (padding: up to a world past the end)
            if any(c > self.total_samples + old_world for c in counts):
                raise SamplerStateError(f"{kind} state: consumed {_shown(counts)} past the stream's {counted(self.total_samples, 'sample')}")
            return epoch, old_world, old_drop_last, plan, counts
        total = sum(b - a for a, b in plan)
        length = self._block_len(total, old_world, old_drop_last)
        if any(not 0 <= c <= length for c in counts):
            raise SamplerStateError(f"{kind} state: consumed {_shown(counts)} outside [0, {length}]")
        return epoch, old_world, old_drop_last, plan, counts

    def _checked_plan(self, raw: object) -> Plan:
        """A state's plan: increasing, disjoint intervals ``[a, b)`` of ``[0, total_samples]``, ``a < b``.

        Raises:
            SamplerStateError: anything else.
        """
        if not isinstance(raw, (list, tuple)):
            raise SamplerStateError(f"ShardSampler state: plan is a {type(raw).__name__}, expected a list of [start, end] pairs")
        out: list[tuple[int, int]] = []
        end = 0
        for k, pair in enumerate(raw):
            a, b = (pair if isinstance(pair, (list, tuple)) and len(pair) == 2 else (None, None))
            if type(a) is not int or type(b) is not int or not end <= a < b <= self.total_samples:
                raise SamplerStateError(
                    f"ShardSampler state: plan[{k}] is {pair!r}, expected [start, end] with "
                    f"{end} <= start < end <= {self.total_samples} (increasing, disjoint)"
                )
            out.append((a, b))
            end = b
        return _merge(iter(out))

    def _apply(self, epoch: int, old_world: int, old_drop_last: bool, plan: Plan, counts: list[int]) -> None:
        """Take a position :meth:`_checked` checked."""
        self.epoch = epoch
        self._yielded = 0
        if self.elastic:
            self._offset = min(counts)
            return
        if old_world == self.num_replicas:
            self._plan, self._offset = plan, counts[self.rank]
            return
        total = sum(b - a for a, b in plan)
        length = self._block_len(total, old_world, old_drop_last)
        ranks = min(old_world, -(-total // length)) if length else 0  # the ranks after these hold padding only
        rest = (
            iv
            for r in range(ranks)
            for iv in _plan_to_stream(plan, min(r * length + counts[r], total), min((r + 1) * length, total))
        )
        self._plan, self._offset = _merge(rest), 0

    def __repr__(self) -> str:
        return (
            f"ShardSampler(samples={self.total_samples}, shards={len(self.sizes)}, rank={self.rank}/{self.num_replicas}, "
            f"epoch={self.epoch}, chunk_shards={self.chunk_shards})"
        )


class MixSampler:
    """The map-style counterpart of :func:`tarindex.mix`: weighted sampling over datasets concatenated
    (``torch.utils.data.ConcatDataset(datasets)`` numbering: dataset ``k``'s samples follow those of
    the datasets before it).

    Each index comes from dataset ``k`` with probability ``weights[k]`` (among those still running),
    in that dataset's own :class:`ShardSampler` order (shard-local, split over ranks), drawn from a
    counter-based random stream of ``(seed, epoch, rank)``. ``state_dict`` / ``load_state_dict``
    resume mid-epoch (``StatefulDataLoader`` calls them by itself).

    Args:
        datasets: anything with ``shard_sizes`` (``TarDataset``s), in concatenation order.
        weights: one non-negative weight per dataset, not all zero (default: equal).
        num_samples: indices per rank per epoch; required with ``stop="never"`` and for equal
            lengths on every rank with ``stop="first"``.
        num_replicas: as :class:`ShardSampler`.
        rank: as :class:`ShardSampler`.
        seed: fixes the choices; each dataset's :class:`ShardSampler` gets a seed of its own derived from it.
        chunk_shards: as :class:`ShardSampler`.
        block_samples: as :class:`ShardSampler`.
        stop: ``"all"`` (default): a dataset that runs out leaves the draw, every sample once per
            epoch (apart from :class:`ShardSampler` padding); ``"first"``: the epoch ends when one
            runs out; ``"never"``: a dataset that runs out starts its order again.

    Raises:
        ValueError: bad weights, ``stop``, or ``stop="never"`` without ``num_samples``.
    """

    def __init__(
        self,
        datasets: Sequence[ShardSized],
        weights: Sequence[float] | None = None,
        *,
        num_samples: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        stop: Literal["first", "all", "never"] = "all",
        chunk_shards: int = 4,
        block_samples: int | None = None,
    ) -> None:
        if not datasets:
            raise ValueError("MixSampler needs at least one dataset")
        w = [1.0] * len(datasets) if weights is None else [float(x) for x in weights]
        if len(w) != len(datasets):
            raise ValueError(f"{counted(len(w), 'weight')} for {counted(len(datasets), 'dataset')}")
        if any(not x >= 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"weights must be >= 0 and not all 0, got {w}")
        if stop not in ("first", "all", "never"):
            raise ValueError(f"stop must be 'first', 'all' or 'never', not {stop!r}")
        if stop == "never" and num_samples is None:
            raise ValueError("stop='never' needs num_samples (the epoch would never end)")
        self.samplers = [
            ShardSampler(ds, num_replicas, rank, seed=stream_key("tarindex-mix-sampler", seed, k) >> 33,
                         chunk_shards=chunk_shards, block_samples=block_samples)
            for k, ds in enumerate(datasets)
        ]
        self.offsets = [0, *itertools.accumulate(s.total_samples for s in self.samplers)][:-1]
        self.weights, self.seed, self.stop, self.num_samples = w, seed, stop, num_samples
        self.rank, self.num_replicas = self.samplers[0].rank, self.samplers[0].num_replicas
        self.epoch = 0
        self._resume = False  # a loaded position waits for the next iteration
        self._fresh()

    def _fresh(self) -> None:
        self.step, self.yielded, self.done = 0, 0, False
        self.active = [True] * len(self.samplers)

    def __len__(self) -> int:
        if self.num_samples is not None:
            return self.num_samples
        if self.stop == "all":
            return sum(len(s) for s in self.samplers)
        raise TypeError("a MixSampler with stop='first' has a length only with num_samples")

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the mix and of every dataset's sampler (a loaded position holds for its own epoch)."""
        if epoch != self.epoch:
            self._resume = False
        self.epoch = epoch
        for s in self.samplers:
            s.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if not self._resume:
            self._fresh()
            for s in self.samplers:
                s.rewind()
        self._resume = False
        draws = Draws(stream_key("tarindex-mix-sampler", self.seed, self.epoch, self.rank))
        iterators: list[Iterator[int] | None] = [None] * len(self.samplers)
        cumulative = list(itertools.accumulate(w if a else 0.0 for w, a in zip(self.weights, self.active)))
        while not self.done and cumulative[-1] > 0 and (self.num_samples is None or self.yielded < self.num_samples):
            k = pick(draws, self.step, cumulative)
            self.step += 1
            it = iterators[k]
            if it is None:
                it = iterators[k] = iter(self.samplers[k])
            i = next(it, -1)
            if i < 0:
                if self.stop == "first":
                    break
                if self.stop == "all":
                    self.active[k] = False
                    cumulative = list(itertools.accumulate(w if a else 0.0 for w, a in zip(self.weights, self.active)))
                    continue
                self.samplers[k].rewind()  # "never": dataset k's order again
                it = iterators[k] = iter(self.samplers[k])
                i = next(it, -1)
                if i < 0:
                    raise ValueError(f"MixSampler: dataset {k} has no samples to repeat")
            self.yielded += 1
            yield self.offsets[k] + i
        self.done = True

    def _config(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "weights": self.weights,
            "stop": self.stop,
            "num_samples": self.num_samples,
            "sizes": [s.total_samples for s in self.samplers],
        }

    def state_dict(self) -> dict[str, Any]:
        """The position: draws made, indices handed out, datasets still running, each dataset sampler's state."""
        return {
            **header("MixSampler", self._config()),
            "epoch": self.epoch,
            "step": self.step,
            "yielded": self.yielded,
            "active": list(self.active),
            "done": self.done,
            "samplers": [s.state_dict() for s in self.samplers],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` on the next iteration (same world size; each dataset's sampler as
        :meth:`ShardSampler.load_state_dict`).

        Raises:
            StateError: a malformed state, or one of another mix.
        """
        check_header(state, "MixSampler", self._config())
        n = len(self.samplers)
        epoch = integer(state, "epoch", "MixSampler", *EPOCHS)
        step, yielded = integer(state, "step", "MixSampler"), integer(state, "yielded", "MixSampler")
        active, done = flags(state, "active", "MixSampler", n), flag(state, "done", "MixSampler")
        subs = required(state, "samplers", "MixSampler")
        if not isinstance(subs, (list, tuple)) or len(subs) != n:
            raise StateError(f"MixSampler state: samplers is {type(subs).__name__} of {_length(subs)}, expected a list of {n} states")
        check_draws("MixSampler", step, yielded, ("num_samples", self.num_samples), active, self.weights, stop=self.stop, done=done)
        positions = [sampler._checked(sub) for sampler, sub in zip(self.samplers, subs)]  # all checked before any is taken
        for sampler, position in zip(self.samplers, positions):
            sampler._apply(*position)
        self.epoch, self.step, self.yielded, self.active, self.done = epoch, step, yielded, active, done
        self._resume = True


def _length(value: object) -> str:
    return f"length {len(value)}" if isinstance(value, (list, tuple)) else "no length"
