"""The base class of the iterable datasets (:class:`~tarindex.TarStream`, :class:`~tarindex.Mix`).

torch's ``IterableDataset`` where torch is installed, so that ``DataLoader`` takes them as iterable datasets
(one shard split per worker, no sampler); where it is not, a plain base class, so that streaming and mixing
work in a process without torch (a preprocessing job, a CPU-only tool). This module is the only place that
decides; importing it imports torch when torch is there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["IterableDataset"]

if TYPE_CHECKING:
    from torch.utils.data import IterableDataset
else:
    try:
        from torch.utils.data import IterableDataset
    except ModuleNotFoundError as exc:  # torch is optional: only DataLoader needs it
        if (exc.name or "").partition(".")[0] != "torch":  # torch is there but broke: say so
            raise

        class IterableDataset:
            """What ``torch.utils.data.IterableDataset`` gives a subclass, where torch is not installed: iteration."""

            def __iter__(self) -> Any:
                raise NotImplementedError
