"""Epochs and slots: who reads which shard when, and one reader's epoch as a resumable run.

Rank and worker discovery (:class:`Slot`), per-epoch shard order and dealing, counter-based random draws
(:class:`Draws`, shared by ``mix``, the samplers and ``pack``), :class:`EpochRun` (one reader's epoch as a state
machine of plain data: work items, passes, the shuffle buffer), its saved position checked (:func:`run_state`),
a stream's epoch resumed on the same or another layout (:func:`run_for`, :func:`checked_states`), and
:class:`SharedEpoch` (the epoch a persistent DataLoader worker reads at the start of each iteration).

No torch import at module level: :func:`worker_slot` imports it only when it
is already loaded (a DataLoader worker, a process with ``torch.distributed``).
"""

from __future__ import annotations

import bisect
import hashlib
import multiprocessing
import multiprocessing.context
import os
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._state import decode_rows, encode_rows, flag, integer, reader_states
from .errors import StateError, counted

__all__ = [
    "AFTER",
    "ONE",
    "SKIP",
    "WHOLE",
    "Draws",
    "EpochRun",
    "Item",
    "RunState",
    "SharedEpoch",
    "Slot",
    "checked_states",
    "deal_rest",
    "idle_readers",
    "pick",
    "run_for",
    "run_state",
    "shard_order",
    "shards_for_slot",
    "stream_key",
    "worker_info",
    "worker_quota",
    "worker_slot",
]


@dataclass(frozen=True, slots=True)
class Slot:
    """One reader of an epoch: a DataLoader worker of a rank."""

    rank: int
    """Rank among ``world_size`` processes (``torch.distributed``, else ``RANK``)."""
    world_size: int
    """Number of ranks."""
    worker: int
    """DataLoader worker id within the rank (0 without workers)."""
    num_workers: int
    """DataLoader workers of the rank (1 without workers)."""

    @property
    def index(self) -> int:
        """Position among all ``world_size * num_workers`` readers (rank-major)."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        """All readers of the epoch."""
        return self.world_size * self.num_workers


class SharedEpoch:
    """An epoch number in shared memory: DataLoader workers (persistent ones too) read the value
    the main process last set, at the start of each iteration.

    The value crosses into worker processes when they start (fork, or pickling while spawning);
    any other pickle or copy carries the number only.
    """

    def __init__(self, value: int = 0) -> None:
        self._shared: Any = multiprocessing.RawValue("q", value)

    @property
    def value(self) -> int:
        """The epoch."""
        return int(self._shared.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._shared.value = epoch

    def __getstate__(self) -> dict[str, Any]:
        if multiprocessing.context.get_spawning_popen() is not None:  # a worker being started: share the memory
            return {"shared": self._shared}
        return {"value": self.value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._shared = state["shared"]
        else:
            self._shared = multiprocessing.RawValue("q", int(state["value"]))

    def __repr__(self) -> str:
        return f"SharedEpoch({self.value})"


def worker_slot(rank: int | None = None, world_size: int | None = None) -> Slot:
    """This process's slot: explicit values, else ``torch.distributed`` when initialised, else ``RANK``/``WORLD_SIZE``.

    Raises:
        ValueError: the rank is not below the world size.
    """
    if rank is None or world_size is None:
        r, w = 0, 1
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    info = worker_info()
    worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
    return Slot(rank, world_size, worker, num_workers)


def worker_info() -> Any:
    """torch's ``get_worker_info()`` in a DataLoader worker, else ``None`` (and ``None`` where torch was never
    imported: no DataLoader made this process)."""
    data = sys.modules.get("torch.utils.data")
    return None if data is None else data.get_worker_info()


def shard_order(n: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Shard numbers in this epoch's order: the same on every rank and worker for a given seed and epoch."""
    order = list(range(n))
    if shuffle:
        random.Random(f"tarindex-shards-{seed}-{epoch}").shuffle(order)
    return order


def shards_for_slot(order: list[int], slot: Slot, *, fill: bool = False) -> list[int]:
    """The shards one slot reads: ``order[rank::world_size][worker::num_workers]``.

    Every shard goes to exactly one slot. With fewer shards than slots some
    slots get none; ``fill=True`` gives such a slot ``order[slot.index % n]``
    instead (that shard is then read by two slots).
    """
    mine = order[slot.rank :: slot.world_size][slot.worker :: slot.num_workers]
    if not mine and fill and order:
        mine = [order[slot.index % len(order)]]
    return mine


# -- one reader's epoch, resumable -------------------------------------------------------------

WHOLE, AFTER, ONE = 0, 1, 2
"""Work item modes: a whole shard; the samples after the one at ``offset``; only the sample at ``offset``."""

Item = tuple[int, int, int, int]
"""A work item: ``(shard, offset, ordinal, mode)``; ``offset``/``ordinal`` locate a sample (byte offset of
its first header in the uncompressed tar, its number in the shard) for ``AFTER`` and ``ONE``."""

Position = tuple[int, int, int]
"""A sample's place: ``(shard, offset, ordinal)``."""

SKIP: Any = object()
"""Yielded by a read in place of a sample the error handler skipped (the position still advances)."""

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def stream_key(*parts: object) -> int:
    """A 64-bit key for a random stream, from its parts (seed, epoch, rank, worker...)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _bits(key: int, step: int) -> int:
    """The ``step``-th 64-bit output of random stream ``key``: splitmix64 at ``key + step * gamma``.

    Counter-based: a resumed run continues at its step without replaying the draws before it.
    """
    z = (key + (step + 1) * _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


class Draws:
    """The outputs of random stream ``key`` (:func:`_bits`), computed 4,096 at a time with numpy
    (a Python loop would cost about a microsecond per draw)."""

    __slots__ = ("block", "key", "start")

    def __init__(self, key: int) -> None:
        self.key = key
        self.start = 0
        self.block: list[int] = []

    def array(self, step: int, count: int) -> npt.NDArray[np.uint64]:
        """Outputs ``step .. step + count - 1``."""
        steps = np.arange(step + 1, step + count + 1, dtype=np.uint64)
        z = np.uint64(self.key) + steps * np.uint64(_GAMMA)  # wrapping uint64 arithmetic
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        return z ^ (z >> _S31)

    def at(self, step: int) -> int:
        """The ``step``-th output, as :func:`_bits` gives it."""
        i = step - self.start
        if not 0 <= i < len(self.block):
            self.block, self.start, i = self.array(step, 4096).tolist(), step, 0
        return self.block[i]

    def picks(self, step: int, count: int, cumulative: list[float]) -> npt.NDArray[np.integer[Any]]:
        """:func:`pick` for steps ``step .. step + count - 1`` at once (the same choices: the same
        floating-point operations in the same order, in place)."""
        z = self.array(step, count)
        z >>= np.uint64(11)
        u = z.astype(np.float64)
        u *= 1.0 / (1 << 53)
        u *= cumulative[-1]
        n = len(cumulative)
        if n > 4:
            k = np.searchsorted(np.asarray(cumulative, dtype=np.float64), u, side="right")
            return np.minimum(k, n - 1, out=k)
        # a few sources: how many of the first n - 1 bounds are <= u (the same as bisect_right capped at n - 1,
        # the bounds being sorted), without a search
        picked = np.zeros(count, dtype=np.int8)
        for bound in cumulative[:-1]:
            picked += (u >= bound).view(np.int8)
        return picked


def pick(draws: Draws, step: int, cumulative: list[float]) -> int:
    """The ``step``-th weighted choice of ``draws``: the index ``k`` with
    ``cumulative[k-1] <= u * cumulative[-1] < cumulative[k]`` for a uniform ``u`` in ``[0, 1)``."""
    u = (draws.at(step) >> 11) * (1.0 / (1 << 53)) * cumulative[-1]
    return min(bisect.bisect_right(cumulative, u), len(cumulative) - 1)


Read = Callable[[int, int, int, int], Iterator[tuple[int, int, Any]]]
Pick = Callable[[int, list[tuple[int, int]]], Iterator[tuple[int, int, Any]]]


class EpochRun:
    """One reader's epoch: its work items in order, then again (passes) while a quota is left,
    through a shuffle buffer emptied at the end of each pass.

    Everything that decides what comes next is plain data (:meth:`state`): the items left (the
    first one advanced to the last sample read from it), the buffer as sample positions, the number of
    random draws made (the draws are counter-based), the samples yielded. A run restored from a
    state yields exactly what the original would have yielded after that point; buffered samples
    are read again (``pick``) when they come out.

    Args:
        read: ``read(shard, offset, ordinal, mode)`` yields ``(offset, ordinal, sample or SKIP)``
            for a ``WHOLE`` or ``AFTER`` item.
        pick: ``pick(shard, [(offset, ordinal), ...])`` yields the listed samples (ordinal order).
        seekable: whether a shard's samples can be read one by one (else buffered samples of
            the shard are read again together, in one pass over it).
        own: the reader's shards in this epoch's order (each pass reads them).
        shuffle: buffer size (0: none).
        key: the random stream of the buffer.
        quota: samples to yield (passes repeat until reached); ``None``: one pass.
        empty: the error raised when a pass yields nothing and the quota is not reached.
    """

    def __init__(
        self,
        read: Read,
        pick: Pick,
        seekable: Callable[[int], bool],
        *,
        own: list[int],
        shuffle: int,
        key: int,
        quota: int | None,
        empty: Callable[[], Exception],
    ) -> None:
        self._read, self._pick, self._seekable, self._empty = read, pick, seekable, empty
        self.own = own
        self.shuffle = shuffle
        self.key = key
        self._draws = Draws(key)
        self.quota = quota
        self.queue: list[Item] = [(s, 0, 0, WHOLE) for s in own]
        self.buffer: list[list[Any]] = []  # [shard, (offset, ordinal, sample or None: to read again)]
        self._last: tuple[int, int, Any] | None = None  # the last sample read from the queue's first item
        self.step = 0
        self.yielded = 0
        self.passes = 0
        self.got = False
        self.done = False

    # -- state ------------------------------------------------------------------------------
    def _queue_now(self) -> list[Item]:
        """The items left, the first one advanced to the last sample read from it."""
        queue = list(self.queue)
        if self._last is not None and queue:
            queue[0] = (queue[0][0], self._last[0], self._last[1], AFTER)
        return queue

    def state(self) -> dict[str, Any]:
        """The run's position as plain values (positions delta-coded: a few KB for 1,000 buffered)."""
        return {
            "queue": encode_rows(self._queue_now(), 4),
            "buffer": encode_rows([(e[0], e[1][0], e[1][1]) for e in self.buffer], 3),
            "step": self.step,
            "yielded": self.yielded,
            "quota": self.quota,
            "passes": self.passes,
            "got": self.got,
            "done": self.done,
        }

    def restore(self, state: RunState) -> None:
        """Continue from :meth:`state`'s values, checked by :func:`run_state` (buffered samples are read
        again when they come out)."""
        self.queue = [(a, b, c, d) for a, b, c, d in state.queue.tolist()]
        self.buffer = [[a, (b, c, None)] for a, b, c in state.buffer.tolist()]
        self.step, self.yielded, self.passes, self.quota = state.step, state.yielded, state.passes, state.quota
        self.got, self.done = state.got, state.done
        self._last = None

    def rest(self) -> tuple[list[Item], int | None]:
        """What is left to yield: the buffer's samples and the items left, as items, and the quota left."""
        if self.done:
            return [], 0
        ones = sorted((shard, rec[0], rec[1], ONE) for shard, rec in self.buffer)
        left = None if self.quota is None else max(0, self.quota - self.yielded)
        return ones + self._queue_now(), left

    # -- the run ----------------------------------------------------------------------------
    def _quota_reached(self) -> bool:
        return self.quota is not None and self.yielded >= self.quota

    def _next_draw(self, n: int) -> int:
        j: int = self._draws.at(self.step) % n
        self.step += 1
        return j

    def _take(self, entry: list[Any]) -> Any:
        """A buffered sample (``entry``: ``[shard, (offset, ordinal, sample or None)]``); read again if
        the run was restored (with the other buffered samples of its shard, when that shard cannot be
        read sample by sample)."""
        sample = entry[1][2]
        if sample is not None:
            return sample
        shard = entry[0]
        wanted = [entry] if self._seekable(shard) else [e for e in self.buffer if e[0] == shard and e[1][2] is None] + [entry]
        by_ordinal = {e[1][1]: e for e in wanted}
        for rec in self._pick(shard, sorted((e[1][0], e[1][1]) for e in by_ordinal.values())):
            by_ordinal[rec[1]][1] = rec
        sample = entry[1][2]
        return SKIP if sample is None else sample

    def _ones(self, shard: int) -> Iterator[tuple[int, int, Any]]:
        """The ``ONE`` items of ``shard`` at the queue's head, read together; each popped as it comes."""
        queue = self.queue
        n = 1
        while n < len(queue) and queue[n][0] == shard and queue[n][3] == ONE:
            n += 1
        pending = {it[2]: it for it in queue[:n]}
        for rec in self._pick(shard, sorted((it[1], it[2]) for it in queue[:n])):
            queue.remove(pending.pop(rec[1]))
            yield rec
        for it in pending.values():  # not found (the handler skipped them)
            queue.remove(it)

    def __iter__(self) -> Iterator[Any]:
        buf, size, queue = self.buffer, self.shuffle, self.queue
        quota = self.quota
        while not self.done:
            if quota is not None and self.yielded >= quota:
                break
            if queue:  # the next item: each sample recorded as the last read before it is handed on
                shard, offset, ordinal, mode = queue[0]
                one = mode == ONE
                for rec in self._ones(shard) if one else self._read(shard, offset, ordinal, mode):
                    if not one:
                        self._last = rec
                    sample = rec[2]
                    if sample is SKIP:
                        continue
                    self.got = True
                    if size:
                        entry = [shard, rec]
                        if len(buf) < size:
                            buf.append(entry)
                            continue
                        j = self._next_draw(size)
                        out, buf[j] = buf[j], entry
                        sample = out[1][2]
                        if sample is None:  # a restored entry: read it again
                            sample = self._take(out)
                            if sample is SKIP:
                                continue
                    self.yielded += 1
                    yield sample
                    if quota is not None and self.yielded >= quota:
                        break
                else:
                    if not one:
                        queue.pop(0)
                        self._last = None
                continue
            while buf and not self._quota_reached():  # the end of a pass: empty the buffer
                j = self._next_draw(len(buf))
                buf[j], buf[-1] = buf[-1], buf[j]
                sample = self._take(buf.pop())
                if sample is SKIP:
                    continue
                self.yielded += 1
                yield sample
            if self._quota_reached() or buf:
                break
            self.passes += 1
            if quota is None or not self.own:
                break
            if not self.got:
                raise self._empty()
            self.got = False
            queue[:] = [(s, 0, 0, WHOLE) for s in self.own]
        self.done = True


