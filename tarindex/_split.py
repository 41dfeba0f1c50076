"""Who reads which shard: rank and worker discovery, per-epoch shard order, the shuffle buffer.

No torch import at module level: :func:`worker_slot` imports it only when it
is already loaded (a DataLoader worker, a process with ``torch.distributed``).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Slot", "buffer_shuffle", "shard_order", "shards_for_slot", "worker_slot"]

T = TypeVar("T")


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
    worker, num_workers = 0, 1
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        info = data.get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
    return Slot(rank, world_size, worker, num_workers)


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


def buffer_shuffle(items: Iterable[T], size: int, rng: random.Random) -> Iterator[T]:
    """Shuffle a stream through a buffer of ``size`` items (filled first, then one out per one in)."""
    buf: list[T] = []
    randrange = rng.randrange
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = randrange(size)
        out, buf[j] = buf[j], item
        yield out
    rng.shuffle(buf)
    yield from buf
