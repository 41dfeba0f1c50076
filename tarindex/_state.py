"""The one state protocol of tarindex's iterables and samplers: ``state_dict()`` / ``load_state_dict()``.

:class:`tarindex.TarStream`, :func:`tarindex.mix` and :class:`tarindex.ShardSampler` save where an
epoch got to as a small dict of plain values (JSON-serialisable: ints, strings, lists), positions
never bytes, so a checkpoint holds a few KB per reader and a resumed job re-reads only what it has
not delivered. ``torchdata.stateful_dataloader.StatefulDataLoader`` calls the protocol by itself,
in each DataLoader worker.

Here: the protocol, the state header every state carries (kind, format, configuration), a compact
encoding of position lists, :class:`SharedEpoch` (the epoch a persistent DataLoader worker reads at
the start of each iteration) and :func:`stream_states` (the reader states inside a DataLoader's
checkpoint). No torch import.
"""

from __future__ import annotations

import base64
import multiprocessing
import multiprocessing.context
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import StateError

__all__ = [
    "STATE_FORMAT",
    "SharedEpoch",
    "Stateful",
    "check_header",
    "decode_rows",
    "encode_rows",
    "header",
    "stream_states",
]

STATE_FORMAT = 1
"""Version of every state dict tarindex writes; a state of another version is refused."""


@runtime_checkable
class Stateful(Protocol):
    """Anything that saves and restores its position (the protocol ``torchdata`` checks for)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration is, as plain values."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` on the next iteration."""
        ...


def header(kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The fields every state starts with: ``kind``, ``format`` and the ``config`` that defines the order."""
    return {"kind": kind, "format": STATE_FORMAT, "config": dict(config)}


def check_header(state: Mapping[str, Any], kind: str, config: Mapping[str, Any]) -> None:
    """Refuse a state of another kind, format or configuration.

    Raises:
        StateError: naming the first field that differs (state's value vs ours).
    """
    if not isinstance(state, Mapping) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, Mapping) else type(state).__name__
        raise StateError(f"not a {kind} state (kind {got!r})")
    if state.get("format") != STATE_FORMAT:
        raise StateError(f"{kind} state format {state.get('format')!r} is not supported (expected {STATE_FORMAT})")
    theirs = state.get("config")
    if not isinstance(theirs, Mapping):
        raise StateError(f"{kind} state has no config")
    for key, value in config.items():
        if theirs.get(key) != value:
            raise StateError(f"{kind} state is for {key}={theirs.get(key)!r}, this {kind} has {key}={value!r}")


def encode_rows(rows: Sequence[Sequence[int]], width: int) -> str:
    """Rows of ``width`` integers as one short ASCII string (columns delta-coded, zlib, base64).

    A shuffle buffer of 1,000 sample positions takes a few KB instead of tens.
    """
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, width)
    deltas = np.diff(arr, axis=0, prepend=np.zeros((1, width), dtype=np.int64))
    return base64.b64encode(zlib.compress(deltas.T.astype("<i8").tobytes(), 6)).decode("ascii")


def decode_rows(text: str, width: int) -> list[tuple[int, ...]]:
    """The rows :func:`encode_rows` encoded.

    Raises:
        StateError: the text is not such an encoding.
    """
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
        cols = np.frombuffer(raw, dtype="<i8").reshape(width, -1)
    except (ValueError, zlib.error, UnicodeEncodeError, AttributeError) as exc:
        raise StateError(f"malformed position list in a state: {exc}") from exc
    arr = np.cumsum(cols.T, axis=0)
    return [tuple(int(x) for x in row) for row in arr.tolist()]


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


def stream_states(checkpoint: Any, kind: str = "TarStream") -> list[dict[str, Any]]:
    """Every reader state of ``kind`` inside ``checkpoint``: a ``StatefulDataLoader.state_dict()``
    (one per DataLoader worker), a list of them (gathered from the ranks), or states themselves.

    Load the result into a new stream to resume on another number of workers or ranks, where
    ``StatefulDataLoader`` refuses its own state.
    """
    return list(_find(checkpoint, kind))


def _find(obj: Any, kind: str) -> Iterator[dict[str, Any]]:
    if isinstance(obj, Mapping):
        if obj.get("kind") == kind and "format" in obj:
            yield dict(obj)
            return
        for value in obj.values():
            yield from _find(value, kind)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _find(value, kind)
