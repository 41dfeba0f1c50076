"""Checks of the arguments the public constructors take: each a call that returns the value to keep or
raises :class:`~tarindex.errors.OptionTypeError` (a type not taken) or :class:`~tarindex.errors.OptionError`
(a value not taken), with a sentence that names the argument, what it takes and what was given.

Plain checks of plain values: this module imports nothing of tarindex but its errors, so any module may
call it (the lowest layer of docs/design.md).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any

from .errors import OptionError, OptionTypeError

__all__: list[str] = []  # internal: the constructors call these checks

_SHOWN = 60
"""How much of a value's repr a message shows."""


def given(value: object) -> str:
    """A value as a message names it: its type and (the start of) its repr."""
    text = repr(value)
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "..."
    return f"{type(value).__name__} {text}"


def count(value: object, name: str, *, least: int = 1, means: str, none: str | None = None) -> Any:
    """``value`` as an ``int`` of at least ``least`` (any integer type: numpy's too; never a bool), or ``None``
    when ``none`` says what ``None`` means.

    Args:
        value: what the caller passed.
        name: the argument's name.
        least: the smallest value taken.
        means: what the number is, for the message (``"shard files kept open per process"``).
        none: what ``None`` means (``"each shard once"``); ``None`` here: ``None`` is refused.

    Raises:
        OptionTypeError: not an integer (``"8"``, ``8.0``, ``True``), or ``None`` where it is not taken.
        OptionError: an integer below ``least``.
    """
    if value is None and none is not None:
        return None
    wanted = f"an integer >= {least} ({means})" + (f" or None ({none})" if none is not None else "")
    if isinstance(value, bool):
        raise OptionTypeError(f"{name} must be {wanted}, not {given(value)}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # any integer type; refused below otherwise
    except TypeError as exc:
        raise OptionTypeError(f"{name} must be {wanted}, not {given(value)}") from exc
    if number < least:
        raise OptionError(f"{name} must be {wanted}, not {number}")
    return number


def decoders(value: object) -> dict[str, Callable[[bytes], Any]] | None:
    """``decoders=``: a mapping of extension -> function of the member's bytes (``None``: none).

    Raises:
        OptionTypeError: not a mapping (``["jpg"]``), a key that is not a string, or a value that is not callable.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise OptionTypeError(
            f"decoders must be a mapping of extension to a function of the member's bytes, e.g. "
            f"{{'jpg': my_decoder}}, not {given(value)}; to decode the known extensions with the built-in "
            f"decoders, pass decode= instead (e.g. decode='pil')"
        )
    for ext, fn in value.items():
        if not isinstance(ext, str):
            raise OptionTypeError(f"decoders: a key must be an extension (str) such as 'jpg', not {given(ext)}")
        if not callable(fn):
            raise OptionTypeError(f"decoders[{ext!r}] must be a function of the member's bytes, not {given(fn)}")
    return dict(value)


def shard_names(value: object, name: str, *, call: str, also: tuple[type, ...] = ()) -> None:
    """Shard names as a constructor takes them: a path or URL, a pattern, or an iterable of them (or an object
    of a type in ``also``, which the caller takes as it is: an open index). A dataset (anything with an ``index_path``: a
    :class:`~tarindex.TarDataset`) is refused with the call that streams its index, before it is iterated
    (iterating it would read every sample).

    Args:
        value: what the caller passed.
        name: the argument's name.
        call: the constructor, for the message (``"TarStream"``).
        also: other types taken as they are.

    Raises:
        OptionTypeError: a dataset, or neither a path nor an iterable (``123``, ``b"x.tar"``, a dict).
    """
    if isinstance(value, (str, os.PathLike, *also)):
        return
    index_path = getattr(value, "index_path", None)
    if index_path is not None:
        raise OptionTypeError(
            f"{call} takes shard names or an index, not a {type(value).__name__}; to stream the dataset's index, "
            f"pass its path: {call}({str(index_path)!r})"
        )
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise OptionTypeError(
            f"{name} must be shard names: a path, URL or pattern (str), or a list of them, e.g. "
            f"{call}('data/train-{{000000..000099}}.tar'), not {given(value)}"
        )
    if isinstance(value, Sized) and len(value) == 0:
        raise OptionError(f"{call}: {name} is empty: no shards to read")


def index_files(value: object, name: str, *, call: str) -> list[str | os.PathLike[str]]:
    """Index paths as :func:`~tarindex.merge_indexes` takes them: a non-empty iterable of paths.

    Raises:
        OptionTypeError: one path given as a string, or an item that is not a path.
        OptionError: no paths.
    """
    if isinstance(value, (str, os.PathLike, bytes)) or not isinstance(value, Iterable):
        raise OptionTypeError(f"{call}: {name} must be a list of index paths, e.g. {call}(['a.tarindex', 'b.tarindex'], ...), not {given(value)}")
    paths = list(value)
    if not paths:
        raise OptionError(f"{call}: {name} is empty: no indexes to merge")
    for path in paths:
        if not isinstance(path, (str, os.PathLike)):
            raise OptionTypeError(f"{call}: {name} must hold index paths (str or os.PathLike), not {given(path)}")
    return paths


def sample_index(value: object) -> int:
    """``ds[i]``'s ``i``: any integer (numpy's too).

    Raises:
        OptionTypeError: not an integer; a string says to use ``ds.get(key)`` for a key.
    """
    try:
        return operator.index(value)  # type: ignore[arg-type]  # any integer type (a bool too, as a list takes it)
    except TypeError as exc:
        hint = f"; to read the sample with key {value!r}, use ds.get({value!r})" if isinstance(value, str) else ""
        raise OptionTypeError(f"a sample index must be an integer from 0 to len(ds) - 1, not {given(value)}{hint}") from exc


def sample_key(value: object) -> str:
    """``ds.get(key)``'s key: a string.

    Raises:
        OptionTypeError: not a string; an integer says to use ``ds[i]`` for the i-th sample.
    """
    if isinstance(value, str):
        return value
    hint = f"; to read sample number {value}, use ds[{value}]" if isinstance(value, int) and not isinstance(value, bool) else ""
    raise OptionTypeError(f"a sample key must be a string (the member names' stem, e.g. '000123'), not {given(value)}{hint}")


def shard_pattern(value: object) -> str:
    """A :class:`~tarindex.ShardWriter` pattern: a path with one ``%`` format for the shard number.

    Raises:
        OptionTypeError: not a path.
        OptionError: a path without a format for the number, or one the number does not fill.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise OptionTypeError(f"ShardWriter pattern must be a path with a %-format for the shard number, e.g. 'out/train-%06d.tar', not {given(value)}")
    pattern = os.fspath(value)
    try:
        first, second = pattern % 0, pattern % 1
    except (TypeError, ValueError) as exc:
        raise OptionError(
            f"ShardWriter pattern {pattern!r} must hold one %-format for the shard number, e.g. 'out/train-%06d.tar' "
            f"(a literal % is written %%): {exc}"
        ) from exc
    if first == second:
        raise OptionError(f"ShardWriter pattern {pattern!r} names every shard the same: put %06d where the shard number goes")
    return pattern


def map_style(value: object, *, call: str) -> None:
    """A dataset a sampler numbers: one with ``len()`` and ``shard_sizes`` (a :class:`~tarindex.TarDataset`).

    Raises:
        OptionTypeError: an iterable stream (it has no index to sample from), or anything without ``shard_sizes``.
    """
    if hasattr(value, "shard_sizes"):
        return
    if hasattr(value, "slot") and hasattr(value, "urls"):  # a TarStream: iterable, no numbering to sample
        raise OptionTypeError(
            f"{call} samples a map-style dataset (a TarDataset, or a ConcatDataset of them), not a {type(value).__name__}: "
            f"a stream splits and shuffles its shards itself (rank=, world_size=, shuffle=); for sampled random access "
            f"build an index and use tarindex.TarDataset"
        )
    raise OptionTypeError(f"{call} needs a dataset with shard_sizes (a TarDataset), not {given(value)}")