_READERS_LEFT = 1024
"""The most interrupted readers whose rest (a shuffle buffer, a shard read again to fill ``epoch_size``)
one reader's saved work may hold: what resuming 1,024 readers onto one leaves it."""


@dataclass(frozen=True, slots=True)
class RunState:
    """An :class:`EpochRun`'s saved position, every field checked (:func:`run_state`)."""

    queue: npt.NDArray[np.int64]
    """``(n, 4)``: the work items left, ``(shard, offset, ordinal, mode)``."""
    buffer: npt.NDArray[np.int64]
    """``(n, 3)``: the shuffle buffer's samples, ``(shard, offset, ordinal)``."""
    step: int
    """Random draws made."""
    yielded: int
    """Samples yielded."""
    quota: int | None
    """Samples to yield in the epoch (``None``: one pass)."""
    passes: int
    """Passes over the reader's shards finished."""
    got: bool
    """Whether the current pass yielded a sample."""
    done: bool
    """Whether the run finished."""


def run_state(state: Any, *, n_shards: int, shuffle: int, kind: str = "TarStream") -> RunState:
    """The position in ``state`` (what :meth:`EpochRun.state` made), every field checked against the
    stream's ``n_shards`` and ``shuffle`` before it is used: counts within ``[0, 2**62]`` (``yielded`` within
    the quota), flags bools, position lists decoded to at most their bound (the buffer: ``shuffle``
    positions; the work: the shards, and for each of :data:`_READERS_LEFT` interrupted readers a buffer and
    a shard read again, what resuming that many readers onto one leaves) with shards in ``[0, n_shards)``,
    offsets and numbers not negative, modes known.

    Raises:
        StateError: naming the first field that is missing, of the wrong type or out of range.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"{kind} state is a {type(state).__name__}, expected a dict")
    step = integer(state, "step", kind)
    yielded = integer(state, "yielded", kind)
    quota = None if state.get("quota", 0) is None else integer(state, "quota", kind)
    if quota is not None and yielded > quota:
        raise StateError(f"{kind} state: yielded {yielded} is over its quota {quota}")
    passes = integer(state, "passes", kind)
    got, done = flag(state, "got", kind), flag(state, "done", kind)
    buffer = decode_rows(state.get("buffer"), 3, shuffle, f"{kind} state: buffer")
    queue = decode_rows(state.get("queue"), 4, n_shards + _READERS_LEFT * (shuffle + 1), f"{kind} state: queue")
    for name, rows in (("buffer", buffer), ("queue", queue)):
        bad = np.flatnonzero((rows[:, 0] >= n_shards) | (rows[:, :3] < 0).any(axis=1))
        if bad.size:
            raise StateError(
                f"{kind} state: {name} position {int(bad[0])} is {rows[bad[0]].tolist()}, expected a shard in "
                f"[0, {n_shards}) and an offset and number >= 0"
            )
    bad = np.flatnonzero(~np.isin(queue[:, 3], (WHOLE, AFTER, ONE)) | ((queue[:, 3] == WHOLE) & (queue[:, 1:3] != 0).any(axis=1)))
    if bad.size:
        raise StateError(f"{kind} state: queue item {int(bad[0])} is {queue[bad[0]].tolist()}, not a work item")
    return RunState(queue, buffer, step, yielded, quota, passes, got, done)


def deal_rest(runs: list[EpochRun], index: int, count: int) -> tuple[list[Item], int | None]:
    """Reader ``index`` of ``count``'s share of what ``runs`` (every reader of an interrupted epoch,
    in slot order) have left: items dealt round-robin, the quotas left split evenly.

    Each sample left is in exactly one share; the shares' quotas add up to the quotas left.
    """
    items: list[Item] = []
    quota: int | None = None
    for run in runs:
        rest, left = run.rest()
        items += rest
        if left is not None:
            quota = (quota or 0) + left
    mine = items[index::count]
    if quota is not None:
        base, extra = divmod(quota, count)
        quota = base + (index < extra)
    return mine, quota


# -- a stream's epoch: quotas, idle readers, resuming on the same or another layout ------------------------


def worker_quota(epoch_size: int | None, slot: Slot) -> int | None:
    """The samples ``slot`` yields of a rank's ``epoch_size`` (split evenly over the rank's workers, the first
    ones taking one more), or ``None`` without an ``epoch_size``."""
    if epoch_size is None:
        return None
    base, extra = divmod(epoch_size, slot.num_workers)
    return base + (slot.worker < extra)


def idle_readers(n_shards: int, slot: Slot, *, fill: bool) -> str | None:
    """What to warn when ``n_shards`` shards leave some of ``slot``'s epoch's readers without a shard of their
    own (``fill``: each reads one shard again), else ``None``; said by the first reader only."""
    if n_shards >= slot.count or slot.index != 0:
        return None
    idle = slot.count - n_shards
    if fill:
        policy = "it reads one shard again" if idle == 1 else "each reads one shard again"
    else:
        policy = "it yields nothing" if idle == 1 else "they yield nothing"
    return (
        f"{counted(n_shards, 'shard')} for {counted(slot.world_size, 'rank')} x {counted(slot.num_workers, 'worker')}: "
        f"{counted(idle, 'reader')} {'has no shard of its' if idle == 1 else 'have no shard of their'} own, {policy}"
    )


NewRun = Callable[[Slot, bool], EpochRun]
"""``new_run(slot, resumed)``: a fresh run of the epoch for ``slot`` (``resumed``: drawing from a stream of its own)."""


def run_for(states: list[dict[str, Any]], slot: Slot, new_run: NewRun, position: Callable[[Mapping[str, Any]], RunState]) -> EpochRun:
    """``slot``'s run of an epoch: fresh without ``states`` (loaded states of that epoch, each checked when
    loaded); with the saved layout (ranks, workers), continued from this reader's state; on another layout,
    the share :func:`deal_rest` gives it of what every saved reader had left.

    Raises:
        StateError: the states do not hold this reader's (same layout), or not every reader's (another one).
    """
    if not states:
        return new_run(slot, False)
    layouts = {(st["slot"][1], st["slot"][3]) for st in states}
    if layouts == {(slot.world_size, slot.num_workers)}:
        mine = [st for st in states if (st["slot"][0], st["slot"][2]) == (slot.rank, slot.worker)]
        if len(mine) != 1:
            raise StateError(
                f"TarStream states for {counted(slot.world_size, 'rank')} x {counted(slot.num_workers, 'worker')} have "
                f"{len(mine)} for rank {slot.rank} worker {slot.worker} (expected 1)"
            )
        run = new_run(slot, False)
        run.restore(position(mine[0]))
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
        r = new_run(Slot(st["slot"][0], world, st["slot"][2], workers), False)
        r.restore(position(st))
        runs.append(r)
    run = new_run(slot, True)
    run.queue, run.quota = deal_rest(runs, slot.index, slot.count)
    return run


def checked_states(
    state_dict: Any, config: Mapping[str, Any], position: Callable[[Mapping[str, Any]], RunState]
) -> tuple[list[dict[str, Any]], int]:
    """The TarStream states in ``state_dict`` and their epoch, each field checked against the stream
    (``config``, slot, epoch, ``position``: :func:`run_state`) before anything changes.

    Raises:
        StateError: the first field that is missing, of the wrong type or out of range, states of
            several epochs or layouts, two states of one reader.
    """
    layouts, readers = set(), set()

    def check(st: Mapping[str, Any], slot: tuple[int, int, int, int]) -> None:
        rank, world, worker, workers = slot
        position(st)
        layouts.add((world, workers))
        if (rank, worker) in readers:
            raise StateError(f"two TarStream states of rank {rank} worker {worker}")
        readers.add((rank, worker))

    states, epoch = reader_states(state_dict, "TarStream", config, check)
    if len(layouts) != 1:
        raise StateError(f"TarStream states of several layouts (ranks, workers): {sorted(layouts)}")
    return states, epoch
