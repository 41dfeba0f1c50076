"""The one state protocol of tarindex's iterables and samplers: ``state_dict()`` / ``load_state_dict()``.

:class:`tarindex.TarStream`, :func:`tarindex.mix` and :class:`tarindex.ShardSampler` save where an
epoch got to as a small dict of plain values (JSON-serialisable: ints, strings, lists), positions
never bytes, so a checkpoint holds a few KB per reader and a resumed job re-reads only what it has
not delivered. ``torchdata.stateful_dataloader.StatefulDataLoader`` calls the protocol by itself,
in each DataLoader worker.

Here: the protocol, the state header every state carries (kind, format, configuration), the checks of
a state's fields (a state is data: it may come from anywhere, so every field's type and range is checked
before anything is allocated or changed by it), a compact and bounded encoding of position lists and
:func:`stream_states` (the reader states inside a DataLoader's checkpoint). No torch import.
"""

from __future__ import annotations

import base64
import binascii
import operator
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .errors import StateError

if TYPE_CHECKING:
    from ._epochs import Slot

__all__ = [
    "EPOCHS",
    "MAX_COUNT",
    "MAX_READERS",
    "STATE_FORMAT",
    "Stateful",
    "check_config",
    "check_draws",
    "check_header",
    "decode_rows",
    "encode_rows",
    "flag",
    "flags",
    "header",
    "integer",
    "integers",
    "pending_state",
    "reader_state",
    "reader_states",
    "required",
    "same",
    "saved_config",
    "slot_of",
    "stream_states",
]

STATE_FORMAT = 1
"""Version of every state dict tarindex writes; a state of another version is refused."""

MAX_COUNT = 1 << 62
"""The largest count a state may hold (draws, samples yielded, quotas, passes): far beyond any epoch, and
small enough that every sum and every 64-bit draw counter made from them stays exact."""

EPOCHS = (-(1 << 63), (1 << 63) - 1)
"""The epochs a state may name: a signed 64-bit number (the shared epoch's type)."""

MAX_READERS = 1 << 20
"""The most ranks, DataLoader workers per rank, or shuffle buffers of interrupted readers one state may
name: a state naming more is refused before anything is made per reader."""


def _value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({type(value).__name__})"


def required(state: Mapping[str, Any], name: str, kind: str) -> Any:
    """``state[name]``.

    Raises:
        StateError: ``state`` has no such field.
    """
    if name not in state:
        raise StateError(f"{kind} state has no {name!r}")
    return state[name]


def same(theirs: object, ours: object) -> bool:
    """Whether a state's value equals ours (a value whose comparison fails or is not a truth value, as an
    array's, is not the same)."""
    try:
        return bool(theirs == ours)
    except Exception:  # any object a state may hold: its == is not ours to trust
        return False


