"""Batches of samples, as webdataset's ``batched`` stage makes them (``TarStream.batched``).

Batching inside DataLoader workers turns one inter-process message per
sample into one per batch: with ``batch_size=None`` torch's DataLoader pays
about 100 us per message, whatever the sample's size. Importing this module
does not import torch; tensors are stacked when torch is already imported.
Arrays that are the rows of one array, in order (what a batch decoded by
:class:`tarindex.decode.Image` holds), are that array: no copy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["batched", "collate"]


def _combine(values: list[Any], where: str) -> Any:
    """One field of a batch: scalars -> numpy array, tensors -> stacked, arrays -> stacked, else a list."""
    first = values[0]
    torch = sys.modules.get("torch")
    if isinstance(first, (int, float)):
        return np.array(values)
    if isinstance(first, np.ndarray) or (torch is not None and isinstance(first, torch.Tensor)):
        rows = _rows_of(values)
        if rows is not None:
            return rows
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) != 1:
            raise ValueError(f"field {where}: cannot stack shapes {sorted(shapes)}; pass collation_fn=")
        return np.stack(values) if isinstance(first, np.ndarray) else torch.stack(values)  # type: ignore[union-attr]
    return values


def _rows_of(values: list[Any]) -> Any:
    """The array whose rows ``values`` are, in order and all of them (a decoded batch), else ``None``."""
    first = values[0]
    if isinstance(first, np.ndarray):
        base = first.base
        if not isinstance(base, np.ndarray):
            return None
        start, step = base.__array_interface__["data"][0], base.strides[0] if base.ndim else 0
        inner = base.strides[1:]
        ptrs = [v.__array_interface__["data"][0] for v in values if isinstance(v, np.ndarray) and v.base is base and v.strides == inner]
    else:
        base = first._base
        if base is None:
            return None
        start, step = base.data_ptr(), base.stride(0) * base.element_size() if base.dim() else 0
        inner = base.stride()[1:]
        ptrs = [v.data_ptr() for v in values if v._base is base and v.stride() == inner]
    n = len(values)
    if base.shape[0] != n or len(ptrs) != n or tuple(base.shape[1:]) != tuple(first.shape) or base.dtype != first.dtype:
        return None
    if any(p != start + k * step for k, p in enumerate(ptrs)):
        return None
    return base


def collate(samples: Sequence[Any]) -> Any:
    """A batch from samples that are all dicts with the same keys, or all tuples of one length.

    Each field becomes a numpy array (ints, floats), a stacked tensor or
    array (same shapes), or a list (anything else: bytes, str, images), as
    webdataset's ``default_collation_fn`` does. Dicts keep their keys,
    tuples stay tuples.

    Raises:
        ValueError: samples with different keys or lengths, or arrays of different shapes.
    """
    first = samples[0]
    if isinstance(first, dict):
        keys = list(first)
        for s in samples:
            if not isinstance(s, dict) or s.keys() != first.keys():
                got = sorted(s) if isinstance(s, dict) else type(s).__name__
                raise ValueError(f"cannot batch samples with different keys: {sorted(keys)} and {got}")
        return {k: _combine([s[k] for s in samples], repr(k)) for k in keys}
    if isinstance(first, (tuple, list)):
        if any(not isinstance(s, (tuple, list)) or len(s) != len(first) for s in samples):
            raise ValueError(f"cannot batch tuples of different lengths (the first has {len(first)})")
        return tuple(_combine(list(column), str(i)) for i, column in enumerate(zip(*samples)))
    return _combine(list(samples), "sample")


def batched(
    samples: Iterable[Any], size: int, collation_fn: Callable[[list[Any]], Any] | None = collate, *, partial: bool = True
) -> Iterator[Any]:
    """Consecutive batches of ``size`` samples (the last one shorter when ``partial``), each passed to
    ``collation_fn`` (``None``: the list itself)."""
    batch: list[Any] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch
