"""The stages of a :class:`tarindex.TarStream` after the walk: webdataset's fluent steps and the error handler.

``ds.shuffle(1000).decode("pil").to_tuple("jpg", "cls").map(fn).batched(64)``: the shuffle buffer's size
(:func:`buffer_size`), the functions ``map``, ``to_tuple`` and ``map_tuple`` chain (:class:`Chain`,
:class:`ToTuple`, :class:`MapTuple`, picklable for DataLoader workers), the batches a batching decoder decodes
together (:func:`decoded_batches`, over samples kept as :class:`Raw` bytes through the shuffle buffer), and the
``handler`` policy with its count of errors in a row (:class:`Handling`).
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal

from .decode import Decoder, failure
from .errors import DecodeError, OptionError, OptionTypeError, StreamWarning, shown

__all__: list[str] = []  # internal module: its names serve the package, the public API is tarindex.__all__

Sample = dict[str, Any]
Handler = Literal["raise", "warn", "skip_shard"] | Callable[[Exception], bool]
HANDLERS = ("raise", "warn", "skip_shard")

DEFAULT_SHUFFLE = 1000
"""Samples in the shuffle buffer of ``shuffle=True``: the default buffer of webdataset's ``shuffle()``."""


def buffer_size(shuffle: object) -> int:
    """The sample shuffle buffer that ``shuffle`` asks for: ``True`` is :data:`DEFAULT_SHUFFLE`, ``False`` 0,
    an integer itself.

    Raises:
        OptionTypeError: neither a bool nor an integer (``"100"``, ``100.0``, ``None``).
        OptionError: a negative integer.
    """
    if shuffle is True or shuffle is False:
        return DEFAULT_SHUFFLE if shuffle else 0
    try:
        size = operator.index(shuffle)  # type: ignore[arg-type]  # any integer type (numpy's too); refused below otherwise
    except TypeError as exc:
        raise OptionTypeError(f"shuffle must be a buffer size (int) or True/False, not {type(shuffle).__name__} {shuffle!r}") from exc
    if size < 0:
        raise OptionError(f"shuffle must be >= 0 (a buffer size) or True/False, not {size}")
    return size


class Chain:
    """``second(first(x))``; picklable when both are (DataLoader workers)."""

    def __init__(self, first: Callable[[Any], Any], second: Callable[[Any], Any]) -> None:
        self.first, self.second = first, second

    def __call__(self, sample: Any) -> Any:
        return self.second(self.first(sample))


class ToTuple:
    """webdataset's ``to_tuple``: one value per field, a field's keys separated by ``;``."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = [f.split(";") for f in fields]

    def __call__(self, sample: Sample) -> tuple[Any, ...]:
        out = []
        for keys in self.fields:
            for k in keys:
                if k in sample:
                    out.append(sample[k])
                    break
            else:
                raise KeyError(f"none of {keys} in {sorted(sample)}")
        return tuple(out)


class MapTuple:
    """webdataset's ``map_tuple``: one function per field of a tuple sample (``None`` keeps the field)."""

    def __init__(self, fns: tuple[Callable[[Any], Any] | None, ...]) -> None:
        self.fns = fns

    def __call__(self, sample: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(sample) != len(self.fns):
            raise ValueError(f"map_tuple has {len(self.fns)} functions for a sample of {len(sample)} fields")
        return tuple(x if f is None else f(x) for f, x in zip(self.fns, sample))


class Raw:
    """A sample read but not yet decoded, with where it is (for the error of a batch that decodes it)."""

    __slots__ = ("offset", "sample", "url")

    def __init__(self, url: str, offset: int, sample: Sample) -> None:
        self.url, self.offset, self.sample = url, offset, sample


def check_handler(handler: object) -> None:
    """Refuse a ``handler`` that is neither one of :data:`HANDLERS` nor a function.

    Raises:
        ValueError: naming the handlers there are.
    """
    if not callable(handler) and handler not in HANDLERS:
        raise ValueError(f"handler must be one of {HANDLERS} or a function, not {handler!r}")


def check_max_errors(max_errors: int | None) -> None:
    """Refuse a ``max_errors`` below 1.

    Raises:
        OptionError: saying what it must be.
    """
    if max_errors is not None and max_errors < 1:
        raise OptionError(f"max_errors must be >= 1, not {max_errors}")


class Handling:
    """A stream's ``handler`` (checked by :func:`check_handler`) and its count of errors handled in a row (in
    this process; a good sample resets it)."""

    __slots__ = ("handler", "in_a_row", "max_errors")

    def __init__(self, handler: Handler, max_errors: int | None) -> None:
        self.handler = handler
        self.max_errors = max_errors
        self.in_a_row = 0

    def __copy__(self) -> Handling:
        out = Handling(self.handler, self.max_errors)
        out.in_a_row = self.in_a_row
        return out

    def __getstate__(self) -> tuple[Handler, int | None, int]:
        return self.handler, self.max_errors, self.in_a_row

    def __setstate__(self, state: tuple[Handler, int | None, int]) -> None:
        self.handler, self.max_errors, self.in_a_row = state

    def goes_on(self, exc: Exception) -> bool:
        """Apply the handler to ``exc``: ``False`` to raise it, ``True`` to go on (a warning was issued, or
        the handler function said so). ``max_errors`` errors in a row raise the last one."""
        handler = self.handler
        if handler == "raise":
            return False
        self.in_a_row += 1
        if self.max_errors is not None and self.in_a_row >= self.max_errors:
            return False
        if callable(handler):
            return bool(handler(exc))
        sample_only = handler == "warn" and isinstance(exc, DecodeError)
        skipped = "skipping the sample" if sample_only else "skipping the rest of the shard"
        warnings.warn(f"{exc}; {skipped} ({self.in_a_row} in a row)", StreamWarning, stacklevel=3)  # the caller of next() on the stream's samples
        return True


def decoded_batches(
    batches: Iterator[list[Raw]],
    decoder: Decoder | None,
    transform: Callable[[Sample], Any] | None,
    collation_fn: Callable[[list[Any]], Any] | None,
    handling: Handling,
) -> Iterator[Any]:
    """Batches of raw samples decoded together (``Decoder.decode_batch``: images in a thread pool, into one
    array), transformed sample by sample, with the handler applied (a skipped sample is left out)."""
    for items in batches:
        samples = [it.sample for it in items]
        errors = decoder.decode_batch(samples) if decoder is not None else [None] * len(samples)
        out = []
        for it, sample, exc in zip(items, samples, errors):
            if exc is None and transform is not None:
                try:
                    sample = transform(sample)
                except Exception as err:
                    exc = err
            if exc is not None:
                error = DecodeError(it.url, it.offset, f"sample {shown(str(it.sample.get('__key__')))}: {failure(exc)}")
                if not handling.goes_on(error):
                    raise error from exc
                continue
            handling.in_a_row = 0
            out.append(sample)
        if out:
            yield collation_fn(out) if collation_fn is not None else out