def integer(state: Mapping[str, Any], name: str, kind: str, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """``state[name]``, an integer (``int`` or numpy's, not a bool) in ``[lo, hi]``.

    Raises:
        StateError: naming the field, what it holds and the range expected.
    """
    value = required(state, name, kind)
    got = _int(value)
    if got is None or not lo <= got <= hi:
        raise StateError(f"{kind} state: {name} is {_value(value)}, expected an integer in [{lo}, {hi}]")
    return got


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # ints, numpy's integers; anything else is refused
    except TypeError:
        return None


def integers(state: Mapping[str, Any], name: str, kind: str, n: int, lo: int = 0, hi: int = MAX_COUNT) -> list[int]:
    """``state[name]``, a list (or tuple) of ``n`` integers in ``[lo, hi]``.

    Raises:
        StateError: naming the field and the first bad entry.
    """
    value = required(state, name, kind)
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise StateError(f"{kind} state: {name} is {_value(value)}, expected a list of {n} integers")
    out = [_int(x) for x in value]
    for k, got in enumerate(out):
        if got is None or not lo <= got <= hi:
            raise StateError(f"{kind} state: {name}[{k}] is {_value(value[k])}, expected an integer in [{lo}, {hi}]")
    return out  # type: ignore[return-value]  # every entry checked above


def flag(state: Mapping[str, Any], name: str, kind: str) -> bool:
    """``state[name]``, a bool.

    Raises:
        StateError: naming the field and what it holds.
    """
    value = required(state, name, kind)
    if not isinstance(value, (bool, np.bool_)):
        raise StateError(f"{kind} state: {name} is {_value(value)}, expected True or False")
    return bool(value)


def flags(state: Mapping[str, Any], name: str, kind: str, n: int) -> list[bool]:
    """``state[name]``, a list (or tuple) of ``n`` bools.

    Raises:
        StateError: naming the field and the first bad entry.
    """
    value = required(state, name, kind)
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise StateError(f"{kind} state: {name} is {_value(value)}, expected a list of {n} booleans")
    for k, x in enumerate(value):
        if not isinstance(x, (bool, np.bool_)):
            raise StateError(f"{kind} state: {name}[{k}] is {_value(x)}, expected True or False")
    return [bool(x) for x in value]


def slot_of(state: Mapping[str, Any], kind: str) -> tuple[int, int, int, int]:
    """``state["slot"]``: ``(rank, world size, worker, workers)``, each within :data:`MAX_READERS`.

    Raises:
        StateError: not four such integers, or a rank or worker outside its count.
    """
    rank, world, worker, workers = integers(state, "slot", kind, 4, 0, MAX_READERS)
    if not (rank < world and worker < workers):
        raise StateError(f"{kind} state: slot {[rank, world, worker, workers]} is not [rank < world size, worker < workers]")
    return rank, world, worker, workers


@runtime_checkable
class Stateful(Protocol):
    """Anything that saves and restores its position (the protocol ``torchdata`` checks for)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration is, as plain values."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict`` on the next iteration."""
        ...


def header(kind: str, config: Mapping[str, Any], *, inline: bool = False) -> dict[str, Any]:
    """The fields every state starts with: ``kind``, ``format`` and the ``config`` that defines the order.

    ``inline``: ``format`` and the config's own fields, without ``kind`` (the layout of a
    :class:`tarindex.ShardSampler` state, kept so that the states saved in it load).
    """
    if inline:
        return {"format": STATE_FORMAT, **config}
    return {"kind": kind, "format": STATE_FORMAT, "config": dict(config)}


def saved_config(state: object, kind: str, *, inline: bool = False) -> Mapping[str, Any]:
    """The configuration ``state`` was saved with, once it is a state of ``kind`` (unless ``inline``, whose
    states name no kind) in this :data:`STATE_FORMAT`: its ``config``, or with ``inline`` the state itself.

    Raises:
        StateError: not a mapping, another kind, a format that is not an integer or not this one, no config.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"{kind} state is a {type(state).__name__}, expected a dict")
    if not inline and state.get("kind") != kind:
        raise StateError(f"not a {kind} state (kind {_value(state.get('kind'))})")
    fmt = integer(state, "format", kind)
    if fmt != STATE_FORMAT:
        raise StateError(f"{kind} state format {fmt} is not supported (expected {STATE_FORMAT})")
    config = state if inline else state.get("config")
    if not isinstance(config, Mapping):
        raise StateError(f"{kind} state has no config")
    return config


def check_config(
    theirs: Mapping[str, Any], kind: str, config: Mapping[str, Any], *, unchecked: Collection[str] = (), older: Mapping[str, Any] | None = None
) -> None:
    """Refuse a state saved with another configuration than ours (``config``), every key but ``unchecked``; a
    key the state lacks is ``older``'s value for it (what a state saved before the key existed meant).

    Raises:
        StateError: naming the first key that differs (the state's value vs ours) or that the state lacks.
    """
    defaults = older or {}
    for key, value in config.items():
        if key in unchecked:
            continue
        if key in theirs:
            got = theirs[key]
        elif key in defaults:
            got = defaults[key]
        else:
            raise StateError(f"{kind} state has no {key!r}")
        if not same(got, value):
            raise StateError(f"{kind} state is for {key}={_value(got)}, this {kind} has {key}={value!r}")


def check_header(state: object, kind: str, config: Mapping[str, Any]) -> None:
    """Refuse a state of another kind, format or configuration (:func:`saved_config`, :func:`check_config`).

    Raises:
        StateError: naming the first field that differs (state's value vs ours).
    """
    check_config(saved_config(state, kind), kind, config)


def encode_rows(rows: Sequence[Sequence[int]], width: int) -> str:
    """Rows of ``width`` integers as one short ASCII string (columns delta-coded, zlib, base64).

    A shuffle buffer of 1,000 sample positions takes a few KB instead of tens.
    """
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, width)
    deltas = np.diff(arr, axis=0, prepend=np.zeros((1, width), dtype=np.int64))
    return base64.b64encode(zlib.compress(deltas.T.astype("<i8").tobytes(), 6)).decode("ascii")


def decode_rows(text: object, width: int, max_rows: int, what: str) -> npt.NDArray[np.int64]:
    """The rows :func:`encode_rows` encoded, ``(n, width)`` int64, decompressing at most ``max_rows`` rows:
    a text that would expand to more is refused after that many bytes, whatever it holds.

    Raises:
        StateError: ``what`` (the field, named in the message) is not such an encoding, or holds more rows.
    """
    limit = max_rows * width * 8
    if not isinstance(text, str):
        raise StateError(f"{what} is {_value(text)}, expected an encoded position list (a string)")
    if len(text) > 4 * (limit + (limit >> 10) + 64) // 3 + 4:  # more than zlib makes of `limit` bytes: no decoding
        raise StateError(f"{what}: {len(text)} characters, more than a list of {max_rows} positions takes")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(text.encode("ascii"), validate=True), limit + 1)
    except (ValueError, zlib.error, binascii.Error) as exc:  # (UnicodeEncodeError is a ValueError)
        raise StateError(f"{what} is not an encoded position list ({exc})") from exc
    if len(raw) > limit or inflater.unconsumed_tail:
        raise StateError(f"{what} holds more than {max_rows} positions (expected at most {max_rows})")
    if not inflater.eof or inflater.unused_data or len(raw) % (8 * width):
        raise StateError(f"{what} is not an encoded position list ({len(raw)} bytes, not whole rows of {width} integers)")
    cols = np.frombuffer(raw, dtype="<i8").reshape(width, -1)
    return np.cumsum(cols.T, axis=0, dtype=np.int64)


def reader_state(kind: str, config: Mapping[str, Any], epoch: int, slot: Slot, position: Mapping[str, Any]) -> dict[str, Any]:
    """The state of one reader of an epoch (a :class:`tarindex.TarStream`'s, a :func:`tarindex.mix`'s):
    the header, the epoch, the reader's ``slot`` as ``[rank, world size, worker, workers]`` and its ``position``."""
    return {**header(kind, config), "epoch": epoch, "slot": _slot_fields(slot), **position}


def pending_state(pending: Sequence[Mapping[str, Any]] | None, epoch: int, slot: Slot) -> dict[str, Any] | None:
    """The loaded state of reader ``slot`` in ``epoch`` that no iteration has taken yet (a copy), else ``None``."""
    fields = _slot_fields(slot)
    return next((dict(st) for st in pending or () if st["epoch"] == epoch and list(st["slot"]) == fields), None)


def _slot_fields(slot: Slot) -> list[int]:
    return [slot.rank, slot.world_size, slot.worker, slot.num_workers]


def reader_states(
    state_dict: Any, kind: str, config: Mapping[str, Any], check: Callable[[Mapping[str, Any], tuple[int, int, int, int]], object]
) -> tuple[list[dict[str, Any]], int]:
    """The reader states of ``kind`` in ``state_dict`` (:func:`stream_states`) and their one epoch, each
    checked before anything changes: header against ``config``, slot, epoch, then ``check(state, slot)``.

    Raises:
        StateError: no such state, the first field that is missing, of the wrong type or out of range
            (what ``check`` raises), states of several epochs.
    """
    states = stream_states(state_dict, kind)
    if not states:
        raise StateError(f"no {kind} state in the given state_dict")
    epochs = set()
    for st in states:
        check_header(st, kind, config)
        slot = slot_of(st, kind)
        epochs.add(integer(st, "epoch", kind, *EPOCHS))
        check(st, slot)
    if len(epochs) != 1:
        raise StateError(f"{kind} states of several epochs: {sorted(epochs)}")
    return states, epochs.pop()


def check_draws(
    kind: str,
    step: int,
    yielded: int,
    cap: tuple[str, int | None],
    active: list[bool],
    weights: Sequence[float],
    *,
    stop: str,
    done: bool,
    rounds: list[int] | None = None,
) -> None:
    """Check a mix's draw position (:func:`tarindex.mix`'s, :class:`tarindex.MixSampler`'s): no more samples
    yielded than draws, nor than ``cap`` (its name and bound, ``None``: unbounded); members out of the draw
    only with ``stop="all"``; ``rounds`` (members started again, where the mix counts them) only with
    ``stop="never"``; a draw not ``done`` has an active member with a weight.

    Raises:
        StateError: naming the field that breaks the rule.
    """
    members = "sources" if kind == "Mix" else "datasets"
    name, bound = cap
    if yielded > step or (bound is not None and yielded > bound):
        raise StateError(f"{kind} state: yielded {yielded} is over its draws ({step}) or {name} ({bound})")
    if stop != "all" and not all(active):
        raise StateError(f"{kind} state: active {active} has {members} out of the draw, which only stop='all' takes out")
    if rounds is not None and stop != "never" and any(rounds):
        raise StateError(f"{kind} state: rounds {rounds} has {members} started again, which only stop='never' does")
    if not done and not any(a and w > 0 for a, w in zip(active, weights)):
        raise StateError(f"{kind} state: active {active} leaves no {members[:-1]} to draw (weights {list(weights)}), yet it is not done")


def stream_states(checkpoint: Any, kind: str = "TarStream") -> list[dict[str, Any]]:
    """Every reader state of ``kind`` inside ``checkpoint``: a ``StatefulDataLoader.state_dict()``
    (one per DataLoader worker), a list of them (gathered from the ranks), or states themselves.

    Load the result into a new stream to resume on another number of workers or ranks, where
    ``StatefulDataLoader`` refuses its own state.

    Raises:
        StateError: ``checkpoint`` nests deeper than Python's recursion allows.
    """
    try:
        return list(_find(checkpoint, kind))
    except RecursionError as exc:
        raise StateError(f"a checkpoint nested too deep to search for {kind} states") from exc


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
